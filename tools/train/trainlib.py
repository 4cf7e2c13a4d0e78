"""Shared training plumbing: token-stream data, LR schedule, seeding, logging, device info."""
import json
import math
import os
import random
import time

import numpy as np
import torch


def seed_all(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def load_stream(path, device):
    a = np.fromfile(path, dtype=np.uint16).astype(np.int64)
    return torch.from_numpy(a).to(device)


class TokenData:
    """Random windows of the train streams (domain mixture) and fixed held-out windows."""

    def __init__(self, tok_dir, device, mix=None, seed=0):
        self.meta = json.load(open(os.path.join(tok_dir, "meta.json")))
        self.train = {d: load_stream(os.path.join(tok_dir, "train", d + ".bin"), device)
                      for d in sorted(self.meta["splits"]["train"])}
        self.heldout = {d: load_stream(os.path.join(tok_dir, "heldout", d + ".bin"), device)
                        for d in sorted(self.meta["splits"].get("heldout", {}))}
        doms = list(self.train)
        w = [float((mix or {}).get(d, len(self.train[d]))) for d in doms]
        self.doms, self.p = doms, torch.tensor(w) / sum(w)
        self.g = torch.Generator().manual_seed(seed)
        self.device = device

    def batch(self, B, T):
        """[B, T+1] windows; each row from one domain drawn from the mixture."""
        dom_idx = torch.multinomial(self.p, B, replacement=True, generator=self.g)
        rows = []
        for di in range(len(self.doms)):
            n = int((dom_idx == di).sum())
            if n == 0:
                continue
            s = self.train[self.doms[di]]
            starts = torch.randint(0, len(s) - T - 1, (n,), generator=self.g).to(self.device)
            rows.append(s[starts[:, None] + torch.arange(T + 1, device=self.device)])
        x = torch.cat(rows)
        return x[torch.randperm(B, generator=self.g).to(self.device)]

    def heldout_windows(self, dom, T, max_tokens):
        s = self.heldout[dom]
        n = min(len(s) // (T + 1), max(1, max_tokens // T))
        return s[:n * (T + 1)].view(n, T + 1)


def lr_at(progress, peak, warmup_frac, min_frac):
    """Linear warmup, then cosine to min_frac * peak. progress in [0, 1]."""
    if progress < warmup_frac:
        return peak * progress / max(warmup_frac, 1e-9)
    p = min(1.0, (progress - warmup_frac) / max(1e-9, 1 - warmup_frac))
    return peak * (min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * p)))


class Progress:
    """Step-based (--steps) or wall-clock-based (--max-minutes) schedule progress."""

    def __init__(self, steps, max_minutes):
        self.steps, self.budget = steps, (max_minutes * 60 if max_minutes else None)
        self.t0 = time.time()

    def value(self, step):
        if self.steps:
            return step / self.steps
        return (time.time() - self.t0) / self.budget

    def done(self, step):
        if self.steps and step >= self.steps:
            return True
        return bool(self.budget) and time.time() - self.t0 >= self.budget


def autocast(device):
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=False)


def env_info():
    d = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        d["gpu"] = torch.cuda.get_device_name(0)
    return d


class JsonLog:
    def __init__(self, path):
        self.f = open(path, "a")

    def __call__(self, **kw):
        kw["time"] = round(time.time(), 1)
        self.f.write(json.dumps(kw) + "\n")
        self.f.flush()
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in kw.items()), flush=True)

#!/usr/bin/env python3
"""Trains the embedded Qwen3 target (Qwen3ForCausalLM layout: QK-norm, GQA, SwiGLU, tied
embeddings) on the tokenized corpus and writes an HF directory: config.json,
generation_config.json, model.safetensors (BF16), tokenizer.json, tokenizer_config.json,
train_summary.json (held-out losses, tokens/s, seed, args).

GPU:  python3 tools/train/train_target.py --data train-work/tok --tokenizer train-work/tokenizer \
          --out train-work/target --max-minutes 6 --compile
CPU smoke test: /usr/bin/python3 tools/train/train_target.py --tiny --device cpu --steps 20 ...

bf16 autocast on CUDA (fp32 master weights), AdamW (0.9, 0.95), linear warmup + cosine,
gradient clip 1.0. Schedule by --steps, or by wall clock with --max-minutes (progress =
elapsed / budget; the run stops at the budget). Checkpoint for resumption: OUT/ckpt.pt.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsmodel  # noqa: E402
import trainlib as tl  # noqa: E402


def special_ids(tok_dir):
    tj = json.load(open(os.path.join(tok_dir, "tokenizer.json")))
    return {t["content"]: t["id"] for t in tj.get("added_tokens", [])}, \
        len(tj["model"]["vocab"]) + sum(1 for t in tj.get("added_tokens", []) if t["content"] not in tj["model"]["vocab"])


@torch.no_grad()
def evaluate(model, data, T, max_tokens, device, bs=16):
    model.eval()
    res = {}
    for d in data.heldout:
        w = data.heldout_windows(d, T, max_tokens)
        tot, n = 0.0, 0
        for i in range(0, len(w), bs):
            x = w[i:i + bs]
            with tl.autocast(device):
                logits, _ = model(x[:, :-1])
            tot += float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                         reduction="sum"))
            n += x[:, 1:].numel()
        res[d] = tot / max(n, 1)
    res["mean"] = sum(res.values()) / max(len(res), 1)
    model.train()
    return res


def verify_against_reference(out_dir, device):
    """Reloads the saved checkpoint with tools/reference/qwen3_ref.py (float32, independent
    forward) and with transformers when installed; returns max |Δlogit| vs our module."""
    import qwen3_ref
    m = dsmodel.load_target(out_dir, "cpu").float().eval()
    ids = list(range(3, 40))
    ours = m(torch.tensor([ids]))[0][0]
    ref = qwen3_ref.Qwen3Target.load(out_dir).forward(ids)[0]
    res = {"ref_max_abs_dlogit": float((ours - ref).abs().max())}
    try:
        from transformers import AutoModelForCausalLM
        hf = AutoModelForCausalLM.from_pretrained(out_dir, torch_dtype=torch.float32).eval()
        with torch.no_grad():
            hl = hf(torch.tensor([ids])).logits[0]
        res["hf_max_abs_dlogit"] = float((ours - hl).abs().max())
    except Exception as e:  # transformers absent (Debian box) or refusing: report, don't fail
        res["hf"] = f"skipped: {type(e).__name__}: {str(e)[:200]}"
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="tokenize_corpus.py output")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="small", choices=sorted(dsmodel.TARGET_PRESETS))
    ap.add_argument("--tiny", action="store_true", help="= --preset tiny (CPU smoke test)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup-frac", type=float, default=0.03)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (else --max-minutes)")
    ap.add_argument("--max-minutes", type=float, default=0)
    ap.add_argument("--mix", default="code-c=0.6,code-python=0.2,prose=0.2")
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--eval-tokens", type=int, default=262144, help="held-out tokens per domain")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--resume", action="store_true")
    a = ap.parse_args()
    if a.tiny:
        a.preset = "tiny"
    assert a.steps or a.max_minutes, "give --steps or --max-minutes"
    tl.seed_all(a.seed)
    if a.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    os.makedirs(a.out, exist_ok=True)
    sp, vocab = special_ids(a.tokenizer)
    eos = [sp["<|endoftext|>"], sp["<|im_end|>"]]
    cfg = dsmodel.target_config(vocab, a.preset, eos_ids=eos, bos_id=None)
    model = dsmodel.Qwen3LM(cfg).to(a.device)
    nparam = sum(p.numel() for p in model.parameters())
    data = tl.TokenData(a.data, a.device, {k: float(v) for k, v in (x.split("=") for x in a.mix.split(","))},
                        seed=a.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if a.device.startswith("cuda") else {}))
    step, tokens = 0, 0
    ck = os.path.join(a.out, "ckpt.pt")
    if a.resume and os.path.exists(ck):
        s = torch.load(ck, map_location=a.device)
        model.load_state_dict(s["model"])
        opt.load_state_dict(s["opt"])
        step, tokens = s["step"], s["tokens"]
    fwd = torch.compile(model) if a.compile and hasattr(torch, "compile") else model
    log = tl.JsonLog(os.path.join(a.out, "train_log.jsonl"))
    log(event="start", params=nparam, config=a.preset, **tl.env_info(), args=vars(a))
    prog = tl.Progress(a.steps, a.max_minutes)
    t_last, tok_last = time.time(), tokens
    evals = []
    while not prog.done(step):
        lr = tl.lr_at(prog.value(step), a.lr, a.warmup_frac, a.min_lr_frac)
        for g in opt.param_groups:
            g["lr"] = lr
        x = data.batch(a.batch, a.seq_len)
        try:
            with tl.autocast(a.device):
                logits, _ = fwd(x[:, :-1])
        except Exception as e:  # torch.compile trouble: fall back to eager, keep going
            if fwd is model:
                raise
            print(f"train_target: compile failed ({type(e).__name__}: {str(e)[:200]}); eager", flush=True)
            fwd = model
            with tl.autocast(a.device):
                logits, _ = fwd(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += x[:, :-1].numel()
        if step % 50 == 0 or step == 1 or (a.steps and step == a.steps):
            dt = time.time() - t_last
            log(step=step, loss=float(loss), lr=lr, gnorm=float(gn), tokens=tokens,
                tok_per_s=round((tokens - tok_last) / max(dt, 1e-9)), elapsed=round(time.time() - prog.t0, 1))
            t_last, tok_last = time.time(), tokens
        if step % a.eval_every == 0:
            ev = evaluate(model, data, a.seq_len, a.eval_tokens, a.device)
            evals.append({"step": step, **ev})
            log(step=step, heldout=ev)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "tokens": tokens}, ck)
    elapsed = time.time() - prog.t0
    ev = evaluate(model, data, a.seq_len, a.eval_tokens, a.device)
    log(step=step, heldout=ev, final=True)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "tokens": tokens}, ck)
    gen = {"bos_token_id": None, "eos_token_id": eos, "do_sample": False, "pad_token_id": sp["<|endoftext|>"]}
    dsmodel.save_target(model, a.out, gen, a.tokenizer)
    check = verify_against_reference(a.out, a.device)
    summary = {"params": nparam, "preset": a.preset, "config": cfg, "steps": step, "tokens": tokens,
               "train_seconds": round(elapsed, 1), "tokens_per_s": round(tokens / max(elapsed, 1e-9)),
               "final_train_loss": float(loss), "heldout_loss": ev, "evals": evals, "seed": a.seed,
               "args": vars(a), "env": tl.env_info(), "data_meta": data.meta, "reload_check": check}
    json.dump(summary, open(os.path.join(a.out, "train_summary.json"), "w"), indent=1)
    print(f"train_target: {nparam/1e6:.2f}M params, {step} steps, {tokens/1e6:.1f}M tokens in {elapsed:.0f}s "
          f"({tokens/max(elapsed,1e-9):.0f} tok/s); held-out {ev}; reload {check}")


if __name__ == "__main__":
    main()

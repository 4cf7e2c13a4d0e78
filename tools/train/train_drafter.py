#!/usr/bin/env python3
"""Trains block drafters against the frozen target (DSpark paper §3.3, spec §6).

--kind dflash   DeepSpec-layout DFlash (Qwen3DSparkModel, markov_rank 0, no confidence head),
                loss α = (ce 1.0, l1 0, conf 0) as DeepSpec's DFlash recipe.
--kind dspark   DeepSpec DSpark: vanilla Markov head (rank --markov-rank) + confidence head with
                the Markov feature, α = (0.1, 0.9, 1.0) (paper eq. 12).
--kind zlab     z-lab DFlashDraftModel (no embed/lm_head tensors; block index j>=1 predicts the
                token at anchor+j), CE only.
A comma list (--kind dflash,dspark,zlab) trains them side by side on the same batches, sharing
one frozen-target forward per step (each drafter has its own AdamW).

Per step: a batch of target-generated sequences (gen_drafter_data.py); the frozen target runs
once (bf16) giving the captured layer outputs of `target_layer_ids` at every position (the
drafter context) and its final hidden states (-> target distributions through the frozen
lm_head at the needed positions only). Per sequence up to --anchors anchor positions are drawn
uniformly without replacement among positions a with a+1 in the generated part; block =
[x_a, MASK x (bs-1)] at positions a..a+bs-1; block queries see context positions < a and their
own block (blocks do not see each other). DeepSpec slot k predicts x_{a+k+1}; a slot is valid
iff its label is inside the sequence/loss mask and all earlier slots are valid.
Losses (weights w_k = valid_k · exp(-k/γ), γ = --decay-gamma, DeepSpec's 4.0; the paper writes
exp(-(k-1)/γ) with γ = block size):
  CE   Σ w·CE(ℓ_k, x_{a+k+1}) / Σ w             (ℓ_k: Markov-corrected logits, teacher forcing)
  L1   Σ w·‖softmax(ℓ_k) − softmax(t_k)‖₁ / Σ w   (t_k: target logits at a+k, T = 1)
  conf Σ w·BCE(z_k, c*_k) / Σ w, c*_k = clamp(1 − ½‖p_d − p_t‖₁, 0, 1) (paper eq. 8, "soft"), or
       with --conf-label greedy: 1[argmax ℓ_k == argmax t_k] (per-step greedy acceptance).
Monitoring: tau_prob = 1 + Σ_k Π_{i≤k}(1 − TV_i) (expected accepted length at T = 1 incl. the
bonus) and tau_greedy = 1 + accepted prefix of argmax matches (teacher forced), on held-out data.

Outputs OUT/<kind>/{config.json, model.safetensors, train_summary.json, train_log.jsonl}.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsmodel  # noqa: E402
import trainlib as tl  # noqa: E402

ALPHA = {"dflash": (1.0, 0.0, 0.0), "dspark": (0.1, 0.9, 1.0), "zlab": (1.0, 0.0, 0.0)}


def mask_id_of(target_dir):
    tj = json.load(open(os.path.join(target_dir, "tokenizer.json")))
    return {t["content"]: t["id"] for t in tj.get("added_tokens", [])}["<|mask|>"]


def build_drafter(kind, tcfg, a, layer_ids, mask_id):
    if kind == "zlab":
        cfg = dsmodel.zlab_config(tcfg, a.zlab_layers, a.block_size, mask_id, layer_ids)
        return dsmodel.BlockDrafter(cfg, "zlab")
    spark = kind == "dspark"
    cfg = dsmodel.deepspec_config(tcfg, a.layers, a.block_size, mask_id, layer_ids,
                                  markov_rank=a.markov_rank if spark else 0, confidence=spark)
    return dsmodel.BlockDrafter(cfg, "deepspec")


def sample_anchors(B, T, P, A, bs, gen, device):
    """[B, A] sorted anchors and [B, A] validity; candidates a in [P-1, T-2]."""
    score = torch.rand(B, T, generator=gen, device=device)
    pos = torch.arange(T, device=device)
    cand = (pos >= P - 1) & (pos <= T - 2)
    score = torch.where(cand[None], score, torch.full_like(score, -1.0))
    A = min(A, int(cand.sum()))
    s, idx = score.topk(A, dim=-1)
    valid = s >= 0
    idx, order = idx.sort(-1)
    return idx, valid.gather(-1, order)


def drafter_losses(kind, d, target, x, hn, feats, anchors, avalid, P, a):
    """Returns (loss, metrics dict) for one drafter on one batch."""
    B, T = x.shape
    bs = d.bs
    dev = x.device
    ar = torch.arange(bs, device=dev)
    blk = torch.full((B, anchors.shape[1], bs), d.mask_id, dtype=torch.long, device=dev)
    blk[:, :, 0] = x.gather(1, anchors)
    hb = d.backbone(feats, blk, anchors)  # [B, A*bs, H]
    A = anchors.shape[1]
    hb = hb.view(B, A, bs, -1)
    if kind == "zlab":
        hb = hb[:, :, 1:]  # block index j>=1 predicts the token at a+j == DeepSpec slot j-1
        K = bs - 1
    else:
        K = bs
    lab_pos = anchors[:, :, None] + ar[:K] + 1  # position of the predicted token
    prev_pos = (lab_pos - 1).clamp(max=T - 1)  # teacher-forced previous token (anchor for slot 0); target dist. position
    inside = (lab_pos < T) & (lab_pos >= P) & avalid[:, :, None]
    valid = inside.long().cumprod(-1).bool()
    lp = lab_pos.clamp(max=T - 1)
    labels = x.gather(1, lp.view(B, -1)).view(B, A, K)
    prev = x.gather(1, prev_pos.view(B, -1)).view(B, A, K)
    logits, z = d.heads(hb, prev)
    with torch.no_grad():
        th = hn.gather(1, prev_pos.view(B, -1, 1).expand(-1, -1, hn.shape[-1]))
        tlogits = target.logits(th).float().view(B, A, K, -1)
        pt = torch.softmax(tlogits, -1)
    logp = torch.log_softmax(logits.float(), -1)
    pd = logp.exp()
    w = valid.float() * torch.exp(-ar[:K].float() / a.decay_gamma)
    wsum = w.sum().clamp(min=1e-6)
    ce = -logp.gather(-1, labels[..., None])[..., 0]
    l1 = (pd - pt).abs().sum(-1)
    ace, al1, aconf = a.alpha[kind]
    loss = ace * (w * ce).sum() / wsum
    if al1:
        loss = loss + al1 * (w * l1).sum() / wsum
    m = {}
    if z is not None:
        if a.conf_label == "soft":
            cstar = (1 - 0.5 * l1).clamp(0, 1).detach()
        else:
            cstar = (logits.argmax(-1) == tlogits.argmax(-1)).float()
        bce = F.binary_cross_entropy_with_logits(z, cstar, reduction="none")
        loss = loss + aconf * (w * bce).sum() / wsum
        m["conf_bce"] = float((w * bce).sum() / wsum)
        m["conf_mean"] = float((torch.sigmoid(z) * valid).sum() / valid.sum().clamp(min=1))
    with torch.no_grad():
        full = valid.all(-1)
        acc_tv = (1 - 0.5 * l1.detach()).clamp(0, 1).cumprod(-1).sum(-1) + 1
        match = (logits.argmax(-1) == tlogits.argmax(-1)).long().cumprod(-1).sum(-1) + 1
        n = full.sum().clamp(min=1)
        m.update(ce=float((w * ce).sum() / wsum), l1=float((w * l1).sum() / wsum),
                 tau_prob=float((acc_tv * full).sum() / n), tau_greedy=float((match * full).sum() / n),
                 acc1=float(((logits[..., 0, :].argmax(-1) == tlogits[..., 0, :].argmax(-1)) & valid[..., 0]).sum()
                            / valid[..., 0].sum().clamp(min=1)))
    return loss, m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True, help="target HF dir (with tokenizer.json)")
    ap.add_argument("--gen", required=True, help="gen_drafter_data.py output")
    ap.add_argument("--kind", default="dflash,dspark", help="dflash | dspark | zlab, or a comma list")
    ap.add_argument("--out", required=True, help="writes OUT/<kind>/")
    ap.add_argument("--layers", type=int, default=2, help="draft layers (DeepSpec kinds)")
    ap.add_argument("--zlab-layers", type=int, default=1)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--layer-ids", default="auto", help="comma list or 'auto' (4 ids spread over 1..L_t-2)")
    ap.add_argument("--num-layer-ids", type=int, default=4)
    ap.add_argument("--markov-rank", type=int, default=64)
    ap.add_argument("--anchors", type=int, default=64, help="anchors per sequence")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=8e-4)
    ap.add_argument("--warmup-frac", type=float, default=0.04)
    ap.add_argument("--min-lr-frac", type=float, default=0.0)
    ap.add_argument("--decay-gamma", type=float, default=4.0)
    ap.add_argument("--alpha-dflash", default="1,0,0")
    ap.add_argument("--alpha-dspark", default="0.1,0.9,1.0")
    ap.add_argument("--conf-label", default="soft", choices=["soft", "greedy"])
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--max-minutes", type=float, default=0)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-seqs", type=int, default=256)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    assert a.steps or a.max_minutes
    kinds = a.kind.split(",")
    a.alpha = {"dflash": tuple(map(float, a.alpha_dflash.split(","))),
               "dspark": tuple(map(float, a.alpha_dspark.split(","))), "zlab": ALPHA["zlab"]}
    tl.seed_all(a.seed)
    dev = a.device
    target = dsmodel.load_target(a.target, dev).eval()
    target.requires_grad_(False)
    tcfg = target.cfg
    L_t = tcfg["num_hidden_layers"]
    layer_ids = dsmodel.default_layer_ids(L_t, a.num_layer_ids) if a.layer_ids == "auto" else \
        [int(v) for v in a.layer_ids.split(",")]
    mask_id = mask_id_of(a.target)
    drafters, opts = {}, {}
    for k in kinds:
        d = build_drafter(k, tcfg, a, layer_ids, mask_id).to(dev)
        d.attach_target(target)
        drafters[k] = d
        params = [p for p in d.parameters() if p.requires_grad]
        opts[k] = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0,
                                    **({"fused": True} if dev.startswith("cuda") else {}))
    meta = json.load(open(os.path.join(a.gen, "meta.json")))
    P = meta["prompt_len"]
    train = torch.from_numpy(np.load(os.path.join(a.gen, "train.npy")).astype(np.int64)).to(dev)
    held = torch.from_numpy(np.load(os.path.join(a.gen, "heldout.npy")).astype(np.int64)).to(dev)[:a.eval_seqs]
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    cpu_gen = torch.Generator().manual_seed(a.seed)
    logs = {}
    for k in kinds:
        os.makedirs(os.path.join(a.out, k), exist_ok=True)
        logs[k] = tl.JsonLog(os.path.join(a.out, k, "train_log.jsonl"))
        ntrain = sum(p.numel() for p in drafters[k].parameters() if p.requires_grad)
        logs[k](event="start", kind=k, trainable_params=ntrain, layer_ids=layer_ids, mask_id=mask_id,
                train_seqs=len(train), seq_len=train.shape[1], prompt_len=P, args=vars(a), **tl.env_info())
    fwd_t = torch.compile(target) if a.compile and hasattr(torch, "compile") else target

    def target_pass(x):
        nonlocal fwd_t
        with torch.no_grad(), tl.autocast(dev):
            try:
                hn, feats = fwd_t(x, capture=layer_ids, return_hidden=True)
            except Exception as e:  # torch.compile trouble: eager
                if fwd_t is target:
                    raise
                print(f"train_drafter: compile failed ({type(e).__name__}); eager", flush=True)
                fwd_t = target
                hn, feats = fwd_t(x, capture=layer_ids, return_hidden=True)
        return hn, feats

    @torch.no_grad()
    def evaluate():
        res = {k: {} for k in kinds}
        eg = torch.Generator(device=dev).manual_seed(1234)
        for i in range(0, len(held), a.batch):
            x = held[i:i + a.batch]
            hn, feats = target_pass(x)
            anc, av = sample_anchors(x.shape[0], x.shape[1], P, a.anchors, a.block_size, eg, dev)
            for k, d in drafters.items():
                d.eval()
                with tl.autocast(dev):
                    _, m = drafter_losses(k, d, target, x, hn, feats, anc, av, P, a)
                for key, v in m.items():
                    res[k].setdefault(key, []).append(v)
                d.train()
        return {k: {key: sum(v) / len(v) for key, v in r.items()} for k, r in res.items()}

    prog = tl.Progress(a.steps, a.max_minutes)
    step, t_last = 0, time.time()
    history = {k: [] for k in kinds}
    while not prog.done(step):
        lr = tl.lr_at(prog.value(step), a.lr, a.warmup_frac, a.min_lr_frac)
        idx = torch.randint(0, len(train), (a.batch,), generator=cpu_gen).to(dev)
        x = train[idx]
        hn, feats = target_pass(x)
        anc, av = sample_anchors(x.shape[0], x.shape[1], P, a.anchors, a.block_size, gen, dev)
        step += 1
        for k, d in drafters.items():
            for g in opts[k].param_groups:
                g["lr"] = lr
            with tl.autocast(dev):
                loss, m = drafter_losses(k, d, target, x, hn, feats, anc, av, P, a)
            opts[k].zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_([p for p in d.parameters() if p.requires_grad], 1.0)
            opts[k].step()
            if step % 50 == 0 or step == 1:
                logs[k](step=step, loss=float(loss), lr=lr, gnorm=float(gn),
                        seq_per_s=round(50 * a.batch / max(time.time() - t_last, 1e-9), 1) if step > 1 else 0,
                        elapsed=round(time.time() - prog.t0, 1), **m)
        if step % 50 == 0:
            t_last = time.time()
        if step % a.eval_every == 0:
            ev = evaluate()
            for k in kinds:
                history[k].append({"step": step, **ev[k]})
                logs[k](step=step, heldout=ev[k])
    elapsed = time.time() - prog.t0
    ev = evaluate()
    for k, d in drafters.items():
        logs[k](step=step, heldout=ev[k], final=True)
        # The engine's default drafter window (--dflash-window-size): the length of the
        # sequences trained on. Longer contexts are outside the training distribution and
        # cost engine tau (session 3), so the checkpoint states it.
        d.cfg["dsinfer_context_window"] = int(train.shape[1])
        dsmodel.save_drafter(d, os.path.join(a.out, k))
        json.dump({"kind": k, "steps": step, "seconds": round(elapsed, 1), "sequences_seen": step * a.batch,
                   "heldout": ev[k], "evals": history[k], "layer_ids": layer_ids, "mask_token_id": mask_id,
                   "alpha": a.alpha[k], "args": {kk: v for kk, v in vars(a).items() if kk != "alpha"},
                   "gen_meta": {kk: v for kk, v in meta.items() if kk != "batches"}, "env": tl.env_info()},
                  open(os.path.join(a.out, k, "train_summary.json"), "w"), indent=1)
        print(f"train_drafter: {k}: {step} steps in {elapsed:.0f}s, held-out {ev[k]}")


if __name__ == "__main__":
    main()

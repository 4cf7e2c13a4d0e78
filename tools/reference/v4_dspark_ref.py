#!/usr/bin/env python3
"""PyTorch reference of the DeepSeek-V4 DSpark drafter (mtp.* stages), for goldens.

Written from ../shared/docs/deepseek_v4_spec.md (sections 3.2-3.9: mHC, attention, MoE, head)
and the drafter reading tabled in docs/DEEPSEEK_V4.md ("DSpark drafter"), not from the C++.
The target side is transformers 5.17 (DeepseekV4ForCausalLM, which ignores mtp.* on load): a
forward hook on each decoder layer captures its output residual, whose n_hc streams are
averaged into the drafter's input features.

Data flow:
  prompt --transformers--> features f_t = mean_j X_t[j] after each dspark_target_layer_ids
  layer, and the greedy next token (the anchor) --drafter (below)--> for the block
  [anchor, noise x (bs-1)] at positions [S, S + bs): draft tokens (greedy, Markov chain from
  the anchor) and confidence logits.

Usage (GPU machine, torch + transformers 5.17):
  python3 v4_dspark_ref.py CKPT_DIR --prompt 5,9,14,... --out golden.json
CKPT_DIR is written by the C++ test (DSINFER_V4DSPARK_EXPORT=DIR build/tests/test_engine_v4_dspark
--gtest_filter=V4DSpark.ExportForReference).
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F
from safetensors import safe_open


def load(ckpt):
    t = {}
    with safe_open(f"{ckpt}/model.safetensors", framework="pt") as f:
        for k in f.keys():
            if k.startswith("mtp."):
                t[k] = f.get_tensor(k).double()
    return t


def rms(x, eps, w=None):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y


def hc_pre(X, fn, base, scale, n, eps, hc_eps, iters):
    T = X.shape[0]
    f = rms(X.reshape(T, -1), eps)
    z = f @ fn.T
    pre = torch.sigmoid(z[:, :n] * scale[0] + base[:n]) + hc_eps
    post = 2 * torch.sigmoid(z[:, n:2 * n] * scale[1] + base[n:2 * n])
    C = z[:, 2 * n:].reshape(T, n, n) * scale[2] + base[2 * n:].reshape(n, n)
    C = torch.softmax(C, dim=-1) + hc_eps
    C = C / (C.sum(dim=1, keepdim=True) + hc_eps)
    for _ in range(iters - 1):
        C = C / (C.sum(dim=2, keepdim=True) + hc_eps)
        C = C / (C.sum(dim=1, keepdim=True) + hc_eps)
    u = (pre.unsqueeze(-1) * X).sum(dim=1)
    return u, post, C


def hc_post(X, y, post, C):
    return post.unsqueeze(-1) * y.unsqueeze(1) + torch.einsum("tjk,tjd->tkd", C, X)


def hc_head(X, fn, base, scale, eps, hc_eps):
    T = X.shape[0]
    f = rms(X.reshape(T, -1), eps)
    pre = torch.sigmoid((f @ fn.T) * scale[0] + base) + hc_eps
    return (pre.unsqueeze(-1) * X).sum(dim=1)


def rope(x, pos, inv, sign=1.0):
    """Interleaved rotation of the last 2*len(inv) dims of x [..., T, dim] at positions pos [T]."""
    r = 2 * inv.shape[0]
    ang = pos.double().unsqueeze(-1) * inv.unsqueeze(0)  # [T, r/2]
    c, s = torch.cos(ang), sign * torch.sin(ang)
    y = x.clone()
    a, b = x[..., -r::2], x[..., -r + 1::2]
    y[..., -r::2] = a * c - b * s
    y[..., -r + 1::2] = b * c + a * s
    return y


def moe(g, p, t, cfg):
    E, K = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    L = cfg.get("swiglu_limit", 10.0)
    lam = g @ t[p + "ffn.gate.weight"].T
    s = torch.sigmoid(lam) if cfg.get("scoring_func") == "sigmoid" else torch.sqrt(F.softplus(lam))
    choose = s + t[p + "ffn.gate.bias"]
    out = torch.zeros_like(g)

    def expert(x, w1, w3, w2):
        a = torch.clamp(x @ w1.T, max=L)
        b = torch.clamp(x @ w3.T, min=-L, max=L)
        return (F.silu(a) * b) @ w2.T

    for r in range(g.shape[0]):
        # top-K, ties to the lower id
        order = sorted(range(E), key=lambda e: (-float(choose[r, e]), e))[:K]
        w = s[r, order]
        w = w / (w.sum() + 1e-20) * cfg.get("routed_scaling_factor", 1.5)
        for k, e in enumerate(order):
            ep = f"{p}ffn.experts.{e}."
            out[r] += w[k] * expert(g[r:r + 1], t[ep + "w1.weight"], t[ep + "w3.weight"], t[ep + "w2.weight"])[0]
    sp = p + "ffn.shared_experts."
    return out + expert(g, t[sp + "w1.weight"], t[sp + "w3.weight"], t[sp + "w2.weight"])


def drafter(t, cfg, feats, anchor, embed, head):
    D, H, d = cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]
    n, eps, hc_eps = cfg.get("hc_mult", 4), cfg.get("rms_norm_eps", 1e-6), cfg.get("hc_eps", 1e-6)
    iters, W = cfg.get("hc_sinkhorn_iters", 20), cfg.get("sliding_window", 128)
    G, orank = cfg["o_groups"], cfg["o_lora_rank"]
    rp = cfg.get("rope_parameters") or {}
    theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0)) if "main" not in rp else rp["main"]["rope_theta"]
    prf = cfg.get("partial_rotary_factor", rp.get("partial_rotary_factor", None))
    r = int(d * prf) if prf else cfg["qk_rope_head_dim"]
    inv = (1.0 / (theta ** (torch.arange(0, r, 2, dtype=torch.int64).float() / r))).double()
    bs, noise = cfg["dspark_block_size"], cfg["dspark_noise_token_id"]
    S = feats.shape[0]
    stages = sorted({int(k.split(".")[1]) for k in t if k.endswith(".attn_norm.weight")})
    last = f"mtp.{stages[-1]}."
    # Context: main_x and per-stage K=V rows of the last W positions.
    main_x = rms(feats @ t["mtp.0.main_proj.weight"].T, eps, t["mtp.0.main_norm.weight"])
    cpos = torch.arange(S)
    lo = max(0, S - W)
    blk = [anchor] + [noise] * (bs - 1)
    bpos = torch.arange(S, S + bs)
    X = embed[torch.tensor(blk)].double().unsqueeze(1).repeat(1, n, 1)
    for s in stages:
        p = f"mtp.{s}."
        ctx_kv = rope(rms(main_x @ t[p + "attn.wkv.weight"].T, eps, t[p + "attn.kv_norm.weight"]), cpos, inv)[lo:]
        u, post, C = hc_pre(X, t[p + "hc_attn_fn"], t[p + "hc_attn_base"], t[p + "hc_attn_scale"], n, eps, hc_eps, iters)
        h = rms(u, eps, t[p + "attn_norm.weight"])
        qres = rms(h @ t[p + "attn.wq_a.weight"].T, eps, t[p + "attn.q_norm.weight"])
        q = rms((qres @ t[p + "attn.wq_b.weight"].T).reshape(bs, H, d), eps)
        q = rope(q.transpose(0, 1), bpos, inv).transpose(0, 1)  # [bs, H, d]
        kv = rope(rms(h @ t[p + "attn.wkv.weight"].T, eps, t[p + "attn.kv_norm.weight"]), bpos, inv)
        keys = torch.cat([ctx_kv, kv], dim=0)  # non-causal block: every query sees every key
        logits = torch.einsum("thd,kd->thk", q, keys) / math.sqrt(d)
        sink = t[p + "attn.attn_sink"].view(1, H, 1).expand(bs, H, 1)
        prob = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
        o = torch.einsum("thk,kd->thd", prob, keys)
        o = rope(o.transpose(0, 1), bpos, inv, sign=-1.0).transpose(0, 1).reshape(bs, H * d)
        gin = H * d // G
        wa = t[p + "attn.wo_a.weight"]
        cat = torch.cat([o[:, g * gin:(g + 1) * gin] @ wa[g * orank:(g + 1) * orank].T for g in range(G)], dim=-1)
        y = cat @ t[p + "attn.wo_b.weight"].T
        X = hc_post(X, y, post, C)
        u, post, C = hc_pre(X, t[p + "hc_ffn_fn"], t[p + "hc_ffn_base"], t[p + "hc_ffn_scale"], n, eps, hc_eps, iters)
        X = hc_post(X, moe(rms(u, eps, t[p + "ffn_norm.weight"]), p, t, cfg), post, C)
    hk = rms(hc_head(X, t[last + "hc_head_fn"], t[last + "hc_head_base"], t[last + "hc_head_scale"], eps, hc_eps), eps,
             t[last + "norm.weight"])
    U = hk @ head.double().T
    w1, w2 = t[last + "markov_head.markov_w1.weight"], t[last + "markov_head.markov_w2.weight"]
    cw = t.get(last + "confidence_head.proj.weight")
    toks, confs, margins = [], [], []
    prev = anchor
    for k in range(bs):
        e = w1[prev]
        l = U[k] + w2 @ e
        if cw is not None:
            z = torch.cat([hk[k], e]) if cw.shape[1] == D + e.shape[0] else hk[k]
            confs.append(float((cw @ z)[0]))
        top = torch.topk(l, 2).values
        margins.append(float(top[0] - top[1]))
        x = int(torch.argmax(l))
        toks.append(x)
        prev = x
    return toks, confs, margins


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    try:
        from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
    except ImportError:
        from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4ForCausalLM

    cfg = json.load(open(f"{a.ckpt}/config.json"))
    prompt = [int(x) for x in a.prompt.split(",")]
    # The target exactly as tools/reference/gen_deepseek_v4_goldens.py built it: config kwargs,
    # eager attention, the state dict under transformers names (mtp.* left out).
    kw = {k: v for k, v in cfg.items()
          if k not in ("model_type", "architectures", "torch_dtype") and not k.startswith("dspark_")}
    hf_cfg = DeepseekV4Config(attn_implementation="eager", **kw)
    hf_cfg._attn_implementation = "eager"
    model = DeepseekV4ForCausalLM(hf_cfg).eval().float()
    sd = {}
    with safe_open(f"{a.ckpt}/model.safetensors", framework="pt") as f:
        for k in f.keys():
            if not k.startswith("mtp."):
                sd[k] = f.get_tensor(k).float()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if "inv_freq" not in k]
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing {missing[:8]} unexpected {unexpected[:8]}")
    n = cfg.get("hc_mult", 4)
    caps = {}

    def hook(i):
        def f(mod, args, out):
            x = out[0] if isinstance(out, (tuple, list)) else out
            caps[i] = x.detach()
        return f

    layers = model.model.layers
    for i in cfg["dspark_target_layer_ids"]:
        layers[i].register_forward_hook(hook(i))
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt]), use_cache=False).logits[0].double()
    feats, shapes = [], {}
    for i in cfg["dspark_target_layer_ids"]:
        x = caps[i][0].double()
        shapes[i] = list(caps[i].shape)
        if x.dim() == 3:  # [S, n_hc, D]
            x = x.mean(dim=1)
        elif x.shape[-1] == n * cfg["hidden_size"]:
            x = x.reshape(x.shape[0], n, -1).mean(dim=1)
        feats.append(x)
    feats = torch.cat(feats, dim=-1)
    anchor = int(torch.argmax(logits[-1]))
    t = load(a.ckpt)
    embed = model.get_input_embeddings().weight.detach().double()
    head = model.get_output_embeddings().weight.detach().double()
    print(json.dumps({"anchor": anchor, "capture_shapes": shapes}), flush=True)
    try:
        toks, confs, margins = drafter(t, cfg, feats, anchor, embed, head)
    except Exception as ex:  # keep the target-side results
        import traceback
        traceback.print_exc()
        json.dump({"prompt": prompt, "anchor": anchor, "capture_shapes": shapes, "features": feats.tolist(),
                   "drafter_error": repr(ex)}, open(a.out, "w"))
        raise
    json.dump({"prompt": prompt, "anchor": anchor, "capture_shapes": shapes,
               "features": feats.tolist(), "draft_tokens": toks, "confidence_logits": confs,
               "draft_logit_margins": margins,
               "note": "features: transformers 5.17 layer outputs, mean over the n_hc streams; drafts: "
                       "tools/reference/v4_dspark_ref.py in float64"},
              open(a.out, "w"))
    print(json.dumps({"anchor": anchor, "draft_tokens": toks, "confidence_logits": confs,
                      "margins": margins, "capture_shapes": shapes}))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Independent PyTorch reference of the DFlash / DSpark drafters (docs/drafters_spec.md).

Two dialects:
  zlab      z-lab DFlash (`DFlashDraftModel`): block [anchor, MASK x (bs-1)], block index j>=1
            predicts the token AT start+j, bs-1 greedy drafts, embedding and LM head borrowed
            from the target, exact-match verification (spec §1).
  deepspec  DeepSpec DFlash / DSpark (`Qwen3DSparkModel`): all bs outputs predict (index j ->
            token at start+j+1), own embed_tokens / lm_head, optional Markov head
            (vanilla | gated | rnn) and confidence head, rejection-sampling verification (§2, §3).

Only the greedy (temperature 0) loops are implemented, since that is what the goldens record.
Float32 on CPU; everything deterministic.

Usage:
  /usr/bin/python3 tools/reference/drafters_ref.py --check-target   # target vs transformers goldens
  /usr/bin/python3 tools/reference/drafters_ref.py --check CASE_DIR [CASE_DIR...]  # recompute goldens
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io as st  # noqa: E402
from qwen3_ref import (LayerWeights, Qwen3Config, Qwen3Target, apply_rope, attention, linear,  # noqa: E402
                       mlp, project_qkv, rms_norm, rope_tables)

DEEPSPEC_ARCHS = ("Qwen3DSparkModel",)


def zlab_default_layer_ids(num_target_layers, num_draft_layers):
    """z-lab build_target_layer_ids (§1.3). Python round() = round half to even."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    return [round(1 + i * (num_target_layers - 4) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


class DraftConfig(Qwen3Config):
    def __init__(self, d):
        super().__init__(d)
        arch = (d.get("architectures") or [""])[0]
        if arch in DEEPSPEC_ARCHS:
            self.dialect = "deepspec"
            self.mask_token_id = d["mask_token_id"]
            self.target_layer_ids = list(d["target_layer_ids"])
            self.markov_rank = int(d.get("markov_rank", 0) or 0)
            self.markov_head_type = (d.get("markov_head_type") or "vanilla").lower() if self.markov_rank > 0 else None
            self.confidence_head = bool(d.get("enable_confidence_head", False))
            self.confidence_with_markov = bool(d.get("confidence_head_with_markov", False)) and self.confidence_head
            ids = self.target_layer_ids
            assert all(a < b for a, b in zip(ids, ids[1:])), "target_layer_ids must be strictly increasing"
            assert all(-1 <= l < d["num_target_layers"] for l in ids)
        elif arch == "DFlashDraftModel" or "dflash_config" in d:
            self.dialect = "zlab"
            dc = d.get("dflash_config") or {}
            self.mask_token_id = dc["mask_token_id"]
            ids = dc.get("target_layer_ids")
            self.target_layer_ids = list(ids) if ids is not None else \
                zlab_default_layer_ids(d["num_target_layers"], self.num_hidden_layers)
            self.markov_rank, self.markov_head_type = 0, None
            self.confidence_head = self.confidence_with_markov = False
        else:
            raise ValueError(f"unknown drafter architecture {arch!r}")
        self.block_size = d["block_size"]
        self.num_target_layers = d["num_target_layers"]


class DraftCache:
    """Context-only draft KV cache: per layer K (after k_norm and RoPE) and V of every
    committed position whose target features were injected. Its length always equals
    `start` between rounds (the block's K/V are never kept: 'crop to start')."""

    def __init__(self, cfg):
        z = torch.zeros(0, cfg.num_key_value_heads, cfg.head_dim)
        self.k = [z.clone() for _ in range(cfg.num_hidden_layers)]
        self.v = [z.clone() for _ in range(cfg.num_hidden_layers)]
        self.length = 0


class Drafter:
    def __init__(self, cfg, w, target):
        self.cfg = cfg
        if any(k.startswith("model.") for k in w):  # tolerate an optional `model.` prefix
            w = {k[len("model."):] if k.startswith("model.") else k: v for k, v in w.items()}
        self.fc = w["fc.weight"].float()
        self.hidden_norm = w["hidden_norm.weight"].float()
        self.layers = [LayerWeights(w, f"layers.{i}.", cfg) for i in range(cfg.num_hidden_layers)]
        self.norm = w["norm.weight"].float()
        if cfg.dialect == "zlab":
            assert "embed_tokens.weight" not in w and "lm_head.weight" not in w
            self.embed, self.lm_head = target.embed, target.lm_head  # borrowed from the target
        else:
            self.embed, self.lm_head = w["embed_tokens.weight"].float(), w["lm_head.weight"].float()
        H, r = cfg.hidden_size, cfg.markov_rank
        assert self.fc.shape == (H, len(cfg.target_layer_ids) * H)
        assert target.cfg.hidden_size == H
        if r:
            self.w1, self.w2 = w["markov_head.markov_w1.weight"].float(), w["markov_head.markov_w2.weight"].float()
            assert self.w1.shape == (cfg.vocab_size, r) and self.w2.shape == (cfg.vocab_size, r)
            if cfg.markov_head_type == "gated":
                self.gate_w, self.gate_b = w["markov_head.gate_proj.weight"].float(), w["markov_head.gate_proj.bias"].float()
                assert self.gate_w.shape == (r, H + r)
            elif cfg.markov_head_type == "rnn":
                self.joint_w, self.joint_b = w["markov_head.joint_proj.weight"].float(), w["markov_head.joint_proj.bias"].float()
                assert self.joint_w.shape == (3 * r, 2 * r + H)
            else:
                assert cfg.markov_head_type == "vanilla"
        if cfg.confidence_head:
            self.conf_w, self.conf_b = w["confidence_head.proj.weight"].float(), w["confidence_head.proj.bias"].float()
            assert self.conf_w.shape == (1, H + (r if cfg.confidence_with_markov else 0))

    @classmethod
    def load(cls, d, target):
        cfg = DraftConfig(json.load(open(os.path.join(d, "config.json"))))
        return cls(cfg, st.load(os.path.join(d, "model.safetensors")), target)

    # ------------------------------------------------------------------ backbone (§1.4)
    @torch.no_grad()
    def backbone(self, cache, ctx_features, block_ids, start):
        """ctx_features [c, m*H] of positions [cache.length, start); block_ids at
        positions [start, start+bs). Appends the context K/V to `cache` and returns the
        final-normed block outputs [bs, H]."""
        cfg = self.cfg
        c, bs = ctx_features.shape[0], len(block_ids)
        assert cache.length + c == start
        ctx = rms_norm(linear(ctx_features, self.fc), self.hidden_norm, cfg.rms_norm_eps)
        h = self.embed[torch.as_tensor(block_ids, dtype=torch.long)]
        cos_c, sin_c = rope_tables(cfg.inv_freq, cfg.attention_factor, list(range(cache.length, start)))
        cos_b, sin_b = rope_tables(cfg.inv_freq, cfg.attention_factor, list(range(start, start + bs)))
        for i, lw in enumerate(self.layers):
            x = rms_norm(h, lw.input_layernorm, cfg.rms_norm_eps)
            q = apply_rope(project_qkv(lw, cfg, x, "q"), cos_b, sin_b)
            k_ctx = apply_rope(project_qkv(lw, cfg, ctx, "k"), cos_c, sin_c)  # no input_layernorm on ctx
            v_ctx = project_qkv(lw, cfg, ctx, "v")
            k_blk = apply_rope(project_qkv(lw, cfg, x, "k"), cos_b, sin_b)
            v_blk = project_qkv(lw, cfg, x, "v")
            cache.k[i] = torch.cat([cache.k[i], k_ctx])
            cache.v[i] = torch.cat([cache.v[i], v_ctx])
            k = torch.cat([cache.k[i], k_blk])
            v = torch.cat([cache.v[i], v_blk])
            h = h + linear(attention(q, k, v, None), lw.o_proj, lw.o_bias)  # non-causal, no mask
            h = h + mlp(rms_norm(h, lw.post_attention_layernorm, cfg.rms_norm_eps), lw.gate, lw.up, lw.down)
        cache.length = start
        return rms_norm(h, self.norm, cfg.rms_norm_eps)

    def logits(self, h):
        return linear(h, self.lm_head)

    # ------------------------------------------------------------------ heads (§2.4, §2.5)
    def markov_bias(self, prev, h_k, state):
        """Returns (B_k [V], new_state). state: RNN state s_{k-1} [r] (None for other heads)."""
        e = self.w1[prev]
        t = self.cfg.markov_head_type
        if t == "vanilla":
            return self.w2 @ e, state
        if t == "gated":
            g = torch.sigmoid(linear(torch.cat([h_k, e]), self.gate_w, self.gate_b))
            return self.w2 @ (g * e), state
        r = self.cfg.markov_rank
        z = torch.cat([state, e, h_k])  # [s_{k-1}; W1[x_{k-1}]; h_k]
        j = linear(z, self.joint_w, self.joint_b)
        gate_raw, cand_raw, out_raw = j[:r], j[r:2 * r], j[2 * r:]
        sg = torch.sigmoid(gate_raw)
        new_state = sg * state + (1 - sg) * torch.tanh(cand_raw)
        return self.w2 @ torch.tanh(out_raw), new_state  # output uses the pre-update z

    def confidence_logit(self, h_k, prev):
        feat = torch.cat([h_k, self.w1[prev]]) if self.cfg.confidence_with_markov else h_k
        return (linear(feat, self.conf_w, self.conf_b))[0]


def top2_margin(row):
    t = torch.topk(row, 2).values
    return float(t[0] - t[1])


def plain_greedy(target, prompt, n):
    seq, margin = list(prompt), float("inf")
    for _ in range(n):
        last = target.forward(seq)[0][-1]
        margin = min(margin, top2_margin(last))
        seq.append(int(last.argmax()))
    return seq[len(prompt):], margin


@torch.no_grad()
def speculative_greedy(target, drafter, prompt, n_out, recompute_context=False):
    """Greedy speculative loop (§1.6 for zlab, §2.7 for deepspec; T = 0, full block, no
    confidence truncation). Returns (golden dict, tensors dict, stats).
    recompute_context: cross-check mode that rebuilds the draft context K/V from all
    committed features every round (fresh cache) instead of appending incrementally."""
    cfg = drafter.cfg
    zlab = cfg.dialect == "zlab"
    bs, mask, ids = cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids
    P = len(prompt)
    logits, hs = target.forward(prompt)
    stats = {"target_margin": top2_margin(logits[-1]), "draft_margin": float("inf"), "accepted": []}
    seq = list(prompt) + [int(logits[-1].argmax())]
    start = P
    ctx = target.features(hs, ids)  # [P, m*H]
    tensors = {"context_features": ctx.clone()}
    cache = DraftCache(cfg)
    all_ctx = ctx
    rounds = []
    while len(seq) - P < n_out:
        anchor = seq[start]
        assert len(seq) == start + 1
        if recompute_context:
            cache, ctx = DraftCache(cfg), all_ctx
        h = drafter.backbone(cache, ctx, [anchor] + [mask] * (bs - 1), start)
        U = drafter.logits(h)
        if zlab:
            U = U[1:]  # block index j >= 1 predicts the token at start + j
        n = U.shape[0]
        bias_rows, final_rows, conf_logits, drafts = [], [], [], []
        prev = anchor
        state = torch.zeros(cfg.markov_rank) if cfg.markov_head_type == "rnn" else None
        for k in range(n):
            hk = h[k + 1] if zlab else h[k]
            if cfg.markov_rank:
                b, state = drafter.markov_bias(prev, hk, state)
                bias_rows.append(b)
                lk = U[k] + b
            else:
                lk = U[k]
            final_rows.append(lk)
            if cfg.confidence_head:
                conf_logits.append(drafter.confidence_logit(hk, prev))
            x = int(lk.argmax())
            stats["draft_margin"] = min(stats["draft_margin"], top2_margin(lk))
            drafts.append(x)
            prev = x
        final = torch.stack(final_rows)
        logprobs = torch.log_softmax(final, dim=-1)
        # Verify: zlab runs the target on the bs block tokens [anchor, drafts] (bs-1 drafts);
        # deepspec on [anchor, x_0..x_{n-1}] (n+1 tokens). Either way n+1 positions.
        vlogits, vhs = target.forward(seq[:start] + [anchor] + drafts)
        tgt = vlogits[start:start + n + 1]
        target_greedy = [int(t) for t in tgt.argmax(-1)]
        acc = 0
        while acc < n and drafts[acc] == target_greedy[acc]:
            acc += 1
        for j in range(acc + 1):  # margins of the target decisions that shape the output
            stats["target_margin"] = min(stats["target_margin"], top2_margin(tgt[j]))
        committed = drafts[:acc] + [target_greedy[acc]]
        i = len(rounds)
        rounds.append({"start": start, "anchor": anchor, "draft_ids": drafts,
                       "draft_logprobs": [float(logprobs[k, drafts[k]]) for k in range(n)],
                       "confidence": [float(torch.sigmoid(z)) for z in conf_logits] if cfg.confidence_head else None,
                       "target_greedy": target_greedy, "accepted": acc, "committed": committed})
        tensors[f"round{i}.base_logits"] = U.clone()
        if cfg.markov_rank:
            tensors[f"round{i}.markov_bias"] = torch.stack(bias_rows)
        tensors[f"round{i}.draft_logits"] = final.clone()
        tensors[f"round{i}.backbone_out"] = h.clone()
        if cfg.confidence_head:
            tensors[f"round{i}.confidence_logits"] = torch.stack(conf_logits)
        stats["accepted"].append(acc)
        # Commit anchor + accepted drafts (their verify features feed the next draft call) + bonus.
        ctx = target.features(vhs, ids)[start:start + acc + 1]
        if recompute_context:  # features of all committed positions from one fresh target pass
            all_ctx = target.features(target.forward(seq[:start + 1] + drafts[:acc])[1], ids)
        seq = seq[:start + 1] + committed
        start += acc + 1
    golden = {"dialect": cfg.dialect, "prompt": list(prompt), "block_size": bs, "mask_token_id": mask,
              "target_layer_ids": list(ids), "rounds": rounds, "greedy_output": seq[P:P + n_out]}
    return golden, tensors, stats


def check_case(case_dir, rtol=1e-5):
    """Reloads a case from disk, re-runs the reference and compares with its goldens."""
    target = Qwen3Target.load(os.path.join(case_dir, "target"))
    drafter = Drafter.load(os.path.join(case_dir, "draft"), target)
    gold = json.load(open(os.path.join(case_dir, "golden.json")))
    gt = st.load(os.path.join(case_dir, "golden_tensors.safetensors"))
    golden, tensors, _ = speculative_greedy(target, drafter, gold["prompt"], len(gold["greedy_output"]))
    for key in ("dialect", "prompt", "block_size", "mask_token_id", "target_layer_ids", "greedy_output"):
        assert golden[key] == gold[key], (case_dir, key)
    assert len(golden["rounds"]) == len(gold["rounds"])
    for a, b in zip(golden["rounds"], gold["rounds"]):
        for key in ("start", "anchor", "draft_ids", "target_greedy", "accepted", "committed"):
            assert a[key] == b[key], (case_dir, key)
        for key in ("draft_logprobs", "confidence"):
            if b[key] is None:
                assert a[key] is None
            else:
                assert torch.allclose(torch.tensor(a[key]), torch.tensor(b[key]), rtol=rtol, atol=1e-6), key
    assert set(tensors) == set(gt), (sorted(set(tensors) ^ set(gt)))
    worst = 0.0
    for k, v in tensors.items():
        ref = gt[k]
        assert v.shape == ref.shape, k
        err = float((v - ref).abs().max() / max(ref.abs().max(), 1e-30))
        worst = max(worst, err)
    assert worst <= rtol, (case_dir, worst)
    plain, _ = plain_greedy(target, gold["prompt"], len(gold["greedy_output"]))
    assert plain == gold["greedy_output"], case_dir
    # Cross-check of the incremental draft cache: rebuilding the context K/V from scratch every
    # round (features from a fresh full target pass) must give the same goldens.
    _, t2, _ = speculative_greedy(target, drafter, gold["prompt"], len(gold["greedy_output"]),
                                  recompute_context=True)
    assert set(t2) == set(gt)
    recompute_err = max(float((t2[k] - gt[k]).abs().max() / max(gt[k].abs().max(), 1e-30)) for k in gt)
    assert recompute_err <= 1e-5, (case_dir, recompute_err)
    return max(worst, recompute_err)


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.normpath(os.path.join(here, "..", ".."))
    if "--check-target" in argv:
        ok = True
        for case, mx, rel, greedy in __import__("qwen3_ref").validate_against_transformers(
                os.path.join(repo, "tests", "data", "qwen3")):
            print(f"target {case}: max|dlogit|={mx:.3g} rel={rel:.3g} greedy_match={greedy}")
            ok &= mx < 1e-4 and greedy
        if not ok:
            sys.exit(1)
    if "--check" in argv:
        for d in argv[argv.index("--check") + 1:]:
            print(f"{d}: reproduced, worst tensor rel err {check_case(d):.3g}")


if __name__ == "__main__":
    main(sys.argv[1:])

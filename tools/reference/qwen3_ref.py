"""Independent PyTorch reference of the Qwen3 decoder (target model of the drafters).

Written from the Qwen3 architecture description (docs/drafters_spec.md §1.2 operator
semantics + the standard Qwen3 layer), not from transformers. Float32, CPU, no KV cache:
every call recomputes the whole sequence with a causal mask (the drafter loops only need
logits and layer outputs at given positions, which a full recompute gives exactly).

Public pieces reused by drafters_ref.py: rms_norm, rope_tables, apply_rope, attention,
mlp, Qwen3Config, Qwen3Target.
"""
import json
import math
import os

import torch

import safetensors_io as st


# ----------------------------------------------------------------------------- operators

def rms_norm(x, w, eps):
    """w * x / sqrt(mean(x^2) + eps) over the last axis, fp32 (weight multiplies directly)."""
    x32 = x.to(torch.float32)
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))


def linear(x, w, b=None):
    y = x @ w.t()
    return y + b if b is not None else y


def mlp(x, gate, up, down):
    return linear(torch.nn.functional.silu(linear(x, gate)) * linear(x, up), down)


def rope_inv_freq(rope, head_dim, max_pos):
    """(inv_freq [hd/2] float32, attention_factor) for rope types default / linear / yarn.
    Evaluated in float64 and rounded once."""
    dim = head_dim
    base = float(rope["rope_theta"])
    idx = torch.arange(0, dim, 2, dtype=torch.float64)
    pos_freqs = base ** (idx / dim)
    rtype = rope.get("rope_type", rope.get("type", "default"))
    attn = 1.0
    if rtype == "default":
        inv = 1.0 / pos_freqs
    elif rtype == "linear":
        inv = 1.0 / pos_freqs / float(rope["factor"])
    elif rtype == "yarn":
        factor = float(rope["factor"])
        orig = rope.get("original_max_position_embeddings") or max_pos
        beta_fast = float(rope.get("beta_fast") or 32.0)
        beta_slow = float(rope.get("beta_slow") or 1.0)

        def mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attn = rope.get("attention_factor")
        if attn is None:
            ms, msa = rope.get("mscale"), rope.get("mscale_all_dim")
            attn = mscale(factor, ms) / mscale(factor, msa) if (ms and msa) else mscale(factor)

        def corr_dim(n_rot):
            return (dim * math.log(orig / (n_rot * 2 * math.pi))) / (2 * math.log(base))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if rope.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        extrap = 1.0 - ramp
        inv = (1.0 / (factor * pos_freqs)) * (1 - extrap) + (1.0 / pos_freqs) * extrap
    else:
        raise ValueError(f"unsupported rope_type {rtype}")
    return inv.to(torch.float32), float(attn)


def rope_tables(inv_freq, attn_factor, positions):
    """cos, sin [T, hd] for absolute integer positions (rotate-half layout: freqs repeated)."""
    pos = torch.as_tensor(positions, dtype=torch.float64)
    freqs = pos[:, None] * inv_freq.to(torch.float64)[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * attn_factor).to(torch.float32), (emb.sin() * attn_factor).to(torch.float32)


def apply_rope(x, cos, sin):
    """x [T, heads, hd]; cos/sin [T, hd]. Non-interleaved rotate-half."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def attention(q, k, v, mask=None):
    """q [Tq, nH, hd], k/v [Tk, nKV, hd]; GQA (query head h uses kv head h // (nH/nKV)).
    mask: bool [Tq, Tk] (True = may attend) or None. Scale hd^-0.5. Returns [Tq, nH*hd]."""
    nh, nkv, hd = q.shape[1], k.shape[1], q.shape[2]
    rep = nh // nkv
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * (hd ** -0.5)
    if mask is not None:
        scores = scores.masked_fill(~mask[None], float("-inf"))
    p = torch.softmax(scores, dim=-1)
    out = torch.einsum("hqk,khd->qhd", p, v)
    return out.reshape(out.shape[0], nh * hd)


# ----------------------------------------------------------------------------- config

class Qwen3Config:
    """The fields of a Qwen3-style config.json the references use."""

    def __init__(self, d):
        self.raw = d
        self.vocab_size = d["vocab_size"]
        self.hidden_size = d["hidden_size"]
        self.intermediate_size = d["intermediate_size"]
        self.num_hidden_layers = d["num_hidden_layers"]
        self.num_attention_heads = d["num_attention_heads"]
        self.num_key_value_heads = d.get("num_key_value_heads") or self.num_attention_heads
        self.head_dim = d.get("head_dim") or self.hidden_size // self.num_attention_heads
        self.rms_norm_eps = d.get("rms_norm_eps", 1e-6)
        self.attention_bias = bool(d.get("attention_bias", False))
        self.tie_word_embeddings = bool(d.get("tie_word_embeddings", False))
        self.max_position_embeddings = d.get("max_position_embeddings", 32768)
        # RoPE: transformers 4.x top-level rope_theta (+ optional rope_scaling) or 5.x rope_parameters.
        rope = {"rope_theta": d.get("rope_theta", 10000.0), "rope_type": "default"}
        if d.get("rope_scaling"):
            rope.update(d["rope_scaling"])
        if d.get("rope_parameters"):
            rp = d["rope_parameters"]
            if "full_attention" in rp:
                rp = rp["full_attention"]
            rope.update(rp)
        self.rope = rope
        self.inv_freq, self.attention_factor = rope_inv_freq(rope, self.head_dim, self.max_position_embeddings)

    @classmethod
    def load(cls, path):
        with open(path) as f:
            return cls(json.load(f))


# ----------------------------------------------------------------------------- layer weights

class LayerWeights:
    """One Qwen3 decoder layer's tensors, looked up under `prefix` (e.g. 'model.layers.3.')."""

    def __init__(self, w, prefix, cfg):
        g = lambda n: w[prefix + n].to(torch.float32)
        o = lambda n: w[prefix + n].to(torch.float32) if (prefix + n) in w else None
        self.input_layernorm = g("input_layernorm.weight")
        self.post_attention_layernorm = g("post_attention_layernorm.weight")
        self.q_proj, self.k_proj = g("self_attn.q_proj.weight"), g("self_attn.k_proj.weight")
        self.v_proj, self.o_proj = g("self_attn.v_proj.weight"), g("self_attn.o_proj.weight")
        self.q_bias, self.k_bias = o("self_attn.q_proj.bias"), o("self_attn.k_proj.bias")
        self.v_bias, self.o_bias = o("self_attn.v_proj.bias"), o("self_attn.o_proj.bias")
        if cfg.attention_bias:
            assert self.q_bias is not None and self.k_bias is not None and self.v_bias is not None
        self.q_norm, self.k_norm = g("self_attn.q_norm.weight"), g("self_attn.k_norm.weight")
        self.gate, self.up, self.down = g("mlp.gate_proj.weight"), g("mlp.up_proj.weight"), g("mlp.down_proj.weight")


def project_qkv(lw, cfg, x, which):
    """Per-head projections: 'q' -> q_norm(q_proj x) [T, nH, hd]; 'k' -> k_norm(k_proj x);
    'v' -> v_proj x (never normalized). RoPE is applied by the caller."""
    T, hd, eps = x.shape[0], cfg.head_dim, cfg.rms_norm_eps
    if which == "q":
        return rms_norm(linear(x, lw.q_proj, lw.q_bias).view(T, cfg.num_attention_heads, hd), lw.q_norm, eps)
    if which == "k":
        return rms_norm(linear(x, lw.k_proj, lw.k_bias).view(T, cfg.num_key_value_heads, hd), lw.k_norm, eps)
    return linear(x, lw.v_proj, lw.v_bias).view(T, cfg.num_key_value_heads, hd)


# ----------------------------------------------------------------------------- target

class Qwen3Target:
    """Qwen3ForCausalLM forward. forward(ids) -> (logits [T, V], hidden_states list of L+1
    tensors [T, H]: index 0 = embedding output, index l+1 = output of layer l (residual
    stream after its MLP add, before the final norm))."""

    def __init__(self, cfg, w):
        self.cfg = cfg
        pre = "model." if "model.embed_tokens.weight" in w else ""
        self.embed = w[pre + "embed_tokens.weight"].to(torch.float32)
        self.layers = [LayerWeights(w, f"{pre}layers.{i}.", cfg) for i in range(cfg.num_hidden_layers)]
        self.norm = w[pre + "norm.weight"].to(torch.float32)
        if "lm_head.weight" in w and not cfg.tie_word_embeddings:
            self.lm_head = w["lm_head.weight"].to(torch.float32)
        else:
            self.lm_head = self.embed

    @classmethod
    def load(cls, d):
        cfg = Qwen3Config.load(os.path.join(d, "config.json"))
        return cls(cfg, st.load(os.path.join(d, "model.safetensors")))

    @torch.no_grad()
    def forward(self, ids):
        cfg = self.cfg
        T = len(ids)
        h = self.embed[torch.as_tensor(ids, dtype=torch.long)]
        hs = [h]
        cos, sin = rope_tables(cfg.inv_freq, cfg.attention_factor, list(range(T)))
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        for lw in self.layers:
            x = rms_norm(h, lw.input_layernorm, cfg.rms_norm_eps)
            q = apply_rope(project_qkv(lw, cfg, x, "q"), cos, sin)
            k = apply_rope(project_qkv(lw, cfg, x, "k"), cos, sin)
            v = project_qkv(lw, cfg, x, "v")
            h = h + linear(attention(q, k, v, causal), lw.o_proj, lw.o_bias)
            h = h + mlp(rms_norm(h, lw.post_attention_layernorm, cfg.rms_norm_eps), lw.gate, lw.up, lw.down)
            hs.append(h)
        logits = linear(rms_norm(h, self.norm, cfg.rms_norm_eps), self.lm_head)
        return logits, hs

    def features(self, hs, layer_ids):
        """Concatenated captured outputs [T, m*H] in layer_ids order (-1 = embedding output)."""
        return torch.cat([hs[l + 1] for l in layer_ids], dim=-1)


def validate_against_transformers(root):
    """Compares Qwen3Target logits with the transformers goldens under tests/data/qwen3/<case>/.
    Returns [(case, max_abs_err, max_rel_err_vs_max_abs_logit, greedy_ok)]."""
    results = []
    for case in sorted(os.listdir(root)):
        d = os.path.join(root, case)
        if not os.path.isfile(os.path.join(d, "golden_logits.safetensors")):
            continue
        model = Qwen3Target.load(d)
        with open(os.path.join(d, "golden.json")) as f:
            g = json.load(f)
        gold = st.load(os.path.join(d, "golden_logits.safetensors"))
        max_abs, max_rel = 0.0, 0.0
        for i, pr in enumerate(g["prompts"]):
            logits, _ = model.forward(pr)
            ref = gold[f"logits.{i}"]
            err = (logits - ref).abs().max().item()
            max_abs = max(max_abs, err)
            max_rel = max(max_rel, err / ref.abs().max().item())
        greedy_ok = True
        for pr, cont in zip(g["prompts"][:2], g["greedy"][:2]):  # full greedy on the short prompts
            seq = list(pr)
            for t in cont:
                nxt = int(model.forward(seq)[0][-1].argmax())
                greedy_ok &= nxt == t
                seq.append(t)
        results.append((case, max_abs, max_rel, greedy_ok))
    return results

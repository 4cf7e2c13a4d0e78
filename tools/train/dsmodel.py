"""Trainable PyTorch modules for the embedded models: the Qwen3 target and the DFlash / DSpark
drafters (DeepSpec `Qwen3DSparkModel` layout and z-lab `DFlashDraftModel` layout).

The operator definitions (RMSNorm, RoPE frequencies, rotate-half, SwiGLU, QK-norm, GQA) are
the ones of our reference, tools/reference/qwen3_ref.py / drafters_ref.py (imported, not
re-derived), so training and inference agree; parameter names are the Hugging Face ones so
`state_dict()` is the checkpoint layout (`save_target` / `save_drafter` write config.json +
BF16 model.safetensors through tools/reference/safetensors_io.py).

Runs on torch 1.13 (Debian, CPU; manual attention) and torch 2.x (GPU; SDPA).
"""
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import safetensors_io as st  # noqa: E402
from qwen3_ref import rms_norm, rope_inv_freq  # noqa: E402

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")

# ----------------------------------------------------------------------------- configs

# Proposed shipped sizes (see README.md "Sizes and byte budget").
TARGET_PRESETS = {
    # V=8192, H=320, 8 layers, 6 query heads / 2 KV heads of 64, SwiGLU 896, tied embeddings
    "small": dict(hidden_size=320, num_hidden_layers=8, num_attention_heads=6, num_key_value_heads=2,
                  head_dim=64, intermediate_size=896),
    # toy: for CPU smoke tests
    "tiny": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, intermediate_size=128),
}


def target_config(vocab_size, preset="small", eos_ids=(), bos_id=None, rope_theta=10000.0, max_pos=4096, **over):
    d = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=vocab_size,
             hidden_act="silu", rms_norm_eps=1e-6, attention_bias=False, attention_dropout=0.0,
             rope_theta=rope_theta, rope_scaling=None, max_position_embeddings=max_pos,
             tie_word_embeddings=True, use_sliding_window=False, sliding_window=None, max_window_layers=0,
             initializer_range=0.02, use_cache=True, torch_dtype="bfloat16",
             bos_token_id=bos_id, eos_token_id=list(eos_ids)[0] if eos_ids else None)
    d.update(TARGET_PRESETS[preset])
    d.update(over)
    d["layer_types"] = ["full_attention"] * d["num_hidden_layers"]
    return d


def default_layer_ids(num_target_layers, m):
    """m captured layers spread over [1, L_t-2] (never the last layer: HF's last hidden_states
    entry is final-normed, spec §1.3)."""
    lo, hi = 1, max(1, num_target_layers - 2)
    if m == 1:
        return [num_target_layers // 2]
    ids = sorted(set(round(lo + i * (hi - lo) / (m - 1)) for i in range(m)))
    return ids


def deepspec_config(tcfg, num_layers, block_size, mask_token_id, layer_ids, markov_rank=0, confidence=False):
    """Spec §2.2: a deep copy of the target config with the DeepSpec overrides."""
    d = json.loads(json.dumps(tcfg))
    d.update(architectures=["Qwen3DSparkModel"], num_target_layers=tcfg["num_hidden_layers"],
             num_hidden_layers=num_layers, block_size=block_size, tie_word_embeddings=False,
             layer_types=["full_attention"] * num_layers, mask_token_id=mask_token_id,
             target_layer_ids=list(layer_ids), num_anchors=512, enable_confidence_head=bool(confidence),
             markov_rank=int(markov_rank))
    if confidence:
        d["confidence_head_with_markov"] = markov_rank > 0
    if markov_rank > 0:
        d["markov_head_type"] = "vanilla"
    d.pop("auto_map", None)
    return d


def zlab_config(tcfg, num_layers, block_size, mask_token_id, layer_ids):
    """Spec §1.1: Qwen3Config + block_size, num_target_layers, dflash_config."""
    d = json.loads(json.dumps(tcfg))
    d.update(architectures=["DFlashDraftModel"], num_target_layers=tcfg["num_hidden_layers"],
             num_hidden_layers=num_layers, block_size=block_size,
             layer_types=["full_attention"] * num_layers,
             dflash_config={"mask_token_id": mask_token_id, "target_layer_ids": list(layer_ids)},
             auto_map={"AutoModel": "dflash.DFlashDraftModel"})
    return d


# ----------------------------------------------------------------------------- operators

class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps).to(x.dtype)  # qwen3_ref: fp32 statistics


class Rope(nn.Module):
    """cos/sin tables from the reference's rope_inv_freq (float64 evaluation, rounded once)."""

    def __init__(self, cfg):
        super().__init__()
        hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        rope = {"rope_theta": cfg.get("rope_theta", 10000.0), "rope_type": "default"}
        if cfg.get("rope_scaling"):
            rope.update(cfg["rope_scaling"])
        inv, self.attn_factor = rope_inv_freq(rope, hd, cfg.get("max_position_embeddings", 4096))
        self.register_buffer("inv_freq", inv.to(torch.float64), persistent=False)

    def tables(self, pos):
        """pos: integer tensor [...] -> cos, sin [..., hd] float32."""
        f = pos.to(torch.float64)[..., None] * self.inv_freq.to(pos.device)
        emb = torch.cat([f, f], dim=-1)
        return (emb.cos() * self.attn_factor).float(), (emb.sin() * self.attn_factor).float()


def apply_rope(x, cos, sin):
    """x [B, T, heads, hd]; cos/sin [B or 1, T, hd]. Rotate-half, as qwen3_ref.apply_rope."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    c, s = cos[:, :, None, :].to(x.dtype), sin[:, :, None, :].to(x.dtype)
    return x * c + rot * s


def attend(q, k, v, mask=None, causal=False):
    """q [B, Tq, nH, hd], k/v [B, Tk, nKV, hd]; mask bool [B, Tq, Tk] (True = may attend).
    Returns [B, Tq, nH*hd]. Scale hd^-0.5 (GQA: query head h uses kv head h // (nH/nKV))."""
    B, Tq, nh, hd = q.shape
    rep = nh // k.shape[2]
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    if HAS_SDPA:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask[:, None],
                                           is_causal=causal and mask is None)
    else:
        s = torch.matmul(q, k.transpose(-1, -2)) * (hd ** -0.5)
        if causal and mask is None:
            mask = torch.ones(Tq, k.shape[2], dtype=torch.bool, device=q.device).tril(k.shape[2] - Tq)[None]
        if mask is not None:
            s = s.masked_fill(~mask[:, None], float("-inf"))
        o = torch.matmul(torch.softmax(s.float(), dim=-1).to(v.dtype), v)
    return o.transpose(1, 2).reshape(B, Tq, nh * hd)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        hd = cfg.get("head_dim") or H // nh
        b = bool(cfg.get("attention_bias", False))
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(H, nh * hd, bias=b)
        self.k_proj = nn.Linear(H, nkv * hd, bias=b)
        self.v_proj = nn.Linear(H, nkv * hd, bias=b)
        self.o_proj = nn.Linear(nh * hd, H, bias=b)
        self.q_norm = RMSNorm(hd, cfg["rms_norm_eps"])
        self.k_norm = RMSNorm(hd, cfg["rms_norm_eps"])

    def q(self, x, cos, sin):
        B, T, _ = x.shape
        return apply_rope(self.q_norm(self.q_proj(x).view(B, T, self.nh, self.hd)), cos, sin)

    def kv(self, x, cos, sin):
        B, T, _ = x.shape
        k = apply_rope(self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.hd)), cos, sin)
        return k, self.v_proj(x).view(B, T, self.nkv, self.hd)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, I = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mlp = MLP(cfg)


def init_weights(module, std):
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, std)


# ----------------------------------------------------------------------------- target

class Qwen3Inner(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class Qwen3LM(nn.Module):
    """Qwen3ForCausalLM with HF parameter names (model.*, lm_head.* unless tied)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Qwen3Inner(cfg)
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        if not self.tied:
            self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        self.rope = Rope(cfg)
        init_weights(self, cfg.get("initializer_range", 0.02))

    def head_weight(self):
        return self.model.embed_tokens.weight if self.tied else self.lm_head.weight

    def logits(self, h_normed):
        return F.linear(h_normed, self.head_weight())

    def forward(self, ids, capture=None, return_hidden=False, cache=None, pos0=0):
        """ids [B, T]. Returns (logits or final-normed hidden, captured). `capture`: list of
        layer ids (-1 = embedding output) whose raw outputs are concatenated ([B, T, m*H]).
        cache: optional KVCache; the T new positions start at pos0 (decode with KV cache)."""
        B, T = ids.shape
        h = self.model.embed_tokens(ids)
        feats = {}
        if capture is not None and -1 in capture:
            feats[-1] = h
        pos = torch.arange(pos0, pos0 + T, device=ids.device)[None]
        cos, sin = self.rope.tables(pos)
        for i, L in enumerate(self.model.layers):
            x = L.input_layernorm(h)
            q = L.self_attn.q(x, cos, sin)
            k, v = L.self_attn.kv(x, cos, sin)
            if cache is not None:
                k, v = cache.update(i, k, v, pos0)
                a = attend(q, k, v, causal=True) if T > 1 else attend(q, k, v)
            else:
                a = attend(q, k, v, causal=True)
            h = h + L.self_attn.o_proj(a)
            h = h + L.mlp(L.post_attention_layernorm(h))
            if capture is not None and i in capture:
                feats[i] = h
        hn = self.model.norm(h)
        cap = torch.cat([feats[l] for l in capture], dim=-1) if capture else None
        return (hn if return_hidden else self.logits(hn)), cap


class KVCache:
    """Static per-layer K/V [B, Tmax, nKV, hd] for batched generation (equal-length rows)."""

    def __init__(self, cfg, B, Tmax, device, dtype):
        hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        shape = (B, Tmax, cfg["num_key_value_heads"], hd)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg["num_hidden_layers"])]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg["num_hidden_layers"])]

    def update(self, i, k, v, pos0):
        T = k.shape[1]
        self.k[i][:, pos0:pos0 + T] = k
        self.v[i][:, pos0:pos0 + T] = v
        return self.k[i][:, :pos0 + T], self.v[i][:, :pos0 + T]


# ----------------------------------------------------------------------------- drafters

class MarkovHead(nn.Module):
    """Vanilla Markov head (spec §2.4): B_k = W2 · W1[x_{k-1}]."""

    def __init__(self, V, r):
        super().__init__()
        self.markov_w1 = nn.Embedding(V, r)
        self.markov_w2 = nn.Linear(r, V, bias=False)  # weight [V, r] as stored


class ConfidenceHead(nn.Module):
    def __init__(self, n_in):
        super().__init__()
        self.proj = nn.Linear(n_in, 1)


class BlockDrafter(nn.Module):
    """DeepSpec Qwen3DSparkModel (dialect 'deepspec') or z-lab DFlashDraftModel ('zlab').
    State-dict keys are exactly the checkpoint's (spec §1.2 / §2.3)."""

    def __init__(self, cfg, dialect):
        super().__init__()
        self.cfg, self.dialect = cfg, dialect
        H, V = cfg["hidden_size"], cfg["vocab_size"]
        if dialect == "zlab":
            self.layer_ids = cfg["dflash_config"]["target_layer_ids"]
            self.mask_id = cfg["dflash_config"]["mask_token_id"]
        else:
            self.layer_ids, self.mask_id = cfg["target_layer_ids"], cfg["mask_token_id"]
        self.bs = cfg["block_size"]
        self.fc = nn.Linear(len(self.layer_ids) * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, cfg["rms_norm_eps"])
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(H, cfg["rms_norm_eps"])
        self.r = int(cfg.get("markov_rank", 0) or 0) if dialect == "deepspec" else 0
        self.conf = bool(cfg.get("enable_confidence_head", False)) if dialect == "deepspec" else False
        if dialect == "deepspec":
            self.embed_tokens = nn.Embedding(V, H)
            self.lm_head = nn.Linear(H, V, bias=False)
            if self.r:
                self.markov_head = MarkovHead(V, self.r)
            if self.conf:
                self.confidence_head = ConfidenceHead(H + (self.r if cfg.get("confidence_head_with_markov") else 0))
        self.rope = Rope(cfg)
        init_weights(self, cfg.get("initializer_range", 0.02))
        if self.r:
            nn.init.zeros_(self.markov_head.markov_w2.weight)  # start as "no bias"; W1 random

    def attach_target(self, target):
        """Copies (DeepSpec) or borrows (z-lab) the frozen embedding / LM head of the target."""
        if self.dialect == "deepspec":
            with torch.no_grad():
                self.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
                self.lm_head.weight.copy_(target.head_weight())
            self.embed_tokens.weight.requires_grad_(False)
            self.lm_head.weight.requires_grad_(False)
        else:
            self.share_target(target)

    def share_target(self, target):
        # plain attribute (not a registered parameter): never saved with the drafter
        self.__dict__["_shared"] = (target.model.embed_tokens.weight, target.head_weight())

    @property
    def _embed(self):
        return self.embed_tokens.weight if self.dialect == "deepspec" else self.__dict__["_shared"][0]

    @property
    def _head(self):
        return self.lm_head.weight if self.dialect == "deepspec" else self.__dict__["_shared"][1]

    def backbone(self, feats, block_ids, anchors):
        """Training-time backbone (spec §6 block mask).
        feats [B, T, m*H] captured target outputs of every position; block_ids [B, A, bs];
        anchors [B, A] anchor positions. Block a's queries see context positions < anchor
        plus their own block. Returns final-normed block outputs [B, A*bs, H]."""
        B, T, _ = feats.shape
        A, bs = anchors.shape[1], self.bs
        ctx = self.hidden_norm(self.fc(feats))
        h = F.embedding(block_ids.reshape(B, A * bs), self._embed)
        qpos = (anchors[:, :, None] + torch.arange(bs, device=feats.device)).reshape(B, A * bs)
        cos_b, sin_b = self.rope.tables(qpos)
        cos_c, sin_c = self.rope.tables(torch.arange(T, device=feats.device)[None])
        ctx_vis = torch.arange(T, device=feats.device)[None, None, :] < anchors.reshape(B, A, 1)  # [B, A, T]
        ctx_vis = ctx_vis[:, :, None, :].expand(B, A, bs, T).reshape(B, A * bs, T)
        blk = torch.arange(A, device=feats.device).repeat_interleave(bs)
        own = (blk[:, None] == blk[None, :])[None].expand(B, -1, -1)
        mask = torch.cat([ctx_vis, own], dim=-1)  # [B, A*bs, T + A*bs]
        for L in self.layers:
            x = L.input_layernorm(h)
            q = L.self_attn.q(x, cos_b, sin_b)
            kc, vc = L.self_attn.kv(ctx, cos_c, sin_c)  # no input_layernorm on ctx
            kb, vb = L.self_attn.kv(x, cos_b, sin_b)
            a = attend(q, torch.cat([kc, kb], 1), torch.cat([vc, vb], 1), mask=mask)
            h = h + L.self_attn.o_proj(a)
            h = h + L.mlp(L.post_attention_layernorm(h))
        return self.norm(h)

    def heads(self, hb, prev):
        """hb [B, N, H] backbone outputs, prev [B, N] previous tokens (teacher forcing).
        Returns (logits [B, N, V] incl. Markov bias, confidence logits [B, N] or None)."""
        logits = F.linear(hb, self._head)
        e = None
        if self.r:
            e = self.markov_head.markov_w1(prev)
            logits = logits + self.markov_head.markov_w2(e)
        z = None
        if self.conf:
            feat = torch.cat([hb, e.to(hb.dtype)], -1) if self.cfg.get("confidence_head_with_markov") else hb
            z = self.confidence_head.proj(feat)[..., 0].float()
        return logits, z

    def trainable_state(self):
        sd = self.state_dict()
        return {k: v for k, v in sd.items()}


# ----------------------------------------------------------------------------- save / load

def _write_json(path, d):
    with open(path, "w") as f:
        json.dump(d, f, indent=2)
        f.write("\n")


def save_target(model, out_dir, gen_cfg=None, tokenizer_dir=None):
    os.makedirs(out_dir, exist_ok=True)
    sd = {k: v for k, v in model.state_dict().items() if not k.startswith("rope.")}
    if model.tied:
        sd.pop("lm_head.weight", None)
    st.save(os.path.join(out_dir, "model.safetensors"), {k: v.float().cpu() for k, v in sd.items()}, dtype="BF16")
    _write_json(os.path.join(out_dir, "config.json"), model.cfg)
    if gen_cfg is not None:
        _write_json(os.path.join(out_dir, "generation_config.json"), gen_cfg)
    if tokenizer_dir:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            with open(os.path.join(tokenizer_dir, f), "rb") as s, open(os.path.join(out_dir, f), "wb") as d:
                d.write(s.read())


def load_target(d, device="cpu"):
    cfg = json.load(open(os.path.join(d, "config.json")))
    m = Qwen3LM(cfg)
    w = st.load(os.path.join(d, "model.safetensors"))
    missing, unexpected = m.load_state_dict(w, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and m.tied)]
    assert not missing and not unexpected, (missing, unexpected)
    return m.to(device)


def save_drafter(drafter, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    sd = {k: v for k, v in drafter.state_dict().items() if not k.startswith("rope.")}
    st.save(os.path.join(out_dir, "model.safetensors"), {k: v.float().cpu() for k, v in sd.items()}, dtype="BF16")
    _write_json(os.path.join(out_dir, "config.json"), drafter.cfg)


def param_bytes(n, dtype_bytes=2):
    return n * dtype_bytes


def budget(V, H, L_t, nH, nKV, hd, I, L_d, m, r, tied=True, zlab_layers=0, tokenizer_bytes=600_000):
    """Bytes (BF16) of the shipped set; returns a dict (README table)."""
    layer = H * nH * hd + 2 * H * nKV * hd + nH * hd * H + 2 * hd + 2 * H + 3 * H * I
    emb = V * H
    target = L_t * layer + emb * (1 if tied else 2) + H
    draft_core = m * H * H + H + L_d * layer + H
    dflash = draft_core + 2 * emb
    dspark = dflash + 2 * V * r + (H + r + 1)
    zl = (m * H * H + 2 * H + zlab_layers * layer) if zlab_layers else 0
    b = {k: 2 * v for k, v in dict(layer=layer, target=target, dflash=dflash, dspark=dspark, zlab=zl).items()}
    b["tokenizer"] = tokenizer_bytes
    b["total"] = b["target"] + b["dflash"] + b["dspark"] + b["zlab"] + tokenizer_bytes
    return b


if __name__ == "__main__":
    # python3 dsmodel.py  -> prints the byte budget of the proposed sizes
    for name, kw in [("small (proposed)", dict(V=8192, H=320, L_t=8, nH=6, nKV=2, hd=64, I=896, L_d=2, m=4, r=64,
                                              zlab_layers=1)),
                     ("alt H=384 L_t=6 L_d=1", dict(V=8192, H=384, L_t=6, nH=6, nKV=2, hd=64, I=1024, L_d=1, m=4,
                                                    r=64, zlab_layers=1)),
                     ("alt untied target", dict(V=8192, H=320, L_t=8, nH=6, nKV=2, hd=64, I=896, L_d=2, m=4, r=64,
                                                tied=False))]:
        b = budget(**kw)
        print(name, {k: f"{v/1e6:.2f} MB" for k, v in b.items()})

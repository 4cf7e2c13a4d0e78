#!/usr/bin/env python3
"""Writes a random-weight DeepSeek-V4 checkpoint (config.json + model.safetensors) for speed
measurements on machines without torch or numpy (pure Python, standard library only).

The default shape is DeepSeek-V4-Flash's architecture scaled down to fit a small CPU:
Flash's layer schedule (2 sliding layers, then CSA/HCA alternating, rates 4/128, window 128),
3 hash-routed MoE layers, mHC with 4 streams, YaRN compress RoPE, 1/8 partial rotary, FP-free
BF16 matrices. Values are a tiled pool of N(0, 1/fan_in) BF16 numbers (random-looking, finite,
cheap to produce); they are NOT meaningful weights, only the byte traffic and the arithmetic are.

With --dspark-stages S (Flash: 3) it also writes a DSpark drafter in the checkpoint's own
layout (mtp.{s}.* under the original DeepSeek names: full V4 blocks with sliding attention and
learned-routing MoE, mtp.0.main_proj/main_norm, the last stage's norm, hc_head, Markov and
confidence heads) and the dspark_* config fields (block 5, the last three layers as targets).

Usage: python3 tools/reference/make_random_deepseek_v4.py OUT_DIR [--layers 8] [--hidden 1024] ...
Then: dsinfer generate --model-path OUT_DIR --prompt-ids 1,2,3 --max-tokens 64 --json
      (with --dspark-stages: ... --spec dspark --spec-schedule fixed)
"""
import argparse
import json
import math
import os
import random
import struct


def bf16_pool(n, std, rng):
    out = bytearray(2 * n)
    for i in range(n):
        f = struct.pack("<f", rng.gauss(0.0, std))
        out[2 * i:2 * i + 2] = f[2:4]  # truncate to BF16 (fine for random data)
    return bytes(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--q-lora", type=int, default=256)
    ap.add_argument("--o-groups", type=int, default=4)
    ap.add_argument("--o-lora", type=int, default=256)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--moe-inter", type=int, default=256)
    ap.add_argument("--index-heads", type=int, default=8)
    ap.add_argument("--index-head-dim", type=int, default=64)
    ap.add_argument("--index-topk", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dspark-stages", type=int, default=0)
    ap.add_argument("--dspark-block", type=int, default=5)
    ap.add_argument("--markov-rank", type=int, default=64)
    ap.add_argument("--quant", action="store_true",
                    help="store the attention, compressor, indexer and shared-expert matrices as FP8 E4M3 with "
                         "128x128 E8M0 scales and the routed experts as FP4 E2M1 with per-32 scales (per-expert "
                         "w1/w2/w3 tensors), as DeepSeek-V4-Flash ships them; embeddings, head, router and mHC stay BF16")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    os.makedirs(a.out, exist_ok=True)
    L, D, V, H, d = a.layers, a.hidden, a.vocab, a.heads, a.head_dim
    ratios = [0, 0] + [4 if i % 2 == 0 else 128 for i in range(L - 2)] + [4]  # Flash rule, + the MTP entry
    cfg = dict(architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4", vocab_size=V, hidden_size=D,
               num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=1, head_dim=d,
               qk_rope_head_dim=d // 8, q_lora_rank=a.q_lora, o_groups=a.o_groups, o_lora_rank=a.o_lora,
               n_routed_experts=a.experts, num_experts_per_tok=a.top_k, moe_intermediate_size=a.moe_inter,
               n_shared_experts=1, routed_scaling_factor=1.5, swiglu_limit=10.0, scoring_func="sqrtsoftplus",
               sliding_window=128, index_n_heads=a.index_heads, index_head_dim=a.index_head_dim,
               index_topk=a.index_topk, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
               rope_theta=10000.0, compress_rope_theta=160000.0, compress_ratios=ratios, num_hash_layers=3,
               max_position_embeddings=1048576, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
               rope_scaling=dict(type="yarn", factor=16.0, original_max_position_embeddings=65536,
                                 beta_fast=32, beta_slow=1), torch_dtype="bfloat16")
    if a.dspark_stages > 0:
        cfg.update(dspark_block_size=a.dspark_block, dspark_noise_token_id=2,
                   dspark_target_layer_ids=list(range(max(0, L - 3), L)), dspark_markov_rank=a.markov_rank)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)

    pools = {}

    def pool_for(fan_in):
        if fan_in not in pools:
            pools[fan_in] = bf16_pool(1 << 16, 1.0 / math.sqrt(fan_in), rng)
        return pools[fan_in]

    tensors = []  # (name, dtype, shape, producer)

    def mat(name, rows, cols, fan_in=None):
        def fill(n_bytes, fi=fan_in or cols):
            p = pool_for(fi)
            start = 2 * rng.randrange(len(p) // 2)
            rep = (p[start:] + p) * (n_bytes // len(p) + 2)
            return rep[:n_bytes]
        tensors.append((name, "BF16", [rows, cols], lambda n=rows * cols * 2, f=fill: f(n)))

    byte_pools = {}

    def byte_pool(kind):
        # Random code bytes; FP8 avoids the two NaN codes (0x7f, 0xff). Every FP4 nibble is a number.
        if kind not in byte_pools:
            raw = bytearray(rng.getrandbits(8) for _ in range(1 << 16))
            if kind == "fp8":
                for i, b in enumerate(raw):
                    if b & 0x7f == 0x7f:
                        raw[i] = b - 1
            byte_pools[kind] = bytes(raw)
        return byte_pools[kind]

    def tiled(pool, n_bytes):
        start = rng.randrange(len(pool))
        return ((pool[start:] + pool) * (n_bytes // len(pool) + 2))[:n_bytes]

    def qmat(name, rows, cols, fp4=False):
        """A block-quantized matrix: codes + E8M0 scales chosen so weights are ~1/sqrt(cols)."""
        if not a.quant:
            return mat(name, rows, cols)
        if fp4:
            assert cols % 32 == 0, name
            code_shape, scale_shape = [rows, cols // 2], [rows, cols // 32]
            exp = 127 - 2 - round(math.log2(math.sqrt(cols)))  # E2M1 values average ~2
        else:
            code_shape, scale_shape = [rows, cols], [(rows + 127) // 128, (cols + 127) // 128]
            exp = 127 - 6 - round(math.log2(math.sqrt(cols)))  # random E4M3 codes average ~2^6 in magnitude
        kind = "fp4" if fp4 else "fp8"
        tensors.append((name, "U8", code_shape, lambda n=math.prod(code_shape), k=kind: tiled(byte_pool(k), n)))
        tensors.append((name + "_scale_inv", "U8", scale_shape, lambda n=math.prod(scale_shape), e=exp: bytes([e]) * n))

    def vec(name, shape, values):
        tensors.append((name, "F32", shape, lambda v=values: struct.pack("<%df" % len(v), *v)))

    def ones(n, jitter=0.1):
        return [1.0 + jitter * rng.gauss(0, 1) for _ in range(n)]

    nhc, M, E, K, I = 4, 24, a.experts, a.top_k, a.moe_inter
    mat("model.embed_tokens.weight", V, D, fan_in=1)
    mat("lm_head.weight", V, D)
    vec("model.norm.weight", [D], ones(D))
    mat("model.hc_head.hc_fn", nhc, nhc * D)
    vec("model.hc_head.hc_base", [nhc], [0.5 * rng.gauss(0, 1) for _ in range(nhc)])
    vec("model.hc_head.hc_scale", [1], [1.0])
    for i in range(L):
        p = f"model.layers.{i}."
        for site in ("attn_hc", "ffn_hc"):
            mat(p + site + ".fn", M, nhc * D)
            vec(p + site + ".base", [M], [0.5 * rng.gauss(0, 1) for _ in range(M)])
            vec(p + site + ".scale", [3], [0.5 + rng.random() for _ in range(3)])
        vec(p + "input_layernorm.weight", [D], ones(D))
        vec(p + "post_attention_layernorm.weight", [D], ones(D))
        s = p + "self_attn."
        qmat(s + "q_a_proj.weight", a.q_lora, D)
        vec(s + "q_a_norm.weight", [a.q_lora], ones(a.q_lora))
        qmat(s + "q_b_proj.weight", H * d, a.q_lora)
        qmat(s + "kv_proj.weight", d, D)
        vec(s + "kv_norm.weight", [d], ones(d))
        qmat(s + "o_a_proj.weight", a.o_groups * a.o_lora, H * d // a.o_groups)
        qmat(s + "o_b_proj.weight", D, a.o_groups * a.o_lora)
        vec(s + "sinks", [H], [rng.gauss(0, 1) for _ in range(H)])
        r = ratios[i]
        if r:
            w = 2 * d if r == 4 else d
            c = s + "compressor."
            qmat(c + "kv_proj.weight", w, D)
            qmat(c + "gate_proj.weight", w, D)
            vec(c + "position_bias", [r, w], [0.5 * rng.gauss(0, 1) for _ in range(r * w)])
            vec(c + "kv_norm.weight", [d], ones(d))
            if r == 4:
                x, dI, HI = c + "indexer.", a.index_head_dim, a.index_heads
                qmat(x + "kv_proj.weight", 2 * dI, D)
                qmat(x + "gate_proj.weight", 2 * dI, D)
                vec(x + "position_bias", [r, 2 * dI], [0.5 * rng.gauss(0, 1) for _ in range(r * 2 * dI)])
                vec(x + "kv_norm.weight", [dI], ones(dI))
                qmat(x + "q_b_proj.weight", HI * dI, a.q_lora)
                mat(x + "scorer.weights_proj.weight", HI, D)
        m = p + "mlp."
        mat(m + "gate.weight", E, D)
        if i < 3:
            ids = []
            for _ in range(V):
                ids += rng.sample(range(E), K)
            tensors.append((m + "gate.tid2eid", "I64", [V, K], lambda v=ids: struct.pack("<%dq" % len(v), *v)))
        else:
            vec(m + "gate.e_score_correction_bias", [E], [0.1 * rng.gauss(0, 1) for _ in range(E)])
        if a.quant:
            for e in range(E):
                qmat(m + f"experts.{e}.w1.weight", I, D, fp4=True)
                qmat(m + f"experts.{e}.w3.weight", I, D, fp4=True)
                qmat(m + f"experts.{e}.w2.weight", D, I, fp4=True)
        else:
            tensors.append((m + "experts.gate_up_proj", "BF16", [E, 2 * I, D],
                            lambda n=E * 2 * I * D * 2: (pool_for(D) * (n // len(pool_for(D)) + 1))[:n]))
            tensors.append((m + "experts.down_proj", "BF16", [E, D, I],
                            lambda n=E * D * I * 2: (pool_for(I) * (n // len(pool_for(I)) + 1))[:n]))
        qmat(m + "shared_experts.gate_proj.weight", I, D)
        qmat(m + "shared_experts.up_proj.weight", I, D)
        qmat(m + "shared_experts.down_proj.weight", D, I)

    R = a.markov_rank
    for st in range(a.dspark_stages):
        p = f"mtp.{st}."
        for site in ("hc_attn_", "hc_ffn_"):
            mat(p + site + "fn", M, nhc * D)
            vec(p + site + "base", [M], [0.5 * rng.gauss(0, 1) for _ in range(M)])
            vec(p + site + "scale", [3], [0.5 + rng.random() for _ in range(3)])
        vec(p + "attn_norm.weight", [D], ones(D))
        vec(p + "ffn_norm.weight", [D], ones(D))
        mat(p + "attn.wq_a.weight", a.q_lora, D)
        vec(p + "attn.q_norm.weight", [a.q_lora], ones(a.q_lora))
        mat(p + "attn.wq_b.weight", H * d, a.q_lora)
        mat(p + "attn.wkv.weight", d, D)
        vec(p + "attn.kv_norm.weight", [d], ones(d))
        mat(p + "attn.wo_a.weight", a.o_groups * a.o_lora, H * d // a.o_groups)
        mat(p + "attn.wo_b.weight", D, a.o_groups * a.o_lora)
        vec(p + "attn.attn_sink", [H], [rng.gauss(0, 1) for _ in range(H)])
        mat(p + "ffn.gate.weight", E, D)
        vec(p + "ffn.gate.bias", [E], [0.1 * rng.gauss(0, 1) for _ in range(E)])
        for e in range(E):
            mat(p + f"ffn.experts.{e}.w1.weight", I, D)
            mat(p + f"ffn.experts.{e}.w3.weight", I, D)
            mat(p + f"ffn.experts.{e}.w2.weight", D, I)
        mat(p + "ffn.shared_experts.w1.weight", I, D)
        mat(p + "ffn.shared_experts.w3.weight", I, D)
        mat(p + "ffn.shared_experts.w2.weight", D, I)
        if st == 0:
            mat(p + "main_proj.weight", D, min(3, L) * D)
            vec(p + "main_norm.weight", [D], ones(D))
        if st == a.dspark_stages - 1:
            vec(p + "norm.weight", [D], ones(D))
            mat(p + "hc_head_fn", nhc, nhc * D)
            vec(p + "hc_head_base", [nhc], [0.5 * rng.gauss(0, 1) for _ in range(nhc)])
            vec(p + "hc_head_scale", [1], [1.0])
            mat(p + "markov_head.markov_w1.weight", V, R, fan_in=1)
            mat(p + "markov_head.markov_w2.weight", V, R)
            mat(p + "confidence_head.proj.weight", 1, D + R)

    size = {"BF16": 2, "F32": 4, "I64": 8, "U8": 1}
    header, off = {}, 0
    for name, dt, shape, _ in tensors:
        n = size[dt] * math.prod(shape)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, dt, shape, produce in tensors:
            b = produce()
            assert len(b) == size[dt] * math.prod(shape), name
            f.write(b)
    print(f"wrote {a.out}: {len(tensors)} tensors, {off / 2**30:.3f} GiB, compress_ratios {ratios}")


if __name__ == "__main__":
    main()

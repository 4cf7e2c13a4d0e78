#!/usr/bin/env python3
"""Writes a random-weight DSpark drafter (DeepSpec "Qwen3DSparkModel" dialect: one or more
draft layers, Markov head, confidence head, its own embedding and LM head) shaped for a
given Qwen3 target directory, for benchmarks only (bench-engine --synthetic-acceptance-rate
on a random-weight target: the drafts are never the target's, acceptance is drawn at random).

  python3 scripts/make_random_dspark.py TARGET_DIR OUT_DIR [--block-size 8] [--layers 1]

Data flow: TARGET_DIR/config.json gives hidden size, vocabulary, heads and layer count; the
drafter copies them (hidden_size and vocab_size must match the target, drafter_loader.cpp
checks), picks target_layer_ids spread over the target's layers, and writes config.json and
one model.safetensors of BF16 tensors. Matrices are tiles of one seeded pool of N(0, 0.02)
values (each tensor from its own offset), norms are ones: cheap to write at 4B size, and the
drafter's cost per pass (what the benchmark measures) does not depend on the values. The
embedding and LM head are byte copies of the target's (its embedding for a tied LM head),
as in DeepSpec training (frozen copies): dsinfer's drafter then shares the target's, and with
the target on the GPU runs its LM head there (spec/deepspec_drafter.h).
Python standard library only.
"""
import argparse
import json
import os
import random
import struct


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("out")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--markov-rank", type=int, default=64)
    a = ap.parse_args()
    t = json.load(open(os.path.join(a.target, "config.json")))
    H, V, L = t["hidden_size"], t["vocab_size"], t["num_hidden_layers"]
    nh, nkv = t["num_attention_heads"], t["num_key_value_heads"]
    hd = t.get("head_dim", H // nh)
    inter = t["intermediate_size"]
    ids = sorted({1, L // 4, L // 2, 3 * L // 4, L - 3})
    R = a.markov_rank
    shapes = {
        "embed_tokens.weight": [V, H],
        "lm_head.weight": [V, H],
        "fc.weight": [H, H * len(ids)],
        "hidden_norm.weight": [H],
        "norm.weight": [H],
        "markov_head.markov_w1.weight": [V, R],
        "markov_head.markov_w2.weight": [V, R],
        "confidence_head.proj.weight": [1, H + R],
        "confidence_head.proj.bias": [1],
    }
    for i in range(a.layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": [H],
            p + "post_attention_layernorm.weight": [H],
            p + "self_attn.q_proj.weight": [nh * hd, H],
            p + "self_attn.k_proj.weight": [nkv * hd, H],
            p + "self_attn.v_proj.weight": [nkv * hd, H],
            p + "self_attn.o_proj.weight": [H, nh * hd],
            p + "self_attn.q_norm.weight": [hd],
            p + "self_attn.k_norm.weight": [hd],
            p + "mlp.gate_proj.weight": [inter, H],
            p + "mlp.up_proj.weight": [inter, H],
            p + "mlp.down_proj.weight": [H, inter],
        })
    cfg = {
        "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "vocab_size": V, "hidden_act": "silu",
        "rms_norm_eps": t.get("rms_norm_eps", 1e-6), "attention_bias": False, "rope_theta": t.get("rope_theta", 1e6),
        "rope_scaling": None, "max_position_embeddings": t.get("max_position_embeddings", 40960),
        "tie_word_embeddings": False, "use_sliding_window": False, "torch_dtype": "bfloat16",
        "eos_token_id": t.get("eos_token_id"), "hidden_size": H, "num_hidden_layers": a.layers,
        "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": hd, "intermediate_size": inter,
        "layer_types": ["full_attention"] * a.layers, "num_target_layers": L, "block_size": a.block_size,
        "mask_token_id": V - 1, "target_layer_ids": ids, "enable_confidence_head": True, "markov_rank": R,
        "confidence_head_with_markov": True, "markov_head_type": "vanilla", "dsinfer_context_window": 512,
    }
    os.makedirs(a.out, exist_ok=True)
    json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=1)

    # The target's embedding bytes (BF16), from model.safetensors or the shard the index names.
    def target_tensor(name):
        index = os.path.join(a.target, "model.safetensors.index.json")
        fname = json.load(open(index))["weight_map"][name] if os.path.exists(index) else "model.safetensors"
        with open(os.path.join(a.target, fname), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            h = json.loads(f.read(n))[name]
            if h["dtype"] != "BF16" or h["shape"] != [V, H]:
                raise SystemExit(f"{a.target}: tensor {name}: expected BF16 [{V}, {H}], got {h['dtype']} {h['shape']}")
            b, e = h["data_offsets"]
            f.seek(8 + n + b)
            return f.read(e - b)
    copies = {"embed_tokens.weight": target_tensor("model.embed_tokens.weight")}
    tied = t.get("tie_word_embeddings", False)
    copies["lm_head.weight"] = copies["embed_tokens.weight"] if tied else target_tensor("lm_head.weight")

    rng = random.Random(0)
    f32 = struct.pack(f"<{1 << 20}f", *(rng.gauss(0.0, 0.02) for _ in range(1 << 20)))
    words = struct.unpack(f"<{1 << 20}I", f32)
    pool = struct.pack(f"<{1 << 20}H", *(((w + 0x8000) >> 16) & 0xFFFF for w in words))  # BF16 bytes
    def numel(shape):
        n = 1
        for d in shape:
            n *= d
        return n
    header, off = {}, 0
    for name in sorted(shapes):
        n = numel(shapes[name])
        header[name] = {"dtype": "BF16", "shape": shapes[name], "data_offsets": [off, off + 2 * n]}
        off += 2 * n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for k, name in enumerate(sorted(shapes)):
            n = numel(shapes[name])
            if name in copies:
                f.write(copies[name])
                continue
            if name.endswith("norm.weight"):
                f.write(struct.pack("<H", 0x3F80) * n)  # 1.0
                continue
            start = 2 * ((k * 7919) % (1 << 20))
            left = 2 * n
            while left > 0:  # the pool from `start` on, repeated
                chunk = pool[start:start + left]
                f.write(chunk)
                left -= len(chunk)
                start = 0
    print(f"wrote {a.out}: DSpark drafter, hidden {H}, vocab {V}, {a.layers} layer(s), block {a.block_size}, "
          f"target layers {ids}, {off / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()

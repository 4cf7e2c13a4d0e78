#!/usr/bin/env python3
"""Write a llama.cpp GGUF (arch qwen3, BF16 matrices, F32 norms) from a dsinfer random
checkpoint (`dsinfer make-random-model --like qwen3-4b --dtype bf16 --out DIR`): the same
weights, bit for bit, so that llama.cpp's llama-bench and dsinfer's bench-model read the same
model. Such a checkpoint has no tokenizer, so convert_hf_to_gguf.py cannot convert it; the
GGUF gets llama.cpp's "no vocab" tokenizer (`tokenizer.ggml.model = none`, the vocabulary
size in `qwen3.vocab_size`), which llama-bench accepts (it feeds random token ids).

  python3 tools/bench/qwen3_random_to_gguf.py CHECKPOINT_DIR OUT.gguf --gguf-py LLAMA_CPP/gguf-py

Tensor names and layout follow llama.cpp's qwen3 loader (src/models/qwen3.cpp,
src/llama-arch.cpp) and what its convert_hf_to_gguf.py writes for Qwen3: separate
attn_q/attn_k/attn_v (no permutation: NEOX RoPE), attn_q_norm/attn_k_norm, no output.weight
when the embeddings are tied (llama.cpp then uses token_embd for the LM head).
Only the standard library and numpy (plus llama.cpp's pure-Python gguf-py) are needed.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

NAME_MAP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
ST_DTYPES = {"BF16": np.uint16, "F32": np.float32, "F16": np.float16}


def gguf_name(hf):
    if hf in NAME_MAP:
        return NAME_MAP[hf]
    parts = hf.split(".")
    if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers":
        rest = ".".join(parts[3:])
        if rest in LAYER_MAP:
            return f"blk.{int(parts[2])}.{LAYER_MAP[rest]}"
    raise SystemExit(f"unexpected tensor {hf!r}")


def read_safetensors(path):
    """Yields (name, dtype string, memory-mapped numpy array) without copying."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    base = 8 + n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info["dtype"]
        if dt not in ST_DTYPES:
            raise SystemExit(f"{path}: {name}: dtype {dt} not handled")
        begin, end = info["data_offsets"]
        count = int(np.prod(info["shape"])) if info["shape"] else 1
        arr = np.memmap(path, dtype=ST_DTYPES[dt], mode="r", offset=base + begin, shape=(count,))
        assert arr.nbytes == end - begin, name
        yield name, dt, arr.reshape(info["shape"])


def to_f32(dt, arr):
    if dt == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="directory with config.json and *.safetensors (BF16)")
    ap.add_argument("out", help="output .gguf")
    ap.add_argument("--gguf-py", default=os.environ.get("GGUF_PY", ""),
                    help="llama.cpp's gguf-py directory (else the installed gguf package)")
    args = ap.parse_args()
    if args.gguf_py:
        sys.path.insert(0, args.gguf_py)
    import gguf  # noqa: E402

    cfg = json.load(open(os.path.join(args.checkpoint, "config.json")))
    if cfg.get("model_type") != "qwen3":
        raise SystemExit(f"model_type {cfg.get('model_type')!r}: only qwen3 is handled")
    n_layer = cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    rope_theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 1e6)

    w = gguf.GGUFWriter(args.out, "qwen3")
    w.add_name("dsinfer random qwen3")
    w.add_context_length(cfg.get("max_position_embeddings", 40960))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(n_layer)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(float(rope_theta))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_tokenizer_model("none")

    files = sorted(f for f in os.listdir(args.checkpoint) if f.endswith(".safetensors"))
    if not files:
        raise SystemExit(f"{args.checkpoint}: no .safetensors")
    tensors = {}
    for f in files:
        for name, dt, arr in read_safetensors(os.path.join(args.checkpoint, f)):
            tensors[name] = (dt, arr)
    if cfg.get("tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    expected = 3 + 11 * n_layer - (1 if cfg.get("tie_word_embeddings", False) else 0)
    if len(tensors) != expected:
        raise SystemExit(f"{len(tensors)} tensors, expected {expected}")

    def key(name):  # llama.cpp's converter order: embeddings, layers in order, then the head
        g = gguf_name(name)
        if g.startswith("blk."):
            return (1, int(g.split(".")[1]), g)
        return (0 if g.startswith("token_embd") else 2, 0, g)

    nbytes = 0
    for name in sorted(tensors, key=key):
        dt, arr = tensors[name]
        g = gguf_name(name)
        if arr.ndim == 1:  # norms: F32, as convert_hf_to_gguf.py keeps 1-D tensors
            w.add_tensor(g, to_f32(dt, arr))
        elif dt == "BF16":
            w.add_tensor(g, arr, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            raise SystemExit(f"{name}: matrix dtype {dt}; expected BF16")
        nbytes += w.tensors[-1][g].nbytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out}: {len(tensors)} tensors, {nbytes / 1e9:.3f} GB of tensor data, "
          f"{n_layer} layers, hidden {cfg['hidden_size']}, ffn {cfg['intermediate_size']}, "
          f"heads {cfg['num_attention_heads']}/{cfg['num_key_value_heads']}x{head_dim}, "
          f"vocab {cfg['vocab_size']}, tied {cfg.get('tie_word_embeddings', False)}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Conformance goldens for dsinfer's DeepSeek-V4 forward, from Hugging Face transformers 5.17.

Builds tiny random DeepseekV4ForCausalLM models (../shared/docs/deepseek_v4_spec.md §6) that
together cover the three attention types (sliding window, CSA with the lightning indexer,
HCA), both MoE kinds (hash-routed and learned top-k), sqrt-softplus and sigmoid router
scores, an indexer that drops entries and one that keeps all, mHC with 4 and 2 streams,
YaRN and default compress RoPE, tied and untied heads, F32 and BF16 storage, both
checkpoint key-naming schemes, and Flash's layer schedule given the Flash way (legacy
compress_ratios, num_hash_layers, qk_rope_head_dim, rope_scaling). For each case
OUT/<case>/ gets:
  config.json          the config kwargs as given (+ model_type/architectures), which is
                       what dsinfer parses;
  config.hf_saved.json transformers' own config.to_dict() after __post_init__ (reference);
  model.safetensors    the state dict: transformers names, or the original DeepSeek names
                       (embed.weight, layers.{i}.attn.wq_a.weight, ffn.experts.{e}.w1.weight,
                       ...) when the case says so; matrices in F32 or BF16;
  golden.safetensors   F32 "logits.prefill" (one no-cache forward over the prompt),
                       "logits.decode" (a one-token prefill then one token per call through
                       the cache), "logits.chunked" (ragged chunks through the cache), each
                       [S, vocab]; I64 "input_ids" [S];
  golden.json          prompt, chunks, greedy continuation (plain argmax loop with full
                       no-cache recompute), its smallest top-1/top-2 margin, versions, and
                       the max |diff| of the cache paths against the no-cache forward.
Everything runs in float32 on the CPU with eager attention (spec §0/§5: the bf16 load of
5.17 fails, and fp32 gives exact references). BF16 cases round the weights to BF16 first and
compute in F32 with the rounded values, which is what dsinfer does with a BF16 file.

Usage (on the GPU machine: torch 2.11 + transformers 5.17):
    python3 tools/reference/gen_deepseek_v4_goldens.py --out OUT_DIR [--copy-reference]
Then copy OUT_DIR/<case>/ to tests/data/deepseek_v4/<case>/. --only a,b runs some cases;
each case has its own seeded generator, so re-running one reproduces it exactly.
"""
import argparse
import json
import os
import shutil
import sys
import traceback

import torch
import transformers

try:
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
except ImportError:  # older export lists
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4ForCausalLM
from safetensors.torch import save_file

SWA, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"

# Common small geometry: D=32, 4 heads of 16 with r=4 rotary dims, q LoRA 24, 2 output
# groups of rank 12, 8 experts (top-2) of width 16, indexer 8 heads x 8 dims.
BASE = dict(vocab_size=97, hidden_size=32, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
            partial_rotary_factor=0.25, q_lora_rank=24, o_groups=2, o_lora_rank=12,
            n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1,
            routed_scaling_factor=1.5, swiglu_limit=1.0, sliding_window=8, index_n_heads=8,
            index_head_dim=8, index_topk=3, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
            rms_norm_eps=1e-6, rope_theta=10000.0, compress_rope_theta=160000.0,
            max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1)
YARN_TINY = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64, beta_fast=32.0, beta_slow=1.0)

CASES = [
    # name, config kwargs, prompt length, store bf16, original (DeepSeek) key names, seed
    ("mixed4_f32",
     dict(BASE, num_hidden_layers=4, layer_types=[SWA, CSA, HCA, CSA],
          mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"], compress_rates={CSA: 4, HCA: 8},
          rope_parameters=YARN_TINY),
     43, False, False, 1),
    ("mixed5_bf16_tied_orignames",
     dict(BASE, num_hidden_layers=5, layer_types=[HCA, CSA, SWA, CSA, HCA],
          mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"], compress_rates={CSA: 4, HCA: 8},
          tie_word_embeddings=True, rope_parameters=YARN_TINY),
     40, True, True, 2),
    ("shape2_hc2_default_rope",
     dict(BASE, vocab_size=89, hidden_size=24, num_attention_heads=8, head_dim=16, partial_rotary_factor=0.5,
          q_lora_rank=16, o_groups=4, o_lora_rank=6, n_routed_experts=6, num_experts_per_tok=3,
          moe_intermediate_size=8, swiglu_limit=0.5, sliding_window=6, index_n_heads=8, index_head_dim=8,
          index_topk=5, hc_mult=2, hc_sinkhorn_iters=7, num_hidden_layers=5,
          layer_types=[CSA, HCA, SWA, HCA, CSA], mlp_layer_types=["hash_moe", "moe", "moe", "moe", "moe"],
          compress_rates={CSA: 4, HCA: 4}),
     50, True, False, 3),
    # sigmoid router scores, learned top-k everywhere (no hash layers), and an index_topk
    # above the number of CSA entries, so the indexer keeps every visible entry.
    ("sigmoid_router_topk_all",
     dict(BASE, num_hidden_layers=3, layer_types=[CSA, SWA, HCA], mlp_layer_types=["moe", "moe", "moe"],
          compress_rates={CSA: 4, HCA: 8}, scoring_func="sigmoid", index_topk=16, rope_parameters=YARN_TINY),
     36, False, False, 5),
    # Flash's schedule, spelled the way Flash's config.json spells it (legacy fields; 7
    # ratios for 6 layers, as Flash has 44 for 43: the extra one is the MTP layer).
    ("flash_schedule",
     dict({k: v for k, v in BASE.items() if k not in ("partial_rotary_factor",)},
          num_hidden_layers=6, compress_ratios=[0, 0, 4, 128, 4, 128, 4], num_hash_layers=3,
          qk_rope_head_dim=4, sliding_window=16, index_topk=8, max_position_embeddings=1048576,
          rope_scaling=dict(type="yarn", factor=16.0, original_max_position_embeddings=65536,
                            beta_fast=32, beta_slow=1)),
     270, True, False, 4),
]
N_GREEDY = 10


def chunks_for(n):
    """Ragged chunk sizes summing to n (spec §0 used [5, 3, 9, 1, 6, 19])."""
    out, pattern, i = [], [5, 3, 9, 1, 6, 19, 2, 33], 0
    while sum(out) < n:
        out.append(min(pattern[i % len(pattern)], n - sum(out)))
        i += 1
    return out


def randomize(model, cfg, gen):
    """Spec §6 recipe: the class defaults zero sinks/position_bias/hc base and map every token
    to expert 0, which would leave most of the model untested."""
    n_hc, D = cfg.hc_mult, cfg.hidden_size
    E, K = cfg.n_routed_experts, cfg.num_experts_per_tok
    with torch.no_grad():
        items = list(model.named_parameters()) + list(model.named_buffers())
        for name, p in items:
            if "inv_freq" in name:
                continue
            if name.endswith("tid2eid"):
                rows = [torch.randperm(E, generator=gen)[:K] for _ in range(p.shape[0])]
                p.copy_(torch.stack(rows).to(p.dtype))
                continue
            if not p.is_floating_point():
                print("  (left as is) non-float", name, tuple(p.shape), p.dtype)
                continue
            shape = p.shape
            if "norm" in name and p.dim() == 1:
                v = 1.0 + 0.1 * torch.randn(shape, generator=gen)
            elif "embed_tokens" in name:
                # A tied head reads logits off the embeddings: N(0, 1) there makes one
                # token dominate every greedy step, so keep it smaller.
                v = (0.2 if cfg.tie_word_embeddings else 1.0) * torch.randn(shape, generator=gen)
            elif name.endswith("hc_fn") or name.endswith("_hc.fn"):
                v = torch.randn(shape, generator=gen) / (n_hc * D) ** 0.5
            elif name.endswith("hc_base") or name.endswith("_hc.base"):
                v = 0.5 * torch.randn(shape, generator=gen)
            elif name.endswith("hc_scale") or name.endswith("_hc.scale"):
                v = 0.5 + torch.rand(shape, generator=gen)
            elif name.endswith("sinks"):
                v = torch.randn(shape, generator=gen)
            elif name.endswith("position_bias"):
                v = 0.5 * torch.randn(shape, generator=gen)
            elif name.endswith("e_score_correction_bias"):
                v = 0.1 * torch.randn(shape, generator=gen)
            elif p.dim() >= 2:
                v = torch.randn(shape, generator=gen) / shape[-1] ** 0.5
            else:
                print("  (unrecognised 1-D, 0.1 N(0,1))", name, tuple(shape))
                v = 0.1 * torch.randn(shape, generator=gen)
            p.copy_(v.to(p.dtype))


# transformers layer-suffix -> original DeepSeek suffix (spec §2.1, inverted).
LAYER_RENAMES = [
    ("input_layernorm.weight", "attn_norm.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("attn_hc.fn", "hc_attn_fn"), ("attn_hc.base", "hc_attn_base"), ("attn_hc.scale", "hc_attn_scale"),
    ("ffn_hc.fn", "hc_ffn_fn"), ("ffn_hc.base", "hc_ffn_base"), ("ffn_hc.scale", "hc_ffn_scale"),
    ("self_attn.sinks", "attn.attn_sink"),
    ("self_attn.q_a_proj.weight", "attn.wq_a.weight"), ("self_attn.q_a_norm.weight", "attn.q_norm.weight"),
    ("self_attn.q_b_proj.weight", "attn.wq_b.weight"), ("self_attn.kv_proj.weight", "attn.wkv.weight"),
    ("self_attn.kv_norm.weight", "attn.kv_norm.weight"), ("self_attn.o_a_proj.weight", "attn.wo_a.weight"),
    ("self_attn.o_b_proj.weight", "attn.wo_b.weight"),
    ("self_attn.compressor.indexer.kv_proj.weight", "attn.indexer.compressor.wkv.weight"),
    ("self_attn.compressor.indexer.gate_proj.weight", "attn.indexer.compressor.wgate.weight"),
    ("self_attn.compressor.indexer.kv_norm.weight", "attn.indexer.compressor.norm.weight"),
    ("self_attn.compressor.indexer.position_bias", "attn.indexer.compressor.ape"),
    ("self_attn.compressor.indexer.q_b_proj.weight", "attn.indexer.wq_b.weight"),
    ("self_attn.compressor.indexer.scorer.weights_proj.weight", "attn.indexer.weights_proj.weight"),
    ("self_attn.compressor.kv_proj.weight", "attn.compressor.wkv.weight"),
    ("self_attn.compressor.gate_proj.weight", "attn.compressor.wgate.weight"),
    ("self_attn.compressor.kv_norm.weight", "attn.compressor.norm.weight"),
    ("self_attn.compressor.position_bias", "attn.compressor.ape"),
    ("mlp.gate.weight", "ffn.gate.weight"), ("mlp.gate.e_score_correction_bias", "ffn.gate.bias"),
    ("mlp.gate.tid2eid", "ffn.gate.tid2eid"),
    ("mlp.shared_experts.gate_proj.weight", "ffn.shared_experts.w1.weight"),
    ("mlp.shared_experts.down_proj.weight", "ffn.shared_experts.w2.weight"),
    ("mlp.shared_experts.up_proj.weight", "ffn.shared_experts.w3.weight"),
]
TOP_RENAMES = {"model.embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight",
               "model.norm.weight": "norm.weight", "model.hc_head.hc_fn": "hc_head_fn",
               "model.hc_head.hc_base": "hc_head_base", "model.hc_head.hc_scale": "hc_head_scale"}


def to_original_names(sd, inter):
    out = {}
    for k, v in sd.items():
        if k in TOP_RENAMES:
            out[TOP_RENAMES[k]] = v
            continue
        assert k.startswith("model.layers."), k
        rest = k[len("model.layers."):]
        i, suffix = rest.split(".", 1)
        pre = f"layers.{i}."
        if suffix == "mlp.experts.gate_up_proj":
            for e in range(v.shape[0]):
                out[pre + f"ffn.experts.{e}.w1.weight"] = v[e, :inter].contiguous()
                out[pre + f"ffn.experts.{e}.w3.weight"] = v[e, inter:].contiguous()
            continue
        if suffix == "mlp.experts.down_proj":
            for e in range(v.shape[0]):
                out[pre + f"ffn.experts.{e}.w2.weight"] = v[e].contiguous()
            continue
        for a, b in LAYER_RENAMES:
            if suffix == a:
                out[pre + b] = v
                break
        else:
            raise KeyError("no original name for " + k)
    return out


def run_case(name, kwargs, S, bf16, orig_names, seed, out_root, verbose):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    cfg = DeepseekV4Config(attn_implementation="eager", **kwargs)
    cfg._attn_implementation = "eager"
    print(f"[{name}] layer_types={cfg.layer_types} mlp_layer_types={getattr(cfg, 'mlp_layer_types', None)} "
          f"compress_rates={getattr(cfg, 'compress_rates', None)} rope_parameters={cfg.rope_parameters} "
          f"partial_rotary_factor={getattr(cfg, 'partial_rotary_factor', None)}", flush=True)
    model = DeepseekV4ForCausalLM(cfg).eval().float()
    randomize(model, cfg, gen)
    if bf16:
        with torch.no_grad():
            for _, p in model.named_parameters():
                if p.is_floating_point() and p.dim() >= 2:
                    p.copy_(p.to(torch.bfloat16).to(torch.float32))
    if verbose:
        for k, v in model.state_dict().items():
            print("   ", k, tuple(v.shape), v.dtype)

    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if "inv_freq" not in k}
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    if bf16:
        sd = {k: (v.to(torch.bfloat16) if v.is_floating_point() and v.dim() >= 2 else v) for k, v in sd.items()}
    if orig_names:
        sd = to_original_names(sd, cfg.moe_intermediate_size)
    save_file(sd, os.path.join(out, "model.safetensors"))
    conf = dict(kwargs)
    conf.update(model_type="deepseek_v4", architectures=["DeepseekV4ForCausalLM"],
                torch_dtype="bfloat16" if bf16 else "float32")
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(conf, f, indent=1)
    try:
        with open(os.path.join(out, "config.hf_saved.json"), "w") as f:
            json.dump(cfg.to_dict(), f, indent=1, default=str)
    except Exception as ex:  # reference only
        print("  config.to_dict failed:", ex)

    V = cfg.vocab_size
    ids = torch.randint(3, V, (S,), generator=gen)
    x = ids[None, :]
    chunks = chunks_for(S)
    diffs = {}
    with torch.no_grad():
        full = model(input_ids=x, use_cache=False).logits[0].float()
        # token by token through the cache
        rows, pkv = [], None
        for t in range(S):
            o = model(input_ids=x[:, t:t + 1], past_key_values=pkv, use_cache=True)
            pkv = o.past_key_values
            rows.append(o.logits[0, -1].float())
        dec = torch.stack(rows)
        # ragged chunked prefill through the cache
        rows, pkv, at = [], None, 0
        for c in chunks:
            o = model(input_ids=x[:, at:at + c], past_key_values=pkv, use_cache=True)
            pkv = o.past_key_values
            rows.append(o.logits[0].float())
            at += c
        chk = torch.cat(rows)
        diffs = dict(decode=float((dec - full).abs().max()), chunked=float((chk - full).abs().max()),
                     max_abs_logit=float(full.abs().max()))
        print(f"  S={S} chunks={chunks} diffs={diffs}", flush=True)
        # greedy: plain argmax loop, full no-cache recompute each step
        seq, greedy, margin = ids.tolist(), [], float("inf")
        for _ in range(N_GREEDY):
            last = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].float()
            top2 = torch.topk(last, 2).values
            margin = min(margin, float(top2[0] - top2[1]))
            nxt = int(torch.argmax(last))
            greedy.append(nxt)
            seq.append(nxt)
    save_file({"logits.prefill": full.contiguous(), "logits.decode": dec.contiguous(),
               "logits.chunked": chk.contiguous(), "input_ids": ids.to(torch.int64).contiguous()},
              os.path.join(out, "golden.safetensors"))
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump({"prompt": ids.tolist(), "chunks": chunks, "greedy": greedy, "min_greedy_margin": margin,
                   "cache_path_max_abs_diff": diffs, "bf16_weights": bf16, "original_names": orig_names,
                   "seed": seed, "transformers": transformers.__version__, "torch": torch.__version__}, f)
    print(f"  greedy={greedy} margin={margin:.4g} files={sorted(os.listdir(out))}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--copy-reference", action="store_true",
                    help="also copy transformers' deepseek_v4 sources (+ rope utils) to OUT/reference_src")
    ap.add_argument("--only", default="", help="comma-separated case names")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    print("transformers", transformers.__version__, "torch", torch.__version__, flush=True)
    os.makedirs(args.out, exist_ok=True)
    if args.copy_reference:
        root = os.path.dirname(transformers.__file__)
        dst = os.path.join(args.out, "reference_src")
        os.makedirs(dst, exist_ok=True)
        for rel in ["models/deepseek_v4/modeling_deepseek_v4.py", "models/deepseek_v4/configuration_deepseek_v4.py",
                    "modeling_rope_utils.py", "conversion_mapping.py"]:
            try:
                shutil.copy(os.path.join(root, rel), dst)
            except Exception as ex:
                print("copy failed", rel, ex)
    only = set(filter(None, args.only.split(",")))
    failed = []
    for i, (name, kw, S, bf16, orig, seed) in enumerate(CASES):
        if only and name not in only:
            continue
        try:
            run_case(name, kw, S, bf16, orig, seed, args.out, verbose=(i == 0))
        except Exception:
            traceback.print_exc()
            failed.append(name)
    print("FAILED:", failed if failed else "none", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

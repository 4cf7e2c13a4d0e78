#!/usr/bin/python3
"""Writes tiny random drafter checkpoints + goldens under tests/data/drafters/<case>/.

Each case directory holds
  target/   HF-style Qwen3ForCausalLM (config.json, generation_config.json, model.safetensors)
  draft/    the drafter checkpoint in its dialect's exact layout (config.json, model.safetensors)
  golden.json, golden_tensors.safetensors   (format: tools/reference/README_drafters.md)
computed by tools/reference/drafters_ref.py (own PyTorch reference of docs/drafters_spec.md).
After writing, every case is reloaded from disk and re-checked (drafters_ref.check_case),
and the speculative greedy output is asserted equal to plain target greedy decoding.

Usage (CPU, float32, deterministic, ~1 minute):
    /usr/bin/python3 tools/reference/gen_drafter_goldens.py [OUT_ROOT]   # default tests/data/drafters
Needs Debian's python3-torch and python3-numpy only.
"""
import copy
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io as st  # noqa: E402
from drafters_ref import DraftConfig, Drafter, plain_greedy, speculative_greedy, check_case  # noqa: E402
from qwen3_ref import Qwen3Config, Qwen3Target  # noqa: E402

VOCAB = 256
MASK = VOCAB - 1
BOS, EOS, PAD = 1, 2, 0
N_OUT = 24
PROMPT_TRIES = 48
MIN_MARGIN = 0.02  # required top-1/top-2 logit gap of every greedy decision (target and draft)

# Target geometry shared by all cases unless overridden (GQA 2, heads * head_dim = 32 != hidden,
# kept small so the whole tests/data/drafters stays around 3 MB).
TARGET_BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=40, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                   rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False)

# dtype: how target/ and draft/ weights are stored (one string, or (target, draft)). BF16 weights are rounded before the
# reference runs, so the goldens are exact F32 computations on the stored values.
# near_bigram: see target_weights (gives non-trivial acceptance with random weights).
CASES = [
    # z-lab layout, explicit target_layer_ids, tied random target (the borrowed LM head is
    # the embedding), draft geometry different from the target's (nH*hd != H, GQA 4) with
    # attention biases, bs 6 -> 5 drafts. BF16 target, F32 draft. Acceptance is rare here
    # (pure random weights).
    dict(name="zlab_dflash", dialect="zlab", seed=11, block_size=6, dtype=("BF16", "F32"),
         target=dict(tie_word_embeddings=True),
         draft=dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                    intermediate_size=64, attention_bias=True),
         target_layer_ids=[0, 2]),
    # z-lab without dflash_config.target_layer_ids: default formula with L_t=7, L_d=3 ->
    # round(1 + i*1.5) = [1, 2, 4] (2.5 rounds half-to-even to 2); all keys under `model.`;
    # near-bigram target + anchor-copy draft layer 0 (MHA) so drafts get accepted. BF16.
    dict(name="zlab_dflash_default_layers", dialect="zlab", seed=12, block_size=5, dtype="BF16",
         near_bigram=True, copy=True,
         target=dict(num_hidden_layers=7, intermediate_size=32),
         draft=dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                    intermediate_size=40, attention_bias=False),
         target_layer_ids=None, model_prefix=True),
    # DeepSpec DFlash: markov_rank 0, no confidence head, -1 (embedding output) captured. BF16.
    dict(name="deepspec_dflash", dialect="deepspec", seed=13, block_size=5, dtype="BF16", near_bigram=True,
         target=dict(num_hidden_layers=5), num_draft_layers=2, target_layer_ids=[-1, 1, 3],
         markov_rank=0, confidence=False),
    # DSpark, vanilla Markov head (r 16), confidence head with the Markov feature. BF16.
    dict(name="dspark_vanilla", dialect="deepspec", seed=14, block_size=6, dtype="BF16", near_bigram=True,
         target=dict(), num_draft_layers=2, target_layer_ids=[0, 2],
         markov_rank=16, markov_head_type="vanilla", confidence=True, confidence_with_markov=True),
    # DSpark, gated Markov head, confidence head WITHOUT the Markov feature; transformers-5
    # style rope_parameters (theta 1e6) in both configs; mixed-case head type string. BF16.
    dict(name="dspark_gated", dialect="deepspec", seed=15, block_size=5, dtype="BF16", near_bigram=True,
         target=dict(rope_parameters=dict(rope_theta=1000000.0, rope_type="default")),
         num_draft_layers=2, target_layer_ids=[0, 1, 2],
         markov_rank=16, markov_head_type="Gated", confidence=True, confidence_with_markov=False),
    # DSpark, RNN Markov head (carried state), confidence head with the Markov feature.
    # BF16.
    dict(name="dspark_rnn", dialect="deepspec", seed=16, block_size=6, dtype="BF16", near_bigram=True,
         target=dict(), num_draft_layers=2, target_layer_ids=[1, 2],
         markov_rank=16, markov_head_type="rnn", confidence=True, confidence_with_markov=True),
]


# ----------------------------------------------------------------------------- configs

def target_config(overrides):
    t = dict(TARGET_BASE)
    t.update(overrides)
    cfg = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": t["vocab_size"], "hidden_size": t["hidden_size"],
        "intermediate_size": t["intermediate_size"], "num_hidden_layers": t["num_hidden_layers"],
        "num_attention_heads": t["num_attention_heads"], "num_key_value_heads": t["num_key_value_heads"],
        "head_dim": t["head_dim"], "hidden_act": "silu", "rms_norm_eps": t["rms_norm_eps"],
        "attention_bias": t["attention_bias"], "attention_dropout": 0.0,
        "tie_word_embeddings": t["tie_word_embeddings"], "max_position_embeddings": 4096,
        "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD,
        "layer_types": ["full_attention"] * t["num_hidden_layers"], "sliding_window": None,
        "use_sliding_window": False, "max_window_layers": t["num_hidden_layers"],
        "initializer_range": 0.02, "use_cache": True, "torch_dtype": "float32",
    }
    if "rope_parameters" in t:
        cfg["rope_parameters"] = dict(t["rope_parameters"])
    else:
        cfg["rope_theta"] = t["rope_theta"]
    return cfg


def zlab_draft_config(tcfg, case):
    d = case["draft"]
    cfg = {
        "architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3", "vocab_size": tcfg["vocab_size"], "hidden_size": tcfg["hidden_size"],
        "intermediate_size": d["intermediate_size"], "num_hidden_layers": d["num_hidden_layers"],
        "num_attention_heads": d["num_attention_heads"], "num_key_value_heads": d["num_key_value_heads"],
        "head_dim": d["head_dim"], "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "attention_bias": d["attention_bias"], "attention_dropout": 0.0,
        "rope_theta": tcfg.get("rope_theta", 10000.0), "rope_scaling": None,
        "max_position_embeddings": tcfg["max_position_embeddings"],
        "tie_word_embeddings": False, "bos_token_id": BOS, "eos_token_id": EOS,
        "layer_types": ["full_attention"] * d["num_hidden_layers"], "sliding_window": None,
        "use_sliding_window": False, "max_window_layers": d["num_hidden_layers"],
        "block_size": case["block_size"], "num_target_layers": tcfg["num_hidden_layers"],
        "dflash_config": {"mask_token_id": MASK}, "torch_dtype": "float32",
    }
    if case["target_layer_ids"] is not None:
        cfg["dflash_config"]["target_layer_ids"] = list(case["target_layer_ids"])
    return cfg


def deepspec_draft_config(tcfg, case):
    cfg = copy.deepcopy(tcfg)  # DeepSpec: deep copy of the target config + overrides (§2.2)
    L_d = case["num_draft_layers"]
    cfg.update({"architectures": ["Qwen3DSparkModel"], "num_target_layers": tcfg["num_hidden_layers"],
                "num_hidden_layers": L_d, "block_size": case["block_size"], "tie_word_embeddings": False,
                "layer_types": ["full_attention"] * L_d, "max_window_layers": L_d,
                "mask_token_id": MASK, "target_layer_ids": list(case["target_layer_ids"]), "num_anchors": 512,
                "enable_confidence_head": case["confidence"], "markov_rank": case["markov_rank"]})
    if case["confidence"]:
        cfg["confidence_head_with_markov"] = case["confidence_with_markov"]
    if case["markov_rank"] > 0:
        cfg["markov_head_type"] = case["markov_head_type"]
    return cfg


# ----------------------------------------------------------------------------- weights

def randn(gen, *shape):
    return torch.randn(*shape, generator=gen)


def layer_weights(gen, prefix, cfg, out_scale=2.0):
    """Spread-out random Qwen3 layer weights (same trick as gen_qwen3_goldens.randomize):
    norms 1 +- 0.2, projections ~ N(0, 1/fan_in), o/down projections x out_scale, biases 0.1."""
    H, I, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    qd, kd = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    w = {}
    for n, shape in (("input_layernorm", H), ("post_attention_layernorm", H),
                     ("self_attn.q_norm", hd), ("self_attn.k_norm", hd)):
        w[f"{prefix}{n}.weight"] = 1.0 + 0.2 * randn(gen, shape)
    for n, (o, i), scale in (("self_attn.q_proj", (qd, H), 1.0), ("self_attn.k_proj", (kd, H), 1.0),
                             ("self_attn.v_proj", (kd, H), 1.0), ("self_attn.o_proj", (H, qd), out_scale),
                             ("mlp.gate_proj", (I, H), 1.0), ("mlp.up_proj", (I, H), 1.0),
                             ("mlp.down_proj", (H, I), out_scale)):
        w[f"{prefix}{n}.weight"] = scale * randn(gen, o, i) / i ** 0.5
    if cfg.get("attention_bias"):
        for n, o in (("q_proj", qd), ("k_proj", kd), ("v_proj", kd), ("o_proj", H)):
            w[f"{prefix}self_attn.{n}.bias"] = 0.1 * randn(gen, o)
    return w


def successor_map(gen):
    """Random successor function g over ordinary tokens (never BOS/EOS/PAD/MASK)."""
    return torch.randint(3, VOCAB - 1, (VOCAB,), generator=gen)


def target_weights(gen, cfg, succ=None, copy_axis=False):
    """Random Qwen3 target. With `succ` (untied only) the target is made "near-bigram":
    large embeddings, milder layer outputs and an LM head with an extra term
    alpha * sum_{u: g(u)=v} emb_hat[u], so greedy decoding mostly follows g but still
    depends on the context. This gives the drafters something learnable to accept.
    copy_axis: every ordinary token embedding gets +8 on hidden axis 0 and the mask token
    -8 (used by the z-lab copy construction in draft_weights)."""
    V, H = cfg["vocab_size"], cfg["hidden_size"]
    tied = cfg["tie_word_embeddings"]
    # Tied heads read logits off the embeddings: keep them small there (else every token
    # predicts itself).
    emb = (0.1 if tied else (2.0 if succ is not None else 0.5)) * randn(gen, V, H)
    w = {}
    for i in range(cfg["num_hidden_layers"]):
        w.update(layer_weights(gen, f"model.layers.{i}.", cfg, out_scale=1.0 if succ is not None else 2.0))
    w["model.norm.weight"] = 1.0 + 0.2 * randn(gen, H)
    if not tied:
        head = randn(gen, V, H) / H ** 0.5 * 4.0
        if succ is not None:
            bigram = torch.zeros(V, H)
            bigram.index_add_(0, succ, emb / emb.norm(dim=1, keepdim=True))
            head = head + 6.0 * bigram
        w["lm_head.weight"] = head
    if succ is not None:
        emb[MASK] *= 0.1  # the mask token only ever feeds drafters: keep its own bigram weak
    if copy_axis:
        emb[:, 0] = 8.0
        emb[MASK, 0] = -8.0
    w["model.embed_tokens.weight"] = emb
    return w


def zlab_copy_layer(gen, w, prefix, dcfg):
    """Overwrites draft layer 0 so that every mask query attends (sharply) to the anchor and
    copies its normalized embedding into the residual: queries/keys read hidden axis 0
    (+8 for ordinary tokens, -8 for the mask) into the lowest-frequency RoPE dim of every
    head, v_proj = identity, o_proj = 3 * identity. With a near-bigram target the block
    outputs then predict ~g(anchor), so the first draft is often accepted."""
    H, hd, nh = dcfg["hidden_size"], dcfg["head_dim"], dcfg["num_attention_heads"]
    assert dcfg["num_key_value_heads"] == nh and nh * hd == H
    istar = hd // 2 - 1
    q = 0.05 * randn(gen, nh * hd, H)
    k = 0.05 * randn(gen, nh * hd, H)
    for h in range(nh):
        q[h * hd + istar, 0] = -1.0
        k[h * hd + istar, 0] = 1.0
    norm_w = 0.3 + 0.05 * randn(gen, hd)
    norm_w[istar] = 3.0
    w[prefix + "self_attn.q_proj.weight"], w[prefix + "self_attn.k_proj.weight"] = q, k
    w[prefix + "self_attn.q_norm.weight"], w[prefix + "self_attn.k_norm.weight"] = norm_w.clone(), norm_w.clone()
    w[prefix + "self_attn.v_proj.weight"] = torch.eye(H) + 0.05 * randn(gen, H, H)
    w[prefix + "self_attn.o_proj.weight"] = 3.0 * torch.eye(H) + 0.05 * randn(gen, H, H)


def unit_rows(gen, n, r):
    a = randn(gen, n, r)
    return a / a.norm(dim=1, keepdim=True)


def draft_weights(gen, dcfg, case, tw, succ=None):
    H = dcfg["hidden_size"]
    m = len(DraftConfig(dcfg).target_layer_ids)
    near = succ is not None
    w = {"fc.weight": randn(gen, H, m * H) / (m * H) ** 0.5,
         "hidden_norm.weight": 1.0 + 0.2 * randn(gen, H),
         "norm.weight": 1.0 + 0.2 * randn(gen, H)}
    for i in range(dcfg["num_hidden_layers"]):
        w.update(layer_weights(gen, f"layers.{i}.", dcfg, out_scale=1.0 if near else 2.0))
    if case.get("copy"):
        w["fc.weight"][0] = 0.0  # context never carries the copy axis
        zlab_copy_layer(gen, w, "layers.0.", dcfg)
    if case["dialect"] == "deepspec":
        # Frozen copies of the target's input embedding and output head (both from the
        # embedding matrix when the target is tied).
        emb = tw["model.embed_tokens.weight"]
        w["embed_tokens.weight"] = emb.clone()
        w["lm_head.weight"] = tw.get("lm_head.weight", emb).clone()
        r = case["markov_rank"]
        V = dcfg["vocab_size"]
        if r:
            # W1[u] ~ beta1 * a_{g(u)}, W2[v] ~ beta2 * a_v (unit a_v): the bigram bias
            # W2 W1[u] peaks at g(u), so the Markov chain of drafts tracks the target.
            a = unit_rows(gen, V, r)
            tgt = succ if near else torch.randint(3, V - 1, (V,), generator=gen)
            w["markov_head.markov_w1.weight"] = 3.0 * a[tgt] + 0.3 * randn(gen, V, r)
            w["markov_head.markov_w2.weight"] = 20.0 * a + 0.3 * randn(gen, V, r)
            t = case["markov_head_type"].lower()
            if t == "gated":
                w["markov_head.gate_proj.weight"] = randn(gen, r, H + r) / (H + r) ** 0.5
                w["markov_head.gate_proj.bias"] = 1.5 + 0.5 * randn(gen, r)
            elif t == "rnn":
                j = randn(gen, 3 * r, 2 * r + H) / (2 * r + H) ** 0.5
                j[2 * r:, r:2 * r] += torch.eye(r) * 2.0  # output chunk reads the Markov embedding
                w["markov_head.joint_proj.weight"] = j
                w["markov_head.joint_proj.bias"] = 0.3 * randn(gen, 3 * r)
        if case["confidence"]:
            width = H + (r if case["confidence_with_markov"] else 0)
            w["confidence_head.proj.weight"] = randn(gen, 1, width) / width ** 0.5
            w["confidence_head.proj.bias"] = 0.1 * randn(gen, 1)
    if case.get("model_prefix"):
        w = {"model." + k: v for k, v in w.items()}
    return w


# ----------------------------------------------------------------------------- driver

def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


def score(golden, stats):
    """Prefer prompts whose rounds show varied acceptance (rejection at the first draft, partial
    and full blocks), accept some drafts, and whose argmaxes have clear margins."""
    acc = stats["accepted"]
    n = len(golden["rounds"][0]["draft_ids"])
    kinds = len({min(a, 1) if a < n else 2 for a in acc}) + (len(set(acc)) > 2)
    margin_ok = min(stats["target_margin"], stats["draft_margin"]) >= MIN_MARGIN
    return (margin_ok, kinds, min(sum(a > 0 for a in acc), 3), min(stats["target_margin"], stats["draft_margin"], 0.5),
            -len(acc))


def build_case(case, out_root):
    gen = torch.Generator().manual_seed(1000 + case["seed"])
    tcfg = target_config(case["target"])
    succ = successor_map(gen) if case.get("near_bigram") else None
    tw = target_weights(gen, tcfg, succ, copy_axis=case.get("copy", False))
    t_dtype, d_dtype = (case["dtype"], case["dtype"]) if isinstance(case["dtype"], str) else case["dtype"]
    if t_dtype == "BF16":
        tw = {k: st.round_bf16(v) for k, v in tw.items()}
        tcfg["torch_dtype"] = "bfloat16"
    dcfg = zlab_draft_config(tcfg, case) if case["dialect"] == "zlab" else deepspec_draft_config(tcfg, case)
    dcfg["torch_dtype"] = "float32"
    dw = draft_weights(gen, dcfg, case, tw, succ)
    if d_dtype == "BF16":
        dw = {k: st.round_bf16(v) for k, v in dw.items()}
        dcfg["torch_dtype"] = "bfloat16"
    if case["dialect"] == "deepspec":  # the draft's embed/lm_head are exact copies of the stored target's
        assert torch.equal(dw["embed_tokens.weight"], tw["model.embed_tokens.weight"])
    target = Qwen3Target(Qwen3Config(tcfg), tw)
    drafter = Drafter(DraftConfig(dcfg), dw, target)

    best = None
    for _ in range(PROMPT_TRIES):
        plen = int(torch.randint(6, 13, (1,), generator=gen))
        prompt = torch.randint(3, VOCAB - 1, (plen,), generator=gen).tolist()
        golden, tensors, stats = speculative_greedy(target, drafter, prompt, N_OUT)
        if {EOS, BOS, MASK} & set(golden["greedy_output"]):
            continue
        s = score(golden, stats)
        if best is None or s > best[0]:
            best = (s, golden, tensors, stats)
    s, golden, tensors, stats = best
    assert s[0], f"{case['name']}: no prompt with greedy margins >= {MIN_MARGIN}"
    plain, plain_margin = plain_greedy(target, golden["prompt"], N_OUT)
    assert plain == golden["greedy_output"], "speculative greedy output != plain greedy decoding"

    d = os.path.join(out_root, case["name"])
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(os.path.join(d, "target"))
    os.makedirs(os.path.join(d, "draft"))
    write_json(os.path.join(d, "target", "config.json"), tcfg)
    write_json(os.path.join(d, "target", "generation_config.json"),
               {"_from_model_config": True, "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD})
    st.save(os.path.join(d, "target", "model.safetensors"), tw, t_dtype)
    write_json(os.path.join(d, "draft", "config.json"), dcfg)
    st.save(os.path.join(d, "draft", "model.safetensors"), dw, d_dtype)
    golden["min_greedy_margin"] = min(stats["target_margin"], plain_margin)
    golden["min_draft_margin"] = stats["draft_margin"]
    write_json(os.path.join(d, "golden.json"), golden)
    st.save(os.path.join(d, "golden_tensors.safetensors"), tensors)
    worst = check_case(d)
    nbytes = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
    return dict(name=case["name"], accepted=stats["accepted"], rounds=len(golden["rounds"]),
                target_margin=min(stats["target_margin"], plain_margin), draft_margin=stats["draft_margin"],
                recheck_rel_err=worst, bytes=nbytes, layer_ids=golden["target_layer_ids"])


def main():
    torch.set_num_threads(1)
    here = os.path.dirname(os.path.abspath(__file__))
    out_root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "tests", "data", "drafters")
    os.makedirs(out_root, exist_ok=True)
    total = 0
    for case in CASES:
        r = build_case(case, out_root)
        total += r["bytes"]
        print(f"{r['name']}: layers={r['layer_ids']} rounds={r['rounds']} accepted={r['accepted']} "
              f"min_target_margin={r['target_margin']:.4g} min_draft_margin={r['draft_margin']:.4g} "
              f"recheck={r['recheck_rel_err']:.2g} size={r['bytes'] / 1024:.0f}KiB")
    print(f"total {total / 1024:.0f} KiB")


if __name__ == "__main__":
    main()

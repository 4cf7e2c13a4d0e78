#!/usr/bin/env python3
"""Conformance goldens for dsinfer's Qwen3 forward, from Hugging Face transformers.

Builds tiny random Qwen3ForCausalLM models in several shapes (tied/untied embeddings,
GQA ratios 1/2/4, head_dim != hidden/heads, attention bias, YaRN RoPE, BF16-stored
weights), saves each with save_pretrained, and records, for fixed prompts:
  - golden_logits.safetensors: F32 `logits.<i>` [len(prompt_i), vocab], every position;
  - golden.json: {"prompts": [...], "greedy": [...32 ids each...], "min_greedy_margin": m}
    where greedy is a plain full-recompute argmax loop (no KV cache, no generate()).
Runs on CPU in float32 with eager attention so the numbers are exact references.
Usage (on the GPU machine, which has transformers 5.17):
    python3 tools/reference/gen_qwen3_goldens.py OUT_DIR
Then copy OUT_DIR/<case>/ to tests/data/qwen3/<case>/.
"""
import copy
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

CASES = [
    # name, config overrides, store_bf16
    ("tied_gqa2", dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True), False),
    ("untied_gqa4_hd32", dict(vocab_size=384, hidden_size=96, intermediate_size=192, num_hidden_layers=3,
                              num_attention_heads=8, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False), False),
    ("mha_bias_hd24", dict(vocab_size=320, hidden_size=80, intermediate_size=136, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=4, head_dim=24, attention_bias=True,
                           tie_word_embeddings=False), False),
    ("yarn_gqa3", dict(vocab_size=256, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=6, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
                       max_position_embeddings=512,
                       rope_parameters=dict(rope_type="yarn", rope_theta=50000.0, factor=4.0,
                                            original_max_position_embeddings=128)), False),
    ("bf16_weights", dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=1, head_dim=16, tie_word_embeddings=False), True),
]
PROMPT_LENGTHS = [1, 5, 17, 40]
N_GREEDY = 32


def randomize(model, gen):
    """Spread-out random weights so greedy argmaxes have clear margins."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1:  # biases
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                # Tied heads read logits off the embeddings: a large embedding would make
                # every token predict itself, so keep it small there.
                std = 0.1 if model.config.tie_word_embeddings else 0.5
                p.copy_(std * torch.randn(p.shape, generator=gen))
            elif "o_proj" in name or "down_proj" in name:
                p.copy_(2.0 * torch.randn(p.shape, generator=gen) / (p.shape[1] ** 0.5))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / (p.shape[1] ** 0.5))


def main(out_root):
    torch.manual_seed(0)
    print("transformers", transformers.__version__, "torch", torch.__version__)
    for case_idx, (name, overrides, bf16) in enumerate(CASES):
        gen = torch.Generator().manual_seed(1000 + case_idx)
        cfg = Qwen3Config(rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                          attn_implementation="eager", **overrides)
        model = Qwen3ForCausalLM(cfg).eval()
        randomize(model, gen)
        if bf16:
            # Round the parameters (not buffers: the rotary inv_freq stays F32, as when
            # transformers loads a BF16 checkpoint) to BF16; the reference then computes
            # in F32 with those rounded weights, which is what dsinfer does with BF16 files.
            with torch.no_grad():
                for prm in model.parameters():
                    prm.copy_(prm.to(torch.bfloat16).to(torch.float32))
        out = os.path.join(out_root, name)
        os.makedirs(out, exist_ok=True)
        if bf16:
            # Save a BF16 copy; the F32 model (and its F32 rotary buffers) stays untouched.
            copy.deepcopy(model).to(torch.bfloat16).save_pretrained(out)
        else:
            model.save_pretrained(out)
        vocab = cfg.vocab_size
        prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
        tensors, greedy, min_margin = {}, [], float("inf")
        with torch.no_grad():
            for i, pr in enumerate(prompts):
                logits = model(torch.tensor([pr])).logits[0].float()
                tensors[f"logits.{i}"] = logits.contiguous()
                seq = list(pr)
                cont = []
                for _ in range(N_GREEDY):
                    last = model(torch.tensor([seq])).logits[0, -1].float()
                    top2 = torch.topk(last, 2).values
                    min_margin = min(min_margin, float(top2[0] - top2[1]))
                    nxt = int(torch.argmax(last))
                    cont.append(nxt)
                    seq.append(nxt)
                greedy.append(cont)
        save_file(tensors, os.path.join(out, "golden_logits.safetensors"))
        with open(os.path.join(out, "golden.json"), "w") as f:
            json.dump({"prompts": prompts, "greedy": greedy, "min_greedy_margin": min_margin,
                       "transformers": transformers.__version__, "torch": torch.__version__}, f)
        files = sorted(os.listdir(out))
        distinct = [len(set(g)) for g in greedy]
        print(f"{name}: files={files} min_greedy_margin={min_margin:.4g} distinct_greedy={distinct}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "qwen3_goldens")

#!/usr/bin/env python3
"""Batch-1 greedy decode speed of PyTorch/transformers on a GPU, for comparison with
`dsinfer bench-model --device cuda` on the same checkpoint (docs/PERFORMANCE.md, CUDA).

Usage: hf_generate_bench.py MODEL_DIR [PROMPT_TOKENS] [DECODE_TOKENS]
Prints one JSON object. Decode tokens/s = (DECODE_TOKENS - 1) / (t(prefill + DECODE_TOKENS)
- t(prefill + 1)): the prefill and first token are subtracted out. Prompt ids are pseudo-random
from a fixed seed; generation is forced to DECODE_TOKENS (min_new_tokens, no eos stop).
Two variants: the default dynamic cache (eager), and a static cache with torch.compile when
it works on this machine (reported as null otherwise).
"""
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def timed_generate(model, ids, n, **kw):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None,
                   pad_token_id=0, **kw)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def decode_tps(model, ids, n, reps=3, **kw):
    timed_generate(model, ids, 8, **kw)  # warm-up (kernels, compile)
    best = None
    for _ in range(reps):
        t1 = timed_generate(model, ids, 1, **kw)
        tn = timed_generate(model, ids, n, **kw)
        tps = (n - 1) / (tn - t1)
        best = tps if best is None else max(best, tps)
    return best


def main():
    model_dir = sys.argv[1]
    prompt_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    load_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt_tokens), generator=g).cuda()
    out = {"model_dir": model_dir, "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
           "prompt_tokens": prompt_tokens, "decode_tokens": n, "load_s": load_s,
           "attn_implementation": getattr(model.config, "_attn_implementation", None)}
    with torch.inference_mode():
        out["eager_dynamic_cache_tokens_per_s"] = decode_tps(model, ids, n)
        try:
            out["static_cache_compiled_tokens_per_s"] = decode_tps(
                model, ids, n, reps=2, cache_implementation="static", compile_config=None)
        except Exception as e:  # report, do not fail the run
            out["static_cache_compiled_tokens_per_s"] = None
            out["static_cache_error"] = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
    import transformers
    out["transformers"] = transformers.__version__
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

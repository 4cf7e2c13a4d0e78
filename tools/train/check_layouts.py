#!/usr/bin/env python3
"""Proves that what the trainers write is what inference runs:
  1. target: our training module (dsmodel.Qwen3LM) vs tools/reference/qwen3_ref.py logits;
  2. each drafter dir: the training-time forward (block mask, anchor a, context < a) vs the
     inference reference tools/reference/drafters_ref.py (first greedy round after the prompt),
     and vs `dsinfer debug-dflash --json` (dialect, kind, draft ids, draft log-probs).

  /usr/bin/python3 tools/train/check_layouts.py --target T_DIR --drafters D1 [D2 ...] \
      [--dsinfer build/dsinfer] [--prompt-ids 1,2,3,4,5]
Exit status 1 on any mismatch.
"""
import argparse
import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dsmodel  # noqa: E402
import drafters_ref  # noqa: E402  (path set up by dsmodel)
import qwen3_ref  # noqa: E402
import safetensors_io as st  # noqa: E402


def load_drafter(d, target):
    cfg = json.load(open(os.path.join(d, "config.json")))
    dialect = "deepspec" if cfg["architectures"][0] == "Qwen3DSparkModel" else "zlab"
    m = dsmodel.BlockDrafter(cfg, dialect)
    w = st.load(os.path.join(d, "model.safetensors"))
    missing, unexpected = m.load_state_dict(w, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    if dialect == "zlab":
        m.share_target(target)
    return m.eval(), cfg, dialect


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafters", nargs="+", required=True)
    ap.add_argument("--dsinfer", default=os.path.join(HERE, "..", "..", "build", "dsinfer"))
    ap.add_argument("--prompt-ids", default="1,2,3,4,5")
    ap.add_argument("--tol", type=float, default=2e-3)
    a = ap.parse_args()
    ok = True
    prompt = [int(v) for v in a.prompt_ids.split(",")]
    tgt = dsmodel.load_target(a.target).float().eval()
    ref_t = qwen3_ref.Qwen3Target.load(a.target)
    with torch.no_grad():
        ours = tgt(torch.tensor([prompt]))[0][0]
    rl, hs = ref_t.forward(prompt)
    e = float((ours - rl).abs().max())
    print(f"target: max|dlogit| ours vs qwen3_ref = {e:.3g}")
    ok &= e < a.tol
    anchor = int(rl[-1].argmax())
    seq = prompt + [anchor]
    for dd in a.drafters:
        m, cfg, dialect = load_drafter(dd, tgt)
        ids = m.layer_ids
        # training-time forward at anchor a = len(prompt) (context = prompt positions only)
        with torch.no_grad():
            hn, feats = tgt(torch.tensor([seq]), capture=ids, return_hidden=True)
            blk = torch.full((1, 1, m.bs), m.mask_id)
            blk[0, 0, 0] = anchor
            hb = m.backbone(feats, blk, torch.tensor([[len(prompt)]]))[0]
            # several blocks in one call (training layout): blocks must not see each other
            blk2 = torch.full((1, 2, m.bs), m.mask_id)
            blk2[0, 0, 0], blk2[0, 1, 0] = seq[2], anchor
            hb2 = m.backbone(feats, blk2, torch.tensor([[2, len(prompt)]]))[0][m.bs:]
            e_multi = float((hb2 - hb).abs().max())
        # inference reference
        rd = drafters_ref.Drafter.load(dd, ref_t)
        cache = drafters_ref.DraftCache(rd.cfg)
        ctx = ref_t.features(hs, rd.cfg.target_layer_ids)
        hr = rd.backbone(cache, ctx, [anchor] + [rd.cfg.mask_token_id] * (m.bs - 1), len(prompt))
        eb = float((hb - hr).abs().max())
        # greedy drafts through our heads (sequential for the Markov head) vs the reference loop
        g, _, _ = drafters_ref.speculative_greedy(ref_t, rd, prompt, 2)
        r0 = g["rounds"][0]
        rows = hb[1:] if dialect == "zlab" else hb
        drafts, lps, prev = [], [], anchor
        with torch.no_grad():
            for k in range(rows.shape[0]):
                lg, _ = m.heads(rows[k:k + 1][None], torch.tensor([[prev]]))
                x = int(lg[0, 0].argmax())
                lps.append(float(torch.log_softmax(lg[0, 0], -1)[x]))
                drafts.append(x)
                prev = x
        out = subprocess.run([a.dsinfer, "debug-dflash", "--model-path", a.target, "--draft-model-path", dd,
                              "--prompt-ids", a.prompt_ids, "--json", "--threads", "1",
                              "--matmul-precision", "f32"],  # the reference computes in F32
                             capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{dd}: dsinfer failed: {out.stderr.strip()[:300]}")
            ok = False
            continue
        dj = json.loads(out.stdout)
        dl = max(abs(x - y) for x, y in zip(lps, dj["draft_logprobs"]))
        good = (eb < a.tol and e_multi < 1e-5 and drafts == r0["draft_ids"] == dj["draft_ids"] and dl < 5e-3
                and dj["anchor"] == anchor)
        print(f"{dd}: {dialect}/{dj['kind']} bs={dj['block_size']} layer_ids={dj['target_layer_ids']} "
              f"mask={dj['mask_token_id']} | backbone train-vs-ref max|d|={eb:.3g} (2 blocks in one call: {e_multi:.2g}) | drafts ours={drafts} "
              f"ref={r0['draft_ids']} dsinfer={dj['draft_ids']} | max|dlogprob| vs dsinfer={dl:.3g} "
              f"-> {'OK' if good else 'MISMATCH'}")
        ok &= good
    print("check_layouts:", "OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

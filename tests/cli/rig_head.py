#!/usr/bin/python3
"""Rig a synthetic checkpoint's lm_head so that greedy decoding picks a chosen id first.

    rig_head.py CKPT_DIR --ids 1,2,3 --token ID:OUT_DIR [--token ID:OUT_DIR ...] [--logit 60]

The final normalised hidden state o at the prompt's last position is computed by the
independent reference (tests/ref/k3ref.py, float64); lm_head row ID becomes
o * LOGIT / |o|^2 (BF16), so that row's logit there is about LOGIT while every other
row keeps its synthetic logit (std ~3).  Everything else is copied unchanged; one copy
per --token.
"""
import argparse, os, shutil, struct, sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
sys.path.insert(0, HERE)
import k3ref  # noqa: E402
import st_tool  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--ids", required=True)
    ap.add_argument("--token", action="append", required=True, help="ID:OUT_DIR")
    ap.add_argument("--logit", type=float, default=60.0)
    a = ap.parse_args()
    ids = [int(x) for x in a.ids.split(",")]
    model = k3ref.load_model(a.ckpt)
    E = model.cfg.hidden
    model.lm_head = np.eye(E)                 # the "logits" become o itself
    o = k3ref.forward(model, ids)[-1]
    row = (o * (a.logit / float(o @ o))).astype(np.float32)
    bf16 = (row.view(np.uint32) + 0x7FFF + ((row.view(np.uint32) >> 16) & 1)) >> 16   # round to nearest even
    for spec in a.token:
        tok, out = spec.split(":", 1)
        rig(a.ckpt, out, int(tok), bf16, E)


def rig(ckpt, out, token, bf16, E):
    shutil.copytree(ckpt, out)
    files, _ = st_tool.shard_files(out)
    name = "language_model.lm_head.weight"
    for fn in files:
        path = os.path.join(out, fn)
        hdr, data = st_tool.load_all(path)
        if name not in hdr:
            continue
        assert hdr[name]["dtype"] == "BF16" and hdr[name]["shape"][1] == E
        b = bytearray(data[name])
        b[token * E * 2:(token + 1) * E * 2] = bf16.astype("<u2").tobytes()
        data[name] = bytes(b)
        names = [k for k in hdr if k != "__metadata__"]
        st_tool.write_file(path, hdr, data, order=sorted(names, key=lambda k: hdr[k]["data_offsets"][0]))
        return
    raise SystemExit("no lm_head in " + ckpt)


if __name__ == "__main__":
    main()

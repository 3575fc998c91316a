#!/usr/bin/python3
"""Every tensor of a checkpoint, read back from a KPK file with `kpack cat`,
equals the source bytes.  usage: cat_compare.py KPACK CKPT_DIR FILE.kpk"""
import json, os, struct, subprocess, sys

kpack, ckpt, kpk = sys.argv[1:4]
idx = os.path.join(ckpt, "model.safetensors.index.json")
files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
n_ok = n_bad = n_dropped = 0
bad = []
for fn in files:
    path = os.path.join(ckpt, fn)
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        for name, v in sorted(hdr.items()):
            if name == "__metadata__":
                continue
            a, b = v["data_offsets"]
            f.seek(8 + n + a)
            want = f.read(b - a)
            r = subprocess.run([kpack, "cat", kpk, name], capture_output=True)
            if name.startswith(("vision_tower.", "mm_projector.")):
                n_dropped += r.returncode == 2
                continue
            if r.returncode == 0 and r.stdout == want:
                n_ok += 1
            else:
                n_bad += 1
                bad.append(name)
for small in ("config.json", "tiktoken.model", "tokenizer_config.json"):
    p = os.path.join(ckpt, small)
    if os.path.exists(p):
        r = subprocess.run([kpack, "cat", kpk, "meta/" + small], capture_output=True)
        if r.returncode == 0 and r.stdout == open(p, "rb").read():
            n_ok += 1
        else:
            n_bad += 1
            bad.append("meta/" + small)
for name in bad[:10]:
    print("# differs:", name)
print(("ok" if n_bad == 0 and n_ok > 0 else "not ok") +
      f" - kpack cat: {n_ok} tensors and files equal the source bytes, {n_bad} differ ({n_dropped} dropped vision tensors absent)")
sys.exit(1 if n_bad else 0)

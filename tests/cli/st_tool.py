#!/usr/bin/python3
"""Independent safetensors helper for the CLI tests (stdlib only).

  st_tool.py list FILE                      name dtype shape begin end (absolute), one per line
  st_tool.py bytes FILE NAME                the tensor's bytes to stdout
  st_tool.py mutate SRC_DIR DST_DIR KIND [ARG]
        copy a checkpoint directory and break it in one way:
        truncate | header-len | bad-json | offset-range | overlap | dtype | shape |
        drop NAME | extra | config-drop KEY | metadata JSON (the header's __metadata__) |
        add NAME (a BF16 [4] tensor of that name) | config-set KEY JSON (at the root)
  st_tool.py scale DIR SUBSTR LOG2          multiply every BF16 tensor whose name contains SUBSTR
        by 2^LOG2, in place (exact: only the exponents change; refuses what would leave
        the normal range)
"""
import json, os, shutil, struct, sys


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    return n, hdr


def write_file(path, hdr, data_by_name, order=None):
    """Write a safetensors file with tensors packed in `order` (default: header order)."""
    names = order or [k for k in hdr if k != "__metadata__"]
    out_hdr, blobs, at = {}, [], 0
    for k in names:
        b = data_by_name[k]
        e = dict(hdr[k])
        e["data_offsets"] = [at, at + len(b)]
        out_hdr[k] = e
        blobs.append(b)
        at += len(b)
    js = json.dumps(out_hdr, separators=(",", ":")).encode()
    js += b" " * ((8 - len(js) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)))
        f.write(js)
        for b in blobs:
            f.write(b)


def rewrite_header(path, n, hdr):
    """Replace the header (n bytes long now) by hdr, keeping the data bytes."""
    js = json.dumps(hdr, separators=(",", ":")).encode()
    js += b" " * ((8 - len(js) % 8) % 8)
    body = open(path, "rb").read()[8 + n:]
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js + body)


def load_all(path):
    n, hdr = read_header(path)
    data = {}
    with open(path, "rb") as f:
        for k, v in hdr.items():
            if k == "__metadata__":
                continue
            a, b = v["data_offsets"]
            f.seek(8 + n + a)
            data[k] = f.read(b - a)
    return hdr, data


def shard_files(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        wm = json.load(open(idx))["weight_map"]
        return sorted(set(wm.values())), wm
    return ["model.safetensors"], None


def first_shard_with(d, pred):
    files, _ = shard_files(d)
    for fn in files:
        _, hdr = read_header(os.path.join(d, fn))
        for k in sorted(hdr):
            if k != "__metadata__" and pred(k, hdr[k]):
                return fn, k
    raise SystemExit("no tensor matches")


def mutate(src, dst, kind, arg):
    shutil.copytree(src, dst, symlinks=False)
    files, wm = shard_files(dst)
    if kind == "config-set":
        p = os.path.join(dst, "config.json")
        cfg = json.load(open(p))
        key, val = arg.split("=", 1)
        cfg[key] = json.loads(val)
        json.dump(cfg, open(p, "w"), indent=1)
        return
    if kind == "config-drop":
        p = os.path.join(dst, "config.json")
        cfg = json.load(open(p))
        for scope in (cfg, cfg.get("text_config", {}), cfg.get("text_config", {}).get("linear_attn_config", {})):
            scope.pop(arg, None)
        json.dump(cfg, open(p, "w"), indent=1)
        return
    fn = files[-1] if kind != "drop" else None
    if kind == "drop":
        fn = wm[arg] if wm else files[0]
    path = os.path.join(dst, fn)
    n, hdr = read_header(path)
    if kind == "truncate":
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size - 1000)
    elif kind == "header-len":
        with open(path, "r+b") as f:
            f.write(struct.pack("<Q", os.path.getsize(path) * 2))
    elif kind == "bad-json":
        with open(path, "r+b") as f:
            f.seek(8)
            f.write(b"{\"x\":}")
    else:
        hdr, data = load_all(path)
        names = [k for k in hdr if k != "__metadata__"]
        if kind == "offset-range":
            # rewrite the header in place so the last tensor points past the data
            k = max(names, key=lambda k: hdr[k]["data_offsets"][1])
            a, b = hdr[k]["data_offsets"]
            hdr[k]["data_offsets"] = [a + 4096, b + 4096]
            rewrite_header(path, n, hdr)
            return
        if kind == "overlap":
            ks = sorted(names, key=lambda k: hdr[k]["data_offsets"][0])
            a0, b0 = hdr[ks[0]]["data_offsets"]
            a1, b1 = hdr[ks[1]]["data_offsets"]
            ln = b1 - a1
            hdr[ks[1]]["data_offsets"] = [a0, a0 + ln] if ln <= b0 - a0 else [a1 - 2, b1 - 2]
            rewrite_header(path, n, hdr)
            return
        if kind == "metadata":
            rewrite_header(path, n, dict([("__metadata__", json.loads(arg))] + [(k, hdr[k]) for k in names]))
            return
        if kind == "dtype":
            # a BF16 matrix relabelled F16 would be legal; U8 with the same bytes is not
            k = next(k for k in sorted(names) if hdr[k]["dtype"] == "BF16" and len(hdr[k]["shape"]) == 2)
            hdr[k]["dtype"] = "U8"
            hdr[k]["shape"] = [hdr[k]["shape"][0], hdr[k]["shape"][1] * 2]
        elif kind == "shape":
            k = next(k for k in sorted(names) if len(hdr[k]["shape"]) == 2 and hdr[k]["shape"][0] > 1)
            r, c = hdr[k]["shape"]
            hdr[k]["shape"] = [c, r] if r != c else [r * 2, c // 2]
        elif kind == "drop":
            del hdr[arg]
            del data[arg]
            if wm:
                idx = os.path.join(dst, "model.safetensors.index.json")
                j = json.load(open(idx))
                del j["weight_map"][arg]
                json.dump(j, open(idx, "w"))
        elif kind == "add":
            hdr[arg] = {"dtype": "BF16", "shape": [4]}
            data[arg] = b"\0" * 8
        elif kind == "extra":
            hdr["language_model.model.layers.0.self_attn.bogus.weight"] = {"dtype": "F32", "shape": [4]}
            data["language_model.model.layers.0.self_attn.bogus.weight"] = b"\0" * 16
            if wm:
                idx = os.path.join(dst, "model.safetensors.index.json")
                j = json.load(open(idx))
                j["weight_map"]["language_model.model.layers.0.self_attn.bogus.weight"] = fn
                json.dump(j, open(idx, "w"))
        else:
            raise SystemExit("unknown mutation " + kind)
        write_file(path, hdr, data)


def scale(d, substr, log2):
    files, _ = shard_files(d)
    hit = 0
    for fn in files:
        path = os.path.join(d, fn)
        hdr, data = load_all(path)
        names = [k for k in hdr if k != "__metadata__"]
        touched = False
        for k in names:
            if substr not in k or hdr[k]["dtype"] != "BF16":
                continue
            b = bytearray(data[k])
            for i in range(0, len(b), 2):
                v = b[i] | (b[i + 1] << 8)
                e = (v >> 7) & 0xFF
                if e == 0:
                    continue                      # a zero (or subnormal) stays as it is
                e2 = e + log2
                if not 0 < e2 < 255:
                    raise SystemExit("scale: %s leaves the normal range" % k)
                v = (v & 0x807F) | (e2 << 7)
                b[i], b[i + 1] = v & 0xFF, v >> 8
            data[k] = bytes(b)
            touched = True
            hit += 1
        if touched:
            write_file(path, hdr, data, order=sorted(names, key=lambda k: hdr[k]["data_offsets"][0]))
    if not hit:
        raise SystemExit("scale: no BF16 tensor name contains " + substr)


def main():
    cmd = sys.argv[1]
    if cmd == "list":
        n, hdr = read_header(sys.argv[2])
        for k in sorted(hdr):
            if k == "__metadata__":
                continue
            v = hdr[k]
            a, b = v["data_offsets"]
            print(k, v["dtype"], ",".join(map(str, v["shape"])), 8 + n + a, 8 + n + b)
    elif cmd == "bytes":
        n, hdr = read_header(sys.argv[2])
        a, b = hdr[sys.argv[3]]["data_offsets"]
        with open(sys.argv[2], "rb") as f:
            f.seek(8 + n + a)
            sys.stdout.buffer.write(f.read(b - a))
    elif cmd == "scale":
        scale(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif cmd == "mutate":
        mutate(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else None)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()

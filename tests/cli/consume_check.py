"""Checks for `kpack convert --consume` (tests/cli/test_kpack_consume.sh, tests/soak/soak.py),
from outside the program: what the reference KPK file (an uninterrupted conversion, read by the
independent reader tests/ref/kpk.py) and the source index say, against what kpack did.

  consume_check.py trace REF.kpk SRC_INDEX TRACE OUT_DIR
      TRACE is the fault shim's I/O trace (KFAULT_TRACE) of one --consume run (one output file,
      extents stored plain).  Every shard deleted exactly once; each deletion comes after every
      byte written to the partial file, the journal and the consume log so far was synced
      (fdatasync begun after the write, done before the deletion), after the journal durably
      records the shard's last extent and after the output's directory was synced; and before any
      byte of a later extent was written (the shard goes as soon as it can).
  consume_check.py killed REF.kpk SRC_INDEX OUT.kpk SHARD
      A run killed just before deleting SHARD (still there): the journal records every extent
      that reads it, and those extents' bytes in OUT.kpk.partial are the reference's, byte for
      byte; OUT.kpk.consumed holds its record.
  consume_check.py peak DIR... -- CMD...
      Run CMD, sampling the blocks allocated under the DIRs (as du counts them) every
      millisecond or two; prints "base PEAK_EXTRA end" in bytes; exit status CMD's."""
import json
import os
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import kpk  # noqa: E402

JOURNAL_HEADER, RECORD = 64, 56


def shard_extents(ref, index):
    """{shard name: (its release point: the last extent that reads it from its file, archive extent)}."""
    wm = json.load(open(index))["weight_map"]
    reads, archive = {}, {}
    for i, x in enumerate(ref.extents):
        for t in ref.tensors[x["first_tensor"]:x["first_tensor"] + x["tensor_count"]]:
            name = t["name"]
            if name.startswith("archive/shards/"):
                shard = name[len("archive/shards/"):].split("/")[0]
                if name.endswith("/header"):
                    archive[shard] = i
                continue
            if name in wm and x["kind"] != 5:
                reads.setdefault(wm[name], set()).add(i)
    return {s: (max(reads[s]) if s in reads else a, a) for s, a in archive.items()}


def parse_trace(path):
    ev = []
    for line in open(path):
        p = line.split()
        ev.append((p[0], p[1], [int(v) for v in p[2:] if v.lstrip("-").isdigit()]))
    return ev


def trace(ref_path, index, trace_path, out_dir):
    ref = kpk.load(ref_path)
    rp = shard_extents(ref, index)
    ev = parse_trace(trace_path)
    out_dir = os.path.realpath(out_dir)
    bad, deleted = [], []
    writes = {}          # path -> [seq of each write]
    synced = {}          # path -> [(begin seq, done seq)]
    begun = {}
    ends = {}            # path -> max end written so far
    jdurable = 0
    jwrites = []
    dir_synced = False
    for seq, (call, path, args) in enumerate(ev):
        if call in ("pwrite", "write"):
            writes.setdefault(path, []).append(seq)
            if call == "pwrite":
                ends[path] = max(ends.get(path, 0), args[0] + args[1])
                if path.endswith(".journal"):
                    jwrites.append((seq, args[0] + args[1]))
        elif call in ("fdatasync", "fsync"):
            begun[path] = seq
        elif call in ("fdatasync-done", "fsync-done"):
            synced.setdefault(path, []).append((begun[path], seq))
            if path.endswith(".journal"):
                jdurable = max([jdurable] + [e for s, e in jwrites if s < begun[path]])
            if os.path.realpath(path) == out_dir:
                dir_synced = True
        elif call == "unlink" and path.endswith(".safetensors"):
            name = os.path.basename(path)
            deleted.append(name)
            if name not in rp:
                bad.append("%s deleted but it is no shard of the plan" % name)
                continue
            last, _ = rp[name]
            for f, ws in writes.items():
                if not any(f.endswith(s) for s in (".partial", ".journal", ".consumed")):
                    continue
                done_before = [b for b, d in synced.get(f, []) if d < seq]
                if ws and (not done_before or max(done_before) < ws[-1]):
                    bad.append("%s deleted while %s had unsynced writes" % (name, os.path.basename(f)))
            if jdurable < JOURNAL_HEADER + RECORD * (last + 1):
                bad.append("%s deleted while the journal durably held %d bytes, short of its last extent %d's record"
                           % (name, jdurable, last))
            if not dir_synced:
                bad.append("%s deleted before the output's directory was synced" % name)
            x = ref.extents[last]
            end = kpk.round_up(x["offset"] + x["stored_len"], ref.sb["align"])
            part = [f for f in ends if f.endswith(".partial")]
            if part and ends[part[0]] > end:
                bad.append("%s deleted only after bytes past its last extent %d were written (up to %d, extent ends %d)"
                           % (name, last, ends[part[0]], end))
    if sorted(deleted) != sorted(rp):
        bad.append("deleted %s, the plan has %s" % (sorted(deleted), sorted(rp)))
    order = sorted(rp, key=lambda s: rp[s][0])
    if deleted != order and sorted(deleted) == sorted(rp):
        bad.append("deleted in the order %s, release points give %s" % (deleted, order))
    for b in bad[:10]:
        print("BAD:", b)
    print("%d deletions traced against %d I/O calls: %s" % (len(deleted), len(ev), "all as they must be" if not bad else "%d problems" % len(bad)))
    return 1 if bad else 0


def killed(ref_path, index, out, shard):
    ref = kpk.load(ref_path)
    rp = shard_extents(ref, index)
    last, _ = rp[shard]
    j = open(out + ".journal", "rb").read()
    n, at = 0, JOURNAL_HEADER
    while at + RECORD <= len(j) and struct.unpack_from("<I", j, at)[0] == 0x4A45504B and struct.unpack_from("<I", j, at + 4)[0] == n:
        nb = struct.unpack_from("<I", j, at + 12)[0]
        at += RECORD + 48 * nb
        n += 1
    bad = []
    if n <= last:
        bad.append("the journal records %d extents; %s's last is extent %d" % (n, shard, last))
    part = open(out + ".partial", "rb").read()
    for i in range(min(n, last + 1)):
        x = ref.extents[i]
        if part[x["offset"]:x["offset"] + x["stored_len"]] != ref.images[0][x["offset"]:x["offset"] + x["stored_len"]]:
            bad.append("extent %d in the partial file differs from the reference" % i)
    if shard.encode() not in open(out + ".consumed", "rb").read():
        bad.append("the consume log has no record of %s" % shard)
    for b in bad:
        print("BAD:", b)
    return 1 if bad else 0


def peak(dirs, cmd):
    def alloc():
        n = 0
        for d in dirs:
            for root, _, files in os.walk(d):
                for f in files:
                    try:
                        n += os.lstat(os.path.join(root, f)).st_blocks * 512
                    except FileNotFoundError:
                        pass
        return n
    base = alloc()
    top = [base]
    stop = []

    def sample():
        while not stop:
            top[0] = max(top[0], alloc())
            time.sleep(0.001)
    t = threading.Thread(target=sample)
    t.start()
    rc = subprocess.call(cmd)
    stop.append(1)
    t.join()
    print(base, top[0] - base, alloc())
    return rc


if __name__ == "__main__":
    a = sys.argv
    if a[1] == "trace":
        sys.exit(trace(*a[2:6]))
    if a[1] == "killed":
        sys.exit(killed(*a[2:6]))
    if a[1] == "peak":
        k = a.index("--")
        sys.exit(peak(a[2:k], a[k + 1:]))
    sys.exit(__doc__)

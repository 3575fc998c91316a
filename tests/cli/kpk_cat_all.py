#!/usr/bin/python3
"""Every tensor of OTHER.kpk, read with `kpack cat`, equals the same tensor of
REF.kpk read by the independent Python reader (tests/ref/kpk.py), and both
files hold the same tensor names.  Prints one TAP line.
usage: kpk_cat_all.py KPACK REF.kpk OTHER.kpk LABEL"""
import os, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import kpk  # noqa: E402

kpack, ref, other, label = sys.argv[1:5]
try:
    a = kpk.load(ref)
    names = [t["name"] for t in a.tensors]
    b = kpk.load(other)
except kpk.KpkError as e:
    print("not ok - %s: %s" % (label, e))
    sys.exit(0)
if sorted(names) != sorted(t["name"] for t in b.tensors):
    print("not ok - %s: the tensor names differ" % label)
    sys.exit(0)
raws = {}


def want(name):
    t = a.tensor(name)
    if t["extent"] not in raws:
        raws[t["extent"]] = a.raw(t["extent"])
    return raws[t["extent"]][t["offset"]:t["offset"] + t["nbytes"]]


expected = {n: want(n) for n in names}


def cat(name):
    r = subprocess.run([kpack, "cat", other, name], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return name, r.returncode, r.stdout, r.stderr


bad = []
with ThreadPoolExecutor(max_workers=2) as ex:
    for name, rc, out, err in ex.map(cat, names):
        if rc != 0 or out != expected[name]:
            bad.append("%s (exit %d%s)" % (name, rc, ": " + err.decode(errors="replace").strip() if rc else ", bytes differ"))
if bad:
    print("not ok - %s: %d of %d tensors differ through kpack cat: %s" % (label, len(bad), len(names), "; ".join(bad[:3])))
else:
    print("ok - %s: all %d tensors identical through kpack cat" % (label, len(names)))

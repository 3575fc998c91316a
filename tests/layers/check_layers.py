#!/usr/bin/env python3
"""make check-layers: every #include of the sources against the written layer rules.

The rules are run/LAYERS (read by this script; docs/RUNTIME.md shows them):

  FOLDER: FOLDERS      a layer of run/ and the folders it may use
  public: FOLDERS      the top layers: they see only what their rules list,
                       the rest is hidden from them, even through the
                       headers they include

Checked, for every .c and .h of format/, pack/ and run/:
  - an include names its folder ("format/kpk.h", "run/store/store.h"), or is a
    file of the including file's own folder ("store_internal.h");
  - format/ includes only format/; pack/ only pack/ and format/; run/ never
    pack/; a folder of run/ includes only itself, the folders its rule lists
    and format/;
  - what a file of a public layer (cli, serve) includes does not include,
    at any depth, a header of a folder its rules do not list;
  - the rules themselves have no cycle, and neither do the includes between
    folders;
  - with --objects BUILD: every call between folders (an undefined symbol of
    one object that another defines, nm) goes the way the rules allow, and the
    calls make no cycle between folders (tests/layers/callgraph.py).
Prints one line per violation (FILE:LINE: what, the rule) and exits 1; prints
nothing and exits 0 when the tree keeps the rules.

  tests/layers/check_layers.py [--root DIR] [--objects BUILD] [--list]
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import callgraph  # noqa: E402  (tests/layers/callgraph.py: the call graph and its cycles)

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def read_rules(path):
    uses, public = {}, set()
    for n, raw in enumerate(open(path), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, _, rest = line.partition(":")
        key, words = key.strip(), rest.split()
        if not _ or not key:
            sys.exit(f"{path}:{n}: expected 'folder: folders it may use'")
        if key == "public":
            public |= set(words)
        else:
            uses[key] = set(words)
    for f, us in uses.items():
        for u in us:
            if u not in uses:
                sys.exit(f"{path}: {f} uses {u}, which has no rule")
    for p in public:
        if p not in uses:
            sys.exit(f"{path}: public: {p} has no rule")
    return uses, public


def cycles(nodes, edges):
    """The strongly connected components that hold a cycle (callgraph.sccs)."""
    return [c for c in callgraph.sccs(nodes, edges) if len(c) > 1 or c[0] in edges.get(c[0], ())]


def sources(root):
    for top in ("format", "pack", "run"):
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs.sort()
            for f in sorted(files):
                if f.endswith((".c", ".h")):
                    yield os.path.relpath(os.path.join(d, f), root)


def allowed(src, dst, uses):
    """(ok, the rule) for a use of folder dst by folder src (layer_of names)."""
    if dst == src:
        return True, ""
    if src == "format":
        return False, "format/ uses nothing but itself"
    if src == "pack":
        return dst == "format", "pack/ uses only format/"
    if dst == "pack":
        return False, "nothing in run/ uses pack/"
    if dst == "format":
        return True, ""
    return dst in uses.get(src, ()), f"{src} uses only {' '.join(sorted(uses.get(src, ()))) or 'itself'} (run/LAYERS)"


def layer_of(path):
    """'format', 'pack', or the folder of run/ ('run/store/x.c' -> 'store'); None for a file of run/ itself."""
    parts = path.split(os.sep)
    if parts[0] != "run":
        return parts[0]
    return parts[1] if len(parts) > 2 else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap.add_argument("--objects", metavar="BUILD", help="also check the calls between the objects built there")
    ap.add_argument("--list", action="store_true", help="the folders and their files")
    a = ap.parse_args()
    root = os.path.normpath(a.root)
    rules_path = os.path.join(root, "run", "LAYERS")
    uses, public = read_rules(rules_path)
    bad = []

    for c in cycles(set(uses), uses):
        bad.append(f"run/LAYERS: the rules have a cycle: {' '.join(c)}")

    files = list(sources(root))
    includes = {}                       # file -> [(line, resolved path)]
    for f in files:
        here = os.path.dirname(f)
        inc = []
        for n, line in enumerate(open(os.path.join(root, f), errors="replace"), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            name = m.group(1)
            if "/" in name:
                target = os.path.normpath(name)
                if name.startswith(".") or not os.path.isfile(os.path.join(root, target)):
                    bad.append(f"{f}:{n}: #include \"{name}\": no such file from the top of the tree "
                               "(includes name the folder from the top: \"run/store/store.h\")")
                    continue
            else:
                target = os.path.join(here, name)
                if not os.path.isfile(os.path.join(root, target)):
                    bad.append(f"{f}:{n}: #include \"{name}\" names no folder and is not in {here}/ "
                               "(name its folder: \"format/{0}\", \"run/FOLDER/{0}\")".format(name))
                    continue
            inc.append((n, target))
        includes[f] = inc

    layers = {}
    for f in files:
        src = layer_of(f)
        if f.startswith("run" + os.sep):
            if src is None:
                bad.append(f"{f}: a file of run/ itself: every file of run/ is in the folder of its layer (run/LAYERS)")
                continue
            if src not in uses:
                bad.append(f"{f}: run/{src}/ is no layer of run/LAYERS")
                continue
        layers.setdefault(src, []).append(f)
        for n, target in includes[f]:
            ok, why = allowed(src, layer_of(target), uses)
            if not ok:
                bad.append(f"{f}:{n}: includes {target}: {why}")

    # what the public-facing folders see, through every header they include
    visible = public.union(*(uses[p] for p in public))
    hidden = set(uses) - visible
    for f in files:
        src = layer_of(f)
        if f.split(os.sep)[0] != "run" or src not in public:
            continue
        seen, todo, via = set(), [t for _, t in includes.get(f, [])], {}
        for t in todo:
            via[t] = f
        while todo:
            h = todo.pop()
            if h in seen:
                continue
            seen.add(h)
            if h.split(os.sep)[0] == "run" and layer_of(h) in hidden:
                bad.append(f"{f}: sees {h} (through {via[h]}): {src} sees only {' '.join(sorted(visible))} and format/ "
                           "(run/LAYERS: public)")
                continue
            for _, t in includes.get(h, []):
                if t not in seen:
                    via.setdefault(t, h)
                    todo.append(t)

    # no cycle between folders through the includes
    fedges = {}
    for f in files:
        for _, t in includes[f]:
            s, d = layer_of(f), layer_of(t)
            if s and d and s != d:
                fedges.setdefault(s, set()).add(d)
    for c in cycles(set(fedges) | {d for v in fedges.values() for d in v}, fedges):
        bad.append(f"the includes make a cycle between folders: {' '.join(c)}")

    # the calls between the objects: only downward, and no cycle between folders
    if a.objects:
        nodes, label = callgraph.call_edges(a.objects, ["format", "pack", "run"], root)
        if not any(n.startswith("run" + os.sep) for n in nodes):
            bad.append(f"{a.objects}: no objects of run/ to check the calls of (build first)")
        cedges = {}
        for (f, g), syms in sorted(label.items()):
            s_, d_ = layer_of(f), layer_of(g)
            if s_ is None or d_ is None or s_ == d_:
                continue
            cedges.setdefault(s_, set()).add(d_)
            ok, why = allowed(s_, d_, uses)
            if not ok:
                bad.append(f"{f}: calls {g} ({' '.join(sorted(syms)[:4])}): {why}")
        for c in cycles(set(cedges) | {d for v in cedges.values() for d in v}, cedges):
            bad.append(f"the calls make a cycle between folders: {' '.join(c)}")

    if a.list:
        for l in sorted(layers, key=str):
            print(f"{l}: {' '.join(os.path.basename(x) for x in layers[l])}")
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

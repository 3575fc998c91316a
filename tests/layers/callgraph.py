#!/usr/bin/env python3
"""The call graph between krun's source files, from the objects' symbol tables.

Every object defines symbols (nm: T, D, B, R, ...) and uses others (U); a use
of a symbol another object defines is an edge from the using file to the
defining one.  Prints the strongly connected components with more than one
file (call cycles), largest first, and, with --folders, the same at the level
of folders (a cycle between folders breaks the layering).

  tests/layers/callgraph.py [--build DIR] [--folders] [--edges] [--json]

Exit status: 0, or 1 when --fail-on-folder-cycle is given and folders form a cycle."""
import argparse, json, os, subprocess, sys
from collections import defaultdict


def symbols(obj):
    out = subprocess.run(["nm", "-P", obj], capture_output=True, text=True, check=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            used.add(name)
        elif kind in "TDBRVWGS" or kind in "tdbr" and False:
            defined.add(name)
    return defined, used


def sccs(nodes, edges):
    """Tarjan, iterative.  edges: node -> set of nodes."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]; counter[0] += 1
        stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]; counter[0] += 1
                    stack.append(nxt); on.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--src", default="run")
    ap.add_argument("--folders", action="store_true")
    ap.add_argument("--edges", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--fail-on-folder-cycle", action="store_true")
    a = ap.parse_args()
    objdir = os.path.join(a.build, a.src)
    objs = []
    for d, _, files in os.walk(objdir):
        objs += [os.path.join(d, f) for f in files if f.endswith(".o")]
    if not objs:
        sys.exit(f"no objects under {objdir}: build first")
    defs, uses = {}, {}
    for o in sorted(objs):
        src = os.path.relpath(o, a.build)[:-2] + ".c"
        defs[src], uses[src] = symbols(o)
    owner = {}
    for f, ds in defs.items():
        for s in ds:
            owner.setdefault(s, f)
    edges = defaultdict(set)
    label = defaultdict(set)
    for f, us in uses.items():
        for s in us:
            g = owner.get(s)
            if g and g != f:
                edges[f].add(g)
                label[(f, g)].add(s)
    nodes = set(defs)
    res = {"files": len(nodes), "file_cycles": [c for c in sccs(nodes, edges) if len(c) > 1]}
    res["file_cycles"].sort(key=len, reverse=True)
    fold = lambda f: os.path.dirname(f)
    fedges = defaultdict(set)
    for f, gs in edges.items():
        for g in gs:
            if fold(f) != fold(g):
                fedges[fold(f)].add(fold(g))
    fnodes = {fold(f) for f in nodes}
    res["folder_cycles"] = sorted([c for c in sccs(fnodes, fedges) if len(c) > 1], key=len, reverse=True)
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"{res['files']} files; call cycles between files: {len(res['file_cycles'])}")
        for c in res["file_cycles"]:
            print(f"  {len(c)} files: {' '.join(os.path.relpath(x, a.src) for x in c)}")
            if a.edges:
                for f in c:
                    for g in sorted(edges[f]):
                        if g in c:
                            print(f"    {f} -> {g}: {' '.join(sorted(label[(f, g)])[:6])}")
        if a.folders:
            print(f"{len(fnodes)} folders; call cycles between folders: {len(res['folder_cycles'])}")
            for c in res["folder_cycles"]:
                print(f"  {' '.join(c)}")
                for f in c:
                    for g in sorted(fedges[f]):
                        if g in c:
                            ex = sorted((x, y) for (x, y) in label if fold(x) == f and fold(y) == g)
                            print(f"    {f} -> {g}: e.g. {ex[0][0]} -> {ex[0][1]}")
    if a.fail_on_folder_cycle and res["folder_cycles"]:
        sys.exit(1)


if __name__ == "__main__":
    main()

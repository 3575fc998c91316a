#!/usr/bin/env python3
"""The call graph between source files, from the objects' symbol tables.

Every object defines symbols (nm: T, D, B, R, ...) and uses others (U); a use
of a symbol another object defines is an edge from the using file to the
defining one.  Prints the call cycles (strongly connected components of more
than one file), largest first, and with --folders the cycles between folders.
An object whose source file is gone (a stale build) is left out.

  tests/layers/callgraph.py [--build DIR] [--src run [--src format ...]] [--folders] [--edges]

make check-layers uses call_edges() to check every call between folders
against run/LAYERS (check_layers.py --objects)."""
import argparse
import os
import subprocess
import sys
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
        elif kind in "TDBRVWGS":     # global definitions (lower case: local to the object)
            defined.add(name)
    return defined, used


def sccs(nodes, edges):
    """Tarjan's strongly connected components, iteratively.  edges: node -> set of nodes."""
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


def call_edges(build, srcs, root="."):
    """(files, {(caller, callee): symbols}) over the objects of build/SRC for each SRC
    whose source file exists under root."""
    objs = []
    for src in srcs:
        for d, _, files in os.walk(os.path.join(build, src)):
            objs += [os.path.join(d, f) for f in files if f.endswith(".o")]
    defs, uses = {}, {}
    for o in sorted(objs):
        f = os.path.relpath(o, build)[:-2] + ".c"
        if not os.path.isfile(os.path.join(root, f)):
            continue
        defs[f], uses[f] = symbols(o)
    owner = {}
    for f, ds in defs.items():
        for s in ds:
            owner.setdefault(s, f)
    label = defaultdict(set)
    for f, us in uses.items():
        for s in us:
            g = owner.get(s)
            if g and g != f:
                label[(f, g)].add(s)
    return set(defs), label


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--src", action="append", help="source tree(s) under the build (default: run)")
    ap.add_argument("--folders", action="store_true", help="also the cycles between folders")
    ap.add_argument("--edges", action="store_true", help="the calls that close each cycle")
    a = ap.parse_args()
    srcs = a.src or ["run"]
    nodes, label = call_edges(a.build, srcs)
    if not nodes:
        sys.exit(f"no objects under {a.build}/{' '.join(srcs)}: build first")
    edges = defaultdict(set)
    for f, g in label:
        edges[f].add(g)
    file_cycles = sorted((c for c in sccs(nodes, edges) if len(c) > 1), key=len, reverse=True)
    print(f"{len(nodes)} files; call cycles between files: {len(file_cycles)}")
    for c in file_cycles:
        print(f"  {len(c)} files: {' '.join(c)}")
        if a.edges:
            for f in c:
                for g in sorted(edges[f]):
                    if g in c:
                        print(f"    {f} -> {g}: {' '.join(sorted(label[(f, g)])[:6])}")
    if a.folders:
        fold = os.path.dirname
        fedges = defaultdict(set)
        for f, g in label:
            if fold(f) != fold(g):
                fedges[fold(f)].add(fold(g))
        fnodes = {fold(f) for f in nodes}
        cyc = [c for c in sccs(fnodes, fedges) if len(c) > 1]
        print(f"{len(fnodes)} folders; call cycles between folders: {len(cyc)}")
        for c in cyc:
            print(f"  {' '.join(c)}")
            for f in c:
                for g in sorted(fedges[f]):
                    if g in c:
                        ex = sorted((x, y) for (x, y) in label if fold(x) == f and fold(y) == g)
                        print(f"    {f} -> {g}: e.g. {ex[0][0]} -> {ex[0][1]}")


if __name__ == "__main__":
    main()

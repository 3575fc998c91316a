#!/usr/bin/env python3
"""Rewrite every #include of a header of another folder to name its folder from the top of
the tree ("kpk.h" -> "format/kpk.h", "store.h" -> "run/store/store.h"), in format/, pack/,
run/ and tests/.  A header of the including file's own folder stays bare.  For a file
moved into run/FOLDER/ (git mv), or a branch written before run/ had folders:

  git mv run/new.c run/engine/new.c && tests/layers/name_includes.py && make check-layers

Prints the files it changed, and every include it cannot place (no such header, or two
headers of that name none of which is in the including file's tree); exit status 1 then."""
import collections
import os
import re
import sys

INC = re.compile(r'^(\s*#\s*include\s+")([^"/]+)(".*)$')


def main():
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    os.chdir(root)
    index = collections.defaultdict(list)
    for top in ("format", "pack", "run"):
        for d, _, files in os.walk(top):
            for f in files:
                if f.endswith(".h"):
                    index[f].append(os.path.join(d, f))
    unplaced = []
    for top in ("format", "pack", "run", "tests"):
        for d, dirs, files in os.walk(top):
            dirs[:] = [x for x in dirs if x not in ("node_modules", "corpus", "regress")]
            for f in sorted(files):
                if not f.endswith((".c", ".h")):
                    continue
                path = os.path.join(d, f)
                lines = open(path).read().split("\n")
                changed = False
                for n, line in enumerate(lines):
                    m = INC.match(line)
                    if not m or os.path.isfile(os.path.join(d, m.group(2))):
                        continue
                    cands = index.get(m.group(2), [])
                    if len(cands) > 1:   # the same name in two trees: the including file's own
                        cands = [c for c in cands if c.split(os.sep)[0] == path.split(os.sep)[0]]
                    if len(cands) != 1:
                        unplaced.append(f"{path}:{n + 1}: #include \"{m.group(2)}\": "
                                        f"{'no such header' if not cands else 'which one? ' + ' '.join(cands)}")
                        continue
                    lines[n] = m.group(1) + cands[0] + m.group(3)
                    changed = True
                if changed:
                    open(path, "w").write("\n".join(lines))
                    print(path)
    for u in unplaced:
        print(u)
    return 1 if unplaced else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""sparse_cmp.py A B: are two (sparse) files byte-identical?  Compares only the
union of their data segments (SEEK_DATA/SEEK_HOLE); everything else is a hole
in both and reads as zeros.  Needed for the 1.56 TB virtual .kpk, which cmp
would read in full.  Exit 0 identical, 1 different, 2 error."""
import os
import sys


def segments(fd, size):
    out, pos = [], 0
    while pos < size:
        try:
            d = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:  # ENXIO: only a hole remains
            break
        h = os.lseek(fd, d, os.SEEK_HOLE)
        out.append((d, h))
        pos = h
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    a, b = (os.open(p, os.O_RDONLY) for p in sys.argv[1:])
    sa, sb = os.fstat(a).st_size, os.fstat(b).st_size
    if sa != sb:
        print("different sizes: %d and %d" % (sa, sb))
        return 1
    merged = []
    for d, h in sorted(segments(a, sa) + segments(b, sb)):
        if merged and d <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(h, merged[-1][1]))
        else:
            merged.append((d, h))
    total = 0
    for d, h in merged:
        p = d
        while p < h:
            n = min(h - p, 16 << 20)
            if os.pread(a, n, p) != os.pread(b, n, p):
                print("different within bytes [%d, %d)" % (p, p + n))
                return 1
            p += n
            total += n
    print("identical (%d bytes of data compared, the rest holes in both)" % total)
    return 0


if __name__ == "__main__":
    sys.exit(main())

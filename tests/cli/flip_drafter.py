#!/usr/bin/python3
"""flip_drafter.py IN.kpk OUT.kpk: a copy of a drafter KPK file (docs/FORMAT.md §15)
with one bit flipped in the middle of its weights extent (kind 6, part 0), so a
reader's checksum of that extent must fail and name it."""
import struct, sys
d = bytearray(open(sys.argv[1], "rb").read())
off, n = struct.unpack_from("<QQ", d, 56)            # the extent table (superblock, FORMAT.md §3)
for i in range(n):
    kind, codec, member, layer = struct.unpack_from("<BBHI", d, off + 64 * i)
    o, stored = struct.unpack_from("<QQ", d, off + 64 * i + 16)
    if kind == 6 and layer == 0:
        d[o + stored // 2] ^= 0x08
open(sys.argv[2], "wb").write(d)

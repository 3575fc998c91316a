#!/usr/bin/python3
"""grow_state.py SMALL OUT N: a state file of N positions (docs/STATE.md), written independently of
krun, from SMALL, a real state file of the same model with pos == n_tokens and its logits: SMALL's
KDA layers and logits as they are, its MLA rows cycled to N rows, a history of N small ids (printed,
comma-separated); the header's and the payload's XXH3-64 through libxxhash (ctypes: stdlib only).
For a state as large as a budget allows without running N positions (test_krun_session)."""
import ctypes, struct, sys

small, out, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
x = ctypes.CDLL("libxxhash.so.0"); x.XXH3_64bits.restype = ctypes.c_uint64; x.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
h = lambda b: x.XXH3_64bits(b, len(b))
b = open(small, "rb").read()
u32 = lambda o: struct.unpack_from("<I", b, o)[0]; u64 = lambda o: struct.unpack_from("<Q", b, o)[0]
nl, vocab, heads, dim, conv, lora, rope = (u32(o) for o in (32, 40, 44, 48, 52, 56, 60))
pos, nt, flags = u64(72), u64(80), u32(88)
assert pos == nt and flags == 1 and pos >= 1
tb = (nl + 7) // 8 * 8
types = b[160:160 + tb]; at = 160 + tb + 4 * nt
kda = 4 * (heads * dim * dim + 3 * (conv - 1) * heads * dim); row = 4 * (lora + rope)
ids = [(i * 7 + 3) % 10 + 1 for i in range(N)]
pay = [types, struct.pack(f"<{N}I", *ids)]
for L in range(nl):
    if types[L]:
        rows = b[at:at + pos * row]; at += pos * row
        pay.append((rows * (N // pos + 1))[:N * row])
    else:
        pay.append(b[at:at + kda]); at += kda
pay.append(b[at:at + 4 * vocab])
pay = b"".join(pay)
hd = bytearray(b[:160])
struct.pack_into("<QQ", hd, 72, N, N); struct.pack_into("<Q", hd, 112, N); struct.pack_into("<Q", hd, 128, len(pay))
struct.pack_into("<Q", hd, 152, h(bytes(hd[:152])))
open(out, "wb").write(bytes(hd) + pay + struct.pack("<Q", h(pay)))
print(",".join(map(str, ids)))

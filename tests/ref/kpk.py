#!/usr/bin/python3
"""An independent implementation of the KPK file format, version 1.2, written
from docs/FORMAT.md alone: read and check (every rule of §3-§8, §11, §12),
write (single files and sets of member files, plain and striped, extents
stored plain or as codec-2 blocks with every method, archive extents), and
mutate + re-seal (change a record or a byte, recompute every checksum) to
craft damaged files.  It shares no code with format/ and uses only the Python
standard library, numpy (for XXH3 over long inputs) and the `zstd` command
line tool (Debian's zstd package; Python has no zstd module there).

Command line (exit 0 ok, 1 damage, 2 cannot read: not KPK, newer format,
member problem, I/O):
  kpk.py check FILE.kpk [--shallow] [--json]     every rule, every checksum, every zero byte
  kpk.py cat FILE.kpk NAME                       a tensor's decoded bytes on stdout
  kpk.py tensors FILE.kpk                        name, dtype, shape, sha256 of every tensor
  kpk.py relayout IN.kpk OUT.kpk [options]       rewrite with another layout (see --help)
  kpk.py mutate IN.kpk OUT.kpk MUTATION [ARG]    change one thing, re-seal (see `mutations`)
  kpk.py mutations                               list the mutations
As a module: load(path) -> Kpk (checked), Kpk.tensor_bytes(name), relayout(),
mutate(), serialize()."""
import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys

import numpy as np

# ---------------------------------------------------------------------------
# XXH3-64, seed 0 (xxHash >= 0.8), from the xxHash specification.
# ---------------------------------------------------------------------------
M64 = (1 << 64) - 1
P32_1, P32_2, P32_3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
P64_1, P64_2, P64_3, P64_4, P64_5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                                     0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)
SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e")


def _r64(b, o): return int.from_bytes(b[o:o + 8], "little")
def _r32(b, o): return int.from_bytes(b[o:o + 4], "little")


def _avalanche(h):
    h ^= h >> 37
    h = (h * 0x165667919E3779F9) & M64
    return h ^ (h >> 32)


def _avalanche64(h):
    h ^= h >> 33
    h = (h * P64_2) & M64
    h ^= h >> 29
    h = (h * P64_3) & M64
    return h ^ (h >> 32)


def _mul128_fold64(a, b):
    p = a * b
    return (p & M64) ^ (p >> 64)


def _mix16(data, o, so):
    return _mul128_fold64(_r64(data, o) ^ _r64(SECRET, so), _r64(data, o + 8) ^ _r64(SECRET, so + 8))


def _rotl(x, r): return ((x << r) | (x >> (64 - r))) & M64


def xxh3(data):
    data = bytes(data)
    n = len(data)
    if n == 0:
        return _avalanche64(_r64(SECRET, 56) ^ _r64(SECRET, 64))
    if n <= 3:
        c = (data[0] << 16) | (data[n >> 1] << 24) | data[n - 1] | (n << 8)
        return _avalanche64(c ^ (_r32(SECRET, 0) ^ _r32(SECRET, 4)))
    if n <= 8:
        v = (_r32(data, n - 4) + (_r32(data, 0) << 32)) ^ (_r64(SECRET, 8) ^ _r64(SECRET, 16))
        v ^= _rotl(v, 49) ^ _rotl(v, 24)
        v = (v * 0x9FB21C651E98DF25) & M64
        v ^= (v >> 35) + n
        v = (v * 0x9FB21C651E98DF25) & M64
        return v ^ (v >> 28)
    if n <= 16:
        lo = _r64(data, 0) ^ (_r64(SECRET, 24) ^ _r64(SECRET, 32))
        hi = _r64(data, n - 8) ^ (_r64(SECRET, 40) ^ _r64(SECRET, 48))
        acc = (n + int.from_bytes(lo.to_bytes(8, "little"), "big") + hi + _mul128_fold64(lo, hi)) & M64
        return _avalanche(acc)
    if n <= 128:
        acc = (n * P64_1) & M64
        pairs = [(0, 0), (n - 16, 16)]
        if n > 32:
            pairs += [(16, 32), (n - 32, 48)]
        if n > 64:
            pairs += [(32, 64), (n - 48, 80)]
        if n > 96:
            pairs += [(48, 96), (n - 64, 112)]
        for o, so in pairs:
            acc = (acc + _mix16(data, o, so)) & M64
        return _avalanche(acc)
    if n <= 240:
        acc = (n * P64_1) & M64
        for i in range(8):
            acc = (acc + _mix16(data, 16 * i, 16 * i)) & M64
        acc = _avalanche(acc)
        for i in range(8, n // 16):
            acc = (acc + _mix16(data, 16 * i, 16 * (i - 8) + 3)) & M64
        acc = (acc + _mix16(data, n - 16, 136 - 17)) & M64
        return _avalanche(acc)
    return _xxh3_long(data)


_KEYS = np.array([[_r64(SECRET, 8 * (s + i)) for i in range(8)] for s in range(16)], dtype=np.uint64)
_SCRAMBLE = np.array([_r64(SECRET, 128 + 8 * i) for i in range(8)], dtype=np.uint64)
_SWAP = np.array([1, 0, 3, 2, 5, 4, 7, 6])


def _stripes_sum(words):
    """Accumulator contributions of whole stripes [k, 16 stripes max, 8 lanes] summed over stripes."""
    k = _KEYS[:words.shape[1]]
    dk = words ^ k[None, :, :]
    prod = (dk & np.uint64(0xFFFFFFFF)) * (dk >> np.uint64(32))
    return prod.sum(axis=1, dtype=np.uint64) + words.sum(axis=1, dtype=np.uint64)[:, _SWAP]


def _xxh3_long(data):
    n = len(data)
    acc = np.array([P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1], dtype=np.uint64)
    nb_blocks = (n - 1) // 1024
    words = np.frombuffer(data, dtype="<u8", count=(nb_blocks * 1024) // 8).astype(np.uint64)
    contrib = _stripes_sum(words.reshape(nb_blocks, 16, 8)) if nb_blocks else None
    with np.errstate(over="ignore"):
        for b in range(nb_blocks):
            acc = acc + contrib[b]
            acc ^= acc >> np.uint64(47)
            acc ^= _SCRAMBLE
            acc = acc * np.uint64(P32_1)
        nstripes = ((n - 1) - 1024 * nb_blocks) // 64
        if nstripes:
            tail = np.frombuffer(data, dtype="<u8", count=nstripes * 8, offset=nb_blocks * 1024).astype(np.uint64)
            acc = acc + _stripes_sum(tail.reshape(1, nstripes, 8))[0]
    a = [int(v) for v in acc]
    for i in range(8):  # the last stripe, with the secret at 192 - 64 - 7
        v = _r64(data, n - 64 + 8 * i)
        k = v ^ _r64(SECRET, 121 + 8 * i)
        a[i ^ 1] = (a[i ^ 1] + v) & M64
        a[i] = (a[i] + (k & 0xFFFFFFFF) * (k >> 32)) & M64
    r = (n * P64_1) & M64
    for i in range(4):
        r = (r + _mul128_fold64(a[2 * i] ^ _r64(SECRET, 11 + 16 * i), a[2 * i + 1] ^ _r64(SECRET, 11 + 16 * i + 8))) & M64
    return _avalanche(r)


# ---------------------------------------------------------------------------
# zstd frames: the command line tool codes them; the frame structure (RFC
# 8878 §3.1.1) is walked here, to check "exactly one frame".
# ---------------------------------------------------------------------------
ZSTD_MAGIC = 0xFD2FB528


def zstd_compress(data, level=3, checksum=True, content_size=True):
    cmd = ["zstd", "-q", "-c", "-%d" % level]
    if content_size:
        cmd.append("--stream-size=%d" % len(data))
    if not checksum:
        cmd.append("--no-check")
    return subprocess.run(cmd, input=bytes(data), stdout=subprocess.PIPE, check=True).stdout


def zstd_decompress(frame):
    r = subprocess.run(["zstd", "-q", "-d", "-c"], input=bytes(frame), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise ValueError("zstd: " + r.stderr.decode(errors="replace").strip())
    return r.stdout


def zstd_frame_info(b):
    """(frame length, content size or None, dictionary id) of the frame at b[0:], or raise ValueError."""
    if len(b) < 6 or _r32(b, 0) != ZSTD_MAGIC:
        raise ValueError("not a zstd frame")
    fhd = b[4]
    fcs_flag, single, reserved, checksum, did_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 3) & 1, (fhd >> 2) & 1, fhd & 3
    if reserved:
        raise ValueError("zstd frame header reserved bit set")
    o = 5 + (0 if single else 1)
    did_size = [0, 1, 2, 4][did_flag]
    did = int.from_bytes(b[o:o + did_size], "little")
    o += did_size
    fcs_size = [1 if single else 0, 2, 4, 8][fcs_flag]
    content = None
    if fcs_size:
        content = int.from_bytes(b[o:o + fcs_size], "little") + (256 if fcs_size == 2 else 0)
    o += fcs_size
    while True:
        if o + 3 > len(b):
            raise ValueError("zstd frame cut short")
        h = int.from_bytes(b[o:o + 3], "little")
        last, btype, bsize = h & 1, (h >> 1) & 3, h >> 3
        o += 3
        if btype == 3:
            raise ValueError("reserved zstd block type")
        o += 1 if btype == 1 else bsize
        if last:
            break
    o += 4 if checksum else 0
    if o > len(b):
        raise ValueError("zstd frame cut short")
    return o, content, did


def zstd_one_frame(s, raw_len, decoded=None):
    """Decode S, which must be exactly one zstd frame with raw_len decoded bytes (decoded: its
    output already decoded in a batch, or None)."""
    flen, content, did = zstd_frame_info(s)
    if flen != len(s):
        raise ValueError("bytes after the end of the zstd frame")
    if did:
        raise ValueError("zstd frame needs a dictionary")
    if content is not None and content != raw_len:
        raise ValueError("zstd frame says %d decoded bytes, not %d" % (content, raw_len))
    out = zstd_decompress(s) if decoded is None else decoded
    if len(out) != raw_len:
        raise ValueError("decoded to %d bytes, not %d" % (len(out), raw_len))
    return out


def zstd_decompress_many(frames):
    """Decode many frames with one zstd call: their outputs, split by the expected lengths
    [(frame, length)], or None when the batch fails (a damaged frame): decode one by one then."""
    if not frames:
        return []
    r = subprocess.run(["zstd", "-q", "-d", "-c"], input=b"".join(f for f, _ in frames), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    if r.returncode != 0 or len(r.stdout) != sum(n for _, n in frames):
        return None
    out, at = [], 0
    for _, n in frames:
        out.append(r.stdout[at:at + n])
        at += n
    return out


def zstd_compress_many(items, level=3):
    """Compress many byte strings with a few zstd calls (one per flag combination); items are
    (data, checksum, content_size); returns the frames in order."""
    import tempfile
    out = [None] * len(items)
    groups = {}
    for i, (data, checksum, content_size) in enumerate(items):
        groups.setdefault((checksum, content_size), []).append(i)
    with tempfile.TemporaryDirectory() as d:
        for (checksum, content_size), idx in groups.items():
            names = []
            for i in idx:
                names.append(os.path.join(d, "%d" % i))
                with open(names[-1], "wb") as fh:
                    fh.write(items[i][0])
            cmd = ["zstd", "-q", "-f", "-%d" % level] + ([] if checksum else ["--no-check"]) + \
                  ([] if content_size else ["--no-content-size"])
            for k in range(0, len(names), 500):
                subprocess.run(cmd + names[k:k + 500], check=True)
            for i, n in zip(idx, names):
                with open(n + ".zst", "rb") as fh:
                    out[i] = fh.read()
    return out


# ---------------------------------------------------------------------------
# Constants (FORMAT.md)
# ---------------------------------------------------------------------------
MAGIC = b"\x89KPK\r\n\x1a\n"
SB = 4096
NONE32 = 0xFFFFFFFF
STRIPED = 0xFFFF
KINDS = {1: "meta", 2: "globals", 3: "trunk", 4: "expert", 5: "archive", 6: "drafter"}
META, GLOBALS, TRUNK, EXPERT, ARCHIVE, DRAFTER = 1, 2, 3, 4, 5, 6
DTYPE_SIZE = {1: 4, 2: 2, 3: 2, 4: 1, 5: 1}
DTYPE_NAME = {1: "F32", 2: "BF16", 3: "F16", 4: "U8", 5: "BYTES"}
F_CODECS, F_MEMBERS, F_BLOCKS, F_ARCHIVE, F_DRAFTER = 1, 2, 4, 8, 0x10
MINOR = 2  # the newest minor version this reader knows (1.2: drafter files, FORMAT.md §15)
RAW, ZSTD, SPLIT2 = 0, 1, 2
ENTRY, PLAIN, STRIPE = 0, 1, 2
MAX_MEMBERS, MAX_PATH, MAX_NAME, MAX_UNIT, MAX_BLOCK = 256, 4096, 1024, 64 << 20, 64 << 20


def round_up(v, a): return (v + a - 1) // a * a


def describe(x):
    if x["kind"] == TRUNK:
        return "layer %d trunk" % x["layer"]
    if x["kind"] == EXPERT:
        return "layer %d expert %d" % (x["layer"], x["expert"])
    if x["kind"] == DRAFTER:
        return "drafter part %d" % x["layer"]
    return KINDS.get(x["kind"], "kind %d" % x["kind"])


class KpkError(Exception):
    """cls: 'notkpk', 'version', 'damage', 'member', 'io'.  exit code: damage 1, else 2."""

    def __init__(self, cls, msg):
        super().__init__(msg)
        self.cls = cls

    @property
    def exit_code(self):
        return 1 if self.cls == "damage" else 2


def damage(msg): return KpkError("damage", msg)


# ---- records ---------------------------------------------------------------
SB_FIELDS = [  # (offset, struct code, name)
    (8, "H", "major"), (10, "H", "minor"), (12, "I", "superblock_size"), (16, "I", "incompat"), (20, "I", "compat"),
    (24, "I", "align"), (28, "I", "order"), (32, "Q", "file_size"), (40, "Q", "set_id"), (48, "H", "member_index"),
    (50, "H", "member_count"), (56, "Q", "extent_table_off"), (64, "Q", "extent_count"), (72, "Q", "extent_table_xxh3"),
    (80, "Q", "tensor_table_off"), (88, "Q", "tensor_count"), (96, "Q", "tensor_table_xxh3"), (104, "Q", "strings_off"),
    (112, "Q", "strings_len"), (120, "Q", "strings_xxh3"), (128, "Q", "manifest_off"), (136, "Q", "manifest_len"),
    (144, "Q", "manifest_xxh3"), (152, "Q", "data_bytes"), (160, "Q", "member_table_off"),
    (168, "Q", "member_table_xxh3"), (176, "Q", "block_table_off"), (184, "Q", "block_count"),
    (192, "Q", "block_table_xxh3"), (200, "I", "stripe_unit"), (204, "H", "stripe_count"), (208, "Q", "stripe_len")]
SB_RESERVED = [(52, 56), (206, 208), (216, 4088)]
SHARED = ["minor", "incompat", "compat", "align", "order", "set_id", "member_count", "stripe_unit", "stripe_count",
          "stripe_len"]
ENTRY_ONLY = ["extent_table_off", "extent_count", "extent_table_xxh3", "tensor_table_off", "tensor_count",
              "tensor_table_xxh3", "strings_off", "strings_len", "strings_xxh3", "manifest_off", "manifest_len",
              "manifest_xxh3", "data_bytes", "member_table_off", "member_table_xxh3", "block_table_off", "block_count",
              "block_table_xxh3"]


def sb_encode(f, patch=None):
    b = bytearray(SB)
    b[0:8] = MAGIC
    for off, code, name in SB_FIELDS:
        struct.pack_into("<" + code, b, off, f.get(name, 0))
    for off, val in (patch or {}).items():
        b[off:off + len(val)] = val
    struct.pack_into("<Q", b, 4088, xxh3(b[:4088]))
    return bytes(b)


def sb_decode(b):
    f = {}
    for off, code, name in SB_FIELDS:
        f[name] = struct.unpack_from("<" + code, b, off)[0]
    f["checksum"] = _r64(b, 4088)
    return f


EXT = struct.Struct("<BBHIIIQQQQQII")   # 64 bytes
EXT_FIELDS = ["kind", "codec", "member", "layer", "expert", "first_block", "offset", "stored_len", "raw_len",
              "stored_xxh3", "raw_xxh3", "first_tensor", "tensor_count"]
TEN = struct.Struct("<IIBBHIQQ4Q")      # 64 bytes
BLK = struct.Struct("<QQIIBBHIQQ")      # 48 bytes
MEM = struct.Struct("<HBBHHQQII32s")    # 64 bytes
assert EXT.size == 64 and TEN.size == 64 and BLK.size == 48 and MEM.size == 64


# ---------------------------------------------------------------------------
# Reading and checking
# ---------------------------------------------------------------------------
def read_superblocks(path, what):
    """§3 for one member file: (superblock fields, damage note or None)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            first = fh.read(SB)
            fh.seek(max(size - SB, 0))
            last = fh.read(SB) if size >= 2 * SB else b""
    except OSError as e:
        raise KpkError("io", "%s: %s" % (what, e.strerror))
    pm, bm = first[:8] == MAGIC, last[:8] == MAGIC
    if not pm and not bm:
        raise KpkError("notkpk", "%s: not a KPK file (no magic number at either end)" % what)
    if size < 12:  # the magic, and the file ends before the version fields
        raise damage("%s: truncated: %d bytes, no version number" % (what, size))

    def decode(b):  # -> (fields, problem, cls)
        if b[:8] != MAGIC:
            return None, "bad magic", "damage"
        if struct.unpack_from("<H", b, 8)[0] != 1:
            return None, "major version %d" % struct.unpack_from("<H", b, 8)[0], "version"
        if _r64(b, 4088) != xxh3(b[:4088]):
            return None, "superblock checksum mismatch", "damage"
        f = sb_decode(b)
        if f["incompat"] & ~0x1F:  # an unknown feature first: the rest may mean something else
            return None, "unsupported: newer format (incompat 0x%x)" % f["incompat"], "version"
        if f["superblock_size"] != SB:
            return None, "superblock size %d" % f["superblock_size"], "damage"
        if f["minor"] == 0 and f["incompat"] & (F_MEMBERS | F_BLOCKS | F_ARCHIVE):
            return None, "a 1.0 file with 1.1 feature bits", "damage"
        if f["minor"] < 2 and f["incompat"] & F_DRAFTER:
            return None, "a file of minor %d with the 1.2 DRAFTER bit" % f["minor"], "damage"
        if f["minor"] <= MINOR:
            for a, e in SB_RESERVED + ([(160, 216)] if f["minor"] == 0 else []):
                if any(b[a:e]):
                    return None, "reserved superblock bytes %d..%d are not zero" % (a, e - 1), "damage"
        else:  # fields reserved at our minor are ignored
            pass
        A = f["align"]
        if A < 4096 or A > 2 << 20 or A & (A - 1):
            return None, "alignment %d" % A, "damage"
        if f["order"] > 1:
            return None, "order %d" % f["order"], "damage"
        if not (0 <= f["member_index"] < f["member_count"] <= MAX_MEMBERS):
            return None, "member %d of %d" % (f["member_index"], f["member_count"]), "damage"
        if (f["member_count"] > 1) != bool(f["incompat"] & F_MEMBERS):
            return None, "MEMBERS bit and member count disagree", "damage"
        nz = [f["stripe_unit"] != 0, f["stripe_count"] != 0, f["stripe_len"] != 0]
        if any(nz) and not all(nz):
            return None, "stripe fields partly zero", "damage"
        if any(nz) and not f["incompat"] & F_MEMBERS:
            return None, "stripe fields without MEMBERS", "damage"
        return f, None, None

    hdr = first if pm else last
    major = struct.unpack_from("<H", hdr, 8)[0]
    if major != 1:
        # the primary's major, unless an intact backup of this file shows the primary damaged
        g = decode(last)[0] if pm and bm and size % SB == 0 else None
        if g is not None and g["file_size"] == size:
            return g, "%s: primary superblock damaged (major version %d); backup used" % (what, major)
        raise KpkError("version", "%s: KPK major version %d is not supported" % (what, major))
    if size % SB or size < 2 * SB:
        raise damage("%s: truncated: %d bytes" % (what, size))
    f, prob, cls = decode(first)
    if f is not None:
        if f["file_size"] != size:
            raise damage("%s: truncated or extended: superblock says %d, file has %d" % (what, f["file_size"], size))
        if first != last:
            raise damage("%s: torn: the two superblocks differ" % what)
        return f, None
    if cls == "version":
        raise KpkError("version", "%s: %s" % (what, prob))
    if prob not in ("bad magic", "superblock checksum mismatch"):
        raise damage("%s: %s" % (what, prob))
    g, prob2, cls2 = decode(last)
    if g is not None and g["file_size"] == size:
        return g, "%s: primary superblock damaged (%s); backup used" % (what, prob)
    if cls2 == "version":
        raise KpkError("version", "%s: %s" % (what, prob2))
    raise damage("%s: primary superblock: %s; backup: %s" % (what, prob, prob2 or "other file size"))


class Kpk:
    """A checked KPK file or set (load() builds it)."""

    def stored(self, i, pos=0, n=None):
        """Stored bytes [pos, pos+n) of extent i (n defaults to the rest of stored_len; may reach the padding)."""
        x = self.extents[i]
        if n is None:
            n = x["stored_len"] - pos
        return self.target_read(x["member"], x["offset"] + pos, n)

    def target_read(self, target, off, n):
        if target != STRIPED:
            return self.images[target][off:off + n]
        out = bytearray()
        U, N, A = self.sb["stripe_unit"], self.sb["stripe_count"], self.sb["align"]
        p = off
        while p < off + n:
            k, inside = divmod(p, U)
            l = min(U - inside, off + n - p)
            m = self.stripe_member[k % N]
            o = A + (k // N) * U + inside
            out += self.images[m][o:o + l]
            p += l
        return bytes(out)

    def blocks_of(self, i):
        x = self.extents[i]
        return self.blocks[x["first_block"]:x["first_block"] + self.nblocks[i]]

    def predecode(self):
        """Decode every zstd frame of the file with one zstd call (kept for decode_block); a
        damaged frame makes the batch fail, and the frames are then decoded one by one."""
        frames, keys = [], []
        for i, x in enumerate(self.extents):
            if x["codec"] != 2:
                continue
            s = self.stored(i)
            for k, b in enumerate(self.blocks_of(i)):
                part = s[b["stored_off"]:b["stored_off"] + b["stored_len"]]
                if b["method"] == ZSTD:
                    frames.append((part, b["raw_len"]))
                    keys.append((i, k, None))
                elif b["method"] == SPLIT2:
                    pl = [part[:b["plane0_len"]], part[b["plane0_len"]:]]
                    for q in (0, 1):
                        if b["planes"] & (1 << q):
                            frames.append((pl[q], b["raw_len"] // 2))
                            keys.append((i, k, q))
        out = zstd_decompress_many(frames)
        self.decoded = dict(zip(keys, out)) if out is not None else {}

    def decode_block(self, i, k, s):
        b = self.blocks_of(i)[k]
        where = "%s, block %d" % (describe(self.extents[i]), k)
        pre = getattr(self, "decoded", {})
        try:
            if b["method"] == RAW:
                r = bytes(s)
            elif b["method"] == ZSTD:
                r = zstd_one_frame(s, b["raw_len"], pre.get((i, k, None)))
            else:
                h = b["raw_len"] // 2
                planes = [s[:b["plane0_len"]], s[b["plane0_len"]:]]
                for p in (0, 1):
                    if b["planes"] & (1 << p):
                        planes[p] = zstd_one_frame(planes[p], h, pre.get((i, k, p)))
                r = bytearray(b["raw_len"])
                r[0::2] = planes[0]
                r[1::2] = planes[1]
                r = bytes(r)
        except ValueError as e:
            raise damage("%s: %s" % (where, e))
        if xxh3(r) != b["raw_xxh3"]:
            raise damage("%s: decoded checksum mismatch" % where)
        return r

    def raw(self, i):
        """Decoded bytes of extent i (blocks checked as they decode)."""
        x = self.extents[i]
        s = self.stored(i)
        if x["codec"] == 0:
            return s
        if x["codec"] == 1:
            try:
                r = zstd_one_frame(s, x["raw_len"])
            except ValueError as e:
                raise damage("%s: %s" % (describe(x), e))
            return r
        out = bytearray()
        for k, b in enumerate(self.blocks_of(i)):
            out += self.decode_block(i, k, s[b["stored_off"]:b["stored_off"] + b["stored_len"]])
        return bytes(out)

    def tensor(self, name):
        return self.tensors[self.by_name[name]]

    def tensor_bytes(self, name):
        t = self.tensor(name)
        return self.raw(t["extent"])[t["offset"]:t["offset"] + t["nbytes"]]

    # ---- the deep check: §11 ----
    def check_data(self, shallow=False):
        """Every checksum and every byte that must be zero; returns a list of problems (strings)."""
        probs = []
        A = self.sb["align"]
        if not shallow:
            self.predecode()
        for i, x in enumerate(self.extents):
            padded = round_up(x["stored_len"], A)
            s = self.stored(i, 0, padded)
            if any(s[x["stored_len"]:]):
                probs.append("%s: non-zero padding" % describe(x))
            s = s[:x["stored_len"]]
            if xxh3(s) != x["stored_xxh3"]:
                probs.append("%s: checksum mismatch" % describe(x))
                continue
            if x["codec"] == 2 and shallow:
                continue
            try:
                r = self.raw(i)
            except KpkError as e:
                probs.append(str(e))
                continue
            if xxh3(r) != x["raw_xxh3"]:
                probs.append("%s: decoded checksum mismatch" % describe(x))
            covered = bytearray(len(r))
            for t in self.tensors[x["first_tensor"]:x["first_tensor"] + x["tensor_count"]]:
                covered[t["offset"]:t["offset"] + t["nbytes"]] = b"\x01" * t["nbytes"]
            a = np.frombuffer(r, dtype=np.uint8)
            if len(a) and np.any(a[np.frombuffer(bytes(covered), dtype=np.uint8) == 0]):
                probs.append("%s: non-zero bytes between tensors" % describe(x))
        for target, a, b, what in self.zero_regions():
            if any(self.target_read(target, a, b - a)):
                probs.append("%s: non-zero bytes in %s" % ("stripe space" if target == STRIPED else "member %d" % target, what))
        m = None
        try:
            m = json.loads(self.manifest.decode("utf-8"))
            if not isinstance(m, dict):
                probs.append("manifest: not a JSON object")
                m = None
        except (ValueError, UnicodeDecodeError) as e:
            probs.append("manifest: not JSON (%s)" % e)
        try:
            self.check_recipe(m)
        except KpkError as e:
            probs.append(str(e))
        if self.note:
            probs.append(self.note)
        return probs

    # ---- the archive's recipe: §9.2 ----
    def check_recipe(self, m):
        """The recipe of a file with ARCHIVE: well formed, names inside the directory, each file's
        pieces tiling it exactly (what a rebuild reads); raise damage() naming the file."""
        ar = m.get("archive") if isinstance(m, dict) else None
        has = bool(self.sb["incompat"] & F_ARCHIVE)
        if not has:
            if ar is not None:
                raise damage("archive: a recipe without archive extents")
            return
        if not isinstance(ar, dict) or not isinstance(ar.get("files"), list) or \
                not isinstance(ar.get("not_kept", []), list):
            raise damage("archive: the recipe is missing or not an object with a files list")
        prev = None
        for f in ar["files"]:
            if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                raise damage("archive: a file without a name")
            name = f["name"]
            if not recipe_name_ok(name):
                raise damage("archive: %r is not a relative path inside the directory" % name)
            if prev is not None and name.encode() <= prev:
                raise damage("archive: %r: names not sorted or repeated" % name)
            prev = name.encode()
            size, sha = f.get("size"), f.get("sha256")
            if f.get("kind") not in ("file", "safetensors") or type(size) is not int or size < 0:
                raise damage("archive: %r: kind or size" % name)
            if sha is not None and not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
                raise damage("archive: %r: sha256" % name)
            pieces = []
            if f["kind"] == "file":
                t = self.tensors[self.by_name["archive/files/" + name]] if "archive/files/" + name in self.by_name else None
                if t is None:
                    raise damage("archive: %r: no tensor archive/files/%s" % (name, name))
                pieces.append((0, t["nbytes"]))
            else:
                hn = "archive/shards/%s/header" % name
                if hn not in self.by_name or self.tensor(hn)["nbytes"] < 8:
                    raise damage("archive: %r: no tensor %s" % (name, hn))
                h = self.tensor_bytes(hn)
                n = _r64(h, 0)
                if n != len(h) - 8:
                    raise damage("archive: %r: header length %d, %d bytes kept" % (name, n, len(h) - 8))
                pieces.append((0, len(h)))
                try:
                    text = h[8:].decode("utf-8")
                    hdr, _ = json.JSONDecoder().raw_decode(text, len(text) - len(text.lstrip()))
                except (ValueError, UnicodeDecodeError):
                    raise damage("archive: %r: the archived header is not JSON" % name)
                if not isinstance(hdr, dict):
                    raise damage("archive: %r: the archived header is not an object" % name)
                for tn, v in hdr.items():
                    if tn == "__metadata__":
                        continue
                    d = v.get("data_offsets") if isinstance(v, dict) else None
                    if not (isinstance(d, list) and len(d) == 2 and all(type(x) is int for x in d) and 0 <= d[0] <= d[1]):
                        raise damage("archive: %r: tensor %s: data_offsets" % (name, tn))
                    if tn not in self.by_name or self.tensor(tn)["nbytes"] != d[1] - d[0]:
                        raise damage("archive: %r: tensor %s missing or of another size" % (name, tn))
                    if d[1] > d[0]:
                        pieces.append((len(h) + d[0], d[1] - d[0]))
                pre = "archive/shards/%s/gap/" % name
                for i, x in enumerate(self.extents):
                    if x["kind"] != ARCHIVE:
                        continue
                    for t in self.tensors[x["first_tensor"]:x["first_tensor"] + x["tensor_count"]]:
                        if t["name"].startswith(pre):
                            pos = t["name"][len(pre):]
                            if not pos.isdigit() or not pos.isascii() or (pos[0] == "0" and len(pos) > 1):
                                raise damage("archive: %r: gap tensor %s" % (name, t["name"]))
                            if t["nbytes"]:
                                pieces.append((int(pos), t["nbytes"]))
            at = 0
            for off, ln in sorted(pieces):
                if off != at:
                    raise damage("archive: %r: bytes %d..%d %s" % (name, min(off, at), max(off, at),
                                                                 "written twice" if off < at else "in no piece"))
                at += ln
            if at != size:
                raise damage("archive: %r: pieces add up to %d bytes, the recipe says %d" % (name, at, size))

    def zero_regions(self):
        sb, A = self.sb, self.sb["align"]
        regs = []
        ends = {m: A for m in range(sb["member_count"])}
        ends[STRIPED] = 0
        for m in range(sb["member_count"]):
            regs.append((m, SB, A, "padding after the superblock"))
        for x in self.extents:
            regs.append((x["member"], ends[x["member"]], x["offset"], "the gap before %s" % describe(x)))
            ends[x["member"]] = x["offset"] + round_up(x["stored_len"], A)
        for m in range(sb["member_count"]):
            role = self.members[m]["role"]
            if role == STRIPE:
                continue
            end = sb["extent_table_off"] if m == 0 else self.members[m]["file_size"] - SB
            regs.append((m, ends[m], end, "the padding after the last extent"))
        if sb["stripe_count"]:
            regs.append((STRIPED, ends[STRIPED], sb["stripe_len"], "unused stripe space"))
        at = None
        for off, ln in self.sections:
            if at is not None:
                regs.append((0, at, off, "directory padding"))
            at = off + ln
        regs.append((0, at, sb["file_size"] - SB, "directory padding"))
        return [r for r in regs if r[1] < r[2]]


META_FILES = ("meta/config.json", "meta/tiktoken.model", "meta/tokenizer_config.json")


def recipe_name_ok(name):
    """§9.2: relative, '/'-separated, no empty, '.' or '..' component."""
    return bool(name) and all(c not in ("", ".", "..") for c in name.split("/"))


def _name_agrees(x, name):
    k = x["kind"]
    if k == META:
        return name.startswith("meta/")
    if k == GLOBALS:
        return name.startswith("language_model.") and ".layers." not in name
    if k == TRUNK:
        return name.startswith("language_model.model.layers.%d." % x["layer"]) and ".experts." not in name
    if k == EXPERT:
        return name.startswith("language_model.model.layers.%d.block_sparse_moe.experts.%d." % (x["layer"], x["expert"]))
    if k == DRAFTER:
        return not name.startswith("meta/") and not name.startswith("language_model.")
    return not name.startswith("meta/") and not name.startswith("language_model.model.layers.")


def load(path):
    """Open and check the structure of a KPK file or set (§3-§8); raise KpkError."""
    k = Kpk()
    k.path = path
    sb, note = read_superblocks(path, path)
    notes = [note] if note else []
    if sb["member_index"] != 0:
        raise KpkError("member", "%s: this is member %d of a set of %d; open the entry file" %
                       (path, sb["member_index"], sb["member_count"]))
    if sb["set_id"] != sb["extent_table_xxh3"] ^ sb["tensor_table_xxh3"]:
        raise damage("%s: set id is not the XOR of the table checksums" % path)
    k.sb = sb
    with open(path, "rb") as fh:
        img = fh.read()
    A, n_ext, n_ten, n_blk, M = sb["align"], sb["extent_count"], sb["tensor_count"], sb["block_count"], sb["member_count"]
    if n_ext > 1 << 24 or n_ten > 1 << 26 or n_blk > 1 << 28:
        raise damage("implausible table sizes")
    D = sb["extent_table_off"]
    if D < A or D % 4096:
        raise damage("extent table offset %d" % D)
    secs = [("extent table", D, 64 * n_ext, sb["extent_table_xxh3"]),
            ("tensor table", sb["tensor_table_off"], 64 * n_ten, sb["tensor_table_xxh3"]),
            ("string pool", sb["strings_off"], sb["strings_len"], sb["strings_xxh3"]),
            ("manifest", sb["manifest_off"], sb["manifest_len"], sb["manifest_xxh3"])]
    if M > 1:
        secs.append(("member table", sb["member_table_off"], 64 * M, sb["member_table_xxh3"]))
    elif sb["member_table_off"] or sb["member_table_xxh3"]:
        raise damage("member table fields in a single file")
    if n_blk:
        secs.append(("block table", sb["block_table_off"], 48 * n_blk, sb["block_table_xxh3"]))
    elif sb["block_table_off"] or sb["block_table_xxh3"]:
        raise damage("block table fields without blocks")
    data = {}
    lo = D
    for name, off, ln, h in secs:
        if off % 4096 or off < lo or off + ln > len(img) - SB or ln > 16 << 30:
            raise damage("%s at %d (+%d) is out of place" % (name, off, ln))
        data[name] = img[off:off + ln]
        if xxh3(data[name]) != h:
            raise damage("%s checksum mismatch" % name)
        lo = off + ln
    k.sections = [(off, ln) for _, off, ln, _ in secs]
    k.manifest = data["manifest"]
    pool = data["string pool"]
    minor_known = sb["minor"] <= MINOR
    # members
    k.members = []
    reserved_member = None
    if M > 1:
        for m in range(M):
            idx, role, r1, sidx, r2, fsize, sbh, poff, plen, r3 = MEM.unpack_from(data["member table"], 64 * m)
            if minor_known and (r1 or r2 or any(r3)) and reserved_member is None:
                reserved_member = m
            k.members.append(dict(index=idx, role=role, stripe_index=sidx, file_size=fsize, superblock_xxh3=sbh,
                                  path_off=poff, path_len=plen))
    else:
        k.members.append(dict(index=0, role=ENTRY, stripe_index=0xFFFF, file_size=len(img), superblock_xxh3=0,
                              path_off=0, path_len=0))
    # values this version does not define, in every record, before any other rule of the tables:
    # the file needs a newer reader, whatever else looks wrong (FORMAT.md §3, order of the checks)
    for m, r in enumerate(k.members):
        if r["role"] > 2:
            raise KpkError("version", "member %d: unknown role %d" % (m, r["role"]))
    for i in range(n_ext):
        kind, codec = data["extent table"][64 * i], data["extent table"][64 * i + 1]
        if kind not in KINDS:
            raise KpkError("version", "extent %d: unsupported: newer format (kind %d)" % (i, kind))
        if codec > 2:
            raise KpkError("version", "extent %d: unsupported: newer format (codec %d)" % (i, codec))
    for i in range(n_ten):
        if data["tensor table"][64 * i + 8] not in DTYPE_SIZE:
            raise KpkError("version", "tensor %d: unsupported: newer format (dtype %d)" % (i, data["tensor table"][64 * i + 8]))
    for b in range(n_blk):
        if data["block table"][48 * b + 24] > 2:
            raise KpkError("version", "block %d: unsupported: newer format (method %d)" % (b, data["block table"][48 * b + 24]))
    if reserved_member is not None:
        raise damage("member record %d: reserved bytes" % reserved_member)
    N = sb["stripe_count"]
    k.stripe_member = [None] * N
    for m, r in enumerate(k.members):
        if r["index"] != m:
            raise damage("member record %d has index %d" % (m, r["index"]))
        if (m == 0) != (r["role"] == ENTRY):
            raise damage("member %d: role %d" % (m, r["role"]))
        if r["file_size"] % 4096 or r["file_size"] < A + SB:
            raise damage("member %d: size %d" % (m, r["file_size"]))
        if m == 0:
            if r["file_size"] != len(img) or r["superblock_xxh3"] or r["path_off"] or r["path_len"] or r["stripe_index"] != 0xFFFF:
                raise damage("member record 0 does not describe the entry")
        elif r["role"] == STRIPE:
            if r["stripe_index"] >= N or k.stripe_member[r["stripe_index"]] is not None:
                raise damage("member %d: stripe index %d" % (m, r["stripe_index"]))
            k.stripe_member[r["stripe_index"]] = m
        elif r["stripe_index"] != 0xFFFF:
            raise damage("member %d: stripe index on a plain member" % m)
    if any(s is None for s in k.stripe_member):
        raise damage("stripe count %d does not match the stripe members" % N)
    U, L = sb["stripe_unit"], sb["stripe_len"]
    if N:
        if U & (U - 1) or U % A or U > MAX_UNIT or L % (U * N):
            raise damage("stripe geometry U=%d N=%d L=%d" % (U, N, L))
        for m in k.stripe_member:
            if k.members[m]["file_size"] != A + L // N + SB:
                raise damage("stripe member %d: size" % m)
    # tensors and the string pool: names in table order, then member paths
    k.tensors = []
    at = 0
    for i in range(n_ten):
        noff, nlen, dt, nd, res, ext, off, nb, *shape = TEN.unpack_from(data["tensor table"], 64 * i)
        if nlen == 0 or nlen > MAX_NAME or noff != at or noff + nlen + 1 > len(pool) or pool[noff + nlen] != 0 \
                or 0 in pool[noff:noff + nlen]:
            raise damage("tensor %d: name not in place in the string pool" % i)
        at += nlen + 1
        k.tensors.append(dict(name=pool[noff:noff + nlen].decode("utf-8", "replace"), dtype=dt, ndim=nd, reserved=res,
                              extent=ext, offset=off, nbytes=nb, shape=list(shape)))
    for m in range(1, M):
        r = k.members[m]
        if r["path_len"] == 0 or r["path_len"] > MAX_PATH or r["path_off"] != at or \
                r["path_off"] + r["path_len"] + 1 > len(pool) or pool[r["path_off"] + r["path_len"]] != 0 or \
                0 in pool[r["path_off"]:r["path_off"] + r["path_len"]]:
            raise damage("member %d: path not in place in the string pool" % m)
        r["path"] = pool[r["path_off"]:r["path_off"] + r["path_len"]].decode("utf-8", "replace")
        if r["path"].startswith("/"):
            raise damage("member %d: absolute path" % m)
        if any(c in ("", ".") for c in r["path"].split("/")):
            raise damage("member %d: empty or '.' path component" % m)
        at += r["path_len"] + 1
    if at != len(pool):
        raise damage("string pool is %d bytes, names and paths take %d" % (len(pool), at))
    # extents
    k.extents = []
    for i in range(n_ext):
        k.extents.append(dict(zip(EXT_FIELDS, EXT.unpack_from(data["extent table"], 64 * i))))
    k.blocks = []
    for b in range(n_blk):
        ro, so, rl, sl, meth, planes, res1, p0, h, res2 = BLK.unpack_from(data["block table"], 48 * b)
        if minor_known and (res1 or res2):
            raise damage("block %d: reserved bytes" % b)
        k.blocks.append(dict(raw_off=ro, stored_off=so, raw_len=rl, stored_len=sl, method=meth, planes=planes,
                             plane0_len=p0, raw_xxh3=h))
    ends = {m: A for m in range(M)}
    ends[STRIPED] = 0
    uses = {F_CODECS: False, F_BLOCKS: False, F_ARCHIVE: False, F_DRAFTER: False}
    drafter_file = bool(sb["incompat"] & F_DRAFTER)
    seen_parts = set()
    seen_meta = seen_glob = 0
    seen_trunk, seen_exp = set(), set()
    nt = nb = total = 0
    k.nblocks = []
    for i, x in enumerate(k.extents):
        d = describe(x)
        if drafter_file and x["kind"] in (GLOBALS, TRUNK, EXPERT):
            raise damage("%s in a drafter file" % d)
        for bit, used in ((F_CODECS, x["codec"] == 1), (F_BLOCKS, x["codec"] == 2), (F_ARCHIVE, x["kind"] == ARCHIVE),
                          (F_DRAFTER, x["kind"] == DRAFTER)):
            if used:
                uses[bit] = True
                if not sb["incompat"] & bit:
                    raise damage("%s: feature 0x%x used but not declared" % (d, bit))
        mem = x["member"]
        if mem == STRIPED:
            if not N:
                raise damage("%s: striped without stripe members" % d)
            hi = L
        else:
            if mem >= M or k.members[mem]["role"] == STRIPE:
                raise damage("%s: member %d" % (d, mem))
            hi = D if mem == 0 else k.members[mem]["file_size"] - SB
        if x["offset"] % A or x["offset"] < ends[mem] or x["offset"] + round_up(x["stored_len"], A) > hi:
            raise damage("%s: placement (offset %d, %d bytes)" % (d, x["offset"], x["stored_len"]))
        ends[mem] = x["offset"] + round_up(x["stored_len"], A)
        if x["raw_len"] > 1 << 40:
            raise damage("%s: raw_len" % d)
        if x["codec"] == 0 and (x["raw_len"] != x["stored_len"] or x["raw_xxh3"] != x["stored_xxh3"]):
            raise damage("%s: codec 0 with raw != stored" % d)
        if x["first_tensor"] != nt or nt + x["tensor_count"] > n_ten:
            raise damage("%s: tensor range" % d)
        nt += x["tensor_count"]
        nxt = k.extents[i + 1]["first_block"] if i + 1 < n_ext else n_blk
        if x["first_block"] != nb or nxt < nb or (x["codec"] != 2 and nxt != nb):
            raise damage("%s: first_block %d" % (d, x["first_block"]))
        k.nblocks.append(nxt - nb)
        nb = nxt
        total += x["stored_len"]
        if x["kind"] in (META, GLOBALS, ARCHIVE):
            if x["layer"] != NONE32 or x["expert"] != NONE32:
                raise damage("%s: layer/expert number" % d)
            seen_meta += x["kind"] == META
            seen_glob += x["kind"] == GLOBALS
        elif x["kind"] == DRAFTER:
            if x["layer"] > 1 or x["expert"] != NONE32 or x["layer"] in seen_parts:
                raise damage("%s: drafter part numbering" % d)
            seen_parts.add(x["layer"])
        elif x["kind"] == TRUNK:
            if x["expert"] != NONE32 or x["layer"] >= 4096 or x["layer"] in seen_trunk:
                raise damage("%s: trunk numbering" % d)
            seen_trunk.add(x["layer"])
        else:
            key = (x["layer"], x["expert"])
            if x["layer"] >= 4096 or x["expert"] >= 65536 or key in seen_exp:
                raise damage("%s: expert numbering" % d)
            seen_exp.add(key)
    if nt != n_ten:
        raise damage("extents cover %d tensors of %d" % (nt, n_ten))
    if nb != n_blk:
        raise damage("extents cover %d blocks of %d" % (nb, n_blk))
    if seen_meta != 1 or seen_glob != (0 if drafter_file else 1):
        raise damage("%d meta and %d globals extents (one each; a drafter file: no globals)" % (seen_meta, seen_glob))
    if drafter_file and seen_parts != {0, 1}:
        raise damage("a drafter file without both drafter extents (weights and embedding)")
    if total != sb["data_bytes"]:
        raise damage("data_bytes %d, extents add up to %d" % (sb["data_bytes"], total))
    for bit, used in uses.items():
        if bool(sb["incompat"] & bit) != used:
            raise damage("feature bit 0x%x set but unused" % bit)
    # tensors
    k.by_name = {}
    for i, x in enumerate(k.extents):
        end = 0
        for ti in range(x["first_tensor"], x["first_tensor"] + x["tensor_count"]):
            t = k.tensors[ti]
            if minor_known and t["reserved"]:
                raise damage("tensor %s: reserved bytes" % t["name"])
            if t["extent"] != i:
                raise damage("tensor %s: extent %d, listed under %d" % (t["name"], t["extent"], i))
            if not _name_agrees(x, t["name"]):
                raise damage("tensor %s: name does not belong in %s" % (t["name"], describe(x)))
            # §4: the meta extent holds the runtime's files and no other (a later minor may add some)
            if minor_known and x["kind"] == META and t["name"] not in META_FILES:
                raise damage("tensor %s: not a file the meta extent may hold" % t["name"])
            if not 1 <= t["ndim"] <= 4 or any(t["shape"][t["ndim"]:]):
                raise damage("tensor %s: ndim/shape" % t["name"])
            n = 1
            for s in t["shape"][:t["ndim"]]:
                n *= s
            if n * DTYPE_SIZE[t["dtype"]] != t["nbytes"]:
                raise damage("tensor %s: nbytes %d vs shape" % (t["name"], t["nbytes"]))
            if t["offset"] % 64 or t["offset"] < end or t["offset"] + t["nbytes"] > x["raw_len"]:
                raise damage("tensor %s: offset" % t["name"])
            end = t["offset"] + t["nbytes"]
            if t["name"] in k.by_name:
                raise damage("tensor %s twice" % t["name"])
            k.by_name[t["name"]] = ti
        if end != x["raw_len"]:
            raise damage("%s: raw_len %d, tensors end at %d" % (describe(x), x["raw_len"], end))
    # blocks
    for i, x in enumerate(k.extents):
        if x["codec"] != 2:
            continue
        bl = k.blocks_of(i)
        if x["raw_len"] and not bl:
            raise damage("%s: no blocks" % describe(x))
        r = s = 0
        ts = k.tensors[x["first_tensor"]:x["first_tensor"] + x["tensor_count"]]
        for j, b in enumerate(bl):
            w = "%s, block %d" % (describe(x), j)
            if b["raw_off"] != r or b["stored_off"] != s or not 1 <= b["raw_len"] <= MAX_BLOCK:
                raise damage("%s: does not tile" % w)
            if b["stored_len"] > 2 * b["raw_len"] + 4096:
                raise damage("%s: implausible stored length" % w)
            if b["method"] == RAW and (b["stored_len"] != b["raw_len"]):
                raise damage("%s: raw with stored != raw" % w)
            if b["method"] != SPLIT2 and (b["planes"] or b["plane0_len"]):
                raise damage("%s: plane fields" % w)
            if b["method"] == SPLIT2:
                h = b["raw_len"] // 2
                if b["raw_len"] % 2 or b["planes"] & ~3 or b["plane0_len"] > b["stored_len"] or \
                        (not b["planes"] & 1 and b["plane0_len"] != h) or \
                        (not b["planes"] & 2 and b["stored_len"] - b["plane0_len"] != h):
                    raise damage("%s: split2 fields" % w)
            r += b["raw_len"]
            s += b["stored_len"]
            if j + 1 < len(bl):
                for t in ts:
                    if t["offset"] < r < t["offset"] + t["nbytes"] and (r - t["offset"]) % (t["nbytes"] // t["shape"][0]):
                        raise damage("%s: ends inside a row of %s" % (w, t["name"]))
        if r != x["raw_len"] or s != x["stored_len"]:
            raise damage("%s: blocks do not cover the extent" % describe(x))
    # member files (§7.4)
    k.images = [img]
    base = os.path.dirname(os.path.realpath(path))
    seen = [os.stat(path)]
    for m in range(1, M):
        r = k.members[m]
        p = os.path.join(base, r["path"])
        label = "member %d (%s)" % (m, r["path"])
        try:
            st = os.stat(p)
        except OSError as e:
            raise KpkError("member", "%s: %s (missing)" % (label, e.strerror))
        if not os.path.isfile(p):
            raise KpkError("member", "%s: not a regular file (missing)" % label)
        for j, o in enumerate(seen):
            if (o.st_dev, o.st_ino) == (st.st_dev, st.st_ino):
                raise KpkError("member", "%s: duplicated: the same file as member %d" % (label, j))
        seen.append(st)
        if st.st_size != r["file_size"]:
            raise KpkError("member", "%s: truncated or extended" % label)
        msb, mnote = read_superblocks(p, label)
        if mnote:
            notes.append(mnote)
        if msb["set_id"] != sb["set_id"]:
            raise KpkError("member", "%s: belongs to another set" % label)
        if msb["member_index"] != m:
            raise KpkError("member", "%s: renamed or swapped (it is member %d)" % (label, msb["member_index"]))
        for fld in SHARED:
            if msb[fld] != sb[fld]:
                raise KpkError("member", "%s: does not match the set (%s)" % (label, fld))
        if any(msb[fld] for fld in ENTRY_ONLY):
            raise KpkError("member", "%s: does not match the set (entry-only fields)" % label)
        if msb["checksum"] != r["superblock_xxh3"]:
            raise KpkError("member", "%s: does not match the set (superblock checksum)" % label)
        with open(p, "rb") as fh:
            k.images.append(fh.read())
    k.note = "; ".join(notes) if notes else None
    return k


# ---------------------------------------------------------------------------
# Writing: a physical description (records + stored bytes + placement) to
# files, with every checksum computed (re-sealed).
# ---------------------------------------------------------------------------
class Phys:
    """Everything a file holds, as records: what serialize() writes.  from_kpk(load(path)) gives one.
    Placement (each extent's member and offset) is given; serialize() derives sizes, the string pool,
    the directory, the member table and every checksum from it."""

    def __init__(self):
        self.minor, self.incompat, self.compat, self.align, self.order = 1, 0, 1, 4096, 0
        self.extents, self.tensors, self.blocks, self.members, self.stored = [], [], [], [], []
        self.manifest = b"{}"
        self.stripe_unit = 0
        self.sb_patch = {}          # entry superblock: offset -> bytes, applied before its checksum
        self.keep = {}              # superblock field -> value written as is instead of computed (data_bytes)


def from_kpk(k):
    p = Phys()
    sb = k.sb
    p.minor, p.incompat, p.compat, p.align, p.order = sb["minor"], sb["incompat"], sb["compat"], sb["align"], sb["order"]
    p.extents = [dict(x, nblocks=k.nblocks[i]) for i, x in enumerate(k.extents)]
    p.tensors = [dict(t) for t in k.tensors]
    p.blocks = [dict(b) for b in k.blocks]
    p.members = [dict(role=m["role"], stripe_index=m["stripe_index"], path=m.get("path", ""))
                 for m in k.members] if sb["member_count"] > 1 else []
    p.stored = [k.stored(i) for i in range(len(k.extents))]
    p.manifest = k.manifest
    p.stripe_unit = sb["stripe_unit"]
    return p


def decode_stored(x, blocks, s):
    """Decoded bytes of the stored bytes s of an extent record with its blocks (no checks)."""
    if x["codec"] == 0:
        return s
    if x["codec"] == 1:
        return zstd_decompress(s)
    out = bytearray()
    for b in blocks:
        part = s[b["stored_off"]:b["stored_off"] + b["stored_len"]]
        if b["method"] == RAW:
            out += part
        elif b["method"] == ZSTD:
            out += zstd_decompress(part)
        else:
            pl = [part[:b["plane0_len"]], part[b["plane0_len"]:]]
            pl = [zstd_decompress(pl[q]) if b["planes"] & (1 << q) else pl[q] for q in (0, 1)]
            r = bytearray(b["raw_len"])
            r[0::2], r[1::2] = pl[0], pl[1]
            out += r
    return bytes(out)


def serialize(p, entry_path):
    """Write the entry file and every member file of p, re-sealed: every extent's stored length and
    checksum from its bytes (codec 0: raw = stored; blocks and the decoded checksums of compressed
    extents are kept as recorded), the tables, the string pool, the member table, the superblocks."""
    A = p.align
    M = max(len(p.members), 1)
    nb = 0
    for i, x in enumerate(p.extents):
        s = p.stored[i]
        x["first_block"] = nb
        nb += x.get("nblocks", 0)
        x["stored_len"] = len(s)
        x["stored_xxh3"] = xxh3(s)
        if x["codec"] == 0:
            x["raw_len"], x["raw_xxh3"] = x["stored_len"], x["stored_xxh3"]
    # the string pool: names in tensor order, then member paths in member order
    pool = bytearray()
    for t in p.tensors:
        nm = t["name"].encode()
        t["name_off"], t["name_len"] = len(pool), len(nm)
        pool += nm + b"\0"
    for m in p.members[1:]:
        pth = m["path"].encode()
        m["path_off"], m["path_len"] = len(pool), len(pth)
        pool += pth + b"\0"
    # data areas: stripe space and member files
    stripe_of = {m["stripe_index"]: i for i, m in enumerate(p.members) if m["role"] == STRIPE}
    N, U = len(stripe_of), p.stripe_unit
    ends = {}
    for i, x in enumerate(p.extents):
        ends[x["member"]] = max(ends.get(x["member"], 0), x["offset"] + round_up(len(p.stored[i]), A))
    L = round_up(ends.get(STRIPED, 0), U * N) if N else 0
    images = {0: bytearray(round_up(max(A, ends.get(0, A)), 4096))}
    for m in range(1, M):
        images[m] = bytearray(A + L // N + SB if p.members[m]["role"] == STRIPE else max(A, ends.get(m, A)) + SB)
    for i, x in enumerate(p.extents):
        s = p.stored[i]
        if x["member"] != STRIPED:
            images[x["member"]][x["offset"]:x["offset"] + len(s)] = s
            continue
        q = 0
        while q < len(s):
            unit, inside = divmod(x["offset"] + q, U)
            n = min(U - inside, len(s) - q)
            o = A + (unit // N) * U + inside
            images[stripe_of[unit % N]][o:o + n] = s[q:q + n]
            q += n
    ext_tab = b"".join(EXT.pack(*[x[f] for f in EXT_FIELDS]) for x in p.extents)
    ten_tab = b"".join(TEN.pack(t["name_off"], t["name_len"], t["dtype"], t["ndim"], t.get("reserved", 0), t["extent"],
                                t["offset"], t["nbytes"], *(list(t["shape"]) + [0] * 4)[:4]) for t in p.tensors)
    blk_tab = b"".join(BLK.pack(b["raw_off"], b["stored_off"], b["raw_len"], b["stored_len"], b["method"],
                                b["planes"], b.get("reserved1", 0), b["plane0_len"], b["raw_xxh3"], b.get("reserved2", 0))
                       for b in p.blocks)
    shared = dict(major=1, minor=p.minor, superblock_size=SB, incompat=p.incompat, compat=p.compat, align=A,
                  order=p.order, member_count=M, stripe_unit=U if N else 0, stripe_count=N, stripe_len=L,
                  set_id=xxh3(ext_tab) ^ xxh3(ten_tab))
    # the other members' superblocks first: the member table records their checksums
    mem_sbs = {m: sb_encode(dict(shared, file_size=len(images[m]), member_index=m), p.members[m].get("sb_patch"))
               for m in range(1, M)}
    # the entry's directory after its last extent; its size is known once the sections are laid out
    secs = [("extent_table", ext_tab), ("tensor_table", ten_tab), ("strings", bytes(pool)), ("manifest", p.manifest)]
    if M > 1:
        secs.append(("member_table", None))
    if p.blocks:
        secs.append(("block_table", blk_tab))
    sb = dict(shared, member_index=0, extent_count=len(p.extents), tensor_count=len(p.tensors),
              block_count=len(p.blocks), strings_len=len(pool), manifest_len=len(p.manifest),
              data_bytes=p.keep.get("data_bytes", sum(len(s) for s in p.stored)))
    off = len(images[0])
    for name, body in secs:
        sb[name + "_off"] = off
        off = round_up(off + (64 * M if body is None else len(body)), 4096)
    sb["file_size"] = off + SB
    entry = images[0]
    entry += bytes(off - len(entry))
    if M > 1:
        recs = b""
        for m, r in enumerate(p.members):
            rec = dict(r, **r.get("record", {}))  # "record": fields written differently from the layout
            recs += MEM.pack(m, rec["role"], rec.get("reserved1", 0), rec["stripe_index"], rec.get("reserved2", 0),
                             sb["file_size"] if m == 0 else len(images[m]), _r64(mem_sbs[m], 4088) if m else 0,
                             rec.get("path_off", 0), rec.get("path_len", 0), rec.get("reserved3", bytes(32)))
        secs[4] = ("member_table", recs)
    for name, body in secs:
        o = sb[name + "_off"]
        entry[o:o + len(body)] = body
        sb[name + "_xxh3"] = xxh3(body)
    blk = sb_encode(sb, p.sb_patch)
    entry[0:SB] = blk
    entry += blk
    os.makedirs(os.path.dirname(os.path.abspath(entry_path)), exist_ok=True)
    with open(entry_path, "wb") as fh:
        fh.write(entry)
    base = os.path.dirname(os.path.realpath(entry_path))
    for m in range(1, M):
        img = images[m]
        img[0:SB] = mem_sbs[m]
        img[len(img) - SB:] = mem_sbs[m]
        path = os.path.join(base, p.members[m]["path"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(img)
    return sb


# ---------------------------------------------------------------------------
# Re-layout: members, stripe space, codec-2 blocks, archive extents
# ---------------------------------------------------------------------------
def row_size(t): return t["nbytes"] // t["shape"][0] if t["nbytes"] else 1


def cut_blocks(x, tensors, target):
    """Block raw lengths for an extent: about `target` bytes each, cut only on rows of the tensor a cut falls in."""
    raw_len = x["raw_len"]
    cuts, pos = [], 0
    while pos < raw_len:
        c = min(pos + target, raw_len)
        for t in tensors:
            if t["offset"] < c < t["offset"] + t["nbytes"]:
                r = row_size(t)
                down = t["offset"] + (c - t["offset"]) // r * r
                c = down if down > pos else t["offset"] + ((pos - t["offset"]) // r + 1) * r
                break
        c = min(c, raw_len)
        cuts.append(c - pos)
        pos = c
    return cuts


def plan_blocks(raw, lengths, methods, items):
    """First half of encode_blocks: block records and their pieces; the bytes to compress are
    appended to items (so that many extents share one batch of zstd calls)."""
    recs, parts, r = [], [], 0
    for j, n in enumerate(lengths):
        part = raw[r:r + n]
        meth, planes = methods(j, n)
        if meth == SPLIT2 and n % 2:
            meth, planes = ZSTD, 0
        rec = dict(raw_off=r, raw_len=n, method=meth, planes=0, plane0_len=0, raw_xxh3=xxh3(part))
        if meth == RAW:
            pieces = [part]
        elif meth == ZSTD:  # frames with and without a content checksum and a content size
            items.append((part, j % 2 == 0, j % 3 != 1))
            pieces = [len(items) - 1]
        else:
            pl = [bytes(part[0::2]), bytes(part[1::2])]
            pieces = []
            for q in (0, 1):
                if planes & (1 << q):
                    items.append((pl[q], True, q == 0))
                    pieces.append(len(items) - 1)
                else:
                    pieces.append(pl[q])
            rec["planes"] = planes
        recs.append(rec)
        parts.append((part, pieces))
        r += n
    return recs, parts


def finish_blocks(recs, parts, frames):
    """Second half: the stored bytes, once the frames are compressed."""
    stored = bytearray()
    for rec, (part, pieces) in zip(recs, parts):
        enc = [frames[p] if isinstance(p, int) else p for p in pieces]
        if rec["method"] == SPLIT2:
            rec["plane0_len"] = len(enc[0])
        s = b"".join(enc)
        if len(s) > 2 * rec["raw_len"] + 4096:
            s, rec["method"], rec["planes"], rec["plane0_len"] = part, RAW, 0, 0
        rec["stored_off"], rec["stored_len"] = len(stored), len(s)
        stored += s
    return bytes(stored)


def encode_blocks(raw, lengths, methods, level=3):
    """(stored bytes, block records) for raw cut into lengths; block j is coded with methods(j, len) ->
    (method, planes)."""
    items = []
    recs, parts = plan_blocks(raw, lengths, methods, items)
    return finish_blocks(recs, parts, zstd_compress_many(items, level)), recs


METHOD_CYCLE = [(RAW, 0), (ZSTD, 0), (SPLIT2, 0), (SPLIT2, 1), (SPLIT2, 2), (SPLIT2, 3)]


def relayout(src, out, align=None, stripe=None, unit=4 << 20, trunk_to=None, codec2=(), block_size=16384,
             archive=False, minor=1, order=None):
    """Rewrite the KPK file or set at src as out.  stripe: list of directories (one STRIPE member each);
    trunk_to: a directory for a PLAIN member with the globals and trunks; codec2: kinds (names) stored as
    blocks, with methods cycling through RAW, ZSTD and SPLIT2 with every plane combination; archive: add
    archive extents (a vision tensor, a file, a shard header) and the manifest recipe."""
    k = load(src)
    A = align or k.sb["align"]
    ext = []  # (kind, layer, expert, [tensor dicts with data])
    for i, x in enumerate(k.extents):
        raw = k.raw(i)
        ts = []
        for t in k.tensors[x["first_tensor"]:x["first_tensor"] + x["tensor_count"]]:
            ts.append(dict(name=t["name"], dtype=t["dtype"], ndim=t["ndim"], shape=list(t["shape"]),
                           data=raw[t["offset"]:t["offset"] + t["nbytes"]]))
        ext.append((x["kind"], x["layer"], x["expert"], ts))
    man = json.loads(k.manifest)
    if archive and not any(e[0] == ARCHIVE for e in ext):
        rng = np.random.default_rng(5)
        readme = b"# a file of the download\n" * 7
        header = b'{"__metadata__":{"format":"pt"}}  '
        vis = rng.integers(0, 65535, 4 * 24, dtype=np.uint16).astype("<u2").tobytes()
        ext.append((ARCHIVE, NONE32, NONE32, [
            dict(name="vision_tower.blocks.0.attn.qkv.weight", dtype=2, ndim=2, shape=[4, 24, 0, 0], data=vis),
            dict(name="archive/files/README.md", dtype=5, ndim=1, shape=[len(readme), 0, 0, 0], data=readme),
            dict(name="archive/shards/model-00001-of-000002.safetensors/header", dtype=5, ndim=1,
                 shape=[8 + len(header), 0, 0, 0], data=struct.pack("<Q", len(header)) + header)]))
        man["archive"] = {"files": [{"name": "README.md", "kind": "file", "size": len(readme), "sha256": None}],
                          "not_kept": []}
        man.pop("dropped", None)
    if order is not None:
        def key(e):
            kind, L, ex, _ = e
            rank = {META: 0, GLOBALS: 1, ARCHIVE: 3}.get(kind, 2)
            if rank != 2:
                return (rank, 0, 0, 0)
            if order == 1:
                return (2, kind - TRUNK, L, 0 if kind == TRUNK else ex)
            return (2, L, kind - TRUNK, 0 if kind == TRUNK else ex)
        ext.sort(key=key)
    p = Phys()
    p.minor, p.align, p.order = minor, A, k.sb["order"] if order is None else order
    p.compat = k.sb["compat"]
    p.manifest = json.dumps(man, sort_keys=True, indent=1).encode()
    base = os.path.dirname(os.path.realpath(out))
    name = os.path.basename(out)
    members = [dict(role=ENTRY, stripe_index=0xFFFF, path="")]
    trunk_member = None
    if trunk_to:
        trunk_member = len(members)
        members.append(dict(role=PLAIN, stripe_index=0xFFFF,
                            path=os.path.relpath(os.path.join(os.path.realpath(trunk_to), name + ".trunk"), base)))
    if stripe:
        for s, d in enumerate(stripe):
            members.append(dict(role=STRIPE, stripe_index=s,
                                path=os.path.relpath(os.path.join(os.path.realpath(d), "%s.s%d" % (name, s)), base)))
    p.members = members if len(members) > 1 else []
    p.stripe_unit = unit if stripe else 0
    items, pending = [], []
    for e_i, (kind, L, ex, ts) in enumerate(ext):
        if kind in (GLOBALS, TRUNK) and trunk_member is not None:
            target = trunk_member
        elif kind in (GLOBALS, TRUNK, EXPERT) and stripe:
            target = STRIPED
        else:
            target = 0
        x = dict(kind=kind, codec=0, member=target, layer=L, expert=ex, first_tensor=len(p.tensors),
                 tensor_count=len(ts), nblocks=0)
        raw = bytearray()
        for t in ts:
            off = round_up(len(raw), 64)
            raw += bytes(off - len(raw)) + t["data"]
            p.tensors.append(dict(name=t["name"], dtype=t["dtype"], ndim=t["ndim"], shape=t["shape"],
                                  extent=e_i, offset=off, nbytes=len(t["data"])))
        raw = bytes(raw)
        x["raw_len"], x["raw_xxh3"] = len(raw), xxh3(raw)
        if KINDS[kind] in codec2 and len(raw):
            lens = cut_blocks(x, p.tensors[x["first_tensor"]:], block_size)
            pending.append(plan_blocks(raw, lens, lambda j, n, e=e_i: METHOD_CYCLE[(j + e) % len(METHOD_CYCLE)], items))
            x["codec"], x["nblocks"] = 2, len(pending[-1][0])
        else:
            pending.append(raw)
        p.extents.append(x)
    frames = zstd_compress_many(items)
    cursor = {}
    for x, job in zip(p.extents, pending):
        if x["codec"] == 2:
            stored = finish_blocks(job[0], job[1], frames)
            p.blocks += job[0]
        else:
            stored = job
        x["offset"] = cursor.get(x["member"], 0 if x["member"] == STRIPED else A)
        cursor[x["member"]] = x["offset"] + round_up(len(stored), A)
        p.stored.append(stored)
    p.incompat = (F_MEMBERS if len(members) > 1 else 0) | (F_BLOCKS if p.blocks else 0) | \
                 (F_ARCHIVE if any(x["kind"] == ARCHIVE for x in p.extents) else 0) | \
                 (F_CODECS if any(x["codec"] == 1 for x in p.extents) else 0) | \
                 (F_DRAFTER if any(x["kind"] == DRAFTER for x in p.extents) else 0)
    if minor > MINOR:  # fields reserved at our minor that a later one might use: this reader ignores them
        p.sb_patch = {300: b"\x01\x02\x03"}
    serialize(p, out)
    return p


# ---------------------------------------------------------------------------
# Mutations: change one thing and re-seal (serialize recomputes every
# checksum), so that only the rule the change breaks can catch it.
# ---------------------------------------------------------------------------
def _first(p, kind):
    return next(i for i, x in enumerate(p.extents) if x["kind"] == kind)


def _last(p, kind):
    return max(i for i, x in enumerate(p.extents) if x["kind"] == kind)


def _first_block(p, i):
    return sum(e.get("nblocks", 0) for e in p.extents[:i])


def _drop_extent(p, i):
    x = p.extents[i]
    fb = _first_block(p, i)
    del p.blocks[fb:fb + x.get("nblocks", 0)]
    del p.tensors[x["first_tensor"]:x["first_tensor"] + x["tensor_count"]]
    del p.extents[i]
    del p.stored[i]
    ft = 0
    for j, e in enumerate(p.extents):
        e["first_tensor"] = ft
        for t in p.tensors[ft:ft + e["tensor_count"]]:
            t["extent"] = j
        ft += e["tensor_count"]
    return describe(x)


def _set_byte(p, i, pos, xor):
    s = bytearray(p.stored[i])
    s[pos] ^= xor
    p.stored[i] = bytes(s)


def _gap_nonzero(p, a):
    """A non-zero byte in a gap between two tensors of an uncompressed extent."""
    for i, x in enumerate(p.extents):
        ts = p.tensors[x["first_tensor"]:x["first_tensor"] + x["tensor_count"]]
        for t, u in zip(ts, ts[1:]):
            if x["codec"] == 0 and t["offset"] + t["nbytes"] < u["offset"]:
                _set_byte(p, i, t["offset"] + t["nbytes"], 0x5A)
                return "%s, decoded offset %d" % (describe(x), t["offset"] + t["nbytes"])
    raise SystemExit("no gap between tensors")


def _block_with(p, method):
    for i, x in enumerate(p.extents):
        fb = _first_block(p, i)
        for j, b in enumerate(p.blocks[fb:fb + x.get("nblocks", 0)]):
            if b["method"] == method and b["stored_len"] > 40:
                return i, j, b
    raise SystemExit("no block of method %d" % method)


def _block_tamper(p, a):
    """A byte inside a zstd-coded block changed: the stored checksum is re-sealed, decoding catches it."""
    i, j, b = _block_with(p, ZSTD)
    _set_byte(p, i, b["stored_off"] + b["stored_len"] // 2, 0x55)
    return "%s, block %d" % (describe(p.extents[i]), j)


def _raw_block_flip(p, a):
    """A byte of a raw block changed: its decoded checksum no longer matches."""
    i, j, b = _block_with(p, RAW)
    _set_byte(p, i, b["stored_off"] + 3, 0x01)
    return "%s, block %d" % (describe(p.extents[i]), j)


def _layer_beyond(p, a):
    """The last trunk extent renumbered (tensor names too) past the config's layers."""
    i = _last(p, TRUNK)
    x = p.extents[i]
    new = int(a) if a else max(e["layer"] for e in p.extents if e["kind"] in (TRUNK, EXPERT)) + 1
    old_p, new_p = "language_model.model.layers.%d." % x["layer"], "language_model.model.layers.%d." % new
    for t in p.tensors[x["first_tensor"]:x["first_tensor"] + x["tensor_count"]]:
        t["name"] = new_p + t["name"][len(old_p):]
    x["layer"] = new
    return "layer %d trunk" % new


def _expert_beyond(p, a):
    """The last expert extent renumbered (tensor names too) past the config's experts."""
    i = _last(p, EXPERT)
    x = p.extents[i]
    new = int(a) if a else max(e["expert"] for e in p.extents if e["kind"] == EXPERT) + 1
    old_s, new_s = ".experts.%d." % x["expert"], ".experts.%d." % new
    for t in p.tensors[x["first_tensor"]:x["first_tensor"] + x["tensor_count"]]:
        t["name"] = t["name"].replace(old_s, new_s, 1)
    x["expert"] = new
    return "layer %d expert %d" % (x["layer"], new)


def _dtype_swap(p, a):
    t = next(t for t in p.tensors if t["dtype"] == 2 and t["name"].startswith("language_model.model.layers."))
    t["dtype"] = 3
    return t["name"]


def _shape_swap(p, a):
    t = next(t for t in p.tensors if t["ndim"] == 2 and t["shape"][0] != t["shape"][1] and t["dtype"] == 2)
    t["shape"][0], t["shape"][1] = t["shape"][1], t["shape"][0]
    return t["name"]


def _grow_tensor(p, a):
    """A tensor's first dimension grown by one row into the gap after it (shape and nbytes agree)."""
    for x in p.extents:
        ts = p.tensors[x["first_tensor"]:x["first_tensor"] + x["tensor_count"]]
        for t, u in zip(ts, ts[1:]):
            r = row_size(t)
            if x["kind"] == TRUNK and t["offset"] + t["nbytes"] + r <= u["offset"]:
                t["shape"][0] += 1
                t["nbytes"] += r
                return t["name"]
    raise SystemExit("no tensor with room for a row")


def _grow_extent(p, a):
    """An extent's stored (and decoded) bytes grown by zeros into its padding."""
    for i, x in enumerate(p.extents):
        if x["codec"] == 0 and x["kind"] == TRUNK and len(p.stored[i]) % p.align and \
                round_up(len(p.stored[i]) + 64, p.align) == round_up(len(p.stored[i]), p.align):
            p.stored[i] += bytes(64)
            return describe(x)
    raise SystemExit("no extent with room in its padding")


def _block_row(p, a):
    """A codec-2 extent re-cut so a block boundary falls inside a row."""
    for i, x in enumerate(p.extents):
        if x["codec"] != 2:
            continue
        ts = p.tensors[x["first_tensor"]:x["first_tensor"] + x["tensor_count"]]
        t = next((t for t in ts if row_size(t) > 2 and t["nbytes"] > 2 * row_size(t)), None)
        if t is None:
            continue
        fb = _first_block(p, i)
        raw = decode_stored(x, p.blocks[fb:fb + x["nblocks"]], p.stored[i])
        cut = t["offset"] + row_size(t) + 2
        stored, recs = encode_blocks(raw, [cut, len(raw) - cut], lambda j, n: (RAW, 0))
        p.blocks[fb:fb + x["nblocks"]] = recs
        x["nblocks"] = 2
        p.stored[i] = stored
        _repack(p)
        return "%s cut at %d inside %s" % (describe(x), cut, t["name"])
    raise SystemExit("no codec-2 extent with multi-byte rows")


def _repack(p):
    """Offsets again, extent after extent in each target, after a mutation changed a stored length."""
    cursor = {}
    for i, x in enumerate(p.extents):
        x["offset"] = cursor.get(x["member"], 0 if x["member"] == STRIPED else p.align)
        cursor[x["member"]] = x["offset"] + round_up(len(p.stored[i]), p.align)


def _spread(p, a):
    """A valid but unusual layout: the tensors of every uncompressed trunk extent moved 64 bytes apart
    (zero gaps between them), so the extent's decoded bytes differ from the canonical layout."""
    n = 0
    for i, x in enumerate(p.extents):
        if x["kind"] != TRUNK or x["codec"] != 0:
            continue
        raw, out = p.stored[i], bytearray()
        for t in p.tensors[x["first_tensor"]:x["first_tensor"] + x["tensor_count"]]:
            data = raw[t["offset"]:t["offset"] + t["nbytes"]]
            off = round_up(len(out), 64) + 64
            out += bytes(off - len(out)) + data
            t["offset"] = off
        p.stored[i] = bytes(out)
        n += 1
    _repack(p)
    return "%d trunk extents spread out" % n


def _data_flip(p, a):
    """One byte in the middle of a tensor (arg: its name; default the first trunk tensor of an uncompressed
    extent) flipped, every checksum re-sealed: a valid file holding other data, which only a comparison
    with the original bytes (a SHA-256 of a rebuilt file) can tell."""
    for t in p.tensors:
        x = p.extents[t["extent"]]
        if x["codec"] != 0 or not t["nbytes"] or (a and t["name"] != a) or (not a and x["kind"] != TRUNK):
            continue
        at = t["offset"] + t["nbytes"] // 2
        s = bytearray(p.stored[t["extent"]])
        s[at] ^= 0x10
        p.stored[t["extent"]] = bytes(s)
        return "%s: byte %d of %s flipped" % (describe(x), at - t["offset"], t["name"])
    raise SystemExit("no uncompressed tensor %s" % (a or "in a trunk extent"))


def _newer_and_damaged(p, a):
    """Two problems: an extent placed over the one before it (damage), and, later in the table, an
    extent of an unknown kind (newer format): the unknown value decides (§3, order of the checks)."""
    i = next(i for i in range(1, len(p.extents)) if p.extents[i]["member"] == p.extents[i - 1]["member"])
    p.extents[i]["offset"] = p.extents[i - 1]["offset"]
    p.extents[-1]["kind"] = 7
    return "extent %d moved onto extent %d, and extent %d of kind 7" % (i, i - 1, len(p.extents) - 1)


def _member_path(p, a):
    """Member 1's path written with another spelling of the same place (arg: 'dot' ./x, 'empty' x//y)."""
    old = p.members[1]["path"]
    p.members[1]["path"] = "./" + old if a == "dot" else old.replace("/", "//", 1) if "/" in old else old + "//"
    return "member 1: %s -> %s" % (old, p.members[1]["path"])


def _recipe_edit(p, fn):
    m = json.loads(p.manifest)
    f = m["archive"]["files"][0]
    old = dict(f)
    fn(f)
    p.manifest = json.dumps(m, sort_keys=True, indent=1).encode()
    return "recipe file %s: %s" % (old["name"], ", ".join("%s %r" % (k, f[k]) for k in f if f[k] != old.get(k)))


def _recipe_name(p, a):
    """The first file of the archive recipe renamed to arg (its tensors keep their names)."""
    return _recipe_edit(p, lambda f: f.update(name=a))


MUTATIONS = {
    # the container's structure: the reader refuses (damage, exit 1)
    "drop-meta": ("the meta extent removed", lambda p, a: _drop_extent(p, _first(p, META))),
    "drop-globals": ("the globals extent removed", lambda p, a: _drop_extent(p, _first(p, GLOBALS))),
    "two-globals": ("the meta extent relabelled globals", lambda p, a: p.extents[_first(p, META)].update(kind=GLOBALS)),
    "name-wrong-layer": ("a trunk tensor renamed into another layer", lambda p, a: p.tensors[
        p.extents[_first(p, TRUNK)]["first_tensor"]].update(name=p.tensors[p.extents[_first(p, TRUNK)]["first_tensor"]][
            "name"].replace(".layers.%d." % p.extents[_first(p, TRUNK)]["layer"], ".layers.4095.", 1))),
    "expert-in-trunk": ("an expert tensor name in a trunk extent", lambda p, a: p.tensors[
        p.extents[_first(p, TRUNK)]["first_tensor"]].update(name="language_model.model.layers.%d.block_sparse_moe."
                                                             "experts.0.w9" % p.extents[_first(p, TRUNK)]["layer"])),
    "meta-unknown": ("the meta extent's last file renamed meta/evil.sh (issue 34.11)", lambda p, a: p.tensors[
        p.extents[_first(p, META)]["first_tensor"] + p.extents[_first(p, META)]["tensor_count"] - 1].update(name="meta/evil.sh")),
    "grow-extent": ("an extent's stored and decoded length grown into its padding", _grow_extent),
    "grow-strings": ("the string pool grown by a NUL", None),
    "reserved-sb": ("a reserved superblock byte set", lambda p, a: p.sb_patch.update({1000: b"\x01"})),
    "reserved-tensor": ("a tensor record's reserved bytes set", lambda p, a: p.tensors[3].update(reserved=1)),
    "reserved-block": ("a block record's reserved bytes set", lambda p, a: p.blocks[0].update(reserved2=7)),
    "reserved-member": ("a member record's reserved bytes set", lambda p, a: p.members[1].update(reserved2=1)),
    "overlap": ("an expert extent moved onto the extent before it in its file", lambda p, a: p.extents[_last(p, EXPERT)].update(
        offset=max(x["offset"] for x in p.extents[:_last(p, EXPERT)] if x["member"] == p.extents[_last(p, EXPERT)]["member"]))),
    "data-bytes": ("the superblock's data_bytes off by one",
                   lambda p, a: p.keep.update(data_bytes=sum(len(s) for s in p.stored) + 1)),
    "block-untiled": ("a block record's raw_off moved", lambda p, a: p.blocks[1].update(raw_off=p.blocks[1]["raw_off"] + 2)),
    "block-row": ("a block boundary moved inside a row", _block_row),
    "feature-unused": ("the ARCHIVE bit set with no archive extent", lambda p, a: setattr(p, "incompat", p.incompat | F_ARCHIVE)),
    "stripe-index": ("two stripe members with the same stripe index",
                     lambda p, a: [m for m in p.members if m["role"] == STRIPE][1].update(record=dict(stripe_index=0))),
    # checksummed bytes the deep check refuses (damage, exit 1)
    "gap-nonzero": ("a non-zero byte between two tensors", _gap_nonzero),
    "manifest-garbage": ("the manifest replaced by non-JSON", lambda p, a: setattr(p, "manifest", b"not json {")),
    "block-tamper": ("a byte of a zstd block changed (stored checksum re-sealed)", _block_tamper),
    "raw-block-flip": ("a byte of a raw block changed (stored checksum re-sealed)", _raw_block_flip),
    # values of a newer format (exit 2)
    "unknown-kind": ("an extent of kind 7", lambda p, a: p.extents[-1].update(kind=7)),
    "unknown-codec": ("an extent with codec 3", lambda p, a: p.extents[_first(p, EXPERT)].update(codec=3)),
    "unknown-dtype": ("a tensor of dtype 9", lambda p, a: p.tensors[5].update(dtype=9)),
    "unknown-method": ("a block with method 3", lambda p, a: p.blocks[0].update(method=3)),
    "unknown-incompat": ("an unknown incompat bit", lambda p, a: setattr(p, "incompat", p.incompat | 0x100)),
    "unknown-role": ("a member with role 3", lambda p, a: p.members[1].update(record=dict(role=3))),
    "newer-and-damaged": ("an overlapping extent, then one of kind 7: newer format wins", _newer_and_damaged),
    # FORMAT 1.1 points settled by issue 25
    "minor0-features": ("a version 1.0 (minor 0) file that uses 1.1 features", lambda p, a: setattr(p, "minor", 0)),
    "member-path-dot": ("a member path with a '.' component", lambda p, a: _member_path(p, "dot")),
    "member-path-empty": ("a member path with an empty component (//)", lambda p, a: _member_path(p, "empty")),
    "recipe-size": ("the recipe's first file one byte longer than its pieces",
                    lambda p, a: _recipe_edit(p, lambda f: f.update(size=f["size"] + 1))),
    "recipe-name": ("the recipe's first file renamed to ARG (e.g. ../x, /abs, a//b, ./a)", _recipe_name),
    # valid files of an unusual shape (a writer other than kpack could make them), or holding other data
    "data-flip": ("(valid) a byte of a tensor flipped, re-sealed: only a comparison with the source shows it", _data_flip),
    "spread": ("(valid) tensors of the trunk extents spread 64 bytes apart", _spread),
    # the model (format/k3_check.c, run by kpack verify: damage, exit 1)
    "layer-beyond": ("the last trunk extent renumbered past the config's layers", _layer_beyond),
    "expert-beyond": ("the last expert extent renumbered past the config's experts", _expert_beyond),
    "dtype-swap": ("a BF16 tensor relabelled F16", _dtype_swap),
    "shape-swap": ("a 2-D tensor's shape transposed", _shape_swap),
    "grow-tensor": ("a tensor grown by a row into the gap after it", _grow_tensor),
}


def mutate(src, out, name, arg=None):
    """Load src, apply the mutation, write out re-sealed; returns what was changed."""
    k = load(src)
    p = from_kpk(k)
    if name == "grow-strings":
        serialize(p, out)
        return _grow_pool(out)
    r = MUTATIONS[name][1](p, arg)
    serialize(p, out)
    return r


def _grow_pool(out):
    """Append a NUL to the string pool of the entry file at out and re-seal its superblocks."""
    with open(out, "rb") as fh:
        img = bytearray(fh.read())
    f = sb_decode(img[:SB])
    so, sl = f["strings_off"], f["strings_len"]
    if round_up(so + sl + 1, 4096) > f["manifest_off"]:
        raise SystemExit("no room to grow the string pool")
    f["strings_len"] = sl + 1
    f["strings_xxh3"] = xxh3(bytes(img[so:so + sl + 1]))
    blk = sb_encode(f)
    img[:SB] = blk
    img[len(img) - SB:] = blk
    with open(out, "wb") as fh:
        fh.write(img)
    return "string pool %d -> %d bytes" % (sl, sl + 1)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------
def main(argv):
    ap = argparse.ArgumentParser(prog="kpk.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("file")
    c.add_argument("--shallow", action="store_true")
    c.add_argument("--json", action="store_true")
    c = sub.add_parser("cat")
    c.add_argument("file")
    c.add_argument("name")
    c = sub.add_parser("tensors")
    c.add_argument("file")
    c = sub.add_parser("relayout", help="rewrite a KPK file with another layout")
    c.add_argument("src")
    c.add_argument("out")
    c.add_argument("--align", type=int)
    c.add_argument("--order", choices=["layer-major", "trunk-first"])
    c.add_argument("--stripe", help="DIR,DIR,...: one stripe member per directory")
    c.add_argument("--unit", type=int, default=4 << 20, help="stripe unit in bytes")
    c.add_argument("--trunk-to", help="DIR: a plain member with the globals and trunk extents")
    c.add_argument("--codec2", default="", help="kinds stored as blocks: meta,globals,trunk,expert,archive or all")
    c.add_argument("--block-size", type=int, default=16384)
    c.add_argument("--archive", action="store_true", help="add archive extents and the manifest recipe")
    c.add_argument("--minor", type=int, default=1, help="minor version to write (>2, newer than this reader: with reserved bytes set)")
    c = sub.add_parser("mutate")
    c.add_argument("src")
    c.add_argument("out")
    c.add_argument("mutation", choices=sorted(MUTATIONS))
    c.add_argument("arg", nargs="?")
    c = sub.add_parser("mutate-many", help="OUTDIR/NAME.kpk for each mutation NAME; prints NAME<TAB>what")
    c.add_argument("src")
    c.add_argument("outdir")
    c.add_argument("mutation", nargs="+", choices=sorted(MUTATIONS))
    c = sub.add_parser("check-many", help="check each file; prints FILE<TAB>exit code<TAB>first problem")
    c.add_argument("files", nargs="+")
    sub.add_parser("mutations")
    sub.add_parser("xxh3", help="XXH3-64 of stdin in hex")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "mutations":
            for n, (d, _) in sorted(MUTATIONS.items()):
                print("%-18s %s" % (n, d))
            return 0
        if a.cmd == "xxh3":
            print("%016x" % xxh3(sys.stdin.buffer.read()))
            return 0
        if a.cmd == "relayout":
            kinds = ("meta", "globals", "trunk", "expert", "archive") if a.codec2 == "all" else \
                tuple(s for s in a.codec2.split(",") if s)
            relayout(a.src, a.out, align=a.align, stripe=a.stripe.split(",") if a.stripe else None, unit=a.unit,
                     trunk_to=a.trunk_to, codec2=kinds, block_size=a.block_size, archive=a.archive, minor=a.minor,
                     order=None if a.order is None else int(a.order == "trunk-first"))
            return 0
        if a.cmd == "mutate-many":
            os.makedirs(a.outdir, exist_ok=True)
            for m in a.mutation:
                print("%s\t%s" % (m, mutate(a.src, os.path.join(a.outdir, m + ".kpk"), m) or m))
            return 0
        if a.cmd == "check-many":
            for f in a.files:
                try:
                    probs = load(f).check_data()
                    print("%s\t%d\t%s" % (f, 1 if probs else 0, probs[0] if probs else "OK"))
                except KpkError as e:
                    print("%s\t%d\t%s: %s" % (f, e.exit_code, e.cls, e))
            return 0
        if a.cmd == "mutate":
            r = mutate(a.src, a.out, a.mutation, a.arg)
            if r:
                print(r)
            return 0
        k = load(a.file)
        if a.cmd == "cat":
            sys.stdout.buffer.write(k.tensor_bytes(a.name))
            return 0
        if a.cmd == "tensors":
            for t in k.tensors:
                print("%s\t%s\t%s\t%s" % (t["name"], DTYPE_NAME[t["dtype"]], ",".join(map(str, t["shape"][:t["ndim"]])),
                                          hashlib.sha256(k.tensor_bytes(t["name"])).hexdigest()))
            return 0
        probs = k.check_data(shallow=a.shallow)
        if a.json:
            print(json.dumps({"ok": not probs, "problems": probs, "members": k.sb["member_count"],
                              "extents": len(k.extents), "blocks": len(k.blocks)}))
        else:
            for pr in probs:
                print(pr)
            print("%s: %s" % (a.file, "CORRUPT" if probs else "OK"))
        return 1 if probs else 0
    except KpkError as e:
        print("kpk.py: %s: %s" % (e.cls, e), file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/python3
"""Read, edit and re-seal KPK 1.0 files (docs/FORMAT.md), independently of
format/: the soak campaign's structural mutations and the tests that need a
file whose checksums are all right and whose structure is not.

Re-sealing recomputes everything a writer derives: each extent's stored and
raw XXH3 over its (possibly edited) bytes, data_bytes, the four section
checksums, set_id, the superblock checksum, and the backup superblock. So a
re-sealed file differs from a valid one only by the edit itself.

    kpkseal.py set-config IN.kpk OUT.kpk KEY=VALUE...   edit the embedded config.json
        (text_config or root, as the file has it) and re-seal
    kpkseal.py reseal IN.kpk OUT.kpk                    re-seal (identical for a valid file)
    kpkseal.py dump IN.kpk                              superblock, extents, tensors

The module is the soak's re-sealer (tests/soak/soak.py); when tests/ref/kpk.py
(the FORMAT.md 1.1 reference reader/writer) lands, soak.py can take its
mutate + re-seal mode instead: keep the interface (Kpk.load, field edits on
.sb / .extents / .tensors / .strings / .manifest / raw bytes, Kpk.seal).
XXH3-64 comes from the system libxxhash (the library kpack links)."""
import ctypes, ctypes.util, json, struct, sys

_xx = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
_xx.XXH3_64bits.restype = ctypes.c_uint64
_xx.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def xxh3(b):
    return _xx.XXH3_64bits(bytes(b), len(b))


SB = 4096
# superblock fields of 1.0: name -> (offset, struct code)
SB_FIELDS = {
    "magic": (0, "8s"), "major": (8, "<H"), "minor": (10, "<H"), "superblock_size": (12, "<I"),
    "incompat": (16, "<I"), "compat": (20, "<I"), "align": (24, "<I"), "order": (28, "<I"),
    "file_size": (32, "<Q"), "set_id": (40, "<Q"), "member_index": (48, "<H"), "member_count": (50, "<H"),
    "reserved52": (52, "<I"),
    "extent_table_off": (56, "<Q"), "extent_count": (64, "<Q"), "extent_table_xxh3": (72, "<Q"),
    "tensor_table_off": (80, "<Q"), "tensor_count": (88, "<Q"), "tensor_table_xxh3": (96, "<Q"),
    "strings_off": (104, "<Q"), "strings_len": (112, "<Q"), "strings_xxh3": (120, "<Q"),
    "manifest_off": (128, "<Q"), "manifest_len": (136, "<Q"), "manifest_xxh3": (144, "<Q"),
    "data_bytes": (152, "<Q"),
}
EXT_FIELDS = {
    "kind": (0, "<B"), "codec": (1, "<B"), "member": (2, "<H"), "layer": (4, "<I"), "expert": (8, "<I"),
    "reserved12": (12, "<I"), "offset": (16, "<Q"), "stored_len": (24, "<Q"), "raw_len": (32, "<Q"),
    "stored_xxh3": (40, "<Q"), "raw_xxh3": (48, "<Q"), "first_tensor": (56, "<I"), "tensor_count": (60, "<I"),
}
TEN_FIELDS = {
    "name_off": (0, "<I"), "name_len": (4, "<I"), "dtype": (8, "<B"), "ndim": (9, "<B"), "reserved10": (10, "<H"),
    "extent": (12, "<I"), "offset": (16, "<Q"), "nbytes": (24, "<Q"),
    "shape0": (32, "<Q"), "shape1": (40, "<Q"), "shape2": (48, "<Q"), "shape3": (56, "<Q"),
}
KINDS = {1: "meta", 2: "globals", 3: "trunk", 4: "expert"}


def get(buf, off, code):
    return struct.unpack_from(code, buf, off)[0]


def put(buf, off, code, v):
    struct.pack_into(code, buf, off, v)


class Kpk:
    """The whole file in memory (a bytearray); fields are read and written in place."""

    def __init__(self, data):
        self.b = bytearray(data)

    @classmethod
    def load(cls, path):
        with open(path, "rb") as f:
            return cls(f.read())

    def save(self, path):
        with open(path, "wb") as f:
            f.write(self.b)

    # ---- field access -------------------------------------------------------
    def sb(self, name):
        off, code = SB_FIELDS[name]
        return get(self.b, off, code)

    def set_sb(self, name, v):
        off, code = SB_FIELDS[name]
        put(self.b, off, code, v)

    def ext_off(self, i):
        return self.sb("extent_table_off") + 64 * i

    def ext(self, i, name):
        off, code = EXT_FIELDS[name]
        return get(self.b, self.ext_off(i) + off, code)

    def set_ext(self, i, name, v):
        off, code = EXT_FIELDS[name]
        put(self.b, self.ext_off(i) + off, code, v)

    def ten_off(self, i):
        return self.sb("tensor_table_off") + 64 * i

    def ten(self, i, name):
        off, code = TEN_FIELDS[name]
        return get(self.b, self.ten_off(i) + off, code)

    def set_ten(self, i, name, v):
        off, code = TEN_FIELDS[name]
        put(self.b, self.ten_off(i) + off, code, v)

    def n_extents(self):
        return self.sb("extent_count")

    def n_tensors(self):
        return self.sb("tensor_count")

    def tensor_name(self, i):
        a = self.sb("strings_off") + self.ten(i, "name_off")
        return bytes(self.b[a:a + self.ten(i, "name_len")]).decode("utf-8", "replace")

    def extent_data(self, i):
        a = self.ext(i, "offset")
        return self.b[a:a + self.ext(i, "stored_len")]

    def find_tensor(self, name):
        for i in range(self.n_tensors()):
            if self.tensor_name(i) == name:
                return i
        raise KeyError(name)

    # ---- re-sealing -----------------------------------------------------------
    def _section_hash(self, off_field, len_bytes):
        a = self.sb(off_field)
        if a + len_bytes > len(self.b):
            return None                      # out of the file: leave the old checksum
        return xxh3(self.b[a:a + len_bytes])

    def seal(self, keep=()):
        """Recompute every derived field except those named in keep
        (e.g. keep={"data_bytes"} when the edit is data_bytes itself)."""
        n_ext = self.n_extents()
        ext_end = self.sb("extent_table_off") + 64 * n_ext
        if ext_end <= len(self.b) and n_ext <= (1 << 24):
            total = 0
            for i in range(n_ext):
                a, n = self.ext(i, "offset"), self.ext(i, "stored_len")
                total = (total + n) & (2**64 - 1)
                if a + n <= len(self.b) and ("extent_hash", i) not in keep:
                    h = xxh3(self.b[a:a + n])
                    self.set_ext(i, "stored_xxh3", h)
                    if self.ext(i, "codec") == 0:
                        self.set_ext(i, "raw_xxh3", h)
            if "data_bytes" not in keep:
                self.set_sb("data_bytes", total)
        for sect, ln in (("extent_table", 64 * n_ext), ("tensor_table", 64 * self.n_tensors()),
                         ("strings", self.sb("strings_len")), ("manifest", self.sb("manifest_len"))):
            name = sect + "_xxh3"
            if name in keep:
                continue
            h = self._section_hash(sect + "_off", ln)
            if h is not None:
                self.set_sb(name, h)
        if "set_id" not in keep:
            self.set_sb("set_id", self.sb("extent_table_xxh3") ^ self.sb("tensor_table_xxh3"))
        put(self.b, 4088, "<Q", xxh3(self.b[0:4088]))
        if len(self.b) >= 2 * SB:
            self.b[len(self.b) - SB:] = self.b[0:SB]

    # ---- the embedded config ------------------------------------------------------
    def set_config(self, edits):
        """Replace meta/config.json by an edited copy of the same length (padded
        with spaces, which JSON ignores) and re-seal."""
        t = self.find_tensor("meta/config.json")
        e = self.ten(t, "extent")
        a = self.ext(e, "offset") + self.ten(t, "offset")
        n = self.ten(t, "nbytes")
        cfg = json.loads(bytes(self.b[a:a + n]))
        scope = cfg.get("text_config", cfg)
        for k, v in edits.items():
            where = scope
            if k not in scope and "linear_attn_config" in scope and k in scope["linear_attn_config"]:
                where = scope["linear_attn_config"]
            where[k] = v
        text = json.dumps(cfg, separators=(",", ":")).encode()
        if len(text) > n:
            raise SystemExit("the edited config.json is longer than the original")
        self.b[a:a + n] = text + b" " * (n - len(text))
        self.seal()

    def dump(self):
        for k in SB_FIELDS:
            v = self.sb(k)
            print("sb", k, v if not isinstance(v, bytes) else v.hex())
        for i in range(self.n_extents()):
            print("extent", i, KINDS.get(self.ext(i, "kind"), "?"), {k: self.ext(i, k) for k in EXT_FIELDS})
        for i in range(self.n_tensors()):
            print("tensor", i, self.tensor_name(i), {k: self.ten(i, k) for k in TEN_FIELDS})


def parse_value(s):
    try:
        return json.loads(s)
    except ValueError:
        return s


def main(argv):
    if len(argv) >= 4 and argv[1] == "set-config":
        k = Kpk.load(argv[2])
        k.set_config(dict((kv.split("=", 1)[0], parse_value(kv.split("=", 1)[1])) for kv in argv[4:]))
        k.save(argv[3])
    elif len(argv) == 4 and argv[1] == "reseal":
        k = Kpk.load(argv[2])
        k.seal()
        k.save(argv[3])
    elif len(argv) == 3 and argv[1] == "dump":
        Kpk.load(argv[2]).dump()
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)

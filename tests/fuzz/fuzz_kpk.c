/* A KPK file from arbitrary bytes: kpk_open (superblocks, directory, every
 * structural rule), then what `kpack verify` and krun do with a file that
 * opened: every extent checked on disk (hash and zero padding), decoded where
 * small, every tensor looked up by name, the embedded files read, and the
 * schema check (every tensor the embedded config implies, with its dtype,
 * shape and extent).  Whatever opens must keep its promises: extents inside
 * the data area, tensors inside their extents.
 *
 * Every input is tried twice: as it is, and re-sealed (every checksum and
 * derived field recomputed, as tests/soak/kpkseal.py does), because almost
 * any mutation breaks a checksum and would never reach the structural rules
 * behind it. */
#include "fuzz.h"

#include "format/kpk_reader.h"
#include "run/model/model.h"

#include <string.h>
#include <xxhash.h>

#define SCRATCH (64u << 10)
/* A codec extent is decoded whole into a buffer of raw_len bytes; the
 * fuzzer's inputs are small, so a larger claim is not followed (a 1.1 block
 * is at most 64 MiB, and a reader must not trust raw_len further). */
#define DECODE_MAX (64u << 20)

static int code_known(int c) { return c > KPK_OK && c <= KPK_EINVAL; }

/* 1 if the file passed everything */
static int check_file(const uint8_t *data, size_t size)
{
    static uint8_t scratch[SCRATCH];
    char path[64];
    krun_err err;
    kpk_file *f;
    kpk_err e = {0};
    const kpk_superblock *sb;
    int all_ok = 1;
    k3_model m;

    if (fuzz_as_file(data, size, path)) return 0;
    if (kpk_open(path, &f, &e)) {
        FUZZ_CHECK(code_known(e.code) && e.msg[0]);
        return 0;
    }
    sb = kpk_super(f);
    FUZZ_CHECK(kpk_size(f) == size && sb->file_size == size && size % KPK_SUPERBLOCK_SIZE == 0);
    FUZZ_CHECK(sb->extent_table_off <= size - KPK_SUPERBLOCK_SIZE);
    for (uint32_t i = 0; i < kpk_extent_count(f); i++) {
        const kpk_extent *x = kpk_extent_at(f, i);
        FUZZ_CHECK(x->offset % sb->align == 0 && x->offset >= sb->align);
        FUZZ_CHECK(x->offset + kpk_extent_padded_len(f, x) <= sb->extent_table_off);
        if (kpk_extent_verify(f, i, scratch, sizeof scratch, &e)) {
            FUZZ_CHECK(code_known(e.code) && e.msg[0]);
            all_ok = 0;
        }
        /* the read path krun takes; for codec 0 the verify above already
         * hashed the same bytes, so only small extents go through it again */
        if (x->raw_len <= DECODE_MAX && (x->codec != KPK_CODEC_NONE || x->stored_len <= 16384)) {
            uint8_t *raw = malloc(x->raw_len ? x->raw_len : 1);
            FUZZ_CHECK(raw != NULL);
            if (kpk_extent_read(f, i, raw, 1, &e)) all_ok = 0;
            free(raw);
        }
    }
    for (uint64_t i = 0; i < kpk_tensor_count(f); i++) {
        kpk_tensor t, u;
        const kpk_extent *x;
        FUZZ_CHECK(kpk_tensor_at(f, i, &t) == 0);
        FUZZ_CHECK(t.name && strlen(t.name) == t.name_len);
        FUZZ_CHECK(t.extent < kpk_extent_count(f));
        x = kpk_extent_at(f, t.extent);
        FUZZ_CHECK(i >= x->first_tensor && i - x->first_tensor < x->tensor_count);
        FUZZ_CHECK(t.offset <= x->raw_len && t.nbytes <= x->raw_len - t.offset);
        FUZZ_CHECK(kpk_find_tensor(f, t.name, &u) == (int64_t)i && u.offset == t.offset);
    }
    {
        static const char *const names[] = {"config.json", "tiktoken.model", "tokenizer_config.json"};
        for (int k = 0; k < 3; k++) {
            char *buf = NULL;
            size_t len = 0;
            if (kpk_meta_file(f, names[k], &buf, &len, &e) == 0) FUZZ_CHECK(buf && buf[len] == 0);
            free(buf);
        }
    }
    err.msg[0] = 0;
    if (k3_model_open(f, &m, &err) == 0) {
        FUZZ_CHECK(kpk_layer_count(f) >= (uint32_t)m.cfg.n_layers);
        k3_model_close(&m);
    } else {
        FUZZ_CHECK(err.msg[0]);
        all_ok = 0;
    }
    kpk_close(f);
    return all_ok;
}

static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }

/* The hash of [off, off + len) of b, or keep the old value if out of range. */
static void seal_range(uint8_t *b, size_t n, uint64_t off, uint64_t len, uint8_t *field)
{
    if (off <= n && len <= n - off) put64(field, XXH3_64bits(b + off, (size_t)len));
}

/* Recompute what a writer derives (FORMAT.md §3, §4): each extent's stored
 * and (codec 0) raw XXH3, data_bytes, the section checksums, set_id, the
 * superblock checksum, the backup copy.  Offsets are the 1.0 layout's. */
static void reseal(uint8_t *b, size_t n)
{
    uint64_t ext_off = get64(b + 56), ext_n = get64(b + 64), data = 0;
    if (ext_off <= n && ext_n <= (n - ext_off) / KPK_EXTENT_RECORD_SIZE) {
        for (uint64_t i = 0; i < ext_n; i++) {
            uint8_t *r = b + ext_off + i * KPK_EXTENT_RECORD_SIZE;
            data += get64(r + 24);
            seal_range(b, n, get64(r + 16), get64(r + 24), r + 40);
            if (r[1] == KPK_CODEC_NONE) memcpy(r + 48, r + 40, 8);
        }
        put64(b + 152, data);
    }
    if (ext_n <= n / KPK_EXTENT_RECORD_SIZE) seal_range(b, n, ext_off, ext_n * KPK_EXTENT_RECORD_SIZE, b + 72);
    if (get64(b + 88) <= n / KPK_TENSOR_RECORD_SIZE) seal_range(b, n, get64(b + 80), get64(b + 88) * KPK_TENSOR_RECORD_SIZE, b + 96);
    seal_range(b, n, get64(b + 104), get64(b + 112), b + 120);
    seal_range(b, n, get64(b + 128), get64(b + 136), b + 144);
    put64(b + 40, get64(b + 72) ^ get64(b + 96));
    put64(b + KPK_SB_CHECKSUM_OFF, XXH3_64bits(b, KPK_SB_CHECKSUM_OFF));
    memcpy(b + n - KPK_SUPERBLOCK_SIZE, b, KPK_SUPERBLOCK_SIZE);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy;
    if (check_file(data, size)) fuzz_accepted++; /* counted as given, not as re-sealed */
    if (size < 2 * KPK_SUPERBLOCK_SIZE || !(copy = malloc(size))) return 0;
    memcpy(copy, data, size);
    reseal(copy, size);
    check_file(copy, size);
    free(copy);
    return 0;
}

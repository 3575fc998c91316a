/* KPK: the container kpack writes and krun reads.  docs/FORMAT.md is the
 * normative description; this header mirrors it field for field.  All
 * integers on disk are little-endian; the structs below are the decoded,
 * in-memory form (never read or written with memcpy of the struct). */
#ifndef KPK_H
#define KPK_H

#include <stddef.h>
#include <stdint.h>

/* ---- constants ---------------------------------------------------------- */

/* 0x89 'K' 'P' 'K' CR LF 0x1A LF: the high byte catches 7-bit transports, the
 * CR LF pair catches newline conversion, 0x1A stops DOS `type`. */
#define KPK_MAGIC "\x89KPK\r\n\x1a\n"
#define KPK_MAGIC_LEN 8
#define KPK_VERSION_MAJOR 1
#define KPK_VERSION_MINOR 0

#define KPK_SUPERBLOCK_SIZE 4096u     /* both copies; the file size is a multiple of this */
#define KPK_SB_CHECKSUM_OFF 4088u     /* XXH3-64 of bytes [0, 4088) */
#define KPK_EXTENT_RECORD_SIZE 64u
#define KPK_TENSOR_RECORD_SIZE 64u
#define KPK_TENSOR_ALIGN 64u          /* every tensor starts 64-byte aligned inside its extent */
#define KPK_SECTION_ALIGN 4096u       /* directory sections start on 4 KiB boundaries */
#define KPK_ALIGN_MIN 4096u
#define KPK_ALIGN_MAX (2u << 20)
#define KPK_NONE 0xFFFFFFFFu          /* "no layer" / "no expert" */
#define KPK_META_PREFIX "meta/"       /* names of embedded files: "meta/config.json" */
#define KPK_MAX_LAYERS 4096u          /* reader limits, far above K3's 93 x 896 */
#define KPK_MAX_EXPERTS 65536u

/* Incompatible-feature bits: a reader must refuse a file with a bit it does not know. */
#define KPK_INCOMPAT_CODECS  0x1u     /* some extent has codec != NONE */
#define KPK_INCOMPAT_MEMBERS 0x2u     /* extents live in more than one member file */
#define KPK_INCOMPAT_KNOWN   (KPK_INCOMPAT_CODECS)
/* Compatible-feature bits: informational; unknown ones are ignored. */
#define KPK_COMPAT_SPARSE    0x1u     /* the writer left all-zero blocks as holes */

enum kpk_order { KPK_ORDER_LAYER_MAJOR = 0, KPK_ORDER_TRUNK_FIRST = 1 };

enum kpk_kind {
    KPK_KIND_META = 1,     /* config.json, tokenizer files */
    KPK_KIND_GLOBALS = 2,  /* embedding, lm_head, final norm, output aggregator */
    KPK_KIND_TRUNK = 3,    /* every non-routed-expert tensor of one layer */
    KPK_KIND_EXPERT = 4,   /* one routed expert: w1, w2, w3 packed + scales */
};

enum kpk_codec { KPK_CODEC_NONE = 0, KPK_CODEC_ZSTD = 1 };

enum kpk_dtype {
    KPK_DT_F32 = 1,
    KPK_DT_BF16 = 2,
    KPK_DT_F16 = 3,
    KPK_DT_U8 = 4,
    KPK_DT_BYTES = 5,      /* an embedded file (meta extent): shape [length] */
};

/* ---- decoded records ---------------------------------------------------- */

typedef struct kpk_superblock {
    uint16_t major, minor;
    uint32_t incompat, compat;
    uint32_t align;
    uint32_t order;
    uint64_t file_size;
    uint64_t set_id;
    uint16_t member_index, member_count;
    uint64_t extent_table_off, extent_count, extent_table_xxh3;
    uint64_t tensor_table_off, tensor_count, tensor_table_xxh3;
    uint64_t strings_off, strings_len, strings_xxh3;
    uint64_t manifest_off, manifest_len, manifest_xxh3;
    uint64_t data_bytes;   /* sum of stored extent lengths (informational, checked) */
} kpk_superblock;

typedef struct kpk_extent {
    uint8_t kind, codec;
    uint16_t member;
    uint32_t layer, expert;
    uint64_t offset;       /* in the member file; a multiple of align */
    uint64_t stored_len;   /* bytes on disk, excluding the zero padding to align */
    uint64_t raw_len;      /* bytes after decoding (== stored_len for codec NONE) */
    uint64_t stored_xxh3;  /* XXH3-64, seed 0, of the stored bytes */
    uint64_t raw_xxh3;     /* XXH3-64, seed 0, of the decoded bytes */
    uint32_t first_tensor, tensor_count;
} kpk_extent;

typedef struct kpk_tensor {
    const char *name;      /* NUL-terminated, points into the string pool */
    uint32_t name_len;
    uint8_t dtype, ndim;
    uint32_t extent;
    uint64_t offset;       /* within the extent's decoded bytes; multiple of 64 */
    uint64_t nbytes;
    uint64_t shape[4];
} kpk_tensor;

/* ---- errors ------------------------------------------------------------- */

enum kpk_errcode {
    KPK_OK = 0,
    KPK_EIO,          /* cannot open/read/write */
    KPK_ENOTKPK,      /* wrong magic: not a KPK file at all */
    KPK_EVERSION,     /* a major version or feature this reader does not know */
    KPK_EFORMAT,      /* structurally invalid: truncated, bad offsets, bad tables */
    KPK_ECHECKSUM,    /* a checksum or a zero-padding check failed */
    KPK_ENOMEM,
    KPK_EINVAL,       /* bad argument (not found, out of range) */
};

typedef struct kpk_err {
    int code;
    char msg[512];
} kpk_err;

void kpk_err_set(kpk_err *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- helpers ------------------------------------------------------------ */

const char *kpk_dtype_name(int dtype);          /* "F32", ...; "?" if unknown */
int kpk_dtype_from_name(const char *s);         /* safetensors spelling -> KPK_DT_*; 0 if unknown */
uint64_t kpk_dtype_size(int dtype);             /* bytes per element; 0 if unknown */
const char *kpk_kind_name(int kind);
/* "layer 17 expert 403", "layer 3 trunk", "globals", "meta" */
void kpk_extent_describe(const kpk_extent *x, char *buf, size_t n);

static inline uint64_t kpk_round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* ---- encoding (used by the writer; the reader uses the decoders) -------- */

void kpk_superblock_encode(const kpk_superblock *sb, uint8_t out[KPK_SUPERBLOCK_SIZE]);
/* Checks magic, checksum and field ranges that need no file context. */
int  kpk_superblock_decode(const uint8_t in[KPK_SUPERBLOCK_SIZE], kpk_superblock *sb, kpk_err *err);
void kpk_extent_encode(const kpk_extent *x, uint8_t out[KPK_EXTENT_RECORD_SIZE]);
void kpk_extent_decode(const uint8_t in[KPK_EXTENT_RECORD_SIZE], kpk_extent *x);
/* name_off is the offset of the name in the string pool */
void kpk_tensor_encode(const kpk_tensor *t, uint32_t name_off, uint8_t out[KPK_TENSOR_RECORD_SIZE]);
void kpk_tensor_decode(const uint8_t in[KPK_TENSOR_RECORD_SIZE], kpk_tensor *t, uint32_t *name_off);

uint64_t kpk_xxh3(const void *p, size_t n);

#endif

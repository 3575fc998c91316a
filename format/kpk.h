/* KPK: the container kpack writes and krun reads.  docs/FORMAT.md is the
 * normative description; this header mirrors it field for field.  All
 * integers on disk are little-endian; the structs below are the decoded,
 * in-memory form (never read or written with memcpy of the struct). */
#ifndef KPK_H
#define KPK_H

#include <stddef.h>
#include <stdint.h>

/* krun uses the weights in place (F32, BF16 and F16 as host numbers), so the
 * host must be little-endian like the file: a big-endian build stops here
 * rather than compute garbage (supporting one would mean swapping every
 * weight as it is read). */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kpk needs a little-endian host: KPK files are little-endian and their weights are used in place (big-endian hosts are not supported)"
#endif

/* ---- constants ---------------------------------------------------------- */

/* 0x89 'K' 'P' 'K' CR LF 0x1A LF: the high byte catches 7-bit transports, the
 * CR LF pair catches newline conversion, 0x1A stops DOS `type`. */
#define KPK_MAGIC "\x89KPK\r\n\x1a\n"
#define KPK_MAGIC_LEN 8
#define KPK_VERSION_MAJOR 1
#define KPK_VERSION_MINOR 2
#define KPK_VERSION_END 12u           /* magic, major, minor: the bytes every version keeps in place */

#define KPK_SUPERBLOCK_SIZE 4096u     /* both copies; the file size is a multiple of this */
#define KPK_SB_CHECKSUM_OFF 4088u     /* XXH3-64 of bytes [0, 4088) */
#define KPK_EXTENT_RECORD_SIZE 64u
#define KPK_TENSOR_RECORD_SIZE 64u
#define KPK_MEMBER_RECORD_SIZE 64u    /* 1.1, §7.2 */
#define KPK_BLOCK_RECORD_SIZE 48u     /* 1.1, §8.1 */
#define KPK_TENSOR_ALIGN 64u          /* every tensor starts 64-byte aligned inside its extent */
#define KPK_SECTION_ALIGN 4096u       /* directory sections start on 4 KiB boundaries */
#define KPK_ALIGN_MIN 4096u
#define KPK_ALIGN_MAX (2u << 20)
#define KPK_NONE 0xFFFFFFFFu          /* "no layer" / "no expert" */
#define KPK_STRIPED 0xFFFFu           /* extent.member: stored in the stripe space (§7.3) */
#define KPK_NO_STRIPE 0xFFFFu         /* member.stripe_index of a non-STRIPE member */
#define KPK_META_PREFIX "meta/"       /* names of embedded files: "meta/config.json" */
/* 1 if file ("config.json") is one of the files a meta extent may hold (§4). */
int kpk_meta_name_known(const char *file);

/* Reader limits (FORMAT.md §7.5, §12): a file beyond them is refused as implausible. */
#define KPK_MAX_LAYERS 4096u          /* layer numbers are < this; K3 has 93 */
#define KPK_MAX_EXPERTS 65536u        /* expert numbers are < this; K3 has 896 */
#define KPK_MAX_EXTENTS (1u << 24)
#define KPK_MAX_TENSORS (1u << 26)
#define KPK_MAX_BLOCKS (1u << 28)
#define KPK_MAX_MEMBERS 256u
#define KPK_MAX_SECTION ((uint64_t)16 << 30)  /* any directory section */
#define KPK_MAX_EXTENT_RAW ((uint64_t)1 << 40)
#define KPK_MAX_BLOCK_RAW (64u << 20)
#define KPK_MAX_NAME 1024u            /* tensor name bytes */
#define KPK_MAX_PATH 4096u            /* member path bytes */
#define KPK_MAX_STRIPE_UNIT (64u << 20)
/* A block's stored_len may exceed its raw_len (a frame of incompressible
 * bytes), but not by more than this: 2 x raw_len + 4096. */
static inline uint64_t kpk_block_stored_max(uint64_t raw_len) { return 2 * raw_len + 4096; }

/* Incompatible-feature bits (§12): a reader must refuse a file with a bit it
 * does not know; a bit is set if and only if the file uses the feature. */
#define KPK_INCOMPAT_CODECS  0x1u     /* some extent has codec 1 (one zstd frame) */
#define KPK_INCOMPAT_MEMBERS 0x2u     /* 1.1: the file has several member files */
#define KPK_INCOMPAT_BLOCKS  0x4u     /* 1.1: some extent has codec 2 (blocks) */
#define KPK_INCOMPAT_ARCHIVE 0x8u     /* 1.1: some extent has kind 5 */
#define KPK_INCOMPAT_DRAFTER 0x10u    /* 1.2: a drafter file: its model is an EAGLE drafter in kind-6 extents (§15) */
#define KPK_INCOMPAT_KNOWN   (KPK_INCOMPAT_CODECS | KPK_INCOMPAT_MEMBERS | KPK_INCOMPAT_BLOCKS | KPK_INCOMPAT_ARCHIVE | KPK_INCOMPAT_DRAFTER)
#define KPK_INCOMPAT_SINCE_1_1 (KPK_INCOMPAT_MEMBERS | KPK_INCOMPAT_BLOCKS | KPK_INCOMPAT_ARCHIVE) /* need minor >= 1 */
#define KPK_INCOMPAT_SINCE_1_2 KPK_INCOMPAT_DRAFTER /* needs minor >= 2 */
/* The minor version a writer gives a file: the lowest that defines every
 * feature it uses (a model file stays 1.1, readable by every 1.1 reader). */
static inline uint16_t kpk_minor_for(uint32_t incompat) { return (incompat & KPK_INCOMPAT_SINCE_1_2) ? 2 : 1; }
/* Compatible-feature bits: informational; unknown ones are ignored. */
#define KPK_COMPAT_SPARSE    0x1u     /* the writer left all-zero blocks as holes */

enum kpk_order { KPK_ORDER_LAYER_MAJOR = 0, KPK_ORDER_TRUNK_FIRST = 1 };

enum kpk_kind {
    KPK_KIND_META = 1,     /* config.json, tokenizer files */
    KPK_KIND_GLOBALS = 2,  /* embedding, lm_head, final norm, output aggregator */
    KPK_KIND_TRUNK = 3,    /* every non-routed-expert tensor of one layer */
    KPK_KIND_EXPERT = 4,   /* one routed expert: w1, w2, w3 packed + scales */
    KPK_KIND_ARCHIVE = 5,  /* 1.1: bytes of the download a runtime never reads (§9) */
    KPK_KIND_DRAFTER = 6,  /* 1.2: a part of a drafter model (§15); `layer` is the part */
};
#define KPK_KIND_MAX KPK_KIND_DRAFTER

enum kpk_codec { KPK_CODEC_NONE = 0, KPK_CODEC_ZSTD = 1, KPK_CODEC_BLOCKS = 2 };

/* How one block's stored bytes decode (§8.1). */
enum kpk_method { KPK_METHOD_RAW = 0, KPK_METHOD_ZSTD = 1, KPK_METHOD_SPLIT2 = 2 };
#define KPK_PLANE0_ZSTD 0x1u          /* SPLIT2: plane 0 is a zstd frame */
#define KPK_PLANE1_ZSTD 0x2u          /* SPLIT2: plane 1 is a zstd frame */

/* Member roles (§7.1). */
enum kpk_role { KPK_ROLE_ENTRY = 0, KPK_ROLE_PLAIN = 1, KPK_ROLE_STRIPE = 2 };

enum kpk_dtype {
    KPK_DT_F32 = 1,
    KPK_DT_BF16 = 2,
    KPK_DT_F16 = 3,
    KPK_DT_U8 = 4,
    KPK_DT_BYTES = 5,      /* an embedded file or an archived byte range: shape [length] */
};

/* ---- decoded records ---------------------------------------------------- */

typedef struct kpk_superblock {
    uint16_t major, minor;
    uint32_t incompat, compat;
    uint32_t align;
    uint32_t order;
    uint64_t file_size;    /* of this member file */
    uint64_t set_id;       /* extent_table_xxh3 ^ tensor_table_xxh3 of the entry */
    uint16_t member_index, member_count;
    uint64_t extent_table_off, extent_count, extent_table_xxh3;
    uint64_t tensor_table_off, tensor_count, tensor_table_xxh3;
    uint64_t strings_off, strings_len, strings_xxh3;
    uint64_t manifest_off, manifest_len, manifest_xxh3;
    uint64_t data_bytes;   /* entry: sum of stored extent lengths (checked); other members: 0 */
    /* 1.1 */
    uint64_t member_table_off, member_table_xxh3;
    uint64_t block_table_off, block_count, block_table_xxh3;
    uint32_t stripe_unit;  /* U */
    uint16_t stripe_count; /* N */
    uint64_t stripe_len;   /* L */
    uint64_t superblock_xxh3; /* decoded only: the checksum field at 4088 */
} kpk_superblock;

typedef struct kpk_extent {
    uint8_t kind, codec;
    uint16_t member;       /* member file, or KPK_STRIPED */
    uint32_t layer, expert;
    uint32_t first_block;  /* 1.1: block records of the extents before this one */
    uint64_t offset;       /* in the member file, or a stripe-space position; a multiple of align */
    uint64_t stored_len;   /* bytes stored, excluding the zero padding to align */
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

/* 1.1: one independently decodable block of a codec-2 extent (§8.1). */
typedef struct kpk_block {
    uint64_t raw_off;      /* within the extent's decoded bytes */
    uint64_t stored_off;   /* within the extent's stored bytes */
    uint32_t raw_len;      /* 1 .. 64 MiB */
    uint32_t stored_len;
    uint8_t method;        /* KPK_METHOD_* */
    uint8_t planes;        /* SPLIT2: KPK_PLANE*_ZSTD bits */
    uint32_t plane0_len;   /* SPLIT2: stored length of plane 0 */
    uint64_t raw_xxh3;     /* of the block's decoded bytes */
} kpk_block;

/* 1.1: one member file of a set (§7.2). */
typedef struct kpk_member {
    uint16_t index;
    uint8_t role;          /* KPK_ROLE_* */
    uint16_t stripe_index; /* STRIPE: 0..N-1; otherwise KPK_NO_STRIPE */
    uint64_t file_size;
    uint64_t superblock_xxh3; /* the member's superblock checksum; 0 for the entry */
    uint32_t path_off, path_len; /* in the string pool; 0/0 for the entry */
} kpk_member;

/* ---- errors ------------------------------------------------------------- */

enum kpk_errcode {
    KPK_OK = 0,
    KPK_EIO,          /* cannot open/read/write */
    KPK_ENOTKPK,      /* no magic at either end: not a KPK file at all */
    KPK_EVERSION,     /* a major version, feature or value this reader does not know (newer format) */
    KPK_EFORMAT,      /* structurally invalid: truncated, bad offsets, bad tables (damage) */
    KPK_ECHECKSUM,    /* a checksum or a zero-padding check failed (damage) */
    KPK_ENOMEM,
    KPK_EINVAL,       /* bad argument (not found, out of range) */
    KPK_EMEMBER,      /* a member file of a set is missing, truncated, from another set,
                         renamed/swapped, duplicated or does not match (§7.4): the set
                         cannot be used as it is (exit 2) */
    KPK_ECHANGED,     /* a file changed while it was in use (written, truncated, replaced in
                         place: kpk_unchanged): nothing read from it since can be trusted (exit 1) */
};

typedef struct kpk_err {
    int code;
    char msg[768];
} kpk_err;

void kpk_err_set(kpk_err *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* 1 if the error means the bytes checked are damaged (kpack/krun exit 1):
 * KPK_EFORMAT, KPK_ECHECKSUM, or KPK_ECHANGED (the bytes changed while they were
 * used).  Every other code means "cannot run" (exit 2). */
static inline int kpk_err_is_damage(int code) { return code == KPK_EFORMAT || code == KPK_ECHECKSUM || code == KPK_ECHANGED; }

/* ---- helpers ------------------------------------------------------------ */

const char *kpk_dtype_name(int dtype);          /* "F32", ...; "?" if unknown */
uint64_t kpk_dtype_size(int dtype);             /* bytes per element; 0 if unknown */
const char *kpk_kind_name(int kind);
const char *kpk_codec_name(int codec);          /* "none", "zstd", "blocks"; "?" */
const char *kpk_method_name(int method);        /* "raw", "zstd", "split2"; "?" */
const char *kpk_role_name(int role);            /* "entry", "plain", "stripe"; "?" */
/* "layer 17 expert 403", "layer 3 trunk", "globals", "meta", "archive" */
void kpk_extent_describe(const kpk_extent *x, char *buf, size_t n);

static inline uint64_t kpk_round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* The stripe mapping (§7.3), the one place it is computed (reader and
 * writer): stripe-space position pos lies in the stripe member with stripe
 * index *stripe, at *off in that member file, with *left bytes to the end of
 * its unit.  U = stripe_unit, N = stripe_count, A = align. */
static inline void kpk_stripe_locate(uint64_t U, uint64_t N, uint64_t A, uint64_t pos, uint32_t *stripe, uint64_t *off,
                                     uint64_t *left)
{
    uint64_t k = pos / U, in = pos % U;
    *stripe = (uint32_t)(k % N);
    *off = A + (k / N) * U + in;
    *left = U - in;
}

/* ---- encoding (used by the writer; the reader uses the decoders) -------- */

/* The decoders return the number of reserved bytes (or bits) that are not
 * zero: a caller applies the §1 rule (damage when the file's minor version
 * is <= KPK_VERSION_MINOR, ignored when it is higher). */
void kpk_superblock_encode(const kpk_superblock *sb, uint8_t out[KPK_SUPERBLOCK_SIZE]);
/* Checks magic, major, checksum and the field rules of §3 step 6 that need no
 * file context (reserved bytes included, per the minor rule). */
int  kpk_superblock_decode(const uint8_t in[KPK_SUPERBLOCK_SIZE], kpk_superblock *sb, kpk_err *err);
void kpk_extent_encode(const kpk_extent *x, uint8_t out[KPK_EXTENT_RECORD_SIZE]);
int  kpk_extent_decode(const uint8_t in[KPK_EXTENT_RECORD_SIZE], kpk_extent *x);
/* name_off is the offset of the name in the string pool */
void kpk_tensor_encode(const kpk_tensor *t, uint32_t name_off, uint8_t out[KPK_TENSOR_RECORD_SIZE]);
int  kpk_tensor_decode(const uint8_t in[KPK_TENSOR_RECORD_SIZE], kpk_tensor *t, uint32_t *name_off);
void kpk_block_encode(const kpk_block *b, uint8_t out[KPK_BLOCK_RECORD_SIZE]);
int  kpk_block_decode_record(const uint8_t in[KPK_BLOCK_RECORD_SIZE], kpk_block *b);
void kpk_member_encode(const kpk_member *m, uint8_t out[KPK_MEMBER_RECORD_SIZE]);
int  kpk_member_decode(const uint8_t in[KPK_MEMBER_RECORD_SIZE], kpk_member *m);

uint64_t kpk_xxh3(const void *p, size_t n);

#endif

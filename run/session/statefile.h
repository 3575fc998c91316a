/* Saved conversations: the state file (docs/STATE.md specifies every byte).
 *
 * krun_state_parse checks a whole file image on its own -- no model needed --
 * so a fuzzer can throw arbitrary bytes at it; the session layer then checks
 * the parsed identity and geometry against the open model. */
#ifndef KRUN_STATEFILE_H
#define KRUN_STATEFILE_H

#include "format/k3_config.h"
#include "run/util/krun_err.h"
#include "run/util/savefile.h"

#include <stddef.h>
#include <stdint.h>

typedef struct k3_state k3_state;   /* state.h: a sequence's state, written and restored */

#define KRUN_STATE_MAGIC "\x89KRS\r\n\x1a\n"
#define KRUN_STATE_MAJOR 1
#define KRUN_STATE_MINOR 2             /* 1.1: the sampler is its seed, stream and reply start; 1.2: a drafter's state (docs/STATE.md) */
#define KRUN_STATE_HEADER 160          /* bytes of the header, its checksum included */
#define KRUN_STATE_TRAILER 8           /* the payload checksum */
#define KRUN_STATE_LOGITS 1u           /* flags: the last logits are saved */
#define KRUN_STATE_DRAFTER 2u          /* flags (1.2): the EAGLE drafter's rows and pending row follow (docs/STATE.md §2) */
#define KRUN_STATE_DRAFT_DESC 16       /* the drafter section's descriptor: start, has_pending, reserved */
#define KRUN_STATE_SAMPLER_PHILOX 1u   /* the sampler field of 1.1: draws by (seed, stream, position), sampler.h */

typedef struct krun_state_hdr {
    uint16_t major, minor;
    uint64_t set_id;                   /* the KPK file's set_id */
    uint64_t config_xxh3;              /* XXH3-64 of its embedded config.json */
    uint32_t n_layers, hidden, vocab, kda_heads, kda_head_dim, conv_width, kv_lora, qk_rope;
    uint32_t n_kda, n_mla;
    uint64_t pos, n_tokens;            /* positions run; history length (>= pos: the rest are pending) */
    uint32_t flags;
    /* the sampler (1.1; a 1.0 file's PRNG words are read as: seed = its first word, stream 0,
     * reply_from = n_tokens, sampler 0) */
    uint64_t seed, stream;             /* the draw's key (sampler.h) */
    uint64_t reply_from;               /* where the reply begins in the history (<= n_tokens) */
    uint32_t sampler;                  /* KRUN_STATE_SAMPLER_PHILOX (0: read from a 1.0 file) */
    /* 1.2, with KRUN_STATE_DRAFTER: the drafter the section belongs to and its row geometry */
    uint64_t draft_set_id, draft_config_xxh3;
    uint32_t draft_width, draft_hidden;
    uint64_t payload_len;
    /* where the sections are in the file image (filled by krun_state_parse) */
    size_t layer_types_at, tokens_at, layers_at, logits_at, draft_at;
} krun_state_hdr;

/* A drafter's state, written with a session's state or read into it (1.2): its
 * rows [start, pos - 1) of width floats (row q at rows + q * width; the file holds
 * rows 0 .. pos - 2, zeros before start) and, with has_pending, row pos - 1's
 * fused taps pending [hidden].  Reading fills start and has_pending. */
typedef struct krun_state_draft {
    float *rows, *pending;
    size_t cap;                        /* rows room, for reading */
    uint64_t start;
    int has_pending;
} krun_state_draft;

/* The header of this model, geometry and identity filled in. */
void krun_state_hdr_for(krun_state_hdr *h, const k3_config *c, uint64_t set_id, uint64_t config_xxh3);

/* Bytes of the payload a header implies; 0 if the geometry is impossible. */
uint64_t krun_state_payload_len(const krun_state_hdr *h, const uint8_t *layer_types);

/* Check a whole state file image (every length, checksum, reserved field,
 * token id and float) and fill h.  Any other input is refused with
 * KRUN_EINPUT and a message naming what is wrong. */
int krun_state_parse(const void *buf, size_t len, krun_state_hdr *h, krun_err *err);

/* Read and check only the header of the state file at path (magic, version,
 * header checksum): how many tokens it holds, run and pending.  To size the
 * context before loading it. */
int krun_state_peek(const char *path, uint64_t *pos, uint64_t *n_tokens, krun_err *err);

/* Write a state file: h (pos, n_tokens, flags, the sampler and identity set by the
 * caller), the layer map of c, tokens [n_tokens], st's layers at h->pos
 * positions, and logits [vocab] when flagged.  Through the one safe writer
 * (savefile.h): path must be new or an earlier state file; the bytes go to
 * a temporary file, fsynced, renamed over path. */
/* The layers of a state that another rank holds (several machines,
 * run/cluster): a layer without arrays here is fetched from there (get)
 * when the state is written, and sent there (put) as it is read, through
 * buf (krun_state_far_floats of it).  NULL: every layer is here. */
typedef struct krun_state_far {
    int (*get)(void *ctx, const k3_state *st, int L, float *S, float *conv, float *mla, krun_err *err);
    int (*put)(void *ctx, const k3_state *st, int L, const float *S, const float *conv, const float *mla, size_t pos, krun_err *err);
    void *ctx;
    float *buf;
} krun_state_far;
size_t krun_state_far_floats(const k3_config *c, size_t ctx);
int krun_state_write_far(const char *path, krun_state_hdr *h, const k3_config *c, const int32_t *tokens, const k3_state *st,
                         const float *logits, const krun_state_draft *d, const krun_state_far *far, krun_err *err);
int krun_state_write_to_far(ksave *s, krun_state_hdr *h, const k3_config *c, const int32_t *tokens, const k3_state *st,
                            const float *logits, const krun_state_draft *d, const krun_state_far *far, krun_err *err);
int krun_state_write(const char *path, krun_state_hdr *h, const k3_config *c, const int32_t *tokens, const k3_state *st,
                     const float *logits, const krun_state_draft *d, krun_err *err);
/* The same bytes into a save begun by the caller (who commits it, or renames
 * it in a protocol of its own: krun chat's /save). */
int krun_state_write_to(ksave *s, krun_state_hdr *h, const k3_config *c, const int32_t *tokens, const k3_state *st,
                        const float *logits, const krun_state_draft *d, krun_err *err);
/* 1 if the open file begins with the state file's magic (a save may replace it). */
int krun_state_is_file(int fd);
/* The history of the state file at path (header checked, payload not): its
 * length and the XXH3-64 of its ids as 32-bit little-endian numbers, what
 * FILE.json records of the state it belongs to. */
int krun_state_tokens_xxh3(const char *path, uint64_t *n_tokens, uint64_t *hash, krun_err *err);

/* The same, a layer at a time (a snapshot written while a forward block runs:
 * session.c): begin writes the header, the layer map and the history; then
 * every layer in order, L = 0 .. n_layers - 1 (a KDA layer's state S and
 * ShortConv history conv, an MLA layer's first h->pos rows of its cache);
 * then end writes the logits when flagged and the payload checksum.  A write
 * that fails is reported by ksave_finish / ksave_commit; drop releases a
 * writer that will not be ended. */
typedef struct krun_state_writer {
    ksave *s;
    struct XXH3_state_s *x;
    krun_state_hdr h;
} krun_state_writer;
int krun_state_write_begin(krun_state_writer *w, ksave *s, krun_state_hdr *h, const k3_config *c, const int32_t *tokens,
                           krun_err *err);
void krun_state_write_layer(krun_state_writer *w, const k3_config *c, int L, const float *S, const float *conv, const float *mla);
/* d: the drafter section when h flags it (d NULL: zeros, no row known). */
void krun_state_write_end(krun_state_writer *w, const float *logits, const krun_state_draft *d);
void krun_state_write_drop(krun_state_writer *w);

/* A state file read straight into its destination (a session's own
 * buffers: no copy of the file is held, so loading stays within the plan).
 * begin reads and checks the header and the layer map (as krun_state_parse
 * does) into r->h; the caller then checks identity, geometry and context
 * against its model before anything is written; read_payload reads the
 * history into tokens [n_tokens], the layers into st, the logits when flagged,
 * checking every id and float, and the payload checksum last: until it
 * returns 0 the destination holds bytes that must not be used (the caller
 * resets it on failure).  end releases the reader (always). */
typedef struct krun_state_reader {
    int fd;
    const char *name;
    uint64_t at;                       /* the next payload byte */
    struct XXH3_state_s *x;
    krun_state_hdr h;
    uint8_t types[K3_MAX_LAYERS + 8];
} krun_state_reader;
int krun_state_read_begin(krun_state_reader *r, int fd, const char *name, krun_err *err);
/* d: where the drafter section goes (NULL: checked, not kept); d->start and has_pending are set
 * when the file has one (else d->start = pos, has_pending 0). */
int krun_state_read_payload(krun_state_reader *r, const k3_config *c, int32_t *tokens, k3_state *st, float *logits,
                            krun_state_draft *d, krun_err *err);
int krun_state_read_payload_far(krun_state_reader *r, const k3_config *c, int32_t *tokens, k3_state *st, float *logits,
                                krun_state_draft *d, const krun_state_far *far, krun_err *err);
/* Instead of read_payload: the whole payload checked as read_payload checks
 * it, through a small buffer, into no destination; *tokens_hash (if not NULL)
 * the XXH3-64 of the history's bytes.  To check a file before replacing a
 * state that must survive a refusal (krun chat's /load). */
int krun_state_read_check(krun_state_reader *r, uint64_t *tokens_hash, krun_err *err);
void krun_state_read_end(krun_state_reader *r);

/* Copy a parsed image's sections into st / tokens / logits (the caller has
 * checked that they fit). */
int krun_state_restore_far(const void *buf, const krun_state_hdr *h, const k3_config *c, int32_t *tokens, k3_state *st,
                           float *logits, krun_state_draft *d, const krun_state_far *far, krun_err *err);
void krun_state_restore(const void *buf, const krun_state_hdr *h, const k3_config *c, int32_t *tokens, k3_state *st,
                        float *logits, krun_state_draft *d);

#endif

/* The state file of a saved conversation (docs/STATE.md). */
#include "statefile.h"

#include "run/engine/state.h"
#include "format/kio.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the state file stores little-endian numbers and floats as they are in memory"
#endif

/* ---- little-endian fields ------------------------------------------------------ */

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)get16(p) | (uint32_t)get16(p + 2) << 16; }
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }
static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { put16(p, (uint16_t)v); put16(p + 2, (uint16_t)(v >> 16)); }
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)v); put32(p + 4, (uint32_t)(v >> 32)); }

/* Header offsets (docs/STATE.md §2). */
enum {
    H_MAGIC = 0, H_MAJOR = 8, H_MINOR = 10, H_SIZE = 12, H_SET_ID = 16, H_CONFIG = 24,
    H_LAYERS = 32, H_HIDDEN = 36, H_VOCAB = 40, H_KDA_HEADS = 44, H_KDA_DIM = 48, H_CONV = 52,
    H_KV_LORA = 56, H_QK_ROPE = 60, H_N_KDA = 64, H_N_MLA = 68, H_POS = 72, H_N_TOKENS = 80,
    H_FLAGS = 88, H_RESERVED1 = 92, H_SEED = 96, H_STREAM = 104, H_REPLY = 112, H_SAMPLER = 120, H_RESERVED3 = 124,
    H_PAYLOAD = 128, H_RESERVED2 = 136, H_XXH3 = 152,
};

static uint64_t kda_floats(const krun_state_hdr *h)
{
    return (uint64_t)h->kda_heads * h->kda_head_dim * h->kda_head_dim +
           3 * (uint64_t)(h->conv_width - 1) * h->kda_heads * h->kda_head_dim;
}

static uint64_t types_bytes(const krun_state_hdr *h) { return ((uint64_t)h->n_layers + 7) / 8 * 8; }

/* 1.2: the drafter section's rows (positions 0 .. pos - 2) and its bytes, descriptor and pending row included. */
static uint64_t draft_rows(const krun_state_hdr *h) { return h->pos ? h->pos - 1 : 0; }
static uint64_t draft_bytes(const krun_state_hdr *h)
{
    if (!(h->flags & KRUN_STATE_DRAFTER)) return 0;
    return KRUN_STATE_DRAFT_DESC + (draft_rows(h) * h->draft_width + h->draft_hidden) * 4;
}

void krun_state_hdr_for(krun_state_hdr *h, const k3_config *c, uint64_t set_id, uint64_t config_xxh3)
{
    memset(h, 0, sizeof *h);
    h->major = KRUN_STATE_MAJOR;
    h->minor = 1;                      /* 1.2 only with a drafter section: a state without one is the same bytes as before */
    h->sampler = KRUN_STATE_SAMPLER_PHILOX;
    h->set_id = set_id;
    h->config_xxh3 = config_xxh3;
    h->n_layers = (uint32_t)c->n_layers;
    h->hidden = (uint32_t)c->hidden;
    h->vocab = (uint32_t)c->vocab;
    h->kda_heads = (uint32_t)c->kda_heads;
    h->kda_head_dim = (uint32_t)c->kda_head_dim;
    h->conv_width = (uint32_t)c->conv_width;
    h->kv_lora = (uint32_t)c->kv_lora;
    h->qk_rope = (uint32_t)c->qk_rope;
    h->n_mla = (uint32_t)k3_config_mla_layer_count(c);
    h->n_kda = h->n_layers - h->n_mla;
}

/* Bounds that keep every product below 2^64 (checked again with overflow
 * builtins); far above any K3 geometry. */
static int geometry_sane(const krun_state_hdr *h)
{
    return h->n_layers >= 1 && h->n_layers <= K3_MAX_LAYERS && h->hidden >= 1 && h->hidden <= (1u << 20) &&
           h->vocab >= 1 && h->vocab <= (1u << 26) && h->kda_heads <= (1u << 12) && h->kda_head_dim <= (1u << 12) &&
           h->conv_width >= 1 && h->conv_width <= 256 && h->kv_lora <= (1u << 16) && h->qk_rope <= (1u << 16) &&
           (uint64_t)h->n_kda + h->n_mla == h->n_layers && h->pos <= ((uint64_t)1 << 40) &&
           h->n_tokens <= ((uint64_t)1 << 40) && h->n_tokens >= h->pos &&
           (!(h->flags & KRUN_STATE_DRAFTER) || (h->draft_width >= 1 && h->draft_width <= (1u << 16) && h->draft_hidden >= 1 &&
                                                  h->draft_hidden <= (1u << 20)));
}

uint64_t krun_state_payload_len(const krun_state_hdr *h, const uint8_t *layer_types)
{
    uint64_t n = 0, x;
    (void)layer_types;
    if (!geometry_sane(h)) return 0;
    n = types_bytes(h) + h->n_tokens * 4;
    /* KDA layers: S and the conv history; MLA layers: pos latent rows */
    if (__builtin_mul_overflow(kda_floats(h), (uint64_t)h->n_kda * 4, &x) || __builtin_add_overflow(n, x, &n)) return 0;
    if (__builtin_mul_overflow(h->pos, (uint64_t)(h->kv_lora + h->qk_rope) * 4, &x) ||
        __builtin_mul_overflow(x, (uint64_t)h->n_mla, &x) || __builtin_add_overflow(n, x, &n))
        return 0;
    if (h->flags & KRUN_STATE_LOGITS) n += (uint64_t)h->vocab * 4;
    return n + draft_bytes(h);
}

static int bad(krun_err *err, const char *what)
{
    krun_err_set(err, KRUN_EINPUT, "not a usable krun state file: %s", what);
    return -1;
}

static int all_finite(const uint8_t *p, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        if (!isfinite(f)) return 0;
    }
    return 1;
}

/* The header b of a file of len bytes, checked (everything but the payload's
 * checksum and contents): into h. */
static int parse_header(const uint8_t *b, uint64_t len, krun_state_hdr *h, krun_err *err)
{
    uint64_t want;
    char msg[200];
    memset(h, 0, sizeof *h);
    if (len < KRUN_STATE_HEADER + KRUN_STATE_TRAILER) return bad(err, "too short for a header (truncated?)");
    if (memcmp(b + H_MAGIC, KRUN_STATE_MAGIC, 8) != 0) return bad(err, "wrong magic");
    h->major = get16(b + H_MAJOR);
    h->minor = get16(b + H_MINOR);
    if (h->major != KRUN_STATE_MAJOR) {
        snprintf(msg, sizeof msg, "version %u.%u, this krun reads %d.x", h->major, h->minor, KRUN_STATE_MAJOR);
        return bad(err, msg);
    }
    if (get32(b + H_SIZE) != KRUN_STATE_HEADER) return bad(err, "header size is not 160");
    if (XXH3_64bits(b, H_XXH3) != get64(b + H_XXH3)) return bad(err, "header checksum mismatch (damaged)");
    h->set_id = get64(b + H_SET_ID);
    h->config_xxh3 = get64(b + H_CONFIG);
    h->n_layers = get32(b + H_LAYERS);
    h->hidden = get32(b + H_HIDDEN);
    h->vocab = get32(b + H_VOCAB);
    h->kda_heads = get32(b + H_KDA_HEADS);
    h->kda_head_dim = get32(b + H_KDA_DIM);
    h->conv_width = get32(b + H_CONV);
    h->kv_lora = get32(b + H_KV_LORA);
    h->qk_rope = get32(b + H_QK_ROPE);
    h->n_kda = get32(b + H_N_KDA);
    h->n_mla = get32(b + H_N_MLA);
    h->pos = get64(b + H_POS);
    h->n_tokens = get64(b + H_N_TOKENS);
    h->flags = get32(b + H_FLAGS);
    h->payload_len = get64(b + H_PAYLOAD);
    /* a later minor may use the reserved space for additions this reader can ignore (docs/STATE.md);
     * 1.2's drafter flag gives four of them a meaning */
    if (h->minor <= KRUN_STATE_MINOR && !(h->flags & KRUN_STATE_DRAFTER) &&
        (get32(b + H_RESERVED1) || get64(b + H_RESERVED2) || get64(b + H_RESERVED2 + 8) || (h->minor >= 1 && get32(b + H_RESERVED3))))
        return bad(err, "reserved fields are not zero");
    if (h->flags & KRUN_STATE_DRAFTER) {
        if (h->minor < 2) return bad(err, "a version 1.0 or 1.1 file with the drafter flag (1.2)");
        h->draft_width = get32(b + H_RESERVED1);
        h->draft_hidden = get32(b + H_RESERVED3);
        h->draft_set_id = get64(b + H_RESERVED2);
        h->draft_config_xxh3 = get64(b + H_RESERVED2 + 8);
    }
    if (h->minor == 0) {
        /* 1.0 held a xoshiro256** state there: its sampler cannot be resumed; its first word
         * seeds the one of 1.1, and the whole history counts as prompt */
        h->seed = get64(b + H_SEED);
        h->stream = 0;
        h->reply_from = h->n_tokens;
        h->sampler = 0;
    } else {
        h->seed = get64(b + H_SEED);
        h->stream = get64(b + H_STREAM);
        h->reply_from = get64(b + H_REPLY);
        h->sampler = get32(b + H_SAMPLER);
        if (h->minor <= KRUN_STATE_MINOR && h->sampler != KRUN_STATE_SAMPLER_PHILOX) return bad(err, "unknown sampler");
        if (h->reply_from > h->n_tokens) return bad(err, "the reply starts after the end of the history");
    }
    if (h->flags & ~(KRUN_STATE_LOGITS | KRUN_STATE_DRAFTER)) return bad(err, "unknown flags");
    if ((h->flags & KRUN_STATE_LOGITS) && h->pos == 0) return bad(err, "logits saved at position 0");
    if (!geometry_sane(h)) return bad(err, "impossible geometry or position in the header");
    want = krun_state_payload_len(h, NULL);
    if (!want || want != h->payload_len) return bad(err, "the payload length disagrees with the geometry");
    if (len - KRUN_STATE_HEADER - KRUN_STATE_TRAILER != h->payload_len) {
        snprintf(msg, sizeof msg, "%llu bytes, the header says %llu (truncated or extended)", (unsigned long long)len,
                 (unsigned long long)(h->payload_len + KRUN_STATE_HEADER + KRUN_STATE_TRAILER));
        return bad(err, msg);
    }
    /* the sections */
    h->layer_types_at = KRUN_STATE_HEADER;
    h->tokens_at = h->layer_types_at + (size_t)types_bytes(h);
    h->layers_at = h->tokens_at + (size_t)h->n_tokens * 4;
    h->draft_at = (size_t)(KRUN_STATE_HEADER + h->payload_len - draft_bytes(h));
    h->logits_at = h->draft_at - (size_t)((h->flags & KRUN_STATE_LOGITS) ? (uint64_t)h->vocab * 4 : 0);
    return 0;
}

/* The drafter section's descriptor (KRUN_STATE_DRAFT_DESC bytes at p) against the header. */
static int draft_desc(const uint8_t *p, const krun_state_hdr *h, uint64_t *start, int *has_pending, krun_err *err)
{
    const uint32_t pend = get32(p + 8);
    *start = get64(p);
    *has_pending = pend == 1;
    if (pend > 1 || get32(p + 12)) return bad(err, "the drafter section's descriptor is damaged");
    /* rows [start, pos - 1) and pending row pos - 1, or no row at all from pos on */
    if (pend ? h->pos < 1 || *start > h->pos - 1 : *start != h->pos) return bad(err, "the drafter section's rows disagree with the position");
    return 0;
}

/* The layer map (types_bytes(h) bytes) against the header. */
static int check_types(const uint8_t *types, const krun_state_hdr *h, krun_err *err)
{
    uint32_t mla = 0;
    for (uint32_t L = 0; L < h->n_layers; L++) {
        if (types[L] > 1) return bad(err, "a layer type is neither KDA (0) nor MLA (1)");
        mla += types[L];
    }
    for (uint64_t L = h->n_layers; L < types_bytes(h); L++)
        if (types[L]) return bad(err, "layer map padding is not zero");
    if (mla != h->n_mla) return bad(err, "the layer map disagrees with the MLA layer count");
    return 0;
}

static int tokens_in_vocab(const uint8_t *p, uint64_t n, uint32_t vocab)
{
    for (uint64_t i = 0; i < n; i++)
        if (get32(p + 4 * i) >= vocab) return 0;
    return 1;
}

int krun_state_parse(const void *buf, size_t len, krun_state_hdr *h, krun_err *err)
{
    const uint8_t *b = buf;
    if (parse_header(b, len, h, err)) return -1;
    if (XXH3_64bits(b + KRUN_STATE_HEADER, h->payload_len) != get64(b + KRUN_STATE_HEADER + h->payload_len))
        return bad(err, "payload checksum mismatch (damaged)");
    if (check_types(b + h->layer_types_at, h, err)) return -1;
    if (!tokens_in_vocab(b + h->tokens_at, h->n_tokens, h->vocab)) return bad(err, "a token id is outside the vocabulary");
    if (!all_finite(b + h->layers_at, (h->draft_at - h->layers_at) / 4)) return bad(err, "it holds values that are not finite");
    if (h->flags & KRUN_STATE_DRAFTER) {
        uint64_t start;
        int pend;
        if (draft_desc(b + h->draft_at, h, &start, &pend, err)) return -1;
        if (!all_finite(b + h->draft_at + KRUN_STATE_DRAFT_DESC, (draft_bytes(h) - KRUN_STATE_DRAFT_DESC) / 4))
            return bad(err, "it holds values that are not finite");
    }
    return 0;
}

/* ---- reading a file straight into its destination ---------------------------------- */

int krun_state_read_begin(krun_state_reader *r, int fd, const char *name, krun_err *err)
{
    uint8_t b[KRUN_STATE_HEADER];
    const int64_t len = kio_file_size(fd);
    memset(r, 0, sizeof *r);
    r->fd = fd;
    r->name = name;
    if (len < 0 || kio_pread_full(fd, b, (size_t)len < sizeof b ? (size_t)len : sizeof b, 0))
        return krun_err_set(err, KRUN_EINPUT, "cannot read %s: %s", name, strerror(errno));
    if (parse_header(b, (uint64_t)len, &r->h, err)) return krun_err_prefix(err, "%s: ", name);
    if (kio_pread_full(fd, r->types, (size_t)types_bytes(&r->h), r->h.layer_types_at))
        return krun_err_set(err, KRUN_EINPUT, "cannot read %s: %s", name, errno == ENODATA ? "truncated" : strerror(errno));
    if (check_types(r->types, &r->h, err)) return krun_err_prefix(err, "%s: ", name);
    if (!(r->x = XXH3_createState())) return krun_err_set(err, KRUN_ENOMEM, "reading %s: out of memory", name);
    XXH3_64bits_reset(r->x);
    XXH3_64bits_update(r->x, r->types, (size_t)types_bytes(&r->h));
    r->at = r->h.tokens_at;
    return 0;
}

/* The next n bytes of the payload into dst, hashed; check(dst, n) after. */
static int read_section(krun_state_reader *r, void *dst, uint64_t n, krun_err *err)
{
    if (!n) return 0;
    if (kio_pread_full(r->fd, dst, (size_t)n, r->at))
        return krun_err_set(err, KRUN_EINPUT, "cannot read %s: %s", r->name, errno == ENODATA ? "truncated" : strerror(errno));
    XXH3_64bits_update(r->x, dst, (size_t)n);
    r->at += n;
    return 0;
}

size_t krun_state_far_floats(const k3_config *c, size_t ctx)
{
    const size_t kda = k3_kda_S_floats(c) + k3_kda_conv_floats(c), mla = ctx * k3_mla_row(c);
    return kda > mla ? kda : mla;
}

/* The drafter section into d (NULL, or rows it cannot hold: read through a small buffer, checked, dropped). */
static int read_draft(krun_state_reader *r, krun_state_draft *d, krun_err *err)
{
    const krun_state_hdr *h = &r->h;
    const uint64_t rows = draft_rows(h) * h->draft_width, total = rows + h->draft_hidden;
    uint8_t desc[KRUN_STATE_DRAFT_DESC];
    uint64_t start;
    int pend, keep = d && d->cap >= draft_rows(h);
    if (read_section(r, desc, sizeof desc, err)) return -1;
    if (draft_desc(desc, h, &start, &pend, err)) return krun_err_prefix(err, "%s: ", r->name);
    for (uint64_t done = 0; done < total;) {
        float tmp[1024], *dst = tmp;
        uint64_t n = total - done < 1024 ? total - done : 1024;
        if (keep && done < rows) { dst = d->rows + done; n = rows - done; }
        else if (keep) { dst = d->pending + (done - rows); n = total - done; }
        if (read_section(r, dst, n * 4, err)) return -1;
        if (!all_finite((const uint8_t *)dst, n)) { bad(err, "it holds values that are not finite"); return krun_err_prefix(err, "%s: ", r->name); }
        done += n;
    }
    if (d) {
        d->start = keep ? start : h->pos;
        d->has_pending = keep && pend;
    }
    return 0;
}

int krun_state_read_payload(krun_state_reader *r, const k3_config *c, int32_t *tokens, k3_state *st, float *logits,
                            krun_state_draft *d, krun_err *err)
{
    return krun_state_read_payload_far(r, c, tokens, st, logits, d, NULL, err);
}

int krun_state_read_payload_far(krun_state_reader *r, const k3_config *c, int32_t *tokens, k3_state *st, float *logits,
                                krun_state_draft *d, const krun_state_far *far, krun_err *err)
{
    const krun_state_hdr *h = &r->h;
    const uint64_t row = (uint64_t)k3_mla_row(c) * 4, S = k3_kda_S_floats(c) * 4, conv = k3_kda_conv_floats(c) * 4;
    uint8_t tail[KRUN_STATE_TRAILER];
    /* the caller checked the geometry against c; the sizes the header implies must be the ones read here */
    if ((uint64_t)h->kv_lora + h->qk_rope != k3_mla_row(c) || kda_floats(h) * 4 != S + conv || h->n_layers != (uint32_t)c->n_layers)
        return krun_err_set(err, KRUN_EINPUT, "%s: its geometry differs from this model's", r->name);
    if (read_section(r, tokens, h->n_tokens * 4, err)) return -1;
    if (!tokens_in_vocab((const uint8_t *)tokens, h->n_tokens, h->vocab)) goto bad_tokens;
    for (int L = 0; L < c->n_layers; L++) {
        /* a layer another rank holds passes through far's buffer on its way there */
        const int away = far && !st->mla_cache[L] && !st->kda_S[L];
        float *mla = away ? far->buf : st->mla_cache[L], *kS = away ? far->buf : st->kda_S[L];
        float *kc = away ? far->buf + S / 4 : st->kda_conv[L];
        if (c->layer_is_mla[L]) {
            if (read_section(r, mla, h->pos * row, err)) return -1;
            if (!all_finite((const uint8_t *)mla, h->pos * row / 4)) goto bad_float;
        } else {
            if (read_section(r, kS, S, err) || read_section(r, kc, conv, err)) return -1;
            if (!all_finite((const uint8_t *)kS, S / 4) || !all_finite((const uint8_t *)kc, conv / 4)) goto bad_float;
        }
        if (away && far->put(far->ctx, st, L, kS, kc, mla, (size_t)h->pos, err)) return -1;
    }
    if (h->flags & KRUN_STATE_LOGITS) {
        if (read_section(r, logits, (uint64_t)h->vocab * 4, err)) return -1;
        if (!all_finite((const uint8_t *)logits, h->vocab)) goto bad_float;
    }
    if (h->flags & KRUN_STATE_DRAFTER) {
        if (read_draft(r, d, err)) return -1;
    } else if (d) {
        d->start = h->pos;             /* no drafter row before the file's position */
        d->has_pending = 0;
    }
    if (r->at != KRUN_STATE_HEADER + h->payload_len || kio_pread_full(r->fd, tail, sizeof tail, r->at))
        return krun_err_set(err, KRUN_EINPUT, "cannot read %s: %s", r->name, errno == ENODATA ? "truncated" : strerror(errno));
    if (XXH3_64bits_digest(r->x) != get64(tail)) { bad(err, "payload checksum mismatch (damaged)"); return krun_err_prefix(err, "%s: ", r->name); }
    st->pos = (size_t)h->pos;
    return 0;
bad_tokens:
    bad(err, "a token id is outside the vocabulary");
    return krun_err_prefix(err, "%s: ", r->name);
bad_float:
    bad(err, "it holds values that are not finite");
    return krun_err_prefix(err, "%s: ", r->name);
}

int krun_state_read_check(krun_state_reader *r, uint64_t *tokens_hash, krun_err *err)
{
    enum { CHUNK = 64 << 10 };         /* a multiple of 4: the ids and floats never straddle two reads */
    const krun_state_hdr *h = &r->h;
    const uint64_t end = KRUN_STATE_HEADER + h->payload_len;
    uint8_t *b = malloc(CHUNK), tail[KRUN_STATE_TRAILER];
    XXH3_state_t *th = XXH3_createState();
    int rc = -1;
    if (!b || !th) { krun_err_set(err, KRUN_ENOMEM, "reading %s: out of memory", r->name); goto out; }
    XXH3_64bits_reset(th);
    for (uint64_t at = h->tokens_at; at < h->draft_at;) {
        const size_t n = h->draft_at - at < CHUNK ? (size_t)(h->draft_at - at) : CHUNK;
        const uint64_t tok_end = h->layers_at;
        if (kio_pread_full(r->fd, b, n, at)) {
            krun_err_set(err, KRUN_EINPUT, "cannot read %s: %s", r->name, errno == ENODATA ? "truncated" : strerror(errno));
            goto out;
        }
        XXH3_64bits_update(r->x, b, n);
        if (at < tok_end) {
            const size_t t = tok_end - at < n ? (size_t)(tok_end - at) : n;
            XXH3_64bits_update(th, b, t);
            if (!tokens_in_vocab(b, t / 4, h->vocab)) { bad(err, "a token id is outside the vocabulary"); goto named; }
            if (!all_finite(b + t, (n - t) / 4)) goto not_finite;
        } else if (!all_finite(b, n / 4)) {
            goto not_finite;
        }
        at += n;
    }
    r->at = h->draft_at;
    if ((h->flags & KRUN_STATE_DRAFTER) && read_draft(r, NULL, err)) goto out;
    if (kio_pread_full(r->fd, tail, sizeof tail, end)) {
        krun_err_set(err, KRUN_EINPUT, "cannot read %s: %s", r->name, errno == ENODATA ? "truncated" : strerror(errno));
        goto out;
    }
    if (XXH3_64bits_digest(r->x) != get64(tail)) { bad(err, "payload checksum mismatch (damaged)"); goto named; }
    if (tokens_hash) *tokens_hash = XXH3_64bits_digest(th);
    rc = 0;
    goto out;
not_finite:
    bad(err, "it holds values that are not finite");
named:
    krun_err_prefix(err, "%s: ", r->name);
out:
    free(b);
    if (th) XXH3_freeState(th);
    return rc;
}

void krun_state_read_end(krun_state_reader *r)
{
    if (r->x) XXH3_freeState(r->x);
    r->x = NULL;
}

int krun_state_peek(const char *path, uint64_t *pos, uint64_t *n_tokens, krun_err *err)
{
    uint8_t b[KRUN_STATE_HEADER];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t got = fd < 0 ? -1 : pread(fd, b, sizeof b, 0);
    int e = errno;
    if (fd >= 0) close(fd);
    if (got < 0) { krun_err_set(err, KRUN_EINPUT, "cannot read %s: %s", path, strerror(e)); return -1; }
    if ((size_t)got < sizeof b || memcmp(b, KRUN_STATE_MAGIC, 8) != 0 || get16(b + H_MAJOR) != KRUN_STATE_MAJOR ||
        get32(b + H_SIZE) != KRUN_STATE_HEADER || XXH3_64bits(b, H_XXH3) != get64(b + H_XXH3)) {
        krun_err_set(err, KRUN_EINPUT, "%s: not a usable krun state file (bad header: truncated, damaged, or another version)", path);
        return -1;
    }
    *pos = get64(b + H_POS);
    *n_tokens = get64(b + H_N_TOKENS);
    if (*n_tokens < *pos || *n_tokens > ((uint64_t)1 << 40)) {
        krun_err_set(err, KRUN_EINPUT, "%s: not a usable krun state file (impossible position)", path);
        return -1;
    }
    return 0;
}

int krun_state_is_file(int fd)
{
    uint8_t b[8];
    return kio_pread_full(fd, b, sizeof b, 0) == 0 && memcmp(b, KRUN_STATE_MAGIC, 8) == 0;
}

int krun_state_tokens_xxh3(const char *path, uint64_t *n_tokens, uint64_t *hash, krun_err *err)
{
    uint8_t b[KRUN_STATE_HEADER];
    uint64_t pos, at;
    int32_t *ids = NULL;
    int fd, rc = -1;
    if (krun_state_peek(path, &pos, n_tokens, err)) return -1;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || kio_pread_full(fd, b, sizeof b, 0)) {
        krun_err_set(err, KRUN_EINPUT, "cannot read %s: %s", path, strerror(errno));
        goto out;
    }
    at = KRUN_STATE_HEADER + ((uint64_t)get32(b + H_LAYERS) + 7) / 8 * 8;
    if (get32(b + H_LAYERS) > K3_MAX_LAYERS || kio_file_size(fd) < (int64_t)(at + *n_tokens * 4) ||
        !(ids = malloc(*n_tokens * 4 + 1))) {
        krun_err_set(err, KRUN_EINPUT, "%s: not a usable krun state file (%s)", path,
                     get32(b + H_LAYERS) > K3_MAX_LAYERS ? "impossible geometry" : "truncated, or its history does not fit in memory");
        goto out;
    }
    if (kio_pread_full(fd, ids, *n_tokens * 4, at)) {
        krun_err_set(err, KRUN_EINPUT, "cannot read the history of %s: %s", path, errno == ENODATA ? "truncated" : strerror(errno));
        goto out;
    }
    *hash = XXH3_64bits(ids, *n_tokens * 4);
    rc = 0;
out:
    if (fd >= 0) close(fd);
    free(ids);
    return rc;
}

/* ---- writing -------------------------------------------------------------------- */

static void emit(krun_state_writer *w, const void *p, size_t n)
{
    if (!n) return;
    ksave_write(w->s, p, n);
    XXH3_64bits_update(w->x, p, n);
}

int krun_state_write_begin(krun_state_writer *w, ksave *s, krun_state_hdr *h, const k3_config *c, const int32_t *tokens,
                           krun_err *err)
{
    uint8_t hd[KRUN_STATE_HEADER], types[K3_MAX_LAYERS + 8];
    memset(w, 0, sizeof *w);
    memset(hd, 0, sizeof hd);
    memset(types, 0, sizeof types);
    for (int L = 0; L < c->n_layers; L++) types[L] = c->layer_is_mla[L] ? 1 : 0;
    h->payload_len = krun_state_payload_len(h, types);
    if (!h->payload_len) { krun_err_set(err, KRUN_EINPUT, "%s: nothing consistent to save", s->path); return -1; }
    memcpy(hd + H_MAGIC, KRUN_STATE_MAGIC, 8);
    put16(hd + H_MAJOR, h->major);
    put16(hd + H_MINOR, h->minor);
    put32(hd + H_SIZE, KRUN_STATE_HEADER);
    put64(hd + H_SET_ID, h->set_id);
    put64(hd + H_CONFIG, h->config_xxh3);
    put32(hd + H_LAYERS, h->n_layers);
    put32(hd + H_HIDDEN, h->hidden);
    put32(hd + H_VOCAB, h->vocab);
    put32(hd + H_KDA_HEADS, h->kda_heads);
    put32(hd + H_KDA_DIM, h->kda_head_dim);
    put32(hd + H_CONV, h->conv_width);
    put32(hd + H_KV_LORA, h->kv_lora);
    put32(hd + H_QK_ROPE, h->qk_rope);
    put32(hd + H_N_KDA, h->n_kda);
    put32(hd + H_N_MLA, h->n_mla);
    put64(hd + H_POS, h->pos);
    put64(hd + H_N_TOKENS, h->n_tokens);
    put32(hd + H_FLAGS, h->flags);
    put64(hd + H_SEED, h->seed);
    put64(hd + H_STREAM, h->stream);
    put64(hd + H_REPLY, h->reply_from);
    put32(hd + H_SAMPLER, KRUN_STATE_SAMPLER_PHILOX);
    if (h->flags & KRUN_STATE_DRAFTER) {
        put32(hd + H_RESERVED1, h->draft_width);
        put32(hd + H_RESERVED3, h->draft_hidden);
        put64(hd + H_RESERVED2, h->draft_set_id);
        put64(hd + H_RESERVED2 + 8, h->draft_config_xxh3);
    }
    put64(hd + H_PAYLOAD, h->payload_len);
    put64(hd + H_XXH3, XXH3_64bits(hd, H_XXH3));

    if (!(w->x = XXH3_createState())) { krun_err_set(err, KRUN_ENOMEM, "saving %s: out of memory", s->path); return -1; }
    w->s = s;
    w->h = *h;
    ksave_write(s, hd, sizeof hd);
    XXH3_64bits_reset(w->x);
    emit(w, types, (size_t)types_bytes(h));
    emit(w, tokens, (size_t)h->n_tokens * 4);
    return 0;
}

void krun_state_write_layer(krun_state_writer *w, const k3_config *c, int L, const float *S, const float *conv, const float *mla)
{
    if (c->layer_is_mla[L]) {
        emit(w, mla, (size_t)w->h.pos * k3_mla_row(c) * 4);
    } else {
        emit(w, S, k3_kda_S_floats(c) * 4);
        emit(w, conv, k3_kda_conv_floats(c) * 4);
    }
}

void krun_state_write_end(krun_state_writer *w, const float *logits, const krun_state_draft *d)
{
    uint8_t tail[8];
    if (w->h.flags & KRUN_STATE_LOGITS) emit(w, logits, (size_t)w->h.vocab * 4);
    if (w->h.flags & KRUN_STATE_DRAFTER) {
        /* rows 0 .. pos - 2 (zeros before start: a state whose drafter began later), then the pending row */
        const krun_state_hdr *h = &w->h;
        const uint64_t start = d ? d->start : h->pos;
        const int pend = d && d->has_pending;
        uint8_t desc[KRUN_STATE_DRAFT_DESC] = {0};
        static const float zeros[1024];
        put64(desc, start);
        put32(desc + 8, (uint32_t)pend);
        emit(w, desc, sizeof desc);
        for (uint64_t q = 0; q < draft_rows(h); q++) {
            if (q >= start) { emit(w, d->rows + q * h->draft_width, (size_t)h->draft_width * 4); continue; }
            for (uint64_t k = 0; k < h->draft_width; k += 1024) emit(w, zeros, (size_t)(h->draft_width - k < 1024 ? h->draft_width - k : 1024) * 4);
        }
        if (pend) emit(w, d->pending, (size_t)h->draft_hidden * 4);
        else for (uint64_t k = 0; k < h->draft_hidden; k += 1024) emit(w, zeros, (size_t)(h->draft_hidden - k < 1024 ? h->draft_hidden - k : 1024) * 4);
    }
    put64(tail, XXH3_64bits_digest(w->x));
    ksave_write(w->s, tail, sizeof tail);
    krun_state_write_drop(w);
}

void krun_state_write_drop(krun_state_writer *w)
{
    if (w->x) XXH3_freeState(w->x);
    w->x = NULL;
}

int krun_state_write_to_far(ksave *s, krun_state_hdr *h, const k3_config *c, const int32_t *tokens, const k3_state *st,
                            const float *logits, const krun_state_draft *d, const krun_state_far *far, krun_err *err)
{
    krun_state_writer w;
    if (krun_state_write_begin(&w, s, h, c, tokens, err)) return -1;
    for (int L = 0; L < c->n_layers; L++) {
        if (far && !st->mla_cache[L] && !st->kda_S[L]) {
            /* another rank's layer: fetched into far's buffer */
            float *S = far->buf, *conv = far->buf + k3_kda_S_floats(c);
            if (far->get(far->ctx, st, L, S, conv, far->buf, err)) { krun_state_write_drop(&w); return -1; }
            krun_state_write_layer(&w, c, L, S, conv, far->buf);
            continue;
        }
        krun_state_write_layer(&w, c, L, st->kda_S[L], st->kda_conv[L], st->mla_cache[L]);
    }
    krun_state_write_end(&w, logits, d);
    return 0;
}

int krun_state_write_to(ksave *s, krun_state_hdr *h, const k3_config *c, const int32_t *tokens, const k3_state *st,
                        const float *logits, const krun_state_draft *d, krun_err *err)
{
    return krun_state_write_to_far(s, h, c, tokens, st, logits, d, NULL, err);
}

int krun_state_write_far(const char *path, krun_state_hdr *h, const k3_config *c, const int32_t *tokens, const k3_state *st,
                         const float *logits, const krun_state_draft *d, const krun_state_far *far, krun_err *err)
{
    ksave s;
    if (ksave_target_ok(path, krun_state_is_file, "a krun state file", err) || ksave_begin(&s, path, err)) return -1;
    if (krun_state_write_to_far(&s, h, c, tokens, st, logits, d, far, err)) { ksave_abort(&s); return -1; }
    return ksave_commit(&s, err);
}

int krun_state_write(const char *path, krun_state_hdr *h, const k3_config *c, const int32_t *tokens, const k3_state *st,
                     const float *logits, const krun_state_draft *d, krun_err *err)
{
    return krun_state_write_far(path, h, c, tokens, st, logits, d, NULL, err);
}

void krun_state_restore(const void *buf, const krun_state_hdr *h, const k3_config *c, int32_t *tokens, k3_state *st,
                        float *logits, krun_state_draft *d)
{
    krun_err e;
    krun_state_restore_far(buf, h, c, tokens, st, logits, d, NULL, &e);
}

int krun_state_restore_far(const void *buf, const krun_state_hdr *h, const k3_config *c, int32_t *tokens, k3_state *st,
                           float *logits, krun_state_draft *d, const krun_state_far *far, krun_err *err)
{
    const uint8_t *b = buf, *p = b + h->layers_at;
    const size_t row = k3_mla_row(c);
    memcpy(tokens, b + h->tokens_at, (size_t)h->n_tokens * 4);
    for (int L = 0; L < c->n_layers; L++) {
        if (far && !st->mla_cache[L] && !st->kda_S[L]) {
            /* another rank's layer: sent there from the image (copied: the image need not be aligned) */
            const size_t n = c->layer_is_mla[L] ? (size_t)h->pos * row : k3_kda_S_floats(c) + k3_kda_conv_floats(c);
            memcpy(far->buf, p, n * 4);
            p += n * 4;
            if (far->put(far->ctx, st, L, far->buf, far->buf + k3_kda_S_floats(c), far->buf, (size_t)h->pos, err)) return -1;
            continue;
        }
        if (c->layer_is_mla[L]) {
            memcpy(st->mla_cache[L], p, (size_t)h->pos * row * 4);
            p += (size_t)h->pos * row * 4;
        } else {
            memcpy(st->kda_S[L], p, k3_kda_S_floats(c) * 4);
            p += k3_kda_S_floats(c) * 4;
            memcpy(st->kda_conv[L], p, k3_kda_conv_floats(c) * 4);
            p += k3_kda_conv_floats(c) * 4;
        }
    }
    if (h->flags & KRUN_STATE_LOGITS) memcpy(logits, b + h->logits_at, (size_t)h->vocab * 4);
    st->pos = (size_t)h->pos;
    if (!d) return 0;
    d->start = h->pos;
    d->has_pending = 0;
    if ((h->flags & KRUN_STATE_DRAFTER) && d->cap >= draft_rows(h)) {
        const uint8_t *q = b + h->draft_at;
        const size_t rows = (size_t)(draft_rows(h) * h->draft_width) * 4;
        d->start = get64(q);
        d->has_pending = get32(q + 8) == 1;
        memcpy(d->rows, q + KRUN_STATE_DRAFT_DESC, rows);
        memcpy(d->pending, q + KRUN_STATE_DRAFT_DESC + rows, (size_t)h->draft_hidden * 4);
    }
    return 0;
}

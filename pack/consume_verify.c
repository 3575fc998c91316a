/* Before a shard is deleted: are its bytes durable in the output?
 * (consume_state.h)  What is read back comes from the device: the partial
 * files' pages are dropped from the page cache first (they were synced). */
#include "consume_state.h"

#include "copy.h"
#include "output.h"
#include "format/kos.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define READ_PIECE ((size_t)8 << 20)

/* Decoded bytes of written extents, one block decoded at a time (a shard's
 * tensors come in its own order, several per block). */
struct extent_reader {
    const kp_plan *p;
    const int *fds;
    uint8_t *stored, *raw;
    size_t stored_cap, raw_cap;
    uint32_t extent, block;  /* the block in raw (KC_NONE: none) */
};

static int reserve(uint8_t **buf, size_t *cap, size_t n)
{
    uint8_t *g;
    if (n <= *cap) return 0;
    if (!(g = realloc(*buf, n))) return -1;
    *buf = g;
    *cap = n;
    return 0;
}

/* Read block k of extent e and decode it into r->raw (its raw_xxh3 checked). */
static int load_block(struct extent_reader *r, uint32_t e, uint32_t k, char *err, size_t errlen)
{
    const kpk_extent *x = &r->p->extents[e];
    const kpk_block *b = &r->p->blocks[x->first_block + k];
    kpk_err ke = {0};
    char d[64];
    if (r->extent == e && r->block == k) return 0;
    kpk_extent_describe(x, d, sizeof d);
    if (reserve(&r->stored, &r->stored_cap, b->stored_len + 1u) || reserve(&r->raw, &r->raw_cap, b->raw_len + 1u)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (kp_read_target(r->p, r->fds, x->member, x->offset + b->stored_off, r->stored, b->stored_len)) {
        snprintf(err, errlen, "reading the %s back: %s", d, strerror(errno));
        return -1;
    }
    if (kpk_block_decode_one(b, r->stored, r->raw, &ke)) {
        snprintf(err, errlen, "the %s, block %u, as written: %s", d, k, ke.msg);
        r->extent = KC_NONE;
        return -1;
    }
    r->extent = e;
    r->block = k;
    return 0;
}

/* Bytes [pos, pos + len) of extent e's decoded bytes. */
static int read_decoded(struct extent_reader *r, uint32_t e, uint64_t pos, uint8_t *dst, uint64_t len, char *err, size_t errlen)
{
    const kpk_extent *x = &r->p->extents[e];
    if (x->codec != KPK_CODEC_BLOCKS) {
        if (kp_read_target(r->p, r->fds, x->member, x->offset + pos, dst, len) == 0) return 0;
        snprintf(err, errlen, "reading OUT back at extent %u: %s", e, strerror(errno));
        return -1;
    }
    for (uint32_t k = 0, n = kp_extent_nblocks(r->p, e); k < n && len; k++) {
        const kpk_block *b = &r->p->blocks[x->first_block + k];
        uint64_t a, z;
        if (b->raw_off + b->raw_len <= pos) continue;
        if (load_block(r, e, k, err, errlen)) return -1;
        a = pos - b->raw_off;
        z = b->raw_len - a < len ? b->raw_len - a : len;
        memcpy(dst, r->raw + a, z);
        dst += z;
        pos += z;
        len -= z;
    }
    if (len) { snprintf(err, errlen, "extent %u: its blocks end before the bytes asked for", e); return -1; }
    return 0;
}

/* The shard rebuilt in file order from what is durable, through SHA-256:
 * 0, 1 when it is not the SHA-256 checked, -1 on another error. */
static int verify_sha(struct kc_state *c, uint32_t s, uint32_t done, struct extent_reader *r, const kc_piece *pieces,
                      uint32_t np, const uint8_t *data, kprogress *prog, char *err, size_t errlen)
{
    const struct kc_shard *h = &c->sh[s];
    const ks_shard *ks = &c->src->shards[s];
    const kp_plan *p = c->p;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    uint8_t *buf = malloc(READ_PIECE), sum[32];
    unsigned int mdlen = 0;
    char hex[65];
    uint64_t pos = 0;
    int rc = -1;
    if (!md || !buf || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) { snprintf(err, errlen, "out of memory"); goto out; }
    for (size_t k = 0; k < h->nt; k++) {
        uint64_t t = h->t[k], len = p->tensors[t].nbytes, src = p->from[t].offset;
        uint32_t e = p->tensors[t].extent, piece = KC_NONE;
        uint64_t data_at = 0;
        if (src != pos) {
            snprintf(err, errlen, "the plan does not cover it byte for byte at offset %llu", (unsigned long long)pos);
            goto out;
        }
        if (e >= done) { /* a staged piece: not in the partial files yet */
            for (uint32_t i = 0; i < np && piece == KC_NONE; i++) {
                if (pieces[i].src_off == src && pieces[i].len == len) piece = i;
                else data_at += pieces[i].len;
            }
            if (e != h->archive || piece == KC_NONE) {
                snprintf(err, errlen, "its bytes at offset %llu are neither durable nor staged", (unsigned long long)src);
                goto out;
            }
        }
        for (uint64_t at = 0; at < len;) {
            size_t n = len - at < READ_PIECE ? (size_t)(len - at) : READ_PIECE;
            if (e < done) {
                if (read_decoded(r, e, p->tensors[t].offset + at, buf, n, err, errlen)) goto out;
            } else if (data) {
                memcpy(buf, data + data_at + at, n);
            } else if (kc_log_read(&c->log, &pieces[piece], at, buf, n)) {
                snprintf(err, errlen, "reading %s: %s", c->log_path, strerror(errno));
                goto out;
            }
            if (EVP_DigestUpdate(md, buf, n) != 1) { snprintf(err, errlen, "SHA-256 failed"); goto out; }
            at += n;
            kprogress_add(prog, 0);
        }
        pos += len;
    }
    if (pos != ks->size) {
        snprintf(err, errlen, "the plan covers %llu of its %llu bytes", (unsigned long long)pos, (unsigned long long)ks->size);
        goto out;
    }
    if (EVP_DigestFinal_ex(md, sum, &mdlen) != 1 || mdlen != 32) { snprintf(err, errlen, "SHA-256 failed"); goto out; }
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", sum[i]);
    if (strcmp(hex, ks->expect_sha) != 0) {
        snprintf(err, errlen, "rebuilt from what %s.partial holds, it has SHA-256 %.16s..., not %.16s... (%s)", c->out, hex,
                 ks->expect_sha, ks->sha_from ? ks->sha_from : "recorded");
        rc = 1;
        goto out;
    }
    rc = 0;
out:
    EVP_MD_CTX_free(md);
    free(buf);
    return rc;
}

/* Every durable extent holding its bytes, read back and compared with the
 * checksums computed from the bytes read (each block decoded and checked). */
static int verify_extents(struct kc_state *c, uint32_t s, uint32_t done, struct extent_reader *r, kprogress *prog,
                          uint32_t *bad, char *err, size_t errlen)
{
    const struct kc_shard *h = &c->sh[s];
    const kp_plan *p = c->p;
    XXH3_state_t *st = XXH3_createState();
    uint32_t last = KC_NONE;
    int rc = -1;
    if (!st) { snprintf(err, errlen, "out of memory"); goto out; }
    for (size_t k = 0; k < h->nt; k++) {
        uint32_t e = p->tensors[h->t[k]].extent;
        const kpk_extent *x = &p->extents[e];
        uint64_t got = 0;
        char d[64];
        if (e >= done || e == last) continue; /* staged pieces: the log reads its record back */
        last = e;
        *bad = e;
        if (x->codec == KPK_CODEC_BLOCKS) {
            XXH3_64bits_reset(st);
            for (uint32_t b = 0, n = kp_extent_nblocks(p, e); b < n; b++) {
                if (load_block(r, e, b, err, errlen)) goto out;
                XXH3_64bits_update(st, r->stored, p->blocks[x->first_block + b].stored_len);
                kprogress_add(prog, 0);
            }
            got = XXH3_64bits_digest(st);
        } else if (kp_hash_written_extent(p, r->fds, e, &got)) {
            snprintf(err, errlen, "reading OUT back at extent %u: %s", e, strerror(errno));
            goto out;
        }
        kprogress_add(prog, 0);
        if (got != x->stored_xxh3) {
            kpk_extent_describe(x, d, sizeof d);
            snprintf(err, errlen, "the %s as written in %s.partial does not match the checksum computed when it was read: "
                     "the output's disk returned other bytes than were written; check it (dmesg, smartctl)", d, c->out);
            goto out;
        }
    }
    *bad = KC_NONE;
    rc = 0;
out:
    XXH3_freeState(st);
    return rc;
}

int kc_verify_shard(struct kc_state *c, uint32_t s, uint32_t done, const int *fds, const kc_piece *pieces, uint32_t n_pieces,
                    const uint8_t *data, kprogress *prog, uint32_t *bad, char *err, size_t errlen)
{
    const ks_shard *ks = &c->src->shards[s];
    struct extent_reader r = {.p = c->p, .fds = fds, .extent = KC_NONE, .block = KC_NONE};
    int rc;
    for (uint32_t m = 0; m < c->p->n_members; m++) kos_cache_drop(fds[m], 0, 0);
    *bad = KC_NONE;
    if (ks->expect_sha[0] && strcmp(ks->got_sha, ks->expect_sha) == 0) {
        size_t at;
        char why[600];
        rc = verify_sha(c, s, done, &r, pieces, n_pieces, data, prog, err, errlen);
        at = rc == 1 ? strlen(err) : 0;
        /* which extent, and whose fault: the first that does not read back
         * (the output's disk), else all of the shard's (its bytes as read) */
        if (rc == 1 && verify_extents(c, s, done, &r, prog, bad, why, sizeof why))
            snprintf(err + at, errlen - at, "; %s", why);
        else if (rc == 1) {
            for (size_t k = 0; k < c->sh[s].nt; k++) {
                uint32_t e = c->p->tensors[c->sh[s].t[k]].extent;
                if (e < done && (*bad == KC_NONE || e < *bad)) *bad = e;
            }
            snprintf(err + at, errlen - at, ", although every extent holding it reads back as written: the bytes read from "
                     "%s during the conversion are not those whose SHA-256 was checked before it (the file changed "
                     "meanwhile, or its disk returned other bytes); check that disk (dmesg, smartctl)", ks->path);
        }
    } else {
        rc = verify_extents(c, s, done, &r, prog, bad, err, errlen);
    }
    free(r.stored);
    free(r.raw);
    return rc ? -1 : 0;
}

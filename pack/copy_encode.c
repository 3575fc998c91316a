/* The conversion's encoder threads: the blocks of codec-2 chunks coded in
 * parallel, any block by any thread (copy_pipe.h).  A block's stored bytes
 * depend on its raw bytes and the settings only, so the output is the same
 * for any number of threads. */
#include "copy_pipe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Encoded all-zero blocks, by recipe and length: a sparse source (the
 * virtual K3) has thousands of hole blocks of a few lengths, and a chunk of
 * holes is never filled (buf is not zeroed), so they are looked up here. */
#define ZMEMO 32
struct kp_zero_memo {
    pthread_mutex_t mu;
    struct { int recipe; uint32_t len; kpk_block rec; uint8_t *stored; } e[ZMEMO];
    unsigned n, next;
    uint8_t *zeros;          /* max_cut zero bytes, encoded once per (recipe, length) */
};

size_t kp_slot_bound(const struct pipe *pp, uint32_t cut) { return kpk_encode_bound(pp->p->cuts[cut].raw_len); }

/* Encode a block of len zero bytes into out; -1 on failure. */
static int zero_block(struct pipe *pp, kpk_encoder *enc, int recipe, uint32_t len, uint8_t *out, kpk_block *rec)
{
    struct kp_zero_memo *m = pp->zmemo;
    uint8_t *copy;
    pthread_mutex_lock(&m->mu);
    for (unsigned i = 0; i < m->n; i++)
        if (m->e[i].recipe == recipe && m->e[i].len == len) {
            *rec = m->e[i].rec;
            memcpy(out, m->e[i].stored, rec->stored_len);
            pthread_mutex_unlock(&m->mu);
            return 0;
        }
    pthread_mutex_unlock(&m->mu);
    if (kpk_encode_block(enc, recipe, m->zeros, len, out, kpk_encode_bound(len), rec)) return -1;
    if (!(copy = malloc(rec->stored_len ? rec->stored_len : 1))) return 0; /* not remembered: still correct */
    memcpy(copy, out, rec->stored_len);
    pthread_mutex_lock(&m->mu);
    free(m->e[m->next].stored);
    m->e[m->next].recipe = recipe;
    m->e[m->next].len = len;
    m->e[m->next].rec = *rec;
    m->e[m->next].stored = copy;
    m->next = (m->next + 1) % ZMEMO;
    if (m->n < ZMEMO) m->n++;
    pthread_mutex_unlock(&m->mu);
    return 0;
}

/* The next block to encode: the oldest filled codec-2 chunk with one left.
 * Called with pp->mu held. */
static struct chunk *take(struct pipe *pp, uint32_t *k)
{
    for (unsigned i = pp->tail; i != pp->head; i++) {
        struct chunk *c = &pp->ring[i % pp->nbuf];
        if (c->state == SLOT_FILLED && c->ncut && c->next_cut < c->ncut) {
            *k = c->next_cut++;
            return c;
        }
    }
    return NULL;
}

static void *encoder_main(void *arg)
{
    struct pipe *pp = arg;
    kpk_encoder *enc = kp_encoder_new(pp->codec);
    pthread_mutex_lock(&pp->mu);
    for (;;) {
        struct chunk *c;
        uint32_t k;
        int bad;
        while (!(c = take(pp, &k)) && !pp->enc_stop) pthread_cond_wait(&pp->cv, &pp->mu);
        if (!c) break;
        pthread_mutex_unlock(&pp->mu);
        {
            uint32_t cut = c->cut0 + k;
            const kp_cut *ct = &pp->p->cuts[cut];
            kpk_block *rec = &pp->blocks[cut];
            int recipe = kp_class_recipe(ct->cls);
            uint8_t *out = c->out + c->slot[k];
            bad = !enc;
            if (!bad && c->all_zero) bad = zero_block(pp, enc, recipe, ct->raw_len, out, rec);
            else if (!bad) bad = kpk_encode_block(enc, recipe, c->buf + (ct->raw_off - c->pos), ct->raw_len, out,
                                                  kp_slot_bound(pp, cut), rec);
        }
        pthread_mutex_lock(&pp->mu);
        if (bad && !pp->failed) {
            pp->failed = 1;
            pp->stop = 1;
            snprintf(pp->err, sizeof pp->err, "%s", enc ? "encoding a block failed (zstd)" : "out of memory");
        }
        if (++c->cuts_done == c->ncut) c->state = SLOT_ENCODED;
        pthread_cond_broadcast(&pp->cv);
    }
    pthread_mutex_unlock(&pp->mu);
    kpk_encoder_free(enc);
    return NULL;
}

int kp_encoders_start(struct pipe *pp, int n, pthread_t *tid, int *started)
{
    struct kp_zero_memo *m;
    *started = 0;
    if (!pp->p->n_blocks) return 0;
    if (!(m = calloc(1, sizeof *m)) || !(m->zeros = calloc(1, pp->p->max_cut + 1))) { free(m); return -1; }
    pthread_mutex_init(&m->mu, NULL);
    pp->zmemo = m;
    for (int i = 0; i < n; i++) {
        if (pthread_create(&tid[i], NULL, encoder_main, pp)) return *started ? 0 : -1;
        (*started)++;
    }
    return 0;
}

void kp_encoders_stop(struct pipe *pp, pthread_t *tid, int started)
{
    struct kp_zero_memo *m = pp->zmemo;
    pthread_mutex_lock(&pp->mu);
    pp->enc_stop = 1;
    pthread_cond_broadcast(&pp->cv);
    pthread_mutex_unlock(&pp->mu);
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
    if (!m) return;
    for (unsigned i = 0; i < m->n; i++) free(m->e[i].stored);
    free(m->zeros);
    pthread_mutex_destroy(&m->mu);
    free(m);
    pp->zmemo = NULL;
}

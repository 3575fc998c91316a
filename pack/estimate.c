/* Sampling the source for the compressed size estimate (estimate.h). */
#include "estimate.h"

#include "consume.h"
#include "copy_pipe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The extent holding block b (binary search on first_block). */
static uint32_t extent_of_block(const kp_plan *p, uint64_t b)
{
    uint32_t lo = 0, hi = p->n_extents;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (p->extents[mid].first_block <= b) lo = mid; else hi = mid;
    }
    while (lo > 0 && p->extents[lo].codec != KPK_CODEC_BLOCKS) lo--;
    return lo;
}

int kp_estimate_ratios(const kp_input *in, kp_plan *p, kp_estimate_note *note, char *err, size_t errlen)
{
    struct pipe pp;
    uint64_t raw[KP_BC_COUNT] = {0}, stored[KP_BC_COUNT] = {0};
    uint8_t *buf = NULL, *out = NULL;
    kpk_encoder *enc = NULL;
    int rc = -1;
    memset(note, 0, sizeof *note);
    for (int c = 0; c < KP_BC_COUNT; c++) p->est_ratio[c] = 1.0;
    if (!p->n_blocks) return 0;
    for (uint64_t b = 0; b < p->n_blocks; b++) note->blocks[p->cuts[b].cls]++;
    memset(&pp, 0, sizeof pp);
    pp.in = in;
    pp.p = p;
    buf = malloc(p->max_cut + 1);
    out = malloc(kpk_encode_bound(p->max_cut));
    enc = kp_encoder_new(&p->opt.codec);
    if (!buf || !out || !enc) { snprintf(err, errlen, "out of memory"); goto out; }
    if (kp_sources_open(&pp, err, errlen)) goto out;
    for (int cls = 0; cls < KP_BC_COUNT; cls++) {
        uint64_t n = note->blocks[cls], seen = 0;
        if (!n || kp_class_recipe(cls) == KPK_ENC_RAW) continue;
        /* KP_ESTIMATE_SAMPLES blocks of the class, evenly spread over the file */
        for (uint64_t b = 0; b < p->n_blocks && note->sampled[cls] < KP_ESTIMATE_SAMPLES; b++) {
            const kp_cut *c = &p->cuts[b];
            uint32_t e;
            int zero;
            kpk_block rec;
            if (c->cls != cls) continue;
            if (seen++ * KP_ESTIMATE_SAMPLES < (uint64_t)note->sampled[cls] * n) continue;
            e = extent_of_block(p, b);
            if (in->consume && kc_extent_consumed(in->consume, e)) continue; /* its shard is gone: sample another */
            if (kp_fill_range(&pp, e, c->raw_off, c->raw_len, buf, &zero)) {
                snprintf(err, errlen, "sampling the source for the size estimate: %s", pp.err);
                goto out;
            }
            if (zero) memset(buf, 0, c->raw_len);
            if (kpk_encode_block(enc, kp_class_recipe(cls), buf, c->raw_len, out, kpk_encode_bound(c->raw_len), &rec)) {
                snprintf(err, errlen, "encoding a sample block failed (zstd)");
                goto out;
            }
            raw[cls] += c->raw_len;
            stored[cls] += rec.stored_len;
            note->sampled[cls]++;
        }
        if (raw[cls]) p->est_ratio[cls] = (double)stored[cls] / (double)raw[cls];
    }
    rc = 0;
out:
    kp_sources_close(&pp);
    kpk_encoder_free(enc);
    free(buf);
    free(out);
    return rc;
}

/* The non-text shards of the --virtual layout (released shards 95 and 96).
 *
 * Their real inventory is unknown (spec §1.2: 168 tensors, obtained by
 * subtraction).  We invent a plausible MoonViT-V2 tower (27 blocks of hidden
 * 1024, MLP 4096, patch 14) and a patch-merger projector, 168 tensors in all,
 * and let two tensors per shard (a matrix [rows, C] and a bias of 1..C
 * elements) absorb whatever bytes are left so the file size equals the
 * released one exactly.  Text inference never reads them; they are
 * there so a repacker sees (and drops) vision_tower.* / mm_projector.* names. */
#include "synth.h"
#include "format/errbuf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void add(synth_tensor *t, size_t *n, const char *name, int ndim, uint64_t a, uint64_t b, uint64_t c,
                uint64_t d)
{
    synth_tensor *x = &t[(*n)++];
    uint64_t s[4] = {a, b, c, d};
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->role = -1;
    x->layer = -1;
    x->expert = -1;
    x->dtype = x->release_dtype = KPK_DT_BF16;
    x->ndim = ndim;
    x->nbytes = 2;
    for (int i = 0; i < ndim; i++) {
        x->shape[i] = s[i];
        x->nbytes *= s[i];
    }
}

int synth_vision_shard(int idx, uint64_t file_size, synth_tensor **out, size_t *nout, uint64_t *data_size, char *err,
                       size_t errlen)
{
    enum { VH = 1024, VMLP = 4096, VLAYERS = 27, MAXT = 200 };
    synth_tensor *t = calloc(MAXT, sizeof *t);
    size_t n = 0;
    /* two absorbers per shard: a matrix [rows, C] and a bias of 1..C elements */
    const char *mat = idx == 0 ? "mm_projector.proj.2.weight" : "vision_tower.pos_emb.weight";
    const char *vec = idx == 0 ? "mm_projector.proj.0.bias" : "vision_tower.patch_embed.proj.bias";
    const uint64_t C = idx == 0 ? 4 * VH : VH;
    uint64_t fixed = 0, last_n = 0;

    if (!t) {
        errbuf_set(err, errlen, "out of memory");
        return -1;
    }
    if (idx == 0) {
        add(t, &n, "mm_projector.proj.0.weight", 2, 4 * VH, 4 * VH, 0, 0);
    } else {
        char name[K3_NAME_MAX];
        add(t, &n, "vision_tower.patch_embed.proj.weight", 4, VH, 3, 14, 14);
        for (int L = 0; L < VLAYERS; L++) {
#define BLK(suffix, nd, a, b)                                                              \
    do {                                                                                   \
        snprintf(name, sizeof name, "vision_tower.encoder.blocks.%d.%s", L, suffix);       \
        add(t, &n, name, nd, a, b, 0, 0);                                                  \
    } while (0)
            BLK("norm0.weight", 1, VH, 0);
            BLK("norm1.weight", 1, VH, 0);
            BLK("wqkv.weight", 2, 3 * VH, VH);
            BLK("wo.weight", 2, VH, VH);
            BLK("mlp.fc0.weight", 2, VMLP, VH);
            BLK("mlp.fc1.weight", 2, VH, VMLP);
#undef BLK
        }
    }
    for (size_t i = 0; i < n; i++) fixed += t[i].nbytes;
    add(t, &n, mat, 2, 1, C, 0, 0);
    add(t, &n, vec, 1, 1, 0, 0, 0);

    /* fixed point: the header length depends on the absorbers' shapes and offsets */
    for (int iter = 0; iter < 64; iter++) {
        char *hdr;
        size_t hlen;
        uint64_t rest, rows;
        synth_layout(t, n);
        if (synth_header(t, n, &hdr, &hlen) != 0) {
            errbuf_set(err, errlen, "out of memory");
            free(t);
            return -1;
        }
        free(hdr);
        if (iter > 0 && hlen == last_n) {
            *out = t;
            *nout = n;
            *data_size = file_size - 8 - hlen;
            return 0;
        }
        last_n = hlen;
        if (file_size < 8 + hlen + fixed + 2 * C + 2 || (file_size - 8 - hlen - fixed) % 2) {
            errbuf_set(err, errlen, "vision shard %d: %llu bytes cannot be filled", idx + 95, (unsigned long long)file_size);
            free(t);
            return -1;
        }
        rest = (file_size - 8 - hlen - fixed) / 2; /* elements left for the two absorbers */
        rows = (rest - 1) / C;                     /* leaves 1..C elements for the bias */
        for (size_t i = 0; i < n; i++) {
            if (strcmp(t[i].name, mat) == 0) {
                t[i].shape[0] = rows;
                t[i].nbytes = 2 * rows * C;
            } else if (strcmp(t[i].name, vec) == 0) {
                t[i].shape[0] = rest - rows * C;
                t[i].nbytes = 2 * t[i].shape[0];
            }
        }
    }
    errbuf_set(err, errlen, "vision shard %d: header size does not converge", idx + 95);
    free(t);
    errno = EINVAL;
    return -1;
}

/* --vision: a handful of small non-text tensors in the release's names and
 * dtypes (BF16 matrices, an F32 bias), generated like any other tensor, so
 * a conversion has something to keep in its archive and give back. */
size_t synth_vision_small(synth_tensor *t)
{
    size_t n = 0;
    add(t, &n, "mm_projector.proj.0.weight", 2, 64, 128, 0, 0);
    add(t, &n, "mm_projector.proj.0.bias", 1, 64, 0, 0, 0);
    t[n - 1].dtype = t[n - 1].release_dtype = KPK_DT_F32;
    t[n - 1].nbytes = 4 * 64;
    add(t, &n, "vision_tower.encoder.blocks.0.wqkv.weight", 2, 96, 32, 0, 0);
    add(t, &n, "vision_tower.patch_embed.proj.weight", 4, 32, 3, 4, 4);
    return n;
}

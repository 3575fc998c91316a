/* The state pager (run/engine/statepage.h) against resident copies of the
 * same states: blocks of random subsets of the slots, each with its own
 * number of new positions, run layer by layer as the forward pass calls the
 * pager; at every layer the window must hold exactly what the resident copy
 * holds (KDA state and history, MLA rows 0..pos), and the "compute" changes
 * both alike.  Slots are reset between blocks (no I/O: they must read as
 * zeros); a block may keep fewer positions than it ran (a speculative
 * verification: the rows after them are on disk and rewritten later).  A layer count and pattern where 3 consecutive layers hold 2 MLA
 * layers checks the window's kinds; a byte flipped in the file must fail
 * the next read with KRUN_EDATA naming the slot and layer, and the file is
 * removed at close. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "check.h"
#include "testrand.h"
#include "run/engine/statepage.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SLOTS 5
#define CTX 300
#define NL 7

static k3_config cfg;
static float *ref_S[SLOTS][NL], *ref_conv[SLOTS][NL], *ref_mla[SLOTS][NL];
static size_t ref_pos[SLOTS];

static float val(void) { return (float)(rnd() % 100000) / 997.0f - 50.0f; }

/* The window's layer L of slot k equals the resident copy (rows 0..pos for MLA). */
static int same_as_ref(const k3_state *st, size_t k, int L)
{
    if (cfg.layer_is_mla[L]) return !memcmp(st->mla_cache[L], ref_mla[k][L], ref_pos[k] * k3_mla_row(&cfg) * sizeof(float));
    return !memcmp(st->kda_S[L], ref_S[k][L], k3_kda_S_floats(&cfg) * sizeof(float)) &&
           !memcmp(st->kda_conv[L], ref_conv[k][L], k3_kda_conv_floats(&cfg) * sizeof(float));
}

/* What a layer does to a sequence's state, on the window and on the copy alike. */
static void compute(k3_state *st, size_t k, int L, size_t n)
{
    if (cfg.layer_is_mla[L]) {
        const size_t row = k3_mla_row(&cfg);
        for (size_t i = ref_pos[k] * row; i < (ref_pos[k] + n) * row; i++) st->mla_cache[L][i] = ref_mla[k][L][i] = val();
    } else {
        for (size_t i = 0; i < k3_kda_S_floats(&cfg); i++) st->kda_S[L][i] = ref_S[k][L][i] = ref_S[k][L][i] * 0.5f + val();
        for (size_t i = 0; i < k3_kda_conv_floats(&cfg); i++) st->kda_conv[L][i] = ref_conv[k][L][i] = val();
    }
}

static void ref_reset(size_t k)
{
    ref_pos[k] = 0;
    for (int L = 0; L < NL; L++) {
        if (cfg.layer_is_mla[L]) continue;
        memset(ref_S[k][L], 0, k3_kda_S_floats(&cfg) * sizeof(float));
        memset(ref_conv[k][L], 0, k3_kda_conv_floats(&cfg) * sizeof(float));
    }
}

int main(void)
{
    char dir[] = "/tmp/statepage.XXXXXX", sub[64];
    k3_pager *p = NULL;
    k3_state st[SLOTS];
    uint8_t *tables[SLOTS];
    krun_err e;
    int bad = 0, blocks = 0, resets = 0, shorter = 0;
    const uint8_t mla[NL] = {0, 1, 0, 1, 0, 0, 0};      /* layers 1..3 hold 2 MLA layers: the window needs 2 of them */

    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return check_exit(); }
    snprintf(sub, sizeof sub, "%s/sd", dir);
    cfg.n_layers = NL;
    cfg.kda_heads = 3;
    cfg.kda_head_dim = 24;                 /* a KDA layer: 3x24x24 + 3x3x72 floats, not a page multiple */
    cfg.conv_width = 4;
    cfg.kv_lora = 29;                      /* an MLA row: 33 floats, rows straddle pages */
    cfg.qk_rope = 4;
    memcpy(cfg.layer_is_mla, mla, NL);
    for (size_t k = 0; k < SLOTS; k++)
        for (int L = 0; L < NL; L++) {
            ref_S[k][L] = calloc(k3_kda_S_floats(&cfg), sizeof(float));
            ref_conv[k][L] = calloc(k3_kda_conv_floats(&cfg), sizeof(float));
            ref_mla[k][L] = calloc(CTX * k3_mla_row(&cfg), sizeof(float));
        }
    CHECK(k3_page_window_bytes(&cfg, CTX, SLOTS) ==
              SLOTS * (3 * ((k3_kda_S_floats(&cfg) + k3_kda_conv_floats(&cfg)) * 4 + 4095) / 4096 * 4096 +
                       2 * ((CTX * k3_mla_row(&cfg) * 4 + 4095) / 4096 * 4096)),
          "the window: 3 KDA and 2 MLA regions per slot (the most of each kind in 3 consecutive layers), page-rounded");
    if (k3_pager_open(&p, &cfg, CTX, SLOTS, sub, 1, &e)) { CHECK(0, "k3_pager_open: %s", e.msg); return check_exit(); }
    for (size_t k = 0; k < SLOTS; k++) {
        karena a = {NULL, 0};
        k3_state_carve_tables(&st[k], &cfg, CTX, &a);
        tables[k] = aligned_alloc(KARENA_ALIGN, karena_round(a.used));
        a = (karena){tables[k], 0};
        k3_state_carve_tables(&st[k], &cfg, CTX, &a);
        k3_pager_attach(p, &st[k], k);
    }

    /* blocks of random subsets of the slots, 1..9 new positions each, layer by layer */
    for (int step = 0; step < 60; step++) {
        k3_state *in[SLOTS];
        size_t idx[SLOTS], n[SLOTS], nseg = 0;
        for (size_t k = 0; k < SLOTS; k++) {
            if (rnd() % 12 == 0 && ref_pos[k]) { k3_state_reset(&st[k]); ref_reset(k); resets++; }
            size_t want = 1 + rnd() % 9;
            if (rnd() % 3 == 0 || ref_pos[k] + want > CTX) continue;
            idx[nseg] = k;
            in[nseg] = &st[k];
            n[nseg++] = want;
        }
        if (!nseg) continue;
        if (k3_pager_block_begin(p, in, n, nseg, &e)) { bad++; break; }
        for (int L = 0; L < NL; L++) {
            if (k3_pager_layer_begin(p, L, &e)) { bad++; break; }
            for (size_t g = 0; g < nseg; g++) {
                if (!same_as_ref(&st[idx[g]], idx[g], L)) bad++;
                compute(&st[idx[g]], idx[g], L, n[g]);
            }
            k3_pager_layer_end(p, L);
        }
        if (k3_pager_block_end(p, &e)) bad++;
        for (size_t g = 0; g < nseg; g++) {
            /* a verification that keeps fewer positions than it ran: its MLA rows after them stay on
             * disk, to be rewritten (the KDA state's commit is the forward pass's: journal.h) */
            size_t keep = n[g] > 1 && rnd() % 3 == 0 ? 1 + rnd() % (n[g] - 1) : n[g];
            shorter += keep < n[g];
            st[idx[g]].pos += keep;
            ref_pos[idx[g]] += keep;
        }
        blocks++;
    }
    CHECK(bad == 0 && blocks > 30 && resets > 3 && shorter > 3,
          "%d blocks of random slots and lengths, %d resets, %d keeping fewer positions than they ran: at every layer the window "
          "holds the resident copy's state", blocks, resets, shorter);
    {
        uint64_t r, w;
        double ws;
        k3_pager_counters(p, &r, &w, &ws);
        CHECK(r > 0 && w > 0 && r % 4096 == 0 && w % 4096 == 0, "bytes read (%llu) and written (%llu) in whole pages",
              (unsigned long long)r, (unsigned long long)w);
    }

    /* a byte flipped in the file: the next read of that slot's layer fails, naming it */
    {
        size_t k = 0;
        while (k < SLOTS && ref_pos[k] == 0) k++;
        int fd = open(k3_pager_path(p), O_RDWR);
        uint8_t b;
        /* layer 0 (KDA) of slot k: the file's first section, slot k's region */
        off_t off = (off_t)(k * ((k3_kda_S_floats(&cfg) + k3_kda_conv_floats(&cfg)) * 4 + 4095) / 4096 * 4096 + 100);
        k3_state *in[1] = {&st[k]};
        size_t n1[1] = {1};
        int rc;
        CHECK(k < SLOTS && fd >= 0 && pread(fd, &b, 1, off) == 1 && (b ^= 1, pwrite(fd, &b, 1, off) == 1), "flip a byte of slot %zu", k);
        if (fd >= 0) close(fd);
        rc = k3_pager_block_begin(p, in, n1, 1, &e);
        if (!rc) rc = k3_pager_layer_begin(p, 0, &e);
        CHECK(rc && e.code == KRUN_EDATA && strstr(e.msg, "krun-states") && strstr(e.msg, "layer 0"),
              "a flipped byte fails the read with KRUN_EDATA naming the file, slot and layer: %s", rc ? e.msg : "(no error)");
        /* the block is abandoned; after a reset the slot reads as zeros again */
        k3_state_reset(&st[k]);
        ref_reset(k);
        rc = k3_pager_block_begin(p, in, n1, 1, &e) || k3_pager_layer_begin(p, 0, &e);
        CHECK(!rc && same_as_ref(&st[k], k, 0), "after a reset the slot reads as zeros, no I/O");
        for (int L = 0; L < NL; L++) {
            if (L && k3_pager_layer_begin(p, L, &e)) rc = -1;
            k3_pager_layer_end(p, L);
        }
        CHECK(!rc && !k3_pager_block_end(p, &e), "and runs a block again");
    }
    {
        char path[128];
        snprintf(path, sizeof path, "%s", k3_pager_path(p));
        k3_pager_close(p);
        CHECK(access(path, F_OK) != 0 && access(sub, F_OK) != 0, "close removes the file and the directory it made");
    }
    rmdir(dir);
    for (size_t k = 0; k < SLOTS; k++) {
        free(tables[k]);
        for (int L = 0; L < NL; L++) { free(ref_S[k][L]); free(ref_conv[k][L]); free(ref_mla[k][L]); }
    }
    return check_exit();
}

/* The blocking driver of the SIMD matrix products, shared by kernels_avx2.c,
 * kernels_avx512.c and kernels_neon.c.  It is a template, not a header of
 * declarations: kernels_entry.h includes it once in each of those files,
 * after pick_tile(wt, rows, positions) and that file's MX_PREFETCH and
 * RB_WIDE / RB_MX (rows per tile for several positions), so the driver is
 * compiled for that file's instruction set and calls that file's tiles.  The driver only decides which
 * tile runs on which rows, positions and columns; every sum is the tile's, so
 * the order of operations (docs/NUMERICS.md) does not depend on it.
 *
 * One position (decode, memory-bound): BF16/F16/F32 rows of up to
 * RB1_SHORT_COLS columns one at a time (the activation stays in L1 and a single
 * sequential weight stream runs at full DRAM bandwidth; measured on Zen 4, 24 vs
 * 14 GB/s for 4 interleaved rows), longer rows 4 at a time (the activation no
 * longer fits in L1 beside the stream, and sharing each activation load across 4
 * rows wins: 15 vs 9 GB/s).  MXFP4: two rows per tile with a software prefetch
 * MX_PREFETCH bytes ahead (the hardware prefetcher alone leaves the decode ~35%
 * slower when experts stream from DRAM).  Several positions (prefill, compute-bound): super-blocks of
 * TS positions x MB rows, columns in chunks of CB, so the CB columns of a tile's PB
 * positions stay in L1 while the MB rows go past and the MB x CB weights stay in
 * L2 while the TS positions go past; the first position block prefetches the
 * next chunk.  Accumulators are parked in acc[] between chunks: that changes no
 * operation, only where the partial lanes wait. */
#ifndef KRUN_KERNELS_BLOCKING_H
#define KRUN_KERNELS_BLOCKING_H
#define RB1_WIDE_SHORT 1 /* rows of <= RB1_SHORT_COLS columns */
#define RB1_WIDE_LONG 4
#define RB1_SHORT_COLS 4096
#define RB1_MX 2
#define PB 4
#define TS 16
#define MB 32
#define CB 1024

typedef struct {
    const kmat *W;
    int wt;             /* 0..2 wide, 3 MXFP4 */
    size_t esz;         /* wide: bytes per element */
} mm_ctx;

static void set_rows(const mm_ctx *c, tile_args *a, size_t r)
{
    size_t n = c->W->cols;
    if (c->wt == 3) {
        a->w = (const char *)c->W->data + r * (n / 2);
        a->ws = n / 2;
        a->s = c->W->scales + r * (n / 32);
        a->ss = n / 32;
    } else {
        a->w = (const char *)c->W->data + r * n * c->esz;
        a->ws = n * c->esz;
    }
}

static void kmatmul_rows_blocked(const kmat *W, size_t r0, size_t r1, const float *X, size_t ldx, size_t T,
                                 float *Y, size_t ldy)
{
    size_t n = W->cols;
    if (W->type == KD_MXFP4 && n % 32) {
        kmatmul_rows_scalar(W, r0, r1, X, ldx, T, Y, ldy);
        return;
    }
    mm_ctx c = {W, W->type == KD_F32 ? WT_F32 : W->type == KD_BF16 ? WT_BF16 : W->type == KD_F16 ? WT_F16 : 3,
                W->type == KD_F32 ? 4 : 2};
    size_t nb = c.wt == 3 ? n : n - n % 16;
    tile_args a = {0};
    a.n = n;
    a.ldx = ldx;
    a.ldy = ldy;

    if (T == 1) {
        size_t rb = c.wt == 3 ? RB1_MX : n <= RB1_SHORT_COLS ? RB1_WIDE_SHORT : RB1_WIDE_LONG;
        tile_fn full = pick_tile(c.wt, (int)rb, 1), one = pick_tile(c.wt, 1, 1);
        a.i0 = 0;
        a.i1 = nb;
        a.first = a.last = 1;
        a.pf = c.wt == 3 ? MX_PREFETCH : 0;
        a.x = X;
        size_t r = r0;
        for (; r + rb <= r1; r += rb) {
            set_rows(&c, &a, r);
            a.y = Y + r;
            full(&a);
        }
        for (; r < r1; r++) {
            set_rows(&c, &a, r);
            a.y = Y + r;
            one(&a);
        }
        return;
    }

    const size_t RB = c.wt == 3 ? RB_MX : RB_WIDE;
    float acc[MB * TS * 16];
    a.acc = acc;
    a.accr = TS * 16;
    for (size_t t0 = 0; t0 < T; t0 += TS) {
        size_t tt = T - t0 < TS ? T - t0 : TS;
        for (size_t rb0 = r0; rb0 < r1; rb0 += MB) {
            size_t mm = r1 - rb0 < MB ? r1 - rb0 : MB;
            size_t c0 = 0;
            do {
                size_t c1 = nb - c0 < CB ? nb : c0 + CB;
                a.i0 = c0;
                a.i1 = c1;
                a.first = c0 == 0;
                a.last = c1 == nb;
                for (size_t pb = 0; pb < tt; pb += PB) {
                    int P = (int)(tt - pb < PB ? tt - pb : PB);
                    tile_fn full = pick_tile(c.wt, (int)RB, P), one = pick_tile(c.wt, 1, P);
                    a.x = X + (t0 + pb) * ldx;
                    a.pf = pb == 0 ? (c.wt == 3 ? CB / 2 : CB * c.esz) : 0;
                    size_t rl = 0;
                    for (; rl + RB <= mm; rl += RB) {
                        set_rows(&c, &a, rb0 + rl);
                        a.acc = acc + rl * a.accr + pb * 16;
                        a.y = Y + (t0 + pb) * ldy + rb0 + rl;
                        full(&a);
                    }
                    for (; rl < mm; rl++) {
                        set_rows(&c, &a, rb0 + rl);
                        a.acc = acc + rl * a.accr + pb * 16;
                        a.y = Y + (t0 + pb) * ldy + rb0 + rl;
                        one(&a);
                    }
                }
                c0 = c1;
            } while (c0 < nb);
        }
    }
}

#endif

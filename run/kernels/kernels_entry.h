/* The entry points of a SIMD kernel file, written once for kernels_avx2.c,
 * kernels_avx512.c and kernels_neon.c.  A template, not a header of
 * declarations (like kernels_blocking.h, which it includes): each of those
 * files includes it once at its end, inside its instruction set's target
 * region, after defining
 *   tile_wide(wt, R, P, a) and tile_mx(R, P, a)   (kernels_tile.h's protocol),
 *   matvec_t_wide(wt, w0, ws, nr, n, x, y)        (kmatvec_t on wide rows),
 *   TILE_CASES(X)   the tile shapes (R, P) it compiles: every shape the
 *                   blocking driver asks for with its RB_WIDE, RB_MX,
 *   RB_WIDE, RB_MX, MX_PREFETCH (kernels_blocking.h), AI, and
 *   SFX             the level's name suffix (avx2, avx512, neon),
 * and gets kdot_{f32,bf16,f16,mxfp4}_SFX, kmatmul_rows_SFX and kmatvec_t_SFX
 * (kernels.h).  Only the choice of tile changes here, never a sum. */
#define KENT_CAT2(a, b) a##_##b
#define KENT_CAT(a, b) KENT_CAT2(a, b)

static inline tile_args one_row(const void *w, const uint8_t *s, const float *x, size_t n, size_t nb, float *y)
{
    tile_args a = {(const char *)w, 0, s, 0, x, 0, 0, nb, n, NULL, 0, 1, 1, s ? MX_PREFETCH : 0, y, 0};
    return a;
}

float KENT_CAT(kdot_f32, SFX)(const float *w, const float *x, size_t n)
{
    float y;
    tile_args a = one_row(w, NULL, x, n, n - n % 16, &y);
    tile_wide(WT_F32, 1, 1, &a);
    return y;
}

float KENT_CAT(kdot_bf16, SFX)(const uint16_t *w, const float *x, size_t n)
{
    float y;
    tile_args a = one_row(w, NULL, x, n, n - n % 16, &y);
    tile_wide(WT_BF16, 1, 1, &a);
    return y;
}

float KENT_CAT(kdot_f16, SFX)(const uint16_t *w, const float *x, size_t n)
{
    float y;
    tile_args a = one_row(w, NULL, x, n, n - n % 16, &y);
    tile_wide(WT_F16, 1, 1, &a);
    return y;
}

float KENT_CAT(kdot_mxfp4, SFX)(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n)
{
    if (n % 32) return kdot_mxfp4_scalar(packed, scales, x, n);
    float y;
    tile_args a = one_row(packed, scales, x, n, n, &y);
    tile_mx(1, 1, &a);
    return y;
}

/* One function per weight type and tile shape, so that each tile's loops
 * have constant bounds and its accumulators stay in registers. */
#define WIDE_FN(wt, R, P) \
    static void tile_##wt##_##R##_##P(const tile_args *a) { tile_wide(wt, R, P, a); }
#define WIDE_F32(R, P) WIDE_FN(WT_F32, R, P)
#define WIDE_BF16(R, P) WIDE_FN(WT_BF16, R, P)
#define WIDE_F16(R, P) WIDE_FN(WT_F16, R, P)
TILE_CASES(WIDE_F32)
TILE_CASES(WIDE_BF16)
TILE_CASES(WIDE_F16)
#define MX_FN(R, P) \
    static void tile_mx_##R##_##P(const tile_args *a) { tile_mx(R, P, a); }
TILE_CASES(MX_FN)

/* wt: 0..2 wide types, 3 MXFP4. */
static tile_fn pick_tile(int wt, int R, int P)
{
#define PICK(wtv, R_, P_) \
    if (wt == wtv && R == R_ && P == P_) return tile_##wtv##_##R_##_##P_;
#define PICK_F32(R_, P_) PICK(WT_F32, R_, P_)
#define PICK_BF16(R_, P_) PICK(WT_BF16, R_, P_)
#define PICK_F16(R_, P_) PICK(WT_F16, R_, P_)
#define PICK_MX(R_, P_) \
    if (wt == 3 && R == R_ && P == P_) return tile_mx_##R_##_##P_;
    TILE_CASES(PICK_F32)
    TILE_CASES(PICK_BF16)
    TILE_CASES(PICK_F16)
    TILE_CASES(PICK_MX)
    return NULL;
}

#include "kernels_blocking.h"

void KENT_CAT(kmatmul_rows, SFX)(const kmat *W, size_t r0, size_t r1, const float *X, size_t ldx, size_t T, float *Y,
                                 size_t ldy)
{
    kmatmul_rows_blocked(W, r0, r1, X, ldx, T, Y, ldy);
}

static void matvec_t_f32(const char *w0, size_t ws, size_t nr, size_t n, const float *x, float *y)
{
    matvec_t_wide(WT_F32, w0, ws, nr, n, x, y);
}
static void matvec_t_bf16(const char *w0, size_t ws, size_t nr, size_t n, const float *x, float *y)
{
    matvec_t_wide(WT_BF16, w0, ws, nr, n, x, y);
}
static void matvec_t_f16(const char *w0, size_t ws, size_t nr, size_t n, const float *x, float *y)
{
    matvec_t_wide(WT_F16, w0, ws, nr, n, x, y);
}

void KENT_CAT(kmatvec_t, SFX)(const kmat *W, size_t r0, size_t r1, const float *x, float *y)
{
    size_t n = W->cols, nr = r1 > r0 ? r1 - r0 : 0;
    switch (W->type) {
    case KD_F32: matvec_t_f32((const char *)W->data + r0 * n * 4, n * 4, nr, n, x, y); return;
    case KD_BF16: matvec_t_bf16((const char *)W->data + r0 * n * 2, n * 2, nr, n, x, y); return;
    case KD_F16: matvec_t_f16((const char *)W->data + r0 * n * 2, n * 2, nr, n, x, y); return;
    case KD_MXFP4: break;
    }
    kmatvec_t_scalar(W, r0, r1, x, y);
}

#undef KENT_CAT
#undef KENT_CAT2

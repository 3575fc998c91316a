/* krun compute kernels: dot products and matrix products over F32 / BF16 / F16 /
 * MXFP4 weight rows, with a scalar reference path and run-time selected AVX2 and
 * AVX-512F paths (x86-64) and a NEON path (aarch64) that give bit-identical
 * results.
 *
 * The floating-point contract (docs/NUMERICS.md section 3): every dot product of a
 * weight row w[0..n) with an activation x[0..n) uses 16 float lane accumulators,
 * element i < n - n%16 going to lane i%16 as acc = acc + (w*x) (rounded product,
 * rounded sum, never FMA), then the fixed tree (lanes j+8 into j, then j+4, then
 * j+2, then acc0+acc1), then the tail elements added in order.  Every output of
 * every product below is computed with exactly that function, whatever the
 * blocking, the thread count or the SIMD level.
 *
 * MXFP4 rows: packed byte j holds element 2j in its low nibble and 2j+1 in its
 * high nibble; scale byte g (E8M0) covers elements 32g..32g+31 of the row.  The
 * weight KE2M1[nibble] * ke8m0_scale(scale) is exact in float and is formed in a
 * register, never materialised for a whole row. */
#ifndef KRUN_KERNELS_H
#define KRUN_KERNELS_H
#include <stddef.h>
#include <stdint.h>

struct kpool;

typedef enum { KD_F32 = 0, KD_BF16 = 1, KD_F16 = 2, KD_MXFP4 = 3 } kd_type;

typedef struct {
    kd_type type;
    size_t rows, cols;        /* logical shape [out, in]; row-major */
    const void *data;         /* F32/BF16/F16 values, or MXFP4 packed bytes [rows][cols/2] */
    const uint8_t *scales;    /* MXFP4 only: E8M0 bytes [rows][cols/32] */
} kmat;

typedef enum { KSIMD_SCALAR = 0, KSIMD_AVX2 = 1, KSIMD_AVX512 = 2, KSIMD_NEON = 3 } ksimd;
#define KSIMD_COUNT 4

/* Best level the CPU (and OS) supports.  x86-64: AVX2 needs AVX2+F16C, AVX-512
 * needs those plus AVX-512F (checked with __builtin_cpu_supports, which also
 * checks that the OS saves the registers).  aarch64: NEON (HWCAP_ASIMD, part of
 * the base architecture).  Other architectures: scalar. */
ksimd kern_simd_detect(void);
/* Whether this build and CPU can run a level (scalar always can). */
int   kern_simd_supported(ksimd level);
/* Force a path (tests, --simd).  A level the CPU cannot run becomes the best it
 * can: avx512 on an AVX2-only CPU runs avx2, avx2 on aarch64 runs neon. */
void  kern_simd_set(ksimd level);
/* Current level.  On first use honours env KRUN_SIMD=scalar|avx2|avx512|neon
 * (as kern_simd_set; an unknown value is ignored with a warning on stderr),
 * else the best level. */
ksimd kern_simd_get(void);
const char *kern_simd_name(ksimd);
/* Parses "scalar" / "avx2" / "avx512" / "neon"; returns 0 on success, -1 otherwise. */
int   kern_simd_parse(const char *s, ksimd *out);

/* Dot products (the contract).  n may be 0 (result +0.0f). */
float kdot_f32(const float *w, const float *x, size_t n);
float kdot_bf16(const uint16_t *w, const float *x, size_t n);
float kdot_f16(const uint16_t *w, const float *x, size_t n);
float kdot_mxfp4(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n); /* n % 32 == 0 */
float kmat_row_dot(const kmat *W, size_t r, const float *x);

/* Y[t*ldy + r] = dot(W row r, X + t*ldx) for t < T, r in [r0, r1).  Each output is
 * bit-identical to kmat_row_dot, whatever the blocking.  Single-threaded. */
void kmatmul_rows(const kmat *W, size_t r0, size_t r1, const float *X, size_t ldx,
                  size_t T, float *Y, size_t ldy);
/* Same over all rows, split across the pool's threads by row ranges.  pool may be
 * NULL (single thread).  Small products run on the calling thread only. */
void kmatmul(struct kpool *pool, const kmat *W, const float *X, size_t ldx, size_t T,
             float *Y, size_t ldy);

/* Transposed product (MLA weight absorption):
 *   y[c] = sum over r in [r0,r1) of W[r][c] * x[r-r0],   c < W->cols,
 * each y[c] accumulated in float from +0.0f sequentially in r order
 * (acc = acc + W[r][c]*x[r-r0]).  y is overwritten.  F32, BF16 and F16 have SIMD
 * paths (vectorised across c only); MXFP4 is accepted and runs the scalar path. */
void kmatvec_t(const kmat *W, size_t r0, size_t r1, const float *x, float *y);

float kbf16_to_f32(uint16_t);
float kf16_to_f32(uint16_t);          /* exact, incl. subnormals; NaNs come out quiet */
extern const float KE2M1[16];         /* 0,.5,1,1.5,2,3,4,6,-0,-.5,-1,-1.5,-2,-3,-4,-6 */
float ke8m0_scale(uint8_t s);         /* 2^(s-127) as float, exact incl. subnormal 2^-127; s==255 -> 0 */

/* Bytes of weight data (values + MXFP4 scales) of the whole matrix W. */
size_t kmat_bytes(const kmat *W);

/* ---- internal ---- */
/* ke8m0_scale as an inline for the SIMD translation units. */
static inline float kern_e8m0(uint8_t s)
{
    union { uint32_t u; float f; } v;
    v.u = s == 255 ? 0u : s == 0 ? 0x00400000u : (uint32_t)s << 23;
    return v.f;
}

static inline float kern_bf16(uint16_t h)
{
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}

static inline float kern_f16(uint16_t h)
{
    union { uint32_t u; float f; } v;
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) {
        v.u = sign | 0x7f800000u | (m << 13) | (m ? 0x00400000u : 0u); /* NaNs come out quiet, as with F16C */
    } else if (e == 0) {
        if (m == 0) {
            v.u = sign;
        } else { /* subnormal: m * 2^-24, exact in float */
            float f = (float)m * 0x1p-24f;
            return sign ? -f : f;
        }
    } else {
        v.u = sign | ((e + 112u) << 23) | (m << 13);
    }
    return v.f;
}

/* The per-level implementations (kernels.c, kernels_avx2.c,
 * kernels_avx512.c, kernels_neon.c; the Makefile compiles only the target's).
 * Called only through the dispatching functions above, which check that the
 * CPU supports the level. ---- */
float kdot_f32_scalar(const float *w, const float *x, size_t n);
float kdot_bf16_scalar(const uint16_t *w, const float *x, size_t n);
float kdot_f16_scalar(const uint16_t *w, const float *x, size_t n);
float kdot_mxfp4_scalar(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n);
void  kmatmul_rows_scalar(const kmat *W, size_t r0, size_t r1, const float *X, size_t ldx,
                          size_t T, float *Y, size_t ldy);
void  kmatvec_t_scalar(const kmat *W, size_t r0, size_t r1, const float *x, float *y);

float kdot_f32_avx2(const float *w, const float *x, size_t n);
float kdot_bf16_avx2(const uint16_t *w, const float *x, size_t n);
float kdot_f16_avx2(const uint16_t *w, const float *x, size_t n);
float kdot_mxfp4_avx2(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n);
void  kmatmul_rows_avx2(const kmat *W, size_t r0, size_t r1, const float *X, size_t ldx,
                        size_t T, float *Y, size_t ldy);
void  kmatvec_t_avx2(const kmat *W, size_t r0, size_t r1, const float *x, float *y);

float kdot_f32_avx512(const float *w, const float *x, size_t n);
float kdot_bf16_avx512(const uint16_t *w, const float *x, size_t n);
float kdot_f16_avx512(const uint16_t *w, const float *x, size_t n);
float kdot_mxfp4_avx512(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n);
void  kmatmul_rows_avx512(const kmat *W, size_t r0, size_t r1, const float *X, size_t ldx,
                          size_t T, float *Y, size_t ldy);
void  kmatvec_t_avx512(const kmat *W, size_t r0, size_t r1, const float *x, float *y);

float kdot_f32_neon(const float *w, const float *x, size_t n);
float kdot_bf16_neon(const uint16_t *w, const float *x, size_t n);
float kdot_f16_neon(const uint16_t *w, const float *x, size_t n);
float kdot_mxfp4_neon(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n);
void  kmatmul_rows_neon(const kmat *W, size_t r0, size_t r1, const float *X, size_t ldx,
                        size_t T, float *Y, size_t ldy);
void  kmatvec_t_neon(const kmat *W, size_t r0, size_t r1, const float *x, float *y);

#endif

/* Kernels: every dot product / matrix product against (a) a naive double dot and
 * (b) an independent re-implementation of the floating-point contract
 * (docs/NUMERICS.md section 3), bit for bit, on every SIMD level the CPU has;
 * MXFP4 nibble order, grouping, E8M0 corner scales; kmatmul blocking / threading
 * invariance; kmatvec_t. */
#include "check.h"
#include "testrand.h"
#include "run/kernels/kernels.h"
#include "run/util/threadpool.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ helpers */

/* Bit equality; two NaNs count as equal (the contract says nothing about payloads). */
static int same(float a, float b) { return fbits(a) == fbits(b) || (isnan(a) && isnan(b)); }

/* A value with awkward properties now and then: signed zeros, subnormals, large and
 * small magnitudes (bounded so that no product or sum overflows). */
static float special(void)
{
    float s = (rnd() & 1) ? -1.0f : 1.0f;
    switch (rnd() % 12) {
    case 0: return -0.0f;
    case 1: return 0.0f;
    case 2: return s * bitsf((uint32_t)(rnd() % 0x7fffff) + 1);           /* subnormal */
    case 3: return s * ldexpf(unif(1.0f, 2.0f), 20 + (int)(rnd() % 30));  /* huge */
    case 4: return s * ldexpf(unif(1.0f, 2.0f), -125 + (int)(rnd() % 30)); /* tiny */
    default: return unif(-2.0f, 2.0f);
    }
}

/* ---- independent decoders (written without looking at kernels.c) ---- */

static float t_bf16(uint16_t h) { return bitsf((uint32_t)h << 16); }

static float t_f16(uint16_t h)
{
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) return m ? NAN : (sign ? -INFINITY : INFINITY);
    if (e == 0) v = ldexp((double)m, -24);
    else v = ldexp(1.0 + m / 1024.0, e - 15);
    return (float)(sign ? -v : v);
}

/* E2M1: bit 3 sign, bits 2..1 exponent, bit 0 mantissa. */
static double t_e2m1(unsigned c)
{
    unsigned e = (c >> 1) & 3, m = c & 1;
    double v = e == 0 ? 0.5 * m : ldexp(1.0 + 0.5 * m, (int)e - 1);
    return (c & 8) ? -v : v;
}
static double t_e8m0(uint8_t s) { return s == 255 ? 0.0 : ldexp(1.0, (int)s - 127); }

static float t_mx(const uint8_t *packed, const uint8_t *scales, size_t i)
{
    uint8_t b = packed[i / 2];
    unsigned c = (i % 2) ? (b >> 4) : (b & 15);
    double v = t_e2m1(c) * t_e8m0(scales[i / 32]);
    return (float)v; /* exact when finite; overflows to inf exactly like the float product */
}

/* The contract, re-implemented over already-decoded weights. */
static float t_contract(const float *w, const float *x, size_t n)
{
    float a[16];
    for (int j = 0; j < 16; j++) a[j] = 0.0f;
    size_t nb = n / 16 * 16;
    for (size_t i = 0; i < nb; i++) {
        float prod = w[i] * x[i];
        a[i % 16] = a[i % 16] + prod;
    }
    float b[8], c[4], d[2];
    for (int j = 0; j < 8; j++) b[j] = a[j] + a[j + 8];
    for (int j = 0; j < 4; j++) c[j] = b[j] + b[j + 4];
    for (int j = 0; j < 2; j++) d[j] = c[j] + c[j + 2];
    float s = d[0] + d[1];
    for (size_t i = nb; i < n; i++) {
        float prod = w[i] * x[i];
        s = s + prod;
    }
    return s;
}

static int nlevels;
static ksimd levels[KSIMD_COUNT];
static ksimd top; /* the level in force at start (KRUN_SIMD can lower it, e.g. for valgrind) */
/* scalar first, then every level the CPU runs up to the one in force (x86:
 * avx2, avx512; aarch64: neon) */
static void init_levels(void)
{
    top = kern_simd_get();
    nlevels = 0;
    for (int l = 0; l < KSIMD_COUNT; l++)
        if (kern_simd_supported((ksimd)l) && l <= (int)top) levels[nlevels++] = (ksimd)l;
}

/* ---- a weight row of each type, with its decoded floats ---- */
enum { TF32, TBF16, TF16, TMX };
static const char *tname[] = {"f32", "bf16", "f16", "mxfp4"};

typedef struct {
    int type;
    size_t n;
    float *f32;
    uint16_t *h;
    uint8_t *q, *sc;
    float *dec; /* decoded by the test's own decoders */
} row_t;

static void row_alloc(row_t *r, int type, size_t n)
{
    memset(r, 0, sizeof *r);
    r->type = type;
    r->n = n;
    r->f32 = xmalloc(n * sizeof(float));
    r->h = xmalloc(n * sizeof(uint16_t));
    r->q = xmalloc(n / 2 + 1);
    r->sc = xmalloc(n / 32 + 1);
    r->dec = xmalloc(n * sizeof(float));
    memset(r->q, 0, n / 2 + 1);
    memset(r->sc, 127, n / 32 + 1);
}
static void row_free(row_t *r)
{
    free(r->f32);
    free(r->h);
    free(r->q);
    free(r->sc);
    free(r->dec);
}
static void row_decode(row_t *r)
{
    for (size_t i = 0; i < r->n; i++) {
        switch (r->type) {
        case TF32: r->dec[i] = r->f32[i]; break;
        case TBF16: r->dec[i] = t_bf16(r->h[i]); break;
        case TF16: r->dec[i] = t_f16(r->h[i]); break;
        default: r->dec[i] = t_mx(r->q, r->sc, i); break;
        }
    }
}
/* mode 0: ordinary values; 1: awkward values (see special()). */
static void row_fill(row_t *r, int mode)
{
    size_t n = r->n;
    for (size_t i = 0; i < n; i++) {
        float v = mode ? special() : unif(-1.0f, 1.0f);
        r->f32[i] = v;
        switch (r->type) {
        case TBF16: r->h[i] = (uint16_t)(fbits(v) >> 16); break;
        case TF16: {
            uint16_t h = (uint16_t)(rnd() & 0xffff);
            if (((h >> 10) & 31) == 31) h &= 0x83ff; /* no inf/NaN weights */
            if (!mode && ((h >> 10) & 31) > 16) h = (uint16_t)((h & 0x83ff) | (14u << 10));
            r->h[i] = h;
            break;
        }
        default: break;
        }
    }
    for (size_t j = 0; j < n / 2 + 1; j++) r->q[j] = (uint8_t)rnd();
    for (size_t g = 0; g < n / 32 + 1; g++) {
        if (mode) {
            static const uint8_t corner[] = {0, 1, 2, 127, 255, 100, 126, 128};
            r->sc[g] = (rnd() % 3) ? (uint8_t)(110 + rnd() % 25) : corner[rnd() % sizeof corner];
        } else {
            r->sc[g] = (uint8_t)(120 + rnd() % 10);
        }
    }
    row_decode(r);
}

static float row_kdot(const row_t *r, const float *x)
{
    switch (r->type) {
    case TF32: return kdot_f32(r->f32, x, r->n);
    case TBF16: return kdot_bf16(r->h, x, r->n);
    case TF16: return kdot_f16(r->h, x, r->n);
    default: return kdot_mxfp4(r->q, r->sc, x, r->n);
    }
}

/* ------------------------------------------------------------------ tests */

static void test_basics(void)
{
    CHECK(fbits(ke8m0_scale(0)) == 0x00400000u && ke8m0_scale(0) == ldexpf(1.0f, -127) && ke8m0_scale(0) != 0.0f,
          "ke8m0_scale(0) is the subnormal 2^-127");
    int ok = 1;
    for (int s = 0; s < 255; s++) ok &= (double)ke8m0_scale((uint8_t)s) == ldexp(1.0, s - 127);
    CHECK(ok, "ke8m0_scale(s) == 2^(s-127) exactly for s = 0..254");
    CHECK(fbits(ke8m0_scale(255)) == 0, "ke8m0_scale(255) == +0");
    ok = 1;
    for (unsigned c = 0; c < 16; c++) ok &= (double)KE2M1[c] == t_e2m1(c) && (signbit(KE2M1[c]) != 0) == (c >= 8);
    CHECK(ok, "KE2M1 table (values and signs, incl. -0 at code 8)");
    ok = 1;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = kf16_to_f32((uint16_t)h), b = t_f16((uint16_t)h);
        ok &= isnan(b) ? isnan(a) : fbits(a) == fbits(b);
    }
    CHECK(ok, "kf16_to_f32 exact on all 65536 codes (subnormals, +-0, inf, NaN)");
    ok = 1;
    for (uint32_t h = 0; h < 65536; h++) ok &= fbits(kbf16_to_f32((uint16_t)h)) == h << 16;
    CHECK(ok, "kbf16_to_f32 exact on all 65536 codes");
    ok = 1;
    for (int i = 0; i < 256; i++)
        for (int s = 0; s < 256; s += 5) {
            uint8_t q[1] = {(uint8_t)i}, sc[1] = {(uint8_t)s};
            float want0 = KE2M1[i & 15] * ke8m0_scale((uint8_t)s), want1 = KE2M1[i >> 4] * ke8m0_scale((uint8_t)s);
            ok &= same(t_mx(q, sc, 0), want0) && same(t_mx(q, sc, 1), want1);
        }
    CHECK(ok, "test decoder agrees with KE2M1 * ke8m0_scale");
    CHECK(kern_simd_get() <= kern_simd_detect(), "kern_simd_get (%s) <= detected (%s)", kern_simd_name(kern_simd_get()),
          kern_simd_name(kern_simd_detect()));
    kern_simd_set(KSIMD_AVX512);
    CHECK(kern_simd_get() == kern_simd_detect(), "kern_simd_set clamps to the CPU (%s)", kern_simd_name(kern_simd_get()));
    ok = 1;
    for (int lv = 0; lv < KSIMD_COUNT; lv++) {
        kern_simd_set((ksimd)lv);
        ok &= kern_simd_get() == (kern_simd_supported((ksimd)lv) ? (ksimd)lv : kern_simd_detect());
    }
    CHECK(ok, "kern_simd_set: every level runs as asked where supported, else as the best (%s)",
          kern_simd_name(kern_simd_detect()));
    kern_simd_set(KSIMD_SCALAR);
    CHECK(kern_simd_get() == KSIMD_SCALAR, "kern_simd_set(scalar)");
    ksimd l;
    CHECK(kern_simd_parse("avx2", &l) == 0 && l == KSIMD_AVX2 && kern_simd_parse("neon", &l) == 0 && l == KSIMD_NEON &&
              kern_simd_parse("sse", &l) != 0,
          "kern_simd_parse");
    kern_simd_set(top);
}

static const size_t NS[] = {1, 7, 15, 16, 17, 31, 32, 33, 64, 100, 4096, 7168 + 5};
static const size_t NMX[] = {32, 64, 96, 4096, 7168, 33, 100}; /* last two: partial group (scalar fallback) */

/* (a) vs double, (b) vs the test's contract, on every level. */
static void test_kdot(void)
{
    for (int type = 0; type < 4; type++) {
        const size_t *ns = type == TMX ? NMX : NS;
        size_t nn = type == TMX ? sizeof NMX / sizeof *NMX : sizeof NS / sizeof *NS;
        for (int li = 0; li < nlevels; li++) {
            kern_simd_set(levels[li]);
            int ok_d = 1, ok_c = 1, ok_s = 1;
            char why_d[200] = "", why_c[200] = "", why_s[200] = "";
            for (size_t k = 0; k < nn; k++) {
                size_t n = ns[k];
                row_t r;
                row_alloc(&r, type, n);
                float *x = xmalloc(n * sizeof(float));
                for (int rep = 0; rep < 3; rep++) {
                    /* ordinary values: vs double */
                    row_fill(&r, 0);
                    for (size_t i = 0; i < n; i++) x[i] = unif(-1.0f, 1.0f);
                    double ref = 0, mag = 0;
                    for (size_t i = 0; i < n; i++) {
                        ref += (double)r.dec[i] * x[i];
                        mag += fabs((double)r.dec[i] * x[i]);
                    }
                    float got = row_kdot(&r, x);
                    double tol = (double)(n / 16 + 21) * ldexp(1.0, -24) * mag + 1e-30;
                    if (!(fabs(got - ref) <= tol) && ok_d) {
                        ok_d = 0;
                        snprintf(why_d, sizeof why_d, "n=%zu got %.9g want %.9g tol %.3g", n, got, ref, tol);
                    }
                    if (!same(got, t_contract(r.dec, x, n)) && ok_c) {
                        ok_c = 0;
                        snprintf(why_c, sizeof why_c, "n=%zu got %a want %a", n, got, t_contract(r.dec, x, n));
                    }
                    /* awkward values: vs the contract */
                    row_fill(&r, 1);
                    for (size_t i = 0; i < n; i++) x[i] = special();
                    got = row_kdot(&r, x);
                    float want = t_contract(r.dec, x, n);
                    if (!same(got, want) && ok_s) {
                        ok_s = 0;
                        snprintf(why_s, sizeof why_s, "n=%zu got %a want %a", n, got, want);
                    }
                }
                free(x);
                row_free(&r);
            }
            const char *ln = kern_simd_name(levels[li]);
            CHECK(ok_d, "kdot_%s [%s] within float error bound of a double dot %s", tname[type], ln, why_d);
            CHECK(ok_c, "kdot_%s [%s] bit-identical to the contract (ordinary values) %s", tname[type], ln, why_c);
            CHECK(ok_s, "kdot_%s [%s] bit-identical to the contract (-0, subnormal, huge, tiny; E8M0 0/1/127/255) %s",
                  tname[type], ln, why_s);
        }
    }
    kern_simd_set(top);
    CHECK(kdot_f32(NULL, NULL, 0) == 0.0f && !signbit(kdot_bf16(NULL, NULL, 0)), "n = 0 gives +0");
}

/* Scalar vs every SIMD level, on the same awkward inputs (incl. every nibble code
 * and the corner scales), bit for bit. */
static void test_levels_agree(void)
{
    if (nlevels < 2) {
        SKIP("SIMD vs scalar: only the scalar level is enabled (CPU or KRUN_SIMD)");
        return;
    }
    for (int type = 0; type < 4; type++) {
        int ok[KSIMD_COUNT] = {1, 1, 1, 1};
        char why[KSIMD_COUNT][160] = {"", "", "", ""};
        for (int rep = 0; rep < 200; rep++) {
            size_t n = type == TMX ? 32 * (1 + rnd() % 40) : 1 + rnd() % 700;
            row_t r;
            row_alloc(&r, type, n);
            row_fill(&r, 1);
            if (type == TMX && rep % 4 == 0) /* all 16 codes in both nibble positions */
                for (size_t j = 0; j < n / 2; j++) r.q[j] = (uint8_t)((j % 16) | ((15 - j % 16) << 4));
            float *x = xmalloc(n * sizeof(float));
            for (size_t i = 0; i < n; i++) x[i] = special();
            float res[KSIMD_COUNT];
            for (int li = 0; li < nlevels; li++) {
                kern_simd_set(levels[li]);
                res[li] = row_kdot(&r, x);
            }
            for (int li = 1; li < nlevels; li++)
                if (!same(res[li], res[0]) && ok[li]) {
                    ok[li] = 0;
                    snprintf(why[li], sizeof why[li], "n=%zu scalar %a simd %a", n, res[0], res[li]);
                }
            free(x);
            row_free(&r);
        }
        for (int li = 1; li < nlevels; li++)
            CHECK(ok[li], "kdot_%s: %s bit-identical to scalar on 200 awkward random rows %s", tname[type],
                  kern_simd_name(levels[li]), why[li]);
    }
    kern_simd_set(top);
}

/* MXFP4 specifics, on every level. */
static void test_mxfp4_layout(void)
{
    for (int li = 0; li < nlevels; li++) {
        kern_simd_set(levels[li]);
        const char *ln = kern_simd_name(levels[li]);
        uint8_t q[64], sc[4];
        float x[128];

        /* nibble order: code 2 (= 1.0) in the HIGH nibble of byte 0 must hit x[1] */
        memset(q, 0, sizeof q);
        memset(sc, 127, sizeof sc);
        for (int i = 0; i < 128; i++) x[i] = 0.0f;
        x[0] = 3.0f;
        x[1] = 5.0f;
        q[0] = 0x20;
        float y = kdot_mxfp4(q, sc, x, 32);
        CHECK(y == 5.0f, "[%s] high nibble of byte 0 is element 1 (got %g, want 5)", ln, y);
        q[0] = 0x02;
        y = kdot_mxfp4(q, sc, x, 32);
        CHECK(y == 3.0f, "[%s] low nibble of byte 0 is element 0 (got %g, want 3)", ln, y);
        /* each position of a 32-group, in lanes 0..15 and 16..31 */
        int ok = 1;
        for (int i = 0; i < 128; i++) {
            memset(q, 0, sizeof q);
            for (int j = 0; j < 128; j++) x[j] = (float)(j + 1);
            q[i / 2] = (uint8_t)(i % 2 ? 0x20 : 0x02);
            ok &= kdot_mxfp4(q, sc, x, 128) == (float)(i + 1);
        }
        CHECK(ok, "[%s] a single 1.0 at element i picks x[i] for every i < 128", ln);

        /* grouping: exact small-integer data, so the dot is an exact sum and changing
         * scale g changes the result by exactly the change in elements 32g..32g+31 */
        ok = 1;
        for (int rep = 0; rep < 20; rep++) {
            for (int j = 0; j < 64; j++) q[j] = (uint8_t)rnd();
            for (int g = 0; g < 4; g++) sc[g] = (uint8_t)(126 + rnd() % 3);
            for (int j = 0; j < 128; j++) x[j] = (float)((int)(rnd() % 9) - 4);
            float base = kdot_mxfp4(q, sc, x, 128);
            for (int g = 0; g < 4; g++) {
                uint8_t old = sc[g];
                double before = 0, after = 0;
                for (int i = 32 * g; i < 32 * g + 32; i++) before += (double)t_mx(q, sc, (size_t)i) * x[i];
                sc[g] = (uint8_t)(old + 1);
                for (int i = 32 * g; i < 32 * g + 32; i++) after += (double)t_mx(q, sc, (size_t)i) * x[i];
                float changed = kdot_mxfp4(q, sc, x, 128);
                ok &= (double)changed - (double)base == after - before;
                sc[g] = old;
            }
        }
        CHECK(ok, "[%s] scale byte g changes exactly the contribution of elements 32g..32g+31", ln);

        /* scale 0 = 2^-127 (subnormal): not flushed */
        memset(q, 0, sizeof q);
        for (int i = 0; i < 128; i++) x[i] = 0.0f;
        sc[0] = 0;
        q[0] = 0x02; /* element 0 = 1.0 * 2^-127 */
        x[0] = 1.0f;
        y = kdot_mxfp4(q, sc, x, 32);
        CHECK(y != 0.0f && y == ldexpf(1.0f, -127), "[%s] scale byte 0 gives 2^-127, not flushed (got %a)", ln, y);
        q[0] = 0x01; /* 0.5 * 2^-127 = 2^-128 */
        x[0] = 3.0f;
        y = kdot_mxfp4(q, sc, x, 32);
        CHECK(y == 3.0f * ldexpf(1.0f, -128), "[%s] 0.5 * 2^-127 * 3 exact (got %a)", ln, y);
        /* scale 127 = 1, 254 = 2^127 */
        sc[0] = 127;
        q[0] = 0x07;
        x[0] = 1.0f;
        y = kdot_mxfp4(q, sc, x, 32);
        CHECK(y == 6.0f, "[%s] scale byte 127 multiplies by 1 (got %g)", ln, y);
        sc[0] = 254;
        q[0] = 0x01;
        y = kdot_mxfp4(q, sc, x, 32);
        CHECK(y == ldexpf(1.0f, 126), "[%s] scale byte 254: 0.5 * 2^127 = 2^126 (got %a)", ln, y);
        /* scale 255 contributes exactly 0 */
        for (int j = 0; j < 64; j++) q[j] = 0x77; /* all 6.0 */
        for (int i = 0; i < 128; i++) x[i] = unif(-1.0f, 1.0f);
        sc[0] = 127;
        sc[1] = 255;
        sc[2] = 126;
        sc[3] = 255;
        float with = kdot_mxfp4(q, sc, x, 128);
        uint8_t q2[64];
        memcpy(q2, q, sizeof q2);
        memset(q2 + 16, 0, 16);
        memset(q2 + 48, 0, 16);
        float without = kdot_mxfp4(q2, sc, x, 128);
        CHECK(same(with, without), "[%s] groups with scale byte 255 contribute exactly 0", ln);
        sc[0] = sc[2] = 255;
        y = kdot_mxfp4(q, sc, x, 128);
        CHECK(fbits(y) == 0, "[%s] an all-255-scale row gives +0 (got %a)", ln, y);
    }
    kern_simd_set(top);
}

/* ---- matrices ---- */
typedef struct {
    kmat m;
    row_t all; /* the whole matrix as one long row (rows*cols) */
} mat_t;

static void mat_make(mat_t *M, int type, size_t rows, size_t cols, int mode)
{
    row_alloc(&M->all, type, rows * cols);
    row_fill(&M->all, mode);
    M->m.type = type == TF32 ? KD_F32 : type == TBF16 ? KD_BF16 : type == TF16 ? KD_F16 : KD_MXFP4;
    M->m.rows = rows;
    M->m.cols = cols;
    M->m.data = type == TF32 ? (const void *)M->all.f32 : type == TMX ? (const void *)M->all.q : (const void *)M->all.h;
    M->m.scales = type == TMX ? M->all.sc : NULL;
}

static void test_matmul(void)
{
    kpool *p2 = kpool_create(2), *p3 = kpool_create(3);
    if (!p2 || !p3) {
        CHECK(0, "kpool_create");
        return;
    }
    static const size_t TS[] = {1, 2, 3, 5, 17};
    static const size_t RS[] = {1, 3, 7, 13, 67};
    for (int type = 0; type < 4; type++) {
        int ok_rows = 1, ok_pool = 1, ok_levels = 1, ok_guard = 1;
        char why[200] = "";
        for (size_t ri = 0; ri < sizeof RS / sizeof *RS; ri++) {
            size_t rows = RS[ri];
            size_t cols = type == TMX ? 32 * (size_t)(1 + rnd() % 12) : 1 + rnd() % 400;
            if (rows == 67) cols = type == TMX ? 320 : 301; /* big enough for the pool to split */
            mat_t M;
            mat_make(&M, type, rows, cols, ri % 2);
            for (size_t ti = 0; ti < sizeof TS / sizeof *TS; ti++) {
                size_t T = TS[ti], ldx = cols + 3, ldy = rows + 2;
                float *X = xmalloc(T * ldx * sizeof(float));
                float *ref = xmalloc(T * ldy * sizeof(float));
                float *Y = xmalloc(T * ldy * sizeof(float));
                for (size_t i = 0; i < T * ldx; i++) X[i] = ri % 2 ? special() : unif(-1, 1);
                for (int li = 0; li < nlevels; li++) {
                    kern_simd_set(levels[li]);
                    /* reference: per-output kmat_row_dot on this level */
                    for (size_t t = 0; t < T; t++)
                        for (size_t r = 0; r < rows; r++) ref[t * ldy + r] = kmat_row_dot(&M.m, r, X + t * ldx);
                    /* and vs scalar contract via the test's decoder */
                    for (size_t t = 0; t < T && ok_levels; t++)
                        for (size_t r = 0; r < rows; r++)
                            if (!same(ref[t * ldy + r], t_contract(M.all.dec + r * cols, X + t * ldx, cols))) {
                                ok_levels = 0;
                                snprintf(why, sizeof why, "[%s] rows %zu cols %zu T %zu: row_dot vs contract",
                                         kern_simd_name(levels[li]), rows, cols, T);
                                break;
                            }
                    /* kmatmul_rows on sub-ranges */
                    for (size_t i = 0; i < T * ldy; i++) Y[i] = bitsf(0x7fc01234u);
                    size_t mid = rows / 2;
                    kmatmul_rows(&M.m, 0, mid, X, ldx, T, Y, ldy);
                    kmatmul_rows(&M.m, mid, rows, X, ldx, T, Y, ldy);
                    for (size_t t = 0; t < T; t++) {
                        for (size_t r = 0; r < rows; r++)
                            if (!same(Y[t * ldy + r], ref[t * ldy + r]) && ok_rows) {
                                ok_rows = 0;
                                snprintf(why, sizeof why, "[%s] kmatmul_rows rows %zu cols %zu T %zu t %zu r %zu",
                                         kern_simd_name(levels[li]), rows, cols, T, t, r);
                            }
                        for (size_t r = rows; r < ldy; r++) ok_guard &= fbits(Y[t * ldy + r]) == 0x7fc01234u;
                    }
                    /* kmatmul: no pool, 2 and 3 threads */
                    kpool *pools[3] = {NULL, p2, p3};
                    for (int pi = 0; pi < 3; pi++) {
                        for (size_t i = 0; i < T * ldy; i++) Y[i] = bitsf(0x7fc01234u);
                        kmatmul(pools[pi], &M.m, X, ldx, T, Y, ldy);
                        for (size_t t = 0; t < T; t++) {
                            for (size_t r = 0; r < rows; r++)
                                if (!same(Y[t * ldy + r], ref[t * ldy + r]) && ok_pool) {
                                    ok_pool = 0;
                                    snprintf(why, sizeof why, "[%s] kmatmul %d threads rows %zu cols %zu T %zu",
                                             kern_simd_name(levels[li]), kpool_threads(pools[pi]), rows, cols, T);
                                }
                            for (size_t r = rows; r < ldy; r++) ok_guard &= fbits(Y[t * ldy + r]) == 0x7fc01234u;
                        }
                    }
                }
                /* across levels: the reference of the last level vs scalar */
                if (nlevels > 1) {
                    kern_simd_set(KSIMD_SCALAR);
                    for (size_t t = 0; t < T; t++)
                        for (size_t r = 0; r < rows; r++)
                            if (!same(kmat_row_dot(&M.m, r, X + t * ldx), ref[t * ldy + r]) && ok_levels) {
                                ok_levels = 0;
                                snprintf(why, sizeof why, "scalar vs simd rows %zu cols %zu T %zu", rows, cols, T);
                            }
                }
                free(X);
                free(ref);
                free(Y);
            }
            row_free(&M.all);
        }
        CHECK(ok_rows, "kmatmul_rows %s: T in {1,2,3,5,17}, odd row counts, split ranges == kmat_row_dot bits %s",
              tname[type], ok_rows ? "" : why);
        CHECK(ok_pool, "kmatmul %s: no pool / 2 / 3 threads == kmat_row_dot bits %s", tname[type], ok_pool ? "" : why);
        CHECK(ok_levels, "kmat_row_dot %s == test contract on every level, and levels agree %s", tname[type],
              ok_levels ? "" : why);
        CHECK(ok_guard, "kmatmul %s writes nothing past row count within ldy", tname[type]);
    }
    kern_simd_set(top);
    kpool_destroy(p2);
    kpool_destroy(p3);
}

/* Shapes from the model, one position block at several T, vs scalar. */
static void test_matmul_shapes(void)
{
    if (nlevels < 2) return;
    static const struct { int type; size_t rows, cols; } S[] = {
        {TBF16, 48, 7168}, {TMX, 40, 3584}, {TMX, 36, 3072}, {TF32, 20, 1536}, {TF16, 9, 1000},
        {TBF16, 37, 2061}, {TF32, 35, 1031}, {TMX, 33, 2080}, {TF16, 11, 4099}, {TBF16, 7, 4113}};
    static const size_t TS[] = {1, 4, 16, 21};
    kpool *p2 = kpool_create(2);
    for (size_t s = 0; s < sizeof S / sizeof *S; s++) {
        mat_t M;
        mat_make(&M, S[s].type, S[s].rows, S[s].cols, 0);
        int ok = 1;
        for (size_t ti = 0; ti < sizeof TS / sizeof *TS; ti++) {
            size_t T = TS[ti], cols = S[s].cols, rows = S[s].rows;
            float *X = xmalloc(T * cols * sizeof(float)), *A = xmalloc(T * rows * sizeof(float)),
                  *B = xmalloc(T * rows * sizeof(float));
            for (size_t i = 0; i < T * cols; i++) X[i] = unif(-1, 1);
            kern_simd_set(KSIMD_SCALAR);
            kmatmul(NULL, &M.m, X, cols, T, A, rows);
            for (int li = 1; li < nlevels; li++) {
                kern_simd_set(levels[li]);
                kmatmul(p2, &M.m, X, cols, T, B, rows);
                ok &= memcmp(A, B, T * rows * sizeof(float)) == 0;
            }
            free(X);
            free(A);
            free(B);
        }
        CHECK(ok, "kmatmul %s %zux%zu, T in {1,4,16,21}: every SIMD level == scalar", tname[S[s].type], S[s].rows,
              S[s].cols);
        row_free(&M.all);
    }
    kpool_destroy(p2);
    kern_simd_set(top);
}

static void test_matvec_t(void)
{
    static const size_t CS[] = {1, 7, 8, 15, 16, 63, 64, 65, 127, 128, 130, 200, 512};
    for (int type = 0; type < 4; type++) {
        int ok = 1, ok_lv = 1;
        char why[160] = "";
        for (size_t ci = 0; ci < sizeof CS / sizeof *CS; ci++) {
            size_t cols = CS[ci];
            if (type == TMX) cols = 32 * (cols / 32 + 1);
            size_t rows = 1 + rnd() % 40;
            mat_t M;
            mat_make(&M, type, rows, cols, ci % 2);
            size_t r0 = rnd() % rows, r1 = r0 + rnd() % (rows - r0 + 1);
            float *x = xmalloc((rows + 1) * sizeof(float)), *y = xmalloc((cols + 1) * sizeof(float)),
                  *want = xmalloc(cols * sizeof(float)), *y0 = xmalloc(cols * sizeof(float));
            for (size_t i = 0; i <= rows; i++) x[i] = ci % 2 ? special() : unif(-1, 1);
            for (size_t c = 0; c < cols; c++) {
                float acc = 0.0f;
                for (size_t r = r0; r < r1; r++) {
                    float prod = M.all.dec[r * cols + c] * x[r - r0];
                    acc = acc + prod;
                }
                want[c] = acc;
            }
            for (int li = 0; li < nlevels; li++) {
                kern_simd_set(levels[li]);
                for (size_t c = 0; c <= cols; c++) y[c] = bitsf(0x7fc01234u);
                kmatvec_t(&M.m, r0, r1, x, y);
                for (size_t c = 0; c < cols; c++)
                    if (!same(y[c], want[c]) && ok) {
                        ok = 0;
                        snprintf(why, sizeof why, "[%s] cols %zu rows [%zu,%zu) c %zu: %a vs %a",
                                 kern_simd_name(levels[li]), cols, r0, r1, c, y[c], want[c]);
                    }
                ok &= fbits(y[cols]) == 0x7fc01234u;
                if (li == 0) memcpy(y0, y, cols * sizeof(float));
                else ok_lv &= memcmp(y0, y, cols * sizeof(float)) == 0;
            }
            free(x);
            free(y);
            free(want);
            free(y0);
            row_free(&M.all);
        }
        CHECK(ok, "kmatvec_t %s == naive sequential-r loop, bit for bit, every level %s", tname[type], why);
        CHECK(ok_lv, "kmatvec_t %s: SIMD levels == scalar", tname[type]);
    }
    kern_simd_set(top);
}

int main(void)
{
    init_levels();
    printf("# SIMD levels tested:");
    for (int i = 0; i < nlevels; i++) printf(" %s", kern_simd_name(levels[i]));
    printf(" (default %s)\n", kern_simd_name(kern_simd_get()));
    test_basics();
    test_kdot();
    test_levels_agree();
    test_mxfp4_layout();
    test_matmul();
    test_matmul_shapes();
    test_matvec_t();
    return check_exit();
}

/* kmath_expf and kmath_tanhf: exp and tanh in float, the same bits on every
 * machine (kmath.h).
 *
 * kmath_expf.  glibc's expf (since 2.27; Arm's optimized-routines algorithm)
 * evaluates in double and rounds once to float; whether the compiler fused
 * its multiply-adds decides the last bit where the double lands near a
 * rounding midpoint.  Debian 12's x86-64 glibc 2.36 has two builds chosen
 * at run time (an FMA one on CPUs that have FMA, as this machine and CI
 * do), its aarch64 build a third: the aarch64 one and the x86-64 FMA one
 * disagree on 2 of the 2^32 inputs (x = 0x1.04845ep+5 and -0x1.f8cbb2p+5,
 * found exhaustively).  kmath_expf is the algorithm with the x86-64 FMA
 * build's fusions written as explicit fma() calls: equal to that build on
 * all 2^32 inputs (checked exhaustively), so no x86-64 bit changed, and
 * fma() is one correctly rounded operation on every machine (an fmadd on
 * aarch64, a vfmadd on x86-64 CPUs with FMA, libm's exact fma elsewhere).
 * The algorithm: x = (k + r) ln2 / 32 with k the nearest integer to
 * 32 x / ln2, exp(x) = 2^(k/32) 2^(r/32), 2^(k/32) from a table of
 * 2^(i/32) (the nearest double, minus i in the exponent field) and 2^(r/32)
 * from a cubic.  The cubic's coefficients are Arm's (optimized-routines,
 * Copyright (c) 2017-2018 Arm Limited, SPDX-License-Identifier: MIT).
 *
 * kmath_tanhf.
 * The C library's tanhf is not the same function on every machine: Debian
 * 12's glibc 2.36 computes it with fdlibm's algorithm (tanh from expm1), and
 * its aarch64 build lets the compiler fuse that algorithm's multiply-adds
 * while the x86-64 build (no FMA in the baseline) does not, so the two
 * disagree in the last bit on about 1 input in 7000 (tests/arm64: 1,369 of
 * 10,088,268 sampled inputs), enough to change the logits of every real
 * model.  This file is the same algorithm written out operation by
 * operation, compiled like the rest of krun without contraction, so it gives
 * x86-64 glibc 2.36's bits (checked on all 2^32 inputs, docs/NUMERICS.md §1)
 * on every architecture, compiler and C library.
 *
 * The algorithm and its constants are fdlibm's (s_tanhf.c, s_expm1f.c):
 *   Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved.
 *   Developed at SunPro, a Sun Microsystems, Inc. business.
 *   Permission to use, copy, modify, and distribute this software is freely
 *   granted, provided that this notice is preserved. */
#include "kmath.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off")
#endif

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---------------------------------------------------------------- exp */

/* The double nearest 2^(i/32), minus i << 47 (i/32 in the exponent field),
 * so that adding k << 47 for any k = i mod 32 gives 2^(k/32). */
static const uint64_t EXP2_32[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};

static inline __attribute__((always_inline)) float expf_body(float x)
{
    const uint32_t ux = bits_of(x), top = (ux >> 20) & 0x7ffu;
    if (top >= 0x42bu) {                        /* |x| >= 88, or NaN */
        if (ux == 0xff800000u) return 0.0f;     /* -inf */
        if (top >= 0x7f8u) return x + x;        /* +inf, NaN */
        if (x > 0x1.62e42ep6f) return (float)INFINITY; /* above log(2^128) */
        if (x < -0x1.9fe368p6f) return 0.0f;    /* below log(2^-150) */
    }
    static const double inv_ln2_32 = 0x1.71547652b82fep+0 * 32, shift = 0x1.8p+52; /* 1.5 * 2^52: rounds to integers */
    static const double c0 = 0x1.c6af84b912394p-5 / 32 / 32 / 32, c1 = 0x1.ebfce50fac4f3p-3 / 32 / 32,
                        c2 = 0x1.62e42ff0c52d6p-1 / 32;
    const double xd = x;
    double kd = inv_ln2_32 * xd + shift;        /* k in the low bits: round to nearest, ties to even */
    uint64_t ki, t;
    memcpy(&ki, &kd, 8);
    kd = kd - shift;
    const double r = fma(inv_ln2_32, xd, -kd); /* 32 x / ln2 - k, in [-1/2, 1/2] */
    t = EXP2_32[ki % 32] + (ki << 47);
    double s;
    memcpy(&s, &t, 8);                          /* 2^(k/32) */
    const double p = fma(c0, r, c1), q = fma(c2, r, 1.0);
    return (float)(fma(p, r * r, q) * s);
}

#if defined(__x86_64__)
#include <stdatomic.h>
/* The x86-64 baseline has no FMA instruction, so there fma() is a call into
 * the C library (about 3x the time of the whole function): CPUs that have
 * one get the same function compiled with it.  Same bits either way: fma()
 * is one correctly rounded operation, in hardware or in software. */
__attribute__((target("fma"))) static float expf_fma(float x) { return expf_body(x); }

float kmath_expf(float x)
{
    static _Atomic int has_fma = -1;
    int f = atomic_load_explicit(&has_fma, memory_order_relaxed);
    if (f < 0) {
        __builtin_cpu_init();
        f = __builtin_cpu_supports("fma") != 0;
        atomic_store_explicit(&has_fma, f, memory_order_relaxed);
    }
    return f ? expf_fma(x) : expf_body(x);
}
#else
float kmath_expf(float x) { return expf_body(x); }
#endif

float kmath_expf_nofma(float x) { return expf_body(x); }

/* ---------------------------------------------------------------- tanh */

/* y * 2^k for the y the reconstruction below makes (a normal float whose
 * exponent stays in range): k added to the exponent field. */
static float scale2(float y, int32_t k) { return float_of(bits_of(y) + ((uint32_t)k << 23)); }

/* exp(x) - 1 for finite x with |x| < 88 (tanh's arguments are in (-44, 44)):
 * x = k ln2 + r with |r| <= ln2/2 (r kept as hi - lo, c its rounding error),
 * expm1(r) from a rational form whose correction is a degree-5 polynomial in
 * r^2/2, then 2^k (expm1(r) + 1) - 1 arranged per range of k so that no
 * cancellation loses bits. */
static float expm1_finite(float x)
{
    static const float ln2_hi = 6.9313812256e-01f; /* 0x3f317180: k * ln2_hi is exact */
    static const float ln2_lo = 9.0580006145e-06f; /* 0x3717f7d1 */
    static const float invln2 = 1.4426950216e+00f; /* 0x3fb8aa3b */
    static const float Q1 = -3.3333335072e-02f, Q2 = 1.5873016091e-03f, Q3 = -7.9365076090e-05f,
                       Q4 = 4.0082177293e-06f, Q5 = -2.0109921195e-07f;
    const uint32_t ax = bits_of(x) & 0x7fffffffu;
    const int neg = (bits_of(x) >> 31) != 0;
    float c = 0.0f;
    int32_t k = 0;

    if (neg && ax >= 0x4195b844u) return -1.0f; /* x <= -27 ln2: exp(x) - 1 rounds to -1 */
    if (ax > 0x3eb17218u) {                    /* |x| > ln2/2: reduce */
        float hi, lo;
        if (ax < 0x3f851592u) {                /* |x| < 1.5 ln2: k = +-1 */
            k = neg ? -1 : 1;
            hi = neg ? x + ln2_hi : x - ln2_hi;
            lo = neg ? -ln2_lo : ln2_lo;
        } else {
            k = (int32_t)(invln2 * x + (neg ? -0.5f : 0.5f));
            const float t = (float)k;
            hi = x - t * ln2_hi;
            lo = t * ln2_lo;
        }
        x = hi - lo;
        c = (hi - x) - lo;
    } else if (ax < 0x33000000u) {             /* |x| < 2^-25: expm1(x) rounds to x */
        return x;
    }

    const float hfx = 0.5f * x, hxs = x * hfx;
    const float r1 = 1.0f + hxs * (Q1 + hxs * (Q2 + hxs * (Q3 + hxs * (Q4 + hxs * Q5))));
    const float t3 = 3.0f - r1 * hfx;
    float e = hxs * ((r1 - t3) / (6.0f - x * t3));
    if (k == 0) return x - (x * e - hxs);
    e = x * (e - c) - c;
    e = e - hxs;
    if (k == -1) return 0.5f * (x - e) - 0.5f;
    if (k == 1) return x < -0.25f ? -2.0f * (e - (x + 0.5f)) : 1.0f + 2.0f * (x - e);
    if (k <= -2 || k > 56) return scale2(1.0f - (e - x), k) - 1.0f;
    if (k < 23) return scale2(float_of(0x3f800000u - (0x1000000u >> k)) - (e - x), k); /* 1 - 2^-k */
    float y = x - (e + float_of((uint32_t)(0x7f - k) << 23));                           /* 2^-k */
    y = y + 1.0f;
    return scale2(y, k);
}

float kmath_tanhf(float x)
{
    const uint32_t ax = bits_of(x) & 0x7fffffffu;
    const int neg = (bits_of(x) >> 31) != 0;
    float z;
    if (ax >= 0x7f800000u) return ax > 0x7f800000u ? x + x : neg ? -1.0f : 1.0f; /* NaN, +-inf */
    if (ax >= 0x41b00000u) {
        z = 1.0f;                              /* |x| >= 22: tanh rounds to +-1 */
    } else if (ax < 0x24000000u) {
        return x * (1.0f + x);                 /* |x| < 2^-55 (and +-0): tanh(x) rounds to x */
    } else if (ax >= 0x3f800000u) {            /* 1 <= |x| < 22 */
        const float t = expm1_finite(2.0f * float_of(ax));
        z = 1.0f - 2.0f / (t + 2.0f);
    } else {                                   /* |x| < 1 */
        const float t = expm1_finite(-2.0f * float_of(ax));
        z = -t / (t + 2.0f);
    }
    return neg ? -z : z;
}

/* The NEON instantiation of kernels_seq_simd.h (aarch64): four floats per
 * vector, every update vmulq_f32 then vaddq_f32 (never fused: contraction is
 * pinned off here as in kernels_neon.c, whose notes on vmlaq_f32 apply). */
#if defined(__aarch64__)
#include <arm_neon.h>

#include "kernels_seq.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off")
#endif

#define V float32x4_t
#define VW 4
#define VLOAD vld1q_f32
#define VSTORE vst1q_f32
#define VADD vaddq_f32
#define VMUL vmulq_f32
#ifdef KERN_NEON_FMA_TRAP /* the test-only fused build (see kernels_neon.c) */
#define VMADD(acc, a, b) vfmaq_f32(acc, a, b)
#endif
#define VSET1 vdupq_n_f32
#define VZERO() vdupq_n_f32(0.0f)
#define SFX neon
#define KSEQ_WSUM_NB 4 /* 4 heads x 4 vectors of accumulators, of 32 registers */
#include "kernels_seq_simd.h"
#else
typedef int kernels_seq_neon_unused;
#endif

/* Transcendentals krun computes itself instead of taking them from the C
 * library, because the C library's are not the same bits on every machine
 * (docs/NUMERICS.md §1.2).  Each is written with IEEE operations only (fma()
 * where written: one correctly rounded operation) and built without
 * contraction, so it gives the same bits on every architecture, compiler and
 * C library. */
#ifndef KRUN_KMATH_H
#define KRUN_KMATH_H

/* exp(x) in float: exactly glibc 2.36's x86-64 expf as it runs on a CPU with
 * FMA, for every input (-inf gives 0, overflow +inf, underflow 0, NaN
 * quieted). */
float kmath_expf(float x);

/* kmath_expf as a CPU without the FMA instruction computes it: on x86-64 its
 * fma() calls go to the C library (glibc: the FMA instruction where the CPU
 * has one, else its exact software fma); kmath_expf takes this build on
 * x86-64 CPUs without FMA.  Elsewhere the same function as kmath_expf.  The
 * two builds give the same bits (test_kmath: on every input of its sample,
 * and with glibc made to use its software fma). */
float kmath_expf_nofma(float x);

/* tanh(x) in float: exactly glibc 2.36's x86-64 tanhf (fdlibm's algorithm,
 * unfused), for every input: +-0, subnormals, +-inf (+-1), NaN (quieted). */
float kmath_tanhf(float x);

#endif

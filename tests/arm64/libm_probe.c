/* The transcendentals of the forward pass on a fixed sample of inputs, to
 * compare the x86-64 and the aarch64 builds (tests/arm64/test_libm.sh):
 *   libm_probe write FILE     (x86-64) writes the raw result bits
 *   libm_probe compare FILE   (aarch64, under qemu) compares its own results
 *                             with FILE and prints TAP lines
 * What must agree: krun's own kmath_expf and kmath_tanhf (run/kernels/kmath.c), and
 * what it still takes from the C library, exp in double (the sampler); sqrt
 * is IEEE-exact.  The C library's expf and tanhf are reported, not required
 * (their differences are why kmath.c exists).
 * The sample: every 4093rd float bit pattern (every sign and exponent), then
 * every 487th float of +-[2^-3, 2^3), where activations and softmax
 * arguments live: 1,256,047 inputs. */
#include "run/kernels/kmath.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum { F_KEXP, F_KTANH, F_EXP_LO, F_EXP_HI, F_EXPF, F_TANHF, NF };
static const char *fname[NF] = {"kmath_expf", "kmath_tanhf", "exp (double, low word)", "exp (double, high word)",
                                "libm expf", "libm tanhf"};

static float f_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t u_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static void eval(float x, uint32_t *out)
{
    double d = exp((double)x);
    uint64_t db;
    memcpy(&db, &d, 8);
    out[F_KEXP] = u_of(kmath_expf(x));
    out[F_KTANH] = u_of(kmath_tanhf(x));
    out[F_EXPF] = u_of(expf(x));
    out[F_EXP_LO] = (uint32_t)db;
    out[F_EXP_HI] = (uint32_t)(db >> 32);
    out[F_TANHF] = u_of(tanhf(x));
}

/* Calls fn(x, ctx) for every input of the sample, in order. */
static int each_input(int (*fn)(float, void *), void *ctx)
{
    for (uint64_t u = 0; u < 0x100000000ull; u += 4093)
        if (fn(f_of((uint32_t)u), ctx)) return -1;
    for (uint32_t u = 0x3e000000u; u < 0x41000000u; u += 487)
        for (int s = 0; s < 2; s++)
            if (fn(f_of(u ^ (s ? 0x80000000u : 0u)), ctx)) return -1;
    return 0;
}

static int write_one(float x, void *f)
{
    uint32_t r[NF];
    eval(x, r);
    return fwrite(r, sizeof r, 1, f) == 1 ? 0 : -1;
}

struct cmp { FILE *f; uint64_t n, diff[NF]; float first[NF]; };

static int compare_one(float x, void *ctx)
{
    struct cmp *c = ctx;
    uint32_t want[NF], got[NF];
    if (fread(want, sizeof want, 1, c->f) != 1) return -1;
    eval(x, got);
    for (int k = 0; k < NF; k++)
        if (got[k] != want[k] && c->diff[k]++ == 0) c->first[k] = x;
    c->n++;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "write") && strcmp(argv[1], "compare"))) {
        fprintf(stderr, "usage: libm_probe write|compare FILE\n");
        return 2;
    }
    FILE *f = fopen(argv[2], argv[1][0] == 'w' ? "wb" : "rb");
    if (!f) { perror(argv[2]); return 2; }
    if (argv[1][0] == 'w') {
        int bad = each_input(write_one, f) || fclose(f);
        if (bad) fprintf(stderr, "libm_probe: cannot write %s\n", argv[2]);
        return bad ? 2 : 0;
    }
    struct cmp c = {f, 0, {0}, {0}};
    if (each_input(compare_one, &c) || fgetc(f) != EOF) {
        printf("not ok - %s: not the sample this program writes (truncated or longer)\n", argv[2]);
        return 1;
    }
    fclose(f);
    int fails = 0;
    for (int k = 0; k < NF; k++) {
        if (k == F_EXPF || k == F_TANHF) {
            printf("# %s: %llu of %llu inputs differ between the two C libraries", fname[k], (unsigned long long)c.diff[k],
                   (unsigned long long)c.n);
            if (c.diff[k]) printf(" (first x = %a)", c.first[k]);
            printf("; krun uses its own (run/kernels/kmath.c)\n");
            continue;
        }
        if (c.diff[k]) {
            fails++;
            printf("not ok - %s: %llu of %llu inputs differ between x86-64 and aarch64 (first x = %a)\n", fname[k],
                   (unsigned long long)c.diff[k], (unsigned long long)c.n, c.first[k]);
        } else {
            printf("ok - %s: x86-64 and aarch64 agree bit for bit on %llu inputs\n", fname[k], (unsigned long long)c.n);
        }
    }
    return fails ? 1 : 0;
}

/* Numbers within exact bounds (knum.h). */
#include "knum.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef __int128 i128;

#define CLAMP ((i128)1000000000000000000ll * (i128)10000000000000ll)   /* 10^31: beyond every value made */

static i128 pow10i(int k)
{
    i128 v = 1;
    while (k-- > 0) v *= 10;
    return v;
}
#define SCALE pow10i(KNUM_DIGITS)

/* The state: the digits so far as an integer (v), integer digits k, fraction digits f, the phase,
 * the sign. */
enum { P_START, P_MINUS, P_INT, P_ZERO, P_DOT, P_FRAC };
typedef struct { uint64_t v; int k, f, phase, neg; } num_state;

static num_state unpack(uint64_t s)
{
    num_state x;
    x.v = s & ((1ull << 50) - 1);
    x.k = (int)((s >> 50) & 15);
    x.f = (int)((s >> 54) & 15);
    x.phase = (int)((s >> 58) & 7);
    x.neg = (int)((s >> 61) & 1);
    return x;
}

static uint64_t pack(num_state x)
{
    return x.v | (uint64_t)x.k << 50 | (uint64_t)x.f << 54 | (uint64_t)x.phase << 58 | (uint64_t)x.neg << 61;
}

static i128 floor_div(i128 a, i128 b) { i128 q = a / b; if ((a % b) && ((a < 0) != (b < 0))) q--; return q; }
static i128 ceil_div(i128 a, i128 b) { return -floor_div(-a, b); }

/* A multiple of the step and of g within [a, b] (magnitudes, signed by neg) and the bounds? */
static int any_in(const knum *n, i128 a, i128 b, i128 g, int neg)
{
    i128 lo = neg ? -b : a, hi = neg ? -a : b, l;
    if (lo < n->lo) lo = n->lo;
    if (hi > n->hi) hi = n->hi;
    if (lo > hi) return 0;
    l = n->step > g ? n->step : g;         /* the step, when set, is a multiple of every g made (10^15 m) */
    return ceil_div(lo, l) * l <= hi;
}

/* Can the text so far still become an accepted number? */
static int feasible(const knum *n, num_state x)
{
    i128 S = SCALE;
    switch (x.phase) {
    case P_START: case P_MINUS: {
        num_state y = x;
        if (x.phase == P_START) {
            y.phase = P_MINUS;
            y.neg = 1;
            if (feasible(n, y)) return 1;
            y.neg = 0;
        }
        y.phase = P_ZERO; y.v = 0; y.k = 1;
        if (feasible(n, y)) return 1;
        /* a first digit 1..9: every integer part of 1..15 digits, with room for a fraction */
        for (int k = 1; k <= KNUM_DIGITS; k++) {
            int G = n->integer ? 0 : KNUM_DIGITS - k;
            i128 g = pow10i(KNUM_DIGITS - G);
            if (any_in(n, pow10i(k - 1) * S, pow10i(k) * S - g, g, y.neg)) return 1;
        }
        return 0;
    }
    case P_INT: {
        for (int j = 0; j <= KNUM_DIGITS - x.k; j++) {
            int G = n->integer ? 0 : KNUM_DIGITS - x.k - j;
            i128 g = pow10i(KNUM_DIGITS - G), base = (i128)x.v * pow10i(j);
            if (any_in(n, base * S, (base + pow10i(j)) * S - g, g, x.neg)) return 1;
        }
        return 0;
    }
    case P_ZERO: case P_DOT: {
        int G = n->integer ? 0 : KNUM_DIGITS - x.k;
        i128 g = pow10i(KNUM_DIGITS - G), base = (i128)x.v * S;
        if (x.phase == P_DOT && !G) return 0;
        return any_in(n, base, base + S - g, g, x.neg);
    }
    default: {                 /* P_FRAC */
        i128 unit = pow10i(KNUM_DIGITS - x.f), base = (i128)x.v * unit, g = pow10i(x.k);
        return any_in(n, base, base + unit - g, g, x.neg);
    }
    }
}

int knum_complete(const knum *n, uint64_t state)
{
    num_state x = unpack(state);
    i128 v;
    if (x.phase != P_INT && x.phase != P_ZERO && x.phase != P_FRAC) return 0;
    v = (i128)x.v * pow10i(KNUM_DIGITS - x.f);
    if (x.neg) v = -v;
    return v >= n->lo && v <= n->hi && v % n->step == 0;
}

int knum_byte(const knum *n, uint64_t *state, uint8_t b)
{
    num_state x = unpack(*state);
    int d = b >= '0' && b <= '9' ? b - '0' : -1;
    switch (x.phase) {
    case P_START: case P_MINUS:
        if (b == '-' && x.phase == P_START) { x.phase = P_MINUS; x.neg = 1; break; }
        if (d < 0) return 0;
        x.phase = d ? P_INT : P_ZERO;
        x.v = (uint64_t)d;
        x.k = 1;
        break;
    case P_INT:
        if (b == '.') { if (n->integer || x.k >= KNUM_DIGITS) return 0; x.phase = P_DOT; break; }
        if (d < 0 || x.k >= KNUM_DIGITS) return 0;
        x.v = x.v * 10 + (uint64_t)d;
        x.k++;
        break;
    case P_ZERO:
        if (b != '.' || n->integer) return 0;
        x.phase = P_DOT;
        break;
    case P_DOT: case P_FRAC:
        if (d < 0 || x.k + x.f >= KNUM_DIGITS) return 0;
        x.v = x.v * 10 + (uint64_t)d;
        x.f++;
        x.phase = P_FRAC;
        break;
    default:
        return 0;
    }
    if (!feasible(n, x)) return 0;
    *state = pack(x);
    return 1;
}

void knum_first(const knum *n, uint64_t state, uint8_t set[32])
{
    static const char cand[] = "-.0123456789";
    for (const char *c = cand; *c; c++) {
        uint64_t st = state;
        if (knum_byte(n, &st, (uint8_t)*c)) set[(uint8_t)*c >> 3] |= (uint8_t)(1u << (*c & 7));
    }
}

/* ---- bounds ---------------------------------------------------------------------------------- */

/* v * 10^15 rounded down (up: rounded up), v read as the shortest decimal that reads back as v,
 * clamped to +-10^31. */
static i128 scaled(double v, int up)
{
    char buf[64], digits[32];
    int prec, nd = 0, exp10;
    const char *e;
    i128 D = 0, r;
    int neg = v < 0;
    if (v == 0) return 0;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, v);
        if (strtod(buf, NULL) == v) break;
    }
    for (const char *p = buf; *p && *p != 'e'; p++) if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    e = strchr(buf, 'e');
    exp10 = e ? atoi(e + 1) : 0;
    for (int i = 0; i < nd; i++) D = D * 10 + (digits[i] - '0');
    /* value = D * 10^(exp10 - (nd - 1)); times 10^15 */
    {
        int k = exp10 - (nd - 1) + KNUM_DIGITS;
        if (k >= 0) {
            if (nd + k > 31) r = CLAMP;
            else { r = D * pow10i(k); if (r > CLAMP) r = CLAMP; }
            return neg ? -r : r;
        }
        if (-k > 35) r = 0;
        else r = D / pow10i(-k);
        {
            int exact = -k <= 35 && D % pow10i(-k) == 0;
            /* round the magnitude, then the sign decides which way is up */
            if (!exact && (neg ? !up : up)) r += 1;
        }
        return neg ? -r : r;
    }
}

void knum_init(knum *n, int integer, uint64_t m)
{
    memset(n, 0, sizeof *n);
    n->integer = integer || m;
    n->lo = -CLAMP;
    n->hi = CLAMP;
    n->step = n->integer ? SCALE : 1;
    if (m) n->step = m > 1000000000000000ull ? CLAMP : (i128)m * SCALE;
}

void knum_bound(knum *n, int lower, double v, int excl)
{
    i128 b = lower ? (excl ? scaled(v, 0) + 1 : scaled(v, 1)) : (excl ? scaled(v, 1) - 1 : scaled(v, 0));
    if (lower && b > n->lo) n->lo = b;
    if (!lower && b < n->hi) n->hi = b;
}

int knum_possible(const knum *n) { return feasible(n, (num_state){0, 0, 0, P_START, 0}); }

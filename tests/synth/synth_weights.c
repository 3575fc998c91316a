/* What each tensor holds.  The distributions (README.md "Weights") are chosen so
 * every component of the model changes the output when implemented wrongly:
 *
 *   - activations entering every module are RMS-normalised, so a projection
 *     with gain g has N(0, g / sqrt(fan_in)) entries and outputs of std ~g;
 *   - MLA q/k gains give attention scores of std ~5 with the 64 (or dr) rope
 *     dims carrying half the score variance;
 *   - SiTU inputs have std 3 (gate) and 12 (up): |gate| > 4 on ~18 % and
 *     |up| > 25 on ~4 % of the elements, so the caps bite;
 *   - router logits of std 1 (sigmoid scores spread ~0.2) against a correction
 *     bias uniform in +-0.3: the bias reorders the top-k on most tokens
 *     (--routing flat: no bias, a pool loaded evenly, as the release's);
 *   - AttnRes fold vectors of norm ~2: the softmax over sources is far from
 *     uniform without being one-hot;
 *   - KDA A_log is a per-head ramp (exp from 0.37 to 4.5, tail exactly 0),
 *     dt_bias spreads the decay over (e^lb, 1) per channel;
 *   - MXFP4 codes are uniform over all 16 nibbles (-0 included) and the E8M0
 *     scales sit near 127 + log2(target std / 2.93), +-1 per group; or, with
 *     --mxfp4 quantized, the codes and scales of Student-t(3) weights of the
 *     target std quantised the way OCP MX does (nibble entropy 3.78 bits, as
 *     real K3's 3.75; scale entropy ~1.5 bits: what a compressor sees).
 *
 * Values of release-BF16 roles are rounded to BF16 even when stored as F32
 * (--fixture-dtypes), so both dtype variants describe the same model. */
#include "synth.h"

#include <math.h>
#include <stdio.h>

enum dist_kind { D_NORMAL, D_GAIN, D_UNIFORM, D_CONV, D_ALOG, D_BYTES, D_SCALE };

struct dist {
    enum dist_kind kind;
    double s1, s2;         /* D_NORMAL: std of rows (r % period) < split, and of the others */
    uint64_t period, split;
    double lo, hi;         /* D_UNIFORM, D_GAIN */
    int base;              /* D_SCALE: central E8M0 byte */
    double target;         /* D_BYTES, D_SCALE: the std of the dequantised weights */
};

/* RMS of E2M1 values with uniform codes: sqrt(mean(v^2)) over the 16 codes. */
#define E2M1_RMS 2.9262
/* SiTU(g, u) output RMS for g ~ N(0, 2.5), u ~ N(0, 10) (measured): used to bring
 * the down projections back to unit-scale outputs. */
#define SITU_RMS 11.0

static int e8m0_base(double target_std)
{
    /* the +-1 jitter of synth_fill_rows scales magnitudes by 1.125 on average */
    double b = 127.0 + log2(target_std / (E2M1_RMS * 1.125));
    int ib = (int)lround(b);
    if (ib < 2) ib = 2;
    if (ib > 250) ib = 250;
    return ib;
}

static struct dist role_dist(const k3_config *c, int role, const synth_draw *draw)
{
    const double E = c->hidden, D = c->kda_head_dim, P = (double)c->kda_heads * c->kda_head_dim;
    const double dn = c->qk_nope, dr = c->qk_rope, dqk = dn + dr;
    const double Lt = c->latent, I = c->moe_inter, Is = (double)k3_shared_inter(c), Id = c->dense_inter;
    /* MLA: q entries ~N(0, 2.5); k_nope gain gk and rope-key gain gk*sqrt(dn/dr) give
     * score variance 2 * 2.5^2 * gk^2 * dn / dqk = 25, half of it from the rope dims. */
    const double gk = sqrt(2.0 * dqk / dn), gkr = gk * sqrt(dn / dr);
    struct dist d = {D_NORMAL, 1.0, 1.0, 1, 1, 0, 0, 0, 0};
#define NORMAL(s) (d.kind = D_NORMAL, d.s1 = d.s2 = (s), d.period = 1, d.split = 1)
#define GAIN() (d.kind = D_GAIN, d.lo = 0.8, d.hi = 1.2)
    switch (role) {
    case K3T_EMBED: NORMAL(1.0); break;
    case K3T_LM_HEAD: NORMAL(3.0 * (draw->logit_gain > 1 ? draw->logit_gain : 1) / sqrt(E)); break;
    case K3T_FINAL_NORM: case K3T_OUT_RES_NORM: case K3T_INPUT_LN: case K3T_POST_ATTN_LN:
    case K3T_ATTN_RES_NORM: case K3T_MLP_RES_NORM: case K3T_KDA_ONORM: case K3T_MLA_QA_NORM:
    case K3T_MLA_KVA_NORM: case K3T_MOE_NORM:
        GAIN();
        break;
    case K3T_OUT_RES_PROJ: case K3T_ATTN_RES_PROJ: case K3T_MLP_RES_PROJ: NORMAL(1.5 / sqrt(E)); break;
    case K3T_KDA_Q: case K3T_KDA_K: case K3T_KDA_V: NORMAL(1.0 / sqrt(E)); break;
    case K3T_KDA_G: NORMAL(1.5 / sqrt(E)); break;
    case K3T_KDA_O: NORMAL(2.0 / sqrt(P)); break;
    case K3T_KDA_QCONV: case K3T_KDA_KCONV: case K3T_KDA_VCONV: d.kind = D_CONV; d.s1 = 0.5; d.s2 = 0.5; break;
    case K3T_KDA_FA: NORMAL(1.0 / sqrt(E)); break;
    case K3T_KDA_FB: NORMAL(1.0 / sqrt(D)); break;
    case K3T_KDA_B: NORMAL(2.0 / sqrt(E)); break;
    case K3T_KDA_ALOG: d.kind = D_ALOG; d.lo = -1.0; d.hi = 1.5; break;
    case K3T_KDA_DTBIAS: d.kind = D_UNIFORM; d.lo = -3.5; d.hi = 0.5; break;
    case K3T_MLA_QA: NORMAL(1.0 / sqrt(E)); break;
    case K3T_MLA_QB: NORMAL(2.5 / sqrt(c->q_lora)); break;
    case K3T_MLA_KVA: /* rows [0, kv_lora) the latent (normalised later), then the raw rope key */
        d.kind = D_NORMAL; d.s1 = 1.0 / sqrt(E); d.s2 = gkr / sqrt(E);
        d.period = (uint64_t)(c->kv_lora + c->qk_rope); d.split = (uint64_t)c->kv_lora;
        break;
    case K3T_MLA_KVB: /* per head: dn key rows, then dv value rows */
        d.kind = D_NORMAL; d.s1 = gk / sqrt(c->kv_lora); d.s2 = 1.0 / sqrt(c->kv_lora);
        d.period = (uint64_t)(c->qk_nope + c->v_head); d.split = (uint64_t)c->qk_nope;
        break;
    case K3T_MLA_O: NORMAL(2.0 / sqrt((double)c->mla_heads * c->v_head)); break;
    case K3T_MLA_G: NORMAL(1.5 / sqrt(E)); break;
    case K3T_FFN_GATE: case K3T_SH_GATE: NORMAL(2.5 / sqrt(E)); break;
    case K3T_FFN_UP: case K3T_SH_UP: NORMAL(10.0 / sqrt(E)); break;
    case K3T_FFN_DOWN: NORMAL(1.0 / (SITU_RMS * sqrt(Id))); break;
    case K3T_SH_DOWN: NORMAL(1.0 / (SITU_RMS * sqrt(Is))); break;
    case K3T_MOE_ROUTER: NORMAL(0.7 / sqrt(E)); break;
    case K3T_MOE_BIAS: /* --routing flat: none, every expert equally likely */
        d.kind = D_UNIFORM;
        d.lo = draw->routing == SYNTH_ROUTING_FLAT ? 0.0 : -0.3;
        d.hi = -d.lo;
        break;
    case K3T_MOE_DOWN: NORMAL(4.0 / sqrt(E)); break; /* latent zeta of std ~4 */
    case K3T_MOE_UP: NORMAL(1.0 / sqrt(Lt)); break;
    /* w1 (gate) on zeta ~4: std 2.5 out; w3 (up): std 10 out; w2 (down): unit gain */
    case K3T_EXP_W1_PACKED: d.kind = D_BYTES; d.target = 0.625 / sqrt(Lt); break;
    case K3T_EXP_W3_PACKED: d.kind = D_BYTES; d.target = 2.5 / sqrt(Lt); break;
    case K3T_EXP_W2_PACKED: d.kind = D_BYTES; d.target = 1.0 / sqrt(I); break;
    case K3T_EXP_W1_SCALE: d.kind = D_SCALE; d.target = 0.625 / sqrt(Lt); break;
    case K3T_EXP_W3_SCALE: d.kind = D_SCALE; d.target = 2.5 / sqrt(Lt); break;
    case K3T_EXP_W2_SCALE: d.kind = D_SCALE; d.target = 1.0 / sqrt(I); break;
    default: NORMAL(1.0 / sqrt(E)); break;
    }
    if (d.kind == D_SCALE) d.base = e8m0_base(d.target);
#undef NORMAL
#undef GAIN
    return d;
}

int synth_fixture_dtype(int role, int release_dtype)
{
    switch (role) {
    case K3T_FINAL_NORM: case K3T_OUT_RES_NORM: case K3T_OUT_RES_PROJ: case K3T_INPUT_LN: case K3T_POST_ATTN_LN:
    case K3T_ATTN_RES_NORM: case K3T_ATTN_RES_PROJ: case K3T_MLP_RES_NORM: case K3T_MLP_RES_PROJ:
    case K3T_MLA_QA_NORM: case K3T_MLA_KVA_NORM: case K3T_MOE_ROUTER: case K3T_MOE_BIAS: case K3T_MOE_NORM:
        return KPK_DT_F32;
    default:
        return release_dtype;
    }
}

uint64_t synth_rows(const synth_tensor *t) { return t->ndim <= 1 ? 1 : t->shape[0]; }

uint64_t synth_row_bytes(const synth_tensor *t)
{
    uint64_t n = 1;
    for (int i = (t->ndim <= 1 ? 0 : 1); i < t->ndim; i++) n *= t->shape[i];
    return n * kpk_dtype_size(t->dtype);
}

static void put_value(const synth_tensor *t, uint8_t *out, uint64_t i, float v)
{
    if (t->dtype == KPK_DT_BF16) {
        uint16_t b = synth_bf16(v);
        out[2 * i] = (uint8_t)b;
        out[2 * i + 1] = (uint8_t)(b >> 8);
    } else { /* F32: BF16-valued unless the release itself stores F32 */
        float f = t->release_dtype == KPK_DT_BF16 ? synth_bf16_to_f32(synth_bf16(v)) : v;
        uint32_t u;
        memcpy(&u, &f, 4);
        out[4 * i] = (uint8_t)u;
        out[4 * i + 1] = (uint8_t)(u >> 8);
        out[4 * i + 2] = (uint8_t)(u >> 16);
        out[4 * i + 3] = (uint8_t)(u >> 24);
    }
}

/* BF16 codes of s * synth_ztab[i]. */
static void bf16_table(float s, uint16_t *tab)
{
    for (unsigned i = 0; i < SYNTH_ZTAB_N; i++) tab[i] = synth_bf16(synth_ztab[i] * s);
}

/* Hot path: a row of N(0, s) BF16 values, five per 64-bit draw. */
static void normal_row_bf16(synth_rng *r, const uint16_t *tab, uint8_t *out, uint64_t n)
{
    uint64_t i = 0;
    for (; i + 5 <= n; i += 5) {
        uint64_t x = synth_next(r);
        for (int k = 0; k < 5; k++) {
            uint16_t b = tab[(x >> (64 - SYNTH_ZTAB_BITS * (k + 1))) & (SYNTH_ZTAB_N - 1)];
            out[2 * (i + (uint64_t)k)] = (uint8_t)b;
            out[2 * (i + (uint64_t)k) + 1] = (uint8_t)(b >> 8);
        }
    }
    if (i < n) {
        uint64_t x = synth_next(r);
        for (int k = 0; i < n; i++, k++) {
            uint16_t b = tab[(x >> (64 - SYNTH_ZTAB_BITS * (k + 1))) & (SYNTH_ZTAB_N - 1)];
            out[2 * i] = (uint8_t)b;
            out[2 * i + 1] = (uint8_t)(b >> 8);
        }
    }
}

/* --mxfp4 quantized: one row of MXFP4 weights, as a real quantiser makes
 * them.  Student-t(3) values (heavier-tailed than a normal, as trained
 * weights are) of the given std, in groups of 32: the E8M0 scale is
 * 2^(floor(log2(amax)) - 2) (OCP MX: E2M1's largest exponent is 2), each
 * value divided by it and rounded to the nearest E2M1 value (ties to the
 * even code), 6 at most.  codes (n/2 bytes, element 2j in the low nibble)
 * and scales (n/32 bytes) may be NULL.  Both tensors of a pair call this
 * with the packed tensor's seed, so the scales belong to the codes. */
static void mxfp4_row(synth_rng *r, double std, uint64_t n, uint8_t *codes, uint8_t *scales)
{
    static const float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const double t_std = sqrt(3.0); /* t(3) has variance 3 */
    for (uint64_t g = 0; g < n / 32; g++) {
        double v[32], amax = 0;
        int e;
        for (int i = 0; i < 32; i++) {
            double z = synth_normal(r), c = 0;
            for (int k = 0; k < 3; k++) {
                double y = synth_normal(r);
                c += y * y;
            }
            v[i] = std / t_std * z / sqrt(c / 3.0 + 1e-12);
            if (fabs(v[i]) > amax) amax = fabs(v[i]);
        }
        e = amax > 0 ? (int)floor(log2(amax)) - 2 : -127;
        if (e < -127) e = -127;
        if (e > 127) e = 127;
        if (scales) scales[g] = (uint8_t)(127 + e);
        if (!codes) continue;
        for (int i = 0; i < 32; i++) {
            float x = (float)fabs(ldexp(v[i], -e));
            int best = 0;
            for (int k = 1; k < 8; k++) {
                float dk = fabsf(x - grid[k]), db = fabsf(x - grid[best]);
                if (dk < db || (dk == db && (k & 1) == 0)) best = k;
            }
            uint8_t nib = (uint8_t)(best | (v[i] < 0 ? 8 : 0));
            uint8_t *o = &codes[g * 16 + (uint64_t)i / 2];
            if (i & 1) *o = (uint8_t)(*o | nib << 4);
            else *o = nib;
        }
    }
}

/* The seed of a tensor's rows (the bytes of a tensor depend on (seed, name, row) only). */
static uint64_t tensor_seed(uint64_t seed, const char *name)
{
    uint64_t st = seed ^ synth_hash_str(name);
    return synth_splitmix64(&st);
}

static void row_rng(synth_rng *rng, uint64_t tseed, uint64_t r)
{
    synth_rng_seed(rng, tseed ^ ((r + 1) * 0xD1B54A32D192ED03ull));
}

static struct dist given_dist(const synth_given *g)
{
    struct dist d = {D_NORMAL, g->s1, g->s2, g->period ? g->period : 1, g->period ? g->split : 1, 0, 0, 0, 0};
    if (g->gain) { d.kind = D_GAIN; d.lo = 0.8; d.hi = 1.2; }
    return d;
}

void synth_fill_rows(const k3_config *cfg, uint64_t seed, const synth_draw *draw, const synth_tensor *t, uint64_t row0,
                     uint64_t nrows, uint8_t *out)
{
    const struct dist d = t->role == SYNTH_ROLE_GIVEN ? given_dist(&t->given) : role_dist(cfg, t->role, draw);
    const int mxfp4 = draw->mxfp4;
    const uint64_t rb = synth_row_bytes(t), esz = kpk_dtype_size(t->dtype), n = rb / esz;
    const uint64_t tseed = tensor_seed(seed, t->seed_name ? t->seed_name : t->name);
    uint64_t pseed = tseed; /* --mxfp4 quantized: the seed of the packed tensor of the pair */
    uint16_t tab[2][SYNTH_ZTAB_N];
    const int bf16_normal = d.kind == D_NORMAL && t->dtype == KPK_DT_BF16;

    synth_normal_init();
    if (bf16_normal) {
        bf16_table((float)d.s1, tab[0]);
        bf16_table((float)d.s2, tab[1]);
    }
    if (d.kind == D_SCALE && mxfp4 == SYNTH_MXFP4_QUANTIZED) {
        char packed[K3_NAME_MAX];
        const char *suffix = strstr(t->name, "weight_scale");
        snprintf(packed, sizeof packed, "%.*sweight_packed", suffix ? (int)(suffix - t->name) : 0, t->name);
        pseed = tensor_seed(seed, packed);
    }

    for (uint64_t r = row0; r < row0 + nrows; r++) {
        uint8_t *o = out + (r - row0) * rb;
        synth_rng rng;
        row_rng(&rng, tseed, r);
        if ((d.kind == D_BYTES || d.kind == D_SCALE) && mxfp4 == SYNTH_MXFP4_QUANTIZED) {
            row_rng(&rng, pseed, r);
            if (d.kind == D_BYTES) mxfp4_row(&rng, d.target, 2 * n, o, NULL);
            else mxfp4_row(&rng, d.target, 32 * n, NULL, o);
            continue;
        }
        switch (d.kind) {
        case D_NORMAL: {
            const int second = (r % d.period) >= d.split;
            const float s = (float)(second ? d.s2 : d.s1);
            if (bf16_normal) {
                normal_row_bf16(&rng, tab[second], o, n);
            } else {
                for (uint64_t i = 0; i < n; i++) put_value(t, o, i, synth_normal(&rng) * s);
            }
            break;
        }
        case D_GAIN: case D_UNIFORM:
            for (uint64_t i = 0; i < n; i++)
                put_value(t, o, i, (float)(d.lo + (d.hi - d.lo) * synth_uniform(&rng)));
            break;
        case D_CONV: /* taps oldest -> newest; the newest (current input) gets +0.5 */
            for (uint64_t i = 0; i < n; i++)
                put_value(t, o, i, (float)(d.s1 * synth_normal(&rng) + (i == n - 1 ? d.s2 : 0.0)));
            break;
        case D_ALOG: { /* per head: a ramp from lo to hi with a little jitter; exactly 0 past num_heads */
            const uint64_t H = (uint64_t)cfg->kda_heads;
            for (uint64_t i = 0; i < n; i++) {
                float v = 0.0f;
                if (i < H) {
                    double ramp = H > 1 ? d.lo + (d.hi - d.lo) * (double)i / (double)(H - 1) : 0.5 * (d.lo + d.hi);
                    v = (float)(ramp + 0.05 * synth_normal(&rng));
                }
                put_value(t, o, i, v);
            }
            break;
        }
        case D_BYTES: { /* MXFP4 codes: every nibble uniform over 0..15 */
            uint64_t i = 0;
            for (; i + 8 <= n; i += 8) {
                uint64_t x = synth_next(&rng);
                for (int k = 0; k < 8; k++) o[i + (uint64_t)k] = (uint8_t)(x >> (8 * k));
            }
            if (i < n) {
                uint64_t x = synth_next(&rng);
                for (int k = 0; i < n; i++, k++) o[i] = (uint8_t)(x >> (8 * k));
            }
            break;
        }
        case D_SCALE: { /* E8M0: base + {-1, 0, 0, +1} per group */
            static const int jitter[4] = {-1, 0, 0, 1};
            uint64_t x = 0;
            for (uint64_t i = 0; i < n; i++) {
                if ((i & 31) == 0) x = synth_next(&rng);
                o[i] = (uint8_t)(d.base + jitter[(x >> (2 * (i & 31))) & 3]);
            }
            break;
        }
        }
        if (draw->end_weight && t->role == K3T_EMBED) put_value(t, o, 0, SYNTH_END_CHANNEL);
        if (draw->end_weight && t->role == K3T_LM_HEAD && (int64_t)r == draw->end_id) put_value(t, o, 0, (float)draw->end_weight);
    }
}

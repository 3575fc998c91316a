/* k3synth: synthetic Kimi K3 checkpoints in the exact released format.
 *
 * One concern per file:
 *   k3synth.c            command line, geometry, orchestration
 *   synth_rng.c          seeded PRNG (splitmix64 -> xoshiro256**), normals, BF16 rounding
 *   synth_weights.c      what each tensor holds (the distributions of README.md)
 *   synth_safetensors.c  shard planning, safetensors headers, streaming data writer, index
 *   synth_config.c       config.json (released nested shape or the flat fixture shape)
 *   synth_tokenizer.c    tiktoken.model + tokenizer_config.json
 *   synth_virtual.c      the invented vision tensors of the --virtual full-size layout
 *
 * Every tensor's bytes are a pure function of (seed, tensor name, row), so the
 * output does not depend on sharding, thread count or write order. */
#ifndef K3SYNTH_H
#define K3SYNTH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "format/k3_config.h"
#include "format/k3_schema.h"

/* ---- PRNG (synth_rng.c) -------------------------------------------------- */

typedef struct { uint64_t s[4]; } synth_rng;

uint64_t synth_splitmix64(uint64_t *state);
/* xoshiro256** seeded by four splitmix64 outputs of `seed`. */
void synth_rng_seed(synth_rng *r, uint64_t seed);
static inline uint64_t synth_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static inline uint64_t synth_next(synth_rng *r)
{
    uint64_t *s = r->s;
    const uint64_t out = synth_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = synth_rotl(s[3], 45);
    return out;
}
/* Uniform in [0, 1) with 53 bits. */
static inline double synth_uniform(synth_rng *r) { return (double)(synth_next(r) >> 11) * 0x1.0p-53; }
/* Standard normal by table: SYNTH_ZTAB_N quantiles of N(0,1) at (i + 0.5) / N
 * (Acklam's inverse-CDF approximation, rescaled to unit variance, exactly
 * symmetric; support +-3.7).  12 bits of a 64-bit draw pick one, so a draw
 * yields 5 normals; BF16 rows use a per-std table of ready BF16 codes. */
#define SYNTH_ZTAB_BITS 12
#define SYNTH_ZTAB_N (1u << SYNTH_ZTAB_BITS)
extern float synth_ztab[SYNTH_ZTAB_N];
/* Fill synth_ztab (idempotent, thread-safe). */
void synth_normal_init(void);
static inline float synth_normal(synth_rng *r)
{
    return synth_ztab[synth_next(r) >> (64 - SYNTH_ZTAB_BITS)];
}
/* FNV-1a 64 of a string. */
uint64_t synth_hash_str(const char *s);
/* float -> BF16 bits, round to nearest even (inputs are finite). */
static inline uint16_t synth_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float synth_bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- tensors ------------------------------------------------------------- */

/* One tensor to write.  role is a k3_role, -1 for an invented vision tensor
 * (--virtual only: never generated, its bytes are a hole), or SYNTH_ROLE_GIVEN:
 * drawn as `given` says (the drafter's tensors, synth_drafter.c). */
#define SYNTH_ROLE_GIVEN 1000
typedef struct synth_given {
    int gain;             /* 1: U(0.8, 1.2) (a norm's gain); 0: normal */
    double s1, s2;        /* normal: the std of rows (r % period) < split, and of the others */
    uint64_t period, split;
} synth_given;
typedef struct synth_tensor {
    char name[K3_NAME_MAX];
    const char *seed_name;  /* the name the bytes are drawn for, when not name (the drafter's embedding is the target's) */
    synth_given given;      /* role SYNTH_ROLE_GIVEN */
    int role, layer, expert;
    int dtype;            /* stored dtype (KPK_DT_F32 / BF16 / U8) */
    int release_dtype;    /* the release dtype of the role: decides BF16 rounding */
    int ndim;
    uint64_t shape[4];
    uint64_t nbytes;
    uint64_t off;         /* relative to the data section */
} synth_tensor;

/* ---- weights (synth_weights.c) ------------------------------------------- */

/* Rows of a tensor: shape[0] rows of prod(shape[1..]) elements; a 1-D tensor is one row. */
uint64_t synth_rows(const synth_tensor *t);
uint64_t synth_row_bytes(const synth_tensor *t);
/* How MXFP4 experts are drawn (--mxfp4): codes uniform over the 16 nibbles
 * (the default; the tests' geometry), or quantised heavy-tailed weights
 * whose code and scale statistics are those of a real checkpoint. */
enum { SYNTH_MXFP4_UNIFORM = 0, SYNTH_MXFP4_QUANTIZED = 1 };
/* How the routers choose (--routing): skewed (the default; the tests' geometry): a
 * correction bias uniform in +-0.3 that reorders the top-k on most tokens and, as a
 * side effect, concentrates a block's choices on a few hundred favoured experts of a
 * large pool; flat: no bias, so every expert is chosen about equally often, as the
 * release's Quantile Balancing makes it (a block of B positions then touches close to
 * N (1 - (1 - k/N)^B) experts: the pool a prompt or batch benchmark needs). */
enum { SYNTH_ROUTING_SKEWED = 0, SYNTH_ROUTING_FLAT = 1 };
typedef struct synth_draw {
    int mxfp4;            /* SYNTH_MXFP4_* */
    int routing;          /* SYNTH_ROUTING_* */
    int logit_gain;       /* --logit-gain: lm_head's std times this (0 or 1: logits of std ~3) */
    int end_weight;       /* --end-weight: every embedding's channel 0 is SYNTH_END_CHANNEL, and lm_head's row end_id
                             reads it with this weight (0: off): replies that end (the agent tests) */
    int64_t end_id;       /* <|end_of_msg|> */
} synth_draw;
#define SYNTH_END_CHANNEL 8.0f
/* Fill rows [row0, row0 + nrows) of t into out (nrows * row_bytes bytes). */
void synth_fill_rows(const k3_config *cfg, uint64_t seed, const synth_draw *draw, const synth_tensor *t, uint64_t row0,
                     uint64_t nrows, uint8_t *out);
/* The dtype the oracle fixture stores a role in (F32 for every gain/vector and the router). */
int synth_fixture_dtype(int role, int release_dtype);

/* ---- safetensors (synth_safetensors.c) ----------------------------------- */

/* Sort (dtype F32 < BF16 < U8, then name) and assign contiguous data offsets;
 * returns the data-section size. */
uint64_t synth_layout(synth_tensor *t, size_t n);
/* The released header: compact JSON, keys dtype/shape/data_offsets, space-padded
 * to a multiple of 8.  *json is malloc'd; *len is the padded length N. */
int synth_header(const synth_tensor *t, size_t n, char **json, size_t *len);
/* The same with a "__metadata__" entry first (its JSON object text, compact). */
int synth_header_meta(const synth_tensor *t, size_t n, const char *metadata, char **json, size_t *len);

typedef struct synth_writer {
    const k3_config *cfg;
    uint64_t seed;
    int threads;
    int progress;         /* print progress to stderr */
    int virt;             /* headers only, data left as holes */
    synth_draw draw;      /* --mxfp4, --routing */
    const char *metadata; /* the header's __metadata__ object (compact JSON), or NULL: none, as released */
    /* totals, for the summary */
    uint64_t bytes_written, files_written, tensors_written;
    uint64_t apparent_bytes;  /* file sizes, holes included */
    double t_start;
    uint64_t grand_total; /* expected bytes (for the progress line) */
} synth_writer;

/* Write one safetensors file: header, then every tensor's bytes (streamed by
 * w->threads threads) or, when w->virt, a hole of the data size.  t must already
 * be laid out by synth_layout.  Returns 0 or -1 with a message in err. */
int synth_write_safetensors(synth_writer *w, const char *path, synth_tensor *t, size_t n, uint64_t data_size,
                            char *err, size_t errlen);

/* Index: names (any order) and the shard file of each. */
typedef struct synth_index {
    char *arena;          /* NUL-separated names */
    size_t arena_len, arena_cap;
    size_t *name_off;
    uint16_t *shard;
    size_t n, cap;
    char **shard_names;
    size_t n_shards;
    uint64_t total_size;
} synth_index;

int synth_index_add(synth_index *ix, const char *name, uint16_t shard);
/* HF-style model.safetensors.index.json (indent 2, weight_map sorted by name). */
int synth_index_write(synth_index *ix, const char *path, char *err, size_t errlen);
void synth_index_free(synth_index *ix);

/* ---- config / tokenizer (synth_config.c, synth_tokenizer.c) -------------- */

typedef struct synth_geom {
    int hidden, layers, vocab;
    int kda_heads, kda_dim, conv;
    int mla_heads, q_lora, kv_lora, nope, rope, vdim;
    int experts, topk, shared, latent, moe_inter, first_dense, dense_inter, block;
    int n_full;
    int full_attn[K3_MAX_LAYERS]; /* 1-based */
    double eps, lb, beta1, beta2, rscale;
} synth_geom;

typedef struct synth_tok {
    int n_ranks;          /* ids 0..n_ranks-1 are ranks */
    int n_specials;       /* ids n_ranks..n_ranks+n_specials-1 */
    int bos_id, eos_id, media_id;  /* -1 when absent */
} synth_tok;

/* Build config.json text (nested released shape, or flat fixture shape). */
int synth_config_json(const synth_geom *g, const synth_tok *tok, int flat, char **out, size_t *len);

/* Plan the tokenizer for a vocab (synthetic) or a real rank file. */
int synth_tok_plan(int vocab, const char *real_path, synth_tok *tok, char *err, size_t errlen);
/* Write OUTDIR/tiktoken.model and OUTDIR/tokenizer_config.json, then load them
 * back with krun's tokenizer as a self-check. */
int synth_tok_write(const char *outdir, const char *real_path, const synth_tok *tok, char *err, size_t errlen);

/* ---- virtual (synth_virtual.c) ------------------------------------------- */

/* The vision tensors of released shard 95 (idx 0) or 96 (idx 1), invented so
 * that the file size comes out exactly as `file_size`.  *t is malloc'd. */
int synth_vision_shard(int idx, uint64_t file_size, synth_tensor **t, size_t *n, uint64_t *data_size, char *err,
                       size_t errlen);

/* --vision: the non-text tensors of a small checkpoint (at most
 * SYNTH_VISION_SMALL), written at t; returns how many. */
#define SYNTH_VISION_SMALL 8
size_t synth_vision_small(synth_tensor *t);

/* ---- the EAGLE drafter (synth_drafter.c) ----------------------------------- */

/* k3synth --drafter: config.json + model.safetensors of a K3 EAGLE-3.1 drafter
 * in the released layout (K3_EAGLE.md §1.2-1.4) at any geometry.  The
 * embedding is drawn as the target's (`language_model.model.embed_tokens.weight`
 * of the same seed), so with the target's --seed it is byte-identical to the
 * target's, as the release's is. */
typedef struct synth_drafter_geom {
    int hidden, vocab, heads, q_lora, kv_lora, nope, rope, vdim, inter;
    int n_taps, taps[8];            /* one-based completed-layer ids, as exported */
    double rope_theta, yarn_factor; /* yarn_factor 0: no rope_scaling (plain RoPE) */
    int yarn_orig;
    double beta_fast, beta_slow;
} synth_drafter_geom;
int synth_drafter_write(const char *outdir, const synth_drafter_geom *g, uint64_t seed, int virt, int threads, int progress,
                        int quiet);

/* ---- small helpers ------------------------------------------------------- */
double synth_now(void);
int synth_write_file(const char *path, const void *buf, size_t len, char *err, size_t errlen);

#endif

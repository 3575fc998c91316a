#include "memplan.h"

#include "kprogress.h"
#include "state.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int64_t kmem_parse_size(const char *s)
{
    char *end;
    double v;
    double mul = 1;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || v < 0) return -1;
    switch (*end) {
    case 0: break;
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: return -1;
    }
    if (*end == 'i') end++;
    if (*end == 'B') end++;
    if (*end || v * mul > 9e18) return -1;
    return (int64_t)(v * mul);
}

int64_t kmem_preset(const char *name)
{
    static const struct { const char *n; int gib; } p[] = {
        {"laptop", 8}, {"desktop", 32}, {"workstation", 64}, {"server", 128}, {"max", 224}};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (strcmp(name, p[i].n) == 0) return (int64_t)p[i].gib << 30;
    return -1;
}

static uint64_t read_status(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    uint64_t kb = 0;
    size_t n = strlen(key);
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == ':') { kb = strtoull(line + n + 1, NULL, 10); break; }
    fclose(f);
    return kb * 1024;
}

uint64_t kmem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    uint64_t kb = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "MemAvailable:", 13) == 0) { kb = strtoull(line + 13, NULL, 10); break; }
    fclose(f);
    return kb * 1024;
}

uint64_t kmem_rss(void) { return read_status("VmRSS"); }
uint64_t kmem_peak_rss(void) { return read_status("VmHWM"); }

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

uint64_t kmem_scratch_bytes(const k3_config *c, size_t T, size_t ctx)
{
    const size_t E = (size_t)c->hidden, D = (size_t)c->kda_head_dim, Hk = (size_t)c->kda_heads, P = Hk * D;
    const size_t H = (size_t)c->mla_heads, Rq = (size_t)c->q_lora, Rkv = (size_t)c->kv_lora, dr = (size_t)c->qk_rope;
    const size_t dn = (size_t)c->qk_nope, dv = (size_t)c->v_head, Ne = (size_t)c->n_experts, k = (size_t)c->topk;
    const size_t Lt = (size_t)c->latent, I = (size_t)c->moe_inter, Is = (size_t)k3_shared_inter(c), Id = (size_t)c->dense_inter;
    const size_t max_src = (size_t)(c->n_layers / c->attn_res_block) + 2, V = (size_t)c->vocab;
    /* floats alive in k3_forward for the whole block, plus the logits row */
    size_t fwd = T * max_src * E + 4 * T * E + V;
    size_t kda = 6 * T * P + T * Hk + T * D + (size_t)c->conv_width + T;
    size_t mla = T * (Rq + H * (dn + dr) + (Rkv + dr) + 2 * H * dv) + H * (2 * Rkv + dv + ctx) + T * E;
    size_t moe = T * (Ne + 2 * k + 3 * Lt + k * Lt + 2 * I + 2 * Is + E) + 3 * Ne + T * k;
    size_t dense = 2 * T * Id;
    /* the bound layer's widened vectors */
    size_t arena = 6 * E + 3 * P * (size_t)c->conv_width + 2 * P + 2 * D + Rq + Rkv + Ne + Lt;
    size_t floats = fwd + max_sz(max_sz(kda, mla), max_sz(moe, dense)) + arena;
    /* allocator slack: every buffer is a separate malloc */
    return (uint64_t)floats * sizeof(float) + (1u << 20);
}

uint64_t kmem_base_bytes(const k3_model *m)
{
    const kpk_file *f = m->file;
    uint64_t n_ext = kpk_extent_count(f), n_t = kpk_tensor_count(f), slots = 16;
    uint64_t dir;
    while (slots < n_t * 2) slots <<= 1;
    /* the reader's tables: decoded extents, raw tensor records, the name
     * hash, the per-layer and per-expert indexes; the string pool and the
     * manifest are bounded by the file's directory size */
    dir = n_ext * sizeof(kpk_extent) + n_t * KPK_TENSOR_RECORD_SIZE + slots * 4 +
          (uint64_t)kpk_layer_count(f) * (1 + kpk_expert_count(f)) * 8 +
          (kpk_size(f) - kpk_super(f)->tensor_table_off);
    /* the tokenizer: the rank file, its decoded pieces and hash table */
    return KMEM_PROCESS_BYTES + dir + 4 * (uint64_t)m->tokenizer_rank_len + m->tokenizer_config_len;
}

struct sizes {
    uint64_t globals_resident;
    uint64_t expert_slot;
    uint64_t *trunk;              /* padded, per layer */
    int moe_layers;
};

static int measure(const k3_model *m, struct sizes *s, char *err, size_t errlen)
{
    const kpk_extent *g = kpk_extent_at(m->file, m->globals_extent);
    const k3_config *c = &m->cfg;
    uint64_t emb = m->globals[K3T_EMBED].nbytes;
    memset(s, 0, sizeof *s);
    s->trunk = calloc((size_t)c->n_layers, sizeof *s->trunk);
    if (!s->trunk) { snprintf(err, errlen, "out of memory"); return -1; }
    /* everything of the globals extent but the embedding, page-rounded */
    s->globals_resident = kpk_extent_padded_len(m->file, g) - (emb / 4096) * 4096;
    for (int L = 0; L < c->n_layers; L++) {
        s->trunk[L] = kpk_extent_padded_len(m->file, kpk_extent_at(m->file, m->trunk_extent[L]));
        if (k3_layer_is_moe(c, L)) {
            s->moe_layers++;
            for (int e = 0; e < c->n_experts; e++) {
                uint64_t x = kpk_extent_padded_len(m->file, kpk_extent_at(m->file, (uint32_t)k3_expert_extent(m, L, e)));
                if (x > s->expert_slot) s->expert_slot = x;
            }
        }
    }
    return 0;
}

/* Bytes for pin layers resident and the ring for the rest, with slots expert slots. */
static uint64_t total_for(const struct sizes *s, const kmemplan *p, int n_layers, int pin, int slots,
                          uint64_t *pinned, uint64_t *ring_slot)
{
    uint64_t pb = 0, rs = 0;
    for (int L = 0; L < n_layers; L++) {
        if (L < pin) pb += s->trunk[L];
        else if (s->trunk[L] > rs) rs = s->trunk[L];
    }
    if (pinned) *pinned = pb;
    if (ring_slot) *ring_slot = rs;
    return p->base + s->globals_resident + p->state_bytes + p->scratch_bytes + pb + 2 * rs + (uint64_t)slots * s->expert_slot;
}

int kmemplan_make(const k3_model *m, uint64_t budget, int pin, int slots, size_t ctx, size_t chunk, uint64_t base,
                  kmemplan *p, char *err, size_t errlen)
{
    const k3_config *c = &m->cfg;
    struct sizes s;
    int min_slots, max_slots;
    char b1[32], b2[32];

    memset(p, 0, sizeof *p);
    if (measure(m, &s, err, errlen)) return -1;
    p->budget = budget;
    p->base = base;
    p->ctx = ctx;
    p->chunk = chunk;
    p->n_layers = c->n_layers;
    p->globals_resident = s.globals_resident;
    p->state_bytes = k3_state_bytes(c, ctx);
    p->scratch_bytes = kmem_scratch_bytes(c, chunk, ctx);
    p->expert_slot_bytes = s.expert_slot;
    max_slots = s.moe_layers * c->n_experts;
    min_slots = c->topk < max_slots ? c->topk : max_slots;
    /* the smallest total over every pinned prefix: pinning a layer larger than
     * twice the rest can cost less than streaming it through the ring */
    p->minimum = total_for(&s, p, c->n_layers, 0, min_slots, NULL, NULL);
    for (int k = 1; k <= c->n_layers; k++) {
        uint64_t t = total_for(&s, p, c->n_layers, k, min_slots, NULL, NULL);
        if (t < p->minimum) p->minimum = t;
    }
    if (pin > c->n_layers) pin = c->n_layers;
    if (slots > max_slots) slots = max_slots;

    if (pin < 0) {
        /* the trunk first: the longest prefix that fits with the fewest expert slots */
        int need = slots >= 0 ? slots : min_slots;
        /* not monotonic: pinning a large layer can shrink the ring by more than it costs */
        pin = 0;
        for (int k = 1; k <= c->n_layers; k++)
            if (total_for(&s, p, c->n_layers, k, need, NULL, NULL) <= budget) pin = k;
    }
    if (slots < 0) {
        uint64_t rest = total_for(&s, p, c->n_layers, pin, 0, NULL, NULL);
        slots = rest < budget && s.expert_slot ? (int)((budget - rest) / s.expert_slot) : 0;
        if (slots > max_slots) slots = max_slots;
        if (slots < min_slots) slots = min_slots;
    }
    if (max_slots > 0 && slots < 1) slots = 1;
    p->pin = pin;
    p->expert_slots = slots;
    p->total = total_for(&s, p, c->n_layers, pin, slots, &p->pinned_bytes, &p->ring_slot_bytes);
    p->ring_slots = pin < c->n_layers ? 2 : 0;
    if (!p->ring_slots) p->ring_slot_bytes = 0;
    for (int L = pin; L < c->n_layers; L++) p->trunk_stream_bytes += s.trunk[L];
    p->expert_reads_max = (uint64_t)s.moe_layers * (uint64_t)c->topk * s.expert_slot;
    free(s.trunk);
    if (p->total > budget) {
        kfmt_bytes(budget, b1, sizeof b1);
        kfmt_bytes(p->minimum, b2, sizeof b2);
        snprintf(err, errlen, "a budget of %s (%llu bytes) cannot hold this plan (%llu bytes); the minimum for this "
                 "model with --ctx %zu is %s (%llu bytes)", b1, (unsigned long long)budget, (unsigned long long)p->total,
                 ctx, b2, (unsigned long long)p->minimum);
        return -1;
    }
    return 0;
}

void kmemplan_print(const kmemplan *p, FILE *out)
{
    char b[32], c2[32];
#define ROW(label, bytes, ...) do { kfmt_bytes(bytes, b, sizeof b); fprintf(out, "  %-22s %10s  ", label, b); fprintf(out, __VA_ARGS__); fputc('\n', out); } while (0)
    kfmt_bytes(p->budget, b, sizeof b);
    fprintf(out, "memory plan: budget %s%s%s%s (%llu bytes)\n", b, p->preset ? " (preset " : "", p->preset ? p->preset : "",
            p->preset ? ")" : "", (unsigned long long)p->budget);
    ROW("process base", p->base, "code, threads, KPK directory, tokenizer");
    ROW("resident globals", p->globals_resident, "lm_head and global vectors (embedding rows read on demand)");
    if (p->pin) ROW("pinned trunk", p->pinned_bytes, "layers 0..%d of %d", p->pin - 1, p->n_layers);
    else ROW("pinned trunk", p->pinned_bytes, "none of %d layers", p->n_layers);
    kfmt_bytes(p->ring_slot_bytes, c2, sizeof c2);
    ROW("trunk ring", (uint64_t)p->ring_slots * p->ring_slot_bytes, "%d slots x %s", p->ring_slots, c2);
    kfmt_bytes(p->expert_slot_bytes, c2, sizeof c2);
    ROW("expert cache", (uint64_t)p->expert_slots * p->expert_slot_bytes, "%d slots x %s", p->expert_slots, c2);
    ROW("state", p->state_bytes, "KDA + ShortConv state, MLA latent cache for --ctx %zu", p->ctx);
    ROW("scratch", p->scratch_bytes, "activations of a %zu-position block", p->chunk);
    ROW("total", p->total, "(minimum for this model and --ctx: %.3g GB)", (double)p->minimum / 1e9);
    kfmt_bytes(p->trunk_stream_bytes, b, sizeof b);
    kfmt_bytes(p->expert_reads_max, c2, sizeof c2);
    fprintf(out, "reads per decoding step: trunk %s (every unpinned layer), experts up to %s (top-k of every MoE layer, less cache hits)\n", b, c2);
#undef ROW
}

json_t *kmemplan_json(const kmemplan *p)
{
    json_t *j = json_object();
    json_object_set_new(j, "budget_bytes", json_integer((json_int_t)p->budget));
    json_object_set_new(j, "preset", p->preset ? json_string(p->preset) : json_null());
    json_object_set_new(j, "base_bytes", json_integer((json_int_t)p->base));
    json_object_set_new(j, "globals_resident_bytes", json_integer((json_int_t)p->globals_resident));
    json_object_set_new(j, "pinned_layers", json_integer(p->pin));
    json_object_set_new(j, "pinned_bytes", json_integer((json_int_t)p->pinned_bytes));
    json_object_set_new(j, "ring_slots", json_integer(p->ring_slots));
    json_object_set_new(j, "ring_slot_bytes", json_integer((json_int_t)p->ring_slot_bytes));
    json_object_set_new(j, "expert_slots", json_integer(p->expert_slots));
    json_object_set_new(j, "expert_slot_bytes", json_integer((json_int_t)p->expert_slot_bytes));
    json_object_set_new(j, "state_bytes", json_integer((json_int_t)p->state_bytes));
    json_object_set_new(j, "scratch_bytes", json_integer((json_int_t)p->scratch_bytes));
    json_object_set_new(j, "total_bytes", json_integer((json_int_t)p->total));
    json_object_set_new(j, "minimum_bytes", json_integer((json_int_t)p->minimum));
    json_object_set_new(j, "ctx", json_integer((json_int_t)p->ctx));
    json_object_set_new(j, "trunk_stream_bytes_per_token", json_integer((json_int_t)p->trunk_stream_bytes));
    json_object_set_new(j, "expert_read_bytes_per_token_max", json_integer((json_int_t)p->expert_reads_max));
    return j;
}

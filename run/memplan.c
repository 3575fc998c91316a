#include "memplan.h"

#include "forward.h"
#include "kprogress.h"
#include "session.h"
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* "KEY:   123 kB" of /proc/self/status.  open + read into the stack, not
 * stdio: this runs every decoding step, which allocates nothing. */
static uint64_t read_status(const char *key)
{
    char buf[4096];
    size_t n = strlen(key), len = 0;
    ssize_t got;
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    while (len < sizeof buf - 1 && (got = read(fd, buf + len, sizeof buf - 1 - len)) > 0) len += (size_t)got;
    close(fd);
    buf[len] = 0;
    for (char *l = buf; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (strncmp(l, key, n) == 0 && l[n] == ':') return strtoull(l + n + 1, NULL, 10) * 1024;
    return 0;
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
    return KMEM_PROCESS_BYTES + KSTORE_WINDOW_BYTES + dir + 4 * (uint64_t)m->tokenizer_rank_len + m->tokenizer_config_len +
           m->config_len;
}

int64_t kmem_globals_first(const k3_model *m)
{
    const kt_loc *emb = &m->globals[K3T_EMBED];
    uint64_t first = (emb->offset + emb->nbytes) / 4096 * 4096;
    for (int r = 0; r <= K3T_OUT_RES_PROJ; r++)
        if (r != K3T_EMBED && m->globals[r].offset < first) return -1;
    return (int64_t)first;
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
    int64_t first = kmem_globals_first(m);
    memset(s, 0, sizeof *s);
    if (first < 0) {
        snprintf(err, errlen, "%s: the embedding is not the first tensor of the globals extent, so it cannot be left "
                 "out of memory; run without --mem", kpk_path(m->file));
        return -1;
    }
    s->trunk = calloc((size_t)c->n_layers, sizeof *s->trunk);
    if (!s->trunk) { snprintf(err, errlen, "out of memory"); return -1; }
    /* everything of the globals extent but the embedding, page-rounded */
    s->globals_resident = kpk_extent_padded_len(m->file, g) - (uint64_t)first;
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
    return p->base + s->globals_resident + p->state_bytes + p->vectors_bytes + p->scratch_bytes + pb + 2 * rs +
           (uint64_t)slots * s->expert_slot;
}

int kmemplan_make(const k3_model *m, uint64_t budget, int pin, int slots, size_t ctx, size_t chunk, size_t max_seqs,
                  size_t spec, uint64_t base, kmemplan *p, char *err, size_t errlen)
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
    p->max_seqs = max_seqs;
    p->spec = spec;
    p->block = k3_block_positions(chunk, max_seqs, spec);
    p->n_layers = c->n_layers;
    p->globals_resident = s.globals_resident;
    p->session_bytes = krun_session_bytes(c, ctx);
    p->state_bytes = (uint64_t)max_seqs * p->session_bytes;
    p->vectors_bytes = k3_run_vectors_bytes(c);
    p->scratch_bytes = k3_run_bytes(c, p->block, max_seqs, ctx, spec) - p->vectors_bytes;
    p->spec_bytes = k3_journal_bytes(c, spec);
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
    {
        /* sessions that fit: the rest of the plan with the fewest expert slots */
        uint64_t rest = total_for(&s, p, c->n_layers, pin, min_slots, NULL, NULL) - p->state_bytes;
        p->sessions_fit = budget > rest && p->session_bytes ? (budget - rest) / p->session_bytes : 0;
    }
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
    kfmt_bytes(p->session_bytes, c2, sizeof c2);
    ROW("state", p->state_bytes, "%zu session%s x %s (KDA + ShortConv state, MLA latent cache for --ctx %zu); %llu would fit",
        p->max_seqs, p->max_seqs == 1 ? "" : "s", c2, p->ctx, (unsigned long long)p->sessions_fit);
    ROW("bound vectors", p->vectors_bytes, "norms, AttnRes folds, conv taps, biases of every layer, widened once");
    if (p->spec) {
        kfmt_bytes(p->spec_bytes, c2, sizeof c2);
        ROW("scratch", p->scratch_bytes, "activations of a %zu-position block; %s of it the --spec %zu journal", p->block, c2, p->spec);
    } else {
        ROW("scratch", p->scratch_bytes, "activations of a %zu-position block", p->block);
    }
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
    json_object_set_new(j, "session_bytes", json_integer((json_int_t)p->session_bytes));
    json_object_set_new(j, "max_seqs", json_integer((json_int_t)p->max_seqs));
    json_object_set_new(j, "sessions_fit", json_integer((json_int_t)p->sessions_fit));
    json_object_set_new(j, "vectors_bytes", json_integer((json_int_t)p->vectors_bytes));
    json_object_set_new(j, "scratch_bytes", json_integer((json_int_t)p->scratch_bytes));
    json_object_set_new(j, "block_positions", json_integer((json_int_t)p->block));
    json_object_set_new(j, "spec", json_integer((json_int_t)p->spec));
    json_object_set_new(j, "spec_journal_bytes", json_integer((json_int_t)p->spec_bytes));
    json_object_set_new(j, "total_bytes", json_integer((json_int_t)p->total));
    json_object_set_new(j, "minimum_bytes", json_integer((json_int_t)p->minimum));
    json_object_set_new(j, "ctx", json_integer((json_int_t)p->ctx));
    json_object_set_new(j, "trunk_stream_bytes_per_token", json_integer((json_int_t)p->trunk_stream_bytes));
    json_object_set_new(j, "expert_read_bytes_per_token_max", json_integer((json_int_t)p->expert_reads_max));
    return j;
}

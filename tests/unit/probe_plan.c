/* The memory planner (run/session/memplan.c) and the ring's cut (run/store/store_pieces.c)
 * checked from the outside, on a real .kpk file; tests/cli/test_plan.sh drives it on
 * k3synth models (plain, compressed, a stripe set):
 *
 *   probe_plan ring   FILE.kpk                 the cut of every piece size: pieces cover each
 *                                              streamed range in file order, parts cover each
 *                                              tensor's rows once, only tensors used once are
 *                                              cut; and each layer's fewest ring slots equal
 *                                              the fewest with which an explicit replay of the
 *                                              forward pass's use order never waits for a slot
 *   probe_plan store  FILE.kpk --mem SIZE [--head hold|stream] [--pin N] [--piece SIZE] [--predict on]
 *                     [--chunk auto|N] [--ctx N]
 *                                              the store's buffers as allocated == as planned (with a
 *                                              prefill layout: the store's own and the flex region)
 *   probe_plan budget FILE.kpk                 the minimum budget plans; one byte less is refused
 *                                              (exit code, and the message names the minimum)
 *   probe_plan prefer FILE.kpk                 at budgets from the minimum up, the plan is the
 *                                              planner's first choice: lm_head held before any
 *                                              pinning, the longest pinned prefix, the largest
 *                                              pieces, and what is left to the expert cache
 *
 * The store check replaces posix_memalign and aligned_alloc with recording wrappers around
 * glibc's own, so sanitizer builds (their own allocator) skip it.  Prints TAP lines. */
#include "sanitized.h"
#include "format/kargs.h"
#include "format/kpk_reader.h"
#include "run/model/model.h"
#include "run/model/use_order.h"
#include "run/session/memplan.h"
#include "run/session/session.h"
#include "run/store/iopool.h"
#include "run/store/store.h"
#include "run/store/store_pieces.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static int fails;
#define OK(cond, ...) do { int c_ = (cond); printf("%s - ", c_ ? "ok" : "not ok"); printf(__VA_ARGS__); printf("\n"); if (!c_) fails++; } while (0)

/* ---- recording the page-aligned allocations ------------------------------------ */

static _Atomic int recording;
static _Atomic uint64_t aligned_bytes;     /* bytes of the 4096-aligned allocations while recording */
static _Atomic unsigned long aligned_count;

static __attribute__((unused)) void note_aligned(size_t al, size_t n)
{
    if (!atomic_load(&recording) || al < 4096) return;
    atomic_fetch_add(&aligned_bytes, n);
    atomic_fetch_add(&aligned_count, 1);
}

#if !SANITIZED
extern void *__libc_memalign(size_t, size_t);
void *aligned_alloc(size_t al, size_t n) { note_aligned(al, n); return __libc_memalign(al, n); }
int posix_memalign(void **out, size_t al, size_t n)
{
    void *p;
    note_aligned(al, n);
    p = __libc_memalign(al, n);
    if (!p) return 12; /* ENOMEM */
    *out = p;
    return 0;
}
#endif

/* ---- the file as the planner sees it ---------------------------------------------- */

typedef struct { kpk_file *f; k3_model m; } opened;

static int open_file(const char *path, opened *o)
{
    kpk_err e = {0};
    krun_err err;
    if (kpk_open(path, &o->f, &e)) { printf("not ok - open %s: %s\n", path, e.msg); fails++; return -1; }
    if (k3_model_open(o->f, &o->m, &err)) { printf("not ok - model %s: %s\n", path, err.msg); fails++; kpk_close(o->f); return -1; }
    return 0;
}

static void close_file(opened *o)
{
    k3_model_close(&o->m);
    kpk_close(o->f);
}

/* ---- ring: the cut, and the fewest slots ------------------------------------------ */

/* The slot s's pieces played out with K ring slots, as the store plays them: pieces are
 * read in order into free slots and handed out in order; a use needs its pieces (and every
 * piece before them) handed out; a piece's slot is free once each of its used parts has been
 * used (a vector when it is bound, the first pass; a matrix used once when multiplied; a
 * matrix used many times at the end of the layer).  1 if no piece ever waits for a slot. */
static int runs_with(const kring *r, const k3_model *m, int s, int K)
{
    const uint32_t p0 = r->slot_piece0[s], n = r->slot_npieces[s];
    uint32_t *left = calloc(n, sizeof *left), next = 0;
    int busy = 0, ok = 1;
    k3_use_step order[K3T_COUNT];
    int no = k3_use_order(m, s == r->n_slots - 1 ? K3_GLOBALS : s, order);
    if (!left) return 0;
    for (uint32_t q = 0; q < n; q++)
        for (uint32_t k = 0; k < r->piece[p0 + q].nparts; k++) left[q] += r->part[r->piece[p0 + q].part0 + k].use != K3U_NONE;
#define BRING(q) do { while (ok && next <= (q)) { if (busy == K) ok = 0; else { busy++; if (!left[next]) busy--; next++; } } } while (0)
#define USE(q) do { if (--left[q] == 0 && (q) < next) busy--; } while (0)
    for (int k = 0; k < no && ok; k++) {
        size_t t = (size_t)s * K3T_COUNT + order[k].role;
        uint32_t a = r->tpart0[t], np = r->tnparts[t];
        if (!np) continue;
        if (order[k].use == K3U_ONCE) {
            for (uint32_t j = 0; j < np && ok; j++) {
                uint32_t q = r->part[a + j].piece - p0;
                BRING(q);
                USE(q);
            }
        } else {
            BRING(r->part[a + np - 1].piece - p0);
            if (order[k].use == K3U_VEC)
                for (uint32_t j = 0; j < np; j++) USE(r->part[a + j].piece - p0);
        }
    }
    BRING(n - 1);   /* the end of the layer: the rest is read and checked */
#undef BRING
#undef USE
    free(left);
    return ok;
}

/* The cut of slot s: pieces consecutive and contiguous over its range, each tensor's rows
 * covered once in order, only a tensor used once cut, a piece beyond the target one part. */
static int cut_ok(const kring *r, const k3_model *m, int s, char *why, size_t n)
{
    const uint32_t p0 = r->slot_piece0[s], np = r->slot_npieces[s];
    const int L = s == r->n_slots - 1 ? K3_GLOBALS : s;
    uint64_t rows_done[K3T_COUNT] = {0};
    for (uint32_t q = p0; q < p0 + np; q++) {
        const kpiece *p = &r->piece[q];
        int used = 0;
        if ((q == p0) != !!p->first || (q == p0 + np - 1) != !!p->last) { snprintf(why, n, "piece %u: first/last flags", q); return 0; }
        if (q > p0 && p->r0 != r->piece[q - 1].r1) { snprintf(why, n, "piece %u: not contiguous with the one before", q); return 0; }
        if (p->r1 <= p->r0 || (int)p->slot != s) { snprintf(why, n, "piece %u: empty or of another slot", q); return 0; }
        for (uint32_t k = p->part0; k < p->part0 + p->nparts; k++) {
            const kpart *t = &r->part[k];
            const kt_loc *l = L == K3_GLOBALS ? &m->globals[t->role] : &m->trunk[(size_t)L * K3T_COUNT + t->role];
            used += t->use != K3U_NONE;
            if (t->piece != q || t->row0 != rows_done[t->role] || t->row1 <= t->row0 || t->row1 > l->shape[0]) {
                snprintf(why, n, "piece %u: role %d rows [%llu, %llu) after %llu of %llu", q, t->role, (unsigned long long)t->row0,
                         (unsigned long long)t->row1, (unsigned long long)rows_done[t->role], (unsigned long long)l->shape[0]);
                return 0;
            }
            if (t->use != K3U_ONCE && t->use != K3U_NONE && (t->row0 != 0 || t->row1 != l->shape[0])) {
                snprintf(why, n, "piece %u: role %d, not used once, is cut", q, t->role);
                return 0;
            }
            rows_done[t->role] = t->row1;
        }
        if (kpk_extent_at(m->file, p->extent)->codec == KPK_CODEC_NONE && p->r1 - p->r0 > r->piece_bytes && used > 1) {
            snprintf(why, n, "piece %u: %llu bytes (target %llu) hold %d used parts", q, (unsigned long long)(p->r1 - p->r0),
                     (unsigned long long)r->piece_bytes, used);
            return 0;
        }
    }
    for (int role = 0; role < K3T_COUNT; role++)
        if (r->tnparts[(size_t)s * K3T_COUNT + role]) {
            const kt_loc *l = L == K3_GLOBALS ? &m->globals[role] : &m->trunk[(size_t)L * K3T_COUNT + role];
            if (rows_done[role] != l->shape[0]) { snprintf(why, n, "role %d: %llu of %llu rows", role, (unsigned long long)rows_done[role], (unsigned long long)l->shape[0]); return 0; }
        }
    return 1;
}

static void check_ring(const char *path)
{
    opened o;
    uint64_t largest = 0, stage;
    int sizes = 0, slots_checked = 0, cut_bad = 0, k_bad = 0, head;
    char why[256] = "";
    if (open_file(path, &o)) return;
    stage = kiop_stage_bytes(o.f);
    head = kring_head_streamable(&o.m);
    for (int L = 0; L < o.m.cfg.n_layers; L++)
        if (kpk_extent_at(o.f, o.m.trunk_extent[L])->raw_len > largest) largest = kpk_extent_at(o.f, o.m.trunk_extent[L])->raw_len;
    /* whole extents, then every power of two down to one page */
    for (uint64_t P = largest * 2; P >= 4096; P = P > largest ? largest : P / 2) {
        kring ring;
        krun_err e;
        int K = 2;
        if (kring_build(&ring, &o.m, P, 0, head, stage, &e)) { printf("not ok - kring_build, pieces of %llu: %s\n", (unsigned long long)P, e.msg); fails++; break; }
        sizes++;
        for (int s = 0; s < ring.n_slots; s++) {
            int k, want = 0;
            if (!ring.slot_npieces[s]) continue;
            slots_checked++;
            if (!cut_ok(&ring, &o.m, s, why, sizeof why) && !cut_bad++) printf("# pieces of %llu, slot %d: %s\n", (unsigned long long)P, s, why);
            k = kring_slot_min_slots(&ring, &o.m, s);
            while (want < 1 << 16 && !runs_with(&ring, &o.m, s, ++want)) {}
            if (k != want && !k_bad++)
                printf("# pieces of %llu, slot %d: the planner says %d slots, the replay needs %d\n", (unsigned long long)P, s, k, want);
            if (k > K) K = k;
        }
        if (ring.min_slots != K && !k_bad++) printf("# pieces of %llu: min_slots %d, the slots' largest %d\n", (unsigned long long)P, ring.min_slots, K);
        kring_free(&ring);
        if (P == 4096) break;
    }
    OK(sizes > 2 && !cut_bad, "%s: %d piece sizes, %d layer cuts: pieces contiguous in file order, every tensor's rows once, only "
       "tensors used once cut", path, sizes, slots_checked);
    OK(sizes > 2 && !k_bad, "%s: each layer's fewest ring slots (kring_slot_min_slots) == the fewest an explicit replay of the use "
       "order runs with, over %d layer cuts", path, slots_checked);
    close_file(&o);
}

/* ---- store: planned buffers == allocated ------------------------------------------- */

static void check_store(const char *path, int argc, char **argv)
{
    krun_model *m;
    krun_model_opts o;
    krun_err e;
    const kmemplan *p;
    opened f;
    uint64_t want, window, stage;
    krun_model_opts_init(&o);
    o.path = path;
    o.ctx = 64;
    o.chunk = 4;
    o.threads = 2;
    o.io = KRUN_IO_PREAD;
    for (int i = 3; i < argc; i++) {
        const char *v;
        if (kargs_flag(argc, argv, &i, "--mem", &v) > 0) o.budget = (uint64_t)kargs_size(v);
        else if (kargs_flag(argc, argv, &i, "--pin", &v) > 0) o.pin = atoi(v);
        else if (kargs_flag(argc, argv, &i, "--piece", &v) > 0) o.piece = (uint64_t)kargs_size(v);
        else if (kargs_flag(argc, argv, &i, "--head", &v) > 0) o.head = !strcmp(v, "stream");
        else if (kargs_flag(argc, argv, &i, "--predict", &v) > 0) o.predict = !strcmp(v, "on");
        else if (kargs_flag(argc, argv, &i, "--chunk", &v) > 0) o.chunk = !strcmp(v, "auto") ? 0 : (size_t)atol(v);
        else if (kargs_flag(argc, argv, &i, "--ctx", &v) > 0) o.ctx = (size_t)atol(v);
    }
    if (SANITIZED) { printf("skip - %s: the store's buffers seen by the allocator (sanitizer build)\n", path); return; }
    if (open_file(path, &f)) return;
    window = kstore_window_bytes(&f.m);
    stage = kiop_stage_bytes(f.f);
    close_file(&f);
    if (krun_model_load(path, &m, &e)) { printf("not ok - load %s: %s\n", path, e.msg); fails++; return; }
    atomic_store(&aligned_bytes, 0);
    atomic_store(&aligned_count, 0);
    atomic_store(&recording, 1);
    if (krun_model_prepare(m, &o, &e)) {
        atomic_store(&recording, 0);
        printf("not ok - prepare %s: %s\n", path, e.msg);
        fails++;
        krun_model_close(m);
        return;
    }
    atomic_store(&recording, 0);
    p = krun_model_plan(m);
    /* page-aligned: the held extents, the ring's slots, the expert slots, the store's window,
     * each I/O worker's staging (compressed files; its plane buffer and zstd context come
     * later, from the codec) and the prediction's buffers; with a prefill layout the lent
     * layers and slots are the flex region's (one buffer, the session's) */
    want = p->globals_resident + p->pinned_prefill_bytes + (uint64_t)p->ring_slots * p->ring_slot_bytes +
           (uint64_t)p->expert_slots_prefill * p->expert_slot_bytes + p->flex_bytes + window + p->predict_bytes +
           (uint64_t)p->io_threads * stage;
    OK(atomic_load(&aligned_bytes) == want && (p->block_prefill || (p->pinned_prefill_bytes == p->pinned_bytes &&
                                                                     p->expert_slots_prefill == p->expert_slots && !p->flex_bytes)),
       "%s --mem %llu (pin %d (%d while a prefill block runs), lm_head %s, %d ring slots of %llu, %d expert slots (%d), flex %llu, "
       "predict %d): the store allocated %llu bytes in %lu page-aligned buffers; the plan says %llu", path, (unsigned long long)o.budget,
       p->pin, p->pin_prefill, p->head_streamed ? "streams" : "held", p->ring_slots, (unsigned long long)p->ring_slot_bytes,
       p->expert_slots, p->expert_slots_prefill, (unsigned long long)p->flex_bytes, p->predict,
       (unsigned long long)atomic_load(&aligned_bytes), atomic_load(&aligned_count), (unsigned long long)want);
    if (o.chunk == 0 && p->block_prefill) {
        kstore_layout l;
        opened g;
        kmemplan_layout(p, &l);
        if (!open_file(path, &g)) {
            OK(p->lent_bytes == kstore_lent_bytes(g.f, &g.m, &l, stage) && p->lent_bytes ==
               p->pinned_bytes - p->pinned_prefill_bytes + (uint64_t)(p->expert_slots - p->expert_slots_prefill) * p->expert_slot_bytes &&
               p->flex_bytes == (p->lent_bytes > p->scratch_prefill_bytes ? p->lent_bytes : p->scratch_prefill_bytes) &&
               p->total == p->base + p->globals_resident + p->pinned_prefill_bytes + (uint64_t)p->ring_slots * p->ring_slot_bytes +
               (uint64_t)p->expert_slots_prefill * p->expert_slot_bytes + p->io_bytes + p->predict_bytes + p->state_bytes +
               p->vectors_bytes + p->scratch_bytes + p->flex_bytes && p->total <= p->budget,
               "%s --mem %llu --chunk auto: the flex region (%llu) is the larger of what decoding lends (layers %d..%d and %d "
               "slots: %llu) and a %zu-position block (%llu), and the total adds up to %llu <= the budget", path,
               (unsigned long long)o.budget, (unsigned long long)p->flex_bytes, p->pin_prefill, p->pin - 1,
               p->expert_slots - p->expert_slots_prefill, (unsigned long long)p->lent_bytes, p->block_prefill,
               (unsigned long long)p->scratch_prefill_bytes, (unsigned long long)p->total);
            close_file(&g);
        }
    }
    krun_model_close(m);
}

/* ---- budget: the minimum, and one byte less ------------------------------------------ */

static int plan_at(krun_model *m, uint64_t budget, int pin, int head, uint64_t piece, kmemplan *p, krun_err *e)
{
    krun_model_opts o;
    krun_model_opts_init(&o);
    o.budget = budget;
    o.pin = pin;
    o.head = head;
    o.piece = piece;
    o.ctx = 256;
    o.predict = 0;
    return krun_model_make_plan(m, &o, p, e);
}

static void check_budget(const char *path)
{
    krun_model *m;
    krun_err e;
    kmemplan p, q;
    char want[64];
    if (krun_model_load(path, &m, &e)) { printf("not ok - load %s: %s\n", path, e.msg); fails++; return; }
    if (plan_at(m, (uint64_t)1 << 40, -1, -1, 0, &p, &e)) { printf("not ok - a plan at 1 TiB: %s\n", e.msg); fails++; krun_model_close(m); return; }
    OK(plan_at(m, p.minimum, -1, -1, 0, &q, &e) == 0 && q.total <= p.minimum && q.minimum == p.minimum,
       "%s: the minimum budget (%llu bytes) plans, within it (%llu)", path, (unsigned long long)p.minimum, (unsigned long long)q.total);
    snprintf(want, sizeof want, "(%llu bytes)", (unsigned long long)p.minimum);
    OK(plan_at(m, p.minimum - 1, -1, -1, 0, &q, &e) == -1 && e.code == KRUN_EINPUT && strstr(e.msg, "minimum") && strstr(e.msg, want),
       "%s: one byte less is refused (exit %d) naming the minimum: %s", path, e.code, e.msg);
    krun_model_close(m);
}

/* ---- prefer: the planner's order of preference ---------------------------------------- */

static void check_prefer(const char *path)
{
    krun_model *m;
    krun_err e;
    kmemplan top, p, q;
    opened f;
    uint64_t whole = 0;
    int budgets = 0, bad = 0, streamable, NL;
    if (open_file(path, &f)) return;
    streamable = kring_head_streamable(&f.m);
    NL = f.m.cfg.n_layers;
    for (int L = 0; L < NL; L++)
        if (kpk_extent_at(f.f, f.m.trunk_extent[L])->raw_len > whole) whole = kpk_extent_at(f.f, f.m.trunk_extent[L])->raw_len;
    if (streamable && f.m.globals[K3T_LM_HEAD].nbytes > whole) whole = f.m.globals[K3T_LM_HEAD].nbytes;
    close_file(&f);
    if (krun_model_load(path, &m, &e)) { printf("not ok - load %s: %s\n", path, e.msg); fails++; return; }
    if (plan_at(m, (uint64_t)1 << 40, -1, -1, 0, &top, &e)) { printf("not ok - a plan at 1 TiB: %s\n", e.msg); fails++; krun_model_close(m); return; }
    /* from the minimum to where every layer is pinned, in 24 steps */
    for (int k = 0; k <= 24; k++) {
        const uint64_t everything = top.total - (uint64_t)top.expert_slots * top.expert_slot_bytes +
                                    (uint64_t)top.expert_slots * top.expert_slot_bytes / 8;
        const uint64_t B = top.minimum + (everything > top.minimum ? (everything - top.minimum) / 24 * (uint64_t)k : 0);
        uint64_t next_piece;
        budgets++;
        if (plan_at(m, B, -1, -1, 0, &p, &e)) { printf("# budget %llu: %s\n", (unsigned long long)B, e.msg); bad++; continue; }
        /* lm_head held before anything is pinned: streaming it only when no plan holds it */
        if (p.head_streamed && plan_at(m, B, -1, 0, 0, &q, &e) == 0) {
            if (!bad++) printf("# budget %llu: lm_head streams, but a plan holding it fits (pin %d)\n", (unsigned long long)B, q.pin);
        }
        /* the longest pinned prefix for that choice of lm_head */
        if (p.pin < NL && plan_at(m, B, p.pin + 1, p.head_streamed, 0, &q, &e) == 0) {
            if (!bad++) printf("# budget %llu: %d layers pinned, but %d fit\n", (unsigned long long)B, p.pin, p.pin + 1);
        }
        /* the largest pieces for that prefix: the next larger piece size does not fit, or (--chunk
         * auto: both layouts share the ring) its prefill layout reads more for the prompt planned for */
        next_piece = p.piece_bytes * 2 < whole ? p.piece_bytes * 2 : whole;
        if (p.ring_slots && p.piece_bytes < whole && plan_at(m, B, p.pin, p.head_streamed, next_piece, &q, &e) == 0) {
            kprompt kp, kq;
            kmemplan_prompt(&p, p.prompt_ref, 0, &kp);
            kmemplan_prompt(&q, q.prompt_ref, 0, &kq);
            if (!p.block_prefill || kq.total_bytes <= kp.total_bytes) {
                if (!bad++) printf("# budget %llu: pieces of %llu, but pieces of %llu fit (a prompt of %zu reads %llu, not more than %llu)\n",
                                   (unsigned long long)B, (unsigned long long)p.piece_bytes, (unsigned long long)next_piece, p.prompt_ref,
                                   (unsigned long long)kq.total_bytes, (unsigned long long)kp.total_bytes);
            }
        }
        /* and what is left goes to the expert cache */
        if (p.total > B || (p.expert_slots < top.expert_slots && p.total + p.expert_slot_bytes <= B)) {
            if (!bad++) printf("# budget %llu: total %llu with %d expert slots of %llu\n", (unsigned long long)B, (unsigned long long)p.total,
                               p.expert_slots, (unsigned long long)p.expert_slot_bytes);
        }
    }
    OK(!bad, "%s: at %d budgets from the minimum up, lm_head is held before any layer is pinned, the pinned prefix is the longest "
       "that fits, the pieces the largest (or smaller where the prefill layout then reads fewer bytes), and the rest goes to the "
       "expert cache", path, budgets);
    krun_model_close(m);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: probe_plan ring|store|budget|prefer FILE.kpk [--mem SIZE] [--pin N] [--head hold|stream] "
                "[--piece SIZE] [--predict on] [--chunk auto|N] [--ctx N]\n");
        return 2;
    }
    if (!strcmp(argv[1], "ring")) check_ring(argv[2]);
    else if (!strcmp(argv[1], "store")) check_store(argv[2], argc, argv);
    else if (!strcmp(argv[1], "budget")) check_budget(argv[2]);
    else if (!strcmp(argv[1], "prefer")) check_prefer(argv[2]);
    else { fprintf(stderr, "probe_plan: unknown check %s\n", argv[1]); return 2; }
    return fails ? 1 : 0;
}

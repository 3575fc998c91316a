/* The memory planner: how krun splits a budget (--mem / --preset) between the
 * parts that hold model bytes and the parts that hold state.
 *
 *   resident globals   lm_head and the small global vectors (the embedding
 *                      is read a row at a time, never held)
 *   pinned trunk       a prefix of trunk layers kept resident (--pin)
 *   trunk ring         two slots, each as large as the largest streamed trunk
 *                      extent: one in use, one being read ahead
 *   expert cache       slots of one routed expert each (--expert-slots)
 *   state              per session (--max-seqs of them): KDA + ShortConv state,
 *                      the MLA latent cache (--ctx), tokens, logits, sampler
 *   run state          the widened small vectors of every layer (bound once),
 *                      the activations of one forward block (--chunk) and,
 *                      with --spec, the journal of a verification block
 *   base               the process itself: code, the KPK directory, the
 *                      tokenizer (computed from the file, so a plan is the
 *                      same on every run)
 *
 * Default rule, measured upstream on the real model: memory goes to the trunk
 * until it is fully pinned (a trunk layer is read on every token), then to the
 * expert cache (experts are only sampled, and the router spreads load flat). */
#ifndef KRUN_MEMPLAN_H
#define KRUN_MEMPLAN_H

#include "model.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

typedef struct kmemplan {
    uint64_t budget;
    const char *preset;            /* NULL unless --preset */
    uint64_t base;                 /* process overhead at planning time, with margin */
    uint64_t globals_resident;
    int n_layers;
    int pin;                       /* layers [0, pin) are resident */
    uint64_t pinned_bytes;
    int ring_slots;                /* 2, or 0 when every layer is pinned */
    uint64_t ring_slot_bytes;
    int expert_slots;
    uint64_t expert_slot_bytes;
    uint64_t state_bytes;          /* max_seqs x session_bytes */
    uint64_t session_bytes;        /* one session's slot for ctx positions */
    uint64_t vectors_bytes;        /* the bound vectors of every layer */
    uint64_t scratch_bytes;        /* activations of one block, and the --spec journal */
    size_t spec;                   /* drafts per verification block (--spec), 0: none */
    uint64_t spec_bytes;           /* the part of scratch_bytes that is the journal (run/journal.h) */
    uint64_t total;
    size_t ctx, chunk, max_seqs;
    size_t block;                  /* positions per forward block: max(chunk, max_seqs, spec + 1) */
    uint64_t sessions_fit;         /* sessions this budget could hold (with top-k expert slots) */
    /* what a decoding step must read at least */
    uint64_t trunk_stream_bytes;   /* every unpinned trunk extent, padded */
    uint64_t expert_reads_max;     /* MoE layers x top-k expert extents, padded */
    uint64_t minimum;              /* the smallest budget that works (pin 0, top-k slots) */
} kmemplan;

/* What the process needs besides the plan's parts: code and libraries,
 * thread stacks, allocator slack (a constant, checked under a cgroup limit by
 * the tests), plus the KPK directory and the tokenizer, computed from the file. */
#define KMEM_PROCESS_BYTES ((uint64_t)12 << 20)
uint64_t kmem_base_bytes(const k3_model *m);

/* Sizes like "8G", "512M", "300K", "1.5G" (binary units) -> bytes; -1 if malformed. */
int64_t kmem_parse_size(const char *s);
/* laptop, desktop, workstation, server, max -> bytes; -1 if unknown. */
int64_t kmem_preset(const char *name);

/* The globals extent is held from this byte on (the embedding before it is
 * read a row at a time); -1 if the embedding is not first in the extent. */
int64_t kmem_globals_first(const k3_model *m);

/* Plan for a budget.  pin / slots < 0: choose by the default rule.  Returns -1
 * with err saying what the minimum is when the budget cannot hold it.  The
 * state, vectors and scratch sizes come from the functions that lay those
 * buffers out (session.c, forward.c): what is planned is what is allocated. */
int kmemplan_make(const k3_model *m, uint64_t budget, int pin, int slots, size_t ctx, size_t chunk, size_t max_seqs,
                  size_t spec, uint64_t base, kmemplan *p, char *err, size_t errlen);
void kmemplan_print(const kmemplan *p, FILE *out);
json_t *kmemplan_json(const kmemplan *p);

/* Current resident set size of this process (VmRSS), and its peak (VmHWM). */
uint64_t kmem_rss(void);
/* MemAvailable of /proc/meminfo, 0 if unknown. */
uint64_t kmem_available(void);
uint64_t kmem_peak_rss(void);

#endif

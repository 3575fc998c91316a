/* What the store counts as the model runs, and what the public API reports
 * of it (session.h: krun_model_stats; krun --json, krun chat, /health): one
 * record in the lowest layer, so that the store fills it and the commands
 * read it without either seeing the other. */
#ifndef KRUN_STATS_H
#define KRUN_STATS_H

#include <stdint.h>

#define KRUN_MAX_MEMBERS 256       /* member files of a set whose reads are counted apart */

typedef struct krun_stats {
    uint64_t bytes_read;      /* all bytes read or faulted in for use */
    uint64_t bytes_trunk;     /* streamed trunk pieces */
    uint64_t bytes_head;      /* streamed lm_head pieces */
    uint64_t bytes_experts;   /* routed experts that missed the cache */
    uint64_t bytes_globals;   /* embedding rows */
    uint64_t bytes_resident;  /* held extents, read once */
    uint64_t expert_hits;     /* experts already resident when asked for */
    uint64_t expert_misses;
    uint64_t bytes_predicted; /* part of bytes_experts: read ahead on a prediction */
    uint64_t bytes_cancelled; /* predicted reads taken back unread when the router chose otherwise
                                 (already left out of bytes_experts and bytes_predicted) */
    uint64_t experts_predicted;      /* expert reads started on a prediction */
    uint64_t experts_predicted_used; /* ... of them, requested by the router afterwards */
    uint64_t bytes_router;    /* routers read early for the prediction (not in bytes_read) */
    uint64_t extents_verified;
    uint64_t phase_switches;  /* into the prefill layout (and, each, back: docs/RUNTIME.md §4) */
    uint64_t bytes_lent_reread; /* part of bytes_resident: lent layers read again after a prefill */
    uint64_t bytes_discarded; /* read ahead for one phase's sequence and dropped at a switch (not in bytes_read) */
    double io_wait_seconds;   /* compute blocked on reads */
    uint16_t n_members;
    uint64_t member_bytes[KRUN_MAX_MEMBERS]; /* read through the I/O queues, per member file */
    /* per member file, of its reads through the I/O queues: their bytes (member_bytes less the
     * synchronous reads: embedding rows, held extents read in place) and the seconds at least one
     * of them was in progress.  queued / busy is the speed the member's disk delivers while krun
     * waits on it; busy / elapsed its utilization (a compressed block crossing a stripe unit is
     * timed on the member that holds its first bytes) */
    uint64_t member_queued_bytes[KRUN_MAX_MEMBERS];
    double member_busy_seconds[KRUN_MAX_MEMBERS];
} krun_stats;

#endif

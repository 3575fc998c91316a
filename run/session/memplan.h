/* The memory planner: how krun splits a budget (--mem / --preset) between the
 * parts that hold model bytes and the parts that hold state.
 *
 *   held globals       the small global vectors, and lm_head unless it
 *                      streams (the embedding is read a row at a time,
 *                      never held)
 *   pinned trunk       a prefix of trunk layers kept resident (--pin)
 *   trunk ring         K slots of one piece each: the other trunk layers
 *                      (and lm_head when it streams) pass through them in
 *                      pieces, read ahead in the order a step uses them
 *                      (store_pieces.h); K is the fewest with which the
 *                      forward pass's order of use never waits on a slot
 *   expert cache       slots of one routed expert each (--expert-slots)
 *   I/O staging        compressed files only: each I/O worker's buffers for
 *                      the stored bytes of the blocks it decodes
 *   prediction         the largest router, read early to predict a layer's
 *                      experts (--predict; run/engine/predict.c)
 *   state              per session (--max-seqs of them): KDA + ShortConv state,
 *                      the MLA latent cache (--ctx), tokens, logits, sampler;
 *                      with the states paged to disk (--state-dir), the
 *                      tokens, logits and sampler per session, and a window
 *                      of 3 layers of every session's state (statepage.h)
 *   run state          the widened small vectors of every layer (bound once),
 *                      the activations of one forward block (--chunk) and,
 *                      with --spec, the journal of a verification block
 *   base               the process itself: code, the KPK directory, the
 *                      tokenizer (computed from the file, so a plan is the
 *                      same on every run)
 *
 * Default rule, measured upstream on the real model: memory goes to what is
 * read on every token first -- lm_head, then the trunk prefix, whole-extent
 * ring slots before pieces -- then to the expert cache (experts are only
 * sampled, and the router spreads load flat).  Streaming in pieces costs no
 * extra bytes per layer; holding lm_head and pinning save their bytes on
 * every token.
 *
 * Prompt blocks (--chunk auto, the default): that plan is the DECODING
 * layout, with blocks of KMEM_DECODE_BLOCK positions.  A prompt block of B
 * positions reads the unpinned trunk once and every expert its positions
 * chose once, so a large block reads far fewer bytes per prompt: the
 * planner adds a PREFILL layout of the same budget that lends the decoding
 * layout's memory to a large block's activations -- the expert slots above
 * top-k (a prefill block hardly hits the cache: it reads each of its
 * experts once anyway) and, when a larger block saves more bytes than they
 * cost, pinned trunk layers [pin_prefill, pin) -- through one FLEX region:
 * while decoding it holds the lent layers and slots, while a prefill block
 * runs it holds the block's activations.  The rest of the plan is the same
 * in both, so the total is the fixed part + the flex region at every moment.
 * Which layout a prompt runs in, and the pins lent, come from the cost model
 * (kmemplan_prompt): bytes read for a P-token prompt in blocks of B =
 *   ceil(P / B) x (unpinned trunk + streamed lm_head
 *                  + MoE layers x N (1 - (1 - k/N)^B) x expert bytes)
 *   + the lent layers read again when decoding resumes,
 * N (1 - (1 - k/N)^B) being the expected distinct experts a block of B
 * positions chooses of N, top-k each, under uniform routing (the release's
 * routing is balanced); cache hits are counted as none, unless the cache
 * holds every expert (then each is read once per prompt).  Both layouts
 * share the ring, so the planner tries every piece size for it: a smaller
 * piece than the decoding plan's wins when the prefill layout then reads
 * fewer bytes (the bytes a decoding step reads do not depend on the cut). */
#ifndef KRUN_MEMPLAN_H
#define KRUN_MEMPLAN_H

#include "run/util/krun_err.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

typedef struct k3_model k3_model;

#define KMEM_DECODE_BLOCK 64       /* --chunk auto: the decoding layout's block (short prompts, chat turns) */
#define KMEM_BLOCK_MAX 65536       /* --chunk auto: the prefill layout's block, at most */

typedef struct kmemplan {
    uint64_t budget;
    const char *preset;            /* NULL unless --preset */
    uint64_t base;                 /* process overhead at planning time, with margin */
    uint64_t globals_resident;     /* the held part of the globals */
    int head_streamed;             /* lm_head streams through the ring */
    int n_layers;
    int pin;                       /* layers [0, pin) are resident */
    uint64_t pinned_bytes;
    uint64_t piece_bytes;          /* the pieces' target size (0: nothing streams) */
    uint32_t ring_pieces;          /* pieces per step */
    int ring_slots;                /* K, or 0 when nothing streams */
    uint64_t ring_slot_bytes;      /* the largest piece's slot */
    int io_threads;                /* I/O workers (every member file's) */
    uint64_t io_worker_bytes;      /* each one's decode buffers (compressed files) */
    uint64_t io_bytes;             /* io_threads x io_worker_bytes */
    int expert_slots;
    uint64_t expert_slot_bytes;
    uint64_t state_bytes;          /* max_seqs x session_bytes (+ the window, paged) */
    uint64_t session_bytes;        /* one session's slot for ctx positions (paged: without its state) */
    /* the states paged to disk (--state-dir; run/engine/statepage.h) */
    int paged;
    uint64_t page_window_bytes;    /* the window of layers in RAM (k3_page_window_bytes): part of state_bytes */
    uint64_t page_file_bytes;      /* the state file's size */
    uint64_t page_read_bytes;      /* a decoding sweep of max_seqs sequences at position ctx - 1: state read, */
    uint64_t page_write_bytes;     /* and written (k3_page_sweep_bytes) */
    uint64_t sweep_bytes;          /* the weights such a sweep reads, by the union model (sweep_model.h) */
    uint64_t vectors_bytes;        /* the bound vectors of every layer */
    uint64_t scratch_bytes;        /* activations of one block, and the --spec journal */
    size_t spec;                   /* drafts per verification block (--spec), 0: none */
    uint64_t spec_bytes;           /* the part of scratch_bytes that is the journal (run/engine/journal.h) */
    uint64_t total;
    size_t ctx, chunk, max_seqs;
    size_t block;                  /* positions per forward block: max(chunk, max_seqs, spec + 1) */
    uint64_t sessions_fit;         /* sessions this budget could hold (with top-k expert slots) */
    /* what a decoding step must read at least */
    uint64_t trunk_stream_bytes;   /* every unpinned trunk layer's pieces */
    uint64_t head_stream_bytes;    /* lm_head's pieces, when it streams */
    uint64_t expert_reads_max;     /* MoE layers x top-k expert extents, padded (twice that with predict:
                                      the predicted reads and the misses they left) */
    int predict;                   /* experts read ahead on a prediction (krun --predict; run/engine/predict.c) */
    uint64_t predict_buf_bytes;    /* the largest router, read early for it */
    uint64_t predict_stage_bytes;  /* its stored bytes, when the trunk is compressed */
    uint64_t predict_bytes;        /* the two */
    uint64_t minimum;              /* the smallest budget that works (top-k slots, the best pieces) */
    /* --chunk auto: the prefill layout (block_prefill 0: none, one layout) */
    int chunk_auto;
    size_t block_prefill;          /* positions of a prefill block */
    int pin_prefill;               /* layers [0, pin_prefill) stay held during a prefill; [pin_prefill, pin) are lent */
    uint64_t pinned_prefill_bytes;
    int expert_slots_prefill;      /* slots [0, expert_slots_prefill) stay; the others are lent */
    uint32_t ring_pieces_prefill;  /* pieces per step of a prefill block (ring_pieces: while decoding) */
    uint64_t lent_bytes;           /* what the decoding layout keeps in the flex region (kstore_lent_bytes) */
    uint64_t scratch_prefill_bytes;/* a prefill block's activations (k3_run_scratch_bytes) */
    uint64_t flex_bytes;           /* the flex region: max(lent_bytes, scratch_prefill_bytes) */
    uint64_t trunk_stream_prefill_bytes; /* a prefill block's unpinned trunk */
    uint64_t switch_bytes;         /* the lent layers, read again when decoding resumes */
    size_t prompt_ref;             /* the prompt length the lent pins were chosen for (--prompt-tokens, or ctx) */
    /* the cost model's inputs */
    int moe_layers, n_experts, topk, max_slots;
    size_t taps;                   /* floats per position a drafter's taps keep in the scratch (0: none) */
    /* the EAGLE drafter (run/draft/draft.h), counted in base and state: what --plan says of it */
    char draft_path[1024];         /* "": none */
    uint64_t draft_bytes;          /* its weights and scratch (part of base) */
    uint64_t draft_weight_bytes;
    uint64_t draft_state_bytes;    /* per session (part of session_bytes) */
    double draft_accept;           /* the acceptance the choice assumed (per draft, given the ones before it) */
    size_t draft_width;            /* the width it predicts is cheapest at that acceptance */
    double draft_tokens_per_pass;  /* then: expected tokens per verification pass */
    uint64_t bytes_per_token;      /* predicted bytes per generated token, with the drafter when there is one */
    uint64_t bytes_per_token_nodraft; /* without (this budget's plan for no drafter), when a drafter was weighed */
    const char *draft_note;        /* why --draft auto left it out, or NULL */
} kmemplan;

/* What a prompt of n positions costs (kmemplan_prompt), in the layout the
 * cost model chooses for it. */
typedef struct kprompt {
    size_t positions, block, blocks;
    int prefill;                   /* 1: the prefill layout */
    double experts;                /* expected expert reads, every block and MoE layer */
    uint64_t trunk_bytes, head_bytes, expert_bytes, switch_bytes, total_bytes;
} kprompt;
/* The cheaper layout for n positions from the phase the model is in
 * (in_prefill: the switch back is owed already); the decoding layout when
 * n fits its block. */
void kmemplan_prompt(const kmemplan *p, size_t n, int in_prefill, kprompt *out);
/* The same for the layout given (prefill 0 or 1), whatever it costs. */
void kmemplan_prompt_in(const kmemplan *p, size_t n, int prefill, int in_prefill, kprompt *out);
/* "prompt of N tokens: ..." and the projected time at disk_mbps (0: none), one paragraph. */
void kmemplan_prompt_print(const kmemplan *p, size_t n, double disk_mbps, FILE *out);
json_t *kmemplan_prompt_json(const kmemplan *p, size_t n, double disk_mbps);

/* What the process needs besides the plan's parts: code and libraries,
 * thread stacks, allocator slack (a constant, checked under a cgroup limit by
 * the tests), plus the KPK directory and the tokenizer, computed from the file. */
#define KMEM_PROCESS_BYTES ((uint64_t)12 << 20)
uint64_t kmem_base_bytes(const k3_model *m);

/* laptop, desktop, workstation, server, max -> bytes; -1 if unknown. */
int64_t kmem_preset(const char *name);

/* What the caller fixes (-1 / 0: the planner chooses). */
typedef struct kmemplan_req {
    uint64_t budget;
    int pin, slots;                /* --pin, --expert-slots; -1: choose */
    int head;                      /* --head: 0 hold lm_head, 1 stream it; -1: choose */
    uint64_t piece;                /* --piece; 0: choose */
    size_t ctx, chunk, max_seqs;   /* chunk 0: auto (a decoding and a prefill layout) */
    size_t spec;                   /* --spec: drafts verified per block (0: none) */
    int io_threads;                /* 0: 8 */
    uint64_t base;                 /* kmem_base_bytes + the caller's own buffers */
    int predict;                   /* --predict: 1 on (the plan counts the prediction's buffers), 0 off,
                                      -1 auto: on for a split layout (kmemplan_split_layout) when the
                                      budget holds it, else off */
    uint64_t session_bytes;        /* one session's slot for ctx positions, as the session lays it out
                                      (krun_session_bytes): the state is max_seqs of them */
    size_t prompt_hint;            /* chunk auto: the prompt expected (krun knows it); 0: ctx */
    int paged;                     /* the states paged to disk: session_bytes is a slot without its state,
                                      and the plan counts the window */
    size_t taps;                   /* a drafter's taps: floats per position of a block's scratch (0: none) */
} kmemplan_req;

/* 1 when the trunk is stored in another member file than the experts (kpack
 * convert --trunk-to): the layout where reading guessed experts during the
 * trunk's compute pays (docs/PERFORMANCE.md, "The split layout"). */
int kmemplan_split_layout(const k3_model *m);

/* Plan for a budget.  Returns -1 with err (KRUN_EINPUT) saying what the
 * minimum is when the budget cannot hold it.  The state, vectors and scratch
 * sizes come from the functions that lay those buffers out (a session's slot:
 * the caller's q->session_bytes, from session.c; the run state: forward.c),
 * the ring's from the cut the store reads (store_pieces.c): what is planned
 * is what is allocated and read. */
int kmemplan_make(const k3_model *m, const kmemplan_req *q, kmemplan *p, krun_err *err);
void kmemplan_print(const kmemplan *p, FILE *out);
/* The part of a plan the store is handed (store.h): where each extent lives. */
struct kstore_layout;
void kmemplan_layout(const kmemplan *p, struct kstore_layout *out);
json_t *kmemplan_json(const kmemplan *p);

#endif

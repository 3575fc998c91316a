/* The union model (issue 21): what one forward sweep with B decoding sequences reads, from a plan.
 * A sweep reads the streamed trunk (and lm_head when it streams) once, whatever B, and the union
 * of the experts its sequences route to: with top-k of N experts per MoE layer, routed flat (the
 * router spreads load evenly: docs/PERFORMANCE.md), an expert is in the union with probability
 * 1 - (1 - k/N)^B, and the expert cache holds its share of them.  krun batch --max-seqs auto
 * chooses B by it; at full scale it gives the 105 + 1,447 x (1 - (1 - 16/896)^B) GB. */
#ifndef KRUN_SWEEP_MODEL_H
#define KRUN_SWEEP_MODEL_H

#include "format/k3_config.h"
#include "memplan.h"

#include <stddef.h>
#include <stdint.h>

/* Predicted bytes read by a decoding sweep of B sequences under plan p. */
double ksweep_bytes(const kmemplan *p, const k3_config *c, size_t B);

/* With the plan's EAGLE drafter (p->draft_path set; its acceptance p->draft_accept per draft): a
 * sweep of B sequences each verifying w drafts runs B (w + 1) rows and yields B times the expected
 * tokens of a pass (run/draft/draft.h); the w in 0..max_width (fixed > 0: that one) with the
 * fewest bytes per generated token, extra bytes (the states' paging) added to each sweep.  Its
 * width, tokens per sweep and bytes per sweep; returns bytes per generated token.  Without a
 * drafter: width 0, B tokens. */
double ksweep_draft(const kmemplan *p, const k3_config *c, size_t B, size_t max_width, size_t fixed, double extra, size_t *width,
                    double *tokens, double *bytes);

#endif

/* Stop strings (OpenAI's "stop"): text streams in, in any pieces; what comes
 * out is the same text cut just before the stop string that is complete
 * first (the earliest end; of those ending there, the longest), however the
 * text was cut into pieces.  A tail that could still become a stop string is held back until
 * the next piece decides it, so a streamed reply never shows the start of a
 * stop string it will not contain. */
#ifndef KRUN_STOPSTR_H
#define KRUN_STOPSTR_H

#include "jsontext.h"

#include <stddef.h>

typedef struct kstop {
    char *const *s;     /* the stop strings (borrowed; non-empty) */
    size_t n;
    kbuf hold;          /* text not yet passed on: a possible start of a stop string */
    int matched;
} kstop;

void kstop_init(kstop *k, char *const *s, size_t n);
/* Pass text through: what is certain to come before any stop string is
 * appended to out.  Returns 1 once a stop string is complete (out then ends
 * just before it and later calls pass nothing), else 0. */
int kstop_feed(kstop *k, const char *text, size_t len, kbuf *out);
/* The text ended without a stop string: pass on what was held back. */
void kstop_flush(kstop *k, kbuf *out);
void kstop_free(kstop *k);

#endif

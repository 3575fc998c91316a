/* Streaming decoded bytes as whole UTF-8 characters (utf8_hold.h). */
#include "utf8_hold.h"

#include "tokenizer.h"

#include <string.h>

int kutf8_hold_take(kutf8_hold *h, const uint8_t *b, size_t len, int flush, const char **out, size_t *n_out)
{
    /* what the last call handed out is gone; what it held back moves to the front */
    if (h->given) {
        memmove(h->b.p, h->b.p + h->given, h->b.n - h->given);
        h->b.n -= h->given;
        h->given = 0;
    }
    kbuf_add(&h->b, b, len);
    if (h->b.oom) {
        *out = NULL;
        *n_out = 0;
        return -1;
    }
    h->given = flush ? h->b.n : ktok_utf8_complete((const uint8_t *)h->b.p, h->b.n);
    *out = h->b.p;
    *n_out = h->given;
    return 0;
}

void kutf8_hold_reset(kutf8_hold *h)
{
    h->b.n = 0;
    h->given = 0;
}

void kutf8_hold_free(kutf8_hold *h)
{
    kbuf_free(&h->b);
    h->given = 0;
}

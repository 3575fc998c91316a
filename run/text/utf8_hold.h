/* Streaming decoded bytes as whole UTF-8 characters.  A token's bytes may
 * end inside a character (byte-level BPE), so a stream that writes tokens as
 * they come holds back an incomplete sequence at the end until its next
 * bytes come (ktok_utf8_complete), and passes everything on at the end.  One
 * writer for the three streams that need it: krun's stdout (cmd_generate.c),
 * krun chat's plain-text replies (cmd_chat.c) and the server's completions
 * (serve_gen.c). */
#ifndef KRUN_UTF8_HOLD_H
#define KRUN_UTF8_HOLD_H

#include "jsontext.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kutf8_hold {
    kbuf b;                    /* what is held back, then what the last call handed out */
    size_t given;              /* the bytes at the front of b handed out by the last call */
} kutf8_hold;

/* The bytes held back followed by b[0..len): *out is their longest prefix of
 * whole characters (with flush: all of them), *n_out its length, and the
 * rest is held back (at most 3 bytes of a valid prefix).  *out stays valid
 * until the next call.  -1 when memory runs out (nothing handed out). */
int kutf8_hold_take(kutf8_hold *h, const uint8_t *b, size_t len, int flush, const char **out, size_t *n_out);
/* Forget what is held back. */
void kutf8_hold_reset(kutf8_hold *h);
void kutf8_hold_free(kutf8_hold *h);

#endif

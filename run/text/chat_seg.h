/* Internal to chat_render.c and chat_parse.c: building a rendering segment by segment (markers as
 * special ids, everything else encoded with special-token recognition off) into ids and text. */
#ifndef KRUN_CHAT_SEG_H
#define KRUN_CHAT_SEG_H
#include "chat.h"
#include "jsontext.h"

enum { MK_OPEN, MK_CLOSE, MK_SEP, MK_EOM, MK_COUNT };
extern const char *const kchat_marker_text[MK_COUNT];

typedef struct {
    const ktok *tk;          /* NULL: text only */
    int32_t mk[MK_COUNT];    /* the markers' ids */
    int32_t *ids;
    size_t n, cap;
    kbuf text;
    int fail;                /* allocation or tokenizer failure */
} kseg;

/* The markers' ids from tk (NULL: nothing to look up).  Returns 0, or -1 with a message. */
int  kseg_markers(const ktok *tk, int32_t mk[MK_COUNT], krun_err *err);
void kseg_marker(kseg *r, int which);
void kseg_text(kseg *r, const char *s, size_t n);
/* open(tag, attrs): attrs is key, value pairs ending with NULL (NULL: none).  One segment. */
void kseg_open(kseg *r, const char *tag, const char *const *attrs);
void kseg_close(kseg *r, const char *tag);
void kseg_free(kseg *r);

#endif

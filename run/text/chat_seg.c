/* Segment-by-segment rendering shared by the chat renderer and the reply parser (chat_seg.h). */
#include "chat_seg.h"

#include "run/util/krun_err.h"

#include <stdlib.h>
#include <string.h>

const char *const kchat_marker_text[MK_COUNT] = {KCHAT_OPEN, KCHAT_CLOSE, KCHAT_SEP, KCHAT_END_OF_MSG};

int kseg_markers(const ktok *tk, int32_t mk[MK_COUNT], krun_err *err)
{
    for (int k = 0; k < MK_COUNT; k++) {
        mk[k] = tk ? ktok_find_special(tk, kchat_marker_text[k]) : -1;
        if (tk && mk[k] < 0) {
            krun_err_set(err, KRUN_EINPUT, "the tokenizer has no %s special token: not a Kimi K3 tokenizer", kchat_marker_text[k]);
            return -1;
        }
    }
    return 0;
}

static void push_ids(kseg *r, const int32_t *ids, size_t n)
{
    if (r->fail || !n) return;
    if (r->n + n > r->cap) {
        size_t c = r->cap ? r->cap : 256;
        while (c < r->n + n) c *= 2;
        int32_t *p = realloc(r->ids, c * sizeof *p);
        if (!p) { r->fail = 1; return; }
        r->ids = p;
        r->cap = c;
    }
    memcpy(r->ids + r->n, ids, n * sizeof *ids);
    r->n += n;
}

void kseg_marker(kseg *r, int which)
{
    if (r->tk) push_ids(r, &r->mk[which], 1);
    kbuf_puts(&r->text, kchat_marker_text[which]);
}

void kseg_text(kseg *r, const char *s, size_t n)
{
    if (!n || r->fail) return;
    if (r->tk) {
        int32_t *ids;
        size_t k;
        if (ktok_encode(r->tk, s, n, 0, &ids, &k)) { r->fail = 1; return; }
        push_ids(r, ids, k);
        free(ids);
    }
    kbuf_add(&r->text, s, n);
}

/* Attribute values: & first, then " (spec §1). */
static void escape_attr(kbuf *b, const char *v)
{
    for (; *v; v++) {
        if (*v == '&') kbuf_puts(b, "&amp;");
        else if (*v == '"') kbuf_puts(b, "&quot;");
        else kbuf_add(b, v, 1);
    }
}

void kseg_open(kseg *r, const char *tag, const char *const *attrs)
{
    kbuf h = {0};
    kbuf_puts(&h, tag);
    for (size_t i = 0; attrs && attrs[i]; i += 2) {
        kbuf_puts(&h, " ");
        kbuf_puts(&h, attrs[i]);
        kbuf_puts(&h, "=\"");
        escape_attr(&h, attrs[i + 1]);
        kbuf_puts(&h, "\"");
    }
    if (h.oom) r->fail = 1;
    kseg_marker(r, MK_OPEN);
    kseg_text(r, h.p, h.n);
    kseg_marker(r, MK_SEP);
    kbuf_free(&h);
}

void kseg_close(kseg *r, const char *tag)
{
    kseg_marker(r, MK_CLOSE);
    kseg_text(r, tag, strlen(tag));
    kseg_marker(r, MK_SEP);
}

void kseg_free(kseg *r)
{
    free(r->ids);
    kbuf_free(&r->text);
    memset(r, 0, sizeof *r);
}

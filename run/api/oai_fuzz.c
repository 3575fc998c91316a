/* oai_fuzz_one: every parser of the OpenAI and chat layers on one input (see oai.h). */
#include "oai.h"

#include "run/grammar/chat_constrain.h"

#include <stdlib.h>
#include <string.h>

static int check_error(const oai_error *e)
{
    char *j = oai_error_json(e);
    int bad = !e->status || !e->message[0] || !j;
    free(j);
    return bad;
}

static int chunk_event(void *ctx, const kchat_event *ev)
{
    static const oai_meta m = {"chatcmpl-fuzz", "fuzz", 0};
    int none;
    char *s = oai_sse_chat_event(&m, ev, "call_fuzz", &none);
    if (!s && !none) ++*(int *)ctx;
    free(s);
    return 0;
}

int oai_fuzz_one(const uint8_t *data, size_t n)
{
    const char *body = (const char *)data;
    int bad = 0;
    oai_error e;
    oai_chat_request cr;
    if (oai_parse_chat_request(body, n, &cr, &e) == 0) {
        kchat_rendering r;
        krun_err err;
        err.msg[0] = 0;
        kgram *g;
        char param[256], msg[512];
        if (kchat_render(NULL, cr.messages, cr.n_messages, &cr.chat, &r, &err) == 0) kchat_rendering_free(&r);
        else bad += !err.msg[0];
        /* the constraint of response_format, a named tool or strict tools: compiled, or refused with a message */
        if (kchat_constraint(&cr.chat, &g, param, sizeof param, msg, sizeof msg) == 0) kgram_free(g);
        else bad += !msg[0];
        oai_chat_request_free(&cr);
    } else {
        bad += check_error(&e);
    }
    oai_completion_request pr;
    if (oai_parse_completion_request(body, n, 163840, &pr, &e) == 0) oai_completion_request_free(&pr);
    else bad += check_error(&e);
    for (int thinking = 0; thinking <= 1; thinking++) {
        kchat_parser *p = kchat_parser_new(NULL, thinking);
        if (!p) return bad + 1;
        /* in two uneven pieces, so that markers split across feeds are exercised */
        size_t half = n / 3;
        if (kchat_parser_feed_text(p, body, half, chunk_event, &bad) == 0)
            kchat_parser_feed_text(p, body + half, n - half, chunk_event, &bad);
        kchat_parser_finish(p, chunk_event, &bad);
        kchat_parser_free(p);
    }
    return bad;
}

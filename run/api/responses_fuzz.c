/* oresp_fuzz_one: the Responses request parser and the output transcoding on one input (see
 * responses.h). */
#include "responses.h"

#include "run/grammar/chat_constrain.h"

#include <stdlib.h>
#include <string.h>

/* A previous conversation for any id: the body's own input items. */
static json_t *lookup(void *ctx, const char *id)
{
    json_t *in = json_object_get((json_t *)ctx, "input");
    (void)id;
    return json_is_array(in) ? json_incref(in) : NULL;
}

int oresp_fuzz_one(const uint8_t *data, size_t n)
{
    static const oai_meta m = {"resp_fuzz", "fuzz", 0};
    const char *body = (const char *)data;
    json_t *prior = json_loadb(body, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    int bad = 0;
    for (int with_prior = 0; with_prior <= 1; with_prior++) {
        oresp_request r;
        oai_error e;
        memset(&e, 0, sizeof e);
        if (oresp_parse_request(body, n, with_prior ? lookup : NULL, prior, &r, &e) == 0) {
            kchat_rendering rd;
            krun_err err;
            kgram *g;
            char param[256], msg[512];
            json_t *resp;
            err.msg[0] = 0;
            bad += !r.echo || !json_is_array(r.input) || !r.n_messages;
            if (kchat_render(NULL, r.messages, r.n_messages, &r.chat, &rd, &err) == 0) kchat_rendering_free(&rd);
            else bad += !err.msg[0];
            if (kchat_constraint(&r.chat, &g, param, sizeof param, msg, sizeof msg) == 0) kgram_free(g);
            else bad += !msg[0];
            /* the body as a chat completion: a response object, or NULL for what is none */
            resp = oresp_from_chat(&m, r.echo, body, n, r.encrypted_reasoning);
            json_decref(resp);
            oresp_request_free(&r);
        } else {
            char *j = oai_error_json(&e);
            bad += !e.status || !e.message[0] || !j;
            free(j);
        }
    }
    {
        /* the bytes as a chat stream, in two uneven pieces */
        json_t *echo = json_object();
        oresp_stream *s = echo ? oresp_stream_new(&m, echo, 1) : NULL;
        kbuf out = {0};
        size_t third = n / 3;
        if (s) {
            if (oresp_stream_feed(s, body, third, &out) >= 0) oresp_stream_feed(s, body + third, n - third, &out);
            /* [DONE] always ends it (completed, incomplete, or failed after an error event) */
            bad += oresp_stream_feed(s, "\n\ndata: [DONE]\n\n", 16, &out) == 0;
        }
        oresp_stream_free(s);
        json_decref(echo);
        kbuf_free(&out);
    }
    json_decref(prior);
    return bad;
}

/* ollama_fuzz_one: the Ollama parsers and output converters on one input (see ollama.h). */
#include "ollama.h"

#include "run/grammar/chat_constrain.h"

#include <stdlib.h>
#include <string.h>

static int check(ollama_request *r, int rc, const oai_error *e)
{
    int bad = 0;
    if (rc == 0) {
        kchat_rendering rd;
        krun_err err;
        kgram *g;
        char param[256], msg[512];
        err.msg[0] = 0;
        if (r->messages) {
            if (kchat_render(NULL, r->messages, r->n_messages, &r->chat, &rd, &err) == 0) kchat_rendering_free(&rd);
            else bad += !err.msg[0];
            if (kchat_constraint(&r->chat, &g, param, sizeof param, msg, sizeof msg) == 0) kgram_free(g);
            else bad += !msg[0];
        } else {
            bad += !r->raw || !r->prompt;
        }
        bad += !r->s.model;
        ollama_request_free(r);
    } else {
        char *j = ollama_error_json(e);
        bad += !e->status || !e->message[0] || !j;
        free(j);
    }
    return bad;
}

int ollama_fuzz_one(const uint8_t *data, size_t n)
{
    const char *body = (const char *)data;
    ollama_meta m = {"fuzz", 1700000000.0, 5.0};
    ollama_request r;
    oai_error e;
    int bad = 0;
    memset(&e, 0, sizeof e);
    bad += check(&r, ollama_parse_chat(body, n, &r, &e), &e);
    memset(&e, 0, sizeof e);
    bad += check(&r, ollama_parse_generate(body, n, &r, &e), &e);
    for (int gen = 0; gen <= 1; gen++) {
        char *o = ollama_from_completion(&m, gen, body, n, 6.0);
        ollama_stream *s = ollama_stream_new(&m, gen);
        kbuf out = {0};
        size_t third = n / 3;
        free(o);
        if (s && ollama_stream_feed(s, body, third, 6.0, &out) >= 0 && ollama_stream_feed(s, body + third, n - third, 6.5, &out) >= 0)
            bad += ollama_stream_feed(s, "\n\ndata: [DONE]\n\n", 16, 7.0, &out) == 0;      /* [DONE] always ends it */
        /* every line out is one JSON object */
        for (size_t i = 0, st = 0; !out.oom && i < out.n; i++)
            if (out.p[i] == '\n') {
                json_t *j = json_loadb(out.p + st, i - st, 0, NULL);
                bad += !json_is_object(j);
                json_decref(j);
                st = i + 1;
            }
        ollama_stream_free(s);
        kbuf_free(&out);
    }
    return bad;
}

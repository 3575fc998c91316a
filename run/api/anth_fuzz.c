/* anth_fuzz_one: the Anthropic request parser and what follows it on one input (see anth.h). */
#include "anth.h"

#include "run/grammar/chat_constrain.h"

#include <stdlib.h>
#include <string.h>

int anth_fuzz_one(const uint8_t *data, size_t n)
{
    int bad = 0;
    for (int count = 0; count <= 1; count++) {
        anth_request r;
        oai_error e;
        memset(&e, 0, sizeof e);
        if (anth_parse_request((const char *)data, n, count, &r, &e) == 0) {
            kchat_rendering rd;
            krun_err err;
            kgram *g;
            char param[256], msg[512];
            err.msg[0] = 0;
            if (kchat_render(NULL, r.messages, r.n_messages, &r.chat, &rd, &err) == 0) kchat_rendering_free(&rd);
            else bad += !err.msg[0];
            if (kchat_constraint(&r.chat, &g, param, sizeof param, msg, sizeof msg) == 0) kgram_free(g);
            else bad += !msg[0];
            anth_request_free(&r);
        } else {
            char *j = anth_error_json(&e), *s = anth_sse_error(&e);
            bad += !e.status || !e.message[0] || !j || !s;
            free(j);
            free(s);
        }
    }
    return bad;
}

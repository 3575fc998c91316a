/* The Anthropic Messages request parser (run/api/anth_request.c) on arbitrary bytes, as bodies of
 * /v1/messages and /v1/messages/count_tokens.  anth_fuzz_one (the parser, the renderer, the
 * constraint, the error objects) must find nothing; and beyond it:
 *  - what the parser accepts is within anth.h's ranges: a model, max_tokens 1 .. 2^31-1 (none for
 *    count_tokens), temperature, top_p in [0, 1], top_k >= 0, at most 16 stop sequences, none empty;
 *    messages of known roles, ending with a user or tool message, tool results with a call id,
 *    assistant calls with a name and arguments that are a JSON object; thinking on only with a
 *    budget of at least 1024, under max_tokens; tools an OpenAI tools array; tool_choice named
 *    only for a declared tool, "any" only with tools;
 *  - a refusal is a 4xx (500 only for "out of memory") whose message begins with the field it
 *    names, and its error object is {"type": "error", "error": {"type", "message"}};
 *  - parsing is deterministic: the same body twice gives the same result. */
#include "fuzz.h"

#include "run/api/anth.h"
#include "run/text/jsontext.h"

#include <jansson.h>
#include <string.h>
#include <xxhash.h>

static void d_bytes(XXH3_state_t *h, const void *p, size_t n) { XXH3_64bits_update(h, &n, sizeof n); if (n) XXH3_64bits_update(h, p, n); }
static void d_str(XXH3_state_t *h, const char *s) { if (s) d_bytes(h, s, strlen(s)); else d_bytes(h, "\xff", 1); }
#define D(h, x) XXH3_64bits_update((h), &(x), sizeof(x))

static uint64_t parse(const char *body, size_t len, int count, int *ok)
{
    anth_request r;
    oai_error e;
    XXH3_state_t *h = XXH3_createState();
    uint64_t d;
    FUZZ_CHECK(h != NULL);
    XXH3_64bits_reset(h);
    memset(&e, 0, sizeof e);
    if (anth_parse_request(body, len, count, &r, &e)) {
        char *j = anth_error_json(&e);
        json_t *o = j ? json_loads(j, 0, NULL) : NULL, *x = json_object_get(o, "error");
        FUZZ_CHECK(r.messages == NULL && r.own == NULL);
        FUZZ_CHECK((e.status >= 400 && e.status < 500) || (e.status == 500 && strstr(e.message, "out of memory")));
        FUZZ_CHECK(e.message[0] && (e.status == 500 || !e.param[0] || !strncmp(e.message, e.param, strlen(e.param))));
        /* the message as the error object shows it: ill-formed UTF-8 (a body's bad bytes quoted by
         * the JSON parser, a message cut inside a character) as U+FFFD */
        kbuf shown = {0};
        kutf8_sanitize(e.message, strlen(e.message), &shown);
        kbuf_add(&shown, "", 1);
        FUZZ_CHECK(!shown.oom);
        FUZZ_CHECK(json_is_object(o) && !strcmp(json_string_value(json_object_get(o, "type")), "error") && json_is_string(json_object_get(x, "type")) &&
                   !strcmp(json_string_value(json_object_get(x, "message")), shown.p));
        kbuf_free(&shown);
        json_decref(o);
        free(j);
        D(h, e.status);
        d_str(h, e.message);
        d_str(h, e.param);
        *ok = 0;
    } else {
        const oai_sampling *s = &r.s;
        FUZZ_CHECK(r.n_messages >= 1 && r.messages && r.own);
        FUZZ_CHECK(s->model && (count ? s->max_tokens == -1 : s->max_tokens >= 1 && s->max_tokens <= 0x7fffffffL));
        FUZZ_CHECK(s->temperature >= 0 && s->temperature <= 1 && s->top_p >= 0 && s->top_p <= 1 && s->top_k >= 0);
        FUZZ_CHECK(s->n_stop <= 16);
        for (size_t i = 0; i < s->n_stop; i++) FUZZ_CHECK(s->stop[i] && s->stop[i][0]);
        FUZZ_CHECK(r.messages[r.n_messages - 1].role == KCHAT_USER || r.messages[r.n_messages - 1].role == KCHAT_TOOL);
        for (size_t i = 0; i < r.n_messages; i++) {
            const kchat_message *m = &r.messages[i];
            FUZZ_CHECK(m->role >= KCHAT_SYSTEM && m->role <= KCHAT_TOOL);
            FUZZ_CHECK(m->role != KCHAT_TOOL || m->tool_call_id);
            FUZZ_CHECK(m->role != KCHAT_SYSTEM || i == 0);
            for (size_t k = 0; k < m->n_tool_calls; k++) {
                json_t *a = json_loads(m->tool_calls[k].arguments, JSON_ALLOW_NUL, NULL);
                FUZZ_CHECK(m->role == KCHAT_ASSISTANT && m->tool_calls[k].name[0] && m->tool_calls[k].id && json_is_object(a));
                json_decref(a);
                d_str(h, m->tool_calls[k].arguments);
            }
            D(h, m->role);
            d_bytes(h, m->content ? m->content : "", m->content_len);
            d_bytes(h, m->reasoning ? m->reasoning : "", m->reasoning_len);
            d_str(h, m->tool_call_id);
        }
        FUZZ_CHECK(!r.chat.thinking || (r.budget_tokens >= 1024 && (count || r.budget_tokens < s->max_tokens)));
        if (r.chat.tools_json) {
            json_t *t = json_loads(r.chat.tools_json, JSON_ALLOW_NUL, NULL);
            FUZZ_CHECK(json_is_array(t) && json_array_size(t) > 0);
            json_decref(t);
        }
        FUZZ_CHECK(r.chat.tool_choice != KCHAT_TOOL_CHOICE_NAMED || (r.chat.tools_json && strstr(r.chat.tools_json, r.chat.tool_name)));
        FUZZ_CHECK(r.chat.tool_choice != KCHAT_TOOL_CHOICE_REQUIRED || r.chat.tools_json);
        D(h, r.chat.thinking); D(h, r.chat.effort); D(h, r.chat.tool_choice); D(h, s->max_tokens); D(h, s->temperature);
        D(h, s->top_p); D(h, s->top_k); D(h, s->stream); D(h, s->n_stop);
        d_str(h, r.chat.tools_json);
        d_str(h, s->model);
        anth_request_free(&r);
        FUZZ_CHECK(r.messages == NULL && r.own == NULL);
        *ok = 1;
    }
    d = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    return d;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int any = 0;
    FUZZ_CHECK(anth_fuzz_one(data, size) == 0);
    for (int count = 0; count <= 1; count++) {
        int ok1, ok2;
        uint64_t a = parse((const char *)data, size, count, &ok1), b = parse((const char *)data, size, count, &ok2);
        FUZZ_CHECK(a == b && ok1 == ok2);
        any |= ok1;
    }
    if (any) fuzz_accepted++;
    return 0;
}

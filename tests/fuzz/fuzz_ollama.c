/* Ollama's API (run/api/ollama_request.c, ollama_output.c) on arbitrary bytes: as an /api/chat and an
 * /api/generate body, and as the completion and the stream the output is made from.  ollama_fuzz_one
 * (both parsers, the renderer, the constraint, the converters; every NDJSON line an object) must find
 * nothing; and beyond it:
 *  - what a parser accepts has a model, temperature [0, 2], top_p and min_p [0, 1], top_k >= 0,
 *    num_predict absent or >= 1, at most 16 stop strings none empty, stream on unless said off; a chat
 *    has messages of known roles, tool calls with a name and arguments that are a JSON object;
 *    generate has a prompt, and messages unless raw;
 *  - a refusal is a 4xx (500 only for "out of memory"), its error object {"error": MESSAGE};
 *  - parsing is deterministic. */
#include "fuzz.h"

#include "run/api/ollama.h"

#include <jansson.h>
#include <string.h>
#include <xxhash.h>

static uint64_t parse(const char *body, size_t n, int generate, int *ok)
{
    ollama_request r;
    oai_error e;
    XXH3_state_t *h = XXH3_createState();
    uint64_t d;
    FUZZ_CHECK(h != NULL);
    XXH3_64bits_reset(h);
    memset(&e, 0, sizeof e);
    *ok = 0;
    if ((generate ? ollama_parse_generate : ollama_parse_chat)(body, n, &r, &e)) {
        char *j = ollama_error_json(&e);
        json_t *o = j ? json_loads(j, 0, NULL) : NULL;
        FUZZ_CHECK(r.messages == NULL && r.own == NULL);
        FUZZ_CHECK((e.status >= 400 && e.status < 500) || (e.status == 500 && strstr(e.message, "out of memory")));
        FUZZ_CHECK(e.message[0] && json_is_string(json_object_get(o, "error")) && json_object_size(o) == 1);
        json_decref(o);
        free(j);
        XXH3_64bits_update(h, &e.status, sizeof e.status);
        XXH3_64bits_update(h, e.message, strlen(e.message));
    } else {
        const oai_sampling *s = &r.s;
        FUZZ_CHECK(s->model && s->temperature >= 0 && s->temperature <= 2 && s->top_p >= 0 && s->top_p <= 1 && s->min_p >= 0 && s->min_p <= 1);
        FUZZ_CHECK(s->top_k >= 0 && (s->max_tokens == -1 || s->max_tokens >= 1) && s->n_stop <= 16 && s->include_usage == 1);
        for (size_t i = 0; i < s->n_stop; i++) FUZZ_CHECK(s->stop[i] && s->stop[i][0]);
        FUZZ_CHECK(generate ? r.prompt && r.prompt_len && (r.raw || r.n_messages >= 1) : r.n_messages >= 1 && !r.raw);
        for (size_t i = 0; i < r.n_messages; i++) {
            const kchat_message *m = &r.messages[i];
            FUZZ_CHECK(m->role >= KCHAT_SYSTEM && m->role <= KCHAT_TOOL);
            for (size_t k = 0; k < m->n_tool_calls; k++) {
                json_t *a = json_loads(m->tool_calls[k].arguments, JSON_ALLOW_NUL, NULL);
                FUZZ_CHECK(m->role == KCHAT_ASSISTANT && m->tool_calls[k].name[0] && json_is_object(a));
                json_decref(a);
            }
            XXH3_64bits_update(h, &m->role, sizeof m->role);
            if (m->content_len) XXH3_64bits_update(h, m->content, m->content_len);
        }
        XXH3_64bits_update(h, &s->max_tokens, sizeof s->max_tokens);
        XXH3_64bits_update(h, &s->temperature, sizeof s->temperature);
        XXH3_64bits_update(h, &r.chat.thinking, sizeof r.chat.thinking);
        XXH3_64bits_update(h, &r.chat.format, sizeof r.chat.format);
        if (r.prompt_len) XXH3_64bits_update(h, r.prompt, r.prompt_len);
        ollama_request_free(&r);
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
    FUZZ_CHECK(ollama_fuzz_one(data, size) == 0);
    for (int generate = 0; generate <= 1; generate++) {
        int ok1, ok2;
        uint64_t a = parse((const char *)data, size, generate, &ok1), b = parse((const char *)data, size, generate, &ok2);
        FUZZ_CHECK(a == b && ok1 == ok2);
        any |= ok1;
    }
    if (any) fuzz_accepted++;
    return 0;
}

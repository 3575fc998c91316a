/* The Responses API (run/api/responses_request.c, responses_output.c) on arbitrary bytes: as a
 * /v1/responses body (with and without a previous conversation: the body's input items again), and
 * as the chat completion and the chat stream the output is made from.  oresp_fuzz_one (the parser,
 * the renderer, the constraint, the converters) must find nothing; and beyond it:
 *  - what the parser accepts is within responses.h's ranges: a conversation of known roles, assistant
 *    calls with a call id, a name and arguments, tool results with a call id; temperature [0, 2], top_p
 *    [0, 1], max_output_tokens absent or 1 .. 2^31-1; tools an OpenAI chat tools array when given;
 *    tool_choice named only for a declared function; the echo an object with the settings a response
 *    shows, the input an array;
 *  - a refusal is a 4xx (404 only for previous_response_id; 500 only for "out of memory") whose
 *    error object is JSON;
 *  - parsing is deterministic: the same body twice gives the same result;
 *  - the event stream made from any chat stream is SSE blocks "event: T\ndata: {...}" whose type is
 *    T and whose sequence numbers count from 0, beginning with response.created (or a comment).
 * Accepted: a body parsed, or a chat stream that made a response with items. */
#include "fuzz.h"

#include "run/api/responses.h"

#include <jansson.h>
#include <string.h>
#include <xxhash.h>

/* The previous conversation of any id: the body's own input items (a real one's are items too). */
static json_t *prior_of(void *ctx, const char *id)
{
    json_t *in = json_object_get((json_t *)ctx, "input");
    (void)id;
    return json_is_array(in) ? json_incref(in) : NULL;
}

static uint64_t parse(const char *body, size_t n, json_t *prior, int *ok)
{
    oresp_request r;
    oai_error e;
    XXH3_state_t *h = XXH3_createState();
    uint64_t d;
    FUZZ_CHECK(h != NULL);
    XXH3_64bits_reset(h);
    memset(&e, 0, sizeof e);
    *ok = 0;
    if (oresp_parse_request(body, n, prior_of, prior, &r, &e)) {
        char *j = oai_error_json(&e);
        json_t *o = j ? json_loads(j, 0, NULL) : NULL;
        FUZZ_CHECK(r.messages == NULL && r.own == NULL && r.echo == NULL);
        FUZZ_CHECK((e.status >= 400 && e.status < 500) || (e.status == 500 && strstr(e.message, "out of memory")));
        FUZZ_CHECK(e.status != 404 || !strcmp(e.param, "previous_response_id"));
        FUZZ_CHECK(e.message[0] && json_is_object(json_object_get(o, "error")));
        json_decref(o);
        free(j);
        XXH3_64bits_update(h, &e.status, sizeof e.status);
        XXH3_64bits_update(h, e.message, strlen(e.message));
        XXH3_64bits_update(h, e.param, strlen(e.param));
    } else {
        char *echo = json_dumps(r.echo, JSON_COMPACT), *in = json_dumps(r.input, JSON_COMPACT);
        FUZZ_CHECK(r.n_messages >= 1 && r.messages && echo && in && json_is_array(r.input));
        FUZZ_CHECK(json_object_get(r.echo, "tools") && json_object_get(r.echo, "tool_choice") && json_object_get(r.echo, "text") &&
                   json_object_get(r.echo, "reasoning") && json_object_get(r.echo, "store"));
        FUZZ_CHECK(r.s.temperature >= 0 && r.s.temperature <= 2 && r.s.top_p >= 0 && r.s.top_p <= 1);
        FUZZ_CHECK(r.s.max_tokens == -1 || (r.s.max_tokens >= 1 && r.s.max_tokens <= 0x7fffffffL));
        FUZZ_CHECK(r.s.include_usage == 1 && r.s.n == 1);
        for (size_t i = 0; i < r.n_messages; i++) {
            const kchat_message *m = &r.messages[i];
            FUZZ_CHECK(m->role >= KCHAT_SYSTEM && m->role <= KCHAT_TOOL);
            FUZZ_CHECK(m->role != KCHAT_TOOL || m->tool_call_id);
            for (size_t k = 0; k < m->n_tool_calls; k++)
                FUZZ_CHECK(m->role == KCHAT_ASSISTANT && m->tool_calls[k].id && m->tool_calls[k].name && m->tool_calls[k].arguments);
            XXH3_64bits_update(h, &m->role, sizeof m->role);
            if (m->content_len) XXH3_64bits_update(h, m->content, m->content_len);
            if (m->reasoning_len) XXH3_64bits_update(h, m->reasoning, m->reasoning_len);
        }
        if (r.chat.tools_json) {
            json_t *t = json_loads(r.chat.tools_json, JSON_ALLOW_NUL, NULL);
            FUZZ_CHECK(json_is_array(t) && json_array_size(t) > 0);
            json_decref(t);
        }
        FUZZ_CHECK(r.chat.tool_choice != KCHAT_TOOL_CHOICE_NAMED || (r.chat.tools_json && strstr(r.chat.tools_json, r.chat.tool_name)));
        XXH3_64bits_update(h, echo, strlen(echo));
        XXH3_64bits_update(h, in, strlen(in));
        XXH3_64bits_update(h, &r.chat.thinking, sizeof r.chat.thinking);
        XXH3_64bits_update(h, &r.chat.effort, sizeof r.chat.effort);
        free(echo);
        free(in);
        oresp_request_free(&r);
        FUZZ_CHECK(r.messages == NULL && r.own == NULL && r.echo == NULL);
        *ok = 1;
    }
    d = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    return d;
}

/* The events made from the bytes as a chat stream. */
FUZZ_HARNESS_LOOP static int stream(const char *p, size_t n)
{
    static const oai_meta m = {"resp_fuzz", "fuzz", 0};
    json_t *echo = json_object();
    oresp_stream *s = oresp_stream_new(&m, echo, 0);
    kbuf out = {0};
    long seq = 0;
    FUZZ_CHECK(s != NULL);
    oresp_stream_feed(s, p, n, &out);
    FUZZ_CHECK(oresp_stream_feed(s, "\n\ndata: [DONE]\n\n", 16, &out) == 1 || out.oom);
    for (size_t i = 0; !out.oom && i < out.n;) {
        char *end = memmem(out.p + i, out.n - i, "\n\n", 2), *nl;
        json_t *d;
        FUZZ_CHECK(end != NULL);
        if (out.p[i] == ':') { i = (size_t)(end - out.p) + 2; continue; }      /* a progress comment passed on */
        FUZZ_CHECK(!strncmp(out.p + i, "event: ", 7));
        nl = memchr(out.p + i, '\n', (size_t)(end - out.p) - i);
        FUZZ_CHECK(nl && !strncmp(nl + 1, "data: ", 6));
        d = json_loadb(nl + 7, (size_t)(end - nl - 7), 0, NULL);
        FUZZ_CHECK(json_is_object(d) && json_integer_value(json_object_get(d, "sequence_number")) == seq);
        FUZZ_CHECK(json_string_length(json_object_get(d, "type")) == (size_t)(nl - out.p - (long)i - 7) &&
                   !memcmp(json_string_value(json_object_get(d, "type")), out.p + i + 7, (size_t)(nl - out.p - (long)i - 7)));
        FUZZ_CHECK(seq || !strcmp(json_string_value(json_object_get(d, "type")), "response.created"));
        json_decref(d);
        seq++;
        i = (size_t)(end - out.p) + 2;
    }
    {
        int done = oresp_stream_response(s) != NULL && seq > 2;
        oresp_stream_free(s);
        json_decref(echo);
        kbuf_free(&out);
        return done;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *prior = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    int any = 0;
    FUZZ_CHECK(oresp_fuzz_one(data, size) == 0);
    for (int with = 0; with <= 1; with++) {
        int ok1, ok2;
        uint64_t a = parse((const char *)data, size, with ? prior : NULL, &ok1), b = parse((const char *)data, size, with ? prior : NULL, &ok2);
        FUZZ_CHECK(a == b && ok1 == ok2);
        any |= ok1;
    }
    any |= stream((const char *)data, size);       /* a chat stream made a response of more than its head */
    json_decref(prior);
    if (any) fuzz_accepted++;
    return 0;
}

/* The Responses API's and Ollama's JSON (run/api/responses.h, ollama.h): requests parsed into a chat
 * (fields, defaults, refusals naming the field), a chat completion made a response object and an
 * Ollama object, a chat stream made the Responses events and Ollama's NDJSON (order, sequence
 * numbers, the text adding up), and random mutations of valid bodies through the fuzzing entry
 * points (the parsers take arbitrary bytes). */
#include "check.h"
#include "run/api/ollama.h"
#include "run/api/responses.h"
#include "run/serve/serve.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- the Responses API ----------------------------------------------------------------------- */

/* A stored conversation for previous_response_id "resp_prev": a user message and a call. */
static json_t *lookup(void *ctx, const char *id)
{
    (void)ctx;
    if (strcmp(id, "resp_prev")) return NULL;
    return json_loads("[{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"hi\"}]},"
                      "{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"f\",\"arguments\":\"{}\"}]", 0, NULL);
}

static int rparse(const char *body, oresp_request *r, oai_error *e)
{
    memset(e, 0, sizeof *e);
    return oresp_parse_request(body, strlen(body), lookup, NULL, r, e);
}

/* 400 (or status) naming param. */
static void rrefused(const char *body, int status, const char *param, const char *what)
{
    oresp_request r;
    oai_error e;
    int rc = rparse(body, &r, &e);
    CHECK(rc == -1 && e.status == status && !strcmp(e.param, param) && e.message[0], "responses: %s: %d naming %s (got %d %s: %s)", what,
          status, param, e.status, e.param, e.message);
    if (rc == 0) oresp_request_free(&r);
}

static void test_responses_requests(void)
{
    oresp_request r;
    oai_error e;
    int rc = rparse("{\"model\":\"m\",\"input\":\"Hello\",\"instructions\":\"Be brief.\",\"max_output_tokens\":9,\"store\":false,"
                    "\"reasoning\":{\"effort\":\"low\"},\"parallel_tool_calls\":false,\"tool_choice\":\"required\",\"seed\":5,"
                    "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\"}},{\"type\":\"web_search\"},"
                    "{\"type\":\"namespace\",\"name\":\"ns\",\"tools\":[{\"type\":\"function\",\"name\":\"g\",\"strict\":false}]}]}",
                    &r, &e);
    CHECK(rc == 0, "responses: a request with instructions, tools, a hosted tool and a namespace parses (%s)", e.message);
    if (rc == 0) {
        json_t *tools = json_loads(r.chat.tools_json ? r.chat.tools_json : "", 0, NULL);
        json_t *f0 = json_object_get(json_array_get(tools, 0), "function"), *f1 = json_object_get(json_array_get(tools, 1), "function");
        CHECK(r.n_messages == 2 && r.messages[0].role == KCHAT_SYSTEM && r.messages[1].role == KCHAT_USER &&
              r.messages[1].content_len == 5 && !memcmp(r.messages[1].content, "Hello", 5),
              "responses: instructions a system message, the input string a user message");
        CHECK(json_array_size(tools) == 2 && json_is_true(json_object_get(f0, "strict")) &&
              !strcmp(json_string_value(json_object_get(f1, "name")), "ns.g") && json_is_false(json_object_get(f1, "strict")),
              "responses: function tools strict by default, a namespace's as NAMESPACE.NAME, the hosted tool not offered");
        CHECK(r.chat.tool_choice == KCHAT_TOOL_CHOICE_REQUIRED && r.chat.single_call && r.chat.thinking && r.chat.effort == KCHAT_EFFORT_LOW &&
              r.s.max_tokens == 9 && r.s.has_seed && r.s.seed == 5 && !r.store,
              "responses: tool_choice required, parallel_tool_calls false, effort low, max_output_tokens, seed, store false");
        json_decref(tools);
        oresp_request_free(&r);
    }
    rc = rparse("{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"sunny\"}],\"previous_response_id\":\"resp_prev\"}",
                &r, &e);
    CHECK(rc == 0 && r.n_messages == 3 && r.messages[1].role == KCHAT_ASSISTANT && r.messages[1].n_tool_calls == 1 &&
          r.messages[2].role == KCHAT_TOOL && r.store, "responses: previous_response_id's conversation, then a call's output (%s)", e.message);
    if (rc == 0) oresp_request_free(&r);
    rc = rparse("{\"input\":[{\"type\":\"reasoning\",\"summary\":[],\"encrypted_content\":\"krun1:dGhvdWdodA==\"},"
                "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"a\"}]},"
                "{\"role\":\"user\",\"content\":\"b\"}]}", &r, &e);
    CHECK(rc == 0 && r.n_messages == 2 && r.messages[0].reasoning_len == 7 && !memcmp(r.messages[0].reasoning, "thought", 7),
          "responses: a reasoning item's encrypted_content (krun1:) read back as the assistant's reasoning (%s)", e.message);
    if (rc == 0) oresp_request_free(&r);
    rrefused("{\"input\":\"x\",\"previous_response_id\":\"resp_gone\"}", 404, "previous_response_id", "an unknown previous_response_id");
    rrefused("{}", 400, "input", "no input");
    rrefused("{\"input\":\"x\",\"tools\":[{\"type\":\"custom\",\"name\":\"c\"}]}", 400, "tools[0].type", "a custom tool");
    rrefused("{\"input\":\"x\",\"background\":true}", 400, "background", "background");
    rrefused("{\"input\":\"x\",\"top_logprobs\":3}", 400, "top_logprobs", "top_logprobs");
    rrefused("{\"input\":\"x\",\"tool_choice\":\"required\"}", 400, "tool_choice", "required without tools");
    rrefused("{\"input\":\"x\",\"include\":[\"file_search_call.results\"]}", 400, "include[0]", "an include it cannot honour");
    rrefused("{\"input\":\"x\",\"reasoning\":{\"effort\":\"huge\"}}", 400, "reasoning.effort", "an unknown effort");
    rrefused("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"yaml\"}}}", 400, "text.format.type", "an unknown text format");
    rrefused("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"x\"}]}]}", 400,
             "input[0].content[0].type", "an image");
}

static const oai_meta META = {"resp_abc", "m", 1700000000};

static void test_responses_output(void)
{
    json_t *echo = json_pack("{sb}", "store", 1), *o, *out;
    const char *chat = "{\"id\":\"x\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"finish_reason\":\"tool_calls\",\"message\":"
                       "{\"role\":\"assistant\",\"content\":\"Let me see.\",\"reasoning_content\":\"hmm\",\"tool_calls\":[{\"id\":\"call_1\","
                       "\"type\":\"function\",\"function\":{\"name\":\"ns.g\",\"arguments\":\"{\\\"a\\\":1}\"}}]}}],"
                       "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":6,\"total_tokens\":16,\"prompt_tokens_details\":{\"cached_tokens\":4},"
                       "\"completion_tokens_details\":{\"reasoning_tokens\":2}}}";
    o = oresp_from_chat(&META, echo, chat, strlen(chat), 1);
    out = json_object_get(o, "output");
    CHECK(o && !strcmp(json_string_value(json_object_get(o, "status")), "completed") && json_array_size(out) == 3 &&
          !strcmp(json_string_value(json_object_get(json_array_get(out, 0), "type")), "reasoning") &&
          !strcmp(json_string_value(json_object_get(json_array_get(out, 0), "encrypted_content")), "krun1:aG1t") &&
          !strcmp(json_string_value(json_object_get(json_array_get(out, 1), "type")), "message") &&
          !strcmp(json_string_value(json_object_get(json_array_get(out, 2), "name")), "g") &&
          !strcmp(json_string_value(json_object_get(json_array_get(out, 2), "namespace")), "ns") &&
          json_integer_value(json_object_get(json_object_get(o, "usage"), "input_tokens")) == 10 &&
          json_integer_value(json_object_get(json_object_get(json_object_get(o, "usage"), "output_tokens_details"), "reasoning_tokens")) == 2 &&
          json_integer_value(json_object_get(json_object_get(json_object_get(o, "usage"), "input_tokens_details"), "cached_tokens")) == 4 &&
          json_is_true(json_object_get(o, "store")),
          "responses: a chat completion made a response: reasoning (encrypted), message, the call with its namespace, usage, the echo");
    json_decref(o);
    {
        const char *cut = "{\"choices\":[{\"finish_reason\":\"length\",\"message\":{\"role\":\"assistant\",\"content\":\"ab\"}}],\"usage\":{}}";
        o = oresp_from_chat(&META, echo, cut, strlen(cut), 0);
        CHECK(o && !strcmp(json_string_value(json_object_get(o, "status")), "incomplete") &&
              !strcmp(json_string_value(json_object_get(json_object_get(o, "incomplete_details"), "reason")), "max_output_tokens"),
              "responses: finish length: incomplete, reason max_output_tokens");
        json_decref(o);
    }
    json_decref(echo);
}

/* The chat stream of a reply (reasoning, text in two pieces, one call, finish, usage, [DONE]), fed
 * to the transcoder in pieces of `piece` bytes. */
static void chat_stream(kbuf *b)
{
    const oai_meta m = {"chatcmpl-1", "m", 1700000000};
    kchat_event ev[] = {{KCHAT_EV_REASONING, "th", 2, 0, NULL}, {KCHAT_EV_CONTENT, "Hel", 3, 0, NULL}, {KCHAT_EV_CONTENT, "lo", 2, 0, NULL},
                        {KCHAT_EV_TOOL_CALL_BEGIN, NULL, 0, 0, "f"}, {KCHAT_EV_TOOL_CALL, "{\"a\":1}", 7, 0, "f"}};
    char *s = oai_sse_chat_role(&m);
    kbuf_puts(b, s);
    free(s);
    for (size_t k = 0; k < sizeof ev / sizeof *ev; k++) {
        int none = 0;
        s = oai_sse_chat_event(&m, &ev[k], "call_9", &none);
        if (s) kbuf_puts(b, s);
        free(s);
    }
    s = oai_sse_chat_finish(&m, "tool_calls");
    kbuf_puts(b, s);
    free(s);
    s = oai_sse_usage_reasoning(&m, 1, 10, 6, 0, 1);
    kbuf_puts(b, s);
    free(s);
    kbuf_puts(b, OAI_SSE_DONE);
}

static void test_responses_stream(void)
{
    kbuf chat = {0};
    chat_stream(&chat);
    for (size_t piece = 1; piece <= 4096; piece *= 8) {
        json_t *echo = json_object();
        oresp_stream *s = oresp_stream_new(&META, echo, 0);
        kbuf out = {0};
        int rc = 0, seq_ok = 1, n = 0;
        char types[1024] = "", text[64] = "", args[64] = "";
        for (size_t at = 0; at < chat.n && rc == 0; at += piece)
            rc = oresp_stream_feed(s, chat.p + at, at + piece < chat.n ? piece : chat.n - at, &out);
        /* the events: "event: TYPE\ndata: {...}\n\n" */
        for (char *p = out.p, *end = out.p + out.n; p && p < end;) {
            char *d = strstr(p, "\ndata: "), *nl = d ? strstr(d + 7, "\n\n") : NULL;
            json_t *j = nl ? json_loadb(d + 7, (size_t)(nl - d - 7), 0, NULL) : NULL;
            const char *t = json_string_value(json_object_get(j, "type"));
            if (!j || !t) { seq_ok = 0; json_decref(j); break; }
            seq_ok &= json_integer_value(json_object_get(j, "sequence_number")) == n++;
            if (strlen(types) + strlen(t) + 2 < sizeof types) { strcat(types, t + (strncmp(t, "response.", 9) ? 0 : 9)); strcat(types, " "); }
            if (!strcmp(t, "response.output_text.delta") && strlen(text) + json_string_length(json_object_get(j, "delta")) < sizeof text)
                strcat(text, json_string_value(json_object_get(j, "delta")));
            if (!strcmp(t, "response.function_call_arguments.done")) snprintf(args, sizeof args, "%s", json_string_value(json_object_get(j, "arguments")));
            json_decref(j);
            p = nl + 2;
        }
        CHECK(rc == 1 && seq_ok && !strcmp(text, "Hello") && !strcmp(args, "{\"a\":1}") &&
              !strncmp(types, "created in_progress output_item.added content_part.added reasoning_text.delta", 77) &&
              strstr(types, "output_text.delta output_text.delta output_text.done content_part.done output_item.done") &&
              strstr(types, "function_call_arguments.delta function_call_arguments.done output_item.done completed"),
              "responses stream (pieces of %zu bytes): created, in_progress, reasoning, text deltas adding up, the call, completed; "
              "sequence numbers 0, 1, ... (%s)", piece, types);
        {
            const json_t *resp = oresp_stream_response(s);
            CHECK(resp && json_array_size(json_object_get(resp, "output")) == 3 &&
                  json_integer_value(json_object_get(json_object_get(json_object_get(resp, "usage"), "output_tokens_details"), "reasoning_tokens")) == 1,
                  "responses stream: the final response holds the three items and the usage");
        }
        oresp_stream_free(s);
        kbuf_free(&out);
        json_decref(echo);
    }
    kbuf_free(&chat);
}

/* ---- Ollama ---------------------------------------------------------------------------------- */

static void test_ollama(void)
{
    ollama_request r;
    oai_error e;
    const char *chat = "{\"model\":\"m:latest\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"u\"},"
                       "{\"role\":\"assistant\",\"content\":\"\",\"thinking\":\"t\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},"
                       "{\"role\":\"tool\",\"tool_name\":\"f\",\"content\":\"r\"}],\"think\":false,\"format\":{\"type\":\"object\"},"
                       "\"options\":{\"temperature\":0.5,\"num_predict\":7,\"stop\":[\"x\"],\"seed\":3,\"num_ctx\":4096}}";
    int rc;
    memset(&e, 0, sizeof e);
    rc = ollama_parse_chat(chat, strlen(chat), &r, &e);
    CHECK(rc == 0 && r.n_messages == 4 && r.messages[2].n_tool_calls == 1 && r.messages[3].role == KCHAT_TOOL && !r.chat.thinking &&
          r.chat.format == KCHAT_FORMAT_JSON_SCHEMA && r.s.max_tokens == 7 && r.s.temperature == 0.5 && r.s.n_stop == 1 && r.s.stream,
          "ollama /api/chat: messages with thinking, tool calls and a tool result; think false; format a schema; options; stream by default (%s)",
          e.message);
    if (rc == 0) ollama_request_free(&r);
    memset(&e, 0, sizeof e);
    rc = ollama_parse_generate("{\"model\":\"m\",\"prompt\":\"p\",\"raw\":true,\"stream\":false}", 52, &r, &e);
    CHECK(rc == 0 && r.raw && r.prompt_len == 1 && !r.s.stream, "ollama /api/generate raw: the prompt as it is, not streamed (%s)", e.message);
    if (rc == 0) ollama_request_free(&r);
    memset(&e, 0, sizeof e);
    rc = ollama_parse_generate("{\"model\":\"m\",\"prompt\":\"p\",\"images\":[\"aGk=\"]}", 44, &r, &e);
    CHECK(rc == -1 && e.status == 400 && strstr(e.message, "images"), "ollama: images a 400 naming them (%s)", e.message);
    if (rc == 0) ollama_request_free(&r);
    memset(&e, 0, sizeof e);
    CHECK(ollama_check_model("m:latest", "m", &e) == 0 && ollama_check_model("m", "m", &e) == 0 && ollama_check_model("other", "m", &e) == -1 &&
          e.status == 404, "ollama: a model with or without its tag; another is a 404");
    {
        const ollama_meta m = {"m", 1700000000.0, 100.0};
        kbuf sse = {0}, out = {0};
        ollama_stream *s = ollama_stream_new(&m, 0);
        int rc2 = 0, lines = 0, done = 0;
        char text[32] = "";
        chat_stream(&sse);
        for (size_t at = 0; at < sse.n && rc2 == 0; at += 7)
            rc2 = ollama_stream_feed(s, sse.p + at, at + 7 < sse.n ? 7 : sse.n - at, 101.0, &out);
        for (size_t i = 0, st = 0; i < out.n; i++)
            if (out.p[i] == '\n') {
                json_t *j = json_loadb(out.p + st, i - st, 0, NULL), *msg = json_object_get(j, "message");
                lines += json_is_object(j);
                if (json_is_string(json_object_get(msg, "content")) && strlen(text) + json_string_length(json_object_get(msg, "content")) < sizeof text)
                    strcat(text, json_string_value(json_object_get(msg, "content")));
                if (json_is_true(json_object_get(j, "done")))
                    done = json_integer_value(json_object_get(j, "prompt_eval_count")) == 10 && json_integer_value(json_object_get(j, "eval_count")) == 6 &&
                           json_integer_value(json_object_get(j, "total_duration")) == 1000000000;
                json_decref(j);
                st = i + 1;
            }
        CHECK(rc2 == 1 && lines >= 4 && !strcmp(text, "Hello") && done,
              "ollama stream: NDJSON lines, the content adding up, the last done with the counts and durations in ns (%d lines)", lines);
        ollama_stream_free(s);
        kbuf_free(&sse);
        kbuf_free(&out);
    }
}

/* ---- stored responses (run/serve/serve_store.c) ------------------------------------------------ */

static void test_store(void)
{
    srv_store *st = srv_store_new(3);
    json_t *r = json_pack("{ss}", "object", "response"), *conv = json_pack("[{ss}]", "type", "message"), *in = json_array(), *got;
    char id[16];
    int ok = st && r && conv && in;
    for (int k = 0; ok && k < 3; k++) {
        snprintf(id, sizeof id, "resp_%d", k);
        ok &= srv_store_put(st, id, r, conv, in) == 0;
    }
    got = srv_store_response(st, "resp_0");          /* used: resp_1 is now the least recently used */
    ok &= got != NULL;
    json_decref(got);
    ok &= srv_store_put(st, "resp_3", r, conv, in) == 0;
    got = srv_store_conversation(st, "resp_0");
    CHECK(ok && got && json_array_size(got) == 1 && !srv_store_response(st, "resp_1") && srv_store_delete(st, "resp_2") == 1 &&
          srv_store_delete(st, "resp_2") == 0 && !srv_store_input(st, "resp_2"),
          "stored responses: at most 3 kept, the least recently used out (a read counts as a use); delete forgets, once");
    json_decref(got);
    got = srv_store_input(st, "resp_3");
    CHECK(json_is_array(got), "stored responses: the input items given back");
    json_decref(got);
    got = srv_store_json(st);
    CHECK(json_integer_value(json_object_get(got, "entries")) == 2 && json_integer_value(json_object_get(got, "evicted")) == 1 &&
          json_integer_value(json_object_get(got, "stored")) == 4, "stored responses: the counts /health shows");
    json_decref(got);
    srv_store_free(st);
    st = srv_store_new(0);
    CHECK(!st || (srv_store_put(st, "resp_x", r, conv, in), !srv_store_response(st, "resp_x")), "--responses-store 0: nothing kept");
    srv_store_free(st);
    json_decref(r);
    json_decref(conv);
    json_decref(in);
}

/* ---- mutations ------------------------------------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static void test_mutations(void)
{
    static const char *const seeds[] = {
        "{\"model\":\"m\",\"input\":[{\"role\":\"developer\",\"content\":\"d\"},{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":"
        "\"input_text\",\"text\":\"u\"}]},{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{}\"},{\"type\":"
        "\"function_call_output\",\"call_id\":\"c\",\"output\":\"o\"}],\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"^[a-z]+$\"}}}}],\"text\":{\"format\":{\"type\":"
        "\"json_schema\",\"name\":\"n\",\"schema\":{\"type\":\"object\"}}},\"stream\":true}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\",\"content\":\"a\",\"tool_calls\":[{\"function\":"
        "{\"name\":\"f\",\"arguments\":{}}}]}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"think\":\"low\","
        "\"format\":\"json\",\"options\":{\"top_k\":5,\"stop\":[\"s\"]},\"prompt\":\"p\",\"system\":\"s\"}",
    };
    static const char tokens[] = "{}[]\":,0123456789.-+eEtrufalsn\\ \xff\xc3\xa9\x00";
    int iters = 0, bad = 0;
    for (int it = 0; it < 6000; it++) {
        const char *sd = seeds[it & 1];
        size_t n = strlen(sd);
        char buf[1400];
        memcpy(buf, sd, n);
        for (int k = 0, edits = 1 + (int)rnd(4); k < edits; k++) {
            size_t at = rnd((uint32_t)n + 1);
            switch (rnd(3)) {
            case 0: if (n) buf[at < n ? at : n - 1] = tokens[rnd(sizeof tokens - 1)]; break;
            case 1: if (at < n) { memmove(buf + at, buf + at + 1, n - at - 1); n--; } break;
            default: if (n + 1 < sizeof buf) { memmove(buf + at + 1, buf + at, n - at); buf[at] = tokens[rnd(sizeof tokens - 1)]; n++; }
            }
        }
        if (rnd(10) == 0) n = rnd((uint32_t)n + 1);
        iters++;
        bad += it & 1 ? ollama_fuzz_one((const uint8_t *)buf, n) : oresp_fuzz_one((const uint8_t *)buf, n);
    }
    CHECK(bad == 0, "%d mutated Responses and Ollama bodies (edits, truncation, invalid UTF-8, NUL) through oresp_fuzz_one and "
          "ollama_fuzz_one: nothing found", iters);
}

int main(void)
{
    test_responses_requests();
    test_responses_output();
    test_responses_stream();
    test_ollama();
    test_store();
    test_mutations();
    return check_exit();
}

/* K3 chat format tests (run/text/chat.h): the 11 golden vectors of $K3_SHARED/fixtures/chat (text and
 * ids; skipped visibly without them), rendering rules from spec K3_CHAT.md written out by hand,
 * Python-compatible JSON, the reply parser (whole, streamed byte by byte and id by id, cut off,
 * malformed, injected marker text), round trips and the prefix property. */
#include "check.h"
#include "run/text/chat.h"
#include "run/text/jsontext.h"
#include "run/api/oai.h"
#include "run/text/tokenizer.h"

#include <jansson.h>
#include <stdint.h>
#include <string.h>

static _Noreturn void die(const char *what)
{
    printf("not ok - %s\n", what);
    exit(1);
}


/* Render text only (no tokenizer); returns the malloc'd text or NULL with err. */
static char *render_text(const kchat_message *m, size_t n, const kchat_options *o, char *err, size_t errlen)
{
    kchat_rendering r;
    krun_err e;
    if (kchat_render(NULL, m, n, o, &r, &e)) { snprintf(err, errlen, "%s", e.msg); return NULL; }
    free(r.ids);
    return r.text;
}

static kchat_options opts(int thinking, kchat_effort effort)
{
    kchat_options o;
    kchat_options_default(&o);
    o.thinking = thinking;
    o.effort = effort;
    return o;
}

#define MSG(r, text) {.role = (r), .content = (text), .content_len = sizeof(text) - 1}

/* ------------------------------------------------------------------------------------------ */
/* Python json.dumps                                                                          */

static void test_py_json(void)
{
    static const struct { double x; const char *want; } f[] = {
        {0.1, "0.1"}, {1e16, "1e+16"}, {1e-5, "1e-05"}, {123456789.0, "123456789.0"}, {1.5, "1.5"}, {2.0, "2.0"},
        {-0.0, "-0.0"}, {1e22, "1e+22"}, {0.0001, "0.0001"}, {1.0 / 3, "0.3333333333333333"}, {5e-324, "5e-324"},
        {1.7976931348623157e308, "1.7976931348623157e+308"}, {100.0, "100.0"}, {1e15, "1000000000000000.0"},
        {123456789012345678.0, "1.2345678901234568e+17"}, {0.000123, "0.000123"}, {-2.5e-7, "-2.5e-07"},
        {3.14159, "3.14159"},
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        kbuf b = {0};
        kjson_py_float(f[i].x, &b);
        if (!b.p || strcmp(b.p, f[i].want)) { ok = 0; printf("# py float %.17g: got %s, want %s\n", f[i].x, b.p, f[i].want); }
        kbuf_free(&b);
    }
    CHECK(ok, "kjson_py_float: %zu doubles written as Python's repr (values from python3)", sizeof f / sizeof *f);
    /* sort_keys + compact, and the default separators (values from python3's json.dumps) */
    json_t *v = json_loads("{\"b\":[1,2,{\"z\":null,\"a\":true}],\"a\":\"x\\u0001\\u007f/\u00e9\\u2028\\\"\\\\\\n\\t\","
                           "\"\u00e9\":1.0,\"A\":-3}", 0, NULL);
    kbuf b = {0};
    if (!v) die("test JSON");
    kjson_py_dump(v, 1, 1, &b);
    CHECK(b.p && !strcmp(b.p, "{\"A\":-3,\"a\":\"x\\u0001\x7f/\u00e9\u2028\\\"\\\\\\n\\t\",\"b\":[1,2,{\"a\":true,\"z\":null}],\"\u00e9\":1.0}"),
          "kjson_py_dump sort_keys compact: keys by code point, \\u0001 lower-case, DEL, / and U+2028 raw (%s)", b.p);
    kbuf_free(&b);
    json_decref(v);
    v = json_loads("{\"b\":[1,2,{\"z\":null,\"a\":true}],\"a\":\"x\",\"\u00e9\":1.0}", 0, NULL);
    kjson_py_dump(v, 0, 0, &b);
    CHECK(b.p && !strcmp(b.p, "{\"b\": [1, 2, {\"z\": null, \"a\": true}], \"a\": \"x\", \"\u00e9\": 1.0}"),
          "kjson_py_dump default separators keep insertion order (%s)", b.p);
    kbuf_free(&b);
    json_decref(v);
    kutf8_sanitize("a\xC3(\xE2\x82\xF0\x9F\x98\x80z\xFF", 11, &b);
    CHECK(b.p && !strcmp(b.p, "a\xEF\xBF\xBD(\xEF\xBF\xBD\xF0\x9F\x98\x80z\xEF\xBF\xBD"),
          "kutf8_sanitize: each maximal ill-formed subsequence becomes one U+FFFD, valid text stays");
    kbuf_free(&b);
}

/* ------------------------------------------------------------------------------------------ */
/* rendering rules, text only                                                                 */

static void test_render_rules(void)
{
    char err[256];
    kchat_message hello[] = {MSG(KCHAT_USER, "Hello!")};
    kchat_options o = opts(0, KCHAT_EFFORT_NONE);
    char *t = render_text(hello, 1, &o, err, sizeof err);
    /* spec §6, verbatim */
    CHECK(t && !strcmp(t, "<|open|>message role=\"user\"<|sep|>Hello!<|close|>message<|sep|><|end_of_msg|><|open|>message "
                          "role=\"assistant\"<|sep|><|open|>response<|sep|>"), "spec section 6 example (thinking off)");
    free(t);

    o = opts(1, KCHAT_EFFORT_LOW);
    t = render_text(hello, 1, &o, err, sizeof err);
    CHECK(t && strstr(t, "<|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>`thinking_effort` guides on how much to "
                         "think in your thinking channel (not including the response channel), supported values include `low`, "
                         "`medium`, `high`, and `max`.\nNow the system is invoked with `thinking_effort=low`.<|close|>message<|sep|>"
                         "<|end_of_msg|><|open|>message role=\"user\"") == t &&
          strstr(t, "<|open|>think<|sep|>") == t + strlen(t) - strlen("<|open|>think<|sep|>"),
          "thinking effort message first, generation prompt opens think");
    free(t);
    o.effort = (kchat_effort)7;
    CHECK(!render_text(hello, 1, &o, err, sizeof err) && strstr(err, "effort"), "an unknown effort is an error (%s)", err);
    CHECK(kchat_effort_parse("medium") == KCHAT_EFFORT_INVALID && kchat_effort_parse("max") == KCHAT_EFFORT_MAX &&
          kchat_effort_parse(NULL) == KCHAT_EFFORT_INVALID, "efforts: low, high, max (medium is not one)");

    /* name attribute: & first, then "; system and user only */
    kchat_message named[] = {{.role = KCHAT_SYSTEM, .content = "s", .content_len = 1, .name = "a&\"b\"&amp;"},
                             {.role = KCHAT_USER, .content = "u", .content_len = 1, .name = ""},
                             {.role = KCHAT_ASSISTANT, .content = "a", .content_len = 1, .name = "bot"}};
    o = opts(0, KCHAT_EFFORT_NONE);
    o.add_generation_prompt = 0;
    t = render_text(named, 3, &o, err, sizeof err);
    CHECK(t && !strcmp(t, "<|open|>message role=\"system\" name=\"a&amp;&quot;b&quot;&amp;amp;\"<|sep|>s<|close|>message<|sep|>"
                          "<|end_of_msg|><|open|>message role=\"user\"<|sep|>u<|close|>message<|sep|><|end_of_msg|>"
                          "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>a<|close|>response<|sep|>"
                          "<|close|>message<|sep|><|end_of_msg|>"),
          "name attribute escaped (& then \"), empty name omitted, no name on assistant, no generation prompt");
    free(t);

    /* thinking on: every assistant message has a think channel; off: stored reasoning dropped */
    kchat_message hist[] = {MSG(KCHAT_USER, "q"), {.role = KCHAT_ASSISTANT, .content = "a", .content_len = 1,
                                                   .reasoning = "r", .reasoning_len = 1},
                            MSG(KCHAT_ASSISTANT, "b")};
    o = opts(1, KCHAT_EFFORT_NONE);
    t = render_text(hist, 3, &o, err, sizeof err);
    CHECK(t && strstr(t, "<|open|>think<|sep|>r<|close|>think<|sep|><|open|>response<|sep|>a<|close|>") &&
          strstr(t, "<|open|>think<|sep|><|close|>think<|sep|><|open|>response<|sep|>b<|close|>"),
          "thinking mode: stored reasoning in the think channel, an empty one without");
    free(t);
    o = opts(0, KCHAT_EFFORT_MAX);
    t = render_text(hist, 3, &o, err, sizeof err);
    CHECK(t && !strstr(t, "think") && !strstr(t, ">r<"), "thinking off: no think channel, stored reasoning dropped, no effort message");
    free(t);

    /* tools: declaration sorted and compact, call arguments typed, tool results named and indexed */
    kchat_tool_call calls[] = {
        {.id = "c1", .name = "f", .arguments = "{\"s\":\"x \\\"y\\\"\",\"n\":2.50,\"i\":-3,\"b\":false,\"z\":null,"
                                               "\"o\":{\"k\":[1,\"\u00e9\"]},\"a\":[]}"},
        {.id = "c2", .name = "g", .arguments = "not json"},
        {.id = "c3", .name = "h", .arguments = "  "},
    };
    kchat_message tc[] = {
        MSG(KCHAT_USER, "go"),
        {.role = KCHAT_ASSISTANT, .tool_calls = calls, .n_tool_calls = 3},
        {.role = KCHAT_TOOL, .content = "R2", .content_len = 2, .tool_call_id = "c2"},
        {.role = KCHAT_TOOL, .content = "R?", .content_len = 2},
        {.role = KCHAT_TOOL, .content = "R!", .content_len = 2, .tool_name = "named"},
    };
    o = opts(0, KCHAT_EFFORT_NONE);
    o.tools_json = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"b\":1.0}}}]";
    o.tool_choice = KCHAT_TOOL_CHOICE_REQUIRED;
    t = render_text(tc, 5, &o, err, sizeof err);
    const char *want =
        "<|open|>message role=\"system\" type=\"tool-declare\"<|sep|># Tools\nHere are the available tools, described in "
        "JSONSchema.\n\n```json\n[{\"function\":{\"name\":\"f\",\"parameters\":{\"b\":1.0,\"type\":\"object\"}},\"type\":\"function\"}]"
        "\n```<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"user\"<|sep|>go<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
        "<|open|>call tool=\"f\" index=\"1\"<|sep|>"
        "<|open|>argument key=\"s\" type=\"string\"<|sep|>x \"y\"<|close|>argument<|sep|>"
        "<|open|>argument key=\"n\" type=\"number\"<|sep|>2.5<|close|>argument<|sep|>"
        "<|open|>argument key=\"i\" type=\"number\"<|sep|>-3<|close|>argument<|sep|>"
        "<|open|>argument key=\"b\" type=\"boolean\"<|sep|>false<|close|>argument<|sep|>"
        "<|open|>argument key=\"z\" type=\"null\"<|sep|>null<|close|>argument<|sep|>"
        "<|open|>argument key=\"o\" type=\"object\"<|sep|>{\"k\": [1, \"\u00e9\"]}<|close|>argument<|sep|>"
        "<|open|>argument key=\"a\" type=\"array\"<|sep|>[]<|close|>argument<|sep|>"
        "<|close|>call<|sep|>"
        "<|open|>call tool=\"g\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>not json<|close|>json<|sep|><|close|>call<|sep|>"
        "<|open|>call tool=\"h\" index=\"3\"<|sep|><|close|>call<|sep|>"
        "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"tool\" tool=\"g\" index=\"1\"<|sep|>R2<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"tool\" tool=\"g\" index=\"2\"<|sep|>R?<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"tool\" tool=\"named\" index=\"3\"<|sep|>R!<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"system\" type=\"tool-choice\"<|sep|>The system is invoked with `tool_choice=required`.\n"
        "You MUST call tools in the next message.<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>";
    CHECK(t && !strcmp(t, want), "tools: sorted compact declaration, typed arguments (Python JSON), a json block for non-JSON "
                                 "arguments, results named by id / position / name and indexed from 1, tool-choice directive");
    if (t && strcmp(t, want)) printf("# got: %s\n", t);
    free(t);

    o.tools_json = "[]";
    o.tool_choice = KCHAT_TOOL_CHOICE_NONE;
    t = render_text(hello, 1, &o, err, sizeof err);
    CHECK(t && !strstr(t, "tool"), "an empty tools list declares nothing and takes no tool-choice directive");
    free(t);
    o.tools_json = "{\"not\": \"a list\"}";
    CHECK(!render_text(hello, 1, &o, err, sizeof err) && strstr(err, "tools"), "tools that are not a JSON array: error (%s)", err);
    o.tools_json = NULL;
    kchat_tool_call arr = {.name = "f", .arguments = "[1,2]"};
    kchat_message bad_args[] = {{.role = KCHAT_ASSISTANT, .tool_calls = &arr, .n_tool_calls = 1}};
    CHECK(!render_text(bad_args, 1, &o, err, sizeof err) && strstr(err, "messages[0].tool_calls[0]"),
          "tool-call arguments that are JSON but not an object: error naming the call (%s)", err);
    kchat_message orphan[] = {MSG(KCHAT_USER, "x"), {.role = KCHAT_TOOL, .content = "r", .content_len = 1, .tool_call_id = "zz"}};
    CHECK(!render_text(orphan, 2, &o, err, sizeof err) && strstr(err, "messages[1]"), "a tool result without a call: error (%s)", err);
}

/* ------------------------------------------------------------------------------------------ */
/* the reply parser, text only                                                                */

typedef struct {
    kbuf reasoning, content, log;
    int n_begin, n_calls, bad_delta;
} sink;

static int sink_event(void *ctx, const kchat_event *ev)
{
    sink *s = ctx;
    /* a delta must never carry marker text, and must be complete UTF-8 */
    if (ev->kind == KCHAT_EV_REASONING || ev->kind == KCHAT_EV_CONTENT) {
        if (memmem(ev->text, ev->len, "<|", 2) || ktok_utf8_complete((const uint8_t *)ev->text, ev->len) != ev->len) s->bad_delta++;
        kbuf_add(ev->kind == KCHAT_EV_REASONING ? &s->reasoning : &s->content, ev->text, ev->len);
    } else if (ev->kind == KCHAT_EV_TOOL_CALL_BEGIN) {
        s->n_begin++;
        kbuf_printf(&s->log, "[begin %d %s]", ev->index, ev->name);
    } else {
        s->n_calls++;
        kbuf_printf(&s->log, "[call %d %s %.*s]", ev->index, ev->name, (int)ev->len, ev->text);
    }
    return 0;
}

static void sink_free(sink *s)
{
    kbuf_free(&s->reasoning);
    kbuf_free(&s->content);
    kbuf_free(&s->log);
}

static const char *S(const kbuf *b) { return b->p ? b->p : ""; }

static int json_text_equal(const char *a, const char *b)
{
    json_t *x = json_loads(a, 0, NULL), *y = json_loads(b, 0, NULL);
    int eq = x && y && json_equal(x, y);
    json_decref(x);
    json_decref(y);
    return eq;
}

static const char REPLY_TOOLS[] =
    "Let me check.<|close|>think<|sep|><|open|>response<|sep|>Checking the weather \xE2\x80\x94 one moment."
    "<|close|>response<|sep|><|open|>tools<|sep|>"
    "<|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
    "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris &amp; \"Nice\"<|close|>argument<|sep|>"
    "<|open|>argument key=\"days\" type=\"number\"<|sep|>2<|close|>argument<|sep|>"
    "<|open|>argument key=\"metric\" type=\"boolean\"<|sep|>true<|close|>argument<|sep|>"
    "<|open|>argument key=\"opts\" type=\"object\"<|sep|>{\"a\": [1, null]}<|close|>argument<|sep|>"
    "<|open|>argument key=\"n\" type=\"null\"<|sep|>null<|close|>argument<|sep|>"
    "<|open|>argument key=\"bad\" type=\"number\"<|sep|>two<|close|>argument<|sep|>"
    "<|close|>call<|sep|>"
    "<|open|>call tool=\"a&amp;b\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>{raw<|close|>json<|sep|><|close|>call<|sep|>"
    "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>ignored after the end";

static void test_parse_text(void)
{
    kchat_reply r;
    const char *plain = "I think 2+2=4.<|close|>think<|sep|><|open|>response<|sep|>It is **4**.<|close|>response<|sep|>"
                        "<|close|>message<|sep|><|end_of_msg|>";
    CHECK(kchat_parse_text(plain, strlen(plain), 1, &r) == 0 && !strcmp(r.reasoning, "I think 2+2=4.") &&
          !strcmp(r.content, "It is **4**.") && r.n_calls == 0 && r.where == KCHAT_AT_END && r.malformed == 0 &&
          !strcmp(kchat_finish_reason(r.where, r.n_calls), "stop"),
          "reply (thinking): reasoning, content, ended at <|end_of_msg|>, finish stop");
    kchat_reply_free(&r);

    CHECK(kchat_parse_text(REPLY_TOOLS, strlen(REPLY_TOOLS), 1, &r) == 0 && r.n_calls == 2 &&
          !strcmp(r.content, "Checking the weather \xE2\x80\x94 one moment.") && !strcmp(r.calls[0].name, "get_weather") &&
          json_text_equal(r.calls[0].arguments, "{\"city\":\"Paris &amp; \\\"Nice\\\"\",\"days\":2,\"metric\":true,"
                                                "\"opts\":{\"a\":[1,null]},\"n\":null,\"bad\":\"two\"}") &&
          !strcmp(r.calls[1].name, "a&b") && !strcmp(r.calls[1].arguments, "{raw") && r.where == KCHAT_AT_END &&
          r.malformed == 1 && !strcmp(kchat_finish_reason(r.where, r.n_calls), "tool_calls"),
          "reply with tool calls: typed arguments (a value that is not its type stays a string, counted malformed), "
          "attribute unescaped, json block raw, text after the end ignored, finish tool_calls");
    if (r.n_calls) printf("# arguments: %s\n", r.calls[0].arguments);
    kchat_reply_free(&r);

    /* the same reply fed one byte at a time */
    kchat_parser *p = kchat_parser_new(NULL, 1);
    sink s = {0};
    int rc = 0;
    size_t fed = 0;
    for (; fed < strlen(REPLY_TOOLS) && rc == 0; fed++) rc = kchat_parser_feed_text(p, REPLY_TOOLS + fed, 1, sink_event, &s);
    CHECK(rc == 1 && fed == strlen(REPLY_TOOLS) - strlen("ignored after the end") && !strcmp(S(&s.reasoning), "Let me check.") &&
          !strcmp(S(&s.content), "Checking the weather \xE2\x80\x94 one moment.") && s.n_begin == 2 && s.n_calls == 2 &&
          s.bad_delta == 0 && strstr(S(&s.log), "[begin 0 get_weather][call 0 get_weather {") &&
          strstr(S(&s.log), "[begin 1 a&b][call 1 a&b {raw]"),
          "streaming, one byte at a time: the same reasoning, content and calls; no delta holds marker text or split UTF-8; "
          "feed returns 1 at <|end_of_msg|>");
    kchat_parser_free(p);
    sink_free(&s);

    /* cut off */
    const char *cut_think = "still thinking \xE4\xB8";
    CHECK(kchat_parse_text(cut_think, strlen(cut_think), 1, &r) == 0 && !strcmp(r.reasoning, cut_think) && r.content_len == 0 &&
          r.where == KCHAT_AT_THINK && !strcmp(kchat_finish_reason(r.where, 0), "length"),
          "cut off inside think: reasoning kept (held-back bytes flushed at the end), content empty, finish length");
    kchat_reply_free(&r);
    const char *cut_resp = "Half an ans";
    CHECK(kchat_parse_text(cut_resp, strlen(cut_resp), 0, &r) == 0 && !strcmp(r.content, "Half an ans") && r.reasoning_len == 0 &&
          r.where == KCHAT_AT_RESPONSE, "cut off inside response (thinking off): content so far");
    kchat_reply_free(&r);
    const char *cut_arg = "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>"
                          "<|open|>argument key=\"q\" type=\"string\"<|sep|>partial val<|clo";
    CHECK(kchat_parse_text(cut_arg, strlen(cut_arg), 0, &r) == 0 && r.n_calls == 1 && r.where == KCHAT_AT_TOOLS &&
          json_text_equal(r.calls[0].arguments, "{\"q\":\"partial val<|clo\"}"),
          "cut off inside an argument (and inside a marker): the call with the arguments so far, the partial marker as text");
    kchat_reply_free(&r);

    /* malformed input is counted and dropped, the answer survives */
    const char *bad = "<|sep|>answer<|close|>nothing<|sep|><|close|>response<|sep|>stray<|open|>response<|sep|> more"
                      "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>";
    CHECK(kchat_parse_text(bad, strlen(bad), 0, &r) == 0 && !strcmp(r.content, "answer more") && r.malformed == 3 &&
          r.where == KCHAT_AT_END, "malformed: a stray <|sep|>, a close without open, text between channels (3, dropped)");
    kchat_reply_free(&r);
}

/* ------------------------------------------------------------------------------------------ */
/* prefix property (text; ids too when the tokenizer is there)                                */

static const kchat_tool_call PCALLS[] = {{.id = "call_1", .name = "lookup", .arguments = "{\"q\":\"K3 \\\"XTML\\\"\",\"n\":3}"}};
static const kchat_message CONV[] = {
    {.role = KCHAT_SYSTEM, .content = "Be brief.", .content_len = 9},
    {.role = KCHAT_USER, .content = "Find K3.", .content_len = 8},
    {.role = KCHAT_ASSISTANT, .content = "Looking.", .content_len = 8, .reasoning = "Use the tool.", .reasoning_len = 13,
     .tool_calls = PCALLS, .n_tool_calls = 1},
    {.role = KCHAT_TOOL, .content = "{\"hits\": 1}", .content_len = 11, .tool_call_id = "call_1"},
    {.role = KCHAT_ASSISTANT, .content = "Found it: one hit.", .content_len = 18, .reasoning = "Done.", .reasoning_len = 5},
    {.role = KCHAT_USER, .content = "Thanks <|open|>!", .content_len = 16},
};
#define NCONV (sizeof CONV / sizeof *CONV)

typedef struct { const int32_t *ids; size_t n; const char *text; size_t len; } span;

static int span_eq(span a, span b, int ids) { return ids ? (a.n == b.n && !memcmp(a.ids, b.ids, a.n * sizeof *a.ids))
                                                         : (a.len == b.len && !memcmp(a.text, b.text, a.len)); }

static void test_prefix(const ktok *tk, const char *label)
{
    krun_err err;
    int ok = 1, parsed_ok = 1, closing_ok = 1;
    for (int thinking = 0; thinking <= 1; thinking++) {
        kchat_options o = opts(thinking, KCHAT_EFFORT_HIGH);
        o.tools_json = "[{\"type\":\"function\",\"function\":{\"name\":\"lookup\"}}]";
        kchat_rendering full;
        if (kchat_render(tk, CONV, NCONV, &o, &full, &err)) die(err.msg);
        for (size_t k = 0; k < NCONV; k++) {
            if (CONV[k].role != KCHAT_ASSISTANT) continue;
            kchat_options og = o, on = o;
            on.add_generation_prompt = 0;
            kchat_rendering P, R, C;
            if (kchat_render(tk, CONV, k, &og, &P, &err) || kchat_render(tk, CONV, k + 1, &on, &R, &err) ||
                kchat_render_continue(tk, CONV, NCONV, k + 1, &o, &C, &err))
                die(err.msg);
            /* the prompt of turn k is a prefix of the conversation with the reply; full = P + reply + C */
            size_t rn = R.n_ids - P.n_ids, rl = R.text_len - P.text_len;
            span p = {P.ids, P.n_ids, P.text, P.text_len}, rp = {R.ids, P.n_ids, R.text, P.text_len};
            span f1 = {full.ids, P.n_ids, full.text, P.text_len};
            span f2 = {full.ids ? full.ids + R.n_ids : NULL, C.n_ids, full.text + R.text_len, C.text_len};
            span c = {C.ids, C.n_ids, C.text, C.text_len};
            span rr = {R.ids ? R.ids + P.n_ids : NULL, rn, R.text + P.text_len, rl};
            span fr = {full.ids ? full.ids + P.n_ids : NULL, rn, full.text + P.text_len, rl};
            int ids = tk != NULL;
            if (!span_eq(p, rp, ids) || !span_eq(p, f1, ids) || !span_eq(rr, fr, ids) || !span_eq(f2, c, ids) ||
                (ids ? full.n_ids != R.n_ids + C.n_ids : full.text_len != R.text_len + C.text_len)) {
                ok = 0;
                printf("# %s: prefix property fails at message %zu (thinking %d)\n", label, k, thinking);
            }
            /* the reply as generated parses back to the message */
            kchat_reply rep;
            int prc = ids ? kchat_parse_ids(tk, rr.ids, rn, thinking, &rep) : kchat_parse_text(rr.text, rl, thinking, &rep);
            if (prc || rep.where != KCHAT_AT_END || strcmp(rep.content, CONV[k].content) || rep.n_calls != CONV[k].n_tool_calls ||
                (thinking && strcmp(rep.reasoning, CONV[k].reasoning)) || (!thinking && rep.reasoning_len) || rep.malformed ||
                (rep.n_calls && (strcmp(rep.calls[0].name, "lookup") || !json_text_equal(rep.calls[0].arguments, PCALLS[0].arguments)))) {
                parsed_ok = 0;
                printf("# %s: reply %zu (thinking %d) does not parse back\n", label, k, thinking);
            }
            if (!prc) kchat_reply_free(&rep);
            /* cut the reply right before the close of its first channel: the closing tokens complete a
             * well-formed message equal to the rendering of what was kept */
            if (ids) {
                size_t j = 0;
                int32_t close_id = ktok_find_special(tk, KCHAT_CLOSE);
                while (j < rn && rr.ids[j] != close_id) j++;
                kchat_parser *pp = kchat_parser_new(tk, thinking);
                for (size_t q = 0; q < j; q++) kchat_parser_feed_id(pp, rr.ids[q], NULL, NULL);
                int32_t *cl;
                size_t ncl;
                kchat_message kept = {.role = KCHAT_ASSISTANT, .content = thinking ? "" : CONV[k].content,
                                      .content_len = thinking ? 0 : CONV[k].content_len, .reasoning = CONV[k].reasoning,
                                      .reasoning_len = CONV[k].reasoning_len};
                kchat_message *m2 = malloc((k + 1) * sizeof *m2);
                memcpy(m2, CONV, k * sizeof *m2);
                m2[k] = kept;
                kchat_rendering K;
                if (kchat_parser_closing(pp, tk, &cl, &ncl) || kchat_render(tk, m2, k + 1, &on, &K, &err)) die("closing");
                if (K.n_ids != P.n_ids + j + ncl || memcmp(K.ids, P.ids, P.n_ids * sizeof *K.ids) ||
                    memcmp(K.ids + P.n_ids, rr.ids, j * sizeof *K.ids) || memcmp(K.ids + P.n_ids + j, cl, ncl * sizeof *cl)) {
                    closing_ok = 0;
                    printf("# %s: closing a reply cut at its first channel's end, message %zu (thinking %d), differs\n", label, k, thinking);
                }
                free(cl);
                free(m2);
                kchat_rendering_free(&K);
                kchat_parser_free(pp);
            }
            kchat_rendering_free(&P);
            kchat_rendering_free(&R);
            kchat_rendering_free(&C);
        }
        kchat_rendering_free(&full);
    }
    CHECK(ok, "prefix property (%s): render(turns before the reply) + reply as generated + render_continue == render(all), "
              "thinking on and off", label);
    CHECK(parsed_ok, "each assistant turn, as the model would generate it, parses back to its reasoning, content and calls (%s)", label);
    if (tk) CHECK(closing_ok, "kchat_parser_closing completes a cut reply to the rendering of what was kept (%s)", label);
}

/* The preamble: the header (tools, effort) and the system messages that open the conversation,
 * a prefix of every rendering that shares them (the prefix cache keeps the state there). */
static void test_preamble(const ktok *tk)
{
    static const kchat_message two_sys[] = {
        {.role = KCHAT_SYSTEM, .content = "Be brief.", .content_len = 9},
        {.role = KCHAT_SYSTEM, .content = "Use metric units.", .content_len = 17},
        {.role = KCHAT_USER, .content = "Hi", .content_len = 2},
        {.role = KCHAT_SYSTEM, .content = "Late.", .content_len = 5},
    };
    static const kchat_message user_first[] = {
        {.role = KCHAT_USER, .content = "Hi", .content_len = 2},
        {.role = KCHAT_SYSTEM, .content = "Late.", .content_len = 5},
    };
    krun_err err;
    int ok = 1;
    for (int v = 0; v < 4; v++) {
        kchat_options o = opts(v & 1, KCHAT_EFFORT_LOW), bare = o;
        kchat_rendering full, uf, head, sys, cont;
        if (v & 2) o.tools_json = bare.tools_json = "[{\"type\":\"function\",\"function\":{\"name\":\"lookup\"}}]";
        bare.add_generation_prompt = 0;
        if (kchat_render(tk, two_sys, 4, &o, &full, &err) || kchat_render(tk, user_first, 2, &o, &uf, &err) ||
            kchat_render(tk, two_sys, 2, &bare, &sys, &err) || kchat_render(tk, two_sys, 0, &bare, &head, &err) ||
            kchat_render_continue(tk, two_sys, 4, 2, &o, &cont, &err))
            die(err.msg);
        ok &= full.n_preamble == sys.n_ids && !memcmp(full.ids, sys.ids, sys.n_ids * sizeof *sys.ids) && sys.n_ids < full.n_ids;
        /* (no memcmp of 0 ids: an empty rendering's ids may be NULL) */
        ok &= uf.n_preamble == head.n_ids && (!head.n_ids || !memcmp(uf.ids, head.ids, head.n_ids * sizeof *head.ids));
        ok &= cont.n_preamble == 0 && (v ? head.n_ids > 0 : head.n_ids == 0);
        kchat_rendering_free(&full);
        kchat_rendering_free(&uf);
        kchat_rendering_free(&sys);
        kchat_rendering_free(&head);
        kchat_rendering_free(&cont);
    }
    CHECK(ok, "n_preamble: the tool declaration, the effort message and the leading system messages (not a later one), a prefix "
              "of the rendering; the header alone when a user message comes first; 0 in a continuation (thinking on and off, tools or not)");
}

/* ------------------------------------------------------------------------------------------ */
/* the golden vectors and id-level checks                                                     */

static void test_vectors(const ktok *tk, const char *path)
{
    size_t len;
    char *buf = check_read_file(path, &len);
    if (!buf) { SKIP("chat_vectors.jsonl: cannot read %s", path); return; }
    int lines = 0, text_ok = 0, ids_ok = 0;
    for (char *p = buf, *e; p < buf + len; p = e + 1) {
        e = memchr(p, '\n', (size_t)(buf + len - p));
        if (!e) e = buf + len;
        if (e == p) continue;
        lines++;
        json_t *v = json_loadb(p, (size_t)(e - p), 0, NULL);
        json_t *o = json_object_get(v, "options"), *req = json_object(), *kw = json_object();
        json_object_set(req, "messages", json_object_get(v, "messages"));
        json_t *th = json_object_get(o, "thinking"), *ef = json_object_get(o, "thinking_effort");
        json_object_set_new(kw, "thinking", json_boolean(!th || json_is_true(th)));
        json_object_set(kw, "thinking_effort", ef ? ef : json_null());
        json_object_set_new(req, "chat_template_kwargs", kw);
        if (json_object_get(o, "tools")) json_object_set(req, "tools", json_object_get(o, "tools"));
        char *body = json_dumps(req, JSON_COMPACT);
        oai_chat_request r;
        oai_error oe;
        const char *name = json_string_value(json_object_get(v, "name"));
        if (!body || oai_parse_chat_request(body, strlen(body), &r, &oe)) {
            printf("# %s: request not accepted: %s\n", name, body ? oe.message : "?");
        } else {
            json_t *agp = json_object_get(o, "add_generation_prompt");
            if (agp && json_is_false(agp)) r.chat.add_generation_prompt = 0;
            kchat_rendering out;
            krun_err err;
            if (kchat_render(tk, r.messages, r.n_messages, &r.chat, &out, &err)) {
                printf("# %s: %s\n", name, err.msg);
            } else {
                json_t *wt = json_object_get(v, "text"), *wi = json_object_get(v, "ids");
                int t_ok = json_string_length(wt) == out.text_len && !memcmp(json_string_value(wt), out.text, out.text_len);
                int i_ok = json_array_size(wi) == out.n_ids;
                for (size_t k = 0; i_ok && k < out.n_ids; k++) i_ok = json_integer_value(json_array_get(wi, k)) == out.ids[k];
                text_ok += t_ok;
                ids_ok += i_ok;
                CHECK(t_ok && i_ok, "chat vector %s: text and %zu ids exact", name, out.n_ids);
                kchat_rendering_free(&out);
            }
            oai_chat_request_free(&r);
        }
        free(body);
        json_decref(req);
        json_decref(v);
    }
    free(buf);
    CHECK(lines == 11 && text_ok == 11 && ids_ok == 11, "chat_vectors.jsonl: %d vectors, %d texts and %d id lists exact", lines,
          text_ok, ids_ok);
}

static void test_ids(const ktok *tk)
{
    /* a model that writes marker characters as text: they stay content */
    int32_t *t1, *t2;
    size_t n1, n2;
    const char *a = "Use <|open|> and <|end_of_msg|>";
    if (ktok_encode(tk, a, strlen(a), 0, &t1, &n1) || ktok_encode(tk, "ok", 2, 0, &t2, &n2)) die("encode");
    int32_t CL = ktok_find_special(tk, KCHAT_CLOSE), SP = ktok_find_special(tk, KCHAT_SEP),
            EOM = ktok_find_special(tk, KCHAT_END_OF_MSG), EOS = ktok_find_special(tk, "[EOS]");
    int32_t *ids = malloc((n1 + n2 + 32) * sizeof *ids), *resp, *msg;
    size_t n = 0, nr, nm;
    if (ktok_encode(tk, "response", 8, 0, &resp, &nr) || ktok_encode(tk, "message", 7, 0, &msg, &nm)) die("encode");
    memcpy(ids, t1, n1 * sizeof *ids);
    n = n1;
    ids[n++] = EOS;                      /* another special id: not text of the reply */
    ids[n++] = CL;
    memcpy(ids + n, resp, nr * sizeof *ids);
    n += nr;
    ids[n++] = SP;
    ids[n++] = CL;
    memcpy(ids + n, msg, nm * sizeof *ids);
    n += nm;
    ids[n++] = SP;
    ids[n++] = EOM;
    kchat_reply r;
    CHECK(kchat_parse_ids(tk, ids, n, 0, &r) == 0 && !strcmp(r.content, a) && r.where == KCHAT_AT_END && r.malformed == 1,
          "ids: marker strings generated as text pieces stay content; [EOS] inside a reply is dropped (malformed 1)");
    kchat_reply_free(&r);
    /* streamed id by id: UTF-8 split across tokens is never emitted half */
    const char *cjk = "\xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB";
    int32_t *c;
    size_t nc;
    if (ktok_encode(tk, cjk, strlen(cjk), 0, &c, &nc)) die("encode");
    kchat_parser *p = kchat_parser_new(tk, 1);
    sink s = {0};
    for (size_t i = 0; i < nc; i++) kchat_parser_feed_id(p, c[i], sink_event, &s);
    kchat_parser_finish(p, sink_event, &s);
    CHECK(!strcmp(S(&s.reasoning), cjk) && s.bad_delta == 0 && nc > 4,
          "ids streamed one by one (%zu ids for two CJK characters, a space and an emoji ZWJ sequence): deltas are whole UTF-8", nc);
    sink_free(&s);
    kchat_parser_free(p);
    free(c);
    free(t1);
    free(t2);
    free(resp);
    free(msg);
    free(ids);
}

int main(void)
{
    test_py_json();
    test_render_rules();
    test_parse_text();
    test_prefix(NULL, "text");

    const char *sh = check_shared_dir();
    char path[1024];
    snprintf(path, sizeof path, "%s/fixtures/tokenizer/tiktoken.model", sh);
    size_t rl;
    char *rf = check_read_file(path, &rl);
    if (!rf) {
        SKIP("chat vectors, id-level parsing and the prefix property on ids: %s is absent", path);
        return check_exit();
    }
    ktok_special *sp;
    size_t nsp;
    krun_err err;
    if (ktok_specials_builtin("k3", &sp, &nsp)) die("specials");
    ktok *tk = ktok_load(rf, rl, sp, nsp, &err);
    ktok_specials_free(sp, nsp);
    free(rf);
    if (!tk) die(err.msg);
    snprintf(path, sizeof path, "%s/fixtures/chat/chat_vectors.jsonl", sh);
    test_vectors(tk, path);
    test_ids(tk);
    test_prefix(tk, "ids");
    test_preamble(tk);
    ktok_free(tk);
    return check_exit();
}

/* OpenAI request parsing and response building (run/api/oai.h): every field, every error (status,
 * param, code), responses and SSE chunks read back with jansson, a client-side reassembly of a
 * stream, and random mutations of valid bodies (the parsers take arbitrary bytes). */
#include "check.h"
#include "run/text/jsontext.h"
#include "run/api/oai.h"

#include <jansson.h>
#include <stdint.h>
#include <string.h>

static int parse_chat(const char *body, oai_chat_request *r, oai_error *e)
{
    return oai_parse_chat_request(body, strlen(body), r, e);
}

static void test_chat_fields(void)
{
    const char *body =
        "{\"model\":\"kimi-k3\",\"messages\":["
        "{\"role\":\"developer\",\"content\":\"Be brief.\"},"
        "{\"role\":\"user\",\"name\":\"ann\",\"content\":[{\"type\":\"text\",\"text\":\"Hello \"},{\"type\":\"text\",\"text\":\"there\"}]},"
        "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"think\",\"tool_calls\":[{\"id\":\"call_9\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_9\",\"content\":\"42\"},"
        "{\"role\":\"assistant\",\"content\":\"ok\",\"reasoning\":\"r2\"}],"
        "\"max_tokens\":5,\"max_completion_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,\"seed\":-12,"
        "\"stop\":[\"\\n\\n\",\"END\"],\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\",\"parameters\":{\"type\":\"object\"}}}],"
        "\"tool_choice\":\"required\",\"reasoning_effort\":\"low\",\"n\":1,\"frequency_penalty\":0,\"logprobs\":false,"
        "\"unknown_field\":{\"ignored\":true}}";
    oai_chat_request r;
    oai_error e;
    int rc = parse_chat(body, &r, &e);
    CHECK(rc == 0, "a full chat request parses (%s)", rc ? e.message : "ok");
    if (rc) return;
    const kchat_message *m = r.messages;
    CHECK(r.n_messages == 5 && m[0].role == KCHAT_SYSTEM && !strcmp(m[0].content, "Be brief.") && m[1].role == KCHAT_USER &&
          !strcmp(m[1].name, "ann") && m[1].content_len == 11 && !memcmp(m[1].content, "Hello there", 11),
          "messages: developer -> system, name, text parts joined");
    CHECK(m[2].role == KCHAT_ASSISTANT && !m[2].content && !strcmp(m[2].reasoning, "think") && m[2].n_tool_calls == 1 &&
          !strcmp(m[2].tool_calls[0].id, "call_9") && !strcmp(m[2].tool_calls[0].name, "f") &&
          !strcmp(m[2].tool_calls[0].arguments, "{\"x\":1}") && m[3].role == KCHAT_TOOL && !strcmp(m[3].tool_call_id, "call_9") &&
          !strcmp(m[3].content, "42") && !strcmp(m[4].reasoning, "r2"),
          "assistant: null content with tool_calls, reasoning_content / reasoning; tool: tool_call_id");
    CHECK(!strcmp(r.s.model, "kimi-k3") && r.s.max_tokens == 7 && r.s.has_temperature && r.s.temperature == 0.5 &&
          r.s.has_top_p && r.s.top_p == 0.9 && r.s.has_seed && r.s.seed == -12 && r.s.n_stop == 2 &&
          !strcmp(r.s.stop[0], "\n\n") && !strcmp(r.s.stop[1], "END") && r.s.stream && r.s.include_usage,
          "sampling: model, max_completion_tokens over max_tokens, temperature, top_p, seed, stop list, stream, include_usage");
    CHECK(r.chat.thinking && r.chat.effort == KCHAT_EFFORT_LOW && r.chat.tool_choice == KCHAT_TOOL_CHOICE_REQUIRED &&
          r.chat.tools_json && strstr(r.chat.tools_json, "\"name\":\"f\"") && r.chat.add_generation_prompt,
          "chat options: reasoning_effort low, tools, tool_choice required, generation prompt");
    oai_chat_request_free(&r);

    rc = parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":\"STOP\"}", &r, &e);
    CHECK(rc == 0 && r.n_messages == 1 && r.s.max_tokens == -1 && !r.s.has_temperature && r.s.temperature == 1 &&
          r.s.top_p == 1 && !r.s.stream && r.s.n_stop == 1 && !strcmp(r.s.stop[0], "STOP") && !r.s.model &&
          r.chat.thinking && r.chat.effort == KCHAT_EFFORT_MAX && !r.chat.tools_json,
          "defaults: no max_tokens, temperature 1, top_p 1, thinking on with effort max; stop as one string");
    if (!rc) oai_chat_request_free(&r);

    static const struct { const char *v; int thinking; kchat_effort effort; } eff[] = {
        {"none", 0, KCHAT_EFFORT_NONE}, {"minimal", 1, KCHAT_EFFORT_LOW}, {"low", 1, KCHAT_EFFORT_LOW},
        {"medium", 1, KCHAT_EFFORT_HIGH}, {"high", 1, KCHAT_EFFORT_HIGH}, {"xhigh", 1, KCHAT_EFFORT_MAX}, {"max", 1, KCHAT_EFFORT_MAX}};
    int ok = 1;
    for (size_t i = 0; i < sizeof eff / sizeof *eff; i++) {
        char b[200];
        snprintf(b, sizeof b, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"%s\"}", eff[i].v);
        if (parse_chat(b, &r, &e)) { ok = 0; continue; }
        if (r.chat.thinking != eff[i].thinking || (eff[i].thinking && r.chat.effort != eff[i].effort)) ok = 0;
        oai_chat_request_free(&r);
    }
    CHECK(ok, "reasoning_effort none/minimal/low/medium/high/xhigh/max -> off/low/low/high/high/max/max");
    rc = parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"high\","
                    "\"chat_template_kwargs\":{\"thinking\":true,\"thinking_effort\":null}}", &r, &e);
    CHECK(rc == 0 && r.chat.thinking && r.chat.effort == KCHAT_EFFORT_NONE,
          "chat_template_kwargs thinking_effort null: thinking without an effort message (overrides reasoning_effort)");
    if (!rc) oai_chat_request_free(&r);
    rc = parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"thinking\":false}}", &r, &e);
    CHECK(rc == 0 && !r.chat.thinking, "chat_template_kwargs thinking false");
    if (!rc) oai_chat_request_free(&r);
    /* issue 25.8: tool_choice without tools: "required" is a 400 (as OpenAI answers), "auto" and "none" are accepted */
    rc = parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}", &r, &e);
    CHECK(rc == -1 && e.status == 400 && !strcmp(e.param, "tool_choice") && strstr(e.message, "needs at least one tool"),
          "tool_choice \"required\" without tools: 400 naming tool_choice (%s)", rc ? e.message : "accepted");
    if (!rc) oai_chat_request_free(&r);
    ok = 1;
    for (int k = 0; k < 2; k++) {
        char b[200];
        snprintf(b, sizeof b, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"%s\"}", k ? "none" : "auto");
        if (parse_chat(b, &r, &e)) { ok = 0; continue; }
        ok &= r.chat.tool_choice == (k ? KCHAT_TOOL_CHOICE_NONE : KCHAT_TOOL_CHOICE_AUTO) && !r.chat.tools_json;
        oai_chat_request_free(&r);
    }
    CHECK(ok, "tool_choice \"auto\" and \"none\" without tools are accepted");
    /* structured output (issue 20): response_format and a named tool_choice are parsed here, compiled by kchat_constraint */
    rc = parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
                    "{\"name\":\"r\",\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"integer\"},\"a\":{\"type\":\"string\"}}}}}}", &r, &e);
    CHECK(rc == 0 && r.chat.format == KCHAT_FORMAT_JSON_SCHEMA && r.chat.format_schema &&
          !strcmp(r.chat.format_schema, "{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"integer\"},\"a\":{\"type\":\"string\"}}}"),
          "response_format json_schema: the schema kept as JSON text, its properties in the request's order");
    if (!rc) oai_chat_request_free(&r);
    rc = parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"r\"}}}", &r, &e);
    CHECK(rc == 0 && r.chat.format == KCHAT_FORMAT_JSON_SCHEMA && !strcmp(r.chat.format_schema, "{}"), "json_schema without a schema: {} (any JSON value)");
    if (!rc) oai_chat_request_free(&r);
    rc = parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_object\"}}", &r, &e);
    CHECK(rc == 0 && r.chat.format == KCHAT_FORMAT_JSON_OBJECT, "response_format json_object");
    if (!rc) oai_chat_request_free(&r);
    rc = parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
                    "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"strict\":true}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}",
                    &r, &e);
    CHECK(rc == 0 && r.chat.tool_choice == KCHAT_TOOL_CHOICE_NAMED && !strcmp(r.chat.tool_name, "g") && strstr(r.chat.tools_json, "\"strict\":true"),
          "tool_choice naming a declared function; strict kept in the tools");
    if (!rc) oai_chat_request_free(&r);
    rc = parse_chat("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"g\",\"arguments\":{\"k\":[1]}}}]}]}",
                    &r, &e);
    CHECK(rc == 0 && r.messages[0].n_tool_calls == 1 && !strcmp(r.messages[0].tool_calls[0].arguments, "{\"k\":[1]}") &&
          !r.messages[0].tool_calls[0].id, "tool-call arguments given as an object are accepted (as JSON text)");
    if (!rc) oai_chat_request_free(&r);
}

static void test_chat_errors(void)
{
    static const struct { const char *body; int status; const char *param, *code, *msg; } bad[] = {
        {"", 400, "", "invalid_json", "not valid JSON"},
        {"{\"messages\": [", 400, "", "invalid_json", "not valid JSON"},
        {"[1,2]", 400, "", "invalid_json", "JSON object"},
        {"\"\xff\"", 400, "", "invalid_json", "not valid JSON"},
        {"{}", 400, "messages", "missing_required_parameter", "messages is required"},
        {"{\"messages\":{}}", 400, "messages", "invalid_type", "must be an array"},
        {"{\"messages\":[]}", 400, "messages", "invalid_value", "must not be empty"},
        {"{\"messages\":[7]}", 400, "messages[0]", "invalid_type", "must be an object"},
        {"{\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0].role", "missing_required_parameter", "required"},
        {"{\"messages\":[{\"role\":5,\"content\":\"x\"}]}", 400, "messages[0].role", "invalid_type", "a string"},
        {"{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "messages[0].role", "invalid_value", "unknown role"},
        {"{\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0].content", "missing_required_parameter", "required"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":3}]}", 400, "messages[0].content", "invalid_type", "content parts"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}", 400,
         "messages[0].content[0]", "unsupported_value", "only text"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", 400, "messages[0].content[0]", "invalid_type", "text"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":1}]}", 400, "messages[0].name", "invalid_type", "a string"},
        {"{\"messages\":[{\"role\":\"assistant\"}]}", 400, "messages[0].content", "missing_required_parameter", "required"},
        {"{\"messages\":[{\"role\":\"assistant\",\"content\":\"a\",\"reasoning_content\":1}]}", 400,
         "messages[0].reasoning_content", "invalid_type", "a string"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":{}}]}", 400, "messages[0].tool_calls", "invalid_type", "an array"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"code\",\"function\":{\"name\":\"f\"}}]}]}", 400,
         "messages[0].tool_calls[0]", "invalid_value", "\"function\""},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{}]}]}", 400, "messages[0].tool_calls[0].function",
         "missing_required_parameter", "required"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}]}", 400,
         "messages[0].tool_calls[0].function.name", "missing_required_parameter", "non-empty"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":5}}]}]}", 400,
         "messages[0].tool_calls[0].function.arguments", "invalid_type", "JSON"},
        {"{\"messages\":[{\"role\":\"tool\",\"content\":\"r\"}]}", 400, "messages[0].tool_call_id", "missing_required_parameter", "required"},
        /* a NUL inside a string the parser uses as a C string would cut it short ("user\u0000x"
         * read as "user"): refused, naming the field */
        {"{\"messages\":[{\"role\":\"user\\u0000x\",\"content\":\"x\"}]}", 400, "messages[0].role", "invalid_value", "NUL"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":\"a\\u0000b\"}]}", 400, "messages[0].name", "invalid_value", "NUL"},
        {"{\"messages\":[{\"role\":\"tool\",\"content\":\"r\",\"tool_call_id\":\"c\\u0000\"}]}", 400, "messages[0].tool_call_id",
         "invalid_value", "NUL"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\\u00001\",\"function\":{\"name\":\"f\"}}]}]}", 400,
         "messages[0].tool_calls[0].id", "invalid_value", "NUL"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\\u0000g\"}}]}]}", 400,
         "messages[0].tool_calls[0].function.name", "invalid_value", "NUL"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{}\\u0000\"}}]}]}", 400,
         "messages[0].tool_calls[0].function.arguments", "invalid_value", "NUL"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\\u0000\",\"text\":\"x\"}]}]}", 400,
         "messages[0].content[0]", "unsupported_value", "only text"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\\u0000!\"}}]}",
         400, "tools[0].function.name", "invalid_value", "NUL"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\\u0000\",\"function\":{\"name\":\"f\"}}]}",
         400, "tools[0]", "invalid_value", "\"function\""},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"auto\\u0000x\"}", 400, "tool_choice", "invalid_value", "NUL"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"high\\u0000\"}", 400, "reasoning_effort",
         "invalid_value", "NUL"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"text\\u0000\"}}", 400,
         "response_format.type", "invalid_value", "must be \"text\""},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"thinking_effort\":\"max\\u0000\"}}", 400,
         "chat_template_kwargs.thinking_effort", "invalid_value", "must be"},
        {"{\"messages\":[{\"role\":\"tool\",\"content\":\"r\",\"tool_call_id\":9}]}", 400, "messages[0].tool_call_id", "invalid_type", "string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"model\":3}", 400, "model", "invalid_type", "a string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", 400, "max_tokens", "invalid_value", "at least 1"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":2.5}", 400, "max_tokens", "invalid_type", "an integer"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":-4}", 400, "max_completion_tokens",
         "invalid_value", "at least 1"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":2.5}", 400, "temperature", "invalid_value", "between 0 and 2"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}", 400, "temperature", "invalid_type", "a number"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":1.5}", 400, "top_p", "invalid_value", "between 0 and 1"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"seed\":1.5}", 400, "seed", "invalid_type", "an integer"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":5}", 400, "stop", "invalid_type", "array of strings"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop", "invalid_value", "at most 4"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\",3]}", 400, "stop[1]", "invalid_type", "a string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"\"]}", 400, "stop[0]", "invalid_value", "empty"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":\"yes\"}", 400, "stream", "invalid_type", "a boolean"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream_options\":{\"include_usage\":true}}", 400, "stream_options",
         "invalid_value", "stream: true"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true,\"stream_options\":{\"include_usage\":1}}", 400,
         "stream_options.include_usage", "invalid_type", "a boolean"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":17}", 400, "n", "invalid_value", "n must be 1 to 16"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"presence_penalty\":2.5}", 400, "presence_penalty", "invalid_value", "between -2 and 2"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"frequency_penalty\":\"x\"}", 400, "frequency_penalty", "invalid_type", "a number"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"repetition_penalty\":0}", 400, "repetition_penalty", "invalid_value", "more than 0"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":1}", 400, "logprobs", "invalid_type", "a boolean"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", 400, "top_logprobs", "invalid_value", "needs logprobs: true"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}", 400, "top_logprobs", "invalid_value", "0 to 20"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"5\":1}}", 400, "logit_bias", "unsupported_value", "not supported"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}", 400, "tools", "invalid_type", "an array"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\"}]}", 400, "tools[0].function",
         "invalid_type", "an object"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"retrieval\"}]}", 400, "tools[0]", "invalid_value", "\"function\""},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}", 400,
         "tools[0].function.name", "invalid_value", "only a-z"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]}",
         400, "tools[0].function.parameters", "invalid_type", "an object"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
         "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}", 400, "tool_choice.function.name", "invalid_value", "not in tools"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}", 400,
         "tool_choice.function.name", "invalid_value", "not in tools"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
         "\"tool_choice\":{\"type\":\"allowed_tools\"}}", 400, "tool_choice.type", "invalid_value", "\"function\""},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
         "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":7}}}", 400, "tool_choice.function.name", "invalid_type", "a string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":1}}]}",
         400, "tools[0].function.strict", "invalid_type", "a boolean"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
         "\"tool_choice\":\"sometimes\"}", 400, "tool_choice", "invalid_value", "auto"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[],\"tool_choice\":\"required\"}", 400, "tool_choice",
         "invalid_value", "needs at least one tool"},
        /* issue 25.8: without a tools field at all, tool_choice was not looked at (200) */
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}", 400, "tool_choice",
         "invalid_value", "needs at least one tool"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":null,\"tool_choice\":\"required\"}", 400, "tool_choice",
         "invalid_value", "needs at least one tool"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"sometimes\"}", 400, "tool_choice", "invalid_value", "auto"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":5}", 400, "tool_choice", "invalid_type", "a string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"extreme\"}", 400, "reasoning_effort", "invalid_value", "must be"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":1}", 400, "reasoning_effort", "invalid_type", "a string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":[]}", 400, "chat_template_kwargs", "invalid_type", "an object"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"thinking\":\"on\"}}", 400,
         "chat_template_kwargs.thinking", "invalid_type", "a boolean"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"thinking_effort\":\"medium\"}}", 400,
         "chat_template_kwargs.thinking_effort", "invalid_value", "\"low\""},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"xml\"}}", 400,
         "response_format.type", "invalid_value", "\"json_schema\""},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":\"json\"}", 400,
         "response_format", "invalid_type", "an object"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\"}}", 400,
         "response_format.json_schema", "invalid_type", "an object"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":3}}}",
         400, "response_format.json_schema.schema", "invalid_type", "JSON Schema"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"strict\":\"yes\"}}}",
         400, "response_format.json_schema.strict", "invalid_type", "a boolean"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_k\":-2}", 400, "top_k", "invalid_value", "positive count"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_k\":1.5}", 400, "top_k", "invalid_type", "an integer"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"min_p\":2}", 400, "min_p", "invalid_value", "between 0 and 1"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"ignore_eos\":1}", 400, "ignore_eos", "invalid_type", "a boolean"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"return_token_ids\":\"y\"}", 400, "return_token_ids",
         "invalid_type", "a boolean"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"speculative\":65}", 400, "speculative", "invalid_value", "0 (off) to 64"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"speculative\":-1}", 400, "speculative", "invalid_value", "0 (off) to 64"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"speculative\":\"on\"}", 400, "speculative", "invalid_type",
         "a boolean or an integer"},
    };
    int n_ok = 0;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        oai_chat_request r;
        oai_error e;
        memset(&e, 0, sizeof e);
        int rc = parse_chat(bad[i].body, &r, &e);
        char *j = rc ? oai_error_json(&e) : NULL;
        json_t *o = j ? json_loads(j, 0, NULL) : NULL, *x = json_object_get(o, "error");
        const char *param = json_string_value(json_object_get(x, "param")), *code = json_string_value(json_object_get(x, "code"));
        int ok = rc == -1 && e.status == bad[i].status && !strcmp(e.param, bad[i].param) && e.code && !strcmp(e.code, bad[i].code) &&
                 strstr(e.message, bad[i].msg) && x &&
                 !strcmp(json_string_value(json_object_get(x, "type")), "invalid_request_error") &&
                 (bad[i].param[0] ? param && !strcmp(param, bad[i].param) : json_is_null(json_object_get(x, "param"))) &&
                 code && !strcmp(code, bad[i].code) && !strcmp(json_string_value(json_object_get(x, "message")), e.message);
        n_ok += ok;
        if (!ok) printf("# body %s: rc %d status %d param \"%s\" code %s: %s\n", bad[i].body, rc, e.status, e.param,
                        e.code ? e.code : "null", e.message);
        if (!rc) oai_chat_request_free(&r);
        json_decref(o);
        free(j);
    }
    CHECK(n_ok == (int)(sizeof bad / sizeof *bad), "chat requests: %d/%zu bad bodies give 400 with the OpenAI error object "
          "(message, type invalid_request_error, param naming the field, code)", n_ok, sizeof bad / sizeof *bad);
    oai_error e;
    CHECK(oai_check_model(NULL, "k3", &e) == 0 && oai_check_model("k3", "k3", &e) == 0 && oai_check_model("gpt-4", "k3", &e) == -1 &&
          e.status == 404 && !strcmp(e.code, "model_not_found") && !strcmp(e.param, "model"),
          "oai_check_model: absent or equal model ok, another model 404 model_not_found");
}

static void test_completion_requests(void)
{
    oai_completion_request r;
    oai_error e;
    const char *b1 = "{\"model\":\"k3\",\"prompt\":\"Once upon\",\"temperature\":0,\"stream\":true}";
    int rc = oai_parse_completion_request(b1, strlen(b1), 1000, &r, &e);
    CHECK(rc == 0 && r.prompt && !strcmp(r.prompt, "Once upon") && r.prompt_len == 9 && !r.prompt_ids && r.s.max_tokens == 16 &&
          r.s.has_temperature && r.s.temperature == 0 && r.s.stream, "completions: text prompt, max_tokens defaults to 16");
    if (!rc) oai_completion_request_free(&r);
    const char *forms[] = {"{\"prompt\":[\"one\"]}", "{\"prompt\":[5,6,999]}", "{\"prompt\":[[5,6,999]]}"};
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        if (oai_parse_completion_request(forms[i], strlen(forms[i]), 1000, &r, &e)) { ok = 0; continue; }
        if (i == 0) ok &= r.prompt && !strcmp(r.prompt, "one");
        else ok &= r.n_prompt_ids == 3 && r.prompt_ids[0] == 5 && r.prompt_ids[2] == 999 && !r.prompt;
        oai_completion_request_free(&r);
    }
    CHECK(ok, "completions: prompt as [string], [ids], [[ids]]");
    /* found by fuzz_oai: the copy stopped at the NUL, prompt_len did not, and serve tokenized
     * prompt_len bytes past the end of the copy */
    const char *b0 = "{\"prompt\":\"ab\\u0000cd\"}";
    rc = oai_parse_completion_request(b0, strlen(b0), 1000, &r, &e);
    CHECK(rc == 0 && r.prompt_len == 5 && !memcmp(r.prompt, "ab\0cd", 6),
          "completions: a text prompt with a NUL inside is all prompt_len bytes, NUL-terminated");
    if (!rc) oai_completion_request_free(&r);
    const char *b2 = "{\"prompt\":[1],\"top_k\":40,\"min_p\":0.05,\"ignore_eos\":true,\"return_token_ids\":true}";
    rc = oai_parse_completion_request(b2, strlen(b2), 1000, &r, &e);
    CHECK(rc == 0 && r.s.top_k == 40 && r.s.min_p == 0.05 && r.s.ignore_eos && r.s.return_token_ids,
          "extensions as vLLM spells them: top_k, min_p, ignore_eos, return_token_ids");
    if (!rc) oai_completion_request_free(&r);
    const char *b4 = "{\"prompt\":[1],\"presence_penalty\":-1.5,\"frequency_penalty\":0.25,\"repetition_penalty\":1.3,\"logprobs\":5}";
    rc = oai_parse_completion_request(b4, strlen(b4), 1000, &r, &e);
    CHECK(rc == 0 && r.s.presence_penalty == -1.5 && r.s.frequency_penalty == 0.25 && r.s.repetition_penalty == 1.3 &&
          r.s.logprobs && r.s.top_logprobs == 5, "penalties and completions' logprobs: N");
    if (!rc) oai_completion_request_free(&r);
    const char *b6 = "{\"prompt\":[1,2],\"echo\":true,\"max_tokens\":0,\"logprobs\":1,\"stream\":true,\"n\":2}";
    rc = oai_parse_completion_request(b6, strlen(b6), 1000, &r, &e);
    CHECK(rc == 0 && r.echo && r.s.max_tokens == 0 && r.s.logprobs && r.s.top_logprobs == 1 && r.s.stream && r.s.n == 2,
          "echo with max_tokens 0 and logprobs (lm-eval's loglikelihood), streamed, n 2");
    if (!rc) oai_completion_request_free(&r);
    const char *b5 = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":20}";
    oai_chat_request cq;
    rc = oai_parse_chat_request(b5, strlen(b5), &cq, &e);
    CHECK(rc == 0 && cq.s.logprobs && cq.s.top_logprobs == 20 && cq.s.repetition_penalty == 1 && cq.s.presence_penalty == 0,
          "chat logprobs with top_logprobs 20; penalties default to off");
    if (!rc) oai_chat_request_free(&cq);
    const char *b3 = "{\"prompt\":[1],\"top_k\":-1}";
    rc = oai_parse_completion_request(b3, strlen(b3), 1000, &r, &e);
    CHECK(rc == 0 && r.s.top_k == 0 && r.s.min_p == 0 && !r.s.ignore_eos && !r.s.return_token_ids,
          "top_k -1 is off; the extensions default to off");
    if (!rc) oai_completion_request_free(&r);
    {
        /* krun's "speculative": absent or true -> -1 (the server's), false -> 0, an integer as given */
        static const struct { const char *body; long want; } sp[] = {
            {"{\"prompt\":[1]}", -1}, {"{\"prompt\":[1],\"speculative\":true}", -1}, {"{\"prompt\":[1],\"speculative\":false}", 0},
            {"{\"prompt\":[1],\"speculative\":0}", 0}, {"{\"prompt\":[1],\"speculative\":5}", 5}, {"{\"prompt\":[1],\"speculative\":64}", 64}};
        int good = 0;
        for (size_t i = 0; i < sizeof sp / sizeof *sp; i++) {
            rc = oai_parse_completion_request(sp[i].body, strlen(sp[i].body), 1000, &r, &e);
            good += rc == 0 && r.s.speculative == sp[i].want;
            if (!rc) oai_completion_request_free(&r);
        }
        CHECK(good == (int)(sizeof sp / sizeof *sp), "speculative: absent and true the server's, false and 0 off, 5 and 64 as given "
              "(%d of %zu)", good, sizeof sp / sizeof *sp);
    }
    static const struct { const char *body; const char *param, *msg; } bad[] = {
        {"{}", "prompt", "required"},
        {"{\"prompt\":5}", "prompt", "a string"},
        {"{\"prompt\":\"\"}", "prompt", "empty"},
        {"{\"prompt\":[]}", "prompt", "empty"},
        {"{\"prompt\":[\"a\",\"b\"]}", "prompt", "one prompt"},
        {"{\"prompt\":[1,\"a\"]}", "prompt", "prompt[1] must be a token id"},
        {"{\"prompt\":[1,1000]}", "prompt", "token id 1000 at prompt[1] is outside the vocabulary (0..999)"},
        {"{\"prompt\":[-1]}", "prompt", "outside the vocabulary"},
        {"{\"prompt\":\"x\",\"echo\":1}", "echo", "a boolean"},
        {"{\"prompt\":\"x\",\"suffix\":\"y\"}", "suffix", "not supported"},
        {"{\"prompt\":\"x\",\"best_of\":3}", "best_of", "best_of"},
        {"{\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens", "0 only with echo"},
        {"{\"prompt\":\"x\",\"echo\":true,\"max_tokens\":-1}", "max_tokens", "at least 0"},
        {"{\"prompt\":\"x\",\"n\":0}", "n", "n must be 1 to 16"},
        {"{\"prompt\":\"x\",\"logprobs\":21}", "logprobs", "0 to 20"},
        {"{\"prompt\":\"x\",\"logprobs\":true}", "logprobs", "an integer"},
        {"{\"prompt\":\"x\",\"top_logprobs\":2}", "top_logprobs", "logprobs: N"},
        {"{\"prompt\":\"x\",\"top_p\":-1}", "top_p", "between"},
        /* a NUL would cut a stop string or the model name (C strings) short: "\u0000" alone was an
         * empty stop string, which ends every generation at once */
        {"{\"prompt\":\"x\",\"stop\":[\"\\u0000\"]}", "stop[0]", "NUL"},
        {"{\"prompt\":\"x\",\"stop\":\"a\\u0000b\"}", "stop", "NUL"},
        {"{\"prompt\":\"x\",\"model\":\"k3\\u0000x\"}", "model", "NUL"},
        {"not json", "", "not valid JSON"},
    };
    int n_ok = 0;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&e, 0, sizeof e);
        rc = oai_parse_completion_request(bad[i].body, strlen(bad[i].body), 1000, &r, &e);
        int good = rc == -1 && e.status == 400 && !strcmp(e.param, bad[i].param) && strstr(e.message, bad[i].msg);
        n_ok += good;
        if (!good) printf("# completion body %s: rc %d param \"%s\": %s\n", bad[i].body, rc, e.param, e.message);
        if (!rc) oai_completion_request_free(&r);
    }
    CHECK(n_ok == (int)(sizeof bad / sizeof *bad), "completions: %d/%zu bad bodies rejected with the field named", n_ok,
          sizeof bad / sizeof *bad);
}

/* ------------------------------------------------------------------------------------------ */
/* responses                                                                                  */

static json_t *sse_json(const char *chunk)
{
    size_t n = chunk ? strlen(chunk) : 0;
    if (n < 8 || strncmp(chunk, "data: ", 6) || strcmp(chunk + n - 2, "\n\n")) return NULL;
    return json_loadb(chunk + 6, n - 8, 0, NULL);
}

static void test_responses(void)
{
    oai_meta m = {"chatcmpl-1", "kimi-k3", 1700000000};
    kchat_call calls[] = {{"get_weather", "{\"city\":\"Paris\"}"}, {"f", "{}"}};
    const char *ids[] = {"call_a", "call_b"};
    oai_chat_result r = {.content = "Hi \xFF there", .content_len = 10, .reasoning = "hmm", .reasoning_len = 3,
                         .calls = calls, .n_calls = 2, .call_ids = ids, .finish_reason = "tool_calls",
                         .prompt_tokens = 12, .completion_tokens = 30, .cached_tokens = 5};
    char *s = oai_chat_response(&m, &r);
    json_t *o = s ? json_loads(s, 0, NULL) : NULL, *c0 = json_array_get(json_object_get(o, "choices"), 0),
           *msg = json_object_get(c0, "message"), *tc = json_object_get(msg, "tool_calls"), *u = json_object_get(o, "usage");
    CHECK(o && !strcmp(json_string_value(json_object_get(o, "id")), "chatcmpl-1") &&
          !strcmp(json_string_value(json_object_get(o, "object")), "chat.completion") &&
          json_integer_value(json_object_get(o, "created")) == 1700000000 &&
          !strcmp(json_string_value(json_object_get(o, "model")), "kimi-k3") &&
          json_integer_value(json_object_get(c0, "index")) == 0 &&
          !strcmp(json_string_value(json_object_get(c0, "finish_reason")), "tool_calls") &&
          !strcmp(json_string_value(json_object_get(msg, "role")), "assistant") &&
          !strcmp(json_string_value(json_object_get(msg, "content")), "Hi \xEF\xBF\xBD there") &&
          !strcmp(json_string_value(json_object_get(msg, "reasoning_content")), "hmm") && json_array_size(tc) == 2 &&
          !strcmp(json_string_value(json_object_get(json_array_get(tc, 0), "id")), "call_a") &&
          !strcmp(json_string_value(json_object_get(json_array_get(tc, 0), "type")), "function") &&
          !strcmp(json_string_value(json_object_get(json_object_get(json_array_get(tc, 0), "function"), "name")), "get_weather") &&
          !strcmp(json_string_value(json_object_get(json_object_get(json_array_get(tc, 0), "function"), "arguments")), "{\"city\":\"Paris\"}") &&
          json_integer_value(json_object_get(u, "prompt_tokens")) == 12 && json_integer_value(json_object_get(u, "completion_tokens")) == 30 &&
          json_integer_value(json_object_get(u, "total_tokens")) == 42 &&
          json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")) == 5,
          "chat.completion: id, object, created, model, message (content with U+FFFD for a bad byte, reasoning_content, "
          "tool_calls), finish_reason, usage (with prompt_tokens_details.cached_tokens)");
    json_decref(o);
    free(s);
    oai_chat_result r2 = {.content = "", .content_len = 0, .calls = calls, .n_calls = 1, .call_ids = ids, .finish_reason = "tool_calls"};
    s = oai_chat_response(&m, &r2);
    o = s ? json_loads(s, 0, NULL) : NULL;
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    CHECK(o && json_is_null(json_object_get(msg, "content")) && !json_object_get(msg, "reasoning_content"),
          "tool calls without text: content null; no reasoning_content key without reasoning");
    json_decref(o);
    free(s);

    s = oai_completion_response(&m, "text", 4, "length", 3, 4, 2);
    o = s ? json_loads(s, 0, NULL) : NULL;
    c0 = json_array_get(json_object_get(o, "choices"), 0);
    CHECK(o && !strcmp(json_string_value(json_object_get(o, "object")), "text_completion") &&
          !strcmp(json_string_value(json_object_get(c0, "text")), "text") &&
          !strcmp(json_string_value(json_object_get(c0, "finish_reason")), "length") &&
          json_integer_value(json_object_get(json_object_get(o, "usage"), "total_tokens")) == 7 &&
          json_integer_value(json_object_get(json_object_get(json_object_get(o, "usage"), "prompt_tokens_details"), "cached_tokens")) == 2,
          "text_completion: text, finish_reason, usage (cached_tokens)");
    json_decref(o);
    free(s);

    s = oai_models_response("kimi-k3", 5, "krun");
    o = s ? json_loads(s, 0, NULL) : NULL;
    json_t *d0 = json_array_get(json_object_get(o, "data"), 0);
    CHECK(o && !strcmp(json_string_value(json_object_get(o, "object")), "list") &&
          !strcmp(json_string_value(json_object_get(d0, "id")), "kimi-k3") &&
          !strcmp(json_string_value(json_object_get(d0, "object")), "model") &&
          !strcmp(json_string_value(json_object_get(d0, "owned_by")), "krun"), "models list");
    json_decref(o);
    free(s);
}

/* A client's view: reassemble a stream of chunks into the message the non-streaming reply would give. */
typedef struct {
    const oai_meta *m;
    kbuf content, reasoning, args[4], sse;
    char names[4][64], ids[4][64];
    int n_chunks, bad;
} client;

static void client_chunk(client *c, char *chunk)
{
    json_t *o = sse_json(chunk);
    if (!o || strcmp(json_string_value(json_object_get(o, "object")), "chat.completion.chunk") ||
        strcmp(json_string_value(json_object_get(o, "id")), c->m->id)) c->bad++;
    kbuf_puts(&c->sse, chunk ? chunk : "");
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0), *d = json_object_get(ch, "delta");
    json_t *x;
    if ((x = json_object_get(d, "content"))) kbuf_puts(&c->content, json_string_value(x));
    if ((x = json_object_get(d, "reasoning_content"))) kbuf_puts(&c->reasoning, json_string_value(x));
    json_t *tc = json_array_get(json_object_get(d, "tool_calls"), 0);
    if (tc) {
        json_int_t i = json_integer_value(json_object_get(tc, "index"));
        json_t *f = json_object_get(tc, "function");
        if (i < 0 || i > 3) c->bad++;
        else {
            if ((x = json_object_get(tc, "id"))) snprintf(c->ids[i], 64, "%s", json_string_value(x));
            if ((x = json_object_get(f, "name"))) snprintf(c->names[i], 64, "%s", json_string_value(x));
            if ((x = json_object_get(f, "arguments"))) kbuf_puts(&c->args[i], json_string_value(x));
        }
    }
    c->n_chunks++;
    json_decref(o);
    free(chunk);
}

static int client_event(void *ctx, const kchat_event *ev)
{
    client *c = ctx;
    static const char *const call_ids[] = {"call_0", "call_1", "call_2", "call_3"};
    int none;
    char *s = oai_sse_chat_event(c->m, ev, call_ids[ev->index & 3], &none);
    if (!none) client_chunk(c, s);
    return 0;
}

static void test_stream(void)
{
    const char *reply = "Plan.<|close|>think<|sep|><|open|>response<|sep|>Calling \xE2\x9C\x93<|close|>response<|sep|>"
                        "<|open|>tools<|sep|><|open|>call tool=\"lookup\" index=\"1\"<|sep|>"
                        "<|open|>argument key=\"q\" type=\"string\"<|sep|>K3<|close|>argument<|sep|><|close|>call<|sep|>"
                        "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";
    oai_meta m = {"chatcmpl-s", "kimi-k3", 1};
    client c = {.m = &m};
    client_chunk(&c, oai_sse_chat_role(&m));
    kchat_parser *p = kchat_parser_new(NULL, 1);
    for (size_t i = 0, n = strlen(reply); i < n; i += 3) kchat_parser_feed_text(p, reply + i, n - i < 3 ? n - i : 3, client_event, &c);
    kchat_parser_finish(p, client_event, &c);
    const char *fr = kchat_finish_reason(kchat_parser_where(p), kchat_parser_n_calls(p));
    client_chunk(&c, oai_sse_chat_finish(&m, fr));
    char *u = oai_sse_usage(&m, 1, 10, 20, 0);
    json_t *uo = sse_json(u);
    kchat_parser_free(p);
    kchat_reply whole;
    kchat_parse_text(reply, strlen(reply), 1, &whole);
    CHECK(c.bad == 0 && !strcmp(c.content.p, whole.content) && !strcmp(c.reasoning.p, whole.reasoning) &&
          !strcmp(c.names[0], "lookup") && !strcmp(c.ids[0], "call_0") && c.args[0].p && !strcmp(c.args[0].p, whole.calls[0].arguments) &&
          !strcmp(fr, "tool_calls") && strstr(c.sse.p, "\"finish_reason\":\"tool_calls\"") &&
          strstr(c.sse.p, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}") && !strstr(c.sse.p, "<|") &&
          !strstr(c.sse.p, "response<") &&
          json_array_size(json_object_get(uo, "choices")) == 0 &&
          json_integer_value(json_object_get(json_object_get(uo, "usage"), "total_tokens")) == 30 &&
          !strcmp(OAI_SSE_DONE, "data: [DONE]\n\n"),
          "stream: role chunk, reasoning_content and content deltas, a tool call (id, name, then arguments), finish chunk, "
          "usage chunk with empty choices, [DONE]; a client reassembles exactly the non-streaming reply (%d chunks)", c.n_chunks);
    kchat_reply_free(&whole);
    json_decref(uo);
    free(u);
    kbuf_free(&c.content);
    kbuf_free(&c.reasoning);
    kbuf_free(&c.sse);
    for (int i = 0; i < 4; i++) kbuf_free(&c.args[i]);
    char *k = oai_sse_completion(&m, "ab", 2, NULL), *kf = oai_sse_completion(&m, "", 0, "stop");
    json_t *ko = sse_json(k), *kfo = sse_json(kf);
    CHECK(ko && kfo && !strcmp(json_string_value(json_object_get(json_array_get(json_object_get(ko, "choices"), 0), "text")), "ab") &&
          json_is_null(json_object_get(json_array_get(json_object_get(ko, "choices"), 0), "finish_reason")) &&
          !strcmp(json_string_value(json_object_get(json_array_get(json_object_get(kfo, "choices"), 0), "finish_reason")), "stop"),
          "completion chunks: text with finish_reason null, then the final one");
    json_decref(ko);
    json_decref(kfo);
    free(k);
    free(kf);
}

/* ------------------------------------------------------------------------------------------ */
/* arbitrary bytes                                                                            */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
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
        "{\"model\":\"k\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"u\"}]},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\","
        "\"arguments\":\"{\\\"a\\\":[1,{\\\"b\\\":null}]}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c\",\"content\":\"r\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],\"tool_choice\":\"auto\","
        "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"stop\":[\"x\"],\"max_tokens\":9,\"reasoning_effort\":\"high\"}",
        "{\"prompt\":[[1,2,3]],\"max_tokens\":4,\"temperature\":0.2,\"seed\":3}",
    };
    static const char tokens[] = "{}[]\":,0123456789.-+eEtrufalsn\\ \xff\xc3\xa9\x00";
    int iters = 0, accepted = 0, bad = 0;
    krun_err ke = {0, ""};
    char *err = ke.msg;
    for (int it = 0; it < 20000; it++) {
        const char *sd = seeds[it & 1];
        size_t n = strlen(sd);
        char buf[1200];
        memcpy(buf, sd, n);
        int edits = 1 + (int)rnd(4);
        for (int k = 0; k < edits; k++) {
            size_t at = rnd((uint32_t)n + 1);
            switch (rnd(3)) {
            case 0: if (n) buf[at < n ? at : n - 1] = tokens[rnd(sizeof tokens - 1)]; break;    /* replace */
            case 1: if (at < n) { memmove(buf + at, buf + at + 1, n - at - 1); n--; } break; /* delete */
            default: if (n + 1 < sizeof buf) { memmove(buf + at + 1, buf + at, n - at); buf[at] = tokens[rnd(sizeof tokens - 1)]; n++; }
            }
        }
        if (rnd(10) == 0) n = rnd((uint32_t)n + 1);   /* truncate */
        oai_error e;
        memset(&e, 0, sizeof e);
        iters++;
        if (it & 1) {
            oai_completion_request r;
            if (oai_parse_completion_request(buf, n, 100, &r, &e) == 0) { accepted++; oai_completion_request_free(&r); }
            else if (e.status != 400 || !e.message[0]) bad++;
        } else {
            oai_chat_request r;
            if (oai_parse_chat_request(buf, n, &r, &e) == 0) {
                accepted++;
                /* whatever parses must render (or fail with a message) */
                kchat_rendering out;
                if (kchat_render(NULL, r.messages, r.n_messages, &r.chat, &out, &ke) == 0) kchat_rendering_free(&out);
                else if (!err[0]) bad++;
                oai_chat_request_free(&r);
            } else if (e.status != 400 || !e.message[0]) bad++;
            /* the reply parser takes any text */
            kchat_reply rep;
            if (kchat_parse_text(buf, n, it & 2, &rep) == 0) kchat_reply_free(&rep);
            else bad++;
        }
        bad += oai_fuzz_one((const uint8_t *)buf, n);   /* the fuzzing entry point on the same input */
        if (!accepted && it > 1000) break;
        if (e.status) {
            char *j = oai_error_json(&e);
            json_t *o = j ? json_loads(j, 0, NULL) : NULL;
            if (!o) bad++;
            json_decref(o);
            free(j);
        }
    }
    CHECK(bad == 0 && accepted > 100, "%d mutated bodies (random edits, truncation, invalid UTF-8, NUL): %d accepted, the "
          "rest 400 with a message and a valid error object; the accepted ones render; the reply parser takes them all; "
          "oai_fuzz_one finds nothing",
          iters, accepted);
}

int main(void)
{
    test_chat_fields();
    test_chat_errors();
    test_completion_requests();
    test_responses();
    test_stream();
    test_mutations();
    return check_exit();
}

/* What krun serve sends for the ids a sequence generates (run/serve/serve_gen.h), without a model: the
 * replies are K3 chat messages rendered by kchat_render (reasoning, content, tool calls) and fed
 * back id by id as the model would generate them, with the real tokenizer (skipped visibly
 * without the shared fixtures).  Streamed responses are reassembled from their SSE chunks, as a
 * client does, and must say exactly what the non-streamed body says; stop strings, max_tokens,
 * end ids, usage, token ids, characters split across tokens and failures before and after the
 * stream started are checked against what the reply is known to contain. */
#include "check.h"
#include "run/serve/serve_gen.h"
#include "run/text/chat.h"
#include "run/text/jsontext.h"
#include "run/text/tokenizer.h"

#include <jansson.h>
#include <stdint.h>
#include <string.h>

static _Noreturn void die(const char *what)
{
    printf("not ok - %s\n", what);
    exit(1);
}

static ktok *load_tokenizer(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/fixtures/tokenizer/tiktoken.model", check_shared_dir());
    size_t len;
    char *rf = check_read_file(path, &len);
    if (!rf) return NULL;
    ktok_special *sp;
    size_t nsp;
    krun_err ke = {0, ""};
    char *err = ke.msg;
    if (ktok_specials_builtin("k3", &sp, &nsp)) die("out of memory");
    ktok *tk = ktok_load(rf, len, sp, nsp, &ke);
    ktok_specials_free(sp, nsp);
    free(rf);
    if (!tk) die(err);
    return tk;
}

/* The ids the model generates for message reply after the user's turn: render(user, generation
 * prompt) is a prefix of render(user, reply); the rest is the reply. */
static int32_t *reply_ids(const ktok *tk, const kchat_message *reply, int thinking, size_t *n)
{
    kchat_message m[2] = {{.role = KCHAT_USER, .content = "Hi", .content_len = 2}, *reply};
    kchat_options o;
    kchat_rendering P, R;
    krun_err ke = {0, ""};
    char *err = ke.msg;
    kchat_options_default(&o);
    o.thinking = thinking;
    if (kchat_render(tk, m, 1, &o, &P, &ke)) die(err);
    o.add_generation_prompt = 0;
    if (kchat_render(tk, m, 2, &o, &R, &ke)) die(err);
    if (R.n_ids <= P.n_ids || memcmp(R.ids, P.ids, P.n_ids * sizeof *P.ids)) die("the prompt is not a prefix");
    *n = R.n_ids - P.n_ids;
    int32_t *ids = malloc(*n * sizeof *ids);
    if (!ids) die("out of memory");
    memcpy(ids, R.ids + P.n_ids, *n * sizeof *ids);
    kchat_rendering_free(&P);
    kchat_rendering_free(&R);
    return ids;
}

/* What a response said: reassembled from SSE chunks, or read from the one body. */
typedef struct {
    kbuf content, reasoning;
    kbuf call_names, call_args, call_ids;   /* "|"-joined */
    char finish[32];
    long prompt_tokens, completion_tokens;  /* -1: no usage */
    int done, chunks, bad, errors, replacement_chars;
    json_t *body;
} said;

static void said_free(said *s)
{
    kbuf_free(&s->content);
    kbuf_free(&s->reasoning);
    kbuf_free(&s->call_names);
    kbuf_free(&s->call_args);
    kbuf_free(&s->call_ids);
    json_decref(s->body);
}

static void add_str(kbuf *b, json_t *v)
{
    if (!json_is_string(v)) return;
    kbuf_add(b, json_string_value(v), json_string_length(v));
}

static void read_usage(said *s, json_t *o)
{
    json_t *u = json_object_get(o, "usage");
    if (!json_is_object(u)) return;
    s->prompt_tokens = (long)json_integer_value(json_object_get(u, "prompt_tokens"));
    s->completion_tokens = (long)json_integer_value(json_object_get(u, "completion_tokens"));
    if (json_integer_value(json_object_get(u, "total_tokens")) != s->prompt_tokens + s->completion_tokens) s->bad++;
}

static void read_choice(said *s, json_t *ch, int streamed, int chat)
{
    json_t *d = json_object_get(ch, streamed ? "delta" : "message"), *fr = json_object_get(ch, "finish_reason");
    if (json_is_string(fr)) snprintf(s->finish, sizeof s->finish, "%s", json_string_value(fr));
    if (!chat) {
        json_t *t = json_object_get(ch, "text");
        if (json_is_string(t) && strstr(json_string_value(t), "\xef\xbf\xbd")) s->replacement_chars++;
        add_str(&s->content, t);
        return;
    }
    json_t *c = json_object_get(d, "content"), *r = json_object_get(d, "reasoning_content"), *tc = json_object_get(d, "tool_calls");
    if (json_is_string(c) && strstr(json_string_value(c), "\xef\xbf\xbd")) s->replacement_chars++;
    add_str(&s->content, c);
    add_str(&s->reasoning, r);
    for (size_t i = 0; i < json_array_size(tc); i++) {
        json_t *call = json_array_get(tc, i), *f = json_object_get(call, "function");
        if (json_object_get(call, "id")) { add_str(&s->call_ids, json_object_get(call, "id")); kbuf_puts(&s->call_ids, "|"); }
        if (json_is_string(json_object_get(f, "name")) && json_string_length(json_object_get(f, "name"))) {
            add_str(&s->call_names, json_object_get(f, "name"));
            kbuf_puts(&s->call_names, "|");
        }
        if (json_is_string(json_object_get(f, "arguments")) && json_string_length(json_object_get(f, "arguments"))) {
            add_str(&s->call_args, json_object_get(f, "arguments"));
            kbuf_puts(&s->call_args, "|");
        }
    }
}

static void read_response(said *s, const char *text, size_t len, int stream, int chat)
{
    memset(s, 0, sizeof *s);
    s->prompt_tokens = s->completion_tokens = -1;
    if (!stream) {
        s->body = json_loadb(text, len, JSON_ALLOW_NUL, NULL);
        if (!s->body) { s->bad++; return; }
        if (json_object_get(s->body, "error")) s->errors++;
        read_choice(s, json_array_get(json_object_get(s->body, "choices"), 0), 0, chat);
        read_usage(s, s->body);
        return;
    }
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *e = strstr(p, "\n\n");
        if (!e || strncmp(p, "data: ", 6)) { s->bad++; return; }
        if (s->done) s->bad++;                              /* nothing after [DONE] */
        if (e - p == 12 && !strncmp(p, "data: [DONE]", 12)) s->done = 1;
        else {
            json_t *o = json_loadb(p + 6, (size_t)(e - p - 6), JSON_ALLOW_NUL, NULL);
            if (!o) { s->bad++; return; }
            s->chunks++;
            if (json_object_get(o, "error")) s->errors++;
            json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
            if (ch) read_choice(s, ch, 1, chat);
            read_usage(s, o);
            json_decref(o);
        }
        p = e + 2;
    }
}

typedef struct {
    int chat, thinking, stream, include_usage, return_token_ids;
    char **stop;
    size_t n_stop;
    long max_tokens;
    int no_end_ids;
} run_opts;

/* Feed ids one by one (taking the output after each, as the server does) until the request is
 * complete; returns what was sent.  *fed: ids fed. */
static kbuf run(const ktok *tk, const int32_t *ids, size_t n, const run_opts *ro, size_t *fed, int *status)
{
    static const int32_t prompt[3] = {11, 22, 33};
    int32_t end_ids[2] = {ktok_find_special(tk, KCHAT_END_OF_MSG), ktok_find_special(tk, "[EOS]")};
    sgen_opts o = {ro->chat, ro->thinking, ro->stream, ro->include_usage, ro->return_token_ids, ro->stop, ro->n_stop,
                   end_ids, ro->no_end_ids ? 0 : 2, ro->max_tokens ? ro->max_tokens : 100000,
                   {"req-7", "kimi-k3", 1700000000}, prompt, 3, 0, 0, 0, 0, 0, 0};
    sgen *g = sgen_new(tk, &o);
    kbuf out = {0};
    if (!g) die("sgen_new");
    *fed = 0;
    for (size_t i = 0; i < n; i++) {
        int r = sgen_token(g, ids[i]);
        ++*fed;
        sgen_take(g, &out);
        if (r < 0) die("sgen_token: out of memory");
        if (r == 1) break;
    }
    if (!sgen_done(g)) sgen_end(g, "length");
    sgen_take(g, &out);
    if (!sgen_done(g) || out.oom) die("not done");
    *status = sgen_status(g);
    if (sgen_n_tokens(g) != *fed) die("token count");
    sgen_free(g);
    return out;
}

static int same(const kbuf *b, const char *s) { return b->n == strlen(s) && (!b->n || !memcmp(b->p, s, b->n)); }

static void test_chat(const ktok *tk)
{
    const char *reasoning = "The user greets me. I should answer warmly, in one line.";
    const char *content = "Hello! How can I help you today? \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x91\x8b Ask me anything.";
    kchat_message reply = {.role = KCHAT_ASSISTANT, .content = content, .content_len = strlen(content),
                           .reasoning = reasoning, .reasoning_len = strlen(reasoning)};
    size_t n, fed;
    int status;
    int32_t *ids = reply_ids(tk, &reply, 1, &n);
    said a, b;
    for (int stream = 0; stream <= 1; stream++) {
        run_opts ro = {.chat = 1, .thinking = 1, .stream = stream, .include_usage = stream};
        kbuf out = run(tk, ids, n, &ro, &fed, &status);
        read_response(stream ? &b : &a, out.p, out.n, stream, 1);
        kbuf_free(&out);
        said *s = stream ? &b : &a;
        CHECK(status == 200 && !s->bad && same(&s->content, content) && same(&s->reasoning, reasoning) && !strcmp(s->finish, "stop") &&
              fed == n && s->prompt_tokens == 3 && s->completion_tokens == (long)n && (!stream || s->done) && !s->replacement_chars,
              "chat, %s: reasoning_content and content as rendered, finish stop at <|end_of_msg|>, usage 3 + %zu, "
              "no U+FFFD although characters span tokens%s", stream ? "streamed" : "one body", n, stream ? ", ends with [DONE]" : "");
    }
    CHECK(b.chunks > 10, "the streamed reply came in %d chunks (token by token)", b.chunks);
    said_free(&a);
    said_free(&b);

    /* a stop string inside the content: cut before it, finish stop, generation stopped there */
    char *stops[] = {"today?", "zzz"};
    for (int stream = 0; stream <= 1; stream++) {
        run_opts ro = {.chat = 1, .thinking = 1, .stream = stream, .stop = stops, .n_stop = 2};
        kbuf out = run(tk, ids, n, &ro, &fed, &status);
        read_response(&a, out.p, out.n, stream, 1);
        CHECK(!a.bad && same(&a.content, "Hello! How can I help you ") && same(&a.reasoning, reasoning) && !strcmp(a.finish, "stop") &&
              fed < n && strstr(out.p, "today") == NULL,
              "chat, %s: a stop string in the content cuts it before the string (never sent, not even in part), stops "
              "generating (%zu of %zu ids)", stream ? "streamed" : "one body", fed, n);
        kbuf_free(&out);
        said_free(&a);
    }
    /* a stop string that only the reasoning contains: no effect */
    char *rstop[] = {"greets"};
    run_opts rs = {.chat = 1, .thinking = 1, .stream = 1, .stop = rstop, .n_stop = 1};
    kbuf out = run(tk, ids, n, &rs, &fed, &status);
    read_response(&a, out.p, out.n, 1, 1);
    CHECK(same(&a.reasoning, reasoning) && same(&a.content, content) && !strcmp(a.finish, "stop") && fed == n,
          "stop strings apply to the content, not to the reasoning");
    kbuf_free(&out);
    said_free(&a);

    /* max_tokens inside the reasoning: finish length, content empty, the reasoning so far */
    for (int stream = 0; stream <= 1; stream++) {
        run_opts ro = {.chat = 1, .thinking = 1, .stream = stream, .max_tokens = 8};
        out = run(tk, ids, n, &ro, &fed, &status);
        read_response(&a, out.p, out.n, stream, 1);
        CHECK(!a.bad && fed == 8 && a.content.n == 0 && a.reasoning.n > 0 && a.reasoning.n < strlen(reasoning) &&
              !memcmp(a.reasoning.p, reasoning, a.reasoning.n) && !strcmp(a.finish, "length") && a.completion_tokens == (stream ? -1 : 8),
              "chat, %s: max_tokens 8 ends with finish length and the reasoning so far", stream ? "streamed" : "one body");
        kbuf_free(&out);
        said_free(&a);
    }
    /* the generation stopped from outside (context full) */
    run_opts cut = {.chat = 1, .thinking = 1, .stream = 1, .include_usage = 1};
    out = run(tk, ids, n / 2, &cut, &fed, &status);
    read_response(&a, out.p, out.n, 1, 1);
    CHECK(!a.bad && a.done && !strcmp(a.finish, "length") && a.completion_tokens == (long)(n / 2), "chat, streamed: ended from outside "
          "(the context is full): finish length, usage, [DONE]");
    kbuf_free(&out);
    said_free(&a);
    free(ids);

    /* thinking off: no reasoning_content at all */
    kchat_message plain = {.role = KCHAT_ASSISTANT, .content = "Fine.", .content_len = 5};
    ids = reply_ids(tk, &plain, 0, &n);
    run_opts off = {.chat = 1, .thinking = 0};
    out = run(tk, ids, n, &off, &fed, &status);
    read_response(&a, out.p, out.n, 0, 1);
    json_t *msg = json_object_get(json_array_get(json_object_get(a.body, "choices"), 0), "message");
    CHECK(same(&a.content, "Fine.") && !json_object_get(msg, "reasoning_content") && !strcmp(a.finish, "stop"),
          "chat with thinking off: content only, no reasoning_content");
    kbuf_free(&out);
    said_free(&a);
    free(ids);
}

static void test_tool_calls(const ktok *tk)
{
    kchat_tool_call calls[2] = {{"c1", "get_weather", "{\"city\": \"Paris\", \"days\": 3}"}, {"c2", "get_time", "{\"tz\": \"CET\"}"}};
    kchat_message reply = {.role = KCHAT_ASSISTANT, .content = "Let me check.", .content_len = 13, .reasoning = "Two tools.",
                           .reasoning_len = 10, .tool_calls = calls, .n_tool_calls = 2};
    size_t n, fed;
    int status;
    int32_t *ids = reply_ids(tk, &reply, 1, &n);
    said a, b;
    run_opts r1 = {.chat = 1, .thinking = 1}, r2 = {.chat = 1, .thinking = 1, .stream = 1};
    kbuf o1 = run(tk, ids, n, &r1, &fed, &status), o2 = run(tk, ids, n, &r2, &fed, &status);
    read_response(&a, o1.p, o1.n, 0, 1);
    read_response(&b, o2.p, o2.n, 1, 1);
    json_t *tc = json_object_get(json_object_get(json_array_get(json_object_get(a.body, "choices"), 0), "message"), "tool_calls");
    json_t *args0 = json_loads(json_string_value(json_object_get(json_object_get(json_array_get(tc, 0), "function"), "arguments")), 0, NULL);
    CHECK(!strcmp(a.finish, "tool_calls") && json_array_size(tc) == 2 && same(&a.call_names, "get_weather|get_time|") &&
          json_is_object(args0) && json_integer_value(json_object_get(args0, "days")) == 3 &&
          !strcmp(json_string_value(json_object_get(args0, "city")), "Paris") && same(&a.call_ids, "call_req-7_0|call_req-7_1|") &&
          same(&a.content, "Let me check."),
          "chat with tool calls, one body: finish tool_calls, both calls with names, typed JSON arguments and server ids");
    CHECK(!strcmp(b.finish, "tool_calls") && same(&b.call_names, "get_weather|get_time|") && same(&b.call_ids, "call_req-7_0|call_req-7_1|") &&
          same(&b.call_args, a.call_args.p) && same(&b.content, "Let me check.") && same(&b.reasoning, "Two tools.") && b.done,
          "chat with tool calls, streamed: each call's header (id, name) then its arguments, the same as the body");
    json_decref(args0);
    kbuf_free(&o1);
    kbuf_free(&o2);
    said_free(&a);
    said_free(&b);
    free(ids);
}

static void test_completion(const ktok *tk)
{
    const char *text = "Once upon a time \xf0\x9f\xa6\x8a\xf0\x9f\x8c\xb2 there was a fox. THE END and more";
    int32_t *ids, *all;
    size_t n, fed;
    int status;
    said a, b;
    if (ktok_encode(tk, text, strlen(text), 0, &ids, &n)) die("encode");
    all = malloc((n + 2) * sizeof *all);
    memcpy(all, ids, n * sizeof *all);
    all[n] = ktok_find_special(tk, "[EOS]");
    all[n + 1] = ids[0];
    int split = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const uint8_t *bb = ktok_id_bytes(tk, ids[i], &len);
        split |= ktok_utf8_complete(bb, len) != len;
    }
    for (int stream = 0; stream <= 1; stream++) {
        run_opts ro = {.stream = stream, .include_usage = 1, .return_token_ids = 1};
        kbuf out = run(tk, all, n + 2, &ro, &fed, &status);
        read_response(stream ? &b : &a, out.p, out.n, stream, 0);
        kbuf_free(&out);
        said *s = stream ? &b : &a;
        CHECK(!s->bad && same(&s->content, text) && !strcmp(s->finish, "stop") && fed == n + 1 && s->completion_tokens == (long)n + 1 &&
              !s->replacement_chars,
              "completion, %s: the text, stopped by [EOS] (not shown), usage %zu%s", stream ? "streamed" : "one body", n + 1,
              split ? "; characters split across tokens arrive whole" : "");
    }
    json_t *tids = json_object_get(json_array_get(json_object_get(a.body, "choices"), 0), "token_ids");
    json_t *pids = json_object_get(a.body, "prompt_token_ids");
    int ids_ok = json_array_size(tids) == n + 1 && json_array_size(pids) == 3 && json_integer_value(json_array_get(pids, 2)) == 33;
    for (size_t i = 0; ids_ok && i <= n; i++) ids_ok = json_integer_value(json_array_get(tids, i)) == all[i];
    CHECK(ids_ok, "return_token_ids: prompt_token_ids and choices[0].token_ids (the end id included)");
    {
        /* a NUL byte in the text (a random model generates any byte) */
        uint8_t nul = 0;
        int32_t z[2] = {ids[0], ktok_rank_of(tk, &nul, 1)};
        run_opts ro = {.return_token_ids = 1};
        kbuf o = run(tk, z, 2, &ro, &fed, &status);
        said x;
        read_response(&x, o.p, o.n, 0, 0);
        json_t *tz = json_object_get(json_array_get(json_object_get(x.body, "choices"), 0), "token_ids");
        CHECK(status == 200 && !x.bad && x.content.n >= 1 && x.content.p[x.content.n - 1] == 0 && json_array_size(tz) == 2,
              "a completion whose text holds U+0000 is a valid body, with its token ids");
        said_free(&x);
        kbuf_free(&o);
    }
    said_free(&a);
    said_free(&b);

    run_opts noend = {.stream = 1, .no_end_ids = 1, .max_tokens = (long)n + 2};
    kbuf out = run(tk, all, n + 2, &noend, &fed, &status);
    read_response(&a, out.p, out.n, 1, 0);
    size_t l0;
    const uint8_t *b0 = ktok_id_bytes(tk, ids[0], &l0);
    kbuf want = {0};
    kbuf_puts(&want, text);
    kbuf_puts(&want, "[EOS]");
    kbuf_add(&want, b0, l0);
    CHECK(fed == n + 2 && !strcmp(a.finish, "length") && same(&a.content, want.p),
          "ignore_eos: the end id is text like any other and generation goes on to max_tokens (finish length)");
    kbuf_free(&want);
    kbuf_free(&out);
    said_free(&a);

    char *stops[] = {" THE END", "fox. T"};
    for (int stream = 0; stream <= 1; stream++) {
        run_opts ro = {.stream = stream, .stop = stops, .n_stop = 2};
        out = run(tk, all, n + 2, &ro, &fed, &status);
        read_response(&a, out.p, out.n, stream, 0);
        CHECK(!a.bad && same(&a.content, "Once upon a time \xf0\x9f\xa6\x8a\xf0\x9f\x8c\xb2 there was a ") && !strcmp(a.finish, "stop") && fed < n,
              "completion, %s: of two stop strings the one complete first wins (\"fox. T\" before \" THE END\")",
              stream ? "streamed" : "one body");
        kbuf_free(&out);
        said_free(&a);
    }
    free(ids);
    free(all);
}

/* The server builds sgen_opts from request-scoped memory (the parsed request's stop strings, an
 * end-id array on its stack) that is gone while a streamed or abandoned request still runs (issue
 * 25.1: a streamed request with a stop string crashed krun serve).  sgen must own what it keeps:
 * here that memory is overwritten with other stop strings and end ids, then freed, before the
 * first token.  Under ASan a borrowed pointer is a heap-use-after-free; in any build the reply
 * would be cut at the wrong place or run past [EOS]. */
static void test_lifetime(const ktok *tk)
{
    const char *text = "Once upon a time there was a fox. THE END and more";
    int32_t *ids, *all;
    size_t n;
    if (ktok_encode(tk, text, strlen(text), 0, &ids, &n)) die("encode");
    all = malloc((n + 2) * sizeof *all);
    if (!all) die("out of memory");
    memcpy(all, ids, n * sizeof *all);
    all[n] = ktok_find_special(tk, "[EOS]");
    all[n + 1] = ids[0];
    for (int stream = 0; stream <= 1; stream++)
        for (int with_stop = 0; with_stop <= 1; with_stop++) {
            char **stop = calloc(2, sizeof *stop);
            int32_t *end_ids = malloc(2 * sizeof *end_ids);
            char meta_id[16] = "req-9", model[16] = "kimi-k3";
            if (!stop || !end_ids || !(stop[0] = strdup(" THE END")) || !(stop[1] = strdup("fox. T"))) die("out of memory");
            end_ids[0] = ktok_find_special(tk, KCHAT_END_OF_MSG);
            end_ids[1] = ktok_find_special(tk, "[EOS]");
            sgen_opts o = {0, 0, stream, 0, 0, with_stop ? stop : NULL, with_stop ? 2 : 0, end_ids, 2, 1000, {meta_id, model, 1}, NULL, 0, 0, 0, 0, 0, 0, 0};
            sgen *g = sgen_new(tk, &o);
            kbuf out = {0};
            size_t fed = 0;
            said s;
            if (!g) die("sgen_new");
            /* the request's memory is reused for something else, then freed */
            memcpy(stop[0], "Once up", 8);
            memcpy(stop[1], "Once u", 7);
            end_ids[0] = end_ids[1] = ids[0];
            memcpy(meta_id, "XXXX", 5);
            free(stop[0]);
            free(stop[1]);
            free(stop);
            free(end_ids);
            for (size_t i = 0; i < n + 2; i++) {
                int r = sgen_token(g, all[i]);
                fed++;
                sgen_take(g, &out);
                if (r < 0) die("sgen_token: out of memory");
                if (r == 1) break;
            }
            read_response(&s, out.p, out.n, stream, 0);
            CHECK(!s.bad && sgen_done(g) && !strcmp(s.finish, "stop") &&
                  same(&s.content, with_stop ? "Once upon a time there was a " : "Once upon a time there was a fox. THE END and more") &&
                  (with_stop ? fed < n : fed == n + 1) && strstr(out.p, "req-9") && !strstr(out.p, "XXXX"),
                  "completion, %s, %s: the stop strings and end ids given to sgen_new are its own copies (the request's "
                  "memory was overwritten and freed before the first token)", stream ? "streamed" : "one body",
                  with_stop ? "stop strings and [EOS]" : "[EOS]");
            said_free(&s);
            kbuf_free(&out);
            sgen_free(g);
        }
    free(ids);
    free(all);
}

/* A completion's bytes need not be UTF-8 (a token may hold half a character); the client reads
 * the ill-formed parts as U+FFFD, so that is where a stop string is looked for: a stop string
 * with U+FFFD stops a reply the client would read it in (found by the request soak). */
static void test_illformed_stop(const ktok *tk)
{
    uint8_t b[4] = {'x', 0xF0, 'A', 'y'};
    int32_t ids[5];
    for (int i = 0; i < 4; i++) ids[i] = ktok_rank_of(tk, &b[i], 1);
    ids[4] = ktok_rank_of(tk, &b[0], 1);
    char *stops[][2] = {{"\xef\xbf\xbd", NULL}, {"\xef\xbf\xbd" "A", "zz"}};
    for (int stream = 0; stream <= 1; stream++)
        for (int k = 0; k < 2; k++) {
            run_opts ro = {.stream = stream, .stop = stops[k], .n_stop = k ? 2 : 1, .no_end_ids = 1, .max_tokens = 5};
            size_t fed;
            int status;
            said s;
            kbuf out = run(tk, ids, 5, &ro, &fed, &status);
            read_response(&s, out.p, out.n, stream, 0);
            CHECK(!s.bad && same(&s.content, "x") && !strcmp(s.finish, "stop") && fed == 3,
                  "completion, %s: a stop string holding U+FFFD (%s) matches where ill-formed UTF-8 is read as U+FFFD",
                  stream ? "streamed" : "one body", k ? "\"\\ufffdA\"" : "\"\\ufffd\"");
            said_free(&s);
            kbuf_free(&out);
        }
}

static void test_failures(const ktok *tk)
{
    int32_t end_ids[1] = {ktok_find_special(tk, KCHAT_END_OF_MSG)};
    oai_error e;
    oai_error_set(&e, 500, NULL, "model_damaged", "layer 12 expert 3: checksum mismatch");
    for (int started = 0; started <= 1; started++) {
        sgen_opts o = {0, 0, 1, 0, 0, NULL, 0, end_ids, 1, 100, {"r", "m", 1}, NULL, 0, 0, 0, 0, 0, 0, 0};
        sgen *g = sgen_new(tk, &o);
        kbuf out = {0};
        said s;
        if (!g) die("sgen_new");
        if (started) sgen_token(g, 1008);
        sgen_fail(g, &e);
        sgen_take(g, &out);
        if (!started) {
            json_t *j = json_loadb(out.p, out.n, 0, NULL), *err = json_object_get(j, "error");
            CHECK(sgen_done(g) && sgen_status(g) == 500 && err && strstr(json_string_value(json_object_get(err, "message")), "layer 12 expert 3") &&
                  !strcmp(json_string_value(json_object_get(err, "type")), "server_error"),
                  "a failure before a streamed reply started: status 500 and an error object naming the extent");
            json_decref(j);
        } else {
            read_response(&s, out.p, out.n, 1, 0);
            CHECK(sgen_status(g) == 200 && s.errors == 1 && s.done && !s.bad && strstr(out.p, "layer 12 expert 3"),
                  "a failure after a streamed reply started: an error event naming the extent, then [DONE]");
            said_free(&s);
        }
        CHECK(sgen_token(g, 5) == 1 && (sgen_take(g, &out), 1), "after a failure no token is taken (%s)", started ? "started" : "not started");
        kbuf_free(&out);
        sgen_free(g);
    }
}

/* Logprobs streamed (each chunk the entries of its tokens: together the non-streamed list), as
 * choice 1 of n (its index, no usage or [DONE]), and echo's prompt entries (the first null). */
static json_t *collect_lp(const char *text, size_t len, int chat, int *index_ok, int *done, int *usage)
{
    json_t *all = chat ? json_array() : json_pack("{s[]s[]s[]s[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
    const char *p = text, *end = text + len;
    *done = *usage = 0;
    *index_ok = 1;
    while (p < end) {
        const char *e = strstr(p, "\n\n");
        json_t *o, *ch, *lp;
        if (!e) break;
        if (e - p == 12 && !strncmp(p, "data: [DONE]", 12)) { (*done)++; p = e + 2; continue; }
        o = json_loadb(p + 6, (size_t)(e - p - 6), JSON_ALLOW_NUL, NULL);
        if (json_object_get(o, "usage")) (*usage)++;
        ch = json_array_get(json_object_get(o, "choices"), 0);
        if (ch && json_integer_value(json_object_get(ch, "index")) != 1) *index_ok = 0;
        lp = json_object_get(ch, "logprobs");
        if (json_is_object(lp)) {
            if (chat) json_array_extend(all, json_object_get(lp, "content"));
            else {
                const char *k;
                json_t *v;
                json_object_foreach(all, k, v) json_array_extend(v, json_object_get(lp, k));
            }
        }
        json_decref(o);
        p = e + 2;
    }
    return all;
}

static void test_stream_logprobs(const ktok *tk)
{
    const char *text = "Once upon a time \xf0\x9f\xa6\x8a there was a fox.";
    int32_t *ids, prompt[3];
    size_t n;
    if (ktok_encode(tk, text, strlen(text), 0, &ids, &n) || n < 6) die("encode");
    memcpy(prompt, ids, sizeof prompt);
    for (int chat = 0; chat <= 1; chat++)
        for (int echo = 0; echo <= !chat; echo++) {
            json_t *lists[2] = {NULL, NULL};
            int index_ok = 1, done = 0, usage = 0;
            for (int stream = 0; stream <= 1; stream++) {
                sgen_opts o = {chat, 0, stream, 1, 0, NULL, 0, NULL, 0, (long)n, {"req-1", "k3", 1}, prompt, 3, 1, 0, stream, stream, echo, 0};
                sgen *g = sgen_new(tk, &o);
                kbuf out = {0};
                if (!g) die("sgen_new");
                if (echo) {
                    int32_t top[2] = {7, 8};
                    double tlp[2] = {-0.5, -1.5};
                    if (sgen_logprob_null(g, prompt[0]) || sgen_logprob(g, prompt[1], -2.25, top, tlp, 2) ||
                        sgen_logprob(g, prompt[2], -3.5, top, tlp, 2) || sgen_echo(g, prompt, 3))
                        die("echo");
                }
                for (size_t i = 0; i < n; i++) {
                    int32_t top[2] = {ids[i], 5};
                    double tlp[2] = {-0.25 - (double)i, -9};
                    if (sgen_logprob(g, ids[i], -0.25 - (double)i, top, tlp, 2)) die("logprob");
                    if (sgen_token(g, ids[i]) < 0) die("token");
                    sgen_take(g, &out);
                }
                if (!sgen_done(g)) sgen_end(g, "length");
                sgen_take(g, &out);
                if (stream) {
                    lists[1] = collect_lp(out.p, out.n, chat, &index_ok, &done, &usage);
                } else {
                    json_t *o = json_loadb(out.p, out.n, JSON_ALLOW_NUL, NULL);
                    lists[0] = json_deep_copy(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs"));
                    if (chat && lists[0]) { json_t *c = json_incref(json_object_get(lists[0], "content")); json_decref(lists[0]); lists[0] = c; }
                    json_decref(o);
                }
                kbuf_free(&out);
                sgen_free(g);
            }
            size_t want = n + (echo ? 3 : 0);
            json_t *first = chat ? json_array_get(lists[0], 0) : NULL;
            CHECK(lists[0] && lists[1] && json_equal(lists[0], lists[1]) &&
                      json_array_size(chat ? lists[0] : json_object_get(lists[0], "tokens")) == want && index_ok && !done && !usage &&
                      (!echo || (json_is_null(json_array_get(json_object_get(lists[0], "token_logprobs"), 0)) &&
                                 json_is_null(json_array_get(json_object_get(lists[0], "top_logprobs"), 0)))) &&
                      (!chat || json_real_value(json_object_get(first, "logprob")) == -0.25),
                  "%s%s: streamed logprobs (choice 1 of n: its index, no usage, no [DONE]) == the non-streamed list (%zu entries)%s",
                  chat ? "chat" : "completions", echo ? " with echo" : "", want, echo ? ", the prompt's first null" : "");
            json_decref(lists[0]);
            json_decref(lists[1]);
        }
    free(ids);
}

int main(void)
{
    ktok *tk = load_tokenizer();
    if (!tk) {
        SKIP("serve output: the real tokenizer (%s/fixtures/tokenizer/tiktoken.model) is absent", check_shared_dir());
        return check_exit();
    }
    test_chat(tk);
    test_tool_calls(tk);
    test_completion(tk);
    test_lifetime(tk);
    test_illformed_stop(tk);
    test_failures(tk);
    test_stream_logprobs(tk);
    ktok_free(tk);
    return check_exit();
}

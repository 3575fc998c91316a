/* `krun tokenize`: see cmd_tokenize.h and the usage text below. */
#include "cmd_tokenize.h"

#include "format/kargs.h"

#include "run/text/chat.h"
#include "run/text/jsontext.h"
#include "run/api/oai.h"
#include "run/text/tokenizer_kpk.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TK_OK = 0, TK_DATA = 1, TK_USAGE = 2 };

static const char usage[] =
    "usage: krun tokenize MODEL.kpk [TEXT | --file PATH | -] [options]\n"
    "       krun tokenize MODEL.kpk --decode [IDS | --file PATH | -]\n"
    "       krun tokenize MODEL.kpk --chat REQUEST.json [chat options]\n"
    "\n"
    "Shows how krun's tokenizer (the one embedded in MODEL.kpk) reads text, without loading\n"
    "the model: text -> token ids, ids -> text, or a chat rendered with the K3 chat template.\n"
    "The input is TEXT, the file PATH, or standard input (-).\n"
    "\n"
    "Encoding:\n"
    "  --special            honour special-token strings such as <|end_of_msg|> (the default,\n"
    "                       as krun --prompt does)\n"
    "  --no-special         encode special-token strings as ordinary text (as chat message\n"
    "                       content always is)\n"
    "  --sep STR            separator between ids (default \",\", the form krun --ids takes)\n"
    "  --json               {\"count\", \"ids\", \"tokens\": [{\"id\", \"piece\" | \"hex\", \"special\"}]};\n"
    "                       \"hex\" holds the bytes of a token that is not valid UTF-8 on its own\n"
    "  --jsonl              many texts: each input line is a JSON string (or {\"text\": ...}); each\n"
    "                       output line the JSON array of its ids (with --decode: arrays in,\n"
    "                       strings out)\n"
    "Decoding:\n"
    "  --decode             the input is token ids (separated by commas, spaces or newlines);\n"
    "                       their bytes are written as they are (with --json: {\"text\", \"bytes\",\n"
    "                       \"valid_utf8\"}, ill-formed UTF-8 shown as U+FFFD)\n"
    "Chat (K3 chat format, shared/spec/K3_CHAT.md):\n"
    "  --chat FILE          FILE (or -) holds an OpenAI chat request body ({\"messages\": [...],\n"
    "                       \"tools\", \"reasoning_effort\", ...}) or just the messages array; it is\n"
    "                       rendered to the prompt ids a chat would feed (content never becomes\n"
    "                       a special token)\n"
    "  --think | --no-think thinking channel on (the default) or off\n"
    "  --effort E           thinking effort low, high or max (default: the request's\n"
    "                       reasoning_effort, else max); none: no effort message\n"
    "  --no-generation-prompt  do not end with the assistant's opening tags\n"
    "  --print-text         print the rendered prompt as text (markers spelled out) instead of ids\n"
    "\n"
    "Exit: 0 success; 1 the tokenizer embedded in MODEL.kpk is damaged (checksum, invalid rank\n"
    "file or config); 2 usage error, unreadable input, not a KPK file, no tokenizer in the file,\n"
    "a token id outside the vocabulary, a malformed chat request, output that cannot be written.\n";

struct topts {
    const char *model, *text, *file, *chat, *sep;
    int from_stdin, decode, special, json, jsonl, print_text;
    int think;             /* -1: the request decides */
    const char *effort;    /* NULL: the request decides */
    int no_gen_prompt;
};

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "krun tokenize: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see krun tokenize --help)\n");
    return TK_USAGE;
}

static int parse_args(int argc, char **argv, struct topts *o)
{
    memset(o, 0, sizeof *o);
    o->special = 1;
    o->think = -1;
    o->sep = ",";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = 0;
        /* an option with a value: "--name VALUE" or "--name=VALUE" (format/kargs.h) */
#define OPT(name, dst) (r = kargs_flag(argc, argv, &i, name, &(dst))) != 0
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(usage, stdout); exit(TK_OK); }
        else if (OPT("--file", o->file) || OPT("--chat", o->chat) || OPT("--sep", o->sep) || OPT("--effort", o->effort)) {
            if (r < 0) return usage_error("%s needs a value", a);
        }
        else if (!strcmp(a, "--decode")) o->decode = 1;
        else if (!strcmp(a, "--special")) o->special = 1;
        else if (!strcmp(a, "--no-special")) o->special = 0;
        else if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--jsonl")) o->jsonl = 1;
        else if (!strcmp(a, "--think")) o->think = 1;
        else if (!strcmp(a, "--no-think")) o->think = 0;
        else if (!strcmp(a, "--no-generation-prompt")) o->no_gen_prompt = 1;
        else if (!strcmp(a, "--print-text")) o->print_text = 1;
        else if (!strcmp(a, "-")) o->from_stdin = 1;
        else if (a[0] == '-' && a[1]) return usage_error("unknown option %s", a);
        else if (!o->model) o->model = a;
        else if (!o->text) o->text = a;
        else return usage_error("unexpected argument %s", a);
#undef OPT
    }
    if (!o->model) { fputs(usage, stderr); return TK_USAGE; }
    int inputs = !!o->text + !!o->file + o->from_stdin;
    if (o->chat) {
        if (inputs) return usage_error("%s", "--chat takes its request from its FILE; give no other input");
        if (o->decode || o->jsonl) return usage_error("%s", "--chat cannot be combined with --decode or --jsonl");
    } else {
        if (inputs != 1) return usage_error("%s", "give exactly one input: TEXT, --file PATH or -");
        if (o->think >= 0 || o->effort || o->no_gen_prompt || o->print_text)
            return usage_error("%s", "--think, --no-think, --effort, --no-generation-prompt and --print-text need --chat");
    }
    if (o->effort && strcmp(o->effort, "none") && kchat_effort_parse(o->effort) == KCHAT_EFFORT_INVALID)
        return usage_error("--effort: expected low, high, max or none, got %s", o->effort);
    return -1;
}

/* The whole input: TEXT, a file or standard input (at most 1 GiB). */
static int read_input(const char *text, const char *path, kbuf *b)
{
    if (text) { kbuf_add(b, text, strlen(text)); return b->oom ? -1 : 0; }
    FILE *f = path && strcmp(path, "-") ? fopen(path, "rb") : stdin;
    const char *name = f == stdin ? "standard input" : path;
    if (!f) { fprintf(stderr, "krun tokenize: %s: %s\n", name, strerror(errno)); return -1; }
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        kbuf_add(b, chunk, n);
        if (b->n > ((size_t)1 << 30)) { fprintf(stderr, "krun tokenize: %s: larger than 1 GiB\n", name); break; }
    }
    int bad = ferror(f) || b->oom || b->n > ((size_t)1 << 30);
    if (ferror(f)) fprintf(stderr, "krun tokenize: %s: read error: %s\n", name, strerror(errno));
    if (b->oom) fprintf(stderr, "krun tokenize: %s: out of memory\n", name);
    if (f != stdin) fclose(f);
    if (!b->p) kbuf_add(b, "", 0);
    return bad ? -1 : 0;
}

/* ids separated by commas, whitespace or JSON brackets.  Returns 0, or -1 with a message. */
static int parse_id_list(const char *s, size_t len, const ktok *tk, int32_t **out, size_t *n, krun_err *err)
{
    size_t cap = 64;
    int32_t *v = malloc(cap * sizeof *v);
    *n = 0;
    if (!v) { krun_err_set(err, KRUN_ENOMEM, "out of memory"); return -1; }
    size_t V = ktok_vocab_size(tk);
    for (size_t i = 0; i < len;) {
        char c = s[i];
        if (c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '[' || c == ']') { i++; continue; }
        if (c < '0' || c > '9') {
            krun_err_set(err, KRUN_EINPUT, "expected token ids separated by commas or spaces, got \"%.20s\" at byte %zu",
                         s + i, i);
            free(v);
            return -1;
        }
        unsigned long long x = 0;
        size_t start = i;
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            if (x <= 0xFFFFFFFFull) x = x * 10 + (unsigned long long)(s[i] - '0');
            i++;
        }
        if (x >= V || !ktok_id_bytes(tk, (int32_t)x, NULL)) {
            krun_err_set(err, KRUN_EINPUT, "token id %.*s (id number %zu) is outside the vocabulary (0..%zu)",
                         (int)(i - start > 20 ? 20 : i - start), s + start, *n + 1, V - 1);
            free(v);
            return -1;
        }
        if (*n == cap) {
            int32_t *p = realloc(v, (cap *= 2) * sizeof *v);
            if (!p) { free(v); krun_err_set(err, KRUN_ENOMEM, "out of memory"); return -1; }
            v = p;
        }
        v[(*n)++] = (int32_t)x;
    }
    *out = v;
    return 0;
}

/* ids on one line between open and close */
static void print_ids(const int32_t *ids, size_t n, const char *sep, const char *open, const char *close)
{
    fputs(open, stdout);
    for (size_t i = 0; i < n; i++) printf("%s%d", i ? sep : "", ids[i]);
    fputs(close, stdout);
    putchar('\n');
}

/* {"count", "ids", "tokens"} of an id sequence. */
static json_t *ids_json(const ktok *tk, const int32_t *ids, size_t n)
{
    json_t *o = json_object(), *a = json_array(), *t = json_array();
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const uint8_t *b = ktok_id_bytes(tk, ids[i], &l);
        json_t *e = json_object();
        json_object_set_new(e, "id", json_integer(ids[i]));
        json_t *s = b ? json_stringn((const char *)b, l) : NULL;
        if (s) json_object_set_new(e, "piece", s);
        else if (b) {
            char *hex = malloc(2 * l + 1);
            for (size_t k = 0; hex && k < l; k++) snprintf(hex + 2 * k, 3, "%02x", b[k]);
            if (hex) json_object_set_new(e, "hex", json_stringn(hex, 2 * l));
            free(hex);
        }
        if (ktok_is_special(tk, ids[i])) json_object_set_new(e, "special", json_true());
        json_array_append_new(t, e);
        json_array_append_new(a, json_integer(ids[i]));
    }
    json_object_set_new(o, "count", json_integer((json_int_t)n));
    json_object_set_new(o, "ids", a);
    json_object_set_new(o, "tokens", t);
    return o;
}

static void print_json(json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    if (s) puts(s);
    else fprintf(stderr, "krun tokenize: out of memory\n");
    free(s);
    json_decref(j);
}

/* {"text", "bytes", "valid_utf8"} of decoded bytes. */
static void print_decoded_json(const uint8_t *b, size_t n)
{
    kbuf t = {0};
    size_t bad = kutf8_sanitize((const char *)b, n, &t);
    json_t *o = json_object();
    json_object_set_new(o, "text", json_stringn(t.p ? t.p : "", t.n));
    json_object_set_new(o, "bytes", json_integer((json_int_t)n));
    json_object_set_new(o, "valid_utf8", json_boolean(bad == 0));
    kbuf_free(&t);
    print_json(o);
}

/* The bytes of ids (which it frees).  Returns 0, or -1 after saying so. */
static int decode(const ktok *tk, int32_t *ids, size_t n, uint8_t **b, size_t *bl)
{
    long r = ktok_decode(tk, ids, n, b, bl);
    free(ids);
    if (r < 0) fprintf(stderr, "krun tokenize: out of memory\n");
    return r < 0 ? -1 : 0;
}

static int do_encode(const ktok *tk, const struct topts *o, const char *text, size_t len)
{
    int32_t *ids;
    size_t n;
    if (ktok_encode(tk, text, len, o->special, &ids, &n)) { fprintf(stderr, "krun tokenize: cannot tokenize the input (out of memory)\n"); return TK_USAGE; }
    if (o->json) print_json(ids_json(tk, ids, n));
    else print_ids(ids, n, o->sep, "", "");
    free(ids);
    return TK_OK;
}

static int do_decode(const ktok *tk, const struct topts *o, const char *text, size_t len)
{
    int32_t *ids;
    size_t n;
    krun_err err;
    if (parse_id_list(text, len, tk, &ids, &n, &err)) {
        fprintf(stderr, "krun tokenize --decode: %s: %s\n", o->text ? "argument" : o->file ? o->file : "standard input", err.msg);
        return TK_USAGE;
    }
    uint8_t *b;
    size_t bl;
    if (decode(tk, ids, n, &b, &bl)) return TK_USAGE;
    if (o->json) print_decoded_json(b, bl);
    else fwrite(b, 1, bl, stdout);
    free(b);
    return TK_OK;
}

/* One JSON value per line.  Encoding: a string or {"text": string} in, an id array out;
 * decoding: an id array in, a string out. */
static int do_jsonl(const ktok *tk, const struct topts *o, const char *buf, size_t len)
{
    const char *name = o->file ? o->file : o->text ? "argument" : "standard input";
    size_t line = 0;
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - buf) : len;
        line++;
        size_t s = i;
        i = e + 1;
        while (s < e && (buf[s] == ' ' || buf[s] == '\t' || buf[s] == '\r')) s++;
        if (s == e) continue;
        json_error_t je;
        json_t *v = json_loadb(buf + s, e - s, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!v) {
            fprintf(stderr, "krun tokenize: %s line %zu: not JSON: %s\n", name, line, je.text);
            return TK_USAGE;
        }
        if (o->decode) {
            size_t n = json_array_size(v), ok = json_is_array(v);
            int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
            if (!ids) { json_decref(v); fprintf(stderr, "krun tokenize: out of memory\n"); return TK_USAGE; }
            for (size_t k = 0; ok && k < n; k++) {
                json_t *x = json_array_get(v, k);
                json_int_t id = json_is_integer(x) ? json_integer_value(x) : -1;
                ok = id >= 0 && id < (json_int_t)ktok_vocab_size(tk) && ktok_id_bytes(tk, (int32_t)id, NULL);
                ids[k] = (int32_t)id;
            }
            json_decref(v);
            if (!ok) {
                free(ids);
                fprintf(stderr, "krun tokenize: %s line %zu: expected an array of token ids in 0..%zu\n", name, line,
                        ktok_vocab_size(tk) - 1);
                return TK_USAGE;
            }
            uint8_t *b;
            size_t bl;
            if (decode(tk, ids, n, &b, &bl)) return TK_USAGE;
            kbuf t = {0};
            kutf8_sanitize((const char *)b, bl, &t);
            free(b);
            json_t *js = json_stringn(t.p ? t.p : "", t.n);
            kbuf_free(&t);
            print_json(js);
            continue;
        }
        json_t *t = json_is_object(v) ? json_object_get(v, "text") : v;
        if (!json_is_string(t)) {
            json_decref(v);
            fprintf(stderr, "krun tokenize: %s line %zu: expected a JSON string or {\"text\": string}\n", name, line);
            return TK_USAGE;
        }
        int32_t *ids;
        size_t n;
        int rc = ktok_encode(tk, json_string_value(t), json_string_length(t), o->special, &ids, &n);
        json_decref(v);
        if (rc) { fprintf(stderr, "krun tokenize: out of memory\n"); return TK_USAGE; }
        if (o->json) print_json(ids_json(tk, ids, n));
        else print_ids(ids, n, ",", "[", "]");
        free(ids);
    }
    return TK_OK;
}

/* --chat: an OpenAI request body (or a bare messages array) rendered with the K3 template. */
static int do_chat(const ktok *tk, const struct topts *o)
{
    kbuf in = {0};
    if (read_input(NULL, o->chat, &in)) { kbuf_free(&in); return TK_USAGE; }
    const char *name = strcmp(o->chat, "-") ? o->chat : "standard input";
    /* a bare array is the messages */
    size_t s = 0;
    while (s < in.n && (in.p[s] == ' ' || in.p[s] == '\t' || in.p[s] == '\n' || in.p[s] == '\r')) s++;
    if (s < in.n && in.p[s] == '[') {
        kbuf w = {0};
        kbuf_puts(&w, "{\"messages\":");
        kbuf_add(&w, in.p + s, in.n - s);
        kbuf_puts(&w, "}");
        kbuf_free(&in);
        in = w;
    }
    oai_chat_request req;
    oai_error e;
    if (in.oom) { kbuf_free(&in); fprintf(stderr, "krun tokenize: out of memory\n"); return TK_USAGE; }
    if (oai_parse_chat_request(in.p, in.n, &req, &e)) {
        fprintf(stderr, "krun tokenize: %s: %s\n", name, e.message);
        kbuf_free(&in);
        return TK_USAGE;
    }
    kbuf_free(&in);
    kchat_options opt = req.chat;
    if (o->think >= 0) opt.thinking = o->think;
    if (o->effort) opt.effort = strcmp(o->effort, "none") ? kchat_effort_parse(o->effort) : KCHAT_EFFORT_NONE;
    if (o->think == 1 && !req.chat.thinking && !o->effort)
        opt.effort = KCHAT_EFFORT_MAX;   /* --think over a request that turned thinking off: the default effort */
    if (o->no_gen_prompt) opt.add_generation_prompt = 0;
    kchat_rendering r;
    krun_err err;
    int rc = kchat_render(o->print_text ? NULL : tk, req.messages, req.n_messages, &opt, &r, &err);
    oai_chat_request_free(&req);
    if (rc) { fprintf(stderr, "krun tokenize: %s: %s\n", name, err.msg); return TK_USAGE; }
    if (o->print_text) { fwrite(r.text, 1, r.text_len, stdout); putchar('\n'); }
    else if (o->json) print_json(ids_json(tk, r.ids, r.n_ids));
    else print_ids(r.ids, r.n_ids, o->sep, "", "");
    kchat_rendering_free(&r);
    return TK_OK;
}

int krun_tokenize_main(int argc, char **argv)
{
    struct topts o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    kpk_file *f = NULL;
    kpk_err e = {0};
    if (kpk_open(o.model, &f, &e)) {
        fprintf(stderr, "krun tokenize: %s\n", e.msg);
        return e.code == KPK_EFORMAT || e.code == KPK_ECHECKSUM ? TK_DATA : TK_USAGE;
    }
    krun_err err;
    int st;
    ktok *tk = ktok_load_kpk(f, &st, &err);
    kpk_close(f);
    if (!tk) {
        fprintf(stderr, "krun tokenize: %s\n", err.msg);
        if (st == KTOK_KPK_ABSENT) fprintf(stderr, "krun tokenize: this model takes token ids only (krun --ids)\n");
        return st == KTOK_KPK_BAD ? TK_DATA : TK_USAGE;
    }
    if (o.chat) rc = do_chat(tk, &o);
    else {
        kbuf in = {0};
        if (read_input(o.text, o.file ? o.file : o.from_stdin ? "-" : NULL, &in)) rc = TK_USAGE;
        else if (o.jsonl) rc = do_jsonl(tk, &o, in.p, in.n);
        else if (o.decode) rc = do_decode(tk, &o, in.p, in.n);
        else rc = do_encode(tk, &o, in.p, in.n);
        kbuf_free(&in);
    }
    ktok_free(tk);
    if (fflush(stdout) || ferror(stdout)) {
        fprintf(stderr, "krun tokenize: cannot write the output: %s\n", strerror(errno));
        return TK_USAGE;
    }
    return rc;
}

/* krun batch's input and output lines (batch.h).  IN is the OpenAI Batch file format: one JSON
 * object a line, {"custom_id": "...", "method": "POST", "url": "/v1/chat/completions" |
 * "/v1/completions", "body": {...}}.  Each line is checked here for what the batch itself needs;
 * its body is checked by the API's own parser when it runs (srv_prepare), as krun serve checks it. */
#include "batch.h"

#include "format/kio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

/* IN at most (it is read whole; its outputs are kept in memory). */
#define KBATCH_IN_MAX ((size_t)4 << 30)

static void bad(kbatch_item *it, const char *field, const char *why)
{
    it->bad = 1;
    snprintf(it->field, sizeof it->field, "%s", field);
    snprintf(it->why, sizeof it->why, "%s", why);
}

/* The number of times the line's top-level object has the key "custom_id" (keys as JSON decodes
 * them: "custom\u005fid" too), by a walk over the text that tracks depth outside strings. */
static int custom_id_keys(const char *t, size_t n)
{
    int depth = 0, expect_key = 0, count = 0;
    for (size_t i = 0; i < n; i++) {
        char c = t[i];
        if (c == '"') {
            size_t b = i++;
            while (i < n && t[i] != '"') i += t[i] == '\\' ? 2 : 1;
            if (i >= n) break;                                   /* not JSON: counted no further */
            if (depth == 1 && expect_key) {
                json_t *k = json_loadb(t + b, i + 1 - b, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
                count += json_is_string(k) && json_string_length(k) == 9 && !memcmp(json_string_value(k), "custom_id", 9);
                json_decref(k);
            }
            expect_key = 0;
        } else if (c == '{' || c == '[') {
            depth++;
            expect_key = c == '{' && depth == 1;
        } else if (c == '}' || c == ']') {
            depth--;
        } else if (c == ',') {
            expect_key = depth == 1;
        }
    }
    return count;
}

/* One line (text, n bytes, no newline) into it.  -1: out of memory. */
static int read_line(const char *text, size_t n, kbatch_item *it)
{
    json_error_t je;
    json_t *o = json_loadb(text, n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je), *v;
    const char *s;
    char why[300];
    if (!o && json_error_code(&je) == json_error_duplicate_key && custom_id_keys(text, n) == 1) {
        /* a key twice in one object: refused, as krun serve refuses such a body (reqjson.c: one rule);
         * the output line still names the request when its custom_id is there once (issue 34.13) */
        json_t *lenient = json_loadb(text, n, JSON_ALLOW_NUL, NULL);
        v = json_object_get(lenient, "custom_id");
        if (json_is_string(v) && !(it->custom_id = strndup(json_string_value(v), json_string_length(v)))) { json_decref(lenient); return -1; }
        json_decref(lenient);
        snprintf(why, sizeof why, "a key twice in one object (column %d): each key may appear once", je.column);
        bad(it, "", why);
        return 0;
    }
    if (!o) {
        snprintf(why, sizeof why, "not JSON: %s (column %d)", je.text, je.column);
        bad(it, "", why);
        return 0;
    }
    if (!json_is_object(o)) { bad(it, "", "not a JSON object"); goto done; }
    v = json_object_get(o, "custom_id");
    if (json_is_string(v)) {
        if (!(it->custom_id = strndup(json_string_value(v), json_string_length(v)))) { json_decref(o); return -1; }
        if (strlen(it->custom_id) != json_string_length(v)) { bad(it, "custom_id", "custom_id holds U+0000"); goto done; }
        if (!*it->custom_id) { bad(it, "custom_id", "custom_id is empty"); goto done; }
    } else {
        bad(it, "custom_id", v ? "custom_id is not a string" : "no custom_id: every line needs one, to tell its output apart");
        goto done;
    }
    v = json_object_get(o, "method");
    s = json_string_value(v);
    if (!s || strcmp(s, "POST")) { bad(it, "method", v ? "method must be \"POST\"" : "no method (\"POST\")"); goto done; }
    v = json_object_get(o, "url");
    s = json_string_value(v);
    if (s && !strcmp(s, "/v1/chat/completions")) it->chat = 1;
    else if (!s || strcmp(s, "/v1/completions")) {
        bad(it, "url", v ? "url must be \"/v1/chat/completions\" or \"/v1/completions\"" : "no url (\"/v1/chat/completions\" or \"/v1/completions\")");
        goto done;
    }
    v = json_object_get(o, "body");
    if (!json_is_object(v)) { bad(it, "body", v ? "body is not a JSON object" : "no body"); goto done; }
    if (!(it->body = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY))) { json_decref(o); return -1; }
    it->body_len = strlen(it->body);
done:
    json_decref(o);
    return 0;
}

static int by_id(const void *a, const void *b)
{
    const kbatch_item *x = *(const kbatch_item *const *)a, *y = *(const kbatch_item *const *)b;
    int c = strcmp(x->custom_id, y->custom_id);
    return c ? c : (x->line > y->line) - (x->line < y->line);
}

/* Two lines with one custom_id: named, with every line of the first such id. */
static int duplicates(const kbatch_input *in, const char *path, krun_err *err)
{
    kbatch_item **s = malloc((in->n ? in->n : 1) * sizeof *s);
    size_t n = 0, dups = 0;
    const char *first = NULL;
    char lines[200] = "";
    if (!s) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    for (size_t k = 0; k < in->n; k++)
        if (in->items[k].custom_id) s[n++] = &in->items[k];     /* a bad line's custom_id too: it has an output line */
    qsort(s, n, sizeof *s, by_id);
    for (size_t k = 1; k < n; k++) {
        if (strcmp(s[k]->custom_id, s[k - 1]->custom_id)) continue;
        dups++;
        if (!first) {
            first = s[k - 1]->custom_id;
            snprintf(lines, sizeof lines, "%zu", s[k - 1]->line);
        }
        if (!strcmp(s[k]->custom_id, first) && strlen(lines) + 24 < sizeof lines)
            snprintf(lines + strlen(lines), sizeof lines - strlen(lines), ", %zu", s[k]->line);
    }
    if (dups) {
        krun_err_set(err, KRUN_EINPUT, "%s: custom_id \"%.100s\" is on lines %s; every custom_id must be unique, to tell the "
                     "outputs apart (%zu line%s repeat%s an earlier one)", path, first, lines, dups, dups == 1 ? "" : "s", dups == 1 ? "s" : "");
    }
    free(s);
    return dups ? -1 : 0;
}

int kbatch_read(const char *path, kbatch_input *in, krun_err *err)
{
    char *text = NULL;
    size_t len = 0, line = 0;
    struct stat st;
    memset(in, 0, sizeof *in);
    /* a batch input is a file of JSON lines: a device (/dev/zero, whose size reads 0: an empty job, exit 0 before), a
     * directory, or a file without a request is not one (issue 34.13) */
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return krun_err_set(err, KRUN_EINPUT, "%s is %s, not a batch input: krun batch reads a file of JSON lines (OpenAI's batch "
                            "input format)", path, kio_file_kind(&st));
    if (kio_read_file(path, KBATCH_IN_MAX, &text, &len))
        return krun_err_set(err, errno == ENOMEM ? KRUN_ENOMEM : KRUN_EINPUT, "cannot read %s: %s", path,
                            errno == EFBIG ? "larger than 4 GiB" : strerror(errno));
    if (memchr(text, 0, len)) {
        size_t at = (size_t)((char *)memchr(text, 0, len) - text);
        free(text);
        return krun_err_set(err, KRUN_EINPUT, "%s is not a batch input: it is not text (a NUL byte at offset %zu); krun batch reads "
                            "a file of JSON lines", path, at);
    }
    in->hash = XXH3_64bits(text, len);
    in->size = len;
    for (size_t at = 0; at < len;) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - text) : len, n = end - at, b = at;
        line++;
        while (b < end && strchr(" \t\r", text[b])) b++;
        if (b < end) {
            kbatch_item *it;
            if (!(in->n & (in->n + 1)) || !in->items) {      /* grow at 0, 1, 3, 7, ... */
                kbatch_item *p = realloc(in->items, (2 * in->n + 2) * sizeof *p);
                if (!p) goto oom;
                in->items = p;
            }
            it = &in->items[in->n++];
            memset(it, 0, sizeof *it);
            it->line = line;
            if (read_line(text + at, n, it)) goto oom;
        }
        at = end + 1;
    }
    free(text);
    if (!in->n) {
        kbatch_input_free(in);
        return krun_err_set(err, KRUN_EINPUT, "%s holds no request: a batch input has one JSON object a line", path);
    }
    if (duplicates(in, path, err)) { kbatch_input_free(in); return -1; }
    return 0;
oom:
    free(text);
    kbatch_input_free(in);
    return krun_err_set(err, KRUN_ENOMEM, "out of memory reading %s", path);
}

void kbatch_input_free(kbatch_input *in)
{
    for (size_t k = 0; k < in->n; k++) {
        free(in->items[k].custom_id);
        free(in->items[k].body);
    }
    free(in->items);
    memset(in, 0, sizeof *in);
}

void kbatch_tag(const kbatch_input *in, char tag[17])
{
    snprintf(tag, 17, "%016llx", (unsigned long long)in->hash);
}

/* "custom_id" as JSON text, or null. */
static char *id_json(const kbatch_item *it)
{
    json_t *s = it->custom_id ? json_string(it->custom_id) : json_null();
    char *t = s ? json_dumps(s, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    json_decref(s);
    return t;
}

char *kbatch_line_response(const char *tag, const kbatch_item *it, int status, const char *request_id, const char *body)
{
    char *cid = id_json(it), *line = NULL;
    if (cid && asprintf(&line, "{\"id\":\"batch-%s-%zu\",\"custom_id\":%s,\"response\":{\"status_code\":%d,\"request_id\":\"%s\","
                        "\"body\":%s},\"error\":null}", tag, it->line, cid, status, request_id, body) < 0)
        line = NULL;
    free(cid);
    return line;
}

char *kbatch_line_bad(const char *tag, const kbatch_item *it)
{
    char msg[400], *cid = id_json(it), *err, *line = NULL;
    json_t *e;
    snprintf(msg, sizeof msg, "line %zu: %s", it->line, it->why);
    e = json_pack("{s:s, s:s, s:I, s:s}", "code", "invalid_batch_line", "message", msg, "line", (json_int_t)it->line, "field", it->field);
    err = e ? json_dumps(e, JSON_COMPACT) : NULL;
    if (cid && err && asprintf(&line, "{\"id\":\"batch-%s-%zu\",\"custom_id\":%s,\"response\":null,\"error\":%s}", tag, it->line, cid, err) < 0)
        line = NULL;
    json_decref(e);
    free(cid);
    free(err);
    return line;
}

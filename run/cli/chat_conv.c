/* krun chat's conversation and /save, /load (chat_conv.h). */
#include "chat_conv.h"

#include "format/kio.h"
#include "run/session/statefile.h"
#include "run/text/jsontext.h"
#include "run/util/savefile.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

int kconv_add(kconv *c, kchat_role role, const char *content, size_t len, const char *reasoning, size_t rlen)
{
    kconv_msg *m;
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        kconv_msg *p = realloc(c->msgs, cap * sizeof *p);
        if (!p) return -1;
        c->msgs = p;
        c->cap = cap;
    }
    m = &c->msgs[c->n];
    m->role = role;
    m->content = strndup(content ? content : "", content ? len : 0);
    m->reasoning = reasoning ? strndup(reasoning, rlen) : NULL;
    if (!m->content || (reasoning && !m->reasoning)) { free(m->content); free(m->reasoning); return -1; }
    c->n++;
    return 0;
}

void kconv_truncate(kconv *c, size_t n)
{
    while (c->n > n) {
        c->n--;
        free(c->msgs[c->n].content);
        free(c->msgs[c->n].reasoning);
    }
    if (c->fed > n) c->fed = n;
}

void kconv_free(kconv *c)
{
    kconv_truncate(c, 0);
    free(c->msgs);
    c->msgs = NULL;
    c->cap = 0;
}

kchat_message *kconv_view(const kconv *c)
{
    kchat_message *k = calloc(c->n ? c->n : 1, sizeof *k);
    if (!k) return NULL;
    for (size_t i = 0; i < c->n; i++) {
        k[i].role = c->msgs[i].role;
        k[i].content = c->msgs[i].content;
        k[i].content_len = strlen(c->msgs[i].content);
        k[i].reasoning = c->msgs[i].reasoning;
        k[i].reasoning_len = c->msgs[i].reasoning ? strlen(c->msgs[i].reasoning) : 0;
    }
    return k;
}

/* FILE.json (suffix ".json") or the pending FILE.json.new (".json.new"). */
static char *json_path(const char *path, const char *suffix)
{
    char *p;
    return asprintf(&p, "%s%s", path, suffix) < 0 ? NULL : p;
}

/* 1 if the open file is a conversation saved by krun chat (a save may replace it). */
static int is_conversation(int fd)
{
    json_t *j = json_loadfd(fd, 0, NULL);
    const char *f = json_string_value(json_object_get(j, "format"));
    int ok = f && strcmp(f, "krun chat 1") == 0;
    json_decref(j);
    return ok;
}

/* The history FILE.json (or .json.new) says its state holds: 0 with n and hash, -1 if it says nothing readable. */
static int conversation_history(const char *jp, uint64_t *n, uint64_t *hash)
{
    json_t *j = json_load_file(jp, 0, NULL);
    const char *h = json_string_value(json_object_get(j, "history_xxh3"));
    json_t *nt = json_object_get(j, "history_tokens");
    int rc = h && json_is_integer(nt) && json_integer_value(nt) >= 0 ? 0 : -1;
    if (!rc) {
        *n = (uint64_t)json_integer_value(nt);
        *hash = strtoull(h, NULL, 16);
    }
    json_decref(j);
    return rc;
}

/* A save of the pair FILE + FILE.json (docs/STATE.md §4): the new state and
 * conversation are written to temporary files and synced, then renamed in this
 * order: the conversation to FILE.json.new, the state over FILE, FILE.json.new
 * over FILE.json.  A failure before the second rename leaves the old pair; after
 * it, FILE and FILE.json.new are the new pair, which settle() finishes.
 *
 * settle: the conversation file that belongs to the state FILE — FILE.json, or
 * FILE.json.new when only it matches the state (a save stopped between its last
 * two renames), which is then renamed over FILE.json (dirfd: the directory,
 * locked by the caller; -1: locked here).  Returns the path to read (malloc'd),
 * or NULL when out of memory; *pending says that FILE.json.new is the state's
 * conversation and could not be renamed (a save must not replace it then). */
static char *settle(const char *path, int dirfd, int *pending)
{
    char *jp = json_path(path, ".json"), *jn = json_path(path, ".json.new");
    uint64_t n, hash, jn_n, jn_hash;
    krun_err e;
    int lock = -1;
    *pending = 0;
    if (!jp || !jn) { free(jp); free(jn); return NULL; }
    if (access(jn, F_OK) != 0 || krun_state_tokens_xxh3(path, &n, &hash, &e) ||
        conversation_history(jn, &jn_n, &jn_hash) || jn_n != n || jn_hash != hash) {
        free(jn);
        return jp; /* nothing pending, or what is pending is not this state's */
    }
    {
        uint64_t j_n, j_hash;
        if (conversation_history(jp, &j_n, &j_hash) == 0 && j_n == n && j_hash == hash) { free(jn); return jp; }
    }
    /* FILE.json.new is the conversation of FILE: finish the save it belongs to */
    if (dirfd < 0 && (lock = ksave_lock_dir(path, &e)) < 0) {
        fprintf(stderr, "krun chat: %s holds the conversation of %s (an interrupted save); %s\n", jn, path, e.msg);
        free(jp);
        *pending = 1;
        return jn;
    }
    if (ksave_rename(jn, jp, dirfd >= 0 ? dirfd : lock, &e) == -1) {
        fprintf(stderr, "krun chat: %s holds the conversation of %s (an interrupted save): %s\n", jn, path, e.msg);
        if (access(jn, F_OK) == 0) { free(jp); jp = jn; jn = NULL; *pending = 1; }
    } else {
        fprintf(stderr, "krun chat: finished an interrupted save of %s (%s renamed to %s)\n", path, jn, jp);
    }
    if (lock >= 0) close(lock);
    free(jn);
    return jp;
}

/* XXH3 of a token history, as 32-bit little-endian ids (the state file's layout). */
static uint64_t tokens_hash(const int32_t *ids, size_t n) { return XXH3_64bits(ids, n * sizeof *ids); }

/* A JSON string of text that may not be valid UTF-8 (a reply cut inside a character). */
static json_t *text_json(const char *s)
{
    kbuf b = {0};
    json_t *j;
    kutf8_sanitize(s, strlen(s), &b);
    j = b.oom ? NULL : json_stringn(b.p ? b.p : "", b.n);
    kbuf_free(&b);
    return j;
}

/* FILE.json's object: the OpenAI "messages", the settings, the history's length and XXH3. */
static json_t *conversation_json(const kconv *c, const krun_session *s, const krun_model *m, const char *path)
{
    size_t n;
    const int32_t *ids = krun_session_tokens(s, &n);
    char hash[24];
    json_t *j = json_object(), *msgs = json_array();
    if (!j || !msgs) { json_decref(j); json_decref(msgs); return NULL; }
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)tokens_hash(ids, n));
    for (size_t i = 0; i < c->n; i++) {
        json_t *x = json_object();
        json_object_set_new(x, "role", json_string(kchat_role_name(c->msgs[i].role)));
        json_object_set_new(x, "content", text_json(c->msgs[i].content));
        if (c->msgs[i].reasoning) json_object_set_new(x, "reasoning_content", text_json(c->msgs[i].reasoning));
        json_array_append_new(msgs, x);
    }
    json_object_set_new(j, "format", json_string("krun chat 1"));
    json_object_set_new(j, "model", json_string(krun_model_path(m)));
    json_object_set_new(j, "state", json_string(path));
    json_object_set_new(j, "template", json_boolean(c->template));
    json_object_set_new(j, "thinking", json_boolean(c->opts.thinking));
    json_object_set_new(j, "effort", c->opts.effort == KCHAT_EFFORT_NONE ? json_null() : json_string(kchat_effort_name(c->opts.effort)));
    json_object_set_new(j, "history_tokens", json_integer((json_int_t)n));
    json_object_set_new(j, "history_xxh3", json_string(hash));
    json_object_set_new(j, "messages", msgs);
    return j;
}

int kconv_save(const kconv *c, const krun_session *s, const krun_model *m, const char *path)
{
    char *jp = json_path(path, ".json"), *jn = json_path(path, ".json.new"), *text = NULL;
    json_t *j = NULL;
    ksave st = {.fd = -1}, js = {.fd = -1};
    krun_err e;
    size_t n, len;
    int dir = -1, rc = -1, r;
    krun_session_tokens(s, &n);
    if (!jp || !jn || !(j = conversation_json(c, s, m, path)) || !(len = json_dumpb(j, NULL, 0, JSON_INDENT(1) | JSON_ENSURE_ASCII)) ||
        !(text = malloc(len)) || json_dumpb(j, text, len, JSON_INDENT(1) | JSON_ENSURE_ASCII) != len) {
        fprintf(stderr, "krun chat: out of memory\n");
        goto out;
    }
    /* one save at a time in the directory; an earlier save stopped between its renames is finished first */
    if ((dir = ksave_lock_dir(path, &e)) < 0) goto fail;
    {
        int pending;
        char *was = settle(path, dir, &pending);
        free(was);
        if (!was || pending) {
            krun_err_set(&e, KRUN_EINPUT, "%s: %s; nothing was saved", path,
                         was ? "the conversation of its earlier save could not be put in place (above)" : "out of memory");
            goto fail;
        }
    }
    if (ksave_target_ok(path, krun_state_is_file, "a krun state file", &e) ||
        ksave_target_ok(jp, is_conversation, "a conversation saved by krun chat", &e) ||
        ksave_target_ok(jn, is_conversation, "a conversation saved by krun chat", &e))
        goto fail;
    /* both files complete and synced under temporary names: a failure so far leaves the old pair */
    if (ksave_begin(&st, path, &e)) goto fail;
    if (krun_session_save_to(s, &st, &e)) { ksave_abort(&st); goto fail; }
    if (ksave_finish(&st, &e)) goto fail;
    if (ksave_begin(&js, jp, &e)) { ksave_abort(&st); goto fail; }
    ksave_write(&js, text, len);
    if (ksave_finish(&js, &e)) { ksave_abort(&st); goto fail; }
    /* the renames: the conversation waits as FILE.json.new until the state is in place */
    if ((r = ksave_rename_to(&js, jn, dir, &e)) == -1) { ksave_abort(&st); goto fail; }
    if ((r = ksave_rename_to(&st, path, dir, &e)) == -1) { unlink(jn); goto fail; } /* the old pair stands */
    if (r == -2) fprintf(stderr, "krun chat: %s\n", e.msg); /* the state is in place: finish the pair */
    if ((r = ksave_rename(jn, jp, dir, &e)) == -1) {
        fprintf(stderr, "krun chat: saved the state to %s, but %s; %s holds its conversation, and /load %s uses it\n", path,
                e.msg, jn, path);
        goto out;
    }
    if (r == -2) goto fail;
    fprintf(stderr, "krun chat: saved %zu positions to %s and the conversation to %s\n", n, path, jp);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "krun chat: %s\n", e.msg);
out:
    if (dir >= 0) close(dir);
    json_decref(j);
    free(text);
    free(jp);
    free(jn);
    return rc;
}

/* The messages of FILE.json into a fresh list; NULL with a message on stderr. */
static json_t *read_conversation(const char *jp, uint64_t *hash, size_t *n_tokens, int *template)
{
    json_error_t je;
    json_t *j = json_load_file(jp, 0, &je), *msgs;
    const char *h;
    if (!j) { fprintf(stderr, "krun chat: %s: %s (line %d)\n", jp, je.text, je.line); return NULL; }
    msgs = json_object_get(j, "messages");
    h = json_string_value(json_object_get(j, "history_xxh3"));
    if (!json_is_array(msgs) || !h || !json_is_integer(json_object_get(j, "history_tokens")) ||
        strcmp(json_string_value(json_object_get(j, "format")) ? json_string_value(json_object_get(j, "format")) : "", "krun chat 1")) {
        fprintf(stderr, "krun chat: %s is not a conversation saved by krun chat (format \"krun chat 1\")\n", jp);
        json_decref(j);
        return NULL;
    }
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")) ||
            !json_is_string(json_object_get(m, "content"))) {
            fprintf(stderr, "krun chat: %s: messages[%zu] needs a role (system, user, assistant) and a content string\n", jp, i);
            json_decref(j);
            return NULL;
        }
    }
    *hash = strtoull(h, NULL, 16);
    *n_tokens = (size_t)json_integer_value(json_object_get(j, "history_tokens"));
    *template = json_is_true(json_object_get(j, "template"));
    return j;
}

int kconv_load(kconv *c, krun_session *s, const char *path)
{
    int pending;
    char *jp = settle(path, -1, &pending);
    uint64_t hash, pos, nt;
    size_t n_tokens;
    int template;
    json_t *j;
    krun_err e;
    kconv fresh = {0};
    int rc = -1;
    if (!jp) { fprintf(stderr, "krun chat: out of memory\n"); return -1; }
    if (krun_state_peek(path, &pos, &nt, &e)) { fprintf(stderr, "krun chat: %s\n", e.msg); free(jp); return -1; }
    j = read_conversation(jp, &hash, &n_tokens, &template);
    if (!j) { free(jp); return -1; }
    if (template != c->template) {
        fprintf(stderr, "krun chat: %s was a %s conversation; this model's is %s\n", jp, template ? "chat-format" : "plain-text",
                c->template ? "in the chat format" : "plain text");
        goto out;
    }
    /* the state must be the conversation's: check its tokens before replacing anything */
    /* the whole file checked through a small buffer first (the conversation in memory stays if it
     * is refused); loading then reads it again, straight into the session: no copy of it is held */
    {
        krun_state_reader r;
        uint64_t th = 0;
        int fd = open(path, O_RDONLY | O_CLOEXEC), bad;
        if (fd < 0) { fprintf(stderr, "krun chat: cannot read %s: %s\n", path, strerror(errno)); goto out; }
        bad = krun_state_read_begin(&r, fd, path, &e) || krun_state_read_check(&r, &th, &e);
        nt = r.h.n_tokens;
        krun_state_read_end(&r);
        close(fd);
        if (bad) { fprintf(stderr, "krun chat: %s\n", e.msg); goto out; }
        if (nt != n_tokens || th != hash) {
            fprintf(stderr, "krun chat: %s does not hold the conversation of %s (another save?): nothing loaded\n", path, jp);
            goto out;
        }
    }
    /* the messages first (nothing is replaced if memory runs out), then the state */
    fresh.template = c->template;
    fresh.opts = c->opts;
    {
        json_t *msgs = json_object_get(j, "messages");
        for (size_t i = 0; i < json_array_size(msgs); i++) {
            json_t *x = json_array_get(msgs, i), *r = json_object_get(x, "reasoning_content"), *t = json_object_get(x, "content");
            const char *role = json_string_value(json_object_get(x, "role"));
            if (kconv_add(&fresh, !strcmp(role, "system") ? KCHAT_SYSTEM : !strcmp(role, "user") ? KCHAT_USER : KCHAT_ASSISTANT,
                          json_string_value(t), json_string_length(t), json_string_value(r), json_string_length(r))) {
                fprintf(stderr, "krun chat: out of memory\n");
                goto out;
            }
        }
        fresh.fed = fresh.n;
        /* the conversation goes on in the mode it was in */
        if (json_is_boolean(json_object_get(j, "thinking"))) fresh.opts.thinking = json_is_true(json_object_get(j, "thinking"));
        fresh.opts.effort = json_is_string(json_object_get(j, "effort")) ? kchat_effort_parse(json_string_value(json_object_get(j, "effort")))
                                                                         : KCHAT_EFFORT_NONE;
        if (fresh.opts.effort == KCHAT_EFFORT_INVALID) fresh.opts.effort = KCHAT_EFFORT_NONE;
    }
    if (krun_session_load(s, path, &e)) { fprintf(stderr, "krun chat: %s\n", e.msg); goto out; }
    kconv_free(c);
    *c = fresh;
    fresh = (kconv){0};
    fprintf(stderr, "krun chat: loaded %zu messages, %zu positions (thinking %s)\n", c->n, n_tokens, c->opts.thinking ? "on" : "off");
    rc = 0;
out:
    kconv_free(&fresh);
    json_decref(j);
    free(jp);
    return rc;
}


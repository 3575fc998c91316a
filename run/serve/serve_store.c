/* Stored responses (serve.h, srv_store): POST /v1/responses with store keeps its response and its
 * conversation here, for previous_response_id and GET / DELETE /v1/responses/ID.  In RAM, bounded
 * by a count and by bytes, least recently used out.  Everything is kept as JSON text and handed out
 * as copies (parsed anew), so no JSON tree is shared between connection threads. */
#include "serve.h"

#include <stdlib.h>
#include <string.h>

/* Bytes of JSON kept at most, whatever the count (a conversation holds a whole chat history). */
#define STORE_BYTES (256ull << 20)

typedef struct {
    char id[64];
    char *response;            /* the response object */
    char *conversation;        /* every item so far: the previous conversation, this input, this output */
    char *input;               /* this request's input items */
    size_t bytes;
    uint64_t used;             /* the last use (a counter) */
} entry;

struct srv_store {
    pthread_mutex_t mu;
    entry *e;
    size_t n, cap;
    size_t bytes;
    uint64_t clock;
    size_t stored, evicted;
};

srv_store *srv_store_new(size_t cap)
{
    srv_store *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (pthread_mutex_init(&s->mu, NULL)) { free(s); return NULL; }
    s->cap = cap;
    if (cap && !(s->e = calloc(cap, sizeof *s->e))) { pthread_mutex_destroy(&s->mu); free(s); return NULL; }
    return s;
}

static void drop(srv_store *s, size_t i)
{
    free(s->e[i].response);
    free(s->e[i].conversation);
    free(s->e[i].input);
    s->bytes -= s->e[i].bytes;
    s->e[i] = s->e[--s->n];
}

void srv_store_free(srv_store *s)
{
    if (!s) return;
    while (s->n) drop(s, s->n - 1);
    free(s->e);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static size_t find(const srv_store *s, const char *id)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->e[i].id, id)) return i;
    return (size_t)-1;
}

int srv_store_put(srv_store *s, const char *id, const json_t *response, const json_t *conversation, const json_t *input)
{
    entry x;
    memset(&x, 0, sizeof x);
    if (!s || !s->cap) return 0;
    snprintf(x.id, sizeof x.id, "%s", id);
    x.response = json_dumps(response, JSON_COMPACT);
    x.conversation = json_dumps(conversation, JSON_COMPACT);
    x.input = json_dumps(input, JSON_COMPACT);
    if (!x.response || !x.conversation || !x.input) { free(x.response); free(x.conversation); free(x.input); return -1; }
    x.bytes = strlen(x.response) + strlen(x.conversation) + strlen(x.input);
    pthread_mutex_lock(&s->mu);
    {
        size_t old = find(s, id);
        if (old != (size_t)-1) drop(s, old);
    }
    /* room: the least recently used out */
    while (s->n && (s->n == s->cap || s->bytes + x.bytes > STORE_BYTES)) {
        size_t lru = 0;
        for (size_t i = 1; i < s->n; i++) if (s->e[i].used < s->e[lru].used) lru = i;
        drop(s, lru);
        s->evicted++;
    }
    x.used = ++s->clock;
    s->e[s->n++] = x;
    s->bytes += x.bytes;
    s->stored++;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* A copy of one of an entry's texts, parsed; NULL when there is no such entry. */
static json_t *get(srv_store *s, const char *id, int which)
{
    json_t *j = NULL;
    size_t i;
    if (!s) return NULL;
    pthread_mutex_lock(&s->mu);
    if ((i = find(s, id)) != (size_t)-1) {
        const char *t = which == 0 ? s->e[i].response : which == 1 ? s->e[i].conversation : s->e[i].input;
        s->e[i].used = ++s->clock;
        j = json_loads(t, JSON_ALLOW_NUL, NULL);
    }
    pthread_mutex_unlock(&s->mu);
    return j;
}

json_t *srv_store_response(srv_store *s, const char *id) { return get(s, id, 0); }
json_t *srv_store_conversation(srv_store *s, const char *id) { return get(s, id, 1); }
json_t *srv_store_input(srv_store *s, const char *id) { return get(s, id, 2); }

int srv_store_delete(srv_store *s, const char *id)
{
    size_t i;
    int found = 0;
    if (!s) return 0;
    pthread_mutex_lock(&s->mu);
    if ((i = find(s, id)) != (size_t)-1) { drop(s, i); found = 1; }
    pthread_mutex_unlock(&s->mu);
    return found;
}

json_t *srv_store_json(srv_store *s)
{
    json_t *j;
    if (!s) return json_null();
    pthread_mutex_lock(&s->mu);
    j = json_pack("{sI sI sI sI sI}", "entries", (json_int_t)s->n, "max_entries", (json_int_t)s->cap, "bytes", (json_int_t)s->bytes,
                  "stored", (json_int_t)s->stored, "evicted", (json_int_t)s->evicted);
    pthread_mutex_unlock(&s->mu);
    return j;
}

/* Special-token tables: built-in K2 / K3 tables (fixtures README §4) and tokenizer_config.json. */
#include "tokenizer.h"
#include "run/util/krun_err.h"

#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KTOK_SPECIAL_BASE  163584
#define KTOK_SPECIAL_COUNT 256

typedef struct { int32_t id; const char *text; } named;

/* Kimi K2 family (K2, K2-Thinking, K2.5/2.6, Kimi-Linear): the union of the named ids, including
 * the media tokens (K2.5/Thinking/VL configs) and <think>/</think> (K2-Thinking, K2.5+). */
static const named K2_NAMES[] = {
    {163584, "[BOS]"},
    {163585, "[EOS]"},
    {163586, "<|im_end|>"},
    {163587, "<|im_user|>"},
    {163588, "<|im_assistant|>"},
    {163590, "<|start_header_id|>"},
    {163591, "<|end_header_id|>"},
    {163593, "[EOT]"},
    {163594, "<|im_system|>"},
    {163595, "<|tool_calls_section_begin|>"},
    {163596, "<|tool_calls_section_end|>"},
    {163597, "<|tool_call_begin|>"},
    {163598, "<|tool_call_argument_begin|>"},
    {163599, "<|tool_call_end|>"},
    {163601, "<|im_middle|>"},
    {163602, "<|media_begin|>"},
    {163603, "<|media_content|>"},
    {163604, "<|media_end|>"},
    {163605, "<|media_pad|>"},
    {163606, "<think>"},
    {163607, "</think>"},
    {163838, "[UNK]"},
    {163839, "[PAD]"},
};

/* Kimi K3. */
static const named K3_NAMES[] = {
    {163584, "[BOS]"},
    {163585, "[EOS]"},
    {163586, "<|end_of_msg|>"},
    {163587, "<|open|>"},
    {163588, "<|close|>"},
    {163589, "<|sep|>"},
    {163590, "[start_header_id]"},
    {163591, "[end_header_id]"},
    {163593, "[EOT]"},
    {163602, "<|media_begin|>"},
    {163603, "<|media_content|>"},
    {163604, "<|media_end|>"},
    {163605, "<|media_pad|>"},
    {163649, "<osagent_mode>"},
    {163838, "[UNK]"},
    {163839, "[PAD]"},
};

static char *dupstr(const char *s)
{
    size_t l = strlen(s);
    char *d = malloc(l + 1);
    if (d) memcpy(d, s, l + 1);
    return d;
}

static char *reserved_name(int32_t id)
{
    char buf[48];
    int l = snprintf(buf, sizeof buf, "<|reserved_token_%d|>", (int)id);
    if (l < 0 || (size_t)l >= sizeof buf) return NULL;
    return dupstr(buf);
}

void ktok_specials_free(ktok_special *s, size_t n)
{
    if (!s) return;
    for (size_t i = 0; i < n; i++) free((char *)s[i].text);
    free(s);
}

static int cmp_id(const void *a, const void *b)
{
    const ktok_special *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

int ktok_specials_fill_reserved(ktok_special **list, size_t *n, int32_t first, int32_t count)
{
    if (!list || !n || count < 0 || first < 0 || first > INT32_MAX - count || (!*list && *n)) return -1;
    size_t have = *n, add = 0;
    for (int32_t id = first; id < first + count; id++) {
        int found = 0;
        for (size_t i = 0; i < have && !found; i++) found = (*list)[i].id == id;
        if (!found) add++;
    }
    if (add == 0) return 0;
    ktok_special *nl = malloc((have + add) * sizeof *nl);
    if (!nl) return -1;
    if (have) memcpy(nl, *list, have * sizeof *nl);
    size_t k = have;
    for (int32_t id = first; id < first + count; id++) {
        int found = 0;
        for (size_t i = 0; i < have && !found; i++) found = (*list)[i].id == id;
        if (found) continue;
        char *name = reserved_name(id);
        if (!name) {
            for (size_t i = have; i < k; i++) free((char *)nl[i].text);
            free(nl);
            return -1;
        }
        nl[k].id = id;
        nl[k].text = name;
        k++;
    }
    qsort(nl, k, sizeof *nl, cmp_id);
    free(*list);
    *list = nl;
    *n = k;
    return 0;
}

int ktok_specials_builtin(const char *family, ktok_special **out, size_t *n)
{
    if (!family || !out || !n) return -1;
    *out = NULL;
    *n = 0;
    const named *tab;
    size_t nt;
    if (strcmp(family, "k3") == 0) { tab = K3_NAMES; nt = sizeof K3_NAMES / sizeof K3_NAMES[0]; }
    else if (strcmp(family, "k2") == 0) { tab = K2_NAMES; nt = sizeof K2_NAMES / sizeof K2_NAMES[0]; }
    else return -1;
    ktok_special *s = calloc(KTOK_SPECIAL_COUNT, sizeof *s);
    if (!s) return -1;
    size_t k = 0;
    for (int32_t i = 0; i < KTOK_SPECIAL_COUNT; i++) {
        int32_t id = KTOK_SPECIAL_BASE + i;
        const char *name = NULL;
        for (size_t j = 0; j < nt; j++)
            if (tab[j].id == id) name = tab[j].text;
        char *t = name ? dupstr(name) : reserved_name(id);
        if (!t) { ktok_specials_free(s, k); return -1; }
        s[k].id = id;
        s[k].text = t;
        k++;
    }
    *out = s;
    *n = k;
    return 0;
}

int ktok_specials_from_config(const char *json, size_t len, ktok_special **out, size_t *n,
                              krun_err *err)
{
    if (!out || !n) { krun_err_set(err, KRUN_EINPUT, "tokenizer_config.json: NULL output"); return -1; }
    *out = NULL;
    *n = 0;
    if (!json && len) { krun_err_set(err, KRUN_EINPUT, "tokenizer_config.json: NULL buffer"); return -1; }
    json_error_t je;
    json_t *root = json_loadb(json ? json : "", len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        krun_err_set(err, KRUN_EINPUT, "tokenizer_config.json line %d column %d: %s", je.line, je.column, je.text);
        return -1;
    }
    int rc = -1;
    ktok_special *s = NULL;
    size_t k = 0;
    json_t *dec = json_is_object(root) ? json_object_get(root, "added_tokens_decoder") : NULL;
    if (!dec || !json_is_object(dec)) {
        krun_err_set(err, KRUN_EINPUT, "tokenizer_config.json: no \"added_tokens_decoder\" object");
        goto done;
    }
    size_t cnt = json_object_size(dec);
    s = calloc(cnt ? cnt : 1, sizeof *s);
    if (!s) { krun_err_set(err, KRUN_ENOMEM, "out of memory"); goto done; }
    const char *key;
    json_t *val;
    json_object_foreach(dec, key, val) {
        /* the id is the key: a plain decimal number */
        long long id = 0;
        const char *q = key;
        if (!*q) goto badkey;
        for (; *q; q++) {
            if (*q < '0' || *q > '9') goto badkey;
            id = id * 10 + (*q - '0');
            if (id > INT32_MAX) goto badkey;
        }
        if (q - key > 1 && key[0] == '0') goto badkey;
        json_t *c = json_is_object(val) ? json_object_get(val, "content") : val;
        if (!c || !json_is_string(c) || json_string_length(c) == 0) {
            krun_err_set(err, KRUN_EINPUT, "tokenizer_config.json: added_tokens_decoder[\"%s\"] has no \"content\" string", key);
            goto done;
        }
        if (strlen(json_string_value(c)) != json_string_length(c)) {
            krun_err_set(err, KRUN_EINPUT, "tokenizer_config.json: added_tokens_decoder[\"%s\"] content contains NUL", key);
            goto done;
        }
        char *t = dupstr(json_string_value(c));
        if (!t) { krun_err_set(err, KRUN_ENOMEM, "out of memory"); goto done; }
        s[k].id = (int32_t)id;
        s[k].text = t;
        k++;
        continue;
    badkey:
        krun_err_set(err, KRUN_EINPUT, "tokenizer_config.json: added_tokens_decoder key \"%.40s\" is not a token id", key);
        goto done;
    }
    qsort(s, k, sizeof *s, cmp_id);
    *out = s;
    *n = k;
    s = NULL;
    rc = 0;
done:
    if (s) ktok_specials_free(s, k);
    json_decref(root);
    return rc;
}

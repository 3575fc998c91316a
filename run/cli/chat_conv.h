/* krun chat's conversation: the messages so far (what FILE.json records), how many of them
 * are in the session's state, the chat options, and /save and /load of the two together. */
#ifndef KRUN_CHAT_CONV_H
#define KRUN_CHAT_CONV_H

#include "run/session/session.h"
#include "run/text/chat.h"

#include <stddef.h>

typedef struct {
    kchat_role role;
    char *content, *reasoning;   /* malloc'd, NUL-terminated; reasoning may be NULL */
} kconv_msg;

typedef struct {
    kconv_msg *msgs;
    size_t n, cap;
    size_t fed;                  /* messages whose tokens are in the session's state */
    int template;                /* in K3's chat format (else plain continuation) */
    kchat_options opts;          /* thinking, effort, generation prompt */
} kconv;

/* Append a message (copied).  Returns 0, or -1 on allocation failure. */
int  kconv_add(kconv *c, kchat_role role, const char *content, size_t len, const char *reasoning, size_t rlen);
/* Forget the messages from the n-th on. */
void kconv_truncate(kconv *c, size_t n);
void kconv_free(kconv *c);
/* The messages as kchat_messages for the renderer (malloc'd; pointing into c). */
kchat_message *kconv_view(const kconv *c);

/* /save FILE: the session's state to FILE, the conversation to FILE.json (the OpenAI "messages",
 * the thinking settings, the history's length and XXH3).  Reports on stderr; returns 0 or -1. */
int kconv_save(const kconv *c, const krun_session *s, const krun_model *m, const char *path);
/* /load FILE: checks that FILE.json describes FILE's history and that both fit this model before
 * anything is replaced; then the session holds FILE's state and c its conversation (in its own
 * thinking mode).  Reports on stderr; returns 0, or -1 with the session and c unchanged. */
int kconv_load(kconv *c, krun_session *s, const char *path);

#endif

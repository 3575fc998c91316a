/* The grammar of a constrained K3 reply (chat_constrain.c; docs/SERVE.md, "Structured output"):
 * the chat options of a request (chat.h) made the automaton its reply must follow (kgram.h). */
#ifndef KRUN_CHAT_CONSTRAIN_H
#define KRUN_CHAT_CONSTRAIN_H
#include "kgram.h"
#include "run/text/chat.h"

#include <stddef.h>

/* The grammar a reply must follow under these options (constrained decoding, docs/SERVE.md), from
 * the token after the generation prompt to <|end_of_msg|>, or NULL when nothing constrains it.
 * What constrains it: response_format json_object / json_schema (the response channel is one JSON
 * value, and nothing else), a named tool_choice (the reply is one call of that tool, its arguments
 * valid against its parameters), and tools declared "strict": true (unless tool_choice is none: a
 * call of a strict tool has valid arguments; with tool_choice required the reply calls tools).
 * With thinking on, the think channel is free text and the constraint begins with the response
 * channel.  Returns 0 with *out (NULL: unconstrained; else the caller frees it with kgram_free), or
 * -1 with msg and param (the request field: "response_format.json_schema.schema.properties.age",
 * "tools[1].function.parameters") naming what is refused or malformed. */
int kchat_constraint(const kchat_options *o, kgram **out, char *param, size_t plen, char *msg, size_t mlen);

#endif

/* The Kimi K3 chat format ("XTML", shared/spec/K3_CHAT.md): rendering a conversation to token
 * ids, and reading the model's reply back (whole, or token by token for streaming).
 *
 * Rendering is built segment by segment: the four markers <|open|> <|close|> <|sep|>
 * <|end_of_msg|> are special ids, every other segment (a tag header such as
 * `message role="user"`, message content, reasoning, argument values, the internal system
 * messages) is encoded with special-token recognition OFF, so text that spells a marker stays
 * text.  A tag header (tag name and all its attributes) is one segment.
 *
 * Prefix stability: the prompt of turn n+1 is turn n's prompt + the reply as generated + the
 * continuation.  A chat loop that keeps its model state renders only the continuation with
 * kchat_render_continue (and, for a reply cut off before <|end_of_msg|>, first feeds the
 * tokens of kchat_parser_closing).  Request-scoped directives (tool_choice none/required) sit
 * just before the generation prompt and so are not part of the stable prefix.
 *
 * Nothing here needs the model: only a loaded tokenizer (or none, for text-only rendering and
 * text parsing). */
#ifndef KRUN_CHAT_H
#define KRUN_CHAT_H
#include "tokenizer.h"

#include <stddef.h>
#include <stdint.h>

/* The four markers (K3 ids 163587, 163588, 163589, 163586; taken from the tokenizer by text). */
#define KCHAT_OPEN        "<|open|>"
#define KCHAT_CLOSE       "<|close|>"
#define KCHAT_SEP         "<|sep|>"
#define KCHAT_END_OF_MSG  "<|end_of_msg|>"

/* ---- conversation ------------------------------------------------------------------------ */

typedef enum { KCHAT_EFFORT_INVALID = -1, KCHAT_EFFORT_NONE = 0, KCHAT_EFFORT_LOW, KCHAT_EFFORT_HIGH,
               KCHAT_EFFORT_MAX } kchat_effort;
/* "low" | "high" | "max" -> the effort; anything else (including NULL) -> KCHAT_EFFORT_INVALID. */
kchat_effort kchat_effort_parse(const char *s);
const char  *kchat_effort_name(kchat_effort e);    /* "low", "high", "max"; "none"; "invalid" */

typedef enum { KCHAT_SYSTEM, KCHAT_USER, KCHAT_ASSISTANT, KCHAT_TOOL } kchat_role;
const char *kchat_role_name(kchat_role r);

typedef struct {
    const char *id;          /* the OpenAI tool_call id that tool results refer to; may be NULL */
    const char *name;        /* the function's name (required) */
    const char *arguments;   /* JSON text of an object: rendered argument by argument; text that is
                                not JSON becomes one <json type="object"> block; NULL or blank: none;
                                JSON that is not an object is an error */
} kchat_tool_call;

typedef struct {
    kchat_role role;
    const char *content;      /* may be NULL (empty) */
    size_t content_len;
    const char *name;         /* system / user: the optional name attribute (NULL or "" = none) */
    const char *reasoning;    /* assistant: the think channel; rendered only in thinking mode */
    size_t reasoning_len;
    const kchat_tool_call *tool_calls;   /* assistant */
    size_t n_tool_calls;
    const char *tool_call_id; /* tool: the call this result answers (its name is used) */
    const char *tool_name;    /* tool: explicit tool name; else the matching call's, else the call at
                                 the same position after the last assistant message */
} kchat_message;

typedef enum { KCHAT_TOOL_CHOICE_AUTO = 0, KCHAT_TOOL_CHOICE_NONE, KCHAT_TOOL_CHOICE_REQUIRED,
               KCHAT_TOOL_CHOICE_NAMED } kchat_tool_choice;
typedef enum { KCHAT_FORMAT_TEXT = 0, KCHAT_FORMAT_JSON_OBJECT, KCHAT_FORMAT_JSON_SCHEMA } kchat_format;

typedef struct {
    int thinking;                 /* 1: the think channel is on */
    kchat_effort effort;          /* with thinking: the thinking-effort message (NONE: no message) */
    const char *tools_json;       /* the OpenAI "tools" array as JSON text, or NULL (none) */
    kchat_tool_choice tool_choice;/* NONE / REQUIRED / NAMED add a tool-choice directive (with tools only) */
    const char *tool_name;        /* NAMED: the tool the reply must call */
    kchat_format format;          /* JSON_OBJECT / JSON_SCHEMA add a response-format directive */
    const char *format_schema;    /* JSON_SCHEMA: the schema, as JSON text */
    int add_generation_prompt;    /* end with the assistant's opening tags */
} kchat_options;

/* thinking on, effort max (the chat templates' default), no tools, generation prompt. */
void kchat_options_default(kchat_options *o);

/* ---- rendering --------------------------------------------------------------------------- */

typedef struct {
    int32_t *ids;     /* malloc'd; NULL when rendered without a tokenizer */
    size_t n_ids;
    size_t n_preamble;/* ids of the system/tools part: the tool declaration, the effort message and the
                         leading system messages (0 in a continuation).  Many conversations share it (an
                         agent's tools and instructions): a prefix cache keeps the state there. */
    char *text;       /* malloc'd, NUL-terminated: the same rendering with the markers spelled out */
    size_t text_len;
} kchat_rendering;
void kchat_rendering_free(kchat_rendering *r);

/* The whole prompt: [tool declaration] [thinking effort] messages [tool-choice] [response-format]
 * [generation prompt].
 * tk may be NULL (text only).  Returns 0, or -1 with a message in err naming the message
 * ("messages[3]: ...") or the option; an unknown effort or a tool result whose tool cannot be
 * named is an error.  tk must have the four markers. */
int kchat_render(const ktok *tk, const kchat_message *msgs, size_t n, const kchat_options *o,
                 kchat_rendering *out, krun_err *err);
/* The continuation after msgs[0..from) were fed (e.g. a kept chat state after a reply that ended
 * with <|end_of_msg|>): msgs[from..n) [directive] [generation prompt], no tool declaration or
 * effort message.  kchat_render(all) == kchat_render(msgs[0..from) without generation prompt) +
 * kchat_render_continue(from). */
int kchat_render_continue(const ktok *tk, const kchat_message *msgs, size_t n, size_t from,
                          const kchat_options *o, kchat_rendering *out, krun_err *err);

/* ---- reading the reply ------------------------------------------------------------------- */

/* Where a reply is.  A reply starts inside the channel the generation prompt opened. */
typedef enum {
    KCHAT_AT_THINK,       /* inside the think channel */
    KCHAT_AT_RESPONSE,    /* inside the response channel */
    KCHAT_AT_TOOLS,       /* inside the tool calls */
    KCHAT_AT_MESSAGE,     /* inside the message, between channels */
    KCHAT_AT_CLOSED,      /* the message is closed, <|end_of_msg|> not seen yet */
    KCHAT_AT_END          /* <|end_of_msg|> seen: the reply is complete */
} kchat_where;

typedef enum {
    KCHAT_EV_REASONING,       /* text, len: more of the think channel (reasoning_content) */
    KCHAT_EV_CONTENT,         /* text, len: more of the response channel (content) */
    KCHAT_EV_TOOL_CALL_BEGIN, /* index, name: a call's header is complete */
    KCHAT_EV_TOOL_CALL        /* index, name, text = arguments (a JSON object, compact): the call is complete */
} kchat_event_kind;

typedef struct {
    kchat_event_kind kind;
    const char *text;         /* valid for the callback's duration; UTF-8 (see below) */
    size_t len;
    int index;                /* tool calls: 0-based, in order (OpenAI's tool_calls[].index) */
    const char *name;         /* tool calls: the tool's name */
} kchat_event;

/* Return non-zero to stop: the feed function then returns -1. */
typedef int (*kchat_event_fn)(void *ctx, const kchat_event *ev);

typedef struct kchat_parser kchat_parser;

/* A parser for one reply.  thinking: the generation prompt opened the think channel (else the
 * response channel).  tk is needed for kchat_parser_feed_id (it may be NULL for text only).
 * Returns NULL on allocation failure or when tk lacks the markers. */
kchat_parser *kchat_parser_new(const ktok *tk, int thinking);
void kchat_parser_free(kchat_parser *p);

/* Feed one generated id.  Events are emitted as soon as they are certain: channel text at once
 * (an incomplete UTF-8 sequence at the end is held until it completes or the channel ends), a
 * call when it closes.  Marker text and tag headers are never emitted.  Returns 1 once the reply
 * is complete (<|end_of_msg|>; later input is ignored), 0 to go on, -1 on allocation failure or a
 * callback's stop. */
int kchat_parser_feed_id(kchat_parser *p, int32_t id, kchat_event_fn fn, void *ctx);
/* Feed generated text in any pieces (markers as their literal strings; a marker split across two
 * calls is recognised: the tail that could begin one is held back).  Same return values. */
int kchat_parser_feed_text(kchat_parser *p, const char *text, size_t len, kchat_event_fn fn, void *ctx);
/* The generation ended (stop token, length, cancel): emit what is held back (bytes of an
 * incomplete UTF-8 sequence, a partial marker as text).  A call still open is emitted with the
 * arguments complete so far.  Returns 0, or -1 as above. */
int kchat_parser_finish(kchat_parser *p, kchat_event_fn fn, void *ctx);

kchat_where kchat_parser_where(const kchat_parser *p);
/* Number of markers or stray text the format does not allow that were met and dropped. */
size_t kchat_parser_malformed(const kchat_parser *p);
size_t kchat_parser_n_calls(const kchat_parser *p);
/* The tokens that close the reply from where it is (e.g. after a cut-off inside think:
 * </think><response></response></message><|end_of_msg|>), so that a kept chat state ends in a
 * well-formed message before the next turn's continuation.  Empty at KCHAT_AT_END.  *ids is
 * malloc'd (may be NULL when *n == 0).  Returns 0 or -1. */
int kchat_parser_closing(const kchat_parser *p, const ktok *tk, int32_t **ids, size_t *n);

/* A whole reply. */
typedef struct {
    char *name;
    char *arguments;          /* JSON object text (compact) */
} kchat_call;

typedef struct {
    char *reasoning;          /* NUL-terminated, never NULL after a successful parse */
    size_t reasoning_len;
    char *content;
    size_t content_len;
    kchat_call *calls;
    size_t n_calls;
    kchat_where where;        /* KCHAT_AT_END if it ended with <|end_of_msg|> */
    size_t malformed;
} kchat_reply;

/* Parse generated ids (tk needed) or text.  The reply starts after the generation prompt (the
 * prompt's ids are not included).  Returns 0, or -1 on allocation failure. */
int kchat_parse_ids(const ktok *tk, const int32_t *ids, size_t n, int thinking, kchat_reply *out);
int kchat_parse_text(const char *text, size_t len, int thinking, kchat_reply *out);
void kchat_reply_free(kchat_reply *r);
/* OpenAI finish_reason: "tool_calls" (ended with calls), "stop" (ended), "length" (cut off). */
const char *kchat_finish_reason(kchat_where where, size_t n_calls);

#endif

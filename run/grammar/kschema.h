/* JSON Schema -> grammar (kgram.h), for constrained decoding: a JSON document that the schema
 * accepts (response_format json_schema / json_object), or a K3 tool call's arguments.
 *
 * Supported (docs/SERVE.md, "Structured output", lists them with what each does):
 *   type (a name or an array of names: string, number, integer, boolean, null, object, array),
 *   properties, required, additionalProperties (false; true or a schema for a map without
 *   properties), items (one schema), minItems, maxItems, minLength, maxLength, enum, const,
 *   anyOf, $ref (local: "#", "#/$defs/...", any JSON pointer into the document), $defs and
 *   definitions (where $ref points), and boolean schemas (true, false).
 *   Annotations are accepted and change nothing: title, description, default, examples,
 *   $schema, $id, $comment, deprecated, readOnly, writeOnly.
 * Anything else (pattern, format, minimum, multipleOf, oneOf, allOf, not, if, prefixItems,
 * uniqueItems, patternProperties, ...) is refused, naming the keyword and where it is: the
 * constraint could not guarantee it.
 *
 * What the grammar generates (a subset of what the schema accepts, so always valid): properties in
 * the order the schema declares them (required ones never skipped), only declared properties when
 * there are any, strings with JSON escapes but no \u escape of a surrogate (non-BMP characters are
 * written as UTF-8) or of NUL, numbers with at most 16 integer digits, 16 fraction digits and a 2-digit
 * exponent, whitespace only as one space or a newline with up to 40 spaces or tabs between
 * tokens. */
#ifndef KRUN_KSCHEMA_H
#define KRUN_KSCHEMA_H

#include "kgram.h"

#include <jansson.h>

typedef struct {
    char path[256];   /* where in the schema, dot-separated from its root ("properties.age.minimum"; "" = the root) */
    char msg[400];
} kschema_err;

typedef struct kschema_ctx kschema_ctx;

/* A compiler over one grammar; root is the document $ref "#" resolves to (borrowed). */
kschema_ctx *kschema_new(kgram *g, json_t *root);
void kschema_free(kschema_ctx *c);

/* The grammar of a JSON value the schema accepts, followed by next.  Returns 0 and its first node,
 * or -1 with e filled (a refused or malformed schema, or no memory). */
int kschema_json(kschema_ctx *c, json_t *schema, uint32_t next, uint32_t *start, kschema_err *e);
/* Optional whitespace as the JSON grammar allows it between tokens, then next. */
uint32_t kschema_ws(kschema_ctx *c, uint32_t next);
/* The arguments of a K3 tool call whose parameters are this schema (K3_CHAT.md §4): one
 * <|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|> per argument, a string
 * value as raw text, any other as JSON; then next.  schema NULL: no arguments (none declared).
 * Returns 0 and the first node, or -1 with e. */
int kschema_k3_args(kschema_ctx *c, json_t *schema, uint32_t next, uint32_t *start, kschema_err *e);

/* The attribute escaping of the chat format (K3_CHAT.md §1): & -> &amp;, " -> &quot;.  Appends to a
 * malloc'd string; NULL on allocation failure. */
char *kschema_attr_escape(const char *s);

#endif

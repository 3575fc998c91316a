/* JSON text helpers shared by the chat template (chat.c), the OpenAI API (oai.c) and
 * `krun tokenize`:
 *  - kbuf: a growable byte buffer whose allocation failure is sticky (check .oom once at the end);
 *  - kjson_py_dump: JSON text byte-identical to Python's json.dumps(v, ensure_ascii=False), with
 *    or without sort_keys and the compact separators; K3's renderer (encoding_k3.py) writes the
 *    tool declaration and non-string tool-call arguments this way, so the ids depend on it;
 *  - kutf8_sanitize: text that a JSON string can hold (ill-formed UTF-8 becomes U+FFFD). */
#ifndef KRUN_JSONTEXT_H
#define KRUN_JSONTEXT_H
#include <jansson.h>
#include <stddef.h>

typedef struct {
    char *p;        /* NUL-terminated when non-NULL */
    size_t n, cap;
    int oom;        /* an append failed: the contents are incomplete */
} kbuf;

void kbuf_add(kbuf *b, const void *p, size_t n);
void kbuf_puts(kbuf *b, const char *s);
void kbuf_printf(kbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kbuf_free(kbuf *b);
/* Removes the first n bytes (all of them if n is more). */
void kbuf_drop(kbuf *b, size_t n);
/* Server-sent events read from b: drops the blank lines at its head, then returns 1 with *len the
 * length of the block at b->p that a blank line ends (the caller drops len + 2 once it has read
 * it), or 0 while no block is whole yet. */
int kbuf_sse_block(kbuf *b, size_t *len);

/* Python json.dumps(v, ensure_ascii=False, sort_keys=sort_keys, separators=(",", ":") if compact
 * else (", ", ": ")): floats as Python's repr (shortest round trip, "1e+16", "1e-05", "2.0"),
 * control characters as \u00xx (lower-case hex), '/' and non-ASCII unescaped.  Keys sort by code
 * point (= UTF-8 byte order).  Appends to out. */
void kjson_py_dump(const json_t *v, int sort_keys, int compact, kbuf *out);

/* Python repr() of a finite double, as json.dumps writes it.  Appends to out. */
void kjson_py_float(double x, kbuf *out);

/* Appends s[0..n) to out with each maximal ill-formed UTF-8 subsequence replaced by U+FFFD.
 * Returns the number of replacements. */
size_t kutf8_sanitize(const char *s, size_t n, kbuf *out);

/* A JSON string of bytes that may not be valid UTF-8 (a message quoting a client's body, model
 * output cut inside a character): kutf8_sanitize's text, or NULL when out of memory.  (jansson's
 * own json_string refuses such bytes with NULL, which reads as out of memory.) */
json_t *kjson_text(const char *s, size_t n);

#endif

/* Writing a one-line error message into a caller's buffer: the convention of
 * every "char *err, size_t errlen" parameter in this project. */
#ifndef KPK_ERRBUF_H
#define KPK_ERRBUF_H

#include <stddef.h>

/* Formats into err (if err is non-NULL and errlen > 0), truncating. */
void errbuf_set(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif

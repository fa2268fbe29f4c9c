/*
 * jsonw.h — the JSON value writer of the daemon (request bodies) and of
 * the C client (pgw_object_to_json): strings, integers and floats appended
 * to a strbuf. Containers and separators are the caller's.
 *
 * Output does not depend on the process's locale: a float always uses
 * '.' (the client library runs inside applications that may call
 * setlocale). Pure functions; safe from any callback or thread on
 * distinct buffers.
 */
#ifndef POLYGW_JSONW_H
#define POLYGW_JSONW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strbuf.h"

enum {
    JSONW_EBADUTF8 = -3,   /* jsonw_str: the input is not valid UTF-8 */
    JSONW_ENOTFINITE = -4, /* jsonw_double: NaN or an infinity has no JSON form */
};

/* Appends `s` (borrowed; NULL allowed when n is 0) as a quoted JSON string:
 * \" \\ \n \r \t \b \f, other control characters as \u00XX, valid
 * non-ASCII UTF-8 copied as is. Returns 0, STRBUF_ENOMEM, or JSONW_EBADUTF8
 * with the offset of the first invalid byte in *bad_at; on failure part of
 * the string may have been appended (the caller rolls `len` back). */
int jsonw_str(struct strbuf *b, const char *s, size_t n, size_t *bad_at);

/* The escape of the ASCII byte c inside a JSON string, as jsonw_str()
 * writes it, in out: its length (2 or 6), or 0 when c stands for itself.
 * For writers that keep their own buffer (the log line, fixed answers). */
size_t jsonw_escape(unsigned char c, char out[6]);

/* Exact decimal text over the whole range. 0 or STRBUF_ENOMEM. */
int jsonw_u64(struct strbuf *b, uint64_t v);
int jsonw_i64(struct strbuf *b, int64_t v);

/* A float64 as the fewest of 15, 16 or 17 significant digits that parses
 * back to the same double (0.1 prints "0.1"; values with at most 6
 * decimals take a fast path without snprintf); with `is_f32`, the value
 * rounded to float and the fewest of 6..9 digits that parses back to the
 * same float. It always keeps a '.' or an exponent (1.0 prints "1.0",
 * -0.0 "-0.0"). Returns 0, STRBUF_ENOMEM, or JSONW_ENOTFINITE (nothing
 * appended). */
int jsonw_double(struct strbuf *b, double d, bool is_f32);

#endif /* POLYGW_JSONW_H */

/*
 * jscan.h — a validating JSON scanner that builds nothing.
 *
 * The HTTP front end relays JSON as it is, and needs only a few top-level
 * members of it (a request's "stream" and "max_tokens", a reply's
 * "usage", a stream event's "choices[].finish_reason"). Parsing a tree
 * for that (jansson) would cost an allocation per value on the hot path;
 * this walks the text once, checks it is JSON (RFC 8259: grammar, string
 * escapes, UTF-8, at most JSCAN_MAX_DEPTH nested containers), and reports
 * the members of the outermost object or the elements of the outermost
 * array as spans of the input.
 *
 * Pure computation: no allocation, no I/O, no globals; safe anywhere.
 */
#ifndef POLYGW_JSCAN_H
#define POLYGW_JSCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__) && !defined(JSCAN_NO_SSE2)
#include <emmintrin.h>
#endif

#define JSCAN_MAX_DEPTH 64

enum jscan_type {
    JSCAN_OBJECT,
    JSCAN_ARRAY,
    JSCAN_STRING,
    JSCAN_NUMBER,
    JSCAN_TRUE,
    JSCAN_FALSE,
    JSCAN_NULL
};

/* A value: its bytes in the input (a string's include the quotes). */
struct jscan_value {
    enum jscan_type type;
    const char *p;
    size_t len;
};

/* Called for each member of the outermost object. `key` is the member's
 * name unescaped (NUL-terminated; a name longer than 63 bytes, or holding
 * \u0000, is passed as "" so that it never matches). Returning non-zero
 * stops the walk (jscan_object then returns that value). */
typedef int jscan_member_fn(void *ud, const char *key, const struct jscan_value *v);
/* Called for each element of the outermost array, likewise. */
typedef int jscan_element_fn(void *ud, const struct jscan_value *v);

/* Checks that s[0..len) is one JSON text (whitespace around it allowed).
 * Returns 0, or -1 with the byte offset of the first error in *err_at
 * (may be NULL). */
int jscan_check(const char *s, size_t len, size_t *err_at);

/* Checks s[0..len) and, when it is an object, calls `fn` for each member in
 * order (fn may be NULL). Returns 0 when it is a valid object; -1 when it
 * is not valid JSON (*err_at as above); -2 when it is valid JSON but not
 * an object; or fn's non-zero value. Every member has been checked before
 * the first call of `fn`. */
int jscan_object(const char *s, size_t len, jscan_member_fn *fn, void *ud, size_t *err_at);

/* The same for an array and its elements (-2: not an array). */
int jscan_array(const char *s, size_t len, jscan_element_fn *fn, void *ud, size_t *err_at);

/* A JSCAN_STRING value (checked by the scanner) unescaped into out: at
 * most `max` bytes, then a NUL. Returns its length (a \u0000 is a NUL
 * byte within it), or -1 when it needs more than `max` bytes (a \u escape
 * needs room for four). `out` of v->len bytes always suffices. */
long jscan_string(const struct jscan_value *v, char *out, size_t max);

/* A JSCAN_STRING value unescaped into a malloc'd NUL-terminated copy;
 * NULL when v->p is NULL or out of memory. */
char *jscan_strdup(const struct jscan_value *v);

/* The value of a hex digit, or -1. */
int jscan_hexval(char ch);

/* A JSCAN_NUMBER value as a double; false for any other type. */
bool jscan_number(const struct jscan_value *v, double *out);

/* Plain string bytes are those a JSON string holds as they are: printable
 * ASCII other than '"' and '\\'. jscan_plain_run(p, end) returns the first
 * byte of [p, end) that is not plain ('"', '\\', a control character, a
 * byte >= 0x80), or end; it reads nothing at or past end. Both JSON readers
 * (this scanner and transcode.c's lexer) run every string through it, so
 * it is inline: 16 bytes a step with SSE2 (every x86-64; -DJSCAN_NO_SSE2
 * builds without), else 8 with the portable jscan_plain_run_swar, which is
 * declared for every machine so that its tests run where SSE2 would
 * otherwise hide it. */
static inline const unsigned char *jscan_plain_run_swar(const unsigned char *p,
                                                        const unsigned char *end)
{
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;

    while (end - p >= 8) {
        uint64_t v;
        memcpy(&v, p, sizeof(v));
        uint64_t q = v ^ (ones * '"'), b = v ^ (ones * '\\');
        /* A byte's high bit is set when it is '"' or '\\' (the zero-byte
         * test), below 0x20 (the subtraction borrows) or >= 0x80. Borrows
         * only ever carry upwards from a byte that is flagged already, so
         * the lowest flag is exactly the first byte that is not plain. */
        uint64_t stop = (((q - ones) & ~q) | ((b - ones) & ~b) | (v - ones * 0x20) | v) & highs;
        if (stop) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            return p + (__builtin_ctzll(stop) >> 3);
#else
            break;
#endif
        }
        p += 8;
    }
    while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\')
        p++;
    return p;
}

static inline const unsigned char *jscan_plain_run(const unsigned char *p, const unsigned char *end)
{
#if defined(__SSE2__) && !defined(JSCAN_NO_SSE2)
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\'),
                  space = _mm_set1_epi8(0x20);

    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        /* a signed compare: bytes >= 0x80 are negative, below 0x20 too */
        __m128i stop =
            _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)),
                         _mm_cmplt_epi8(v, space));
        unsigned m = (unsigned)_mm_movemask_epi8(stop);
        if (m)
            return p + __builtin_ctz(m);
        p += 16;
    }
#endif
    return jscan_plain_run_swar(p, end);
}

#endif /* POLYGW_JSCAN_H */

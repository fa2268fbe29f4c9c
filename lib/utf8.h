/*
 * utf8.h — one UTF-8 validator for the daemon, the client and the tools.
 *
 * Valid means RFC 3629: no overlong forms (C0, C1, E0 80..9F, F0 80..8F),
 * no surrogates (ED A0..BF), nothing above U+10FFFF (F4 90.., F5..FF).
 * Pure functions on borrowed bytes.
 */
#ifndef POLYGW_UTF8_H
#define POLYGW_UTF8_H

#include <stddef.h>

struct strbuf;

/* Length (2..4) of the valid sequence that the non-ASCII byte p[0] starts,
 * or 0 when it is invalid or cut short by `end` (p < end). */
size_t utf8_seq_len(const unsigned char *p, const unsigned char *end);

/* Length of the maximal subpart at p[0] when it starts no valid sequence:
 * the lead byte and the continuation bytes that could still have completed
 * a sequence (so "\xE2\x82A" is one bad subpart of 2 bytes, then 'A'), the
 * unit a decoder replaces with one U+FFFD. Always at least 1 (p < end). */
size_t utf8_bad_len(const unsigned char *p, const unsigned char *end);

/* The length of the longest prefix of s[0..n) that is valid UTF-8: n when
 * all of it is. `s` may be NULL when n is 0. */
size_t utf8_valid_prefix(const char *s, size_t n);

/* The largest length <= max at which s[0..n) can be cut without splitting
 * a character (n itself when n <= max). */
size_t utf8_cut(const char *s, size_t n, size_t max);

/* Appends s[0..n) to `out` as valid UTF-8: each maximal invalid subsequence
 * (a stray continuation byte, an overlong or surrogate form, a code point
 * above U+10FFFF, a sequence cut short) becomes one U+FFFD, as Unicode
 * recommends and as Python's and WHATWG's decoders do; valid text
 * (NUL bytes included) is copied unchanged. `s` is borrowed, may be NULL
 * when n is 0. Returns the number of replacements made, or STRBUF_ENOMEM
 * with `out` unchanged. */
long utf8_repair(const char *s, size_t n, struct strbuf *out);

#endif /* POLYGW_UTF8_H */

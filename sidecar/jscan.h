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

/* The value of a hex digit, or -1. */
int jscan_hexval(char ch);

/* A JSCAN_NUMBER value as a double; false for any other type. */
bool jscan_number(const struct jscan_value *v, double *out);

#endif /* POLYGW_JSCAN_H */

/*
 * expo_check.h — for the unit tests of src/prom.c and sidecar/metrics/metrics.c: a
 * strict reader of the Prometheus text format 0.0.4. Every sample must
 * belong to the family whose HELP and TYPE came just before it (counters
 * named _total, no family twice), names and label names must be valid,
 * label values well escaped, values must parse, and every histogram's
 * buckets must be cumulative, end in le="+Inf" and agree with _count.
 * Failures are Check assertions.
 */
#ifndef POLYGW_TEST_EXPO_CHECK_H
#define POLYGW_TEST_EXPO_CHECK_H

#include <stddef.h>

/* Checks `text`; returns the number of samples. */
size_t expo_check(const char *text);

/* Asserts that `s` (a rendering's result) is non-NULL and `len` bytes
 * long up to its NUL; returns it. */
char *expo_text(char *s, size_t len);

/* Asserts that `line` is one whole line of `text`. */
void expo_assert_line(const char *text, const char *line);

#endif

/*
 * respids.h — the memory backend's record of which source produced each
 * Responses API response (docs/CONFIG.md, "responses"): response id ->
 * source name, each entry forgotten `ttl_s` after it was written, and at
 * most `max` entries (the oldest go first).
 *
 * Entries are kept in the order they were written, which, with one TTL
 * for all, is also the order they expire in: expiring and evicting both
 * take from the head. Lookups go through a chained hash table sized to a
 * power of two of at least `max` buckets. Time is the caller's (`now`,
 * any monotonic seconds), so the rules are tested without sleeping.
 */
#ifndef POLYGW_RESPIDS_H
#define POLYGW_RESPIDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest response id remembered, and longest source name (bytes). */
#define RESPIDS_ID_MAX     128
#define RESPIDS_SOURCE_MAX 64

struct respids;

/* Is s[0..n) an id polygw keeps: 1 to RESPIDS_ID_MAX bytes of
 * A-Z a-z 0-9 _ - . :, not starting with a dot (what providers' response
 * ids are made of; safe as a URL path segment and in a Redis key)? */
bool respids_id_ok(const char *s, size_t n);

/* An empty record, or NULL when out of memory. */
struct respids *respids_new(void);
void respids_free(struct respids *r);

/* Remembers that `source` produced `id` until now + ttl_s, replacing an
 * earlier entry for the id, then drops the oldest entries while more than
 * `max` (>= 1) are held. Ids or names too long are not remembered.
 * 0, or -1 when out of memory (nothing changed). */
int respids_put(struct respids *r, const char *id, const char *source, double ttl_s, size_t max,
                double now);

/* The source that produced `id` (borrowed until the next put), or NULL
 * when unknown or expired. */
const char *respids_get(struct respids *r, const char *id, double now);

/* Entries held (expired ones not yet dropped included). */
size_t respids_count(const struct respids *r);

#endif /* POLYGW_RESPIDS_H */

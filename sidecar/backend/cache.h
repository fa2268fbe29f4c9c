/*
 * cache.h — the response cache's memory tier: answers kept by the hash of
 * what determines them, bounded by one byte cap with least-recently-used
 * eviction, each entry living until its own expiry (docs/CONFIG.md,
 * "cache").
 *
 * An entry is a list of records, each a name and two byte strings: call.c
 * stores a plain answer as one record (its body, its usage) and a stream
 * as one record per event (its `event:` name, its data, its msgpack form),
 * so that a hit replays exactly what the upstream's answer relayed.
 *
 * The key (cache_key_make) is SHA-256 over the namespace (the app, or a
 * shared one), the capability, the model asked for, the call's form (a
 * stream or not, msgpack or JSON client) and the request body in a
 * canonical form: map members sorted by key bytes, the top-level members
 * `stream`, `stream_options` and `user` left out (they do not change the
 * answer). Numbers keep their type: 1 and 1.0 are different bodies.
 *
 * Loop thread only; no clock reads: `now` is passed in.
 */
#ifndef POLYGW_CACHE_H
#define POLYGW_CACHE_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CACHE_KEY_BYTES 32

struct cache_key {
    unsigned char h[CACHE_KEY_BYTES];
};

/* Bits of the call's form, part of the key. */
#define CACHE_FORM_STREAM  1u
#define CACHE_FORM_MSGPACK 2u

/* Fills `out` from the parts above (all borrowed; `model` may be NULL).
 * `body` is the request as a msgpack object (a JSON body transcoded).
 * Returns 0, or -1 when hashing fails (out of memory). */
int cache_key_make(struct cache_key *out, const char *ns, const char *capability, const char *model,
                   size_t model_len, unsigned form, const msgpack_object *body);

/* The key in lower-case hex into out[2 * CACHE_KEY_BYTES + 1]. */
void cache_key_hex(const struct cache_key *k, char *out);

/* The entry's name in the shared tier (docs/CONFIG.md, "cache"; the Redis
 * key schema in tests/redis/README.md), into out[CACHE_SHARED_NAME_LEN + 1]:
 * 64 lower-case hex digits, the first 8 naming `capability`, the next 8
 * the namespace `ns` (the app, or "" for a shared capability; both
 * NUL-terminated, borrowed), then the key's first 24 bytes. So a purge
 * finds one capability's or one app's entries by pattern
 * (cache_shared_pattern) without an index, and the name holds only hex
 * digits: no brace, glob or separator character. The 8-digit parts are a
 * 32-bit hash: two names that share one only make a purge of either drop
 * the other's entries too, never keep one it should drop. */
#define CACHE_SHARED_NAME_LEN (2 * CACHE_KEY_BYTES)
void cache_shared_name(const struct cache_key *k, const char *capability, const char *ns,
                       char *out);

/* The glob (Redis MATCH syntax) of the shared names of `capability` and
 * namespace `ns` (NULL: any; both NULL: every entry), into
 * out[CACHE_SHARED_NAME_LEN + 1]: hex digits, '?' and one final '*'. */
void cache_shared_pattern(const char *capability, const char *ns, char *out);

struct cache_stats {
    uint64_t hits, misses, bypasses, coalesced, stores, evictions, expired, too_big, purged;
    size_t bytes; /* held now, entries' data and bookkeeping */
    size_t entries;
};

struct cache;

/* A cache of at most `max_bytes` (0: holds nothing). Returns owned, NULL
 * when out of memory. */
struct cache *cache_new(size_t max_bytes);
void cache_free(struct cache *c);

/* A reload's new cap: evicts down to it at once. */
void cache_set_max_bytes(struct cache *c, size_t max_bytes);

/* An answer being collected: records added until it is put or dropped.
 * Bounded: past `max_bytes` of records it is marked too big and keeps
 * nothing more (cache_put then stores nothing). */
struct cache_fill;
struct cache_fill *cache_fill_new(size_t max_bytes);
void cache_fill_free(struct cache_fill *f);
/* Adds one record (`name` NUL-terminated or NULL; a/b may be NULL with
 * length 0). Returns 0, or -1 once the fill is too big or out of memory. */
int cache_fill_add(struct cache_fill *f, const char *name, const char *a, size_t a_len,
                   const char *b, size_t b_len);

/* The records added so far, serialized (borrowed until the next add or
 * free; *len 0 once too big): what the Redis tier stores. */
const char *cache_fill_bytes(const struct cache_fill *f, size_t *len);

/* A fill of records serialized by cache_fill_bytes (borrowed, copied), as
 * read back from the Redis tier: NULL when they are not well-formed
 * records (every length inside the data, names NUL-terminated), larger
 * than `max_bytes`, or out of memory. */
struct cache_fill *cache_fill_from(const char *data, size_t len, size_t max_bytes);

/* Tags what `f` will store with the capability and the namespace (the
 * app, or "" for a shared capability; both NUL-terminated, borrowed), for
 * cache_purge_match. Returns 0, or -1 when out of memory (untagged: only
 * a purge of everything drops the entry). */
int cache_fill_tag(struct cache_fill *f, const char *capability, const char *ns);

/* Stores `f` (takes it, even on failure) as the entry of `k`, made at
 * `now`, until `expires_at`, replacing any entry of `k`, evicting the least recently
 * used entries to keep the cap. A fill too big for its own bound or for
 * the cache is dropped (counted too_big). */
void cache_put(struct cache *c, const struct cache_key *k, struct cache_fill *f, double now,
               double expires_at);

/* One record of an entry, borrowed while the entry is (until the next
 * cache_put, cache_purge or cache_free). */
struct cache_rec {
    const char *name; /* NULL: none */
    const char *a, *b;
    size_t a_len, b_len;
};

struct cache_entry;

/* The live entry of `k`, made most recently used; NULL when none, when
 * older than `max_age_s` (< 0: any age) or expired (an expired one is
 * freed). Counts nothing: the caller says
 * whether it was a hit (cache_count). */
const struct cache_entry *cache_get(struct cache *c, const struct cache_key *k, double now,
                                    double max_age_s);

/* Walks an entry's records: `*pos` starts at 0; returns false past the
 * last. */
bool cache_entry_next(const struct cache_entry *e, size_t *pos, struct cache_rec *r);

/* A coalesced call waited for an identical one in flight and was
 * answered from the entry it stored. */
enum cache_event { CACHE_HIT, CACHE_MISS, CACHE_BYPASS, CACHE_COALESCED };
#define CACHE_EVENTS 4
void cache_count(struct cache *c, enum cache_event ev);

/* Drops every entry. */
void cache_purge(struct cache *c);

/* Drops the entries tagged with `capability` and namespace `ns` (either
 * NULL: any; both NULL: every entry). Returns how many were dropped
 * (counted `purged`). */
size_t cache_purge_match(struct cache *c, const char *capability, const char *ns);

void cache_get_stats(const struct cache *c, struct cache_stats *out);

/* What a call asks of the cache: the HTTP front's Cache-Control, the
 * msgpack front's `cache` parameter (docs/HTTP.md, proto/PROTOCOL.md). */
enum cache_mode {
    CACHE_USE = 0,  /* look up, store on a miss */
    CACHE_NO_CACHE, /* skip the lookup, store the answer */
    CACHE_NO_STORE, /* neither */
};

/* Reads a client's Cache-Control value (NUL-terminated): no-store,
 * no-cache, max-age=N set `*mode` / `*has_max_age` and `*max_age_s`;
 * other directives are ignored. Returns 0, or -1 when it named none of
 * them (the msgpack parameter refuses that; HTTP ignores it). */
int cache_parse_mode(const char *v, enum cache_mode *mode, bool *has_max_age, double *max_age_s);

/* The life an upstream's Cache-Control value (NULL or "" = none) gives an
 * entry of `ttl_s`: 0 for no-store or private; max-age=N (or s-maxage)
 * caps it at N; no-cache is ignored (every provider's stream carries it). */
double cache_upstream_ttl(const char *cc, double ttl_s);

#endif /* POLYGW_CACHE_H */

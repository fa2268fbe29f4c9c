/*
 * rawcall.h — what a passthrough call (a capability with `body: raw`,
 * docs/CONFIG.md §6b) keeps beside the governed call of call.c: its
 * method, the sub-path and query the client asked for, its Content-Type
 * and its body, all relayed as they came, never parsed.
 *
 * call.c owns one per raw call and asks it for each attempt's request
 * (raw_call_spec). Retries: only a request that is idempotent by HTTP
 * semantics (RFC 9110, "Idempotent Methods": GET and DELETE) may be sent
 * more than once; a POST gets one attempt, whatever max_attempts says,
 * since the upstream may have acted on it before failing.
 */
#ifndef POLYGW_RAWCALL_H
#define POLYGW_RAWCALL_H

#include <stdbool.h>
#include <stddef.h>

struct config_source;
struct attempt_spec;

struct raw_call {
    const char *method; /* static: "GET", "POST" or "DELETE" */
    char *suffix;       /* owned: appended to the capability's path ("" = none) */
    char *ctype_line;   /* owned: "Content-Type: ..." sent upstream, or NULL */
    char *body;         /* owned: the request body (NULL: none) */
    size_t body_len;
    char **headers; /* owned array (borrowed lines): the attempt's headers */
    char *url;      /* owned: the attempt's URL (holds a key with auth_query) */
};

/* A copy of a call's passthrough parts (call_req's `method`,
 * `path_suffix`, `content_type`, `raw_body` and `raw_len`; NULL method:
 * POST, NULL suffix: none); NULL when out of memory. */
struct raw_call *raw_call_new(const char *method, const char *suffix, const char *ctype,
                              const char *body, size_t len);

/* What is wrong with a sub-path and query s[0..n) to put after a raw
 * capability's path, or NULL: it must be empty or start with '/' or '?',
 * hold printable ASCII without spaces or '#', and its path part no dot
 * segment ("." or "..", percent-encoded or not), which could name
 * another upstream endpoint than the capability's. */
const char *raw_call_suffix_problem(const char *s, size_t n);

/* One of "GET", "POST", "DELETE" equal to s[0..n) (static), or NULL. */
const char *raw_call_method(const char *s, size_t n);

/* Wipes what may hold a key and frees. NULL is a no-op. */
void raw_call_free(struct raw_call *rc);

/* May the request be sent again after a failure (GET, DELETE)? */
bool raw_call_idempotent(const struct raw_call *rc);

/* Sets the passthrough parts of `as` for source `src` and the capability's
 * upstream path `cap_path`: URL (base_url + cap_path + suffix, then the
 * source's query), headers (the source's, then the client's
 * Content-Type), a copy of the body, the method; `stream` is left as the
 * caller set it (a resumed Responses stream is a streamed GET). Every
 * pointer stays valid until the next call or raw_call_free. -1 when out of
 * memory. */
int raw_call_spec(struct raw_call *rc, const struct config_source *src, const char *cap_path,
                  struct attempt_spec *as);

#endif /* POLYGW_RAWCALL_H */

/*
 * redact.h — keeps the secrets the sidecar sends upstream out of what it
 * relays back.
 *
 * Providers echo keys: "invalid key: Bearer sk-…" in a 401 body is common,
 * and a hostile or buggy upstream can put a key anywhere in a reply or a
 * stream event. The sidecar knows every secret it sends (each source's API
 * key), so every upstream byte it passes on — reply bodies, error bodies,
 * stream events, error details — goes through this module first: each exact
 * occurrence of a secret is replaced with REDACT_MARKER, so "Bearer <key>"
 * leaves as "Bearer [redacted]". Partial echoes (a prefix, a masked key)
 * are not detected; they are what providers send on purpose.
 *
 * Cost: redact_hit() is one memmem() per distinct secret over the text,
 * and strings shorter than the shortest secret are skipped without a scan,
 * so the common reply (no echo) pays one pass per secret. Rewriting is
 * linear in the text: each secret's next occurrence is found once.
 *
 * Single-threaded: redact_on_str() reuses one scratch buffer inside the
 * object.
 */
#ifndef POLYGW_REDACT_H
#define POLYGW_REDACT_H

#include <stdbool.h>
#include <stddef.h>

#include "codec/transcode.h"

#define REDACT_MARKER "[redacted]"

struct redact;

/* Copies the secrets[0..n) (NUL-terminated; NULL and "" are skipped,
 * duplicates kept once). Returns owned, or NULL when out of memory. Zero
 * secrets is valid: nothing is ever redacted. */
struct redact *redact_new(const char *const *secrets, size_t n);

/* Wipes the copies (explicit_bzero) and frees. NULL is a no-op. */
void redact_free(struct redact *r);

/* True when s[0..n) contains a secret. `r` may be NULL (no secrets). */
bool redact_hit(const struct redact *r, const char *s, size_t n);

/* Appends s[0..n) to `out` with every occurrence of a secret replaced by
 * REDACT_MARKER; at a position where several secrets start, the longest is
 * replaced. Returns the number of replacements, or TRANSCODE_ENOMEM with
 * `out` unchanged. `r` may be NULL (a plain copy). */
long redact_copy(const struct redact *r, const char *s, size_t n, struct strbuf *out);

/* A transcode_str_fn (ud: the struct redact): points *s and *n at a
 * redacted copy, valid until the next call, when the string holds a
 * secret; leaves them alone otherwise. */
int redact_on_str(void *ud, const char **s, size_t *n);

#endif /* POLYGW_REDACT_H */

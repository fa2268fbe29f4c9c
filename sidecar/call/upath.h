/*
 * upath.h — the URL of one attempt: the source's base_url, the path its
 * dialect serves the call's capability at, and the query (docs/CONFIG.md,
 * "Providers"; docs/HTTP.md, "Anthropic token counting" and "Gemini").
 *
 *   - the built-in chat capability at its default path goes to each
 *     dialect's own chat path (Anthropic: /messages);
 *   - a kind: gemini source is called at /models/{model}:{method}, where
 *     {model} is the source's `model`, else the model the call named, and
 *     {method} is countTokens for a capability named count_tokens, else
 *     streamGenerateContent?alt=sse for a stream, else generateContent;
 *   - any other path is the capability's, as configured;
 * then the source's query (api-version, query:, auth_query), then the
 * client's own parameters (only for an anthropic source: Anthropic's
 * clients add ?beta=true) but those whose name the source's query has.
 */
#ifndef POLYGW_UPATH_H
#define POLYGW_UPATH_H

#include <stdbool.h>
#include <stddef.h>

#include <time.h>

#include "core/config.h"

struct upath_call {
    const struct config_capability *cap;
    const char *model; /* the model the call named (NUL-terminated), or NULL */
    bool stream;
    const char *query; /* the client's query string without '?', or NULL */
};

/* Writes the URL into buf[cap] when it fits, else into a malloc'd buffer
 * (the caller frees it when it is not `buf`, after explicit_bzero: the
 * source's query may hold its key). *len receives its length. Returns
 * NULL with `why` set when it cannot be made (a gemini source without a
 * model, out of memory). */
char *upath_url(const struct config_source *src, const struct upath_call *c, char *buf, size_t cap,
                size_t *len, char *why, size_t whylen);

/* Whether `name` (`len` bytes) may be put in a Gemini path as it is:
 * 1 to 255 of [A-Za-z0-9._-]. */
bool upath_model_ok(const char *name, size_t len);

#endif /* POLYGW_UPATH_H */

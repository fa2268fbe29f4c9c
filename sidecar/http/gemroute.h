/*
 * gemroute.h — the Gemini API's routes on the HTTP front (docs/HTTP.md,
 * "Gemini"): POST /v1beta/models/{model}:{method}, where {method} is
 *
 *   generateContent                  capability `gemini`, one JSON answer
 *   streamGenerateContent?alt=sse    capability `gemini`, an SSE stream
 *   countTokens                      capability `count_tokens`
 *
 * served by the capability's kind: gemini sources that serve {model}.
 * streamGenerateContent without alt=sse (Gemini's JSON-array stream) is
 * refused: polygw relays SSE streams only. Pure parsing, no I/O.
 */
#ifndef POLYGW_GEMROUTE_H
#define POLYGW_GEMROUTE_H

#include <stdbool.h>
#include <stddef.h>

#define GEMROUTE_PREFIX "/v1beta/models/"

struct gemroute {
    const char *model; /* borrowed from the path, `model_len` bytes */
    size_t model_len;
    const char *capability; /* "gemini" or "count_tokens" */
    bool stream;
};

enum gemroute_rc {
    GEMROUTE_OK = 0,
    GEMROUTE_NOT_FOUND, /* no such model name or method: 404 */
    GEMROUTE_NOT_SSE,   /* streamGenerateContent without alt=sse: 400 */
};

/* Parses `path` (`len` bytes, starting with GEMROUTE_PREFIX) and its query
 * (`query`, `qlen` bytes without '?', may be NULL). */
enum gemroute_rc gemroute_parse(const char *path, size_t len, const char *query, size_t qlen,
                                struct gemroute *out);

#endif /* POLYGW_GEMROUTE_H */

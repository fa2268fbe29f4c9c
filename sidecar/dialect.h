/*
 * dialect.h — what differs between the upstream APIs a source may speak,
 * as one table row per dialect (docs/CONFIG.md, "Providers"):
 *
 *   dialect    key goes in           version              chat path           stream ends with
 *   openai     Authorization: Bearer -                    /chat/completions   [DONE] or a finish_reason
 *   azure      api-key               ?api-version=V       /chat/completions   [DONE] or a finish_reason
 *   anthropic  x-api-key             anthropic-version: V /messages           message_stop
 *
 * and where each puts its token counts (OpenAI: `usage` of the reply or of
 * a stream chunk; Anthropic: `usage` of the reply, of message_start's
 * `message` and of message_delta), which stream events are errors
 * (Anthropic's `error` event, e.g. overloaded_error, is transient), and
 * which response headers are retry hints (dialect_apply_hints).
 *
 * The governed loop never sees any of this: it gets an outcome and a token
 * count. Everything here is pure (no I/O, no clock, no globals but the
 * constant table) and safe from any callback.
 */
#ifndef POLYGW_DIALECT_H
#define POLYGW_DIALECT_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "outcome.h"

enum dialect_kind {
    DIALECT_OPENAI = 0, /* default; also vLLM, Ollama, Groq, Gemini's OpenAI endpoint ... */
    DIALECT_AZURE,
    DIALECT_ANTHROPIC,
    DIALECT_COUNT
};

/* Token counts; -1 where unknown. */
struct dialect_usage {
    int64_t prompt, completion, total;
};

/* What one stream event (its `data`, parsed) means. */
struct dialect_event {
    bool terminal;              /* the stream's last event (finish_reason, message_stop) */
    bool usage_only;            /* nothing for the client but token counts (OpenAI's
                                 * include_usage chunk: "choices": []) */
    bool error;                 /* the upstream reported a failure inside the stream */
    bool transient;             /* ... and it is worth retrying (overloaded, api_error) */
    char error_type[48];        /* e.g. "overloaded_error"; printable ASCII */
    struct dialect_usage usage; /* counts carried by this event, -1 where absent */
};

struct dialect {
    const char *name;           /* the `kind:` value */
    const char *key_header;     /* header that carries the source's key */
    const char *key_prefix;     /* written before the key in it ("Bearer ") */
    const char *version_header; /* header for the source's version, or NULL */
    const char *version_query;  /* query parameter for it, or NULL */
    const char *chat_path;      /* the `chat` capability's path */
    bool stream_usage;          /* understands stream_options.include_usage */
    /* Fills *out for one parsed event (borrowed). */
    void (*scan_event)(const msgpack_object *ev, struct dialect_event *out);
    /* Token counts of a plain reply's `usage` map (borrowed, may be NULL). */
    void (*scan_usage)(const msgpack_object *usage, struct dialect_usage *out);
};

/* The row of `kind` (never NULL for a valid kind). */
const struct dialect *dialect_get(enum dialect_kind kind);

/* "openai", "azure", "anthropic" -> kind; -1 for anything else. */
int dialect_from_name(const char *name);

/* Merges the counts of one event into a running total: every field the
 * event has replaces the total's (Anthropic's message_delta repeats the
 * cumulative output count), and total is prompt + completion when the
 * upstream did not give one. */
void dialect_usage_merge(struct dialect_usage *acc, const struct dialect_usage *ev);

/* The total of `u`, or -1 when nothing is known. */
int64_t dialect_usage_total(const struct dialect_usage *u);

/* Retry hints beside Retry-After, as the OpenAI and Anthropic APIs send
 * them. Each value borrowed, NUL-terminated, "" when absent. */
struct dialect_hints {
    const char *retry_after_ms; /* "retry-after-ms: 1500" */
    const char *should_retry;   /* "x-should-retry: true|false" */
    const char *reset_requests; /* "x-ratelimit-reset-requests: 1s" (OpenAI: 6m0s, 20ms) */
    const char *reset_tokens;   /* "x-ratelimit-reset-tokens: ..." */
};

/* Refines an outcome already classified from the HTTP status:
 *   - x-should-retry: true makes a fail-fast 4xx transient; false makes a
 *     transient or rate-limited status fail fast (the server says a retry
 *     cannot succeed);
 *   - when Retry-After gave no delay: retry-after-ms, else (429 only) the
 *     larger x-ratelimit-reset-* duration, becomes retry_after_s (clamped to
 *     OUTCOME_RETRY_AFTER_MAX_S).
 * Unparseable values are ignored. */
void dialect_apply_hints(struct outcome *o, const struct dialect_hints *h);

/* Parses an OpenAI reset duration ("1s", "6m0s", "1h2m3.5s", "20ms") into
 * seconds. Returns 0, or -1 for anything else (*out_s unchanged). */
int dialect_parse_duration(const char *s, double *out_s);

#endif /* POLYGW_DIALECT_H */

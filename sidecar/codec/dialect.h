/*
 * dialect.h — what differs between the upstream APIs a source may speak,
 * as one table row per dialect (docs/CONFIG.md, "Providers"):
 *
 *   dialect    key goes in           version              chat path           stream ends with
 *   openai     Authorization: Bearer -                    /chat/completions   [DONE] or a finish_reason
 *   azure      api-key               ?api-version=V       /chat/completions   [DONE] or a finish_reason
 *   anthropic  x-api-key             anthropic-version: V /messages           message_stop
 *   gemini     x-goog-api-key        -                    /models/M:METHOD    a finishReason
 *   bedrock    SigV4 Authorization   body anthropic_version /model/M/invoke  message_stop
 *
 * A bedrock source with `api: converse` calls /model/M/converse instead; its
 * answers are turned into Messages ones as they arrive (converse.h), so it
 * is this same row to everything else.
 *
 * An OpenAI or Azure source called at a path ending in /responses speaks
 * OpenAI's Responses API instead (dialect_for): same key and version, but
 * its stream ends with response.completed, response.incomplete or
 * response.failed, its usage is input_tokens/output_tokens (in the reply,
 * and in the terminal event's `response`), and stream_options is never
 * added to its requests.
 *
 * and where each puts its token counts (OpenAI: `usage` of the reply or of
 * a stream chunk; Anthropic: `usage` of the reply, of message_start's
 * `message` and of message_delta; Gemini: `usageMetadata` of the reply and
 * of each event), which stream events are errors (Anthropic's `error`
 * event, e.g. overloaded_error, is transient; Gemini's {"error": {...}}
 * by its status, UNAVAILABLE and RESOURCE_EXHAUSTED transient), and
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

#include "cost.h"
#include "outcome.h"

enum dialect_kind {
    DIALECT_OPENAI = 0, /* default; also vLLM, Ollama, Groq, Gemini's OpenAI endpoint ... */
    DIALECT_AZURE,
    DIALECT_ANTHROPIC,
    DIALECT_GEMINI,  /* Google's native Gemini API (generateContent, countTokens) */
    DIALECT_BEDROCK, /* Anthropic's Messages on AWS Bedrock (InvokeModel), signed with
                      * AWS Signature Version 4, streamed as AWS event-stream frames */
    DIALECT_COUNT
};

/* The largest token count believed (2^40, far above any context window).
 * A count that is larger, negative or not a whole number cannot be true:
 * the reply or event that carries it makes its attempt's usage unknown. */
#define DIALECT_TOKENS_MAX (INT64_C(1) << 40)

/* Token counts; -1 where unknown. `bogus`: the upstream reported a count
 * that cannot be true (DIALECT_TOKENS_MAX): all three are then -1, and
 * stay so through dialect_usage_merge(). Sums of counts (Anthropic's input
 * and cache counts, prompt + completion) cannot overflow: each count is at
 * most DIALECT_TOKENS_MAX. */
struct dialect_usage {
    int64_t prompt, completion, total;
    int64_t cached;      /* prompt tokens read from the provider's prompt cache (OpenAI
                     * prompt_tokens_details.cached_tokens, Anthropic
                     * cache_read_input_tokens), part of `prompt` */
    int64_t cache_write; /* prompt tokens written to the provider's prompt cache
                          * (Anthropic cache_creation_input_tokens), part of `prompt` */
    int64_t reasoning;   /* output tokens spent reasoning (OpenAI reasoning_tokens,
                          * Gemini thoughtsTokenCount), part of `completion` */
    bool bogus;
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
    bool chat_facts;            /* its replies and events are Chat Completions ones (the
                                 * tree-free reader in call.c knows them) */
    const char *stream_end;     /* its terminal events, for error details */
    bool last_is_terminal;      /* nothing may follow its terminal event (Messages,
                                 * Responses, Gemini; a Chat Completions stream sends
                                 * its usage chunk after the finish_reason) */
    bool responses;             /* the Responses API: answers carry response ids whose
                                 * follow-ups go back to the same source */
    const char *usage_member;   /* the reply member holding its counts (NULL: "usage") */
    /* Fills *out for one parsed event (borrowed). */
    void (*scan_event)(const msgpack_object *ev, struct dialect_event *out);
    /* Token counts of a plain reply's `usage` map (borrowed, may be NULL). */
    void (*scan_usage)(const msgpack_object *usage, struct dialect_usage *out);
};

/* The row of `kind` (never NULL for a valid kind). */
const struct dialect *dialect_get(enum dialect_kind kind);

/* The row for a call of capability path `path` to a `kind` source: the
 * Responses API's for an OpenAI or Azure source at a path ending in
 * "/responses", else dialect_get(kind). */
const struct dialect *dialect_for(enum dialect_kind kind, const char *path);

/* Does capability path `path` end in "/responses" (NULL: no)? */
bool dialect_path_is_responses(const char *path);

/* "openai", "azure", "anthropic", "gemini", "bedrock" -> kind; -1 for anything else. */
int dialect_from_name(const char *name);

/* Does `kind` take and answer Anthropic Messages bodies (anthropic, bedrock)? */
bool dialect_is_messages(enum dialect_kind kind);

/* Merges the counts of one event into a running total: every field the
 * event has replaces the total's (Anthropic's message_delta repeats the
 * cumulative output count), and total is prompt + completion when the
 * upstream did not give one. A bogus event makes the total bogus, and a
 * bogus total stays so. */
void dialect_usage_merge(struct dialect_usage *acc, const struct dialect_usage *ev);

/* The total of `u`, or -1 when nothing is known (or `u` is bogus). */
int64_t dialect_usage_total(const struct dialect_usage *u);

/* What a count that cannot be true reads as. */
#define DIALECT_COUNT_BOGUS (-2)

/* A count read without a tree (jscan): `v`, the member's JSON number, when
 * it is a whole number in [0, DIALECT_TOKENS_MAX], else DIALECT_COUNT_BOGUS. */
int64_t dialect_count_number(double v);

/* Records member `name` (`len` bytes) of an OpenAI `usage` object in `u`:
 * `count` is the member's value (>= 0), -1 when it is null, or
 * DIALECT_COUNT_BOGUS when it is not a count that can be true
 * (dialect_count_number; a string, an object ...).
 * Members other than prompt_tokens, completion_tokens and total_tokens are
 * ignored. Start from DIALECT_USAGE_NONE. */
void dialect_openai_count(struct dialect_usage *u, const char *name, size_t len, int64_t count);

#define DIALECT_USAGE_NONE ((struct dialect_usage){ -1, -1, -1, -1, -1, -1, false })

/* Records an OpenAI `prompt_tokens_details` or `completion_tokens_details`
 * member `name` (`len` bytes) in `u` (`count` as for dialect_openai_count):
 * only cached_tokens (-> cached) and reasoning_tokens (-> reasoning) are
 * kept, and a count that cannot be true leaves that one unknown without
 * making `u` bogus (admission does not use them). */
void dialect_openai_detail(struct dialect_usage *u, const char *name, size_t len, int64_t count);

/* The cached prompt tokens of `u` that can be counted: its cached count
 * when both it and the prompt count are known and it is at most the
 * prompt count, else -1 (a cache count above the prompt cannot be true). */
int64_t dialect_usage_cached(const struct dialect_usage *u);

/* Splits `u` into the disjoint classes of cost.h: cached and cache-write
 * tokens out of the prompt, reasoning out of the completion. A class count
 * that cannot be part of its total (above it, or the two together above
 * the prompt) is not split off: its tokens stay in the total's plain class
 * (input or output), so nothing is priced twice or dropped. Returns false
 * (*t zeroed) when nothing can be priced: `u` is bogus or its prompt count
 * unknown; an unknown completion count is 0 output (embeddings). */
bool dialect_usage_classes(const struct dialect_usage *u, struct cost_tokens *t);

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

/*
 * convert.h — OpenAI chat <-> Anthropic Messages, for sources that declare
 * `accepts: openai` (docs/CONFIG.md section 7a). It is the only translation
 * between dialects polygw does, and it covers plain text chat only.
 *
 *   request  OpenAI chat body  -> Messages body  (convert_chat_request)
 *   reply    Messages reply    -> chat.completion (convert_chat_reply)
 *   stream   Messages events   -> chat.completion.chunk events (convert_chat_event)
 *
 * Request: `system` / `developer` messages become the `system` prompt (joined
 * by a blank line, in order); `user` / `assistant` messages keep their role
 * and their text (a content array's text parts, joined); `max_tokens` comes
 * from max_completion_tokens, else max_tokens, else CONVERT_DEFAULT_MAX_TOKENS
 * (Anthropic requires it; each must be a positive integer or null); `stop` (a string or a list) becomes
 * `stop_sequences`; `model`, `stream`, `temperature`, `top_p` are kept; the
 * OpenAI-only knobs with no Messages equivalent (n = 1, user, seed,
 * presence/frequency_penalty, logit_bias, logprobs = false, stream_options,
 * store, parallel_tool_calls, service_tier) are dropped; any other key is
 * passed on as it is (top_k, metadata, ... — the upstream judges them).
 * Refused (CONVERT_EUNSUPPORTED, with the reason): tools, functions,
 * tool_choice, response_format, n > 1, logprobs, `tool` / `function` messages,
 * assistant tool_calls (a null one is absent), non-text content parts, a body
 * with no user or assistant message, a max_tokens / max_completion_tokens
 * that is not a positive integer.
 *
 * Reply and stream: finish reasons map end_turn / stop_sequence -> stop,
 * max_tokens -> length, tool_use -> tool_calls, refusal -> content_filter;
 * usage becomes {prompt_tokens, completion_tokens, total_tokens} (cache reads
 * and writes counted as prompt tokens); a usage the sidecar cannot believe
 * (dialect.h, DIALECT_TOKENS_MAX) is left out: no `usage` member in the
 * reply, no usage chunk in the stream. A reply that is not a Messages reply
 * (an array, a string, `{}`, a 200 carrying {"type": "error"}) is refused
 * (CONVERT_EREPLY): the caller fails the attempt, it never reaches an OpenAI
 * client as a completion.
 *
 * Pure computation (the caller passes the clock as `created`), no globals;
 * every object is borrowed and every output is packed into the caller's
 * packer. Safe from any callback.
 */
#ifndef POLYGW_CONVERT_H
#define POLYGW_CONVERT_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dialect.h"

#define CONVERT_DEFAULT_MAX_TOKENS 4096

enum {
    CONVERT_EUNSUPPORTED = -1, /* the body uses something the conversion cannot carry */
    CONVERT_EREPLY = -2,       /* the upstream's reply is not a Messages reply */
};

/* Packs the Messages body for OpenAI chat body `body` (a map) into `pk`.
 * Returns 0, or CONVERT_EUNSUPPORTED with a NUL-terminated reason naming the
 * key ("body.tools: tool calls cannot be converted ...") in err (may be NULL);
 * `pk` may then have received part of a value: discard it. */
int convert_chat_request(const msgpack_object *body, msgpack_packer *pk, char *err, size_t errlen);

/* Packs the chat.completion for Messages reply `msg` into `pk`. `created` is
 * the Unix time to report. Returns 0, or CONVERT_EREPLY when `msg` is not a
 * Messages reply: not a map, no `content` list, or a `type` other than
 * "message" (nothing packed). */
int convert_chat_reply(const msgpack_object *msg, int64_t created, msgpack_packer *pk);

/* The state of one converted stream (one attempt): zero it, then set
 * `created` and `include_usage` (the client asked for
 * stream_options.include_usage: end with a usage-only chunk, as OpenAI does). */
struct convert_stream {
    int64_t created;
    bool include_usage;
    char id[96];
    char model[128];
    struct dialect_usage usage; /* so far (set by convert_stream_init) */
};

void convert_stream_init(struct convert_stream *st, int64_t created, bool include_usage);

/* Converts one Messages stream event (its parsed `data`). Returns 1 when a
 * chunk was packed into `pk` (message_start: the role chunk; a text delta:
 * a content chunk; message_delta: the finish_reason chunk; message_stop:
 * the usage chunk when include_usage and the usage is not bogus), 0 when the event yields none (ping,
 * block start/stop, non-text deltas, unknown events: nothing packed). */
int convert_chat_event(struct convert_stream *st, const msgpack_object *ev, msgpack_packer *pk);

#endif /* POLYGW_CONVERT_H */

/*
 * converse.h — Anthropic Messages <-> AWS Bedrock's Converse API, for a
 * `kind: bedrock` source with `api: converse` (docs/CONFIG.md section 7a).
 *
 * Such a source speaks Messages to the rest of the sidecar, exactly as an
 * InvokeModel source does: its body is made from a Messages body (itself
 * perhaps converted from an OpenAI chat body, convert.h), and its answers
 * are turned back into a Messages reply and Messages stream events right
 * where they arrive. Usage, conversion to Chat Completions, relaying to an
 * Anthropic client, errors: all of it is then the `anthropic` dialect's.
 *
 *   request  Messages body     -> Converse body     (converse_request)
 *   reply    Converse reply    -> Messages reply    (converse_reply)
 *   stream   ConverseStream    -> Messages events   (converse_event)
 *
 * Request: `messages` (role user / assistant, content a string or a list
 * of text blocks) -> `messages` [{role, content: [{text}]}]; `system` (a
 * string or text blocks) -> `system` [{text}]; max_tokens, temperature,
 * top_p, stop_sequences -> `inferenceConfig` {maxTokens, temperature,
 * topP, stopSequences}; top_k -> `additionalModelRequestFields` {top_k};
 * model, stream, anthropic_version and metadata are dropped. Refused
 * (CONVERT_EUNSUPPORTED, with the reason): any other key (tools,
 * tool_choice, thinking ...), a block that is not text, a role other than
 * user and assistant, no message, a max_tokens that is not a positive
 * integer, a temperature / top_p that is not a number. A null value is an
 * absent one.
 *
 * Reply: output.message.content[].text -> content [{type: text, text}]
 * (blocks that are not text are left out); stopReason -> stop_reason
 * (guardrail_intervened and content_filtered -> refusal,
 * model_context_window_exceeded -> max_tokens, others as they are);
 * usage inputTokens, outputTokens, cacheReadInputTokens,
 * cacheWriteInputTokens -> input_tokens, output_tokens,
 * cache_read_input_tokens, cache_creation_input_tokens (Converse counts
 * input as Anthropic does: cache reads and writes beside inputTokens). The
 * values are copied as they came, so a count that cannot be true is
 * judged where every Messages count is (dialect.h).
 *
 * Stream (each event the `:event-type` of one event-stream message and its
 * JSON payload): messageStart -> message_start; contentBlockStart and the
 * first contentBlockDelta of a block -> content_block_start; a text delta
 * -> content_block_delta {text_delta}; contentBlockStop ->
 * content_block_stop; messageStop keeps its stopReason; metadata ->
 * message_delta {stop_reason, usage} then message_stop, the stream's last
 * event. Deltas that are not text (toolUse, reasoningContent) and unknown
 * event types yield nothing.
 *
 * Pure computation, no globals; every object is borrowed and every output
 * packed into the caller's packer. Safe from any callback.
 */
#ifndef POLYGW_CONVERSE_H
#define POLYGW_CONVERSE_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "convert.h"

/* Packs the Converse body for Messages body `body` (a map) into `pk`.
 * Returns 0, or CONVERT_EUNSUPPORTED with a NUL-terminated reason naming
 * the key in err (may be NULL); `pk` may then have received part of a
 * value: discard it. */
int converse_request(const msgpack_object *body, msgpack_packer *pk, char *err, size_t errlen);

/* Packs the Messages reply for Converse reply `reply` into `pk`. Returns 0,
 * or CONVERT_EREPLY when `reply` is not a Converse reply (not a map, no
 * output.message.content list; nothing packed). */
int converse_reply(const msgpack_object *reply, msgpack_packer *pk);

/* The state of one translated stream (one attempt): converse_stream_init,
 * then converse_event for each event in order. */
struct converse_stream {
    uint64_t next_block; /* blocks [0, next_block) have had their content_block_start */
    char stop_reason[40];
};

void converse_stream_init(struct converse_stream *st);

/* Translates one ConverseStream event: `type` (`type_len` bytes, its
 * `:event-type`) with payload `ev` (parsed, a map). Packs the Messages
 * events it stands for into `pk`, one after the other, and returns their
 * number (0 to 2); CONVERT_EREPLY when the payload of a known event type
 * is not a map (nothing packed). */
int converse_event(struct converse_stream *st, const char *type, size_t type_len,
                   const msgpack_object *ev, msgpack_packer *pk);

#endif /* POLYGW_CONVERSE_H */

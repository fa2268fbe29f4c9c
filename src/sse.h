/*
 * sse.h — incremental parser of a Server-Sent Events stream (text/event-stream).
 *
 * Implements the WHATWG HTML "event stream interpretation" rules, minus the
 * parts that belong to a browser's EventSource (reconnecting, origin):
 *
 *   - Lines end with CRLF, LF or CR. A terminator may be split across feeds
 *     at any byte, including a CR ending one chunk and its LF starting the
 *     next (that pair is one line end, never two).
 *   - One UTF-8 BOM (EF BB BF) at the very start of the stream is dropped,
 *     even when split across feeds; a BOM anywhere else is ordinary bytes.
 *   - A line starting with ':' is a comment and is ignored.
 *   - "name:value" sets field `name`; a single space after the first colon is
 *     stripped (only one). A line without a colon is a field with an empty
 *     value ("data" == "data:").
 *   - Fields: `event` sets the event name for the current block; `data`
 *     appends its value and a '\n' to the data buffer; `id` sets the last
 *     event ID (ignored if the value contains a NUL byte) — it persists across
 *     events, per spec; `retry` with a value of only ASCII digits sets the
 *     reconnection time in ms (also persistent; anything else is ignored).
 *     Unknown fields are ignored.
 *   - An empty line dispatches the block: if no `data` field was seen, nothing
 *     is dispatched (a block of only `event`/`id`/`retry`/comments); otherwise
 *     the final '\n' is removed and the event is delivered — note that a block
 *     whose data fields are all empty ("data:\n\n") *is* dispatched, with
 *     data "" (this is what the spec and browsers do). Then the event name
 *     and data buffer are reset.
 *   - At end of stream an undispatched block is discarded: the caller learns
 *     about it from sse_parser_is_idle() (stream cut mid-event).
 *
 * Bytes are not validated as UTF-8 (the caller relays them verbatim); data
 * may contain NUL bytes, hence the explicit lengths.
 *
 * Bounds: a line longer than max_event_bytes (terminator excluded), or a
 * pending event whose event name plus data (data_len as it would be
 * dispatched) would exceed max_event_bytes, fails with SSE_ETOO_LARGE. So
 * the parser holds at most about 3 x max_event_bytes (line, event, last ID).
 *
 * Errors are sticky: after any failure (including a callback abort) every
 * later sse_parser_feed() returns the sticky code without parsing; only
 * sse_parser_fini() remains useful.
 *
 * Pure: no I/O, no clock, no globals; one parser per stream, not thread-safe.
 */
#ifndef POLYGW_SSE_H
#define POLYGW_SSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    SSE_EINVAL = -1,     /* bad argument (max_event_bytes == 0) */
    SSE_ETOO_LARGE = -2, /* line or event over max_event_bytes */
    SSE_ENOMEM = -3,     /* allocation failed */
    SSE_EABORTED = -4,   /* a callback returned non-zero earlier (sticky code) */
};

/* One dispatched event. All pointers are borrowed from the parser and valid
 * only during the callback: copy what you keep. Every string is also
 * NUL-terminated at its length (data may contain NUL bytes itself). */
struct sse_event {
    const char *event; /* event name: the block's `event` field, "message" if unset or empty */
    size_t event_len;
    const char *data; /* data lines joined by '\n' (no trailing '\n') */
    size_t data_len;
    const char *id; /* last event ID seen so far in the stream, "" if none */
    size_t id_len;
    int64_t retry_ms; /* reconnection time last set by a `retry` field, -1 if never
                           (saturates at INT64_MAX) */
};

/* Called once per dispatched event. Returning non-zero stops parsing: the
 * feed returns that value at once (the rest of the chunk is dropped) and the
 * parser is failed with SSE_EABORTED. The callback must not call
 * sse_parser_feed() or sse_parser_fini() on the same parser. */
typedef int sse_event_fn(const struct sse_event *ev, void *ud);

/* A growable byte buffer, always NUL-terminated when `p` is set. Private. */
struct sse_buf {
    char *p;
    size_t len;
    size_t cap;
};

/* Treat as opaque; embedded so it needs no allocation of its own. */
struct sse_parser {
    size_t max_event_bytes;
    struct sse_buf line;  /* current line, when it spans feeds */
    struct sse_buf data;  /* data buffer: each data value followed by '\n' */
    struct sse_buf event; /* event name buffer of the current block */
    struct sse_buf id;    /* last event ID (persistent) */
    int64_t retry_ms;     /* -1 until a valid `retry` field */
    unsigned bom_matched; /* BOM bytes matched at stream start (0..2 while undecided) */
    bool bom_done;        /* past the stream-start BOM check */
    bool after_cr;        /* the last byte fed was a CR ending a line: skip one LF */
    bool block_open;      /* a field line was seen since the last empty line */
    int error;            /* sticky SSE_E* once failed, else 0 */
};

/* Initialises `p` for events/lines of at most `max_event_bytes` (> 0).
 * Allocates nothing (buffers grow on demand). Returns 0 or SSE_EINVAL; after
 * SSE_EINVAL, `p` is still safe to fini. */
int sse_parser_init(struct sse_parser *p, size_t max_event_bytes);

/* Frees the buffers. Safe on a failed parser; not from inside its callback. */
void sse_parser_fini(struct sse_parser *p);

/* Parses `len` bytes of `data` (borrowed; may be NULL when len == 0) and calls
 * `cb(ev, ud)` synchronously for each event completed by them, in stream
 * order (`cb` may be NULL to discard events). Returns 0 when all bytes were
 * consumed, SSE_ETOO_LARGE / SSE_ENOMEM on failure (events completed before
 * the offending bytes were already delivered), the callback's non-zero return
 * value if it aborted, or the sticky error of an earlier failure. The result
 * — events and error — does not depend on how the stream is split into feeds. */
int sse_parser_feed(struct sse_parser *p, const char *data, size_t len, sse_event_fn *cb, void *ud);

/* True when no partial event is buffered: nothing of an unterminated line
 * (nor a partial BOM) is pending and no field line was seen since the last
 * empty line. At end of stream, false means the stream was cut mid-event.
 * Comment lines alone do not make the parser busy. */
bool sse_parser_is_idle(const struct sse_parser *p);

/* Bytes of the pending event held: its unterminated line, data and event
 * name (the persistent last event ID is not counted). */
size_t sse_parser_buffered(const struct sse_parser *p);

/* True when the event's data is the OpenAI-style terminal marker "[DONE]"
 * (surrounding ASCII spaces/tabs tolerated). */
bool sse_data_is_done(const struct sse_event *ev);

/* A short static description of an SSE_E* code ("unknown sse error" otherwise). */
const char *sse_strerror(int err);

#endif /* POLYGW_SSE_H */

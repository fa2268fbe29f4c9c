/*
 * evstream.h — incremental decoder of the AWS event-stream framing
 * (application/vnd.amazon.eventstream), which Bedrock's streaming APIs
 * (InvokeModelWithResponseStream, ConverseStream) use instead of SSE.
 *
 * One message on the wire, all integers big-endian:
 *
 *   total_len   u32   the whole message, these 4 bytes and the final CRC included
 *   headers_len u32   bytes of the header block
 *   prelude_crc u32   CRC-32 (IEEE, as zlib's crc32) of the 8 bytes above
 *   headers     headers_len bytes
 *   payload     total_len - headers_len - 16 bytes
 *   message_crc u32   CRC-32 of everything before it (prelude and its CRC included)
 *
 * A header is: name_len u8, name (name_len bytes), type u8, value:
 *   0 bool true, 1 bool false (no value bytes); 2 byte (1); 3 short (2);
 *   4 integer (4); 5 long (8); 6 byte array and 7 string (u16 length, then
 *   the bytes); 8 timestamp (8, ms since the epoch); 9 uuid (16).
 *
 * Delivered per message: the string headers `:message-type` ("event",
 * "exception" or "error"), `:event-type`, `:exception-type`, `:error-code`,
 * `:error-message` and `:content-type` (others are skipped after being
 * checked for well-formedness, as is one of these names with a type other
 * than string; a repeated one: the last wins), and the payload.
 *
 * Bounds: total_len below 16, headers_len above total_len - 16, or
 * total_len above max_message_bytes fail with EVSTREAM_EMALFORMED /
 * EVSTREAM_ETOO_LARGE as soon as the prelude is read, before anything is
 * buffered beyond it. The prelude CRC is checked before those lengths
 * (a damaged length is reported as EVSTREAM_ECRC). A CRC mismatch (prelude
 * or message) is EVSTREAM_ECRC; a header block that does not parse exactly to its length
 * (a name or value running past it, an unknown type, a zero-length name)
 * is EVSTREAM_EMALFORMED.
 *
 * A message may be split across feeds at any byte; the messages and the
 * error do not depend on the split. Errors are sticky, as in sse.h: after a
 * failure every later feed returns the same code.
 *
 * Memory: the buffer holds at most one message (total_len bytes, never more
 * than max_message_bytes, the payload's NUL included) and grows by doubling
 * with the bytes that actually arrived, not with the total_len announced;
 * a buffer over 64 KiB is freed once its message is delivered.
 *
 * Pure: no I/O, no clock, no globals; one decoder per stream.
 */
#ifndef POLYGW_EVSTREAM_H
#define POLYGW_EVSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    EVSTREAM_EINVAL = -1,     /* bad argument (max_message_bytes < 16) */
    EVSTREAM_ETOO_LARGE = -2, /* a message over max_message_bytes */
    EVSTREAM_ENOMEM = -3,     /* allocation failed */
    EVSTREAM_EABORTED = -4,   /* a callback returned non-zero earlier (sticky code) */
    EVSTREAM_ECRC = -5,       /* a prelude or message CRC does not match */
    EVSTREAM_EMALFORMED = -6, /* lengths or headers that cannot be true */
};

/* A string header's value: `p` borrowed (NOT NUL-terminated), len bytes;
 * p == NULL when the message has no such header. */
struct evstream_str {
    const char *p;
    size_t len;
};

/* One decoded message; everything borrowed for the callback only. */
struct evstream_msg {
    struct evstream_str message_type;   /* ":message-type" */
    struct evstream_str event_type;     /* ":event-type" */
    struct evstream_str exception_type; /* ":exception-type" */
    struct evstream_str error_code;     /* ":error-code" */
    struct evstream_str error_message;  /* ":error-message" */
    struct evstream_str content_type;   /* ":content-type" */
    const uint8_t *payload;             /* NUL-terminated at payload_len */
    size_t payload_len;
};

/* Called synchronously from evstream_feed() once per message, in stream
 * order. Returning non-zero stops decoding: the feed returns that value at
 * once (the rest of the chunk is dropped) and the decoder is failed with
 * EVSTREAM_EABORTED. It must not call evstream_feed() or evstream_fini() on
 * the same decoder. */
typedef int evstream_msg_fn(const struct evstream_msg *msg, void *ud);

/* Treat as opaque. */
struct evstream {
    size_t max_message_bytes;
    uint8_t *buf; /* the message being assembled */
    size_t len, cap;
    size_t need; /* total_len once the prelude is known, else 0 */
    int error;   /* sticky: 0 or an EVSTREAM_E* code */
};

/* max_message_bytes >= 16; allocates nothing. Returns 0 or EVSTREAM_EINVAL
 * (after which `d` is failed with that code and still safe to fini). */
int evstream_init(struct evstream *d, size_t max_message_bytes);
void evstream_fini(struct evstream *d);

/* Decodes `len` bytes of `p` (borrowed; NULL when len == 0), calling `fn`
 * (NULL: messages are checked and dropped) for each complete message in
 * order. Returns 0, a negative EVSTREAM_E* code (messages completed before
 * the offending bytes were already delivered), the callback's non-zero
 * value, or the sticky code of an earlier failure. */
int evstream_feed(struct evstream *d, const void *p, size_t len, evstream_msg_fn *fn, void *ud);

/* Bytes held for a message not yet complete (for the caller's byte budget). */
size_t evstream_buffered(const struct evstream *d);

/* True when no partial message is held (a stream that ends otherwise was cut). */
bool evstream_is_idle(const struct evstream *d);

/* Encodes one message with string headers only (the pairs `names[i]` =
 * `values[i]`, n of them) and `payload` into a malloc'd buffer (*out,
 * *out_len). For tests and the mock; returns 0 or EVSTREAM_ENOMEM /
 * EVSTREAM_EINVAL (a name over 255 bytes, a value over 65535). */
int evstream_encode(const char *const *names, const char *const *values, size_t n,
                    const void *payload, size_t payload_len, uint8_t **out, size_t *out_len);

#endif /* POLYGW_EVSTREAM_H */

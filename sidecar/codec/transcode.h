/*
 * transcode.h — msgpack <-> JSON for upstream bodies.
 *
 * Clients send the upstream request body as a msgpack map; the upstream
 * speaks JSON. transcode_msgpack_to_json() writes the request body as JSON
 * text (applying the source's overrides on the way), and
 * transcode_json_to_msgpack() turns a JSON reply, or one SSE event's JSON
 * data, back into msgpack, within a depth the caller chooses and through an
 * optional rewrite of every string (the sidecar scrubs secrets there).
 * (lib/utf8.h repairs upstream text into valid UTF-8.)
 *
 * Type mapping (both directions):
 *   nil <-> null, bool <-> true/false, str <-> string (UTF-8, validated),
 *   array <-> array, map with string keys <-> object (key order kept),
 *   positive/negative integer <-> integer, float32/float64 -> number with
 *   a '.' or an exponent -> float64.
 * Not representable, hence rejected: msgpack bin and ext, NaN and
 * +-Infinity, non-string map keys, strings or keys that are not valid
 * UTF-8 (overlongs, surrogates and code points above U+10FFFF included),
 * and more than TRANSCODE_MAX_DEPTH nested containers. JSON integers
 * outside the int64 range are rejected too (see transcode_json_to_msgpack).
 *
 * Everything here is pure computation: no I/O, no globals, no clock. It is
 * safe to call from any callback and from several threads on distinct
 * buffers. Floats are written the same in every locale (lib/jsonw.h).
 */
#ifndef POLYGW_TRANSCODE_H
#define POLYGW_TRANSCODE_H

#include <msgpack.h>
#include <stddef.h>

#include "strbuf.h"

/* Containers nested deeper than this are rejected in both directions: the
 * outermost map or array is level 1, so "[[1]]" has depth 2. It is the
 * transcoder's own bound; a JSON reply is held to the (smaller) depth its
 * caller passes, the one left for it inside the message that carries it.
 * msgpack-c's own unpacker stops at 32 levels (proto/frame.h), so a body
 * arriving from a client is always well inside this bound. */
#define TRANSCODE_MAX_DEPTH 64

enum {
    TRANSCODE_EINVALID = -1,  /* the input has no faithful translation; err says where and why */
    TRANSCODE_ENOMEM = -2,    /* an allocation failed (or the msgpack packer's write failed) */
    TRANSCODE_ETOO_DEEP = -3, /* valid JSON, but nested deeper than the caller allows */
};

/* The stream override. Zero (KEEP) is the default so that a zeroed
 * `struct transcode_override` changes nothing. */
enum transcode_stream {
    TRANSCODE_STREAM_KEEP = 0,  /* leave "stream" as the body has it (or absent) */
    TRANSCODE_STREAM_FALSE = 1, /* write "stream": false */
    TRANSCODE_STREAM_TRUE = 2,  /* write "stream": true */
};

/* Top-level overrides applied while writing, only when the body is a map
 * (a non-map body is written unchanged; the caller validates its type).
 *   model   NUL-terminated UTF-8, or NULL for none. Replaces the value of
 *           every top-level "model" key in place (a duplicated key must not
 *           smuggle a different model past governance), or is appended as
 *           the last member when the body has none.
 *   stream  same rule for the "stream" key, with a JSON boolean.
 * Keys named "model"/"stream" below the top level are never touched. */
struct transcode_override {
    const char *model;
    enum transcode_stream stream;
};

/* Appends the compact JSON text of `o` to `out`.
 *   o      borrowed; any msgpack object (a request body is a map).
 *   ov     borrowed, may be NULL (no overrides).
 *   root   the name of `o` in error paths, e.g. "body"; NULL means "value".
 *   out    appended to (existing content is kept).
 *   err    may be NULL; on failure receives a NUL-terminated, valid UTF-8
 *          message (truncated to errlen) naming the path, e.g.
 *          "body.messages[2].content: binary data cannot be sent as JSON".
 * Output: strings are escaped as JSON requires (\" \\, \n \r \t \b \f, other
 * control characters as \u00XX; non-ASCII UTF-8 copied as is); integers are
 * printed exactly over the whole int64 and uint64 ranges; float64 is
 * printed with the fewest of 15, 16 or 17 significant digits that parses
 * back to the same double (so 0.1 prints "0.1"), float32 with the fewest of
 * 6..9 digits that parses back to the same float; a float always keeps a
 * '.' or an exponent (1.0 prints "1.0", -0.0 prints "-0.0").
 * Returns 0; TRANSCODE_EINVALID for a rejected value (list at the top of
 * this file); TRANSCODE_ENOMEM. On failure `out->len` is restored to its
 * value at entry (nothing partial is left behind). */
int transcode_msgpack_to_json(const msgpack_object *o, struct strbuf *out,
                              const struct transcode_override *ov, const char *root, char *err,
                              size_t errlen);

/* Rewrites one string (a value or an object key) of a JSON reply before it
 * is packed: on entry *s and *n are the decoded string (valid UTF-8, borrowed);
 * the hook may point them at other text, which must stay valid until the
 * next call of the hook or the end of the transcode. Returns 0, or
 * TRANSCODE_ENOMEM to fail the transcode. */
typedef int transcode_str_fn(void *ud, const char **s, size_t *n);

/* Where a value lies in the packed output: `len` bytes from `off` (counted
 * from the first byte this call packed); len 0 when there is none. */
struct transcode_span {
    size_t off, len;
};

struct transcode_j2m {
    unsigned max_depth;       /* containers allowed, 1..TRANSCODE_MAX_DEPTH; 0 means
                                * TRANSCODE_MAX_DEPTH; deeper is TRANSCODE_ETOO_DEEP */
    transcode_str_fn *on_str; /* NULL: strings are packed as parsed */
    void *ud;                 /* passed to on_str */
    /* Optional, found in the same pass: for each key of `pick` (borrowed,
     * NULL-terminated, each NUL-terminated), where the value of that member
     * of the outermost object is in the output, in `picked` (one per key,
     * filled on success; len 0 when the key is absent or the outermost
     * value is not an object). A key matches when it is the member's name as decoded
     * (before on_str); with duplicates, the value that wins. A caller reads
     * the few members it needs (a reply's "usage") without unpacking the
     * whole value. */
    const char *const *pick;
    struct transcode_span *picked;
};

/* Parses `len` bytes of JSON text (any value at the top level, no NUL
 * terminator needed) and packs it into `pk` as one msgpack value, in a
 * single pass over the text with no allocation per element (the output is
 * built in one buffer and handed to pk's write callback in one call).
 *   json   borrowed. A string may contain \u0000 (packed as a NUL byte);
 *          an object key may not.
 *          Duplicate object keys: the last value wins, at the position of
 *          the first occurrence; the output map has unique keys. Object key
 *          order is kept otherwise.
 *   pk     borrowed; its write callback receives the value (once, on success).
 *   opt    borrowed, may be NULL (TRANSCODE_MAX_DEPTH, no string hook). The
 *          hook sees every key and string value in input order, a
 *          duplicated key's values included.
 *   err    may be NULL; on failure receives a short NUL-terminated message in
 *          printable ASCII (never more than a 20-byte excerpt of the input):
 *          "invalid JSON at line 1, column 1: invalid token near '<'".
 * The output, the return value and the message are those of jansson's
 * parser walked into `pk` (the reference in tests/ref/) for every input (the differential fuzz
 * target fuzz_json_msgpack_diff holds the two to it): the first syntax error
 * in reading order decides the message; nesting deeper than jansson's own
 * 2048 levels (scalars counted) is a syntax error.
 * Numbers: JSON integers become msgpack integers (smallest encoding) and
 * must lie within int64; larger ones (e.g. 18446744073709551615) are
 * rejected with TRANSCODE_EINVALID rather than silently rounded through a
 * double. -0 is the integer 0. Numbers with a fraction or an exponent
 * become float64 (strtod's, in the C locale the daemon runs in; -0.0
 * stays negative); those overflowing a double (1e400) are rejected, those
 * underflowing become 0 or a subnormal.
 * Returns 0; TRANSCODE_EINVALID (not JSON, trailing garbage, integer out of
 * range); TRANSCODE_ETOO_DEEP (valid JSON nested deeper than opt->max_depth);
 * TRANSCODE_ENOMEM (allocation, a failed pk write, or on_str's). After a
 * failure `pk` has received nothing. */
int transcode_json_to_msgpack(const char *json, size_t len, msgpack_packer *pk,
                              const struct transcode_j2m *opt, char *err, size_t errlen);

#endif /* POLYGW_TRANSCODE_H */

/*
 * rpc.h — msgpack-RPC messages: classify a decoded frame, read named
 * parameters, and write requests, responses, errors and notifications.
 *
 * Message shapes (proto/PROTOCOL.md is normative):
 *   request       [0, msgid, method, params]
 *   response      [1, msgid, error, result]
 *   notification  [2, method, params]
 * `params` is an array holding one map of named parameters (an empty array
 * means no parameters). msgid is an unsigned 32-bit integer.
 *
 * Everything returned by the readers borrows from the decoded frame: it is
 * valid while the frame's msgpack_unpacked is alive. Copy what you keep.
 */
#ifndef POLYGW_RPC_H
#define POLYGW_RPC_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codes.h"
#include "frame.h"

/* The deepest value the sidecar may carry where it relays upstream data:
 * a result's body and usage ([1, msgid, nil, {body: v}]), an error's
 * upstream_body ([1, msgid, {upstream_body: v}, nil]) and a chunk's event
 * ([2, "chunk", [msgid, v]]) each sit inside two containers, so `v` may
 * nest this many levels for the whole message to stay within
 * FRAME_MAX_DEPTH — the limit every reader of the protocol enforces. */
#define RPC_RELAYED_MAX_DEPTH (FRAME_MAX_DEPTH - 2)

enum rpc_type { RPC_REQUEST = 0, RPC_RESPONSE = 1, RPC_NOTIFY = 2 };

struct rpc_msg {
    enum rpc_type type;
    uint32_t msgid;     /* request, response */
    const char *method; /* request, notification: not NUL-terminated */
    uint32_t method_len;
    const msgpack_object *params; /* request, notification: any type (checked later) */
    const msgpack_object *error;  /* response: nil or a map */
    const msgpack_object *result; /* response */
};

/* Classifies a decoded frame. Returns 0 and fills *m, or -1 when the frame
 * is not a msgpack-RPC message (not an array of the right length, unknown
 * type, msgid not a uint32, method not a string); `why` (may be NULL) then
 * gets a static reason. Borrows `o`. */
int rpc_parse(const msgpack_object *o, struct rpc_msg *m, const char **why);

/* True when the method name equals `name`. */
bool rpc_method_is(const struct rpc_msg *m, const char *name);

/* Looks `key` up in a map object (string keys only). NULL when `map` is
 * not a map or has no such key. Borrows. */
const msgpack_object *rpc_map_get(const msgpack_object *map, const char *key);

/* True when `o` is a string equal to `s`. */
bool rpc_str_is(const msgpack_object *o, const char *s);

/* Copies at most `max` bytes of the client's string s[0..n) into out[]
 * (which holds max + 1 bytes) as printable, valid UTF-8 for quoting in an
 * error message: truncation stops at a character boundary, invalid bytes
 * and control characters become '?'. */
void rpc_quote_client_str(const char *s, size_t n, size_t max, char *out);

/* Checks an identifier a client supplied (a scope, task id, node, app or
 * capability name), on either front: 1 to `max` bytes of valid UTF-8
 * (lib/utf8.h) without NUL. Returns 0, or -1 with "<what>: expected 1 to
 * <max> bytes of UTF-8 without NUL" in `why`. */
int rpc_check_ident(const char *what, const char *s, size_t n, size_t max, char *why,
                    size_t whylen);

/* rpc_check_ident on the string object `o`, with max = cap - 1, then
 * rpc_str_copy into buf[cap]. 0 or -1 (with `why`). */
int rpc_ident_copy(const char *what, const msgpack_object *o, char *buf, size_t cap, char *why,
                   size_t whylen);

/* Copies a string object into a NUL-terminated buffer; returns 0, or -1 when
 * `o` is not a string or does not fit (cap includes the NUL). */
int rpc_str_copy(const msgpack_object *o, char *buf, size_t cap);

/* Named-parameter binding. One entry per accepted parameter:
 *   types: a mask of RPC_T_* (RPC_T_NIL in the mask lets nil mean "absent").
 * rpc_bind() checks that params is [] or [map], that every key is a known
 * string, that each present value has an allowed type, and that required
 * ones are present; on success out[i] points at each value or is NULL.
 * Returns 0, or -1 with a human reason in `why` (e.g. "params.capability:
 * expected string, got integer"). */
enum {
    RPC_T_NIL = 1 << 0,
    RPC_T_BOOL = 1 << 1,
    RPC_T_UINT = 1 << 2, /* non-negative integer */
    RPC_T_INT = 1 << 3,  /* negative integer (use RPC_T_UINT|RPC_T_INT for any) */
    RPC_T_FLOAT = 1 << 4,
    RPC_T_STR = 1 << 5,
    RPC_T_BIN = 1 << 6,
    RPC_T_ARRAY = 1 << 7,
    RPC_T_MAP = 1 << 8,
    RPC_T_NUMBER = RPC_T_UINT | RPC_T_INT | RPC_T_FLOAT,
};

struct rpc_param {
    const char *name;
    unsigned types;
    bool required;
};

int rpc_bind(const msgpack_object *params, const struct rpc_param *spec, size_t n,
             const msgpack_object **out, char *why, size_t whylen);

/* What a mask of RPC_T_* asks for, as rpc_bind's messages name it
 * ("string", "number", "boolean"...). */
const char *rpc_types_wanted(unsigned types);

/* A number object as double (int, uint or float); false if not a number. */
bool rpc_as_double(const msgpack_object *o, double *v);

/* Name of an object's type for messages ("string", "map", ...). */
const char *rpc_type_name(const msgpack_object *o);

/* --- writers (pack into any msgpack_packer) -------------------------- */

void rpc_pack_str(msgpack_packer *pk, const char *s);
void rpc_pack_strn(msgpack_packer *pk, const char *s, size_t n);

/* A str of text that names what a client chose (a task id, a scope, a node,
 * a message quoting them): bytes that are not valid UTF-8 — which the edge
 * refuses (rpc_check_ident), so only a defect or a record another sidecar
 * wrote brings them — go out with each maximal invalid subpart replaced by
 * U+FFFD, so a strict decoder (and the JSON of `stats`) always reads it
 * (PROTOCOL.md §3). Valid text is packed unchanged, without a copy. */
void rpc_pack_text(msgpack_packer *pk, const char *s);
void rpc_pack_kv_text(msgpack_packer *pk, const char *key, const char *val);

/* One key/value pair of a map whose header the caller already packed
 * (for text a client chose: rpc_pack_kv_text). */
void rpc_pack_kv_str(msgpack_packer *pk, const char *key, const char *val);
void rpc_pack_kv_u64(msgpack_packer *pk, const char *key, uint64_t val);
void rpc_pack_kv_double(msgpack_packer *pk, const char *key, double val);

/* [0, msgid, method, <caller packs params: an array>] */
void rpc_pack_request_begin(msgpack_packer *pk, uint32_t msgid, const char *method);

/* [1, msgid, nil, <caller packs the result>] */
void rpc_pack_result_begin(msgpack_packer *pk, uint32_t msgid);

/* [1, msgid, {code, message, <caller packs n_extra key/value pairs>},
 * then rpc_pack_error_end() packs the nil result. */
void rpc_pack_error_begin(msgpack_packer *pk, uint32_t msgid, enum pgw_code code,
                          const char *message, size_t n_extra);
void rpc_pack_error_end(msgpack_packer *pk);

/* The error object alone: {code, message, <caller packs n_extra pairs>}
 * (what rpc_pack_error_begin() puts in a response). `message` is packed as
 * text (rpc_pack_text): one that quotes a client's bytes stays UTF-8. */
void rpc_pack_error_map(msgpack_packer *pk, enum pgw_code code, const char *message,
                        size_t n_extra);

/* A complete error response with no extra fields. */
void rpc_pack_error(msgpack_packer *pk, uint32_t msgid, enum pgw_code code, const char *message);

/* [2, method, <caller packs params: an array>] */
void rpc_pack_notify_begin(msgpack_packer *pk, const char *method);

/* The connection-level error notification sent before the sidecar closes a
 * connection whose stream it cannot trust any more (malformed or oversized
 * frame): [2, "error", [{code, message}]]. */
void rpc_pack_fatal(msgpack_packer *pk, enum pgw_code code, const char *message);

/* Checks that p[0..n) is a whole number of msgpack-RPC messages, each an
 * array of 3 or 4 whose first element is a message type: a map header
 * that promises more or fewer pairs than were packed after it leaves a
 * stray object or a truncated tail, and fails here. For debug builds
 * (the sidecar runs it on every write queue under PGW_CHECK_PACKING).
 * Returns 0, or -1 with a reason in `why` (NULL allowed). */
int rpc_check_messages(const char *p, size_t n, char *why, size_t whylen);

#endif /* POLYGW_RPC_H */

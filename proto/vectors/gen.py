#!/usr/bin/python3
"""gen.py -- generates the polygw wire-protocol test vectors.

    /usr/bin/python3 proto/vectors/gen.py             write *.msgpack and vectors.json here
    /usr/bin/python3 proto/vectors/gen.py --check     exit 1 if the committed files (or the
                                                      examples in proto/PROTOCOL.md) are stale
    /usr/bin/python3 proto/vectors/gen.py --examples  print the annotated examples of PROTOCOL.md

Deterministic: the same script always writes the same bytes. Valid messages are
encoded by the small explicit encoder below (so a vector can pin a float32, a
non-minimal integer width or a duplicate map key, which python-msgpack cannot
express) and cross-checked against python-msgpack: every valid frame must decode
with msgpack.Unpacker to the expected value, and every frame built only from
plain values must be byte-identical to msgpack.packb(). Invalid frames are
written as raw bytes. README.md in this folder describes the manifest.
"""
import json
import math
import os
import struct
import sys

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOCOL_MD = os.path.join(HERE, "..", "PROTOCOL.md")
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 32
JSON_SAFE_INT = 2**53 - 1

# ---------------------------------------------------------------------------
# Value model: plain Python values plus wrappers for what msgpack can say and
# Python cannot.


class F32:
    """A float32 (the value is rounded to single precision)."""

    def __init__(self, v):
        self.v = struct.unpack(">f", struct.pack(">f", v))[0]


class Int:
    """An integer with an explicit encoding: fmt is one of u8 u16 u32 u64 i8 i16 i32 i64."""

    def __init__(self, v, fmt):
        self.v, self.fmt = v, fmt


class Str:
    """A string with an explicit header: hdr is one of fix 8 16 32."""

    def __init__(self, s, hdr):
        self.s, self.hdr = s, hdr


class Arr:
    """An array with an explicit header: hdr is one of fix 16 32."""

    def __init__(self, items, hdr):
        self.items, self.hdr = items, hdr


class Pairs:
    """A map given as ordered (key, value) pairs: allows duplicate and non-string keys."""

    def __init__(self, pairs):
        self.pairs = pairs


class Ext:
    def __init__(self, code, data):
        self.code, self.data = code, data


class Raw:
    """Bytes spliced verbatim (for invalid content inside a structure)."""

    def __init__(self, data):
        self.data = data


INT_FMT = {"u8": (0xCC, ">B"), "u16": (0xCD, ">H"), "u32": (0xCE, ">I"), "u64": (0xCF, ">Q"),
           "i8": (0xD0, ">b"), "i16": (0xD1, ">h"), "i32": (0xD2, ">i"), "i64": (0xD3, ">q")}


def enc_int(v):
    if 0 <= v <= 0x7F:
        return bytes([v])
    if -32 <= v < 0:
        return struct.pack(">b", v)
    if v >= 0:
        for fmt in ("u8", "u16", "u32", "u64"):
            b, f = INT_FMT[fmt]
            if v < 256 ** struct.calcsize(f):
                return bytes([b]) + struct.pack(f, v)
        raise ValueError("integer too large for msgpack: %d" % v)
    for fmt in ("i8", "i16", "i32", "i64"):
        b, f = INT_FMT[fmt]
        if v >= -(2 ** (8 * struct.calcsize(f) - 1)):
            return bytes([b]) + struct.pack(f, v)
    raise ValueError("integer too small for msgpack: %d" % v)


def enc_len(n, fix_base, fix_max, codes):
    """Header for a str/bin/array/map of n items with the smallest encoding."""
    if fix_base is not None and n <= fix_max:
        return bytes([fix_base | n])
    for code, f in codes:
        if n < 256 ** struct.calcsize(f):
            return bytes([code]) + struct.pack(f, n)
    raise ValueError("too long")


STR_CODES = [(0xD9, ">B"), (0xDA, ">H"), (0xDB, ">I")]
BIN_CODES = [(0xC4, ">B"), (0xC5, ">H"), (0xC6, ">I")]
ARR_CODES = [(0xDC, ">H"), (0xDD, ">I")]
MAP_CODES = [(0xDE, ">H"), (0xDF, ">I")]


def enc(v):
    """Encodes a value of the model (smallest encoding unless a wrapper says otherwise)."""
    if v is None:
        return b"\xc0"
    if v is False:
        return b"\xc2"
    if v is True:
        return b"\xc3"
    if isinstance(v, int):
        return enc_int(v)
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, F32):
        return b"\xca" + struct.pack(">f", v.v)
    if isinstance(v, Int):
        b, f = INT_FMT[v.fmt]
        return bytes([b]) + struct.pack(f, v.v)
    if isinstance(v, str):
        data = v.encode("utf-8")
        return enc_len(len(data), 0xA0, 31, STR_CODES) + data
    if isinstance(v, Str):
        data = v.s.encode("utf-8")
        if v.hdr == "fix":
            return bytes([0xA0 | len(data)]) + data
        code, f = dict(zip(("8", "16", "32"), STR_CODES))[v.hdr]
        return bytes([code]) + struct.pack(f, len(data)) + data
    if isinstance(v, bytes):
        return enc_len(len(v), None, 0, BIN_CODES) + v
    if isinstance(v, Ext):
        fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
        if len(v.data) in fixed:
            head = bytes([fixed[len(v.data)]])
        else:
            head = enc_len(len(v.data), None, 0, [(0xC7, ">B"), (0xC8, ">H"), (0xC9, ">I")])
        return head + struct.pack(">b", v.code) + v.data
    if isinstance(v, list):
        return enc_len(len(v), 0x90, 15, ARR_CODES) + b"".join(enc(x) for x in v)
    if isinstance(v, Arr):
        if v.hdr == "fix":
            head = bytes([0x90 | len(v.items)])
        else:
            code, f = dict(zip(("16", "32"), ARR_CODES))[v.hdr]
            head = bytes([code]) + struct.pack(f, len(v.items))
        return head + b"".join(enc(x) for x in v.items)
    if isinstance(v, dict):
        v = Pairs(list(v.items()))
    if isinstance(v, Pairs):
        return enc_len(len(v.pairs), 0x80, 15, MAP_CODES) + b"".join(
            enc(k) + enc(x) for k, x in v.pairs)
    if isinstance(v, Raw):
        return v.data
    raise TypeError("cannot encode %r" % (v,))


def plain(v):
    """The value python-msgpack decodes the encoding of v to (for cross-checks)."""
    if isinstance(v, F32):
        return v.v
    if isinstance(v, Int):
        return v.v
    if isinstance(v, Str):
        return v.s
    if isinstance(v, Ext):
        return msgpack.ExtType(v.code, v.data)
    if isinstance(v, (list, Arr)):
        return [plain(x) for x in (v.items if isinstance(v, Arr) else v)]
    if isinstance(v, (dict, Pairs)):
        pairs = v.pairs if isinstance(v, Pairs) else v.items()
        return {plain(k): plain(x) for k, x in pairs}
    if isinstance(v, Raw):
        raise TypeError("Raw has no decoded value")
    return v


def is_plain(v):
    """True when v uses no wrapper, so msgpack.packb must give the same bytes."""
    if isinstance(v, (F32, Int, Str, Arr, Pairs, Ext, Raw)):
        return False
    if isinstance(v, list):
        return all(is_plain(x) for x in v)
    if isinstance(v, dict):
        return all(is_plain(k) and is_plain(x) for k, x in v.items())
    return True


def render(v):
    """The JSON rendering of a decoded value (the convention of README.md)."""
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, (int, Int)):
        n = v.v if isinstance(v, Int) else v
        return n if -JSON_SAFE_INT <= n <= JSON_SAFE_INT else {"$int": str(n)}
    if isinstance(v, (float, F32)):
        x = v.v if isinstance(v, F32) else v
        tag = "$f32" if isinstance(v, F32) else "$f64"
        if math.isnan(x):
            return {tag: "nan"}
        if math.isinf(x):
            return {tag: "inf" if x > 0 else "-inf"}
        return {tag: x}
    if isinstance(v, (str, Str)):
        return v.s if isinstance(v, Str) else v
    if isinstance(v, bytes):
        return {"$bin": v.hex()}
    if isinstance(v, Ext):
        return {"$ext": [v.code, v.data.hex()]}
    if isinstance(v, (list, Arr)):
        return [render(x) for x in (v.items if isinstance(v, Arr) else v)]
    if isinstance(v, (dict, Pairs)):
        pairs = v.pairs if isinstance(v, Pairs) else list(v.items())
        keys = [k.s if isinstance(k, Str) else k for k, _ in pairs]
        if (all(isinstance(k, str) and not k.startswith("$") for k in keys)
                and len(set(keys)) == len(keys)):
            return {k: render(x) for k, (_, x) in zip(keys, pairs)}
        return {"$map": [[render(k), render(x)] for k, x in pairs]}
    raise TypeError("cannot render %r" % (v,))


# ---------------------------------------------------------------------------
# The vectors.

VECTORS = []


def kind_of(msg):
    items = msg.items if isinstance(msg, Arr) else msg
    if not isinstance(items, list) or not items:
        return None
    t = items[0].v if isinstance(items[0], Int) else items[0]
    if type(t) is int and t in (0, 1, 2):
        return ["request", "response", "notification"][t]
    return None


def add(name, why, frames=(), tail=b"", error=None, kind="auto", max_message_bytes=None):
    """One vector: `frames` are the complete messages the file starts with (model
    values), `tail` raw bytes after them, `error` the outcome after the frames."""
    frames = list(frames)
    data = b"".join(enc(f) for f in frames) + tail
    if kind == "auto":
        kinds = [kind_of(f) for f in frames]
    else:
        kinds = [kind] * len(frames)
    v = {"name": name, "file": name + ".msgpack", "valid": error is None,
         "frames": len(frames)}
    if len(frames) == 1:
        v["kind"], v["decoded"] = kinds[0], render(frames[0])
    elif len(frames) > 1:
        v["kind"], v["decoded"] = kinds, [render(f) for f in frames]
    else:
        v["kind"], v["decoded"] = None, None
    v["error"] = error
    v["why"] = why
    if max_message_bytes is not None:
        v["max_message_bytes"] = max_message_bytes
    assert all(c.isalnum() or c == "_" for c in name), name
    assert name not in [x[0]["name"] for x in VECTORS], name
    VECTORS.append((v, data, frames))


def nest(levels, inner):
    """`levels` nested arrays around `inner` (levels=1: [inner])."""
    v = inner
    for _ in range(levels):
        v = [v]
    return v


def nest_maps(levels, inner):
    v = inner
    for _ in range(levels):
        v = {"a": v}
    return v


PING = [0, 1, "ping", []]
CALL_BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Say hi"}]}
CALL = [0, 7, "call", [{"capability": "chat", "body": CALL_BODY}]]
CANCEL = [2, "cancel", [7]]
USAGE = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}


def call_with(msgid, params):
    return [0, msgid, "call", [params]]


def define():
    # -- valid: requests --------------------------------------------------
    add("request_ping", "ping with an empty params array: the smallest request", [PING])
    add("request_ping_nil_params", "params [nil] means no parameters, like []",
        [[0, 2, "ping", [None]]])
    add("request_ping_empty_map", "params [{}] means no parameters, like []",
        [[0, 3, "ping", [{}]]])
    add("request_stats", "stats takes no parameters", [[0, 4, "stats", []]])
    add("request_call", "call with the two required named parameters", [CALL])
    add("request_call_all_params", "call with every optional parameter set; deadline_s "
        "given as an integer (any number is accepted)",
        [call_with(8, {"capability": "chat", "body": CALL_BODY, "stream": True,
                       "scope": "chat-batch", "task_id": "run-42", "deadline_s": 30})])
    add("request_call_optional_nil", "an optional parameter given as nil is absent",
        [call_with(9, {"capability": "embedding", "body": {"input": "abc"}, "stream": None,
                       "scope": None, "task_id": None, "deadline_s": None})])
    add("request_msgid_max", "msgid 2^32-1 is the largest valid msgid",
        [[0, 2**32 - 1, "ping", []]])
    add("request_msgid_zero", "msgid 0 is valid", [[0, 0, "ping", []]])
    add("request_unicode", "UTF-8 strings in values, map keys and parameters (2-, 3- and "
        "4-byte sequences); a str8 header is needed for the longer ones",
        [call_with(10, {"capability": "chat", "scope": "équipe-α", "body": {
            "messages": [{"role": "user", "content": "héllo wörld — 世界 🌍"}],
            "metadata": {"ключ": "значение", "emoji 🔑": "✓"}}})])
    add("request_big_ints", "every integer width; uint64 and int64 extremes beyond 2^53 "
        "are rendered as {\"$int\": \"...\"}",
        [call_with(11, {"capability": "chat", "body": {
            "seed": 2**64 - 1, "min": -2**63, "safe_max": 2**53 - 1, "unsafe": 2**53,
            "neg_unsafe": -2**53,
            "widths": [0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, -1, -32, -33,
                       -128, -129, -32768, -32769, -2**31, -2**31 - 1]}})])
    add("request_floats", "float32 and float64 values; a float32 is compared as the exact "
        "double it widens to (0.1f is 0.10000000149011612); deadline_s as float32",
        [call_with(12, {"capability": "chat", "deadline_s": F32(2.5), "body": {
            "temperature": F32(0.5), "f32_inexact": F32(0.1), "top_p": 0.1, "zero": 0.0,
            "negative": -2.75, "tiny": 5e-324, "huge": 1.7976931348623157e308,
            "f32_max": F32(3.4028234663852886e38), "integral": 3.0}})])
    add("request_nested_body", "nested maps and arrays, empty containers, nil and booleans",
        [call_with(13, {"capability": "chat", "body": {
            "model": "m", "stream": False, "stop": None, "logprobs": True, "logit_bias": {},
            "tools": [{"type": "function", "function": {
                "name": "get_weather",
                "parameters": {"type": "object",
                               "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}}],
            "shapes": [[], [[]], [{}], [1, [2, [3, [4]]]], {"k": [None, False]}]}})])
    add("request_wide_encodings", "non-minimal encodings are valid: type as int8, msgid as "
        "uint64, method as str8, params as array16 (decoders must not assume the smallest "
        "width)",
        [[Int(0, "i8"), Int(5, "u64"), Str("ping", "8"), Arr([], "16")]])
    add("request_depth_32", "nests exactly 32 containers (message, params, params map, body, "
        "then 28 arrays, the innermost empty): the deepest message allowed",
        [call_with(14, {"capability": "chat", "body": {"x": nest(27, [])}})])
    add("request_task_node_begin", "a task method (added by a later version): named "
        "parameters like every request",
        [[0, 15, "task.node_begin", [{"task_id": "run-42", "node": "plan", "timeout_s": 120}]]])
    add("request_codec_types", "bin, ext, a map with integer keys and a map whose key "
        "starts with '$' are well-formed msgpack-RPC (the sidecar answers this unknown "
        "method with unknown_method; it rejects bin/ext inside a call body)",
        [[0, 16, "echo", [{"blob": b"\x00\x01\xfe\xff", "tag": Ext(5, b"\x01\x02\x03"),
                           "fixext": Ext(42, b"\x2a"), "big_bin": bytes(range(256)) * 2,
                           "int_keys": Pairs([(1, "one"), (-2, "minus two")]),
                           "dollar": {"$bin": "not a tag"}}]]])
    add("limit_exact_fit", "a frame exactly max_message_bytes long is accepted",
        [CALL], max_message_bytes=len(enc(CALL)))

    # -- valid: responses -------------------------------------------------
    add("response_ping", "ping result", [[1, 1, None, {"version": "0.1.0", "uptime_s": 12.5}]])
    stats = {"version": "0.1.0", "uptime_s": 3600.25,
             "connections": {"open": 3, "accepted": 17, "rejected": 0},
             "requests": {"served": 1024, "in_flight": 2},
             "rejected": {"bad_request": 2, "overloaded": 1}}
    add("response_stats", "stats result: the keys every version returns", [[1, 4, None, stats]])
    add("response_stats_later_keys", "stats result of a later version with sources, scopes "
        "and tasks: clients must ignore keys they do not know",
        [[1, 5, None, dict(stats, sources=[{"name": "openai-a", "in_flight": 1, "limit": 4.5,
                                            "breaker": "closed"}],
                           scopes={"chat": {"progress_age_s": 0.75}},
                           tasks={"running": 1})]])
    add("response_call", "call result with body and usage",
        [[1, 7, None, {"body": {"id": "chatcmpl-1", "object": "chat.completion",
                                "choices": [{"index": 0, "finish_reason": "stop",
                                             "message": {"role": "assistant",
                                                         "content": "Hi!"}}],
                                "usage": USAGE},
                       "source": "openai-a", "attempts": 1, "elapsed_s": 0.84,
                       "stalled_s": 0.0, "usage": USAGE}]])
    add("response_call_stream_final", "the final response of a streamed call has no body",
        [[1, 8, None, {"source": "openai-b", "attempts": 2, "elapsed_s": 3.5,
                       "stalled_s": 1.25, "usage": USAGE}]])
    add("response_error", "an error response: error map, nil result",
        [[1, 16, {"code": "unknown_method", "message": "unknown method 'echo'"}, None]])
    add("response_error_extras", "stalled with every generic extra field",
        [[1, 7, {"code": "stalled", "message": "scope 'chat' made no progress for 300 s",
                 "retry_after_s": 30.0, "attempts": 0, "stalled_s": 300.5,
                 "sources": [{"name": "openai-a", "reason": "breaker_open"},
                             {"name": "openai-b", "reason": "http_429",
                              "detail": "Retry-After: 30"}]}, None]])
    add("response_error_upstream_rejected", "upstream_rejected carries status and the "
        "upstream body (any type)",
        [[1, 7, {"code": "upstream_rejected", "message": "upstream answered 400",
                 "status": 400, "attempts": 1,
                 "upstream_body": {"error": {"message": "Invalid 'messages'",
                                             "type": "invalid_request_error",
                                             "code": None}}}, None]])
    add("response_error_unknown_code", "a code this client does not know (a newer sidecar): "
        "still a well-formed response",
        [[1, 17, {"code": "quota_exhausted", "message": "new in a later version",
                  "future_field": [1, 2]}, None]])

    # -- valid: notifications ---------------------------------------------
    add("notification_chunk", "one stream event of call 7: params are positional "
        "[msgid, event]",
        [[2, "chunk", [7, {"id": "chatcmpl-1",
                           "choices": [{"index": 0, "delta": {"content": "Hi"}}]}]]])
    add("notification_cancel", "cancel call 7: params are positional [msgid]", [CANCEL])
    add("notification_fatal_error", "the connection-level error sent before the sidecar "
        "closes (exactly what rpc_pack_fatal writes)",
        [[2, "error", [{"code": "bad_request", "message": "malformed msgpack"}]]])
    add("notification_fatal_too_large", "the connection-level error for an over-limit frame",
        [[2, "error", [{"code": "too_large",
                        "message": "message exceeds max_message_bytes"}]]])
    add("three_frames", "three messages back to back in one file: ping, call, cancel",
        [PING, CALL, CANCEL])

    # -- incomplete: a valid prefix, never an error -----------------------
    call_bytes, ping_bytes = enc(CALL), enc(PING)
    add("incomplete_truncated_call", "the call request without its last byte: a reader "
        "must wait for more, forever", tail=call_bytes[:-1], error="incomplete")
    add("incomplete_inside_string", "cut inside the method string",
        tail=ping_bytes[:5], error="incomplete")
    add("incomplete_str32_header", "a str32 header cut inside its length: the claim is not "
        "known yet", tail=b"\xdb\x05\xf5", error="incomplete")
    add("incomplete_after_frame", "one whole ping, then the first 3 bytes of a call",
        [PING], tail=call_bytes[:3], error="incomplete")

    # -- malformed ----------------------------------------------------------
    add("malformed_reserved_c1", "0xc1 is never used by msgpack: [0, 1, <0xc1>, []]",
        tail=b"\x94\x00\x01\xc1\x90", error="malformed")
    add("malformed_c1_alone", "a lone 0xc1", tail=b"\xc1", error="malformed")
    add("malformed_after_frame", "a valid ping, then 0xc1: the first frame is delivered, "
        "then the stream is broken", [PING], tail=b"\xc1", error="malformed")

    # -- not msgpack-RPC ----------------------------------------------------
    def not_rpc(name, why, msg):
        add(name, why, [msg], error="not_rpc", kind=None)

    not_rpc("not_rpc_map", "top level is a map, not an array",
            {"type": 0, "msgid": 1, "method": "ping", "params": []})
    not_rpc("not_rpc_scalar", "top level is a string", "ping")
    not_rpc("not_rpc_empty_array", "an empty array", [])
    not_rpc("not_rpc_short_request", "a request with 3 elements", [0, 1, "ping"])
    not_rpc("not_rpc_long_request", "a request with 5 elements", [0, 1, "ping", [], None])
    not_rpc("not_rpc_type_3", "type 3 does not exist", [3, 1, "ping", []])
    not_rpc("not_rpc_type_negative", "type -1", [-1, 1, "ping", []])
    not_rpc("not_rpc_type_string", "type given as a string", ["0", 1, "ping", []])
    not_rpc("not_rpc_msgid_negative", "msgid -1", [0, -1, "ping", []])
    not_rpc("not_rpc_msgid_too_big", "msgid 2^32 does not fit in uint32", [0, 2**32, "ping", []])
    not_rpc("not_rpc_msgid_float", "msgid 1.0 is a float, not an integer", [0, 1.0, "ping", []])
    not_rpc("not_rpc_msgid_nil", "msgid nil", [0, None, "ping", []])
    not_rpc("not_rpc_method_int", "method 5 is not a string", [0, 1, 5, []])
    not_rpc("not_rpc_method_bin", "method as bin: strings are msgpack str, never bin",
            [0, 1, b"ping", []])
    not_rpc("not_rpc_notification_method_int", "notification method 7 is not a string",
            [2, 7, [1]])
    not_rpc("not_rpc_notification_long", "a notification with 4 elements",
            [2, "cancel", [1], None])
    not_rpc("not_rpc_response_short", "a response with 3 elements", [1, 1, None])
    not_rpc("not_rpc_response_error_string", "a response error must be nil or a map",
            [1, 1, "oops", None])

    # -- too large ----------------------------------------------------------
    prefix = enc(call_with(1, {"capability": "chat", "body": {}}))
    body_at = prefix.index(b"\xa4body") + 5  # just after the "body" key
    add("too_large_str32_header", "a lone str32 header claiming 100,000,000 bytes: over the "
        "default limit, judged from these 5 bytes without waiting for the payload",
        tail=b"\xdb\x05\xf5\xe1\x00", error="too_large")
    add("too_large_str32_in_request", "a call whose body is a str32 header claiming "
        "100,000,000 bytes; the file ends after the header",
        tail=prefix[:body_at] + b"\xdb\x05\xf5\xe1\x00", error="too_large")
    add("too_large_array32_header", "an array32 header claiming 2^32-1 elements (each takes "
        "at least one byte)", tail=b"\xdd\xff\xff\xff\xff", error="too_large")
    add("too_large_map32_in_request", "a call whose body is a map32 header claiming 2^31 "
        "pairs", tail=prefix[:body_at] + b"\xdf\x80\x00\x00\x00", error="too_large")
    add("too_large_bin32_header", "a bin32 header claiming 2^31 bytes",
        tail=b"\xc6\x80\x00\x00\x00", error="too_large")
    add("too_large_small_limit", "a complete %d-byte call over a max_message_bytes of 64"
        % len(call_bytes), tail=call_bytes, error="too_large", max_message_bytes=64)
    add("too_large_second_frame", "the limit is per frame: the %d-byte ping fits in 32, "
        "the call after it does not" % len(ping_bytes), [PING], tail=call_bytes,
        error="too_large", max_message_bytes=32)
    add("too_large_one_over", "a frame one byte over the limit",
        tail=call_bytes, error="too_large", max_message_bytes=len(call_bytes) - 1)

    # -- too deep -----------------------------------------------------------
    add("too_deep_33", "33 nested containers (message, params, params map, body, 29 arrays)",
        tail=enc(call_with(1, {"capability": "chat", "body": {"x": nest(29, 1)}})),
        error="too_deep")
    add("too_deep_33_empty_innermost", "33 nested containers where the innermost is empty: "
        "an empty container is a nesting level too",
        tail=enc(call_with(1, {"capability": "chat", "body": {"x": nest(28, [])}})),
        error="too_deep")
    add("too_deep_maps", "33 nested maps at top level", tail=enc(nest_maps(33, 1)),
        error="too_deep")
    add("too_deep_arrays_unterminated", "34 array headers and nothing else: the depth is "
        "judged before the frame ends", tail=b"\x91" * 34, error="too_deep")

    # -- well-formed requests with bad params (connection stays usable) ----
    def bad(name, why, msg):
        add(name, why, [msg], error="bad_params")

    bad("bad_params_map_not_array", "params is a map instead of [map]",
        [0, 1, "call", {"capability": "chat", "body": {}}])
    bad("bad_params_string", "params is a string", [0, 1, "ping", "verbose"])
    bad("bad_params_nil", "params is nil instead of []", [0, 1, "ping", None])
    bad("bad_params_two_maps", "params holds two maps",
        [0, 1, "call", [{"capability": "chat", "body": {}}, {}]])
    bad("bad_params_positional", "positional params are not accepted for requests",
        [0, 1, "call", ["chat", {}]])
    bad("bad_params_unknown_key_ping", "ping takes no parameters",
        [0, 1, "ping", [{"verbose": True}]])
    bad("bad_params_unknown_key_call", "temperature belongs inside body, not among the "
        "parameters", call_with(1, {"capability": "chat", "body": {}, "temperature": 0.2}))
    bad("bad_params_missing_body", "body is required", call_with(1, {"capability": "chat"}))
    bad("bad_params_required_nil", "nil for a required parameter counts as missing",
        call_with(1, {"capability": None, "body": {}}))
    bad("bad_params_capability_int", "capability must be a string",
        call_with(1, {"capability": 1, "body": {}}))
    bad("bad_params_capability_bin", "capability as bin: strings are str, never bin",
        call_with(1, {"capability": b"chat", "body": {}}))
    bad("bad_params_body_array", "body must be a map",
        call_with(1, {"capability": "chat", "body": [{"role": "user"}]}))
    bad("bad_params_stream_int", "stream must be a boolean",
        call_with(1, {"capability": "chat", "body": {}, "stream": 1}))
    bad("bad_params_deadline_string", "deadline_s must be a number",
        call_with(1, {"capability": "chat", "body": {}, "deadline_s": "30"}))
    bad("bad_params_duplicate_key", "a parameter given twice",
        [0, 1, "call", [Pairs([("capability", "chat"), ("body", {}),
                               ("capability", "embedding")])]])
    bad("bad_params_duplicate_after_nil", "a parameter given twice, the first time as nil",
        [0, 1, "call", [Pairs([("capability", "chat"), ("body", {}), ("scope", None),
                               ("scope", "other")])]])
    bad("bad_params_key_not_string", "parameter names must be strings",
        [0, 1, "call", [Pairs([("capability", "chat"), ("body", {}), (1, "x")])]])


# ---------------------------------------------------------------------------
# Cross-checks against python-msgpack.

def unpacker(limit):
    return msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=limit,
                            timestamp=0)


def same(a, b):
    """Equality that tells 1 from 1.0 and True from 1 (python == does not)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def cross_check(v, data, frames):
    if any(isinstance(f, Raw) for f in frames):
        raise AssertionError(v["name"] + ": raw bytes in a frame")
    for f in frames:
        if is_plain(f) and msgpack.packb(f, use_bin_type=True) != enc(f):
            raise AssertionError(v["name"] + ": encoder disagrees with msgpack.packb")
    up = unpacker(max(len(data), 1))
    up.feed(data)
    got = []
    try:
        for obj in up:
            got.append(obj)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError):
        if v["error"] not in ("malformed", "too_deep", "too_large"):
            raise
    want = [plain(f) for f in frames]
    if v["error"] in ("too_deep",) or len(got) > len(frames):
        # python-msgpack nests deeper than 32; the tail is not a frame we describe.
        got = got[:len(frames)]
    if len(got) != len(want) or not all(same(g, w) for g, w in zip(got, want)):
        raise AssertionError("%s: python-msgpack decodes %r, expected %r"
                             % (v["name"], got, want))


# ---------------------------------------------------------------------------
# Annotated examples for PROTOCOL.md.

EXAMPLES = [
    ("ping request", "request_ping"),
    ("ping response", "response_ping"),
    ("error response", "response_error"),
    ("call request", "request_call"),
    ("chunk notification", "notification_chunk"),
    ("cancel notification", "notification_cancel"),
    ("fatal error notification", "notification_fatal_error"),
]


def describe(data, pos):
    """(header length, payload length, description, kind, count) of the item at pos."""
    b = data[pos]
    if b <= 0x7F:
        return 1, 0, "positive fixint %d" % b, "s", 0
    if b >= 0xE0:
        return 1, 0, "negative fixint %d" % (b - 256), "s", 0
    if 0x80 <= b <= 0x8F:
        return 1, 0, "fixmap, %d pairs" % (b & 15), "m", b & 15
    if 0x90 <= b <= 0x9F:
        return 1, 0, "fixarray, %d items" % (b & 15), "a", b & 15
    if 0xA0 <= b <= 0xBF:
        n = b & 31
        return 1, n, "fixstr, %d bytes %s" % (n, json.dumps(
            data[pos + 1:pos + 1 + n].decode(), ensure_ascii=False)), "s", 0
    if b == 0xC0:
        return 1, 0, "nil", "s", 0
    if b in (0xC2, 0xC3):
        return 1, 0, "false" if b == 0xC2 else "true", "s", 0
    if b == 0xCB:
        return 9, 0, "float64 %r" % struct.unpack(">d", data[pos + 1:pos + 9])[0], "s", 0
    if b == 0xCA:
        return 5, 0, "float32 %r" % struct.unpack(">f", data[pos + 1:pos + 5])[0], "s", 0
    if b in (0xCC, 0xCD, 0xCE, 0xCF):
        w = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}[b]
        return 1 + w, 0, "uint%d %d" % (8 * w, int.from_bytes(data[pos + 1:pos + 1 + w],
                                                                 "big")), "s", 0
    if b == 0xD9:
        n = data[pos + 1]
        return 2, n, "str8, %d bytes %s" % (n, json.dumps(
            data[pos + 2:pos + 2 + n].decode(), ensure_ascii=False)), "s", 0
    raise ValueError("the annotator does not know 0x%02x" % b)


ROLES = {
    "request": ["type 0 = request", "msgid", "method", "params"],
    "response": ["type 1 = response", "msgid", "error", "result"],
    "notification": ["type 2 = notification", "method", "params"],
}
PARAM_ROLES = {  # labels of the params array's elements, by method
    "chunk": ["msgid of the streamed call", "event"],
    "cancel": ["msgid of the call to cancel"],
    "error": ["error object"],
}


def plural(desc):
    return desc.replace(", 1 items", ", 1 item").replace(", 1 pairs", ", 1 pair")


def annotate(data):
    """Lines of 'hex  # annotation' for one message, indented by nesting."""
    lines = []

    def item(pos, depth, role, child_roles=()):
        hl, pl, desc, kind, count = describe(data, pos)
        hexs = data[pos:pos + hl + pl].hex(" ")
        note = plural(desc) + (": " + role if role else "")
        # Wrap long strings: 16 bytes per line, the note on the first.
        chunks = [hexs[i:i + 48].strip() for i in range(0, len(hexs), 48)] or [""]
        lines.append(("  " * depth + chunks[0], note))
        for c in chunks[1:]:
            lines.append(("  " * depth + c, ""))
        pos += hl + pl
        if kind == "a":
            roles, grand = list(child_roles), {}
            if depth == 0:
                mtype = {0: "request", 1: "response", 2: "notification"}.get(data[pos])
                roles = ROLES.get(mtype, [])
                if mtype == "request":
                    grand = {3: ["named parameters"]}
                elif mtype == "notification":
                    m_hl, m_pl, _, _, _ = describe(data, pos + 1)
                    method = data[pos + 1 + m_hl:pos + 1 + m_hl + m_pl].decode()
                    grand = {2: PARAM_ROLES.get(method, [])}
            for i in range(count):
                pos = item(pos, depth + 1, roles[i] if i < len(roles) else "",
                           grand.get(i, ()))
        elif kind == "m":
            for _ in range(count):
                kpos = pos
                pos = item(pos, depth + 1, "key")
                khl, kpl, _, _, _ = describe(data, kpos)
                key = data[kpos + khl:kpos + khl + kpl].decode()
                pos = item(pos, depth + 1, "value of " + key)
        return pos

    end = item(0, 0, "")
    assert end == len(data)
    width = max(len(h) for h, _ in lines) + 2
    return "\n".join((h.ljust(width) + ("# " + n if n else "")).rstrip() for h, n in lines)


def examples_markdown(vectors):
    by_name = {v["name"]: (v, data) for v, data, _ in vectors}
    out = []
    for title, name in EXAMPLES:
        v, data = by_name[name]
        out.append("#### %s\n\nVector `%s`, %d bytes; in the JSON rendering of the vectors: "
                   "`%s`\n\n```\n%s\n```\n\nAs one hex string: `%s`\n"
                   % (title, name, len(data), json.dumps(v["decoded"], ensure_ascii=False),
                      annotate(data), data.hex()))
    return "\n".join(out)


# ---------------------------------------------------------------------------

def manifest_text():
    """vectors.json: one field per line, `decoded` on one line, so diffs stay readable."""
    def one(x):
        return json.dumps(x, ensure_ascii=False)

    out = ['{', '  "format": 1,', '  "generator": "proto/vectors/gen.py",',
           '  "defaults": %s,' % one({"max_message_bytes": DEFAULT_MAX_MESSAGE_BYTES,
                                      "max_depth": MAX_DEPTH}),
           '  "vectors": [']
    for i, (v, _, _) in enumerate(VECTORS):
        fields = ",\n".join("      %s: %s" % (one(k), one(x)) for k, x in v.items())
        out.append("    {\n%s\n    }%s" % (fields, "," if i + 1 < len(VECTORS) else ""))
    out += ["  ]", "}", ""]
    text = "\n".join(out)
    assert json.loads(text)["vectors"] == [v for v, _, _ in VECTORS]
    return text


def main(argv):
    define()
    for v, data, frames in VECTORS:
        cross_check(v, data, frames)
    files = {v["file"]: data for v, data, _ in VECTORS}
    files["vectors.json"] = manifest_text().encode()

    if argv[1:] == ["--examples"]:
        sys.stdout.write(examples_markdown(VECTORS))
        return 0
    if argv[1:] == ["--check"]:
        stale = []
        for name, data in sorted(files.items()):
            path = os.path.join(HERE, name)
            if not os.path.exists(path) or open(path, "rb").read() != data:
                stale.append(name)
        extra = sorted(f for f in os.listdir(HERE) if f.endswith(".msgpack") and f not in files)
        proto = open(PROTOCOL_MD, encoding="utf-8").read() if os.path.exists(PROTOCOL_MD) else ""
        for block in examples_markdown(VECTORS).split("#### ")[1:]:
            if block.strip() not in proto:
                stale.append("PROTOCOL.md example: " + block.splitlines()[0])
        for name in stale:
            print("stale: " + name)
        for name in extra:
            print("not generated: " + name)
        return 1 if stale or extra else 0
    if argv[1:]:
        sys.stderr.write(__doc__)
        return 2
    for name, data in files.items():
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data)
    for name in os.listdir(HERE):
        if name.endswith(".msgpack") and name not in files:
            os.remove(os.path.join(HERE, name))
    print("wrote %d vectors to %s" % (len(VECTORS), HERE))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Replays proto/vectors/ (see its README) through the client's own frame
reader, decoder and message classification: whole, byte by byte, and split
in two at every offset. The parameter tables of PROTOCOL §4 are bound here
(the client itself never validates what it sends: a newer sidecar may accept
more), so that `bad_params` vectors are refused and all others accepted."""
import json
import math
import os

import msgpack
import pytest

from pgwtest import VECTORS
from polygw.protocol import (NOTIFICATION, REQUEST, RESPONSE, FrameError, FrameReader,
                             NotRpcError, decode_frame, pack_notification, pack_request,
                             parse_message)

with open(os.path.join(VECTORS, "vectors.json")) as f:
    MANIFEST = json.load(f)
DEFAULT_LIMIT = MANIFEST["defaults"]["max_message_bytes"]
PING = bytes.fromhex("940001a470696e6790")
KINDS = {REQUEST: "request", RESPONSE: "response", NOTIFICATION: "notification"}


class Pairs(list):
    """A map as decoded with object_pairs_hook: its (key, value) pairs in wire order."""


def decode_pairs(frame):
    return decode_frame(frame, object_pairs_hook=Pairs)


# ---------------------------------------------------------------- rendering
def render(v):
    """A decoded value (maps as Pairs) in the JSON rendering of the README;
    floats stay tagged {"$float": x} and match $f32 and $f64 by value
    (python-msgpack widens float32 exactly but does not say which it was)."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v if abs(v) <= 2 ** 53 - 1 else {"$int": str(v)}
    if isinstance(v, float):
        return {"$float": v}
    if isinstance(v, bytes):
        return {"$bin": v.hex()}
    if isinstance(v, msgpack.ExtType):
        return {"$ext": [v.code, v.data.hex()]}
    if isinstance(v, Pairs):
        keys = [k for k, _ in v]
        if all(isinstance(k, str) and not k.startswith("$") for k in keys) and \
                len(set(keys)) == len(keys):
            return {k: render(x) for k, x in v}
        return {"$map": [[render(k), render(x)] for k, x in v]}
    if isinstance(v, (list, tuple)):
        return [render(x) for x in v]
    raise AssertionError("unexpected decoded type %r" % type(v))


def _float_of(tagged):
    x = tagged
    if isinstance(x, str):
        return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[x]
    return float(x)


def same(actual, expected):
    if isinstance(expected, dict) and len(expected) == 1:
        (tag, val), = expected.items()
        if tag in ("$f32", "$f64"):
            if not (isinstance(actual, dict) and set(actual) == {"$float"}):
                return False
            a, e = actual["$float"], _float_of(val)
            return (math.isnan(a) and math.isnan(e)) or a == e
    if isinstance(expected, dict):
        return isinstance(actual, dict) and set(actual) == set(expected) and \
            all(same(actual[k], expected[k]) for k in expected)
    if isinstance(expected, list):
        return isinstance(actual, list) and len(actual) == len(expected) and \
            all(same(a, e) for a, e in zip(actual, expected))
    if isinstance(expected, bool) or expected is None:
        return actual is expected
    if isinstance(expected, int):
        return type(actual) is int and actual == expected
    return type(actual) is type(expected) and actual == expected


# ---------------------------------------------------------------- binding
NUMBER, STR, MAP, BOOL = "number", "str", "map", "bool"
SPECS = {
    "ping": {}, "stats": {},
    "call": {"capability": (STR, True), "body": (MAP, True), "stream": (BOOL, False),
             "scope": (STR, False), "task_id": (STR, False), "deadline_s": (NUMBER, False)},
    "task.start": {"task_id": (STR, True)},
    "task.stop": {"task_id": (STR, True), "reason": (STR, True)},
    "task.guard": {"task_id": (STR, True)},
    "task.node_begin": {"task_id": (STR, True), "node": (STR, True),
                        "timeout_s": (NUMBER, False)},
    "task.node_end": {"task_id": (STR, True), "node": (STR, True)},
    "task.finish": {"task_id": (STR, True), "ok": (BOOL, True), "reason": (STR, False)},
    "task.get": {"task_id": (STR, True)},
    "task.list": {"state": (STR, False)},
}


def _is(v, t):
    if t == NUMBER:
        return type(v) in (int, float)
    if t == STR:
        return type(v) is str
    if t == MAP:
        return isinstance(v, Pairs)
    return type(v) is bool


def bind(params, spec):
    """PROTOCOL §2.2 over a pairs-decoded params value: returns the bound
    dict or raises ValueError."""
    if not isinstance(params, list) or isinstance(params, Pairs) or len(params) > 1:
        raise ValueError("params must be an array holding one map")
    m = params[0] if params else None
    if m is None:
        m = Pairs()
    if not isinstance(m, Pairs):
        raise ValueError("params[0] must be a map")
    seen = {}
    for k, v in m:
        if type(k) is not str:
            raise ValueError("parameter names must be strings")
        if k not in spec:
            raise ValueError("unknown parameter %r" % k)
        if k in seen:
            raise ValueError("parameter %r given twice" % k)
        if v is not None and not _is(v, spec[k][0]):
            raise ValueError("parameter %r: wrong type" % k)
        seen[k] = v
    for k, (_, required) in spec.items():
        if required and seen.get(k) is None:
            raise ValueError("missing required parameter %r" % k)
    return {k: v for k, v in seen.items() if v is not None}


# ---------------------------------------------------------------- replay
def check_frame(vec, frame, index):
    decoded = vec["decoded"] if vec["frames"] == 1 else vec["decoded"][index]
    kind = vec["kind"] if vec["frames"] == 1 else vec["kind"][index]
    raw = decode_pairs(frame)
    assert same(render(raw), decoded), "%s: frame %d decodes to %r" % (vec["name"], index,
                                                                      render(raw))
    try:
        msg = parse_message(decode_frame(frame))
    except NotRpcError:
        assert kind is None and vec["error"] == "not_rpc", "%s: refused as not msgpack-RPC" \
            % vec["name"]
        return "not_rpc"
    assert KINDS[msg[0]] == kind, "%s: classified as %s" % (vec["name"], KINDS[msg[0]])
    if msg[0] == REQUEST and msg[2] in SPECS:
        try:
            bind(raw[3], SPECS[msg[2]])
        except ValueError:
            assert vec["error"] == "bad_params", "%s: params refused" % vec["name"]
            return "bad_params"
        assert vec["error"] != "bad_params", "%s: bad params accepted" % vec["name"]
    return None


def replay(vec, pieces):
    reader = FrameReader(vec.get("max_message_bytes", DEFAULT_LIMIT))
    count = 0
    outcome = None
    for piece in pieces:
        reader.feed(piece)
        try:
            for frame in reader.frames():
                assert count < vec["frames"], "%s: more frames than expected" % vec["name"]
                outcome = check_frame(vec, frame, count) or outcome
                count += 1
        except FrameError as e:
            outcome = e.kind
            break
    assert count == vec["frames"], "%s: %d frames, expected %d" % (vec["name"], count,
                                                                  vec["frames"])
    if outcome in ("malformed", "too_large", "too_deep"):
        # sticky: a valid ping after the error changes nothing
        reader.feed(PING)
        with pytest.raises(FrameError) as again:
            reader.next_frame()
        assert again.value.kind == outcome
    elif outcome is None:
        if reader.pending:
            outcome = "incomplete"
    assert outcome == vec["error"], "%s: outcome %r, expected %r" % (vec["name"], outcome,
                                                                     vec["error"])


def _data(vec):
    with open(os.path.join(VECTORS, vec["file"]), "rb") as f:
        return f.read()


@pytest.mark.parametrize("vec", MANIFEST["vectors"], ids=lambda v: v["name"])
def test_vector(vec):
    data = _data(vec)
    replay(vec, [data])
    replay(vec, [data[i:i + 1] for i in range(len(data))])
    if len(data) <= 4096:
        for cut in range(1, len(data)):
            replay(vec, [data[:cut], data[cut:]])


def test_manifest_covers_every_outcome():
    outcomes = {v["error"] for v in MANIFEST["vectors"]}
    assert outcomes == {None, "incomplete", "malformed", "not_rpc", "too_large", "too_deep",
                        "bad_params"}
    assert len(MANIFEST["vectors"]) >= 80


@pytest.mark.parametrize("name,build", [
    ("request_ping", lambda: pack_request(1, "ping")),
    ("request_call", lambda: pack_request(7, "call", {
        "capability": "chat",
        "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Say hi"}]}})),
    ("notification_cancel", lambda: pack_notification("cancel", [7])),
])
def test_writers_match_vectors(name, build):
    vec = next(v for v in MANIFEST["vectors"] if v["name"] == name)
    assert build() == _data(vec)


# ---------------------------------------------------------------- scanner paths
def test_fast_paths_float_and_small_int_arrays():
    floats = [i / 7 for i in range(5000)]
    ints = list(range(100)) * 50
    frame = msgpack.packb([1, 3, None, {"body": {"data": [{"embedding": floats}], "ids": ints}}])
    r = FrameReader()
    r.feed(frame + PING)
    got = list(r.frames())
    assert got == [frame, PING]
    assert decode_frame(got[0])[3]["body"]["data"][0]["embedding"] == floats
    # the same split anywhere
    for cut in (1, 7, 100, len(frame) // 2, len(frame) - 1):
        r = FrameReader()
        r.feed(frame[:cut])
        assert list(r.frames()) == []
        r.feed(frame[cut:])
        assert list(r.frames()) == [frame]


def test_fast_path_respects_the_limit():
    frame = msgpack.packb([1, 3, None, [0.5] * 100])   # 9 bytes per float
    r = FrameReader(max_bytes=len(frame) - 1)
    r.feed(frame)
    with pytest.raises(FrameError) as e:
        r.next_frame()
    assert e.value.kind == "too_large"
    r = FrameReader(max_bytes=len(frame))
    r.feed(frame)
    assert r.next_frame() == frame


def test_invalid_utf8_is_malformed():
    r = FrameReader()
    r.feed(b"\x93\x02\xa5chunk\x92\x01\xa2\xff\xfe")
    frame = r.next_frame()
    with pytest.raises(FrameError):
        decode_frame(frame)

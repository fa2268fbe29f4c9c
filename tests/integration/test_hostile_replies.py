"""Hostile upstream replies through the real sidecar and the mock upstream:
invalid UTF-8, an upstream that echoes the key it was sent, and replies
nested deeper than the protocol lets a message nest (proto/PROTOCOL.md
§3, §6.1, §7.2).

Each test checks two things: what the client receives (decoded strictly:
msgpack with raw=False raises on invalid UTF-8, and the bundled Python
client applies the protocol's 32-level limit), and that the connection
survives — a second call pipelined on the same connection is answered.
"""
import json
import os
import sys
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "client", "python"))
from conftest import call, chat, config_yaml, source_yaml  # noqa: E402
import polygw  # noqa: E402

KEY_ENV = "POLYGW_TEST_HOSTILE_KEY"
# Letters only, and short: a JSON parser quotes a short bare word in its
# error message (jansson: "invalid token near '...'"), so a key at a
# token's place in a reply that is not JSON reaches the error's detail.
KEY = "skHostileTestKeyXyz"
MARKER = "[redacted]"
# One attempt per call: each answer shows the attempt's own outcome.
DEFAULTS = {"max_attempts": 1, "stall_window_s": 30, "backoff_base_s": 0.05,
            "backoff_max_s": 0.1}
SOURCE = {"api_key_env": KEY_ENV, "timeout_s": 10, "connect_timeout_s": 5,
          "ttft_timeout_s": 5, "idle_timeout_s": 5, "max_concurrency": 64,
          "aimd": {"initial": 64}, "breaker": {"failures": 100000}}
USAGE = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


@pytest.fixture
def sc(make_sidecar, up):
    cfg = config_yaml([source_yaml("a", "chat", up.url, SOURCE)], DEFAULTS, log_level="debug")
    return make_sidecar(config_text=cfg, env={KEY_ENV: KEY, "no_proxy": "*", "NO_PROXY": "*"})


@pytest.fixture
def client(sc):
    with polygw.Client(sc.sock, call_timeout_s=15) as c:
        yield c


class Tap:
    """Wraps a Conn's socket to keep every byte the sidecar sent."""

    def __init__(self, conn):
        self.sock, self.seen = conn.sock, bytearray()
        conn.sock = self

    def recv(self, n):
        data = self.sock.recv(n)
        self.seen += data
        return data

    def __getattr__(self, name):
        return getattr(self.sock, name)


def sse(*events):
    """A raw SSE body (bytes) of `events` (bytes or str each), then [DONE]."""
    out = b""
    for e in events + (b"[DONE]",):
        out += b"data: " + (e.encode() if isinstance(e, str) else e) + b"\n\n"
    return out


def compact(v):
    return json.dumps(v, separators=(",", ":"))


def finish_event(usage=USAGE):
    return compact({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    "usage": usage})


def raw(body, content_type="application/json", status=None):
    """A mock behaviour sending `body` (bytes) verbatim."""
    b = {"body_hex": body.hex(), "content_type": content_type}
    if status:
        b["status"] = status
    return b


def nested(levels):
    """A chat reply whose deepest path nests `levels` containers (the reply
    object itself is level 1) and which carries usage."""
    deep = "[" * (levels - 1) + "]" * (levels - 1)
    return ('{"id":"x","choices":[],"usage":%s,"deep":%s}'
            % (compact(USAGE), deep)).encode()


def depth(v):
    if isinstance(v, dict):
        return 1 + max([depth(x) for x in v.values()] + [0])
    if isinstance(v, list):
        return 1 + max([depth(x) for x in v] + [0])
    return 0


class Slow:
    """A call pipelined on the same Python client, answered ~0.6 s later."""

    def __init__(self, client, up):
        self.res = self.exc = None
        self.t = threading.Thread(target=self._run, args=(client,), daemon=True)
        self.t.start()
        up.wait_stats(lambda s: s["in_progress"] >= 1, timeout=5)

    def _run(self, client):
        try:
            self.res = client.call("chat", chat("slow", mock={"delay_ms": 600, "content": "late"}))
        except Exception as e:  # checked by result()
            self.exc = e

    def result(self):
        self.t.join(10)
        assert not self.t.is_alive()
        if self.exc:
            raise self.exc
        return self.res


def assert_no_key(sc, data):
    """The key is in neither what the client received nor the sidecar's
    log (at debug level)."""
    assert KEY.encode() not in data
    assert KEY not in sc.logs()


# ------------------------------------------------------------ invalid UTF-8
def test_hostile__invalid_utf8_in_a_stream_event_arrives_repaired(sc, up):
    c = sc.connect()
    body = sse('{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}',
               b"not json \xff\xfe and \xe2\x82 cut", finish_event())
    msgid = c.request_async("call", {"capability": "chat", "stream": True,
                                     "body": chat(mock=raw(body, "text/event-stream"))})
    chunks = []
    while True:
        msg = c.recv_msg(10)            # raw=False: invalid UTF-8 would raise here
        assert msg is not None, "connection closed"
        if msg[0] == 2:
            chunks.append(msg[2][1])
        elif msg[1] == msgid:
            break
    assert msg[2] is None, msg[2]
    assert chunks[1] == {"data": "not json \ufffd\ufffd and \ufffd cut"}
    assert msg[3]["usage"] == USAGE
    err, res = c.request("ping")
    assert err is None


def test_hostile__python_client_survives_invalid_utf8_with_a_call_pipelined(client, up):
    slow = Slow(client, up)
    body = sse(b"\xff\xfe\xfd", finish_event())
    events = list(client.call("chat", chat(mock=raw(body, "text/event-stream")), stream=True))
    assert events[0] == {"data": "\ufffd\ufffd\ufffd"}
    assert slow.result()["body"]["choices"][0]["message"]["content"] == "late"


@pytest.mark.parametrize("status", [400, 401])
def test_hostile__invalid_utf8_in_an_error_body(sc, up, status):
    c = sc.connect()
    err, _, _ = call(c, "chat", chat(mock=raw(b"denied \xc0\xaf by \xff proxy", "text/plain",
                                             status)))
    assert err["code"] == "upstream_rejected" and err["status"] == status
    assert err["upstream_body"] == "denied \ufffd\ufffd by \ufffd proxy"
    # Not JSON either: invalid bytes inside a JSON string make it text.
    err, _, _ = call(c, "chat", chat(mock=raw(b'{"error":{"message":"bad \xff"}}', status=status)))
    assert err["upstream_body"] == '{"error":{"message":"bad \ufffd"}}'


def test_hostile__long_error_body_is_cut_on_a_character(sc, up):
    c = sc.connect()
    body = b"x" + "é".encode() * 3000        # 6001 bytes; byte 4096 is inside an "é"
    err, _, _ = call(c, "chat", chat(mock=raw(body, "text/plain", 403)))
    ub = err["upstream_body"]
    assert ub == "x" + "é" * 2047 and len(ub.encode()) == 4095


# ------------------------------------------------------------ echoed keys
def test_hostile__401_echoing_the_key_is_redacted(sc, up):
    c = sc.connect()
    tap = Tap(c)
    err, _, _ = call(c, "chat", chat(mock={"status": 401,
                                           "error_message": "invalid key: {{authorization}}"}))
    assert err["code"] == "upstream_rejected" and err["status"] == 401
    assert err["upstream_body"]["error"]["message"] == "invalid key: Bearer " + MARKER
    # The mock really was sent the key (and echoed it).
    assert up.last()["authorization"] == "Bearer " + KEY
    # Not JSON: the same, as text.
    err, _, _ = call(c, "chat", chat(mock=raw(b"key {{authorization}} refused", "text/plain",
                                             401)))
    assert err["upstream_body"] == "key Bearer %s refused" % MARKER
    assert_no_key(sc, bytes(tap.seen))


def test_hostile__key_echoed_in_a_200_reply_and_stream_is_redacted(sc, up):
    c = sc.connect()
    tap = Tap(c)
    reply = ('{"choices":[{"index":0,"message":{"role":"assistant","content":'
             '"you sent {{authorization}}"},"finish_reason":"stop"}],'
             '"{{authorization}}":1,"usage":%s}' % compact(USAGE)).encode()
    err, res, _ = call(c, "chat", chat(mock=raw(reply)))
    assert err is None, err
    assert res["body"]["choices"][0]["message"]["content"] == "you sent Bearer " + MARKER
    assert res["body"]["Bearer " + MARKER] == 1
    assert res["usage"] == USAGE

    body = sse('{"choices":[{"index":0,"delta":{"content":"{{authorization}}"},'
               '"finish_reason":null}]}', "raw {{authorization}}", finish_event())
    msgid = c.request_async("call", {"capability": "chat", "stream": True,
                                     "body": chat(mock=raw(body, "text/event-stream"))})
    chunks = []
    while True:
        msg = c.recv_msg(10)
        if msg[0] == 2:
            chunks.append(msg[2][1])
        elif msg[1] == msgid:
            break
    assert msg[2] is None
    assert chunks[0]["choices"][0]["delta"]["content"] == "Bearer " + MARKER
    assert chunks[1] == {"data": "raw Bearer " + MARKER}

    # A non-JSON 200 reply echoing the key: the error's detail quotes the
    # reply's start, scrubbed.
    for body, near in ((b"{{authorization}} is not JSON", "'Bearer'"),
                       (b'{"a": ' + KEY.encode() + b"}", "'%s'" % MARKER)):
        err, _, _ = call(c, "chat", chat(mock=raw(body)))
        assert err["code"] == "retry_exhausted"
        detail = err["sources"][0]["detail"]
        assert detail.startswith("reply is not JSON") and detail.endswith(near), detail
    assert_no_key(sc, bytes(tap.seen))


# ------------------------------------------------------------ nesting depth
def test_hostile__too_deep_reply_is_a_typed_error_and_the_connection_survives(client, up):
    slow = Slow(client, up)
    with pytest.raises(polygw.PolygwError) as ei:
        client.call("chat", chat(mock=raw(nested(40))))
    e = ei.value
    assert e.code == "retry_exhausted", e
    assert e.sources[0]["reason"] == "bad_response"
    assert "nests deeper than the 30 levels" in e.sources[0]["detail"]
    assert slow.result()["body"]["choices"][0]["message"]["content"] == "late"
    assert client.ping()["version"]


def test_hostile__deepest_allowed_reply_is_delivered_with_its_usage(client, up):
    slow = Slow(client, up)
    res = client.call("chat", chat(mock=raw(nested(30))))
    assert depth(res["body"]) == 30          # 32 inside [1, id, nil, {body: ...}]
    assert res["usage"] == USAGE             # read back by the sidecar too
    assert slow.result()["body"]["choices"][0]["message"]["content"] == "late"
    # One level more is refused, not sent as a frame the client must reject.
    with pytest.raises(polygw.PolygwError) as ei:
        client.call("chat", chat(mock=raw(nested(31))))
    assert ei.value.sources[0]["reason"] == "bad_response"
    assert client.ping()["version"]


def test_hostile__too_deep_stream_event(client, up):
    slow = Slow(client, up)
    ok_event = '{"choices":[],"deep":%s}' % ("[" * 29 + "]" * 29)     # 30 levels
    deep_event = '{"choices":[],"deep":%s}' % ("[" * 39 + "]" * 39)   # 40 levels
    stream = client.call("chat", chat(mock=raw(sse(ok_event, finish_event()),
                                               "text/event-stream")), stream=True)
    events = list(stream)
    assert depth(events[0]) == 30 and stream.result["usage"] == USAGE
    # Deep first event: nothing relayed yet, so an ordinary failed attempt.
    with pytest.raises(polygw.PolygwError) as ei:
        list(client.call("chat", chat(mock=raw(sse(deep_event, finish_event()),
                                                "text/event-stream")), stream=True))
    assert ei.value.code == "retry_exhausted"
    assert "stream event nests deeper" in ei.value.sources[0]["detail"]
    # After a relayed event: the stream is interrupted, never replayed.
    got = []
    with pytest.raises(polygw.PolygwError) as ei:
        for ev in client.call("chat", chat(mock=raw(sse(ok_event, deep_event, finish_event()),
                                                    "text/event-stream")), stream=True):
            got.append(ev)
    assert ei.value.code == "stream_interrupted" and len(got) == 1
    assert slow.result()["body"]["choices"][0]["message"]["content"] == "late"


# ------------------------------------------------------------ after [DONE]
AFTER_DONE = {
    "garbage": b"data: this is not json\n\n",
    "error": b'data: {"error":{"message":"late","type":"server_error"}}\n\n',
}


def stream_msgpack(c, body):
    """A streamed chat call over msgpack: (chunks, error)."""
    msgid = c.request_async("call", {"capability": "chat", "stream": True, "body": body})
    chunks = []
    while True:
        msg = c.recv_msg(10)
        assert msg is not None, "connection closed"
        if msg[0] == 2:
            chunks.append(msg[2][1])
        elif msg[1] == msgid:
            return chunks, msg[2]


@pytest.mark.parametrize("tail", sorted(AFTER_DONE), ids=sorted(AFTER_DONE))
def test_hostile__garbage_after_done_ends_typed(sc, up, tail):
    """Nothing may follow a Chat Completions stream's [DONE]: an event that
    is not JSON, or that reports an error, after it means the stream went
    wrong, so the call ends stream_interrupted rather than as a success,
    and nothing after [DONE] is relayed."""
    body = sse('{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}',
               finish_event()) + AFTER_DONE[tail]
    c = sc.connect()
    chunks, err = stream_msgpack(c, chat(mock=raw(body, "text/event-stream")))
    assert err is not None and err["code"] == "stream_interrupted", (err, chunks)
    assert "terminal event" in err["message"], err
    assert len(chunks) == 2 and all("choices" in ch for ch in chunks), chunks
    # The connection survives: the next call on it is answered.
    err, res, _ = call(c, "chat", chat("again"))
    assert err is None and res["body"]["choices"][0]["message"]["content"] == "again", err


def test_hostile__well_formed_chunk_after_done_is_dropped(sc, up):
    body = sse('{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}',
               finish_event())
    body += b'data: {"choices":[{"index":0,"delta":{"content":"MORE"},"finish_reason":null}]}\n\n'
    chunks, err = stream_msgpack(sc.connect(), chat(mock=raw(body, "text/event-stream")))
    assert err is None, err
    assert "MORE" not in json.dumps(chunks), chunks
    assert len(chunks) == 2, chunks


@pytest.mark.parametrize("tail", sorted(AFTER_DONE), ids=sorted(AFTER_DONE))
def test_hostile__garbage_after_done_over_http_ends_with_the_error_event(make_sidecar, up, tail):
    """The same over the HTTP front (curl): the client's stream ends with
    the stream_interrupted error event, never with [DONE]."""
    from test_providers import curl, http_front, source
    sc, base = http_front(make_sidecar, source("a", up.url))
    body = sse('{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}')
    status, text = curl(base + "/v1/chat/completions",
                        chat(stream=True, mock=raw(body + AFTER_DONE[tail], "text/event-stream")))
    assert status == 200, text
    assert "[DONE]" not in text and "not json" not in text and "late" not in text, text
    last = text.strip().split("\n\n")[-1]
    assert last.startswith("event: error\ndata: "), text
    assert json.loads(last.split("data: ", 1)[1])["error"]["code"] == "stream_interrupted", text

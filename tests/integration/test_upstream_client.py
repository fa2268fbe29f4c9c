"""What any HTTP client that carries polygw's upstream attempts must do, run
once per `server.upstream_client` setting (`auto`: polygw's own client where
it applies, `libcurl`): connection reuse, every response framing, interim
answers, malformed and hostile replies, the attempt's deadlines, a client
that goes away, and the request as it reaches the upstream.

The assertions are on typed outcomes (the error `code`, the per-source
`reason`, the HTTP status, the content the app receives, what the mock
upstream counted), never on a client's wording, so both settings meet the
same ones. Each test owns a fresh sidecar and a fresh mock upstream
(tests/mock_upstream, scripted per call); only 127.0.0.1 is used; every wait
is bounded.
"""
import json
import os
import socket
import sys
import threading
import time
import urllib.parse

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import Pending, call, chat, config_yaml, source_yaml  # noqa: E402

CLIENTS = ("auto", "libcurl")
KEY_ENV = "POLYGW_TEST_UPCLIENT_KEY"
KEY = "sk-upclient-test-0123456789"
# One attempt per call: every outcome below is the attempt's own.
DEFAULTS = {"max_attempts": 1, "stall_window_s": 30, "backoff_base_s": 0.05,
            "backoff_max_s": 0.1}
# Deadlines short enough that a client which waits instead of failing ends
# the test within seconds, long enough never to fire on a healthy answer.
SOURCE = {"api_key_env": KEY_ENV, "timeout_s": 6, "connect_timeout_s": 2,
          "ttft_timeout_s": 3, "idle_timeout_s": 3, "max_concurrency": 64,
          "aimd": {"initial": 64}, "breaker": {"failures": 100000}}
# A failure the upstream caused by closing or misframing is seen at once,
# not at a deadline.
PROMPT_S = 1.5
EARLY = 0.05
LATE = 0.25
# Which reasons mean "the answer could not be read as HTTP".
MALFORMED = ("bad_response", "connection_reset")


def start(make_sidecar, client, base_url, **source_kw):
    """A sidecar with one chat source at `base_url`, carried by `client`."""
    cfg = config_yaml([source_yaml("a", "chat", base_url, SOURCE, **source_kw)], DEFAULTS)
    cfg = cfg.replace("server:\n", "server:\n  upstream_client: %s\n" % client, 1)
    assert "upstream_client: " + client in cfg
    return make_sidecar(config_text=cfg, env={KEY_ENV: KEY, "no_proxy": "*", "NO_PROXY": "*"})


@pytest.fixture(params=CLIENTS)
def client(request):
    return request.param


@pytest.fixture
def sc(make_sidecar, client, up):
    return start(make_sidecar, client, up.url)


def content(res):
    return res["body"]["choices"][0]["message"]["content"]


def reason(err):
    return err["sources"][0]["reason"]


def ok(c, text, mock=None, **kw):
    """A call that must succeed with `text` echoed in one attempt; its result."""
    err, res, _ = call(c, "chat", chat(text, mock=mock), **kw)
    assert err is None, err
    assert content(res) == text and res["attempts"] == 1, res
    return res


def failed(c, mock, reasons, within=PROMPT_S, **kw):
    """A call that must fail in one attempt with a reason in `reasons`,
    within `within` seconds; its error."""
    err, res, elapsed = call(c, "chat", chat("x", mock=mock), timeout=10, **kw)
    assert res is None and err["code"] == "retry_exhausted", err
    assert err["attempts"] == 1 and reason(err) in reasons, err
    assert elapsed < within, "failed after %.3fs: %r" % (elapsed, err)
    return err


def call_stream(c, body, timeout=10.0):
    """A streaming call: (error, result, [chunk, ...])."""
    msgid = c.request_async("call", {"capability": "chat", "body": body, "stream": True})
    chunks = []
    deadline = time.monotonic() + timeout
    while True:
        msg = c.recv_msg(max(0.001, deadline - time.monotonic()))
        assert msg is not None, "connection closed during the stream"
        if msg[0] == 2 and msg[1] == "chunk" and msg[2][0] == msgid:
            chunks.append(msg[2][1])
        elif msg[0] == 1 and msg[1] == msgid:
            return msg[2], msg[3], chunks


def streamed_text(chunks):
    return "".join(ch["choices"][0]["delta"].get("content", "")
                   for ch in chunks if ch.get("choices"))


def reply_json(text, n=1):
    """A complete chat completion answer carrying `text`, as bytes."""
    return json.dumps({"id": "chatcmpl-raw-%d" % n, "object": "chat.completion", "created": 1,
                       "model": "m", "choices": [{"index": 0, "message": {
                           "role": "assistant", "content": text}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                 "total_tokens": 2}}, separators=(",", ":")).encode()


def response(body, status_line=b"HTTP/1.1 200 OK", headers=None, length=True):
    """A whole HTTP response as bytes: `headers` (a list of raw lines, bytes)
    follow Content-Type, then Content-Length when `length`."""
    lines = [status_line, b"Content-Type: application/json"] + list(headers or [])
    if length:
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def chunked(body, sizes=(5, 300)):
    """`body` in chunks of `sizes` (the last one repeated), terminated."""
    out, i, k = b"", 0, 0
    while i < len(body):
        n = sizes[min(k, len(sizes) - 1)]
        out += b"%x\r\n" % len(body[i:i + n]) + body[i:i + n] + b"\r\n"
        i, k = i + n, k + 1
    return out + b"0\r\n\r\n"


def raw(data, keep=False, **extra):
    """A mock behaviour sending `data` (the whole response) verbatim."""
    b = {"raw_hex": data.hex()}
    if keep:
        b["raw_keep"] = True
    b.update(extra)
    return b


# Long enough to span many reads and chunks; multi-byte characters included,
# so that a cut or a misjoined chunk shows as a wrong or invalid string.
TEXT = "".join("line %04d: h\u00e9llo w\u00f6rld \u2713 \U0001f600 | " % i for i in range(1500))


# ------------------------------------------------------------ keep-alive reuse
def test_upstream_client__sequential_calls_share_one_connection(sc, up):
    c = sc.connect()
    for i in range(20):
        ok(c, "call %d" % i)
    st = up.stats()
    assert st["requests"] == 20 and st["accepted_connections"] == 1, st
    assert st["open_connections"] == 1


def test_upstream_client__concurrent_calls_then_more_reuse_the_pool(sc, up):
    """8 calls at once need 8 connections; 20 more after them need none."""
    calls = [Pending(sc, "chat", chat("c%d" % i, mock={"delay_ms": 300})) for i in range(8)]
    try:
        up.wait_stats(lambda s: s["in_progress"] == 8, timeout=5)
        for i, p in enumerate(calls):
            err, res = p.wait(5)
            assert err is None and content(res) == "c%d" % i, err
    finally:
        for p in calls:
            p.close()
    assert up.stats()["accepted_connections"] == 8
    c = sc.connect()
    for i in range(20):
        ok(c, "after %d" % i)
    st = up.stats()
    assert st["requests"] == 28 and st["accepted_connections"] == 8, st


def test_upstream_client__idle_connection_closed_by_the_upstream(sc, up):
    """The upstream drops its idle keep-alive connections between calls: the
    next call still succeeds in one attempt, as one request upstream."""
    c = sc.connect()
    ok(c, "first")
    for i in range(3):
        up.reset(drop_connections=True)
        up.wait_stats(lambda s: s["open_connections"] == 0)
        ok(c, "after drop %d" % i)
        st = up.stats()
        assert st["requests"] == 1 and st["accepted_connections"] == 1, st


def test_upstream_client__reused_connection_closed_before_any_answer_byte(sc, up):
    """A pooled connection the upstream closes after reading the request,
    before any answer byte: the client may send the request once more on a
    fresh connection (nothing was received, so nothing is replayed to the
    app), but never more than once, never when the connection was fresh,
    and never after an answer byte."""
    c = sc.connect()
    ok(c, "warm")
    up.reset()          # counts from here; the warm connection stays open
    close_unanswered = {"hang": "before_headers", "hang_ms": 1}
    up.script([close_unanswered])
    err, res, _ = call(c, "chat", chat("retried"), timeout=10)
    st = up.stats()
    if err is None:     # resent on a fresh connection, one attempt for the app
        assert content(res) == "retried" and res["attempts"] == 1
        assert st["requests"] == 2 and st["accepted_connections"] == 1, st
    else:
        assert err["code"] == "retry_exhausted" and reason(err) == "connection_reset", err
        assert st["requests"] == 1, st
    # The same on a fresh connection, or twice in a row: the call fails.
    up.reset(drop_connections=True)
    up.wait_stats(lambda s: s["open_connections"] == 0)
    up.script([close_unanswered, close_unanswered, close_unanswered])
    err, res, _ = call(c, "chat", chat("never"), timeout=10)
    assert res is None and reason(err) == "connection_reset", err
    assert up.stats()["requests"] == 1
    up.script([])
    ok(c, "warm again")
    up.reset()
    up.script([close_unanswered, close_unanswered, close_unanswered])
    err, res, _ = call(c, "chat", chat("never"), timeout=10)
    assert res is None and reason(err) == "connection_reset", err
    assert up.stats()["requests"] <= 2
    # Once an answer byte came, never: the upstream may have acted on it.
    up.script([])
    ok(c, "warm once more")
    up.reset()
    up.script([{"hang": "after_headers", "hang_ms": 1}])
    err, res, _ = call(c, "chat", chat("cut"), timeout=10)
    assert res is None and reason(err) in ("truncated", "connection_reset"), err
    assert up.stats()["requests"] == 1


def test_upstream_client__connection_close_in_a_200_answer(sc, up):
    c = sc.connect()
    ok(c, "one")
    ok(c, "closing", mock={"connection_close": True})
    assert up.stats()["accepted_connections"] == 1           # the pooled one carried it
    up.wait_stats(lambda s: s["open_connections"] == 0)
    ok(c, "three")
    st = up.stats()
    assert st["accepted_connections"] == 2 and st["requests"] == 3, st


def test_upstream_client__extra_bytes_after_a_complete_answer(sc, up):
    """A second, unasked-for response right behind the answer on the same
    connection: the call gets the first one, and that connection is never
    used again (the stray bytes would answer the next request)."""
    c = sc.connect()
    stray = response(reply_json("STRAY", 2))
    up.script([raw(response(reply_json("first")) + stray, keep=True)])
    ok(c, "first")
    ok(c, "second")
    st = up.stats()
    assert st["requests"] == 2 and st["accepted_connections"] == 2, st


# libcurl 7.88 (Debian 12) hands out a pooled connection that has unread
# bytes waiting as if it were clean (curl 8.x counts such a connection as
# dead), so the stray response answers the next request. The own client
# (`auto` here) drops an idle connection the moment it turns readable.
STRAY_REUSED = pytest.mark.xfail(strict=True, reason="libcurl 7.88 reuses a pooled connection "
                                 "with unread input")


@pytest.mark.parametrize("client", [pytest.param(cl, marks=STRAY_REUSED) if cl == "libcurl"
                                    else cl for cl in CLIENTS])
def test_upstream_client__stray_answer_on_an_idle_pooled_connection(sc, up, client):
    """The stray response arrives later, while the connection waits idle in
    the pool: it must never be taken as the answer to the next request."""
    c = sc.connect()
    body = reply_json("first")
    stray = response(reply_json("STRAY", 2))
    # The answer's body at once, the stray bytes 200 ms later.
    up.script([raw(response(body) + stray, keep=True, trickle_ms=200, trickle_bytes=len(body))])
    ok(c, "first")
    up.wait_stats(lambda s: s["in_progress"] == 0)     # every stray byte sent
    ok(c, "second")


def test_upstream_client__reused_connection_dying_long_after_the_request_is_not_resent(
        make_sidecar, up):
    """The server took the request on a kept-alive connection, worked on it
    for longer than a reuse race could explain, then closed without an
    answer: the request may have been acted on (an LLM call is not
    idempotent), so it is not sent again. The own client resends only within
    H1_STALE_RETRY_S (1 s) of sending; libcurl 7.88 resends whenever nothing
    came back, hence `auto` only."""
    c = start(make_sidecar, "auto", up.url).connect()
    ok(c, "warm")
    up.reset()          # counts from here; the warm connection stays open
    up.script([{"hang": "before_headers", "hang_ms": 1300}])
    err, res, elapsed = call(c, "chat", chat("worked on"), timeout=10)
    assert res is None and reason(err) == "connection_reset", err
    assert 1.2 <= elapsed < 1.3 + PROMPT_S, elapsed
    st = up.stats()
    assert st["requests"] == 1 and st["accepted_connections"] == 0, st
    ok(c, "after")


@pytest.mark.parametrize("client", [pytest.param(cl, marks=STRAY_REUSED) if cl == "libcurl"
                                    else cl for cl in CLIENTS])
@pytest.mark.parametrize("size", [4096, 16384, 32768])
def test_upstream_client__bytes_after_an_answer_ending_on_a_read_boundary(sc, up, size):
    """An answer of exactly `size` bytes (the own client reads 16 KiB at a
    time) with a second, bogus answer right behind it in the same write: the
    call gets its own answer, and the bogus one is never taken as the next
    call's (that connection is not reused)."""
    c = sc.connect()
    ok(c, "warm")
    filler = "f" * (size - len(response(reply_json(""))))
    while len(response(reply_json(filler))) > size:   # Content-Length's digits
        filler = filler[:-1]
    answer = response(reply_json(filler))
    assert len(answer) == size
    up.script([raw(answer + response(reply_json("STRAY", 2)), keep=True)])
    ok(c, filler)
    for i in range(3):
        ok(c, "own answer %d" % i)


class EarlyAnswerUpstream:
    """An upstream of raw sockets that answers its first connection's request
    with `early` as soon as the head is in, reads nothing more from it (so
    the client cannot finish sending a body larger than the buffers), and
    answers every later connection's requests normally. The client is right
    to close the first connection: reused, a request written on it would
    land in the middle of the unread body."""

    def __init__(self, early):
        self.early = early
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # inherited
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(8)
        self.url = "http://127.0.0.1:%d/v1" % self.ls.getsockname()[1]
        self.accepted = 0
        self.held = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                s, _ = self.ls.accept()
            except OSError:
                return
            self.accepted += 1
            if self.accepted == 1:
                self.held.append(s)
                threading.Thread(target=self._answer_early, args=(s,), daemon=True).start()
            else:
                threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    @staticmethod
    def _head(s, buf):
        while b"\r\n\r\n" not in buf:
            data = s.recv(65536)
            if not data:
                return None, buf
            buf += data
        head, _, rest = buf.partition(b"\r\n\r\n")
        return head, rest

    def _answer_early(self, s):
        head, _ = self._head(s, b"")
        if head is not None:
            s.sendall(self.early)

    def _serve(self, s):
        buf = b""
        with s:
            while True:
                head, buf = self._head(s, buf)
                if head is None:
                    return
                length = [int(ln.split(b":", 1)[1]) for ln in head.split(b"\r\n")
                          if ln.lower().startswith(b"content-length:")][0]
                while len(buf) < length:
                    data = s.recv(1 << 20)
                    if not data:
                        return
                    buf += data
                buf = buf[length:]
                s.sendall(response(reply_json("served")))

    def close(self):
        self.ls.close()
        for s in self.held:
            s.close()


@pytest.mark.timing
def test_upstream_client__early_answer_cuts_the_send_and_the_connection(make_sidecar, client):
    """The upstream refuses the request (400) before reading its body: the
    call fails with that status, the client stops sending, and the next call
    goes on a new connection. The own client once pooled the connection with
    its request half written, and the next call's request went after it:
    that call waited for its deadline."""
    with open("/proc/sys/net/ipv4/tcp_wmem") as f:
        send_buffer_max = int(f.read().split()[2])
    upstream = EarlyAnswerUpstream(response(b'{"error":{"message":"no"}}',
                                            b"HTTP/1.1 400 Bad Request"))
    try:
        c = start(make_sidecar, client, upstream.url).connect()
        big = "b" * (send_buffer_max + (2 << 20))     # more than the buffers take
        err, res, elapsed = call(c, "chat", chat(big), timeout=10)
        assert res is None and err["code"] == "upstream_rejected" and err["status"] == 400, err
        assert elapsed < PROMPT_S
        err, res, elapsed = call(c, "chat", chat("after"), timeout=10)
        assert err is None and content(res) == "served", err
        assert elapsed < PROMPT_S
        assert upstream.accepted == 2
    finally:
        upstream.close()


def test_upstream_client__interim_answer_then_close_fails_at_once(sc, up):
    """100 Continue, then the connection closes: a typed failure at once (an
    own-client build once read the closed socket in a loop until the idle
    deadline), and the next call is served."""
    c = sc.connect()
    failed(c, raw(b"HTTP/1.1 100 Continue\r\n\r\n"), MALFORMED)
    failed(c, raw(b"HTTP/1.1 100 Continue\r\nConnection: close\r\n\r\n"), MALFORMED)
    failed(c, raw(b"HTTP/1.0 100 Continue\r\n\r\n"), MALFORMED)
    ok(c, "next")


# ------------------------------------------------------------ framings
FRAMINGS = [
    ("content_length", {}),
    ("chunked", {"chunked": True}),
    ("close_delimited", {"no_length": True}),
    ("chunked_trickled", {"chunked": True, "trickle_ms": 1, "trickle_bytes": 1500}),
]


@pytest.mark.parametrize("framing", FRAMINGS, ids=[f[0] for f in FRAMINGS])
def test_upstream_client__plain_answer_framings_arrive_intact(sc, up, framing):
    c = sc.connect()
    ok(c, TEXT, mock=framing[1])
    ok(c, "short", mock=framing[1])
    assert up.stats()["requests"] == 2


@pytest.mark.parametrize("framing", [("chunked", {}), ("close_delimited", {"no_length": True})],
                         ids=["chunked", "close_delimited"])
def test_upstream_client__stream_framings_arrive_intact(sc, up, framing):
    c = sc.connect()
    mock = dict(framing[1], stream_events=40, stream_interval_ms=2)
    err, res, chunks = call_stream(c, chat(TEXT, mock=mock))
    assert err is None, err
    assert len(chunks) >= 40 and streamed_text(chunks) == TEXT
    assert res["attempts"] == 1 and res["usage"]["completion_tokens"] > 0


def test_upstream_client__answer_trickled_byte_by_byte_head_included(sc, up):
    c = sc.connect()
    slow = {"trickle_ms": 1, "trickle_bytes": 1, "trickle_headers": True}
    ok(c, "every byte alone", mock=slow)
    err, res, chunks = call_stream(c, chat("one by one", mock=dict(slow, stream_events=2)))
    assert err is None and streamed_text(chunks) == "one by one", err
    # A raw answer cut into single bytes, status line first.
    up.script([raw(response(reply_json("raw bytes")), keep=True, **slow)])
    ok(c, "raw bytes")


# ------------------------------------------------------------ interim answers
@pytest.mark.parametrize("interim", [[100], [103], [100, 103, 103]], ids=str)
def test_upstream_client__interim_answers_before_the_final_one(sc, up, interim):
    c = sc.connect()
    ok(c, "after interim", mock={"interim": interim})
    err, res, chunks = call_stream(c, chat("streamed", mock={"interim": interim}))
    assert err is None and streamed_text(chunks) == "streamed", err
    # The final status is the one that counts.
    err, res, _ = call(c, "chat", chat(mock={"interim": interim, "status": 400}))
    assert err["code"] == "upstream_rejected" and err["status"] == 400, err
    err, res, _ = call(c, "chat", chat(mock={"interim": interim, "status": 503}))
    assert err["code"] == "retry_exhausted" and err["sources"][0]["status"] == 503, err
    ok(c, "and again")


def interim(head=b"", status=b"100 Continue"):
    """An interim answer's head: its status and the raw header lines `head`."""
    return b"HTTP/1.1 " + status + b"\r\n" + head + b"\r\n"


# A 1xx answer ends at its blank line whatever its header fields announce
# (RFC 9110 §15.2, RFC 9112 §6.3): the bytes after it are the next answer.
INTERIM_FRAMING_IGNORED = [
    ("content_length_with_no_body", interim(b"Content-Length: 5\r\n", b"103 Early Hints")),
    ("chunked", interim(b"Transfer-Encoding: chunked\r\n")),
    ("other_transfer_coding", interim(b"Transfer-Encoding: gzip\r\n")),
    ("unknown_1xx_with_a_length", interim(b"Content-Length: 3\r\n", b"199 Whatever")),
    ("two_interim_answers_with_lengths", interim(b"Content-Length: 9\r\n") +
     interim(b"Content-Length: 0\r\n")),
]
# ... so a body behind an interim answer is the start of an answer that is
# not HTTP, and so is an interim answer where a chunk size is due.
INTERIM_BODY_REFUSED = [
    ("content_length_body", interim(b"Content-Type: application/json\r\nContent-Length: %d\r\n"
                                    % len(reply_json("interim"))) + reply_json("interim") +
     response(b"")),
    ("chunked_body", interim(b"Transfer-Encoding: chunked\r\n") + chunked(reply_json("interim")) +
     response(b"")),
    ("interim_answer_amid_a_chunked_body",
     response(b"5\r\n{\"id\"\r\n" + interim(), length=False,
              headers=[b"Transfer-Encoding: chunked"])),
]


@pytest.mark.parametrize("case", INTERIM_FRAMING_IGNORED,
                         ids=[c[0] for c in INTERIM_FRAMING_IGNORED])
def test_upstream_client__interim_answer_framing_is_ignored(sc, up, case):
    c = sc.connect()
    up.script([raw(case[1] + response(reply_json("final")), keep=True)])
    ok(c, "final")
    ok(c, "next")


@pytest.mark.parametrize("case", INTERIM_BODY_REFUSED, ids=[c[0] for c in INTERIM_BODY_REFUSED])
def test_upstream_client__interim_answer_carries_no_body(sc, up, case):
    """The own client once took the interim answer's body as the final
    answer's: a 200 with the 100's content."""
    c = sc.connect()
    failed(c, raw(case[1]), MALFORMED)
    ok(c, "next")


@pytest.mark.parametrize("head", [b"", b"Upgrade: h2c\r\nConnection: Upgrade\r\n"],
                         ids=["bare", "upgrade"])
def test_upstream_client__switching_protocols_is_refused(sc, up, head):
    """101 to a request that asked for no upgrade: the attempt fails as that
    status, nothing behind it is taken as the answer, and (own client) at
    once although the upstream keeps the connection, which is not reused.
    The own client once skipped a 101 without Upgrade as an interim answer
    and took the 200 behind it."""
    c = sc.connect()
    behind = response(reply_json("after the switch"))
    for data in (interim(head, b"101 Switching Protocols") + behind,
                 interim() + interim(head, b"101 Switching Protocols") + behind):
        err = failed(c, raw(data), ("bad_response",))
        assert err["sources"][0]["status"] == 101, err
    ok(c, "next")


def test_upstream_client__switching_protocols_on_a_kept_connection(make_sidecar, up):
    """libcurl 7.88 reads a 101's connection as the other protocol until the
    idle deadline; the own client fails at once and closes it."""
    c = start(make_sidecar, "auto", up.url).connect()
    up.script([raw(interim(b"", b"101 Switching Protocols") + response(reply_json("x")),
                   keep=True)])
    err = failed(c, None, ("bad_response",))
    assert err["sources"][0]["status"] == 101, err
    ok(c, "next")
    assert up.stats()["accepted_connections"] == 2


def test_upstream_client__no_content_answer_has_no_body(sc, up):
    """204 ends at its blank line (RFC 9112 §6.3): the JSON behind it is not
    its body, so the empty reply is refused and the connection, with those
    bytes unread, is not reused by the own client. It once read the 204's
    Content-Length and took the JSON as a successful reply."""
    c = sc.connect()
    data = response(reply_json("no content"), b"HTTP/1.1 204 No Content")
    err = failed(c, raw(data, keep=True), ("bad_response",))
    assert err["sources"][0]["status"] == 204, err
    ok(c, "next")


# ------------------------------------------------------------ cut answers
def test_upstream_client__body_shorter_than_its_content_length(sc, up):
    c = sc.connect()
    failed(c, {"close_after_bytes": 40}, ("truncated",))
    failed(c, {"chunked": True, "close_after_bytes": 40}, ("truncated",))
    # A cut inside the head: the connection closes before the blank line.
    failed(c, raw(b"HTTP/1.1 200 OK\r\nContent-Type: appl"), MALFORMED + ("truncated",))
    ok(c, "whole")


# ------------------------------------------------------------ malformed answers
def padding(lines, size):
    return [b"X-Padding-%d: %s" % (i, b"p" * size) for i in range(lines)]


HOSTILE = [
    ("garbage_status_line", b"SSH-2.0-OpenSSH_9.2\r\n\r\n"),
    ("non_numeric_status", response(reply_json("x"), b"HTTP/1.1 2xx OK")),
    ("header_line_without_colon", response(reply_json("x"), headers=[b"this is no header"])),
    ("header_line_of_200kib", response(reply_json("x"), headers=padding(1, 200 * 1024))),
    ("header_block_of_1mib", response(reply_json("x"), headers=padding(128, 8192))),
    ("negative_content_length", response(reply_json("x"), headers=[b"Content-Length: -5"],
                                         length=False)),
    ("non_numeric_content_length", response(reply_json("x"), headers=[b"Content-Length: 12abc"],
                                            length=False)),
    ("invalid_chunk_size", response(b"zz\r\n" + reply_json("x") + b"\r\n0\r\n\r\n", length=False,
                                    headers=[b"Transfer-Encoding: chunked"])),
]
# Answers HTTP lets a client refuse or read, as long as what it reads is
# right: a header block over 64 KiB but within what common clients take
# (libcurl takes up to 300 KiB), and Content-Length beside chunked, where
# chunked decides the length (RFC 9112 §6.3) or the answer is refused.
TOLERATED = [
    ("header_block_of_65kib", response(reply_json("x"), headers=padding(13, 5120))),
    ("content_length_and_chunked", response(chunked(reply_json("x")), length=False, headers=[
        b"Content-Length: 10", b"Transfer-Encoding: chunked"])),
]


def with_a_call_in_flight(sc, up, check):
    """Runs check() while another call of the same sidecar is in flight, and
    asserts that call is served."""
    slow = Pending(sc, "chat", chat("slow", mock={"delay_ms": 400}))
    try:
        up.wait_stats(lambda s: s["in_progress"] == 1, timeout=5)
        check()
        err, res = slow.wait(5)
        assert err is None and content(res) == "slow", err
    finally:
        slow.close()


@pytest.mark.timing
@pytest.mark.parametrize("case", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_upstream_client__malformed_answer_is_a_typed_error(sc, up, case):
    """Refused at once as an answer that cannot be read, while a call in
    flight on the same sidecar is served; the next call succeeds."""
    c = sc.connect()
    with_a_call_in_flight(sc, up, lambda: failed(c, raw(case[1]), MALFORMED))
    ok(c, "next")


@pytest.mark.parametrize("case", TOLERATED, ids=[h[0] for h in TOLERATED])
def test_upstream_client__doubtful_answer_is_read_right_or_refused(sc, up, case):
    c = sc.connect()

    def check():
        err, res, elapsed = call(c, "chat", chat("x", mock=raw(case[1])), timeout=10)
        assert elapsed < PROMPT_S
        if err is None:
            assert content(res) == "x" and res["attempts"] == 1, res
        else:
            assert err["code"] == "retry_exhausted" and reason(err) in MALFORMED, err
    with_a_call_in_flight(sc, up, check)
    ok(c, "next")


def test_upstream_client__malformed_answer_on_a_kept_connection(sc, up):
    """The same refusal when the upstream keeps the connection open after its
    bad answer: the client does not wait for a deadline, nor reuse it."""
    c = sc.connect()
    for _, data in HOSTILE:
        up.script([raw(data, keep=True)])
        failed(c, None, MALFORMED)
    ok(c, "next")
    st = up.stats()
    assert st["accepted_connections"] == len(HOSTILE) + 1, st


# ------------------------------------------------------------ deadlines
def assert_at(what, elapsed, deadline):
    print("timing: %-24s elapsed %.3fs  deadline %.3fs" % (what, elapsed, deadline))
    assert deadline - EARLY <= elapsed <= deadline + LATE, \
        "%s: ended after %.3fs, deadline %.3fs" % (what, elapsed, deadline)


def test_upstream_client__connection_refused(make_sidecar, client):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                   # nobody listens there now
    c = start(make_sidecar, client, "http://127.0.0.1:%d/v1" % port).connect()
    failed(c, None, ("connect_failed",), within=0.5)


@pytest.mark.parametrize("case", [
    ("accepted_never_read", {"ttft_timeout_s": 0.5}, {"hang": "accept"}, "ttft_timeout"),
    ("read_never_answered", {"ttft_timeout_s": 0.5}, {"hang": "before_headers"},
     "ttft_timeout"),
    ("silent_after_headers", {"idle_timeout_s": 0.5}, {"hang": "after_headers"},
     "idle_timeout"),
    ("silent_mid_body", {"idle_timeout_s": 0.5},
     {"trickle_ms": 3000, "trickle_bytes": 30}, "idle_timeout"),
], ids=lambda c: c[0])
def test_upstream_client__silent_upstream_ends_at_its_deadline(make_sidecar, client, up, case):
    _, timeouts, behaviour, want = case
    c = start(make_sidecar, client, up.url, **timeouts).connect()
    up.script([behaviour])                       # from the queue: `accept` acts before reading
    t0 = time.monotonic()
    failed(c, None, (want,), within=5)
    assert_at(case[0], time.monotonic() - t0, 0.5)
    # The attempt's connection is closed, not left to the upstream.
    up.wait_stats(lambda s: s["open_connections"] == 0 and s["aborted_by_peer"] == 1)


def test_upstream_client__app_leaving_mid_stream_closes_the_upstream(sc, up):
    c = sc.connect()
    body = chat("abcdefghijklmnopqrstuvwxyz" * 4,
                mock={"stream_events": 100, "stream_interval_ms": 50})
    c.request_async("call", {"capability": "chat", "body": body, "stream": True})
    first = c.recv_msg(5)
    assert first[0] == 2 and first[1] == "chunk", first
    left_ms = time.time() * 1000
    c.close()
    st = up.wait_stats(lambda s: s["aborted_by_peer"] == 1 and s["open_connections"] == 0,
                       timeout=3)
    print("timing: app left -> upstream connection closed after %.1f ms"
          % (st["last_abort_at_ms"] - left_ms))
    assert st["last_abort_at_ms"] - left_ms < 1000, st
    # The sidecar is fine and the next call is served.
    ok(sc.connect(), "still here")


# ------------------------------------------------------------ the request itself
def test_upstream_client__request_is_well_formed(make_sidecar, client, up):
    base = up.base + "/openai/v1"
    sc = start(make_sidecar, client, base, query={"tenant": "t 1/\u00e9", "v": "2"},
               headers=[{"name": "X-Team", "value": "search"}])
    c = sc.connect()
    # Large enough that a client would ask `Expect: 100-continue` by default.
    sent = chat("Gr\u00fc\u00dfe \u2603 \"quoted\" \\ end \u2028", temperature=0.25,
                max_tokens=7, n=None, user="u" * 300000)
    err, res, _ = call(c, "chat", sent)
    assert err is None, err
    seen = up.last()
    assert seen["method"] == "POST"
    path, _, query = seen["target"].partition("?")
    assert path == "/openai/v1/chat/completions"
    assert urllib.parse.parse_qs(query, strict_parsing=True) == {"tenant": ["t 1/\u00e9"],
                                                                 "v": ["2"]}
    head = seen["head"]
    lines = head.split("\r\n")
    assert lines[0] == "POST %s HTTP/1.1" % seen["target"], lines[0]
    assert head.endswith("\r\n\r\n") and "\n" not in head.replace("\r\n", "")
    names = [ln.split(":", 1)[0].lower() for ln in lines[1:] if ln]
    assert len(names) == len(set(names)), "a header sent twice: %r" % names
    h = seen["headers"]
    assert h["host"] == "127.0.0.1:%d" % up.port
    assert h["content-type"] == "application/json"
    assert h["authorization"] == "Bearer " + KEY
    assert h["x-team"] == "search"
    assert "expect" not in h and "transfer-encoding" not in h
    assert int(h["content-length"]) == seen["body_bytes"] and not seen["body_truncated"]
    # The body is the app's msgpack as compact JSON, byte for byte, whichever
    # client carried it.
    wire = json.dumps(sent, ensure_ascii=False, separators=(",", ":")).encode()
    assert seen["body"].encode() == wire and seen["body_bytes"] == len(wire)
    assert seen["json"] == sent

"""The HTTP front end (sidecar/http/http.c, docs/HTTP.md) through the real
sidecar, the real mock upstream, curl (over TCP and --unix-socket) and raw
sockets: every endpoint, the status mapping of every error code, the
X-Polygw-* headers in and out, the task endpoints, health and readiness,
and bad HTTP input that must never disturb other clients.
"""
import http.client
import json
import os
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import chat, config_yaml, source_yaml  # noqa: E402

FAST = {"timeout_s": 10, "connect_timeout_s": 5, "ttft_timeout_s": 1, "idle_timeout_s": 5,
        "max_concurrency": 64, "aimd": {"initial": 64}, "breaker": {"failures": 1000}}
DEFAULTS = {"max_attempts": 2, "stall_window_s": 1, "backoff_base_s": 0.05, "backoff_max_s": 0.1}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http_section(**kw):
    return "\n".join(["http:"] + ["  %s: %s" % (k, json.dumps(v) if isinstance(v, str) else
                                                 ("true" if v is True else
                                                  "false" if v is False else v))
                                   for k, v in kw.items()]) + "\n"


class Front:
    """A sidecar with its HTTP front end on TCP and on a Unix socket."""

    def __init__(self, sc, port, hsock):
        self.sc = sc
        self.port = port
        self.hsock = hsock
        self.base = "http://127.0.0.1:%d" % port

    def curl(self, path, body=None, headers=(), unix=False, method=None, extra=(), timeout=15):
        """(status, headers (lower-case names), body text) of one curl request."""
        cmd = ["curl", "-s", "-i", "--max-time", str(timeout)]
        if unix:
            cmd += ["--unix-socket", self.hsock]
        for h in headers:
            cmd += ["-H", h]
        if body is not None:
            if not any(h.lower().startswith("content-type") for h in headers):
                cmd += ["-H", "Content-Type: application/json"]
            cmd += ["--data-binary", body if isinstance(body, (str, bytes)) else json.dumps(body)]
        if method:
            cmd += ["-X", method]
        cmd += list(extra)
        cmd.append(("http://polygw" if unix else self.base) + path)
        out = subprocess.run(cmd, capture_output=True, timeout=timeout + 5).stdout.decode()
        return parse_response(out)

    def conn(self, timeout=10):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def raw(self, timeout=10):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        return s


def parse_response(out):
    """Splits curl -i output; skips interim 1xx blocks."""
    while True:
        head, _, rest = out.partition("\r\n\r\n")
        lines = head.split("\r\n")
        status = int(lines[0].split()[1]) if lines and lines[0].startswith("HTTP/") else 0
        if 100 <= status < 200:
            out = rest
            continue
        hdrs = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        return status, hdrs, rest


_LEFTOVER = weakref.WeakKeyDictionary()  # socket -> bytes read past the last response


def read_response(s, timeout=10):
    """One full response from a raw socket: (status, headers, body bytes).
    Handles Content-Length and chunked bodies; bytes of the next response
    read with this one are kept for the next call."""
    s.settimeout(timeout)
    buf = _LEFTOVER.pop(s, b"")
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            raise EOFError("closed before headers: %r" % buf)
        buf += d
    head, _, buf = buf.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    if "content-length" in hdrs:
        n = int(hdrs["content-length"])
        while len(buf) < n:
            d = s.recv(65536)
            if not d:
                raise EOFError("short body")
            buf += d
        _LEFTOVER[s] = buf[n:]
        return status, hdrs, buf[:n]
    body = b""
    while True:
        while b"\r\n" not in buf:
            buf += s.recv(65536)
        size_line, _, buf = buf.partition(b"\r\n")
        size = int(size_line, 16)
        while len(buf) < size + 2:
            buf += s.recv(65536)
        body += buf[:size]
        buf = buf[size + 2:]
        if size == 0:
            _LEFTOVER[s] = buf
            return status, hdrs, body


def is_closed(s, timeout=3.0):
    """True when the peer closed `s` within `timeout`."""
    s.settimeout(timeout)
    try:
        while True:
            d = s.recv(65536)
            if not d:
                return True
    except (socket.timeout, TimeoutError):
        return False
    except ConnectionResetError:
        return True


@pytest.fixture
def front(make_sidecar, up, workdir):
    """Factory: front(sources=..., http=..., extra=more config text,
    **config kw) -> Front."""
    def factory(sources=None, http=None, defaults=None, preexec_fn=None, env=None, extra="",
                **kw):
        port = free_port()
        hsock = os.path.join(workdir, "http.sock")
        if sources is None:
            sources = [source_yaml("m1", "chat", up.url, FAST),
                       source_yaml("e1", "embedding", up.url, FAST, model="emb-1", serves=["*"])]
        h = {"socket": hsock, "listen": "127.0.0.1:%d" % port, "header_timeout_s": 2,
             "body_timeout_s": 2, "keepalive_timeout_s": 30}
        h.update(http or {})
        text = config_yaml(sources, defaults or DEFAULTS, **kw) + http_section(**h) + extra
        sc = make_sidecar(config_text=text, preexec_fn=preexec_fn, env=env)
        f = Front(sc, port, hsock)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.02)
        return f
    return factory


def assert_error(status, hdrs, body, want_status, code):
    assert status == want_status, (status, hdrs, body)
    assert hdrs.get("x-should-retry") == "false"
    assert hdrs.get("x-polygw-code") == code
    err = json.loads(body)["error"]
    assert err["code"] == code
    assert err["param"] is None
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str)
    assert isinstance(err["polygw"], dict)
    return err


# ------------------------------------------------------------ endpoints
@pytest.mark.parametrize("unix", [False, True])
def test_http__chat_over_tcp_and_unix(front, up, unix):
    f = front()
    status, hdrs, body = f.curl("/v1/chat/completions", chat("hello over http"), unix=unix)
    assert status == 200, body
    assert hdrs["content-type"] == "application/json"
    assert hdrs["x-polygw-source"] == "m1"
    assert hdrs["x-polygw-attempts"] == "1"
    assert float(hdrs["x-polygw-stalled-s"]) >= 0
    reply = json.loads(body)
    assert reply["choices"][0]["message"]["content"] == "hello over http"
    # The body went upstream as it came, byte for byte.
    assert up.last()["body"] == json.dumps(chat("hello over http"))


def test_http__body_goes_upstream_byte_for_byte(front, up):
    f = front()
    raw = '{"model": "m",  "messages":[{"role":"user","content":"x\\u00e9"}], "n": 1.50}'
    status, _, _ = f.curl("/v1/chat/completions", raw)
    assert status == 200
    assert up.last()["body"] == raw


def test_http__source_model_override_rewrites_model(front, up):
    f = front(sources=[source_yaml("m1", "chat", up.url, FAST, model="forced", serves=["*"])])
    status, _, body = f.curl("/v1/chat/completions", chat("x", model="asked"))
    assert status == 200
    assert up.last()["json"]["model"] == "forced"
    assert json.loads(body)["model"] == "forced"


def test_http__embeddings(front, up):
    f = front()
    status, hdrs, body = f.curl("/v1/embeddings", {"model": "e", "input": ["a", "b"]})
    assert status == 200, body
    assert hdrs["x-polygw-source"] == "e1"
    data = json.loads(body)["data"]
    assert len(data) == 2 and len(data[0]["embedding"]) == 8
    assert up.last()["json"]["model"] == "emb-1"


def test_http__custom_capability_path(front, up):
    f = front(sources=[source_yaml("o1", "summarize", up.url, FAST)],
              capabilities={"summarize": {"path": "/v2/ocr"}})
    status, hdrs, body = f.curl("/v1/v2/ocr", {"model": "m", "input": "page text"})
    assert status == 200, body
    assert hdrs["x-polygw-source"] == "o1"
    assert json.loads(body)["text"] == "page text"


def test_http__models_lists_the_sources_models(front, up):
    f = front(sources=[source_yaml("a", "chat", up.url, FAST, model="gpt-x"),
                       source_yaml("b", "chat", up.url, FAST, model="gpt-x"),
                       source_yaml("c", "embedding", up.url, FAST, model="emb-y"),
                       source_yaml("d", "chat", up.url, FAST)])
    status, _, body = f.curl("/v1/models")
    assert status == 200
    models = json.loads(body)
    assert models["object"] == "list"
    assert [(m["id"], m["owned_by"]) for m in models["data"]] == [("gpt-x", "a"), ("emb-y", "c")]


def test_http__stream_relays_events_as_they_arrive(front, up):
    f = front()
    s = f.raw()
    body = json.dumps(chat("one two three four", stream=True,
                           mock={"stream_events": 4, "stream_interval_ms": 300}))
    t0 = time.monotonic()
    s.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
    buf = b""
    while b"data: {" not in buf:
        d = s.recv(65536)
        assert d
        buf += d
    first = time.monotonic() - t0
    while b"data: [DONE]" not in buf:
        d = s.recv(65536)
        assert d
        buf += d
    total = time.monotonic() - t0
    # 4 content events + finish, 300 ms apart: the first one arrived long
    # before the upstream finished.
    assert first < 0.8 and total >= 1.1, (first, total)
    head = buf.split(b"\r\n\r\n", 1)[0].decode().lower()
    assert "content-type: text/event-stream" in head
    assert "transfer-encoding: chunked" in head
    assert "x-polygw-source: m1" in head
    s.close()


def test_http__stream_with_curl_ends_with_done(front, up):
    f = front()
    status, hdrs, body = f.curl("/v1/chat/completions", chat("a b", stream=True), unix=True)
    assert status == 200
    events = [line[6:] for line in body.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    deltas = "".join(json.loads(e)["choices"][0]["delta"].get("content", "")
                     for e in events[:-1] if json.loads(e)["choices"])
    assert deltas == "a b"


def test_http__stream_usage_chunk_only_for_a_client_that_asks(front, up):
    """An OpenAI-style upstream reports a stream's usage only when asked:
    polygw always asks, relays the usage-only chunk to a client whose body
    asked too (stream_options.include_usage), and hides it from one that
    did not."""
    f = front()
    mock = {"usage_if_asked": True, "usage": {"prompt_tokens": 40, "completion_tokens": 2}}

    def events(body):
        status, _, text = f.curl("/v1/chat/completions", body)
        assert status == 200, text
        return [json.loads(line[6:]) for line in text.split("\n")
                if line.startswith("data: ") and line != "data: [DONE]"]
    asked = events(chat("ab", stream=True, mock=mock, stream_options={"include_usage": True}))
    assert asked[-1]["choices"] == [] and asked[-1]["usage"]["total_tokens"] == 42, asked
    assert up.last()["json"]["stream_options"] == {"include_usage": True}
    quiet = events(chat("ab", stream=True, mock=mock))
    assert quiet and all(ev["choices"] for ev in quiet), quiet
    assert up.last()["json"]["stream_options"] == {"include_usage": True}


def test_http__healthz_and_readyz(front):
    f = front()
    assert f.curl("/healthz")[0] == 200
    status, _, body = f.curl("/readyz", unix=True)
    assert status == 200 and json.loads(body)["status"] == "ready"


def test_http__readyz_with_dead_redis_is_503(front, up):
    dead = free_port()
    f = front(backend={"kind": "redis", "url": "redis://127.0.0.1:%d/0" % dead})
    status, hdrs, body = f.curl("/readyz")
    assert status == 503
    ready = json.loads(body)
    assert ready["status"] == "not_ready" and ready["reason"] == "redis unreachable", ready
    assert set(ready) <= {"status", "reason", "detail"}, ready   # detail: Redis' own reason
    assert f.curl("/healthz")[0] == 200
    # Calls fail closed, with their own status.
    status, hdrs, body = f.curl("/v1/chat/completions", chat("x"))
    assert_error(status, hdrs, body, 503, "backend_unavailable")
    assert "retry-after" in hdrs
    # So do task requests, which go to Redis.
    status, hdrs, body = f.curl("/polygw/v1/tasks/t1/start", method="POST")
    assert_error(status, hdrs, body, 503, "backend_unavailable")


def test_http__metrics_count_http_calls(front, up, workdir):
    f = front()
    assert f.curl("/v1/chat/completions", chat("x"))[0] == 200
    assert f.curl("/v1/chat/completions", chat("x", mock={"status": 403}))[0] == 403
    status, hdrs, body = f.curl("/metrics", unix=True)
    assert status == 200
    assert hdrs["content-type"].startswith("text/plain; version=0.0.4")
    lines = [l for l in body.splitlines() if l.startswith("polygw_calls_total{")]
    assert any('code="ok"' in l and 'capability="chat"' in l and l.endswith(" 1") for l in lines), lines
    assert any('code="upstream_rejected"' in l and l.endswith(" 1") for l in lines), lines
    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "metrics"], input=body.encode(), capture_output=True,
                           timeout=20)
        assert r.returncode == 0, r.stdout + r.stderr


# ------------------------------------------------------- error mapping
def test_http__stalled_is_503_with_retry_after_and_scope(front, up):
    up.set_default({"status": 429, "retry_after": 0})
    f = front()
    status, hdrs, body = f.curl("/v1/chat/completions", chat("x"),
                                headers=["X-Polygw-Scope: team-a"])
    err = assert_error(status, hdrs, body, 503, "stalled")
    assert int(hdrs["retry-after"]) >= 1
    assert "team-a" in err["message"]
    assert err["polygw"]["attempts"] >= 1 and err["polygw"]["stalled_s"] > 1
    assert int(hdrs["x-polygw-attempts"]) == err["polygw"]["attempts"]


def test_http__retry_exhausted_is_503(front, up):
    up.set_default({"status": 500})
    f = front()
    status, hdrs, body = f.curl("/v1/embeddings", {"model": "e", "input": "a"})
    err = assert_error(status, hdrs, body, 503, "retry_exhausted")
    assert err["polygw"]["attempts"] == 2
    assert err["polygw"]["sources"][0]["name"] == "e1"
    assert up.stats()["requests"] == 2


def test_http__deadline_is_504(front, up):
    f = front()
    t0 = time.monotonic()
    status, hdrs, body = f.curl("/v1/chat/completions", chat("x", mock={"delay_ms": 3000}),
                                headers=["X-Polygw-Deadline: 0.5"])
    assert time.monotonic() - t0 < 2
    assert_error(status, hdrs, body, 504, "deadline_exceeded")
    assert "retry-after" not in hdrs


def test_http__bad_deadline_header_is_400(front, up):
    f = front()
    status, hdrs, body = f.curl("/v1/chat/completions", chat("x"), headers=["X-Polygw-Deadline: soon"])
    assert_error(status, hdrs, body, 400, "bad_request")
    assert up.stats()["requests"] == 0


def test_http__upstream_rejected_keeps_upstream_status_and_body(front, up):
    f = front()
    status, hdrs, body = f.curl("/v1/chat/completions",
                                chat("x", mock={"status": 403, "error_message": "no such model"}))
    assert status == 403
    assert hdrs["x-should-retry"] == "false"
    assert hdrs["x-polygw-code"] == "upstream_rejected"
    err = json.loads(body)["error"]
    assert err["message"] == "no such model" and err["type"] == "permission_error"


def test_http__invalid_json_is_400(front, up):
    f = front()
    for raw, what in (('{"model": ', "not valid JSON"), ("[1, 2]", "JSON object"),
                      ('{"stream": "yes"}', "boolean"), ('{"stream":false,"stream":true}', "one"),
                      (b'{"a":"\xff"}', "not valid JSON"), ('{"a":"\\u12"}', "not valid JSON"), ('{"a":1} x', "not valid JSON")):
        status, hdrs, body = f.curl("/v1/chat/completions", raw)
        err = assert_error(status, hdrs, body, 400, "bad_request")
        assert what in err["message"], err
    assert up.stats()["requests"] == 0


def test_http__wrong_content_type_is_415(front, up):
    f = front()
    status, hdrs, body = f.curl("/v1/chat/completions", json.dumps(chat("x")),
                                headers=["Content-Type: text/plain"])
    err = assert_error(status, hdrs, body, 415, "bad_request")
    assert "text/plain" in err["message"]


def test_http__unknown_capability_and_path_are_404(front, up):
    f = front()
    status, hdrs, body = f.curl("/v1/images/generations", {"prompt": "x"})
    assert_error(status, hdrs, body, 404, "unknown_capability")
    status, hdrs, body = f.curl("/nothing/here")
    assert_error(status, hdrs, body, 404, "unknown_method")
    status, hdrs, body = f.curl("/v1/chat/completions")  # GET on a POST endpoint
    assert status == 405
    # ocr has no source here: the capability exists but cannot serve.
    status, hdrs, body = f.curl("/v1/ocr", {"input": "x"})
    assert_error(status, hdrs, body, 404, "unknown_capability")


def test_http__too_large_is_413(front, up):
    f = front(http={"max_body_bytes": 4096})
    big = json.dumps(chat("x" * 5000))
    status, hdrs, body = f.curl("/v1/chat/completions", big)
    assert_error(status, hdrs, body, 413, "too_large")
    # A chunked body is counted as it arrives.
    status, hdrs, body = f.curl("/v1/chat/completions", big, headers=[
        "Content-Type: application/json", "Transfer-Encoding: chunked"])
    assert_error(status, hdrs, body, 413, "too_large")
    assert up.stats()["requests"] == 0
    assert f.curl("/healthz")[0] == 200


def test_http__task_stopped_and_watchdog_are_409(front, up):
    f = front()
    assert f.curl("/polygw/v1/tasks/job-1/start", method="POST")[0] == 200
    pending = {}

    def slow_call():
        pending["r"] = f.curl("/v1/chat/completions", chat("x", mock={"delay_ms": 5000}),
                              headers=["X-Polygw-Task: job-1"])
    t = threading.Thread(target=slow_call)
    t.start()
    up.wait_stats(lambda s: s["in_progress"] == 1, timeout=5)
    status, _, body = f.curl("/polygw/v1/tasks/job-1/stop", {"reason": "user pressed stop"})
    assert status == 200 and json.loads(body)["reason_kind"] == "stopped"
    t.join(5)
    err = assert_error(*pending["r"], 409, "task_stopped")
    assert err["polygw"]["reason"] == "user pressed stop"
    # The stopped call's upstream connection was closed at once.
    up.wait_stats(lambda s: s["aborted_by_peer"] == 1 and s["open_connections"] == 0, timeout=3)
    # A new call naming the task is refused the same way.
    assert_error(*f.curl("/v1/chat/completions", chat("x"), headers=["X-Polygw-Task: job-1"]),
                 409, "task_stopped")
    assert_error(*f.curl("/polygw/v1/tasks/job-1/guard", method="POST"), 409, "task_stopped")

    # Watchdog: a node that overruns fails the task.
    assert f.curl("/polygw/v1/tasks/job-2/start", method="POST")[0] == 200
    status, _, body = f.curl("/polygw/v1/tasks/job-2/node_begin",
                             {"node": "plan", "timeout_s": 0.2})
    assert status == 200, body
    time.sleep(0.5)
    err = assert_error(*f.curl("/v1/chat/completions", chat("x"),
                               headers=["X-Polygw-Task: job-2"]), 409, "watchdog_timeout")
    status, _, body = f.curl("/polygw/v1/tasks/job-2")
    assert status == 200 and json.loads(body)["reason_kind"] == "watchdog"


def test_http__task_endpoints(front, up):
    f = front()
    assert_error(*f.curl("/polygw/v1/tasks/t%2F1"), 400, "bad_request")  # '/' in an id
    assert_error(*f.curl("/polygw/v1/tasks/nope"), 400, "bad_request")   # unknown task
    status, _, body = f.curl("/polygw/v1/tasks/t%201/start", method="POST")
    assert status == 200 and json.loads(body)["task_id"] == "t 1"
    assert json.loads(body)["state"] == "running"
    status, _, body = f.curl("/polygw/v1/tasks/t%201/guard", method="POST")
    assert status == 200 and json.loads(body) == {}
    status, _, _ = f.curl("/polygw/v1/tasks/t%201/node_begin", {"node": "n1"})
    assert status == 200
    status, _, body = f.curl("/polygw/v1/tasks/t%201")
    assert json.loads(body)["node"] == "n1"
    status, _, _ = f.curl("/polygw/v1/tasks/t%201/node_end", {"node": "n1"})
    assert status == 200
    # Calls naming a running task go through.
    status, _, _ = f.curl("/v1/chat/completions", chat("x"), headers=["X-Polygw-Task: t 1"])
    assert status == 200
    status, _, body = f.curl("/polygw/v1/tasks/t%201/finish", {"ok": True})
    assert status == 200 and json.loads(body)["state"] == "succeeded"
    # Unknown parameters and unknown operations are refused clearly.
    assert_error(*f.curl("/polygw/v1/tasks/t2/start", {"colour": "red"}), 400, "bad_request")
    assert f.curl("/polygw/v1/tasks/t2/explode", method="POST")[0] == 404
    assert f.curl("/polygw/v1/tasks/t2/stop")[0] == 405


def test_http__task_bodies_are_refused_as_the_rpc_front_refuses_them(front, up):
    """The HTTP front parses a task body itself: each refusal carries the
    message the msgpack-RPC front gives for the same named parameters."""
    f = front()
    c = f.sc.connect()
    cases = [("start", {"colour": "red"}), ("node_begin", {}), ("node_begin", {"node": 5}),
             ("node_begin", {"node": "n", "timeout_s": -1}),
             ("node_begin", {"node": "n", "timeout_s": "x"}), ("node_begin", {"node": ""}),
             ("node_begin", {"node": "n", "timeout_s": 0.0}), ("finish", {"ok": 1}),
             ("finish", {"ok": None}), ("stop", {"reason": 1.5}), ("stop", {"reason": -3}),
             ("stop", {"reason": ["x"]}), ("node_end", {"node": {"a": 1}}), ("guard", {"ok": True})]
    for op, body in cases:
        err, _ = c.request("task." + op, dict(body, task_id="t1"))
        assert err is not None, (op, body)
        e = assert_error(*f.curl("/polygw/v1/tasks/t1/" + op, body), 400, "bad_request")
        assert e["message"] == err["message"], (op, body, e, err)
    e = assert_error(*f.curl("/polygw/v1/tasks/t1/node_begin", '{"node": "a", "node": "b"}'),
                     400, "bad_request")
    assert e["message"] == "parameter 'node' given twice"
    for raw in ('{"node": ', "[1]", '"x"'):
        assert_error(*f.curl("/polygw/v1/tasks/t1/node_begin", raw), 400, "bad_request")
    # Escapes are decoded; a task_id in the body yields to the path's.
    assert f.curl("/polygw/v1/tasks/t1/start", {"task_id": "other"})[0] == 200
    status, _, body = f.curl("/polygw/v1/tasks/t1/node_begin",
                             '{"node": "n\\u00e9", "timeout_s": 2}')
    assert status == 200 and json.loads(body) == {"timeout_s": 2.0, "timeout_source": "explicit"}
    status, _, body = f.curl("/polygw/v1/tasks/t1/stop", {"reason": "caf\u00e9 \"x\"\n"})
    assert status == 200, body
    got = json.loads(body)
    assert got["reason"] == "caf\u00e9 \"x\"?" and got["node"] == "n\u00e9", got
    err, res = c.request("task.get", {"task_id": "t1"})
    assert err is None and res["reason"] == got["reason"]


def test_http__overloaded_at_max_connections(front, up):
    f = front(http={"max_connections": 2})
    time.sleep(0.2)  # the fixture's probe connection is gone
    a, b = f.raw(), f.raw()
    for s in (a, b):
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert read_response(s)[0] == 200
    status, hdrs, body = f.curl("/healthz")
    assert_error(status, hdrs, body, 503, "overloaded")
    assert hdrs["retry-after"] == "1"
    a.close()
    time.sleep(0.1)
    assert f.curl("/healthz")[0] == 200
    b.close()


def test_http__shutting_down_is_503(front, up):
    f = front()
    idle = f.raw()
    idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert read_response(idle)[0] == 200
    slow = {}
    t = threading.Thread(target=lambda: slow.update(r=f.curl(
        "/v1/chat/completions", chat("x", mock={"delay_ms": 800}))))
    t.start()
    up.wait_stats(lambda s: s["in_progress"] == 1, timeout=5)
    f.sc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    status, hdrs, body = read_response(idle)
    assert_error(status, hdrs, body.decode(), 503, "shutting_down")
    assert hdrs["connection"] == "close"
    t.join(5)
    assert slow["r"][0] == 200  # the call in flight finished within the grace period
    assert f.sc.proc.wait(10) == 0
    assert not os.path.exists(f.hsock)


def test_http__stream_failing_after_first_event_ends_with_error_event(front, up):
    f = front()
    status, hdrs, body = f.curl("/v1/chat/completions", chat(
        "a b c d", stream=True, mock={"stream_events": 4, "stream_interval_ms": 50,
                                      "close_after_bytes": 500}))
    assert status == 200
    assert "event: error" in body
    data = body.split("event: error\n", 1)[1].split("\n")[0]
    assert data.startswith("data: ")
    err = json.loads(data[6:])["error"]
    assert err["code"] == "stream_interrupted"
    assert "[DONE]" not in body


# ------------------------------------------------------------ transport
def test_http__keepalive_and_pipelining(front, up):
    f = front()
    s = f.raw()
    body = json.dumps(chat("piped"))
    a, b = body[:7], body[7:]
    chunked = "%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(a), a, len(b), b)
    s.sendall(("GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
               "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
               "Transfer-Encoding: chunked\r\n\r\n" + chunked +
               "GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n").encode())
    time.sleep(0.5)  # all three answers are queued: they arrive together
    r1, r2, r3 = read_response(s), read_response(s), read_response(s)
    assert r1[0] == 200 and json.loads(r1[2]) == {"status": "ok"}
    assert r2[0] == 200 and json.loads(r2[2])["choices"][0]["message"]["content"] == "piped"
    assert r3[0] == 200 and json.loads(r3[2])["object"] == "list"
    assert up.stats()["requests"] == 1
    # Still usable afterwards.
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert read_response(s)[0] == 200
    s.close()


def test_http__expect_100_continue(front, up):
    f = front(http={"max_body_bytes": 4096})
    s = f.raw()
    body = json.dumps(chat("expected"))
    s.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % len(body)).encode())
    s.settimeout(3)
    assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    s.sendall(body.encode())
    assert read_response(s)[0] == 200
    # Too large: refused before the client sends the body.
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100000\r\nExpect: 100-continue\r\n\r\n")
    status, hdrs, body = read_response(s)
    assert_error(status, hdrs, body.decode(), 413, "too_large")
    assert is_closed(s)


def test_http__malformed_request_line_is_400_and_others_unaffected(front, up):
    f = front()
    other = f.raw()
    other.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert read_response(other)[0] == 200
    bad = f.raw()
    bad.sendall(b"GARBAGE / NOT-HTTP\r\n\r\n")
    status, hdrs, body = read_response(bad)
    assert_error(status, hdrs, body.decode(), 400, "bad_request")
    assert is_closed(bad)
    bad2 = f.raw()
    bad2.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a TLS hello
    assert read_response(bad2)[0] == 400
    other.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert read_response(other)[0] == 200


def test_http__oversized_headers_are_431(front, up):
    f = front(http={"max_header_bytes": 4096})
    s = f.raw()
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Junk: " + b"a" * 5000 + b"\r\n\r\n")
    status, hdrs, body = read_response(s)
    assert_error(status, hdrs, body.decode(), 431, "too_large")
    assert is_closed(s)
    # A header polygw reads, too long for it.
    status, hdrs, body = f.curl("/v1/chat/completions", chat("x"),
                                headers=["X-Polygw-Task: " + "t" * 300])
    assert status == 431
    long_url = "/v1/" + "x" * 3000
    status, _, _ = f.curl(long_url)
    assert status == 414
    assert f.curl("/healthz")[0] == 200


def test_http__slowloris_headers_time_out_and_others_are_served(front, up):
    f = front(http={"header_timeout_s": 1.5})
    s = f.raw()
    t0 = time.monotonic()
    closed_at = None
    got = b""
    for ch in b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n":
        try:
            s.sendall(bytes([ch]))
        except OSError:
            break
        r, _, _ = select.select([s], [], [], 0.3)
        if r:
            d = s.recv(65536)
            got += d
            if not d or b"\r\n\r\n" in got:
                closed_at = time.monotonic() - t0
                break
        # Meanwhile a normal client is served at once.
        t1 = time.monotonic()
        assert f.curl("/healthz")[0] == 200
        assert time.monotonic() - t1 < 1.0
        if time.monotonic() - t0 > 5:
            break
    assert got.startswith(b"HTTP/1.1 408"), got
    assert closed_at is not None and 1.3 < closed_at < 2.5, closed_at
    assert is_closed(s)


def test_http__slow_body_times_out(front, up):
    f = front(http={"body_timeout_s": 1})
    s = f.raw()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
              b"Content-Length: 50\r\n\r\n{\"model\"")
    status, hdrs, body = read_response(s, timeout=3)
    assert status == 408
    assert is_closed(s)
    assert up.stats()["requests"] == 0


def test_http__keepalive_idle_connection_is_closed(front, up):
    f = front(http={"keepalive_timeout_s": 0.5})
    s = f.raw()
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert read_response(s)[0] == 200
    t0 = time.monotonic()
    assert is_closed(s, timeout=3)
    assert 0.3 < time.monotonic() - t0 < 2


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))


def test_http__2000_idle_keepalive_connections(front, up):
    raise_nofile()
    n = 2000
    f = front(http={"max_connections": 4096}, preexec_fn=raise_nofile)
    idle = []
    try:
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", f.port), timeout=10)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            idle.append(s)
        for s in idle:
            assert read_response(s)[0] == 200
        t0 = time.monotonic()
        status, _, body = f.curl("/v1/chat/completions", chat("still fast"))
        elapsed = time.monotonic() - t0
        assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "still fast"
        assert elapsed < 2.0, elapsed
        # All idle connections are still open and usable.
        for s in idle[:: n // 20]:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert read_response(s)[0] == 200
    finally:
        for s in idle:
            s.close()


def test_http__client_abort_closes_the_upstream_connection(front, up):
    f = front()
    s = f.raw()
    body = json.dumps(chat("x", mock={"hang": "before_headers"}))
    s.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
    up.wait_stats(lambda st: st["in_progress"] == 1, timeout=5)
    t0 = time.monotonic()
    s.close()
    up.wait_stats(lambda st: st["aborted_by_peer"] == 1 and st["open_connections"] == 0, timeout=2)
    assert time.monotonic() - t0 < 1.0
    assert f.curl("/healthz")[0] == 200


def test_http__stream_client_abort_closes_the_upstream_connection(front, up):
    f = front()
    s = f.raw()
    body = json.dumps(chat("x", stream=True, mock={"stream_events": 1000, "stream_interval_ms": 50}))
    s.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
    buf = b""
    while buf.count(b"data: ") < 3:
        buf += s.recv(65536)
    s.close()
    up.wait_stats(lambda st: st["aborted_by_peer"] == 1 and st["open_connections"] == 0, timeout=2)


def test_http__sdk_retry_opt_in(front, up):
    up.set_default({"status": 500})
    f = front()
    status, hdrs, body = f.curl("/v1/embeddings", {"model": "e", "input": "a"},
                                headers=["Content-Type: application/json",
                                         "X-Polygw-SDK-Retry: true"])
    assert status == 503 and hdrs["x-should-retry"] == "true"
    status, hdrs, body = f.curl("/v1/chat/completions", "{", headers=[
        "Content-Type: application/json", "X-Polygw-SDK-Retry: true"])
    assert status == 400 and hdrs["x-should-retry"] == "false"


def test_http__unix_socket_mode(front):
    f = front()
    assert oct(os.stat(f.hsock).st_mode & 0o777) == "0o660"


def test_http__non_loopback_listen_needs_allow_remote(make_sidecar, workdir, up):
    text = config_yaml([source_yaml("m1", "chat", up.url, FAST)], DEFAULTS) + \
        http_section(listen="0.0.0.0:%d" % free_port())
    path = os.path.join(workdir, "remote.yaml")
    with open(path, "w") as fh:
        fh.write(text)
    from conftest import POLYGW
    r = subprocess.run([POLYGW, "--check-config", path], capture_output=True, timeout=10)
    assert r.returncode == 1
    assert b"http.listen" in r.stderr and b"allow_remote" in r.stderr
    good = os.path.join(workdir, "good.yaml")
    with open(good, "w") as fh:
        fh.write(config_yaml([source_yaml("m1", "chat", up.url, FAST)], DEFAULTS))
    r = subprocess.run([POLYGW, "--config", good, "--http-listen", "10.1.2.3:80",
                        "--socket", os.path.join(workdir, "x.sock")],
                       capture_output=True, timeout=10)
    assert r.returncode == 1 and b"--http-listen" in r.stderr
    with open(path, "w") as fh:
        fh.write(text + "  allow_remote: true\n")
    r = subprocess.run([POLYGW, "--check-config", path], capture_output=True, timeout=10)
    assert r.returncode == 0, r.stderr


def test_http__command_line_overrides(make_sidecar, workdir, up):
    port = free_port()
    hsock = os.path.join(workdir, "cli-http.sock")
    text = config_yaml([source_yaml("m1", "chat", up.url, FAST)], DEFAULTS)
    sc = make_sidecar(config_text=text,
                      args=["--http-socket", hsock, "--http-listen", "127.0.0.1:%d" % port])
    deadline = time.monotonic() + 5
    while not os.path.exists(hsock) and time.monotonic() < deadline:
        time.sleep(0.02)
    f = Front(sc, port, hsock)
    assert f.curl("/healthz", unix=True)[0] == 200
    assert f.curl("/healthz")[0] == 200


@pytest.mark.timing
def test_http__stream_reader_that_stops_reading_is_closed(front, up):
    f = front(http={"send_timeout_s": 1},
              listen={"max_message_bytes": 65536, "max_write_queue_bytes": 65536},
              sources=[source_yaml("m1", "chat", up.url, dict(FAST, timeout_s=60, idle_timeout_s=60))])
    s = f.raw()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    body = json.dumps(chat("x" * 2000, stream=True, mock={"stream_events": 100000}))
    s.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
    # Never read: the sidecar's queue fills, the upstream is paused, and
    # after send_timeout_s without progress the connection and its call end.
    up.wait_stats(lambda st: st["in_progress"] == 1, timeout=5)
    t0 = time.monotonic()
    up.wait_stats(lambda st: st["aborted_by_peer"] == 1 and st["open_connections"] == 0,
                  timeout=5)
    assert time.monotonic() - t0 < 4  # the attempt's own timeout_s (60) did not do it
    assert f.curl("/healthz")[0] == 200
    s.close()


def test_http__stats_count_the_http_front(front, up):
    f = front()
    assert f.curl("/healthz")[0] == 200
    assert f.curl("/v1/chat/completions", chat("x"))[0] == 200
    assert f.curl("/nothing")[0] == 404
    bad = f.raw()
    bad.sendall(b"NOT HTTP\r\n\r\n")
    assert read_response(bad)[0] == 400
    bad.close()
    c = f.sc.connect()
    deadline = time.monotonic() + 3
    while True:
        err, st = c.request("stats")
        assert err is None
        h = st["http"]
        if h["open"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert h["open"] == 0
    assert h["accepted"] >= 4 and h["rejected"] == 0
    assert h["requests"] == 3  # the unparsable one never became a request
    assert h["responses_2xx"] == 2 and h["responses_4xx"] == 2
    assert h["bad_requests"] == 1 and h["timeouts"] == 0
    c.close()


def test_http__task_endpoints_across_a_redis_fleet(make_sidecar, up, workdir):
    """Two sidecars sharing Redis, each with its HTTP front: a task started
    over HTTP on B, B's HTTP call in it hung at the mock; stopping it over
    HTTP on A (a task request that waits for Redis, then answers) ends B's
    call with 409 task_stopped and closes its upstream connection."""
    from redis_fixture import FleetRedis, fleet_config
    redis = FleetRedis().start()
    try:
        prefix = "pgwhttp%d" % os.getpid()
        fronts = []
        for name in ("a", "b"):
            port = free_port()
            text = fleet_config(redis.url(), prefix, [source_yaml("m1", "chat", up.url, FAST)]) + \
                http_section(listen="127.0.0.1:%d" % port)
            sc = make_sidecar(config_text=text, subdir=name, env={"no_proxy": "*", "NO_PROXY": "*"})
            f = Front(sc, port, None)
            deadline = time.monotonic() + 10
            while True:  # ready = listening and Redis up
                try:
                    if f.curl("/readyz", timeout=2)[0] == 200:
                        break
                except Exception:
                    pass
                assert time.monotonic() < deadline, "sidecar %s never ready" % name
                time.sleep(0.05)
            fronts.append(f)
        a, b = fronts
        status, _, body = b.curl("/polygw/v1/tasks/fleet-job/start", method="POST")
        assert status == 200 and json.loads(body)["state"] == "running", body
        pending = {}
        t = threading.Thread(target=lambda: pending.update(r=b.curl(
            "/v1/chat/completions", chat("x", mock={"hang": "before_headers"}),
            headers=["X-Polygw-Task: fleet-job"])))
        t.start()
        up.wait_stats(lambda st: st["in_progress"] == 1, timeout=5)
        status, _, body = a.curl("/polygw/v1/tasks/fleet-job/stop", {"reason": "stopped on A"})
        assert status == 200 and json.loads(body)["reason_kind"] == "stopped", body
        t.join(5)
        err = assert_error(*pending["r"], 409, "task_stopped")
        assert err["polygw"]["reason"] == "stopped on A"
        up.wait_stats(lambda st: st["aborted_by_peer"] == 1 and st["open_connections"] == 0,
                      timeout=3)
        assert_error(*a.curl("/polygw/v1/tasks/fleet-job/guard", method="POST"), 409,
                     "task_stopped")
        status, _, body = a.curl("/polygw/v1/tasks/fleet-job")
        assert status == 200 and json.loads(body)["reason"] == "stopped on A"
        for f in fronts:
            assert f.sc.stop() == 0
    finally:
        redis.cleanup()


def test_http__echoed_keys_are_scrubbed(front, up):
    """An upstream that echoes the key it was sent — in an error body, a
    reply (also spelled with JSON escapes), a stream event, a non-JSON
    event — never gets it to the HTTP client: every answer says
    "[redacted]" where the key was."""
    from test_hostile_replies import KEY, KEY_ENV, MARKER, USAGE, compact, finish_event, raw, sse
    src = dict(FAST, api_key_env=KEY_ENV)
    f = front(sources=[source_yaml("m1", "chat", up.url, src)],
              env={KEY_ENV: KEY, "no_proxy": "*", "NO_PROXY": "*"})
    seen = []

    def ask(body):
        r = f.curl("/v1/chat/completions", body)
        seen.append(r[2])
        return r
    status, _, body = ask(chat(mock={"status": 401, "error_message": "bad key {{authorization}}"}))
    assert status == 401
    assert json.loads(body)["error"]["message"] == "bad key Bearer " + MARKER
    assert up.last()["authorization"] == "Bearer " + KEY  # it really was echoed

    escaped = "".join("\\u%04x" % ord(ch) for ch in KEY)
    reply = ('{"choices":[{"index":0,"message":{"role":"assistant","content":'
             '"you sent {{authorization}} and %s"},"finish_reason":"stop"}],"usage":%s}'
             % (escaped, compact(USAGE)))
    status, _, body = ask(chat(mock=raw(reply.encode())))
    assert status == 200, body
    content = json.loads(body)["choices"][0]["message"]["content"]
    assert content == "you sent Bearer %s and %s" % (MARKER, MARKER), content

    events = sse('{"choices":[{"index":0,"delta":{"content":"{{authorization}}"},'
                 '"finish_reason":null}]}', b"raw {{authorization}} \xff", finish_event())
    status, _, body = ask(chat(stream=True, mock=raw(events, "text/event-stream")))
    assert status == 200
    data = [line[6:] for line in body.split("\n") if line.startswith("data: ")]
    assert json.loads(data[0])["choices"][0]["delta"]["content"] == "Bearer " + MARKER
    assert data[1] == "raw Bearer %s \ufffd" % MARKER
    assert data[-1] == "[DONE]"
    for text in seen:
        assert KEY not in text and escaped not in text

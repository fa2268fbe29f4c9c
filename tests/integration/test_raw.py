"""Passthrough capabilities (`body: raw`, docs/HTTP.md §1, docs/CONFIG.md
§6b) through the real sidecar: a multipart body reaches the upstream byte
for byte, a binary answer comes back byte for byte with its Content-Type,
GET with a query and DELETE are routed to sub-paths, the body bound is a
413, a failed POST is never sent twice while a GET is retried, a JSON
capability still refuses what is not JSON, and the msgpack front calls a
raw capability with a bin body (a map body is refused with a typed error).

The upstream is a small HTTP server in this file (the scriptable mock
upstream speaks JSON): it reports the sha256 of every body it received.
"""
import hashlib
import http.server
import json
import os
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import call, source_yaml  # noqa: E402
from test_http import DEFAULTS, FAST, assert_error, front  # noqa: E402,F401

KEY = "sk-raw-passthrough-secret-77aa1"
# What /v1/audio/speech answers: every byte value, CR LF and NULs among them.
SPEECH = bytes(range(256)) * 300 + b"\r\n\r\n\x00"


class Upstream(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.seen = []          # (method, target, headers, sha256, length)
        self.fail = {}          # method -> how many of the next ones answer 500
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return "http://127.0.0.1:%d/v1" % self.server_address[1]

    def count(self, method, prefix):
        with self.lock:
            return sum(1 for m, t, _, _, _ in self.seen if m == method and t.startswith(prefix))


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, ctype, body, extra=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def serve(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        digest = hashlib.sha256(body).hexdigest()
        srv = self.server
        with srv.lock:
            srv.seen.append((self.command, self.path, dict(self.headers), digest, len(body)))
            failing = srv.fail.get(self.command, 0)
            if failing:
                srv.fail[self.command] = failing - 1
        if failing:
            return self.answer(500, "application/json",
                               b'{"error":{"message":"upstream failed","type":"server_error"}}')
        path = self.path.split("?")[0]
        if path == "/v1/audio/speech":
            return self.answer(200, "audio/mpeg", SPEECH,
                               [("Connection", "keep-alive"), ("Keep-Alive", "timeout=5"),
                                ("X-Upstream-Only", "not relayed")])
        if path.endswith("/echo-key/content"):
            return self.answer(200, "application/octet-stream",
                               b"\x00\xff" + self.headers.get("Authorization", "").encode() + b"\x01")
        if path.endswith("/content"):
            return self.answer(200, "application/octet-stream", b"\x89file\x00bytes\xfe")
        doc = {"method": self.command, "target": self.path, "sha256": digest, "bytes": len(body),
               "content_type": self.headers.get("Content-Type"), "text": "transcribed"}
        self.answer(201 if path == "/v1/files" and self.command == "POST" else 200,
                    "application/json", json.dumps(doc).encode())

    do_GET = do_POST = do_DELETE = serve


@pytest.fixture
def rup():
    srv = Upstream()
    yield srv
    srv.shutdown()
    srv.server_close()


CAPS = {"transcribe": {"path": "/audio/transcriptions", "body": "raw", "max_body_bytes": 1048576},
        "speech": {"path": "/audio/speech", "body": "raw"},
        "files": {"path": "/files", "body": "raw", "methods": ["GET", "POST", "DELETE"]}}


def raw_front(front, rup, **kw):
    sources = [source_yaml(name[0] + "1", name, rup.url, FAST, api_key_env="PGW_RAW_KEY")
               for name in ("transcribe", "speech", "files")]
    sources.append(source_yaml("c1", "chat", rup.url, FAST))
    return front(sources=sources, capabilities=CAPS, env={"PGW_RAW_KEY": KEY}, **kw)


def multipart(boundary, data):
    return (b"--" + boundary + b"\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n"
            b"whisper-1\r\n--" + boundary + b"\r\nContent-Disposition: form-data; name=\"file\"; "
            b"filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n" + data + b"\r\n--" +
            boundary + b"--\r\n")


def request(f, method, path, body=None, headers=None):
    conn = f.conn()
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_raw__multipart_goes_upstream_byte_for_byte(front, rup):
    f = raw_front(front, rup)
    boundary = b"----polygw-raw-7d1"
    body = multipart(boundary, bytes(range(256)) * 40 + b"\r\n--not-the-boundary\r\n")
    ctype = "multipart/form-data; boundary=" + boundary.decode()
    status, hdrs, data = request(f, "POST", "/v1/audio/transcriptions", body,
                                 {"Content-Type": ctype, "Authorization": "Bearer client-key"})
    assert status == 200, data
    assert hdrs["content-type"] == "application/json"
    assert hdrs["x-polygw-source"] == "t1"
    doc = json.loads(data)
    assert doc["sha256"] == hashlib.sha256(body).hexdigest()
    assert doc["bytes"] == len(body)
    assert doc["content_type"] == ctype
    _, target, headers, _, _ = rup.seen[-1]
    assert target == "/v1/audio/transcriptions"
    # The source's key went upstream, never the client's.
    assert headers["Authorization"] == "Bearer " + KEY


def test_raw__binary_answer_relayed_byte_for_byte(front, rup):
    f = raw_front(front, rup)
    status, hdrs, data = request(f, "POST", "/v1/audio/speech",
                                 json.dumps({"model": "tts-1", "input": "hi", "voice": "x"}),
                                 {"Content-Type": "application/json"})
    assert status == 200
    assert data == SPEECH
    assert hdrs["content-type"] == "audio/mpeg"
    # Only the Content-Type of the upstream's headers is relayed.
    assert "keep-alive" not in hdrs and "x-upstream-only" not in hdrs


def test_raw__get_with_query_delete_and_sub_paths(front, rup):
    f = raw_front(front, rup)
    status, hdrs, data = request(f, "GET", "/v1/files?purpose=batch&limit=2")
    assert status == 200, data
    doc = json.loads(data)
    assert (doc["method"], doc["target"], doc["bytes"]) == ("GET", "/v1/files?purpose=batch&limit=2", 0)
    status, hdrs, data = request(f, "GET", "/v1/files/file-abc/content")
    assert status == 200
    assert data == b"\x89file\x00bytes\xfe"
    assert hdrs["content-type"] == "application/octet-stream"
    status, _, data = request(f, "DELETE", "/v1/files/file-abc")
    assert status == 200, data
    assert json.loads(data)["target"] == "/v1/files/file-abc"
    # An upload answered 201 keeps its status.
    status, _, data = request(f, "POST", "/v1/files", b"x" * 10,
                              {"Content-Type": "application/octet-stream"})
    assert status == 201, data
    # A dot segment could name another endpoint: refused, nothing sent.
    seen = len(rup.seen)
    status, hdrs, data = request(f, "GET", "/v1/files/%2e%2e/chat/completions")
    assert_error(status, hdrs, data, 400, "bad_request")
    # ... nor behind a separator an upstream may decode or take for '/'.
    for path in ("/v1/files/abc%2F..%2Fresponses", "/v1/files/%5c..%5cx",
                 "/v1/files/a%2f%2e%2e"):
        status, hdrs, data = request(f, "GET", path)
        assert_error(status, hdrs, data, 400, "bad_request")
    # A method the capability does not list, or GET on a JSON capability.
    status, hdrs, data = request(f, "DELETE", "/v1/audio/speech")
    assert_error(status, hdrs, data, 405, "unknown_method")
    status, hdrs, data = request(f, "GET", "/v1/chat/completions")
    assert_error(status, hdrs, data, 405, "unknown_method")
    assert len(rup.seen) == seen


def test_raw__body_over_the_bound_is_413(front, rup):
    f = raw_front(front, rup)
    big = b"z" * (1048576 + 1)
    status, hdrs, data = request(f, "POST", "/v1/audio/transcriptions", big,
                                 {"Content-Type": "audio/wav"})
    err = assert_error(status, hdrs, data, 413, "too_large")
    assert "capabilities.transcribe.max_body_bytes (1048576)" in err["message"]
    # Over what any endpoint takes: refused before the route is known.
    status, hdrs, data = request(f, "POST", "/v1/files", b"f" * (26214400 + 1),
                                 {"Content-Type": "application/octet-stream"})
    err = assert_error(status, hdrs, data, 413, "too_large")
    assert "exceeds 26214400 bytes, the most any endpoint takes" in err["message"]
    # Chunked: refused once the body passes the bound.
    conn = f.conn()
    try:
        conn.request("POST", "/v1/audio/transcriptions", body=iter([big[:700000], big[700000:]]),
                     headers={"Content-Type": "audio/wav"}, encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 413
        resp.read()
    finally:
        conn.close()
    # Under the bound, larger than http.max_body_bytes would have allowed for
    # JSON here, it goes through.
    status, _, data = request(f, "POST", "/v1/audio/transcriptions", big[:1048576],
                              {"Content-Type": "audio/wav"})
    assert status == 200, data
    assert json.loads(data)["bytes"] == 1048576
    assert all(t != "/v1/audio/transcriptions" or n <= 1048576 for _, t, _, _, n in rup.seen)


def test_raw__post_is_not_retried_get_is(front, rup):
    f = raw_front(front, rup)
    rup.fail["POST"] = 1
    status, hdrs, data = request(f, "POST", "/v1/files", b"upload", {"Content-Type": "text/plain"})
    assert status >= 500, data
    assert rup.count("POST", "/v1/files") == 1
    rup.fail["GET"] = 1
    status, hdrs, data = request(f, "GET", "/v1/files")
    assert status == 200, data
    assert hdrs["x-polygw-attempts"] == "2"
    assert rup.count("GET", "/v1/files") == 2


def test_raw__json_capability_still_415_and_key_echo_scrubbed(front, rup):
    f = raw_front(front, rup)
    status, hdrs, data = request(f, "POST", "/v1/chat/completions", multipart(b"b", b"x"),
                                 {"Content-Type": "multipart/form-data; boundary=b"})
    assert_error(status, hdrs, data, 415, "bad_request")
    status, _, data = request(f, "GET", "/v1/files/echo-key/content")
    assert status == 200
    assert KEY.encode() not in data
    assert data == b"\x00\xffBearer [redacted]\x01"


def test_raw__over_msgpack_body_is_bin(front, rup):
    """The msgpack front: a bin body with content_type, method and
    path_suffix; the answer's body is bin with its content_type and status
    (with `stream` too: it is not read). A map body for a raw capability,
    or bytes for a JSON one, is refused."""
    f = raw_front(front, rup)
    c = f.sc.connect()
    body = multipart(b"mp-boundary", bytes(range(256)) * 8)
    err, res, _ = call(c, "transcribe", body,
                       content_type="multipart/form-data; boundary=mp-boundary")
    assert err is None, err
    assert res["content_type"] == "application/json" and res["status"] == 200
    assert isinstance(res["body"], bytes)
    doc = json.loads(res["body"])
    assert doc["sha256"] == hashlib.sha256(body).hexdigest()
    assert doc["content_type"] == "multipart/form-data; boundary=mp-boundary"
    assert "usage" not in res
    err, res, _ = call(c, "speech", json.dumps({"input": "x"}).encode(),
                       content_type="application/json")
    assert err is None and res["body"] == SPEECH and res["content_type"] == "audio/mpeg"
    # A passthrough's `stream` is not read: the answer is its bytes still.
    err, res, _ = call(c, "speech", json.dumps({"input": "x"}).encode(),
                       content_type="application/json", stream=True)
    assert err is None and res["body"] == SPEECH and res["content_type"] == "audio/mpeg", err
    err, res, _ = call(c, "files", b"", method="GET", path_suffix="/file-1/content")
    assert err is None and res["body"] == b"\x89file\x00bytes\xfe"
    assert rup.seen[-1][:2] == ("GET", "/v1/files/file-1/content")
    err, res, _ = call(c, "files", b"", method="DELETE", path_suffix="/file-1?x=1")
    assert err is None and json.loads(res["body"])["target"] == "/v1/files/file-1?x=1"
    seen = len(rup.seen)
    for cap, body, params, why in [
            ("speech", {"input": "x"}, {}, "send the body as bytes"),
            ("chat", b"{}", {}, "takes a JSON body"),
            ("speech", b"", {"method": "GET"}, "not served with GET"),
            ("files", b"", {"method": "PUT"}, "expected GET, POST or DELETE"),
            ("files", b"", {"path_suffix": "/../chat/completions"}, "'..' segment"),
            ("files", b"", {"path_suffix": "x"}, "start with '/' or '?'"),
            ("chat", {"messages": []}, {"content_type": "text/plain"}, "bin body only")]:
        err, res, _ = call(c, cap, body, **params)
        assert res is None and err["code"] == "bad_request", (cap, params, err)
        assert why in err["message"], (why, err)
    assert len(rup.seen) == seen
    c.close()


def test_raw__usage_unknown(front, rup):
    f = raw_front(front, rup)
    status, _, _ = request(f, "GET", "/v1/files")
    assert status == 200
    deadline = time.monotonic() + 3
    lines = []
    while time.monotonic() < deadline:
        lines = [json.loads(x) for x in f.sc.logs().splitlines()
                 if x.startswith("{") and '"msg":"call"' in x.replace(" ", "")]
        if any(r.get("capability") == "files" for r in lines):
            break
        time.sleep(0.02)
    rec = [r for r in lines if r.get("capability") == "files"][0]
    assert rec["code"] == "ok"
    assert rec["tokens"] is None  # unknown, never 0

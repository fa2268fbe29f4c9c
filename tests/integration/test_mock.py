"""Tests of the scriptable mock upstream itself (tests/mock_upstream), driven
directly with http.client and raw sockets. Every test owns a fresh mock
process; stopping it asserts exit code 0 (ASan/LSan clean under make test).

Run: /usr/bin/python3 -m pytest -q tests/integration/test_mock.py
"""

import http.client
import json
import socket
import time
import weakref

import pytest

CHAT = "/v1/chat/completions"


def chat_body(text="hello", **extra):
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": text}]}
    body.update(extra)
    return body


def post(up, path, obj, headers=None, timeout=2.0, raw=None):
    """One request on a fresh connection: (status, headers dict lower-cased, body bytes)."""
    conn = http.client.HTTPConnection(up.host, up.port, timeout=timeout)
    try:
        data = raw if raw is not None else json.dumps(obj).encode()
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        conn.request("POST", path, body=data, headers=h)
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
    finally:
        conn.close()


def raw_request(path, body, extra_headers=""):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return (("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: %d\r\n%s\r\n" % (path, len(data), extra_headers)).encode() + data)


def connect(up, timeout=2.0):
    s = socket.create_connection((up.host, up.port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_until_close(s, limit=1 << 20):
    out = b""
    while len(out) < limit:
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    return out


def recv_until(s, done, limit=1 << 22):
    """Reads from s until done(data) holds; the data. Fails on EOF."""
    data = b""
    while not done(data):
        assert len(data) < limit
        chunk = s.recv(65536)
        assert chunk, "closed after %r" % data[-200:]
        data += chunk
    return data


def strip_volatile(doc):
    doc = dict(doc)
    doc.pop("id", None)
    doc.pop("created", None)
    return doc


# ------------------------------------------------------------------ answers

def test_plain_chat_echoes_and_records_authorization(up):
    st, hdr, body = post(up, CHAT, chat_body("round trip ✓"),
                         headers={"Authorization": "Bearer sk-abc"})
    assert st == 200
    assert hdr["content-type"] == "application/json"
    assert int(hdr["content-length"]) == len(body)
    doc = json.loads(body)
    assert doc["object"] == "chat.completion"
    assert doc["model"] == "gpt-test"
    choice = doc["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "round trip ✓"}
    assert choice["finish_reason"] == "stop"
    u = doc["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] > 0

    last = up.last()
    assert last["method"] == "POST"
    assert last["path"] == CHAT
    assert last["authorization"] == "Bearer sk-abc"
    assert last["headers"]["authorization"] == "Bearer sk-abc"
    assert last["json"]["messages"][0]["content"] == "round trip ✓"
    assert json.loads(last["body"]) == chat_body("round trip ✓")


def test_fast_path_and_jansson_path_agree(up):
    msgs = [{"role": "system", "content": "sys \"quoted\" a/b\n\ttab"},
            {"role": "assistant", "content": None},
            {"role": "user", "content": "the end \\ slash"}]
    _, _, fast = post(up, CHAT, {"model": "m1", "messages": msgs, "temperature": 0.5,
                                 "stream": False, "n": 1, "stop": ["x"]})
    _, _, slow = post(up, CHAT, {"model": "m1", "messages": msgs, "temperature": 0.5,
                                 "stream": False, "n": 1, "stop": ["x"], "mock": {}})
    assert strip_volatile(json.loads(fast)) == strip_volatile(json.loads(slow))
    assert json.loads(fast)["choices"][0]["message"]["content"] == "the end \\ slash"


def test_content_override_usage_override_and_no_messages(up):
    _, _, b = post(up, CHAT, {"model": "m", "messages": []})
    assert json.loads(b)["choices"][0]["message"]["content"] == "mock reply"
    _, _, b = post(up, CHAT, chat_body(mock={"content": "fixed", "usage": {"prompt_tokens": 7,
                                                                          "completion_tokens": 3}}))
    doc = json.loads(b)
    assert doc["choices"][0]["message"]["content"] == "fixed"
    assert doc["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


def test_embeddings_and_ocr(up):
    st, _, b = post(up, "/v1/embeddings", {"model": "emb", "input": ["a", "b", "a"],
                                           "dimensions": 4})
    assert st == 200
    doc = json.loads(b)
    assert doc["object"] == "list" and doc["model"] == "emb"
    assert [d["index"] for d in doc["data"]] == [0, 1, 2]
    assert all(len(d["embedding"]) == 4 for d in doc["data"])
    assert doc["data"][0]["embedding"] == doc["data"][2]["embedding"]   # deterministic
    assert doc["data"][0]["embedding"] != doc["data"][1]["embedding"]
    assert doc["usage"]["prompt_tokens"] == doc["usage"]["total_tokens"] >= 1

    st, _, b = post(up, "/embeddings", {"input": "one", "encoding_format": "base64"})
    assert st == 200 and len(json.loads(b)["data"]) == 1
    import base64
    assert len(base64.b64decode(json.loads(b)["data"][0]["embedding"])) == 8 * 4

    st, _, b = post(up, "/v1/embeddings", {"model": "emb"})
    assert st == 400

    st, _, b = post(up, "/ocr", {"model": "ocr-1", "input": "scan me"})
    assert st == 200
    doc = json.loads(b)
    assert doc["text"] == "scan me" and doc["usage"]["total_tokens"] > 0
    assert up.stats()["by_path"] == {"/v1/embeddings": 2, "/embeddings": 1, "/ocr": 1}


def test_unknown_path_bad_json_and_wrong_method(up):
    st, _, b = post(up, "/v1/nothing", {})
    assert st == 404 and "error" in json.loads(b)
    st, _, b = post(up, CHAT, None, raw=b"{not json")
    assert st == 400 and json.loads(b)["error"]["type"] == "invalid_request_error"
    conn = http.client.HTTPConnection(up.host, up.port, timeout=2)
    conn.request("GET", CHAT)
    assert conn.getresponse().status == 405
    conn.close()


# ---------------------------------------------------------------- streaming

def read_sse(resp, deadline_s=2.0):
    """[(arrival_time, payload)] for every `data:` line of a streaming response."""
    events = []
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        line = resp.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            events.append((time.monotonic(), line[6:].strip()))
    return events


@pytest.mark.timing
def test_stream_arrives_incrementally(up):
    conn = http.client.HTTPConnection(up.host, up.port, timeout=2)
    body = chat_body("abcdefgh", stream=True,
                     mock={"stream_events": 4, "stream_interval_ms": 150})
    t0 = time.monotonic()
    conn.request("POST", CHAT, body=json.dumps(body))
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("Content-Type") == "text/event-stream"
    assert resp.getheader("Transfer-Encoding") == "chunked"
    events = read_sse(resp)
    conn.close()
    payloads = [p for _, p in events]
    assert payloads[-1] == b"[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert len(chunks) == 5          # 4 content events + the finish chunk
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "abcdefgh"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["total_tokens"] > 0
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    # content events at 0, 150, 300, 450 ms; finish chunk + [DONE] at 600 ms
    first, last = events[0][0] - t0, events[-1][0] - t0
    assert first < 0.12, "first event should come at once, came after %.3fs" % first
    assert last - first >= 0.5, "events should be ~150 ms apart (span %.3fs)" % (last - first)
    assert events[1][0] - events[0][0] >= 0.1


def test_stream_include_usage_separate_chunk_and_no_done(up):
    conn = http.client.HTTPConnection(up.host, up.port, timeout=2)
    conn.request("POST", CHAT, body=json.dumps(chat_body(
        "xyz", stream=True, stream_options={"include_usage": True})))
    payloads = [p for _, p in read_sse(conn.getresponse())]
    conn.close()
    assert payloads[-1] == b"[DONE]"
    fin, usage = json.loads(payloads[-3]), json.loads(payloads[-2])
    assert fin["choices"][0]["finish_reason"] == "stop" and "usage" not in fin
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] > 0

    conn = http.client.HTTPConnection(up.host, up.port, timeout=2)
    conn.request("POST", CHAT, body=json.dumps(chat_body(
        "xyz", stream=True, mock={"no_done": True, "stream_events": 3})))
    payloads = [p for _, p in read_sse(conn.getresponse())]
    conn.close()
    assert len(payloads) == 3 and b"[DONE]" not in payloads
    assert all(json.loads(p)["choices"][0]["finish_reason"] is None for p in payloads)


# ------------------------------------------------------------------- errors

def test_429_with_retry_after_number_and_string(up):
    up.script([{"status": 429, "retry_after": 7},
               {"status": 429, "retry_after": "Wed, 21 Oct 2015 07:28:00 GMT"},
               {"status": 429}])
    st, hdr, body = post(up, CHAT, chat_body())
    assert st == 429 and hdr["retry-after"] == "7"
    err = json.loads(body)["error"]
    assert err["type"] == "rate_limit_error" and err["message"]
    st, hdr, _ = post(up, CHAT, chat_body())
    assert st == 429 and hdr["retry-after"] == "Wed, 21 Oct 2015 07:28:00 GMT"
    st, hdr, _ = post(up, CHAT, chat_body())
    assert st == 429 and "retry-after" not in hdr
    assert up.stats()["by_status"] == {"429": 3}


def test_500_and_custom_error_and_raw_body(up):
    st, _, body = post(up, CHAT, chat_body(mock={"status": 500}))
    assert st == 500 and json.loads(body)["error"]["type"] == "server_error"
    st, hdr, body = post(up, CHAT, chat_body(mock={
        "status": 401, "error_message": "bad key", "error_type": "auth",
        "headers": {"X-Extra": "1"}}))
    assert st == 401 and hdr["x-extra"] == "1"
    assert json.loads(body)["error"]["message"] == "bad key"
    st, hdr, body = post(up, CHAT, chat_body(mock={"body": "<html>oops", "content_type": "text/html",
                                                   "status": 502}))
    assert (st, hdr["content-type"], body) == (502, "text/html", b"<html>oops")


def test_invalid_behaviour_is_rejected(up):
    st, _, body = post(up, CHAT, chat_body(mock={"stauts": 500}))
    assert st == 400 and "stauts" in json.loads(body)["error"]["message"]
    with pytest.raises(RuntimeError, match="queue\\[1\\]"):
        up.script([{}, {"hang": "sometimes"}])
    with pytest.raises(RuntimeError):
        up.set_default({"delay_ms": -1})
    assert up.stats()["queue_len"] == 0


# -------------------------------------------------------------------- hangs

def test_hang_before_headers_client_times_out(up):
    up.script([{"hang": "before_headers"}])
    conn = http.client.HTTPConnection(up.host, up.port, timeout=0.3)
    conn.request("POST", CHAT, body=json.dumps(chat_body()))
    t0 = time.monotonic()
    with pytest.raises(socket.timeout):
        conn.getresponse()
    assert time.monotonic() - t0 >= 0.25
    st = up.stats()
    assert st["in_progress"] == 1 and st["open_connections"] == 1
    conn.close()
    st = up.wait_stats(lambda s: s["open_connections"] == 0)
    assert st["closed_by_peer"] == 1 and st["aborted_by_peer"] == 1 and st["in_progress"] == 0


def test_hang_after_headers(up):
    conn = http.client.HTTPConnection(up.host, up.port, timeout=0.3)
    conn.request("POST", CHAT, body=json.dumps(chat_body(mock={"hang": "after_headers"})))
    resp = conn.getresponse()
    assert resp.status == 200 and int(resp.getheader("Content-Length")) > 0
    with pytest.raises(socket.timeout):
        resp.read()
    conn.close()
    st = up.wait_stats(lambda s: s["open_connections"] == 0)
    assert st["aborted_by_peer"] == 1 and st["by_status"] == {"200": 1}


def test_hang_accept_never_reads(up):
    up.set_default({"hang": "accept"})
    s = connect(up, timeout=0.3)
    s.sendall(raw_request(CHAT, chat_body()))
    with pytest.raises(socket.timeout):
        s.recv(100)
    # control requests on new connections still work while the default hangs API requests
    st = up.stats()
    assert st["requests"] == 1 and st["in_progress"] == 1 and st["open_connections"] == 1
    assert st["by_path"] == {CHAT: 1}
    s.close()
    st = up.wait_stats(lambda s: s["open_connections"] == 0)
    assert st["aborted_by_peer"] == 1 and st["in_progress"] == 0


def test_hang_ms_closes_from_the_server(up):
    up.script([{"hang": "before_headers", "hang_ms": 150}, {"hang": "accept", "hang_ms": 150}])
    for _ in range(2):
        s = connect(up)
        s.sendall(raw_request(CHAT, chat_body()))
        t0 = time.monotonic()
        try:
            data = s.recv(100)
        except ConnectionResetError:     # accept-hang closes with the request unread
            data = b""
        assert data == b""
        assert 0.1 <= time.monotonic() - t0 < 1.0
        s.close()
    st = up.wait_stats(lambda s: s["closed_connections"] == 2)
    assert st["closed_by_peer"] == 0


@pytest.mark.timing
def test_many_concurrent_hanging_connections(up):
    up.set_default({"hang": "before_headers"})
    socks = []
    try:
        for _ in range(200):
            s = connect(up)
            s.sendall(raw_request(CHAT, chat_body()))
            socks.append(s)
        st = up.wait_stats(lambda s: s["in_progress"] == 200)
        assert st["open_connections"] == 200
        up.set_default(None)
        st, _, _ = post(up, CHAT, chat_body())      # still answers normally
        assert st == 200
    finally:
        for s in socks:
            s.close()
    st = up.wait_stats(lambda s: s["open_connections"] == 0)
    assert st["aborted_by_peer"] == 200


# ------------------------------------------------------------------- pacing

def test_delay_ms(up):
    t0 = time.monotonic()
    st, _, _ = post(up, CHAT, chat_body(mock={"delay_ms": 200}))
    assert st == 200 and 0.19 <= time.monotonic() - t0 < 1.0


def test_trickle_timing(up):
    s = connect(up)
    s.sendall(raw_request(CHAT, chat_body(mock={"body": "0123456789", "trickle_ms": 30})))
    got, times = b"", []
    t0 = time.monotonic()
    while not got.endswith(b"0123456789") and time.monotonic() - t0 < 2:
        chunk = s.recv(100)
        assert chunk
        got += chunk
        times.append(time.monotonic())
    s.close()
    assert got.endswith(b"\r\n\r\n0123456789")
    assert len(times) >= 8                    # arrives in pieces, not at once
    assert times[-1] - t0 >= 9 * 0.03 * 0.9   # ten bytes, one every 30 ms


def test_close_after_bytes_cuts_the_body(up):
    s = connect(up)
    s.sendall(raw_request(CHAT, chat_body(mock={"close_after_bytes": 20})))
    data = recv_until_close(s)
    s.close()
    head, body = data.split(b"\r\n\r\n", 1)
    assert len(body) == 20 and int(dict(
        l.split(b": ", 1) for l in head.split(b"\r\n")[1:])[b"Content-Length"]) > 20
    conn = http.client.HTTPConnection(up.host, up.port, timeout=2)
    conn.request("POST", CHAT, body=json.dumps(chat_body(
        "abcdefghijklmnopqrstuvwxyz", stream=True, mock={"close_after_bytes": 300})))
    resp = conn.getresponse()
    with pytest.raises(http.client.IncompleteRead):
        resp.read()
    conn.close()
    st = up.stats()
    assert st["closed_by_peer"] == 0 and st["closed_connections"] == 2


def test_no_length_framing(up):
    s = connect(up)
    s.sendall(raw_request(CHAT, chat_body("plain", mock={"no_length": True})))
    data = recv_until_close(s)
    s.close()
    head, body = data.split(b"\r\n\r\n", 1)
    assert b"Content-Length" not in head and b"Transfer-Encoding" not in head
    assert b"Connection: close" in head
    assert json.loads(body)["choices"][0]["message"]["content"] == "plain"

    s = connect(up)
    s.sendall(raw_request(CHAT, chat_body("cut", stream=True,
                                          mock={"no_length": True, "no_done": True})))
    data = recv_until_close(s)
    s.close()
    head, body = data.split(b"\r\n\r\n", 1)
    assert b"Transfer-Encoding" not in head and body.startswith(b"data: {")
    assert b"[DONE]" not in body and b"finish_reason\":\"stop" not in body


# ------------------------------------------------------------------ scripting

def test_queue_ordering_and_default(up):
    assert up.script([{}, {}, {"status": 500}]) == 3
    codes = [post(up, CHAT, chat_body())[0] for _ in range(4)]
    assert codes == [200, 200, 500, 200]
    up.set_default({"status": 503})
    up.script([{"status": 429}])
    codes = [post(up, CHAT, chat_body())[0] for _ in range(3)]
    assert codes == [429, 503, 503]
    # a body "mock" overrides, but still consumes the queue entry
    up.script([{"status": 500}, {"status": 502}], append=False)
    assert post(up, CHAT, chat_body(mock={}))[0] == 200
    assert post(up, CHAT, chat_body())[0] == 502
    st = up.stats()
    assert st["requests"] == 9 and st["queue_len"] == 0 and st["has_default"]


def test_stats_open_and_closed_by_peer(up):
    conns = []
    for i in range(3):
        c = http.client.HTTPConnection(up.host, up.port, timeout=2)
        c.request("POST", CHAT, body=json.dumps(chat_body(str(i))))
        assert c.getresponse().read()
        conns.append(c)
    st = up.stats()
    assert (st["open_connections"], st["accepted_connections"], st["in_progress"]) == (3, 3, 0)
    assert st["tcp_open"] == 3      # the stats call's own connection is not counted
    # keep-alive: a second request on the same connection is not a new connection
    conns[0].request("POST", CHAT, body=json.dumps(chat_body()))
    conns[0].getresponse().read()
    assert up.stats()["accepted_connections"] == 3
    conns[1].close()
    st = up.wait_stats(lambda s: s["closed_by_peer"] == 1)
    assert st["open_connections"] == 2 and st["aborted_by_peer"] == 0
    for c in conns:
        c.close()
    up.wait_stats(lambda s: s["open_connections"] == 0)


def test_reset(up):
    up.script([{"status": 500}] * 3)
    up.set_default({"status": 503})
    post(up, CHAT, chat_body())
    s = connect(up)
    s.sendall(raw_request(CHAT, chat_body(mock={"hang": True})))
    up.wait_stats(lambda s: s["in_progress"] == 1)
    up.reset(drop_connections=True)
    assert s.recv(10) == b""       # dropped by the mock
    s.close()
    st = up.stats()
    assert st["requests"] == 0 and st["queue_len"] == 0 and not st["has_default"]
    assert st["by_path"] == {} and st["by_status"] == {} and st["open_connections"] == 0
    assert up.last() is None and up.requests() == []
    assert post(up, CHAT, chat_body())[0] == 200


def test_history(up):
    for i in range(3):
        post(up, CHAT, chat_body("m%d" % i), headers={"Authorization": "Bearer k%d" % i})
    reqs = up.requests()
    assert [r["authorization"] for r in reqs] == ["Bearer k0", "Bearer k1", "Bearer k2"]
    assert up.last()["json"]["messages"][0]["content"] == "m2"


# ------------------------------------------------------------------ HTTP edges

def test_keepalive_pipelined_and_chunked_request(up):
    s = connect(up)
    s.sendall(raw_request(CHAT, chat_body("one")) + raw_request(CHAT, chat_body("two")))
    buf = b""
    t0 = time.monotonic()
    while buf.count(b"chat.completion") < 2 and time.monotonic() - t0 < 2:
        buf += s.recv(65536)
    assert b'"content":"one"' in buf and b'"content":"two"' in buf
    body = json.dumps(chat_body("chunked!")).encode()
    req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
           b"Connection: close\r\n\r\n" + b"%x\r\n%s\r\n" % (10, body[:10])
           + b"%x;ext=1\r\n%s\r\n" % (len(body) - 10, body[10:]) + b"0\r\n\r\n")
    s.sendall(req)
    data = recv_until_close(s)
    s.close()
    assert b'"content":"chunked!"' in data and b"Connection: close" in data


def test_expect_100_continue(up):
    s = connect(up)
    body = json.dumps(chat_body("continued")).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body))
    assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    s.sendall(body)
    recv_until(s, lambda got: b"continued" in got)
    s.close()


def test_limits_431_and_413(up):
    s = connect(up)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n")
    data = recv_until_close(s)
    s.close()
    assert data.startswith(b"HTTP/1.1 431 ")
    s = connect(up)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 70000000\r\n\r\n")
    data = recv_until_close(s)
    s.close()
    assert data.startswith(b"HTTP/1.1 413 ")
    s = connect(up)
    s.sendall(b"GARBAGE\r\n\r\n")
    assert recv_until_close(s).startswith(b"HTTP/1.1 400 ")
    s.close()
    assert post(up, CHAT, chat_body())[0] == 200


def test_client_closes_mid_response(up):
    body = "x" * 200000
    for _ in range(5):
        s = connect(up)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(raw_request(CHAT, chat_body(mock={"body": body, "trickle_ms": 5,
                                                    "trickle_bytes": 1000})))
        assert s.recv(100)
        s.close()
    up.wait_stats(lambda s: s["open_connections"] == 0 and s["in_progress"] == 0)
    assert post(up, CHAT, chat_body())[0] == 200


# ------------------------------------------------- framing and raw answers

# Bytes read past one response (a pipelined answer that came in the same
# recv), kept for the next read_response on that socket.
_LEFTOVER = weakref.WeakKeyDictionary()


def read_response(s, limit=1 << 22, timeout=2.0):
    """One response read off socket s by its framing (Content-Length or
    chunked; 1xx heads skipped): (interim statuses, head bytes, body bytes).
    Bytes of a following response stay for the next call."""
    buf, interim = _LEFTOVER.pop(s, b""), []
    deadline = time.monotonic() + timeout

    def more():
        assert time.monotonic() < deadline and len(buf) < limit, "no complete response"
        chunk = s.recv(65536)
        assert chunk, "closed early"
        return chunk
    while True:
        while b"\r\n\r\n" not in buf:
            buf += more()
        head, buf = buf.split(b"\r\n\r\n", 1)
        status = int(head.split(b" ", 2)[1])
        if status >= 200:
            break
        interim.append(status)
    fields = {ln.split(b":", 1)[0].lower(): ln.split(b":", 1)[1].strip()
              for ln in head.split(b"\r\n")[1:]}
    if b"content-length" in fields:
        n = int(fields[b"content-length"])
        while len(buf) < n:
            buf += more()
        _LEFTOVER[s] = buf[n:]
        return interim, head, buf[:n]
    assert fields.get(b"transfer-encoding") == b"chunked", head
    body = b""
    while True:
        while b"\r\n" not in buf:
            buf += more()
        size_line, buf = buf.split(b"\r\n", 1)
        n = int(size_line, 16)
        while len(buf) < n + 2:
            buf += more()
        if n == 0:
            _LEFTOVER[s] = buf[2:]  # past the empty trailer's CRLF
            return interim, head, body
        body, buf = body + buf[:n], buf[n + 2:]


def test_chunked_plain_answer(up):
    s = connect(up)
    s.sendall(raw_request(CHAT, chat_body("c" * 40000, mock={"chunked": True})))
    s.sendall(raw_request(CHAT, chat_body("again")))          # still keep-alive
    _, head, body = read_response(s)
    assert b"Transfer-Encoding: chunked" in head and b"Content-Length" not in head
    assert json.loads(body)["choices"][0]["message"]["content"] == "c" * 40000
    _, head, body = read_response(s)
    assert b"Content-Length" in head and b'"again"' in body
    s.close()
    # chunks of 1, 2, 4 ... bytes: the wire shows the small sizes first
    s = connect(up)
    s.sendall(raw_request(CHAT, chat_body(mock={"chunked": True, "body": "0123456789"})))
    data = recv_until(s, lambda d: d.endswith(b"\r\n0\r\n\r\n"))
    s.close()
    assert data.endswith(b"\r\n\r\n1\r\n0\r\n2\r\n12\r\n4\r\n3456\r\n3\r\n789\r\n0\r\n\r\n"), data


def test_interim_answers_come_first(up):
    s = connect(up)
    s.sendall(raw_request(CHAT, chat_body("final", mock={"interim": [100, 103]})))
    data = recv_until(s, lambda d: b'"final"' in d)
    s.close()
    assert data.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n"
                           b"Link: </hint.css>; rel=preload; as=style\r\n\r\nHTTP/1.1 200 OK\r\n")
    s = connect(up)
    s.sendall(raw_request(CHAT, chat_body(mock={"interim": [102], "status": 429})))
    interim, head, _ = read_response(s)
    s.close()
    assert interim == [102] and head.startswith(b"HTTP/1.1 429 ")
    assert up.stats()["by_status"] == {"200": 1, "429": 1}
    for bad in ([101], [99], [200], "100", [100] * 9):
        st, _, body = post(up, CHAT, chat_body(mock={"interim": bad}))
        assert st == 400 and "interim" in json.loads(body)["error"]["message"]


def test_connection_close_answer(up):
    s = connect(up)
    s.sendall(raw_request(CHAT, chat_body("bye", mock={"connection_close": True})))
    data = recv_until_close(s)                 # the mock closes after the answer
    s.close()
    head, body = data.split(b"\r\n\r\n", 1)
    assert b"Connection: close" in head and b"Content-Length: %d" % len(body) in head
    st = up.stats()
    assert st["closed_connections"] == 1 and st["closed_by_peer"] == 0


def test_raw_response_sent_verbatim(up):
    blob = b"HTTP/1.1 200 OK\r\nX-Odd:  spaced \r\nContent-Length: 3\r\n\r\nabc" + b"\x00\xffjunk"
    s = connect(up)
    s.sendall(raw_request(CHAT, chat_body(mock={"raw_hex": blob.hex()})))
    assert recv_until_close(s) == blob         # then closed
    s.close()
    # raw_keep: the connection stays for the next request
    s = connect(up)
    s.sendall(raw_request(CHAT, chat_body(mock={"raw_hex": b"not http\r\n".hex(),
                                                 "raw_keep": True})))
    assert s.recv(100) == b"not http\r\n"
    s.sendall(raw_request(CHAT, chat_body("next")))
    _, _, body = read_response(s)
    assert b'"next"' in body
    s.close()
    st = up.wait_stats(lambda s: s["open_connections"] == 0)
    assert st["requests"] == 3 and st["accepted_connections"] == 2
    assert st["by_status"] == {"200": 2}       # "not http" has no status
    # the pacing fields act on it: close_after_bytes counts after the blank line
    s = connect(up)
    s.sendall(raw_request(CHAT, chat_body(mock={"raw_hex": blob.hex(), "close_after_bytes": 2})))
    assert recv_until_close(s) == blob[:blob.index(b"\r\n\r\n") + 6]
    s.close()
    for bad in ("", "abc", "zz", 5):
        st, _, body = post(up, CHAT, chat_body(mock={"raw_hex": bad}))
        assert st == 400 and "raw_hex" in json.loads(body)["error"]["message"]


def test_trickle_headers(up):
    s = connect(up)
    s.sendall(raw_request(CHAT, chat_body(mock={"trickle_ms": 100, "trickle_bytes": 1,
                                                "trickle_headers": True})))
    t0 = time.monotonic()
    assert [s.recv(100) for _ in range(3)] == [b"H", b"T", b"T"]   # the status line too
    assert time.monotonic() - t0 >= 2 * 0.1 * 0.9
    s.close()
    s = connect(up)
    s.sendall(raw_request(CHAT, chat_body("t", mock={"trickle_ms": 1, "trickle_bytes": 7,
                                                      "trickle_headers": True})))
    _, head, body = read_response(s, timeout=5)
    s.close()
    assert json.loads(body)["choices"][0]["message"]["content"] == "t"
    st, _, body = post(up, CHAT, chat_body(mock={"trickle_headers": True}))
    assert st == 400 and "needs trickle_ms" in json.loads(body)["error"]["message"]
    st, _, body = post(up, CHAT, chat_body(mock={"chunked": 1}))
    assert st == 400 and "chunked" in json.loads(body)["error"]["message"]


def test_history_keeps_the_raw_head(up):
    post(up, CHAT, chat_body(), headers={"X-One": "1", "x-one": "2"})
    head = up.last()["head"]
    assert head.startswith("POST %s HTTP/1.1\r\n" % CHAT) and head.endswith("\r\n\r\n")
    assert "\r\nX-One: 1\r\n" in head and up.last()["headers"]["x-one"] == "1, 2"

"""Bounds and request hygiene of the HTTP front end (sidecar/http/http.c,
docs/HTTP.md §7) through the real sidecar, raw sockets and the real mock
upstream: each connection's output budget against a client that pipelines
and never reads, the global bound on unfinished bodies, routing and
authentication decided from the headers before any body byte is kept,
cross-origin requests, chunked trailers, and strict header names.

Memory is read from /proc/<pid>/status as in test_bounds.py: VmHWM (the
peak resident set) after the abuse against VmRSS before it, with ASan's
quarantine off so that freed blocks do not count.
"""
import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import chat  # noqa: E402
from test_http import front, read_response, is_closed  # noqa: E402,F401

MIB = 1 << 20
ASAN_ENV = {"ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "detect_leaks=1") +
            ":quarantine_size_mb=0"}


def status_kb(pid, field):
    for line in open("/proc/%d/status" % pid):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError("no %s in /proc/%d/status" % (field, pid))


def http_stats(f):
    """The `http` part of the msgpack `stats` result."""
    c = f.sc.connect()
    try:
        return c.request("stats", timeout=60)[1]["http"]
    finally:
        c.close()


def wait_stable(read, settle=0.5, timeout=60.0):
    """Polls read() until it returns the same value over `settle` seconds."""
    deadline = time.monotonic() + timeout
    last, since = read(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        v = read()
        if v != last:
            last, since = v, time.monotonic()
        elif time.monotonic() - since >= settle:
            return v
    return last


def request(method, path, host="127.0.0.1", headers=(), body=b""):
    """The bytes of one request; Content-Length added when there is a body."""
    lines = ["%s %s HTTP/1.1" % (method, path), "Host: %s" % host]
    lines += list(headers)
    if body:
        lines.append("Content-Length: %d" % len(body))
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def timed_get(f, path="/healthz"):
    """(status, seconds) of one GET on a new connection."""
    t0 = time.monotonic()
    s = f.raw()
    try:
        s.sendall(request("GET", path))
        status, _, _ = read_response(s)
    finally:
        s.close()
    return status, time.monotonic() - t0


# ------------------------------------------------ the output budget (pipelining)
PIPELINED = 6000
OUT_BUDGET = 1 * MIB


def test_http_bounds__pipelined_answers_stay_within_the_output_budget(front, up):
    """6,000 pipelined GET /metrics on one connection that never reads: the
    front stops parsing it once its queued answers pass
    listen.max_write_queue_bytes, so memory grows by about the budget, not
    by 6,000 answers; another connection is served meanwhile; every answer
    arrives, in order, once the client reads."""
    f = front(listen={"max_message_bytes": OUT_BUDGET, "max_write_queue_bytes": OUT_BUDGET},
              env=ASAN_ENV)
    pid = f.sc.proc.pid
    s = f.raw()
    s.sendall(request("GET", "/metrics"))
    status, _, one = read_response(s)
    assert status == 200
    rss0 = status_kb(pid, "VmRSS")

    s.sendall(request("GET", "/metrics") * PIPELINED)
    parsed = wait_stable(lambda: http_stats(f)["requests"])
    status, healthy_s = timed_get(f)
    assert status == 200
    peak = status_kb(pid, "VmHWM")
    rss1 = status_kb(pid, "VmRSS")
    growth = (peak - rss0) * 1024
    print("metrics answer %d bytes; parsed %d of %d; VmRSS %d -> %d kB, VmHWM %d kB "
          "(growth %.1f MiB); healthy call %.1f ms"
          % (len(one), parsed - 1, PIPELINED, rss0, rss1, peak, growth / MIB, healthy_s * 1000))
    assert growth < OUT_BUDGET + 8 * MIB, "grew %.1f MiB" % (growth / MIB)
    assert parsed - 1 < PIPELINED
    assert healthy_s < 1.0

    # Every answer comes, in order, as the client reads.
    for i in range(PIPELINED):
        status, _, body = read_response(s, timeout=30)
        assert status == 200, i
        assert body.startswith(b"# HELP"), i
    s.close()


# ------------------------------------------------------------ configurations
APP_TOKEN = "tok-bounds-5b7e1c9a3d2f4068"


def tokens_front(front, http=None, listen=None):
    """A front where app `tok` has a token (so a TCP request needs it) and
    app `other` exists but may not be declared by anyone."""
    return front(http=http, listen=listen, env=dict(ASAN_ENV, PGW_TEST_APP_TOKEN=APP_TOKEN),
                 extra="apps:\n  - {name: tok, token_env: PGW_TEST_APP_TOKEN}\n"
                       "  - {name: other, uids: [54321]}\n")


def chunked(body, trailers=()):
    """`body` as one chunk, the last chunk, then `trailers`."""
    return (b"%x\r\n" % len(body) + body + b"\r\n0\r\n" +
            b"".join(t.encode() + b"\r\n" for t in trailers) + b"\r\n")


def error_of(s):
    """(status, X-Polygw-Code, the error object or the whole body) of the
    next answer on `s`."""
    status, hdrs, body = read_response(s)
    doc = json.loads(body) if body else None
    return status, hdrs.get("x-polygw-code"), doc.get("error", doc) if doc else None


# ------------------------------------------------------------ chunked trailers
def test_http_bounds__trailers_never_become_headers(front, up):
    """A trailer is not a header: a token only in a trailer does not
    authenticate, and a trailer X-Polygw-App is not a declaration."""
    f = tokens_front(front)
    body = json.dumps(chat("trailers")).encode()
    head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n")
    seen = up.stats()["requests"]

    s = f.raw()
    s.sendall(head.encode() + b"\r\n" +
              chunked(body, ["Authorization: Bearer " + APP_TOKEN]))
    status, code, err = error_of(s)
    assert status == 401 and code == "bad_request", (status, err)

    # With the token in the header, a trailer X-Polygw-App (an app `tok`
    # may not declare) changes nothing.
    s = f.raw()
    s.sendall((head + "Authorization: Bearer %s\r\n\r\n" % APP_TOKEN).encode() +
              chunked(body, ["X-Polygw-App: other", "X-Polygw-Deadline: nonsense"]))
    status, hdrs, answer = read_response(s)
    assert status == 200, answer
    assert up.stats()["requests"] == seen + 1
    s.close()


# ------------------------------------------------------- strict header names
BAD_HEADS = {
    "space before the colon, Content-Length":
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent-Length : %(n)d\r\n\r\n%(body)s",
    "space before the colon, Transfer-Encoding":
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding : chunked\r\n\r\n"
        "%(hex)s\r\n%(body)s\r\n0\r\n\r\n",
    "tab before the colon":
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type\t: application/json\r\nContent-Length: %(n)d\r\n\r\n%(body)s",
    "obs-fold":
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nX-Polygw-Scope: a\r\n b\r\n"
        "Content-Length: %(n)d\r\n\r\n%(body)s",
    "obs-fold after an empty value":
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nX-Polygw-Scope:\r\n\tb\r\n"
        "Content-Length: %(n)d\r\n\r\n%(body)s",
    "bare CR ending a header line":
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nX-Junk: a\rContent-Length: %(n)d\r\n\r\n%(body)s",
    "space inside a name":
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent Length: %(n)d\r\n\r\n%(body)s",
}


def test_http_bounds__header_names_are_matched_strictly(front, up):
    """RFC 9112 §5.1 and §5.2: whitespace between a field name and its colon,
    a folded line, and a bare CR are 400 and the connection is closed; none
    reaches the upstream. The same bytes split one by one across reads are
    refused the same way."""
    f = front()
    body = json.dumps(chat("strict")).encode().decode()
    seen = up.stats()["requests"]
    for name, tmpl in BAD_HEADS.items():
        raw = (tmpl % {"n": len(body), "hex": "%x" % len(body), "body": body}).encode()
        for split in (False, True):
            s = f.raw()
            if split:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for i in range(0, len(raw), 7):
                    s.sendall(raw[i:i + 7])
            else:
                s.sendall(raw)
            status, code, err = error_of(s)
            assert status == 400 and code == "bad_request", (name, split, status, err)
            assert is_closed(s), name
            s.close()
    assert up.stats()["requests"] == seen
    # A correct request on a new connection is served.
    s = f.raw()
    s.sendall(request("POST", "/v1/chat/completions", headers=["Content-Type: application/json"],
                      body=body.encode()))
    assert read_response(s)[0] == 200
    s.close()


# --------------------------------------------- unfinished bodies, all connections
IN_BUDGET = 32 * MIB
BODY = 15 * 1000 * 1000
STALLERS = 30


def msgpack_stats(f):
    c = f.sc.connect()
    try:
        return c.request("stats", timeout=30)[1]
    finally:
        c.close()


def stall_body(f, results, i, headers=("Content-Type: application/json",)):
    """Sends a head announcing BODY + 1000 bytes, then BODY bytes, then
    stops; records the answer (or how the connection ended)."""
    s = f.raw(timeout=30)
    head = request("POST", "/v1/chat/completions", headers=list(headers) +
                   ["Content-Length: %d" % (BODY + 1000)])
    try:
        s.sendall(head)
        chunk = b"x" * (1 << 20)
        sent = 0
        while sent < BODY:
            n = min(len(chunk), BODY - sent)
            s.sendall(chunk[:n])
            sent += n
        results[i] = ("stalled", sent, s)
    except OSError as e:
        results[i] = ("refused", e, s)


def test_http_bounds__unfinished_bodies_share_the_input_budget(front, up):
    """30 clients each send 15 MB of a longer body and stall: the bodies
    held across all HTTP connections stay within
    listen.max_buffered_input_bytes, the connection holding the most is
    refused (503 overloaded) each time the total passes it, and a call on
    another connection is served meanwhile."""
    f = front(listen={"max_message_bytes": 1 * MIB, "max_buffered_input_bytes": IN_BUDGET},
              http={"body_timeout_s": 30, "max_body_bytes": 16 * MIB}, env=ASAN_ENV)
    pid = f.sc.proc.pid
    assert timed_get(f)[0] == 200
    rss0 = status_kb(pid, "VmRSS")

    results = [None] * STALLERS
    threads = [threading.Thread(target=stall_body, args=(f, results, i))
               for i in range(STALLERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    peak = status_kb(pid, "VmHWM")
    rss1 = status_kb(pid, "VmRSS")

    s = f.raw()
    body = json.dumps(chat("meanwhile")).encode()
    t0 = time.monotonic()
    s.sendall(request("POST", "/v1/chat/completions",
                      headers=["Content-Type: application/json"], body=body))
    status, _, _ = read_response(s)
    healthy_s = time.monotonic() - t0
    s.close()

    refused = msgpack_stats(f)["connections"]["input_refused"]
    growth = (peak - rss0) * 1024
    print("%d bodies of %d bytes, budget %d MiB: %d refused; VmRSS %d -> %d kB, VmHWM %d kB "
          "(growth %.1f MiB); healthy call %.1f ms"
          % (STALLERS, BODY, IN_BUDGET // MIB, refused, rss0, rss1, peak, growth / MIB,
             healthy_s * 1000))
    assert status == 200
    # Beyond the bodies: a body buffer being doubled, the read buffers, and
    # ASan's shadow (an eighth of what is touched).
    assert growth < IN_BUDGET * 5 // 4 + 16 * MIB, "grew %.1f MiB" % (growth / MIB)
    assert refused >= STALLERS - IN_BUDGET // BODY
    # The refused ones were told why.
    told = 0
    for r in results:
        s = r[2]
        try:
            st, hdrs, _ = read_response(s, timeout=5)
            if st == 503 and hdrs.get("x-polygw-code") == "overloaded":
                told += 1
        except (OSError, EOFError):
            pass
        s.close()
    assert told >= STALLERS - IN_BUDGET // BODY - 2, told


def test_http_bounds__auth_and_routing_are_decided_before_the_body(front, up):
    """With app tokens configured, a POST without one gets its 401 as soon
    as its head is read, before any byte of its 15 MB body is sent; so do
    an unknown path (404), a method a path does not take (405) and a
    wrong Content-Type (415). Sending the bodies afterwards costs the
    sidecar no memory, and nothing reaches the upstream."""
    f = tokens_front(front, listen={"max_message_bytes": 1 * MIB,
                                    "max_buffered_input_bytes": IN_BUDGET})
    pid = f.sc.proc.pid
    seen = up.stats()["requests"]
    cases = [("/v1/chat/completions", ["Content-Type: application/json"], 401, "bad_request"),
             ("/v1/chat/completions", ["Content-Type: application/json",
                                       "Authorization: Bearer not-a-token-of-any-app"],
              401, "bad_request"),
             ("/v1/nowhere", ["Content-Type: application/json",
                              "Authorization: Bearer " + APP_TOKEN], 404,
              "unknown_capability"),
             ("/metrics", ["Content-Type: application/json"], 405, "unknown_method"),
             ("/v1/chat/completions", ["Content-Type: text/plain",
                                       "Authorization: Bearer " + APP_TOKEN], 415,
              "bad_request")]
    rss0 = status_kb(pid, "VmRSS")
    socks = []
    for i in range(STALLERS):
        path, headers, want, code = cases[i % len(cases)]
        s = f.raw(timeout=10)
        s.sendall(request("POST", path, headers=headers + ["Content-Length: %d" % BODY]))
        status, hdrs, body = read_response(s, timeout=10)
        assert (status, hdrs.get("x-polygw-code")) == (want, code), (path, headers, body)
        assert hdrs.get("connection") == "close"
        socks.append(s)
    # The bodies come anyway: read and dropped, or refused by a close.
    def send_body(s):
        try:
            chunk = b"y" * (1 << 20)
            for _ in range(BODY // len(chunk)):
                s.sendall(chunk)
        except OSError:
            pass
    threads = [threading.Thread(target=send_body, args=(s,)) for s in socks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    growth = (status_kb(pid, "VmHWM") - rss0) * 1024
    print("%d refused heads with 15 MB bodies: VmHWM growth %.1f MiB" % (STALLERS, growth / MIB))
    assert growth < 8 * MIB, "grew %.1f MiB" % (growth / MIB)
    for s in socks:
        assert is_closed(s, timeout=5)
        s.close()
    assert up.stats()["requests"] == seen
    # A refusal of a request without a body keeps the connection.
    s = f.raw()
    s.sendall(request("GET", "/nowhere") + request("GET", "/healthz"))
    assert read_response(s)[0] == 404
    assert read_response(s)[0] == 200
    s.close()


# ------------------------------------------------------- cross-origin requests
EVIL = "http://evil.example"


def test_http_bounds__browser_requests_from_other_origins_are_refused(front, up):
    """A page of another origin cannot drive the front: a foreign Origin,
    `Origin: null`, Sec-Fetch-Site cross-site or same-site, a Host that is
    not the front's (DNS rebinding), and a POST without or with another
    Content-Type are refused (403 / 415) before reaching the upstream.
    Non-browser requests, same-origin requests, a link followed to the
    status page, and the origins and host names the configuration allows
    are served; an allowed origin gets CORS headers and its preflight."""
    f = front(http={"allowed_origins": ["http://localhost:3000"],
                    "allowed_hosts": ["polygw.internal"]})
    own = "127.0.0.1:%d" % f.port
    body = json.dumps(chat("origin")).encode()
    json_ct = ["Content-Type: application/json"]
    seen = up.stats()["requests"]

    def answer(method, path, headers, host=own, unix=False, payload=body):
        if unix:
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(10)
            s.connect(f.hsock)
        else:
            s = f.raw()
        s.sendall(request(method, path, host=host, headers=headers,
                          body=payload if method == "POST" else b""))
        status, hdrs, text = read_response(s)
        s.close()
        return status, hdrs, text

    refused = [
        (["Origin: " + EVIL] + json_ct, own, 403),
        (["Origin: null"] + json_ct, own, 403),
        (["Origin: http://127.0.0.1:1"] + json_ct, own, 403),     # another loopback port
        (["Origin: https://localhost:3000.evil.example"] + json_ct, own, 403),
        (["Sec-Fetch-Site: cross-site", "Sec-Fetch-Mode: no-cors"] + json_ct, own, 403),
        (["Sec-Fetch-Site: same-site", "Sec-Fetch-Mode: cors"] + json_ct, own, 403),
        (json_ct, "evil.example:%d" % f.port, 403),                  # DNS rebinding
        (["Origin: http://evil.example:%d" % f.port] + json_ct, "evil.example:%d" % f.port, 403),
        (json_ct, "127.0.0.1.evil.example", 403),
        ([], own, 415),                                              # no Content-Type
        (["Content-Type: text/plain"], own, 415),
        (["Content-Type: application/x-www-form-urlencoded"], own, 415),
    ]
    for headers, host, want in refused:
        status, hdrs, text = answer("POST", "/v1/chat/completions", headers, host=host)
        assert status == want, (headers, host, status, text)
        assert hdrs.get("x-polygw-code") == "bad_request"
        assert "access-control-allow-origin" not in hdrs
        err = json.loads(text)["error"]
        assert err["type"] == ("permission_error" if want == 403 else "invalid_request_error")
    # The Unix socket checks Origin too, not Host.
    assert answer("POST", "/v1/chat/completions", ["Origin: " + EVIL] + json_ct,
                  host="polygw", unix=True)[0] == 403
    assert up.stats()["requests"] == seen

    served = [
        (json_ct, own),                                              # curl, an SDK
        (json_ct, "localhost:%d" % f.port),
        (json_ct, "[::1]:%d" % f.port),
        (json_ct, "polygw.internal:%d" % f.port),                    # http.allowed_hosts
        (["Origin: http://" + own, "Sec-Fetch-Site: same-origin"] + json_ct, own),
        (["Content-Type: application/json; charset=utf-8"], own),
    ]
    for headers, host in served:
        status, hdrs, text = answer("POST", "/v1/chat/completions", headers, host=host)
        assert status == 200, (headers, host, text)
        assert "access-control-allow-origin" not in hdrs
    assert answer("POST", "/v1/chat/completions", json_ct, host="polygw", unix=True)[0] == 200
    # Following a link to the status page from another site opens it.
    status, _, _ = answer("GET", "/polygw/", ["Sec-Fetch-Site: cross-site",
                                              "Sec-Fetch-Mode: navigate"])
    assert status == 200
    # An allowed origin: its preflight, then its call, both with CORS headers.
    allowed = ["Origin: http://localhost:3000", "Sec-Fetch-Site: same-site"]
    status, hdrs, _ = answer("OPTIONS", "/v1/chat/completions", allowed + [
        "Access-Control-Request-Method: POST",
        "Access-Control-Request-Headers: authorization, content-type"])
    assert status == 200
    assert hdrs["access-control-allow-origin"] == "http://localhost:3000"
    assert "POST" in hdrs["access-control-allow-methods"]
    assert "authorization" in hdrs["access-control-allow-headers"].lower()
    status, hdrs, text = answer("POST", "/v1/chat/completions", allowed + json_ct)
    assert status == 200, text
    assert hdrs["access-control-allow-origin"] == "http://localhost:3000"
    assert up.stats()["requests"] == seen + len(served) + 2


def test_http_bounds__allowed_origins_and_hosts_are_validated(front, up, workdir):
    """http.allowed_origins and http.allowed_hosts are checked when the file
    is loaded and when it is reloaded: a bad entry is refused with its key
    path, and a good change applies without a restart."""
    from conftest import POLYGW
    import subprocess
    f = front()
    text = open(f.sc.config).read()
    bad = {"null": "http.allowed_origins[0]", "http://x.example/": "http.allowed_origins[0]",
           "ftp://x.example": "http.allowed_origins[0]", "http://x:99999": "http.allowed_origins[0]"}
    for value, where in bad.items():
        path = os.path.join(workdir, "bad.yaml")
        with open(path, "w") as fh:
            fh.write(text + "  allowed_origins: [%s]\n" % json.dumps(value))
        r = subprocess.run([POLYGW, "--check-config", path], capture_output=True, timeout=10)
        assert r.returncode == 1 and where.encode() in r.stderr, (value, r.stderr)
    for value in ("evil.example:80", "a b", "http://x"):
        path = os.path.join(workdir, "bad.yaml")
        with open(path, "w") as fh:
            fh.write(text + "  allowed_hosts: [%s]\n" % json.dumps(value))
        r = subprocess.run([POLYGW, "--check-config", path], capture_output=True, timeout=10)
        assert r.returncode == 1 and b"http.allowed_hosts[0]" in r.stderr, (value, r.stderr)

    def post(origin):
        s = f.raw()
        s.sendall(request("POST", "/v1/chat/completions",
                          headers=["Origin: " + origin, "Content-Type: application/json"],
                          body=json.dumps(chat("reload")).encode()))
        status = read_response(s)[0]
        s.close()
        return status

    c = f.sc.connect()
    assert post("http://localhost:5173") == 403
    with open(f.sc.config, "w") as fh:
        fh.write(text + "  allowed_origins: [\"http://localhost:5173\"]\n")
    err, _ = c.request("config.reload")
    assert err is None, err
    assert post("http://localhost:5173") == 200
    with open(f.sc.config, "w") as fh:
        fh.write(text + "  allowed_origins: [\"http://localhost:5173/app\"]\n")
    err, _ = c.request("config.reload")
    assert err and "http.allowed_origins[0]" in err["message"], err
    assert post("http://localhost:5173") == 200
    c.close()

"""The sidecar's socket server, driven through its socket: protocol
handling, bad input, back-pressure, limits, shutdown and start-up rules."""
import json
import os
import random
import resource
import signal
import socket
import stat
import subprocess
import time

import msgpack
import pytest

from conftest import POLYGW, Conn, Sidecar, cpu_seconds, sanitizer_env


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def assert_alive(sc, budget_s=0.5):
    """A fresh client gets a ping answer quickly."""
    c = sc.connect()
    t0 = time.monotonic()
    err, res = c.request("ping")
    dt = time.monotonic() - t0
    c.close()
    assert err is None and res["version"]
    assert dt < budget_s, "ping took %.3fs" % dt


def fatal_then_eof(c, code):
    msgs = c.expect_eof()
    assert len(msgs) == 1, msgs
    assert msgs[0][0] == 2 and msgs[0][1] == "error", msgs
    assert msgs[0][2][0]["code"] == code, msgs
    return msgs[0][2][0]["message"]


def test_server__ping(sidecar):
    c = sidecar.connect()
    err, res = c.request("ping")
    assert err is None
    assert isinstance(res["version"], str) and res["version"]
    assert isinstance(res["uptime_s"], float) and res["uptime_s"] >= 0
    # `[nil]` and `[{}]` mean "no parameters" as well.
    c.send([0, 77, "ping", [{}]])
    assert c.wait_response(77)[2] is None
    c.send([0, 78, "ping", [None]])
    assert c.wait_response(78)[2] is None


def test_server__stats_counts(sidecar):
    a = sidecar.connect()
    b = sidecar.connect()
    a.request("ping")
    a.request("nope")
    b.request("ping", {"bogus": 1})
    err, st = b.request("stats")
    assert err is None
    assert st["connections"]["open"] == 2
    assert st["connections"]["accepted"] >= 2
    assert st["requests"]["served"] == 4
    assert st["rejected"]["unknown_method"] == 1
    assert st["rejected"]["bad_request"] == 1
    assert st["rejected"]["stalled"] == 0
    assert "version" in st and "uptime_s" in st
    # never a secret or a config path in stats
    assert "api_key" not in json.dumps(st)


def test_server__pipelined_many_in_one_write(sidecar):
    c = sidecar.connect()
    n = 500
    blob = b"".join(pack([0, i, "ping" if i % 3 else "stats", []]) for i in range(1, n + 1))
    c.send_raw(blob)
    got = {}
    while len(got) < n:
        msg = c.recv_msg()
        assert msg is not None and msg[0] == 1
        assert msg[1] not in got
        got[msg[1]] = msg
    assert sorted(got) == list(range(1, n + 1))
    assert all(m[2] is None for m in got.values())


def test_server__split_frames_byte_by_byte(sidecar):
    c = sidecar.connect()
    frame = pack([0, 9, "ping", [{}]]) + pack([0, 10, "ping", []])
    for i in range(len(frame)):
        c.send_raw(frame[i:i + 1])
        time.sleep(0.002)
    assert c.wait_response(9)[2] is None
    assert c.wait_response(10)[2] is None


@pytest.mark.parametrize("blob,why", [
    (b"\xc1", "reserved byte"),
    (pack({"not": "an array"}), "map"),
    (pack([5, 1, "ping", []]), "type 5"),
    (pack([0, -1, "ping", []]), "negative msgid"),
    (pack([0, 2 ** 32, "ping", []]), "msgid over uint32"),
    (pack([0, 1, 42, []]), "method not a string"),
    (pack([0, 1, "ping"]), "short request"),
    (pack([1, 1, None, None]), "response sent to the sidecar"),
    (b"\x91" * 33 + b"\xc0", "33 nested arrays"),
])
def test_server__malformed_gets_bad_request_then_close(sidecar, blob, why):
    c = sidecar.connect()
    c.send_raw(blob)
    msg = fatal_then_eof(c, "bad_request")
    assert msg
    assert_alive(sidecar)


def test_server__garbage_after_valid_request_answers_first(sidecar):
    c = sidecar.connect()
    c.send_raw(pack([0, 5, "ping", []]) + b"\xc1")
    msgs = c.expect_eof()
    assert msgs[0][0] == 1 and msgs[0][1] == 5 and msgs[0][2] is None
    assert msgs[1][1] == "error" and msgs[1][2][0]["code"] == "bad_request"


@pytest.mark.parametrize("params,needle", [
    ({"x": 1}, "unknown parameter 'x'"),
    ("params-not-an-array", "params must be an array"),
    ([1, 2], "params must be an array holding one map"),
    ([[1]], "must be a map"),
])
def test_server__wrong_params_keep_connection(sidecar, params, needle):
    c = sidecar.connect()
    if isinstance(params, dict):
        params = [params]
    c.send([0, 3, "ping", params])
    resp = c.wait_response(3)
    assert resp[2]["code"] == "bad_request"
    assert needle in resp[2]["message"]
    assert resp[3] is None
    err, res = c.request("ping")
    assert err is None


def test_server__unknown_method(sidecar):
    c = sidecar.connect()
    err, res = c.request("frobnicate", {"a": 1})
    assert err["code"] == "unknown_method"
    assert "frobnicate" in err["message"]
    assert c.request("ping")[0] is None


def test_server__unknown_notification_ignored(sidecar):
    c = sidecar.connect()
    c.send([2, "whatever", [1, 2]])
    assert c.request("ping")[0] is None
    err, st = c.request("stats")
    assert st["requests"]["notifications_ignored"] == 1


def test_server__100mb_length_claim_rejected_at_once(sidecar):
    c = sidecar.connect()
    t0 = time.monotonic()
    # a request whose params claim a 100 MB string; only the header is sent
    c.send_raw(b"\x94\x00\x01\xa4ping\x91\xdb" + (100 * 1024 * 1024).to_bytes(4, "big"))
    msg = fatal_then_eof(c, "too_large")
    assert "max_message_bytes" in msg
    assert time.monotonic() - t0 < 1.0
    # the same for an array claiming 2^32-1 elements
    c = sidecar.connect()
    c.send_raw(b"\xdd\xff\xff\xff\xff")
    fatal_then_eof(c, "too_large")
    assert_alive(sidecar)


def test_server__over_limit_message(make_sidecar):
    sc = make_sidecar(listen_extra="  max_message_bytes: 4096")
    c = sc.connect()
    c.send([0, 1, "ping", [{"pad": "x" * 3000}]])  # under the limit: bad params only
    assert c.wait_response(1)[2]["code"] == "bad_request"
    c.send_raw(pack([0, 2, "ping", [{"pad": "x" * 5000}]]))
    fatal_then_eof(c, "too_large")
    st = sc.connect().request("stats")[1]
    assert st["rejected"]["too_large"] == 1


def test_server__client_that_never_reads_is_bounded(make_sidecar):
    # A small write queue so the limit is reached quickly.
    sc = make_sidecar(listen_extra="  max_message_bytes: 65536\n  max_write_queue_bytes: 131072")
    hog = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hog.connect(sc.sock)
    hog.setblocking(False)
    req = pack([0, 1, "stats", []])
    sent = 0
    stuck_since = None
    deadline = time.monotonic() + 10
    # Write until the sidecar stops reading us (our writes stop progressing).
    while time.monotonic() < deadline:
        try:
            hog.send(req)
            sent += 1
            stuck_since = None
        except BlockingIOError:
            if stuck_since is None:
                stuck_since = time.monotonic()
            elif time.monotonic() - stuck_since > 0.5:
                break
            time.sleep(0.01)
    assert stuck_since is not None, "sidecar never applied back-pressure"
    rss_kb = int(open("/proc/%d/status" % sc.proc.pid).read().split("VmRSS:")[1].split()[0])
    # Other clients are unaffected, and the pause is visible in stats.
    assert_alive(sc)
    st = sc.connect().request("stats")[1]
    assert st["io"]["read_pauses"] >= 1
    # The replies queued for the hog are bounded by the configured limit plus
    # what the kernel buffers; far below what `sent` requests would produce.
    reply_size = len(pack(sc.connect().request("stats")))  # about one reply's bytes
    assert sent * reply_size > 4 * 131072, (sent, reply_size)
    assert rss_kb < 200 * 1024, rss_kb
    # Now read everything: nothing was lost, every request answered in order.
    hog.setblocking(True)
    hog.settimeout(10)
    u = msgpack.Unpacker(raw=False)
    got = 0
    while got < sent:
        data = hog.recv(1 << 16)
        assert data, "EOF after %d of %d replies" % (got, sent)
        u.feed(data)
        for m in u:
            assert m[0] == 1 and m[2] is None
            got += 1
    assert got == sent
    hog.close()


def test_server__slow_trickler_does_not_block_others(sidecar):
    slow = sidecar.connect()
    frame = pack([0, 1, "ping", [{}]])
    slow.send_raw(frame[:3])  # a partial frame, never finished for a while
    garbage = sidecar.connect()
    for _ in range(20):
        assert_alive(sidecar, budget_s=0.2)
    garbage.send_raw(b"\xc1")
    slow.send_raw(frame[3:])
    assert slow.wait_response(1)[2] is None


def test_server__random_bytes_never_crash(sidecar):
    rng = random.Random(1234)
    for i in range(150):
        c = sidecar.connect()
        n = rng.randint(1, 300)
        blob = bytes(rng.getrandbits(8) for _ in range(n))
        try:
            c.send_raw(blob)
            c.sock.shutdown(socket.SHUT_WR)
            c.expect_eof(timeout=5)
        except (ConnectionResetError, BrokenPipeError):
            pass
        c.close()
    assert_alive(sidecar)


def test_server__socket_permissions_default(sidecar):
    st = os.stat(sidecar.sock)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o660


def test_server__socket_permissions_configured(make_sidecar):
    sc = make_sidecar(config_text='listen:\n  mode: "0600"\n')
    assert stat.S_IMODE(os.stat(sc.sock).st_mode) == 0o600


def test_server__refuses_to_start_twice(make_sidecar, workdir):
    first = make_sidecar()
    second = Sidecar(workdir)  # same socket path
    second.log_path = os.path.join(workdir, "second.log")
    second.start(wait=False)
    rc = second.proc.wait(timeout=10)
    second.log.close()
    assert rc == 1
    assert "already listening" in second.logs()
    assert os.path.exists(first.sock)
    assert_alive(first)


def test_server__stale_socket_is_replaced(make_sidecar, workdir):
    path = os.path.join(workdir, "polygw.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()  # the file stays, nobody listens: stale
    sc = make_sidecar()
    assert_alive(sc)


def test_server__non_socket_file_is_not_replaced(make_sidecar, workdir):
    path = os.path.join(workdir, "polygw.sock")
    with open(path, "w") as f:
        f.write("precious")
    sc = make_sidecar(start=False)
    sc.expected_rc = 1
    sc.start(wait=False)
    rc = sc.proc.wait(timeout=10)
    assert rc == 1
    assert "not a socket" in sc.logs()
    assert open(path).read() == "precious"


def test_server__graceful_shutdown(make_sidecar):
    sc = make_sidecar()
    idle = sc.connect()
    c = sc.connect()
    assert c.request("ping")[0] is None
    t0 = time.monotonic()
    rc = sc.stop(signal.SIGTERM)
    assert rc == 0
    assert time.monotonic() - t0 < 3
    assert not os.path.exists(sc.sock), "socket file left behind"
    assert idle.expect_eof() == []
    lines = [json.loads(l) for l in sc.logs().splitlines() if l.startswith("{")]
    assert any(l["msg"] == "exited cleanly" for l in lines)


def test_server__sigint_also_stops(make_sidecar):
    sc = make_sidecar()
    assert sc.stop(signal.SIGINT) == 0
    assert not os.path.exists(sc.sock)


def test_server__logs_are_json_lines(make_sidecar):
    sc = make_sidecar(log_level="debug")
    c = sc.connect()
    c.request("ping")
    c.send_raw(b"\xc1")
    c.expect_eof()
    sc.stop()
    lines = [l for l in sc.logs().splitlines() if l.strip()]
    assert lines
    for l in lines:
        obj = json.loads(l)
        assert obj["level"] in ("debug", "info", "warn", "error")
        assert obj["ts"].endswith("Z") and "T" in obj["ts"]
        assert isinstance(obj["msg"], str)


def test_server__max_connections(make_sidecar):
    sc = make_sidecar(listen_extra="  max_connections: 4")
    time.sleep(0.2)  # let the readiness probe's connection be reaped
    conns = [sc.connect() for _ in range(4)]
    for c in conns:
        assert c.request("ping")[0] is None
    extra = sc.connect()
    fatal_then_eof(extra, "overloaded")
    conns[0].close()
    time.sleep(0.1)
    assert_alive(sc)


def test_server__fd_exhaustion_does_not_spin(make_sidecar):
    def low_fds():
        resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))

    sc = make_sidecar(preexec_fn=low_fds)
    conns = []
    for _ in range(60):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect(sc.sock)
        except OSError:
            s.close()
            continue
        conns.append(s)
    time.sleep(0.3)
    cpu0 = cpu_seconds(sc.proc.pid)
    time.sleep(1.0)
    cpu1 = cpu_seconds(sc.proc.pid)
    assert cpu1 - cpu0 < 0.3, "sidecar burned %.2fs CPU in 1s at EMFILE" % (cpu1 - cpu0)
    for s in conns:
        s.close()
    time.sleep(0.3)
    assert_alive(sc, budget_s=1.0)
    st = sc.connect().request("stats")[1]
    assert st["connections"]["accept_errors"] >= 1


def _run(args, timeout=20, **kw):
    return subprocess.run([POLYGW] + args, capture_output=True, text=True, timeout=timeout,
                          env=sanitizer_env(), **kw)


def test_cli__help_and_version():
    r = _run(["--help"])
    assert r.returncode == 0
    assert "--check-config" in r.stdout and "--socket" in r.stdout
    # A new user finds the HTTP APIs, per-source TLS and tracing from here.
    for word in ("/v1/responses", "/v1/messages", ":generateContent", "body: raw",
                 "ca_file", "cert_file", "server_name", "no_proxy",
                 "OTEL_EXPORTER_OTLP_ENDPOINT", "tracing"):
        assert word in r.stdout, word
    r = _run(["--version"])
    assert r.returncode == 0 and r.stdout.startswith("polygw ")
    r = _run(["--bogus"])
    assert r.returncode == 2


def test_cli__man_page_names_the_apis_tls_and_tracing():
    """docs/polygw.8 tells a new user of the providers' HTTP APIs, the
    per-source TLS and proxy keys, and tracing with its variables."""
    man = open(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "docs", "polygw.8")).read()
    for word in ("/v1/responses", "/v1/messages", "count_tokens", ":generateContent",
                 "body: raw", "tls.ca_file", "tls.cert_file", "tls.key_file",
                 "tls.server_name", ".B proxy", "no_proxy", ".SH TRACING", "traceparent",
                 "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_HEADERS", ".BR tracing ,"):
        assert word in man, "%s is not in docs/polygw.8" % word


def test_cli__check_config(workdir):
    good = os.path.join(workdir, "good.yaml")
    with open(good, "w") as f:
        f.write("listen:\n  mode: \"0660\"\n")
    r = _run(["--check-config", good])
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout and "memory backend" in r.stdout
    # A Redis backend is validated, never contacted (nothing listens on port 1).
    with open(good, "w") as f:
        f.write('backend: {kind: redis, url: "redis://:s3cret@127.0.0.1:1/3"}\n')
    r = _run(["--check-config", good])
    assert r.returncode == 0, r.stderr
    assert "redis backend at 127.0.0.1:1, not contacted" in r.stdout
    assert "s3cret" not in r.stdout + r.stderr
    bad = os.path.join(workdir, "bad.yaml")
    with open(bad, "w") as f:
        f.write("listen:\n  mode: \"0660\"\n  sokcet: /tmp/x\n")
    r = _run(["--check-config", bad])
    assert r.returncode == 1
    assert bad in r.stderr and "sokcet" in r.stderr
    r = _run(["--check-config", os.path.join(workdir, "missing.yaml")])
    assert r.returncode == 1 and "missing.yaml" in r.stderr


def test_cli__config_fifo_refused_promptly(workdir):
    """A FIFO as the config path (nobody writes to it) is refused at once,
    by --check-config and at start-up, like /dev/null and directories:
    never opened in a way that waits for a writer."""
    fifo = os.path.join(workdir, "polygw.yaml")
    os.mkfifo(fifo, 0o600)
    sock = os.path.join(workdir, "fifo.sock")
    for args in (["--check-config", fifo], ["--config", fifo, "--socket", sock]):
        t0 = time.monotonic()
        try:
            r = _run(args, timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("%s hung on a FIFO" % " ".join(args))
        elapsed = time.monotonic() - t0
        assert r.returncode == 1, (args, r.stderr)
        assert fifo + ": not a regular file (a FIFO)" in r.stderr, r.stderr
        assert elapsed < 5, "took %.1fs" % elapsed
    assert not os.path.exists(sock)
    for other, kind in (("/dev/null", "a character device"), (workdir, "a directory")):
        r = _run(["--check-config", other])
        assert r.returncode == 1 and "%s: not a regular file (%s)" % (other, kind) in r.stderr


def test_cli__check_config_reports_every_error_with_hints(workdir):
    """--check-config and start-up list every error of the file, one per
    line as FILE:LINE: KEY: REASON, with a hint for a misplaced or mistyped
    key, then one verdict line; exit 1."""
    bad = os.path.join(workdir, "bad.yaml")
    with open(bad, "w") as f:
        f.write("server:\n"
                "  socket: /tmp/x.sock\n"
                "  log_level: loud\n"
                "sources:\n"
                "  - name: a\n"
                "    capability: chat\n"
                "    base_url: http://127.0.0.1:9\n"
                "    timeout: 5\n"
                "  - name: a\n"
                "    capability: chat\n"
                "    base_url: http://127.0.0.1:9\n")
    want = ["%s:2: server.socket: unknown key; did you mean listen.socket or http.socket?" % bad,
            "%s:3: server.log_level: must be one of debug, info, warn, error" % bad,
            "%s:8: sources[0].timeout: unknown key; did you mean timeout_s?" % bad,
            "%s:9: sources[1].name: duplicate source name 'a' (first used by sources[0])" % bad,
            "polygw: %s: invalid configuration (4 errors)" % bad]
    sock = os.path.join(workdir, "bad.sock")
    for args in (["--check-config", bad], ["--config", bad, "--socket", sock]):
        r = _run(args)
        assert r.returncode == 1, r.stderr
        assert r.stderr.splitlines() == want, r.stderr
        assert r.stdout == ""
    assert not os.path.exists(sock)


def test_cli__demo_config_is_valid():
    demo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "polygw.yaml")
    r = _run(["--check-config", demo])
    assert r.returncode == 0, r.stderr


def test_server__stats_shows_governance_state_never_keys(make_sidecar):
    key = "sk-secret-stats-0123456789"
    cfg = ('listen:\n  mode: "0660"\n'
           'sources:\n'
           '  - name: only\n    capability: chat\n    base_url: http://127.0.0.1:9/v1\n'
           '    api_key_env: PGW_STATS_KEY\n    limits: {rpm: 100}\n')
    sc = make_sidecar(config_text=cfg, env={"PGW_STATS_KEY": key})
    c = sc.connect()
    err, st = c.request("stats")
    assert err is None
    src = st["sources"]
    assert [s["name"] for s in src] == ["only"]
    s = src[0]
    assert s["capability"] == "chat" and s["breaker"] == "closed"
    assert s["in_flight"] == 0 and s["limit"] >= 1 and s["rpm_level"] == 100
    assert s["tpm_level"] is None  # unlimited
    assert st["calls_waiting"] == 0 and st["scopes"] == {}
    blob = msgpack.packb(st)
    assert key.encode() not in blob
    assert key not in sc.logs()


def test_cli__redis_backend_bad_url_refused_without_echoing_password(workdir):
    cfg = os.path.join(workdir, "redis.yaml")
    with open(cfg, "w") as f:
        f.write('backend: {kind: redis, url: "redis://:s3cret-pw@127.0.0.1:99999/0"}\n')
    for args in (["--check-config", cfg], ["--config", cfg, "--socket", os.path.join(workdir, "r.sock")]):
        r = _run(args)
        assert r.returncode == 1
        assert "redis.yaml:1: backend.url:" in r.stderr and "port" in r.stderr
        assert "s3cret-pw" not in r.stderr + r.stdout
    assert not os.path.exists(os.path.join(workdir, "r.sock"))

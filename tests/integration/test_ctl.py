"""polygwctl (and through it libpolygw) against a scripted fake sidecar.

The fake speaks the wire protocol of DESIGN.md section 4 from a Python
thread, so these tests pin the client's side of the contract — output
formats, exit codes, streaming as it arrives, typed errors, the fatal
`error` notification, timeouts that cancel, late and out-of-order answers,
pipelining — without the real sidecar. Tests against the real sidecar live
beside this file.

Methods of the fake:
  ping, stats                         canned answers
  echo                                result = the params array as received
  delay  [{ms, value}]                answers {value} after ms (out of order)
  hang                                never answers
  close                               closes without answering
  fatal                               [2,"error",[{code:too_large,...}]] + close
  garbage                             sends the reserved byte 0xc1
  noisy                               junk for other msgids first, then {ok:true}
  call   capability chat              echoes body; with stream: 3 chunks
         capability chat + body.hold  stream: waits for the test after chunk 0
         capability slow              never answers until cancelled
         capability stalled/rejected  typed errors
  anything else                       unknown_method
Frames over LIMIT bytes get a fatal too_large, like the real sidecar.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time

import msgpack
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("POLYGW_BUILD", os.path.join(ROOT, "build"))
CTL = os.path.join(BUILD, "polygwctl")

LIMIT = 1 << 20
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")

STATS = {
    "uptime_s": 12.5,
    "connections": {"open": 3, "total": 17},
    "calls": {"in_flight": 0, "completed": 42},
    "sources": {
        "fake-a": {"in_flight": 1, "limit": 4.5, "breaker": "closed", "tags": [1, 2]},
    },
    "scopes": [{"name": "chat", "progress_age_s": None}],
}


def err(code, message, **extra):
    d = {"code": code, "message": message}
    d.update(extra)
    return d


class FakeSidecar:
    def __init__(self, path):
        self.path = path
        self.lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.lsock.bind(path)
        self.lsock.listen(16)
        self.requests = []     # (msgid, method, params) in arrival order
        self.cancels = []      # msgids
        self.sent_order = []   # msgids of responses, in send order
        self.release = threading.Event()  # for body.hold
        self.lock = threading.Lock()
        self.conns = []
        self.stopping = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def close(self):
        self.stopping = True
        self.release.set()
        try:
            self.lsock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.lsock.close()
        for c in list(self.conns):
            try:
                c.close()
            except OSError:
                pass

    def _accept(self):
        while not self.stopping:
            try:
                conn, _ = self.lsock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        wlock = threading.Lock()
        pending_slow = set()

        def send(obj):
            data = msgpack.packb(obj, use_bin_type=True)
            with wlock:
                try:
                    conn.sendall(data)
                except OSError:
                    pass
            if obj[0] == 1:
                with self.lock:
                    self.sent_order.append(obj[1])

        def fatal(code, message):
            send([2, "error", [err(code, message)]])
            conn.close()

        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=LIMIT)
        while True:
            try:
                data = conn.recv(1 << 16)
            except OSError:
                return
            if not data:
                conn.close()
                return
            try:
                unpacker.feed(data)
            except msgpack.BufferFull:
                return fatal("too_large", "message exceeds %d bytes" % LIMIT)
            try:
                msgs = list(unpacker)
            except Exception as e:  # malformed msgpack
                return fatal("bad_request", "malformed frame: %s" % e)
            for msg in msgs:
                if msg[0] == 2 and msg[1] == "cancel":
                    mid = msg[2][0]
                    with self.lock:
                        self.cancels.append(mid)
                    if mid in pending_slow:
                        pending_slow.discard(mid)
                        send([1, mid, err("cancelled", "cancelled by the client"), None])
                    continue
                _, msgid, method, params = msg
                with self.lock:
                    self.requests.append((msgid, method, params))
                if self._handle(conn, send, fatal, pending_slow, msgid, method, params) == "closed":
                    return

    def _handle(self, conn, send, fatal, pending_slow, msgid, method, params):
        p = params[0] if params and isinstance(params[0], dict) else {}
        if method == "ping":
            send([1, msgid, None, {"version": "9.9.9-fake", "uptime_s": 12.5}])
        elif method == "stats":
            send([1, msgid, None, STATS])
        elif method == "echo":
            send([1, msgid, None, params])
        elif method == "delay":
            t = threading.Timer(p.get("ms", 0) / 1000.0, send,
                                args=([1, msgid, None, {"value": p.get("value")}],))
            t.daemon = True
            t.start()
        elif method == "hang":
            pass
        elif method == "close":
            conn.close()
            return "closed"
        elif method == "fatal":
            fatal("too_large", "message exceeds 16 bytes")
            return "closed"
        elif method == "garbage":
            conn.sendall(b"\xc1")
        elif method == "noisy":
            send([1, msgid + 1000, None, {"wrong": True}])           # nobody asked
            send([2, "chunk", [msgid + 1000, {"delta": "x"}]])        # not ours
            send([2, "hello", [{"from": "the future"}]])              # unknown notification
            send([1, msgid, None, {"ok": True}])
        elif method == "call":
            self._call(send, pending_slow, msgid, p)
        else:
            send([1, msgid, err("unknown_method", "no method '%s'" % method), None])

    def _call(self, send, pending_slow, msgid, p):
        cap = p.get("capability")
        body = p.get("body")
        if cap == "chat":
            if p.get("stream"):
                for i in range(3):
                    send([2, "chunk", [msgid, {"delta": "tok%d" % i, "i": i}]])
                    if i == 0 and body.get("hold"):
                        self.release.wait(10)
                send([1, msgid, None, {"source": "fake-a", "attempts": 1, "elapsed_s": 0.5,
                                       "stalled_s": 0.0}])
            else:
                send([1, msgid, None, {
                    "body": {"echo": body, "id": "cmpl-1"}, "source": "fake-a", "attempts": 1,
                    "elapsed_s": 0.25, "stalled_s": 0.0,
                    "usage": {"prompt_tokens": 3, "completion_tokens": 5}}])
        elif cap == "slow":
            pending_slow.add(msgid)
        elif cap == "stalled":
            send([1, msgid, err("stalled", "no progress in scope chat for 300s",
                                retry_after_s=2.5, attempts=3, stalled_s=301.5), None])
        elif cap == "rejected":
            send([1, msgid, err("upstream_rejected", "upstream answered 400", status=400,
                                attempts=1, body={"error": "bad model"}), None])
        elif cap == "future":
            send([1, msgid, err("quantum_flux", "a code from a newer sidecar"), None])
        else:
            send([1, msgid, err("unknown_capability", "no capability '%s'" % cap), None])


@pytest.fixture
def tmp():
    d = tempfile.mkdtemp(prefix="pgwctl", dir="/tmp")  # short: sun_path is 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def fake(tmp):
    f = FakeSidecar(os.path.join(tmp, "s.sock"))
    yield f
    f.close()


def env_for(extra=None):
    env = dict(os.environ)
    env.pop("POLYGW_SOCKET", None)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    if extra:
        env.update(extra)
    return env


def check_clean(stderr):
    for m in SANITIZER_MARKERS:
        assert m not in stderr, stderr


def ctl(fake, *args, stdin=None, env=None, timeout=20):
    """Runs polygwctl against `fake` (None: no --socket) -> CompletedProcess."""
    argv = [CTL]
    if fake is not None:
        argv += ["--socket", fake.path]
    argv += list(args)
    p = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env_for(env),
                       timeout=timeout)
    check_clean(p.stderr)
    return p


# --- basics -----------------------------------------------------------------

def test_help_and_version():
    p = ctl(None, "--help")
    assert p.returncode == 0
    for word in ("ping", "stats", "call", "raw", "batch", "--socket", "--timeout", "--json",
                 "Exit status", "POLYGW_SOCKET"):
        assert word in p.stdout
    assert re.search(r"^\s+3\s", p.stdout, re.M)
    p = ctl(None, "--version")
    assert p.returncode == 0 and re.match(r"polygwctl \d+\.\d+\.\d+", p.stdout)


@pytest.mark.parametrize("args", [
    [],
    ["frobnicate"],
    ["ping", "extra"],
    ["--timeout", "abc", "ping"],
    ["--timeout", "-1", "ping"],
    ["--bogus", "ping"],
    ["call", "chat"],                          # no --body
    ["call", "--body", "{}"],                  # no capability
    ["call", "chat", "--body", "[1, 2]"],      # not an object
    ["call", "chat", "--body", "{bad json"],
    ["call", "chat", "--body", "{}", "--deadline", "0"],
    ["ping", "--stream"],                      # call option on another command
    ["raw"],
    ["raw", "echo", '"a string"'],             # params must be object or array
    ["raw", "echo", "{oops"],
])
def test_usage_errors_exit_2(fake, args):
    p = ctl(fake, *args)
    assert p.returncode == 2, (args, p.stdout, p.stderr)
    assert fake.requests == []  # nothing was sent


def test_usage_error_even_without_sidecar(tmp):
    p = subprocess.run([CTL, "--socket", os.path.join(tmp, "none.sock"), "call", "chat", "--body",
                        "nope"], capture_output=True, text=True, env=env_for())
    assert p.returncode == 2


def test_connect_failures_exit_3(tmp):
    p = ctl(None, "--socket", os.path.join(tmp, "missing.sock"), "ping")
    assert p.returncode == 3
    assert p.stderr.startswith("error: connect_failed: ")
    assert "No such file" in p.stderr
    p = ctl(None, "--socket", "/tmp/" + "x" * 200, "ping")
    assert p.returncode == 3 and "too long" in p.stderr


def test_ping(fake):
    p = ctl(fake, "ping")
    assert p.returncode == 0, p.stderr
    assert re.fullmatch(r"pong version=9\.9\.9-fake uptime=12\.5s rtt=\d+us\n", p.stdout)
    assert [r[1:] for r in fake.requests] == [("ping", [])]


def test_ping_json(fake):
    p = ctl(fake, "ping", "--json")
    assert p.returncode == 0
    d = json.loads(p.stdout)
    assert d["version"] == "9.9.9-fake" and d["uptime_s"] == 12.5
    assert isinstance(d["rtt_us"], int) and d["rtt_us"] >= 0


def test_socket_from_environment(fake):
    p = ctl(None, "ping", env={"POLYGW_SOCKET": fake.path})
    assert p.returncode == 0 and p.stdout.startswith("pong ")


def test_options_after_the_command(fake):
    p = ctl(None, "ping", "--socket", fake.path, "--timeout", "5")
    assert p.returncode == 0


# --- stats -----------------------------------------------------------------

def test_stats_table(fake):
    p = ctl(fake, "stats")
    assert p.returncode == 0, p.stderr
    rows = [re.split(r"\s{2,}", line, maxsplit=1) for line in p.stdout.splitlines()]
    table = dict(rows)
    assert table["connections.open"] == "3"
    assert table["connections.total"] == "17"
    assert table["uptime_s"] == "12.5"
    assert table["sources.fake-a.limit"] == "4.5"
    assert table["sources.fake-a.breaker"] == "closed"
    assert table["sources.fake-a.tags"] == "[1,2]"
    assert table["scopes[0].name"] == "chat"
    assert table["scopes[0].progress_age_s"] == "-"
    # values start in one column
    cols = {line.index(v, len(k)) for line, (k, v) in zip(p.stdout.splitlines(), rows)}
    assert len(cols) == 1


def test_stats_json(fake):
    p = ctl(fake, "stats", "--json")
    assert p.returncode == 0
    assert json.loads(p.stdout) == STATS


# --- raw -------------------------------------------------------------------

def test_raw_params_shapes(fake):
    p = ctl(fake, "raw", "echo", '{"a": 1, "b": [true, null, 1.5, "\\u00e9"]}')
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [{"a": 1, "b": [True, None, 1.5, "\u00e9"]}]
    p = ctl(fake, "raw", "echo", '[1, "x", {"k": -7}]')
    assert json.loads(p.stdout) == [1, "x", {"k": -7}]
    p = ctl(fake, "raw", "echo")
    assert json.loads(p.stdout) == []
    assert [r[2] for r in fake.requests] == [[{"a": 1, "b": [True, None, 1.5, "\u00e9"]}],
                                             [1, "x", {"k": -7}], []]


def test_raw_big_integers_and_floats_round_trip(fake):
    p = ctl(fake, "raw", "echo", '[9223372036854775807, -9223372036854775808, 0.1, 1e300, 2.0]')
    assert p.returncode == 0
    assert "0.1," in p.stdout.replace(" ", "").replace("\n", "")  # shortest form, not 0.1000...1
    assert json.loads(p.stdout) == [9223372036854775807, -9223372036854775808, 0.1, 1e300, 2.0]
    assert isinstance(json.loads(p.stdout)[4], float)


def test_unknown_method_exit_1(fake):
    p = ctl(fake, "raw", "no.such.method")
    assert p.returncode == 1
    assert p.stderr.startswith("error: unknown_method: no method 'no.such.method'")
    assert json.loads(p.stdout) == {"code": "unknown_method",
                                    "message": "no method 'no.such.method'"}


def test_noise_for_other_msgids_is_ignored(fake):
    p = ctl(fake, "raw", "noisy")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"ok": True}


# --- call ------------------------------------------------------------------

def test_call_prints_body_and_sends_named_params(fake):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi\n\"there\""}]}
    p = ctl(fake, "call", "chat", "--body", json.dumps(body), "--scope", "s1", "--task", "t-9",
            "--deadline", "7.5")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"echo": body, "id": "cmpl-1"}
    assert re.search(r"^ok: source=fake-a attempts=1 elapsed_s=0\.25 stalled_s=0\.0 "
                     r"usage=\{\"prompt_tokens\":3,\"completion_tokens\":5\}$", p.stderr, re.M)
    (msgid, method, params), = fake.requests
    assert method == "call"
    assert params == [{"capability": "chat", "body": body, "scope": "s1", "task_id": "t-9",
                       "deadline_s": 7.5}]


def test_call_body_from_file_and_quiet(fake, tmp):
    path = os.path.join(tmp, "body.json")
    with open(path, "w") as f:
        json.dump({"input": "x"}, f)
    p = ctl(fake, "call", "chat", "--body", "@" + path, "-q")
    assert p.returncode == 0 and p.stderr == ""
    assert json.loads(p.stdout)["echo"] == {"input": "x"}
    p = ctl(fake, "call", "chat", "--body", "-", stdin='{"input": "y"}')
    assert json.loads(p.stdout)["echo"] == {"input": "y"}


def test_call_json_prints_whole_result(fake):
    p = ctl(fake, "call", "chat", "--body", "{}", "--json")
    assert p.returncode == 0
    d = json.loads(p.stdout)
    assert d["source"] == "fake-a" and d["body"]["echo"] == {} and d["usage"]["prompt_tokens"] == 3


def test_call_stream_prints_chunks_then_summary(fake):
    p = ctl(fake, "call", "chat", "--stream", "--body", '{"messages": []}')
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert [json.loads(x) for x in lines] == [{"delta": "tok%d" % i, "i": i} for i in range(3)]
    assert re.search(r"^ok: source=fake-a attempts=1 elapsed_s=0\.5 stalled_s=0\.0 chunks=3$",
                     p.stderr, re.M)
    assert fake.requests[0][2][0]["stream"] is True


def test_call_stream_json_ends_with_result_line(fake):
    p = ctl(fake, "call", "chat", "--stream", "--json", "--body", "{}")
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    assert len(lines) == 4 and lines[3]["source"] == "fake-a" and "body" not in lines[3]


def test_call_stream_chunks_arrive_before_the_call_ends(fake):
    """The first chunk must be printed while the sidecar still holds the call."""
    proc = subprocess.Popen([CTL, "--socket", fake.path, "call", "chat", "--stream", "--body",
                             '{"hold": true}'], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env_for())
    try:
        first = proc.stdout.readline()  # blocks until polygwctl prints (and flushes) chunk 0
        assert json.loads(first) == {"delta": "tok0", "i": 0}
        assert proc.poll() is None
        fake.release.set()
        out, errout = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    check_clean(errout)
    assert proc.returncode == 0
    assert len(out.splitlines()) == 2


def test_call_typed_errors(fake):
    p = ctl(fake, "call", "stalled", "--body", "{}")
    assert p.returncode == 1
    assert p.stderr == ("error: stalled: no progress in scope chat for 300s "
                        "(retry_after_s=2.5 attempts=3 stalled_s=301.5)\n")
    assert p.stdout == ""
    p = ctl(fake, "call", "rejected", "--body", "{}", "--json")
    assert p.returncode == 1
    assert "error: upstream_rejected: upstream answered 400 (attempts=1 status=400)" in p.stderr
    assert json.loads(p.stdout)["body"] == {"error": "bad model"}  # the whole error map
    p = ctl(fake, "call", "nope", "--body", "{}")
    assert p.returncode == 1 and p.stderr.startswith("error: unknown_capability: ")
    p = ctl(fake, "call", "future", "--body", "{}")  # a code this client does not know
    assert p.returncode == 1 and p.stderr.startswith("error: quantum_flux: ")


def test_call_timeout_cancels_and_exits_3(fake):
    t0 = time.monotonic()
    p = ctl(fake, "--timeout", "0.3", "call", "slow", "--body", "{}")
    elapsed = time.monotonic() - t0
    assert p.returncode == 3
    assert p.stderr.startswith("error: timeout: no answer to call 'slow' within 0.3s")
    assert elapsed < 5
    (msgid, _, _), = fake.requests
    deadline = time.monotonic() + 2
    while not fake.cancels and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake.cancels == [msgid]


def test_raw_call_streams_and_is_cancelled_on_timeout(fake):
    p = ctl(fake, "raw", "call", '{"capability": "chat", "body": {}, "stream": true}')
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert [json.loads(x) for x in lines[:3]] == [{"delta": "tok%d" % i, "i": i} for i in range(3)]
    assert json.loads("\n".join(lines[3:]))["source"] == "fake-a"
    p = ctl(fake, "--timeout", "0.3", "raw", "call", '{"capability": "slow", "body": {}}')
    assert p.returncode == 3 and p.stderr.startswith("error: timeout: ")
    deadline = time.monotonic() + 2
    while not fake.cancels and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake.cancels == [fake.requests[-1][0]]


# --- connection-level failures ---------------------------------------------

def test_timeout_exit_3(fake):
    t0 = time.monotonic()
    p = ctl(fake, "--timeout", "0.3", "raw", "hang")
    assert p.returncode == 3
    assert p.stderr.startswith("error: timeout: no answer to 'hang' within 0.3s")
    assert 0.25 < time.monotonic() - t0 < 5


def test_fatal_error_notification_exit_1(fake):
    p = ctl(fake, "raw", "fatal")
    assert p.returncode == 1
    assert p.stderr == "error: too_large: message exceeds 16 bytes\n"


def test_oversized_request_reports_the_sidecars_reason(fake, tmp):
    """The fake closes mid-write: the client must still read why (too_large)."""
    path = os.path.join(tmp, "big.json")
    with open(path, "w") as f:
        json.dump({"input": "x" * (4 * LIMIT)}, f)
    p = ctl(fake, "call", "chat", "--body", "@" + path)
    assert p.returncode == 1, p.stderr
    assert p.stderr.startswith("error: too_large: message exceeds %d bytes" % LIMIT)


def test_closed_without_answer_exit_3(fake):
    p = ctl(fake, "raw", "close")
    assert p.returncode == 3
    assert p.stderr.startswith("error: io_error: the sidecar closed the connection")


def test_garbage_from_sidecar_exit_3(fake):
    p = ctl(fake, "raw", "garbage")
    assert p.returncode == 3
    assert p.stderr.startswith("error: protocol_error: ")


# --- pipelining (batch) ----------------------------------------------------

def batch_lines(p):
    return [json.loads(x) for x in p.stdout.splitlines()]


def test_batch_out_of_order_answers_in_input_order(fake):
    stdin = "\n".join([
        '["delay", {"ms": 400, "value": "a"}]',
        '["delay", {"ms": 10, "value": "b"}]',
        "# comments and blank lines are skipped",
        "",
        '["ping"]',
        '["delay", {"ms": 200, "value": "c"}]',
        '["nope", []]',
    ]) + "\n"
    p = ctl(fake, "batch", stdin=stdin)
    assert p.returncode == 1, p.stderr  # one unknown_method
    out = batch_lines(p)
    assert [o["index"] for o in out] == [0, 1, 2, 3, 4]
    assert [o["method"] for o in out] == ["delay", "delay", "ping", "delay", "nope"]
    assert out[0]["result"] == {"value": "a"}
    assert out[1]["result"] == {"value": "b"}
    assert out[2]["result"]["version"] == "9.9.9-fake"
    assert out[3]["result"] == {"value": "c"}
    assert out[4]["error"]["code"] == "unknown_method"
    # all five were in flight on one connection, and answered out of order
    ids = [r[0] for r in fake.requests]
    assert len(set(ids)) == 5
    assert fake.sent_order.index(ids[0]) > fake.sent_order.index(ids[3]) > \
        fake.sent_order.index(ids[1])


def test_batch_unordered_prints_in_completion_order(fake):
    stdin = ('["delay", {"ms": 300, "value": 1}]\n'
             '["delay", {"ms": 0, "value": 2}]\n'
             '["delay", {"ms": 150, "value": 3}]\n')
    p = ctl(fake, "batch", "--unordered", stdin=stdin)
    assert p.returncode == 0, p.stderr
    assert [o["result"]["value"] for o in batch_lines(p)] == [2, 3, 1]


def test_batch_late_answer_is_discarded_and_connection_stays_usable(fake):
    # t=0 all sent; item 0 times out at 1.0s (its answer comes at 1.5s,
    # while the client waits for item 1, which is answered at 1.8s).
    stdin = ('["delay", {"ms": 1500, "value": "late"}]\n'
             '["delay", {"ms": 1800, "value": "ok"}]\n'
             '["ping"]\n')
    p = ctl(fake, "--timeout", "1", "batch", stdin=stdin)
    assert p.returncode == 3, p.stderr  # a timeout is a local failure
    out = batch_lines(p)
    assert out[0]["error"]["code"] == "timeout"
    assert out[1]["result"] == {"value": "ok"}
    assert out[2]["result"]["version"] == "9.9.9-fake"


def test_batch_fatal_error_fails_what_is_in_flight(fake):
    stdin = '["ping"]\n["fatal"]\n["ping"]\n'
    p = ctl(fake, "batch", stdin=stdin)
    out = batch_lines(p)
    assert p.returncode in (1, 3)
    assert "result" in out[0]
    assert out[1]["error"] == {"code": "too_large", "message": "message exceeds 16 bytes"}
    assert out[2]["error"]["code"] in ("too_large", "connection_closed", "io_error")


def test_batch_bad_line_is_a_usage_error(fake):
    p = ctl(fake, "batch", stdin='["ping"]\n{"method": "ping"}\n')
    assert p.returncode == 2 and "line 2" in p.stderr
    assert fake.requests == []

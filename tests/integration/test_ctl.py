"""polygwctl (and through it libpolygw) against a scripted fake sidecar.

The fake speaks the wire protocol of docs/DESIGN.md §4 from a Python
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
  task.*  (PROTOCOL.md 4.4)           an in-memory registry in `fake.tasks`
         (task_id -> task map) with the shapes the real sidecar returns;
         a task_id starting with "hang" is never answered; with
         fake.tasks_supported = False every task.* is unknown_method
  call   capability chat              echoes body; with stream: 3 chunks
         capability chat + body.hold  stream: waits for the test after chunk 0
         capability slow              never answers until cancelled
         capability stalled/rejected  typed errors
  anything else                       unknown_method
Frames over LIMIT bytes get a fatal too_large, like the real sidecar.
"""
import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import msgpack
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import BUILD, ROOT, SANITIZER_MARKERS, POLYGWCTL as CTL, sanitizer_env  # noqa: E402

LIMIT = 1 << 20

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
        self.tasks = {}        # task_id -> task map (see _task)
        self.tasks_supported = True
        self.node_begun = {}   # task_id -> time of node_begin
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
        elif method.startswith("task.") and self.tasks_supported:
            if str(p.get("task_id", "")).startswith("hang"):
                return None
            with self.lock:
                e, r = self._task(method, params, p)
            send([1, msgid, e, r])
        else:
            send([1, msgid, err("unknown_method", "no method '%s'" % method), None])

    # Parameters of each task method: name -> (type, required).
    TASK_PARAMS = {
        "task.start": {"task_id": (str, True)},
        "task.stop": {"task_id": (str, True), "reason": (str, True)},
        "task.guard": {"task_id": (str, True)},
        "task.node_begin": {"task_id": (str, True), "node": (str, True),
                            "timeout_s": ((int, float), False)},
        "task.node_end": {"task_id": (str, True), "node": (str, True)},
        "task.finish": {"task_id": (str, True), "ok": (bool, True), "reason": (str, False)},
        "task.get": {"task_id": (str, True)},
        "task.list": {"state": (str, False)},
    }

    def _task(self, method, params, p):
        """(error, result) of one task method, checked like the real sidecar."""
        spec = self.TASK_PARAMS.get(method)
        if spec is None:
            return err("unknown_method", "no method '%s'" % method), None
        if params not in ([], [None], [{}]) and not (len(params) == 1 and
                                                     isinstance(params[0], dict)):
            return err("bad_request", "params must be [map]"), None
        for k, v in p.items():
            if k not in spec:
                return err("bad_request", "unknown parameter '%s'" % k), None
            if not isinstance(v, spec[k][0]) or (spec[k][0] is not bool and isinstance(v, bool)):
                return err("bad_request", "parameter '%s': wrong type" % k), None
        for k, (_, required) in spec.items():
            if required and k not in p:
                return err("bad_request", "missing parameter '%s'" % k), None
        now = time.time()
        tid = p.get("task_id")
        t = self.tasks.get(tid)

        def refused(t):
            """The error for an operation that needs a running task (as the real
            sidecar words it), or None when `t` runs."""
            if t["state"] == "running":
                return None
            if t.get("reason_kind") == "stopped":
                return err("task_stopped", "task '%s' was stopped: %s" % (t["task_id"],
                                                                          t.get("reason", "")),
                           reason=t.get("reason", ""), reason_kind="stopped")
            if t.get("reason_kind") == "watchdog":
                return err("watchdog_timeout", "task '%s' failed by the watchdog: %s"
                           % (t["task_id"], t.get("reason", "")),
                           reason=t.get("reason", ""), reason_kind="watchdog")
            return err("bad_request", "task '%s' already %s%s" % (
                t["task_id"], t["state"], ": " + t["reason"] if t.get("reason") else ""))

        def unknown():
            return err("bad_request", "unknown task '%s' (never started, or expired)" % tid), None

        if method == "task.start":
            if t is None:
                t = self.tasks[tid] = {"task_id": tid, "state": "running", "updated_at": now,
                                       "started_at": now, "runs": 1}
            elif t["state"] != "running":
                if t.get("reason_kind") in ("stopped", "watchdog"):
                    return refused(t), None
                t.update(state="running", updated_at=now, started_at=now, runs=t["runs"] + 1)
                t.pop("reason_kind", None)
                t.pop("reason", None)
            return None, dict(t)   # starting a running task returns it unchanged
        if method == "task.stop":
            if t is None:
                return unknown()
            if t["state"] != "running":  # stopping twice is refused, the first reason stays
                return refused(t), None
            t.update(state="failed", reason_kind="stopped", reason=p["reason"], updated_at=now)
            return None, dict(t)
        if method == "task.list":
            st = p.get("state")
            if st is not None and st not in ("running", "succeeded", "failed"):
                return err("bad_request", "bad state '%s'" % st), None
            return None, {"tasks": [dict(x) for x in self.tasks.values()
                                    if st is None or x["state"] == st]}
        if t is None:
            return unknown()
        if method == "task.get":
            return None, dict(t)
        e = refused(t)
        if e:
            return e, None
        if method == "task.guard":
            return None, {}
        if method == "task.node_begin":
            t["node"] = p["node"]
            self.node_begun[tid] = now
            explicit = p.get("timeout_s")
            return None, {"timeout_s": float(explicit) if explicit else 600.0,
                          "timeout_source": "explicit" if explicit else "default"}
        if method == "task.node_end":
            if t.get("node") != p["node"]:
                return err("bad_request", "node '%s' is not current" % p["node"]), None
            del t["node"]
            return None, {"elapsed_s": now - self.node_begun.pop(tid)}
        if method == "task.finish":
            t.pop("node", None)
            self.node_begun.pop(tid, None)
            t.update(state="succeeded" if p["ok"] else "failed", updated_at=now)
            if not p["ok"]:
                t["reason_kind"] = "error"
            if "reason" in p:
                t["reason"] = p["reason"]
            return None, dict(t)
        return err("internal", "unreachable"), None

    def _call(self, send, pending_slow, msgid, p):
        cap = p.get("capability")
        body = p.get("body")
        task = self.tasks.get(p.get("task_id"))
        if task is not None and task["state"] != "running":
            stopped = task.get("reason_kind") == "stopped"
            send([1, msgid, err("task_stopped" if stopped else "watchdog_timeout",
                                "task '%s' was stopped: %s" % (task["task_id"],
                                                               task.get("reason", ""))), None])
            return
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
    env = sanitizer_env()
    env.pop("POLYGW_SOCKET", None)
    env.update(extra or {})
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


# --- tasks (PROTOCOL.md 4.4) -------------------------------------------------

def task_requests(fake):
    return [(m, p) for _, m, p in fake.requests]


def table(stdout):
    """The tasks table as a list of dicts, cut at the header's column starts."""
    lines = stdout.splitlines()
    head = lines[0]
    names = head.split()
    starts = [m.start() for m in re.finditer(r"\S+", head)]
    rows = []
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, starts[1:] + [None])]
        rows.append(dict(zip(names, cells)))
    return rows


def kv(stdout):
    return dict(re.split(r"\s{2,}", line, maxsplit=1) for line in stdout.splitlines())


def stop_then_guard(run, task_id, reason):
    """`task stop --reason` prints the task failed and stopped with that
    reason; a `task guard` after it exits 1 naming the reason. `run(*args)`
    runs polygwctl against a sidecar (the fake here, the real one in
    test_ctl_tasks_real.py); returns the guard's CompletedProcess."""
    p = run("task", "stop", task_id, "--reason", reason)
    assert p.returncode == 0, p.stderr
    d = kv(p.stdout)
    assert (d["state"], d["reason_kind"], d["reason"]) == ("failed", "stopped", reason)
    p = run("task", "guard", task_id)
    assert p.returncode == 1
    assert p.stderr == "error: task_stopped: task '%s' was stopped: %s\n" % (task_id, reason)
    return p


def test_help_mentions_task_commands():
    p = ctl(None, "--help")
    for word in ("tasks [--state S]", "task start ID", "task stop ID --reason TEXT",
                 "task finish ID --ok|--failed", "task get ID", "task guard ID", "--state",
                 "--reason", "task_stopped"):
        assert word in p.stdout, word


def test_man_page_covers_help():
    """docs/polygwctl.1 documents every command, subcommand, option and exit
    status that `polygwctl --help` lists, and the environment variable."""
    help_text = ctl(None, "--help").stdout
    man = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                            "polygwctl.1")).read()
    man = man.replace("\\-", "-").replace("\\fB", "").replace("\\fR", "").replace("\\fI", "")
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-zA-Z])\b", help_text))
    assert {"--socket", "--body", "--unordered", "--ok", "-t"} <= options, options
    commands = set(re.findall(r"^  (ping|stats|metrics|call|raw|batch|tasks|task \w+)\b", help_text,
                              re.M))
    assert len(commands) == 12, commands
    for word in sorted(options | commands):
        assert re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(word).replace(r"\ ", r"\s+"),
                         man), "%s is not in docs/polygwctl.1" % word
    for status in re.findall(r"^  ([0-9])  ", help_text, re.M):
        assert re.search(r"^\.TP\n%s\n" % status, man, re.M), "exit status %s" % status
    assert "POLYGW_SOCKET" in man and ".SH EXAMPLES" in man


@pytest.mark.parametrize("args", [
    ["tasks", "extra"],
    ["tasks", "--state", "bogus"],
    ["tasks", "--reason", "x"],
    ["ping", "--state", "running"],
    ["task"],
    ["task", "frob", "t1"],
    ["task", "get"],
    ["task", "get", "a", "b"],
    ["task", "get", ""],
    ["task", "get", "t1", "--reason", "x"],
    ["task", "start", "t1", "--ok"],
    ["task", "stop", "t1"],                        # --reason is required
    ["task", "finish", "t1"],                      # --ok or --failed is required
    ["task", "finish", "t1", "--ok", "--failed"],
    ["task", "guard", "t1", "--failed"],
    ["task", "stop", "t1", "--reason", "r", "--task", "t2"],  # a call option
])
def test_task_usage_errors_exit_2(fake, args):
    p = ctl(fake, *args)
    assert p.returncode == 2, (args, p.stdout, p.stderr)
    assert p.stderr.startswith("polygwctl: ")
    assert fake.requests == []


def test_tasks_table(fake):
    now = time.time()
    fake.tasks.update({
        "ingest-7": {"task_id": "ingest-7", "state": "running", "node": "chunk",
                     "updated_at": now - 5, "started_at": now - 9, "runs": 1},
        "run-42": {"task_id": "run-42", "state": "failed", "reason_kind": "stopped",
                   "reason": "operator: bad prompt", "updated_at": now - 125,
                   "started_at": now - 300, "runs": 1},
        "nightly": {"task_id": "nightly", "state": "failed", "reason_kind": "watchdog",
                    "reason": "node embed exceeded 30s", "node": "embed",
                    "updated_at": now - 2 * 86400 - 3 * 3600 - 60, "runs": 3},
        "batch-\u00e9": {"task_id": "batch-\u00e9", "state": "succeeded",
                         "updated_at": now - 3 * 3600 - 7 * 60, "runs": 1},
        "evil": {"task_id": "evil", "state": "failed", "reason_kind": "error",
                 "reason": "line1\nline2\x1b[31m", "updated_at": now - 30000 * 86400},
        "newer": {"task_id": "newer", "state": "paused", "updated_at": now, "future": [1]},
    })
    p = ctl(fake, "tasks")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split() == ["TASK_ID", "STATE", "REASON_KIND", "NODE", "AGE", "REASON"]
    assert len(lines) == 7  # header + 6; "line1\nline2" did not break a row
    rows = table(p.stdout)
    # most recently updated first
    assert [r["TASK_ID"] for r in rows] == ["newer", "ingest-7", "run-42", "batch-\u00e9",
                                            "nightly", "evil"]
    by = {r["TASK_ID"]: r for r in rows}
    assert by["ingest-7"] == {"TASK_ID": "ingest-7", "STATE": "running", "REASON_KIND": "-",
                              "NODE": "chunk", "AGE": by["ingest-7"]["AGE"], "REASON": "-"}
    assert re.fullmatch(r"[5-9]s", by["ingest-7"]["AGE"])
    assert by["run-42"]["STATE"] == "failed" and by["run-42"]["REASON_KIND"] == "stopped"
    assert by["run-42"]["REASON"] == "operator: bad prompt"
    assert re.fullmatch(r"2m0[5-9]s", by["run-42"]["AGE"])
    assert re.fullmatch(r"3h0[78]m", by["batch-\u00e9"]["AGE"])
    assert by["nightly"]["AGE"] == "2d03h" and by["nightly"]["NODE"] == "embed"
    assert by["nightly"]["REASON"] == "node embed exceeded 30s"
    assert by["evil"]["REASON"] == "line1?line2?[31m"  # control characters neutralised
    assert by["newer"]["STATE"] == "paused"              # a state from a newer sidecar
    # columns align, also after a 2-byte character
    starts = {line.index(r["STATE"], len(r["TASK_ID"])) for line, r in zip(lines[1:], rows)}
    assert len(starts) == 1 and lines[0].index("STATE") in starts
    assert task_requests(fake) == [("task.list", [{}])]


def test_tasks_empty_and_state_filter(fake):
    p = ctl(fake, "tasks")
    assert p.returncode == 0 and p.stdout.split() == ["TASK_ID", "STATE", "REASON_KIND", "NODE",
                                                     "AGE", "REASON"]
    ctl(fake, "task", "start", "a")
    ctl(fake, "task", "start", "b")
    ctl(fake, "task", "stop", "b", "--reason", "no")
    p = ctl(fake, "tasks", "--state", "failed")
    assert p.returncode == 0, p.stderr
    assert [r["TASK_ID"] for r in table(p.stdout)] == ["b"]
    p = ctl(fake, "--state=running", "tasks")  # options go anywhere
    assert [r["TASK_ID"] for r in table(p.stdout)] == ["a"]
    lists = [p for m, p in task_requests(fake) if m == "task.list"]
    assert lists == [[{}], [{"state": "failed"}], [{"state": "running"}]]


def test_tasks_json_is_the_result_as_sent(fake):
    fake.tasks["t"] = {"task_id": "t", "state": "running", "updated_at": 1700000000.5,
                       "started_at": 1700000000.5, "runs": 1, "extra": {"k": [1, 2]}}
    p = ctl(fake, "tasks", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"tasks": [fake.tasks["t"]]}


def test_tasks_malformed_entries_are_skipped_with_a_note(fake):
    fake.tasks["ok"] = {"task_id": "ok", "state": "running", "updated_at": time.time()}
    fake.tasks["bad"] = {"state": "running"}  # no task_id
    p = ctl(fake, "tasks")
    assert p.returncode == 0
    assert [r["TASK_ID"] for r in table(p.stdout)] == ["ok"]
    assert "1 malformed task entry skipped" in p.stderr


def test_task_start_get_and_times(fake):
    p = ctl(fake, "task", "start", "run-1")
    assert p.returncode == 0, p.stderr
    d = kv(p.stdout)
    assert d["task_id"] == "run-1" and d["state"] == "running" and d["runs"] == "1"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(\d+s ago\)", d["updated_at"])
    assert re.fullmatch(r".*Z \(\d+s ago\)", d["started_at"])
    p = ctl(fake, "task", "get", "run-1", "--json")
    assert p.returncode == 0
    assert json.loads(p.stdout) == fake.tasks["run-1"]
    assert task_requests(fake) == [("task.start", [{"task_id": "run-1"}]),
                                   ("task.get", [{"task_id": "run-1"}])]


def test_task_stop_then_guard(fake):
    ctl(fake, "task", "start", "run-2")
    p = ctl(fake, "task", "guard", "run-2")
    assert p.returncode == 0 and p.stdout == "running\n"
    p = stop_then_guard(functools.partial(ctl, fake), "run-2", "operator: wrong input file")
    assert p.stdout == ""
    # stopping again is refused, and the first reason stays
    p = ctl(fake, "task", "stop", "run-2", "--reason", "second")
    assert p.returncode == 1
    assert p.stderr.startswith("error: task_stopped: task 'run-2' was stopped: operator: wrong")
    assert fake.tasks["run-2"]["reason"] == "operator: wrong input file"
    # a call naming the stopped task is refused with the reason
    p = ctl(fake, "call", "chat", "--body", "{}", "--task", "run-2")
    assert p.returncode == 1
    assert p.stderr.startswith("error: task_stopped: task 'run-2' was stopped: operator: wrong")
    # a stopped task cannot be started again
    p = ctl(fake, "task", "start", "run-2")
    assert p.returncode == 1 and p.stderr.startswith("error: task_stopped: ")
    reqs = task_requests(fake)
    # the stop is followed by a get, on the same connection, to show the task
    i = reqs.index(("task.stop", [{"task_id": "run-2", "reason": "operator: wrong input file"}]))
    assert reqs[i + 1] == ("task.get", [{"task_id": "run-2"}])
    assert reqs[i + 3] == ("task.stop", [{"task_id": "run-2", "reason": "second"}])
    assert reqs[i + 4][0] == "call"  # a refused stop reads nothing back


def test_task_guard_watchdog(fake):
    fake.tasks["w"] = {"task_id": "w", "state": "failed", "reason_kind": "watchdog",
                       "reason": "node embed exceeded 30s", "updated_at": time.time()}
    p = ctl(fake, "task", "guard", "w")
    assert p.returncode == 1
    assert p.stderr == ("error: watchdog_timeout: task 'w' failed by the watchdog: "
                        "node embed exceeded 30s\n")
    p = ctl(fake, "task", "guard", "w", "--json")
    assert p.returncode == 1 and json.loads(p.stdout)["code"] == "watchdog_timeout"


def test_task_finish(fake):
    ctl(fake, "task", "start", "ok-1")
    ctl(fake, "task", "start", "bad-1")
    p = ctl(fake, "task", "finish", "ok-1", "--ok")
    assert p.returncode == 0, p.stderr
    assert kv(p.stdout)["state"] == "succeeded" and "reason_kind" not in kv(p.stdout)
    p = ctl(fake, "task", "finish", "bad-1", "--failed", "--reason", "parse error on page 3")
    assert p.returncode == 0, p.stderr
    d = kv(p.stdout)
    assert (d["state"], d["reason_kind"], d["reason"]) == ("failed", "error",
                                                           "parse error on page 3")
    finishes = [p for m, p in task_requests(fake) if m == "task.finish"]
    assert finishes == [[{"task_id": "ok-1", "ok": True}],  # no reason key when not given
                        [{"task_id": "bad-1", "ok": False, "reason": "parse error on page 3"}]]
    # a finished task is not running: finishing it again is refused
    p = ctl(fake, "task", "finish", "ok-1", "--ok")
    assert p.returncode == 1
    assert p.stderr == "error: bad_request: task 'ok-1' already succeeded\n"


def test_task_unknown_is_bad_request(fake):
    p = ctl(fake, "task", "get", "nope")
    assert p.returncode == 1
    assert p.stderr == "error: bad_request: unknown task 'nope' (never started, or expired)\n"
    p = ctl(fake, "task", "get", "nope", "--json")
    assert json.loads(p.stdout) == {"code": "bad_request",
                                    "message": "unknown task 'nope' (never started, or expired)"}
    p = ctl(fake, "task", "stop", "nope", "--reason", "r")
    assert p.returncode == 1 and p.stderr.startswith("error: bad_request: unknown task")
    p = ctl(fake, "task", "guard", "nope")
    assert p.returncode == 1 and "bad_request" in p.stderr


def test_tasks_on_a_sidecar_without_tasks(fake):
    fake.tasks_supported = False
    p = ctl(fake, "tasks")
    assert p.returncode == 1
    assert p.stderr.startswith("error: unknown_method: tasks are not supported by this sidecar "
                               "(task.list: no method 'task.list')")
    p = ctl(fake, "task", "stop", "x", "--reason", "r")
    assert p.returncode == 1
    assert "tasks are not supported by this sidecar (task.stop:" in p.stderr


def test_task_timeout_exit_3(fake):
    t0 = time.monotonic()
    p = ctl(fake, "--timeout", "0.3", "task", "get", "hang-1")
    assert p.returncode == 3
    assert p.stderr.startswith("error: timeout: no answer to 'task.get' within 0.3s")
    assert time.monotonic() - t0 < 5


def test_task_commands_without_sidecar_exit_3(tmp):
    p = ctl(None, "--socket", os.path.join(tmp, "none.sock"), "tasks")
    assert p.returncode == 3 and p.stderr.startswith("error: connect_failed: ")


# --- libpolygw task helpers, through a small C driver -------------------------

TASKDRV_C = r'''
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "polygw.h"

/* taskdrv SOCKET CMD ARGS: one line per outcome on stdout.
 *   scope TASK NODE TIMEOUT MODE   pgw_task_node; MODE ok|fail|stop|call|nullerr
 *   begin TASK NODE TIMEOUT        pgw_task_node_begin
 *   end TASK NODE                  pgw_task_node_end
 *   guard TASK                     pgw_task_guard
 *   list [STATE]                   pgw_task_list + pgw_task_from_object
 *   invalid                        argument checks (nothing may be sent) */
struct job {
    struct pgw_client *c;
    const char *task, *mode;
    int called;
};

static int work(void *ud, struct pgw_error *err)
{
    struct job *j = ud;
    j->called++;
    printf("fn err_cleared=%d\n", err != NULL && err->code == PGW_OK);
    if (strcmp(j->mode, "ok") == 0 || strcmp(j->mode, "nullerr") == 0)
        return 0;
    if (strcmp(j->mode, "fail") == 0) {
        err->code = PGW_E_INVALID;
        snprintf(err->code_name, sizeof(err->code_name), "%s", pgw_error_code_name(PGW_E_INVALID));
        snprintf(err->message, sizeof(err->message), "the node's own failure");
        return 42;
    }
    if (strcmp(j->mode, "stop") == 0) {
        int rc = pgw_task_stop(j->c, j->task, "stopped inside the node", err);
        return rc < 0 ? rc : pgw_task_guard(j->c, j->task, err);
    }
    struct pgw_call_options o = { .task_id = j->task };
    struct pgw_result *r = NULL;
    int rc = pgw_call(j->c, "chat", "{\"q\": 1}", &o, &r, err);
    pgw_result_free(r);
    return rc;
}

static void report(const char *what, int rc, const struct pgw_error *e)
{
    printf("%s rc=%d code=%s msg=%s\n", what, rc, e->code_name, e->message);
}

int main(int argc, char **argv)
{
    struct pgw_client *c;
    struct pgw_error e;
    int rc;

    if (argc < 3 || pgw_connect(argv[1], NULL, &c, &e) < 0)
        return 3;
    const char *cmd = argv[2];
    if (strcmp(cmd, "scope") == 0 && argc == 7) {
        struct job j = { c, argv[3], argv[6], 0 };
        bool nullerr = strcmp(argv[6], "nullerr") == 0;
        rc = pgw_task_node(c, argv[3], argv[4], atof(argv[5]), work, &j, nullerr ? NULL : &e);
        if (nullerr)
            printf("scope rc=%d\n", rc);
        else
            report("scope", rc, &e);
        printf("called=%d\n", j.called);
    } else if (strcmp(cmd, "begin") == 0 && argc == 6) {
        double armed = -2;
        rc = pgw_task_node_begin(c, argv[3], argv[4], atof(argv[5]), &armed, &e);
        report("begin", rc, &e);
        printf("armed=%g\n", armed);
    } else if (strcmp(cmd, "end") == 0 && argc == 5) {
        report("end", pgw_task_node_end(c, argv[3], argv[4], &e), &e);
    } else if (strcmp(cmd, "guard") == 0 && argc == 4) {
        report("guard", pgw_task_guard(c, argv[3], &e), &e);
    } else if (strcmp(cmd, "list") == 0 && argc <= 4) {
        struct pgw_result *r;
        rc = pgw_task_list(c, argc == 4 ? argv[3] : NULL, &r, &e);
        report("list", rc, &e);
        const msgpack_object *a = pgw_object_get(pgw_result_object(r), "tasks");
        for (uint32_t i = 0; rc == 0 && a && i < a->via.array.size; i++) {
            struct pgw_task t;
            bool ok = pgw_task_from_object(&a->via.array.ptr[i], &t);
            printf("task ok=%d id=%s state=%d/%s kind=%s node=%s reason_len=%zu reason=%s "
                   "runs=%lld started=%d updated=%d\n", ok, t.task_id, (int)t.state,
                   t.state_name, t.reason_kind, t.node, strlen(t.reason), t.reason,
                   (long long)t.runs, t.started_at >= 0, t.updated_at >= 0);
        }
        pgw_result_free(r);
    } else if (strcmp(cmd, "invalid") == 0) {
        struct pgw_result *r = (struct pgw_result *)&e; /* must be reset to NULL */
        printf("%d\n", pgw_task_start(c, "", &r, &e));
        printf("%d\n", r == NULL);
        printf("%d\n", pgw_task_start(c, NULL, NULL, &e));
        printf("%d\n", pgw_task_stop(c, "t", NULL, &e));
        printf("%d\n", pgw_task_guard(c, "", &e));
        printf("%d\n", pgw_task_node_begin(c, "t", "", 0, NULL, &e));
        printf("%d\n", pgw_task_node_begin(c, "t", "n", NAN, NULL, &e));
        printf("%d\n", pgw_task_node_begin(c, "t", "n", INFINITY, NULL, &e));
        printf("%d\n", pgw_task_node_end(c, "t", NULL, &e));
        printf("%d\n", pgw_task_finish(c, "", true, NULL, &e));
        printf("%d\n", pgw_task_get(c, "", NULL, &e));
        printf("%d\n", pgw_task_list(c, "", NULL, &e));
        printf("%d\n", pgw_task_node(c, "t", "n", 0, NULL, NULL, &e));
        printf("%d\n", pgw_task_node(c, "t", "", 0, work, NULL, &e));
        printf("%d\n", pgw_task_guard(NULL, "t", &e));
        printf("%d\n", pgw_task_from_object(NULL, NULL));
        report("last", 0, &e);
    } else {
        pgw_close(c);
        return 2;
    }
    pgw_close(c);
    return 0;
}
'''


def build_taskdrv(outdir):
    """Compiles TASKDRV_C against $POLYGW_BUILD/libpolygw.a (sanitized when the
    library is) -> path, or pytest.skip when there is no C compiler."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to build the libpolygw test driver")
    lib = os.path.join(BUILD, "libpolygw.a")
    src = os.path.join(outdir, "taskdrv.c")
    exe = os.path.join(outdir, "taskdrv")
    with open(src, "w") as f:
        f.write(TASKDRV_C)
    with open(lib, "rb") as f:
        sanitized = b"__asan_" in f.read()
    flags = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"] if sanitized else []
    libs = subprocess.run(["pkg-config", "--libs", "msgpack", "jansson"], capture_output=True,
                          text=True).stdout.split() or ["-lmsgpackc", "-ljansson"]
    argv = [cc, "-std=gnu11", "-Wall", "-Werror", "-g"] + flags + [
        "-I", os.path.join(ROOT, "client", "c"), "-I", os.path.join(ROOT, "proto"),
        src, lib, "-o", exe] + libs + ["-lm", "-lpthread"]
    p = subprocess.run(argv, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return exe


@pytest.fixture(scope="module")
def taskdrv():
    d = tempfile.mkdtemp(prefix="pgwdrv", dir="/tmp")
    try:
        yield build_taskdrv(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def drv(exe, sock, *args):
    p = subprocess.run([exe, sock] + list(args), capture_output=True, text=True, env=env_for(),
                       timeout=20)
    check_clean(p.stderr)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    return p.stdout


def test_lib_node_scope_ok(fake, taskdrv):
    ctl(fake, "task", "start", "t")
    del fake.requests[:]
    out = drv(taskdrv, fake.path, "scope", "t", "parse", "2.5", "ok")
    assert out == "fn err_cleared=1\nscope rc=0 code=ok msg=\ncalled=1\n"
    assert task_requests(fake) == [
        ("task.guard", [{"task_id": "t"}]),
        ("task.node_begin", [{"task_id": "t", "node": "parse", "timeout_s": 2.5}]),
        ("task.node_end", [{"task_id": "t", "node": "parse"}]),
    ]
    # timeout <= 0 sends none (the sidecar picks it); a NULL err is fine
    out = drv(taskdrv, fake.path, "scope", "t", "parse", "0", "nullerr")
    assert out == "fn err_cleared=1\nscope rc=0\ncalled=1\n"
    assert task_requests(fake)[4] == ("task.node_begin", [{"task_id": "t", "node": "parse"}])


def test_lib_node_scope_call_inside_uses_the_client(fake, taskdrv):
    ctl(fake, "task", "start", "t")
    out = drv(taskdrv, fake.path, "scope", "t", "n", "0", "call")
    assert "scope rc=0 code=ok" in out
    methods = [m for m, _ in task_requests(fake)]
    assert methods[-4:] == ["task.guard", "task.node_begin", "call", "task.node_end"]
    assert fake.requests[-2][2][0]["task_id"] == "t"


def test_lib_node_scope_stopped_task_never_runs_fn(fake, taskdrv):
    ctl(fake, "task", "start", "t")
    ctl(fake, "task", "stop", "t", "--reason", "enough")
    del fake.requests[:]
    out = drv(taskdrv, fake.path, "scope", "t", "n", "0", "ok")
    assert out == "scope rc=-1 code=task_stopped msg=task 't' was stopped: enough\ncalled=0\n"
    assert task_requests(fake) == [("task.guard", [{"task_id": "t"}])]


def test_lib_node_scope_stop_inside_skips_node_end(fake, taskdrv):
    ctl(fake, "task", "start", "t")
    del fake.requests[:]
    out = drv(taskdrv, fake.path, "scope", "t", "n", "0", "stop")
    assert out.endswith("scope rc=-1 code=task_stopped msg=task 't' was stopped: "
                        "stopped inside the node\ncalled=1\n")
    assert [m for m, _ in task_requests(fake)] == ["task.guard", "task.node_begin", "task.stop",
                                                    "task.guard"]


def test_lib_node_scope_fn_failure_wins_and_node_ends(fake, taskdrv):
    ctl(fake, "task", "start", "t")
    del fake.requests[:]
    out = drv(taskdrv, fake.path, "scope", "t", "n", "0", "fail")
    assert out.endswith("scope rc=42 code=invalid_argument msg=the node's own failure\n"
                        "called=1\n")
    assert [m for m, _ in task_requests(fake)][-1] == "task.node_end"
    assert "node" not in fake.tasks["t"]


def test_lib_node_begin_end_and_guard(fake, taskdrv):
    ctl(fake, "task", "start", "t")
    assert drv(taskdrv, fake.path, "begin", "t", "n", "7") == \
        "begin rc=0 code=ok msg=\narmed=7\n"
    assert fake.tasks["t"]["node"] == "n"
    assert drv(taskdrv, fake.path, "end", "t", "n") == "end rc=0 code=ok msg=\n"
    assert drv(taskdrv, fake.path, "begin", "t", "n", "-1") == \
        "begin rc=0 code=ok msg=\narmed=600\n"
    assert drv(taskdrv, fake.path, "guard", "nope") == \
        "guard rc=-1 code=bad_request msg=unknown task 'nope' (never started, or expired)\n"
    fake.tasks_supported = False
    assert drv(taskdrv, fake.path, "begin", "t", "n", "1").startswith(
        "begin rc=-1 code=unknown_method msg=tasks are not supported by this sidecar "
        "(task.node_begin: ")


def test_lib_task_from_object(fake, taskdrv):
    now = time.time()
    fake.tasks["a"] = {"task_id": "a", "state": "failed", "reason_kind": "stopped",
                       "reason": "\u00e9" * 300, "node": "n1", "updated_at": now,
                       "started_at": now, "runs": 4}
    fake.tasks["b"] = {"task_id": "b", "state": "weird", "updated_at": "not a number"}
    fake.tasks["c"] = {"task_id": 5, "state": "running"}
    out = drv(taskdrv, fake.path, "list").splitlines()
    assert out[0] == "list rc=0 code=ok msg="
    # a 600-byte reason is cut to 512 bytes, at a character boundary
    assert out[1] == ("task ok=1 id=a state=3/failed kind=stopped node=n1 reason_len=512 "
                      "reason=%s runs=4 started=1 updated=1" % ("\u00e9" * 256))
    assert out[2] == ("task ok=1 id=b state=0/weird kind= node= reason_len=0 reason= runs=-1 "
                      "started=0 updated=0")
    assert out[3] == ("task ok=0 id= state=0/ kind= node= reason_len=0 reason= runs=-1 "
                      "started=0 updated=0")


def test_lib_invalid_arguments_send_nothing(fake, taskdrv):
    out = drv(taskdrv, fake.path, "invalid").splitlines()
    assert out[:-1] == ["-7", "1", "-7", "-7", "-7", "-7", "-7", "-7", "-7", "-7", "-7", "-7",
                        "-7", "-7", "-7", "0"]
    assert out[-1] == "last rc=0 code=invalid_argument msg=client is NULL"
    assert fake.requests == []

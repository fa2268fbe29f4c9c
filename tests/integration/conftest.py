"""Shared fixtures for the integration tests.

Every test drives the real `polygw` binary (from $POLYGW_BUILD, default
`build/`; `make test` points it at the ASan+UBSan build) through its Unix
socket. A sidecar that exits non-zero, or prints a sanitizer report, fails
the test that owned it.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import msgpack
import pytest

from mock import MockUpstream

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("POLYGW_BUILD", os.path.join(ROOT, "build"))
POLYGW = os.path.join(BUILD, "polygw")
POLYGWCTL = os.path.join(BUILD, "polygwctl")

SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")

BASE_CONFIG = """\
listen:
  mode: "0660"
{listen_extra}
server:
  log_level: {log_level}
  shutdown_grace_s: {grace}
{extra}
"""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "timing: asserts a wall-clock bound or makes heavy load; make test runs "
        "these alone, after the others have run on every core")


def sanitizer_env():
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    return env


class PolygwProcess:
    """What every way of running polygw shares: `proc` (a Popen, or None
    before the start), its output in the file `log` open at `log_path`, and
    `returncode` once stopped."""

    def logs(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self, sig=signal.SIGTERM, timeout=15.0):
        """Stops polygw and returns its exit code (asserting nothing)."""
        if self.proc is None or self.returncode is not None:
            return self.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.returncode = self.proc.wait()
            raise AssertionError("polygw did not exit within %ss of %s:\n%s" % (timeout, sig, self.logs()))
        finally:
            self.log.close()
        return self.returncode

    def assert_clean(self):
        text = self.logs()
        for marker in SANITIZER_MARKERS:
            assert marker not in text, "sanitizer report in polygw output:\n" + text


class Sidecar(PolygwProcess):
    """One polygw process with its own config, socket and log file."""

    def __init__(self, workdir, config_text=None, listen_extra="", extra="", log_level="info",
                 grace=2, args=(), preexec_fn=None, env=None):
        self.dir = workdir
        self.sock = os.path.join(workdir, "polygw.sock")
        self.config = os.path.join(workdir, "polygw.yaml")
        self.log_path = os.path.join(workdir, "polygw.log")
        if config_text is None:
            config_text = BASE_CONFIG.format(listen_extra=listen_extra, extra=extra,
                                             log_level=log_level, grace=grace)
        with open(self.config, "w") as f:
            f.write(config_text)
        self.args = list(args)
        self.preexec_fn = preexec_fn
        self.env = env
        self.proc = None
        self.returncode = None
        self.expected_rc = 0  # what the fixture's teardown requires

    def start(self, wait=True):
        self.returncode = None  # a restarted sidecar is stopped and checked again
        self.log = open(self.log_path, "ab")
        env = sanitizer_env()
        if self.env:
            env.update(self.env)
        self.proc = subprocess.Popen(
            [POLYGW, "--config", self.config, "--socket", self.sock] + self.args,
            stdout=self.log, stderr=self.log, env=env, preexec_fn=self.preexec_fn)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("polygw exited early (%s):\n%s" % (self.proc.returncode, self.logs()))
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(self.sock)
                s.close()
                return
            except OSError:
                time.sleep(0.02)
        raise AssertionError("polygw did not start listening:\n" + self.logs())

    def send_signal(self, sig):
        self.proc.send_signal(sig)

    def connect(self, **kw):
        return Conn(self.sock, **kw)


class Conn:
    """A raw msgpack-RPC connection (no client library in the way)."""

    def __init__(self, path, timeout=5.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        self.next_id = 1
        self.backlog = []

    def close(self):
        self.sock.close()

    def send_raw(self, data):
        self.sock.sendall(data)

    def send(self, obj):
        self.sock.sendall(msgpack.packb(obj, use_bin_type=True))

    def request_async(self, method, params=None):
        msgid = self.next_id
        self.next_id += 1
        self.send([0, msgid, method, [] if params is None else [params]])
        return msgid

    def recv_msg(self, timeout=5.0):
        """Next message, or None on EOF. Raises socket.timeout."""
        if self.backlog:
            return self.backlog.pop(0)
        deadline = time.monotonic() + timeout
        while True:
            for msg in self.unpacker:
                return msg
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("no message within %ss" % timeout)
            self.sock.settimeout(left)
            data = self.sock.recv(1 << 16)
            if not data:
                return None
            self.unpacker.feed(data)

    def wait_response(self, msgid, timeout=5.0):
        deadline = time.monotonic() + timeout
        kept = []
        try:
            while True:
                msg = self.recv_msg(max(0.001, deadline - time.monotonic()))
                if msg is None:
                    raise AssertionError("connection closed while waiting for %d" % msgid)
                if msg[0] == 1 and msg[1] == msgid:
                    return msg
                kept.append(msg)
        finally:
            self.backlog = kept + self.backlog

    def request(self, method, params=None, timeout=5.0):
        """Returns (error, result)."""
        msg = self.wait_response(self.request_async(method, params), timeout)
        return msg[2], msg[3]

    def expect_eof(self, timeout=5.0):
        """Reads until EOF; returns the messages seen before it."""
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            msg = self.recv_msg(max(0.001, deadline - time.monotonic()))
            if msg is None:
                return seen
            seen.append(msg)


@pytest.fixture
def workdir():
    # Unix socket paths are limited to 107 bytes: keep them short.
    d = tempfile.mkdtemp(prefix="pgw", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def make_sidecar(workdir):
    """Factory: make_sidecar(**kw) -> started Sidecar; all are stopped and
    checked (exit 0, no sanitizer report) at teardown."""
    started = []

    def factory(start=True, subdir=None, **kw):
        d = workdir
        if subdir:
            d = os.path.join(workdir, subdir)
            os.makedirs(d, exist_ok=True)
        sc = Sidecar(d, **kw)
        started.append(sc)
        if start:
            sc.start()
        return sc

    yield factory
    for sc in started:
        if sc.proc is None:
            continue
        rc = sc.stop()
        sc.assert_clean()
        assert rc == sc.expected_rc, "polygw exited with %s:\n%s" % (rc, sc.logs())


@pytest.fixture
def sidecar(make_sidecar):
    return make_sidecar()


@pytest.fixture
def up():
    """A mock upstream (tests/mock_upstream), checked at teardown like a sidecar."""
    with MockUpstream() as m:
        yield m


@pytest.fixture
def up2():
    """A second mock upstream."""
    with MockUpstream() as m:
        yield m


# ------------------------------------------------- helpers shared by the tests
def yaml_value(v):
    """A Python value as a YAML flow value (maps, booleans, numbers, strings)."""
    if isinstance(v, dict):
        return "{%s}" % ", ".join("%s: %s" % (k, yaml_value(x)) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return "[%s]" % ", ".join(yaml_value(x) for x in v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))          # a JSON string is a valid YAML scalar


def yaml_section(name, keys):
    """The lines of a top-level section `name:` with one `key: value` a line."""
    return ["%s:" % name] + ["  %s: %s" % (k, yaml_value(v)) for k, v in keys.items()]


def source_yaml(name, capability, base_url, defaults, **kw):
    """One `sources:` list item: `defaults` (each test file has its own),
    then `kw`, which overrides them."""
    item = {"name": name, "capability": capability, "base_url": base_url}
    item.update(defaults)
    item.update(kw)
    return "\n".join(("  - %s: %s" if i == 0 else "    %s: %s") % (k, yaml_value(v))
                     for i, (k, v) in enumerate(item.items()))


def config_yaml(sources, defaults, capabilities=None, backend=None, listen=None,
                log_level="info", grace=2):
    """The YAML text of a sidecar config: `sources` are source_yaml() items,
    `defaults`, `capabilities` and `backend` are maps (no section where
    None), `listen` adds keys to the listen section."""
    out = yaml_section("listen", dict({"mode": "0660"}, **(listen or {})))
    out.append("server:\n  log_level: %s\n  shutdown_grace_s: %s" % (log_level, yaml_value(grace)))
    if backend:
        out.extend(yaml_section("backend", backend))
    out.extend(yaml_section("defaults", defaults))
    if capabilities:
        out.extend(yaml_section("capabilities", capabilities))
    out.append("sources:")
    out.extend(sources)
    return "\n".join(out) + "\n"


def chat(text="hello", mock=None, model="m", **extra):
    """A chat completions body; `mock` scripts the mock upstream's answer."""
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    if mock is not None:
        body["mock"] = mock
    body.update(extra)
    return body


def call(c, capability, body, timeout=5.0, **params):
    """One call on connection `c`; returns (error, result, elapsed seconds
    seen by the client)."""
    p = {"capability": capability, "body": body}
    p.update(params)
    t0 = time.monotonic()
    msg = c.wait_response(c.request_async("call", p), timeout)
    return msg[2], msg[3], time.monotonic() - t0


TASK_METHODS = (("task.get", {}), ("task.guard", {}), ("task.stop", {"reason": "mine now"}),
                ("task.finish", {"ok": True}), ("task.start", {}),
                ("task.node_begin", {"node": "n"}))


def await_true(pred, timeout=10.0, what="condition"):
    """Poll `pred` until it holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


def assert_task_unknown(c, task_id):
    """Every task method, and a call, that connection `c` makes naming
    `task_id` is answered exactly as for a task that never existed."""
    unknown, _ = c.request("task.get", {"task_id": "never-started"})
    assert unknown["code"] == "bad_request"
    for method, p in TASK_METHODS:
        err, _ = c.request(method, dict(p, task_id=task_id))
        assert err is not None and err["code"] == "bad_request", (method, err)
        assert err["message"] == unknown["message"].replace("never-started", task_id), \
            (method, err)
    msg = c.wait_response(c.request_async("call", {"capability": "chat", "task_id": task_id,
                                                   "body": {"messages": []}}), 5)
    assert msg[2]["code"] == "bad_request" and "unknown task" in msg[2]["message"], msg[2]


def cpu_seconds(pid):
    """User + system CPU time a process has used so far."""
    fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Pending:
    """A call on its own connection, answered in a background thread, so a
    test can run several calls at once and know when each one ended.
    `elapsed` is from just before the request was sent to the answer."""

    def __init__(self, sc, capability, body, timeout=10.0, **params):
        self.conn = sc.connect(timeout=timeout)
        self.timeout = timeout
        self.err = self.res = self.exc = None
        self.t_end = None
        self.done = threading.Event()
        p = {"capability": capability, "body": body}
        p.update(params)
        self.t0 = time.monotonic()
        self.msgid = self.conn.request_async("call", p)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            msg = self.conn.wait_response(self.msgid, self.timeout)
            self.t_end = time.monotonic()
            self.err, self.res = msg[2], msg[3]
        except Exception as e:  # reported by wait()
            self.exc = e
        self.done.set()

    @property
    def elapsed(self):
        return self.t_end - self.t0

    def answered(self):
        return self.done.is_set()

    def wait(self, timeout=5.0):
        assert self.done.wait(timeout), "call %d not answered within %ss" % (self.msgid, timeout)
        if self.exc:
            raise self.exc
        return self.err, self.res

    def cancel(self):
        self.conn.send([2, "cancel", [self.msgid]])

    @property
    def code(self):
        return None if self.err is None else self.err.get("code")

    def close(self):
        try:
            self.conn.close()
        except OSError:
            pass

"""Drive the scriptable mock upstream (tests/mock_upstream) from Python tests.

Standard library only: the integration tests run with Debian's /usr/bin/python3.

    from mock import MockUpstream

    with MockUpstream() as up:
        up.script([{}, {"status": 429, "retry_after": 1}])   # 2nd request gets a 429
        ... point the sidecar at up.url ...
        assert up.stats()["requests"] == 2
        assert up.last()["authorization"] == "Bearer sk-test"

stop() (and leaving the `with` block) sends SIGTERM and asserts exit code 0, so
an ASan/LSan report from the mock fails the test that owns it. The scripting
interface is documented in tests/mock_upstream/README.md.
"""

import http.client
import json
import os
import select
import signal
import subprocess
import tempfile
import time

__all__ = ["MockUpstream", "mock_binary"]


def mock_binary():
    """Path of the mock binary: $POLYGW_BUILD/mock_upstream, else build/mock_upstream
    relative to the repository root."""
    build = os.environ.get("POLYGW_BUILD")
    if not build:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        build = os.path.join(root, "build")
    return os.path.join(build, "mock_upstream")


class MockUpstream:
    """One mock upstream process on 127.0.0.1 (a free port unless `port` is given)."""

    def __init__(self, port=0, host="127.0.0.1", binary=None, start=True, start_timeout=10.0):
        self.host = host
        self.port = None
        self._want_port = port
        self.binary = binary or mock_binary()
        self.proc = None
        self._stderr = None
        if start:
            self.start(start_timeout)

    # ------------------------------------------------------------ lifecycle
    def start(self, timeout=10.0):
        if self.proc is not None:
            raise RuntimeError("mock upstream already started")
        if not os.access(self.binary, os.X_OK):
            raise FileNotFoundError("mock upstream binary not found: %s (run make)" % self.binary)
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self._want_port), "--host", self.host],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr)
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                break
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                ch = os.read(self.proc.stdout.fileno(), 1)
                if not ch:
                    break
                line += ch
        parts = line.decode("ascii", "replace").split()
        if len(parts) != 2 or parts[0] != "LISTENING":
            self._kill()
            raise RuntimeError("mock upstream did not start (got %r): %s"
                               % (line, self._stderr_text()))
        self.port = int(parts[1])
        return self

    def stop(self, timeout=10.0):
        """SIGTERM, wait, and assert a clean exit (code 0: no sanitizer report)."""
        if self.proc is None:
            return
        proc = self.proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self._finish()
                raise AssertionError("mock upstream did not exit within %.0fs of SIGTERM" % timeout)
        code = proc.returncode
        err = self._stderr_text()
        self._finish()
        assert code == 0, "mock upstream exited with %r; stderr:\n%s" % (code, err)

    def _kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._finish()

    def _finish(self):
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()
        self.proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _stderr_text(self):
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.stop()
        else:
            try:
                self.stop()
            except AssertionError:
                pass   # do not hide the test's own failure

    # ------------------------------------------------------------ addresses
    @property
    def base(self):
        """http://127.0.0.1:PORT (no path)."""
        return "http://%s:%d" % (self.host, self.port)

    @property
    def url(self):
        """OpenAI-style base URL: http://127.0.0.1:PORT/v1."""
        return self.base + "/v1"

    # -------------------------------------------------------------- control
    def _control(self, method, path, obj=None, timeout=5.0):
        body = None if obj is None else json.dumps(obj).encode()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            headers = {"Connection": "close"}
            if body is not None:
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        doc = json.loads(data) if data else None
        if resp.status != 200:
            raise RuntimeError("mock %s %s: %d %s" % (method, path, resp.status, data[:500]))
        return doc

    def script(self, behaviours, append=False):
        """Queue behaviour objects, consumed one per API request in order.
        Replaces the queue unless append=True. Returns the queue length."""
        doc = {"append": list(behaviours)} if append else list(behaviours)
        return self._control("POST", "/_mock/script", doc)["queue_len"]

    def set_default(self, behaviour):
        """Behaviour for every API request while the queue is empty; None clears it."""
        self._control("POST", "/_mock/script", {"default": behaviour})

    def require_auth(self, dialect, key, name=None):
        """Every API request must authenticate as `dialect` (openai, azure,
        anthropic, gemini, query) with `key`; a wrong or missing one gets
        that provider's own error. None as dialect lifts the check."""
        auth = None if dialect is None else dict({"dialect": dialect, "key": key},
                                                 **({"name": name} if name else {}))
        self._control("POST", "/_mock/script", {"auth": auth})

    def stats(self):
        return self._control("GET", "/_mock/stats")

    def last(self):
        """The newest API request: {method, target, path, headers, authorization,
        body, body_bytes, body_truncated, json}, or None."""
        return self._control("GET", "/_mock/last")

    def requests(self):
        """Up to 32 most recent API requests, oldest first (same shape as last())."""
        return self._control("GET", "/_mock/requests")

    def reset(self, drop_connections=False):
        """Zero the counters, clear queue, default and history. With
        drop_connections, also close every open client connection."""
        self._control("POST", "/_mock/reset",
                      {"drop_connections": True} if drop_connections else {})

    def wait_stats(self, predicate, timeout=2.0, interval=0.01):
        """Poll stats() until predicate(stats) is true; returns those stats or
        raises AssertionError with the last ones after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.stats()
            if predicate(st):
                return st
            if time.monotonic() >= deadline:
                raise AssertionError("mock stats condition not met within %.1fs: %r" % (timeout, st))
            time.sleep(interval)

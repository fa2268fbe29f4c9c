"""Helpers for the fleet tests (test_redis_fleet.py): a real redis-server that
can be SIGKILLed and restarted on the same port, fleet configs, and a call
answered in a background thread.

The RESP client and the RedisServer base class come from tests/redis/
redis_support.py (imported, not copied): it starts `redis-server` on a free
127.0.0.1 port with no persistence, in a temp dir.

Standard library + msgpack only (Debian's /usr/bin/python3, like the rest of
tests/integration). Every wait here is bounded.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# Appended, not prepended: tests/redis has a conftest.py of its own, which
# must never shadow this directory's.
sys.path.append(os.path.join(os.path.dirname(HERE), "redis"))
from conftest import Pending, chat, config_yaml, source_yaml  # noqa: E402,F401  (re-exported)
from redis_support import RedisError, RedisServer, Resp, free_port, wait_until  # noqa: E402

__all__ = ["FleetRedis", "RedisError", "Resp", "free_port", "unique_prefix", "fleet_config",
           "source", "Pending", "stats", "wait_backend", "chat", "wait_until",
           "assert_failover_excess"]


class FleetRedis(RedisServer):
    """A private redis-server (RedisServer from tests/redis) that also
    supports `--requirepass` (the readiness PING authenticates), SIGKILL and
    a restart on the SAME port (what a sidecar reconnects to)."""

    def __init__(self, password=None, extra=()):
        extra = list(extra)
        if password:
            extra += ["--requirepass", password]
        super().__init__(extra=extra)
        self.password = password

    def url(self, password=None):
        pw = self.password if password is None else password
        auth = ":%s@" % pw if pw else ""
        return "redis://%s127.0.0.1:%d/0" % (auth, self.port)

    def client(self, timeout=2.0):
        c = Resp(self.port, timeout=timeout)
        if self.password:
            c.call("AUTH", self.password)
        return c

    def _spawn(self, port, timeout=5.0):
        """Starts redis-server on `port`; True once it answers PING."""
        exe = shutil.which("redis-server")
        self.port = port
        log = open(os.path.join(self.dir, "redis.log"), "a")
        try:
            self.proc = subprocess.Popen(
                [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--daemonize", "no", "--dir", self.dir] + self.extra,
                stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                c = self.client(timeout=1)
                try:
                    if c.call("PING") == "PONG":
                        return True
                finally:
                    c.close()
            except (OSError, RedisError):
                pass
            time.sleep(0.02)
        return False

    def start(self):
        if not shutil.which("redis-server"):
            pytest.skip("redis-server not installed (make deps installs it)")
        for _ in range(5):
            if self._spawn(free_port()):
                return self
            self.stop()   # port race or slow start: try another port
        raise RuntimeError("redis-server did not start; see %s/redis.log" % self.dir)

    def kill(self):
        """SIGKILL: no shutdown, connections reset by the kernel."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)
        self.proc = None

    def freeze(self):
        """SIGSTOP: connections stay open, nothing is answered."""
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self):
        self.thaw()   # a frozen server cannot act on SIGTERM
        super().stop()

    def restart(self, timeout=5.0):
        """Starts again on the same port (the sidecars' URL still points there)."""
        assert self.proc is None, "restart() after kill() or stop()"
        deadline = time.monotonic() + timeout
        while True:   # the port is free again at once (SO_REUSEADDR); retry a bind race anyway
            if self._spawn(self.port, timeout=max(0.1, deadline - time.monotonic())):
                return self
            self.stop()
            if time.monotonic() >= deadline:
                raise RuntimeError("redis-server did not restart on port %d; see %s/redis.log"
                                   % (self.port, self.dir))
            time.sleep(0.05)


def unique_prefix():
    """A key prefix of its own per test: fleets of different tests never share state."""
    return "pgwt-" + uuid.uuid4().hex[:10]


# ------------------------------------------------------------------ configs
# Admission wide open (no AIMD ramp-up or decrease, a local breaker that
# never opens): only the fleet rule under test limits. ttft_timeout_s must
# be <= the stall window (a config rule): tests with windows < 5 s lower it.
SOURCE_DEFAULTS = {"timeout_s": 30, "connect_timeout_s": 2, "ttft_timeout_s": 5,
                   "idle_timeout_s": 30, "max_concurrency": 256,
                   "aimd": {"initial": 256, "min": 256}, "breaker": {"failures": 100000}}


def source(name, capability, base_url, **kw):
    return source_yaml(name, capability, base_url, SOURCE_DEFAULTS, **kw)


def fleet_config(url, prefix, sources, backend=None, capabilities=None, log_level="info",
                 grace=2, listen=None, **defaults):
    """A sidecar config on the Redis backend. `backend` adds keys to the
    backend map (command_timeout_s, lease_ttl_s), `listen` to the listen
    section; `grace` is server.shutdown_grace_s."""
    b = {"kind": "redis", "prefix": prefix}
    if url:   # None: the backend map names the endpoint (sentinels)
        b["url"] = url
    b.update(backend or {})
    d = {"max_attempts": 3, "stall_window_s": 10, "backoff_base_s": 0.05, "backoff_max_s": 0.1,
         "poll_interval_s": 0.1}
    d.update(defaults)
    return config_yaml(sources, d, capabilities, backend=b, listen=listen, log_level=log_level,
                       grace=grace)


# ------------------------------------------------------------------- calls


def stats(sc, timeout=3.0):
    c = sc.connect(timeout=timeout)
    try:
        err, res = c.request("stats", timeout=timeout)
    finally:
        c.close()
    assert err is None, err
    return res


def wait_backend(sc, up=True, timeout=5.0):
    """Waits until the sidecar's `stats.backend` says it is (or is not) up,
    with the subscriber connected when up; returns that `backend` map."""
    last = [None]

    def check():
        b = stats(sc)["backend"]
        last[0] = b
        ok = b.get("state") == "up" and b.get("subscribed", True) is not False
        return b if ok == up else None
    b = wait_until(check, timeout, interval=0.02)
    assert b, "backend state not %s within %ss: %r\n%s" % (
        "up" if up else "down", timeout, last[0], sc.logs()[-3000:])
    return b


def assert_failover_excess(what, samples, t0, t_kill, cap, win):
    """A token bucket of `cap` per `win` seconds through a failover at
    t_kill: the mock's request counts (t, n) sampled from t0 never exceed
    cap + rate x (t - t0) before it (+1: sampling), nor by more than one
    capacity after it (the writes a promoted replica never saw). Prints both."""
    rate = cap / win
    excess = max(n - (cap + rate * (t - t0)) for t, n in samples)
    before = max(n - (cap + rate * (t - t0)) for t, n in samples if t < t_kill)
    print("%s: admitted %d attempts in %.1fs at rpm %d/%.0fs; most above the limit: "
          "%.1f before the failover, %.1f over the whole run (bound: one capacity, %d)"
          % (what, samples[-1][1], samples[-1][0] - t0, cap, win, before, excess, cap))
    assert before <= 1, "the limit did not hold before the failover: %.1f over" % before
    assert excess <= cap + 1, "over-admission %.1f beyond one window (%d)" % (excess, cap)

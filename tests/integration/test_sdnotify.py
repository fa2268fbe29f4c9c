"""sd_notify(3) for real: the test plays systemd's part.

It binds an AF_UNIX datagram socket, names it in NOTIFY_SOCKET (and sets
WATCHDOG_USEC / WATCHDOG_PID where the test is about the watchdog), starts
the real sidecar and reads what the sidecar tells "systemd": READY=1 once
the socket accepts (and, with the Redis backend, Redis is connected),
WATCHDOG=1 every half interval from the event loop and none while the loop
is wedged (the debug.wedge test hook, compiled into the sanitizer build
only), STOPPING=1 at SIGTERM.

WATCHDOG_PID must be the sidecar's own pid, known only after fork: the same
`sh -c '...; exec "$@"'` wrapper as the socket-activation tests sets it
(exec keeps the pid).
"""
import os
import signal
import socket
import subprocess
import time

import pytest

from conftest import BASE_CONFIG, POLYGW, Conn, PolygwProcess, sanitizer_env
from redis_fixture import FleetRedis, fleet_config, source, unique_prefix

WRAPPER = 'WATCHDOG_PID=$$; export WATCHDOG_PID; exec "$@"'


class Manager:
    """The service manager's end of NOTIFY_SOCKET: every datagram, with the
    monotonic time it arrived."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.got = []   # (t, {key: value}, raw)

    def close(self):
        self.sock.close()

    def recv(self, timeout):
        """The next message, or None when none came within `timeout`."""
        self.sock.settimeout(max(0.001, timeout))
        try:
            data = self.sock.recv(4096)
        except socket.timeout:
            return None
        t = time.monotonic()
        fields = dict(line.split("=", 1) for line in data.decode().split("\n") if "=" in line)
        self.got.append((t, fields, data))
        return t, fields

    def wait_for(self, key, timeout, on_message=None):
        """Reads until a message with `key` arrives; returns (t, fields) or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.recv(deadline - time.monotonic())
            if m is None:
                return None
            if on_message:
                on_message(m)
            if key in m[1]:
                return m
        return None

    def collect(self, seconds):
        """Every message within `seconds`."""
        out = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            m = self.recv(deadline - time.monotonic())
            if m is not None:
                out.append(m)
        return out


class Notified(PolygwProcess):
    """A polygw started under a (fake) Type=notify service manager."""

    def __init__(self, workdir, manager, config_text=None, watchdog_usec=None,
                 watchdog_pid="self"):
        self.sock = os.path.join(workdir, "polygw.sock")
        self.config = os.path.join(workdir, "polygw.yaml")
        self.log_path = os.path.join(workdir, "polygw.log")
        with open(self.config, "w") as f:
            f.write(config_text or BASE_CONFIG.format(listen_extra="", extra="", log_level="info",
                                                      grace=2))
        env = sanitizer_env()
        env["NOTIFY_SOCKET"] = manager.path
        env.pop("WATCHDOG_PID", None)
        env.pop("WATCHDOG_USEC", None)
        argv = [POLYGW, "--config", self.config, "--socket", self.sock]
        if watchdog_usec is not None:
            env["WATCHDOG_USEC"] = str(watchdog_usec)
            if watchdog_pid == "self":
                argv = ["/bin/sh", "-c", WRAPPER, "sh"] + argv
            elif watchdog_pid is not None:
                env["WATCHDOG_PID"] = str(watchdog_pid)
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=self.log, env=env)
        self.returncode = None

    def accepts(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.sock)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def wait_accepts(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "polygw exited early:\n" + self.logs()
            if self.accepts():
                return
            time.sleep(0.02)
        raise AssertionError("polygw did not start listening:\n" + self.logs())


@pytest.fixture
def manager(workdir):
    m = Manager(os.path.join(workdir, "notify.sock"))
    yield m
    m.close()


@pytest.fixture
def notified(workdir, manager):
    """Factory: notified(**kw) -> a started Notified; stopped and checked at teardown."""
    started = []

    def factory(**kw):
        p = Notified(workdir, manager, **kw)
        started.append(p)
        return p
    yield factory
    for p in started:
        rc = p.stop()
        p.assert_clean()
        assert rc == 0, "polygw exited with %s:\n%s" % (rc, p.logs())


def has_wedge_hook(sc):
    c = Conn(sc.sock)
    try:
        err, _ = c.request("debug.wedge", {"seconds": 0})
    finally:
        c.close()
    return err is None


def test_sdnotify__ready_only_once_the_socket_accepts_then_stopping_at_sigterm(manager, notified):
    sc = notified()
    accepted_when_ready = []
    m = manager.wait_for("READY", 10.0,
                         on_message=lambda m: accepted_when_ready.append(sc.accepts()))
    assert m is not None, "no READY=1 within 10 s:\n" + sc.logs()
    # The message that carried READY=1 was read only after it was sent, and
    # at that moment (and at every earlier message) the socket accepted.
    assert sc.accepts() and all(accepted_when_ready), accepted_when_ready
    assert m[1]["READY"] == "1"
    assert "memory backend" in m[1].get("STATUS", ""), m
    c = Conn(sc.sock)
    err, res = c.request("ping")
    assert err is None and res["version"]
    c.close()
    # No watchdog asked for: no WATCHDOG=1.
    assert all("WATCHDOG" not in f for _, f, _ in manager.got), manager.got
    assert manager.collect(0.3) == []
    sc.proc.send_signal(signal.SIGTERM)
    m = manager.wait_for("STOPPING", 5.0)
    assert m is not None and m[1]["STOPPING"] == "1", manager.got
    # Exits by itself (a second SIGTERM now could land after the handlers are gone).
    sc.returncode = sc.proc.wait(15)
    sc.log.close()
    assert sc.returncode == 0, sc.logs()
    assert not any("READY" in f for _, f, _ in manager.got[1:]), "READY=1 sent twice"


def test_sdnotify__ready_waits_for_redis(workdir, manager, notified, up):
    """With the Redis backend the daemon listens at once (calls fail closed
    while Redis is away) but says READY=1 only once Redis is connected."""
    r = FleetRedis().start()
    try:
        r.kill()   # its port is known; nobody listens there yet
        cfg = fleet_config(r.url(), unique_prefix(), [source("s1", "chat", up.url)])
        sc = notified(config_text=cfg)
        sc.wait_accepts()
        assert manager.wait_for("READY", 1.0) is None, "READY=1 before Redis was up"
        # A reload meanwhile does not make it ready either.
        sc.proc.send_signal(signal.SIGHUP)
        assert manager.wait_for("RELOADING", 5.0) is not None, manager.got
        assert manager.wait_for("READY", 0.5) is None, "READY=1 after a reload, Redis down"
        t_up = time.monotonic()
        r.restart()
        m = manager.wait_for("READY", 10.0)
        assert m is not None, "no READY=1 after Redis came back:\n" + sc.logs()
        assert m[0] >= t_up
        assert "redis backend" in m[1].get("STATUS", ""), m
    finally:
        r.stop()


def watchdog_times(msgs):
    return [t for t, f in msgs if f.get("WATCHDOG") == "1"]


def test_sdnotify__watchdog_every_half_interval_and_none_while_wedged(manager, notified):
    interval_s = 0.4   # WatchdogSec=400ms: polygw pings every 0.2 s
    sc = notified(watchdog_usec=int(interval_s * 1e6))
    assert manager.wait_for("READY", 10.0) is not None, sc.logs()
    if not has_wedge_hook(sc):
        pytest.skip("debug.wedge is compiled into the sanitizer build only (DEBUG_HOOKS=1)")
    ticks = watchdog_times(manager.collect(2.0))
    assert 7 <= len(ticks) <= 12, ticks   # 2.0 s / 0.2 s = 10
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert all(0.1 <= g <= 0.35 for g in gaps), gaps
    assert abs(sum(gaps) / len(gaps) - interval_s / 2) < 0.05, gaps

    c = Conn(sc.sock, timeout=10)
    t_wedge = time.monotonic()
    msgid = c.request_async("debug.wedge", {"seconds": 1.5})
    msgs = manager.collect(1.3)   # inside the wedge: silence
    late = [t - t_wedge for t in watchdog_times(msgs) if t - t_wedge > 0.15]
    assert late == [], "WATCHDOG=1 while the loop was wedged, at %r s" % late
    reply = c.wait_response(msgid, timeout=5)
    assert reply[2] is None, reply
    t_back = time.monotonic()
    c.close()
    ticks = watchdog_times(manager.collect(1.0))
    assert len(ticks) >= 3, "the watchdog did not resume after the wedge: %r" % ticks
    assert ticks[0] - t_back < 0.3, (ticks[0] - t_back)


@pytest.mark.parametrize("who", ["other", "unset"])
def test_sdnotify__watchdog_pid_of_another_process_is_ignored(manager, notified, who):
    """WATCHDOG_PID names the process systemd watches; a polygw started by
    that process (e.g. from a wrapper) must not ping in its place. Without
    WATCHDOG_PID the watchdog is ours (sd_watchdog_enabled(3))."""
    sc = notified(watchdog_usec=200000, watchdog_pid=1 if who == "other" else None)
    assert manager.wait_for("READY", 10.0) is not None, sc.logs()
    ticks = watchdog_times(manager.collect(0.6))
    if who == "other":
        assert ticks == []
        assert all("WATCHDOG" not in f for _, f, _ in manager.got)
    else:
        assert len(ticks) >= 4, ticks

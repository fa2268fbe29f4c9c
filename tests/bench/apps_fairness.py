#!/usr/bin/python3
"""Fair queueing between apps, measured against the real sidecar.

A chat source admits two calls at a time (max_concurrency 2) and the mock
upstream answers each call after DELAY_MS, so one service time is DELAY_MS.

  single   app A keeps N calls waiting (default 200); app B sends one call.
           Prints how long B's call took, in service times, and how many of
           A's calls were still outstanding when it ended (FIFO would make B
           wait behind all N: N / 2 service times).
  shares   apps weighted 3 and 1; A queues 400 calls, then B queues 400.
           Prints how the first 400 admissions from the queue were shared
           (ordered by when their answers arrived).

The apps are declared per call (`app`), which the config lets this uid do;
tests/integration/test_apps.py runs the same measurements with callers
under different uids.

    tests/bench/apps_fairness.py BUILD_DIR [N] [DELAY_MS]
"""
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from mock import MockUpstream  # noqa: E402


def fair_config(up_url, apps, extra_app_keys=""):
    """A config text: `apps` are YAML flow maps; one chat source of 2 permits."""
    return ('listen:\n  mode: "0660"\n  max_inflight_per_connection: 1024\n'
            "server: {log_level: warn, shutdown_grace_s: 1}\n"
            "defaults: {max_attempts: 1, stall_window_s: 3600}\n"
            "apps:\n" + "".join("  - %s\n" % a for a in apps) + extra_app_keys +
            "sources:\n  - name: one\n    capability: chat\n    base_url: %s\n"
            "    max_concurrency: 2\n    aimd: {initial: 2, min: 2}\n"
            "    timeout_s: 3600\n    ttft_timeout_s: 3600\n    idle_timeout_s: 3600\n" % up_url)


def send_calls(sock, first_id, n, delay_ms, app=None):
    """Pipelines n calls on `sock` (msgids first_id ..); returns the ids."""
    out = []
    for i in range(n):
        p = {"capability": "chat",
             "body": {"messages": [{"role": "user", "content": "x"}],
                      "mock": {"delay_ms": delay_ms}}}
        if app:
            p["app"] = app
        out.append(msgpack.packb([0, first_id + i, "call", [p]]))
    sock.sendall(b"".join(out))
    return list(range(first_id, first_id + n))


def read_responses(socks, want, timeout_s):
    """Reads responses from `socks` ({name: socket}) until `want` of them
    arrived or timeout_s passed; returns [(name, msgid, error)] in arrival
    order."""
    sel = selectors.DefaultSelector()
    unpackers = {}
    for name, s in socks.items():
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, name)
        unpackers[name] = msgpack.Unpacker(raw=False, strict_map_key=False)
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        for key, _ in sel.select(max(0.001, deadline - time.monotonic())):
            data = key.fileobj.recv(1 << 16)
            if not data:
                raise AssertionError("%s: connection closed" % key.data)
            unpackers[key.data].feed(data)
            for msg in unpackers[key.data]:
                if msg[0] == 1:
                    got.append((key.data, msg[1], msg[2]))
    sel.close()
    return got


def wait_waiting(stats_fn, n, timeout_s=10.0):
    """Waits until the sidecar reports at least n calls waiting."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stats_fn()["calls_waiting"] >= n:
            return True
        time.sleep(0.01)
    return False


def measure_single(sock_a, sock_b, stats_fn, n, delay_ms, app_a=None, app_b=None):
    """App A keeps n calls waiting (2 more run), app B sends one. Returns
    (A's answers that came before B's, A's calls still outstanding then).
    With two permits, two of A's answers are one service time."""
    send_calls(sock_a, 1, n + 2, delay_ms, app_a)
    if not wait_waiting(stats_fn, n):
        raise AssertionError("A's calls were not waiting")
    send_calls(sock_b, 1, 1, delay_ms, app_b)
    got = read_responses({"a": sock_a, "b": sock_b}, n + 3, 60)
    for g in got:
        if g[2] is not None:
            raise AssertionError("a call failed: %r" % (g,))
    names = [g[0] for g in got]
    if "b" not in names:
        raise AssertionError("B's call was not answered")
    i = names.index("b")
    return i, (n + 2) - i


def measure_shares(sock_a, sock_b, n, delay_ms, app_a=None, app_b=None):
    """A queues n calls then B queues n; returns (A, B) among the first n
    answers after the two A admitted before any wait."""
    send_calls(sock_a, 1, n, delay_ms, app_a)
    send_calls(sock_b, 1, n, delay_ms, app_b)
    got = read_responses({"a": sock_a, "b": sock_b}, n + 2, 120)
    for g in got:
        if g[2] is not None:
            raise AssertionError("a call failed: %r" % (g,))
    first = [g[0] for g in got[2:n + 2]]
    return first.count("a"), first.count("b")


def main():
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    delay_ms = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    os.environ["POLYGW_BUILD"] = build
    d = tempfile.mkdtemp(prefix="pgwf", dir="/tmp")
    sock = os.path.join(d, "s.sock")
    rows = []
    with MockUpstream() as up:
        for mode in ("single", "shares"):
            cfg = os.path.join(d, "c.yaml")
            wa, wb = (1, 1) if mode == "single" else (3, 1)
            with open(cfg, "w") as f:
                f.write(fair_config(up.url, ["{name: default, allow_declared: true}",
                                             "{name: a, weight: %d}" % wa,
                                             "{name: b, weight: %d}" % wb]))
            proc = subprocess.Popen([os.path.join(build, "polygw"), "--config", cfg,
                                     "--socket", sock], stderr=subprocess.DEVNULL)
            try:
                for _ in range(200):
                    if os.path.exists(sock):
                        break
                    time.sleep(0.02)
                sa, sb, sc = (socket.socket(socket.AF_UNIX) for _ in range(3))
                for s in (sa, sb, sc):
                    s.connect(sock)
                ctl = msgpack.Unpacker(raw=False, strict_map_key=False)

                def stats():
                    sc.sendall(msgpack.packb([0, 1, "stats", []]))
                    while True:
                        ctl.feed(sc.recv(1 << 20))
                        for m in ctl:
                            return m[3]
                if mode == "single":
                    pos, left = measure_single(sa, sb, stats, n, delay_ms, "a", "b")
                    rows.append("| single | A: %d waiting, B: 1 | B answered after %d of A's "
                                "answers; %d of A's calls still outstanding |"
                                % (n, pos, left))
                else:
                    a, b = measure_shares(sa, sb, 400, delay_ms, "a", "b")
                    rows.append("| shares 3:1 | A: 400, B: 400 | first 400 admissions: "
                                "A %d, B %d (ratio %.3f) |" % (a, b, a / max(b, 1)))
                for s in (sa, sb, sc):
                    s.close()
            finally:
                proc.terminate()
                proc.wait(timeout=10)
                if os.path.exists(sock):
                    os.unlink(sock)
    shutil.rmtree(d, ignore_errors=True)
    print("| run | queued | result |")
    print("|---|---|---|")
    for r in rows:
        print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Redis backend end to end (issue "Redis backend", Done-when list): real
polygw binaries sharing one real redis-server (same url, same prefix; a
unique prefix per test), the real mock upstream, real sockets, real time
scaled down (limits.window_s, stall windows of 1 s, lease TTLs of 1.5 s).

  1. rpm is the fleet's:            test_fleet__rpm_limit_holds_across_sidecars
  2. max_concurrency is the fleet's: test_fleet__max_concurrency_holds_across_sidecars
  3. progress crosses sidecars:     test_fleet__progress_elsewhere_keeps_a_call_waiting
  4. task.stop crosses sidecars:    test_fleet__task_stop_on_one_sidecar_ends_a_call_on_another
  5. Redis dies and comes back:     test_fleet__redis_killed_fails_closed_then_recovers
     Redis hangs (SIGSTOP):         test_fleet__frozen_redis_answers_backend_unavailable_within_command_timeout
  6. a dead sidecar's permits:      test_fleet__killed_sidecars_lease_expires_after_ttl
  7. config and unreachable Redis:  test_fleet__bad_url_rejected_unreachable_redis_fails_closed
  8. stats and secrets:             test_fleet__stats_show_the_backend_never_the_password

Timing bounds follow test_governance.py: an event the sidecar schedules at T
after the call was sent is asserted in [T - EARLY, T + LATE]. EARLY is
rounding only (the client's clock starts first). LATE is larger here (0.3 s)
than in the single-sidecar tests: besides the ASan + UBSan build on a shared
2-core machine, a fleet decision crosses Redis (a script round trip, and for
progress and task stops a pub/sub hop to another sidecar). Run with
`pytest -s` to see a `timing:` line per case.

Only 127.0.0.1 is used; every wait and every loop here is bounded.
"""
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import msgpack
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import POLYGW, call as call_on, sanitizer_env  # noqa: E402
from redis_fixture import (FleetRedis, Pending, chat, fleet_config, free_port,  # noqa: E402
                           source, stats, unique_prefix, wait_backend, wait_until)
from redis_support import script_source  # noqa: E402  (on the path via redis_fixture)

EARLY = 0.02
LATE = 0.3
NO_PROXY = {"no_proxy": "*", "NO_PROXY": "*"}   # a proxy must not capture the loopback mock


# ---------------------------------------------------------------- helpers
def assert_at(what, elapsed, lo, hi=None, late=LATE):
    """lo - EARLY <= elapsed <= hi + late (hi defaults to lo)."""
    hi = lo if hi is None else hi
    print("timing: %-52s elapsed %.3fs  expected [%.3f, %.3f]  late %+4.0f ms"
          % (what, elapsed, lo, hi, (elapsed - hi) * 1000))
    assert lo - EARLY <= elapsed <= hi + late, \
        "%s: after %.3fs, expected %.3f-%.3fs" % (what, elapsed, lo, hi)


def start_fleet(make_sidecar, n, cfg):
    """n sidecars, each with its own directory, socket and log, one config
    (same url, same prefix); returns them once each one's backend is up."""
    fleet = [make_sidecar(config_text=cfg, subdir="sc%d" % i, env=NO_PROXY) for i in range(n)]
    for sc in fleet:
        wait_backend(sc)
    return fleet


def shared_sum(fleet, *path):
    """Sum over the fleet of stats.shared[path...]."""
    total = 0
    for sc in fleet:
        v = stats(sc)["shared"]
        for p in path:
            v = v[p]
        total += v
    return total


def call(sc, body, timeout=5.0, **params):
    """One `chat` call on a new connection: (error, result, elapsed)."""
    c = sc.connect(timeout=timeout)
    try:
        return call_on(c, "chat", body, timeout, **params)
    finally:
        c.close()


@pytest.fixture
def redis_srv():
    srv = FleetRedis().start()
    yield srv
    srv.cleanup()


# Test functions take (redis_srv, up, make_sidecar) in this order: fixtures
# are torn down in reverse, so the sidecars stop (and are checked for a clean
# exit) while Redis and the mock are still there.


# ------------------------------------------------------------- 1. rpm
def test_fleet__rpm_limit_holds_across_sidecars(redis_srv, up, make_sidecar):
    """Three sidecars share source `a` with rpm 6 per window_s 1 (a bucket of
    6 refilled at 6/s; max_concurrency high). 18 calls at once, 6 through
    each sidecar: the fleet's bucket admits the first 6 at once and then 6
    per second — never the 18 that three local buckets would allow. The
    others are refused by the fleet, wait (stall window 10 s, far away) and
    succeed as the bucket refills; none hangs.

    Asserted on the mock's request counter, sampled every ~10 ms: at every
    sample t, requests(t) <= 6 + 6/s x (t - t0), t0 taken before the first
    call was sent (the bucket's clock starts at its first take, later)."""
    n_rpm, win, total = 6, 1.0, 18
    rate = n_rpm / win
    cfg = fleet_config(redis_srv.url(), unique_prefix(),
                       [source("a", "chat", up.url, limits={"rpm": n_rpm, "window_s": win})],
                       stall_window_s=10)
    fleet = start_fleet(make_sidecar, 3, cfg)

    t0 = time.monotonic()
    calls = [Pending(fleet[i % 3], "chat", chat("r%d" % i), timeout=15) for i in range(total)]
    samples = []
    deadline = t0 + 10
    while time.monotonic() < deadline and not all(k.answered() for k in calls):
        n = up.stats()["requests"]
        samples.append((time.monotonic(), n))
        time.sleep(0.01)
    for k in calls:
        err, res = k.wait(1)
        assert err is None, err
        assert res["source"] == "a" and res["attempts"] == 1, res
    assert up.stats()["requests"] == total

    over = [(round(t - t0, 3), n) for t, n in samples if n > n_rpm + rate * (t - t0 + EARLY)]
    assert not over, "the fleet exceeded rpm %d per %.1fs: (t, requests) %r" % (n_rpm, win, over)
    first_full = next((t - t0 for t, n in samples if n >= n_rpm), None)
    assert first_full is not None and first_full < win / 2, \
        "the full bucket was not spent at once: %r" % samples[:20]
    print("timing: fleet rpm: %d requests after %.3fs (bucket spent)" % (n_rpm, first_full))
    ends = sorted(k.t_end - t0 for k in calls)
    # The 18th admission needs 12 refilled tokens: >= 2 s after the first take.
    assert_at("fleet rpm: last of %d calls" % total, ends[-1], (total - n_rpm) / rate,
              late=1.0)
    assert shared_sum(fleet, "refused", "rpm") > 0
    assert shared_sum(fleet, "admitted") == total


# ----------------------------------------------------- 2. max_concurrency
def test_fleet__max_concurrency_holds_across_sidecars(redis_srv, up, make_sidecar):
    """max_concurrency 2 is the fleet's: 6 calls at once, 2 through each of
    three sidecars, each reply delayed 0.5 s by the mock. At most 2 requests
    are ever in progress at the mock (3 sidecars with local permits would
    allow 6), so the calls run in three waves of 2; all complete."""
    delay = 0.5
    cfg = fleet_config(redis_srv.url(), unique_prefix(),
                       [source("a", "chat", up.url, max_concurrency=2)], stall_window_s=10)
    fleet = start_fleet(make_sidecar, 3, cfg)
    up.set_default({"delay_ms": int(delay * 1000)})

    t0 = time.monotonic()
    calls = [Pending(fleet[i % 3], "chat", chat("c%d" % i), timeout=15) for i in range(6)]
    high, deadline = 0, t0 + 8
    while time.monotonic() < deadline and not all(k.answered() for k in calls):
        high = max(high, up.stats()["in_progress"])
        time.sleep(0.005)
    for k in calls:
        err, res = k.wait(1)
        assert err is None, err
    st = up.stats()
    assert st["requests"] == 6 and st["in_progress"] == 0, st
    print("timing: fleet concurrency: high-water mark %d in flight at the mock" % high)
    assert high == 2, "max_concurrency 2 across the fleet, %d in flight at once" % high
    assert_at("fleet concurrency 2: 6 calls of 0.5 s (3 waves)",
              max(k.t_end for k in calls) - t0, 3 * delay, late=1.0)
    assert shared_sum(fleet, "refused", "concurrency") > 0
    assert shared_sum(fleet, "leases_live") == 0


# ------------------------------------------------- 3. progress across
def _feed_progress(sc, until, scope, every):
    """Successful calls through `sc` in `scope`, one every `every` seconds,
    until `until`. Returns (count, (send time, answer time) of the last)."""
    c = sc.connect()
    n, last = 0, (None, None)
    try:
        while time.monotonic() < until:
            t_send = time.monotonic()
            err, res = c.request("call", {"capability": "chat", "body": chat("feed"),
                                          "scope": scope})
            assert err is None, err
            n += 1
            last = (t_send, time.monotonic())
            time.sleep(every)
    finally:
        c.close()
    return n, last


def test_fleet__progress_elsewhere_keeps_a_call_waiting(redis_srv, up, make_sidecar):
    """docs/DESIGN.md §3.1 case 6 across sidecars ("local window exceeded, scope
    fresh"). Chat (exempt_429) with stall_window_s 1. On sidecar B, a call
    in scope S gets 429 + Retry-After 0.2 on every attempt: all its time is
    stall time, its own window is spent after 1 s. Meanwhile calls in S
    succeed through sidecar A every 0.3 s, so S's progress age (shared
    through Redis) stays below the window: B's call keeps trying and is NOT
    stalled for three windows. Once A stops, B's call ends `stalled` one
    window after the last success in S. Beside it, the same call on B in a
    scope that never progressed anywhere ends `stalled` after about the
    window."""
    w, retry_after = 1.0, 0.2
    cfg = fleet_config(redis_srv.url(), unique_prefix(),
                       [source("a", "chat", up.url, ttft_timeout_s=w)],
                       capabilities={"chat": {"exempt_429": True}}, stall_window_s=w,
                       backoff_base_s=0.05, backoff_max_s=0.1, max_attempts=3)
    a, b = start_fleet(make_sidecar, 2, cfg)
    busy = {"status": 429, "retry_after": retry_after}

    patient = Pending(b, "chat", chat("patient", mock=busy), scope="S", timeout=15)
    lonely = Pending(b, "chat", chat("lonely", mock=busy), scope="L", timeout=15)
    n, (t_sent, t_answered) = _feed_progress(a, patient.t0 + 3 * w, "S", 0.3)
    assert n >= 6, n

    err, _ = lonely.wait(1)
    assert err["code"] == "stalled", err
    # The verdict comes as the 429 whose Retry-After outlives the window
    # ends (PROTOCOL 6.1.1: the scope never progressed, so waiting could only
    # end the same way), up to 0.2 s before the window is spent, or at the
    # top of the loop after one 0.2 s sleep.
    assert err["attempts"] >= 2 and err["stalled_s"] > w - retry_after, err
    assert_at("no progress anywhere -> stalled", lonely.elapsed, w - retry_after,
              w + retry_after + 0.05)
    assert not patient.answered(), \
        "B's call ended although A made progress in its scope: %r" % (patient.err,)

    err, res = patient.wait(w + 2)
    assert res is None and err["code"] == "stalled", err
    assert err["stalled_s"] > 3 * w and err["attempts"] >= 6, err
    # The progress mark is made between A's last send and answer; B learns it
    # by pub/sub and re-checks after each 429 + 0.2 s.
    assert_at("A stops -> B stalled one window after the last progress",
              patient.t_end - t_sent, w, w + (t_answered - t_sent) + retry_after + 0.05)
    st = up.stats()
    assert st["by_status"].get("429", 0) == err["attempts"] + lonely.err["attempts"], st
    assert st["by_status"].get("200", 0) == n, st


# ------------------------------------------------ 4. task.stop across
def test_fleet__task_stop_on_one_sidecar_ends_a_call_on_another(redis_srv, up, make_sidecar):
    """A task started on sidecar B; B's call in it hangs at the mock.
    task.stop sent to sidecar A ends B's call within 100 ms with
    `task_stopped` (and the reason), and closes its upstream connection.
    Afterwards task.guard fails with `task_stopped` on both sidecars, and a
    new call naming the task is refused on A without reaching the mock."""
    tid = "fleet-job-1"
    cfg = fleet_config(redis_srv.url(), unique_prefix(),
                       [source("a", "chat", up.url, ttft_timeout_s=8)], stall_window_s=10)
    a, b = start_fleet(make_sidecar, 2, cfg)
    cb, ca = b.connect(), a.connect()
    err, t = cb.request("task.start", {"task_id": tid})
    assert err is None and t["state"] == "running" and t["task_id"] == tid, (err, t)

    hung = Pending(b, "chat", chat(mock={"hang": "before_headers"}), task_id=tid, timeout=10)
    assert wait_until(lambda: up.stats()["in_progress"] == 1, 3), up.stats()
    t0 = time.monotonic()
    err, t = ca.request("task.stop", {"task_id": tid, "reason": "stopped from A"})
    assert err is None, err
    assert t["state"] == "failed" and t["reason_kind"] == "stopped", t
    err, res = hung.wait(2)
    dt = hung.t_end - t0
    print("timing: task.stop on A -> call on B ended after %.1f ms" % (dt * 1000))
    assert res is None and err["code"] == "task_stopped", err
    assert "stopped from A" in err["message"], err
    assert dt < 0.1, "B's call ended %.3fs after task.stop on A" % dt
    up.wait_stats(lambda s: s["in_progress"] == 0 and s["aborted_by_peer"] >= 1, timeout=2)

    for name, c in (("A", ca), ("B", cb)):
        err, res = c.request("task.guard", {"task_id": tid})
        assert res is None and err is not None, (name, res)
        assert err["code"] == "task_stopped" and err.get("reason") == "stopped from A", (name, err)
    before = up.stats()["requests"]
    err, res, _ = call(a, chat(), task_id=tid)
    assert res is None and err["code"] == "task_stopped", err
    assert up.stats()["requests"] == before
    ca.close()
    cb.close()


def test_fleet__task_states_survive_a_sidecar_restart(redis_srv, up, make_sidecar):
    """Task states live in Redis: a sidecar restarted (new process, empty
    memory) still knows them. A stop is final there too (task.start is
    refused), a running task's calls are admitted (the task is imported),
    and node watchdogs work on a task started before the restart."""
    cfg = fleet_config(redis_srv.url(), unique_prefix(), [source("a", "chat", up.url)],
                       stall_window_s=10)
    (a,) = start_fleet(make_sidecar, 1, cfg)
    c = a.connect()
    for tid in ("keep-running", "to-stop"):
        err, _ = c.request("task.start", {"task_id": tid})
        assert err is None, err
    err, _ = c.request("task.stop", {"task_id": "to-stop", "reason": "before restart"})
    assert err is None, err
    c.close()
    a.stop()

    (b,) = start_fleet(make_sidecar, 1, cfg)
    c = b.connect()
    err, t = c.request("task.get", {"task_id": "keep-running"})
    assert err is None and t["state"] == "running" and t["runs"] == 1, (err, t)
    err, t = c.request("task.get", {"task_id": "to-stop"})
    assert err is None and t["state"] == "failed" and t["reason_kind"] == "stopped", (err, t)
    assert t["reason"] == "before restart", t
    err, _ = c.request("task.start", {"task_id": "to-stop"})
    assert err is not None and err["code"] == "task_stopped", err
    err, _ = c.request("task.guard", {"task_id": "to-stop"})
    assert err is not None and err["code"] == "task_stopped", err
    err, res, _ = call(b, chat(), task_id="keep-running")
    assert err is None and res["body"]["choices"], err
    err, res = c.request("task.node_begin",
                         {"task_id": "keep-running", "node": "plan", "timeout_s": 0.3})
    assert err is None and res["timeout_source"] == "explicit", err
    # The watchdog armed here fails the task fleet-wide.
    assert wait_until(lambda: c.request("task.get", {"task_id": "keep-running"})[1]["state"]
                      == "failed", 3)
    err, t = c.request("task.get", {"task_id": "keep-running"})
    assert t["reason_kind"] == "watchdog", t
    c.close()


# ----------------------------------------------------- 5. Redis killed
class Load:
    """Calls in a loop through every sidecar (`per_sidecar` connections
    each), recording (sidecar, send time, end time, code or None)."""

    def __init__(self, fleet, per_sidecar=2, pause=0.02, timeout=5.0):
        self.records = []
        self.lock = threading.Lock()
        self.stop_ev = threading.Event()
        self.pause = pause
        self.timeout = timeout
        self.threads = [threading.Thread(target=self._run, args=(i, sc), daemon=True)
                        for i, sc in enumerate(fleet) for _ in range(per_sidecar)]
        for t in self.threads:
            t.start()

    def _run(self, i, sc):
        c = sc.connect(timeout=self.timeout)
        try:
            while not self.stop_ev.is_set():
                t_send = time.monotonic()
                try:
                    err, _ = c.request("call", {"capability": "chat", "body": chat()},
                                       timeout=self.timeout)
                    code = None if err is None else err["code"]
                except socket.timeout:
                    code = "HANG"
                except Exception as e:  # the sidecar closed the connection, or crashed
                    code = "EXC %r" % (e,)
                with self.lock:
                    self.records.append((i, t_send, time.monotonic(), code))
                if code is not None and (code == "HANG" or code.startswith("EXC")):
                    return
                time.sleep(self.pause)
        finally:
            c.close()

    def snapshot(self):
        with self.lock:
            return list(self.records)

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(self.timeout + 2)
            assert not t.is_alive(), "a load thread did not finish"


def test_fleet__redis_killed_fails_closed_then_recovers(redis_srv, up, make_sidecar):
    """Three sidecars under load (2 callers each, replies delayed 30 ms);
    redis-server is SIGKILLed. Calls sent while it is down end with
    `backend_unavailable` within command_timeout_s (0.5 s) — never admitted
    blind, never hung — no sidecar crashes, `ping` works and
    stats.backend.state is not "up". redis-server restarted on the same
    port: every sidecar serves calls again within a few seconds, without
    being restarted, and stops cleanly at the end."""
    ct = 0.5
    cfg = fleet_config(redis_srv.url(), unique_prefix(), [source("a", "chat", up.url)],
                       backend={"command_timeout_s": ct, "lease_ttl_s": 3}, stall_window_s=5)
    fleet = start_fleet(make_sidecar, 3, cfg)
    up.set_default({"delay_ms": 30})
    load = Load(fleet)
    try:
        assert wait_until(lambda: all(sum(1 for r in load.snapshot() if r[0] == i and r[3] is None)
                                      >= 2 for i in range(3)), 5), load.snapshot()[-10:]
        t_kill = time.monotonic()
        redis_srv.kill()
        t_killed = time.monotonic()
        time.sleep(1.0)
        for sc in fleet:
            assert sc.proc.poll() is None, "polygw died with Redis:\n" + sc.logs()[-3000:]
            c = sc.connect()
            err, res = c.request("ping")
            c.close()
            assert err is None and res["version"], err
            st = stats(sc)
            assert st["backend"]["kind"] == "redis", st["backend"]
            assert st["backend"]["state"] != "up", st["backend"]
            assert st["rejected"].get("backend_unavailable", 0) > 0, st["rejected"]

        t_restart = time.monotonic()
        redis_srv.restart()
        t_restarted = time.monotonic()

        def recovered():
            recs = load.snapshot()
            return all(any(r[0] == i and r[1] >= t_restarted and r[3] is None for r in recs)
                       for i in range(3))
        ok = wait_until(recovered, 6, interval=0.02)
        t_ok = time.monotonic()
        assert ok, "not every sidecar served a call within 6 s of Redis' restart"
        time.sleep(0.2)
    finally:
        load.stop()
    recs = load.snapshot()
    first_ok = [min(r[2] for r in recs if r[0] == i and r[1] >= t_restarted and r[3] is None)
                - t_restarted for i in range(3)]
    print("timing: redis restart took %.3fs; sidecars served again after %s s (all by %.3fs)"
          % (t_restarted - t_restart, ["%.3f" % x for x in first_ok], t_ok - t_restarted))

    bad = [r for r in recs if r[3] not in (None, "backend_unavailable")]
    assert not bad, "unexpected outcomes: %r" % bad[:10]
    slow = [(r[0], round(r[1] - t_kill, 3), round(r[2] - r[1], 3), r[3]) for r in recs
            if r[2] - r[1] > ct + LATE]
    assert not slow, "calls slower than command_timeout_s %.1f: %r" % (ct, slow[:10])
    down = [r for r in recs if r[1] >= t_killed and r[2] <= t_restart]
    assert all(r[3] == "backend_unavailable" for r in down), \
        "admitted while Redis was down: %r" % [r for r in down if r[3] is not None][:10]
    for i in range(3):
        n = sum(1 for r in down if r[0] == i)
        assert n >= 3, "sidecar %d: only %d calls while Redis was down" % (i, n)
    longest = max(r[2] - r[1] for r in down)
    print("timing: while Redis was down: %d calls, longest %.3fs (command_timeout_s %.1f)"
          % (len(down), longest, ct))
    for sc in fleet:
        b = wait_backend(sc)
        assert b["kind"] == "redis", b
        assert sc.proc.poll() is None


def test_fleet__frozen_redis_answers_backend_unavailable_within_command_timeout(
        redis_srv, up, make_sidecar):
    """The case the command timeout exists for: redis-server SIGSTOPped keeps
    its connections open and answers nothing (a hung or partitioned Redis;
    a SIGKILLed one is noticed at once by the closed connection). A call's
    admission then fails with `backend_unavailable` at command_timeout_s
    (0.5 s) — not before, not much later, never hung — and so does a task
    method. Calls after that also end within the timeout. SIGCONT: the
    sidecars serve calls again within a few seconds."""
    ct = 0.5
    cfg = fleet_config(redis_srv.url(), unique_prefix(), [source("a", "chat", up.url)],
                       backend={"command_timeout_s": ct, "lease_ttl_s": 3}, stall_window_s=5)
    fleet = start_fleet(make_sidecar, 2, cfg)
    for sc in fleet:
        err, _, _ = call(sc, chat())
        assert err is None, err
    redis_srv.freeze()
    try:
        first = [Pending(sc, "chat", chat(), timeout=5) for sc in fleet]
        c = fleet[0].connect()
        t0 = time.monotonic()
        err, res = c.request("task.guard", {"task_id": "frozen"}, timeout=5)
        t_guard = time.monotonic() - t0
        c.close()
        for k in first:
            err_k, res_k = k.wait(ct + 2)
            assert res_k is None and err_k["code"] == "backend_unavailable", err_k
            assert err_k.get("attempts", 0) == 0, err_k
            assert_at("frozen Redis: admission -> backend_unavailable", k.elapsed, ct)
            k.close()
        assert res is None and err["code"] == "backend_unavailable", err
        assert t_guard <= ct + LATE, "task.guard answered after %.3fs" % t_guard
        t_end = time.monotonic() + 1.0
        n = 0
        while time.monotonic() < t_end:
            for sc in fleet:
                err, res, elapsed = call(sc, chat())
                assert res is None and err["code"] == "backend_unavailable", err
                assert elapsed <= ct + LATE, "backend_unavailable after %.3fs" % elapsed
                n += 1
            time.sleep(0.05)
        print("timing: frozen Redis: %d more calls, each within command_timeout_s" % n)
        for sc in fleet:
            assert sc.proc.poll() is None
            assert stats(sc)["backend"]["state"] != "up"
        assert up.stats()["requests"] == len(fleet)
    finally:
        redis_srv.thaw()
    t_thaw = time.monotonic()
    for sc in fleet:
        assert wait_until(lambda: call(sc, chat())[0] is None, 6, interval=0.05), \
            "no recovery after SIGCONT:\n" + sc.logs()[-3000:]
    print("timing: frozen Redis thawed: fleet served again after %.3fs"
          % (time.monotonic() - t_thaw))


# ------------------------------------------------ 6. lease of the dead
def test_fleet__killed_sidecars_lease_expires_after_ttl(redis_srv, up, make_sidecar):
    """Source with max_concurrency 1 (fleet-wide), lease_ttl_s 1.5 (renewed
    every 0.5 s), command_timeout_s 0.3. Sidecar A's call hangs at the mock
    holding the only lease; B is refused meanwhile. A is SIGKILLed: nobody
    releases the lease, so B's next call waits until it expires — between
    TTL - one renew period (1.0 s) and TTL (1.5 s) after the kill — and then
    succeeds (B re-polls every poll_interval_s 0.1)."""
    ttl = 1.5
    cfg = fleet_config(redis_srv.url(), unique_prefix(),
                       [source("a", "chat", up.url, max_concurrency=1, ttft_timeout_s=8)],
                       backend={"command_timeout_s": 0.3, "lease_ttl_s": ttl},
                       stall_window_s=10, poll_interval_s=0.1)
    a, b = start_fleet(make_sidecar, 2, cfg)
    holder = Pending(a, "chat", chat(mock={"hang": "before_headers"}), timeout=10)
    assert wait_until(lambda: up.stats()["in_progress"] == 1, 3), up.stats()
    assert stats(a)["shared"]["leases_live"] == 1
    # The lease holds fleet-wide while A lives.
    err, res, elapsed = call(b, chat(), deadline_s=0.4)
    assert res is None and err["code"] == "deadline_exceeded" and err["attempts"] == 0, err
    assert up.stats()["requests"] == 1

    a.expected_rc = -signal.SIGKILL   # the fixture's clean-exit check expects this death
    t_kill = time.monotonic()
    a.send_signal(signal.SIGKILL)
    a.proc.wait(5)
    patient = Pending(b, "chat", chat("after the lease"), timeout=10)
    time.sleep(0.9)
    assert not patient.answered(), \
        "B admitted %.3fs after A's death, before its lease could expire: %r" % (
            patient.t_end - t_kill, (patient.err, patient.res))
    err, res = patient.wait(ttl + 2)
    assert err is None, err
    assert res["attempts"] == 1
    assert_at("lease of a killed sidecar expires", patient.t_end - t_kill, ttl - ttl / 3, ttl + 0.1)
    assert stats(b)["shared"]["refused"]["concurrency"] >= 2
    up.wait_stats(lambda s: s["in_progress"] == 0 and s["requests"] == 2, timeout=2)
    assert holder.done.wait(2) and holder.exc is not None   # its sidecar died
    holder.close()


# ----------------------------------------------- 7. config, unreachable
def _run(args, timeout=20):
    r = subprocess.run([POLYGW] + args, capture_output=True, text=True, timeout=timeout,
                       env=sanitizer_env())
    return r.returncode, r.stdout + r.stderr


def test_fleet__bad_url_rejected_unreachable_redis_fails_closed(up, make_sidecar, workdir):
    """A URL with an impossible port is rejected by --check-config and at
    start-up, with a message naming backend.url and never the password in
    it. lease_ttl_s < 3 x command_timeout_s is rejected. A well-formed URL
    where nothing listens: the sidecar starts, `ping` works, calls fail
    closed with `backend_unavailable` at once (no attempt), stats say the
    backend is not up."""
    pw = "Hunter2-redis-pw-7c1"
    bad = os.path.join(workdir, "bad.yaml")
    with open(bad, "w") as f:
        f.write(fleet_config("redis://:%s@127.0.0.1:99999/0" % pw, unique_prefix(),
                             [source("a", "chat", up.url)]))
    rc, out = _run(["--check-config", bad])
    print("check-config:", out.strip())
    assert rc != 0, out
    assert "backend.url" in out and "port" in out, out
    assert pw not in out
    sock = os.path.join(workdir, "bad.sock")
    rc, out = _run(["--config", bad, "--socket", sock])
    assert rc != 0, out
    assert "backend.url" in out and pw not in out, out
    assert not os.path.exists(sock)

    ttl = os.path.join(workdir, "ttl.yaml")
    with open(ttl, "w") as f:
        f.write(fleet_config("redis://127.0.0.1:6379/0", unique_prefix(),
                             [source("a", "chat", up.url)],
                             backend={"command_timeout_s": 1, "lease_ttl_s": 2}))
    rc, out = _run(["--check-config", ttl])
    assert rc != 0 and "lease_ttl_s" in out, out

    ct = 0.5
    port = free_port()   # nothing listens there
    sc = make_sidecar(config_text=fleet_config(
        "redis://127.0.0.1:%d/0" % port, unique_prefix(), [source("a", "chat", up.url)],
        backend={"command_timeout_s": ct, "lease_ttl_s": 3}), env=NO_PROXY)
    c = sc.connect()
    err, res = c.request("ping")
    assert err is None and res["version"], err
    time.sleep(0.3)   # a few reconnect attempts
    for _ in range(3):
        err, res, elapsed = call(sc, chat())
        assert res is None and err["code"] == "backend_unavailable", err
        assert err.get("attempts", 0) == 0, err
        assert elapsed < ct + LATE, "backend_unavailable after %.3fs" % elapsed
    b = stats(sc)["backend"]
    assert b["kind"] == "redis" and b["state"] != "up", b
    assert up.stats()["requests"] == 0
    c.close()


# --------------------------------------------------- 8. stats, secrets
PASSWORD = "pgw-Redis-Pw-4f9c2e"


@pytest.fixture
def redis_pw():
    srv = FleetRedis(password=PASSWORD).start()
    yield srv
    srv.cleanup()


def test_fleet__stats_show_the_backend_never_the_password(redis_pw, up, make_sidecar):
    """redis-server with --requirepass; the password only in the URL. AUTH
    works (calls succeed, the fleet's keys appear under the prefix), `stats`
    has backend {kind: redis, state: up}, and the password appears neither
    in stats nor in the sidecar's log (debug level). A sidecar given a wrong
    password is not up, fails calls closed, and leaks neither password."""
    prefix = unique_prefix()
    src = [source("a", "chat", up.url)]
    sc = make_sidecar(config_text=fleet_config(redis_pw.url(), prefix, src, log_level="debug"),
                      subdir="good", env=NO_PROXY)
    b = wait_backend(sc)
    assert b["kind"] == "redis" and b["state"] == "up", b
    for _ in range(2):
        err, res, _ = call(sc, chat())
        assert err is None and res["source"] == "a", err
    r = redis_pw.client()
    try:
        keys = wait_until(lambda: r.call("KEYS", "*%s*" % prefix), 2)
    finally:
        r.close()
    assert keys, "no key under prefix %s in Redis" % prefix
    st = stats(sc)
    assert st["backend"]["kind"] == "redis" and st["backend"]["state"] == "up", st["backend"]
    assert st["shared"]["admitted"] >= 2, st["shared"]
    assert PASSWORD.encode() not in msgpack.packb(st, use_bin_type=True)

    wrong = "Wrong-" + PASSWORD[::-1]
    sc2 = make_sidecar(config_text=fleet_config(redis_pw.url(password=wrong), unique_prefix(), src,
                                                log_level="debug"), subdir="wrong", env=NO_PROXY)
    time.sleep(0.3)
    err, res, elapsed = call(sc2, chat())
    assert res is None and err["code"] == "backend_unavailable", err
    st2 = stats(sc2)
    assert st2["backend"]["state"] != "up", st2["backend"]
    blob = msgpack.packb(st2, use_bin_type=True)
    assert wrong.encode() not in blob and PASSWORD.encode() not in blob
    assert up.stats()["requests"] == 2

    for s in (sc, sc2):
        s.stop()
        logs = s.logs()
        assert PASSWORD not in logs and wrong not in logs, "password in the log:\n" + logs


# ------------------------------------------ failure paths found in review


def test_fleet__progress_read_error_fails_closed(redis_srv, up, make_sidecar):
    """The scope's progress key holds the wrong type, so progress.lua's read
    answers an error. A call past its stall window needs that age: it must
    end `backend_unavailable` (fail closed) within about the window plus the
    command timeout — not retry the read in a loop for ever."""
    prefix = unique_prefix()
    w = 0.5
    cfg = fleet_config(redis_srv.url(), prefix, [source("a", "chat", up.url, ttft_timeout_s=w)],
                       capabilities={"chat": {"exempt_429": True}}, stall_window_s=w,
                       backend={"command_timeout_s": 0.3, "lease_ttl_s": 30})
    (a,) = start_fleet(make_sidecar, 1, cfg)
    redis_srv.client().call("HSET", "{%s:scope:X}:progress" % prefix, "f", "1")
    p = Pending(a, "chat", chat(mock={"status": 429, "retry_after": 0.05}), scope="X",
                timeout=6)
    err, res = p.wait(4)
    assert res is None and err["code"] == "backend_unavailable", err
    # A failed progress read fails the call closed at its next step (docs/DESIGN.md
    # §3.2), at the latest when its stall verdict needs the age.
    assert_at("call with an unreadable progress age", p.elapsed, 0, w + 0.3)
    s = stats(a)["shared"]
    assert s["progress_fetches"] <= 5 and s["progress_read_errors"] >= 1, s
    assert a.logs().count("progress read failed") <= 5
    p.close()


def test_fleet__graceful_stop_releases_leases(redis_srv, up, make_sidecar):
    """SIGTERM with a call hung upstream: the call is answered, and the
    sidecar's lease is released before it exits (not left to expire after
    lease_ttl_s, holding the fleet's permit meanwhile)."""
    prefix = unique_prefix()
    cfg = fleet_config(redis_srv.url(), prefix, [source("a", "chat", up.url, ttft_timeout_s=8)],
                       stall_window_s=10, grace=0.2)
    (a,) = start_fleet(make_sidecar, 1, cfg)
    hung = Pending(a, "chat", chat(mock={"hang": "before_headers"}), timeout=10)
    assert wait_until(lambda: up.stats()["in_progress"] == 1, 3)
    r = redis_srv.client()
    key = "{%s:source:a}:leases" % prefix
    assert r.call("ZCARD", key) == 1
    a.stop()
    err, _ = hung.wait(2)
    assert err["code"] == "shutting_down", err
    assert r.call("ZCARD", key) == 0, r.call("ZRANGE", key, 0, -1, "WITHSCORES")
    hung.close()


def test_fleet__stop_during_a_backend_gap_still_ends_the_call(redis_srv, up, make_sidecar):
    """A task is stopped in Redis while this sidecar can neither subscribe
    nor run scripts; the subscriber comes back before the command
    connection. Once both are back, the task's hung call ends
    `task_stopped` and a new call naming it is refused."""
    prefix = unique_prefix()
    tid = "t-gap"
    cfg = fleet_config(redis_srv.url(), prefix, [source("a", "chat", up.url, ttft_timeout_s=8)],
                       stall_window_s=10, backend={"command_timeout_s": 0.3, "lease_ttl_s": 30})
    (b,) = start_fleet(make_sidecar, 1, cfg)
    cb = b.connect()
    err, _ = cb.request("task.start", {"task_id": tid})
    assert err is None, err
    hung = Pending(b, "chat", chat(mock={"hang": "before_headers"}), task_id=tid, timeout=15)
    assert wait_until(lambda: up.stats()["in_progress"] == 1, 3)
    adm = redis_srv.client()
    adm.call("ACL", "SETUSER", "admin", "on", "nopass", "~*", "&*", "+@all")
    adm.call("AUTH", "admin", "x")
    adm.call("ACL", "SETUSER", "default", "-@scripting", "-@pubsub")
    adm.call("CLIENT", "KILL", "USER", "default")
    assert wait_until(lambda: stats(b)["backend"]["state"] != "up", 3)
    src = script_source("task")  # the prelude and the script, as the sidecar sends it
    r = adm.call("EVAL", src, "1", "{%s:task:%s}" % (prefix, tid), "stop", tid, "86400",
                 "stopped during the gap", "0", prefix + ":task-end")
    assert r[0] == "ok", r
    adm.call("ACL", "SETUSER", "default", "+@pubsub")      # the subscriber first
    time.sleep(0.8)
    assert not hung.answered()
    adm.call("ACL", "SETUSER", "default", "+@scripting")   # then the command connection
    err, res = hung.wait(5)
    assert res is None and err["code"] == "task_stopped", err
    assert "stopped during the gap" in err["message"], err
    before = up.stats()["requests"]
    err, res, _ = call(b, chat(), task_id=tid)
    assert res is None and err["code"] == "task_stopped", err
    assert up.stats()["requests"] == before
    cb.close()
    hung.close()


def test_fleet__task_run_again_elsewhere_is_seen_here(redis_srv, up, make_sidecar):
    """Started and finished on A, started again (run 2) on B: A must not
    answer from its stale copy — a call naming the task runs on A, guard
    passes, get shows run 2. Finishing it on B updates A's copy."""
    tid = "t-rerun"
    cfg = fleet_config(redis_srv.url(), unique_prefix(), [source("a", "chat", up.url)],
                       stall_window_s=10)
    a, b = start_fleet(make_sidecar, 2, cfg)
    ca, cb = a.connect(), b.connect()
    assert ca.request("task.start", {"task_id": tid})[0] is None
    assert ca.request("task.finish", {"task_id": tid, "ok": True})[0] is None
    err, t = cb.request("task.start", {"task_id": tid})
    assert err is None and t["runs"] == 2, (err, t)
    err, res, _ = call(a, chat(), task_id=tid)
    assert err is None, err
    assert ca.request("task.guard", {"task_id": tid}) == (None, {})
    err, t = ca.request("task.get", {"task_id": tid})
    assert err is None and t["state"] == "running" and t["runs"] == 2, (err, t)
    assert cb.request("task.finish", {"task_id": tid, "ok": False, "reason": "B gave up"})[0] \
        is None
    # A's copy (imported by the call) learns the finish through the channel.
    assert wait_until(lambda: not any(x["task_id"] == tid and x["state"] == "running"
                                      for x in ca.request("task.list", {})[1]["tasks"]), 2)
    err, res, _ = call(a, chat(), task_id=tid)
    assert res is None and err["code"] == "bad_request" and "failed" in err["message"], err
    ca.close()
    cb.close()


def test_fleet__task_requests_count_against_the_connection_limit(redis_srv, up, make_sidecar):
    """Task requests waiting for Redis are in flight like calls: past
    max_inflight_per_connection they are refused `overloaded`, not queued
    without bound."""
    cfg = fleet_config(redis_srv.url(), unique_prefix(), [source("a", "chat", up.url)],
                       stall_window_s=10, listen={"max_inflight_per_connection": 2})
    (a,) = start_fleet(make_sidecar, 1, cfg)
    c = a.connect()
    redis_srv.freeze()
    try:
        ids = [c.request_async("task.get", {"task_id": "x%d" % i}) for i in range(50)]
        codes = {}
        for i in ids:
            m = c.wait_response(i, 5)
            code = m[2]["code"] if m[2] else "ok"
            codes[code] = codes.get(code, 0) + 1
    finally:
        redis_srv.thaw()
    assert codes.get("overloaded", 0) == 48, codes
    assert codes.get("backend_unavailable", 0) + codes.get("bad_request", 0) == 2, codes
    c.close()


def test_fleet__waiters_for_a_refill_do_not_stampede(redis_srv, up, make_sidecar):
    """60 calls over 3 sidecars for a bucket of 5 per second: after a refusal
    a sidecar's waiters ask one at a time (the source is gated until the
    backend's retry time, jittered across the fleet), so admissions stay a
    small multiple of the calls (measured ~3.6 per call) instead of growing
    with the number of waiters per token (~27 per call without the gate)."""
    cfg = fleet_config(redis_srv.url(), unique_prefix(),
                       [source("a", "chat", up.url, limits={"rpm": 5, "window_s": 1})],
                       stall_window_s=30)
    fleet = start_fleet(make_sidecar, 3, cfg)
    calls = [Pending(fleet[i % 3], "chat", chat(), timeout=30) for i in range(60)]
    for k in calls:
        err, _ = k.wait(30)
        assert err is None, err
        k.close()
    admits = shared_sum(fleet, "admits")
    admitted = shared_sum(fleet, "admitted")
    print("60 calls at 5/s: %d admissions for %d admitted (%.1f per call)"
          % (admits, admitted, admits / admitted))
    assert admitted == 60
    assert admits <= 60 * 8, admits


def test_fleet__stopping_answers_task_requests_waiting_for_redis(redis_srv, up, make_sidecar):
    """SIGTERM while task requests wait for a frozen Redis: once the grace
    period is over they are answered `shutting_down` (not dropped with the
    connection), and the sidecar exits cleanly."""
    cfg = fleet_config(redis_srv.url(), unique_prefix(), [source("a", "chat", up.url)],
                       stall_window_s=10, backend={"command_timeout_s": 5, "lease_ttl_s": 30},
                       grace=0.2)
    (a,) = start_fleet(make_sidecar, 1, cfg)
    c = a.connect()
    redis_srv.freeze()
    try:
        ids = [c.request_async("task.get", {"task_id": "t%d" % i}) for i in range(3)]
        time.sleep(0.1)
        t0 = time.monotonic()
        a.send_signal(signal.SIGTERM)
        for i in ids:
            m = c.wait_response(i, 3)
            assert m[2] is not None and m[2]["code"] == "shutting_down", m
        assert time.monotonic() - t0 < 1.5
    finally:
        redis_srv.thaw()
    # At exit the sidecar lets its last Redis writes out (bounded by the
    # command timeout): with Redis back it exits at once.
    assert a.proc.wait(timeout=6) == 0
    c.close()


def test_fleet__scripts_reloaded_after_script_flush(redis_srv, up, make_sidecar):
    """Redis lost its script cache (SCRIPT FLUSH, as after a restart or a
    fail-over): the next calls still work — NOSCRIPT is answered by one EVAL
    of the compiled-in source — and the reload is counted."""
    cfg = fleet_config(redis_srv.url(), unique_prefix(), [source("a", "chat", up.url)])
    (a,) = start_fleet(make_sidecar, 1, cfg)
    assert call(a, chat())[0] is None
    redis_srv.client().call("SCRIPT", "FLUSH")
    for _ in range(3):
        err, res, _ = call(a, chat())
        assert err is None, err
    assert stats(a)["backend"]["noscript_reloads"] >= 1


def test_fleet__a_long_call_keeps_its_lease(redis_srv, up, make_sidecar):
    """A call that runs longer than lease_ttl_s keeps its fleet permit (its
    lease is renewed every lease_ttl_s / 3): with max_concurrency 1, a call
    on B waits for A's 2.5 s call to finish, not for the 1.2 s TTL."""
    cfg = fleet_config(redis_srv.url(), unique_prefix(),
                       [source("a", "chat", up.url, max_concurrency=1, ttft_timeout_s=8,
                               aimd={"initial": 1, "min": 1})],
                       stall_window_s=10, backend={"command_timeout_s": 0.3, "lease_ttl_s": 1.2})
    a, b = start_fleet(make_sidecar, 2, cfg)
    long_call = Pending(a, "chat", chat(mock={"delay_ms": 2500}), timeout=10)
    assert wait_until(lambda: up.stats()["in_progress"] == 1, 3)
    t0 = time.monotonic()
    err, res, elapsed = call(b, chat(), timeout=10)
    assert err is None, err
    err, _ = long_call.wait(5)
    assert err is None, err
    assert_at("B's call behind A's renewed lease", time.monotonic() - t0, 2.4, 2.5 + 0.5)
    assert shared_sum([a], "renewals") >= 2
    assert shared_sum([a], "leases_lost") == 0
    long_call.close()


def test_fleet__breaker_opened_by_one_sidecar_holds_for_all(redis_srv, up, make_sidecar):
    """Transient failures seen through A open the source's breaker for the
    fleet: B's call is refused (`breaker`) until the cool-down, then it is the
    half-open probe and its success closes the breaker."""
    cfg = fleet_config(redis_srv.url(), unique_prefix(),
                       [source("a", "chat", up.url,
                               breaker={"failures": 2, "cooldown_s": 1, "max_cooldown_s": 4})],
                       stall_window_s=10, max_attempts=1)
    a, b = start_fleet(make_sidecar, 2, cfg)
    for _ in range(2):
        err, _, _ = call(a, chat(mock={"status": 500}))
        assert err is not None and err["code"] == "retry_exhausted", err
    opened = time.monotonic()
    before = up.stats()["requests"]
    err, res, _ = call(b, chat(), timeout=5)
    assert err is None, err
    assert_at("B's call after the fleet breaker's cool-down", time.monotonic() - opened, 1.0,
              1.0 + 0.3)
    assert up.stats()["requests"] == before + 1   # nothing sent while open
    # The probe's release (which closes the breaker) may land just after the
    # reply: B's view follows the release's answer, so wait for that event.
    s = wait_until(lambda: (lambda v: v if v["sources"]["a"]["breaker"] == "closed" else None)(
        stats(b)["shared"]), 3.0) or stats(b)["shared"]
    assert s["refused"]["breaker"] >= 1 and s["sources"]["a"]["breaker"] == "closed", s
    assert stats(a)["shared"]["sources"]["a"]["breaker"] == "open"  # as A last saw it


def test_fleet__all_waiters_go_when_the_fleet_frees_permits(redis_srv, up, make_sidecar):
    """B holds the fleet's 4 permits for 2 s; A's 4 calls of 3 s wait (the
    source is gated after the refusals). When B's calls end, every one of
    A's calls is admitted — each admission lets the next waiter ask — so
    all of them end about 2 + 3 s after B started, not one wave later."""
    cfg = fleet_config(redis_srv.url(), unique_prefix(),
                       [source("a", "chat", up.url, max_concurrency=4, ttft_timeout_s=8)],
                       stall_window_s=30, poll_interval_s=0.2)
    a, b = start_fleet(make_sidecar, 2, cfg)
    t0 = time.monotonic()
    held = [Pending(b, "chat", chat("b%d" % i, mock={"delay_ms": 2000}), timeout=20)
            for i in range(4)]
    assert wait_until(lambda: up.stats()["in_progress"] == 4, 3)
    waiting = [Pending(a, "chat", chat("a%d" % i, mock={"delay_ms": 3000}), timeout=20)
               for i in range(4)]
    for k in held + waiting:
        err, _ = k.wait(20)
        assert err is None, err
        k.close()
    last = max(k.t_end for k in waiting) - t0
    assert_at("the last of A's calls", last, 5.0, 5.0 + 0.5)
    assert stats(a)["shared"]["refused"]["concurrency"] >= 1


def test_fleet__a_large_call_refused_on_tokens_does_not_block_small_ones(redis_srv, up,
                                                                        make_sidecar):
    """A token-bucket refusal depends on the call's size: a large call that
    must wait for tokens does not hold up a small call the fleet can admit
    now (the source is not gated for it)."""
    cfg = fleet_config(redis_srv.url(), unique_prefix(),
                       [source("a", "chat", up.url, limits={"tpm": 1000, "window_s": 10},
                               ttft_timeout_s=9)],
                       stall_window_s=30)
    a, b = start_fleet(make_sidecar, 2, cfg)

    def body(text, max_tokens, mock=None):
        x = chat(text, mock=mock)
        x["max_tokens"] = max_tokens
        return x

    hold = Pending(b, "chat", body("hold", 500, mock={"delay_ms": 8000}), timeout=30)
    assert wait_until(lambda: up.stats()["in_progress"] == 1, 3)
    big = Pending(a, "chat", body("big", 900), timeout=30)  # ~480 tokens left: refused
    assert wait_until(lambda: stats(a)["shared"]["refused"]["tpm"] >= 1, 3)
    err, res, elapsed = call(a, body("small", 10), timeout=10)
    assert err is None, err
    assert elapsed < 0.5, "a small call waited %.2fs behind a large one" % elapsed
    big.cancel()
    err, _ = big.wait(3)
    assert err["code"] == "cancelled", err
    err, _ = hold.wait(15)
    assert err is None, err
    big.close()
    hold.close()

"""The governed loop (docs/DESIGN.md §3.1-3.4, issue 4) end to end: the real
sidecar, the real mock upstream, real sockets, real time scaled down to
windows of 0.3-1 s. The unit tests (tests/unit, fake clock) pin the same
rules exactly; these prove that the sidecar drives the core the way the core
expects: wake-ups, timers, permits, refunds and typed errors on the wire.

Each test asserts the error code, the number of requests the mock saw and
the elapsed time seen by the client. The numbered cases of docs/DESIGN.md §3.1
("consequences that tests must pin") are named in the test docstrings.

Timing bounds. An event scheduled by the sidecar at time T after the call
was sent is asserted within

    T - EARLY <= elapsed <= T + LATE

- EARLY (20 ms) is only rounding: the client starts its clock before it
  sends, and the sidecar's clock for the call (libev's ev_now, updated after
  each poll) starts no earlier than the request became readable, so the
  sidecar can only be late, never early, relative to the client. Backoffs are
  jittered in [0.5, 1.0) x base x 2^(n-1): a bound that involves a backoff
  uses its minimum on the early side and its maximum on the late side.
- LATE (250 ms) is scheduling slack, not imprecision: every wake-up is one
  libev timer at the instant the core computed (no polling), so on an idle
  machine the sidecar answers within a few ms of T (run with `pytest -s` to
  see a `timing:` line per case). The rest covers the ASan + UBSan build (2-3x
  slower) on the 2-core CI machine, where pytest, its answer threads, the mock
  and the sidecar all share the two cores with other jobs.

Counts are exact wherever the rule makes them exact (max_attempts, the
queueing gateway's one attempt); where they depend on jitter (a run of
exempt 429s) they are bounded from both sides.

Only 127.0.0.1 is used; every wait and every loop in this file is bounded.
"""
import json
import os
import socket
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import Pending, call, chat, config_yaml, cpu_seconds, source_yaml  # noqa: E402

EARLY = 0.02
LATE = 0.25

# Sources start from these: quick failure detection, admission wide open
# (no AIMD ramp-up, a breaker that never opens) so that only the rule under
# test limits a call. ttft_timeout_s must be <= the effective stall window
# (a config rule, docs/DESIGN.md §3.1), so every window below is >= 0.3 s.
SOURCE_DEFAULTS = {"timeout_s": 5, "connect_timeout_s": 2, "ttft_timeout_s": 0.3,
                   "idle_timeout_s": 5, "max_concurrency": 256, "aimd": {"initial": 256},
                   "breaker": {"failures": 100000}}

# One permit, held by one call: the building block of the waiting tests.
ONE_PERMIT = {"max_concurrency": 1, "aimd": {"initial": 1, "min": 1}}

# A call that takes the permit and keeps it: the mock sends the headers at
# once (so no TTFT fires) and then nothing, for longer than any test runs.
HOLD = {"hang": "after_headers"}


# --------------------------------------------------------------- helpers
def source(name, capability, base_url, **kw):
    return source_yaml(name, capability, base_url, SOURCE_DEFAULTS, **kw)


def start(make_sidecar, sources, capabilities=None, **defaults):
    d = {"max_attempts": 3, "stall_window_s": 5, "backoff_base_s": 0.05, "backoff_max_s": 0.1}
    d.update(defaults)
    # A proxy from the environment must not capture the loopback mock.
    return make_sidecar(config_text=config_yaml(sources, d, capabilities),
                        env={"no_proxy": "*", "NO_PROXY": "*"})


def embed(text="hello", mock=None):
    body = {"model": "m", "input": text}
    if mock is not None:
        body["mock"] = mock
    return body


def assert_at(what, elapsed, lo, hi=None):
    """lo - EARLY <= elapsed <= hi + LATE (hi defaults to lo)."""
    hi = lo if hi is None else hi
    print("timing: %-46s elapsed %.3fs  expected [%.3f, %.3f]  late %+4.0f ms"
          % (what, elapsed, lo, hi, (elapsed - hi) * 1000))
    assert lo - EARLY <= elapsed <= hi + LATE, \
        "%s: ended after %.3fs, expected %.3f-%.3fs" % (what, elapsed, lo, hi)


def sources(err):
    """The error's per-source notes without `detail` (the text of the last
    attempt's failure, present only when an attempt ended the call)."""
    return [{k: v for k, v in s.items() if k != "detail"} for s in err["sources"]]


def requests(up, path=None):
    st = up.stats()
    if path is None:
        return st["requests"]
    return sum(n for p, n in st["by_path"].items() if p.endswith(path))


def wait_holding(up, n=1):
    """Waits until `n` held requests reached the mock (the permits are taken)."""
    up.wait_stats(lambda s: s["in_progress"] == n, timeout=3)


def sleep_until(t):
    left = t - time.monotonic()
    if left > 0:
        time.sleep(left)


# ------------------------------------------- stall budget vs retry budget
def test_governance__timeout_equal_to_stall_window_leaves_the_retry_budget(make_sidecar, up):
    """docs/DESIGN.md §3.1 case 1: stall_window_s == timeout_s == ttft_timeout_s. The
    first attempt hangs until timeout_s (a transient failure); that time is
    charged to the retry budget, not the stall budget, so the second attempt
    runs and succeeds — the call is not `stalled`."""
    w = 0.5
    sc = start(make_sidecar, [source("a", "chat", up.url, timeout_s=w, ttft_timeout_s=w)],
               stall_window_s=w, backoff_base_s=0.05, backoff_max_s=0.05)
    up.script([{"hang": "before_headers"}, {}])
    err, res, elapsed = call(sc.connect(), "chat", chat("second time lucky"))
    assert err is None, err
    assert res["attempts"] == 2 and res["source"] == "a"
    assert res["body"]["choices"][0]["message"]["content"] == "second time lucky"
    assert requests(up) == 2
    up.wait_stats(lambda s: s["aborted_by_peer"] == 1)        # the timed-out attempt
    # one attempt of timeout_s, one backoff in [0.025, 0.05), one quick attempt
    assert_at("timeout == window: 2nd attempt succeeds", elapsed, w + 0.025, w + 0.05)
    # Only the backoff (and the loop's own latency) is stall time.
    assert 0.025 - EARLY <= res["stalled_s"] < 0.05 + LATE, res
    assert res["elapsed_s"] - res["stalled_s"] >= w - EARLY, res


def test_governance__attempt_time_alone_never_stalls(make_sidecar, up):
    """docs/DESIGN.md §3.1 case 2: one attempt that takes several stall windows (a
    body trickled over ~0.8 s, window 0.3 s, scope never progressed) is
    productive time: the call succeeds with stalled_s ~ 0."""
    w = 0.3
    sc = start(make_sidecar, [source("a", "chat", up.url, idle_timeout_s=1, timeout_s=5)],
               stall_window_s=w)
    # The reply is ~270 bytes: 17 pieces of 16 bytes every 50 ms.
    err, res, elapsed = call(sc.connect(), "chat",
                             chat(mock={"trickle_ms": 50, "trickle_bytes": 16}))
    assert err is None, err
    assert res["attempts"] == 1 and requests(up) == 1
    print("timing: trickled attempt %.3fs, stalled_s %.3f (window %.1f)"
          % (elapsed, res["stalled_s"], w))
    assert elapsed >= 2 * w, "the attempt was too short to prove anything: %.3fs" % elapsed
    assert res["stalled_s"] < 0.05, res


def test_governance__pure_waiting_stalls_at_the_window_and_not_before(make_sidecar, up):
    """docs/DESIGN.md §3.1 cases 3 and 7. A source with one permit, held by a call
    whose upstream never finishes; the scope never succeeded (progress age
    +inf). A second call finds nothing runnable and waits: `stalled` once its
    own window is spent — not before, and with no attempt. A third call that
    starts 0.25 s later stalls 0.25 s later: stall clocks are per call.

    Why a held permit rather than an open breaker: it is pure waiting with
    nothing else going on (no cool-down timer, no probe, no failed attempt
    in the picture), and the holder is under the test's control."""
    w = 0.5
    sc = start(make_sidecar, [source("a", "chat", up.url, **ONE_PERMIT)], stall_window_s=w)
    holder = Pending(sc, "chat", chat(mock=HOLD))
    wait_holding(up)
    b = Pending(sc, "chat", chat())
    time.sleep(0.25)
    c = Pending(sc, "chat", chat())
    time.sleep(w - 0.25 - 0.1)
    assert not b.answered(), "stalled before its window: %r" % (b.err,)
    for name, k in (("b", b), ("c (started 0.25 s later)", c)):
        err, res = k.wait(3)
        assert res is None and err["code"] == "stalled", err
        assert err["attempts"] == 0 and err["sources"] == [], err
        assert err["stalled_s"] > w, err
        assert_at("pure waiting -> stalled: " + name, k.elapsed, w)
    assert c.t_end - b.t_end >= 0.25 - EARLY, "stall clocks shared? %.3f" % (c.t_end - b.t_end)
    assert requests(up) == 1                                    # only the holder's
    assert not holder.answered()
    holder.cancel()
    err, _ = holder.wait(2)
    assert err["code"] == "cancelled"
    up.wait_stats(lambda s: s["aborted_by_peer"] == 1 and s["open_connections"] == 0)


# ------------------------------------------------------- 429 saturation
def test_governance__all_429_chat_ends_stalled_not_in_an_endless_loop(make_sidecar, up):
    """docs/DESIGN.md §3.1 case 4, exempt capability (chat). Every request gets a 429:
    no attempt consumes the retry budget (more requests than max_attempts
    2), every 429 attempt and backoff is stall time, so the call ends
    `stalled` at the window plus at most one backoff, after a finite number
    of requests: at most one per shortest backoff (0.05 s) in the 0.5 s
    window, plus the first."""
    w = 0.5
    sc = start(make_sidecar, [source("a", "chat", up.url, breaker={"failures": 2})],
               stall_window_s=w, backoff_base_s=0.1, backoff_max_s=0.1, max_attempts=2)
    up.set_default({"status": 429})
    err, res, elapsed = call(sc.connect(), "chat", chat())
    assert res is None and err["code"] == "stalled", err
    n = requests(up)
    print("timing: all-429 chat: %d requests, stalled after %.3fs" % (n, elapsed))
    assert err["attempts"] == n
    assert 2 < n <= 11, "%d requests in a %.1fs window with backoffs of [0.05, 0.1)" % (n, w)
    assert sources(err) == [{"name": "a", "reason": "http_429", "attempts": n, "status": 429}]
    assert err["stalled_s"] > w
    # The error describes the last attempt although the verdict came later
    # (at the top of the loop, after a backoff).
    assert err["status"] == 429 and "%d attempt(s), last: a: http_429" % n in err["message"], err
    assert_at("all-429 chat -> stalled", elapsed, w, w + 0.1)
    # Nothing runs on after the answer.
    time.sleep(0.15)
    assert requests(up) == n
    # A 429 never trips the breaker (failures: 2): the next call is admitted.
    up.set_default(None)
    err, res, _ = call(sc.connect(), "chat", chat())
    assert err is None and res["source"] == "a", err


def test_governance__all_429_embedding_exhausts_max_attempts(make_sidecar, up):
    """docs/DESIGN.md §3.1 case 4, non-exempt capability (embedding): a 429 is a
    transient failure, so the call ends `retry_exhausted` after exactly
    max_attempts requests (well inside the stall window)."""
    sc = start(make_sidecar, [source("e", "embedding", up.url)], stall_window_s=0.5,
               max_attempts=3, backoff_base_s=0.05, backoff_max_s=0.1)
    up.set_default({"status": 429})
    err, res, elapsed = call(sc.connect(), "embedding", embed())
    assert res is None and err["code"] == "retry_exhausted", err
    assert requests(up) == 3 and err["attempts"] == 3
    assert err["sources"][0]["reason"] == "http_429" and err["sources"][0]["attempts"] == 3
    # backoffs after attempts 1 and 2: [0.025, 0.05) + [0.05, 0.1)
    assert_at("all-429 embedding -> retry_exhausted", elapsed, 0.075, 0.15)


def test_governance__queueing_gateway_stalls_after_one_attempt(make_sidecar, up):
    """docs/DESIGN.md §3.1 case 5: a gateway
    holds each request for most of timeout_s, then answers 429. timeout =
    stall window = T = 0.6 s, hold 0.45 s, backoff [0.2, 0.4). The exempt
    429 attempt is refunded to the stall budget, so after one attempt and
    one backoff the call has waited >= 0.65 s > T: `stalled` after exactly
    ONE request, at about T plus one backoff. (Without the refund the
    attempt would count as productive and only the backoffs would add up:
    several more held attempts — hundreds at production scale.)

    The hold leaves 150 ms before timeout_s so that a loaded machine cannot
    turn the 429 into a timeout; hold + the shortest backoff exceeds T by
    50 ms, a margin that scheduling delays can only widen."""
    t = 0.6
    sc = start(make_sidecar, [source("a", "chat", up.url, timeout_s=t, ttft_timeout_s=t)],
               stall_window_s=t, backoff_base_s=0.4, backoff_max_s=0.4, max_attempts=3)
    up.set_default({"status": 429, "delay_ms": 450})
    err, res, elapsed = call(sc.connect(), "chat", chat())
    assert res is None and err["code"] == "stalled", err
    assert err["attempts"] == 1 and requests(up) == 1, err
    assert sources(err) == [{"name": "a", "reason": "http_429", "attempts": 1, "status": 429}]
    assert err["status"] == 429 and err["stalled_s"] > t, err
    assert_at("queueing gateway -> stalled, 1 attempt", elapsed, 0.45 + 0.2, 0.45 + 0.4)
    time.sleep(0.1)
    assert requests(up) == 1


# ------------------------------------------- progress elsewhere in the scope
def _scope_setup(make_sidecar, up, w):
    """An embedding source with one permit (held by `holder`) and a healthy
    chat source. Calls name the scope they account progress to: chat calls
    in scope "shared" succeed while embedding calls wait for the permit."""
    sc = start(make_sidecar, [source("e", "embedding", up.url, **ONE_PERMIT),
                              source("ch", "chat", up.url)], stall_window_s=w)
    holder = Pending(sc, "embedding", embed(mock=HOLD))
    wait_holding(up)
    return sc, holder


def _feed_progress(sc, until, scope="shared", every=0.05):
    """Successful chat calls in `scope` until `until`; returns (count,
    send time and answer time of the last one)."""
    c = sc.connect()
    n, last = 0, (None, None)
    while time.monotonic() < until:
        t_send = time.monotonic()
        err, res, _ = call(c, "chat", chat(), scope=scope)
        assert err is None, err
        n += 1
        last = (t_send, time.monotonic())
        time.sleep(every)
    c.close()
    return n, last


def test_governance__local_window_exceeded_scope_fresh_keeps_waiting(make_sidecar, up):
    """docs/DESIGN.md §3.1 case 6 (and 7). B waits for the embedding permit in scope
    "shared" far beyond its own 0.4 s window, because chat calls in the same
    scope keep succeeding (progress age < window): it is not stalled, and
    when the permit is released it runs and succeeds. Beside it, the same
    call in a scope that never progressed ends `stalled` at the window."""
    w = 0.4
    sc, holder = _scope_setup(make_sidecar, up, w)
    b = Pending(sc, "embedding", embed("patient"), scope="shared")
    lonely = Pending(sc, "embedding", embed("lonely"), scope="lonely")
    n, _ = _feed_progress(sc, b.t0 + 3 * w)

    err, _ = lonely.wait(1)
    assert err["code"] == "stalled" and err["attempts"] == 0, err
    assert_at("no progress in its scope -> stalled", lonely.elapsed, w)
    assert not b.answered(), "B ended although its scope progressed: %r" % (b.err,)

    t_release = time.monotonic()
    holder.cancel()
    err, res = b.wait(2)
    assert err is None, err
    assert res["attempts"] == 1 and res["source"] == "e"
    assert res["stalled_s"] > 2 * w, res                  # it outlived its window
    assert_at("permit released -> B runs", b.t_end - t_release, 0)
    assert_at("B waited while the scope progressed", b.elapsed, 3 * w, 3 * w + 0.15)
    assert requests(up, "/embeddings") == 2                # the holder and B
    assert requests(up, "/chat/completions") == n
    assert holder.wait(1)[0]["code"] == "cancelled"


def test_governance__progress_stops_then_stalled_one_window_later(make_sidecar, up):
    """docs/DESIGN.md §3.1 case 6, the other side: B has exceeded its own window
    while the scope progressed; once the progress stops, B ends `stalled`
    exactly when the scope's progress age passes the window — one window
    after the last success in the scope."""
    w = 0.4
    sc, holder = _scope_setup(make_sidecar, up, w)
    b = Pending(sc, "embedding", embed(), scope="shared")
    n, (t_sent, t_answered) = _feed_progress(sc, b.t0 + 2 * w)
    assert n >= 4
    assert not b.answered(), "B ended although its scope progressed: %r" % (b.err,)
    err, res = b.wait(2)
    assert res is None and err["code"] == "stalled", err
    assert err["attempts"] == 0 and err["stalled_s"] > 2 * w, err
    # The progress mark is made between the last chat call's send and answer.
    assert_at("progress stops -> stalled one window later", b.t_end - t_sent, w,
              w + (t_answered - t_sent))
    holder.cancel()
    assert holder.wait(1)[0]["code"] == "cancelled"


# ------------------------------------------------------------ failover
def test_governance__breaker_open_fails_over_then_half_open_probe(make_sidecar, up, up2):
    """Source a (priority 0, breaker failures 2, cool-down 0.6 s) fails twice
    and opens; the next call goes to b (priority 1) at once, without touching
    a. After the cool-down a gets exactly one half-open probe (a concurrent
    call meanwhile goes to b); the probe succeeds and closes the breaker."""
    cool = 0.6
    sc = start(make_sidecar, [
        source("a", "chat", up.url, priority=0, ttft_timeout_s=1,
               breaker={"failures": 2, "cooldown_s": cool, "max_cooldown_s": 5}),
        source("b", "chat", up2.url, priority=1)], max_attempts=1)
    c = sc.connect()
    up.script([{"status": 500}, {"status": 500}])
    for i in range(2):
        err, res, _ = call(c, "chat", chat())
        assert err["code"] == "retry_exhausted", err
        assert sources(err) == [{"name": "a", "reason": "http_5xx", "attempts": 1, "status": 500}]
    t_open = time.monotonic()          # the breaker opened before this
    assert requests(up) == 2 and requests(up2) == 0

    err, res, elapsed = call(c, "chat", chat())
    assert err is None and res["source"] == "b" and res["attempts"] == 1, (err, res)
    assert_at("breaker open -> failover to b at once", elapsed, 0)
    sleep_until(t_open + cool / 3)
    err, res, _ = call(c, "chat", chat())
    assert err is None and res["source"] == "b", (err, res)     # still cooling down
    assert requests(up) == 2 and requests(up2) == 2

    sleep_until(t_open + cool + 0.05)
    up.script([{"delay_ms": 300}])
    probe = Pending(sc, "chat", chat())
    wait_holding(up)
    err, res, elapsed = call(c, "chat", chat())                 # the probe is taken
    assert err is None and res["source"] == "b", (err, res)
    assert_at("half-open, probe busy -> b at once", elapsed, 0)
    err, res = probe.wait(2)
    assert err is None and res["source"] == "a", (err, res)
    assert_at("half-open probe on a", probe.elapsed, 0.3)
    err, res, _ = call(c, "chat", chat())                       # closed again
    assert err is None and res["source"] == "a", (err, res)
    assert requests(up) == 4 and requests(up2) == 3


def test_governance__retry_avoids_the_source_that_failed_this_call(make_sidecar, up, up2):
    """docs/DESIGN.md §3.2: a retry skips a source that failed this same call when
    another is runnable, even a lower tier; the next call starts on a again."""
    sc = start(make_sidecar, [source("a", "chat", up.url, priority=0),
                              source("b", "chat", up2.url, priority=1)], max_attempts=2)
    c = sc.connect()
    up.script([{"status": 503}])
    err, res, _ = call(c, "chat", chat())
    assert err is None and res["source"] == "b" and res["attempts"] == 2, (err, res)
    err, res, _ = call(c, "chat", chat())
    assert err is None and res["source"] == "a" and res["attempts"] == 1, (err, res)
    assert requests(up) == 2 and requests(up2) == 1


# --------------------------------------------------- rate limits queue
def test_governance__rpm_limit_queues_rather_than_rejects(make_sidecar, up):
    """rpm 120: a bucket of 120 requests, refilled at 2 per second. 122 calls
    sent at once: 120 start at once, the 121st waits for the first refilled
    token (0.5 s after the first start) and the 122nd for the next (1.0 s).
    Both succeed: the limit queues, it never rejects. (The bucket holds a
    minute's worth, so a small-rpm test would wait tens of seconds: a large
    burst against a fast refill fits in about one second.)"""
    n = 122
    sc = start(make_sidecar, [source("a", "chat", up.url, limits={"rpm": 120})])
    c = sc.connect()
    t0 = time.monotonic()
    ids = [c.request_async("call", {"capability": "chat", "body": chat("n%d" % i)})
           for i in range(n)]
    done = {}
    deadline = t0 + 4
    while len(done) < n:
        msg = c.recv_msg(max(0.001, deadline - time.monotonic()))
        assert msg is not None and msg[0] == 1, msg
        assert msg[2] is None, msg[2]
        done[msg[1]] = time.monotonic() - t0
    assert sorted(done) == ids
    times = sorted(done.values())
    print("timing: rpm burst: 120th answer %.3fs" % times[119])
    assert_at("rpm 120: 121st call (1st refill)", times[120], 0.5)
    assert_at("rpm 120: 122nd call (2nd refill)", times[121], 1.0)
    assert requests(up) == n


def test_governance__rpm_wait_ends_by_deadline_not_by_rejection(make_sidecar, up):
    """rpm 3: the 4th call needs a token 20 s away. It is queued, not
    rejected, and ends by its own deadline_s with `deadline_exceeded`, no
    attempt made, and a retry_after_s that tells when the token comes."""
    sc = start(make_sidecar, [source("a", "chat", up.url, limits={"rpm": 3})])
    c = sc.connect()
    t_first = time.monotonic()
    for _ in range(3):
        err, res, _ = call(c, "chat", chat())
        assert err is None, err
    err, res, elapsed = call(c, "chat", chat(), deadline_s=0.4)
    assert res is None and err["code"] == "deadline_exceeded", err
    assert err["attempts"] == 0 and requests(up) == 3
    assert_at("rpm 3: 4th call -> deadline_exceeded", elapsed, 0.4)
    # The next token is due 20 s after the first take.
    due = 20 - (time.monotonic() - t_first)
    assert due - 1 <= err["retry_after_s"] <= due + 0.5, err


def test_governance__pacer_spaces_request_starts(make_sidecar, up):
    """pacer.min_interval_ms 200: four calls sent at once start 200 ms apart
    (the others wait, they are not rejected)."""
    sc = start(make_sidecar, [source("a", "chat", up.url, pacer={"min_interval_ms": 200})])
    c = sc.connect()
    t0 = time.monotonic()
    ids = [c.request_async("call", {"capability": "chat", "body": chat()}) for _ in range(4)]
    times = []
    while len(times) < 4:
        msg = c.recv_msg(3)
        assert msg[0] == 1 and msg[1] in ids and msg[2] is None, msg
        times.append(time.monotonic() - t0)
    # The first starts at once; the lower bounds are the pacer's spacing
    # (the k-th start is at least 0.2 k after the first).
    for i, t in enumerate(times):
        assert_at("pacer 200 ms: call %d" % (i + 1), t, 0.2 * i)
    assert requests(up) == 4


# ---------------------------------------------------- retries, deadlines
def test_governance__retry_budget_with_backoff(make_sidecar, up):
    """Every attempt gets a 500: `retry_exhausted` after exactly max_attempts
    (3) requests, with a jittered exponential backoff between them: base 0.1
    -> [0.05, 0.1) then [0.1, 0.2), so 0.15 <= elapsed < 0.3."""
    sc = start(make_sidecar, [source("a", "chat", up.url)], max_attempts=3,
               backoff_base_s=0.1, backoff_max_s=1)
    up.set_default({"status": 500})
    err, res, elapsed = call(sc.connect(), "chat", chat())
    assert res is None and err["code"] == "retry_exhausted", err
    assert requests(up) == 3 and err["attempts"] == 3
    assert err["status"] == 500
    assert sources(err) == [{"name": "a", "reason": "http_5xx", "attempts": 3, "status": 500}]
    assert_at("500s -> retry_exhausted after 3", elapsed, 0.15, 0.3)


def test_governance__deadline_bounds_backoff_sleeps(make_sidecar, up):
    """deadline_s bounds the whole loop: all 500s with a budget of 100
    attempts and backoffs of [0.15, 0.3) s; deadline_s 0.5 ends the call
    during a backoff sleep, at 0.5 s, with `deadline_exceeded`."""
    sc = start(make_sidecar, [source("a", "chat", up.url)], max_attempts=100,
               backoff_base_s=0.3, backoff_max_s=0.3)
    up.set_default({"status": 500})
    err, res, elapsed = call(sc.connect(), "chat", chat(), deadline_s=0.5)
    assert res is None and err["code"] == "deadline_exceeded", err
    n = requests(up)
    assert err["attempts"] == n and 2 <= n <= 4, (n, err)
    assert_at("deadline_s 0.5 during backoff", elapsed, 0.5)
    time.sleep(0.1)
    assert requests(up) == n


def test_governance__deadline_bounds_waiting_for_a_permit(make_sidecar, up):
    """deadline_s also ends a call that waits for a permit (stall window 5 s,
    far away): `deadline_exceeded` at deadline_s, no attempt."""
    sc = start(make_sidecar, [source("a", "chat", up.url, **ONE_PERMIT)])
    holder = Pending(sc, "chat", chat(mock=HOLD))
    wait_holding(up)
    err, res, elapsed = call(sc.connect(), "chat", chat(), deadline_s=0.4)
    assert res is None and err["code"] == "deadline_exceeded", err
    assert err["attempts"] == 0
    assert_at("deadline_s 0.4 waiting for a permit", elapsed, 0.4)
    holder.cancel()
    assert holder.wait(1)[0]["code"] == "cancelled"
    assert requests(up) == 1


# ---------------------------------------------------------- waiting is free
def test_governance__waiting_calls_burn_no_cpu_and_cancel_at_once(make_sidecar, up):
    """200 calls wait for the one permit a hung call holds: the sidecar uses
    < 0.1 s of CPU over 1 s of that (no busy loop, no polling). Cancelling
    one waiter answers `cancelled` at once and leaves the others waiting;
    hanging up cancels the rest, and the permit is free again."""
    n = 200
    sc = start(make_sidecar, [source("a", "chat", up.url, **ONE_PERMIT)], stall_window_s=30)
    holder = Pending(sc, "chat", chat(mock=HOLD))
    wait_holding(up)
    c = sc.connect()
    ids = [c.request_async("call", {"capability": "chat", "body": chat()}) for _ in range(n)]
    # Requests on one connection are handled in order, and a call that finds
    # nothing runnable is parked before its request handler returns: once the
    # ping is answered, all 200 are waiting.
    err, _ = c.request("ping")
    assert err is None
    time.sleep(0.2)
    cpu0 = cpu_seconds(sc.proc.pid)
    time.sleep(1.0)
    cpu = cpu_seconds(sc.proc.pid) - cpu0
    print("timing: %d waiting calls: sidecar CPU %.3fs over 1s" % (n, cpu))
    assert cpu < 0.1, "the sidecar burned %.2fs CPU in 1 s while calls waited" % cpu

    t = time.monotonic()
    c.send([2, "cancel", [ids[n // 2]]])
    msg = c.wait_response(ids[n // 2], 2)
    assert msg[2]["code"] == "cancelled" and msg[2]["attempts"] == 0, msg
    assert_at("cancel a waiting call", time.monotonic() - t, 0)
    with pytest.raises(socket.timeout):
        c.recv_msg(0.1)                                 # the others still wait
    assert requests(up) == 1

    c.sock.shutdown(socket.SHUT_RDWR)                   # cancels the 199 others
    c.close()
    holder.cancel()
    assert holder.wait(1)[0]["code"] == "cancelled"
    err, res, elapsed = call(sc.connect(), "chat", chat())
    assert err is None and res["attempts"] == 1, err
    assert_at("permit free again", elapsed, 0)
    assert requests(up) == 2

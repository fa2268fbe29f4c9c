"""Input and output token limits (limits.itpm / otpm) on the Redis backend:
real polygw sidecars sharing one real redis-server, the real mock upstream.
The buckets are the fleet's (admit.lua reserves a call's input and output
estimates apart, release.lua replaces them by the real counts), so two
sidecars hold one source's or one app's output tokens per window at its
limit, and cache reads stay out of an Anthropic source's itpm as on the
memory backend (test_itpm.py).

  the fleet's otpm:                    test_redis_itpm__fleet_output_tokens_hold_at_otpm
  an app's otpm across the fleet:      test_redis_itpm__an_apps_otpm_holds_across_sidecars
  cache reads and itpm on Redis:       test_redis_itpm__cache_reads_do_not_count_for_anthropic

Every wait and loop is bounded; timing bounds as in test_redis_fleet.py.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import call  # noqa: E402
from redis_fixture import (Pending, chat, fleet_config, source, unique_prefix,  # noqa: E402
                           wait_backend, wait_until)
from test_itpm import body as anthropic_body, cache_sources  # noqa: E402
from test_redis_fleet import EARLY, NO_PROXY, redis_srv, shared_sum  # noqa: E402,F401


def start_fleet(make_sidecar, n, cfg, env=None):
    """test_redis_fleet.start_fleet with environment variables (API keys)."""
    fleet = [make_sidecar(config_text=cfg, subdir="sc%d" % i, env=dict(NO_PROXY, **(env or {})))
             for i in range(n)]
    for sc in fleet:
        wait_backend(sc)
    return fleet


def run_and_sample(up, calls, t0, timeout):
    """Samples the mock's request counter until every call is answered:
    [(t - t0, requests)]; then checks every call succeeded."""
    samples = []
    deadline = t0 + timeout
    while time.monotonic() < deadline and not all(k.answered() for k in calls):
        n = up.stats()["requests"]   # then the time: a late sample, never an early one
        samples.append((time.monotonic() - t0, n))
        time.sleep(0.01)
    for k in calls:
        err, res = k.wait(1)
        assert err is None, err
    return samples


OUT = 10   # every call: max_tokens 10 reserved, 10 output tokens reported


def out_body(i):
    return chat("o%d" % i, max_tokens=OUT,
                mock={"usage": {"prompt_tokens": 5, "completion_tokens": OUT}})


def check_rate(samples, limit, rate, what):
    """At every sample, output tokens at the mock (requests x OUT) <= the
    bucket plus its refill since t0 (taken before the first call)."""
    over = [(round(t, 3), n) for t, n in samples if n * OUT > limit + rate * (t + EARLY)]
    assert not over, "%s exceeded %d output tokens + %d/s: (t, requests) %r" % (
        what, limit, rate, over)
    first = next((t for t, n in samples if n * OUT >= limit), None)
    assert first is not None and first < 0.5, "the full bucket was not spent at once: %r" % (
        samples[:20],)


def test_redis_itpm__fleet_output_tokens_hold_at_otpm(redis_srv, up, make_sidecar):
    """Source `a` has otpm 30 per window_s 1 (a bucket of 30 output tokens
    refilled at 30/s), no other limit. 12 calls of max_tokens 10 at once,
    6 through each of two sidecars: the fleet admits 3 at once and then 3
    per second (two local buckets would admit 6 at once), so the output
    tokens reaching the mock never exceed 30 + 30/s x t, and the last call
    is admitted no earlier than (120 - 30) / 30 = 3 s."""
    limit, win, total = 30, 1.0, 12
    rate = limit / win
    cfg = fleet_config(redis_srv.url(), unique_prefix(),
                       [source("a", "chat", up.url, limits={"otpm": limit, "window_s": win})],
                       stall_window_s=10)
    fleet = start_fleet(make_sidecar, 2, cfg)
    t0 = time.monotonic()
    calls = [Pending(fleet[i % 2], "chat", out_body(i), timeout=20) for i in range(total)]
    samples = run_and_sample(up, calls, t0, 15)
    assert up.stats()["requests"] == total
    check_rate(samples, limit, rate, "the fleet's otpm")
    last = max(k.t_end for k in calls) - t0
    need = (total * OUT - limit) / rate
    print("timing: fleet otpm: last of %d calls after %.3fs (>= %.3f)" % (total, last, need))
    assert need - EARLY <= last <= need + 2.0, last
    assert shared_sum(fleet, "refused", "otpm") > 0
    assert shared_sum(fleet, "refused", "itpm") == 0
    assert shared_sum(fleet, "admitted") == total
    # the bucket is in Redis under the source's hash tag, not in the sidecars
    c = redis_srv.client()
    try:
        keys = c.call("KEYS", "*")
    finally:
        c.close()
    assert [k for k in keys if k.endswith("source:a}:io")], keys


def test_redis_itpm__an_apps_otpm_holds_across_sidecars(redis_srv, up, make_sidecar):
    """The default app has otpm 30 per window_s 1 over two unlimited
    sources, one per sidecar: the app's bucket is one for the fleet."""
    limit, win, total = 30, 1.0, 12
    rate = limit / win
    cfg = fleet_config(redis_srv.url(), unique_prefix(),
                       [source("a", "chat", up.url, model="m-a"),
                        source("b", "chat", up.url, model="m-b")],
                       stall_window_s=10)
    cfg += "apps:\n  - name: default\n    limits: {otpm: %d, window_s: %s}\n" % (limit, win)
    fleet = start_fleet(make_sidecar, 2, cfg)
    t0 = time.monotonic()
    calls = []
    for i in range(total):
        body = out_body(i)
        body["model"] = "m-a" if i % 2 else "m-b"
        calls.append(Pending(fleet[i % 2], "chat", body, timeout=20))
    samples = run_and_sample(up, calls, t0, 15)
    check_rate(samples, limit, rate, "the app's otpm")
    assert {k.res["source"] for k in calls} == {"a", "b"}
    assert shared_sum(fleet, "refused", "app") > 0
    assert shared_sum(fleet, "refused", "otpm") == 0


def test_redis_itpm__cache_reads_do_not_count_for_anthropic(redis_srv, up, make_sidecar):
    """test_itpm.py's cache-heavy agent on the Redis backend, its calls
    alternating between two sidecars: each answer reports 50 fresh input
    tokens and 5000 read from the cache. Ten calls pass an itpm of 2000 of
    a kind anthropic source (cache reads left out); a tpm of 2000, or an
    itpm that counts cache reads, puts the fleet's bucket in debt after the
    first, and the second call fails `stalled` on either sidecar."""
    prefix = unique_prefix()
    cfg = fleet_config(redis_srv.url(), prefix, cache_sources(up), max_attempts=1,
                       stall_window_s=0.5)
    fleet = start_fleet(make_sidecar, 2, cfg, env={"PGW_T_KEY": "sk-test"})
    conns = [sc.connect() for sc in fleet]
    rc = redis_srv.client()
    results = {}
    for model, name in (("m-itpm", "fresh"), ("m-tpm", "total"), ("m-counted", "counted")):
        codes = []
        for i in range(10):
            err, res, _ = call(conns[i % 2], "chat", anthropic_body(model), timeout=10)
            codes.append(err["code"] if err else "ok")
            if err:
                break
            # A release is never awaited by its call: the answer may reach
            # the client before it reaches Redis, and the next call (on the
            # other sidecar) could be admitted before the debt is recorded.
            # Await it: release.lua drops the lease and reconciles at once.
            leases = "{%s:source:%s}:leases" % (prefix, name)
            assert wait_until(lambda: rc.call("ZCARD", leases) == 0, 5), "never released"
        results[model] = codes
    for c in conns:
        c.close()
    assert results["m-itpm"] == ["ok"] * 10, results
    assert results["m-tpm"] == ["ok", "stalled"], results
    assert results["m-counted"] == ["ok", "stalled"], results
    assert shared_sum(fleet, "refused", "itpm") > 0     # the counted source's
    # the fresh source's buckets: 2000 - 10 x 50 input, 500 - 10 x 10
    # output (refilled since: a few seconds at most)
    lin, lout = (float(x) for x in rc.call("HMGET", "{%s:source:fresh}:io" % prefix, "in", "out"))
    # the counted one's: in debt by 5050 - 2000 (one call)
    counted = float(rc.call("HGET", "{%s:source:counted}:io" % prefix, "in"))
    rc.close()
    assert 1500 - 1 <= lin <= 1700 and 400 - 1 <= lout <= 450, (lin, lout)
    assert -3050 - 1 <= counted <= -2900, counted

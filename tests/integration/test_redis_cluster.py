"""The Redis backend on a Redis Cluster end to end: real polygw binaries given
only the cluster's node addresses (`backend.cluster`, docs/CONFIG.md,
"backend"), one real cluster of 3 primaries with a replica each (started
once for the module by tests/redis/redis_cluster.py, a unique key prefix
per test), the real mock upstream.

  the fleet's rpm on a cluster:             test_cluster__rpm_limit_holds_across_sidecars
  the fleet's max_concurrency:              test_cluster__max_concurrency_holds_across_sidecars
  an app's limits (a tagged prefix):        test_cluster__app_limits_hold_across_sidecars
  ... and without one, a start-up error:    test_cluster__app_limits_without_a_hash_tag_stop_the_start
  budgets of three slots, one at a time:    test_cluster__budgets_in_several_slots_are_reserved_in_turn
  task.stop crosses sidecars:               test_cluster__task_stop_on_one_sidecar_ends_a_call_on_another
  a slot moved under load (ASK, MOVED):     test_cluster__slot_migrated_under_load_admits_nothing_twice
  a primary killed, its replica promoted:   test_cluster__primary_killed_the_fleet_follows_the_promotion
  the whole cluster hung (SIGSTOP):         test_cluster__frozen_cluster_fails_closed_and_readyz_says_why
  a password from the environment:          test_cluster__password_from_the_environment
  cluster vs plain server, either way:      test_cluster__cluster_key_at_a_plain_server_is_an_error,
                                            test_cluster__url_at_a_cluster_node_is_an_error

Tests that change the cluster put it back (the killed primary restarted as
a replica, the frozen nodes thawed), so the next test finds cluster_state:ok.
Only 127.0.0.1 is used; every wait and loop is bounded.
"""
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import POLYGW, sanitizer_env  # noqa: E402
from redis_cluster_fixture import (SlotMigration, cluster_config, key_slot,  # noqa: E402
                                   start_cluster)
from redis_fixture import (FleetRedis, Pending, assert_failover_excess, chat,  # noqa: E402
                           fleet_config, free_port, source, stats, unique_prefix, wait_backend,
                           wait_until)
from test_redis_fleet import Load, assert_at, call, shared_sum  # noqa: E402
from test_redis_fleet_apps import apps_yaml, shared_refused  # noqa: E402

EARLY = 0.02
NO_PROXY = {"no_proxy": "*", "NO_PROXY": "*"}
CT = 0.5   # backend.command_timeout_s where a test makes the cluster fail


@pytest.fixture(scope="module")
def cluster():
    c = start_cluster()
    yield c
    c.cleanup()


@pytest.fixture
def rc(cluster):
    """The module's cluster, healthy at the start of each test."""
    cluster.wait_ok()
    return cluster


def start_fleet(make_sidecar, n, cfg):
    """n sidecars on one config (or one config each: a list); returns them
    once each one's backend is up."""
    cfgs = cfg if isinstance(cfg, list) else [cfg] * n
    fleet = [make_sidecar(config_text=c, subdir="sc%d" % i, env=NO_PROXY)
             for i, c in enumerate(cfgs)]
    for sc in fleet:
        wait_backend(sc, timeout=8)
    return fleet


def source_key(prefix, name, part):
    return "{%s:source:%s}:%s" % (prefix, name, part)


def high_water(up, until, calls=None, interval=0.005):
    """The most requests in progress at the mock, sampled until `until` or
    until every call of `calls` is answered."""
    high = 0
    while time.monotonic() < until and not (calls and all(k.answered() for k in calls)):
        high = max(high, up.stats()["in_progress"])
        time.sleep(interval)
    return high


# ------------------------------------------------------------------- limits
def test_cluster__rpm_limit_holds_across_sidecars(rc, up, make_sidecar):
    """test_redis_fleet's rpm case on the cluster: rpm 6 per window_s 1
    shared by three sidecars; 18 calls at once, 6 through each. At every
    sample t the mock has seen at most 6 + 6/s x t requests; all 18
    succeed; the bucket lives on the primary that owns its slot."""
    n_rpm, win, total = 6, 1.0, 18
    rate = n_rpm / win
    prefix = unique_prefix()
    cfg = cluster_config(rc, prefix, [source("a", "chat", up.url,
                                             limits={"rpm": n_rpm, "window_s": win})],
                         stall_window_s=10)
    fleet = start_fleet(make_sidecar, 3, cfg)

    t0 = time.monotonic()
    calls = [Pending(fleet[i % 3], "chat", chat("r%d" % i), timeout=15) for i in range(total)]
    samples = []
    while time.monotonic() < t0 + 10 and not all(k.answered() for k in calls):
        samples.append((time.monotonic(), up.stats()["requests"]))
        time.sleep(0.01)
    for k in calls:
        err, res = k.wait(1)
        assert err is None, err
        assert res["attempts"] == 1, res
    assert up.stats()["requests"] == total
    over = [(round(t - t0, 3), n) for t, n in samples if n > n_rpm + rate * (t - t0 + EARLY)]
    assert not over, "the fleet exceeded rpm %d per %.1fs: (t, requests) %r" % (n_rpm, win, over)
    ends = sorted(k.t_end - t0 for k in calls)
    assert_at("cluster rpm: last of %d calls" % total, ends[-1], (total - n_rpm) / rate, late=1.0)
    assert shared_sum(fleet, "refused", "rpm") > 0
    assert shared_sum(fleet, "admitted") == total
    key = source_key(prefix, "a", "rpm")
    assert rc.call_key(key, "EXISTS", key) == 1, "the rpm bucket is not on its slot's primary"


def test_cluster__max_concurrency_holds_across_sidecars(rc, up, make_sidecar):
    """max_concurrency 2 on the cluster: 6 calls of 0.5 s at once, 2 through
    each of three sidecars; never more than 2 in progress at the mock,
    three waves, all complete and no lease is left."""
    delay = 0.5
    cfg = cluster_config(rc, unique_prefix(), [source("a", "chat", up.url, max_concurrency=2)],
                         stall_window_s=10)
    fleet = start_fleet(make_sidecar, 3, cfg)
    up.set_default({"delay_ms": int(delay * 1000)})
    t0 = time.monotonic()
    calls = [Pending(fleet[i % 3], "chat", chat("c%d" % i), timeout=15) for i in range(6)]
    high = high_water(up, t0 + 8, calls)
    for k in calls:
        err, _ = k.wait(1)
        assert err is None, err
    assert up.stats()["requests"] == 6
    assert high == 2, "max_concurrency 2 across the fleet, %d in flight at once" % high
    assert_at("cluster concurrency 2: 6 calls of 0.5 s (3 waves)",
              max(k.t_end for k in calls) - t0, 3 * delay, late=1.0)
    assert shared_sum(fleet, "refused", "concurrency") > 0
    assert shared_sum(fleet, "leases_live") == 0


def test_cluster__app_limits_hold_across_sidecars(rc, up, make_sidecar):
    """An admission of an app with limits takes the source's keys and the
    app's, which a cluster runs in one script only when they share a slot:
    with a prefix that carries a hash tag (every key of the fleet in one
    slot, on one primary), app `web` with max_concurrency 2 (the source
    allows 10) never has more than 2 calls in progress across three
    sidecars, while `batch` starts next to it at once."""
    delay = 0.5
    prefix = "{%s}" % unique_prefix()
    cfg = cluster_config(rc, prefix, [source("a", "chat", up.url, max_concurrency=10)],
                         stall_window_s=10) + \
        apps_yaml("{name: web, max_concurrency: 2}", "{name: batch}")
    fleet = start_fleet(make_sidecar, 3, cfg)
    up.set_default({"delay_ms": int(delay * 1000)})
    t0 = time.monotonic()
    web = [Pending(fleet[i % 3], "chat", chat("w%d" % i), app="web", timeout=15)
           for i in range(6)]
    high = high_water(up, t0 + 0.9)
    assert high == 2, "web's max_concurrency 2 across the fleet, %d in flight at once" % high
    batch = [Pending(fleet[i], "chat", chat("b%d" % i), app="batch", timeout=15)
             for i in range(3)]
    assert wait_until(lambda: up.stats()["in_progress"] >= 5, 0.4, 0.005), up.stats()
    for k in web + batch:
        err, _ = k.wait(8)
        assert err is None, err
    assert max(k.t_end for k in web) - t0 >= 3 * delay - EARLY
    assert shared_refused(fleet, "app") > 0
    assert shared_sum(fleet, "leases_live") == 0
    assert all(stats(sc)["backend"].get("cross_slot", 0) == 0 for sc in fleet)


def test_cluster__app_limits_without_a_hash_tag_stop_the_start(rc, up, make_sidecar):
    """The same app limits under a prefix without a hash tag would need
    one script over two slots: the sidecar refuses to start, naming the
    app and asking for a prefix with a hash tag."""
    cfg = cluster_config(rc, unique_prefix(), [source("a", "chat", up.url)]) + \
        apps_yaml("{name: web, max_concurrency: 2}")
    sc = make_sidecar(config_text=cfg, start=False, env=NO_PROXY)
    sc.start(wait=False)
    assert wait_until(lambda: sc.proc.poll() is not None, 10, 0.05), \
        "started with app limits under an untagged prefix:\n" + sc.logs()[-2000:]
    sc.expected_rc = sc.proc.returncode
    out = sc.logs()
    assert sc.proc.returncode != 0, out
    assert "web" in out and "prefix" in out and "{" in out, out[-2000:]
    assert up.stats()["requests"] == 0


# ------------------------------------------------------------------- tasks
def test_cluster__budgets_in_several_slots_are_reserved_in_turn(rc, up, make_sidecar):
    """An app's, a source's and a task run's budgets under a prefix with no
    hash tag: three keys in three slots, which one budget.lua call cannot
    take. The sidecar reserves them one slot after the other: calls are
    charged to all three; a call the task's budget (the last key) refuses,
    and one the source's (the second) refuses, end budget_exhausted naming
    it, with what the earlier keys had reserved given back; no call is ever
    refused CROSSSLOT."""
    prefix = unique_prefix()
    name = next(n for n in ("s", "s1", "s2", "s3", "s4", "s5")
                if len({key_slot("{%s:app:default}:budget" % prefix),
                        key_slot("{%s:source:%s}:budget" % (prefix, n)),
                        key_slot("{%s:task:t1}:budget:1" % prefix)}) == 3)
    keys = {"app": "{%s:app:default}:budget" % prefix,
            "source": "{%s:source:%s}:budget" % (prefix, name),
            "task": "{%s:task:t1}:budget:1" % prefix}
    cfg = cluster_config(rc, prefix, [source(name, "chat", up.url,
                                             prices={"input": 0, "output": 1000},
                                             budget={"total": 2.5})],
                         extra="apps:\n  - {name: default, budget: {total: 10}}\n")
    a, b = start_fleet(make_sidecar, 2, cfg)

    def spent(which):
        h = rc.call_key(keys[which], "HGETALL", keys[which])
        h = {k.decode() if isinstance(k, bytes) else k: float(v) for k, v in zip(h[::2], h[1::2])}
        return h.get("spent_t", 0), h.get("reserved", 0)

    def settled(want):
        wait_until(lambda: {w: spent(w) for w in want} == want, 5)
        return {w: spent(w) for w in want}

    def cost_call(sc, max_tokens, task=None):
        params = {"task_id": task} if task else {}
        return call(sc, chat(max_tokens=max_tokens, mock={"usage": {"completion_tokens": 250}}),
                    **params)

    ca = a.connect()
    err, _ = ca.request("task.start", {"task_id": "t1", "budget": 1.5})
    assert err is None, err
    err, res, _ = cost_call(a, 1000, task="t1")
    assert err is None and res["cost"] == 0.25, (err, res)
    err, res, _ = cost_call(b, 1000)
    assert err is None and res["cost"] == 0.25, (err, res)
    want = {"app": (0.5, 0), "source": (0.5, 0), "task": (0.25, 0)}
    assert settled(want) == want
    # The task has 1.25 left: a worst case of 1.3 is refused by its key, the
    # third, after the app's and the source's took theirs: both given back.
    err, res, _ = cost_call(b, 1300, task="t1")
    assert err and err["code"] == "budget_exhausted" and err["budget"] == "task:t1:total", err
    assert settled(want) == want
    # The source has 2.0 left: 2.1 is refused by its key, the second.
    err, res, _ = cost_call(a, 2100)
    assert err and err["code"] == "budget_exhausted" and \
        err["budget"] == "source:%s:total" % name and err["left"] == 2.0, err
    assert settled(want) == want
    assert up.stats()["requests"] == 2
    for sc in (a, b):
        assert stats(sc)["backend"].get("cross_slot", 0) == 0, stats(sc)["backend"]
        # and each shows the fleet's budgets, read one slot at a time
        assert wait_until(lambda: (lambda st: {x["name"]: x for x in st["apps"]}["default"]
                                   .get("budget", {}).get("total", {}).get("spent") == 0.5)(
                                       stats(sc)), 5), stats(sc)["apps"]
    ca.close()


def test_cluster__task_stop_on_one_sidecar_ends_a_call_on_another(rc, up, make_sidecar):
    """A task started on sidecar B, its call hanging at the mock; task.stop
    sent to A (the task's key on one primary, the stop published there)
    ends B's call within 0.2 s with task_stopped and A's reason; task.guard
    answers task_stopped on both afterwards."""
    tid = "cluster-job-1"
    cfg = cluster_config(rc, unique_prefix(), [source("a", "chat", up.url, ttft_timeout_s=8)],
                         stall_window_s=10)
    a, b = start_fleet(make_sidecar, 2, cfg)
    ca, cb = a.connect(), b.connect()
    err, t = cb.request("task.start", {"task_id": tid})
    assert err is None and t["state"] == "running", (err, t)
    hung = Pending(b, "chat", chat(mock={"hang": "before_headers"}), task_id=tid, timeout=10)
    assert wait_until(lambda: up.stats()["in_progress"] == 1, 3), up.stats()
    t0 = time.monotonic()
    err, t = ca.request("task.stop", {"task_id": tid, "reason": "stopped from A"})
    assert err is None and t["reason_kind"] == "stopped", (err, t)
    err, res = hung.wait(3)
    dt = hung.t_end - t0
    print("timing: cluster task.stop on A -> call on B ended after %.1f ms" % (dt * 1000))
    assert res is None and err["code"] == "task_stopped", err
    assert "stopped from A" in err["message"], err
    assert dt < 0.2, "B's call ended %.3fs after task.stop on A" % dt
    for name, c in (("A", ca), ("B", cb)):
        err, res = c.request("task.guard", {"task_id": tid})
        assert res is None and err["code"] == "task_stopped", (name, err)
    ca.close()
    cb.close()


# ------------------------------------------------------------ slot migration
@pytest.mark.timing  # six callers with no pause while the slot moves
def test_cluster__slot_migrated_under_load_admits_nothing_twice(rc, up, make_sidecar):
    """Six callers (2 per sidecar) keep source `a` (max_concurrency 3,
    replies delayed 0.1 s) saturated while its slot moves to another
    primary: IMPORTING / MIGRATING, its keys MIGRATEd, 0.5 s of load in
    that state, then SETSLOT NODE everywhere, then 0.5 s more.

    While the slot is half moved, the old primary answers admit.lua with
    ASK, and the new one, after ASKING, with TRYAGAIN: Redis runs a script
    of several keys in an importing slot only when every key is there, and
    a source's buckets and breaker do not exist until they are needed. So
    the source fails closed meanwhile; after SETSLOT NODE the old primary
    answers MOVED and the sidecars follow it.

    - At no sample are more than 3 requests in progress at the mock: the
      leases moved with the slot and none was counted twice or lost.
    - Nothing but successes and backend_unavailable; every sidecar
      counted both redirections (stats.backend `ask`, `moved`) and serves
      calls again after MOVED, without a restart, within lease_ttl_s (3 s,
      the leases of releases refused meanwhile) + 3 s.
    - The source's keys are on the new primary only."""
    prefix = unique_prefix()
    cfg = cluster_config(rc, prefix, [source("a", "chat", up.url, max_concurrency=3)],
                         backend={"command_timeout_s": 1, "lease_ttl_s": 3}, stall_window_s=10)
    fleet = start_fleet(make_sidecar, 3, cfg)
    up.set_default({"delay_ms": 100})
    leases = source_key(prefix, "a", "leases")
    slot = key_slot(leases)
    src = rc.owner(slot)
    dst = next(p for p in rc.primaries() if p is not src)

    high = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            high[0] = max(high[0], up.stats()["in_progress"])
            time.sleep(0.003)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    load = Load(fleet, per_sidecar=2, pause=0.0, timeout=8.0)
    m = SlotMigration(rc, slot, src, dst)
    try:
        assert wait_until(lambda: sum(1 for r in load.snapshot() if r[3] is None) >= 12, 5), \
            load.snapshot()[-10:]
        m.begin()
        t_ask = time.monotonic()
        m.move()
        time.sleep(0.5)
        t_moved = time.monotonic()
        m.finish()
        t_done = time.monotonic()

        def served_again():
            recs = load.snapshot()
            return all(any(r[0] == i and r[1] >= t_done and r[3] is None for r in recs)
                       for i in range(3))
        # Releases refused while the slot was half moved leave their leases
        # until lease_ttl_s (3 s): the permits come back then at the latest.
        back = wait_until(served_again, 3 + 3, 0.02)
        t_back = time.monotonic()
        time.sleep(0.3)
    finally:
        load.stop()
        stop.set()
        sampler.join(2)
    recs = load.snapshot()
    bad = [r for r in recs if r[3] not in (None, "backend_unavailable")]
    assert not bad, "unexpected outcomes: %r" % bad[:10]
    assert back, "not every sidecar served a call within 6 s of MOVED: %r" % [
        stats(sc)["backend"] for sc in fleet]
    print("cluster migration: every sidecar served again %.3fs after SETSLOT NODE"
          % (t_back - t_done))
    failed = sum(1 for r in recs if r[3] == "backend_unavailable")
    asked = sum(1 for r in recs if r[1] >= t_ask and r[2] <= t_moved and r[3] is None)
    print("cluster migration: slot %d %d -> %d, %d keys moved; %d calls, %d backend_unavailable, "
          "%d served while the slot was half moved; high-water %d in progress"
          % (slot, src.port, dst.port, m.moved, len(recs), failed, asked, high[0]))
    assert high[0] <= 3, "max_concurrency 3 exceeded while the slot moved: %d" % high[0]
    redirects = [(stats(sc)["backend"].get("ask"), stats(sc)["backend"].get("moved"))
                 for sc in fleet]
    print("cluster migration: (ask, moved) redirections followed per sidecar: %r" % redirects)
    assert all(ask and moved for ask, moved in redirects), \
        "every sidecar met ASK and then MOVED: %r" % redirects
    assert m.moved >= 1, "no lease was in flight when the slot moved"
    assert rc.owner(slot) is dst
    assert src.call("CLUSTER", "COUNTKEYSINSLOT", slot) == 0, "keys left on the old primary"
    assert shared_sum(fleet, "leases_live") == 0


# ----------------------------------------------------------------- failover
@pytest.mark.timing  # the time from the promotion to service is bounded
def test_cluster__primary_killed_the_fleet_follows_the_promotion(rc, up, make_sidecar):
    """Three sidecars under a steady load above the fleet's rpm (20 per
    10 s). The primary that owns the source's slot is SIGKILLed once the
    load has drained the bucket; the cluster promotes its replica
    (cluster-node-timeout 1 s).

    - Calls end with success or backend_unavailable, none hangs, none is
      slower than command_timeout_s + slack.
    - Every sidecar serves calls again after the promotion without a
      restart, within 2 x command_timeout_s + 2 s of it: the sidecars ask
      the cluster for its slots again while a primary is unreachable, not
      only at their periodic refresh.
    - Admitted attempts never exceed capacity + rate x elapsed + one
      capacity (what asynchronous replication may lose, as with Sentinel).
    The dead node is started again afterwards: it rejoins as a replica."""
    cap, win = 20, 10.0
    prefix = unique_prefix()
    cfg = cluster_config(rc, prefix, [source("a", "chat", up.url,
                                             limits={"rpm": cap, "window_s": win})],
                         backend={"command_timeout_s": CT, "lease_ttl_s": 3}, stall_window_s=8)
    fleet = start_fleet(make_sidecar, 3, cfg)
    victim = rc.owner_of_key(source_key(prefix, "a", "rpm"))
    samples, stop_sampling = [], threading.Event()

    def sample():
        while not stop_sampling.is_set():
            samples.append((time.monotonic(), up.stats()["requests"]))
            time.sleep(0.02)
    t0 = time.monotonic()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    load = Load(fleet, timeout=8.0)
    try:
        assert wait_until(lambda: up.stats()["requests"] >= cap, 3, 0.01), \
            "the load did not drain the bucket within 3 s"
        t_kill = time.monotonic()
        promoted, to_promotion, _ = rc.kill_primary(victim)
        t_promoted = t_kill + to_promotion

        def served_again():
            recs = load.snapshot()
            return all(any(r[0] == i and r[1] >= t_promoted and r[3] is None for r in recs)
                       for i in range(3))
        # rpm 20/10 s: 2 admissions a second for the fleet after the drain
        assert wait_until(served_again, 10, 0.02), \
            "not every sidecar served a call within 10 s of the promotion:\n%s" % (
                fleet[0].logs()[-3000:])
        time.sleep(1.0)
    finally:
        load.stop()
        stop_sampling.set()
        sampler.join(2)
        if not victim.alive():
            rc.restart(victim)   # the module's next test wants 3 primaries with replicas
    recs = load.snapshot()
    bad = [r for r in recs if r[3] not in (None, "backend_unavailable")]
    assert not bad, "unexpected outcomes: %r" % bad[:10]
    slow = [r for r in recs if r[3] == "backend_unavailable" and r[2] - r[1] > CT + 0.5]
    assert not slow, "backend_unavailable slower than command_timeout_s: %r" % slow[:5]
    first_ok = [min(r[2] for r in recs if r[0] == i and r[1] >= t_promoted and r[3] is None)
                for i in range(3)]
    print("cluster failover: replica %d promoted %.3fs after the kill; sidecars served again "
          "%.3fs after the promotion (%s); %d calls failed closed"
          % (promoted.port, to_promotion, max(first_ok) - t_promoted,
             ["%.3f" % (x - t_promoted) for x in first_ok],
             sum(1 for r in recs if r[3] == "backend_unavailable")))
    after_promotion = max(first_ok) - t_promoted
    assert after_promotion <= 2 * CT + 2, \
        "the fleet served again %.3fs after the promotion (bound %.1fs)" % (after_promotion,
                                                                           2 * CT + 2)
    assert_failover_excess("cluster failover", samples, t0, t_kill, cap, win)
    for sc in fleet:
        wait_backend(sc, timeout=5)
        assert sc.proc.poll() is None


# ------------------------------------------------------------------ partition
def readyz(port):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/readyz" % port, timeout=5) as r:
            return r.status, json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode())


@pytest.mark.timing  # backend_unavailable at command_timeout_s, +0.5 s
def test_cluster__frozen_cluster_fails_closed_and_readyz_says_why(rc, up, make_sidecar):
    """Every node SIGSTOPped (connections open, nothing answered: a
    partition as the sidecars see it). Each of three sidecars answers calls
    with backend_unavailable at command_timeout_s (0.5 s) — never admitted
    blind, never hung — and its HTTP front's /readyz says 503 not_ready
    with the reason (stats.backend.down_reason). SIGCONT: each serves again within a few seconds and
    /readyz is 200."""
    prefix = unique_prefix()
    ports = [free_port() for _ in range(3)]
    cfgs = [cluster_config(rc, prefix, [source("a", "chat", up.url)],
                           backend={"command_timeout_s": CT, "lease_ttl_s": 3},
                           http_port=p, stall_window_s=5) for p in ports]
    fleet = start_fleet(make_sidecar, 3, cfgs)
    for sc, p in zip(fleet, ports):
        assert wait_until(lambda: readyz(p)[0] == 200, 3), readyz(p)
    before = up.stats()["requests"]
    rc.freeze()
    try:
        first = [Pending(sc, "chat", chat(), timeout=5) for sc in fleet]
        for k in first:
            err, res = k.wait(CT + 3)
            assert res is None and err["code"] == "backend_unavailable", err
            assert_at("frozen cluster: admission -> backend_unavailable", k.elapsed, CT,
                      late=0.5)
            k.close()
        for sc, p in zip(fleet, ports):
            got = wait_until(lambda: readyz(p)[0] == 503 and readyz(p), 3 * CT + 2, 0.05)
            assert got, "/readyz still %r with the cluster frozen" % (readyz(p),)
            st, body = got
            assert body["status"] == "not_ready" and body["reason"] == "redis unreachable" \
                and body.get("detail"), body
            assert sc.proc.poll() is None
        assert up.stats()["requests"] == before, "admitted with the cluster frozen"
    finally:
        t_thaw = time.monotonic()
        rc.thaw()
    for sc, p in zip(fleet, ports):
        assert wait_until(lambda: call(sc, chat())[0] is None, 10, 0.1), \
            "no recovery after SIGCONT:\n" + sc.logs()[-3000:]
        assert wait_until(lambda: readyz(p)[0] == 200, 5), readyz(p)
    print("timing: cluster thawed: fleet served again after %.3fs" % (time.monotonic() - t_thaw))


# ----------------------------------------------------------------- password
def test_cluster__password_from_the_environment(up, make_sidecar):
    """A cluster whose every node wants a password (requirepass; a cluster
    of its own, not the module's): backend.password_env gives it to every
    node, calls are served. A wrong password: the backend stays down with
    Redis' reason (WRONGPASS), calls fail closed, and neither password is
    in stats or the log."""
    pw = "pgw-Cluster-Pw-81d3"
    cl = start_cluster(password=pw)
    try:
        base = {"password_env": "PGW_REDIS_PW", "command_timeout_s": CT, "lease_ttl_s": 3}
        cfg = cluster_config(cl, unique_prefix(), [source("a", "chat", up.url)], backend=base)
        sc = make_sidecar(config_text=cfg, subdir="ok", env=dict(NO_PROXY, PGW_REDIS_PW=pw))
        wait_backend(sc, timeout=8)
        err, _, _ = call(sc, chat())
        assert err is None, err
        assert pw not in repr(stats(sc)) and pw not in sc.logs()

        wrong = "not-the-" + pw
        bad = make_sidecar(config_text=cfg, subdir="bad", start=False,
                           env=dict(NO_PROXY, PGW_REDIS_PW=wrong))
        bad.start(wait=False)
        if wait_until(lambda: bad.proc.poll() is not None, 3, 0.05):
            bad.expected_rc = bad.proc.returncode   # refused at start-up: with the reason
            assert bad.proc.returncode != 0 and "WRONGPASS" in bad.logs(), bad.logs()[-2000:]
        else:
            bad.wait_ready()
            b = wait_until(lambda: "WRONGPASS" in json.dumps(stats(bad)["backend"]) and
                           stats(bad)["backend"], 5, 0.05)
            assert b and b["state"] != "up", stats(bad)["backend"]
            err, res, _ = call(bad, chat())
            assert res is None and err["code"] == "backend_unavailable", err
            assert wrong not in repr(stats(bad))
        assert wrong not in bad.logs() and pw not in bad.logs()
        assert up.stats()["requests"] == 1
        sc.stop()
        bad.stop()
    finally:
        cl.cleanup()


# --------------------------------------------------------------- mismatches
def _start_refused(make_sidecar, cfg, what):
    """A sidecar that must not serve on `cfg`: either it exits at start-up
    with an error naming the cluster, or it runs with its backend not up,
    the reason (naming the cluster) in stats, and calls failing closed."""
    sc = make_sidecar(config_text=cfg, start=False, env=NO_PROXY)
    sc.start(wait=False)
    exited = wait_until(lambda: sc.proc.poll() is not None, 5, 0.05)
    if exited:
        sc.expected_rc = sc.proc.returncode
        assert sc.proc.returncode != 0, sc.logs()
        assert "cluster" in sc.logs().lower(), "%s: no reason naming the cluster:\n%s" % (
            what, sc.logs()[-2000:])
        return
    sc.wait_ready()
    b = stats(sc)["backend"]
    assert b["state"] != "up", (what, b)
    assert "cluster" in json.dumps(b).lower(), "%s: no reason naming the cluster: %r" % (what, b)
    c = sc.connect()
    msg = c.wait_response(c.request_async("call", {"capability": "chat", "body": chat()}), 5)
    c.close()
    assert msg[2] and msg[2]["code"] == "backend_unavailable", (what, msg)


def test_cluster__cluster_key_at_a_plain_server_is_an_error(up, make_sidecar):
    """`cluster:` naming a plain redis-server (cluster support disabled)
    is refused with a reason that says so; nothing reaches the upstream."""
    srv = FleetRedis().start()
    try:
        cfg = fleet_config(None, unique_prefix(), [source("a", "chat", up.url)],
                           backend={"cluster": ["127.0.0.1:%d" % srv.port],
                                    "command_timeout_s": CT, "lease_ttl_s": 3})
        _start_refused(make_sidecar, cfg, "cluster: at a plain server")
        assert up.stats()["requests"] == 0
    finally:
        srv.cleanup()


def test_cluster__url_at_a_cluster_node_is_an_error(rc, up, make_sidecar):
    """A plain `url:` naming a cluster node would serve the slots of that
    node and fail on the others: refused, with a reason naming the
    cluster; nothing reaches the upstream."""
    node = rc.primaries()[0]
    cfg = fleet_config("redis://127.0.0.1:%d/0" % node.port, unique_prefix(),
                       [source("a", "chat", up.url)],
                       backend={"command_timeout_s": CT, "lease_ttl_s": 3})
    _start_refused(make_sidecar, cfg, "url: at a cluster node")
    assert up.stats()["requests"] == 0


def test_cluster__check_config_names_the_bad_seed(workdir):
    """A seed address without a port, or an empty list, is a config error
    naming backend.cluster (--check-config)."""
    for bad in ('["127.0.0.1"]', "[]"):
        path = os.path.join(workdir, "bad.yaml")
        with open(path, "w") as f:
            f.write("backend:\n  kind: redis\n  cluster: %s\n  prefix: x\nsources:\n"
                    "  - {name: a, capability: chat, base_url: \"http://127.0.0.1:1\"}\n" % bad)
        r = subprocess.run([POLYGW, "--check-config", path], capture_output=True, text=True,
                           timeout=20, env=sanitizer_env())
        out = r.stdout + r.stderr
        assert r.returncode != 0 and "backend.cluster" in out, (bad, out)

"""The Redis backend behind Sentinel: a real primary, a real replica, three
real redis-sentinels (quorum 2, down-after-milliseconds 1000,
failover-timeout 3000) and three real sidecars given only the sentinels'
addresses and the master name (docs/CONFIG.md, "backend").

What a failover costs and what it may lose is in README.md, "Known
limits"; these tests check those bounds. Only 127.0.0.1 is used; every
wait and loop is bounded (the failover test takes about 15 s).
"""
import os
import re
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import Pending, call as call_on  # noqa: E402
from fleet_topology import SentinelSet  # noqa: E402
from redis_fixture import (assert_failover_excess, chat, fleet_config, free_port,  # noqa: E402
                           source, stats, unique_prefix, wait_backend, wait_until)
from test_metrics import metrics_text  # noqa: E402
from test_redis_fleet import Load  # noqa: E402

NO_PROXY = {"no_proxy": "*", "NO_PROXY": "*"}
DOWN_AFTER_MS, FAILOVER_TIMEOUT_MS = 1000, 3000
CT = 0.5   # backend.command_timeout_s


@pytest.fixture
def sentinels():
    topo = SentinelSet(n=3, quorum=2, down_after_ms=DOWN_AFTER_MS,
                       failover_timeout_ms=FAILOVER_TIMEOUT_MS).start()
    yield topo
    topo.cleanup()


def sentinel_backend(topo, **kw):
    b = {"sentinels": topo.addresses(), "master_name": topo.master, "command_timeout_s": CT,
         "lease_ttl_s": 3}
    b.update(kw)
    return b


def start_fleet(make_sidecar, n, cfg):
    fleet = [make_sidecar(config_text=cfg, subdir="sc%d" % i, env=NO_PROXY) for i in range(n)]
    for sc in fleet:
        wait_backend(sc, timeout=8)
    return fleet


def test_failover__primary_killed_the_fleet_follows_the_promoted_replica(
        sentinels, up, make_sidecar):
    """Three sidecars under a steady load above the fleet's rpm (20 per 10 s
    window: a bucket of 20 refilled at 2/s). The replica's link is cut
    (REPLICAOF an address where nothing listens: it keeps its data and
    applies no more writes) while the load drains the bucket on the
    primary, and the primary is SIGKILLed as soon as it has; so the
    promoted replica never saw those writes: the worst case of
    asynchronous replication, a full bucket again after the failover.

    - Calls sent after the kill and before the sentinels announce the new
      primary end with backend_unavailable (fail closed), none hangs.
    - Every sidecar serves calls again after the promotion without a
      restart, within 2 x command_timeout_s of the announcement; the
      unavailability is reported and stays below down-after-milliseconds
      + failover-timeout + 2 x command_timeout_s.
    - Admitted attempts (the mock's counter, sampled every 20 ms) never
      exceed capacity + rate x elapsed + one capacity: the lost writes
      cost at most one window of the limit. The measured excess is printed.
    - task.stop sent to one sidecar afterwards ends a call in that task on
      another (the pub/sub moved to the new primary too), and task.guard
      on every sidecar answers task_stopped."""
    cap, win = 20, 10.0
    cfg = fleet_config(None, unique_prefix(),
                       [source("a", "chat", up.url, limits={"rpm": cap, "window_s": win},
                               ttft_timeout_s=8)],
                       backend=sentinel_backend(sentinels), stall_window_s=8)
    fleet = start_fleet(make_sidecar, 3, cfg)
    old_port = sentinels.primary.port
    for sc in fleet:
        b = stats(sc)["backend"]
        assert b["address"] == "127.0.0.1:%d" % old_port and b["sentinel_state"] == "up", b

    samples, stop_sampling = [], threading.Event()

    def sample():
        while not stop_sampling.is_set():
            samples.append((time.monotonic(), up.stats()["requests"]))
            time.sleep(0.02)
    assert sentinels.replica.call("REPLICAOF", "127.0.0.1", str(free_port())) == "OK"
    t0 = time.monotonic()   # before the first call: the bucket starts full at its first take
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    load = Load(fleet, timeout=8.0)
    t_promoted = None
    try:
        drained = wait_until(lambda: up.stats()["requests"] >= cap, 3, interval=0.01)
        sentinels.primary.kill()
        t_kill = time.monotonic()
        assert drained, "the load did not drain the bucket within 3 s"
        # t_old: every sentinel still named the old primary then (the start
        # of the last such poll); t_promoted: one named the new one.
        t_old = t_kill
        while time.monotonic() < t_kill + 15:
            t_ask = time.monotonic()
            if any(sentinels.primary_port(s) == sentinels.replica.port
                   for s in sentinels.sentinels):
                t_promoted = time.monotonic()
                break
            t_old = t_ask
            time.sleep(0.02)
        assert t_promoted, "the sentinels did not promote the replica within 15 s"

        def served_again():
            recs = load.snapshot()
            return all(any(r[0] == i and r[1] >= t_promoted and r[3] is None for r in recs)
                       for i in range(3))
        assert wait_until(served_again, 8, interval=0.02), \
            "not every sidecar served a call within 8 s of the promotion:\n%s" % (
                fleet[0].logs()[-3000:])
        time.sleep(1.0)   # steady load on the new primary, limited again
    finally:
        load.stop()
        stop_sampling.set()
        sampler.join(2)
    recs = load.snapshot()

    bad = [r for r in recs if r[3] not in (None, "backend_unavailable")]
    assert not bad, "unexpected outcomes: %r" % bad[:10]
    down = [r for r in recs if r[1] >= t_kill + 0.05 and r[2] <= t_old]
    assert down and all(r[3] == "backend_unavailable" for r in down), \
        "admitted with no primary: %r" % [r for r in down if r[3] is None][:10]
    slow = [r for r in recs
            if r[1] >= t_kill and r[3] == "backend_unavailable" and r[2] - r[1] > CT + 0.5]
    assert not slow, "backend_unavailable slower than command_timeout_s: %r" % slow[:5]
    first_ok = [min(r[2] for r in recs if r[0] == i and r[1] >= t_kill and r[3] is None)
                for i in range(3)]
    unavailable = max(first_ok) - t_kill
    after_promotion = max(first_ok) - t_promoted
    bound = DOWN_AFTER_MS / 1000 + FAILOVER_TIMEOUT_MS / 1000 + 2 * CT
    print("failover: sentinels promoted the replica %.3fs after the kill; sidecars served again "
          "%.3fs after the kill (%.3fs after the promotion); %d calls failed closed meanwhile"
          % (t_promoted - t_kill, unavailable, after_promotion,
             sum(1 for r in recs if r[3] == "backend_unavailable")))
    assert after_promotion <= 2 * CT + 0.5, after_promotion
    assert unavailable <= bound, "unavailable for %.3fs (bound %.1fs)" % (unavailable, bound)

    assert_failover_excess("failover", samples, t0, t_kill, cap, win)

    for sc in fleet:
        b = wait_backend(sc)
        assert b["address"] == "127.0.0.1:%d" % sentinels.replica.port, b
        assert b["primary_changes"] >= 1, b
        m = re.search(r"^polygw_redis_primary_changes_total (\d+)$", metrics_text(sc), re.M)
        assert m and int(m.group(1)) == b["primary_changes"], m

    # task.stop crosses the fleet on the new primary.
    tid = "after-failover"
    ca, cb = fleet[0].connect(), fleet[2].connect()
    err, t = ca.request("task.start", {"task_id": tid})
    assert err is None and t["state"] == "running", err
    hung = Pending(fleet[1], "chat", chat(mock={"hang": "before_headers"}), task_id=tid,
                   timeout=10)
    assert wait_until(lambda: up.stats()["in_progress"] == 1, 5), up.stats()
    t_stop = time.monotonic()
    err, t = cb.request("task.stop", {"task_id": tid, "reason": "after the failover"})
    assert err is None and t["reason_kind"] == "stopped", (err, t)
    err, res = hung.wait(3)
    assert res is None and err["code"] == "task_stopped", err
    print("failover: task.stop on sidecar 2 ended sidecar 1's call after %.1f ms"
          % ((hung.t_end - t_stop) * 1000))
    assert hung.t_end - t_stop < 0.5
    for i, sc in enumerate(fleet):   # every sidecar knows the stop
        c = sc.connect()
        err, res = c.request("task.guard", {"task_id": tid})
        c.close()
        assert res is None and err["code"] == "task_stopped", (i, err)
    ca.close()
    cb.close()


def test_failover__no_sentinel_answers_fails_closed_then_recovers(sentinels, up, make_sidecar):
    """Sentinels that do not know the master name are skipped in turn (the
    reason in stats.backend.last_error); with every sentinel down the
    sidecar fails closed; sentinels back, it finds the primary by itself."""
    cfg = fleet_config(None, unique_prefix(), [source("a", "chat", up.url)],
                       backend=sentinel_backend(sentinels, master_name="nosuchmaster"))
    (sc,) = [make_sidecar(config_text=cfg, subdir="bad", env=NO_PROXY)]
    b = wait_until(lambda: (lambda b: b if "nosuchmaster" in b["last_error"] else None)(
        stats(sc)["backend"]), 5, interval=0.05)
    assert b and b["state"] != "up", stats(sc)["backend"]
    c = sc.connect()
    err, res, _ = call_on(c, "chat", chat(), 5)
    c.close()
    assert res is None and err["code"] == "backend_unavailable", err
    sc.stop()

    cfg = fleet_config(None, unique_prefix(), [source("a", "chat", up.url)],
                       backend=sentinel_backend(sentinels))
    (sc,) = start_fleet(make_sidecar, 1, cfg)
    for s in sentinels.sentinels:
        s.kill()
    sentinels.primary.kill()
    c = sc.connect()
    t_end = time.monotonic() + 5
    while time.monotonic() < t_end:
        err, res, _ = call_on(c, "chat", chat(), 5)
        if err is not None:
            break
        time.sleep(0.05)
    assert err is not None and err["code"] == "backend_unavailable", err
    sentinels.primary.start()
    for s in sentinels.sentinels:
        s.start()
    wait_backend(sc, timeout=10)
    err, res, _ = call_on(c, "chat", chat(), 5)
    assert err is None, err
    c.close()


def test_failover__tls_everywhere_and_sentinel_auth(up, make_sidecar):
    """Primary, replica and sentinels speak TLS only (certificates made by
    openssl for the test) and the sentinels want a password of their own.
    With backend.tls (the CA) and sentinel_password_env the sidecar asks the
    sentinels over TLS, authenticates, reaches the primary over TLS (the
    address the sentinels give, 127.0.0.1, checked against the certificate's
    IP address), and follows a failover. A wrong sentinel password keeps the
    backend down with the sentinel's refusal, never the password."""
    from fleet_topology import Certs
    certs = Certs(names=("localhost", "127.0.0.1"))
    pw = "sentinel-Pa55-TOPSECRET"
    topo = SentinelSet(n=3, quorum=2, down_after_ms=DOWN_AFTER_MS,
                       failover_timeout_ms=FAILOVER_TIMEOUT_MS, certs=certs,
                       sentinel_password=pw)
    try:
        topo.start()
        backend = sentinel_backend(topo, tls={"ca_file": certs.path("ca.crt")},
                                   sentinel_password_env="PGW_SENTINEL_PW")
        cfg = fleet_config(None, unique_prefix(), [source("a", "chat", up.url)], backend=backend)
        sc = make_sidecar(config_text=cfg, subdir="tls", env=dict(NO_PROXY, PGW_SENTINEL_PW=pw))
        b = wait_backend(sc, timeout=8)
        assert b["tls"] is True and b["address"] == "127.0.0.1:%d" % topo.primary.port, b
        c = sc.connect()
        err, res, _ = call_on(c, "chat", chat(), 5)
        assert err is None, err

        topo.primary.kill()
        t_kill = time.monotonic()
        deadline = t_kill + 15
        while time.monotonic() < deadline:
            err, res, _ = call_on(c, "chat", chat(), 5)
            if err is None and stats(sc)["backend"]["address"].endswith(":%d" % topo.replica.port):
                break
            assert err is None or err["code"] == "backend_unavailable", err
            time.sleep(0.05)
        assert err is None, "no service %.1fs after the kill: %r" % (time.monotonic() - t_kill,
                                                                      err)
        print("failover over TLS: served again %.3fs after the kill" % (time.monotonic() - t_kill))
        c.close()

        bad = make_sidecar(config_text=cfg, subdir="badpw",
                           env=dict(NO_PROXY, PGW_SENTINEL_PW="wrong-" + pw))
        b = wait_until(lambda: (lambda b: b if "AUTH refused" in b["last_error"] else None)(
            stats(bad)["backend"]), 5, interval=0.05)
        assert b and b["state"] != "up" and b["sentinel_state"] != "up", stats(bad)["backend"]
        everything = repr(stats(bad)) + bad.logs() + sc.logs()
        assert pw not in everything
    finally:
        topo.cleanup()
        certs.cleanup()


def test_failover__role_checked_and_switch_followed_with_a_scripted_sentinel(up, make_sidecar):
    """A scripted sentinel (fleet_topology.FakeSentinel) in front of two real
    redis-servers, A and its replica B, drives each rule in turn:
    - it names B: the sidecar checks ROLE, refuses the replica ("not a
      primary"), fails closed, and asks again at its backoff pace, not in a
      busy loop;
    - it names A: the sidecar finds it by itself on its next question;
    - a +switch-master for another master name changes nothing;
    - B promoted and +switch-master naming it: the sidecar moves to B at
      once (stats.backend.address, primary_changes) and serves calls there."""
    from fleet_topology import FakeSentinel
    from redis_fixture import FleetRedis
    a = FleetRedis().start()
    b = FleetRedis(extra=["--replicaof", "127.0.0.1", str(a.port)]).start()
    fake = FakeSentinel()
    try:
        fake.primary = ("127.0.0.1", b.port)
        backend = {"sentinels": ["127.0.0.1:%d" % fake.port], "master_name": "mymaster",
                   "command_timeout_s": CT, "lease_ttl_s": 3}
        cfg = fleet_config(None, unique_prefix(), [source("a", "chat", up.url)], backend=backend)
        sc = make_sidecar(config_text=cfg, env=NO_PROXY)
        st = wait_until(lambda: (lambda x: x if "not a primary (ROLE: slave)" in x["last_error"]
                                 else None)(stats(sc)["backend"]), 5, interval=0.05)
        assert st and st["state"] != "up", stats(sc)["backend"]
        c = sc.connect()
        err, res, _ = call_on(c, "chat", chat(), 5)
        assert res is None and err["code"] == "backend_unavailable", err
        asked0 = fake.asked
        time.sleep(2.0)
        asked = fake.asked - asked0
        print("scripted sentinel: asked %d times in 2 s while it named a replica" % asked)
        assert 2 <= asked <= 30, asked   # re-asked, at the data connections' backoff

        fake.primary = ("127.0.0.1", a.port)
        st = wait_backend(sc, timeout=8)
        assert st["address"] == "127.0.0.1:%d" % a.port, st
        changes = st["primary_changes"]
        err, res, _ = call_on(c, "chat", chat(), 5)
        assert err is None, err

        assert fake.publish("+switch-master", "othermaster 127.0.0.1 %d 127.0.0.1 %d"
                            % (a.port, b.port)) >= 1
        time.sleep(0.3)
        st = stats(sc)["backend"]
        assert st["address"] == "127.0.0.1:%d" % a.port and st["state"] == "up", st

        assert b.client().call("REPLICAOF", "NO", "ONE") == "OK"
        fake.primary = ("127.0.0.1", b.port)
        t0 = time.monotonic()
        fake.publish("+switch-master", "mymaster 127.0.0.1 %d 127.0.0.1 %d" % (a.port, b.port))
        st = wait_until(lambda: (lambda x: x if x["address"].endswith(":%d" % b.port)
                                 and x["state"] == "up" and x.get("subscribed") else None)(
            stats(sc)["backend"]), 3, interval=0.01)
        assert st, stats(sc)["backend"]
        print("scripted sentinel: on +switch-master up on the new primary after %.1f ms"
              % ((time.monotonic() - t0) * 1000))
        assert st["primary_changes"] == changes + 1, st
        err, res, _ = call_on(c, "chat", chat(), 5)
        assert err is None, err
        c.close()
    finally:
        fake.close()
        b.cleanup()
        a.cleanup()


def test_failover__a_stale_sentinel_cannot_hold_the_fleet(up, make_sidecar):
    """Two scripted sentinels: the first, cut off from the others, still
    names a primary that is gone (a port where nothing listens); the
    second names the live one. The first answers, so the sidecar follows
    it; but each failed connection to the dead primary asks the *next*
    sentinel, so the sidecar reaches the live primary within a few
    backoff steps instead of retrying the dead one for ever."""
    from fleet_topology import FakeSentinel
    from redis_fixture import FleetRedis, free_port
    live = FleetRedis().start()
    stale, good = FakeSentinel(), FakeSentinel()
    try:
        stale.primary = ("127.0.0.1", free_port())
        good.primary = ("127.0.0.1", live.port)
        backend = {"sentinels": ["127.0.0.1:%d" % stale.port, "127.0.0.1:%d" % good.port],
                   "master_name": "mymaster", "command_timeout_s": CT, "lease_ttl_s": 3}
        cfg = fleet_config(None, unique_prefix(), [source("a", "chat", up.url)], backend=backend)
        sc = make_sidecar(config_text=cfg, env=NO_PROXY)
        st = wait_backend(sc, timeout=5)
        assert st["address"] == "127.0.0.1:%d" % live.port, st
        assert stale.asked >= 1 and good.asked >= 1, (stale.asked, good.asked)
        c = sc.connect()
        err, res, _ = call_on(c, "chat", chat(), 5)
        c.close()
        assert err is None, err
    finally:
        stale.close()
        good.close()
        live.cleanup()

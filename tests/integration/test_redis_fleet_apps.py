"""Apps across a fleet: three real polygw sidecars sharing one real
redis-server (same url, a unique prefix per test), the real mock upstream.

  per-app rpm is the fleet's:             test_fleet_apps__rpm_holds_across_sidecars
  per-app max_concurrency is the fleet's: test_fleet_apps__max_concurrency_holds_across_sidecars
  a dead sidecar gives the app's slot back: test_fleet_apps__killed_sidecar_frees_the_apps_slot
  per_capability limits through Redis:    test_fleet_apps__per_capability_concurrency
  task ownership across sidecars:         test_fleet_apps__task_owner_holds_across_sidecars
  an admin's task is no app's to take:    test_fleet_apps__admins_task_stays_the_admins
  per-app task shares with Redis:         test_fleet_apps__task_share_per_app

Callers run as root here: the root entry `relay` is admin and may declare
the other apps (`app` on a call, `hello {app}` on a connection), so one test
process speaks for several apps. Every wait and loop is bounded.
"""
import os
import signal
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import assert_task_unknown  # noqa: E402
from redis_fixture import (FleetRedis, Pending, chat, fleet_config, source, stats,  # noqa: E402
                           unique_prefix, wait_backend, wait_until)

EARLY = 0.02
NO_PROXY = {"no_proxy": "*", "NO_PROXY": "*"}


def apps_yaml(*entries):
    return "apps:\n  - {name: relay, uids: [0], admin: true, allow_declared: true}\n" + \
        "".join("  - %s\n" % e for e in entries)


def start_fleet(make_sidecar, n, cfg):
    fleet = [make_sidecar(config_text=cfg, subdir="sc%d" % i, env=NO_PROXY) for i in range(n)]
    for sc in fleet:
        wait_backend(sc)
    return fleet


def shared_refused(fleet, check):
    return sum(stats(sc)["shared"]["refused"][check] for sc in fleet)


@pytest.fixture
def redis_srv():
    srv = FleetRedis().start()
    yield srv
    srv.cleanup()


def test_fleet_apps__rpm_holds_across_sidecars(redis_srv, up, make_sidecar):
    """App `web` has rpm 6 per window_s 1 (a bucket of 6 refilled at 6/s);
    the source is not limited. 18 calls of web at once, 6 through each of
    three sidecars: the fleet's bucket admits 6 at once and then 6 per
    second (three local buckets would let all 18 through at once), so the
    k-th answer (k >= 6) comes no earlier than (k - 5) / 6 s. Six calls of
    `batch` on the same source, sent while web's wait, are not held back."""
    n_rpm, win, total = 6, 1.0, 18
    rate = n_rpm / win
    cfg = fleet_config(redis_srv.url(), unique_prefix(), [source("a", "chat", up.url)],
                       stall_window_s=10) + \
        apps_yaml("{name: web, limits: {rpm: %d, window_s: %s}}" % (n_rpm, win), "{name: batch}")
    fleet = start_fleet(make_sidecar, 3, cfg)

    t0 = time.monotonic()
    web = [Pending(fleet[i % 3], "chat", chat("w%d" % i), app="web", timeout=15)
           for i in range(total)]
    assert wait_until(lambda: up.stats()["requests"] >= n_rpm, 2, 0.01)
    t_batch = time.monotonic()
    batch = [Pending(fleet[i % 3], "chat", chat("b%d" % i), app="batch", timeout=15)
             for i in range(6)]
    for k in batch:
        err, res = k.wait(5)
        assert err is None, err
    batch_done = max(k.t_end for k in batch) - t_batch
    for k in web:
        err, res = k.wait(10)
        assert err is None, err
        assert res["attempts"] == 1, res
    ends = sorted(k.t_end - t0 for k in web)
    early = [(i, round(t, 3)) for i, t in enumerate(ends)
             if i >= n_rpm and t < (i + 1 - n_rpm) / rate - EARLY]
    print("timing: fleet app rpm: web answers %r; batch all answered %.3fs after sent"
          % ([round(t, 2) for t in ends], batch_done))
    assert not early, "web exceeded rpm %d per %.1fs across the fleet: %r" % (n_rpm, win, early)
    assert ends[-1] >= (total - n_rpm) / rate - EARLY
    assert batch_done < 1.0, "batch was held back by web's rpm: %.3fs" % batch_done
    assert up.stats()["requests"] == total + 6
    assert shared_refused(fleet, "app") > 0
    assert shared_refused(fleet, "rpm") == 0     # the source itself never refused


def test_fleet_apps__max_concurrency_holds_across_sidecars(redis_srv, up, make_sidecar):
    """App `web` has max_concurrency 2; the source allows 10. Phase 1: 6 of
    web's calls at once, 2 through each sidecar, each held 0.5 s by the
    mock: never more than 2 in progress at the mock (only web is calling),
    in three waves. Phase 2: while web's waves run, 3 calls of `batch`:
    they start at once, next to web's 2 (5 in progress)."""
    delay = 0.5
    cfg = fleet_config(redis_srv.url(), unique_prefix(),
                       [source("a", "chat", up.url, max_concurrency=10)], stall_window_s=10) + \
        apps_yaml("{name: web, max_concurrency: 2}", "{name: batch}")
    fleet = start_fleet(make_sidecar, 3, cfg)
    up.set_default({"delay_ms": int(delay * 1000)})

    t0 = time.monotonic()
    web = [Pending(fleet[i % 3], "chat", chat("w%d" % i), app="web", timeout=15)
           for i in range(6)]
    high, deadline = 0, t0 + 0.9
    while time.monotonic() < deadline:
        high = max(high, up.stats()["in_progress"])
        time.sleep(0.005)
    print("timing: fleet app concurrency: high-water mark %d (web alone)" % high)
    assert high == 2, "web's max_concurrency 2 across the fleet, %d in flight at once" % high
    batch = [Pending(fleet[i], "chat", chat("b%d" % i), app="batch", timeout=15)
             for i in range(3)]
    both = wait_until(lambda: up.stats()["in_progress"] >= 5, 0.4, 0.005)
    assert both, "batch's calls did not start next to web's: %r" % up.stats()
    for k in web + batch:
        err, _ = k.wait(8)
        assert err is None, err
    assert max(k.t_end for k in web) - t0 >= 3 * delay - EARLY   # three waves of 2
    assert shared_refused(fleet, "app") > 0
    assert sum(stats(sc)["shared"]["leases_live"] for sc in fleet) == 0


def test_fleet_apps__killed_sidecar_frees_the_apps_slot(redis_srv, up, make_sidecar):
    """A sidecar SIGKILLed while its call of `web` (max_concurrency 1) runs
    holds web's only slot until its lease expires (lease_ttl_s 1.5), not
    forever: another sidecar's call of web then gets it."""
    ttl = 1.5
    cfg = fleet_config(redis_srv.url(), unique_prefix(),
                       [source("a", "chat", up.url, max_concurrency=10, ttft_timeout_s=8)],
                       backend={"command_timeout_s": 0.3, "lease_ttl_s": ttl},
                       stall_window_s=10, poll_interval_s=0.1) + \
        apps_yaml("{name: web, max_concurrency: 1}")
    a, b = start_fleet(make_sidecar, 2, cfg)
    holder = Pending(a, "chat", chat(mock={"hang": "before_headers"}), app="web", timeout=10)
    assert wait_until(lambda: up.stats()["in_progress"] == 1, 3), up.stats()
    a.expected_rc = -signal.SIGKILL   # the fixture's clean-exit check expects this death
    t_kill = time.monotonic()
    a.send_signal(signal.SIGKILL)
    a.proc.wait(5)
    k = Pending(b, "chat", chat("next"), app="web", timeout=10)
    err, _ = k.wait(ttl + 3)
    assert err is None, err
    waited = k.t_end - t_kill
    print("timing: web's slot back after the kill: %.3fs (lease_ttl_s %.1f)" % (waited, ttl))
    # renewed every ttl / 3 while A lived: it expires ttl - ttl / 3 .. ttl after the kill
    assert ttl - ttl / 3 - EARLY <= waited <= ttl + 0.5, waited
    assert stats(b)["shared"]["refused"]["app"] >= 2
    assert holder.done.wait(2) and holder.exc is not None   # its sidecar died
    holder.close()


def test_fleet_apps__per_capability_concurrency(redis_srv, up, make_sidecar):
    """per_capability through Redis: `web` may run 1 chat call at a time
    across the fleet (its own max_concurrency is 10) while its embedding
    calls are not held by it."""
    cfg = fleet_config(redis_srv.url(), unique_prefix(),
                       [source("a", "chat", up.url, max_concurrency=10),
                        source("e", "embedding", up.url, max_concurrency=10)],
                       stall_window_s=10) + \
        apps_yaml("{name: web, max_concurrency: 10, per_capability: {chat: {max_concurrency: 1}}}")
    fleet = start_fleet(make_sidecar, 2, cfg)
    up.set_default({"delay_ms": 400})
    chats = [Pending(fleet[i % 2], "chat", chat("c%d" % i), app="web", timeout=15)
             for i in range(4)]
    high, deadline = 0, time.monotonic() + 0.6
    while time.monotonic() < deadline:
        high = max(high, up.stats()["in_progress"])
        time.sleep(0.005)
    assert high == 1, "web's chat max_concurrency 1 across the fleet: %d at once" % high
    embeds = [Pending(fleet[i % 2], "embedding", {"model": "m", "input": "x"}, app="web",
                      timeout=15) for i in range(2)]
    assert wait_until(lambda: up.stats()["in_progress"] >= 3, 0.3, 0.005), up.stats()
    for k in chats + embeds:
        err, _ = k.wait(8)
        assert err is None, err
    assert shared_refused(fleet, "app") > 0


def test_fleet_apps__task_owner_holds_across_sidecars(redis_srv, up, make_sidecar):
    """`web` starts a task on sidecar 1. On sidecar 2 (which never held it),
    `batch` cannot read, guard, stop, finish or start it, nor run a call in
    it: each answer is the one for a task that never existed. The admin
    (`relay`) reads and stops it there, and web sees its stop."""
    cfg = fleet_config(redis_srv.url(), unique_prefix(), [source("a", "chat", up.url)]) + \
        apps_yaml("{name: web}", "{name: batch}")
    s1, s2 = start_fleet(make_sidecar, 2, cfg)
    web = s1.connect()
    assert web.request("hello", {"app": "web"})[0] is None
    batch = s2.connect()
    assert batch.request("hello", {"app": "batch"})[0] is None
    err, t = web.request("task.start", {"task_id": "job-1"})
    assert err is None and t["state"] == "running", err

    assert_task_unknown(batch, "job-1")
    assert up.stats()["requests"] == 0
    # still running for its owner, on the other sidecar too
    s2web = s2.connect()
    assert s2web.request("hello", {"app": "web"})[0] is None
    err, t = s2web.request("task.guard", {"task_id": "job-1"})
    assert err is None, err
    admin = s2.connect()
    err, t = admin.request("task.get", {"task_id": "job-1"})
    assert err is None and t["state"] == "running" and t["app"] == "web", (err, t)
    err, t = admin.request("task.stop", {"task_id": "job-1", "reason": "ops"})
    assert err is None and t["state"] == "failed", err
    err, _ = batch.request("task.get", {"task_id": "job-1"})
    assert err["code"] == "bad_request" and "unknown task" in err["message"], err
    err, t = web.request("task.get", {"task_id": "job-1"})
    assert err is None and t["reason_kind"] == "stopped" and t["reason"] == "ops", (err, t)
    for c in (web, batch, s2web, admin):
        c.close()


def test_fleet_apps__admins_task_stays_the_admins(redis_srv, up, make_sidecar):
    """The admin (`relay`) starts a task on sidecar 1; on sidecar 2, which
    never held it, `batch` cannot read, stop, start or call in it (the old
    rule let the first app naming it take it), the record's owner stays
    the admin, and the admin reads and stops it there."""
    prefix = unique_prefix()
    cfg = fleet_config(redis_srv.url(), prefix, [source("a", "chat", up.url)]) + \
        apps_yaml("{name: web}", "{name: batch}")
    s1, s2 = start_fleet(make_sidecar, 2, cfg)
    admin1 = s1.connect()
    err, t = admin1.request("task.start", {"task_id": "ops-1"})
    assert err is None and t["app"] == "relay", (err, t)
    batch = s2.connect()
    assert batch.request("hello", {"app": "batch"})[0] is None
    assert_task_unknown(batch, "ops-1")
    r = redis_srv.client()
    assert r.call("HGET", "{%s:task:ops-1}" % prefix, "owner") == "relay"
    r.close()
    admin2 = s2.connect()
    err, t = admin2.request("task.get", {"task_id": "ops-1"})
    assert err is None and t["state"] == "running" and t["app"] == "relay", (err, t)
    err, t = admin2.request("task.stop", {"task_id": "ops-1", "reason": "ops"})
    assert err is None and t["state"] == "failed", err
    err, t = admin1.request("task.get", {"task_id": "ops-1"})
    assert err is None and t["reason"] == "ops" and t["app"] == "relay", (err, t)
    for c in (admin1, batch, admin2):
        c.close()


def test_fleet_apps__task_share_per_app(redis_srv, up, make_sidecar):
    """tasks.max_tasks 8 over four apps (relay, web, batch, default): each
    sidecar holds at most 2 of web's tasks. web's third start is refused
    with `overloaded` and creates no record; batch still starts its own;
    and web cannot fill sidecar 1 through sidecar 2 either: importing a
    third task of web's (node_begin) is refused the same way."""
    prefix = unique_prefix()
    cfg = fleet_config(redis_srv.url(), prefix, [source("a", "chat", up.url)]) + \
        "tasks: {max_tasks: 8}\n" + apps_yaml("{name: web}", "{name: batch}")
    s1, s2 = start_fleet(make_sidecar, 2, cfg)
    web1, web2, batch1 = s1.connect(), s2.connect(), s1.connect()
    for c, app in ((web1, "web"), (web2, "web"), (batch1, "batch")):
        assert c.request("hello", {"app": app})[0] is None
    for i in range(2):
        assert web1.request("task.start", {"task_id": "w1-%d" % i})[0] is None
    err, _ = web1.request("task.start", {"task_id": "w1-2"})
    assert err["code"] == "overloaded" and "max_tasks" in err["message"], err
    r = redis_srv.client()
    assert r.call("EXISTS", "{%s:task:w1-2}" % prefix) == 0
    for i in range(2):
        assert batch1.request("task.start", {"task_id": "b1-%d" % i})[0] is None
    assert web2.request("task.start", {"task_id": "w2-0"})[0] is None
    err, _ = web1.request("task.node_begin", {"task_id": "w2-0", "node": "n"})
    assert err["code"] == "overloaded", err
    assert stats(s1)["tasks"]["held"] == 4 and stats(s1)["tasks"]["rejected_app"] == 1
    # sidecar 2 holds web's task and has room for its node
    assert web2.request("task.node_begin", {"task_id": "w2-0", "node": "n"})[0] is None
    r.close()
    for c in (web1, web2, batch1):
        c.close()


def test_fleet_apps__reload_keeps_the_fleets_app_limits(redis_srv, up, make_sidecar):
    """With Redis an app's limits are the fleet's: a reload that changes
    them is refused (naming the app), while its weight, which orders only
    this sidecar's wait queue, reloads."""
    base = fleet_config(redis_srv.url(), unique_prefix(), [source("a", "chat", up.url)])
    sc = start_fleet(make_sidecar, 1, base + apps_yaml("{name: web, limits: {rpm: 5}}"))[0]
    c = sc.connect()

    def reload_with(entry):
        with open(sc.config + ".tmp", "w") as f:
            f.write(base + apps_yaml(entry))
        os.replace(sc.config + ".tmp", sc.config)
        return c.request("config.reload")

    err, _ = reload_with("{name: web, limits: {rpm: 50}}")
    assert err is not None and "apps[1] web max_concurrency/limits/per_capability" \
        in err["message"], err
    err, _ = reload_with("{name: web, limits: {rpm: 5}, weight: 3}")
    assert err is None, err
    assert [a["weight"] for a in stats(sc)["apps"] if a["name"] == "web"] == [3]
    c.close()

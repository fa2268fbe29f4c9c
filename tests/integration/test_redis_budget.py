"""Budgets in currency across a fleet (docs/CONFIG.md §12a): two real polygw
sidecars sharing one real redis-server, the real mock upstream. budget.lua
reserves each attempt's worst case on the app's budget atomically in Redis,
in the same round trip as the attempt's admission (pipelined), so the fleet
as a whole cannot overshoot it, however the calls interleave.

200 calls at once, 100 through each sidecar, each reserving 1.0 (max_tokens
1000 at 1000 per million output tokens) and costing what its answer reports
(100 .. 1000 completion tokens: 0.1 .. 1.0), against an app total of 40.
"""
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import await_true, chat, config_yaml  # noqa: E402
from redis_fixture import (FleetRedis, fleet_config, source, stats, unique_prefix,  # noqa: E402
                           wait_backend, wait_until)
from test_budget import burst_outcome  # noqa: E402
from test_metrics import ctl, parse, value  # noqa: E402

import pytest  # noqa: E402

NO_PROXY = {"no_proxy": "*", "NO_PROXY": "*"}


@pytest.fixture
def redis_srv():
    srv = FleetRedis().start()
    yield srv
    srv.cleanup()


def budget_hash(r, key):
    """A budget key's fields (budget.lua) as numbers."""
    h = r.call("HGETALL", key)
    return {k.decode() if isinstance(k, bytes) else k: float(v) for k, v in zip(h[::2], h[1::2])}


def settled_hash(r, key):
    """budget_hash once nothing is reserved any more (the settles are sent
    as calls end), or None after 5 s."""
    return wait_until(lambda: (lambda h: h if h.get("reserved", 1) == 0 else None)(
        budget_hash(r, key)), 5)


def priced_fleet(redis_srv, up, make_sidecar):
    """(prefix, two sidecars) on one redis-server, one source priced 1000
    per million output tokens."""
    prefix = unique_prefix()
    cfg = fleet_config(redis_srv.url(), prefix,
                       [source("s", "chat", up.url, prices={"input": 0, "output": 1000})])
    fleet = [make_sidecar(config_text=cfg, subdir="sc%d" % i, env=NO_PROXY) for i in range(2)]
    for sc in fleet:
        wait_backend(sc)
    return prefix, fleet


@pytest.mark.timing
def test_redis_budget__a_burst_through_two_sidecars_never_overshoots(redis_srv, up,
                                                                      make_sidecar):
    prefix = unique_prefix()
    cfg = fleet_config(redis_srv.url(), prefix,
                       [source("s", "chat", up.url, prices={"input": 0, "output": 1000})])
    cfg += "apps:\n  - {name: default, budget: {total: 40}}\n"
    fleet = [make_sidecar(config_text=cfg, subdir="sc%d" % i, env=NO_PROXY) for i in range(2)]
    for sc in fleet:
        wait_backend(sc)
    conns = [sc.connect() for sc in fleet]
    rnd = random.Random(30)
    sent = []
    for i in range(200):
        body = chat(max_tokens=1000, mock={"delay_ms": rnd.randint(0, 200), "usage": {
            "prompt_tokens": 5, "completion_tokens": rnd.randint(100, 1000)}})
        c = conns[i % 2]
        sent.append((c, c.request_async("call", {"capability": "chat", "body": body})))
    ok, refused, charged = burst_outcome([c.wait_response(msgid, 30) for c, msgid in sent])
    # Redis holds what was charged, nothing reserved once the burst is over
    # (the settles are sent as the calls end: wait for the last ones).
    r = redis_srv.client()
    key = "{%s:app:default}:budget" % prefix

    def budget():
        h = dict(zip(*[iter(r.call("HGETALL", key))] * 2))
        return {k.decode() if isinstance(k, bytes) else k: float(v) for k, v in h.items()}

    try:
        await_true(lambda: budget().get("reserved", 1) == 0, timeout=15)
    except AssertionError:
        pass  # said with the figures below
    h = budget()
    assert h.get("reserved") == 0, ("a reservation was never settled", h)
    spent = h["spent_t"]
    assert abs(spent - charged) < 1e-9, (h, charged)
    # The admissions pipelined with refused reservations gave their leases
    # back: no permit of the fleet is held once the burst is over.
    leases = "{%s:source:s}:leases" % prefix
    await_true(lambda: int(r.call("ZCARD", leases)) == 0, timeout=15,
               what="every lease to be given back")
    # polygw_cost_total over the fleet equals the sum of the per-call costs.
    # (A sidecar that served none of the burst has no series yet.)
    key_of = ("polygw_cost_total", (("app", "default"), ("currency", "USD"), ("model", "other"),
                                    ("source", "s")))
    total = sum(parse(ctl(sc, "metrics").stdout).get(key_of, 0) for sc in fleet)
    assert abs(total - charged) < 1e-9, (total, charged)
    # Then one call at a time, alternating sidecars: the fleet spends the
    # budget down to within one worst case (1.0), never past it. (A call's
    # settle reaches Redis just after its answer: each call waits for the
    # one before it to be settled, as a caller one call at a time would.)
    served_after = 0
    while True:
        await_true(lambda: budget().get("reserved", 1) == 0, timeout=15,
                   what="the previous call's settle")
        c = conns[served_after % 2]
        body = chat(max_tokens=1000, mock={"usage": {"prompt_tokens": 5,
                                                     "completion_tokens": rnd.randint(100, 1000)}})
        msg = c.wait_response(c.request_async("call", {"capability": "chat", "body": body}), 10)
        if msg[2]:
            break
        served_after += 1
        charged += msg[3]["cost"]
    assert msg[2]["code"] == "budget_exhausted" and 39 < charged <= 40 + 1e-9, (msg[2], charged)
    assert up.stats()["requests"] == len(ok) + served_after  # refused calls never went out
    print("fleet burst: %d served, %d refused at once, then %d one by one; %.4f of 40 charged"
          % (len(ok), len(refused), served_after, charged))


def test_redis_budget__a_source_out_of_budget_hands_calls_to_another(redis_srv, up,
                                                                      make_sidecar):
    # Two sources, "a" first, each with a total the fleet keeps in Redis.
    # Calls alternate between two sidecars; a call that "a"'s budget cannot
    # cover (whoever spent it) goes to "b", and only a call neither can
    # cover ends budget_exhausted, without reaching the upstream.
    prefix = unique_prefix()
    prices = {"input": 0, "output": 1000}
    cfg = fleet_config(redis_srv.url(), prefix, [
        source("a", "chat", up.url, prices=prices, priority=0, budget={"total": 1.5}),
        source("b", "chat", up.url, prices=prices, priority=1, budget={"total": 1.2})])
    fleet = [make_sidecar(config_text=cfg, subdir="sc%d" % i, env=NO_PROXY) for i in range(2)]
    for sc in fleet:
        wait_backend(sc)
    conns = [sc.connect() for sc in fleet]
    r = redis_srv.client()

    def budget(name):
        return budget_hash(r, "{%s:source:%s}:budget" % (prefix, name))

    def settled():
        # A call's settle is sent as it ends: the next call, through the
        # other sidecar, must find it done for the sequence to be exact.
        for _ in range(500):
            if all(budget(n).get("reserved", 0) == 0 for n in ("a", "b")):
                return
            time.sleep(0.01)
        raise AssertionError("a reservation was never settled")

    served = []
    for i in range(6):
        settled()
        c = conns[i % 2]
        body = chat(max_tokens=1000, mock={"usage": {"prompt_tokens": 5,
                                                     "completion_tokens": 250}})
        msg = c.wait_response(c.request_async("call", {"capability": "chat", "body": body}), 10)
        if msg[2]:
            break
        assert msg[3]["attempts"] == 1, msg[3]
        served.append(msg[3]["source"])
    # 1.0 reserved and 0.25 charged each: "a" covers three (0.5 + 1.0 <=
    # 1.5), "b" one (0.25 + 1.0 > 1.2), the fifth call neither.
    assert served == ["a", "a", "a", "b"], served
    assert msg[2]["code"] == "budget_exhausted", msg[2]
    assert msg[2]["budget"] in ("source:a:total", "source:b:total"), msg[2]
    assert up.stats()["requests"] == 4
    settled()
    for name, spent in (("a", 0.75), ("b", 0.25)):
        h = budget(name)
        assert abs(h["spent_t"] - spent) < 1e-9 and h["reserved"] == 0, (name, h)


def test_redis_budget__every_sidecar_shows_the_fleets_budgets(redis_srv, up, make_sidecar):
    # stats and /metrics show the fleet's budgets (what Redis holds), on a
    # sidecar that served none of the calls as on the one that did.
    prefix = unique_prefix()
    cfg = fleet_config(redis_srv.url(), prefix, [
        source("s", "chat", up.url, prices={"input": 0, "output": 1000},
               budget={"daily": 5})])
    cfg += "apps:\n  - {name: default, budget: {total: 10}}\n"
    fleet = [make_sidecar(config_text=cfg, subdir="sc%d" % i, env=NO_PROXY) for i in range(2)]
    for sc in fleet:
        wait_backend(sc)
    c = fleet[0].connect()
    for _ in range(3):
        body = chat(max_tokens=1000, mock={"usage": {"prompt_tokens": 5,
                                                     "completion_tokens": 250}})
        msg = c.wait_response(c.request_async("call", {"capability": "chat", "body": body}), 10)
        assert msg[2] is None, msg[2]

    def budgets(sc):
        st = stats(sc)
        app = {a["name"]: a for a in st["apps"]}["default"].get("budget")
        src = {x["name"]: x for x in st["sources"]}["s"].get("budget")
        return app, src

    for sc in fleet:
        assert wait_until(lambda: budgets(sc)[0] and budgets(sc)[0]["total"]["spent"] == 0.75
                          and budgets(sc)[1]["daily"]["reserved"] == 0, 5), budgets(sc)
        app, src = budgets(sc)
        assert app["total"] == {"limit": 10, "spent": 0.75, "reserved": 0, "left": 9.25}, app
        daily = src["daily"]
        assert daily["limit"] == 5 and daily["spent"] == 0.75 and daily["left"] == 4.25, daily
        assert 0 < daily["resets_in_s"] <= 86400, daily
        m = parse(ctl(sc, "metrics").stdout)
        assert value(m, "polygw_budget_left", app="default", window="total") == 9.25
        assert value(m, "polygw_budget_limit", source="s", window="daily") == 5
        assert value(m, "polygw_budget_left", source="s", window="daily") == 4.25


def test_redis_budget__a_task_budget_is_the_fleets(redis_srv, up, make_sidecar):
    # A task started on one sidecar with a budget of 1.5: a call through
    # that sidecar holds a 1.0 reservation upstream; the next call, through
    # the other sidecar, finds it in Redis (1.0 + 1.0 > 1.5) and is refused,
    # and the task stops across the fleet, ending the held call too.
    prefix, fleet = priced_fleet(redis_srv, up, make_sidecar)
    c0, c1 = [sc.connect() for sc in fleet]
    err, _ = c0.request("task.start", {"task_id": "job-1", "budget": 1.5})
    assert err is None, err
    held = c0.request_async("call", {"capability": "chat", "task_id": "job-1", "body": chat(
        max_tokens=1000, mock={"delay_ms": 10000, "usage": {"completion_tokens": 250}})})
    assert wait_until(lambda: up.stats()["in_progress"] >= 1, 5)
    msg = c1.wait_response(c1.request_async("call", {
        "capability": "chat", "task_id": "job-1",
        "body": chat(max_tokens=1000, mock={"usage": {"completion_tokens": 250}})}), 10)
    err = msg[2]
    assert err and err["code"] == "budget_exhausted", err
    assert err["budget"] == "task:job-1:total" and err["left"] == 0.5, err
    assert "retry_after_s" not in err, err
    msg = c0.wait_response(held, 5)
    assert msg[2]["code"] == "task_stopped" and msg[2]["reason"] == "budget", msg[2]
    for c in (c0, c1):
        err, info = c.request("task.get", {"task_id": "job-1"})
        assert info["state"] == "failed" and info["reason"] == "budget", info
        assert info["budget"]["limit"] == 1.5, info
    # The torn-down call may have been billed: charged as reserved, in the
    # run's key; nothing left reserved. The refused call never went out.
    h = settled_hash(redis_srv.client(), "{%s:task:job-1}:budget:1" % prefix)
    assert h and h["spent_t"] == 1.0, h
    assert up.stats()["requests"] == 1
    # task.get reads it there, through either sidecar
    for c in (c0, c1):
        err, info = c.request("task.get", {"task_id": "job-1"})
        assert info["budget"] == {"limit": 1.5, "spent": 1.0, "reserved": 0, "left": 0.5}, info


def test_redis_budget__task_get_shows_what_the_run_spent(redis_srv, up, make_sidecar):
    # A run with a budget of 3 started on one sidecar; a call of it through
    # the other holds a 1.0 reservation upstream. task.get on either sidecar
    # shows the fleet's figures, read from the run's key: the reservation
    # while the call runs, then its real cost (250 completion tokens at
    # 1000 per million: 0.25) once it settled. The map has the memory
    # backend's shape (limit, spent, reserved, left).
    prefix, fleet = priced_fleet(redis_srv, up, make_sidecar)
    c0, c1 = [sc.connect() for sc in fleet]
    err, _ = c0.request("task.start", {"task_id": "job-2", "budget": 3})
    assert err is None, err
    for c in (c0, c1):
        err, info = c.request("task.get", {"task_id": "job-2"})
        assert err is None and info["budget"] == {"limit": 3, "spent": 0, "reserved": 0,
                                                  "left": 3}, (err, info)
    held = c1.request_async("call", {"capability": "chat", "task_id": "job-2", "body": chat(
        max_tokens=1000, mock={"delay_ms": 1500, "usage": {"completion_tokens": 250}})})
    assert wait_until(lambda: up.stats()["in_progress"] >= 1, 5)
    for c in (c0, c1):
        err, info = c.request("task.get", {"task_id": "job-2"})
        assert info["budget"] == {"limit": 3, "spent": 0, "reserved": 1.0, "left": 2.0}, info
    msg = c1.wait_response(held, 10)
    assert msg[2] is None, msg[2]
    h = settled_hash(redis_srv.client(), "{%s:task:job-2}:budget:1" % prefix)
    assert h and h["spent_t"] == 0.25, h
    shapes = []
    for c in (c0, c1):
        err, info = c.request("task.get", {"task_id": "job-2"})
        assert info["budget"] == {"limit": 3, "spent": 0.25, "reserved": 0, "left": 2.75}, info
        shapes.append(sorted(info["budget"]))
    # the memory backend's task.get, for the same run on one sidecar
    mem = make_sidecar(config_text=config_yaml(
        [source("s", "chat", up.url, prices={"input": 0, "output": 1000})],
        {"max_attempts": 3, "stall_window_s": 10}), subdir="mem", env=NO_PROXY)
    cm = mem.connect()
    assert cm.request("task.start", {"task_id": "job-2", "budget": 3})[0] is None
    msg = cm.wait_response(cm.request_async("call", {
        "capability": "chat", "task_id": "job-2",
        "body": chat(max_tokens=1000, mock={"usage": {"completion_tokens": 250}})}), 10)
    assert msg[2] is None, msg[2]
    err, info = cm.request("task.get", {"task_id": "job-2"})
    assert info["budget"] == {"limit": 3, "spent": 0.25, "reserved": 0, "left": 2.75}, info
    assert shapes == [sorted(info["budget"])] * 2
    # a run of its own: a new run's key, nothing spent
    assert c0.request("task.finish", {"task_id": "job-2", "ok": True})[0] is None
    err, info = c1.request("task.start", {"task_id": "job-2", "budget": 2})
    assert err is None and info["runs"] == 2, (err, info)
    err, info = c0.request("task.get", {"task_id": "job-2"})
    assert info["budget"] == {"limit": 2, "spent": 0, "reserved": 0, "left": 2}, info


def test_redis_budget__a_task_budget_holds_across_a_burst(redis_srv, up, make_sidecar):
    # 40 calls of one task at once through two sidecars, 1.0 reserved each,
    # against a task budget of 10: at most ten reservations fit, so at
    # most ten calls reach the upstream; the first refusal stops the task
    # across the fleet (its calls in flight end task_stopped, charged as
    # reserved: they may have been billed). Redis never holds more than 10
    # spent, and nothing reserved once the burst is over.
    prefix, fleet = priced_fleet(redis_srv, up, make_sidecar)
    conns = [sc.connect() for sc in fleet]
    err, _ = conns[0].request("task.start", {"task_id": "burst", "budget": 10})
    assert err is None, err
    rnd = random.Random(7)
    sent = []
    for i in range(40):
        c = conns[i % 2]
        body = chat(max_tokens=1000, mock={"delay_ms": rnd.randint(50, 300), "usage": {
            "prompt_tokens": 5, "completion_tokens": rnd.randint(100, 1000)}})
        sent.append((c, c.request_async("call", {"capability": "chat", "task_id": "burst",
                                                 "body": body})))
    answers = [c.wait_response(m, 30) for c, m in sent]
    ok = [a[3] for a in answers if a[2] is None]
    codes = [a[2]["code"] for a in answers if a[2] is not None]
    assert "budget_exhausted" in codes and set(codes) <= {"budget_exhausted", "task_stopped"}
    assert up.stats()["requests"] <= 10, up.stats()
    h = settled_hash(redis_srv.client(), "{%s:task:burst}:budget:1" % prefix)
    assert h and sum(x["cost"] for x in ok) <= h["spent_t"] <= 10 + 1e-9, (h, ok)
    print("task burst: %d upstream, %d served, %.4f of 10 charged; %d budget_exhausted, "
          "%d task_stopped" % (up.stats()["requests"], len(ok), h["spent_t"],
                                codes.count("budget_exhausted"), codes.count("task_stopped")))

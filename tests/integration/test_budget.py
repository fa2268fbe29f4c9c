"""Budgets in currency (docs/CONFIG.md §12a, proto/PROTOCOL.md §6.2) on the
memory backend, end to end: the real sidecar, the mock upstream answering
with real usage after a real delay, so that calls are in flight together.

Prices make the arithmetic exact: input is free and output costs 1000 per
million tokens, so a call with max_tokens 1000 reserves exactly 1.0 and one
whose answer reports 250 completion tokens is charged exactly 0.25.
Reservations in flight count against the budget: concurrent calls cannot
together pass it; refused calls end at once with `budget_exhausted`, which
budget, what it has left and, for a window, retry_after_s until its reset.
"""
import calendar
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import POLYGW, call, chat, config_yaml, source_yaml  # noqa: E402
from prometheus_fixture import free_port  # noqa: E402
from test_metrics import metrics_text, parse, promtool_check, value  # noqa: E402

FAST = {"timeout_s": 5, "connect_timeout_s": 2, "ttft_timeout_s": 2, "idle_timeout_s": 5,
        "max_concurrency": 64, "aimd": {"initial": 64}}
POLICY = {"max_attempts": 2, "stall_window_s": 5, "backoff_base_s": 0.05, "backoff_max_s": 0.1}
PRICES = {"input": 0, "output": 1000}
ENV = {"no_proxy": "*", "NO_PROXY": "*"}


def start(make_sidecar, up, app_budget=None, source_budget=None, http_port=None):
    extra = {"budget": source_budget} if source_budget else {}
    text = config_yaml([source_yaml("s", "chat", up.url, FAST, prices=PRICES, **extra)], POLICY)
    if app_budget:
        text += "apps:\n  - name: default\n    budget: %s\n" % json.dumps(app_budget)
    if http_port:
        text += "http:\n  listen: 127.0.0.1:%d\n" % http_port
    return make_sidecar(config_text=text, env=ENV)


def body(completion=250, delay_ms=0):
    return chat(max_tokens=1000, mock={"delay_ms": delay_ms,
                                       "usage": {"prompt_tokens": 40,
                                                 "completion_tokens": completion}})


def burst_outcome(answers, budget=40):
    """(served results, refusals, sum charged) of a burst's answers, after
    checking that every refusal is the app's total and nothing overshot."""
    ok = [a[3] for a in answers if a[2] is None]
    refused = [a[2] for a in answers if a[2] is not None]
    assert all(e["code"] == "budget_exhausted" and e["budget"] == "app:default:total"
               for e in refused), refused[:3]
    charged = sum(r["cost"] for r in ok)
    assert ok and refused and charged <= budget + 1e-9, (len(ok), charged)
    return ok, refused, charged


def app_budget_stats(c):
    err, stats = c.request("stats")
    assert err is None, err
    return {a["name"]: a for a in stats["apps"]}["default"]


def test_budget__reservations_in_flight_cannot_pass_an_app_total(make_sidecar, up):
    sc = start(make_sidecar, up, app_budget={"total": 3.5})
    c = sc.connect()
    # Six calls at once, each held 400 ms upstream: three reservations of
    # 1.0 fit in 3.5, the other three are refused at once.
    ids = [c.request_async("call", {"capability": "chat", "body": body(delay_ms=400)})
           for _ in range(6)]
    t0 = time.monotonic()
    answers = [c.wait_response(i, 10) for i in ids]
    ok = [a for a in answers if a[2] is None]
    refused = [a[2] for a in answers if a[2] is not None]
    assert len(ok) == 3 and len(refused) == 3, answers
    for e in refused:
        assert e["code"] == "budget_exhausted", e
        assert e["budget"] == "app:default:total" and e["left"] == 0.5, e
        assert "retry_after_s" not in e, e  # a total never resets
        assert e["attempts"] == 0, e
    assert all(a[3]["cost"] == 0.25 for a in ok), ok
    assert time.monotonic() - t0 < 5
    # The real costs replaced the reservations: 0.75 spent of 3.5.
    b = app_budget_stats(c)["budget"]["total"]
    assert b == {"limit": 3.5, "spent": 0.75, "reserved": 0, "left": 2.75}, b
    # One at a time, each reserving 1.0 and charged 0.25: 0.75 + 0.25 k + 1
    # <= 3.5 admits k = 0 .. 7, then the next is refused.
    served = 0
    while True:
        err, res, _ = call(c, "chat", body())
        if err:
            break
        served += 1
        assert served < 100
    assert served == 8
    assert err["code"] == "budget_exhausted" and err["left"] == 0.75, err
    assert up.stats()["requests"] == 3 + 8  # a refused call never reaches the upstream
    app = app_budget_stats(c)
    assert app["budget"]["total"]["spent"] == 2.75 and app["cost"] == 2.75, app
    # A failed attempt costs nothing: its reservation is given back.
    err, _, _ = call(c, "chat", chat(max_tokens=10, mock={"status": 400}))
    assert err["code"] == "upstream_rejected", err
    assert app_budget_stats(c)["budget"]["total"]["spent"] == 2.75


def test_budget__daily_window_gives_its_reset_over_msgpack_and_http(make_sidecar, up):
    port = free_port()
    sc = start(make_sidecar, up, app_budget={"daily": 0.5, "total": 100}, http_port=port)
    c = sc.connect()
    err, res, _ = call(c, "chat", chat(max_tokens=400, mock={
        "usage": {"prompt_tokens": 1, "completion_tokens": 400}}))
    assert err is None and res["cost"] == 0.4, (err, res)
    err, _, _ = call(c, "chat", body())
    now = time.time()
    midnight = calendar.timegm(time.gmtime(now)[:3] + (0, 0, 0)) + 86400
    assert err["code"] == "budget_exhausted", err
    assert err["budget"] == "app:default:daily", err
    assert abs(err["left"] - 0.1) < 1e-9, err
    assert abs(err["retry_after_s"] - (midnight - now)) <= 2, (err, midnight - now)
    # The HTTP front: 429 like a provider's exhausted quota, Retry-After the
    # window's reset, the same fields under "polygw".
    req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % port,
                                 data=json.dumps(body()).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("not refused")
    except urllib.error.HTTPError as e:
        assert e.code == 429
        assert e.headers["X-Polygw-Code"] == "budget_exhausted"
        assert e.headers["x-should-retry"] == "false"
        assert abs(int(e.headers["Retry-After"]) - (midnight - now)) <= 3, e.headers
        doc = json.loads(e.read())
        assert doc["error"]["code"] == "budget_exhausted", doc
        assert doc["error"]["polygw"]["budget"] == "app:default:daily", doc
    err, stats = c.request("stats")
    daily = {a["name"]: a for a in stats["apps"]}["default"]["budget"]["daily"]
    assert daily["limit"] == 0.5 and abs(daily["spent"] - 0.4) < 1e-12, daily
    assert abs(daily["resets_in_s"] - (midnight - time.time())) <= 2, daily


def test_budget__source_budget(make_sidecar, up):
    sc = start(make_sidecar, up, source_budget={"monthly": 1.2})
    c = sc.connect()
    err, res, _ = call(c, "chat", body())
    assert err is None, err
    err, _, _ = call(c, "chat", body())  # 0.25 + 1.0 reserved > 1.2
    assert err["code"] == "budget_exhausted" and err["budget"] == "source:s:monthly", err
    assert abs(err["left"] - 0.95) < 1e-9 and err["retry_after_s"] > 0, err
    err, stats = c.request("stats")
    src = {s["name"]: s for s in stats["sources"]}["s"]
    assert src["budget"]["monthly"]["spent"] == 0.25 and src["cost"] == 0.25, src
    text = metrics_text(sc)
    promtool_check(text)
    m = parse(text)
    assert abs(value(m, "polygw_budget_left", source="s", window="monthly") - 0.95) < 1e-9
    assert value(m, "polygw_budget_limit", source="s", window="monthly") == 1.2
    assert not [k for k in m if k[0] == "polygw_budget_left" and k[1][0][0] == "app"]


def test_budget__a_source_out_of_budget_hands_its_calls_to_another(make_sidecar, up):
    # Two sources of one capability: "a" first (priority 0) with a total of
    # 1.5, "b" behind it with 1.2. A call "a"'s budget cannot cover goes to
    # "b" at once, as past an open breaker; only when neither can cover it
    # does it end budget_exhausted, without reaching the upstream.
    text = config_yaml([
        source_yaml("a", "chat", up.url, FAST, prices=PRICES, priority=0, budget={"total": 1.5}),
        source_yaml("b", "chat", up.url, FAST, prices=PRICES, priority=1,
                    budget={"total": 1.2}),
    ], POLICY)
    sc = make_sidecar(config_text=text, env=ENV)
    c = sc.connect()
    served = []
    for _ in range(6):
        err, res, _ = call(c, "chat", body())
        if err:
            break
        assert res["attempts"] == 1, res
        served.append(res["source"])
    # a: each call reserves 1.0 and is charged 0.25; 0.5 + 1.0 still fits
    # in 1.5, 0.75 + 1.0 does not: b takes the fourth (0.25 of 1.2), and
    # b's 0.25 + 1.0 > 1.2 leaves the fifth to neither.
    assert served == ["a", "a", "a", "b"], served
    assert err["code"] == "budget_exhausted", err
    assert err["budget"] in ("source:a:total", "source:b:total"), err
    assert "retry_after_s" not in err, err
    assert up.stats()["requests"] == 4
    err, stats = c.request("stats")
    src = {s["name"]: s for s in stats["sources"]}
    assert src["a"]["budget"]["total"]["spent"] == 0.75, src["a"]
    assert src["b"]["budget"]["total"]["spent"] == 0.25, src["b"]
    assert src["a"]["budget"]["total"]["reserved"] == 0, src["a"]


def test_budget__configuration_errors(up, tmp_path):
    cases = [
        (config_yaml([source_yaml("s", "chat", up.url, FAST)], POLICY) +
         "apps:\n  - name: default\n    budget: {daily: 5}\n",
         "source s, which the app may use, has no prices"),
        (config_yaml([source_yaml("s", "chat", up.url, FAST, budget={"total": 1})], POLICY),
         "sources[0].budget: needs prices"),
        (config_yaml([source_yaml("s", "chat", up.url, FAST, prices=PRICES,
                                  budget={"daily": 1, "timezone": "Europe/Paris"})], POLICY),
         "sources[0].budget.timezone: must be UTC or an offset"),
        (config_yaml([source_yaml("s", "chat", up.url, FAST, prices=PRICES,
                                  budget={"daily": 0})], POLICY),
         "sources[0].budget.daily"),
    ]
    for i, (text, want) in enumerate(cases):
        path = tmp_path / ("c%d.yaml" % i)
        path.write_text(text)
        p = subprocess.run([POLYGW, "--check-config", str(path)],
                           capture_output=True, text=True, timeout=20)
        assert p.returncode != 0 and want in p.stderr, (want, p.stderr)


def test_budget__reload_keeps_what_was_spent(make_sidecar, up):
    sc = start(make_sidecar, up, app_budget={"total": 2.0})
    c = sc.connect()
    for _ in range(2):
        err, res, _ = call(c, "chat", body())
        assert err is None, err
    # Spent 0.5; a lower total keeps it, and a daily window added now
    # counts what was spent today.
    with open(sc.config) as f:
        text = f.read()
    with open(sc.config, "w") as f:
        f.write(text.replace('{"total": 2.0}', '{"total": 1.6, "daily": 10}'))
    err, _ = c.request("config.reload")
    assert err is None, err
    b = app_budget_stats(c)["budget"]
    assert b["total"]["limit"] == 1.6 and b["total"]["spent"] == 0.5, b
    assert b["daily"]["spent"] == 0.5 and b["daily"]["left"] == 9.5, b
    err, _, _ = call(c, "chat", body())  # 0.5 + 1.0 <= 1.6
    assert err is None, err
    err, _, _ = call(c, "chat", body())  # 0.75 + 1.0 > 1.6
    assert err["code"] == "budget_exhausted" and err["budget"] == "app:default:total", err


def test_budget__a_task_that_runs_out_stops_and_its_calls_in_flight_end(make_sidecar, up):
    sc = start(make_sidecar, up)
    c = sc.connect()
    err, res = c.request("task.start", {"task_id": "job-1", "budget": 1.5})
    assert err is None, err
    # One call holds its 1.0 reservation upstream (hung); the next cannot
    # be covered (1.0 + 1.0 > 1.5): it is refused, and the task stops as
    # task.stop would stop it, ending the call in flight.
    held = c.request_async("call", {"capability": "chat", "task_id": "job-1",
                                    "body": body(delay_ms=10000)})
    deadline = time.monotonic() + 5
    while up.stats()["in_progress"] < 1:
        assert time.monotonic() < deadline, "the first call never reached the upstream"
        time.sleep(0.01)
    err, _, _ = call(c, "chat", body(), task_id="job-1")
    assert err["code"] == "budget_exhausted" and err["budget"] == "task:job-1:total", err
    assert err["left"] == 0.5 and "retry_after_s" not in err, err
    msg = c.wait_response(held, 5)
    assert msg[2]["code"] == "task_stopped" and msg[2]["reason"] == "budget", msg[2]
    err, info = c.request("task.get", {"task_id": "job-1"})
    assert info["state"] == "failed" and info["reason_kind"] == "stopped", info
    assert info["reason"] == "budget", info
    # The torn-down call may have been billed: charged as reserved.
    assert info["budget"] == {"limit": 1.5, "spent": 1.0, "reserved": 0, "left": 0.5}, info
    # A stop is final for the task id: the guard says so.
    err, _ = c.request("task.guard", {"task_id": "job-1"})
    assert err["code"] == "task_stopped" and err.get("reason") == "budget", err
    err, _ = c.request("task.start", {"task_id": "job-2", "budget": -1})
    assert err["code"] == "bad_request" and "budget" in err["message"], err


def test_budget__task_budget_over_http_header(make_sidecar, up):
    port = free_port()
    sc = start(make_sidecar, up, http_port=port)
    sc.connect()
    base = "http://127.0.0.1:%d" % port

    def post(path, data=b"", headers=None):
        req = urllib.request.Request(base + path, data=data, method="POST",
                                     headers=dict({"Content-Type": "application/json"},
                                                  **(headers or {})))
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read() or b"{}"), r.headers
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}"), e.headers

    status, doc, _ = post("/polygw/v1/tasks/web-1/start", headers={"X-Polygw-Budget": "1.2"})
    assert status == 200, doc
    status, doc, h = post("/v1/chat/completions", json.dumps(body()).encode(),
                          {"X-Polygw-Task": "web-1"})
    assert status == 200 and float(h["X-Polygw-Cost"]) == 0.25, (status, doc)
    status, doc, h = post("/v1/chat/completions", json.dumps(body()).encode(),
                          {"X-Polygw-Task": "web-1"})
    assert status == 429 and h["X-Polygw-Code"] == "budget_exhausted", (status, doc)
    assert doc["error"]["polygw"]["budget"] == "task:web-1:total", doc
    assert h["Retry-After"] is None, h  # a task's budget never resets
    req = urllib.request.Request(base + "/polygw/v1/tasks/web-1")
    with urllib.request.urlopen(req, timeout=10) as r:
        info = json.loads(r.read())
    assert info["state"] == "failed" and info["reason"] == "budget", info
    status, doc, _ = post("/polygw/v1/tasks/web-2/start", headers={"X-Polygw-Budget": "lots"})
    assert status == 400 and "X-Polygw-Budget" in doc["error"]["message"], doc
    status, doc, _ = post("/polygw/v1/tasks/web-3/start", b'{"budget": 2}')
    assert status == 200, doc


def test_budget__a_burst_of_200_calls_with_varying_costs_never_overshoots(make_sidecar, up):
    """200 calls at once against an app total of 40, each reserving 1.0
    (max_tokens 1000) and costing what its answer reports (100 .. 1000
    completion tokens, so 0.1 .. 1.0): the sum charged never passes the
    budget, every refusal is budget_exhausted, and the counters agree with
    the per-call costs to the last digit."""
    import random
    rnd = random.Random(30)
    sc = start(make_sidecar, up, app_budget={"total": 40})
    c = sc.connect()
    completions = [rnd.randint(100, 1000) for _ in range(200)]
    ids = [c.request_async("call", {"capability": "chat",
                                    "body": body(completion=n, delay_ms=rnd.randint(0, 200))})
           for n in completions]
    ok, refused, charged = burst_outcome([c.wait_response(i, 30) for i in ids])
    # Reservations, not real costs, refused the rest: what they held came
    # back as the burst settled.
    app = app_budget_stats(c)
    total = app["budget"]["total"]
    assert total["reserved"] == 0 and abs(total["spent"] - charged) < 1e-9, total
    assert abs(app["cost"] - charged) < 1e-9, app
    m = parse(metrics_text(sc))
    assert abs(value(m, "polygw_cost_total", source="s", app="default", model="other",
                     currency="USD") - charged) < 1e-9
    # One at a time, the budget is then spent down to less than one worst
    # case (1.0), never past it.
    served_after = 0
    while True:
        err, res, _ = call(c, "chat", body(completion=rnd.randint(100, 1000)))
        if err:
            break
        served_after += 1
        charged += res["cost"]
    assert err["code"] == "budget_exhausted" and 39 < charged <= 40 + 1e-9, (err, charged)
    assert abs(err["left"] - (40 - charged)) < 1e-9, (err, charged)
    print("burst: %d served, %d refused at once; then %d one by one; %.4f of 40 charged"
          % (len(ok), len(refused), served_after, charged))

"""Prometheus metrics (docs/METRICS.md) end to end: real calls through the
real sidecar against the mock upstream, then the counters they caused, read
with `polygwctl metrics` (the `metrics` method) and over the HTTP front's
`GET /metrics`, checked by `promtool check metrics`; and a real Prometheus
server scraping the HTTP front.

Every count asserted is the one the test caused: successes, a 429
saturation that ends `stalled`, an upstream 500 that exhausts the retry
budget, a task stopped during a call, a task failed by its watchdog. The
number of 429 attempts depends on backoff jitter, so it is taken from the
mock's own count and compared with the sidecar's.

Only 127.0.0.1 is used; every wait and loop is bounded.
"""
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import (POLYGWCTL, Pending, call, chat, config_yaml, sanitizer_env,  # noqa: E402
                      source_yaml)
from prometheus_fixture import Prometheus, free_port  # noqa: E402
from redis_fixture import FleetRedis, fleet_config, unique_prefix, wait_backend  # noqa: E402
from redis_fixture import source as fleet_source  # noqa: E402
from test_upstream import HANG_HOST, SHIM, shim_env  # noqa: E402  (the DNS shim's set-up)

SOURCE_DEFAULTS = {"timeout_s": 5, "connect_timeout_s": 2, "ttft_timeout_s": 0.3,
                   "idle_timeout_s": 5, "max_concurrency": 64, "aimd": {"initial": 64},
                   "breaker": {"failures": 100000}}
POLICY = {"max_attempts": 2, "stall_window_s": 0.5, "backoff_base_s": 0.05,
          "backoff_max_s": 0.1}
# Headers at once (so no TTFT deadline fires), then nothing: the call holds
# its attempt until something ends it.
HOLD = {"hang": "after_headers"}


# --------------------------------------------------------------- helpers
def start(make_sidecar, up, listen=None):
    sources = [source_yaml("a", "chat", up.url, SOURCE_DEFAULTS),
               source_yaml("e", "embedding", up.url, SOURCE_DEFAULTS)]
    return make_sidecar(config_text=config_yaml(sources, POLICY, listen=listen),
                        env={"no_proxy": "*", "NO_PROXY": "*"})


def ctl(sc, *args):
    env = sanitizer_env()
    env.pop("POLYGW_SOCKET", None)
    p = subprocess.run([POLYGWCTL, "--socket", sc.sock] + list(args), capture_output=True,
                       text=True, env=env, timeout=20)
    assert "runtime error:" not in p.stderr and "Sanitizer" not in p.stderr, p.stderr
    return p


def metrics_text(sc):
    p = ctl(sc, "metrics")
    assert p.returncode == 0, p.stderr
    return p.stdout


LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def parse(text):
    """{(name, ((label, value), ...)): value} of every sample line."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        assert m, "not a sample line: %r" % line
        labels, rest = [], m.group(2) or ""
        while rest:
            lm = LABEL.match(rest)
            assert lm, "bad labels in %r" % line
            value = re.sub(r'\\(.)', lambda e: "\n" if e.group(1) == "n" else e.group(1),
                           lm.group(2))
            labels.append((lm.group(1), value))
            rest = rest[lm.end():]
        key = (m.group(1), tuple(sorted(labels)))
        assert key not in out, "duplicate series %r" % line
        out[key] = float(m.group(3))
    return out


def value(samples, name, **labels):
    key = (name, tuple(sorted(labels.items())))
    if key not in samples:
        near = sorted("%s%s" % (n, dict(ls)) for n, ls in samples if n == name)
        raise AssertionError("no series %s%s; the family has: %s" % (name, labels, near))
    return samples[key]


def promtool_check(text):
    p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), \
        "promtool check metrics: rc %s\n%s%s" % (p.returncode, p.stdout, p.stderr)


# --------------------------------------------------------------- tests
def test_metrics__counts_what_the_calls_caused(make_sidecar, up):
    sc = start(make_sidecar, up)
    before = parse(metrics_text(sc))
    assert value(before, "polygw_calls_total", capability="chat", code="ok") == 0
    c = sc.connect()

    # Successes: two plain calls and one stream on `a`, one embedding on `e`.
    for text in ("one", "two"):
        err, res, _ = call(c, "chat", chat(text))
        assert err is None, err
    msgid = c.request_async("call", {"capability": "chat", "body": chat("three"),
                                     "stream": True})
    assert c.wait_response(msgid)[2] is None
    err, _, _ = call(c, "embedding", {"model": "m", "input": "x"})
    assert err is None, err

    # A 429 saturation on a scope that never made progress: stalled.
    err, _, _ = call(c, "chat", chat("sat", mock={"status": 429}), scope="sat")
    assert err["code"] == "stalled", err
    n429 = up.stats()["by_status"]["429"]
    assert n429 >= 1

    # Every embedding attempt answered 500: retry_exhausted after max_attempts.
    err, _, _ = call(c, "embedding", {"model": "m", "input": "y", "mock": {"status": 500}})
    assert err["code"] == "retry_exhausted" and err["attempts"] == 2, err

    # A task stopped while its call holds an attempt.
    assert c.request("task.start", {"task_id": "t-stop"})[0] is None
    held = Pending(sc, "chat", chat("held", mock=HOLD), task_id="t-stop")
    up.wait_stats(lambda s: s["in_progress"] == 1, timeout=3)
    assert c.request("task.stop", {"task_id": "t-stop", "reason": "user"})[0] is None
    assert held.wait()[0]["code"] == "task_stopped"
    # A call naming the stopped task is refused before it starts.
    assert call(c, "chat", chat("late"), task_id="t-stop")[0]["code"] == "task_stopped"

    # A task failed by its node watchdog while its call holds an attempt.
    assert c.request("task.start", {"task_id": "t-dog"})[0] is None
    assert c.request("task.node_begin", {"task_id": "t-dog", "node": "n",
                                         "timeout_s": 0.3})[0] is None
    dog = Pending(sc, "chat", chat("dog", mock=HOLD), task_id="t-dog")
    assert dog.wait()[0]["code"] == "watchdog_timeout"
    up.wait_stats(lambda s: s["in_progress"] == 0, timeout=3)

    text = metrics_text(sc)
    promtool_check(text)
    m = parse(text)
    v = lambda name, **kw: value(m, name, **kw)  # noqa: E731

    # Calls by capability and code; the duration histogram counts every one.
    assert v("polygw_calls_total", capability="chat", code="ok") == 3
    assert v("polygw_calls_total", capability="chat", code="stalled") == 1
    assert v("polygw_calls_total", capability="chat", code="task_stopped") == 2
    assert v("polygw_calls_total", capability="chat", code="watchdog_timeout") == 1
    assert v("polygw_calls_total", capability="embedding", code="ok") == 1
    assert v("polygw_calls_total", capability="embedding", code="retry_exhausted") == 1
    assert v("polygw_calls_total", capability="chat", code="retry_exhausted") == 0
    assert v("polygw_calls_total", capability="embedding", code="stalled") == 0
    assert v("polygw_call_duration_seconds_count", capability="chat") == 7
    assert v("polygw_call_duration_seconds_bucket", capability="chat", le="+Inf") == 7
    assert v("polygw_call_duration_seconds_count", capability="embedding") == 2
    assert v("polygw_call_ttft_seconds_count", capability="chat") == 1  # the stream
    # The stalled call spent more than the window charged to the stall budget.
    stalled = v("polygw_call_stalled_seconds_sum", capability="chat")
    assert POLICY["stall_window_s"] <= stalled < 5, stalled
    assert v("polygw_call_stalled_seconds_count", capability="chat") == 7
    assert v("polygw_calls_in_flight", capability="chat") == 0
    assert v("polygw_calls_waiting", capability="chat") == 0

    # Attempts per source by outcome, as the mock saw them.
    a = dict(source="a", capability="chat")
    e = dict(source="e", capability="embedding")
    assert v("polygw_upstream_attempts_total", outcome="success", **a) == 3
    assert v("polygw_upstream_attempts_total", outcome="rate_limited", **a) == n429
    assert v("polygw_upstream_attempts_total", outcome="cancelled", **a) == 2
    assert v("polygw_upstream_attempts_total", outcome="transient", **a) == 0
    assert v("polygw_upstream_attempts_total", outcome="success", **e) == 1
    assert v("polygw_upstream_attempts_total", outcome="transient", **e) == 2
    assert v("polygw_upstream_attempt_failures_total", reason="http_429", **a) == n429
    assert v("polygw_upstream_attempt_failures_total", reason="http_5xx", **e) == 2
    assert up.stats()["requests"] == 3 + n429 + 2 + 1 + 2
    # Ended attempts (not the two torn down) have a duration and, since each
    # got a status line, a time to first byte.
    assert v("polygw_upstream_attempt_duration_seconds_count", **a) == 3 + n429
    assert v("polygw_upstream_ttft_seconds_count", **a) == 3 + n429
    assert v("polygw_upstream_ttft_seconds_count", **e) == 3
    assert v("polygw_source_in_flight", **a) == 0
    assert v("polygw_source_breaker_state", state="closed", **a) == 1
    assert v("polygw_source_aimd_limit", **a) >= 1

    # Tasks: the user stop and the watchdog firing are separate counters.
    assert v("polygw_tasks_stopped_total") == 1
    assert v("polygw_task_watchdog_firings_total") == 1
    assert v("polygw_task_watchdog_after_stop_total") == 0
    assert v("polygw_tasks", state="failed", reason_kind="stopped") == 1
    assert v("polygw_tasks", state="failed", reason_kind="watchdog") == 1
    assert v("polygw_tasks", state="running") == 0
    assert v("polygw_tasks_started_total") == 2

    # Socket-level error responses, every method (the calls above, nothing else).
    assert v("polygw_error_responses_total", code="stalled") == 1
    assert v("polygw_error_responses_total", code="watchdog_timeout") == 1
    assert v("polygw_error_responses_total", code="bad_request") == 0
    assert v("polygw_upstream_dns_abandoned_total") == 0
    assert v("polygw_backend_up", kind="memory") == 1
    held.close()
    dog.close()


def test_metrics__connections(make_sidecar, up):
    sc = start(make_sidecar, up, listen={"max_connections": 3})
    base = parse(metrics_text(sc))
    conns = [sc.connect() for _ in range(3)]
    for c in conns:  # each is accepted and served
        assert c.request("ping")[0] is None
    # The fourth is over max_connections: told why, then closed.
    extra = sc.connect()
    msgs = extra.expect_eof()
    assert msgs and msgs[0][0] == 2 and msgs[0][2][0]["code"] == "overloaded", msgs
    extra.close()
    conns.pop().close()
    # polygwctl needs the slot the closed connection frees.
    ok = None
    for _ in range(100):
        p = ctl(sc, "metrics")
        if p.returncode == 0:
            ok = p.stdout
            break
        time.sleep(0.02)
    assert ok is not None, "polygwctl never got a connection"
    m = parse(ok)
    acc = "polygw_connections_accepted_total"
    # 3 test connections, the refused one is not accepted, plus this polygwctl
    # (and any earlier polygwctl tries that were refused count as refused).
    refused = value(m, "polygw_connections_refused_total")
    assert refused >= 1
    assert value(m, acc) - value(base, acc) == 3 + 1
    assert value(m, "polygw_connections_open") == 2 + 1
    assert value(m, "polygw_error_responses_total", code="overloaded") == refused
    for c in conns:
        c.close()


def test_metrics__polygwctl_metrics_forms(make_sidecar, up):
    sc = start(make_sidecar, up)
    p = ctl(sc, "metrics", "extra")
    assert p.returncode == 2 and "takes no arguments" in p.stderr
    p = ctl(sc, "--json", "metrics")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert list(doc) == ["text"] and doc["text"].startswith("# HELP polygw_")
    # The raw method answers the same map; parameters are refused like stats'.
    c = sc.connect()
    err, res = c.request("metrics")
    assert err is None and set(res) == {"text"}
    promtool_check(res["text"])
    err, _ = c.request("metrics", {"unexpected": 1})
    assert err["code"] == "bad_request"
    assert "polygwctl" in ctl(sc, "--help").stdout and "metrics" in ctl(sc, "--help").stdout
    p = subprocess.run([POLYGWCTL, "--socket", os.path.join(sc.dir, "none.sock"), "metrics"],
                       capture_output=True, text=True, env=sanitizer_env(), timeout=20)
    assert p.returncode == 3


def start_http(make_sidecar, up):
    """A sidecar with its HTTP front on a free loopback port: (sidecar, "host:port")."""
    port = free_port()
    sources = [source_yaml("a", "chat", up.url, SOURCE_DEFAULTS)]
    text = config_yaml(sources, POLICY) + "http:\n  listen: 127.0.0.1:%d\n" % port
    sc = make_sidecar(config_text=text, env={"no_proxy": "*", "NO_PROXY": "*"})
    target = "127.0.0.1:%d" % port
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return sc, target
        except OSError:
            assert time.monotonic() < deadline, "the HTTP front does not listen"
            time.sleep(0.05)


def http_get(target, path):
    """(status, content type, body text) of one GET over the HTTP front."""
    with urllib.request.urlopen("http://%s%s" % (target, path), timeout=10) as r:
        return r.status, r.headers.get("Content-Type"), r.read().decode()


def http_chat(target, text):
    """One chat call over the HTTP front; its status."""
    body = json.dumps(chat(text)).encode()
    req = urllib.request.Request("http://%s/v1/chat/completions" % target, data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code


def openai_reply(prompt, cached):
    """A chat.completion body whose usage reports `cached` of `prompt`
    prompt tokens read from the provider's prompt cache."""
    return json.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "model-o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5,
                  "prompt_tokens_details": {"cached_tokens": cached}}})


def anthropic_reply(fresh, written, read):
    return json.dumps({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "model-a",
        "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": fresh, "cache_creation_input_tokens": written,
                  "cache_read_input_tokens": read, "output_tokens": 5}})


def test_metrics__cached_share_of_prompt_tokens_by_source(make_sidecar, up, up2):
    """polygw_source_prompt_tokens_total and
    polygw_source_cached_prompt_tokens_total count what the upstream reports:
    OpenAI's prompt_tokens_details.cached_tokens (read from a tree for a
    msgpack caller, without one for the HTTP front) and Anthropic's
    cache_read_input_tokens (its prompt is input + cache writes + cache
    reads). A cached count above the prompt, or one that cannot be true, is
    not counted; the prompt still is."""
    port = free_port()
    sources = [source_yaml("oa", "chat", up.url, SOURCE_DEFAULTS, model="model-o"),
               source_yaml("an", "chat", up2.url, SOURCE_DEFAULTS, model="model-a",
                           kind="anthropic", api_key_env="POLYGW_TEST_KEY")]
    text = config_yaml(sources, POLICY) + "http:\n  listen: 127.0.0.1:%d\n" % port
    sc = make_sidecar(config_text=text, env={"no_proxy": "*", "NO_PROXY": "*",
                                             "POLYGW_TEST_KEY": "sk-test"})
    c = sc.connect()
    before = parse(metrics_text(sc))
    for src in ("oa", "an"):
        assert value(before, "polygw_source_prompt_tokens_total", source=src,
                     capability="chat") == 0
        assert value(before, "polygw_source_cached_prompt_tokens_total", source=src,
                     capability="chat") == 0

    def ok(body):
        err, res, _ = call(c, "chat", body)
        assert err is None, err
        return res

    ok(chat(model="model-o", mock={"body": openai_reply(100, 80)}))
    ok(chat(model="model-o", mock={"body": openai_reply(100, 200)}))  # cached > prompt
    bogus = json.loads(openai_reply(100, 1))
    bogus["usage"]["prompt_tokens_details"]["cached_tokens"] = "1"
    res = ok(chat(model="model-o", mock={"body": json.dumps(bogus)}))  # dropped alone
    assert res["usage"]["prompt_tokens"] == 100
    # The HTTP front reads the reply without a tree.
    body = json.dumps(chat(model="model-o", mock={"body": openai_reply(50, 30)})).encode()
    req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % port, data=body,
                                 headers={"Content-Type": "application/json"})
    deadline = time.monotonic() + 10
    while True:
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.status == 200
                assert json.loads(r.read())["usage"]["prompt_tokens_details"] == \
                    {"cached_tokens": 30}
            break
        except urllib.error.URLError:
            assert time.monotonic() < deadline, "the HTTP front does not listen"
            time.sleep(0.05)
    ok({"model": "model-a", "max_tokens": 16, "messages": [{"role": "user", "content": "x"}],
        "mock": {"body": anthropic_reply(20, 10, 70)}})

    after = parse(metrics_text(sc))
    assert value(after, "polygw_source_prompt_tokens_total", source="oa",
                 capability="chat") == 350
    assert value(after, "polygw_source_cached_prompt_tokens_total", source="oa",
                 capability="chat") == 110
    assert value(after, "polygw_source_prompt_tokens_total", source="an",
                 capability="chat") == 100
    assert value(after, "polygw_source_cached_prompt_tokens_total", source="an",
                 capability="chat") == 70


RULES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "deploy", "prometheus", "polygw-rules.yml")


def test_metrics__rules_file_is_valid():
    p = subprocess.run(["promtool", "check", "rules", RULES], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr


def test_metrics__served_over_http_and_valid(make_sidecar, up):
    """GET /metrics on the HTTP front is the same exposition as the `metrics`
    method, with the text format's content type, and promtool accepts it."""
    sc, target = start_http(make_sidecar, up)
    assert http_chat(target, "over http") == 200
    assert call(sc.connect(), "chat", chat("over msgpack"))[0] is None
    status, ctype, text = http_get(target, "/metrics")
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4"), (status, ctype)
    promtool_check(text)
    samples = parse(text)
    assert value(samples, "polygw_calls_total", capability="chat", code="ok") == 2
    assert value(samples, "polygw_upstream_attempts_total", source="a", capability="chat",
                 outcome="success") == 2
    # The same counters as the msgpack method reads.
    via_rpc = parse(metrics_text(sc))
    assert value(via_rpc, "polygw_calls_total", capability="chat", code="ok") == 2


def test_metrics__scraped_by_a_real_prometheus(make_sidecar, up):
    """Prometheus scrapes the HTTP front's GET /metrics every second and
    finds the calls the test caused (over HTTP and over msgpack); the rules
    of deploy/prometheus evaluate on it, and the stall alert goes pending on
    the stalled call."""
    sc, target = start_http(make_sidecar, up)
    c = sc.connect()
    assert http_chat(target, "p0") == 200
    for i in (1, 2):
        assert call(c, "chat", chat("p%d" % i))[0] is None
    with Prometheus(target, metrics_path="/metrics", scrape_interval_s=1,
                    rule_files=[RULES]) as prom:
        ok = 'polygw_calls_total{job="polygw",capability="chat",code="ok"}'
        r = prom.wait_for(ok, lambda r: len(r) == 1 and r[0][1] == 3, timeout=20)
        assert r[0][0]["instance"] == target
        assert prom.query('up{job="polygw"}')[0][1] == 1
        health = [t for t in prom.targets() if t["scrapePool"] == "polygw"]
        assert health and health[0]["health"] == "up" and not health[0]["lastError"]
        # Later calls reach Prometheus on a later scrape.
        assert call(c, "chat", chat("late", mock={"status": 429}), scope="p429")[0]["code"] \
            == "stalled"
        assert http_chat(target, "p3") == 200
        prom.wait_for(ok, lambda r: len(r) == 1 and r[0][1] == 4, timeout=20)
        prom.wait_for('polygw_calls_total{capability="chat",code="stalled"}',
                      lambda r: len(r) == 1 and r[0][1] == 1, timeout=20)
        prom.wait_for('polygw_call_duration_seconds_count{capability="chat"}',
                      lambda r: len(r) == 1 and r[0][1] == 5, timeout=20)
        # A histogram Prometheus can compute quantiles from.
        q = prom.query('histogram_quantile(0.5, polygw_call_duration_seconds_bucket'
                       '{capability="chat"})')
        assert len(q) == 1 and 0 <= q[0][1] <= 5, q
        assert prom.query('polygw_upstream_attempts_total{source="a",'
                          'outcome="rate_limited"}')[0][1] == up.stats()["by_status"]["429"]
        # The stalled call, scraped after a 0, raises the stall alert.
        prom.wait_for('ALERTS{alertname="PolygwCallsStalled",capability="chat"}',
                      lambda r: len(r) == 1 and r[0][0]["alertstate"] == "pending",
                      timeout=20)
        prom.wait_for('polygw:upstream_attempts:rate5m{source="a",outcome="success"}',
                      lambda r: len(r) == 1 and r[0][1] > 0, timeout=20)
        rules = [r for g in prom.rules() for r in g["rules"]]
        assert len(rules) == 9 and all(r["health"] == "ok" for r in rules), rules
        assert not [a for a in prom.alerts() if a["labels"]["alertname"] != "PolygwCallsStalled"]
        # More than one scrape happened: Prometheus saw the counter move.
        assert prom.query('changes(%s[1m])' % ok)[0][1] >= 1


@pytest.fixture
def redis_srv():
    srv = FleetRedis().start()
    yield srv
    srv.cleanup()


def test_metrics__redis_backend(redis_srv, up, make_sidecar):
    """With backend redis: the Redis families appear, round trips are
    counted as the adapter counts them, the breaker is the fleet's. Redis
    frozen (SIGSTOP): the admission times out, the call fails closed, and
    the timeout, the failed admission and the lost connection show."""
    cfg = fleet_config(redis_srv.url(), unique_prefix(), [fleet_source("a", "chat", up.url)],
                       backend={"command_timeout_s": 0.3, "lease_ttl_s": 3})
    sc = make_sidecar(config_text=cfg, env={"no_proxy": "*", "NO_PROXY": "*"})
    wait_backend(sc, up=True)
    c = sc.connect()
    for text in ("r1", "r2"):
        assert call(c, "chat", chat(text))[0] is None
    text = metrics_text(sc)
    promtool_check(text)
    m = parse(text)
    v = lambda name, **kw: value(m, name, **kw)  # noqa: E731
    st = c.request("stats")[1]
    assert v("polygw_backend_up", kind="redis") == 1
    assert v("polygw_redis_subscribed") == 1
    # Two admitted attempts: at least their admit and release round trips.
    assert 4 <= v("polygw_redis_round_trip_seconds_count") <= v("polygw_redis_commands_total")
    assert v("polygw_redis_round_trip_seconds_count") <= st["backend"]["replies"]
    assert v("polygw_redis_round_trip_seconds_bucket", le="+Inf") == \
        v("polygw_redis_round_trip_seconds_count")
    for kind in ("reply", "timeout", "connection_lost", "not_connected"):
        assert v("polygw_redis_failures_total", kind=kind) == 0
    assert v("polygw_redis_connects_total") >= 2  # commands and subscriber
    assert v("polygw_fleet_admissions_total", result="admitted") == 2 == st["shared"]["admitted"]
    assert v("polygw_fleet_admissions_total", result="error") == 0
    assert v("polygw_source_breaker_state", source="a", capability="chat", state="closed") == 1
    assert not [k for k in m if k[0] in ("polygw_source_breaker_opened_total",
                                         "polygw_source_bucket_level")]
    assert v("polygw_calls_total", capability="chat", code="ok") == 2

    redis_srv.freeze()
    try:
        err, _, _ = call(c, "chat", chat("frozen"))
        assert err["code"] == "backend_unavailable", err
        text = metrics_text(sc)
    finally:
        redis_srv.thaw()
    promtool_check(text)
    m = parse(text)
    assert value(m, "polygw_calls_total", capability="chat", code="backend_unavailable") == 1
    assert value(m, "polygw_fleet_admissions_total", result="error") == 1
    assert value(m, "polygw_redis_failures_total", kind="timeout") >= 1
    # A timed-out command makes the adapter drop and re-make its connection.
    assert value(m, "polygw_redis_disconnects_total") >= 1
    wait_backend(sc, up=True)
    assert call(c, "chat", chat("back"))[0] is None


def test_metrics__dns_lookup_abandoned(make_sidecar, up):
    """A source whose host name never resolves (the LD_PRELOAD shim of
    tests/shim/dnshang.c hangs its getaddrinfo): the attempt ends at its
    connect deadline, the lookup is abandoned (its thread detached), and the
    metrics say so."""
    assert os.path.exists(SHIM), "DNS shim not built: %s (run make)" % SHIM
    sources = [source_yaml("h", "chat", "http://%s:1/v1" % HANG_HOST, SOURCE_DEFAULTS,
                           connect_timeout_s=0.3)]
    env = {"no_proxy": "*", "NO_PROXY": "*"}
    env.update(shim_env())
    sc = make_sidecar(config_text=config_yaml(sources, dict(POLICY, max_attempts=1)), env=env)
    c = sc.connect()
    err, _, _ = call(c, "chat", chat("dns"))
    assert err["code"] == "retry_exhausted" and err["sources"][0]["reason"] == "dns_timeout", err
    m = parse(metrics_text(sc))
    h = dict(source="h", capability="chat")
    assert value(m, "polygw_upstream_dns_lookups_total") == 1
    assert value(m, "polygw_upstream_dns_abandoned_total") == 1
    assert value(m, "polygw_upstream_timeouts_total", phase="resolving") == 1
    assert value(m, "polygw_upstream_attempt_failures_total", reason="dns_timeout", **h) == 1
    assert value(m, "polygw_upstream_attempts_total", outcome="transient", **h) == 1
    assert value(m, "polygw_upstream_ttft_seconds_count", **h) == 0  # never got a byte
    assert value(m, "polygw_calls_total", capability="chat", code="retry_exhausted") == 1

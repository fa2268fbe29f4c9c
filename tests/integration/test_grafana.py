"""deploy/grafana/polygw-dashboard.json against the real sidecar and a real
Prometheus: the file is valid JSON in Grafana's dashboard form, every metric
it names is a family the running sidecar exposes on GET /metrics and that
docs/METRICS.md documents, it covers the families an operator needs (calls
by outcome, latency histograms, breaker, AIMD, in flight, waiting, tokens,
per app), and every PromQL expression, its template variables filled in as
Grafana would, evaluates without error in Prometheus scraping that
sidecar; the breaker panel's arithmetic reads open as 2 and closed as 0."""
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import ROOT, chat, config_yaml, source_yaml  # noqa: E402
from prometheus_fixture import Prometheus, free_port  # noqa: E402
from test_metrics import POLICY, SOURCE_DEFAULTS, http_chat, http_get  # noqa: E402

DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "polygw-dashboard.json")
METRICS_MD = os.path.join(ROOT, "docs", "METRICS.md")
NAME = re.compile(r"\bpolygw_[a-z0-9_]+")
# What Grafana substitutes: every variable set to "All" (allValue ".*").
VARS = {"$__rate_interval": "1m", "$instance": ".*", "$capability": ".*", "$source": ".*"}
NEEDED = {"polygw_calls_total", "polygw_upstream_attempts_total", "polygw_call_duration_seconds",
          "polygw_upstream_attempt_duration_seconds", "polygw_source_breaker_state",
          "polygw_source_aimd_limit", "polygw_source_in_flight", "polygw_calls_in_flight",
          "polygw_calls_waiting", "polygw_source_bucket_level", "polygw_source_tokens_total",
          "polygw_app_in_flight", "polygw_app_attempts_admitted_total"}


def dashboard():
    with open(DASHBOARD, encoding="utf-8") as f:
        return json.load(f)


def panels(d):
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])        # panels inside a collapsed row


def exprs(d):
    """(panel title, expr) of every query target."""
    return [(p["title"], t["expr"]) for p in panels(d) for t in p.get("targets", [])]


def fill(expr):
    for k, v in VARS.items():
        expr = expr.replace(k, v)
    assert "$" not in expr, expr
    return expr


def exposed_families(target):
    """{family: type} from the `# TYPE` lines of the sidecar's GET /metrics."""
    status, _, text = http_get(target, "/metrics")
    assert status == 200
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def family_of(name, families):
    if name in families:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[:-len(suffix)]
        if name.endswith(suffix) and families.get(base) == "histogram":
            return base
    return None


def start(make_sidecar, up):
    """Sources a (its breaker opens after 2 failures) and b, HTTP on loopback."""
    port = free_port()
    src = dict(SOURCE_DEFAULTS, breaker={"failures": 2, "cooldown_s": 300},
               limits={"rpm": 1000, "tpm": 100000})
    text = (config_yaml([source_yaml("a", "chat", up.url, src),
                         source_yaml("b", "embedding", up.url, src, model="emb-1")], POLICY) +
            "apps:\n  - {name: ops, uids: [0], admin: true}\n"
            "http:\n  listen: 127.0.0.1:%d\n" % port)
    sc = make_sidecar(config_text=text, env={"no_proxy": "*", "NO_PROXY": "*"})
    target = "127.0.0.1:%d" % port
    for _ in range(200):
        try:
            http_get(target, "/healthz")
            return sc, target
        except OSError:
            time.sleep(0.05)
    raise AssertionError("the HTTP front does not listen")


def test_grafana__dashboard_is_grafana_json_with_unique_ids():
    d = dashboard()
    assert d["uid"] == "polygw" and d["title"] and d["schemaVersion"] >= 36
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids)), ids
    names = {v["name"] for v in d["templating"]["list"]}
    assert names == {"datasource", "instance", "capability", "source"}
    for p in panels(d):
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
    used = {m for _, e in exprs(d) for m in NAME.findall(e)}
    missing = {f for f in NEEDED if not any(u == f or u.startswith(f + "_") for u in used)}
    assert not missing, missing


def test_grafana__every_metric_is_exposed_and_documented(make_sidecar, up):
    sc, target = start(make_sidecar, up)
    assert http_chat(target, "one") == 200
    families = exposed_families(target)
    doc = open(METRICS_MD, encoding="utf-8").read()
    d = dashboard()
    queries = exprs(d) + [(v["name"], v["query"]["query"]) for v in d["templating"]["list"]
                          if v["type"] == "query"]
    for title, expr in queries:
        for name in NAME.findall(expr):
            fam = family_of(name, families)
            assert fam, "%s: %s is not exposed by the sidecar" % (title, name)
            assert "`%s`" % fam in doc, "%s: %s is not in docs/METRICS.md" % (title, fam)


def test_grafana__every_expr_evaluates_in_a_real_prometheus(make_sidecar, up):
    sc, target = start(make_sidecar, up)
    assert http_chat(target, "one") == 200
    # Trip source a's breaker: its call fails twice (2 attempts, both 500).
    up.script([{"status": 500}, {"status": 500}])
    assert http_chat(target, "boom") >= 500
    d = dashboard()
    with Prometheus(target, metrics_path="/metrics", scrape_interval_s=1) as prom:
        prom.wait_for('count(polygw_build_info{job="polygw"})', lambda r: r and r[0][1] == 1,
                      timeout=20)
        time.sleep(2.5)                        # a few scrapes, for rate() over them
        for title, expr in exprs(d):
            result = prom.query(fill(expr))    # an expression that errors raises here
            if not re.search(r"\b(rate|increase|histogram_quantile)\(", expr):
                assert result, "%s: %s selects nothing" % (title, expr)
        for v in d["templating"]["list"]:
            if v["type"] == "query":           # label_values(SELECTOR, LABEL)
                m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"]["query"])
                assert m, v
                assert prom.query(fill(m.group(1))), v["name"]
        [breaker] = [fill(e) for t, e in exprs(d) if t == "Breaker state"]
        state = {r[0]["source"]: r[1] for r in prom.query(breaker)}
        assert state == {"a": 2.0, "b": 0.0}, state
        assert len(exprs(d)) >= 25

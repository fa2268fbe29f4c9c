"""What calls cost (docs/CONFIG.md §7d, proto/PROTOCOL.md §4.3), end to end:
real calls through the real sidecar against the mock upstream, whose replies
carry every dialect's usage shape, then the cost where it is reported — the
call's result (`cost` over msgpack, X-Polygw-Cost over HTTP), the access
log, `stats` (per source, per app, the currency) and /metrics
(polygw_cost_total and polygw_tokens_total by class).

Prices are per million tokens of each class; the replies use round counts
so that every expected cost is computed here by hand from the classes. A
source without prices reports no cost anywhere, never 0.
"""
import json
import math
import os
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import call, chat, config_yaml, source_yaml  # noqa: E402
from prometheus_fixture import free_port  # noqa: E402
from test_metrics import metrics_text, parse, promtool_check, value  # noqa: E402
from test_providers import stream_call  # noqa: E402

FAST = {"timeout_s": 5, "connect_timeout_s": 2, "ttft_timeout_s": 2, "idle_timeout_s": 5,
        "max_concurrency": 64, "aimd": {"initial": 64}}
POLICY = {"max_attempts": 2, "stall_window_s": 5, "backoff_base_s": 0.05, "backoff_max_s": 0.1}
ENV = {"no_proxy": "*", "NO_PROXY": "*", "POLYGW_TEST_KEY": "sk-test"}
# input, cached_input, cache_write, output, reasoning
OA_PRICES = {"input": 2.5, "cached_input": 1.25, "output": 10, "reasoning": 12}
AN_PRICES = {"input": 3, "cached_input": 0.3, "cache_write": 3.75, "output": 15}


def openai_reply(prompt, cached, completion, reasoning):
    return json.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "model-o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion,
                  "prompt_tokens_details": {"cached_tokens": cached},
                  "completion_tokens_details": {"reasoning_tokens": reasoning}}})


def oa_cost(prompt, cached, completion, reasoning):
    return ((prompt - cached) * 2.5 + cached * 1.25 + (completion - reasoning) * 10 +
            reasoning * 12) / 1e6


def anthropic_sse(fresh, written, read, out):
    events = [
        {"type": "message_start", "message": {
            "id": "m", "type": "message", "role": "assistant", "model": "model-a", "content": [],
            "usage": {"input_tokens": fresh, "cache_creation_input_tokens": written,
                      "cache_read_input_tokens": read, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "text_delta", "text": "hi"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
         "usage": {"output_tokens": out}},
        {"type": "message_stop"}]
    return "".join("event: %s\ndata: %s\n\n" % (e["type"], json.dumps(e)) for e in events)


def an_cost(fresh, written, read, out):
    return (fresh * 3 + read * 0.3 + written * 3.75 + out * 15) / 1e6


def start(make_sidecar, up, up2, currency=None, http_port=None):
    sources = [source_yaml("oa", "chat", up.url, FAST, model="model-o", prices=OA_PRICES),
               source_yaml("an", "chat", up2.url, FAST, model="model-a", kind="anthropic",
                           api_key_env="POLYGW_TEST_KEY", prices=AN_PRICES),
               source_yaml("free", "chat", up.url, FAST, model="model-f")]
    text = config_yaml(sources, POLICY)
    if currency:
        text = text.replace("server:\n", "server:\n  currency: %s\n" % currency, 1)
    if http_port:
        text += "http:\n  listen: 127.0.0.1:%d\n" % http_port
    return make_sidecar(config_text=text, env=ENV)


def ok(c, body, **params):
    err, res, _ = call(c, "chat", body, **params)
    assert err is None, err
    return res


def access_costs(sc):
    """{msgid: cost} of the access log's call lines."""
    out = {}
    for line in sc.logs().splitlines():
        if '"msg":"call"' in line:
            e = json.loads(line)
            out[e["msgid"]] = e.get("cost")
    return out


def test_cost__per_call_from_real_usage_everywhere(make_sidecar, up, up2):
    sc = start(make_sidecar, up, up2)
    c = sc.connect()
    costs = []
    # OpenAI Chat Completions: cached and reasoning tokens priced as such.
    for usage in ((1000, 800, 200, 150), (400, 0, 40, 0), (1000, 1000, 10, 10)):
        res = ok(c, chat(model="model-o", mock={"body": openai_reply(*usage)}))
        assert math.isclose(res["cost"], oa_cost(*usage), rel_tol=1e-9), (usage, res)
        costs.append(res["cost"])
    # Anthropic, streamed: message_start's cache reads and writes, then
    # message_delta's output; the cost is in the stream's final result.
    body = {"model": "model-a", "max_tokens": 64, "messages": [{"role": "user", "content": "x"}],
            "mock": {"body": anthropic_sse(20, 100, 900, 50), "content_type": "text/event-stream"}}
    chunks, err, res = stream_call(c, "chat", body)
    assert err is None, err
    assert math.isclose(res["cost"], an_cost(20, 100, 900, 50), rel_tol=1e-9), res
    an = res["cost"]
    # An unpriced source: usage as always, no cost (never 0).
    res = ok(c, chat(model="model-f", mock={"body": openai_reply(100, 0, 10, 0)}))
    assert res["usage"]["prompt_tokens"] == 100 and "cost" not in res, res

    err, stats = c.request("stats")
    assert err is None, err
    assert stats["currency"] == "USD"
    by_name = {s["name"]: s for s in stats["sources"]}
    assert math.isclose(by_name["oa"]["cost"], sum(costs), rel_tol=1e-9)
    assert math.isclose(by_name["an"]["cost"], an, rel_tol=1e-9)
    assert by_name["free"]["cost"] is None
    app = {a["name"]: a for a in stats["apps"]}["default"]
    assert math.isclose(app["cost"], sum(costs) + an, rel_tol=1e-9)

    text = metrics_text(sc)
    promtool_check(text)
    m = parse(text)
    assert math.isclose(value(m, "polygw_cost_total", source="oa", app="default", model="model-o",
                              currency="USD"), sum(costs), rel_tol=1e-6)
    assert math.isclose(value(m, "polygw_cost_total", source="an", app="default", model="model-a",
                              currency="USD"), an, rel_tol=1e-6)
    assert not [k for k in m if k[0] == "polygw_cost_total" and ("source", "free") in k[1]]
    classes = {cl: value(m, "polygw_tokens_total", source="oa", app="default", model="model-o",
                         **{"class": cl})
               for cl in ("input", "cached_input", "cache_write", "output", "reasoning")}
    assert classes == {"input": 600, "cached_input": 1800, "cache_write": 0, "output": 90,
                       "reasoning": 160}, classes
    classes = {cl: value(m, "polygw_tokens_total", source="an", app="default", model="model-a",
                         **{"class": cl})
               for cl in ("input", "cached_input", "cache_write", "output", "reasoning")}
    assert classes == {"input": 20, "cached_input": 900, "cache_write": 100, "output": 50,
                       "reasoning": 0}, classes
    assert value(m, "polygw_tokens_total", source="free", app="default", model="model-f",
                 **{"class": "input"}) == 100

    logged = [v for v in access_costs(sc).values()]
    assert len(logged) == 5, logged
    assert logged.count(None) == 1, logged  # the unpriced call's line has no cost
    assert sorted(round(v, 9) for v in logged if v is not None) == \
        sorted(round(v, 9) for v in costs + [an])


def test_cost__http_front_header_and_currency(make_sidecar, up, up2):
    port = free_port()
    sc = start(make_sidecar, up, up2, currency="EUR", http_port=port)
    sc.connect()  # ready
    body = json.dumps(chat(model="model-o", mock={"body": openai_reply(1000, 800, 200, 150)}))
    req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % port,
                                 data=body.encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
        assert math.isclose(float(r.headers["X-Polygw-Cost"]), oa_cost(1000, 800, 200, 150),
                            rel_tol=1e-8), r.headers
        r.read()
    body = json.dumps(chat(model="model-f", mock={"body": openai_reply(10, 0, 1, 0)}))
    req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % port,
                                 data=body.encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200 and r.headers["X-Polygw-Cost"] is None, r.headers
        r.read()
    err, stats = sc.connect().request("stats")
    assert err is None and stats["currency"] == "EUR"
    m = parse(metrics_text(sc))
    assert math.isclose(value(m, "polygw_cost_total", source="oa", app="default",
                              model="model-o", currency="EUR"),
                        oa_cost(1000, 800, 200, 150), rel_tol=1e-6)

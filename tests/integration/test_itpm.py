"""Input and output token limits (docs/CONFIG.md §7, limits.itpm / otpm)
through the real sidecar and the mock upstream: Anthropic does not count
prompt tokens read from its cache against its input-token limit, and a
source of kind anthropic does not either (limits.cached_input_counts
false by default), so cache-heavy agent traffic is not throttled early.

Each answer reports 50 fresh input tokens and 5000 read from the cache.
The same ten calls pass an itpm of 2000 one after the other, and fail
`stalled` against a tpm of 2000 (which counts every prompt token, as every
limit did before itpm) or an itpm that counts cache reads.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import call, config_yaml, source_yaml  # noqa: E402

FAST = {"timeout_s": 5, "connect_timeout_s": 2, "ttft_timeout_s": 0.4, "idle_timeout_s": 5,
        "max_concurrency": 8, "kind": "anthropic", "api_key_env": "PGW_T_KEY"}
POLICY = {"max_attempts": 1, "stall_window_s": 0.5, "backoff_base_s": 0.05,
          "backoff_max_s": 0.1}


def reply():
    return json.dumps({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "c",
        "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
        "usage": {"input_tokens": 50, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 5000, "output_tokens": 10}})


def body(model):
    return {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "x"}],
            "mock": {"body": reply()}}


def cache_sources(up):
    """The three sources of the cache-heavy case (models m-itpm, m-tpm,
    m-counted), also run on the Redis backend (test_redis_itpm.py)."""
    return [
        source_yaml("fresh", "chat", up.url, FAST, model="m-itpm",
                    limits={"itpm": 2000, "otpm": 500}),
        source_yaml("total", "chat", up.url, FAST, model="m-tpm", limits={"tpm": 2000}),
        source_yaml("counted", "chat", up.url, FAST, model="m-counted",
                    limits={"itpm": 2000, "cached_input_counts": True}),
    ]


def test_itpm__cache_reads_do_not_count_for_anthropic(make_sidecar, up):
    sources = cache_sources(up)
    sc = make_sidecar(config_text=config_yaml(sources, POLICY), env={"PGW_T_KEY": "sk-test"})
    c = sc.connect()
    results = {}
    for model in ("m-itpm", "m-tpm", "m-counted"):
        codes = []
        for _ in range(10):
            err, res, _ = call(c, "chat", body(model), timeout=10)
            codes.append(err["code"] if err else "ok")
            if err:
                break
        results[model] = codes
    # 10 x 50 fresh input tokens fit in 2000; 10 x 10 output tokens in 500.
    assert results["m-itpm"] == ["ok"] * 10, results
    # 5050 prompt tokens put a limit of 2000 in debt: the next call waits
    # minutes for the refill, past its stall window.
    assert results["m-tpm"] == ["ok", "stalled"], results
    assert results["m-counted"] == ["ok", "stalled"], results
    err, stats = c.request("stats")
    used = {s["name"]: s["tokens_used"] for s in stats["sources"]}
    assert used == {"fresh": 50600, "total": 5060, "counted": 5060}, used


def test_itpm__an_apps_own_input_and_output_limits(make_sidecar, up):
    # apps[i].limits.itpm / otpm bound the app's calls over every source,
    # counting input as the source serving the call does (kind anthropic:
    # cache reads left out). One unlimited source; the default app limited.
    results = {}
    for name, limits in (("itpm", {"itpm": 2000}), ("tpm", {"tpm": 2000}),
                         ("otpm", {"otpm": 20})):
        text = config_yaml([source_yaml("s", "chat", up.url, FAST, model="m")], POLICY)
        text += "apps:\n  - name: default\n    limits: %s\n" % json.dumps(limits)
        sc = make_sidecar(config_text=text, subdir=name, env={"PGW_T_KEY": "sk-test"})
        c = sc.connect()
        codes = []
        for _ in range(10):
            err, res, _ = call(c, "chat", body("m"), timeout=10)
            codes.append(err["code"] if err else "ok")
            if err:
                break
        results[name] = codes
    # 10 x 50 fresh input tokens fit in the app's itpm of 2000; its tpm
    # counts the 5000 read from the cache too.
    assert results["itpm"] == ["ok"] * 10, results
    assert results["tpm"] == ["ok", "stalled"], results
    # otpm 20: the first call reserves its max_tokens (16) and is charged
    # its 10 output tokens; 10 + 16 > 20 holds the second back for ~18 s.
    assert results["otpm"] == ["ok", "stalled"], results

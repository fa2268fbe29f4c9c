"""Model routing (sidecar/models.c, docs/CONFIG.md "Models"): the model a
request asks for selects the sources of its capability that serve it, over
the msgpack socket and the HTTP front, against the real mock upstream,
whose recorded requests show which source each attempt went to and the
upstream model it carried.
"""
import json
import os
import subprocess
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import POLYGW, call, chat, config_yaml, source_yaml  # noqa: E402
from test_http import DEFAULTS, FAST, front  # noqa: E402,F401

BASIC = {"timeout_s": 10, "connect_timeout_s": 5, "ttft_timeout_s": 5, "idle_timeout_s": 5,
         "max_concurrency": 8, "breaker": {"failures": 1000}}
POLICY = {"max_attempts": 3, "stall_window_s": 5, "backoff_base_s": 0.01, "backoff_max_s": 0.02}


def sidecar_with(make_sidecar, sources, extra=""):
    return make_sidecar(config_text=config_yaml(sources, POLICY) + extra)


def model_sent(up):
    return up.last()["json"]["model"]


def test_models__exact_glob_dated_and_pass_through(make_sidecar, up, up2):
    """An exact name wins over a glob; the most specific glob over a less
    specific one; a dated id reaches the glob made for it; a source with no
    model serves any other name and passes it through."""
    sc = sidecar_with(make_sidecar, [
        source_yaml("haiku-pinned", "chat", up.url, BASIC, model="claude-haiku-4-5-20251001",
                    serves=["haiku"]),
        source_yaml("haiku-any", "chat", up.url, BASIC, model="haiku-upstream",
                    serves=["claude-haiku-4-5*"]),
        source_yaml("claude-any", "chat", up.url, BASIC, model="claude-upstream",
                    serves=["claude-*"]),
        source_yaml("rest", "chat", up2.url, BASIC),
    ])
    c = sc.connect()
    cases = [
        ("claude-haiku-4-5-20251001", "haiku-pinned", "claude-haiku-4-5-20251001"),
        ("haiku", "haiku-pinned", "claude-haiku-4-5-20251001"),
        ("claude-haiku-4-5-20260101", "haiku-any", "haiku-upstream"),   # a later dated id
        ("claude-haiku-4-5", "haiku-any", "haiku-upstream"),
        ("claude-opus-4", "claude-any", "claude-upstream"),
        ("gpt-4o", "rest", "gpt-4o"),                                     # passed through
    ]
    for asked, source, sent in cases:
        err, res, _ = call(c, "chat", chat(model=asked))
        assert err is None, (asked, err)
        assert res["source"] == source, (asked, res["source"])
        m = up2 if source == "rest" else up
        assert model_sent(m) == sent, asked
    # No model at all: every source of the capability, as before routing.
    up.reset()
    up2.reset()
    body = chat()
    del body["model"]
    for _ in range(8):
        err, res, _ = call(c, "chat", body)
        assert err is None
    # sources of one tier share the calls: the model-less source passes no model
    seen = {r["json"].get("model") for r in up.requests() + up2.requests()}
    assert None in seen or len(seen) > 1


def test_models__unknown_model_is_model_not_found_after_no_attempt(make_sidecar, up):
    sc = sidecar_with(make_sidecar, [
        source_yaml("a", "chat", up.url, BASIC, model="model-alpha"),
    ])
    c = sc.connect()
    err, _, _ = call(c, "chat", chat(model="model-gamma"))
    assert err["code"] == "model_not_found"
    assert "model-gamma" in err["message"]
    assert up.stats()["requests"] == 0
    # The msgpack model parameter selects too, and wins over body.model.
    err, res, _ = call(c, "chat", chat(model="model-gamma"), model="model-alpha")
    assert err is None and res["source"] == "a"
    assert model_sent(up) == "model-alpha"


def test_models__msgpack_model_parameter_is_written_for_pass_through(make_sidecar, up):
    """A source with no model gets the parameter's name in the body."""
    sc = sidecar_with(make_sidecar, [source_yaml("any", "chat", up.url, BASIC)])
    c = sc.connect()
    body = chat()
    del body["model"]
    err, res, _ = call(c, "chat", body, model="wanted")
    assert err is None
    assert model_sent(up) == "wanted"


def test_models__alias_fails_over_across_providers(make_sidecar, up, up2):
    """One public alias over an OpenAI source (priority 0) that 500s and an
    Anthropic source converting OpenAI bodies (priority 1): the call fails
    over, each attempt carrying its own source's upstream model."""
    sc = sidecar_with(make_sidecar, [
        source_yaml("openai", "chat", up.url, BASIC, model="gpt-4o-mini", serves=["smart"],
                    priority=0),
        source_yaml("claude", "chat", up2.url, BASIC, kind="anthropic", accepts="openai",
                    model="claude-sonnet-4-5", serves=["smart"], priority=1),
    ])
    up.set_default({"status": 500})
    c = sc.connect()
    err, res, _ = call(c, "chat", chat(model="smart"))
    assert err is None, err
    assert res["source"] == "claude"
    assert res["attempts"] >= 2
    assert {r["json"]["model"] for r in up.requests()} == {"gpt-4o-mini"}
    last = up2.last()
    assert last["path"].endswith("/messages")
    assert last["json"]["model"] == "claude-sonnet-4-5"


def test_models__app_allow_list(make_sidecar, up):
    """An app limited to `alpha*` gets model_not_found for any other name,
    existing or not, and its requests without a model go to the sources
    whose upstream model it may use."""
    sc = sidecar_with(make_sidecar, [
        source_yaml("a", "chat", up.url, BASIC, model="alpha-1"),
        source_yaml("b", "chat", up.url, BASIC, model="beta-1"),
    ], extra="apps:\n  - {name: default, models: [\"alpha*\"]}\n")
    c = sc.connect()
    err, res, _ = call(c, "chat", chat(model="alpha-1"))
    assert err is None and res["source"] == "a"
    for other in ("beta-1", "nothing"):
        err, _, _ = call(c, "chat", chat(model=other))
        assert err["code"] == "model_not_found", other
    body = chat()
    del body["model"]
    for _ in range(5):
        err, res, _ = call(c, "chat", body)
        assert err is None and res["source"] == "a"


def test_models__http_models_list_and_404(front, up):
    f = front(sources=[
        source_yaml("a", "chat", up.url, FAST, model="model-alpha", serves=["alpha", "alpha-*"]),
        source_yaml("b", "chat", up.url, FAST, model="model-beta", serves=["alpha"]),
        source_yaml("e", "embedding", up.url, FAST, model="emb"),
    ])
    status, _, body = f.curl("/v1/models")
    assert status == 200
    ids = [(m["id"], m["capability"]) for m in json.loads(body)["data"]]
    assert ids == [("model-alpha", "chat"), ("alpha", "chat"), ("model-beta", "chat"),
                   ("emb", "embedding")]
    status, hdrs, body = f.curl("/v1/chat/completions", chat("x", model="model-beta"))
    assert status == 200 and hdrs["x-polygw-source"] == "b"
    up.reset()
    status, _, body = f.curl("/v1/chat/completions", chat("x", model="model-gamma"))
    assert status == 404
    err = json.loads(body)["error"]
    assert err["code"] == "model_not_found" and err["type"] == "not_found_error"
    assert up.stats()["requests"] == 0
    # The metrics label the configured name, never the client's unknown one.
    _, _, metrics = f.curl("/metrics")
    assert 'polygw_model_calls_total{capability="chat",model="model-beta",code="ok"} 1' \
        in metrics
    assert ('polygw_model_calls_total{capability="chat",model="other",'
            'code="model_not_found"} 1') in metrics
    assert "model-gamma" not in metrics
    # Anthropic's Messages surface selects from its own model member too.
    status, _, body = f.curl("/v1/messages", {"model": "nope", "max_tokens": 5,
                                              "messages": [{"role": "user", "content": "x"}]})
    assert status in (404,)


def test_models__config_rejects_ambiguous_names(make_sidecar, up):
    for sources, key in (
        ([source_yaml("a", "chat", up.url, BASIC, model="same"),
          source_yaml("b", "embedding", up.url, BASIC, serves=["same"])],
         "sources[1].serves[0]: this model name is served by capability 'chat' too"),
        ([source_yaml("a", "chat", up.url, BASIC, model="gpt-4o", priority=0),
          source_yaml("b", "chat", up.url, BASIC, model="x", serves=["gpt-4o*"], priority=1)],
         "sources[1].serves[0]: this glob matches the name sources[0].model serves"),
        ([source_yaml("a", "chat", up.url, BASIC, model="gpt-*")],
         "sources[0].model: is the upstream name sent, not a pattern"),
    ):
        sc = make_sidecar(config_text=config_yaml(sources, POLICY), start=False)
        p = subprocess.run([POLYGW, "--check-config", sc.config], capture_output=True,
                           text=True, timeout=10)
        assert p.returncode != 0
        assert key in p.stdout + p.stderr, p.stdout + p.stderr


def test_models__affinity_spreads_sticks_and_moves_when_its_breaker_opens(make_sidecar, up,
                                                                            up2):
    """affinity: scope — 200 scopes named at random (uuid4: no key set
    tuned to the hash) over 4 equal sources spread within +-20 % of even,
    every call of a scope lands on one source, and when that source's
    breaker opens its scopes move at once while the others stay."""
    src = dict(BASIC, breaker={"failures": 1, "cooldown_s": 60})
    sc = make_sidecar(config_text=config_yaml(
        [source_yaml("s0", "chat", up2.url, src)] +
        [source_yaml("s%d" % i, "chat", up.url, src) for i in range(1, 4)],
        POLICY, capabilities={"chat": {"affinity": "scope"}}))
    c = sc.connect()
    names = [str(uuid.uuid4()) for _ in range(200)]
    where = {}
    for i in range(200):
        err, res, _ = call(c, "chat", chat(), scope=names[i])
        assert err is None, err
        where[i] = res["source"]
    counts = {s: list(where.values()).count(s) for s in ("s0", "s1", "s2", "s3")}
    assert all(40 <= n <= 60 for n in counts.values()), counts
    for i in range(0, 200, 7):   # stickiness
        _, res, _ = call(c, "chat", chat(), scope=names[i])
        assert res["source"] == where[i]
    on_s0 = [i for i in where if where[i] == "s0"]
    up2.set_default({"status": 500})
    err, res, _ = call(c, "chat", chat(), scope=names[on_s0[0]])
    assert err is None and res["source"] != "s0" and res["attempts"] == 2  # s0 failed, opened
    s0_requests = up2.stats()["requests"]
    for i in range(200):
        _, res, _ = call(c, "chat", chat(), scope=names[i])
        if where[i] == "s0":
            assert res["source"] != "s0"
        else:
            assert res["source"] == where[i]
    assert up2.stats()["requests"] == s0_requests  # nothing more went to the open breaker

"""Google's native Gemini API (kind: gemini, docs/HTTP.md "Gemini") and
Anthropic's token counting (POST /v1/messages/count_tokens) through the
real sidecar's HTTP front and the real mock upstream: the key sent as
x-goog-api-key and never to the client, model routing by the path, usage
counted from usageMetadata, the JSON-array stream refused, and streams
that end badly always ending typed, never as a clean success.
"""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import call, source_yaml  # noqa: E402
from test_http import front, free_port  # noqa: E402,F401

KEY = "gm-secret-key-0123456789"
KEY_ENV = "POLYGW_TEST_GEMINI_KEY"
ENV = {KEY_ENV: KEY}
FAST = {"timeout_s": 10, "connect_timeout_s": 5, "ttft_timeout_s": 1, "idle_timeout_s": 5,
        "max_concurrency": 64, "aimd": {"initial": 64}, "breaker": {"failures": 1000}}
CAPS = {"gemini": {"path": "/gemini"}, "count_tokens": {"path": "/messages/count_tokens"}}


def gsource(up, name="g1", capability="gemini", **kw):
    return source_yaml(name, capability, up.base + "/v1beta",
                       dict(FAST, api_key_env=KEY_ENV, kind="gemini"), **kw)


def start(front, up, *sources):
    srcs = list(sources) or [gsource(up), gsource(up, "gc", "count_tokens")]
    return front(sources=srcs, env=ENV, capabilities=CAPS)


def gbody(text="hello gemini", mock=None):
    body = {"contents": [{"role": "user", "parts": [{"text": text}]}]}
    if mock is not None:
        body["mock"] = mock
    return body


def sse_events(text):
    """[(event name or None, data text)] of an SSE body."""
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for ln in block.split("\n"):
            if ln.startswith("event: "):
                name = ln[7:]
            elif ln.startswith("data: "):
                data.append(ln[6:])
        if data:
            out.append((name, "\n".join(data)))
    return out


def tokens(f, source, capability="gemini"):
    status, _, body = f.curl("/metrics", unix=True)
    assert status == 200
    prefix = 'polygw_source_tokens_total{source="%s",capability="%s"} ' % (source, capability)
    lines = [ln for ln in body.splitlines() if ln.startswith(prefix)]
    return float(lines[0][len(prefix):]) if lines else None


def test_gemini__generate_content_plain(front, up):
    up.require_auth("gemini", KEY)
    f = start(front, up)
    usage = {"prompt_tokens": 40, "completion_tokens": 2}
    status, hdrs, body = f.curl("/v1beta/models/gemini-test:generateContent",
                                gbody("plain hi", mock={"usage": usage}))
    assert status == 200, body
    reply = json.loads(body)
    assert reply["candidates"][0]["content"]["parts"][0]["text"] == "plain hi"
    assert reply["candidates"][0]["finishReason"] == "STOP"
    last = up.last()
    assert last["path"] == "/v1beta/models/gemini-test:generateContent"
    assert last["headers"]["x-goog-api-key"] == KEY
    assert "authorization" not in last["headers"]
    assert "mock" in last["json"] and "stream" not in last["json"] and "model" not in last["json"]
    assert KEY not in body and all(KEY not in v for v in hdrs.values())
    assert hdrs["x-polygw-source"] == "g1"
    assert tokens(f, "g1") == 42


def test_gemini__stream_generate_content_sse(front, up):
    up.require_auth("gemini", KEY)
    f = start(front, up)
    usage = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
    status, hdrs, body = f.curl("/v1beta/models/gemini-test:streamGenerateContent?alt=sse",
                                gbody("streamed words", mock={"usage": usage}))
    assert status == 200, body
    assert hdrs["content-type"].startswith("text/event-stream")
    evs = sse_events(body)
    assert all(name is None for name, _ in evs), evs      # no [DONE], no named events
    chunks = [json.loads(d) for _, d in evs]
    text = "".join(p["text"] for ch in chunks for p in ch["candidates"][0]["content"]["parts"])
    assert text == "streamed words"
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    assert up.last()["target"] == "/v1beta/models/gemini-test:streamGenerateContent?alt=sse"
    assert KEY not in body
    assert tokens(f, "g1") == 12


def test_gemini__json_array_stream_is_refused(front, up):
    f = start(front, up)
    status, hdrs, body = f.curl("/v1beta/models/gemini-test:streamGenerateContent", gbody())
    assert status == 400, body
    err = json.loads(body)["error"]
    assert err["code"] == "bad_request" and "alt=sse" in err["message"]
    assert up.stats()["requests"] == 0


def test_gemini__count_tokens(front, up):
    up.require_auth("gemini", KEY)
    f = start(front, up)
    status, _, body = f.curl("/v1beta/models/gemini-test:countTokens",
                             gbody("count me", mock={"usage": {"prompt_tokens": 9}}))
    assert status == 200, body
    assert json.loads(body)["totalTokens"] == 9
    last = up.last()
    assert last["path"] == "/v1beta/models/gemini-test:countTokens"
    assert last["headers"]["x-goog-api-key"] == KEY
    # Counting is no generation: no tokens, and nothing on the gemini capability.
    assert not tokens(f, "gc", "count_tokens")
    assert not tokens(f, "g1")


def test_gemini__model_routing_by_path(front, up):
    f = start(front, up, gsource(up, "ga", model="up-a", serves=["gemini-a"]),
              gsource(up, "gb", serves=["gemini-b*"]))
    status, hdrs, body = f.curl("/v1beta/models/gemini-a:generateContent", gbody("a"))
    assert status == 200, body
    assert hdrs["x-polygw-source"] == "ga"
    assert up.last()["path"] == "/v1beta/models/up-a:generateContent"
    status, hdrs, body = f.curl("/v1beta/models/gemini-b-2:generateContent", gbody("b"))
    assert status == 200, body
    assert hdrs["x-polygw-source"] == "gb"
    assert up.last()["path"] == "/v1beta/models/gemini-b-2:generateContent"
    status, _, body = f.curl("/v1beta/models/gemini-c:generateContent", gbody("c"))
    assert status == 404, body
    assert json.loads(body)["error"]["code"] == "model_not_found"
    status, _, body = f.curl("/v1beta/models/bad%2Fname:generateContent", gbody("c"))
    assert status == 404, body
    status, _, body = f.curl("/v1beta/models/gemini-a:embedContent", gbody("c"))
    assert status == 404, body


def test_gemini__no_such_capability_is_404(front, up):
    f = front(sources=[gsource(up, "g1", "chat")], env=ENV)
    status, _, body = f.curl("/v1beta/models/gemini-a:countTokens", gbody("c"))
    assert status == 404, body
    err = json.loads(body)["error"]
    assert err["code"] == "unknown_capability"
    assert err["message"].endswith("(configure capability count_tokens)"), err
    status, _, body = f.curl("/v1beta/models/gemini-a:generateContent", gbody("c"))
    assert status == 404 and "configure capability gemini" in body, body
    assert up.stats()["requests"] == 0


def test_gemini__anthropic_count_tokens_passes_the_query(front, up):
    up.require_auth("anthropic", KEY)
    src = [source_yaml("ac", "count_tokens", up.url, dict(FAST, api_key_env=KEY_ENV),
                       kind="anthropic", serves=["claude-*"]),
           source_yaml("am", "chat", up.url, dict(FAST, api_key_env=KEY_ENV), kind="anthropic")]
    f = front(sources=src, env=ENV, capabilities=CAPS)
    body = {"model": "claude-test", "messages": [{"role": "user", "content": "count"}],
            "mock": {"usage": {"prompt_tokens": 11}}}
    status, hdrs, text = f.curl("/v1/messages/count_tokens?beta=true", body)
    assert status == 200, text
    assert json.loads(text) == {"input_tokens": 11}
    assert hdrs["x-polygw-source"] == "ac"
    last = up.last()
    assert last["target"] == "/v1/messages/count_tokens?beta=true"
    assert last["headers"]["x-api-key"] == KEY
    status, _, text = f.curl("/v1/messages/count_tokens", dict(body, model="gpt-4o"))
    assert status == 404 and json.loads(text)["error"]["code"] == "model_not_found", text
    # The chat capability saw none of it.
    _, _, metrics = f.curl("/metrics", unix=True)
    assert not [ln for ln in metrics.splitlines()
                if ln.startswith("polygw_calls_total{") and 'capability="chat"' in ln
                and not ln.endswith(" 0")]
    # A Messages stream's event: lines reach the client as the mock sent them.
    status, _, text = f.curl("/v1/messages?beta=true",
                             {"model": "claude-test", "max_tokens": 9, "stream": True,
                              "messages": [{"role": "user", "content": "ab cd"}]})
    assert status == 200, text
    assert up.last()["target"] == "/v1/messages?beta=true"
    names = [n for n, _ in sse_events(text)]
    assert names[0] == "message_start" and names[-1] == "message_stop", names


def hostile(front, up, mock):
    f = start(front, up)
    status, _, body = f.curl("/v1beta/models/gemini-test:streamGenerateContent?alt=sse",
                             gbody("hostile words", mock=mock))
    assert status == 200, body
    evs = sse_events(body)
    assert evs[-1][0] == "error", evs
    return json.loads(evs[-1][1])["error"]


def test_gemini__stream_without_finish_reason_ends_typed(front, up):
    err = hostile(front, up, {"no_done": True})
    assert err["code"] == "stream_interrupted", err


def test_gemini__error_inside_the_stream_ends_typed(front, up):
    err = hostile(front, up, {"stream_error": "UNAVAILABLE"})
    assert err["code"] == "stream_interrupted", err
    assert "UNAVAILABLE" in json.dumps(err)


def test_gemini__garbage_after_the_terminal_event_ends_typed(front, up):
    final = ('{"candidates":[{"content":{"parts":[{"text":"x"}],"role":"model"},'
             '"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":1,'
             '"candidatesTokenCount":1,"totalTokenCount":2}}')
    body = "data: %s\r\n\r\ndata: }{ not json\r\n\r\n" % final
    err = hostile(front, up, {"body": body, "content_type": "text/event-stream"})
    assert err["code"] in ("stream_interrupted", "bad_response"), err


@pytest.mark.parametrize("status", [503, 429])
def test_gemini__transient_status_is_retried(front, up, status):
    f = start(front, up)
    up.script([{"status": status, "retry_after": 0}, {}])
    status, hdrs, body = f.curl("/v1beta/models/gemini-test:generateContent", gbody("again"))
    assert status == 200, body
    assert hdrs["x-polygw-attempts"] == "2"


def test_gemini__msgpack_call_names_the_model(front, up):
    up.require_auth("gemini", KEY)
    f = start(front, up)
    c = f.sc.connect()
    err, res, _ = call(c, "gemini", gbody("over msgpack"), model="gemini-mp")
    assert err is None, err
    assert res["body"]["candidates"][0]["content"]["parts"][0]["text"] == "over msgpack"
    last = up.last()
    assert last["path"] == "/v1beta/models/gemini-mp:generateContent"
    assert "model" not in last["json"] and "stream" not in last["json"]
    msgid = c.request_async("call", {"capability": "gemini", "model": "gemini-mp",
                                     "body": gbody("mp stream"), "stream": True})
    chunks = []
    while True:
        msg = c.recv_msg(timeout=10)
        assert msg is not None
        if msg[0] == 2 and msg[1] == "chunk" and msg[2][0] == msgid:
            chunks.append(msg[2][1])
        elif msg[0] == 1 and msg[1] == msgid:
            assert msg[2] is None, msg[2]
            break
    assert up.last()["target"] == "/v1beta/models/gemini-mp:streamGenerateContent?alt=sse"
    assert "stream" not in up.last()["json"]
    assert chunks, "no chunk relayed"
    # No model named, the source names none: refused, nothing sent upstream.
    n = up.stats()["requests"]
    err, _, _ = call(c, "gemini", gbody("no model"))
    assert err is not None and err["code"] == "bad_request", err
    assert up.stats()["requests"] == n


def test_gemini__client_query_cannot_replace_the_sources(front, up):
    src = [source_yaml("ac", "count_tokens", up.url, dict(FAST, api_key_env=KEY_ENV),
                       kind="anthropic", query={"tenant": "search"})]
    f = front(sources=src, env=ENV, capabilities=CAPS)
    body = {"model": "claude-test", "messages": [{"role": "user", "content": "q"}]}
    status, _, text = f.curl("/v1/messages/count_tokens?beta=true&tenant=evil&x", body)
    assert status == 200, text
    assert up.last()["target"] == "/v1/messages/count_tokens?tenant=search&beta=true&x"


def test_gemini__anthropic_route_never_reaches_a_gemini_source(front, up):
    """One count_tokens capability holds both kinds (as docs/HTTP.md
    suggests): a Gemini model named on Anthropic's route has no source
    there, 404 model_not_found, nothing sent; Gemini's route still counts."""
    src = [source_yaml("ac", "count_tokens", up.url, dict(FAST, api_key_env=KEY_ENV),
                       kind="anthropic", serves=["claude-*"]),
           gsource(up, "gc", "count_tokens")]
    f = front(sources=src, env=ENV, capabilities=CAPS)
    seen = up.stats()["requests"]
    status, _, text = f.curl("/v1/messages/count_tokens",
                             {"model": "gemini-test",
                              "messages": [{"role": "user", "content": "x"}]})
    assert status == 404, text
    err = json.loads(text)["error"]
    assert err["code"] == "model_not_found" and "Gemini API" in err["message"], err
    assert up.stats()["requests"] == seen
    status, _, text = f.curl("/v1beta/models/gemini-test:countTokens",
                             {"contents": [{"parts": [{"text": "count me"}]}]})
    assert status == 200, text

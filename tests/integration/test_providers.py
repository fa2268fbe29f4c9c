"""Provider dialects (issue 15) through the real sidecar and the real mock
upstream: Azure OpenAI (api-key header, api-version query), Anthropic's
Messages API (x-api-key, anthropic-version, its own SSE events and usage,
529 overloaded), header- and query-authenticated APIs (Gemini style),
redirects that would carry a key elsewhere, and real token counts.

The mock checks each provider's authentication the way that provider does
(`MockUpstream.require_auth`) and answers a wrong or missing key with that
provider's own error status and body, so a test that passes proves the
sidecar sent exactly what the provider expects.
"""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import call, chat, config_yaml, source_yaml  # noqa: E402

KEY = "sk-provider-test-0123456789+/="
KEY_ENV = "POLYGW_TEST_PROVIDER_KEY"
ENV = {KEY_ENV: KEY, "POLYGW_TEST_ORG": "org-from-env"}

FAST = {"timeout_s": 10, "connect_timeout_s": 5, "ttft_timeout_s": 5, "idle_timeout_s": 5,
        "max_concurrency": 64, "aimd": {"initial": 64}, "breaker": {"failures": 1000}}
DEFAULTS = {"max_attempts": 2, "stall_window_s": 30, "backoff_base_s": 0.05,
            "backoff_max_s": 0.1}


def source(name, base_url, capability="chat", **kw):
    return source_yaml(name, capability, base_url, dict(FAST, api_key_env=KEY_ENV), **kw)


def start(make_sidecar, *sources, defaults=DEFAULTS, **kw):
    return make_sidecar(config_text=config_yaml(list(sources), defaults, **kw), env=ENV)


def azure_url(up, deployment="gpt4o"):
    return "%s/openai/deployments/%s" % (up.base, deployment)


def anthropic_body(text="hello", **extra):
    body = {"model": "claude-test", "max_tokens": 64,
            "messages": [{"role": "user", "content": text}]}
    body.update(extra)
    return body


def stream_call(c, capability, body, timeout=10.0):
    """A streamed call: (chunks, error, result)."""
    msgid = c.request_async("call", {"capability": capability, "body": body, "stream": True})
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = c.recv_msg(timeout=max(0.01, deadline - time.monotonic()))
        assert msg is not None, "connection closed"
        if msg[0] == 2 and msg[1] == "chunk" and msg[2][0] == msgid:
            chunks.append(msg[2][1])
        elif msg[0] == 1 and msg[1] == msgid:
            return chunks, msg[2], msg[3]
    raise AssertionError("no answer within %ss" % timeout)


# ------------------------------------------------------------------ Azure
def test_providers__azure_sends_api_key_header_and_api_version(make_sidecar, up):
    up.require_auth("azure", KEY)
    sc = start(make_sidecar, source("az", azure_url(up), kind="azure", api_version="2024-10-21"))
    c = sc.connect()
    err, res, _ = call(c, "chat", chat("hi azure"))
    assert err is None, err
    assert res["body"]["choices"][0]["message"]["content"] == "hi azure"
    last = up.last()
    assert last["path"] == "/openai/deployments/gpt4o/chat/completions"
    assert last["target"].endswith("?api-version=2024-10-21")
    assert last["headers"]["api-key"] == KEY
    assert "authorization" not in last["headers"]


def test_providers__azure_wrong_key_is_rejected_with_azures_error(make_sidecar, up):
    up.require_auth("azure", "another-key")
    sc = start(make_sidecar, source("az", azure_url(up), kind="azure", api_version="2024-10-21"))
    err, _, _ = call(sc.connect(), "chat", chat())
    assert err["code"] == "upstream_rejected" and err["status"] == 401
    assert err["upstream_body"]["error"]["code"] == "401"
    assert "Access denied" in err["upstream_body"]["error"]["message"]
    assert KEY not in json.dumps(err) and KEY not in sc.logs()


def test_providers__azure_requires_api_version(make_sidecar, up):
    sc = make_sidecar(start=False, env=ENV, config_text=config_yaml(
        [source("az", azure_url(up), kind="azure")], DEFAULTS))
    import subprocess
    from conftest import POLYGW
    p = subprocess.run([POLYGW, "--check-config", sc.config], env=dict(os.environ, **ENV),
                       capture_output=True, text=True, timeout=10)
    assert p.returncode != 0
    assert "sources[0].api_version: is required with kind: azure" in p.stderr


# -------------------------------------------------------------- Anthropic
def test_providers__anthropic_plain_message(make_sidecar, up):
    up.require_auth("anthropic", KEY)
    sc = start(make_sidecar, source("claude", up.url, kind="anthropic"))
    err, res, _ = call(sc.connect(), "chat", anthropic_body("hi claude",
                                                            mock={"usage": {"prompt_tokens": 11,
                                                                            "completion_tokens": 7}}))
    assert err is None, err
    assert res["body"]["type"] == "message"
    assert res["body"]["content"][0]["text"] == "hi claude"
    assert res["usage"] == {"input_tokens": 11, "output_tokens": 7}
    last = up.last()
    assert last["path"] == "/v1/messages"
    assert last["headers"]["x-api-key"] == KEY
    assert last["headers"]["anthropic-version"] == "2023-06-01"
    assert "authorization" not in last["headers"]


def test_providers__anthropic_stream_relayed_as_it_arrives_and_usage_reconciled(make_sidecar, up):
    up.require_auth("anthropic", KEY)
    sc = start(make_sidecar, source("claude", up.url, kind="anthropic",
                                    anthropic_version="2023-06-01"))
    c = sc.connect()
    body = anthropic_body("abcdefgh", mock={"stream_events": 4, "stream_interval_ms": 150,
                                            "usage": {"prompt_tokens": 40,
                                                      "completion_tokens": 9}})
    msgid = c.request_async("call", {"capability": "chat", "body": body, "stream": True})
    t0 = time.monotonic()
    first = c.recv_msg(timeout=5)
    t_first = time.monotonic() - t0
    assert first[0] == 2 and first[2][1]["type"] == "message_start"
    # The first event arrives long before the stream's 4 x 150 ms.
    assert t_first < 0.4, t_first
    chunks = [first[2][1]]
    while True:
        msg = c.recv_msg(timeout=5)
        if msg[0] == 1:
            assert msg[1] == msgid
            err, res = msg[2], msg[3]
            break
        chunks.append(msg[2][1])
    assert err is None, err
    types = [ch["type"] for ch in chunks]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert "message_delta" in types
    text = "".join(ch["delta"]["text"] for ch in chunks if ch["type"] == "content_block_delta")
    assert text == "abcdefgh"
    assert res["usage"] == {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49}
    err, stats = c.request("stats")
    src = [s for s in stats["sources"] if s["name"] == "claude"][0]
    assert src["tokens_used"] == 49, src


def test_providers__anthropic_stream_cut_before_message_stop_is_interrupted(make_sidecar, up):
    sc = start(make_sidecar, source("claude", up.url, kind="anthropic"))
    chunks, err, _ = stream_call(sc.connect(), "chat", anthropic_body(mock={"no_done": True}))
    assert chunks and chunks[0]["type"] == "message_start"
    assert err["code"] == "stream_interrupted", err
    assert "message_stop" in err["message"]


def test_providers__anthropic_overloaded_error_event_mid_stream(make_sidecar, up):
    sc = start(make_sidecar, source("claude", up.url, kind="anthropic"))
    chunks, err, _ = stream_call(sc.connect(), "chat",
                                 anthropic_body(mock={"stream_error": "overloaded_error"}))
    assert chunks and all(ch["type"] != "error" for ch in chunks)
    assert err["code"] == "stream_interrupted", err
    assert "overloaded_error" in err["message"]


def test_providers__anthropic_529_is_retried_on_another_source(make_sidecar, up, up2):
    up.set_default({"status": 529})
    sc = start(make_sidecar, source("claude-a", up.url, kind="anthropic", priority=0),
               source("claude-b", up2.url, kind="anthropic", priority=1))
    chunks, err, res = stream_call(sc.connect(), "chat", anthropic_body("second"))
    assert err is None, err
    assert res["source"] == "claude-b" and res["attempts"] == 2
    assert chunks[-1]["type"] == "message_stop"
    assert up.stats()["by_status"] == {"529": 1}


def test_providers__anthropic_wrong_key_gets_anthropics_error(make_sidecar, up):
    up.require_auth("anthropic", "not-this-one")
    sc = start(make_sidecar, source("claude", up.url, kind="anthropic"))
    err, _, _ = call(sc.connect(), "chat", anthropic_body())
    assert err["code"] == "upstream_rejected" and err["status"] == 401
    assert err["upstream_body"] == {"type": "error", "error": {"type": "authentication_error",
                                                               "message": "invalid x-api-key"}}


# ---------------------------------------------------- header / query keys
def test_providers__gemini_style_header_key_and_extra_headers(make_sidecar, up):
    up.require_auth("gemini", KEY)
    sc = start(make_sidecar, source(
        "gemini", up.url, auth_header="x-goog-api-key",
        headers=[{"name": "X-Org", "value_env": "POLYGW_TEST_ORG"},
                 {"name": "X-Team", "value": "search"}],
        query={"alt": "sse json"}))
    err, res, _ = call(sc.connect(), "chat", chat("gemini"))
    assert err is None, err
    h = up.last()["headers"]
    assert h["x-goog-api-key"] == KEY and "authorization" not in h
    assert h["x-org"] == "org-from-env" and h["x-team"] == "search"
    assert up.last()["target"].endswith("/chat/completions?alt=sse%20json")


def test_providers__query_key_is_percent_encoded(make_sidecar, up):
    up.require_auth("query", "sk-provider-test-0123456789%2B%2F%3D", name="key")
    sc = start(make_sidecar, source("q", up.url, auth_query="key"))
    err, res, _ = call(sc.connect(), "chat", chat())
    assert err is None, err
    assert "authorization" not in up.last()["headers"]
    err, stats = sc.connect().request("stats")
    assert KEY not in json.dumps(stats) and "0123456789" not in json.dumps(stats)


def test_providers__missing_header_key_gets_gemini_error(make_sidecar, up):
    up.require_auth("gemini", KEY)
    sc = start(make_sidecar, source("gemini", up.url))  # Bearer: wrong for this API
    err, _, _ = call(sc.connect(), "chat", chat())
    assert err["code"] == "upstream_rejected" and err["status"] == 400
    assert err["upstream_body"]["error"]["status"] == "INVALID_ARGUMENT"


# ---------------------------------------------------------------- redirect
@pytest.mark.parametrize("kind", ["anthropic", "gemini"])
def test_providers__redirect_to_another_host_never_carries_the_key(make_sidecar, up, up2, kind):
    """The sidecar does not follow redirects: libcurl would resend custom
    headers such as x-api-key to the new host. The attempt fails with a
    reason that says so, and the other host sees nothing."""
    target = up2.url.replace("127.0.0.1", "localhost") + ("/messages" if kind == "anthropic"
                                                          else "/chat/completions")
    up.set_default({"status": 307, "headers": {"Location": target}, "body": ""})
    extra = {"kind": "anthropic"} if kind == "anthropic" else {"auth_header": "x-goog-api-key"}
    sc = start(make_sidecar, source("redir", up.url, **extra),
               defaults=dict(DEFAULTS, max_attempts=1))
    err, _, _ = call(sc.connect(), "chat", anthropic_body() if kind == "anthropic" else chat())
    assert err["code"] == "retry_exhausted", err
    assert "redirect" in err["message"] and "not follow" in err["message"]
    assert err["status"] == 307
    assert up2.stats()["requests"] == 0
    assert KEY not in json.dumps(err) and KEY not in sc.logs()


# ------------------------------------------------------ real stream usage
def test_providers__openai_stream_asks_for_usage_and_hides_the_extra_chunk(make_sidecar, up):
    """OpenAI reports a stream's usage only when asked (usage_if_asked):
    polygw asks, uses the real figure, and does not relay the extra
    usage-only chunk the client never asked for."""
    sc = start(make_sidecar, source("oa", up.url))
    mock = {"usage_if_asked": True, "usage": {"prompt_tokens": 4321, "completion_tokens": 5}}
    chunks, err, res = stream_call(sc.connect(), "chat", chat("abcd", mock=mock))
    assert err is None, err
    assert res["usage"] == {"prompt_tokens": 4321, "completion_tokens": 5, "total_tokens": 4326}
    assert all(ch["choices"] for ch in chunks), chunks
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert up.last()["json"]["stream_options"] == {"include_usage": True}


def test_providers__client_that_asks_for_usage_gets_the_chunk(make_sidecar, up):
    sc = start(make_sidecar, source("oa", up.url))
    chunks, err, res = stream_call(sc.connect(), "chat",
                                   chat("abcd", mock={"usage_if_asked": True},
                                        stream_options={"include_usage": True}))
    assert err is None, err
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == res["usage"]


def test_providers__stream_usage_false_sends_no_stream_options(make_sidecar, up):
    sc = start(make_sidecar, source("vllm", up.url, stream_usage=False))
    chunks, err, res = stream_call(sc.connect(), "chat",
                                   chat("abcd", mock={"usage": {"prompt_tokens": 9,
                                                                "completion_tokens": 1}}))
    assert err is None, err
    assert "stream_options" not in up.last()["json"]
    assert res["usage"]["total_tokens"] == 10   # vLLM style: on the finish chunk


def test_providers__tpm_admits_by_the_real_stream_usage(make_sidecar, up):
    """The first stream really used 5000 tokens (its estimate is ~20): the
    tpm bucket is empty afterwards, so the second call is not admitted
    before its deadline. Counting the estimate instead would admit it."""
    sc = start(make_sidecar, source("oa", up.url, limits={"tpm": 5000, "window_s": 3600}))
    c = sc.connect()
    big = {"usage_if_asked": True, "usage": {"prompt_tokens": 4990, "completion_tokens": 10}}
    chunks, err, res = stream_call(c, "chat", chat("first", mock=big))
    assert err is None, err
    assert res["usage"]["total_tokens"] == 5000
    err, stats = c.request("stats")
    src = stats["sources"][0]
    assert src["tokens_used"] == 5000 and src["tpm_level"] < 100, src
    err, res = c.request("metrics")
    assert err is None, err
    want = 'polygw_source_tokens_total{source="oa",capability="chat"} 5000'
    assert want in res["text"].splitlines(), res["text"]
    err, res, elapsed = call(c, "chat", chat("second"), deadline_s=1.0)
    assert err is not None and err["code"] in ("deadline_exceeded", "stalled"), (err, res)
    assert up.stats()["requests"] == 1


# --------------------------------------- accepts: openai, cross-dialect failover
def mixed(make_sidecar, anth, azure, anth_first=True):
    """A chat capability with an Anthropic source that accepts OpenAI bodies
    and an Azure source, in the given priority order."""
    anth.require_auth("anthropic", KEY)
    azure.require_auth("azure", KEY)
    a = source("claude", anth.url, kind="anthropic", accepts="openai", model="claude-test", serves=["*"],
               priority=0 if anth_first else 1)
    z = source("azure", azure_url(azure), kind="azure", api_version="2024-10-21",
               priority=1 if anth_first else 0)
    return start(make_sidecar, a, z)


def openai_chat(text, **extra):
    body = {"model": "gpt-4o", "messages": [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": text}]}
    body.update(extra)
    return body


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_providers__anthropic_down_azure_serves_openai_format(make_sidecar, up, up2, stream):
    up.set_default({"status": 529})
    sc = mixed(make_sidecar, up, up2, anth_first=True)
    c = sc.connect()
    if stream:
        chunks, err, res = stream_call(c, "chat", openai_chat("via azure"))
        assert err is None, err
        assert "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks
                       if ch["choices"]) == "via azure"
        assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    else:
        err, res, _ = call(c, "chat", openai_chat("via azure"))
        assert err is None, err
        assert res["body"]["object"] == "chat.completion"
        assert res["body"]["choices"][0]["message"]["content"] == "via azure"
    assert res["source"] == "azure" and res["attempts"] == 2
    assert up.stats()["by_status"] == {"529": 1}
    # What Anthropic was sent: the converted body.
    sent = up.last()["json"]
    assert up.last()["path"] == "/v1/messages"
    assert sent["system"] == "Be brief." and sent["model"] == "claude-test"
    assert sent["messages"] == [{"role": "user", "content": "via azure"}]
    assert sent["max_tokens"] == 4096 and "stream_options" not in sent


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_providers__azure_down_anthropic_serves_openai_format(make_sidecar, up, up2, stream):
    up2.set_default({"status": 503})
    up.set_default({"usage": {"prompt_tokens": 30, "completion_tokens": 4}})
    sc = mixed(make_sidecar, up, up2, anth_first=False)
    c = sc.connect()
    if stream:
        chunks, err, res = stream_call(c, "chat", openai_chat("via claude", max_tokens=77))
        assert err is None, err
        assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks)
        assert text == "via claude"
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        assert up.last()["json"]["stream"] is True
    else:
        err, res, _ = call(c, "chat", openai_chat("via claude", max_tokens=77))
        assert err is None, err
        body = res["body"]
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"] == {"role": "assistant", "content": "via claude"}
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["usage"] == {"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34}
    assert res["source"] == "claude" and res["attempts"] == 2
    assert res["usage"] == {"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34}
    assert up.last()["json"]["max_tokens"] == 77
    assert up2.stats()["by_status"] == {"503": 1}


def test_providers__converted_stream_usage_chunk_only_when_asked(make_sidecar, up):
    sc = start(make_sidecar, source("claude", up.url, kind="anthropic", accepts="openai"))
    chunks, err, res = stream_call(sc.connect(), "chat",
                                   openai_chat("u", stream_options={"include_usage": True}))
    assert err is None, err
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == res["usage"]
    assert "stream_options" not in up.last()["json"]


@pytest.mark.parametrize("reply", ['[1,2,3]', '"hello"', '{}', '{"type":"message"}',
                                   '{"type":"message","content":"hi"}',
                                   '{"type":"error","error":{"type":"api_error"},"content":[]}'],
                         ids=["array", "string", "empty", "no_content", "content_not_a_list",
                              "not_a_message"])
def test_providers__converted_reply_that_is_no_message_is_bad_response(make_sidecar, up, reply):
    """An Anthropic source converting for an OpenAI client refuses a 200
    whose body is not a Messages reply: it is the upstream's bad_response
    (retried, then retry_exhausted), never a chat.completion."""
    sc, base = http_front(make_sidecar, source("claude", up.url, kind="anthropic",
                                                accepts="openai"))
    mock = {"body": reply, "content_type": "application/json"}
    err, res, _ = call(sc.connect(), "chat", openai_chat("x", mock=mock))
    assert res is None and err["code"] == "retry_exhausted", (err, res)
    assert [s["reason"] for s in err["sources"]] == ["bad_response"], err
    assert "not an Anthropic Messages reply" in err["sources"][0]["detail"], err
    assert up.stats()["requests"] == 2
    status, text = curl(base + "/v1/chat/completions", openai_chat("x", mock=mock))
    assert status == 503 and json.loads(text)["error"]["code"] == "retry_exhausted", text


def test_providers__unconvertible_body_is_bad_request(make_sidecar, up):
    sc = start(make_sidecar, source("claude", up.url, kind="anthropic", accepts="openai"))
    err, _, _ = call(sc.connect(), "chat", openai_chat("x", tools=[{"type": "function"}]))
    assert err["code"] == "bad_request" and "body.tools" in err["message"]
    assert up.stats()["requests"] == 0


@pytest.mark.parametrize("bad", [-5, 1.5, 0, "64"])
def test_providers__converted_max_tokens_must_be_a_positive_integer(make_sidecar, up, bad):
    sc = start(make_sidecar, source("claude", up.url, kind="anthropic", accepts="openai"))
    c = sc.connect()
    err, _, _ = call(c, "chat", openai_chat("x", max_tokens=bad))
    assert err["code"] == "bad_request", err
    assert "body.max_tokens: must be a positive integer" in err["message"], err
    err, _, _ = call(c, "chat", openai_chat("x", max_completion_tokens=bad))
    assert "body.max_completion_tokens: must be a positive integer" in err["message"], err
    assert up.stats()["requests"] == 0


def test_providers__converted_null_tool_calls_and_max_tokens_are_absent(make_sidecar, up):
    """OpenAI SDKs send "tool_calls": null on an assistant message that
    made none."""
    sc = start(make_sidecar, source("claude", up.url, kind="anthropic", accepts="openai"))
    body = openai_chat("x", max_tokens=None)
    body["messages"] += [{"role": "assistant", "content": "y", "tool_calls": None},
                         {"role": "user", "content": "z"}]
    err, res, _ = call(sc.connect(), "chat", body)
    assert err is None, err
    sent = up.last()["json"]
    assert sent["max_tokens"] == 4096
    assert sent["messages"][1] == {"role": "assistant", "content": "y"}


# ------------------------------------------------------------- retry hints
def test_providers__retry_after_ms_is_the_retry_delay(make_sidecar, up):
    up.script([{"status": 429, "headers": {"retry-after-ms": "400"}}, {}])
    sc = start(make_sidecar, source("oa", up.url))
    err, res, elapsed = call(sc.connect(), "chat", chat())
    assert err is None, err
    assert res["attempts"] == 2
    assert elapsed >= 0.4, elapsed     # backoff_max_s is 0.1: the hint set the wait


def test_providers__x_should_retry_false_is_not_retried(make_sidecar, up, up2):
    up.set_default({"status": 503, "headers": {"x-should-retry": "false"}})
    sc = start(make_sidecar, source("a", up.url, priority=0), source("b", up2.url, priority=1))
    err, _, _ = call(sc.connect(), "chat", chat())
    assert err["code"] == "upstream_rejected" and err["status"] == 503
    assert err["attempts"] == 1 and up2.stats()["requests"] == 0


# ------------------------------------------------------ secrets in replies
def test_providers__echoed_x_api_key_and_header_secret_are_redacted(make_sidecar, up):
    """An upstream that echoes the x-api-key it got, or a secret header
    (value_env), has them replaced in what the client sees; a literal
    header value is not a secret and passes."""
    up.set_default({"status": 401, "error_message": "bad key {{header:x-api-key}} / "
                                                    "{{header:x-org}} / {{header:x-team}}"})
    sc = start(make_sidecar, source("claude", up.url, kind="anthropic",
                                    headers=[{"name": "X-Org", "value_env": "POLYGW_TEST_ORG"},
                                             {"name": "X-Team", "value": "search"}]))
    err, _, _ = call(sc.connect(), "chat", anthropic_body())
    assert err["code"] == "upstream_rejected"
    msg = err["upstream_body"]["error"]["message"]
    assert msg == "bad key [redacted] / [redacted] / search", msg
    assert KEY not in json.dumps(err) and "org-from-env" not in json.dumps(err)


# ------------------------------------------------------------ HTTP front end
def http_front(make_sidecar, *sources, extra=""):
    """A sidecar with the HTTP front end on a free loopback port (and the
    YAML text `extra` at the end of its config); returns (sidecar, base URL)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    text = config_yaml(list(sources), DEFAULTS) + 'http:\n  listen: "127.0.0.1:%d"\n' % port
    text += extra
    sc = make_sidecar(config_text=text, env=ENV)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.02)
    return sc, "http://127.0.0.1:%d" % port


def curl(url, body):
    """(HTTP status, body text) of one POST with curl."""
    out = subprocess.run(["curl", "-s", "-N", "--max-time", "15", "-w", "\n%{http_code}",
                          "-H", "Content-Type: application/json", "--data-binary",
                          json.dumps(body), url], capture_output=True, timeout=20).stdout.decode()
    text, _, status = out.rpartition("\n")
    return int(status), text


def sse_data(text):
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


def test_providers__http_openai_stream_counts_real_tokens_and_hides_usage_chunk(make_sidecar, up):
    sc, base = http_front(make_sidecar, source("oa", up.url))
    status, text = curl(base + "/v1/chat/completions", chat("abc", stream=True, mock={
        "usage_if_asked": True, "usage": {"prompt_tokens": 700, "completion_tokens": 2}}))
    assert status == 200, text
    data = sse_data(text)
    assert data[-1] == "[DONE]"
    assert all(json.loads(d)["choices"] for d in data[:-1]), data
    assert up.last()["json"]["stream_options"] == {"include_usage": True}
    err, stats = sc.connect().request("stats")
    assert stats["sources"][0]["tokens_used"] == 702


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_providers__http_accepts_openai_answers_openai(make_sidecar, up, stream):
    up.require_auth("anthropic", KEY)
    sc, base = http_front(make_sidecar, source("claude", up.url, kind="anthropic",
                                                accepts="openai", model="claude-test", serves=["*"]))
    status, text = curl(base + "/v1/chat/completions", openai_chat("converted", stream=stream))
    assert status == 200, text
    if stream:
        data = sse_data(text)
        assert data[-1] == "[DONE]"
        chunks = [json.loads(d) for d in data[:-1]]
        assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
        assert "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks) == "converted"
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    else:
        reply = json.loads(text)
        assert reply["object"] == "chat.completion"
        assert reply["choices"][0]["message"]["content"] == "converted"
    assert up.last()["path"] == "/v1/messages" and up.last()["json"]["system"] == "Be brief."


def test_providers__http_messages_path_speaks_anthropic_sse(make_sidecar, up):
    sc, base = http_front(make_sidecar, source("claude", up.url, kind="anthropic"))
    status, text = curl(base + "/v1/messages", anthropic_body("sse", stream=True))
    assert status == 200, text
    names = [line[7:] for line in text.split("\n") if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-1] == "message_stop", names
    assert "[DONE]" not in sse_data(text)
    status, text = curl(base + "/v1/chat/completions", chat())
    assert status == 404   # this chat capability is served at /v1/messages

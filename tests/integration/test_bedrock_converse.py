"""kind: bedrock with api: converse — any Bedrock model through the Converse
API (POST /model/{id}/converse and /converse-stream), signed with AWS
Signature Version 4, the stream in AWS event-stream frames.

The upstream is tests/integration/bedrock_mock.py: it checks the signature of
every request with its own SigV4, refuses a body Converse would refuse (any
key but Converse's own, content that is not a list of text blocks), and
answers in Converse's formats. The caller speaks Messages or, with
`accepts: openai`, Chat Completions: msgpack and HTTP fronts, curl and the
official `openai` npm SDK.
"""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bedrock_mock import converse_event, eventstream_message  # noqa: E402
from conftest import POLYGW, call, config_yaml, source_yaml  # noqa: E402
from test_bedrock import (CREDS, DEFAULTS, FAST, REGION, SECRET, bm,  # noqa: E402,F401
                          assert_messages_stream, messages_body, openai_body, start)
from test_http import DEFAULTS as HTTP_DEFAULTS, front  # noqa: E402,F401
from test_providers import stream_call  # noqa: E402

NOVA = "us.amazon.nova-lite-v1:0"
PRICES = {"input": 3, "cached_input": 0.3, "cache_write": 3.75, "output": 15}
# CONVERSE_USAGE: 21 fresh input tokens, 8 read from the cache, 4 written to it, 7 output.
PROMPT, COMPLETION = 21 + 8 + 4, 7
COST = (21 * 3 + 8 * 0.3 + 4 * 3.75 + 7 * 15) / 1e6


def converse_source(name, url, **kw):
    item = dict(FAST, kind="bedrock", region=REGION, model=NOVA, api="converse", serves=["*"])
    item.update(kw)
    return source_yaml(name, "chat", url, item)


def tokens_used(c, name):
    err, stats = c.request("stats")
    assert err is None, err
    return [s for s in stats["sources"] if s["name"] == name][0]["tokens_used"]


def test_converse__messages_body_translated_and_reply_translated_back(make_sidecar, bm):
    sc = start(make_sidecar, converse_source("nova", bm.url, prices=PRICES))
    c = sc.connect()
    body = messages_body("hello nova", system="be brief", temperature=0.5, top_p=0.9,
                         stop_sequences=["END"], top_k=40)
    err, res, _ = call(c, "chat", body)
    assert err is None, err
    assert res["source"] == "nova" and res["attempts"] == 1
    reply = res["body"]
    assert reply["type"] == "message" and reply["role"] == "assistant"
    assert reply["content"] == [{"type": "text", "text": "hello nova"}]
    assert reply["stop_reason"] == "end_turn"
    assert reply["usage"] == {"input_tokens": 21, "output_tokens": 7,
                              "cache_read_input_tokens": 8, "cache_creation_input_tokens": 4}
    assert math.isclose(res["cost"], COST, rel_tol=1e-9), res
    assert tokens_used(c, "nova") == PROMPT + COMPLETION
    path, sent, headers, why = bm.seen[-1]
    assert why is None and bm.bad_signatures == 0
    assert path == "/model/us.amazon.nova-lite-v1%3A0/converse"
    assert sent == {"messages": [{"role": "user", "content": [{"text": "hello nova"}]}],
                    "system": [{"text": "be brief"}],
                    "inferenceConfig": {"maxTokens": 64, "temperature": 0.5, "topP": 0.9,
                                        "stopSequences": ["END"]},
                    "additionalModelRequestFields": {"top_k": 40}}
    assert SECRET not in sc.logs()


def test_converse__openai_body_translated_finish_reason_and_usage(make_sidecar, bm):
    bm.plan.append({"stop": "max_tokens"})
    sc = start(make_sidecar, converse_source("nova", bm.url, accepts="openai"))
    body = openai_body("as openai", max_tokens=32, stop="STOP",
                       messages=[{"role": "system", "content": "sys"},
                                 {"role": "user", "content": "first"},
                                 {"role": "assistant", "content": "ack"},
                                 {"role": "user", "content": [{"type": "text", "text": "last"}]}])
    err, res, _ = call(sc.connect(), "chat", body)
    assert err is None, err
    choice = res["body"]["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "last"}
    assert choice["finish_reason"] == "length"
    assert res["body"]["usage"] == {"prompt_tokens": PROMPT, "completion_tokens": COMPLETION,
                                    "total_tokens": PROMPT + COMPLETION}
    sent = bm.seen[-1][1]
    assert sent["system"] == [{"text": "sys"}]
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    assert sent["inferenceConfig"] == {"maxTokens": 32, "stopSequences": ["STOP"]}


@pytest.mark.parametrize("split", [0, 1, 7])
def test_converse__stream_relayed_as_messages_events(make_sidecar, bm, split):
    """Frames whole, split at every byte (1) and at odd places (7)."""
    bm.plan.append({"split": split, "text": "streamed by converse"})
    sc = start(make_sidecar, converse_source("nova", bm.url, prices=PRICES))
    c = sc.connect()
    chunks, err, res = stream_call(c, "chat", messages_body("s"))
    assert err is None, err
    assert_messages_stream(chunks, "streamed by converse")
    assert chunks[-2]["delta"]["stop_reason"] == "end_turn"
    assert res["usage"] == {"prompt_tokens": PROMPT, "completion_tokens": COMPLETION,
                            "total_tokens": PROMPT + COMPLETION}
    assert math.isclose(res["cost"], COST, rel_tol=1e-9), res
    assert tokens_used(c, "nova") == PROMPT + COMPLETION
    assert bm.seen[-1][0].endswith("/converse-stream") and bm.bad_signatures == 0


def test_converse__tpm_admits_by_the_real_usage(make_sidecar, bm):
    """The first call really used 5000 tokens (its estimate is ~20): the tpm
    bucket is empty afterwards, so the next call is not admitted."""
    big = {"inputTokens": 4990, "outputTokens": 10, "totalTokens": 5000}
    bm.plan.append({"usage": big})
    sc = start(make_sidecar, converse_source("nova", bm.url,
                                             limits={"tpm": 5000, "window_s": 3600}),
               )
    c = sc.connect()
    chunks, err, res = stream_call(c, "chat", messages_body("first"))
    assert err is None, err
    assert tokens_used(c, "nova") == 5000
    err, res, _ = call(c, "chat", messages_body("second"), deadline_s=1.0)
    assert err is not None, res
    assert len(bm.seen) == 1


def test_converse__openai_clients_over_http_with_curl(front, bm):
    f = front(sources=[converse_source("nova", bm.url, accepts="openai", ttft_timeout_s=1)],
              env=CREDS, defaults=HTTP_DEFAULTS)
    status, hdrs, body = f.curl("/v1/chat/completions", openai_body(
        "converted stream", stream=True, stream_options={"include_usage": True}))
    assert status == 200, body
    datas = [ln[6:] for ln in body.split("\n") if ln.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    chunks = [json.loads(d) for d in datas[:-1]]
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    assert "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks
                   if ch["choices"]) == "converted stream"
    assert [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"]][-1] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 40
    status, hdrs, body = f.curl("/v1/chat/completions", openai_body("plain converted"))
    assert status == 200, body
    assert json.loads(body)["choices"][0]["message"]["content"] == "plain converted"
    assert bm.bad_signatures == 0 and bm.seen[-2][0].endswith("/converse-stream")


def test_converse__messages_client_over_http_gets_named_events(front, bm):
    f = front(sources=[converse_source("nova", bm.url, ttft_timeout_s=1)], env=CREDS,
              defaults=HTTP_DEFAULTS)
    status, hdrs, body = f.curl("/v1/messages", messages_body("named events", stream=True))
    assert status == 200, body
    # Each SSE event is named by its data's type, as Anthropic sends them.
    events = [(ev.split("\ndata: ")[0][len("event: "):], json.loads(ev.split("\ndata: ")[1]))
              for ev in body.strip().split("\n\n")]
    assert all(name == data["type"] for name, data in events), events
    assert_messages_stream([data for _, data in events], "named events")
    assert events[-2][1]["usage"]["cache_read_input_tokens"] == 8


NODE_SCRIPT = r"""
const OpenAI = require('openai');
(async () => {
  const client = new OpenAI({ apiKey: 'unused', baseURL: process.argv[1], maxRetries: 0 });
  const done = await client.chat.completions.create({
    model: 'nova', messages: [{ role: 'user', content: 'sdk plain' }] });
  const stream = await client.chat.completions.create({
    model: 'nova', messages: [{ role: 'user', content: 'sdk streamed' }], stream: true,
    stream_options: { include_usage: true } });
  let text = '', usage = null, finish = null;
  for await (const ch of stream) {
    if (ch.choices.length) { text += ch.choices[0].delta.content || '';
                             finish = ch.choices[0].finish_reason || finish; }
    if (ch.usage) usage = ch.usage;
  }
  console.log(JSON.stringify({ plain: done.choices[0].message.content,
                               plain_usage: done.usage, text, finish, usage }));
})().catch((e) => { console.error(String(e)); process.exit(1); });
"""


def test_converse__official_openai_sdk_over_http(front, bm):
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    modules = os.path.join(tests, "http", "node_modules")
    assert shutil.which("node"), "node is missing (make deps installs it)"
    if not os.path.isdir(os.path.join(modules, "openai")):
        # The http stage installs them later in make test: the same
        # lockfile, installed here first (npm ci, skipped when it matches).
        sync = subprocess.run(["sh", os.path.join(tests, "npm-sync.sh"),
                               os.path.join(tests, "http")],
                              capture_output=True, text=True, timeout=600)
        assert sync.returncode == 0, sync.stdout + sync.stderr
    f = front(sources=[converse_source("nova", bm.url, accepts="openai", ttft_timeout_s=1)],
              env=CREDS, defaults=HTTP_DEFAULTS)
    p = subprocess.run(["node", "-e", NODE_SCRIPT, "http://127.0.0.1:%d/v1" % f.port],
                       capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, NODE_PATH=modules))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["plain"] == "sdk plain" and out["text"] == "sdk streamed"
    assert out["finish"] == "stop"
    assert out["usage"]["prompt_tokens"] == PROMPT and out["usage"]["completion_tokens"] == 7
    assert out["plain_usage"]["total_tokens"] == PROMPT + COMPLETION
    assert bm.bad_signatures == 0


def test_converse__throttling_is_rate_limited_and_retried(make_sidecar, bm):
    bm.plan.extend([{"status": 429}, {}, {"exception": "throttlingException", "after": 0}, {}])
    sc = start(make_sidecar, converse_source("nova", bm.url))
    c = sc.connect()
    err, res, _ = call(c, "chat", messages_body("after a 429"))
    assert err is None, err
    assert res["attempts"] == 2
    chunks, err, res = stream_call(c, "chat", messages_body("after a throttled stream"))
    assert err is None, err
    assert res["attempts"] == 2 and chunks[-1]["type"] == "message_stop"
    assert "rate_limited" in sc.logs()


def bad_payload_frame():
    """A well-framed ConverseStream message (CRCs right) whose payload is not JSON."""
    return converse_event("messageStart", {"role": "assistant"}) + eventstream_message(
        {":event-type": "contentBlockDelta", ":content-type": "application/json",
         ":message-type": "event"}, b"\x00not json{")


@pytest.mark.parametrize("plan,want", [
    ({"corrupt": 2}, "event-stream"),
    ({"corrupt": 40}, "CRC"),
    ({"raw": None}, "ConverseStream"),
    ({"raw": b"\x00\x00\x00\x10\x00\x00\x00\x00garbage!"}, "event-stream"),
], ids=["prelude-length", "payload-crc", "payload-not-json", "garbage"])
def test_converse__corrupt_or_hostile_stream_is_a_bad_response(make_sidecar, bm, plan, want):
    if "raw" in plan and plan["raw"] is None:
        plan = {"raw": bad_payload_frame()}
    bm.plan.extend([dict(plan), dict(plan)])
    sc = start(make_sidecar, converse_source("nova", bm.url))
    c = sc.connect()
    chunks, err, res = stream_call(c, "chat", messages_body("x"))
    assert err is not None, res
    assert "bad_response" in json.dumps(err) or "bad_response" in sc.logs(), err
    assert want in json.dumps(err), err
    # The sidecar still serves.
    err, res, _ = call(c, "chat", messages_body("after"))
    assert err is None, err


def test_converse__reply_that_is_not_converse_is_a_bad_response(make_sidecar, bm):
    bm.plan.extend([{"raw": b'{"type": "message", "content": []}'}, {"raw": b'[1, 2]'}])
    sc = start(make_sidecar, converse_source("nova", bm.url))
    err, res, _ = call(sc.connect(), "chat", messages_body("x"))
    assert err is not None, res
    assert "not a Bedrock Converse reply" in json.dumps(err), err


def test_converse__usage_that_cannot_be_true_is_not_counted(make_sidecar, bm):
    bm.plan.append({"usage": {"inputTokens": -5, "outputTokens": 3}})
    sc = start(make_sidecar, converse_source("nova", bm.url))
    c = sc.connect()
    chunks, err, res = stream_call(c, "chat", messages_body("x"))
    assert err is None, err
    assert "usage" not in res
    assert "upstream usage out of range" in sc.logs()


@pytest.mark.parametrize("extra,want", [
    ({"tools": [{"name": "t", "input_schema": {}}]}, "body.tools"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "only text content"),
    ({"max_tokens": 0}, "body.max_tokens"),
])
def test_converse__bodies_it_cannot_carry_are_refused(make_sidecar, bm, extra, want):
    sc = start(make_sidecar, converse_source("nova", bm.url))
    err, res, _ = call(sc.connect(), "chat", messages_body("x", **extra))
    assert err is not None, res
    assert want in json.dumps(err), err
    assert bm.seen == []


@pytest.mark.parametrize("item,want", [
    ({"kind": "bedrock", "region": REGION, "model": NOVA, "api": "chat"},
     "sources[0].api: must be invoke"),
    ({"kind": "anthropic", "api_key_env": "X", "api": "converse"},
     "sources[0].api: only valid with kind: bedrock"),
])
def test_converse__config_errors(workdir, item, want):
    path = os.path.join(workdir, "bad.yaml")
    with open(path, "w") as f:
        f.write(config_yaml([source_yaml("br", "chat", "http://127.0.0.1:9", dict(FAST, **item))],
                            DEFAULTS))
    p = subprocess.run([POLYGW, "--check-config", path], capture_output=True, text=True,
                       env=dict(os.environ, X="k", **CREDS), timeout=20)
    assert p.returncode != 0
    assert want in p.stderr, p.stderr


def test_converse__invoke_and_converse_sources_of_one_model_fail_over(make_sidecar, bm):
    """A call that fails over from a converse source to an invoke source of
    the same model id gets each its own body."""
    bm.plan.extend([{"status": 503}, {}])
    model = "anthropic.claude-3-5-haiku-20241022-v1:0"
    sc = start(make_sidecar,
               converse_source("cv", bm.url, model=model, priority=0, breaker={"failures": 1}),
               source_yaml("iv", "chat", bm.url, dict(FAST, kind="bedrock", region=REGION,
                                                      model=model, serves=["*"], priority=1)))
    err, res, _ = call(sc.connect(), "chat", messages_body("either"))
    assert err is None, err
    assert [p.rsplit("/", 1)[1] for p, _, _, _ in bm.seen] == ["converse", "invoke"], bm.seen
    assert "anthropic_version" in bm.seen[1][1] and "inferenceConfig" in bm.seen[0][1]

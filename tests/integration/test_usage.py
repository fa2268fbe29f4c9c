"""Token counts an upstream reports that cannot be true, through the real
sidecar and the mock upstream (proto/PROTOCOL.md §4.3, docs/CONFIG.md §7a): a
count that is negative, not a whole number, or over 2^40 makes the
attempt's usage unknown. The call still succeeds, nothing reconciles the
source's token counts (`tokens_used` stays 0; tpm keeps the estimate), the
result carries no `usage`, and the sidecar warns once per attempt.

Every dialect's reader is driven: OpenAI plain replies and stream usage
(read from a tree for a msgpack client, without one for the HTTP front),
Anthropic replies and message_start / message_delta, and both through the
OpenAI <-> Anthropic conversion. 2^63 - 1 is the value whose sum
overflowed (a sanitizer abort); 2^40 + 1, -1 and 1.5 were counted.
"""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import call, chat  # noqa: E402
from test_providers import anthropic_body, curl, http_front, source, start, stream_call  # noqa: E402

# JSON texts: 1.5 must stay a number with a fraction.
HOSTILE = ["9223372036854775807", "1099511627777", "-1", "1.5"]
WARN = "upstream usage out of range"


def raw(body, content_type="application/json"):
    return {"body_hex": body.encode().hex(), "content_type": content_type}


def sse(*events):
    return "".join("data: %s\n\n" % e for e in events + ("[DONE]",))


def anthropic_sse(*events):
    return "".join("event: %s\ndata: %s\n\n" % (json.loads(e)["type"], e) for e in events)


def openai_reply(usage):
    return ('{"id":"c","object":"chat.completion","choices":[{"index":0,"message":'
            '{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":%s}' % usage)


def openai_stream(usage):
    return sse('{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}',
               '{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":%s}' % usage)


def anthropic_reply(usage):
    return ('{"id":"m","type":"message","role":"assistant","model":"c","content":'
            '[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":%s}' % usage)


def anthropic_stream(start_usage, delta_usage):
    return anthropic_sse(
        '{"type":"message_start","message":{"id":"m","type":"message","role":"assistant",'
        '"model":"c","content":[],"usage":%s}}' % start_usage,
        '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
        '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}',
        '{"type":"content_block_stop","index":0}',
        '{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":%s}' % delta_usage,
        '{"type":"message_stop"}')


def openai_body(mock):
    return chat(mock=mock)


def anthropic_mock(mock):
    return anthropic_body(mock=mock)


def stream_text(chunks):
    """The text of a stream's chunks, OpenAI's or Anthropic's."""
    out = ""
    for ch in chunks:
        if ch.get("choices"):
            out += ch["choices"][0]["delta"].get("content") or ""
        elif ch.get("type") == "content_block_delta":
            out += ch["delta"]["text"]
    return out


def tokens_used(sc):
    err, stats = sc.connect().request("stats")
    assert err is None, err
    return stats["sources"][0]["tokens_used"]


def warnings(sc):
    return [l for l in sc.logs().splitlines() if WARN in l]


def check_counted_nothing(sc, calls):
    """Every call warned once, and none was counted."""
    assert tokens_used(sc) == 0
    lines = warnings(sc)
    assert len(lines) == calls, lines
    assert all('"level":"warn"' in l and '"source":"s"' in l for l in lines), lines


# (kind, accepts, stream, reply text for one hostile count V, the client's body)
CASES = {
    "openai_plain": ("openai", None, False, lambda v: openai_reply(
        '{"prompt_tokens":%s,"completion_tokens":5}' % v), openai_body),
    "openai_stream_usage_chunk": ("openai", None, True, lambda v: openai_stream(
        '{"prompt_tokens":5,"completion_tokens":%s}' % v), openai_body),
    "anthropic_message": ("anthropic", None, False, lambda v: anthropic_reply(
        '{"input_tokens":%s,"cache_read_input_tokens":5,"output_tokens":3}' % v),
        anthropic_mock),
    "anthropic_stream_message_start": ("anthropic", None, True, lambda v: anthropic_stream(
        '{"input_tokens":%s,"cache_creation_input_tokens":5,"output_tokens":1}' % v,
        '{"output_tokens":3}'), anthropic_mock),
    "anthropic_stream_message_delta": ("anthropic", None, True, lambda v: anthropic_stream(
        '{"input_tokens":5,"output_tokens":1}', '{"output_tokens":%s}' % v),
        anthropic_mock),
    "converted_plain": ("anthropic", "openai", False, lambda v: anthropic_reply(
        '{"input_tokens":%s,"cache_read_input_tokens":5,"output_tokens":3}' % v), openai_body),
    "converted_stream": ("anthropic", "openai", True, lambda v: anthropic_stream(
        '{"input_tokens":%s,"cache_read_input_tokens":5,"output_tokens":1}' % v,
        '{"output_tokens":3}'), openai_body),
}


@pytest.mark.parametrize("case", list(CASES))
def test_usage__hostile_counts_are_not_counted(make_sidecar, up, case):
    kind, accepts, stream, reply, body = CASES[case]
    extra = {"accepts": accepts} if accepts else {}
    sc = start(make_sidecar, source("s", up.url, kind=kind, **extra))
    c = sc.connect()
    ctype = "text/event-stream" if stream else "application/json"
    for v in HOSTILE:
        b = body(raw(reply(v), ctype))
        if stream:
            b = dict(b, stream_options={"include_usage": True}) if accepts else b
            chunks, err, res = stream_call(c, "chat", b)
            assert err is None, (v, err)
            assert stream_text(chunks) == "hi", (v, chunks)
            # A converted stream has no usage chunk: there is no usage to report.
            assert not any("usage" in ch for ch in chunks if accepts), (v, chunks)
        else:
            err, res, _ = call(c, "chat", b)
            assert err is None, (v, err)
            if accepts:
                assert res["body"]["choices"][0]["message"]["content"] == "hi"
                assert "usage" not in res["body"], (v, res["body"])
        assert "usage" not in res, (v, res)
    check_counted_nothing(sc, len(HOSTILE))
    # A believable reply afterwards is counted as usual.
    if kind == "openai":
        good = reply("7")
    elif stream:
        good = anthropic_stream('{"input_tokens":5,"output_tokens":1}', '{"output_tokens":2}')
    else:
        good = anthropic_reply('{"input_tokens":5,"output_tokens":2}')
    b = body(raw(good, ctype))
    if stream:
        chunks, err, res = stream_call(c, "chat", b)
    else:
        err, res, _ = call(c, "chat", b)
    assert err is None, err
    assert tokens_used(sc) == (12 if kind == "openai" else 7), res
    assert len(warnings(sc)) == len(HOSTILE)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_usage__http_front_does_not_count_hostile_counts(make_sidecar, up, stream):
    """The HTTP front reads an OpenAI reply's usage without a tree: the same
    rules, 2^64 - 1 included (a JSON number a tree cannot hold)."""
    sc, base = http_front(make_sidecar, source("s", up.url))
    values = HOSTILE + ["18446744073709551615"]
    for v in values:
        usage = '{"prompt_tokens":5,"completion_tokens":5,"total_tokens":%s}' % v
        if stream:
            mock = raw(openai_stream(usage), "text/event-stream")
        else:
            mock = raw(openai_reply(usage))
        status, text = curl(base + "/v1/chat/completions", chat(mock=mock, stream=stream))
        assert status == 200, (v, text)
        assert "hi" in text, (v, text)
    check_counted_nothing(sc, len(values))
    # Without total_tokens, prompt + completion is the total.
    mock = raw(openai_reply('{"prompt_tokens":5,"completion_tokens":2}'))
    status, text = curl(base + "/v1/chat/completions", chat(mock=mock))
    assert status == 200, text
    assert tokens_used(sc) == 7

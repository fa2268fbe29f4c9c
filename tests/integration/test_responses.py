"""OpenAI's Responses API (`POST /v1/responses`, the built-in `responses`
capability) through the real sidecar and the real mock upstream, over the
HTTP front and the msgpack `call`: plain and streamed answers, the
upstream's `event:` lines relayed before their data, no stream_options
added to the request, usage counted from the reply's `usage` and from
response.completed, and how a stream ends (completed, incomplete, failed,
an `error` event, cut before any terminal event).
"""
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "client", "python"))
import polygw  # noqa: E402
from conftest import call  # noqa: E402
from test_providers import curl, http_front, source, sse_data, start, stream_call  # noqa: E402

SEQUENCE = (["response.created", "response.in_progress", "response.output_item.added",
             "response.content_part.added"] + ["response.output_text.delta"] * 3 +
            ["response.output_text.done", "response.content_part.done",
             "response.output_item.done", "response.completed"])


def responses_body(text="hello", mock=None, **extra):
    body = {"model": "m", "input": [{"role": "user", "content": text}]}
    if mock is not None:
        body["mock"] = mock
    body.update(extra)
    return body


def sse_events(text):
    """[(event name or None, data)] of an SSE body, as a client reads it."""
    out = []
    for block in text.split("\n\n"):
        lines = [ln for ln in block.split("\n") if ln]
        if not lines:
            continue
        name = None
        data = []
        for ln in lines:
            if ln.startswith("event: "):
                assert not data, "event: after data: in %r" % block
                name = ln[7:]
            elif ln.startswith("data: "):
                data.append(ln[6:])
        out.append((name, "\n".join(data)))
    return out


def tokens_metric(c, source_name, capability="responses"):
    err, res = c.request("metrics")
    assert err is None, err
    prefix = 'polygw_source_tokens_total{source="%s",capability="%s"} ' % (source_name, capability)
    lines = [ln for ln in res["text"].splitlines() if ln.startswith(prefix)]
    return float(lines[0][len(prefix):]) if lines else None


USAGE = {"prompt_tokens": 300, "completion_tokens": 21}


def test_responses__http_plain_reply_and_usage_counted(make_sidecar, up):
    sc, base = http_front(make_sidecar, source("oa", up.url, capability="responses"))
    status, text = curl(base + "/v1/responses", responses_body("plain", mock={"usage": USAGE}))
    assert status == 200, text
    reply = json.loads(text)
    assert reply["object"] == "response" and reply["status"] == "completed"
    assert reply["output"][0]["content"][0]["text"] == "plain"
    assert reply["usage"]["input_tokens"] == 300 and reply["usage"]["output_tokens"] == 21
    assert up.last()["path"] == "/v1/responses"
    c = sc.connect()
    err, stats = c.request("stats")
    assert stats["sources"][0]["tokens_used"] == 321, stats["sources"][0]
    assert tokens_metric(c, "oa") == 321


def test_responses__http_stream_relays_event_lines_in_order(make_sidecar, up):
    sc, base = http_front(make_sidecar, source("oa", up.url, capability="responses"))
    status, text = curl(base + "/v1/responses", responses_body(
        "abcdef", stream=True, mock={"stream_events": 3, "usage": USAGE}))
    assert status == 200, text
    events = sse_events(text)
    assert [name for name, _ in events] == SEQUENCE, text
    for name, data in events:
        assert json.loads(data)["type"] == name
    assert "[DONE]" not in sse_data(text) and "event: error" not in text
    deltas = [json.loads(d)["delta"] for n, d in events if n == "response.output_text.delta"]
    assert "".join(deltas) == "abcdef"
    last = json.loads(events[-1][1])
    assert last["response"]["usage"]["total_tokens"] == 321
    assert "stream_options" not in up.last()["json"]
    c = sc.connect()
    err, stats = c.request("stats")
    assert stats["sources"][0]["tokens_used"] == 321, stats["sources"][0]
    assert tokens_metric(c, "oa") == 321


def test_responses__custom_path_ending_in_responses_is_the_responses_api(make_sidecar, up):
    """A capability whose path ends in /responses speaks the Responses API
    too: its stream ends at response.completed, stream_options is not added."""
    sc = start(make_sidecar, source("oa", up.url, capability="agents"),
               capabilities={"agents": {"path": "/agents/responses"}})
    chunks, err, res = stream_call(sc.connect(), "agents", responses_body(
        mock={"stream_events": 3, "usage": USAGE}))
    assert err is None, err
    assert chunks[-1]["type"] == "response.completed"
    assert res["usage"]["total_tokens"] == 321
    assert up.last()["path"] == "/v1/agents/responses"
    assert "stream_options" not in up.last()["json"]


def test_responses__msgpack_plain_and_stream(make_sidecar, up):
    sc = start(make_sidecar, source("oa", up.url, capability="responses"))
    c = sc.connect()
    err, res, _ = call(c, "responses", responses_body("mp", mock={"usage": USAGE}))
    assert err is None, err
    assert res["body"]["output"][0]["content"][0]["text"] == "mp"
    assert res["usage"]["total_tokens"] == 321, res
    chunks, err, res = stream_call(c, "responses", responses_body(
        "stream", mock={"stream_events": 3, "usage": USAGE}))
    assert err is None, err
    assert [ch["type"] for ch in chunks] == SEQUENCE
    assert res["usage"] == {"prompt_tokens": 300, "completion_tokens": 21, "total_tokens": 321}
    assert "stream_options" not in up.last()["json"]
    err, stats = c.request("stats")
    assert stats["sources"][0]["tokens_used"] == 642, stats["sources"][0]


def raw_stream(*events):
    """A mock behaviour answering with these SSE events, verbatim."""
    body = "".join("event: %s\ndata: %s\n\n" % (e["type"], json.dumps(e)) for e in events)
    return {"body": body, "content_type": "text/event-stream"}


CREATED = {"type": "response.created", "sequence_number": 0,
           "response": {"id": "resp_x", "object": "response", "status": "in_progress",
                        "output": [], "usage": None}}


def final(kind, status, **extra):
    resp = {"id": "resp_x", "object": "response", "status": status, "output": [],
            "usage": {"input_tokens": 11, "output_tokens": 4, "total_tokens": 15}}
    resp.update(extra)
    return {"type": kind, "sequence_number": 1, "response": resp}


def test_responses__incomplete_is_a_terminal_success(make_sidecar, up):
    sc = start(make_sidecar, source("oa", up.url, capability="responses"))
    mock = raw_stream(CREATED, final("response.incomplete", "incomplete",
                                     incomplete_details={"reason": "max_output_tokens"}))
    chunks, err, res = stream_call(sc.connect(), "responses", responses_body(mock=mock))
    assert err is None, err
    assert [ch["type"] for ch in chunks] == ["response.created", "response.incomplete"]
    assert res["usage"]["total_tokens"] == 15


def test_responses__failed_ends_the_stream_as_a_typed_failure(make_sidecar, up):
    sc = start(make_sidecar, source("oa", up.url, capability="responses"))
    mock = raw_stream(CREATED, final("response.failed", "failed",
                                     error={"code": "server_error", "message": "boom"}))
    chunks, err, res = stream_call(sc.connect(), "responses", responses_body(mock=mock))
    assert [ch["type"] for ch in chunks] == ["response.created"]
    assert err is not None and err["code"] == "stream_interrupted", (err, res)
    assert "server_error" in err["message"]


def test_responses__error_event_mid_stream_is_a_typed_failure(make_sidecar, up):
    sc, base = http_front(make_sidecar, source("oa", up.url, capability="responses"))
    chunks, err, res = stream_call(sc.connect(), "responses", responses_body(
        mock={"stream_error": "server_error"}))
    assert chunks and all(ch["type"] != "error" for ch in chunks)
    assert err is not None and err["code"] == "stream_interrupted", (err, res)
    assert "server_error" in err["message"]
    status, text = curl(base + "/v1/responses", responses_body(
        stream=True, mock={"stream_error": "server_error"}))
    events = sse_events(text)
    assert events[-1][0] == "error" and "stream_interrupted" in events[-1][1], text
    assert "response.completed" not in text


@pytest.mark.parametrize("front", ["msgpack", "http"])
def test_responses__stream_cut_before_its_terminal_event_is_interrupted(make_sidecar, up, front):
    sc, base = http_front(make_sidecar, source("oa", up.url, capability="responses"))
    body = responses_body(mock={"no_done": True})
    if front == "msgpack":
        chunks, err, _ = stream_call(sc.connect(), "responses", body)
        assert chunks and chunks[-1]["type"] == "response.output_text.delta"
        assert err["code"] == "stream_interrupted", err
        assert "response.completed" in err["message"], err
    else:
        status, text = curl(base + "/v1/responses", dict(body, stream=True))
        events = sse_events(text)
        assert events[-2][0] == "response.output_text.delta", text
        assert events[-1][0] == "error" and "stream_interrupted" in events[-1][1], text


def test_responses__chat_stream_keeps_the_upstreams_event_lines_too(make_sidecar, up):
    """Event lines are relayed for every dialect: a Chat Completions
    upstream that names its events keeps them; one that does not gets none."""
    sc, base = http_front(make_sidecar, source("oa", up.url))
    chunk = {"id": "c", "object": "chat.completion.chunk",
             "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}]}
    body = "event: delta\ndata: %s\n\ndata: [DONE]\n\n" % json.dumps(chunk)
    status, text = curl(base + "/v1/chat/completions", {
        "model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}],
        "mock": {"body": body, "content_type": "text/event-stream"}})
    assert status == 200, text
    assert sse_events(text) == [("delta", json.dumps(chunk)), (None, "[DONE]")], text
    status, text = curl(base + "/v1/chat/completions", {
        "model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]})
    assert "event:" not in text and sse_data(text)[-1] == "[DONE]", text


def test_responses__tpm_admits_by_the_streams_real_usage(make_sidecar, up):
    """The first stream really used 5000 tokens (its estimate is far less):
    the tpm bucket is empty afterwards, so the second call is not admitted
    before its deadline. Not counting response.completed's usage would
    admit it."""
    sc = start(make_sidecar, source("oa", up.url, capability="responses",
                                    limits={"tpm": 5000, "window_s": 3600}))
    c = sc.connect()
    big = {"usage": {"prompt_tokens": 4990, "completion_tokens": 10}}
    chunks, err, res = stream_call(c, "responses", responses_body("first", mock=big))
    assert err is None, err
    assert res["usage"]["total_tokens"] == 5000
    err, res, _ = call(c, "responses", responses_body("second"), deadline_s=1.0)
    assert err is not None and err["code"] in ("deadline_exceeded", "stalled"), (err, res)
    assert up.stats()["requests"] == 1


def test_responses__multi_line_data_keeps_the_chunked_framing(make_sidecar, up):
    """An upstream that pretty-prints its events sends each as several
    `data:` lines: the client reads every event, joined back whole, and the
    HTTP chunk sizes match their bytes (http.client refuses any that does
    not), for events before and after it on the same connection."""
    import http.client
    import urllib.parse
    sc, base = http_front(make_sidecar, source("oa", up.url, capability="responses"))
    events = [CREATED, {"type": "response.output_text.delta", "sequence_number": 1,
                        "delta": "multi\nline"},
              final("response.completed", "completed")]
    body = "".join("event: %s\ndata: %s\n\n" % (e["type"], json.dumps(e, indent=1).replace(
        "\n", "\ndata: ")) for e in events)
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=15)
    for _ in range(2):  # the second request reuses the connection
        conn.request("POST", "/v1/responses", json.dumps(responses_body(
            stream=True, mock={"body": body, "content_type": "text/event-stream"})),
            {"Content-Type": "application/json"})
        r = conn.getresponse()
        text = r.read().decode()
        assert r.status == 200, text
        got = sse_events(text)
        assert [n for n, _ in got] == [e["type"] for e in events], text
        assert [json.loads(d) for _, d in got] == events
    conn.close()
    c = sc.connect()
    assert tokens_metric(c, "oa") == 30


def test_responses__key_echoed_in_an_event_line_is_redacted(make_sidecar, up):
    """A key an upstream puts in an `event:` line, not in its data, reaches
    the client as [redacted]; scrubbed before the name is cut to its bound,
    so no part of a key is left where the cut falls inside it."""
    from test_providers import KEY
    sc, base = http_front(make_sidecar, source("oa", up.url, capability="responses"))
    body = ("event: {{authorization}}\ndata: %s\n\n" % json.dumps(CREATED) +
            "event: %s{{authorization}}\ndata: %s\n\n" % ("n" * 40, json.dumps(CREATED)) +
            "event: response.completed\ndata: %s\n\n"
            % json.dumps(final("response.completed", "completed")))
    status, text = curl(base + "/v1/responses", responses_body(
        stream=True, mock={"body": body, "content_type": "text/event-stream"}))
    assert status == 200, text
    names = [n for n, _ in sse_events(text)]
    assert names[0] == "Bearer [redacted]", names
    assert names[1] == "n" * 40 + "Bearer [redacted]", names
    assert KEY not in text and KEY[:12] not in text, text
    assert KEY not in sc.logs()


def test_responses__msgpack_event_names_beside_the_data(make_sidecar, up):
    """With event_names the msgpack chunks carry each event's name: the
    upstream's event: lines for Responses, none (nil) for Chat Completions;
    without it, the two-element chunks old clients read."""
    sc = start(make_sidecar, source("oa", up.url, capability="responses"),
               source("ch", up.url))
    c = sc.connect()
    body = responses_body("abc", mock={"stream_events": 2, "usage": USAGE})
    msgid = c.request_async("call", {"capability": "responses", "body": body, "stream": True,
                                     "event_names": True})
    raw = []
    while True:
        msg = c.recv_msg(10)
        assert msg is not None
        if msg[0] == 2:
            raw.append(msg[2])
        elif msg[1] == msgid:
            break
    assert msg[2] is None, msg
    assert all(len(p) == 3 and p[0] == msgid for p in raw), raw
    assert [p[2] for p in raw] == [p[1]["type"] for p in raw]
    assert raw[-1][2] == "response.completed"
    # The same call without it: [msgid, event].
    chunks, err, _ = stream_call(c, "responses", body)
    assert err is None and [ch["type"] for ch in chunks] == [p[2] for p in raw]
    # The Python client yields (name, event) pairs; a chat stream names none.
    with polygw.Client(sc.sock, call_timeout_s=15) as pc:
        pairs = list(pc.call("responses", body, stream=True, event_names=True))
        assert [n for n, _ in pairs] == [e["type"] for _, e in pairs] == [p[2] for p in raw]
        pairs = list(pc.call("chat", {"model": "m", "messages": [{"role": "user",
                                                                   "content": "hi"}]},
                             stream=True, event_names=True))
        assert pairs and all(n is None and "choices" in e for n, e in pairs), pairs
        plain = list(pc.call("chat", {"model": "m", "messages": [{"role": "user",
                                                                   "content": "hi"}]},
                             stream=True))
        assert plain and all(isinstance(e, dict) for e in plain), plain

"""Responses API follow-ups through the real sidecar and two real mock
upstreams serving the same model: a response's follow-ups
(`previous_response_id`, GET / DELETE of the response, its cancel and its
input_items, a GET with stream=true resuming its event stream) reach the
source that made it, over HTTP (curl) and msgpack,
on the memory backend and across two sidecars sharing a real
redis-server; a response polygw cannot place ends `response_not_found`
with nothing sent upstream. Also: events after the terminal event of a
Responses, Messages or Gemini stream never pass for part of a success.
"""
import json
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import call  # noqa: E402
from test_http import free_port  # noqa: E402
from test_providers import curl, http_front, source, start, stream_call  # noqa: E402
from test_responses import responses_body, sse_events  # noqa: E402


def http(method, url, body=None):
    """(status, text) of one request with curl."""
    cmd = ["curl", "-s", "--path-as-is", "--max-time", "15", "-w", "\n%{http_code}", "-X", method]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]
    out = subprocess.run(cmd + [url], capture_output=True, timeout=20).stdout.decode()
    text, _, status = out.rpartition("\n")
    return int(status), text


def requests(*ups):
    return tuple(u.stats()["requests"] for u in ups)


def maker_of(rid, up, up2):
    """The mock that made response `rid` (its ids carry the mock's pid)."""
    pid = int(rid.split("_")[2])
    assert pid in (up.proc.pid, up2.proc.pid), rid
    return up if pid == up.proc.pid else up2


def made_on_each(make, up, up2):
    """One response made on each upstream by make() (which returns its id):
    [(id, the mock that made it)], made by up2 first. A mock that has made
    one fails its next request (503), so the next call fails over."""
    made = {}
    for _ in range(6):
        if len(made) == 2:
            break
        if made:
            next(iter(made.values()))[1].script([{"status": 503}])
        rid = make()
        made.setdefault(maker_of(rid, up, up2) is up, (rid, maker_of(rid, up, up2)))
    up.script([])
    up2.script([])
    assert len(made) == 2, made
    return [made[False], made[True]]


def made_over_http(base, up, up2, stream=False):
    def make():
        status, text = curl(base + "/v1/responses", responses_body("x", stream=stream))
        assert status == 200, text
        if stream:
            return json.loads(sse_events(text)[0][1])["response"]["id"]
        return json.loads(text)["id"]
    return made_on_each(make, up, up2)


def two_sources(make_sidecar, up, up2):
    return http_front(make_sidecar, source("a", up.url, capability="responses"),
                      source("b", up2.url, capability="responses"))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_responses_followups__previous_response_id_goes_to_the_maker(make_sidecar, up, up2,
                                                                      stream):
    sc, base = two_sources(make_sidecar, up, up2)
    for rid, maker in made_over_http(base, up, up2, stream=stream):
        other = up if maker is up2 else up2
        for _ in range(2):
            before_m, before_o = maker.stats()["requests"], other.stats()["requests"]
            status, text = curl(base + "/v1/responses",
                                responses_body("again", previous_response_id=rid))
            assert status == 200, text
            assert maker.stats()["requests"] == before_m + 1
            assert other.stats()["requests"] == before_o
            assert maker.last()["json"]["previous_response_id"] == rid


def test_responses_followups__get_delete_cancel_input_items_go_to_the_maker(make_sidecar, up,
                                                                             up2):
    sc, base = two_sources(make_sidecar, up, up2)
    for rid, maker in made_over_http(base, up, up2):
        other = up if maker is up2 else up2
        n_other = other.stats()["requests"]
        cases = [("GET", "/v1/responses/%s" % rid, None),
                 ("GET", "/v1/responses/%s/input_items?limit=5&order=asc" % rid, None),
                 ("POST", "/v1/responses/%s/cancel" % rid, None),
                 ("DELETE", "/v1/responses/%s" % rid, None)]
        for method, path, body in cases:
            status, text = http(method, base + path, body)
            assert status == 200, (method, path, text)
            last = maker.last()
            assert last["method"] == method and last["target"] == path, last
            reply = json.loads(text)
            if path.endswith("input_items?limit=5&order=asc"):
                assert reply["object"] == "list"
            else:
                assert reply["id"] == rid
        assert json.loads(http("DELETE", base + "/v1/responses/%s" % rid)[1])["deleted"] is True
        assert other.stats()["requests"] == n_other


def test_responses_followups__unknown_id_with_two_sources_is_response_not_found(make_sidecar,
                                                                               up, up2):
    sc, base = two_sources(make_sidecar, up, up2)
    before = requests(up, up2)
    for method, path, body in [
            ("POST", "/v1/responses", responses_body(previous_response_id="resp_never_made")),
            ("GET", "/v1/responses/resp_never_made", None),
            ("POST", "/v1/responses/resp_never_made/cancel", None)]:
        status, text = http(method, base + path, body)
        assert status == 404, text
        err = json.loads(text)["error"]
        assert err["code"] == "response_not_found", err
        assert "resp_never_made" in err["message"] and "2 sources" in err["message"]
    assert requests(up, up2) == before  # nothing went upstream
    # over msgpack too
    err, _, _ = call(sc.connect(), "responses",
                     responses_body(previous_response_id="resp_never_made"))
    assert err["code"] == "response_not_found", err
    assert requests(up, up2) == before


def test_responses_followups__unknown_id_with_one_source_goes_there(make_sidecar, up):
    """No choice to make: a response made before polygw (or forgotten) is
    followed on the one source that can serve the call."""
    sc, base = http_front(make_sidecar, source("a", up.url, capability="responses"))
    status, text = http("GET", base + "/v1/responses/resp_made_elsewhere")
    assert status == 200 and json.loads(text)["id"] == "resp_made_elsewhere", text
    status, text = curl(base + "/v1/responses",
                        responses_body(previous_response_id="resp_made_elsewhere"))
    assert status == 200, text
    assert up.last()["json"]["previous_response_id"] == "resp_made_elsewhere"


def test_responses_followups__paths_and_methods_that_are_no_follow_up(make_sidecar, up, up2):
    sc, base = two_sources(make_sidecar, up, up2)
    before = requests(up, up2)
    for method, path, want in [("GET", "/v1/responses/resp_x/nothing", 404),
                               ("GET", "/v1/responses/../chat/completions", 404),
                               ("GET", "/v1/responses/resp_x/cancel", 405),
                               ("POST", "/v1/responses/resp_x", 405),
                               ("PUT", "/v1/responses/resp_x", 405),
                               ("GET", "/v1/responses/" + "r" * 200, 404)]:
        status, text = http(method, base + path)
        assert status == want, (method, path, status, text)
        if text:
            assert json.loads(text)["error"]["code"] in (
                "unknown_capability", "unknown_method"), text
    assert requests(up, up2) == before


def test_responses_followups__msgpack_previous_response_id(make_sidecar, up, up2):
    sc = start(make_sidecar, source("a", up.url, capability="responses"),
               source("b", up2.url, capability="responses"))
    c = sc.connect()
    err, res, _ = call(c, "responses", responses_body("first"))
    assert err is None, err
    rid = res["body"]["id"]
    maker = maker_of(rid, up, up2)
    before = requests(up, up2)
    for _ in range(3):
        err, res, _ = call(c, "responses", responses_body("next", previous_response_id=rid))
        assert err is None, err
    after = requests(up, up2)
    want = (before[0] + 3, before[1]) if maker is up else (before[0], before[1] + 3)
    assert after == want, (before, after)
    # a stream's id comes from response.created
    chunks, err, _ = stream_call(c, "responses", responses_body("s", mock={"stream_events": 2}))
    assert err is None, err
    sid = chunks[0]["response"]["id"]
    maker_before = requests(up, up2)
    err, _, _ = call(c, "responses", responses_body("n", previous_response_id=sid))
    assert err is None, err
    moved = [a - b for a, b in zip(requests(up, up2), maker_before)]
    assert moved == ([1, 0] if maker_of(sid, up, up2) is up else [0, 1]), (sid, moved)


def test_responses_followups__a_source_no_longer_configured(make_sidecar, up, up2):
    """After a reload that removes the source that made a response, its
    follow-ups end response_not_found naming it, not on another source."""
    sc, base = two_sources(make_sidecar, up, up2)
    made = made_over_http(base, up, up2)
    rid_b = made[0][0]  # made by b (up2)
    cfg_path = sc.config
    text = open(cfg_path).read()
    cut = text.index('  - name: "b"')
    open(cfg_path, "w").write(text[:cut].rstrip() + "\n" + text[text.index("\nhttp:\n") + 1:])
    c = sc.connect()
    err, res = c.request("config.reload")
    assert err is None, err
    before = requests(up, up2)
    status, body = curl(base + "/v1/responses", responses_body(previous_response_id=rid_b))
    assert status == 404, body
    err = json.loads(body)["error"]
    assert err["code"] == "response_not_found" and "'b'" in err["message"], err
    assert "no longer configured" in err["message"]
    assert requests(up, up2) == before


def test_responses_followups__remember_s_zero_remembers_nothing(make_sidecar, up, up2):
    sc, base = http_front(make_sidecar, source("a", up.url, capability="responses"),
                          source("b", up2.url, capability="responses"),
                          extra="responses:\n  remember_s: 0\n")
    status, text = curl(base + "/v1/responses", responses_body("x"))
    rid = json.loads(text)["id"]
    status, text = curl(base + "/v1/responses", responses_body(previous_response_id=rid))
    assert status == 404 and json.loads(text)["error"]["code"] == "response_not_found", text


# ------------------------------------------ resuming a background stream
def resume(url, timeout=15):
    """GET `url` (a streamed retrieve) with curl -N: (head, [(wall-clock
    time it arrived, block)]) for each SSE block."""
    p = subprocess.Popen(["curl", "-sN", "-i", "--max-time", str(timeout), url],
                         stdout=subprocess.PIPE)
    head, blocks, cur, in_head = [], [], [], True
    for raw in p.stdout:
        line = raw.decode().rstrip("\r\n")
        if in_head:
            if line:
                head.append(line)
            elif head and not head[0].startswith("HTTP/1.1 100"):
                in_head = False
            else:
                head = []
            continue
        if line:
            cur.append(line)
        elif cur:
            blocks.append((time.time(), "\n".join(cur)))
            cur = []
    p.wait(timeout)
    return "\n".join(head).lower(), blocks


def block_fields(block):
    """(id or None, event name or None, data) of one SSE block."""
    f = {"id": None, "event": None, "data": []}
    for ln in block.split("\n"):
        key, _, val = ln.partition(": ")
        if key == "data":
            f["data"].append(val)
        elif key in ("id", "event"):
            f[key] = val
    return f["id"], f["event"], "\n".join(f["data"])


def tokens_used(sc, name):
    err, stats = sc.connect().request("stats")
    assert err is None, err
    return [s for s in stats["sources"] if s["name"] == name][0]["tokens_used"]


def test_responses_followups__resumed_stream_arrives_event_by_event_on_the_maker(
        make_sidecar, up, up2):
    """client.responses.retrieve(id, {stream: true, starting_after: N}):
    the query goes to the maker unchanged, each event (id, name, data)
    reaches curl as the mock sends it, 250 ms apart, and the stream ends
    with response.completed; its usage is the original call's: not
    counted again."""
    sc, base = two_sources(make_sidecar, up, up2)
    interval = 0.25
    for rid, maker in made_over_http(base, up, up2):
        other = up if maker is up2 else up2
        n_other = other.stats()["requests"]
        used = (tokens_used(sc, "a"), tokens_used(sc, "b"))
        maker.script([{"stream_events": 4, "stream_interval_ms": int(interval * 1000),
                       "sse_ids": True, "stamp": True}])
        path = "/v1/responses/%s?stream=true&starting_after=2" % rid
        head, blocks = resume(base + path)
        assert head.startswith("http/1.1 200"), head
        assert "content-type: text/event-stream" in head, head
        assert maker.last()["method"] == "GET" and maker.last()["target"] == path
        assert other.stats()["requests"] == n_other
        events = [block_fields(b) for _, b in blocks]
        seqs = [json.loads(d)["sequence_number"] for _, _, d in events]
        assert seqs == list(range(3, 3 + len(seqs))), seqs
        assert [i for i, _, _ in events] == [str(n) for n in seqs], events
        assert all(json.loads(d)["type"] == name for _, name, d in events), events
        assert events[-1][1] == "response.completed", events
        assert json.loads(events[-1][2])["response"]["id"] == rid
        assert not any(name == "error" for _, name, _ in events)
        # Each event says when the mock wrote it (mock_sent_at, the same
        # clock): it reached curl at once, not when the stream ended ~1 s
        # later; the mock's steps, 250 ms apart, reach it 250 ms apart.
        lags = [t - json.loads(d)["mock_sent_at"] for (t, _), (_, _, d) in zip(blocks, events)]
        sent = [json.loads(d)["mock_sent_at"] for _, _, d in events]
        steps = [t for i, t in enumerate(sent) if i == 0 or t - sent[i - 1] > 0.05]
        gaps = [b - a for a, b in zip(steps, steps[1:])]
        print("resumed stream: %d events, curl got each %.1f ms (median) / %.1f ms (worst) "
              "after the mock sent it; the mock's sends %s s apart"
              % (len(lags), 1000 * sorted(lags)[len(lags) // 2], 1000 * max(lags),
                 ["%.3f" % g for g in gaps]))
        assert len(gaps) == 4 and all(g >= interval * 0.8 for g in gaps), gaps
        assert all(-0.01 < lag < 0.15 for lag in lags), lags
        assert (tokens_used(sc, "a"), tokens_used(sc, "b")) == used


def test_responses_followups__follow_ups_by_path_cost_no_budget(make_sidecar, up):
    """Output costs 1000 per million tokens: the response costs its 9
    output tokens once; its retrieve and its resumed stream (whose
    response.completed reports 90 more) reserve and charge nothing, where
    a call naming no max_output_tokens would reserve 4096."""
    sc, base = http_front(make_sidecar, source("a", up.url, capability="responses",
                                               prices={"input": 0, "output": 1000},
                                               budget={"total": 100}))

    def spent():
        err, stats = sc.connect().request("stats")
        assert err is None, err
        return [s for s in stats["sources"] if s["name"] == "a"][0]["budget"]["total"]

    status, text = curl(base + "/v1/responses", responses_body(
        "x", mock={"usage": {"prompt_tokens": 10, "completion_tokens": 9}}))
    assert status == 200, text
    rid = json.loads(text)["id"]
    assert spent() == {"limit": 100, "spent": 0.009, "reserved": 0, "left": 99.991}
    up.script([{"stream_events": 2, "usage": {"prompt_tokens": 10, "completion_tokens": 90}}])
    head, blocks = resume(base + "/v1/responses/%s?stream=true" % rid)
    assert block_fields(blocks[-1][1])[1] == "response.completed", blocks
    status, text = http("GET", base + "/v1/responses/%s" % rid)
    assert status == 200, text
    assert spent()["spent"] == 0.009


def test_responses_followups__resumed_stream_cut_or_failed_ends_typed(make_sidecar, up):
    """A resumed stream ends as a POST stream does: cut before its terminal
    event, or an upstream `error` event, is the stream_interrupted error
    event, never a silent success; response.incomplete ends it as a
    success, response.failed as a failure."""
    sc, base = http_front(make_sidecar, source("a", up.url, capability="responses"))
    url = base + "/v1/responses/resp_bg1?stream=true"
    rid = {"id": "resp_bg1"}
    cases = [
        ({"stream_events": 2, "no_done": True}, "stream_interrupted", "response.completed"),
        ({"stream_events": 2, "stream_error": "server_error"}, "stream_interrupted",
         "server_error"),
        (raw_sse([{"type": "response.created", "response": rid},
                  {"type": "response.failed",
                   "response": dict(rid, status="failed",
                                    error={"code": "server_error", "message": "x"})}], ""),
         "stream_interrupted", "reported server_error"),
    ]
    for mock, code, says in cases:
        up.script([mock])
        head, blocks = resume(url)
        assert head.startswith("http/1.1 200"), head
        events = [block_fields(b) for _, b in blocks]
        assert events and events[0][1] == "response.created", events
        assert events[-1][1] == "error", events
        assert sum(1 for _, n, _ in events if n == "error") == 1, events
        err = json.loads(events[-1][2])["error"]
        assert err["code"] == code and says in err["message"], (mock, err)
    up.script([raw_sse([{"type": "response.created", "response": rid},
                        {"type": "response.incomplete",
                         "response": dict(rid, status="incomplete")}], "")])
    head, blocks = resume(url)
    names = [block_fields(b)[1] for _, b in blocks]
    assert names == ["response.created", "response.incomplete"], names


def test_responses_followups__resumed_stream_routing_and_errors(make_sidecar, up, up2):
    """An id polygw cannot place among two makers is response_not_found
    with nothing sent; stream=false or no stream is the plain retrieve;
    an upstream that refuses the stream is an error answer (its status,
    its body), not a stream."""
    sc, base = two_sources(make_sidecar, up, up2)
    before = requests(up, up2)
    status, text = http("GET", base + "/v1/responses/resp_never_made?stream=true")
    assert status == 404 and json.loads(text)["error"]["code"] == "response_not_found", text
    assert requests(up, up2) == before
    rid, maker = made_over_http(base, up, up2)[0]
    for q in ("?stream=false", "?starting_after=3", ""):
        status, text = http("GET", base + "/v1/responses/%s%s" % (rid, q))
        assert status == 200 and json.loads(text)["id"] == rid, (q, text)
        assert maker.last()["target"] == "/v1/responses/%s%s" % (rid, q)
    maker.script([{"status": 404}])
    status, text = http("GET", base + "/v1/responses/%s?stream=true" % rid)
    assert status == 404, text
    assert "scripted 404" in json.loads(text)["error"]["message"], text  # the upstream's own


# -------------------------------------------- after the terminal event
def raw_sse(events, tail):
    body = "".join("event: %s\ndata: %s\n\n" % (e.get("type", "message"), json.dumps(e))
                   for e in events)
    return {"body": body + tail, "content_type": "text/event-stream"}


COMPLETED = [{"type": "response.created", "response": {"id": "resp_t", "output": []}},
             {"type": "response.completed",
              "response": {"id": "resp_t", "status": "completed",
                           "usage": {"input_tokens": 1, "output_tokens": 1}}}]


def test_responses_followups__well_formed_event_after_the_end_is_dropped(make_sidecar, up):
    sc, base = http_front(make_sidecar, source("a", up.url, capability="responses"))
    extra = 'event: response.extra\ndata: {"type": "response.extra"}\n\n'
    up.script([raw_sse(COMPLETED, extra)])
    status, text = curl(base + "/v1/responses", responses_body(stream=True))
    assert status == 200, text
    names = [n for n, _ in sse_events(text)]
    assert names == ["response.created", "response.completed"], text
    assert "event: error" not in text


@pytest.mark.parametrize("tail", [
    "data: this is not json\n\n",
    'event: error\ndata: {"type": "error", "code": "server_error", "message": "late"}\n\n',
], ids=["garbage", "error"])
def test_responses_followups__garbage_after_the_end_ends_typed(make_sidecar, up, tail):
    sc = start(make_sidecar, source("a", up.url, capability="responses"))
    up.script([raw_sse(COMPLETED, tail)])
    chunks, err, res = stream_call(sc.connect(), "responses", responses_body())
    assert err is not None and err["code"] == "stream_interrupted", (err, res)
    assert "terminal event" in err["message"], err


def test_responses_followups__messages_garbage_after_message_stop(make_sidecar, up):
    sc = start(make_sidecar, source("c", up.url, kind="anthropic", model="claude-test",
                                    serves=["*"]))
    events = [{"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 1}}},
              {"type": "message_stop"}]
    up.script([raw_sse(events, "data: {not json\n\n")])
    body = {"model": "claude-test", "max_tokens": 8,
            "messages": [{"role": "user", "content": "x"}]}
    chunks, err, res = stream_call(sc.connect(), "chat", body)
    assert err is not None and err["code"] == "stream_interrupted", (err, res)


# -------------------------------------------------- across a Redis fleet
def test_responses_followups__fleet_follows_on_the_maker(up, up2, make_sidecar):
    """Two sidecars sharing one real redis-server: a response made through
    A is followed through B on the source that made it (its stream resumed
    through B's HTTP front too); the id is kept under the fleet's prefix
    with the configured TTL."""
    from redis_fixture import FleetRedis, fleet_config, unique_prefix, wait_backend
    from redis_fixture import source as fleet_source
    srv = FleetRedis().start()
    try:
        prefix = unique_prefix()
        cfg = fleet_config(srv.url(), prefix,
                           [fleet_source("a", "responses", up.url),
                            fleet_source("b", "responses", up2.url)])
        cfg += "responses:\n  remember_s: 600\n"
        port = free_port()
        a, b = [make_sidecar(config_text=cfg + extra, subdir="sc%d" % i,
                             env={"no_proxy": "*", "NO_PROXY": "*"})
                for i, extra in enumerate(["", 'http:\n  listen: "127.0.0.1:%d"\n' % port])]
        for sc in (a, b):
            wait_backend(sc)
        ca, cb = a.connect(), b.connect()
        def make():
            err, res, _ = call(ca, "responses", responses_body("x"))
            assert err is None, err
            return res["body"]["id"]
        made = made_on_each(make, up, up2)
        r = srv.client()
        for rid, maker in made:
            key = "{%s:resp:%s}" % (prefix, rid)
            assert r.call("GET", key) in (b"a", b"b", "a", "b")
            assert 590 <= r.call("TTL", key) <= 600
            before = requests(up, up2)
            err, res, _ = call(cb, "responses", responses_body("y", previous_response_id=rid))
            assert err is None, err
            after = requests(up, up2)
            want = (before[0] + 1, before[1]) if maker is up else (before[0], before[1] + 1)
            assert after == want, (rid, before, after)
            # its stream resumed through B's HTTP front, on the maker too
            maker.script([{"stream_events": 2}])
            head, blocks = resume("http://127.0.0.1:%d/v1/responses/%s?stream=true" % (port, rid))
            assert head.startswith("http/1.1 200"), head
            assert block_fields(blocks[-1][1])[1] == "response.completed", blocks
            assert maker.last()["target"] == "/v1/responses/%s?stream=true" % rid
            want = (want[0] + 1, want[1]) if maker is up else (want[0], want[1] + 1)
            assert requests(up, up2) == want
        before = requests(up, up2)
        err, _, _ = call(cb, "responses", responses_body(previous_response_id="resp_unknown"))
        assert err["code"] == "response_not_found", err
        assert requests(up, up2) == before
        for sc in (a, b):
            sc.stop()
    finally:
        srv.cleanup()

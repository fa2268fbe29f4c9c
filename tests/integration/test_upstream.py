"""The upstream engine (issue 3) through the real sidecar and the real mock
upstream: calls, hard deadlines in every phase, isolation of hung upstreams,
cancellation, streaming, msgpack<->JSON transcoding, typed errors, shutdown.

Every test owns a fresh sidecar (checked at teardown: exit 0, no sanitizer
report) and a fresh mock upstream (checked the same way). Only 127.0.0.1 is
used. Host names go through the LD_PRELOAD shim tests/shim/dnshang.c:
`hang.polygw.test` blocks in getaddrinfo for a minute, `api.polygw.test`
resolves to 127.0.0.1 at once.

Timing bounds. A deadline case asserts
    deadline - EARLY <= elapsed <= deadline + LATE
where `elapsed` is measured by the test around the whole call (socket round
trip and the mock's own latency included). LATE is 150 ms: the engine arms
one libev timer per attempt at the phase's deadline, so the real error is a
few ms (see the timing lines printed with `pytest -s`); the rest is margin for
the ASan build and a loaded 2-core CI machine.
"""
import email.utils
import json
import os
import select
import signal
import socket
import sys
import time

import msgpack
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import BUILD, call, chat as chat_body, config_yaml, source_yaml  # noqa: E402

KEY_ENV = "POLYGW_TEST_KEY"
KEY = "sk-test-upstream-0123456789"
SHIM = os.path.join(BUILD, "shim", "dnshang.so")
HANG_HOST = "hang.polygw.test"
MAPPED_HOST = "api.polygw.test"
NX_HOST = "nx.polygw.test"
DNS_CAP = 4          # SERVER_DNS_LOOKUPS_PER_HOST: lookups per host at once

EARLY = 0.05
LATE = 0.15

# Generous by default, so that only the timeout under test can fire, and
# with admission wide open (no AIMD ramp-up, no breaker) so that the engine
# sees every call at once.
LONG = {"timeout_s": 10, "connect_timeout_s": 5, "ttft_timeout_s": 5, "idle_timeout_s": 5,
        "max_concurrency": 256, "aimd": {"initial": 256}, "breaker": {"failures": 100000}}


# --------------------------------------------------------------- helpers
def source(name, capability, base_url, key=True, **kw):
    """One `sources:` item: the long timeouts of LONG unless overridden."""
    defaults = {"api_key_env": KEY_ENV, **LONG} if key else LONG
    return source_yaml(name, capability, base_url, defaults, **kw)


# These tests pin the engine: one attempt per call, so every deadline and
# classification is seen directly. The governed loop (retries, backoff,
# stall budget) has its own tests in test_governance.py.
ENGINE_DEFAULTS = {"max_attempts": 1, "stall_window_s": 60, "backoff_base_s": 0.05,
                   "backoff_max_s": 0.1}


def shim_env(hang_s=60):
    """Environment preloading the DNS shim. ASan wants to be first in the
    library list; the shim (unsanitized) comes before it, which is harmless.
    The shim logs each hung lookup to the sidecar's log (shim_hangs())."""
    asan = os.environ.get("ASAN_OPTIONS", "detect_leaks=1")
    return {
        "LD_PRELOAD": SHIM,
        "POLYGW_TEST_DNS_HANG": HANG_HOST,
        "POLYGW_TEST_DNS_HANG_S": str(hang_s),
        "POLYGW_TEST_DNS_MAP": "%s=127.0.0.1" % MAPPED_HOST,
        "POLYGW_TEST_DNS_FAIL": NX_HOST,
        "POLYGW_TEST_DNS_LOG": "1",
        "ASAN_OPTIONS": asan + ":verify_asan_link_order=0",
    }


def shim_hangs(sc):
    """How many getaddrinfo calls entered the shim's hang (resolver threads)."""
    return sc.logs().count("dnshang: lookup of %s hangs" % HANG_HOST)


def start(make_sidecar, sources, capabilities=None, grace=2, shim=False, listen=None, **kw):
    # A proxy from the environment must not capture the loopback mock.
    env = {KEY_ENV: KEY, "no_proxy": "*", "NO_PROXY": "*"}
    if shim:
        assert os.path.exists(SHIM), "DNS shim not built: %s (run make)" % SHIM
        env.update(shim_env())
    return make_sidecar(config_text=config_yaml(sources, ENGINE_DEFAULTS, capabilities,
                                                listen=listen, grace=grace), env=env, **kw)


def chat(text="hello", mock=None, **extra):
    return chat_body(text, mock, model="client-model", **extra)


def call_stream(c, capability, body, timeout=5.0, **params):
    """A streaming call: (error, result, [(t, event), ...], t_end), times
    relative to sending the request."""
    p = {"capability": capability, "body": body, "stream": True}
    p.update(params)
    t0 = time.monotonic()
    msgid = c.request_async("call", p)
    chunks = []
    deadline = t0 + timeout
    while True:
        msg = c.recv_msg(max(0.001, deadline - time.monotonic()))
        now = time.monotonic() - t0
        assert msg is not None, "connection closed during the stream"
        if msg[0] == 2 and msg[1] == "chunk":
            assert msg[2][0] == msgid
            chunks.append((now, msg[2][1]))
        elif msg[0] == 1 and msg[1] == msgid:
            return msg[2], msg[3], chunks, now


def reason(err):
    return err["sources"][0]["reason"]


def assert_at_deadline(what, elapsed, deadline):
    print("timing: %-34s elapsed %.3fs  deadline %.3fs  late %+.0f ms"
          % (what, elapsed, deadline, (elapsed - deadline) * 1000))
    assert deadline - EARLY <= elapsed <= deadline + LATE, \
        "%s: ended after %.3fs, deadline %.3fs" % (what, elapsed, deadline)


def upstream_stats(c):
    err, st = c.request("stats")
    assert err is None
    return st["upstream"]


def assert_ping_fast(c, budget_s=0.1):
    t0 = time.monotonic()
    err, res = c.request("ping", timeout=2)
    dt = time.monotonic() - t0
    assert err is None and res["version"]
    assert dt < budget_s, "ping took %.3fs" % dt
    return dt


def wait_until(pred, timeout=2.0, interval=0.005):
    """Polls pred() until it is truthy; returns (value, seconds waited)."""
    t0 = time.monotonic()
    while True:
        v = pred()
        if v:
            return v, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError("condition not met within %.1fs" % timeout)
        time.sleep(interval)


class FullBacklog:
    """A loopback listener whose accept queue is full and never drained:
    a further connect() stays in SYN_SENT (the kernel drops the SYNs), i.e.
    a connect that never completes, without leaving 127.0.0.1."""

    def __init__(self):
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(0)
        self.port = self.ls.getsockname()[1]
        self.fill = []
        for _ in range(3):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", self.port))
            self.fill.append(s)
        # Make sure the queue really is full: a fresh probe must not connect.
        probe = socket.socket()
        probe.setblocking(False)
        probe.connect_ex(("127.0.0.1", self.port))
        _, w, _ = select.select([], [probe], [], 0.2)
        probe.close()
        if w:
            self.close()
            pytest.skip("cannot make connect() hang on loopback here")

    @property
    def url(self):
        return "http://127.0.0.1:%d/v1" % self.port

    def close(self):
        for s in self.fill:
            s.close()
        self.ls.close()


@pytest.fixture
def backlog():
    fb = FullBacklog()
    yield fb
    fb.close()


# --------------------------------------------------------------- plain calls
def test_upstream__chat_success_key_and_model_override(make_sidecar, up):
    sc = start(make_sidecar, [source("chat-a", "chat", up.url, model="override-model", serves=["*"])])
    c = sc.connect()
    text = "Say hi, sidecar"
    err, res, elapsed = call(c, "chat", chat(text))
    assert err is None, err
    assert res["body"]["choices"][0]["message"]["content"] == text
    assert res["body"]["object"] == "chat.completion"
    assert res["source"] == "chat-a"
    assert res["attempts"] == 1
    assert isinstance(res["elapsed_s"], float) and 0 < res["elapsed_s"] <= elapsed
    assert res["stalled_s"] == 0
    usage = res["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert usage == res["body"]["usage"]

    seen = up.last()
    assert seen["path"] == "/v1/chat/completions"
    assert seen["authorization"] == "Bearer " + KEY
    assert seen["headers"]["content-type"] == "application/json"
    assert seen["json"]["model"] == "override-model"
    assert seen["json"]["messages"] == [{"role": "user", "content": text}]
    assert "stream" not in seen["json"]
    # Keep-alive: a second call reuses the upstream connection.
    err, res, _ = call(c, "chat", chat("again"))
    assert err is None and res["body"]["choices"][0]["message"]["content"] == "again"
    st = up.stats()
    assert st["requests"] == 2 and st["accepted_connections"] == 1


def test_upstream__body_stream_key_never_makes_a_plain_call_stream(make_sidecar, up):
    sc = start(make_sidecar, [source("chat-a", "chat", up.url)])
    c = sc.connect()
    err, res, _ = call(c, "chat", chat("x", stream=True))
    assert err is None, err
    assert res["body"]["choices"][0]["message"]["content"] == "x"
    assert up.last()["json"]["stream"] is False


def test_upstream__embeddings_and_ocr_with_configured_path(make_sidecar, up):
    sc = start(make_sidecar, [source("emb", "embedding", up.url, key=False),
                              source("ocr-a", "ocr", up.url, model="ocr-model", serves=["*"])],
               capabilities={"ocr": {"path": "/mistral/ocr"}})
    c = sc.connect()
    err, res, _ = call(c, "embedding", {"model": "e-model", "input": ["one", "two"]})
    assert err is None, err
    assert res["source"] == "emb" and res["attempts"] == 1
    data = res["body"]["data"]
    assert [d["index"] for d in data] == [0, 1]
    assert all(len(d["embedding"]) == 8 and all(isinstance(x, float) for x in d["embedding"])
               for d in data)
    assert res["usage"]["prompt_tokens"] > 0
    seen = up.last()
    assert seen["path"] == "/v1/embeddings"
    assert seen["authorization"] is None          # a source without a key sends none

    err, res, _ = call(c, "ocr", {"model": "x", "input": "scanned page text"})
    assert err is None, err
    assert res["source"] == "ocr-a"
    assert res["body"]["text"] == "scanned page text"
    assert res["usage"]["pages_processed"] == 1
    seen = up.last()
    assert seen["path"] == "/v1/mistral/ocr"
    assert seen["json"]["model"] == "ocr-model"
    assert seen["authorization"] == "Bearer " + KEY


def test_upstream__host_name_resolved_through_the_shim(make_sidecar, up):
    url = "http://%s:%d/v1" % (MAPPED_HOST, up.port)
    sc = start(make_sidecar, [source("named", "chat", url)], shim=True)
    c = sc.connect()
    err, res, _ = call(c, "chat", chat("by name"))
    assert err is None, err
    assert res["body"]["choices"][0]["message"]["content"] == "by name"
    assert up.last()["headers"]["host"] == "%s:%d" % (MAPPED_HOST, up.port)


# --------------------------------------------------------------- deadlines
def test_upstream__dns_hang_ends_at_connect_timeout(make_sidecar, up):
    """getaddrinfo blocks for a minute: the attempt ends at connect_timeout_s
    as dns_timeout, the resolver thread is abandoned (not joined: the loop
    answers a ping at once), and the lookup is counted. Once lookups of the
    host were abandoned, the per-host cap counts them and further lookups
    fail at once instead of piling up threads."""
    url = "http://%s:%d/v1" % (HANG_HOST, up.port)
    sc = start(make_sidecar, [source("dns", "chat", url, connect_timeout_s=0.5)], shim=True)
    c = sc.connect()
    p = sc.connect()
    err, res, elapsed = call(c, "chat", chat())
    assert res is None and err["code"] == "retry_exhausted", err
    assert reason(err) == "dns_timeout"
    assert "name resolution" in err["sources"][0]["detail"]
    assert_at_deadline("dns hang / connect_timeout_s", elapsed, 0.5)
    assert_ping_fast(p)
    st = upstream_stats(p)
    assert st["dns_lookups"] == 1 and st["dns_abandoned"] == 1
    assert st["timeouts_resolving"] == 1
    assert st["attempts_active"] == 0

    # Cancelling a call stuck in getaddrinfo does not block the loop either.
    msgid = c.request_async("call", {"capability": "chat", "body": chat()})
    wait_until(lambda: shim_hangs(sc) == 2)
    t0 = time.monotonic()
    c.send([2, "cancel", [msgid]])
    err = c.wait_response(msgid, 2)[2]
    assert err["code"] == "cancelled"
    assert time.monotonic() - t0 < 0.1
    assert_ping_fast(p)
    st = upstream_stats(p)
    assert st["dns_abandoned"] == 2 and st["attempts_cancelled"] == 1

    # Two abandoned lookups still run: two more may start (cap 4), the
    # third call is refused at once.
    t0 = time.monotonic()
    ids = [c.request_async("call", {"capability": "chat", "body": chat()}) for _ in range(3)]
    ends = {}
    for _ in range(3):
        msg = c.recv_msg(2)
        ends[msg[1]] = (msg[2], time.monotonic() - t0)
    assert set(ends) == set(ids)
    fast = [(e, t) for e, t in ends.values() if reason(e) == "dns_failed"]
    slow = [(e, t) for e, t in ends.values() if reason(e) == "dns_timeout"]
    assert len(fast) == 1 and len(slow) == 2, ends
    assert "too many lookups of %s" % HANG_HOST in fast[0][0]["sources"][0]["detail"]
    assert fast[0][1] < 0.1
    for e, t in slow:
        assert_at_deadline("dns hang (2 orphans running)", t, 0.5)
    st = upstream_stats(p)
    assert st["dns_lookups"] == 4 and st["dns_abandoned"] == 4 and st["dns_busy"] == 1
    assert shim_hangs(sc) == 4                 # never more than the cap in getaddrinfo
    assert up.stats()["requests"] == 0


def test_upstream__dns_lookups_over_the_cap_wait_without_a_thread(make_sidecar, up):
    """Six calls at once to a name that is not cached: four lookups start,
    the other two wait for one of them (no fifth thread) within the same
    connect_timeout_s."""
    url = "http://%s:%d/v1" % (HANG_HOST, up.port)
    sc = start(make_sidecar, [source("dns", "chat", url, connect_timeout_s=0.5)], shim=True)
    c = sc.connect()
    t0 = time.monotonic()
    ids = [c.request_async("call", {"capability": "chat", "body": chat()}) for _ in range(6)]
    wait_until(lambda: shim_hangs(sc) == DNS_CAP)
    st = upstream_stats(sc.connect())
    assert st["dns_lookups"] == DNS_CAP and st["dns_waits"] == 2 and st["attempts_active"] == 6
    ends = {}
    for _ in range(6):
        msg = c.recv_msg(2)
        ends[msg[1]] = (msg[2], time.monotonic() - t0)
    assert set(ends) == set(ids)
    waited = 0
    for e, t in ends.values():
        assert e["code"] == "retry_exhausted", e
        # A waiter ends at its own deadline, or at the same moment because
        # the lookups it waited for were just abandoned (dns_failed).
        assert reason(e) in ("dns_timeout", "dns_failed"), e
        waited += "waiting for one of the 4 lookups" in e["sources"][0]["detail"] or \
            reason(e) == "dns_failed"
        assert_at_deadline("dns hang, %d calls at once" % len(ids), t, 0.5)
    assert waited == 2
    st = upstream_stats(sc.connect())
    assert st["dns_lookups"] == DNS_CAP and st["dns_abandoned"] == DNS_CAP
    assert shim_hangs(sc) == DNS_CAP


def test_upstream__burst_to_a_named_host_is_never_refused(make_sidecar, up):
    """The lookup cap counts lookups, not attempts: twenty calls at once to a
    healthy host name all succeed, cold (nothing cached yet: at most four
    lookups, the rest wait for the cache) and warm (no lookup at all)."""
    url = "http://%s:%d/v1" % (MAPPED_HOST, up.port)
    sc = start(make_sidecar, [source("named", "chat", url)], shim=True)
    c = sc.connect()
    for round_ in ("cold", "warm"):
        ids = {c.request_async("call", {"capability": "chat",
                                        "body": chat("%s %d" % (round_, i),
                                                     mock={"delay_ms": 50})}): i
               for i in range(20)}
        for msgid, i in ids.items():
            msg = c.wait_response(msgid, 3)
            assert msg[2] is None, msg[2]
            assert msg[3]["body"]["choices"][0]["message"]["content"] == "%s %d" % (round_, i)
        st = upstream_stats(c)
        print("timing: %s burst of 20 to a host name: %d lookups, %d waits"
              % (round_, st["dns_lookups"], st["dns_waits"]))
        assert 1 <= st["dns_lookups"] <= DNS_CAP and st["dns_busy"] == 0
        if round_ == "cold":
            cold_lookups = st["dns_lookups"]
    assert st["dns_lookups"] == cold_lookups    # the warm round looked nothing up


def test_upstream__failed_lookups_are_not_abandoned_ones(make_sidecar, up):
    """NXDOMAIN answers at once: the resolver thread is done, so nothing is
    counted as abandoned and the cap never refuses the next lookups."""
    url = "http://%s:%d/v1" % (NX_HOST, up.port)
    sc = start(make_sidecar, [source("nx", "chat", url)], shim=True)
    c = sc.connect()
    for _ in range(DNS_CAP + 2):
        err, res, elapsed = call(c, "chat", chat())
        assert err["code"] == "retry_exhausted" and reason(err) == "dns_failed", err
        assert "too many lookups" not in err["sources"][0]["detail"]
        assert elapsed < 0.5
    st = upstream_stats(c)
    assert st["dns_lookups"] == DNS_CAP + 2
    assert st["dns_abandoned"] == 0 and st["dns_busy"] == 0


def test_upstream__connect_that_never_completes(make_sidecar, backlog):
    sc = start(make_sidecar, [source("conn", "chat", backlog.url, connect_timeout_s=0.5)])
    c = sc.connect()
    err, res, elapsed = call(c, "chat", chat())
    assert err["code"] == "retry_exhausted", err
    assert reason(err) == "connect_timeout"
    assert_at_deadline("connect hang / connect_timeout_s", elapsed, 0.5)
    assert upstream_stats(c)["timeouts_connecting"] == 1


def test_upstream__accept_then_never_read(make_sidecar, up):
    """The mock's `hang: accept`: TCP accepted by the kernel, the request
    sits unread. Connect succeeded and the request was sent, so TTFT
    catches it."""
    sc = start(make_sidecar, [source("a", "chat", up.url, ttft_timeout_s=0.5)])
    c = sc.connect()
    up.script([{"hang": "accept"}])
    err, res, elapsed = call(c, "chat", chat())
    assert err["code"] == "retry_exhausted", err
    assert reason(err) == "ttft_timeout"
    assert_at_deadline("accept hang / ttft_timeout_s", elapsed, 0.5)
    up.wait_stats(lambda s: s["open_connections"] == 0 and s["aborted_by_peer"] == 1)


@pytest.mark.parametrize("case", [
    # (name, source timeouts, mock behaviour, stream, expected reason, deadline)
    ("before_headers", {"ttft_timeout_s": 0.5}, {"hang": "before_headers"}, False,
     "ttft_timeout", 0.5),
    ("after_headers plain", {"idle_timeout_s": 0.5}, {"hang": "after_headers"}, False,
     "idle_timeout", 0.5),
    ("after_headers stream", {"ttft_timeout_s": 0.5}, {"hang": "after_headers"}, True,
     "ttft_timeout", 0.5),
    ("trickle 1 B / 200 ms", {"idle_timeout_s": 0.5, "timeout_s": 1.0},
     {"trickle_ms": 200, "trickle_bytes": 1}, False, "total_timeout", 1.0),
    # The first SSE event needs ~250 bytes, ~50 s at this pace: bytes keep
    # the idle deadline away, the stream's TTFT (first event) is set beyond
    # timeout_s here, so timeout_s catches it (see also the next test).
    ("trickle stream 1 B / 200 ms", {"idle_timeout_s": 0.5, "timeout_s": 1.0},
     {"trickle_ms": 200, "trickle_bytes": 1}, True, "total_timeout", 1.0),
], ids=lambda c: c[0].replace(" ", "_"))
def test_upstream__mock_hang_ends_at_its_deadline(make_sidecar, up, case):
    name, timeouts, behaviour, stream, want, deadline = case
    sc = start(make_sidecar, [source("a", "chat", up.url, **timeouts)])
    c = sc.connect()
    body = chat(mock=behaviour)
    if stream:
        err, res, chunks, elapsed = call_stream(c, "chat", body)
        assert chunks == []
    else:
        err, res, elapsed = call(c, "chat", body)
    assert res is None and err["code"] == "retry_exhausted", err
    assert reason(err) == want, err
    assert_at_deadline(name, elapsed, deadline)
    # The torn-down transfer closed its upstream connection.
    up.wait_stats(lambda s: s["open_connections"] == 0 and s["aborted_by_peer"] == 1)


def test_upstream__stream_ttft_counts_events_not_bytes(make_sidecar, up):
    """Headers at once, then a byte every 100 ms: bytes keep coming, but no
    complete event within ttft_timeout_s."""
    sc = start(make_sidecar, [source("a", "chat", up.url, ttft_timeout_s=0.6, idle_timeout_s=0.3)])
    c = sc.connect()
    err, res, chunks, elapsed = call_stream(c, "chat", chat(mock={"trickle_ms": 100}))
    assert chunks == [] and err["code"] == "retry_exhausted", err
    assert reason(err) == "ttft_timeout"
    assert_at_deadline("stream trickle / ttft_timeout_s", elapsed, 0.6)


def test_upstream__deadline_s_of_the_call(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    err, res, elapsed = call(c, "chat", chat(mock={"hang": "before_headers"}), deadline_s=0.4)
    assert res is None and err["code"] == "deadline_exceeded", err
    assert_at_deadline("deadline_s", elapsed, 0.4)
    up.wait_stats(lambda s: s["open_connections"] == 0 and s["aborted_by_peer"] == 1)
    # deadline_s later than the answer changes nothing
    err, res, _ = call(c, "chat", chat("in time", mock={"delay_ms": 50}), deadline_s=2)
    assert err is None and res["body"]["choices"][0]["message"]["content"] == "in time"


# --------------------------------------------------------------- cut bodies
def test_upstream__connection_refused(make_sidecar):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                   # nobody listens there now
    sc = start(make_sidecar, [source("a", "chat", "http://127.0.0.1:%d/v1" % port)])
    c = sc.connect()
    err, res, elapsed = call(c, "chat", chat())
    assert res is None and err["code"] == "retry_exhausted", err
    assert reason(err) == "connect_failed"
    assert elapsed < 0.5


def test_upstream__proxy_from_the_environment_is_used(make_sidecar, up):
    """libcurl's proxy variables still apply (the engine tells its handles
    "no proxy" only when none is set): a source on a host that does not exist
    is reached through http_proxy, here the mock, which takes absolute-form
    targets. Without the variable the same call fails to resolve."""
    url = "http://upstream.polygw.invalid/v1"
    cfg = config_yaml([source("proxied", "chat", url)], ENGINE_DEFAULTS)
    env = {KEY_ENV: KEY, "no_proxy": "", "NO_PROXY": "", "http_proxy": up.base}
    c = make_sidecar(config_text=cfg, env=env).connect()
    err, res, _ = call(c, "chat", chat("via the proxy"))
    assert err is None, err
    assert res["body"]["choices"][0]["message"]["content"] == "via the proxy"
    seen = up.last()
    assert seen["target"] == url + "/chat/completions" and seen["authorization"] == "Bearer " + KEY

    inherited = [v for v in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy",
                             "ALL_PROXY", "no_proxy", "NO_PROXY") if v in os.environ]
    if inherited:
        return  # the second sidecar would inherit them: the case is the first one's
    c2 = make_sidecar(config_text=cfg, env={KEY_ENV: KEY}, subdir="direct").connect()
    err, res, _ = call(c2, "chat", chat("no proxy"))
    assert res is None and reason(err) == "dns_failed", err
    assert up.stats()["requests"] == 1


def test_upstream__upstream_closes_without_answering(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    err, res, elapsed = call(c, "chat", chat(mock={"hang": "before_headers", "hang_ms": 100}))
    assert res is None and err["code"] == "retry_exhausted", err
    assert reason(err) == "connection_reset", err
    assert 0.1 <= elapsed < 0.5
    # headers, then the upstream closes in the middle of the body
    err, res, elapsed = call(c, "chat", chat(mock={"hang": "after_headers", "hang_ms": 100}))
    assert res is None and reason(err) in ("truncated", "connection_reset"), err


def test_upstream__stale_keepalive_connection_is_not_an_error(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    assert call(c, "chat", chat("one"))[0] is None
    up.reset(drop_connections=True)             # the pooled connection dies while idle
    err, res, _ = call(c, "chat", chat("two"))
    assert err is None, err
    assert res["body"]["choices"][0]["message"]["content"] == "two"


def test_upstream__oversized_reply_is_refused(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)], listen={"max_message_bytes": 16384})
    c = sc.connect()
    up.script([{"content": "x" * 20000}])
    err, res, _ = call(c, "chat", chat())
    assert res is None and err["code"] == "retry_exhausted", err
    assert reason(err) == "bad_response"
    assert "larger than max_message_bytes" in err["sources"][0]["detail"]
    # an event over the limit inside a stream
    up.script([{"content": "x" * 20000, "stream_events": 1}])
    err, res, chunks, _ = call_stream(c, "chat", chat())
    assert chunks == [] and reason(err) == "bad_response", err
    err, res, _ = call(c, "chat", chat("small again"))
    assert err is None


def test_upstream__stream_answered_with_plain_json(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    err, res, chunks, _ = call_stream(c, "chat", chat(mock={"body": '{"id": "x", "choices": []}'}))
    assert chunks == [] and err["code"] == "retry_exhausted", err
    assert reason(err) == "bad_response"
    assert "text/event-stream" in err["sources"][0]["detail"]


def test_upstream__connection_closed_mid_body(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    err, res, elapsed = call(c, "chat", chat(mock={"close_after_bytes": 40}))
    assert res is None and err["code"] == "retry_exhausted", err
    assert reason(err) in ("truncated", "connection_reset"), err
    assert elapsed < 0.5


def test_upstream__no_length_body_cut_short_is_never_success(make_sidecar, up):
    """Close-delimited body (no Content-Length, not chunked): curl cannot tell
    a cut from the end, but the partial JSON does not parse."""
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    err, res, _ = call(c, "chat", chat(mock={"no_length": True, "close_after_bytes": 40}))
    assert res is None and err["code"] == "retry_exhausted", err
    assert reason(err) == "bad_response"
    assert "not JSON" in err["message"]
    # the same framing, complete, is a success
    err, res, _ = call(c, "chat", chat("whole", mock={"no_length": True}))
    assert err is None and res["body"]["choices"][0]["message"]["content"] == "whole"


def test_upstream__non_json_reply_is_a_clear_transient_error(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    err, res, _ = call(c, "chat", chat(mock={"body": "<html>oops</html>",
                                             "content_type": "text/html"}))
    assert res is None and err["code"] == "retry_exhausted", err
    assert reason(err) == "bad_response"
    assert "reply is not JSON" in err["message"]
    assert err["status"] == 200


def test_upstream__stream_closed_mid_stream_is_interrupted(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    err, res, chunks, _ = call_stream(c, "chat", chat("abcdefghijklmnop",
                                                      mock={"close_after_bytes": 400}))
    assert len(chunks) >= 1
    assert res is None and err["code"] == "stream_interrupted", err
    assert reason(err) in ("truncated", "connection_reset")


def test_upstream__stream_without_terminal_event_is_never_success(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    # events relayed, then a clean end without finish_reason / [DONE]
    err, res, chunks, _ = call_stream(c, "chat", chat("abcd", mock={"no_done": True}))
    assert len(chunks) == 4
    assert res is None and err["code"] == "stream_interrupted", err
    assert reason(err) == "truncated"
    # the same, close-delimited
    err, res, chunks, _ = call_stream(c, "chat", chat("abcd", mock={"no_done": True,
                                                                    "no_length": True}))
    assert len(chunks) == 4 and err["code"] == "stream_interrupted", err
    # no event at all: an ordinary failed attempt
    err, res, chunks, _ = call_stream(c, "chat", chat("abcd", mock={"no_done": True,
                                                                    "stream_events": 0}))
    assert chunks == [] and err["code"] == "retry_exhausted", err
    assert reason(err) == "truncated"


# --------------------------------------------------------------- isolation
def test_upstream__fifty_hung_attempts_do_not_slow_a_healthy_source(make_sidecar, up, up2,
                                                                    backlog):
    """50 attempts stuck in every kind of hang (DNS through the shim, connect,
    before/after headers, trickle, a silent stream) while a healthy source
    keeps its latency and the loop answers ping at once. Of the six calls to
    the hung name, four are in getaddrinfo and two wait for a lookup slot
    (the per-host cap is 4); once those lookups are abandoned, a further
    call to that name is refused at once (dns_failed)."""
    hang_url = "http://%s:%d/v1" % (HANG_HOST, up.port)
    long = {"timeout_s": 30, "connect_timeout_s": 30, "ttft_timeout_s": 30, "idle_timeout_s": 30}
    caps = {"dnshang": {"path": "/chat/completions"}, "connhang": {"path": "/chat/completions"},
            "mockhang": {"path": "/chat/completions"}}
    sc = start(make_sidecar, [source("healthy", "chat", up2.url),
                              source("dns", "dnshang", hang_url, **long),
                              source("conn", "connhang", backlog.url, **long),
                              source("hang", "mockhang", up.url, **long)],
               capabilities=caps, shim=True)
    ok = sc.connect()
    pinger = sc.connect()

    baseline = []
    for i in range(10):
        err, res, dt = call(ok, "chat", chat("warm %d" % i))
        assert err is None
        baseline.append(dt)

    stuck = sc.connect()
    plan = ([("dnshang", None, False)] * 6 + [("connhang", None, False)] * 10 +
            [("mockhang", {"hang": "before_headers"}, False)] * 12 +
            [("mockhang", {"hang": "after_headers"}, False)] * 12 +
            [("mockhang", {"trickle_ms": 200}, False)] * 6 +
            [("mockhang", {"hang": "after_headers"}, True)] * 4)
    assert len(plan) == 50
    for cap, behaviour, stream in plan:
        p = {"capability": cap, "body": chat(mock=behaviour)}
        if stream:
            p["stream"] = True
        stuck.request_async("call", p)

    up.wait_stats(lambda s: s["in_progress"] == 34, timeout=3)
    wait_until(lambda: shim_hangs(sc) == DNS_CAP)
    st = upstream_stats(pinger)
    assert st["attempts_active"] == 50, st
    assert st["dns_lookups"] == DNS_CAP and st["dns_waits"] == 2

    lat, pings = [], []
    for i in range(20):
        err, res, dt = call(ok, "chat", chat("healthy %d" % i))
        assert err is None and res["body"]["choices"][0]["message"]["content"] == "healthy %d" % i
        lat.append(dt)
        pings.append(assert_ping_fast(pinger))
    lat.sort()
    baseline.sort()
    print("timing: healthy call with 50 hung: p50 %.1f ms max %.1f ms (alone: p50 %.1f ms "
          "max %.1f ms); ping max %.1f ms" % (lat[10] * 1000, lat[-1] * 1000,
                                              baseline[5] * 1000, baseline[-1] * 1000,
                                              max(pings) * 1000))
    assert lat[-1] < 0.5
    assert upstream_stats(pinger)["attempts_active"] == 50
    with pytest.raises(socket.timeout):
        stuck.recv_msg(timeout=0.05)           # none of the hung calls ended

    # The client goes away: every hung attempt is torn down at once, the
    # resolver threads are abandoned without blocking the loop.
    t0 = time.monotonic()
    stuck.close()
    assert_ping_fast(pinger)
    up.wait_stats(lambda s: s["open_connections"] == 0, timeout=1)
    print("timing: 50 hung attempts torn down, mock connections closed after %.1f ms"
          % ((time.monotonic() - t0) * 1000))
    st, _ = wait_until(lambda: (lambda s: s if s["attempts_active"] == 0 else None)(
        upstream_stats(pinger)), timeout=1)
    assert st["attempts_cancelled"] == 50
    assert st["dns_abandoned"] == DNS_CAP
    err, res, dt = call(ok, "chat", chat("after"))
    assert err is None and dt < 0.5

    # The four abandoned lookups still hang: a new call to that name fails
    # at once instead of starting a fifth thread.
    err, res, dt = call(pinger, "dnshang", chat())
    assert err["code"] == "retry_exhausted" and reason(err) == "dns_failed", err
    assert "too many lookups" in err["sources"][0]["detail"]
    assert dt < 0.1
    assert shim_hangs(sc) == DNS_CAP


@pytest.mark.timing
def test_upstream__slow_client_pauses_the_stream(make_sidecar, up):
    """A client that does not read its chunks: the sidecar stops reading the
    upstream once max_write_queue_bytes are queued (the mock's stream stays
    in progress, the sidecar's memory does not grow), the idle deadline does
    not run while paused, and every chunk arrives once the client reads."""
    sc = start(make_sidecar, [source("a", "chat", up.url, idle_timeout_s=0.5)],
               listen={"max_message_bytes": 16384, "max_write_queue_bytes": 16384})
    c = sc.connect()
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    events = 40000                              # ~8 MB of SSE
    msgid = c.request_async("call", {"capability": "chat", "stream": True,
                                     "body": chat("y" * 4000, mock={"stream_events": events})})
    time.sleep(1.0)                             # twice idle_timeout_s, not reading
    assert up.stats()["in_progress"] == 1       # the upstream is held back, not drained
    err, st = sc.connect().request("stats")
    relayed = st["requests"]["chunks_relayed"]
    assert 0 < relayed < events / 2, relayed
    chunks, text_out = 0, []
    while True:
        msg = c.recv_msg(10)
        assert msg is not None
        if msg[0] == 2:
            chunks += 1
            ev = msg[2][1]
            if ev["choices"]:
                text_out.append(ev["choices"][0]["delta"].get("content") or "")
            continue
        assert msg[1] == msgid
        break
    assert msg[2] is None, msg[2]
    assert chunks == events + 1                 # content events + the finish event
    assert "".join(text_out) == "y" * 4000
    assert msg[3]["usage"]["completion_tokens"] == 1000

    # Paused again, then the client leaves: the upstream connection closes.
    c2 = sc.connect()
    c2.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c2.request_async("call", {"capability": "chat", "stream": True,
                              "body": chat("y" * 4000, mock={"stream_events": events})})
    time.sleep(0.3)
    assert up.stats()["in_progress"] == 1
    t0 = time.monotonic()
    c2.close()
    up.wait_stats(lambda s: s["in_progress"] == 0 and s["aborted_by_peer"] == 1,
                  interval=0.002)
    assert time.monotonic() - t0 < 0.05


# --------------------------------------------------------------- cancellation
def test_upstream__cancel_closes_the_upstream_connection(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    msgid = c.request_async("call", {"capability": "chat",
                                     "body": chat(mock={"hang": "before_headers"})})
    up.wait_stats(lambda s: s["in_progress"] == 1 and s["open_connections"] == 1)
    t0 = time.monotonic()
    c.send([2, "cancel", [msgid]])
    msg = c.wait_response(msgid, 2)
    t_resp = time.monotonic() - t0
    assert msg[2]["code"] == "cancelled" and msg[3] is None
    assert msg[2]["attempts"] == 1
    _, waited = wait_until(lambda: (lambda s: s["open_connections"] == 0 and
                                    s["aborted_by_peer"] == 1)(up.stats()), timeout=1,
                           interval=0.002)
    closed = time.monotonic() - t0
    print("timing: cancel -> response %.1f ms, upstream connection closed <= %.1f ms"
          % (t_resp * 1000, closed * 1000))
    assert closed < 0.05
    # a cancel for a call that already ended is ignored; the connection works
    c.send([2, "cancel", [msgid]])
    err, res, _ = call(c, "chat", chat("still here"))
    assert err is None and res["body"]["choices"][0]["message"]["content"] == "still here"
    err, st = c.request("stats")
    assert st["requests"]["cancels"] == 1
    assert st["rejected"]["cancelled"] == 1
    assert st["upstream"]["attempts_cancelled"] == 1


def test_upstream__cancel_during_a_stream(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    msgid = c.request_async("call", {"capability": "chat", "stream": True,
                                     "body": chat("abcdefgh", mock={"stream_interval_ms": 300,
                                                                    "stream_events": 8})})
    msg = c.recv_msg(2)
    assert msg[0] == 2 and msg[1] == "chunk" and msg[2][0] == msgid
    t0 = time.monotonic()
    c.send([2, "cancel", [msgid]])
    msg = c.wait_response(msgid, 2)
    assert msg[2]["code"] == "cancelled"
    up.wait_stats(lambda s: s["open_connections"] == 0 and s["aborted_by_peer"] == 1,
                  interval=0.002)
    assert time.monotonic() - t0 < 0.05
    with pytest.raises(socket.timeout):
        c.recv_msg(0.4)                        # nothing for that msgid after the response


def test_upstream__client_disconnect_closes_the_upstream_connection(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    c.request_async("call", {"capability": "chat", "body": chat(mock={"hang": "after_headers"})})
    c.request_async("call", {"capability": "chat", "stream": True,
                             "body": chat(mock={"hang": "after_headers"})})
    up.wait_stats(lambda s: s["in_progress"] == 2 and s["open_connections"] == 2)
    t0 = time.monotonic()
    c.close()
    up.wait_stats(lambda s: s["open_connections"] == 0 and s["aborted_by_peer"] == 2,
                  interval=0.002)
    closed = time.monotonic() - t0
    print("timing: client disconnect -> upstream connections closed <= %.1f ms" % (closed * 1000))
    assert closed < 0.05
    p = sc.connect()
    st, _ = wait_until(lambda: (lambda s: s if s["upstream"]["attempts_active"] == 0 else None)(
        p.request("stats")[1]))
    assert st["upstream"]["attempts_cancelled"] == 2
    assert st["requests"]["in_flight"] == 0


# --------------------------------------------------------------- streaming
@pytest.mark.parametrize("include_usage", [False, True], ids=["usage_on_finish", "usage_chunk"])
def test_upstream__stream_chunks_arrive_as_they_are_produced(make_sidecar, up, include_usage):
    sc = start(make_sidecar, [source("a", "chat", up.url, idle_timeout_s=1)])
    c = sc.connect()
    text = "The quick brown fox jumps over the lazy dog"
    body = chat(text, mock={"stream_interval_ms": 200, "stream_events": 4})
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    err, res, chunks, t_end = call_stream(c, "chat", body)
    assert err is None, err
    assert "body" not in res
    assert res["source"] == "a" and res["attempts"] == 1
    content = "".join(ev["choices"][0]["delta"].get("content") or ""
                      for _, ev in chunks if ev["choices"])
    assert content == text
    # 4 content events + the finish event (+ the usage-only event)
    assert len(chunks) == (6 if include_usage else 5)
    assert chunks[-1 if not include_usage else -2][1]["choices"][0]["finish_reason"] == "stop"
    usage = res["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    first = chunks[0][0]
    print("timing: stream first chunk %.0f ms, response %.0f ms" % (first * 1000, t_end * 1000))
    assert t_end - first >= 0.4
    assert first < 0.2
    # chunks are spread out as the upstream produced them
    assert chunks[2][0] - chunks[1][0] >= 0.1
    seen = up.last()["json"]
    assert seen["stream"] is True
    err, st = c.request("stats")
    assert st["requests"]["chunks_relayed"] == len(chunks)


def test_upstream__stream_idle_between_events(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url, idle_timeout_s=0.3)])
    c = sc.connect()
    err, res, chunks, t_end = call_stream(c, "chat", chat("abcd", mock={"stream_interval_ms": 800}))
    assert len(chunks) == 1
    assert res is None and err["code"] == "stream_interrupted", err
    assert reason(err) == "idle_timeout"
    assert_at_deadline("stream idle between events", t_end - chunks[0][0], 0.3)
    up.wait_stats(lambda s: s["open_connections"] == 0 and s["aborted_by_peer"] == 1)


def test_upstream__deadline_s_mid_stream(make_sidecar, up):
    """The caller's deadline passing after the first chunk is still
    deadline_exceeded (nothing failed; a retry of the whole call would hit
    the same deadline), not stream_interrupted."""
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    err, res, chunks, t_end = call_stream(c, "chat", chat("abcd", mock={"stream_interval_ms": 300}),
                                          deadline_s=0.5)
    assert len(chunks) == 2
    assert res is None and err["code"] == "deadline_exceeded", err
    assert_at_deadline("deadline_s mid-stream", t_end, 0.5)


def test_upstream__client_vanishing_while_chunks_are_relayed(make_sidecar, up):
    """The client closes while a fast stream is being relayed: the write of a
    chunk fails inside the event hook and tears the call down there (this
    was a use-after-free of the call). Repeated to hit that window."""
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    p = sc.connect()
    for _ in range(20):
        c = sc.connect()
        c.request_async("call", {"capability": "chat", "stream": True,
                                 "body": chat("z" * 2000, mock={"stream_events": 20000})})
        msg = c.recv_msg(5)
        assert msg[0] == 2 and msg[1] == "chunk"
        c.close()
    assert_ping_fast(p)
    up.wait_stats(lambda s: s["in_progress"] == 0 and s["open_connections"] <= 1)
    st = upstream_stats(p)
    assert st["attempts_active"] == 0 and st["attempts_cancelled"] == 20


def test_upstream__stream_error_status_is_not_sse(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    err, res, chunks, _ = call_stream(c, "chat", chat(mock={"status": 400}))
    assert chunks == [] and err["code"] == "upstream_rejected", err
    assert err["status"] == 400
    assert err["upstream_body"]["error"]["type"] == "invalid_request_error"


# --------------------------------------------------------------- transcoding
ROUND_TRIP = {
    "nested": {"a": {"b": {"c": [1, [2, [3, {"d": None}]]]}}},
    "array": [1, "two", 3.5, True, False, None, [], {}],
    "unicode": "héllo wörld — 你好 — 🚀 \u0000 \"quoted\" \\ /\n\t",
    "big": 2 ** 53 + 1,
    "int64_max": 2 ** 63 - 1,
    "int64_min": -2 ** 63,
    "negative": -42,
    "floats": [0.1, -2.5e-300, 1.7976931348623157e308, 1e21, 123456789.125, -0.0, 1.0],
    "bools": [True, False],
    "null": None,
    "empty_str": "",
}


def test_upstream__msgpack_to_json_request(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    body = chat("round trip", extra=ROUND_TRIP, uint64_max=2 ** 64 - 1)
    # The mock's own JSON parser (jansson) refuses integers above int64 and
    # "\u0000", so the answer is scripted from the queue (a body's `mock`
    # key would need that parse); the record keeps the raw body regardless.
    up.script([{"body": '{"ok": true}'}])
    err, res, _ = call(c, "chat", body)
    assert err is None, err
    assert res["body"] == {"ok": True}
    seen = up.last()
    assert not seen["body_truncated"]
    sent = json.loads(seen["body"])            # Python's json: exact big integers
    assert sent["extra"] == ROUND_TRIP
    assert sent["uint64_max"] == 2 ** 64 - 1
    # types survive too: 1.0 stays a float, big ints stay ints
    assert isinstance(sent["extra"]["floats"][-1], float)
    assert isinstance(sent["extra"]["big"], int)
    assert str(sent["extra"]["floats"][5]) == "-0.0"
    # key order is kept
    assert list(sent["extra"]) == list(ROUND_TRIP)
    # and the float text is the shortest that reads back exactly
    assert '"floats":[0.1,' in seen["body"].replace(" ", "")


def test_upstream__json_to_msgpack_reply(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    raw = json.dumps({"id": "x", "value": ROUND_TRIP, "dup": 1, "usage": {"total_tokens": 3}},
                     ensure_ascii=False)
    raw = raw.replace('"dup": 1', '"dup": 1, "dup": 2')        # duplicate keys: the last wins
    err, res, _ = call(c, "chat", chat(mock={"body": raw}))
    assert err is None, err
    assert res["body"]["value"] == ROUND_TRIP
    got = res["body"]["value"]
    assert isinstance(got["floats"][-1], float) and isinstance(got["big"], int)
    assert got["big"] == 2 ** 53 + 1 and got["int64_min"] == -2 ** 63
    assert res["body"]["dup"] == 2
    assert res["usage"] == {"total_tokens": 3}
    # The raw msgpack of the response: floats are float64, ints smallest.
    c.send([0, 900, "call", [{"capability": "chat",
                              "body": chat(mock={"body": '{"f": 0.5, "i": 7}'})}]])
    buf, raw_resp = b"", None
    unpacker = msgpack.Unpacker(raw=False)
    c.sock.settimeout(2)
    while raw_resp is None:
        data = c.sock.recv(65536)
        assert data
        buf += data
        unpacker.feed(data)
        raw_resp = next(unpacker, None)
    assert raw_resp[1] == 900 and raw_resp[3]["body"] == {"f": 0.5, "i": 7}
    assert b"\xa1f\xcb\x3f\xe0\x00\x00\x00\x00\x00\x00" in buf   # "f": float64 0.5
    assert b"\xa1i\x07" in buf                                      # "i": fixint 7

    # An integer beyond int64 cannot be relayed: the call fails, clearly.
    err, res, _ = call(c, "chat", chat(mock={"body": '{"n": 18446744073709551615}'}))
    assert res is None and err["code"] == "retry_exhausted", err
    assert reason(err) == "bad_response"


# --------------------------------------------------------------- pipelining
def test_upstream__pipelined_calls_answer_out_of_order(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    t0 = time.monotonic()
    slow = c.request_async("call", {"capability": "chat", "body": chat("slow", mock={"delay_ms": 300})})
    fast = c.request_async("call", {"capability": "chat", "body": chat("fast")})
    ping = c.request_async("ping")
    order, times = [], {}
    for _ in range(3):
        msg = c.recv_msg(3)
        assert msg[0] == 1
        order.append(msg[1])
        times[msg[1]] = time.monotonic() - t0
        assert msg[2] is None, msg
        if msg[1] == slow:
            assert msg[3]["body"]["choices"][0]["message"]["content"] == "slow"
        elif msg[1] == fast:
            assert msg[3]["body"]["choices"][0]["message"]["content"] == "fast"
        else:
            assert msg[1] == ping and msg[3]["version"]
    assert order[-1] == slow and set(order[:2]) == {fast, ping}
    assert times[fast] < 0.2 and times[ping] < 0.2 and times[slow] >= 0.3


# --------------------------------------------------------------- HTTP errors
def test_upstream__429_carries_retry_after(make_sidecar, up):
    # Not exempt here, so one 429 uses the single attempt of the budget (the
    # exempt case, which waits in the stall budget, is a governance test).
    sc = start(make_sidecar, [source("a", "chat", up.url)],
               capabilities={"chat": {"exempt_429": False}})
    c = sc.connect()
    err, res, _ = call(c, "chat", chat(mock={"status": 429, "retry_after": 7}))
    assert res is None and err["code"] == "retry_exhausted", err
    assert err["retry_after_s"] == 7
    assert err["status"] == 429 and reason(err) == "http_429"
    # HTTP-date form
    date = email.utils.formatdate(time.time() + 30, usegmt=True)
    err, res, _ = call(c, "chat", chat(mock={"status": 429, "retry_after": date}))
    assert 27 <= err["retry_after_s"] <= 31, err
    # without the header: the sidecar's own estimate, which still honours
    # the Retry-After this source sent on the previous call
    err, res, _ = call(c, "chat", chat(mock={"status": 429}))
    assert err["status"] == 429 and reason(err) == "http_429"
    assert 25 <= err["retry_after_s"] <= 31, err


@pytest.mark.parametrize("status,etype", [(400, "invalid_request_error"),
                                          (401, "authentication_error"),
                                          (404, None)])
def test_upstream__4xx_is_upstream_rejected_with_body(make_sidecar, up, status, etype):
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    err, res, elapsed = call(c, "chat", chat(mock={"status": status,
                                                   "error_message": "nope: bad thing"}))
    assert res is None and err["code"] == "upstream_rejected", err
    assert err["status"] == status
    assert err["attempts"] == 1
    ub = err["upstream_body"]
    assert ub["error"]["message"] == "nope: bad thing"
    if etype:
        assert ub["error"]["type"] == etype
    assert reason(err) == "http_4xx"
    assert elapsed < 0.5


def test_upstream__4xx_with_non_json_body(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    err, res, _ = call(c, "chat", chat(mock={"status": 403, "body": "Forbidden by WAF",
                                             "content_type": "text/plain"}))
    assert err["code"] == "upstream_rejected" and err["status"] == 403
    assert err["upstream_body"] == "Forbidden by WAF"


@pytest.mark.parametrize("status,want", [(500, "http_5xx"), (503, "http_5xx"),
                                         (408, "http_408"), (409, "http_409")])
def test_upstream__5xx_408_409_are_transient(make_sidecar, up, status, want):
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    err, res, _ = call(c, "chat", chat(mock={"status": status}))
    assert res is None and err["code"] == "retry_exhausted", err
    assert err["status"] == status and reason(err) == want
    assert "upstream_body" not in err


# --------------------------------------------------------------- shutdown
def test_upstream__sigterm_lets_a_call_in_flight_finish(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)], grace=2)
    c = sc.connect()
    t0 = time.monotonic()
    msgid = c.request_async("call", {"capability": "chat",
                                     "body": chat("finishing", mock={"delay_ms": 500})})
    up.wait_stats(lambda s: s["in_progress"] == 1)
    sc.send_signal(signal.SIGTERM)
    msg = c.wait_response(msgid, 3)
    assert msg[2] is None, msg
    assert msg[3]["body"]["choices"][0]["message"]["content"] == "finishing"
    assert sc.proc.wait(3) == 0
    elapsed = time.monotonic() - t0
    print("timing: SIGTERM with a 500 ms call: exit after %.0f ms" % (elapsed * 1000))
    assert 0.5 <= elapsed < 1.5


@pytest.mark.timing
def test_upstream__sigterm_with_a_hung_call_ends_at_the_grace_period(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url)], grace=1)
    c = sc.connect()
    msgid = c.request_async("call", {"capability": "chat", "body": chat(mock={"hang": "before_headers"})})
    up.wait_stats(lambda s: s["in_progress"] == 1)
    t0 = time.monotonic()
    sc.send_signal(signal.SIGTERM)
    msg = c.wait_response(msgid, 3)
    t_resp = time.monotonic() - t0
    assert msg[2]["code"] == "shutting_down", msg
    assert sc.proc.wait(3) == 0
    t_exit = time.monotonic() - t0
    print("timing: SIGTERM with a hung call: shutting_down after %.0f ms, exit after %.0f ms "
          "(grace 1 s)" % (t_resp * 1000, t_exit * 1000))
    assert_at_deadline("shutdown grace", t_resp, 1.0)
    assert t_exit < 1.0 + LATE + 0.2
    up.wait_stats(lambda s: s["open_connections"] == 0 and s["aborted_by_peer"] == 1)


# --------------------------------------------------------------- stats
def test_upstream__stats_counters_move(make_sidecar, up):
    sc = start(make_sidecar, [source("a", "chat", up.url, ttft_timeout_s=0.3)])
    c = sc.connect()
    before = upstream_stats(c)
    assert before["attempts_started"] == before["attempts_done"] == 0
    call(c, "chat", chat())
    call(c, "chat", chat(mock={"hang": "before_headers"}))
    msgid = c.request_async("call", {"capability": "chat", "body": chat(mock={"hang": "before_headers"})})
    up.wait_stats(lambda s: s["in_progress"] == 1)
    assert upstream_stats(c)["attempts_active"] == 1
    c.send([2, "cancel", [msgid]])
    assert c.wait_response(msgid)[2]["code"] == "cancelled"
    st = upstream_stats(c)
    assert st["attempts_started"] == 3
    assert st["attempts_done"] == 2
    assert st["attempts_cancelled"] == 1
    assert st["attempts_active"] == 0
    assert st["timeouts_sent"] == 1
    assert st["dns_abandoned"] == 0


def test_upstream__duplicate_inflight_msgid_is_a_connection_error(make_sidecar, up):
    """Two responses with one msgid could not be told apart: reusing the msgid
    of a call still in flight closes the connection with a fatal bad_request,
    cancelling the call (its upstream connection closes too)."""
    sc = start(make_sidecar, [source("a", "chat", up.url)])
    c = sc.connect()
    c.send([0, 7, "call", [{"capability": "chat", "body": chat(mock={"delay_ms": 5000})}]])
    assert wait_until(lambda: up.stats()["in_progress"] == 1)
    c.send([0, 7, "ping", []])
    msgs = c.expect_eof(timeout=3)
    assert len(msgs) == 1 and msgs[0][0] == 2 and msgs[0][1] == "error", msgs
    assert msgs[0][2][0]["code"] == "bad_request"
    assert "already in flight" in msgs[0][2][0]["message"]
    assert wait_until(lambda: up.stats()["open_connections"] == 0)
    # other connections are unaffected
    assert sc.connect().request("ping")[0] is None

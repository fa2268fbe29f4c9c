"""The response cache (docs/CONFIG.md, "cache") through the real sidecar
and the real mock upstream, counting what reaches the mock: an answer asked
twice reaches it once, two apps each reach it, a streamed answer replays as
a stream with the same events, the client's and the upstream's
Cache-Control are honoured, entries expire, a hit spends no quota, the
byte cap holds under a fill, and the msgpack front's `cache` parameter."""
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import await_true, call, chat, source_yaml  # noqa: E402
from test_http import FAST, front  # noqa: E402,F401

DEFAULTS = {"max_attempts": 1, "stall_window_s": 1, "backoff_base_s": 0.05, "backoff_max_s": 0.1}


def cached_front(front, up, ttl_s=60, cache_extra=None, extra="", source_kw=None, **kw):
    c = {"ttl_s": ttl_s}
    c.update(cache_extra or {})
    sources = [source_yaml("m1", "chat", up.url, FAST, **(source_kw or {})),
               source_yaml("e1", "embedding", up.url, FAST, model="emb-1", serves=["*"],
                           **(source_kw or {}))]
    return front(sources=sources, defaults=kw.pop("defaults", DEFAULTS),
                 capabilities={"chat": {"cache": c}, "embedding": {"cache": c}}, extra=extra, **kw)


def requests(up):
    return up.stats()["requests"]


def metric(f, name, capability=None):
    _, _, text = f.curl("/metrics")
    pat = r"^%s%s (\S+)$" % (re.escape(name),
                             r'\{capability="%s"\}' % capability if capability else "")
    m = re.search(pat, text, re.M)
    return float(m.group(1)) if m else None


def test_cache__embeddings_twice_reach_the_mock_once(front, up):
    f = cached_front(front, up)
    body = {"model": "e", "input": ["a", "b"]}
    s1, h1, b1 = f.curl("/v1/embeddings", body)
    assert s1 == 200 and h1["x-polygw-cache"] == "miss", (s1, h1, b1)
    # The same body with other whitespace, member order and a `user`.
    s2, h2, b2 = f.curl("/v1/embeddings", '{ "input": ["a","b"],  "model":"e", "user": "u7" }')
    assert s2 == 200 and h2["x-polygw-cache"] == "hit", (s2, h2)
    assert h2["x-polygw-source"] == "cache" and h2["x-polygw-attempts"] == "0"
    assert json.loads(b2) == json.loads(b1)
    assert requests(up) == 1
    # Another body is another entry.
    s3, h3, _ = f.curl("/v1/embeddings", {"model": "e", "input": ["a", "c"]})
    assert s3 == 200 and h3["x-polygw-cache"] == "miss"
    assert requests(up) == 2
    # The access log says which were answered from the cache.
    lines = [json.loads(x) for x in f.sc.logs().splitlines()
             if x.startswith("{") and '"msg":"call"' in x and '"capability":"embedding"' in x]
    assert [(x["cache"], x["source"], x["attempts"], x["code"]) for x in lines] == [
        ("miss", "e1", 1, "ok"), ("hit", "cache", 0, "ok"), ("miss", "e1", 1, "ok")]


def test_cache__off_by_default(front, up):
    f = front(defaults=DEFAULTS)
    for _ in range(2):
        s, h, _ = f.curl("/v1/embeddings", {"model": "e", "input": ["a"]})
        assert s == 200 and "x-polygw-cache" not in h
    assert requests(up) == 2


def test_cache__two_apps_each_reach_the_mock(front, up):
    apps = ("apps:\n  - {name: alpha, token_env: PGW_TOK_A}\n"
            "  - {name: beta, token_env: PGW_TOK_B}\n")
    env = {"PGW_TOK_A": "tok-alpha-5d1e8c2b7a9f", "PGW_TOK_B": "tok-beta-0c3f6a9e2d1b"}
    f = cached_front(front, up, extra=apps, env=env)
    body = {"model": "e", "input": ["same"]}
    for tok, want in (("tok-alpha-5d1e8c2b7a9f", "miss"), ("tok-beta-0c3f6a9e2d1b", "miss"),
                      ("tok-alpha-5d1e8c2b7a9f", "hit"), ("tok-beta-0c3f6a9e2d1b", "hit")):
        s, h, b = f.curl("/v1/embeddings", body, headers=["Authorization: Bearer " + tok])
        assert s == 200 and h["x-polygw-cache"] == want, (tok, s, h, b)
    assert requests(up) == 2


def test_cache__shared_capability_serves_every_app(front, up):
    apps = ("apps:\n  - {name: alpha, token_env: PGW_TOK_A}\n"
            "  - {name: beta, token_env: PGW_TOK_B}\n")
    env = {"PGW_TOK_A": "tok-alpha-5d1e8c2b7a9f", "PGW_TOK_B": "tok-beta-0c3f6a9e2d1b"}
    f = cached_front(front, up, cache_extra={"shared": True}, extra=apps, env=env)
    body = {"model": "e", "input": ["same"]}
    _, h1, _ = f.curl("/v1/embeddings", body, headers=["Authorization: Bearer tok-alpha-5d1e8c2b7a9f"])
    _, h2, _ = f.curl("/v1/embeddings", body, headers=["Authorization: Bearer tok-beta-0c3f6a9e2d1b"])
    assert (h1["x-polygw-cache"], h2["x-polygw-cache"]) == ("miss", "hit")
    assert requests(up) == 1


def sse(body):
    """[(event name or None, data)] of an SSE body."""
    out = []
    for block in body.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if data:
            out.append((name, "\n".join(data)))
    return out


def test_cache__stream_replays_as_the_same_stream(front, up):
    f = cached_front(front, up)
    body = chat("one two three four five", stream=True, mock={"stream_events": 5})
    s1, h1, b1 = f.curl("/v1/chat/completions", body)
    assert s1 == 200 and h1["x-polygw-cache"] == "miss"
    s2, h2, b2 = f.curl("/v1/chat/completions", body)
    assert s2 == 200 and h2["x-polygw-cache"] == "hit", (h2, b2)
    assert h2["content-type"] == "text/event-stream"
    first, again = sse(b1), sse(b2)
    assert len(first) >= 6 and first[-1] == (None, "[DONE]")
    assert again == first
    assert requests(up) == 1
    # A plain request is another entry (no plain answer is made of a stream).
    s3, h3, b3 = f.curl("/v1/chat/completions", dict(body, stream=False))
    assert s3 == 200 and h3["x-polygw-cache"] == "miss"
    assert requests(up) == 2


def test_cache__anthropic_stream_replays_its_event_names(front, up):
    src = [source_yaml("a1", "messages", up.url, FAST, kind="anthropic")]
    f = front(sources=src, defaults=DEFAULTS,
              capabilities={"messages": {"path": "/messages", "cache": {"ttl_s": 60}}})
    body = {"model": "claude", "max_tokens": 50, "stream": True,
            "messages": [{"role": "user", "content": "red green blue"}]}
    s1, h1, b1 = f.curl("/v1/messages", body)
    s2, h2, b2 = f.curl("/v1/messages", body)
    assert s1 == s2 == 200, (b1, b2)
    assert (h1["x-polygw-cache"], h2["x-polygw-cache"]) == ("miss", "hit")
    first = sse(b1)
    assert [n for n, _ in first][:1] == ["message_start"] and first[-1][0] == "message_stop"
    assert sse(b2) == first
    assert requests(up) == 1


def test_cache__a_failed_stream_is_not_stored(front, up):
    f = cached_front(front, up)
    body = chat("one two three four", stream=True)
    up.script([{"close_after_bytes": 300}])
    s1, _, b1 = f.curl("/v1/chat/completions", body)
    assert "error" in b1
    s2, h2, b2 = f.curl("/v1/chat/completions", body)
    assert s2 == 200 and h2["x-polygw-cache"] == "miss", b2
    assert requests(up) == 2


def test_cache__client_no_store_and_no_cache(front, up):
    f = cached_front(front, up)
    body = {"model": "e", "input": ["x"]}
    _, h, _ = f.curl("/v1/embeddings", body, headers=["Cache-Control: no-store"])
    assert h["x-polygw-cache"] == "bypass"
    _, h, _ = f.curl("/v1/embeddings", body)
    assert h["x-polygw-cache"] == "miss"          # no-store stored nothing
    _, h, _ = f.curl("/v1/embeddings", body, headers=["Cache-Control: no-cache"])
    assert h["x-polygw-cache"] == "miss"          # no-cache skips the lookup...
    assert requests(up) == 3
    _, h, _ = f.curl("/v1/embeddings", body)
    assert h["x-polygw-cache"] == "hit"           # ...and stores
    _, h, _ = f.curl("/v1/embeddings", body, headers=["Cache-Control: no-store"])
    assert h["x-polygw-cache"] == "bypass"        # no-store does not read either
    assert requests(up) == 4
    # An over-long value is ignored, not refused.
    s, h, _ = f.curl("/v1/embeddings", body, headers=["Cache-Control: no-store, x=" + "y" * 300])
    assert s == 200 and h["x-polygw-cache"] == "hit"


def test_cache__client_max_age(front, up):
    f = cached_front(front, up)
    body = {"model": "e", "input": ["age"]}
    f.curl("/v1/embeddings", body)
    _, h, _ = f.curl("/v1/embeddings", body, headers=["Cache-Control: max-age=30"])
    assert h["x-polygw-cache"] == "hit"
    time.sleep(1.1)
    _, h, _ = f.curl("/v1/embeddings", body, headers=["Cache-Control: max-age=1"])
    assert h["x-polygw-cache"] == "miss"
    assert requests(up) == 2


def test_cache__entries_expire(front, up):
    f = cached_front(front, up, ttl_s=1)
    body = {"model": "e", "input": ["ttl"]}
    _, h1, _ = f.curl("/v1/embeddings", body)
    _, h2, _ = f.curl("/v1/embeddings", body)
    assert (h1["x-polygw-cache"], h2["x-polygw-cache"]) == ("miss", "hit")
    time.sleep(1.2)
    _, h3, _ = f.curl("/v1/embeddings", body)
    assert h3["x-polygw-cache"] == "miss"
    assert requests(up) == 2


def test_cache__upstream_cache_control(front, up):
    f = cached_front(front, up, ttl_s=60)
    for i, (cc, stored) in enumerate((("no-store", False), ("private, max-age=60", False),
                                      ("no-cache", True), ("public, max-age=60", True))):
        body = {"model": "e", "input": ["cc%d" % i]}
        up.script([{"headers": {"Cache-Control": cc}}])
        f.curl("/v1/embeddings", body)
        _, h, _ = f.curl("/v1/embeddings", body)
        assert h["x-polygw-cache"] == ("hit" if stored else "miss"), cc
    # max-age shorter than the capability's ttl_s wins.
    body = {"model": "e", "input": ["short"]}
    up.script([{"headers": {"Cache-Control": "max-age=1"}}])
    f.curl("/v1/embeddings", body)
    _, h, _ = f.curl("/v1/embeddings", body)
    assert h["x-polygw-cache"] == "hit"
    time.sleep(1.2)
    _, h, _ = f.curl("/v1/embeddings", body)
    assert h["x-polygw-cache"] == "miss"


def test_cache__a_hit_spends_no_quota(front, up):
    # One request a minute: the first call takes it; the hits after it are
    # answered although the bucket is empty, and another request waits
    # out its stall window.
    f = cached_front(front, up, source_kw={"limits": {"rpm": 1}})
    body = chat("quota")
    s, h, _ = f.curl("/v1/chat/completions", body)
    assert s == 200 and h["x-polygw-cache"] == "miss"
    for _ in range(5):
        s, h, b = f.curl("/v1/chat/completions", body)
        assert s == 200 and h["x-polygw-cache"] == "hit", (s, h, b)
    s, h, b = f.curl("/v1/chat/completions", chat("another"))
    assert s == 503, (s, h, b)
    assert requests(up) == 1


def test_cache__byte_cap_holds_under_a_fill(front, up):
    f = cached_front(front, up, cache_extra={"max_entry_bytes": 65536},
                     extra="cache:\n  max_bytes: 20000\n")
    for i in range(60):
        s, h, _ = f.curl("/v1/embeddings", {"model": "e", "input": ["fill %d" % i], "dimensions": 32})
        assert s == 200 and h["x-polygw-cache"] == "miss"
        held = metric(f, "polygw_cache_bytes")
        assert held is not None and 0 < held <= 20000, held
    assert metric(f, "polygw_cache_evictions_total") > 0
    # The newest entry is still there, the oldest long gone.
    _, h, _ = f.curl("/v1/embeddings", {"model": "e", "input": ["fill 59"], "dimensions": 32})
    assert h["x-polygw-cache"] == "hit"
    _, h, _ = f.curl("/v1/embeddings", {"model": "e", "input": ["fill 0"], "dimensions": 32})
    assert h["x-polygw-cache"] == "miss"


def test_cache__msgpack_front(front, up):
    f = cached_front(front, up)
    c = f.sc.connect()
    body = {"model": "e", "input": ["mp"]}
    err, r1, _ = call(c, "embedding", body)
    assert err is None, err
    err, r2, _ = call(c, "embedding", body)
    assert err is None and r2["body"] == r1["body"]
    assert (r1["cache"], r2["cache"], r2["source"], r2["attempts"]) == ("miss", "hit", "cache", 0)
    assert requests(up) == 1
    err, r3, _ = call(c, "embedding", body, cache="no-cache")
    assert err is None and requests(up) == 2
    err, _, _ = call(c, "embedding", body, cache="sometimes")
    assert err["code"] == "bad_request" and "cache" in err["message"], err
    c.close()


def concurrently(f, n, path, body, headers=None):
    """n identical requests at once over TCP: [(status, headers, body)]."""
    import threading
    out = [None] * n
    go = threading.Event()

    def one(i):
        conn = f.conn(timeout=20)
        go.wait()
        conn.request("POST", path, body=json.dumps(body),
                     headers=dict({"Content-Type": "application/json"}, **(headers or {})))
        r = conn.getresponse()
        out[i] = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode())
        conn.close()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(30)
    return out


def test_cache__fifty_identical_concurrent_requests_reach_the_mock_once(front, up):
    f = cached_front(front, up)
    up.set_default({"delay_ms": 700})
    out = concurrently(f, 50, "/v1/embeddings", {"model": "e", "input": ["herd"]})
    assert all(o is not None and o[0] == 200 for o in out), [o and o[:2] for o in out]
    assert len({o[2] for o in out}) == 1
    assert requests(up) == 1
    assert sorted(o[1]["x-polygw-cache"] for o in out).count("miss") == 1
    assert metric(f, "polygw_cache_coalesced_total") + metric(f, "polygw_cache_hits_total") == 49


def test_cache__a_failed_leader_lets_each_waiter_go_upstream(front, up):
    # The first request fails (a 400 is not retried); the ones that waited
    # for it are not failed with it: each goes upstream itself.
    f = cached_front(front, up)
    up.script([{"status": 400, "delay_ms": 700}])
    up.set_default({"delay_ms": 100})
    out = concurrently(f, 5, "/v1/embeddings", {"model": "e", "input": ["fails first"]})
    statuses = sorted(o[0] for o in out)
    assert statuses == [200, 200, 200, 200, 400], out
    assert requests(up) >= 2


def test_cache__a_waiter_keeps_its_own_deadline(front, up):
    f = cached_front(front, up)
    up.set_default({"delay_ms": 900})
    import threading
    first = {}
    t = threading.Thread(target=lambda: first.update(r=f.curl(
        "/v1/embeddings", {"model": "e", "input": ["slow"]})))
    t.start()
    up.wait_stats(lambda st: st["requests"] >= 1, timeout=5)
    t0 = time.monotonic()
    s, h, b = f.curl("/v1/embeddings", {"model": "e", "input": ["slow"]},
                     headers=["X-Polygw-Deadline: 0.3"])
    took = time.monotonic() - t0
    t.join(10)
    assert s == 504 and took < 0.8, (s, took, b)
    assert first["r"][0] == 200


def test_cache__a_cancelled_leader_does_not_cancel_its_waiters(front, up):
    # The first client gives up while its request is upstream; the two
    # that waited for it (one of them leaving too) are not cancelled: the
    # one left goes upstream itself and is answered. Each step waits for
    # the sidecar to have seen the previous one (a waiter is counted as a
    # miss when it arrives), so the order holds however slow the machine.
    f = cached_front(front, up, source_kw={"ttft_timeout_s": 8},
                     defaults=dict(DEFAULTS, stall_window_s=10))
    up.set_default({"delay_ms": 3000})
    body = json.dumps({"model": "e", "input": ["left"]})

    def misses():
        _, _, text = f.curl("/metrics")
        m = re.search(r'^polygw_cache_calls_total\{capability="embedding",result="miss"\} (\S+)$',
                      text, re.M)
        return float(m.group(1)) if m else 0

    def send():
        conn = f.conn(timeout=20)
        conn.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
        return conn

    lead = send()
    up.wait_stats(lambda st: st["requests"] >= 1, timeout=10)
    quitter = send()
    await_true(lambda: misses() >= 2, what="the second client to wait")
    last = send()
    await_true(lambda: misses() >= 3, what="the third client to wait")
    # The quitter leaves first (its call ends in the access log), then the
    # leader: were the quitter still waiting, it would go upstream in the
    # leader's place.
    def calls_ended():
        return sum(1 for x in f.sc.logs().splitlines()
                   if x.startswith("{") and '"msg":"call"' in x)

    quitter.close()
    await_true(lambda: calls_ended() >= 1, what="the quitter's call to end")
    lead.close()
    r = last.getresponse()
    text = r.read()
    assert r.status == 200, (r.status, text)
    assert json.loads(text)["data"], text
    last.close()
    assert requests(up) == 2


def test_cache__msgpack_stream_replays_its_chunks(front, up):
    from test_providers import stream_call
    f = cached_front(front, up)
    c = f.sc.connect()
    body = chat("alpha beta gamma delta", mock={"stream_events": 4})
    chunks1, err1, res1 = stream_call(c, "chat", body)
    chunks2, err2, res2 = stream_call(c, "chat", body)
    assert err1 is None and err2 is None, (err1, err2)
    assert len(chunks1) >= 4 and chunks2 == chunks1
    assert (res1["cache"], res2["cache"], res2["source"]) == ("miss", "hit", "cache")
    assert requests(up) == 1
    c.close()


def test_cache__a_hit_spends_no_budget(make_sidecar, up):
    # The app may spend 1.2: a call reserves 1.0 (max_tokens 1000 at 1000
    # per million output tokens) and is charged 0.25, so a second call
    # upstream is refused; the same call again is a hit, at cost 0.
    from test_budget import PRICES, ENV
    text = ("listen: {mode: \"0660\"}\nserver: {log_level: info, shutdown_grace_s: 2}\n"
            "defaults: {max_attempts: 1}\n"
            "capabilities:\n  chat: {cache: {ttl_s: 60}}\n"
            "apps:\n  - name: default\n    budget: {total: 1.2}\n"
            "sources:\n%s\n" % source_yaml("s", "chat", up.url, FAST, prices=PRICES))
    sc = make_sidecar(config_text=text, env=ENV)
    c = sc.connect()
    body = chat(max_tokens=1000, mock={"usage": {"prompt_tokens": 40, "completion_tokens": 250}})
    err, r1, _ = call(c, "chat", body)
    assert err is None and r1["cache"] == "miss", err
    for _ in range(3):
        err, r, _ = call(c, "chat", body)
        assert err is None and r["cache"] == "hit" and r.get("cost", 0) == 0, (err, r)
    err, _, _ = call(c, "chat", dict(body, messages=[{"role": "user", "content": "other"}]))
    assert err["code"] == "budget_exhausted", err
    assert requests(up) == 1
    c.close()


def cache_calls(f, capability):
    """{result: count} of polygw_cache_calls_total for one capability."""
    _, _, text = f.curl("/metrics")
    pat = r'^polygw_cache_calls_total\{capability="%s",result="(\w+)"\} (\S+)$' % re.escape(capability)
    return {m.group(1): float(m.group(2)) for m in re.finditer(pat, text, re.M)}


def test_cache__counters_per_capability(front, up):
    f = cached_front(front, up)
    zero = {"hit": 0, "miss": 0, "bypass": 0, "coalesced": 0}
    assert cache_calls(f, "chat") == zero and cache_calls(f, "embedding") == zero
    body = {"model": "e", "input": ["per capability"]}
    for _ in range(3):
        assert f.curl("/v1/embeddings", body)[0] == 200
    assert f.curl("/v1/embeddings", body, headers=["Cache-Control: no-store"])[0] == 200
    assert f.curl("/v1/chat/completions", chat("hello"))[0] == 200
    assert cache_calls(f, "embedding") == dict(zero, hit=2, miss=1, bypass=1)
    assert cache_calls(f, "chat") == dict(zero, miss=1)
    # Coalesced calls are counted on their capability too: each of the
    # eight missed, one went upstream, the seven others took its answer.
    up.set_default({"delay_ms": 700})
    out = concurrently(f, 8, "/v1/embeddings", {"model": "e", "input": ["herd"]})
    assert all(o is not None and o[0] == 200 for o in out)
    got = cache_calls(f, "embedding")
    assert got["miss"] == 1 + 8 and got["coalesced"] + got["hit"] == 2 + 7, got
    assert metric(f, "polygw_cache_coalesced_total") == got["coalesced"]


def test_cache__uncached_capabilities_have_no_cache_series(front, up):
    f = front(defaults=DEFAULTS)
    assert f.curl("/v1/embeddings", {"model": "e", "input": ["a"]})[0] == 200
    assert cache_calls(f, "embedding") == {}


TOK = {"ops": "tok-ops-7b2e9d4c1a6f", "alpha": "tok-alpha-5d1e8c2b7a9f",
       "beta": "tok-beta-0c3f6a9e2d1b"}


def ctl(f, *args):
    from conftest import POLYGWCTL, sanitizer_env
    env = sanitizer_env()
    env.pop("POLYGW_SOCKET", None)
    p = subprocess.run([POLYGWCTL, "--socket", f.sc.sock] + list(args), capture_output=True,
                       text=True, env=env, timeout=20)
    assert "runtime error:" not in p.stderr and "Sanitizer" not in p.stderr, p.stderr
    return p


def as_app(name):
    return ["Authorization: Bearer " + TOK[name]]


def purge_front(front, up):
    apps = ("apps:\n  - {name: ops, uids: [%d], admin: true, token_env: PGW_TOK_O}\n"
            "  - {name: alpha, token_env: PGW_TOK_A}\n"
            "  - {name: beta, token_env: PGW_TOK_B}\n" % os.getuid())
    env = {"PGW_TOK_O": TOK["ops"], "PGW_TOK_A": TOK["alpha"], "PGW_TOK_B": TOK["beta"]}
    return cached_front(front, up, extra=apps, env=env)


def states(f, asks):
    """X-Polygw-Cache of each (app, path, body) asked in turn."""
    out = []
    for app, path, body in asks:
        s, h, b = f.curl(path, body, headers=as_app(app))
        assert s == 200, (s, b)
        out.append(h["x-polygw-cache"])
    return out


EMB = ("/v1/embeddings", {"model": "e", "input": ["purge me"]})
CHAT = ("/v1/chat/completions", chat("purge me too"))
ALL4 = [("alpha",) + EMB, ("beta",) + EMB, ("alpha",) + CHAT, ("beta",) + CHAT]


def test_cache__purge_by_polygwctl_and_http(front, up):
    f = purge_front(front, up)
    assert states(f, ALL4) == ["miss"] * 4
    assert states(f, ALL4) == ["hit"] * 4
    # Only an admin app purges: beta is refused and nothing is dropped.
    s, _, b = f.curl("/polygw/v1/cache/purge", headers=as_app("beta"), method="POST")
    assert s == 403 and "not an admin app" in b, (s, b)
    assert states(f, ALL4) == ["hit"] * 4
    # polygwctl on the Unix socket is `ops` (its uid): alpha's embeddings only.
    p = ctl(f, "cache", "purge", "--capability", "embedding", "--app", "alpha")
    assert p.returncode == 0 and p.stdout.strip() == "purged=1", p
    assert states(f, ALL4) == ["miss", "hit", "hit", "hit"]
    # The admin endpoint: all of beta's.
    s, h, b = f.curl("/polygw/v1/cache/purge?app=beta", headers=as_app("ops"), method="POST")
    assert s == 200 and json.loads(b) == {"purged": 2}, (s, b)
    assert h.get("cache-control") == "no-store"
    assert states(f, ALL4) == ["hit", "miss", "hit", "miss"]
    # Percent-encoded names; one capability of every app.
    s, _, b = f.curl("/polygw/v1/cache/purge?capability=%63hat", headers=as_app("ops"), method="POST")
    assert s == 200 and json.loads(b) == {"purged": 2}, (s, b)
    # Unknown names and bad queries are typed errors, nothing dropped.
    s, _, b = f.curl("/polygw/v1/cache/purge?capability=nope", headers=as_app("ops"), method="POST")
    assert s == 404 and json.loads(b)["error"]["code"] == "unknown_capability", (s, b)
    for q in ("?app=nobody", "?colour=red", "?app=alpha&app=beta", "?app=", "?app=%zz",
              "?capability=%00"):
        s, _, b = f.curl("/polygw/v1/cache/purge" + q, headers=as_app("ops"), method="POST")
        assert s == 400 and json.loads(b)["error"]["code"] == "bad_request", (q, s, b)
    p = ctl(f, "cache", "purge", "--capability", "nope")
    assert p.returncode == 1 and "unknown_capability" in p.stderr, p
    # Everything left: alpha's and beta's embeddings.
    p = ctl(f, "cache", "purge")
    assert p.returncode == 0 and p.stdout.strip() == "purged=2", p
    assert metric(f, "polygw_cache_purged_total") == 1 + 2 + 2 + 2
    assert metric(f, "polygw_cache_entries") == 0
    assert states(f, ALL4) == ["miss"] * 4
    assert requests(up) == 4 + 1 + 2 + 4
    log = f.sc.logs()
    assert '"msg":"cache purged"' in log and TOK["ops"] not in log


def test_cache__purge_is_for_admin_apps_only(front, up):
    f = cached_front(front, up)  # every caller is `default`, not an admin app
    assert f.curl(*EMB)[0] == 200
    p = ctl(f, "cache", "purge")
    assert p.returncode == 1 and "not an admin app" in p.stderr, p
    c = f.sc.connect()
    err, res = c.request("cache.purge", {"capability": "embedding"})
    assert res is None and err["code"] == "bad_request" and "admin" in err["message"], err
    err, _ = c.request("cache.purge", {"capability": 7})
    assert err["code"] == "bad_request" and "capability" in err["message"], err
    c.close()
    _, h, _ = f.curl(*EMB)
    assert h["x-polygw-cache"] == "hit"
    p = ctl(f, "cache", "purge", "--app", "")
    assert p.returncode == 2, p
    p = ctl(f, "cache", "flush")
    assert p.returncode == 2 and "usage: cache purge" in p.stderr, p

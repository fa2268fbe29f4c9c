"""Which HTTP client carries an attempt (docs/CONFIG.md §3 `upstream_client`),
through the real sidecar and the real mock: polygw's own HTTP/1.1 client for
plain http:// to an IP address, libcurl for everything else, and what the own
client writes on the wire. Behaviour common to both clients (deadlines,
framing, hostile answers) is pinned by test_upstream.py, test_hostile_replies.py
and test_upstream_client.py.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import call, chat, config_yaml, source_yaml  # noqa: E402

KEY_ENV = "POLYGW_TEST_KEY"
KEY = "sk-test-own-client-0123456789"
DEFAULTS = {"max_attempts": 1, "stall_window_s": 60}
LONG = {"api_key_env": KEY_ENV, "timeout_s": 10, "connect_timeout_s": 5, "ttft_timeout_s": 5,
        "idle_timeout_s": 5, "max_concurrency": 64, "aimd": {"initial": 64}}
NO_PROXY = {"no_proxy": "*", "NO_PROXY": "*"}


def sidecar(make_sidecar, url, client=None, env=None, source=None, **kw):
    text = config_yaml([source_yaml("a", "chat", url, dict(LONG, **(source or {})))], DEFAULTS)
    if client:
        text = text.replace("server:\n", "server:\n  upstream_client: %s\n" % client, 1)
    return make_sidecar(config_text=text, env=dict({KEY_ENV: KEY}, **(env or NO_PROXY)), **kw)


def upstream_stats(c):
    err, res = c.request("stats")
    assert err is None, err
    return res["upstream"]


def ok(c, text):
    err, res, _ = call(c, "chat", chat(text))
    assert err is None, err
    assert res["body"]["choices"][0]["message"]["content"] == text
    return res


def test_own_client__carries_http_to_an_ip_on_one_kept_alive_connection(make_sidecar, up):
    c = sidecar(make_sidecar, up.url).connect()
    before = up.stats()["accepted_connections"]
    for i in range(12):
        ok(c, "call %d" % i)
    st = upstream_stats(c)
    assert st["own_connections_opened"] == 1, st
    assert st["own_connections_reused"] == 11, st
    assert up.stats()["accepted_connections"] - before == 1


def test_own_client__writes_a_plain_http_1_1_request(make_sidecar, up):
    c = sidecar(make_sidecar, up.url, source={"query": {"tenant": "t1"}}).connect()
    body = chat("on the wire")
    ok(c, "on the wire")
    seen = up.last()
    hdrs = seen["headers"]
    assert seen["method"] == "POST"
    assert seen["target"] == "/v1/chat/completions?tenant=t1"
    assert hdrs["host"] == up.url.split("/")[2]
    assert hdrs["content-type"] == "application/json"
    assert int(hdrs["content-length"]) == seen["body_bytes"]
    assert seen["authorization"] == "Bearer " + KEY
    assert "expect" not in hdrs and "accept-encoding" not in hdrs and "transfer-encoding" not in hdrs
    assert seen["json"]["messages"] == body["messages"]


def test_own_client__a_dropped_idle_connection_is_replaced_without_an_error(make_sidecar, up):
    c = sidecar(make_sidecar, up.url).connect()
    ok(c, "first")
    up.reset(drop_connections=True)      # the pooled connection dies while idle
    for i in range(3):
        ok(c, "after %d" % i)
    st = upstream_stats(c)
    assert st["own_connections_opened"] == 2, st
    assert up.stats()["requests"] == 3   # nothing sent twice


def test_own_client__libcurl_setting_turns_it_off(make_sidecar, up):
    c = sidecar(make_sidecar, up.url, client="libcurl").connect()
    for i in range(3):
        ok(c, "curl %d" % i)
    st = upstream_stats(c)
    assert st["own_connections_opened"] == 0 and st["own_connections_reused"] == 0, st


def test_own_client__a_proxy_for_http_hands_every_source_to_libcurl(make_sidecar, up):
    """With http_proxy set the own client steps aside, even for an IP address:
    the mock is the proxy (it takes absolute-form targets) and the source's
    own address accepts nothing."""
    url = "http://127.0.0.1:1/v1"
    c = sidecar(make_sidecar, url, env={"http_proxy": up.base, "no_proxy": "", "NO_PROXY": ""}
                ).connect()
    ok(c, "via the proxy")
    assert up.last()["target"] == url + "/chat/completions"
    assert upstream_stats(c)["own_connections_opened"] == 0


def test_own_client__refused_connection_is_connect_failed(make_sidecar):
    c = sidecar(make_sidecar, "http://127.0.0.1:1/v1").connect()
    err, res, elapsed = call(c, "chat", chat("nobody there"))
    assert res is None and err["code"] == "retry_exhausted", err
    src = err["sources"][0]
    assert src["reason"] == "connect_failed", err
    assert "127.0.0.1 port 1" in src["detail"] and "refused" in src["detail"], err
    assert elapsed < 1.0
    assert upstream_stats(c)["own_connections_opened"] == 1


def test_own_client__ipv6_literal(make_sidecar, up):
    """[::1] is an IP address too; the mock listens on 127.0.0.1 only, so the
    connection is refused by the IPv6 loopback — proof the own client dialled
    it (libcurl is not involved: the count moves)."""
    port = up.url.split(":")[2].split("/")[0]
    c = sidecar(make_sidecar, "http://[::1]:%s/v1" % port).connect()
    err, res, _ = call(c, "chat", chat("v6"))
    st = upstream_stats(c)
    assert st["own_connections_opened"] == 1, st
    if err is not None:
        assert err["sources"][0]["reason"] == "connect_failed", err
        assert "::1" in err["sources"][0]["detail"], err


def test_own_client__a_host_name_is_carried_once_libcurl_has_reached_it(make_sidecar, up):
    """http://localhost:PORT: the first request goes through libcurl (which
    resolves the name on its thread, within the attempt's deadlines); the
    next ones go to the address it reached, through the own client, on one
    kept-alive connection, with the name in Host."""
    port = up.url.split(":")[2].split("/")[0]
    c = sidecar(make_sidecar, "http://localhost:%s/v1" % port).connect()
    ok(c, "first, by libcurl")
    assert upstream_stats(c)["own_connections_opened"] == 0
    for i in range(5):
        ok(c, "own %d" % i)
    st = upstream_stats(c)
    assert st["own_connections_opened"] == 1, st
    assert st["own_connections_reused"] == 4, st
    assert up.last()["headers"]["host"] == "localhost:%s" % port
    assert up.stats()["requests"] == 6


def test_own_client__a_learned_address_that_refuses_is_forgotten(make_sidecar):
    """The address learned for a name stops answering: that attempt fails
    with connect_failed in the own client, and the next one is libcurl's
    again (it resolves afresh), so the own client does not keep dialling a
    dead address for the rest of the TTL."""
    from mock import MockUpstream
    m = MockUpstream()
    port = m.port
    c = sidecar(make_sidecar, "http://localhost:%d/v1" % port).connect()
    ok(c, "libcurl")
    ok(c, "own")
    assert upstream_stats(c)["own_connections_opened"] == 1
    m.stop()
    err, _, _ = call(c, "chat", chat("refused"))
    assert err is not None and err["sources"][0]["reason"] == "connect_failed", err
    assert upstream_stats(c)["own_connections_opened"] == 2   # the own client dialled
    err, _, _ = call(c, "chat", chat("refused again"))
    assert err is not None, err
    assert upstream_stats(c)["own_connections_opened"] == 2   # libcurl did, this time


# ------------------------------------------------ a name whose address changes
# The DNS shim resolves NAMED_HOST from a file it reads at every lookup, so a
# test can move the name from one mock to another while the sidecar runs.
SHIM = os.path.join(os.environ.get("POLYGW_BUILD", "build"), "shim", "dnshang.so")
NAMED_HOST = "moving.polygw.test"


def moving_pair(up):
    """A second mock on 127.0.0.2 at up's port: the name's other address."""
    from mock import MockUpstream
    return MockUpstream(port=up.port, host="127.0.0.2")


def point(path, addr):
    tmp = path + ".new"
    with open(tmp, "w") as f:
        f.write("%s=%s\n" % (NAMED_HOST, addr))
    os.replace(tmp, path)


def named_sidecar(make_sidecar, up, tmp_path, ttl=None):
    assert os.path.exists(SHIM), "DNS shim not built: %s (run make)" % SHIM
    mapfile = str(tmp_path / "dns-map")
    point(mapfile, "127.0.0.1")
    env = dict(NO_PROXY, LD_PRELOAD=SHIM, POLYGW_TEST_DNS_MAP_FILE=mapfile,
               ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "detect_leaks=1")
               + ":verify_asan_link_order=0")
    text = config_yaml([source_yaml("a", "chat", "http://%s:%d/v1" % (NAMED_HOST, up.port),
                                    LONG)], DEFAULTS)
    if ttl is not None:
        text = text.replace("server:\n", "server:\n  dns_ttl_s: %d\n" % ttl, 1)
    sc = make_sidecar(config_text=text, env=dict({KEY_ENV: KEY}, **env))
    named_sidecar.last = sc
    return sc.connect(), mapfile


def test_own_client__a_changed_address_is_followed_within_dns_ttl_s(make_sidecar, up, tmp_path):
    """dns_ttl_s: 1. The name points at the first mock; the own client
    carries the calls after libcurl's first. Once the name points at the
    second mock, calls reach it within the TTL (plus the one call libcurl
    carries to learn it again) and stay there."""
    c, mapfile = named_sidecar(make_sidecar, up, tmp_path, ttl=1)
    with moving_pair(up) as other:
        for i in range(4):
            ok(c, "before %d" % i)
        assert up.stats()["requests"] == 4 and other.stats()["requests"] == 0
        assert upstream_stats(c)["own_connections_reused"] >= 2
        point(mapfile, "127.0.0.2")
        t0 = time.monotonic()
        while other.stats()["requests"] == 0:
            assert time.monotonic() - t0 < 5, "the changed address was not followed in 5 s"
            ok(c, "moving")
            time.sleep(0.05)
        moved_after = time.monotonic() - t0
        before = up.stats()["requests"]
        for i in range(4):
            ok(c, "after %d" % i)
        assert up.stats()["requests"] == before, "a call went to the old address after the move"
        assert other.stats()["requests"] >= 5
        assert moved_after < 2.0, moved_after


def test_own_client__dns_ttl_s_default_keeps_a_learnt_address(make_sidecar, up, tmp_path):
    """The default (60 s): a change of address is not looked at for calls
    within the minute; the learnt address keeps the calls."""
    c, mapfile = named_sidecar(make_sidecar, up, tmp_path)
    with moving_pair(up) as other:
        ok(c, "learn")
        point(mapfile, "127.0.0.2")
        for i in range(5):
            ok(c, "kept %d" % i)
        assert up.stats()["requests"] == 6 and other.stats()["requests"] == 0


def test_own_client__dns_ttl_s_reload_shortens_a_learnt_address(make_sidecar, up, tmp_path):
    """Learnt under the default 60 s, an address is trusted no longer than a
    reloaded dns_ttl_s of 1 from the reload on; a bad value is refused by
    the reload with the key named, and the running setting stays."""
    c, mapfile = named_sidecar(make_sidecar, up, tmp_path)
    sc = named_sidecar.last
    with moving_pair(up) as other:
        ok(c, "learn")
        point(mapfile, "127.0.0.2")
        with open(sc.config) as f:
            base = f.read()

        def reload_ttl(v):
            text = base.replace("server:\n", "server:\n  dns_ttl_s: %s\n" % v, 1)
            with open(sc.config + ".tmp", "w") as f:
                f.write(text)
            os.replace(sc.config + ".tmp", sc.config)
            return c.request("config.reload")

        for bad in ("0", "-1", "1.5", "soon", "86401"):
            err, _ = reload_ttl(bad)
            assert err is not None and "server.dns_ttl_s" in err["message"], (bad, err)
        ok(c, "still the learnt address")
        assert other.stats()["requests"] == 0
        err, _ = reload_ttl("1")
        assert err is None, err
        t0 = time.monotonic()
        while other.stats()["requests"] == 0:
            assert time.monotonic() - t0 < 5, "the reloaded dns_ttl_s did not apply"
            ok(c, "moving")
            time.sleep(0.05)

"""A purge of the response cache across the fleet (docs/CONFIG.md, "cache"):
through one sidecar it drops the matching Redis entries (an asynchronous
SCAN ... MATCH walk, UNLINK per batch, never KEYS) and, by a message on
the fleet's pub/sub channel, the other sidecars' memory tiers; it leaves
locks and other prefixes alone, and answers a typed error when Redis is
down. Real sidecars (msgpack, polygwctl, the HTTP admin endpoint), the real
mock upstream, a real redis-server; every wait is bounded."""
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import msgpack
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import call as call_on  # noqa: E402
from redis_fixture import (chat, fleet_config, free_port, source, unique_prefix,  # noqa: E402
                           wait_backend, wait_until)
from test_cache import ctl as front_ctl  # noqa: E402
from test_redis_cache import redis_srv  # noqa: E402,F401  (the fixture)

NO_PROXY = {"no_proxy": "*", "NO_PROXY": "*"}
TOK = {"ops": "tok-ops-4c9e1a7b2d5f", "alpha": "tok-alpha-8e2b5d1c9a7f"}


def fnv32(s):
    """The 32-bit hash a shared name gives a capability or an app (cache.c)."""
    h = 2166136261
    for b in s.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return "%08x" % h


def purge_cfg(redis_srv, up, prefix, port, backend=None):
    cfg = fleet_config(redis_srv.url(), prefix,
                       [source("e1", "embedding", up.url, model="emb-1", serves=["*"]),
                        source("m1", "chat", up.url)], backend=backend,
                       capabilities={"embedding": {"cache": {"ttl_s": 60}},
                                     "chat": {"cache": {"ttl_s": 60}}})
    # Callers on the Unix socket (this uid) are `ops`, an admin app that may
    # declare the others; HTTP callers show a token.
    return cfg + ("apps:\n"
                  "  - {name: ops, uids: [%d], admin: true, allow_declared: true,"
                  " token_env: PGW_TOK_O}\n"
                  "  - {name: alpha, token_env: PGW_TOK_A}\n"
                  "  - {name: beta}\n"
                  "http:\n  listen: \"127.0.0.1:%d\"\n" % (os.getuid(), port))


def start_fleet(make_sidecar, redis_srv, up, prefix, n=2, backend=None, env=None):
    fleet = []
    for i in range(n):
        port = free_port()
        sc = make_sidecar(config_text=purge_cfg(redis_srv, up, prefix, port, backend),
                          subdir="sc%d" % i, env=dict(NO_PROXY, PGW_TOK_O=TOK["ops"],
                                                      PGW_TOK_A=TOK["alpha"], **(env or {})))
        sc.http_port = port
        wait_backend(sc)
        fleet.append(sc)
    return fleet


def ask(sc, capability, text, app):
    body = chat(text) if capability == "chat" else {"model": "e", "input": [text]}
    c = sc.connect(timeout=5)
    try:
        err, res, _ = call_on(c, capability, body, 5, app=app)
    finally:
        c.close()
    assert err is None, err
    return res["cache"]


def text(v):
    return v.decode() if isinstance(v, bytes) else v


def entry_keys(redis_srv, prefix):
    keys = [text(k) for k in redis_srv.client().call("KEYS", "{%s:cache:*" % prefix)]
    return sorted(k for k in keys if not k.endswith(":lock"))


def ctl(sc, *args):
    """polygwctl on the sidecar's Unix socket (as test_cache.py runs it)."""
    return front_ctl(SimpleNamespace(sc=sc), *args)


def http_purge(sc, query=""):
    cmd = ["curl", "-s", "-i", "--max-time", "10", "-X", "POST", "-H",
           "Authorization: Bearer " + TOK["ops"],
           "http://127.0.0.1:%d/polygw/v1/cache/purge%s" % (sc.http_port, query)]
    out = subprocess.run(cmd, capture_output=True, timeout=15, env=dict(os.environ, **NO_PROXY))
    head, _, body = out.stdout.decode().partition("\r\n\r\n")
    lines = head.split("\r\n")
    headers = dict((k.strip().lower(), v.strip()) for k, _, v in
                   (line.partition(":") for line in lines[1:]))
    return int(lines[0].split()[1]), headers, body


def fleet_purges(sc):
    return sc.logs().count('"msg":"cache purged by the fleet"')


ASKS = [("embedding", "x", "alpha"), ("embedding", "x", "beta"), ("chat", "y", "alpha")]


def test_redis_cache_purge__drops_redis_entries_and_the_fleets_memory(
        redis_srv, up, make_sidecar):
    prefix = unique_prefix()
    a, b = start_fleet(make_sidecar, redis_srv, up, prefix)
    assert [ask(a, *q) for q in ASKS] == ["miss"] * 3
    assert len(wait_until(lambda: len(entry_keys(redis_srv, prefix)) == 3 and
                          entry_keys(redis_srv, prefix), 3)) == 3
    # b answers them from Redis, and keeps them in its own memory.
    assert [ask(b, *q) for q in ASKS] == ["hit"] * 3
    # The key names the capability and the app (hashed): a purge finds them.
    emb_alpha = "{%s:cache:%s%s" % (prefix, fnv32("embedding"), fnv32("alpha"))
    assert sum(k.startswith(emb_alpha) for k in entry_keys(redis_srv, prefix)) == 1

    # polygwctl on a: alpha's embeddings, in a's memory, in Redis, in b's memory.
    seen = fleet_purges(b)
    p = ctl(a, "cache", "purge", "--capability", "embedding", "--app", "alpha")
    assert p.returncode == 0 and p.stdout.split() == ["purged=1", "purged_shared=1"], p
    assert not any(k.startswith(emb_alpha) for k in entry_keys(redis_srv, prefix))
    assert len(entry_keys(redis_srv, prefix)) == 2
    assert wait_until(lambda: fleet_purges(b) > seen, 3), b.logs()[-2000:]
    assert '"entries":1' in b.logs().split('"msg":"cache purged by the fleet"')[-1].split("\n")[0]
    assert [ask(b, *q) for q in ASKS] == ["miss", "hit", "hit"]
    assert up.stats()["requests"] == 4

    # The HTTP admin endpoint on a: all of beta's (a's memory had one).
    seen = fleet_purges(b)
    s, h, body = http_purge(a, "?app=beta")
    assert s == 200 and json.loads(body) == {"purged": 1, "purged_shared": 1}, (s, body)
    assert h.get("cache-control") == "no-store", h
    assert wait_until(lambda: fleet_purges(b) > seen, 3)
    assert ask(b, "embedding", "x", "beta") == "miss"
    assert up.stats()["requests"] == 5

    # A lock held by a call upstream is not an entry: a purge leaves it.
    # Keys of another prefix are another fleet's.
    r = redis_srv.client()
    lock = "{%s:cache:%s}:lock" % (prefix, "0" * 64)
    r.call("SET", lock, "someone", "PX", "30000")
    other = "{%s-x:cache:%s}" % (prefix, "0" * 64)
    r.call("SET", other, "v", "PX", "30000")
    # msgpack on b: everything (alpha's embedding and chat, beta's embedding).
    c = b.connect(timeout=5)
    err, res = c.request("cache.purge", {})
    c.close()
    assert err is None and res == {"purged": 3, "purged_shared": 3}, (err, res)
    assert entry_keys(redis_srv, prefix) == []
    assert [text(r.call("GET", k)) for k in (lock, other)] == ["someone", "v"]
    assert wait_until(lambda: '"msg":"cache purged by the fleet"' in a.logs().split(
        '"msg":"cache purged"')[-1], 3)
    assert [ask(a, *q) for q in ASKS] == ["miss"] * 3
    log = a.logs() + b.logs()
    assert TOK["ops"] not in log and TOK["alpha"] not in log


@pytest.mark.timing  # 18000 keys, and the purge's time is measured
def test_redis_cache_purge__walks_many_entries_in_batches(redis_srv, up, make_sidecar):
    prefix = unique_prefix()
    (a,) = start_fleet(make_sidecar, redis_srv, up, prefix, n=1)
    r = redis_srv.client()
    # 5000 entries of alpha's embeddings, 3000 of beta's: several SCAN
    # batches each; written by a script so the test stays fast.
    fill = ("for i = 1, tonumber(ARGV[3]) do redis.call('SET', ARGV[1] .. ARGV[2] .. "
            "string.format('%048x', i) .. '}', 'v', 'PX', 60000) end return 1")
    base = "{%s:cache:%s" % (prefix, fnv32("embedding"))
    r.call("EVAL", fill, "0", base, fnv32("alpha"), "5000")
    r.call("EVAL", fill, "0", base, fnv32("beta"), "3000")
    t0 = time.monotonic()
    p = ctl(a, "cache", "purge", "--app", "alpha")
    took = time.monotonic() - t0
    assert p.returncode == 0 and p.stdout.split() == ["purged=0", "purged_shared=5000"], p
    assert len(entry_keys(redis_srv, prefix)) == 3000
    # Calls go on while a purge walks (the loop is never blocked); the
    # purge answers after its walk.
    c = a.connect(timeout=10)
    msgid = c.request_async("cache.purge", {})
    assert ask(a, "embedding", "during", "alpha") == "miss"
    msg = c.wait_response(msgid, timeout=10)
    c.close()
    assert msg[2] is None and msg[3]["purged_shared"] >= 3000, msg
    # Only the call's own answer may have been stored after the walk passed.
    assert len(entry_keys(redis_srv, prefix)) <= 1
    # A msgid reused while its purge walks is a connection error (as for
    # a call); the client is gone then, and the walk still ends (and tells
    # the fleet); nothing answers the closed connection.
    r.call("EVAL", fill, "0", base, fnv32("beta"), "5000")
    c = a.connect(timeout=10)
    c.send_raw(msgpack.packb([0, 7, "cache.purge", [{"app": "beta"}]], use_bin_type=True) +
               msgpack.packb([0, 7, "ping", []], use_bin_type=True))
    msgs = c.expect_eof(timeout=5)
    assert len(msgs) == 1 and msgs[0][1] == "error", msgs
    assert "already in flight" in msgs[0][2][0]["message"], msgs
    c.close()
    assert wait_until(lambda: len(entry_keys(redis_srv, prefix)) <= 1, 5)
    assert wait_until(lambda: '"shared_entries":5000' in a.logs(), 3), a.logs()[-2000:]
    assert ask(a, "embedding", "after", "beta") == "miss"
    print("purge of 5000 of 8000 entries: %.3f s (polygwctl included)" % took)


def test_redis_cache_purge__redis_down_is_a_typed_error(redis_srv, up, make_sidecar):
    prefix = unique_prefix()
    (a,) = start_fleet(make_sidecar, redis_srv, up, prefix, n=1)
    assert ask(a, "embedding", "kept", "alpha") == "miss"
    redis_srv.kill()
    wait_backend(a, up=False)
    assert ask(a, "embedding", "kept", "alpha") == "hit"  # the memory tier still answers
    p = ctl(a, "cache", "purge")
    assert p.returncode == 1 and "backend_unavailable" in p.stderr, p
    assert "1 entries dropped from this sidecar's memory" in p.stderr, p
    s, _, body = http_purge(a, "?capability=chat")
    err = json.loads(body)["error"]
    assert s == 503 and err["code"] == "backend_unavailable", (s, body)
    # The memory tier was purged all the same.
    c = a.connect(timeout=5)
    err, _, _ = call_on(c, "embedding", {"model": "e", "input": ["kept"]}, 5, app="alpha")
    c.close()
    assert err["code"] == "backend_unavailable", err


def test_redis_cache_purge__a_lost_channel_drops_the_memory_tier(redis_srv, up, make_sidecar):
    """A purge published while a sidecar was cut off from the channel is
    lost to it: when it is subscribed again it drops its memory tier
    rather than answer what the fleet may have purged meanwhile."""
    prefix = unique_prefix()
    (a,) = start_fleet(make_sidecar, redis_srv, up, prefix, n=1)
    assert ask(a, "embedding", "held", "alpha") == "miss"
    assert ask(a, "embedding", "held", "alpha") == "hit"
    redis_srv.kill()
    wait_backend(a, up=False)
    assert ask(a, "embedding", "held", "alpha") == "hit"  # memory, while Redis is down
    redis_srv.restart()  # empty: what a purge of everything would have left
    wait_backend(a)
    assert wait_until(lambda: "fleet purges may have been missed" in a.logs(), 3)
    assert ask(a, "embedding", "held", "alpha") == "miss"
    assert up.stats()["requests"] == 2


def test_redis_cache_purge__as_the_documented_acl_user(up, make_sidecar):
    """With exactly the ACL rules docs/CONFIG.md gives for backend.username
    (test_redis_tls.py's user), the shared tier works: a store, a lookup
    and a lock on another sidecar, a purge across the fleet."""
    from test_redis_tls import ACL_PREFIX, ACL_PW, AclRedis
    srv = AclRedis().start()
    try:
        a, b = start_fleet(make_sidecar, srv, up, ACL_PREFIX + "-cache",
                           backend={"username": "pgw", "password_env": "PGW_REDIS_PW"},
                           env={"PGW_REDIS_PW": ACL_PW})
        assert ask(a, "embedding", "acl", "alpha") == "miss"
        assert wait_until(lambda: ask(b, "embedding", "acl", "alpha") == "hit", 3)
        assert ask(b, "chat", "acl", "alpha") == "miss"  # b's own lock, store and unlock
        seen = fleet_purges(b)
        p = ctl(a, "cache", "purge", "--capability", "embedding")
        assert p.returncode == 0 and p.stdout.split() == ["purged=1", "purged_shared=1"], p
        assert wait_until(lambda: fleet_purges(b) > seen, 3)
        assert ask(b, "embedding", "acl", "alpha") == "miss"
        for sc in (a, b):
            assert "backend write failed" not in sc.logs(), sc.logs()[-2000:]
            assert ACL_PW not in sc.logs()
    finally:
        srv.cleanup()

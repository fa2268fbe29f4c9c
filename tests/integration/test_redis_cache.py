"""The response cache's shared tier (docs/CONFIG.md, "cache") over a real
redis-server: an answer one sidecar stored is a hit on another, without the
mock; its Redis key carries the entry's TTL and expires; a Redis that is
down turns lookups into misses, never into failed calls. Real sidecars,
the real mock upstream; every wait is bounded."""
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import call as call_on  # noqa: E402
from redis_fixture import (FleetRedis, fleet_config, source, unique_prefix,  # noqa: E402
                           wait_backend, wait_until)

NO_PROXY = {"no_proxy": "*", "NO_PROXY": "*"}


@pytest.fixture
def redis_srv():
    srv = FleetRedis().start()
    yield srv
    srv.cleanup()


def start_fleet(make_sidecar, n, cfg):
    fleet = [make_sidecar(config_text=cfg, subdir="sc%d" % i, env=NO_PROXY) for i in range(n)]
    for sc in fleet:
        wait_backend(sc)
    return fleet


def cached_cfg(redis_srv, up, prefix, ttl_s=60, backend=None):
    return fleet_config(redis_srv.url(), prefix,
                        [source("e1", "embedding", up.url, model="emb-1", serves=["*"])],
                        backend=backend,
                        capabilities={"embedding": {"cache": {"ttl_s": ttl_s}}})


def embed(sc, text, timeout=5.0, **params):
    c = sc.connect(timeout=timeout)
    try:
        err, res, _ = call_on(c, "embedding", {"model": "e", "input": [text]}, timeout, **params)
    finally:
        c.close()
    assert err is None, err
    return res


def cache_keys(redis_srv, prefix):
    """The entries' keys (not their locks)."""
    keys = redis_srv.client().call("KEYS", "{%s:cache:*" % prefix)
    return [k for k in keys if not (k.decode() if isinstance(k, bytes) else k).endswith(":lock")]


def test_redis_cache__a_hit_on_another_sidecar(redis_srv, up, make_sidecar):
    prefix = unique_prefix()
    a, b = start_fleet(make_sidecar, 2, cached_cfg(redis_srv, up, prefix))
    r1 = embed(a, "fleet")
    assert (r1["cache"], r1["source"]) == ("miss", "e1")
    keys = wait_until(lambda: cache_keys(redis_srv, prefix), 3)
    assert len(keys) == 1, keys
    key = keys[0].decode() if isinstance(keys[0], bytes) else keys[0]
    assert key.startswith("{%s:cache:" % prefix) and len(key) == len(prefix) + 8 + 64 + 1, key
    pttl = redis_srv.client().call("PTTL", key)
    assert 55000 < pttl <= 60000, pttl
    r2 = embed(b, "fleet")
    assert (r2["cache"], r2["source"], r2["attempts"]) == ("hit", "cache", 0), r2
    assert r2["body"] == r1["body"]
    assert up.stats()["requests"] == 1
    # Now in b's memory too: a hit there without Redis.
    assert embed(b, "fleet")["cache"] == "hit"
    # Another body is another entry; no-store skips both tiers.
    assert embed(b, "other")["cache"] == "miss"
    assert embed(a, "third", cache="no-store")["cache"] == "bypass"
    # (an entry is written to Redis after its call has answered)
    assert wait_until(lambda: len(cache_keys(redis_srv, prefix)) == 2, 3), \
        cache_keys(redis_srv, prefix)
    assert up.stats()["requests"] == 3


def test_redis_cache__entries_expire(redis_srv, up, make_sidecar):
    prefix = unique_prefix()
    a, b = start_fleet(make_sidecar, 2, cached_cfg(redis_srv, up, prefix, ttl_s=1))
    assert embed(a, "brief")["cache"] == "miss"
    keys = wait_until(lambda: cache_keys(redis_srv, prefix), 3)
    assert len(keys) == 1
    assert 0 < redis_srv.client().call("PTTL", keys[0]) <= 1000
    assert embed(b, "brief")["cache"] == "hit"
    # Redis drops the key at its TTL; every tier misses after it.
    assert wait_until(lambda: not cache_keys(redis_srv, prefix), 4)
    time.sleep(0.05)
    assert embed(a, "brief")["cache"] == "miss"
    assert up.stats()["requests"] == 2


def test_redis_cache__a_redis_down_is_a_miss(redis_srv, up, make_sidecar):
    prefix = unique_prefix()
    (a,) = start_fleet(make_sidecar, 1, cached_cfg(redis_srv, up, prefix))
    assert embed(a, "kept")["cache"] == "miss"
    redis_srv.kill()
    wait_backend(a, up=False)
    # The memory tier answers without Redis.
    r = embed(a, "kept")
    assert (r["cache"], r["source"]) == ("hit", "cache"), r
    # A lookup Redis cannot answer is a miss at once: the call goes on to
    # admission, whose own verdict (the backend is down) it gets.
    c = a.connect(timeout=5)
    err, _, took = call_on(c, "embedding", {"model": "e", "input": ["new"]}, 5)
    c.close()
    assert err["code"] == "backend_unavailable" and "scope" in err["message"], err
    assert took < 1.0, took
    lines = [x for x in a.logs().splitlines() if '"msg":"call"' in x and '"capability":"embedding"' in x]
    assert '"cache":"miss"' in lines[-1], lines[-1]


def test_redis_cache__a_frozen_redis_keeps_the_deadline(redis_srv, up, make_sidecar):
    prefix = unique_prefix()
    (a,) = start_fleet(make_sidecar, 1,
                       cached_cfg(redis_srv, up, prefix, backend={"command_timeout_s": 2}))
    redis_srv.freeze()
    try:
        c = a.connect(timeout=5)
        t0 = time.monotonic()
        err, _, _ = call_on(c, "embedding", {"model": "e", "input": ["frozen"]}, 5,
                            deadline_s=0.3)
        took = time.monotonic() - t0
        c.close()
    finally:
        redis_srv.thaw()
    # The lookup is not waited for past the call's own deadline.
    assert took < 1.5, took
    assert err is not None and err["code"] in ("deadline_exceeded", "backend_unavailable"), err


def key_of_first_entry(redis_srv, prefix):
    keys = wait_until(lambda: cache_keys(redis_srv, prefix), 3)
    k = keys[0]
    return k.decode() if isinstance(k, bytes) else k


def test_redis_cache__fifty_identical_requests_over_two_sidecars_reach_the_mock_once(
        redis_srv, up, make_sidecar):
    import threading
    prefix = unique_prefix()
    fleet = start_fleet(make_sidecar, 2, cached_cfg(redis_srv, up, prefix))
    up.set_default({"delay_ms": 700})
    out = [None] * 50
    go = threading.Event()

    def one(i):
        c = fleet[i % 2].connect(timeout=10)
        go.wait()
        try:
            out[i] = call_on(c, "embedding", {"model": "e", "input": ["herd"]}, 10)
        finally:
            c.close()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(20)
    assert all(o is not None and o[0] is None for o in out), [o and o[0] for o in out]
    assert len({repr(o[1]["body"]) for o in out}) == 1
    assert up.stats()["requests"] == 1
    assert sorted(o[1]["cache"] for o in out).count("miss") == 1
    # The holder dropped its lock once its entry was written.
    assert not redis_srv.client().call("KEYS", "{%s:cache:*}:lock" % prefix)


def test_redis_cache__a_dead_holders_lock_expires(redis_srv, up, make_sidecar):
    prefix = unique_prefix()
    a, b, c = start_fleet(make_sidecar, 3, cached_cfg(redis_srv, up, prefix))
    # Learn the entry's key on a; b and c have never seen it.
    assert embed(a, "orphan")["cache"] == "miss"
    key = key_of_first_entry(redis_srv, prefix)
    r = redis_srv.client()
    # Another sidecar took the lock and died: b's call waits for the entry
    # until the lock expires, then goes upstream itself.
    r.call("DEL", key)
    r.call("SET", key + ":lock", "1", "PX", "800")
    t0 = time.monotonic()
    res = embed(b, "orphan")
    took = time.monotonic() - t0
    assert res["cache"] == "miss", res
    assert 0.6 <= took < 2.0, took
    assert up.stats()["requests"] == 2
    # no-cache skips the lookup: it never waits for a lock.
    r.call("DEL", key)
    r.call("SET", key + ":lock", "1", "PX", "5000")
    t0 = time.monotonic()
    assert embed(b, "orphan", cache="no-cache")["cache"] == "miss"
    assert time.monotonic() - t0 < 0.6
    # A waiter keeps its own deadline (c has never seen the entry). The
    # no-cache answer's write may reach Redis after its client had it.
    assert wait_until(lambda: cache_keys(redis_srv, prefix), 3)
    r.call("DEL", key)
    r.call("SET", key + ":lock", "1", "PX", "5000")
    conn = c.connect(timeout=5)
    t0 = time.monotonic()
    err, _, _ = call_on(conn, "embedding", {"model": "e", "input": ["orphan"]}, 5, deadline_s=0.3)
    took = time.monotonic() - t0
    conn.close()
    assert err is not None and err["code"] == "deadline_exceeded", err
    assert took < 1.0, took
    assert up.stats()["requests"] == 3

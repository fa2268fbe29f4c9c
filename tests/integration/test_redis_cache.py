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
    return redis_srv.client().call("KEYS", "{%s:cache:*" % prefix)


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
    assert len(cache_keys(redis_srv, prefix)) == 2
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

"""The response cache's fleet lock (docs/CONFIG.md, "cache"): its value is
the holder's own token, its life the capability's `cache.lock_s`, and a
holder drops it only while it is still its own — one whose lock expired
and was taken by another sidecar leaves that one's lock alone. A lock
shorter than a call lets a second sidecar go upstream. Real sidecars, the
real mock upstream (which really delays), a real redis-server observed with
its own client; every wait is bounded."""
import os
import re
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import POLYGW, call as call_on  # noqa: E402
from redis_fixture import fleet_config, source, unique_prefix, wait_until  # noqa: E402
from test_redis_cache import redis_srv, start_fleet  # noqa: E402,F401  (a fixture, a helper)


def lock_cfg(redis_srv, up, prefix, lock_s=None):
    cache = {"ttl_s": 60}
    if lock_s is not None:
        cache["lock_s"] = lock_s
    return fleet_config(redis_srv.url(), prefix,
                        [source("e1", "embedding", up.url, model="emb-1", serves=["*"])],
                        capabilities={"embedding": {"cache": cache}})


def embed_in_thread(sc, text, out):
    def run():
        c = sc.connect(timeout=10)
        try:
            out.append(call_on(c, "embedding", {"model": "e", "input": [text]}, 10))
        finally:
            c.close()
    t = threading.Thread(target=run)
    t.start()
    return t


def text(v):
    return v.decode() if isinstance(v, bytes) else v


def locks(redis_srv, prefix):
    return [text(k) for k in redis_srv.client().call("KEYS", "{%s:cache:*}:lock" % prefix)]


@pytest.mark.timing  # a 0.4 s lock must expire inside a 1.5 s call
def test_redis_cache_lock__an_expired_holder_leaves_anothers_lock(redis_srv, up, make_sidecar):
    prefix = unique_prefix()
    a, b = start_fleet(make_sidecar, 2, lock_cfg(redis_srv, up, prefix, lock_s=0.4))
    r = redis_srv.client()
    up.set_default({"delay_ms": 1500})
    out = []
    t = embed_in_thread(a, "slow", out)
    # a holds the lock with its own token, for lock_s.
    held = wait_until(lambda: locks(redis_srv, prefix), 3)
    assert held, "no lock taken"
    token = text(r.call("GET", held[0]))
    assert re.fullmatch(r"[0-9a-f]{16}:[0-9]+", token), token
    assert 0 < r.call("PTTL", held[0]) <= 400
    # It expires while a's call is still upstream: lock_s is shorter than
    # the call, so b's identical call goes upstream too (and takes the lock
    # with a token of its own).
    assert wait_until(lambda: not locks(redis_srv, prefix), 2)
    out_b = []
    tb = embed_in_thread(b, "slow", out_b)
    theirs = wait_until(lambda: r.call("GET", held[0]), 2)
    assert theirs and text(theirs) != token, theirs
    # Another holder's lock, long-lived, as the one that took it over.
    r.call("SET", held[0], "another-sidecar:1", "PX", "20000")
    t.join(10)
    tb.join(10)
    assert out and out[0][0] is None and out[0][1]["cache"] == "miss", out
    assert out_b and out_b[0][0] is None and out_b[0][1]["cache"] == "miss", out_b
    assert up.stats()["requests"] == 2
    # Both calls ended and released "their" lock: neither dropped the
    # other holder's (a plain DEL would have).
    time.sleep(0.2)  # any unlock already sent has reached Redis
    assert text(r.call("GET", held[0])) == "another-sidecar:1"
    assert r.call("PTTL", held[0]) > 10000


def test_redis_cache_lock__the_owner_drops_its_lock_and_the_default_life(
        redis_srv, up, make_sidecar):
    prefix = unique_prefix()
    (a,) = start_fleet(make_sidecar, 1, lock_cfg(redis_srv, up, prefix))
    r = redis_srv.client()
    up.set_default({"delay_ms": 600})
    out = []
    t = embed_in_thread(a, "mine", out)
    held = wait_until(lambda: locks(redis_srv, prefix), 3)
    assert held
    assert 14000 < r.call("PTTL", held[0]) <= 15000  # 15 s by default
    t.join(10)
    assert out and out[0][0] is None, out
    # Its own token: the compare-and-delete drops it.
    assert wait_until(lambda: not locks(redis_srv, prefix), 2), locks(redis_srv, prefix)


def test_redis_cache_lock__a_bad_lock_life_is_a_config_error(up, tmp_path):
    """lock_s must be a number of seconds in (0, 3600]: the binary's own
    check names the file, the line, the key path and the reason."""
    for i, (v, why) in enumerate([(0, "must be in (0, 3600], got 0"), (-1, "got -1"),
                                  (3601, "got 3601"), ('"2h"', "expected a number")]):
        path = tmp_path / ("c%d.yaml" % i)
        srv = SimpleNamespace(url=lambda: "redis://127.0.0.1:1/0")  # never contacted
        path.write_text(lock_cfg(srv, up, "p", lock_s=0.5).replace("lock_s: 0.5", "lock_s: %s" % v))
        p = subprocess.run([POLYGW, "--check-config", str(path)], capture_output=True, text=True,
                           timeout=20)
        want = "capabilities.embedding.cache.lock_s: "
        assert p.returncode == 1 and want in p.stderr and why in p.stderr, (v, p.stderr)
        assert str(path) + ":" in p.stderr, p.stderr

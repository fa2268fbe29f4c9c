"""Fleet-level properties: one hash slot per script, Redis' clock only, and
three concurrent "sidecars" racing on admit.lua."""
import os
import random
import re
import threading
import time

from redis_support import LUA_DIR, SCRIPTS, Resp, Scripts, source_keys, hash_tag
from redis_args import admit, release, renew, progress, task

ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')


def test_headers_document_the_contract():
    for name in SCRIPTS:
        with open(os.path.join(LUA_DIR, name + ".lua")) as f:
            src = f.read()
        head = src.split("]]", 1)[0]
        for word in ("KEYS[1]", "ARGV[1]", "Returns"):
            assert word in head, (name, word)
        # time comes from Redis' own clock, never from the caller
        assert "redis.call('TIME')" in src, name


def test_every_script_touches_only_its_keys_of_one_slot(scripts, redis_server):
    """Runs every code path under MONITOR and checks that each command a
    script issued names one of that call's KEYS — all of one hash tag — so
    the layout works unchanged on Redis Cluster."""
    mon = Resp(redis_server.port)
    assert mon.call("MONITOR") == "OK"
    lines = []
    stop = threading.Event()

    def reader():
        mon.sock.settimeout(0.1)
        while not stop.is_set():
            try:
                lines.append(mon.read())
            except OSError:
                continue
    th = threading.Thread(target=reader)
    th.start()
    try:
        kw = dict(max_conc=2, rpm=3, rpm_win=1000, tpm=100, tpm_win=60000, daily=1000,
                  failures=1, cooldown=20, max_cooldown=40)
        a = admit(scripts, "s1", est=10, **kw)
        admit(scripts, "s1", est=10, **kw)
        admit(scripts, "s1", est=10, **kw)                       # concurrency
        renew(scripts, "s1", 1000, a[1], "gone")
        release(scripts, "s1", a[1], verdict="failure", est=10, used=50, **kw)
        time.sleep(0.03)
        p = admit(scripts, "s1", est=1, **kw)                    # probe
        release(scripts, "s1", p[1], verdict="neutral", est=1, used=0, **kw)
        p = admit(scripts, "s1", est=1, **kw)
        release(scripts, "s1", p[1], verdict="success", **kw)
        progress(scripts, "sc", "mark")
        progress(scripts, "sc", "age")
        for op in ("start", "guard", "stop", "get", "start", "watchdog", "start"):
            task(scripts, "tk", op)
        task(scripts, "tk", "finish", ok=1)
        time.sleep(0.2)
    finally:
        stop.set()
        th.join()
        mon.close()

    inner = [ARG.findall(x) for x in lines if isinstance(x, str) and "lua]" in x]
    assert len(inner) > 50, inner
    keysets = {tuple(k) for _, k in scripts.calls}
    all_keys = {k for ks in keysets for k in ks}
    for args in inner:
        cmd = args[0].upper()
        if cmd in ("TIME", "PUBLISH"):
            continue
        assert args[1] in all_keys, args
    for ks in keysets:
        assert len({hash_tag(k) for k in ks}) == 1, ks


def _racer(port, body, errors):
    c = Resp(port)
    try:
        body(Scripts(c))
    except BaseException as e:  # reported by the main thread
        errors.append(e)
    finally:
        c.close()


def _race(port, body, n=3):
    """Runs body(Scripts) on n connections ("sidecars") at once; none may fail."""
    errors = []
    threads = [threading.Thread(target=_racer, args=(port, body, errors)) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors, errors


def test_three_sidecars_never_exceed_max_concurrency(redis_server, conn):
    limit = 3
    lock = threading.Lock()
    state = {"held": 0, "max": 0, "admitted": 0, "refused": 0}
    end = time.monotonic() + 1.0

    def body(s):
        rnd = random.Random()
        mine = []
        for _ in range(2000):                       # bounded even if time stalls
            if time.monotonic() > end:
                break
            if len(mine) < 4 and rnd.random() < 0.6:
                r = admit(s, "race", max_conc=limit, lease_ttl=10000)
                if r[0] == 1:
                    with lock:
                        state["held"] += 1
                        state["admitted"] += 1
                        state["max"] = max(state["max"], state["held"])
                    mine.append(r[1])
                    assert s.conn.call("ZCARD", source_keys("race")[1]) <= limit
                else:
                    assert r[1] == "concurrency"
                    with lock:
                        state["refused"] += 1
            elif mine:
                lease = mine.pop(0)
                with lock:
                    state["held"] -= 1
                release(s, "race", lease)
        for lease in mine:
            with lock:
                state["held"] -= 1
            release(s, "race", lease)

    _race(redis_server.port, body)
    assert state["max"] == limit and state["held"] == 0, state   # reached, never exceeded
    assert state["refused"] > 0 and state["admitted"] > limit, state
    assert conn.call("ZCARD", source_keys("race")[1]) == 0


def test_three_sidecars_never_exceed_rpm(redis_server, conn):
    rpm = 20                                       # per 60 s: < 0.5 token refills in the test
    counts = []
    lock = threading.Lock()
    end = time.monotonic() + 0.6

    def body(s):
        n = 0
        for _ in range(1000):
            if time.monotonic() > end:
                break
            r = admit(s, "rl", rpm=rpm, rpm_win=60000, est=5, tpm=10 ** 6)
            if r[0] == 1:
                n += 1
                release(s, "rl", r[1], est=5, used=5, tpm=10 ** 6)
            else:
                assert r[1] == "rpm" and r[2] > 0
        with lock:
            counts.append(n)

    _race(redis_server.port, body)
    assert sum(counts) == rpm, counts

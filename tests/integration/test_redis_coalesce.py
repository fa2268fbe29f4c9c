"""Coalesced admissions over Redis: the admissions (and releases) one
sidecar asks for one source in the same loop turn leave as one admit.lua
(release.lua), and the fleet's limits still hold exactly. A real polygw,
a real redis-server, the real mock upstream; every wait is bounded."""
import os
import socket
import sys
import time

import msgpack
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from redis_fixture import (FleetRedis, chat, fleet_config, source,  # noqa: E402
                           stats, unique_prefix, wait_backend)

NO_PROXY = {"no_proxy": "*", "NO_PROXY": "*"}


@pytest.fixture
def redis_srv():
    srv = FleetRedis().start()
    yield srv
    srv.cleanup()


def evalsha_calls(srv):
    """INFO commandstats: EVALSHA calls so far (admit, release, marks…)."""
    c = srv.client()
    try:
        for line in c.call("INFO", "commandstats").splitlines():
            if line.startswith("cmdstat_evalsha:"):
                return int(line.split("calls=")[1].split(",")[0])
        return 0
    finally:
        c.close()


def burst(sc, up, total, deadline_s=15):
    """`total` calls in one write on one connection (the sidecar reads them
    in one loop turn, as it would many clients' under load); returns the
    mock's request count sampled every ~10 ms as (seconds since the write,
    count) once every call is answered without error."""
    conn = sc.connect(timeout=20)
    reqs = [[0, i + 1, "call", [{"capability": "chat", "body": chat("c%d" % i)}]]
            for i in range(total)]
    t0 = time.monotonic()
    conn.sock.sendall(b"".join(msgpack.packb(r) for r in reqs))
    answers, samples = {}, []
    while time.monotonic() < t0 + deadline_s and len(answers) < total:
        samples.append((time.monotonic() - t0, up.stats()["requests"]))
        try:
            msg = conn.recv_msg(0.01)
        except socket.timeout:
            continue
        assert msg is not None, "connection closed"
        if msg[0] == 1:
            answers[msg[1]] = msg
    conn.close()
    assert len(answers) == total, "%d of %d answered in %d s" % (len(answers), total, deadline_s)
    for msg in answers.values():
        assert msg[2] is None, msg[2]
        assert msg[3]["source"] == "a", msg[3]
    assert up.stats()["requests"] == total
    return samples


def test_coalesce__concurrent_calls_share_admit_scripts(redis_srv, up, make_sidecar):
    """48 calls at once on one sidecar, limits that do not bind: fewer
    admit.lua calls than admitted attempts, by the sidecar's count and by
    Redis' own (EVALSHA calls < 2 per admitted attempt, where one admit and
    one release each would be >= 2), and fewer release.lua calls than
    releases."""
    total = 48
    cfg = fleet_config(redis_srv.url(), unique_prefix(),
                       [source("a", "chat", up.url, max_concurrency=1000,
                               limits={"rpm": 100000, "window_s": 60})],
                       stall_window_s=20)
    sc = make_sidecar(config_text=cfg, env=NO_PROXY)
    wait_backend(sc)
    before = evalsha_calls(redis_srv)
    burst(sc, up, total)
    sh = stats(sc)["shared"]
    scripts = evalsha_calls(redis_srv) - before
    print("coalesce: %d admit.lua for %s requests, %d admitted; %d EVALSHA in Redis"
          % (sh["admits"], sh.get("admit_requests"), sh["admitted"], scripts))
    assert sh["admitted"] == total
    assert scripts < 2 * sh["admitted"], (scripts, sh)
    assert sh["admits"] < sh["admitted"], sh
    assert sh["admit_requests"] == total
    # the rest are release.lua (and at most a progress mark per 100 ms)
    assert sh["releases"] == total
    assert scripts - sh["admits"] < sh["releases"], (scripts, sh)


def test_coalesce__rpm_holds_exactly_in_a_coalesced_burst(redis_srv, up, make_sidecar):
    """48 calls at once, rpm 24 per 2 s window: the first 24 are admitted at
    once (in fewer scripts than calls), the rest only as the bucket refills:
    the mock's request count never exceeds 24 + 12/s since the burst."""
    n_rpm, win, total = 24, 2.0, 48
    rate = n_rpm / win
    cfg = fleet_config(redis_srv.url(), unique_prefix(),
                       [source("a", "chat", up.url, limits={"rpm": n_rpm, "window_s": win})],
                       stall_window_s=20)
    sc = make_sidecar(config_text=cfg, env=NO_PROXY)
    wait_backend(sc)
    samples = burst(sc, up, total)
    over = [(round(t, 3), n) for t, n in samples if n > n_rpm + rate * (t + 0.02)]
    assert not over, "rpm %d per %.1fs exceeded: (t, requests) %r" % (n_rpm, win, over)
    first_full = next((t for t, n in samples if n >= n_rpm), None)
    assert first_full is not None and first_full < win / 2, samples[:20]
    sh = stats(sc)["shared"]
    print("coalesce under rpm: %d admit.lua for %s requests, %d admitted"
          % (sh["admits"], sh.get("admit_requests"), sh["admitted"]))
    assert sh["admitted"] == total
    assert sh["refused"]["rpm"] > 0
    assert sh["admits"] < sh["admit_requests"], sh

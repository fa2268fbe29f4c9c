"""The shared breaker in admit.lua / release.lua (src/breaker.h semantics).
failures=3, cooldown 100 ms, max 300 ms (helpers.DEFAULTS)."""
import time

from redis_support import source_keys
from redis_args import admit, release, redis_now_ms, new_lease


def attempt(s, verdict, src="a", **kw):
    r = admit(s, src, **kw)
    assert r[0] == 1, r
    return release(s, src, r[1], verdict=verdict, **kw), r


def wait_until(conn, at_ms):
    time.sleep(max(0, (at_ms - redis_now_ms(conn)) / 1000 + 0.005))


def test_opens_after_n_consecutive_failures(scripts, conn):
    assert attempt(scripts, "failure")[0][1] == "closed"
    assert attempt(scripts, "failure")[0][1] == "closed"
    assert attempt(scripts, "failure")[0][1] == "open"
    r = admit(scripts, "a")
    assert r[:2] == [0, "breaker"]
    assert 50 < r[2] - redis_now_ms(conn) <= 101
    assert conn.call("HGET", source_keys("a")[0], "opened") == "1"


def test_success_and_neutral_reset_or_ignore(scripts, conn):
    attempt(scripts, "failure")
    attempt(scripts, "failure")
    attempt(scripts, "success")                 # resets the count
    attempt(scripts, "failure")
    attempt(scripts, "failure")
    for _ in range(5):                          # 429s / cancels never trip it
        assert attempt(scripts, "neutral")[0][1] == "closed"
    assert attempt(scripts, "failure")[0][1] == "open"


def test_half_open_single_probe(scripts, conn):
    for _ in range(3):
        attempt(scripts, "failure")
    r = admit(scripts, "a")
    wait_until(conn, r[2])
    p = admit(scripts, "a")
    assert p[0] == 1 and p[2] == 1                      # the probe
    assert admit(scripts, "a") == [0, "breaker", 0]     # probe busy: time unknown
    assert admit(scripts, "a") == [0, "breaker", 0]
    # a probe ending without a verdict frees the slot
    assert release(scripts, "a", p[1], verdict="neutral") == [1, "half_open", 1]
    p2 = admit(scripts, "a")
    assert p2[0] == 1 and p2[2] == 1
    assert release(scripts, "a", p2[1], verdict="success") == [1, "closed", 1]
    r = admit(scripts, "a")
    assert r[0] == 1 and r[2] == 0


def test_failed_probes_double_cooldown_up_to_max(scripts, conn):
    for _ in range(3):
        attempt(scripts, "failure")
    expected = [200, 300, 300]                 # 100 -> 200 -> 300 (max) -> 300
    for cd in expected:
        wait_until(conn, admit(scripts, "a")[2])
        p = admit(scripts, "a")
        assert p[2] == 1
        assert release(scripts, "a", p[1], verdict="failure")[1:] == ["open", 1]
        r = admit(scripts, "a")
        assert r[1] == "breaker"
        assert cd - 40 < r[2] - redis_now_ms(conn) <= cd + 1, (cd, r)
    # success closes and resets the cool-down to the base
    wait_until(conn, admit(scripts, "a")[2])
    p = admit(scripts, "a")
    assert release(scripts, "a", p[1], verdict="success")[1] == "closed"
    for _ in range(3):
        attempt(scripts, "failure")
    r = admit(scripts, "a")
    assert r[1] == "breaker" and r[2] - redis_now_ms(conn) <= 101


def test_straggler_verdicts_do_not_touch_open_breaker(scripts, conn):
    straggler = admit(scripts, "a")[1]              # admitted while closed
    for _ in range(3):
        attempt(scripts, "failure")
    until = conn.call("HGET", source_keys("a")[0], "open_until")
    assert release(scripts, "a", straggler, verdict="failure")[1:] == ["open", 0]
    assert conn.call("HGET", source_keys("a")[0], "open_until") == until
    wait_until(conn, admit(scripts, "a")[2])
    p = admit(scripts, "a")
    late = new_lease()
    # a non-probe success while half-open does not close it
    conn.call("ZADD", source_keys("a")[1], redis_now_ms(conn) + 10000, late)
    assert release(scripts, "a", late, verdict="success")[1:] == ["half_open", 0]
    assert release(scripts, "a", p[1], verdict="success")[1:] == ["closed", 1]


def test_dead_probe_owner_frees_probe_after_lease_ttl(scripts, conn):
    for _ in range(3):
        attempt(scripts, "failure")
    wait_until(conn, admit(scripts, "a")[2])
    p = admit(scripts, "a", lease_ttl=100)          # owner dies: never releases
    assert p[2] == 1
    assert admit(scripts, "a")[1] == "breaker"
    time.sleep(0.15)
    p2 = admit(scripts, "a")
    assert p2[0] == 1 and p2[2] == 1
    # the dead owner's late release is not the probe's
    assert release(scripts, "a", p[1], verdict="failure") == [0, "half_open", 0]


def test_breaker_disabled_with_zero_failures(scripts, conn):
    for _ in range(10):
        assert attempt(scripts, "failure", failures=0)[0][1] == "closed"


def test_bad_verdict_is_an_error_and_writes_nothing(scripts, conn):
    from redis_support import RedisError
    import pytest
    lease = admit(scripts, "a")[1]
    with pytest.raises(RedisError):
        release(scripts, "a", lease, verdict="bogus")
    assert conn.call("ZSCORE", source_keys("a")[1], lease) is not None

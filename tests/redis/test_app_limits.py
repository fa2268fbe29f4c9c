"""admit.lua / release.lua / renew.lua with the calling app's limit groups:
an app's max_concurrency, rpm and tokens hold across sources (and sidecars),
its leases expire like the source's, and its limits on one capability come
on top of its own."""
import time

from redis_support import app_keys, hash_tag, key_slot, source_keys
from redis_args import admit, group, level, redis_now_ms, release, renew


def test_app_concurrency_across_sources(scripts, conn):
    web = group("web", max_conc=2)
    a = admit(scripts, "a", max_conc=10, groups=[web])
    b = admit(scripts, "b", max_conc=10, groups=[web])
    assert a[0] == 1 and b[0] == 1
    # the app's third attempt, on either source, waits for one of its two
    assert admit(scripts, "a", max_conc=10, groups=[web]) == [0, "app_concurrency", 0]
    # another app on the same source is not held back by it
    assert admit(scripts, "a", max_conc=10, groups=[group("batch", max_conc=2)])[0] == 1
    assert conn.call("ZCARD", app_keys("web")[0]) == 2
    assert conn.call("ZCARD", source_keys("a")[1]) == 2   # web's and batch's
    # a release gives the app's slot back with the source's
    assert release(scripts, "b", b[1], groups=[web])[0] == 1
    assert conn.call("ZSCORE", app_keys("web")[0], b[1]) is None
    assert admit(scripts, "a", max_conc=10, groups=[web])[0] == 1


def test_source_refusal_comes_first_and_writes_nothing(scripts, conn):
    web = group("web", max_conc=1, rpm=5, rpm_win=60000)
    assert admit(scripts, "a", max_conc=1, groups=[web])[0] == 1
    # both fail: the source's check is named; nothing is written for the app
    assert admit(scripts, "a", max_conc=1, groups=[web]) == [0, "concurrency", 0]
    assert conn.call("ZCARD", app_keys("web")[0]) == 1
    assert abs(float(conn.call("HGET", app_keys("web")[1], "level")) - 4) < 1e-6


def test_app_lease_expiry_frees_its_slot(scripts, conn):
    """A sidecar that dies holding an app's slot gives it back after the TTL;
    a live one keeps it by renewing the app's leases key too."""
    web = group("web", max_conc=1)
    lease = admit(scripts, "a", lease_ttl=200, groups=[web])[1]
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        assert renew(scripts, "a", 200, lease)[0] == 1
        assert scripts.run("renew", [app_keys("web")[0]], [200, lease])[0] == 1
        assert admit(scripts, "b", lease_ttl=200, groups=[web])[1] == "app_concurrency"
        time.sleep(0.06)
    deadline = time.monotonic() + 2
    while admit(scripts, "b", lease_ttl=200, groups=[web])[0] != 1:
        assert time.monotonic() < deadline, "the app's expired lease never freed its slot"
        time.sleep(0.02)
    assert 0 < conn.call("PTTL", app_keys("web")[0]) <= 200 + 1002


def test_app_rpm_across_sources_and_retry_at(scripts, conn):
    web = group("web", rpm=3, rpm_win=1000)
    for src in ("a", "b", "a"):
        r = admit(scripts, src, groups=[web])
        assert r[0] == 1
        release(scripts, src, r[1], groups=[web])
    r = admit(scripts, "b", groups=[web])
    assert r[:2] == [0, "app_rpm"]
    assert 200 < r[2] - redis_now_ms(conn) <= 334    # one request per 333 ms
    assert level(conn, "b", "rpm") is None            # the source's bucket: never touched
    # another app is not limited by web's rpm
    assert admit(scripts, "b", groups=[group("batch", rpm=3, rpm_win=1000)])[0] == 1
    time.sleep(max(0, (r[2] - redis_now_ms(conn)) / 1000 + 0.005))
    assert admit(scripts, "b", groups=[web])[0] == 1


def test_app_tokens_reconciled_on_release(scripts, conn):
    web = group("web", tpm=1000, tpm_win=60000, daily=5000)
    r = admit(scripts, "a", est=600, groups=[web])
    assert r[0] == 1
    tpm = lambda: float(conn.call("HGET", app_keys("web")[2], "level"))  # noqa: E731
    daily = lambda: float(conn.call("HGET", app_keys("web")[3], "level"))  # noqa: E731
    assert abs(tpm() - 400) < 5 and abs(daily() - 4400) < 1
    refused = admit(scripts, "b", est=600, groups=[web])
    assert refused[1] == "app_tpm" and abs(refused[2] - redis_now_ms(conn) - 12000) < 200
    # real usage 100: 500 tokens come back to the app's buckets
    release(scripts, "a", r[1], est=600, used=100, groups=[web])
    assert abs(tpm() - 900) < 5 and abs(daily() - 4900) < 1
    assert admit(scripts, "b", est=600, groups=[web])[0] == 1


def test_app_capability_group_on_top_of_the_app(scripts, conn):
    own = group("web", rpm=10, rpm_win=60000)
    chat = group("web", cap="chat", max_conc=1)
    t0 = redis_now_ms(conn)
    first = admit(scripts, "a", groups=[own, chat])
    assert first[0] == 1
    assert admit(scripts, "a", groups=[own, chat]) == [0, "app_cap_concurrency", 0]
    # another capability of the same app: only its own group
    assert admit(scripts, "e", groups=[own])[0] == 1
    assert conn.call("ZCARD", app_keys("web", "chat")[0]) == 1
    assert conn.call("EXISTS", app_keys("web")[0]) == 0   # no max_concurrency: no leases
    # two taken, and what refilled since (10 a minute) however slow the test ran
    refill = (redis_now_ms(conn) - t0) * 10 / 60000
    assert 8 - 1e-9 <= float(conn.call("HGET", app_keys("web")[1], "level")) <= 8 + refill + 1e-6
    release(scripts, "a", first[1], groups=[own, chat])
    assert conn.call("ZCARD", app_keys("web", "chat")[0]) == 0
    assert admit(scripts, "a", groups=[own, chat])[0] == 1


def test_bad_group_layout_is_an_error_before_any_write(scripts, conn):
    keys = source_keys("a") + app_keys("web")[:3]       # a group of 3 keys
    args = ["l1", 0, 10000, 0, 60000, 0, 60000, 0, 86400000, 0]
    try:
        scripts.conn.call("EVAL", scripts.src["admit"], len(keys), *keys, *args)
        raise AssertionError("accepted")
    except Exception as e:  # noqa: BLE001 (the client's RedisError)
        assert "KEYS must be 5 + 4 per app group" in str(e)
    keys = source_keys("a") + app_keys("web")               # a group without its ARGV
    try:
        scripts.conn.call("EVAL", scripts.src["admit"], len(keys), *keys, *args)
        raise AssertionError("accepted")
    except Exception as e:  # noqa: BLE001
        assert "ARGV 10 + 8 per group" in str(e)
    assert conn.call("KEYS", "*") == []


def test_hash_tagged_prefix_puts_source_and_app_in_one_slot():
    """With a prefix that carries a hash tag ("{pgw}"), the source's and the
    app's keys of one admission hash to one slot (a cluster-aware proxy)."""
    keys = source_keys("a", prefix="{pgw}") + app_keys("web", "chat", prefix="{pgw}")
    assert len({key_slot(k) for k in keys}) == 1
    plain = source_keys("a") + app_keys("web")
    assert len({hash_tag(k) for k in plain}) == 2

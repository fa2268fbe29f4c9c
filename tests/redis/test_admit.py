"""admit.lua / release.lua / renew.lua: leases, buckets, reconciliation."""
import time

from redis_support import source_keys
from redis_args import admit, release, renew, redis_now_ms, level, new_lease


def test_admission_until_concurrency_exhausted(scripts, conn):
    leases = []
    for _ in range(3):
        r = admit(scripts, "a", max_conc=3)
        assert r[0] == 1 and r[2] == 0, r
        leases.append(r[1])
    assert admit(scripts, "a", max_conc=3) == [0, "concurrency", 0]
    assert conn.call("ZCARD", source_keys("a")[1]) == 3
    assert release(scripts, "a", leases[0])[0] == 1
    assert admit(scripts, "a", max_conc=3)[0] == 1
    # releasing twice is harmless: the lease is gone
    assert release(scripts, "a", leases[0])[0] == 0
    # another source is independent
    assert admit(scripts, "b", max_conc=3)[0] == 1


def test_lease_expiry_frees_permit(scripts, conn):
    """A sidecar that dies holding a permit gives it back after the lease TTL."""
    assert admit(scripts, "a", max_conc=1, lease_ttl=150)[0] == 1
    assert admit(scripts, "a", max_conc=1, lease_ttl=150)[1] == "concurrency"
    deadline = time.monotonic() + 2
    while admit(scripts, "a", max_conc=1, lease_ttl=150)[0] != 1:
        assert time.monotonic() < deadline, "expired lease never freed its permit"
        time.sleep(0.02)
    # the leases key itself does not outlive its leases (+1 s margin)
    assert 0 < conn.call("PTTL", source_keys("a")[1]) <= 150 + 1002   # ceil() of fractional ms


def test_renew_keeps_lease_and_never_resurrects(scripts, conn):
    lease = admit(scripts, "a", max_conc=1, lease_ttl=200)[1]
    end = time.monotonic() + 0.6
    while time.monotonic() < end:
        assert renew(scripts, "a", 200, lease, "ghost") == [1, ["ghost"]]
        assert admit(scripts, "a", max_conc=1, lease_ttl=200)[1] == "concurrency"
        time.sleep(0.07)
    # stop renewing: it expires, and a late renew does not bring it back
    time.sleep(0.3)
    assert renew(scripts, "a", 200, lease) == [0, [lease]]
    assert conn.call("ZSCORE", source_keys("a")[1], lease) is None
    assert admit(scripts, "a", max_conc=1, lease_ttl=200)[0] == 1


def test_rpm_bucket_refill_and_retry_at(scripts, conn):
    # 5 requests per 1000 ms: one token every 200 ms
    for _ in range(5):
        r = admit(scripts, "a", rpm=5, rpm_win=1000)
        assert r[0] == 1
        release(scripts, "a", r[1])
    r = admit(scripts, "a", rpm=5, rpm_win=1000)
    now = redis_now_ms(conn)
    assert r[:2] == [0, "rpm"]
    wait = r[2] - now
    assert 100 < wait <= 201, wait     # ~200 ms minus the time the 5 admits took
    # not before retry_at ...
    time.sleep(max(0, (r[2] - redis_now_ms(conn)) / 1000 - 0.06))
    assert admit(scripts, "a", rpm=5, rpm_win=1000)[1] == "rpm"
    # ... but at retry_at
    time.sleep(max(0, (r[2] - redis_now_ms(conn)) / 1000 + 0.005))
    assert admit(scripts, "a", rpm=5, rpm_win=1000)[0] == 1
    r2 = admit(scripts, "a", rpm=5, rpm_win=1000)
    assert r2[1] == "rpm" and 150 < r2[2] - redis_now_ms(conn) <= 201


def test_tpm_reserve_and_give_back(scripts, conn):
    kw = dict(tpm=1000, tpm_win=60000)
    a = admit(scripts, "a", est=600, **kw)
    assert a[0] == 1
    assert abs(level(conn, "a", "tpm") - 400) < 5
    r = admit(scripts, "a", est=600, **kw)
    assert r[1] == "tpm"
    # 200 tokens missing at 1000 / 60 s: about 12 s
    assert abs((r[2] - redis_now_ms(conn)) - 12000) < 200
    # the real usage was 100: 500 come back
    release(scripts, "a", a[1], est=600, used=100, **kw)
    assert abs(level(conn, "a", "tpm") - 900) < 5
    assert admit(scripts, "a", est=600, **kw)[0] == 1


def test_give_back_never_above_capacity(scripts, conn):
    kw = dict(tpm=1000, tpm_win=60000, daily=5000, daily_win=86400000)
    a = admit(scripts, "a", est=100, **kw)
    release(scripts, "a", a[1], est=100, used=0, **kw)
    assert level(conn, "a", "tpm") == 1000
    assert level(conn, "a", "daily") == 5000


def test_tpm_debt_delays_admission(scripts, conn):
    kw = dict(tpm=1000, tpm_win=60000)
    a = admit(scripts, "a", est=100, **kw)
    release(scripts, "a", a[1], est=100, used=1500, **kw)       # 1400 more: debt
    assert abs(level(conn, "a", "tpm") + 500) < 5
    for est in (0, 1):
        r = admit(scripts, "a", est=est, **kw)
        assert r[1] == "tpm"
        assert abs((r[2] - redis_now_ms(conn)) - (500 + est) * 60) < 300
    # unknown usage (-1): the estimate stands
    conn.call("DEL", source_keys("a")[3])
    a = admit(scripts, "a", est=100, **kw)
    release(scripts, "a", a[1], est=100, used=-1, **kw)
    assert abs(level(conn, "a", "tpm") - 900) < 5


def test_oversized_request_needs_full_bucket(scripts, conn):
    kw = dict(tpm=1000, tpm_win=60000)
    assert admit(scripts, "a", est=5000, **kw)[0] == 1       # full: admitted, leaves debt
    assert abs(level(conn, "a", "tpm") + 4000) < 5
    r = admit(scripts, "a", est=5000, **kw)
    assert r[1] == "tpm" and abs((r[2] - redis_now_ms(conn)) - 5000 * 60) < 300


def test_daily_bucket(scripts, conn):
    kw = dict(tpm=10000, daily=1000, daily_win=86400000)
    assert admit(scripts, "a", est=800, **kw)[0] == 1
    r = admit(scripts, "a", est=300, **kw)
    assert r[1] == "daily"
    assert abs((r[2] - redis_now_ms(conn)) - 100 * 86400) < 5000


def test_refusal_writes_nothing(scripts, conn):
    """A refused admission takes no tokens and adds no lease; the reason is
    the first failing check, retry_at the latest known availability."""
    kw = dict(rpm=1, rpm_win=1000, tpm=100, tpm_win=60000)
    assert admit(scripts, "a", est=50, **kw)[0] == 1
    before = level(conn, "a", "tpm")
    r = admit(scripts, "a", est=80, **kw)          # rpm and tpm both short
    assert r[1] == "rpm"
    now = redis_now_ms(conn)
    assert abs((r[2] - now) - 30 * 600) < 300      # tpm (18 s) is later than rpm (1 s)
    assert abs(level(conn, "a", "tpm") - before) < 1
    assert conn.call("ZCARD", source_keys("a")[1]) == 1


def test_unlimited_by_default(scripts, conn):
    for _ in range(50):
        assert admit(scripts, "a", est=10 ** 9)[0] == 1
    assert conn.call("EXISTS", *source_keys("a")[2:]) == 0   # no bucket keys at all


def test_key_ttls(scripts, conn):
    kw = dict(rpm=10, rpm_win=1000, tpm=1000, tpm_win=60000)
    admit(scripts, "a", est=500, lease_ttl=5000, **kw)
    keys = source_keys("a")
    # a bucket key lives until it would be full again (+1 s): absent == full
    assert 0 < conn.call("PTTL", keys[2]) <= 100 + 1002
    assert 29000 < conn.call("PTTL", keys[3]) <= 30000 + 1002
    assert 4000 < conn.call("PTTL", keys[1]) <= 6002
    lease = new_lease()
    admit(scripts, "b", lease=lease, lease_ttl=5000)
    release(scripts, "b", lease, verdict="failure")
    assert conn.call("PTTL", source_keys("b")[0]) > 86000000

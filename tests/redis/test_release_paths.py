"""release.lua's short paths and admit.lua's numbers: what a release writes
(and leaves alone) on each breaker state and with or without a usage delta,
and the precision of the lease expiry admit.lua records."""
from redis_support import app_keys, source_keys
from redis_args import admit, group, level, redis_now_ms, release
from test_admit_many import admit_many, release_many


def breaker(conn, src="a"):
    return dict(zip(*[iter(conn.call("HGETALL", source_keys(src)[0]))] * 2))


def test_success_on_a_closed_breaker_writes_nothing(scripts, conn):
    lease = admit(scripts, "a", max_conc=5)[1]
    assert release(scripts, "a", lease, est=100, used=80) == [1, "closed", 0]
    # no breaker field changed, no bucket has a capacity: no key but the leases'
    assert conn.call("EXISTS", *[k for i, k in enumerate(source_keys("a")) if i != 1]) == 0


def test_verdicts_on_an_open_and_a_half_open_breaker(scripts, conn):
    """A straggler's success leaves an open breaker open (no write) and says
    so; on a half-open one it says half_open; the probe's success closes it."""
    k = source_keys("a")[0]
    until = redis_now_ms(conn) + 60000
    conn.call("HSET", k, "open_until", until, "cooldown", 5000)
    lease = admit(scripts, "a")  # refused: open
    assert lease[:2] == [0, "breaker"]
    conn.call("ZADD", source_keys("a")[1], redis_now_ms(conn) + 10000, "straggler")
    assert release(scripts, "a", "straggler") == [1, "open", 0]
    assert breaker(conn) == {"open_until": str(until), "cooldown": "5000"}
    conn.call("HSET", k, "open_until", redis_now_ms(conn) - 1)
    conn.call("ZADD", source_keys("a")[1], redis_now_ms(conn) + 10000, "straggler2")
    assert release(scripts, "a", "straggler2", verdict="failure") == [1, "half_open", 0]
    probe = admit(scripts, "a")
    assert probe[0] == 1 and probe[2] == 1
    assert release(scripts, "a", probe[1]) == [1, "closed", 1]
    b = breaker(conn)
    assert b["open_until"] == "0" and b["consec"] == "0" and b["cooldown"] == "100"
    assert "probe" not in b
    assert conn.call("PTTL", k) > 86400000 - 5000


def test_a_success_resets_the_count_and_arms_the_ttl(scripts, conn):
    """failures = 3: two failures, a success (consec back to 0, the key's TTL
    re-armed), two more still closed, the third opens."""
    for _ in range(2):
        assert release(scripts, "a", admit(scripts, "a")[1], verdict="failure")[1] == "closed"
    assert breaker(conn)["consec"] == "2"
    conn.call("PEXPIRE", source_keys("a")[0], 1000)
    assert release(scripts, "a", admit(scripts, "a")[1])[1] == "closed"
    assert breaker(conn)["consec"] == "0"
    assert conn.call("PTTL", source_keys("a")[0]) > 86400000 - 5000
    for _ in range(2):
        assert release(scripts, "a", admit(scripts, "a")[1], verdict="failure")[1] == "closed"
    assert release(scripts, "a", admit(scripts, "a")[1], verdict="failure")[1] == "open"
    assert breaker(conn)["opened"] == "1"


def test_a_batch_reconciles_its_deltas_only(scripts, conn):
    """Four attempts of 100 tokens; their releases in one script: usage equal
    to the estimate, unknown (-1), 40 (60 back) and 250 (150 more). The
    source's tpm and daily and the app's tpm move by exactly -90 net."""
    web = group("web", tpm=500, tpm_win=60000)
    kw = dict(tpm=1000, tpm_win=60000, daily=5000, daily_win=86400000)
    ids, out = admit_many(scripts, "a", [100] * 4, groups=[web], **kw)
    assert [o[0] for o in out] == [1] * 4
    t0 = redis_now_ms(conn)
    items = [(ids[0], "success", 100, 100), (ids[1], "success", 100, -1),
             (ids[2], "success", 100, 40), (ids[3], "failure", 100, 250)]
    replies = release_many(scripts, "a", items, groups=[web], **kw)
    assert [r[0] for r in replies] == [1] * 4
    refill_ms = redis_now_ms(conn) - t0 + 50   # upper bound of the refill since
    assert 510 <= level(conn, "a", "tpm") <= 510 + refill_ms * 1000 / 60000
    assert 4510 <= level(conn, "a", "daily") <= 4510 + 1
    app_tpm = float(conn.call("HGET", app_keys("web")[2], "level"))
    assert 10 <= app_tpm <= 10 + refill_ms * 500 / 60000
    assert conn.call("ZCARD", app_keys("web")[0]) == 0  # no max_concurrency: no leases


def test_a_batch_without_deltas_leaves_the_buckets_alone(scripts, conn):
    kw = dict(tpm=1000, tpm_win=60000)
    ids, _ = admit_many(scripts, "a", [100, 100], **kw)
    before = conn.call("HGETALL", source_keys("a")[3])
    release_many(scripts, "a", [(ids[0], "success", 100, 100), (ids[1], "neutral", 100, -1)],
                 **kw)
    assert conn.call("HGETALL", source_keys("a")[3]) == before


def test_lease_expiry_keeps_redis_microseconds(scripts, conn):
    """The expiry is Redis' time + the TTL to the microsecond (17 digits),
    not rounded to Lua's 14: of ten leases, some fall between whole ms."""
    fractions = []
    for _ in range(10):
        t0 = redis_now_ms(conn)
        lease = admit(scripts, "a", max_conc=100, lease_ttl=30000)[1]
        score = float(conn.call("ZSCORE", source_keys("a")[1], lease))
        assert t0 + 30000 - 1 <= score <= redis_now_ms(conn) + 30000
        fractions.append(score % 1)
    assert any(0.0005 < f < 0.9995 for f in fractions), fractions
    assert 0 < conn.call("PTTL", source_keys("a")[1]) <= 30000 + 1002

"""admit.lua / release.lua with io keys: a source's and an app's input- and
output-token buckets (limits.itpm / otpm). Each attempt reserves its input
(est_tokens - est_out) and output (est_out) apart; the release replaces them
by the real counts (the input as the source counts it: cache reads left out
where they do not count). Levels are checked exactly against the `ts` Redis
stored (its own clock), retry times between two readings of Redis' clock."""
import pytest

from redis_support import RedisError, app_keys, io_key, source_keys
from redis_args import admit, group, io, io_levels, new_lease, redis_now_ms, release

SRC = "source:a"
WIN = 60000


def refill(lvl, cap, dt_ms, win=WIN):
    return min(cap, lvl + dt_ms * cap / win)


def test_attempt_reserves_input_and_output_apart(scripts, conn):
    ios = [io(SRC, itpm=1000, otpm=200)]
    r = admit(scripts, "a", est=350, est_out=100, ios=ios)
    assert r[0] == 1
    lin, lout, ts = io_levels(conn, SRC)
    assert (lin, lout) == (750, 100)      # 350 - 100 input, 100 output
    # the key lives until both are full again (output: 100 of 200 per minute)
    assert 30000 < conn.call("PTTL", io_key(SRC)) <= 31000
    # a second one: input fits, output needs 150 of the 100 left
    t0 = redis_now_ms(conn)
    r2 = admit(scripts, "a", est=200, est_out=150, ios=ios)
    t1 = redis_now_ms(conn)
    assert r2[:2] == [0, "otpm"]
    # 50 missing at 200 per minute, from the level refilled since ts
    assert t0 - ts <= 1000
    lo = refill(100, 200, t0 - ts)
    hi = refill(100, 200, t1 - ts)
    assert t0 + (150 - hi) * WIN / 200 - 1 <= r2[2] <= t1 + (150 - lo) * WIN / 200 + 1
    # a refusal writes nothing
    assert io_levels(conn, SRC) == (lin, lout, ts)


def test_release_replaces_estimates_by_real_counts(scripts, conn):
    ios = [io(SRC, itpm=1000, otpm=200)]
    lease = admit(scripts, "a", est=350, est_out=100, ios=ios)[1]
    _, _, ts1 = io_levels(conn, SRC)
    # input 50 (say 200 of 250 prompt tokens were cache reads that do not
    # count), output 180: 200 input tokens come back, 80 more output go
    release(scripts, "a", lease, est=350, used=430, ios=ios, est_out=100, used_in=50,
            used_out=180)
    lin, lout, ts2 = io_levels(conn, SRC)
    assert lin == pytest.approx(min(1000, refill(750, 1000, ts2 - ts1) + 200), abs=1e-9)
    assert lout == pytest.approx(refill(100, 200, ts2 - ts1) - 80, abs=1e-9)
    # unknown counts (a failure): the estimates stand, nothing is written
    lease = admit(scripts, "a", est=10, est_out=5, ios=ios)[1]
    before = io_levels(conn, SRC)
    release(scripts, "a", lease, verdict="failure", est=10, ios=ios, est_out=5)
    assert io_levels(conn, SRC) == before


def test_output_can_go_into_debt_and_delays_the_next(scripts, conn):
    """Output above the estimate takes the bucket below zero: the next
    attempt waits until it has refilled (the limit holds over the minute)."""
    ios = [io(SRC, otpm=100)]
    lease = admit(scripts, "a", est=20, est_out=10, ios=ios)[1]
    release(scripts, "a", lease, est=20, used=160, ios=ios, est_out=10, used_in=10, used_out=150)
    lin, lout, ts = io_levels(conn, SRC)
    assert lin is None                     # no itpm: the field is never written
    assert lout == pytest.approx(-50, abs=0.1)
    t0 = redis_now_ms(conn)
    r = admit(scripts, "a", est=10, est_out=1, ios=ios)
    assert r[:2] == [0, "otpm"]
    # 51 missing at 100 per minute: ~30.6 s
    assert abs(r[2] - t0 - 51 * WIN / 100) < 100


def test_app_io_across_sources_and_reason_order(scripts, conn):
    """An app's itpm holds across sources; the source's own io comes first."""
    app = io("app:web", itpm=300)
    a = admit(scripts, "a", est=200, est_out=0, ios=[app])
    assert a[0] == 1
    assert admit(scripts, "b", est=200, est_out=0, ios=[app])[:2] == [0, "app_itpm"]
    assert io_levels(conn, "app:web")[0] == 100
    # source b's itpm fails too: it is named first
    assert admit(scripts, "b", est=950, ios=[io("source:b", itpm=1000)])[0] == 1
    both = [io("source:b", itpm=1000), app]
    assert admit(scripts, "b", est=200, est_out=0, ios=both)[:2] == [0, "itpm"]
    # the app's release on source a gives its unused input back to the app
    release(scripts, "a", a[1], est=200, used=60, ios=[app], est_out=0, used_in=50, used_out=10)
    lin, _, _ = io_levels(conn, "app:web")
    assert lin == pytest.approx(250, abs=0.1)
    assert admit(scripts, "b", est=200, est_out=0, ios=[app])[0] == 1


def test_io_keys_with_app_groups_and_concurrency(scripts, conn):
    """io keys come after the app groups: the groups' checks and writes are
    those without io keys, and a group's refusal writes no io key."""
    web = group("web", max_conc=1, tpm=1000)
    ios = [io(SRC, itpm=1000, otpm=1000), io("app:web", otpm=500)]
    r = admit(scripts, "a", est=300, est_out=200, groups=[web], ios=ios)
    assert r[0] == 1
    assert io_levels(conn, SRC)[:2] == (900, 800)
    assert io_levels(conn, "app:web")[:2] == (None, 300)
    assert float(conn.call("HGET", app_keys("web")[2], "level")) == pytest.approx(700, abs=0.1)
    before = (io_levels(conn, SRC), io_levels(conn, "app:web"))
    assert admit(scripts, "a", est=1, groups=[web], ios=ios)[:2] == [0, "app_concurrency"]
    assert (io_levels(conn, SRC), io_levels(conn, "app:web")) == before
    # release frees the app's slot and reconciles all of it
    release(scripts, "a", r[1], est=300, used=50, groups=[web], ios=ios, est_out=200,
            used_in=0, used_out=50)
    assert io_levels(conn, SRC)[0] == pytest.approx(1000, abs=0.1)   # capped at capacity
    assert io_levels(conn, SRC)[1] == pytest.approx(950, abs=0.5)
    assert io_levels(conn, "app:web")[1] == pytest.approx(450, abs=0.5)
    assert conn.call("ZCARD", app_keys("web")[0]) == 0


def test_batched_attempts_and_releases(scripts, conn):
    """Further attempts carry (lease, est, est_out), further releases seven
    fields: each as if alone, one after the other."""
    ios = [io(SRC, otpm=100)]
    ids = [new_lease() for _ in range(4)]
    r = admit(scripts, "a", est=50, est_out=40, lease=ids[0], ios=ios,
              more=[(ids[1], 60, 50), (ids[2], 30, 20), (ids[3], 10, 5)])
    # 40 + 50 of 100 fit, then 20 does not (10 left), 5 does
    assert [r[i] for i in range(0, 12, 3)] == [1, 1, 0, 1]
    assert r[7] == "otpm"
    assert io_levels(conn, SRC)[1] == pytest.approx(5, abs=0.1)
    release(scripts, "a", ids[0], est=50, used=20, ios=ios, est_out=40, used_in=10, used_out=10,
            more=[(ids[1], "success", 60, -1, 50, -1, -1),
                  (ids[3], "success", 10, 5, 5, 5, 0)])
    # 30 back for the first, 5 back for the last, the second's estimate stands
    assert io_levels(conn, SRC)[1] == pytest.approx(40, abs=0.2)
    assert conn.call("ZCARD", source_keys("a")[1]) == 0


def test_no_io_keys_no_io_arguments(scripts, conn):
    """Without itpm / otpm nothing changes: 5 keys, 10 arguments, no io key."""
    assert len(scripts.calls) == 0
    lease = admit(scripts, "a", est=10)[1]
    release(scripts, "a", lease, est=10, used=5)
    assert [len(k) for _, k in scripts.calls] == [5, 5]
    assert conn.call("EXISTS", io_key(SRC)) == 0


@pytest.mark.parametrize("script", ["admit", "release"])
def test_bad_io_layout_is_an_error_before_any_write(scripts, conn, script):
    keys = source_keys("a") + [io_key(SRC), io_key("app:web"), io_key("app:x")]
    args = ["l1", 0, 10000, 0, 60000, 0, 60000, 0, 86400000, 0, "", 5, 5, 60000]
    with pytest.raises(RedisError, match="0 to 2 io keys"):
        conn.call("EVAL", scripts.src[script], len(keys), *keys, *args)
    keys = source_keys("a") + [io_key(SRC)]     # an io key without est_out
    args = ["l1", 0, 10000, 0, 60000, 0, 60000, 0, 86400000, 0, "", 5, 5]
    with pytest.raises(RedisError, match="per io key"):
        conn.call("EVAL", scripts.src[script], len(keys), *keys, *args)
    assert conn.call("KEYS", "*") == []

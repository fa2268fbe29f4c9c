"""admit.lua with further attempts (the sidecar's coalesced admissions of
one loop turn): each attempt is checked as if admitted alone, one after the
other at the same Redis time; the reply is one triple per attempt."""
import pytest

from redis_support import RedisError, app_keys, source_keys
from redis_args import DEFAULTS, admit, group, level, new_lease, redis_now_ms


def admit_many(s, src, ests, groups=(), **kw):
    """One admit.lua for len(ests) attempts: the usual arguments for the
    first, then (lease id, estimate) per further attempt."""
    c = dict(DEFAULTS, **kw)
    ids = [new_lease() for _ in ests]
    keys, args = list(source_keys(src)), []
    for gk, gc, label in groups:
        keys += gk
        args += [label, gc["max_conc"], gc["rpm"], gc["rpm_win"], gc["tpm"], gc["tpm_win"],
                 gc["daily"], gc["daily_win"]]
    for lease, est in zip(ids[1:], ests[1:]):
        args += [lease, est]
    r = s.run("admit", keys,
              [ids[0], c["max_conc"], c["lease_ttl"], c["rpm"], c["rpm_win"], c["tpm"],
               c["tpm_win"], c["daily"], c["daily_win"], ests[0]] + args)
    assert len(r) == 3 * len(ests), r
    return ids, [r[i:i + 3] for i in range(0, len(r), 3)]


def test_rpm_bound_holds_exactly_in_one_batch(scripts, conn):
    """rpm 10 and 15 attempts in one script: the first 10 are admitted, the
    other 5 refused on rpm with a retry time in the future."""
    t0 = redis_now_ms(conn)
    ids, out = admit_many(scripts, "a", [0] * 15, rpm=10, rpm_win=60000)
    assert [o[0] for o in out] == [1] * 10 + [0] * 5
    assert [o[1] for o in out[:10]] == ids[:10]
    for o in out[10:]:
        assert o[1] == "rpm" and o[2] > t0, o
    assert conn.call("ZCARD", source_keys("a")[1]) == 10
    assert abs(level(conn, "a", "rpm")) < 0.01
    # the bucket is the one single admissions see: the next one is refused too
    assert admit(scripts, "a", rpm=10, rpm_win=60000)[1] == "rpm"


def test_batch_answers_as_the_same_attempts_one_by_one(scripts, conn):
    """Concurrency, tpm with different estimates (a small one passes after a
    big one is refused) and the app's own limit: the batch gives each attempt
    the verdict a sequence of single admissions gives it."""
    ests = [40, 50, 30, 5, 20, 1, 1]
    kw = dict(max_conc=5, tpm=100, tpm_win=60000)
    web_a = group("web_a", max_conc=4)
    web_b = group("web_b", max_conc=4)
    _, batch = admit_many(scripts, "a", ests, groups=[web_a], **kw)
    single = [admit(scripts, "b", est=e, groups=[web_b], **kw) for e in ests]
    assert [(o[0], o[1] if o[0] == 0 else None) for o in batch] == \
        [(o[0], o[1] if o[0] == 0 else None) for o in single]
    # 40 + 50 admitted, 30 refused (tpm), 5 admitted, 20 refused, then the
    # app's max_concurrency 4 binds before the source's 5
    assert [o[0] for o in batch] == [1, 1, 0, 1, 0, 1, 0]
    assert [o[1] for o in batch if o[0] == 0] == ["tpm", "tpm", "app_concurrency"]
    assert abs(level(conn, "a", "tpm") - level(conn, "b", "tpm")) < 0.5
    assert conn.call("ZCARD", source_keys("a")[1]) == 4
    assert conn.call("ZCARD", app_keys("web_a")[0]) == 4
    for k in (source_keys("a")[1], app_keys("web_a")[0]):
        assert 0 < conn.call("PTTL", k) <= DEFAULTS["lease_ttl"] + 1002


def test_half_open_breaker_admits_one_probe_per_batch(scripts, conn):
    conn.call("HSET", source_keys("a")[0], "open_until", redis_now_ms(conn) - 1)
    ids, out = admit_many(scripts, "a", [0, 0, 0])
    assert out[0] == [1, ids[0], 1]
    assert out[1] == [0, "breaker", 0] and out[2] == [0, "breaker", 0]
    assert conn.call("HGET", source_keys("a")[0], "probe") == ids[0]


def test_all_refused_writes_nothing(scripts, conn):
    admit(scripts, "a", max_conc=1)
    _, out = admit_many(scripts, "a", [0, 0], max_conc=1, rpm=10)
    assert [o[:2] for o in out] == [[0, "concurrency"], [0, "concurrency"]]
    assert conn.call("EXISTS", source_keys("a")[2]) == 0   # the rpm bucket: untouched


def test_unpaired_further_attempt_is_an_error_and_writes_nothing(scripts, conn):
    keys = source_keys("a")
    with pytest.raises(RedisError, match="further attempt"):
        scripts.run("admit", keys, [new_lease(), 0, 10000, 10, 60000, 0, 60000, 0, 86400000, 0,
                                    new_lease()])
    assert conn.call("EXISTS", *keys) == 0


def release_many(s, src, items, groups=(), **kw):
    """One release.lua for items [(lease, verdict, est, used), ...]."""
    c = dict(DEFAULTS, **kw)
    keys, args = list(source_keys(src)), []
    for gk, gc, _ in groups:
        keys += gk
        args += [gc["tpm"], gc["tpm_win"], gc["daily"], gc["daily_win"]]
    (lease, verdict, est, used), rest = items[0], items[1:]
    for it in rest:
        args += list(it)
    r = s.run("release", keys,
              [lease, verdict, est, used, c["tpm"], c["tpm_win"], c["daily"], c["daily_win"],
               c["failures"], c["cooldown"], c["max_cooldown"]] + args)
    assert len(r) == 3 * len(items), r
    return [r[i:i + 3] for i in range(0, len(r), 3)]


def test_releases_in_one_batch_answer_as_one_by_one(scripts, conn):
    """Five releases in one script, against the same five one by one on
    another source: the same replies, leases, reconciled bucket and breaker
    (3 failures in a row open it once; the success after is a straggler's)."""
    kw = dict(max_conc=10, tpm=1000, tpm_win=60000, failures=3, cooldown=5000,
              max_cooldown=20000)
    verdicts = ["failure", "failure", "neutral", "failure", "success"]
    useds = [50, 10, -1, 200, 0]
    replies = {}
    for src in ("a", "b"):
        leases = [admit(scripts, src, est=20, **kw)[1] for _ in verdicts]
        items = [(l, v, 20, u) for l, v, u in zip(leases, verdicts, useds)]
        if src == "a":
            replies[src] = release_many(scripts, src, items, **kw)
        else:
            replies[src] = [release_many(scripts, src, [it], **kw)[0] for it in items]
    assert replies["a"] == replies["b"]
    assert [r[1] for r in replies["a"]] == ["closed", "closed", "closed", "open", "open"]
    assert [r[0] for r in replies["a"]] == [1] * 5
    for src in ("a", "b"):
        assert conn.call("ZCARD", source_keys(src)[1]) == 0
        assert conn.call("HGET", source_keys(src)[0], "opened") == "1"
    ha, hb = (dict(zip(*[iter(conn.call("HGETALL", source_keys(s)[0]))] * 2)) for s in "ab")
    assert ha.keys() == hb.keys()
    assert ha["consec"] == hb["consec"] == "0" and ha["cooldown"] == hb["cooldown"] == "5000"
    assert abs(float(ha["open_until"]) - float(hb["open_until"])) < 1000
    assert abs(level(conn, "a", "tpm") - level(conn, "b", "tpm")) < 0.5
    assert 0 < conn.call("PTTL", source_keys("a")[0]) and 0 < conn.call("PTTL", source_keys("a")[3])


def test_release_batch_with_a_bad_verdict_writes_nothing(scripts, conn):
    lease = admit(scripts, "a", max_conc=10)[1]
    with pytest.raises(RedisError, match="verdict"):
        release_many(scripts, "a", [(lease, "success", 0, -1), (new_lease(), "maybe", 0, -1)])
    assert conn.call("ZSCORE", source_keys("a")[1], lease) is not None

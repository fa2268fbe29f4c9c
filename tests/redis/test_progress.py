"""progress.lua: mark / age on Redis' clock, key TTL."""
import time

from redis_support import scope_key
from redis_args import progress, redis_now_ms


def test_never_marked_reads_minus_one(scripts):
    assert progress(scripts, "s", "age") == -1


def test_mark_and_age(scripts, conn):
    t = progress(scripts, "s", "mark")
    assert abs(t - redis_now_ms(conn)) < 50
    assert 0 <= progress(scripts, "s", "age") < 50
    time.sleep(0.1)
    assert 95 <= progress(scripts, "s", "age") < 250
    assert progress(scripts, "other", "age") == -1
    progress(scripts, "s", "mark")                  # a new mark resets the age
    assert progress(scripts, "s", "age") < 50


def test_key_ttl_default_one_hour(scripts, conn):
    progress(scripts, "s", "mark")
    assert 3590000 < conn.call("PTTL", scope_key("s")) <= 3600000


def test_expired_key_reads_as_never(scripts, conn):
    progress(scripts, "s", "mark", ttl=80)
    assert progress(scripts, "s", "age") >= 0
    time.sleep(0.15)
    assert progress(scripts, "s", "age") == -1
    assert conn.call("EXISTS", scope_key("s")) == 0

"""The scripts on a real Redis Cluster (3 primaries, a replica each:
redis_cluster.py), and the cluster harness itself.

A cluster runs a script only when all its KEYS hash to one slot, on the
primary that owns that slot (else CROSSSLOT, MOVED or ASK). Every script
call the backend makes (sidecar/backend/backend_redis.c builds the keys,
redis_args.py here the same ones) is sent, by EVAL, to the owner of its
first key's slot and must run. The layouts that take keys under two hash
tags (a source's and an app's; budgets of an app, a source and a task run)
cannot run on a cluster with a prefix that has no tag of its own: they are
listed as such (each asserted to be refused with CROSSSLOT, so the list
stays true), and shown to run with a prefix that carries a tag (`{pgw}`),
which puts every key of a fleet in one slot.
"""
import pytest

from redis_args import APP_DEFAULTS, DEFAULTS, new_lease
from redis_cluster import ClusterError, RedisCluster, SlotMigration, slot_keys
from redis_support import RedisError, app_keys, key_slot, scope_key, script_source, source_keys, \
    task_key


@pytest.fixture(scope="module")
def cluster():
    try:
        c = RedisCluster(primaries=3, replicas=1).start()
    except ClusterError as e:
        if "not installed" in str(e):
            pytest.skip(str(e))
        raise
    yield c
    c.cleanup()


def run(cluster, name, keys, args):
    """EVAL script `name` on the primary owning keys[0]'s slot."""
    node = cluster.owner(key_slot(keys[0]))
    return node.call("EVAL", script_source(name), len(keys), *keys, *args, timeout=5)


def source_admit_args(lease):
    c = DEFAULTS
    return [lease, 10, c["lease_ttl"], 100, 60000, 0, 60000, 0, 86400000, 1]


def group_args(label):
    g = APP_DEFAULTS
    return [label, 10, 100, g["rpm_win"], 0, g["tpm_win"], 0, g["daily_win"]]


def release_args(lease, groups):
    c = DEFAULTS
    return [lease, "success", 1, 1, 0, 60000, 0, 86400000, c["failures"], c["cooldown"],
            c["max_cooldown"]] + [0, 60000, 0, 86400000] * groups


def budget_args(n):
    return ["reserve", 1, "nan"] + [0, 0, 0, 0] * n


def calls(prefix):
    """(what, script, keys, args, two_tags): every kind of script call the
    backend makes, with `prefix`."""
    src = source_keys("a", prefix)
    web, cap = app_keys("web", None, prefix), app_keys("web", "chat", prefix)
    out = []
    lease = new_lease()
    out.append(("admit: source", "admit", src, source_admit_args(lease), False))
    out.append(("release: source", "release", src, release_args(lease, 0), False))
    out.append(("renew: source leases", "renew", [src[1]], [10000, lease], False))
    out.append(("renew: app leases", "renew", [web[0]], [10000, lease], False))
    lease = new_lease()
    out.append(("admit: source + app", "admit", src + web,
                source_admit_args(lease) + group_args("app"), True))
    out.append(("release: source + app", "release", src + web, release_args(lease, 1), True))
    lease = new_lease()
    out.append(("admit: source + app + app on capability", "admit", src + web + cap,
                source_admit_args(lease) + group_args("app") + group_args("app_cap"), True))
    out.append(("progress: mark", "progress", [scope_key("s", prefix)], ["mark"], False))
    out.append(("task: start", "task", [task_key("t1", prefix)],
                ["start", "t1", 60, "", 0, "%s:task-end" % prefix], False))
    budgets = ["{%s:app:web}:budget" % prefix, "{%s:source:a}:budget" % prefix,
               "{%s:task:t1}:budget:1" % prefix]
    for i, k in enumerate(budgets):
        out.append(("budget: one key (%s)" % k.split(":")[1], "budget", [k], budget_args(1),
                    False))
    out.append(("budget: app + source + task run", "budget", budgets, budget_args(3), True))
    return out


CASES = calls("pgw")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_cluster__every_script_call_runs_on_its_slots_primary(cluster, case):
    what, name, keys, args, two_tags = case
    slots = {key_slot(k) for k in keys}
    if two_tags:
        assert len(slots) == 2 or len(slots) == 3, (what, slots)
        with pytest.raises(RedisError, match="CROSSSLOT"):
            run(cluster, name, keys, args)
        return
    assert len(slots) == 1, "%s: KEYS span slots %r" % (what, slots)
    reply = run(cluster, name, keys, args)
    assert reply is not None and reply != [], (what, reply)


TAGGED = calls("{pgw}")


@pytest.mark.parametrize("case", TAGGED, ids=[c[0] for c in TAGGED])
def test_cluster__a_tagged_prefix_puts_every_call_in_one_slot(cluster, case):
    what, name, keys, args, _ = case
    assert len({key_slot(k) for k in keys}) == 1, what
    reply = run(cluster, name, keys, args)
    assert reply is not None and reply != [], (what, reply)


def test_cluster__a_source_is_admitted_on_its_primary_only(cluster):
    """admit.lua sent to a primary that does not own the slot is MOVED there."""
    keys = source_keys("elsewhere", "pgw")
    owner = cluster.owner(key_slot(keys[0]))
    other = next(p for p in cluster.primaries() if p is not owner)
    with pytest.raises(RedisError, match=r"^MOVED %d 127\.0\.0\.1:%d$"
                       % (key_slot(keys[0]), owner.port)):
        other.call("EVAL", script_source("admit"), len(keys), *keys,
                   *source_admit_args(new_lease()))
    r = run(cluster, "admit", keys, source_admit_args(new_lease()))
    assert r[0] == 1, r


def test_cluster__harness_migration_answers_ask_then_moved(cluster):
    """What the integration tests build on (SlotMigration): after begin()
    and move(), the old primary answers ASK for the moved keys (the new one
    runs them after ASKING), a script over keys split between the two gets
    TRYAGAIN from the old one and from the new one (after ASKING), and
    after finish() the old primary answers MOVED."""
    slot = key_slot("{pgw:source:migr}")
    src = cluster.owner(slot)
    dst = next(p for p in cluster.primaries() if p is not src)
    keys = source_keys("migr", "pgw")
    assert {key_slot(k) for k in keys} == {slot}
    r = run(cluster, "admit", keys, source_admit_args(new_lease()))
    assert r[0] == 1, r
    src.call("HSET", keys[0], "consec", 0)
    m = SlotMigration(cluster, slot, src, dst)
    m.begin()
    try:
        m.move([keys[1]])   # the leases move, the rpm bucket and the breaker stay
        with pytest.raises(RedisError, match="^TRYAGAIN"):
            src.call("EVAL", script_source("admit"), len(keys), *keys,
                     *source_admit_args(new_lease()))
        with pytest.raises(RedisError, match=r"^ASK %d 127\.0\.0\.1:%d$" % (slot, dst.port)):
            src.call("ZCARD", keys[1])
        c = dst.client()
        try:
            assert c.call("ASKING") == "OK"
            assert c.call("ZCARD", keys[1]) == 1
            # a script of several keys, not all of them there yet: TRYAGAIN
            assert c.call("ASKING") == "OK"
            with pytest.raises(RedisError, match="^TRYAGAIN"):
                c.call("EVAL", script_source("admit"), len(keys), *keys,
                       *source_admit_args(new_lease()))
        finally:
            c.close()
    finally:
        m.finish()
    assert m.moved >= 3
    with pytest.raises(RedisError, match=r"^MOVED %d 127\.0\.0\.1:%d$" % (slot, dst.port)):
        src.call("ZCARD", keys[1])
    assert dst.call("ZCARD", keys[1]) == 1
    r = run(cluster, "admit", keys, source_admit_args(new_lease()))
    assert r[0] == 1 and dst.call("ZCARD", keys[1]) == 2, r


def test_cluster__slot_keys_finds_tags_of_a_slot():
    tags = slot_keys(1234, "t", 2)
    assert len(set(tags)) == 2 and all(key_slot(t) == 1234 for t in tags)

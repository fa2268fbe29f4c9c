"""The Redis Cluster client (sidecar/backend/redis_cluster.c) end to end, on
real redis-servers: start-up refusals for a backend of the wrong kind, and
on a small real cluster (three primaries, slots assigned by hand, no
replicas) calls routed by slot, MOVED and ASK followed during a real slot
migration, per-node script caches, the task-stop channel heard across nodes
with the subscriber moving off a killed node, and one command timeout over
every hop of a redirection.

The full cluster harness (primaries and replicas, fail-over) is in
test_redis_cluster.py; this file keeps to what the client itself decides.
"""
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from redis_fixture import (FleetRedis, chat, fleet_config, free_port, source, stats,  # noqa: E402
                           unique_prefix, wait_backend, wait_until)
from test_redis_fleet import call  # noqa: E402

NO_PROXY = {"no_proxy": "*", "NO_PROXY": "*"}
CLUSTER_ARGS = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "2000"]


class MiniCluster:
    """n cluster-enabled redis-servers, slots split in n ranges, met."""

    def __init__(self, n=3):
        self.nodes = []
        try:
            for _ in range(n):
                self.nodes.append(FleetRedis(extra=CLUSTER_ARGS).start())
            step = 16384 // n
            for i, node in enumerate(self.nodes):
                hi = 16383 if i == n - 1 else (i + 1) * step - 1
                self.call(i, "CLUSTER", "ADDSLOTSRANGE", i * step, hi)
            for node in self.nodes[1:]:
                self.call(0, "CLUSTER", "MEET", "127.0.0.1", node.port)
            ok = wait_until(lambda: all(
                "cluster_state:ok" in self.call(i, "CLUSTER", "INFO")
                and len(self.call(i, "CLUSTER", "NODES").strip().splitlines()) == n
                for i in range(n)), 15, interval=0.1)
            assert ok, "the cluster did not form"
            self.ids = [self.call(i, "CLUSTER", "MYID") for i in range(n)]
        except BaseException:
            self.cleanup()
            raise

    def call(self, i, *args):
        c = self.nodes[i].client()
        try:
            return c.call(*args)
        finally:
            c.close()

    def owner(self, key):
        """(slot, index of the node that owns it) of `key`."""
        slot = self.call(0, "CLUSTER", "KEYSLOT", key)
        for lo, hi, primary, *_ in self.call(0, "CLUSTER", "SLOTS"):
            if lo <= slot <= hi:
                return slot, self.port_index(primary[1])
        raise AssertionError("slot %d has no owner" % slot)

    def migrate_keys(self, slot, src, dst):
        """Slot `slot` MIGRATING from node src to dst, its keys moved (the
        slot still src's: src answers ASK for them)."""
        self.call(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", self.ids[src])
        self.call(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", self.ids[dst])
        keys = self.call(src, "CLUSTER", "GETKEYSINSLOT", slot, 1000)
        if keys:
            self.call(src, "MIGRATE", "127.0.0.1", self.nodes[dst].port, "", 0, 5000,
                      "KEYS", *keys)

    def give_slot(self, slot, dst):
        """The end of a migration: every node learns that dst owns `slot`."""
        for i in range(len(self.nodes)):
            self.call(i, "CLUSTER", "SETSLOT", slot, "NODE", self.ids[dst])

    def port_index(self, port):
        return [n.port for n in self.nodes].index(port)

    def seeds(self, k=1):
        return ["127.0.0.1:%d" % n.port for n in self.nodes[:k]]

    def cleanup(self):
        for n in self.nodes:
            n.cleanup()


@pytest.fixture
def cluster():
    c = MiniCluster()
    yield c
    c.cleanup()


def start_fails(make_sidecar, cfg, subdir):
    sc = make_sidecar(config_text=cfg, subdir=subdir, start=False, env=NO_PROXY)
    sc.start(wait=False)
    rc = sc.proc.wait(timeout=10)
    sc.returncode = rc
    sc.expected_rc = rc
    assert rc != 0, "polygw started:\n" + sc.logs()
    return sc.logs()


def test_cluster__url_pointing_at_a_cluster_node_stops_the_start(up, make_sidecar):
    """backend.url names a node with cluster_enabled:1: the sidecar does not
    start (it would count per node), and says to use backend.cluster."""
    node = FleetRedis(extra=CLUSTER_ARGS).start()
    try:
        cfg = fleet_config(node.url(), unique_prefix(), [source("a", "chat", up.url)])
        logs = start_fails(make_sidecar, cfg, "url")
        assert "backend.cluster" in logs and "cluster_enabled:1" in logs, logs[-2000:]
    finally:
        node.cleanup()


def test_cluster__seed_without_cluster_support_stops_the_start(up, make_sidecar):
    """backend.cluster names a plain redis-server: the start stops with the
    reason (its CLUSTER SLOTS answer: cluster support disabled)."""
    node = FleetRedis().start()
    try:
        cfg = fleet_config(None, unique_prefix(), [source("a", "chat", up.url)],
                           backend={"cluster": ["127.0.0.1:%d" % node.port]})
        logs = start_fails(make_sidecar, cfg, "seed")
        assert "not a cluster node" in logs and "backend.url" in logs, logs[-2000:]
    finally:
        node.cleanup()


def test_cluster__app_limits_across_slots_stop_the_start(up, make_sidecar):
    """An app with limits of its own and a prefix without a hash tag: its keys
    and the source's are in different slots, so the start stops, naming both
    and the fix. (No server needed: refused before connecting.)"""
    cfg = fleet_config(None, "pgwt", [source("a", "chat", up.url)],
                       backend={"cluster": ["127.0.0.1:1"]})
    cfg += "apps:\n  - {name: batch, max_concurrency: 2}\n"
    logs = start_fails(make_sidecar, cfg, "applimits")
    assert "app 'batch'" in logs and "source 'a'" in logs and "hash tag" in logs, logs[-2000:]


def test_cluster__calls_follow_moved_and_ask_during_a_slot_migration(cluster, up, make_sidecar):
    """Three primaries. Calls succeed and the source's keys live on the node
    that owns their slot. A task's slot is then migrated by hand, as
    redis-cli --cluster reshard does: while MIGRATING / IMPORTING with its key
    moved, the old owner answers ASK, followed (ASKING + task.lua on the new
    node, the map unchanged); after SETSLOT NODE it answers MOVED, followed
    (the slot re-pointed, the map re-read). The source's slot is migrated the
    same way: admissions follow the MOVED. Every call answers; the stats
    count both redirections."""
    prefix = unique_prefix()
    # An rpm bucket (never reached) keeps a key of the source's in Redis.
    cfg = fleet_config(None, prefix,
                       [source("a", "chat", up.url, limits={"rpm": 1000, "window_s": 60})],
                       backend={"cluster": cluster.seeds(2), "command_timeout_s": 1})
    sc = make_sidecar(config_text=cfg, subdir="sc", env=NO_PROXY)
    b = wait_backend(sc)
    assert b["mode"] == "cluster" and b["slots_covered"] == 16384, b
    assert sum(1 for n in b["nodes"] if n["primary"] and n["up"]) == 3, b["nodes"]
    err, res, _ = call(sc, chat())
    assert err is None and res["source"] == "a", err
    tag = "%s:source:a" % prefix
    slot, src = cluster.owner("{%s}" % tag)
    keys = cluster.call(src, "CLUSTER", "GETKEYSINSLOT", slot, 100)
    assert any(k.startswith("{%s}" % tag) for k in keys), keys

    c = sc.connect(timeout=5)
    try:
        err, t = c.request("task.start", {"task_id": "mig"}, timeout=5)
        assert err is None and t["state"] == "running", err
        tslot, tsrc = cluster.owner("{%s:task:mig}" % prefix)
        tdst = (tsrc + 1) % 3
        cluster.migrate_keys(tslot, tsrc, tdst)
        err, t = c.request("task.get", {"task_id": "mig"}, timeout=5)
        assert err is None and t["state"] == "running", err
        assert stats(sc)["backend"]["ask"] >= 1, stats(sc)["backend"]
        assert stats(sc)["backend"]["moved"] == 0, stats(sc)["backend"]
        cluster.give_slot(tslot, tdst)
        err, t = c.request("task.get", {"task_id": "mig"}, timeout=5)
        assert err is None and t["state"] == "running", err
        assert stats(sc)["backend"]["moved"] >= 1, stats(sc)["backend"]
    finally:
        c.close()

    dst = (src + 1) % 3
    cluster.migrate_keys(slot, src, dst)
    cluster.give_slot(slot, dst)
    for _ in range(3):
        err, res, _ = call(sc, chat())
        assert err is None and res["source"] == "a", err
    assert wait_until(lambda: stats(sc)["backend"]["map_refreshes"] >= 2, 3), stats(sc)["backend"]

    # Each node has its own script cache: flushed on every node, the next
    # calls still work (NOSCRIPT answered by one EVAL on that node).
    for i in range(3):
        cluster.call(i, "SCRIPT", "FLUSH")
    for _ in range(2):
        err, res, _ = call(sc, chat())
        assert err is None and res["source"] == "a", err
    assert stats(sc)["backend"]["noscript_reloads"] >= 1, stats(sc)["backend"]
    assert up.stats()["requests"] == 6


def test_cluster__task_stop_heard_across_nodes_and_subscriber_moves(cluster, up, make_sidecar):
    """The task-end channel is subscribed on one primary: a stop sent through
    a second sidecar (task.lua on the task key's node, PUBLISH broadcast)
    ends the first one's task. Then the subscriber's node is killed (not the
    one the data lives on: the prefix has a hash tag, all keys in one slot):
    the backend is down and says which primary it misses, calls fail closed,
    and the subscriber moves to another primary; with the node back, calls
    succeed again."""
    for attempt in range(8):   # a prefix whose slot is not on the subscriber's node
        prefix = "{%s}" % unique_prefix()
        cfg = fleet_config(None, prefix, [source("a", "chat", up.url)],
                           backend={"cluster": cluster.seeds(3), "command_timeout_s": 0.5})
        sc1 = make_sidecar(config_text=cfg, subdir="sc1-%d" % attempt, env=NO_PROXY)
        first = wait_backend(sc1)["subscriber"]
        slot, owner = cluster.owner(prefix)
        if first != "127.0.0.1:%d" % cluster.nodes[owner].port:
            break
        sc1.stop()
    sub = cluster.port_index(int(first.rsplit(":", 1)[1]))
    sc2 = make_sidecar(config_text=cfg, subdir="sc2", env=NO_PROXY)
    wait_backend(sc2)
    c1 = sc1.connect(timeout=5)
    c2 = sc2.connect(timeout=5)
    try:
        err, res = c1.request("task.start", {"task_id": "t1"}, timeout=5)
        assert err is None, err
        err, res = c2.request("task.stop", {"task_id": "t1", "reason": "enough"}, timeout=5)
        assert err is None, err

        def ended():
            e, r = c1.request("task.get", {"task_id": "t1"}, timeout=5)
            return r if e is None and r.get("state") != "running" else None
        assert wait_until(ended, 3, interval=0.05), c1.request("task.get", {"task_id": "t1"})
    finally:
        c1.close()
        c2.close()

    assert stats(sc1)["backend"]["subscriber"] == first, stats(sc1)["backend"]
    cluster.nodes[sub].kill()
    assert wait_until(lambda: stats(sc1)["backend"]["state"] == "down", 5), stats(sc1)["backend"]
    b = stats(sc1)["backend"]
    assert "not connected" in b["down_reason"] and first in b["down_reason"], b
    err, res, _ = call(sc1, chat())
    assert res is None and err["code"] == "backend_unavailable", err
    moved = wait_until(lambda: stats(sc1)["backend"]["subscribed"]
                       and stats(sc1)["backend"]["subscriber"] != first, 8)
    assert moved, stats(sc1)["backend"]
    cluster.nodes[sub].restart()
    assert wait_until(lambda: stats(sc1)["backend"]["state"] == "up", 10), stats(sc1)["backend"]
    # The nodes may still say CLUSTERDOWN for a moment (cluster_state:fail
    # until they see the node again): calls fail closed until they do.
    assert wait_until(lambda: all("cluster_state:ok" in cluster.call(i, "CLUSTER", "INFO")
                                  for i in range(3)), 10)
    err, res, _ = call(sc1, chat())
    assert err is None and res["source"] == "a", err


def test_cluster__redirection_to_a_frozen_node_answers_within_command_timeout(
        cluster, up, make_sidecar):
    """One timer covers every hop of a command. The source's slot is handed
    to another node (SETSLOT NODE everywhere) which is then frozen
    (SIGSTOP): the old owner answers MOVED, the admission is sent again to
    the frozen node and never answered there. The call still fails closed,
    `backend_unavailable`, within command_timeout_s of its start (not two of
    them, one per hop); with the node thawed, calls succeed again."""
    ct = 0.5
    prefix = unique_prefix()
    cfg = fleet_config(None, prefix,
                       [source("a", "chat", up.url, limits={"rpm": 1000, "window_s": 60})],
                       backend={"cluster": cluster.seeds(3), "command_timeout_s": ct})
    sc = make_sidecar(config_text=cfg, subdir="sc", env=NO_PROXY)
    wait_backend(sc)
    err, res, _ = call(sc, chat())
    assert err is None and res["source"] == "a", err
    slot, src = cluster.owner("{%s:source:a}" % prefix)
    dst = (src + 1) % 3
    cluster.migrate_keys(slot, src, dst)
    cluster.give_slot(slot, dst)
    cluster.nodes[dst].freeze()
    try:
        t0 = time.monotonic()
        err, res, _ = call(sc, chat())
        elapsed = time.monotonic() - t0
        print("timing: redirected to a frozen node, answered after %.3fs (ct %.1fs)"
              % (elapsed, ct))
        assert res is None and err["code"] == "backend_unavailable", err
        assert elapsed <= ct + 0.3, elapsed
        assert stats(sc)["backend"]["moved"] >= 1, stats(sc)["backend"]
    finally:
        cluster.nodes[dst].thaw()
    assert wait_until(lambda: all("cluster_state:ok" in cluster.call(i, "CLUSTER", "INFO")
                                  for i in range(3)), 10)
    assert wait_until(lambda: stats(sc)["backend"]["state"] == "up", 10), stats(sc)["backend"]
    ok = wait_until(lambda: call(sc, chat())[0] is None, 5, interval=0.2)
    assert ok, call(sc, chat())


def test_cluster__cache_purge_walks_every_primary(cluster, up, make_sidecar):
    """The shared cache tier on a cluster: each entry is a slot of its own,
    spread over the primaries. A purge (polygwctl cache purge) walks every
    primary's keys (SCAN is per node) and unlinks each entry: the count it
    answers is all of them, and no entry is left on any node."""
    from types import SimpleNamespace
    from test_redis_cache_purge import TOK, ask, ctl, purge_cfg
    prefix = unique_prefix()
    nothing = SimpleNamespace(url=lambda: None)
    sc = make_sidecar(config_text=purge_cfg(nothing, up, prefix, free_port(),
                                            backend={"cluster": cluster.seeds(1)}),
                      subdir="sc", env=dict(NO_PROXY, PGW_TOK_O=TOK["ops"],
                                            PGW_TOK_A=TOK["alpha"]))
    wait_backend(sc)
    n = 12
    for i in range(n):
        assert ask(sc, "embedding", "text %d" % i, "ops") == "miss"

    def entries():
        found = []
        for i in range(3):
            found += [k for k in cluster.call(i, "KEYS", "{%s:cache:*" % prefix)
                      if not k.endswith(":lock")]
        return found
    assert wait_until(lambda: len(entries()) == n, 3), entries()
    holders = sum(1 for i in range(3) if cluster.call(i, "KEYS", "{%s:cache:*" % prefix))
    assert holders >= 2, "the entries did not spread over the primaries"
    p = ctl(sc, "cache", "purge")
    assert p.returncode == 0 and "purged_shared=%d" % n in p.stdout.split(), p
    assert entries() == []

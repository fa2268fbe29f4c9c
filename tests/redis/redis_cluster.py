"""A real Redis Cluster on loopback for the tests and the bench: N primaries
with one replica each (`redis-server --cluster-enabled yes`, joined by
`redis-cli --cluster create`), each node on a free 127.0.0.1 port with its
own directory under one temp dir, no persistence.

Besides start and cleanup, the helpers a test interleaves with load:

- kill_primary(): SIGKILL a primary and wait until its replica is promoted
  and every live node says cluster_state:ok; restart() brings the dead node
  back (it rejoins as a replica of the promoted one).
- SlotMigration: move one slot from a primary to another in the steps
  Redis' own resharding uses (SETSLOT IMPORTING / MIGRATING, MIGRATE … KEYS,
  SETSLOT … NODE), so that clients meet `ASK` between the steps and `MOVED`
  after them.
- freeze() / thaw(): SIGSTOP / SIGCONT every node (a cluster that answers
  nothing, connections kept open: a partition as a client sees it).

Standard library only (Debian's /usr/bin/python3). Every wait is bounded;
cleanup() SIGKILLs every node and removes the directory whatever happened.
"""
import os
import shutil
import signal
import subprocess
import tempfile
import time

from redis_support import RedisError, Resp, free_port, key_slot, wait_until


class ClusterError(RuntimeError):
    pass


def wait_for(pred, timeout, interval=0.05, what="condition"):
    """wait_until(), raising ClusterError when pred() never held."""
    v = wait_until(pred, timeout, interval)
    if not v:
        raise ClusterError("timed out after %.1fs waiting for %s" % (timeout, what))
    return v


class Node:
    """One redis-server of the cluster: its port, directory and process."""

    def __init__(self, base, port, node_timeout_ms, password=None):
        self.port = port
        self.password = password
        self.bus_port = free_port()   # not port + 10000: that may be above 65535
        self.dir = os.path.join(base, str(port))
        os.makedirs(self.dir, exist_ok=True)
        self.node_timeout_ms = node_timeout_ms
        self.proc = None
        self.frozen = False

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def spawn(self):
        log = open(os.path.join(self.dir, "redis.log"), "a")
        try:
            self.proc = subprocess.Popen(
                [shutil.which("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
                 "--cluster-enabled", "yes", "--cluster-port", str(self.bus_port),
                 "--cluster-config-file", "nodes.conf",
                 "--cluster-node-timeout", str(self.node_timeout_ms), "--save", "",
                 "--appendonly", "no", "--repl-diskless-sync-delay", "0", "--daemonize", "no",
                 "--dir", self.dir] +
                (["--requirepass", self.password, "--masterauth", self.password]
                 if self.password else []),
                stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
        finally:
            log.close()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def client(self, timeout=2.0):
        c = Resp(self.port, timeout=timeout)
        if self.password:
            try:
                c.call("AUTH", self.password)
            except BaseException:
                c.close()
                raise
        return c

    def call(self, *args, timeout=2.0):
        c = self.client(timeout)
        try:
            return c.call(*args)
        finally:
            c.close()

    def try_call(self, *args, timeout=1.0):
        """call(), or None when the node does not answer."""
        try:
            return self.call(*args, timeout=timeout)
        except (OSError, RedisError):
            return None

    def info(self, section):
        text = self.call("INFO", section) or ""
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def cluster_info(self):
        text = self.try_call("CLUSTER", "INFO")
        if not text:
            return {}
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def signal(self, sig):
        if self.alive():
            self.proc.send_signal(sig)

    def kill(self):
        if self.alive():
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)
        self.frozen = False

    def logs(self):
        try:
            with open(os.path.join(self.dir, "redis.log")) as f:
                return f.read()
        except OSError:
            return ""


def parse_nodes(text):
    """CLUSTER NODES -> list of dicts: id, port, flags (set), master (id or
    None), slots (list of (first, last)), connected (bool)."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 8:
            continue
        addr = f[1].split("@")[0]
        slots = []
        for s in f[8:]:
            if s.startswith("["):
                continue   # a slot being imported or migrated
            a, _, b = s.partition("-")
            slots.append((int(a), int(b or a)))
        out.append({"id": f[0], "port": int(addr.rsplit(":", 1)[1]),
                    "flags": set(f[2].split(",")), "master": None if f[3] == "-" else f[3],
                    "slots": slots, "connected": f[7] == "connected"})
    return out


class RedisCluster:
    """`primaries` primaries with `replicas` replica(s) each; `password`:
    every node wants it (requirepass, and masterauth for the replicas)."""

    def __init__(self, primaries=3, replicas=1, node_timeout_ms=1000, password=None):
        self.password = password
        self.n = primaries * (1 + replicas)
        self.primaries_n = primaries
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.dir = tempfile.mkdtemp(prefix="pgw-cluster-")
        self.nodes = []

    # ------------------------------------------------------------ life
    def start(self, timeout=30.0):
        for exe in ("redis-server", "redis-cli"):
            if not shutil.which(exe):
                raise ClusterError("%s not installed (make deps installs redis-server and "
                                   "redis-tools)" % exe)
        try:
            for _ in range(self.n):
                self.nodes.append(self._new_node())
            r = subprocess.run(
                [shutil.which("redis-cli"), "--cluster", "create"] +
                [n.address for n in self.nodes] +
                ["--cluster-replicas", str(self.replicas), "--cluster-yes"] +
                (["-a", self.password, "--no-auth-warning"] if self.password else []),
                capture_output=True, text=True, timeout=timeout)
            if r.returncode != 0:
                raise ClusterError("redis-cli --cluster create failed:\n%s%s"
                                   % (r.stdout[-2000:], r.stderr[-2000:]))
            self.wait_ok(timeout)
            return self
        except BaseException:
            self.cleanup()
            raise

    def _new_node(self):
        """A node started on a free port and bus port (not one another node
        has: a port just freed may be handed out again); another pair of
        ports when it does not answer PING (a port taken meanwhile)."""
        used = {p for n in self.nodes for p in (n.port, n.bus_port)}
        log = ""
        for _ in range(5):
            n = Node(self.dir, free_port(), self.node_timeout_ms, self.password)
            if n.port in used or n.bus_port in used or n.port == n.bus_port:
                continue
            n.spawn()
            try:
                wait_for(lambda: n.try_call("PING") == "PONG" or not n.alive(), 5, 0.02,
                         "redis-server on port %d" % n.port)
            except ClusterError:
                pass
            if n.alive() and n.try_call("PING") == "PONG":
                return n
            n.kill()
            log = n.logs()[-1000:] or log
            shutil.rmtree(n.dir, ignore_errors=True)
        raise ClusterError("a cluster node did not start on 5 pairs of ports:\n%s" % log)

    def cleanup(self):
        for n in self.nodes:
            n.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def live(self):
        return [n for n in self.nodes if n.alive() and not n.frozen]

    def node(self, port):
        return next(n for n in self.nodes if n.port == port)

    def wait_ok(self, timeout=15.0):
        """Every live node says cluster_state:ok, all 16384 slots served, the
        same primaries, and each replica's link up (what a failover needs)."""
        def ok():
            views = []
            for n in self.live():
                ci = n.cluster_info()
                if ci.get("cluster_state") != "ok" or ci.get("cluster_slots_ok") != "16384":
                    return False
                views.append(tuple(sorted(m["port"] for m in self._view(n)
                                          if "master" in m["flags"] and m["slots"])))
            if len(set(views)) != 1:
                return False
            for r in self.replica_nodes():
                if r.info("replication").get("master_link_status") != "up":
                    return False
            return True
        wait_for(ok, timeout, 0.05, "cluster_state:ok on every node")

    # ------------------------------------------------------------ topology
    def _view(self, via=None):
        for n in ([via] if via else self.live()):
            text = n.try_call("CLUSTER", "NODES")
            if text:
                return parse_nodes(text)
        raise ClusterError("no node answers CLUSTER NODES")

    def view(self):
        return self._view()

    def primaries(self):
        """Live primaries serving slots, as Nodes, by port."""
        ports = sorted(m["port"] for m in self.view() if "master" in m["flags"] and m["slots"]
                       and "fail" not in m["flags"])
        return [self.node(p) for p in ports]

    def replica_nodes(self):
        ports = [m["port"] for m in self.view() if "slave" in m["flags"]
                 and "fail" not in m["flags"]]
        return [self.node(p) for p in ports if self.node(p).alive()]

    def node_id(self, node):
        return next(m["id"] for m in self.view() if m["port"] == node.port)

    def replica_of(self, primary):
        pid = self.node_id(primary)
        return [self.node(m["port"]) for m in self.view()
                if m["master"] == pid and "fail" not in m["flags"]]

    def owner(self, slot):
        for m in self.view():
            if "master" in m["flags"] and any(a <= slot <= b for a, b in m["slots"]):
                return self.node(m["port"])
        raise ClusterError("no primary serves slot %d" % slot)

    def owner_of_key(self, key):
        return self.owner(key_slot(key))

    def addresses(self, nodes=None):
        return [n.address for n in (nodes or self.nodes)]

    def call_key(self, key, *args):
        """A command on the primary that owns `key`'s slot."""
        return self.owner_of_key(key).call(*args)

    def flush(self):
        for p in self.primaries():
            p.call("FLUSHALL")

    # ------------------------------------------------------------ failures
    def kill_primary(self, primary, timeout=15.0):
        """SIGKILL `primary`; returns (replica promoted, seconds from the kill
        to its promotion as seen by itself, seconds to cluster_state:ok)."""
        replicas = self.replica_of(primary)
        if not replicas:
            raise ClusterError("primary %d has no replica to promote" % primary.port)
        t0 = time.monotonic()
        primary.kill()
        promoted = wait_for(
            lambda: next((r for r in replicas
                          if (r.try_call("ROLE") or [""])[0] == "master"), None),
            timeout, 0.02, "a replica of %d to be promoted" % primary.port)
        t_promoted = time.monotonic() - t0
        self.wait_ok(timeout)
        return promoted, t_promoted, time.monotonic() - t0

    def restart(self, node, timeout=15.0):
        """Starts a killed node again on its port with its nodes.conf: it
        rejoins the cluster (a replica when its slots have moved on)."""
        assert not node.alive(), "restart() after kill()"
        node.spawn()
        wait_for(lambda: node.try_call("PING") == "PONG", 5, 0.02, "node %d" % node.port)
        self.wait_ok(timeout)
        return node

    def freeze(self):
        """SIGSTOP every node: nothing answers, connections stay open."""
        for n in self.nodes:
            if n.alive():
                n.signal(signal.SIGSTOP)
                n.frozen = True

    def thaw(self, timeout=15.0):
        for n in self.nodes:
            if n.alive():
                n.signal(signal.SIGCONT)
                n.frozen = False
        self.wait_ok(timeout)

    def commandstats(self, node):
        """INFO commandstats of `node`: {command: (calls, usec)}."""
        out = {}
        for line in node.call("INFO", "commandstats").splitlines():
            if line.startswith("cmdstat_"):
                name, _, rest = line.partition(":")
                kv = dict(x.split("=", 1) for x in rest.split(","))
                out[name[8:]] = (int(kv["calls"]), int(kv["usec"]))
        return out


class SlotMigration:
    """Moves `slot` from primary `src` to primary `dst`, step by step:

        m = SlotMigration(cluster, slot, src, dst)
        m.begin()          # dst IMPORTING, src MIGRATING: a key already
                           # moved is answered `ASK dst` by src
        m.move(keys)       # MIGRATE those keys (all of the slot's: None)
        m.finish()         # SETSLOT NODE dst on every primary: `MOVED`

    Meanwhile a script whose keys are split between the two gets TRYAGAIN
    from the old primary, and one of several keys sent to the new one
    (after ASKING) gets TRYAGAIN unless every key is there."""

    def __init__(self, cluster, slot, src, dst):
        self.c, self.slot, self.src, self.dst = cluster, slot, src, dst
        self.moved = 0

    def begin(self):
        self.dst.call("CLUSTER", "SETSLOT", self.slot, "IMPORTING", self.c.node_id(self.src))
        self.src.call("CLUSTER", "SETSLOT", self.slot, "MIGRATING", self.c.node_id(self.dst))

    def move(self, keys=None, batch=100):
        if keys is None:
            keys = []
            while True:
                got = self.src.call("CLUSTER", "GETKEYSINSLOT", self.slot, batch)
                if not got:
                    break
                self._migrate(got)
            return self.moved
        keys = list(keys)
        for i in range(0, len(keys), batch):
            self._migrate(keys[i:i + batch])
        return self.moved

    def _migrate(self, keys):
        try:
            auth = ["AUTH", self.c.password] if self.c.password else []
            r = self.src.call("MIGRATE", "127.0.0.1", self.dst.port, "", 0, 5000, "REPLACE",
                              *auth, "KEYS", *keys)
        except RedisError as e:
            raise ClusterError("MIGRATE of slot %d failed: %s" % (self.slot, e))
        if r == "OK":
            self.moved += len(keys)

    def finish(self):
        self.move()   # whatever was written to the source meanwhile
        dst_id = self.c.node_id(self.dst)
        self.dst.call("CLUSTER", "SETSLOT", self.slot, "NODE", dst_id)
        self.src.call("CLUSTER", "SETSLOT", self.slot, "NODE", dst_id)
        for p in self.c.primaries():
            if p not in (self.src, self.dst):
                p.try_call("CLUSTER", "SETSLOT", self.slot, "NODE", dst_id)
        wait_for(lambda: self.c.owner(self.slot) is self.dst, 5, 0.02,
                 "slot %d owned by %d" % (self.slot, self.dst.port))


def slot_keys(slot, prefix, n=1):
    """n distinct hash tags `prefix`… whose slot is `slot` (found by search:
    about 16384 tries per tag)."""
    out, i = [], 0
    while len(out) < n:
        t = "%s%d" % (prefix, i)
        if key_slot(t) == slot:
            out.append(t)
        i += 1
    return out

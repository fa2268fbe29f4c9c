#!/usr/bin/python3
"""Admissions on a Redis Cluster beside one primary (not a test).

Starts one redis-server and one cluster of 3 primaries (no replicas: each
primary then does what the one server does; tests/redis/redis_support.py,
tests/redis/redis_cluster.py), and runs the
same attempts against both: admit.lua then release.lua by EVALSHA, as a
sidecar sends them, over `--sources` sources (their keys under the hash tag
{P:source:N}, so the cluster spreads them over its primaries by name), one
attempt per source in turn. Every limit is set and never binds.

What it prints, per target:
- the attempts each primary ran (the spread of admissions), and each
  primary's script time in Redis (INFO commandstats, usec of evalsha);
- the implied capacity: attempts per second of script time on the busiest
  primary (the one that saturates first under this mix): for one primary,
  all attempts / its script time; for the cluster, all attempts / the
  busiest primary's script time. Their ratio is what three primaries buy
  (the target is >= 2.5x). The same from each redis-server's CPU time
  (INFO cpu, what parsing and replies cost too), which a loaded machine
  inflates less than script time (wall clock inside Redis).

Each primary is driven alone, one after another (one Python client with
`--depth` attempts in flight), so that on a small shared machine the
primaries do not slow each other's script time as separate hosts would
not; `--rounds` rounds (default 3), alternating which target goes first,
and per primary the round with the least script time counts.

    tests/bench/cluster_admit.py [--n 20000] [--sources 300] [--depth 16] [--rounds 3]

With `--build BUILD_DIR` the attempts are real calls instead: `--sidecars`
polygw sidecars (default 2) on each target in turn (`backend.url` on the
one primary, `backend.cluster` on the cluster), `--sources` sources of the
chat capability (weight 1 each, limits that never bind, one mock upstream),
driven by the bench's `loadgen` (`--clients` per sidecar, `--duration`
seconds). Printed: admitted attempts per second (the mock's requests over
the run), and per primary the scripts it ran (admit.lua and release.lua
carry up to 32 attempts each) and their time, with the implied capacity
as above. The sidecars' own CPU bounds the rate on a small machine; the
implied capacity is Redis'.

    tests/bench/cluster_admit.py --build build [--sidecars 2] [--sources 24]
                                 [--clients 16] [--duration 5]

Bounded: --n attempts (at most 200000) per target, --duration (at most
60) per target with --build, --seconds (default 120) for the whole run;
the servers are started and stopped by the script.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "redis"))
from redis_cluster import RedisCluster  # noqa: E402
from redis_support import RedisServer, Resp, key_slot, script_source, source_keys  # noqa: E402

PREFIX = "pgwbench"
BIG = 10**12


def admit_args(lease):
    return [lease, 1000000, 30000, BIG, 60000, BIG, 60000, BIG, 86400000, 100]


def release_args(lease):
    return [lease, "success", 100, 80, BIG, 60000, BIG, 86400000, 5, 30000, 300000]


def cpu_usec(conn):
    """redis-server's CPU time so far (INFO cpu: user + system), in µs."""
    kv = dict(x.split(":", 1) for x in conn.call("INFO", "cpu").splitlines() if ":" in x)
    return (float(kv["used_cpu_user"]) + float(kv["used_cpu_sys"])) * 1e6


def evalsha_usec(conn):
    for line in conn.call("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_evalsha:"):
            kv = dict(x.split("=", 1) for x in line.split(":", 1)[1].split(","))
            return int(kv["calls"]), int(kv["usec"])
    return 0, 0


class Target:
    """Per primary: a connection, the script SHAs, the sources it owns."""

    def __init__(self, port, sources):
        self.port = port
        self.conn = Resp(port, timeout=10)
        self.sha = {n: self.conn.call("SCRIPT", "LOAD", script_source(n))
                    for n in ("admit", "release")}
        self.sources = sources
        self.attempts = 0

    def reset(self):
        self.conn.call("CONFIG", "RESETSTAT")

    def drive(self, n, depth, tag):
        """n attempts, `depth` at a time pipelined on this connection: each
        batch sends its admits, reads them, then sends and reads the releases."""
        c, i = self.conn, 0
        while i < n:
            batch = []
            for _ in range(min(depth, n - i)):
                src = self.sources[(self.attempts + i) % len(self.sources)]
                lease = "%s:%d" % (tag, self.attempts + i)
                keys = source_keys(src, PREFIX)
                c.send("EVALSHA", self.sha["admit"], len(keys), *keys, *admit_args(lease))
                batch.append((keys, lease))
                i += 1
            for _ in batch:
                r = c.read()
                assert r[0] == 1, r
            for keys, lease in batch:
                c.send("EVALSHA", self.sha["release"], len(keys), *keys, *release_args(lease))
            for _ in batch:
                c.read()
        self.attempts += n


def run(targets, n, depth, tag):
    """n attempts spread over the targets in proportion to their sources,
    one target after another (each primary measured alone, as the one
    redis-server is: on a small shared machine, primaries run at once
    would slow each other's script time, which separate hosts do not);
    returns {port: (attempts, script usec, redis-server CPU usec)}."""
    total = sum(len(t.sources) for t in targets)
    share = {t.port: n * len(t.sources) // total for t in targets}
    share[targets[0].port] += n - sum(share.values())
    out = {}
    for t in targets:
        t.reset()
        cpu0 = cpu_usec(t.conn)
        t.drive(share[t.port], depth, tag)
        cpu = cpu_usec(t.conn) - cpu0
        calls, usec = evalsha_usec(t.conn)
        assert calls == 2 * share[t.port], (calls, share[t.port])
        out[t.port] = (share[t.port], usec, cpu)
    return out


def best(runs):
    """Per primary, the least script time and the least CPU time of the
    rounds (each the best of its own)."""
    return {p: (runs[0][p][0], min(r[p][1] for r in runs), min(r[p][2] for r in runs))
            for p in runs[0]}


def report(name, per, n):
    """A table row; returns the implied capacities (script time, CPU time)."""
    caps = [n / (max(x[k] for x in per.values()) / 1e6) for k in (1, 2)]
    print("| %s | %d | %s | %s | %s | %.1f | %.0f | %.0f |" % (
        name, len(per), " / ".join("%d" % x[0] for x in per.values()),
        " / ".join("%.0f" % (x[1] / 1e3) for x in per.values()),
        " / ".join("%.0f" % (x[2] / 1e3) for x in per.values()),
        sum(x[1] for x in per.values()) / n, caps[0], caps[1]))
    return caps


def sidecar_config(d, i, backend, up_url, sources):
    path = os.path.join(d, "sc%d.yaml" % i)
    src = "".join(
        "  - {name: s%d, capability: chat, base_url: \"%s\", max_concurrency: 4096,"
        " aimd: {initial: 4096, min: 4096}, breaker: {failures: 1000000}, timeout_s: 30,"
        " ttft_timeout_s: 30, limits: {rpm: 100000000, window_s: 60}}\n" % (k, up_url)
        for k in range(sources))
    with open(path, "w") as f:
        f.write('listen:\n  mode: "0600"\nserver: {log_level: warn, shutdown_grace_s: 2}\n'
                "backend: {kind: redis, prefix: %s, command_timeout_s: 1, lease_ttl_s: 30, %s}\n"
                "defaults: {stall_window_s: 3600, poll_interval_s: 0.2}\nsources:\n%s"
                % (PREFIX, backend, src))
    return path


def sidecar_run(a, build, backend, primaries, name):
    """--sidecars sidecars on `backend` (the YAML of its endpoint key), each
    driven by loadgen; returns (attempts, seconds, {port: (scripts, usec)})."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
    os.environ["POLYGW_BUILD"] = build   # the mock upstream of the same build
    from mock import MockUpstream
    from fleet_soak import start_sidecars, stop_all
    polygw, loadgen = os.path.join(build, "polygw"), os.path.join(build, "bench", "loadgen")
    d = tempfile.mkdtemp(prefix="pgw-cbench-", dir="/tmp")
    procs, gens = [], []
    try:
        with MockUpstream() as up:
            for i in range(a.sidecars):
                cfg = sidecar_config(d, i, backend, up.url, a.sources)
                chk = subprocess.run([polygw, "--check-config", cfg], capture_output=True,
                                     text=True, timeout=20)
                if chk.returncode != 0:
                    sys.exit("cluster_admit: %s: the config is refused:\n%s%s"
                             % (name, chk.stdout, chk.stderr))
            socks = start_sidecars(polygw, d, a.sidecars, procs,
                                   lambda i: os.path.join(d, "sc%d.yaml" % i), "cluster_admit")
            conns = [Resp(p, timeout=10) for p in primaries]
            for c in conns:
                c.call("CONFIG", "RESETSTAT")
            cpu0 = [cpu_usec(c) for c in conns]
            before = up.stats()["requests"]
            chat = {"model": "m", "messages": [{"role": "user", "content": "bench"}]}
            t0 = time.monotonic()
            for sock in socks:
                gens.append(subprocess.Popen(
                    [loadgen, "--socket", sock, "--clients", str(a.clients), "--duration",
                     str(a.duration), "--method", "call", "--timeout-ms", "30000",
                     "--params-json", json.dumps([{"capability": "chat", "body": chat}]),
                     "--json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
            errors = 0
            for g in gens:
                out, _ = g.communicate(timeout=a.duration + 60)
                errors += json.loads(out.decode().strip().splitlines()[-1])["errors"]
            wall = time.monotonic() - t0
            attempts = up.stats()["requests"] - before
            per = {}
            for p, c, c0 in zip(primaries, conns, cpu0):
                calls, usec = evalsha_usec(c)
                per[p] = (calls, usec, cpu_usec(c) - c0)
                c.close()
            if errors:
                print("cluster_admit: %s: %d loadgen errors" % (name, errors))
            return attempts, wall, per
    finally:
        stop_all(gens, procs)
        shutil.rmtree(d, ignore_errors=True)


def sidecar_report(name, attempts, wall, per):
    """A table row; returns the implied capacities (script time, CPU time)."""
    caps = [attempts / (max(x[k] for x in per.values()) / 1e6) for k in (1, 2)]
    print("| %s | %d | %.0f | %s | %s | %s | %.1f | %.0f | %.0f |" % (
        name, len(per), attempts / wall, " / ".join("%d" % x[0] for x in per.values()),
        " / ".join("%.0f" % (x[1] / 1e3) for x in per.values()),
        " / ".join("%.0f" % (x[2] / 1e3) for x in per.values()),
        sum(x[1] for x in per.values()) / max(1, attempts), caps[0], caps[1]))
    return caps


def main_sidecars(a, single, cluster):
    build = os.path.abspath(a.build)
    for exe in ("polygw", "bench/loadgen"):
        if not os.path.exists(os.path.join(build, exe)):
            sys.exit("cluster_admit: %s/%s missing (make all and make bench first)" % (build, exe))
    print("| target | primaries | admitted attempts/s | scripts per primary "
          "| script ms per primary | redis-server CPU ms per primary "
          "| script µs per attempt (sum) | implied capacity by script time | by CPU time |")
    print("|---|---|---|---|---|---|---|---|---|")
    n1, w1, per1 = sidecar_run(a, build, 'url: "redis://127.0.0.1:%d/0"' % single.port,
                               [single.port], "one primary")
    cap1 = sidecar_report("one primary", n1, w1, per1)
    ports = [p.port for p in cluster.primaries()]
    n3, w3, per3 = sidecar_run(a, build, "cluster: [%s]" % ", ".join(
        '"%s"' % x for x in cluster.addresses()), ports, "cluster")
    cap3 = sidecar_report("cluster", n3, w3, per3)
    total = sum(x[1] for x in per3.values())
    print()
    print("cluster: %d sources over 3 primaries, script time %s %% per primary; implied "
          "capacity %.2fx one primary's by script time, %.2fx by CPU time (target >= 2.5x)"
          % (a.sources, " / ".join("%.1f" % (100.0 * x[1] / total) for x in per3.values()),
             cap3[0] / cap1[0], cap3[1] / cap1[1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--sources", type=int, default=300)
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--build", default=None, help="real calls through sidecars of this build")
    ap.add_argument("--sidecars", type=int, default=2)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--duration", type=float, default=5)
    a = ap.parse_args()
    if a.build and "--sources" not in sys.argv:
        a.sources = 24
    if not 1 <= a.n <= 200000 or not 1 <= a.sources <= 100000 or not 1 <= a.depth <= 1000 \
            or not 1 <= a.rounds <= 10:
        ap.error("--n in 1..200000, --sources in 1..100000, --depth in 1..1000, --rounds in 1..10")
    if not 1 <= a.sidecars <= 16 or not 1 <= a.clients <= 1024 or not 0 < a.duration <= 60:
        ap.error("--sidecars in 1..16, --clients in 1..1024, --duration in (0, 60]")
    names = ["s%d" % i for i in range(a.sources)]
    # no replicas: each primary does what the one redis-server does, no more
    single, cluster = RedisServer(), RedisCluster(primaries=3, replicas=0)
    timer = threading.Timer(a.seconds, lambda: os._exit(3))   # the bound on the whole run
    timer.daemon = True
    timer.start()
    try:
        single.start()
        cluster.start()
        if a.build:
            main_sidecars(a, single, cluster)
            return 0
        one = [Target(single.port, names)]
        owners = {}
        for s in names:
            owners.setdefault(cluster.owner(key_slot(source_keys(s, PREFIX)[0])).port,
                              []).append(s)
        three = [Target(p, owners[p]) for p in sorted(owners)]
        print("| target | primaries | attempts per primary | script ms per primary "
              "| redis-server CPU ms per primary | script µs per attempt (sum) "
              "| implied capacity by script time, attempts/s | by CPU time |")
        print("|---|---|---|---|---|---|---|---|")
        run(one, min(a.n, 2000), a.depth, "warm1")
        run(three, min(a.n, 2000), a.depth, "warm3")
        runs1, runs3 = [], []
        for r in range(a.rounds):   # alternating which goes first
            pair = [(runs1, one, "one%d" % r), (runs3, three, "cluster%d" % r)]
            for runs, targets, tag in (pair if r % 2 == 0 else pair[::-1]):
                runs.append(run(targets, a.n, a.depth, tag))
        per1, per3 = best(runs1), best(runs3)
        cap1 = report("one primary", per1, a.n)
        cap3 = report("cluster", per3, a.n)
        shares = [100.0 * x[0] / a.n for x in per3.values()]
        print()
        print("cluster: %d sources over 3 primaries, admissions %s %% per primary; implied "
              "capacity %.2fx one primary's by script time, %.2fx by CPU time (target >= 2.5x; "
              "%.2fx if every attempt cost the same everywhere); best of %d rounds"
              % (a.sources, " / ".join("%.1f" % x for x in shares), cap3[0] / cap1[0],
                 cap3[1] / cap1[1], 100.0 / max(shares), a.rounds))
    finally:
        cluster.cleanup()
        single.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

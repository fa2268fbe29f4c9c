#!/usr/bin/python3
"""Lua time per admitted attempt (not a test: pytest collects test_*.py only).

Starts its own redis-server (redis_support.RedisServer) and runs N attempts
(admit.lua, then release.lua with a real usage, one after the other, as a
sidecar does) for each key layout a sidecar sends: the source's keys alone,
plus the calling app's group (with and without a max_concurrency: only then
does the group keep leases), plus its group on the capability, and the
source's (and the app's) input- and output-token buckets (io keys). Every limit
is set (so every bucket is read and written) and never binds. admit runs by
EVALSHA and release by EVAL, so INFO commandstats (reset before each layout)
separates them: cmdstat_evalsha usec_per_call is admit.lua's time in Redis,
cmdstat_eval release.lua's (plus the script-cache lookup EVAL adds: the
SHA1 of its text). The last column runs the same attempts again with both
scripts by EVALSHA, as the sidecar sends them: admit + release in Redis per
admitted attempt (the figure the Redis target of issue 17 is about).

    tests/redis/bench_admit.py [--n 20000] [--rev GIT_REV]

--rev loads the scripts as they were at GIT_REV (e.g. the commit before
app groups existed: only the source layout applies there).
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from redis_support import RedisServer, Resp, app_keys, io_key, source_keys  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))


def lua(name, rev):
    """lib.lua followed by the script (what the sidecar loads)."""
    def read(f):
        path = "sidecar/backend/lua/%s.lua" % f
        if rev:
            return subprocess.run(["git", "-C", ROOT, "show", "%s:%s" % (rev, path)],
                                  check=True, capture_output=True, text=True).stdout
        with open(os.path.join(ROOT, path)) as fh:
            return fh.read()
    return read("lib") + "\n" + read(name)


def commandstats(c):
    out = {}
    for line in c.call("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_"):
            name, _, rest = line.partition(":")
            kv = dict(x.split("=") for x in rest.split(","))
            out[name[8:]] = (int(kv["calls"]), float(kv["usec_per_call"]))
    return out


def run(c, sha_admit, release_src, groups, n, conc=1000000, sha_release=None, ios=()):
    """`ios`: io keys (input- and output-token buckets) after the groups."""
    keys = source_keys("s")
    admit_args, release_args = [], []
    for g in groups:
        keys = keys + g
        admit_args += ["app" if ":cap:" not in g[0] else "app_cap", conc, 10**12, 60000,
                       10**12, 60000, 10**12, 86400000]
        release_args += [10**12, 60000, 10**12, 86400000]
    for k in ios:
        keys = keys + [k]
        admit_args += ["" if ":source:" in k else "app", 10**12, 10**12, 60000]
        release_args += [10**12, 10**12, 60000]
    if ios:
        admit_args.append(30)               # est_out: 70 input, 30 output
        release_args += [30, 50, 30]        # 50 input (cache reads left out), 30 output
    c.call("CONFIG", "RESETSTAT")
    for i in range(n):
        lease = "bench:%d" % i
        r = c.call("EVALSHA", sha_admit, len(keys), *keys, lease, 1000000, 30000, 10**12, 60000,
                   10**12, 60000, 10**12, 86400000, 100, *admit_args)
        assert r[0] == 1, r
        c.call("EVALSHA" if sha_release else "EVAL", sha_release or release_src, len(keys), *keys,
               lease, "success", 100, 80, 10**12, 60000, 10**12, 86400000, 5, 30000, 300000,
               *release_args)
    st = commandstats(c)
    if sha_release:
        calls, us = st["evalsha"]
        assert calls == 2 * n
        return calls * us / n
    return st["evalsha"], st["eval"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--rev", default=None)
    a = ap.parse_args()
    srv = RedisServer().start()
    try:
        c = Resp(srv.port)
        sha = c.call("SCRIPT", "LOAD", lua("admit", a.rev))
        rel = lua("release", a.rev)
        layouts = [("source only", [], 0)]
        if not a.rev or "app_cap" in lua("admit", a.rev):
            layouts += [("source + app (rpm, tpm, daily)", [app_keys("web")], 0),
                        ("source + app (max_concurrency too)", [app_keys("web")], 1000000),
                        ("source + app + app on capability",
                         [app_keys("web"), app_keys("web", "chat")], 1000000)]
        sha_rel = c.call("SCRIPT", "LOAD", rel)
        print("| scripts | layout | attempts | admit.lua µs (evalsha) | release.lua µs (eval) "
              "| admit + release µs (both evalsha) |")
        print("|---|---|---|---|---|---|")
        if not a.rev or "io_level" in lua("admit", a.rev):
            layouts += [("source + io (itpm, otpm)", [], 0, [io_key("source:s")]),
                        ("source + app + io of both", [app_keys("web")], 0,
                         [io_key("source:s"), io_key("app:web")])]
        for name, groups, conc, *ios in layouts:
            ios = ios[0] if ios else ()
            c.call("FLUSHALL")
            (n1, us_admit), (n2, us_rel) = run(c, sha, rel, groups, a.n, conc, ios=ios)
            assert n1 == n2 == a.n
            c.call("FLUSHALL")
            both = run(c, sha, rel, groups, a.n, conc, sha_rel, ios=ios)
            print("| %s | %s | %d | %.2f | %.2f | %.2f |" % (a.rev or "worktree", name, a.n,
                                                           us_admit, us_rel, both))
        c.close()
    finally:
        srv.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

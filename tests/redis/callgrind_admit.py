#!/usr/bin/python3
"""Instructions redis-server runs per admitted attempt (not a test: pytest
collects test_*.py only). Counted, not timed: the figure does not move with
the load of a shared machine, unlike bench_admit.py's microseconds.

redis-server runs under valgrind's callgrind; one admit.lua and one
release.lua (by EVALSHA, as a sidecar sends them) per attempt, N / 4 times
in one run and N times in another: the difference over 3N / 4 is the cost of
one attempt, start-up and script loading left out. That is all of the
server's work for the two commands, reading and parsing them and writing the
replies included, most of it in the scripts (the `call` row of
callgrind_annotate). Layouts:

  bench      the source of the bench's redis section (tests/bench/call_config.sh):
             max_concurrency, no bucket, a breaker that never opens
  limits     every limit of the source set (three buckets read and written)
  app        limits, plus the calling app's own group with a max_concurrency
  io         limits, plus the source's itpm and otpm (its io key)
  app_io     app, plus the source's and the app's itpm and otpm

    tests/redis/callgrind_admit.py [--n 2000] [--rev GIT_REV] [--layout bench]

--rev loads the scripts as they were at GIT_REV (before/after figures; the io
layouts only where the scripts take io keys).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_admit import lua  # noqa: E402
from redis_support import Resp, app_keys, free_port, io_key, source_keys  # noqa: E402

BIG = 10**12
LAYOUTS = {
    # (source limits rpm/tpm/daily, app group or None, io keys)
    "bench": (0, None, ()),
    "limits": (BIG, None, ()),
    "app": (BIG, "web", ()),
    "io": (BIG, None, ("source:s",)),
    "app_io": (BIG, "web", ("source:s", "app:web")),
}


def args_for(layout, lease):
    lim, app, ios = LAYOUTS[layout]
    keys = source_keys("s")
    admit = [lease, 16384, 30000, lim, 60000, lim, 60000, lim, 86400000, 100]
    release = [lease, "success", 100, 80, lim, 60000, lim, 86400000, 1000000, 30000, 300000]
    if app:
        keys = keys + app_keys(app)
        admit += ["app", 1000000, BIG, 60000, BIG, 60000, BIG, 86400000]
        release += [BIG, 60000, BIG, 86400000]
    for holder in ios:
        keys = keys + [io_key(holder)]
        admit += ["" if holder.startswith("source:") else "app", BIG, BIG, 60000]
        release += [BIG, BIG, 60000]
    if ios:
        admit.append(30)            # est_out: 70 input, 30 output
        release += [30, 50, 30]     # est_out, used_in, used_out
    return keys, admit, release


def count(admit_src, release_src, layout, iters):
    """Instructions of one redis-server life that runs `iters` attempts."""
    tmp = tempfile.mkdtemp(prefix="pgw-callgrind-")
    out = os.path.join(tmp, "callgrind.out")
    port = free_port()
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out,
                             shutil.which("redis-server"), "--port", str(port), "--bind",
                             "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        c = None
        deadline = time.monotonic() + 60
        while c is None:
            try:
                c = Resp(port, timeout=30)
                c.call("PING")
            except OSError:
                c = None
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("redis-server under valgrind did not start")
                time.sleep(0.1)
        sha_a = c.call("SCRIPT", "LOAD", admit_src)
        sha_r = c.call("SCRIPT", "LOAD", release_src)
        for i in range(iters):
            keys, a, r = args_for(layout, "bench:%d" % i)
            got = c.call("EVALSHA", sha_a, len(keys), *keys, *a)
            assert got[0] == 1, got
            c.call("EVALSHA", sha_r, len(keys), *keys, *r)
        try:
            c.call("SHUTDOWN", "NOSAVE")
        except OSError:
            pass
        proc.wait(60)
        with open(out) as f:
            m = re.search(r"^(?:summary|totals):\s+(\d+)", f.read(), re.M)
        return int(m.group(1))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--rev", default=None)
    ap.add_argument("--layout", choices=sorted(LAYOUTS), action="append")
    a = ap.parse_args()
    for tool in ("valgrind", "redis-server"):
        if not shutil.which(tool):
            print("callgrind_admit.py: needs %s (tests/deps.sh installs it)" % tool)
            return 2
    admit_src, release_src = lua("admit", a.rev), lua("release", a.rev)
    print("| scripts | layout | attempts | instructions per admitted attempt |")
    print("|---|---|---:|---:|")
    layouts = a.layout or [k for k in LAYOUTS if "io" not in k or "io_level" in admit_src]
    for layout in layouts:
        small, big = a.n // 4, a.n
        d = count(admit_src, release_src, layout, big) - count(admit_src, release_src, layout,
                                                               small)
        print("| %s | %s | %d | %.0f |" % (a.rev or "worktree", layout, big - small,
                                           d / (big - small)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

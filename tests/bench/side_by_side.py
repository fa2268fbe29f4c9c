#!/usr/bin/env python3
"""side_by_side.py [options] NAME=BUILD_DIR NAME=BUILD_DIR ... -- the sidecar CPU
per request of several builds, measured at the same moment.

On a machine shared with other jobs, two bench runs minutes apart do not
compare; this starts one mock upstream and one sidecar per build (each with
the bench's call config and an HTTP listener, all on CPU 0 with the mock) and
loads them in turn, alternating the order every round, with the same
generator on CPU 1: wrk on /v1/chat/completions (--front http) or loadgen
`call` (--front msgpack). Per build: the median over the rounds of the
sidecar's utime + stime (/proc) over a round divided by the requests the
generator completed in it, and every round's figure.

  /usr/bin/python3 tests/bench/side_by_side.py old=/tmp/old/build new=build
  /usr/bin/python3 tests/bench/side_by_side.py --front msgpack --rounds 8 old=... new=build

The mock and loadgen come from the first build.
"""
import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from per_request import Rig  # noqa: E402


def ticks(pid):
    """utime + stime of every thread of pid, in clock ticks."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("builds", nargs="+", metavar="NAME=BUILD_DIR")
    ap.add_argument("--front", choices=("http", "msgpack"), default="http")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=int, default=2, help="per build and round (default 2)")
    args = ap.parse_args()
    builds = [b.split("=", 1) for b in args.builds]
    if any(len(b) != 2 for b in builds) or len(builds) < 2:
        sys.exit("side_by_side: give at least two NAME=BUILD_DIR")
    tck = os.sysconf("SC_CLK_TCK")
    tmp = tempfile.mkdtemp(prefix="polygw-sbs.")
    rigs = {}
    try:
        first = None
        for name, build in builds:
            d = os.path.join(tmp, name)
            os.mkdir(d)
            rig = Rig(builds[0][1], args.front, args.clients, [], d, polygw=build, mock=first)
            first = first or rig
            rigs[name] = rig
        for rig in rigs.values():
            rig.load(1)
        res = {name: [] for name, _ in builds}
        for r in range(args.rounds):
            order = builds if r % 2 == 0 else builds[::-1]
            for name, _ in order:
                rig = rigs[name]
                u0, s0 = ticks(rig.sidecar.pid)
                n = rig.load(args.seconds)
                u1, s1 = ticks(rig.sidecar.pid)
                res[name].append(((u1 - u0) / tck * 1e6 / n, (s1 - s0) / tck * 1e6 / n,
                                  n / args.seconds))
        for name, _ in builds:
            runs = sorted(res[name], key=lambda x: x[0] + x[1])
            u, s, rps = runs[len(runs) // 2]
            print("%-12s %s, %d clients: %.1f CPU µs/request (user %.1f + system %.1f), %.0f req/s;"
                  " rounds: %s" % (name, args.front, args.clients, u + s, u, s, rps,
                                   " ".join("%.1f" % (x[0] + x[1]) for x in res[name])))
    finally:
        for rig in reversed(list(rigs.values())):
            rig.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

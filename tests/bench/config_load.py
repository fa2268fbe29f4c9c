#!/usr/bin/python3
"""Config load time against the number of capabilities.

Writes, for each N, a valid config with N custom capabilities, each with
one source (so N capabilities and N sources: every per-key lookup, the
duplicate checks and the source -> capability resolution are exercised),
and times `polygw --check-config` on it (best of REPS runs, wall clock).
Prints one Markdown table row per N with the time growth divided by the
size growth since the previous N: ~1.0 for a linear loader, ~2 per doubling
for a quadratic one.

    tests/bench/config_load.py BUILD_DIR [N ...]     (default: 10000 20000 40000 100000)

Environment: BENCH_REPS (default 3).
"""
import os
import subprocess
import sys
import tempfile
import time


def write_config(path, n):
    with open(path, "w") as f:
        f.write("capabilities:\n")
        for i in range(n):
            f.write("  cap%d: { path: /c%d, max_attempts: 2 }\n" % (i, i))
        f.write("sources:\n")
        for i in range(n):
            f.write("  - { name: s%d, capability: cap%d, base_url: \"http://127.0.0.1:1\" }\n"
                    % (i, i))


def main():
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
    sizes = [int(a) for a in sys.argv[2:]] or [10000, 20000, 40000, 100000]
    reps = int(os.environ.get("BENCH_REPS", "3"))
    daemon = os.path.join(build, "polygw")
    print("| capabilities + sources | file MiB | --check-config s (best of %d) | time growth / size growth |"
          % reps)
    print("|---:|---:|---:|---:|")
    prev = None
    with tempfile.TemporaryDirectory(prefix="polygw-cfgbench-") as tmp:
        for n in sizes:
            path = os.path.join(tmp, "c%d.yaml" % n)
            write_config(path, n)
            best = None
            for _ in range(reps):
                t0 = time.monotonic()
                r = subprocess.run([daemon, "--check-config", path], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, timeout=600)
                dt = time.monotonic() - t0
                if r.returncode != 0:
                    sys.exit("check-config failed for N=%d: %s" % (n, r.stderr.decode()))
                best = dt if best is None else min(best, dt)
            # time growth over size growth: ~1.0 for a linear loader
            ratio = "" if prev is None else "%.2f" % ((best / prev[1]) / (n / prev[0]))
            print("| %d | %.1f | %.3f | %s |" % (n, os.path.getsize(path) / 1048576.0, best,
                                                 ratio))
            prev = (n, best)
            sys.stdout.flush()


if __name__ == "__main__":
    main()

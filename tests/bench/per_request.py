#!/usr/bin/env python3
"""per_request.py BUILD [options] -- what one proxied chat call costs the sidecar,
counted rather than timed, so that the figures do not move with the load of a
shared machine:

  instructions  the sidecar runs under valgrind's callgrind; after a warm-up
                its counters are zeroed, the generator runs, they are dumped:
                user-space instructions per request, split by object (polygw,
                libcurl, libc, ...), calls to malloc, calloc, realloc and free
                per request by the object calling, and the functions with the
                most instructions of their own.
  syscalls      `strace -c -f` attached to the sidecar while the generator
                runs: system calls per request, by name.

The set-up is profile.sh's: the mock upstream and one sidecar (the bench's
call config, an HTTP listener), loaded by wrk on /v1/chat/completions
(--front http) or by loadgen sending the same body as a `call` (--front
msgpack). With --backend redis the sidecar uses a redis-server of its own
(on the generator's CPU), and the instruction count adds the Redis client's
share: the memory and redis rows, side by side, are what the shared backend
costs the sidecar. Under callgrind the sidecar runs some 50 times slower, so
a run completes a few thousand requests: enough, since the count per request
is the same every run to within 2-3%.

  /usr/bin/python3 tests/bench/per_request.py build                  # both, http, 64 clients
  /usr/bin/python3 tests/bench/per_request.py build --front msgpack --mode syscalls --clients 1
  /usr/bin/python3 tests/bench/per_request.py build --front msgpack --backend redis --clients 8

Needs valgrind, strace and wrk (tests/deps.sh); redis-server for --backend redis.
"""
import argparse
import collections
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BODY = ('{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful '
        'assistant."},{"role":"user","content":"Hello, how are you today?"}]}')
TIMEOUT_S = 120


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pin(cpu):
    if (os.cpu_count() or 1) >= 2 and shutil.which("taskset"):
        return ["taskset", "-c", str(cpu)]
    return []


class Rig:
    """The mock, one sidecar (optionally under a wrapper) and the generator."""

    def __init__(self, build, front, clients, wrapper, tmp, polygw=None, mock=None,
                 backend="memory"):
        """build: where the mock and loadgen are (and polygw, unless `polygw`
        names another build directory); mock: another Rig whose mock to share;
        backend "redis": a redis-server of its own on a free loopback port."""
        self.build, self.front, self.clients, self.tmp = build, front, clients, tmp
        self.procs = []
        if mock:
            self.mock_port = mock.mock_port
        else:
            proc = subprocess.Popen(pin(0) + [os.path.join(build, "mock_upstream"), "--port", "0",
                                              "--host", "127.0.0.1"],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self.procs.append(proc)
            line = proc.stdout.readline().split()
            if len(line) != 2 or line[0] != "LISTENING":
                raise SystemExit("per_request: the mock did not start")
            self.mock_port = line[1]
        cfg = subprocess.run(["sh", "-c", '. "$0"; call_config "$1"',
                              os.path.join(HERE, "call_config.sh"), self.mock_port],
                             capture_output=True, text=True, check=True, timeout=10).stdout
        if backend == "redis":
            cfg = self.start_redis(cfg)
        self.http_port = free_port()
        path = os.path.join(tmp, "sidecar.yaml")
        with open(path, "w") as f:
            f.write(cfg + "http:\n  listen: 127.0.0.1:%d\n" % self.http_port)
        self.sock = os.path.join(tmp, "polygw.sock")
        self.sidecar = subprocess.Popen(
            pin(0) + wrapper + [os.path.join(polygw or build, "polygw"), "--config", path,
                                "--socket", self.sock, "--log-level", "warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(self.sidecar)
        url = "http://127.0.0.1:%d/healthz" % self.http_port
        for _ in range(600):  # valgrind takes a few seconds to start it
            if subprocess.run(["curl", "-s", "-o", "/dev/null", "--max-time", "1", url]).returncode == 0:
                break
            if self.sidecar.poll() is not None:
                raise SystemExit("per_request: the sidecar exited")
            time.sleep(0.1)
        else:
            raise SystemExit("per_request: the sidecar did not answer /healthz")
        self.lua = os.path.join(tmp, "wrk.lua")
        with open(self.lua, "w") as f:
            f.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                    'wrk.body = [==[%s]==]\n' % BODY)

    def start_redis(self, cfg):
        """Starts redis-server (on the generator's CPU) and returns `cfg`
        pointed at it. Under callgrind the sidecar runs ~50 times slower:
        generous command and lease times."""
        port = free_port()
        rdir = os.path.join(self.tmp, "redis")
        os.makedirs(rdir, exist_ok=True)
        self.procs.append(subprocess.Popen(
            pin(1) + ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                      "--appendonly", "no", "--dir", rdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for _ in range(100):
            ping = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                                  text=True, timeout=10)
            if ping.stdout.strip() == "PONG":
                break
            time.sleep(0.1)
        else:
            raise SystemExit("per_request: redis-server did not start")
        backend = ("  kind: redis\n  url: \"redis://127.0.0.1:%d/0\"\n  prefix: \"polygw-perreq\"\n"
                   "  command_timeout_s: 20\n  lease_ttl_s: 60\n" % port)
        if "  kind: memory\n" not in cfg:
            raise SystemExit("per_request: call_config.sh has no `kind: memory` line to replace")
        return cfg.replace("  kind: memory\n", backend, 1)

    def load(self, seconds):
        """Runs the generator for `seconds`; returns the requests it completed."""
        if self.front == "http":
            out = subprocess.run(
                pin(1) + ["wrk", "-t", "1", "-c", str(self.clients), "-d", "%ds" % seconds, "-s",
                          self.lua, "http://127.0.0.1:%d/v1/chat/completions" % self.http_port],
                capture_output=True, text=True, timeout=seconds + TIMEOUT_S).stdout
            m = re.search(r"(\d+) requests in", out)
            if not m or re.search(r"Non-2xx", out):
                raise SystemExit("per_request: wrk failed:\n" + out)
            return int(m.group(1))
        params = '[{"capability":"chat","body":%s}]' % BODY
        out = subprocess.run(
            pin(1) + [os.path.join(self.build, "bench", "loadgen"), "--socket", self.sock,
                      "--method", "call", "--params-json", params, "--clients", str(self.clients),
                      "--duration", str(seconds), "--timeout-ms", "30000", "--json"],
            capture_output=True, text=True, timeout=seconds + TIMEOUT_S).stdout
        res = json.loads(out.strip().splitlines()[-1])
        if res.get("errors"):
            raise SystemExit("per_request: loadgen reported errors: " + out)
        return int(res["ok"])

    def close(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def instructions(args, tmp):
    out = os.path.join(tmp, "callgrind.out")
    rig = Rig(args.build, args.front, args.clients,
              ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out + ".%p"], tmp,
              backend=args.backend)
    try:
        rig.load(args.warmup)
        subprocess.run(["callgrind_control", "-z", str(rig.sidecar.pid)], capture_output=True,
                       timeout=TIMEOUT_S, check=True)
        n = rig.load(args.seconds)
        subprocess.run(["callgrind_control", "-d", str(rig.sidecar.pid)], capture_output=True,
                       timeout=TIMEOUT_S, check=True)
    finally:
        rig.close()
    # callgrind_control -d wrote OUT.PID.1; OUT.PID is the exit's (the shutdown).
    dumps = glob.glob(out + ".*.1")
    if len(dumps) != 1:
        raise SystemExit("per_request: no callgrind dump")
    dump = dumps[0]
    text = subprocess.run(["callgrind_annotate", "--threshold=100", dump], capture_output=True,
                          text=True, timeout=TIMEOUT_S, check=True).stdout
    total = int(re.search(r"([\d,]+) \(100.0%\)\s+PROGRAM TOTALS", text).group(1).replace(",", ""))
    objs, funcs = collections.Counter(), collections.Counter()
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*?):(.*) \[(.*)\]$", line)
        if not m:
            continue
        ir, fn, obj = int(m.group(1).replace(",", "")), m.group(3), os.path.basename(m.group(4))
        if ir * 1000 >= total * 999:
            continue  # main, ev_run...: on the stack when the counters were zeroed, not own cost
        objs[obj] += ir
        funcs["%s (%s)" % (fn.split("'")[0], obj)] += ir
    print("instructions: %s front, %s backend, %d client(s): %d requests, %.0f user-space "
          "instructions per request (callgrind)"
          % (args.front, args.backend, args.clients, n, total / n))
    for obj, ir in objs.most_common():
        if ir * 1000 >= total:
            print("  %-28s %8.0f  %5.1f%%" % (obj, ir / n, 100.0 * ir / total))
    if args.backend == "redis":
        redis_client(dump, n)
    allocations(dump, n)
    print("  functions with the most instructions of their own:")
    for fn, ir in funcs.most_common(args.top):
        print("    %8.0f  %5.1f%%  %s" % (ir / n, 100.0 * ir / total, fn))


def redis_client(dump, n):
    """The Redis client's share, inclusive: formatting and queueing the
    script calls (rds_eval), and reading and parsing the replies (hiredis'
    read handler less the callbacks it runs)."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", dump],
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=True).stdout
    found = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+\S*:(rds_eval|redisAsyncHandleRead|"
                     r"cmd_on_reply) ", line)
        if m and m.group(2) not in found:
            found[m.group(2)] = int(m.group(1).replace(",", ""))
    ev, rd, cb = (found.get(k, 0) for k in ("rds_eval", "redisAsyncHandleRead", "cmd_on_reply"))
    print("  Redis client, inclusive, per request: rds_eval (format and queue the script calls) "
          "%.0f; redisAsyncHandleRead - cmd_on_reply (read and parse the replies) %.0f"
          % (ev / n, (rd - cb) / n))


def allocations(dump, n):
    """Calls to libc's allocator per request, from callgrind's call counts:
    each caller of malloc, calloc, realloc and free, by the object it is in
    (the allocator's calls to itself left out; free(NULL) counts)."""
    text = subprocess.run(["callgrind_annotate", "--tree=caller", "--threshold=100", dump],
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=True).stdout
    alloc = re.compile(r"malloc\.c:(malloc|calloc|realloc|free) \[.*libc\.so")
    callers, counts = [], collections.Counter()
    for line in text.splitlines():
        m = re.match(r"\s*[\d,]+ \(\s*[\d.]+%\)\s+<\s+(.*) \(([\d,]+)x\) \[(.*)\]$", line)
        if m:
            callers.append((m.group(1), int(m.group(2).replace(",", "")), m.group(3)))
            continue
        m = re.match(r"\s*[\d,]+ \(\s*[\d.]+%\)\s+\*\s+(.*)$", line)
        if m and alloc.search(m.group(1)):
            fn = alloc.search(m.group(1)).group(1)
            for caller, k, obj in callers:
                if not re.search(r"malloc\.c:", caller):
                    obj = os.path.basename(obj)
                    counts[(fn, "other (strdup...)" if obj == "???" else obj)] += k
        if m or not line.strip():
            callers = []
    for fn in ("malloc", "calloc", "realloc", "free"):
        by = sorted(((k, o) for (f, o), k in counts.items() if f == fn), reverse=True)
        print("  %-8s %6.1f calls per request (%s)" % (
            fn, sum(k for k, _ in by) / n, ", ".join("%s %.1f" % (o, k / n) for k, o in by if k)))


def syscalls(args, tmp):
    rig = Rig(args.build, args.front, args.clients, [], tmp, backend=args.backend)
    log = os.path.join(tmp, "strace.txt")
    try:
        rig.load(args.warmup)
        st = subprocess.Popen(["strace", "-c", "-f", "-o", log, "-p", str(rig.sidecar.pid)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        # strace says it attached on stderr ("Process N attached") before it traces.
        st.stderr.readline()
        n = rig.load(args.seconds)
        st.send_signal(signal.SIGINT)
        st.wait(timeout=TIMEOUT_S)
    finally:
        rig.close()
    counts = {}
    with open(log) as f:
        for line in f:
            p = line.split()
            if len(p) >= 5 and p[0][0].isdigit() and p[-1] != "total":
                counts[p[-1]] = int(p[3])
    total = sum(counts.values())
    print("syscalls: %s front, %d client(s): %d requests, %.2f system calls per request "
          "(strace -c -f)" % (args.front, args.clients, n, total / n))
    for name, k in sorted(counts.items(), key=lambda kv: -kv[1]):
        print("  %-16s %8.3f" % (name, k / n))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build")
    ap.add_argument("--front", choices=("http", "msgpack"), default="http")
    ap.add_argument("--backend", choices=("memory", "redis"), default="memory",
                    help="redis: a redis-server of its own (default memory)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--mode", choices=("instructions", "syscalls", "both"), default="both")
    ap.add_argument("--seconds", type=int, default=4, help="measured load (default 4)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed load first (default 2)")
    ap.add_argument("--top", type=int, default=25, help="functions listed (default 25)")
    args = ap.parse_args()
    need = ["wrk" if args.front == "http" else None, "curl"]
    need += ["valgrind", "callgrind_control", "callgrind_annotate"] if args.mode != "syscalls" else []
    need += ["strace"] if args.mode != "instructions" else []
    need += ["redis-server", "redis-cli"] if args.backend == "redis" else []
    missing = [t for t in need if t and not shutil.which(t)]
    if missing:
        sys.exit("per_request: needs %s (tests/deps.sh)" % ", ".join(missing))
    tmp = tempfile.mkdtemp(prefix="polygw-perreq.")
    try:
        if args.mode in ("syscalls", "both"):
            syscalls(args, tmp)
        if args.mode in ("instructions", "both"):
            instructions(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

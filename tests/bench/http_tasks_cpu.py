#!/usr/bin/env python3
"""CPU time the sidecar spends on HTTP task requests and HTTP errors.

    python3 tests/bench/http_tasks_cpu.py build/polygw [N]

Starts BUILD's polygw with an HTTP listener (memory backend, one source
that is never called), then over one keep-alive connection sends N
`POST /polygw/v1/tasks/tN/start` + `.../stop` pairs (with a JSON reason),
then N `GET /polygw/v1/tasks/nope-N` (each a locally made 400 error), and
prints the process's user+system CPU (from /proc/PID/stat) for each loop,
per request in microseconds.
"""
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    binary = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    work = tempfile.mkdtemp(prefix="pgw-tasks-cpu.")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cfg = os.path.join(work, "polygw.yaml")
    with open(cfg, "w") as f:
        f.write("listen:\n  mode: \"0660\"\nserver:\n  log_level: warn\n"
                "sources:\n  - name: m1\n    capability: chat\n    base_url: http://127.0.0.1:9\n"
                "http:\n  listen: \"127.0.0.1:%d\"\n" % port)
    proc = subprocess.Popen([binary, "--config", cfg, "--socket", os.path.join(work, "s.sock")])
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        hdrs = {"Content-Type": "application/json"}
        body = json.dumps({"reason": "bench"})

        def req(method, path, b=None, want=200):
            c.request(method, path, body=b, headers=hdrs)
            r = c.getresponse()
            r.read()
            assert r.status == want, (path, r.status)

        t0 = cpu_s(proc.pid)
        for i in range(n):
            req("POST", "/polygw/v1/tasks/t%d/start" % i)
            req("POST", "/polygw/v1/tasks/t%d/stop" % i, body)
        t1 = cpu_s(proc.pid)
        for i in range(n):
            req("GET", "/polygw/v1/tasks/nope-%d" % i, want=400)
        t2 = cpu_s(proc.pid)
        print("tasks: %d start+stop pairs: %.3f s CPU, %.1f us per request"
              % (n, t1 - t0, (t1 - t0) * 1e6 / (2 * n)))
        print("errors: %d unknown-task 400s: %.3f s CPU, %.1f us per request"
              % (n, t2 - t1, (t2 - t1) * 1e6 / n))
    finally:
        proc.terminate()
        proc.wait(timeout=15)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""A response-cache hit costs the sidecar less CPU than a call upstream.

Starts the mock upstream and a sidecar whose chat capability is cached,
with polygw's own HTTP/1.1 client to the mock (upstream_client: auto, an IP
address). Over one keep-alive HTTP connection it sends N different chat
requests (misses: each goes upstream and is stored), then the same N again
(hits), and reads the sidecar's CPU time (/proc schedstat, every thread) around each
pass. Prints one Markdown table row: microseconds of sidecar CPU per miss
and per hit, and their ratio, from the same run.

    tests/bench/cache_cpu.py BUILD_DIR [N]
"""
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from mock import MockUpstream  # noqa: E402


def cpu_s(pid):
    """Seconds the sidecar's threads spent on a CPU (schedstat: nanoseconds,
    not clock ticks)."""
    total = 0
    for tid in os.listdir("/proc/%d/task" % pid):
        total += int(open("/proc/%d/task/%s/schedstat" % (pid, tid)).read().split()[0])
    return total / 1e9


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_pass(conn, n, tag):
    for i in range(n):
        body = json.dumps({"model": "m", "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Question number %d, %s" % (i, tag)}]})
        conn.request("POST", "/v1/chat/completions", body=body,
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            raise SystemExit("request %d: HTTP %d" % (i, r.status))


def main():
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    os.environ["POLYGW_BUILD"] = build
    d = tempfile.mkdtemp(prefix="pgwb", dir="/tmp")
    port = free_port()
    with MockUpstream() as up:
        cfg = os.path.join(d, "c.yaml")
        with open(cfg, "w") as f:
            f.write('listen:\n  mode: "0600"\n'
                    "server: {log_level: warn, shutdown_grace_s: 1, access_log: false}\n"
                    "cache: {max_bytes: 268435456}\n"
                    "capabilities:\n  chat: {cache: {ttl_s: 3600}}\n"
                    "sources:\n  - name: one\n    capability: chat\n    base_url: %s\n"
                    "    max_concurrency: 64\n"
                    "http: {listen: \"127.0.0.1:%d\"}\n" % (up.url, port))
        proc = subprocess.Popen([os.path.join(build, "polygw"), "--config", cfg, "--socket",
                                 os.path.join(d, "s.sock")], stderr=subprocess.DEVNULL)
        try:
            for _ in range(250):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.02)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            one_pass(conn, 50, "warm-up")
            c0 = cpu_s(proc.pid)
            one_pass(conn, n, "bench")
            c1 = cpu_s(proc.pid)
            before = up.stats()["requests"]
            one_pass(conn, n, "bench")
            c2 = cpu_s(proc.pid)
            if up.stats()["requests"] != before:
                raise SystemExit("the second pass reached the upstream: not all hits")
            miss_us, hit_us = (c1 - c0) / n * 1e6, (c2 - c1) / n * 1e6
            print("| requests | sidecar CPU per miss (own client) | per hit | miss / hit |")
            print("|---|---|---|---|")
            print("| %d | %.1f µs | %.1f µs | %.1f× |"
                  % (n, miss_us, hit_us, miss_us / hit_us if hit_us > 0 else float("inf")))
        finally:
            proc.terminate()
            proc.wait(10)
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()

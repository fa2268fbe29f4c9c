#!/usr/bin/python3
"""A call waiting for a permit burns no CPU.

Starts the mock upstream and a sidecar whose only chat source admits one
call at a time (max_concurrency 1), holds that permit with one long call
(the mock delays it), queues N more calls behind it (default 1000, on 10
pipelined connections), and measures the sidecar's CPU time while they
wait. Prints one Markdown table row; exits non-zero if the calls were not
really waiting.

    tests/bench/waiting_cpu.py BUILD_DIR [N] [SECONDS]
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from mock import MockUpstream  # noqa: E402


def cpu_s(pid):
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def rss_kb(pid):
    return int(open("/proc/%d/status" % pid).read().split("VmRSS:")[1].split()[0])


def main():
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    secs = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
    os.environ["POLYGW_BUILD"] = build
    d = tempfile.mkdtemp(prefix="pgwb", dir="/tmp")
    sock = os.path.join(d, "s.sock")
    with MockUpstream() as up:
        cfg = os.path.join(d, "c.yaml")
        with open(cfg, "w") as f:
            f.write('listen:\n  mode: "0600"\n  max_inflight_per_connection: 1024\n'
                    "server: {log_level: warn, shutdown_grace_s: 1}\n"
                    "defaults: {stall_window_s: 3600}\n"
                    "sources:\n  - name: one\n    capability: chat\n"
                    "    base_url: %s\n    max_concurrency: 1\n    aimd: {initial: 1}\n"
                    "    timeout_s: 3600\n    ttft_timeout_s: 3600\n    idle_timeout_s: 3600\n"
                    % up.url)
        proc = subprocess.Popen([os.path.join(build, "polygw"), "--config", cfg, "--socket", sock],
                                stderr=subprocess.DEVNULL)
        try:
            for _ in range(200):
                if os.path.exists(sock):
                    break
                time.sleep(0.02)
            conns = []
            for _ in range(10):
                s = socket.socket(socket.AF_UNIX)
                s.connect(sock)
                conns.append(s)
            body = {"messages": [{"role": "user", "content": "x"}],
                    "mock": {"delay_ms": int((secs + 5) * 1000)}}
            conns[0].sendall(msgpack.packb([0, 0, "call", [{"capability": "chat", "body": body}]]))
            time.sleep(0.3)
            idle_rss = rss_kb(proc.pid)
            for i in range(n):
                conns[i % 10].sendall(msgpack.packb(
                    [0, i + 1, "call", [{"capability": "chat",
                                         "body": {"messages": [{"role": "user", "content": "y"}]}}]]))
            time.sleep(0.5)
            st = subprocess.run([os.path.join(build, "polygwctl"), "--socket", sock, "--json",
                                 "stats"], capture_output=True, text=True, timeout=10)
            import json
            stats = json.loads(st.stdout)
            waiting = stats["calls_waiting"]
            c0 = cpu_s(proc.pid)
            time.sleep(secs)
            c1 = cpu_s(proc.pid)
            rss = rss_kb(proc.pid)
            print("| calls waiting | seconds | sidecar CPU s | CPU % | RSS delta KiB per waiting call |")
            print("|---:|---:|---:|---:|---:|")
            print("| %d | %.1f | %.3f | %.2f | %.2f |" % (waiting, secs, c1 - c0,
                                                       100 * (c1 - c0) / secs,
                                                       (rss - idle_rss) / max(waiting, 1)))
            if waiting < n:
                print("only %d of %d calls were waiting" % (waiting, n), file=sys.stderr)
                return 1
            return 0
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

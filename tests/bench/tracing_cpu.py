#!/usr/bin/env python3
"""CPU per call of the sidecar with tracing on (ratio 1.0, every call and
attempt recorded and exported) against tracing off, in one run.

    python3 tests/bench/tracing_cpu.py BUILD [N] [ROUNDS]

Starts BUILD's mock_upstream, an OTLP/HTTP sink (answers 200 to every
POST, reads and drops the body), and two sidecars of BUILD's polygw on the
same mock: one with `tracing.enabled: false`, one with tracing on
(export_interval_s 1, the default batch). Over one keep-alive HTTP
connection each, ROUNDS times in turn (off, on, off, on, ...), it sends N
chat calls (the on sidecar's with a sampled `traceparent`), and reads each
process's user+system CPU (/proc/PID/stat) around the loop. Prints the CPU
per call in microseconds for each, the ratio on / off, and the spans the
sink received. Exits 1 when a call fails or no span arrived.
"""
import http.client
import http.server
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port):
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    requests = 0
    bytes = 0

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(n)
        Sink.requests += 1
        Sink.bytes += n
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def main():
    build = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    work = tempfile.mkdtemp(prefix="pgw-trace-cpu.")
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    mock = subprocess.Popen([os.path.join(build, "mock_upstream"), "--port", "0", "--host", "127.0.0.1"],
                            stdout=subprocess.PIPE, text=True)
    mport = int(mock.stdout.readline().split()[1])
    procs = {}
    try:
        for name, on in (("off", False), ("on", True)):
            port = free_port()
            cfg = os.path.join(work, name + ".yaml")
            with open(cfg, "w") as f:
                f.write("listen:\n  mode: \"0660\"\nserver:\n  log_level: warn\n  access_log: false\n"
                        "http:\n  listen: \"127.0.0.1:%d\"\n" % port)
                f.write("tracing:\n  enabled: %s\n  endpoint: \"http://127.0.0.1:%d/v1/traces\"\n"
                        "  export_interval_s: 1\n" % ("true" if on else "false", sink.server_address[1]))
                f.write("sources:\n  - {name: a, capability: chat, base_url: \"http://127.0.0.1:%d/v1\", "
                        "max_concurrency: 64}\n" % mport)
            p = subprocess.Popen([os.path.join(build, "polygw"), "--config", cfg,
                                  "--socket", os.path.join(work, name + ".sock")])
            wait_port(port)
            procs[name] = (p, port)
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        cpu = {"off": 0.0, "on": 0.0}
        conns = {k: http.client.HTTPConnection("127.0.0.1", v[1], timeout=10) for k, v in procs.items()}
        for k in conns:  # warm up: connections, pools, the first batch
            for _ in range(200):
                conns[k].request("POST", "/v1/chat/completions", body=body,
                                 headers={"Content-Type": "application/json"})
                conns[k].getresponse().read()
        for _ in range(rounds):
            for k in ("off", "on"):
                hdrs = {"Content-Type": "application/json"}
                if k == "on":
                    hdrs["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                c0 = cpu_s(procs[k][0].pid)
                for _ in range(n):
                    conns[k].request("POST", "/v1/chat/completions", body=body, headers=hdrs)
                    r = conns[k].getresponse()
                    r.read()
                    if r.status != 200:
                        print("call failed: %d" % r.status, file=sys.stderr)
                        return 1
                time.sleep(1.2)  # the batch of this round is exported (and counted) within it
                cpu[k] += cpu_s(procs[k][0].pid) - c0
        calls = n * rounds
        off_us, on_us = cpu["off"] / calls * 1e6, cpu["on"] / calls * 1e6
        print("tracing off: %.1f us CPU per call" % off_us)
        print("tracing on (ratio 1.0, exported): %.1f us CPU per call" % on_us)
        print("ratio on/off: %.2f" % (on_us / off_us if off_us else float("nan")))
        print("sink: %d export requests, %d bytes" % (Sink.requests, Sink.bytes))
        return 0 if Sink.requests > 0 else 1
    finally:
        for p, _ in procs.values():
            p.terminate()
            p.wait(10)
        mock.terminate()
        mock.wait(10)
        sink.shutdown()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""A fleet soak: N sidecars (default 8) sharing one redis-server, under a
bounded load for a fixed time (default 60 s). Measured, never asserted.

Two sources per sidecar, each with a mock upstream of its own (so each
mock's request counter is exactly that source's admitted attempts):
  - `open` (embedding): limits too generous to bite; `--open-clients`
    closed-loop loadgen connections per sidecar. Its calls measure the
    fleet's admission throughput and latency (a call = one awaited
    admission round trip + the mock's immediate answer).
  - `limited` (chat): rpm `--rpm` per `--window` seconds, fleet-wide, with
    `--limited-clients` connections per sidecar always waiting for a token:
    its admitted attempts are checked against the bucket's exact bound,
    capacity + rate x elapsed.

Prints a Markdown table: admitted attempts/s, call p50 / p99 (loadgen),
Redis command round trip (the sidecars' stats), redis-server CPU (INFO cpu
before and after: % of one core and µs per admitted attempt), and the
limited source's admitted attempts against the bound.

    tests/bench/fleet_soak.py BUILD_DIR [--sidecars 8] [--duration 60] [--tls]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.append(os.path.join(HERE, "..", "redis"))
from fleet_topology import Certs, TlsRedis  # noqa: E402
from mock import MockUpstream  # noqa: E402
from redis_support import RedisServer, Resp  # noqa: E402

import msgpack  # noqa: E402


def rpc(sock_path, method, params=None, timeout=5.0):
    import socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(sock_path)
    try:
        s.sendall(msgpack.packb([0, 1, method, [params] if params else []]))
        u = msgpack.Unpacker(raw=False)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            u.feed(chunk)
            for msg in u:
                return msg[2], msg[3]
    finally:
        s.close()


def redis_cpu_s(redis):
    if isinstance(redis, TlsRedis):
        info = subprocess.run(redis.cli() + ["INFO", "cpu"], stdout=subprocess.PIPE,
                              timeout=10).stdout.decode()
    else:
        c = Resp(redis.port)
        try:
            info = c.call("INFO", "cpu")
        finally:
            c.close()
    kv = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    return float(kv["used_cpu_sys"]) + float(kv["used_cpu_user"])


def config(d, i, redis_url, prefix, open_url, limited_url, rpm, window):
    path = os.path.join(d, "sc%d.yaml" % i)
    src = ("    max_concurrency: 1024\n    aimd: { initial: 1024, min: 1024 }\n"
           "    breaker: { failures: 1000000 }\n    timeout_s: 30\n    ttft_timeout_s: 30\n")
    with open(path, "w") as f:
        f.write('listen:\n  mode: "0600"\n'
                "server: { log_level: warn, shutdown_grace_s: 2 }\n"
                "backend: { kind: redis, url: \"%s\", prefix: %s,"
                " command_timeout_s: 1, lease_ttl_s: 30%s }\n"
                "defaults: { stall_window_s: 3600, poll_interval_s: 0.2 }\n"
                "sources:\n"
                "  - name: open\n    capability: embedding\n    base_url: %s\n%s"
                "  - name: limited\n    capability: chat\n    base_url: %s\n%s"
                "    limits: { rpm: %d, window_s: %s }\n"
                % (redis_url[0], prefix, redis_url[1], open_url, src, limited_url, src, rpm,
                   window))
    return path


def start_sidecars(polygw, d, n, procs, config_of, who, timeout=15.0):
    """n sidecars in `d` on the configs config_of(i) (paths), appended to
    `procs`; returns their sockets once each one's backend is up, or exits
    with the first one's log that did not come up within `timeout`."""
    socks = []
    for i in range(n):
        sock = os.path.join(d, "sc%d.sock" % i)
        log = open(os.path.join(d, "sc%d.log" % i), "w")
        procs.append(subprocess.Popen([polygw, "--config", config_of(i), "--socket", sock],
                                      stderr=log, env=dict(os.environ, no_proxy="*")))
        log.close()
        socks.append(sock)
    deadline = time.monotonic() + timeout
    for sock in socks:
        while True:
            try:
                err, st = rpc(sock, "stats")
                if err is None and st["backend"]["state"] == "up":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                with open(sock.replace(".sock", ".log")) as f:
                    sys.exit("%s: a sidecar did not come up:\n%s" % (who, f.read()[-2000:]))
            time.sleep(0.05)
    return socks


def stop_all(gens, procs):
    """Kills the load generators still running, then stops the sidecars
    (SIGTERM, SIGKILL after 10 s)."""
    for g in gens:
        if g.poll() is None:
            g.kill()
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--sidecars", type=int, default=8)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--open-clients", type=int, default=2)
    ap.add_argument("--limited-clients", type=int, default=1)
    ap.add_argument("--rpm", type=int, default=600)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--tls", action="store_true",
                    help="Redis over TLS only (certificates made with openssl)")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    polygw, loadgen = os.path.join(build, "polygw"), os.path.join(build, "bench", "loadgen")
    for exe in (polygw, loadgen):
        if not os.path.exists(exe):
            sys.exit("fleet_soak: %s missing (make first)" % exe)
    if not shutil.which("redis-server"):
        sys.exit("fleet_soak: redis-server not installed (make deps)")
    os.environ["POLYGW_BUILD"] = build
    d = tempfile.mkdtemp(prefix="pgw-soak-", dir="/tmp")
    procs, gens = [], []
    certs = Certs() if a.tls else None
    redis = TlsRedis(certs).start() if a.tls else RedisServer().start()
    if a.tls:
        url = ("rediss://localhost:%d/0" % redis.port,
               ", tls: { ca_file: \"%s\" }" % certs.path("ca.crt"))
    else:
        url = ("redis://127.0.0.1:%d/0" % redis.port, "")
    try:
        with MockUpstream() as up_open, MockUpstream() as up_lim:
            prefix = "soak%d" % os.getpid()
            socks = start_sidecars(polygw, d, a.sidecars, procs, lambda i: config(
                d, i, url, prefix, up_open.url, up_lim.url, a.rpm, a.window), "fleet_soak")

            body = {"model": "m", "input": "soak"}
            chat = {"model": "m", "messages": [{"role": "user", "content": "soak"}]}
            cpu0 = redis_cpu_s(redis)
            t0 = time.monotonic()
            for sock in socks:
                for cap, b, n in (("embedding", body, a.open_clients),
                                  ("chat", chat, a.limited_clients)):
                    if n <= 0:
                        continue
                    gens.append((cap, subprocess.Popen(
                        [loadgen, "--socket", sock, "--clients", str(n), "--duration",
                         str(a.duration), "--method", "call", "--timeout-ms", "120000",
                         "--params-json", json.dumps([{"capability": cap, "body": b}]), "--json"],
                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)))
            results = []
            for cap, g in gens:
                out, _ = g.communicate(timeout=a.duration + 180)
                results.append((cap, json.loads(out.decode().strip().splitlines()[-1])))
            t1 = time.monotonic()
            cpu1 = redis_cpu_s(redis)
            elapsed = t1 - t0
            n_open = up_open.stats()["requests"]
            n_lim = up_lim.stats()["requests"]
            rtt = []
            for sock in socks:
                err, st = rpc(sock, "stats")
                rtt.append((st["backend"]["rtt_avg_ms"], st["backend"]["rtt_max_ms"]))
    finally:
        stop_all([g for _, g in gens], procs)
        if a.tls:
            redis.cleanup()
            certs.cleanup()
        else:
            redis.stop()
        shutil.rmtree(d, ignore_errors=True)

    opened = [r for cap, r in results if cap == "embedding"]
    errors = sum(r["errors"] for _, r in results)
    ok_open = sum(r["ok"] for r in opened)
    # The open calls' latency: the slowest sidecar's percentile (each
    # loadgen keeps its own histogram; the fleet's p99 is at most this).
    p50 = max(r["p50_us"] for r in opened) if opened else 0
    p99 = max(r["p99_us"] for r in opened) if opened else 0
    cpu = cpu1 - cpu0
    attempts = n_open + n_lim
    rate = a.rpm / a.window
    bound = a.rpm + rate * elapsed
    print("| sidecars | Redis | seconds | admitted attempts/s | open calls ok | call p50 ms | call p99 ms "
          "| Redis RTT avg / max ms | redis-server CPU % of a core | redis-server CPU µs / attempt "
          "| limited: admitted / bound (capacity + rate x time) | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("| %d | %s | %.1f | %.0f | %d | %.2f | %.2f | %.2f / %.1f | %.0f | %.1f | %d / %.0f (%.3f) | %d |"
          % (a.sidecars, "TLS" if a.tls else "plain", elapsed, attempts / elapsed, ok_open, p50 / 1e3, p99 / 1e3,
             sum(x[0] for x in rtt) / len(rtt), max(x[1] for x in rtt), 100 * cpu / elapsed,
             1e6 * cpu / attempts if attempts else 0, n_lim, bound, n_lim / bound, errors))
    print("\nlimited source: rpm %d per %gs window (capacity %d, %.2f/s) across the fleet; "
          "%s" % (a.rpm, a.window, a.rpm, rate,
                  "held" if n_lim <= bound else "EXCEEDED by %.0f" % (n_lim - bound)))
    return 0 if n_lim <= bound and errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Real Redis topologies on loopback for the fleet tests: a Sentinel set
(one primary, one replica, N redis-sentinels) and a TLS redis-server with
a CA and certificates made by `openssl` for the test.

Every process gets a free 127.0.0.1 port and a temp directory, and is
SIGKILLed at cleanup; every wait is bounded.
"""
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile

import pytest

from redis_fixture import RedisError, Resp, free_port, wait_until


def _need(exe, pkg):
    if not shutil.which(exe):
        pytest.skip("%s not installed (make deps installs %s)" % (exe, pkg))


class TlsResp(Resp):
    """Resp over TLS, verifying the server against the test CA."""

    def __init__(self, port, cafile, timeout=5.0):
        ctx = ssl.create_default_context(cafile=cafile)
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock = ctx.wrap_socket(raw, server_hostname="localhost")
        self.buf = b""


class Proc:
    """One redis-server or redis-sentinel on its own port and directory;
    `certs` (a Certs) when it speaks TLS only, `password` when it wants AUTH."""

    def __init__(self, base, name, argv_tail, port=None, conf=None, ready=None, certs=None,
                 password=None):
        self.name = name
        self.dir = os.path.join(base, name)
        os.makedirs(self.dir, exist_ok=True)
        self.port = port or free_port()
        self.argv_tail = argv_tail
        self.conf = conf
        self.ready = ready
        self.certs = certs
        self.password = password
        self.proc = None

    def start(self, timeout=5.0):
        log = open(os.path.join(self.dir, "log"), "a")
        argv = list(self.argv_tail(self))
        try:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.dir)
        finally:
            log.close()
        ok = wait_until(lambda: self.proc.poll() is None and self._answers(), timeout, 0.02)
        if not ok:
            raise RuntimeError("%s did not start: %s" % (self.name, self.logs()[-2000:]))
        return self

    def _answers(self):
        if self.ready:
            return self.ready(self)
        try:
            c = self.client(timeout=1)
            try:
                return c.call("PING") == "PONG"
            finally:
                c.close()
        except (OSError, RedisError, ssl.SSLError):
            return False

    def client(self, timeout=2.0):
        c = TlsResp(self.port, self.certs.path("ca.crt"), timeout) if self.certs else \
            Resp(self.port, timeout=timeout)
        if self.password:
            c.call("AUTH", self.password)
        return c

    def call(self, *args):
        c = self.client()
        try:
            return c.call(*args)
        finally:
            c.close()

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)

    def logs(self):
        try:
            with open(os.path.join(self.dir, "log")) as f:
                return f.read()
        except OSError:
            return ""


def _server_argv(port, d, extra=(), certs=None):
    listen = ["--port", str(port)] if not certs else \
        ["--port", "0", "--tls-port", str(port)] + _tls_args(certs, "--")
    return [shutil.which("redis-server")] + listen + [
        "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no",
        "--dir", d] + list(extra)


def _tls_args(certs, dash):
    """TLS settings for a server or sentinel, as arguments or config lines."""
    kv = [("tls-cert-file", certs.path("server.crt")), ("tls-key-file", certs.path("server.key")),
          ("tls-ca-cert-file", certs.path("ca.crt")), ("tls-replication", "yes"),
          ("tls-auth-clients", "no")]
    if dash:
        return [x for k, v in kv for x in ("--" + k, v)]
    return ["%s %s" % (k, v) for k, v in kv]


class SentinelSet:
    """A primary, a replica of it, and `n` sentinels monitoring it as
    `master` with quorum `quorum`, down-after-milliseconds `down_after_ms`,
    failover-timeout `failover_timeout_ms`."""

    def __init__(self, n=3, quorum=2, master="mymaster", down_after_ms=1000,
                 failover_timeout_ms=3000, server_extra=(), sentinel_lines=(), certs=None,
                 sentinel_password=None):
        _need("redis-server", "redis-server")
        _need("redis-sentinel", "redis-sentinel")
        self.base = tempfile.mkdtemp(prefix="pgw-sentinel-")
        self.master = master
        self.certs = certs
        self.server_extra = list(server_extra)
        self.primary = Proc(self.base, "primary",
                            lambda p: _server_argv(p.port, p.dir, self.server_extra, certs),
                            certs=certs)
        self.replica = Proc(self.base, "replica",
                            lambda p: _server_argv(p.port, p.dir, self.server_extra + [
                                "--replicaof", "127.0.0.1", str(self.primary.port)], certs),
                            certs=certs)
        self.sentinels = []
        if sentinel_password:   # the sentinels use it with each other too
            sentinel_lines = list(sentinel_lines) + ["requirepass %s" % sentinel_password]
        for i in range(n):
            s = Proc(self.base, "sentinel%d" % i, self._sentinel_argv, certs=certs,
                     password=sentinel_password)
            s.quorum, s.down_after_ms, s.failover_timeout_ms = (quorum, down_after_ms,
                                                                failover_timeout_ms)
            s.lines = list(sentinel_lines)
            self.sentinels.append(s)

    def _sentinel_argv(self, s):
        conf = os.path.join(s.dir, "sentinel.conf")
        if not os.path.exists(conf):   # a sentinel rewrites its own file: written once
            with open(conf, "w") as f:
                if self.certs:
                    f.write("port 0\ntls-port %d\n%s\n" % (s.port,
                                                          "\n".join(_tls_args(self.certs, ""))))
                else:
                    f.write("port %d\n" % s.port)
                f.write("bind 127.0.0.1\ndaemonize no\ndir %s\n" % s.dir)
                f.write("sentinel monitor %s 127.0.0.1 %d %d\n"
                        % (self.master, self.primary.port, s.quorum))
                f.write("sentinel down-after-milliseconds %s %d\n" % (self.master, s.down_after_ms))
                f.write("sentinel failover-timeout %s %d\n" % (self.master, s.failover_timeout_ms))
                f.write("sentinel parallel-syncs %s 1\n" % self.master)
                for line in s.lines:
                    f.write(line + "\n")
        return [shutil.which("redis-sentinel"), conf]

    def start(self, timeout=15.0):
        self.primary.start()
        self.replica.start()
        for s in self.sentinels:
            s.start()
        n = len(self.sentinels)

        def settled():
            for s in self.sentinels:
                try:
                    m = self._master_info(s)
                except (OSError, RedisError, ssl.SSLError):
                    return False
                if int(m.get("num-other-sentinels", 0)) != n - 1 or int(m.get("num-slaves", 0)) < 1:
                    return False
            return self._replica_synced()
        if not wait_until(settled, timeout, 0.1):
            raise RuntimeError("the sentinels did not find each other and the replica in %ss"
                               % timeout)
        return self

    def _replica_synced(self):
        role = self.replica.call("ROLE")
        return role[0] == "slave" and role[3] == "connected"

    def _master_info(self, s):
        flat = s.call("SENTINEL", "MASTER", self.master)
        return dict(zip(flat[0::2], flat[1::2]))

    def addresses(self):
        return ["127.0.0.1:%d" % s.port for s in self.sentinels]

    def primary_port(self, s=None):
        """The primary's port as sentinel `s` (default the first alive) names it."""
        for s in ([s] if s else self.sentinels):
            if s.proc and s.proc.poll() is None:
                try:
                    return int(s.call("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master)[1])
                except (OSError, RedisError, ssl.SSLError):
                    continue
        return None

    def cleanup(self):
        for p in self.sentinels + [self.replica, self.primary]:
            p.kill()
        shutil.rmtree(self.base, ignore_errors=True)


# ------------------------------------------------------------------- TLS
def _openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE, timeout=30)


class Certs:
    """A CA, a server certificate for `names` (DNS names and IP
    addresses) signed by it, a client certificate, and an unrelated CA:
    all PEM files in one temp directory."""

    def __init__(self, names=("localhost", "127.0.0.1")):
        _need("openssl", "openssl")
        self.dir = tempfile.mkdtemp(prefix="pgw-certs-")
        d = self.dir
        for ca in ("ca", "other-ca"):
            _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                     "-subj", "/CN=polygw test %s" % ca, "-keyout", ca + ".key", "-out",
                     ca + ".crt", cwd=d)
        san = ",".join(("IP:%s" if n.replace(".", "").isdigit() else "DNS:%s") % n
                       for n in names)
        with open(os.path.join(d, "server.ext"), "w") as f:
            f.write("subjectAltName=%s\nextendedKeyUsage=serverAuth\n" % san)
        with open(os.path.join(d, "client.ext"), "w") as f:
            f.write("extendedKeyUsage=clientAuth\n")
        for who in ("server", "client"):
            _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=%s" % who,
                     "-keyout", who + ".key", "-out", who + ".csr", cwd=d)
            _openssl("x509", "-req", "-in", who + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                     "-CAcreateserial", "-days", "2", "-extfile", who + ".ext",
                     "-out", who + ".crt", cwd=d)

    def path(self, name):
        return os.path.join(self.dir, name)

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)


class TlsRedis:
    """redis-server with TLS only (`--port 0`), the server certificate of
    `certs`; `auth_clients` asks for a client certificate."""

    def __init__(self, certs, auth_clients=False, extra=()):
        _need("redis-server", "redis-server")
        self.certs = certs
        self.base = tempfile.mkdtemp(prefix="pgw-tls-redis-")
        tls = ["--port", "0", "--tls-port", None, "--tls-cert-file", certs.path("server.crt"),
               "--tls-key-file", certs.path("server.key"), "--tls-ca-cert-file",
               certs.path("ca.crt"), "--tls-auth-clients", "yes" if auth_clients else "no"]
        self.proc = Proc(self.base, "redis", self._argv, ready=self._ready)
        self.tls = tls
        self.extra = list(extra)

    def _argv(self, p):
        tls = [str(p.port) if a is None else a for a in self.tls]
        argv = _server_argv(p.port, p.dir, self.extra)
        i = argv.index("--port")
        del argv[i:i + 2]
        return argv + tls

    def _ready(self, p):
        r = subprocess.run(self.cli() + ["PING"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, timeout=5)
        return r.stdout.strip() == b"PONG"

    def cli(self):
        c = self.certs
        return ["redis-cli", "-h", "127.0.0.1", "-p", str(self.proc.port), "--tls",
                "--cacert", c.path("ca.crt"), "--cert", c.path("client.crt"),
                "--key", c.path("client.key")]

    @property
    def port(self):
        return self.proc.port

    def start(self):
        self.proc.start()
        return self

    def cleanup(self):
        self.proc.kill()
        shutil.rmtree(self.base, ignore_errors=True)


# ---------------------------------------------------------- a fake sentinel
class FakeSentinel:
    """A scriptable stand-in for redis-sentinel, speaking just what a client
    uses: AUTH, PING, SENTINEL get-master-addr-by-name (answering `primary`,
    a (host, port) or None for "unknown master"), SUBSCRIBE. publish()
    sends a pub/sub message to every subscriber. Counts the questions."""

    def __init__(self, master="mymaster"):
        import socketserver
        import threading
        self.master = master
        self.primary = None
        self.asked = 0
        self.subscribers = []
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()   # one frame at a time on any socket
        fake = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                f = self.request.makefile("rb")
                try:
                    while True:
                        args = fake._read_command(f)
                        if args is None:
                            return
                        reply = fake._answer(self.request, args)
                        with fake.send_lock:
                            self.request.sendall(reply)
                except (OSError, ValueError):
                    return
                finally:
                    with fake.lock:
                        if self.request in fake.subscribers:
                            fake.subscribers.remove(self.request)

        class Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def _read_command(f):
        line = f.readline()
        if not line:
            return None
        if not line.startswith(b"*"):
            raise ValueError("not a RESP array")
        args = []
        for _ in range(int(line[1:])):
            n = int(f.readline()[1:])
            args.append(f.read(n + 2)[:-2].decode())
        return args

    @staticmethod
    def _bulk(s):
        s = str(s).encode()
        return b"$%d\r\n%s\r\n" % (len(s), s)

    def _answer(self, sock, args):
        cmd = args[0].upper()
        if cmd == "AUTH":
            return b"+OK\r\n"
        if cmd == "PING":
            return b"+PONG\r\n"
        if cmd == "SENTINEL" and len(args) == 3 and args[1].lower() == "get-master-addr-by-name":
            with self.lock:
                self.asked += 1
                p = self.primary if args[2] == self.master else None
            if not p:
                return b"*-1\r\n"
            return b"*2\r\n" + self._bulk(p[0]) + self._bulk(p[1])
        if cmd == "SUBSCRIBE":
            with self.lock:
                if sock not in self.subscribers:
                    self.subscribers.append(sock)
            return b"".join(b"*3\r\n" + self._bulk("subscribe") + self._bulk(ch) + b":1\r\n"
                            for ch in args[1:])
        return b"-ERR unknown command\r\n"

    def publish(self, channel, msg):
        frame = b"*3\r\n" + self._bulk("message") + self._bulk(channel) + self._bulk(msg)
        with self.lock:
            subs = list(self.subscribers)
        for s in subs:
            try:
                with self.send_lock:
                    s.sendall(frame)
            except OSError:
                pass
        return len(subs)

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        with self.lock:
            for s in self.subscribers:
                try:
                    s.close()
                except OSError:
                    pass

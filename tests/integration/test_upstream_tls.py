"""Per-source TLS and proxies (docs/CONFIG.md §7c): a source's `tls`
(ca_file, cert_file + key_file, server_name), `proxy` and `no_proxy`.

The upstream is the real mock behind a TLS terminator written here (Python's
ssl module, a thread per connection, bytes pumped both ways), which can ask
for a client certificate and records what each handshake presented: the SNI
name and the client certificate's subject. Certificates come from a private
CA made by `openssl` for the test (fleet_topology.Certs); the system store
does not trust it, so a call that succeeds proves the source's ca_file was
used. The proxy is a small CONNECT / absolute-form forward proxy, also
written here, that records what it was asked for. Loopback only; every
wait is bounded.
"""
import os
import select
import socket
import ssl
import sys
import threading

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import Pending, call, chat, config_yaml, source_yaml  # noqa: E402
from fleet_topology import Certs  # noqa: E402

DEFAULTS = {"max_attempts": 1}
NO_PROXY_ENV = {"no_proxy": "", "NO_PROXY": "", "https_proxy": "", "http_proxy": "",
                "HTTPS_PROXY": "", "ALL_PROXY": "", "all_proxy": ""}


def pump(a, b):
    """Copies bytes both ways until either side closes."""
    socks = [a, b]
    try:
        while True:
            r, _, _ = select.select(socks, [], [], 10)
            if not r:
                return
            for s in r:
                data = s.recv(65536)
                if not data:
                    return
                (b if s is a else a).sendall(data)
    except OSError:
        return
    finally:
        for s in socks:
            try:
                s.close()
            except OSError:
                pass


class Server:
    """A listening socket on 127.0.0.1 served by a thread; subclasses
    implement handle(conn)."""

    def __init__(self):
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.lock = threading.Lock()
        self.stopping = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.stopping:
            try:
                conn, _ = self.lsock.accept()
            except OSError:
                return
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def close(self):
        self.stopping = True
        self.lsock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class TlsFront(Server):
    """TLS 1.2+ in front of the mock at `backend_port`, with `certs`'s
    server certificate; `client` is "none", "optional" (asks for a client
    certificate, verified against the CA when one is sent) or "required". `handshakes` lists (sni, client subject CN or
    None) per completed handshake; `failures` counts refused ones."""

    def __init__(self, certs, backend_port, client="none"):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(certs.path("server.crt"), certs.path("server.key"))
        if client != "none":
            ctx.verify_mode = ssl.CERT_REQUIRED if client == "required" else ssl.CERT_OPTIONAL
            ctx.load_verify_locations(certs.path("ca.crt"))
        ctx.sni_callback = self._on_sni
        self.ctx = ctx
        self.backend_port = backend_port
        self.handshakes = []
        self.failures = 0
        super().__init__()

    @staticmethod
    def _on_sni(sslsock, name, _ctx):
        sslsock.pgw_sni = name

    def handle(self, conn):
        conn.settimeout(5)
        try:
            t = self.ctx.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            with self.lock:
                self.failures += 1
            conn.close()
            return
        peer = t.getpeercert()
        cn = None
        if peer:
            cn = dict(x[0] for x in peer["subject"]).get("commonName")
        with self.lock:
            self.handshakes.append((getattr(t, "pgw_sni", None), cn))
        t.settimeout(None)
        pump(t, socket.create_connection(("127.0.0.1", self.backend_port), timeout=5))


class ForwardProxy(Server):
    """An HTTP proxy: CONNECT host:port (a tunnel) and absolute-form
    requests (forwarded in origin form on a new connection). `asked`
    lists the CONNECT targets and absolute URLs, in order."""

    def __init__(self):
        self.asked = []
        super().__init__()

    def handle(self, conn):
        conn.settimeout(5)
        head = b""
        while b"\r\n\r\n" not in head:
            d = conn.recv(4096)
            if not d:
                conn.close()
                return
            head += d
        line, rest = head.split(b"\r\n", 1)
        method, target, version = line.decode().split(" ")
        with self.lock:
            self.asked.append("%s %s" % (method, target))
        if method == "CONNECT":
            host, port = target.rsplit(":", 1)
            up = socket.create_connection((host, int(port)), timeout=5)
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            conn.settimeout(None)
            pump(conn, up)
            return
        hostport = target.split("://", 1)[1].split("/", 1)[0]
        path = "/" + target.split("://", 1)[1].split("/", 1)[1]
        host, port = hostport.rsplit(":", 1)
        up = socket.create_connection((host, int(port)), timeout=5)
        up.sendall(("%s %s %s\r\n" % (method, path, version)).encode() + rest)
        conn.settimeout(None)
        pump(conn, up)


@pytest.fixture(scope="module")
def certs():
    c = Certs(names=("localhost", "127.0.0.1", "api.example.test"))
    yield c
    c.cleanup()


def start(make_sidecar, sources, subdir=None):
    return make_sidecar(config_text=config_yaml(sources, DEFAULTS), env=NO_PROXY_ENV,
                        subdir=subdir)


def one_call(sc):
    c = sc.connect()
    try:
        err, res, _ = call(c, "chat", chat("hi"), 8)
        return err, res
    finally:
        c.close()


def test_tls__private_ca_file_is_trusted_by_host_name(certs, up, make_sidecar):
    with TlsFront(certs, up.port) as front:
        sc = start(make_sidecar, [source_yaml(
            "a", "chat", "https://localhost:%d/v1" % front.port, {},
            tls={"ca_file": certs.path("ca.crt")})])
        for _ in range(3):
            err, res = one_call(sc)
            assert err is None, err
        assert up.stats()["requests"] == 3
        # Three calls, one connection: kept alive, one handshake, SNI sent.
        assert front.handshakes == [("localhost", None)]


def read_bytes(pid):
    """Bytes the process has read so far (files and sockets), /proc/PID/io."""
    for line in open("/proc/%d/io" % pid):
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/%d/io" % pid)


def test_tls__the_ca_bundle_is_parsed_once_not_per_connection(certs, up, make_sidecar, workdir):
    """Each new TLS connection used to read and parse the whole CA bundle
    again (libcurl skips its cached store while a CA directory is set, and
    Debian's libcurl sets one): a few hundred streams opening connections
    at once spent seconds of CPU on it. 16 concurrent calls open 16
    connections; the bundle, made large here (the system bundle plus the
    test CA), is read at most once for all of them."""
    bundle = os.path.join(workdir, "bundle.pem")
    system = "/etc/ssl/certs/ca-certificates.crt"
    with open(bundle, "w") as out:
        if os.path.exists(system):
            out.write(open(system).read())
        out.write(open(certs.path("ca.crt")).read() * (1 if os.path.exists(system) else 200))
    size = os.path.getsize(bundle)
    with TlsFront(certs, up.port) as front:
        sc = start(make_sidecar, [source_yaml(
            "a", "chat", "https://localhost:%d/v1" % front.port,
            {"max_concurrency": 64, "aimd": {"initial": 64}}, tls={"ca_file": bundle})])
        assert one_call(sc)[0] is None       # the first connection reads it once
        before = read_bytes(sc.proc.pid)
        calls = [Pending(sc, "chat", chat("c%d" % i, mock={"delay_ms": 300})) for i in range(16)]
        for p in calls:
            err, _ = p.wait(10)
            assert err is None, err
        grown = read_bytes(sc.proc.pid) - before
        assert len(front.handshakes) >= 16, front.handshakes
        assert grown < size, "read %d bytes for 16 connections; the bundle is %d" % (grown, size)


def test_tls__without_the_ca_file_the_private_ca_is_refused(certs, up, make_sidecar):
    with TlsFront(certs, up.port) as front:
        sc = start(make_sidecar, [source_yaml(
            "a", "chat", "https://localhost:%d/v1" % front.port, {})])
        err, _ = one_call(sc)
        assert err is not None
        assert up.stats()["requests"] == 0
        # Another CA's file is no better.
        sc2 = start(make_sidecar, [source_yaml(
            "a", "chat", "https://localhost:%d/v1" % front.port, {},
            tls={"ca_file": certs.path("other-ca.crt")})], subdir="second")
        err, _ = one_call(sc2)
        assert err is not None
        assert up.stats()["requests"] == 0
        assert front.handshakes == []


def test_tls__client_certificate_for_an_mtls_upstream(certs, up, make_sidecar):
    with TlsFront(certs, up.port, client="required") as front:
        url = "https://localhost:%d/v1" % front.port
        sc = start(make_sidecar, [
            source_yaml("with-cert", "chat", url, {"priority": 0},
                        tls={"ca_file": certs.path("ca.crt"),
                             "cert_file": certs.path("client.crt"),
                             "key_file": certs.path("client.key")})])
        err, res = one_call(sc)
        assert err is None, err
        assert front.handshakes == [("localhost", "client")]
        # The same upstream without a certificate: the handshake is refused.
        sc2 = start(make_sidecar, [source_yaml(
            "no-cert", "chat", url, {}, tls={"ca_file": certs.path("ca.crt")})], subdir="second")
        err, _ = one_call(sc2)
        assert err is not None, (front.handshakes, front.failures)
        assert up.stats()["requests"] == 1


def test_tls__two_sources_on_one_host_never_share_a_connection(certs, up, make_sidecar):
    """A connection made with one source's client certificate is not reused
    for a source on the same host that has none: libcurl tells them apart."""
    with TlsFront(certs, up.port, client="optional") as front:
        url = "https://localhost:%d/v1" % front.port
        text = config_yaml([
            source_yaml("a", "chat", url, {},
                        tls={"ca_file": certs.path("ca.crt"),
                             "cert_file": certs.path("client.crt"),
                             "key_file": certs.path("client.key")}),
            source_yaml("b", "chat2", url, {}, tls={"ca_file": certs.path("ca.crt")}),
        ], DEFAULTS, capabilities={"chat2": {"path": "/chat/completions"}})
        sc = make_sidecar(config_text=text, env=NO_PROXY_ENV)
        c = sc.connect()
        try:
            for cap in ("chat", "chat2", "chat", "chat2"):
                err, res, _ = call(c, cap, chat("hi"), 8)
                assert err is None, err
        finally:
            c.close()
        assert up.stats()["requests"] == 4
        assert sorted(front.handshakes, key=repr) == [("localhost", "client"),
                                                      ("localhost", None)]


def test_tls__server_name_sets_sni_and_the_checked_name(certs, up, make_sidecar):
    with TlsFront(certs, up.port) as front:
        # The URL names 127.0.0.1; the certificate is checked against (and
        # SNI carries) api.example.test, and the connection still goes to
        # 127.0.0.1.
        sc = start(make_sidecar, [source_yaml(
            "a", "chat", "https://127.0.0.1:%d/v1" % front.port, {},
            tls={"ca_file": certs.path("ca.crt"), "server_name": "api.example.test"})])
        err, res = one_call(sc)
        assert err is None, err
        assert front.handshakes == [("api.example.test", None)]
        assert up.last()["headers"]["host"].startswith("api.example.test")
        # A name the certificate does not carry is refused.
        sc2 = start(make_sidecar, [source_yaml(
            "a", "chat", "https://127.0.0.1:%d/v1" % front.port, {},
            tls={"ca_file": certs.path("ca.crt"), "server_name": "other.example.test"})],
            subdir="second")
        err, _ = one_call(sc2)
        assert err is not None
        assert up.stats()["requests"] == 1


def test_proxy__https_source_tunnels_through_its_proxy(certs, up, make_sidecar):
    front = TlsFront(certs, up.port)
    with ForwardProxy() as proxy:
        sc = start(make_sidecar, [source_yaml(
            "a", "chat", "https://localhost:%d/v1" % front.port, {},
            tls={"ca_file": certs.path("ca.crt")},
            proxy="http://127.0.0.1:%d" % proxy.port)])
        err, res = one_call(sc)
        assert err is None, err
        assert proxy.asked == ["CONNECT localhost:%d" % front.port]
        assert front.handshakes == [("localhost", None)]
        proxy.close()


def test_proxy__plain_ip_source_goes_through_its_proxy_not_the_own_client(up, make_sidecar):
    with ForwardProxy() as proxy:
        sc = start(make_sidecar, [source_yaml(
            "a", "chat", up.url, {}, proxy="http://127.0.0.1:%d" % proxy.port)])
        err, res = one_call(sc)
        assert err is None, err
        assert len(proxy.asked) == 1
        assert proxy.asked[0].startswith("POST http://127.0.0.1:%d/" % up.port)


def test_proxy__no_proxy_bypasses_it(up, make_sidecar):
    with ForwardProxy() as proxy:
        sc = start(make_sidecar, [source_yaml(
            "a", "chat", up.url, {}, proxy="http://127.0.0.1:%d" % proxy.port,
            no_proxy="127.0.0.1")])
        err, res = one_call(sc)
        assert err is None, err
        assert proxy.asked == []
        assert up.stats()["requests"] == 1


@pytest.mark.parametrize("tls, proxy, base, message", [
    ({"ca_file": "/nonexistent/ca.pem"}, None, "https", "tls.ca_file: cannot read"),
    ({"ca_file": "CERT:server.key"}, None, "https", "cannot load the CA file"),
    ({"cert_file": "CERT:client.crt"}, None, "https", "tls.key_file: is required"),
    ({"cert_file": "CERT:client.crt", "key_file": "CERT:server.key"}, None, "https",
     "cannot load the key"),
    ({"ca_file": "CERT:ca.crt"}, None, "http", "only valid with an https:// base_url"),
    ({"server_name": "bad name"}, None, "https", "must be a DNS host name"),
    ({}, "ftp://127.0.0.1:1", "https", "proxy: must start with"),
    ({}, "http://", "https", "proxy: has no host"),
])
def test_config__bad_tls_and_proxy_are_load_errors(certs, make_sidecar, workdir, tls, proxy,
                                                    base, message):
    import subprocess
    tls = {k: certs.path(v[5:]) if v.startswith("CERT:") else v for k, v in tls.items()}
    kw = {}
    if tls:
        kw["tls"] = tls
    if proxy:
        kw["proxy"] = proxy
    text = config_yaml([source_yaml("a", "chat", "%s://localhost:1/v1" % base, {}, **kw)],
                       DEFAULTS)
    path = os.path.join(workdir, "bad.yaml")
    with open(path, "w") as f:
        f.write(text)
    binary = os.path.join(os.environ.get("POLYGW_BUILD", "build"), "polygw")
    r = subprocess.run([binary, "--check-config", path], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=10)
    assert r.returncode == 1
    out = (r.stdout + r.stderr).decode()
    assert message in out, out

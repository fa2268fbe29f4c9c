"""Per-source TLS and proxies (docs/CONFIG.md §7c): a source's `tls`
(ca_file, cert_file + key_file, server_name), `proxy` and `no_proxy`.
Each TLS behaviour runs once per `server.upstream_client` setting (`auto`:
polygw's own client carries https:// without a proxy, `libcurl`), and both
must give the same typed outcome.

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
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import Pending, call, chat, config_yaml, source_yaml  # noqa: E402
from fleet_topology import Certs  # noqa: E402
from test_upstream_client import call_stream, streamed_text  # noqa: E402

DEFAULTS = {"max_attempts": 1}
CLIENTS = ("auto", "libcurl")
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

    def __init__(self, certs, backend_port, client="none", alpn=("http/1.1",)):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(certs.path("server.crt"), certs.path("server.key"))
        ctx.set_alpn_protocols(list(alpn))
        if client != "none":
            ctx.verify_mode = ssl.CERT_REQUIRED if client == "required" else ssl.CERT_OPTIONAL
            ctx.load_verify_locations(certs.path("ca.crt"))
        ctx.sni_callback = self._on_sni
        self.ctx = ctx
        self.backend_port = backend_port
        self.handshakes = []
        self.resumed = 0
        self.alpn = []
        self.failures = 0
        super().__init__()

    @staticmethod
    def _on_sni(sslsock, name, _ctx):
        sslsock.pgw_sni = name

    def handle(self, conn):
        conn.settimeout(5)
        raw = conn.dup()  # stays open whatever becomes of the TLS socket
        try:
            t = self.ctx.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            with self.lock:
                self.failures += 1
            # As a server does: what the client still sends is read (for at
            # most 2 s) before closing, so the alert just sent is not lost
            # to a reset.
            raw.settimeout(2)
            try:
                while raw.recv(65536):
                    pass
            except OSError:
                pass
            raw.close()
            conn.close()
            return
        raw.close()
        peer = t.getpeercert()
        cn = None
        if peer:
            cn = dict(x[0] for x in peer["subject"]).get("commonName")
        with self.lock:
            self.handshakes.append((getattr(t, "pgw_sni", None), cn))
            self.resumed += t.session_reused
            self.alpn.append(t.selected_alpn_protocol())
        t.settimeout(None)
        pump(t, socket.create_connection(("127.0.0.1", self.backend_port), timeout=5))


class ForwardProxy(Server):
    """An HTTP proxy: CONNECT host:port (a tunnel) and absolute-form
    requests (forwarded in origin form on a new connection). `asked`
    lists the CONNECT targets and absolute URLs, in order."""

    def __init__(self, refuse=None):
        self.asked = []
        self.refuse = refuse  # a status line to answer every request with
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
        if self.refuse:
            conn.sendall(b"HTTP/1.1 " + self.refuse.encode() + b"\r\n"
                         b"Proxy-Authenticate: Basic realm=\"egress\"\r\n"
                         b"Content-Length: 0\r\n\r\n")
            conn.close()
            return
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


class Hostile(Server):
    """A TLS upstream that misbehaves before the handshake ends: `mode` is
    "close" (reads the ClientHello, then closes), "hang" (reads it and
    never answers) or "garbage" (answers it with bytes that are no TLS
    record). `hellos` counts the ClientHellos read."""

    def __init__(self, mode):
        self.mode = mode
        self.hellos = 0
        self.conns = []
        super().__init__()

    def handle(self, conn):
        conn.settimeout(10)
        try:
            if conn.recv(5):
                with self.lock:
                    self.hellos += 1
                    self.conns.append(conn)
            if self.mode == "garbage":
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n" * 40)
                conn.recv(65536)
            elif self.mode == "hang":
                while conn.recv(65536):
                    pass
        except OSError:
            pass
        conn.close()


@pytest.fixture(params=CLIENTS)
def client(request):
    return request.param


def start(make_sidecar, sources, subdir=None, client="auto"):
    text = config_yaml(sources, DEFAULTS)
    text = text.replace("server:\n", "server:\n  upstream_client: %s\n" % client, 1)
    return make_sidecar(config_text=text, env=NO_PROXY_ENV, subdir=subdir)


def one_call(sc, timeout=8, **mock):
    c = sc.connect()
    try:
        err, res, _ = call(c, "chat", chat("hi", mock=mock or None), timeout)
        return err, res
    finally:
        c.close()


def upstream_stats(sc):
    c = sc.connect()
    try:
        err, res = c.request("stats")
        assert err is None, err
        return res["upstream"]
    finally:
        c.close()


def reason(err):
    return err["sources"][0]["reason"]


def test_tls__private_ca_file_is_trusted_by_host_name(certs, up, make_sidecar, client):
    with TlsFront(certs, up.port) as front:
        sc = start(make_sidecar, [source_yaml(
            "a", "chat", "https://localhost:%d/v1" % front.port, {},
            tls={"ca_file": certs.path("ca.crt")})], client=client)
        for _ in range(3):
            err, res = one_call(sc)
            assert err is None, err
        assert up.stats()["requests"] == 3
        # Three calls, kept alive, SNI sent. By host name, libcurl makes the
        # first connection; with `auto` the own client then carries the next
        # calls on one connection of its own, to the address libcurl reached.
        own = 1 if client == "auto" else 0
        assert front.handshakes == [("localhost", None)] * (1 + own)
        assert upstream_stats(sc)["own_tls_handshakes"] == own


def read_bytes(pid):
    """Bytes the process has read so far (files and sockets), /proc/PID/io."""
    for line in open("/proc/%d/io" % pid):
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/%d/io" % pid)


def test_tls__the_ca_bundle_is_parsed_once_not_per_connection(certs, up, make_sidecar, workdir,
                                                               client):
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
            {"max_concurrency": 64, "aimd": {"initial": 64}}, tls={"ca_file": bundle})],
            client=client)
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


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_tls__client_certificate_for_an_mtls_upstream(certs, up, make_sidecar, client, host):
    with TlsFront(certs, up.port, client="required") as front:
        url = "https://%s:%d/v1" % (host, front.port)
        sc = start(make_sidecar, [
            source_yaml("with-cert", "chat", url, {"priority": 0},
                        tls={"ca_file": certs.path("ca.crt"),
                             "cert_file": certs.path("client.crt"),
                             "key_file": certs.path("client.key")})], client=client)
        err, res = one_call(sc)
        assert err is None, err
        assert front.handshakes == [(host if host == "localhost" else None, "client")]
        if client == "auto" and host == "127.0.0.1":
            assert upstream_stats(sc)["own_tls_handshakes"] == 1
        # The same upstream without a certificate: refused (in TLS 1.3 the
        # server's alert comes after the client's side of the handshake).
        sc2 = start(make_sidecar, [source_yaml(
            "no-cert", "chat", url, {}, tls={"ca_file": certs.path("ca.crt")})], subdir="second",
            client=client)
        err, _ = one_call(sc2)
        assert err is not None, (front.handshakes, front.failures)
        assert reason(err) in ("tls", "connection_reset"), err
        # The server's alert says why, by either client (never a bare
        # "Recv failure: Protocol error").
        assert "certificate required" in err["sources"][0]["detail"], err
        assert up.stats()["requests"] == 1


def test_tls__two_sources_on_one_host_never_share_a_connection(certs, up, make_sidecar, client):
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
        text = text.replace("server:\n", "server:\n  upstream_client: %s\n" % client, 1)
        sc = make_sidecar(config_text=text, env=NO_PROXY_ENV)
        c = sc.connect()
        try:
            for cap in ("chat", "chat2", "chat", "chat2"):
                err, res, _ = call(c, cap, chat("hi"), 8)
                assert err is None, err
        finally:
            c.close()
        assert up.stats()["requests"] == 4
        # Each source's first call by libcurl; with `auto` the own client
        # makes one connection of its own per source for the second.
        n = 2 if client == "auto" else 1
        assert sorted(front.handshakes, key=repr) == sorted(
            [("localhost", "client"), ("localhost", None)] * n, key=repr)


def test_tls__server_name_sets_sni_and_the_checked_name(certs, up, make_sidecar, client):
    with TlsFront(certs, up.port) as front:
        # The URL names 127.0.0.1; the certificate is checked against (and
        # SNI carries) api.example.test, and the connection still goes to
        # 127.0.0.1.
        sc = start(make_sidecar, [source_yaml(
            "a", "chat", "https://127.0.0.1:%d/v1" % front.port, {},
            tls={"ca_file": certs.path("ca.crt"), "server_name": "api.example.test"})],
            client=client)
        err, res = one_call(sc)
        assert err is None, err
        assert front.handshakes == [("api.example.test", None)]
        assert up.last()["headers"]["host"].startswith("api.example.test")
        # A name the certificate does not carry is refused.
        sc2 = start(make_sidecar, [source_yaml(
            "a", "chat", "https://127.0.0.1:%d/v1" % front.port, {},
            tls={"ca_file": certs.path("ca.crt"), "server_name": "other.example.test"})],
            subdir="second", client=client)
        err, _ = one_call(sc2)
        assert err is not None and reason(err) == "tls", err
        assert up.stats()["requests"] == 1
        if client == "auto":
            assert upstream_stats(sc)["own_tls_handshakes"] == 1
            assert upstream_stats(sc2)["own_connections_opened"] == 1


def ip_url(front):
    return "https://127.0.0.1:%d/v1" % front.port


def test_tls__verification_failures_are_typed_tls(certs, up, make_sidecar, client):
    """An IP-literal URL, so that the own client makes the first connection
    too: the system store, another CA and a name the certificate lacks are
    all refused before any request, as reason `tls`."""
    cases = [{}, {"ca_file": certs.path("other-ca.crt")},
             {"ca_file": certs.path("ca.crt"), "server_name": "other.example.test"}]
    with TlsFront(certs, up.port) as front:
        for i, tls in enumerate(cases):
            kw = {"tls": tls} if tls else {}
            sc = start(make_sidecar, [source_yaml("a", "chat", ip_url(front), {}, **kw)],
                       subdir="s%d" % i, client=client)
            err, _ = one_call(sc)
            assert err is not None and reason(err) == "tls", (tls, err)
            assert "certificate" in err["sources"][0]["detail"], err
            st = upstream_stats(sc)
            assert st["own_connections_opened"] == (1 if client == "auto" else 0), st
            assert st["own_tls_handshakes"] == 0, st
        # (libcurl checks the name after the handshake, the own client in it.)
        assert up.stats()["requests"] == 0


def test_tls__kept_alive_connection_is_reused_and_offers_http_1_1(certs, up, make_sidecar,
                                                                   client):
    with TlsFront(certs, up.port) as front:
        sc = start(make_sidecar, [source_yaml("a", "chat", ip_url(front), {},
                                              tls={"ca_file": certs.path("ca.crt")})],
                   client=client)
        for _ in range(6):
            err, res = one_call(sc)
            assert err is None, err
        assert up.stats()["requests"] == 6
        assert len(front.handshakes) == 1, front.handshakes
        assert front.alpn == ["http/1.1"]          # offered by ALPN, picked by the server
        if client == "auto":
            st = upstream_stats(sc)
            assert (st["own_tls_handshakes"], st["own_connections_reused"]) == (1, 5), st


def test_tls__the_own_client_never_offers_h2(certs, up, make_sidecar):
    """A server that prefers h2 still gets HTTP/1.1 from the own client."""
    with TlsFront(certs, up.port, alpn=["h2", "http/1.1"]) as front:
        sc = start(make_sidecar, [source_yaml("a", "chat", ip_url(front), {},
                                              tls={"ca_file": certs.path("ca.crt")})])
        err, res = one_call(sc)
        assert err is None, err
        assert front.alpn == ["http/1.1"]


def test_tls__a_new_connection_resumes_the_session(certs, up, make_sidecar, client):
    """The upstream closes after each answer: every call makes a new
    connection, and each after the first resumes the session the server
    handed out (an abbreviated handshake, counted by the server)."""
    with TlsFront(certs, up.port) as front:
        sc = start(make_sidecar, [source_yaml("a", "chat", ip_url(front), {},
                                              tls={"ca_file": certs.path("ca.crt")})],
                   client=client)
        for _ in range(4):
            err, res = one_call(sc, connection_close=True)
            assert err is None, err
        assert len(front.handshakes) == 4, front.handshakes
        assert front.resumed == 3
        if client == "auto":
            st = upstream_stats(sc)
            assert (st["own_tls_handshakes"], st["own_tls_resumed"]) == (4, 3), st


@pytest.mark.parametrize("mode, want, within", [
    ("close", "tls", 1.5), ("garbage", "tls", 1.5), ("hang", "connect_timeout", 2.5)])
def test_tls__upstream_breaking_the_handshake(certs, make_sidecar, client, mode, want, within):
    """The server closes after the ClientHello, answers it with bytes that
    are no TLS (an HTTP error page), or never answers it: a typed error,
    at once, or at the attempt's connect deadline (1 s) for the hang."""
    with Hostile(mode) as bad:
        sc = start(make_sidecar, [source_yaml(
            "a", "chat", "https://127.0.0.1:%d/v1" % bad.port,
            {"connect_timeout_s": 1, "ttft_timeout_s": 5, "timeout_s": 8},
            tls={"ca_file": certs.path("ca.crt")})], client=client)
        c = sc.connect()
        try:
            err, res, elapsed = call(c, "chat", chat("hi"), 10)
        finally:
            c.close()
        assert err is not None and reason(err) == want, err
        assert elapsed < within, (elapsed, err)
        assert bad.hellos == 1


def test_tls__a_stream_over_tls(certs, up, make_sidecar, client):
    text = "".join("w%03d \u00e9\u2713 " % i for i in range(400))
    with TlsFront(certs, up.port) as front:
        sc = start(make_sidecar, [source_yaml("a", "chat", ip_url(front), {},
                                              tls={"ca_file": certs.path("ca.crt")})],
                   client=client)
        c = sc.connect()
        try:
            for _ in range(2):
                err, res, chunks = call_stream(
                    c, chat(text, mock={"stream_events": 40, "stream_interval_ms": 5}))
                assert err is None, err
                assert streamed_text(chunks) == text
                assert len(chunks) >= 40
        finally:
            c.close()
        assert len(front.handshakes) == 1


@pytest.mark.timing
def test_tls__256_concurrent_streams_all_complete(certs, up, make_sidecar, client):
    n = 256
    with TlsFront(certs, up.port) as front:
        sc = start(make_sidecar, [source_yaml(
            "a", "chat", ip_url(front),
            {"max_concurrency": n, "aimd": {"initial": n}, "timeout_s": 30,
             "connect_timeout_s": 10, "ttft_timeout_s": 20},
            tls={"ca_file": certs.path("ca.crt")})], client=client)
        c = sc.connect(timeout=60)
        try:
            ids = {}
            for i in range(n):
                body = chat("s%d" % i, mock={"stream_events": 5, "stream_interval_ms": 20})
                ids[c.request_async("call", {"capability": "chat", "body": body,
                                             "stream": True})] = i
            texts = {i: "" for i in range(n)}
            done = {}
            deadline = time.monotonic() + 60
            while len(done) < n:
                msg = c.recv_msg(max(0.001, deadline - time.monotonic()))
                assert msg is not None, "%d of %d ended" % (len(done), n)
                if msg[0] == 2 and msg[1] == "chunk":
                    texts[ids[msg[2][0]]] += streamed_text([msg[2][1]])
                elif msg[0] == 1:
                    done[ids[msg[1]]] = msg[2]
        finally:
            c.close()
        failed = {i: e for i, e in done.items() if e is not None}
        assert not failed, list(failed.items())[:3]
        assert all(texts[i] == "s%d" % i for i in range(n))
        assert up.stats()["requests"] == n
        if client == "auto":
            st = upstream_stats(sc)
            assert st["own_tls_handshakes"] == len(front.handshakes), st


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


def test_proxy__the_proxys_answer_is_never_the_upstreams_status(certs, up, make_sidecar):
    """What the proxy answers to CONNECT is not the upstream's answer: a
    refused tunnel, or a tunnel whose TLS session the upstream refuses,
    reports no upstream status (the error's `status` is the upstream's
    last one, PROTOCOL.md 6.1), and the detail says what happened."""
    with ForwardProxy(refuse="407 Proxy Authentication Required") as proxy:
        # https:// (a tunnel) and http:// (the request in absolute form): a
        # proxy's 407 is the way failing, never the upstream's answer.
        for i, base in enumerate(("https://localhost:9/v1", up.url)):
            sc = start(make_sidecar, [source_yaml(
                "a", "chat", base, {}, proxy="http://127.0.0.1:%d" % proxy.port)],
                subdir="p%d" % i)
            err, _ = one_call(sc)
            assert err is not None and err["code"] == "retry_exhausted", err
            assert "status" not in err and reason(err) == "connect_failed", err
            assert "407" in err["sources"][0]["detail"], err
        assert len(proxy.asked) == 2, proxy.asked
    with TlsFront(certs, up.port, client="required") as front, ForwardProxy() as proxy:
        sc = start(make_sidecar, [source_yaml(
            "b", "chat", "https://localhost:%d/v1" % front.port, {},
            tls={"ca_file": certs.path("ca.crt")}, proxy="http://127.0.0.1:%d" % proxy.port)],
            subdir="second")
        err, _ = one_call(sc)
        assert err is not None and "status" not in err, err
        assert "certificate required" in err["sources"][0]["detail"], err
    assert up.stats()["requests"] == 0


def test_proxy__plain_ip_source_goes_through_its_proxy_not_the_own_client(up, make_sidecar):
    with ForwardProxy() as proxy:
        sc = start(make_sidecar, [source_yaml(
            "a", "chat", up.url, {}, proxy="http://127.0.0.1:%d" % proxy.port)])
        err, res = one_call(sc)
        assert err is None, err
        assert len(proxy.asked) == 1
        assert proxy.asked[0].startswith("POST http://127.0.0.1:%d/" % up.port)


@pytest.mark.parametrize("env_no_proxy", ["*", "127.0.0.1"])
def test_proxy__the_environments_no_proxy_never_bypasses_a_sources_proxy(up, make_sidecar,
                                                                         env_no_proxy):
    """A source's `proxy` is bypassed for the source's own `no_proxy` only:
    the environment's no_proxy (a pod's `*`, `127.0.0.1`, `.svc`) is for
    sources without a proxy of their own (docs/CONFIG.md 7c)."""
    with ForwardProxy() as proxy:
        text = config_yaml([source_yaml("a", "chat", up.url, {},
                                        proxy="http://127.0.0.1:%d" % proxy.port)], DEFAULTS)
        sc = make_sidecar(config_text=text, env=dict(NO_PROXY_ENV, no_proxy=env_no_proxy,
                                                     NO_PROXY=env_no_proxy))
        err, res = one_call(sc)
        assert err is None, err
        assert len(proxy.asked) == 1, proxy.asked
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
    ({"cert_file": "CERT:client.key", "key_file": "CERT:client.key"}, None, "https",
     "client.key: no PEM certificate in it"),
    ({"cert_file": "CERT:client.crt", "key_file": "CERT:client.crt"}, None, "https",
     "client.crt: no unencrypted PEM private key in it"),
    ({"ca_file": "CERT:ca.crt"}, None, "http", "only valid with an https:// base_url"),
    ({"server_name": "bad name"}, None, "https", "must be a DNS host name"),
    ({}, "ftp://127.0.0.1:1", "https", "proxy: must start with"),
    ({}, "http://", "https", "proxy: has no host"),
    ({}, "http://:3128", "https", "proxy: has no host"),
    ({}, "http://bob:pr0xyPASS@:3128", "https", "proxy: has no host"),
    ({}, "http://bob:pr0xyPASS@127.0.0.1:99999", "https", "proxy: port must be 1 to 65535"),
    ({}, "http://127.0.0.1:0", "https", "proxy: port must be 1 to 65535"),
    ({}, "http://127.0.0.1", "https", "proxy: needs its port"),
    ({}, "http://127.0.0.1:3128/foo", "https", "without a path"),
    ({}, "http://[::1", "https", "malformed [IPv6] host"),
    ({"cert_file": "CERT:client.crt", "key_file": "CERT:server.key"}, None, "https",
     "does not match the certificate"),
    ({"ca_file": "FIFO"}, None, "https", "tls.ca_file: "),
    ({"cert_file": "CERT:client.crt", "key_file": "FIFO"}, None, "https", "tls.key_file: "),
    ({"ca_file": "DIR"}, None, "https", "tls.ca_file: "),
])
def test_config__bad_tls_and_proxy_are_load_errors(certs, make_sidecar, workdir, tls, proxy,
                                                    base, message):
    import subprocess
    # A FIFO or a directory in place of a file is refused by its key, at
    # once: OpenSSL would open a FIFO blocking, until a writer came.
    fifo = os.path.join(workdir, "fifo.pem")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    special = {"FIFO": fifo, "DIR": workdir}
    not_a_file = "FIFO" in tls.values() or "DIR" in tls.values()
    tls = {k: certs.path(v[5:]) if v.startswith("CERT:") else special.get(v, v)
           for k, v in tls.items()}
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
    if not_a_file:
        assert "is not a regular file" in out, out
    assert "pr0xyPASS" not in out, out


def test_config__encrypted_key_is_a_load_error_not_a_prompt(certs, workdir):
    """key_file must be unencrypted: an encrypted one is refused by name at
    once, even with a terminal at hand, where OpenSSL would otherwise ask
    for its pass phrase and hold the start-up (or a reload) for ever."""
    import pty
    import subprocess
    key = os.path.join(workdir, "encrypted.key")
    subprocess.run(["openssl", "pkey", "-in", certs.path("client.key"), "-aes256",
                    "-passout", "pass:secret", "-out", key], check=True, timeout=10)
    text = config_yaml([source_yaml("a", "chat", "https://localhost:1/v1", {},
                                    tls={"cert_file": certs.path("client.crt"),
                                         "key_file": key})], DEFAULTS)
    path = os.path.join(workdir, "enc.yaml")
    with open(path, "w") as f:
        f.write(text)
    binary = os.path.join(os.environ.get("POLYGW_BUILD", "build"), "polygw")
    pid, fd = pty.fork()
    if pid == 0:  # the child: polygw on the terminal (stdin, stdout, stderr)
        os.execv(binary, [binary, "--check-config", path])
    out, deadline, status = b"", time.monotonic() + 10, None
    try:
        while time.monotonic() < deadline:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    data = os.read(fd, 4096)
                except OSError:  # the child closed the terminal
                    data = b""
                out += data
                if not data and status is not None:
                    break
            elif status is not None:
                break
    finally:
        if status is None:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(fd)
    text = out.decode(errors="replace")
    assert status is not None, "still running after 10 s: %r" % text
    assert os.waitstatus_to_exitcode(status) == 1, text
    assert "encrypted.key: no unencrypted PEM private key in it" in text, text
    assert "pass phrase" not in text.lower(), text

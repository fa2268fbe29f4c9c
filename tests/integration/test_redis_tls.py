"""The Redis backend over TLS and with ACL users: a real redis-server with
TLS only (`--port 0 --tls-port`), a CA and certificates made by `openssl`
for the test, a sidecar with a rediss:// URL and backend.tls
(docs/CONFIG.md, "backend"); and a real redis-server with an ACL user.

The sidecar starts without Redis (it fails closed and reconnects), so a
refused server shows in stats.backend (state, last_error) and the log,
and calls end with backend_unavailable. Only 127.0.0.1 is used; every wait
is bounded.
"""
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import call as call_on  # noqa: E402
from fleet_topology import Certs, TlsRedis  # noqa: E402
from redis_fixture import (FleetRedis, Resp, chat, fleet_config, free_port, source,  # noqa: E402
                           stats, unique_prefix, wait_backend, wait_until)

NO_PROXY = {"no_proxy": "*", "NO_PROXY": "*"}


@pytest.fixture(scope="module")
def certs():
    c = Certs(names=("localhost", "127.0.0.1"))
    yield c
    c.cleanup()


@pytest.fixture
def tls_redis(certs):
    srv = TlsRedis(certs).start()
    yield srv
    srv.cleanup()


def one_call(sc):
    c = sc.connect()
    try:
        err, res, _ = call_on(c, "chat", chat(), 5)
        return err, res
    finally:
        c.close()


def tls_sidecar(make_sidecar, up, url, tls, http=None, **backend):
    """`http`: the lines of an http section (its HTTP front), or None."""
    b = {"tls": tls, "command_timeout_s": 0.5, "lease_ttl_s": 3}
    b.update(backend)
    cfg = fleet_config(url, unique_prefix(), [source("a", "chat", up.url)], backend=b)
    if http:
        cfg += "http:\n" + http
    return make_sidecar(config_text=cfg, env=NO_PROXY)


def wait_refused(sc, text, timeout=5.0):
    """stats.backend once last_error holds `text` (the backend is not up)."""
    def check():
        b = stats(sc)["backend"]
        return b if text in b.get("last_error", "") else None
    b = wait_until(check, timeout, interval=0.05)
    assert b, "no '%s' in stats.backend: %r" % (text, stats(sc)["backend"])
    assert b["state"] != "up", b
    return b


def test_tls__rediss_with_a_ca_file_serves_calls(certs, tls_redis, up, make_sidecar):
    """rediss://localhost with the test CA: the backend comes up over TLS
    (stats.backend.tls), calls are admitted through it: that server ran the
    admission scripts (INFO commandstats, read with redis-cli --tls)."""
    sc = tls_sidecar(make_sidecar, up, "rediss://localhost:%d/0" % tls_redis.port,
                     {"ca_file": certs.path("ca.crt")})
    b = wait_backend(sc)
    assert b["tls"] is True and b["address"] == "localhost:%d" % tls_redis.port, b
    for _ in range(3):
        err, res = one_call(sc)
        assert err is None and res, err
    assert stats(sc)["backend"]["replies"] >= 3
    out = subprocess.run(tls_redis.cli() + ["INFO", "commandstats"],
                         stdout=subprocess.PIPE, timeout=5).stdout.decode()
    evalsha = [line for line in out.splitlines() if line.startswith("cmdstat_evalsha:")]
    assert evalsha and int(evalsha[0].split("calls=")[1].split(",")[0]) >= 3, out


def test_tls__client_certificate_and_ip_address(certs, up, make_sidecar):
    """A server that requires client certificates: with cert_file and
    key_file the sidecar is let in; the host is an IP literal, checked
    against the certificate's IP address. Without the certificate the
    server refuses the handshake, and the reason says TLS."""
    srv = TlsRedis(certs, auth_clients=True).start()
    try:
        url = "rediss://127.0.0.1:%d/0" % srv.port
        sc = tls_sidecar(make_sidecar, up, url, {"ca_file": certs.path("ca.crt"),
                                                 "cert_file": certs.path("client.crt"),
                                                 "key_file": certs.path("client.key")})
        wait_backend(sc)
        err, res = one_call(sc)
        assert err is None, err
        sc.stop()

        bare = tls_sidecar(make_sidecar, up, url, {"ca_file": certs.path("ca.crt")})
        wait_refused(bare, "TLS")
        err, res = one_call(bare)
        assert res is None and err["code"] == "backend_unavailable", err
    finally:
        srv.cleanup()


@pytest.mark.parametrize("case", ["wrong_ca", "wrong_name"])
def test_tls__unverified_server_is_refused(certs, tls_redis, up, make_sidecar, case):
    """A CA that did not sign the server's certificate, or a server_name
    the certificate does not carry: the connection is refused with the
    verification error in stats.backend.last_error, in the log and in the
    HTTP front's /readyz (503, the reason), calls end with
    backend_unavailable, and nothing reaches the upstream."""
    tls = {"ca_file": certs.path("other-ca.crt")} if case == "wrong_ca" else \
        {"ca_file": certs.path("ca.crt"), "server_name": "wrong.example"}
    # OpenSSL names an unknown root by how the server sent its chain.
    want = ("unable to get local issuer certificate", "self-signed certificate in certificate chain") \
        if case == "wrong_ca" else ("hostname mismatch",)
    port = free_port()
    sc = tls_sidecar(make_sidecar, up, "rediss://localhost:%d/0" % tls_redis.port, tls,
                     http='  listen: "127.0.0.1:%d"\n' % port)
    b = wait_refused(sc, "certificate verify failed")
    assert any(w in b["last_error"] for w in want), b
    err, res = one_call(sc)
    assert res is None and err["code"] == "backend_unavailable", err
    assert up.stats()["requests"] == 0
    assert any(w in sc.logs() for w in want)
    # The HTTP front's readiness says so too, with the reason.
    try:
        urllib.request.urlopen("http://127.0.0.1:%d/readyz" % port, timeout=5)
        assert False, "/readyz answered 200 with the server refused"
    except urllib.error.HTTPError as e:
        assert e.code == 503, e.code
        ready = json.loads(e.read().decode())
    assert ready["status"] == "not_ready" and ready["reason"] == "redis unreachable", ready
    assert "certificate verify failed" in ready["detail"], ready
    assert any(w in ready["detail"] for w in want), ready


def test_tls__plain_redis_behind_rediss_is_refused(up, make_sidecar):
    """rediss:// to a server that speaks plain RESP: the handshake fails
    with a TLS reason (the server waits for the end of the line it takes
    the ClientHello for: the handshake times out), never hangs, never
    sends a command in clear."""
    srv = FleetRedis().start()
    try:
        sc = tls_sidecar(make_sidecar, up, "rediss://127.0.0.1:%d/0" % srv.port, {})
        b = wait_refused(sc, "TLS handshake")
        assert b["tls"] is True, b
        assert int(srv.client().call("INFO", "stats").split("total_commands_processed:")[1]
                   .split()[0]) < 5   # the test's own PING / INFO only
    finally:
        srv.cleanup()


# ------------------------------------------------------------------ ACL users
ACL_PW = "acl-Pa55-TOPSECRET"


ACL_PREFIX = "pgwacl"


def documented_acl(prefix):
    """The rules docs/CONFIG.md gives for backend.username, for `prefix`:
    the sidecar runs as a user with exactly these, so the list is checked."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "docs", "CONFIG.md"), encoding="utf-8") as f:
        m = re.search(r"`username` \|.*?What it needs[^\n]*?`(~\{PREFIX[^`]+)`", f.read())
    assert m, "docs/CONFIG.md: the username row lists no ACL rules"
    return m.group(1).replace("\\|", "|").replace("PREFIX", prefix).split()


class AclRedis(FleetRedis):
    """redis-server whose only user is `pgw` (the default user is off), with
    the documented rules for keys and channels of prefixes ACL_PREFIX*."""

    def __init__(self):
        super().__init__(extra=["--user", "default", "off", "--user", "pgw", "on", ">" + ACL_PW]
                         + documented_acl(ACL_PREFIX + "*"))

    def client(self, timeout=2.0):
        c = Resp(self.port, timeout=timeout)
        c.call("AUTH", "pgw", ACL_PW)
        return c


@pytest.fixture
def acl_redis():
    srv = AclRedis().start()
    yield srv
    srv.cleanup()


def test_acl__user_and_password_from_the_environment(acl_redis, up, make_sidecar, tmp_path):
    """backend.username + password_env (or password_file, or user:password
    in the URL): AUTH user password, calls served. A wrong password: the
    backend stays down with Redis' WRONGPASS reason, calls fail closed,
    and the password is in neither stats nor the log."""
    port = acl_redis.port
    base = {"command_timeout_s": 0.5, "lease_ttl_s": 3}
    pw_file = tmp_path / "redis-password"
    pw_file.write_text(ACL_PW + "\n")
    variants = [
        ("redis://127.0.0.1:%d/0" % port, dict(base, username="pgw", password_env="PGW_REDIS_PW"),
         {"PGW_REDIS_PW": ACL_PW}),
        ("redis://127.0.0.1:%d/0" % port, dict(base, username="pgw", password_file=str(pw_file)),
         {}),
        ("redis://pgw:%s@127.0.0.1:%d/0" % (ACL_PW, port), base, {}),
    ]
    for i, (url, backend, env) in enumerate(variants):
        cfg = fleet_config(url, "%s%d" % (ACL_PREFIX, i), [source("a", "chat", up.url)],
                           backend=backend)
        sc = make_sidecar(config_text=cfg, subdir="ok%d" % i, env=dict(NO_PROXY, **env))
        wait_backend(sc)
        err, res = one_call(sc)
        assert err is None, (i, err)
        assert ACL_PW not in repr(stats(sc)) and ACL_PW not in sc.logs()
        sc.stop()

    wrong = "not-the-" + ACL_PW
    cfg = fleet_config("redis://127.0.0.1:%d/0" % port, ACL_PREFIX + "-bad",
                       [source("a", "chat", up.url)],
                       backend=dict(base, username="pgw", password_env="PGW_REDIS_PW"))
    sc = make_sidecar(config_text=cfg, subdir="bad", env=dict(NO_PROXY, PGW_REDIS_PW=wrong))
    b = wait_refused(sc, "WRONGPASS")
    assert "AUTH refused" in b["last_error"], b
    err, res = one_call(sc)
    assert res is None and err["code"] == "backend_unavailable", err
    everything = repr(stats(sc)) + sc.logs()
    assert wrong not in everything and ACL_PW not in everything


def test_tls__unreadable_ca_file_stops_the_start_up(certs, up, workdir):
    """A CA file that is not a certificate: the sidecar refuses to start,
    naming the file (the config is valid; the file is read at start-up),
    and leaves no socket behind."""
    from test_redis_fleet import _run
    bogus = os.path.join(workdir, "not-a-ca.pem")
    with open(bogus, "w") as f:
        f.write("not a certificate\n")
    cfg = os.path.join(workdir, "tls.yaml")
    with open(cfg, "w") as f:
        f.write(fleet_config("rediss://localhost:6380/0", unique_prefix(),
                             [source("a", "chat", up.url)], backend={"tls": {"ca_file": bogus}}))
    sock = os.path.join(workdir, "tls.sock")
    rc, out = _run(["--config", cfg, "--socket", sock])
    assert rc != 0, out
    assert "cannot load the CA file %s" % bogus in out, out
    assert not os.path.exists(sock)

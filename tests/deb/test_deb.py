"""The Debian packages, for real: `make deb` builds them (lintian must stay
clean), dpkg installs them on this machine, the daemon is started from the
installed files the way systemd would start it (the installed polygw.socket's
listening socket passed as fd 3, the installed polygw.service's User=,
ExecStartPre= and ExecStart=, NOTIFY_SOCKET for its Type=notify), a call goes
through the socket with the installed polygwctl and with a C program built
against the installed libpolygw-dev, and dpkg purges everything again.

Root only (dpkg -i), and never on a machine where polygw is already
installed: the tests would replace and then purge it. The packaged
configuration talks to a mock upstream on 127.0.0.1:18080 (the `make run`
demo's port): a mock is started there for the call.

The tests run in file order and depend on each other (build, install, run,
purge); a failure makes the later ones fail too.
"""
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from mock import MockUpstream  # noqa: E402

DEB_DIR = os.path.join(ROOT, "build", "deb")
PACKAGES = ["polygw", "libpolygw0", "libpolygw-dev"]
UNIT_DIR = "/lib/systemd/system"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="dpkg -i needs root"),
    pytest.mark.skipif(subprocess.run(["dpkg", "-s", "polygw"], capture_output=True).returncode == 0,
                       reason="polygw is already installed here: not replacing it"),
]


def run(*cmd, check=True, **kw):
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=600, **kw)
    if check:
        assert r.returncode == 0, "%s: exit %d\n%s\n%s" % (cmd, r.returncode, r.stdout, r.stderr)
    return r


def installed(pkg):
    r = run("dpkg-query", "-W", "-f=${Status}", pkg, check=False)
    return r.returncode == 0 and "install ok installed" in r.stdout


@pytest.fixture(scope="module", autouse=True)
def purge_at_the_end():
    yield
    # Whatever happened, leave the machine as it was.
    present = [p for p in PACKAGES if installed(p)]
    if present:
        run("dpkg", "-P", *present, check=False)


def unit(name):
    """An installed unit file as {section: {key: [values]}} (keys repeat)."""
    out = {}
    section = None
    for line in open(os.path.join(UNIT_DIR, name)):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = out.setdefault(line.strip("[]"), {})
        else:
            k, v = line.split("=", 1)
            section.setdefault(k, []).append(v)
    return out


def test_deb__make_deb_builds_the_packages_lintian_clean():
    r = run("make", "--no-print-directory", "deb", cwd=ROOT)
    for p in PACKAGES:
        assert glob.glob(os.path.join(DEB_DIR, "%s_*_*.deb" % p)), (p, os.listdir(DEB_DIR))
    # lintian at its default level printed nothing (make deb fails on E/W).
    text = open(os.path.join(DEB_DIR, "lintian.txt")).read()
    assert text.strip() == "", text
    assert "lintian" in r.stdout


def test_deb__install_layout_conffile_user():
    debs = [glob.glob(os.path.join(DEB_DIR, "%s_*_*.deb" % p))[0] for p in PACKAGES]
    run("dpkg", "-i", *debs, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    for p in PACKAGES:
        assert installed(p), p
    for path in ["/usr/sbin/polygw", "/usr/bin/polygwctl", "/etc/polygw/polygw.yaml",
                 UNIT_DIR + "/polygw.service", UNIT_DIR + "/polygw.socket",
                 "/usr/share/man/man8/polygw.8.gz", "/usr/share/man/man1/polygwctl.1.gz",
                 "/usr/include/polygw/polygw.h"]:
        assert os.path.exists(path), path
    conffiles = run("dpkg-query", "-W", "-f=${Conffiles}", "polygw").stdout
    assert "/etc/polygw/polygw.yaml" in conffiles, conffiles
    # The system user and group of the unit, made by postinst.
    assert run("getent", "group", "polygw").stdout.startswith("polygw:")
    pw = run("getent", "passwd", "polygw").stdout.strip().split(":")
    assert int(pw[2]) < 1000 and pw[6] in ("/usr/sbin/nologin", "/bin/false"), pw
    assert run("/usr/sbin/polygw", "--version").stdout.startswith("polygw ")
    r = run("/usr/sbin/polygw", "--check-config", "/etc/polygw/polygw.yaml")
    assert ": ok (" in r.stdout, r.stdout
    svc = unit("polygw.service")["Service"]
    assert svc["Type"] == ["notify"] and svc["User"] == ["polygw"]
    assert svc["ExecStart"][0].startswith("/usr/sbin/polygw ")


def test_deb__libpolygw_dev_builds_a_client(tmp_path):
    src = tmp_path / "ping.c"
    src.write_text(r'''
#include <polygw.h>
#include <stdio.h>
int main(int argc, char **argv)
{
    struct pgw_client *c;
    struct pgw_error err;
    char version[64];
    double up;
    if (pgw_connect(argc > 1 ? argv[1] : NULL, NULL, &c, &err) != 0 ||
        pgw_ping(c, 5, version, sizeof(version), &up, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.message);
        return 1;
    }
    printf("version=%s\n", version);
    pgw_close(c);
    return 0;
}
''')
    flags = run("pkg-config", "--cflags", "--libs", "polygw").stdout.split()
    exe = str(tmp_path / "ping")
    run("cc", "-o", exe, str(src), *flags)
    assert "libpolygw.so.0" in run("ldd", exe).stdout
    global CLIENT
    CLIENT = exe


CLIENT = None


class Activated:
    """What systemd does for the installed polygw.socket + polygw.service."""

    def __init__(self, workdir):
        sock_unit = unit("polygw.socket")["Socket"]
        svc = unit("polygw.service")["Service"]
        self.path = sock_unit["ListenStream"][0]
        d = os.path.dirname(self.path)
        os.makedirs(d, mode=int(sock_unit["DirectoryMode"][0], 8), exist_ok=True)
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.listen = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listen.bind(self.path)
        gid = int(run("getent", "group", sock_unit["SocketGroup"][0]).stdout.split(":")[2])
        os.chown(self.path, 0, gid)
        os.chmod(self.path, int(sock_unit["SocketMode"][0], 8))
        self.listen.listen(int(sock_unit["Backlog"][0]))
        pw = run("getent", "passwd", svc["User"][0]).stdout.split(":")
        uid, ugid = int(pw[2]), int(pw[3])
        # NOTIFY_SOCKET, writable by the service user.
        self.notify_path = os.path.join(workdir, "notify")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)
        os.chmod(workdir, 0o755)
        os.chmod(self.notify_path, 0o666)
        fd = self.listen.fileno()

        def as_service_user():
            os.dup2(fd, 3)  # clears FD_CLOEXEC: the passed socket
            os.setgroups([])
            os.setgid(ugid)
            os.setuid(uid)

        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LISTEN_FDS": "1",
               "LISTEN_FDNAMES": "polygw.socket", "NOTIFY_SOCKET": self.notify_path}
        for pre in svc.get("ExecStartPre", []):
            r = subprocess.run(pre.split(), capture_output=True, text=True, env=env,
                               preexec_fn=as_service_user, timeout=30, close_fds=False)
            assert r.returncode == 0, (pre, r.stdout, r.stderr)
        self.log_path = os.path.join(workdir, "polygw.log")
        self.log = open(self.log_path, "wb")

        # LISTEN_PID must be the daemon's own pid: the shell sets it, exec keeps it.
        self.proc = subprocess.Popen(["/bin/sh", "-c", 'LISTEN_PID=$$; export LISTEN_PID; exec "$@"',
                                      "sh"] + svc["ExecStart"][0].split(),
                                     stdout=self.log, stderr=self.log, env=env,
                                     preexec_fn=as_service_user, close_fds=False)

    def wait_notify(self, key, timeout=10.0):
        self.notify.settimeout(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.notify.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                msg = self.notify.recv(4096).decode()
            except socket.timeout:
                break
            if msg.startswith(key + "="):
                return msg
        raise AssertionError("no %s from the daemon:\n%s" % (key, open(self.log_path).read()))

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        self.listen.close()
        self.notify.close()
        if os.path.exists(self.path):
            os.unlink(self.path)


def test_deb__installed_daemon_serves_a_call_with_the_packaged_config():
    workdir = tempfile.mkdtemp(prefix="pgwdeb")
    mock = MockUpstream(port=18080)
    sc = None
    try:
        sc = Activated(workdir)
        assert sc.wait_notify("READY").startswith("READY=1")
        r = run("/usr/bin/polygwctl", "--socket", sc.path, "ping")
        assert r.stdout.startswith("pong version=0.1.0"), r.stdout
        r = run("/usr/bin/polygwctl", "--socket", sc.path, "call", "chat", "--body",
                '{"messages":[{"role":"user","content":"from the deb"}]}')
        assert "from the deb" in r.stdout and "source=mock-chat" in r.stderr, (r.stdout, r.stderr)
        assert mock.stats()["requests"] == 1
        if CLIENT:
            assert run(CLIENT, sc.path).stdout.strip() == "version=0.1.0"
        # The packaged (release) build has no test hooks.
        r = run("/usr/bin/polygwctl", "--socket", sc.path, "raw", "debug.wedge", '{"seconds":0}',
                check=False)
        assert r.returncode == 1 and "unknown_method" in r.stderr, (r.stdout, r.stderr)
        # The access log reached the service's stderr (the journal, under systemd).
        log = open(sc.log_path).read()
        assert '"msg":"call"' in log and '"code":"ok"' in log, log
        # As `systemctl stop` does: SIGTERM, STOPPING=1, exit 0.
        sc.proc.send_signal(signal.SIGTERM)
        assert sc.wait_notify("STOPPING").startswith("STOPPING=1")
        assert sc.proc.wait(15) == 0, open(sc.log_path).read()
    finally:
        if sc:
            sc.close()
        mock.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_deb__purge_removes_everything():
    run("dpkg", "-P", *PACKAGES)
    for p in PACKAGES:
        assert not installed(p), p
    for path in ["/usr/sbin/polygw", "/usr/bin/polygwctl", "/etc/polygw",
                 UNIT_DIR + "/polygw.service", UNIT_DIR + "/polygw.socket",
                 "/usr/include/polygw", "/usr/share/doc/polygw"]:
        assert not os.path.exists(path), path
    left = run("dpkg-query", "-W", "-f=${Status}\\n", *PACKAGES, check=False).stdout
    assert "installed" not in left.replace("not-installed", ""), left

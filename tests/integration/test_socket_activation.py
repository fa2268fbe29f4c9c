"""systemd socket activation, for real: the test plays systemd.

It binds and listens a Unix socket itself, then execs the real sidecar with
that socket as fd 3, LISTEN_FDS=1 and LISTEN_PID=<the sidecar's own pid>
(sd_listen_fds(3) protocol). The sidecar must serve on it, say so in its log,
and leave the socket file alone: it belongs to "systemd" (here, the test),
which keeps it listening across sidecar restarts.

LISTEN_PID must equal the pid of the process that reads it, which is only
known after fork: a tiny `sh -c 'LISTEN_PID=$$; export ...; exec "$@"'`
wrapper sets it (exec keeps the pid, so Popen.pid is the sidecar's pid too).
fd 3 is set up by os.dup2 in a preexec_fn. That runs *before* subprocess
closes the fds not listed in pass_fds, so pass_fds=[fd] would close the new
fd 3 again; instead close_fds=False is used: every fd Python opens is
non-inheritable (PEP 446), so the child gets only stdio and the dup2'd fd 3.
"""
import json
import os
import socket
import stat
import subprocess
import time

import pytest

from conftest import BASE_CONFIG, POLYGW, SANITIZER_MARKERS, Conn, PolygwProcess, sanitizer_env

ACTIVATED_MSG = "using socket passed by systemd"
# LISTEN_PID is set to the shell's pid, which exec hands on to polygw.
WRAPPER = 'LISTEN_PID=$$; export LISTEN_PID; exec "$@"'


def write_config(workdir, grace=2):
    path = os.path.join(workdir, "polygw.yaml")
    with open(path, "w") as f:
        f.write(BASE_CONFIG.format(listen_extra="", extra="", log_level="info", grace=grace))
    return path


def systemd_socket(path, mode=0o640):
    """What systemd does for ListenStream=PATH / SocketMode=MODE."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    os.chmod(path, mode)
    s.listen(16)
    return s


class Activated(PolygwProcess):
    """A polygw started the way systemd starts a socket-activated service."""

    def __init__(self, workdir, listen_sock, config, socket_arg, listen_pid="self", name="polygw"):
        self.log_path = os.path.join(workdir, name + ".log")
        self.socket_arg = socket_arg
        env = sanitizer_env()
        env["LISTEN_FDS"] = "1"
        env["LISTEN_FDNAMES"] = "polygw.socket"
        env.pop("LISTEN_PID", None)
        fd = listen_sock.fileno()

        def preexec():
            os.dup2(fd, 3)  # dup2 clears FD_CLOEXEC on fd 3

        argv = [POLYGW, "--config", config, "--socket", socket_arg]
        if listen_pid == "self":
            argv = ["/bin/sh", "-c", WRAPPER, "sh"] + argv
        else:
            env["LISTEN_PID"] = str(listen_pid)
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=self.log, env=env,
                                     preexec_fn=preexec, close_fds=False)
        self.returncode = None

    def log_records(self):
        out = []
        for line in self.logs().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def wait_log(self, msg, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rec in self.log_records():
                if rec.get("msg") == msg:
                    return rec
            if self.proc.poll() is not None:
                raise AssertionError("polygw exited early (%s):\n%s" % (self.proc.returncode, self.logs()))
            time.sleep(0.02)
        raise AssertionError("no %r in the log within %ss:\n%s" % (msg, timeout, self.logs()))


@pytest.fixture
def launched():
    """Every Activated polygw is stopped at teardown, even when a test failed."""
    procs = []
    yield procs
    for p in procs:
        if p.returncode is None:
            p.proc.kill()
            p.proc.wait()
            p.log.close()


def ping(path):
    c = Conn(path)
    try:
        err, res = c.request("ping")
    finally:
        c.close()
    assert err is None, err
    assert isinstance(res["version"], str) and res["version"]
    return res


def test_socket_activation__serves_on_fd3_and_leaves_the_file_to_systemd(workdir, launched):
    sys_path = os.path.join(workdir, "systemd.sock")
    own_path = os.path.join(workdir, "own.sock")  # --socket: must not be used
    ls = systemd_socket(sys_path, 0o640)
    before = os.stat(sys_path)
    try:
        sc = Activated(workdir, ls, write_config(workdir), own_path)
        launched.append(sc)
        rec = sc.wait_log(ACTIVATED_MSG)
        assert rec["fd"] == 3, rec
        listening = sc.wait_log("listening")
        assert listening["mode"] == "systemd", listening
        assert listening["pid"] == sc.proc.pid, listening

        # A msgpack-RPC ping through the socket the test bound.
        res = ping(sys_path)
        assert res["uptime_s"] >= 0
        # Several connections, interleaved, all on the inherited socket.
        conns = [Conn(sys_path) for _ in range(4)]
        ids = [c.request_async("ping") for c in conns]
        for c, i in zip(conns, ids):
            assert c.wait_response(i)[2] is None
            c.close()

        # The --socket path was never created: fd 3 replaced it.
        assert not os.path.lexists(own_path)
        # The sidecar did not chmod/chown the file systemd made.
        st = os.stat(sys_path)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o640
        assert (st.st_uid, st.st_gid, st.st_ino) == (before.st_uid, before.st_gid, before.st_ino)

        rc = sc.stop()
        sc.assert_clean()
        assert rc == 0, "polygw exited with %s:\n%s" % (rc, sc.logs())
        assert "exited cleanly" in sc.logs()

        # After exit the socket FILE is still there, same inode, same mode.
        st = os.stat(sys_path)
        assert stat.S_ISSOCK(st.st_mode), "socket file gone after SIGTERM"
        assert stat.S_IMODE(st.st_mode) == 0o640
        assert st.st_ino == before.st_ino
        assert not os.path.lexists(own_path)
    finally:
        ls.close()


def test_socket_activation__socket_outlives_restarts(workdir, launched):
    """The point of activation: the listening socket is systemd's. A client that
    connects and sends while no sidecar runs is queued in the backlog and
    answered by the next sidecar started on the same fd."""
    sys_path = os.path.join(workdir, "systemd.sock")
    own_path = os.path.join(workdir, "own.sock")
    config = write_config(workdir, grace=1)
    ls = systemd_socket(sys_path, 0o660)
    try:
        first = Activated(workdir, ls, config, own_path, name="first")
        launched.append(first)
        first.wait_log("listening")
        ping(sys_path)
        assert first.stop() == 0, first.logs()
        first.assert_clean()
        assert os.path.exists(sys_path)

        # No sidecar now: connect and send anyway (the kernel queues both).
        c = Conn(sys_path)
        msgid = c.request_async("ping")

        second = Activated(workdir, ls, config, own_path, name="second")
        launched.append(second)
        second.wait_log(ACTIVATED_MSG)
        msg = c.wait_response(msgid, timeout=10.0)
        assert msg[2] is None and msg[3]["version"], msg
        c.close()
        assert second.stop() == 0, second.logs()
        second.assert_clean()
        assert stat.S_IMODE(os.stat(sys_path).st_mode) == 0o660
        assert not os.path.lexists(own_path)
    finally:
        ls.close()


@pytest.mark.parametrize("who", ["parent", "pid1"])
def test_socket_activation__listen_pid_of_another_process_is_ignored(workdir, launched, who):
    """LISTEN_PID names another process (e.g. variables inherited from a parent
    that was itself activated): fd 3 is not ours; bind --socket normally."""
    sys_path = os.path.join(workdir, "systemd.sock")
    own_path = os.path.join(workdir, "own.sock")
    ls = systemd_socket(sys_path, 0o640)
    try:
        other = os.getpid() if who == "parent" else 1
        sc = Activated(workdir, ls, write_config(workdir), own_path, listen_pid=other)
        launched.append(sc)
        listening = sc.wait_log("listening")
        assert listening["socket"] == own_path, listening
        assert listening["mode"] == "0660", listening
        assert ACTIVATED_MSG not in sc.logs()

        ping(own_path)
        st = os.stat(own_path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660

        # Nobody serves the socket the "other process" was given: a client
        # connects (backlog) but gets no answer.
        c = Conn(sys_path, timeout=0.5)
        c.request_async("ping")
        with pytest.raises(socket.timeout):
            c.recv_msg(timeout=0.5)
        c.close()

        rc = sc.stop()
        sc.assert_clean()
        assert rc == 0, "polygw exited with %s:\n%s" % (rc, sc.logs())
        # It owned --socket, so it removed it; the other file is untouched.
        assert not os.path.lexists(own_path)
        st = os.stat(sys_path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640
    finally:
        ls.close()


@pytest.mark.parametrize("fd3", ["closed", "devnull", "unbound_listening_tcp"])
def test_socket_activation__bad_fd3_fails_loudly(workdir, fd3):
    """LISTEN_FDS set but fd 3 is not a listening Unix stream socket: exit 1
    with a clear message — never an assertion in the event loop, never an
    accept() spin."""
    config = write_config(workdir)
    sock_arg = os.path.join(workdir, "fallback.sock")
    env = sanitizer_env()
    env["LISTEN_FDS"] = "1"
    keep = None
    if fd3 == "devnull":
        keep = open("/dev/null", "rb")
    elif fd3 == "unbound_listening_tcp":
        keep = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        keep.bind(("127.0.0.1", 0))
        keep.listen(1)
    src = keep.fileno() if keep else None

    def preexec():
        if src is None:
            try:
                os.close(3)
            except OSError:
                pass
        else:
            os.dup2(src, 3)

    r = subprocess.run(["/bin/sh", "-c", WRAPPER, "sh", POLYGW, "--config", config,
                        "--socket", sock_arg], env=env, preexec_fn=preexec, close_fds=False,
                       capture_output=True, text=True, timeout=20)
    if keep:
        keep.close()
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "fd 3 is not a listening Unix stream socket" in r.stderr
    for marker in SANITIZER_MARKERS:
        assert marker not in r.stderr
    assert not os.path.exists(sock_arg)

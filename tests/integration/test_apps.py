"""Applications through the real sidecar: the app of a connection comes
from the peer's uid (SO_PEERCRED), declared names are refused unless the
config allows them, and one app cannot see or stop another app's tasks."""
import grp
import os
import pwd
import socket
import subprocess
import sys
import time

import msgpack
import pytest

from conftest import Conn, assert_task_unknown

USERS = ("pgwapp_a", "pgwapp_b", "pgwapp_c", "pgwapp_x")
GROUP = "pgwapp"


def ensure_users():
    if os.geteuid() != 0:
        pytest.skip("needs root to create test users and switch to them")
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        subprocess.run(["groupadd", "--system", GROUP], check=True)
    for u in USERS:
        try:
            pwd.getpwnam(u)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--user-group",
                            "--shell", "/usr/sbin/nologin", u], check=True)
    return {u: pwd.getpwnam(u) for u in USERS}, grp.getgrnam(GROUP).gr_gid


def connect_as(sc, pw, sock_gid):
    """A Conn whose socket was connect()ed by a process running as user
    `pw` (so the kernel records that user's credentials); the descriptor is
    handed back over SCM_RIGHTS."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:                                   # child: drop to the user, connect
        code = 1
        try:
            parent.close()
            os.setgroups([sock_gid])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sc.sock)
            socket.send_fds(child, [b"x"], [s.fileno()])
            code = 0
        finally:
            os._exit(code)
    child.close()
    try:
        parent.settimeout(5)
        _, fds, _, _ = socket.recv_fds(parent, 1, 1)
    finally:
        parent.close()
        os.waitpid(pid, 0)
    assert fds, "the child could not connect"
    c = Conn.__new__(Conn)            # Conn() would connect as root: fill it in by hand
    c.sock = socket.socket(fileno=fds[0])
    c.sock.settimeout(5)
    c.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    c.next_id = 1
    c.backlog = []
    return c


def config(users, up_url):
    a, b, c = users["pgwapp_a"], users["pgwapp_b"], users["pgwapp_c"]
    return ('listen:\n  mode: "0660"\n'
            "server: {log_level: debug, shutdown_grace_s: 2}\n"
            "defaults: {max_attempts: 1}\n"
            "apps:\n"
            "  - {name: svc-a, uids: [%d]}\n"
            "  - {name: svc-b, uids: [%d], weight: 3}\n"
            "  - {name: proxy, uids: [%d], allow_declared: true}\n"
            "  - {name: ops, uids: [0], admin: true}\n"
            "sources:\n  - name: s\n    capability: chat\n    base_url: %s\n"
            % (a.pw_uid, b.pw_uid, c.pw_uid, up_url))


@pytest.fixture
def apps(make_sidecar, up):
    users, gid = ensure_users()
    sc = make_sidecar(config_text=config(users, up.url))
    os.chmod(sc.dir, 0o711)
    os.chown(sc.sock, 0, gid)
    return sc, users, gid


def hello(c, **p):
    return c.request("hello", p or None)


def test_apps__identity_follows_the_peer_uid(apps):
    sc, users, gid = apps
    seen = {}
    for u in USERS:
        c = connect_as(sc, users[u], gid)
        err, res = hello(c)
        assert err is None, err
        assert res["uid"] == users[u].pw_uid and res["gid"] == users[u].pw_gid
        seen[u] = res["app"]
        c.close()
    assert seen == {"pgwapp_a": "svc-a", "pgwapp_b": "svc-b", "pgwapp_c": "proxy",
                    "pgwapp_x": "default"}
    err, res = hello(sc.connect())            # root
    assert err is None and res["app"] == "ops" and res["admin"] is True
    err, st = connect_as(sc, users["pgwapp_b"], gid).request("stats")
    assert err is None and st["caller"]["app"] == "svc-b"
    assert [x["name"] for x in st["apps"]] == ["svc-b"]      # its own figures only
    assert st["apps"][0]["weight"] == 3
    assert [s["name"] for s in st["sources"]] == ["s"]        # sources are shared
    err, st = sc.connect().request("stats")                   # admin: every app
    assert [x["name"] for x in st["apps"]] == ["svc-a", "svc-b", "proxy", "ops", "default"]


def test_apps__declared_name_refused_unless_allowed(apps):
    sc, users, gid = apps
    a = connect_as(sc, users["pgwapp_a"], gid)
    err, _ = hello(a, app="svc-b")
    assert err["code"] == "bad_request" and "may not declare" in err["message"]
    err, res = hello(a)
    assert err is None and res["app"] == "svc-a"  # unchanged by the refusal
    err, res = hello(a, app="svc-a")              # its own name is fine
    assert err is None and res["app"] == "svc-a"
    x = connect_as(sc, users["pgwapp_x"], gid)    # default does not allow it either
    err, _ = hello(x, app="svc-a")
    assert err["code"] == "bad_request"
    # a call's own `app` is checked the same way
    msg = a.wait_response(a.request_async("call", {"capability": "chat", "app": "svc-b",
                                                   "body": {"messages": []}}))
    assert msg[2]["code"] == "bad_request" and "may not declare" in msg[2]["message"]

    p = connect_as(sc, users["pgwapp_c"], gid)    # proxy: allow_declared
    err, res = hello(p, app="svc-b")
    assert err is None and res["app"] == "svc-b" and res["peer_app"] == "proxy"
    err, _ = hello(p, app="ops")                  # never an admin app
    assert err["code"] == "bad_request" and "admin" in err["message"]
    err, _ = hello(p, app="nobody")
    assert err["code"] == "bad_request" and "unknown app" in err["message"]


def test_apps__call_logs_and_errors_name_the_app(apps, up):
    sc, users, gid = apps
    b = connect_as(sc, users["pgwapp_b"], gid)
    msg = b.wait_response(b.request_async("call", {
        "capability": "chat",
        "body": {"messages": [{"role": "user", "content": "x"}], "mock": {"status": 500}}}))
    assert msg[2]["code"] == "retry_exhausted" and msg[2]["app"] == "svc-b", msg[2]
    p = connect_as(sc, users["pgwapp_c"], gid)    # a declared app is the one charged
    assert hello(p, app="svc-a")[0] is None
    msg = p.wait_response(p.request_async("call", {
        "capability": "chat",
        "body": {"messages": [{"role": "user", "content": "x"}], "mock": {"status": 500}}}))
    assert msg[2]["app"] == "svc-a", msg[2]
    lines = [l for l in sc.logs().splitlines() if '"attempt ended"' in l]
    assert len(lines) == 2, lines
    assert '"app":"svc-b"' in lines[0] and '"app":"svc-a"' in lines[1], lines


def test_apps__tasks_belong_to_their_app(apps):
    sc, users, gid = apps
    a = connect_as(sc, users["pgwapp_a"], gid)
    b = connect_as(sc, users["pgwapp_b"], gid)
    assert a.request("task.start", {"task_id": "job-1"})[0] is None
    assert_task_unknown(b, "job-1")
    err, lst = b.request("task.list")
    assert err is None and lst["tasks"] == []
    # still running for its owner
    err, t = a.request("task.guard", {"task_id": "job-1"})
    assert err is None
    err, lst = a.request("task.list")
    assert [t["task_id"] for t in lst["tasks"]] == ["job-1"]
    # B's stop after A's is still not told that it was stopped
    admin = sc.connect()
    err, t = admin.request("task.get", {"task_id": "job-1"})
    assert err is None and t["state"] == "running" and t["app"] == "svc-a"
    err, t = admin.request("task.stop", {"task_id": "job-1", "reason": "ops"})
    assert err is None and t["state"] == "failed"
    err, _ = b.request("task.guard", {"task_id": "job-1"})
    assert err["code"] == "bad_request" and "unknown task" in err["message"]
    err, _ = a.request("task.guard", {"task_id": "job-1"})
    assert err["code"] == "task_stopped"


def test_apps__an_admins_task_is_not_taken_by_another_app(apps):
    """A task an admin app started is the admin's: an ordinary app naming
    it gets "unknown task" for every method and for a call, and cannot
    stop it or take it; the admin sees it as its own and stops it."""
    sc, users, gid = apps
    admin = sc.connect()                           # root: the admin app `ops`
    a = connect_as(sc, users["pgwapp_a"], gid)
    assert admin.request("task.start", {"task_id": "ops-1"})[0] is None
    assert_task_unknown(a, "ops-1")
    assert a.request("task.list")[1]["tasks"] == []
    assert a.request("stats")[1]["tasks"]["running_tasks"] == []
    err, t = admin.request("task.get", {"task_id": "ops-1"})
    assert err is None and t["state"] == "running" and t["app"] == "ops"
    running = admin.request("stats")[1]["tasks"]["running_tasks"]
    assert [(r["task_id"], r["app"]) for r in running] == [("ops-1", "ops")]
    err, t = admin.request("task.stop", {"task_id": "ops-1", "reason": "done by ops"})
    assert err is None and t["state"] == "failed" and t["reason"] == "done by ops"


def share_config(users, up_url, tasks, extra_a=""):
    a, b = users["pgwapp_a"], users["pgwapp_b"]
    return ('listen:\n  mode: "0660"\n'
            "server: {log_level: info, shutdown_grace_s: 2}\n"
            "tasks: {%s}\n"
            "apps:\n"
            "  - {name: svc-a, uids: [%d]%s}\n"
            "  - {name: svc-b, uids: [%d]}\n"
            "  - {name: ops, uids: [0], admin: true}\n"
            "sources:\n  - name: s\n    capability: chat\n    base_url: %s\n"
            % (tasks, a.pw_uid, extra_a, b.pw_uid, up_url))


def start_many(c, prefix, n):
    """Pipelines n task.start requests; returns their errors' codes (None: started)."""
    ids = [c.request_async("task.start", {"task_id": "%s-%d" % (prefix, i)}) for i in range(n)]
    return [(c.wait_response(i, timeout=30)[2] or {}).get("code") for i in ids]


def test_apps__one_app_cannot_take_every_task_slot(make_sidecar, up):
    """tasks.max_tasks is shared by default: four apps (default included)
    hold a quarter each, so an app that starts 2,000 tasks gets
    `overloaded` for those beyond its 500 while the others still start
    theirs; a restart of its own task needs no new slot."""
    users, gid = ensure_users()
    sc = make_sidecar(config_text=share_config(users, up.url, "max_tasks: 2000"))
    os.chmod(sc.dir, 0o711)
    os.chown(sc.sock, 0, gid)
    a = connect_as(sc, users["pgwapp_a"], gid)
    b = connect_as(sc, users["pgwapp_b"], gid)
    codes = start_many(a, "a", 2000)
    assert codes.count(None) == 500 and codes.count("overloaded") == 1500, set(codes)
    err, _ = a.request("task.start", {"task_id": "a-more"})
    assert err["code"] == "overloaded" and "svc-a" in err["message"], err
    assert "max_tasks" in err["message"]
    assert start_many(b, "b", 500) == [None] * 500
    assert sc.connect().request("task.start", {"task_id": "ops-1"})[0] is None
    assert a.request("task.finish", {"task_id": "a-0", "ok": True})[0] is None
    assert a.request("task.start", {"task_id": "a-0"})[0] is None   # its own slot again
    st = sc.connect().request("stats")[1]["tasks"]
    assert st["held"] == 1001 and st["rejected_app"] == 1501 and st["rejected_full"] == 0
    assert "polygw_tasks_app_rejected_total 1501" in sc.connect().request("metrics")[1]["text"]


def test_apps__max_tasks_per_app_is_set_and_reloaded(make_sidecar, up):
    """apps[].max_tasks overrides the share, reloads, and the slots come
    back when the app's tasks expire."""
    users, gid = ensure_users()
    sc = make_sidecar(config_text=share_config(users, up.url, "max_tasks: 40, ttl_s: 1",
                                               ", max_tasks: 25"))
    os.chmod(sc.dir, 0o711)
    os.chown(sc.sock, 0, gid)
    a = connect_as(sc, users["pgwapp_a"], gid)
    b = connect_as(sc, users["pgwapp_b"], gid)
    assert start_many(a, "a", 30).count(None) == 25
    assert start_many(b, "b", 12).count(None) == 10           # 40 / 4
    with open(sc.config, "w") as f:
        f.write(share_config(users, up.url, "max_tasks: 40, ttl_s: 1", ", max_tasks: 27"))
    err, res = sc.connect().request("config.reload")
    assert err is None, err
    assert start_many(a, "a2", 5).count(None) == 2
    # Idle running tasks expire after ttl_s: the slots are free again.
    deadline = time.monotonic() + 10
    while sc.connect().request("stats")[1]["tasks"]["held"] > 0:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert start_many(a, "a3", 27) == [None] * 27
    # More than the pool is refused when the file is read.
    with open(sc.config, "w") as f:
        f.write(share_config(users, up.url, "max_tasks: 40, ttl_s: 1", ", max_tasks: 41"))
    err, _ = sc.connect().request("config.reload")
    assert err["code"] == "bad_request" and "apps[0].max_tasks" in err["message"], err


# ------------------------------------------------------------ fair queueing
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from apps_fairness import fair_config, measure_shares, measure_single  # noqa: E402


def fair_sidecar(make_sidecar, up, wa, wb):
    users, gid = ensure_users()
    sc = make_sidecar(config_text=fair_config(up.url, [
        "{name: svc-a, uids: [%d], weight: %d}" % (users["pgwapp_a"].pw_uid, wa),
        "{name: svc-b, uids: [%d], weight: %d}" % (users["pgwapp_b"].pw_uid, wb)]))
    os.chmod(sc.dir, 0o711)
    os.chown(sc.sock, 0, gid)
    a = connect_as(sc, users["pgwapp_a"], gid)
    b = connect_as(sc, users["pgwapp_b"], gid)
    assert hello(a)[1]["app"] == "svc-a" and hello(b)[1]["app"] == "svc-b"
    return sc, a, b


def test_apps__single_call_not_behind_another_apps_backlog(make_sidecar, up):
    sc, a, b = fair_sidecar(make_sidecar, up, 1, 1)
    ctl = sc.connect()
    # 50 ms a call, 2 permits: FIFO would answer B after A's 200 waiting calls (5 s).
    before, outstanding = measure_single(a.sock, b.sock, lambda: ctl.request("stats")[1],
                                         200, 50)
    assert before <= 4, "B answered after %d of A's answers" % before
    assert outstanding >= 190


def test_apps__weights_3_to_1_share_the_permits(make_sidecar, up):
    sc, a, b = fair_sidecar(make_sidecar, up, 3, 1)
    na, nb = measure_shares(a.sock, b.sock, 400, 10)
    assert na + nb == 400
    assert 2.7 <= na / nb <= 3.3, "shares %d:%d" % (na, nb)


# ------------------------------------------------------------ per-app limits
@pytest.mark.timing
def test_apps__per_app_max_concurrency_and_capabilities(make_sidecar, up):
    users, gid = ensure_users()
    sc = make_sidecar(config_text=fair_config(up.url, [
        "{name: svc-a, uids: [%d], max_concurrency: 1}" % users["pgwapp_a"].pw_uid,
        "{name: svc-b, uids: [%d], capabilities: [chat]}" % users["pgwapp_b"].pw_uid]))
    os.chmod(sc.dir, 0o711)
    os.chown(sc.sock, 0, gid)
    a = connect_as(sc, users["pgwapp_a"], gid)
    b = connect_as(sc, users["pgwapp_b"], gid)
    body = {"messages": [{"role": "user", "content": "x"}], "mock": {"delay_ms": 300}}
    ids = [a.request_async("call", {"capability": "chat", "body": body}) for _ in range(3)]
    deadline = time.monotonic() + 5
    while up.stats()["in_progress"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert up.stats()["in_progress"] == 1       # the source has 2 permits; svc-a may use 1
    bid = b.request_async("call", {"capability": "chat", "body": body})
    deadline = time.monotonic() + 5
    while up.stats()["in_progress"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert up.stats()["in_progress"] == 2       # svc-b takes the other permit at once
    assert b.wait_response(bid, 5)[2] is None
    t0 = time.monotonic()
    for i in ids:
        assert a.wait_response(i, 5)[2] is None
    assert time.monotonic() - t0 >= 0.45        # svc-a's 3 calls ran one after another
    msg = b.wait_response(b.request_async("call", {"capability": "embedding",
                                                   "body": {"input": "x"}}), 5)
    assert msg[2]["code"] == "unknown_capability" and "not allowed for app 'svc-b'" \
        in msg[2]["message"]
    err, res = sc.connect().request("metrics")
    assert err is None
    lines = res["text"].splitlines()
    assert 'polygw_app_attempts_admitted_total{app="svc-a"} 3' in lines
    assert 'polygw_app_attempts_admitted_total{app="svc-b"} 1' in lines
    assert 'polygw_app_in_flight{app="svc-a"} 0' in lines
    limited = [l for l in lines if l.startswith('polygw_app_limited_total{app="svc-a"}')]
    assert limited and int(limited[0].split()[-1]) >= 2   # its 2nd and 3rd call waited
    assert 'polygw_app_limited_total{app="svc-b"} 0' in lines

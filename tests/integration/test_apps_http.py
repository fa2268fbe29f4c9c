"""Applications on the HTTP front end (docs/APPS.md, "Over HTTP") through the
real sidecar, the real mock upstream and curl run as test users: on the
HTTP Unix socket the app comes from the peer's uid, X-Polygw-App declares
another only where `hello` could, over TCP a bearer token names the app,
a rotated token file takes effect without a restart, tasks belong to their
app over /polygw/v1/tasks too, and the client's Authorization header never
reaches the upstream nor the logs."""
import json
import os
import re
import subprocess
import time

import pytest

from conftest import chat
from test_apps import ensure_users
from test_http import free_port, parse_response

TOKEN_ENV = "tok-env-7c1e9a0b5d2f4e68"      # apps[tok-env].token_env
TOKEN_FILE = "tok-file-3b8d2a6f0e914c57"    # apps[tok-file].token_file
TOKEN_NEW = "tok-file-rotated-5e0c7d1a9b3f"
UPKEY = "sk-upstream-key-9f3a1c"            # the source's own key
SRC = ("    timeout_s: 10\n    connect_timeout_s: 5\n    ttft_timeout_s: 2\n"
       "    idle_timeout_s: 5\n    max_concurrency: 16\n")


class Front:
    def __init__(self, sc, port, hsock, token_file):
        self.sc, self.port, self.hsock, self.token_file = sc, port, hsock, token_file

    def curl(self, path, body=None, headers=(), user=None, gid=None, unix=True, method=None):
        """(status, headers, body) of one curl request; over the HTTP Unix
        socket as `user` (a pwd entry; None: root), or over TCP."""
        cmd = ["curl", "-s", "-i", "--max-time", "10"]
        if unix:
            cmd += ["--unix-socket", self.hsock]
        for h in headers:
            cmd += ["-H", h]
        if body is not None:
            cmd += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]
        if method:
            cmd += ["-X", method]
        cmd.append(("http://polygw" if unix else "http://127.0.0.1:%d" % self.port) + path)
        if user is not None:
            cmd = ["setpriv", "--reuid=%d" % user.pw_uid, "--regid=%d" % user.pw_gid,
                   "--groups=%d" % gid, "--"] + cmd
        out = subprocess.run(cmd, capture_output=True, timeout=20).stdout.decode()
        return parse_response(out)

    def access(self):
        out = []
        for line in self.sc.logs().splitlines():
            if line.startswith("{") and '"msg":"call"' in line:
                out.append(json.loads(line))
        return out

    def app_metric(self, app, name="polygw_app_attempts_admitted_total"):
        _, _, text = self.curl("/metrics")
        m = re.search(r'^%s\{app="%s"\} (\S+)$' % (name, re.escape(app)), text, re.M)
        return float(m.group(1)) if m else None


def config(users, up_url, hsock, port, token_file, tokens=True):
    a, b, c = users["pgwapp_a"], users["pgwapp_b"], users["pgwapp_c"]
    text = ('listen:\n  mode: "0660"\n'
            "server: {log_level: info, shutdown_grace_s: 2}\n"
            "defaults: {max_attempts: 1}\n"
            "apps:\n"
            "  - {name: svc-a, uids: [%d]}\n"
            "  - {name: svc-b, uids: [%d]}\n"
            "  - {name: proxy, uids: [%d], allow_declared: true}\n"
            "  - {name: ops, uids: [0], admin: true}\n" % (a.pw_uid, b.pw_uid, c.pw_uid))
    if tokens:
        text += ("  - {name: tok-env, token_env: PGW_TEST_APP_TOKEN}\n"
                 "  - {name: tok-file, token_file: %s}\n" % json.dumps(token_file))
    return text + ("sources:\n  - name: s\n    capability: chat\n    base_url: %s\n"
                   "    api_key_env: PGW_TEST_UPKEY\n%s"
                   "http:\n  socket: %s\n  listen: \"127.0.0.1:%d\"\n"
                   % (up_url, SRC, json.dumps(hsock), port))


@pytest.fixture
def front(make_sidecar, up, workdir):
    def factory(tokens=True):
        users, gid = ensure_users()
        port = free_port()
        hsock = os.path.join(workdir, "http.sock")
        token_file = os.path.join(workdir, "secrets", "app.token")
        os.makedirs(os.path.dirname(token_file), exist_ok=True)
        with open(token_file, "w") as f:
            f.write(TOKEN_FILE + "\n")
        sc = make_sidecar(config_text=config(users, up.url, hsock, port, token_file, tokens),
                          env={"PGW_TEST_APP_TOKEN": TOKEN_ENV, "PGW_TEST_UPKEY": UPKEY})
        os.chmod(workdir, 0o711)
        os.chown(hsock, 0, gid)
        return Front(sc, port, hsock, token_file), users, gid
    return factory


def ok_call(f, text, **kw):
    status, hdrs, body = f.curl("/v1/chat/completions", chat(text), **kw)
    assert status == 200, (status, body)
    return hdrs, json.loads(body)


def error_of(status, hdrs, body, want_status):
    assert status == want_status, (status, body)
    err = json.loads(body)["error"]
    assert hdrs["x-polygw-code"] == err["code"] == "bad_request"
    return err


def test_apps_http__unix_socket_app_follows_the_peer_uid(front, up):
    f, users, gid = front(tokens=False)
    for u in ("pgwapp_a", "pgwapp_b", "pgwapp_x", "pgwapp_a"):
        ok_call(f, "as " + u, user=users[u], gid=gid)
    recs = f.access()
    assert [r["app"] for r in recs] == ["svc-a", "svc-b", "default", "svc-a"], recs
    for r, u in zip(recs, ("pgwapp_a", "pgwapp_b", "pgwapp_x", "pgwapp_a")):
        assert r["peer_uid"] == users[u].pw_uid and r["peer_pid"] > 1, r
    assert f.app_metric("svc-a") == 2 and f.app_metric("svc-b") == 1
    assert f.app_metric("default") == 1 and f.app_metric("ops") == 0


def test_apps_http__declared_app_header_only_where_allowed(front, up):
    f, users, gid = front(tokens=False)
    hdr = ["X-Polygw-App: svc-b"]
    err = error_of(*f.curl("/v1/chat/completions", chat("x"), headers=hdr,
                           user=users["pgwapp_a"], gid=gid), 403)
    assert err["type"] == "permission_error" and "may not declare" in err["message"], err
    assert err["polygw"]["app"] == "svc-a"
    err = error_of(*f.curl("/v1/chat/completions", chat("x"), headers=hdr,
                           user=users["pgwapp_x"], gid=gid), 403)   # default: not allowed
    assert "'default'" in err["message"]
    assert up.stats()["requests"] == 0, "a refused request went upstream"

    proxy = users["pgwapp_c"]                                        # allow_declared
    hdrs, _ = ok_call(f, "relayed", headers=hdr, user=proxy, gid=gid)
    assert f.access()[-1]["app"] == "svc-b"
    err = error_of(*f.curl("/v1/chat/completions", chat("x"), headers=["X-Polygw-App: ops"],
                           user=proxy, gid=gid), 403)
    assert "admin" in err["message"]
    err = error_of(*f.curl("/v1/chat/completions", chat("x"), headers=["X-Polygw-App: nobody"],
                           user=proxy, gid=gid), 403)
    assert "unknown app 'nobody'" in err["message"]
    ok_call(f, "own name", headers=["X-Polygw-App: svc-a"], user=users["pgwapp_a"], gid=gid)
    assert f.access()[-1]["app"] == "svc-a"
    assert up.stats()["requests"] == 2


def test_apps_http__bearer_tokens_over_tcp(front, up):
    f, users, gid = front()
    ok_call(f, "env token", unix=False, headers=["Authorization: Bearer " + TOKEN_ENV])
    ok_call(f, "file token", unix=False, headers=["Authorization: bearer " + TOKEN_FILE])
    assert [r["app"] for r in f.access()] == ["tok-env", "tok-file"]
    assert all(r["peer_uid"] is None for r in f.access())            # TCP: no credentials
    assert f.app_metric("tok-env") == 1 and f.app_metric("tok-file") == 1

    for headers in ([], ["Authorization: Bearer " + TOKEN_ENV[:-1]],
                    ["Authorization: Bearer " + TOKEN_ENV + "x"], ["Authorization: " + TOKEN_ENV],
                    ["Authorization: Bearer " + "k" * 300]):
        status, hdrs, body = f.curl("/v1/chat/completions", chat("x"), headers=headers,
                                    unix=False)
        err = error_of(status, hdrs, body, 401)
        assert err["type"] == "authentication_error" and "app" not in err["polygw"]
        assert hdrs["www-authenticate"].startswith("Bearer")
        assert TOKEN_ENV not in body
    # health and metrics stay open to probes and scrapers
    assert f.curl("/healthz", unix=False)[0] == 200
    assert f.curl("/metrics", unix=False)[0] == 200
    # a token declares like any other app: tok-env may not declare
    error_of(*f.curl("/v1/chat/completions", chat("x"), unix=False,
                     headers=["Authorization: Bearer " + TOKEN_ENV, "X-Polygw-App: svc-a"]), 403)
    # on the Unix socket the kernel's word wins: a bearer there is ignored
    ok_call(f, "root with a stray key", headers=["Authorization: Bearer sk-anything"])
    assert f.access()[-1]["app"] == "ops"

    # the upstream got its source's key every time, never the client's
    reqs = up.requests()
    assert len(reqs) == 3
    for r in reqs:
        assert r["headers"]["authorization"] == "Bearer " + UPKEY, r["headers"]
        assert not any(t in json.dumps(r) for t in (TOKEN_ENV, TOKEN_FILE, "sk-anything"))
    logs = f.sc.logs()
    assert TOKEN_ENV not in logs and TOKEN_FILE not in logs and "sk-anything" not in logs


def test_apps_http__rotated_token_file_takes_effect_without_restart(front, up):
    f, _, _ = front()
    pid = f.sc.proc.pid
    ok_call(f, "old", unix=False, headers=["Authorization: Bearer " + TOKEN_FILE])
    tmp = f.token_file + ".new"
    with open(tmp, "w") as fh:
        fh.write(TOKEN_NEW + "\n")
    os.rename(tmp, f.token_file)                  # how a secrets agent swaps a file
    deadline = time.monotonic() + 5
    status = None
    while time.monotonic() < deadline:            # bounded: ~50 tries
        status = f.curl("/v1/chat/completions", chat("new"), unix=False,
                        headers=["Authorization: Bearer " + TOKEN_NEW])[0]
        if status == 200:
            break
        time.sleep(0.1)
    assert status == 200, f.sc.logs()
    assert f.access()[-1]["app"] == "tok-file"
    error_of(*f.curl("/v1/chat/completions", chat("x"), unix=False,
                     headers=["Authorization: Bearer " + TOKEN_FILE]), 401)
    assert f.sc.proc.pid == pid and f.sc.proc.poll() is None
    assert TOKEN_NEW not in f.sc.logs()


def test_apps_http__tasks_belong_to_their_app(front, up):
    f, users, gid = front()
    a, b = users["pgwapp_a"], users["pgwapp_b"]

    def task(path, user=None, method="POST", body=None, **kw):
        status, _, text = f.curl("/polygw/v1/tasks/" + path, body if body is not None else
                                 ({} if method == "POST" else None), user=user, gid=gid,
                                 method=None if method == "POST" else method, **kw)
        return status, json.loads(text)

    assert task("job-1/start", a)[0] == 200
    st, unknown = task("never-started", b, method="GET")
    assert st == 400
    want = unknown["error"]["message"].replace("never-started", "job-1")
    for path, method, body in (("job-1", "GET", None), ("job-1/stop", "POST", {"reason": "b"}),
                               ("job-1/guard", "POST", {}), ("job-1/finish", "POST", {"ok": True}),
                               ("job-1/node_begin", "POST", {"node": "n"})):
        st, ans = task(path, b, method=method, body=body)
        assert st == 400 and ans["error"]["message"] == want, (path, ans)
        assert ans["error"]["polygw"]["app"] == "svc-b"
    # a bearer app is no owner either
    st, ans = task("job-1/stop", unix=False, headers=["Authorization: Bearer " + TOKEN_ENV])
    assert st == 400 and ans["error"]["message"] == want
    # B's call cannot attach to it
    status, _, body = f.curl("/v1/chat/completions", chat("x"), user=b, gid=gid,
                             headers=["X-Polygw-Task: job-1"])
    assert status == 400 and "unknown task" in body
    # its owner still has it, running; the admin sees whose it is and stops it
    st, t = task("job-1", a, method="GET")
    assert st == 200 and t["state"] == "running"
    st, t = task("job-1", None, method="GET")
    assert st == 200 and t["app"] == "svc-a"
    st, t = task("job-1/stop", None, body={"reason": "ops"})
    assert st == 200 and t["state"] == "failed", t
    st, ans = task("job-1/guard", a)
    assert st == 409 and ans["error"]["code"] == "task_stopped"
    # the admin's own task is no other app's to read, stop or take
    assert task("ops-2/start", None)[0] == 200
    for path, method in (("ops-2", "GET"), ("ops-2/stop", "POST"), ("ops-2/start", "POST")):
        st, ans = task(path, a, method=method)
        assert st == 400 and ans["error"]["message"] == want.replace("job-1", "ops-2"), ans
    st, t = task("ops-2", None, method="GET")
    assert st == 200 and t["state"] == "running" and t["app"] == "ops"


def test_apps_http__without_tokens_any_api_key_is_default(front, up):
    """No app has a token: TCP callers are `default` whatever Authorization
    an SDK sends, and it goes nowhere."""
    f, _, _ = front(tokens=False)
    ok_call(f, "x", unix=False, headers=["Authorization: Bearer sk-whatever-the-sdk-has"])
    ok_call(f, "y", unix=False)
    assert [r["app"] for r in f.access()] == ["default", "default"]
    for r in up.requests():
        assert r["headers"]["authorization"] == "Bearer " + UPKEY
    assert "sk-whatever-the-sdk-has" not in f.sc.logs()

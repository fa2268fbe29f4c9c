"""The status page's endpoints (sidecar/http/status.c, docs/OPERATIONS.md §5)
through the real sidecar and curl: GET /polygw/ serves the page compiled in
from sidecar/http/status.html, GET /polygw/v1/stats is the `stats` method's own
result as JSON, with the HTTP front's identity (the `default` app: never
another app's figures or tasks), `tasks.running_tasks` in `stats` lists
running tasks with their node against its watchdog timeout, and a TCP
client off loopback is refused unless http.allow_status_remote.
(tests/http/status.test.js drives the page itself in headless Chromium.)
"""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_http import (front, free_port, http_section, parse_response, Front,  # noqa: E402,F401
                       FAST, DEFAULTS)
from conftest import chat, config_yaml, source_yaml  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Root's connections are the admin app `ops`; HTTP callers are `default`.
OPS_APP = "apps:\n  - {name: ops, uids: [0], admin: true}\n"


def stats_json(f, unix=False):
    status, hdrs, body = f.curl("/polygw/v1/stats", unix=unix)
    assert status == 200, body
    assert hdrs["content-type"] == "application/json"
    assert hdrs.get("cache-control") == "no-store"
    return json.loads(body)


@pytest.mark.parametrize("unix", [False, True])
def test_status__page_is_the_compiled_in_file(front, unix):
    f = front()
    status, hdrs, body = f.curl("/polygw/", unix=unix)
    assert status == 200, body
    assert hdrs["content-type"] == "text/html; charset=utf-8"
    with open(os.path.join(ROOT, "sidecar", "http", "status.html"), encoding="utf-8") as fh:
        assert body == fh.read()
    assert "http://" not in body and "https://" not in body  # nothing from another host
    assert "connect-src 'self'" in body                       # and the CSP says so
    # Only /polygw/ itself is the page; other methods are refused.
    assert f.curl("/polygw/nope", unix=unix)[0] == 404
    assert f.curl("/polygw/", method="POST", body={}, unix=unix)[0] == 405
    assert f.curl("/polygw/v1/stats", method="POST", body={}, unix=unix)[0] == 405


def test_status__stats_json_is_the_stats_method_as_the_default_app(front, up, make_sidecar):
    f = front(sources=[source_yaml("m1", "chat", up.url, FAST),
                       source_yaml("e1", "embedding", up.url, FAST, model="emb-1")])
    assert f.curl("/v1/chat/completions", chat("one"))[0] == 200
    c = f.sc.connect()
    mp = c.request("stats")[1]
    for unix in (False, True):
        js = stats_json(f, unix)
        assert set(js) == set(mp), set(js) ^ set(mp)
        assert js["caller"]["app"] == "default" and js["caller"]["admin"] is False
        assert [s["name"] for s in js["sources"]] == ["m1", "e1"]
        m1 = js["sources"][0]
        assert m1["breaker"] == "closed" and m1["successes"] == 1 and m1["capability"] == "chat"
        assert set(m1) == set(mp["sources"][0])
        assert set(js["tasks"]) == set(mp["tasks"])
    c.close()


def test_status__running_tasks_by_app(make_sidecar, up, workdir):
    port = free_port()
    hsock = os.path.join(workdir, "http.sock")
    text = (config_yaml([source_yaml("m1", "chat", up.url, FAST)], DEFAULTS) + OPS_APP +
            http_section(socket=hsock, listen="127.0.0.1:%d" % port))
    f = Front(make_sidecar(config_text=text), port, hsock)
    wait_port("127.0.0.1", port)
    # One task of the admin app `ops` (this msgpack connection, uid 0),
    # one of `default` (through the HTTP front).
    c = f.sc.connect()
    assert c.request("task.start", {"task_id": "ops-job"})[0] is None
    r = c.request("task.node_begin", {"task_id": "ops-job", "node": "secret-node", "timeout_s": 40})
    assert r[0] is None, r
    assert f.curl("/polygw/v1/tasks/web-job/start", {})[0] == 200
    status, _, body = f.curl("/polygw/v1/tasks/web-job/node_begin", {"node": "fetch", "timeout_s": 9})
    assert status == 200, body

    admin = c.request("stats")[1]["tasks"]
    got = {t["task_id"]: t for t in admin["running_tasks"]}
    assert set(got) == {"ops-job", "web-job"}
    # An admin's task is the admin's (as task.get shows it).
    assert got["ops-job"]["app"] == "ops" and got["ops-job"]["node"] == "secret-node"
    assert got["ops-job"]["node_timeout_s"] == 40.0
    assert 0 <= got["ops-job"]["node_age_s"] <= got["ops-job"]["age_s"] < 30
    assert got["web-job"]["app"] == "default" and got["web-job"]["node_timeout_s"] == 9.0

    # The page's view is the HTTP front's app: its own task only, its own
    # app's figures only; the sources all the same.
    js = stats_json(f)
    assert [t["task_id"] for t in js["tasks"]["running_tasks"]] == ["web-job"]
    assert js["tasks"]["running_tasks"][0]["node"] == "fetch"
    assert [a["name"] for a in js["apps"]] == ["default"]
    assert "secret-node" not in json.dumps(js) and "ops-job" not in json.dumps(js)
    assert [s["name"] for s in js["sources"]] == ["m1"]
    # On the Unix socket the reader is its uid's app: here the admin `ops`,
    # who sees every task, as its `polygwctl stats` does.
    js = stats_json(f, unix=True)
    assert {t["task_id"] for t in js["tasks"]["running_tasks"]} == {"ops-job", "web-job"}

    # A task without a node has no node keys; a finished one is gone.
    assert c.request("task.node_end", {"task_id": "ops-job"})[0] is None
    t = {x["task_id"]: x for x in c.request("stats")[1]["tasks"]["running_tasks"]}["ops-job"]
    assert "node" not in t and "node_timeout_s" not in t
    assert f.curl("/polygw/v1/tasks/web-job/finish", {"ok": True})[0] == 200
    assert [x["task_id"] for x in c.request("stats")[1]["tasks"]["running_tasks"]] == ["ops-job"]
    c.close()


def test_status__remote_peer_refused_unless_allowed(make_sidecar, up):
    addr = local_non_loopback_ipv4()
    if not addr:
        pytest.skip("no non-loopback IPv4 address on this host")
    for allow in (False, True):
        port = free_port()
        text = (config_yaml([source_yaml("m1", "chat", up.url, FAST)], DEFAULTS) +
                http_section(listen="0.0.0.0:%d" % port, allow_remote=True,
                             allow_status_remote=allow))
        sc = make_sidecar(config_text=text, subdir="allow%d" % allow)
        wait_port(addr, port)
        for path in ("/polygw/", "/polygw/v1/stats"):
            remote = curl_status("http://%s:%d%s" % (addr, port, path))
            local = curl_status("http://127.0.0.1:%d%s" % (port, path))
            assert local == 200, path
            assert remote == (200 if allow else 403), (path, remote)
        # The rest of the front is not affected by the rule.
        assert curl_status("http://%s:%d/healthz" % (addr, port)) == 200
        sc.stop()


def local_non_loopback_ipv4():
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            return parts[parts.index("inet") + 1].split("/")[0]
    return None


def wait_port(host, port):
    for _ in range(250):
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)
    raise AssertionError("port %d never accepted" % port)


def curl_status(url):
    out = subprocess.run(["curl", "-s", "-i", "--max-time", "5", url],
                         capture_output=True, timeout=10).stdout.decode()
    return parse_response(out)[0]


def test_status__stats_json_carries_the_redis_backend_section(make_sidecar, up, workdir):
    """The state backend writes its own `stats` pairs: on the Redis backend
    they reach the page's JSON whole, as the method's msgpack has them."""
    from redis_fixture import FleetRedis, fleet_config, source, unique_prefix, wait_backend
    srv = FleetRedis().start()
    try:
        port = free_port()
        text = fleet_config(srv.url(), unique_prefix(), [source("m1", "chat", up.url)]) + \
            http_section(listen="127.0.0.1:%d" % port, socket=os.path.join(workdir, "h.sock"))
        sc = make_sidecar(config_text=text)
        f = Front(sc, port, os.path.join(workdir, "h.sock"))
        wait_backend(sc)
        c = sc.connect()
        mp = c.request("stats")[1]
        js = stats_json(f, unix=True)
        assert set(js) == set(mp), set(js) ^ set(mp)
        assert js["backend"]["kind"] == "redis" and set(js["backend"]) == set(mp["backend"])
        c.close()
    finally:
        srv.cleanup()

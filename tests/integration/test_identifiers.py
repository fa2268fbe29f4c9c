"""Identifiers a client supplies (scope, task id, node, app, capability) on
both fronts, through the real sidecar: bytes that are not UTF-8, or too many
of them, are refused with a typed `bad_request` before anything is created
(the error's header and body agree), and `stats` and the logs stay valid
UTF-8 and keep answering for everyone afterwards (proto/PROTOCOL.md §3,
§4.3, §4.4; docs/HTTP.md)."""
import json
import os
import sys

import msgpack
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import chat  # noqa: E402
from test_http import assert_error, front, read_response  # noqa: E402,F401

BAD = (b"\xff\xfe", b"a\xc0\xafb", b"\xed\xa0\x80", b"t\xe2\x82")  # stray, overlong, surrogate, cut


def raw_request(f, head, body=b""):
    """One HTTP/1.1 request written byte for byte on TCP: (status, headers, body)."""
    s = f.raw()
    try:
        s.sendall(head + b"Host: localhost\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
                  % len(body) + body)
        return read_response(s)
    finally:
        s.close()


def http_stats(f):
    status, _, body = f.curl("/polygw/v1/stats")
    assert status == 200, body
    return json.loads(body)


def assert_utf8_logs(sc):
    with open(sc.log_path, "rb") as fh:
        fh.read().decode("utf-8")  # strict: raises on any invalid byte


def pack_with_raw_str(obj, placeholder, raw):
    """Packs `obj`, then swaps the str `placeholder` (same length as `raw`)
    for the bytes `raw` under the same str header."""
    assert len(placeholder.encode()) == len(raw)
    data = msgpack.packb(obj, use_bin_type=True)
    p = msgpack.packb(placeholder)
    assert data.count(p) == 1
    return data.replace(p, p[:len(p) - len(raw)] + raw)


def rpc_raw(c, method, params, placeholder, raw):
    msgid = c.next_id
    c.next_id += 1
    c.send_raw(pack_with_raw_str([0, msgid, method, [params]], placeholder, raw))
    msg = c.wait_response(msgid)
    return msg[2], msg[3]


def placeholder_for(raw):
    return "q" * len(raw)


# ------------------------------------------------------------ HTTP front
@pytest.mark.parametrize("raw", BAD)
def test_identifiers__http_scope_and_task_headers_not_utf8_are_400(front, up, raw):
    f = front()
    before = len(up.requests())
    for name in (b"X-Polygw-Scope", b"X-Polygw-Task"):
        body = json.dumps(chat("x")).encode()
        status, hdrs, text = raw_request(
            f, b"POST /v1/chat/completions HTTP/1.1\r\n" + name + b": " + raw +
            b"\r\nContent-Type: application/json\r\n", body)
        err = assert_error(status, hdrs, text.decode("utf-8"), 400, "bad_request")
        assert name.decode() in err["message"], err
    assert len(up.requests()) == before  # nothing reached the upstream
    st = http_stats(f)
    assert st["scopes"] == {}
    assert_utf8_logs(f.sc)


def test_identifiers__http_task_path_not_utf8_is_400_and_creates_nothing(front, up):
    f = front()
    for path in (b"/polygw/v1/tasks/%ff%fe/start", b"/polygw/v1/tasks/a%c0%afb/start",
                 b"/polygw/v1/tasks/%ed%a0%80/start", b"/polygw/v1/tasks/t%e2%82"):
        method = b"POST " if path.endswith(b"/start") else b"GET "
        status, hdrs, text = raw_request(f, method + path + b" HTTP/1.1\r\n")
        err = assert_error(status, hdrs, text.decode("utf-8"), 400, "bad_request")
        assert "task id" in err["message"], err
    st = http_stats(f)
    assert st["tasks"]["held"] == 0 and st["tasks"]["running_tasks"] == []
    assert_utf8_logs(f.sc)


def test_identifiers__http_length_limits_hold(front, up):
    f = front()
    status, hdrs, text = raw_request(
        f, b"POST /v1/chat/completions HTTP/1.1\r\nX-Polygw-Scope: " + b"s" * 256 +
        b"\r\nContent-Type: application/json\r\n", json.dumps(chat("x")).encode())
    assert_error(status, hdrs, text.decode(), 400, "bad_request")
    # A 255-byte scope of multi-byte characters is fine.
    scope = ("\u00e9" * 127 + "s").encode()
    status, hdrs, text = raw_request(
        f, b"POST /v1/chat/completions HTTP/1.1\r\nX-Polygw-Scope: " + scope +
        b"\r\nContent-Type: application/json\r\n", json.dumps(chat("x")).encode())
    assert status == 200, text
    assert scope.decode() in http_stats(f)["scopes"]
    status, _, _ = raw_request(f, b"POST /polygw/v1/tasks/" + b"t" * 129 + b"/start HTTP/1.1\r\n")
    assert status == 400
    tid = "\u00e9" * 64  # 128 bytes
    status, _, body = raw_request(f, b"POST /polygw/v1/tasks/" + ("%C3%A9" * 64).encode() +
                                  b"/start HTTP/1.1\r\n")
    assert status == 200 and json.loads(body)["task_id"] == tid


# ------------------------------------------------------------ msgpack front
@pytest.mark.parametrize("raw", BAD)
def test_identifiers__rpc_call_scope_task_app_capability_not_utf8(front, up, raw):
    f = front()
    c = f.sc.connect()
    ph = placeholder_for(raw)
    base = {"capability": "chat", "body": chat("x")}
    for key in ("scope", "task_id", "app", "capability"):
        params = dict(base, **{key: ph})
        err, res = rpc_raw(c, "call", params, ph, raw)
        assert res is None and err["code"] == "bad_request", (key, err)
        assert key in err["message"], err
    assert len(up.requests()) == 0
    err, res = c.request("stats")
    assert err is None and res["scopes"] == {}
    assert http_stats(f)["scopes"] == {}
    assert_utf8_logs(f.sc)


@pytest.mark.parametrize("raw", BAD)
def test_identifiers__rpc_task_id_node_and_hello_not_utf8(sidecar, raw):
    c = sidecar.connect()
    ph = placeholder_for(raw)
    for method in ("task.start", "task.get", "task.stop", "task.guard", "task.finish"):
        params = {"task_id": ph}
        if method == "task.finish":
            params["ok"] = True
        err, _ = rpc_raw(c, method, params, ph, raw)
        assert err["code"] == "bad_request" and "task_id" in err["message"], (method, err)
    assert c.request("task.start", {"task_id": "t"})[0] is None
    err, _ = rpc_raw(c, "task.node_begin", {"task_id": "t", "node": ph}, ph, raw)
    assert err["code"] == "bad_request" and "node" in err["message"], err
    err, _ = rpc_raw(c, "task.node_end", {"task_id": "t", "node": ph}, ph, raw)
    assert err["code"] == "bad_request" and "node" in err["message"], err
    err, _ = rpc_raw(c, "hello", {"app": ph}, ph, raw)
    assert err["code"] == "bad_request" and "app" in err["message"], err
    err, res = c.request("stats")
    assert err is None
    assert [t["task_id"] for t in res["tasks"]["running_tasks"]] == ["t"]
    assert "node" not in res["tasks"]["running_tasks"][0]
    assert_utf8_logs(sidecar)


def test_identifiers__rpc_task_created_over_msgpack_keeps_http_stats_up(front, up):
    """The case that took the status page down: one odd task id (here a
    valid but unusual one) must leave GET /polygw/v1/stats answering."""
    f = front()
    c = f.sc.connect()
    raw = b"\xff\xfe"
    err, _ = rpc_raw(c, "task.start", {"task_id": "qq"}, "qq", raw)
    assert err["code"] == "bad_request"
    assert c.request("task.start", {"task_id": "\u2603 \U0001f600"})[0] is None
    st = http_stats(f)
    assert [t["task_id"] for t in st["tasks"]["running_tasks"]] == ["\u2603 \U0001f600"]

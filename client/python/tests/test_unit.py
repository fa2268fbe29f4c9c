"""The client against a scripted fake sidecar (a thread on a Unix socket):
routing of pipelined answers and chunks, the fatal `error` notification,
garbage from the peer, unknown messages, and the typed error mapping."""
import asyncio
import os
import pickle
import socket
import tempfile
import threading
import time

import msgpack
import pytest

import polygw
from polygw import errors
from polygw._core import call_params


class FakeSidecar:
    """Accepts connections on a temp socket; `handler(conn)` runs per
    connection in its own thread. conn.requests() yields decoded messages."""

    def __init__(self, handler):
        self.dir = tempfile.mkdtemp(prefix="pgwfk", dir="/tmp")
        self.path = os.path.join(self.dir, "s.sock")
        self.ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ls.bind(self.path)
        self.ls.listen(8)
        self.ls.settimeout(10)
        self.handler = handler
        self.errors = []
        self.accepted = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                s, _ = self.ls.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._run, args=(s,), daemon=True).start()

    def _run(self, s):
        s.settimeout(10)
        try:
            self.handler(FakeConn(s))
        except Exception as e:   # surfaced by close()
            self.errors.append(e)
        finally:
            s.close()

    def close(self):
        self.ls.close()
        os.unlink(self.path)
        os.rmdir(self.dir)
        assert not self.errors, self.errors


class FakeConn:
    def __init__(self, s):
        self.s = s
        self.up = msgpack.Unpacker(raw=False)

    def recv(self):
        while True:
            for msg in self.up:
                return msg
            data = self.s.recv(65536)
            if not data:
                return None
            self.up.feed(data)

    def send(self, obj):
        self.s.sendall(obj if isinstance(obj, bytes) else msgpack.packb(obj))


@pytest.fixture
def fake():
    made = []

    def factory(handler):
        f = FakeSidecar(handler)
        made.append(f)
        return f

    yield factory
    for f in made:
        f.close()


# ---------------------------------------------------------------- errors
def test_every_wire_code_has_its_class():
    codes = ["stalled", "retry_exhausted", "upstream_rejected", "deadline_exceeded",
             "cancelled", "task_stopped", "watchdog_timeout", "stream_interrupted",
             "backend_unavailable", "budget_exhausted", "bad_request", "unknown_method",
             "unknown_capability", "too_large", "overloaded", "shutting_down", "internal"]
    assert sorted(errors.ERROR_CLASSES) == sorted(codes)
    for code in codes:
        e = errors.error_from_wire({"code": code, "message": "m"})
        assert type(e) is errors.ERROR_CLASSES[code] and e.code == code
        assert isinstance(e, polygw.PolygwError)
        assert e.retry_later == (code in ("stalled", "retry_exhausted", "backend_unavailable",
                                          "overloaded", "shutting_down"))
        assert isinstance(e, polygw.RetryLaterError) == e.retry_later
        assert isinstance(e, polygw.TaskNotRunningError) == (code in ("task_stopped",
                                                                      "watchdog_timeout"))


def test_error_attributes_and_unknown_code():
    e = errors.error_from_wire({
        "code": "upstream_rejected", "message": "no", "status": 400, "attempts": 1,
        "retry_after_s": 0.0, "stalled_s": 0.25,
        "upstream_body": {"error": {"type": "invalid_request_error"}},
        "sources": [{"name": "a", "reason": "http_4xx"}], "future_key": [1]})
    assert isinstance(e, polygw.UpstreamRejectedError)
    assert (e.status, e.attempts, e.retry_after_s, e.stalled_s) == (400, 1, 0.0, 0.25)
    assert e.upstream_body["error"]["type"] == "invalid_request_error"
    assert e.sources == [{"name": "a", "reason": "http_4xx"}]
    assert e.data["future_key"] == [1]
    assert str(e) == "upstream_rejected: no"
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is type(e) and e2.status == 400
    u = errors.error_from_wire({"code": "quota_exhausted", "message": "later"})
    assert isinstance(u, polygw.InternalError) and u.code == "quota_exhausted"
    t = errors.error_from_wire({"code": "unknown_method", "message": "x"}, method="task.get")
    assert isinstance(t, polygw.TasksNotSupportedError)
    assert isinstance(t, polygw.UnknownMethodError) and "not supported" in str(t)
    assert errors.error_from_wire({"code": "stalled"}).retry_after_s is None


def test_call_params_send_only_what_the_caller_set():
    assert call_params("chat", {}) == {"capability": "chat", "body": {}}
    assert call_params("chat", {}, stream=True, task_id="t", deadline_s=0, scope="s") == {
        "capability": "chat", "body": {}, "stream": True, "task_id": "t", "deadline_s": 0,
        "scope": "s"}


def test_socket_path_from_argument_env_default(monkeypatch):
    monkeypatch.delenv("POLYGW_SOCKET", raising=False)
    assert polygw.Client().socket_path == "/run/polygw/polygw.sock"
    monkeypatch.setenv("POLYGW_SOCKET", "/tmp/x.sock")
    assert polygw.Client().socket_path == "/tmp/x.sock"
    assert polygw.AsyncClient().socket_path == "/tmp/x.sock"
    assert polygw.Client("/tmp/y.sock").socket_path == "/tmp/y.sock"


def test_connect_failed():
    with pytest.raises(polygw.ConnectFailedError) as e:
        polygw.Client("/tmp/pgw-no-such.sock").ping()
    assert e.value.code == "connect_failed"


# ---------------------------------------------------------------- fake sidecar
def test_pipelined_answers_out_of_order_chunks_and_noise(fake):
    def handler(c):
        reqs = [c.recv() for _ in range(3)]
        assert [r[2] for r in reqs] == ["ping", "call", "stats"]
        assert reqs[1][3] == [{"capability": "chat", "body": {"x": 1}, "stream": True}]
        ping, call, stats = reqs
        c.send([2, "hello_from_the_future", [1]])            # unknown: ignored
        c.send([0, 99, "ping", []])                           # request from sidecar: ignored
        c.send([1, stats[1], None, {"n": 3}])
        c.send([2, "chunk", [12345, {"stray": True}]])        # unknown msgid: ignored
        c.send([2, "chunk", [call[1], {"i": 0}]])
        data = msgpack.packb([2, "chunk", [call[1], {"i": 1}]]) + \
            msgpack.packb([1, ping[1], None, {"version": "9"}])
        for i in range(len(data)):                            # byte by byte
            c.s.sendall(data[i:i + 1])
        c.send([1, call[1], None, {"source": "a"}])
        assert c.recv() is None

    f = fake(handler)
    c = polygw.Client(f.path)
    results = {}

    def stats():
        results["stats"] = c.stats()

    def ping():
        results["ping"] = c.ping()

    t1 = threading.Thread(target=ping)
    t1.start()
    # keep the order of the three requests deterministic
    deadline = time.monotonic() + 5
    while c._conn is None or not c._conn.session.pending:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    stream = c.call("chat", {"x": 1}, stream=True)
    t2 = threading.Thread(target=stats)
    t2.start()
    events = list(stream)
    t1.join(5)
    t2.join(5)
    assert events == [{"i": 0}, {"i": 1}]
    assert stream.result == {"source": "a"}
    assert results == {"stats": {"n": 3}, "ping": {"version": "9"}}
    c.close()


@pytest.mark.parametrize("notification,code", [
    ({"code": "too_large", "message": "message exceeds max_message_bytes"}, "too_large"),
    ({"code": "overloaded", "message": "too many connections"}, "overloaded"),
])
def test_fatal_error_notification_fails_pending(fake, notification, code):
    def handler(c):
        c.recv()
        c.recv()
        # a response after the fatal notification is ignored
        c.send(msgpack.packb([2, "error", [notification]]) + msgpack.packb([1, 1, None, {}]))

    f = fake(handler)
    c = polygw.Client(f.path)
    out = []
    t = threading.Thread(target=lambda: out.append(pytest.raises(
        polygw.ConnectionLostError, c.ping)))
    t.start()
    with pytest.raises(polygw.ConnectionLostError) as e:
        c.call("chat", {})
    t.join(5)
    assert e.value.code == code
    assert e.value.retry_later == (code == "overloaded")
    assert out and out[0].value.code == code


def test_garbage_from_the_sidecar_is_a_protocol_error(fake):
    def handler(c):
        c.recv()
        c.s.sendall(b"\xc1")
        c.recv()

    f = fake(handler)
    c = polygw.Client(f.path)
    with pytest.raises(polygw.ProtocolError):
        c.ping()


def test_eof_fails_pending_then_reconnects(fake):
    state = {"n": 0}

    def handler(c):
        state["n"] += 1
        req = c.recv()
        if state["n"] == 1:
            return                                # close without answering
        c.send([1, req[1], None, {"version": "again"}])
        c.recv()

    f = fake(handler)
    c = polygw.Client(f.path)
    with pytest.raises(polygw.ConnectionLostError) as e:
        c.ping()
    assert e.value.code == "connection_lost" and e.value.retry_later
    assert c.ping() == {"version": "again"}
    assert f.accepted == 2
    c.close()


def test_client_timeout_cancels_the_call(fake):
    seen = []

    def handler(c):
        req = c.recv()
        seen.append(c.recv())                     # the cancel
        c.send([1, req[1], {"code": "cancelled", "message": "cancelled"}, None])
        c.recv()

    f = fake(handler)
    c = polygw.Client(f.path)
    with pytest.raises(polygw.ClientTimeoutError):
        c.call("chat", {}, timeout_s=0.05)
    assert seen[0][:2] == [2, "cancel"]
    c.close()


def test_async_fatal_notification_and_reconnect(fake):
    state = {"n": 0}

    def handler(c):
        state["n"] += 1
        req = c.recv()
        if state["n"] == 1:
            c.send([2, "error", [{"code": "bad_request", "message": "malformed msgpack"}]])
            return
        c.send([1, req[1], None, {"version": "ok"}])
        c.recv()

    f = fake(handler)

    async def main():
        async with polygw.AsyncClient(f.path) as c:
            with pytest.raises(polygw.ConnectionLostError) as e:
                await c.ping()
            assert e.value.code == "bad_request" and not e.value.retry_later
            assert await c.ping() == {"version": "ok"}

    asyncio.run(main())


def test_an_unanswered_cancel_is_bounded(fake):
    def handler(c):
        while c.recv() is not None:     # requests and cancels, never answered
            pass

    f = fake(handler)
    c = polygw.Client(f.path, cancel_timeout_s=0.1)
    t0 = time.monotonic()
    with pytest.raises(polygw.ClientTimeoutError):
        c.call("chat", {}, timeout_s=0.05)
    stream = c.call("chat", {}, stream=True)
    stream.cancel()
    with pytest.raises(polygw.CancelledError):
        next(stream)
    assert time.monotonic() - t0 < 2
    c.close()

    async def main():
        async with polygw.AsyncClient(f.path, cancel_timeout_s=0.1) as ac:
            with pytest.raises(polygw.ClientTimeoutError):
                await ac.call("chat", {}, timeout_s=0.05)
    asyncio.run(main())


def test_aio_bounded_wait_lets_a_same_iteration_cancel_through():
    """A cancel that lands in the loop iteration where the awaited write
    completes must still cancel (asyncio.wait_for before 3.12 drops it, and
    a cancelled async call then ran on to the sidecar's own timeout)."""
    from polygw.aio import _bounded

    async def main():
        loop = asyncio.get_running_loop()
        written = loop.create_future()

        async def start():
            await _bounded(written, 5)
            return "ran on"

        task = asyncio.ensure_future(start())
        for _ in range(3):
            await asyncio.sleep(0)         # the task is inside _bounded now
        written.set_result(None)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        slow = loop.create_future()
        with pytest.raises(asyncio.TimeoutError):
            await _bounded(slow, 0.01)
        assert slow.cancelled()
        assert await _bounded(asyncio.sleep(0, "ok"), 5) == "ok"

    asyncio.run(main())


def test_graph_stopped_kinds_and_budget_exhausted():
    """A task the sidecar stopped because its budget ran out (reason
    "budget") is kind "budget", neither a user stop nor a hang; the call
    the budget refused is BudgetExhaustedError, not retry-later."""
    kinds = {}
    for code, reason in (("task_stopped", "budget"), ("task_stopped", "user"),
                         ("watchdog_timeout", "node x exceeded 1s")):
        e = errors.error_from_wire({"code": code, "message": "m", "reason": reason})
        kinds[(code, reason)] = errors.GraphStoppedError.from_error(e, "t", "write").kind
    assert kinds == {("task_stopped", "budget"): "budget", ("task_stopped", "user"): "stopped",
                     ("watchdog_timeout", "node x exceeded 1s"): "watchdog"}
    e = errors.error_from_wire({"code": "budget_exhausted", "message": "m",
                                "budget": "task:t:total", "left": 0.5})
    assert isinstance(e, errors.BudgetExhaustedError) and not e.retry_later
    assert e.data["budget"] == "task:t:total" and e.retry_after_s is None
    assert errors.GraphStoppedError.from_error(e, "t", "write") is None

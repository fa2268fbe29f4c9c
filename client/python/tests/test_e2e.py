"""The end-to-end scenario against the real sidecar and the real mock upstream,
with both clients: success, streaming, every error code a test can provoke,
cancellation closing the upstream connection, pipelining, reconnection after
a sidecar restart, and tasks (when the sidecar has them)."""
import asyncio
import os
import signal
import threading
import time

import pytest

import polygw
from pgwtest import chat

CLOSE_BOUND_S = 0.05    # cancel -> upstream connection closed (as tests/integration)


def upstream_closed(up, t0, aborted=1):
    """Polls the mock until the cancelled attempt's connection is closed;
    returns the seconds since t0."""
    up.wait_stats(lambda s: s["open_connections"] == 0 and s["aborted_by_peer"] == aborted,
                  timeout=2, interval=0.002)
    return time.monotonic() - t0


def wait_in_progress(up, n=1):
    """Until the mock holds n requests unanswered (a hang is in place)."""
    up.wait_stats(lambda s: s["in_progress"] == n, timeout=10)


def tasks_supported(client):
    try:
        client.request("task.get", {"task_id": "probe-%d" % os.getpid()})
    except polygw.TasksNotSupportedError:
        return False
    except polygw.PolygwError:
        return True      # e.g. bad_request for an unknown id: the method exists
    return True


NO_TASKS = "the sidecar answers unknown_method to task.* (PROTOCOL §4.4 not implemented yet)"


# ================================================================ blocking client
def test_sync_success(sidecar, up):
    with polygw.Client(sidecar.sock) as c:
        assert c.ping()["version"]
        res = c.call("chat", chat("Say hi"))
        assert res["body"]["choices"][0]["message"]["content"] == "Say hi"
        assert res["source"] == "a" and res["attempts"] == 1
        assert res["usage"]["total_tokens"] > 0
        assert isinstance(res["elapsed_s"], float) and res["stalled_s"] == 0
        st = c.stats()
        assert st["requests"]["served"] >= 2 and st["connections"]["open"] >= 1
        assert up.last()["json"]["messages"] == [{"role": "user", "content": "Say hi"}]


def test_sync_stream_chunks_arrive_before_the_end(sidecar, up):
    with polygw.Client(sidecar.sock) as c:
        t0 = time.monotonic()
        stream = c.call("chat", chat("abcdefghijkl", stream_events=4, stream_interval_ms=100),
                        stream=True)
        seen = [(time.monotonic() - t0, ev) for ev in stream]
        t_end = time.monotonic() - t0
        text = "".join(ev["choices"][0]["delta"].get("content", "") for _, ev in seen
                       if ev.get("choices"))
        assert text == "abcdefghijkl"
        assert len(seen) >= 5
        assert seen[0][0] < t_end - 0.25, "first chunk only at the end: %r" % seen
        assert stream.result["source"] == "a" and "body" not in stream.result
        assert stream.result["usage"]["completion_tokens"] > 0
        assert up.last()["json"]["stream"] is True


@pytest.mark.parametrize("case", ["bad_request", "unknown_method", "unknown_capability",
                                  "upstream_rejected", "retry_exhausted", "deadline_exceeded"])
def test_sync_typed_errors(sidecar, up, case):
    with polygw.Client(sidecar.sock) as c:
        if case == "bad_request":
            with pytest.raises(polygw.BadRequestError) as e:
                c.call("chat", chat(), deadline_s=-1)
        elif case == "unknown_method":
            with pytest.raises(polygw.UnknownMethodError) as e:
                c.request("no.such.method")
        elif case == "unknown_capability":
            with pytest.raises(polygw.UnknownCapabilityError) as e:
                c.call("no-such-capability", chat())
        elif case == "upstream_rejected":
            with pytest.raises(polygw.UpstreamRejectedError) as e:
                c.call("chat", chat(status=400))
            assert e.value.status == 400 and e.value.attempts == 1
            assert e.value.upstream_body["error"]["type"] == "invalid_request_error"
            assert e.value.sources[0]["name"] == "a"
            assert not e.value.retry_later
        elif case == "retry_exhausted":
            with pytest.raises(polygw.RetryLaterError) as e:
                c.call("chat", chat(status=500))
            assert isinstance(e.value, polygw.RetryExhaustedError)
            assert e.value.attempts == 1 and e.value.status == 500
            assert e.value.sources[0]["reason"] == "http_5xx"
        elif case == "deadline_exceeded":
            t0 = time.monotonic()
            with pytest.raises(polygw.DeadlineExceededError) as e:
                c.call("chat", chat(delay_ms=2000), deadline_s=0.2)
            assert time.monotonic() - t0 < 1.5
        assert e.value.code == case and e.value.message
        assert c.ping()["version"]          # the connection stays usable


def test_sync_stalled_is_retry_later(make_sidecar, up):
    window = 0.3
    sc = make_sidecar(defaults={"stall_window_s": window},
                      source={"timeout_s": window, "ttft_timeout_s": window,
                              "idle_timeout_s": window, "connect_timeout_s": window})
    with polygw.Client(sc.sock) as c:
        try:
            c.call("chat", chat(status=429))
            pytest.fail("an all-429 chat did not stall")
        except polygw.RetryLaterError as e:      # the one clause for "retry later"
            assert isinstance(e, polygw.StalledError) and e.code == "stalled"
            assert e.stalled_s >= window * 0.9
            assert isinstance(e.retry_after_s, float)
            assert e.sources[0]["reason"] == "http_429"


@pytest.fixture
def sigint_raises():
    """Python's own SIGINT handler (KeyboardInterrupt) for the test's
    duration: a process started in the background (`nohup make test &`, some
    CI runners) inherits SIGINT as ignored, and Python then never installs
    it."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_sync_keyboard_interrupt_cancels_and_closes_upstream(sidecar, up, sigint_raises):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("SIGINT reaches only the main thread")
    with polygw.Client(sidecar.sock) as c:
        fired = []

        def interrupt():
            wait_in_progress(up)
            fired.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

        t = threading.Thread(target=interrupt)
        t.start()
        with pytest.raises(KeyboardInterrupt):
            c.call("chat", chat(hang="before_headers"), timeout_s=10)
        t.join(5)
        closed = upstream_closed(up, fired[0])
        print("timing: SIGINT -> upstream connection closed <= %.1f ms" % (closed * 1000))
        assert closed < CLOSE_BOUND_S
        st = c.stats()
        assert st["rejected"]["cancelled"] == 1 and st["requests"]["cancels"] == 1


def test_sync_stream_cancel_and_abandon(sidecar, up):
    with polygw.Client(sidecar.sock) as c:
        stream = c.call("chat", chat("abcdefgh", stream_events=8, stream_interval_ms=200),
                        stream=True)
        first = next(stream)
        assert first["choices"][0]["delta"]["content"]
        t0 = time.monotonic()
        stream.cancel()
        assert upstream_closed(up, t0) < CLOSE_BOUND_S
        with pytest.raises(polygw.CancelledError):  # the call's end, as the sidecar said
            next(stream)
        # Dropping a stream mid-way (break out of the loop) cancels it at its next chunk.
        for ev in c.call("chat", chat("abcdefgh", stream_events=8, stream_interval_ms=50),
                         stream=True):
            break
        upstream_closed(up, time.monotonic(), aborted=2)
        assert c.ping()["version"]


def test_sync_pipelined_on_one_connection(sidecar, up):
    with polygw.Client(sidecar.sock) as c:
        c.connect()
        conn = c._conn
        done = []

        def one(i, delay):
            res = c.call("chat", chat("n%d" % i, delay_ms=delay))
            done.append(res["body"]["choices"][0]["message"]["content"])

        threads = [threading.Thread(target=one, args=(i, d))
                   for i, d in enumerate([400, 250, 100, 0])]
        for t in threads:
            t.start()
            time.sleep(0.01)
        for t in threads:
            t.join(10)
        assert done == ["n3", "n2", "n1", "n0"]     # answered in any order
        assert c._conn is conn


def test_sync_reconnects_after_sidecar_restart(make_sidecar, up):
    sc = make_sidecar(grace=0.3)
    with polygw.Client(sc.sock) as c:
        assert c.ping()["version"]
        # a call in flight at shutdown is answered shutting_down after the grace period
        out = []
        t = threading.Thread(target=lambda: out.append(
            pytest.raises(polygw.RetryLaterError, c.call, "chat", chat(hang="before_headers"))))
        t.start()
        wait_in_progress(up)
        assert sc.stop() == 0
        t.join(10)
        assert isinstance(out[0].value, (polygw.ShuttingDownError, polygw.ConnectionLostError))
        with pytest.raises(polygw.ConnectFailedError):
            c.ping()
        make_sidecar(grace=0.3)                     # a new process, same socket path
        assert c.ping()["uptime_s"] < 5
        assert c.call("chat", chat("back"))["body"]["choices"][0]["message"]["content"] == "back"


def test_sync_task_stop_ends_the_call(sidecar, up):
    with polygw.Client(sidecar.sock) as c, polygw.Client(sidecar.sock) as other:
        if not tasks_supported(c):
            pytest.skip(NO_TASKS)
        tid = "py-sync-%d" % os.getpid()
        with pytest.raises(polygw.TaskStoppedError):
            with c.task(tid) as task:
                with task.node("build_skeleton"):
                    threading.Timer(0.2, lambda: other.task(tid).stop("user asked")).start()
                    task.call("chat", chat(hang="before_headers"))
        upstream_closed(up, time.monotonic())
        got = other.task(tid).get()
        assert got["state"] == "failed" and got["reason_kind"] == "stopped"
        with pytest.raises(polygw.TaskStoppedError):
            other.task(tid).guard()


def test_sync_task_lifecycle(sidecar, up):
    with polygw.Client(sidecar.sock) as c:
        if not tasks_supported(c):
            pytest.skip(NO_TASKS)
        tid = "py-life-%d" % os.getpid()
        with c.task(tid) as task:
            with task.node("plan", timeout_s=30):
                assert task.call("chat", chat("in a task"))["attempts"] == 1
        assert c.task(tid).get()["state"] == "succeeded"
        assert any(t["task_id"] == tid for t in c.tasks("succeeded"))


def test_sync_task_handle_budget_reaches_start(sidecar, up):
    """A handle made with a budget starts its run with it, called as
    start() as well as through `with` (a budget silently lost would lift
    the run's cost cap)."""
    with polygw.Client(sidecar.sock) as c:
        if not tasks_supported(c):
            pytest.skip(NO_TASKS)
        tid = "py-budget-%d" % os.getpid()
        res = c.task(tid, budget=5).start()
        assert res["budget"]["limit"] == 5, res
        res = c.task(tid + "-b", budget=5).start(budget=2)
        assert res["budget"]["limit"] == 2, res


# ================================================================ asyncio client
def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_async_success_and_stream(sidecar, up):
    async def main():
        async with polygw.AsyncClient(sidecar.sock) as c:
            assert (await c.ping())["version"]
            res = await c.call("chat", chat("async hi"))
            assert res["body"]["choices"][0]["message"]["content"] == "async hi"
            t0 = time.monotonic()
            stream = await c.call("chat", chat("abcdefgh", stream_events=4,
                                                stream_interval_ms=100), stream=True)
            seen = []
            async for ev in stream:
                seen.append((time.monotonic() - t0, ev))
            t_end = time.monotonic() - t0
            assert "".join(ev["choices"][0]["delta"].get("content", "") for _, ev in seen
                           if ev.get("choices")) == "abcdefgh"
            assert seen[0][0] < t_end - 0.25
            assert stream.result["source"] == "a" and "body" not in stream.result
    run(main())


def test_async_typed_errors(make_sidecar, up):
    window = 0.3
    sc = make_sidecar(defaults={"stall_window_s": window},
                      source={"timeout_s": window, "ttft_timeout_s": window,
                              "idle_timeout_s": window, "connect_timeout_s": window})

    async def main():
        async with polygw.AsyncClient(sc.sock) as c:
            cases = [
                (c.call("chat", chat(), deadline_s=0), polygw.BadRequestError),
                (c.request("nope"), polygw.UnknownMethodError),
                (c.call("nope", chat()), polygw.UnknownCapabilityError),
                (c.call("chat", chat(status=400)), polygw.UpstreamRejectedError),
                (c.call("chat", chat(status=500)), polygw.RetryExhaustedError),
                (c.call("chat", chat(delay_ms=2000), deadline_s=0.1),
                 polygw.DeadlineExceededError),
                (c.call("chat", chat(status=429)), polygw.StalledError),
            ]
            # all at once, pipelined on the one connection
            got = await asyncio.gather(*(coro for coro, _ in cases), return_exceptions=True)
            for (_, cls), err in zip(cases, got):
                assert type(err) is cls, (cls, err)
            assert got[3].status == 400
            assert [isinstance(e, polygw.RetryLaterError) for e in got] == \
                [False, False, False, False, True, False, True]
    run(main())


def test_async_task_cancel_closes_upstream(sidecar, up):
    async def main():
        async with polygw.AsyncClient(sidecar.sock) as c:
            call = asyncio.ensure_future(c.call("chat", chat(hang="before_headers")))
            await asyncio.get_running_loop().run_in_executor(None, wait_in_progress, up)
            assert not call.done(), call
            t0 = time.monotonic()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            closed = upstream_closed(up, t0)
            print("timing: task.cancel() -> upstream connection closed <= %.1f ms"
                  % (closed * 1000))
            assert closed < CLOSE_BOUND_S
            # a stream consumer cancelled mid-way, through wait_for
            stream = await c.call("chat", chat("abcdefgh", stream_events=8,
                                                stream_interval_ms=200), stream=True)
            await stream.__anext__()

            async def drain():
                async for _ in stream:
                    pass
            t0 = time.monotonic()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(drain(), 0.05)
            assert upstream_closed(up, t0, aborted=2) < 0.05 + CLOSE_BOUND_S
            st = await c.stats()
            assert st["rejected"]["cancelled"] == 2
    run(main())


def test_async_reconnects_after_sidecar_restart(make_sidecar, up):
    sc = make_sidecar()

    async def main():
        async with polygw.AsyncClient(sc.sock) as c:
            first = await c.ping()
            assert sc.stop() == 0      # blocks the loop: the EOF is seen only later
            make_sidecar()             # a new process, same socket path
            again = await c.ping()
            assert again["uptime_s"] < first["uptime_s"] + 5
            res = await c.call("chat", chat("back"))
            assert res["body"]["choices"][0]["message"]["content"] == "back"
    run(main())


def test_async_task_helpers(sidecar, up):
    async def main():
        async with polygw.AsyncClient(sidecar.sock) as c:
            try:
                await c.task("probe").get()
            except polygw.TasksNotSupportedError:
                pytest.skip(NO_TASKS)
            except polygw.PolygwError:
                pass
            tid = "py-async-%d" % os.getpid()
            with pytest.raises(polygw.TaskStoppedError):
                async with c.task(tid) as task:
                    async with task.node("build_skeleton"):
                        async def stop_soon():
                            await asyncio.sleep(0.2)
                            await c.task(tid).stop("user asked")
                        stopper = asyncio.ensure_future(stop_soon())
                        await task.call("chat", chat(hang="before_headers"))
            await stopper
            assert (await c.task(tid).get())["reason_kind"] == "stopped"
    run(main())

"""polygw.graph against the real sidecar and mock upstream, without a
framework: a three-node graph (plan -> build_skeleton -> write) whose
checkpoint is a dict {"state", "next"}, run with the sync Client (in a worker
thread) and with the AsyncClient (in an event loop thread), so that every
test body stays the same: start the run, act, read the run's outcome."""
import asyncio
import concurrent.futures
import subprocess
import threading
import time

import pytest

from pgwtest import chat, harness

import polygw
from polygw.graph import TASK_HEADER, current_node, node, task_scope

STOP_TO_CLOSE_MS = 100      # task.stop -> the call's upstream connection closed
HANG = {"hang": "before_headers"}


def _content(res):
    return res["body"]["choices"][0]["message"]["content"]


def _prompts():
    return [("plan", "outline", lambda s: "outline of %s" % s["topic"]),
            ("build_skeleton", "skeleton", lambda s: "skeleton for %s" % s["outline"]),
            ("write", "text", lambda s: "text from %s" % s["skeleton"])]


def sync_nodes(runs, timeouts):
    def make(name, key, prompt):
        @node(name, timeout_s=timeouts.get(name))
        def step(state):
            runs[name] += 1
            n = current_node()
            assert n.headers == {TASK_HEADER: n.task_id}
            return {key: _content(n.call("chat", chat(prompt(state))))}
        return step
    return [make(*p) for p in _prompts()]


def async_nodes(runs, timeouts):
    def make(name, key, prompt):
        @node(name, timeout_s=timeouts.get(name))
        async def step(state):
            runs[name] += 1
            return {key: _content(await current_node().call("chat", chat(prompt(state))))}
        return step
    return [make(*p) for p in _prompts()]


class Runner:
    """Runs the graph in the background; submit() returns a concurrent Future."""

    def __init__(self, mode, sock):
        self.mode = mode
        self.sock = sock
        self.runs = {"plan": 0, "build_skeleton": 0, "write": 0}
        self.pool = concurrent.futures.ThreadPoolExecutor(1)
        self.loop = None
        if mode == "asyncio":
            self.loop = asyncio.new_event_loop()
            self.loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True)
            self.loop_thread.start()

    def submit(self, thread, task_id, timeouts=None):
        timeouts = timeouts or {}
        if self.mode == "sync":
            return self.pool.submit(self._run_sync, thread, task_id, sync_nodes(self.runs, timeouts))
        return asyncio.run_coroutine_threadsafe(
            self._run_async(thread, task_id, async_nodes(self.runs, timeouts)), self.loop)

    def run(self, thread, task_id, timeouts=None):
        return self.submit(thread, task_id, timeouts).result(timeout=30)

    def _run_sync(self, thread, task_id, nodes):
        with polygw.Client(self.sock) as pgw, task_scope(pgw.task(task_id)):
            while thread["next"] < len(nodes):
                thread["state"].update(nodes[thread["next"]](thread["state"]))
                thread["next"] += 1
        return thread

    async def _run_async(self, thread, task_id, nodes):
        async with polygw.AsyncClient(self.sock) as pgw:
            async with task_scope(pgw.task(task_id)):
                while thread["next"] < len(nodes):
                    thread["state"].update(await nodes[thread["next"]](thread["state"]))
                    thread["next"] += 1
        return thread

    def close(self):
        self.pool.shutdown(wait=True)
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.loop_thread.join(5)
            self.loop.close()


@pytest.fixture(params=["sync", "asyncio"])
def runner(request, sidecar):
    r = Runner(request.param, sidecar.sock)
    yield r
    r.close()


def new_thread(topic):
    return {"state": {"topic": topic}, "next": 0}


def hung(up, nth):
    return up.wait_stats(lambda s: s["requests"] == nth and s["in_progress"] == 1, timeout=10)


def closed(up):
    return up.wait_stats(lambda s: s["aborted_by_peer"] == 1 and s["open_connections"] == 0)


def stop_with_client(sock, task_id, reason):
    with polygw.Client(sock) as c:
        c.task(task_id).stop(reason)


def stop_with_polygwctl(sock, task_id, reason):
    subprocess.run([harness.POLYGWCTL, "--socket", sock, "task", "stop", task_id,
                    "--reason", reason], check=True, timeout=10, capture_output=True)


def assert_resumes(runner, thread, task_id):
    before = dict(runner.runs)
    done = runner.run(thread, task_id)
    st = done["state"]
    assert done["next"] == 3
    assert st["text"] == "text from skeleton for outline of %s" % st["topic"]
    assert runner.runs["plan"] == before["plan"], "a completed node ran again on resume"
    assert runner.runs["build_skeleton"] == before["build_skeleton"] + 1
    assert runner.runs["write"] == before["write"] + 1
    with polygw.Client(runner.sock) as c:
        assert c.task(task_id).get()["state"] == "succeeded"


@pytest.mark.parametrize("stop", [stop_with_client, stop_with_polygwctl],
                         ids=["client", "polygwctl"])
def test_stop_in_flight_closes_the_call_and_resumes(runner, up, stop):
    up.script([{}, HANG, {}, {}])
    thread = new_thread("polygw")
    run = runner.submit(thread, "doc#1")
    hung(up, 2)
    t0 = time.time()
    stop(runner.sock, "doc#1", "user pressed stop")
    err = run.exception(timeout=10)
    t_end = time.time()
    st = closed(up)
    with polygw.Client(runner.sock) as c:
        info = c.task("doc#1").get()

    stop_at_ms = info["updated_at"] * 1000
    assert stop_at_ms - 5 <= st["last_abort_at_ms"] < stop_at_ms + STOP_TO_CLOSE_MS, \
        "upstream closed %.1f ms after the stop" % (st["last_abort_at_ms"] - stop_at_ms)
    assert isinstance(err, polygw.GraphStoppedError), repr(err)
    assert isinstance(err, polygw.TaskNotRunningError)
    assert (err.kind, err.code, err.node, err.task_id, err.reason) == \
        ("stopped", "task_stopped", "build_skeleton", "doc#1", "user pressed stop")
    assert isinstance(err.__cause__, polygw.TaskStoppedError)
    assert t_end - t0 < 1.0
    assert runner.runs == {"plan": 1, "build_skeleton": 1, "write": 0}
    assert (info["state"], info["reason_kind"]) == ("failed", "stopped")
    # the checkpoint: every completed node's output, the stopped node still next
    assert thread["next"] == 1
    assert thread["state"] == {"topic": "polygw", "outline": "outline of polygw"}

    # a stop is final for its task id; a new one resumes
    again = runner.submit(thread, "doc#1").exception(timeout=10)
    assert isinstance(again, polygw.GraphStoppedError) and again.node is None
    assert runner.runs == {"plan": 1, "build_skeleton": 1, "write": 0}
    assert_resumes(runner, thread, "doc#2")
    assert up.stats()["requests"] == 4


def test_watchdog_fails_a_hung_node_and_the_next_run_is_unaffected(runner, up):
    up.script([{}, HANG])
    thread = new_thread("wd")
    run = runner.submit(thread, "wd#1", {"build_skeleton": 0.5})
    hung(up, 2)
    t0 = time.monotonic()
    err = run.exception(timeout=10)
    waited = time.monotonic() - t0
    assert isinstance(err, polygw.GraphStoppedError), repr(err)
    assert (err.kind, err.code, err.node) == ("watchdog", "watchdog_timeout", "build_skeleton")
    assert isinstance(err.__cause__, polygw.WatchdogTimeoutError)
    assert not isinstance(err.__cause__, polygw.TaskStoppedError)
    assert "build_skeleton" in err.reason
    assert 0.2 < waited < 1.0, "watchdog after %.3f s, want 0.5 s" % waited
    closed(up)
    with polygw.Client(runner.sock) as c:
        info = c.task("wd#1").get()
        assert (info["state"], info["reason_kind"]) == ("failed", "watchdog")
        assert c.stats()["tasks"]["watchdog_fired"] == 1
    assert thread["next"] == 1 and runner.runs["write"] == 0

    other = runner.run(new_thread("next"), "next#1")        # the worker's next graph
    assert other["state"]["text"] == "text from skeleton for outline of next"
    assert_resumes(runner, thread, "wd#2")


def test_learned_watchdog_after_20_runs(runner, up):
    """Without timeout_s: defaults.node_timeout_s (600 s) until the node name
    has 20 durations, then 3 x their p99, never below 1 s."""
    for i in range(20):
        assert runner.run(new_thread("h%d" % i), "h%d#1" % i)["next"] == 3
    up.script([{}, HANG])
    run = runner.submit(new_thread("learned"), "learned#1")
    hung(up, 62)
    t0 = time.monotonic()
    err = run.exception(timeout=10)
    waited = time.monotonic() - t0
    assert isinstance(err, polygw.GraphStoppedError), repr(err)
    assert (err.kind, err.node) == ("watchdog", "build_skeleton")
    assert "exceeded 1" in err.reason, err.reason
    assert 0.7 < waited < 1.5, "watchdog after %.3f s, want the learned 1 s" % waited
    closed(up)


def test_failures_stay_failures_and_nodes_need_a_task(runner, up):
    up.script([{}, {"status": 400}])
    err = runner.submit(new_thread("f"), "f#1").exception(timeout=10)
    assert isinstance(err, polygw.UpstreamRejectedError), repr(err)
    with polygw.Client(runner.sock) as c:
        info = c.task("f#1").get()
    assert (info["state"], info["reason_kind"]) == ("failed", "error")

    @node("lonely")
    def lonely(state):
        return state

    with pytest.raises(RuntimeError, match="no current task"):
        lonely({})


def test_node_block_keeps_a_finished_body_and_the_scope_reports_a_late_stop(sidecar, up):
    with polygw.Client(sidecar.sock) as c:
        done = False
        with pytest.raises(polygw.GraphStoppedError) as ei:
            with task_scope(c.task("blk#1")):
                with node("only", timeout_s=5) as n:
                    assert n.watchdog == {"timeout_s": 5.0, "timeout_source": "explicit"}
                    assert n.call("chat", chat("x"))["attempts"] == 1
                    c.task("blk#1").stop("late")    # the body is done: node_end is refused
                done = True                         # ... and the block still completed
        assert done
        assert (ei.value.kind, ei.value.node, ei.value.reason) == ("stopped", None, "late")


def test_async_node_block_and_the_scope_reports_a_late_stop(sidecar, up):
    async def main():
        async with polygw.AsyncClient(sidecar.sock) as c:
            with pytest.raises(polygw.GraphStoppedError) as ei:
                async with task_scope(c.task("ablk#1")):
                    async with node("only") as n:
                        assert n.watchdog["timeout_source"] == "default"
                        await n.call("chat", chat("x"))
                        await c.task("ablk#1").stop("late")
                    blocks.append("only")
            return ei.value
    blocks = []
    err = asyncio.run(main())
    assert blocks == ["only"], "the finished block raised at node_end"
    assert (err.kind, err.node, err.reason) == ("stopped", None, "late")


def test_async_parallel_nodes_of_one_task_complete(sidecar, up):
    """Two nodes of one task at once (asyncio.gather): the second node_begin
    replaces the first, so one node_end finds no node in progress -- a
    finished node still returns its result."""
    @node("a")
    async def a():
        return (await current_node().call("chat", chat("a", delay_ms=100)))["attempts"]

    @node("b")
    async def b():
        return (await current_node().call("chat", chat("b")))["attempts"]

    async def main():
        async with polygw.AsyncClient(sidecar.sock) as c:
            async with task_scope(c.task("par#1")):
                got = await asyncio.gather(a(), b())
            return got, (await c.task("par#1").get())["state"]
    assert asyncio.run(main()) == ([1, 1], "succeeded")

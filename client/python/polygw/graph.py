"""Agent-graph nodes governed by a polygw task (PROTOCOL §4.4).

Glue around the task methods, nothing more. A run of a graph is one task;
``task_scope`` starts it, makes it the current task of the code inside
(a ``contextvars`` variable: threads, asyncio tasks and frameworks that copy
the context see it), and finishes it. ``node`` -- a decorator for sync and
async node functions, or a ``with`` / ``async with`` block -- checks the task
at the node's start (task.guard: a stopped task raises at the boundary,
before the body runs), arms the watchdog (task.node_begin: the node's own
timeout, else the learned one), and disarms it after (task.node_end). Inside,
``current_node().call(...)`` carries the task id into every call.

A stop comes from anywhere (``task.stop`` from a UI, ``polygwctl task stop
ID``): the sidecar ends the task's calls in flight at once, the node raises,
and every error while the task is stopped or failed by the watchdog surfaces
as one ``GraphStoppedError`` (``kind`` "stopped" | "watchdog"). A stop is
final for its task id: resume the graph from its last completed node under a
new task id::

    import polygw
    from polygw.graph import current_node, node, task_scope

    @node("plan")
    def plan(state):
        res = current_node().call("chat", {"messages": [...]})
        return {"outline": res["body"]["choices"][0]["message"]["content"]}

    NODES = [plan, build_skeleton, write]

    def run(pgw, thread, attempt):      # thread: {"state": {...}, "next": 0}
        with task_scope(pgw.task("%s#%d" % (thread["id"], attempt))):
            while thread["next"] < len(NODES):
                thread["state"].update(NODES[thread["next"]](thread["state"]))
                thread["next"] += 1      # the checkpoint: this node is done

    try:
        run(pgw, thread, 1)
    except polygw.GraphStoppedError as e:
        print(e.kind, e.node, e.reason)  # then, when the user says so:
        run(pgw, thread, 2)              # continues at thread["next"]
"""

import contextlib
import contextvars
import functools
import inspect

from . import errors
from .aio import AsyncTask

__all__ = ["TASK_HEADER", "NodeContext", "node", "task_scope", "current_task", "current_node"]

TASK_HEADER = "X-Polygw-Task"

_task = contextvars.ContextVar("polygw_graph_task", default=None)
_node = contextvars.ContextVar("polygw_graph_node", default=None)


def current_task():
    """The Task / AsyncTask of the innermost ``task_scope``, or None."""
    return _task.get()


def current_node():
    """The NodeContext of the running governed node, or None."""
    return _node.get()


class NodeContext:
    """A governed node as its body sees it: the task, the watchdog armed
    (task.node_begin's answer ``{timeout_s, timeout_source}``), and ``call``
    / ``headers`` that carry the task id into the node's LLM calls."""

    def __init__(self, task, name, watchdog):
        self.task = task
        self.task_id = task.task_id
        self.name = name
        self.watchdog = watchdog

    def call(self, capability, body, **kw):
        """``client.call`` with this task's id (awaitable under an AsyncTask)."""
        return self.task.call(capability, body, **kw)

    @property
    def headers(self):
        """Headers naming the task, for an SDK pointed at polygw's HTTP front."""
        return {TASK_HEADER: self.task_id}


def _tolerated_end(exc):
    # Stopped just now: the next boundary raises. bad_request: another node
    # of the same task began meanwhile (one watchdog slot per task).
    return isinstance(exc, (errors.TaskNotRunningError, errors.BadRequestError))


def _stopped(task, exc, node_name, guard_error):
    """The GraphStoppedError for `exc`, or None when it is not the task's verdict."""
    v = errors.GraphStoppedError.from_error(exc, task.task_id, node_name)
    if v is None and guard_error is not None:
        v = errors.GraphStoppedError.from_error(guard_error, task.task_id, node_name)
    return v


def _check(task, exc, node_name):
    """Sync: `exc` seen while running; the verdict to raise instead, or None."""
    if isinstance(exc, errors.TaskNotRunningError) or not isinstance(exc, Exception):
        return _stopped(task, exc, node_name, None)
    try:
        task.guard()
    except errors.PolygwError as g:
        return _stopped(task, exc, node_name, g)
    return None


async def _acheck(task, exc, node_name):
    if isinstance(exc, errors.TaskNotRunningError) or not isinstance(exc, Exception):
        return _stopped(task, exc, node_name, None)
    try:
        await task.guard()
    except errors.PolygwError as g:
        return _stopped(task, exc, node_name, g)
    return None


def _raise_verdict(v, exc):
    """Raises the verdict `v` (from `exc`) unless it is None or `exc` itself."""
    if v is not None and v is not exc:
        raise v from exc


def _task_for(name, want_async):
    task = _task.get()
    if task is None:
        raise RuntimeError("governed node %s: no current task (run it inside "
                           "polygw.graph.task_scope(client.task(ID)))" % name)
    if isinstance(task, AsyncTask) != want_async:
        raise TypeError("governed node %s: %s node under %s" % (
            name, "an async" if want_async else "a sync", type(task).__name__))
    return task


class node:
    """Node `name` governed by the current task: a decorator for sync or
    async functions, or a ``with`` / ``async with`` block (which gives the
    NodeContext). `timeout_s` is the node's own watchdog timeout; without it
    the sidecar's learned one (3 x p99 of the name's history), else
    ``defaults.node_timeout_s``. A body that completed keeps its result when
    the stop lands just before node_end: the node is done, the next boundary
    raises."""

    def __init__(self, name, timeout_s=None):
        self.name = name
        self.timeout_s = timeout_s
        self._tokens = []

    def _entered(self, task, watchdog):
        ctx = NodeContext(task, self.name, watchdog)
        self._tokens.append(_node.set(ctx))
        return ctx

    def _left(self):
        ctx = _node.get()
        _node.reset(self._tokens.pop())
        return ctx.task

    # ------------------------------------------------------------ sync
    def __enter__(self):
        task = _task_for(self.name, False)
        try:
            task.guard()
            watchdog = task.node_begin(self.name, self.timeout_s)
        except errors.PolygwError as e:
            _raise_verdict(errors.GraphStoppedError.from_error(e, task.task_id, self.name), e)
            raise
        return self._entered(task, watchdog)

    def __exit__(self, exc_type, exc, tb):
        task = self._left()
        if exc is None:
            try:
                task.node_end(self.name)
            except errors.PolygwError as e:
                if not _tolerated_end(e):
                    raise
            return False
        with contextlib.suppress(errors.PolygwError):
            task.node_end(self.name)
        _raise_verdict(_check(task, exc, self.name), exc)
        return False

    # ------------------------------------------------------------ asyncio
    async def __aenter__(self):
        task = _task_for(self.name, True)
        try:
            await task.guard()
            watchdog = await task.node_begin(self.name, self.timeout_s)
        except errors.PolygwError as e:
            _raise_verdict(errors.GraphStoppedError.from_error(e, task.task_id, self.name), e)
            raise
        return self._entered(task, watchdog)

    async def __aexit__(self, exc_type, exc, tb):
        task = self._left()
        if exc is None:
            try:
                await task.node_end(self.name)
            except errors.PolygwError as e:
                if not _tolerated_end(e):
                    raise
            return False
        with contextlib.suppress(errors.PolygwError):
            await task.node_end(self.name)
        _raise_verdict(await _acheck(task, exc, self.name), exc)
        return False

    # ------------------------------------------------------------ decorator
    def __call__(self, fn):
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def agoverned(*args, **kw):
                async with node(self.name, self.timeout_s):
                    return await fn(*args, **kw)
            return agoverned

        @functools.wraps(fn)
        def governed(*args, **kw):
            with node(self.name, self.timeout_s):
                return fn(*args, **kw)
        return governed


class task_scope:
    """One run of a graph as `task` (a Task or AsyncTask): ``with`` /
    ``async with`` starts it, makes it the current task, and finishes it (ok,
    or failed with the error's text). Raises GraphStoppedError when the task
    was stopped or failed by the watchdog -- also when it is refused at start
    (a stop is final for a task id: resume under a new one) or stopped after
    the last node."""

    def __init__(self, task):
        self.task = task
        self._tokens = []

    def _verdict(self, exc):
        return errors.GraphStoppedError.from_error(exc, self.task.task_id, None)

    def __enter__(self):
        try:
            self.task.__enter__()
        except errors.TaskNotRunningError as e:
            raise self._verdict(e) from e
        self._tokens.append(_task.set(self.task))
        return self.task

    def __exit__(self, exc_type, exc, tb):
        _task.reset(self._tokens.pop())
        v = None if exc is None else _check(self.task, exc, None)
        try:
            self.task.__exit__(type(v) if v else exc_type, v or exc, tb)
        except errors.TaskNotRunningError as e:
            raise self._verdict(e) from e
        _raise_verdict(v, exc)
        return False

    async def __aenter__(self):
        try:
            await self.task.__aenter__()
        except errors.TaskNotRunningError as e:
            raise self._verdict(e) from e
        self._tokens.append(_task.set(self.task))
        return self.task

    async def __aexit__(self, exc_type, exc, tb):
        _task.reset(self._tokens.pop())
        v = None if exc is None else await _acheck(self.task, exc, None)
        try:
            await self.task.__aexit__(type(v) if v else exc_type, v or exc, tb)
        except errors.TaskNotRunningError as e:
            raise self._verdict(e) from e
        _raise_verdict(v, exc)
        return False

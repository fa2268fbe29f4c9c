"""The asyncio client: one Unix-socket connection per AsyncClient, requests
pipelined on it from any number of tasks, a reader task routing responses
and stream chunks. Bound to the event loop it is first used in."""

import asyncio
import contextlib

from . import errors
from ._core import Session, call_params, init_settings, peer_hung_up
from .client import _reason
from .protocol import DEFAULT_MAX_MESSAGE_BYTES

__all__ = ["AsyncClient", "AsyncCallStream", "AsyncTask"]

_READ_SIZE = 1 << 16


async def _bounded(aw, timeout_s):
    """``await aw`` for at most timeout_s (asyncio.TimeoutError after).

    Not asyncio.wait_for: before Python 3.12 it returns the inner result
    when a cancellation arrives in the same loop iteration as that result,
    and the caller's cancel is lost (a cancelled call would run on to its
    sidecar-side timeout). asyncio.wait lets the CancelledError through."""
    inner = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({inner}, timeout=timeout_s)
    except asyncio.CancelledError:
        inner.cancel()
        raise
    if not done:
        inner.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await inner
        raise asyncio.TimeoutError()
    return inner.result()


class _Connection:
    def __init__(self, reader, writer, max_message_bytes):
        self.reader = reader
        self.writer = writer
        self.session = Session(max_message_bytes)
        self.task = None

    def fileno(self):
        sock = self.writer.get_extra_info("socket")
        return -1 if sock is None else sock.fileno()


class AsyncClient:
    """An asyncio polygw client; the same surface as :class:`polygw.Client`
    with coroutines.

    Cancelling the task that awaits a call (``task.cancel()``,
    ``asyncio.wait_for`` expiring, Ctrl-C under ``asyncio.run``) sends
    ``cancel`` to the sidecar and waits (at most ``cancel_timeout_s``) for
    its answer -- so the upstream connection is closed -- before the
    ``asyncio.CancelledError`` propagates.
    """

    def __init__(self, socket_path=None, *, connect_timeout_s=5.0, request_timeout_s=30.0,
                 call_timeout_s=3600.0, cancel_timeout_s=5.0,
                 max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES):
        init_settings(self, socket_path, connect_timeout_s, request_timeout_s, call_timeout_s,
                      cancel_timeout_s, max_message_bytes)
        self._conn = None
        self._connecting = None
        self._closed = False

    # ------------------------------------------------------------ lifecycle
    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def connect(self):
        """Opens the connection now (it is opened on demand otherwise)."""
        await self._connection()
        return self

    async def close(self):
        """Closes the connection; pending requests fail with ConnectionLostError."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.writer.close()
            if conn.task is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.wait({conn.task}, timeout=5.0)

    aclose = close

    @property
    def connected(self):
        conn = self._conn
        return conn is not None and conn.session.broken is None

    async def _connection(self):
        if self._closed:
            raise errors.ConnectionLostError("client closed")
        conn = self._conn
        if conn is not None and conn.session.broken is None and not conn.writer.is_closing():
            if not peer_hung_up(conn.fileno()):
                return conn
            self._conn = None        # its reader task fails what is pending on it
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._open())
        fut = self._connecting
        try:
            return await asyncio.shield(fut)
        finally:
            if self._connecting is fut and fut.done():
                self._connecting = None

    async def _open(self):
        try:
            reader, writer = await _bounded(
                asyncio.open_unix_connection(self.socket_path), self.connect_timeout_s)
        except (OSError, asyncio.TimeoutError) as e:
            raise errors.ConnectFailedError("cannot connect to %s: %s"
                                            % (self.socket_path, e or "timeout")) from None
        conn = _Connection(reader, writer, self.max_message_bytes)
        conn.task = asyncio.ensure_future(self._read_loop(conn))
        self._conn = conn
        return conn

    async def _read_loop(self, conn):
        reason = None
        try:
            while True:
                try:
                    data = await conn.reader.read(_READ_SIZE)
                except OSError as e:
                    reason = str(e)
                    break
                if not data:
                    reason = "closed by the sidecar"
                    break
                changed, cancels = conn.session.receive(data)
                for call in changed:
                    call.wake()
                for msgid in cancels:
                    self._write(conn, conn.session.cancel_bytes(msgid))
                if conn.session.broken is not None:
                    break
        finally:
            for call in conn.session.connection_lost(reason):
                call.wake()
            if self._conn is conn:
                self._conn = None
            conn.writer.close()

    @staticmethod
    def _write(conn, data):
        if conn.session.broken is None and not conn.writer.is_closing():
            conn.writer.write(data)

    # ------------------------------------------------------------ requests
    async def _start(self, method, params, stream=False):
        conn = await self._connection()
        call, data = conn.session.new_call(method, params, stream)
        call.waiter = asyncio.Event()
        call.wake = call.waiter.set
        try:
            conn.writer.write(data)
            await _bounded(conn.writer.drain(), self.request_timeout_s)
        except asyncio.CancelledError:
            await self._cancel(conn, call)     # it was written: have it cancelled
            raise
        except (OSError, RuntimeError, asyncio.TimeoutError) as e:
            conn.session.forget(call)
            for other in conn.session.connection_lost("write failed: %s" % (e or "timeout")):
                other.wake()
            conn.writer.close()
            raise errors.ConnectionLostError("write failed: %s" % (e or "timeout")) from None
        return conn, call

    @staticmethod
    async def _wait(call, deadline):
        """Waits until the call is done or has an event; False on timeout."""
        loop = asyncio.get_running_loop()
        while not call.done and not call.events:
            if deadline is not None and loop.time() >= deadline:
                return False
            call.waiter.clear()
            timer = None if deadline is None else loop.call_at(deadline, call.waiter.set)
            try:
                await call.waiter.wait()
            finally:
                if timer is not None:
                    timer.cancel()
        return True

    async def _cancel(self, conn, call):
        """Sends `cancel` and waits (bounded) for the sidecar's answer.
        Usable from a CancelledError handler: it only awaits an Event."""
        if call.done:
            return
        if not call.cancel_sent:
            call.cancel_sent = True
            self._write(conn, conn.session.cancel_bytes(call.msgid))
        deadline = asyncio.get_running_loop().time() + self.cancel_timeout_s
        while not call.done:
            call.events.clear()
            if not await self._wait(call, deadline):
                conn.session.forget(call)        # its late answer is dropped
                call.finish(errors.CancelledError(
                    "cancelled (the sidecar did not answer the cancel in time)"), None)
                return

    def _deadline(self, timeout_s):
        return None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s

    async def _finish(self, conn, call, timeout_s):
        deadline = self._deadline(timeout_s)
        try:
            while True:
                if not await self._wait(call, deadline):
                    await self._cancel(conn, call)
                    if call.done and call.error is None:
                        return call.result
                    raise errors.ClientTimeoutError(
                        "no answer to %s within %gs (cancelled)" % (call.method, timeout_s))
                if call.done:
                    break
                call.events.clear()
        except asyncio.CancelledError:
            await self._cancel(conn, call)
            raise
        if call.error is not None:
            raise errors.fresh(call.error)
        return call.result

    async def request(self, method, params=None, *, timeout_s=None):
        """Any method by name with a dict of named parameters."""
        conn, call = await self._start(method, params)
        if timeout_s is None:
            timeout_s = self.call_timeout_s if method == "call" else self.request_timeout_s
        return await self._finish(conn, call, timeout_s)

    async def ping(self):
        return await self.request("ping")

    async def stats(self):
        return await self.request("stats")

    async def call(self, capability, body, *, stream=False, task_id=None, deadline_s=None,
                   scope=None, timeout_s=None, trace=None, event_names=False):
        """As :meth:`polygw.Client.call`; with ``stream=True`` returns an
        :class:`AsyncCallStream` (``async for event in stream``)."""
        params = call_params(capability, body, stream, task_id, deadline_s, scope, trace,
                             event_names)
        conn, call = await self._start("call", params, stream=bool(stream))
        if timeout_s is None:
            timeout_s = self.call_timeout_s
        if stream:
            return AsyncCallStream(self, conn, call, self._deadline(timeout_s), timeout_s)
        return await self._finish(conn, call, timeout_s)

    # ------------------------------------------------------------ tasks
    def task(self, task_id, budget=None, trace=None):
        return AsyncTask(self, task_id, budget, trace)

    async def tasks(self, state=None):
        res = await self.request("task.list", {"state": state} if state is not None else None)
        return res.get("tasks", []) if isinstance(res, dict) else []


class AsyncCallStream:
    """A streaming call: ``async for event in stream`` yields each upstream
    event (a dict); afterwards ``result`` holds the final response. Cancelling
    the consuming task, ``await stream.cancel()`` or leaving an ``async with``
    block early cancels the call (and waits for the sidecar's answer)."""

    def __init__(self, client, conn, call, deadline, timeout_s):
        self._client = client
        self._conn = conn
        self._call = call
        self._deadline = deadline
        self._timeout_s = timeout_s
        self.result = None

    @property
    def msgid(self):
        return self._call.msgid

    def __aiter__(self):
        return self

    async def __anext__(self):
        client, call = self._client, self._call
        try:
            if not await client._wait(call, self._deadline):
                await client._cancel(self._conn, call)
                if not (call.done and call.error is None):
                    raise errors.ClientTimeoutError(
                        "stream not finished within %gs (cancelled)" % self._timeout_s)
        except asyncio.CancelledError:
            await client._cancel(self._conn, call)
            raise
        if call.events:
            return call.events.popleft()
        if call.error is not None:
            raise errors.fresh(call.error)
        self.result = call.result
        raise StopAsyncIteration

    async def cancel(self):
        await self._client._cancel(self._conn, self._call)
        self._call.events.clear()

    aclose = cancel

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        if not self._call.done:
            await self.cancel()

    def __del__(self):
        call = getattr(self, "_call", None)
        if call is not None:
            call.abandon()


class AsyncTask:
    """:class:`polygw.Task` for the AsyncClient::

        async with client.task("run-42") as task:
            async with task.node("build_skeleton"):
                await task.call("chat", body)
    """

    def __init__(self, client, task_id, budget=None, trace=None):
        self.client = client
        self.task_id = task_id
        self.budget = budget
        self.trace = trace

    async def _req(self, method, **params):
        params = {k: v for k, v in params.items() if v is not None}
        params["task_id"] = self.task_id
        return await self.client.request(method, params)

    async def start(self, budget=None, trace=None):
        """A new run; ``budget``: what its calls may cost, in the sidecar's
        currency; ``trace``: a W3C carrier, the parent of the run's trace.
        Either one left out is the handle's."""
        return await self._req("task.start", budget=self.budget if budget is None else budget,
                               trace=self.trace if trace is None else trace)

    async def stop(self, reason):
        return await self._req("task.stop", reason=reason)

    async def guard(self):
        await self._req("task.guard")

    async def node_begin(self, node, timeout_s=None):
        return await self._req("task.node_begin", node=node, timeout_s=timeout_s)

    async def node_end(self, node):
        return await self._req("task.node_end", node=node)

    async def finish(self, ok=True, reason=None):
        return await self._req("task.finish", ok=bool(ok), reason=reason)

    async def get(self):
        return await self._req("task.get")

    async def call(self, capability, body, **kw):
        return await self.client.call(capability, body, task_id=self.task_id, **kw)

    @contextlib.asynccontextmanager
    async def node(self, name, timeout_s=None):
        await self.guard()
        await self.node_begin(name, timeout_s)
        try:
            yield self
        except BaseException:
            with contextlib.suppress(errors.PolygwError):
                await self.node_end(name)
            raise
        await self.node_end(name)

    async def __aenter__(self):
        await self.start(self.budget, self.trace)
        return self

    async def __aexit__(self, exc_type, exc, tb):
        if exc_type is None:
            await self.finish(True)
        elif not issubclass(exc_type, (errors.TaskNotRunningError, errors.ConnectionLostError,
                                       errors.ConnectFailedError)):
            with contextlib.suppress(errors.PolygwError):
                await self.finish(False, _reason(exc_type, exc))
        return False

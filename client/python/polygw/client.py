"""The blocking client: one Unix-socket connection, requests pipelined on it
(from any number of threads), a reader thread that routes responses and
stream chunks to whoever waits for them."""

import contextlib
import errno
import socket
import threading
import time

from . import errors
from ._core import Session, call_params, init_settings, peer_hung_up
from .protocol import DEFAULT_MAX_MESSAGE_BYTES

__all__ = ["Client", "CallStream", "Task"]

_READ_SIZE = 1 << 16


class _Connection:
    def __init__(self, sock, max_message_bytes):
        self.sock = sock
        self.session = Session(max_message_bytes)
        self.wlock = threading.Lock()
        self.thread = None


class Client:
    """A blocking polygw client.

    ``socket_path``: the sidecar's socket (default ``$POLYGW_SOCKET``, then
    ``/run/polygw/polygw.sock``). The connection is opened on first use and
    opened again after it was lost (e.g. the sidecar restarted); requests
    pending when it is lost fail with :class:`ConnectionLostError`.

    Thread-safe: several threads may call at once; their requests share the
    connection (pipelined, answered in any order).

    Timeouts are client-side safety nets in seconds (the sidecar enforces the
    real deadlines): ``request_timeout_s`` for ping/stats/task methods and
    writes, ``call_timeout_s`` for calls (a call that outlives it is
    cancelled and raises :class:`ClientTimeoutError`), ``cancel_timeout_s``
    for the sidecar's answer to a cancel.
    """

    def __init__(self, socket_path=None, *, connect_timeout_s=5.0, request_timeout_s=30.0,
                 call_timeout_s=3600.0, cancel_timeout_s=5.0,
                 max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES):
        init_settings(self, socket_path, connect_timeout_s, request_timeout_s, call_timeout_s,
                      cancel_timeout_s, max_message_bytes)
        self._lock = threading.RLock()
        self._conn = None
        self._closed = False

    # ------------------------------------------------------------ lifecycle
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def connect(self):
        """Opens the connection now (it is opened on demand otherwise)."""
        with self._lock:
            self._connection()
        return self

    def close(self):
        """Closes the connection. Requests still pending fail with
        ConnectionLostError; the sidecar cancels them."""
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            self._shutdown(conn)
            if conn.thread is not None and conn.thread is not threading.current_thread():
                conn.thread.join(5.0)

    @property
    def connected(self):
        conn = self._conn
        return conn is not None and conn.session.broken is None

    def _connection(self):
        # with self._lock held
        if self._closed:
            raise errors.ConnectionLostError("client closed", code="connection_lost")
        conn = self._conn
        if conn is not None and conn.session.broken is None:
            if not peer_hung_up(conn.sock.fileno()):
                return conn
            self._conn = None       # its reader thread fails what is pending on it
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.connect_timeout_s)
            sock.connect(self.socket_path)
            sock.settimeout(self.request_timeout_s)    # bounds writes; reads loop
        except OSError as e:
            sock.close()
            raise errors.ConnectFailedError("cannot connect to %s: %s"
                                            % (self.socket_path, e)) from None
        conn = _Connection(sock, self.max_message_bytes)
        conn.thread = threading.Thread(target=self._read_loop, args=(conn,),
                                       name="polygw-reader", daemon=True)
        self._conn = conn
        conn.thread.start()
        return conn

    def _read_loop(self, conn):
        reason = None
        try:
            while True:
                try:
                    data = conn.sock.recv(_READ_SIZE)
                except socket.timeout:
                    continue
                except OSError as e:
                    reason = str(e)
                    break
                if not data:
                    reason = "closed by the sidecar"
                    break
                with self._lock:
                    changed, cancels = conn.session.receive(data)
                    for call in changed:
                        call.wake()
                for msgid in cancels:
                    self._send(conn, conn.session.cancel_bytes(msgid), quiet=True)
                if conn.session.broken is not None:
                    break
        finally:
            with self._lock:
                for call in conn.session.connection_lost(reason):
                    call.wake()
                if self._conn is conn:
                    self._conn = None
            self._shutdown(conn)
            conn.sock.close()

    @staticmethod
    def _shutdown(conn):
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _send(self, conn, data, quiet=False):
        try:
            with conn.wlock:
                try:
                    conn.sock.sendall(data)
                except BaseException:
                    # Interrupted (Ctrl-C) or failed mid-message: the stream
                    # can no longer be trusted; the sidecar cancels what was
                    # in flight on it when it sees the connection close.
                    self._shutdown(conn)
                    raise
            return True
        except OSError as e:
            # A request cut mid-way leaves the stream unusable.
            with self._lock:
                for call in conn.session.connection_lost("write failed: %s" % e):
                    call.wake()
                if self._conn is conn:
                    self._conn = None
            self._shutdown(conn)
            if quiet:
                return False
            raise

    # ------------------------------------------------------------ requests
    def _start(self, method, params, stream=False):
        """Sends a request; returns (connection, pending call)."""
        for attempt in (1, 2):
            with self._lock:
                conn = self._connection()
                call, data = conn.session.new_call(method, params, stream)
                call.waiter = threading.Condition(self._lock)
                call.wake = call.waiter.notify_all
            try:
                self._send(conn, data)
                return conn, call
            except OSError as e:
                # The sidecar closed this connection (it restarted) before
                # reading the whole request: nothing ran, so one retry on a
                # new connection is safe.
                closed = isinstance(e, (BrokenPipeError, ConnectionResetError)) or \
                    e.errno == errno.EBADF
                if attempt == 2 or not closed:
                    raise errors.ConnectionLostError("write failed: %s" % e) from None

    def _wait(self, call, deadline):
        """Waits until the call is done or has an event; False on timeout."""
        cond = call.waiter
        with self._lock:
            while not call.done and not call.events:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                cond.wait(left)
        return True

    def _cancel(self, conn, call, wait=True):
        """Sends `cancel` for the call and waits (bounded) for its answer."""
        with self._lock:
            if call.done:
                return
            send = not call.cancel_sent
            call.cancel_sent = True
        if send and conn.session.broken is None:
            self._send(conn, conn.session.cancel_bytes(call.msgid), quiet=True)
        if not wait:
            return
        deadline = time.monotonic() + self.cancel_timeout_s
        with self._lock:
            cond = call.waiter
            while not call.done:
                left = deadline - time.monotonic()
                if left <= 0:
                    conn.session.forget(call)    # its late answer is dropped
                    call.finish(errors.CancelledError(
                        "cancelled (the sidecar did not answer the cancel in time)"), None)
                    break
                cond.wait(left)

    def _finish(self, conn, call, timeout_s):
        """Waits for the final response; returns the result or raises."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while True:
                if not self._wait(call, deadline):
                    self._cancel(conn, call)
                    if call.done and call.error is None:
                        return call.result      # it won the race
                    raise errors.ClientTimeoutError(
                        "no answer to %s within %gs (cancelled)" % (call.method, timeout_s))
                if call.done:
                    break
                with self._lock:
                    call.events.clear()         # chunks nobody asked for
        except KeyboardInterrupt:
            self._cancel(conn, call)
            raise
        if call.error is not None:
            raise errors.fresh(call.error)
        return call.result

    def request(self, method, params=None, *, timeout_s=None):
        """Any method by name with a dict of named parameters; returns its
        result. For methods this stub has no helper for (PROTOCOL §8)."""
        conn, call = self._start(method, params)
        if timeout_s is None:
            timeout_s = self.call_timeout_s if method == "call" else self.request_timeout_s
        return self._finish(conn, call, timeout_s)

    def ping(self):
        """``{version, uptime_s}``."""
        return self.request("ping")

    def stats(self):
        """The sidecar's counters (a dict of dicts; PROTOCOL §4.2)."""
        return self.request("stats")

    def call(self, capability, body, *, stream=False, task_id=None, deadline_s=None,
             scope=None, timeout_s=None, trace=None, event_names=False):
        """One governed upstream call.

        ``body`` is the upstream request (e.g. an OpenAI chat request) as a
        dict. Returns ``{body, source, attempts, elapsed_s, stalled_s, usage?}``,
        or with ``stream=True`` a :class:`CallStream` to iterate over the
        upstream's events (dicts), whose ``result`` (without ``body``) is set
        once the iteration ends; with ``event_names=True`` it yields
        ``(name, event)`` pairs, ``name`` the upstream's SSE event name or
        None. Failures raise a :class:`PolygwError`
        subclass. Ctrl-C (KeyboardInterrupt) cancels the call and waits for
        the sidecar's answer before propagating.
        """
        params = call_params(capability, body, stream, task_id, deadline_s, scope, trace,
                             event_names)
        conn, call = self._start("call", params, stream=bool(stream))
        if timeout_s is None:
            timeout_s = self.call_timeout_s
        if stream:
            return CallStream(self, conn, call, timeout_s)
        return self._finish(conn, call, timeout_s)

    # ------------------------------------------------------------ tasks
    def task(self, task_id, budget=None, trace=None):
        """A :class:`Task` handle (nothing is sent until it is used);
        ``budget``: what the run ``with`` starts may cost, ``trace``: the
        W3C carrier its trace joins (task.start)."""
        return Task(self, task_id, budget, trace)

    def tasks(self, state=None):
        """``task.list``: the tasks (dicts), optionally only those in
        ``state`` ("running", "succeeded", "failed")."""
        res = self.request("task.list", {"state": state} if state is not None else None)
        return res.get("tasks", []) if isinstance(res, dict) else []


class CallStream:
    """A streaming call: iterate to get each upstream event (a dict) as it
    arrives. When the iteration ends, ``result`` holds the final response
    (``source``, ``attempts``, ``usage``, ...); a failure raises instead.

    ``cancel()`` (or leaving a ``with`` block early, or dropping the object)
    cancels the call. Ctrl-C during the iteration cancels it too, waits for
    the sidecar's answer, and propagates the KeyboardInterrupt.
    """

    def __init__(self, client, conn, call, timeout_s):
        self._client = client
        self._conn = conn
        self._call = call
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._timeout_s = timeout_s
        self.result = None

    @property
    def msgid(self):
        return self._call.msgid

    @property
    def done(self):
        return self._call.done and not self._call.events

    def __iter__(self):
        return self

    def __next__(self):
        client, call = self._client, self._call
        try:
            if not client._wait(call, self._deadline):
                client._cancel(self._conn, call)
                if not (call.done and call.error is None):
                    raise errors.ClientTimeoutError(
                        "stream not finished within %gs (cancelled)" % self._timeout_s)
        except KeyboardInterrupt:
            client._cancel(self._conn, call)
            raise
        with client._lock:
            if call.events:
                return call.events.popleft()
        if call.error is not None:
            raise errors.fresh(call.error)
        self.result = call.result
        raise StopIteration

    def cancel(self):
        """Cancels the call and waits (bounded) for the sidecar's answer.
        Events not read yet are dropped."""
        self._client._cancel(self._conn, self._call)
        with self._client._lock:
            self._call.events.clear()

    close = cancel

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._call.done:
            self.cancel()

    def __del__(self):
        call = getattr(self, "_call", None)
        if call is not None:
            call.abandon()


class Task:
    """A task (PROTOCOL §4.4, docs/DESIGN.md §3.5) seen from the client.

    As a context manager it starts the task on entry and finishes it on exit
    (``ok`` unless an exception escapes; a task already stopped or failed by
    the watchdog is left as the sidecar has it)::

        with client.task("run-42") as task:
            with task.node("build_skeleton"):        # guard + node_begin ... node_end
                task.call("chat", body)              # call(..., task_id="run-42")

    Every method raises TasksNotSupportedError on a sidecar without tasks.
    """

    def __init__(self, client, task_id, budget=None, trace=None):
        self.client = client
        self.task_id = task_id
        self.budget = budget
        self.trace = trace

    def _req(self, method, **params):
        params = {k: v for k, v in params.items() if v is not None}
        params["task_id"] = self.task_id
        return self.client.request(method, params)

    def start(self, budget=None, trace=None):
        """A new run; ``budget``: what its calls may cost, in the sidecar's
        currency; ``trace``: a W3C carrier (``{"traceparent": ...,
        "tracestate": ...}``), the parent of the run's trace. Either one
        left out is the handle's (``client.task(id, budget=..., trace=...)``)."""
        return self._req("task.start", budget=self.budget if budget is None else budget,
                         trace=self.trace if trace is None else trace)

    def stop(self, reason):
        return self._req("task.stop", reason=reason)

    def guard(self):
        """Raises TaskStoppedError / WatchdogTimeoutError unless running."""
        self._req("task.guard")

    def node_begin(self, node, timeout_s=None):
        return self._req("task.node_begin", node=node, timeout_s=timeout_s)

    def node_end(self, node):
        return self._req("task.node_end", node=node)

    def finish(self, ok=True, reason=None):
        return self._req("task.finish", ok=bool(ok), reason=reason)

    def get(self):
        return self._req("task.get")

    def call(self, capability, body, **kw):
        """``client.call`` with this task's id."""
        return self.client.call(capability, body, task_id=self.task_id, **kw)

    @contextlib.contextmanager
    def node(self, name, timeout_s=None):
        """Runs the block as node `name`: guard and node_begin (arming the
        watchdog) before, node_end after (also when the block raises)."""
        self.guard()
        self.node_begin(name, timeout_s)
        try:
            yield self
        except BaseException:
            with contextlib.suppress(errors.PolygwError):
                self.node_end(name)
            raise
        self.node_end(name)

    def __enter__(self):
        self.start(self.budget, self.trace)
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.finish(True)
        elif not issubclass(exc_type, (errors.TaskNotRunningError, errors.ConnectionLostError,
                                       errors.ConnectFailedError)):
            with contextlib.suppress(errors.PolygwError):
                self.finish(False, _reason(exc_type, exc))
        return False


def _reason(exc_type, exc):
    text = "%s: %s" % (exc_type.__name__, exc) if str(exc) else exc_type.__name__
    return text[:200]

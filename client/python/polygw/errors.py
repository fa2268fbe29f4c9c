"""Typed errors: one class per error code of PROTOCOL §6.2, plus the few the
client finds on its own (connection lost, connect failed, protocol, timeout).

    PolygwError
    ├── RetryLaterError          the scope cannot serve now: retry later
    │   ├── StalledError, RetryExhaustedError, BackendUnavailableError
    │   └── OverloadedError, ShuttingDownError
    ├── TaskNotRunningError      the call's task is not running
    │   ├── TaskStoppedError, WatchdogTimeoutError
    │   └── GraphStoppedError    a graph's task ended at a node (polygw.graph)
    ├── UpstreamRejectedError, DeadlineExceededError, CancelledError,
    │   StreamInterruptedError, BadRequestError, UnknownCapabilityError,
    │   TooLargeError, InternalError (also any code this client does not know)
    ├── UnknownMethodError
    │   └── TasksNotSupportedError   a task method on a sidecar without tasks
    └── ConnectionLostError, ConnectFailedError, ProtocolError, ClientTimeoutError

``polygw.CancelledError`` is the sidecar's ``cancelled`` answer; it is not
``asyncio.CancelledError`` (which an AsyncClient call raises when *its task*
is cancelled).
"""

__all__ = [
    "PolygwError", "RetryLaterError", "TaskNotRunningError",
    "StalledError", "RetryExhaustedError", "UpstreamRejectedError", "DeadlineExceededError",
    "CancelledError", "TaskStoppedError", "WatchdogTimeoutError", "GraphStoppedError",
    "StreamInterruptedError",
    "BackendUnavailableError", "BudgetExhaustedError", "BadRequestError", "UnknownMethodError",
    "UnknownCapabilityError", "TooLargeError", "OverloadedError", "ShuttingDownError",
    "InternalError", "TasksNotSupportedError",
    "ConnectionLostError", "ConnectFailedError", "ProtocolError", "ClientTimeoutError",
    "ERROR_CLASSES", "error_from_wire",
]


def _num(v):
    return float(v) if type(v) in (int, float) else None


class PolygwError(Exception):
    """Base class of every polygw error.

    Attributes (None when the sidecar did not say):
      code           stable machine name ("stalled", ...; local ones:
                     "connection_lost", "connect_failed", "protocol_error",
                     "timeout") -- the only thing to branch on besides the class
      message        human text; do not parse it
      retry_after_s  earliest sensible retry, in seconds (float)
      attempts       upstream attempts the call made (int)
      stalled_s      seconds charged to the stall budget (float)
      status         upstream HTTP status (int)
      upstream_body  the upstream's error body (dict, or str when not JSON)
      sources        per source, why it did not serve: [{name, reason, ...}]
      data           the whole error map as received (dict), {} for local errors
    """

    code = "internal"

    def __init__(self, message="", code=None, data=None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.data = dict(data) if data else {}
        d = self.data
        self.retry_after_s = _num(d.get("retry_after_s"))
        self.stalled_s = _num(d.get("stalled_s"))
        self.attempts = d["attempts"] if type(d.get("attempts")) is int else None
        self.status = d["status"] if type(d.get("status")) is int else None
        self.upstream_body = d.get("upstream_body")
        self.sources = d["sources"] if isinstance(d.get("sources"), list) else None

    @property
    def retry_later(self):
        """True for the "retry later" codes (same as isinstance RetryLaterError)."""
        return isinstance(self, RetryLaterError)

    def __str__(self):
        return "%s: %s" % (self.code, self.message) if self.message else self.code

    def __repr__(self):
        return "%s(code=%r, message=%r)" % (type(self).__name__, self.code, self.message)

    def __reduce__(self):
        return (_rebuild, (type(self), self.message, self.code, self.data))


def _rebuild(cls, message, code, data):
    return cls(message, code=code, data=data)


def fresh(exc):
    """A new instance equal to `exc` (one stored error may be raised by
    several waiters; each raise gets its own traceback)."""
    if isinstance(exc, PolygwError):
        return _rebuild(type(exc), exc.message, exc.code, exc.data)
    return exc


class RetryLaterError(PolygwError):
    """The scope (or the sidecar) cannot serve now: retry later, after
    ``retry_after_s`` when given (pgw_code_is_retry_later() in C)."""


class TaskNotRunningError(PolygwError):
    """The call's task is not running any more: stop the task's work."""


def _define(name, code, base, doc):
    return type(name, (base,), {"code": code, "__doc__": doc, "__module__": __name__})


StalledError = _define("StalledError", "stalled", RetryLaterError,
                       "No source of the scope could serve, and the scope made no progress, "
                       "for longer than stall_window_s.")
RetryExhaustedError = _define("RetryExhaustedError", "retry_exhausted", RetryLaterError,
                              "max_attempts real attempts failed transiently.")
BackendUnavailableError = _define("BackendUnavailableError", "backend_unavailable",
                                  RetryLaterError, "The state backend (Redis) could not answer.")
OverloadedError = _define("OverloadedError", "overloaded", RetryLaterError,
                          "A sidecar limit was hit (requests in flight, connections).")
ShuttingDownError = _define("ShuttingDownError", "shutting_down", RetryLaterError,
                            "The sidecar is draining; retry on a new connection.")
UpstreamRejectedError = _define("UpstreamRejectedError", "upstream_rejected", PolygwError,
                                "The upstream refused the request (4xx); see status and "
                                "upstream_body. Fix the request.")
DeadlineExceededError = _define("DeadlineExceededError", "deadline_exceeded", PolygwError,
                                "The call's own deadline_s passed.")
CancelledError = _define("CancelledError", "cancelled", PolygwError,
                         "The call was cancelled (the sidecar's `cancelled` answer).")
TaskStoppedError = _define("TaskStoppedError", "task_stopped", TaskNotRunningError,
                           "The call's task was stopped (task.stop) or is not running.")
WatchdogTimeoutError = _define("WatchdogTimeoutError", "watchdog_timeout", TaskNotRunningError,
                               "The call's task was failed by the watchdog.")
BudgetExhaustedError = _define("BudgetExhaustedError", "budget_exhausted", PolygwError,
                               "A budget in currency cannot cover the call: ``data['budget']`` "
                               "says which, ``data['left']`` what it has left; a window's "
                               "reset is in ``retry_after_s`` (none for a total or a task's).")


class GraphStoppedError(TaskNotRunningError):
    """A graph run ended because its task was stopped (``kind`` "stopped":
    task.stop, an ordinary exit; ``kind`` "budget": its budget ran out and the
    sidecar stopped it) or failed by the watchdog (``kind``
    "watchdog": a node ran past its deadline), whatever error the node itself
    saw (polygw.graph). Not a failure of the graph: every node that completed
    is done, and a new task can resume it. ``node`` is the node it ended in
    (None after the last node), ``reason`` the sidecar's reason; the error
    the node saw is ``__cause__``."""

    def __init__(self, message="", code=None, data=None, task_id=None, node=None):
        super().__init__(message, code=code, data=data)
        self.task_id = task_id
        self.node = node
        reason = self.data.get("reason")
        self.reason = reason if isinstance(reason, str) else None
        # A task the sidecar stopped because its budget ran out is stopped
        # with reason "budget": neither a failure nor a hang.
        self.kind = ("watchdog" if self.code == "watchdog_timeout"
                     else "budget" if self.reason == "budget" else "stopped")

    @classmethod
    def from_error(cls, exc, task_id=None, node=None):
        """`exc` as a GraphStoppedError when it is the task's own verdict
        (TaskStoppedError / WatchdogTimeoutError), else None."""
        if isinstance(exc, GraphStoppedError):
            return exc
        if not isinstance(exc, (TaskStoppedError, WatchdogTimeoutError)):
            return None
        what = "failed by the watchdog" if exc.code == "watchdog_timeout" else "stopped"
        at = "after its last node" if node is None else "at node %s" % node
        reason = exc.data.get("reason")
        why = ": %s" % reason if isinstance(reason, str) and reason else ""
        return cls("task %s %s %s%s" % (task_id, what, at, why), code=exc.code, data=exc.data,
                   task_id=task_id, node=node)


StreamInterruptedError = _define("StreamInterruptedError", "stream_interrupted", PolygwError,
                                 "A stream failed after its first chunk was relayed.")
BadRequestError = _define("BadRequestError", "bad_request", PolygwError,
                          "The request's parameters are wrong (a client bug).")
UnknownMethodError = _define("UnknownMethodError", "unknown_method", PolygwError,
                             "The sidecar has no such method.")
UnknownCapabilityError = _define("UnknownCapabilityError", "unknown_capability", PolygwError,
                                 "No such capability, or it has no source configured.")
TooLargeError = _define("TooLargeError", "too_large", PolygwError,
                        "A message over max_message_bytes.")
InternalError = _define("InternalError", "internal", PolygwError,
                        "A bug or resource exhaustion in the sidecar; also any error code "
                        "this client does not know (its name is kept in `code`).")
TasksNotSupportedError = _define("TasksNotSupportedError", "unknown_method", UnknownMethodError,
                                 "A task method on a sidecar without tasks (PROTOCOL §4.4).")


class ConnectionLostError(PolygwError):
    """The connection ended while the request was pending (or broke before
    it could be sent). ``code`` is the code of the sidecar's fatal ``error``
    notification when one came (e.g. "too_large", "overloaded"), else
    "connection_lost". Whether the call reached the upstream is unknown."""

    code = "connection_lost"

    @property
    def retry_later(self):
        return self.code in ("connection_lost", "overloaded", "shutting_down")


class ConnectFailedError(PolygwError):
    """Could not connect to the sidecar's socket (missing, refused, ...)."""

    code = "connect_failed"


class ProtocolError(PolygwError):
    """The sidecar sent something that is not msgpack-RPC (or too large);
    the connection was closed."""

    code = "protocol_error"


class ClientTimeoutError(PolygwError):
    """The client's own wait bound passed (the call was cancelled first)."""

    code = "timeout"


ERROR_CLASSES = {cls.code: cls for cls in (
    StalledError, RetryExhaustedError, UpstreamRejectedError, DeadlineExceededError,
    CancelledError, TaskStoppedError, WatchdogTimeoutError, StreamInterruptedError,
    BackendUnavailableError, BudgetExhaustedError, BadRequestError, UnknownMethodError,
    UnknownCapabilityError, TooLargeError, OverloadedError, ShuttingDownError, InternalError)}


def error_from_wire(err, method=None):
    """The exception for an error map ``{code, message, ...}`` of a response.
    Unknown codes become InternalError keeping their name (PROTOCOL §6.1)."""
    if not isinstance(err, dict):
        return ProtocolError("error is not a map: %r" % (err,))
    code = err.get("code")
    if type(code) is not str:
        code = "internal"
    message = err.get("message")
    if type(message) is not str:
        message = ""
    cls = ERROR_CLASSES.get(code, InternalError)
    if cls is UnknownMethodError and method and method.startswith("task."):
        cls = TasksNotSupportedError
        message = "tasks not supported by this sidecar (%s)" % message
    return cls(message, code=code, data=err)

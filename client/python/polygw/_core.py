"""Connection state shared by Client and AsyncClient, without any I/O:
msgids, the requests in flight, and what each incoming message does to them.
The two clients only add sockets, threads or asyncio, and waking up."""

import collections
import select

from . import errors
from .protocol import (MSGID_MAX, NOTIFICATION, RESPONSE, FrameError, FrameReader,
                       NotRpcError, decode_frame, pack_notification, pack_request,
                       parse_message, socket_path)

RETRY_LATER_CODES = frozenset(("stalled", "retry_exhausted", "backend_unavailable",
                               "overloaded", "shutting_down"))


_HUP = getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR


def peer_hung_up(fd):
    """True when the sidecar has closed its end of the socket (it exited or
    restarted): new requests then go to a new connection while the reader
    drains what the old one still holds. One poll(2), no waiting."""
    try:
        p = select.poll()
        p.register(fd, _HUP)
        return bool(p.poll(0))
    except (OSError, ValueError):
        return True


def init_settings(client, path, connect_timeout_s, request_timeout_s, call_timeout_s,
                  cancel_timeout_s, max_message_bytes):
    """Sets the settings Client and AsyncClient share, the socket path
    resolved (``$POLYGW_SOCKET``, then the default)."""
    client.socket_path = socket_path(path)
    client.connect_timeout_s = connect_timeout_s
    client.request_timeout_s = request_timeout_s
    client.call_timeout_s = call_timeout_s
    client.cancel_timeout_s = cancel_timeout_s
    client.max_message_bytes = max_message_bytes


def call_params(capability, body, stream=False, task_id=None, deadline_s=None, scope=None,
                trace=None, event_names=False):
    """The named parameters of `call`: only what the caller set (PROTOCOL §2.2:
    never send a default, so a new client keeps working with an old sidecar)."""
    p = {"capability": capability, "body": body}
    if stream:
        p["stream"] = True
    if scope is not None:
        p["scope"] = scope
    if task_id is not None:
        p["task_id"] = task_id
    if deadline_s is not None:
        p["deadline_s"] = deadline_s
    if trace is not None:
        # The W3C trace context carrier ({"traceparent": ..., "tracestate": ...}),
        # e.g. what opentelemetry.propagate.inject(carrier) fills.
        p["trace"] = trace
    if event_names:
        # Each chunk then comes as [msgid, event, name] (PROTOCOL §5.1).
        p["event_names"] = True
    return p


class PendingCall:
    """One request in flight: its state as the connection sees it."""

    __slots__ = ("msgid", "method", "stream", "events", "done", "error", "result",
                 "cancel_sent", "abandoned", "wake", "waiter")

    def __init__(self, msgid, method, stream):
        self.msgid = msgid
        self.method = method
        self.stream = stream
        self.events = collections.deque()
        self.done = False
        self.error = None        # an exception instance once failed
        self.result = None
        self.cancel_sent = False
        self.abandoned = False   # nobody will read it: cancel at the next chunk
        self.wake = None         # set by the client: called on every change
        self.waiter = None       # the client's object to wait on

    def finish(self, error, result):
        if self.done:
            return
        self.done = True
        self.error = error
        self.result = result

    def abandon(self):
        """Its stream object was dropped unread. No locks here (this may run
        inside any thread at any time, from __del__): only mark it; the
        reader sends `cancel` at the call's next chunk."""
        if not self.done:
            self.abandoned = True
            self.events.clear()


class Session:
    """The protocol state of one connection (one socket)."""

    def __init__(self, max_message_bytes):
        self.reader = FrameReader(max_message_bytes)
        self.pending = {}
        self._next_id = 1
        self.broken = None       # the exception that ended the connection, once ended
        self.fatal = None        # the map of a fatal `error` notification

    def new_call(self, method, params, stream=False):
        """Registers a request and returns (call, bytes to send)."""
        if self.broken is not None:
            raise self.broken
        if len(self.pending) >= MSGID_MAX:
            raise errors.OverloadedError("too many requests in flight on one connection")
        msgid = self._next_id
        while msgid in self.pending:
            msgid = msgid + 1 if msgid < MSGID_MAX else 0
        self._next_id = msgid + 1 if msgid < MSGID_MAX else 0
        data = pack_request(msgid, method, params)   # TypeError before registering
        call = PendingCall(msgid, method, stream)
        self.pending[msgid] = call
        return call, data

    def forget(self, call):
        if self.pending.get(call.msgid) is call:
            del self.pending[call.msgid]

    @staticmethod
    def cancel_bytes(msgid):
        return pack_notification("cancel", [msgid])

    def receive(self, data):
        """Feeds bytes from the socket. Returns (calls that changed, msgids to
        cancel). When the stream turns out broken (fatal notification, not
        msgpack-RPC, over the limit) every pending call is failed and
        self.broken is set; the caller then closes the socket."""
        changed = []
        cancels = []
        if self.broken is not None:
            return changed, cancels
        self.reader.feed(data)
        try:
            while True:
                frame = self.reader.next_frame()
                if frame is None:
                    break
                msg = parse_message(decode_frame(frame))
                if msg[0] == RESPONSE:
                    call = self.pending.pop(msg[1], None)
                    if call is not None:
                        err = None if msg[2] is None else errors.error_from_wire(msg[2],
                                                                                call.method)
                        call.finish(err, msg[3] if err is None else None)
                        changed.append(call)
                elif msg[0] == NOTIFICATION:
                    if msg[1] == "chunk":
                        self._chunk(msg[2], changed, cancels)
                    elif msg[1] == "error":
                        self._fatal(msg[2])
                        changed.extend(self.fail_all(self.broken))
                        return changed, cancels
                # requests from the sidecar and unknown notifications: ignored
        except (FrameError, NotRpcError) as e:
            code = "too_large" if isinstance(e, FrameError) and e.kind == "too_large" \
                else "protocol_error"
            self.broken = errors.ProtocolError("the sidecar sent an unusable message: %s" % e,
                                               code=code)
            changed.extend(self.fail_all(self.broken))
        return changed, cancels

    def _chunk(self, params, changed, cancels):
        if type(params) is not list or len(params) not in (2, 3) or type(params[0]) is not int:
            return
        call = self.pending.get(params[0])
        if call is None or not call.stream:
            return
        if call.abandoned:
            if not call.cancel_sent:
                call.cancel_sent = True
                cancels.append(call.msgid)
            return
        # With event_names, an event comes with its upstream name (or None).
        call.events.append((params[2], params[1]) if len(params) == 3 else params[1])
        changed.append(call)

    def _fatal(self, params):
        err = params[0] if type(params) is list and params and isinstance(params[0], dict) \
            else {}
        self.fatal = err
        code = err.get("code") if type(err.get("code")) is str else "connection_lost"
        message = err.get("message") if type(err.get("message")) is str else ""
        self.broken = errors.ConnectionLostError(
            "the sidecar closed the connection: %s" % (message or code), code=code, data=err)

    def connection_lost(self, reason=None):
        """The socket ended (EOF, read or write error): fails every pending
        call. Returns the calls that changed."""
        if self.broken is None:
            self.broken = errors.ConnectionLostError(
                "connection to the sidecar lost" + (": %s" % reason if reason else ""))
        return self.fail_all(self.broken)

    def fail_all(self, exc):
        calls = list(self.pending.values())
        self.pending.clear()
        for call in calls:
            call.finish(exc, None)
        return calls

"""Wire format of the polygw protocol (proto/PROTOCOL.md): framing, limits,
message classification and encoding. No I/O here, so the test vectors of
proto/vectors/ replay through exactly the code the clients use.

The wire has no framing of its own: one msgpack value is one message. The
:class:`FrameReader` finds where each message ends with a small structural
scanner that judges size claims from headers (a 5-byte str32 header claiming
100 MB fails at once, PROTOCOL §7.1) and counts nesting, empty containers
included (§7.2); python-msgpack then decodes each complete frame.
"""

import os

import msgpack

__all__ = [
    "DEFAULT_SOCKET", "DEFAULT_MAX_MESSAGE_BYTES", "MAX_DEPTH", "MSGID_MAX",
    "REQUEST", "RESPONSE", "NOTIFICATION",
    "FrameError", "NotRpcError", "FrameReader", "decode_frame", "parse_message",
    "pack_request", "pack_notification", "socket_path",
]

DEFAULT_SOCKET = "/run/polygw/polygw.sock"
#: Largest frame accepted from the sidecar. The sidecar's own limit is 16 MiB
#: of JSON, whose msgpack form can be larger (PROTOCOL §7.1); libpolygw
#: defaults to 64 MiB too.
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
MAX_DEPTH = 32
MSGID_MAX = 0xFFFFFFFF

REQUEST, RESPONSE, NOTIFICATION = 0, 1, 2


def socket_path(path=None):
    """The caller's path, else $POLYGW_SOCKET, else the default (PROTOCOL §1)."""
    return path or os.environ.get("POLYGW_SOCKET") or DEFAULT_SOCKET


class FrameError(Exception):
    """The byte stream is not a sequence of acceptable msgpack values.

    ``kind`` is ``"malformed"`` (not msgpack), ``"too_large"`` or
    ``"too_deep"`` -- the outcomes of proto/vectors/README.md."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


class NotRpcError(Exception):
    """A msgpack value that is not a msgpack-RPC message (PROTOCOL §2)."""


# Header layout per first byte: (kind, fixed size or length-field bytes).
#   's', n  scalar of n bytes in all
#   'p', k  payload whose length is in the k bytes after the type byte
#           (ext: one more type byte after the length)
#   'a'/'m', k  array/map whose count is in the k bytes after the type byte
#   'P'/'A'/'M', n  fix-str/array/map whose length/count n is in the byte
#   'x'     0xc1, never used
def _header_table():
    t = [None] * 256
    for b in range(0x00, 0x80):
        t[b] = ("s", 1)
    for b in range(0xE0, 0x100):
        t[b] = ("s", 1)
    for b in range(0x80, 0x90):
        t[b] = ("M", b & 0x0F)
    for b in range(0x90, 0xA0):
        t[b] = ("A", b & 0x0F)
    for b in range(0xA0, 0xC0):
        t[b] = ("P", b & 0x1F)
    fixed = {0xC0: 1, 0xC2: 1, 0xC3: 1, 0xCA: 5, 0xCB: 9, 0xCC: 2, 0xCD: 3, 0xCE: 5,
             0xCF: 9, 0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9, 0xD4: 3, 0xD5: 4, 0xD6: 6,
             0xD7: 10, 0xD8: 18}
    for b, n in fixed.items():
        t[b] = ("s", n)
    for b, k in {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}.items():
        t[b] = ("p", k)
    for b, k in {0xC7: 1, 0xC8: 2, 0xC9: 4}.items():
        t[b] = ("e", k)
    t[0xDC], t[0xDD] = ("a", 2), ("a", 4)
    t[0xDE], t[0xDF] = ("m", 2), ("m", 4)
    t[0xC1] = ("x", 0)
    return tuple(t)


_HEADERS = _header_table()


class FrameReader:
    """Incremental reader: :meth:`feed` bytes as they arrive, then
    :meth:`frames` yields each complete message's bytes.

    A frame over ``max_bytes`` (or a header claiming more), a frame nesting
    more than ``max_depth`` containers, or bytes that are not msgpack raise
    :class:`FrameError`; the error is sticky, since msgpack cannot be
    resynchronised. Bytes of an incomplete frame are held until more arrive.
    """

    def __init__(self, max_bytes=DEFAULT_MAX_MESSAGE_BYTES, max_depth=MAX_DEPTH):
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        self._buf = bytearray()
        self._start = 0      # offset of the pending frame in _buf
        self._scanned = 0    # validated bytes of the pending frame
        self._skip = 0       # payload bytes still to pass over
        self._left = []      # items still expected in each open container
        self._error = None

    @property
    def pending(self):
        """Bytes held for a frame not complete yet."""
        return len(self._buf) - self._start

    def feed(self, data):
        if self._error is None and data:
            self._buf += data

    def frames(self):
        """Yields the bytes of every complete frame buffered so far."""
        while True:
            frame = self.next_frame()
            if frame is None:
                return
            yield frame

    def next_frame(self):
        """The next complete frame (bytes), or None when more is needed."""
        if self._error is not None:
            raise self._error
        try:
            done = self._scan()
        except FrameError as e:
            self._error = e
            self._buf = bytearray()
            self._start = 0
            raise
        if not done:
            if self._start and self._start * 2 >= len(self._buf):
                del self._buf[:self._start]
                self._start = 0
            return None
        end = self._start + self._scanned
        frame = bytes(self._buf[self._start:end])
        self._start = end
        self._scanned = 0
        if self._start == len(self._buf):
            self._buf = bytearray()
            self._start = 0
        return frame

    def _fail(self, kind, message):
        raise FrameError(kind, message)

    def _scan(self):
        """Advances over buffered bytes; True when a whole frame is there."""
        buf = self._buf
        base = self._start
        end = len(buf)
        pos = base + self._scanned
        left = self._left
        limit = base + self.max_bytes   # no frame byte may lie at or past this
        headers = _HEADERS
        try:
            while True:
                if self._skip:
                    n = min(self._skip, end - pos)
                    pos += n
                    self._skip -= n
                    if self._skip:
                        return False
                    # the payload's item is done
                else:
                    if pos >= end:
                        return False
                    b = buf[pos]
                    kind, n = headers[b]
                    if kind == "s":
                        if pos + n > limit:
                            self._fail("too_large", "message exceeds max_message_bytes")
                        if pos + n > end:
                            return False
                        pos += n
                    elif kind == "P":
                        if pos + 1 + n > limit:
                            self._fail("too_large", "message exceeds max_message_bytes")
                        pos += 1
                        self._skip = n
                        if n:
                            continue
                    elif kind in "pe":
                        if pos + 1 + n > end:
                            return False
                        size = int.from_bytes(buf[pos + 1:pos + 1 + n], "big")
                        hl = 1 + n + (1 if kind == "e" else 0)
                        if pos + hl + size > limit:
                            self._fail("too_large", "message exceeds max_message_bytes")
                        if pos + hl > end:
                            return False
                        pos += hl
                        self._skip = size
                        if size:
                            continue
                    elif kind == "x":
                        self._fail("malformed", "malformed msgpack (reserved byte 0xc1)")
                    else:
                        if kind in "AM":
                            hl, count = 1, n
                        else:
                            if pos + 1 + n > end:
                                return False
                            hl = 1 + n
                            count = int.from_bytes(buf[pos + 1:pos + 1 + n], "big")
                        if kind in "Mm":
                            count *= 2
                        # every item takes at least one byte
                        if pos + hl + count > limit:
                            self._fail("too_large", "message exceeds max_message_bytes")
                        if len(left) >= self.max_depth:
                            self._fail("too_deep", "message nests more than %d containers"
                                       % self.max_depth)
                        pos += hl
                        if count:
                            left.append(count)
                            # Fast path: an array of float64s or of small
                            # ints (embeddings, token ids) in one go.
                            if kind in "Aa" and end - pos >= count:
                                if buf[pos] == 0xCB and pos + 9 * count <= min(end, limit) and \
                                        buf[pos:pos + 9 * count:9] == b"\xcb" * count:
                                    pos += 9 * count
                                    left[-1] = 1
                                elif buf[pos] < 0x80 and max(buf[pos:pos + count]) < 0x80:
                                    pos += count
                                    left[-1] = 1
                                else:
                                    continue
                            else:
                                continue
                # one item ended: count it against the open containers
                while True:
                    if not left:
                        return True
                    left[-1] -= 1
                    if left[-1]:
                        break
                    left.pop()
        finally:
            self._scanned = pos - base


def decode_frame(frame, object_pairs_hook=None):
    """Decodes one complete frame (from :class:`FrameReader`). Strings are
    ``str``, bin is ``bytes``, ext is ``msgpack.ExtType``, maps are dicts
    (or whatever ``object_pairs_hook`` makes of their (key, value) pairs)."""
    try:
        return msgpack.unpackb(frame, raw=False, strict_map_key=False, use_list=True,
                               object_pairs_hook=object_pairs_hook)
    except (ValueError, msgpack.UnpackException) as e:   # e.g. invalid UTF-8
        raise FrameError("malformed", "undecodable msgpack: %s" % e) from None


def _is_uint(v, maximum):
    return type(v) is int and 0 <= v <= maximum


def parse_message(msg):
    """Classifies a decoded message (PROTOCOL §2). Returns a tuple:
    ``(REQUEST, msgid, method, params)``, ``(RESPONSE, msgid, error, result)``
    or ``(NOTIFICATION, method, params)``. Raises :class:`NotRpcError`."""
    if type(msg) is not list:
        raise NotRpcError("message is not an array")
    n = len(msg)
    if n < 3 or n > 4 or not _is_uint(msg[0], 2):
        raise NotRpcError("message is not [type, ...] with type 0, 1 or 2")
    kind = msg[0]
    if kind == NOTIFICATION:
        if n != 3:
            raise NotRpcError("notification must be [2, method, params]")
        if type(msg[1]) is not str:
            raise NotRpcError("notification method must be a string")
        return (NOTIFICATION, msg[1], msg[2])
    if n != 4:
        raise NotRpcError("request must be [0, msgid, method, params]" if kind == REQUEST
                          else "response must be [1, msgid, error, result]")
    if not _is_uint(msg[1], MSGID_MAX):
        raise NotRpcError("msgid must be an unsigned 32-bit integer")
    if kind == REQUEST:
        if type(msg[2]) is not str:
            raise NotRpcError("request method must be a string")
        return (REQUEST, msg[1], msg[2], msg[3])
    if msg[2] is not None and not isinstance(msg[2], dict):
        raise NotRpcError("response error must be nil or a map")
    return (RESPONSE, msg[1], msg[2], msg[3])


def _packb(obj):
    try:
        return msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError("cannot encode as msgpack: %s" % e) from None


def pack_request(msgid, method, params=None):
    """``[0, msgid, method, [params]]``, or ``[]`` params when None/empty
    (named parameters, PROTOCOL §2.2)."""
    return _packb([REQUEST, msgid, method, [params] if params else []])


def pack_notification(method, params):
    """``[2, method, params]`` (positional params, PROTOCOL §5)."""
    return _packb([NOTIFICATION, method, list(params)])

"""A mock AWS Bedrock runtime for the integration tests (standard library only).

It checks the AWS Signature Version 4 of every request with its own
implementation of the algorithm (AWS's documented rules, independent of
polygw's C signer), answers InvokeModel with an Anthropic Messages reply and
InvokeModelWithResponseStream with AWS event-stream frames whose "chunk"
events carry the Anthropic stream events base64-encoded, as Bedrock does;
Converse with a Converse reply and ConverseStream with event-stream frames
whose `:event-type` names each event (messageStart, contentBlockDelta,
contentBlockStop, messageStop, metadata) and whose payload is its JSON.

    with BedrockMock(key_id, secret, region) as bm:
        bm.plan.append({"status": 429})        # the next request is throttled
        ... point a kind: bedrock source at bm.url ...
        assert bm.bad_signatures == 0
"""

import base64
import hashlib
import hmac
import http.server
import json
import re
import struct
import threading
import urllib.parse
import zlib

__all__ = ["BedrockMock", "eventstream_message", "decode_eventstream"]


def eventstream_message(headers, payload):
    """One AWS event-stream message: string headers (name -> value), payload bytes."""
    hb = b""
    for name, value in headers.items():
        n, v = name.encode(), value.encode()
        hb += struct.pack(">B", len(n)) + n + b"\x07" + struct.pack(">H", len(v)) + v
    total = 12 + len(hb) + len(payload) + 4
    prelude = struct.pack(">II", total, len(hb))
    prelude += struct.pack(">I", zlib.crc32(prelude) & 0xFFFFFFFF)
    msg = prelude + hb + payload
    return msg + struct.pack(">I", zlib.crc32(msg) & 0xFFFFFFFF)


def decode_eventstream(data):
    """The messages of an event-stream body: [(headers dict, payload bytes)]."""
    out = []
    while data:
        total, hlen = struct.unpack(">II", data[:8])
        msg, data = data[:total], data[total:]
        hb, payload = msg[12:12 + hlen], msg[12 + hlen:-4]
        headers, i = {}, 0
        while i < len(hb):
            n = hb[i]
            name = hb[i + 1:i + 1 + n].decode()
            i += 1 + n
            assert hb[i] == 7, "only string headers are expected"
            vlen = struct.unpack(">H", hb[i + 1:i + 3])[0]
            headers[name] = hb[i + 3:i + 3 + vlen].decode()
            i += 3 + vlen
        out.append((headers, payload))
    return out


def chunk(event):
    """An event-stream "chunk" event carrying one Anthropic stream event."""
    data = base64.b64encode(json.dumps(event).encode()).decode()
    return eventstream_message({":event-type": "chunk", ":content-type": "application/json",
                                ":message-type": "event"}, json.dumps({"bytes": data}).encode())


def exception(kind, message):
    return eventstream_message({":exception-type": kind, ":content-type": "application/json",
                                ":message-type": "exception"},
                               json.dumps({"message": message}).encode())


def stream_events(text, model="claude-on-bedrock", input_tokens=12, output_tokens=5):
    """The Anthropic events of a streamed answer of `text` (three pieces)."""
    pieces = [text[i:i + max(1, len(text) // 3)] for i in range(0, len(text), max(1, len(text) // 3))]
    evs = [{"type": "message_start",
            "message": {"id": "msg_bdrk_1", "type": "message", "role": "assistant", "model": model,
                        "content": [], "stop_reason": None,
                        "usage": {"input_tokens": input_tokens, "output_tokens": 1}}},
           {"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}}]
    evs += [{"type": "content_block_delta", "index": 0,
             "delta": {"type": "text_delta", "text": p}} for p in pieces]
    evs += [{"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
             "usage": {"output_tokens": output_tokens}},
            {"type": "message_stop",
             "amazon-bedrock-invocationMetrics": {"inputTokenCount": input_tokens,
                                                  "outputTokenCount": output_tokens}}]
    return evs


CONVERSE_USAGE = {"inputTokens": 21, "outputTokens": 7, "totalTokens": 40,
                  "cacheReadInputTokens": 8, "cacheWriteInputTokens": 4}


def converse_event(kind, payload):
    """A ConverseStream event: its type in `:event-type`, its JSON as the payload."""
    return eventstream_message({":event-type": kind, ":content-type": "application/json",
                                ":message-type": "event"}, json.dumps(payload).encode())


def converse_events(text, usage=CONVERSE_USAGE, stop="end_turn"):
    """The ConverseStream events of an answer of `text` (three pieces), as
    (event type, payload) pairs."""
    step = max(1, len(text) // 3)
    evs = [("messageStart", {"role": "assistant"})]
    evs += [("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": text[i:i + step]}})
            for i in range(0, len(text), step)]
    evs += [("contentBlockStop", {"contentBlockIndex": 0}),
            ("messageStop", {"stopReason": stop}),
            ("metadata", {"usage": usage, "metrics": {"latencyMs": 42}})]
    return evs


def _sign(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


class _Server(http.server.ThreadingHTTPServer):
    """A loopback server on a free port, served from a thread."""
    daemon_threads = True

    def start(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.server_address[1]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()


class BedrockMock(_Server):
    def __init__(self, key_id, secret, region, token=None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.region = region
        # Every key the mock takes: key id -> (secret, session token or None).
        self.keys = {key_id: (secret, token)}
        self.lock = threading.Lock()
        self.seen = []            # (path, body dict, headers dict, signature ok)
        self.bad_signatures = 0
        # per request, in order: {"status", "corrupt", "exception", "after", "split", "text",
        # "usage", "stop", "raw" (ConverseStream: these bytes as the body)}
        self.plan = []
        self.start()

    def verify(self, method, raw_path, headers, body):
        """Why the request's signature is wrong, or None when it is right."""
        auth = headers.get("authorization", "")
        m = re.fullmatch(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
                         r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})", auth)
        if not m:
            return "no AWS4-HMAC-SHA256 Authorization header"
        key_id, day, region, service, signed, sig = m.groups()
        if key_id not in self.keys or region != self.region or service != "bedrock":
            return "wrong credential scope %s/%s/%s" % (key_id, region, service)
        secret, token = self.keys[key_id]
        amz_date = headers.get("x-amz-date", "")
        if not amz_date.startswith(day):
            return "X-Amz-Date does not match the scope's date"
        names = signed.split(";")
        for need in ("host", "x-amz-date") + (("x-amz-security-token",) if token else ()):
            if need not in names:
                return "%s is not signed" % need
        if token and headers.get("x-amz-security-token") != token:
            return "wrong session token"
        path, _, query = raw_path.partition("?")
        canonical_uri = urllib.parse.quote(path, safe="/-_.~")
        pairs = sorted((urllib.parse.quote(urllib.parse.unquote(k), safe="-_.~"),
                        urllib.parse.quote(urllib.parse.unquote(v), safe="-_.~"))
                       for k, _, v in (p.partition("=") for p in query.split("&") if p))
        canonical_query = "&".join("%s=%s" % kv for kv in pairs)
        canonical_headers = "".join(
            "%s:%s\n" % (n, " ".join(headers.get(n, "").split())) for n in names)
        creq = "\n".join([method, canonical_uri, canonical_query, canonical_headers, signed,
                          hashlib.sha256(body).hexdigest()])
        scope = "%s/%s/bedrock/aws4_request" % (day, region)
        sts = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(creq.encode()).hexdigest()])
        k = _sign(("AWS4" + secret).encode(), day)
        for part in (region, "bedrock", "aws4_request"):
            k = _sign(k, part)
        want = hmac.new(k, sts.encode(), hashlib.sha256).hexdigest()
        return None if hmac.compare_digest(want, sig) else "signature mismatch"


class _Base(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, ctype, body, extra=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)


class _Handler(_Base):
    def error(self, status, kind, message):
        self.answer(status, "application/json", json.dumps({"message": message}).encode(),
                    [("x-amzn-ErrorType", kind + ":http://internal.amazon.com/coral/com.amazon.bedrock/")])

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        srv = self.server
        headers = {k.lower(): v for k, v in self.headers.items()}
        why = srv.verify("POST", self.path, headers, raw)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        with srv.lock:
            srv.seen.append((self.path, body, headers, why))
            if why:
                srv.bad_signatures += 1
            plan = srv.plan.pop(0) if srv.plan else {}
        if why:
            return self.error(403, "InvalidSignatureException", why)
        m = re.fullmatch(r"/model/([^/]+)/(invoke|invoke-with-response-stream|converse"
                         r"|converse-stream)", self.path)
        if not m or not isinstance(body, dict):
            return self.error(400, "ValidationException", "unknown operation or body")
        if m.group(2).startswith("converse"):
            return self.converse(m.group(2) == "converse-stream", body, plan)
        if "model" in body or "stream" in body or body.get("anthropic_version") != "bedrock-2023-05-31":
            return self.error(400, "ValidationException",
                              "model/stream are not permitted; anthropic_version is required")
        status = plan.get("status", 200)
        if status == 429:
            return self.error(429, "ThrottlingException", "Too many requests, please wait.")
        if status != 200:
            return self.error(status, "ServiceUnavailableException", "Service unavailable")
        text = plan.get("text") or "".join(
            c.get("text", "") if isinstance(c, dict) else ""
            for msg in body.get("messages", [])[-1:]
            for c in (msg["content"] if isinstance(msg["content"], list)
                      else [{"text": msg["content"]}])) or "ok"
        model = urllib.parse.unquote(m.group(1))
        if m.group(2) == "invoke":
            reply = {"id": "msg_bdrk_1", "type": "message", "role": "assistant", "model": model,
                     "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                     "usage": {"input_tokens": 12, "output_tokens": 5}}
            return self.answer(200, "application/json", json.dumps(reply).encode(),
                               [("x-amzn-bedrock-input-token-count", "12")])
        self.send_frames([chunk(e) for e in stream_events(text, model)], plan)

    def converse(self, stream, body, plan):
        """Converse and ConverseStream: the body is checked as Bedrock checks
        it (only Converse's own keys; text blocks), the answer echoes the last
        user text."""
        allowed = {"messages", "system", "inferenceConfig", "additionalModelRequestFields",
                   "toolConfig", "guardrailConfig", "performanceConfig", "requestMetadata",
                   "promptVariables", "additionalModelResponseFieldPaths"}
        msgs = body.get("messages")
        if set(body) - allowed or not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and m.get("role") in ("user", "assistant") and
                isinstance(m.get("content"), list) and
                all(isinstance(c, dict) and isinstance(c.get("text"), str) for c in m["content"])
                for m in msgs):
            return self.error(400, "ValidationException", "malformed Converse request")
        status = plan.get("status", 200)
        if status == 429:
            return self.error(429, "ThrottlingException", "Too many requests, please wait.")
        if status != 200:
            return self.error(status, "ServiceUnavailableException", "Service unavailable")
        text = plan.get("text") or "".join(c["text"] for c in msgs[-1]["content"]) or "ok"
        usage = plan.get("usage", CONVERSE_USAGE)
        stop = plan.get("stop", "end_turn")
        if not stream:
            reply = {"output": {"message": {"role": "assistant", "content": [{"text": text}]}},
                     "stopReason": stop, "usage": usage, "metrics": {"latencyMs": 42}}
            if "raw" in plan:
                return self.answer(200, "application/json", plan["raw"])
            return self.answer(200, "application/json", json.dumps(reply).encode())
        frames = [converse_event(k, p) for k, p in converse_events(text, usage, stop)]
        if "raw" in plan:
            frames = [plan["raw"]]
        self.send_frames(frames, plan)

    def send_frames(self, frames, plan):
        if plan.get("exception"):
            frames = frames[:plan.get("after", 0)] + [exception(plan["exception"], "stream failed")]
        data = b"".join(frames)
        if plan.get("corrupt") is not None:
            data = bytearray(data)
            data[plan["corrupt"]] ^= 0x40
            data = bytes(data)
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.amazon.eventstream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        step = plan.get("split", 0) or len(data)
        for i in range(0, len(data), step):
            piece = data[i:i + step]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")


class CredsMock(_Server):
    """STS (AssumeRoleWithWebIdentity, XML) and a container credentials
    endpoint (EKS Pod Identity, JSON) handing out temporary keys that
    `bedrock` (a BedrockMock) then takes."""

    def __init__(self, bedrock, role_arn, token_file=None, auth_token=None, lifetime_s=3600):
        super().__init__(("127.0.0.1", 0), _CredsHandler)
        self.bedrock, self.role_arn = bedrock, role_arn
        self.token_file, self.auth_token = token_file, auth_token
        self.lifetime_s = lifetime_s
        self.lock = threading.Lock()
        self.requests = []        # (path, web identity token or Authorization, ok)
        self.failing = 0          # answer this many of the next requests with 503
        self.issued = []          # key ids handed out, in order
        self.start()

    def issue(self):
        import time
        with self.lock:
            n = len(self.issued) + 1
            key = "ASIAPOLYGWTEST%06d" % n
            self.issued.append(key)
        secret, token = "tmp/secret/%d+xyz" % n, "tmp-session-token-%d//=" % n
        self.bedrock.keys[key] = (secret, token)
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + self.lifetime_s))
        return key, secret, token, expires


class _CredsHandler(_Base):
    def failing(self):
        srv = self.server
        with srv.lock:
            if srv.failing:
                srv.failing -= 1
                return True
        return False

    def do_POST(self):
        srv = self.server
        n = int(self.headers.get("Content-Length") or 0)
        form = urllib.parse.parse_qs(self.rfile.read(n).decode(), keep_blank_values=True)
        tok = form.get("WebIdentityToken", [""])[0]
        with open(srv.token_file) as f:
            want = f.read().strip()
        ok = (form.get("Action") == ["AssumeRoleWithWebIdentity"] and
              form.get("RoleArn") == [srv.role_arn] and tok == want and
              form.get("RoleSessionName", [""])[0] != "")
        with srv.lock:
            srv.requests.append((self.path, tok, ok))
        if self.failing():
            return self.answer(503, "text/xml", b"<ErrorResponse><Error><Code>ServiceUnavailable"
                               b"</Code><Message>down</Message></Error></ErrorResponse>")
        if not ok:
            return self.answer(400, "text/xml", b"<ErrorResponse><Error><Type>Sender</Type>"
                               b"<Code>InvalidIdentityToken</Code><Message>bad token</Message>"
                               b"</Error></ErrorResponse>")
        key, secret, token, expires = srv.issue()
        xml = ('<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
               '<AssumeRoleWithWebIdentityResult><Credentials>'
               '<AccessKeyId>%s</AccessKeyId><SecretAccessKey>%s</SecretAccessKey>'
               '<SessionToken>%s</SessionToken><Expiration>%s</Expiration>'
               '</Credentials><SubjectFromWebIdentityToken>system:serviceaccount:ns:sa'
               '</SubjectFromWebIdentityToken></AssumeRoleWithWebIdentityResult>'
               '<ResponseMetadata><RequestId>r1</RequestId></ResponseMetadata>'
               '</AssumeRoleWithWebIdentityResponse>' % (key, secret, token, expires))
        self.answer(200, "text/xml", xml.encode())

    def do_GET(self):
        srv = self.server
        auth = self.headers.get("Authorization", "")
        ok = auth == srv.auth_token
        with srv.lock:
            srv.requests.append((self.path, auth, ok))
        if self.failing():
            return self.answer(503, "application/json", b'{"message":"down"}')
        if not ok:
            return self.answer(401, "application/json", b'{"message":"bad token"}')
        key, secret, token, expires = srv.issue()
        self.answer(200, "application/json", json.dumps(
            {"AccessKeyId": key, "SecretAccessKey": secret, "Token": token,
             "Expiration": expires, "AccountId": "123456789012"}).encode())

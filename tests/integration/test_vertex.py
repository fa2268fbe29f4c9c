"""kind: vertex — Gemini and Anthropic models on Google Cloud's Vertex AI,
with OAuth 2 access tokens from a service-account key or the metadata
server (GKE Workload Identity).

The token endpoint here checks the JWT polygw signs against the key's
public half with the `cryptography` package (RS256), as Google's does; the
upstream is the mock (tests/mock_upstream) at Vertex's paths; the key is a
real RSA key made by `openssl genpkey` for each test.
"""

import base64
import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import await_true, POLYGW, call, config_yaml, source_yaml  # noqa: E402
from test_gemini import CAPS, gbody, sse_events  # noqa: E402
from test_http import DEFAULTS as HTTP_DEFAULTS, front  # noqa: E402,F401
from test_providers import stream_call  # noqa: E402

FAST = {"timeout_s": 10, "connect_timeout_s": 5, "ttft_timeout_s": 1, "idle_timeout_s": 5,
        "max_concurrency": 64, "aimd": {"initial": 64}, "breaker": {"failures": 1000}}
DEFAULTS = {"max_attempts": 2, "stall_window_s": 30, "backoff_base_s": 0.05, "backoff_max_s": 0.1}
EMAIL = "polygw-test@my-project.iam.gserviceaccount.com"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"


def b64url_decode(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


class TokenServer(http.server.ThreadingHTTPServer):
    """Google's OAuth 2 token endpoint (JWT bearer grant) and a GKE metadata
    server, handing out tokens that live `lifetime_s`."""
    daemon_threads = True

    def __init__(self, public_pem=None, lifetime_s=3600):
        super().__init__(("127.0.0.1", 0), TokenHandler)
        self.public = serialization.load_pem_public_key(public_pem) if public_pem else None
        self.lifetime_s = lifetime_s
        self.lock = threading.Lock()
        self.requests = []     # (path, ok, why)
        self.issued = []
        self.failing = 0
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.server_address[1]

    def issue(self):
        with self.lock:
            tok = "ya29.polygw-test-token-%d" % (len(self.issued) + 1)
            self.issued.append(tok)
        return tok

    def check_jwt(self, jwt, aud):
        """Why the assertion is wrong, or None."""
        try:
            head_b, claims_b, sig_b = jwt.split(".")
            head, claims = json.loads(b64url_decode(head_b)), json.loads(b64url_decode(claims_b))
            self.public.verify(b64url_decode(sig_b), ("%s.%s" % (head_b, claims_b)).encode(),
                               padding.PKCS1v15(), hashes.SHA256())
        except Exception as e:  # noqa: BLE001 - any failure is a refusal
            return "bad JWT: %r" % e
        if head.get("alg") != "RS256" or head.get("kid") != "key-id-1":
            return "bad header %r" % head
        now = time.time()
        if (claims.get("iss") != EMAIL or claims.get("aud") != aud or claims.get("scope") != SCOPE
                or abs(claims.get("iat", 0) - now) > 60 or claims.get("exp") != claims["iat"] + 3600):
            return "bad claims %r" % claims
        return None


class TokenHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def token(self, why):
        srv = self.server
        with srv.lock:
            srv.requests.append((self.path, why is None, why))
            failing = srv.failing > 0
            if failing:
                srv.failing -= 1
        if failing:
            return self.answer(503, {"error": "backendError"})
        if why:
            return self.answer(400, {"error": "invalid_grant", "error_description": why})
        self.answer(200, {"access_token": srv.issue(), "expires_in": srv.lifetime_s,
                          "token_type": "Bearer"})

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        form = urllib.parse.parse_qs(self.rfile.read(n).decode())
        why = None
        if form.get("grant_type") != ["urn:ietf:params:oauth:grant-type:jwt-bearer"]:
            why = "bad grant_type"
        else:
            why = self.server.check_jwt(form.get("assertion", [""])[0],
                                        self.server.url + "/token")
        self.token(why)

    def do_GET(self):
        ok = (self.path == "/computeMetadata/v1/instance/service-accounts/default/token" and
              self.headers.get("Metadata-Flavor") == "Google")
        self.token(None if ok else "bad metadata request")


@pytest.fixture
def key(workdir):
    """A service-account key file with a fresh RSA key, and its public half."""
    pem = subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt",
                          "rsa_keygen_bits:2048"], capture_output=True, check=True).stdout
    pub = subprocess.run(["openssl", "pkey", "-pubout"], input=pem, capture_output=True,
                         check=True).stdout
    return pem.decode(), pub


def key_file(workdir, pem, token_uri, **over):
    doc = {"type": "service_account", "project_id": "my-project", "private_key_id": "key-id-1",
           "private_key": pem, "client_email": EMAIL, "client_id": "1",
           "token_uri": token_uri}
    doc.update(over)
    path = os.path.join(workdir, "sa-key.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def vsource(name, up, model, capability="chat", **kw):
    item = dict(FAST, kind="vertex", project="my-project", location="us-east5", model=model,
                serves=["*"])
    item.update(kw)
    return source_yaml(name, capability, up.url, item)


def test_vertex__anthropic_model_with_a_service_account_key(make_sidecar, up, workdir, key):
    pem, pub = key
    ts = TokenServer(pub)
    try:
        path = key_file(workdir, pem, ts.url + "/token")
        sc = make_sidecar(config_text=config_yaml(
            [vsource("vx", up, "claude-3-5-haiku@20241022")], DEFAULTS),
            env={"GOOGLE_APPLICATION_CREDENTIALS": path})
        await_true(lambda: ts.issued, what="the first token")
        c = sc.connect()
        body = {"model": "claude", "max_tokens": 64, "messages": [{"role": "user", "content": "hi vertex"}]}
        err, res, _ = call(c, "chat", body)
        assert err is None, err
        assert res["body"]["content"][0]["text"] == "hi vertex"
        last = up.last()
        assert last["path"] == ("/v1/projects/my-project/locations/us-east5/publishers/anthropic/"
                                "models/claude-3-5-haiku@20241022:rawPredict")
        assert last["headers"]["authorization"] == "Bearer " + ts.issued[0]
        assert last["json"]["anthropic_version"] == "vertex-2023-10-16"
        assert "model" not in last["json"] and "x-api-key" not in last["headers"]
        # A stream: :streamRawPredict, "stream": true in the body, SSE back.
        chunks, err, res = stream_call(c, "chat", dict(body, messages=[
            {"role": "user", "content": "streamed vertex"}]))
        assert err is None, err
        assert up.last()["path"].endswith(":streamRawPredict")
        assert up.last()["json"]["stream"] is True
        assert "".join(ch["delta"]["text"] for ch in chunks
                       if ch["type"] == "content_block_delta") == "streamed vertex"
        assert all(ok for _, ok, _ in ts.requests), ts.requests
        logs = sc.logs()
        assert "ya29." not in logs and "PRIVATE KEY" not in logs
    finally:
        ts.shutdown()
        ts.server_close()


def test_vertex__gemini_over_the_gemini_routes(front, up, workdir, key):
    pem, pub = key
    ts = TokenServer(pub)
    try:
        path = key_file(workdir, pem, ts.url + "/token")
        f = front(sources=[vsource("vg", up, "gemini-2.5-flash", capability="gemini")],
                  env={"GOOGLE_APPLICATION_CREDENTIALS": path}, capabilities=CAPS,
                  defaults=HTTP_DEFAULTS)
        await_true(lambda: ts.issued, what="the first token")
        status, hdrs, body = f.curl("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
                                    gbody("gemini on vertex"))
        assert status == 200, body
        text = "".join(p["text"] for _, d in sse_events(body)
                       for p in json.loads(d)["candidates"][0]["content"]["parts"])
        assert text == "gemini on vertex"
        last = up.last()
        assert last["target"] == ("/v1/projects/my-project/locations/us-east5/publishers/google/"
                                  "models/gemini-2.5-flash:streamGenerateContent?alt=sse")
        assert last["headers"]["authorization"] == "Bearer " + ts.issued[-1]
    finally:
        ts.shutdown()
        ts.server_close()


def test_vertex__metadata_server_tokens_refreshed_under_load(make_sidecar, up):
    # Tokens that live 302 s are fetched again after 2 s.
    ts = TokenServer(lifetime_s=302)
    try:
        host = ts.url[len("http://"):]
        sc = make_sidecar(config_text=config_yaml(
            [vsource("vg", up, "gemini-2.5-flash", capability="gemini")], DEFAULTS,
            capabilities=CAPS), env={"GCE_METADATA_HOST": host,
                                     "GOOGLE_APPLICATION_CREDENTIALS": ""})
        await_true(lambda: ts.issued, what="the first token")
        c = sc.connect()
        deadline = time.monotonic() + 10
        n = 0
        while len(ts.issued) < 2 or n < 20:
            assert time.monotonic() < deadline, "no refresh within 10 s"
            err, res, _ = call(c, "gemini", gbody("load %d" % n), model="gemini-2.5-flash")
            assert err is None, err
            n += 1
        # The token server records a token before its answer reaches the sidecar, and
        # the old token stays valid until then: calls go on, and the new token is used
        # once it has arrived.
        want = "Bearer " + ts.issued[-1]
        while True:
            err, res, _ = call(c, "gemini", gbody("after %d" % n), model="gemini-2.5-flash")
            assert err is None, err
            if up.last()["headers"]["authorization"] == want:
                break
            assert time.monotonic() < deadline + 5, "the refreshed token was never used"
            n += 1
        assert all(ok for _, ok, _ in ts.requests), ts.requests
    finally:
        ts.shutdown()
        ts.server_close()


def test_vertex__token_endpoint_down_fails_typed_then_recovers(make_sidecar, up):
    ts = TokenServer()
    ts.failing = 2
    try:
        sc = make_sidecar(config_text=config_yaml(
            [vsource("vg", up, "gemini-2.5-flash", capability="gemini")], DEFAULTS,
            capabilities=CAPS), env={"GCE_METADATA_HOST": ts.url[len("http://"):],
                                     "GOOGLE_APPLICATION_CREDENTIALS": ""})
        await_true(lambda: ts.requests, what="the first token request")
        c = sc.connect()
        err, _, _ = call(c, "gemini", gbody("x"), model="gemini-2.5-flash")
        assert err is not None and err["code"] in ("retry_exhausted", "stalled"), err
        assert "Google Cloud credentials" in json.dumps(err), err
        assert up.stats()["requests"] == 0, "a request went out without a token"
        for i in range(10):
            call(c, "gemini", gbody("y%d" % i), model="gemini-2.5-flash")
        assert len(ts.requests) <= 3, ts.requests
        await_true(lambda: ts.issued, timeout=15, what="the endpoint to recover")
        err, _, _ = call(c, "gemini", gbody("z"), model="gemini-2.5-flash")
        assert err is None, err
    finally:
        ts.shutdown()
        ts.server_close()


def test_vertex__a_forged_key_is_refused_by_the_token_endpoint(make_sidecar, up, workdir, key):
    pem, pub = key
    other = subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt",
                            "rsa_keygen_bits:2048"], capture_output=True, check=True).stdout
    ts = TokenServer(pub)
    try:
        path = key_file(workdir, other.decode(), ts.url + "/token")
        sc = make_sidecar(config_text=config_yaml(
            [vsource("vx", up, "claude-3-5-haiku@20241022")], DEFAULTS),
            env={"GOOGLE_APPLICATION_CREDENTIALS": path})
        await_true(lambda: ts.requests, what="a token request")
        assert ts.requests[0][1] is False and "bad JWT" in ts.requests[0][2]
        err, _, _ = call(sc.connect(), "chat", {"model": "c", "max_tokens": 8,
                                                "messages": [{"role": "user", "content": "x"}]})
        assert err is not None and ("HTTP %d" % 400) in json.dumps(err), err
    finally:
        ts.shutdown()
        ts.server_close()


@pytest.mark.parametrize("extra,keydoc,want", [
    ({"project": None}, None, "sources[0].project: is required with kind: vertex"),
    ({"api_key_env": "X"}, None, "sources[0].api_key_env: not valid with kind: vertex"),
    ({"location": "US East"}, None, "must be lowercase letters"),
    ({}, {"type": "authorized_user"}, "is not a service-account key"),
    ({}, {"private_key": "-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n"},
     "is not an RSA key in PEM"),
    ({}, {"client_email": None}, "lacks client_email"),
])
def test_vertex__config_errors(workdir, key, extra, keydoc, want):
    pem, _ = key
    item = dict(FAST, kind="vertex", project="my-project", location="us-east5",
                model="gemini-2.5-flash")
    item.update(extra)
    item = {k: v for k, v in item.items() if v is not None}
    path = os.path.join(workdir, "bad.yaml")
    with open(path, "w") as f:
        f.write(config_yaml([source_yaml("vx", "chat", "http://127.0.0.1:9", item)], DEFAULTS))
    env = dict(os.environ)
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    if keydoc is not None:
        doc = {"type": "service_account", "private_key": pem, "client_email": EMAIL,
               "token_uri": "http://127.0.0.1:9/token"}
        doc.update(keydoc)
        doc = {k: v for k, v in doc.items() if v is not None}
        kp = os.path.join(workdir, "key.json")
        with open(kp, "w") as f:
            json.dump(doc, f)
        env["GOOGLE_APPLICATION_CREDENTIALS"] = kp
    p = subprocess.run([POLYGW, "--check-config", path], capture_output=True, text=True, env=env,
                       timeout=20)
    assert p.returncode != 0
    assert want in p.stderr, p.stderr
    assert "PRIVATE KEY" not in p.stderr

"""kind: bedrock — Anthropic models on AWS Bedrock, signed with AWS
Signature Version 4 and streamed as AWS event-stream frames.

The upstream is tests/integration/bedrock_mock.py: it checks the signature
of every request with its own implementation of SigV4 (so a request polygw
signed wrongly is refused with 403, as Bedrock refuses it), and answers in
Bedrock's formats, streams included.
"""

import json
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bedrock_mock import BedrockMock, CredsMock  # noqa: E402
from conftest import await_true, POLYGW, call, config_yaml, source_yaml  # noqa: E402
from test_http import DEFAULTS as HTTP_DEFAULTS, front  # noqa: E402,F401
from test_providers import stream_call  # noqa: E402

KEY_ID = "AKIDPOLYGWTEST000001"
SECRET = "polygw/Test+Secret/0123456789abcdefghijKLMN"
TOKEN = "FwoGZXIvYXdzEPolygwTestSessionToken//0123456789+abc="
REGION = "eu-west-3"
MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
CREDS = {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET}

FAST = {"timeout_s": 10, "connect_timeout_s": 5, "ttft_timeout_s": 5, "idle_timeout_s": 5,
        "max_concurrency": 64, "aimd": {"initial": 64}, "breaker": {"failures": 1000}}
DEFAULTS = {"max_attempts": 2, "stall_window_s": 30, "backoff_base_s": 0.05, "backoff_max_s": 0.1}


@pytest.fixture
def bm():
    with BedrockMock(KEY_ID, SECRET, REGION) as m:
        yield m


def bedrock_source(name, url, **kw):
    item = dict(FAST, kind="bedrock", region=REGION, model=MODEL, serves=["*"])
    item.update(kw)
    return source_yaml(name, "chat", url, item)


def start(make_sidecar, *sources, env=None, defaults=DEFAULTS):
    return make_sidecar(config_text=config_yaml(list(sources), defaults),
                        env=dict(CREDS, **(env or {})))


def messages_body(text="hello", **extra):
    body = {"model": "claude", "max_tokens": 64, "messages": [{"role": "user", "content": text}]}
    body.update(extra)
    return body


def openai_body(text="hello", **extra):
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": text}]}
    body.update(extra)
    return body


def test_bedrock__signed_invoke_with_the_model_in_the_path(make_sidecar, bm):
    sc = start(make_sidecar, bedrock_source("br", bm.url))
    err, res, _ = call(sc.connect(), "chat", messages_body("signed hello"))
    assert err is None, err
    assert res["source"] == "br" and res["attempts"] == 1
    assert res["body"]["content"][0]["text"] == "signed hello"
    assert res["usage"]["input_tokens"] == 12 and res["usage"]["output_tokens"] == 5
    assert bm.bad_signatures == 0
    path, body, headers, why = bm.seen[-1]
    assert why is None
    # The model id's ':' is encoded in the path, and signed encoded once more.
    assert path == "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/invoke"
    assert body == {"max_tokens": 64, "messages": [{"role": "user", "content": "signed hello"}],
                    "anthropic_version": "bedrock-2023-05-31"}
    assert "x-api-key" not in headers and "x-amz-security-token" not in headers
    # The secret never leaves the sidecar, nor reaches its log.
    assert SECRET not in json.dumps(headers) and SECRET not in sc.logs()


def test_bedrock__every_attempt_is_signed_afresh(make_sidecar, bm):
    bm.plan.extend([{"status": 503}, {}])
    sc = start(make_sidecar, bedrock_source("br", bm.url))
    err, res, _ = call(sc.connect(), "chat", messages_body("again"))
    assert err is None, err
    assert res["attempts"] == 2 and bm.bad_signatures == 0 and len(bm.seen) == 2


def test_bedrock__session_token_is_sent_and_signed(make_sidecar):
    with BedrockMock(KEY_ID, SECRET, REGION, token=TOKEN) as m:
        sc = start(make_sidecar, bedrock_source("br", m.url), env={"AWS_SESSION_TOKEN": TOKEN})
        err, res, _ = call(sc.connect(), "chat", messages_body("temporary keys"))
        assert err is None, err
        assert m.bad_signatures == 0
        assert m.seen[-1][2]["x-amz-security-token"] == TOKEN
        assert TOKEN not in sc.logs()


def test_bedrock__wrong_secret_is_refused_as_bedrock_refuses_it(make_sidecar, bm):
    sc = start(make_sidecar, bedrock_source("br", bm.url),
               env={"AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    err, res, _ = call(sc.connect(), "chat", messages_body("x"))
    assert err is not None and bm.bad_signatures >= 1
    assert err["code"] == "upstream_rejected", err
    assert "403" in json.dumps(err)


def test_bedrock__credentials_from_a_profile_file(make_sidecar, bm, workdir):
    path = os.path.join(workdir, "aws-credentials")
    with open(path, "w") as f:
        f.write("[default]\naws_access_key_id = AKIDWRONG\naws_secret_access_key = wrong\n\n"
                "[polygw]\naws_access_key_id = %s\naws_secret_access_key = %s\n" % (KEY_ID, SECRET))
    sc = make_sidecar(config_text=config_yaml([bedrock_source("br", bm.url)], DEFAULTS),
                      env={"AWS_SHARED_CREDENTIALS_FILE": path, "AWS_PROFILE": "polygw",
                           "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""})
    err, _, _ = call(sc.connect(), "chat", messages_body("from the file"))
    assert err is None, err
    assert bm.bad_signatures == 0


def assert_messages_stream(chunks, text):
    """`chunks` are the Messages events of one text block holding `text`."""
    types = [c["type"] for c in chunks]
    assert types[:2] == ["message_start", "content_block_start"], types
    assert types[-3:] == ["content_block_stop", "message_delta", "message_stop"], types
    assert set(types[2:-3]) == {"content_block_delta"}, types
    assert "".join(c["delta"]["text"] for c in chunks if c["type"] == "content_block_delta") == text


@pytest.mark.parametrize("split", [0, 1, 7])
def test_bedrock__event_stream_relayed_as_messages_events(make_sidecar, bm, split):
    """Frames split at every byte (split 1), at odd places (7) or whole."""
    bm.plan.append({"split": split, "text": "streamed over eventstream"})
    sc = start(make_sidecar, bedrock_source("br", bm.url))
    chunks, err, res = stream_call(sc.connect(), "chat", messages_body("s"))
    assert err is None, err
    assert_messages_stream(chunks, "streamed over eventstream")
    assert res["usage"] == {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    assert bm.seen[-1][0].endswith("/invoke-with-response-stream") and bm.bad_signatures == 0


def test_bedrock__openai_client_over_http_gets_chat_chunks(front, bm):
    f = front(sources=[bedrock_source("br", bm.url, accepts="openai", ttft_timeout_s=1)],
              env=CREDS, defaults=HTTP_DEFAULTS)
    status, hdrs, body = f.curl("/v1/chat/completions", openai_body("converted", stream=True))
    assert status == 200, body
    datas = [ln[6:] for ln in body.split("\n") if ln.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    chunks = [json.loads(d) for d in datas[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks
                   if c["choices"]) == "converted"
    status, hdrs, body = f.curl("/v1/chat/completions", openai_body("plain converted"))
    assert status == 200, body
    assert json.loads(body)["choices"][0]["message"]["content"] == "plain converted"
    assert bm.bad_signatures == 0


def test_bedrock__messages_client_over_http_gets_named_events(front, bm):
    f = front(sources=[bedrock_source("br", bm.url, ttft_timeout_s=1)], env=CREDS,
              defaults=HTTP_DEFAULTS)
    status, hdrs, body = f.curl("/v1/messages", messages_body("named", stream=True))
    assert status == 200, body
    names = [ln[7:] for ln in body.split("\n") if ln.startswith("event: ")]
    assert names[0] == "message_start" and names[-1] == "message_stop", body
    assert "content_block_delta" in names


@pytest.mark.parametrize("corrupt", [2, 9, 40], ids=["prelude-length", "prelude-crc", "payload"])
def test_bedrock__corrupted_frame_is_a_bad_response(make_sidecar, bm, corrupt):
    bm.plan.extend([{"corrupt": corrupt}, {"corrupt": corrupt}])
    sc = start(make_sidecar, bedrock_source("br", bm.url))
    chunks, err, res = stream_call(sc.connect(), "chat", messages_body("x"))
    assert chunks == [] and err is not None
    assert "event-stream" in json.dumps(err), err
    # The sidecar still serves.
    err, res, _ = call(sc.connect(), "chat", messages_body("after"))
    assert err is None, err


def test_bedrock__exception_in_the_stream_is_retried(make_sidecar, bm):
    bm.plan.extend([{"exception": "throttlingException", "after": 0}, {}])
    sc = start(make_sidecar, bedrock_source("br", bm.url))
    chunks, err, res = stream_call(sc.connect(), "chat", messages_body("retried"))
    assert err is None, err
    assert res["attempts"] == 2 and chunks[-1]["type"] == "message_stop"


def test_bedrock__throttled_alias_fails_over_to_an_openai_source(make_sidecar, bm, up):
    """One public model served by Bedrock first and an OpenAI source second."""
    bm.plan.extend([{"status": 429}] * 4)
    sc = make_sidecar(config_text=config_yaml(
        [bedrock_source("br", bm.url, accepts="openai", serves=["smart"], priority=0),
         source_yaml("oa", "chat", up.url, dict(FAST, model="gpt-4o-mini", serves=["smart"],
                                                   priority=1))], DEFAULTS), env=CREDS)
    err, res, _ = call(sc.connect(), "chat", openai_body("via openai", model="smart"))
    assert err is None, err
    assert res["source"] == "oa" and res["attempts"] == 2
    assert res["body"]["choices"][0]["message"]["content"] == "via openai"
    assert len(bm.seen) == 1 and bm.bad_signatures == 0


@pytest.mark.parametrize("extra,env,want", [
    ({"region": None}, CREDS, "sources[0].region: is required with kind: bedrock"),
    ({"model": None}, CREDS, "sources[0].model: is required with kind: bedrock"),
    ({"api_key_env": "X"}, CREDS, "sources[0].api_key_env: not valid with kind: bedrock"),
    ({"region": "Not A Region"}, CREDS, "must be an AWS region name"),
    ({}, {"AWS_ACCESS_KEY_ID": "", "HOME": "/nonexistent"}, "kind: bedrock needs AWS credentials"),
    ({}, {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": ""}, "AWS_SECRET_ACCESS_KEY is not"),
])
def test_bedrock__config_errors(workdir, extra, env, want):
    item = dict(FAST, kind="bedrock", region=REGION, model=MODEL)
    item.update(extra)
    item = {k: v for k, v in item.items() if v is not None}
    path = os.path.join(workdir, "bad.yaml")
    with open(path, "w") as f:
        f.write(config_yaml([source_yaml("br", "chat", "http://127.0.0.1:9", item)], DEFAULTS))
    e = dict(os.environ, **env)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
              "AWS_SHARED_CREDENTIALS_FILE", "AWS_PROFILE"):
        if k not in env:
            e.pop(k, None)
    p = subprocess.run([POLYGW, "--check-config", path], capture_output=True, text=True,
                       env=e, timeout=20)
    assert p.returncode != 0
    assert want in p.stderr, p.stderr
    assert SECRET not in p.stderr


# ----------------------------------------------- keys fetched: IRSA and Pod Identity
ROLE = "arn:aws:iam::123456789012:role/polygw-bedrock"
NO_STATIC = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "HOME": "/nonexistent"}


def role_sidecar(make_sidecar, bm, env):
    return make_sidecar(config_text=config_yaml([bedrock_source("br", bm.url)], DEFAULTS),
                        env=dict(NO_STATIC, **env))


def test_bedrock__irsa_keys_fetched_then_refreshed_before_expiry_under_load(make_sidecar, bm,
                                                                          workdir):
    token_file = os.path.join(workdir, "web-identity-token")
    with open(token_file, "w") as f:
        f.write("jwt-one\n")
    # Keys that live 302 s are fetched again after 2 s (300 s before expiry).
    with CredsMock(bm, ROLE, token_file=token_file, lifetime_s=302) as cm:
        sc = role_sidecar(make_sidecar, bm, {"AWS_ROLE_ARN": ROLE,
                                             "AWS_WEB_IDENTITY_TOKEN_FILE": token_file,
                                             "AWS_ENDPOINT_URL_STS": cm.url})
        await_true(lambda: len(cm.issued) >= 1, what="the first STS fetch")
        c = sc.connect()
        err, res, _ = call(c, "chat", messages_body("with role keys"))
        assert err is None, err
        assert bm.seen[-1][2]["authorization"].split("Credential=")[1].startswith(cm.issued[0])
        assert bm.seen[-1][2]["x-amz-security-token"] == "tmp-session-token-1//="
        # The kubelet rotates the token; calls keep coming while the keys
        # are refreshed, and none of them fails.
        with open(token_file, "w") as f:
            f.write("jwt-two\n")
        deadline = time.monotonic() + 10
        n = 0
        while len(cm.issued) < 2 or n < 20:
            assert time.monotonic() < deadline, "no refresh within 10 s"
            err, res, _ = call(c, "chat", messages_body("under load %d" % n))
            assert err is None, err
            n += 1
        assert cm.requests[-1][1] == "jwt-two" and all(ok for _, _, ok in cm.requests)
        err, res, _ = call(c, "chat", messages_body("with new keys"))
        assert err is None, err
        assert cm.issued[-1] in bm.seen[-1][2]["authorization"]
        assert bm.bad_signatures == 0
        logs = sc.logs()
        assert "tmp/secret" not in logs and "tmp-session-token" not in logs and "jwt-" not in logs


def test_bedrock__sts_down_fails_calls_typed_and_recovers_without_a_storm(make_sidecar, bm,
                                                                         workdir):
    token_file = os.path.join(workdir, "web-identity-token")
    with open(token_file, "w") as f:
        f.write("jwt-one")
    with CredsMock(bm, ROLE, token_file=token_file) as cm:
        cm.failing = 2   # 503 twice: retried after 1 s, then 2 s
        sc = role_sidecar(make_sidecar, bm, {"AWS_ROLE_ARN": ROLE,
                                             "AWS_WEB_IDENTITY_TOKEN_FILE": token_file,
                                             "AWS_ENDPOINT_URL_STS": cm.url})
        await_true(lambda: len(cm.requests) >= 1, what="the first STS request")
        c = sc.connect()
        for i in range(10):
            err, res, _ = call(c, "chat", messages_body("x%d" % i))
            if err is None:
                break
            assert err["code"] in ("retry_exhausted", "stalled"), err
            assert "AWS credentials" in json.dumps(err), err
        assert len(bm.seen) == 0 or err is None, "an unsigned request went out"
        # Calls do not make the sidecar ask STS more often.
        assert len(cm.requests) <= 3, cm.requests
        await_true(lambda: len(cm.issued) >= 1, timeout=15, what="STS to recover")
        err, res, _ = call(c, "chat", messages_body("recovered"))
        assert err is None, err
        assert bm.bad_signatures == 0


def test_bedrock__pod_identity_container_endpoint(make_sidecar, bm, workdir):
    token_file = os.path.join(workdir, "eks-pod-identity-token")
    with open(token_file, "w") as f:
        f.write("pod-identity-token-1")
    with CredsMock(bm, ROLE, auth_token="pod-identity-token-1") as cm:
        sc = role_sidecar(make_sidecar, bm, {
            "AWS_CONTAINER_CREDENTIALS_FULL_URI": cm.url + "/v1/credentials",
            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": token_file})
        await_true(lambda: len(cm.issued) >= 1, what="the container endpoint")
        err, res, _ = call(sc.connect(), "chat", messages_body("pod identity"))
        assert err is None, err
        assert cm.requests[0][0] == "/v1/credentials" and cm.requests[0][2]
        assert cm.issued[0] in bm.seen[-1][2]["authorization"] and bm.bad_signatures == 0
        assert "pod-identity-token" not in sc.logs()

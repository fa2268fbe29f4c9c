"""kind: bedrock with keys from the shared credentials file, rotated under
the running sidecar (as `aws sso login`, `aws configure` or a session-key
helper rewrite it). BedrockMock (tests/integration/bedrock_mock.py) checks
every signature with its own SigV4 and knows which keys are valid: a key
revoked in the mock and still used by the sidecar is refused with 403, so
each test sees which key signed.
"""

import os

import pytest

from bedrock_mock import BedrockMock
from conftest import call, config_yaml
from test_bedrock import DEFAULTS, REGION, bedrock_source, messages_body


def keys(n):
    return ("ASIAPOLYGWROTATE%04d" % n, "rotated/secret+%d/abcdefghij" % n,
            "rotated-session-token-%d//=" % n)


def write_profile(path, n, rename=False, profile="polygw"):
    key, secret, token = keys(n)
    text = ("[default]\naws_access_key_id = AKIDWRONG\naws_secret_access_key = wrong\n\n"
            "[%s]\naws_access_key_id = %s\naws_secret_access_key = %s\n"
            "aws_session_token = %s\n" % (profile, key, secret, token))
    target = path + ".tmp" if rename else path
    with open(target, "w") as f:
        f.write(text)
    if rename:
        os.rename(target, path)


def signed_by(bm):
    return bm.seen[-1][2]["authorization"].split("Credential=")[1].split("/")[0]


@pytest.fixture
def rotating(make_sidecar, workdir):
    """A sidecar whose keys come from a credentials file, and the mock."""
    path = os.path.join(workdir, "aws-credentials")
    write_profile(path, 1)
    key, secret, token = keys(1)
    with BedrockMock(key, secret, REGION, token=token) as bm:
        sc = make_sidecar(config_text=config_yaml([bedrock_source("br", bm.url)], DEFAULTS),
                          env={"AWS_SHARED_CREDENTIALS_FILE": path, "AWS_PROFILE": "polygw",
                               "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
                               "AWS_SESSION_TOKEN": ""})
        yield sc, bm, path


def rotate(bm, path, n, **kw):
    """Keys n become valid and every other key is revoked, then the file
    is rewritten: only keys n can sign a request after this."""
    key, secret, token = keys(n)
    bm.keys.clear()
    bm.keys[key] = (secret, token)
    write_profile(path, n, **kw)


def test_bedrock_keys__rotated_file_is_used_by_the_next_request(rotating):
    sc, bm, path = rotating
    c = sc.connect()
    err, res, _ = call(c, "chat", messages_body("with keys 1"))
    assert err is None, err
    assert signed_by(bm) == keys(1)[0]
    # Rewritten in place: the very next request signs with the new keys.
    rotate(bm, path, 2)
    err, res, _ = call(c, "chat", messages_body("with keys 2"))
    assert err is None, err
    assert signed_by(bm) == keys(2)[0]
    assert bm.seen[-1][2]["x-amz-security-token"] == keys(2)[2]
    # Replaced by a rename (a new inode), as careful tools write it.
    rotate(bm, path, 3, rename=True)
    for i in range(5):
        err, res, _ = call(c, "chat", messages_body("with keys 3, call %d" % i))
        assert err is None, err
        assert signed_by(bm) == keys(3)[0]
    assert bm.bad_signatures == 0
    logs = sc.logs()
    assert logs.count("aws credentials read") >= 3
    for n in (1, 2, 3):
        assert keys(n)[1] not in logs and keys(n)[2] not in logs


def test_bedrock_keys__unusable_file_keeps_the_keys_held(rotating):
    sc, bm, path = rotating
    c = sc.connect()
    rotate(bm, path, 2)
    err, res, _ = call(c, "chat", messages_body("x"))
    assert err is None and signed_by(bm) == keys(2)[0], err
    # The profile goes away (a tool rewriting another one), then the file.
    write_profile(path, 9, profile="someone-else")
    err, res, _ = call(c, "chat", messages_body("profile gone"))
    assert err is None and signed_by(bm) == keys(2)[0], err
    assert "has no keys in profile 'polygw'" in sc.logs()
    os.remove(path)
    err, res, _ = call(c, "chat", messages_body("file gone"))
    assert err is None and signed_by(bm) == keys(2)[0], err
    assert "aws credentials file unusable" in sc.logs()
    # It comes back with new keys: used at once.
    rotate(bm, path, 4)
    err, res, _ = call(c, "chat", messages_body("back"))
    assert err is None and signed_by(bm) == keys(4)[0], err
    assert bm.bad_signatures == 0


def test_bedrock_keys__environment_keys_are_not_watched(make_sidecar, workdir):
    """Keys from the environment (which cannot change under a running
    process) sign as before, and no file is looked at."""
    key, secret, token = keys(7)
    with BedrockMock(key, secret, REGION) as bm:
        sc = make_sidecar(config_text=config_yaml([bedrock_source("br", bm.url)], DEFAULTS),
                          env={"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret,
                               "AWS_SHARED_CREDENTIALS_FILE": os.path.join(workdir, "none")})
        err, res, _ = call(sc.connect(), "chat", messages_body("env"))
        assert err is None, err
        assert signed_by(bm) == key and "aws credentials read" not in sc.logs()

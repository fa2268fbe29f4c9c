"""kind: vertex with tokens something else mints: `token_command` (a real
program, run off the loop with a timeout) and `token_file` (a real file,
rewritten under the running sidecar). The upstream is the mock
(tests/mock_upstream) at Vertex's paths; it records the Authorization of
every request, so each test sees which token reached it.
"""

import json
import os
import stat
import subprocess
import time

import pytest

from conftest import await_true, POLYGW, call, config_yaml, source_yaml  # noqa: F401
from test_gemini import CAPS, gbody
from test_vertex import DEFAULTS, FAST, vsource

MODEL = "gemini-2.5-flash"


def script(workdir, name, body):
    path = os.path.join(workdir, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body)
    os.chmod(path, stat.S_IRWXU)
    return path


def start(make_sidecar, up, **kw):
    return make_sidecar(config_text=config_yaml(
        [vsource("vg", up, MODEL, capability="gemini", **kw)], DEFAULTS, capabilities=CAPS),
        env={"GOOGLE_APPLICATION_CREDENTIALS": "", "GCE_METADATA_HOST": "127.0.0.1:9"})


def bearer(up):
    return up.last()["headers"]["authorization"]


def gemini(c, text="x"):
    return call(c, "gemini", gbody(text), model=MODEL)


def test_vertex_tokens__command_minted_then_refreshed_before_expiry(make_sidecar, up, workdir):
    """The program answers as an OAuth endpoint would: a token living 302 s
    is minted again after 2 s (300 s before it expires)."""
    count = os.path.join(workdir, "runs")
    cmd = script(workdir, "mint.sh", 'n=$(($(cat %s 2>/dev/null || echo 0) + 1))\n'
                 'echo $n > %s\n'
                 'echo "a secret on stderr" >&2\n'
                 'printf \'{"access_token": "ya29.cmd-%%d", "expires_in": 302}\' $n\n'
                 % (count, count))
    sc = start(make_sidecar, up, token_command=[cmd, "--scopes", "cloud-platform"])
    c = sc.connect()
    await_true(lambda: os.path.exists(count), what="the first run")
    err, res, _ = gemini(c, "first")
    assert err is None, err
    assert bearer(up) == "Bearer ya29.cmd-1"
    deadline = time.monotonic() + 15
    while bearer(up) != "Bearer ya29.cmd-2":
        assert time.monotonic() < deadline, "the token was never refreshed"
        err, res, _ = gemini(c, "under load")
        assert err is None, err
    logs = sc.logs()
    assert "ya29." not in logs and "a secret on stderr" not in logs


def test_vertex_tokens__command_printing_a_bare_token(make_sidecar, up, workdir):
    """As `gcloud auth print-access-token` prints it: one line."""
    cmd = script(workdir, "print.sh", 'echo "  ya29.bare-token-1"\n')
    sc = start(make_sidecar, up, token_command=[cmd])
    c = sc.connect()
    await_true(lambda: gemini(c)[0] is None, what="a token")
    assert bearer(up) == "Bearer ya29.bare-token-1"


def test_vertex_tokens__command_failing_is_typed_and_never_quotes_stderr(make_sidecar, up,
                                                                        workdir):
    cmd = script(workdir, "fail.sh", 'echo "password=hunter2" >&2\nexit 3\n')
    sc = start(make_sidecar, up, token_command=[cmd])
    c = sc.connect()
    await_true(lambda: "google cloud token fetch failed" in sc.logs(), what="the first run")
    err, _, _ = gemini(c)
    assert err is not None and err["code"] in ("retry_exhausted", "stalled"), err
    detail = json.dumps(err)
    assert "no valid Google Cloud credentials: token_command: exited with status 3" in detail, err
    assert "bytes on standard error, not logged" in detail
    assert up.stats()["requests"] == 0, "a request went out without a token"
    assert "hunter2" not in sc.logs() and "hunter2" not in detail


@pytest.mark.timing  # stats answered within 0.5 s while the program hangs
def test_vertex_tokens__hung_command_never_blocks_the_loop_and_is_killed(make_sidecar, up,
                                                                         workdir):
    pidfile = os.path.join(workdir, "pid")
    cmd = script(workdir, "hang.sh", 'echo $$ > %s\nsleep 60 & wait\n' % pidfile)
    sc = start(make_sidecar, up, token_command=["sh", "-c", cmd])
    c = sc.connect()
    await_true(lambda: os.path.exists(pidfile) and open(pidfile).read().strip(), what="the run")
    pid = int(open(pidfile).read())
    # The sidecar answers at once while the program hangs.
    for _ in range(5):
        t0 = time.monotonic()
        err, stats = c.request("stats")
        assert err is None and time.monotonic() - t0 < 0.5
    err, _, _ = gemini(c)
    assert err is not None and "Google Cloud credentials" in json.dumps(err), err
    # 10 s later the program, and its group (the sleep), are killed and reaped.
    await_true(lambda: "no answer within 10 s" in sc.logs(), timeout=20, what="the timeout")

    def gone():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    await_true(gone, timeout=5, what="the program to be killed")
    p = subprocess.run(["pgrep", "-f", "sleep 60", "-P", str(pid)], capture_output=True)
    assert p.returncode != 0, p.stdout


def test_vertex_tokens__file_rewritten_under_the_running_sidecar(make_sidecar, up, workdir):
    path = os.path.join(workdir, "token")
    with open(path, "w") as f:
        f.write("ya29.file-1\n")
    sc = start(make_sidecar, up, token_file=path)
    c = sc.connect()
    await_true(lambda: gemini(c)[0] is None, what="a token")
    assert bearer(up) == "Bearer ya29.file-1"
    # A CSI driver writes the next token beside it and renames it in place.
    tmp = path + ".new"
    with open(tmp, "w") as f:
        json.dump({"access_token": "ya29.file-2", "expires_in": 3599}, f)
    os.rename(tmp, path)
    deadline = time.monotonic() + 10
    while True:
        err, _, _ = gemini(c)
        assert err is None, err
        if bearer(up) == "Bearer ya29.file-2":
            break
        assert time.monotonic() < deadline, "the new token was never used"
        time.sleep(0.1)
    # A file that goes away, or holds something else, keeps the token held.
    os.remove(path)
    await_true(lambda: "token_file unusable" in sc.logs(), what="the missing file seen")
    err, _, _ = gemini(c)
    assert err is None and bearer(up) == "Bearer ya29.file-2", err
    with open(path, "w") as f:
        f.write("not a token at all\n")
    await_true(lambda: "is not an access token" in sc.logs(), what="the bad file seen")
    err, _, _ = gemini(c)
    assert err is None and bearer(up) == "Bearer ya29.file-2", err
    assert "ya29." not in sc.logs()


def test_vertex_tokens__missing_file_fails_typed(make_sidecar, up, workdir):
    sc = start(make_sidecar, up, token_file=os.path.join(workdir, "absent"))
    err, _, _ = gemini(sc.connect())
    assert err is not None, err
    assert "no valid Google Cloud credentials: token_file: cannot read" in json.dumps(err), err
    assert up.stats()["requests"] == 0


@pytest.mark.parametrize("sources,want", [
    ([dict(token_command="gcloud")], "sources[0].token_command: expected a list"),
    ([dict(token_command=[""])], "sources[0].token_command[0]: must name a program"),
    ([dict(token_command=["x"], token_file="/t")],
     "sources[0].token_file: cannot be combined with token_command"),
    ([dict(token_file="relative/path")], "sources[0].token_file: must be an absolute path"),
    ([dict(token_file="/a"), dict(token_file="/b")],
     "sources[1].token_file: every kind: vertex source must get its token the same way"),
    ([dict(token_command=["x"]), dict()],
     "sources[1].kind: every kind: vertex source must get its token the same way"),
])
def test_vertex_tokens__config_errors(workdir, sources, want):
    items = []
    for i, extra in enumerate(sources):
        item = dict(FAST, kind="vertex", project="my-project", location="us-east5", model=MODEL)
        item.update(extra)
        items.append(source_yaml("v%d" % i, "chat", "http://127.0.0.1:9", item))
    path = os.path.join(workdir, "bad.yaml")
    with open(path, "w") as f:
        f.write(config_yaml(items, DEFAULTS))
    p = subprocess.run([POLYGW, "--check-config", path], capture_output=True, text=True,
                       timeout=20, env=dict(os.environ, GOOGLE_APPLICATION_CREDENTIALS=""))
    assert p.returncode != 0
    assert want in p.stderr, p.stderr


def test_vertex_tokens__only_with_kind_vertex(workdir):
    path = os.path.join(workdir, "bad.yaml")
    with open(path, "w") as f:
        f.write(config_yaml([source_yaml("oa", "chat", "http://127.0.0.1:9",
                                         dict(FAST, token_file="/t"))], DEFAULTS))
    p = subprocess.run([POLYGW, "--check-config", path], capture_output=True, text=True,
                       timeout=20)
    assert p.returncode != 0
    assert "sources[0].token_file: only valid with kind: vertex" in p.stderr, p.stderr


def test_vertex_tokens__reload_switches_from_a_file_to_a_command(make_sidecar, up, workdir):
    path = os.path.join(workdir, "token")
    with open(path, "w") as f:
        f.write("ya29.before-reload\n")
    sc = start(make_sidecar, up, token_file=path)
    c = sc.connect()
    await_true(lambda: gemini(c)[0] is None, what="a token")
    assert bearer(up) == "Bearer ya29.before-reload"
    cmd = script(workdir, "after.sh", 'echo ya29.after-reload\n')
    with open(sc.config, "w") as f:
        f.write(config_yaml([vsource("vg", up, MODEL, capability="gemini", token_command=[cmd])],
                            DEFAULTS, capabilities=CAPS))
    err, _ = c.request("config.reload")
    assert err is None, err
    await_true(lambda: gemini(c)[0] is None and bearer(up) == "Bearer ya29.after-reload",
               what="the command's token after the reload")


def test_vertex_tokens__program_that_cannot_run_is_typed(make_sidecar, up, workdir):
    sc = start(make_sidecar, up, token_command=[os.path.join(workdir, "no-such-program")])
    c = sc.connect()
    await_true(lambda: "google cloud token fetch failed" in sc.logs(), what="the first run")
    err, _, _ = gemini(c)
    assert err is not None, err
    assert "token_command: cannot run" in json.dumps(err), err
    assert "No such file or directory" in json.dumps(err), err
    assert up.stats()["requests"] == 0

"""polygwctl's task commands and libpolygw's task helpers against the REAL
sidecar (PROTOCOL.md 4.4, docs/DESIGN.md §3.5).

test_ctl.py pins the client's side with a fake sidecar; this file checks that
the client and the real `polygw` agree: shapes of the task map, error codes and
messages, exit codes, and that `task stop` really ends a call hung in the
upstream. Every test skips, saying why, when the sidecar answers
`unknown_method` to `task.start` (a sidecar that predates tasks).
"""
import functools
import json
import os
import re
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import POLYGWCTL, sanitizer_env  # noqa: E402
from test_ctl import (build_taskdrv, check_clean, drv as run_taskdrv, kv,  # noqa: E402
                      stop_then_guard, table)

NODE_TIMEOUT_S = 123  # defaults.node_timeout_s: what node_begin arms without a timeout

CONFIG = """\
listen:
  mode: "0660"
server:
  log_level: info
  shutdown_grace_s: 2
defaults:
  node_timeout_s: {node_timeout}
sources:
  - name: mock
    capability: chat
    base_url: "{url}"
    timeout_s: 60
    ttft_timeout_s: 30
    idle_timeout_s: 60
"""

# The mock sends the headers at once, then nothing: the call stays in flight.
HOLD = {"hang": "after_headers"}


@pytest.fixture
def sc(make_sidecar, up):
    sc = make_sidecar(config_text=CONFIG.format(url=up.url, node_timeout=NODE_TIMEOUT_S),
                      env={"no_proxy": "*", "NO_PROXY": "*"})
    # task_id "" is a bad_request where task.start exists, and unknown_method
    # (checked before params, PROTOCOL.md 6.3) where it does not; nothing is created.
    c = sc.connect()
    try:
        e, _ = c.request("task.start", {"task_id": ""})
    finally:
        c.close()
    if e and e.get("code") == "unknown_method":
        pytest.skip("this polygw has no task methods yet (task.start answered unknown_method)")
    assert e and e["code"] == "bad_request", e
    return sc


def run(sc, *args, timeout=20):
    p = subprocess.run([POLYGWCTL, "--socket", sc.sock] + list(args), capture_output=True,
                       text=True, env=sanitizer_env(), timeout=timeout)
    check_clean(p.stderr)
    return p


def ids(p):
    assert p.returncode == 0, p.stderr
    return sorted(r["TASK_ID"] for r in table(p.stdout))


def test_real_start_stop_guard(sc):
    p = run(sc, "task", "start", "job-1")
    assert p.returncode == 0, p.stderr
    d = kv(p.stdout)
    assert (d["task_id"], d["state"], d["runs"]) == ("job-1", "running", "1")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(\d+s ago\)", d["started_at"])
    # starting a running task returns it unchanged
    p = run(sc, "task", "start", "job-1", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["runs"] == 1

    p = run(sc, "task", "guard", "job-1")
    assert (p.returncode, p.stdout) == (0, "running\n")

    stop_then_guard(functools.partial(run, sc), "job-1", "operator: wrong input file")
    # stopping twice is refused and keeps the first reason
    p = run(sc, "task", "stop", "job-1", "--reason", "second")
    assert p.returncode == 1 and p.stderr.startswith("error: task_stopped: ")
    assert json.loads(run(sc, "task", "get", "job-1", "--json").stdout)["reason"] == \
        "operator: wrong input file"
    # a stopped task is not started again, and its calls are refused
    p = run(sc, "task", "start", "job-1")
    assert p.returncode == 1 and p.stderr.startswith("error: task_stopped: ")
    p = run(sc, "call", "chat", "--task", "job-1", "--body", '{"messages": []}')
    assert p.returncode == 1
    assert p.stderr.startswith("error: task_stopped: task 'job-1' was stopped: operator")


def test_real_finish_list_and_filters(sc):
    for t in ("a", "b", "c"):
        assert run(sc, "task", "start", t).returncode == 0
    p = run(sc, "task", "finish", "a", "--ok")
    assert p.returncode == 0, p.stderr
    assert kv(p.stdout)["state"] == "succeeded"
    p = run(sc, "task", "finish", "b", "--failed", "--reason", "parse error on page 3")
    assert p.returncode == 0, p.stderr
    d = kv(p.stdout)
    assert (d["state"], d["reason_kind"], d["reason"]) == ("failed", "error",
                                                           "parse error on page 3")
    assert run(sc, "task", "stop", "c", "--reason", "enough").returncode == 0

    p = run(sc, "tasks")
    assert ids(p) == ["a", "b", "c"]
    by = {r["TASK_ID"]: r for r in table(p.stdout)}
    assert by["a"]["STATE"] == "succeeded" and by["a"]["REASON_KIND"] == "-"
    assert (by["b"]["REASON_KIND"], by["b"]["REASON"]) == ("error", "parse error on page 3")
    assert (by["c"]["REASON_KIND"], by["c"]["REASON"]) == ("stopped", "enough")
    assert all(re.fullmatch(r"\d+s", r["AGE"]) for r in by.values())
    assert ids(run(sc, "tasks", "--state", "failed")) == ["b", "c"]
    assert ids(run(sc, "tasks", "--state", "succeeded")) == ["a"]
    assert ids(run(sc, "tasks", "--state", "running")) == []
    doc = json.loads(run(sc, "tasks", "--json").stdout)
    assert sorted(t["task_id"] for t in doc["tasks"]) == ["a", "b", "c"]

    # finishing twice is refused; a finished task may run again (a new run)
    p = run(sc, "task", "finish", "a", "--ok")
    assert p.returncode == 1 and p.stderr.startswith("error: bad_request: ")
    p = run(sc, "task", "start", "a")
    assert p.returncode == 0 and kv(p.stdout)["runs"] == "2"
    assert kv(p.stdout)["state"] == "running"


def test_real_unknown_task_and_usage(sc):
    p = run(sc, "task", "get", "nope")
    assert p.returncode == 1 and p.stderr.startswith("error: bad_request: unknown task 'nope'")
    p = run(sc, "task", "guard", "nope")
    assert p.returncode == 1 and p.stderr.startswith("error: bad_request: ")
    p = run(sc, "task", "stop", "nope", "--reason", "r")
    assert p.returncode == 1 and p.stderr.startswith("error: bad_request: ")
    p = run(sc, "task", "get", "x" * 129)  # ids are 1..128 bytes
    assert p.returncode == 1 and p.stderr.startswith("error: bad_request: ")
    assert run(sc, "task", "stop", "x").returncode == 2  # --reason is required


def test_real_stop_ends_a_call_hung_in_the_upstream(sc, up):
    assert run(sc, "task", "start", "hung").returncode == 0
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                       "mock": HOLD})
    call = subprocess.Popen([POLYGWCTL, "--socket", sc.sock, "call", "chat", "--task", "hung",
                             "--body", body], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=sanitizer_env())
    try:
        up.wait_stats(lambda s: s["in_progress"] == 1, timeout=5)
        t0 = time.monotonic()
        p = run(sc, "task", "stop", "hung", "--reason", "operator: runaway agent")
        assert p.returncode == 0, p.stderr
        out, errout = call.communicate(timeout=10)
        elapsed = time.monotonic() - t0
    finally:
        if call.poll() is None:
            call.kill()
            call.wait()
    check_clean(errout)
    assert call.returncode == 1, errout
    assert errout.startswith("error: task_stopped: task 'hung' was stopped: "
                             "operator: runaway agent"), errout
    assert out == ""
    assert elapsed < 2.0  # ended by the stop, not by a timeout (60 s here)
    up.wait_stats(lambda s: s["in_progress"] == 0, timeout=2)  # upstream connection closed


def test_real_watchdog_shows_in_tasks(sc, tmp_path):
    exe = build_taskdrv(str(tmp_path))
    assert run(sc, "task", "start", "wd").returncode == 0
    out = subprocess.run([exe, sc.sock, "begin", "wd", "slow-node", "0.2"], capture_output=True,
                         text=True, env=sanitizer_env(), timeout=20).stdout
    assert out == "begin rc=0 code=ok msg=\narmed=0.2\n"
    deadline = time.monotonic() + 5
    while True:
        p = run(sc, "task", "guard", "wd")
        if p.returncode != 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert p.returncode == 1
    assert p.stderr.startswith("error: watchdog_timeout: task 'wd' failed by the watchdog: ")
    assert "slow-node" in p.stderr
    row, = table(run(sc, "tasks", "--state", "failed").stdout)
    assert (row["TASK_ID"], row["REASON_KIND"]) == ("wd", "watchdog")
    assert "slow-node" in row["REASON"]


def test_real_lib_node_scope(sc, up, tmp_path):
    drv = functools.partial(run_taskdrv, build_taskdrv(str(tmp_path)), sc.sock)
    assert run(sc, "task", "start", "lib").returncode == 0
    # explicit and default deadlines as armed by the sidecar
    assert drv("begin", "lib", "n1", "2.5") == "begin rc=0 code=ok msg=\narmed=2.5\n"
    assert drv("end", "lib", "n1") == "end rc=0 code=ok msg=\n"
    assert drv("begin", "lib", "n1", "0") == \
        "begin rc=0 code=ok msg=\narmed=%g\n" % NODE_TIMEOUT_S
    assert drv("end", "lib", "n1") == "end rc=0 code=ok msg=\n"
    # a whole scope, with a real governed call inside it
    out = drv("scope", "lib", "n2", "5", "call")
    assert out.endswith("scope rc=0 code=ok msg=\ncalled=1\n"), out
    assert json.loads(run(sc, "task", "get", "lib", "--json").stdout).get("node") is None
    assert up.stats()["requests"] == 1
    # a stop inside the node ends it with task_stopped; no node_end is needed
    out = drv("scope", "lib", "n3", "0", "stop")
    assert out.endswith("scope rc=-1 code=task_stopped msg=task 'lib' was stopped: "
                        "stopped inside the node\ncalled=1\n"), out
    # a stopped task runs no further node
    assert drv("scope", "lib", "n4", "0", "ok") == (
        "scope rc=-1 code=task_stopped msg=task 'lib' was stopped: "
        "stopped inside the node\ncalled=0\n")
    assert drv("guard", "lib").startswith("guard rc=-1 code=task_stopped msg=")

"""The access log (one JSON line per finished call, docs/OPERATIONS.md §2)
and the run-time log level (`log.level`, `polygwctl log-level`), read from
the real sidecar's stderr."""
import json
import os
import socket
import subprocess
import time

import pytest

from conftest import POLYGWCTL, call, chat, config_yaml, source_yaml

DEFAULTS = {"timeout_s": 5, "connect_timeout_s": 2, "ttft_timeout_s": 2, "idle_timeout_s": 5,
            "max_concurrency": 8, "aimd": {"initial": 8, "min": 8}}
POLICY = {"max_attempts": 3, "stall_window_s": 5, "backoff_base_s": 0.01, "backoff_max_s": 0.02}
KEY = "sk-access-log-secret-4f1c9"
FIELDS = {"level", "ts", "msg", "conn", "msgid", "app", "capability", "scope", "model", "source",
          "task",
          "peer_pid", "peer_uid", "code", "stream", "attempts", "status", "elapsed_s",
          "stalled_s", "ttft_s", "tokens"}


def start(make_sidecar, up, server_extra="", **kw):
    cfg = config_yaml([source_yaml("s1", "chat", up.url, DEFAULTS, api_key_env="PGW_T_KEY")],
                      POLICY, **kw)
    if server_extra:
        cfg = cfg.replace("server:\n", "server:\n" + server_extra, 1)
    return make_sidecar(config_text=cfg, env={"PGW_T_KEY": KEY})


def records(sc):
    out = []
    for line in sc.logs().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def access_lines(sc, n, timeout=3.0):
    """The first `n` access lines, waiting for them (the line is written
    right after the answer is queued)."""
    deadline = time.monotonic() + timeout
    while True:
        got = [r for r in records(sc) if r.get("msg") == "call"]
        if len(got) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def test_access_log__one_line_per_call_with_every_field_and_no_secret(make_sidecar, up):
    sc = start(make_sidecar, up)
    marker = "prompt-text-must-not-be-logged-7d2e"
    c = sc.connect()
    err, res, _ = call(c, "chat", chat(marker, mock={"delay_ms": 100}), task_id=None)
    assert err is None, err
    c.close()
    [rec] = access_lines(sc, 1)
    assert set(rec) == FIELDS, sorted(set(rec) ^ FIELDS)
    assert rec["level"] == "info"
    assert rec["capability"] == "chat" and rec["scope"] == "chat" and rec["source"] == "s1"
    assert rec["code"] == "ok" and rec["attempts"] == 1 and rec["status"] == 200
    assert rec["stream"] is False and rec["task"] is None and rec["ttft_s"] is None
    assert rec["tokens"] == res["usage"]["total_tokens"] > 0
    assert 0.1 <= rec["elapsed_s"] < 2 and rec["stalled_s"] < 0.1
    # The kernel's word for who called (SO_PEERCRED): this test process.
    assert rec["peer_pid"] == os.getpid() and rec["peer_uid"] == os.getuid()
    text = sc.logs()
    assert marker not in text and KEY not in text and "mock reply" not in text


def test_access_log__stream_failure_refusal_and_client_gone(make_sidecar, up):
    sc = start(make_sidecar, up)
    c = sc.connect()
    # A stream: ttft_s is the time to the first chunk relayed.
    err, res, _ = call(c, "chat", chat("s", mock={"delay_ms": 150, "stream_events": 3}),
                       stream=True)
    assert err is None, err
    # Three 500s: retry_exhausted after three attempts.
    up.script([{"status": 500}] * 3)
    err, _, _ = call(c, "chat", chat("f"))
    assert err["code"] == "retry_exhausted"
    # Refused before the governed loop: still one line, with what is known.
    err, _, _ = call(c, "no-such-cap", chat("x"))
    assert err["code"] == "unknown_capability"
    # The client goes away mid-call: nothing is answered, the line says so.
    c2 = sc.connect()
    c2.request_async("call", {"capability": "chat", "body": chat("g", mock={"delay_ms": 3000})})
    up.wait_stats(lambda s: s["open_connections"] >= 1, timeout=3)
    time.sleep(0.1)
    c2.close()
    lines = access_lines(sc, 4)
    assert len(lines) == 4, lines
    stream, failed, refused, gone = lines
    assert stream["code"] == "ok" and stream["stream"] is True
    assert 0.15 <= stream["ttft_s"] <= stream["elapsed_s"], stream
    assert failed["code"] == "retry_exhausted" and failed["attempts"] == 3
    assert failed["status"] == 500 and failed["source"] == "s1" and failed["tokens"] is None
    assert refused["code"] == "unknown_capability" and refused["capability"] == "no-such-cap"
    assert refused["attempts"] == 0 and refused["source"] is None
    assert gone["code"] == "client_gone" and gone["attempts"] == 1 and gone["status"] is None
    c.close()


def test_access_log__task_is_named(make_sidecar, up):
    sc = start(make_sidecar, up)
    c = sc.connect()
    err, _ = c.request("task.start", {"task_id": "job-42"})
    assert err is None, err
    err, _, _ = call(c, "chat", chat("t"), task_id="job-42")
    assert err is None, err
    [rec] = access_lines(sc, 1)
    assert rec["task"] == "job-42"
    c.close()


def test_access_log__opt_out(make_sidecar, up):
    sc = start(make_sidecar, up, server_extra="  access_log: false\n")
    c = sc.connect()
    for _ in range(3):
        assert call(c, "chat", chat("x"))[0] is None
    c.close()
    assert access_lines(sc, 1, timeout=0.3) == []


def ctl(sc, *args):
    return subprocess.run([POLYGWCTL, "--socket", sc.sock] + list(args), capture_output=True,
                          text=True, timeout=10)


def test_log_level__changed_at_run_time(make_sidecar, up):
    sc = start(make_sidecar, up)
    r = ctl(sc, "log-level")
    assert r.returncode == 0 and r.stdout.strip() == "level=info previous=info", r
    r = ctl(sc, "log-level", "warn")
    assert r.returncode == 0 and r.stdout.strip() == "level=warn previous=info", r
    c = sc.connect()
    assert call(c, "chat", chat("quiet"))[0] is None
    assert access_lines(sc, 1, timeout=0.3) == [], "an info line at level warn"
    r = ctl(sc, "log-level", "debug")
    assert r.returncode == 0 and "level=debug previous=warn" in r.stdout, r
    assert call(c, "chat", chat("loud"))[0] is None
    assert len(access_lines(sc, 1)) == 1
    recs = records(sc)
    assert any(x["level"] == "debug" for x in recs), "no debug line at level debug"
    changes = [x for x in recs if x.get("msg") == "log level changed"]
    assert [(x["from"], x["to"]) for x in changes] == [("info", "warn"), ("warn", "debug")]
    # A bad level: a usage error locally, bad_request from the method.
    assert ctl(sc, "log-level", "loud").returncode == 2
    err, _ = c.request("log.level", {"level": "loud"})
    assert err["code"] == "bad_request" and "debug, info, warn or error" in err["message"]
    err, res = c.request("log.level")
    assert err is None and res == {"level": "debug", "previous": "debug"}
    c.close()

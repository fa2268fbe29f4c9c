"""Tasks through the real sidecar: cooperative stop that reaches inside a
hung call, node guards, the watchdog, and bounded task state."""
import time


def config(up, extra=""):
    return ('listen:\n  mode: "0660"\n'
            "server: {log_level: info, shutdown_grace_s: 2}\n"
            "defaults: {max_attempts: 1, stall_window_s: 120, node_timeout_s: 600}\n"
            + extra +
            "sources:\n  - name: a\n    capability: chat\n    base_url: %s\n"
            "    timeout_s: 100\n    ttft_timeout_s: 100\n    idle_timeout_s: 100\n"
            "    max_concurrency: 64\n    aimd: {initial: 64}\n" % up.url)


def body(text="hi", mock=None):
    b = {"messages": [{"role": "user", "content": text}]}
    if mock:
        b["mock"] = mock
    return b


def wait_until(pred, timeout=2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.002)
    return pred()


def test_tasks__stop_ends_a_hung_call_within_50ms(make_sidecar, up):
    sc = make_sidecar(config_text=config(up))
    ctl = sc.connect()
    err, t = ctl.request("task.start", {"task_id": "run-1"})
    assert err is None and t["state"] == "running" and t["task_id"] == "run-1"
    c = sc.connect()
    msgid = c.request_async("call", {"capability": "chat", "task_id": "run-1",
                                     "body": body(mock={"delay_ms": 60000})})
    assert wait_until(lambda: up.stats()["in_progress"] == 1)
    t0 = time.monotonic()
    err, t = ctl.request("task.stop", {"task_id": "run-1", "reason": "user pressed stop"})
    assert err is None and t["state"] == "failed" and t["reason_kind"] == "stopped"
    msg = c.wait_response(msgid, 2)
    dt = time.monotonic() - t0
    assert msg[2]["code"] == "task_stopped", msg
    assert "user pressed stop" in msg[2]["message"]
    assert dt < 0.05, "call ended %.3fs after task.stop" % dt
    # the upstream connection of the hung attempt was closed
    assert wait_until(lambda: up.stats()["open_connections"] == 0, 0.05 + 0.5)
    assert up.stats()["aborted_by_peer"] >= 1


def test_tasks__call_errors_carry_the_same_fields_whatever_ends_them(make_sidecar, up):
    # A task stop and a cancel end a call from outside the governed loop;
    # their errors still describe the call like a loop verdict does
    # (attempts, stalled_s, sources; PROTOCOL.md 6.1), and give no retry
    # estimate.
    sc = make_sidecar(config_text=config(up))
    ctl = sc.connect()
    assert ctl.request("task.start", {"task_id": "r"})[0] is None
    c = sc.connect()
    hung = body(mock={"delay_ms": 60000})
    msgid = c.request_async("call", {"capability": "chat", "task_id": "r", "body": hung})
    assert wait_until(lambda: up.stats()["in_progress"] == 1)
    ctl.request("task.stop", {"task_id": "r", "reason": "halt"})
    stopped = c.wait_response(msgid, 2)[2]
    msgid = c.request_async("call", {"capability": "chat", "body": hung})
    assert wait_until(lambda: up.stats()["in_progress"] == 1)
    c.send([2, "cancel", [msgid]])
    cancelled = c.wait_response(msgid, 2)[2]
    assert stopped["code"] == "task_stopped" and stopped["reason"] == "halt", stopped
    assert cancelled["code"] == "cancelled", cancelled
    for err in (stopped, cancelled):
        assert err["attempts"] == 1 and err["stalled_s"] >= 0, err
        assert isinstance(err["sources"], list), err
        assert all(s["name"] == "a" for s in err["sources"]), err
        assert "retry_after_s" not in err, err


def test_tasks__guard_after_stop_fails_with_reason(make_sidecar, up):
    sc = make_sidecar(config_text=config(up))
    c = sc.connect()
    assert c.request("task.start", {"task_id": "t"})[0] is None
    assert c.request("task.guard", {"task_id": "t"}) == (None, {})
    c.request("task.stop", {"task_id": "t", "reason": "enough"})
    err, res = c.request("task.guard", {"task_id": "t"})
    assert err["code"] == "task_stopped" and "enough" in err["message"]
    assert err["reason"] == "enough"
    # stopping twice keeps the first reason
    err, _ = c.request("task.stop", {"task_id": "t", "reason": "second"})
    assert err["code"] == "task_stopped" and err["reason"] == "enough"
    # a stopped task cannot be restarted behind the user's back
    err, _ = c.request("task.start", {"task_id": "t"})
    assert err["code"] == "task_stopped"
    # unknown tasks are a clear error
    err, _ = c.request("task.stop", {"task_id": "nope", "reason": "x"})
    assert err["code"] == "bad_request" and "unknown task" in err["message"]


def test_tasks__stopped_task_refuses_new_calls(make_sidecar, up):
    sc = make_sidecar(config_text=config(up))
    c = sc.connect()
    c.request("task.start", {"task_id": "t"})
    err, res = c.request("call", {"capability": "chat", "task_id": "t", "body": body()})
    assert err is None and res["body"]["choices"][0]["message"]["content"] == "hi"
    c.request("task.stop", {"task_id": "t", "reason": "done here"})
    before = up.stats()["requests"]
    err, res = c.request("call", {"capability": "chat", "task_id": "t", "body": body()})
    assert err["code"] == "task_stopped" and "done here" in err["message"]
    assert up.stats()["requests"] == before
    err, _ = c.request("call", {"capability": "chat", "task_id": "never", "body": body()})
    assert err["code"] == "bad_request" and "unknown task" in err["message"]


def test_tasks__watchdog_fails_overrunning_node_and_cancels_calls(make_sidecar, up):
    sc = make_sidecar(config_text=config(up))
    c = sc.connect()
    c.request("task.start", {"task_id": "w"})
    err, res = c.request("task.node_begin", {"task_id": "w", "node": "build_skeleton",
                                             "timeout_s": 0.3})
    assert err is None and res["timeout_s"] == 0.3 and res["timeout_source"] == "explicit"
    t0 = time.monotonic()
    msgid = c.request_async("call", {"capability": "chat", "task_id": "w",
                                     "body": body(mock={"delay_ms": 60000})})
    msg = c.wait_response(msgid, 3)
    dt = time.monotonic() - t0
    assert msg[2]["code"] == "watchdog_timeout", msg
    assert "build_skeleton" in msg[2]["message"] and "exceeded" in msg[2]["message"]
    assert 0.25 <= dt <= 0.5, dt
    err, t = c.request("task.get", {"task_id": "w"})
    assert t["state"] == "failed" and t["reason_kind"] == "watchdog"
    err, _ = c.request("task.guard", {"task_id": "w"})
    assert err["code"] == "watchdog_timeout"
    assert wait_until(lambda: up.stats()["open_connections"] == 0)
    st = c.request("stats")[1]["tasks"]
    assert st["watchdog_fired"] == 1 and st["watchdog_after_stop"] == 0
    assert "watchdog: task failed" in sc.logs()


def test_tasks__stop_then_deadline_is_an_ordinary_exit(make_sidecar, up):
    sc = make_sidecar(config_text=config(up))
    c = sc.connect()
    c.request("task.start", {"task_id": "s"})
    c.request("task.node_begin", {"task_id": "s", "node": "n", "timeout_s": 0.2})
    c.request("task.stop", {"task_id": "s", "reason": "user"})
    time.sleep(0.4)
    st = c.request("stats")[1]["tasks"]
    assert st["watchdog_fired"] == 0 and st["watchdog_after_stop"] == 1
    err, t = c.request("task.get", {"task_id": "s"})
    assert t["reason_kind"] == "stopped" and t["reason"] == "user"


def test_tasks__node_scopes_and_finish(make_sidecar, up):
    sc = make_sidecar(config_text=config(up))
    c = sc.connect()
    c.request("task.start", {"task_id": "f"})
    err, res = c.request("task.node_begin", {"task_id": "f", "node": "plan"})
    assert err is None and res["timeout_source"] == "default" and res["timeout_s"] == 600
    time.sleep(0.05)
    err, res = c.request("task.node_end", {"task_id": "f", "node": "plan"})
    assert err is None and 0.04 <= res["elapsed_s"] < 1
    err, t = c.request("task.finish", {"task_id": "f", "ok": True})
    assert err is None and t["state"] == "succeeded"
    err, lst = c.request("task.list", {"state": "succeeded"})
    assert [x["task_id"] for x in lst["tasks"]] == ["f"]
    err, lst = c.request("task.list", {"state": "running"})
    assert lst["tasks"] == []
    err, _ = c.request("task.list", {"state": "bogus"})
    assert err["code"] == "bad_request"
    err, _ = c.request("task.node_begin", {"task_id": "f", "node": "x"})
    assert err["code"] == "bad_request" and "already succeeded" in err["message"]


def test_tasks__finished_tasks_expire_after_ttl(make_sidecar, up):
    sc = make_sidecar(config_text=config(up, "tasks: {ttl_s: 0.3, max_tasks: 3}\n"))
    c = sc.connect()
    for i in range(3):
        assert c.request("task.start", {"task_id": "e%d" % i})[0] is None
    err, _ = c.request("task.start", {"task_id": "e3"})
    assert err["code"] == "overloaded", err
    c.request("task.finish", {"task_id": "e0", "ok": True})
    assert c.request("task.get", {"task_id": "e0"})[1]["state"] == "succeeded"
    time.sleep(0.5)
    err, _ = c.request("task.get", {"task_id": "e0"})
    assert err["code"] == "bad_request" and "unknown task" in err["message"]
    st = c.request("stats")[1]["tasks"]
    assert st["expired"] >= 1
    assert c.request("task.start", {"task_id": "e3"})[0] is None  # room again


def test_tasks__many_tasks_bounded(make_sidecar, up):
    sc = make_sidecar(config_text=config(up))
    c = sc.connect()
    rss0 = int(open("/proc/%d/status" % sc.proc.pid).read().split("VmRSS:")[1].split()[0])
    n = 10000
    blob = b"".join(
        __import__("msgpack").packb([0, i + 1, "task.start", [{"task_id": "task-%05d" % i}]])
        for i in range(n))
    c.send_raw(blob)
    got = 0
    while got < n:
        m = c.recv_msg(10)
        assert m[0] == 1 and m[2] is None, m
        got += 1
    rss1 = int(open("/proc/%d/status" % sc.proc.pid).read().split("VmRSS:")[1].split()[0])
    st = c.request("stats")[1]["tasks"]
    assert st["running"] == n
    # The registry's own accounting (bytes requested) is exact and bounded
    # by its configured limit; RSS is checked loosely (ASan adds redzones).
    per_task = st["memory_bytes"] / n
    per_task_rss = (rss1 - rss0) * 1024 / n
    print("timing: %d tasks: %.0f bytes each (accounted), %.0f (RSS)" % (n, per_task, per_task_rss))
    assert st["memory_bytes"] <= st["memory_limit_bytes"]
    assert per_task < 1024, per_task
    assert per_task_rss < 32 * 1024, per_task_rss

"""task.lua: transitions, first reason kept, TTL, and the stop PUBLISH."""
import os
import select
import subprocess
import time

import pytest

from redis_support import task_key
from redis_args import task, redis_now_ms


def test_lifecycle(scripts, conn):
    assert task(scripts, "t1", "get") == ["not_found"]
    assert task(scripts, "t1", "stop") == ["not_found"]
    assert task(scripts, "t1", "guard") == ["not_found"]
    r = task(scripts, "t1", "start")
    assert r[:6] == ["ok", "running", "", "", 1, r[5]]
    assert abs(r[5] - redis_now_ms(conn)) < 50 and r[6] == 0
    assert task(scripts, "t1", "start")[:2] == ["running", "running"]   # refused
    assert task(scripts, "t1", "guard")[:2] == ["ok", "running"]
    r = task(scripts, "t1", "stop", reason="user pressed stop")
    assert r[:4] == ["ok", "failed", "stopped", "user pressed stop"] and r[6] > 0
    # stopping again keeps the FIRST reason
    r = task(scripts, "t1", "stop", reason="second")
    assert r[:4] == ["stopped", "failed", "stopped", "user pressed stop"]
    assert task(scripts, "t1", "guard")[0] == "stopped"
    assert task(scripts, "t1", "finish", ok=1)[0] == "stopped"
    # a stop is final: starting again is refused, the state unchanged
    assert task(scripts, "t1", "start")[:4] == ["stopped", "failed", "stopped", "user pressed stop"]
    # a finished task may run again under the same id
    task(scripts, "t1b", "start")
    r = task(scripts, "t1b", "finish", ok=1, reason="done")
    assert r[:4] == ["ok", "succeeded", "", "done"]
    r = task(scripts, "t1b", "start")
    assert r[:5] == ["ok", "running", "", "", 2] and r[6] == 0
    task(scripts, "t1b", "finish", ok=1)
    assert task(scripts, "t1b", "stop")[0] == "finished"
    assert task(scripts, "t1b", "guard")[0] == "finished"


def test_finish_failed_and_watchdog(scripts):
    task(scripts, "t2", "start")
    assert task(scripts, "t2", "finish", ok=0)[:4] == ["ok", "failed", "error", "error"]
    assert task(scripts, "t2", "stop")[0] == "finished"
    task(scripts, "t2", "start")   # failed by error: may run again
    assert task(scripts, "t2", "stop")[:4] == ["ok", "failed", "stopped", "stopped"]
    assert task(scripts, "t2", "start")[0] == "stopped"
    task(scripts, "t3", "start")
    r = task(scripts, "t3", "watchdog", reason="node plan exceeded 3s")
    assert r[:4] == ["ok", "failed", "watchdog", "node plan exceeded 3s"]
    assert task(scripts, "t3", "stop")[0] == "watchdog"


def test_reason_truncated_at_utf8_boundary(scripts):
    task(scripts, "t4", "start")
    reason = "a" + "é" * 300                        # 601 bytes; byte 512 splits an é
    r = task(scripts, "t4", "stop", reason=reason)
    kept = r[3].encode()
    assert len(kept) == 511 and kept.decode() == reason[:256]


def test_ttl_and_expiry(scripts, conn):
    task(scripts, "t5", "start", ttl=100)
    assert 95 <= conn.call("TTL", task_key("t5")) <= 100
    task(scripts, "t5", "stop", ttl=1)
    assert task(scripts, "t5", "get", ttl=100)[0] == "ok"
    assert conn.call("TTL", task_key("t5")) <= 1              # get does not extend it
    deadline = time.monotonic() + 3
    while task(scripts, "t5", "get")[0] != "not_found":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # a guard on a running task restarts its idle TTL
    task(scripts, "t6", "start", ttl=1)
    time.sleep(0.6)
    task(scripts, "t6", "guard", ttl=1)
    time.sleep(0.6)
    assert task(scripts, "t6", "get")[1] == "running"


def test_stop_publishes_to_subscribers(scripts, conn, redis_server):
    channel = "pgw:task-end"
    sub = subprocess.Popen(["redis-cli", "-h", "127.0.0.1", "-p", str(redis_server.port),
                            "SUBSCRIBE", channel],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 5
        while conn.call("PUBSUB", "NUMSUB", channel)[1] < 1:
            assert time.monotonic() < deadline, "redis-cli never subscribed"
            time.sleep(0.01)
        task(scripts, "job-42", "start")
        assert task(scripts, "job-42", "stop", reason="r1")[0] == "ok"
        assert task(scripts, "job-42", "stop", reason="r2")[0] == "stopped"   # no 2nd publish
        task(scripts, "job-43", "start")
        task(scripts, "job-43", "finish", ok=1)                               # publishes
        task(scripts, "job-43", "finish", ok=1)                               # no 2nd publish
        task(scripts, "job-44", "start")
        task(scripts, "job-44", "watchdog")

        lines, buf = [], b""
        fd = sub.stdout.fileno()
        deadline = time.monotonic() + 5
        # subscribe confirmation (3 lines) + three messages (3 lines each)
        while len(lines) < 12 and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                buf += chunk
                *done, buf = buf.split(b"\n")
                lines += [x.decode() for x in done]
        # linger briefly: nothing else may arrive
        time.sleep(0.1)
        ready, _, _ = select.select([fd], [], [], 0)
        extra = os.read(fd, 4096).decode() if ready else ""
        assert lines == ["subscribe", channel, "1",
                         "message", channel, "job-42",
                         "message", channel, "job-43",
                         "message", channel, "job-44"], lines
        assert extra == ""
    finally:
        sub.terminate()
        sub.wait(5)


def test_unknown_op_is_an_error(scripts):
    from redis_support import RedisError
    with pytest.raises(RedisError):
        task(scripts, "t7", "explode")


def test_owner_across_sidecars(scripts, connect, conn):
    """The record keeps the app that started the task: any other app, on any
    sidecar, gets exactly the answer for a task that does not exist, and
    nothing changes; the owner, the sidecar itself ('' : its reads and
    verdicts) and admin apps see it."""
    from redis_support import Scripts
    other = Scripts(connect())                     # another sidecar's connection
    r = task(scripts, "own1", "start", app="web")
    assert r[0] == "ok" and r[7] == "web"
    for op in ("get", "guard", "stop", "finish", "start"):
        assert task(other, "own1", op, app="batch", reason="x", ok=1) == ["not_found"], op
    assert task(other, "own1", "get", app="web")[:2] == ["ok", "running"]
    assert task(other, "own1", "get")[:2] == ["ok", "running"]      # no app: no rule
    assert conn.call("HGET", task_key("own1"), "owner") == "web"
    # a stop by an admin app is the owner's to read, reason and all; the
    # admin takes nothing
    assert task(other, "own1", "stop", reason="operator", app="ops", admin=1)[:4] == \
        ["ok", "failed", "stopped", "operator"]
    assert conn.call("HGET", task_key("own1"), "owner") == "web"
    assert task(scripts, "own1", "get", app="web")[:4] == ["ok", "failed", "stopped", "operator"]
    assert task(scripts, "own1", "get", app="batch") == ["not_found"]


def test_owner_is_the_starter_even_an_admin(scripts, conn):
    """A task an admin app starts is the admin's: no ordinary app reads,
    guards, stops or finishes it, nor takes it by naming it; every admin app
    acts on it; a restart keeps the owner."""
    assert task(scripts, "own2", "start", app="ops", admin=1)[7] == "ops"
    for op in ("get", "guard", "stop", "finish", "start"):
        assert task(scripts, "own2", op, app="batch", reason="x", ok=1) == ["not_found"], op
    assert conn.call("HGET", task_key("own2"), "owner") == "ops"
    assert task(scripts, "own2", "guard", app="ops2", admin=1)[:2] == ["ok", "running"]
    task(scripts, "own2", "finish", ok=1, app="ops2", admin=1)
    r = task(scripts, "own2", "start", app="ops", admin=1)
    assert r[:5] == ["ok", "running", "", "", 2] and r[7] == "ops"
    # an admin restarting another app's finished task leaves it that app's
    task(scripts, "own4", "start", app="web")
    task(scripts, "own4", "finish", ok=1, app="web")
    assert task(scripts, "own4", "start", app="ops", admin=1)[7] == "web"
    assert task(scripts, "own4", "get", app="web")[:2] == ["ok", "running"]


def test_ownerless_record_is_an_admins(scripts, conn):
    """A record without an owner (written before owners were kept, or by
    the sidecar itself) is no ordinary app's: none takes it by naming it;
    admin apps and the sidecar act on it."""
    assert task(scripts, "own3", "start")[7] == ""
    assert conn.call("HGET", task_key("own3"), "owner") is None
    for op in ("get", "guard", "stop", "finish", "start"):
        assert task(scripts, "own3", op, app="batch", reason="x", ok=1) == ["not_found"], op
    assert conn.call("HGET", task_key("own3"), "owner") is None
    assert task(scripts, "own3", "get", app="ops", admin=1)[:2] == ["ok", "running"]
    assert task(scripts, "own3", "get")[:2] == ["ok", "running"]
    # an unknown op is refused before anything is written
    try:
        task(scripts, "own3", "bogus", app="web")
        raise AssertionError("accepted")
    except Exception as e:  # noqa: BLE001 (the client's RedisError)
        assert "unknown op" in str(e)
    assert conn.call("HGET", task_key("own3"), "owner") is None

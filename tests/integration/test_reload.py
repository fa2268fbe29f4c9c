"""Reload without restart (docs/OPERATIONS.md §4), against the real sidecar:
SIGHUP and `config.reload` under a steady load of calls, an invalid file,
restart-only keys, a removed source with an attempt in flight, and key files
rotated under the running process (rewritten in place, and swapped the way
a Kubernetes Secret volume swaps its `..data` symlink) with no signal."""
import json
import os
import signal
import subprocess
import threading
import time

import pytest

from conftest import POLYGWCTL, call, chat, config_yaml, source_yaml
from test_http import free_port, http_section

DEFAULTS = {"timeout_s": 5, "connect_timeout_s": 2, "ttft_timeout_s": 2, "idle_timeout_s": 5,
            "max_concurrency": 64, "aimd": {"initial": 64, "min": 64}}
POLICY = {"max_attempts": 3, "stall_window_s": 5, "backoff_base_s": 0.01, "backoff_max_s": 0.02}


def write(sc, sources, **kw):
    text = config_yaml(sources, POLICY, **kw)
    tmp = sc.config + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, sc.config)


def src(name, url, **kw):
    return source_yaml(name, "chat", url, DEFAULTS, **kw)


def records(sc, msg=None):
    out = []
    for line in sc.logs().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if msg is None or r.get("msg") == msg:
            out.append(r)
    return out


def wait_log(sc, msg, n=1, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = records(sc, msg)
        if len(got) >= n:
            return got
        time.sleep(0.02)
    raise AssertionError("no %d x %r in the log:\n%s" % (n, msg, sc.logs()[-4000:]))


def stats(sc, method="stats"):
    c = sc.connect()
    try:
        err, res = c.request(method)
    finally:
        c.close()
    assert err is None, err
    return res


def metrics(sc):
    return stats(sc, "metrics")["text"]


class Load:
    """`n` connections, each sending one call after another until stopped;
    every response is checked against the msgid it answers, so a lost or a
    doubled answer is seen."""

    def __init__(self, sc, n, delay_ms):
        self.sc, self.stop_ev = sc, threading.Event()
        self.sent = [0] * n
        self.answers = [dict() for _ in range(n)]   # msgid -> times answered
        self.errors = []
        self.done = []   # (t_end, source)
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i, delay_ms), daemon=True)
                        for i in range(n)]
        for t in self.threads:
            t.start()

    def run(self, i, delay_ms):
        c = self.sc.connect(timeout=10)
        try:
            while not self.stop_ev.is_set():
                msgid = c.request_async("call", {"capability": "chat",
                                                 "body": chat("load", mock={"delay_ms": delay_ms})})
                self.sent[i] += 1
                while True:
                    msg = c.recv_msg(timeout=10)
                    assert msg is not None, "connection closed"
                    if msg[0] != 1:
                        continue
                    self.answers[i][msg[1]] = self.answers[i].get(msg[1], 0) + 1
                    if msg[1] == msgid:
                        break
                with self.lock:
                    if msg[2] is not None:
                        self.errors.append(msg[2])
                    else:
                        self.done.append((time.monotonic(), msg[3]["source"]))
            # Anything more on this connection would be a second answer.
            c.sock.settimeout(0.3)
            try:
                extra = c.recv_msg(timeout=0.3)
            except OSError:
                extra = None
            if extra is not None:
                self.errors.append({"extra": extra})
        except Exception as e:   # reported by finish()
            self.errors.append({"exception": repr(e)})
        finally:
            c.close()

    def finish(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(15)
            assert not t.is_alive(), "a load thread hung"
        return sum(self.sent)


def test_reload__sighup_under_load_adds_a_source_and_lowers_rpm(make_sidecar, up, up2):
    rpm_after = 8   # per window_s = 1 s: 8 requests a second
    sc = make_sidecar(config_text=config_yaml(
        [src("s1", up.url, limits={"rpm": 100000, "window_s": 1})], POLICY))
    load = Load(sc, 6, delay_ms=20)
    time.sleep(1.0)
    before = up.stats()["requests"]
    write(sc, [src("s1", up.url, limits={"rpm": rpm_after, "window_s": 1}),
               src("s2", up2.url)])
    sc.send_signal(signal.SIGHUP)
    [ok] = wait_log(sc, "configuration reloaded")
    t_reload = time.monotonic()
    s1_at_reload = up.stats()["requests"]
    time.sleep(2.0)
    s1_after = up.stats()["requests"] - s1_at_reload
    span = time.monotonic() - t_reload
    sent = load.finish()

    assert load.errors == [], load.errors[:5]
    answered = [n for a in load.answers for n in a.values()]
    assert len(answered) == sent and set(answered) == {1}, "a call lost or answered twice"
    assert before > 50, "the load did not run before the reload: %d" % before
    # s1 rate before: unlimited; after: at most its bucket (clamped to the new
    # capacity, 8) plus 8 a second, with two requests of slack for timing.
    assert s1_after <= rpm_after + rpm_after * span + 2, (s1_after, span)
    assert s1_after >= rpm_after * span * 0.5, "s1 stopped serving: %d" % s1_after
    # The new source serves the rest.
    assert up2.stats()["requests"] > 20
    srcs = [s for t, s in load.done if t > t_reload]
    assert "s2" in srcs and "s1" in srcs
    assert ok["added"] == 1 and ok["removed"] == 0 and ok["sources"] == 2
    st = stats(sc)
    assert st["reload"] == {"succeeded": 1, "failed": 0, "last_error": ""}
    assert [s["name"] for s in st["sources"]] == ["s1", "s2"]
    assert st["requests"]["in_flight"] == 0
    # The metrics follow: the reload counted, the new source's series there,
    # s1's counters carried over (not restarted at zero).
    text = metrics(sc)
    assert 'polygw_config_reloads_total{result="succeeded"} 1' in text, text[-2000:]
    s1_ok = [l for l in text.splitlines() if l.startswith("polygw_upstream_attempts_total{")
             and 'source="s1"' in l and 'outcome="success"' in l]
    s2_ok = [l for l in text.splitlines() if l.startswith("polygw_upstream_attempts_total{")
             and 'source="s2"' in l and 'outcome="success"' in l]
    assert len(s1_ok) == 1 and float(s1_ok[0].split()[-1]) >= before, s1_ok
    assert len(s2_ok) == 1 and float(s2_ok[0].split()[-1]) > 20, s2_ok


def test_reload__invalid_file_changes_nothing_and_is_reported(make_sidecar, up):
    sc = make_sidecar(config_text=config_yaml([src("s1", up.url, weight=2)], POLICY))
    c = sc.connect()
    assert call(c, "chat", chat("a"))[0] is None
    good = open(sc.config).read()
    with open(sc.config, "w") as f:
        f.write(good.replace("weight: 2", "weight: -1").replace("max_attempts: 3",
                                                                "max_atempts: 3"))
    sc.send_signal(signal.SIGHUP)
    [fail] = wait_log(sc, "reload failed; the running configuration is unchanged")
    errors = [r["error"] for r in records(sc, "reload: configuration error")]
    assert any(e.startswith(sc.config + ":") and "sources[0].weight" in e for e in errors), errors
    assert any("max_atempts" in e and "max_attempts" in e for e in errors), errors
    assert fail["trigger"] == "SIGHUP" and "nothing changed" in fail["error"]
    st = stats(sc)
    assert st["reload"]["succeeded"] == 0 and st["reload"]["failed"] == 1
    assert "invalid configuration (2 errors)" in st["reload"]["last_error"]
    # The old configuration still serves.
    err, res, _ = call(c, "chat", chat("b"))
    assert err is None and res["source"] == "s1"
    # The method says the same, with every error.
    err, _ = c.request("config.reload")
    assert err["code"] == "bad_request" and "invalid configuration" in err["message"]
    assert len(err["errors"]) == 2 and all(e.startswith(sc.config + ":") for e in err["errors"])
    r = subprocess.run([POLYGWCTL, "--socket", sc.sock, "reload"], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 1 and "invalid configuration" in r.stderr, r
    assert all(e + "\n" in r.stderr for e in err["errors"]), r.stderr   # each on its own line
    assert stats(sc)["reload"]["failed"] == 3
    # Fixed: the method reloads, and polygwctl says so.
    with open(sc.config, "w") as f:
        f.write(good.replace("weight: 2", "weight: 3"))
    r = subprocess.run([POLYGWCTL, "--socket", sc.sock, "reload"], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 0 and "sources=1" in r.stdout, r
    assert stats(sc)["reload"] == {"succeeded": 1, "failed": 3, "last_error": ""}
    c.close()


@pytest.mark.parametrize("change,key", [
    (lambda t: t.replace('mode: "0660"', 'mode: "0640"'), "listen.mode"),
    (lambda t: t + "backend:\n  kind: redis\n  url: redis://127.0.0.1:1/0\n", "backend.kind"),
    (lambda t: t.replace("server:\n", "server:\n  upstream_client: libcurl\n", 1),
     "server.upstream_client"),
])
def test_reload__restart_only_keys_refuse_the_whole_reload(make_sidecar, up, up2, change, key):
    sc = make_sidecar(config_text=config_yaml([src("s1", up.url)], POLICY))
    text = config_yaml([src("s1", up.url), src("s2", up2.url)], POLICY)
    with open(sc.config, "w") as f:
        f.write(change(text))
    c = sc.connect()
    err, _ = c.request("config.reload")
    assert err["code"] == "bad_request", err
    assert key in err["message"] and "need a restart" in err["message"], err
    # Not half-applied: s2 was not added.
    assert [s["name"] for s in stats(sc)["sources"]] == ["s1"]
    c.close()


def test_reload__removed_source_finishes_its_attempt_then_goes(make_sidecar, up, up2):
    sc = make_sidecar(config_text=config_yaml(
        [src("s1", up.url, priority=0), src("s2", up2.url, priority=1)], POLICY))
    c = sc.connect(timeout=10)
    up.set_default({"delay_ms": 1200})
    slow = c.request_async("call", {"capability": "chat", "body": chat("slow")})
    up.wait_stats(lambda s: s["open_connections"] >= 1, timeout=3)
    write(sc, [src("s2", up2.url, priority=1)])
    err, res = c.request("config.reload")
    assert err is None and res["removed"] == 1 and res["retired_in_use"] == 1, (err, res)
    st = stats(sc)
    assert [(s["name"], s.get("retired", False)) for s in st["sources"]] == [
        ("s2", False), ("s1", True)]
    # New calls never go to the removed source.
    err, res, _ = call(c, "chat", chat("new"))
    assert err is None and res["source"] == "s2"
    # The attempt in flight ends normally, on the old settings, answered once.
    msg = c.wait_response(slow, timeout=5)
    assert msg[2] is None and msg[3]["source"] == "s1", msg
    up.set_default(None)
    # The next reload finds it unused and drops it.
    err, res = c.request("config.reload")
    assert err is None and res["retired_in_use"] == 0
    assert [s["name"] for s in stats(sc)["sources"]] == ["s2"]
    c.close()


def test_reload__sighup_tells_systemd_reloading_then_ready(workdir, up):
    """RELOADING=1 before, READY=1 after: what Type=notify-reload waits for."""
    import socket as so
    notify = os.path.join(workdir, "n.sock")
    m = so.socket(so.AF_UNIX, so.SOCK_DGRAM)
    m.bind(notify)
    m.settimeout(5)
    cfg = os.path.join(workdir, "polygw.yaml")
    with open(cfg, "w") as f:
        f.write(config_yaml([src("s1", up.url)], POLICY))
    from conftest import POLYGW, sanitizer_env
    env = sanitizer_env()
    env["NOTIFY_SOCKET"] = notify
    log = open(os.path.join(workdir, "log"), "wb")
    p = subprocess.Popen([POLYGW, "--config", cfg, "--socket", os.path.join(workdir, "s")],
                         stdout=log, stderr=log, env=env)
    try:
        assert m.recv(4096).startswith(b"READY=1")
        p.send_signal(signal.SIGHUP)
        got = [m.recv(4096), m.recv(4096)]
        assert got[0].startswith(b"RELOADING=1\nMONOTONIC_USEC="), got
        assert got[1].startswith(b"READY=1"), got
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 0
        log.close()
        m.close()
    text = open(os.path.join(workdir, "log")).read()
    assert "AddressSanitizer" not in text and "runtime error" not in text, text


def key_config(sc, up, key_file):
    return config_yaml([src("s1", up.url, api_key_file=key_file)], POLICY)


def wait_key(sc, c, up, want, timeout=5.0):
    """Calls until the upstream sees `want` (each call is one attempt)."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        err, _, _ = call(c, "chat", chat("k"))
        assert err is None, err
        seen = up.last()["authorization"]
        if seen == "Bearer " + want:
            return
        time.sleep(0.05)
    raise AssertionError("upstream still sees %r, want %r:\n%s" % (seen, want, sc.logs()[-3000:]))


def key_file(workdir, text):
    """keys/openai under workdir, holding `text`."""
    keys = os.path.join(workdir, "keys")
    os.makedirs(keys, exist_ok=True)
    kf = os.path.join(keys, "openai")
    with open(kf, "w") as f:
        f.write(text)
    return kf


def test_reload__key_file_rewritten_is_used_without_a_signal(make_sidecar, up, workdir):
    kf = key_file(workdir, "sk-old-1111\n")
    sc = make_sidecar(config_text=key_config(None, up, kf))
    c = sc.connect()
    assert call(c, "chat", chat("a"))[0] is None
    assert up.last()["authorization"] == "Bearer sk-old-1111"
    with open(kf, "w") as f:      # rewritten in place: truncate, write, close
        f.write("sk-new-2222\n")
    wait_log(sc, "configuration reloaded")
    err, _, _ = call(c, "chat", chat("b"))
    assert err is None and up.last()["authorization"] == "Bearer sk-new-2222"
    [r] = records(sc, "configuration reloaded")
    assert r["trigger"] == "key file"
    # A reply echoing the old key is still scrubbed (an attempt started before
    # the rotation may be answered after it).
    err, res, _ = call(c, "chat", chat("c", mock={"content": "echo sk-old-1111 sk-new-2222"}))
    assert err is None
    text = res["body"]["choices"][0]["message"]["content"]
    assert "sk-old-1111" not in text and "sk-new-2222" not in text, text
    assert "sk-old-1111" not in sc.logs() and "sk-new-2222" not in sc.logs()
    c.close()


def test_reload__kubernetes_secret_symlink_swap(make_sidecar, up, workdir):
    """A Secret volume: key -> ..data/key, ..data -> ..<timestamp>/; an update
    writes a new timestamped directory, points ..data_tmp at it and renames
    ..data_tmp over ..data (one atomic rename), then removes the old one."""
    vol = os.path.join(workdir, "secret")
    os.mkdir(vol)

    def publish(n, key):
        d = os.path.join(vol, "..2026_12_01_%d" % n)
        os.mkdir(d)
        with open(os.path.join(d, "openai"), "w") as f:
            f.write(key)
        tmp = os.path.join(vol, "..data_tmp")
        os.symlink(os.path.basename(d), tmp)
        os.rename(tmp, os.path.join(vol, "..data"))
        return d

    first = publish(1, "sk-k8s-aaaa")
    os.symlink("..data/openai", os.path.join(vol, "openai"))
    sc = make_sidecar(config_text=key_config(None, up, os.path.join(vol, "openai")))
    c = sc.connect()
    assert call(c, "chat", chat("a"))[0] is None
    assert up.last()["authorization"] == "Bearer sk-k8s-aaaa"
    publish(2, "sk-k8s-bbbb")
    for name in os.listdir(first):
        os.unlink(os.path.join(first, name))
    os.rmdir(first)
    wait_key(sc, c, up, "sk-k8s-bbbb")
    assert len(records(sc, "configuration reloaded")) >= 1
    c.close()


def test_reload__key_file_gone_keeps_the_running_key(make_sidecar, up, workdir):
    kf = key_file(workdir, "sk-keep-3333")
    sc = make_sidecar(config_text=key_config(None, up, kf))
    stats(sc)  # answered: the loop runs, the key watch is set
    os.unlink(kf)
    wait_log(sc, "reload failed; the running configuration is unchanged")
    c = sc.connect()
    err, _, _ = call(c, "chat", chat("a"))
    assert err is None and up.last()["authorization"] == "Bearer sk-keep-3333"
    with open(kf, "w") as f:
        f.write("sk-back-4444")
    wait_key(sc, c, up, "sk-back-4444")
    c.close()


def test_reload__redis_backend_reloads_keys_and_refuses_fleet_changes(make_sidecar, up, workdir):
    """With Redis the fleet's scripts hold the limits: a reload may rotate a
    key or re-weight a source, not add one or change its rpm."""
    from redis_fixture import FleetRedis, fleet_config, source, unique_prefix, wait_backend
    r = FleetRedis().start()
    try:
        prefix = unique_prefix()
        kf = key_file(workdir, "sk-redis-1")

        def cfg(*extra, **kw):
            return fleet_config(r.url(), prefix,
                                [source("s1", "chat", up.url, api_key_file=kf, **kw)] + list(extra))
        sc = make_sidecar(config_text=cfg())
        wait_backend(sc)
        c = sc.connect()
        assert call(c, "chat", chat("a"))[0] is None
        assert up.last()["authorization"] == "Bearer sk-redis-1"
        with open(kf, "w") as f:
            f.write("sk-redis-2")
        wait_key(sc, c, up, "sk-redis-2")
        with open(sc.config, "w") as f:
            f.write(cfg(weight=3))
        err, res = c.request("config.reload")
        assert err is None and res["sources"] == 1, err
        for text, what in [(cfg(source("s2", "chat", up.url)), "sources (added or removed"),
                           (cfg(limits={"rpm": 5}), "s1 max_concurrency/limits/breaker")]:
            with open(sc.config, "w") as f:
                f.write(text)
            err, _ = c.request("config.reload")
            assert err["code"] == "bad_request" and what in err["message"], err
            assert "need a restart" in err["message"]
        assert [s["name"] for s in stats(sc)["sources"]] == ["s1"]
        assert call(c, "chat", chat("b"))[0] is None
        c.close()
    finally:
        r.stop()


def test_reload__storm_of_reloads_under_load_loses_nothing(make_sidecar, up, up2):
    """Thirty reloads in a row, alternating between configurations that add
    and remove a source while attempts on it are in flight, change limits
    and weights, under steady load: the sidecar stays up (and clean under
    ASan), every call is answered exactly once and successfully."""
    a = [src("s1", up.url, limits={"rpm": 100000, "window_s": 1})]
    b = [src("s1", up.url, weight=3, aimd={"initial": 8, "min": 2}),
         src("s2", up2.url, limits={"rpm": 50, "window_s": 1})]
    c_ = [src("s2", up2.url, max_concurrency=16)]
    sc = make_sidecar(config_text=config_yaml(a, POLICY))
    load = Load(sc, 6, delay_ms=30)
    oks = []
    try:
        for i in range(30):
            write(sc, [a, b, c_][i % 3])
            if i % 2:
                sc.send_signal(signal.SIGHUP)
            else:
                conn = sc.connect()
                err, _ = conn.request("config.reload")
                conn.close()
                assert err is None, err
            time.sleep(0.05)
            assert "polygw_upstream_attempts_total" in metrics(sc)   # renders the new sources
        oks = wait_log(sc, "configuration reloaded", n=30)
    finally:
        sent = load.finish()
    assert load.errors == [], load.errors[:5]
    answered = [n for a_ in load.answers for n in a_.values()]
    assert len(answered) == sent and set(answered) == {1}
    assert sent > 50
    st = stats(sc)
    assert st["reload"]["succeeded"] == 30 and st["reload"]["failed"] == 0
    # Sources really were removed with attempts in flight, and added back.
    assert any(r["retired_in_use"] > 0 for r in oks), oks
    assert sum(r["added"] for r in oks) >= 15 and sum(r["removed"] for r in oks) >= 15
    assert st["requests"]["in_flight"] == 0
    assert all(s["in_flight"] == 0 for s in st["sources"]), st["sources"]


def test_reload__v1_models_follows_the_sources(make_sidecar, up, up2, workdir):
    """GET /v1/models lists the models of the configuration in force: after
    a SIGHUP that drops one source's `model`, adds another and removes a
    source still in use (retired, not configured), it lists what the new
    file says."""
    port = free_port()
    http = http_section(listen="127.0.0.1:%d" % port)

    def models():
        out = subprocess.run(["curl", "-s", "--max-time", "5",
                              "http://127.0.0.1:%d/v1/models" % port],
                             capture_output=True, timeout=10).stdout
        return [(m["id"], m["owned_by"]) for m in json.loads(out)["data"]]

    def write_http(sources):
        with open(sc.config + ".tmp", "w") as f:
            f.write(config_yaml(sources, POLICY) + http)
        os.replace(sc.config + ".tmp", sc.config)

    sc = make_sidecar(config_text=config_yaml(
        [src("a", up2.url, model="gpt-a"), src("b", up2.url, model="gpt-b"),
         src("old", up.url, model="gpt-old", serves=["*"], priority=-1)], POLICY) + http)
    assert models() == [("gpt-a", "a"), ("gpt-b", "b"), ("gpt-old", "old")]
    c = sc.connect(timeout=10)
    up.set_default({"delay_ms": 1500})
    slow = c.request_async("call", {"capability": "chat", "body": chat("slow")})
    up.wait_stats(lambda s: s["open_connections"] >= 1, timeout=3)
    write_http([src("a", up2.url, model="gpt-a"), src("b", up2.url),
                src("c", up2.url, model="gpt-c")])
    sc.send_signal(signal.SIGHUP)
    wait_log(sc, "configuration reloaded")
    assert [(s["name"], s.get("retired", False)) for s in stats(sc)["sources"]] == [
        ("a", False), ("b", False), ("c", False), ("old", True)]
    assert models() == [("gpt-a", "a"), ("gpt-c", "c")]
    assert c.wait_response(slow, timeout=5)[3]["source"] == "old"
    up.set_default(None)
    c.close()

"""apps[i].per_capability through the real sidecar (memory backend) and the
mock upstream: an app's limits on one capability hold its calls of that
capability, on top of its own limits, and leave its other capabilities
alone. Callers run as root, whose entry declares the app of each call.
Every wait is bounded."""
import os
import time

from conftest import Pending


def wait_until(pred, timeout, interval):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True

BODIES = {"chat": {"model": "m", "messages": [{"role": "user", "content": "x"}]},
          "embedding": {"model": "m", "input": "x"}}


def per_cap_config(up_url, web):
    return ('listen:\n  mode: "0660"\n'
            "server: {log_level: info, shutdown_grace_s: 1}\n"
            "defaults: {max_attempts: 1, stall_window_s: 60}\n"
            "apps:\n"
            "  - {name: relay, uids: [0], admin: true, allow_declared: true}\n"
            "  - %s\n"
            "sources:\n"
            "  - {name: c, capability: chat, base_url: %s, max_concurrency: 8,"
            " aimd: {initial: 8, min: 8}}\n"
            "  - {name: e, capability: embedding, base_url: %s, max_concurrency: 8,"
            " aimd: {initial: 8, min: 8}}\n" % (web, up_url, up_url))


def send(sc, cap, n, app="web", **mock):
    body = dict(BODIES[cap], mock=mock) if mock else BODIES[cap]
    return [Pending(sc, cap, body, app=app, timeout=10) for _ in range(n)]


def test_apps__per_capability_max_concurrency(make_sidecar, up):
    """web: max_concurrency 1 on chat. Three chat calls held 0.8 s each by
    the mock run one at a time; web's embedding calls and another app's
    chat calls run next to them at once."""
    hold = 0.8
    sc = make_sidecar(config_text=per_cap_config(
        up.url, "{name: web, per_capability: {chat: {max_concurrency: 1}}}"))
    t0 = time.monotonic()
    chats = send(sc, "chat", 3, delay_ms=int(hold * 1000))
    assert wait_until(lambda: up.stats()["in_progress"] == 1, 3, 0.005)
    others = send(sc, "embedding", 2, delay_ms=300) + send(sc, "chat", 1, app="relay",
                                                           delay_ms=300)
    assert wait_until(lambda: up.stats()["in_progress"] == 4, hold / 2, 0.005), up.stats()
    err, st = sc.connect().request("stats")
    assert err is None
    web = [a for a in st["apps"] if a["name"] == "web"][0]
    assert list(web["per_capability"]) == ["chat"], web
    assert web["per_capability"]["chat"]["in_flight"] == 1, web
    assert web["per_capability"]["chat"]["limited"] >= 2, web
    assert web["per_capability"]["chat"]["rpm_level"] is None, web
    for k in chats + others:
        err, _ = k.wait(10)
        assert err is None, err
    ends = sorted(k.t_end - t0 for k in chats)
    print("timing: web's chat calls answered at %r" % [round(t, 3) for t in ends])
    assert ends[1] >= 2 * hold - 0.02 and ends[2] >= 3 * hold - 0.02, ends   # one at a time
    err, res = sc.connect().request("metrics")
    assert err is None
    lines = res["text"].splitlines()
    assert 'polygw_app_attempts_admitted_total{app="web"} 5' in lines
    limited = [l for l in lines if l.startswith('polygw_app_limited_total{app="web"}')]
    assert limited and int(limited[0].split()[-1]) >= 2


def test_apps__per_capability_rpm_on_top_of_the_apps_own(make_sidecar, up):
    """web: rpm 4 per window_s 1 of its own, rpm 2 per window_s 1 on
    embedding. Four embedding calls at once: 2 answered at once, the 3rd
    about 0.5 s later, the 4th about 1 s later (the capability's bucket of
    2 refilled at 2/s). Two chat calls then: the app's own bucket has 4 - 4
    taken + 2 refilled, so both run at once: its rpm counts every capability."""
    sc = make_sidecar(config_text=per_cap_config(
        up.url, "{name: web, limits: {rpm: 4, window_s: 1},"
                " per_capability: {embedding: {rpm: 2, window_s: 1}}}"))
    t0 = time.monotonic()
    embeds = send(sc, "embedding", 4)
    for k in embeds:
        err, _ = k.wait(5)
        assert err is None, err
    ends = sorted(k.t_end - t0 for k in embeds)
    print("timing: embedding answers %r" % [round(t, 3) for t in ends])
    assert ends[1] < 0.3, ends
    assert 0.5 - 0.02 <= ends[2] <= 0.5 + 0.3, ends
    assert 1.0 - 0.02 <= ends[3] <= 1.0 + 0.3, ends
    t1 = time.monotonic()
    chats = send(sc, "chat", 2)
    for k in chats:
        err, _ = k.wait(5)
        assert err is None, err
    assert max(k.t_end for k in chats) - t1 < 0.3
    assert up.stats()["requests"] == 6


def rewrite(sc, text):
    tmp = sc.config + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, sc.config)


def test_apps__reload_changes_an_apps_limits_keeping_its_calls(make_sidecar, up):
    """A reload sets web's per_capability chat max_concurrency 1 while two of
    its chat calls run (started unlimited): both finish, and the next chat
    call of web waits until web is below 1 there (the calls in flight
    count). Renaming an app needs a restart and changes nothing."""
    sc = make_sidecar(config_text=per_cap_config(up.url, "{name: web}"))
    c = sc.connect(timeout=10)
    running = send(sc, "chat", 2, delay_ms=600)
    assert wait_until(lambda: up.stats()["in_progress"] == 2, 3, 0.005)
    rewrite(sc, per_cap_config(up.url, "{name: web, per_capability: {chat: {max_concurrency: 1}}}"))
    err, res = c.request("config.reload")
    assert err is None, err
    t0 = time.monotonic()
    nxt = send(sc, "chat", 1)[0]
    time.sleep(0.2)
    assert not nxt.answered() and up.stats()["in_progress"] == 2, up.stats()
    for k in running + [nxt]:
        err, _ = k.wait(5)
        assert err is None, err
    assert nxt.t_end - t0 >= 0.3          # after both running calls ended (~0.6 s in)
    rewrite(sc, per_cap_config(up.url, "{name: webb}"))
    err, _ = c.request("config.reload")
    assert err is not None and "apps (added, removed, renamed or reordered)" in err["message"], err
    c.close()

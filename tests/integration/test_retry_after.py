"""A long Retry-After against the stall budget, end to end: the real sidecar,
the real mock upstream answering 429 / 503 with the header, real time.

A Retry-After holds back the source that sent it, for that call only. When
it holds back every source of the capability past the time the call's stall
verdict would land, and the scope made no progress within stall_window_s,
the call ends `stalled` at once (proto/PROTOCOL.md, section 6.1.1) with the
hint in `retry_after_s` (clamped to 86400 s, a day); a recent progress keeps
it waiting, up to the verdict. A retry-later error never says
`retry_after_s: 0`.

Timing: "at once" is asserted as well inside the stall window (the call
would have slept 3600 s or a day before the fix); ASan + UBSan and a shared
2-core machine are the slack (LATE). Every wait is bounded by the client's
own timeout.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import call, chat, config_yaml, source_yaml  # noqa: E402

WINDOW = 1.0
LATE = 0.35
DAY = 86400.0
DATE_2099 = "Thu, 01 Jan 2099 00:00:00 GMT"

SOURCE_DEFAULTS = {"timeout_s": 5, "connect_timeout_s": 2, "ttft_timeout_s": 0.3,
                   "idle_timeout_s": 5, "max_concurrency": 16, "aimd": {"initial": 16},
                   "breaker": {"failures": 100000}}


def start(make_sidecar, sources, **defaults):
    d = {"max_attempts": 3, "stall_window_s": WINDOW, "backoff_base_s": 0.1,
         "backoff_max_s": 0.2}
    d.update(defaults)
    return make_sidecar(config_text=config_yaml(sources, d),
                        env={"no_proxy": "*", "NO_PROXY": "*"})


def body_for(capability, mock=None):
    if capability == "chat":
        return chat(mock=mock)
    body = {"model": "m", "input": "hello"}
    if mock is not None:
        body["mock"] = mock
    return body


@pytest.mark.parametrize("capability", ["chat", "embedding"])  # exempt_429, counted 429
@pytest.mark.parametrize("status,hint,want", [
    (429, 3600, 3600.0),
    (429, 31536000, DAY),
    (429, DATE_2099, DAY),
    (503, 3600, 3600.0),
    (503, DATE_2099, DAY),
])
def test_retry_after__long_hint_ends_within_the_stall_window(make_sidecar, up, capability,
                                                             status, hint, want):
    """One source, a scope that never made progress: the one attempt's
    Retry-After outlives the window, so the call ends `stalled` as it comes
    back, telling the client the upstream's hint."""
    sc = start(make_sidecar, [source_yaml("a", capability, up.url, SOURCE_DEFAULTS)])
    up.set_default({"status": status, "retry_after": hint})
    err, res, elapsed = call(sc.connect(), capability, body_for(capability),
                             timeout=WINDOW + 5)
    print("timing: %s %s Retry-After %s -> %s after %.3fs, retry_after_s %.1f"
          % (capability, status, hint, err and err["code"], elapsed, err and err["retry_after_s"]))
    assert res is None and err["code"] == "stalled", err
    assert elapsed <= LATE, elapsed                    # at once, not after the window
    assert err["attempts"] == 1 and up.stats()["requests"] == 1, err
    assert err["status"] == status, err
    assert want - 2 <= err["retry_after_s"] <= want, err
    assert "Retry-After holds back every source for %.0fs" % err["retry_after_s"] \
        in err["message"], err["message"]


def test_retry_after__last_counted_attempt_is_retry_exhausted(make_sidecar, up):
    """embedding (429 counted) with max_attempts 1: the 429 spends the retry
    budget, so retry_exhausted, at once, with the hint."""
    sc = start(make_sidecar, [source_yaml("e", "embedding", up.url, SOURCE_DEFAULTS)],
               max_attempts=1)
    up.set_default({"status": 429, "retry_after": 3600})
    err, res, elapsed = call(sc.connect(), "embedding", body_for("embedding"), timeout=WINDOW + 5)
    assert res is None and err["code"] == "retry_exhausted", err
    assert elapsed <= LATE, elapsed
    assert 3598 <= err["retry_after_s"] <= 3600, err


def test_retry_after__hint_holds_back_only_its_source(make_sidecar, up, up2):
    """Source a answers 429 Retry-After 3600, source b serves: the call
    goes on to b after one backoff (not after an hour), and succeeds."""
    sc = start(make_sidecar, [source_yaml("a", "chat", up.url, SOURCE_DEFAULTS, priority=0),
                              source_yaml("b", "chat", up2.url, SOURCE_DEFAULTS, priority=1)])
    up.set_default({"status": 429, "retry_after": 3600})
    err, res, elapsed = call(sc.connect(), "chat", chat(), timeout=WINDOW + 5)
    assert err is None and res["source"] == "b", (err, res)
    assert res["attempts"] == 2 and elapsed <= 0.2 + LATE, (res, elapsed)
    assert up.stats()["requests"] == 1 and up2.stats()["requests"] == 1


def test_retry_after__recent_progress_waits_until_the_verdict(make_sidecar, up):
    """The scope succeeded just before: the call keeps waiting (the scope is
    being served) — but only until its verdict, about one window later,
    never for the hour the upstream asked for."""
    sc = start(make_sidecar, [source_yaml("a", "chat", up.url, SOURCE_DEFAULTS)])
    c = sc.connect()
    err, res, _ = call(c, "chat", chat())
    assert err is None, err
    err, res, elapsed = call(c, "chat", chat(mock={"status": 429, "retry_after": 3600}),
                             timeout=WINDOW + 5)
    print("timing: recent progress, Retry-After 3600 -> %s after %.3fs"
          % (err and err["code"], elapsed))
    assert res is None and err["code"] == "stalled", err
    assert WINDOW - 0.3 <= elapsed <= WINDOW + LATE, elapsed
    assert 3595 <= err["retry_after_s"] <= 3600, err
    assert err["attempts"] == 1


@pytest.mark.parametrize("capability,code", [("chat", "stalled"), ("embedding", "retry_exhausted")])
def test_retry_after__no_header_still_says_when(make_sidecar, up, capability, code):
    """429s without Retry-After and nothing gating the source: the answer's
    retry_after_s is the sidecar's own next backoff, never 0."""
    sc = start(make_sidecar, [source_yaml("a", capability, up.url, SOURCE_DEFAULTS)],
               stall_window_s=0.5)
    up.set_default({"status": 429})
    err, res, elapsed = call(sc.connect(), capability, body_for(capability), timeout=5)
    assert res is None and err["code"] == code, err
    assert 0.05 <= err["retry_after_s"] <= 0.2, err     # a backoff: [0.5, 1) x base..max


def test_retry_after__deadline_message_has_no_dangling_separator(make_sidecar, up):
    """deadline_s reached in a backoff sleep (no attempt in progress, so no
    detail to append): the message ends with the attempt count."""
    sc = start(make_sidecar, [source_yaml("a", "chat", up.url, SOURCE_DEFAULTS)],
               backoff_base_s=2, backoff_max_s=2)
    up.set_default({"status": 500})
    err, res, elapsed = call(sc.connect(), "chat", chat(), deadline_s=0.3, timeout=5)
    assert res is None and err["code"] == "deadline_exceeded", err
    assert err["message"].endswith("(1 attempt(s))"), err["message"]

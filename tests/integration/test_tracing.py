"""Tracing through the Python client and the stats: the `trace` parameter
(the client's `trace=` carrier) decides the sampling of a call under the
caller's context, `stats` shows the tracer's figures (and the tracing
section only while tracing is on), bad `trace` values are refused, and a
reload turns tracing off (the queue dropped, counted) and on again.

What the spans hold is checked by tests/http/tracing*.test.js, decoded with
the OpenTelemetry project's own definitions."""
import os
import socket
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "client", "python"))

import polygw  # noqa: E402
from conftest import chat, config_yaml, source_yaml  # noqa: E402

SRC = {"timeout_s": 10, "ttft_timeout_s": 5}
DEFAULTS = {"max_attempts": 1, "stall_window_s": 10}
TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0%d"


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def tracing_yaml(tracing):
    return "tracing:\n" + "".join("  %s: %s\n" % kv for kv in tracing.items())


def config(up, tracing):
    return config_yaml([source_yaml("a", "chat", up.url, SRC)], DEFAULTS) + tracing_yaml(tracing)


def tracing_stats(sc):
    with polygw.Client(sc.sock) as c:
        return c.stats().get("tracing")


def test_trace_parameter_decides_sampling(make_sidecar, up):
    # A receiver that is down: spans are recorded, queued, never exported.
    sc = make_sidecar(config_text=config(up, {
        "enabled": "true", "endpoint": '"http://127.0.0.1:%d/v1/traces"' % closed_port(),
        "sampler_ratio": 0, "export_interval_s": 3600}))
    with polygw.Client(sc.sock) as c:
        c.call("chat", chat("hi"))                                   # no parent, ratio 0
        c.call("chat", chat("hi"), trace={"traceparent": TP % 0})    # parent not sampled
        st = c.stats()["tracing"]
        assert st["spans_started"] == 0 and st["unsampled"] == 2, st
        r = c.call("chat", chat("hi"), trace={"traceparent": TP % 1, "tracestate": "k=v"})
        assert r["source"] == "a"
        st = c.stats()["tracing"]
        assert st["spans_started"] == 2, st      # the call and its attempt
        assert st["queued"] == 2, st
        with pytest.raises(polygw.BadRequestError, match="tracestate must be a string"):
            c.call("chat", chat("hi"), trace={"tracestate": 5})
        with pytest.raises(polygw.BadRequestError):
            c.call("chat", chat("hi"), trace="not a map")


def test_stats_without_tracing_and_reload(make_sidecar, up):
    sc = make_sidecar(config_text=config(up, {"enabled": "false"}))
    assert tracing_stats(sc) is None
    with polygw.Client(sc.sock) as c:
        # Accepted and ignored while tracing is off.
        c.call("chat", chat("hi"), trace={"traceparent": TP % 1})
    with open(sc.config, "w") as f:
        f.write(config(up, {"enabled": "true", "export_interval_s": 3600,
                            "endpoint": '"http://127.0.0.1:%d/v1/traces"' % closed_port()}))
    with polygw.Client(sc.sock) as c:
        c.request("config.reload")
        c.call("chat", chat("hi"))
        st = c.stats()["tracing"]
        assert st["spans_started"] == 2 and st["queued"] == 2, st
    with open(sc.config, "w") as f:
        f.write(config(up, {"enabled": "false"}))
    with polygw.Client(sc.sock) as c:
        c.request("config.reload")
        assert "tracing" not in c.stats()


def test_bad_endpoint_in_the_environment_is_refused(make_sidecar, up):
    sc = make_sidecar(start=False, config_text=config(up, {"enabled": "true"}),
                      env=dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT="collector:4318"))
    sc.expected_rc = 1
    sc.start(wait=False)
    assert sc.proc.wait(10) == 1
    # The message names the variable to fix (never quoting its value).
    assert ("OTEL_EXPORTER_OTLP_ENDPOINT: the OTLP traces endpoint must be an http:// or "
            "https:// URL") in sc.logs()
    assert "collector:4318" not in sc.logs()


@pytest.mark.parametrize("client", ["auto", "libcurl"])
def test_each_attempt_sends_its_own_traceparent(make_sidecar, up, client):
    # Both HTTP clients (the own one for a plain http:// address, libcurl)
    # send the attempt's traceparent: the caller's trace id, a new span id.
    text = config(up, {"enabled": "true", "export_interval_s": 3600,
                       "endpoint": '"http://127.0.0.1:%d/v1/traces"' % closed_port()})
    text = text.replace("server:\n", "server:\n  upstream_client: %s\n" % client, 1)
    sc = make_sidecar(config_text=text)
    with polygw.Client(sc.sock) as c:
        for _ in range(2):
            c.call("chat", chat("hi"), trace={"traceparent": TP % 1})
            h = {k.lower(): v for k, v in up.last()["headers"].items()}
            tp = h["traceparent"].split("-")
            assert tp[0] == "00" and tp[1] == TP.split("-")[1] and tp[3] == "01", h
            assert tp[2] != TP.split("-")[2] and len(tp[2]) == 16
        c.call("chat", chat("hi"))  # a new trace: still one traceparent, no other
        h = [k for k in up.last()["headers"] if k.lower() == "traceparent"]
        assert len(h) == 1


QUIET = {"enabled": "true", "sampler_ratio": 0, "export_interval_s": 3600}


def quiet_tracing():
    """Tracing on, nothing recorded without a sampled parent, nothing
    exported (a receiver that is down): what was recorded shows in stats."""
    return dict(QUIET, endpoint='"http://127.0.0.1:%d/v1/traces"' % closed_port())


@pytest.fixture
def redis_srv():
    from redis_fixture import FleetRedis
    srv = FleetRedis().start()
    yield srv
    srv.cleanup()


def test_task_run_carries_its_trace_to_its_calls(make_sidecar, up):
    # sampler_ratio 0: only what a sampled parent decides is recorded. The
    # run's calls without a trace of their own follow the run's context.
    check_task_run_trace(make_sidecar(config_text=config(up, quiet_tracing())), up)


def test_task_run_trace_on_the_redis_backend(redis_srv, up, make_sidecar):
    # The same with the task's record in Redis (answers from the loop).
    from redis_fixture import fleet_config, unique_prefix, wait_backend
    text = fleet_config(redis_srv.url(), unique_prefix(), [source_yaml("a", "chat", up.url, SRC)],
                        **DEFAULTS)
    text += tracing_yaml(quiet_tracing())
    sc = make_sidecar(config_text=text, env=dict(os.environ, no_proxy="*", NO_PROXY="*"))
    wait_backend(sc)
    check_task_run_trace(sc, up)


def check_task_run_trace(sc, up):
    trace_id = TP.split("-")[1]
    with polygw.Client(sc.sock) as c:
        task = c.task("run-py")
        task.start(trace={"traceparent": TP % 1})
        assert c.stats()["tracing"]["spans_started"] == 1         # task.start
        task.call("chat", chat("hi"))
        st = c.stats()["tracing"]
        assert st["spans_started"] == 3, st                        # + the call and its attempt
        tp = {k.lower(): v for k, v in up.last()["headers"].items()}["traceparent"].split("-")
        assert tp[1] == trace_id and tp[3] == "01", tp             # upstream: in the run's trace
        task.node_begin("n1")
        task.node_end("n1")
        task.finish(True)
        assert c.stats()["tracing"]["spans_started"] == 5, c.stats()["tracing"]  # node, finish
        # A run under an unsampled caller records nothing, its calls neither.
        with c.task("run-quiet", trace={"traceparent": TP % 0}) as quiet:
            quiet.call("chat", chat("hi"))
        st = c.stats()["tracing"]
        assert st["spans_started"] == 5 and st["unsampled"] >= 2, st
        with pytest.raises(polygw.BadRequestError, match="traceparent must be a string"):
            c.task("run-bad").start(trace={"traceparent": 5})
        with pytest.raises(polygw.BadRequestError):
            c.request("task.start", {"task_id": "run-bad", "trace": "not a map"})


def upstream_headers(up):
    return {k.lower(): v for k, v in up.last()["headers"].items()}


def test_unsampled_call_still_passes_its_trace_on(make_sidecar, up):
    # Nothing recorded (ratio 0, or a caller that did not sample), yet each
    # attempt sends a traceparent: the caller's trace id (or a new one), a
    # span id of its own, not sampled; the caller's random flag (0x02) kept.
    sc = make_sidecar(config_text=config(up, quiet_tracing()))
    trace_id, parent_id = TP.split("-")[1:3]
    with polygw.Client(sc.sock) as c:
        seen = set()
        for flags in (0, 2):
            for _ in range(2):
                c.call("chat", chat("hi"), trace={"traceparent": TP % flags})
                tp = upstream_headers(up)["traceparent"].split("-")
                assert tp[:2] == ["00", trace_id] and tp[3] == "0%d" % flags, tp
                assert len(tp[2]) == 16 and tp[2] not in (parent_id, "0" * 16), tp
                seen.add(tp[2])
        assert len(seen) == 4
        c.call("chat", chat("hi"))  # a root the sampler leaves out
        tp = upstream_headers(up)["traceparent"].split("-")
        assert tp[0] == "00" and tp[1] != trace_id and len(tp[1]) == 32 and tp[3] == "00", tp
        st = c.stats()["tracing"]
        assert st["spans_started"] == 0 and st["unsampled"] == 5, st


def test_tracing_off_sends_no_traceparent(make_sidecar, up):
    sc = make_sidecar(config_text=config(up, {"enabled": "false"}))
    with polygw.Client(sc.sock) as c:
        c.call("chat", chat("hi"), trace={"traceparent": TP % 0})
        assert "traceparent" not in upstream_headers(up)


@pytest.mark.parametrize("client", ["auto", "libcurl"])
@pytest.mark.parametrize("flags", [0, 1])
def test_tracestate_goes_upstream(make_sidecar, up, flags, client):
    # Recorded or not, each attempt passes the caller's tracestate on (both
    # HTTP clients: a line of its own after the traceparent).
    text = config(up, dict(quiet_tracing(), sampler_ratio=1))
    text = text.replace("server:\n", "server:\n  upstream_client: %s\n" % client, 1)
    sc = make_sidecar(config_text=text)
    with polygw.Client(sc.sock) as c:
        c.call("chat", chat("hi"), trace={"traceparent": TP % flags, "tracestate": "k=v,x=y"})
        h = upstream_headers(up)
        assert h["tracestate"] == "k=v,x=y", h
        assert h["traceparent"].endswith("-0%d" % flags), h
        c.call("chat", chat("hi"), trace={"traceparent": TP % flags})
        assert "tracestate" not in upstream_headers(up)


def test_unsampled_task_run_passes_its_context_on(make_sidecar, up):
    sc = make_sidecar(config_text=config(up, quiet_tracing()))
    with polygw.Client(sc.sock) as c:
        with c.task("run-q", trace={"traceparent": TP % 2, "tracestate": "t=1"}) as run:
            run.call("chat", chat("hi"))
        h = upstream_headers(up)
        tp = h["traceparent"].split("-")
        assert tp[1] == TP.split("-")[1] and tp[3] == "02", h
        assert h["tracestate"] == "t=1", h
        assert c.stats()["tracing"]["spans_started"] == 0


@pytest.mark.parametrize("var,value", [("OTEL_SDK_DISABLED", "True"),
                                       ("OTEL_TRACES_EXPORTER", "none")])
def test_environment_turns_tracing_off(make_sidecar, up, var, value):
    env = dict(os.environ, OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
    env[var] = value
    sc = make_sidecar(config_text=config(up, quiet_tracing()), env=env)
    with polygw.Client(sc.sock) as c:
        c.call("chat", chat("hi"), trace={"traceparent": TP % 1})
        assert "traceparent" not in upstream_headers(up)
        assert "tracing" not in c.stats()
    assert "tracing is off: the environment turns trace export off" in sc.logs()
    assert '"variable":"%s"' % var in sc.logs()


def test_unsupported_exporter_and_protocol_are_warned_about(make_sidecar, up):
    env = dict(os.environ, OTEL_TRACES_EXPORTER="otlp,zipkin",
               OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="grpc")
    sc = make_sidecar(config_text=config(up, quiet_tracing()), env=env)
    with polygw.Client(sc.sock) as c:
        c.call("chat", chat("hi"), trace={"traceparent": TP % 1})
        assert c.stats()["tracing"]["spans_started"] == 2
    logs = sc.logs()
    assert '"variable":"OTEL_TRACES_EXPORTER","exporter":"zipkin"' in logs, logs
    assert '"variable":"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL","protocol":"grpc"' in logs, logs


def test_ratio_sampler_decides_on_the_trace_ids_last_bytes(make_sidecar, up):
    # As the OpenTelemetry SDKs decide: the trace id's last 8 bytes.
    env = dict(os.environ, OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0.5")
    tracing = dict(quiet_tracing())
    del tracing["sampler_ratio"]
    sc = make_sidecar(config_text=config(up, tracing), env=env)
    with polygw.Client(sc.sock) as c:
        for trace_id, recorded in [("ffffffffffffffff0000000000000000", True),
                                   ("0000000000000001ffffffffffffffff", False),
                                   ("7fffffffffffffffffffffffffffffff", False),
                                   ("80000000000000000000000000000001", True)]:
            before = c.stats()["tracing"]["spans_started"]
            c.call("chat", chat("hi"), trace={"traceparent": "00-%s-00f067aa0ba902b7-01" % trace_id})
            assert (c.stats()["tracing"]["spans_started"] > before) == recorded, trace_id
            flags = upstream_headers(up)["traceparent"].split("-")[3]
            assert flags == ("01" if recorded else "00"), (trace_id, flags)

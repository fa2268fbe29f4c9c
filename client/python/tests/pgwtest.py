"""Shared test helpers: the real sidecar ($POLYGW_BUILD/polygw, default build/) and the
real mock upstream, through the integration suite's own harness
(tests/integration/conftest.py's Sidecar, tests/integration/mock.py), so a
sidecar that exits non-zero or prints a sanitizer report fails the test."""
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
INTEGRATION = os.path.join(ROOT, "tests", "integration")
VECTORS = os.path.join(ROOT, "proto", "vectors")

sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.append(INTEGRATION)

from mock import MockUpstream  # noqa: E402


def _load_harness():
    spec = importlib.util.spec_from_file_location(
        "polygw_integration_harness", os.path.join(INTEGRATION, "conftest.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


harness = _load_harness()

# Every timeout of the source is generous (only the one under test fires);
# admission is wide open and each call makes one attempt, so that every
# error code is provoked directly.
SOURCE = {"timeout_s": 20, "connect_timeout_s": 5, "ttft_timeout_s": 20, "idle_timeout_s": 20,
          "max_concurrency": 64, "aimd": {"initial": 64}, "breaker": {"failures": 100000}}
DEFAULTS = {"max_attempts": 1, "stall_window_s": 20, "backoff_base_s": 0.05,
            "backoff_max_s": 0.1, "poll_interval_s": 0.05}


def _yaml(v):
    if isinstance(v, dict):
        return "{%s}" % ", ".join("%s: %s" % (k, _yaml(x)) for k, x in v.items())
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))


def config_text(up_url, defaults=None, source=None, grace=0.5):
    src = dict(SOURCE)
    src.update(source or {})
    dflt = dict(DEFAULTS)
    dflt.update(defaults or {})
    lines = ["listen:", '  mode: "0660"', "server:", "  log_level: info",
             "  shutdown_grace_s: %s" % _yaml(grace), "defaults:"]
    lines += ["  %s: %s" % (k, _yaml(v)) for k, v in dflt.items()]
    lines += ["sources:", "  - name: a", "    capability: chat", "    base_url: %s" % up_url]
    lines += ["    %s: %s" % (k, _yaml(v)) for k, v in src.items()]
    return "\n".join(lines) + "\n"


def chat(text="hello", **mock):
    """An OpenAI chat body; keyword arguments become the mock's behaviour."""
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    if mock:
        body["mock"] = mock
    return body

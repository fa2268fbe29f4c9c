"""pytest fixtures: a fresh mock upstream and sidecar per test (see pgwtest.py)."""
import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pgwtest import MockUpstream, config_text, harness  # noqa: E402


@pytest.fixture
def workdir():
    d = tempfile.mkdtemp(prefix="pgwpy", dir="/tmp")   # socket paths must stay short
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def up():
    with MockUpstream() as m:
        yield m


@pytest.fixture
def make_sidecar(workdir, up):
    """make_sidecar(defaults=..., source=..., grace=...) -> a started Sidecar
    whose one chat source is the mock. All are stopped and checked (exit 0,
    no sanitizer report) at teardown."""
    started = []

    def factory(start=True, **kw):
        sc = harness.Sidecar(workdir, config_text=config_text(up.url, **kw),
                             env={"no_proxy": "*", "NO_PROXY": "*"})
        started.append(sc)
        if start:
            sc.start()
        return sc

    yield factory
    for sc in started:
        if sc.proc is None:
            continue
        rc = sc.stop()
        if sc.proc.poll() is None:      # started again after a stop(): never leave it running
            sc.proc.kill()
            sc.proc.wait()
            raise AssertionError("a Sidecar was restarted with start() after stop(): "
                                 "use make_sidecar() for the new process")
        sc.assert_clean()
        assert rc == sc.expected_rc, "polygw exited with %s:\n%s" % (rc, sc.logs())


@pytest.fixture
def sidecar(make_sidecar):
    return make_sidecar()

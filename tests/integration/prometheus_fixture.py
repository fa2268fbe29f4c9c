"""A real Prometheus server (Debian's `prometheus` package) for tests.

Standard library only. It listens on a free loopback port, scrapes one static
target every second and keeps its data in a temporary directory that is
removed when it stops.

    from prometheus_fixture import Prometheus

    with Prometheus("127.0.0.1:8088", metrics_path="/metrics",
                    rule_files=["deploy/prometheus/polygw-rules.yml"]) as prom:
        prom.wait_for('polygw_calls_total{code="ok"}', lambda r: r and r[0][1] == 3)
        prom.query('up{job="polygw"}')   # -> [({labels}, value), ...]
        prom.rules(); prom.alerts()      # rule groups with their health, active alerts

stop() (and leaving the `with` block) sends SIGTERM, waits for a clean exit
(up to 15 s, then SIGKILL, which fails the stop) and removes the directory;
leaving the block also asserts exit code 0.
Only 127.0.0.1 is used; every wait is bounded.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

__all__ = ["Prometheus", "prometheus_binary"]

CONFIG = """\
global:
  scrape_interval: {interval}
  scrape_timeout: {interval}
  evaluation_interval: {interval}
rule_files: {rule_files}
scrape_configs:
  - job_name: {job}
    metrics_path: {path}
    scheme: http
    static_configs:
      - targets: [{target}]
"""


def prometheus_binary():
    """The prometheus server binary ($PROMETHEUS, else the one on PATH)."""
    return os.environ.get("PROMETHEUS") or shutil.which("prometheus") or "/usr/bin/prometheus"


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Prometheus:
    """One prometheus process scraping `target` ("host:port") at `metrics_path`."""

    def __init__(self, target, metrics_path="/metrics", job="polygw", scrape_interval_s=1,
                 rule_files=(), binary=None, start=True, start_timeout=30.0):
        """`rule_files`: paths of rule files to load (copied into the
        temporary directory); rules are evaluated every scrape interval."""
        self.target = target
        self.rule_files = list(rule_files)
        self.metrics_path = metrics_path
        self.job = job
        self.interval_s = scrape_interval_s
        self.binary = binary or prometheus_binary()
        self.dir = None
        self.proc = None
        self.port = None
        self.log = None
        if start:
            self.start(start_timeout)

    # ------------------------------------------------------------ lifecycle
    def start(self, timeout=30.0):
        if self.proc is not None:
            raise RuntimeError("prometheus already started")
        if not os.access(self.binary, os.X_OK):
            raise FileNotFoundError("prometheus not found: %s (tests/deps.sh installs the "
                                    "Debian package)" % self.binary)
        self.dir = tempfile.mkdtemp(prefix="pgwprom")
        rules = []
        for i, path in enumerate(self.rule_files):
            rules.append("rules-%d.yml" % i)
            shutil.copyfile(path, os.path.join(self.dir, rules[-1]))
        with open(os.path.join(self.dir, "prometheus.yml"), "w") as f:
            f.write(CONFIG.format(interval="%gs" % self.interval_s, job=json.dumps(self.job),
                                  path=json.dumps(self.metrics_path),
                                  target=json.dumps(self.target),
                                  rule_files=json.dumps(rules)))
        # The port is free when picked; another process could take it before
        # prometheus binds, so a start that fails to listen is retried.
        last = ""
        for _ in range(3):
            self.port = free_port()
            self.log = open(os.path.join(self.dir, "prometheus.log"), "ab")
            self.proc = subprocess.Popen(
                [self.binary,
                 "--config.file=" + os.path.join(self.dir, "prometheus.yml"),
                 "--storage.tsdb.path=" + os.path.join(self.dir, "data"),
                 "--web.listen-address=127.0.0.1:%d" % self.port,
                 "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                cwd=self.dir)
            if self._wait_ready(timeout):
                return self
            last = self.logs()
            self._kill()
        self._cleanup()
        raise RuntimeError("prometheus did not become ready:\n" + last)

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        return False

    def stop(self, timeout=15.0):
        """SIGTERM and wait; returns the exit code. A prometheus that needed
        SIGKILL raises AssertionError (after cleaning up)."""
        if self.proc is None:
            return None
        killed = False
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                killed = True
        rc = self.proc.returncode
        text = self.logs()
        self._cleanup()
        if killed:
            raise AssertionError("prometheus did not exit within %ss of SIGTERM:\n%s"
                                 % (timeout, text))
        return rc

    def _kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        if self.log:
            self.log.close()
            self.log = None

    def _cleanup(self):
        self._kill()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def logs(self):
        try:
            with open(os.path.join(self.dir, "prometheus.log"), "rb") as f:
                return f.read().decode("utf-8", "replace")
        except (OSError, TypeError):
            return ""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        text = self.logs()
        rc = self.stop()
        if exc_type is None:
            assert rc == 0, "prometheus exited with %s:\n%s" % (rc, text)

    # ------------------------------------------------------------ HTTP API
    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def api(self, path, **params):
        """GET /api/v1/<path>; returns `data` (raises on an API error)."""
        q = urllib.parse.urlencode(params)
        with urllib.request.urlopen("%s/api/v1/%s%s" % (self.url, path, "?" + q if q else ""),
                                    timeout=5) as r:
            doc = json.loads(r.read().decode("utf-8"))
        if doc.get("status") != "success":
            raise RuntimeError("prometheus API %s: %s" % (path, doc))
        return doc["data"]

    def query(self, expr):
        """An instant query; returns [(labels dict, float value), ...] for a
        vector (a scalar comes back as one pair with empty labels)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "vector":
            return [(r["metric"], float(r["value"][1])) for r in data["result"]]
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        raise RuntimeError("unexpected result type %s for %s" % (data["resultType"], expr))

    def rules(self):
        """The rule groups, each with its rules' health and last error."""
        return self.api("rules")["groups"]

    def alerts(self):
        """The alerts pending or firing."""
        return self.api("alerts")["alerts"]

    def targets(self):
        """The active targets with their health, last error and last scrape."""
        return self.api("targets")["activeTargets"]

    def wait_for(self, expr, predicate, timeout=15.0, interval=0.25):
        """Queries `expr` until predicate(result) holds; returns the result,
        or raises AssertionError with the last result and the targets."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            if time.monotonic() >= deadline:
                raise AssertionError("%s: %r after %ss; targets: %r"
                                     % (expr, result, timeout, self.targets()))
            time.sleep(interval)

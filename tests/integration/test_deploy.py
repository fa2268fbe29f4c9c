"""deploy/k8s/pod-sidecar.yaml and the Dockerfile, checked against what they
describe: the ConfigMap's polygw.yaml is a configuration the real daemon
accepts and serves with, the pod's probe commands (curl over the HTTP
front's socket) work against it and fail without it, the sidecar is a
native one, the Secret is mounted so that the kubelet's updates reach the
key file (which the daemon watches, test_reload.py), and the image's paths
and user are those of the Debian package."""
import json
import os
import subprocess

import yaml

from conftest import POLYGW, ROOT

POD = os.path.join(ROOT, "deploy", "k8s", "pod-sidecar.yaml")
HTTP_SOCK = "/run/polygw/http.sock"


def docs():
    with open(POD) as f:
        return {d["kind"]: d for d in yaml.safe_load_all(f) if d}


def sidecar_spec():
    pod = docs()["Pod"]["spec"]
    [sc] = [c for c in pod["initContainers"] if c["name"] == "polygw"]
    return pod, sc


def configmap_config(workdir):
    """The ConfigMap's polygw.yaml, with its key file path pointed at a test file."""
    text = docs()["ConfigMap"]["data"]["polygw.yaml"]
    cfg = yaml.safe_load(text)
    key_files = {s["api_key_file"] for s in cfg["sources"] if "api_key_file" in s}
    assert len(key_files) == 1, key_files
    key_file = key_files.pop()
    local = os.path.join(workdir, "openai")
    with open(local, "w") as f:
        f.write("sk-test-deploy\n")
    path = os.path.join(workdir, "polygw.yaml")
    with open(path, "w") as f:
        f.write(text.replace(key_file, local))
    return path, key_file, cfg


def test_deploy__pod_is_a_native_sidecar_with_the_secret_mounted_for_rotation(workdir):
    pod, sc = sidecar_spec()
    _, key_file, cfg = configmap_config(workdir)
    assert sc["restartPolicy"] == "Always"          # native sidecar
    assert "startupProbe" in sc and "livenessProbe" in sc and "readinessProbe" in sc
    assert sc["command"][:1] == ["/usr/sbin/polygw"]
    assert sc["securityContext"]["runAsUser"] == 10001
    # The Secret volume is mounted at the key file's directory, without
    # subPath (a subPath mount never sees the kubelet's updates).
    vols = {v["name"]: v for v in pod["volumes"]}
    [m] = [m for m in sc["volumeMounts"] if "secret" in vols[m["name"]]]
    assert m["mountPath"] == os.path.dirname(key_file) and "subPath" not in m
    secret = vols[m["name"]]["secret"]["secretName"]
    assert secret == docs()["Secret"]["metadata"]["name"]
    assert os.path.basename(key_file) in docs()["Secret"]["stringData"]
    # The app shares the socket directory, gets no key.
    [app] = pod["containers"]
    assert {"name": "POLYGW_SOCKET", "value": cfg["listen"]["socket"]} in app["env"]
    assert all("secret" not in vols[v["name"]] for v in app["volumeMounts"])


def probe_argv(spec, probe, http_sock):
    """The probe's command, with this test's HTTP socket."""
    cmd = spec[probe]["exec"]["command"]
    assert cmd[0] == "/usr/bin/curl" and "--unix-socket" in cmd, cmd
    return [http_sock if a == HTTP_SOCK else a for a in cmd]


def test_deploy__configmap_config_serves_and_the_probes_pass(make_sidecar, workdir):
    path, _, cfg = configmap_config(workdir)
    # The probes reach the HTTP front over its Unix socket, inside the pod:
    # no TCP listener that the pod IP would expose (see the manifest).
    assert cfg["http"] == {"socket": HTTP_SOCK}, cfg["http"]
    http_sock = os.path.join(workdir, "http.sock")
    text = open(path).read().replace(HTTP_SOCK, http_sock)
    with open(path, "w") as f:
        f.write(text)
    r = subprocess.run([POLYGW, "--check-config", path], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0 and ": ok (" in r.stdout, (r.stdout, r.stderr)
    sc = make_sidecar(config_text=text)
    _, spec = sidecar_spec()
    want = {"startupProbe": "/healthz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}
    for probe, endpoint in want.items():
        argv = probe_argv(spec, probe, http_sock)
        assert argv[-1] == "http://polygw" + endpoint and "-sf" in argv, argv
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        assert r.returncode == 0, (probe, r.stdout, r.stderr)
        assert json.loads(r.stdout)["status"] in ("ok", "ready"), (probe, r.stdout)
    # The same command fails once the sidecar is gone: the probe can fail.
    sc.stop()
    for probe in want:
        r = subprocess.run(probe_argv(spec, probe, http_sock), capture_output=True, timeout=10)
        assert r.returncode != 0, probe


def test_deploy__dockerfile_installs_the_package_and_runs_as_its_user():
    text = open(os.path.join(ROOT, "Dockerfile")).read()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    froms = [line for line in lines if line.startswith("FROM ")]
    assert froms == ["FROM debian:bookworm-slim AS build", "FROM debian:bookworm-slim"], froms
    assert "RUN dpkg-buildpackage -us -uc -b" in lines
    assert "USER 10001:10001" in lines
    assert 'ENTRYPOINT ["/usr/sbin/polygw"]' in lines
    # The probes' curl is in the image.
    [install] = [line for line in lines if "apt-get install" in line and "polygw_" in line]
    assert " curl" in install, install
    installed = open(os.path.join(ROOT, "debian", "polygw.install")).read().split()
    assert "usr/sbin/polygw" in installed and "usr/bin/polygwctl" in installed
    # The uid the pod runs polygw as is the image's.
    _, sc = sidecar_spec()
    assert sc["securityContext"]["runAsUser"] == 10001

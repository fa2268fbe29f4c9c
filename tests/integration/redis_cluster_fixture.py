"""Helpers for the Redis Cluster tests (test_redis_cluster.py): one real
cluster of 3 primaries and 3 replicas per test module (RedisCluster from
tests/redis/redis_cluster.py, imported, not copied), sidecar configs that
name it with `backend.cluster`, and the check of whether this polygw
binary has a cluster client at all.

Standard library + msgpack only. Every wait is bounded.
"""
import functools
import os
import subprocess
import tempfile

import pytest

from conftest import POLYGW, sanitizer_env
from redis_fixture import fleet_config  # noqa: F401  (puts tests/redis on the path)
from redis_cluster import ClusterError, RedisCluster, SlotMigration, slot_keys  # noqa: E402,F401
from redis_support import key_slot  # noqa: E402,F401


def cluster_backend(cluster, nodes=None, **kw):
    """The backend keys of a sidecar on `cluster`: the seed addresses (every
    node's unless `nodes`), then `kw` (command_timeout_s, lease_ttl_s, …)."""
    b = {"cluster": cluster.addresses(nodes)}
    b.update(kw)
    return b


def cluster_config(cluster, prefix, sources, backend=None, http_port=None, extra="", **defaults):
    """A sidecar config on the cluster (fleet_config's, with `cluster:` in
    place of `url:`); `http_port` adds an HTTP front on 127.0.0.1."""
    cfg = fleet_config(None, prefix, sources, backend=cluster_backend(cluster, **(backend or {})),
                       **defaults)
    if http_port:
        cfg += 'http:\n  listen: "127.0.0.1:%d"\n' % http_port
    return cfg + extra


@functools.lru_cache(maxsize=1)
def client_missing():
    """The reason this polygw cannot be pointed at a cluster (it rejects the
    key `backend.cluster` as unknown), or "" when it can."""
    if not os.path.exists(POLYGW):
        return ""   # let the tests fail on the missing binary, not skip
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write("backend:\n  kind: redis\n  cluster: [\"127.0.0.1:1\"]\n  prefix: probe\n"
                "sources:\n  - {name: a, capability: chat, base_url: \"http://127.0.0.1:1\"}\n")
    try:
        r = subprocess.run([POLYGW, "--check-config", f.name], capture_output=True, text=True,
                           timeout=20, env=sanitizer_env())
    finally:
        os.unlink(f.name)
    out = r.stdout + r.stderr
    return "this polygw has no Redis Cluster client (backend.cluster: unknown key)" \
        if "backend.cluster: unknown key" in out else ""


needs_cluster_client = pytest.mark.skipif(bool(client_missing()), reason=client_missing() or "-")


def start_cluster(password=None):
    try:
        return RedisCluster(primaries=3, replicas=1, node_timeout_ms=1000,
                            password=password).start()
    except ClusterError as e:
        if "not installed" in str(e):
            pytest.skip(str(e))
        raise

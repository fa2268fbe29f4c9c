"""Helpers for the Redis Cluster tests (test_redis_cluster.py): one real
cluster of 3 primaries and 3 replicas per test module (RedisCluster from
tests/redis/redis_cluster.py, imported, not copied), sidecar configs that
name it with `backend.cluster`.

Standard library + msgpack only. Every wait is bounded.
"""
import pytest

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


def start_cluster(password=None):
    try:
        return RedisCluster(primaries=3, replicas=1, node_timeout_ms=1000,
                            password=password).start()
    except ClusterError as e:
        if "not installed" in str(e):
            pytest.skip(str(e))
        raise

"""Argument builders for the scripts (the ARGV orders documented at the top
of each sidecar/lua/*.lua file)."""
from redis_support import source_keys, scope_key, task_key

DEFAULTS = dict(max_conc=0, lease_ttl=10000, rpm=0, rpm_win=60000, tpm=0, tpm_win=60000,
                daily=0, daily_win=86400000, failures=3, cooldown=100, max_cooldown=300)

_seq = [0]


def new_lease():
    _seq[0] += 1
    return "test:%d" % _seq[0]


def admit(s, src, est=0, lease=None, **kw):
    c = dict(DEFAULTS, **kw)
    lease = lease or new_lease()
    r = s.run("admit", source_keys(src),
              [lease, c["max_conc"], c["lease_ttl"], c["rpm"], c["rpm_win"], c["tpm"],
               c["tpm_win"], c["daily"], c["daily_win"], est])
    return r


def release(s, src, lease, verdict="success", est=0, used=-1, **kw):
    c = dict(DEFAULTS, **kw)
    return s.run("release", source_keys(src),
                 [lease, verdict, est, used, c["tpm"], c["tpm_win"], c["daily"],
                  c["daily_win"], c["failures"], c["cooldown"], c["max_cooldown"]])


def renew(s, src, ttl, *leases):
    return s.run("renew", [source_keys(src)[1]], [ttl, *leases])


def progress(s, scope, op, ttl=None):
    return s.run("progress", [scope_key(scope)], [op] + ([ttl] if ttl is not None else []))


def task(s, tid, op, ttl=86400, reason="", ok=0, channel="pgw:task-end"):
    return s.run("task", [task_key(tid)], [op, tid, ttl, reason, ok, channel])


def redis_now_ms(conn):
    sec, usec = conn.call("TIME")
    return int(sec) * 1000 + int(usec) / 1000.0


def level(conn, src, bucket):
    v = conn.call("HGET", source_keys(src)[{"rpm": 2, "tpm": 3, "daily": 4}[bucket]], "level")
    return None if v is None else float(v)

"""Argument builders for the scripts (the ARGV orders documented at the top
of each sidecar/backend/lua/*.lua file)."""
from redis_support import app_keys, io_key, source_keys, scope_key, task_key

DEFAULTS = dict(max_conc=0, lease_ttl=10000, rpm=0, rpm_win=60000, tpm=0, tpm_win=60000,
                daily=0, daily_win=86400000, failures=3, cooldown=100, max_cooldown=300)

_seq = [0]


def new_lease():
    _seq[0] += 1
    return "test:%d" % _seq[0]


APP_DEFAULTS = dict(max_conc=0, rpm=0, rpm_win=60000, tpm=0, tpm_win=60000, daily=0,
                    daily_win=86400000)


def group(app, cap=None, label=None, prefix=None, **kw):
    """An app limit group for admit/release: (keys, figures, label)."""
    keys = app_keys(app, cap) if prefix is None else app_keys(app, cap, prefix)
    return (keys, dict(APP_DEFAULTS, **kw), label or ("app_cap" if cap else "app"))


def io(holder, itpm=0, otpm=0, win=60000, label=None):
    """An io key for admit/release: the input- and output-token buckets of
    `holder` ("source:N" or "app:A"): (key, label, itpm, otpm, window)."""
    if label is None:
        label = "" if holder.startswith("source:") else "app"
    return (io_key(holder), label, itpm, otpm, win)


def admit(s, src, est=0, lease=None, groups=(), src_keys=None, ios=(), est_out=0, more=(),
          **kw):
    """`more`: further attempts, (lease, est) or with io keys (lease, est, est_out)."""
    c = dict(DEFAULTS, **kw)
    lease = lease or new_lease()
    keys, args = list(src_keys or source_keys(src)), []
    for gk, gc, label in groups:
        keys += gk
        args += [label, gc["max_conc"], gc["rpm"], gc["rpm_win"], gc["tpm"], gc["tpm_win"],
                 gc["daily"], gc["daily_win"]]
    for key, label, itpm, otpm, win in ios:
        keys.append(key)
        args += [label, itpm, otpm, win]
    if ios:
        args.append(est_out)
    for m in more:
        args += list(m)
    r = s.run("admit", keys,
              [lease, c["max_conc"], c["lease_ttl"], c["rpm"], c["rpm_win"], c["tpm"],
               c["tpm_win"], c["daily"], c["daily_win"], est] + args)
    return r


def release(s, src, lease, verdict="success", est=0, used=-1, groups=(), ios=(), est_out=0,
            used_in=-1, used_out=-1, more=(), **kw):
    """`more`: further releases, (lease, verdict, est, used) or with io keys
    (lease, verdict, est, used, est_out, used_in, used_out)."""
    c = dict(DEFAULTS, **kw)
    keys, args = list(source_keys(src)), []
    for gk, gc, _ in groups:
        keys += gk
        args += [gc["tpm"], gc["tpm_win"], gc["daily"], gc["daily_win"]]
    for key, _, itpm, otpm, win in ios:
        keys.append(key)
        args += [itpm, otpm, win]
    if ios:
        args += [est_out, used_in, used_out]
    for m in more:
        args += list(m)
    return s.run("release", keys,
                 [lease, verdict, est, used, c["tpm"], c["tpm_win"], c["daily"],
                  c["daily_win"], c["failures"], c["cooldown"], c["max_cooldown"]] + args)


def io_levels(conn, holder):
    """(in, out, ts) of a holder's io key, None for an absent field."""
    v = conn.call("HMGET", io_key(holder), "in", "out", "ts")
    return tuple(None if x is None else float(x) for x in v)


def renew(s, src, ttl, *leases):
    return s.run("renew", [source_keys(src)[1]], [ttl, *leases])


def progress(s, scope, op, ttl=None):
    return s.run("progress", [scope_key(scope)], [op] + ([ttl] if ttl is not None else []))


def task(s, tid, op, ttl=86400, reason="", ok=0, channel="pgw:task-end", app=None, admin=None):
    return s.run("task", [task_key(tid)],
                 [op, tid, ttl, reason, ok, channel] + ([app] if app is not None else []) +
                 ([admin] if admin is not None else []))


def redis_now_ms(conn):
    sec, usec = conn.call("TIME")
    return int(sec) * 1000 + int(usec) / 1000.0


def level(conn, src, bucket):
    v = conn.call("HGET", source_keys(src)[{"rpm": 2, "tpm": 3, "daily": 4}[bucket]], "level")
    return None if v is None else float(v)

/*
 * shared.h — governance state shared by a fleet of sidecars through Redis
 * (`backend: {kind: redis}`; docs/DESIGN.md §3.2, 3.5; key schema and the split
 * between shared and local state in tests/redis/README.md).
 *
 * What it adds to the local governed loop (src/gov.h):
 *
 *  - Admission is propose/confirm. The local step picks a source with the
 *    local rules (AIMD permits, pacer) and reserves it; shared_admit() then
 *    asks admit.lua (one round trip) for the fleet's verdict: breaker, the
 *    fleet-wide max_concurrency as leases, RPM/TPM/daily buckets. Admitted:
 *    the attempt runs holding a lease. Refused: gov_call_refused() gives the
 *    reservation back and the call waits until the backend's retry time (or
 *    re-polls). No answer within the command timeout: backend_unavailable.
 *  - Release: release.lua frees the lease, reconciles the token buckets and
 *    records the breaker verdict; a success also marks the scope's progress
 *    (progress.lua, sent in the same write: one more round trip in
 *    parallel, never awaited by the call). Failures of these writes are
 *    logged and counted: a lease that was not released expires by its TTL.
 *  - Leases of attempts in flight are renewed every lease_ttl_s / 3, so
 *    only a dead sidecar's permits expire.
 *  - Progress ages come from a cache kept exact by pub/sub: every mark is
 *    published; an unknown scope is fetched once (the loop waits for it
 *    only when a stall verdict depends on it); the cache is dropped when
 *    the subscription is lost, and reads fail closed until it is back.
 *  - Task operations and the task-end channel (used by tasks.c).
 */
#ifndef POLYGW_SHARED_H
#define POLYGW_SHARED_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>

#include "gov.h"
#include "outcome.h"
#include "internal.h"

struct rds;
struct shared;
struct shared_lease;
struct shared_admit;

/* Creates srv->shared when cfg->backend is redis (starts connecting in the
 * background); a no-op returning 0 otherwise. -1 with `err` on a bad URL or
 * out of memory. */
int shared_init(struct server *srv, char *err, size_t errlen);
void shared_fini(struct server *srv);

/* The progress backend for gov_init. */
const struct gov_backend *shared_gov_backend(struct shared *sh);

/* Admission. `cb` runs once, later: rc 1 admitted (`lease` is the caller's
 * until shared_release), 0 refused (`retry_at` in loop time, NAN when no
 * time is known; `why` is the first failing check), -1 the backend could
 * not answer (`why`). Returns NULL when the request cannot even be sent
 * (not connected): the caller fails closed at once. */
typedef void shared_admit_cb(void *ud, int rc, struct shared_lease *lease, double retry_at,
                             const char *why);
struct shared_admit *shared_admit(struct shared *sh, size_t source, double est_tokens,
                                  shared_admit_cb *cb, void *ud);
/* The caller is gone before the answer: `cb` will not run, and a lease
 * granted meanwhile is released at once. */
void shared_admit_detach(struct shared_admit *a);

/* Ends the lease's attempt (frees `lease`) with the breaker verdict of its
 * outcome `o` (NULL: none — the attempt was cancelled or never ran) and the
 * real token usage (< 0 unknown). */
void shared_release(struct shared *sh, struct shared_lease *lease, const struct outcome *o,
                    double used_tokens);

/* Task operations (task.lua): op is start, stop, watchdog, finish, guard or
 * get. `cb` gets the reply array {code, state, kind, reason, runs,
 * started_at_ms, ended_at_ms} or NULL with an error. Returns -1 when it
 * cannot be sent (then cb never runs). */
typedef void shared_task_cb(const redisReply *reply, const char *err, void *ud);
int shared_task(struct shared *sh, const char *op, const char *id, const char *reason, bool ok,
                shared_task_cb *cb, void *ud);
/* Redis milliseconds -> Unix seconds as this host sees them (Redis' clock
 * and the host's are assumed close; used only for display). */
double shared_unix_s(long long ms);

/* A task update could not be sent: re-read every running task held here
 * once the backend is back (now, if it is). */
void shared_request_resync(struct shared *sh);
/* A task update failed while the connections may be up: retry the
 * watchdog verdicts (and, with `resync`, the resync) in a second, and at
 * the latest when the connections come back. */
void shared_retry_later(struct shared *sh, bool resync);
/* shared_fini has begun: start no new Redis work. */
bool shared_closing(const struct shared *sh);
/* Connected to Redis (what READY=1 waits for). */
bool shared_is_up(const struct shared *sh);

/* For metrics: the Redis adapter, and source `source`'s fleet breaker as
 * last seen ("closed", "open", "half_open"). Borrowed, valid until
 * shared_fini. */
const struct rds *shared_rds(const struct shared *sh);
const char *shared_breaker_state(const struct shared *sh, size_t source);
/* For metrics: fleet admissions admitted, refused (any check) and
 * failed (no verdict: an error or no answer in time); writes (release,
 * progress, renewal) that failed; leases found expired. */
struct shared_counts {
    uint64_t admitted, refused, admit_errors, write_errors, leases_lost;
};
void shared_get_counts(const struct shared *sh, struct shared_counts *out);

/* The `backend` map of `stats`. */
void shared_pack_stats(struct shared *sh, msgpack_packer *pk);

#endif /* POLYGW_SHARED_H */

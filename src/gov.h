/*
 * gov.h — the governance core: sources with their admission state, and the
 * governed loop of one call as an explicit state machine (docs/DESIGN.md §3.1,
 * 3.2, 3.4). No I/O and no clock reads: every input carries `now`
 * (seconds, monotonic), every random draw comes from the injected source,
 * and every output says what the caller must do next and when.
 *
 * The loop of one call, driven by the sidecar:
 *
 *     gov_call_init ──> gov_call_step ──┬─ GOV_ATTEMPT(source) ─> run it ─> gov_call_on_outcome
 *                          ^            ├─ GOV_WAIT(wake_at) ──> sleep until wake_at or on_wake
 *                          │            └─ GOV_DONE(result)
 *                          └──────────── (after a WAIT, or a backoff WAIT from on_outcome)
 *
 *   call states:  IDLE ──step──> WAITING ──step──> ATTEMPTING ──outcome──> BACKOFF ──step──> …
 *                                                     └──────────────────> DONE
 *
 * Budgets (docs/DESIGN.md §3.1): `fails` counts attempts that consumed the retry
 * budget (transient failures; 429s too when the capability is not
 * exempt); the stall clock charges everything that is not a real attempt,
 * and the whole of an exempt 429 attempt, to the stall budget. The stall
 * verdict is checked at the top of every step:
 *     stalled_s > stall_window_s  AND  progress_age(scope) > stall_window_s
 * with progress_age = +INF for a scope that never succeeded.
 *
 * Retry-After: a hint holds back the source that sent it, for this call
 * only, until the hinted time (the call tries another source meanwhile).
 * It lengthens a backoff at most up to the stall verdict time; and when
 * every source of the capability is held back past the time the verdict
 * would land without new progress, and the scope shows none within the
 * window (progress age > stall_window_s), the call ends `stalled` at once
 * with retry_after_s = the earliest hinted time: no attempt could happen
 * before its verdict. A recent progress keeps it waiting, as always, but
 * never past the verdict time that progress allows nor the hint.
 *
 * Waiting (3.4): a call that finds nothing runnable joins its capability's
 * FIFO and sleeps until the earliest known availability (breaker half-open,
 * bucket refill, pacer), its stall verdict or its deadline. A released
 * permit wakes the first waiter not already woken that may use its source
 * (gov_call_set_sources), through the on_wake hook (so two releases before
 * any waiter ran wake two of them); a woken waiter that leaves the queue
 * without using its wake-up (cancelled, deadline, stall verdict) hands it
 * on to the next one that may use that source.
 *
 * Fair queueing across apps (start-time fair queueing): a call entering a
 * wait queue gets a start tag max(V, F[app]) and moves its app's finish
 * tag F[app] to start + 1 / weight[app]; V is the start tag of the last
 * waiter admitted from that queue. The queue is kept in tag order (ties in
 * arrival order), so the wake-up rules above apply unchanged: within an app
 * calls stay FIFO; apps that all keep calls waiting are admitted in
 * proportion to their weights; and an app arriving with one call is served
 * right after the waiters tagged before V, not after another app's backlog.
 * Tags only order waiters: a call's stall time is its own, as before.
 *
 * Per-app limits (gov_set_apps) come on top of the sources': an app at its
 * max_concurrency, or whose rpm/tpm/daily bucket cannot take the call,
 * waits like a call that finds no source runnable (a permit wait, or until
 * the bucket refills). A released permit skips the waiters whose app is at
 * its max_concurrency or that wait for their app's bucket, so it is never
 * lost on a call that cannot use it; an app dropping below its
 * max_concurrency wakes its own first waiter, in any capability.
 * An app's limits on one capability (gov_app_params.per_cap) hold the same
 * way on that capability's calls only, on top of the app's own: dropping
 * below that max_concurrency wakes the app's first waiter of that
 * capability.
 */
#ifndef POLYGW_GOV_H
#define POLYGW_GOV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "aimd.h"
#include "breaker.h"
#include "bucket.h"
#include "outcome.h"
#include "stallclock.h"

struct gov;
struct gov_call;

/* Random numbers in [0, 1); injected so tests can fix the jitter. */
typedef double gov_rand_fn(void *ud);

/* Hooks. None may call back into gov synchronously: on_wake must only
 * schedule a later gov_call_step (the sidecar uses a zero-delay timer). */
struct gov_hooks {
    void (*on_wake)(struct gov_call *k, void *ud);
    void (*on_breaker)(const struct gov *g, size_t source, enum breaker_state from,
                       enum breaker_state to, double now, void *ud);
    void *ud;
};

/* Static parameters of one source. `name` is borrowed for gov's lifetime. */
struct gov_source_params {
    const char *name;
    uint32_t capability;
    int32_t priority;
    double weight;
    uint32_t max_concurrency;
    double aimd_initial, aimd_min, aimd_increase, aimd_decrease;
    uint32_t breaker_failures;
    double breaker_cooldown_s, breaker_max_cooldown_s;
    uint64_t rpm, tpm, daily_tokens; /* 0 = unlimited */
    uint64_t itpm, otpm;             /* input / output tokens per window; 0 = unlimited */
    double window_s;                 /* of rpm, tpm, itpm and otpm; 0 = 60 */
    double pacer_min_interval_s;
    bool retired; /* removed by a reconfiguration: never
                                               * picked again; its attempts in flight
                                               * finish on these parameters */
};

/* Budgets of one call (the capability's policy). */
struct gov_policy {
    uint32_t max_attempts;
    double stall_window_s;
    double backoff_base_s, backoff_max_s;
    double poll_interval_s; /* shared backend: re-poll period when no retry time is known */
    bool exempt_429;
};

/* Limits of one app on one capability, on top of the app's own. */
struct gov_app_cap_params {
    uint32_t max_concurrency;        /* 0 = unlimited */
    uint64_t rpm, tpm, daily_tokens; /* 0 = unlimited */
    double window_s;                 /* of rpm and tpm; 0 = 60 */
};

/* Static parameters of one app (fair queueing and per-app limits). */
struct gov_app_params {
    double weight;                   /* > 0; else 1 */
    uint32_t max_concurrency;        /* 0 = unlimited */
    uint64_t rpm, tpm, daily_tokens; /* 0 = unlimited */
    uint64_t itpm, otpm;             /* input / output tokens per window; 0 = unlimited */
    double window_s;                 /* of rpm, tpm, itpm and otpm; 0 = 60 */
    /* NULL, or one entry per capability (n_caps of gov_init): the app's
     * limits on that capability. Borrowed during gov_set_apps only. */
    const struct gov_app_cap_params *per_cap;
};

struct gov_app_cap {
    struct gov_app_cap_params p;
    uint32_t in_flight;
    struct bucket rpm, tpm, daily;
    uint64_t limited; /* steps these limits held back */
};

struct gov_app {
    struct gov_app_params p; /* p.per_cap is NULL once set */
    uint32_t in_flight;
    struct bucket rpm, tpm, daily;
    struct bucket itpm, otpm;   /* input and output tokens (gov_call_set_io) */
    uint64_t admitted, limited; /* attempts admitted; steps its limits held back */
    double cost;                /* what its successes cost (gov_charge), valid when priced > 0 */
    uint64_t priced;            /* successes with a known cost */
    struct gov_app_cap *caps;   /* owned, n_caps of them: the capabilities at
                                 * gov_set_apps (or the last gov_apps_reconf);
                                 * NULL for the slot of unknown apps */
    size_t n_caps;
};

struct gov_source {
    struct gov_source_params p;
    uint32_t in_flight;
    struct aimd aimd;
    struct breaker breaker;
    struct bucket rpm, tpm, daily;
    struct bucket itpm, otpm; /* input and output tokens (gov_call_set_io) */
    double last_start;        /* pacer */
    double retry_after_until; /* last Retry-After hint, for estimates */
    /* Shared backend: after a refusal the source is gated until the
     * backend's retry time; then one call at a time asks (gate_until =
     * INFINITY while `gate_holder` is being admitted), so the waiters of a
     * sidecar do not all ask for the same token. 0 = no gate. */
    double gate_until;
    struct gov_call *gate_holder;
    uint64_t attempts, successes, failures, rate_limited;
    uint64_t tokens_used;   /* real usage reported by successes */
    double cost;            /* what they cost (gov_charge), valid when priced > 0 */
    uint64_t priced;        /* successes with a known cost */
    uint32_t affinity_keys; /* affinity keys placed on it (the table's entries) */
};

/* Prompt-cache affinity's placements (gov_call_set_affinity): which source
 * each (capability, key) was placed on. Bounded: at most GOV_AFFINITY_MAX
 * entries (the least recently used is dropped to make room), and an entry
 * unused for GOV_AFFINITY_IDLE_S expires (a provider's prompt cache is
 * long cold by then). Allocated at the first placement. */
#define GOV_AFFINITY_MAX    16384
#define GOV_AFFINITY_IDLE_S 3600.0
/* The bounded-load slack: a new key goes to a source holding fewer than
 * ceil((1 + GOV_AFFINITY_SLACK) * (keys + 1) * weight / total weight) of
 * the candidates' keys. 0.05 keeps n equal sources within +5 % and
 * -5 * (n - 1) % of even (within +-20 % for up to 4 of them). */
#define GOV_AFFINITY_SLACK  0.05
struct gov_affinity_entry {
    uint64_t key;         /* gov_call_set_affinity's hash */
    double used;          /* last placement or use */
    uint32_t cap;         /* capability */
    uint32_t source;      /* index into gov.sources */
    int32_t next_hash;    /* chain of its bucket, -1: end */
    int32_t newer, older; /* recency list, -1: end */
};
struct gov_affinity {
    struct gov_affinity_entry *e;      /* GOV_AFFINITY_MAX of them, or NULL */
    int32_t *bucket;                   /* GOV_AFFINITY_MAX chain heads */
    int32_t newest, oldest, free_list; /* free entries chained by next_hash */
    size_t n;
};

/* Progress reads and writes go through this interface (the memory store by
 * default; the sidecar's Redis cache when the backend is shared). A read
 * returns 0 with the age, -1 when the backend cannot answer (the call fails
 * closed with GOV_BACKEND_UNAVAILABLE), or 1 when the age is not known yet
 * (a shared backend is fetching it): the call then acts as if the scope had
 * made no progress only where that cannot end it — it never stalls on an
 * unknown age, it waits until the backend calls gov_progress_known() for
 * the scope (or GOV_PENDING_RECHECK_S, a safety net) and looks again. A failed
 * write is only counted. */
#define GOV_PENDING_RECHECK_S 0.25
struct gov_backend {
    int (*progress_mark)(void *ud, const char *scope, double now);
    int (*progress_age)(void *ud, const char *scope, double now, double *age_s);
    void *ud;
};

enum gov_result {
    GOV_OK = 0,
    GOV_STALLED,
    GOV_RETRY_EXHAUSTED,
    GOV_UPSTREAM_REJECTED,
    GOV_DEADLINE_EXCEEDED,
    GOV_BACKEND_UNAVAILABLE,
    GOV_CANCELLED,
    GOV_BUDGET_EXHAUSTED, /* only through gov_call_abandon: a budget refused it */
};

enum gov_action { GOV_ATTEMPT, GOV_WAIT, GOV_DONE };

struct gov_decision {
    enum gov_action action;
    size_t source;          /* GOV_ATTEMPT */
    double wake_at;         /* GOV_WAIT: absolute time */
    enum gov_result result; /* GOV_DONE */
    double retry_after_s;   /* GOV_DONE with an error: when the scope may serve again (>= 0) */
};

enum gov_call_state {
    GOV_CALL_IDLE,
    GOV_CALL_WAITING,
    GOV_CALL_ATTEMPTING,
    GOV_CALL_BACKOFF,
    GOV_CALL_DONE
};

/* What the call learned about one source, for the error's `sources` list. */
struct gov_source_note {
    uint16_t attempts;
    uint8_t reason; /* enum outcome_reason of the last attempt */
    bool tried;
    int status;
    double retry_at; /* its last Retry-After for this call (absolute; 0 = none) */
    bool excluded;   /* gov_call_set_sources left it out of the call's subset */
};

struct gov_call {
    struct gov *gov;
    uint32_t capability;
    char *scope; /* owned */
    struct gov_policy pol;
    double deadline_at; /* 0 = none */
    double est_tokens;
    double est_in, est_out; /* its input and output tokens, for itpm / otpm */
    struct stall_clock clock;
    enum gov_call_state state;
    uint32_t fails, attempts;
    size_t source;          /* ATTEMPTING: the source in use */
    bool probe;             /* ATTEMPTING: holds the breaker's half-open probe */
    double prev_last_start; /* ATTEMPTING: the pacer's value before this pick */
    double picked_at;       /* ATTEMPTING: when this pick set the pacer */
    double wake_at;
    struct gov_source_note *notes; /* owned, one per source */
    struct gov_call *wq_prev, *wq_next;
    uint32_t app;   /* gov_call_set_app; 0 by default */
    double vstart;  /* its start tag while queued */
    bool waits_app; /* WAITING for its app's bucket to refill */
    bool holds_app; /* ATTEMPTING: counted in its app's in_flight */
    bool holds_cap; /* ... and in its app's in_flight on its capability */
    bool queued;
    bool woken;        /* on_wake fired, the call has not stepped since */
    bool waits_permit; /* WAITING for a permit release (not for a time) */
    bool waits_age;    /* WAITING for its scope's progress age to be known */
    bool subset;       /* gov_call_set_sources restricted its sources */
    uint64_t affinity; /* gov_call_set_affinity's key hash; 0: none */
    size_t woken_src;  /* the source whose released permit woke it, SIZE_MAX: none
                        * (or any: an app's, a progress age's wake-up) */
    void *ud;          /* the owner's */
};

struct gov {
    struct gov_source *sources;
    size_t n_sources;
    size_t n_capabilities;
    struct gov_waitq {
        struct gov_call *head, *tail;
        size_t n;
        double vtime;       /* V: start tag of the last waiter admitted */
        double *app_finish; /* F[app], n_apps + 1 of them (owned) */
    } * waitq;
    struct gov_app *apps; /* n_apps + 1 (owned); the last: unknown apps */
    size_t n_apps;
    struct gov_backend backend;
    struct progress_store *progress; /* the memory backend, when used */
    gov_rand_fn *rand;
    void *rand_ud;
    struct gov_hooks hooks;
    uint64_t decisions, waits, wakes, backend_write_errors;
    struct gov_affinity affinity;
};

/* Sets up `g` for `n` sources (copied) over `n_caps` capabilities. A NULL
 * `backend` selects the in-memory progress store. `rand` may be NULL (a
 * fixed 0.5). Returns 0 or -1 (out of memory; nothing to fini). */
int gov_init(struct gov *g, const struct gov_source_params *srcs, size_t n, size_t n_caps,
             const struct gov_backend *backend, gov_rand_fn *rand, void *rand_ud,
             const struct gov_hooks *hooks, double now);
void gov_fini(struct gov *g);

/* Sets the parameters (copied) of apps 0 .. n - 1 for fair queueing and
 * per-app limits; an app index >= n shares one extra slot of weight 1,
 * unlimited. Without it every call is app 0, weight 1, unlimited: plain
 * FIFO. Call at set-up, with no call in flight or waiting. Returns 0 or -1
 * (out of memory; the previous apps stay). */
int gov_set_apps(struct gov *g, const struct gov_app_params *apps, size_t n, double now);

/* A reload of the apps' parameters, their number and order unchanged (an
 * app is its index), in two phases like gov_reconf: the prepare only
 * allocates (0, or -1 out of memory, -2 when n differs: nothing to abort),
 * the commit cannot fail. `apps` (and their per_cap) are borrowed until the
 * commit; `n_caps` is the number of capabilities after the reload (>= the
 * current). Each app keeps its in-flight counts and each of its buckets'
 * level at `now`, clamped to the new capacity (an unlimited bucket that
 * becomes limited starts full), on its own and per capability; the new
 * weight orders its next arrivals. A capability appended since the apps
 * were last set counts the app's attempts from the commit on. The caller
 * wakes the waiters (their limits may have been raised). */
struct gov_apps_reconf {
    const struct gov_app_params *apps; /* borrowed */
    size_t n, n_caps;
    struct gov_app_cap **caps; /* owned until commit: n arrays of n_caps */
};
int gov_apps_reconf_prepare(struct gov_apps_reconf *r, const struct gov *g,
                            const struct gov_app_params *apps, size_t n, size_t n_caps);
void gov_apps_reconf_commit(struct gov *g, struct gov_apps_reconf *r, double now);
void gov_apps_reconf_abort(struct gov_apps_reconf *r);

/* The app a call belongs to, for fair queueing; call after gov_call_init
 * and before the first step. */
void gov_call_set_app(struct gov_call *k, uint32_t app);

/* Starts a call. `scope` is copied (NULL: no progress tracking possible — the
 * caller passes the capability's name by default). Returns 0, or -1 when out
 * of memory or `capability` >= the gov's n_caps (then gov_call_fini is a
 * no-op on `k`). */
int gov_call_init(struct gov_call *k, struct gov *g, uint32_t capability, const char *scope,
                  const struct gov_policy *pol, double deadline_at, double est_tokens, double now);

/* The call's estimated input and output tokens (>= 0), which a source's
 * itpm and otpm buckets reserve before each attempt (by default: its
 * est_tokens as input, no output). Call after gov_call_init and before the
 * first step. */
void gov_call_set_io(struct gov_call *k, double est_in, double est_out);

/* The attempt the last step chose reported `in` input and `out` output
 * tokens (< 0: unknown, the estimate stands), as its source's itpm and
 * otpm count them: replaces the estimate in those buckets, and in its
 * app's. Call before
 * gov_call_on_outcome, while the call is attempting; else a no-op. */
void gov_call_on_io(struct gov_call *k, double in, double out, double now);

/* Restricts the call to the sources `use` flags (n_sources of them,
 * borrowed for the call only): a source left out is never picked for it,
 * counts neither in its waits (next availability, Retry-After holds, the
 * error's retry_after_s) nor in its stall verdict's "every source is held
 * back", and a permit released on it never wakes the call — the wake-up
 * goes to the first waiter that may use that source, and one handed on by
 * a leaving waiter goes the same way. A source added by a reload is left
 * out of a restricted call. Call after gov_call_init and before the first
 * step; without it the call may use every source of its capability. With
 * no source of its capability left in, the call waits until its stall
 * verdict: the caller checks for that before (the sidecar answers
 * model_not_found at once). */
void gov_call_set_sources(struct gov_call *k, const bool *use);

/* Prompt-cache affinity, by consistent hashing with bounded loads. The
 * candidates are the runnable sources of the tier the call would pick from
 * (the set the weighted random choice uses: runnable now, not failed by
 * this call when another is). A key placed before (struct gov_affinity)
 * whose source is a candidate stays on it. Otherwise the key is placed,
 * and remembered, on the candidate of highest weighted rendezvous score
 * weight / -ln(h(key, source name)) (h a hash in (0, 1)) among those that
 * hold fewer than ceil((1 + GOV_AFFINITY_SLACK) * (keys + 1) * weight / W)
 * keys, where keys and W are the candidates' placed keys and weights: so
 * keys spread in proportion to the weights within that bound whatever the
 * names, and a source that is not runnable (breaker, permits, buckets,
 * pacer, Retry-After) loses its keys at once to the next by the same rule;
 * they stay where they moved. `key` is copied (hashed); NULL or "": none.
 * Call after gov_call_init and before the first step. */
void gov_call_set_affinity(struct gov_call *k, const char *key);

/* Releases everything the call holds (cancelling an attempt in progress:
 * its time is accounted, its permit released, waiters woken). Idempotent. */
void gov_call_fini(struct gov_call *k, double now);

/* One iteration of the loop top: stall verdict, deadline, admission. On
 * GOV_ATTEMPT everything is reserved (permit, buckets, pacer, probe) and
 * the stall clock is attempting. Call again at wake_at or after on_wake. */
void gov_call_step(struct gov_call *k, double now, struct gov_decision *d);

/* The attempt chosen by the last step ended with `o`. `actual_tokens` is
 * the real usage (< 0 unknown) to reconcile the token buckets. The decision
 * is GOV_DONE (success: GOV_OK; or an error — GOV_CANCELLED when the reason
 * is REASON_CANCELLED, GOV_STALLED when a Retry-After makes the verdict
 * certain, see above) or GOV_WAIT (the backoff, lengthened by Retry-After up
 * to the verdict time). Reads the progress age only when a Retry-After
 * outlasts the backoff. */
void gov_call_on_outcome(struct gov_call *k, double now, const struct outcome *o,
                         double actual_tokens, struct gov_decision *d);

/* Shared admission (docs/DESIGN.md §3.2 with a shared backend): the sidecar asks the
 * backend to confirm the attempt the last step reserved, before anything is
 * sent upstream.
 *
 * gov_call_refused: the backend refused it. Everything the step reserved is
 * given back as if the source had not been picked (permit, buckets, pacer,
 * probe, the attempt counts), the time since the step is charged to the
 * stall budget, and the call waits — decision GOV_WAIT, or GOV_DONE when a
 * verdict is due — until `retry_at` plus a jitter in [0, poll_interval_s / 2)
 * (absolute; when not after `now` or not finite, no time is known and the
 * call re-polls after poll_interval_s scaled by a jitter in [0.5, 1.0)), its
 * stall verdict or its deadline.
 * The permit it gives back wakes the first waiter that waits for a permit,
 * never one that waits after a refusal: a chain of refusals cannot spin.
 *
 * With `gate`, the refusal also gates the source until that retry time:
 * then the first call to pick it asks alone, the others wait for
 * gov_call_confirmed (each admission wakes the next waiter) or a new
 * refusal (a new gate time), so a sidecar sends about one admission per
 * available token, not one per waiter. The caller gates only on refusals
 * that hold for every call (breaker, concurrency, request rate), not on
 * ones that depend on this call's size (token buckets).
 *
 * gov_call_abandon: the backend could not answer (or the call must end for
 * a reason found outside the loop): the reservation is given back the same
 * way and the call ends with `r`. */
void gov_call_refused(struct gov_call *k, double now, double retry_at, bool gate,
                      struct gov_decision *d);
/* The backend admitted the reserved attempt: the source's gate (if this
 * call held it) opens, and the next waiter may ask at once. */
void gov_call_confirmed(struct gov_call *k);
void gov_call_abandon(struct gov_call *k, double now, enum gov_result r, struct gov_decision *d);

/* The attempt the last step reserved cannot go to its source for this call
 * (the source's budget cannot cover it, docs/CONFIG.md §12a): what the
 * step reserved is given back as by gov_call_abandon, the source is left
 * out of the call from now on, as by gov_call_set_sources, and the call
 * steps again at once — it may pick another source of its capability, or
 * wait for one — or, when no source of its capability is left in, ends
 * with `r`. */
void gov_call_exclude(struct gov_call *k, double now, enum gov_result r, struct gov_decision *d);

/* The backend now knows (or failed to read) the progress age of `scope`:
 * the calls waiting for it look again (through on_wake). */
void gov_progress_known(struct gov *g, const char *scope);

/* Reconfiguration (a reload) in two phases, so that a failure changes
 * nothing: the prepare calls only allocate; the commits cannot fail.
 *
 *   gov_reconf_prepare(&r, g, srcs, from, n, n_caps, now)   the new sources
 *   for each live call k: gov_call_reconf_prepare(k, &r, &notes[k])
 *   ... any failure: gov_call_reconf_abort() each, gov_reconf_abort(&r)
 *   gov_reconf_commit(g, &r); for each k: gov_call_reconf_commit(k, &r, notes[k])
 *
 * New source j continues current source from[j] (from[j] < 0: a new
 * source, fresh state). A continued source keeps its runtime state under
 * the new parameters: permits in flight, counters, pacer, breaker state
 * (thresholds updated, the current cool-down clamped into the new range),
 * AIMD limit clamped into [min, max_concurrency], and each bucket's level
 * at `now` clamped to its new capacity (a bucket that was unlimited starts
 * full; one that becomes unlimited is unlimited). Every current source in
 * flight (in_flight > 0) must be continued by some new one (a removed source
 * is continued as a `retired` one): the caller guarantees it, and
 * gov_reconf_prepare returns -2 otherwise. n_caps must be >= the current
 * number of capabilities (capabilities are only appended). Returns 0, -1
 * out of memory, -2 bad arguments. */
struct gov_reconf {
    struct gov_source *sources; /* owned until commit */
    size_t n;
    struct gov_waitq *waitq; /* owned until commit; NULL when n_caps is unchanged */
    size_t n_caps;
    long *to; /* owned: current index -> new index, or -1 */
    size_t n_old;
};
int gov_reconf_prepare(struct gov_reconf *r, const struct gov *g,
                       const struct gov_source_params *srcs, const long *from, size_t n,
                       size_t n_caps, double now);
void gov_reconf_commit(struct gov *g, struct gov_reconf *r);
void gov_reconf_abort(struct gov_reconf *r);
/* The call's per-source notes in the new order (`*notes` returns owned). */
int gov_call_reconf_prepare(const struct gov_call *k, const struct gov_reconf *r,
                            struct gov_source_note **notes);
/* Takes `notes`; remaps the source the call is attempting. Call it after
 * gov_reconf_commit and before gov_reconf_finish. */
void gov_call_reconf_commit(struct gov_call *k, const struct gov_reconf *r,
                            struct gov_source_note *notes);
/* Frees what the commit left (the index map). */
void gov_reconf_finish(struct gov_reconf *r);

/* A success on `source` for app `app` (gov_call_set_app's index) cost
 * `cost` (>= 0, finite; the caller skips an unknown one): summed per
 * source and per app, for `stats`. */
void gov_charge(struct gov *g, size_t source, uint32_t app, double cost);

/* Current stalled seconds of the call. */
double gov_call_stalled_s(const struct gov_call *k, double now);

/* Backoff before retry n (n >= 1): min(max, base * 2^(n-1)) scaled by a
 * jitter factor in [0.5, 1.0) drawn from `r` in [0, 1). */
double gov_backoff_s(const struct gov_policy *pol, uint32_t n, double r);

/* Is source i runnable for a request of `cost` tokens now? When not,
 * *available_at gets the earliest known time it could be (INFINITY when it
 * waits for a permit release). Exposed for stats and benchmarks. */
bool gov_source_runnable(struct gov *g, size_t i, double cost, double now, double *available_at);

const char *gov_result_name(enum gov_result r);
const char *gov_call_state_name(enum gov_call_state s);

#endif /* POLYGW_GOV_H */

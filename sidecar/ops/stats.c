/*
 * stats.c — the `stats` result (stats.h), written once for both fronts.
 */
#include "stats.h"

#include "backend/backend.h"
#include "call/tasks.h"
#include "codec/figures.h"
#include "metrics/figures.h"
#include "progress.h"

/* What the top-level figures read: the server and who asks. */
struct stats_obj {
    struct server *srv;
    const struct stats_caller *who;
};

#define SO(obj) ((const struct stats_obj *)(obj))

/* ---- the caller's identity -------------------------------------------- */

#define WHO(obj) ((const struct stats_caller *)(obj))

static struct fig_val who_app(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .s = WHO(obj)->app->name };
}

static struct fig_val who_peer_app(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .s = WHO(obj)->peer_app };
}

static struct fig_val who_admin(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .b = WHO(obj)->app->admin };
}

/* The peer's credentials; none when they are unknown (HTTP, TCP). */
static struct fig_val peer_id(const void *obj, int which)
{
    const struct peer *p = WHO(obj)->peer;

    if (!p || !p->known)
        return (struct fig_val){ .nil = true };
    return (struct fig_val){ .u = which == 0 ? p->uid : which == 1 ? p->gid : (uint64_t)p->pid };
}

static struct fig_val who_uid(const void *obj, size_t row)
{
    (void)row;
    return peer_id(obj, 0);
}

static struct fig_val who_gid(const void *obj, size_t row)
{
    (void)row;
    return peer_id(obj, 1);
}

static struct fig_val who_pid(const void *obj, size_t row)
{
    (void)row;
    return peer_id(obj, 2);
}

static const struct figure identity[] = {
    { .key = "app", .kind = FIG_STR, .get = who_app },
    { .key = "peer_app", .kind = FIG_STR, .get = who_peer_app },
    { .key = "admin", .kind = FIG_BOOL, .get = who_admin },
    { .key = "uid", .get = who_uid },
    { .key = "gid", .get = who_gid },
    { .key = "pid", .get = who_pid },
};
static const struct fig_table identity_table = FIG_TABLE(identity);

void stats_write_identity(struct writer *w, const struct stats_caller *who)
{
    figs_write_map(w, &identity_table, who, 0);
}

/* ---- the top level ---------------------------------------------------- */

static struct fig_val version(const void *obj, size_t row)
{
    (void)obj;
    (void)row;
    return (struct fig_val){ .s = PGW_VERSION };
}

static struct fig_val uptime(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .d = server_uptime_s(SO(obj)->srv) };
}

static void write_caller(struct writer *w, const void *obj, size_t row)
{
    (void)row;
    stats_write_identity(w, SO(obj)->who);
}

/* `apps`: each app's admission figures from the governance core; only the
 * caller's own unless it is admin. Sources are shared infrastructure: every
 * caller sees them (`sources`), as it sees the limits that hold its calls. */
static bool app_visible(const struct server *srv, const struct config_app *me, size_t i)
{
    return me->admin || &srv->cfg->apps[i] == me;
}

static void write_apps(struct writer *w, const void *obj, size_t row)
{
    struct server *srv = SO(obj)->srv;
    const struct config_app *me = SO(obj)->who->app;
    size_t n = 0, n_apps = srv->gov.apps ? srv->gov.n_apps : 0;
    (void)row;

    if (n_apps > srv->cfg->n_apps)
        n_apps = srv->cfg->n_apps;
    for (size_t i = 0; i < n_apps; i++)
        n += app_visible(srv, me, i);
    writer_array(w, (uint32_t)n);
    for (size_t i = 0; i < n_apps; i++)
        if (app_visible(srv, me, i))
            figs_write_map(w, &figs_app, srv, i);
}

static void write_sources(struct writer *w, const void *obj, size_t row)
{
    struct server *srv = SO(obj)->srv;
    (void)row;

    writer_array(w, (uint32_t)srv->gov.n_sources);
    for (size_t i = 0; i < srv->gov.n_sources; i++)
        figs_write_map(w, &figs_source, srv, i);
}

struct scope_iter {
    struct writer *w;
    double now;
};

static struct fig_val scope_age(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .d = *(const double *)obj };
}

static const struct figure scope[] = {
    { .key = "progress_age_s", .kind = FIG_DOUBLE, .get = scope_age },
};
static const struct fig_table scope_table = FIG_TABLE(scope);

static void pack_scope(const char *name, double last_at, void *ud)
{
    struct scope_iter *it = ud;
    double age = it->now - last_at;
    writer_text(it->w, name);
    figs_write_map(it->w, &scope_table, &age, 0);
}

/* `scopes`: the progress age of each scope; one that never succeeded is
 * absent (its progress age is +inf). */
static void write_scopes(struct writer *w, const void *obj, size_t row)
{
    const struct gov *g = &SO(obj)->srv->gov;
    struct scope_iter it = { w, ev_now(SO(obj)->srv->loop) };
    (void)row;

    writer_map(w, g->progress ? progress_count(g->progress) : 0);
    if (g->progress)
        progress_foreach(g->progress, pack_scope, &it);
}

static struct fig_val calls_waiting(const void *obj, size_t row)
{
    const struct gov *g = &SO(obj)->srv->gov;
    uint64_t waiting = 0;
    (void)row;

    for (size_t i = 0; i < g->n_capabilities; i++)
        waiting += g->waitq[i].n;
    return (struct fig_val){ .u = waiting };
}

static void write_tasks(struct writer *w, const void *obj, size_t row)
{
    (void)row;
    tasks_write_stats(w, SO(obj)->srv, SO(obj)->who->app); /* `tasks` and its value */
}

/* Before the server's figures (metrics/figures.h)... */
static const struct figure head[] = {
    { .key = "version", .kind = FIG_STR, .get = version },
    { .key = "uptime_s", .kind = FIG_DOUBLE, .get = uptime },
    { .key = "caller", .kind = FIG_CUSTOM, .write = write_caller },
    { .key = "apps", .kind = FIG_CUSTOM, .write = write_apps },
};
static const struct fig_table head_table = FIG_TABLE(head);

/* ... after them, then the backend's (backend.h). */
static const struct figure tail[] = {
    { .key = "sources", .kind = FIG_CUSTOM, .write = write_sources },
    { .key = "scopes", .kind = FIG_CUSTOM, .write = write_scopes },
    { .key = "calls_waiting", .get = calls_waiting },
    { .key = "tasks", .kind = FIG_CUSTOM, .flags = FIG_OWN_KEY, .write = write_tasks },
};
static const struct fig_table tail_table = FIG_TABLE(tail);

void stats_write(struct writer *w, struct server *srv, const struct stats_caller *who)
{
    const struct stats_obj so = { srv, who };
    const struct fig_part parts[] = {
        { &head_table, &so },
        { &figs_server, srv },
        { &tail_table, &so },
        { srv->backend->ops->figures, srv->backend },
    };

    figs_write_parts(w, parts, sizeof(parts) / sizeof(parts[0]));
}

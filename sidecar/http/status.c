/*
 * status.c — the status page's data and access rule (see status.h).
 */
#include "status.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "core/server.h"
#include "codec/writer.h"
#include "core/models.h"
#include "ops/stats.h"

bool status_peer_allowed(const struct config *cfg, int fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);

    if (cfg->http_allow_status_remote)
        return true;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) < 0)
        return false;
    if (ss.ss_family == AF_UNIX)
        return true;
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&ss;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (ss.ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)&ss)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

int status_stats_json(struct server *srv, const struct config_app *app, struct strbuf *out,
                      char *why, size_t whylen)
{
    const struct stats_caller who = { app, app->name, NULL };
    size_t len = out->len;
    struct writer w;

    writer_init_json(&w, out);
    stats_write(&w, srv, &who);
    srv->stats.requests_served++; /* as methods_write_stats counted it */
    if (w.err == 0 && w.depth == 0)
        return 0;
    out->len = len;
    snprintf(why, whylen, "%s",
             w.err == WRITER_ENOMEM ? "out of memory" : "a value JSON cannot hold");
    return -1;
}

/* Public name k of source `s` (models.h): its model, then its serves
 * entries that are not globs; NULL past the last. */
static const char *public_name(const struct config_source *s, size_t k)
{
    if (s->model && k-- == 0)
        return s->model;
    for (size_t i = 0; i < s->n_serves; i++)
        if (!models_is_glob(s->serves[i]) && k-- == 0)
            return s->serves[i];
    return NULL;
}

/* Is `name`, source i's public name k, listed for app `a` here (the first
 * such name in config order, not retired, allowed for the app)? */
static bool name_first(const struct config *cfg, const struct config_app *a, size_t i, size_t k)
{
    const char *m = public_name(&cfg->sources[i], k);

    if (cfg->sources[i].retired || !models_app_allows(a, m, strlen(m)))
        return false;
    for (size_t j = 0; j <= i; j++) {
        if (cfg->sources[j].retired)
            continue;
        for (size_t x = 0; public_name(&cfg->sources[j], x) && (j < i || x < k); x++)
            if (strcmp(public_name(&cfg->sources[j], x), m) == 0)
                return false;
    }
    return true;
}

int status_models_json(const struct config *cfg, const struct config_app *app, struct strbuf *out)
{
    size_t len = out->len;
    uint32_t n = 0;
    struct writer w;

    for (size_t i = 0; i < cfg->n_sources; i++)
        for (size_t k = 0; public_name(&cfg->sources[i], k); k++)
            n += name_first(cfg, app, i, k);
    writer_init_json(&w, out);
    writer_map(&w, 2);
    writer_kv_str(&w, "object", "list");
    writer_str(&w, "data");
    writer_array(&w, n);
    for (size_t i = 0; i < cfg->n_sources; i++) {
        const struct config_source *s = &cfg->sources[i];
        for (size_t k = 0; public_name(s, k); k++) {
            if (!name_first(cfg, app, i, k))
                continue;
            writer_map(&w, 5);
            writer_kv_str(&w, "id", public_name(s, k));
            writer_kv_str(&w, "object", "model");
            writer_kv_u64(&w, "created", 0);
            writer_kv_str(&w, "owned_by", s->name);
            writer_kv_str(&w, "capability", s->capability);
        }
    }
    if (w.err == 0 && w.depth == 0)
        return 0;
    out->len = len;
    return -1;
}

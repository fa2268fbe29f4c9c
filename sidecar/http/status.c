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
#include "ops/stats.h"
#include "rpc.h"
#include "codec/transcode.h"
#include "core/models.h"

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
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_unpacked up;
    uint32_t n = 0;
    int rc = -1;

    for (size_t i = 0; i < cfg->n_sources; i++)
        for (size_t k = 0; public_name(&cfg->sources[i], k); k++)
            n += name_first(cfg, app, i, k);
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    rpc_pack_kv_str(&pk, "object", "list");
    rpc_pack_str(&pk, "data");
    msgpack_pack_array(&pk, n);
    for (size_t i = 0; i < cfg->n_sources; i++) {
        const struct config_source *s = &cfg->sources[i];
        for (size_t k = 0; public_name(s, k); k++) {
            if (!name_first(cfg, app, i, k))
                continue;
            msgpack_pack_map(&pk, 5);
            rpc_pack_kv_str(&pk, "id", public_name(s, k));
            rpc_pack_kv_str(&pk, "object", "model");
            rpc_pack_kv_u64(&pk, "created", 0);
            rpc_pack_kv_str(&pk, "owned_by", s->name);
            rpc_pack_kv_str(&pk, "capability", s->capability);
        }
    }
    msgpack_unpacked_init(&up);
    if (msgpack_unpack_next(&up, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS &&
        transcode_msgpack_to_json(&up.data, out, NULL, NULL, NULL, 0) == 0)
        rc = 0;
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

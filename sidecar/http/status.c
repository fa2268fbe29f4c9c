/*
 * status.c — the status page's data and access rule (see status.h).
 */
#include "status.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "internal.h"
#include "codec/transcode.h"

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
    methods_write_stats(&w, srv, &who);
    srv->stats.requests_served++; /* as methods_write_stats counted it */
    if (w.err == 0 && w.depth == 0)
        return 0;
    out->len = len;
    snprintf(why, whylen, "%s",
             w.err == WRITER_ENOMEM ? "out of memory" : "a value JSON cannot hold");
    return -1;
}

/* Is source i the first one (not retired) that sets its model? */
static bool model_first(const struct config *cfg, size_t i)
{
    const char *m = cfg->sources[i].model;

    if (!m || cfg->sources[i].retired)
        return false;
    for (size_t j = 0; j < i; j++)
        if (cfg->sources[j].model && !cfg->sources[j].retired &&
            strcmp(cfg->sources[j].model, m) == 0)
            return false;
    return true;
}

int status_models_json(const struct config *cfg, struct strbuf *out)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_unpacked up;
    uint32_t n = 0;
    int rc = -1;

    for (size_t i = 0; i < cfg->n_sources; i++)
        n += model_first(cfg, i);
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    rpc_pack_kv_str(&pk, "object", "list");
    rpc_pack_str(&pk, "data");
    msgpack_pack_array(&pk, n);
    for (size_t i = 0; i < cfg->n_sources; i++) {
        const struct config_source *s = &cfg->sources[i];
        if (!model_first(cfg, i))
            continue;
        msgpack_pack_map(&pk, 5);
        rpc_pack_kv_str(&pk, "id", s->model);
        rpc_pack_kv_str(&pk, "object", "model");
        rpc_pack_kv_u64(&pk, "created", 0);
        rpc_pack_kv_str(&pk, "owned_by", s->name);
        rpc_pack_kv_str(&pk, "capability", s->capability);
    }
    msgpack_unpacked_init(&up);
    if (msgpack_unpack_next(&up, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS &&
        transcode_msgpack_to_json(&up.data, out, NULL, NULL, NULL, 0) == 0)
        rc = 0;
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

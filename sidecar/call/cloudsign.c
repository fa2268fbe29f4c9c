/*
 * cloudsign.c — cloud credentials as attempt header lines (cloudsign.h).
 */
#include "cloudsign.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strbuf.h"
#include "upstream/cloudauth.h"
#include "upstream/sigv4.h"

/* The lines that sign one attempt of a `kind: bedrock` source:
 * "Authorization: ...\r\nX-Amz-Date: ...\r\n" and, with a session token,
 * "X-Amz-Security-Token: ...\r\n", for `url` (upath.h) and the
 * body at `now`. Malloc'd; NULL when out of memory. */
static char *cloudsign_aws(const struct config_source *src, const struct sigv4_creds *creds,
                           const char *url, const void *body, size_t body_len, time_t now)
{
    /* url is scheme://host[:port]/path[?query], as upath_url made it. */
    const char *h = strstr(url, "://");
    h = h ? h + 3 : url;
    const char *path = strchr(h, '/');
    if (!path)
        path = h + strlen(h);
    char host[256], pbuf[1024];
    size_t hn = (size_t)(path - h);
    const char *q = strchr(path, '?');
    size_t pn = q ? (size_t)(q - path) : strlen(path);
    if (hn >= sizeof(host) || pn >= sizeof(pbuf))
        return NULL;
    memcpy(host, h, hn);
    host[hn] = '\0';
    /* The default port is not part of the Host header curl and the own
     * client send. */
    size_t hl = strlen(host);
    if (strncmp(url, "https://", 8) == 0 && hl > 4 && strcmp(host + hl - 4, ":443") == 0)
        host[hl - 4] = '\0';
    else if (strncmp(url, "http://", 7) == 0 && hl > 3 && strcmp(host + hl - 3, ":80") == 0)
        host[hl - 3] = '\0';
    memcpy(pbuf, path, pn);
    pbuf[pn] = '\0';
    struct sigv4_request r = {
        .method = "POST",
        .host = host,
        .path = pn ? pbuf : "/",
        .query = q ? q + 1 : NULL,
        .body = body,
        .body_len = body_len,
        .region = src->aws.region,
        .service = "bedrock",
        .when = now,
    };
    struct sigv4_creds c = *creds;
    struct sigv4_out out;
    strbuf_init(&out.authorization);
    char *lines = NULL;
    if (sigv4_sign(&r, &c, &out) == 0) {
        const char *tok = c.session_token ? c.session_token : "";
        size_t n = strbuf_live(&out.authorization) + strlen(tok) + 128;
        if ((lines = malloc(n)))
            snprintf(lines, n, "Authorization: %s\r\nX-Amz-Date: %s\r\n%s%s%s",
                     strbuf_head(&out.authorization), out.amz_date,
                     *tok ? "X-Amz-Security-Token: " : "", tok, *tok ? "\r\n" : "");
    }
    strbuf_fini(&out.authorization);
    return lines;
}

int cloudsign_lines(const struct config_source *src, struct cloudauth *aws, struct cloudauth *gcp,
                    const char *url, const void *body, size_t body_len, time_t now, char **lines,
                    char *why, size_t whylen)
{
    struct sigv4_creds creds = { src->aws.access_key_id, src->aws.secret_access_key,
                                 src->aws.session_token };
    bool fetched = src->vertex.on || (src->kind == DIALECT_BEDROCK && aws_creds_fetched(&src->aws));
    /* Keys of the credentials file: the watcher's, read again when the
     * file changes; the ones loaded with the configuration without one. */
    bool watched = src->kind == DIALECT_BEDROCK && aws_creds_watched(&src->aws) && aws;
    struct cloudauth *from = src->vertex.on ? gcp : aws;

    *lines = NULL;
    if (!src->vertex.on && src->kind != DIALECT_BEDROCK)
        return 0;
    if (fetched && !from) {
        snprintf(why, whylen, "no credentials fetcher (it could not start)");
        return 1;
    }
    if ((fetched || watched) && !cloudauth_get(from, &creds, why, whylen))
        return 1;
    if (src->kind == DIALECT_BEDROCK) /* signed at each attempt: a signature holds its time */
        return (*lines = cloudsign_aws(src, &creds, url, body, body_len, now)) ? 0 : -1;
    size_t n = strlen(creds.session_token) + 32;
    if (!(*lines = malloc(n)))
        return -1;
    snprintf(*lines, n, "Authorization: Bearer %s\r\n", creds.session_token);
    return 0;
}

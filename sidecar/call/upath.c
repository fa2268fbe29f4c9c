/*
 * upath.c — the URL of one attempt (see upath.h).
 */
#include "upath.h"

#include <ctype.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/dialect.h"

bool upath_model_ok(const char *name, size_t len)
{
    if (!name || len == 0 || len > 255)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

/* Whether query `q` ("" or "?a=b&c=d") has a parameter named `name`
 * (`n` bytes). */
static bool query_has_name(const char *q, const char *name, size_t n)
{
    for (const char *p = *q ? q + 1 : q; *p;) {
        size_t len = strcspn(p, "=&");
        if (len == n && memcmp(p, name, n) == 0)
            return true;
        p += strcspn(p, "&");
        if (*p)
            p++;
    }
    return false;
}

char *upath_url(const struct config_source *src, const struct upath_call *c, char *buf, size_t cap,
                size_t *len, char *why, size_t whylen)
{
    const char *path = c->cap->path, *model = "", *method = "";
    const char *cq = src->kind == DIALECT_ANTHROPIC && c->query && c->query[0] ? c->query : NULL;
    const char *sq = src->req_query; /* "" or "?a=b&..." */
    char enc[3 * 256 + 1];

    char vpath[256];
    if (src->vertex.on) {
        /* /projects/P/locations/L/publishers/{google,anthropic}/models/M:METHOD */
        bool anth = src->kind == DIALECT_ANTHROPIC;
        snprintf(vpath, sizeof(vpath), "/projects/%s/locations/%s/publishers/%s/models/",
                 src->vertex.project, src->vertex.location, anth ? "anthropic" : "google");
        path = vpath;
        model = src->model;
        method = anth ? (c->stream ? ":streamRawPredict" : ":rawPredict")
            : strcmp(c->cap->name, "count_tokens") == 0 ? ":countTokens"
            : c->stream                                 ? ":streamGenerateContent?alt=sse"
                                                        : ":generateContent";
    } else if (src->kind == DIALECT_GEMINI) {
        model = src->model ? src->model : c->model;
        if (!model || !upath_model_ok(model, strlen(model))) {
            snprintf(why, whylen,
                     "source '%s' (kind: gemini) needs a model for its path: set its model, "
                     "or name one in the call",
                     src->name);
            return NULL;
        }
        path = "/models/";
        method = strcmp(c->cap->name, "count_tokens") == 0 ? ":countTokens"
            : c->stream                                    ? ":streamGenerateContent?alt=sse"
                                                           : ":generateContent";
    } else if (src->kind == DIALECT_BEDROCK) {
        /* /model/{id}/invoke: the id percent-encoded, as AWS's SDKs send it
         * (its ':' as %3A) and as it is signed (sigv4.h). */
        static const char hex[] = "0123456789ABCDEF";
        size_t n = strlen(src->model), o = 0;
        if (n * 3 >= sizeof(enc)) {
            snprintf(why, whylen, "source '%s': its model id is too long", src->name);
            return NULL;
        }
        for (size_t i = 0; i < n; i++) {
            unsigned char ch = (unsigned char)src->model[i];
            if (isalnum(ch) || ch == '-' || ch == '.' || ch == '_' || ch == '~') {
                enc[o++] = (char)ch;
            } else {
                enc[o++] = '%';
                enc[o++] = hex[ch >> 4];
                enc[o++] = hex[ch & 15];
            }
        }
        enc[o] = '\0';
        path = "/model/";
        model = enc;
        method = src->bedrock_converse ? (c->stream ? "/converse-stream" : "/converse")
            : c->stream                ? "/invoke-with-response-stream"
                                       : "/invoke";
    } else if (strcmp(c->cap->name, "chat") == 0 && strcmp(path, "/chat/completions") == 0) {
        /* The built-in chat path is each dialect's own (Anthropic:
         * /messages); a path set in the configuration is used as written. */
        path = dialect_get(src->kind)->chat_path;
    }
    size_t nb = strlen(src->base_url), np = strlen(path), nm = strlen(model), nf = strlen(method),
           nc = cq ? strlen(cq) + 1 : 0, ns = strlen(sq);
    size_t n = nb + np + nm + nf + ns + nc;
    char *url = n < cap ? buf : malloc(n + 1);
    if (!url) {
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    char *p = url;
    memcpy(p, src->base_url, nb);
    p += nb;
    memcpy(p, path, np);
    p += np;
    memcpy(p, model, nm);
    p += nm;
    memcpy(p, method, nf);
    p += nf;
    bool has_q = strchr(method, '?') != NULL;
    if (ns) {
        *p++ = has_q ? '&' : '?';
        memcpy(p, sq + 1, ns - 1); /* past its own '?' */
        p += ns - 1;
        has_q = true;
    }
    /* The client's parameters after the source's, less those the source
     * sets itself: a client cannot replace a configured one. */
    for (const char *q = cq; q && *q;) {
        size_t plen = strcspn(q, "&"), nlen = strcspn(q, "=&");
        if (plen > 0 && !query_has_name(sq, q, nlen)) {
            *p++ = has_q ? '&' : '?';
            memcpy(p, q, plen);
            p += plen;
            has_q = true;
        }
        q += plen;
        if (*q)
            q++;
    }
    *p = '\0';
    *len = (size_t)(p - url);
    return url;
}

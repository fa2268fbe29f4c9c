/*
 * cloudauth.c — cloud credentials fetched on the loop (cloudauth.h).
 */
#include "cloudauth.h"

#include <libxml/parser.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <libxml/tree.h>
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "codec/jscan.h"
#include "core/config.h"
#include "core/log.h"

#define REFRESH_BEFORE_S 300.0 /* fetch again this long before expiry */
#define VALID_MARGIN_S   10.0  /* credentials this close to expiry are not used */
#define BACKOFF_FIRST_S  1.0
#define BACKOFF_MAX_S    60.0
#define FETCH_TIMEOUT_S  10.0
#define TOKEN_MAX        16384   /* bytes of a token file */
#define ASSUMED_LIFE_S   3600.0  /* a bare Google access token's life (their default) */
#define FILE_POLL_S      1.0     /* a token file is looked at (a stat) this often */
#define CREDS_FILE_MAX   1048576 /* bytes of an AWS credentials file */
#define REAP_POLL_S      0.01    /* an ended token_command is waited for this often */

enum cloudauth_kind {
    CA_AWS_ROLE,
    CA_AWS_CONTAINER,
    CA_AWS_FILE, /* the shared credentials file: keys read again when it changes */
    CA_GCP_KEY,
    CA_GCP_METADATA,
    CA_GCP_COMMAND, /* token_command: a program prints the token */
    CA_GCP_FILE,    /* token_file: a file holds it */
};

/* A token_command while it runs: its pipes, read on the loop. */
struct token_run {
    pid_t pid; /* 0: none running */
    ev_io out_w, err_w;
    ev_child child_w; /* its exit, on the default loop (which reaps every child) */
    ev_timer reap_w;  /* ... else waitpid asked on a period */
    bool exited;
    int status;
    char *out; /* TOKEN_MAX + 1 bytes: standard output so far (a secret) */
    size_t out_len, err_len;
    bool too_long, timed_out;
};

struct cloudauth {
    struct ev_loop *loop;
    struct upstream *up;
    enum cloudauth_kind kind;
    struct aws_creds set; /* AWS: the settings (keys unset) */
    struct gcp_creds gcp; /* Google: the settings */
    char *key_id, *secret, *token;
    double expires_at;
    struct attempt *attempt;
    ev_timer timer;
    unsigned tries;
    char last_error[200];
    struct cloudauth_stats stats;
    struct token_run run; /* CA_GCP_COMMAND */
    struct stat seen;     /* CA_GCP_FILE, CA_AWS_FILE: the file as last read */
    bool file_seen;
};

static void wipe_free(char **p)
{
    if (*p) {
        explicit_bzero(*p, strlen(*p));
        free(*p);
        *p = NULL;
    }
}

/* ---- parsing ----------------------------------------------------------- */

/* ISO 8601 "2026-12-05T13:34:41Z" (fraction optional) -> seconds. */
static int parse_time(const char *s, double *out)
{
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    const char *end = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!end)
        return -1;
    if (*end == '.')
        end += 1 + strspn(end + 1, "0123456789");
    if (*end != 'Z' && strncmp(end, "+00:00", 6) != 0)
        return -1;
    *out = (double)timegm(&tm);
    return 0;
}

static const xmlNode *xml_find(const xmlNode *n, const char *name)
{
    for (; n; n = n->next) {
        if (n->type == XML_ELEMENT_NODE && strcmp((const char *)n->name, name) == 0)
            return n;
        const xmlNode *in = xml_find(n->children, name);
        if (in)
            return in;
    }
    return NULL;
}

static char *xml_text(const xmlNode *root, const char *name)
{
    const xmlNode *n = xml_find(root, name);
    if (!n)
        return NULL;
    xmlChar *t = xmlNodeGetContent(n);
    if (!t)
        return NULL;
    char *s = strdup((const char *)t);
    explicit_bzero(t, strlen((const char *)t));
    xmlFree(t);
    return s;
}

static int check_four(char **key_id, char **secret, char **token, const char *exp,
                      double *expires_at, char *why, size_t whylen)
{
    if (!aws_creds_value_ok(*key_id) || !aws_creds_value_ok(*secret) ||
        !aws_creds_value_ok(*token)) {
        snprintf(why, whylen, "the answer has no usable AccessKeyId, SecretAccessKey and token");
        goto fail;
    }
    if (!exp || parse_time(exp, expires_at) < 0) {
        snprintf(why, whylen, "the answer's Expiration is missing or not an ISO 8601 time");
        goto fail;
    }
    return 0;
fail:
    wipe_free(key_id);
    wipe_free(secret);
    wipe_free(token);
    return -1;
}

int cloudauth_parse_sts(const char *body, size_t len, char **key_id, char **secret, char **token,
                        double *expires_at, char *why, size_t whylen)
{
    *key_id = *secret = *token = NULL;
    if (len > INT32_MAX) {
        snprintf(why, whylen, "the STS answer is too large");
        return -1;
    }
    /* No network, no entity expansion, no DTD: the answer is data. */
    xmlDoc *doc = xmlReadMemory(body, (int)len, NULL, NULL,
                                XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    if (!doc) {
        snprintf(why, whylen, "the STS answer is not XML");
        return -1;
    }
    const xmlNode *root = xmlDocGetRootElement(doc);
    int rc = -1;
    char *code = xml_text(root, "Code");
    if (code) {
        char *msg = xml_text(root, "Message");
        snprintf(why, whylen, "STS refused: %.60s: %.100s", code, msg ? msg : "");
        free(msg);
        free(code);
    } else {
        *key_id = xml_text(root, "AccessKeyId");
        *secret = xml_text(root, "SecretAccessKey");
        *token = xml_text(root, "SessionToken");
        char *exp = xml_text(root, "Expiration");
        rc = check_four(key_id, secret, token, exp, expires_at, why, whylen);
        free(exp);
    }
    xmlFreeDoc(doc);
    return rc;
}

struct container_answer {
    struct jscan_value v[4]; /* AccessKeyId, SecretAccessKey, Token, Expiration */
};

static int container_member(void *ud, const char *key, const struct jscan_value *v)
{
    static const char *const names[4] = { "AccessKeyId", "SecretAccessKey", "Token", "Expiration" };
    struct container_answer *a = ud;
    for (int i = 0; i < 4; i++)
        if (v->type == JSCAN_STRING && strcmp(key, names[i]) == 0)
            a->v[i] = *v;
    return 0;
}

int cloudauth_parse_container(const char *body, size_t len, char **key_id, char **secret,
                              char **token, double *expires_at, char *why, size_t whylen)
{
    struct container_answer a;
    memset(&a, 0, sizeof(a));
    *key_id = *secret = *token = NULL;
    if (jscan_object(body, len, container_member, &a, NULL) != 0) {
        snprintf(why, whylen, "the container endpoint's answer is not a JSON object");
        return -1;
    }
    *key_id = jscan_strdup(&a.v[0]);
    *secret = jscan_strdup(&a.v[1]);
    *token = jscan_strdup(&a.v[2]);
    char *exp = jscan_strdup(&a.v[3]);
    int rc = check_four(key_id, secret, token, exp, expires_at, why, whylen);
    free(exp);
    return rc;
}

struct oauth_answer {
    struct jscan_value token, expires_in;
};

static int oauth_member(void *ud, const char *key, const struct jscan_value *v)
{
    struct oauth_answer *a = ud;
    if (v->type == JSCAN_STRING && strcmp(key, "access_token") == 0)
        a->token = *v;
    else if (v->type == JSCAN_NUMBER && strcmp(key, "expires_in") == 0)
        a->expires_in = *v;
    return 0;
}

int cloudauth_parse_oauth(const char *body, size_t len, double now, char **token,
                          double *expires_at, char *why, size_t whylen)
{
    struct oauth_answer a;
    double in = 0;
    memset(&a, 0, sizeof(a));
    *token = NULL;
    if (jscan_object(body, len, oauth_member, &a, NULL) != 0) {
        snprintf(why, whylen, "the token answer is not a JSON object");
        return -1;
    }
    *token = jscan_strdup(&a.token);
    if (!aws_creds_value_ok(*token) || !jscan_number(&a.expires_in, &in) || !(in > 0 && in < 1e7)) {
        wipe_free(token);
        snprintf(why, whylen, "the token answer has no usable access_token and expires_in");
        return -1;
    }
    *expires_at = now + in;
    return 0;
}

/* base64url without padding (RFC 7515). */
static char *b64url(const unsigned char *p, size_t n)
{
    char *out = malloc(4 * ((n + 2) / 3) + 1);
    if (!out)
        return NULL;
    int len = EVP_EncodeBlock((unsigned char *)out, p, (int)n);
    while (len > 0 && out[len - 1] == '=')
        len--;
    out[len] = '\0';
    for (char *c = out; *c; c++)
        *c = *c == '+' ? '-' : *c == '/' ? '_' : *c;
    return out;
}

#define GCP_SCOPE "https://www.googleapis.com/auth/cloud-platform"

char *cloudauth_gcp_jwt(const struct gcp_creds *g, long iat)
{
    char head[256], claims[1024];
    if (g->private_key_id && aws_creds_value_ok(g->private_key_id) &&
        strlen(g->private_key_id) < 100)
        snprintf(head, sizeof(head), "{\"alg\":\"RS256\",\"typ\":\"JWT\",\"kid\":\"%s\"}",
                 g->private_key_id);
    else
        snprintf(head, sizeof(head), "{\"alg\":\"RS256\",\"typ\":\"JWT\"}");
    /* client_email and token_uri hold no quote or backslash in a real key;
     * one that does is refused rather than escaped. */
    if (strpbrk(g->client_email, "\"\\") || strpbrk(g->token_uri, "\"\\") ||
        (size_t)snprintf(claims, sizeof(claims),
                         "{\"iss\":\"%s\",\"scope\":\"" GCP_SCOPE "\",\"aud\":\"%s\","
                         "\"iat\":%ld,\"exp\":%ld}",
                         g->client_email, g->token_uri, iat, iat + 3600) >= sizeof(claims))
        return NULL;
    char *h = b64url((const unsigned char *)head, strlen(head));
    char *c = b64url((const unsigned char *)claims, strlen(claims));
    char *jwt = NULL;
    BIO *bio = BIO_new_mem_buf(g->private_key, -1);
    EVP_PKEY *pk = bio ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (h && c && pk && md) {
        size_t in_len = strlen(h) + 1 + strlen(c), sig_len = 0;
        char *input = malloc(in_len + 1);
        unsigned char *sig = NULL;
        if (input) {
            snprintf(input, in_len + 1, "%s.%s", h, c);
            if (EVP_DigestSignInit(md, NULL, EVP_sha256(), NULL, pk) == 1 &&
                EVP_DigestSign(md, NULL, &sig_len, (const unsigned char *)input, in_len) == 1 &&
                (sig = malloc(sig_len)) &&
                EVP_DigestSign(md, sig, &sig_len, (const unsigned char *)input, in_len) == 1) {
                char *s = b64url(sig, sig_len);
                if (s && (jwt = malloc(in_len + strlen(s) + 2)))
                    snprintf(jwt, in_len + strlen(s) + 2, "%s.%s", input, s);
                free(s);
            }
            free(sig);
            free(input);
        }
    }
    EVP_MD_CTX_free(md);
    EVP_PKEY_free(pk);
    BIO_free(bio);
    free(h);
    free(c);
    return jwt;
}

/* ---- fetching ------------------------------------------------------------ */

static void role_arm(struct cloudauth *r, double in_s)
{
    ev_timer_stop(r->loop, &r->timer);
    ev_timer_set(&r->timer, in_s > 0 ? in_s : 0., 0.);
    ev_timer_start(r->loop, &r->timer);
}

static void role_failed(struct cloudauth *r, const char *why)
{
    r->stats.fetches_failed++;
    snprintf(r->last_error, sizeof(r->last_error), "%s", why);
    double wait = BACKOFF_FIRST_S * (double)(1u << (r->tries < 6 ? r->tries : 6));
    if (wait > BACKOFF_MAX_S)
        wait = BACKOFF_MAX_S;
    r->tries++;
    log_at(LOG_WARN,
           r->kind <= CA_AWS_FILE ? "aws credentials fetch failed"
                                  : "google cloud token fetch failed",
           "detail", LOG_S, why, "retry_in_s", LOG_F, wait, NULL);
    role_arm(r, wait);
}

static const char *role_peer(const struct cloudauth *r)
{
    switch (r->kind) {
    case CA_AWS_ROLE:
        return "STS";
    case CA_AWS_CONTAINER:
        return "the container endpoint";
    case CA_GCP_KEY:
        return "the service account's token_uri";
    case CA_GCP_COMMAND:
        return "token_command";
    case CA_GCP_FILE:
        return "token_file";
    case CA_AWS_FILE:
        return "the credentials file";
    default:
        return "the metadata server";
    }
}

/* New credentials (taken) valid until `exp`: kept, and the next fetch
 * scheduled before they expire (a token file is looked at on its own
 * period instead). */
static void role_got(struct cloudauth *r, char *id, char *secret, char *token, double exp)
{
    wipe_free(&r->key_id);
    wipe_free(&r->secret);
    wipe_free(&r->token);
    r->key_id = id;
    r->secret = secret;
    r->token = token;
    r->expires_at = exp;
    r->tries = 0;
    r->last_error[0] = '\0';
    r->stats.fetches_ok++;
    r->stats.expires_at = exp;
    double life = exp - ev_now(r->loop);
    double next = life - REFRESH_BEFORE_S < life / 2 ? life - REFRESH_BEFORE_S : life / 2;
    if (next < BACKOFF_FIRST_S)
        next = BACKOFF_FIRST_S;
    if (r->kind == CA_AWS_FILE) {
        log_at(LOG_INFO, "aws credentials read", "file", LOG_S, r->set.creds_file, "profile", LOG_S,
               r->set.profile, NULL);
        role_arm(r, FILE_POLL_S);
        return;
    }
    if (r->kind == CA_GCP_FILE)
        next = FILE_POLL_S;
    log_at(LOG_INFO,
           r->kind <= CA_AWS_FILE ? "aws credentials fetched" : "google cloud token fetched",
           "expires_in_s", LOG_F, life, "refresh_in_s", LOG_F, next, NULL);
    role_arm(r, next);
}

static void role_on_done(struct attempt *a, const struct attempt_result *res, void *ud)
{
    struct cloudauth *r = ud;
    char why[200], *id = NULL, *secret = NULL, *token = NULL;
    double exp = 0;
    (void)a;

    r->attempt = NULL;
    const char *body = res->body ? res->body : "";
    int rc;
    if (res->http_status == 0) {
        snprintf(why, sizeof(why), "%s: %s", role_peer(r), res->detail);
        role_failed(r, why);
        return;
    }
    if (r->kind == CA_AWS_ROLE)
        rc = cloudauth_parse_sts(body, res->body_len, &id, &secret, &token, &exp, why, sizeof(why));
    else if (r->kind == CA_AWS_CONTAINER)
        rc = cloudauth_parse_container(body, res->body_len, &id, &secret, &token, &exp, why,
                                       sizeof(why));
    else
        rc = cloudauth_parse_oauth(body, res->body_len, ev_now(r->loop), &token, &exp, why,
                                   sizeof(why));
    if (rc == 0 && (res->http_status < 200 || res->http_status > 299)) {
        snprintf(why, sizeof(why), "HTTP %d", res->http_status);
        rc = -1;
    }
    if (rc < 0) {
        char full[sizeof(why) + 48];
        snprintf(full, sizeof(full), "HTTP %d, %s", res->http_status, why);
        wipe_free(&id);
        wipe_free(&secret);
        wipe_free(&token);
        role_failed(r, full);
        return;
    }
    role_got(r, id, secret, token, exp);
}

static const struct attempt_hooks role_hooks = { NULL, role_on_done };

/* Reads a token file (rotated by the kubelet: read at each fetch). */
static char *read_token(const char *path, char *why, size_t whylen)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        snprintf(why, whylen, "cannot read the token file %s", path);
        return NULL;
    }
    char *buf = malloc(TOKEN_MAX + 1);
    size_t n = buf ? fread(buf, 1, TOKEN_MAX + 1, f) : 0;
    fclose(f);
    if (!buf || n == 0 || n > TOKEN_MAX) {
        if (buf) {
            explicit_bzero(buf, TOKEN_MAX + 1);
            free(buf);
        }
        snprintf(why, whylen, "the token file %s is empty or larger than %d bytes", path,
                 TOKEN_MAX);
        return NULL;
    }
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
        n--;
    buf[n] = '\0';
    return buf;
}

/* Appends name=value, percent-encoded, to a form body. */
static int form_add(char **body, size_t *len, size_t *cap, const char *name, const char *value)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t need = *len + strlen(name) + 3 * strlen(value) + 3;
    if (need > *cap) {
        size_t ncap = need * 2;
        char *nb = malloc(ncap);
        if (!nb)
            return -1;
        if (*body) {
            memcpy(nb, *body, *len);
            explicit_bzero(*body, *cap);
            free(*body);
        }
        *body = nb;
        *cap = ncap;
    }
    char *p = *body + *len;
    if (*len)
        *p++ = '&';
    p += sprintf(p, "%s=", name);
    for (const unsigned char *v = (const unsigned char *)value; *v; v++) {
        if ((*v >= 'A' && *v <= 'Z') || (*v >= 'a' && *v <= 'z') || (*v >= '0' && *v <= '9') ||
            *v == '-' || *v == '.' || *v == '_' || *v == '~') {
            *p++ = (char)*v;
        } else {
            *p++ = '%';
            *p++ = hex[*v >> 4];
            *p++ = hex[*v & 15];
        }
    }
    *len = (size_t)(p - *body);
    return 0;
}

static void role_fetch(struct cloudauth *r)
{
    char why[200], url[600], auth[TOKEN_MAX + 32];
    const char *headers[3] = { NULL, NULL, NULL };
    char *body = NULL;
    size_t len = 0, cap = 0;
    struct attempt_spec spec = {
        .connect_timeout_s = FETCH_TIMEOUT_S,
        .ttft_timeout_s = FETCH_TIMEOUT_S,
        .idle_timeout_s = FETCH_TIMEOUT_S,
        .timeout_s = FETCH_TIMEOUT_S,
        .max_response_bytes = 65536,
        .raw = true,
        .headers = headers,
    };

    if (r->kind == CA_GCP_KEY) {
        char *jwt = cloudauth_gcp_jwt(&r->gcp, (long)ev_now(r->loop));
        int rc = !jwt ? -1
                      : form_add(&body, &len, &cap, "grant_type",
                                 "urn:ietf:params:oauth:grant-type:jwt-bearer");
        if (jwt) {
            rc |= form_add(&body, &len, &cap, "assertion", jwt);
            explicit_bzero(jwt, strlen(jwt));
            free(jwt);
        }
        if (rc) {
            free(body);
            role_failed(r, "cannot sign the service account's JWT");
            return;
        }
        snprintf(url, sizeof(url), "%s", r->gcp.token_uri);
        headers[0] = "Content-Type: application/x-www-form-urlencoded";
        headers[1] = "Accept: application/json";
    } else if (r->kind == CA_GCP_METADATA) {
        snprintf(url, sizeof(url), "%s", r->gcp.metadata_url);
        headers[0] = "Metadata-Flavor: Google";
        spec.method = "GET";
    } else if (r->kind == CA_AWS_ROLE) {
        char *tok = read_token(r->set.token_file, why, sizeof(why));
        if (!tok) {
            role_failed(r, why);
            return;
        }
        int rc = form_add(&body, &len, &cap, "Action", "AssumeRoleWithWebIdentity");
        rc |= form_add(&body, &len, &cap, "Version", "2011-06-15");
        rc |= form_add(&body, &len, &cap, "RoleArn", r->set.role_arn);
        rc |= form_add(&body, &len, &cap, "RoleSessionName", r->set.session_name);
        rc |= form_add(&body, &len, &cap, "WebIdentityToken", tok);
        explicit_bzero(tok, strlen(tok));
        free(tok);
        if (rc) {
            free(body);
            role_failed(r, "out of memory");
            return;
        }
        snprintf(url, sizeof(url), "%s/", r->set.sts_url);
        headers[0] = "Content-Type: application/x-www-form-urlencoded";
        headers[1] = "Accept: application/xml";
    } else {
        char *tok = r->set.container_token_file
            ? read_token(r->set.container_token_file, why, sizeof(why))
            : r->set.container_token ? strdup(r->set.container_token)
                                     : NULL;
        if (r->set.container_token_file && !tok) {
            role_failed(r, why);
            return;
        }
        auth[0] = '\0';
        if (tok) {
            snprintf(auth, sizeof(auth), "Authorization: %s", tok);
            explicit_bzero(tok, strlen(tok));
            free(tok);
            headers[1] = auth;
        }
        headers[0] = "Accept: application/json";
        snprintf(url, sizeof(url), "%s", r->set.container_uri);
        spec.method = "GET";
    }
    spec.url = url;
    spec.body = body;
    spec.body_len = len;
    r->attempt = attempt_start(r->up, &spec, &role_hooks, r);
    explicit_bzero(auth, sizeof(auth));
    if (!r->attempt)
        role_failed(r, "cannot start the request");
}

/* ---- tokens another program mints: token_command, token_file ------------ */

/* The token in `len` bytes of `text` (a program's output, a file): an OAuth
 * 2 answer ({"access_token", "expires_in"}, counted from `from`), or the
 * bare token, believed for ASSUMED_LIFE_S from `from`. Returns it malloc'd
 * with *exp, or NULL with `why`. */
static char *external_token(const char *text, size_t len, double from, double *exp, char *why,
                            size_t whylen)
{
    char *token = NULL;
    size_t a = 0;
    while (a < len && (text[a] == ' ' || text[a] == '\t' || text[a] == '\n' || text[a] == '\r'))
        a++;
    if (a < len && text[a] == '{')
        return cloudauth_parse_oauth(text + a, len - a, from, &token, exp, why, whylen) == 0 ? token
                                                                                             : NULL;
    while (len > a &&
           (text[len - 1] == ' ' || text[len - 1] == '\t' || text[len - 1] == '\n' ||
            text[len - 1] == '\r'))
        len--;
    if (len == a || memchr(text + a, '\0', len - a) || !(token = strndup(text + a, len - a)) ||
        !aws_creds_value_ok(token)) {
        wipe_free(&token);
        snprintf(why, whylen,
                 "the output is not an access token (one line of printable characters, at most "
                 "4096 bytes) nor an OAuth 2 answer");
        return NULL;
    }
    *exp = from + ASSUMED_LIFE_S;
    return token;
}

/* The AWS keys of the credentials file at `path` (its st_size `size`),
 * section r->set.profile: 0 with them in *c, or -1 with `why`. */
static int aws_file_keys(struct cloudauth *r, const char *path, off_t size, struct aws_creds *c,
                         char *why, size_t whylen)
{
    int rc = size > CREDS_FILE_MAX ? -2 : aws_creds_read_file(c, path, r->set.profile, why, whylen);
    if (rc == -2)
        snprintf(why, whylen, "the credentials file %s is over %d bytes", path, CREDS_FILE_MAX);
    else if (rc == 0)
        snprintf(why, whylen, "the credentials file %s has no keys in profile '%s'", path,
                 r->set.profile);
    return rc > 0 ? 0 : -1;
}

/* Has the file at `path` changed since `before` was taken (or gone)? */
static bool file_changed_since(const char *path, const struct stat *before)
{
    struct stat now;
    return stat(path, &now) != 0 || now.st_ino != before->st_ino ||
        now.st_size != before->st_size || now.st_mtim.tv_sec != before->st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != before->st_mtim.tv_nsec;
}

/* A watched file (token_file; the AWS credentials file): looked at every
 * FILE_POLL_S and when a request signs (a stat, on the loop: a small local
 * file), read again when it changed. While it cannot be read the
 * credentials already held stay in use until they expire. */
static void file_poll(struct cloudauth *r)
{
    const char *path = r->kind == CA_AWS_FILE ? r->set.creds_file : r->gcp.token_file;
    char why[200], *token = NULL;
    struct aws_creds keys;
    struct stat st;
    double exp = 0;

    memset(&keys, 0, sizeof(keys));
    role_arm(r, FILE_POLL_S);
    if (stat(path, &st) != 0) {
        snprintf(why, sizeof(why), "%s: cannot read %s (%s)", role_peer(r), path, strerror(errno));
    } else if (r->file_seen && (r->token || r->key_id) && st.st_ino == r->seen.st_ino &&
               st.st_size == r->seen.st_size && st.st_mtim.tv_sec == r->seen.st_mtim.tv_sec &&
               st.st_mtim.tv_nsec == r->seen.st_mtim.tv_nsec) {
        return; /* unchanged */
    } else {
        r->file_seen = true;
        r->seen = st;
        if (r->kind == CA_AWS_FILE) {
            if (aws_file_keys(r, path, st.st_size, &keys, why, sizeof(why)) == 0) {
                if (file_changed_since(path, &st)) {
                    /* Caught mid-write: read again at the next look. */
                    aws_creds_clear(&keys);
                    r->file_seen = false;
                    return;
                }
                role_got(r, keys.access_key_id, keys.secret_access_key, keys.session_token,
                         INFINITY);
                return;
            }
        } else {
            char *text = read_token(path, why, sizeof(why));
            double written = (double)st.st_mtim.tv_sec + st.st_mtim.tv_nsec / 1e9;
            if (text) {
                token = external_token(text, strlen(text), written, &exp, why, sizeof(why));
                explicit_bzero(text, strlen(text));
                free(text);
            }
            if (token && file_changed_since(path, &st)) {
                wipe_free(&token);
                r->file_seen = false;
                return;
            }
            if (token && exp <= ev_now(r->loop) + VALID_MARGIN_S) {
                wipe_free(&token);
                snprintf(why, sizeof(why),
                         "token_file: its token expired (the file is older "
                         "than the token's life)");
            }
        }
    }
    if (token) {
        role_got(r, NULL, NULL, token, exp);
        return;
    }
    /* Warned once per new problem, not at every look. */
    char full[sizeof(r->last_error)];
    snprintf(full, sizeof(full), "%s", why);
    if (strcmp(full, r->last_error) != 0) {
        r->stats.fetches_failed++;
        log_at(LOG_WARN,
               r->kind == CA_AWS_FILE ? "aws credentials file unusable"
                                      : "google cloud token_file unusable",
               "detail", LOG_S, full, NULL);
    }
    snprintf(r->last_error, sizeof(r->last_error), "%s", full);
}

static void run_close(struct cloudauth *r, ev_io *w)
{
    if (w->fd >= 0) {
        ev_io_stop(r->loop, w);
        close(w->fd);
        ev_io_set(w, -1, EV_READ);
    }
}

static void run_end(struct cloudauth *r, int status);

/* Ends the run once both pipes are closed and the program has exited;
 * never blocks: libev's default loop reports the exit (it reaps every
 * child), another loop asks waitpid on a period. */
static void run_reap(struct cloudauth *r)
{
    struct token_run *t = &r->run;
    if (t->out_w.fd >= 0 || t->err_w.fd >= 0)
        return;
    if (t->exited) {
        ev_timer_stop(r->loop, &t->reap_w);
        run_end(r, t->status);
    } else if (!ev_is_active(&t->child_w) && !ev_is_active(&t->reap_w)) {
        ev_timer_set(&t->reap_w, 0., REAP_POLL_S);
        ev_timer_again(r->loop, &t->reap_w);
    }
}

static void run_on_reap(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct cloudauth *r = w->data;
    int status = 0;
    (void)loop;
    (void)revents;
    pid_t p = waitpid(r->run.pid, &status, WNOHANG);
    if (p == 0)
        return; /* still running: the repeating timer asks again */
    r->run.exited = true;
    r->run.status = p < 0 ? -1 : status;
    run_reap(r);
}

static void run_on_child(struct ev_loop *loop, ev_child *w, int revents)
{
    struct cloudauth *r = w->data;
    (void)revents;
    ev_child_stop(loop, w);
    r->run.exited = true;
    r->run.status = w->rstatus;
    run_reap(r);
}

static void run_on_out(struct ev_loop *loop, ev_io *w, int revents)
{
    struct cloudauth *r = w->data;
    struct token_run *t = &r->run;
    (void)loop;
    (void)revents;
    for (;;) {
        char sink[4096];
        bool out = w == &t->out_w;
        char *dst = out ? t->out + t->out_len : sink;
        size_t room = out ? TOKEN_MAX + 1 - t->out_len : sizeof(sink);
        ssize_t n = room ? read(w->fd, dst, room) : 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n > 0) {
            if (out)
                t->out_len += (size_t)n;
            else
                t->err_len += (size_t)n; /* counted, never kept: it may quote secrets */
            continue;
        }
        if (out && room == 0) {
            t->too_long = true; /* over TOKEN_MAX: stop it */
            kill(-t->pid, SIGKILL);
        }
        run_close(r, w);
        run_reap(r);
        return;
    }
}

/* Starts token_command: standard input /dev/null, its output and errors
 * into pipes read on the loop, in a process group of its own (so a
 * timeout ends a shell's children too). */
static void run_start(struct cloudauth *r)
{
    struct token_run *t = &r->run;
    int out[2] = { -1, -1 }, err[2] = { -1, -1 };
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    sigset_t none, all;
    extern char **environ;
    char why[200];

    t->out_len = t->err_len = 0;
    t->too_long = t->timed_out = t->exited = false;
    if (!t->out && !(t->out = malloc(TOKEN_MAX + 1))) {
        role_failed(r, "token_command: out of memory");
        return;
    }
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
        snprintf(why, sizeof(why), "token_command: cannot make a pipe (%s)", strerror(errno));
        for (int i = 0; i < 2; i++) {
            if (out[i] >= 0)
                close(out[i]);
            if (err[i] >= 0)
                close(err[i]);
        }
        role_failed(r, why);
        return;
    }
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    posix_spawnattr_init(&at);
    posix_spawnattr_setflags(
        &at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setpgroup(&at, 0);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &all);
    int rc =
        posix_spawnp(&t->pid, r->gcp.token_command[0], &fa, &at, r->gcp.token_command, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    close(out[1]);
    close(err[1]);
    if (rc != 0) {
        close(out[0]);
        close(err[0]);
        t->pid = 0;
        snprintf(why, sizeof(why), "token_command: cannot run %s (%s)", r->gcp.token_command[0],
                 strerror(rc));
        role_failed(r, why);
        return;
    }
    if (ev_is_default_loop(r->loop)) {
        ev_child_set(&t->child_w, t->pid, 0);
        ev_child_start(r->loop, &t->child_w);
    }
    fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
    fcntl(err[0], F_SETFL, fcntl(err[0], F_GETFL) | O_NONBLOCK);
    ev_io_set(&t->out_w, out[0], EV_READ);
    ev_io_set(&t->err_w, err[0], EV_READ);
    ev_io_start(r->loop, &t->out_w);
    ev_io_start(r->loop, &t->err_w);
    role_arm(r, FETCH_TIMEOUT_S); /* the timer is its timeout while it runs */
}

/* The timeout: the program and its group are killed, then reaped. */
static void run_timeout(struct cloudauth *r)
{
    r->run.timed_out = true;
    kill(-r->run.pid, SIGKILL);
    run_close(r, &r->run.out_w);
    run_close(r, &r->run.err_w);
    run_reap(r);
}

static void run_end(struct cloudauth *r, int status)
{
    struct token_run *t = &r->run;
    char why[200];
    double exp = 0;
    char *token = NULL;

    t->pid = 0;
    ev_timer_stop(r->loop, &r->timer);
    if (t->timed_out)
        snprintf(why, sizeof(why), "token_command: no answer within %.0f s (killed)",
                 FETCH_TIMEOUT_S);
    else if (t->too_long)
        snprintf(why, sizeof(why), "token_command: its output is over %d bytes", TOKEN_MAX);
    else if (status < 0)
        snprintf(why, sizeof(why), "token_command: its exit status could not be read");
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        snprintf(why, sizeof(why), "token_command: %s %d (%zu bytes on standard error, not logged)",
                 WIFEXITED(status) ? "exited with status" : "killed by signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), t->err_len);
    else
        token = external_token(t->out, t->out_len, ev_now(r->loop), &exp, why, sizeof(why));
    explicit_bzero(t->out, TOKEN_MAX + 1);
    if (token) {
        role_got(r, NULL, NULL, token, exp);
    } else if (!t->timed_out && !t->too_long && status >= 0 && WIFEXITED(status) &&
               WEXITSTATUS(status) == 0) {
        char full[sizeof(why) + 16];
        snprintf(full, sizeof(full), "token_command: %s", why);
        role_failed(r, full);
    } else {
        role_failed(r, why);
    }
}

static void role_on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct cloudauth *r = w->data;
    (void)loop;
    (void)revents;
    if (r->kind == CA_GCP_FILE || r->kind == CA_AWS_FILE)
        file_poll(r);
    else if (r->kind == CA_GCP_COMMAND && r->run.pid > 0)
        run_timeout(r);
    else if (r->kind == CA_GCP_COMMAND)
        run_start(r);
    else if (!r->attempt)
        role_fetch(r);
}

/* ---- public ---------------------------------------------------------------- */

static int dup_opt(char **dst, const char *src)
{
    return !src || (*dst = strdup(src)) ? 0 : -1;
}

static struct cloudauth *role_start(struct cloudauth *r, struct ev_loop *loop, struct upstream *up)
{
    xmlInitParser();
    r->loop = loop;
    r->up = up;
    snprintf(r->last_error, sizeof(r->last_error), "the first fetch from %s has not answered yet",
             role_peer(r));
    ev_timer_init(&r->timer, role_on_timer, 0., 0.);
    r->timer.data = r;
    ev_timer_start(loop, &r->timer);
    ev_io_init(&r->run.out_w, run_on_out, -1, EV_READ);
    ev_io_init(&r->run.err_w, run_on_out, -1, EV_READ);
    ev_init(&r->run.reap_w, run_on_reap);
    ev_child_init(&r->run.child_w, run_on_child, 0, 0);
    r->run.out_w.data = r->run.err_w.data = r->run.reap_w.data = r->run.child_w.data = r;
    return r;
}

struct cloudauth *cloudauth_new_aws(struct ev_loop *loop, struct upstream *up,
                                    const struct aws_creds *c, char *err, size_t errlen)
{
    if (!aws_creds_fetched(c) && !aws_creds_watched(c)) {
        snprintf(err, errlen,
                 "no role, container endpoint or credentials file to fetch AWS "
                 "credentials from");
        return NULL;
    }
    struct cloudauth *r = calloc(1, sizeof(*r));
    if (!r || dup_opt(&r->set.role_arn, c->role_arn) < 0 ||
        dup_opt(&r->set.token_file, c->token_file) < 0 ||
        dup_opt(&r->set.session_name, c->session_name) < 0 ||
        dup_opt(&r->set.sts_url, c->sts_url) < 0 ||
        dup_opt(&r->set.container_uri, c->container_uri) < 0 ||
        dup_opt(&r->set.container_token_file, c->container_token_file) < 0 ||
        dup_opt(&r->set.container_token, c->container_token) < 0 ||
        dup_opt(&r->set.creds_file, c->creds_file) < 0 ||
        dup_opt(&r->set.profile, c->profile) < 0 ||
        (c->creds_file &&
         (dup_opt(&r->key_id, c->access_key_id) < 0 ||
          dup_opt(&r->secret, c->secret_access_key) < 0 ||
          dup_opt(&r->token, c->session_token) < 0))) {
        cloudauth_free(r);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->kind = c->role_arn ? CA_AWS_ROLE : c->container_uri ? CA_AWS_CONTAINER : CA_AWS_FILE;
    /* The file's keys as the configuration read them, until it changes. */
    r->expires_at = r->kind == CA_AWS_FILE ? INFINITY : 0;
    return role_start(r, loop, up);
}

struct cloudauth *cloudauth_new_gcp(struct ev_loop *loop, struct upstream *up,
                                    const struct gcp_creds *g, char *err, size_t errlen)
{
    struct cloudauth *r = calloc(1, sizeof(*r));
    if (!r || dup_opt(&r->gcp.client_email, g->client_email) < 0 ||
        dup_opt(&r->gcp.private_key, g->private_key) < 0 ||
        dup_opt(&r->gcp.private_key_id, g->private_key_id) < 0 ||
        dup_opt(&r->gcp.token_uri, g->token_uri) < 0 ||
        dup_opt(&r->gcp.metadata_url, g->metadata_url) < 0 ||
        dup_opt(&r->gcp.token_file, g->token_file) < 0 ||
        (g->token_command &&
         !(r->gcp.token_command = calloc(g->n_token_command + 1, sizeof(char *))))) {
        cloudauth_free(r);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    for (size_t i = 0; g->token_command && i < g->n_token_command; i++) {
        if (!(r->gcp.token_command[i] = strdup(g->token_command[i]))) {
            cloudauth_free(r);
            snprintf(err, errlen, "out of memory");
            return NULL;
        }
        r->gcp.n_token_command++;
    }
    r->kind = g->token_command ? CA_GCP_COMMAND
        : g->token_file        ? CA_GCP_FILE
        : g->private_key       ? CA_GCP_KEY
                               : CA_GCP_METADATA;
    return role_start(r, loop, up);
}

void cloudauth_free(struct cloudauth *r)
{
    if (!r)
        return;
    if (r->loop)
        ev_timer_stop(r->loop, &r->timer);
    if (r->attempt)
        attempt_cancel(r->attempt);
    if (r->loop) {
        run_close(r, &r->run.out_w);
        run_close(r, &r->run.err_w);
        ev_timer_stop(r->loop, &r->run.reap_w);
        ev_child_stop(r->loop, &r->run.child_w);
    }
    if (r->run.pid > 0) {
        /* Killed; reaped now if it is already gone (a process killed with
         * SIGKILL ends at once), else left to the process's end. */
        kill(-r->run.pid, SIGKILL);
        (void)waitpid(r->run.pid, NULL, WNOHANG);
    }
    if (r->run.out) {
        explicit_bzero(r->run.out, TOKEN_MAX + 1);
        free(r->run.out);
    }
    aws_creds_clear(&r->set);
    gcp_creds_clear(&r->gcp);
    wipe_free(&r->key_id);
    wipe_free(&r->secret);
    wipe_free(&r->token);
    free(r);
}

bool cloudauth_get(struct cloudauth *r, struct sigv4_creds *out, char *why, size_t whylen)
{
    /* A rotated file is seen by the next request, not a period later:
     * one stat per request signed, the file read only when it changed. */
    if (r->kind == CA_AWS_FILE || r->kind == CA_GCP_FILE)
        file_poll(r);
    if ((r->token || r->key_id) && ev_now(r->loop) < r->expires_at - VALID_MARGIN_S) {
        *out = (struct sigv4_creds){ r->key_id, r->secret, r->token };
        return true;
    }
    snprintf(why, whylen, "no valid %s credentials: %s",
             r->kind <= CA_AWS_FILE ? "AWS" : "Google Cloud",
             r->last_error[0] ? r->last_error : "they expired and the refresh has not answered");
    return false;
}

const struct cloudauth_stats *cloudauth_get_stats(const struct cloudauth *r)
{
    return &r->stats;
}

void cloudauth_ensure(struct cloudauth **aws, struct cloudauth **gcp, struct ev_loop *loop,
                      struct upstream *up, const struct config *cfg)
{
    char err[160];

    for (size_t i = 0; i < cfg->n_sources; i++) {
        const struct config_source *s = &cfg->sources[i];
        if (!*aws && s->kind == DIALECT_BEDROCK &&
            (aws_creds_fetched(&s->aws) || aws_creds_watched(&s->aws)) &&
            !(*aws = cloudauth_new_aws(loop, up, &s->aws, err, sizeof(err))))
            log_at(LOG_ERROR, "aws credentials cannot be fetched", "error", LOG_S, err, NULL);
        /* A reload that changes where the tokens come from starts over. */
        if (*gcp && s->vertex.on && !gcp_creds_same_external(&(*gcp)->gcp, &s->vertex.creds)) {
            cloudauth_free(*gcp);
            *gcp = NULL;
        }
        if (!*gcp && s->vertex.on &&
            !(*gcp = cloudauth_new_gcp(loop, up, &s->vertex.creds, err, sizeof(err))))
            log_at(LOG_ERROR, "google cloud tokens cannot be fetched", "error", LOG_S, err, NULL);
    }
}

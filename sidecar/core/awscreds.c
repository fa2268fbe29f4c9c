/*
 * awscreds.c — AWS credentials from the environment or the shared
 * credentials file (awscreds.h).
 */
#include "awscreds.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int aws_creds_value_ok(const char *v)
{
    if (!v || !*v || strlen(v) > 4096)
        return 0;
    for (const char *p = v; *p; p++)
        if (*p <= ' ' || *p > '~')
            return 0;
    return 1;
}

static char *trimmed(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

void aws_creds_clear(struct aws_creds *c)
{
    char **keys[] = { &c->access_key_id,   &c->secret_access_key, &c->session_token,
                      &c->role_arn,        &c->token_file,        &c->session_name,
                      &c->sts_url,         &c->container_uri,     &c->container_token_file,
                      &c->container_token, &c->creds_file,        &c->profile };
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        if (*keys[i]) {
            explicit_bzero(*keys[i], strlen(*keys[i]));
            free(*keys[i]);
            *keys[i] = NULL;
        }
    }
}

static int creds_from_env(struct aws_creds *c, char *why, size_t whylen)
{
    const char *id = getenv("AWS_ACCESS_KEY_ID"), *secret = getenv("AWS_SECRET_ACCESS_KEY");
    const char *token = getenv("AWS_SESSION_TOKEN");

    if (!id || !*id)
        return 0;
    if (!secret || !*secret) {
        snprintf(why, whylen, "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not");
        return -1;
    }
    if (!aws_creds_value_ok(id) || !aws_creds_value_ok(secret) ||
        (token && *token && !aws_creds_value_ok(token))) {
        snprintf(why, whylen, "the AWS credentials in the environment are not printable text");
        return -1;
    }
    if (!(c->access_key_id = strdup(id)) || !(c->secret_access_key = strdup(secret)) ||
        (token && *token && !(c->session_token = strdup(token)))) {
        aws_creds_clear(c);
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    return 1;
}

int aws_creds_read_file(struct aws_creds *c, const char *path, const char *profile, char *why,
                        size_t whylen)
{
    FILE *f = fopen(path, "re");
    char line[8192];
    int in = 0, rc = 0;

    if (!f)
        return 0;
    while (rc >= 0 && fgets(line, sizeof(line), f)) {
        char *s = trimmed(line);
        if (*s == '#' || *s == ';' || !*s)
            continue;
        if (*s == '[') {
            char *end = strchr(s, ']');
            if (end)
                *end = '\0';
            in = strcmp(trimmed(s + 1), profile) == 0;
            continue;
        }
        char *eq = strchr(s, '=');
        if (!in || !eq)
            continue;
        *eq = '\0';
        char *key = trimmed(s), *val = trimmed(eq + 1);
        char **slot = strcmp(key, "aws_access_key_id") == 0 ? &c->access_key_id
            : strcmp(key, "aws_secret_access_key") == 0     ? &c->secret_access_key
            : strcmp(key, "aws_session_token") == 0         ? &c->session_token
                                                            : NULL;
        if (!slot)
            continue;
        if (!aws_creds_value_ok(val)) {
            snprintf(why, whylen, "%s in profile '%s' of %s is not printable text", key, profile,
                     path);
            rc = -1;
        } else {
            free(*slot);
            if (!(*slot = strdup(val))) {
                snprintf(why, whylen, "out of memory");
                rc = -1;
            }
        }
    }
    explicit_bzero(line, sizeof(line));
    fclose(f);
    if (rc < 0) {
        aws_creds_clear(c);
        return -1;
    }
    if (!c->access_key_id && !c->secret_access_key) {
        aws_creds_clear(c);
        return 0;
    }
    if (!c->access_key_id || !c->secret_access_key) {
        aws_creds_clear(c);
        snprintf(why, whylen,
                 "profile '%s' of %s needs both aws_access_key_id and aws_secret_access_key",
                 profile, path);
        return -1;
    }
    return 1;
}

static const char *env_or(const char *a, const char *b)
{
    const char *v = getenv(a);
    if (v && *v)
        return v;
    v = b ? getenv(b) : NULL;
    return v && *v ? v : NULL;
}

static int creds_dup(char **slot, const char *v, char *why, size_t whylen)
{
    if (!v)
        return 0;
    if (!(*slot = strdup(v))) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    return 0;
}

/* IRSA: AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE. */
static int creds_web_identity(struct aws_creds *c, char *why, size_t whylen)
{
    const char *arn = env_or("AWS_ROLE_ARN", NULL);
    const char *file = env_or("AWS_WEB_IDENTITY_TOKEN_FILE", NULL);
    char url[512];

    if (!arn && !file)
        return 0;
    if (!arn || !file) {
        snprintf(why, whylen, "%s is set but %s is not",
                 arn ? "AWS_ROLE_ARN" : "AWS_WEB_IDENTITY_TOKEN_FILE",
                 arn ? "AWS_WEB_IDENTITY_TOKEN_FILE" : "AWS_ROLE_ARN");
        return -1;
    }
    if (!aws_creds_value_ok(arn) || file[0] != '/') {
        snprintf(why, whylen,
                 "AWS_ROLE_ARN must be an ARN and AWS_WEB_IDENTITY_TOKEN_FILE an "
                 "absolute path");
        return -1;
    }
    const char *ep = env_or("AWS_ENDPOINT_URL_STS", "AWS_ENDPOINT_URL");
    const char *region = env_or("AWS_REGION", "AWS_DEFAULT_REGION");
    if (ep) {
        if (strncmp(ep, "http://", 7) != 0 && strncmp(ep, "https://", 8) != 0) {
            snprintf(why, whylen, "the STS endpoint (AWS_ENDPOINT_URL_STS) must be an http(s) URL");
            return -1;
        }
        snprintf(url, sizeof(url), "%s", ep);
    } else {
        snprintf(url, sizeof(url), "https://sts.%s.amazonaws.com",
                 region          ? region
                     : c->region ? c->region
                                 : "us-east-1");
    }
    size_t n = strlen(url);
    while (n > 0 && url[n - 1] == '/')
        url[--n] = '\0';
    char name[64];
    snprintf(name, sizeof(name), "polygw-%ld", (long)getpid());
    const char *sn = env_or("AWS_ROLE_SESSION_NAME", NULL);
    if (creds_dup(&c->role_arn, arn, why, whylen) < 0 ||
        creds_dup(&c->token_file, file, why, whylen) < 0 ||
        creds_dup(&c->session_name, sn ? sn : name, why, whylen) < 0 ||
        creds_dup(&c->sts_url, url, why, whylen) < 0) {
        aws_creds_clear(c);
        return -1;
    }
    return 1;
}

/* EKS Pod Identity / ECS: AWS_CONTAINER_CREDENTIALS_FULL_URI. */
static int creds_container(struct aws_creds *c, char *why, size_t whylen)
{
    const char *uri = env_or("AWS_CONTAINER_CREDENTIALS_FULL_URI", NULL);
    if (!uri)
        return 0;
    if (strncmp(uri, "http://", 7) != 0 && strncmp(uri, "https://", 8) != 0) {
        snprintf(why, whylen, "AWS_CONTAINER_CREDENTIALS_FULL_URI must be an http(s) URL");
        return -1;
    }
    const char *file = env_or("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", NULL);
    const char *tok = env_or("AWS_CONTAINER_AUTHORIZATION_TOKEN", NULL);
    if (tok && !aws_creds_value_ok(tok)) {
        snprintf(why, whylen, "AWS_CONTAINER_AUTHORIZATION_TOKEN is not printable text");
        return -1;
    }
    if (creds_dup(&c->container_uri, uri, why, whylen) < 0 ||
        creds_dup(&c->container_token_file, file, why, whylen) < 0 ||
        (!file && creds_dup(&c->container_token, tok, why, whylen) < 0)) {
        aws_creds_clear(c);
        return -1;
    }
    return 1;
}

int aws_creds_load(struct aws_creds *c, char *why, size_t whylen)
{
    char path[4096];
    const char *file = getenv("AWS_SHARED_CREDENTIALS_FILE"), *home = getenv("HOME");
    const char *profile = getenv("AWS_PROFILE");

    int rc = creds_from_env(c, why, whylen);
    if (rc == 0)
        rc = creds_web_identity(c, why, whylen);
    if (rc != 0)
        return rc < 0 ? -1 : 0;
    if (!profile || !*profile)
        profile = "default";
    if (file && *file)
        snprintf(path, sizeof(path), "%s", file);
    else if (home && *home)
        snprintf(path, sizeof(path), "%s/.aws/credentials", home);
    else
        path[0] = '\0';
    if (path[0] && (rc = aws_creds_read_file(c, path, profile, why, whylen)) != 0) {
        if (rc > 0 &&
            (creds_dup(&c->creds_file, path, why, whylen) < 0 ||
             creds_dup(&c->profile, profile, why, whylen) < 0)) {
            aws_creds_clear(c);
            return -1;
        }
        return rc < 0 ? -1 : 0;
    }
    if ((rc = creds_container(c, why, whylen)) != 0)
        return rc < 0 ? -1 : 0;
    snprintf(why, whylen,
             "kind: bedrock needs AWS credentials: set AWS_ACCESS_KEY_ID and "
             "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), AWS_ROLE_ARN and "
             "AWS_WEB_IDENTITY_TOKEN_FILE, a profile '%s' in %s, or "
             "AWS_CONTAINER_CREDENTIALS_FULL_URI",
             profile, path[0] ? path : "~/.aws/credentials");
    return -1;
}

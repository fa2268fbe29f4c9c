/*
 * awscreds.c — AWS credentials from the environment or the shared
 * credentials file (awscreds.h).
 */
#include "awscreds.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A value fit for a header: printable ASCII, no spaces inside. */
static int creds_value_ok(const char *v)
{
    if (!*v || strlen(v) > 4096)
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

static void creds_clear(struct aws_creds *c)
{
    char **keys[] = { &c->access_key_id, &c->secret_access_key, &c->session_token };
    for (size_t i = 0; i < 3; i++) {
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
    if (!creds_value_ok(id) || !creds_value_ok(secret) || (token && *token && !creds_value_ok(token))) {
        snprintf(why, whylen, "the AWS credentials in the environment are not printable text");
        return -1;
    }
    if (!(c->access_key_id = strdup(id)) || !(c->secret_access_key = strdup(secret)) ||
        (token && *token && !(c->session_token = strdup(token)))) {
        creds_clear(c);
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    return 1;
}

/* Reads [profile] of the INI file at `path`: 1 found, 0 no such file or
 * section, -1 an error (why). */
static int creds_from_file(struct aws_creds *c, const char *path, const char *profile, char *why,
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
        char **slot = strcmp(key, "aws_access_key_id") == 0       ? &c->access_key_id
            : strcmp(key, "aws_secret_access_key") == 0             ? &c->secret_access_key
            : strcmp(key, "aws_session_token") == 0                 ? &c->session_token
                                                                    : NULL;
        if (!slot)
            continue;
        if (!creds_value_ok(val)) {
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
        creds_clear(c);
        return -1;
    }
    if (!c->access_key_id && !c->secret_access_key) {
        creds_clear(c);
        return 0;
    }
    if (!c->access_key_id || !c->secret_access_key) {
        creds_clear(c);
        snprintf(why, whylen,
                 "profile '%s' of %s needs both aws_access_key_id and aws_secret_access_key",
                 profile, path);
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
    if (path[0] && (rc = creds_from_file(c, path, profile, why, whylen)) != 0)
        return rc < 0 ? -1 : 0;
    snprintf(why, whylen,
             "kind: bedrock needs AWS credentials: set AWS_ACCESS_KEY_ID and "
             "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), or a profile '%s' in %s",
             profile, path[0] ? path : "~/.aws/credentials");
    return -1;
}

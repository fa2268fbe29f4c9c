/*
 * gcpcreds.c — a Vertex source's token settings (gcpcreds.h).
 */
#include "gcpcreds.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/jscan.h"

#define KEY_FILE_MAX 65536

static void wipe_free(char **p)
{
    if (*p) {
        explicit_bzero(*p, strlen(*p));
        free(*p);
        *p = NULL;
    }
}

void gcp_creds_clear(struct gcp_creds *c)
{
    char **all[] = { &c->key_file,       &c->client_email, &c->private_key,
                     &c->private_key_id, &c->token_uri,    &c->metadata_url };
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        wipe_free(all[i]);
    for (size_t i = 0; c->token_command && i < c->n_token_command; i++)
        free(c->token_command[i]);
    free(c->token_command);
    c->token_command = NULL;
    c->n_token_command = 0;
    free(c->token_file);
    c->token_file = NULL;
}

static int same_str(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

int gcp_creds_same_external(const struct gcp_creds *a, const struct gcp_creds *b)
{
    if (!same_str(a->token_file, b->token_file) || a->n_token_command != b->n_token_command ||
        !a->token_command != !b->token_command)
        return 0;
    for (size_t i = 0; i < a->n_token_command; i++)
        if (!same_str(a->token_command[i], b->token_command[i]))
            return 0;
    return 1;
}

struct key_json {
    struct jscan_value type, email, key, key_id, token_uri;
};

static int key_member(void *ud, const char *name, const struct jscan_value *v)
{
    struct key_json *k = ud;
    if (v->type != JSCAN_STRING)
        return 0;
    if (strcmp(name, "type") == 0)
        k->type = *v;
    else if (strcmp(name, "client_email") == 0)
        k->email = *v;
    else if (strcmp(name, "private_key") == 0)
        k->key = *v;
    else if (strcmp(name, "private_key_id") == 0)
        k->key_id = *v;
    else if (strcmp(name, "token_uri") == 0)
        k->token_uri = *v;
    return 0;
}

static int load_key_file(struct gcp_creds *c, const char *path, char *why, size_t whylen)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        snprintf(why, whylen, "GOOGLE_APPLICATION_CREDENTIALS names a file that cannot be read");
        return -1;
    }
    char *buf = malloc(KEY_FILE_MAX + 1);
    size_t n = buf ? fread(buf, 1, KEY_FILE_MAX + 1, f) : 0;
    fclose(f);
    int rc = -1;
    struct key_json k;
    memset(&k, 0, sizeof(k));
    if (!buf || n == 0 || n > KEY_FILE_MAX) {
        snprintf(why, whylen, "the service-account key file is empty or over %d bytes",
                 KEY_FILE_MAX);
    } else if (jscan_object(buf, n, key_member, &k, NULL) != 0) {
        snprintf(why, whylen, "the service-account key file is not a JSON object");
    } else if (!k.type.p || k.type.len != sizeof("\"service_account\"") - 1 ||
               memcmp(k.type.p, "\"service_account\"", k.type.len) != 0) {
        snprintf(why, whylen,
                 "the key file of GOOGLE_APPLICATION_CREDENTIALS is not a service-account key "
                 "(\"type\": \"service_account\"); on GKE, use Workload Identity instead");
    } else if (!(c->client_email = jscan_strdup(&k.email)) ||
               !(c->private_key = jscan_strdup(&k.key)) ||
               !(c->token_uri = jscan_strdup(&k.token_uri))) {
        snprintf(why, whylen,
                 "the service-account key file lacks client_email, private_key or token_uri");
    } else if (strncmp(c->token_uri, "https://", 8) != 0 &&
               strncmp(c->token_uri, "http://", 7) != 0) {
        snprintf(why, whylen, "the service-account key's token_uri is not an http(s) URL");
    } else {
        c->private_key_id = jscan_strdup(&k.key_id);
        BIO *bio = BIO_new_mem_buf(c->private_key, -1);
        EVP_PKEY *pk = bio ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
        if (!pk || EVP_PKEY_get_base_id(pk) != EVP_PKEY_RSA)
            snprintf(why, whylen, "the service-account key's private_key is not an RSA key in PEM");
        else
            rc = 0;
        EVP_PKEY_free(pk);
        BIO_free(bio);
    }
    if (buf) {
        explicit_bzero(buf, KEY_FILE_MAX + 1);
        free(buf);
    }
    if (rc == 0 && !(c->key_file = strdup(path))) {
        snprintf(why, whylen, "out of memory");
        rc = -1;
    }
    if (rc < 0)
        gcp_creds_clear(c);
    return rc;
}

int gcp_creds_load(struct gcp_creds *c, char *why, size_t whylen)
{
    if (gcp_creds_external(c))
        return 0;
    const char *path = getenv("GOOGLE_APPLICATION_CREDENTIALS");
    if (path && *path)
        return load_key_file(c, path, why, whylen);
    const char *host = getenv("GCE_METADATA_HOST");
    char url[300];
    snprintf(url, sizeof(url),
             "http://%s/computeMetadata/v1/instance/service-accounts/default/token",
             host && *host ? host : "metadata.google.internal");
    if (!(c->metadata_url = strdup(url))) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    return 0;
}

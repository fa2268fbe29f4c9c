/*
 * gcpcreds.h — where a `kind: vertex` source gets its OAuth 2 access
 * token, found as Google's client libraries find it (docs/CONFIG.md,
 * "Vertex AI"):
 *
 *   1. GOOGLE_APPLICATION_CREDENTIALS names a service-account key file
 *      (JSON, "type": "service_account"): the sidecar signs a JWT (RS256)
 *      with its private key and exchanges it at the key's token_uri;
 *   2. else the metadata server of GKE Workload Identity or a GCE VM
 *      (GCE_METADATA_HOST, default metadata.google.internal) hands the
 *      token of the pod's service account.
 *
 * unless the source names where something else puts the tokens it mints:
 * `token_command` (an argv whose standard output is the token, e.g.
 * gcloud auth print-access-token) or `token_file` (a file holding it,
 * rewritten by a CSI driver or an agent); the environment is then not
 * looked at.
 *
 * The key file is read and checked when the configuration is loaded; the
 * tokens themselves are fetched on the loop (upstream/cloudauth.h).
 */
#ifndef POLYGW_GCPCREDS_H
#define POLYGW_GCPCREDS_H

#include <stddef.h>

struct gcp_creds {
    char *key_file;       /* owned: the service-account key's path, or NULL */
    char *client_email;   /* owned, from the key */
    char *private_key;    /* owned secret (PEM), from the key */
    char *private_key_id; /* owned or NULL, from the key (the JWT's kid) */
    char *token_uri;      /* owned, from the key */
    char *metadata_url;   /* owned: the metadata server's token URL (no key file) */
    char **token_command; /* owned, NULL-terminated argv, or NULL */
    size_t n_token_command;
    char *token_file; /* owned: the path of a token file, or NULL */
};

/* Are the tokens another program's (token_command or token_file)? */
static inline int gcp_creds_external(const struct gcp_creds *c)
{
    return c->token_command != NULL || c->token_file != NULL;
}

/* Do `a` and `b` name the same program or file (both external, or both not)? 1 or 0. */
int gcp_creds_same_external(const struct gcp_creds *a, const struct gcp_creds *b);

/* Fills `c` (nothing to do when its tokens are external). Returns 0, or
 * -1 with `why` (never quoting a secret). */
int gcp_creds_load(struct gcp_creds *c, char *why, size_t whylen);

/* Frees and wipes everything of `c`. */
void gcp_creds_clear(struct gcp_creds *c);

#endif /* POLYGW_GCPCREDS_H */

/*
 * sigv4.h — AWS Signature Version 4 for one HTTP request (the Authorization
 * header Bedrock and every other AWS service require).
 *
 *   canonical request = METHOD \n canonical URI \n canonical query \n
 *                       canonical headers \n signed headers \n hex(SHA-256(body))
 *   string to sign    = "AWS4-HMAC-SHA256" \n amz-date \n scope \n
 *                       hex(SHA-256(canonical request))
 *   scope             = yyyymmdd/region/service/aws4_request
 *   signing key       = HMAC chain over "AWS4"+secret, date, region, service,
 *                       "aws4_request"
 *   Authorization     = AWS4-HMAC-SHA256 Credential=KEYID/scope,
 *                       SignedHeaders=a;b;c, Signature=hex(HMAC(key, string))
 *
 * The rules, as AWS's published test suite checks them:
 *   - the canonical URI is the path as sent, percent-encoded once more
 *     (every byte but A-Z a-z 0-9 - . _ ~ and '/'), as every service but S3
 *     wants: a model id's ':' sent as %3A signs as %253A;
 *   - the canonical query has each name and value decoded, then encoded
 *     with the same unreserved set ('+' is a literal plus), a name without
 *     '=' taking an empty value, pairs sorted by name then value, bytewise;
 *   - headers are lowercased, values trimmed with inner runs of spaces
 *     folded to one, repeated names joined with ',' in the order given,
 *     sorted by name; host and x-amz-date (and x-amz-security-token when a
 *     session token is used) are always signed.
 *
 * Pure apart from OpenSSL's digests: no I/O, no clock (the caller passes
 * the time), no globals.
 */
#ifndef POLYGW_SIGV4_H
#define POLYGW_SIGV4_H

#include <stddef.h>
#include <time.h>

#include "strbuf.h"

struct sigv4_creds {
    const char *access_key_id;
    const char *secret_access_key;
    const char *session_token; /* NULL or "": long-term keys */
};

struct sigv4_request {
    const char *method;         /* "POST" */
    const char *host;           /* the Host header's value (with a port if not the default) */
    const char *path;           /* as sent: "/model/a.b%3A0/invoke" */
    const char *query;          /* as sent, without '?'; NULL or "" = none */
    const char *const *headers; /* more "Name: value" lines to sign; may be NULL */
    size_t n_headers;
    const void *body;
    size_t body_len;
    const char *region;  /* "us-east-1" */
    const char *service; /* "bedrock" */
    time_t when;         /* the signing time (UTC) */
};

#define SIGV4_AMZ_DATE_LEN 16 /* "20150830T123600Z" */

struct sigv4_out {
    char amz_date[SIGV4_AMZ_DATE_LEN + 1];
    struct strbuf authorization; /* the header's value */
};

/* The canonical request and string to sign of `r`, for tests and error
 * details (never holds a secret). Returns 0 or -1 (out of memory, or a
 * header line without a colon). */
int sigv4_canonical_request(const struct sigv4_request *r, const struct sigv4_creds *c,
                            struct strbuf *out, struct strbuf *signed_headers);
int sigv4_string_to_sign(const struct sigv4_request *r, const struct sigv4_creds *c,
                         struct strbuf *out);

/* Signs `r`: fills out->amz_date and out->authorization (initialised by the
 * caller with strbuf_init; the caller frees it). The request must go out
 * with `Host`, `X-Amz-Date: <amz_date>` and, with a session token,
 * `X-Amz-Security-Token`. Returns 0 or -1. */
int sigv4_sign(const struct sigv4_request *r, const struct sigv4_creds *c, struct sigv4_out *out);

#endif /* POLYGW_SIGV4_H */

/*
 * tls.c — OpenSSL client contexts from files (tls.h).
 */
#include "tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "iplit.h"

#define TLS_WHY_MAX 200

const char *tls_reason(char *buf, size_t cap, const char *dflt)
{
    unsigned long e = ERR_peek_last_error();

    ERR_clear_error();
    if (!e)
        return dflt;
    const char *r = ERR_reason_error_string(e);
    if (r)
        snprintf(buf, cap, "%s", r);
    else
        ERR_error_string_n(e, buf, cap);
    return buf;
}

/* The passphrase callback of every key polygw loads: there is none to
 * give (keys are unencrypted PEM), and OpenSSL's own would prompt on the
 * terminal, stopping the start-up, --check-config or a reload for input. */
static int tls_no_passphrase(char *buf, int size, int rwflag, void *u)
{
    (void)buf, (void)size, (void)rwflag, (void)u;
    return -1;
}

/* Why a certificate or key file did not load: OpenSSL's reason, said
 * plainly where it would only say "PEM lib". */
static const char *tls_file_reason(char *buf, size_t cap, const char *what)
{
    unsigned long e = ERR_peek_last_error();

    if (e && ERR_GET_REASON(e) == ERR_R_PEM_LIB) {
        ERR_clear_error();
        snprintf(buf, cap, "no %s in it", what);
        return buf;
    }
    return tls_reason(buf, cap, "unreadable or not PEM");
}

/* OpenSSL opens its files blocking: a FIFO would stop the loop (a reload,
 * a CA bundle read again) until something wrote to it, and a directory
 * would be "no certificate found". Only regular files are loaded. */
static bool tls_file_bad(const char *file, const char *what, char *err, size_t errlen)
{
    struct stat sb;

    if (!file || stat(file, &sb) != 0 || S_ISREG(sb.st_mode))
        return false; /* a missing file is OpenSSL's to name */
    snprintf(err, errlen, "TLS: cannot load the %s %s: it is not a regular file", what, file);
    return true;
}

SSL_CTX *tls_ctx_new(const struct tls_files *f, char *err, size_t errlen)
{
    char why[TLS_WHY_MAX];

    if (f &&
        (tls_file_bad(f->ca_file, "CA file", err, errlen) ||
         tls_file_bad(f->cert_file, "certificate", err, errlen) ||
         tls_file_bad(f->key_file, "key", err, errlen)))
        return NULL;
    ERR_clear_error();
    SSL_CTX *ssl = SSL_CTX_new(TLS_client_method());
    if (!ssl) {
        snprintf(err, errlen, "TLS: %s", tls_reason(why, sizeof(why), "cannot make a context"));
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ssl, TLS1_2_VERSION);
    SSL_CTX_set_verify(ssl, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_default_passwd_cb(ssl, tls_no_passphrase);
    if (f && f->ca_file) {
        if (SSL_CTX_load_verify_locations(ssl, f->ca_file, NULL) != 1) {
            snprintf(err, errlen, "TLS: cannot load the CA file %s: %s", f->ca_file,
                     tls_reason(why, sizeof(why), "unreadable or not PEM"));
            goto fail;
        }
    } else if (SSL_CTX_set_default_verify_paths(ssl) != 1) {
        snprintf(err, errlen, "TLS: cannot load the system CA store: %s",
                 tls_reason(why, sizeof(why), "unknown error"));
        goto fail;
    }
    if (f && (f->cert_file || f->key_file)) {
        if (!f->cert_file || !f->key_file) {
            snprintf(err, errlen, "TLS: a client certificate needs both cert_file and key_file");
            goto fail;
        }
        if (SSL_CTX_use_certificate_chain_file(ssl, f->cert_file) != 1) {
            snprintf(err, errlen, "TLS: cannot load the certificate %s: %s", f->cert_file,
                     tls_file_reason(why, sizeof(why), "PEM certificate"));
            goto fail;
        }
        if (SSL_CTX_use_PrivateKey_file(ssl, f->key_file, SSL_FILETYPE_PEM) != 1) {
            if (ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH) {
                ERR_clear_error();
                snprintf(err, errlen,
                         "TLS: cannot load the key %s: it does not match the certificate %s",
                         f->key_file, f->cert_file);
                goto fail;
            }
            snprintf(err, errlen, "TLS: cannot load the key %s: %s", f->key_file,
                     tls_file_reason(why, sizeof(why), "unencrypted PEM private key"));
            goto fail;
        }
        if (SSL_CTX_check_private_key(ssl) != 1) {
            snprintf(err, errlen, "TLS: the key %s does not match the certificate %s", f->key_file,
                     f->cert_file);
            goto fail;
        }
    }
    return ssl;
fail:
    ERR_clear_error();
    SSL_CTX_free(ssl);
    return NULL;
}

int tls_set_peer(SSL *ssl, const char *name)
{
    if (iplit_is(name))
        return X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) == 1 ? 0 : -1;
    return SSL_set_tlsext_host_name(ssl, name) == 1 && SSL_set1_host(ssl, name) == 1 ? 0 : -1;
}

const char *tls_handshake_error(SSL *ssl, int e, char *buf, size_t cap)
{
    long v = SSL_get_verify_result(ssl);

    if (v != X509_V_OK) {
        ERR_clear_error();
        snprintf(buf, cap, "certificate verify failed: %s", X509_verify_cert_error_string(v));
    } else if (e == SSL_ERROR_SYSCALL && ERR_peek_last_error() == 0) {
        snprintf(buf, cap, "%s",
                 errno ? strerror(errno) : "the server closed the connection (is it TLS?)");
    } else {
        const char *r = tls_reason(buf, cap, "failed");
        if (r != buf)
            snprintf(buf, cap, "%s", r);
    }
    return buf;
}

/*
 * test_redis_tls.c — the TLS bridge (sidecar/backend/redis_tls.c) against an
 * in-process OpenSSL server on the same libev loop: a socketpair stands in
 * for the TCP connection, the bridge's plain end for hiredis' descriptor.
 * The server echoes; the test pushes 1 MiB through the plain end (far more
 * than the bridge's buffers: every WANT_READ / WANT_WRITE and full-buffer
 * path runs) and reads it back. Verification failures close the plain end
 * with the reason kept. Every loop run is bounded by a timer.
 */
#include <errno.h>
#include <ev.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backend/redis_tls.h"
#include "suites.h"

#define PAYLOAD (1u << 20)

struct server {
    SSL *ssl;
    int fd;
    ev_io w;
    unsigned char buf[4096];
    size_t len;
};

struct client {
    int fd;
    ev_io w;
    unsigned char *out, *in;
    size_t sent, got;
    bool eof;
};

static EVP_PKEY *key;
static X509 *cert;
static char ca_path[64];

/* A self-signed certificate for DNS:localhost, written to ca_path. */
static void make_cert(void)
{
    key = EVP_RSA_gen(2048);
    ck_assert_ptr_nonnull(key);
    cert = X509_new();
    ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert), -60);
    X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
    X509_set_pubkey(cert, key);
    X509_NAME *name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"localhost", -1, -1,
                               0);
    X509_set_issuer_name(cert, name);
    X509V3_CTX v3;
    X509V3_set_ctx_nodb(&v3);
    X509V3_set_ctx(&v3, cert, cert, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &v3, NID_subject_alt_name, "DNS:localhost");
    ck_assert_ptr_nonnull(ext);
    X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
    ck_assert_int_gt(X509_sign(cert, key, EVP_sha256()), 0);

    snprintf(ca_path, sizeof(ca_path), "/tmp/polygw-tls-ca-XXXXXX");
    int fd = mkstemp(ca_path);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "w");
    PEM_write_X509(f, cert);
    fclose(f);
}

static void free_cert(void)
{
    unlink(ca_path);
    X509_free(cert);
    EVP_PKEY_free(key);
}

/* The echo server: whatever it reads it writes back, one buffer at a time. */
static void server_on_io(struct ev_loop *loop, ev_io *w, int revents)
{
    struct server *s = w->data;
    int want = EV_READ;

    (void)revents;
    for (;;) {
        if (s->len) {
            int n = SSL_write(s->ssl, s->buf, (int)s->len);
            if (n <= 0) {
                int e = SSL_get_error(s->ssl, n);
                want = e == SSL_ERROR_WANT_WRITE ? EV_WRITE
                    : e == SSL_ERROR_WANT_READ   ? EV_READ
                                                 : 0;
                break;
            }
            s->len = 0;
        }
        int n = SSL_read(s->ssl, s->buf, sizeof(s->buf));
        if (n <= 0) {
            int e = SSL_get_error(s->ssl, n);
            want = e == SSL_ERROR_WANT_WRITE ? EV_WRITE : e == SSL_ERROR_WANT_READ ? EV_READ : 0;
            break;
        }
        s->len = (size_t)n;
    }
    ev_io_stop(loop, w);
    if (want) {
        ev_io_set(w, s->fd, want);
        ev_io_start(loop, w);
    }
}

static void client_on_io(struct ev_loop *loop, ev_io *w, int revents)
{
    struct client *c = w->data;

    if ((revents & EV_WRITE) && c->sent < PAYLOAD) {
        ssize_t n = send(c->fd, c->out + c->sent, PAYLOAD - c->sent, MSG_NOSIGNAL);
        if (n > 0)
            c->sent += (size_t)n;
    }
    if (revents & EV_READ) {
        ssize_t n = read(c->fd, c->in + c->got, PAYLOAD - c->got);
        if (n > 0)
            c->got += (size_t)n;
        else if (n == 0 || (errno != EAGAIN && errno != EINTR))
            c->eof = true;
    }
    int ev = c->eof ? 0 : (c->sent < PAYLOAD ? EV_WRITE : 0) | (c->got < PAYLOAD ? EV_READ : 0);
    ev_io_stop(loop, w);
    if (ev) {
        ev_io_set(w, c->fd, ev);
        ev_io_start(loop, w);
    } else {
        ev_break(loop, EVBREAK_ALL);
    }
}

static void on_deadline(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)w;
    (void)revents;
    ev_break(loop, EVBREAK_ALL);
}

/* Runs a bridge to the echo server; returns the client's state after at
 * most 10 s. `host` is what the bridge verifies. */
static void run_echo(const char *host, const struct rtls_opts *o, struct client *c,
                     const char **why)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    int sp[2];
    char err[256];

    make_cert();
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sp), 0);
    SSL_CTX *sctx = SSL_CTX_new(TLS_server_method());
    ck_assert_int_eq(SSL_CTX_use_certificate(sctx, cert), 1);
    ck_assert_int_eq(SSL_CTX_use_PrivateKey(sctx, key), 1);
    struct server s = { .ssl = SSL_new(sctx), .fd = sp[1] };
    SSL_set_fd(s.ssl, sp[1]);
    SSL_set_accept_state(s.ssl);
    ev_io_init(&s.w, server_on_io, sp[1], EV_READ);
    s.w.data = &s;
    ev_io_start(loop, &s.w);

    struct rtls_opts opts = o ? *o : (struct rtls_opts){ 0 };
    if (!opts.ca_file)
        opts.ca_file = ca_path;
    struct rtls_ctx *ctx = rtls_ctx_new(&opts, err, sizeof(err));
    ck_assert_msg(ctx != NULL, "%s", err);
    int fd = sp[0];
    struct rtls *t = rtls_new(loop, ctx, &fd, host, err, sizeof(err));
    ck_assert_msg(t != NULL, "%s", err);
    ck_assert_int_eq(fd, sp[0]); /* the same number, now the plain end */

    memset(c, 0, sizeof(*c));
    c->fd = fd;
    c->out = malloc(PAYLOAD);
    c->in = malloc(PAYLOAD);
    for (size_t i = 0; i < PAYLOAD; i++)
        c->out[i] = (unsigned char)(i * 7 + i / 251);
    ev_io_init(&c->w, client_on_io, fd, EV_READ | EV_WRITE);
    c->w.data = c;
    ev_io_start(loop, &c->w);
    ev_timer deadline;
    ev_timer_init(&deadline, on_deadline, 10., 0.);
    ev_timer_start(loop, &deadline);
    ev_run(loop, 0);

    static char reason[256];
    snprintf(reason, sizeof(reason), "%s", rtls_error(t) ? rtls_error(t) : "");
    *why = reason;
    ev_io_stop(loop, &c->w);
    ev_io_stop(loop, &s.w);
    rtls_free(t);
    close(fd);
    SSL_free(s.ssl);
    SSL_CTX_free(sctx);
    rtls_ctx_free(ctx);
    ev_loop_destroy(loop);
    free_cert();
}

START_TEST(test_redis_tls__echo_a_mebibyte)
{
    struct client c;
    const char *why;

    run_echo("localhost", NULL, &c, &why);
    ck_assert_msg(c.got == PAYLOAD && !c.eof, "got %zu of %u (eof %d): %s", c.got, PAYLOAD, c.eof,
                  why);
    ck_assert_mem_eq(c.in, c.out, PAYLOAD);
    ck_assert_str_eq(why, "");
    free(c.in);
    free(c.out);
}
END_TEST

START_TEST(test_redis_tls__wrong_name_closes_with_the_reason)
{
    struct client c;
    const char *why;

    run_echo("redis.example", NULL, &c, &why);
    ck_assert(c.eof);
    ck_assert_uint_eq(c.got, 0);
    ck_assert_msg(strstr(why, "certificate verify failed: hostname mismatch"), "%s", why);
    free(c.in);
    free(c.out);

    /* server_name overrides the host: the right one is accepted. */
    struct rtls_opts o = { .server_name = "localhost" };
    run_echo("10.1.2.3", &o, &c, &why);
    ck_assert_msg(c.got == PAYLOAD, "%s", why);
    free(c.in);
    free(c.out);
}
END_TEST

START_TEST(test_redis_tls__bad_files_name_the_file)
{
    char err[256];
    struct rtls_opts o = { .ca_file = "/nonexistent/ca.pem" };

    ck_assert_ptr_null(rtls_ctx_new(&o, err, sizeof(err)));
    ck_assert_msg(strstr(err, "cannot load the CA file /nonexistent/ca.pem"), "%s", err);
    o = (struct rtls_opts){ .cert_file = "/nonexistent/c.pem" };
    ck_assert_ptr_null(rtls_ctx_new(&o, err, sizeof(err)));
    ck_assert_msg(strstr(err, "needs both cert_file and key_file"), "%s", err);
    o = (struct rtls_opts){ .cert_file = "/nonexistent/c.pem", .key_file = "/nonexistent/k.pem" };
    ck_assert_ptr_null(rtls_ctx_new(&o, err, sizeof(err)));
    ck_assert_msg(strstr(err, "cannot load the certificate /nonexistent/c.pem"), "%s", err);
    struct rtls_ctx *ctx = rtls_ctx_new(NULL, err, sizeof(err)); /* the system store */
    ck_assert_msg(ctx != NULL, "%s", err);
    rtls_ctx_free(ctx);
}
END_TEST

Suite *redis_tls_suite(void)
{
    Suite *s = suite_create("redis_tls");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_redis_tls__echo_a_mebibyte);
    tcase_add_test(tc, test_redis_tls__wrong_name_closes_with_the_reason);
    tcase_add_test(tc, test_redis_tls__bad_files_name_the_file);
    suite_add_tcase(s, tc);
    return s;
}

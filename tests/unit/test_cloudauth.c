/* test_cloudauth.c — reading the answers of STS AssumeRoleWithWebIdentity
 * (XML, as documented in the STS API reference) and of a container
 * credentials endpoint (JSON, as EKS Pod Identity and ECS answer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "suites.h"
#include "upstream/cloudauth.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

static const char STS_OK[] =
    "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">\n"
    "  <AssumeRoleWithWebIdentityResult>\n"
    "    <SubjectFromWebIdentityToken>system:serviceaccount:ns:sa</SubjectFromWebIdentityToken>\n"
    "    <Credentials>\n"
    "      <SessionToken>AQoDYXdzEE0a8ANXXXXXXXXNO1ewxE5TijQyp+IEXAMPLE</SessionToken>\n"
    "      <SecretAccessKey>wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY</SecretAccessKey>\n"
    "      <Expiration>2014-10-24T23:00:23Z</Expiration>\n"
    "      <AccessKeyId>ASgeIAIOSFODNN7EXAMPLE</AccessKeyId>\n"
    "    </Credentials>\n"
    "  </AssumeRoleWithWebIdentityResult>\n"
    "</AssumeRoleWithWebIdentityResponse>\n";

static void free3(char *a, char *b, char *c)
{
    free(a);
    free(b);
    free(c);
}

START_TEST(sts_answer)
{
    char *id, *secret, *token, why[200];
    double exp = 0;
    ck_assert_int_eq(
        cloudauth_parse_sts(STS_OK, strlen(STS_OK), &id, &secret, &token, &exp, why, sizeof(why)),
        0);
    ck_assert_str_eq(id, "ASgeIAIOSFODNN7EXAMPLE");
    ck_assert_str_eq(secret, "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY");
    ck_assert_str_eq(token, "AQoDYXdzEE0a8ANXXXXXXXXNO1ewxE5TijQyp+IEXAMPLE");
    ck_assert(exp == 1414191623.0); /* 2014-10-24T23:00:23Z */
    free3(id, secret, token);
}
END_TEST

START_TEST(sts_errors)
{
    static const char *const bad[] = {
        "<ErrorResponse><Error><Type>Sender</Type><Code>InvalidIdentityToken</Code>"
        "<Message>No OpenIDConnect provider found</Message></Error></ErrorResponse>",
        "not xml at all",
        "<A><Credentials><AccessKeyId>K</AccessKeyId></Credentials></A>",
        "<A><AccessKeyId>K</AccessKeyId><SecretAccessKey>S</SecretAccessKey>"
        "<SessionToken>T</SessionToken><Expiration>tomorrow</Expiration></A>",
        "<A><AccessKeyId>K K</AccessKeyId><SecretAccessKey>S</SecretAccessKey>"
        "<SessionToken>T</SessionToken><Expiration>2014-10-24T23:00:23Z</Expiration></A>",
        "<!DOCTYPE a [<!ENTITY x SYSTEM \"file:///etc/passwd\">]><A><AccessKeyId>&x;"
        "</AccessKeyId></A>",
    };
    static const char *const want[] = { "InvalidIdentityToken: No OpenIDConnect",
                                        "not XML",
                                        "no usable",
                                        "Expiration",
                                        "no usable",
                                        "no usable" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *id = (char *)1, *secret = (char *)1, *token = (char *)1, why[200] = "";
        double exp = 0;
        ck_assert_int_eq(cloudauth_parse_sts(bad[i], strlen(bad[i]), &id, &secret, &token, &exp,
                                             why, sizeof(why)),
                         -1);
        ck_assert_ptr_null(id);
        ck_assert_ptr_null(secret);
        ck_assert_ptr_null(token);
        ck_assert_msg(strstr(why, want[i]), "case %zu: %s", i, why);
    }
}
END_TEST

START_TEST(container_answer)
{
    static const char ok[] =
        "{\"AccessKeyId\":\"ASIAEXAMPLE\",\"SecretAccessKey\":\"s\\/ecret\",\"Token\":\"tok\","
        "\"AccountId\":\"123456789012\",\"Expiration\":\"2026-12-05T10:00:00.123Z\"}";
    char *id, *secret, *token, why[200];
    double exp = 0;
    ck_assert_int_eq(
        cloudauth_parse_container(ok, strlen(ok), &id, &secret, &token, &exp, why, sizeof(why)), 0);
    ck_assert_str_eq(id, "ASIAEXAMPLE");
    ck_assert_str_eq(secret, "s/ecret");
    ck_assert_str_eq(token, "tok");
    ck_assert(exp == 1796464800.0);
    free3(id, secret, token);
    static const char *const bad[] = { "[1]", "{\"AccessKeyId\":\"A\"}", "{", "" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_int_eq(cloudauth_parse_container(bad[i], strlen(bad[i]), &id, &secret, &token,
                                                   &exp, why, sizeof(why)),
                         -1);
}
END_TEST

START_TEST(oauth_answer)
{
    static const char ok[] = "{\"access_token\":\"ya29.c.abc\",\"expires_in\":3599,"
                             "\"token_type\":\"Bearer\"}";
    char *token, why[200];
    double exp = 0;
    ck_assert_int_eq(cloudauth_parse_oauth(ok, strlen(ok), 1000.0, &token, &exp, why, sizeof(why)),
                     0);
    ck_assert_str_eq(token, "ya29.c.abc");
    ck_assert(exp == 4599.0);
    free(token);
    static const char *const bad[] = { "{\"access_token\":\"a b\",\"expires_in\":10}",
                                       "{\"access_token\":\"t\",\"expires_in\":-1}",
                                       "{\"access_token\":\"t\",\"expires_in\":\"60\"}",
                                       "{\"error\":\"invalid_grant\"}", "nope" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(
            cloudauth_parse_oauth(bad[i], strlen(bad[i]), 0, &token, &exp, why, sizeof(why)), -1);
        ck_assert_ptr_null(token);
    }
}
END_TEST

static char *b64url_decode(const char *s, size_t n, size_t *out_len)
{
    char *in = calloc(1, n + 4), *out = calloc(1, n + 4);
    size_t k = 0;
    ck_assert(in && out);
    for (size_t i = 0; i < n; i++)
        in[k++] = s[i] == '-' ? '+' : s[i] == '_' ? '/' : s[i];
    while (k % 4)
        in[k++] = '=';
    int len = EVP_DecodeBlock((unsigned char *)out, (unsigned char *)in, (int)k);
    ck_assert_int_ge(len, 0);
    for (size_t i = k; i > 0 && in[i - 1] == '='; i--)
        len--;
    free(in);
    out[len] = '\0';
    *out_len = (size_t)len;
    return out;
}

START_TEST(gcp_jwt_verifies)
{
    EVP_PKEY *pk = EVP_RSA_gen(2048);
    ck_assert_ptr_nonnull(pk);
    BIO *bio = BIO_new(BIO_s_mem());
    ck_assert_int_eq(PEM_write_bio_PrivateKey(bio, pk, NULL, NULL, 0, NULL, NULL), 1);
    char *pem = NULL;
    long n = BIO_get_mem_data(bio, &pem);
    char *key = strndup(pem, (size_t)n);
    struct gcp_creds g = { .client_email = "sa@p.iam.gserviceaccount.com",
                           .private_key = key,
                           .private_key_id = "kid-1",
                           .token_uri = "https://oauth2.googleapis.com/token" };
    char *jwt = cloudauth_gcp_jwt(&g, 1700000000);
    ck_assert_ptr_nonnull(jwt);
    const char *d1 = strchr(jwt, '.'), *d2 = strrchr(jwt, '.');
    ck_assert_ptr_ne(d1, d2);
    size_t hl, cl, sl;
    char *head = b64url_decode(jwt, (size_t)(d1 - jwt), &hl);
    char *claims = b64url_decode(d1 + 1, (size_t)(d2 - d1 - 1), &cl);
    char *sig = b64url_decode(d2 + 1, strlen(d2 + 1), &sl);
    ck_assert_str_eq(head, "{\"alg\":\"RS256\",\"typ\":\"JWT\",\"kid\":\"kid-1\"}");
    ck_assert_str_eq(claims,
                     "{\"iss\":\"sa@p.iam.gserviceaccount.com\",\"scope\":"
                     "\"https://www.googleapis.com/auth/cloud-platform\",\"aud\":"
                     "\"https://oauth2.googleapis.com/token\",\"iat\":1700000000,"
                     "\"exp\":1700003600}");
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    ck_assert_int_eq(EVP_DigestVerifyInit(md, NULL, EVP_sha256(), NULL, pk), 1);
    ck_assert_int_eq(EVP_DigestVerify(md, (unsigned char *)sig, sl, (const unsigned char *)jwt,
                                      (size_t)(d2 - jwt)),
                     1);
    EVP_MD_CTX_free(md);
    free(head);
    free(claims);
    free(sig);
    free(jwt);
    /* A quote in the e-mail is refused, never spliced into the claims. */
    g.client_email = "a\"b@p";
    ck_assert_ptr_null(cloudauth_gcp_jwt(&g, 1700000000));
    free(key);
    BIO_free(bio);
    EVP_PKEY_free(pk);
}
END_TEST

/* Runs `loop` until the token of `r` is there, or `wait_s` of real time
 * passed; then whether it is, with its value or the reason in `out`. */
static bool token_within(struct ev_loop *loop, struct cloudauth *r, double wait_s, char *out,
                         size_t cap)
{
    struct timespec t0, t;
    struct sigv4_creds c;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (cloudauth_get(r, &c, out, cap)) {
            snprintf(out, cap, "%s", c.session_token);
            return true;
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec + (t.tv_nsec - t0.tv_nsec) / 1e9 > wait_s)
            return false;
        ev_run(loop, EVRUN_ONCE);
    }
}

/* token_command on a loop that is not libev's default (which would reap
 * the child itself): the exit is asked of waitpid on a period. */
START_TEST(gcp_token_command_on_any_loop)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    char *argv[] = { "/bin/sh", "-c", "printf ' ya29.unit-1\\n'; echo noise >&2", NULL };
    struct gcp_creds g = { .token_command = argv, .n_token_command = 3 };
    char out[256], err[160];
    struct cloudauth *r = cloudauth_new_gcp(loop, NULL, &g, err, sizeof(err));

    ck_assert_ptr_nonnull(r);
    ck_assert_msg(token_within(loop, r, 10, out, sizeof(out)), "no token: %s", out);
    ck_assert_str_eq(out, "ya29.unit-1");
    ck_assert_uint_eq(cloudauth_get_stats(r)->fetches_ok, 1);
    cloudauth_free(r);

    char *fails[] = { "/bin/sh", "-c", "echo secret >&2; exit 7", NULL };
    g.token_command = fails;
    r = cloudauth_new_gcp(loop, NULL, &g, err, sizeof(err));
    ck_assert(!token_within(loop, r, 0.5, out, sizeof(out)));
    ck_assert_msg(strstr(out, "token_command: exited with status 7 (7 bytes on standard error") !=
                      NULL,
                  "%s", out);
    ck_assert_ptr_null(strstr(out, "secret"));
    cloudauth_free(r);

    char *lines[] = { "/bin/sh", "-c", "printf 'two words'", NULL };
    g.token_command = lines;
    r = cloudauth_new_gcp(loop, NULL, &g, err, sizeof(err));
    ck_assert(!token_within(loop, r, 0.5, out, sizeof(out)));
    ck_assert_msg(strstr(out, "is not an access token") != NULL, "%s", out);
    cloudauth_free(r);
    ev_loop_destroy(loop);
}
END_TEST

/* token_file: read at start, read again when it changes. */
START_TEST(gcp_token_file_followed)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    char path[] = "/tmp/pgw-token-XXXXXX", out[256], err[160];
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "ya29.file-a\n", 12), 12);
    close(fd);
    struct gcp_creds g = { .token_file = path };
    struct cloudauth *r = cloudauth_new_gcp(loop, NULL, &g, err, sizeof(err));
    ck_assert_msg(token_within(loop, r, 5, out, sizeof(out)), "no token: %s", out);
    ck_assert_str_eq(out, "ya29.file-a");
    FILE *f = fopen(path, "w");
    fputs("{\"access_token\": \"ya29.file-b\", \"expires_in\": 600}", f);
    fclose(f);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        ev_run(loop, EVRUN_ONCE);
        ck_assert(token_within(loop, r, 0, out, sizeof(out)));
        clock_gettime(CLOCK_MONOTONIC, &t);
        ck_assert_msg(t.tv_sec - t0.tv_sec < 5, "the new token was not read");
    } while (strcmp(out, "ya29.file-b") != 0);
    cloudauth_free(r);
    unlink(path);
    ev_loop_destroy(loop);
}
END_TEST

Suite *cloudauth_suite(void)
{
    Suite *s = suite_create("cloudauth");
    TCase *tc = tcase_create("answers");
    tcase_add_test(tc, sts_answer);
    tcase_add_test(tc, sts_errors);
    tcase_add_test(tc, container_answer);
    tcase_add_test(tc, oauth_answer);
    tcase_add_test(tc, gcp_jwt_verifies);
    tcase_add_test(tc, gcp_token_command_on_any_loop);
    tcase_add_test(tc, gcp_token_file_followed);
    suite_add_tcase(s, tc);
    return s;
}

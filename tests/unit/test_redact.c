/* test_redact.c — scrubbing of known secrets (sidecar/redact). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "call/redact.h"
#include "suites.h"
#include "upstream/upstream.h"

#define KEY "sk-test-0123456789abcdef"

/* redact_copy() of `in` must give `want` with `hits` replacements. */
static void check_copy(const struct redact *r, const char *in, const char *want, long hits)
{
    struct strbuf out;

    strbuf_init(&out);
    ck_assert_int_eq(redact_copy(r, in, strlen(in), &out), hits);
    ck_assert_str_eq(out.data, want);
    ck_assert_int_eq(redact_hit(r, in, strlen(in)), hits > 0);
    strbuf_fini(&out);
}

START_TEST(test_redact__exact_occurrences_anywhere)
{
    const char *keys[] = { KEY };
    struct redact *r = redact_new(keys, 1);

    ck_assert_ptr_nonnull(r);
    check_copy(r, "no secret here", "no secret here", 0);
    check_copy(r, "", "", 0);
    check_copy(r, KEY, REDACT_MARKER, 1);
    check_copy(r, "invalid key: Bearer " KEY, "invalid key: Bearer " REDACT_MARKER, 1);
    check_copy(r, KEY " at the start", REDACT_MARKER " at the start", 1);
    check_copy(r, "twice " KEY KEY " and " KEY ".",
               "twice " REDACT_MARKER REDACT_MARKER " and " REDACT_MARKER ".", 3);
    /* A prefix or a masked key is not the key. */
    check_copy(r, "sk-test-0123456789abcde", "sk-test-0123456789abcde", 0);
    check_copy(r, "sk-test-...cdef", "sk-test-...cdef", 0);
    redact_free(r);
}
END_TEST

START_TEST(test_redact__no_secrets_is_a_copy)
{
    const char *keys[] = { NULL, "" };
    struct redact *r = redact_new(keys, 2);
    struct strbuf out;

    ck_assert_ptr_nonnull(r);
    check_copy(r, "anything " KEY, "anything " KEY, 0);
    redact_free(r);
    /* So are zero secrets, and a NULL redactor. */
    r = redact_new(NULL, 0);
    ck_assert_ptr_nonnull(r);
    check_copy(r, "anything " KEY, "anything " KEY, 0);
    redact_free(r);
    /* A NULL redactor is the same. */
    strbuf_init(&out);
    ck_assert_int_eq(redact_copy(NULL, "abc", 3, &out), 0);
    ck_assert_str_eq(out.data, "abc");
    ck_assert(!redact_hit(NULL, "abc", 3));
    strbuf_fini(&out);
    redact_free(NULL);
}
END_TEST

START_TEST(test_redact__longest_secret_wins_and_duplicates_count_once)
{
    /* One key is a prefix of another, and a third overlaps the first. */
    const char *keys[] = { "sk-abc", "sk-abcdef", "sk-abc", "cdef-9" };
    struct redact *r = redact_new(keys, 4);

    check_copy(r, "[sk-abcdef]", "[" REDACT_MARKER "]", 1);
    check_copy(r, "[sk-abc]", "[" REDACT_MARKER "]", 1);
    /* "sk-abcdef-9": the longest secret at the first position wins; what
     * remains ("-9") holds no secret. */
    check_copy(r, "sk-abcdef-9", REDACT_MARKER "-9", 1);
    check_copy(r, "xcdef-9 sk-abc", "x" REDACT_MARKER " " REDACT_MARKER, 2);
    redact_free(r);
}
END_TEST

START_TEST(test_redact__many_secrets_and_binary_text)
{
    char *keys[40];
    char text[2048];
    size_t n = 0;
    struct strbuf out;

    for (int i = 0; i < 40; i++) {
        keys[i] = malloc(32);
        snprintf(keys[i], 32, "key-%02d-secret-value", i);
    }
    struct redact *r = redact_new((const char *const *)keys, 40);
    ck_assert_ptr_nonnull(r);
    /* The last secret, around a NUL and invalid bytes. */
    memcpy(text + n, "\xff\0", 2);
    n += 2;
    memcpy(text + n, keys[39], strlen(keys[39]));
    n += strlen(keys[39]);
    memcpy(text + n, "\0\xfe", 2);
    n += 2;
    strbuf_init(&out);
    ck_assert_int_eq(redact_copy(r, text, n, &out), 1);
    ck_assert_uint_eq(out.len, 4 + strlen(REDACT_MARKER));
    ck_assert_mem_eq(out.data, "\xff\0" REDACT_MARKER "\0\xfe", out.len);
    strbuf_fini(&out);
    redact_free(r);
    for (int i = 0; i < 40; i++)
        free(keys[i]);
}
END_TEST

START_TEST(test_redact__many_echoes_stay_linear)
{
    const char *keys[] = { KEY, "other-secret-that-never-appears" };
    struct redact *r = redact_new(keys, 2);
    size_t reps = 200000, klen = strlen(KEY);
    char *text = malloc(reps * (klen + 1));
    struct strbuf out;

    for (size_t i = 0; i < reps; i++) {
        memcpy(text + i * (klen + 1), KEY, klen);
        text[i * (klen + 1) + klen] = ' ';
    }
    strbuf_init(&out);
    /* ~5 MB holding 200k echoes: quadratic rescanning would take minutes
     * (the fork-mode test timeout fails it); linear takes milliseconds. */
    ck_assert_int_eq(redact_copy(r, text, reps * (klen + 1), &out), (long)reps);
    ck_assert_uint_eq(out.len, reps * (strlen(REDACT_MARKER) + 1));
    ck_assert_ptr_null(memmem(out.data, out.len, KEY, klen));
    strbuf_fini(&out);
    free(text);
    redact_free(r);
}
END_TEST

START_TEST(test_redact__string_hook)
{
    const char *keys[] = { KEY };
    struct redact *r = redact_new(keys, 1);
    const char *s = "clean";
    const char *orig = s;
    size_t n = 5;

    ck_assert_int_eq(redact_on_str(r, &s, &n), 0);
    ck_assert_ptr_eq(s, orig); /* untouched: no copy on the common path */
    ck_assert_uint_eq(n, 5);
    s = "got " KEY "!";
    n = strlen(s);
    ck_assert_int_eq(redact_on_str(r, &s, &n), 0);
    ck_assert_uint_eq(n, strlen("got " REDACT_MARKER "!"));
    ck_assert_mem_eq(s, "got " REDACT_MARKER "!", n);

    /* Through the transcoder: a key written with JSON escapes is caught
     * too, in values and in keys. */
    static const char json[] = "{\"m\":\"sk-test-0123456789abcdef\\u0021\","
                               "\"sk\\u002dtest-0123456789abcdef\":1}";
    msgpack_sbuffer sb;
    msgpack_packer pk;
    const struct transcode_j2m opt = { .on_str = redact_on_str, .ud = r };
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    ck_assert_int_eq(transcode_json_to_msgpack(json, strlen(json), &pk, &opt, NULL, 0), 0);
    ck_assert_ptr_null(memmem(sb.data, sb.size, KEY, strlen(KEY)));
    ck_assert_ptr_nonnull(memmem(sb.data, sb.size, REDACT_MARKER "!", strlen(REDACT_MARKER) + 1));
    msgpack_sbuffer_destroy(&sb);
    redact_free(r);
}
END_TEST

/* A URL's credentials in libcurl's error text never reach a caller. */
START_TEST(test_redact__userinfo_of_urls_in_curl_errors)
{
    static const struct {
        const char *in, *want;
    } cases[] = {
        { "Unsupported proxy syntax in 'http://bob:pr0xyPASS@127.0.0.1:99999'",
          "Unsupported proxy syntax in 'http://[redacted]@127.0.0.1:99999'" },
        { "Could not resolve proxy: socks5h://u@proxy.corp",
          "Could not resolve proxy: "
          "socks5h://[redacted]@proxy.corp" },
        { "a http://x:y@h/p?q=r@s b https://a:b@c",
          "a http://[redacted]@h/p?q=r@s b "
          "https://[redacted]@c" },
        { "Failed to connect to 127.0.0.1 port 1080", "Failed to connect to 127.0.0.1 port 1080" },
        { "user@host no scheme", "user@host no scheme" },
        { "http://host/path@x", "http://host/path@x" },
        { "", "" },
    };
    char buf[256];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(buf, sizeof(buf), "%s", cases[i].in);
        upstream_scrub_userinfo(buf, sizeof(buf));
        ck_assert_str_eq(buf, cases[i].want);
    }
    /* No room for the mask: the text ends before the credentials. */
    char small[20] = "x http://a:b@h";
    upstream_scrub_userinfo(small, 18);
    ck_assert_str_eq(small, "x http://");
}
END_TEST

Suite *redact_suite(void)
{
    Suite *s = suite_create("redact");
    TCase *tc = tcase_create("core");
    /* Megabyte inputs (and a locale compiled by localedef) under the
     * sanitizers on a loaded machine take longer than Check's 4 s default. */
    tcase_set_timeout(tc, 60);

    tcase_add_test(tc, test_redact__exact_occurrences_anywhere);
    tcase_add_test(tc, test_redact__no_secrets_is_a_copy);
    tcase_add_test(tc, test_redact__longest_secret_wins_and_duplicates_count_once);
    tcase_add_test(tc, test_redact__many_secrets_and_binary_text);
    tcase_add_test(tc, test_redact__many_echoes_stay_linear);
    tcase_add_test(tc, test_redact__string_hook);
    tcase_add_test(tc, test_redact__userinfo_of_urls_in_curl_errors);
    suite_add_tcase(s, tc);
    return s;
}

/* test_log.c — the JSON-lines logger (sidecar/log): every line is valid
 * UTF-8 and valid JSON whatever a string field holds. */
#include <check.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "suites.h"
#include "utf8.h"

/* The line log_event writes for one string field `v`, read back from a
 * pipe put in place of stderr. */
static void log_line(const char *v, char *out, size_t cap)
{
    int fds[2], saved = dup(STDERR_FILENO);

    ck_assert_int_eq(pipe(fds), 0);
    ck_assert_int_ge(saved, 0);
    ck_assert_int_eq(dup2(fds[1], STDERR_FILENO), STDERR_FILENO);
    log_event(LOG_INFO, "call", "scope", LOG_S, v, NULL);
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(fds[1]);
    ssize_t n = read(fds[0], out, cap - 1);
    close(fds[0]);
    ck_assert_int_gt(n, 0);
    out[n] = '\0';
}

START_TEST(test_log__strings_stay_utf8)
{
    char line[8192];
    const char *tail;

    log_line("a\xFF\xFE"
             "b\xE2\x82",
             line, sizeof(line));
    ck_assert_uint_eq(utf8_valid_prefix(line, strlen(line)), strlen(line));
    tail = strstr(line, "\"scope\":");
    ck_assert_ptr_nonnull(tail);
    ck_assert_str_eq(tail,
                     "\"scope\":\"a\xEF\xBF\xBD\xEF\xBF\xBD"
                     "b\xEF\xBF\xBD\"}\n");

    log_line("\xE2\x82\xAC \"q\"\n", line, sizeof(line));
    tail = strstr(line, "\"scope\":");
    ck_assert_str_eq(tail, "\"scope\":\"\xE2\x82\xAC \\\"q\\\"\\n\"}\n");

    /* A field longer than the line: cut, never inside a character. */
    static char big[6001];
    for (size_t i = 0; i + 3 <= 6000; i += 3)
        memcpy(big + i, "\xE2\x82\xAC", 3);
    log_line(big, line, sizeof(line));
    ck_assert_uint_eq(utf8_valid_prefix(line, strlen(line)), strlen(line));
}
END_TEST

Suite *log_suite(void)
{
    Suite *s = suite_create("log");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_log__strings_stay_utf8);
    suite_add_tcase(s, tc);
    return s;
}

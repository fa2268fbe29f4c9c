/*
 * test_raw.c — the HTTP front's reading of passthrough and Responses
 * follow-up requests (sidecar/http/raw.c): which follow-up a path names
 * (the response itself, its cancel or input_items), the 404 and 405
 * answers for the rest, and the query that makes a retrieve a resumed
 * event stream; and the sub-paths a passthrough call may add.
 */
#include <http_parser.h>
#include <string.h>

#include "call/rawcall.h"
#include "core/config.h"
#include "http/raw.h"
#include "suites.h"

static struct config_capability responses_cap(bool raw)
{
    struct config_capability cap;

    memset(&cap, 0, sizeof(cap));
    strcpy(cap.path, "/responses");
    cap.raw = raw;
    return cap;
}

static int followup(const struct config_capability *cap, const char *p, int method, size_t *off,
                    size_t *len)
{
    return httpraw_followup(cap, p, strlen(p), method, off, len);
}

START_TEST(test_raw__followup_names_the_response_or_its_sub_resource)
{
    struct config_capability cap = responses_cap(false);
    size_t off = 0, len = 0;

    ck_assert_int_eq(followup(&cap, "/responses/resp_1", HTTP_GET, &off, &len), 1);
    ck_assert_uint_eq(off, 11);
    ck_assert_uint_eq(len, 6);
    ck_assert_int_eq(followup(&cap, "/responses/resp_1", HTTP_DELETE, &off, &len), 1);
    ck_assert_int_eq(followup(&cap, "/responses/resp_1/cancel", HTTP_POST, &off, &len), 2);
    ck_assert_uint_eq(len, 6);
    ck_assert_int_eq(followup(&cap, "/responses/resp_1/input_items", HTTP_GET, &off, &len), 2);
    /* Another method: 405; another sub-path or a bad id: 404. */
    ck_assert_int_eq(followup(&cap, "/responses/resp_1", HTTP_POST, &off, &len), -2);
    ck_assert_int_eq(followup(&cap, "/responses/resp_1/cancel", HTTP_GET, &off, &len), -2);
    ck_assert_int_eq(followup(&cap, "/responses/resp_1/nothing", HTTP_GET, &off, &len), -1);
    ck_assert_int_eq(followup(&cap, "/responses/.hidden", HTTP_GET, &off, &len), -1);
    /* Not below the capability's path, or a passthrough capability: no
     * follow-up at all. */
    ck_assert_int_eq(followup(&cap, "/responses", HTTP_GET, &off, &len), 0);
    ck_assert_int_eq(followup(&cap, "/responses/", HTTP_GET, &off, &len), 0);
    ck_assert_int_eq(followup(&cap, "/responsesX/resp_1", HTTP_GET, &off, &len), 0);
    struct config_capability raw = responses_cap(true);
    ck_assert_int_eq(followup(&raw, "/responses/resp_1", HTTP_GET, &off, &len), 0);
}
END_TEST

START_TEST(test_raw__stream_true_alone_resumes_the_stream)
{
    static const struct {
        const char *q;
        bool stream;
    } cases[] = {
        { "stream=true", true },
        { "stream=true&starting_after=7", true },
        { "starting_after=7&stream=true", true },
        { "include[]=a&stream=true&x=", true },
        { "stream=false", false },
        { "stream=True", false },
        { "stream=truex", false },
        { "xstream=true", false },
        { "stream=", false },
        { "stream", false },
        { "", false },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        ck_assert_msg(httpraw_stream_query(cases[i].q, strlen(cases[i].q)) == cases[i].stream, "%s",
                      cases[i].q);
    ck_assert(!httpraw_stream_query(NULL, 0));
    /* Bounded by n: a longer buffer's rest is not read. */
    ck_assert(!httpraw_stream_query("stream=truestream=true", 10));
    ck_assert(httpraw_stream_query("a&stream=true&b", 13));
}
END_TEST

START_TEST(test_raw__no_dot_segment_hides_behind_an_encoded_separator)
{
    static const char *const refused[] = {
        "/..",        "/a/../b",    "/%2e%2E/x",  "/abc%2F..%2Fresponses",
        "/abc%2f..",  "/%5C..%5Cx", "/a%5c.%5cb", "/a\\..\\b",
        "/..%2Fchat", "/x/%2e%2f",  "/.?q",
    };
    static const char *const allowed[] = {
        "",      "?a=1", "/file-abc", "/file-abc/content", "/org%2Fmodel",
        "/a..b", "/...", "/a%2F.b",   "/x?next=/../y",     "/%2",
    };

    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
        ck_assert_msg(raw_call_suffix_problem(refused[i], strlen(refused[i])) != NULL, "%s",
                      refused[i]);
    for (size_t i = 0; i < sizeof(allowed) / sizeof(allowed[0]); i++)
        ck_assert_msg(raw_call_suffix_problem(allowed[i], strlen(allowed[i])) == NULL, "%s: %s",
                      allowed[i], raw_call_suffix_problem(allowed[i], strlen(allowed[i])));
}
END_TEST

Suite *raw_suite(void)
{
    Suite *s = suite_create("raw");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_raw__followup_names_the_response_or_its_sub_resource);
    tcase_add_test(tc, test_raw__stream_true_alone_resumes_the_stream);
    tcase_add_test(tc, test_raw__no_dot_segment_hides_behind_an_encoded_separator);
    suite_add_tcase(s, tc);
    return s;
}

/* test_awsrole.c — reading the answers of STS AssumeRoleWithWebIdentity
 * (XML, as documented in the STS API reference) and of a container
 * credentials endpoint (JSON, as EKS Pod Identity and ECS answer). */
#include <stdlib.h>
#include <string.h>

#include "suites.h"
#include "upstream/awsrole.h"

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
    ck_assert_int_eq(awsrole_parse_sts(STS_OK, strlen(STS_OK), &id, &secret, &token, &exp, why,
                                       sizeof(why)),
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
    static const char *const want[] = { "InvalidIdentityToken: No OpenIDConnect", "not XML",
                                        "no usable", "Expiration", "no usable", "no usable" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *id = (char *)1, *secret = (char *)1, *token = (char *)1, why[200] = "";
        double exp = 0;
        ck_assert_int_eq(awsrole_parse_sts(bad[i], strlen(bad[i]), &id, &secret, &token, &exp, why,
                                           sizeof(why)),
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
    ck_assert_int_eq(awsrole_parse_container(ok, strlen(ok), &id, &secret, &token, &exp, why,
                                             sizeof(why)),
                     0);
    ck_assert_str_eq(id, "ASIAEXAMPLE");
    ck_assert_str_eq(secret, "s/ecret");
    ck_assert_str_eq(token, "tok");
    ck_assert(exp == 1796464800.0);
    free3(id, secret, token);
    static const char *const bad[] = { "[1]", "{\"AccessKeyId\":\"A\"}", "{", "" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_int_eq(awsrole_parse_container(bad[i], strlen(bad[i]), &id, &secret, &token, &exp,
                                                 why, sizeof(why)),
                         -1);
}
END_TEST

Suite *awsrole_suite(void)
{
    Suite *s = suite_create("awsrole");
    TCase *tc = tcase_create("answers");
    tcase_add_test(tc, sts_answer);
    tcase_add_test(tc, sts_errors);
    tcase_add_test(tc, container_answer);
    suite_add_tcase(s, tc);
    return s;
}

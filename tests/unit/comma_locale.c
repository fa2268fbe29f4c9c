/* comma_locale.c — see comma_locale.h. */
#include "comma_locale.h"

#include <check.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int comma_locale_on(const char *who, char *dir, size_t dirlen)
{
    char cmd[256];

    ck_assert_uint_ge(dirlen, 32);
    snprintf(dir, dirlen, "/tmp/polygw-locale-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(cmd, sizeof(cmd), "localedef -i de_DE -f UTF-8 %s/de_DE.UTF-8 >/dev/null 2>&1", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "%s: no localedef or no de_DE source: comma locale not checked\n", who);
        return -1;
    }
    setenv("LOCPATH", dir, 1);
    ck_assert_ptr_nonnull(setlocale(LC_NUMERIC, "de_DE.UTF-8"));
    ck_assert_str_eq(localeconv()->decimal_point, ",");
    return 0;
}

void comma_locale_off(const char *dir)
{
    char cmd[256];

    setlocale(LC_NUMERIC, "C");
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}

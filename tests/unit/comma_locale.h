/*
 * comma_locale.h — a locale whose decimal point is ',' for the suites that
 * check number formatting and parsing do not follow LC_NUMERIC. de_DE is
 * compiled with localedef (the locales package, installed by tests/deps.sh)
 * into a temporary directory, so the machine needs no generated locales.
 */
#ifndef POLYGW_TEST_COMMA_LOCALE_H
#define POLYGW_TEST_COMMA_LOCALE_H

#include <stddef.h>

/* Compiles de_DE.UTF-8 into a new temporary directory (its path written to
 * `dir`, `dirlen` bytes at least 32) and switches LC_NUMERIC to it. Returns
 * 0, or -1 when localedef or the de_DE source is missing (a line on stderr
 * names `who`; LC_NUMERIC is unchanged). Either way call comma_locale_off. */
int comma_locale_on(const char *who, char *dir, size_t dirlen);

/* Back to the C locale; removes the directory comma_locale_on made. */
void comma_locale_off(const char *dir);

#endif /* POLYGW_TEST_COMMA_LOCALE_H */

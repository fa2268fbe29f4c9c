/* expo_check.c — see expo_check.h. */
#include "expo_check.h"

#include <check.h>
#include <ctype.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *expo_text(char *s, size_t len)
{
    ck_assert_ptr_nonnull(s);
    ck_assert_uint_eq(strlen(s), len);
    return s;
}

void expo_assert_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)) != NULL; p++) {
        if ((p == text || p[-1] == '\n') && p[n] == '\n')
            return;
    }
    ck_abort_msg("no line '%s' in:\n%s", line, text);
}

static bool is_name(const char *s, size_t n)
{
    if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == ':'))
        return false;
    for (size_t i = 1; i < n; i++) {
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == ':'))
            return false;
    }
    return true;
}

static bool parse_value(const char *s, double *v)
{
    char *end;
    if (strcmp(s, "+Inf") == 0 || strcmp(s, "-Inf") == 0 || strcmp(s, "NaN") == 0) {
        *v = strcmp(s, "NaN") == 0 ? NAN : s[0] == '+' ? INFINITY : -INFINITY;
        return true;
    }
    *v = strtod(s, &end);
    return end != s && *end == '\0';
}

struct hist_state {
    char series[512]; /* the labels without le, of the buckets being read */
    double last_cum;
    bool saw_inf;
    double inf;
};

size_t expo_check(const char *text)
{
    char family[128] = "", type[16] = "";
    size_t seen_cap = 1 << 20;
    char *seen = calloc(1, seen_cap); /* " name name ... " */
    ck_assert_ptr_nonnull(seen);
    struct hist_state h = { 0 };
    size_t samples = 0;
    bool expect_type = false;

    ck_assert_msg(text[0] && text[strlen(text) - 1] == '\n', "must end with a newline");
    for (const char *line = text; *line;) {
        const char *eol = strchr(line, '\n');
        char buf[2048];
        size_t n = (size_t)(eol - line);
        ck_assert_uint_lt(n, sizeof(buf));
        memcpy(buf, line, n);
        buf[n] = '\0';
        line = eol + 1;

        if (strncmp(buf, "# HELP ", 7) == 0) {
            const char *name = buf + 7, *sp = strchr(name, ' ');
            ck_assert_msg(sp && is_name(name, (size_t)(sp - name)), "bad HELP: %s", buf);
            ck_assert_msg(!expect_type, "HELP without TYPE before: %s", buf);
            snprintf(family, sizeof(family), "%.*s", (int)(sp - name), name);
            char key[140];
            snprintf(key, sizeof(key), " %s ", family);
            ck_assert_msg(strstr(seen, key) == NULL, "family %s declared twice", family);
            if (!seen[0])
                seen[0] = ' ';
            ck_assert_uint_lt(strlen(seen) + strlen(key), seen_cap);
            strcat(seen, key + 1);
            for (const char *p = sp + 1; *p; p++) /* only \\ and \n escapes in HELP */
                if (*p == '\\') {
                    ck_assert_msg(p[1] == '\\' || p[1] == 'n', "bad escape in HELP: %s", buf);
                    p++;
                }
            expect_type = true;
            continue;
        }
        if (strncmp(buf, "# TYPE ", 7) == 0) {
            char name[128];
            ck_assert_msg(expect_type, "TYPE without HELP: %s", buf);
            ck_assert_int_eq(sscanf(buf + 7, "%127s %15s", name, type), 2);
            ck_assert_str_eq(name, family);
            ck_assert_msg(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0 ||
                              strcmp(type, "histogram") == 0,
                          "type %s", type);
            if (strcmp(type, "counter") == 0)
                ck_assert_msg(strlen(family) > 6 &&
                                  strcmp(family + strlen(family) - 6, "_total") == 0,
                              "counter %s without _total", family);
            expect_type = false;
            h = (struct hist_state){ 0 };
            continue;
        }
        ck_assert_msg(buf[0] != '#', "unexpected comment: %s", buf);
        ck_assert_msg(!expect_type && family[0], "sample outside a family: %s", buf);

        /* name{labels} value */
        char *p = buf;
        while (*p && *p != '{' && *p != ' ')
            p++;
        char name[160];
        snprintf(name, sizeof(name), "%.*s", (int)(p - buf), buf);
        ck_assert_msg(is_name(name, strlen(name)), "bad name: %s", buf);
        char labels[512] = "", le[256] = "";
        if (*p == '{') {
            p++;
            while (*p != '}') {
                char *start = p, *eq = strchr(p, '=');
                ck_assert_msg(eq && eq[1] == '"', "bad label in: %s", buf);
                ck_assert_msg(is_name(start, (size_t)(eq - start)), "bad label name: %s", buf);
                bool is_le = eq - start == 2 && strncmp(start, "le", 2) == 0;
                char value[256];
                size_t vn = 0;
                for (p = eq + 2; *p != '"'; p++) {
                    ck_assert_msg(*p, "unterminated label value: %s", buf);
                    if (*p == '\\') {
                        p++;
                        ck_assert_msg(*p == '\\' || *p == '"' || *p == 'n', "bad escape: %s", buf);
                    }
                    ck_assert_uint_lt(vn, sizeof(value) - 1);
                    value[vn++] = *p;
                }
                value[vn] = '\0';
                if (is_le) {
                    snprintf(le, sizeof(le), "%s", value);
                } else {
                    size_t at = strlen(labels);
                    snprintf(labels + at, sizeof(labels) - at, "%.*s=%s,", (int)(eq - start), start,
                             value);
                }
                p++;
                ck_assert_msg(*p == ',' || *p == '}', "bad label list: %s", buf);
                if (*p == ',')
                    p++;
            }
            p++;
        }
        ck_assert_msg(*p == ' ', "no value: %s", buf);
        double v;
        ck_assert_msg(parse_value(p + 1, &v), "bad value: %s", buf);
        samples++;

        if (strcmp(type, "histogram") != 0) {
            ck_assert_str_eq(name, family);
            continue;
        }
        size_t fl = strlen(family);
        ck_assert_msg(strncmp(name, family, fl) == 0, "%s outside %s", name, family);
        const char *suffix = name + fl;
        if (strcmp(suffix, "_bucket") == 0) {
            double bound;
            ck_assert_msg(le[0] && parse_value(le, &bound), "bucket without le: %s", buf);
            if (strcmp(h.series, labels) != 0 || h.saw_inf) {
                ck_assert_msg(!h.series[0] || h.saw_inf, "series ended before +Inf: %s", buf);
                snprintf(h.series, sizeof(h.series), "%s", labels);
                h.last_cum = 0;
                h.saw_inf = false;
            }
            ck_assert_msg(v >= h.last_cum, "buckets not cumulative: %s", buf);
            h.last_cum = v;
            if (isinf(bound)) {
                h.saw_inf = true;
                h.inf = v;
            }
        } else if (strcmp(suffix, "_count") == 0) {
            ck_assert_msg(h.saw_inf && strcmp(h.series, labels) == 0, "_count before +Inf: %s",
                          buf);
            ck_assert_msg(v == h.inf, "+Inf bucket %g != _count %g: %s", h.inf, v, buf);
        } else {
            ck_assert_msg(strcmp(suffix, "_sum") == 0, "unexpected histogram series %s", name);
        }
    }
    ck_assert_msg(!expect_type, "HELP without TYPE at the end");
    free(seen);
    return samples;
}

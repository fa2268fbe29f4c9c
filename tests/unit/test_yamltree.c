/* test_yamltree.c — the YAML node tree and scalar resolution. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "suites.h"
#include "core/yamltree.h"

static struct ynode *parse_ok(const char *yaml)
{
    struct yamltree_error err;
    struct ynode *root = NULL;

    ck_assert_msg(yamltree_parse(yaml, strlen(yaml), 8, &root, &err) == 0, "%s", err.text);
    return root;
}

static void parse_fails(const char *yaml, unsigned line, const char *needle)
{
    struct yamltree_error err;
    struct ynode *root = NULL;

    ck_assert_int_eq(yamltree_parse(yaml, strlen(yaml), 8, &root, &err), -EINVAL);
    ck_assert_ptr_null(root);
    ck_assert_uint_eq(err.line, line);
    ck_assert_msg(strstr(err.text, needle), "'%s' not in '%s'", needle, err.text);
}

START_TEST(test_yamltree__builds_maps_lists_and_marks_duplicate_keys)
{
    struct ynode *root = parse_ok("a: [1, 'two']\nb: {c: ~}\na: again\n");

    ck_assert_int_eq(root->kind, YN_MAP);
    ck_assert_uint_eq(root->n_kids, 6);
    const struct ynode *list = root->kids[1];
    ck_assert_int_eq(list->kind, YN_SEQ);
    ck_assert_uint_eq(list->n_kids, 2);
    ck_assert(list->kids[0]->plain);
    ck_assert(!list->kids[1]->plain);
    ck_assert_str_eq(list->kids[1]->text, "two");
    ck_assert(ynode_is_null(root->kids[3]->kids[1]));
    ck_assert_uint_eq(root->kids[0]->dup_line, 0);
    ck_assert_uint_eq(root->kids[4]->dup_line, 1); /* the second "a" points at the first */
    ck_assert_uint_eq(root->kids[4]->line, 3);
    ynode_free(root);
    ck_assert_ptr_null(parse_ok(""));
    ck_assert_ptr_null(parse_ok("~\n"));
}
END_TEST

START_TEST(test_yamltree__refuses_what_the_config_never_uses)
{
    struct yamltree_error err;
    struct ynode *root = NULL;

    parse_fails("a: &x 1\nb: 2\n", 1, "anchors");
    parse_fails("a: 1\nb: *x\n", 2, "aliases");
    parse_fails("a: !!str 1\n", 1, "tags");
    parse_fails("a: 1\n---\nb: 2\n", 2, "only one YAML document");
    parse_fails("a: [[[[[[[[[[1]]]]]]]]]]\n", 1, "nested deeper than 8");
    ck_assert_int_eq(yamltree_parse("a: [1\n", 6, 8, &root, &err), -EINVAL);
    ck_assert_uint_gt(err.col, 0);
    ck_assert_msg(strstr(err.text, "YAML syntax error"), "%s", err.text);
    ck_assert_int_eq(yamltree_parse("a:\n\tb: 1\n", 9, 8, &root, &err), -EINVAL);
    ck_assert_msg(strstr(err.text, "spaces, not tabs"), "%s", err.text);
}
END_TEST

START_TEST(test_yamltree__resolves_plain_scalars_by_the_core_schema)
{
    struct ynode *root = parse_ok("[0x1F, 0o17, -12, 9223372036854775808, 1.5e3, .inf, .nan, "
                                  "true, FALSE, '12', yes]\n");
    int64_t i;
    double d;

    ck_assert_int_eq(ynode_int(root->kids[0], &i), 1);
    ck_assert_int_eq(i, 31);
    ck_assert_int_eq(ynode_int(root->kids[1], &i), 1);
    ck_assert_int_eq(i, 15);
    ck_assert_int_eq(ynode_int(root->kids[2], &i), 1);
    ck_assert_int_eq(i, -12);
    ck_assert_int_eq(ynode_int(root->kids[3], &i), -1); /* does not fit */
    ck_assert_int_eq(ynode_float(root->kids[4], &d), 1);
    ck_assert(d == 1500.0);
    ck_assert_int_eq(ynode_float(root->kids[5], &d), 1);
    ck_assert(isinf(d));
    ck_assert_int_eq(ynode_float(root->kids[6], &d), 1);
    ck_assert(isnan(d));
    ck_assert_int_eq(ynode_bool(root->kids[7]), 1);
    ck_assert_int_eq(ynode_bool(root->kids[8]), 0);
    ck_assert_int_eq(ynode_int(root->kids[9], &i), 0); /* quoted: a string */
    ck_assert_str_eq(ynode_what(root->kids[9]), "a string");
    ck_assert_int_eq(ynode_bool(root->kids[10]), -1); /* YAML 1.1's yes is a string */
    ck_assert_str_eq(ynode_what(root), "a list");
    ynode_free(root);
}
END_TEST

Suite *yamltree_suite(void)
{
    Suite *s = suite_create("yamltree");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_yamltree__builds_maps_lists_and_marks_duplicate_keys);
    tcase_add_test(tc, test_yamltree__refuses_what_the_config_never_uses);
    tcase_add_test(tc, test_yamltree__resolves_plain_scalars_by_the_core_schema);
    suite_add_tcase(s, tc);
    return s;
}

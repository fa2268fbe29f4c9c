/*
 * yamltree.h — one YAML document as a tree of nodes, for the configuration
 * loader (config.c), which walks it against its field tables.
 *
 * The parse keeps what the loader needs to report a precise file:line and
 * rejects what the configuration never uses: anchors, aliases, tags, more
 * than one document, nesting deeper than the caller's bound. Duplicate map
 * keys are marked (dup_line), not rejected, so the walk can name their key
 * path. Scalar text is wiped before it is freed (it may be a pasted
 * secret), libyaml's copy too.
 */
#ifndef POLYGW_YAMLTREE_H
#define POLYGW_YAMLTREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ynode_kind { YN_SCALAR, YN_MAP, YN_SEQ };

/* One YAML node. A map's kids alternate key, value. Scalar text is always
 * NUL-terminated (it may also contain NULs from "\0" escapes: `len` is the
 * truth). `plain` scalars are subject to null/bool/number resolution (YAML
 * 1.2 core schema); quoted ones are always strings. */
struct ynode {
    enum ynode_kind kind;
    bool plain;
    unsigned line, col; /* 1-based */
    unsigned dup_line;  /* a map key repeating an earlier key of the
                                * same map: that key's line; else 0 */
    char *text;
    size_t len;
    struct ynode **kids;
    size_t n_kids, cap_kids;
};

/* Why a parse failed: `text` without the file name, at line:col when
 * known (0 = unknown). */
struct yamltree_error {
    unsigned line, col;
    bool nomem;
    char text[512];
};

/* Parses yaml[0..len) (borrowed) into *root (returns owned; free with
 * ynode_free). An empty stream or a document that is only a null yields
 * *root == NULL (the caller reports "empty"). Containers nested deeper than
 * `max_depth` are refused. Returns 0, -EINVAL with `err` filled, or
 * -ENOMEM (err->nomem). */
int yamltree_parse(const char *yaml, size_t len, unsigned max_depth, struct ynode **root,
                   struct yamltree_error *err);

/* Frees a tree (NULL ok), wiping scalar text. */
void ynode_free(struct ynode *n);

/* Scalar resolution, YAML 1.2 core schema, plain scalars only (a quoted
 * scalar is always a string). */
bool ynode_is_null(const struct ynode *n); /* NULL, ~, null, empty */
int ynode_bool(const struct ynode *n);     /* 1, 0, or -1: not a boolean */

/* [-+]?[0-9]+ | 0o[0-7]+ | 0x[0-9a-fA-F]+ ; 1 = ok, 0 = not an integer,
 * -1 = an integer that does not fit in int64_t. */
int ynode_int(const struct ynode *n, int64_t *out);

/* Integer or [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)? or
 * [-+]?.inf / .nan; 1 = ok (may be non-finite), 0 = not a number. */
int ynode_float(const struct ynode *n, double *out);

/* "a map", "a list", "a string", "null", "a boolean", "a number". */
const char *ynode_what(const struct ynode *n);

#endif /* POLYGW_YAMLTREE_H */

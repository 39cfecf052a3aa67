/*
 * test_easydel_tree.c — the older EasyDeL save's optimizer structure reader
 * (format/easydel_tree.c) on pickles built here opcode by opcode, in the
 * shape jaxlib's PyTreeDef::ToPickle gives them (NEWOBJ of the class with
 * (), BUILD of (registry, traversal)): leaf key paths and parameter offsets,
 * the step, and each check of the traversal. Whole saves written by Python's
 * pickle are tests/e2e/test_easydel.sh's.
 */
#include "format/easydel_tree.h"

#include "common/error.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/support/pkbuild.h"

/* What one traversal entry's node_data / custom type is. */
typedef enum { D_NONE, D_ADAM, D_VARSTATE, D_KEYS_W, D_KEYS_DOT } data_kind;

typedef struct {
    int kind, arity;
    data_kind data;
    int leaves, nodes;
} entry;

static void node(buf *p, const entry *e)
{
    put8(p, '(');
    p_int(p, e->kind);
    p_int(p, e->arity);
    switch (e->data) {
    case D_NONE: put8(p, 'N'); put8(p, 'N'); break;
    case D_ADAM: p_glob(p, "optax._src.transform", "ScaleByAdamState"); put8(p, 'N'); break;
    case D_VARSTATE:
        put8(p, '(');
        p_glob(p, "flax.nnx.variablelib", "Param");
        put8(p, ')');
        put8(p, 't');
        p_glob(p, "flax.nnx.variablelib", "VariableState");
        break;
    case D_KEYS_W:
    case D_KEYS_DOT:
        put8(p, '(');
        p_str(p, e->data == D_KEYS_W ? "w" : "a.b");
        put8(p, 't');
        p_glob(p, "flax.nnx.statelib", "State");
        break;
    }
    p_int(p, e->leaves);
    p_int(p, e->nodes);
    put8(p, 't');
}

/* (ScaleByAdamState(count, mu=State{w: VariableState(leaf)}, nu=...),) with step 5 */
static const entry ADAM[] = {
    {0, 0, D_NONE, 1, 1},     {0, 0, D_NONE, 1, 1}, {6, 1, D_VARSTATE, 1, 2}, {6, 1, D_KEYS_W, 1, 3},
    {0, 0, D_NONE, 1, 1},     {6, 1, D_VARSTATE, 1, 2}, {6, 1, D_KEYS_W, 1, 3}, {3, 3, D_ADAM, 3, 8},
    {2, 1, D_NONE, 3, 9},
};

static void structure(buf *p, const entry *es, size_t n, const char *jaxlib, bool with_step)
{
    p->n = 0;
    put(p, "\x80\x02", 2);
    if (with_step) put8(p, '(');
    p_glob(p, jaxlib, "PyTreeDef");
    put8(p, ')');
    put8(p, 0x81); /* NEWOBJ */
    put8(p, '(');
    p_glob(p, "jax._src.tree_util", "default_registry");
    put8(p, ']');
    put8(p, '(');
    for (size_t i = 0; i < n; i++) node(p, &es[i]);
    put8(p, 'e');
    put8(p, 't');
    put8(p, 'b'); /* BUILD */
    if (with_step) {
        p_int(p, 5);
        put8(p, 't');
    }
    put8(p, '.');
}

static void expect_refused(const buf *p, const char *want)
{
    edtree t;
    assert_int_equal(edtree_parse(&t, "s.pkl", p->b, p->n), CKPT_EINVAL);
    if (!strstr(ckpt_error_last(), want)) fail_msg("error '%s' lacks '%s'", ckpt_error_last(), want);
    assert_null(t.leaves);
}

static void test_keys_and_step(void **state)
{
    (void)state;
    buf p = {0};
    structure(&p, ADAM, sizeof ADAM / sizeof ADAM[0], "jaxlib._jax.pytree", true);
    edtree t;
    assert_int_equal(edtree_parse(&t, "s.pkl", p.b, p.n), 0);
    assert_int_equal(t.nleaves, 3);
    assert_string_equal(t.leaves[0].key, "0.count");
    assert_int_equal(t.leaves[0].param_at, EDTREE_NO_PARAM);
    assert_string_equal(t.leaves[1].key, "0.mu.w");
    assert_string_equal(t.leaves[1].key + t.leaves[1].param_at, "w");
    assert_string_equal(t.leaves[2].key, "0.nu.w");
    assert_true(t.has_step);
    assert_int_equal(t.step, 5);
    edtree_free(&t);
    /* the bare treedef (January 2025), the older jaxlib module: no step */
    structure(&p, ADAM, sizeof ADAM / sizeof ADAM[0], "jaxlib.xla_extension.pytree", false);
    assert_int_equal(edtree_parse(&t, "s.pkl", p.b, p.n), 0);
    assert_int_equal(t.nleaves, 3);
    assert_false(t.has_step);
    edtree_free(&t);
    free(p.b);
}

static void test_refusals(void **state)
{
    (void)state;
    buf p = {0};
    entry e[sizeof ADAM / sizeof ADAM[0]];
    size_t n = sizeof ADAM / sizeof ADAM[0];
#define MUTATE(i, field, v, want)                                                                                      \
    do {                                                                                                               \
        memcpy(e, ADAM, sizeof e);                                                                                     \
        e[i].field = v;                                                                                                \
        structure(&p, e, n, "jaxlib._jax.pytree", true);                                                               \
        expect_refused(&p, want);                                                                                      \
    } while (0)
    MUTATE(8, nodes, 10, "node 8 of the tree definition: num_leaves 3 and num_nodes 10 where its children make 3 and 9");
    MUTATE(7, arity, 2, "namedtuple 'optax._src.transform.ScaleByAdamState' with 2 children; it has 3 fields");
    MUTATE(8, arity, 3, "node 8 of the tree definition: more children than subtrees before it");
    MUTATE(8, kind, 7, "a dataclass node");
    MUTATE(3, data, D_KEYS_DOT, "a key that is empty, too long, or holds '.', '/' or a control character");
    MUTATE(2, arity, 0, "a flax variable without exactly one child");
    MUTATE(0, data, D_ADAM, "node_data on a leaf, None, tuple or list");
    /* a root tuple without children: two trees are left */
    memcpy(e, ADAM, sizeof e);
    e[8] = (entry){2, 0, D_NONE, 0, 1};
    structure(&p, e, n, "jaxlib._jax.pytree", true);
    expect_refused(&p, "the traversal leaves 2 trees, not one");
    free(p.b);
}

static void test_not_a_treedef(void **state)
{
    (void)state;
    buf p = {0};
    put(&p, "\x80\x02", 2);
    p_glob(&p, "jaxlib._jax.pytree", "Other");
    put8(&p, '.');
    expect_refused(&p, "global 'jaxlib._jax.pytree.Other' is not allowed");
    p.n = 0;
    put(&p, "\x80\x02", 2);
    p_int(&p, 3);
    put8(&p, '.');
    expect_refused(&p, "not a pickled jax PyTreeDef (a int)");
    free(p.b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_keys_and_step), cmocka_unit_test(test_refusals),
                                       cmocka_unit_test(test_not_a_treedef)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

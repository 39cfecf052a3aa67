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

typedef struct {
    uint8_t b[8192];
    size_t n;
} pbuf;

static void raw(pbuf *p, const char *s, size_t n)
{
    assert_true(p->n + n <= sizeof p->b);
    memcpy(p->b + p->n, s, n);
    p->n += n;
}
static void op(pbuf *p, char c) { raw(p, &c, 1); }
static void str(pbuf *p, const char *s)
{
    uint32_t n = (uint32_t)strlen(s);
    char len[4] = {(char)(n & 0xff), (char)(n >> 8 & 0xff), (char)(n >> 16 & 0xff), (char)(n >> 24)};
    op(p, 'X');
    raw(p, len, 4);
    raw(p, s, n);
}
static void num(pbuf *p, int v)
{
    char b[2] = {'K', (char)v};
    raw(p, b, 2);
}
static void glob(pbuf *p, const char *mod, const char *name)
{
    op(p, 'c');
    raw(p, mod, strlen(mod));
    op(p, '\n');
    raw(p, name, strlen(name));
    op(p, '\n');
}

/* What one traversal entry's node_data / custom type is. */
typedef enum { D_NONE, D_ADAM, D_VARSTATE, D_KEYS_W, D_KEYS_DOT } data_kind;

typedef struct {
    int kind, arity;
    data_kind data;
    int leaves, nodes;
} entry;

static void node(pbuf *p, const entry *e)
{
    op(p, '(');
    num(p, e->kind);
    num(p, e->arity);
    switch (e->data) {
    case D_NONE: op(p, 'N'); op(p, 'N'); break;
    case D_ADAM: glob(p, "optax._src.transform", "ScaleByAdamState"); op(p, 'N'); break;
    case D_VARSTATE:
        op(p, '(');
        glob(p, "flax.nnx.variablelib", "Param");
        op(p, ')');
        op(p, 't');
        glob(p, "flax.nnx.variablelib", "VariableState");
        break;
    case D_KEYS_W:
    case D_KEYS_DOT:
        op(p, '(');
        str(p, e->data == D_KEYS_W ? "w" : "a.b");
        op(p, 't');
        glob(p, "flax.nnx.statelib", "State");
        break;
    }
    num(p, e->leaves);
    num(p, e->nodes);
    op(p, 't');
}

/* (ScaleByAdamState(count, mu=State{w: VariableState(leaf)}, nu=...),) with step 5 */
static const entry ADAM[] = {
    {0, 0, D_NONE, 1, 1},     {0, 0, D_NONE, 1, 1}, {6, 1, D_VARSTATE, 1, 2}, {6, 1, D_KEYS_W, 1, 3},
    {0, 0, D_NONE, 1, 1},     {6, 1, D_VARSTATE, 1, 2}, {6, 1, D_KEYS_W, 1, 3}, {3, 3, D_ADAM, 3, 8},
    {2, 1, D_NONE, 3, 9},
};

static void structure(pbuf *p, const entry *es, size_t n, const char *jaxlib, bool with_step)
{
    p->n = 0;
    raw(p, "\x80\x02", 2);
    if (with_step) op(p, '(');
    glob(p, jaxlib, "PyTreeDef");
    op(p, ')');
    op(p, (char)0x81); /* NEWOBJ */
    op(p, '(');
    glob(p, "jax._src.tree_util", "default_registry");
    op(p, ']');
    op(p, '(');
    for (size_t i = 0; i < n; i++) node(p, &es[i]);
    op(p, 'e');
    op(p, 't');
    op(p, 'b'); /* BUILD */
    if (with_step) {
        num(p, 5);
        op(p, 't');
    }
    op(p, '.');
}

static void expect_refused(const pbuf *p, const char *want)
{
    edtree t;
    assert_int_equal(edtree_parse(&t, "s.pkl", p->b, p->n), CKPT_EINVAL);
    if (!strstr(ckpt_error_last(), want)) fail_msg("error '%s' lacks '%s'", ckpt_error_last(), want);
    assert_null(t.leaves);
}

static void test_keys_and_step(void **state)
{
    (void)state;
    pbuf p;
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
}

static void test_refusals(void **state)
{
    (void)state;
    pbuf p;
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
}

static void test_not_a_treedef(void **state)
{
    (void)state;
    pbuf p = {.n = 0};
    raw(&p, "\x80\x02", 2);
    glob(&p, "jaxlib._jax.pytree", "Other");
    op(&p, '.');
    expect_refused(&p, "global 'jaxlib._jax.pytree.Other' is not allowed");
    p.n = 0;
    raw(&p, "\x80\x02", 2);
    num(&p, 3);
    op(&p, '.');
    expect_refused(&p, "not a pickled jax PyTreeDef (a int)");
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_keys_and_step), cmocka_unit_test(test_refusals),
                                       cmocka_unit_test(test_not_a_treedef)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

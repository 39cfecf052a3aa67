/*
 * fuzz_pickle.c — libFuzzer harness for the restricted pickle machine
 * (format/pickle.c).
 *
 * The input is a pickle. pk_parse must reject it or return a tree whose
 * every node id is in range; the harness then walks the tree from the root
 * with a depth bound (a pickle can make cycles through the memo) and checks
 * each node's invariants. Small limits make the limit paths reachable.
 * Sanitizers catch the rest.
 */
#include "format/pickle.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) abort();                                                                      \
    } while (0)

static const pk_global_def ALLOW[] = {
    {"collections", "OrderedDict", PKG_DICT, 1},
    {"builtins", "set", PKG_SET, 2},
    {"_codecs", "encode", PKG_ENCODE, 3},
    {"torch", "Size", PKG_TUPLE, 4},
    {"torch._utils", "_rebuild_tensor_v2", PKG_CALL, 5},
    {"torch", "FloatStorage", PKG_VALUE, 6},
    {"r", "Rec", PKG_RECORD, 7},
};

static size_t walked;

static void walk(const pk_doc *d, uint32_t id, int depth)
{
    REQUIRE(id < d->n);
    if (depth > 32 || ++walked > 100000) return;
    const pk_node *n = pk_at(d, id);
    REQUIRE((unsigned)n->kind <= PK_PERSID);
    switch (n->kind) {
    case PK_STR:
    case PK_BYTES:
    case PK_GLOBAL:
        REQUIRE(n->s != NULL && n->s[n->slen] == 0);
        break;
    case PK_DICT:
        REQUIRE(n->n % 2 == 0);
        break;
    case PK_CALL:
        REQUIRE(n->n == 2 && pk_item(d, n, 0)->kind == PK_GLOBAL && pk_item(d, n, 1)->kind == PK_TUPLE);
        break;
    case PK_OBJ:
        REQUIRE(n->n == 3 && pk_item(d, n, 0)->kind == PK_GLOBAL);
        break;
    case PK_PERSID:
        REQUIRE(n->n == 1);
        break;
    default:
        break;
    }
    for (size_t k = 0; k < n->n; k++) walk(d, n->items[k], depth + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pk_opts o = {.allow = ALLOW, .nallow = sizeof ALLOW / sizeof ALLOW[0], .allow_persid = true,
                 .limits = {.max_nodes = 1 << 16, .max_stack = 1 << 12, .max_memo = 1 << 12, .max_items = 1 << 12}};
    pk_doc d;
    if (pk_parse(&d, "fuzz.pkl", data, size, &o) == 0) {
        REQUIRE(d.consumed <= size && d.n > 0);
        walked = 0;
        walk(&d, d.root, 0);
        pk_free(&d);
    } else {
        REQUIRE(d.nodes == NULL);
    }
    return 0;
}

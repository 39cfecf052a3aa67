/* easydel_tree.c — an older EasyDeL save's pickled optimizer structure (easydel_tree.h). */
#include "format/easydel_tree.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"
#include "format/pickle.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    T_TREEDEF = 1, /* jaxlib PyTreeDef */
    T_REGISTRY,    /* jax's default pytree registry */
    T_NAMEDTUPLE,  /* an optax state; its fields in CLASSES */
    T_STATE,       /* flax nnx State, flax FrozenDict: keyed children */
    T_VARSTATE,    /* flax 0.10 VariableState: node_data (variable class, metadata) */
    T_VARIABLE,    /* a flax Variable class (flax 0.11 custom node; 0.10 VariableState's type) */
    T_JAXARRAY,    /* jax._src.array._reconstruct_array */
    T_NPRECON,     /* numpy's ndarray _reconstruct */
    T_NDARRAY,     /* numpy.ndarray */
    T_DTYPE,       /* numpy.dtype */
    T_NPSCALAR,    /* numpy's scalar(dtype, bytes) */
};

/* The reader's allow-list: records only, this reader only. Namedtuple field
 * names follow optax 0.2.2–0.2.8 (optax/_src/base.py, transform.py,
 * factorized.py, transforms/_accumulation.py, _masking.py,
 * _conditionality.py, schedules/_inject.py). */
static const struct {
    pk_global_def g;
    const char *fields; /* namedtuples: field names, ',' separated */
} CLASSES[] = {
    {{"jaxlib.xla_extension.pytree", "PyTreeDef", PKG_RECORD, T_TREEDEF}, NULL},
    {{"jaxlib._jax.pytree", "PyTreeDef", PKG_RECORD, T_TREEDEF}, NULL},
    {{"jax._src.tree_util", "default_registry", PKG_VALUE, T_REGISTRY}, NULL},
    {{"optax._src.base", "EmptyState", PKG_VALUE, T_NAMEDTUPLE}, ""},
    {{"optax._src.transform", "ScaleByAdamState", PKG_VALUE, T_NAMEDTUPLE}, "count,mu,nu"},
    {{"optax._src.transform", "ScaleByAmsgradState", PKG_VALUE, T_NAMEDTUPLE}, "count,mu,nu,nu_max"},
    {{"optax._src.transform", "ScaleByBeliefState", PKG_VALUE, T_NAMEDTUPLE}, "count,mu,nu"},
    {{"optax._src.transform", "ScaleByLionState", PKG_VALUE, T_NAMEDTUPLE}, "count,mu"},
    {{"optax._src.transform", "ScaleByRmsState", PKG_VALUE, T_NAMEDTUPLE}, "nu"},
    {{"optax._src.transform", "ScaleByRStdDevState", PKG_VALUE, T_NAMEDTUPLE}, "mu,nu"},
    {{"optax._src.transform", "ScaleByScheduleState", PKG_VALUE, T_NAMEDTUPLE}, "count"},
    {{"optax._src.transform", "TraceState", PKG_VALUE, T_NAMEDTUPLE}, "trace"}, /* optax <= 0.2.2 */
    {{"optax._src.transform", "EmaState", PKG_VALUE, T_NAMEDTUPLE}, "count,ema"},
    {{"optax._src.factorized", "FactoredState", PKG_VALUE, T_NAMEDTUPLE}, "count,v_row,v_col,v"},
    {{"optax.transforms._accumulation", "TraceState", PKG_VALUE, T_NAMEDTUPLE}, "trace"},
    {{"optax.transforms._accumulation", "EmaState", PKG_VALUE, T_NAMEDTUPLE}, "count,ema"},
    {{"optax.transforms._accumulation", "MultiStepsState", PKG_VALUE, T_NAMEDTUPLE},
     "mini_step,gradient_step,inner_opt_state,acc_grads,skip_state"},
    {{"optax._src.wrappers", "MultiStepsState", PKG_VALUE, T_NAMEDTUPLE},
     "mini_step,gradient_step,inner_opt_state,acc_grads,skip_state"},
    {{"optax.transforms._masking", "MaskedState", PKG_VALUE, T_NAMEDTUPLE}, "inner_state"},
    {{"optax.transforms._masking", "MaskedNode", PKG_VALUE, T_NAMEDTUPLE}, ""},
    {{"optax.schedules._inject", "InjectHyperparamsState", PKG_VALUE, T_NAMEDTUPLE}, "count,hyperparams,inner_state"},
    {{"flax.nnx.statelib", "State", PKG_VALUE, T_STATE}, NULL},
    {{"flax.core.frozen_dict", "FrozenDict", PKG_VALUE, T_STATE}, NULL},
    {{"flax.nnx.variablelib", "VariableState", PKG_VALUE, T_VARSTATE}, NULL},
    {{"flax.nnx.variablelib", "Variable", PKG_VALUE, T_VARIABLE}, NULL},
    {{"flax.nnx.variablelib", "Param", PKG_VALUE, T_VARIABLE}, NULL},
    {{"flax.nnx.variablelib", "BatchStat", PKG_VALUE, T_VARIABLE}, NULL},
    {{"flax.nnx.variablelib", "Cache", PKG_VALUE, T_VARIABLE}, NULL},
    {{"flax.nnx.variablelib", "Intermediate", PKG_VALUE, T_VARIABLE}, NULL},
    {{"jax._src.array", "_reconstruct_array", PKG_CALL, T_JAXARRAY}, NULL},
    {{"numpy.core.multiarray", "_reconstruct", PKG_REDUCE_RECORD, T_NPRECON}, NULL},
    {{"numpy._core.multiarray", "_reconstruct", PKG_REDUCE_RECORD, T_NPRECON}, NULL},
    {{"numpy.core.multiarray", "scalar", PKG_CALL, T_NPSCALAR}, NULL},
    {{"numpy._core.multiarray", "scalar", PKG_CALL, T_NPSCALAR}, NULL},
    {{"numpy", "ndarray", PKG_VALUE, T_NDARRAY}, NULL},
    {{"numpy", "dtype", PKG_REDUCE_RECORD, T_DTYPE}, NULL},
};
#define NCLASSES CKPT_ARRAY_LEN(CLASSES)

/* jaxlib's PyTreeKind */
enum { K_LEAF, K_NONE, K_TUPLE, K_NAMEDTUPLE, K_LIST, K_DICT, K_CUSTOM, K_DATACLASS };

typedef struct {
    int kind;
    size_t arity;
    const pk_node *keys;  /* dict, State: the keys (a list or tuple of arity items) */
    const char *fields;   /* namedtuple: CLASSES[].fields */
    bool keyed_container; /* State / FrozenDict: a parameter tree */
    bool transparent;     /* Variable / VariableState: its one child has no key */
    uint32_t parent;      /* UINT32_MAX at the root */
    uint32_t pos;         /* child index in the parent */
    uint32_t depth;
} tnode;

typedef struct {
    const pk_doc *d;
    const char *label;
    tnode *n;
    size_t nn;
} walk_ctx;

static int bad(const walk_ctx *w, size_t i, const char *what)
{
    return ckpt_error_set(CKPT_EINVAL, "%s: node %zu of the tree definition: %s", w->label, i, what);
}

static bool is_int(const pk_node *x) { return x->kind == PK_INT && !x->s; }

static int node_int(const walk_ctx *w, size_t i, const pk_node *x, const char *field, int64_t lo, int64_t hi, int64_t *out)
{
    if (!is_int(x) || x->i < lo || x->i > hi) {
        char m[96];
        snprintf(m, sizeof m, "'%s' is not an integer in [%" PRId64 ", %" PRId64 "]", field, lo, hi);
        return bad(w, i, m);
    }
    *out = x->i;
    return 0;
}

/* A dict / State key as a key path component: a plain name or a non-negative int. */
static int key_ok(const walk_ctx *w, size_t i, const pk_node *k)
{
    if (is_int(k) && k->i >= 0) return 0;
    if (k->kind != PK_STR) return bad(w, i, "a key that is neither a string nor a non-negative integer");
    bool ok = k->slen > 0 && k->slen <= 255;
    for (size_t c = 0; ok && c < k->slen; c++) ok = (unsigned char)k->s[c] >= 0x20 && k->s[c] != '.' && k->s[c] != '/' && k->s[c] != 0x7f;
    return ok ? 0 : bad(w, i, "a key that is empty, too long, or holds '.', '/' or a control character");
}

static size_t nfields(const char *f)
{
    if (!*f) return 0;
    size_t n = 1;
    for (; *f; f++) n += *f == ',';
    return n;
}

/* One traversal entry (kind, arity, node_data, custom, num_leaves, num_nodes). */
static int read_node(walk_ctx *w, size_t i, const pk_node *e, int64_t *num_leaves, int64_t *num_nodes)
{
    const pk_doc *d = w->d;
    tnode *t = &w->n[i];
    if (e->kind != PK_TUPLE || e->n != 6) return bad(w, i, "not a 6-tuple (kind, arity, node_data, custom, num_leaves, num_nodes)");
    int64_t kind, arity;
    int rc = node_int(w, i, pk_item(d, e, 0), "kind", 0, K_DATACLASS, &kind);
    if (!rc) rc = node_int(w, i, pk_item(d, e, 1), "arity", 0, (int64_t)w->nn, &arity);
    if (!rc) rc = node_int(w, i, pk_item(d, e, 4), "num_leaves", 0, INT32_MAX, num_leaves);
    if (!rc) rc = node_int(w, i, pk_item(d, e, 5), "num_nodes", 1, INT32_MAX, num_nodes);
    if (rc) return rc;
    t->kind = (int)kind;
    t->arity = (size_t)arity;
    const pk_node *data = pk_item(d, e, 2), *custom = pk_item(d, e, 3);
    if (kind != K_CUSTOM && kind != K_DATACLASS && custom->kind != PK_NONE) return bad(w, i, "a custom type on a built-in node");
    char m[700];
    switch (kind) {
    case K_LEAF:
    case K_NONE:
        if (arity) return bad(w, i, "a leaf or None with children");
        /* fallthrough */
    case K_TUPLE:
    case K_LIST:
        if (data->kind != PK_NONE) return bad(w, i, "node_data on a leaf, None, tuple or list");
        return 0;
    case K_NAMEDTUPLE:
        if (data->kind != PK_GLOBAL || data->tag != T_NAMEDTUPLE)
            return bad(w, i, "a namedtuple whose node_data is not an optax state class of the allow-list");
        t->fields = CLASSES[data->i].fields;
        if (nfields(t->fields) != t->arity) {
            snprintf(m, sizeof m, "namedtuple '%s' with %zu children; it has %zu fields", data->s, t->arity, nfields(t->fields));
            return bad(w, i, m);
        }
        return 0;
    case K_DICT:
        if (data->kind != PK_LIST || data->n != t->arity) return bad(w, i, "a dict whose node_data is not the list of its keys");
        t->keys = data;
        for (size_t k = 0; k < data->n; k++)
            if ((rc = key_ok(w, i, pk_item(d, data, k)))) return rc;
        return 0;
    case K_CUSTOM:
        if (custom->kind != PK_GLOBAL) return bad(w, i, "a custom node without its type");
        if (custom->tag == T_STATE) {
            if (data->kind != PK_TUPLE || data->n != t->arity)
                return bad(w, i, "a State / FrozenDict whose node_data is not the tuple of its keys");
            t->keys = data;
            t->keyed_container = true;
            for (size_t k = 0; k < data->n; k++)
                if ((rc = key_ok(w, i, pk_item(d, data, k)))) return rc;
        } else if (custom->tag == T_VARSTATE || custom->tag == T_VARIABLE) {
            /* flax 0.10: (variable class, metadata); flax 0.11: metadata */
            bool ok = data->kind == PK_TUPLE;
            if (ok && custom->tag == T_VARSTATE)
                ok = data->n == 2 && pk_item(d, data, 0)->kind == PK_GLOBAL && pk_item(d, data, 0)->tag == T_VARIABLE &&
                     pk_item(d, data, 1)->kind == PK_TUPLE;
            if (!ok) return bad(w, i, "a flax variable whose node_data is not (type, metadata) or its metadata");
            if (t->arity != 1) return bad(w, i, "a flax variable without exactly one child (its value)");
            t->transparent = true;
        } else {
            snprintf(m, sizeof m, "custom node type '%s' is not one this reader maps", custom->s);
            return bad(w, i, m);
        }
        return 0;
    default:
        snprintf(m, sizeof m, "a dataclass node ('%s') is not read", custom->kind == PK_GLOBAL ? custom->s : "?");
        return bad(w, i, m);
    }
}

/* Appends child pos's key component under parent p to buf at *len. */
static int component(const walk_ctx *w, const tnode *p, uint32_t pos, char *buf, size_t *len, size_t cap)
{
    char tmp[300];
    const char *s = tmp;
    size_t n;
    if (p->keys) {
        const pk_node *k = pk_item(w->d, p->keys, pos);
        if (k->kind == PK_STR) {
            s = k->s;
            n = k->slen;
        } else {
            n = (size_t)snprintf(tmp, sizeof tmp, "%" PRId64, k->i);
        }
    } else if (p->fields) {
        const char *f = p->fields;
        for (uint32_t k = 0; k < pos; k++) f = strchr(f, ',') + 1;
        const char *end = strchr(f, ',');
        s = f;
        n = end ? (size_t)(end - f) : strlen(f);
    } else {
        n = (size_t)snprintf(tmp, sizeof tmp, "%" PRIu32, pos);
    }
    if (*len + n + 1 > cap) return -1;
    /* prepended: the buffer ends with ".<this>.<below>..." */
    buf[cap - *len - n - 1] = '.';
    memcpy(buf + cap - *len - n, s, n);
    *len += n + 1;
    return 0;
}

/* Leaf i's key path (walking up to the root) and where its parameter's key starts. */
static int leaf_key(walk_ctx *w, size_t i, edtree_leaf *out, size_t *total)
{
    char buf[EDTREE_MAX_KEY + 1]; /* ".<key>": the key is at most EDTREE_MAX_KEY bytes */
    size_t len = 0, param_len = EDTREE_NO_PARAM; /* length of the key below the outermost State */
    for (uint32_t c = (uint32_t)i; w->n[c].parent != UINT32_MAX; c = w->n[c].parent) {
        const tnode *p = &w->n[w->n[c].parent];
        if (p->transparent) continue;
        if (component(w, p, w->n[c].pos, buf, &len, sizeof buf))
            return bad(w, i, "a leaf whose key path is longer than the limit");
        if (p->keyed_container) param_len = len;
    }
    size_t klen = len ? len - 1 : 0; /* drop the leading '.' */
    if ((*total += klen + 1) > EDTREE_MAX_KEY_TOTAL) return bad(w, i, "the key paths are longer in all than the limit");
    if (!(out->key = ckpt_strndup(buf + sizeof buf - klen, klen))) return CKPT_ENOMEM;
    out->param_at = param_len == EDTREE_NO_PARAM ? EDTREE_NO_PARAM : klen - (param_len - 1);
    return 0;
}

/* The PyTreeDef record: its traversal, checked, into t's leaves. */
static int read_treedef(edtree *t, const pk_doc *d, const char *label, const pk_node *obj)
{
    if (obj->kind != PK_OBJ || pk_item(d, obj, 0)->tag != T_TREEDEF)
        return ckpt_error_set(CKPT_EINVAL, "%s: not a pickled jax PyTreeDef (a %s)", label,
                              obj->kind == PK_GLOBAL ? obj->s : pk_kind_name(obj->kind));
    const pk_node *args = pk_item(d, obj, 1), *st = pk_item(d, obj, 2);
    if (args->n || st->kind != PK_TUPLE || st->n != 2)
        return ckpt_error_set(CKPT_EINVAL, "%s: the PyTreeDef's state is not (registry, traversal)", label);
    const pk_node *reg = pk_item(d, st, 0), *trav = pk_item(d, st, 1);
    if (reg->kind != PK_GLOBAL || reg->tag != T_REGISTRY)
        return ckpt_error_set(CKPT_EINVAL, "%s: the PyTreeDef's registry is not jax's default_registry", label);
    if (trav->kind != PK_LIST || !trav->n) return ckpt_error_set(CKPT_EINVAL, "%s: the traversal is not a non-empty list", label);
    if (trav->n > EDTREE_MAX_NODES)
        return ckpt_error_set(CKPT_ELIMIT, "%s: %zu nodes in the tree definition (at most %u)", label, trav->n, EDTREE_MAX_NODES);
    walk_ctx w = {.d = d, .label = label, .nn = trav->n};
    w.n = ckpt_calloc(w.nn, sizeof *w.n);
    uint32_t *agenda = ckpt_calloc(w.nn, sizeof *agenda);
    int64_t *leaves = ckpt_calloc(w.nn, sizeof *leaves), *nodes = ckpt_calloc(w.nn, sizeof *nodes);
    int rc = w.n && agenda && leaves && nodes ? 0 : CKPT_ENOMEM;
    size_t top = 0, nleaves = 0;
    /* post-order: each node takes the last `arity` subtrees as its children
     * (PyTreeDef::SetNumLeavesAndNumNodes), whose counts must be the pickled ones */
    for (size_t i = 0; !rc && i < w.nn; i++) {
        int64_t want_leaves = 0, want_nodes = 0;
        if ((rc = read_node(&w, i, pk_item(d, trav, i), &want_leaves, &want_nodes))) break;
        tnode *n = &w.n[i];
        if (n->arity > top) {
            rc = bad(&w, i, "more children than subtrees before it");
            break;
        }
        int64_t nl = n->kind == K_LEAF, nd = 1;
        for (size_t k = 0; k < n->arity; k++) {
            uint32_t c = agenda[top - n->arity + k];
            w.n[c].parent = (uint32_t)i;
            w.n[c].pos = (uint32_t)k;
            nl += leaves[c];
            nd += nodes[c];
        }
        top -= n->arity;
        agenda[top++] = (uint32_t)i;
        leaves[i] = nl;
        nodes[i] = nd;
        nleaves += n->kind == K_LEAF;
        if (nl != want_leaves || nd != want_nodes) {
            char m[160];
            snprintf(m, sizeof m, "num_leaves %" PRId64 " and num_nodes %" PRId64 " where its children make %" PRId64 " and %" PRId64,
                     want_leaves, want_nodes, nl, nd);
            rc = bad(&w, i, m);
        }
    }
    if (!rc && top != 1) rc = ckpt_error_set(CKPT_EINVAL, "%s: the traversal leaves %zu trees, not one", label, top);
    if (!rc) {
        w.n[w.nn - 1].parent = UINT32_MAX;
        for (size_t i = w.nn - 1; !rc && i-- > 0;) {
            w.n[i].depth = w.n[w.n[i].parent].depth + 1;
            if (w.n[i].depth > EDTREE_MAX_DEPTH) rc = bad(&w, i, "nested deeper than the limit (64 levels)");
        }
    }
    if (!rc && !(t->leaves = ckpt_calloc(nleaves + 1, sizeof *t->leaves))) rc = CKPT_ENOMEM;
    size_t total = 0;
    for (size_t i = 0; !rc && i < w.nn; i++)
        if (w.n[i].kind == K_LEAF && !(rc = leaf_key(&w, i, &t->leaves[t->nleaves], &total))) t->nleaves++;
    free(w.n);
    free(agenda);
    free(leaves);
    free(nodes);
    return rc;
}

/* numpy dtype record -> (signed, size); only little-endian integers. */
static int int_dtype(const pk_doc *d, const pk_node *dt, bool *is_signed, size_t *size)
{
    if (dt->kind != PK_OBJ || pk_item(d, dt, 0)->tag != T_DTYPE) return -1;
    const pk_node *args = pk_item(d, dt, 1), *st = pk_item(d, dt, 2);
    const pk_node *name = args->n ? pk_item(d, args, 0) : NULL;
    if (!name || name->kind != PK_STR || name->slen != 2 || (name->s[0] != 'i' && name->s[0] != 'u')) return -1;
    *is_signed = name->s[0] == 'i';
    *size = (size_t)(name->s[1] - '0');
    if (*size != 1 && *size != 2 && *size != 4 && *size != 8) return -1;
    const pk_node *order = st->kind == PK_TUPLE && st->n > 1 ? pk_item(d, st, 1) : NULL;
    if (!order || order->kind != PK_STR || (strcmp(order->s, "<") && strcmp(order->s, "|") && strcmp(order->s, "=")))
        return -1;
    return 0;
}

/* The bytes of an integer scalar as *v. */
static int int_bytes(const pk_node *b, bool is_signed, size_t size, int64_t *v)
{
    if (b->kind != PK_BYTES || b->slen != size) return -1;
    uint64_t u = 0;
    for (size_t k = size; k-- > 0;) u = u << 8 | (uint8_t)b->s[k];
    if (is_signed && size < 8 && (u >> (8 * size - 1)) & 1) u |= ~0ULL << (8 * size);
    if (!is_signed && size == 8 && u > INT64_MAX) return -1;
    *v = (int64_t)u;
    return 0;
}

/* ndarray state (1, shape, dtype, fortran, bytes) of a 0-d integer array. */
static int array_value(const pk_doc *d, const pk_node *st, int64_t *v)
{
    bool sg;
    size_t size;
    if (st->kind != PK_TUPLE || st->n != 5 || pk_item(d, st, 1)->kind != PK_TUPLE || pk_item(d, st, 1)->n) return -1;
    if (int_dtype(d, pk_item(d, st, 2), &sg, &size)) return -1;
    return int_bytes(pk_item(d, st, 4), sg, size, v);
}

static int read_step(edtree *t, const pk_doc *d, const char *label, const pk_node *s)
{
    int64_t v = -1;
    int rc = -1;
    if (is_int(s)) {
        v = s->i;
        rc = 0;
    } else if (s->kind == PK_CALL && pk_item(d, s, 0)->tag == T_JAXARRAY) {
        /* jax Array.__reduce__: (_reconstruct_array, (fun, args, arr_state, aval_state)) */
        const pk_node *a = pk_item(d, s, 1);
        if (a->n == 4 && pk_item(d, a, 0)->tag == T_NPRECON) rc = array_value(d, pk_item(d, a, 2), &v);
    } else if (s->kind == PK_OBJ && pk_item(d, s, 0)->tag == T_NPRECON) {
        rc = array_value(d, pk_item(d, s, 2), &v); /* a numpy array: _reconstruct, then BUILD of its state */
    } else if (s->kind == PK_CALL && pk_item(d, s, 0)->tag == T_NPSCALAR) {
        const pk_node *a = pk_item(d, s, 1);
        bool sg;
        size_t size;
        if (a->n == 2 && !int_dtype(d, pk_item(d, a, 0), &sg, &size)) rc = int_bytes(pk_item(d, a, 1), sg, size, &v);
    }
    if (rc || v < 0)
        return ckpt_error_set(CKPT_EINVAL, "%s: the step (the tuple's second item) is not a non-negative integer, "
                                           "a 0-d integer jax/numpy array or a numpy integer", label);
    t->has_step = true;
    t->step = v;
    return 0;
}

static void allow_list(pk_global_def *out)
{
    for (size_t i = 0; i < NCLASSES; i++) out[i] = CLASSES[i].g;
}

int edtree_parse(edtree *t, const char *label, const uint8_t *buf, size_t len)
{
    memset(t, 0, sizeof *t);
    pk_global_def allow[NCLASSES];
    allow_list(allow);
    pk_opts o = {.allow = allow, .nallow = NCLASSES};
    pk_doc d;
    int rc = pk_parse(&d, label, buf, len, &o);
    if (rc) return rc;
    const pk_node *root = pk_at(&d, d.root);
    /* (treedef, step) from April 2025 on, the bare treedef before */
    bool pair = root->kind == PK_TUPLE && root->n == 2;
    rc = read_treedef(t, &d, label, pair ? pk_item(&d, root, 0) : root);
    if (!rc && pair) rc = read_step(t, &d, label, pk_item(&d, root, 1));
    pk_free(&d);
    if (rc) edtree_free(t);
    return rc;
}

int edtree_read(edtree *t, const char *path)
{
    char *text = NULL;
    size_t len = 0;
    memset(t, 0, sizeof *t);
    int rc = ckpt_read_file(path, EDTREE_MAX_FILE_BYTES, &text, &len);
    if (!rc) rc = edtree_parse(t, path, (const uint8_t *)text, len);
    free(text);
    return rc;
}

void edtree_free(edtree *t)
{
    for (size_t i = 0; i < t->nleaves; i++) free(t->leaves[i].key);
    free(t->leaves);
    memset(t, 0, sizeof *t);
}

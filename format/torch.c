/*
 * torch.c — torch.save files (zip and legacy) as st_file tensor tables (see
 * torch.h). The pickle is run by pickle.c; this file knows what torch's
 * objects mean: persistent ids name storages, _rebuild_tensor_v2/_v3 calls
 * are views, and a dict of names to views is the state dict. Follows
 * torch/serialization.py (_load, _legacy_load) and torch/_utils.py
 * (_rebuild_tensor_v2, _rebuild_tensor_v3, _rebuild_parameter).
 */
#include "format/torch.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"
#include "format/pickle.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
    T_ODICT,
    T_V2,
    T_V3,
    T_PARAM,
    T_PARAM_STATE,
    T_FROM_TYPE,
    T_CLASS, /* torch.Tensor, torch.nn.parameter.Parameter: a type named by _rebuild_from_type_v2 */
    T_STORAGE,
    T_DTYPE,
    T_OTHER,
};

#define NO_DT (-1)

typedef struct {
    const char *name; /* torch.<name> */
    int dt;           /* ckpt_dtype or NO_DT */
    unsigned el;      /* element size for dtypes without a safetensors twin (messages) */
} torch_type;

/* torch.<Name>Storage and torch.<dtype>, with the safetensors dtype of each. */
static const torch_type STORAGES[] = {
    {"DoubleStorage", CKPT_DT_F64, 8},   {"FloatStorage", CKPT_DT_F32, 4},   {"HalfStorage", CKPT_DT_F16, 2},
    {"BFloat16Storage", CKPT_DT_BF16, 2}, {"LongStorage", CKPT_DT_I64, 8},   {"IntStorage", CKPT_DT_I32, 4},
    {"ShortStorage", CKPT_DT_I16, 2},    {"CharStorage", CKPT_DT_I8, 1},    {"ByteStorage", CKPT_DT_U8, 1},
    {"BoolStorage", CKPT_DT_BOOL, 1},    {"ComplexFloatStorage", CKPT_DT_C64, 8},
    {"ComplexDoubleStorage", NO_DT, 16}, {"QInt8Storage", NO_DT, 1},        {"QUInt8Storage", NO_DT, 1},
    {"QInt32Storage", NO_DT, 4},         {"QUInt4x2Storage", NO_DT, 1},     {"QUInt2x4Storage", NO_DT, 1},
    {"UntypedStorage", CKPT_DT_U8, 1},
};
const char *torch_storage_type(ckpt_dtype dt)
{
    for (size_t i = 0; i < CKPT_ARRAY_LEN(STORAGES); i++)
        if (STORAGES[i].dt == (int)dt && strcmp(STORAGES[i].name, "UntypedStorage")) return STORAGES[i].name;
    return NULL;
}

static const torch_type DTYPES[] = {
    {"float64", CKPT_DT_F64, 8},  {"double", CKPT_DT_F64, 8},  {"float32", CKPT_DT_F32, 4},
    {"float", CKPT_DT_F32, 4},    {"float16", CKPT_DT_F16, 2}, {"half", CKPT_DT_F16, 2},
    {"bfloat16", CKPT_DT_BF16, 2}, {"int64", CKPT_DT_I64, 8},  {"long", CKPT_DT_I64, 8},
    {"int32", CKPT_DT_I32, 4},    {"int", CKPT_DT_I32, 4},     {"int16", CKPT_DT_I16, 2},
    {"short", CKPT_DT_I16, 2},    {"int8", CKPT_DT_I8, 1},     {"uint8", CKPT_DT_U8, 1},
    {"bool", CKPT_DT_BOOL, 1},    {"uint16", CKPT_DT_U16, 2},  {"uint32", CKPT_DT_U32, 4},
    {"uint64", CKPT_DT_U64, 8},   {"complex64", CKPT_DT_C64, 8}, {"cfloat", CKPT_DT_C64, 8},
    {"float8_e4m3fn", CKPT_DT_F8_E4M3, 1}, {"float8_e5m2", CKPT_DT_F8_E5M2, 1},
    {"float8_e4m3fnuz", CKPT_DT_F8_E4M3FNUZ, 1}, {"float8_e5m2fnuz", CKPT_DT_F8_E5M2FNUZ, 1},
    {"float8_e8m0fnu", CKPT_DT_F8_E8M0, 1}, {"complex128", NO_DT, 16}, {"cdouble", NO_DT, 16},
    {"qint8", NO_DT, 1}, {"quint8", NO_DT, 1}, {"qint32", NO_DT, 4},
};

const char *torch_dtype_attr(ckpt_dtype dt)
{
    for (size_t i = 0; i < CKPT_ARRAY_LEN(DTYPES); i++)
        if (DTYPES[i].dt == (int)dt) return DTYPES[i].name;
    return NULL;
}

#define NSTORAGES CKPT_ARRAY_LEN(STORAGES)
#define NDTYPES CKPT_ARRAY_LEN(DTYPES)
/* tags: T_STORAGE and T_DTYPE entries carry 100 + index / 200 + index */
#define TAG_STORAGE0 100
#define TAG_DTYPE0 200

static const pk_global_def FIXED[] = {
    {"collections", "OrderedDict", PKG_DICT, T_ODICT},
    {"builtins", "dict", PKG_DICT, T_ODICT},
    {"builtins", "set", PKG_SET, T_OTHER},
    {"builtins", "frozenset", PKG_SET, T_OTHER},
    {"_codecs", "encode", PKG_ENCODE, T_OTHER},
    {"torch", "Size", PKG_TUPLE, T_OTHER},
    {"torch._utils", "_rebuild_tensor_v2", PKG_CALL, T_V2},
    {"torch._utils", "_rebuild_tensor_v3", PKG_CALL, T_V3},
    {"torch._utils", "_rebuild_parameter", PKG_CALL, T_PARAM},
    {"torch._utils", "_rebuild_parameter_with_state", PKG_CALL, T_PARAM_STATE},
    {"torch._tensor", "_rebuild_from_type_v2", PKG_CALL, T_FROM_TYPE},
    {"torch.tensor", "_rebuild_from_type_v2", PKG_CALL, T_FROM_TYPE}, /* torch's load_module_mapping */
    {"torch", "Tensor", PKG_VALUE, T_CLASS},
    {"torch.nn.parameter", "Parameter", PKG_VALUE, T_CLASS},
    {"torch", "device", PKG_CALL, T_OTHER},
};

/* The allow-list: FIXED, then torch.<storage>, then torch.<dtype>. */
static pk_global_def ALLOW[CKPT_ARRAY_LEN(FIXED) + NSTORAGES + NDTYPES];
static int allow_ready;

static void allow_init(void)
{
    if (__atomic_load_n(&allow_ready, __ATOMIC_ACQUIRE)) return;
    pk_global_def tmp[CKPT_ARRAY_LEN(ALLOW)];
    size_t n = 0;
    for (size_t i = 0; i < CKPT_ARRAY_LEN(FIXED); i++) tmp[n++] = FIXED[i];
    for (size_t i = 0; i < NSTORAGES; i++) tmp[n++] = (pk_global_def){"torch", STORAGES[i].name, PKG_VALUE, TAG_STORAGE0 + (int)i};
    for (size_t i = 0; i < NDTYPES; i++) tmp[n++] = (pk_global_def){"torch", DTYPES[i].name, PKG_VALUE, TAG_DTYPE0 + (int)i};
    memcpy(ALLOW, tmp, sizeof tmp); /* same bytes from every thread */
    __atomic_store_n(&allow_ready, 1, __ATOMIC_RELEASE);
}

typedef struct {
    char *key;
    int dt;       /* ckpt dtype of the storage (U8 for an untyped one) */
    unsigned el;  /* bytes per element */
    bool untyped;
    uint64_t numel, nbytes;
    uint64_t file_off; /* where its bytes are in the file */
    const char *type_name;
} tstore;

typedef struct {
    const char *name; /* points into the pickle tree */
    size_t store;
    ckpt_dtype dtype;
    int ndim;
    uint64_t shape[CKPT_MAX_RANK];
    uint64_t lo, hi; /* byte range in the storage */
    bool alias;
    const char *kept; /* for an alias */
    bool permuted;    /* a permutation of a contiguous block (st_tensor.view) */
    int8_t axes[CKPT_MAX_RANK];
    uint64_t stored[CKPT_MAX_RANK];
} tview;

typedef struct {
    const char *label;
    zip_read_fn rd;
    void *ctx;
    uint64_t file_size;
    pk_doc doc;
    tstore *st;
    size_t nst, cap_st;
    tview *tv;
    size_t ntv, cap_tv;
    const char *single;         /* torch_open_tensor: the root is one tensor, named this */
    bool raw;                   /* torch_load_pickle: the pickle only, no tensors */
    bool tree;                  /* torch_open_tree: tensors anywhere in nested dicts, and the pickle kept */
    char **names;               /* ... their joined names (owned) */
    size_t nnames, cap_names;
    const pk_global_def *extra; /* ... with these globals allowed too */
    size_t nextra;
} tctx;

static int terr(tctx *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int terr(tctx *c, int code, const char *fmt, ...)
{
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ckpt_error_set(code, "%s: torch: %s", c->label, what);
}

static const uint8_t LEGACY_MAGIC[] = {0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};

const char *torch_sniff(const uint8_t *head, size_t len)
{
    /* a zip local header; a safetensors file whose 8-byte length happened to
     * read "PK\3\4" would have '{' next, where a zip has its version field */
    if (zipdir_sniff(head, len) && !(len > 8 && head[8] == '{')) return "zip";
    /* PROTO 2-5, FRAME for 4-5, then LONG1 of 10 bytes: the legacy magic number */
    if (len < 2 || head[0] != 0x80 || head[1] < 2 || head[1] > 5) return NULL;
    size_t p = 2;
    if (len > p && head[p] == 0x95) p += 9;
    if (len >= p + 2 + sizeof LEGACY_MAGIC && head[p] == 0x8a && head[p + 1] == sizeof LEGACY_MAGIC &&
        !memcmp(head + p + 2, LEGACY_MAGIC, sizeof LEGACY_MAGIC))
        return "legacy";
    return NULL;
}

static const pk_node *N(tctx *c, uint32_t id) { return pk_at(&c->doc, id); }
static const pk_node *item(tctx *c, const pk_node *n, size_t k) { return pk_item(&c->doc, n, k); }

static bool as_u64(const pk_node *n, uint64_t *v)
{
    if (n->kind != PK_INT || n->s || n->i < 0) return false;
    *v = (uint64_t)n->i;
    return true;
}

/* ---- storages ---- */

/* A persistent id: ('storage', type, key, location, numel[, view_metadata]).
 * tname NULL: registering every storage of a legacy file, used by a tensor
 * of the state dict or not (their bytes follow one another in the file). */
static int load_storage(tctx *c, const pk_node *pid, const char *tname_or_null, size_t *out)
{
    const char *tname = tname_or_null ? tname_or_null : "(outside the state dict)";
    const pk_node *t = pk_item(&c->doc, pid, 0);
    if (t->kind != PK_TUPLE || t->n < 5 || t->n > 6)
        return terr(c, CKPT_EINVAL, "tensor '%s': a persistent id that is not a storage tuple", tname);
    const pk_node *kind = item(c, t, 0), *type = item(c, t, 1), *key = item(c, t, 2), *num = item(c, t, 4);
    uint64_t numel;
    if ((kind->kind != PK_STR && kind->kind != PK_BYTES) || strcmp(kind->s, "storage"))
        return terr(c, CKPT_EINVAL, "tensor '%s': persistent id of type '%s' (only storages are read; a pickled module is not a state dict)",
                    tname, kind->kind == PK_STR || kind->kind == PK_BYTES ? kind->s : pk_kind_name(kind->kind));
    if (type->kind != PK_GLOBAL || type->tag < TAG_STORAGE0 || type->tag >= TAG_STORAGE0 + (int)NSTORAGES)
        return terr(c, CKPT_EINVAL, "tensor '%s': storage type is not a torch storage class", tname);
    if (key->kind != PK_STR || strlen(key->s) != key->slen || key->slen == 0 || key->slen > 64)
        return terr(c, CKPT_EINVAL, "tensor '%s': storage key is not a short string", tname);
    if (!as_u64(num, &numel)) return terr(c, CKPT_EINVAL, "tensor '%s': storage size is not a non-negative integer", tname);
    if (t->n == 6 && item(c, t, 5)->kind != PK_NONE)
        return terr(c, CKPT_EINVAL, "tensor '%s': a storage view (torch < 0.4) is not supported", tname);
    const torch_type *tt = &STORAGES[type->tag - TAG_STORAGE0];
    for (size_t i = 0; i < c->nst; i++) {
        if (strcmp(c->st[i].key, key->s)) continue;
        if (c->st[i].numel != numel || c->st[i].type_name != tt->name)
            return terr(c, CKPT_EINVAL, "storage '%s' is described twice, differently (tensor '%s')", key->s, tname);
        *out = i;
        return tt->dt == NO_DT && tname_or_null
                   ? terr(c, CKPT_EINVAL, "tensor '%s': storage type torch.%s has no safetensors dtype", tname, tt->name)
                   : 0;
    }
    if (tt->dt == NO_DT && tname_or_null)
        return terr(c, CKPT_EINVAL, "tensor '%s': storage type torch.%s has no safetensors dtype", tname, tt->name);
    if (ckpt_grow(&c->st, &c->cap_st, c->nst + 1, sizeof *c->st)) return CKPT_ENOMEM;
    tstore *s = &c->st[c->nst];
    memset(s, 0, sizeof *s);
    s->dt = tt->dt;
    s->el = tt->el;
    s->untyped = !strcmp(tt->name, "UntypedStorage");
    s->numel = numel;
    s->type_name = tt->name;
    if (!ckpt_mul(numel, tt->el, &s->nbytes) || s->nbytes > c->file_size)
        return terr(c, CKPT_EINVAL, "storage '%s' of %" PRIu64 " x %u bytes is larger than the file", key->s, numel, tt->el);
    if (!(s->key = ckpt_strdup(key->s))) return CKPT_ENOMEM;
    *out = c->nst++;
    return 0;
}

/* ---- tensors ---- */

static int read_dims(tctx *c, const char *tname, const pk_node *size, const pk_node *stride, int *ndim, uint64_t *shape,
                     uint64_t *strides)
{
    if (size->kind != PK_TUPLE || stride->kind != PK_TUPLE || size->n != stride->n)
        return terr(c, CKPT_EINVAL, "tensor '%s': size and stride are not tuples of one length", tname);
    if (size->n > CKPT_MAX_RANK)
        return terr(c, CKPT_ELIMIT, "tensor '%s' has %zu dimensions, at most %d", tname, size->n, CKPT_MAX_RANK);
    *ndim = (int)size->n;
    for (size_t k = 0; k < size->n; k++)
        if (!as_u64(item(c, size, k), &shape[k]) || !as_u64(item(c, stride, k), &strides[k]))
            return terr(c, CKPT_EINVAL, "tensor '%s': size or stride %zu is not a non-negative integer", tname, k);
    return 0;
}

/* A view whose axes, sorted by stride (size-1 axes where they stand), are a
 * contiguous block — a transpose or any permutation: its bytes are the block,
 * and v->axes says which stored axis each axis walks. */
static bool permuted_block(tview *v, const uint64_t *strides)
{
    int order[CKPT_MAX_RANK], n = 0;
    for (int k = 0; k < v->ndim; k++) /* size-1 axes first: where they go moves no byte */
        if (v->shape[k] == 1) order[n++] = k;
    int first = n;
    for (int k = 0; k < v->ndim; k++)
        if (v->shape[k] != 1) order[n++] = k;
    for (int i = first + 1; i < n; i++) /* the others by stride, descending (stable) */
        for (int j = i; j > first && strides[order[j - 1]] < strides[order[j]]; j--) {
            int t = order[j - 1];
            order[j - 1] = order[j], order[j] = t;
        }
    uint64_t expect = 1;
    for (int a = n - 1; a >= first; a--) {
        if (strides[order[a]] != expect) return false;
        expect *= v->shape[order[a]];
    }
    for (int a = 0; a < n; a++) {
        v->axes[order[a]] = (int8_t)a;
        v->stored[a] = v->shape[order[a]];
    }
    v->permuted = true;
    return true;
}

/* _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata]) or
 * _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype[, metadata]). */
static int rebuild_tensor(tctx *c, const pk_node *args, bool v3, const char *tname, tview *v)
{
    size_t min = v3 ? 7 : 6;
    if (args->n < min || args->n > min + 1) return terr(c, CKPT_EINVAL, "tensor '%s': _rebuild_tensor with %zu arguments", tname, args->n);
    const pk_node *pid = item(c, args, 0);
    if (pid->kind != PK_PERSID) return terr(c, CKPT_EINVAL, "tensor '%s': its storage is not a persistent id", tname);
    int rc = load_storage(c, pid, tname, &v->store);
    if (rc) return rc;
    const tstore *s = &c->st[v->store];
    uint64_t off, strides[CKPT_MAX_RANK];
    if (!as_u64(item(c, args, 1), &off)) return terr(c, CKPT_EINVAL, "tensor '%s': storage offset is not a non-negative integer", tname);
    if ((rc = read_dims(c, tname, item(c, args, 2), item(c, args, 3), &v->ndim, v->shape, strides))) return rc;
    unsigned el = s->el;
    v->dtype = (ckpt_dtype)s->dt;
    if (v3) {
        const pk_node *dt = item(c, args, 6);
        if (dt->kind != PK_GLOBAL || dt->tag < TAG_DTYPE0 || dt->tag >= TAG_DTYPE0 + (int)NDTYPES)
            return terr(c, CKPT_EINVAL, "tensor '%s': _rebuild_tensor_v3 without a dtype", tname);
        const torch_type *tt = &DTYPES[dt->tag - TAG_DTYPE0];
        if (tt->dt == NO_DT) return terr(c, CKPT_EINVAL, "tensor '%s': dtype torch.%s has no safetensors dtype", tname, tt->name);
        if (!s->untyped) return terr(c, CKPT_EINVAL, "tensor '%s': _rebuild_tensor_v3 of a typed storage", tname);
        v->dtype = (ckpt_dtype)tt->dt;
        el = tt->el;
    } else if (s->untyped) {
        return terr(c, CKPT_EINVAL, "tensor '%s': an untyped storage needs _rebuild_tensor_v3's dtype", tname);
    }
    uint64_t numel = 1, last = off, expect = 1;
    bool contiguous = true;
    for (int k = v->ndim - 1; k >= 0; k--) {
        uint64_t span;
        if (!ckpt_mul(numel, v->shape[k], &numel)) return terr(c, CKPT_ELIMIT, "tensor '%s': element count overflows", tname);
        if (v->shape[k] != 1 && strides[k] != expect) contiguous = false;
        if (v->shape[k] && (!ckpt_mul(v->shape[k] - 1, strides[k], &span) || !ckpt_add(last, span, &last)))
            return terr(c, CKPT_EINVAL, "tensor '%s': a view past the end of its storage", tname);
        expect *= v->shape[k] ? v->shape[k] : 1;
    }
    uint64_t cap = s->nbytes / el; /* elements of this dtype in the storage */
    if (numel == 0) {
        v->lo = v->hi = 0;
        return 0;
    }
    if (last >= cap)
        return terr(c, CKPT_EINVAL,
                    "tensor '%s': view (offset %" PRIu64 ") reaches element %" PRIu64 " of a storage of %" PRIu64 " elements",
                    tname, off, last, cap);
    if (!contiguous && !permuted_block(v, strides))
        return terr(c, CKPT_EINVAL,
                    "tensor '%s' is a strided view (not a permutation of a contiguous block); ckpt cannot copy it: "
                    "save it with .contiguous()",
                    tname);
    v->lo = off * el;
    v->hi = v->lo + numel * el;
    return 0;
}

/* Evaluates a tensor-making call (depth-bounded: _rebuild_from_type_v2 nests). */
static int eval_tensor(tctx *c, const pk_node *call, const char *tname, int depth, tview *v)
{
    if (depth > 4) return terr(c, CKPT_EINVAL, "tensor '%s': rebuild calls nested too deep", tname);
    if (call->kind != PK_CALL)
        return terr(c, CKPT_EINVAL, "entry '%s' is a %s, not a tensor", tname, pk_kind_name(call->kind));
    const pk_node *f = item(c, call, 0), *args = item(c, call, 1);
    switch (f->tag) {
    case T_V2:
    case T_V3:
        return rebuild_tensor(c, args, f->tag == T_V3, tname, v);
    case T_PARAM:
    case T_PARAM_STATE:
        if (args->n < 1) return terr(c, CKPT_EINVAL, "tensor '%s': _rebuild_parameter without data", tname);
        return eval_tensor(c, item(c, args, 0), tname, depth + 1, v);
    case T_FROM_TYPE: {
        if (args->n != 4) return terr(c, CKPT_EINVAL, "tensor '%s': _rebuild_from_type_v2 takes 4 arguments", tname);
        const pk_node *fn = item(c, args, 0), *type = item(c, args, 1), *inner = item(c, args, 2);
        if (type->kind != PK_GLOBAL || type->tag != T_CLASS)
            return terr(c, CKPT_EINVAL, "tensor '%s': rebuilt as a type other than Tensor or Parameter", tname);
        if (fn->kind != PK_GLOBAL || (fn->tag != T_V2 && fn->tag != T_V3 && fn->tag != T_PARAM) || inner->kind != PK_TUPLE)
            return terr(c, CKPT_EINVAL, "tensor '%s': _rebuild_from_type_v2 of something other than a tensor", tname);
        /* a synthetic call {fn, inner}: evaluate in place */
        if (fn->tag == T_PARAM) {
            if (inner->n < 1) return terr(c, CKPT_EINVAL, "tensor '%s': _rebuild_parameter without data", tname);
            return eval_tensor(c, item(c, inner, 0), tname, depth + 1, v);
        }
        return rebuild_tensor(c, inner, fn->tag == T_V3, tname, v);
    }
    default:
        return terr(c, CKPT_EINVAL, "entry '%s' is a call of '%s', not a tensor", tname, f->s);
    }
}

/* The state dict: the root dict, or its "state_dict" / "model" entry when that is a dict. */
static const pk_node *state_dict(tctx *c, const pk_node *root)
{
    static const char *const wrappers[] = {"state_dict", "model"};
    for (size_t w = 0; w < CKPT_ARRAY_LEN(wrappers); w++)
        for (size_t k = 0; k + 1 < root->n; k += 2) {
            const pk_node *key = item(c, root, k), *val = item(c, root, k + 1);
            if (key->kind == PK_STR && !strcmp(key->s, wrappers[w]) && val->kind == PK_DICT) return val;
        }
    return root;
}

/* torch_open_tree: the tensors of dict d (and of the dicts in it, to
 * TORCH_MAX_NESTING), named by their keys joined with '.' after prefix;
 * values that are not tensors or dicts (lists, numbers, torch.Size) are left
 * to the caller, who reads them in the pickle tree. */
static int collect_nested(tctx *c, const pk_node *d, const char *prefix, int depth)
{
    if (depth > TORCH_MAX_NESTING) return terr(c, CKPT_ELIMIT, "dicts nested deeper than %d at '%s'", TORCH_MAX_NESTING, prefix);
    for (size_t k = 0; k + 1 < d->n; k += 2) {
        const pk_node *key = item(c, d, k), *val = item(c, d, k + 1);
        if (val->kind != PK_DICT && val->kind != PK_CALL) continue;
        char num[24];
        const char *ks = num;
        if (key->kind == PK_STR && strlen(key->s) == key->slen && key->slen && key->slen <= ST_MAX_NAME && !strchr(key->s, '.'))
            ks = key->s;
        else if (key->kind == PK_INT && !key->s && key->i >= 0)
            snprintf(num, sizeof num, "%lld", (long long)key->i);
        else
            return terr(c, CKPT_EINVAL, "a key under '%s' that is neither a name without '.' nor an index", *prefix ? prefix : "(top)");
        char *name = *prefix ? ckpt_sprintf("%s.%s", prefix, ks) : ckpt_strdup(ks);
        if (!name || ckpt_grow(&c->names, &c->cap_names, c->nnames + 1, sizeof *c->names)) {
            free(name);
            return CKPT_ENOMEM;
        }
        c->names[c->nnames++] = name;
        if (strlen(name) > ST_MAX_NAME) return terr(c, CKPT_ELIMIT, "a key path longer than %d bytes", ST_MAX_NAME);
        int rc;
        if (val->kind == PK_DICT) {
            rc = collect_nested(c, val, name, depth + 1);
        } else {
            if (c->ntv >= ST_MAX_TENSORS) return terr(c, CKPT_ELIMIT, "more than %d tensors", ST_MAX_TENSORS);
            if (ckpt_grow(&c->tv, &c->cap_tv, c->ntv + 1, sizeof *c->tv)) return CKPT_ENOMEM;
            tview *v = &c->tv[c->ntv];
            memset(v, 0, sizeof *v);
            v->name = name;
            rc = eval_tensor(c, val, name, 0, v);
            if (!rc) c->ntv++;
        }
        if (rc) return rc;
    }
    return 0;
}

static int collect(tctx *c)
{
    const pk_node *root = N(c, c->doc.root);
    if (c->tree) {
        if (root->kind != PK_DICT) return terr(c, CKPT_EINVAL, "the pickle holds a %s, not a dict", pk_kind_name(root->kind));
        return collect_nested(c, root, "", 0);
    }
    if (c->single) { /* torch.save(tensor): the root is the tensor itself */
        if (!(c->tv = ckpt_calloc(1, sizeof *c->tv))) return CKPT_ENOMEM;
        c->tv[0].name = c->single;
        int rc = eval_tensor(c, root, c->single, 0, &c->tv[0]);
        if (!rc) c->ntv = 1;
        return rc;
    }
    if (root->kind != PK_DICT)
        return terr(c, CKPT_EINVAL, "the pickle holds a %s, not a state dict (a dict of names to tensors)", pk_kind_name(root->kind));
    const pk_node *sd = state_dict(c, root);
    if (sd->n / 2 > ST_MAX_TENSORS) return terr(c, CKPT_ELIMIT, "%zu tensors, at most %d", sd->n / 2, ST_MAX_TENSORS);
    c->tv = ckpt_calloc(sd->n / 2 + 1, sizeof *c->tv);
    if (!c->tv) return CKPT_ENOMEM;
    for (size_t k = 0; k + 1 < sd->n; k += 2) {
        const pk_node *key = item(c, sd, k), *val = item(c, sd, k + 1);
        if (key->kind != PK_STR || strlen(key->s) != key->slen || key->slen == 0 || key->slen > ST_MAX_NAME)
            return terr(c, CKPT_EINVAL, "a state dict key that is not a tensor name (%s)", pk_kind_name(key->kind));
        tview *v = &c->tv[c->ntv];
        v->name = key->s;
        int rc = eval_tensor(c, val, key->s, 0, v);
        if (rc) return rc;
        c->ntv++;
    }
    return 0;
}

/* ---- shared storages ---- */

static int cmp_view(const void *a, const void *b)
{
    const tview *x = a, *y = b;
    bool ex = x->hi == x->lo, ey = y->hi == y->lo; /* empty views last: they share no bytes */
    if (ex != ey) return ex ? 1 : -1;
    if (x->store != y->store) return x->store < y->store ? -1 : 1;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    if (x->hi != y->hi) return x->hi > y->hi ? -1 : 1;
    return strcmp(x->name, y->name);
}

static bool is_discard_name(const char *n)
{
    size_t len = strlen(n), m = strlen("lm_head.weight");
    return len >= m && !strcmp(n + len - m, "lm_head.weight") && (len == m || n[len - m - 1] == '.');
}

/* Which of two identical views keeps the name: not a tied output head when
 * the other is not (transformers' _tied_weights_keys, which convert.py passes
 * as discard_names), else the first in sorted order. */
static bool keeps_over(const tview *a, const tview *b)
{
    bool da = is_discard_name(a->name), db = is_discard_name(b->name);
    if (da != db) return db;
    return strcmp(a->name, b->name) < 0;
}

static int dedupe(tctx *c)
{
    if (c->ntv) qsort(c->tv, c->ntv, sizeof *c->tv, cmp_view); /* a tree may hold no tensor (tv NULL) */
    for (size_t i = 0; i < c->ntv;) {
        size_t j = i + 1;
        uint64_t hi = c->tv[i].hi;
        while (j < c->ntv && c->tv[j].store == c->tv[i].store && c->tv[j].lo < hi && c->tv[j].hi > c->tv[j].lo) {
            if (c->tv[j].hi > hi) hi = c->tv[j].hi;
            j++;
        }
        size_t keep = i;
        for (size_t k = i + 1; k < j; k++) {
            const tview *a = &c->tv[i], *b = &c->tv[k];
            if (b->lo != a->lo || b->hi != a->hi || b->dtype != a->dtype || b->ndim != a->ndim ||
                memcmp(b->shape, a->shape, (size_t)a->ndim * sizeof a->shape[0]) || b->permuted != a->permuted ||
                (a->permuted && memcmp(b->axes, a->axes, (size_t)a->ndim)))
                return terr(c, CKPT_EINVAL, "tensors '%s' and '%s' are different views of overlapping bytes of storage '%s'", a->name,
                            b->name, c->st[a->store].key);
            if (keeps_over(b, &c->tv[keep])) keep = k;
        }
        for (size_t k = i; k < j; k++)
            if (k != keep) {
                c->tv[k].alias = true;
                c->tv[k].kept = c->tv[keep].name;
            }
        i = j;
    }
    return 0;
}

/* ---- the containers ---- */

static int read_entry(tctx *c, const zip_entry *e, uint64_t max, char **out)
{
    if (e->size > max) return terr(c, CKPT_ELIMIT, "'%s' is %" PRIu64 " bytes, at most %" PRIu64, e->name, e->size, max);
    char *buf = ckpt_malloc((size_t)e->size + 1);
    if (!buf) return CKPT_ENOMEM;
    int rc = c->rd(c->ctx, buf, (size_t)e->size, e->data_offset);
    if (!rc && zipdir_crc32(0, buf, (size_t)e->size) != e->crc32)
        rc = terr(c, CKPT_EINVAL, "'%s' does not match its CRC-32", e->name);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[e->size] = 0;
    *out = buf;
    return 0;
}

static int run_pickle(tctx *c, const uint8_t *buf, size_t len, const char *what, pk_doc *d, bool persid)
{
    allow_init();
    char label[ST_MAX_NAME + 64];
    snprintf(label, sizeof label, "%s: %s", c->label, what);
    pk_opts o = {.allow = ALLOW, .nallow = CKPT_ARRAY_LEN(ALLOW), .allow_persid = persid && !c->raw};
    pk_global_def *both = NULL;
    if (c->nextra) { /* the caller's globals after torch's */
        if (!(both = ckpt_calloc(CKPT_ARRAY_LEN(ALLOW) + c->nextra, sizeof *both))) return CKPT_ENOMEM;
        memcpy(both, ALLOW, sizeof ALLOW);
        memcpy(both + CKPT_ARRAY_LEN(ALLOW), c->extra, c->nextra * sizeof *both);
        o.allow = both;
        o.nallow += c->nextra;
    }
    int rc = pk_parse(d, label, buf, len, &o);
    free(both);
    return rc;
}

static int parse_zip(tctx *c)
{
    zip_dir z;
    int rc = zipdir_read(&z, c->label, c->rd, c->ctx, c->file_size);
    if (rc) return rc;
    char *prefix = NULL, *pkl = NULL;
    const char *slash = z.n ? strchr(z.e[0].name, '/') : NULL;
    if (!slash) rc = terr(c, CKPT_EINVAL, "the archive has no '<name>/data.pkl' (not a torch.save file)");
    if (!rc && !(prefix = ckpt_strndup(z.e[0].name, (size_t)(slash - z.e[0].name + 1)))) rc = CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < z.n; i++)
        if (strncmp(z.e[i].name, prefix, strlen(prefix)))
            rc = terr(c, CKPT_EINVAL, "entry '%s' is outside the archive folder '%s'", z.e[i].name, prefix);
    char name[ST_MAX_NAME + 128];
    const zip_entry *e = NULL;
    if (!rc) {
        snprintf(name, sizeof name, "%sconstants.pkl", prefix);
        if (zipdir_find(&z, name)) rc = terr(c, CKPT_EINVAL, "a TorchScript archive (torch.jit.save), not a torch.save file");
    }
    if (!rc) {
        snprintf(name, sizeof name, "%sbyteorder", prefix);
        if ((e = zipdir_find(&z, name))) {
            char *bo = NULL;
            rc = zipdir_find_stored(&z, c->label, name, &e);
            if (!rc) rc = read_entry(c, e, 16, &bo);
            if (!rc && strcmp(bo, "little")) rc = terr(c, CKPT_EINVAL, "byteorder '%s' (only little-endian files are read)", bo);
            free(bo);
        }
    }
    if (!rc) {
        snprintf(name, sizeof name, "%sdata.pkl", prefix);
        rc = zipdir_find_stored(&z, c->label, name, &e);
    }
    if (!rc) rc = read_entry(c, e, TORCH_MAX_PICKLE, &pkl);
    if (!rc) rc = run_pickle(c, (const uint8_t *)pkl, (size_t)e->size, "data.pkl", &c->doc, true);
    if (!rc && c->doc.consumed != e->size)
        rc = terr(c, CKPT_EINVAL, "data.pkl has %" PRIu64 " bytes after its STOP", e->size - c->doc.consumed);
    free(pkl);
    if (!rc && !c->raw) rc = collect(c);
    for (size_t i = 0; !rc && i < c->nst; i++) {
        tstore *s = &c->st[i];
        snprintf(name, sizeof name, "%sdata/%s", prefix, s->key);
        rc = zipdir_find_stored(&z, c->label, name, &e);
        if (!rc && e->size != s->nbytes)
            rc = terr(c, CKPT_EINVAL, "storage '%s' is %" PRIu64 " bytes (torch.%s of %" PRIu64 ") but its entry holds %" PRIu64,
                      s->key, s->nbytes, s->type_name, s->numel, e->size);
        if (!rc) s->file_off = e->data_offset;
    }
    free(prefix);
    zipdir_free(&z);
    return rc;
}

/* The five pickles of a legacy file within buf[0..len); the object pickle
 * stays in c->doc, the storage keys in *keys; *end is where storages begin. */
static int parse_legacy_pickles(tctx *c, const uint8_t *buf, size_t len, pk_doc *keys, size_t *end, bool *truncated)
{
    pk_doc d;
    size_t pos = 0;
    static const char *what[] = {"magic number", "protocol version", "sys_info", "object pickle", "storage keys"};
    int rc = 0;
    *truncated = false;
    for (int k = 0; k < 5 && !rc; k++) {
        pk_doc *into = k == 3 ? &c->doc : k == 4 ? keys : &d;
        rc = run_pickle(c, buf + pos, len - pos, what[k], into, k == 3);
        if (rc) {
            *truncated = into->truncated;
            break;
        }
        const pk_node *r = pk_at(into, into->root);
        if (k == 0 && !(r->kind == PK_INT && r->s && r->slen == sizeof LEGACY_MAGIC && !memcmp(r->s, LEGACY_MAGIC, r->slen)))
            rc = terr(c, CKPT_EINVAL, "not a torch.save file: no legacy magic number (and not a zip)");
        if (k == 1 && !(r->kind == PK_INT && !r->s && r->i == 1001))
            rc = terr(c, CKPT_EINVAL, "legacy protocol version is not 1001");
        if (k == 2) {
            bool little = false;
            for (size_t j = 0; r->kind == PK_DICT && j + 1 < r->n; j += 2) {
                const pk_node *key = pk_item(into, r, j), *val = pk_item(into, r, j + 1);
                if (key->kind == PK_STR && !strcmp(key->s, "little_endian")) little = val->kind == PK_BOOL && val->i;
            }
            if (!little) rc = terr(c, CKPT_EINVAL, "legacy sys_info says the file is not little-endian");
        }
        pos += into->consumed;
        if (k < 3) pk_free(&d);
    }
    *end = pos;
    return rc;
}

static int parse_legacy(tctx *c)
{
    size_t len = c->file_size < (1u << 20) ? (size_t)c->file_size : (1u << 20), end = 0;
    pk_doc keys;
    memset(&keys, 0, sizeof keys);
    int rc;
    for (;;) {
        uint8_t *buf = ckpt_malloc(len + 1);
        if (!buf) return CKPT_ENOMEM;
        bool truncated = false;
        rc = c->rd(c->ctx, buf, len, 0);
        if (!rc) rc = parse_legacy_pickles(c, buf, len, &keys, &end, &truncated);
        free(buf);
        if (!rc || !truncated || len >= c->file_size || len >= TORCH_MAX_PICKLE) break;
        pk_free(&c->doc);
        pk_free(&keys);
        len = c->file_size - len < len ? (size_t)c->file_size : len * 2;
        if (len > TORCH_MAX_PICKLE) len = TORCH_MAX_PICKLE;
    }
    if (!rc && c->raw) {
        pk_free(&keys);
        return 0;
    }
    if (!rc) rc = collect(c);
    for (size_t i = 0; !rc && i < c->doc.n; i++) { /* storages of entries outside the state dict too */
        size_t ignored;
        if (c->doc.nodes[i].kind == PK_PERSID) rc = load_storage(c, &c->doc.nodes[i], NULL, &ignored);
    }
    const pk_node *kl = rc ? NULL : pk_at(&keys, keys.root);
    if (kl && kl->kind != PK_LIST) rc = terr(c, CKPT_EINVAL, "the legacy storage key list is not a list");
    uint64_t off = end;
    for (size_t i = 0; !rc && i < kl->n; i++) {
        const pk_node *k = pk_item(&keys, kl, i);
        tstore *s = NULL;
        for (size_t j = 0; k->kind == PK_STR && j < c->nst && !s; j++)
            if (!strcmp(c->st[j].key, k->s)) s = &c->st[j];
        if (!s) {
            rc = terr(c, CKPT_EINVAL, "legacy storage key %zu names no storage of the pickle", i);
            break;
        }
        if (s->file_off) {
            rc = terr(c, CKPT_EINVAL, "legacy storage '%s' listed twice", s->key);
            break;
        }
        uint8_t hdr[8];
        uint64_t data_end;
        if (!ckpt_add(off, 8, &data_end) || data_end > c->file_size || !ckpt_add(data_end, s->nbytes, &data_end) ||
            data_end > c->file_size) {
            rc = terr(c, CKPT_EINVAL, "legacy storage '%s' (%" PRIu64 " bytes at %" PRIu64 ") runs past the end of the file", s->key,
                      s->nbytes, off + 8);
            break;
        }
        if ((rc = c->rd(c->ctx, hdr, 8, off))) break;
        uint64_t n = 0;
        for (int b = 7; b >= 0; b--) n = n << 8 | hdr[b];
        if (n * s->el != s->nbytes || n != s->numel) {
            rc = terr(c, CKPT_EINVAL, "legacy storage '%s' says %" PRIu64 " elements, the pickle %" PRIu64, s->key, n, s->numel);
            break;
        }
        s->file_off = off + 8;
        off = data_end;
    }
    for (size_t j = 0; !rc && j < c->nst; j++)
        if (!c->st[j].file_off) rc = terr(c, CKPT_EINVAL, "legacy storage '%s' has no bytes in the file", c->st[j].key);
    pk_free(&keys);
    return rc;
}

/* ---- the st_file ---- */

static int cmp_by_name(const void *a, const void *b, void *ctx)
{
    const st_tensor *t = ctx;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

static int cmp_offset(const void *a, const void *b)
{
    const st_tensor *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_alias(const void *a, const void *b)
{
    return strcmp((*(tview *const *)a)->name, (*(tview *const *)b)->name);
}

static int fill(tctx *c, st_file *f)
{
    size_t nkeep = 0, nalias = 0;
    for (size_t i = 0; i < c->ntv; i++) c->tv[i].alias ? nalias++ : nkeep++;
    f->tensors = ckpt_calloc(nkeep + 1, sizeof *f->tensors);
    f->by_name = ckpt_calloc(nkeep + 1, sizeof *f->by_name);
    f->meta_keys = ckpt_calloc(nalias + 1, sizeof *f->meta_keys);
    f->meta_vals = ckpt_calloc(nalias + 1, sizeof *f->meta_vals);
    tview **aliases = ckpt_calloc(nalias + 1, sizeof *aliases);
    int rc = f->tensors && f->by_name && f->meta_keys && f->meta_vals && aliases ? 0 : CKPT_ENOMEM;
    size_t na = 0;
    for (size_t i = 0; !rc && i < c->ntv; i++) {
        const tview *v = &c->tv[i];
        if (v->alias) {
            aliases[na++] = &c->tv[i];
            continue;
        }
        st_tensor *t = &f->tensors[f->ntensors];
        if (!(t->name = ckpt_strdup(v->name))) {
            rc = CKPT_ENOMEM;
            break;
        }
        f->ntensors++;
        t->dtype = v->dtype;
        t->ndim = v->ndim;
        memcpy(t->shape, v->shape, sizeof t->shape);
        t->offset = c->st[v->store].file_off + v->lo;
        t->nbytes = v->hi - v->lo;
        t->begin = t->offset;
        t->end = t->offset + t->nbytes;
        if (v->permuted) {
            t->view = true;
            memcpy(t->view_axes, v->axes, sizeof t->view_axes);
            memcpy(t->stored_shape, v->stored, sizeof t->stored_shape);
        }
    }
    if (!rc) {
        qsort(f->tensors, f->ntensors, sizeof *f->tensors, cmp_offset);
        for (size_t i = 0; i < f->ntensors; i++) f->by_name[i] = i;
        qsort_r(f->by_name, f->ntensors, sizeof *f->by_name, cmp_by_name, f->tensors);
        for (size_t i = 1; i < f->ntensors; i++)
            if (!strcmp(f->tensors[f->by_name[i - 1]].name, f->tensors[f->by_name[i]].name))
                rc = terr(c, CKPT_EINVAL, "tensor '%s' appears twice in the state dict", f->tensors[f->by_name[i]].name);
        qsort(aliases, na, sizeof *aliases, cmp_alias);
    }
    for (size_t i = 0; !rc && i < na; i++) {
        if (!(f->meta_keys[i] = ckpt_strdup(aliases[i]->name)) || !(f->meta_vals[i] = ckpt_strdup(aliases[i]->kept))) rc = CKPT_ENOMEM;
        f->nmeta = i + 1;
        if (!rc && i && !strcmp(aliases[i - 1]->name, aliases[i]->name))
            rc = terr(c, CKPT_EINVAL, "tensor '%s' appears twice in the state dict", aliases[i]->name);
        if (!rc && st_find(f, aliases[i]->name))
            rc = terr(c, CKPT_EINVAL, "tensor '%s' appears twice in the state dict", aliases[i]->name);
    }
    free(aliases);
    return rc;
}

const char *torch_dtype_at(size_t i, int *dt)
{
    if (i >= NDTYPES) return NULL;
    *dt = DTYPES[i].dt;
    return DTYPES[i].name;
}

/* Parses the file c describes into f (or, raw, its pickle into *doc). */
static int parse_ctx(tctx *c, st_file *f, pk_doc *doc)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    uint8_t head[32] = {0};
    size_t hl = c->file_size < sizeof head ? (size_t)c->file_size : sizeof head;
    int rc = c->rd(c->ctx, head, hl, 0);
    const char *kind = rc ? NULL : torch_sniff(head, hl);
    if (!rc && !kind) rc = terr(c, CKPT_EINVAL, "not a torch.save file (neither a zip nor a pickle)");
    if (!rc) rc = !strcmp(kind, "zip") ? parse_zip(c) : parse_legacy(c);
    if (!rc && c->raw) {
        *doc = c->doc;
        memset(&c->doc, 0, sizeof c->doc);
    } else {
        if (!rc && c->tree) {
            *doc = c->doc;
            memset(&c->doc, 0, sizeof c->doc);
        }
        if (!rc) rc = dedupe(c);
        if (!rc && !(f->path = ckpt_strdup(c->label))) rc = CKPT_ENOMEM;
        if (!rc) {
            f->file_size = c->file_size;
            f->from_torch = true;
            rc = fill(c, f);
        }
    }
    for (size_t i = 0; i < c->nst; i++) free(c->st[i].key);
    free(c->st);
    free(c->tv);
    for (size_t i = 0; i < c->nnames; i++) free(c->names[i]);
    free(c->names);
    pk_free(&c->doc);
    if (rc) {
        st_close(f);
        if (c->tree) pk_free(doc);
    }
    return rc;
}

int torch_parse(st_file *f, const char *label, zip_read_fn rd, void *ctx, uint64_t file_size)
{
    tctx c = {.label = label, .rd = rd, .ctx = ctx, .file_size = file_size};
    return parse_ctx(&c, f, NULL);
}

int torch_parse_tree(st_file *f, pk_doc *doc, const char *label, zip_read_fn rd, void *ctx, uint64_t file_size)
{
    memset(doc, 0, sizeof *doc);
    tctx c = {.label = label, .rd = rd, .ctx = ctx, .file_size = file_size, .tree = true};
    return parse_ctx(&c, f, doc);
}

int torch_parse_tensor(st_file *f, const char *label, zip_read_fn rd, void *ctx, uint64_t size)
{
    tctx c = {.label = label, .rd = rd, .ctx = ctx, .file_size = size, .single = "tensor"};
    return parse_ctx(&c, f, NULL);
}

typedef struct {
    int fd;
    const char *path;
} fd_src;

static int fd_read(void *ctx, void *buf, size_t len, uint64_t off)
{
    const fd_src *s = ctx;
    return ckpt_pread_full(s->fd, buf, len, off, s->path);
}

/* Opens path and parses it as c says (c's source fields are filled here). */
static int open_ctx(tctx *c, const char *path, st_file *f, pk_doc *doc)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return ckpt_error_set(CKPT_ENOTFOUND, "%s: no such file", path);
        return ckpt_error_sys("%s: open", path);
    }
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        int rc = ckpt_error_sys("%s: stat", path);
        close(fd);
        return rc;
    }
    fd_src src = {fd, path};
    c->label = path;
    c->rd = fd_read;
    c->ctx = &src;
    c->file_size = (uint64_t)sb.st_size;
    int rc = parse_ctx(c, f, doc);
    if (rc || c->raw) {
        close(fd);
        return rc;
    }
    f->fd = fd;
    return 0;
}

int torch_open(st_file *f, const char *path)
{
    tctx c = {0};
    return open_ctx(&c, path, f, NULL);
}

int torch_open_tensor(st_file *f, const char *path, const char *name)
{
    tctx c = {.single = name};
    return open_ctx(&c, path, f, NULL);
}

int torch_open_tree(st_file *f, pk_doc *doc, const char *path)
{
    memset(doc, 0, sizeof *doc);
    tctx c = {.tree = true};
    return open_ctx(&c, path, f, doc);
}

int torch_load_pickle(pk_doc *doc, const char *path, const pk_global_def *extra, size_t nextra)
{
    memset(doc, 0, sizeof *doc);
    st_file unused;
    tctx c = {.raw = true, .extra = extra, .nextra = nextra};
    return open_ctx(&c, path, &unused, doc);
}

int torch_parse_pickle(pk_doc *doc, const char *label, zip_read_fn rd, void *ctx, uint64_t file_size,
                       const pk_global_def *extra, size_t nextra)
{
    memset(doc, 0, sizeof *doc);
    st_file unused;
    tctx c = {.label = label, .rd = rd, .ctx = ctx, .file_size = file_size, .raw = true, .extra = extra, .nextra = nextra};
    return parse_ctx(&c, &unused, doc);
}

int torch_global_dtype(const pk_node *g)
{
    if (g->kind != PK_GLOBAL || g->tag < TAG_DTYPE0 || g->tag >= TAG_DTYPE0 + (int)NDTYPES) return -1;
    return DTYPES[g->tag - TAG_DTYPE0].dt;
}

int tensor_file_open(st_file *f, const char *path)
{
    uint8_t head[32];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : pread(fd, head, sizeof head, 0);
    if (fd >= 0) close(fd);
    if (n >= 2 && torch_sniff(head, (size_t)n)) return torch_open(f, path);
    return st_open(f, path);
}

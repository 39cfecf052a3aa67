/*
 * easydel_legacy.c — `ckpt consolidate SAVE DST --state` of an older EasyDeL
 * save (easydel_import.h, docs/easydel.md "The older save"), and what both
 * --state paths share: a slot added to the staged optimizer, a leaf left out
 * (listed), optimizer.json and metadata.json.
 */
#include "transform/easydel_import.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "format/checkpoint.h"
#include "format/easydel.h"
#include "format/easydel_tree.h"
#include "format/safetensors.h"
#include "transform/state_convert.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int easydel_add_slot(st_layout *l, const char *param, const char *slot, ckpt_dtype dt, int ndim, const uint64_t *shape,
                     size_t user, json_t *slotset, bool *added)
{
    char *name = ckpt_sprintf("%s/%s", param, slot);
    if (!name) return CKPT_ENOMEM;
    int rc = st_layout_add(l, name, dt, ndim, shape, user);
    free(name);
    *added = rc == 0;
    if (rc == CKPT_EINVAL) {
        ckpt_error_clear();
        return 0; /* the same <param>/<slot> twice (chained optimizers): the first one kept */
    }
    if (!rc && json_object_set_new(slotset, slot, json_true())) rc = CKPT_ENOMEM;
    return rc;
}

int easydel_left_out(json_t *list, const char *src, const char *what, const char *name, const char *key, const char *why,
                     bool quiet)
{
    if (!quiet) ckpt_info("%s: left out %s '%s'%s%s%s: %s", src, what, name, key ? " (" : "", key ? key : "", key ? ")" : "", why);
    return json_array_append_new(list, json_pack("{s:s, s:s*, s:s}", "name", name, "key", key, "why", why)) ? CKPT_ENOMEM : 0;
}

static int cmp_cstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int easydel_write_state_files(const char *staging, json_t *slotset, json_t *scalars, json_t *left_out, int64_t step)
{
    size_t n = json_object_size(slotset), k = 0;
    const char **names = ckpt_calloc(n + 1, sizeof *names), *key;
    json_t *v, *slots = json_array();
    int rc = names && slots ? 0 : CKPT_ENOMEM;
    if (!rc) json_object_foreach(slotset, key, v) names[k++] = key;
    if (!rc) qsort(names, n, sizeof *names, cmp_cstr);
    for (k = 0; !rc && k < n; k++)
        if (json_array_append_new(slots, json_string(names[k]))) rc = CKPT_ENOMEM;
    free(names);
    json_t *opt = rc ? NULL : json_pack("{s:s,s:{},s:O,s:O}", "name", "optax", "hyperparameters", "slots", slots, "scalars", scalars);
    /* what could not be mapped is kept with the state, not only said on stderr */
    if (opt && json_array_size(left_out) && json_object_set(opt, "left_out", left_out)) rc = CKPT_ENOMEM;
    json_t *meta = rc ? NULL : json_pack("{s:s,s:i,s:I,s:b}", "format", CKPT_STATE_FORMAT, "version", CKPT_STATE_VERSION,
                                         "step", (json_int_t)step, "has_optimizer_state", 1);
    if (!rc && (!opt || !meta)) rc = CKPT_ENOMEM;
    char *po = rc ? NULL : ckpt_path_join(staging, STATE_OPTIMIZER_FILE), *pm = rc ? NULL : ckpt_path_join(staging, STATE_METADATA_FILE);
    if (!rc) rc = po && pm ? cj_write_file(po, opt) : CKPT_ENOMEM;
    if (!rc) rc = cj_write_file(pm, meta);
    free(po);
    free(pm);
    json_decref(opt);
    json_decref(meta);
    json_decref(slots);
    return rc;
}

/* ---- the older save ---- */

typedef struct {
    const ckpt_checkpoint *opt;
} copy_ctx;

static int copy_fill(void *vctx, const st_out_tensor *t, int fd, const char *path)
{
    const copy_ctx *cc = vctx;
    const ckpt_tensor_ref *r = &cc->opt->tensors[t->user];
    return ckpt_copy_range(cc->opt->files[r->file].fd, r->t->offset, fd, t->offset, t->nbytes, path);
}

/* "param_{i}" or "param_idx_{i}" (load_optimizer tries both): i, or -1. */
static long leaf_index(const char *name)
{
    const char *d = !strncmp(name, "param_idx_", 10) ? name + 10 : !strncmp(name, "param_", 6) ? name + 6 : NULL;
    if (!d || !*d || strlen(d) > 9 || (d[0] == '0' && d[1])) return -1;
    long i = 0;
    for (; *d; d++) {
        if (*d < '0' || *d > '9') return -1;
        i = i * 10 + (*d - '0');
    }
    return i;
}

static bool is_model_tensor(void *model, const char *name) { return ckpt_checkpoint_find(model, name) != NULL; }

typedef struct {
    const char *src;
    const ckpt_checkpoint *model, *opt;
    const edtree *tree;
    const size_t *tensor_of; /* leaf i -> index in opt->tensors */
    bool quiet;
} legacy_ctx;

/* Leaf i: a scalar, a slot, or left out (listed). */
static int map_leaf(const legacy_ctx *x, size_t i, st_layout *l, json_t *slotset, json_t *scalars, json_t *left_out, size_t *nslots)
{
    const ckpt_tensor_ref *r = &x->opt->tensors[x->tensor_of[i]];
    const edtree_leaf *lf = &x->tree->leaves[i];
    const char *key = lf->key;
    if (r->t->ndim == 0 && r->t->nbytes <= 8) {
        uint8_t b[8] = {0};
        double v;
        int rc = ckpt_pread_full(x->opt->files[r->file].fd, b, (size_t)r->t->nbytes, r->t->offset, r->t->name);
        if (!rc && ckpt_scalar_value(r->t->dtype, b, &v) == 0) {
            const char *last = strrchr(key, '.');
            return json_object_set_new(scalars, last ? last + 1 : *key ? key : r->t->name, json_real(v)) ? CKPT_ENOMEM : 0;
        }
        if (rc) return rc;
    }
    char slot[256];
    size_t at = lf->param_at;
    if (at != EDTREE_NO_PARAM && !ckpt_checkpoint_find(x->model, key + at))
        return ckpt_error_set(CKPT_EINVAL, "%s/%s: leaf %zu ('%s') is the parameter '%s', which %s does not hold", x->src,
                              EASYDEL_LEGACY_STRUCT, i, key, key + at, x->model->path);
    if (at == EDTREE_NO_PARAM) at = easydel_param_suffix(key, is_model_tensor, (void *)x->model);
    const ckpt_tensor_ref *m = at == EDTREE_NO_PARAM ? NULL : ckpt_checkpoint_find(x->model, key + at);
    bool slotted = m && easydel_slot_before(key, at, slot, sizeof slot);
    bool fits = slotted && m->t->ndim == r->t->ndim &&
                !memcmp(m->t->shape, r->t->shape, (size_t)r->t->ndim * sizeof *r->t->shape);
    const char *why = !m ? "names no parameter of the model" : !slotted ? "no slot name before its parameter's key"
                                                                        : "not a slot of its parameter (another shape, or a second one)";
    int rc = fits ? easydel_add_slot(l, m->t->name, slot, r->t->dtype, r->t->ndim, r->t->shape, x->tensor_of[i], slotset, &fits) : 0;
    if (rc) return rc;
    if (fits) {
        (*nslots)++;
        return 0;
    }
    return easydel_left_out(left_out, x->src, "optimizer leaf", r->t->name, key, why, x->quiet);
}

/* Every optimizer tensor is param_{i} of a leaf, each leaf has one. */
static int match_leaves(const char *src, const edtree *t, const ckpt_checkpoint *opt, size_t *tensor_of)
{
    if (opt->ntensors != t->nleaves)
        return ckpt_error_set(CKPT_EINVAL, "%s: %s has %zu leaves, %s %zu tensors", src, EASYDEL_LEGACY_STRUCT, t->nleaves,
                              EASYDEL_LEGACY_OPT, opt->ntensors);
    for (size_t i = 0; i < t->nleaves; i++) tensor_of[i] = (size_t)-1;
    for (size_t j = 0; j < opt->ntensors; j++) {
        const char *name = opt->tensors[j].t->name;
        long i = leaf_index(name);
        if (i < 0 || (size_t)i >= t->nleaves)
            return ckpt_error_set(CKPT_EINVAL, "%s: %s: tensor '%s' is not param_{i} of one of the %zu leaves", src,
                                  EASYDEL_LEGACY_OPT, name, t->nleaves);
        if (tensor_of[i] != (size_t)-1)
            return ckpt_error_set(CKPT_EINVAL, "%s: %s: leaf %ld is stored twice ('%s')", src, EASYDEL_LEGACY_OPT, i, name);
        tensor_of[i] = j;
    }
    return 0;
}

/* The optimizer's files of an older save: its index, else the one file. */
static char *legacy_opt_path(const char *src)
{
    static const char *const names[] = {EASYDEL_LEGACY_OPT_INDEX, EASYDEL_LEGACY_OPT};
    for (size_t i = 0; i < 2; i++) {
        char *p = ckpt_path_join(src, names[i]);
        if (!p || ckpt_exists(p)) return p;
        free(p);
    }
    return NULL;
}

/* model becomes one checkpoint with the staged optimizer.safetensors, as
 * state_checkpoint_open opens a training state's folder. */
static int join_staged(const char *src, ckpt_checkpoint *model, const char *staging)
{
    ckpt_checkpoint opt, joined;
    int rc = ckpt_checkpoint_open_prefix(&opt, staging, "optimizer");
    if (!rc) rc = state_checkpoint_join(&joined, src, model, &opt);
    if (!rc) *model = joined;
    return rc;
}

int easydel_legacy_state(const char *src, ckpt_checkpoint *model, const char *staging, bool quiet)
{
    char *spath = ckpt_path_join(src, EASYDEL_LEGACY_STRUCT), *opath = legacy_opt_path(src);
    int rc = spath ? 0 : CKPT_ENOMEM;
    if (!rc && (!opath || !ckpt_exists(spath)))
        rc = ckpt_error_set(CKPT_ENOTFOUND, "%s: --state needs %s and %s (the save has no optimizer)", src,
                            EASYDEL_LEGACY_STRUCT, EASYDEL_LEGACY_OPT);
    edtree t;
    memset(&t, 0, sizeof t);
    ckpt_checkpoint opt;
    memset(&opt, 0, sizeof opt);
    bool opened = false;
    if (!rc) rc = edtree_read(&t, spath);
    if (!rc) opened = !(rc = ckpt_checkpoint_open(&opt, opath));
    size_t *tensor_of = rc ? NULL : ckpt_calloc(t.nleaves + 1, sizeof *tensor_of);
    if (!rc && !tensor_of) rc = CKPT_ENOMEM;
    if (!rc) rc = match_leaves(src, &t, &opt, tensor_of);
    st_layout l;
    st_layout_init(&l);
    json_t *scalars = json_object(), *slotset = json_object(), *left_out = json_array();
    if (!rc && (!scalars || !slotset || !left_out)) rc = CKPT_ENOMEM;
    legacy_ctx x = {.src = src, .model = model, .opt = &opt, .tree = &t, .tensor_of = tensor_of, .quiet = quiet};
    size_t n = 0;
    for (size_t i = 0; !rc && i < t.nleaves; i++) rc = map_leaf(&x, i, &l, slotset, scalars, left_out, &n);
    if (!rc && !n) rc = ckpt_error_set(CKPT_EINVAL, "%s: --state: no optimizer leaf is a slot of a parameter", src);
    if (!rc) rc = st_layout_finish(&l);
    char *path = rc ? NULL : ckpt_path_join(staging, "optimizer.safetensors");
    if (!rc && !path) rc = CKPT_ENOMEM;
    copy_ctx cc = {.opt = &opt};
    if (!rc) rc = st_write_file(path, &l, copy_fill, &cc);
    if (!rc && !t.has_step && !quiet) ckpt_info("%s: %s holds no step (a save before April 2025): step 0", src, EASYDEL_LEGACY_STRUCT);
    if (!rc) rc = easydel_write_state_files(staging, slotset, scalars, left_out, t.has_step ? t.step : 0);
    if (!rc && !quiet)
        ckpt_info("%s: %zu optimizer leaves became slots (%zu left out), step %lld", src, n, json_array_size(left_out),
                  (long long)(t.has_step ? t.step : 0));
    free(path);
    st_layout_free(&l);
    if (!rc) rc = join_staged(src, model, staging);
    json_decref(scalars);
    json_decref(slotset);
    json_decref(left_out);
    free(tensor_of);
    if (opened) ckpt_checkpoint_close(&opt);
    edtree_free(&t);
    free(spath);
    free(opath);
    return rc;
}

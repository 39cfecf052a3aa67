/* rebuild.c — the plan of one stored safetensors file (see rebuild.h). */
#include "store/rebuild.h"

#include "common/error.h"
#include "common/json.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A source for (blob, at, dtype, shape): the blob file is the source file, the
 * tensor starts at byte `at` (0 for a tensor blob; a tensor of a stored
 * torch.save file is a range of that file's blob, checked against the blob's
 * size by the executor). */
static int add_source(const rebuild_ctx *rb, const char *blob, uint64_t at, ckpt_dtype dt, int ndim,
                      const uint64_t *shape, const char *what, int32_t *idx)
{
    if (ndim < 0 || ndim > PLAN_MAX_DIM)
        return ckpt_error_set(CKPT_ECORRUPT, "%s: rank %d, at most %d is supported", what, ndim, PLAN_MAX_DIM);
    exec_plan *p = rb->exec;
    char *want = rb->blob_path(rb->ctx, blob);
    if (!want) return CKPT_ENOMEM;
    size_t pi = 0; /* 1 + the index of want in src_paths, 0 when new */
    if (rb->path_index) {
        json_t *at_index = json_object_get(rb->path_index, want);
        if (at_index) pi = (size_t)json_integer_value(at_index) + 1;
    } else {
        for (pi = p->nsrc_paths; pi > 0; pi--) /* recent first: a tensor's parts share blobs */
            if (!strcmp(p->src_paths[pi - 1], want)) break;
    }
    if (pi == 0) {
        int rc = ckpt_grow(&p->src_paths, &p->src_paths_cap, p->nsrc_paths + 1, sizeof *p->src_paths);
        if (!rc && rb->path_index && json_object_set_new(rb->path_index, want, json_integer((json_int_t)p->nsrc_paths)))
            rc = CKPT_ENOMEM;
        if (rc) {
            free(want);
            return rc;
        }
        p->src_paths[p->nsrc_paths] = want;
        pi = ++p->nsrc_paths;
    } else {
        free(want);
    }
    if (ckpt_grow(&p->sources, &p->sources_cap, p->nsources + 1, sizeof *p->sources)) return CKPT_ENOMEM;
    plan_source *src = &p->sources[p->nsources];
    memset(src, 0, sizeof *src);
    if (!(src->name = ckpt_strdup(blob))) return CKPT_ENOMEM;
    src->file = pi - 1;
    src->offset = at;
    src->dtype = dt;
    src->ndim = ndim;
    if (ndim) memcpy(src->shape, shape, (size_t)ndim * sizeof *shape);
    p->nsources++; /* counted before the checks below, so exec_plan_free frees its name */
    int rc = ckpt_dtype_nbytes(dt, ndim, shape, &src->nbytes);
    if (rc) return ckpt_error_prefix(CKPT_ECORRUPT, "%s", what);
    *idx = (int32_t)(p->nsources - 1);
    return 0;
}

/* Adds part p's element count to *covered; more than the tensor holds is an error. */
static int add_covered(uint64_t *covered, const plan_part *p, const plan_tensor *t, uint64_t numel,
                       const char *what)
{
    uint64_t n = 1; /* at most numel: the part lies inside the tensor (checked first) */
    for (int k = 0; k < t->ndim; k++) n *= p->ext[k];
    if (n > numel - *covered)
        return ckpt_error_set(CKPT_ECORRUPT, "%s: the parts overlap: they hold more than the tensor's %llu elements",
                              what, (unsigned long long)numel);
    *covered += n;
    return 0;
}

static bool is_sha256(const char *s)
{
    if (!s || strlen(s) != 64) return false;
    for (size_t i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

/* plan_part_from_json with a damaged catalog's code: CKPT_ECORRUPT. */
static int from_json(plan_part *p, const json_t *j, int ndim, int src_ndim, const char *what)
{
    int rc = plan_part_from_json(p, j, ndim, src_ndim, what);
    return rc == CKPT_EINVAL || rc == CKPT_ELIMIT ? CKPT_ECORRUPT : rc;
}

/* A recipe's parts come from the catalog, a file on disk: each is checked
 * against its tensor and its blob's shape before the executor sees it, and
 * together they must hold as many elements as the tensor (the store writes
 * every part, zeros included), so a damaged row is an error naming the file,
 * the tensor and the part, never a read outside a blob or a buffer. */
static int recipe_tensor(const rebuild_ctx *rb, plan_tensor *t, const char *recipe, const char *what)
{
    json_t *j;
    int rc = cj_load_buf(&j, recipe, strlen(recipe), what);
    if (rc) return rc;
    if (!json_is_array(j)) rc = ckpt_error_set(CKPT_ECORRUPT, "%s: the recipe is not an array", what);
    uint64_t numel = plan_tensor_numel(t), covered = 0;
    size_t i;
    json_t *jp;
    char pwhat[600];
    json_array_foreach(j, i, jp)
    {
        if (rc) break;
        snprintf(pwhat, sizeof pwhat, "%s: recipe part %zu", what, i);
        plan_part p;
        if (json_is_true(json_object_get(jp, "zero"))) {
            rc = from_json(&p, jp, t->ndim, 0, pwhat);
            if (!rc) rc = plan_part_check(&p, t->ndim, t->shape, NULL, CKPT_ECORRUPT, pwhat);
            if (!rc) rc = add_covered(&covered, &p, t, numel, pwhat);
            if (!rc) rc = plan_tensor_add_part(t, &p);
            continue;
        }
        /* One part, or a run of them over several blobs of one kind (an
         * expert stack: "srcs" and "lo_step", plan_parts_to_json). */
        json_t *runs = json_object_get(jp, "srcs");
        size_t count = runs ? plan_part_json_count(jp) : 1;
        if (runs && json_object_get(jp, "blob")) count = 0;
        json_t *jat = json_object_get(jp, "at");
        const char *dts = json_string_value(json_object_get(jp, "dtype"));
        json_t *js = json_object_get(jp, "shape");
        ckpt_dtype dt;
        size_t ndim = json_array_size(js);
        uint64_t shape[PLAN_MAX_DIM];
        if (count == 0 || count > PLAN_MAX_PARTS_PER_TENSOR || !dts || ckpt_dtype_from_name(dts, &dt) < 0 ||
            !json_is_array(js) || ndim > PLAN_MAX_DIM || (jat && (!json_is_integer(jat) || json_integer_value(jat) < 0))) {
            rc = ckpt_error_set(CKPT_ECORRUPT, "%s: bad recipe part %zu", what, i);
            break;
        }
        for (size_t k = 0; k < ndim; k++) {
            json_t *v = json_array_get(js, k);
            if (!json_is_integer(v) || json_integer_value(v) < 0) {
                rc = ckpt_error_set(CKPT_ECORRUPT, "%s: bad recipe part %zu", what, i);
                break;
            }
            shape[k] = (uint64_t)json_integer_value(v);
        }
        /* The executor converts between float dtypes only. */
        if (!rc && dt != t->dtype && !(ckpt_dtype_is_castable_float(dt) && ckpt_dtype_is_castable_float(t->dtype)))
            rc = ckpt_error_set(CKPT_ECORRUPT, "%s: recipe part %zu is %s, the tensor %s", what, i,
                                ckpt_dtype_name(dt), ckpt_dtype_name(t->dtype));
        for (size_t k = 0; !rc && k < count; k++) {
            const char *blob = runs ? plan_part_json_src(jp, k) : json_string_value(json_object_get(jp, "blob"));
            if (runs) snprintf(pwhat, sizeof pwhat, "%s: recipe part %zu (run part %zu)", what, i, k);
            if (!is_sha256(blob)) {
                rc = ckpt_error_set(CKPT_ECORRUPT, "%s: bad recipe part %zu", what, i);
                break;
            }
            int32_t idx;
            rc = plan_part_from_json_at(&p, jp, k, t->ndim, (int)ndim, pwhat);
            if (rc == CKPT_EINVAL || rc == CKPT_ELIMIT) rc = CKPT_ECORRUPT;
            if (!rc)
                rc = add_source(rb, blob, jat ? (uint64_t)json_integer_value(jat) : 0, dt, (int)ndim, shape, pwhat, &idx);
            if (!rc) {
                p.src = idx;
                rc = plan_part_check(&p, t->ndim, t->shape, &rb->exec->sources[idx], CKPT_ECORRUPT, pwhat);
            }
            if (!rc) rc = add_covered(&covered, &p, t, numel, pwhat);
            if (!rc) rc = plan_tensor_add_part(t, &p);
        }
    }
    if (!rc && covered != numel)
        rc = ckpt_error_set(CKPT_ECORRUPT, "%s: the recipe's parts hold %llu elements, the tensor %llu", what,
                            (unsigned long long)covered, (unsigned long long)numel);
    json_decref(j);
    return rc;
}

int rebuild_plan_file(const rebuild_ctx *rb, const char *path, const char *out_rel, const uint8_t *header,
                      size_t header_len, uint64_t size, exec_file *ef)
{
    st_file sf;
    int rc = st_parse(&sf, path, header, header_len, size);
    if (rc) return ckpt_error_prefix(CKPT_ECORRUPT, "stored header");
    st_layout_init(&ef->layout);
    ef->rel = ckpt_strdup(out_rel);
    ef->layout.header = ckpt_malloc(header_len);
    ef->layout.tensors = ckpt_calloc(sf.ntensors + 1, sizeof *ef->layout.tensors);
    ef->tensors = ckpt_calloc(sf.ntensors + 1, sizeof *ef->tensors);
    if (!ef->rel || !ef->layout.header || !ef->layout.tensors || !ef->tensors) rc = CKPT_ENOMEM;
    if (!rc) {
        memcpy(ef->layout.header, header, header_len);
        ef->layout.header_len = header_len;
        ef->layout.file_size = size;
        ef->layout.finished = true;
    }
    for (size_t i = 0; !rc && i < sf.ntensors; i++) {
        const st_tensor *t = &sf.tensors[i];
        char what[512];
        snprintf(what, sizeof what, "catalog: %s: tensor '%.200s'", path, t->name);
        /* The reader holds at most CKPT_MAX_RANK dimensions, the same limit
         * as PLAN_MAX_DIM; checked again here, where a shape is copied. */
        if (t->ndim < 0 || t->ndim > PLAN_MAX_DIM) {
            rc = ckpt_error_set(CKPT_ECORRUPT, "%s: rank %d, at most %d is supported", what, t->ndim, PLAN_MAX_DIM);
            break;
        }
        st_out_tensor *ot = &ef->layout.tensors[i];
        ot->name = ckpt_strdup(t->name);
        ot->dtype = t->dtype;
        ot->ndim = t->ndim;
        if (t->ndim) memcpy(ot->shape, t->shape, (size_t)t->ndim * sizeof *t->shape);
        ot->nbytes = t->nbytes;
        ot->offset = t->offset;
        ot->user = i;
        ef->layout.ntensors++;
        plan_tensor *pt = &rb->tensors[(*rb->ntensors)++];
        memset(pt, 0, sizeof *pt);
        pt->name = ckpt_strdup(t->name);
        pt->dtype = t->dtype;
        pt->ndim = t->ndim;
        if (t->ndim) memcpy(pt->shape, t->shape, (size_t)t->ndim * sizeof *t->shape);
        ef->tensors[i] = pt;
        ef->ntensors++;
        if (!ot->name || !pt->name) {
            rc = CKPT_ENOMEM;
            break;
        }
        const char *blob = NULL, *recipe = NULL;
        rc = rb->lookup(rb->ctx, path, t->name, &blob, &recipe);
        if (rc) break;
        if (blob) {
            int32_t idx;
            if (!is_sha256(blob)) rc = ckpt_error_set(CKPT_ECORRUPT, "%s: bad blob name", what);
            if (!rc) rc = add_source(rb, blob, 0, t->dtype, t->ndim, t->shape, what, &idx);
            if (!rc && t->nbytes) {
                plan_part p;
                plan_part_whole(&p, idx, t->ndim, t->shape);
                rc = plan_tensor_add_part(pt, &p);
            }
        } else if (recipe) {
            rc = recipe_tensor(rb, pt, recipe, what);
        } else {
            rc = ckpt_error_set(CKPT_ECORRUPT, "%s: neither blob nor recipe", what);
        }
    }
    st_close(&sf);
    return rc;
}

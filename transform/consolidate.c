/*
 * consolidate.c — rebuild the original checkpoint from a converted directory
 * and its ckpt-layout.json alone (docs/transforms.md §8).
 *
 * Every output part says which box of which original tensor it holds, so the
 * inverse needs no knowledge of the rules: each part becomes a part of the
 * original tensor reading from the stored tensor. Padding (zero parts) maps
 * to nothing and is dropped. A box held more than once — a replicated tensor
 * on every rank, a KV head replicated m times — is written from its first
 * holder (rank 0 first) and every other copy is checked equal, naming the
 * rank that differs. The original files are rebuilt with their own tensors
 * and __metadata__, and the original index text is written back, so without
 * a lossy cast the files are byte-identical to the source.
 */
#include "transform/consolidate.h"
#include "transform/convert.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "format/dcp.h"
#include "format/easydel.h"
#include "format/nxd.h"
#include "lora/lora.h"
#include "transform/dcp_consolidate.h"
#include "transform/easydel_import.h"
#include "transform/nxd_import.h"
#include "transform/lora_plan.h"
#include "transform/state_convert.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    plan_tensor t; /* the original tensor being rebuilt */
    size_t file;   /* index into source.files */
} orig_tensor;

typedef struct {
    json_t *layout;
    int tp;
    ckpt_checkpoint *ranks; /* tp entries */
    size_t *first_source;   /* per rank: index of its first plan_source */
    exec_plan exec;
    orig_tensor *orig; /* sorted by name */
    size_t norig;
    const char *what; /* path of ckpt-layout.json */
} consolidation;

static int cmp_orig(const void *a, const void *b)
{
    return strcmp(((const orig_tensor *)a)->name, ((const orig_tensor *)b)->name);
}

static orig_tensor *find_orig(consolidation *c, const char *name)
{
    orig_tensor key = {.name = name};
    return bsearch(&key, c->orig, c->norig, sizeof *c->orig, cmp_orig);
}

static int parse_shape(const json_t *a, int *ndim, uint64_t *shape, const char *what, const char *name)
{
    if (!json_is_array(a) || json_array_size(a) > PLAN_MAX_DIM)
        return ckpt_error_set(CKPT_EINVAL, "%s: tensor '%s': bad shape", what, name);
    *ndim = (int)json_array_size(a);
    for (int k = 0; k < *ndim; k++) {
        json_t *v = json_array_get(a, (size_t)k);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return ckpt_error_set(CKPT_EINVAL, "%s: tensor '%s': bad shape", what, name);
        shape[k] = (uint64_t)json_integer_value(v);
    }
    return 0;
}

static int parse_dtype(const json_t *j, ckpt_dtype *dt, const char *what, const char *name)
{
    const char *s = json_string_value(json_object_get(j, "dtype"));
    if (!s || ckpt_dtype_from_name(s, dt) < 0)
        return ckpt_error_set(CKPT_EINVAL, "%s: tensor '%s': bad dtype", what, name);
    return 0;
}

/* The original tensors, from source.files[].tensors. */
static int load_originals(consolidation *c)
{
    json_t *files = json_object_get(json_object_get(c->layout, "source"), "files");
    if (!json_is_array(files)) return ckpt_error_set(CKPT_EINVAL, "%s: missing source.files", c->what);
    size_t n = 0, fi;
    json_t *f;
    json_array_foreach(files, fi, f) n += json_array_size(json_object_get(f, "tensors"));
    c->orig = ckpt_calloc(n + 1, sizeof *c->orig);
    if (!c->orig) return CKPT_ENOMEM;
    json_array_foreach(files, fi, f)
    {
        size_t ti;
        json_t *t;
        json_array_foreach(json_object_get(f, "tensors"), ti, t)
        {
            orig_tensor *o = &c->orig[c->norig];
            const char *name = json_string_value(json_object_get(t, "name"));
            if (!name) return ckpt_error_set(CKPT_EINVAL, "%s: source tensor without a name", c->what);
            o->name = name;
            o->file = fi;
            o->t.rank = PLAN_ALL_RANKS;
            if (!(o->t.name = ckpt_strdup(name))) return CKPT_ENOMEM;
            c->norig++;
            int rc = parse_dtype(t, &o->t.dtype, c->what, name);
            if (!rc) rc = parse_shape(json_object_get(t, "shape"), &o->t.ndim, o->t.shape, c->what, name);
            if (rc) return rc;
        }
    }
    qsort(c->orig, c->norig, sizeof *c->orig, cmp_orig);
    for (size_t i = 1; i < c->norig; i++)
        if (!strcmp(c->orig[i].name, c->orig[i - 1].name))
            return ckpt_error_set(CKPT_EINVAL, "%s: source tensor '%s' listed twice", c->what, c->orig[i].name);
    return 0;
}

/* A rank of a rank_files layout (vLLM): its files, as ckpt-layout.json's
 * folders[rank].files lists them, in SRC itself. */
static int open_rank_files(consolidation *c, const char *src, int r, ckpt_checkpoint *out)
{
    json_t *folder = json_array_get(json_object_get(c->layout, "folders"), (size_t)r);
    json_t *files = json_object_get(folder, "files");
    json_t *jr = json_object_get(folder, "rank");
    if (!json_is_array(files) || !json_is_integer(jr) || json_integer_value(jr) != r)
        return ckpt_error_set(CKPT_EINVAL, "%s: folders[%d] does not list rank %d's files", c->what, r, r);
    size_t n = json_array_size(files), i;
    st_file *sf = ckpt_calloc(n + 1, sizeof *sf);
    if (!sf) return CKPT_ENOMEM;
    int rc = 0;
    size_t opened = 0;
    json_t *f;
    json_array_foreach(files, i, f)
    {
        const char *name = json_string_value(f);
        if (!name || !ckpt_shard_name_safe(name) || strchr(name, '/')) {
            rc = ckpt_error_set(CKPT_EINVAL, "%s: rank %d: unsafe or missing file name", c->what, r);
            break;
        }
        char *path = ckpt_path_join(src, name);
        rc = path ? st_open(&sf[i], path) : CKPT_ENOMEM;
        free(path);
        if (rc) break;
        opened++;
    }
    char label[64];
    snprintf(label, sizeof label, "rank %d", r);
    if (!rc) rc = ckpt_checkpoint_from_files(out, label, sf, n);
    else
        for (size_t k = 0; k < opened; k++) st_close(&sf[k]);
    free(sf);
    return rc;
}

static int open_ranks(consolidation *c, const char *src)
{
    c->ranks = ckpt_calloc((size_t)c->tp, sizeof *c->ranks);
    c->first_source = ckpt_calloc((size_t)c->tp, sizeof *c->first_source);
    if (!c->ranks || !c->first_source) return CKPT_ENOMEM;
    bool rank_files = json_is_string(json_object_get(json_object_get(c->layout, "rules"), "rank_files"));
    for (int r = 0; r < c->tp; r++) {
        char sub[32];
        snprintf(sub, sizeof sub, "tp_rank_%02d", r);
        char *dir = c->tp > 1 ? ckpt_path_join(src, sub) : ckpt_strdup(src);
        if (!dir) return CKPT_ENOMEM;
        int rc = rank_files ? open_rank_files(c, src, r, &c->ranks[r])
                 : lora_layout_is_adapter(c->layout) /* a converted LoRA adapter: adapter_model.safetensors */
                     ? ckpt_checkpoint_open_prefix(&c->ranks[r], dir, LORA_WEIGHTS_PREFIX)
                     : state_checkpoint_open(&c->ranks[r], dir); /* with a training state's optimizer files */
        free(dir);
        if (!rc) rc = convert_add_sources(&c->exec, &c->ranks[r], &c->first_source[r]);
        if (rc) return rc;
    }
    return 0;
}

/* Adds the inverse of stored part p (of stored tensor src_index, rank r) to orig. */
static int add_inverse(consolidation *c, orig_tensor *o, const plan_part *p, int stored_ndim, int32_t src_index,
                       int rank)
{
    char holder[32];
    if (c->tp > 1) snprintf(holder, sizeof holder, "rank %d", rank);
    else snprintf(holder, sizeof holder, "a replica");
    return consolidate_add_inverse(&o->t, p, stored_ndim, src_index, holder, c->what);
}

/* Adds the inverse of part k of layout entry jp (of stored tensor src_index on rank r). */
static int invert_part(consolidation *c, const json_t *jp, size_t k, ckpt_dtype dt, int ndim, const uint64_t *shape,
                       int32_t src_index, int r, const char *what)
{
    const char *sname = plan_part_json_src(jp, k);
    orig_tensor *o = sname ? find_orig(c, sname) : NULL;
    if (!o) return ckpt_error_set(CKPT_EINVAL, "%s names an unknown source tensor", what);
    /* The executor converts between float dtypes only (a cast layout). */
    if (o->t.dtype != dt && !(ckpt_dtype_is_castable_float(o->t.dtype) && ckpt_dtype_is_castable_float(dt)))
        return ckpt_error_set(CKPT_EINVAL, "%s: the stored tensor is %s, its source '%s' %s: only float dtypes convert",
                              what, ckpt_dtype_name(dt), o->name, ckpt_dtype_name(o->t.dtype));
    plan_part p;
    int rc = plan_part_from_json_at(&p, jp, k, ndim, o->t.ndim, what);
    if (rc) return rc;
    for (int d = 0; d < ndim; d++)
        if (p.lo[d] > shape[d] || p.ext[d] > shape[d] - p.lo[d])
            return ckpt_error_set(CKPT_EINVAL, "%s lies outside the tensor", what);
    return add_inverse(c, o, &p, ndim, src_index, r);
}

static int invert_entry(consolidation *c, const json_t *e)
{
    const char *name = json_string_value(json_object_get(e, "name"));
    if (!name) return ckpt_error_set(CKPT_EINVAL, "%s: an output tensor has no name", c->what);
    json_t *jr = json_object_get(e, "rank");
    int r0 = 0, r1 = c->tp;
    if (json_is_integer(jr)) {
        json_int_t r = json_integer_value(jr);
        if (r < 0 || r >= c->tp) return ckpt_error_set(CKPT_EINVAL, "%s: tensor '%s' has rank %lld", c->what, name, (long long)r);
        r0 = (int)r;
        r1 = r0 + 1;
    }
    ckpt_dtype dt;
    int ndim;
    uint64_t shape[PLAN_MAX_DIM];
    int rc = parse_dtype(e, &dt, c->what, name);
    if (!rc) rc = parse_shape(json_object_get(e, "shape"), &ndim, shape, c->what, name);
    if (rc) return rc;
    json_t *parts = json_object_get(e, "parts");
    if (!json_is_array(parts)) return ckpt_error_set(CKPT_EINVAL, "%s: tensor '%s' has no parts", c->what, name);
    for (int r = r0; r < r1; r++) {
        const ckpt_tensor_ref *ref = ckpt_checkpoint_find(&c->ranks[r], name);
        if (!ref) return ckpt_error_set(CKPT_ENOTFOUND, "rank %d: tensor '%s' listed in %s is missing", r, name, c->what);
        const st_tensor *st = ref->t;
        bool match = st->dtype == dt && st->ndim == ndim;
        for (int k = 0; match && k < ndim; k++) match = st->shape[k] == shape[k];
        if (!match)
            return ckpt_error_set(CKPT_EINVAL, "%s: tensor '%s' does not have the dtype and shape %s records",
                                  c->ranks[r].files[ref->file].path, name, c->what);
        int32_t src_index = (int32_t)(c->first_source[r] + (size_t)(ref - c->ranks[r].tensors));
        size_t pi;
        json_t *jp;
        json_array_foreach(parts, pi, jp)
        {
            if (json_is_true(json_object_get(jp, "zero"))) continue;
            size_t nrun = plan_part_json_count(jp);
            if (!nrun)
                return ckpt_error_set(CKPT_EINVAL, "%s: tensor '%s' part %zu: 'srcs' must be a non-empty array", c->what,
                                      name, pi);
            for (size_t k = 0; !rc && k < nrun; k++) {
                char what[512];
                if (nrun > 1) snprintf(what, sizeof what, "%s: tensor '%s' part %zu.%zu", c->what, name, pi, k);
                else snprintf(what, sizeof what, "%s: tensor '%s' part %zu", c->what, name, pi);
                rc = invert_part(c, jp, k, dt, ndim, shape, src_index, r, what);
            }
            if (rc) return rc;
        }
    }
    return 0;
}

static int check_coverage(consolidation *c)
{
    for (size_t i = 0; i < c->norig; i++) {
        int rc = consolidate_check_tensor(&c->orig[i].t, c->what);
        if (rc) return rc;
    }
    return 0;
}

/* One output file per original file, with its tensors and __metadata__. */
static int layout_files(consolidation *c)
{
    json_t *files = json_object_get(json_object_get(c->layout, "source"), "files");
    size_t nf = json_array_size(files);
    c->exec.files = ckpt_calloc(nf + 1, sizeof *c->exec.files);
    if (!c->exec.files) return CKPT_ENOMEM;
    size_t fi;
    json_t *f;
    json_array_foreach(files, fi, f)
    {
        exec_file *ef = &c->exec.files[fi];
        c->exec.nfiles++;
        st_layout_init(&ef->layout);
        const char *name = json_string_value(json_object_get(f, "name"));
        if (!name || !ckpt_shard_name_safe(name))
            return ckpt_error_set(CKPT_EINVAL, "%s: unsafe or missing source file name", c->what);
        if (!(ef->rel = ckpt_strdup(name))) return CKPT_ENOMEM;
        size_t nt = json_array_size(json_object_get(f, "tensors"));
        ef->tensors = ckpt_calloc(nt + 1, sizeof *ef->tensors);
        if (!ef->tensors) return CKPT_ENOMEM;
        int rc = 0;
        for (size_t i = 0; !rc && i < c->norig; i++) {
            orig_tensor *o = &c->orig[i];
            if (o->file != fi) continue;
            ef->tensors[ef->ntensors] = &o->t;
            rc = st_layout_add(&ef->layout, o->name, o->t.dtype, o->t.ndim, o->t.shape, ef->ntensors);
            ef->ntensors++;
        }
        const char *key;
        json_t *val;
        json_object_foreach(json_object_get(f, "metadata"), key, val)
        {
            if (!rc) rc = json_is_string(val) ? st_layout_set_meta(&ef->layout, key, json_string_value(val))
                                              : ckpt_error_set(CKPT_EINVAL, "%s: metadata of '%s' is not text", c->what, name);
        }
        if (!rc) rc = st_layout_finish(&ef->layout);
        if (rc) return rc;
    }
    return 0;
}

static int write_index(consolidation *c, const char *tmp)
{
    json_t *src = json_object_get(c->layout, "source");
    const char *text = json_string_value(json_object_get(src, "index"));
    const char *name = json_string_value(json_object_get(src, "index_name"));
    if (!text) return 0;
    if (!name || !ckpt_shard_name_safe(name) || strchr(name, '/'))
        return ckpt_error_set(CKPT_EINVAL, "%s: unsafe index name", c->what);
    char *path = ckpt_path_join(tmp, name);
    int rc = path ? ckpt_write_file_atomic(path, text, json_string_length(json_object_get(src, "index"))) : CKPT_ENOMEM;
    free(path);
    return rc;
}

static void consolidation_free(consolidation *c)
{
    for (int r = 0; c->ranks && r < c->tp; r++) ckpt_checkpoint_close(&c->ranks[r]);
    free(c->ranks);
    free(c->first_source);
    for (size_t i = 0; i < c->norig; i++) plan_tensor_free(&c->orig[i].t);
    free(c->orig);
    exec_plan_free(&c->exec);
    json_decref(c->layout);
}

const char *consolidate_save_kind(const char *dir)
{
    if (dcp_is_checkpoint(dir)) return "PyTorch DCP save";
    if (easydel_is_checkpoint(dir) || easydel_is_legacy(dir)) return "EasyDeL save";
    if (nxd_is_checkpoint(dir)) return "neuronx-distributed save";
    return NULL;
}

/* ---- the store's pull --consolidated (consolidate_opts.stored) ----
 * The rank files in `src` hold their headers only; `st` assembles each of
 * their tensors from the store's blobs. Every part that reads a rank tensor
 * is rewritten over that tensor's stored parts (plan_part_compose), so each
 * blob byte is read once, straight into the consolidated files; replicas are
 * no longer compared with each other, the files written are checked against
 * the source files' sha256 instead (check_source_hashes). */
bool consolidate_layout_composable(const json_t *layout)
{
    if (!layout || json_object_get(layout, "state") || json_object_get(layout, "lora_merge") ||
        lora_layout_is_adapter(layout) || json_is_true(json_object_get(layout, "lossy")))
        return false;
    json_t *files = json_object_get(json_object_get(layout, "source"), "files");
    bool ok = json_array_size(files) > 0;
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f)
    {
        const char *name = json_string_value(json_object_get(f, "name"));
        size_t nl = name ? strlen(name) : 0;
        ok = ok && nl > 12 && !strcmp(name + nl - 12, ".safetensors") && json_is_string(json_object_get(f, "sha256"));
    }
    return ok;
}

static int compose_stored(consolidation *c, const exec_plan *st, const char *src)
{
    if (!consolidate_layout_composable(c->layout))
        return ckpt_error_set(CKPT_EINVAL, "%s: only a lossless layout of weights from safetensors files with sha256 is "
                                           "consolidated from stored parts", c->what);
    size_t nold = c->exec.nsources, base_path = c->exec.nsrc_paths, sl = strlen(src);
    const plan_tensor **inner = ckpt_calloc(nold + 1, sizeof *inner);
    json_t *index = json_object(); /* "<file>\n<tensor>" -> stored tensor, as an integer index */
    int rc = inner && index ? 0 : CKPT_ENOMEM;
    for (size_t f = 0; !rc && f < st->nfiles; f++)
        for (size_t i = 0; !rc && i < st->files[f].layout.ntensors; i++) {
            const st_out_tensor *ot = &st->files[f].layout.tensors[i];
            char *key = ckpt_sprintf("%s\n%s", st->files[f].rel, ot->name);
            rc = key && !json_object_set_new(index, key, json_integer((json_int_t)(f << 32 | ot->user))) ? 0 : CKPT_ENOMEM;
            free(key);
        }
    for (size_t i = 0; !rc && i < nold; i++) {
        const plan_source *s = &c->exec.sources[i];
        const char *path = c->exec.src_paths[s->file];
        const char *rel = !strncmp(path, src, sl) && path[sl] == '/' ? path + sl + 1 : path;
        char *key = ckpt_sprintf("%s\n%s", rel, s->name);
        json_t *v = key ? json_object_get(index, key) : NULL;
        free(key);
        if (!v) {
            rc = ckpt_error_set(CKPT_ECORRUPT, "%s: the store has no tensor '%s' in %s", c->what, s->name, rel);
            break;
        }
        uint64_t fv = (uint64_t)json_integer_value(v);
        inner[i] = st->files[fv >> 32].tensors[fv & 0xffffffffu];
    }
    json_decref(index);
    /* The stored sources and their files, after the rank files' own. */
    char **paths = rc ? NULL : ckpt_realloc(c->exec.src_paths, (base_path + st->nsrc_paths + 1) * sizeof *paths);
    if (!rc && !paths) rc = CKPT_ENOMEM;
    if (!rc) {
        c->exec.src_paths = paths;
        for (size_t f = 0; !rc && f < st->nsrc_paths; f++) {
            if (!(paths[c->exec.nsrc_paths] = ckpt_strdup(st->src_paths[f]))) rc = CKPT_ENOMEM;
            else c->exec.nsrc_paths++;
        }
        c->exec.src_paths_cap = c->exec.nsrc_paths;
    }
    plan_source *srcs = rc ? NULL : ckpt_realloc(c->exec.sources, (nold + st->nsources + 1) * sizeof *srcs);
    if (!rc && !srcs) rc = CKPT_ENOMEM;
    if (!rc) {
        c->exec.sources = srcs;
        for (size_t i = 0; !rc && i < st->nsources; i++) {
            plan_source *d = &srcs[c->exec.nsources];
            *d = st->sources[i];
            d->file += base_path;
            if (!(d->name = ckpt_strdup(st->sources[i].name))) rc = CKPT_ENOMEM;
            else c->exec.nsources++;
        }
        c->exec.sources_cap = c->exec.nsources;
    }
    /* Each stored file plans its own source for a blob it reads: one source
     * per blob range here, so the parts of one blob coalesce into a copy. */
    size_t *canon = rc ? NULL : ckpt_calloc(st->nsources + 1, sizeof *canon);
    json_t *seen = json_object();
    if (!rc && (!canon || !seen)) rc = CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < st->nsources; i++) {
        const plan_source *q = &st->sources[i];
        char key[96 + 21 * PLAN_MAX_DIM];
        int n = snprintf(key, sizeof key, "%zu:%llu:%llu:%d", q->file, (unsigned long long)q->offset,
                         (unsigned long long)q->nbytes, (int)q->dtype);
        for (int k = 0; k < q->ndim && n > 0 && (size_t)n < sizeof key; k++)
            n += snprintf(key + n, sizeof key - (size_t)n, ",%llu", (unsigned long long)q->shape[k]);
        json_t *v = json_object_get(seen, key);
        canon[i] = v ? (size_t)json_integer_value(v) : i;
        if (!v && json_object_set_new(seen, key, json_integer((json_int_t)i))) rc = CKPT_ENOMEM;
    }
    json_decref(seen);
    for (size_t i = 0; !rc && i < c->norig; i++) {
        plan_tensor *t = &c->orig[i].t;
        plan_tensor out = *t;
        out.parts = NULL;
        out.nparts = out.cap = 0;
        for (size_t p = 0; !rc && p < t->nparts; p++) {
            const plan_part *pt = &t->parts[p];
            rc = pt->src == PLAN_ZERO ? plan_tensor_add_part(&out, pt)
                                      : plan_part_compose(pt, t->ndim, inner[pt->src], (int32_t)nold, &out);
        }
        free(t->parts);
        t->parts = out.parts;
        t->nparts = out.nparts;
        t->cap = out.cap;
        for (size_t p = 0; p < t->nparts; p++)
            if (t->parts[p].src != PLAN_ZERO) t->parts[p].src = (int32_t)(nold + canon[(size_t)t->parts[p].src - nold]);
        if (!rc) plan_tensor_coalesce(t);
        for (size_t k = 0; k < t->nchecks; k++) free(t->checks[k].what);
        t->nchecks = 0;
    }
    free(inner);
    free(canon);
    return rc;
}

/* Every consolidated file against the sha256 ckpt-layout.json records for
 * the source file of that name (compose_stored's check). */
static int check_source_hashes(consolidation *c, char (*got)[65])
{
    json_t *files = json_object_get(json_object_get(c->layout, "source"), "files");
    for (size_t f = 0; f < c->exec.nfiles; f++) {
        /* every source file has one: consolidate_layout_composable */
        const char *want = json_string_value(json_object_get(json_array_get(files, f), "sha256"));
        if (strcmp(want, got[f]))
            return ckpt_error_set(CKPT_ECORRUPT,
                                  "%s: the rebuilt file has sha256 %s, the layout's source %s: a stored part is damaged "
                                  "(run ckpt verify); nothing was written",
                                  c->exec.files[f].rel, got[f], want);
    }
    return 0;
}

int consolidate_run(const char *src, const char *dst, consolidate_opts *o)
{
    if (dcp_is_checkpoint(src)) return dcp_consolidate(src, dst, o);
    if (o->strip_prefix)
        return ckpt_error_set(CKPT_EINVAL, "%s: --strip-prefix is for PyTorch DCP sources; this is not one", src);
    if (easydel_is_checkpoint(src) || easydel_is_legacy(src)) return easydel_consolidate(src, dst, o);
    if (nxd_is_checkpoint(src)) return nxd_consolidate(src, dst, o);
    if (o->state)
        return ckpt_error_set(CKPT_EINVAL, "%s: --state is for PyTorch DCP, EasyDeL and neuronx-distributed saves; this is none "
                                           "(a converted state consolidates into a state by itself)",
                              src);
    consolidation c;
    memset(&c, 0, sizeof c);
    char *lpath = ckpt_path_join(src, CONVERT_LAYOUT_FILE);
    if (!lpath) return CKPT_ENOMEM;
    c.what = lpath;
    int rc = o->layout ? 0 : cj_load_file(&c.layout, lpath, CONVERT_LAYOUT_MAX_BYTES);
    if (o->layout) c.layout = json_incref(o->layout);
    if (rc == CKPT_ENOTFOUND)
        rc = ckpt_error_set(CKPT_ENOTFOUND, "%s: no %s here; is this the output of ckpt convert?", src, CONVERT_LAYOUT_FILE);
    int64_t tp = 1, version = 0;
    if (!rc) rc = cj_int(c.layout, "version", &version, lpath);
    if (!rc && version != 1) rc = ckpt_error_set(CKPT_EINVAL, "%s: version %lld is not supported", lpath, (long long)version);
    if (!rc) rc = cj_int(c.layout, "tp", &tp, lpath);
    if (!rc && (tp < 1 || tp > PLAN_MAX_TP)) rc = ckpt_error_set(CKPT_EINVAL, "%s: bad tp %lld", lpath, (long long)tp);
    c.tp = (int)tp;
    o->lossy = json_is_true(json_object_get(c.layout, "lossy"));
    if (!rc) rc = load_originals(&c);
    if (!rc) rc = open_ranks(&c, src);
    size_t i;
    json_t *e;
    if (!rc) json_array_foreach(json_object_get(c.layout, "tensors"), i, e)
        {
            if (!rc) rc = invert_entry(&c, e);
        }
    if (!rc) rc = check_coverage(&c);
    if (!rc) rc = layout_files(&c);
    if (!rc && o->stored) rc = compose_stored(&c, o->stored, src);
    char(*sha)[65] = !rc && o->stored ? ckpt_calloc(c.exec.nfiles + 1, sizeof *sha) : NULL;
    if (!rc && o->stored && !sha) rc = CKPT_ENOMEM;
    char *tmp = NULL;
    if (!rc) rc = outdir_prepare(dst, o->force, &tmp);
    if (!rc) {
        exec_opts eo = {.threads = o->threads, .quiet = o->quiet, .label = "consolidate", .out_sha256 = sha};
        rc = exec_run(&c.exec, tmp, &eo);
        if (!rc && sha) rc = check_source_hashes(&c, sha);
        if (!rc) rc = write_index(&c, tmp);
        if (!rc) rc = outdir_copy_side_files(src, tmp);
        if (!rc) rc = state_consolidate_finish(c.layout, src, tmp, c.tp);
        if (!rc) rc = lora_consolidate_finish(c.layout, tmp);
        if (!rc) rc = ckpt_fsync_dir(tmp);
        if (!rc) rc = outdir_commit(tmp, dst, o->force);
        if (rc) ckpt_rm_rf(tmp);
        free(tmp);
    }
    free(sha);
    consolidation_free(&c);
    free(lpath);
    return rc;
}

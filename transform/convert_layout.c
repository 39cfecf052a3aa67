/* convert_layout.c — the sources and output files of a conversion plan: every tensor of a checkpoint as a
 * plan source, and output tensors laid out into shard files of one folder (see convert.h). */
#include "transform/convert.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"

#include <jansson.h>

#include <stdlib.h>
#include <string.h>

int convert_add_sources(exec_plan *p, const ckpt_checkpoint *c, size_t *first_source)
{
    size_t base_path = p->nsrc_paths;
    char **paths = ckpt_realloc(p->src_paths, (p->nsrc_paths + c->nfiles + 1) * sizeof *paths);
    if (!paths) return CKPT_ENOMEM;
    p->src_paths = paths;
    for (size_t f = 0; f < c->nfiles; f++) {
        if (!(p->src_paths[p->nsrc_paths] = ckpt_strdup(c->files[f].path))) return CKPT_ENOMEM;
        p->nsrc_paths++;
    }
    plan_source *src = ckpt_realloc(p->sources, (p->nsources + c->ntensors + 1) * sizeof *src);
    if (!src) return CKPT_ENOMEM;
    p->sources = src;
    *first_source = p->nsources;
    for (size_t i = 0; i < c->ntensors; i++) {
        const st_tensor *t = c->tensors[i].t;
        plan_source *s = &p->sources[p->nsources];
        memset(s, 0, sizeof *s);
        if (t->ndim > PLAN_MAX_DIM)
            return ckpt_error_set(CKPT_ELIMIT, "tensor '%s' has %d dimensions; transforms handle at most %d", t->name,
                                  t->ndim, PLAN_MAX_DIM);
        if (!(s->name = ckpt_strdup(t->name))) return CKPT_ENOMEM;
        s->file = base_path + c->tensors[i].file;
        s->dtype = t->dtype;
        s->ndim = t->ndim;
        /* a torch view's bytes are its block in stored order (convert.c, convert_view_part) */
        memcpy(s->shape, t->view ? t->stored_shape : t->shape, (size_t)t->ndim * sizeof t->shape[0]);
        s->offset = t->offset;
        s->nbytes = t->nbytes;
        p->nsources++;
    }
    return 0;
}

static int cmp_tensor_ptr(const void *a, const void *b)
{
    const plan_tensor *x = *(plan_tensor *const *)a, *y = *(plan_tensor *const *)b;
    return plan_name_cmp(x->name, y->name);
}

int convert_layout_folder(exec_plan *p, const char *dir, plan_tensor **tensors, size_t n, uint64_t max_shard_size,
                          char **index_text)
{
    return convert_layout_folder_prefix(p, dir, "model", tensors, n, max_shard_size, index_text);
}

/* vLLM's ShardedStateLoader.save_model: a new part starts when the next
 * tensor would push the current one past max_size (0: no limit). Unlike that
 * loop, a first tensor larger than the limit does not leave an empty part 0. */
static void vllm_parts(const uint64_t *sizes, size_t n, uint64_t max_size, size_t *shard_of, size_t *nparts)
{
    size_t part = 0, in_part = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (max_size && in_part && total + sizes[i] > max_size) {
            part++;
            total = 0;
            in_part = 0;
        }
        shard_of[i] = part;
        total += sizes[i];
        in_part++;
    }
    *nparts = part + 1;
}

/* A layout that keeps the source's files (convert_layout_follow_files):
 * names[f] is the output name of source file f. */
typedef struct {
    char *const *names;
    size_t nfiles;
} follow_files;

/* shard_of by each tensor's source file, numbered over the files that hold
 * one; *used[k] is the source file of shard k. */
static int follow_assign(const exec_plan *p, plan_tensor **tensors, size_t n, const follow_files *ff, size_t *shard_of,
                         size_t *nshards, size_t *used)
{
    size_t *of_file = ckpt_calloc(ff->nfiles + 1, sizeof *of_file);
    if (!of_file) return CKPT_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const plan_tensor *t = tensors[i];
        size_t f = t->nparts && t->parts[0].src != PLAN_ZERO ? p->sources[t->parts[0].src].file : 0;
        shard_of[i] = f < ff->nfiles ? f : 0;
        of_file[shard_of[i]] = 1;
    }
    *nshards = 0;
    for (size_t f = 0; f < ff->nfiles; f++)
        if (of_file[f]) {
            used[*nshards] = f;
            of_file[f] = (*nshards)++;
        }
    for (size_t i = 0; i < n; i++) shard_of[i] = of_file[shard_of[i]];
    free(of_file);
    return 0;
}

/* Lays tensors out into files: Hugging Face shards "<prefix>..." under dir,
 * with rank_files the rank's parts named by that pattern, or with ff the
 * source's files renamed. */
static int layout_tensors(exec_plan *p, const char *dir, const char *prefix, const char *rank_files, int rank,
                          plan_tensor **tensors, size_t n, uint64_t max_shard_size, char **index_text,
                          const follow_files *ff)
{
    *index_text = NULL;
    qsort(tensors, n, sizeof *tensors, cmp_tensor_ptr);
    uint64_t *sizes = ckpt_calloc(n + 1, sizeof *sizes);
    size_t *shard_of = ckpt_calloc(n + 1, sizeof *shard_of);
    char **names = ckpt_calloc(n + 1, sizeof *names), **files = ckpt_calloc(n + 1, sizeof *files);
    int rc = sizes && shard_of && names && files ? 0 : CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        rc = ckpt_dtype_nbytes(tensors[i]->dtype, tensors[i]->ndim, tensors[i]->shape, &sizes[i]);
        if (rc) ckpt_error_prefix(rc, "tensor '%s'", tensors[i]->name);
    }
    size_t nshards = 0, *used = ff ? ckpt_calloc(ff->nfiles + 1, sizeof *used) : NULL;
    if (!rc && ff && !used) rc = CKPT_ENOMEM;
    if (!rc && ff) rc = follow_assign(p, tensors, n, ff, shard_of, &nshards, used);
    else if (!rc && rank_files) vllm_parts(sizes, n, max_shard_size, shard_of, &nshards);
    else if (!rc) rc = ckpt_shard_assign(sizes, n, max_shard_size, shard_of, &nshards);
    if (!rc && n == 0) nshards = 1;
    size_t first = p->nfiles;
    exec_file *ef = rc ? NULL : ckpt_realloc(p->files, (p->nfiles + nshards + 1) * sizeof *ef);
    if (!rc && !ef) rc = CKPT_ENOMEM;
    if (!rc) {
        p->files = ef;
        memset(&p->files[first], 0, nshards * sizeof *ef);
    }
    uint64_t total = 0;
    for (size_t s = 0; !rc && s < nshards; s++) {
        exec_file *f = &p->files[first + s];
        p->nfiles++;
        char *base = ff           ? ckpt_strdup(ff->names[used[s]])
                     : rank_files ? rules_rank_file_name(rank_files, rank, s)
                                  : ckpt_shard_name(prefix, s, nshards);
        f->rel = base ? (*dir ? ckpt_path_join(dir, base) : ckpt_strdup(base)) : NULL;
        free(base);
        f->tensors = ckpt_calloc(n + 1, sizeof *f->tensors);
        st_layout_init(&f->layout);
        if (!f->rel || !f->tensors) rc = CKPT_ENOMEM;
        for (size_t i = 0; !rc && i < n; i++) {
            if (shard_of[i] != s) continue;
            f->tensors[f->ntensors] = tensors[i];
            rc = st_layout_add(&f->layout, tensors[i]->name, tensors[i]->dtype, tensors[i]->ndim, tensors[i]->shape,
                               f->ntensors);
            f->ntensors++;
            /* a torch file's tied names: {removed: kept} in the file holding kept (convert.c) */
            json_t *tied = tensors[i]->meta ? json_object_get(tensors[i]->meta, "tied_names") : NULL;
            for (size_t k = 0; !rc && k < json_array_size(tied); k++)
                if (json_is_string(json_array_get(tied, k)))
                    rc = st_layout_set_meta(&f->layout, json_string_value(json_array_get(tied, k)), tensors[i]->name);
            names[i] = tensors[i]->name;
            files[i] = (char *)ckpt_basename(f->rel);
            total += sizes[i];
        }
        if (!rc) rc = st_layout_set_meta(&f->layout, "format", "pt");
        if (!rc) rc = st_layout_finish(&f->layout);
    }
    if (!rc && nshards > 1 && !rank_files && !ff && !(*index_text = ckpt_index_render(total, n, names, files)))
        rc = CKPT_ENOMEM;
    free(used);
    free(sizes);
    free(shard_of);
    free(names);
    free(files);
    return rc;
}

int convert_layout_folder_prefix(exec_plan *p, const char *dir, const char *prefix, plan_tensor **tensors, size_t n,
                                 uint64_t max_shard_size, char **index_text)
{
    return layout_tensors(p, dir, prefix, NULL, 0, tensors, n, max_shard_size, index_text, NULL);
}

int convert_layout_rank_files(exec_plan *p, const char *rank_files, int rank, plan_tensor **tensors, size_t n,
                              uint64_t max_size)
{
    char *index_text = NULL;
    int rc = layout_tensors(p, "", NULL, rank_files, rank, tensors, n, max_size, &index_text, NULL);
    free(index_text);
    return rc;
}

/* safetensors' convert.py rename(): the extension becomes .safetensors and
 * every "pytorch_model" becomes "model" ("pytorch_model-00001-of-00002.bin"
 * -> "model-00001-of-00002.safetensors"). malloc'd. */
static char *convert_py_name(const char *path)
{
    const char *base = ckpt_basename(path), *dot = strrchr(base, '.');
    size_t stem = dot ? (size_t)(dot - base) : strlen(base);
    char *out = ckpt_malloc(stem + sizeof ".safetensors"), *o = out;
    if (!out) return NULL;
    for (size_t i = 0; i < stem;) {
        if (stem - i >= 13 && !strncmp(base + i, "pytorch_model", 13)) {
            memcpy(o, "model", 5);
            o += 5;
            i += 13;
        } else {
            *o++ = base[i++];
        }
    }
    memcpy(o, ".safetensors", sizeof ".safetensors");
    return out;
}

int convert_layout_follow_files(exec_plan *p, plan_tensor **tensors, size_t n, const ckpt_checkpoint *src,
                                const char *src_index_text, char **index_text)
{
    *index_text = NULL;
    char **names = ckpt_calloc(src->nfiles + 1, sizeof *names);
    int rc = names ? 0 : CKPT_ENOMEM;
    for (size_t f = 0; !rc && f < src->nfiles; f++)
        if (!(names[f] = convert_py_name(src->files[f].path))) rc = CKPT_ENOMEM;
    for (size_t f = 0; !rc && f < src->nfiles; f++)
        for (size_t g = 0; !rc && g < f; g++)
            if (!strcmp(names[f], names[g]))
                rc = ckpt_error_set(CKPT_EINVAL, "'%s' and '%s' would both become '%s'", src->files[g].path,
                                    src->files[f].path, names[f]);
    follow_files ff = {names, src->nfiles};
    char *unused = NULL;
    if (!rc) rc = layout_tensors(p, "", "model", NULL, 0, tensors, n, 0, &unused, &ff);
    free(unused);
    /* the source index, every file name renamed (convert.py convert_multi:
     * the other keys kept, json.dump(indent=4)) */
    json_t *ix = NULL;
    if (!rc) {
        json_error_t err;
        ix = json_loads(src_index_text, JSON_REJECT_DUPLICATES, &err);
        json_t *wm = json_object_get(ix, "weight_map");
        if (!json_is_object(wm)) rc = ckpt_error_set(CKPT_EINVAL, "%s: no weight_map", src->index_path);
        const char *k;
        json_t *v;
        json_object_foreach(wm, k, v)
        {
            if (rc) break;
            char *r = json_is_string(v) ? convert_py_name(json_string_value(v)) : NULL;
            if (!r) rc = json_is_string(v) ? CKPT_ENOMEM : ckpt_error_set(CKPT_EINVAL, "%s: '%s' maps to no file", src->index_path, k);
            else json_string_set(v, r);
            free(r);
        }
        if (!rc && !(*index_text = json_dumps(ix, JSON_INDENT(4) | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII)))
            rc = CKPT_ENOMEM;
    }
    json_decref(ix);
    for (size_t f = 0; names && f < src->nfiles; f++) free(names[f]);
    free(names);
    return rc;
}

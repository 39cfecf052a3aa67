/* store_convert.c — layouts inside the store, as recipes over blobs (see store_convert.h). */
#include "store/store_convert.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/sha256.h"
#include "common/util.h"
#include "format/outdir.h"
#include "format/torch.h"
#include "transform/layout_meta.h"
#include "store/blob_ranges.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    store_file_row *v;
    size_t n;
} src_files;

static const store_file_row *find_file(const src_files *f, const char *path)
{
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->v[i].path, path)) return &f->v[i];
    return NULL;
}

/* Reads a whole-file blob as text. */
static int blob_text(ckpt_store *s, const store_file_row *f, char **out)
{
    char *path = store_blob_read_path(s, f->blob);
    int rc = path ? ckpt_read_file(path, CKPT_INDEX_MAX_BYTES, out, NULL) : CKPT_ENOMEM;
    free(path);
    return rc;
}

/* The source checkpoint as the offline planner would open it: the shards of
 * model.safetensors.index.json, else model.safetensors; else the torch.save
 * weights of pytorch_model.bin.index.json or pytorch_model.bin, read from
 * their whole-file blobs (torch.h), each st_file named by its stored path. */
int store_convert_open_source(ckpt_store *s, const store_ckpt *src, const store_file_row *rows, size_t nrows,
                              bool torch_ok, ckpt_checkpoint *c, json_t **config, char **index_text,
                              const char **index_name, char (**hashes)[65])
{
    const src_files fl = {(store_file_row *)rows, nrows}, *files = &fl;
    const char *names_single[] = {"model.safetensors"}, *names_torch[] = {"pytorch_model.bin"};
    ckpt_index ix;
    memset(&ix, 0, sizeof ix);
    int rc = 0;
    const store_file_row *index = find_file(files, "model.safetensors.index.json");
    const char *const *shards = names_single;
    size_t nshards = 1;
    bool torch = false;
    if (!index && !find_file(files, "model.safetensors") &&
        (find_file(files, "pytorch_model.bin") || find_file(files, "pytorch_model.bin.index.json"))) {
        if (!torch_ok)
            return ckpt_error_set(CKPT_EINVAL,
                                  "%s@%s holds torch.save weights (pytorch_model*.bin), which this job does not read "
                                  "in the store: `ckpt convert %s@%s --layout hf` stores a safetensors copy, or "
                                  "`ckpt pull` it and work on the folder",
                                  src->repo, src->revision, src->repo, src->revision);
        torch = true;
        shards = names_torch;
        index = find_file(files, "pytorch_model.bin.index.json");
    }
    if (index && index->blob) {
        rc = blob_text(s, index, index_text);
        if (!rc) rc = ckpt_index_parse(&ix, index->path, *index_text, strlen(*index_text));
        if (rc) return rc;
        shards = (const char *const *)ix.shards;
        nshards = ix.nshards;
        *index_name = index->path;
    }
    st_file *parsed = ckpt_calloc(nshards + 1, sizeof *parsed);
    *hashes = ckpt_calloc(nshards + 1, sizeof **hashes);
    if (!parsed || !*hashes) rc = CKPT_ENOMEM;
    size_t nparsed = 0;
    for (size_t i = 0; !rc && i < nshards; i++) {
        const store_file_row *f = find_file(files, shards[i]);
        if (!f || (torch ? !f->blob : !f->header)) {
            rc = ckpt_error_set(CKPT_ENOTFOUND, "%s@%s has no %s file '%s'", src->repo, src->revision,
                                torch ? "torch.save" : "safetensors", shards[i]);
            break;
        }
        if (torch) {
            char *path = store_blob_read_path(s, f->blob);
            rc = path ? tensor_file_open(&parsed[i], path) : CKPT_ENOMEM;
            free(path);
            if (rc && rc != CKPT_ENOMEM) rc = ckpt_error_prefix(rc, "%s@%s: %s", src->repo, src->revision, f->path);
            if (rc) break;
            nparsed++; /* open: closed with the others on failure */
            free(parsed[i].path); /* named by its stored path, as the index maps it */
            if (!(parsed[i].path = ckpt_strdup(f->path))) rc = CKPT_ENOMEM;
            else if (!parsed[i].from_torch)
                rc = ckpt_error_set(CKPT_ECORRUPT, "%s@%s: %s is not a torch.save file", src->repo, src->revision,
                                    f->path);
            if (rc) break;
            memcpy((*hashes)[i], f->sha256, 65);
            continue;
        }
        if ((rc = st_parse(&parsed[i], f->path, f->header, f->header_len, f->size))) break;
        memcpy((*hashes)[i], f->sha256, 65);
        nparsed++;
    }
    char *label = rc ? NULL : ckpt_sprintf("%s@%s", src->repo, src->revision);
    if (!rc && !label) rc = CKPT_ENOMEM;
    if (!rc) rc = torch ? ckpt_checkpoint_from_files_views(c, label, parsed, nparsed)
                        : ckpt_checkpoint_from_files(c, label, parsed, nparsed);
    else
        for (size_t i = 0; i < nparsed; i++) st_close(&parsed[i]);
    free(label);
    free(parsed);
    ckpt_index_free(&ix);
    const store_file_row *cfg = find_file(files, "config.json");
    if (!rc && cfg && cfg->blob) {
        char *path = store_blob_read_path(s, cfg->blob);
        rc = path ? cj_load_file(config, path, CONVERT_CONFIG_MAX_BYTES) : CKPT_ENOMEM;
        free(path);
    }
    return rc;
}

static bool is_whole_source(const plan_tensor *t, const plan_source *src)
{
    if (t->nparts != 1 || t->dtype != src->dtype || t->ndim != src->ndim) return false;
    const plan_part *p = &t->parts[0];
    for (int k = 0; k < t->ndim; k++)
        if (p->axis_map[k] != k || p->src_lo[k] || p->lo[k] || p->ext[k] != src->shape[k]) return false;
    return true;
}

/* The blob fields of a recipe entry: "dtype", "shape" and, for bytes inside
 * a torch.save file's blob, "at". */
static void set_blob_fields(json_t *j, const plan_source *src, uint64_t at)
{
    json_t *shape = json_array();
    for (int k = 0; k < src->ndim; k++) json_array_append_new(shape, json_integer((json_int_t)src->shape[k]));
    json_object_set_new(j, "dtype", json_string(ckpt_dtype_name(src->dtype)));
    json_object_set_new(j, "shape", shape);
    if (at) json_object_set_new(j, "at", json_integer((json_int_t)at));
}

static bool same_blob_kind(const plan_source *a, uint64_t at_a, const plan_source *b, uint64_t at_b)
{
    return a->dtype == b->dtype && a->ndim == b->ndim && at_a == at_b &&
           !memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]);
}

/* A tensor's recipe: its parts as ckpt-layout.json writes them
 * (plan_parts_to_json: the parts of an expert stack as one run entry with
 * "srcs" and "lo_step"), each source named by its blob ("blob", or the run's
 * "srcs") with the blob's dtype, shape and offset. A run's blobs share those;
 * a tensor where one would not is written part by part. */
static char *recipe_json(const plan_tensor *t, const exec_plan *p, char **blobs, const uint64_t *at)
{
    plan_part *parts = ckpt_calloc(t->nparts + 1, sizeof *parts);
    plan_source *srcs = ckpt_calloc(t->nparts + 1, sizeof *srcs);
    uint64_t *ats = ckpt_calloc(t->nparts + 1, sizeof *ats);
    json_t *a = NULL;
    if (parts && srcs && ats) {
        for (size_t i = 0; i < t->nparts; i++) { /* one local source per part, named by its blob */
            parts[i] = t->parts[i];
            if (parts[i].src == PLAN_ZERO) continue;
            srcs[i] = p->sources[parts[i].src];
            srcs[i].name = blobs[parts[i].src];
            ats[i] = at[parts[i].src];
            parts[i].src = (int32_t)i;
        }
        a = plan_parts_to_json(parts, t->nparts, t->ndim, srcs);
    }
    size_t i = 0, k;
    json_t *j;
    bool runs_ok = true;
    json_array_foreach(a, k, j)
    {
        size_t n = plan_part_json_count(j);
        for (size_t m = i + 1; m < i + n; m++) runs_ok &= same_blob_kind(&srcs[i], ats[i], &srcs[m], ats[m]);
        i += n;
    }
    if (a && !runs_ok) { /* part by part */
        json_decref(a);
        a = json_array();
        for (i = 0; a && i < t->nparts; i++)
            json_array_append_new(a, plan_part_to_json(&parts[i], t->ndim, parts[i].src == PLAN_ZERO ? 0 : srcs[i].ndim,
                                                       parts[i].src == PLAN_ZERO ? NULL : srcs[i].name));
    }
    i = 0;
    json_array_foreach(a, k, j)
    {
        json_t *name = json_object_get(j, "src");
        if (name) {
            json_object_set(j, "blob", name);
            json_object_del(j, "src");
        }
        if (parts[i].src != PLAN_ZERO) set_blob_fields(j, &srcs[i], ats[i]);
        i += plan_part_json_count(j);
    }
    char *s = a ? cj_dumps(a, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(a);
    free(parts);
    free(srcs);
    free(ats);
    return s;
}

store_file_rec *store_convert_rec_add_file(store_ckpt_rec *r, const char *path)
{
    if (ckpt_grow(&r->files, &r->cap, r->nfiles + 1, sizeof *r->files)) return NULL;
    store_file_rec *f = &r->files[r->nfiles];
    memset(f, 0, sizeof *f);
    if (!(f->path = ckpt_strdup(path))) return NULL;
    r->nfiles++;
    return f;
}

/* A small new file (index, ckpt-layout.json) as a blob. */
static int add_text_file(ckpt_store *s, store_ckpt_rec *r, const char *path, const char *text, store_blob_writer *ws,
                         size_t *nws)
{
    store_file_rec *f = store_convert_rec_add_file(r, path);
    if (!f) return CKPT_ENOMEM;
    store_blob_writer *w = &ws[(*nws)];
    int rc = store_blob_begin(s, w);
    if (rc) return rc;
    (*nws)++;
    rc = store_blob_write(w, text, strlen(text));
    if (!rc) rc = store_blob_end(w);
    if (rc) return rc;
    f->size = w->size;
    memcpy(f->sha256, w->sha256, 65);
    return (f->blob = ckpt_strdup(w->sha256)) ? 0 : CKPT_ENOMEM;
}

bool store_convert_is_side_file(const char *name)
{
    return !strchr(name, '/') && !outdir_is_weight_name(name);
}

/* The layout's catalog record. Its safetensors files' sha256 are left
 * pending (""): they would take reading every source byte, which a convert
 * in the store otherwise never does; store_hash_pending fills them in on
 * first use. */
static int build_record(ckpt_store *s, convert_plan *cp, const store_ckpt *src, src_files *files,
                        char **blobs, const uint64_t *at, char (*src_hashes)[65], store_ckpt_rec *r,
                        store_blob_writer *ws, size_t *nws, bool *named)
{
    int rc = 0;
    for (size_t f = 0; !rc && f < cp->exec.nfiles; f++) {
        const exec_file *ef = &cp->exec.files[f];
        store_file_rec *fr = store_convert_rec_add_file(r, ef->rel);
        if (!fr) return CKPT_ENOMEM;
        fr->size = ef->layout.file_size;
        fr->sha256[0] = 0;
        fr->header_len = ef->layout.header_len;
        fr->header = ckpt_malloc(fr->header_len);
        fr->tensors = ckpt_calloc(ef->layout.ntensors + 1, sizeof *fr->tensors);
        if (!fr->header || !fr->tensors) return CKPT_ENOMEM;
        memcpy(fr->header, ef->layout.header, fr->header_len);
        for (size_t i = 0; !rc && i < ef->layout.ntensors; i++) {
            const plan_tensor *t = ef->tensors[ef->layout.tensors[i].user];
            store_tensor_rec *tr = &fr->tensors[fr->ntensors++];
            tr->name = ckpt_strdup(t->name);
            if (t->nparts && t->parts[0].src != PLAN_ZERO && !at[t->parts[0].src] &&
                is_whole_source(t, &cp->exec.sources[t->parts[0].src]))
                tr->blob = ckpt_strdup(blobs[t->parts[0].src]);
            else
                tr->recipe = recipe_json(t, &cp->exec, blobs, at);
            for (size_t k = 0; tr->recipe && k < t->nparts; k++) /* the sources the recipe names */
                if (t->parts[k].src != PLAN_ZERO) named[t->parts[k].src] = true;
            if (!tr->name || (!tr->blob && !tr->recipe)) rc = CKPT_ENOMEM;
        }
    }
    for (size_t r2 = 0; !rc && r2 < cp->nfolders; r2++) {
        if (!cp->index_texts[r2]) continue;
        char *path = *cp->folder_dirs[r2] ? ckpt_sprintf("%s/model.safetensors.index.json", cp->folder_dirs[r2])
                                          : ckpt_strdup("model.safetensors.index.json");
        rc = path ? add_text_file(s, r, path, cp->index_texts[r2], ws, nws) : CKPT_ENOMEM;
        free(path);
    }
    json_t *meta = rc ? NULL : layout_meta_build(cp, src_hashes, true);
    char *text = meta ? cj_render(meta) : NULL;
    json_decref(meta);
    if (!rc && !text) rc = CKPT_ENOMEM;
    if (!rc) rc = add_text_file(s, r, CONVERT_LAYOUT_FILE, text, ws, nws);
    free(text);
    for (size_t i = 0; !rc && i < files->n; i++) {
        const store_file_row *sf = &files->v[i];
        if (!sf->blob || !store_convert_is_side_file(sf->path)) continue;
        store_file_rec *fr = store_convert_rec_add_file(r, sf->path);
        if (!fr) return CKPT_ENOMEM;
        fr->size = sf->size;
        memcpy(fr->sha256, sf->sha256, 65);
        if (!(fr->blob = ckpt_strdup(sf->blob))) rc = CKPT_ENOMEM;
    }
    (void)src;
    return rc;
}

int store_convert(ckpt_store *s, const char *ref, const convert_opts *o, store_ckpt *out, bool *existed)
{
    *existed = false;
    memset(out, 0, sizeof *out);
    store_ckpt src;
    int rc = store_resolve(s, ref, &src);
    if (rc) return rc;
    if (*src.layout) {
        rc = ckpt_error_set(CKPT_EINVAL, "'%s' is a converted layout; convert from the original (%s@%s)", ref, src.repo,
                            src.revision);
        store_ckpt_free(&src);
        return rc;
    }
    src_files files = {0};
    ckpt_checkpoint c;
    memset(&c, 0, sizeof c);
    json_t *config = NULL;
    char *index_text = NULL;
    const char *index_name = NULL;
    char(*src_hashes)[65] = NULL;
    convert_plan cp;
    memset(&cp, 0, sizeof cp);
    bool planned = false;
    rc = store_files_load(s, src.id, &files.v, &files.n);
    /* A training state's optimizer files would be left behind while its
     * metadata.json still announces them: refuse, and say what works. */
    for (size_t i = 0; !rc && i < files.n; i++)
        if (!strncmp(files.v[i].path, "optimizer", 9) && strstr(files.v[i].path, ".safetensors"))
            rc = ckpt_error_set(CKPT_EINVAL,
                                "%s is a training state with optimizer files (%s), which a layout in the "
                                "store does not carry; `ckpt state export` writes it in a layout (--layout, "
                                "--tp, --rank) with its optimizer slots, or without them (--no-optimizer)",
                                ref, files.v[i].path);
    if (!rc)
        rc = store_convert_open_source(s, &src, files.v, files.n, true, &c, &config, &index_text, &index_name,
                                       &src_hashes);
    if (!rc) {
        rc = convert_plan_build_from(&cp, &c, "", config, index_name, index_text, o);
        config = NULL;
        planned = rc == 0;
    }
    if (!rc && cp.lora)
        rc = ckpt_error_set(CKPT_EINVAL,
                            "rule %zu (lora_merge): merging inside the store is its own job: `ckpt submit "
                            "merge-lora %s ADAPTER`, then convert the merged checkpoint",
                            cp.result.merges[0].rule, ref);
    int64_t id = 0;
    if (!rc) rc = store_find(s, src.repo, src.commit, cp.layout_name, &id);
    if (!rc && id) {
        *existed = true;
        rc = store_get(s, id, out);
    } else if (!rc) {
        char **blobs = ckpt_calloc(cp.exec.nsources + 1, sizeof *blobs);
        uint64_t *at = ckpt_calloc(cp.exec.nsources + 1, sizeof *at);
        store_blob_writer *ws = ckpt_calloc(cp.nfolders + 2, sizeof *ws);
        bool *named = ckpt_calloc(cp.exec.nsources + 1, sizeof *named);
        char **recipe_blobs = ckpt_calloc(cp.exec.nsources + 1, sizeof *recipe_blobs);
        size_t nws = 0;
        store_tensor_blobs stored = {0};
        if (!blobs || !at || !ws || !named || !recipe_blobs) rc = CKPT_ENOMEM;
        if (!rc) rc = store_tensor_blobs_load(s, src.id, &stored);
        for (size_t i = 0; !rc && i < cp.exec.nsources; i++) {
            const plan_source *ps = &cp.exec.sources[i];
            const st_file *sf = &cp.src.files[ps->file];
            const store_file_row *row = sf->from_torch ? find_file(&files, sf->path) : NULL;
            if (!sf->from_torch) {
                rc = store_tensor_blobs_get(&stored, sf->path, ps->name, &blobs[i]);
            } else if (!row || !row->blob) {
                rc = ckpt_error_set(CKPT_ECORRUPT, "catalog: %s has no blob", sf->path);
            } else { /* the tensor's bytes inside the stored torch.save file */
                blobs[i] = ckpt_strdup(row->blob);
                at[i] = ps->offset;
                if (!blobs[i]) rc = CKPT_ENOMEM;
            }
        }
        store_tensor_blobs_free(&stored);
        /* The recipes reference the source's blobs: lease them until the
         * commit, checked present while the record is built. */
        store_blobs_check *check = NULL;
        if (!rc) rc = store_blobs_lease_begin(s, blobs, cp.exec.nsources, &check);
        store_ckpt_rec r = {.repo = src.repo, .revision = src.revision, .commit = src.commit, .layout = cp.layout_name,
                            .source_id = src.id, .lossy = cp.result.lossy};
        if (!rc)
            rc = build_record(s, &cp, &src, &files, blobs, at, src_hashes, &r, ws, &nws, named);
        int checked = check ? store_blobs_lease_end(check) : 0;
        if (!rc) rc = checked;
        for (size_t i = 0; !rc && i < cp.exec.nsources; i++)
            if (named[i]) recipe_blobs[r.nrecipe_blobs++] = blobs[i];
        r.recipe_blobs = recipe_blobs;
        if (!rc) rc = store_blobs_publish(s, ws, nws);
        else
            for (size_t i = 0; i < nws; i++) store_blob_abort(&ws[i]);
        if (!rc) rc = store_commit_checkpoint(s, &r, &id, existed);
        if (rc) store_leases_release_after_error(s);
        if (!rc) rc = store_get(s, id, out);
        store_ckpt_rec_free(&r);
        for (size_t i = 0; blobs && i < cp.exec.nsources; i++) free(blobs[i]);
        free(blobs);
        free(at);
        free(ws);
        free(named);
        free(recipe_blobs);
    }
    if (planned) convert_plan_free(&cp);
    else ckpt_checkpoint_close(&c);
    json_decref(config);
    free(index_text);
    free(src_hashes);
    store_files_free(files.v, files.n);
    store_ckpt_free(&src);
    return rc;
}

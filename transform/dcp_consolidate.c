/* dcp_consolidate.c — PyTorch DCP folder to Hugging Face safetensors (dcp_consolidate.h). */
#include "transform/dcp_consolidate.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/util.h"
#include "format/checkpoint.h"
#include "format/dcp.h"
#include "format/outdir.h"
#include "plan/executor.h"
#include "plan/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp((*(plan_tensor *const *)a)->name, (*(plan_tensor *const *)b)->name);
}

/* One output tensor of entry e: a part per chunk, each read from its own source. */
static int add_tensor(exec_plan *p, const dcp_ckpt *c, const dcp_entry *e, const char *name, plan_tensor *t)
{
    memset(t, 0, sizeof *t);
    t->rank = PLAN_ALL_RANKS;
    t->dtype = e->dtype;
    t->ndim = e->ndim;
    memcpy(t->shape, e->shape, sizeof t->shape);
    if (!(t->name = ckpt_strdup(name))) return CKPT_ENOMEM;
    for (size_t k = 0; k < e->nchunks; k++) {
        const dcp_chunk *ch = &e->chunks[k];
        uint64_t numel = 1;
        for (int d = 0; d < e->ndim; d++) numel *= ch->sizes[d]; /* inside the tensor: no overflow */
        if (!numel) continue;                                      /* an empty chunk holds nothing */
        plan_source *s = &p->sources[p->nsources];
        char sname[ST_MAX_NAME + 32];
        snprintf(sname, sizeof sname, "%s[chunk %zu]", e->fqn, k);
        if (!(s->name = ckpt_strdup(sname))) return CKPT_ENOMEM;
        s->file = ch->file;
        s->dtype = e->dtype;
        s->ndim = e->ndim;
        /* a permuted chunk: the source is its block in stored order, walked through the axis map */
        memcpy(s->shape, ch->view ? ch->stored : ch->sizes, (size_t)e->ndim * sizeof *ch->sizes);
        s->offset = ch->data_off;
        s->nbytes = ch->nbytes;
        plan_part part;
        memset(&part, 0, sizeof part);
        part.src = (int32_t)p->nsources++;
        for (int d = 0; d < PLAN_MAX_DIM; d++) part.axis_map[d] = (int8_t)(d >= e->ndim ? -1 : ch->view ? ch->axes[d] : d);
        memcpy(part.lo, ch->offsets, (size_t)e->ndim * sizeof *ch->offsets);
        memcpy(part.ext, ch->sizes, (size_t)e->ndim * sizeof *ch->sizes);
        char what[ST_MAX_NAME + 64];
        snprintf(what, sizeof what, "%s: %s", c->dir, sname);
        int rc = plan_part_check(&part, t->ndim, t->shape, s, CKPT_EINVAL, what);
        if (!rc) rc = plan_tensor_add_part(t, &part);
        if (rc) return rc;
    }
    return 0;
}

/* The exec plan of c's model tensors; *tensors (n) are owned by the caller. */
static int build_plan(exec_plan *p, const dcp_ckpt *c, const consolidate_opts *o, plan_tensor **tensors, size_t *n,
                      char **index_text)
{
    size_t plen = o->strip_prefix ? strlen(o->strip_prefix) : 0, nchunks = 0, keep = 0, noptim = 0, ntrain = 0, nbytes = 0;
    for (size_t i = 0; i < c->nentries; i++) {
        const dcp_entry *e = &c->entries[i];
        const char *kind = dcp_non_model_kind(e->fqn);
        if (e->is_bytes) nbytes++;
        else if (kind && !strcmp(kind, "optimizer state")) noptim++;
        else if (kind) ntrain++;
        else {
            keep++;
            nchunks += e->nchunks;
        }
    }
    p->src_paths = ckpt_calloc(c->nfiles + 1, sizeof *p->src_paths);
    p->sources = ckpt_calloc(nchunks + 1, sizeof *p->sources);
    *tensors = ckpt_calloc(keep + 1, sizeof **tensors);
    plan_tensor **ptrs = ckpt_calloc(keep + 1, sizeof *ptrs);
    int rc = p->src_paths && p->sources && *tensors && ptrs ? 0 : CKPT_ENOMEM;
    for (size_t f = 0; !rc && f < c->nfiles; f++) {
        if (!(p->src_paths[f] = ckpt_strdup(c->files[f].path))) rc = CKPT_ENOMEM;
        p->nsrc_paths = f + 1;
    }
    for (size_t i = 0; !rc && i < c->nentries; i++) {
        const dcp_entry *e = &c->entries[i];
        if (e->is_bytes || dcp_non_model_kind(e->fqn)) continue;
        const char *name = e->fqn;
        if (plen && !strncmp(name, o->strip_prefix, plen)) name += plen;
        if (!*name) {
            rc = ckpt_error_set(CKPT_EINVAL, "%s: --strip-prefix '%s' leaves entry '%s' without a name", c->dir, o->strip_prefix, e->fqn);
            break;
        }
        plan_tensor *t = &(*tensors)[*n];
        rc = add_tensor(p, c, e, name, t);
        ptrs[(*n)++] = t; /* freed by the caller, also when half-built */
    }
    if (!rc) {
        qsort(ptrs, *n, sizeof *ptrs, cmp_tensor_name);
        for (size_t i = 1; !rc && i < *n; i++)
            if (!strcmp(ptrs[i - 1]->name, ptrs[i]->name))
                rc = ckpt_error_set(CKPT_EINVAL, "%s: two entries become '%s' after --strip-prefix '%s'", c->dir, ptrs[i]->name,
                                    o->strip_prefix ? o->strip_prefix : "");
    }
    if (!rc && !*n) rc = ckpt_error_set(CKPT_EINVAL, "%s: no model tensors (only optimizer, training state or bytes entries)", c->dir);
    uint64_t max = o->max_shard_size ? o->max_shard_size : CONVERT_DEFAULT_SHARD_SIZE;
    if (!rc) rc = convert_layout_folder(p, "", ptrs, *n, max, index_text);
    if (!rc && !o->quiet && noptim)
        ckpt_info("%s: %zu optimizer state tensors (optim.*, optimizer.*) are not part of the model and were left out", c->dir,
                  noptim);
    if (!rc && !o->quiet && ntrain)
        ckpt_info("%s: %zu training state tensors (lr_scheduler.*, train_state.*, dataloader.*) were left out", c->dir, ntrain);
    if (!rc && !o->quiet && nbytes)
        ckpt_info("%s: %zu bytes entries (pickled Python values, not tensors) were skipped", c->dir, nbytes);
    free(ptrs);
    return rc;
}

int dcp_consolidate(const char *src, const char *dst, consolidate_opts *o)
{
    dcp_ckpt c;
    int rc = dcp_open(&c, src);
    if (rc) return rc;
    exec_plan p;
    memset(&p, 0, sizeof p);
    plan_tensor *tensors = NULL;
    size_t n = 0;
    char *index_text = NULL, *tmp = NULL;
    rc = build_plan(&p, &c, o, &tensors, &n, &index_text);
    if (!rc) rc = outdir_prepare(dst, o->force, &tmp);
    if (!rc) {
        exec_opts eo = {.threads = o->threads, .quiet = o->quiet, .label = "consolidate"};
        rc = exec_run(&p, tmp, &eo);
        char *ipath = NULL;
        if (!rc && index_text && !(ipath = ckpt_path_join(tmp, "model.safetensors.index.json"))) rc = CKPT_ENOMEM;
        if (!rc && index_text) rc = ckpt_write_file_atomic(ipath, index_text, strlen(index_text));
        free(ipath);
        if (!rc) rc = ckpt_fsync_dir(tmp);
        if (!rc) rc = outdir_commit(tmp, dst, o->force);
        if (rc) ckpt_rm_rf(tmp);
        free(tmp);
    }
    for (size_t i = 0; tensors && i < n; i++) plan_tensor_free(&tensors[i]);
    free(tensors);
    free(index_text);
    exec_plan_free(&p);
    dcp_close(&c);
    return rc;
}

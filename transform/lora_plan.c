/* lora_plan.c — merged LoRA weights as computed sources of a plan (see lora_plan.h). */
#include "transform/lora_plan.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/sha256.h"
#include "common/util.h"
#include "lora/lora.h"
#include "transform/state_convert.h"

#include <assert.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STAGING_ALIGN 64

/* ---- ckpt-layout.json ---- */

/* The adapter's files: adapter_config.json, then its weight files (and index). */
static json_t *adapter_files(const lora_adapter *ad)
{
    json_t *files = json_array();
    if (!files) return NULL;
    json_array_append_new(files, json_pack("{s:s,s:I}", "name", LORA_CONFIG_FILE, "size",
                                           (json_int_t)strlen(ad->config_text)));
    if (ad->ck.index_path)
        json_array_append_new(files, json_pack("{s:s}", "name", ckpt_basename(ad->ck.index_path)));
    for (size_t f = 0; f < ad->ck.nfiles; f++)
        json_array_append_new(files,
                              json_pack("{s:s,s:I}", "name", ckpt_basename(ad->ck.files[f].path),
                                        "size", (json_int_t)ad->ck.files[f].file_size));
    return files;
}

/* The entry of rule g->rule in meta, made on first use. */
static json_t *rule_entry(json_t *meta, const rules_merge *g)
{
    size_t i;
    json_t *e;
    json_array_foreach(meta, i, e) if ((size_t)json_integer_value(json_object_get(e, "rule")) ==
                                       g->rule) return e;
    const lora_adapter *ad = g->adapter;
    e = json_pack("{s:I,s:s,s:f,s:b,s:o,s:I,s:f,s:b,s:[]}", "rule", (json_int_t)g->rule, "adapter",
                  ad->dir, "scale", g->scale, "unmerge", g->unmerge, "files", adapter_files(ad),
                  "r", (json_int_t)ad->r, "lora_alpha", ad->alpha, "use_rslora", ad->rslora,
                  "tensors");
    if (e) json_array_append_new(meta, e);
    return e;
}

static int note_step(json_t *meta, const rules_merge *g)
{
    json_t *e = rule_entry(meta, g);
    const lora_module *m = &g->adapter->mods[g->module];
    json_t *t =
        e ? json_pack("{s:s,s:s,s:I,s:f}", "name", g->tensor, "module", m->module, "rank",
                      (json_int_t)m->rank, "scaling", m->scale * g->scale * (g->unmerge ? -1 : 1))
          : NULL;
    if (!t || json_array_append_new(json_object_get(e, "tensors"), t))
        return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    return 0;
}

/* sha256 of every adapter file, into the metadata. */
static int hash_adapters(json_t *meta, const rules_result *res)
{
    size_t i;
    json_t *e;
    json_array_foreach(meta, i, e)
    {
        const lora_adapter *ad = NULL;
        for (size_t k = 0; k < res->nmerges && !ad; k++)
            if (res->merges[k].rule == (size_t)json_integer_value(json_object_get(e, "rule")))
                ad = res->merges[k].adapter;
        if (!ad) continue;
        size_t j;
        json_t *f;
        json_array_foreach(json_object_get(e, "files"), j, f)
        {
            char *path = ckpt_path_join(ad->dir, json_string_value(json_object_get(f, "name")));
            char hex[65];
            int rc = path ? ckpt_sha256_file_hex(path, hex) : CKPT_ENOMEM;
            free(path);
            if (rc) return rc;
            json_object_set_new(f, "sha256", json_string(hex));
        }
    }
    return 0;
}

json_t *lora_plan_meta(const convert_plan *cp)
{
    return cp->lora ? json_incref(cp->lora->meta) : NULL;
}

/* ---- planning ---- */

static int add_staging_path(exec_plan *p, size_t *index)
{
    char **paths = ckpt_realloc(p->src_paths, (p->nsrc_paths + 2) * sizeof *paths);
    if (!paths) return CKPT_ENOMEM;
    p->src_paths = paths;
    if (!(p->src_paths[p->nsrc_paths] = ckpt_strdup(LORA_STAGING_FILE))) return CKPT_ENOMEM;
    *index = p->nsrc_paths++;
    return 0;
}

/* A computed source like `in`, at the end of the staging file. */
static int add_computed_source(convert_plan *cp, int32_t in, int32_t *out)
{
    exec_plan *p = &cp->exec;
    plan_source *src = ckpt_realloc(p->sources, (p->nsources + 2) * sizeof *src);
    if (!src) return CKPT_ENOMEM;
    p->sources = src;
    plan_source *s = &p->sources[p->nsources];
    *s = p->sources[in];
    if (!(s->name = ckpt_strdup(p->sources[in].name))) return CKPT_ENOMEM;
    s->file = cp->lora->staging_file;
    s->offset = (cp->lora->staging_size + STAGING_ALIGN - 1) / STAGING_ALIGN * STAGING_ALIGN;
    cp->lora->staging_size = s->offset + s->nbytes;
    *out = (int32_t)p->nsources++;
    return 0;
}

/* The tensor the rule saw must be its source as it is then: a cast or a
 * reshape before lora_merge would be merged into the wrong bytes. */
static int check_source(const rules_merge *g, const plan_source *s)
{
    if (s->dtype != g->dtype)
        return ckpt_error_set(
            CKPT_EINVAL,
            "rule %zu (lora_merge): tensor '%s' is %s but its source '%s' is %s (cast by an "
            "earlier rule); put lora_merge first",
            g->rule, g->tensor, ckpt_dtype_name(g->dtype), s->name, ckpt_dtype_name(s->dtype));
    bool same = s->ndim == g->ndim;
    for (int k = 0; same && k < s->ndim; k++)
        same = s->shape[k] == g->shape[k];
    if (!same)
        return ckpt_error_set(
            CKPT_EINVAL,
            "rule %zu (lora_merge): tensor '%s' does not have the shape of its source '%s' "
            "(reshaped by an earlier rule); put lora_merge first",
            g->rule, g->tensor, s->name);
    return 0;
}

int lora_plan_derive(convert_plan *cp)
{
    const rules_result *res = &cp->result;
    if (res->nmerges == 0) return 0;
    if (cp->state && cp->state->has_opt_files)
        return ckpt_error_set(CKPT_EINVAL,
                              "rule %zu (lora_merge): %s is a training state with optimizer files; "
                              "merge the adapter into its model files alone",
                              res->merges[0].rule,
                              cp->src_dir && *cp->src_dir ? cp->src_dir : "the source");
    size_t n0 = cp->exec.nsources;
    cp->lora = ckpt_calloc(1, sizeof *cp->lora);
    int32_t *current = ckpt_calloc(n0 + 1, sizeof *current);
    int rc = cp->lora && current ? 0 : CKPT_ENOMEM;
    struct lora_plan *lp = cp->lora;
    if (!rc) {
        lp->steps = ckpt_calloc(res->nmerges, sizeof *lp->steps);
        lp->meta = json_array();
        if (!lp->steps || !lp->meta) rc = CKPT_ENOMEM;
    }
    if (!rc) rc = add_staging_path(&cp->exec, &lp->staging_file);
    for (size_t i = 0; i < n0 && current; i++)
        current[i] = (int32_t)i;
    for (size_t k = 0; !rc && k < res->nmerges; k++) {
        const rules_merge *g = &res->merges[k];
        if (k == 0 || g->rule != res->merges[k - 1].rule) {
            rc = lora_adapter_check_base(g->adapter, &cp->src);
            if (rc) {
                ckpt_error_prefix(rc, "rule %zu (lora_merge)", g->rule);
                break;
            }
        }
        assert(g->src >= 0 && (size_t)g->src < n0);
        struct lora_step *st = &lp->steps[lp->nsteps];
        st->merge = g;
        st->in = current[g->src];
        if ((rc = check_source(g, &cp->exec.sources[g->src]))) break;
        if ((rc = add_computed_source(cp, st->in, &st->out))) break;
        current[g->src] = st->out;
        lp->nsteps++;
        rc = note_step(lp->meta, g);
    }
    /* Every part that read a merged weight reads its last version. */
    for (size_t i = 0; !rc && i < cp->set.n; i++) {
        plan_tensor *t = &cp->set.t[i];
        for (size_t p = 0; p < t->nparts; p++)
            if (t->parts[p].src >= 0 && (size_t)t->parts[p].src < n0)
                t->parts[p].src = current[t->parts[p].src];
    }
    free(current);
    return rc;
}

/* ---- computing ---- */

/* The descriptor of source file `file`, opened on first use. */
static int source_fd(const convert_plan *cp, int *fds, size_t file)
{
    if (fds[file] < 0) {
        fds[file] = open(cp->exec.src_paths[file], O_RDONLY | O_CLOEXEC);
        if (fds[file] < 0) return ckpt_error_sys("%s: open", cp->exec.src_paths[file]);
    }
    return 0;
}

/* One lora_merge rule's steps [k0, k1): one run of the merge engine. */
static int compute_rule(convert_plan *cp, size_t k0, size_t k1, int *fds, int staging_fd,
                        const convert_opts *o)
{
    struct lora_plan *lp = cp->lora;
    lora_merge_target *t = ckpt_calloc(k1 - k0 + 1, sizeof *t);
    if (!t) return CKPT_ENOMEM;
    int rc = 0;
    for (size_t k = k0; !rc && k < k1; k++) {
        const struct lora_step *st = &lp->steps[k];
        const plan_source *in = &cp->exec.sources[st->in], *out = &cp->exec.sources[st->out];
        bool staged = in->file == lp->staging_file;
        if (!staged) rc = source_fd(cp, fds, in->file);
        t[k - k0] = (lora_merge_target){.m = &st->merge->adapter->mods[st->merge->module],
                                        .dtype = in->dtype,
                                        .rows = in->shape[0],
                                        .cols = in->shape[1],
                                        .src_fd = staged ? staging_fd : fds[in->file],
                                        .src_off = in->offset,
                                        .src_path = cp->exec.src_paths[in->file],
                                        .dst_fd = staging_fd,
                                        .dst_off = out->offset,
                                        .dst_path = lp->staging_path};
    }
    const rules_merge *g = lp->steps[k0].merge;
    lora_merge_opts mo = {
        .scale = g->scale, .unmerge = g->unmerge, .threads = o->threads, .quiet = o->quiet};
    lora_merge_stats stats;
    if (!rc) rc = lora_merge_targets(g->adapter, t, k1 - k0, &mo, &stats);
    if (rc) ckpt_error_prefix(rc, "rule %zu (lora_merge)", g->rule);
    free(t);
    return rc;
}

int lora_plan_compute(convert_plan *cp, const char *tmp, const convert_opts *o)
{
    struct lora_plan *lp = cp->lora;
    if (!lp) return 0;
    int rc = o->no_hash ? 0 : hash_adapters(lp->meta, &cp->result);
    if (!rc && !(lp->staging_path = ckpt_path_join(tmp, LORA_STAGING_FILE))) rc = CKPT_ENOMEM;
    if (rc) return rc;
    free(cp->exec.src_paths[lp->staging_file]);
    if (!(cp->exec.src_paths[lp->staging_file] = ckpt_strdup(lp->staging_path))) return CKPT_ENOMEM;
    int staging_fd = open(lp->staging_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (staging_fd < 0) return ckpt_error_sys("%s: create", lp->staging_path);
    int *fds = ckpt_calloc(cp->exec.nsrc_paths + 1, sizeof *fds);
    if (!fds) rc = CKPT_ENOMEM;
    for (size_t i = 0; fds && i < cp->exec.nsrc_paths; i++)
        fds[i] = -1;
    if (!rc && ftruncate(staging_fd, (off_t)lp->staging_size) < 0)
        rc = ckpt_error_sys("%s: extend", lp->staging_path);
    for (size_t k0 = 0, k1; !rc && k0 < lp->nsteps; k0 = k1) {
        for (k1 = k0 + 1; k1 < lp->nsteps && lp->steps[k1].merge->rule == lp->steps[k0].merge->rule;
             k1++) {
        }
        rc = compute_rule(cp, k0, k1, fds, staging_fd, o);
    }
    for (size_t i = 0; fds && i < cp->exec.nsrc_paths; i++)
        if (fds[i] >= 0) close(fds[i]);
    free(fds);
    close(staging_fd);
    return rc;
}

int lora_plan_finish(convert_plan *cp)
{
    if (!cp->lora || !cp->lora->staging_path) return 0;
    if (unlink(cp->lora->staging_path) < 0)
        return ckpt_error_sys("%s: remove", cp->lora->staging_path);
    return 0;
}

void lora_plan_free(convert_plan *cp)
{
    if (!cp->lora) return;
    free(cp->lora->steps);
    free(cp->lora->staging_path);
    json_decref(cp->lora->meta);
    free(cp->lora);
    cp->lora = NULL;
}

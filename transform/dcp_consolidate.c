/* dcp_consolidate.c — PyTorch DCP folder to Hugging Face safetensors (dcp_consolidate.h). */
#include "transform/dcp_consolidate.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/json.h"
#include "common/util.h"
#include "format/checkpoint.h"
#include "format/dcp.h"
#include "format/outdir.h"
#include "plan/executor.h"
#include "plan/plan.h"
#include "transform/state_convert.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

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

#define DCP_MAX_SLOT_NAME 256 /* the longest slot name a training state takes (state.c) */

/* With --state: what the optimizer entries become. */
typedef struct {
    plan_tensor **slots; /* "<param>/<slot>", in the tensors array after the model's */
    size_t nslots;
    char **slot_names; /* distinct, sorted */
    size_t nslot_names;
    char *index_text; /* optimizer.safetensors.index.json, or NULL */
    bool has_step;
    double step;           /* train_state.step, else the optimizer's common step */
    double opt_step;       /* the per-parameter "step" tensors, when they agree */
    bool has_opt_step, opt_steps_differ;
    plan_tensor **model_for_meta; /* the model tensors (for metadata.json's dtypes) */
    size_t nmodel;
} dcp_state_out;

/* The value of a 0-d tensor entry (an integer or float step). */
static int read_scalar(const dcp_ckpt *c, const dcp_entry *e, double *out)
{
    uint8_t b[8] = {0};
    if (e->ndim || e->nchunks != 1 || e->chunks[0].nbytes > sizeof b)
        return ckpt_error_set(CKPT_EINVAL, "%s: '%s' is not a scalar", c->dir, e->fqn);
    const dcp_chunk *ch = &e->chunks[0];
    int fd = open(c->files[ch->file].path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ckpt_error_sys("%s: open", c->files[ch->file].path);
    int rc = ckpt_pread_full(fd, b, (size_t)ch->nbytes, ch->data_off, c->files[ch->file].path);
    close(fd);
    if (rc) return rc;
    if (ckpt_scalar_value(e->dtype, b, out) < 0)
        return ckpt_error_set(CKPT_EINVAL, "%s: '%s' is a %s scalar, not a step", c->dir, e->fqn, ckpt_dtype_name(e->dtype));
    return 0;
}

/* "optim.state.<param>.<slot>" (or "optimizer.state."): where <param> and <slot> start. */
static bool optim_slot_name(const char *fqn, const char **param, size_t *param_len, const char **slot)
{
    static const char *const prefixes[] = {"optim.state.", "optimizer.state."};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(prefixes); i++) {
        size_t pl = strlen(prefixes[i]);
        if (strncmp(fqn, prefixes[i], pl)) continue;
        const char *rest = fqn + pl, *dot = strrchr(rest, '.');
        if (!dot || dot == rest || !dot[1]) return false;
        *param = rest;
        *param_len = (size_t)(dot - rest);
        *slot = dot + 1;
        return true;
    }
    return false;
}

static const plan_tensor *find_model(plan_tensor **model, size_t n, const char *name, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(model[i]->name) == len && !strncmp(model[i]->name, name, len)) return model[i];
    return NULL;
}

/* The model tensor an optimizer entry's <param> names: as it is, or with the
 * --strip-prefix removed (its keys are module names, the model's were
 * flattened under "model."). */
static const plan_tensor *slot_param(plan_tensor **model, size_t n, const char *param, size_t len, const char *strip)
{
    const plan_tensor *t = find_model(model, n, param, len);
    size_t sl = strip ? strlen(strip) : 0;
    if (!t && sl && len > sl && !strncmp(param, strip, sl)) t = find_model(model, n, param + sl, len - sl);
    return t;
}

static int add_slot_name(dcp_state_out *so, const char *slot)
{
    for (size_t i = 0; i < so->nslot_names; i++)
        if (!strcmp(so->slot_names[i], slot)) return 0;
    char **v = ckpt_realloc(so->slot_names, (so->nslot_names + 1) * sizeof *v);
    if (!v) return CKPT_ENOMEM;
    so->slot_names = v;
    return (v[so->nslot_names++] = ckpt_strdup(slot)) ? 0 : CKPT_ENOMEM;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* --state: every optimizer entry that names a model tensor of its shape
 * becomes the slot twin "<param>/<slot>"; the per-parameter steps and
 * train_state.step give the state's step; what maps nowhere is listed. */
static int plan_slots(exec_plan *p, const dcp_ckpt *c, const consolidate_opts *o, plan_tensor *tensors, size_t *n,
                      plan_tensor **model, size_t nmodel, dcp_state_out *so)
{
    so->slots = ckpt_calloc(c->nentries + 1, sizeof *so->slots);
    if (!so->slots) return CKPT_ENOMEM;
    size_t unmapped = 0;
    int rc = 0;
    for (size_t i = 0; !rc && i < c->nentries; i++) {
        const dcp_entry *e = &c->entries[i];
        const char *kind = dcp_non_model_kind(e->fqn), *param, *slot;
        size_t plen;
        if (e->is_bytes || !kind) continue;
        if (!strcmp(e->fqn, "train_state.step") && !e->ndim) {
            rc = read_scalar(c, e, &so->step);
            so->has_step = rc == 0;
            continue;
        }
        if (strcmp(kind, "optimizer state") || !optim_slot_name(e->fqn, &param, &plen, &slot)) continue;
        if (!strcmp(slot, "step") && !e->ndim) {
            double v;
            rc = read_scalar(c, e, &v);
            if (!rc && so->has_opt_step && v != so->opt_step) so->opt_steps_differ = true;
            so->opt_step = v;
            so->has_opt_step = true;
            continue;
        }
        const plan_tensor *pt = slot_param(model, nmodel, param, plen, o->strip_prefix);
        bool fits = pt && pt->ndim == e->ndim && !memcmp(pt->shape, e->shape, (size_t)e->ndim * sizeof *e->shape);
        bool named = strlen(slot) <= DCP_MAX_SLOT_NAME && !strchr(slot, '/');
        if (!fits || !named) {
            unmapped++;
            if (!o->quiet)
                ckpt_info("%s: left out '%s': %s", c->dir, e->fqn,
                          !named ? "its slot name is longer than 256 bytes or holds '/'"
                          : pt   ? "its shape is not its parameter's"
                                 : "no model tensor of that name");
            continue;
        }
        char *name = ckpt_sprintf("%s/%s", pt->name, slot);
        plan_tensor *t = &tensors[*n];
        rc = name ? add_tensor(p, c, e, name, t) : CKPT_ENOMEM;
        free(name);
        so->slots[so->nslots++] = t;
        (*n)++; /* freed by the caller, also when half-built */
        if (!rc) rc = add_slot_name(so, slot);
    }
    if (!rc && !so->nslots)
        rc = ckpt_error_set(CKPT_EINVAL, "%s: --state: no optimizer entry (optim.state.<param>.<slot>) matches a model tensor", c->dir);
    if (!rc) qsort(so->slot_names, so->nslot_names, sizeof *so->slot_names, cmp_str);
    if (!rc && !so->has_step && so->has_opt_step && !so->opt_steps_differ) {
        so->step = so->opt_step;
        so->has_step = true;
    }
    if (!rc && !o->quiet)
        ckpt_info("%s: %zu optimizer tensors became slots (%zu left out), step %.0f", c->dir, so->nslots, unmapped,
                  so->has_step ? so->step : 0.0);
    uint64_t max = o->max_shard_size ? o->max_shard_size : CONVERT_DEFAULT_SHARD_SIZE;
    if (!rc) rc = convert_layout_folder_prefix(p, "", "optimizer", so->slots, so->nslots, max, &so->index_text);
    return rc;
}

/* The exec plan of c's model tensors (and, with o->state, their optimizer
 * slots); *tensors (n) are owned by the caller. */
static int build_plan(exec_plan *p, const dcp_ckpt *c, const consolidate_opts *o, plan_tensor **tensors, size_t *n,
                      char **index_text, dcp_state_out *so)
{
    size_t plen = o->strip_prefix ? strlen(o->strip_prefix) : 0, nchunks = 0, keep = 0, noptim = 0, ntrain = 0, nbytes = 0;
    for (size_t i = 0; i < c->nentries; i++) {
        const dcp_entry *e = &c->entries[i];
        const char *kind = dcp_non_model_kind(e->fqn);
        if (e->is_bytes) nbytes++;
        else if (kind && !strcmp(kind, "optimizer state")) noptim++;
        else if (kind) ntrain++;
        if (!e->is_bytes && (!kind || o->state)) { /* with --state, room for every optimizer entry */
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
    size_t nmodel = *n;
    if (!rc) {
        qsort(ptrs, nmodel, sizeof *ptrs, cmp_tensor_name);
        for (size_t i = 1; !rc && i < nmodel; i++)
            if (!strcmp(ptrs[i - 1]->name, ptrs[i]->name))
                rc = ckpt_error_set(CKPT_EINVAL, "%s: two entries become '%s' after --strip-prefix '%s'", c->dir, ptrs[i]->name,
                                    o->strip_prefix ? o->strip_prefix : "");
    }
    if (!rc && !nmodel) rc = ckpt_error_set(CKPT_EINVAL, "%s: no model tensors (only optimizer, training state or bytes entries)", c->dir);
    uint64_t max = o->max_shard_size ? o->max_shard_size : CONVERT_DEFAULT_SHARD_SIZE;
    if (!rc) rc = convert_layout_folder(p, "", ptrs, nmodel, max, index_text);
    if (!rc && o->state) rc = plan_slots(p, c, o, *tensors, n, ptrs, nmodel, so);
    if (!rc && !o->quiet && noptim && !o->state)
        ckpt_info("%s: %zu optimizer state tensors (optim.*, optimizer.*) are not part of the model and were left out "
                  "(--state keeps them as a training state's slots)", c->dir, noptim);
    if (!rc && !o->quiet && ntrain)
        ckpt_info("%s: %zu training state tensors (lr_scheduler.*, train_state.*, dataloader.*) were left out", c->dir, ntrain);
    if (!rc && !o->quiet && nbytes)
        ckpt_info("%s: %zu bytes entries (pickled Python values, not tensors) were skipped", c->dir, nbytes);
    if (!rc && o->state) rc = (so->model_for_meta = ckpt_calloc(nmodel + 1, sizeof *ptrs)) ? 0 : CKPT_ENOMEM;
    if (!rc && o->state) {
        memcpy(so->model_for_meta, ptrs, nmodel * sizeof *ptrs);
        so->nmodel = nmodel;
    }
    free(ptrs);
    return rc;
}

static int write_index(const char *tmp, const char *name, const char *text)
{
    if (!text) return 0;
    char *path = ckpt_path_join(tmp, name);
    int rc = path ? ckpt_write_file_atomic(path, text, strlen(text)) : CKPT_ENOMEM;
    free(path);
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
    dcp_state_out so;
    memset(&so, 0, sizeof so);
    rc = build_plan(&p, &c, o, &tensors, &n, &index_text, &so);
    if (!rc) rc = outdir_prepare(dst, o->force, &tmp);
    if (!rc) {
        exec_opts eo = {.threads = o->threads, .quiet = o->quiet, .label = "consolidate"};
        rc = exec_run(&p, tmp, &eo);
        if (!rc) rc = write_index(tmp, "model.safetensors.index.json", index_text);
        if (!rc && o->state) rc = write_index(tmp, "optimizer.safetensors.index.json", so.index_text);
        json_t *scalars = o->state ? json_object() : NULL;
        if (scalars && so.has_opt_step && !so.opt_steps_differ) json_object_set_new(scalars, "step", json_real(so.opt_step));
        if (!rc && o->state)
            rc = scalars ? state_write_side_files(tmp, so.slot_names, so.nslot_names, scalars, NULL, so.has_step ? (int64_t)so.step : 0,
                                                  so.model_for_meta, so.nmodel, so.slots, so.nslots)
                         : CKPT_ENOMEM;
        json_decref(scalars);
        if (!rc) rc = ckpt_fsync_dir(tmp);
        if (!rc) rc = outdir_commit(tmp, dst, o->force);
        if (rc) ckpt_rm_rf(tmp);
        free(tmp);
    }
    for (size_t i = 0; tensors && i < n; i++) plan_tensor_free(&tensors[i]);
    free(tensors);
    free(index_text);
    free(so.slots);
    free(so.model_for_meta);
    free(so.index_text);
    for (size_t i = 0; i < so.nslot_names; i++) free(so.slot_names[i]);
    free(so.slot_names);
    exec_plan_free(&p);
    dcp_close(&c);
    return rc;
}

/* state_convert.c — optimizer slots follow their parameters through convert and consolidate (see
 * state_convert.h). */
#include "transform/state_convert.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/util.h"
#include "include/ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OPT_INDEX_NAME "optimizer.safetensors.index.json"

static bool dir_has(const char *dir, const char *name)
{
    char *p = ckpt_path_join(dir, name);
    bool yes = p && ckpt_exists(p);
    free(p);
    return yes;
}

int state_checkpoint_open(ckpt_checkpoint *c, const char *path)
{
    if (!ckpt_is_dir(path) ||
        (!dir_has(path, "optimizer.safetensors") && !dir_has(path, OPT_INDEX_NAME)))
        return ckpt_checkpoint_open_views(c, path); /* convert plans a torch view's copy */
    memset(c, 0, sizeof *c);
    ckpt_checkpoint model, opt;
    int rc = ckpt_checkpoint_open(&model, path);
    if (rc) return rc;
    if ((rc = ckpt_checkpoint_open_prefix(&opt, path, "optimizer"))) {
        ckpt_checkpoint_close(&model);
        return rc;
    }
    return state_checkpoint_join(c, path, &model, &opt);
}

int state_checkpoint_join(ckpt_checkpoint *c, const char *label, ckpt_checkpoint *model, ckpt_checkpoint *opt)
{
    memset(c, 0, sizeof *c);
    size_t n = model->nfiles + opt->nfiles;
    st_file *files = ckpt_calloc(n + 1, sizeof *files);
    char *index_path = model->index_path ? ckpt_strdup(model->index_path) : NULL;
    if (!files || (model->index_path && !index_path)) {
        free(files);
        ckpt_checkpoint_close(model);
        ckpt_checkpoint_close(opt);
        return CKPT_ENOMEM;
    }
    /* The files move into the combined checkpoint; the two husks are closed empty. */
    memcpy(files, model->files, model->nfiles * sizeof *files);
    memcpy(files + model->nfiles, opt->files, opt->nfiles * sizeof *files);
    model->nfiles = opt->nfiles = 0;
    ckpt_checkpoint_close(model);
    ckpt_checkpoint_close(opt);
    int rc = ckpt_checkpoint_from_files(c, label, files, n);
    free(files);
    if (rc) {
        free(index_path);
        return rc;
    }
    c->index_path = index_path;
    return 0;
}

/* ---- convert ---- */

static bool source_in_optimizer_file(const convert_plan *cp, size_t source)
{
    const plan_source *s = &cp->exec.sources[source];
    return state_is_optimizer_file(ckpt_basename(cp->exec.src_paths[s->file]));
}

int state_plan_init(convert_plan *cp)
{
    bool opt_files = false, model_files = false;
    const char *opt_dir_file = NULL;
    for (size_t f = 0; f < cp->src.nfiles; f++) {
        bool o = state_is_optimizer_file(ckpt_basename(cp->src.files[f].path));
        opt_files |= o;
        model_files |= !o;
        if (o && !opt_dir_file) opt_dir_file = cp->src.files[f].path;
    }
    bool is_state = false;
    if (cp->src_dir && *cp->src_dir && dir_has(cp->src_dir, STATE_METADATA_FILE)) {
        json_t *meta = NULL;
        char *path = ckpt_path_join(cp->src_dir, STATE_METADATA_FILE);
        const char *format = NULL;
        if (path && cj_load_file(&meta, path, STATE_JSON_MAX_BYTES) == 0)
            format = json_string_value(json_object_get(meta, "format"));
        is_state = format && !strcmp(format, CKPT_STATE_FORMAT);
        json_decref(meta);
        free(path);
    }
    if (!is_state && !(opt_files && model_files)) return 0;
    cp->state = ckpt_calloc(1, sizeof *cp->state);
    if (!cp->state) return CKPT_ENOMEM;
    cp->state->is_state = is_state;
    cp->state->has_opt_files = opt_files && model_files;
    if (!cp->state->has_opt_files) return 0;
    /* The optimizer's index, kept for consolidation like the model's. */
    const char *slash = strrchr(opt_dir_file, '/');
    char *dir =
        slash ? ckpt_strndup(opt_dir_file, (size_t)(slash - opt_dir_file)) : ckpt_strdup(".");
    char *index = dir ? ckpt_path_join(dir, OPT_INDEX_NAME) : NULL;
    int rc = index ? 0 : CKPT_ENOMEM;
    if (!rc && ckpt_exists(index))
        rc = ckpt_read_file(index, CKPT_INDEX_MAX_BYTES, &cp->state->src_opt_index_text, NULL);
    free(dir);
    free(index);
    return rc;
}

bool state_plan_is_slot_source(const convert_plan *cp, size_t source)
{
    return cp->state && source_in_optimizer_file(cp, source);
}

size_t state_plan_nslots(const convert_plan *cp)
{
    return cp->state ? cp->state->nslots : 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every slot source names a parameter source of the same shape; *names gets the distinct slot
 * names, sorted. */
static int collect_slots(const convert_plan *cp, char ***names, size_t *n)
{
    *names = NULL;
    *n = 0;
    size_t cap = 0;
    int rc = 0;
    for (size_t i = 0; !rc && i < cp->exec.nsources; i++) {
        if (!state_plan_is_slot_source(cp, i)) continue;
        const plan_source *s = &cp->exec.sources[i];
        size_t plen;
        if (!state_split_slot_name(s->name, &plen))
            return ckpt_error_set(CKPT_EINVAL,
                                  "%s: optimizer tensor '%s' is not named '<parameter>/<slot>'",
                                  cp->exec.src_paths[s->file], s->name);
        char *param = ckpt_strndup(s->name, plen);
        if (!param) return CKPT_ENOMEM;
        const ckpt_tensor_ref *ref = ckpt_checkpoint_find(&cp->src, param);
        size_t pi = ref ? (size_t)(ref - cp->src.tensors) : 0;
        if (!ref || state_plan_is_slot_source(cp, pi))
            rc = ckpt_error_set(
                CKPT_EINVAL,
                "%s: optimizer tensor '%s' names parameter '%s', which the model does "
                "not have",
                cp->exec.src_paths[s->file], s->name, param);
        else if (cp->exec.sources[pi].ndim != s->ndim ||
                 memcmp(cp->exec.sources[pi].shape, s->shape, (size_t)s->ndim * sizeof *s->shape))
            rc = ckpt_error_set(CKPT_EINVAL,
                                "%s: optimizer tensor '%s' is not shaped like parameter '%s'",
                                cp->exec.src_paths[s->file], s->name, param);
        free(param);
        const char *slot = s->name + plen + 1;
        bool seen = false;
        for (size_t k = 0; !rc && k < *n; k++)
            seen |= !strcmp((*names)[k], slot);
        if (!rc && !seen && !(rc = ckpt_grow(names, &cap, *n + 1, sizeof **names))) {
            if (!((*names)[*n] = ckpt_strdup(slot)))
                rc = CKPT_ENOMEM;
            else
                (*n)++;
        }
    }
    if (*n) qsort(*names, *n, sizeof **names, cmp_str);
    return rc;
}

/* The twin of output tensor t for one slot; *present false when no source of t has that slot. */
static int make_twin(const convert_plan *cp, const plan_tensor *t, const char *slot,
                     plan_tensor *tw, bool *present)
{
    *present = false;
    int rc = plan_tensor_copy(tw, t);
    if (rc) return rc;
    size_t found = 0, missing = 0;
    const char *missing_name = NULL, *found_name = NULL;
    ckpt_dtype slot_dt = CKPT_DT_F32, param_dt = t->dtype;
    for (size_t i = 0; !rc && i < tw->nparts; i++) {
        plan_part *p = &tw->parts[i];
        if (p->src == PLAN_ZERO) continue;
        const plan_source *ps = &cp->exec.sources[p->src];
        char *name = ckpt_sprintf("%s/%s", ps->name, slot);
        const ckpt_tensor_ref *ref = name ? ckpt_checkpoint_find(&cp->src, name) : NULL;
        free(name);
        if (!ref) {
            missing++;
            missing_name = ps->name;
            continue;
        }
        int32_t idx = (int32_t)(ref - cp->src.tensors);
        const plan_source *ss = &cp->exec.sources[idx];
        if (found && ss->dtype != slot_dt)
            rc = ckpt_error_set(
                CKPT_EINVAL,
                "optimizer slot '%s' of '%s' and of '%s' differ in dtype, but the layout "
                "puts them into one tensor '%s'",
                slot, found_name, ps->name, t->name);
        slot_dt = ss->dtype;
        param_dt = ps->dtype;
        found_name = ps->name;
        p->src = idx;
        found++;
    }
    if (!rc && found && missing)
        rc = ckpt_error_set(
            CKPT_EINVAL,
            "optimizer slot '%s' exists for '%s' but not for '%s', which the layout puts "
            "into the same tensor '%s'",
            slot, found_name, missing_name, t->name);
    if (rc || !found) {
        plan_tensor_free(tw);
        return rc;
    }
    char *name = ckpt_sprintf("%s/%s", t->name, slot);
    json_t *meta = json_pack("{s:{s:s,s:s}}", "optimizer_slot", "param", t->name, "slot", slot);
    if (!name || !meta) {
        free(name);
        json_decref(meta);
        plan_tensor_free(tw);
        return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    }
    free(tw->name);
    tw->name = name;
    json_decref(tw->meta);
    tw->meta = meta;
    /* A cast rule changed the parameter's dtype: the slot is cast the same way. */
    tw->dtype = t->dtype == param_dt ? slot_dt : t->dtype;
    *present = true;
    return 0;
}

int state_plan_add_slots(convert_plan *cp)
{
    if (!cp->state) return 0;
    char **slots;
    size_t nslots;
    int rc = collect_slots(cp, &slots, &nslots);
    size_t nparams = cp->set.n;
    for (size_t i = 0; !rc && i < nparams; i++) {
        for (size_t k = 0; !rc && k < nslots; k++) {
            plan_tensor tw;
            bool present;
            rc = make_twin(cp, &cp->set.t[i], slots[k], &tw, &present);
            if (!rc && present) rc = plan_set_push(&cp->set, &tw);
        }
    }
    cp->state->nslots = cp->set.n - nparams;
    for (size_t k = 0; k < nslots; k++)
        free(slots[k]);
    free(slots);
    return rc;
}

int state_plan_layout_folder(convert_plan *cp, size_t r, uint64_t max_shard_size)
{
    struct state_plan *sp = cp->state;
    /* Every folder gets optimizer files (empty ones for a state without slots) when the source has
     * them. */
    if (!sp || !sp->has_opt_files) return 0;
    if (!sp->opt_index_texts) {
        sp->nfolders = cp->nfolders;
        if (!(sp->opt_index_texts = ckpt_calloc(cp->nfolders + 1, sizeof *sp->opt_index_texts)))
            return CKPT_ENOMEM;
    }
    size_t first = cp->set.n - sp->nslots, n = 0;
    plan_tensor **list = ckpt_calloc(sp->nslots + 1, sizeof *list);
    if (!list) return CKPT_ENOMEM;
    for (size_t i = first; i < cp->set.n; i++)
        if (cp->set.t[i].rank == PLAN_ALL_RANKS || cp->set.t[i].rank == (int)r)
            list[n++] = &cp->set.t[i];
    int rc = convert_layout_folder_prefix(&cp->exec, cp->folder_dirs[r], "optimizer", list, n,
                                          max_shard_size, &sp->opt_index_texts[r]);
    free(list);
    return rc;
}

int state_plan_write(const convert_plan *cp, const char *tmp)
{
    const struct state_plan *sp = cp->state;
    if (!sp) return 0;
    int rc = 0;
    for (size_t r = 0; !rc && r < cp->nfolders; r++) {
        const char *sub = cp->folder_dirs[r];
        char *dir = *sub ? ckpt_path_join(tmp, sub) : ckpt_strdup(tmp);
        if (!dir) return CKPT_ENOMEM;
        if (sp->opt_index_texts && r < sp->nfolders && sp->opt_index_texts[r]) {
            char *path = ckpt_path_join(dir, OPT_INDEX_NAME);
            const char *text = sp->opt_index_texts[r];
            rc = path ? ckpt_write_file_atomic(path, text, strlen(text)) : CKPT_ENOMEM;
            free(path);
        }
        /* Each rank folder a state of its own. */
        if (!rc && *sub && sp->is_state) rc = outdir_copy_side_files(cp->src_dir, dir);
        if (!rc) rc = ckpt_fsync_dir(dir);
        free(dir);
    }
    return rc;
}

void state_plan_meta(const convert_plan *cp, json_t *root)
{
    const struct state_plan *sp = cp->state;
    if (!sp) return;
    json_t *j = json_pack("{s:b,s:I,s:s,s:s?}", "is_state", sp->is_state, "optimizer_tensors",
                          (json_int_t)sp->nslots, "optimizer_index_name", OPT_INDEX_NAME,
                          "optimizer_index", sp->src_opt_index_text);
    if (j) json_object_set_new(root, "state", j);
}

void state_plan_free(convert_plan *cp)
{
    struct state_plan *sp = cp->state;
    if (!sp) return;
    for (size_t r = 0; sp->opt_index_texts && r < sp->nfolders; r++)
        free(sp->opt_index_texts[r]);
    free(sp->opt_index_texts);
    free(sp->src_opt_index_text);
    free(sp);
    cp->state = NULL;
}

/* ---- consolidate ---- */

static int rank_step(const char *src, int r, int64_t *step, bool *present)
{
    char *path = ckpt_sprintf("%s/tp_rank_%02d/%s", src, r, STATE_METADATA_FILE);
    if (!path) return CKPT_ENOMEM;
    json_t *meta = NULL;
    int rc = 0;
    *present = ckpt_exists(path);
    if (*present) rc = cj_load_file(&meta, path, STATE_JSON_MAX_BYTES);
    if (!rc && *present) rc = cj_int(meta, "step", step, path);
    json_decref(meta);
    free(path);
    return rc;
}

int state_consolidate_finish(const json_t *layout, const char *src, const char *tmp, int tp)
{
    const json_t *st = json_object_get(layout, "state");
    const char *index = json_string_value(json_object_get(st, "optimizer_index"));
    int rc = 0;
    if (index) {
        char *path = ckpt_path_join(tmp, OPT_INDEX_NAME);
        rc = path ? ckpt_write_file_atomic(
                        path, index, json_string_length(json_object_get(st, "optimizer_index")))
                  : CKPT_ENOMEM;
        free(path);
    }
    if (rc || tp <= 1) return rc;
    /* Per-rank states: the newest metadata is the ranks', which must agree on the step. */
    int64_t step0 = 0, step = 0;
    bool has0 = false, has = false;
    if ((rc = rank_step(src, 0, &step0, &has0)) || !has0) return rc;
    for (int r = 1; r < tp; r++) {
        if ((rc = rank_step(src, r, &step, &has))) return rc;
        if (!has)
            return ckpt_error_set(CKPT_EINVAL,
                                  "%s: tp_rank_00 is a training state but tp_rank_%02d has no %s",
                                  src, r, STATE_METADATA_FILE);
        if (step != step0)
            return ckpt_error_set(
                CKPT_EINVAL,
                "%s: tp_rank_%02d is at step %lld but tp_rank_00 at step %lld; the ranks "
                "of one state must be saved at the same step",
                src, r, (long long)step, (long long)step0);
    }
    char *rank0 = ckpt_sprintf("%s/tp_rank_00", src);
    rc = rank0 ? outdir_copy_side_files(rank0, tmp) : CKPT_ENOMEM;
    free(rank0);
    return rc;
}

bool state_split_slot_name(const char *name, size_t *param_len)
{
    const char *slash = strrchr(name, '/');
    if (!slash || slash == name || !slash[1]) return false;
    *param_len = (size_t)(slash - name);
    return true;
}

bool state_is_optimizer_file(const char *base)
{
    if (!strcmp(base, "optimizer.safetensors")) return true;
    unsigned i, n;
    int end = 0;
    return sscanf(base, "optimizer-%5u-of-%5u.safetensors%n", &i, &n, &end) == 2 && end > 0 &&
           !base[end] && strlen(base) == strlen("optimizer-00001-of-00002.safetensors");
}

/* Sorted distinct dtypes of tensors, as a JSON array of names. */
static json_t *dtype_names(plan_tensor *const *t, size_t n)
{
    bool seen[CKPT_DT_COUNT] = {false};
    for (size_t i = 0; i < n; i++) seen[t[i]->dtype] = true;
    json_t *a = json_array();
    for (int d = 0; a && d < CKPT_DT_COUNT; d++)
        if (seen[d]) json_array_append_new(a, json_string(ckpt_dtype_name((ckpt_dtype)d)));
    return a;
}

int state_write_side_files(const char *dir, char *const *slot_names, size_t nslot_names, json_t *scalars, json_t *left_out,
                           int64_t step, plan_tensor *const *model, size_t nmodel, plan_tensor *const *slots, size_t nslots)
{
    bool adam = nslot_names == 2 && !strcmp(slot_names[0], "exp_avg") && !strcmp(slot_names[1], "exp_avg_sq");
    json_t *names = json_array();
    for (size_t i = 0; names && i < nslot_names; i++) json_array_append_new(names, json_string(slot_names[i]));
    json_t *opt = json_pack("{s:s,s:{},s:o,s:O}", "name", adam ? "adam" : "torch", "hyperparameters", "slots", names, "scalars",
                            scalars);
    /* what could not be mapped is kept with the state, not only said on stderr */
    if (opt && left_out && json_array_size(left_out) && json_object_set(opt, "left_out", left_out)) {
        json_decref(opt);
        opt = NULL;
    }
    time_t now = time(NULL);
    struct tm tm;
    char ts[32] = "1970-01-01T00:00:00Z";
    if (gmtime_r(&now, &tm)) strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_t *dtypes = json_pack("{s:o,s:o}", "model", dtype_names(model, nmodel), "optimizer", dtype_names(slots, nslots));
    json_t *meta = json_pack("{s:s,s:i,s:I,s:s,s:b,s:o}", "format", CKPT_STATE_FORMAT, "version", CKPT_STATE_VERSION, "step",
                             (json_int_t)step, "timestamp", ts, "has_optimizer_state", 1, "dtypes", dtypes);
    char *po = ckpt_path_join(dir, STATE_OPTIMIZER_FILE), *pm = ckpt_path_join(dir, STATE_METADATA_FILE);
    int rc = po && pm && opt && meta ? 0 : CKPT_ENOMEM;
    if (!rc) rc = cj_write_file(po, opt);
    if (!rc) rc = cj_write_file(pm, meta);
    free(po);
    free(pm);
    json_decref(opt);
    json_decref(meta);
    return rc;
}

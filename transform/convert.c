/* convert.c — plan a conversion from headers and config.json, then write it (see convert.h). */
#include "transform/convert.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/interrupt.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "transform/layout_meta.h"
#include "transform/lora_plan.h"
#include "transform/presets.h"
#include "transform/state_convert.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A torch view (st_tensor.view): the tensor has the view's shape and its
 * one part walks the stored block with the view's axis map, so the executor
 * makes the .contiguous() copy in tiles (executor.h). */
static void convert_view_part(plan_tensor *t, const st_tensor *st)
{
    if (!st->view || !t->nparts) return;
    memcpy(t->shape, st->shape, (size_t)st->ndim * sizeof t->shape[0]);
    plan_part *p = &t->parts[0];
    for (int k = 0; k < st->ndim; k++) {
        p->axis_map[k] = st->view_axes[k];
        p->ext[k] = st->shape[k];
    }
}

/* The names a torch file tied to this tensor (torch.h keeps them as file
 * metadata {removed: kept}) travel with it as meta "tied_names", so the
 * output file holding it says {removed: new name}, as convert.py writes. */
static int convert_note_tied(plan_tensor *t, const ckpt_checkpoint *c, const ckpt_tensor_ref *ref)
{
    const st_file *f = &c->files[ref->file];
    json_t *list = NULL;
    for (size_t m = 0; f->from_torch && m < f->nmeta; m++) {
        if (strcmp(f->meta_vals[m], ref->t->name)) continue;
        if (!list && !(list = json_array())) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
        if (json_array_append_new(list, json_string(f->meta_keys[m]))) {
            json_decref(list);
            return ckpt_error_set(CKPT_ENOMEM, "out of memory");
        }
    }
    if (!list) return 0;
    if ((!t->meta && !(t->meta = json_object())) || json_object_set_new(t->meta, "tied_names", list))
        return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    return 0;
}

/* --lora ADAPTER [--lora-scale S]: {"op": "lora_merge", ...} before the other rules. */
static int prepend_lora(json_t *doc, const convert_opts *o)
{
    json_t *list = json_object_get(doc, "rules");
    if (!o->lora || !json_is_array(list)) return 0;
    char *abs = realpath(o->lora, NULL);
    json_t *r = json_pack("{s:s,s:s}", "op", "lora_merge", "adapter", abs ? abs : o->lora);
    free(abs);
    if (r && o->lora_scale != 0) json_object_set_new(r, "scale", json_real(o->lora_scale));
    if (!r || json_array_insert_new(list, 0, r)) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    return 0;
}

static int build_rules(convert_plan *cp, const convert_opts *o)
{
    const char *what = o->rules_file;
    int rc;
    if (o->rules_doc) {
        what = "generated rules";
        rc = (cp->rules_json = json_deep_copy(o->rules_doc)) ? 0 : ckpt_error_set(CKPT_ENOMEM, "out of memory");
    } else if (o->rules_file) {
        rc = cj_load_file(&cp->rules_json, o->rules_file, RULES_MAX_BYTES);
    } else {
        if (!o->layout)
            return ckpt_error_set(CKPT_EINVAL, "no layout given (--layout neuron|fused|easydel|hf|vllm, or --rules FILE)");
        preset_opts po = {.preset = o->layout, .tp = o->tp > 0 ? o->tp : 1, .kv_size_multiplier = o->kv_size_multiplier,
                          .dtype = o->dtype};
        rc = preset_rules(&cp->rules_json, cp->config, &po, "config.json");
        what = "preset rules";
    }
    if (!rc) rc = prepend_lora(cp->rules_json, o);
    return rc ? rc : rules_parse(&cp->rules, cp->rules_json, what);
}

static int build_folders(convert_plan *cp, uint64_t max_shard)
{
    int tp = cp->tp;
    const char *rank_files = cp->rules.rank_files;
    if (rank_files && cp->state)
        return ckpt_error_set(CKPT_EINVAL, "layout '%s' names its files '%s' and holds weights only: convert the "
                                           "training state's model without its optimizer files",
                              cp->layout_name, rank_files);
    cp->nfolders = (size_t)tp;
    cp->folder_dirs = ckpt_calloc((size_t)tp, sizeof *cp->folder_dirs);
    cp->index_texts = ckpt_calloc((size_t)tp, sizeof *cp->index_texts);
    cp->folder_files = ckpt_calloc((size_t)tp + 1, sizeof *cp->folder_files);
    plan_tensor **list = ckpt_calloc(cp->set.n + 1, sizeof *list);
    int rc = cp->folder_dirs && cp->index_texts && cp->folder_files && list ? 0 : CKPT_ENOMEM;
    for (int r = 0; !rc && r < tp; r++) {
        size_t n = 0, nparams = cp->set.n - state_plan_nslots(cp);
        for (size_t i = 0; i < nparams; i++)
            if (cp->set.t[i].rank == PLAN_ALL_RANKS || cp->set.t[i].rank == r) list[n++] = &cp->set.t[i];
        cp->folder_files[r] = cp->exec.nfiles;
        /* rank_files (vLLM): every rank's files in DST itself, named by the pattern */
        cp->folder_dirs[r] = tp > 1 && !rank_files ? ckpt_sprintf("tp_rank_%02d", r) : ckpt_strdup("");
        if (!cp->folder_dirs[r]) rc = CKPT_ENOMEM;
        /* a sharded .bin to hf, no --max-shard-size: the files Hugging Face's conversion writes */
        bool follow = tp == 1 && !rank_files && !max_shard && !cp->state && !strcmp(cp->layout_name, "hf") &&
                      cp->src.nfiles > 1 && cp->src.files[0].from_torch && cp->index_text;
        if (!rc && follow)
            rc = convert_layout_follow_files(&cp->exec, list, n, &cp->src, cp->index_text, &cp->index_texts[r]);
        else if (!rc && rank_files)
            rc = convert_layout_rank_files(&cp->exec, rank_files, r, list, n,
                                           max_shard ? max_shard : CONVERT_RANK_FILES_DEFAULT_SIZE);
        else if (!rc)
            rc = convert_layout_folder(&cp->exec, cp->folder_dirs[r], list, n,
                                       max_shard ? max_shard : CONVERT_DEFAULT_SHARD_SIZE, &cp->index_texts[r]);
        if (!rc) rc = state_plan_layout_folder(cp, (size_t)r, max_shard ? max_shard : CONVERT_DEFAULT_SHARD_SIZE);
        cp->folder_files[r + 1] = cp->exec.nfiles;
    }
    free(list);
    return rc;
}

int convert_plan_build_from(convert_plan *cp, ckpt_checkpoint *src, const char *src_dir, json_t *config,
                            const char *index_name, const char *index_text, const convert_opts *o)
{
    memset(cp, 0, sizeof *cp);
    cp->src = *src;
    memset(src, 0, sizeof *src);
    cp->config = config;
    cp->src_dir = ckpt_strdup(src_dir);
    int rc = cp->src_dir ? 0 : CKPT_ENOMEM;
    if (!rc && index_text) {
        cp->index_name = ckpt_strdup(index_name);
        cp->index_text = ckpt_strdup(index_text);
        if (!cp->index_name || !cp->index_text) rc = CKPT_ENOMEM;
    }
    if (!rc) rc = build_rules(cp, o);
    size_t first = 0;
    if (!rc) rc = convert_add_sources(&cp->exec, &cp->src, &first);
    if (!rc) rc = state_plan_init(cp);
    for (size_t i = 0; !rc && i < cp->exec.nsources; i++) {
        if (state_plan_is_slot_source(cp, i)) continue; /* optimizer slots follow their parameters below */
        plan_tensor t;
        rc = plan_tensor_from_source(&t, &cp->exec.sources[i], (int32_t)i);
        if (!rc && i >= first && i - first < cp->src.ntensors) {
            convert_view_part(&t, cp->src.tensors[i - first].t);
            rc = convert_note_tied(&t, &cp->src, &cp->src.tensors[i - first]);
            if (rc) plan_tensor_free(&t);
        }
        if (!rc) rc = plan_set_push(&cp->set, &t);
    }
    if (!rc) rc = rules_apply(&cp->rules, &cp->set, &cp->result);
    if (!rc) rc = lora_plan_derive(cp); /* lora_merge: merged weights become computed sources */
    for (size_t i = 0; !rc && i < cp->set.n; i++) plan_tensor_coalesce(&cp->set.t[i]);
    if (!rc) rc = state_plan_add_slots(cp);
    if (!rc) {
        cp->tp = cp->rules.tp;
        for (size_t i = 0; i < cp->set.n && !rc; i++) {
            int r = cp->set.t[i].rank;
            if (r != PLAN_ALL_RANKS && r >= cp->tp)
                rc = ckpt_error_set(CKPT_EINVAL, "tensor '%s' is split for rank %d but the layout has tp %d",
                                    cp->set.t[i].name, r, cp->tp);
        }
    }
    if (!rc && !(cp->layout_name = ckpt_strdup(cp->rules.layout))) rc = CKPT_ENOMEM;
    if (!rc && !o->no_files) rc = build_folders(cp, o->max_shard_size); /* 0: the layout's default */
    if (rc) convert_plan_free(cp);
    return rc;
}

int convert_plan_build(convert_plan *cp, const char *src, const convert_opts *o)
{
    ckpt_checkpoint c;
    memset(cp, 0, sizeof *cp);
    int rc = state_checkpoint_open(&c, src); /* a training state: model and optimizer files */
    if (rc) return rc;
    json_t *config = NULL;
    char *cfg_path = ckpt_path_join(c.dir, "config.json"), *index_text = NULL;
    if (!cfg_path) rc = CKPT_ENOMEM;
    else if (ckpt_exists(cfg_path)) rc = cj_load_file(&config, cfg_path, CONVERT_CONFIG_MAX_BYTES);
    free(cfg_path);
    if (!rc && c.index_path) rc = ckpt_read_file(c.index_path, CKPT_INDEX_MAX_BYTES, &index_text, NULL);
    char *dir = rc ? NULL : ckpt_strdup(c.dir);
    if (!rc && !dir) rc = CKPT_ENOMEM;
    if (rc) {
        json_decref(config);
        ckpt_checkpoint_close(&c);
        return rc;
    }
    const char *index_name = c.index_path ? ckpt_basename(c.index_path) : NULL;
    char *name_copy = index_name ? ckpt_strdup(index_name) : NULL;
    rc = convert_plan_build_from(cp, &c, dir, config, name_copy, index_text, o);
    free(name_copy);
    free(index_text);
    free(dir);
    return rc;
}

json_t *convert_plan_json(const convert_plan *cp, bool with_parts)
{
    return layout_meta_build(cp, NULL, with_parts);
}

void convert_plan_free(convert_plan *cp)
{
    state_plan_free(cp);
    ckpt_checkpoint_close(&cp->src);
    free(cp->src_dir);
    json_decref(cp->config);
    lora_plan_free(cp);
    rules_result_free(&cp->result);
    json_decref(cp->rules_json);
    rules_free(&cp->rules);
    plan_set_free(&cp->set);
    exec_plan_free(&cp->exec);
    free(cp->layout_name);
    free(cp->index_name);
    free(cp->index_text);
    for (size_t i = 0; i < cp->nfolders; i++) {
        free(cp->folder_dirs ? cp->folder_dirs[i] : NULL);
        free(cp->index_texts ? cp->index_texts[i] : NULL);
    }
    free(cp->folder_dirs);
    free(cp->index_texts);
    free(cp->folder_files);
    memset(cp, 0, sizeof *cp);
}

/* Writes each folder's index file and fsyncs the folders. */
static int write_indexes(const convert_plan *cp, const char *tmp)
{
    for (size_t r = 0; r < cp->nfolders; r++) {
        char *dir = *cp->folder_dirs[r] ? ckpt_path_join(tmp, cp->folder_dirs[r]) : ckpt_strdup(tmp);
        if (!dir) return CKPT_ENOMEM;
        int rc = ckpt_mkdir_p(dir, 0755);
        if (!rc && cp->index_texts[r]) {
            char *path = ckpt_path_join(dir, "model.safetensors.index.json");
            rc = path ? ckpt_write_file_atomic(path, cp->index_texts[r], strlen(cp->index_texts[r])) : CKPT_ENOMEM;
            free(path);
        }
        if (!rc) rc = ckpt_fsync_dir(dir);
        free(dir);
        if (rc) return rc;
    }
    return 0;
}

int convert_write(convert_plan *cp, const char *dst, const convert_opts *o)
{
    char *tmp = NULL;
    int rc = outdir_prepare(dst, o->force, &tmp);
    if (rc) return rc;
    char(*hashes)[65] = ckpt_calloc(cp->exec.nsrc_paths + 1, sizeof *hashes);
    if (!hashes) rc = CKPT_ENOMEM;
    /* The checkpoint's own files come first; a LoRA staging file or optimizer files after them are not hashed. */
    exec_opts eo = {.threads = o->threads, .hash_sources = !o->no_hash, .hash_count = cp->src.nfiles,
                    .source_sha256 = hashes, .quiet = o->quiet, .label = "convert", .direct = o->direct,
                    .largest_first = o->largest_first};
    if (!rc) rc = lora_plan_compute(cp, tmp, o);
    if (!rc) rc = exec_run(&cp->exec, tmp, &eo);
    exec_trace("convert: written");
    if (!rc) rc = lora_plan_finish(cp);
    if (!rc) rc = write_indexes(cp, tmp);
    if (!rc) rc = state_plan_write(cp, tmp);
    if (!rc) rc = outdir_copy_side_files(cp->src_dir, tmp);
    json_t *meta = rc || o->no_layout_file ? NULL : layout_meta_build(cp, o->no_hash ? NULL : hashes, true);
    if (!rc && !meta && !o->no_layout_file) rc = CKPT_ENOMEM;
    if (!rc && meta) {
        char *path = ckpt_path_join(tmp, CONVERT_LAYOUT_FILE);
        rc = path ? cj_write_file(path, meta) : CKPT_ENOMEM;
        free(path);
    }
    json_decref(meta);
    free(hashes);
    if (!rc) rc = ckpt_fsync_dir(tmp);
    if (!rc) rc = outdir_commit(tmp, dst, o->force);
    exec_trace("convert: committed");
    if (rc) ckpt_rm_rf(tmp);
    free(tmp);
    return rc;
}

/*
 * state_convert.h — training states through convert and consolidate.
 *
 * A state directory holds model files and optimizer files whose tensors are
 * "<param>/<slot>", shaped like their parameter. convert plans the model's
 * parameters with the layout's rules as for any checkpoint; then every output
 * tensor gets one twin per optimizer slot, named "<output>/<slot>", made of
 * the same parts with each source parameter P replaced by "P/<slot>". So
 * every rule applied to a parameter (fusing, GQA head selection, padding,
 * row/column slices, stacking, transposes, casts) applies to its slots in
 * exactly the same way. Twins are written to optimizer*.safetensors beside
 * the model files of their folder, and consolidation inverts them like any
 * output tensor (ckpt-layout.json lists them with their parts), rebuilding
 * the optimizer files and their index byte for byte.
 *
 * Rank folders of a converted state are states themselves: metadata.json,
 * optimizer.json and config.json are copied into each, so a tensor-parallel
 * job can load its rank's folder directly and save its own state there. When
 * such per-rank states are consolidated, metadata.json and optimizer.json
 * come from rank 0 (every rank must be at the same step).
 *
 * The hooks are called from convert.c, consolidate.c and layout_meta.c; on a
 * plain checkpoint (no optimizer files, no metadata.json) they do nothing.
 */
#ifndef CKPT_TRANSFORM_STATE_CONVERT_H
#define CKPT_TRANSFORM_STATE_CONVERT_H

#include "transform/convert.h"

#include <jansson.h>

struct state_plan {
    size_t nslots;      /* the last nslots tensors of cp->set are optimizer slot twins */
    bool is_state;      /* the source folder has a ckpt-state metadata.json */
    bool has_opt_files; /* the source has optimizer files beside its model files */
    size_t nfolders;
    char **opt_index_texts;   /* per output folder, NULL when the optimizer fits one file */
    char *src_opt_index_text; /* the source's optimizer.safetensors.index.json, or NULL */
};

/* Opens a checkpoint; a directory that also holds optimizer files
 * (optimizer.safetensors or its index) is opened as one checkpoint of model
 * and optimizer files (dir, path and index_path those of the model). */
int state_checkpoint_open(ckpt_checkpoint *c, const char *path);
/* One checkpoint of model's files then opt's (both are consumed, closed
 * empty, also on failure); the index path is the model's. */
int state_checkpoint_join(ckpt_checkpoint *c, const char *label, ckpt_checkpoint *model, ckpt_checkpoint *opt);

/* convert_plan_build_from: after the sources are known / after the rules ran. */
int state_plan_init(convert_plan *cp);
bool state_plan_is_slot_source(const convert_plan *cp, size_t source);
int state_plan_add_slots(convert_plan *cp);
size_t state_plan_nslots(const convert_plan *cp);
/* build_folders: lays out folder r's slot twins as optimizer files. */
int state_plan_layout_folder(convert_plan *cp, size_t r, uint64_t max_shard_size);
/* convert_write: optimizer indexes, and the state's side files in every rank folder. */
int state_plan_write(const convert_plan *cp, const char *tmp);
/* layout_meta_build: adds "state" (the optimizer index) to ckpt-layout.json. */
void state_plan_meta(const convert_plan *cp, json_t *root);
void state_plan_free(convert_plan *cp);

/* consolidate_run, after the side files are copied into tmp: the optimizer
 * index, and for per-rank states metadata.json / optimizer.json of rank 0
 * (checking every rank is at the same step). */
int state_consolidate_finish(const json_t *layout, const char *src, const char *tmp, int tp);

/* A state's names (state/state.c uses them too). */
#define STATE_METADATA_FILE "metadata.json"
#define STATE_OPTIMIZER_FILE "optimizer.json"
#define STATE_CONFIG_FILE "config.json"
#define STATE_JSON_MAX_BYTES (16u << 20) /* metadata.json, optimizer.json, config.json */
/* optimizer.json and metadata.json of a state consolidated from a training
 * save into dir (metadata.json last: a folder that has it has everything):
 * the optimizer "adam" when its slots are exactly exp_avg and exp_avg_sq, else
 * "torch"; its sorted slot names, scalars (owned by the caller), what could not
 * be mapped (left_out, an array, or NULL: kept in optimizer.json as
 * "left_out"), the step, and the dtypes of the model and slot tensors. */
int state_write_side_files(const char *dir, char *const *slot_names, size_t nslot_names, json_t *scalars, json_t *left_out,
                           int64_t step, plan_tensor *const *model, size_t nmodel, plan_tensor *const *slots, size_t nslots);
/* Splits "<param>/<slot>" at the last '/'; false when there is none. */
bool state_split_slot_name(const char *name, size_t *param_len);
/* True for "optimizer.safetensors" and "optimizer-0000i-of-0000n.safetensors" (a base name). */
bool state_is_optimizer_file(const char *base);

#endif

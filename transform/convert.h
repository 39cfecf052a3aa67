/*
 * convert.h — plan and run a conversion of a checkpoint directory into a
 * layout, and its inverse, consolidation.
 *
 *   convert_plan cp;
 *   if (convert_plan_build(&cp, "src/", &opts) < 0) ...   // headers + config.json only
 *   json_t *j = convert_plan_json(&cp, false);             // what `ckpt plan --json` prints
 *   if (convert_write(&cp, "dst/", &opts) < 0) ...         // streams bytes, DST appears complete
 *   convert_plan_free(&cp);
 *
 * Output directory: config.json and the other small files of the source
 * (tokenizer, generation config) copied, ckpt-layout.json (docs/transforms.md §7), and the
 * weights: in DST itself for tp 1, else in DST/tp_rank_00 .. tp_rank_{tp-1},
 * each model.safetensors or shards + model.safetensors.index.json. Everything
 * is written into DST.tmp-XXXXXX and renamed into place at the end; on any
 * failure the temporary directory is removed and DST is untouched.
 *
 * ckpt-layout.json records the source (files with sha256 and size, each
 * file's tensors and __metadata__, the index text), the rules, and for every
 * output tensor its parts, so consolidate_run() rebuilds the original files
 * byte for byte from the shards and this document alone.
 */
#ifndef CKPT_TRANSFORM_CONVERT_H
#define CKPT_TRANSFORM_CONVERT_H

#include "format/checkpoint.h"
#include "format/outdir.h"
#include "plan/executor.h"
#include "plan/plan.h"
#include "transform/rules.h"

#include <jansson.h>
#include <stdbool.h>

#define CONVERT_DEFAULT_SHARD_SIZE 5000000000ULL /* Hugging Face's "5GB" */
#define CONVERT_RANK_FILES_DEFAULT_SIZE (5ULL << 30) /* vLLM save_sharded_state.py --max-file-size: 5 GiB */
#define CONVERT_CONFIG_MAX_BYTES (16u << 20)
#define CONVERT_LAYOUT_MAX_BYTES (1u << 30)
#define CONVERT_LAYOUT_FILE OUTDIR_LAYOUT_FILE

typedef struct {
    const char *layout;     /* preset: neuron, fused, easydel, hf (ignored with rules_file) */
    const char *rules_file; /* a rules document instead of a preset */
    int tp;                 /* 0 or 1: no tensor parallelism */
    int64_t kv_size_multiplier;
    const char *dtype;       /* NULL: keep */
    uint64_t max_shard_size; /* 0: CONVERT_DEFAULT_SHARD_SIZE */
    int threads;             /* 0: 2 */
    bool force;              /* replace a non-empty DST */
    bool quiet;
    bool no_hash; /* do not hash the sources (sha256 left empty in the metadata) */
    bool no_layout_file; /* write no ckpt-layout.json (an import, not a layout to consolidate) */
    const char *lora;  /* merge this PEFT adapter first: a lora_merge rule put before the layout's */
    double lora_scale; /* its scale (0: 1) */
    const json_t *rules_doc; /* a rules document in memory instead of a preset (nxd_export.c) */
    bool no_files;           /* plan the output tensors only, no files: the caller lays them out (nxd_export.c) */
    bool direct;             /* write the tensors with O_DIRECT (exec_opts.direct): nothing reads them back */
    bool largest_first;      /* exec_opts.largest_first */
} convert_opts;

typedef struct {
    ckpt_checkpoint src;
    char *src_dir;
    json_t *config; /* NULL when the source has no config.json */
    json_t *rules_json;
    rules_doc rules;
    rules_result result;
    plan_set set; /* the output tensors */
    exec_plan exec;
    int tp;
    char *layout_name;
    char *index_name; /* the source's index file name and text, or NULL */
    char *index_text;
    size_t nfolders;
    char **folder_dirs;  /* "" or "tp_rank_03" */
    char **index_texts;  /* index JSON per folder, NULL when the folder has one file */
    size_t *folder_files; /* nfolders + 1 entries: folder r's files are exec.files[folder_files[r] .. folder_files[r+1]) */
    struct state_plan *state; /* a training state's optimizer slots (state_convert.h), or NULL */
    struct lora_plan *lora;   /* merged LoRA weights of lora_merge rules (lora_plan.h), or NULL */
} convert_plan;

int convert_plan_build(convert_plan *cp, const char *src, const convert_opts *o);
/* Plans from a checkpoint opened already (taken over, like config and the
 * index text, which may be NULL); src_dir is where side files come from. */
int convert_plan_build_from(convert_plan *cp, ckpt_checkpoint *src, const char *src_dir, json_t *config,
                            const char *index_name, const char *index_text, const convert_opts *o);
/* The plan as JSON: layout, files, and per tensor dtype, shape, parts (with_parts) and metadata. */
json_t *convert_plan_json(const convert_plan *cp, bool with_parts);
int convert_write(convert_plan *cp, const char *dst, const convert_opts *o);
void convert_plan_free(convert_plan *cp);

typedef struct {
    int threads;
    bool force;
    bool quiet;
    bool lossy; /* out: the layout used a narrowing cast, so bytes may differ */
    uint64_t max_shard_size;  /* NxD and PyTorch DCP sources: output shards (0: CONVERT_DEFAULT_SHARD_SIZE) */
    const char *strip_prefix; /* PyTorch DCP sources only: removed from names that start with it, or NULL */
    bool state;               /* PyTorch DCP sources only: a training state, optimizer slots included */
    /* The store's pull --consolidated: the layout folder's safetensors files
     * hold their headers only, and `stored` assembles each of their tensors
     * from the store's blobs (files named as in the folder); the parts are
     * composed over it and every file written is checked against the sha256
     * ckpt-layout.json records for its source file. NULL: the folder's bytes. */
    const exec_plan *stored;
    /* ckpt-layout.json of the folder, parsed already by the caller (the
     * store's pull checked it to choose `stored`; a many-tensor layout is
     * tens of MB of JSON, so it is parsed once), or NULL: read from it. */
    json_t *layout;
} consolidate_opts;

/* Whether a layout (ckpt-layout.json) can be consolidated from stored parts
 * (consolidate_opts.stored): lossless, weights only (no training state,
 * merged or converted LoRA), every source file a safetensors file whose
 * sha256 it records, the check of the result. */
bool consolidate_layout_composable(const json_t *layout);

/* Rebuilds the original checkpoint from a converted directory. */
int consolidate_run(const char *src, const char *dst, consolidate_opts *o);
/* What a folder is when it is a training save consolidate reads rather than
 * a checkpoint ("neuronx-distributed save", "PyTorch DCP save", "EasyDeL
 * save"), or NULL. */
const char *consolidate_save_kind(const char *dir);

/* convert_layout.c */
/* Adds a whole-checkpoint source list to p: every tensor of every file. */
int convert_add_sources(exec_plan *p, const ckpt_checkpoint *c, size_t *first_source);
/* Lays out one output folder: tensors (natural name order) split into shards
 * of max_shard_size; appends exec_files under `dir` ("" or "tp_rank_03") and
 * returns the index JSON text (NULL when one file) in *index_text. */
int convert_layout_folder(exec_plan *p, const char *dir, plan_tensor **tensors, size_t n, uint64_t max_shard_size,
                          char **index_text);
/* A rank's files of a rank_files layout (rules.h): in the output folder itself,
 * named by the pattern, split into parts as vLLM's ShardedStateLoader.save_model
 * does (max_size 0: one part), in natural name order, no index file. */
int convert_layout_rank_files(exec_plan *p, const char *rank_files, int rank, plan_tensor **tensors, size_t n,
                              uint64_t max_size);
/* The same with files named "<prefix>.safetensors" / "<prefix>-0000i-of-0000n.safetensors" ("optimizer"). */
/* The layout of Hugging Face's own .bin conversion (safetensors'
 * convert.py, convert_multi): each source file's tensors in one output file
 * named by its rename() ("pytorch_model-00001-of-00002.bin" ->
 * "model-00001-of-00002.safetensors"), and the source index with its file
 * names renamed as *index_text (its other keys kept, indent 4, key order kept). */
int convert_layout_follow_files(exec_plan *p, plan_tensor **tensors, size_t n, const ckpt_checkpoint *src,
                                const char *src_index_text, char **index_text);
int convert_layout_folder_prefix(exec_plan *p, const char *dir, const char *prefix, plan_tensor **tensors, size_t n,
                                 uint64_t max_shard_size, char **index_text);

#endif

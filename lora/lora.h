/*
 * lora.h — PEFT LoRA adapters: read one, merge it into a base checkpoint (or
 * take it out again) with OpenBLAS, and carry it into the layouts of
 * convert.h so it can be served or trained on a converted base unmerged.
 *
 * An adapter is a folder with adapter_config.json and adapter_model.safetensors
 * holding, for every adapted Linear `<module>` of the base,
 *   base_model.model.<module>.lora_A.weight  [r, in]
 *   base_model.model.<module>.lora_B.weight  [out, r]
 * Its update of `<module>.weight` W [out, in] is s * B @ A with
 * s = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora); with
 * fan_in_fan_out W is stored [in, out] and the update is (s * B @ A)^T.
 * rank_pattern and alpha_pattern override r and lora_alpha per module, with
 * PEFT's matching (an exact module name, else the first key K for which the
 * name matches `(.*\.)?(K)$`).
 *
 *   lora_adapter ad;
 *   if (lora_adapter_open(&ad, "adapter/") < 0) ...      // config + headers, checked
 *   if (lora_adapter_check_base(&ad, &base) < 0) ...      // every module against the base
 *   lora_adapter_free(&ad);
 *
 * Every field of adapter_config.json is known: the ones that change what the
 * update is (r, lora_alpha, use_rslora, fan_in_fan_out, target_modules,
 * rank_pattern, alpha_pattern) are read; ones that only matter to training
 * (lora_dropout, task_type, ...) are ignored; ones that would need more than
 * B @ A (use_dora, bias other than "none", modules_to_save, layer selection,
 * ...) must hold their neutral value; any other key is an error naming it,
 * so a newer PEFT feature is never silently merged wrong.
 *
 * Merging (lora_merge_run) writes DST with the files, tensor order, metadata
 * and index of the base: untouched tensors are copied with copy_file_range,
 * targeted weights are computed block by block of rows — the block read,
 * widened to F32, updated with cblas_sgemm (beta = 1), rounded back to the
 * weight's dtype to nearest-even, written. Blocks follow the segments of
 * B's nonzero structure, so a fused adapter's weight is computed with the
 * very GEMM calls of its members' merges and gives their bytes; rows where
 * B is zero are copied as they are (lora_merge.c). Two threads (OpenBLAS itself held
 * to one thread each) take blocks from a shared queue, consecutive blocks
 * from different shard files (a buffered write holds its file's lock), so
 * memory is about threads x 2 x LORA_BLOCK_BYTES plus the A and B of the
 * modules in flight, whatever the checkpoint. DST appears complete or not at
 * all (format/outdir.h).
 *
 * The same engine merges without the files around it (lora_merge_targets):
 * the lora_merge rule of `ckpt convert` computes merged weights into a
 * staging file that the layout then slices and fuses (transform/rule_lora.c,
 * transform/lora_plan.h), and the store's merge-lora job computes them straight into
 * blobs (store_lora.h).
 *
 * Converting (lora_convert_run) plans the base's layout first, from headers
 * and config.json only, and makes the adapter follow it part by part, so
 * every layout that slices, pads and fuses [out, in] weights carries
 * adapters exactly (transform/lora_layout.c explains how; declared in
 * transform/lora_plan.h). ckpt-layout.json records the
 * parts, so `ckpt consolidate` restores the adapter byte for byte.
 */
#ifndef CKPT_LORA_LORA_H
#define CKPT_LORA_LORA_H

#include "format/checkpoint.h"
#include "format/outdir.h"
#include "format/safetensors.h"
#include "plan/plan.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define LORA_CONFIG_FILE "adapter_config.json"
#define LORA_WEIGHTS_PREFIX "adapter_model" /* adapter_model.safetensors */
#define LORA_NAME_PREFIX "base_model.model."
#define LORA_CONFIG_MAX_BYTES (16u << 20)
#define LORA_MAX_RANK 65536
#define LORA_BLOCK_BYTES (4u << 20) /* F32 bytes of one block of rows */
#define LORA_MAX_THREADS 64

typedef struct {
    char *module;             /* "model.layers.0.self_attn.q_proj" */
    const st_tensor *a, *b;   /* lora_A [r, in], lora_B [out, r] in the adapter file */
    int32_t a_index, b_index; /* positions in the adapter checkpoint's sorted tensor list */
    uint64_t rank;            /* r of this module (rank_pattern or r) */
    double alpha;             /* lora_alpha of this module (alpha_pattern or lora_alpha) */
    double scale;             /* alpha / r, or alpha / sqrt(r) */
} lora_module;

typedef struct lora_adapter {
    char *dir;
    char *config_text; /* adapter_config.json as read */
    json_t *config;
    int64_t r;
    double alpha;
    bool rslora, fan_in_fan_out;
    json_t *targets;    /* target_modules: array of names or a regex string */
    ckpt_checkpoint ck; /* adapter_model.safetensors */
    lora_module *mods;  /* sorted by module name */
    size_t nmods;
} lora_adapter;

int lora_adapter_open(lora_adapter *a, const char *dir);
void lora_adapter_free(lora_adapter *a);
/* The module named `module` or NULL. */
const lora_module *lora_adapter_find(const lora_adapter *a, const char *module);
/* True when target_modules names `module` (PEFT's rule: an exact name or a
 * ".name" suffix for a list, a full match for a regex string). */
bool lora_adapter_targets(const lora_adapter *a, const char *module);
/* Checks the adapter against a base: every module's <module>.weight exists, is
 * a 2-D float tensor, and has the shape A and B imply; every target_modules
 * entry names at least one base module; every base module it names has
 * adapter weights. Errors name the module, the tensors and their shapes. */
int lora_adapter_check_base(const lora_adapter *a, const ckpt_checkpoint *base);
/* Checks one base weight (name, dtype, shape) against module m: a float
 * dtype to merge into (F32, BF16, F16) and the shape lora_A and lora_B imply
 * ([out, in], or [in, out] with fan_in_fan_out). The error names both. */
int lora_check_weight(const lora_adapter *a, const lora_module *m, const char *name, ckpt_dtype dtype, int ndim,
                      const uint64_t *shape);

/* ---- merge (lora_merge.c) ---- */

typedef struct {
    double scale; /* multiplies every module's s (--scale); 0 means 1 */
    bool unmerge; /* subtract the update instead of adding it */
    int threads;  /* 0: 2 */
    bool force;   /* replace a non-empty DST */
    bool quiet;
} lora_merge_opts;

typedef struct {
    size_t modules;      /* weights updated */
    size_t copied;       /* tensors copied unchanged */
    uint64_t bytes;      /* tensor bytes written */
    double gflop;        /* 2 * rows * in * K over the GEMMs (a dense B: 2 * out * in * r), in 1e9 */
    double gemm_seconds; /* time inside cblas_sgemm, summed over threads */
    double seconds;      /* wall time of the whole merge */
    double work_seconds; /* of which reading, computing and writing blocks */
    double sync_seconds; /* of which fsync and the final rename */
} lora_merge_stats;

int lora_merge_run(const char *base, const char *adapter, const char *dst, const lora_merge_opts *o,
                   lora_merge_stats *stats);

/* The layout merge-lora gives the output file of base file sf: its tensors
 * and __metadata__ in a header rendered by st_layout (so a stored merge, or
 * one from a header alone, has the bytes of an offline one). */
int lora_merge_layout(st_layout *l, const st_file *sf);

/* One weight merged from wherever it is to wherever it goes: the rows x cols
 * tensor of `dtype` at byte src_off of src_fd is read, updated by module m
 * and written at dst_off of dst_fd (which may be the same file, never the
 * same bytes). The shape must be the one lora_check_weight accepted. */
typedef struct {
    const lora_module *m;
    ckpt_dtype dtype;
    uint64_t rows, cols;
    int src_fd;
    uint64_t src_off;
    const char *src_path; /* for messages */
    int dst_fd;
    uint64_t dst_off;
    const char *dst_path;
} lora_merge_target;

/* The engine of lora_merge_run without the files around it: merges n
 * targets of adapter ad (o->scale, o->unmerge, o->threads, o->quiet; force is
 * ignored), block by block with bounded memory, and fills stats (modules,
 * bytes, gflop, gemm and wall seconds). Used by the lora_merge rule
 * (transform/rule_lora.c, transform/lora_plan.c) and the store's merge-lora job (store_lora.c). */
int lora_merge_targets(const lora_adapter *ad, const lora_merge_target *t, size_t n, const lora_merge_opts *o,
                       lora_merge_stats *stats);

#endif

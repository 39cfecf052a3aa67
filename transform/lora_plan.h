/*
 * lora_plan.h — merged LoRA weights as computed sources of a conversion plan
 * (the lora_merge rule, docs/rules.md).
 *
 * A lora_merge rule only records which source tensors it changes
 * (rules_result.merges). After the rules ran, lora_plan_derive gives each
 * such tensor a computed source: a new plan_source with the same name, dtype
 * and shape whose bytes live in a staging file, and points every part that
 * read the original at it. Later rules have already sliced, fused and padded
 * those parts, so the executor moves merged bytes exactly where it would
 * have moved the original ones, and ckpt-layout.json names the same source
 * tensors (consolidate gives the merged checkpoint in the original layout).
 * Two lora_merge rules on one weight chain: the second reads the first's
 * result.
 *
 *   convert_plan_build_from: rules_apply, then lora_plan_derive
 *   convert_write:           lora_plan_compute(cp, tmp)  (before exec_run)
 *                            exec_run
 *                            lora_plan_finish(cp)        (removes the staging file)
 *   layout_meta_build:       lora_plan_meta(cp)          ("lora_merge" in ckpt-layout.json)
 *
 * The staging file ".lora-merged" sits in the output's temporary directory
 * (so it goes with it on failure) and holds every merged weight once, in
 * its own dtype; it is computed by lora_merge_targets (blocked F32 sgemm,
 * bounded memory) and removed before DST is committed.
 */
#ifndef CKPT_TRANSFORM_LORA_PLAN_H
#define CKPT_TRANSFORM_LORA_PLAN_H

#include "lora/lora.h"
#include "transform/convert.h"

#define LORA_STAGING_FILE ".lora-merged"

struct lora_plan {
    size_t nsteps;
    struct lora_step {
        const rules_merge *merge;
        int32_t in, out; /* sources: the weight before and after this merge */
    } * steps;
    size_t staging_file; /* index into exec.src_paths */
    uint64_t staging_size;
    char *staging_path; /* while convert_write runs */
    json_t *meta;       /* the "lora_merge" list of ckpt-layout.json */
};

/* Does nothing without lora_merge rules. Checks each adapter against the
 * whole source (lora_adapter_check_base) and each merged weight against the
 * source tensor it replaces. */
int lora_plan_derive(convert_plan *cp);
/* Computes the merged weights into tmp/.lora-merged; with hash, records the
 * sha256 of the adapters' files in the metadata. */
int lora_plan_compute(convert_plan *cp, const char *tmp, const convert_opts *o);
/* Removes the staging file. */
int lora_plan_finish(convert_plan *cp);
/* The "lora_merge" list for ckpt-layout.json (a new reference), or NULL. */
json_t *lora_plan_meta(const convert_plan *cp);
void lora_plan_free(convert_plan *cp);

/* ---- adapters in layouts (lora_layout.c) ---- */

/* Converts the adapter into the layout `o` describes for base (a Hugging
 * Face checkpoint folder with config.json). o->dtype must be NULL. */
int lora_convert_run(const char *adapter, const char *base, const char *dst, const convert_opts *o);
/* Consolidation hooks (consolidate.c): whether a ckpt-layout.json describes
 * a converted adapter (its rank folders hold adapter_model.safetensors), and
 * after the side files are copied, writing back the original
 * adapter_config.json it records. Both do nothing for other layouts. */
bool lora_layout_is_adapter(const json_t *layout);
int lora_consolidate_finish(const json_t *layout, const char *tmp);

#endif

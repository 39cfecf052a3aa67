/*
 * rules.h — transform rules as data (docs/rules.md documents the format).
 *
 * A rules document:
 *   {"format": "ckpt-rules", "version": 1, "layout": "neuron-tp8", "tp": 8,
 *    "rules": [ {"op": "rename", "pattern": "^(.*)\\.w1\\.weight$", "replacement": "$1.gate.weight"}, ... ]}
 *
 * Ops: rename, drop, cast, transpose, tp_split, fuse, stack_experts,
 * unstack_experts, fuse_qkv_gqa, lora_merge. Each applies, in order, to the
 * tensors of the working set whose current name its PCRE2 `pattern` matches. rename
 * rewrites every match in the name ($1.. in the replacement); ops that build
 * one tensor from several name it with `output`, a template expanded from the
 * captures of the matched name. Semantics: docs/transforms.md.
 *
 * rules_parse() checks the whole document (unknown ops or fields, bad
 * regexes, bad numbers) before anything runs; rules_apply() raises every
 * error about tensors (missing partner, gap in expert numbers, heads that
 * cannot be split, shapes that do not match) before a byte is written, each
 * naming the rule ("rule 3 (fuse)") and the tensor.
 */
#ifndef CKPT_TRANSFORM_RULES_H
#define CKPT_TRANSFORM_RULES_H

#include "plan/plan.h"

#include <jansson.h>
#include <stdbool.h>

#define RULES_MAX 100000
#define RULES_MAX_BYTES (64u << 20)

typedef struct rule rule;

typedef struct {
    char *layout; /* name of the layout these rules produce, e.g. "neuron-tp8" */
    int tp;       /* tensor-parallel size of the output (1: no rank folders) */
    /* "rank_files": every rank's files in the output folder itself, named by
     * this pattern ("model-rank-{rank}-part-{part}.safetensors", vLLM's
     * ShardedStateLoader), instead of tp_rank_NN folders; NULL when absent. */
    char *rank_files;
    size_t n;
    rule *rules;
    json_t *doc; /* the document as given (kept for ckpt-layout.json) */
} rules_doc;

/* A rank_files pattern: {rank} and {part} once each, ends in .safetensors, no '/'. */
bool rules_rank_files_valid(const char *pattern);
/* The pattern with {rank} and {part} replaced by the decimal numbers. malloc'd. */
char *rules_rank_file_name(const char *pattern, int rank, size_t part);

/* Parses and checks a rules document (steals nothing; keeps a reference). */
int rules_parse(rules_doc *d, json_t *doc, const char *what);
int rules_load_file(rules_doc *d, const char *path);
void rules_free(rules_doc *d);

struct lora_adapter;

/* What a lora_merge rule did to one source tensor: its bytes are to become
 * W +- scale * s * B @ A of module `module` of `adapter`, W being its bytes
 * so far (an earlier lora_merge may have changed them already). The planner
 * turns each into a computed source (lora_plan.h); nothing is read here. */
typedef struct {
    size_t rule;                       /* the rule's number */
    int32_t src;                       /* the source tensor (index into the plan's sources) */
    const struct lora_adapter *adapter; /* owned by the rule */
    size_t module;                     /* index into adapter->mods */
    double scale;                      /* the rule's scale */
    bool unmerge;
    char *tensor;                      /* its name when the rule applied */
    ckpt_dtype dtype;                  /* its dtype and shape then */
    int ndim;
    uint64_t shape[PLAN_MAX_DIM];
} rules_merge;

typedef struct {
    bool lossy; /* a narrowing cast was applied */
    size_t nmerges, merges_cap;
    rules_merge *merges; /* lora_merge rules, in the order they applied */
} rules_result;

/* Applies every rule in order to the working set. On error the set is left
 * in an unspecified but freeable state. res is reset first; free it with
 * rules_result_free. */
int rules_apply(const rules_doc *d, plan_set *set, rules_result *res);
void rules_result_free(rules_result *res);

#endif

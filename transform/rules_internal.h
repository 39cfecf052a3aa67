/*
 * rules_internal.h — what the rule ops share (rules.c holds parsing and the
 * simple ops, rule_gqa.c the attention fusion of docs/transforms.md §4). Not a public API.
 */
#ifndef CKPT_WORKERS_RULES_INTERNAL_H
#define CKPT_WORKERS_RULES_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "transform/rules.h"

#include <pcre2.h>

#define RULE_NAME_MAX 4096
#define RULE_MATCH_LIMIT 1000000
#define RULE_MAX_EXPERTS 65536
#define RULE_MAX_MEMBERS 64
#define RULES_NOPS 10

typedef enum {
    OP_RENAME,
    OP_DROP,
    OP_CAST,
    OP_TRANSPOSE,
    OP_TP_SPLIT,
    OP_FUSE,
    OP_STACK_EXPERTS,
    OP_UNSTACK_EXPERTS,
    OP_FUSE_QKV_GQA,
    OP_LORA_MERGE,
} rule_op;

extern const char *const rules_op_names[RULES_NOPS];

struct rule {
    rule_op op;
    size_t index; /* 1-based, for messages */
    json_t *json;
    pcre2_code *re;
    const char *pattern;
    const char *replacement; /* rename, transpose; output template otherwise */
    ckpt_dtype dtype;
    int64_t axis, tp, pad_multiple, stride, group, num_experts;
    int64_t dims[2];
    bool transpose_last2, fused, pad_heads, has_pattern;
    size_t nmembers;
    const char *members[RULE_MAX_MEMBERS];
    /* fuse_qkv_gqa */
    const char *q, *k, *v, *o, *weight_name, *bias_name;
    int64_t heads, kv_heads, head_dim, kv_mult;
    /* lora_merge: the adapter, opened when the rule is parsed (lora.h) */
    const char *adapter_path;
    struct lora_adapter *adapter;
    double lora_scale;
    bool unmerge;
};

typedef struct {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
} matcher;

/* "rule N (op): <message>" */
int rule_err(const rule *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int matcher_init(matcher *m, const rule *r);
void matcher_free(matcher *m);
/* 1 on match, 0 on none, <0 on error. */
int rule_match(const rule *r, matcher *m, const char *name);
/* Capture group g of the last match, malloc'd (NULL, error set, if unset). */
char *rule_group(const rule *r, matcher *m, const char *name, int64_t g);
/* The rule as JSON plus its number, for a tensor's "transforms" list. */
json_t *rule_desc(const rule *r);
int set_meta(plan_tensor *t, const char *key, json_t *v);
/* Records tensor_model_parallel, partition_dim/stride, num_partitions, padding. */
int note_partition(plan_tensor *t, int axis, int64_t stride, int64_t tp, uint64_t len, uint64_t padded);
int require_unsharded(const rule *r, const plan_tensor *t);
int require_byte_dtype(const rule *r, const plan_tensor *t);
int resolve_axis(const rule *r, const plan_tensor *t, int64_t axis, int *out);
/* Pads `axis` to a multiple of pad_multiple and cuts tp rank tensors (docs/transforms.md §5). */
int split_for_ranks(const rule *r, const plan_tensor *t, int axis, int64_t tp, int64_t pad_multiple,
                    int64_t stride, plan_tensor *out, uint64_t *padded_len);
/* Drops the first n0 tensors flagged in gone (tensors an op consumed). */
int rules_remove_consumed(plan_set *s, const bool *gone, size_t n0);
/* Fails when two tensors of one rank share a name. */
int rules_check_unique(const rule *r, const plan_set *s);

int apply_fuse_qkv_gqa(const rule *r, plan_set *s);
/* lora_merge (rule_lora.c) */
int parse_lora_merge(rule *r);
void free_lora_merge(rule *r);
int apply_lora_merge(const rule *r, plan_set *s, rules_result *res);

#endif

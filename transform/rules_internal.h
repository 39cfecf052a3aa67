/*
 * rules_internal.h — what the rule ops share. rules.c holds the op table
 * and the loops over a document; rule_core.c the helpers below; each op is
 * a parse_<op> and a rule_apply_<op> in rule_basic.c (rename, drop, cast,
 * transpose, tp_split), rule_fuse.c (fuse, stack/unstack_experts),
 * rule_gqa.c (fuse_qkv_gqa) or rule_lora.c (lora_merge). Not a public API.
 */
#ifndef CKPT_TRANSFORM_RULES_INTERNAL_H
#define CKPT_TRANSFORM_RULES_INTERNAL_H

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

/* One row of the op table (rules.c). */
typedef struct rule_op_def {
    const char *name;
    const char *fields[16]; /* what the op takes besides "op", "pattern", "comment" (a typo is an error) */
    bool pattern_optional;  /* without "pattern" the op applies to every tensor */
    int (*parse)(rule *r, int doc_tp);                          /* the op's fields into *r */
    int (*apply)(const rule *r, plan_set *s, rules_result *res); /* the op on the working set */
    void (*free)(rule *r);                                      /* what parse allocated, or NULL */
} rule_op_def;

extern const rule_op_def rule_ops[RULES_NOPS];

struct rule {
    rule_op op;
    const rule_op_def *def; /* rule_ops[op] */
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
    bool kv_adjacent; /* kv_order "adjacent": the m copies of a KV head on adjacent ranks (vLLM) */
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
/* Removes the tensors flagged in gone (one flag per tensor of the set). */
void rules_remove_flagged(plan_set *s, const bool *gone);
/* Drops the first n0 tensors flagged in gone (tensors an op consumed). */
int rules_remove_consumed(plan_set *s, const bool *gone, size_t n0);
/* Fails when two tensors of one rank share a name. */
int rules_check_unique(const rule *r, const plan_set *s);

/* Reading a rule's fields: errors name the rule and the field. */
int rule_parse_int(rule *r, const char *key, int64_t *out, int64_t dflt, int64_t min, int64_t max);
int rule_parse_str(rule *r, const char *key, const char **out, const char *dflt, bool required);
int rule_parse_bool(rule *r, const char *key, bool *out, bool dflt);
/* "members": 1 to RULE_MAX_MEMBERS distinct names. */
int rule_parse_members(rule *r);
/* A rule's tp must be the document's (or 1). */
int rule_check_tp(const rule *r, int doc_tp);
/* Substitutes repl for the match(es) in name; replacement_only expands the
 * template alone. malloc'd, or NULL (error set). */
char *rule_subst(const rule *r, matcher *m, const char *name, const char *repl, bool replacement_only);

/* The ops: one parse and one apply each (rules.c's table). */
int parse_rename(rule *r, int doc_tp);
int parse_drop(rule *r, int doc_tp);
int parse_cast(rule *r, int doc_tp);
int parse_transpose(rule *r, int doc_tp);
int parse_tp_split(rule *r, int doc_tp);
int parse_fuse(rule *r, int doc_tp);
int parse_stack_experts(rule *r, int doc_tp);
int parse_unstack_experts(rule *r, int doc_tp);
int parse_fuse_qkv_gqa(rule *r, int doc_tp);
int parse_lora_merge(rule *r, int doc_tp);
void free_lora_merge(rule *r);
int rule_apply_rename(const rule *r, plan_set *s, rules_result *res);
int rule_apply_drop(const rule *r, plan_set *s, rules_result *res);
int rule_apply_cast(const rule *r, plan_set *s, rules_result *res);
int rule_apply_transpose(const rule *r, plan_set *s, rules_result *res);
int rule_apply_tp_split(const rule *r, plan_set *s, rules_result *res);
int rule_apply_fuse(const rule *r, plan_set *s, rules_result *res);
int rule_apply_stack_experts(const rule *r, plan_set *s, rules_result *res);
int rule_apply_unstack_experts(const rule *r, plan_set *s, rules_result *res);
int rule_apply_fuse_qkv_gqa(const rule *r, plan_set *s, rules_result *res);
int rule_apply_lora_merge(const rule *r, plan_set *s, rules_result *res);

#endif

/*
 * rules.c — parsing and applying transform rules (see rules.h, docs/rules.md,
 * docs/transforms.md): the op table, and the loops over a document's rules.
 * Every op turns tensors of the working set into new tensors through the
 * part algebra of plan.h; nothing here reads tensor bytes.
 *
 * A new op is: a value of rule_op (rules_internal.h), a row of rule_ops
 * below (its name, the fields it takes, its parse and apply functions), and
 * those functions in a rule_<kind>.c. docs/rules.md describes it.
 */
#include "transform/rules.h"
#include "transform/rules_internal.h"

#include "common/error.h"
#include "common/json.h"
#include "common/util.h"
#include "format/checkpoint.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const rule_op_def rule_ops[RULES_NOPS] = {
    [OP_RENAME] = {"rename", {"replacement"}, false, parse_rename, rule_apply_rename, NULL},
    [OP_DROP] = {"drop", {NULL}, false, parse_drop, rule_apply_drop, NULL},
    [OP_CAST] = {"cast", {"dtype"}, true, parse_cast, rule_apply_cast, NULL},
    [OP_TRANSPOSE] = {"transpose", {"dims", "replacement"}, false, parse_transpose, rule_apply_transpose, NULL},
    [OP_TP_SPLIT] = {"tp_split", {"axis", "tp", "pad_multiple", "stride"}, false, parse_tp_split, rule_apply_tp_split, NULL},
    [OP_FUSE] = {"fuse", {"members", "member_group", "output", "axis", "tp", "pad_multiple"}, false, parse_fuse,
                 rule_apply_fuse, NULL},
    [OP_STACK_EXPERTS] = {"stack_experts", {"expert_group", "output", "num_experts", "transpose_last2"}, false,
                          parse_stack_experts, rule_apply_stack_experts, NULL},
    [OP_UNSTACK_EXPERTS] = {"unstack_experts", {"output", "transpose_last2"}, false, parse_unstack_experts,
                            rule_apply_unstack_experts, NULL},
    [OP_FUSE_QKV_GQA] = {"fuse_qkv_gqa",
                         {"q", "k", "v", "o", "output", "weight_name", "bias_name", "fused", "num_attention_heads",
                          "num_key_value_heads", "head_dim", "tp", "kv_size_multiplier", "pad_heads", "kv_order"},
                         false, parse_fuse_qkv_gqa, rule_apply_fuse_qkv_gqa, NULL},
    [OP_LORA_MERGE] = {"lora_merge", {"adapter", "scale", "unmerge"}, true, parse_lora_merge, rule_apply_lora_merge,
                       free_lora_merge},
};

/* ---- parsing ---- */

static int check_fields(rule *r)
{
    const char *key;
    json_t *val;
    json_object_foreach(r->json, key, val)
    {
        if (!strcmp(key, "op") || !strcmp(key, "pattern") || !strcmp(key, "comment")) continue;
        bool known = false;
        for (size_t i = 0; i < 16 && r->def->fields[i]; i++) known |= !strcmp(r->def->fields[i], key);
        if (!known) return rule_err(r, CKPT_EINVAL, "unknown field '%s'", key);
    }
    return 0;
}

static int compile_pattern(rule *r)
{
    int rc = rule_parse_str(r, "pattern", &r->pattern, NULL, !r->def->pattern_optional);
    if (rc) return rc;
    r->has_pattern = r->pattern != NULL;
    if (!r->pattern) r->pattern = "";
    int errcode;
    PCRE2_SIZE erroff;
    r->re = pcre2_compile((PCRE2_SPTR)r->pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &errcode, &erroff, NULL);
    if (!r->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(errcode, msg, sizeof msg);
        return rule_err(r, CKPT_EINVAL, "bad regex '%s' at offset %zu: %s", r->pattern, (size_t)erroff,
                        (const char *)msg);
    }
    /* Machine code for the pattern: a rule is matched against every tensor
     * name (tens of thousands in a many-tensor model). Where JIT is not
     * available this fails and matching interprets, as without it; the match
     * limit holds either way. */
    (void)pcre2_jit_compile(r->re, PCRE2_JIT_COMPLETE);
    return 0;
}

static int parse_rule(rule *r, json_t *j, size_t index, int doc_tp)
{
    memset(r, 0, sizeof *r);
    r->index = index;
    r->json = j;
    if (!json_is_object(j)) return ckpt_error_set(CKPT_EINVAL, "rule %zu: must be an object", index);
    const char *op;
    char what[32];
    snprintf(what, sizeof what, "rule %zu", index);
    int rc = cj_str(j, "op", &op, what);
    if (rc) return rc;
    size_t i;
    for (i = 0; i < RULES_NOPS && strcmp(rule_ops[i].name, op); i++) {}
    if (i == RULES_NOPS) {
        char known[256] = "";
        for (size_t k = 0; k < RULES_NOPS; k++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", k ? ", " : "", rule_ops[k].name);
        return ckpt_error_set(CKPT_EINVAL, "rule %zu: unknown op '%s' (known: %s)", index, op, known);
    }
    r->op = (rule_op)i;
    r->def = &rule_ops[i];
    if ((rc = check_fields(r)) || (rc = compile_pattern(r))) return rc;
    return r->def->parse(r, doc_tp);
}

static size_t count_of(const char *s, const char *w)
{
    size_t n = 0;
    for (const char *p = strstr(s, w); p; p = strstr(p + 1, w)) n++;
    return n;
}

bool rules_rank_files_valid(const char *pattern)
{
    size_t len = strlen(pattern), ext = strlen(".safetensors");
    return len > ext && len < 256 && !strcmp(pattern + len - ext, ".safetensors") && !strchr(pattern, '/') &&
           ckpt_shard_name_safe(pattern) && count_of(pattern, "{rank}") == 1 && count_of(pattern, "{part}") == 1 &&
           count_of(pattern, "{") == 2 && count_of(pattern, "}") == 2;
}

char *rules_rank_file_name(const char *pattern, int rank, size_t part)
{
    char nums[2][32];
    snprintf(nums[0], sizeof nums[0], "%d", rank);
    snprintf(nums[1], sizeof nums[1], "%zu", part);
    size_t cap = strlen(pattern) + 64;
    char *out = ckpt_malloc(cap), *o = out;
    if (!out) return NULL;
    for (const char *p = pattern; *p;) {
        const char *num = !strncmp(p, "{rank}", 6) ? nums[0] : !strncmp(p, "{part}", 6) ? nums[1] : NULL;
        if (num) {
            o += sprintf(o, "%s", num);
            p += 6;
        } else {
            *o++ = *p++;
        }
    }
    *o = 0;
    return out;
}

int rules_parse(rules_doc *d, json_t *doc, const char *what)
{
    memset(d, 0, sizeof *d);
    if (!json_is_object(doc)) return ckpt_error_set(CKPT_EINVAL, "%s: a rules document must be a JSON object", what);
    const char *layout = "custom";
    int64_t tp = 1, version = 1;
    int rc = cj_str_opt(doc, "layout", &layout, what);
    if (!rc) rc = cj_int_opt(doc, "tp", &tp, what);
    if (!rc) rc = cj_int_opt(doc, "version", &version, what);
    if (rc) return rc;
    if (version != 1) return ckpt_error_set(CKPT_EINVAL, "%s: rules version %lld is not supported (this ckpt reads 1)", what, (long long)version);
    if (tp < 1 || tp > PLAN_MAX_TP) return ckpt_error_set(CKPT_EINVAL, "%s: tp must be between 1 and %d", what, PLAN_MAX_TP);
    const char *rank_files = NULL;
    if ((rc = cj_str_opt(doc, "rank_files", &rank_files, what))) return rc;
    if (rank_files && !rules_rank_files_valid(rank_files))
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: rank_files '%s' must hold {rank} and {part} once each, end in .safetensors and "
                              "name a file of the output folder (no '/')",
                              what, rank_files);
    json_t *list = json_object_get(doc, "rules");
    if (!json_is_array(list)) return ckpt_error_set(CKPT_EINVAL, "%s: missing the 'rules' list", what);
    if (json_array_size(list) > RULES_MAX) return ckpt_error_set(CKPT_ELIMIT, "%s: more than %d rules", what, RULES_MAX);
    d->doc = json_incref(doc);
    d->tp = (int)tp;
    d->layout = ckpt_strdup(layout);
    if (rank_files && !(d->rank_files = ckpt_strdup(rank_files))) {
        rules_free(d);
        return CKPT_ENOMEM;
    }
    d->n = json_array_size(list);
    d->rules = ckpt_calloc(d->n, sizeof *d->rules);
    if (!d->layout || !d->rules) {
        rules_free(d);
        return CKPT_ENOMEM;
    }
    for (size_t i = 0; i < d->n; i++) {
        if ((rc = parse_rule(&d->rules[i], json_array_get(list, i), i + 1, d->tp))) {
            ckpt_error_prefix(rc, "%s", what);
            rules_free(d);
            return rc;
        }
    }
    return 0;
}

int rules_load_file(rules_doc *d, const char *path)
{
    json_t *doc;
    int rc = cj_load_file(&doc, path, RULES_MAX_BYTES);
    if (rc) return rc;
    rc = rules_parse(d, doc, path);
    json_decref(doc);
    return rc;
}

void rules_free(rules_doc *d)
{
    for (size_t i = 0; d->rules && i < d->n; i++) {
        pcre2_code_free(d->rules[i].re);
        if (d->rules[i].def && d->rules[i].def->free) d->rules[i].def->free(&d->rules[i]);
    }
    free(d->rules);
    free(d->layout);
    free(d->rank_files);
    json_decref(d->doc);
    memset(d, 0, sizeof *d);
}

int rules_apply(const rules_doc *d, plan_set *set, rules_result *res)
{
    memset(res, 0, sizeof *res);
    for (size_t i = 0; i < d->n; i++) {
        int rc = d->rules[i].def->apply(&d->rules[i], set, res);
        if (rc) return rc;
    }
    return 0;
}

void rules_result_free(rules_result *res)
{
    for (size_t i = 0; i < res->nmerges; i++) free(res->merges[i].tensor);
    free(res->merges);
    memset(res, 0, sizeof *res);
}

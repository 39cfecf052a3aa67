/*
 * rules.c — parsing and applying transform rules (see rules.h, docs/rules.md,
 * docs/transforms.md). Every op turns tensors of the working set into new
 * tensors through the part algebra of plan.h; nothing here reads tensor bytes.
 */
#include "transform/rules.h"
#include "transform/rules_internal.h"

#include "common/error.h"
#include "common/json.h"
#include "common/util.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


const char *const rules_op_names[RULES_NOPS] = {"rename",        "drop",            "cast",
                                       "transpose",     "tp_split",        "fuse",
                                       "stack_experts", "unstack_experts", "fuse_qkv_gqa",
                                       "lora_merge"};

/* Fields each op accepts besides "op" and "pattern" (a typo is an error). */
static const char *const op_fields[][16] = {
    [OP_RENAME] = {"replacement"},
    [OP_DROP] = {NULL},
    [OP_CAST] = {"dtype"},
    [OP_TRANSPOSE] = {"dims", "replacement"},
    [OP_TP_SPLIT] = {"axis", "tp", "pad_multiple", "stride"},
    [OP_FUSE] = {"members", "member_group", "output", "axis", "tp", "pad_multiple"},
    [OP_STACK_EXPERTS] = {"expert_group", "output", "num_experts", "transpose_last2"},
    [OP_UNSTACK_EXPERTS] = {"output", "transpose_last2"},
    [OP_FUSE_QKV_GQA] = {"q", "k", "v", "o", "output", "weight_name", "bias_name", "fused",
                         "num_attention_heads", "num_key_value_heads", "head_dim", "tp",
                         "kv_size_multiplier", "pad_heads"},
    [OP_LORA_MERGE] = {"adapter", "scale", "unmerge"},
};

/* ---- parsing ---- */

int rule_err(const rule *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int rule_err(const rule *r, int code, const char *fmt, ...)
{
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ckpt_error_set(code, "rule %zu (%s): %s", r->index, rules_op_names[r->op], msg);
}

static int parse_int(rule *r, const char *key, int64_t *out, int64_t dflt, int64_t min, int64_t max)
{
    *out = dflt;
    char what[64];
    snprintf(what, sizeof what, "rule %zu (%s)", r->index, rules_op_names[r->op]);
    int rc = cj_int_opt(r->json, key, out, what);
    if (rc) return rc;
    if (*out < min || *out > max)
        return rule_err(r, CKPT_EINVAL, "'%s' is %lld, must be between %lld and %lld", key,
                        (long long)*out, (long long)min, (long long)max);
    return 0;
}

static int parse_str(rule *r, const char *key, const char **out, const char *dflt, bool required)
{
    *out = dflt;
    char what[64];
    snprintf(what, sizeof what, "rule %zu (%s)", r->index, rules_op_names[r->op]);
    int rc = required ? cj_str(r->json, key, out, what) : cj_str_opt(r->json, key, out, what);
    if (rc) return rc;
    if (*out && strlen(*out) > RULE_NAME_MAX) return rule_err(r, CKPT_ELIMIT, "'%s' is too long", key);
    return 0;
}

static int parse_bool(rule *r, const char *key, bool *out, bool dflt)
{
    *out = dflt;
    char what[64];
    snprintf(what, sizeof what, "rule %zu (%s)", r->index, rules_op_names[r->op]);
    return cj_bool_opt(r->json, key, out, what);
}

static int check_fields(rule *r)
{
    const char *key;
    json_t *val;
    json_object_foreach(r->json, key, val)
    {
        if (!strcmp(key, "op") || !strcmp(key, "pattern") || !strcmp(key, "comment")) continue;
        bool known = false;
        for (size_t i = 0; i < 16 && op_fields[r->op][i]; i++) known |= !strcmp(op_fields[r->op][i], key);
        if (!known) return rule_err(r, CKPT_EINVAL, "unknown field '%s'", key);
    }
    return 0;
}

static int compile_pattern(rule *r)
{
    int rc = parse_str(r, "pattern", &r->pattern, NULL, r->op != OP_CAST && r->op != OP_LORA_MERGE);
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
    return 0;
}

static int parse_members(rule *r)
{
    json_t *m = json_object_get(r->json, "members");
    if (!json_is_array(m) || json_array_size(m) < 1 || json_array_size(m) > RULE_MAX_MEMBERS)
        return rule_err(r, CKPT_EINVAL, "'members' must be a list of 1 to %d names", RULE_MAX_MEMBERS);
    r->nmembers = json_array_size(m);
    for (size_t i = 0; i < r->nmembers; i++) {
        json_t *s = json_array_get(m, i);
        if (!json_is_string(s)) return rule_err(r, CKPT_EINVAL, "'members' must hold strings");
        r->members[i] = json_string_value(s);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(r->members[i], r->members[j]))
                return rule_err(r, CKPT_EINVAL, "member '%s' is listed twice", r->members[i]);
    }
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
    size_t nops = RULES_NOPS;
    size_t i;
    for (i = 0; i < nops && strcmp(rules_op_names[i], op); i++) {}
    if (i == nops)
        return ckpt_error_set(CKPT_EINVAL,
                              "rule %zu: unknown op '%s' (known: rename, drop, cast, transpose, tp_split, "
                              "fuse, stack_experts, unstack_experts, fuse_qkv_gqa, lora_merge)",
                              index, op);
    r->op = (rule_op)i;
    if ((rc = check_fields(r)) || (rc = compile_pattern(r))) return rc;
    switch (r->op) {
    case OP_RENAME:
        return parse_str(r, "replacement", &r->replacement, NULL, true);
    case OP_DROP:
        return 0;
    case OP_CAST: {
        const char *dt;
        if ((rc = parse_str(r, "dtype", &dt, NULL, true))) return rc;
        if (ckpt_dtype_from_name(dt, &r->dtype) < 0 || !ckpt_dtype_is_castable_float(r->dtype))
            return rule_err(r, CKPT_EINVAL, "dtype '%s' is not one of bf16, f16, f32, f64", dt);
        return 0;
    }
    case OP_TRANSPOSE: {
        r->dims[0] = -2;
        r->dims[1] = -1;
        json_t *d = json_object_get(j, "dims");
        if (d) {
            if (!json_is_array(d) || json_array_size(d) != 2 || !json_is_integer(json_array_get(d, 0)) ||
                !json_is_integer(json_array_get(d, 1)))
                return rule_err(r, CKPT_EINVAL, "'dims' must be two axis numbers, e.g. [-2, -1]");
            for (int k = 0; k < 2; k++) {
                r->dims[k] = json_integer_value(json_array_get(d, (size_t)k));
                if (r->dims[k] < -PLAN_MAX_DIM || r->dims[k] >= PLAN_MAX_DIM)
                    return rule_err(r, CKPT_EINVAL, "'dims' entry %lld is out of range", (long long)r->dims[k]);
            }
        }
        return parse_str(r, "replacement", &r->replacement, NULL, false);
    }
    case OP_TP_SPLIT:
        if ((rc = parse_int(r, "tp", &r->tp, doc_tp, 1, PLAN_MAX_TP)) ||
            (rc = parse_int(r, "axis", &r->axis, 0, -PLAN_MAX_DIM, PLAN_MAX_DIM - 1)) ||
            (rc = parse_int(r, "pad_multiple", &r->pad_multiple, r->tp, 1, 1 << 30)) ||
            (rc = parse_int(r, "stride", &r->stride, 1, 1, 1 << 20)))
            return rc;
        break;
    case OP_FUSE:
        if ((rc = parse_members(r)) || (rc = parse_str(r, "output", &r->replacement, NULL, true)) ||
            (rc = parse_int(r, "member_group", &r->group, 2, 1, 99)) ||
            (rc = parse_int(r, "axis", &r->axis, 0, -PLAN_MAX_DIM, PLAN_MAX_DIM - 1)) ||
            (rc = parse_int(r, "tp", &r->tp, 1, 1, PLAN_MAX_TP)) ||
            (rc = parse_int(r, "pad_multiple", &r->pad_multiple, r->tp, 1, 1 << 30)))
            return rc;
        break;
    case OP_STACK_EXPERTS:
        if ((rc = parse_str(r, "output", &r->replacement, NULL, true)) ||
            (rc = parse_int(r, "expert_group", &r->group, 2, 1, 99)) ||
            (rc = parse_int(r, "num_experts", &r->num_experts, 0, 0, RULE_MAX_EXPERTS)) ||
            (rc = parse_bool(r, "transpose_last2", &r->transpose_last2, false)))
            return rc;
        return 0;
    case OP_UNSTACK_EXPERTS:
        if ((rc = parse_str(r, "output", &r->replacement, NULL, true)) ||
            (rc = parse_bool(r, "transpose_last2", &r->transpose_last2, false)))
            return rc;
        if (!strstr(r->replacement, "{e}"))
            return rule_err(r, CKPT_EINVAL, "'output' must contain {e} (the expert number)");
        return 0;
    case OP_FUSE_QKV_GQA:
        if ((rc = parse_str(r, "q", &r->q, "q_proj", false)) || (rc = parse_str(r, "k", &r->k, "k_proj", false)) ||
            (rc = parse_str(r, "v", &r->v, "v_proj", false)) || (rc = parse_str(r, "o", &r->o, "o_proj", false)) ||
            (rc = parse_str(r, "output", &r->replacement, "qkv_proj", false)) ||
            (rc = parse_str(r, "weight_name", &r->weight_name, "weight_qkv", false)) ||
            (rc = parse_str(r, "bias_name", &r->bias_name, "bias_qkv", false)) ||
            (rc = parse_bool(r, "fused", &r->fused, true)) ||
            (rc = parse_bool(r, "pad_heads", &r->pad_heads, true)) ||
            (rc = parse_int(r, "tp", &r->tp, doc_tp, 1, PLAN_MAX_TP)) ||
            (rc = parse_int(r, "num_attention_heads", &r->heads, 0, 1, 1 << 20)) ||
            (rc = parse_int(r, "num_key_value_heads", &r->kv_heads, 0, 1, 1 << 20)) ||
            (rc = parse_int(r, "head_dim", &r->head_dim, 0, 1, 1 << 20)) ||
            (rc = parse_int(r, "kv_size_multiplier", &r->kv_mult, 0, 0, PLAN_MAX_TP)))
            return rc;
        if (!r->heads || !r->kv_heads || !r->head_dim)
            return rule_err(r, CKPT_EINVAL, "needs num_attention_heads, num_key_value_heads and head_dim");
        break;
    case OP_LORA_MERGE:
        return parse_lora_merge(r);
    }
    if (r->tp != doc_tp && r->tp != 1)
        return rule_err(r, CKPT_EINVAL, "tp %lld differs from the document's tp %d", (long long)r->tp, doc_tp);
    return 0;
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
    json_t *list = json_object_get(doc, "rules");
    if (!json_is_array(list)) return ckpt_error_set(CKPT_EINVAL, "%s: missing the 'rules' list", what);
    if (json_array_size(list) > RULES_MAX) return ckpt_error_set(CKPT_ELIMIT, "%s: more than %d rules", what, RULES_MAX);
    d->doc = json_incref(doc);
    d->tp = (int)tp;
    d->layout = ckpt_strdup(layout);
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
        free_lora_merge(&d->rules[i]);
    }
    free(d->rules);
    free(d->layout);
    json_decref(d->doc);
    memset(d, 0, sizeof *d);
}

/* ---- matching ---- */

int matcher_init(matcher *m, const rule *r)
{
    m->md = pcre2_match_data_create_from_pattern(r->re, NULL);
    m->mctx = pcre2_match_context_create(NULL);
    if (!m->md || !m->mctx) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    pcre2_set_match_limit(m->mctx, RULE_MATCH_LIMIT);
    return 0;
}

void matcher_free(matcher *m)
{
    pcre2_match_data_free(m->md);
    pcre2_match_context_free(m->mctx);
}

/* 1 on match, 0 on no match, <0 on error. */
int rule_match(const rule *r, matcher *m, const char *name)
{
    if (!r->has_pattern) return 1;
    int rc = pcre2_match(r->re, (PCRE2_SPTR)name, strlen(name), 0, 0, m->md, m->mctx);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return rule_err(r, CKPT_EINVAL, "pattern failed on '%s' (error %d, too much backtracking?)", name, rc);
    return 1;
}

/* The text of capture group g of the last match (malloc'd), or NULL (error set). */
char *rule_group(const rule *r, matcher *m, const char *name, int64_t g)
{
    uint32_t count = pcre2_get_ovector_count(m->md);
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
    if ((uint32_t)g >= count || ov[2 * g] == PCRE2_UNSET) {
        rule_err(r, CKPT_EINVAL, "pattern has no capture group %lld matching in '%s'", (long long)g, name);
        return NULL;
    }
    return ckpt_strndup(name + ov[2 * g], ov[2 * g + 1] - ov[2 * g]);
}

/* Substitutes `repl` for the match(es) in name; replacement_only expands the
 * template alone. malloc'd, or NULL (error set). */
static char *rule_subst(const rule *r, matcher *m, const char *name, const char *repl, bool replacement_only)
{
    PCRE2_UCHAR buf[RULE_NAME_MAX + 1];
    PCRE2_SIZE len = sizeof buf;
    uint32_t opts = replacement_only ? PCRE2_SUBSTITUTE_REPLACEMENT_ONLY : PCRE2_SUBSTITUTE_GLOBAL;
    int rc = pcre2_substitute(r->re, (PCRE2_SPTR)name, strlen(name), 0, opts, NULL, m->mctx, (PCRE2_SPTR)repl,
                              PCRE2_ZERO_TERMINATED, buf, &len);
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        rule_err(r, CKPT_EINVAL, "cannot substitute '%s' in '%s': %s", repl, name, (const char *)msg);
        return NULL;
    }
    return ckpt_strndup((const char *)buf, len);
}

/* ---- helpers on tensors ---- */

json_t *rule_desc(const rule *r)
{
    json_t *d = json_deep_copy(r->json);
    if (d) json_object_set_new(d, "rule", json_integer((json_int_t)r->index));
    return d;
}

int resolve_axis(const rule *r, const plan_tensor *t, int64_t axis, int *out)
{
    int64_t a = axis < 0 ? axis + t->ndim : axis;
    if (a < 0 || a >= t->ndim)
        return rule_err(r, CKPT_EINVAL, "tensor '%s' has %d dimensions, no axis %lld", t->name, t->ndim, (long long)axis);
    *out = (int)a;
    return 0;
}

int require_byte_dtype(const rule *r, const plan_tensor *t)
{
    if (ckpt_dtype_size(t->dtype) == 0)
        return rule_err(r, CKPT_EINVAL, "tensor '%s' has sub-byte dtype %s, which cannot be sliced or fused",
                        t->name, ckpt_dtype_name(t->dtype));
    return 0;
}

int require_unsharded(const rule *r, const plan_tensor *t)
{
    if (t->rank != PLAN_ALL_RANKS)
        return rule_err(r, CKPT_EINVAL, "tensor '%s' is already split for tensor parallelism", t->name);
    return 0;
}

/* Pads axis to a multiple of pad_multiple (which must then divide by tp*stride)
 * and returns the rank pieces: rank r gets pieces r, r+tp, ... of tp*stride
 * equal pieces, concatenated (docs/transforms.md §5). out[] receives tp tensors. */
int split_for_ranks(const rule *r, const plan_tensor *t, int axis, int64_t tp, int64_t pad_multiple,
                           int64_t stride, plan_tensor *out, uint64_t *padded_len)
{
    uint64_t len = t->shape[axis];
    uint64_t pm = (uint64_t)pad_multiple;
    uint64_t padded = (len + pm - 1) / pm * pm;
    uint64_t pieces = (uint64_t)tp * (uint64_t)stride;
    if (padded % pieces)
        return rule_err(r, CKPT_EINVAL,
                        "tensor '%s': axis %d of length %llu padded to %llu does not split into %llu equal pieces "
                        "(tp %lld x stride %lld); set pad_multiple to a multiple of %llu",
                        t->name, axis, (unsigned long long)len, (unsigned long long)padded,
                        (unsigned long long)pieces, (long long)tp, (long long)stride, (unsigned long long)pieces);
    *padded_len = padded;
    plan_tensor full;
    int rc = plan_tensor_pad(&full, t, axis, padded);
    if (rc) return rc;
    uint64_t piece = padded / pieces;
    int64_t made = 0;
    for (int64_t rank = 0; rank < tp && !rc; rank++) {
        plan_tensor bits[64];
        plan_tensor *ptrs[64];
        if (stride > 64) {
            rc = rule_err(r, CKPT_ELIMIT, "stride above 64 is not supported");
            break;
        }
        int64_t nb = 0;
        for (; nb < stride && !rc; nb++) {
            rc = plan_tensor_slice(&bits[nb], &full, axis, (uint64_t)(rank + nb * tp) * piece, piece);
            ptrs[nb] = &bits[nb];
            if (rc) break;
        }
        if (!rc) rc = plan_tensor_concat(&out[rank], ptrs, (size_t)nb, axis);
        for (int64_t b = 0; b < nb; b++) plan_tensor_free(&bits[b]);
        if (!rc) {
            out[rank].rank = (int)rank;
            made++;
        }
    }
    plan_tensor_free(&full);
    if (rc)
        for (int64_t i = 0; i < made; i++) plan_tensor_free(&out[i]);
    return rc;
}

int set_meta(plan_tensor *t, const char *key, json_t *v)
{
    if (!v) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    if (!t->meta && !(t->meta = json_object())) {
        json_decref(v);
        return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    }
    return json_object_set_new(t->meta, key, v) ? ckpt_error_set(CKPT_ENOMEM, "out of memory") : 0;
}

int note_partition(plan_tensor *t, int axis, int64_t stride, int64_t tp, uint64_t len, uint64_t padded)
{
    int rc = set_meta(t, "tensor_model_parallel", json_true());
    if (!rc) rc = set_meta(t, "partition_dim", json_integer(axis));
    if (!rc) rc = set_meta(t, "partition_stride", json_integer(stride));
    if (!rc) rc = set_meta(t, "num_partitions", json_integer(tp));
    if (!rc && padded != len)
        rc = set_meta(t, "padding", json_pack("{s:i,s:I,s:I}", "axis", axis, "original", (json_int_t)len,
                                              "padded", (json_int_t)padded));
    return rc;
}

/* Removes the tensors flagged in `gone` from the set (compacting it). */
static void set_remove_flagged(plan_set *s, const bool *gone)
{
    size_t w = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (gone[i]) plan_tensor_free(&s->t[i]);
        else s->t[w++] = s->t[i];
    }
    s->n = w;
}

int rules_remove_consumed(plan_set *s, const bool *gone, size_t n0)
{
    bool *all = ckpt_calloc(s->n + 1, sizeof *all);
    if (!all) return CKPT_ENOMEM;
    memcpy(all, gone, n0 * sizeof *gone);
    set_remove_flagged(s, all);
    free(all);
    return 0;
}

/* The name a tensor had before the last rename, for messages. */
static const char *last_origin(const plan_tensor *t)
{
    json_t *list = t->meta ? json_object_get(t->meta, "transforms") : NULL;
    for (size_t i = json_array_size(list); i > 0; i--) {
        const char *from = json_string_value(json_object_get(json_array_get(list, i - 1), "from"));
        if (from) return from;
    }
    return t->name;
}

static int cmp_name_rank(const void *a, const void *b, void *ctx)
{
    const plan_set *set = ctx;
    const plan_tensor *x = &set->t[*(const size_t *)a], *y = &set->t[*(const size_t *)b];
    int c = strcmp(x->name, y->name);
    return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

int rules_check_unique(const rule *r, const plan_set *s)
{
    /* Names are few enough (<= 1e6) that sorting indexes is cheap. */
    size_t *idx = ckpt_malloc(s->n * sizeof *idx + 1);
    if (!idx) return CKPT_ENOMEM;
    for (size_t i = 0; i < s->n; i++) idx[i] = i;
    qsort_r(idx, s->n, sizeof *idx, cmp_name_rank, (void *)s);
    int rc = 0;
    for (size_t i = 1; i < s->n && !rc; i++) {
        const plan_tensor *x = &s->t[idx[i - 1]], *y = &s->t[idx[i]];
        if (!strcmp(x->name, y->name) && (x->rank == y->rank || x->rank == PLAN_ALL_RANKS || y->rank == PLAN_ALL_RANKS))
            rc = rule_err(r, CKPT_EINVAL, "two tensors would be named '%s' (from '%s' and '%s')", x->name,
                          last_origin(x), last_origin(y));
    }
    free(idx);
    return rc;
}

/* ---- ops ---- */

static int apply_rename(const rule *r, plan_set *s)
{
    matcher m;
    int rc = matcher_init(&m, r);
    for (size_t i = 0; !rc && i < s->n; i++) {
        plan_tensor *t = &s->t[i];
        int hit = rule_match(r, &m, t->name);
        if (hit <= 0) {
            rc = hit;
            continue;
        }
        char *nn = rule_subst(r, &m, t->name, r->replacement, false);
        if (!nn) {
            rc = CKPT_EINVAL;
            break;
        }
        if (nn[0] == '\0') rc = rule_err(r, CKPT_EINVAL, "renames '%s' to an empty name", t->name);
        json_t *d = rule_desc(r);
        if (d) json_object_set_new(d, "from", json_string(t->name));
        free(t->name);
        t->name = nn;
        if (!rc) rc = plan_tensor_note(t, d);
        else json_decref(d);
    }
    matcher_free(&m);
    return rc ? rc : rules_check_unique(r, s);
}

static int apply_drop(const rule *r, plan_set *s)
{
    matcher m;
    int rc = matcher_init(&m, r);
    bool *gone = ckpt_calloc(s->n + 1, sizeof *gone);
    if (!gone) rc = CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < s->n; i++) {
        int hit = rule_match(r, &m, s->t[i].name);
        if (hit < 0) rc = hit;
        gone[i] = hit > 0;
    }
    if (!rc) set_remove_flagged(s, gone);
    free(gone);
    matcher_free(&m);
    return rc;
}

static bool cast_is_lossy(ckpt_dtype from, ckpt_dtype to)
{
    return ckpt_dtype_bits(to) < ckpt_dtype_bits(from) || (from == CKPT_DT_BF16 && to == CKPT_DT_F16) ||
           (from == CKPT_DT_F16 && to == CKPT_DT_BF16);
}

static int apply_cast(const rule *r, plan_set *s, rules_result *res)
{
    matcher m;
    int rc = matcher_init(&m, r);
    for (size_t i = 0; !rc && i < s->n; i++) {
        plan_tensor *t = &s->t[i];
        int hit = rule_match(r, &m, t->name);
        if (hit <= 0) {
            rc = hit;
            continue;
        }
        if (!ckpt_dtype_is_castable_float(t->dtype)) {
            if (r->has_pattern)
                rc = rule_err(r, CKPT_EINVAL, "tensor '%s' has dtype %s, which cannot be cast", t->name,
                              ckpt_dtype_name(t->dtype));
            continue;
        }
        if (t->dtype == r->dtype) continue;
        if (cast_is_lossy(t->dtype, r->dtype)) res->lossy = true;
        json_t *d = rule_desc(r);
        if (d) json_object_set_new(d, "from_dtype", json_string(ckpt_dtype_name(t->dtype)));
        t->dtype = r->dtype;
        rc = plan_tensor_note(t, d);
    }
    matcher_free(&m);
    return rc;
}

static int apply_transpose(const rule *r, plan_set *s)
{
    matcher m;
    int rc = matcher_init(&m, r);
    for (size_t i = 0; !rc && i < s->n; i++) {
        plan_tensor *t = &s->t[i];
        int hit = rule_match(r, &m, t->name);
        if (hit <= 0 || t->ndim < 2) {
            rc = hit < 0 ? hit : 0;
            continue;
        }
        int a = 0, b = 0;
        if ((rc = resolve_axis(r, t, r->dims[0], &a)) || (rc = resolve_axis(r, t, r->dims[1], &b))) break;
        if ((rc = require_byte_dtype(r, t))) break;
        char *nn = NULL;
        if (r->replacement && !(nn = rule_subst(r, &m, t->name, r->replacement, false))) {
            rc = CKPT_EINVAL;
            break;
        }
        plan_tensor out;
        rc = plan_tensor_transpose(&out, t, a, b);
        if (rc) {
            free(nn);
            break;
        }
        if (nn) {
            free(out.name);
            out.name = nn;
        }
        plan_tensor_free(t);
        *t = out;
        rc = plan_tensor_note(t, rule_desc(r));
    }
    matcher_free(&m);
    return rc ? rc : rules_check_unique(r, s);
}

static int apply_tp_split(const rule *r, plan_set *s)
{
    matcher m;
    int rc = matcher_init(&m, r);
    size_t n0 = s->n;
    bool *gone = ckpt_calloc(n0 + 1, sizeof *gone);
    plan_tensor *ranks = ckpt_calloc((size_t)r->tp, sizeof *ranks);
    if (!gone || !ranks) rc = CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < n0; i++) {
        int hit = rule_match(r, &m, s->t[i].name);
        if (hit <= 0) {
            rc = hit;
            continue;
        }
        int axis = 0;
        const plan_tensor *t = &s->t[i];
        if ((rc = resolve_axis(r, t, r->axis, &axis)) || (rc = require_unsharded(r, t)) ||
            (rc = require_byte_dtype(r, t)))
            break;
        uint64_t padded;
        rc = split_for_ranks(r, t, axis, r->tp, r->pad_multiple, r->stride, ranks, &padded);
        uint64_t len = t->shape[axis];
        for (int64_t k = 0; !rc && k < r->tp; k++) {
            rc = note_partition(&ranks[k], axis, r->stride, r->tp, len, padded);
            if (!rc) rc = plan_tensor_note(&ranks[k], rule_desc(r));
        }
        for (int64_t k = 0; !rc && k < r->tp; k++) rc = plan_set_push(s, &ranks[k]);
        for (int64_t k = 0; k < r->tp; k++) plan_tensor_free(&ranks[k]);
        gone[i] = true;
    }
    if (!rc) rc = rules_remove_consumed(s, gone, n0);
    free(ranks);
    free(gone);
    matcher_free(&m);
    return rc;
}

/* A group of tensors that a grouping op (fuse, stack_experts) turns into one. */
typedef struct {
    char *output;
    size_t n, cap;
    size_t *members;  /* indexes into the set */
    int64_t *keys;    /* member position (fuse) or expert number (stack) */
    char *example;    /* a member's name, to build missing names in errors */
    size_t key_start, key_len; /* span of the key capture in example */
} group;

typedef struct {
    group *g;
    size_t n, cap;
} group_list;

static void groups_free(group_list *gl)
{
    for (size_t i = 0; i < gl->n; i++) {
        free(gl->g[i].output);
        free(gl->g[i].members);
        free(gl->g[i].keys);
        free(gl->g[i].example);
    }
    free(gl->g);
    memset(gl, 0, sizeof *gl);
}

/* Collects tensors matching r into groups keyed by the expanded output name;
 * key_of maps the key capture text to a number (or -1 to reject). */
static int collect_groups(const rule *r, plan_set *s, group_list *gl, int64_t (*key_of)(const rule *, const char *))
{
    matcher m;
    int rc = matcher_init(&m, r);
    memset(gl, 0, sizeof *gl);
    for (size_t i = 0; !rc && i < s->n; i++) {
        const char *name = s->t[i].name;
        int hit = rule_match(r, &m, name);
        if (hit <= 0) {
            rc = hit;
            continue;
        }
        char *key_text = rule_group(r, &m, name, r->group);
        if (!key_text) {
            rc = CKPT_EINVAL;
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m.md);
        size_t ks = ov[2 * r->group], kl = ov[2 * r->group + 1] - ov[2 * r->group];
        int64_t key = key_of(r, key_text);
        if (key < 0) {
            rc = rule_err(r, CKPT_EINVAL, "tensor '%s': '%s' is not a %s", name, key_text,
                          r->op == OP_FUSE ? "listed member" : "expert number");
            free(key_text);
            break;
        }
        free(key_text);
        char *out = rule_subst(r, &m, name, r->replacement, true);
        if (!out) {
            rc = CKPT_EINVAL;
            break;
        }
        size_t gi;
        for (gi = 0; gi < gl->n && strcmp(gl->g[gi].output, out); gi++) {}
        if (gi == gl->n) {
            if ((rc = ckpt_grow(&gl->g, &gl->cap, gl->n + 1, sizeof *gl->g))) {
                free(out);
                break;
            }
            memset(&gl->g[gi], 0, sizeof gl->g[gi]);
            gl->g[gi].output = out;
            gl->g[gi].example = ckpt_strdup(name);
            gl->g[gi].key_start = ks;
            gl->g[gi].key_len = kl;
            gl->n++;
        } else {
            free(out);
        }
        group *g = &gl->g[gi];
        size_t cap2 = g->cap;
        if ((rc = ckpt_grow(&g->members, &g->cap, g->n + 1, sizeof *g->members)) ||
            (rc = ckpt_grow(&g->keys, &cap2, g->n + 1, sizeof *g->keys)))
            break;
        for (size_t j = 0; j < g->n; j++)
            if (g->keys[j] == key) rc = rule_err(r, CKPT_EINVAL, "tensors '%s' and '%s' both map to '%s' as the same member",
                                                 s->t[g->members[j]].name, name, g->output);
        g->members[g->n] = i;
        g->keys[g->n] = key;
        g->n++;
    }
    matcher_free(&m);
    if (rc) groups_free(gl);
    return rc;
}

/* The name a missing member would have: example with its key span replaced. */
static char *missing_name(const group *g, const char *key)
{
    return ckpt_sprintf("%.*s%s%s", (int)g->key_start, g->example, key, g->example + g->key_start + g->key_len);
}

static int64_t fuse_key(const rule *r, const char *text)
{
    for (size_t i = 0; i < r->nmembers; i++)
        if (!strcmp(r->members[i], text)) return (int64_t)i;
    return -1;
}

static int64_t expert_key(const rule *r, const char *text)
{
    (void)r;
    uint64_t v;
    if (ckpt_parse_u64(text, &v) < 0 || v >= RULE_MAX_EXPERTS) return -1;
    return (int64_t)v;
}

/* Moves the group's members into ptrs ordered by key (0..n-1); checks completeness. */
static int order_group(const rule *r, const plan_set *s, const group *g, size_t want, plan_tensor **ptrs)
{
    for (size_t k = 0; k < want; k++) ptrs[k] = NULL;
    for (size_t j = 0; j < g->n; j++) {
        if ((size_t)g->keys[j] >= want) {
            return rule_err(r, CKPT_EINVAL, "'%s' is expert %lld but only %zu experts are expected for '%s'",
                            s->t[g->members[j]].name, (long long)g->keys[j], want, g->output);
        }
        ptrs[g->keys[j]] = &s->t[g->members[j]];
    }
    for (size_t k = 0; k < want; k++) {
        if (ptrs[k]) continue;
        char keybuf[32];
        const char *key = keybuf;
        if (r->op == OP_FUSE) key = r->members[k];
        else snprintf(keybuf, sizeof keybuf, "%zu", k);
        char *miss = missing_name(g, key);
        int rc = r->op == OP_FUSE
                     ? rule_err(r, CKPT_EINVAL, "missing tensor '%s' (member '%s' of '%s')", miss ? miss : key, key, g->output)
                     : rule_err(r, CKPT_EINVAL, "missing tensor '%s' (expert %s of %zu for '%s')", miss ? miss : key, key,
                                want, g->output);
        free(miss);
        return rc;
    }
    for (size_t k = 0; k < want; k++) {
        int rc = require_unsharded(r, ptrs[k]);
        if (!rc) rc = require_byte_dtype(r, ptrs[k]);
        if (rc) return rc;
    }
    return 0;
}

/* The end of a grouping op: every member of every group was consumed (the
 * new tensors are pushed already), so drop them, free, and check names. */
static int finish_groups(const rule *r, plan_set *s, group_list *gl, bool *gone, size_t n0, int rc)
{
    for (size_t gi = 0; !rc && gi < gl->n; gi++)
        for (size_t j = 0; j < gl->g[gi].n; j++) gone[gl->g[gi].members[j]] = true;
    if (!rc) rc = rules_remove_consumed(s, gone, n0);
    free(gone);
    groups_free(gl);
    return rc ? rc : rules_check_unique(r, s);
}

static int apply_fuse(const rule *r, plan_set *s)
{
    group_list gl;
    int rc = collect_groups(r, s, &gl, fuse_key);
    if (rc) return rc;
    size_t n0 = s->n;
    bool *gone = ckpt_calloc(n0 + 1, sizeof *gone);
    if (!gone) rc = CKPT_ENOMEM;
    for (size_t gi = 0; !rc && gi < gl.n; gi++) {
        group *g = &gl.g[gi];
        plan_tensor *mem[RULE_MAX_MEMBERS];
        if ((rc = order_group(r, s, g, r->nmembers, mem))) break;
        int axis = 0;
        if ((rc = resolve_axis(r, mem[0], r->axis, &axis))) break;
        json_t *members = json_array(), *dims = json_array(), *padded_dims = json_array();
        for (size_t k = 0; k < r->nmembers; k++) {
            json_array_append_new(members, json_string(mem[k]->name));
            json_array_append_new(dims, json_integer((json_int_t)mem[k]->shape[axis]));
        }
        /* Per member: rank pieces (tp == 1: the member itself). */
        plan_tensor *pieces = ckpt_calloc(r->nmembers * (size_t)r->tp, sizeof *pieces);
        if (!pieces) rc = CKPT_ENOMEM;
        for (size_t k = 0; !rc && k < r->nmembers; k++) {
            uint64_t padded = mem[k]->shape[axis];
            if (r->tp > 1) rc = split_for_ranks(r, mem[k], axis, r->tp, r->pad_multiple, 1, &pieces[k * (size_t)r->tp], &padded);
            else rc = plan_tensor_copy(&pieces[k], mem[k]);
            json_array_append_new(padded_dims, json_integer((json_int_t)padded));
        }
        for (int64_t rank = 0; !rc && rank < r->tp; rank++) {
            plan_tensor *ptrs[RULE_MAX_MEMBERS];
            for (size_t k = 0; k < r->nmembers; k++) ptrs[k] = &pieces[k * (size_t)r->tp + (size_t)rank];
            plan_tensor out;
            if ((rc = plan_tensor_concat(&out, ptrs, r->nmembers, axis))) break;
            free(out.name);
            out.name = ckpt_strdup(g->output);
            out.rank = r->tp > 1 ? (int)rank : PLAN_ALL_RANKS;
            json_t *fused = json_pack("{s:O,s:O,s:O,s:i}", "members", members, "original_dims", dims,
                                      "padded_dims", padded_dims, "axis", axis);
            rc = out.name ? set_meta(&out, "fused", fused) : CKPT_ENOMEM;
            if (!rc && r->tp > 1) {
                rc = note_partition(&out, axis, 1, r->tp, 0, 0);
            }
            if (!rc) rc = plan_tensor_note(&out, rule_desc(r));
            if (!rc) rc = plan_set_push(s, &out);
            else plan_tensor_free(&out);
        }
        for (size_t k = 0; pieces && k < r->nmembers * (size_t)r->tp; k++) plan_tensor_free(&pieces[k]);
        free(pieces);
        json_decref(members);
        json_decref(dims);
        json_decref(padded_dims);
    }
    return finish_groups(r, s, &gl, gone, n0, rc);
}

static int apply_stack_experts(const rule *r, plan_set *s)
{
    group_list gl;
    int rc = collect_groups(r, s, &gl, expert_key);
    if (rc) return rc;
    size_t n0 = s->n;
    bool *gone = ckpt_calloc(n0 + 1, sizeof *gone);
    if (!gone) rc = CKPT_ENOMEM;
    for (size_t gi = 0; !rc && gi < gl.n; gi++) {
        group *g = &gl.g[gi];
        size_t want = r->num_experts ? (size_t)r->num_experts : 0;
        if (!want)
            for (size_t j = 0; j < g->n; j++) want = (size_t)g->keys[j] + 1 > want ? (size_t)g->keys[j] + 1 : want;
        plan_tensor **ptrs = ckpt_calloc(want, sizeof *ptrs);
        plan_tensor *tr = ckpt_calloc(want, sizeof *tr);
        plan_tensor **trp = ckpt_calloc(want, sizeof *trp);
        if (!ptrs || !tr || !trp) rc = CKPT_ENOMEM;
        if (!rc) rc = order_group(r, s, g, want, ptrs);
        size_t made = 0;
        for (size_t e = 0; !rc && e < want; e++) {
            if (r->transpose_last2) {
                if (ptrs[e]->ndim < 2) {
                    rc = rule_err(r, CKPT_EINVAL, "tensor '%s' has fewer than 2 dimensions to transpose", ptrs[e]->name);
                    break;
                }
                rc = plan_tensor_transpose(&tr[e], ptrs[e], ptrs[e]->ndim - 2, ptrs[e]->ndim - 1);
            } else {
                rc = plan_tensor_copy(&tr[e], ptrs[e]);
            }
            if (!rc) made++;
            trp[e] = &tr[e];
        }
        plan_tensor out;
        if (!rc) rc = plan_tensor_stack(&out, trp, want);
        if (rc && rc != CKPT_ENOMEM && strncmp(ckpt_error_last(), "rule", 4))
            ckpt_error_prefix(rc, "rule %zu (stack_experts)", r->index);
        if (!rc) {
            free(out.name);
            out.name = ckpt_strdup(g->output);
            json_t *src = json_array();
            for (size_t e = 0; e < want; e++) json_array_append_new(src, json_string(ptrs[e]->name));
            rc = out.name ? set_meta(&out, "experts", json_pack("{s:I,s:o,s:b}", "num_experts", (json_int_t)want,
                                                               "members", src, "transpose_last2", r->transpose_last2))
                          : CKPT_ENOMEM;
            if (!rc) rc = plan_tensor_note(&out, rule_desc(r));
            if (!rc) rc = plan_set_push(s, &out);
            else plan_tensor_free(&out);
        }
        for (size_t e = 0; e < made; e++) plan_tensor_free(&tr[e]);
        free(ptrs);
        free(tr);
        free(trp);
    }
    return finish_groups(r, s, &gl, gone, n0, rc);
}

static int apply_unstack_experts(const rule *r, plan_set *s)
{
    matcher m;
    int rc = matcher_init(&m, r);
    size_t n0 = s->n;
    bool *gone = ckpt_calloc(n0 + 1, sizeof *gone);
    if (!gone) rc = CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < n0; i++) {
        int hit = rule_match(r, &m, s->t[i].name);
        if (hit <= 0) {
            rc = hit;
            continue;
        }
        if ((rc = require_unsharded(r, &s->t[i]))) break;
        if (s->t[i].ndim < 1 + (r->transpose_last2 ? 2 : 0)) {
            rc = rule_err(r, CKPT_EINVAL, "tensor '%s' has too few dimensions to unstack", s->t[i].name);
            break;
        }
        char *tmpl = rule_subst(r, &m, s->t[i].name, r->replacement, true);
        if (!tmpl) {
            rc = CKPT_EINVAL;
            break;
        }
        uint64_t ne = s->t[i].shape[0];
        for (uint64_t e = 0; !rc && e < ne; e++) {
            plan_tensor sl, sq, out;
            rc = plan_tensor_slice(&sl, &s->t[i], 0, e, 1);
            if (rc) break;
            rc = plan_tensor_squeeze(&sq, &sl, 0);
            plan_tensor_free(&sl);
            if (rc) break;
            if (r->transpose_last2) {
                rc = plan_tensor_transpose(&out, &sq, sq.ndim - 2, sq.ndim - 1);
                plan_tensor_free(&sq);
                if (rc) break;
            } else {
                out = sq;
            }
            const char *at = strstr(tmpl, "{e}");
            char *nn = ckpt_sprintf("%.*s%llu%s", (int)(at - tmpl), tmpl, (unsigned long long)e, at + 3);
            free(out.name);
            out.name = nn;
            rc = nn ? plan_tensor_note(&out, rule_desc(r)) : CKPT_ENOMEM;
            if (!rc) rc = plan_set_push(s, &out);
            else plan_tensor_free(&out);
        }
        free(tmpl);
        gone[i] = true;
    }
    if (!rc) rc = rules_remove_consumed(s, gone, n0);
    free(gone);
    matcher_free(&m);
    return rc ? rc : rules_check_unique(r, s);
}

int rules_apply(const rules_doc *d, plan_set *set, rules_result *res)
{
    memset(res, 0, sizeof *res);
    for (size_t i = 0; i < d->n; i++) {
        const rule *r = &d->rules[i];
        int rc;
        switch (r->op) {
        case OP_RENAME: rc = apply_rename(r, set); break;
        case OP_DROP: rc = apply_drop(r, set); break;
        case OP_CAST: rc = apply_cast(r, set, res); break;
        case OP_TRANSPOSE: rc = apply_transpose(r, set); break;
        case OP_TP_SPLIT: rc = apply_tp_split(r, set); break;
        case OP_FUSE: rc = apply_fuse(r, set); break;
        case OP_STACK_EXPERTS: rc = apply_stack_experts(r, set); break;
        case OP_UNSTACK_EXPERTS: rc = apply_unstack_experts(r, set); break;
        case OP_FUSE_QKV_GQA: rc = apply_fuse_qkv_gqa(r, set); break;
        case OP_LORA_MERGE: rc = apply_lora_merge(r, set, res); break;
        default: rc = ckpt_error_set(CKPT_EINVAL, "rule %zu: unknown op", r->index);
        }
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

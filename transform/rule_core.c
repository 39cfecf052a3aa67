/*
 * rule_core.c — what every rule op uses: parsing a rule's fields, errors that
 * name the rule, matching names against its pattern, and the helpers on
 * tensors that several ops share (see rules_internal.h).
 */
#include "transform/rules_internal.h"

#include "common/error.h"
#include "common/json.h"
#include "common/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rule_err(const rule *r, int code, const char *fmt, ...)
{
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ckpt_error_set(code, "rule %zu (%s): %s", r->index, r->def->name, msg);
}

int rule_parse_int(rule *r, const char *key, int64_t *out, int64_t dflt, int64_t min, int64_t max)
{
    *out = dflt;
    char what[64];
    snprintf(what, sizeof what, "rule %zu (%s)", r->index, r->def->name);
    int rc = cj_int_opt(r->json, key, out, what);
    if (rc) return rc;
    if (*out < min || *out > max)
        return rule_err(r, CKPT_EINVAL, "'%s' is %lld, must be between %lld and %lld", key,
                        (long long)*out, (long long)min, (long long)max);
    return 0;
}

int rule_parse_str(rule *r, const char *key, const char **out, const char *dflt, bool required)
{
    *out = dflt;
    char what[64];
    snprintf(what, sizeof what, "rule %zu (%s)", r->index, r->def->name);
    int rc = required ? cj_str(r->json, key, out, what) : cj_str_opt(r->json, key, out, what);
    if (rc) return rc;
    if (*out && strlen(*out) > RULE_NAME_MAX) return rule_err(r, CKPT_ELIMIT, "'%s' is too long", key);
    return 0;
}

int rule_parse_bool(rule *r, const char *key, bool *out, bool dflt)
{
    *out = dflt;
    char what[64];
    snprintf(what, sizeof what, "rule %zu (%s)", r->index, r->def->name);
    return cj_bool_opt(r->json, key, out, what);
}

int rule_parse_members(rule *r)
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

int rule_check_tp(const rule *r, int doc_tp)
{
    if (r->tp != doc_tp && r->tp != 1)
        return rule_err(r, CKPT_EINVAL, "tp %lld differs from the document's tp %d", (long long)r->tp, doc_tp);
    return 0;
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
char *rule_subst(const rule *r, matcher *m, const char *name, const char *repl, bool replacement_only)
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
void rules_remove_flagged(plan_set *s, const bool *gone)
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
    rules_remove_flagged(s, all);
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

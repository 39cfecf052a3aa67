/*
 * rule_basic.c — the ops on one tensor at a time: rename, drop, cast,
 * transpose, tp_split (docs/rules.md). Each is a parse_<op> and a
 * rule_apply_<op>, one row of the op table in rules.c.
 */
#include "transform/rules_internal.h"

#include "common/error.h"
#include "common/json.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- parsing ---- */

int parse_rename(rule *r, int doc_tp)
{
    return rule_parse_str(r, "replacement", &r->replacement, NULL, true);
}

int parse_drop(rule *r, int doc_tp)
{
    return 0;
}

int parse_cast(rule *r, int doc_tp)
{
    int rc = 0;
    const char *dt;
    if ((rc = rule_parse_str(r, "dtype", &dt, NULL, true))) return rc;
    if (ckpt_dtype_from_name(dt, &r->dtype) < 0 || !ckpt_dtype_is_castable_float(r->dtype))
        return rule_err(r, CKPT_EINVAL, "dtype '%s' is not one of bf16, f16, f32, f64", dt);
    return 0;
}

int parse_transpose(rule *r, int doc_tp)
{
    r->dims[0] = -2;
    r->dims[1] = -1;
    json_t *d = json_object_get(r->json, "dims");
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
    return rule_parse_str(r, "replacement", &r->replacement, NULL, false);
}

int parse_tp_split(rule *r, int doc_tp)
{
    int rc = 0;
    if ((rc = rule_parse_int(r, "tp", &r->tp, doc_tp, 1, PLAN_MAX_TP)) ||
        (rc = rule_parse_int(r, "axis", &r->axis, 0, -PLAN_MAX_DIM, PLAN_MAX_DIM - 1)) ||
        (rc = rule_parse_int(r, "pad_multiple", &r->pad_multiple, r->tp, 1, 1 << 30)) ||
        (rc = rule_parse_int(r, "stride", &r->stride, 1, 1, 1 << 20)))
        return rc;
    return rule_check_tp(r, doc_tp);
}

/* ---- ops ---- */

int rule_apply_rename(const rule *r, plan_set *s, rules_result *res)
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

int rule_apply_drop(const rule *r, plan_set *s, rules_result *res)
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
    if (!rc) rules_remove_flagged(s, gone);
    free(gone);
    matcher_free(&m);
    return rc;
}

static bool cast_is_lossy(ckpt_dtype from, ckpt_dtype to)
{
    return ckpt_dtype_bits(to) < ckpt_dtype_bits(from) || (from == CKPT_DT_BF16 && to == CKPT_DT_F16) ||
           (from == CKPT_DT_F16 && to == CKPT_DT_BF16);
}

int rule_apply_cast(const rule *r, plan_set *s, rules_result *res)
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

int rule_apply_transpose(const rule *r, plan_set *s, rules_result *res)
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

int rule_apply_tp_split(const rule *r, plan_set *s, rules_result *res)
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

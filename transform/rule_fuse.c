/*
 * rule_fuse.c — the ops that turn a group of tensors into one and back:
 * fuse (members concatenated, optionally split for tensor parallelism),
 * stack_experts and unstack_experts (docs/rules.md).
 */
#include "transform/rules_internal.h"

#include "common/error.h"
#include "common/json.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- parsing ---- */

int parse_fuse(rule *r, int doc_tp)
{
    int rc = 0;
    if ((rc = rule_parse_members(r)) || (rc = rule_parse_str(r, "output", &r->replacement, NULL, true)) ||
        (rc = rule_parse_int(r, "member_group", &r->group, 2, 1, 99)) ||
        (rc = rule_parse_int(r, "axis", &r->axis, 0, -PLAN_MAX_DIM, PLAN_MAX_DIM - 1)) ||
        (rc = rule_parse_int(r, "tp", &r->tp, 1, 1, PLAN_MAX_TP)) ||
        (rc = rule_parse_int(r, "pad_multiple", &r->pad_multiple, r->tp, 1, 1 << 30)))
        return rc;
    return rule_check_tp(r, doc_tp);
}

int parse_stack_experts(rule *r, int doc_tp)
{
    int rc = 0;
    if ((rc = rule_parse_str(r, "output", &r->replacement, NULL, true)) ||
        (rc = rule_parse_int(r, "expert_group", &r->group, 2, 1, 99)) ||
        (rc = rule_parse_int(r, "num_experts", &r->num_experts, 0, 0, RULE_MAX_EXPERTS)) ||
        (rc = rule_parse_bool(r, "transpose_last2", &r->transpose_last2, false)))
        return rc;
    return 0;
}

int parse_unstack_experts(rule *r, int doc_tp)
{
    int rc = 0;
    if ((rc = rule_parse_str(r, "output", &r->replacement, NULL, true)) ||
        (rc = rule_parse_bool(r, "transpose_last2", &r->transpose_last2, false)))
        return rc;
    if (!strstr(r->replacement, "{e}"))
        return rule_err(r, CKPT_EINVAL, "'output' must contain {e} (the expert number)");
    return 0;
}

/* ---- applying ---- */

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

int rule_apply_fuse(const rule *r, plan_set *s, rules_result *res)
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

int rule_apply_stack_experts(const rule *r, plan_set *s, rules_result *res)
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

int rule_apply_unstack_experts(const rule *r, plan_set *s, rules_result *res)
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

/*
 * rule_lora.c — the lora_merge rule: merge a PEFT LoRA adapter into the
 * weights it targets as the first step of a layout (docs/rules.md).
 *
 *   {"op": "lora_merge", "adapter": "PATH", "scale": 1.0, "unmerge": false}
 *
 * The adapter is opened (config and header, checked) when the rule is
 * parsed, so a missing or broken adapter fails before anything else. Applying
 * the rule reads no bytes either: each weight it targets must still be a
 * whole source tensor (merging happens before the layout slices, fuses or
 * casts it), and is recorded in rules_result.merges. The planner then turns
 * each recorded source into a computed one (lora_rule.h), and every later
 * rule — fuse, tp_split, GQA head selection, padding — moves the merged
 * bytes exactly as it would have moved the original ones.
 */
#include "lora/lora.h"
#include "transform/rules_internal.h"

#include "common/error.h"
#include "common/json.h"
#include "common/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int parse_lora_merge(rule *r, int doc_tp)
{
    char what[64];
    snprintf(what, sizeof what, "rule %zu (%s)", r->index, r->def->name);
    json_t *a = json_object_get(r->json, "adapter");
    if (!a) return rule_err(r, CKPT_EINVAL, "missing 'adapter' (the PEFT adapter folder to merge)");
    if (!json_is_string(a) || !json_string_length(a) || json_string_length(a) > RULE_NAME_MAX)
        return rule_err(r, CKPT_EINVAL, "'adapter' must be the path of a PEFT adapter folder");
    r->adapter_path = json_string_value(a);
    int rc;
    json_t *sc = json_object_get(r->json, "scale");
    r->lora_scale = 1.0;
    if (sc) {
        if (!json_is_number(sc) || !isfinite(json_number_value(sc)) || json_number_value(sc) == 0)
            return rule_err(r, CKPT_EINVAL, "'scale' must be a finite, non-zero number");
        r->lora_scale = json_number_value(sc);
    }
    if ((rc = cj_bool_opt(r->json, "unmerge", &r->unmerge, what))) return rc;
    if (!(r->adapter = ckpt_malloc(sizeof *r->adapter))) return CKPT_ENOMEM;
    rc = lora_adapter_open(r->adapter, r->adapter_path);
    if (rc) {
        free(r->adapter);
        r->adapter = NULL;
        return ckpt_error_prefix(rc, "rule %zu (%s): adapter '%s'", r->index, r->def->name,
                                 r->adapter_path);
    }
    return 0;
}

void free_lora_merge(rule *r)
{
    if (!r->adapter) return;
    lora_adapter_free(r->adapter);
    free(r->adapter);
    r->adapter = NULL;
}

/* A tensor that is one whole source tensor, untouched: one part covering
 * it from the source's origin with the axes in order. (The planner checks
 * the source's dtype and shape against it.) */
static bool is_whole(const plan_tensor *t)
{
    if (t->nparts != 1 || t->parts[0].src == PLAN_ZERO) return false;
    const plan_part *p = &t->parts[0];
    for (int k = 0; k < t->ndim; k++)
        if (p->axis_map[k] != k || p->src_lo[k] || p->lo[k] || p->ext[k] != t->shape[k])
            return false;
    return true;
}

/* The adapter module of "<module>.weight", or NULL. */
static const lora_module *module_of(const lora_adapter *ad, const char *name)
{
    size_t n = strlen(name);
    if (n <= 7 || strcmp(name + n - 7, ".weight")) return NULL;
    char *mod = ckpt_strndup(name, n - 7);
    const lora_module *m = mod ? lora_adapter_find(ad, mod) : NULL;
    free(mod);
    return m;
}

static int record(const rule *r, const plan_tensor *t, const lora_module *m, rules_result *res)
{
    int rc = ckpt_grow(&res->merges, &res->merges_cap, res->nmerges + 1, sizeof *res->merges);
    if (rc) return rc;
    rules_merge *g = &res->merges[res->nmerges];
    *g = (rules_merge){.rule = r->index,
                       .src = t->parts[0].src,
                       .adapter = r->adapter,
                       .module = (size_t)(m - r->adapter->mods),
                       .scale = r->lora_scale,
                       .unmerge = r->unmerge,
                       .dtype = t->dtype,
                       .ndim = t->ndim};
    memcpy(g->shape, t->shape, (size_t)t->ndim * sizeof *t->shape);
    if (!(g->tensor = ckpt_strdup(t->name))) return CKPT_ENOMEM;
    res->nmerges++;
    return 0;
}

int rule_apply_lora_merge(const rule *r, plan_set *s, rules_result *res)
{
    const lora_adapter *ad = r->adapter;
    bool *done = ckpt_calloc(ad->nmods + 1, sizeof *done);
    matcher mt;
    int rc = done ? matcher_init(&mt, r) : CKPT_ENOMEM;
    size_t merged = 0;
    for (size_t i = 0; !rc && i < s->n; i++) {
        plan_tensor *t = &s->t[i];
        const lora_module *m = module_of(ad, t->name);
        if (!m) continue;
        int hit = rule_match(r, &mt, t->name);
        if (hit <= 0) {
            rc = hit;
            continue;
        }
        if ((rc = require_unsharded(r, t))) break;
        if (!is_whole(t)) {
            rc = rule_err(
                r, CKPT_EINVAL,
                "tensor '%s' was reshaped by an earlier rule; lora_merge applies to whole source "
                "weights, so put it before the layout's rules",
                t->name);
            break;
        }
        if ((rc = lora_check_weight(ad, m, t->name, t->dtype, t->ndim, t->shape))) {
            ckpt_error_prefix(rc, "rule %zu (%s)", r->index, r->def->name);
            break;
        }
        done[m - ad->mods] = true;
        merged++;
        rc = record(r, t, m, res);
        if (!rc) rc = plan_tensor_note(t, rule_desc(r));
    }
    /* Every module the pattern lets in must have found its weight. */
    for (size_t k = 0; !rc && k < ad->nmods; k++) {
        if (done[k]) continue;
        char *w = ckpt_sprintf("%s.weight", ad->mods[k].module);
        int hit = w ? rule_match(r, &mt, w) : CKPT_ENOMEM;
        if (hit > 0)
            rc = rule_err(r, CKPT_EINVAL,
                          "adapter module '%s' has no tensor '%s' to merge into (not in the base, "
                          "or renamed, "
                          "fused or dropped by an earlier rule: put lora_merge first)",
                          ad->mods[k].module, w);
        else if (hit < 0)
            rc = hit;
        free(w);
    }
    if (!rc && merged == 0)
        rc = rule_err(r, CKPT_EINVAL,
                      "pattern '%s' matches none of the adapter's %zu weights: nothing to merge",
                      r->pattern, ad->nmods);
    if (done) matcher_free(&mt);
    free(done);
    return rc;
}

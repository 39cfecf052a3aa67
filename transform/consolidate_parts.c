/*
 * consolidate_parts.c — inverting stored parts into original tensors, and
 * checking that the parts cover each original exactly once (consolidate.h,
 * docs/transforms.md §8).
 */
#include "transform/consolidate.h"

#include "common/error.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool same_box(const plan_part *a, const plan_part *b, int ndim)
{
    for (int k = 0; k < ndim; k++)
        if (a->lo[k] != b->lo[k] || a->ext[k] != b->ext[k]) return false;
    return true;
}

int consolidate_add_inverse(plan_tensor *orig, const plan_part *p, int stored_ndim, int32_t src_index, const char *holder,
                            const char *what)
{
    plan_part inv;
    memset(&inv, 0, sizeof inv);
    inv.src = src_index;
    for (int a = 0; a < orig->ndim; a++) {
        inv.axis_map[a] = -1;
        inv.lo[a] = p->src_lo[a];
        inv.ext[a] = 1;
    }
    for (int k = 0; k < stored_ndim; k++) {
        inv.src_lo[k] = p->lo[k];
        int a = p->axis_map[k];
        if (a < 0) continue;
        inv.axis_map[a] = (int8_t)k;
        inv.ext[a] = p->ext[k];
    }
    for (int a = 0; a < orig->ndim; a++)
        if (inv.lo[a] + inv.ext[a] > orig->shape[a])
            return ckpt_error_set(CKPT_EINVAL, "%s: a part of '%s' lies outside the original tensor", what, orig->name);
    for (size_t i = 0; i < orig->nparts; i++) {
        if (!same_box(&orig->parts[i], &inv, orig->ndim)) continue;
        int rc = ckpt_grow(&orig->checks, &orig->checks_cap, orig->nchecks + 1, sizeof *orig->checks);
        if (rc) return rc;
        struct plan_check *ck = &orig->checks[orig->nchecks];
        ck->primary = orig->parts[i];
        ck->dup = inv;
        if (!(ck->what = ckpt_strdup(holder))) return CKPT_ENOMEM;
        orig->nchecks++;
        return 0;
    }
    return plan_tensor_add_part(orig, &inv);
}

static int cmp_part_lo0(const void *a, const void *b, void *arg)
{
    const plan_tensor *t = arg;
    const plan_part *pa = &t->parts[*(const size_t *)a], *pb = &t->parts[*(const size_t *)b];
    return pa->lo[0] < pb->lo[0] ? -1 : pa->lo[0] > pb->lo[0];
}

static bool boxes_meet(const plan_part *a, const plan_part *b, int ndim)
{
    for (int k = 0; k < ndim; k++)
        if (a->lo[k] >= b->lo[k] + b->ext[k] || b->lo[k] >= a->lo[k] + a->ext[k]) return false;
    return true;
}

/* The parts of an original tensor do not overlap: with their element counts
 * summing to the tensor's (consolidate_check_tensor), they then cover it
 * exactly. A sweep along axis 0 compares only parts whose rows meet. */
#define OVERLAP_MAX_COMPARES 100000000ULL
static int check_disjoint(const plan_tensor *t, const char *what)
{
    if (t->nparts < 2) return 0;
    if (t->ndim == 0)
        return ckpt_error_set(CKPT_EINVAL, "%s: the shards hold scalar '%s' more than once in different places", what,
                              t->name);
    size_t *order = ckpt_calloc(t->nparts, sizeof *order);
    if (!order) return CKPT_ENOMEM;
    for (size_t i = 0; i < t->nparts; i++) order[i] = i;
    qsort_r(order, t->nparts, sizeof *order, cmp_part_lo0, (void *)t);
    int rc = 0;
    uint64_t compares = 0;
    for (size_t i = 0; !rc && i < t->nparts; i++) {
        const plan_part *a = &t->parts[order[i]];
        for (size_t j = i + 1; !rc && j < t->nparts; j++) {
            const plan_part *b = &t->parts[order[j]];
            if (b->lo[0] >= a->lo[0] + a->ext[0]) break;
            if (++compares > OVERLAP_MAX_COMPARES)
                rc = ckpt_error_set(CKPT_ELIMIT, "%s: '%s' has too many overlapping parts", what, t->name);
            else if (boxes_meet(a, b, t->ndim)) {
                char la[160], lb[160];
                rc = ckpt_error_set(CKPT_EINVAL,
                                    "%s: two parts of '%s' overlap (at %s and %s): the layout metadata is damaged",
                                    what, t->name, plan_shape_str(t->ndim, a->lo, la, sizeof la),
                                    plan_shape_str(t->ndim, b->lo, lb, sizeof lb));
            }
        }
    }
    free(order);
    return rc;
}

int consolidate_check_tensor(const plan_tensor *t, const char *what)
{
    int rc = check_disjoint(t, what);
    if (rc) return rc;
    uint64_t covered = 0, numel = plan_tensor_numel(t);
    for (size_t j = 0; j < t->nparts; j++) {
        uint64_t v = 1;
        for (int k = 0; k < t->ndim; k++) v *= t->parts[j].ext[k];
        covered += v;
    }
    if (covered != numel)
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: the shards hold %llu of the %llu elements of '%s' (dropped by the rules, or the "
                              "layout metadata is damaged)",
                              what, (unsigned long long)covered, (unsigned long long)numel, t->name);
    return 0;
}

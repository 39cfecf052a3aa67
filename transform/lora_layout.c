/*
 * lora_layout.c — a LoRA adapter carried into a base's layout (see lora.h).
 *
 * The base's plan (convert_plan_build: headers and config.json only) says,
 * for every output weight T, which boxes of which source weights it holds.
 * The adapter follows T part by part. For a weight made by slicing, padding
 * and fusing along the output axis (column parallel, fused Q/K/V and
 * gate/up, the GQA head order of docs/transforms.md §4 with KV replicas), every part of an
 * adapted member m is whole along the input axis, so
 *   A_T = [A_m1; A_m2; ...]          members in order of first appearance,
 *                                      rank R = r_1 + r_2 + ..., replicated
 *   B_T[rows of a part of m, block of m] = B_m[the part's source rows, :]
 * and zeros elsewhere: B_T is block-diagonal in T's row order, padding rows
 * and rows of members without an adapter are zero. For a weight split along
 * the input axis (row parallel o_proj, down_proj, and the GQA column order of
 * o_proj), every part of m is whole along the output axis, so
 *   A_T[block of m, columns of a part] = A_m[:, the part's source columns]
 *   B_T = [B_m1, B_m2, ...]           replicated
 * Either way B_T @ A_T is exactly T's layout applied to the members' updates
 * B_m @ A_m, and all of it is zero parts and boxes of A_m and B_m, so the
 * executor writes it and consolidation inverts it like any layout.
 *
 * Each A_T and B_T identical on every rank is stored once for all ranks.
 * Names: T = "<module'>.<param>" gives base_model.model.<module'>.lora_A.weight
 * and .lora_B.weight. adapter_config.json names the converted modules, and
 * rank_pattern/alpha_pattern keep each module's scale alpha/r (alpha/sqrt(r)).
 */
#include "lora/lora.h"
#include "transform/lora_plan.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "transform/layout_meta.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MEMBERS 64

typedef struct {
    lora_adapter ad;
    convert_plan bp;  /* the base's plan */
    long *src_mod;    /* per base source: adapter module index or -1 */
    exec_plan ex;     /* sources: the adapter's tensors */
    size_t first_src; /* index of the adapter's first tensor in ex.sources */
    plan_set set;     /* the converted adapter's tensors */
    json_t *modules;  /* converted module name -> {"members": [...], "rank": R, "scale": s} */
    char **folder_dirs;
    char **index_texts;
} lora_conv;

/* The weights of one output name across ranks, and how the adapter follows them. */
typedef struct {
    const char *name;
    size_t *tensors; /* indexes into bp.set */
    size_t ntensors;
    long members[MAX_MEMBERS]; /* adapter module indexes, in order of first appearance */
    uint64_t offset[MAX_MEMBERS];
    size_t nmembers;
    uint64_t R;
    bool row_split; /* false: A replicated, B follows rows; true: B replicated, A follows columns */
    char *module;   /* converted module name */
} follow;

static long part_member(const lora_conv *c, const plan_part *p)
{
    return p->src == PLAN_ZERO ? -1 : c->src_mod[p->src];
}

static int member_slot(const follow *f, long mod)
{
    for (size_t i = 0; i < f->nmembers; i++)
        if (f->members[i] == mod) return (int)i;
    return -1;
}

/* Gathers the members of f over its tensors and decides how A and B follow. */
static int follow_plan(lora_conv *c, follow *f)
{
    bool whole_in = true, whole_out = true;
    for (size_t k = 0; k < f->ntensors; k++) {
        const plan_tensor *t = &c->bp.set.t[f->tensors[k]];
        for (size_t i = 0; i < t->nparts; i++) {
            const plan_part *p = &t->parts[i];
            long mod = part_member(c, p);
            if (mod < 0) continue;
            const plan_source *s = &c->bp.exec.sources[p->src];
            if (t->ndim != 2 || p->axis_map[0] != 0 || p->axis_map[1] != 1)
                return ckpt_error_set(
                    CKPT_EINVAL,
                    "the layout puts '%s' into '%s' transposed or stacked; adapters follow layouts "
                    "that slice, pad and fuse [out, in] weights",
                    s->name, t->name);
            whole_in &= p->src_lo[1] == 0 && p->ext[1] == s->shape[1] && t->shape[1] == s->shape[1];
            whole_out &=
                p->src_lo[0] == 0 && p->ext[0] == s->shape[0] && t->shape[0] == s->shape[0];
            if (member_slot(f, mod) >= 0) continue;
            if (f->nmembers == MAX_MEMBERS)
                return ckpt_error_set(CKPT_ELIMIT, "'%s' fuses more than %d adapted weights",
                                      t->name, MAX_MEMBERS);
            f->members[f->nmembers++] = mod;
        }
    }
    if (!whole_in && !whole_out)
        return ckpt_error_set(
            CKPT_EINVAL,
            "the layout cuts the weights of '%s' along both axes; an adapter cannot follow it",
            f->name);
    f->row_split = !whole_in;
    const lora_module *m0 = &c->ad.mods[f->members[0]];
    for (size_t i = 0; i < f->nmembers; i++) {
        const lora_module *m = &c->ad.mods[f->members[i]];
        f->offset[i] = f->R;
        f->R += m->rank;
        if (m->a->dtype != m0->a->dtype || m->b->dtype != m0->b->dtype)
            return ckpt_error_set(CKPT_EINVAL,
                                  "'%s' fuses '%s' and '%s', whose adapter weights differ in dtype",
                                  f->name, m0->module, m->module);
        if (fabs(m->scale - m0->scale) > 1e-12 * fabs(m0->scale))
            return ckpt_error_set(
                CKPT_EINVAL,
                "'%s' fuses '%s' (scale %g) and '%s' (scale %g); one fused adapter has one scale",
                f->name, m0->module, m0->scale, m->module, m->scale);
    }
    const char *dot = strrchr(f->name, '.');
    if (!dot || dot == f->name)
        return ckpt_error_set(
            CKPT_EINVAL, "output weight '%s' has no module name to hang an adapter on", f->name);
    f->module = ckpt_strndup(f->name, (size_t)(dot - f->name));
    return f->module ? 0 : CKPT_ENOMEM;
}

static int new_tensor(plan_tensor *t, const char *module, const char *which, int rank,
                      ckpt_dtype dt, uint64_t d0, uint64_t d1)
{
    memset(t, 0, sizeof *t);
    t->name = ckpt_sprintf("%s%s.%s.weight", LORA_NAME_PREFIX, module, which);
    t->rank = rank;
    t->dtype = dt;
    t->ndim = 2;
    t->shape[0] = d0;
    t->shape[1] = d1;
    return t->name ? 0 : CKPT_ENOMEM;
}

static int add_box(plan_tensor *t, int32_t src, uint64_t slo0, uint64_t slo1, uint64_t lo0,
                   uint64_t lo1, uint64_t e0, uint64_t e1)
{
    if (e0 == 0 || e1 == 0) return 0;
    uint64_t lo[PLAN_MAX_DIM] = {lo0, lo1}, ext[PLAN_MAX_DIM] = {e0, e1};
    if (src == PLAN_ZERO) return plan_tensor_add_zero(t, lo, ext);
    plan_part p;
    memset(&p, 0, sizeof p);
    p.src = src;
    p.axis_map[0] = 0;
    p.axis_map[1] = 1;
    p.src_lo[0] = slo0;
    p.src_lo[1] = slo1;
    p.lo[0] = lo0;
    p.lo[1] = lo1;
    p.ext[0] = e0;
    p.ext[1] = e1;
    return plan_tensor_add_part(t, &p);
}

typedef struct {
    uint64_t lo, len;
} span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* Adds zero boxes over [0, total) of axis `axis` outside spans (sorted, disjoint);
 * the other axis covers [other_lo, other_lo + other_len). */
static int fill_gaps(plan_tensor *t, span *spans, size_t n, uint64_t total, int axis,
                     uint64_t other_lo, uint64_t other_len)
{
    qsort(spans, n, sizeof *spans, cmp_span);
    uint64_t at = 0;
    int rc = 0;
    for (size_t i = 0; i <= n && !rc; i++) {
        uint64_t next = i < n ? spans[i].lo : total;
        if (next > at) {
            rc = axis == 0 ? add_box(t, PLAN_ZERO, 0, 0, at, other_lo, next - at, other_len)
                           : add_box(t, PLAN_ZERO, 0, 0, other_lo, at, other_len, next - at);
        }
        if (i < n) at = spans[i].lo + spans[i].len;
    }
    return rc;
}

/* B_T for one rank tensor t of a column-following weight: block-diagonal rows. */
static int build_rows_b(lora_conv *c, const follow *f, const plan_tensor *t, plan_tensor *b)
{
    span *spans = ckpt_calloc(t->nparts + 1, sizeof *spans);
    if (!spans) return CKPT_ENOMEM;
    size_t n = 0;
    int rc = 0;
    for (size_t i = 0; i < t->nparts && !rc; i++) {
        const plan_part *p = &t->parts[i];
        long mod = part_member(c, p);
        if (mod < 0) continue;
        int k = member_slot(f, mod);
        const lora_module *m = &c->ad.mods[mod];
        int32_t bsrc = (int32_t)(c->first_src + (size_t)m->b_index);
        uint64_t off = f->offset[k], r = m->rank;
        rc = add_box(b, PLAN_ZERO, 0, 0, p->lo[0], 0, p->ext[0], off);
        if (!rc) rc = add_box(b, bsrc, p->src_lo[0], 0, p->lo[0], off, p->ext[0], r);
        if (!rc) rc = add_box(b, PLAN_ZERO, 0, 0, p->lo[0], off + r, p->ext[0], f->R - off - r);
        spans[n++] = (span){p->lo[0], p->ext[0]};
    }
    if (!rc) rc = fill_gaps(b, spans, n, t->shape[0], 0, 0, f->R);
    free(spans);
    return rc;
}

/* A_T for one rank tensor t of a row-following weight: each member's block
 * of rank rows holds its columns where t has them. */
static int build_cols_a(lora_conv *c, const follow *f, const plan_tensor *t, plan_tensor *a)
{
    span *spans = ckpt_calloc(t->nparts + 1, sizeof *spans);
    if (!spans) return CKPT_ENOMEM;
    int rc = 0;
    for (size_t k = 0; k < f->nmembers && !rc; k++) {
        const lora_module *m = &c->ad.mods[f->members[k]];
        int32_t asrc = (int32_t)(c->first_src + (size_t)m->a_index);
        size_t n = 0;
        for (size_t i = 0; i < t->nparts && !rc; i++) {
            const plan_part *p = &t->parts[i];
            if (part_member(c, p) != f->members[k]) continue;
            rc = add_box(a, asrc, 0, p->src_lo[1], f->offset[k], p->lo[1], m->rank, p->ext[1]);
            spans[n++] = (span){p->lo[1], p->ext[1]};
        }
        if (!rc) rc = fill_gaps(a, spans, n, t->shape[1], 1, f->offset[k], m->rank);
    }
    free(spans);
    return rc;
}

/* The replicated factor: the members' whole A stacked (rows) or B side by side (columns). */
static int build_whole(lora_conv *c, const follow *f, plan_tensor *out, bool a_side)
{
    int rc = 0;
    for (size_t k = 0; k < f->nmembers && !rc; k++) {
        const lora_module *m = &c->ad.mods[f->members[k]];
        const st_tensor *s = a_side ? m->a : m->b;
        int32_t src = (int32_t)(c->first_src + (size_t)(a_side ? m->a_index : m->b_index));
        rc = a_side ? add_box(out, src, 0, 0, f->offset[k], 0, m->rank, s->shape[1])
                    : add_box(out, src, 0, 0, 0, f->offset[k], s->shape[0], m->rank);
    }
    return rc;
}

static json_t *lora_meta(const lora_conv *c, const follow *f, const plan_tensor *t,
                         const char *role, bool split)
{
    json_t *members = json_array(), *ranks = json_array();
    for (size_t k = 0; k < f->nmembers; k++) {
        const lora_module *m = &c->ad.mods[f->members[k]];
        json_array_append_new(members, json_string(m->module));
        json_array_append_new(ranks, json_integer((json_int_t)m->rank));
    }
    json_t *j = json_pack("{s:s,s:s,s:o,s:o,s:s,s:b}", "role", role, "weight", t->name, "members",
                          members, "member_ranks", ranks, "follows",
                          f->row_split ? "input axis" : "output axis", "split", split);
    if (j && t->meta) {
        const char *keys[] = {"fused", "gqa", "padding", "partition_dim", "num_partitions"};
        json_t *base = json_object();
        for (size_t i = 0; base && i < CKPT_ARRAY_LEN(keys); i++) {
            json_t *v = json_object_get(t->meta, keys[i]);
            if (v) json_object_set(base, keys[i], v);
        }
        json_object_set_new(j, "base", base);
    }
    return j;
}

/* Sets the metadata of an adapter tensor made for rank tensor t. */
static int note(plan_tensor *x, const lora_conv *c, const follow *f, const plan_tensor *t,
                const char *role, bool split, int axis)
{
    x->meta = json_object();
    if (!x->meta) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    json_t *desc = json_pack("{s:s,s:s}", "op", "lora_follow", "weight", t->name);
    int rc = plan_tensor_note(x, desc);
    if (!rc && json_object_set_new(x->meta, "lora", lora_meta(c, f, t, role, split)))
        rc = ckpt_error_set(CKPT_ENOMEM, "out of memory");
    if (!rc && split && t->rank != PLAN_ALL_RANKS) {
        json_t *stride = t->meta ? json_object_get(t->meta, "partition_stride") : NULL;
        json_object_set_new(x->meta, "tensor_model_parallel", json_true());
        json_object_set_new(x->meta, "partition_dim", json_integer(axis));
        json_object_set_new(x->meta, "partition_stride",
                            stride ? json_incref(stride) : json_integer(1));
        json_object_set_new(x->meta, "num_partitions", json_integer(c->bp.tp));
    }
    return rc;
}

static int build_rank(lora_conv *c, const follow *f, const plan_tensor *t)
{
    const lora_module *m0 = &c->ad.mods[f->members[0]];
    plan_tensor a, b;
    int rc = new_tensor(&a, f->module, "lora_A", t->rank, m0->a->dtype, f->R,
                        f->row_split ? t->shape[1] : m0->a->shape[1]);
    if (!rc)
        rc = new_tensor(&b, f->module, "lora_B", t->rank, m0->b->dtype,
                        f->row_split ? m0->b->shape[0] : t->shape[0], f->R);
    else
        memset(&b, 0, sizeof b);
    if (!rc) rc = f->row_split ? build_cols_a(c, f, t, &a) : build_whole(c, f, &a, true);
    if (!rc) rc = f->row_split ? build_whole(c, f, &b, false) : build_rows_b(c, f, t, &b);
    if (!rc) rc = note(&a, c, f, t, "lora_A", f->row_split, 1);
    if (!rc) rc = note(&b, c, f, t, "lora_B", !f->row_split, 0);
    if (!rc) {
        plan_tensor_coalesce(&a);
        plan_tensor_coalesce(&b);
        rc = plan_set_push(&c->set, &a);
        if (!rc)
            rc = plan_set_push(&c->set, &b);
        else
            plan_tensor_free(&b);
    } else {
        plan_tensor_free(&a);
        plan_tensor_free(&b);
    }
    return rc;
}

static bool parts_equal(const plan_tensor *x, const plan_tensor *y)
{
    if (x->nparts != y->nparts || x->ndim != y->ndim || memcmp(x->shape, y->shape, sizeof x->shape))
        return false;
    for (size_t i = 0; i < x->nparts; i++) {
        const plan_part *p = &x->parts[i], *q = &y->parts[i];
        if (p->src != q->src) return false;
        for (int k = 0; k < x->ndim; k++)
            if (p->lo[k] != q->lo[k] || p->ext[k] != q->ext[k] || p->axis_map[k] != q->axis_map[k])
                return false;
        for (int k = 0; k < PLAN_MAX_DIM; k++)
            if (p->src_lo[k] != q->src_lo[k]) return false;
    }
    return true;
}

/* Replaces the per-rank copies of a tensor that are the same on every rank
 * by one tensor all ranks hold. */
static int collapse_replicas(lora_conv *c)
{
    int tp = c->bp.tp;
    if (tp <= 1) return 0;
    bool *gone = ckpt_calloc(c->set.n + 1, sizeof *gone);
    size_t *idx = ckpt_calloc((size_t)tp + 1, sizeof *idx);
    if (!gone || !idx) {
        free(gone);
        free(idx);
        return CKPT_ENOMEM;
    }
    for (size_t i = 0; i < c->set.n; i++) {
        plan_tensor *t = &c->set.t[i];
        if (gone[i] || t->rank != 0) continue;
        size_t n = 0;
        bool same = true;
        for (size_t j = i; j < c->set.n && same; j++) {
            const plan_tensor *u = &c->set.t[j];
            if (u->rank == PLAN_ALL_RANKS || strcmp(u->name, t->name)) continue;
            same = parts_equal(t, u) && n < (size_t)tp;
            if (same) idx[n++] = j;
        }
        if (!same || n != (size_t)tp) continue;
        t->rank = PLAN_ALL_RANKS;
        for (size_t k = 1; k < n; k++)
            gone[idx[k]] = true;
    }
    size_t w = 0;
    for (size_t i = 0; i < c->set.n; i++) {
        if (gone[i])
            plan_tensor_free(&c->set.t[i]);
        else
            c->set.t[w++] = c->set.t[i];
    }
    c->set.n = w;
    free(gone);
    free(idx);
    return 0;
}

static int cmp_name_rank(const void *x, const void *y, void *ctx)
{
    const plan_set *set = ctx;
    const plan_tensor *a = &set->t[*(const size_t *)x], *b = &set->t[*(const size_t *)y];
    int cmp = strcmp(a->name, b->name);
    return cmp ? cmp : (a->rank > b->rank) - (a->rank < b->rank);
}

/* Every converted adapter tensor appears once per rank. */
static int check_unique(const lora_conv *c)
{
    size_t *idx = ckpt_calloc(c->set.n + 1, sizeof *idx);
    if (!idx) return CKPT_ENOMEM;
    for (size_t i = 0; i < c->set.n; i++)
        idx[i] = i;
    qsort_r(idx, c->set.n, sizeof *idx, cmp_name_rank, (void *)&c->set);
    int rc = 0;
    for (size_t i = 1; i < c->set.n && !rc; i++) {
        const plan_tensor *x = &c->set.t[idx[i - 1]], *y = &c->set.t[idx[i]];
        if (!strcmp(x->name, y->name) && (x->rank == y->rank || x->rank == PLAN_ALL_RANKS))
            rc = ckpt_error_set(
                CKPT_EINVAL, "two converted weights would give the adapter tensor '%s'", x->name);
    }
    free(idx);
    return rc;
}

static int record_module(lora_conv *c, const follow *f)
{
    const lora_module *m0 = &c->ad.mods[f->members[0]];
    json_t *members = json_array();
    for (size_t k = 0; k < f->nmembers; k++)
        json_array_append_new(members, json_string(c->ad.mods[f->members[k]].module));
    json_t *j =
        json_pack("{s:o,s:I,s:f,s:s}", "members", members, "rank", (json_int_t)f->R, "scale",
                  m0->scale, "follows", f->row_split ? "input axis" : "output axis");
    if (!j || json_object_set_new(c->modules, f->module, j))
        return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    return 0;
}

static int follow_all(lora_conv *c)
{
    size_t n = c->bp.set.n;
    bool *seen = ckpt_calloc(n + 1, sizeof *seen);
    size_t *tensors = ckpt_calloc(n + 1, sizeof *tensors);
    bool *used_mod = ckpt_calloc(c->ad.nmods + 1, sizeof *used_mod);
    int rc = seen && tensors && used_mod ? 0 : CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        if (seen[i]) continue;
        const plan_tensor *t = &c->bp.set.t[i];
        bool adapted = false;
        for (size_t p = 0; p < t->nparts && !adapted; p++)
            adapted = part_member(c, &t->parts[p]) >= 0;
        if (!adapted) continue;
        follow f;
        memset(&f, 0, sizeof f);
        f.name = t->name;
        f.tensors = tensors;
        for (size_t j = i; j < n; j++) {
            if (strcmp(c->bp.set.t[j].name, t->name)) continue;
            seen[j] = true;
            tensors[f.ntensors++] = j;
        }
        rc = follow_plan(c, &f);
        for (size_t k = 0; !rc && k < f.ntensors; k++)
            rc = build_rank(c, &f, &c->bp.set.t[f.tensors[k]]);
        if (!rc) rc = record_module(c, &f);
        for (size_t k = 0; k < f.nmembers; k++)
            used_mod[f.members[k]] = true;
        free(f.module);
    }
    for (size_t m = 0; !rc && m < c->ad.nmods; m++)
        if (!used_mod[m])
            rc = ckpt_error_set(CKPT_EINVAL,
                                "the layout %s drops '%s.weight', so its adapter has nowhere to go",
                                c->bp.layout_name, c->ad.mods[m].module);
    free(seen);
    free(tensors);
    free(used_mod);
    if (!rc) rc = collapse_replicas(c);
    if (!rc) rc = check_unique(c);
    return rc;
}

/* ---- output ---- */

static int layout_folders(lora_conv *c)
{
    int tp = c->bp.tp;
    c->folder_dirs = ckpt_calloc((size_t)tp, sizeof *c->folder_dirs);
    c->index_texts = ckpt_calloc((size_t)tp, sizeof *c->index_texts);
    plan_tensor **list = ckpt_calloc(c->set.n + 1, sizeof *list);
    int rc = c->folder_dirs && c->index_texts && list ? 0 : CKPT_ENOMEM;
    for (int r = 0; !rc && r < tp; r++) {
        size_t n = 0;
        for (size_t i = 0; i < c->set.n; i++)
            if (c->set.t[i].rank == PLAN_ALL_RANKS || c->set.t[i].rank == r)
                list[n++] = &c->set.t[i];
        c->folder_dirs[r] = tp > 1 ? ckpt_sprintf("tp_rank_%02d", r) : ckpt_strdup("");
        if (!c->folder_dirs[r]) rc = CKPT_ENOMEM;
        size_t first = c->ex.nfiles;
        if (!rc)
            rc = convert_layout_folder(&c->ex, c->folder_dirs[r], list, n, 0, &c->index_texts[r]);
        /* One file per folder, named as PEFT names it. */
        for (size_t f = first; !rc && f < c->ex.nfiles; f++) {
            exec_file *ef = &c->ex.files[f];
            free(ef->rel);
            ef->rel = tp > 1 ? ckpt_path_join(c->folder_dirs[r], LORA_WEIGHTS_PREFIX ".safetensors")
                             : ckpt_strdup(LORA_WEIGHTS_PREFIX ".safetensors");
            if (!ef->rel) rc = CKPT_ENOMEM;
        }
    }
    free(list);
    return rc;
}

static json_t *number(double v)
{
    return v == floor(v) && fabs(v) < 1e15 ? json_integer((json_int_t)v) : json_real(v);
}

/* adapter_config.json of the converted adapter: target_modules are the
 * converted modules' last names; rank_pattern and alpha_pattern give every
 * module whose rank R differs from r an alpha with alpha'/R = s (or
 * alpha'/sqrt(R) = s with rsLoRA), so PEFT computes the original scale. */
static json_t *converted_config(const lora_conv *c)
{
    json_t *cfg = json_deep_copy(c->ad.config);
    json_t *targets = json_array(), *ranks = json_object(), *alphas = json_object();
    if (!cfg || !targets || !ranks || !alphas) {
        json_decref(cfg);
        json_decref(targets);
        json_decref(ranks);
        json_decref(alphas);
        return NULL;
    }
    /* Leaf names, and per leaf whether every module with it has one (R, alpha). */
    json_t *leaves = json_object();
    const char *mod;
    json_t *info;
    json_object_foreach(c->modules, mod, info)
    {
        const char *dot = strrchr(mod, '.');
        const char *leaf = dot ? dot + 1 : mod;
        int64_t R = json_integer_value(json_object_get(info, "rank"));
        double s = json_real_value(json_object_get(info, "scale"));
        double alpha = c->ad.rslora ? s * sqrt((double)R) : s * (double)R;
        json_t *pair = json_pack("[I,f]", (json_int_t)R, alpha);
        json_t *prev = json_object_get(leaves, leaf);
        if (!prev)
            json_object_set_new(leaves, leaf, pair);
        else {
            if (!json_equal(prev, pair)) json_object_set_new(leaves, leaf, json_null());
            json_decref(pair);
        }
    }
    json_object_foreach(c->modules, mod, info)
    {
        const char *dot = strrchr(mod, '.');
        const char *leaf = dot ? dot + 1 : mod;
        json_t *pair = json_object_get(leaves, leaf);
        int64_t R = json_integer_value(json_object_get(info, "rank"));
        double s = json_real_value(json_object_get(info, "scale"));
        double alpha = c->ad.rslora ? s * sqrt((double)R) : s * (double)R;
        const char *key = json_is_null(pair) ? mod : leaf;
        if (R != c->ad.r) json_object_set_new(ranks, key, json_integer(R));
        if (fabs(alpha - c->ad.alpha) > 1e-12 * fabs(c->ad.alpha))
            json_object_set_new(alphas, key, number(alpha));
    }
    const char *leaf;
    json_t *v;
    json_object_foreach(leaves, leaf, v) json_array_append_new(targets, json_string(leaf));
    json_decref(leaves);
    json_object_set_new(cfg, "target_modules", targets);
    json_object_set_new(cfg, "rank_pattern", ranks);
    json_object_set_new(cfg, "alpha_pattern", alphas);
    return cfg;
}

/* ckpt-layout.json: the generic document of layout_meta.h, plus what makes
 * this an adapter ("kind" and "restore_files", read by lora_consolidate_finish). */
static json_t *layout_document(lora_conv *c, char (*hashes)[65])
{
    convert_plan cp;
    memset(&cp, 0, sizeof cp);
    cp.src = c->ad.ck; /* borrowed: never freed through cp */
    cp.layout_name = c->bp.layout_name;
    cp.tp = c->bp.tp;
    cp.rules = c->bp.rules;
    cp.set = c->set;
    cp.exec = c->ex;
    cp.nfolders = (size_t)c->bp.tp;
    cp.folder_dirs = c->folder_dirs;
    cp.index_texts = c->index_texts;
    json_t *root = layout_meta_build(&cp, hashes, true);
    if (!root) return NULL;
    json_t *adapter = json_pack("{s:s,s:I,s:f,s:b,s:O}", "base_layout", c->bp.layout_name, "r",
                                (json_int_t)c->ad.r, "lora_alpha", c->ad.alpha, "use_rslora",
                                c->ad.rslora, "modules", c->modules);
    json_object_set_new(root, "kind", json_string("lora-adapter"));
    json_object_set_new(root, "adapter", adapter);
    json_object_set_new(root, "restore_files",
                        json_pack("{s:s}", LORA_CONFIG_FILE, c->ad.config_text));
    return root;
}

static int write_json(const char *dir, const char *name, const json_t *j)
{
    char *path = ckpt_path_join(dir, name);
    int rc = !j     ? ckpt_error_set(CKPT_ENOMEM, "out of memory")
             : path ? cj_write_file(path, j)
                    : CKPT_ENOMEM;
    free(path);
    return rc;
}

static int write_output(lora_conv *c, const char *dst, const convert_opts *o)
{
    char *tmp = NULL;
    int rc = outdir_prepare(dst, o->force, &tmp);
    if (rc) return rc;
    char(*hashes)[65] = ckpt_calloc(c->ex.nsrc_paths + 1, sizeof *hashes);
    if (!hashes) rc = CKPT_ENOMEM;
    exec_opts eo = {.threads = o->threads,
                    .hash_sources = !o->no_hash,
                    .source_sha256 = hashes,
                    .quiet = o->quiet,
                    .label = "convert-lora"};
    if (!rc) rc = exec_run(&c->ex, tmp, &eo);
    for (size_t r = 0; !rc && r < (size_t)c->bp.tp; r++) {
        char *dir = *c->folder_dirs[r] ? ckpt_path_join(tmp, c->folder_dirs[r]) : ckpt_strdup(tmp);
        rc = dir ? ckpt_fsync_dir(dir) : CKPT_ENOMEM;
        free(dir);
    }
    if (!rc) rc = outdir_copy_side_files(c->ad.dir, tmp);
    if (!rc) {
        json_t *cfg = converted_config(c);
        rc = write_json(tmp, LORA_CONFIG_FILE, cfg);
        json_decref(cfg);
    }
    if (!rc) {
        json_t *doc = layout_document(c, o->no_hash ? NULL : hashes);
        rc = write_json(tmp, CONVERT_LAYOUT_FILE, doc);
        json_decref(doc);
    }
    free(hashes);
    if (!rc) rc = ckpt_fsync_dir(tmp);
    if (!rc) rc = outdir_commit(tmp, dst, o->force);
    if (rc) ckpt_rm_rf(tmp);
    free(tmp);
    return rc;
}

static void conv_free(lora_conv *c)
{
    for (size_t r = 0; r < (size_t)c->bp.tp; r++) {
        free(c->folder_dirs ? c->folder_dirs[r] : NULL);
        free(c->index_texts ? c->index_texts[r] : NULL);
    }
    free(c->folder_dirs);
    free(c->index_texts);
    plan_set_free(&c->set);
    exec_plan_free(&c->ex);
    json_decref(c->modules);
    free(c->src_mod);
    convert_plan_free(&c->bp);
    lora_adapter_free(&c->ad);
}

static int map_sources(lora_conv *c)
{
    c->src_mod = ckpt_calloc(c->bp.exec.nsources + 1, sizeof *c->src_mod);
    if (!c->src_mod) return CKPT_ENOMEM;
    for (size_t i = 0; i < c->bp.exec.nsources; i++) {
        const char *name = c->bp.exec.sources[i].name;
        size_t n = strlen(name);
        c->src_mod[i] = -1;
        if (n <= 7 || strcmp(name + n - 7, ".weight")) continue;
        char *mod = ckpt_strndup(name, n - 7);
        if (!mod) return CKPT_ENOMEM;
        const lora_module *m = lora_adapter_find(&c->ad, mod);
        free(mod);
        if (m) c->src_mod[i] = m - c->ad.mods;
    }
    return 0;
}

int lora_convert_run(const char *adapter, const char *base, const char *dst, const convert_opts *o)
{
    if (o->dtype)
        return ckpt_error_set(CKPT_EINVAL, "an adapter keeps its dtype; --dtype does not apply");
    lora_conv c;
    memset(&c, 0, sizeof c);
    int rc = lora_adapter_open(&c.ad, adapter);
    if (!rc && c.ad.fan_in_fan_out)
        rc =
            ckpt_error_set(CKPT_EINVAL,
                           "%s: fan_in_fan_out adapters (Conv1D weights) cannot follow a layout of "
                           "[out, in] Linear weights",
                           adapter);
    if (!rc) rc = convert_plan_build(&c.bp, base, o);
    if (!rc && c.bp.result.nmerges)
        rc = ckpt_error_set(CKPT_EINVAL,
                            "rule %zu (lora_merge): the layout merges an adapter into the base; convert this "
                            "adapter against the merged base instead",
                            c.bp.result.merges[0].rule);
    if (!rc) rc = lora_adapter_check_base(&c.ad, &c.bp.src);
    if (!rc && !(c.modules = json_object())) rc = ckpt_error_set(CKPT_ENOMEM, "out of memory");
    if (!rc) rc = map_sources(&c);
    if (!rc) rc = convert_add_sources(&c.ex, &c.ad.ck, &c.first_src);
    if (!rc) rc = follow_all(&c);
    if (!rc) rc = layout_folders(&c);
    if (!rc) rc = write_output(&c, dst, o);
    if (!rc && !o->quiet)
        ckpt_debug("adapter %s follows layout %s of %s: %zu tensors", adapter, c.bp.layout_name,
                   base, c.set.n);
    conv_free(&c);
    return rc;
}

bool lora_layout_is_adapter(const json_t *layout)
{
    const char *kind = json_string_value(json_object_get(layout, "kind"));
    return kind && !strcmp(kind, "lora-adapter");
}

int lora_consolidate_finish(const json_t *layout, const char *tmp)
{
    if (!lora_layout_is_adapter(layout)) return 0;
    json_t *cfg = json_object_get(json_object_get(layout, "restore_files"), LORA_CONFIG_FILE);
    if (!json_is_string(cfg))
        return ckpt_error_set(CKPT_EINVAL, "%s: an adapter layout without the original %s",
                              CONVERT_LAYOUT_FILE, LORA_CONFIG_FILE);
    char *path = ckpt_path_join(tmp, LORA_CONFIG_FILE);
    int rc = path ? ckpt_write_file_atomic(path, json_string_value(cfg), json_string_length(cfg))
                  : CKPT_ENOMEM;
    free(path);
    return rc;
}

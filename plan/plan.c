/* plan.c — output tensors as parts of source tensors, and the algebra on them. See plan.h. */
#include "plan/plan.h"

#include "common/error.h"
#include "common/util.h"

#include <assert.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool valid_axis(const plan_tensor *t, int axis)
{
    return axis >= 0 && axis < t->ndim;
}

uint64_t plan_tensor_numel(const plan_tensor *t)
{
    uint64_t n = 1;
    for (int k = 0; k < t->ndim; k++) n *= t->shape[k];
    return n;
}

bool plan_part_in_tensor(const plan_part *p, int ndim, const uint64_t *shape)
{
    if (ndim < 0 || ndim > PLAN_MAX_DIM) return false;
    for (int k = 0; k < ndim; k++)
        if (p->lo[k] > shape[k] || p->ext[k] > shape[k] - p->lo[k]) return false;
    return true;
}

bool plan_part_in_source(const plan_part *p, int ndim, const plan_source *src)
{
    if (p->src == PLAN_ZERO) return true;
    if (src->ndim < 0 || src->ndim > PLAN_MAX_DIM) return false;
    uint64_t walked[PLAN_MAX_DIM] = {0}; /* extent along each source axis, 0: not walked */
    bool empty = false, used[PLAN_MAX_DIM] = {false};
    for (int k = 0; k < ndim; k++) {
        int a = p->axis_map[k];
        empty |= p->ext[k] == 0;
        if (a < 0) {
            if (p->ext[k] > 1) return false; /* an axis the source lacks has extent 1 */
            continue;
        }
        if (a >= src->ndim || used[a]) return false;
        used[a] = true;
        walked[a] = p->ext[k];
    }
    for (int a = 0; a < src->ndim; a++) {
        if (used[a]) {
            if (p->src_lo[a] > src->shape[a] || walked[a] > src->shape[a] - p->src_lo[a]) return false;
        } else if (!empty && p->src_lo[a] >= src->shape[a]) {
            return false;
        }
    }
    return true;
}

int plan_part_check(const plan_part *p, int ndim, const uint64_t *shape, const plan_source *src, int code,
                    const char *what)
{
    if (ndim < 0 || ndim > PLAN_MAX_DIM) return ckpt_error_set(code, "%s: rank %d", what, ndim);
    for (int k = 0; k < ndim; k++)
        if (p->lo[k] > shape[k] || p->ext[k] > shape[k] - p->lo[k])
            return ckpt_error_set(code, "%s: part [%llu, +%llu) of axis %d lies outside the tensor's %llu", what,
                                  (unsigned long long)p->lo[k], (unsigned long long)p->ext[k], k,
                                  (unsigned long long)shape[k]);
    if (p->src == PLAN_ZERO || !src || plan_part_in_source(p, ndim, src)) return 0;
    char buf[160];
    for (int k = 0; k < ndim; k++) {
        int a = p->axis_map[k];
        if (a >= 0 && a < src->ndim && a < PLAN_MAX_DIM &&
            (p->src_lo[a] > src->shape[a] || p->ext[k] > src->shape[a] - p->src_lo[a]))
            return ckpt_error_set(code, "%s: part reads [%llu, +%llu) of axis %d of source '%s' %s", what,
                                  (unsigned long long)p->src_lo[a], (unsigned long long)p->ext[k], a, src->name,
                                  plan_shape_str(src->ndim, src->shape, buf, sizeof buf));
    }
    return ckpt_error_set(code, "%s: part does not fit source '%s' %s (axis_map or start out of range)", what,
                          src->name, plan_shape_str(src->ndim, src->shape, buf, sizeof buf));
}

int plan_tensor_add_part(plan_tensor *t, const plan_part *p)
{
    /* Parts from outside are checked before they get here (plan_part_check);
     * the algebra keeps every part inside its tensor. */
    assert(plan_part_in_tensor(p, t->ndim, t->shape));
    if (t->nparts >= PLAN_MAX_PARTS_PER_TENSOR)
        return ckpt_error_set(CKPT_ELIMIT, "tensor '%s': more than %u parts", t->name, PLAN_MAX_PARTS_PER_TENSOR);
    int rc = ckpt_grow(&t->parts, &t->cap, t->nparts + 1, sizeof *t->parts);
    if (rc) return rc;
    t->parts[t->nparts++] = *p;
    return 0;
}

int plan_tensor_add_zero(plan_tensor *t, const uint64_t *lo, const uint64_t *ext)
{
    plan_part p;
    memset(&p, 0, sizeof p);
    p.src = PLAN_ZERO;
    for (int k = 0; k < t->ndim; k++) {
        if (ext[k] == 0) return 0;
        p.axis_map[k] = -1;
        p.lo[k] = lo[k];
        p.ext[k] = ext[k];
    }
    return plan_tensor_add_part(t, &p);
}

void plan_part_whole(plan_part *p, int32_t src_index, int ndim, const uint64_t *shape)
{
    memset(p, 0, sizeof *p);
    p->src = src_index;
    for (int k = 0; k < ndim; k++) {
        p->axis_map[k] = (int8_t)k;
        p->ext[k] = shape[k];
    }
}

int plan_tensor_from_source(plan_tensor *out, const plan_source *src, int32_t src_index)
{
    memset(out, 0, sizeof *out);
    if (src->ndim > PLAN_MAX_DIM)
        return ckpt_error_set(CKPT_ELIMIT, "tensor '%s' has %d dimensions; transforms handle at most %d",
                              src->name, src->ndim, PLAN_MAX_DIM);
    out->name = ckpt_strdup(src->name);
    if (!out->name) return CKPT_ENOMEM;
    out->rank = PLAN_ALL_RANKS;
    out->dtype = src->dtype;
    out->ndim = src->ndim;
    memcpy(out->shape, src->shape, sizeof out->shape);
    plan_part p;
    plan_part_whole(&p, src_index, src->ndim, src->shape);
    if (plan_tensor_numel(out) == 0) return 0;
    return plan_tensor_add_part(out, &p);
}

/* A tensor with the same header fields as `in` and no parts. */
static int tensor_like(plan_tensor *out, const plan_tensor *in)
{
    memset(out, 0, sizeof *out);
    out->name = ckpt_strdup(in->name);
    if (!out->name) return CKPT_ENOMEM;
    out->rank = in->rank;
    out->dtype = in->dtype;
    out->ndim = in->ndim;
    memcpy(out->shape, in->shape, sizeof out->shape);
    if (in->meta) {
        out->meta = json_deep_copy(in->meta);
        if (!out->meta) {
            plan_tensor_free(out);
            return ckpt_error_set(CKPT_ENOMEM, "out of memory");
        }
    }
    return 0;
}

int plan_tensor_copy(plan_tensor *out, const plan_tensor *in)
{
    int rc = tensor_like(out, in);
    for (size_t i = 0; !rc && i < in->nparts; i++) rc = plan_tensor_add_part(out, &in->parts[i]);
    if (rc) plan_tensor_free(out);
    return rc;
}

void plan_tensor_free(plan_tensor *t)
{
    free(t->name);
    free(t->parts);
    json_decref(t->meta);
    for (size_t i = 0; i < t->nchecks; i++) free(t->checks[i].what);
    free(t->checks);
    memset(t, 0, sizeof *t);
}

int plan_tensor_slice(plan_tensor *out, const plan_tensor *in, int axis, uint64_t start, uint64_t len)
{
    if (!valid_axis(in, axis) || start > in->shape[axis] || len > in->shape[axis] - start)
        return ckpt_error_set(CKPT_EINVAL, "tensor '%s': slice [%llu, +%llu) of axis %d is out of range",
                              in->name, (unsigned long long)start, (unsigned long long)len, axis);
    int rc = tensor_like(out, in);
    if (rc) return rc;
    out->shape[axis] = len;
    uint64_t end = start + len;
    for (size_t i = 0; i < in->nparts; i++) {
        plan_part p = in->parts[i];
        uint64_t plo = p.lo[axis], phi = p.lo[axis] + p.ext[axis];
        uint64_t lo = plo > start ? plo : start, hi = phi < end ? phi : end;
        if (lo >= hi) continue;
        if (p.axis_map[axis] >= 0) p.src_lo[p.axis_map[axis]] += lo - plo;
        p.lo[axis] = lo - start;
        p.ext[axis] = hi - lo;
        if ((rc = plan_tensor_add_part(out, &p))) break;
    }
    if (rc) plan_tensor_free(out);
    return rc;
}

int plan_tensor_pad(plan_tensor *out, const plan_tensor *in, int axis, uint64_t new_len)
{
    if (!valid_axis(in, axis) || new_len < in->shape[axis])
        return ckpt_error_set(CKPT_EINVAL, "tensor '%s': cannot pad axis %d to %llu", in->name, axis,
                              (unsigned long long)new_len);
    int rc = plan_tensor_copy(out, in);
    if (rc || new_len == in->shape[axis]) return rc;
    uint64_t lo[PLAN_MAX_DIM] = {0}, ext[PLAN_MAX_DIM];
    memcpy(ext, in->shape, sizeof ext);
    lo[axis] = in->shape[axis];
    ext[axis] = new_len - in->shape[axis];
    out->shape[axis] = new_len;
    rc = plan_tensor_add_zero(out, lo, ext);
    if (rc) plan_tensor_free(out);
    return rc;
}

int plan_tensor_concat(plan_tensor *out, plan_tensor *const *ins, size_t n, int axis)
{
    if (n == 0) return ckpt_error_set(CKPT_EINVAL, "concat of no tensors");
    const plan_tensor *a = ins[0];
    if (!valid_axis(a, axis)) return ckpt_error_set(CKPT_EINVAL, "tensor '%s': no axis %d to concatenate on", a->name, axis);
    for (size_t i = 1; i < n; i++) {
        const plan_tensor *b = ins[i];
        bool same = b->ndim == a->ndim && b->dtype == a->dtype;
        for (int k = 0; same && k < a->ndim; k++) same = k == axis || a->shape[k] == b->shape[k];
        if (!same) {
            char sa[96], sb[96];
            return ckpt_error_set(CKPT_EINVAL,
                                  "cannot concatenate '%s' %s %s with '%s' %s %s on axis %d", a->name,
                                  ckpt_dtype_name(a->dtype), plan_shape_str(a->ndim, a->shape, sa, sizeof sa),
                                  b->name, ckpt_dtype_name(b->dtype),
                                  plan_shape_str(b->ndim, b->shape, sb, sizeof sb), axis);
        }
    }
    int rc = tensor_like(out, a);
    if (rc) return rc;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ins[i]->shape[axis] > UINT64_MAX - total) {
            plan_tensor_free(out);
            return ckpt_error_set(CKPT_ELIMIT, "tensor '%s': concatenation overflows axis %d", a->name, axis);
        }
        total += ins[i]->shape[axis];
    }
    out->shape[axis] = total; /* first: every part added lies inside it */
    uint64_t off = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        for (size_t j = 0; j < ins[i]->nparts && !rc; j++) {
            plan_part p = ins[i]->parts[j];
            p.lo[axis] += off;
            rc = plan_tensor_add_part(out, &p);
        }
        off += ins[i]->shape[axis];
    }
    assert(rc || off == total);
    if (rc) plan_tensor_free(out);
    return rc;
}

int plan_tensor_stack(plan_tensor *out, plan_tensor *const *ins, size_t n)
{
    if (n == 0) return ckpt_error_set(CKPT_EINVAL, "stack of no tensors");
    const plan_tensor *a = ins[0];
    if (a->ndim + 1 > PLAN_MAX_DIM)
        return ckpt_error_set(CKPT_ELIMIT, "tensor '%s': stacking would exceed %d dimensions", a->name, PLAN_MAX_DIM);
    for (size_t i = 1; i < n; i++) {
        const plan_tensor *b = ins[i];
        if (b->ndim != a->ndim || b->dtype != a->dtype || memcmp(a->shape, b->shape, sizeof a->shape)) {
            char sa[96], sb[96];
            return ckpt_error_set(CKPT_EINVAL, "cannot stack '%s' %s %s with '%s' %s %s: dtype or shape differ",
                                  a->name, ckpt_dtype_name(a->dtype), plan_shape_str(a->ndim, a->shape, sa, sizeof sa),
                                  b->name, ckpt_dtype_name(b->dtype), plan_shape_str(b->ndim, b->shape, sb, sizeof sb));
        }
    }
    int rc = tensor_like(out, a);
    if (rc) return rc;
    out->ndim = a->ndim + 1;
    out->shape[0] = n;
    memcpy(out->shape + 1, a->shape, (size_t)a->ndim * sizeof a->shape[0]);
    for (size_t i = 0; i < n && !rc; i++) {
        for (size_t j = 0; j < ins[i]->nparts && !rc; j++) {
            const plan_part *q = &ins[i]->parts[j];
            plan_part p;
            memset(&p, 0, sizeof p);
            p.src = q->src;
            memcpy(p.src_lo, q->src_lo, sizeof p.src_lo);
            p.axis_map[0] = -1;
            p.lo[0] = i;
            p.ext[0] = 1;
            for (int k = 0; k < a->ndim; k++) {
                p.axis_map[k + 1] = q->axis_map[k];
                p.lo[k + 1] = q->lo[k];
                p.ext[k + 1] = q->ext[k];
            }
            rc = plan_tensor_add_part(out, &p);
        }
    }
    if (rc) plan_tensor_free(out);
    return rc;
}

int plan_tensor_transpose(plan_tensor *out, const plan_tensor *in, int a, int b)
{
    if (!valid_axis(in, a) || !valid_axis(in, b))
        return ckpt_error_set(CKPT_EINVAL, "tensor '%s' has %d dimensions: cannot swap axes %d and %d",
                              in->name, in->ndim, a, b);
    int rc = plan_tensor_copy(out, in);
    if (rc) return rc;
#define SWAP(x, y)                                                                                 \
    do {                                                                                           \
        __typeof__(x) tmp_ = (x);                                                                  \
        (x) = (y);                                                                                 \
        (y) = tmp_;                                                                                \
    } while (0)
    SWAP(out->shape[a], out->shape[b]);
    for (size_t i = 0; i < out->nparts; i++) {
        plan_part *p = &out->parts[i];
        SWAP(p->axis_map[a], p->axis_map[b]);
        SWAP(p->lo[a], p->lo[b]);
        SWAP(p->ext[a], p->ext[b]);
        assert(plan_part_in_tensor(p, out->ndim, out->shape));
    }
#undef SWAP
    return 0;
}

int plan_tensor_squeeze(plan_tensor *out, const plan_tensor *in, int axis)
{
    if (!valid_axis(in, axis) || in->shape[axis] != 1)
        return ckpt_error_set(CKPT_EINVAL, "tensor '%s': axis %d is not of length 1", in->name, axis);
    int rc = plan_tensor_copy(out, in);
    if (rc) return rc;
    for (int k = axis; k + 1 < out->ndim; k++) out->shape[k] = out->shape[k + 1];
    out->ndim--;
    for (size_t i = 0; i < out->nparts; i++) {
        plan_part *p = &out->parts[i];
        for (int k = axis; k + 1 < in->ndim; k++) {
            p->axis_map[k] = p->axis_map[k + 1];
            p->lo[k] = p->lo[k + 1];
            p->ext[k] = p->ext[k + 1];
        }
        p->axis_map[in->ndim - 1] = 0;
        p->lo[in->ndim - 1] = p->ext[in->ndim - 1] = 0;
        assert(plan_part_in_tensor(p, out->ndim, out->shape));
    }
    return 0;
}

/* True when b continues a along tensor axis k, with everything else equal. */
static bool part_continues(const plan_part *a, const plan_part *b, int ndim, int k)
{
    if (a->src != b->src || b->lo[k] != a->lo[k] + a->ext[k]) return false;
    for (int j = 0; j < ndim; j++) {
        if (a->axis_map[j] != b->axis_map[j]) return false;
        if (j != k && (a->lo[j] != b->lo[j] || a->ext[j] != b->ext[j])) return false;
    }
    if (a->src == PLAN_ZERO) return true;
    for (int s = 0; s < PLAN_MAX_DIM; s++) {
        uint64_t want = a->src_lo[s];
        if (a->axis_map[k] == s) want += a->ext[k];
        if (b->src_lo[s] != want) return false;
    }
    return a->axis_map[k] >= 0;
}

int plan_part_compose(const plan_part *outer, int ndim, const plan_tensor *inner, int32_t src_offset, plan_tensor *out)
{
    if (outer->src == PLAN_ZERO) return plan_tensor_add_part(out, outer);
    int m = inner->ndim;
    /* The box of the inner tensor the outer part reads: mapped axes over
     * their extent, the others at one index. */
    uint64_t blo[PLAN_MAX_DIM], bext[PLAN_MAX_DIM];
    int from_out[PLAN_MAX_DIM]; /* inner axis -> output axis walking it, or -1 */
    for (int a = 0; a < m; a++) {
        blo[a] = outer->src_lo[a];
        bext[a] = 1;
        from_out[a] = -1;
    }
    for (int k = 0; k < ndim; k++)
        if (outer->axis_map[k] >= 0) {
            bext[outer->axis_map[k]] = outer->ext[k];
            from_out[outer->axis_map[k]] = k;
        }
    for (size_t j = 0; j < inner->nparts; j++) {
        const plan_part *q = &inner->parts[j];
        uint64_t ilo[PLAN_MAX_DIM], iext[PLAN_MAX_DIM];
        bool empty = false;
        for (int a = 0; a < m && !empty; a++) {
            uint64_t lo = blo[a] > q->lo[a] ? blo[a] : q->lo[a];
            uint64_t hi_b = blo[a] + bext[a], hi_q = q->lo[a] + q->ext[a], hi = hi_b < hi_q ? hi_b : hi_q;
            empty = hi <= lo;
            ilo[a] = lo;
            iext[a] = empty ? 0 : hi - lo;
        }
        if (empty) continue;
        plan_part r;
        memset(&r, 0, sizeof r);
        for (int k = 0; k < ndim; k++) {
            int a = outer->axis_map[k];
            r.lo[k] = a >= 0 ? outer->lo[k] + (ilo[a] - outer->src_lo[a]) : outer->lo[k];
            r.ext[k] = a >= 0 ? iext[a] : outer->ext[k];
            r.axis_map[k] = -1;
        }
        if (q->src == PLAN_ZERO) {
            r.src = PLAN_ZERO;
        } else {
            r.src = q->src + src_offset;
            memcpy(r.src_lo, q->src_lo, sizeof r.src_lo);
            for (int a = 0; a < m; a++) {
                int b = q->axis_map[a];
                if (b < 0) continue;
                r.src_lo[b] = q->src_lo[b] + (ilo[a] - q->lo[a]);
                if (from_out[a] >= 0) r.axis_map[from_out[a]] = (int8_t)b;
            }
        }
        int rc = plan_tensor_add_part(out, &r);
        if (rc) return rc;
    }
    return 0;
}

void plan_tensor_coalesce(plan_tensor *t)
{
    size_t w = 0;
    for (size_t i = 0; i < t->nparts; i++) {
        bool merged = false;
        for (int k = 0; w > 0 && k < t->ndim && !merged; k++) {
            if (part_continues(&t->parts[w - 1], &t->parts[i], t->ndim, k)) {
                t->parts[w - 1].ext[k] += t->parts[i].ext[k];
                assert(plan_part_in_tensor(&t->parts[w - 1], t->ndim, t->shape));
                merged = true;
            }
        }
        if (!merged) t->parts[w++] = t->parts[i];
    }
    t->nparts = w;
}

int plan_tensor_note(plan_tensor *t, json_t *desc)
{
    if (!desc) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    if (!t->meta && !(t->meta = json_object())) {
        json_decref(desc);
        return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    }
    json_t *list = json_object_get(t->meta, "transforms");
    if (!list) {
        list = json_array();
        if (!list || json_object_set_new(t->meta, "transforms", list)) {
            json_decref(desc);
            return ckpt_error_set(CKPT_ENOMEM, "out of memory");
        }
    }
    if (json_array_append_new(list, desc)) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    return 0;
}

void plan_set_free(plan_set *s)
{
    for (size_t i = 0; i < s->n; i++) plan_tensor_free(&s->t[i]);
    free(s->t);
    memset(s, 0, sizeof *s);
}

int plan_set_push(plan_set *s, plan_tensor *t)
{
    int rc = ckpt_grow(&s->t, &s->cap, s->n + 1, sizeof *s->t);
    if (rc) {
        plan_tensor_free(t);
        return rc;
    }
    s->t[s->n++] = *t;
    memset(t, 0, sizeof *t);
    return 0;
}

long plan_set_find(const plan_set *s, const char *name, int rank)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->t[i].rank == rank && !strcmp(s->t[i].name, name)) return (long)i;
    return -1;
}

static int name_entry_order(const void *a, const void *b)
{
    const struct plan_name_entry *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c
             : (x->i > y->i) - (x->i < y->i); /* equal names: the set's order, as plan_set_find */
}

int plan_name_index_build(plan_name_index *x, const plan_set *s, int rank)
{
    x->n = 0;
    x->v = ckpt_calloc(s->n + 1, sizeof *x->v);
    if (!x->v) return CKPT_ENOMEM;
    for (size_t i = 0; i < s->n; i++)
        if (s->t[i].rank == rank) x->v[x->n++] = (struct plan_name_entry){s->t[i].name, i};
    qsort(x->v, x->n, sizeof *x->v, name_entry_order);
    return 0;
}

long plan_name_index_find(const plan_name_index *x, const char *name)
{
    size_t lo = 0, hi = x->n; /* the first entry not below name */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(x->v[mid].name, name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < x->n && !strcmp(x->v[lo].name, name) ? (long)x->v[lo].i : -1;
}

void plan_name_index_free(plan_name_index *x)
{
    free(x->v);
    x->v = NULL;
    x->n = 0;
}

static json_t *u64_array(const uint64_t *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_integer((json_int_t)v[i]));
    return a;
}

json_t *plan_part_to_json(const plan_part *p, int ndim, int src_ndim, const char *src_name)
{
    json_t *j = json_object();
    if (!j) return NULL;
    if (p->src == PLAN_ZERO) {
        json_object_set_new(j, "zero", json_true());
    } else {
        json_object_set_new(j, "src", json_string(src_name));
        json_object_set_new(j, "src_lo", u64_array(p->src_lo, src_ndim));
        json_t *m = json_array();
        for (int k = 0; k < ndim; k++) json_array_append_new(m, json_integer(p->axis_map[k]));
        json_object_set_new(j, "axis_map", m);
    }
    json_object_set_new(j, "lo", u64_array(p->lo, ndim));
    json_object_set_new(j, "ext", u64_array(p->ext, ndim));
    return j;
}

static int read_u64_array(const json_t *j, const char *key, uint64_t *out, int n, const char *what)
{
    json_t *a = json_object_get(j, key);
    if (!json_is_array(a) || json_array_size(a) != (size_t)n)
        return ckpt_error_set(CKPT_EINVAL, "%s: part field '%s' must be an array of %d integers", what, key, n);
    for (int i = 0; i < n; i++) {
        json_t *v = json_array_get(a, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return ckpt_error_set(CKPT_EINVAL, "%s: part field '%s' must hold non-negative integers", what, key);
        out[i] = (uint64_t)json_integer_value(v);
    }
    return 0;
}

int plan_part_from_json(plan_part *p, const json_t *j, int ndim, int src_ndim, const char *what)
{
    memset(p, 0, sizeof *p);
    if (!json_is_object(j)) return ckpt_error_set(CKPT_EINVAL, "%s: a part must be an object", what);
    if (ndim > PLAN_MAX_DIM || src_ndim > PLAN_MAX_DIM)
        return ckpt_error_set(CKPT_ELIMIT, "%s: too many dimensions", what);
    int rc = read_u64_array(j, "lo", p->lo, ndim, what);
    if (!rc) rc = read_u64_array(j, "ext", p->ext, ndim, what);
    if (rc) return rc;
    if (json_is_true(json_object_get(j, "zero"))) {
        p->src = PLAN_ZERO;
        for (int k = 0; k < ndim; k++) p->axis_map[k] = -1;
        return 0;
    }
    rc = read_u64_array(j, "src_lo", p->src_lo, src_ndim, what);
    if (rc) return rc;
    json_t *m = json_object_get(j, "axis_map");
    if (!json_is_array(m) || json_array_size(m) != (size_t)ndim)
        return ckpt_error_set(CKPT_EINVAL, "%s: part field 'axis_map' must be an array of %d integers", what, ndim);
    bool used[PLAN_MAX_DIM] = {false};
    for (int k = 0; k < ndim; k++) {
        json_t *v = json_array_get(m, (size_t)k);
        json_int_t a = json_is_integer(v) ? json_integer_value(v) : -2;
        if (a < -1 || a >= src_ndim || (a >= 0 && used[a]))
            return ckpt_error_set(CKPT_EINVAL, "%s: part axis_map entry %d is invalid", what, k);
        if (a >= 0) used[a] = true;
        if (a < 0 && p->ext[k] != 1)
            return ckpt_error_set(CKPT_EINVAL, "%s: part axis %d has no source axis but extent %llu", what, k,
                                  (unsigned long long)p->ext[k]);
        p->axis_map[k] = (int8_t)a;
    }
    return 0;
}

/* Whether b continues the run that starts at a (prev is the part before b)
 * with one step per axis, set from the run's second part. Zero parts never
 * form runs. */
static bool part_runs_on(const plan_part *a, const plan_part *prev, const plan_part *b, int ndim,
                           const plan_source *sources, uint64_t *step, bool first)
{
    if (a->src == PLAN_ZERO || b->src == PLAN_ZERO || sources[a->src].ndim != sources[b->src].ndim) return false;
    bool moved = false;
    for (int k = 0; k < ndim; k++) {
        if (b->ext[k] != a->ext[k] || b->axis_map[k] != a->axis_map[k] || b->lo[k] < prev->lo[k]) return false;
        uint64_t d = b->lo[k] - prev->lo[k];
        if (first) step[k] = d;
        else if (d != step[k]) return false;
        moved |= d != 0;
    }
    for (int k = 0; k < sources[a->src].ndim; k++)
        if (b->src_lo[k] != a->src_lo[k]) return false;
    return moved;
}

json_t *plan_parts_to_json(const plan_part *parts, size_t n, int ndim, const plan_source *sources)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n;) {
        const plan_part *a = &parts[i];
        const plan_source *s = a->src == PLAN_ZERO ? NULL : &sources[a->src];
        uint64_t step[PLAN_MAX_DIM] = {0};
        size_t e = i + 1;
        while (e < n && part_runs_on(a, &parts[e - 1], &parts[e], ndim, sources, step, e == i + 1)) e++;
        json_t *j = plan_part_to_json(a, ndim, s ? s->ndim : 0, s ? s->name : NULL);
        if (j && e - i > 1) {
            json_t *names = json_array();
            for (size_t k = i; names && k < e; k++) json_array_append_new(names, json_string(sources[parts[k].src].name));
            json_object_del(j, "src");
            json_object_set_new(j, "srcs", names);
            json_object_set_new(j, "lo_step", u64_array(step, ndim));
        }
        if (!j || json_array_append_new(arr, j)) {
            json_decref(arr);
            return NULL;
        }
        i = e;
    }
    return arr;
}

size_t plan_part_json_count(const json_t *j)
{
    json_t *srcs = json_object_get(j, "srcs");
    if (!srcs) return 1;
    return json_is_array(srcs) ? json_array_size(srcs) : 0;
}

const char *plan_part_json_src(const json_t *j, size_t k)
{
    json_t *srcs = json_object_get(j, "srcs");
    if (srcs) return json_string_value(json_array_get(srcs, k));
    return k ? NULL : json_string_value(json_object_get(j, "src"));
}

int plan_part_from_json_at(plan_part *p, const json_t *j, size_t k, int ndim, int src_ndim, const char *what)
{
    json_t *srcs = json_object_get(j, "srcs");
    if (srcs && (json_object_get(j, "src") || json_object_get(j, "zero")))
        return ckpt_error_set(CKPT_EINVAL, "%s: a run has 'srcs' and also 'src' or 'zero'", what);
    if (k >= plan_part_json_count(j)) return ckpt_error_set(CKPT_EINVAL, "%s: no part %zu in this entry", what, k);
    int rc = plan_part_from_json(p, j, ndim, src_ndim, what);
    if (rc || !srcs) return rc;
    uint64_t step[PLAN_MAX_DIM];
    if ((rc = read_u64_array(j, "lo_step", step, ndim, what))) return rc;
    for (int d = 0; d < ndim; d++) {
        uint64_t off;
        if (__builtin_mul_overflow(step[d], (uint64_t)k, &off) || __builtin_add_overflow(p->lo[d], off, &p->lo[d]))
            return ckpt_error_set(CKPT_EINVAL, "%s: run part %zu overflows on axis %d", what, k, d);
    }
    return 0;
}

const char *plan_shape_str(int ndim, const uint64_t *shape, char *buf, size_t len)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int k = 0; k < ndim && o < len; k++)
        o += (size_t)snprintf(buf + o, len - o, "%s%llu", k ? ", " : "", (unsigned long long)shape[k]);
    if (o < len) snprintf(buf + o, len - o, "]");
    return buf;
}

int plan_name_cmp(const char *a, const char *b)
{
    while (*a && *b) {
        if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
            while (*a == '0' && isdigit((unsigned char)a[1])) a++;
            while (*b == '0' && isdigit((unsigned char)b[1])) b++;
            size_t la = 0, lb = 0;
            while (isdigit((unsigned char)a[la])) la++;
            while (isdigit((unsigned char)b[lb])) lb++;
            if (la != lb) return la < lb ? -1 : 1;
            int c = strncmp(a, b, la);
            if (c) return c;
            a += la;
            b += lb;
            continue;
        }
        if (*a != *b) return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
        a++;
        b++;
    }
    return (unsigned char)*a - (unsigned char)*b;
}

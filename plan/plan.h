/*
 * plan.h — a conversion plan as data: for every output tensor, its dtype,
 * shape, and the parts it is made of.
 *
 * A part is a box of one source tensor placed in the output tensor, possibly
 * with its axes permuted, or a box of zeros (padding):
 *
 *   part.lo[k], part.ext[k]   the box in the tensor's own coordinates, axis k
 *   part.axis_map[k]          which source axis tensor axis k walks, or -1 for
 *                             an axis the source does not have (extent 1,
 *                             e.g. the expert axis made by stacking)
 *   part.src_lo[a]            where the box starts on source axis a; source
 *                             axes no tensor axis walks are fixed at src_lo[a]
 *   part.src == PLAN_ZERO     zeros (padding), no source
 *
 * Element i of the box (0 <= i[k] < ext[k]) is tensor element lo + i and
 * source element src_lo + (i[k] on axis axis_map[k]). Every transform of
 * docs/transforms.md — slicing for tensor parallelism with padding, fusing,
 * stacking experts, transposing, selecting attention heads — is algebra on
 * parts (plan_tensor_slice, _pad, _concat, _stack, _transpose), so rules
 * compose freely and the planner touches no tensor byte. The executor
 * (executor.h) streams parts; consolidation inverts them (consolidate.h).
 *
 * A tensor's rank is the tensor-parallel rank it belongs to, or PLAN_ALL_RANKS
 * for a tensor every rank holds (replicated) or a layout without ranks.
 */
#ifndef CKPT_PLAN_PLAN_H
#define CKPT_PLAN_PLAN_H

#include "format/dtype.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PLAN_MAX_DIM CKPT_MAX_RANK /* one rank limit: what the reader and the store accept */
#define PLAN_ZERO (-1)
#define PLAN_ALL_RANKS (-1)
#define PLAN_MAX_TP 1024
#define PLAN_MAX_PARTS_PER_TENSOR (1u << 20)

typedef struct {
    char *name;
    size_t file; /* index into the plan's source files */
    ckpt_dtype dtype;
    int ndim;
    uint64_t shape[PLAN_MAX_DIM];
    uint64_t offset; /* absolute byte offset of the tensor in its file */
    uint64_t nbytes;
} plan_source;

typedef struct {
    int32_t src; /* index into sources, or PLAN_ZERO */
    int8_t axis_map[PLAN_MAX_DIM];
    uint64_t src_lo[PLAN_MAX_DIM];
    uint64_t lo[PLAN_MAX_DIM];
    uint64_t ext[PLAN_MAX_DIM];
} plan_part;

typedef struct {
    char *name;
    int rank;
    ckpt_dtype dtype;
    int ndim;
    uint64_t shape[PLAN_MAX_DIM];
    plan_part *parts;
    size_t nparts, cap;
    json_t *meta; /* descriptive metadata for ckpt-layout.json (object, owned) */
    /* Consolidation only: pairs (primary part, duplicate part) whose bytes
     * must be equal (replicated tensors, KV replicas). */
    size_t nchecks, checks_cap;
    struct plan_check {
        plan_part primary, dup;
        char *what; /* e.g. "rank 3" */
    } *checks;
} plan_tensor;

/* A set of tensors being transformed (the working set of the rules). */
typedef struct {
    plan_tensor *t;
    size_t n, cap;
} plan_set;

/* ---- tensors ---- */

/* A tensor that is a whole source tensor. */
int plan_tensor_from_source(plan_tensor *out, const plan_source *src, int32_t src_index);
/* *p = the whole of source src_index (ndim <= PLAN_MAX_DIM dims of shape), in place. */
void plan_part_whole(plan_part *p, int32_t src_index, int ndim, const uint64_t *shape);
/* Deep copy. */
int plan_tensor_copy(plan_tensor *out, const plan_tensor *in);
void plan_tensor_free(plan_tensor *t);
uint64_t plan_tensor_numel(const plan_tensor *t);
int plan_tensor_add_part(plan_tensor *t, const plan_part *p);
/* Appends a zero part covering the box [lo, lo+ext). */
int plan_tensor_add_zero(plan_tensor *t, const uint64_t *lo, const uint64_t *ext);

/* Algebra. Each makes a new tensor `out` (same name, rank, dtype as `in`
 * unless said) and leaves `in` untouched. */
int plan_tensor_slice(plan_tensor *out, const plan_tensor *in, int axis, uint64_t start, uint64_t len);
/* Appends zeros at the end of axis until its length is new_len. */
int plan_tensor_pad(plan_tensor *out, const plan_tensor *in, int axis, uint64_t new_len);
/* Concatenates ins along axis; the result takes ins[0]'s name and rank. */
int plan_tensor_concat(plan_tensor *out, plan_tensor *const *ins, size_t n, int axis);
/* Stacks ins along a new leading axis. */
int plan_tensor_stack(plan_tensor *out, plan_tensor *const *ins, size_t n);
/* Swaps two axes. */
int plan_tensor_transpose(plan_tensor *out, const plan_tensor *in, int a, int b);
/* Removes axis (which must have length 1). */
int plan_tensor_squeeze(plan_tensor *out, const plan_tensor *in, int axis);
/* Merges parts that continue each other along one axis in both the tensor
 * and the source (adjacent heads, neighbouring blocks), so the executor makes
 * fewer, larger copies. The bytes described do not change. */
void plan_tensor_coalesce(plan_tensor *t);
/* Appends to `out` the parts that read what part `outer` (of a tensor of
 * `ndim` axes) reads from its source, when that source is itself assembled
 * as `inner` (parts over other sources, their indices shifted by
 * src_offset): one part per inner part the read box meets, zeros staying
 * zeros. A zero `outer` is appended as it is. */
int plan_part_compose(const plan_part *outer, int ndim, const plan_tensor *inner, int32_t src_offset, plan_tensor *out);
/* Appends a rule description to t->meta["transforms"]. Steals `desc`. */
int plan_tensor_note(plan_tensor *t, json_t *desc);

/* ---- the invariants the bytes depend on ----
 * A part's box [lo, lo+ext) lies inside its tensor's shape on every axis. A
 * part of a source names distinct source axes in axis_map, and the source
 * elements it covers lie inside the source: src_lo[a] + ext[k] <= shape[a]
 * for the tensor axis k walking source axis a, src_lo[a] < shape[a] for a
 * source axis no tensor axis walks (an empty part, with an extent 0, covers
 * nothing). The executor reads source bytes and writes output bytes at
 * offsets computed from these, so plans built here assert them (plan.c,
 * executor.c); parts read from outside (a store catalog's recipes,
 * ckpt-layout.json) are checked with plan_part_check first. */
bool plan_part_in_tensor(const plan_part *p, int ndim, const uint64_t *shape);
bool plan_part_in_source(const plan_part *p, int ndim, const plan_source *src);
/* Both as a checked error: code (CKPT_ECORRUPT, CKPT_EINVAL) and a message
 * "<what>: ..." naming the axis and bounds; src NULL for a zero part. */
int plan_part_check(const plan_part *p, int ndim, const uint64_t *shape, const plan_source *src, int code,
                    const char *what);

/* ---- sets ---- */
void plan_set_free(plan_set *s);
/* Appends t (moved: the caller's struct is zeroed). */
int plan_set_push(plan_set *s, plan_tensor *t);
/* Index of the tensor named `name` with rank `rank`, or -1. */
long plan_set_find(const plan_set *s, const char *name, int rank);
/* The tensors of a set with one rank, sorted by name: plan_set_find in
 * O(log n) for a rule that looks up a few members for each of thousands of
 * tensors (plan_set_find scans the set). It holds the names and indexes of
 * the set as it was when built: tensors pushed later are not in it, and
 * those indexed must keep their names and places until it is freed. */
typedef struct {
    struct plan_name_entry {
        const char *name;
        size_t i;
    } * v;
    size_t n;
} plan_name_index;
int plan_name_index_build(plan_name_index *x, const plan_set *s, int rank);
/* What plan_set_find(s, name, rank) gave when x was built: the first such
 * index, or -1. */
long plan_name_index_find(const plan_name_index *x, const char *name);
void plan_name_index_free(plan_name_index *x);

/* ---- parts as JSON (ckpt-layout.json, ckpt plan --json) ---- */
json_t *plan_part_to_json(const plan_part *p, int ndim, int src_ndim, const char *src_name);
/* Parses a part; `ndim` is the tensor's rank, `src_ndim` the source's. */
int plan_part_from_json(plan_part *p, const json_t *j, int ndim, int src_ndim, const char *what);
/* A tensor's parts as a JSON array, where consecutive parts that differ only
 * in their source and in `lo` by a constant step (an expert stack: expert e
 * at lo[0] = e) become one run entry {"srcs": [names], "lo_step": [...], and
 * the first part's "src_lo", "axis_map", "lo", "ext"}. */
json_t *plan_parts_to_json(const plan_part *parts, size_t n, int ndim, const plan_source *sources);
/* How many parts an entry of that array stands for: 1 for a part, the length
 * of "srcs" for a run (0 when "srcs" is not a non-empty array). */
size_t plan_part_json_count(const json_t *j);
/* The source name of part k of an entry (NULL for a zero part or a bad entry). */
const char *plan_part_json_src(const json_t *j, size_t k);
/* plan_part_from_json of part k of an entry (k < plan_part_json_count). */
int plan_part_from_json_at(plan_part *p, const json_t *j, size_t k, int ndim, int src_ndim, const char *what);

/* Tensor shape as "[a, b, c]" into buf. */
const char *plan_shape_str(int ndim, const uint64_t *shape, char *buf, size_t len);
/* Natural order of names: "layers.2" before "layers.10". */
int plan_name_cmp(const char *a, const char *b);

#endif

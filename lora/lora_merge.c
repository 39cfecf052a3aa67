/*
 * lora_merge.c — W' = W ± s * B @ A for every adapted weight of a base
 * checkpoint, written as a new checkpoint (see lora.h for the contract).
 *
 * The work is a list of items in output order: a whole untouched tensor to
 * copy in the kernel, a run of rows of an adapted weight that the update
 * leaves as they are (copied too), or one block of rows to update. Each
 * worker thread takes the next item; a block is read, widened to F32,
 * updated by one cblas_sgemm with beta = 1, rounded back and written at the
 * same offset of the output file. OpenBLAS runs one thread per call: the
 * parallelism is ours, and it covers the reads, casts and writes as well as
 * the GEMMs.
 *
 * Segments: the same GEMMs for a fused adapter as for its members. A fused
 * weight T = [W_q; W_k; W_v] of a converted adapter (lora_layout.c) has
 * A_T = [A_q; A_k; A_v] and B_T block-diagonal, and merging it must give
 * the bytes of merging each member (docs/lora.md). The same values are not
 * enough: a kernel orders the K sum by the call's shape, so the zero-padded
 * K = r_q + r_k + r_v product of a q row rounds differently from its K = r_q
 * product (OpenBLAS's Haswell and Zen kernels do). So the calls themselves
 * are made equal. When a module is planned its B is read once (it is small)
 * and:
 *   - every row's nonzero entries (x != 0: -0 counts as zero) span an
 *     interval [lo, hi) of columns, empty for an all-zero row;
 *   - the union of overlapping intervals (touching ones stay apart) cuts the
 *     columns into disjoint groups [k0, k1);
 *   - consecutive rows whose intervals fall in the same group form a
 *     segment; all-zero rows belong to none.
 * Blocks are cut in each segment from its first row, as many rows as fit in
 * LORA_BLOCK_BYTES of F32 (rows_per_block), and a block's GEMM has
 * K = k1 - k0 of its group: A's rows k0..k1 (contiguous, ld = in) and the
 * block's B entries copied to a contiguous [nrows, K] buffer (ld = K). In T
 * the rows of member m carry nonzeros only in m's column block, so their
 * groups and segments are exactly those m's own B gives, shifted by the
 * block's start: every block of T is a block of m's merge, with the same M,
 * N, K, leading dimensions, scale and operand values, and the same operand
 * alignment too (A's group rows, the B buffer and the C buffer start on 64
 * bytes), so any deterministic kernel gives the same bytes. A dense B is one
 * group [0, r) and one segment of all rows: the blocks a plain merge always
 * had. Rows outside every segment get a zero update and are copied, not
 * computed, as an unfused merge copies a member without an adapter: their
 * bytes stay (a GEMM would have turned -0 into +0, and made NaN from 0 times
 * an infinite A). With fan_in_fan_out W is stored [in, out] and B's
 * structure runs along W's columns, which blocks of rows cannot follow: such
 * a module is one group [0, r) and one segment, as before, and its B is not
 * read when planning (convert-lora refuses fan_in_fan_out adapters, so no
 * fused one exists).
 *
 * Memory: planning holds one module's B (and a word per row) at a time and
 * keeps only its groups. At run time a module's A (the rows of its groups)
 * and B are read as F32 by the first block that needs them and freed by the
 * last, so only the modules in flight are in memory, plus per thread a block
 * of raw and of F32 rows and a block of B.
 *
 * The engine (items over file descriptors) knows nothing of checkpoints:
 * lora_merge_run feeds it every tensor of a base, lora_merge_targets only the
 * weights to update, wherever they live (a staging file of `ckpt convert`
 * with a lora_merge rule, blob files of the store's merge-lora job).
 */
#include "lora/lora.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/util.h"

#include <assert.h>
#include <cblas.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the engine: items over file descriptors ---- */

#define GEMM_ALIGN 64       /* bytes: where every GEMM operand starts */
#define NO_GROUP UINT32_MAX /* a row in no segment */

/* Columns k0..k1 of B and rows k0..k1 of A that a segment's GEMMs use;
 * those rows of A start a_off floats into module_state.A. */
typedef struct {
    uint64_t k0, k1;
    size_t a_off;
} col_group;

typedef struct {
    const lora_module *m;
    ckpt_dtype dtype;
    uint64_t rows, cols; /* the weight W being updated */
    float scale;         /* signed s x --scale */
    col_group *groups;   /* from planning */
    size_t ngroups;
    size_t a_floats; /* A's group rows, each group padded to GEMM_ALIGN */
    pthread_mutex_t mu;
    float *A, *B; /* F32 while blocks are pending: A by group, B [rows, r] */
    size_t pending;
} module_state;

typedef enum {
    ITEM_COPY, /* a whole tensor of nbytes, untouched */
    ITEM_KEEP, /* rows of an adapted weight whose update is zero: copied */
    ITEM_GEMM, /* a block of rows of an adapted weight, updated with column group `group` */
} item_kind;

/* src_off/dst_off are where the whole tensor starts; rows are those of
 * module state `mod`'s weight (ITEM_KEEP, ITEM_GEMM). */
typedef struct {
    item_kind kind;
    size_t lane; /* the output file: consecutive items go to different lanes */
    int src_fd, dst_fd;
    const char *src_path, *dst_path;
    uint64_t src_off, dst_off;
    uint64_t nbytes; /* ITEM_COPY */
    long mod;
    uint64_t row0, nrows;
    uint32_t group;
} merge_item;

typedef struct {
    const lora_adapter *ad;
    const lora_merge_opts *o;
    module_state *mods;
    size_t nmods;
    merge_item *items;
    size_t nitems, items_cap, next, nlanes;
    pthread_mutex_t mu;
    int err;
    char errmsg[2048];
    uint64_t done, total;
    ckpt_progress prog;
    double gemm_seconds;
    double flop;          /* 2 * M * N * K summed over the planned GEMMs */
    size_t block_floats;  /* per-thread buffer of a block of rows */
    size_t bblock_floats; /* per-thread buffer of a block of B */
    bool writeback;       /* outputs are fsynced at the end: start their writeback block by block */
} merge_engine;

static int engine_init(merge_engine *e, const lora_adapter *ad, const lora_merge_opts *o, size_t nmods)
{
    memset(e, 0, sizeof *e);
    e->ad = ad;
    e->o = o;
    e->nmods = nmods;
    e->block_floats = e->bblock_floats = 1;
    pthread_mutex_init(&e->mu, NULL);
    e->mods = ckpt_calloc(nmods + 1, sizeof *e->mods);
    if (!e->mods) return CKPT_ENOMEM;
    for (size_t i = 0; i < nmods; i++)
        pthread_mutex_init(&e->mods[i].mu, NULL);
    return 0;
}

static void engine_free(merge_engine *e)
{
    for (size_t i = 0; e->mods && i < e->nmods; i++) {
        free(e->mods[i].A);
        free(e->mods[i].B);
        free(e->mods[i].groups);
        pthread_mutex_destroy(&e->mods[i].mu);
    }
    free(e->mods);
    free(e->items);
    pthread_mutex_destroy(&e->mu);
    memset(e, 0, sizeof *e);
}

/* Module state i updates a rows x cols weight of dtype with module m. */
static void engine_set_module(merge_engine *e, size_t i, const lora_module *m, ckpt_dtype dtype, uint64_t rows,
                              uint64_t cols)
{
    double sign = e->o->unmerge ? -1.0 : 1.0, user = e->o->scale != 0 ? e->o->scale : 1.0;
    module_state *ms = &e->mods[i];
    ms->m = m;
    ms->dtype = dtype;
    ms->rows = rows;
    ms->cols = cols;
    ms->scale = (float)(sign * user * m->scale);
}

static int push_item(merge_engine *e, const merge_item *it)
{
    int rc = ckpt_grow(&e->items, &e->items_cap, e->nitems + 1, sizeof *e->items);
    if (!rc) e->items[e->nitems++] = *it;
    if (it->lane >= e->nlanes) e->nlanes = it->lane + 1;
    return rc;
}

static int engine_add_copy(merge_engine *e, merge_item it)
{
    it.kind = ITEM_COPY;
    it.mod = -1;
    if (it.nbytes == 0) return 0;
    e->total += it.nbytes;
    return push_item(e, &it);
}

/* Checks that a block of rows fits the BLAS int and returns rows per block. */
static int rows_per_block(const module_state *ms, uint64_t *rows)
{
    if (ms->rows > INT_MAX || ms->cols > INT_MAX || ms->m->rank > INT_MAX)
        return ckpt_error_set(CKPT_ELIMIT, "the weight of module '%s' is too large for one BLAS call",
                              ms->m->module);
    uint64_t per = LORA_BLOCK_BYTES / 4 / (ms->cols ? ms->cols : 1);
    *rows = per ? per : 1;
    return 0;
}

/* n floats starting on GEMM_ALIGN bytes (free with free). */
static float *alloc_floats(size_t n)
{
    void *p = NULL;
    if (n > (SIZE_MAX - GEMM_ALIGN) / sizeof(float) ||
        posix_memalign(&p, GEMM_ALIGN, n * sizeof(float) + GEMM_ALIGN)) {
        ckpt_error_set(CKPT_ENOMEM, "out of memory allocating %zu floats", n);
        return NULL;
    }
    return p;
}

/* Reads a whole adapter tensor as F32. */
static int load_f32(const lora_adapter *ad, const st_tensor *t, float **out)
{
    uint64_t n = t->shape[0] * t->shape[1], bytes;
    if (!ckpt_mul(n, 4, &bytes) || bytes > SIZE_MAX / 2)
        return ckpt_error_set(CKPT_ELIMIT, "tensor '%s' is too large", t->name);
    *out = ckpt_malloc((size_t)bytes + 1);
    void *raw = ckpt_malloc((size_t)t->nbytes + 1);
    int rc = *out && raw ? 0 : CKPT_ENOMEM;
    const ckpt_tensor_ref *ref = ckpt_checkpoint_find(&ad->ck, t->name);
    if (!rc) rc = st_read_tensor(&ad->ck.files[ref->file], t, raw);
    if (!rc) ckpt_convert(t->dtype, raw, CKPT_DT_F32, *out, (size_t)n);
    free(raw);
    if (rc) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

/* Module state ms's column groups, and in gid[row] the group of each row's
 * segment (NO_GROUP: an all-zero row of B). See the header comment. */
static int plan_groups(const merge_engine *e, module_state *ms, uint32_t *gid)
{
    uint64_t r = ms->m->rank, rows = ms->rows, acols = ms->m->a->shape[1];
    size_t cap = 0;
    assert(!ms->groups);
    if (e->ad->fan_in_fan_out || r == 0) {
        if (r && ckpt_grow(&ms->groups, &cap, 1, sizeof *ms->groups)) return CKPT_ENOMEM;
        if (r) ms->groups[ms->ngroups++] = (col_group){.k0 = 0, .k1 = r};
        for (uint64_t i = 0; i < rows; i++)
            gid[i] = r ? 0 : NO_GROUP;
    } else {
        /* cover: intervals starting minus ending at column k; join: intervals
         * holding both k and k + 1 starting minus ending at k. */
        int64_t *cover = ckpt_calloc(2 * (r + 1), sizeof *cover), *join = cover ? cover + r + 1 : NULL;
        float *B = NULL;
        int rc = cover ? load_f32(e->ad, ms->m->b, &B) : CKPT_ENOMEM;
        for (uint64_t i = 0; !rc && i < rows; i++) {
            const float *row = B + i * r;
            uint64_t lo = 0, hi = r;
            while (lo < r && row[lo] == 0) lo++;
            gid[i] = lo < r ? (uint32_t)lo : NO_GROUP; /* the first nonzero column, for now */
            if (lo == r) continue;
            while (row[hi - 1] == 0) hi--;
            cover[lo]++, cover[hi]--;
            if (hi - lo > 1) join[lo]++, join[hi - 1]--;
        }
        free(B);
        /* A group runs over covered columns while an interval joins each to the next;
         * cover[k] becomes column k's group. */
        int64_t covered = 0, joined = 0;
        bool open = false;
        for (uint64_t k = 0; !rc && k < r; k++) {
            covered += cover[k];
            joined += join[k];
            cover[k] = -1;
            if (covered == 0) continue;
            if (!open) {
                rc = ckpt_grow(&ms->groups, &cap, ms->ngroups + 1, sizeof *ms->groups);
                if (rc) break;
                ms->groups[ms->ngroups++] = (col_group){.k0 = k};
                open = true;
            }
            cover[k] = (int64_t)ms->ngroups - 1;
            if (joined == 0) {
                ms->groups[ms->ngroups - 1].k1 = k + 1;
                open = false;
            }
        }
        for (uint64_t i = 0; !rc && i < rows; i++)
            if (gid[i] != NO_GROUP) gid[i] = (uint32_t)cover[gid[i]];
        free(cover);
        if (rc) return rc;
    }
    /* Where each group's rows of A go: on GEMM_ALIGN bytes. */
    size_t at = 0, pad = GEMM_ALIGN / sizeof(float);
    for (size_t g = 0; g < ms->ngroups; g++) {
        uint64_t n;
        if (!ckpt_mul(ms->groups[g].k1 - ms->groups[g].k0, acols, &n) || n > SIZE_MAX / 8 - at)
            return ckpt_error_set(CKPT_ELIMIT, "lora_A of module '%s' is too large", ms->m->module);
        ms->groups[g].a_off = at;
        at += ((size_t)n + pad - 1) / pad * pad;
    }
    ms->a_floats = at;
    return 0;
}

/* The items of module state `mod`'s weight, read at (src_fd, src_off) and
 * written at (dst_fd, dst_off): the blocks of every segment, and a copy of
 * every run of rows outside them. */
static int engine_add_blocks(merge_engine *e, merge_item it, long mod)
{
    module_state *ms = &e->mods[mod];
    uint64_t per = 1;
    int rc = rows_per_block(ms, &per);
    if (rc) return rc;
    it.mod = mod;
    e->total += ms->rows * ms->cols * ckpt_dtype_size(ms->dtype);
    if (ms->rows == 0 || ms->cols == 0) return 0;
    uint32_t *gid = ckpt_malloc(ms->rows * sizeof *gid);
    rc = gid ? plan_groups(e, ms, gid) : CKPT_ENOMEM;
    for (uint64_t i = 0, j; !rc && i < ms->rows; i = j) {
        for (j = i + 1; j < ms->rows && gid[j] == gid[i]; j++)
            ;
        it.group = gid[i];
        if (gid[i] == NO_GROUP) {
            it.kind = ITEM_KEEP;
            it.row0 = i;
            it.nrows = j - i;
            rc = push_item(e, &it);
            continue;
        }
        const col_group *g = &ms->groups[gid[i]];
        uint64_t k = g->k1 - g->k0;
        it.kind = ITEM_GEMM;
        for (uint64_t r0 = i; !rc && r0 < j; r0 += per) {
            it.row0 = r0;
            it.nrows = j - r0 < per ? j - r0 : per;
            if (it.nrows * ms->cols > e->block_floats) e->block_floats = it.nrows * ms->cols;
            if (!e->ad->fan_in_fan_out && it.nrows * k > e->bblock_floats) e->bblock_floats = it.nrows * k;
            e->flop += 2.0 * (double)it.nrows * (double)ms->cols * (double)k;
            ms->pending++;
            rc = push_item(e, &it);
        }
    }
    free(gid);
    return rc;
}

/* Reorders the items (in lane order) so that consecutive items come from
 * different lanes (output files), `width` lanes at a time: a buffered write
 * holds its file's inode lock, so two threads writing one file take turns,
 * while two files are written at once. Only `width` lanes are open for work
 * at a time, so only the modules of those lanes' current blocks are in
 * memory. */
static int interleave_lanes(merge_engine *e, size_t width)
{
    if (width < 2 || e->nitems < 2 || e->nlanes < 2) return 0;
    merge_item *out = ckpt_malloc(e->nitems * sizeof *out);
    size_t nf = e->nlanes;
    size_t *pos = ckpt_calloc(nf + 1, sizeof *pos), *end = ckpt_calloc(nf + 1, sizeof *end);
    if (!out || !pos || !end) {
        free(out);
        free(pos);
        free(end);
        return CKPT_ENOMEM;
    }
    for (size_t i = 0; i < e->nitems; i++)
        end[e->items[i].lane] = i + 1;
    for (size_t f = 0, at = 0; f < nf; f++) {
        pos[f] = at;
        if (end[f] < at) end[f] = at;
        at = end[f];
    }
    size_t w = 0;
    for (size_t f0 = 0; f0 < nf; f0 += width) {
        size_t f1 = f0 + width < nf ? f0 + width : nf;
        for (bool more = true; more;) {
            more = false;
            for (size_t f = f0; f < f1; f++) {
                if (pos[f] == end[f]) continue;
                out[w++] = e->items[pos[f]++];
                more = true;
            }
        }
    }
    assert(w == e->nitems);
    free(e->items);
    e->items = out;
    e->items_cap = e->nitems;
    free(pos);
    free(end);
    return 0;
}

/* Reads the rows of module state ms's column groups of A as F32, each group
 * at its a_off. */
static int load_a(const lora_adapter *ad, module_state *ms)
{
    const st_tensor *t = ms->m->a;
    uint64_t acols = t->shape[1];
    size_t es = ckpt_dtype_size(t->dtype);
    uint8_t *raw = ckpt_malloc((size_t)t->nbytes + 1);
    ms->A = alloc_floats(ms->a_floats);
    int rc = raw && ms->A ? 0 : CKPT_ENOMEM;
    const ckpt_tensor_ref *ref = ckpt_checkpoint_find(&ad->ck, t->name);
    if (!rc) rc = st_read_tensor(&ad->ck.files[ref->file], t, raw);
    for (size_t g = 0; !rc && g < ms->ngroups; g++) {
        const col_group *cg = &ms->groups[g];
        ckpt_convert(t->dtype, raw + cg->k0 * acols * es, CKPT_DT_F32, ms->A + cg->a_off,
                     (size_t)((cg->k1 - cg->k0) * acols));
    }
    free(raw);
    if (rc) {
        free(ms->A);
        ms->A = NULL;
    }
    return rc;
}

static int module_acquire(merge_engine *e, module_state *ms)
{
    pthread_mutex_lock(&ms->mu);
    int rc = 0;
    if (!ms->A) {
        rc = load_a(e->ad, ms);
        if (!rc && (rc = load_f32(e->ad, ms->m->b, &ms->B))) {
            free(ms->A);
            ms->A = NULL;
        }
    }
    pthread_mutex_unlock(&ms->mu);
    return rc;
}

static void module_release(module_state *ms)
{
    pthread_mutex_lock(&ms->mu);
    if (--ms->pending == 0) {
        free(ms->A);
        free(ms->B);
        ms->A = ms->B = NULL;
    }
    pthread_mutex_unlock(&ms->mu);
}

/* C[nrows x cols] += s * (B @ A)[row0 : row0 + nrows, :] over the item's
 * column group [k0, k1): B's entries copied to bbuf ([nrows, K], ld = K),
 * A's rows k0..k1 in place (ld = cols). With fan_in_fan_out (W stored
 * [in, out], one group [0, r)) C += s * (A^T @ B^T)[row0 : ..., :]. */
static void block_gemm(const module_state *ms, bool fan_in_fan_out, const merge_item *it, float *bbuf,
                       float *cbuf)
{
    const col_group *g = &ms->groups[it->group];
    uint64_t r = ms->m->rank, k = g->k1 - g->k0;
    int rows = (int)it->nrows, cols = (int)ms->cols;
    const float *a = ms->A + g->a_off;
    if (!fan_in_fan_out) {
        for (uint64_t i = 0; i < it->nrows; i++)
            memcpy(bbuf + i * k, ms->B + (it->row0 + i) * r + g->k0, (size_t)k * sizeof *bbuf);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, cols, (int)k, ms->scale, bbuf, (int)k, a,
                    cols, 1.0f, cbuf, cols);
    } else
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasTrans, rows, cols, (int)r, ms->scale, a + it->row0,
                    (int)ms->rows, ms->B, (int)r, 1.0f, cbuf, cols);
}

/* Where an item's bytes start in its tensor, and how many. */
static uint64_t item_offset(const merge_engine *e, const merge_item *it)
{
    if (it->kind == ITEM_COPY) return 0;
    const module_state *ms = &e->mods[it->mod];
    return it->row0 * ms->cols * ckpt_dtype_size(ms->dtype);
}

static uint64_t item_bytes(const merge_engine *e, const merge_item *it)
{
    if (it->kind == ITEM_COPY) return it->nbytes;
    const module_state *ms = &e->mods[it->mod];
    return it->nrows * ms->cols * ckpt_dtype_size(ms->dtype);
}

/* Values of a merged block that cannot be stored as dtype: not finite, or
 * beyond its largest finite value (they would become inf). */
static uint64_t count_unfit(const float *v, uint64_t n, ckpt_dtype dt)
{
    float max = dt == CKPT_DT_F16 ? 65504.0f : FLT_MAX; /* bf16's range is float32's */
    uint64_t bad = 0;
    for (uint64_t i = 0; i < n; i++)
        bad += !isfinite(v[i]) || fabsf(v[i]) > max;
    return bad;
}

static int run_block(merge_engine *e, const merge_item *it, uint8_t *raw, float *bbuf, float *cbuf,
                     double *gemm_s)
{
    module_state *ms = &e->mods[it->mod];
    ckpt_dtype dt = ms->dtype;
    uint64_t n = it->nrows * ms->cols, off = item_offset(e, it), nbytes = item_bytes(e, it);
    int rc = module_acquire(e, ms);
    if (rc) return rc;
    uint8_t *dst = dt == CKPT_DT_F32 ? (uint8_t *)cbuf : raw;
    rc = ckpt_pread_full(it->src_fd, dst, (size_t)nbytes, it->src_off + off, it->src_path);
    if (!rc) {
        if (dt != CKPT_DT_F32) ckpt_convert(dt, raw, CKPT_DT_F32, cbuf, (size_t)n);
        uint64_t before = count_unfit(cbuf, n, dt);
        double t0 = ckpt_now();
        block_gemm(ms, e->ad->fan_in_fan_out, it, bbuf, cbuf);
        *gemm_s += ckpt_now() - t0;
        uint64_t after = count_unfit(cbuf, n, dt);
        if (after > before)
            rc = ckpt_error_set(CKPT_EINVAL,
                                "module '%s': the merge overflows: %llu weights of rows %llu-%llu are inf or "
                                "NaN (scale %g)",
                                ms->m->module, (unsigned long long)(after - before),
                                (unsigned long long)it->row0, (unsigned long long)(it->row0 + it->nrows - 1),
                                (double)ms->scale);
    }
    if (!rc) {
        if (dt != CKPT_DT_F32) ckpt_convert(CKPT_DT_F32, cbuf, dt, raw, (size_t)n);
        rc = ckpt_pwrite_full(it->dst_fd, dst, (size_t)nbytes, it->dst_off + off, it->dst_path);
    }
    module_release(ms);
    return rc;
}

static int run_item(merge_engine *e, const merge_item *it, uint8_t *raw, float *bbuf, float *cbuf,
                    double *gemm_s)
{
    if (it->kind == ITEM_GEMM) return run_block(e, it, raw, bbuf, cbuf, gemm_s);
    uint64_t off = item_offset(e, it);
    return ckpt_copy_range(it->src_fd, it->src_off + off, it->dst_fd, it->dst_off + off, item_bytes(e, it),
                           it->src_path);
}

static void *worker_main(void *arg)
{
    merge_engine *e = arg;
    float *cbuf = alloc_floats(e->block_floats), *bbuf = alloc_floats(e->bblock_floats);
    uint8_t *raw = ckpt_malloc(e->block_floats * 4 + 64);
    double gemm_s = 0;
    int rc = cbuf && bbuf && raw ? 0 : CKPT_ENOMEM;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        if (rc && !e->err) {
            e->err = rc;
            snprintf(e->errmsg, sizeof e->errmsg, "%s", ckpt_error_last());
        }
        if (e->err || e->next == e->nitems) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        const merge_item *it = &e->items[e->next++];
        pthread_mutex_unlock(&e->mu);
        rc = run_item(e, it, raw, bbuf, cbuf, &gemm_s);
        if (!rc && e->writeback) /* asynchronous: the final fsync then finds most bytes on their way */
            sync_file_range(it->dst_fd, (off_t)(it->dst_off + item_offset(e, it)), (off_t)item_bytes(e, it),
                            SYNC_FILE_RANGE_WRITE);
        if (!rc) {
            pthread_mutex_lock(&e->mu);
            e->done += item_bytes(e, it);
            if (!e->o->quiet) ckpt_progress_update(&e->prog, e->done);
            pthread_mutex_unlock(&e->mu);
        }
    }
    pthread_mutex_lock(&e->mu);
    e->gemm_seconds += gemm_s;
    pthread_mutex_unlock(&e->mu);
    free(cbuf);
    free(bbuf);
    free(raw);
    return NULL;
}

static int worker_count(const lora_merge_opts *o)
{
    int n = o->threads > 0 ? o->threads : 2;
    return n > LORA_MAX_THREADS ? LORA_MAX_THREADS : n;
}

static int run_workers(merge_engine *e)
{
    int rc = interleave_lanes(e, (size_t)worker_count(e->o));
    if (rc) return rc;
    int n = worker_count(e->o);
    openblas_set_num_threads(1);
    pthread_t th[LORA_MAX_THREADS];
    int started = 0;
    if (!e->o->quiet) ckpt_progress_start(&e->prog, e->o->unmerge ? "unmerge-lora" : "merge-lora", e->total);
    for (; started < n; started++)
        if (pthread_create(&th[started], NULL, worker_main, e)) break;
    if (started == 0) worker_main(e);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    if (!e->o->quiet && !e->err) ckpt_progress_finish(&e->prog);
    if (e->err) return ckpt_error_set(e->err, "%s", e->errmsg);
    return 0;
}

static double engine_gflop(const merge_engine *e)
{
    return e->flop / 1e9;
}

int lora_merge_targets(const lora_adapter *ad, const lora_merge_target *t, size_t n, const lora_merge_opts *o,
                       lora_merge_stats *stats)
{
    memset(stats, 0, sizeof *stats);
    double t0 = ckpt_now();
    merge_engine e;
    int rc = engine_init(&e, ad, o, n);
    for (size_t i = 0; !rc && i < n; i++) {
        engine_set_module(&e, i, t[i].m, t[i].dtype, t[i].rows, t[i].cols);
        /* A lane per output file, so targets in different files interleave. */
        size_t lane = 0;
        while (lane < i && t[lane].dst_fd != t[i].dst_fd) lane++;
        merge_item it = {.lane = lane, .src_fd = t[i].src_fd, .dst_fd = t[i].dst_fd, .src_path = t[i].src_path,
                         .dst_path = t[i].dst_path, .src_off = t[i].src_off, .dst_off = t[i].dst_off};
        rc = engine_add_blocks(&e, it, (long)i);
    }
    if (!rc) rc = run_workers(&e);
    if (!rc) {
        stats->modules = n;
        stats->bytes = e.total;
        stats->gflop = engine_gflop(&e);
        stats->gemm_seconds = e.gemm_seconds;
        stats->seconds = stats->work_seconds = ckpt_now() - t0;
    }
    engine_free(&e);
    return rc;
}

/* ---- merge-lora: a whole checkpoint ---- */

typedef struct {
    const lora_merge_opts *o;
    lora_adapter ad;
    ckpt_checkpoint base;
    st_layout *layouts; /* per base file */
    int *out_fds;
    char **out_paths;
    merge_engine e;
} merge_ctx;

static long module_of(merge_ctx *c, const char *tensor_name)
{
    size_t n = strlen(tensor_name);
    if (n <= 7 || strcmp(tensor_name + n - 7, ".weight")) return -1;
    char *mod = ckpt_strndup(tensor_name, n - 7);
    const lora_module *m = mod ? lora_adapter_find(&c->ad, mod) : NULL;
    free(mod);
    return m ? (long)(m - c->ad.mods) : -1;
}

/* Every tensor of every base file in output order: a copy, or the blocks of
 * its module (module state i is adapter module i). */
static int plan_items(merge_ctx *c)
{
    int rc = engine_init(&c->e, &c->ad, c->o, c->ad.nmods);
    c->e.writeback = true;
    for (size_t i = 0; !rc && i < c->ad.nmods; i++) {
        const lora_module *m = &c->ad.mods[i];
        char *wname = ckpt_sprintf("%s.weight", m->module);
        const ckpt_tensor_ref *ref = wname ? ckpt_checkpoint_find(&c->base, wname) : NULL;
        free(wname);
        if (!ref) return ckpt_error_set(CKPT_EINVAL, "module '%s' has no base weight", m->module);
        engine_set_module(&c->e, i, m, ref->t->dtype, ref->t->shape[0], ref->t->shape[1]);
    }
    for (size_t f = 0; !rc && f < c->base.nfiles; f++) {
        const st_file *sf = &c->base.files[f];
        const st_layout *l = &c->layouts[f];
        for (size_t k = 0; !rc && k < l->ntensors; k++) {
            const st_tensor *t = &sf->tensors[l->tensors[k].user];
            merge_item it = {.lane = f, .src_fd = sf->fd, .dst_fd = c->out_fds[f], .src_path = sf->path,
                             .dst_path = c->out_paths[f], .src_off = t->offset, .dst_off = l->tensors[k].offset,
                             .nbytes = t->nbytes};
            long mod = t->nbytes ? module_of(c, t->name) : -1;
            rc = mod < 0 ? engine_add_copy(&c->e, it) : engine_add_blocks(&c->e, it, mod);
        }
    }
    return rc;
}

/* ---- output files ---- */

int lora_merge_layout(st_layout *l, const st_file *sf)
{
    st_layout_init(l);
    int rc = 0;
    for (size_t i = 0; !rc && i < sf->ntensors; i++) {
        const st_tensor *t = &sf->tensors[i];
        rc = st_layout_add(l, t->name, t->dtype, t->ndim, t->shape, i);
    }
    for (size_t m = 0; !rc && m < sf->nmeta; m++)
        rc = st_layout_set_meta(l, sf->meta_keys[m], sf->meta_vals[m]);
    if (!rc) rc = st_layout_finish(l);
    return rc;
}

static int open_outputs(merge_ctx *c, const char *tmp)
{
    size_t nf = c->base.nfiles;
    c->layouts = ckpt_calloc(nf + 1, sizeof *c->layouts);
    c->out_fds = ckpt_calloc(nf + 1, sizeof *c->out_fds);
    c->out_paths = ckpt_calloc(nf + 1, sizeof *c->out_paths);
    if (!c->layouts || !c->out_fds || !c->out_paths) return CKPT_ENOMEM;
    for (size_t f = 0; f < nf; f++)
        c->out_fds[f] = -1;
    for (size_t f = 0; f < nf; f++) {
        const st_file *sf = &c->base.files[f];
        int rc = lora_merge_layout(&c->layouts[f], sf);
        if (rc) return ckpt_error_prefix(rc, "%s", sf->path);
        if (!(c->out_paths[f] = ckpt_path_join(tmp, ckpt_basename(sf->path)))) return CKPT_ENOMEM;
        c->out_fds[f] = open(c->out_paths[f], O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (c->out_fds[f] < 0) return ckpt_error_sys("%s: create", c->out_paths[f]);
        const st_layout *l = &c->layouts[f];
        if (ftruncate(c->out_fds[f], (off_t)l->file_size) < 0)
            return ckpt_error_sys("%s: truncate", c->out_paths[f]);
        rc = ckpt_pwrite_full(c->out_fds[f], l->header, l->header_len, 0, c->out_paths[f]);
        if (rc) return rc;
    }
    return 0;
}

static int close_outputs(merge_ctx *c, bool sync)
{
    int rc = 0;
    for (size_t f = 0; c->out_fds && f < c->base.nfiles; f++) {
        if (c->out_fds[f] < 0) continue;
        if (sync && !rc && fsync(c->out_fds[f]) < 0)
            rc = ckpt_error_sys("%s: fsync", c->out_paths[f]);
        if (close(c->out_fds[f]) < 0 && sync && !rc)
            rc = ckpt_error_sys("%s: close", c->out_paths[f]);
        c->out_fds[f] = -1;
    }
    return rc;
}

static int copy_index(const merge_ctx *c, const char *tmp)
{
    if (!c->base.index_path) return 0;
    char *text = NULL, *to = ckpt_path_join(tmp, ckpt_basename(c->base.index_path));
    size_t len = 0;
    int rc =
        to ? ckpt_read_file(c->base.index_path, CKPT_INDEX_MAX_BYTES, &text, &len) : CKPT_ENOMEM;
    if (!rc) rc = ckpt_write_file_atomic(to, text, len);
    free(text);
    free(to);
    return rc;
}

static void ctx_free(merge_ctx *c)
{
    close_outputs(c, false);
    for (size_t f = 0; c->layouts && f < c->base.nfiles; f++)
        st_layout_free(&c->layouts[f]);
    for (size_t f = 0; c->out_paths && f < c->base.nfiles; f++)
        free(c->out_paths[f]);
    free(c->layouts);
    free(c->out_fds);
    free(c->out_paths);
    if (c->e.o) engine_free(&c->e);
    ckpt_checkpoint_close(&c->base);
    lora_adapter_free(&c->ad);
}

int lora_merge_run(const char *base, const char *adapter, const char *dst, const lora_merge_opts *o,
                   lora_merge_stats *stats)
{
    merge_ctx c;
    memset(&c, 0, sizeof c);
    memset(stats, 0, sizeof *stats);
    c.o = o;
    double t0 = ckpt_now();
    int rc = lora_adapter_open(&c.ad, adapter);
    if (!rc) rc = ckpt_checkpoint_open(&c.base, base);
    if (!rc) rc = lora_adapter_check_base(&c.ad, &c.base);
    char *tmp = NULL;
    if (!rc) rc = outdir_prepare(dst, o->force, &tmp);
    if (!rc) rc = open_outputs(&c, tmp);
    if (!rc) rc = plan_items(&c);
    double t1 = ckpt_now();
    if (!rc) rc = run_workers(&c.e);
    double t2 = ckpt_now();
    if (!rc) rc = close_outputs(&c, true);
    if (!rc) rc = copy_index(&c, tmp);
    if (!rc) rc = outdir_copy_side_files(c.base.dir, tmp);
    if (!rc) rc = ckpt_fsync_dir(tmp);
    if (!rc) rc = outdir_commit(tmp, dst, o->force);
    if (rc && tmp) {
        close_outputs(&c, false);
        ckpt_rm_rf(tmp);
    }
    if (!rc) {
        stats->modules = c.e.nmods;
        stats->copied = 0;
        for (size_t i = 0; i < c.e.nitems; i++)
            stats->copied += c.e.items[i].kind == ITEM_COPY;
        stats->bytes = c.e.total;
        stats->gflop = engine_gflop(&c.e);
        stats->gemm_seconds = c.e.gemm_seconds;
        stats->seconds = ckpt_now() - t0;
        stats->work_seconds = t2 - t1;
        stats->sync_seconds = stats->seconds - (t2 - t0);
    }
    free(tmp);
    ctx_free(&c);
    return rc;
}

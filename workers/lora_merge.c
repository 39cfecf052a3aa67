/*
 * lora_merge.c — W' = W ± s * B @ A for every adapted weight of a base
 * checkpoint, written as a new checkpoint (see lora.h for the contract).
 *
 * The work is a list of items in output order: a whole untouched tensor to
 * copy in the kernel, or one block of rows of an adapted weight. Each worker
 * thread takes the next item; a block is read, widened to F32, updated by one
 * cblas_sgemm with beta = 1, rounded back and written at the same offset of
 * the output file. A module's A and B are read (as F32) by the first block
 * that needs them and freed by the last, so only the modules in flight are
 * in memory. OpenBLAS runs one thread per call: the parallelism is ours, and
 * it covers the reads, casts and writes as well as the GEMMs.
 *
 * The engine (items over file descriptors) knows nothing of checkpoints:
 * lora_merge_run feeds it every tensor of a base, lora_merge_targets only the
 * weights to update, wherever they live (a staging file of `ckpt convert`
 * with a lora_merge rule, blob files of the store's merge-lora job).
 */
#include "workers/lora.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/util.h"

#include <assert.h>
#include <cblas.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the engine: items over file descriptors ---- */

typedef struct {
    const lora_module *m;
    ckpt_dtype dtype;
    uint64_t rows, cols; /* the weight W being updated */
    float scale;         /* signed s x --scale */
    pthread_mutex_t mu;
    float *A, *B; /* F32 copies while blocks are pending */
    size_t pending;
} module_state;

/* A whole tensor to copy (mod < 0) or one block of rows of a weight to
 * update. src_off/dst_off are where the whole tensor starts. */
typedef struct {
    size_t lane; /* the output file: consecutive items go to different lanes */
    int src_fd, dst_fd;
    const char *src_path, *dst_path;
    uint64_t src_off, dst_off;
    uint64_t nbytes; /* copies */
    long mod;        /* module_state index, or -1: copy whole */
    uint64_t row0, nrows;
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
    size_t block_floats; /* per-thread buffer size */
    bool writeback;      /* outputs are fsynced at the end: start their writeback block by block */
} merge_engine;

static int engine_init(merge_engine *e, const lora_adapter *ad, const lora_merge_opts *o, size_t nmods)
{
    memset(e, 0, sizeof *e);
    e->ad = ad;
    e->o = o;
    e->nmods = nmods;
    e->block_floats = LORA_BLOCK_BYTES / 4;
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

/* The blocks of rows of module state `mod`'s weight, read at (src_fd,
 * src_off) and written at (dst_fd, dst_off). */
static int engine_add_blocks(merge_engine *e, merge_item it, long mod)
{
    module_state *ms = &e->mods[mod];
    uint64_t per = 1;
    int rc = rows_per_block(ms, &per);
    if (rc) return rc;
    if (per * ms->cols > e->block_floats) e->block_floats = per * ms->cols;
    it.mod = mod;
    e->total += ms->rows * ms->cols * ckpt_dtype_size(ms->dtype);
    for (uint64_t r0 = 0; !rc && r0 < ms->rows; r0 += per) {
        it.row0 = r0;
        it.nrows = ms->rows - r0 < per ? ms->rows - r0 : per;
        ms->pending++;
        rc = push_item(e, &it);
    }
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

static int module_acquire(merge_engine *e, module_state *ms)
{
    pthread_mutex_lock(&ms->mu);
    int rc = 0;
    if (!ms->A) {
        rc = load_f32(e->ad, ms->m->a, &ms->A);
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

/* C[nrows x cols] += s * (B @ A)[row0 : row0 + nrows, :], or with
 * fan_in_fan_out (W stored [in, out]) C += s * (A^T @ B^T)[row0 : ..., :]. */
static void block_gemm(const module_state *ms, bool fan_in_fan_out, const merge_item *it, float *cbuf)
{
    int rows = (int)it->nrows, cols = (int)ms->cols, r = (int)ms->m->rank;
    if (!fan_in_fan_out)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, cols, r, ms->scale,
                    ms->B + it->row0 * (uint64_t)r, r, ms->A, cols, 1.0f, cbuf, cols);
    else
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasTrans, rows, cols, r, ms->scale, ms->A + it->row0,
                    (int)ms->rows, ms->B, r, 1.0f, cbuf, cols);
}

static int run_block(merge_engine *e, const merge_item *it, uint8_t *raw, float *cbuf, double *gemm_s)
{
    module_state *ms = &e->mods[it->mod];
    ckpt_dtype dt = ms->dtype;
    size_t es = ckpt_dtype_size(dt);
    uint64_t n = it->nrows * ms->cols, off = it->row0 * ms->cols * es;
    int rc = module_acquire(e, ms);
    if (rc) return rc;
    uint8_t *dst = dt == CKPT_DT_F32 ? (uint8_t *)cbuf : raw;
    rc = ckpt_pread_full(it->src_fd, dst, (size_t)(n * es), it->src_off + off, it->src_path);
    if (!rc) {
        if (dt != CKPT_DT_F32) ckpt_convert(dt, raw, CKPT_DT_F32, cbuf, (size_t)n);
        double t0 = ckpt_now();
        block_gemm(ms, e->ad->fan_in_fan_out, it, cbuf);
        *gemm_s += ckpt_now() - t0;
        if (dt != CKPT_DT_F32) ckpt_convert(CKPT_DT_F32, cbuf, dt, raw, (size_t)n);
        rc = ckpt_pwrite_full(it->dst_fd, dst, (size_t)(n * es), it->dst_off + off, it->dst_path);
    }
    module_release(ms);
    return rc;
}

static int run_item(merge_engine *e, const merge_item *it, uint8_t *raw, float *cbuf, double *gemm_s)
{
    if (it->mod >= 0) return run_block(e, it, raw, cbuf, gemm_s);
    return ckpt_copy_range(it->src_fd, it->src_off, it->dst_fd, it->dst_off, it->nbytes, it->src_path);
}

static uint64_t item_bytes(const merge_engine *e, const merge_item *it)
{
    if (it->mod < 0) return it->nbytes;
    const module_state *ms = &e->mods[it->mod];
    return it->nrows * ms->cols * ckpt_dtype_size(ms->dtype);
}

static void *worker_main(void *arg)
{
    merge_engine *e = arg;
    float *cbuf = ckpt_malloc(e->block_floats * 4 + 64);
    uint8_t *raw = ckpt_malloc(e->block_floats * 4 + 64);
    double gemm_s = 0;
    int rc = cbuf && raw ? 0 : CKPT_ENOMEM;
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
        rc = run_item(e, it, raw, cbuf, &gemm_s);
        if (!rc && e->writeback) {
            /* Asynchronous: the final fsync then finds most bytes on their way. */
            uint64_t off = it->mod < 0 ? 0 : it->row0 * e->mods[it->mod].cols * ckpt_dtype_size(e->mods[it->mod].dtype);
            sync_file_range(it->dst_fd, (off_t)(it->dst_off + off), (off_t)item_bytes(e, it), SYNC_FILE_RANGE_WRITE);
        }
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
    double g = 0;
    for (size_t i = 0; i < e->nmods; i++)
        if (e->mods[i].m)
            g += 2.0 * (double)e->mods[i].rows * (double)e->mods[i].cols * (double)e->mods[i].m->rank / 1e9;
    return g;
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
    if (!rc) rc = convert_prepare_dst(dst, o->force, &tmp);
    if (!rc) rc = open_outputs(&c, tmp);
    if (!rc) rc = plan_items(&c);
    double t1 = ckpt_now();
    if (!rc) rc = run_workers(&c.e);
    double t2 = ckpt_now();
    if (!rc) rc = close_outputs(&c, true);
    if (!rc) rc = copy_index(&c, tmp);
    if (!rc) rc = convert_copy_side_files(c.base.dir, tmp);
    if (!rc) rc = ckpt_fsync_dir(tmp);
    if (!rc) rc = convert_commit_dst(tmp, dst, o->force);
    if (rc && tmp) {
        close_outputs(&c, false);
        ckpt_rm_rf(tmp);
    }
    if (!rc) {
        stats->modules = c.e.nmods;
        stats->copied = 0;
        for (size_t i = 0; i < c.e.nitems; i++)
            stats->copied += c.e.items[i].mod < 0;
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

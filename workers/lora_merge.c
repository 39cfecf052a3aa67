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

typedef struct {
    const lora_module *m;
    const st_tensor *w; /* the base weight */
    float scale;        /* signed s x --scale */
    pthread_mutex_t mu;
    float *A, *B; /* F32 copies while blocks are pending */
    size_t pending;
} module_state;

typedef struct {
    size_t file;        /* base file = output file */
    const st_tensor *t; /* source tensor */
    uint64_t out_off;   /* where the tensor starts in the output file */
    long mod;           /* module_state index, or -1: copy whole */
    uint64_t row0, nrows;
} merge_item;

typedef struct {
    const lora_merge_opts *o;
    lora_adapter ad;
    ckpt_checkpoint base;
    st_layout *layouts; /* per base file */
    int *out_fds;
    char **out_paths;
    module_state *mods;
    size_t nmods;
    merge_item *items;
    size_t nitems, items_cap, next;
    pthread_mutex_t mu;
    int err;
    char errmsg[2048];
    uint64_t done, total;
    ckpt_progress prog;
    double gemm_seconds;
    size_t block_floats; /* per-thread buffer size */
} merge_ctx;

/* ---- planning ---- */

static int push_item(merge_ctx *c, const merge_item *it)
{
    int rc = ckpt_grow(&c->items, &c->items_cap, c->nitems + 1, sizeof *c->items);
    if (!rc) c->items[c->nitems++] = *it;
    return rc;
}

static long module_of(merge_ctx *c, const char *tensor_name)
{
    size_t n = strlen(tensor_name);
    if (n <= 7 || strcmp(tensor_name + n - 7, ".weight")) return -1;
    char *mod = ckpt_strndup(tensor_name, n - 7);
    const lora_module *m = mod ? lora_adapter_find(&c->ad, mod) : NULL;
    free(mod);
    return m ? (long)(m - c->ad.mods) : -1;
}

/* Checks that a block of rows fits the BLAS int and our buffer, and returns
 * rows per block. */
static int rows_per_block(const st_tensor *w, uint64_t r, uint64_t *rows)
{
    uint64_t cols = w->shape[1];
    if (w->shape[0] > INT_MAX || cols > INT_MAX || r > INT_MAX)
        return ckpt_error_set(CKPT_ELIMIT, "tensor '%s' is too large for one BLAS call", w->name);
    uint64_t per = LORA_BLOCK_BYTES / 4 / (cols ? cols : 1);
    *rows = per ? per : 1;
    return 0;
}

static int plan_items(merge_ctx *c)
{
    c->nmods = c->ad.nmods;
    c->mods = ckpt_calloc(c->nmods + 1, sizeof *c->mods);
    if (!c->mods) return CKPT_ENOMEM;
    double sign = c->o->unmerge ? -1.0 : 1.0, user = c->o->scale != 0 ? c->o->scale : 1.0;
    for (size_t i = 0; i < c->nmods; i++) {
        module_state *ms = &c->mods[i];
        ms->m = &c->ad.mods[i];
        char *wname = ckpt_sprintf("%s.weight", ms->m->module);
        const ckpt_tensor_ref *ref = wname ? ckpt_checkpoint_find(&c->base, wname) : NULL;
        free(wname);
        if (!ref)
            return ckpt_error_set(CKPT_EINVAL, "module '%s' has no base weight", ms->m->module);
        ms->w = ref->t;
        ms->scale = (float)(sign * user * ms->m->scale);
        pthread_mutex_init(&ms->mu, NULL);
    }
    c->block_floats = LORA_BLOCK_BYTES / 4;
    for (size_t f = 0; f < c->base.nfiles; f++) {
        const st_file *sf = &c->base.files[f];
        const st_layout *l = &c->layouts[f];
        for (size_t k = 0; k < l->ntensors; k++) {
            const st_tensor *t = &sf->tensors[l->tensors[k].user];
            merge_item it = {
                .file = f, .t = t, .out_off = l->tensors[k].offset, .mod = module_of(c, t->name)};
            if (t->nbytes == 0) continue;
            c->total += t->nbytes;
            if (it.mod < 0) {
                int rc = push_item(c, &it);
                if (rc) return rc;
                continue;
            }
            module_state *ms = &c->mods[it.mod];
            uint64_t per = 1;
            int rc = rows_per_block(t, ms->m->rank, &per);
            if (rc) return rc;
            if (per * t->shape[1] > c->block_floats) c->block_floats = per * t->shape[1];
            for (uint64_t r0 = 0; r0 < t->shape[0]; r0 += per) {
                it.row0 = r0;
                it.nrows = t->shape[0] - r0 < per ? t->shape[0] - r0 : per;
                ms->pending++;
                if ((rc = push_item(c, &it))) return rc;
            }
        }
    }
    return 0;
}

/* Reorders the items (in file order) so that consecutive items come from
 * different files, `width` files at a time: a buffered write holds its
 * file's inode lock, so two threads writing one file take turns, while two
 * files are written at once. Only `width` files are open for work at a time,
 * so only the modules of those files' current blocks are in memory. */
static int interleave_files(merge_ctx *c, size_t width)
{
    if (width < 2 || c->nitems < 2) return 0;
    merge_item *out = ckpt_malloc(c->nitems * sizeof *out);
    size_t nf = c->base.nfiles;
    size_t *pos = ckpt_calloc(nf + 1, sizeof *pos), *end = ckpt_calloc(nf + 1, sizeof *end);
    if (!out || !pos || !end) {
        free(out);
        free(pos);
        free(end);
        return CKPT_ENOMEM;
    }
    for (size_t i = 0; i < c->nitems; i++)
        end[c->items[i].file] = i + 1;
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
                out[w++] = c->items[pos[f]++];
                more = true;
            }
        }
    }
    assert(w == c->nitems);
    free(c->items);
    c->items = out;
    c->items_cap = c->nitems;
    free(pos);
    free(end);
    return 0;
}

/* ---- running ---- */

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

static int module_acquire(merge_ctx *c, module_state *ms)
{
    pthread_mutex_lock(&ms->mu);
    int rc = 0;
    if (!ms->A) {
        rc = load_f32(&c->ad, ms->m->a, &ms->A);
        if (!rc && (rc = load_f32(&c->ad, ms->m->b, &ms->B))) {
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
static void block_gemm(const module_state *ms, bool fan_in_fan_out, const merge_item *it,
                       float *cbuf)
{
    int rows = (int)it->nrows, cols = (int)ms->w->shape[1], r = (int)ms->m->rank;
    if (!fan_in_fan_out)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, cols, r, ms->scale,
                    ms->B + it->row0 * (uint64_t)r, r, ms->A, cols, 1.0f, cbuf, cols);
    else
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasTrans, rows, cols, r, ms->scale,
                    ms->A + it->row0, (int)ms->w->shape[0], ms->B, r, 1.0f, cbuf, cols);
}

static int run_block(merge_ctx *c, const merge_item *it, uint8_t *raw, float *cbuf, double *gemm_s)
{
    module_state *ms = &c->mods[it->mod];
    const st_file *sf = &c->base.files[it->file];
    ckpt_dtype dt = it->t->dtype;
    size_t es = ckpt_dtype_size(dt);
    uint64_t cols = it->t->shape[1], n = it->nrows * cols, off = it->row0 * cols * es;
    int rc = module_acquire(c, ms);
    if (rc) return rc;
    uint8_t *dst = dt == CKPT_DT_F32 ? (uint8_t *)cbuf : raw;
    rc = ckpt_pread_full(sf->fd, dst, (size_t)(n * es), it->t->offset + off, sf->path);
    if (!rc) {
        if (dt != CKPT_DT_F32) ckpt_convert(dt, raw, CKPT_DT_F32, cbuf, (size_t)n);
        double t0 = ckpt_now();
        block_gemm(ms, c->ad.fan_in_fan_out, it, cbuf);
        *gemm_s += ckpt_now() - t0;
        if (dt != CKPT_DT_F32) ckpt_convert(CKPT_DT_F32, cbuf, dt, raw, (size_t)n);
        rc = ckpt_pwrite_full(c->out_fds[it->file], dst, (size_t)(n * es), it->out_off + off,
                              c->out_paths[it->file]);
    }
    module_release(ms);
    return rc;
}

static int run_item(merge_ctx *c, const merge_item *it, uint8_t *raw, float *cbuf, double *gemm_s)
{
    if (it->mod >= 0) return run_block(c, it, raw, cbuf, gemm_s);
    const st_file *sf = &c->base.files[it->file];
    return ckpt_copy_range(sf->fd, it->t->offset, c->out_fds[it->file], it->out_off, it->t->nbytes,
                           sf->path);
}

static uint64_t item_bytes(const merge_item *it)
{
    if (it->mod < 0) return it->t->nbytes;
    return it->nrows * it->t->shape[1] * ckpt_dtype_size(it->t->dtype);
}

static void *worker_main(void *arg)
{
    merge_ctx *c = arg;
    float *cbuf = ckpt_malloc(c->block_floats * 4 + 64);
    uint8_t *raw = ckpt_malloc(c->block_floats * 4 + 64);
    double gemm_s = 0;
    int rc = cbuf && raw ? 0 : CKPT_ENOMEM;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        if (rc && !c->err) {
            c->err = rc;
            snprintf(c->errmsg, sizeof c->errmsg, "%s", ckpt_error_last());
        }
        if (c->err || c->next == c->nitems) {
            pthread_mutex_unlock(&c->mu);
            break;
        }
        const merge_item *it = &c->items[c->next++];
        pthread_mutex_unlock(&c->mu);
        rc = run_item(c, it, raw, cbuf, &gemm_s);
        if (!rc) {
            pthread_mutex_lock(&c->mu);
            c->done += item_bytes(it);
            if (!c->o->quiet) ckpt_progress_update(&c->prog, c->done);
            pthread_mutex_unlock(&c->mu);
        }
    }
    pthread_mutex_lock(&c->mu);
    c->gemm_seconds += gemm_s;
    pthread_mutex_unlock(&c->mu);
    free(cbuf);
    free(raw);
    return NULL;
}

static int worker_count(const lora_merge_opts *o)
{
    int n = o->threads > 0 ? o->threads : 2;
    return n > LORA_MAX_THREADS ? LORA_MAX_THREADS : n;
}

static int run_workers(merge_ctx *c)
{
    int n = worker_count(c->o);
    openblas_set_num_threads(1);
    pthread_t th[LORA_MAX_THREADS];
    int started = 0;
    if (!c->o->quiet)
        ckpt_progress_start(&c->prog, c->o->unmerge ? "unmerge-lora" : "merge-lora", c->total);
    for (; started < n; started++)
        if (pthread_create(&th[started], NULL, worker_main, c)) break;
    if (started == 0) worker_main(c);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    if (!c->o->quiet && !c->err) ckpt_progress_finish(&c->prog);
    if (c->err) return ckpt_error_set(c->err, "%s", c->errmsg);
    return 0;
}

/* ---- output files ---- */

static int layout_file(st_layout *l, const st_file *sf)
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
        int rc = layout_file(&c->layouts[f], sf);
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
    for (size_t i = 0; c->mods && i < c->nmods; i++) {
        free(c->mods[i].A);
        free(c->mods[i].B);
        pthread_mutex_destroy(&c->mods[i].mu);
    }
    free(c->mods);
    free(c->items);
    ckpt_checkpoint_close(&c->base);
    lora_adapter_free(&c->ad);
    pthread_mutex_destroy(&c->mu);
}

int lora_merge_run(const char *base, const char *adapter, const char *dst, const lora_merge_opts *o,
                   lora_merge_stats *stats)
{
    merge_ctx c;
    memset(&c, 0, sizeof c);
    memset(stats, 0, sizeof *stats);
    c.o = o;
    pthread_mutex_init(&c.mu, NULL);
    double t0 = ckpt_now();
    int rc = lora_adapter_open(&c.ad, adapter);
    if (!rc) rc = ckpt_checkpoint_open(&c.base, base);
    if (!rc) rc = lora_adapter_check_base(&c.ad, &c.base);
    char *tmp = NULL;
    if (!rc) rc = convert_prepare_dst(dst, o->force, &tmp);
    if (!rc) rc = open_outputs(&c, tmp);
    if (!rc) rc = plan_items(&c);
    if (!rc) rc = interleave_files(&c, (size_t)worker_count(o));
    double t1 = ckpt_now();
    if (!rc) rc = run_workers(&c);
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
        stats->modules = c.nmods;
        stats->copied = 0;
        for (size_t i = 0; i < c.nitems; i++)
            stats->copied += c.items[i].mod < 0;
        stats->bytes = c.total;
        for (size_t i = 0; i < c.nmods; i++) {
            const st_tensor *w = c.mods[i].w;
            stats->gflop +=
                2.0 * (double)w->shape[0] * (double)w->shape[1] * (double)c.mods[i].m->rank / 1e9;
        }
        stats->gemm_seconds = c.gemm_seconds;
        stats->seconds = ckpt_now() - t0;
        stats->work_seconds = t2 - t1;
        stats->sync_seconds = stats->seconds - (t2 - t0);
    }
    free(tmp);
    ctx_free(&c);
    return rc;
}

/* easydel_import.c — EasyDeL TensorStore checkpoint to Hugging Face (easydel_import.h). */
#include "transform/easydel_import.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "format/checkpoint.h"
#include "format/easydel.h"
#include "format/safetensors.h"
#include "transform/state_convert.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

json_t *easydel_inverse_rules(void)
{
    /* The easydel preset (presets.c) in reverse order, each op inverted. */
    return json_pack(
        "{s:s, s:i, s:s, s:i, s:[{s:s, s:s, s:s, s:b}, {s:s, s:s, s:s}, {s:s, s:s, s:s}, {s:s, s:s, s:s}]}", "format",
        "ckpt-rules", "version", 1, "layout", "hf", "tp", 1, "rules",
        /* stacked experts [E, in, out] -> E tensors [out, in] */
        "op", "unstack_experts", "pattern", "^(.*)\\.experts\\.([A-Za-z0-9_]+)\\.kernel$", "output",
        "$1.experts.{e}.$2.weight", "transpose_last2", 1,
        /* embeddings and norms were renamed */
        "op", "rename", "pattern", "^(.*embed_tokens)\\.embedding$", "replacement", "$1.weight",
        "op", "rename", "pattern", "^(.*norm)\\.scale$", "replacement", "$1.weight",
        /* every other kernel [in, out] was transposed from [out, in] */
        "op", "transpose", "pattern", "^(.*)\\.kernel$", "replacement", "$1.weight");
}

/* ---- the arrays as sources made on demand (plan/executor.h, exec_vsource) ----
 *
 * The arrays are laid out as if staged in safetensors files (model.safetensors,
 * optimizer.safetensors in the temp folder), but those files are never
 * written: the plan is made over their headers alone, and the executor's
 * reads of their bytes are served by decoding the arrays (arrays_view). Each
 * array is read one of three ways, chosen once the plan is known:
 *   whole   - at most EASYDEL_DECODE_MAX_BYTES: a worker decodes it once into
 *             its own memory and serves every read (a transpose's tiles) from it;
 *   stream  - larger, one chunk holding the whole array, and only copied front
 *             to back by the plan (an embedding renamed): decoded in order into
 *             a window of EXEC_BAND_BYTES;
 *   staged  - anything else larger (a transposed lm_head): decoded by the
 *             first worker that needs it into a scratch file in the temp
 *             folder (the other worker goes on with other tensors meanwhile),
 *             then read through a mapping of the span asked for. */

enum { READ_WHOLE, READ_STREAM, READ_STAGED, READ_BAND };

typedef struct {
    const easydel_array *a;
    uint64_t offset, nbytes; /* the array's bytes in its staged file's layout */
    int how;
    uint64_t scratch_off; /* READ_STAGED: where it goes in the scratch file */
    int staged;           /* ... 1 once there, -1 when that failed (under varrays.mu) */
} varray;

typedef struct {
    size_t src_file; /* exec_plan.src_paths index */
    varray *arrays;  /* by offset */
    size_t n;
} vfile;

typedef struct {
    vfile files[2]; /* model, optimizer */
    size_t nfiles;
    int scratch_fd; /* READ_STAGED arrays, or -1 */
    char *scratch_path;
    pthread_mutex_t mu; /* staging one array at a time */
    uint64_t band_max;  /* READ_BAND: bytes of the workers' bands together */
    pthread_mutex_t band_mu;
    pthread_cond_t band_cv; /* a worker gave back band bytes */
    uint64_t band_held;     /* bytes of the bands allocated (their band_cap), under band_mu */
} varrays;

typedef struct {
    zarr_decoder *d;
    const easydel_array *held; /* READ_WHOLE: the array in buf */
    uint8_t *buf;
    size_t cap;
    const easydel_array *streaming; /* READ_STREAM: the array d decodes */
    uint64_t pos;                   /* its bytes decoded so far */
    uint8_t *win;                   /* EXEC_BAND_BYTES: its bytes [wa, wb) */
    uint64_t wa, wb;
    void *map; /* READ_STAGED: the window mapped last, scratch bytes [map_base, +map_len) */
    uint64_t map_base;
    size_t map_len;
    const easydel_array *banded; /* READ_BAND: columns [band_c0, +band_w) of every row of it in band */
    uint64_t band_c0, band_w;
    uint8_t *band;
    size_t band_cap;
} vthread;

static bool arrays_serve(void *ctx, size_t file)
{
    const varrays *v = ctx;
    for (size_t i = 0; i < v->nfiles; i++)
        if (v->files[i].src_file == file) return true;
    return false;
}

static void *arrays_thread_open(void *ctx)
{
    vthread *t = ckpt_calloc(1, sizeof *t);
    if (t && !(t->d = zarr_decoder_new())) {
        free(t);
        t = NULL;
    }
    return t;
}

/* The worker's band freed and its bytes given back to the budget. */
static void band_release(varrays *v, vthread *t)
{
    t->banded = NULL;
    if (!t->band_cap) return;
    pthread_mutex_lock(&v->band_mu);
    v->band_held -= t->band_cap;
    pthread_cond_broadcast(&v->band_cv);
    pthread_mutex_unlock(&v->band_mu);
    ckpt_big_free(t->band, t->band_cap);
    t->band = NULL;
    t->band_cap = 0;
}

/* A band of `want` columns of nrows rows, or fewer (at least `least`) when
 * the other workers' bands leave less of the budget: waits until they
 * do. A worker waiting holds no band (its own counts as free), and one
 * holding a band gives it back when it reads another array or stops, never
 * waiting for this one: no deadlock. *cols: the band's columns. */
static int band_take(varrays *v, vthread *t, uint64_t nrows, size_t es, uint64_t want, uint64_t least, uint64_t *cols)
{
    int rc = 0;
    pthread_mutex_lock(&v->band_mu);
    for (;;) {
        uint64_t others = v->band_held - t->band_cap, avail = v->band_max > others ? v->band_max - others : 0;
        *cols = avail / es / nrows < want ? avail / es / nrows : want;
        if (*cols >= least) break;
        pthread_cond_wait(&v->band_cv, &v->band_mu);
    }
    uint64_t need = nrows * *cols * es;
    if (need > t->band_cap) {
        v->band_held -= t->band_cap;
        ckpt_big_free(t->band, t->band_cap);
        t->band_cap = 0;
        if ((t->band = ckpt_big_alloc((size_t)need))) {
            t->band_cap = (size_t)need;
            v->band_held += need;
        } else {
            rc = CKPT_ENOMEM;
        }
        pthread_cond_broadcast(&v->band_cv);
    }
    pthread_mutex_unlock(&v->band_mu);
    return rc;
}

static void arrays_thread_close(void *ctx, void *ts)
{
    vthread *t = ts;
    if (!t) return;
    band_release(ctx, t);
    zarr_decoder_free(t->d);
    if (t->map) munmap(t->map, t->map_len);
    ckpt_big_free(t->buf, t->cap);
    ckpt_big_free(t->win, EXEC_BAND_BYTES);
    free(t);
}

typedef struct {
    uint8_t *buf;
    uint64_t nbytes;
    const char *label;
} mem_sink;

static int to_mem(void *vctx, uint64_t off, const void *buf, size_t len)
{
    mem_sink *m = vctx;
    if (off > m->nbytes || len > m->nbytes - off) return ckpt_error_set(CKPT_EINVAL, "%s: array bytes out of range", m->label);
    memcpy(m->buf + off, buf, len);
    return 0;
}

/* True when the array is one chunk of exactly its shape: its chunk's bytes are its bytes. */
static bool one_chunk(const zarr_array *z)
{
    return z->nchunks == 1 && z->chunk_nbytes == z->nbytes;
}

/* The whole array into buf (a->z.nbytes): one chunk of its shape decoded
 * straight into place, else chunk by chunk through zarr_read. */
static int decode_whole(zarr_decoder *d, const easydel_array *a, uint8_t *buf)
{
    if (one_chunk(&a->z)) {
        uint64_t idx[CKPT_MAX_RANK] = {0};
        int rc = zarr_decoder_start(d, &a->z, idx, NULL);
        if (!rc) rc = zarr_decoder_read(d, buf, (size_t)a->z.nbytes);
        return rc ? rc : zarr_decoder_end(d); /* (a failed chunk is closed by the next start) */
    }
    mem_sink m = {.buf = buf, .nbytes = a->z.nbytes, .label = a->z.label};
    return zarr_read(&a->z, to_mem, &m, NULL);
}

/* READ_STREAM: bytes [lo, lo+len) of the array into t->win, decoding on from
 * where the stream is (from the start again for an earlier byte); or, with
 * `into` and none of them in the window, decoded straight into `into`. */
static int stream_bytes(vthread *t, const easydel_array *a, uint64_t lo, size_t len, uint8_t *into,
                        const uint8_t **out)
{
    if (!t->win && !(t->win = ckpt_big_alloc(EXEC_BAND_BYTES))) return CKPT_ENOMEM;
    if (t->streaming == a && lo >= t->wa && lo + len <= t->wb) {
        *out = t->win + (lo - t->wa);
        if (into) memcpy(into, *out, len);
        return 0;
    }
    int rc = 0;
    if (t->streaming != a || lo < t->wa) {
        uint64_t idx[CKPT_MAX_RANK] = {0};
        t->streaming = NULL;
        if ((rc = zarr_decoder_start(t->d, &a->z, idx, NULL))) return rc;
        t->streaming = a;
        t->pos = t->wa = t->wb = 0;
    }
    size_t keep = 0;
    uint8_t *dst = into;
    if (lo < t->wb) { /* the window's tail is the read's head */
        keep = (size_t)(t->wb - lo);
        memmove(t->win, t->win + (lo - t->wa), keep);
        dst = NULL;
    }
    while (!rc && t->pos < lo) { /* bytes before the read: decoded and dropped */
        size_t n = (size_t)(lo - t->pos < EXEC_BAND_BYTES ? lo - t->pos : EXEC_BAND_BYTES);
        rc = zarr_decoder_read(t->d, t->win, n);
        t->pos += n;
    }
    if (!rc) rc = zarr_decoder_read(t->d, dst ? dst : t->win + keep, len - keep);
    t->pos = lo + len;
    t->wa = dst ? t->pos : lo; /* (decoded into `into`: the window holds nothing) */
    t->wb = lo + len;
    if (!rc && t->pos == a->z.nbytes) rc = zarr_decoder_end(t->d); /* and nothing follows */
    if (rc) {
        t->streaming = NULL;
        return rc;
    }
    if (into && !dst) memcpy(into, t->win, len);
    *out = into ? into : t->win;
    return 0;
}

typedef struct {
    int fd;
    uint64_t base, nbytes;
    const char *path;
} sink_ctx;

static int to_file(void *vctx, uint64_t off, const void *buf, size_t len)
{
    sink_ctx *s = vctx;
    if (off > s->nbytes || len > s->nbytes - off)
        return ckpt_error_set(CKPT_EINVAL, "%s: array bytes out of range", s->path);
    return ckpt_pwrite_full(s->fd, buf, len, s->base + off, s->path);
}

/* READ_STAGED: the array decoded into the scratch file once (by whichever
 * worker comes first; another waits), then read through a mapped window of
 * STAGED_MAP_BYTES holding bytes [lo, lo+len) (reused by the next reads it
 * holds: a transposed tile's walks come in order; only the pages a walk
 * touches are read in). */
#define STAGED_MAP_BYTES (32ull << 20)
static int staged_view(varrays *v, vthread *t, varray *va, uint64_t lo, size_t len, const uint8_t **out)
{
    pthread_mutex_lock(&v->mu);
    int rc = 0;
    if (va->staged == 0) {
        sink_ctx sc = {.fd = v->scratch_fd, .base = va->scratch_off, .nbytes = va->nbytes, .path = v->scratch_path};
        rc = zarr_read(&va->a->z, to_file, &sc, NULL);
        va->staged = rc ? -1 : 1;
    } else if (va->staged < 0) {
        rc = ckpt_error_set(CKPT_EIO, "%s: staging it failed", va->a->z.label);
    }
    pthread_mutex_unlock(&v->mu);
    if (rc) return rc;
    uint64_t start = va->scratch_off + lo;
    if (!t->map || start < t->map_base || start + len > t->map_base + t->map_len) {
        if (t->map) munmap(t->map, t->map_len);
        t->map = NULL;
        uint64_t base = start / STAGED_MAP_BYTES * STAGED_MAP_BYTES, end = base + STAGED_MAP_BYTES;
        if (base < va->scratch_off) base = va->scratch_off; /* page-aligned: arrays start on 1 MiB */
        if (end > va->scratch_off + va->nbytes) end = va->scratch_off + va->nbytes;
        if (end < start + len) end = start + len;
        void *m = mmap(NULL, (size_t)(end - base), PROT_READ, MAP_SHARED, v->scratch_fd, (off_t)base);
        if (m == MAP_FAILED) return ckpt_error_sys("%s: map", v->scratch_path);
        t->map = m;
        t->map_base = base;
        t->map_len = (size_t)(end - base);
    }
    *out = (const uint8_t *)t->map + (start - t->map_base);
    return 0;
}

/* The array holding bytes [off, off+len) of staged file `file`, or NULL (error set). */
static varray *find_varray(varrays *v, size_t file, uint64_t off, uint64_t len)
{
    const vfile *f = NULL;
    for (size_t i = 0; i < v->nfiles && !f; i++)
        if (v->files[i].src_file == file) f = &v->files[i];
    /* the array holding off (by offset, binary search) */
    size_t lo = 0, hi = f ? f->n : 0;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (f->arrays[mid].offset <= off) lo = mid;
        else hi = mid;
    }
    varray *va = f && f->n ? &f->arrays[lo] : NULL;
    if (!va || off < va->offset || off - va->offset > va->nbytes || len > va->nbytes - (off - va->offset)) {
        ckpt_error_set(CKPT_EINVAL, "bytes [%llu, +%llu) of a staged file are not one array's",
                       (unsigned long long)off, (unsigned long long)len);
        return NULL;
    }
    return va;
}

/* READ_BAND: the columns of a band of a one-chunk array, as rows of the
 * last axis (the others flattened), and how many columns a band holds. */
static uint64_t band_cols(const varrays *v, const easydel_array *a, uint64_t *nrows, uint64_t *ncols)
{
    size_t es = ckpt_dtype_size(a->z.dtype);
    *ncols = a->z.ndim ? a->z.shape[a->z.ndim - 1] : 0;
    *nrows = es && *ncols ? a->z.nbytes / es / *ncols : 0;
    return *nrows ? v->band_max / es / *nrows : 0;
}

/* Decodes bytes of the stream into nowhere (a row's columns outside the band). */
static int decode_skip(vthread *t, uint64_t n)
{
    if (!t->win && !(t->win = ckpt_big_alloc(EXEC_BAND_BYTES))) return CKPT_ENOMEM;
    int rc = 0;
    for (uint64_t k; !rc && n; n -= k) {
        k = n < (256u << 10) ? n : (256u << 10); /* stays in the cache */
        rc = zarr_decoder_read(t->d, t->win, (size_t)k);
    }
    return rc;
}

/* exec_vsource.view_rows: runs of a READ_BAND array's rows, from the band
 * holding their columns, decoded anew (the whole array, keeping the band's
 * columns of each row) when the band held does not. */
static int arrays_view_rows(void *ctx, void *ts, size_t file, uint64_t off, uint64_t rows, uint64_t stride,
                            size_t len, const uint8_t **out, uint64_t *out_stride)
{
    varrays *v = ctx;
    vthread *t = ts;
    varray *va = find_varray(v, file, off, len);
    if (!va || va->how != READ_BAND) return 1; /* (view says why) */
    const easydel_array *a = va->a;
    size_t es = ckpt_dtype_size(a->z.dtype);
    uint64_t nrows, ncols, w = band_cols(v, a, &nrows, &ncols), in = off - va->offset, rowb = ncols * es;
    uint64_t r0 = in / rowb, c0 = in % rowb / es, n = len / es;
    if (stride != rowb || in % es || len % es || c0 + n > ncols || r0 + rows > nrows || n > w) return 1;
    if (t->banded != a || c0 < t->band_c0 || c0 + n > t->band_c0 + t->band_w) {
        t->banded = NULL;
        t->streaming = NULL; /* the decoder starts over */
        ckpt_big_free(t->buf, t->cap); /* a worker holds a band or an array decoded whole, never both */
        t->buf = NULL;
        t->cap = 0;
        t->held = NULL;
        /* The columns from c0 on, as many as the budget holds; when another
         * worker holds part of it, at least half the budget's (or the tile's). */
        uint64_t b0 = c0, want = ncols - c0 < w ? ncols - c0 : w, bw;
        uint64_t least = n > w / 2 ? n : w / 2;
        double t0 = exec_tracing() ? exec_trace_now() : 0, cpu0 = exec_tracing() ? exec_trace_cpu() : 0;
        int rc = band_take(v, t, nrows, es, want, least < want ? least : want, &bw);
        double t1 = exec_tracing() ? exec_trace_now() : 0;
        uint64_t idx[CKPT_MAX_RANK] = {0};
        if (!rc) rc = zarr_decoder_start(t->d, &a->z, idx, NULL);
        for (uint64_t r = 0; !rc && r < nrows; r++) {
            rc = decode_skip(t, b0 * es);
            if (!rc) rc = zarr_decoder_read(t->d, t->band + r * bw * es, (size_t)(bw * es));
            if (!rc) rc = decode_skip(t, (ncols - b0 - bw) * es);
        }
        if (!rc) rc = zarr_decoder_end(t->d);
        if (rc) return rc;
        exec_trace("band %s columns [%llu, +%llu) of %llu: waited %.3f s for the budget, decoded from %.3f in %.3f s "
                   "(cpu %.3f)", a->z.label, (unsigned long long)b0, (unsigned long long)bw, (unsigned long long)ncols,
                   t1 - t0, t1, exec_trace_now() - t1, exec_trace_cpu() - cpu0);
        t->banded = a;
        t->band_c0 = b0;
        t->band_w = bw;
    }
    *out = t->band + (r0 * t->band_w + c0 - t->band_c0) * es;
    *out_stride = t->band_w * es;
    return 0;
}

static int arrays_view(void *ctx, void *ts, size_t file, uint64_t off, size_t len, const uint8_t **out)
{
    varrays *v = ctx;
    vthread *t = ts;
    varray *va = find_varray(v, file, off, len);
    if (!va) return CKPT_EINVAL;
    const easydel_array *a = va->a;
    uint64_t in = off - va->offset;
    if (t->band_cap && t->banded != a) band_release(v, t); /* another array: the band is done with */
    /* (a banded array read otherwise than by rows: one chunk, decoded in order) */
    if (va->how == READ_STREAM || va->how == READ_BAND) return stream_bytes(t, a, in, len, NULL, out);
    if (va->how == READ_STAGED) return staged_view(v, t, va, in, len, out);
    if (t->held != a) {
        /* A worker holds an array decoded whole, or a band, or a window and a mapping. */
        t->held = NULL;
        band_release(v, t);
        ckpt_big_free(t->win, EXEC_BAND_BYTES);
        t->win = NULL;
        t->streaming = NULL;
        if (t->map) munmap(t->map, t->map_len);
        t->map = NULL;
        if (a->z.nbytes > t->cap) {
            ckpt_big_free(t->buf, t->cap);
            t->cap = 0;
            if (!(t->buf = ckpt_big_alloc((size_t)a->z.nbytes))) return CKPT_ENOMEM;
            t->cap = (size_t)a->z.nbytes;
        }
        int rc = decode_whole(t->d, a, t->buf);
        if (rc) return rc;
        t->held = a;
    }
    *out = t->buf + in;
    return 0;
}

/* exec_vsource.read: a streamed array's bytes decoded straight into buf
 * (copied in order into the executor's slab: no copy out of a window);
 * any other array's through a view. */
static int arrays_read(void *ctx, void *ts, size_t file, uint64_t off, size_t len, uint8_t *buf)
{
    varrays *v = ctx;
    varray *va = find_varray(v, file, off, len);
    if (!va) return CKPT_EINVAL;
    const uint8_t *p;
    vthread *t = ts;
    if (t->band_cap && t->banded != va->a) band_release(v, t);
    if (va->how == READ_STREAM) return stream_bytes(t, va->a, off - va->offset, len, buf, &p);
    int rc = arrays_view(ctx, ts, file, off, len, &p);
    if (!rc) memcpy(buf, p, len);
    return rc;
}

static void varrays_free(varrays *v)
{
    for (size_t i = 0; i < v->nfiles; i++) free(v->files[i].arrays);
    if (v->scratch_fd >= 0) close(v->scratch_fd);
    free(v->scratch_path);
    pthread_mutex_destroy(&v->mu);
    pthread_mutex_destroy(&v->band_mu);
    pthread_cond_destroy(&v->band_cv);
    memset(v, 0, sizeof *v);
    v->scratch_fd = -1;
}

/* READ_BAND suits a one-chunk array of two or more dimensions whose
 * columns take at most EASYDEL_BAND_PASSES bands. */
static bool banded(const varrays *v, const easydel_array *a)
{
    uint64_t nrows, ncols, w = band_cols(v, a, &nrows, &ncols);
    return one_chunk(&a->z) && a->z.ndim >= 2 && w && (ncols + w - 1) / w <= EASYDEL_BAND_PASSES;
}

static int by_varray_offset(const void *x, const void *y)
{
    const varray *a = x, *b = y;
    return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* Decides how each array of the planned files is read (above) and gives
 * the staged ones their places in staging/.arrays. CKPT_EASYDEL_DECODE_MAX
 * (bytes, at most EASYDEL_DECODE_MAX_BYTES) lowers the size up to which an
 * array is decoded whole: the tests send small arrays down the other paths. */
static int varrays_setup(varrays *v, convert_plan *cp, const easydel_ckpt *c, const st_layout *const *layouts,
                         char *const *paths, size_t nlayouts, const char *staging)
{
    exec_plan *p = &cp->exec;
    uint64_t whole_max = EASYDEL_DECODE_MAX_BYTES;
    const char *e = getenv("CKPT_EASYDEL_DECODE_MAX"), *eb = getenv("CKPT_EASYDEL_BAND_MAX");
    int rc = e && *e ? ckpt_parse_u64_field("CKPT_EASYDEL_DECODE_MAX", e, 0, EASYDEL_DECODE_MAX_BYTES, &whole_max) : 0;
    v->band_max = EASYDEL_BAND_BYTES;
    if (!rc && eb && *eb) rc = ckpt_parse_u64_field("CKPT_EASYDEL_BAND_MAX", eb, 0, EASYDEL_BAND_BYTES, &v->band_max);
    for (size_t k = 0; !rc && k < nlayouts; k++) {
        vfile *f = &v->files[v->nfiles];
        f->src_file = SIZE_MAX;
        for (size_t i = 0; i < p->nsrc_paths; i++)
            if (!strcmp(p->src_paths[i], paths[k])) f->src_file = i;
        if (f->src_file == SIZE_MAX) continue; /* planned nothing from it */
        const st_layout *l = layouts[k];
        if (!(f->arrays = ckpt_calloc(l->ntensors + 1, sizeof *f->arrays))) rc = CKPT_ENOMEM;
        for (size_t i = 0; !rc && i < l->ntensors; i++)
            f->arrays[f->n++] = (varray){.a = &c->arrays[l->tensors[i].user], .offset = l->tensors[i].offset,
                                         .nbytes = l->tensors[i].nbytes, .how = READ_WHOLE};
        if (!rc) qsort(f->arrays, f->n, sizeof *f->arrays, by_varray_offset);
        v->nfiles++;
    }
    /* Large arrays: streamed when every tensor reading them copies them front to back. */
    for (size_t i = 0; !rc && i < cp->set.n; i++) {
        const plan_tensor *t = &cp->set.t[i];
        bool copy = exec_tensor_is_copy(p, t);
        for (size_t j = 0; j < t->nparts; j++) {
            if (t->parts[j].src == PLAN_ZERO) continue;
            const plan_source *s = &p->sources[t->parts[j].src];
            for (size_t fi = 0; fi < v->nfiles; fi++) {
                vfile *f = &v->files[fi];
                if (f->src_file != s->file) continue;
                for (size_t a = 0; a < f->n; a++) {
                    varray *va = &f->arrays[a];
                    if (va->offset != s->offset || va->nbytes <= whole_max) continue;
                    if (va->how == READ_WHOLE && copy && one_chunk(&va->a->z)) va->how = READ_STREAM;
                    else if (!copy || va->how == READ_WHOLE) va->how = banded(v, va->a) ? READ_BAND : READ_STAGED;
                }
            }
        }
    }
    /* The staged ones get their places in one scratch file, filled as they are first read. */
    uint64_t end = 0;
    for (size_t fi = 0; !rc && fi < v->nfiles; fi++)
        for (size_t a = 0; a < v->files[fi].n; a++) {
            varray *va = &v->files[fi].arrays[a];
            if (va->how != READ_STAGED) continue;
            va->scratch_off = end;
            end += (va->nbytes + (1u << 20) - 1) / (1u << 20) * (1u << 20); /* 1 MiB: a multiple of any page */
        }
    if (!rc && end) {
        if (!(v->scratch_path = ckpt_path_join(staging, ".arrays"))) return CKPT_ENOMEM;
        v->scratch_fd = open(v->scratch_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (v->scratch_fd < 0) rc = ckpt_error_sys("%s: create", v->scratch_path);
    }
    return rc;
}

/* The layout of the model/ arrays as staging/model.safetensors under their keys. */
static int model_layout(const easydel_ckpt *c, st_layout *l)
{
    int rc = 0;
    size_t n = 0;
    for (size_t i = 0; !rc && i < c->narrays; i++) {
        const easydel_array *a = &c->arrays[i];
        if (strcmp(a->prefix, "model") && *a->prefix) continue;
        rc = st_layout_add(l, a->key, a->z.dtype, a->z.ndim, a->z.shape, i);
        if (rc) rc = ckpt_error_prefix(rc, "%s: array '%s'", c->dir, a->path);
        n++;
    }
    if (!rc && !n) rc = ckpt_error_set(CKPT_EINVAL, "%s: %s lists no arrays under model/", c->dir, EASYDEL_INDEX_FILE);
    if (!rc) rc = st_layout_set_meta(l, "format", "pt");
    if (!rc) rc = st_layout_finish(l);
    return rc;
}

/* Copies a small array (a scalar) into buf. */
static int to_buf(void *vctx, uint64_t off, const void *buf, size_t len)
{
    uint8_t *dst = vctx;
    if (off > 8 || len > 8 - off) return ckpt_error_set(CKPT_EINVAL, "scalar array bytes out of range");
    memcpy(dst + off, buf, len);
    return 0;
}

static int scalar_value(const easydel_array *a, double *out)
{
    uint8_t b[8] = {0};
    int rc = a->z.ndim == 0 ? zarr_read(&a->z, to_buf, b, NULL) : CKPT_EINVAL;
    if (rc) return rc;
    return ckpt_scalar_value(a->z.dtype, b, out) < 0 ? CKPT_EINVAL : 0;
}

static bool is_model_key(void *c, const char *name) { return easydel_find(c, "model", name) != NULL; }

/* The model parameter a tx/ leaf belongs to (the longest suffix of its key
 * that is a model/ key: "0.mu.model.layers.0.mlp.up_proj.kernel" ->
 * "model.layers.0.mlp.up_proj.kernel") and its slot ("mu"); NULL when none. */
static const easydel_array *tx_param(const easydel_ckpt *c, const char *key, char *slot, size_t slot_len)
{
    size_t at = easydel_param_suffix(key, is_model_key, (void *)c);
    if (at == (size_t)-1 || !easydel_slot_before(key, at, slot, slot_len)) return NULL;
    return easydel_find(c, "model", key + at);
}

/* --state: the tx/ arrays that are per-parameter slots (mu, nu, ...: shaped
 * like a model/ array whose key ends theirs) laid out as
 * staging/optimizer.safetensors (*l) as "<param key>/<slot>", their scalars
 * (count) into optimizer.json, the save's step into metadata.json: staging
 * becomes a ckpt training state in EasyDeL's names, which the inverse
 * conversion carries slots and all. */
static int stage_optimizer(const easydel_ckpt *c, const char *staging, bool quiet, st_layout *lp)
{
    st_layout l = *lp;
    json_t *scalars = json_object(), *slotset = json_object(), *left_out = json_array();
    size_t n = 0;
    int rc = scalars && slotset && left_out ? 0 : CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < c->narrays; i++) {
        const easydel_array *a = &c->arrays[i];
        if (strcmp(a->prefix, "tx")) continue;
        double v;
        if (a->z.ndim == 0 && scalar_value(a, &v) == 0) {
            const char *last = strrchr(a->key, '.');
            json_object_set_new(scalars, last ? last + 1 : a->key, json_real(v));
            continue;
        }
        char slot[256];
        const easydel_array *m = tx_param(c, a->key, slot, sizeof slot);
        bool fits = m && m->z.ndim == a->z.ndim && !memcmp(m->z.shape, a->z.shape, (size_t)a->z.ndim * sizeof *a->z.shape);
        const char *why = m ? "not a slot of its parameter (another shape, or a second one)" : "names no model/ array";
        rc = fits ? easydel_add_slot(&l, m->key, slot, a->z.dtype, a->z.ndim, a->z.shape, i, slotset, &fits) : 0;
        if (rc) break;
        if (fits) n++;
        else rc = easydel_left_out(left_out, c->dir, "tx/ array", a->path, NULL, why, quiet);
    }
    if (!rc && !n) rc = ckpt_error_set(CKPT_EINVAL, "%s: --state: no tx/ array is a slot of a model/ parameter", c->dir);
    if (!rc) rc = st_layout_finish(&l);
    *lp = l; /* laid out, never written: the executor reads the arrays through views */
    int64_t step = c->has_step ? c->step : 0;
    if (!rc) rc = easydel_write_state_files(staging, slotset, scalars, left_out, step);
    if (!rc && !quiet)
        ckpt_info("%s: %zu tx/ arrays became optimizer slots (%zu left out), step %lld", c->dir, n,
                  json_array_size(left_out), (long long)step);
    json_decref(scalars);
    json_decref(slotset);
    json_decref(left_out);
    return rc;
}

/* The files the layouts describe (staging/model.safetensors, ...), never
 * written: a checkpoint of their headers alone, for planning. */
static int virtual_checkpoint(ckpt_checkpoint *ck, const char *staging, const st_layout *const *layouts,
                              char *const *paths, size_t n)
{
    st_file files[2];
    size_t done = 0;
    int rc = 0;
    for (; !rc && done < n; done++) {
        rc = st_parse(&files[done], paths[done], layouts[done]->header, layouts[done]->header_len,
                      layouts[done]->file_size);
        if (rc) break;
    }
    if (rc) {
        for (size_t i = 0; i < done; i++) st_close(&files[i]);
        return rc;
    }
    return ckpt_checkpoint_from_files(ck, staging, files, n);
}

/* The staged folder (or, for an older save, the opened weights c with the
 * staged side files; or, for a TensorStore save ec, the arrays laid out as
 * the files paths[0..n) that are never written) converted with the inverse
 * rules into dst. */
static int inverse_convert(const char *src, const char *staging, ckpt_checkpoint *c, const easydel_ckpt *ec,
                           const st_layout *const *layouts, char *const *paths, size_t n, const char *dst,
                           consolidate_opts *o)
{
    ckpt_checkpoint vc;
    if (ec) {
        int rc = virtual_checkpoint(&vc, staging, layouts, paths, n);
        if (rc) return rc;
        c = &vc;
    }
    json_t *rules = easydel_inverse_rules(), *config = NULL;
    char *rules_path = ckpt_path_join(staging, ".easydel-inverse-rules.json");
    char *rules_text = rules ? cj_render(rules) : NULL;
    int rc = rules_text && rules_path ? ckpt_write_file_scratch(rules_path, rules_text, strlen(rules_text))
                                      : ckpt_error_set(CKPT_ENOMEM, "out of memory");
    free(rules_text);
    convert_opts co = {.rules_file = rules_path, .threads = o->threads, .force = o->force, .quiet = o->quiet,
                       .no_hash = true, .no_layout_file = true, .direct = ec != NULL,
                       .largest_first = ec != NULL};
    convert_plan cp;
    if (!rc && c) {
        char *cfg = ckpt_path_join(staging, "config.json");
        if (!cfg) rc = CKPT_ENOMEM;
        else if (ckpt_exists(cfg)) rc = cj_load_file(&config, cfg, CONVERT_CONFIG_MAX_BYTES);
        free(cfg);
        if (!rc) rc = convert_plan_build_from(&cp, c, staging, config, NULL, NULL, &co); /* owns c, config */
        else ckpt_checkpoint_close(c);
    } else if (!rc) {
        rc = convert_plan_build(&cp, staging, &co);
    } else if (c) {
        ckpt_checkpoint_close(c);
    }
    if (rc) rc = ckpt_error_prefix(rc, "%s: mapping EasyDeL names back to Hugging Face", src);
    varrays va = {.scratch_fd = -1};
    pthread_mutex_init(&va.mu, NULL);
    pthread_mutex_init(&va.band_mu, NULL);
    pthread_cond_init(&va.band_cv, NULL);
    exec_vsource vs = {.ctx = &va, .serves = arrays_serve, .thread_open = arrays_thread_open,
                       .thread_close = arrays_thread_close, .view = arrays_view, .view_rows = arrays_view_rows, .read = arrays_read};
    if (!rc && ec) {
        rc = varrays_setup(&va, &cp, ec, layouts, paths, n, staging);
        cp.exec.vsource = &vs;
        if (rc) convert_plan_free(&cp);
    }
    if (!rc) {
        exec_trace("consolidate: planned");
        rc = convert_write(&cp, dst, &co);
        convert_plan_free(&cp);
    }
    varrays_free(&va);
    free(rules_path);
    json_decref(rules);
    return rc;
}

int easydel_consolidate(const char *src, const char *dst, consolidate_opts *o)
{
    if (!o->force && !ckpt_dir_is_empty_or_missing(dst))
        return ckpt_error_set(CKPT_EEXIST, "%s exists and is not empty (--force replaces it)", dst);
    char *weights = easydel_is_checkpoint(src) ? NULL : easydel_legacy_weights(src);
    bool legacy = weights != NULL;
    easydel_ckpt c;
    ckpt_checkpoint lc;
    int rc = legacy ? ckpt_checkpoint_open(&lc, weights) : easydel_open(&c, src);
    free(weights);
    if (rc) return rc;
    exec_trace("consolidate: %s opened", src);
    char *staging = NULL;
    rc = ckpt_tmpdir_create(dst, &staging);
    if (!rc && legacy && o->state) rc = easydel_legacy_state(src, &lc, staging, o->quiet);
    st_layout model, opt;
    st_layout_init(&model);
    st_layout_init(&opt);
    const st_layout *layouts[2] = {&model, &opt};
    char *paths[2] = {NULL, NULL};
    size_t n = !legacy && o->state ? 2 : 1;
    if (!rc && !legacy) rc = model_layout(&c, &model);
    if (!rc && !legacy && o->state) rc = stage_optimizer(&c, staging, o->quiet, &opt);
    if (!rc && !legacy) {
        paths[0] = ckpt_path_join(staging, "model.safetensors");
        paths[1] = ckpt_path_join(staging, "optimizer.safetensors");
        if (!paths[0] || !paths[1]) rc = CKPT_ENOMEM;
    }
    if (!rc) rc = outdir_copy_model_files(src, staging, true); /* (staging is removed after the run) */
    if (!rc) rc = inverse_convert(src, staging, legacy ? &lc : NULL, legacy ? NULL : &c, layouts, paths, n, dst, o);
    else if (legacy) ckpt_checkpoint_close(&lc);
    st_layout_free(&model);
    st_layout_free(&opt);
    free(paths[0]);
    free(paths[1]);
    if (staging) ckpt_rm_rf(staging);
    free(staging);
    if (!legacy) easydel_close(&c);
    exec_trace("consolidate: done");
    return rc;
}

/* executor.c — streams plan parts into output files; see executor.h for the strategy. */
#include "plan/executor.h"

#include "common/error.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/util.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define EXEC_HAVE_AVX2_PATH 1
#endif

#define EXEC_TILE_MIN_RUN 256 /* elements a transposing tile reads from each source line, at least */
#define EXEC_TRANSPOSE_BLOCK 32 /* elements: a block's source lines stay in L1 */
/* Two-byte elements: a square of this many elements is transposed in 8 x 8
 * tiles into a buffer of its own (32 KiB, contiguous), then copied out row
 * by row: written straight into the slab, the tiles' stores land in as many
 * output rows as the walk is long, rows a power of two apart (or a multiple
 * of one) that share a few cache sets and miss on nearly every store. */
#define EXEC_TRANSPOSE_TILE 128
/* A gather reads through mmap when its span is this many times the bytes it needs. */
#define EXEC_SPARSE_FACTOR 2
#define EXEC_SPARSE_MIN (256u << 10)
/* exec_opts.direct: O_DIRECT writes are whole blocks of this many bytes (a
 * multiple of any device's logical block), runs shorter than EXEC_DIRECT_MIN
 * go through the page cache. */
#define EXEC_DIRECT_ALIGN 4096u
#define EXEC_DIRECT_MIN (256u << 10)
/* A whole-tensor copy from a source file read once goes through O_DIRECT
 * (copy_direct) from this many bytes. */
#define EXEC_DIRECT_READ_MIN (64u << 10)
#define EXEC_DIRECT_READ_PIECE (2u << 20)
/* Source bytes asked of the kernel ahead of the workers (exec_prefetch). */
#define EXEC_PREFETCH_BYTES (64u << 20)
/* At most this many sibling tensors (tensors_siblings: one tensor's tp
 * ranks) run together, each box of their sources read once for all. */
#define EXEC_GROUP_MAX 16

/* ---- CKPT_EXEC_TRACE (executor.h) ---- */

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double trace_t0;
static __thread const char *trace_who = "main";
__attribute__((constructor)) static void trace_init(void) { trace_t0 = clock_s(CLOCK_MONOTONIC); }

double exec_trace_now(void) { return clock_s(CLOCK_MONOTONIC) - trace_t0; }
double exec_trace_cpu(void) { return clock_s(CLOCK_THREAD_CPUTIME_ID); }

bool exec_tracing(void)
{
    static int on = -1; /* (a benign race: every thread computes the same) */
    if (on < 0) {
        const char *e = getenv("CKPT_EXEC_TRACE");
        on = e && *e && strcmp(e, "0") ? 1 : 0;
    }
    return on;
}

void exec_trace(const char *fmt, ...)
{
    if (!exec_tracing()) return;
    char line[512];
    int n = snprintf(line, sizeof line, "ckpt-trace %.3f %s ", exec_trace_now(), trace_who);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line) n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2;
    line[n++] = '\n';
    ssize_t w = write(2, line, (size_t)n); /* one write: lines of threads never mix */
    (void)w;
}

/* A strided walk: element i (multi-index over ext) is at src + sum i[k]*ss[k]
 * (source elements) and dst + sum i[k]*ds[k] (destination elements). */
typedef struct {
    int nd;
    uint64_t ext[PLAN_MAX_DIM];
    uint64_t ss[PLAN_MAX_DIM];
    uint64_t ds[PLAN_MAX_DIM];
    uint64_t src, dst;
} walk;

typedef struct {
    size_t file, slot; /* exec_file index, layout slot */
    size_t order;      /* largest_first: its place before sorting */
} work_item;

/* A slab's whole blocks queued for a writer thread: bytes [off, off+len) of
 * output file f from buf, which lies in slab (returned to the pool after). */
typedef struct {
    uint8_t *slab;
    const uint8_t *buf;
    size_t f, len;
    uint64_t off;
} exec_write;

typedef struct {
    const exec_plan *p;
    const exec_opts *o;
    int *src_fds;
    bool *src_once; /* per source file: no byte of it is read twice (exec_opts.buffered_reads unset) */
    int *out_fds;
    int *dio_fds; /* o->direct: per output file, an O_DIRECT descriptor, or -1 */
    char **out_paths;
    work_item *items;
    size_t nitems, next;
    pthread_mutex_t mu;
    int err;
    char errmsg[2048];
    uint64_t done, total;
    uint64_t tensors_done; /* tensors written, for progress */
    ckpt_progress prog;
    size_t *left; /* per output file: tensors not written yet */
    /* Hashing the outputs while they are written (o->out_sha256): */
    bool **slot_done;     /* per output file and layout slot: its bytes are in place */
    pthread_cond_t moved; /* a slot is done, or an error stops everything */
    /* Writeback started early (!o->no_fsync), per output file, under mu: */
    size_t **wb_order; /* the file's slots in offset order */
    size_t *wb_next;   /* the first of wb_order not known to be in place */
    uint64_t *wb_done; /* bytes [0, wb_done) are in place */
    uint64_t *wb_from; /* writeback was started for bytes [0, wb_from) */
    size_t next_hash_file;
    /* Writers (o->direct): the whole blocks of a slab are written by a writer
     * thread while its worker fills another slab. Under mu: */
    int nwriters, writers_named;
    int writing;                /* CKPT_EXEC_TRACE: writes under way, */
    double writing_since, wrote; /* ... since when, and seconds with any under way */
    pthread_cond_t wmoved; /* a write was queued or finished, or the writers may stop */
    exec_write *queue;     /* ring of qcap (= every slab) */
    size_t qhead, qlen, qcap;
    uint8_t **free_slabs; /* slabs no worker holds and no write uses */
    size_t nfree;
    size_t *pending; /* per output file: writes queued or under way */
    bool wstop;
    size_t *group; /* per item starting a group: the items from it that run together (item_groups) */
    /* Read-ahead of the sources (prefetch_main), under mu: items [0, pf_next)
     * were advised; pf_ahead bytes of them are not taken yet. */
    uint64_t *pf_size; /* per item: the source bytes advised for it (0: nothing) */
    size_t pf_next;
    uint64_t pf_ahead;
    bool pf_stop;
    pthread_cond_t pfmoved; /* an item was taken, or the read-ahead is to stop */
} exec_ctx;

/* The zip CRC-32 of the tensor a worker writes (exec_opts.out_crc32),
 * computed from the bytes as they are written: each written piece's CRC,
 * kept as sorted runs of the file [a, b) merged with crc32_combine as
 * pieces meet (in row order that is one run; a transposing tile's rows
 * meet their neighbours once the tiles of a band are written). The bytes
 * no piece wrote (zero padding left to the file's extension) count as
 * zeros. */
typedef struct {
    uint64_t a, b;
    uLong crc;
} crc_run;

typedef struct {
    crc_run *v;
    size_t n, cap;
    bool on;
    int rc; /* CKPT_ENOMEM */
} crc_acc;

typedef struct {
    exec_ctx *c;
    crc_acc crc;   /* o->out_crc32: the tensor run_items writes */
    void *vts;     /* the worker's state of p->vsource, or NULL */
    uint8_t *slab; /* EXEC_SLAB_BYTES, or the largest output tensor when smaller, and
                      EXEC_DIRECT_ALIGN more (a box is placed where its file offset lies in a block) */
    size_t slab_bytes;
    uint8_t *band; /* EXEC_BAND_BYTES, or the largest source tensor when smaller */
    uint8_t *cmp;  /* as slab, for checks */
    char name[16]; /* CKPT_EXEC_TRACE: the thread's name, and its times */
    double slab_wait, busy, prefetching, wb_time;
} worker;

static void exec_fail(exec_ctx *c, int rc);

/* Drops length-1 axes and merges axes that are contiguous in both source and destination. */
static void walk_collapse(walk *w)
{
    int n = 0;
    for (int k = 0; k < w->nd; k++) {
        if (w->ext[k] == 1) continue;
        if (n > 0 && w->ss[n - 1] == w->ss[k] * w->ext[k] && w->ds[n - 1] == w->ds[k] * w->ext[k]) {
            w->ext[n - 1] *= w->ext[k];
            w->ss[n - 1] = w->ss[k];
            w->ds[n - 1] = w->ds[k];
            continue;
        }
        w->ext[n] = w->ext[k];
        w->ss[n] = w->ss[k];
        w->ds[n] = w->ds[k];
        n++;
    }
    w->nd = n;
}

static void source_strides(const plan_source *s, uint64_t *str)
{
    uint64_t acc = 1;
    for (int a = s->ndim - 1; a >= 0; a--) {
        str[a] = acc;
        acc *= s->shape[a];
    }
}

static void row_major_strides(int ndim, const uint64_t *shape, uint64_t *str)
{
    uint64_t acc = 1;
    for (int k = ndim - 1; k >= 0; k--) {
        str[k] = acc;
        acc *= shape[k];
    }
}

/* The walk of sub-box [blo, blo+bext) of part p, into a destination whose
 * element (tensor index i) is at sum (i[k]-dlo[k])*dstr[k]. */
static void part_walk(walk *w, const plan_part *p, const plan_source *s, int ndim, const uint64_t *blo,
                      const uint64_t *bext, const uint64_t *dlo, const uint64_t *dstr)
{
    uint64_t sstr[PLAN_MAX_DIM];
    source_strides(s, sstr);
    w->nd = ndim;
    w->src = 0;
    w->dst = 0;
    for (int a = 0; a < s->ndim; a++) w->src += p->src_lo[a] * sstr[a];
    for (int k = 0; k < ndim; k++) {
        w->ss[k] = p->axis_map[k] >= 0 ? sstr[p->axis_map[k]] : 0;
        w->ds[k] = dstr[k];
        w->ext[k] = bext[k];
        w->src += (blo[k] - p->lo[k]) * w->ss[k];
        w->dst += (blo[k] - dlo[k]) * w->ds[k];
    }
    walk_collapse(w);
}

static void copy_elems(const uint8_t *src, ckpt_dtype sdt, size_t ses, uint8_t *dst, ckpt_dtype ddt, size_t des,
                       uint64_t n, uint64_t sstride, uint64_t dstride)
{
    if (sstride == 1 && dstride == 1) {
        if (sdt == ddt) memcpy(dst, src, n * ses);
        else ckpt_convert(sdt, src, ddt, dst, n);
        return;
    }
    if (sdt != ddt) {
        for (uint64_t i = 0; i < n; i++) ckpt_convert(sdt, src + i * sstride * ses, ddt, dst + i * dstride * des, 1);
        return;
    }
    switch (ses) {
    case 2:
        for (uint64_t i = 0; i < n; i++) memcpy(dst + i * dstride * 2, src + i * sstride * 2, 2);
        break;
    case 4:
        for (uint64_t i = 0; i < n; i++) memcpy(dst + i * dstride * 4, src + i * sstride * 4, 4);
        break;
    case 8:
        for (uint64_t i = 0; i < n; i++) memcpy(dst + i * dstride * 8, src + i * sstride * 8, 8);
        break;
    default:
        for (uint64_t i = 0; i < n; i++) memcpy(dst + i * dstride * ses, src + i * sstride * ses, ses);
    }
}

#ifdef __SSE2__
/* 8 x 8 two-byte elements: element c of source row r (rows sstr bytes
 * apart) to element r of destination row c (rows dstr bytes apart), in
 * registers: 8 loads and 8 stores of 16 bytes, so a strip of 8 source rows
 * is read front to back however far apart the rows lie (a power-of-two
 * distance puts every row in the same cache set: 32 rows at a time thrash
 * an 8-way L1, 8 do not). */
static inline void transpose8x8_2(const uint8_t *src, size_t sstr, uint8_t *dst, size_t dstr)
{
    __m128i r[8], t[8], u[8];
    for (int i = 0; i < 8; i++) r[i] = _mm_loadu_si128((const __m128i *)(const void *)(src + i * sstr));
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
    }
    /* t[0] = r0r1 pairs of columns 0-3, t[1] columns 4-7; t[2], t[3] rows 2-3; ... */
    for (int h = 0; h < 2; h++)
        for (int q = 0; q < 2; q++) {
            u[4 * h + 2 * q] = _mm_unpacklo_epi32(t[4 * h + q], t[4 * h + 2 + q]);
            u[4 * h + 2 * q + 1] = _mm_unpackhi_epi32(t[4 * h + q], t[4 * h + 2 + q]);
        }
    /* u[0..3]: rows 0-3 of columns (0,1), (2,3), (4,5), (6,7); u[4..7]: rows 4-7 */
    for (int c = 0; c < 4; c++) {
        _mm_storeu_si128((__m128i *)(void *)(dst + (2 * c) * dstr), _mm_unpacklo_epi64(u[c], u[4 + c]));
        _mm_storeu_si128((__m128i *)(void *)(dst + (2 * c + 1) * dstr), _mm_unpackhi_epi64(u[c], u[4 + c]));
    }
}
#endif

#ifdef EXEC_HAVE_AVX2_PATH
/* transpose8x8_2's work on 16 x 16 elements with 256-bit registers, for
 * CPUs with AVX2 (chosen at run time): each 128-bit lane of 8 source rows
 * is transposed as transpose8x8_2 does (the unpacks work lane by lane),
 * then the lanes of rows 0-7 and 8-15 are paired (vperm2i128): half the
 * instructions per element. ni x nj elements (multiples of 16) of source
 * rows sstr bytes apart into rows of the tile tstr bytes apart. */
__attribute__((target("avx2"))) static void transpose_tiles_avx2(const uint8_t *src, size_t sstr, uint8_t *tile,
                                                                 size_t tstr, uint64_t ni, uint64_t nj)
{
    for (uint64_t i = 0; i < ni; i += 16)
        for (uint64_t j = 0; j < nj; j += 16) {
            const uint8_t *s = src + i * sstr + j * 2;
            uint8_t *d = tile + j * tstr + i * 2;
            __m256i r[16], t[16], u[16], x[16];
            for (int k = 0; k < 16; k++) r[k] = _mm256_loadu_si256((const __m256i *)(const void *)(s + k * sstr));
            for (int g = 0; g < 16; g += 8) {
                for (int k = 0; k < 4; k++) {
                    t[g + 2 * k] = _mm256_unpacklo_epi16(r[g + 2 * k], r[g + 2 * k + 1]);
                    t[g + 2 * k + 1] = _mm256_unpackhi_epi16(r[g + 2 * k], r[g + 2 * k + 1]);
                }
                for (int h = 0; h < 2; h++)
                    for (int q = 0; q < 2; q++) {
                        u[g + 4 * h + 2 * q] = _mm256_unpacklo_epi32(t[g + 4 * h + q], t[g + 4 * h + 2 + q]);
                        u[g + 4 * h + 2 * q + 1] = _mm256_unpackhi_epi32(t[g + 4 * h + q], t[g + 4 * h + 2 + q]);
                    }
                for (int c = 0; c < 4; c++) {
                    x[g + 2 * c] = _mm256_unpacklo_epi64(u[g + c], u[g + 4 + c]);
                    x[g + 2 * c + 1] = _mm256_unpackhi_epi64(u[g + c], u[g + 4 + c]);
                }
            }
            /* x[k], lane L: source column 8L + k of rows 0-7; x[8 + k]: of rows 8-15 */
            for (int k = 0; k < 8; k++) {
                _mm256_storeu_si256((__m256i *)(void *)(d + k * tstr), _mm256_permute2x128_si256(x[k], x[8 + k], 0x20));
                _mm256_storeu_si256((__m256i *)(void *)(d + (8 + k) * tstr),
                                    _mm256_permute2x128_si256(x[k], x[8 + k], 0x31));
            }
        }
}

/* CKPT_EXEC_NO_AVX2 (set): the SSE2 tiles anyway, so that tests cover both. */
static bool exec_avx2(void)
{
    static int have = -1; /* (a benign race: every thread computes the same) */
    if (have < 0) have = __builtin_cpu_supports("avx2") ? 1 : 0;
    return have && !getenv("CKPT_EXEC_NO_AVX2");
}
#endif

/* walk_run of a transposing walk: axes `in` (innermost, contiguous in the
 * output) and `tj` (contiguous in the source) in EXEC_TRANSPOSE_BLOCK x
 * EXEC_TRANSPOSE_BLOCK blocks, every other axis as an outer loop. Two-byte
 * elements copied as they are (bf16, f16: most of a model) go through
 * transpose8x8_2 in squares of EXEC_TRANSPOSE_TILE instead. */
static void walk_run_blocked(const walk *w, int in, int tj, const uint8_t *band, uint64_t band_first, ckpt_dtype sdt,
                             size_t ses, uint8_t *dst, ckpt_dtype ddt, size_t des)
{
    const uint64_t B = EXEC_TRANSPOSE_BLOCK;
    uint64_t idx[PLAN_MAX_DIM] = {0};
#ifdef __SSE2__
    const uint64_t T = EXEC_TRANSPOSE_TILE;
    uint8_t tile[EXEC_TRANSPOSE_TILE * EXEC_TRANSPOSE_TILE * 2] __attribute__((aligned(64)));
#endif
    for (;;) {
        uint64_t so = w->src, d = w->dst;
        for (int k = 0; k < in; k++) {
            if (k == tj) continue;
            so += idx[k] * w->ss[k];
            d += idx[k] * w->ds[k];
        }
        bool tiled = false;
#ifdef __SSE2__
        if (sdt == ddt && ses == 2 && w->ds[in] == 1) {
            tiled = true;
            uint64_t i8 = w->ext[in] / 8 * 8, j8 = w->ext[tj] / 8 * 8; /* the part done in 8 x 8 tiles */
            bool avx2 = false; /* asked once a walk: CKPT_EXEC_NO_AVX2 is read from the environment */
#ifdef EXEC_HAVE_AVX2_PATH
            avx2 = exec_avx2();
#endif
            (void)avx2;
            for (uint64_t jb = 0; jb < j8; jb += T)
                for (uint64_t ib = 0; ib < i8; ib += T) {
                    uint64_t nj = j8 - jb < T ? j8 - jb : T, ni = i8 - ib < T ? i8 - ib : T;
                    const uint8_t *src = band + (so + ib * w->ss[in] + jb - band_first) * 2;
                    uint64_t i16 = 0, j16 = 0; /* with AVX2: the part done in 16 x 16 tiles */
#ifdef EXEC_HAVE_AVX2_PATH
                    if (avx2) {
                        i16 = ni / 16 * 16, j16 = nj / 16 * 16;
                        if (i16 && j16) transpose_tiles_avx2(src, w->ss[in] * 2, tile, T * 2, i16, j16);
                    }
#endif
                    /* the rest (all of it without AVX2) in 8 x 8 tiles: an
                     * extent of 24 (a MoE expert's rank slice) is 16 + 8, not
                     * 16 and eight elements at a time */
                    for (uint64_t i = 0; i < ni; i += 8)
                        for (uint64_t j = i < i16 ? j16 : 0; j < nj; j += 8)
                            transpose8x8_2(src + (i * w->ss[in] + j) * 2, w->ss[in] * 2, tile + (j * T + i) * 2, T * 2);
                    for (uint64_t j = 0; j < nj; j++)
                        memcpy(dst + (d + (jb + j) * w->ds[tj] + ib) * 2, tile + j * T * 2, ni * 2);
                }
            /* the edges: columns past j8 for every row, rows past i8 for the first j8 columns */
            for (uint64_t j = j8; j < w->ext[tj]; j++)
                copy_elems(band + (so + j - band_first) * 2, sdt, 2, dst + (d + j * w->ds[tj]) * 2, ddt, 2,
                           w->ext[in], w->ss[in], 1);
            for (uint64_t j = 0; i8 < w->ext[in] && j < j8; j++)
                copy_elems(band + (so + i8 * w->ss[in] + j - band_first) * 2, sdt, 2,
                           dst + (d + j * w->ds[tj] + i8) * 2, ddt, 2, w->ext[in] - i8, w->ss[in], 1);
        }
#endif
        for (uint64_t jb = 0; !tiled && jb < w->ext[tj]; jb += B) {
            uint64_t je = w->ext[tj] - jb < B ? w->ext[tj] : jb + B;
            for (uint64_t ib = 0; ib < w->ext[in]; ib += B) {
                uint64_t n = w->ext[in] - ib < B ? w->ext[in] - ib : B;
                for (uint64_t j = jb; j < je; j++) {
                    uint64_t sj = so + j * w->ss[tj] + ib * w->ss[in], dj = d + j * w->ds[tj] + ib * w->ds[in];
                    copy_elems(band + (sj - band_first) * ses, sdt, ses, dst + dj * des, ddt, des, n, w->ss[in],
                               w->ds[in]);
                }
            }
        }
        int k = in - 1;
        while (k >= 0 && (k == tj || ++idx[k] == w->ext[k])) {
            if (k != tj) idx[k] = 0;
            k--;
        }
        if (k < 0) break;
    }
}

/* Runs a collapsed walk whose source elements are in `band` (band[0] is
 * source element band_first). */
static void walk_run(const walk *w, const uint8_t *band, uint64_t band_first, ckpt_dtype sdt, uint8_t *dst,
                     ckpt_dtype ddt)
{
    size_t ses = ckpt_dtype_size(sdt), des = ckpt_dtype_size(ddt);
    if (w->nd == 0) {
        copy_elems(band + (w->src - band_first) * ses, sdt, ses, dst + w->dst * des, ddt, des, 1, 1, 1);
        return;
    }
    int in = w->nd - 1;
    /* A transpose: the output's innermost axis walks the source with a large
     * stride while another axis walks it contiguously. Element by element in
     * that order, each read is a cache miss; in square blocks of the two axes,
     * each source line fetched serves a whole block. */
    int tj = -1;
    for (int k = 0; w->ss[in] > 1 && k < in; k++)
        if (w->ss[k] == 1 && w->ext[k] > 1) tj = k;
    if (tj >= 0) {
        walk_run_blocked(w, in, tj, band, band_first, sdt, ses, dst, ddt, des);
        return;
    }
    uint64_t idx[PLAN_MAX_DIM] = {0};
    for (;;) {
        uint64_t so = w->src, d = w->dst;
        for (int k = 0; k < in; k++) {
            so += idx[k] * w->ss[k];
            d += idx[k] * w->ds[k];
        }
        copy_elems(band + (so - band_first) * ses, sdt, ses, dst + d * des, ddt, des, w->ext[in], w->ss[in], w->ds[in]);
        int k = in - 1;
        while (k >= 0 && ++idx[k] == w->ext[k]) idx[k--] = 0;
        if (k < 0) break;
    }
}

/* A view of bytes [off, off+len) of a source file p->vsource makes. */
static int vsource_view(worker *wk, const plan_source *s, uint64_t off, size_t len, const uint8_t **out)
{
    const exec_vsource *v = wk->c->p->vsource;
    assert(v && wk->vts && len <= EXEC_BAND_BYTES);
    int rc = v->view(v->ctx, wk->vts, s->file, off, len, out);
    return rc ? ckpt_error_prefix(rc, "tensor '%s'", s->name) : 0;
}

/* walk_gather of a walk over a source p->vsource makes, through its
 * view_rows: the walk's axis of largest stride as the rows, the rest of the
 * walk inside each row. 1: not served so (the caller goes on with views). */
static int gather_rows(worker *wk, const walk *w, const plan_source *s, uint8_t *dst, ckpt_dtype ddt)
{
    const exec_vsource *v = wk->c->p->vsource;
    size_t ses = ckpt_dtype_size(s->dtype);
    int j = 0;
    for (int k = 1; k < w->nd; k++)
        if (w->ss[k] > w->ss[j]) j = k;
    uint64_t rest = 1;
    for (int k = 0; k < w->nd; k++)
        if (k != j) rest += (w->ext[k] - 1) * w->ss[k];
    if (w->nd < 2 || rest > w->ss[j] || w->ext[j] * rest * ses > EXEC_BAND_BYTES) return 1;
    const uint8_t *rows;
    uint64_t stride;
    int rc = v->view_rows(v->ctx, wk->vts, s->file, s->offset + w->src * ses, w->ext[j], w->ss[j] * ses,
                          (size_t)(rest * ses), &rows, &stride);
    if (rc == 1) return 1;
    if (rc) return ckpt_error_prefix(rc, "tensor '%s'", s->name);
    walk r = *w; /* the same walk over the rows where they are */
    r.src = 0;
    r.ss[j] = stride / ses;
    walk_run(&r, rows, 0, s->dtype, dst, ddt);
    return 0;
}

/* Source elements from a walk's first to its last, both counted (no axis empty). */
static uint64_t walk_span(const walk *w)
{
    uint64_t span = 1;
    for (int k = 0; k < w->nd; k++) span += (w->ext[k] - 1) * w->ss[k];
    return span;
}

/* A walk that needs few of the pages its span covers: its span at least
 * EXEC_SPARSE_FACTOR times the elements it needs, and its longest stride two
 * pages or more (rows shorter than that put needed elements on every page);
 * such a part is not read ahead. */
static bool walk_page_sparse(const walk *w, size_t ses)
{
    uint64_t span = walk_span(w), needed = 1, step = 0;
    for (int k = 0; k < w->nd; k++) {
        needed *= w->ext[k];
        if (w->ss[k] > step) step = w->ss[k];
    }
    return span >= EXEC_SPARSE_FACTOR * needed && step * ses >= 2 * EXEC_DIRECT_ALIGN;
}

/* A walk walk_gather reads straight into place: one contiguous run, no cast. */
static bool walk_direct(const walk *w, ckpt_dtype sdt, ckpt_dtype ddt)
{
    return sdt == ddt && (w->nd == 0 || (w->nd == 1 && w->ss[0] == 1 && w->ds[0] == 1));
}

/* Reads the source elements a walk needs (in bands of at most
 * EXEC_BAND_BYTES, splitting the walk when its span is larger) and writes
 * them into dst. fd < 0: a source file p->vsource makes, read through views. */
static int walk_gather(worker *wk, walk w, const plan_source *s, int fd, const char *path, uint8_t *dst,
                       ckpt_dtype ddt)
{
    size_t ses = ckpt_dtype_size(s->dtype);
    uint64_t span = walk_span(&w);
    /* Every byte read lies inside the source tensor (its parts were checked
     * against its shape, plan_part_in_source). */
    assert(ses > 0 && w.src <= s->nbytes / ses && span <= s->nbytes / ses - w.src);
    if (fd >= 0 && walk_direct(&w, s->dtype, ddt)) {
        /* One contiguous run, no cast: read it straight into place, not through the band. */
        int rc = ckpt_pread_full(fd, dst + w.dst * ses, (size_t)(span * ses), s->offset + w.src * ses, path);
        return rc ? ckpt_error_prefix(rc, "tensor '%s'", s->name) : 0;
    }
    if (fd < 0 && wk->c->p->vsource->view_rows) {
        int rc = gather_rows(wk, &w, s, dst, ddt);
        if (rc != 1) return rc;
    }
    if (span * ses > EXEC_BAND_BYTES) {
        /* Split the axis with the largest source stride in two. */
        int j = 0;
        for (int k = 1; k < w.nd; k++)
            if (w.ss[k] > w.ss[j]) j = k;
        if (w.ext[j] > 1) {
            walk a = w, b = w;
            a.ext[j] = w.ext[j] / 2;
            b.ext[j] = w.ext[j] - a.ext[j];
            b.src += a.ext[j] * w.ss[j];
            b.dst += a.ext[j] * w.ds[j];
            int rc = walk_gather(wk, a, s, fd, path, dst, ddt);
            return rc ? rc : walk_gather(wk, b, s, fd, path, dst, ddt);
        }
        /* A single run longer than the band: its axis is contiguous, cut it. */
        uint64_t per = EXEC_BAND_BYTES / ses;
        walk a = w;
        for (uint64_t off = 0; off < w.ext[j]; off += per) {
            a.ext[j] = w.ext[j] - off < per ? w.ext[j] - off : per;
            a.src = w.src + off * w.ss[j];
            a.dst = w.dst + off * w.ds[j];
            int rc = walk_gather(wk, a, s, fd, path, dst, ddt);
            if (rc) return rc;
        }
        return 0;
    }
    if (fd < 0) {
        /* Made on demand: the walk runs over the provider's own bytes. */
        const uint8_t *v;
        int rc = vsource_view(wk, s, s->offset + w.src * ses, (size_t)(span * ses), &v);
        if (!rc) walk_run(&w, v, w.src, s->dtype, dst, ddt);
        return rc;
    }
    uint64_t needed = ses;
    for (int k = 0; k < w.nd; k++) needed *= w.ext[k];
    if (span * ses >= EXEC_SPARSE_FACTOR * needed && span * ses >= EXEC_SPARSE_MIN) {
        /* Sparse (a column slice, a transposed tile): map the span and touch
         * only the pages holding needed elements, instead of reading it all.
         * (Even when every page holds some, as in a slice of short rows:
         * reading the span copies it whole, once per rank that slices it,
         * which measured slower than the faults; a MoE's experts, tp 8.) */
        uint64_t start = s->offset + w.src * ses, page = (uint64_t)sysconf(_SC_PAGESIZE);
        uint64_t base = start / page * page, maplen = start - base + span * ses;
        void *m = mmap(NULL, (size_t)maplen, PROT_READ, MAP_PRIVATE, fd, (off_t)base);
        if (m != MAP_FAILED) {
            walk_run(&w, (const uint8_t *)m + (start - base), w.src, s->dtype, dst, ddt);
            munmap(m, (size_t)maplen);
            return 0;
        }
    }
    int rc = ckpt_pread_full(fd, wk->band, (size_t)(span * ses), s->offset + w.src * ses, path);
    if (rc) return ckpt_error_prefix(rc, "tensor '%s'", s->name);
    walk_run(&w, wk->band, w.src, s->dtype, dst, ddt);
    return 0;
}

static bool part_intersect(const plan_part *p, int ndim, const uint64_t *blo, const uint64_t *bext, uint64_t *lo,
                           uint64_t *ext)
{
    for (int k = 0; k < ndim; k++) {
        uint64_t a = p->lo[k] > blo[k] ? p->lo[k] : blo[k];
        uint64_t pe = p->lo[k] + p->ext[k], be = blo[k] + bext[k];
        uint64_t b = pe < be ? pe : be;
        if (a >= b) return false;
        lo[k] = a;
        ext[k] = b - a;
    }
    return true;
}

/* True when every part is one contiguous run of a same-dtype source. */
bool exec_tensor_is_copy(const exec_plan *p, const plan_tensor *t)
{
    uint64_t ts[PLAN_MAX_DIM], zero[PLAN_MAX_DIM] = {0};
    row_major_strides(t->ndim, t->shape, ts);
    for (size_t i = 0; i < t->nparts; i++) {
        const plan_part *pt = &t->parts[i];
        if (pt->src == PLAN_ZERO) continue;
        const plan_source *s = &p->sources[pt->src];
        if (s->dtype != t->dtype) return false;
        if (ckpt_dtype_size(s->dtype) == 0) continue; /* whole-tensor copies only; checked in run_fast */
        walk w;
        part_walk(&w, pt, s, t->ndim, pt->lo, pt->ext, zero, ts);
        if (!(w.nd == 0 || (w.nd == 1 && w.ss[0] == 1 && w.ds[0] == 1))) return false;
    }
    return true;
}

/* The bytes buf[0..len) written at file offset off, into the worker's CRC. */
static void crc_piece(crc_acc *acc, uint64_t off, const uint8_t *buf, size_t len)
{
    if (!acc->on || !len || acc->rc) return;
    uLong crc = crc32(0L, Z_NULL, 0);
    for (size_t done = 0; done < len;) { /* crc32 takes a uInt length */
        uInt n = len - done > (1u << 30) ? 1u << 30 : (uInt)(len - done);
        crc = crc32(crc, buf + done, n);
        done += n;
    }
    size_t lo = 0, hi = acc->n; /* the first run starting after off */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (acc->v[mid].a <= off) lo = mid + 1;
        else hi = mid;
    }
    crc_run *prev = lo ? &acc->v[lo - 1] : NULL, *next = lo < acc->n ? &acc->v[lo] : NULL;
    assert(!prev || prev->b <= off);
    assert(!next || off + len <= next->a);
    if (prev && prev->b == off) {
        prev->crc = crc32_combine(prev->crc, crc, (z_off_t)len);
        prev->b += len;
        if (next && next->a == prev->b) { /* the gap closed: one run */
            prev->crc = crc32_combine(prev->crc, next->crc, (z_off_t)(next->b - next->a));
            prev->b = next->b;
            memmove(next, next + 1, (acc->n - lo - 1) * sizeof *next);
            acc->n--;
        }
    } else if (next && next->a == off + len) {
        next->crc = crc32_combine(crc, next->crc, (z_off_t)(next->b - next->a));
        next->a = off;
    } else if (ckpt_grow(&acc->v, &acc->cap, acc->n + 1, sizeof *acc->v)) {
        acc->rc = CKPT_ENOMEM;
    } else {
        memmove(&acc->v[lo + 1], &acc->v[lo], (acc->n - lo) * sizeof *acc->v);
        acc->v[lo] = (crc_run){.a = off, .b = off + len, .crc = crc};
        acc->n++;
    }
}

/* The CRC-32 of n zero bytes (doubling: a run of 2^k zeros is two of 2^(k-1)). */
static uLong crc_zeros(uint64_t n)
{
    static const Bytef zero = 0;
    uLong r = crc32(0L, Z_NULL, 0), p = crc32(r, &zero, 1);
    for (uint64_t plen = 1; n; n >>= 1, plen <<= 1) {
        if (n & 1) r = crc32_combine(r, p, (z_off_t)plen);
        if (n > 1) p = crc32_combine(p, p, (z_off_t)plen);
    }
    return r;
}

/* The CRC-32 of file bytes [from, to) as written (holes: zeros); empties acc. */
static uint32_t crc_take(crc_acc *acc, uint64_t from, uint64_t to)
{
    uLong r = crc32(0L, Z_NULL, 0);
    uint64_t at = from;
    for (size_t i = 0; i < acc->n; i++) {
        const crc_run *u = &acc->v[i];
        assert(u->a >= at && u->b <= to);
        if (u->a > at) r = crc32_combine(r, crc_zeros(u->a - at), (z_off_t)(u->a - at));
        r = crc32_combine(r, u->crc, (z_off_t)(u->b - u->a));
        at = u->b;
    }
    if (to > at) r = crc32_combine(r, crc_zeros(to - at), (z_off_t)(to - at));
    acc->n = 0;
    return (uint32_t)r;
}

static void add_progress(exec_ctx *c, uint64_t n)
{
    pthread_mutex_lock(&c->mu);
    c->done += n;
    if (!c->o->quiet) ckpt_progress_update(&c->prog, c->done);
    pthread_mutex_unlock(&c->mu);
}

/* The O_DIRECT part of out_write: bytes [off, off+len), whole blocks, from
 * buf (aligned). 1: the file system refused this write (EINVAL, nothing written). */
static int direct_write(exec_ctx *c, size_t f, const uint8_t *buf, size_t len, uint64_t off)
{
    while (len) {
        ssize_t n = pwrite(c->dio_fds[f], buf, len, (off_t)off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EINVAL) return 1;
        if (n < 0) return ckpt_error_sys("%s: write at offset %llu", c->out_paths[f], (unsigned long long)off);
        if (n == 0 || n % EXEC_DIRECT_ALIGN) /* a short write: the rest (if any) through the page cache */
            return ckpt_pwrite_full(c->out_fds[f], buf + n, len - (size_t)n, off + (uint64_t)n, c->out_paths[f]);
        buf += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return 0;
}

/* Writes buf to output file f at off. With o->direct, when buf lies at the
 * same place in a block as off and the run is long, the whole blocks go
 * through the O_DIRECT descriptor (straight to the device, no page cache
 * filled) and only the partial blocks at its ends through the page cache. */
static bool direct_run(const exec_ctx *c, size_t f, const uint8_t *buf, size_t len, uint64_t off)
{
    const uint64_t A = EXEC_DIRECT_ALIGN;
    return c->dio_fds && c->dio_fds[f] >= 0 && len >= EXEC_DIRECT_MIN && (uintptr_t)buf % A == off % A &&
           (off + len) / A * A > (off + A - 1) / A * A;
}

static int write_now(exec_ctx *c, size_t f, const uint8_t *buf, size_t len, uint64_t off)
{
    const uint64_t A = EXEC_DIRECT_ALIGN;
    uint64_t a = (off + A - 1) / A * A, b = (off + len) / A * A;
    int fd = c->out_fds[f];
    const char *path = c->out_paths[f];
    if (!direct_run(c, f, buf, len, off)) return ckpt_pwrite_full(fd, buf, len, off, path);
    int rc = a > off ? ckpt_pwrite_full(fd, buf, (size_t)(a - off), off, path) : 0;
    if (!rc && (rc = direct_write(c, f, buf + (a - off), (size_t)(b - a), a)) == 1)
        rc = ckpt_pwrite_full(fd, buf + (a - off), (size_t)(b - a), a, path); /* refused: the page cache */
    if (!rc && off + len > b) rc = ckpt_pwrite_full(fd, buf + (b - off), (size_t)(off + len - b), b, path);
    return rc;
}

/* A run of a slab written with O_DIRECT goes to a writer thread: the slab
 * is queued with the write and the worker takes a free one to fill next. */
static void queue_write(worker *wk, size_t f, const uint8_t *buf, size_t len, uint64_t off)
{
    exec_ctx *c = wk->c;
    pthread_mutex_lock(&c->mu);
    assert(c->qlen < c->qcap);
    c->queue[(c->qhead + c->qlen++) % c->qcap] = (exec_write){.slab = wk->slab, .buf = buf, .f = f, .len = len, .off = off};
    c->pending[f]++;
    pthread_cond_broadcast(&c->wmoved);
    if (!c->nfree && exec_tracing()) {
        double t = exec_trace_now();
        while (!c->nfree) pthread_cond_wait(&c->wmoved, &c->mu);
        wk->slab_wait += exec_trace_now() - t;
    }
    while (!c->nfree) pthread_cond_wait(&c->wmoved, &c->mu); /* writers always give slabs back */
    wk->slab = c->free_slabs[--c->nfree];
    pthread_mutex_unlock(&c->mu);
}

/* A writer thread: the queued writes in order, until the workers are done.
 * After an error the writes are dropped, their slabs still given back. */
static void *writer_main(void *arg)
{
    exec_ctx *c = arg;
    char name[16];
    double busy = 0, first = -1, last = 0;
    uint64_t bytes = 0;
    pthread_mutex_lock(&c->mu);
    snprintf(name, sizeof name, "writer%d", c->writers_named++);
    trace_who = name;
    for (;;) {
        while (!c->qlen && !c->wstop) pthread_cond_wait(&c->wmoved, &c->mu);
        if (!c->qlen) break;
        exec_write w = c->queue[c->qhead];
        c->qhead = (c->qhead + 1) % c->qcap;
        c->qlen--;
        bool failed = c->err != 0;
        double t = exec_tracing() ? exec_trace_now() : 0;
        if (exec_tracing() && c->writing++ == 0) c->writing_since = t;
        pthread_mutex_unlock(&c->mu);
        int rc = failed ? 0 : write_now(c, w.f, w.buf, w.len, w.off);
        if (rc) exec_fail(c, rc);
        if (exec_tracing()) {
            last = exec_trace_now();
            busy += last - t;
            bytes += w.len;
            if (first < 0) first = t;
        }
        pthread_mutex_lock(&c->mu);
        if (exec_tracing() && --c->writing == 0) c->wrote += exec_trace_now() - c->writing_since;
        c->free_slabs[c->nfree++] = w.slab;
        c->pending[w.f]--;
        pthread_cond_broadcast(&c->wmoved);
    }
    pthread_mutex_unlock(&c->mu);
    exec_trace("stop busy=%.3f MB=%.0f first=%.3f last=%.3f", busy, (double)bytes / 1e6, first, last);
    return NULL;
}

/* Waits until the writes queued for output file f are done (before its fsync). */
static void wait_writes(exec_ctx *c, size_t f)
{
    if (!c->nwriters) return;
    pthread_mutex_lock(&c->mu);
    while (c->pending[f]) pthread_cond_wait(&c->wmoved, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

/* write_now, or, when buf is a run of the worker's slab for O_DIRECT and
 * writer threads run, queued whole (its partial blocks too: a worker's
 * write through the page cache would wait for the inode lock that a
 * writer's O_DIRECT write holds until the device is done). buf is then
 * no longer the worker's to use. */
static int out_write(worker *wk, size_t f, const uint8_t *buf, size_t len, uint64_t off)
{
    exec_ctx *c = wk->c;
    crc_piece(&wk->crc, off, buf, len);
    if (c->nwriters && direct_run(c, f, buf, len, off) && buf >= wk->slab &&
        buf + len <= wk->slab + wk->slab_bytes + EXEC_DIRECT_ALIGN) {
        queue_write(wk, f, buf, len, off);
        return 0;
    }
    return write_now(c, f, buf, len, off);
}

/* Where a box of n bytes to be written at file offset off goes in the slab:
 * at off's place in a block when the output is written with O_DIRECT. */
static uint8_t *slab_for(worker *wk, size_t f, uint64_t off, uint64_t n)
{
    exec_ctx *c = wk->c;
    bool direct = c->dio_fds && c->dio_fds[f] >= 0 && n >= EXEC_DIRECT_MIN;
    return wk->slab + (direct ? off % EXEC_DIRECT_ALIGN : 0);
}

/* copy_file_range's work for a source file p->vsource makes: views written
 * out (through the slab when the output takes O_DIRECT: a view lies
 * anywhere in memory). */
static int copy_vsource(worker *wk, const plan_source *s, uint64_t src_off, size_t f, uint64_t dst_off, uint64_t len)
{
    exec_ctx *c = wk->c;
    bool direct = c->dio_fds && c->dio_fds[f] >= 0 && len >= EXEC_DIRECT_MIN;
    uint64_t piece = direct ? wk->slab_bytes : EXEC_BAND_BYTES;
    for (uint64_t done = 0; done < len;) {
        size_t n = (size_t)(len - done < piece ? len - done : piece);
        const uint8_t *v;
        const exec_vsource *vs = c->p->vsource;
        int rc;
        if (direct && vs->read) { /* straight into the slab */
            uint8_t *b = slab_for(wk, f, dst_off + done, n);
            if ((rc = vs->read(vs->ctx, wk->vts, s->file, src_off + done, n, b)))
                rc = ckpt_error_prefix(rc, "tensor '%s'", s->name);
            v = b;
        } else if (!(rc = vsource_view(wk, s, src_off + done, n, &v)) && direct) {
            uint8_t *b = slab_for(wk, f, dst_off + done, n);
            memcpy(b, v, n);
            v = b;
        }
        if (!rc) rc = out_write(wk, f, v, n, dst_off + done);
        if (rc) return rc;
        done += n;
    }
    return 0;
}

/* copy_file_range's work when the bytes' CRC is wanted (exec_opts.out_crc32):
 * read into the slab and written from it, so that the CRC is taken on the
 * way instead of by reading the output back. */
static int copy_read(worker *wk, const plan_source *s, uint64_t src_off, size_t f, uint64_t dst_off, uint64_t len)
{
    exec_ctx *c = wk->c;
    for (uint64_t done = 0; done < len;) {
        size_t n = (size_t)(len - done < wk->slab_bytes ? len - done : wk->slab_bytes);
        uint8_t *b = slab_for(wk, f, dst_off + done, n);
        int rc = ckpt_pread_full(c->src_fds[s->file], b, n, src_off + done, c->p->src_paths[s->file]);
        if (!rc) rc = out_write(wk, f, b, n, dst_off + done);
        if (rc) return rc;
        done += n;
    }
    return 0;
}

/* copy_file_range's work for a source file read once (exec_ctx.src_once):
 * read with O_DIRECT into the slab and written from it. Through the page
 * cache the kernel would fill fresh pages with bytes nothing reads again
 * (and, on a VM whose fresh memory is costly to touch, spend several times
 * the copy's own time doing it). */
static int copy_direct(worker *wk, const plan_source *s, uint64_t src_off, size_t f, uint64_t dst_off, uint64_t len)
{
    exec_ctx *c = wk->c;
    const uint64_t A = CKPT_DIRECT_ALIGN;
    const char *path = c->p->src_paths[s->file];
    int fd = c->src_fds[s->file];
    /* The slab holds (slab_bytes / A + 2) * A bytes: a piece, the block before it and the one after. */
    int dfd = wk->slab_bytes >= 2 * A ? ckpt_open_direct(path, fd) : -1;
    if (dfd < 0) return ckpt_copy_range(fd, src_off, c->out_fds[f], dst_off, len, c->out_paths[f]);
    size_t piece = (size_t)(wk->slab_bytes / A * A - A);
    if (piece > EXEC_DIRECT_READ_PIECE) piece = EXEC_DIRECT_READ_PIECE; /* (the slab's first pages only: less RSS) */
    int rc = 0;
    for (uint64_t done = 0; !rc && done < len;) {
        size_t n = (size_t)(len - done < piece ? len - done : piece);
        uint8_t *b = wk->slab + (src_off + done) % A; /* (out_write may hand the slab on: taken anew) */
        rc = ckpt_pread_direct(dfd, fd, b, n, src_off + done, path);
        if (!rc) rc = out_write(wk, f, b, n, dst_off + done);
        done += n;
    }
    close(dfd);
    return rc;
}

static int run_fast(worker *wk, const plan_tensor *t, size_t f, uint64_t t_off)
{
    exec_ctx *c = wk->c;
    int out_fd = c->out_fds[f];
    const char *out_path = c->out_paths[f];
    uint64_t ts[PLAN_MAX_DIM], zero[PLAN_MAX_DIM] = {0};
    row_major_strides(t->ndim, t->shape, ts);
    for (size_t i = 0; i < t->nparts; i++) {
        const plan_part *pt = &t->parts[i];
        if (pt->src == PLAN_ZERO) continue; /* the file was extended with zeros */
        assert(pt->src >= 0 && (size_t)pt->src < c->p->nsources);
        const plan_source *s = &c->p->sources[pt->src];
        assert(plan_part_in_tensor(pt, t->ndim, t->shape) && plan_part_in_source(pt, t->ndim, s));
        size_t es = ckpt_dtype_size(s->dtype);
        uint64_t src_off, dst_off, len;
        if (es == 0) {
            /* Sub-byte dtype: only a whole tensor copied as it is. */
            bool whole = t->nparts == 1 && t->ndim == s->ndim;
            for (int k = 0; whole && k < t->ndim; k++)
                whole = pt->axis_map[k] == k && pt->src_lo[k] == 0 && pt->ext[k] == s->shape[k];
            if (!whole)
                return ckpt_error_set(CKPT_EINVAL, "tensor '%s': sub-byte dtype %s can only be copied whole", t->name,
                                      ckpt_dtype_name(s->dtype));
            src_off = s->offset;
            dst_off = t_off;
            len = s->nbytes;
        } else {
            walk w;
            part_walk(&w, pt, s, t->ndim, pt->lo, pt->ext, zero, ts);
            uint64_t n = w.nd ? w.ext[0] : 1;
            src_off = s->offset + w.src * es;
            dst_off = t_off + w.dst * es;
            len = n * es;
            /* The run lies inside both the source tensor and the output tensor. */
            assert(w.src * es <= s->nbytes && len <= s->nbytes - w.src * es);
            assert(w.dst + n <= plan_tensor_numel(t));
        }
        int rc = c->src_fds[s->file] < 0 ? copy_vsource(wk, s, src_off, f, dst_off, len)
                 : wk->crc.on ? copy_read(wk, s, src_off, f, dst_off, len)
                 : c->src_once && c->src_once[s->file] && len >= EXEC_DIRECT_READ_MIN
                     ? copy_direct(wk, s, src_off, f, dst_off, len)
                     : ckpt_copy_range(c->src_fds[s->file], src_off, out_fd, dst_off, len, out_path);
        if (rc) return ckpt_error_prefix(rc, "tensor '%s' from '%s'", t->name, s->name);
        add_progress(c, len);
    }
    return 0;
}

/* Fills box [blo, blo+bext) of each of the n sibling tensors t[k]
 * (tensors_siblings; n = 1: any tensor), laid out row-major in bufs[k]. A
 * part's source bytes are read once for all of them when the siblings'
 * walks lie within EXEC_BAND_BYTES of it (a column slice per rank: every
 * rank's walk spans the source's rows, read once instead of once per rank). */
static int fill_group(worker *wk, const plan_tensor *const *t, size_t n, const uint64_t *blo, const uint64_t *bext,
                      uint8_t *const *bufs)
{
    exec_ctx *c = wk->c;
    const plan_tensor *t0 = t[0];
    uint64_t bstr[PLAN_MAX_DIM], nel = 1;
    row_major_strides(t0->ndim, bext, bstr);
    for (int k = 0; k < t0->ndim; k++) nel *= bext[k];
    plan_part whole_box = {.src = PLAN_ZERO};
    memcpy(whole_box.lo, blo, (size_t)t0->ndim * sizeof *blo);
    memcpy(whole_box.ext, bext, (size_t)t0->ndim * sizeof *bext);
    assert(plan_part_in_tensor(&whole_box, t0->ndim, t0->shape));
    /* Zeros first, unless one source part covers the whole box (a transposed
     * tile). Siblings have their parts at the same places. */
    bool covered = false;
    for (size_t i = 0; !covered && i < t0->nparts; i++) {
        const plan_part *pt = &t0->parts[i];
        covered = pt->src != PLAN_ZERO;
        for (int k = 0; covered && k < t0->ndim; k++)
            covered = pt->lo[k] <= blo[k] && blo[k] + bext[k] <= pt->lo[k] + pt->ext[k];
    }
    for (size_t j = 0; !covered && j < n; j++) memset(bufs[j], 0, nel * ckpt_dtype_size(t0->dtype));
    for (size_t i = 0; i < t0->nparts; i++) {
        const plan_part *pt = &t0->parts[i];
        uint64_t lo[PLAN_MAX_DIM], ext[PLAN_MAX_DIM];
        if (pt->src == PLAN_ZERO || !part_intersect(pt, t0->ndim, blo, bext, lo, ext)) continue;
        assert(pt->src >= 0 && (size_t)pt->src < c->p->nsources);
        const plan_source *s = &c->p->sources[pt->src];
        size_t ses = ckpt_dtype_size(s->dtype);
        if (ses == 0)
            return ckpt_error_set(CKPT_EINVAL, "tensor '%s': sub-byte dtype %s cannot be sliced or cast", t0->name,
                                  ckpt_dtype_name(s->dtype));
        int fd = c->src_fds[s->file];
        const char *path = c->p->src_paths[s->file];
        walk w[EXEC_GROUP_MAX];
        uint64_t first = UINT64_MAX, end = 0, spans = 0; /* the siblings' walks: source elements [first, end) */
        bool direct = true;
        for (size_t j = 0; j < n; j++) {
            assert(plan_part_in_tensor(&t[j]->parts[i], t0->ndim, t0->shape) &&
                   plan_part_in_source(&t[j]->parts[i], t0->ndim, s));
            part_walk(&w[j], &t[j]->parts[i], s, t0->ndim, lo, ext, blo, bstr);
            if (w[j].src < first) first = w[j].src;
            if (w[j].src + walk_span(&w[j]) > end) end = w[j].src + walk_span(&w[j]);
            spans += walk_span(&w[j]);
            direct &= walk_direct(&w[j], s->dtype, t0->dtype);
        }
        /* Read once when that reads no more than the siblings would one by
         * one (their spans overlap, as column slices do, or lie side by
         * side), not a long union of pieces far apart. */
        if (n > 1 && fd >= 0 && !direct && end - first <= spans && (end - first) * ses <= EXEC_BAND_BYTES) {
            int rc = ckpt_pread_full(fd, wk->band, (size_t)((end - first) * ses), s->offset + first * ses, path);
            if (rc) return ckpt_error_prefix(rc, "tensor '%s'", s->name);
            for (size_t j = 0; j < n; j++) walk_run(&w[j], wk->band, first, s->dtype, bufs[j], t[j]->dtype);
            continue;
        }
        for (size_t j = 0; j < n; j++) {
            int rc = walk_gather(wk, w[j], s, fd, path, bufs[j], t[j]->dtype);
            if (rc) return rc;
        }
    }
    return 0;
}

/* Fills box [blo, blo+bext) of tensor t, laid out row-major in buf. */
static int fill_box(worker *wk, const plan_tensor *t, const uint64_t *blo, const uint64_t *bext, uint8_t *buf)
{
    return fill_group(wk, &t, 1, blo, bext, &buf);
}

/* True when box [blo, blo+bext) of t is one contiguous run of the tensor
 * (every axis after the first partial one whole), starting at element *start. */
static bool box_run(const plan_tensor *t, const uint64_t *blo, const uint64_t *bext, uint64_t *start)
{
    uint64_t ts[PLAN_MAX_DIM];
    row_major_strides(t->ndim, t->shape, ts);
    int first = 0;
    while (first < t->ndim && bext[first] == 1) first++;
    bool contiguous = true;
    for (int k = first + 1; k < t->ndim; k++) contiguous &= bext[k] == t->shape[k];
    *start = 0;
    for (int k = 0; k < t->ndim; k++) *start += blo[k] * ts[k];
    return contiguous || t->ndim == 0;
}

/* Writes box [blo, blo+bext) from buf (row-major) into the tensor at t_off of output file f. */
static int write_box(worker *wk, size_t f, const plan_tensor *t, const uint64_t *blo, const uint64_t *bext,
                     const uint8_t *buf, uint64_t t_off)
{
    exec_ctx *c = wk->c;
    int fd = c->out_fds[f];
    const char *path = c->out_paths[f];
    size_t es = ckpt_dtype_size(t->dtype);
    uint64_t ts[PLAN_MAX_DIM];
    row_major_strides(t->ndim, t->shape, ts);
    for (int k = 0; k < t->ndim; k++) assert(blo[k] <= t->shape[k] && bext[k] <= t->shape[k] - blo[k]);
    uint64_t n = 1, start;
    for (int k = 0; k < t->ndim; k++) n *= bext[k];
    if (box_run(t, blo, bext, &start)) return out_write(wk, f, buf, n * es, t_off + start * es);
    uint64_t row = bext[t->ndim - 1], idx[PLAN_MAX_DIM] = {0};
    for (uint64_t r = 0; r < n / row; r++) {
        uint64_t off = blo[t->ndim - 1] * ts[t->ndim - 1];
        for (int k = 0; k < t->ndim - 1; k++) off += (blo[k] + idx[k]) * ts[k];
        crc_piece(&wk->crc, t_off + off * es, buf + r * row * es, row * es);
        int rc = ckpt_pwrite_full(fd, buf + r * row * es, row * es, t_off + off * es, path);
        if (rc) return rc;
        for (int k = t->ndim - 2; k >= 0 && ++idx[k] == bext[k]; k--) idx[k] = 0;
    }
    return 0;
}

static bool tensor_is_transposed(const exec_plan *p, const plan_tensor *t)
{
    if (t->ndim < 2) return false;
    for (size_t i = 0; i < t->nparts; i++) {
        const plan_part *pt = &t->parts[i];
        if (pt->src == PLAN_ZERO || pt->ext[t->ndim - 1] == 1) continue;
        const plan_source *s = &p->sources[pt->src];
        if (pt->axis_map[t->ndim - 1] != s->ndim - 1) return true;
    }
    return false;
}

/* Iterates the slabs (or tiles) of a tensor: box lo/ext for slab number `i`
 * out of the total; returns false past the end. */
typedef struct {
    int ndim, k0;
    bool tiles;
    uint64_t shape[PLAN_MAX_DIM];
    uint64_t chunk[PLAN_MAX_DIM]; /* box edge along each axis */
    uint64_t idx[PLAN_MAX_DIM];   /* current box lo */
    bool done;
} slab_iter;

static void slab_iter_init(slab_iter *it, const plan_tensor *t, bool tiles, uint64_t slab_bytes)
{
    memset(it, 0, sizeof *it);
    it->ndim = t->ndim;
    memcpy(it->shape, t->shape, sizeof it->shape);
    size_t es = ckpt_dtype_size(t->dtype);
    uint64_t budget = slab_bytes / es;
    for (int k = 0; k < t->ndim; k++) it->chunk[k] = 1;
    if (tiles) {
        /* Rectangles as wide as the budget allows while each source line
         * still gives EXEC_TILE_MIN_RUN elements: whole output rows (one
         * write per tile) when they fit, fewer and longer writes otherwise. */
        uint64_t width = t->shape[t->ndim - 1], cols = budget / EXEC_TILE_MIN_RUN;
        if (cols > width) cols = width;
        if (cols == 0) cols = 1;
        it->chunk[t->ndim - 1] = cols;
        it->chunk[t->ndim - 2] = budget / cols ? budget / cols : 1;
    } else {
        /* The first axis whose inner block fits, chunked; later axes whole. */
        uint64_t inner = 1;
        int k0 = t->ndim;
        for (int k = t->ndim - 1; k >= 0; k--) {
            if (inner * t->shape[k] > budget) break;
            inner *= t->shape[k];
            k0 = k;
        }
        for (int k = k0; k < t->ndim; k++) it->chunk[k] = t->shape[k];
        if (k0 > 0) it->chunk[k0 - 1] = budget / inner ? budget / inner : 1;
    }
    for (int k = 0; k < t->ndim; k++)
        if (t->shape[k] == 0) it->done = true;
}

static bool slab_next(slab_iter *it, uint64_t *lo, uint64_t *ext)
{
    if (it->done) return false;
    for (int k = 0; k < it->ndim; k++) {
        lo[k] = it->idx[k];
        ext[k] = it->shape[k] - it->idx[k] < it->chunk[k] ? it->shape[k] - it->idx[k] : it->chunk[k];
    }
    int k = it->ndim - 1;
    while (k >= 0) {
        it->idx[k] += it->chunk[k];
        if (it->idx[k] < it->shape[k]) break;
        it->idx[k--] = 0;
    }
    if (k < 0) it->done = true;
    return true;
}

/* The tensor of work item it. */
static const plan_tensor *item_tensor(const exec_plan *p, const work_item *it)
{
    const exec_file *f = &p->files[it->file];
    return f->tensors[f->layout.tensors[it->slot].user];
}

/* Siblings: tensors of the same shape and dtype whose parts lie at the same
 * places and come from the same sources, only from other places in them
 * (the ranks of one tensor split for tensor parallelism, or replicated),
 * with nothing to check; neither copied whole (run_fast's). */
static bool tensors_siblings(const exec_plan *p, const plan_tensor *a, const plan_tensor *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim || a->ndim == 0 || a->nparts != b->nparts || a->nchecks ||
        b->nchecks || ckpt_dtype_size(a->dtype) == 0 || memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof *a->shape))
        return false;
    for (size_t i = 0; i < a->nparts; i++) {
        const plan_part *x = &a->parts[i], *y = &b->parts[i];
        if (x->src != y->src || memcmp(x->axis_map, y->axis_map, sizeof x->axis_map) ||
            memcmp(x->lo, y->lo, (size_t)a->ndim * sizeof *x->lo) || memcmp(x->ext, y->ext, (size_t)a->ndim * sizeof *x->ext))
            return false;
    }
    return !exec_tensor_is_copy(p, a) && !exec_tensor_is_copy(p, b);
}

/* The work items that run in groups: per item starting one, how many from
 * it are siblings of it (at most EXEC_GROUP_MAX; 1: it runs alone). Items
 * go round-robin across the output files, so one tensor's ranks lie next to
 * each other. None with O_DIRECT writers (a slab is handed over whole) or
 * CRCs (kept per tensor). */
static size_t *item_groups(const exec_ctx *c)
{
    size_t *g = ckpt_calloc(c->nitems + 1, sizeof *g);
    for (size_t i = 0; g && i < c->nitems;) {
        const plan_tensor *t = item_tensor(c->p, &c->items[i]);
        size_t n = 1;
        while (i + n < c->nitems && n < EXEC_GROUP_MAX && tensors_siblings(c->p, t, item_tensor(c->p, &c->items[i + n])))
            n++;
        g[i] = n;
        i += n;
    }
    return g;
}

/* Builds the n items (one, or siblings: item_groups) box by box: one
 * tensor in the whole slab (a box that is a run of the file at its
 * offset's place in a block, for O_DIRECT), siblings each in its share of
 * it, their sources read once for all (fill_group); then writes the boxes. */
static int run_boxes(worker *wk, const work_item *its, size_t n)
{
    exec_ctx *c = wk->c;
    const plan_tensor *t[EXEC_GROUP_MAX] = {NULL};
    uint8_t *bufs[EXEC_GROUP_MAX];
    uint64_t off[EXEC_GROUP_MAX];
    for (size_t j = 0; j < n; j++) {
        t[j] = item_tensor(c->p, &its[j]);
        off[j] = c->p->files[its[j].file].layout.tensors[its[j].slot].offset;
    }
    size_t es = ckpt_dtype_size(t[0]->dtype), share = n == 1 ? EXEC_SLAB_BYTES : wk->slab_bytes / n / es * es;
    slab_iter it;
    slab_iter_init(&it, t[0], tensor_is_transposed(c->p, t[0]), share);
    uint64_t lo[PLAN_MAX_DIM] = {0}, ext[PLAN_MAX_DIM] = {0};
    while (slab_next(&it, lo, ext)) { /* (a scalar: one box of no axes) */
        uint64_t nel = 1, start;
        for (int k = 0; k < t[0]->ndim; k++) nel *= ext[k];
        assert(nel * es <= share); /* the slab, or each share, holds the box */
        if (n == 1) /* (wk->slab is another after a box went to an O_DIRECT writer) */
            bufs[0] = box_run(t[0], lo, ext, &start) ? slab_for(wk, its[0].file, off[0] + start * es, nel * es) : wk->slab;
        for (size_t j = 0; n > 1 && j < n; j++) bufs[j] = wk->slab + j * share;
        int rc = fill_group(wk, t, n, lo, ext, bufs);
        for (size_t j = 0; !rc && j < n; j++) rc = write_box(wk, its[j].file, t[j], lo, ext, bufs[j], off[j]);
        if (rc) return rc;
        if (c->err) return CKPT_ECANCELLED;
        add_progress(c, n * nel * es);
    }
    return 0;
}

/* A check: the bytes of `dup` must equal those of `primary` (same box size). */
static int run_check(worker *wk, const plan_tensor *t, const struct plan_check *ck)
{
    const exec_plan *p = wk->c->p;
    plan_tensor one = *t; /* a view with a single part, for fill_box */
    size_t es = ckpt_dtype_size(t->dtype);
    uint64_t budget = EXEC_SLAB_BYTES / (es ? es : 1);
    /* Walk the primary's box in chunks of its first axis. */
    const plan_part *a = &ck->primary, *b = &ck->dup;
    uint64_t inner = 1;
    for (int k = 1; k < t->ndim; k++) inner *= a->ext[k];
    uint64_t rows = t->ndim ? a->ext[0] : 1, step = inner ? budget / inner : rows;
    if (step == 0) step = 1;
    for (uint64_t r = 0; r < rows; r += step) {
        uint64_t lo_a[PLAN_MAX_DIM], lo_b[PLAN_MAX_DIM], ext[PLAN_MAX_DIM];
        for (int k = 0; k < t->ndim; k++) {
            lo_a[k] = a->lo[k];
            lo_b[k] = b->lo[k];
            ext[k] = a->ext[k];
        }
        if (t->ndim) {
            lo_a[0] += r;
            lo_b[0] += r;
            ext[0] = rows - r < step ? rows - r : step;
        }
        one.parts = (plan_part *)a;
        one.nparts = 1;
        int rc = fill_box(wk, &one, lo_a, ext, wk->slab);
        one.parts = (plan_part *)b;
        if (!rc) rc = fill_box(wk, &one, lo_b, ext, wk->cmp);
        if (rc) return rc;
        uint64_t n = 1;
        for (int k = 0; k < t->ndim; k++) n *= ext[k];
        if (memcmp(wk->slab, wk->cmp, n * es)) {
            const char *sa = p->sources[a->src].name, *sb = p->sources[b->src].name;
            return ckpt_error_set(CKPT_EINVAL,
                                  "tensor '%s': %s holds different bytes from the copy it replicates "
                                  "('%s' vs '%s')",
                                  t->name, ck->what ? ck->what : "a replica", sb, sa);
        }
    }
    return 0;
}

/* Records the first error (its message too) and wakes everyone waiting. */
static void exec_fail(exec_ctx *c, int rc)
{
    pthread_mutex_lock(&c->mu);
    if (!c->err) {
        c->err = rc;
        snprintf(c->errmsg, sizeof c->errmsg, "%s", ckpt_error_last());
    }
    pthread_cond_broadcast(&c->moved);
    pthread_cond_broadcast(&c->pfmoved); /* the read-ahead stops too */
    pthread_mutex_unlock(&c->mu);
}

/* Runs work items its[0..n): one, or n siblings together (item_groups). */
static int run_items(worker *wk, const work_item *its, size_t n)
{
    exec_ctx *c = wk->c;
    const work_item *it = &its[0];
    const exec_file *f = &c->p->files[it->file];
    const st_out_tensor *ot = &f->layout.tensors[it->slot];
    const plan_tensor *t = f->tensors[ot->user];
    uint64_t tbytes = 0;
    assert(ckpt_dtype_nbytes(t->dtype, t->ndim, t->shape, &tbytes) == 0 && tbytes == ot->nbytes);
    assert(ot->offset >= f->layout.header_len && ot->nbytes <= UINT64_MAX - ot->offset);
    (void)tbytes;
    if (n > 1 && wk->slab_bytes / n < ckpt_dtype_size(t->dtype)) {
        /* A slab too small to share (a plan of tiny tensors): one at a time. */
        for (size_t j = 0; j < n; j++) {
            int rc = run_items(wk, &its[j], 1);
            if (rc) return rc;
        }
        return 0;
    }
    wk->crc.on = c->o->out_crc32 != NULL;
    wk->crc.n = 0;
    assert(n == 1 || (!wk->crc.on && !t->nchecks));
    double t0 = exec_tracing() ? exec_trace_now() : 0, cpu0 = exec_tracing() ? exec_trace_cpu() : 0, w0 = wk->slab_wait;
    int rc = n == 1 && exec_tensor_is_copy(c->p, t) ? run_fast(wk, t, it->file, ot->offset) : run_boxes(wk, its, n);
    if (exec_tracing()) {
        double t1 = exec_trace_now();
        wk->busy += t1 - t0;
        exec_trace("tensor %s bytes=%llu group=%zu start=%.3f wall=%.3f cpu=%.3f slab_wait=%.3f", t->name,
                   (unsigned long long)ot->nbytes, n, t0, t1 - t0, exec_trace_cpu() - cpu0, wk->slab_wait - w0);
    }
    for (size_t i = 0; !rc && i < t->nchecks; i++) rc = run_check(wk, t, &t->checks[i]);
    if (!rc && wk->crc.rc) rc = ckpt_error_set(wk->crc.rc, "out of memory for the CRC of tensor '%s'", t->name);
    if (!rc && wk->crc.on) c->o->out_crc32[it->file][it->slot] = crc_take(&wk->crc, ot->offset, ot->offset + ot->nbytes);
    return rc;
}

static int by_bytes_desc(const void *x, const void *y, void *vp)
{
    const exec_plan *p = vp;
    const work_item *a = x, *b = y;
    uint64_t na = p->files[a->file].layout.tensors[a->slot].nbytes, nb = p->files[b->file].layout.tensors[b->slot].nbytes;
    if (na != nb) return na > nb ? -1 : 1;
    return a->order < b->order ? -1 : a->order > b->order; /* ties: in the order given */
}

/* exec_opts.largest_first: the tensors largest first, ties in the order
 * given. When a tensor costs about its bytes (arrays decoded as they are
 * read), that is longest first: the workers start on the long ones and
 * finish together on small ones, instead of one finishing a large one
 * alone (a list in file order ends on whatever the names sort last). */
static void largest_first(const exec_plan *p, work_item *items, size_t n)
{
    for (size_t i = 0; i < n; i++) items[i].order = i;
    qsort_r(items, n, sizeof *items, by_bytes_desc, (void *)p);
}

/* Under c->mu, once slot(s) of output file f are in place: the range
 * [*lo, returned end) whose writeback is to start now, or an empty one. Only
 * the file's front in offset order that is in place, in whole pages, and at
 * least EXEC_WRITEBACK_BYTES at a time: one call for many small tensors
 * (18,867 experts' calls cost more kernel time than the copies), and no
 * page written back half filled and then again. */
static uint64_t writeback_range(exec_ctx *c, size_t f, uint64_t *lo)
{
    if (!c->wb_order || !c->wb_order[f]) return 0;
    const st_layout *l = &c->p->files[f].layout;
    while (c->wb_next[f] < l->ntensors && c->slot_done[f][c->wb_order[f][c->wb_next[f]]]) {
        const st_out_tensor *ot = &l->tensors[c->wb_order[f][c->wb_next[f]++]];
        if (ot->offset + ot->nbytes > c->wb_done[f]) c->wb_done[f] = ot->offset + ot->nbytes;
    }
    uint64_t hi = c->wb_done[f] & ~(uint64_t)(EXEC_WRITEBACK_ALIGN - 1);
    if (hi < c->wb_from[f] + EXEC_WRITEBACK_BYTES) return 0;
    *lo = c->wb_from[f];
    c->wb_from[f] = hi;
    return hi;
}

/* The bytes of its source file that part p of tensor t reads: [*lo, *hi),
 * its first to its last element. False when there are none to read ahead:
 * a zero part, a source made on demand, or a part that needs few of the
 * pages in that range (a column slice of rows two pages long or more: left
 * to walk_gather's mmap, which touches only the pages it needs). */
static bool part_span(const exec_plan *ep, const plan_tensor *t, const plan_part *p, uint64_t *lo, uint64_t *hi)
{
    if (p->src < 0) return false;
    const plan_source *s = &ep->sources[p->src];
    if (ep->vsource && ep->vsource->serves(ep->vsource->ctx, s->file)) return false;
    uint64_t dstr[PLAN_MAX_DIM];
    row_major_strides(t->ndim, p->ext, dstr);
    walk w;
    part_walk(&w, p, s, t->ndim, p->lo, p->ext, p->lo, dstr);
    size_t ses = ckpt_dtype_size(s->dtype);
    for (int k = 0; k < w.nd; k++)
        if (w.ext[k] == 0) return false;
    if (walk_page_sparse(&w, ses)) return false;
    *lo = s->offset + w.src * ses;
    *hi = *lo + walk_span(&w) * ses;
    return true;
}

uint64_t exec_prefetch_runs(const exec_plan *p, const plan_tensor *t, exec_run_fn fn, void *ctx)
{
    uint64_t total = 0, run_lo = 0, run_hi = 0;
    size_t run_file = SIZE_MAX;
    for (size_t i = 0; i <= t->nparts; i++) {
        uint64_t lo = 0, hi = 0;
        bool more = i < t->nparts && part_span(p, t, &t->parts[i], &lo, &hi);
        if (i < t->nparts && !more) continue;
        size_t file = more ? p->sources[t->parts[i].src].file : SIZE_MAX;
        if (more && file == run_file && lo <= run_hi + EXEC_DIRECT_ALIGN && hi + EXEC_DIRECT_ALIGN >= run_lo) {
            if (lo < run_lo) run_lo = lo;
            if (hi > run_hi) run_hi = hi;
            continue;
        }
        if (run_file != SIZE_MAX) {
            total += run_hi - run_lo;
            if (fn) fn(ctx, run_file, run_lo, run_hi);
        }
        run_file = file, run_lo = lo, run_hi = hi;
    }
    return total;
}

typedef struct {
    size_t file;
    uint64_t lo, hi;
} prefetch_span;

typedef struct {
    const exec_ctx *c;
    bool direct; /* a whole-tensor copy: its runs from files read once go through copy_direct */
    prefetch_span *v;
    size_t n, cap;
} prefetch_walk;

static void prefetch_run(void *ctx, size_t file, uint64_t lo, uint64_t hi)
{
    prefetch_walk *w = ctx;
    if (w->direct && w->c->src_once[file] && hi - lo >= EXEC_DIRECT_READ_MIN) return; /* not through the page cache */
    if (w->n == w->cap && ckpt_grow(&w->v, &w->cap, w->n + 1, sizeof *w->v)) return; /* read less ahead */
    w->v[w->n++] = (prefetch_span){file, lo, hi};
}

static int by_file_offset(const void *x, const void *y)
{
    const prefetch_span *a = x, *b = y;
    if (a->file != b->file) return a->file < b->file ? -1 : 1;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Reads ahead the sources of the n work items from its (advise), or only
 * counts their bytes: their runs sorted and merged where they overlap or
 * nearly touch, so that the ranks of a tensor (a group), each needing a
 * slice of every expert, ask the disk for each expert's rows once, in one
 * request, rather than once per rank in slices of a few KiB. */
static uint64_t prefetch_items(const exec_ctx *c, const work_item *its, size_t n, bool advise)
{
    prefetch_walk w = {.c = c};
    for (size_t j = 0; j < n; j++) {
        const plan_tensor *t = item_tensor(c->p, &its[j]);
        w.direct = c->src_once && !c->o->out_crc32 && exec_tensor_is_copy(c->p, t);
        exec_prefetch_runs(c->p, t, prefetch_run, &w);
    }
    if (w.n > 1) qsort(w.v, w.n, sizeof *w.v, by_file_offset); /* one tensor's runs too: q before k, expert 10 before 2 */
    uint64_t total = 0;
    for (size_t i = 0; i < w.n;) {
        prefetch_span r = w.v[i++];
        while (i < w.n && w.v[i].file == r.file && w.v[i].lo <= r.hi + EXEC_DIRECT_ALIGN) {
            if (w.v[i].hi > r.hi) r.hi = w.v[i].hi;
            i++;
        }
        total += r.hi - r.lo;
        if (advise) (void)posix_fadvise(c->src_fds[r.file], (off_t)r.lo, (off_t)(r.hi - r.lo), POSIX_FADV_WILLNEED);
    }
    free(w.v);
    return total;
}

/* Under c->mu, as a worker takes the n items from idx (a group): their
 * bytes no longer count as read ahead. True when the read-ahead has not
 * reached them (the workers got ahead): the worker advises them itself, and
 * the read-ahead goes on after them. */
static bool prefetch_taken(exec_ctx *c, size_t idx, size_t n)
{
    if (!c->pf_size) return false;
    pthread_cond_broadcast(&c->pfmoved);
    if (idx < c->pf_next) {
        c->pf_ahead -= c->pf_size[idx];
        return false;
    }
    c->pf_next = idx + n;
    c->pf_ahead = 0;
    return c->pf_size[idx] != 0;
}

/* The read-ahead thread: asks the kernel for the source bytes of the items
 * after the ones taken, up to EXEC_PREFETCH_BYTES ahead of the workers, so
 * that the reads are on the way while the workers gather: without it a cold
 * source is read in the small pieces the gathers ask for (an expert's row
 * slices: one disk request each, in turn), at a fraction of the disk's
 * speed. A thread of its own, because posix_fadvise waits while the
 * device's queue is full: a worker advising 64 MiB ahead stops gathering. */
static void *prefetch_main(void *arg)
{
    exec_ctx *c = arg;
    trace_who = "reader";
    double busy = 0;
    pthread_mutex_lock(&c->mu);
    while (!c->pf_stop && !c->err) {
        if (c->pf_next >= c->nitems || c->pf_ahead >= EXEC_PREFETCH_BYTES) {
            pthread_cond_wait(&c->pfmoved, &c->mu);
            continue;
        }
        size_t i = c->pf_next, n = c->group ? c->group[i] : 1;
        c->pf_next += n;
        c->pf_ahead += c->pf_size[i];
        pthread_mutex_unlock(&c->mu);
        double t = exec_tracing() ? exec_trace_now() : 0;
        if (c->pf_size[i]) prefetch_items(c, &c->items[i], n, true);
        if (exec_tracing()) busy += exec_trace_now() - t;
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    exec_trace("stop busy=%.3f", busy);
    return NULL;
}

/* After work item it is written: its file's front written back, or, for
 * the file's last tensor, the file made durable now, while others copy on. */
static int item_done(worker *wk, const work_item *it)
{
    exec_ctx *c = wk->c;
    pthread_mutex_lock(&c->mu);
    bool last = --c->left[it->file] == 0;
    if (!c->o->quiet) ckpt_progress_tensors(&c->prog, ++c->tensors_done, c->nitems);
    if (c->slot_done) {
        c->slot_done[it->file][it->slot] = true;
        if (c->o->out_sha256) pthread_cond_broadcast(&c->moved);
    }
    uint64_t wb_lo = 0, wb_hi = last ? 0 : writeback_range(c, it->file, &wb_lo);
    pthread_mutex_unlock(&c->mu);
    if (last) {
        double t = exec_tracing() ? exec_trace_now() : 0;
        wait_writes(c, it->file);
        exec_trace("file %s: its writes done after %.3f s", c->p->files[it->file].rel, exec_trace_now() - t);
        if (!c->o->no_fsync && fsync(c->out_fds[it->file]) < 0) return ckpt_error_sys("%s: fsync", c->out_paths[it->file]);
        exec_trace("file %s: fsync done", c->p->files[it->file].rel);
        ckpt_fault("exec.file_done");
    } else if (wb_hi > wb_lo) {
        /* Start writing the file's finished front back now (asynchronously),
         * so that its fsync finds little left to do instead of all of it. */
        double s0 = exec_tracing() ? exec_trace_now() : 0;
        sync_file_range(c->out_fds[it->file], (off_t)wb_lo, (off_t)(wb_hi - wb_lo), SYNC_FILE_RANGE_WRITE);
        if (s0 > 0) wk->wb_time += exec_trace_now() - s0;
    }
    return 0;
}

static void *worker_main(void *arg)
{
    worker *wk = arg;
    exec_ctx *c = wk->c;
    const exec_vsource *v = c->p->vsource;
    trace_who = wk->name;
    exec_trace("start");
    if (v && !(wk->vts = v->thread_open(v->ctx))) {
        exec_fail(c, CKPT_ENOMEM);
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&c->mu);
        if (c->err || c->next >= c->nitems) {
            pthread_mutex_unlock(&c->mu);
            break;
        }
        size_t idx = c->next, n = c->group ? c->group[idx] : 1;
        assert(n >= 1 && n <= EXEC_GROUP_MAX && idx + n <= c->nitems);
        bool advise = prefetch_taken(c, idx, n);
        c->next += n;
        work_item its[EXEC_GROUP_MAX];
        memcpy(its, &c->items[idx], n * sizeof *its);
        pthread_mutex_unlock(&c->mu);
        double pf0 = exec_tracing() ? exec_trace_now() : 0;
        if (advise) prefetch_items(c, its, n, true);
        if (exec_tracing()) wk->prefetching += exec_trace_now() - pf0;
        int rc = run_items(wk, its, n);
        for (size_t j = 0; !rc && j < n; j++) rc = item_done(wk, &its[j]);
        if (rc) {
            exec_fail(c, rc);
            break;
        }
    }
    if (v) v->thread_close(v->ctx, wk->vts);
    wk->vts = NULL;
    exec_trace("stop busy=%.3f cpu=%.3f slab_wait=%.3f prefetching=%.3f writeback=%.3f", wk->busy, exec_trace_cpu(),
               wk->slab_wait, wk->prefetching, wk->wb_time);
    return NULL;
}

typedef struct {
    const exec_plan *p;
    char (*out)[65];
    size_t n;   /* the first n source files */
    bool fresh; /* bypass the xattr cache */
    pthread_mutex_t mu;
    size_t next;
    int err;
    char errmsg[1024];
} hash_job;

/* sha256 of a source file, remembered in the xattr user.ckpt.sha256 as
 * "<size> <mtime ns> <hex>": converting the same files again skips hashing
 * them. A file changed since (size or mtime) is hashed anew; filesystems
 * without user xattrs just hash every time. */
static int sha256_cached(const char *path, char hex[65], bool fresh)
{
    if (fresh) return ckpt_sha256_file_hex(path, hex);
    struct stat st;
    if (stat(path, &st) < 0) return ckpt_error_sys("%s: stat", path);
    char key[64], val[160];
    snprintf(key, sizeof key, "%lld %lld", (long long)st.st_size,
             (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec);
    ssize_t n = getxattr(path, "user.ckpt.sha256", val, sizeof val - 1);
    if (n > 0) {
        val[n] = 0;
        size_t kl = strlen(key);
        if (!strncmp(val, key, kl) && val[kl] == ' ' && strlen(val + kl + 1) == 64) {
            memcpy(hex, val + kl + 1, 65);
            return 0;
        }
    }
    int rc = ckpt_sha256_file_hex(path, hex);
    if (!rc) {
        snprintf(val, sizeof val, "%s %s", key, hex);
        setxattr(path, "user.ckpt.sha256", val, strlen(val), 0); /* best effort */
    }
    return rc;
}

/* The hashing threads take source files in turn. */
static void *hash_main(void *arg)
{
    hash_job *h = arg;
    for (;;) {
        pthread_mutex_lock(&h->mu);
        size_t i = h->next++;
        bool stop = h->err || i >= h->n;
        pthread_mutex_unlock(&h->mu);
        if (stop) return NULL;
        int rc = sha256_cached(h->p->src_paths[i], h->out[i], h->fresh);
        if (rc) {
            pthread_mutex_lock(&h->mu);
            if (!h->err) {
                h->err = rc;
                snprintf(h->errmsg, sizeof h->errmsg, "%s", ckpt_error_last());
            }
            pthread_mutex_unlock(&h->mu);
        }
    }
}

/* ---- hashing the outputs as they are written ---- */

static int by_offset(const void *a, const void *b, void *layout)
{
    const st_layout *l = layout;
    uint64_t x = l->tensors[*(const size_t *)a].offset, y = l->tensors[*(const size_t *)b].offset;
    return x < y ? -1 : x > y;
}

size_t *exec_offset_order(const st_layout *l)
{
    size_t *order = ckpt_calloc(l->ntensors + 1, sizeof *order);
    if (!order) return NULL;
    for (size_t i = 0; i < l->ntensors; i++) order[i] = i;
    qsort_r(order, l->ntensors, sizeof *order, by_offset, (void *)l);
    return order;
}

/* Feeds bytes [from, to) of the file at fd to h. */
static int hash_file_range(ckpt_sha256 *h, int fd, uint64_t from, uint64_t to, uint8_t *buf, size_t bufsz,
                           const char *path)
{
    while (from < to) {
        size_t n = to - from < bufsz ? (size_t)(to - from) : bufsz;
        int rc = ckpt_pread_full(fd, buf, n, from, path);
        if (!rc) rc = ckpt_sha256_update(h, buf, n);
        if (rc) return rc;
        from += n;
    }
    return 0;
}

/* One output file hashed front to back, each tensor's bytes read back (from
 * the page cache) as soon as the workers have put them in place. */
static int hash_output(exec_ctx *c, size_t f, uint8_t *buf, size_t bufsz)
{
    const st_layout *l = &c->p->files[f].layout;
    size_t *order = exec_offset_order(l);
    int fd = open(c->out_paths[f], O_RDONLY | O_CLOEXEC);
    int rc = !order ? ckpt_error_set(CKPT_ENOMEM, "out of memory for hashing %s", c->out_paths[f])
             : fd < 0 ? ckpt_error_sys("%s: open", c->out_paths[f])
                      : 0;
    ckpt_sha256 h;
    bool open_hash = !rc && !(rc = ckpt_sha256_init(&h));
    uint64_t pos = 0;
    for (size_t k = 0; !rc && k < l->ntensors; k++) {
        size_t slot = order[k];
        pthread_mutex_lock(&c->mu);
        while (!c->slot_done[f][slot] && !c->err) pthread_cond_wait(&c->moved, &c->mu);
        bool stop = c->err != 0;
        pthread_mutex_unlock(&c->mu);
        if (stop) break;
        uint64_t end = l->tensors[slot].offset + l->tensors[slot].nbytes;
        if (end > pos) rc = hash_file_range(&h, fd, pos, end, buf, bufsz, c->out_paths[f]);
        if (end > pos) pos = end;
    }
    if (!rc && !c->err) rc = hash_file_range(&h, fd, pos, l->file_size, buf, bufsz, c->out_paths[f]);
    if (!rc && !c->err) {
        rc = ckpt_sha256_final_hex(&h, c->o->out_sha256[f]);
        open_hash = false;
    }
    if (open_hash) ckpt_sha256_free(&h);
    if (fd >= 0) close(fd);
    free(order);
    return rc;
}

/* The output hashing threads take files in turn. */
static void *out_hash_main(void *arg)
{
    exec_ctx *c = arg;
    uint64_t biggest = 1;
    for (size_t f = 0; f < c->p->nfiles; f++)
        if (c->p->files[f].layout.file_size > biggest) biggest = c->p->files[f].layout.file_size;
    size_t bufsz = biggest < EXEC_HASH_CHUNK ? (size_t)biggest : EXEC_HASH_CHUNK;
    uint8_t *buf = malloc(bufsz);
    for (;;) {
        pthread_mutex_lock(&c->mu);
        size_t f = c->next_hash_file++;
        bool stop = c->err || f >= c->p->nfiles;
        pthread_mutex_unlock(&c->mu);
        if (stop) break;
        int rc = buf ? hash_output(c, f, buf, bufsz) : ckpt_error_set(CKPT_ENOMEM, "out of memory for hashing");
        if (rc) {
            exec_fail(c, rc);
            break;
        }
    }
    free(buf);
    return NULL;
}

uint64_t exec_plan_bytes(const exec_plan *p)
{
    uint64_t total = 0;
    for (size_t f = 0; f < p->nfiles; f++)
        for (size_t i = 0; i < p->files[f].layout.ntensors; i++) total += p->files[f].layout.tensors[i].nbytes;
    return total;
}

static int open_outputs(exec_ctx *c, const char *out_dir)
{
    const exec_plan *p = c->p;
    for (size_t f = 0; f < p->nfiles; f++) {
        const exec_file *ef = &p->files[f];
        char *path = ckpt_path_join(out_dir, ef->rel);
        if (!path) return CKPT_ENOMEM;
        c->out_paths[f] = path;
        char *slash = strrchr(path, '/');
        if (slash && slash != path) {
            *slash = '\0';
            int rc = ckpt_mkdir_p(path, 0755);
            *slash = '/';
            if (rc) return rc;
        }
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0) return ckpt_error_sys("%s: create", path);
        c->out_fds[f] = fd;
        int rc = ckpt_pwrite_full(fd, ef->layout.header, ef->layout.header_len, 0, path);
        if (!rc && ftruncate(fd, (off_t)ef->layout.file_size) < 0) rc = ckpt_error_sys("%s: extend", path);
        if (rc) return rc;
        /* A file system that takes no O_DIRECT is written through the page cache. */
        if (c->dio_fds) c->dio_fds[f] = open(path, O_WRONLY | O_DIRECT | O_CLOEXEC);
        /* Its blocks allocated up front (best effort): an O_DIRECT write into
         * a hole takes the inode's lock alone (ext4), one into allocated
         * blocks shares it, so the writer threads write side by side. Not
         * on tmpfs, where allocating is filling memory with zeros. */
        struct statfs sfs;
        if (c->dio_fds && c->dio_fds[f] >= 0 && fstatfs(fd, &sfs) == 0 && sfs.f_type != TMPFS_MAGIC)
            (void)fallocate(fd, 0, 0, (off_t)ef->layout.file_size);
    }
    return 0;
}

int exec_check_sources(const exec_plan *p, const int *src_fds)
{
    uint64_t *size = ckpt_calloc(p->nsrc_paths + 1, sizeof *size);
    if (!size) return CKPT_ENOMEM;
    int rc = 0;
    for (size_t i = 0; !rc && i < p->nsrc_paths; i++) {
        struct stat sb;
        if (src_fds[i] < 0 && p->vsource) size[i] = UINT64_MAX; /* made on demand: its maker checks */
        else if (fstat(src_fds[i], &sb) < 0) rc = ckpt_error_sys("%s: stat", p->src_paths[i]);
        else size[i] = (uint64_t)sb.st_size;
    }
    for (size_t i = 0; !rc && i < p->nsources; i++) {
        const plan_source *s = &p->sources[i];
        if (s->file >= p->nsrc_paths)
            rc = ckpt_error_set(CKPT_EINVAL, "tensor '%s': source file %zu of %zu", s->name, s->file, p->nsrc_paths);
        else if (s->offset > size[s->file] || s->nbytes > size[s->file] - s->offset)
            rc = ckpt_error_set(CKPT_ECORRUPT, "%s: %llu bytes, but tensor '%s' needs bytes [%llu, %llu)",
                                p->src_paths[s->file], (unsigned long long)size[s->file], s->name,
                                (unsigned long long)s->offset, (unsigned long long)(s->offset + s->nbytes));
    }
    free(size);
    return rc;
}

/* exec_run holds every source and output file open at once (an xser save is
 * a file per tensor per rank: 2,000+ for an 8B model at tp 8): lift the soft
 * limit on open files towards the hard one when the plan needs more. Best
 * effort: an open that still fails names its file. */
void exec_raise_open_files(size_t need)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY || need + 256 <= rl.rlim_cur) return;
    rlim_t want = (rlim_t)need + 256;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || want < rl.rlim_max ? want : rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
}

/* Per source file: true when no source in it is read by two parts (of the
 * same tensor or two) or by a check: its bytes are read once. */
static bool *source_files_read_once(const exec_plan *p)
{
    uint32_t *refs = ckpt_calloc(p->nsources + 1, sizeof *refs);
    bool *once = ckpt_calloc(p->nsrc_paths + 1, sizeof *once);
    if (!refs || !once) {
        free(refs);
        free(once);
        return NULL;
    }
    for (size_t f = 0; f < p->nfiles; f++)
        for (size_t i = 0; i < p->files[f].ntensors; i++) {
            const plan_tensor *t = p->files[f].tensors[i];
            for (size_t k = 0; k < t->nparts; k++)
                if (t->parts[k].src >= 0 && refs[t->parts[k].src] < 2) refs[t->parts[k].src]++;
            for (size_t k = 0; k < t->nchecks; k++)
                for (int d = 0; d < 2; d++) {
                    int32_t src = d ? t->checks[k].dup.src : t->checks[k].primary.src;
                    if (src >= 0 && refs[src] < 2) refs[src]++;
                }
        }
    for (size_t i = 0; i < p->nsrc_paths; i++) once[i] = true;
    for (size_t i = 0; i < p->nsources; i++)
        if (refs[i] > 1) once[p->sources[i].file] = false;
    free(refs);
    return once;
}

int exec_run(const exec_plan *p, const char *out_dir, const exec_opts *o)
{
    exec_raise_open_files(p->nsrc_paths + p->nfiles);
    exec_ctx c;
    memset(&c, 0, sizeof c);
    c.p = p;
    c.o = o;
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.moved, NULL);
    pthread_cond_init(&c.wmoved, NULL);
    pthread_cond_init(&c.pfmoved, NULL);
    int threads = o->threads > 0 ? o->threads : 2;
    if (threads > EXEC_MAX_THREADS) threads = EXEC_MAX_THREADS;
    c.src_fds = ckpt_calloc(p->nsrc_paths + 1, sizeof *c.src_fds);
    c.out_fds = ckpt_calloc(p->nfiles + 1, sizeof *c.out_fds);
    c.out_paths = ckpt_calloc(p->nfiles + 1, sizeof *c.out_paths);
    if (o->direct && !o->out_sha256) c.dio_fds = ckpt_calloc(p->nfiles + 1, sizeof *c.dio_fds);
    size_t nitems = 0;
    for (size_t f = 0; f < p->nfiles; f++) nitems += p->files[f].layout.ntensors;
    c.items = ckpt_calloc(nitems + 1, sizeof *c.items);
    worker *wks = ckpt_calloc((size_t)threads, sizeof *wks);
    int rc = c.src_fds && c.out_fds && c.out_paths && c.items && wks ? 0 : CKPT_ENOMEM;
    for (size_t i = 0; c.src_fds && i < p->nsrc_paths; i++) c.src_fds[i] = -1;
    for (size_t f = 0; c.out_fds && f < p->nfiles; f++) c.out_fds[f] = -1;
    for (size_t f = 0; c.dio_fds && f < p->nfiles; f++) c.dio_fds[f] = -1;
    if (!rc && p->vsource && o->hash_sources)
        rc = ckpt_error_set(CKPT_EINVAL, "sources made on demand are not hashed");
    for (size_t i = 0; !rc && i < p->nsrc_paths; i++) {
        if (p->vsource && p->vsource->serves(p->vsource->ctx, i)) continue; /* fd -1: read through views */
        c.src_fds[i] = open(p->src_paths[i], O_RDONLY | O_CLOEXEC);
        if (c.src_fds[i] < 0) rc = ckpt_error_sys("%s: open", p->src_paths[i]);
    }
    if (!rc) rc = exec_check_sources(p, c.src_fds);
    if (!rc) rc = open_outputs(&c, out_dir);
    /* Round-robin across files, so the threads mostly write different files. */
    c.left = ckpt_calloc(p->nfiles + 1, sizeof *c.left);
    if (!c.left && !rc) rc = CKPT_ENOMEM;
    size_t most = 0;
    for (size_t f = 0; !rc && f < p->nfiles; f++) {
        c.left[f] = p->files[f].layout.ntensors;
        if (c.left[f] > most) most = c.left[f];
    }
    for (size_t i = 0; !rc && i < most; i++)
        for (size_t f = 0; f < p->nfiles; f++)
            if (i < p->files[f].layout.ntensors) c.items[c.nitems++] = (work_item){f, i, 0};
    if (!rc && o->largest_first) largest_first(p, c.items, c.nitems);
    for (size_t f = 0; !rc && !o->no_fsync && f < p->nfiles; f++)
        if (c.left[f] == 0 && fsync(c.out_fds[f]) < 0) rc = ckpt_error_sys("%s: fsync", c.out_paths[f]);
    if (!rc && (o->out_sha256 || !o->no_fsync)) {
        c.slot_done = ckpt_calloc(p->nfiles + 1, sizeof *c.slot_done);
        for (size_t f = 0; c.slot_done && f < p->nfiles; f++)
            if (!(c.slot_done[f] = ckpt_calloc(p->files[f].layout.ntensors + 1, sizeof **c.slot_done))) break;
        for (size_t f = 0; f < p->nfiles; f++)
            if (!c.slot_done || !c.slot_done[f]) rc = CKPT_ENOMEM;
    }
    if (!rc && !o->no_fsync) {
        c.wb_order = ckpt_calloc(p->nfiles + 1, sizeof *c.wb_order);
        c.wb_next = ckpt_calloc(p->nfiles + 1, sizeof *c.wb_next);
        c.wb_done = ckpt_calloc(p->nfiles + 1, sizeof *c.wb_done);
        c.wb_from = ckpt_calloc(p->nfiles + 1, sizeof *c.wb_from);
        if (!c.wb_order || !c.wb_next || !c.wb_done || !c.wb_from) rc = CKPT_ENOMEM;
        for (size_t f = 0; !rc && f < p->nfiles; f++)
            if (p->files[f].layout.ntensors > 1 && !(c.wb_order[f] = exec_offset_order(&p->files[f].layout))) rc = CKPT_ENOMEM;
    }
    if (!rc && !o->buffered_reads && !(c.src_once = source_files_read_once(p))) rc = CKPT_ENOMEM;
    /* Files the hashing threads read go through the page cache, where the workers find them. */
    for (size_t i = 0; !rc && c.src_once && o->hash_sources && i < p->nsrc_paths && (!o->hash_count || i < o->hash_count); i++)
        c.src_once[i] = false;
    if (!rc && !c.dio_fds && !o->out_crc32 && !(c.group = item_groups(&c))) rc = CKPT_ENOMEM;
    if (!rc && !o->no_prefetch) {
        c.pf_size = ckpt_calloc(c.nitems + 1, sizeof *c.pf_size);
        for (size_t i = 0; c.pf_size && i < c.nitems; i += c.group ? c.group[i] : 1)
            c.pf_size[i] = prefetch_items(&c, &c.items[i], c.group ? c.group[i] : 1, false);
    }
    c.total = exec_plan_bytes(p);
    exec_trace("exec: %zu tensors, %.0f MB, %d threads", c.nitems, (double)c.total / 1e6, threads);
    if (!o->quiet) ckpt_progress_start(&c.prog, o->label ? o->label : "writing", c.total);
    if (!o->quiet) ckpt_progress_tensors(&c.prog, 0, c.nitems);

    size_t nhash = o->hash_count && o->hash_count < p->nsrc_paths ? o->hash_count : p->nsrc_paths;
    hash_job hj = {.p = p, .out = o->source_sha256, .n = nhash, .fresh = o->hash_fresh};
    pthread_mutex_init(&hj.mu, NULL);
    pthread_t hash_threads[EXEC_HASH_THREADS];
    int hashing = 0;
    for (int i = 0; !rc && o->hash_sources && o->source_sha256 && i < EXEC_HASH_THREADS && (size_t)i < nhash; i++) {
        if (pthread_create(&hash_threads[i], NULL, hash_main, &hj) == 0) hashing++;
        else if (!hashing) rc = ckpt_error_set(CKPT_EIO, "cannot start a hashing thread");
    }
    pthread_t *tids = ckpt_calloc((size_t)threads, sizeof *tids);
    int started = 0;
    if (!tids && !rc) rc = CKPT_ENOMEM;
    /* A box never holds more than its tensor, and a band never more than its
     * source tensor (walk_gather's assert): small plans get small buffers,
     * which saves the page faults of touching (and, under AddressSanitizer,
     * poisoning) tens of MiB for a few KiB of tensors. */
    uint64_t out_max = 1, src_max = 1;
    for (size_t f = 0; f < p->nfiles; f++)
        for (size_t i = 0; i < p->files[f].layout.ntensors; i++)
            if (p->files[f].layout.tensors[i].nbytes > out_max) out_max = p->files[f].layout.tensors[i].nbytes;
    for (size_t i = 0; i < p->nsources; i++)
        if (p->sources[i].nbytes > src_max) src_max = p->sources[i].nbytes;
    size_t slab_bytes = out_max < EXEC_SLAB_BYTES ? (size_t)out_max : EXEC_SLAB_BYTES;
    size_t band_bytes = src_max < EXEC_BAND_BYTES ? (size_t)src_max : EXEC_BAND_BYTES;
    /* With O_DIRECT output, writer threads write each worker's last slab
     * while it fills the next: a slab for each worker and one per writer
     * more, the ones not held by a worker in the pool (c.free_slabs). */
    int writers = c.dio_fds && !rc ? EXEC_WRITERS : 0;
    size_t nslabs = (size_t)threads + (size_t)writers;
    uint8_t **slabs = ckpt_calloc(nslabs, sizeof *slabs);
    size_t slab_alloc = (slab_bytes / EXEC_DIRECT_ALIGN + 2) * EXEC_DIRECT_ALIGN; /* (huge pages: filled whole) */
    if (!slabs && !rc) rc = CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < nslabs; i++)
        if (!(slabs[i] = ckpt_big_alloc(slab_alloc))) rc = ckpt_error_set(CKPT_ENOMEM, "out of memory for I/O buffers");
    if (!rc && writers) {
        c.qcap = nslabs; /* every slab queued: each worker's and the pool's */
        c.queue = ckpt_calloc(c.qcap, sizeof *c.queue);
        c.free_slabs = ckpt_calloc(c.qcap, sizeof *c.free_slabs);
        c.pending = ckpt_calloc(p->nfiles + 1, sizeof *c.pending);
        if (!c.queue || !c.free_slabs || !c.pending) rc = CKPT_ENOMEM;
        for (size_t i = threads; !rc && i < nslabs; i++) c.free_slabs[c.nfree++] = slabs[i];
    }
    pthread_t writer_tids[EXEC_WRITERS];
    for (int i = 0; !rc && i < writers; i++) {
        if (pthread_create(&writer_tids[i], NULL, writer_main, &c)) break; /* fewer: slower, not wrong */
        c.nwriters++;
    }
    pthread_t pf_tid;
    bool pf_started = !rc && c.pf_size && pthread_create(&pf_tid, NULL, prefetch_main, &c) == 0; /* else: none */
    for (int i = 0; !rc && i < threads; i++) {
        wks[i].c = &c;
        snprintf(wks[i].name, sizeof wks[i].name, "worker%d", i);
        wks[i].slab = slabs[i];
        wks[i].slab_bytes = slab_bytes;
        wks[i].band = ckpt_big_alloc(band_bytes);
        wks[i].cmp = malloc(slab_bytes);
        if (!wks[i].band || !wks[i].cmp) {
            rc = ckpt_error_set(CKPT_ENOMEM, "out of memory for I/O buffers");
            break;
        }
        if (pthread_create(&tids[i], NULL, worker_main, &wks[i])) {
            rc = ckpt_error_set(CKPT_EIO, "cannot start a worker thread");
            break;
        }
        started++;
    }
    pthread_t out_hash_threads[EXEC_HASH_THREADS];
    int out_hashing = 0;
    for (int i = 0; !rc && o->out_sha256 && i < EXEC_HASH_THREADS && (size_t)i < p->nfiles; i++)
        if (pthread_create(&out_hash_threads[i], NULL, out_hash_main, &c) == 0) out_hashing++;
    if (!rc && o->out_sha256 && p->nfiles && !out_hashing) exec_fail(&c, ckpt_error_set(CKPT_EIO, "cannot start a hashing thread"));
    if (rc && started) exec_fail(&c, rc); /* a worker failed to start: stop the others */
    for (int i = 0; i < started; i++) pthread_join(tids[i], NULL);
    exec_trace("exec: workers done");
    pthread_mutex_lock(&c.mu);
    c.pf_stop = true;
    pthread_cond_broadcast(&c.pfmoved);
    pthread_mutex_unlock(&c.mu);
    if (pf_started) pthread_join(pf_tid, NULL);
    pthread_mutex_lock(&c.mu);
    c.wstop = true; /* the writers finish what is queued, then stop */
    pthread_cond_broadcast(&c.wmoved);
    pthread_mutex_unlock(&c.mu);
    for (int i = 0; i < c.nwriters; i++) pthread_join(writer_tids[i], NULL);
    exec_trace("exec: writers done; some write under way %.3f s of the run", c.wrote);
    for (int i = 0; i < out_hashing; i++) pthread_join(out_hash_threads[i], NULL);
    for (int i = 0; i < hashing; i++) pthread_join(hash_threads[i], NULL);
    pthread_mutex_destroy(&hj.mu);
    if (!rc && c.err) rc = ckpt_error_set(c.err, "%s", c.errmsg);
    if (!rc && hj.err) rc = ckpt_error_set(hj.err, "%s", hj.errmsg);
    if (!rc && !o->quiet) ckpt_progress_finish(&c.prog);
    for (size_t f = 0; c.out_fds && f < p->nfiles; f++)
        if (c.out_fds[f] >= 0 && close(c.out_fds[f]) < 0 && !rc) rc = ckpt_error_sys("%s: close", c.out_paths[f]);
    for (size_t f = 0; c.dio_fds && f < p->nfiles; f++)
        if (c.dio_fds[f] >= 0) close(c.dio_fds[f]);
    free(c.dio_fds);
    for (size_t i = 0; c.src_fds && i < p->nsrc_paths; i++)
        if (c.src_fds[i] >= 0) close(c.src_fds[i]);
    for (size_t f = 0; c.out_paths && f < p->nfiles; f++) free(c.out_paths[f]);
    for (size_t i = 0; slabs && i < nslabs; i++) ckpt_big_free(slabs[i], slab_alloc);
    free(slabs);
    free(c.queue);
    free(c.free_slabs);
    free(c.pending);
    for (int i = 0; wks && i < threads; i++) {
        ckpt_big_free(wks[i].band, band_bytes);
        free(wks[i].cmp);
        free(wks[i].crc.v);
    }
    free(tids);
    free(wks);
    free(c.items);
    free(c.pf_size);
    free(c.group);
    free(c.src_once);
    free(c.left);
    free(c.src_fds);
    free(c.out_fds);
    free(c.out_paths);
    for (size_t f = 0; c.slot_done && f < p->nfiles; f++) free(c.slot_done[f]);
    free(c.slot_done);
    for (size_t f = 0; c.wb_order && f < p->nfiles; f++) free(c.wb_order[f]);
    free(c.wb_order);
    free(c.wb_next);
    free(c.wb_done);
    free(c.wb_from);
    pthread_cond_destroy(&c.moved);
    pthread_cond_destroy(&c.wmoved);
    pthread_cond_destroy(&c.pfmoved);
    pthread_mutex_destroy(&c.mu);
    return rc;
}

void exec_plan_free(exec_plan *p)
{
    for (size_t i = 0; i < p->nsrc_paths; i++) free(p->src_paths[i]);
    free(p->src_paths);
    for (size_t i = 0; i < p->nsources; i++) free(p->sources[i].name);
    free(p->sources);
    for (size_t f = 0; f < p->nfiles; f++) {
        free(p->files[f].rel);
        st_layout_free(&p->files[f].layout);
        free(p->files[f].tensors);
    }
    free(p->files);
    memset(p, 0, sizeof *p);
}

int exec_tensor_read(const exec_plan *p, const int *src_fds, const plan_tensor *t, uint64_t off, void *buf,
                     size_t len, uint8_t *slab, uint8_t *band, exec_slab_cache *cache)
{
    size_t es = ckpt_dtype_size(t->dtype);
    uint64_t nbytes;
    int rc = ckpt_dtype_nbytes(t->dtype, t->ndim, t->shape, &nbytes);
    if (rc) return rc;
    void *vts = cache ? cache->vts : NULL;
    if (p->vsource && !vts)
        return ckpt_error_set(CKPT_EINVAL, "tensor '%s': sources made on demand are read with a reader's state", t->name);
    if (off > nbytes || len > nbytes - off)
        return ckpt_error_set(CKPT_EINVAL, "tensor '%s': read past its end", t->name);
    if (len == 0) return 0;
    /* A tensor that is one whole same-dtype source reads straight from it. */
    if (t->nparts == 1 && t->parts[0].src != PLAN_ZERO) {
        const plan_part *pt = &t->parts[0];
        const plan_source *s = &p->sources[pt->src];
        bool whole = s->dtype == t->dtype && s->ndim == t->ndim && s->nbytes == nbytes;
        for (int k = 0; whole && k < t->ndim; k++) whole = pt->axis_map[k] == k && pt->src_lo[k] == 0;
        if (whole && src_fds[s->file] >= 0)
            return ckpt_pread_full(src_fds[s->file], buf, len, s->offset + off, p->src_paths[s->file]);
        for (uint64_t done = 0; whole && done < len;) { /* made on demand: views of at most a band */
            size_t n = len - done < EXEC_BAND_BYTES ? (size_t)(len - done) : EXEC_BAND_BYTES;
            const uint8_t *v;
            rc = p->vsource->view(p->vsource->ctx, vts, s->file, s->offset + off + done, n, &v);
            if (rc) return ckpt_error_prefix(rc, "tensor '%s'", s->name);
            memcpy((uint8_t *)buf + done, v, n);
            done += n;
        }
        if (whole) return 0;
    }
    if (es == 0) return ckpt_error_set(CKPT_EINVAL, "tensor '%s': sub-byte dtype assembled from pieces", t->name);
    exec_ctx c;
    memset(&c, 0, sizeof c);
    c.p = p;
    c.src_fds = (int *)src_fds;
    worker wk = {.c = &c, .slab = slab, .band = band, .vts = vts};
    slab_iter it;
    slab_iter_init(&it, t, false, EXEC_READ_SLAB_BYTES); /* flat slabs: each is one contiguous byte range */
    uint64_t lo[PLAN_MAX_DIM] = {0}, ext[PLAN_MAX_DIM] = {0}, ts[PLAN_MAX_DIM];
    row_major_strides(t->ndim, t->shape, ts);
    uint64_t want_end = off + len;
    if (t->ndim == 0) {
        if (cache) cache->t = NULL;
        rc = fill_box(&wk, t, lo, ext, slab);
        if (!rc) memcpy(buf, slab + off, len);
        return rc;
    }
    while (slab_next(&it, lo, ext)) {
        uint64_t start = 0, n = 1;
        for (int k = 0; k < t->ndim; k++) {
            start += lo[k] * ts[k];
            n *= ext[k];
        }
        assert(n * es <= EXEC_READ_SLAB_BYTES && start + n <= nbytes / es);
        uint64_t a = start * es, b = (start + n) * es;
        if (b <= off) continue;
        if (a >= want_end) break;
        if (!cache || cache->t != t || cache->a != a || cache->b != b) {
            if (cache) cache->t = NULL;
            if ((rc = fill_box(&wk, t, lo, ext, slab))) return rc;
            if (cache) cache->t = t, cache->a = a, cache->b = b; /* vts stays */
        }
        uint64_t from = off > a ? off : a, to = want_end < b ? want_end : b;
        memcpy((uint8_t *)buf + (from - off), slab + (from - a), (size_t)(to - from));
    }
    return 0;
}

/*
 * test_transforms.c — the transform engine on tiny checkpoints, against
 * docs/transforms.md: rules (transform/rules.c, rule_gqa.c), presets, the
 * planner and executor (convert.c, executor.c), ckpt-layout.json
 * (layout_meta.c) and consolidation (consolidate.c).
 *
 * Every source tensor is written with the real safetensors writer and holds
 * values that say where they come from: element (row, col) of the tensor
 * with tag `id` is id*1e6 + row*1000 + col, where col is the index on the
 * last axis and row the flat index over the others (exact in F32 for ids up
 * to 15, and in I32). A converted tensor is read back and each block of it
 * is checked to hold exactly the source rows or columns docs/transforms.md
 * names, or zero bytes for padding, so a permuted head or a misplaced pad shows up
 * with its position.
 *
 * Covered: the GQA examples of docs/transforms.md §4 on every rank, its
 * query-head padding (Qwen2's 14/2 heads on tp 4 and 8), tp_split padding
 * and strides (docs/transforms.md §5), fused linears under tp, expert
 * stacking order and its inverse, rename, drop, transpose, cast, the neuron
 * preset's dense and expert layouts, the metadata of ckpt-layout.json, the
 * --print-rules round trip, plan-time errors (naming rule and tensor,
 * leaving no DST), a full disk, and executor edge cases (scalars, empty
 * tensors, a tensor larger than the slab and band buffers). Conversions are
 * consolidated back and compared byte for byte.
 *
 * Each test works in a fresh directory under $TMPDIR (or /tmp).
 */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/util.h"
#include "format/checkpoint.h"
#include "format/dtype.h"
#include "transform/convert.h"
#include "transform/presets.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <zlib.h>

#define ID_SCALE 1000000
#define ROW_SCALE 1000
#define SHAPE(...) ((const uint64_t[]){__VA_ARGS__})
#define NEEDLES(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- fixture ---- */

typedef struct {
    char root[512];
    char src[600], dst[600], dst2[600], back[600], rules[600];
} fixture;

static int fx_setup(void **state)
{
    fixture *fx = calloc(1, sizeof *fx);
    const char *base = getenv("TMPDIR");
    if (!fx) return -1;
    snprintf(fx->root, sizeof fx->root, "%s/ckpt-test-transforms-XXXXXX",
             base && *base ? base : "/tmp");
    if (!mkdtemp(fx->root)) {
        free(fx);
        return -1;
    }
    snprintf(fx->src, sizeof fx->src, "%s/src", fx->root);
    snprintf(fx->dst, sizeof fx->dst, "%s/dst", fx->root);
    snprintf(fx->dst2, sizeof fx->dst2, "%s/dst2", fx->root);
    snprintf(fx->back, sizeof fx->back, "%s/back", fx->root);
    snprintf(fx->rules, sizeof fx->rules, "%s/rules.json", fx->root);
    *state = fx;
    return 0;
}

static int fx_teardown(void **state)
{
    fixture *fx = *state;
    int rc = ckpt_rm_rf(fx->root);
    free(fx);
    return rc;
}

/* Removes the outputs of a conversion so the next one starts clean. */
static void fx_clear_outputs(fixture *fx)
{
    const char *dirs[] = {fx->dst, fx->dst2, fx->back};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(dirs); i++)
        assert_int_equal(ckpt_rm_rf(dirs[i]), 0);
}

static void assert_contains(const char *haystack, const char *needle)
{
    if (!strstr(haystack, needle)) fail_msg("message \"%s\" lacks \"%s\"", haystack, needle);
}

/* Writes text to path with every ' turned into ", so JSON reads cleanly in C. */
static void write_json_text(const char *path, const char *text)
{
    char *s = ckpt_strdup(text);
    assert_non_null(s);
    for (char *p = s; *p; p++)
        if (*p == '\'') *p = '"';
    assert_int_equal(ckpt_write_file_atomic(path, s, strlen(s)), 0);
    free(s);
}

static json_t *parse_json_text(const char *text)
{
    char *s = ckpt_strdup(text);
    assert_non_null(s);
    for (char *p = s; *p; p++)
        if (*p == '\'') *p = '"';
    json_error_t err;
    json_t *j = json_loads(s, JSON_DECODE_ANY, &err);
    if (!j) fail_msg("bad JSON in the test: %s: %s", err.text, s);
    free(s);
    return j;
}

/* ---- source checkpoints ---- */

typedef struct {
    const char *name;
    ckpt_dtype dtype;
    int ndim;
    uint64_t shape[3];
    int64_t id;          /* value tag */
    uint64_t row_stride; /* value step per row; 0: ROW_SCALE */
} src_tensor;

static uint64_t src_cols(const src_tensor *s)
{
    return s->ndim ? s->shape[s->ndim - 1] : 1;
}

static uint64_t src_rows(const src_tensor *s)
{
    uint64_t n = 1;
    for (int k = 0; k + 1 < s->ndim; k++)
        n *= s->shape[k];
    return n;
}

static int64_t src_value(const src_tensor *s, uint64_t row, uint64_t col)
{
    uint64_t stride = s->row_stride ? s->row_stride : ROW_SCALE;
    return s->id * ID_SCALE + (int64_t)(row * stride + col);
}

static void store_value(ckpt_dtype dt, uint8_t *dst, int64_t v)
{
    switch (dt) {
    case CKPT_DT_F32: {
        float f = (float)v;
        memcpy(dst, &f, 4);
        break;
    }
    case CKPT_DT_I32: {
        int32_t i = (int32_t)v;
        memcpy(dst, &i, 4);
        break;
    }
    case CKPT_DT_I16: { /* the value's low 16 bits (expect_block compares those) */
        int16_t i = (int16_t)(uint16_t)v;
        memcpy(dst, &i, 2);
        break;
    }
    default:
        fail_msg("test tensors are F32, I32 or I16, not %s", ckpt_dtype_name(dt));
    }
}

static double load_value(ckpt_dtype dt, const uint8_t *p)
{
    switch (dt) {
    case CKPT_DT_F32: {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    case CKPT_DT_F64: {
        double d;
        memcpy(&d, p, 8);
        return d;
    }
    case CKPT_DT_I32: {
        int32_t i;
        memcpy(&i, p, 4);
        return i;
    }
    case CKPT_DT_I16: {
        int16_t i;
        memcpy(&i, p, 2);
        return i;
    }
    case CKPT_DT_BF16: {
        uint16_t h;
        memcpy(&h, p, 2);
        return ckpt_bf16_to_f32(h);
    }
    default:
        fail_msg("cannot read %s values", ckpt_dtype_name(dt));
    }
    return 0;
}

/* st_write_file callback: writes the values of tensor specs[t->user]. */
static int fill_values(void *ctx, const st_out_tensor *t, int fd, const char *path)
{
    const src_tensor *s = &((const src_tensor *)ctx)[t->user];
    size_t es = ckpt_dtype_size(s->dtype);
    uint64_t cols = src_cols(s), n = t->nbytes / es;
    enum { CHUNK = 65536 };
    uint8_t *buf = malloc(CHUNK * es);
    assert_non_null(buf);
    int rc = 0;
    for (uint64_t first = 0; !rc && first < n; first += CHUNK) {
        uint64_t m = n - first < CHUNK ? n - first : CHUNK;
        for (uint64_t i = 0; i < m; i++)
            store_value(s->dtype, buf + i * es,
                        src_value(s, (first + i) / cols, (first + i) % cols));
        rc = ckpt_pwrite_full(fd, buf, m * es, t->offset + first * es, path);
    }
    free(buf);
    return rc;
}

/* Writes dir/model.safetensors holding specs (with {"format":"pt"}, as
 * save_pretrained does) and, when config is not NULL, dir/config.json. */
static void make_checkpoint(const char *dir, const src_tensor *specs, size_t n, const char *config)
{
    assert_int_equal(ckpt_mkdir_p(dir, 0755), 0);
    st_layout l;
    st_layout_init(&l);
    for (size_t i = 0; i < n; i++) {
        const src_tensor *s = &specs[i];
        if (s->dtype == CKPT_DT_F32 && src_rows(s) && src_cols(s))
            assert_true(src_value(s, src_rows(s) - 1, src_cols(s) - 1) <
                        (1 << 24)); /* exact in F32 */
        if (st_layout_add(&l, s->name, s->dtype, s->ndim, s->shape, i))
            fail_msg("%s", ckpt_error_last());
    }
    assert_int_equal(st_layout_set_meta(&l, "format", "pt"), 0);
    assert_int_equal(st_layout_finish(&l), 0);
    char *path = ckpt_path_join(dir, "model.safetensors");
    assert_non_null(path);
    if (st_write_file(path, &l, fill_values, (void *)specs)) fail_msg("%s", ckpt_error_last());
    free(path);
    st_layout_free(&l);
    if (config) {
        char *cfg = ckpt_path_join(dir, "config.json");
        assert_non_null(cfg);
        write_json_text(cfg, config);
        free(cfg);
    }
}

/* ---- reading converted tensors ---- */

/* A converted tensor, seen as 2-D: rows = all axes but the last, cols = the last. */
typedef struct {
    char name[256];
    ckpt_dtype dtype;
    int ndim;
    uint64_t shape[PLAN_MAX_DIM];
    uint64_t rows, cols;
    uint8_t *raw;
    size_t nbytes;
} view;

/* Rank r of a vllm layout: its file model-rank-r-part-0.safetensors in dst itself. */
#define VLLM_RANK(r) (-100 - (r))

/* The folder of rank `rank` (-1: the output has no rank folders; VLLM_RANK(r):
 * the first part file of vLLM rank r). malloc'd. */
static char *rank_dir(const char *dst, int rank)
{
    char *d = rank <= VLLM_RANK(0) ? ckpt_sprintf("%s/model-rank-%d-part-0.safetensors", dst, VLLM_RANK(0) - rank)
              : rank < 0           ? ckpt_strdup(dst)
                                   : ckpt_sprintf("%s/tp_rank_%02d", dst, rank);
    assert_non_null(d);
    return d;
}

/* Reads tensor `name` of rank `rank`; false when that folder has no such tensor. */
static bool try_load(view *v, const char *dst, int rank, const char *name)
{
    memset(v, 0, sizeof *v);
    char *dir = rank_dir(dst, rank);
    ckpt_checkpoint c;
    if (ckpt_checkpoint_open(&c, dir)) fail_msg("%s", ckpt_error_last());
    free(dir);
    const ckpt_tensor_ref *ref = ckpt_checkpoint_find(&c, name);
    if (!ref) {
        ckpt_checkpoint_close(&c);
        return false;
    }
    const st_tensor *t = ref->t;
    snprintf(v->name, sizeof v->name, "%s (rank %d)", name, rank);
    v->dtype = t->dtype;
    v->ndim = t->ndim;
    memcpy(v->shape, t->shape, (size_t)t->ndim * sizeof t->shape[0]);
    v->rows = 1;
    for (int k = 0; k + 1 < t->ndim; k++)
        v->rows *= t->shape[k];
    v->cols = t->ndim ? t->shape[t->ndim - 1] : 1;
    v->nbytes = (size_t)t->nbytes;
    v->raw = malloc(v->nbytes + 1);
    assert_non_null(v->raw);
    if (st_read_tensor(&c.files[ref->file], t, v->raw)) fail_msg("%s", ckpt_error_last());
    ckpt_checkpoint_close(&c);
    return true;
}

static view load(const char *dst, int rank, const char *name)
{
    view v;
    if (!try_load(&v, dst, rank, name)) fail_msg("%s: rank %d has no tensor '%s'", dst, rank, name);
    return v;
}

static void view_free(view *v)
{
    free(v->raw);
    v->raw = NULL;
}

static void expect_absent(const char *dst, int rank, const char *name)
{
    view v;
    if (try_load(&v, dst, rank, name)) {
        view_free(&v);
        fail_msg("%s: rank %d still has tensor '%s'", dst, rank, name);
    }
}

static void expect_shape(const view *v, ckpt_dtype dt, int ndim, const uint64_t *shape)
{
    char got[128], want[128];
    plan_shape_str(v->ndim, v->shape, got, sizeof got);
    plan_shape_str(ndim, shape, want, sizeof want);
    if (v->dtype != dt || strcmp(got, want))
        fail_msg("%s is %s %s, expected %s %s", v->name, ckpt_dtype_name(v->dtype), got,
                 ckpt_dtype_name(dt), want);
}

/* Checks v[r0 + i][c0 + j] for i < nr, j < nc against the source s: s[sr0 + i][sc0 + j],
 * or s[sr0 + j][sc0 + i] when transposed, or all-zero bytes when s is NULL. */
static void expect_block(const view *v, uint64_t r0, uint64_t c0, uint64_t nr, uint64_t nc,
                         const src_tensor *s, uint64_t sr0, uint64_t sc0, bool transposed)
{
    if (r0 + nr > v->rows || c0 + nc > v->cols)
        fail_msg("%s: block [%llu+%llu, %llu+%llu] lies outside [%llu, %llu]", v->name,
                 (unsigned long long)r0, (unsigned long long)nr, (unsigned long long)c0,
                 (unsigned long long)nc, (unsigned long long)v->rows, (unsigned long long)v->cols);
    size_t es = ckpt_dtype_size(v->dtype);
    for (uint64_t i = 0; i < nr; i++) {
        for (uint64_t j = 0; j < nc; j++) {
            uint64_t r = r0 + i, c = c0 + j;
            const uint8_t *p = v->raw + (r * v->cols + c) * es;
            if (!s) {
                for (size_t b = 0; b < es; b++)
                    if (p[b])
                        fail_msg("%s[%llu][%llu] should be padding (all bits zero), is %g", v->name,
                                 (unsigned long long)r, (unsigned long long)c,
                                 load_value(v->dtype, p));
                continue;
            }
            uint64_t sr = transposed ? sr0 + j : sr0 + i, sc = transposed ? sc0 + i : sc0 + j;
            double want = (double)src_value(s, sr, sc), got = load_value(v->dtype, p);
            if (v->dtype == CKPT_DT_I16) want = (int16_t)(uint16_t)src_value(s, sr, sc);
            if (got != want)
                fail_msg("%s[%llu][%llu] is %.10g, expected %.10g (%s row %llu col %llu)", v->name,
                         (unsigned long long)r, (unsigned long long)c, got, want, s->name,
                         (unsigned long long)sr, (unsigned long long)sc);
        }
    }
}

/* Rows r0.. of v are rows sr0.. of s (or zeros), all columns. */
static void expect_rows(const view *v, uint64_t r0, uint64_t n, const src_tensor *s, uint64_t sr0)
{
    expect_block(v, r0, 0, n, v->cols, s, sr0, 0, false);
}

/* Columns c0.. of v are columns sc0.. of s (or zeros), all rows. */
static void expect_cols(const view *v, uint64_t c0, uint64_t n, const src_tensor *s, uint64_t sc0)
{
    expect_block(v, 0, c0, v->rows, n, s, 0, sc0, false);
}

/* Along axis 0 (rows) or 1 (columns) of v from `at` on: block i is head
 * heads[i] of s (hd rows or columns), or zeros when heads[i] is -1. */
static void expect_heads(const view *v, int axis, uint64_t at, const int *heads, size_t n,
                         uint64_t hd, const src_tensor *s)
{
    for (size_t i = 0; i < n; i++) {
        const src_tensor *from = heads[i] < 0 ? NULL : s;
        uint64_t first = heads[i] < 0 ? 0 : (uint64_t)heads[i] * hd;
        if (axis == 0)
            expect_rows(v, at + i * hd, hd, from, first);
        else
            expect_cols(v, at + i * hd, hd, from, first);
    }
}

/* Rank r's share of s split on axis 0 (rows) or 1 (columns) as docs/transforms.md §5 says:
 * padded with zeros to a multiple of pad_multiple, cut into tp*stride
 * pieces, pieces r, r+tp, ... concatenated; expected in v from `at` on along
 * that axis. Returns the length the share takes. */
static uint64_t expect_split(const view *v, int axis, uint64_t at, const src_tensor *s, uint64_t tp,
                             uint64_t stride, uint64_t pad_multiple, uint64_t r)
{
    uint64_t len = axis == 0 ? src_rows(s) : src_cols(s);
    uint64_t padded = (len + pad_multiple - 1) / pad_multiple * pad_multiple,
             piece = padded / (tp * stride);
    uint64_t pos = at;
    for (uint64_t k = 0; k < stride; k++) {
        for (uint64_t i = 0; i < piece; i++, pos++) {
            uint64_t idx = (r + k * tp) * piece + i;
            const src_tensor *from = idx < len ? s : NULL;
            if (axis == 0)
                expect_rows(v, pos, 1, from, idx);
            else
                expect_cols(v, pos, 1, from, idx);
        }
    }
    return pos - at;
}

/* The whole of s, unchanged, as v. */
static void expect_whole(const view *v, const src_tensor *s)
{
    expect_shape(v, s->dtype, s->ndim, s->shape);
    expect_rows(v, 0, v->rows, s, 0);
}

/* ---- running conversions ---- */

static convert_opts preset(const char *layout, int tp)
{
    return (convert_opts){.layout = layout, .tp = tp};
}

static void convert_ok(const char *src, const char *dst, convert_opts o)
{
    o.quiet = true;
    convert_plan cp;
    if (convert_plan_build(&cp, src, &o)) fail_msg("planning %s: %s", src, ckpt_error_last());
    if (convert_write(&cp, dst, &o))
        fail_msg("converting %s into %s: %s", src, dst, ckpt_error_last());
    convert_plan_free(&cp);
}

/* Converts fx->src into dst with the rules document `text` (' for "). */
static void convert_with_rules(fixture *fx, const char *dst, const char *text)
{
    write_json_text(fx->rules, text);
    convert_ok(fx->src, dst, (convert_opts){.rules_file = fx->rules});
}

/* Consolidates src into dst; returns the lossy flag. */
static bool consolidate_ok(const char *src, const char *dst)
{
    consolidate_opts o = {.quiet = true};
    if (consolidate_run(src, dst, &o)) fail_msg("consolidating %s: %s", src, ckpt_error_last());
    return o.lossy;
}

static int name_filter(const struct dirent *e)
{
    return strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
}

static void expect_files_equal(const char *a, const char *b)
{
    char *ba, *bb;
    size_t la, lb;
    if (ckpt_read_file(a, 1u << 30, &ba, &la) || ckpt_read_file(b, 1u << 30, &bb, &lb))
        fail_msg("%s", ckpt_error_last());
    if (la != lb || memcmp(ba, bb, la))
        fail_msg("%s and %s differ (%zu and %zu bytes)", a, b, la, lb);
    free(ba);
    free(bb);
}

/* Every file under a has a byte-identical twin under b, and b has nothing more. */
static void expect_trees_equal(const char *a, const char *b)
{
    struct dirent **la, **lb;
    int na = scandir(a, &la, name_filter, alphasort), nb = scandir(b, &lb, name_filter, alphasort);
    if (na < 0 || nb < 0) fail_msg("cannot list %s or %s", a, b);
    for (int i = 0; i < na || i < nb; i++) {
        const char *x = i < na ? la[i]->d_name : "(nothing)",
                   *y = i < nb ? lb[i]->d_name : "(nothing)";
        if (strcmp(x, y)) fail_msg("%s holds %s where %s holds %s", a, x, b, y);
        char *pa = ckpt_path_join(a, x), *pb = ckpt_path_join(b, y);
        assert_true(pa && pb);
        if (ckpt_is_dir(pa)) {
            expect_trees_equal(pa, pb);
        } else {
            expect_files_equal(pa, pb);
        }
        free(pa);
        free(pb);
    }
    for (int i = 0; i < na; i++)
        free(la[i]);
    for (int i = 0; i < nb; i++)
        free(lb[i]);
    free(la);
    free(lb);
}

/* Consolidates dst into fx->back and expects the source files back, byte for byte. */
static void expect_round_trip(fixture *fx, const char *dst)
{
    assert_int_equal(ckpt_rm_rf(fx->back), 0);
    assert_false(consolidate_ok(dst, fx->back));
    expect_trees_equal(fx->src, fx->back);
}

/* Sources made on demand from the plan's own files, as the store reads blobs
 * in a bucket (store/blob_ranges.h): views preaded into a buffer of the
 * reading thread, the rows of a strided walk packed one pread each. */
typedef struct {
    int *fds;
    int views, rows; /* calls, to check the vsource was read */
} file_vs;
typedef struct {
    uint8_t *buf;
    size_t cap;
} file_vs_ts;

static bool fvs_serves(void *ctx, size_t file) { return true; }
static void *fvs_open(void *ctx) { return calloc(1, sizeof(file_vs_ts)); }
static void fvs_close(void *ctx, void *ts)
{
    free(((file_vs_ts *)ts)->buf);
    free(ts);
}
static uint8_t *fvs_buf(file_vs_ts *t, size_t n)
{
    if (n > t->cap) {
        free(t->buf);
        t->buf = malloc(n);
        t->cap = t->buf ? n : 0;
    }
    return t->buf;
}
static int fvs_view(void *ctx, void *ts, size_t file, uint64_t off, size_t len, const uint8_t **out)
{
    file_vs *v = ctx;
    uint8_t *b = fvs_buf(ts, len ? len : 1);
    __atomic_fetch_add(&v->views, 1, __ATOMIC_RELAXED);
    *out = b;
    return b ? ckpt_pread_full(v->fds[file], b, len, off, "vsource") : CKPT_ENOMEM;
}
static int fvs_rows(void *ctx, void *ts, size_t file, uint64_t off, uint64_t rows, uint64_t stride, size_t len,
                    const uint8_t **out, uint64_t *out_stride)
{
    file_vs *v = ctx;
    if (rows < 2 || stride <= len) return 1;
    uint8_t *b = fvs_buf(ts, (size_t)(rows * len));
    __atomic_fetch_add(&v->rows, 1, __ATOMIC_RELAXED);
    for (uint64_t r = 0; b && r < rows; r++)
        if (ckpt_pread_full(v->fds[file], b + r * len, len, off + r * stride, "vsource")) return CKPT_EIO;
    *out = b;
    *out_stride = len;
    return b ? 0 : CKPT_ENOMEM;
}

/* exec_hash_outputs (the store's hashes of a layout it never writes) gives
 * the sha256 of every file convert wrote into dst with the same options;
 * and the same again when every source is read through a vsource. */
static void expect_hashes_without_writing(const char *src, const char *dst, convert_opts o)
{
    convert_plan cp;
    if (convert_plan_build(&cp, src, &o) < 0) fail_msg("plan: %s", ckpt_error_last());
    char(*got)[65] = calloc(cp.exec.nfiles + 1, sizeof *got), (*via)[65] = calloc(cp.exec.nfiles + 1, sizeof *via);
    assert_true(got && via);
    if (exec_hash_outputs(&cp.exec, 2, NULL, true, got)) fail_msg("hashing: %s", ckpt_error_last());
    file_vs fv = {.fds = calloc(cp.exec.nsrc_paths + 1, sizeof(int))};
    assert_non_null(fv.fds);
    for (size_t i = 0; i < cp.exec.nsrc_paths; i++) assert_true((fv.fds[i] = open(cp.exec.src_paths[i], O_RDONLY)) >= 0);
    exec_vsource vs = {.ctx = &fv, .serves = fvs_serves, .thread_open = fvs_open, .thread_close = fvs_close,
                       .view = fvs_view, .view_rows = fvs_rows};
    cp.exec.vsource = &vs;
    if (exec_hash_outputs(&cp.exec, 2, NULL, true, via)) fail_msg("hashing through a vsource: %s", ckpt_error_last());
    cp.exec.vsource = NULL;
    assert_true(fv.views + fv.rows > 0);
    for (size_t f = 0; f < cp.exec.nfiles; f++) {
        char *path = ckpt_path_join(dst, cp.exec.files[f].rel), want[65];
        assert_int_equal(ckpt_sha256_file_hex(path, want), 0);
        if (strcmp(got[f], want)) fail_msg("%s: hashed without writing %s, written %s", path, got[f], want);
        if (strcmp(via[f], want)) fail_msg("%s: hashed through a vsource %s, written %s", path, via[f], want);
        free(path);
    }
    for (size_t i = 0; i < cp.exec.nsrc_paths; i++) close(fv.fds[i]);
    free(fv.fds);
    free(got);
    free(via);
    convert_plan_free(&cp);
}

/* Neither dst nor a dst.tmp-* sibling exists. */
static void expect_no_dst(const char *dst)
{
    if (ckpt_exists(dst)) fail_msg("%s exists after a failed conversion", dst);
    char *parent = ckpt_strdup(dst);
    assert_non_null(parent);
    *strrchr(parent, '/') = '\0';
    char *prefix = ckpt_sprintf("%s.tmp-", ckpt_basename(dst));
    assert_non_null(prefix);
    DIR *d = opendir(parent);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, prefix, strlen(prefix)))
            fail_msg("%s/%s was left behind", parent, e->d_name);
    closedir(d);
    free(prefix);
    free(parent);
}

/* Converting src into dst must fail (at plan time when at_plan) with a
 * message holding every needle, and leave no DST behind. The same calls as
 * `ckpt convert`: plan, then write only when planning succeeded. */
static void expect_convert_error(const char *src, const char *dst, convert_opts o, bool at_plan,
                                 const char *const *needles)
{
    o.quiet = true;
    convert_plan cp;
    int rc = convert_plan_build(&cp, src, &o);
    if (rc == 0) {
        if (at_plan) {
            convert_plan_free(&cp);
            fail_msg("planning succeeded; expected an error naming '%s'", needles[0]);
        }
        rc = convert_write(&cp, dst, &o);
        convert_plan_free(&cp);
        if (rc == 0) fail_msg("conversion succeeded; expected an error naming '%s'", needles[0]);
    }
    for (size_t i = 0; needles[i]; i++)
        assert_contains(ckpt_error_last(), needles[i]);
    expect_no_dst(dst);
}

/* ---- ckpt-layout.json ---- */

static json_t *load_layout(const char *dst)
{
    char *path = ckpt_path_join(dst, CONVERT_LAYOUT_FILE);
    json_t *j;
    if (!path || cj_load_file(&j, path, CONVERT_LAYOUT_MAX_BYTES))
        fail_msg("%s", ckpt_error_last());
    free(path);
    return j;
}

/* The "tensors" entry of name on rank (-1: the entry with "rank": null). */
static json_t *layout_entry(const json_t *layout, const char *name, int rank)
{
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(layout, "tensors"), i, e)
    {
        json_t *r = json_object_get(e, "rank");
        bool same_rank = rank < 0 ? json_is_null(r) : json_integer_value(r) == rank;
        if (same_rank && !strcmp(json_string_value(json_object_get(e, "name")), name)) return e;
    }
    fail_msg("ckpt-layout.json lists no tensor '%s' of rank %d", name, rank);
    return NULL;
}

/* got equals the JSON text want (' for "), or the test fails showing both. */
static void expect_json(const json_t *got, const char *want_text, const char *what)
{
    json_t *want = parse_json_text(want_text);
    if (!got || !json_equal((json_t *)got, want)) {
        char *g = got ? json_dumps(got, JSON_COMPACT) : NULL, *w = json_dumps(want, JSON_COMPACT);
        fail_msg("%s is %s, expected %s", what, g ? g : "(missing)", w);
    }
    json_decref(want);
}

/* The optimum-neuron "parameters" entry of a split tensor. */
static void expect_parameter(const json_t *layout, const char *name, int dim, int stride, int tp)
{
    char want[256];
    snprintf(want, sizeof want,
             "{'tensor_model_parallel': true, 'partition_dim': %d, 'partition_stride': %d, "
             "'num_partitions': %d}",
             dim, stride, tp);
    expect_json(json_object_get(json_object_get(layout, "parameters"), name), want, name);
}

/* ---- attention models (docs/transforms.md §4) ---- */

#define ATTN "model.layers.0.self_attn."
enum { Q, K, V, O, QB, KB, VB };

typedef struct {
    int heads, kv, hd, hidden;
    bool bias;
    src_tensor t[7];
    size_t n;
    char config[512];
} attn_model;

/* q/k/v/o weights (ids 1-4) and, with bias, q/k/v biases (ids 5-7), F32. */
static void attn_model_init(attn_model *m, int heads, int kv, int hd, int hidden, bool bias)
{
    memset(m, 0, sizeof *m);
    m->heads = heads;
    m->kv = kv;
    m->hd = hd;
    m->hidden = hidden;
    m->bias = bias;
    uint64_t qd = (uint64_t)(heads * hd), kd = (uint64_t)(kv * hd), h = (uint64_t)hidden;
    m->t[Q] = (src_tensor){ATTN "q_proj.weight", CKPT_DT_F32, 2, {qd, h}, 1, 0};
    m->t[K] = (src_tensor){ATTN "k_proj.weight", CKPT_DT_F32, 2, {kd, h}, 2, 0};
    m->t[V] = (src_tensor){ATTN "v_proj.weight", CKPT_DT_F32, 2, {kd, h}, 3, 0};
    m->t[O] = (src_tensor){ATTN "o_proj.weight", CKPT_DT_F32, 2, {h, qd}, 4, 0};
    m->t[QB] = (src_tensor){ATTN "q_proj.bias", CKPT_DT_F32, 1, {qd}, 5, 0};
    m->t[KB] = (src_tensor){ATTN "k_proj.bias", CKPT_DT_F32, 1, {kd}, 6, 0};
    m->t[VB] = (src_tensor){ATTN "v_proj.bias", CKPT_DT_F32, 1, {kd}, 7, 0};
    m->n = bias ? 7 : 4;
    snprintf(m->config, sizeof m->config,
             "{'model_type': 'llama', 'num_attention_heads': %d, 'num_key_value_heads': %d, "
             "'head_dim': %d, 'hidden_size': %d}",
             heads, kv, hd, hidden);
}

/* Writes the model into dir, leaving out tensor `skip` (-1: none). */
static void attn_model_write(const attn_model *m, const char *dir, int skip)
{
    src_tensor t[7];
    size_t n = 0;
    for (size_t i = 0; i < m->n; i++)
        if ((int)i != skip) t[n++] = m->t[i];
    make_checkpoint(dir, t, n, m->config);
}

/* Rank `rank` of a neuron layout holds, for query heads q[0..nq) and KV heads
 * kv[0..nkv): qkv = [Q heads; K heads; V heads], o_proj = the Q heads' columns,
 * and (with bias) the bias likewise; the unfused tensors are gone. */
static void expect_gqa_rank(const attn_model *m, const char *dst, int rank, const int *q, size_t nq,
                            const int *kv, size_t nkv)
{
    uint64_t hd = (uint64_t)m->hd, h = (uint64_t)m->hidden;
    view qkv = load(dst, rank, ATTN "qkv_proj.weight_qkv");
    expect_shape(&qkv, CKPT_DT_F32, 2, SHAPE((nq + 2 * nkv) * hd, h));
    expect_heads(&qkv, 0, 0, q, nq, hd, &m->t[Q]);
    expect_heads(&qkv, 0, nq * hd, kv, nkv, hd, &m->t[K]);
    expect_heads(&qkv, 0, (nq + nkv) * hd, kv, nkv, hd, &m->t[V]);
    view_free(&qkv);
    view o = load(dst, rank, ATTN "o_proj.weight");
    expect_shape(&o, CKPT_DT_F32, 2, SHAPE(h, nq * hd));
    expect_heads(&o, 1, 0, q, nq, hd, &m->t[O]);
    view_free(&o);
    if (m->bias) {
        view b = load(dst, rank, ATTN "qkv_proj.bias_qkv");
        expect_shape(&b, CKPT_DT_F32, 1, SHAPE((nq + 2 * nkv) * hd));
        expect_heads(&b, 1, 0, q, nq, hd, &m->t[QB]);
        expect_heads(&b, 1, nq * hd, kv, nkv, hd, &m->t[KB]);
        expect_heads(&b, 1, (nq + nkv) * hd, kv, nkv, hd, &m->t[VB]);
        view_free(&b);
    }
    for (size_t i = 0; i < m->n; i++)
        if (i != O) expect_absent(dst, rank, m->t[i].name);
}

/* Every rank r of tp: q heads q[r*nq ..], KV heads kv[r*nkv ..]. */
static void expect_gqa_ranks(const attn_model *m, const char *dst, int tp, const int *q, size_t nq,
                             const int *kv, size_t nkv)
{
    for (int r = 0; r < tp; r++)
        expect_gqa_rank(m, dst, tp > 1 ? r : -1, q + (size_t)r * nq, nq, kv + (size_t)r * nkv, nkv);
}

/* ---- GQA (docs/transforms.md §4) ---- */

static void test_gqa_worked_example_tp4(void **state)
{
    fixture *fx = *state;
    attn_model m;
    attn_model_init(&m, 8, 2, 4, 16, false);
    attn_model_write(&m, fx->src, -1);
    convert_ok(fx->src, fx->dst, preset("neuron", 4));
    /* m = 2, kpr = 1, G = 4, gpr = 2 */
    static const int q[4][2] = {{0, 1}, {4, 5}, {2, 3}, {6, 7}}, kv[4][1] = {{0}, {1}, {0}, {1}};
    expect_gqa_ranks(&m, fx->dst, 4, &q[0][0], 2, &kv[0][0], 1);
    /* docs/transforms.md §4's worked example: rank 1's qkv is q rows 16..23, k rows 4..7, v rows
     * 4..7, shape [16, 16]; rank 1's o_proj is columns 16..23. */
    view v = load(fx->dst, 1, ATTN "qkv_proj.weight_qkv");
    expect_shape(&v, CKPT_DT_F32, 2, SHAPE(16, 16));
    expect_rows(&v, 0, 8, &m.t[Q], 16);
    expect_rows(&v, 8, 4, &m.t[K], 4);
    expect_rows(&v, 12, 4, &m.t[V], 4);
    view_free(&v);
    view o = load(fx->dst, 1, ATTN "o_proj.weight");
    expect_shape(&o, CKPT_DT_F32, 2, SHAPE(16, 8));
    expect_cols(&o, 0, 8, &m.t[O], 16);
    view_free(&o);
    expect_round_trip(fx, fx->dst);
}

static void test_gqa_second_example_tp8(void **state)
{
    fixture *fx = *state;
    attn_model m;
    attn_model_init(&m, 32, 4, 2, 8, false);
    attn_model_write(&m, fx->src, -1);
    /* docs/transforms.md §4's m = 4 example (kpr = 2, gpr = 2); r0..r2 are its
     * list, the rest follow its formula. */
    convert_opts o = preset("neuron", 8);
    o.kv_size_multiplier = 4;
    convert_ok(fx->src, fx->dst, o);
    static const int q4[8][4] = {{0, 1, 8, 9},     {16, 17, 24, 25}, {2, 3, 10, 11},
                                 {18, 19, 26, 27}, {4, 5, 12, 13},   {20, 21, 28, 29},
                                 {6, 7, 14, 15},   {22, 23, 30, 31}};
    static const int kv4[8][2] = {{0, 1}, {2, 3}, {0, 1}, {2, 3}, {0, 1}, {2, 3}, {0, 1}, {2, 3}};
    expect_gqa_ranks(&m, fx->dst, 8, &q4[0][0], 4, &kv4[0][0], 2);
    json_t *layout = load_layout(fx->dst);
    expect_json(
        json_object_get(json_object_get(layout_entry(layout, ATTN "qkv_proj.weight_qkv", 1), "gqa"),
                        "kv_size_multiplier"),
        "4", "kv_size_multiplier");
    json_decref(layout);
    expect_round_trip(fx, fx->dst);

    /* The default m = tp / gcd(KV, tp) = 2: kpr = 1, gpr = 4. */
    convert_ok(fx->src, fx->dst2, preset("neuron", 8));
    static const int q2[8][4] = {{0, 1, 2, 3},     {8, 9, 10, 11},  {16, 17, 18, 19},
                                 {24, 25, 26, 27}, {4, 5, 6, 7},    {12, 13, 14, 15},
                                 {20, 21, 22, 23}, {28, 29, 30, 31}};
    static const int kv2[8][1] = {{0}, {1}, {2}, {3}, {0}, {1}, {2}, {3}};
    expect_gqa_ranks(&m, fx->dst2, 8, &q2[0][0], 4, &kv2[0][0], 1);
    expect_round_trip(fx, fx->dst2);
}

/* m = 1 (KV divisible by tp) is a plain contiguous split; fused: false keeps
 * q, k and v as three tensors per rank. */
static void test_gqa_contiguous_and_unfused(void **state)
{
    fixture *fx = *state;
    attn_model m;
    attn_model_init(&m, 8, 4, 2, 4, false);
    attn_model_write(&m, fx->src, -1);
    convert_ok(fx->src, fx->dst, preset("neuron", 4));
    static const int q[4][2] = {{0, 1}, {2, 3}, {4, 5}, {6, 7}}, kv[4][1] = {{0}, {1}, {2}, {3}};
    expect_gqa_ranks(&m, fx->dst, 4, &q[0][0], 2, &kv[0][0], 1);
    expect_round_trip(fx, fx->dst);

    convert_with_rules(
        fx, fx->dst2,
        "{'tp': 4, 'rules': [{'op': 'fuse_qkv_gqa', "
        "'pattern': '^(.*[.]self_attn)[.]q_proj[.]weight$', 'num_attention_heads': 8, "
        "'num_key_value_heads': 4, 'head_dim': 2, 'fused': false}]}");
    for (int r = 0; r < 4; r++) {
        const int *proj_heads[] = {[Q] = q[r], [K] = kv[r], [V] = kv[r], [O] = q[r]};
        for (int p = Q; p <= O; p++) {
            view v = load(fx->dst2, r, m.t[p].name);
            size_t n = p == Q || p == O ? 2 : 1;
            expect_heads(&v, p == O ? 1 : 0, 0, proj_heads[p], n, 2, &m.t[p]);
            view_free(&v);
        }
        expect_absent(fx->dst2, r, ATTN "qkv_proj.weight_qkv");
    }
    expect_round_trip(fx, fx->dst2);

    /* 'o': '' places q/k/v only (a LoRA lora_B of q/k/v whose o_proj has no
     * adapter, transform/nxd_import.c): o_proj is left to the other rules,
     * here none, so it stays whole */
    assert_int_equal(ckpt_rm_rf(fx->dst2), 0);
    convert_with_rules(
        fx, fx->dst2,
        "{'tp': 4, 'rules': [{'op': 'fuse_qkv_gqa', "
        "'pattern': '^(.*[.]self_attn)[.]q_proj[.]weight$', 'num_attention_heads': 8, "
        "'num_key_value_heads': 4, 'head_dim': 2, 'o': ''}]}");
    for (int r = 0; r < 4; r++) {
        view v = load(fx->dst2, r, ATTN "qkv_proj.weight_qkv");
        expect_heads(&v, 0, 0, q[r], 2, 2, &m.t[Q]);
        expect_heads(&v, 0, 4, kv[r], 1, 2, &m.t[K]);
        expect_heads(&v, 0, 6, kv[r], 1, 2, &m.t[V]);
        view_free(&v);
    }
    view o = load(fx->dst2, 0, m.t[O].name);
    expect_shape(&o, CKPT_DT_F32, 2, SHAPE(m.t[O].shape[0], m.t[O].shape[1]));
    view_free(&o);
    expect_round_trip(fx, fx->dst2);
}

/* Qwen2-0.5B's 14 query heads over 2 KV heads: each KV group gets zero query
 * heads at its end, o_proj zero columns to match, and consolidation strips
 * them. */
static void test_gqa_head_padding(void **state)
{
    fixture *fx = *state;
    attn_model m;
    attn_model_init(&m, 14, 2, 2, 8, true);
    attn_model_write(&m, fx->src, -1);

    /* tp 8: m = 4, G = 7 padded to 8, kpr = 1, gpr = 2. */
    static const int q8[8][2] = {{0, 1}, {7, 8},   {2, 3},  {9, 10},
                                 {4, 5}, {11, 12}, {6, -1}, {13, -1}};
    static const int kv8[8][1] = {{0}, {1}, {0}, {1}, {0}, {1}, {0}, {1}};
    convert_ok(fx->src, fx->dst, preset("neuron", 8));
    expect_gqa_ranks(&m, fx->dst, 8, &q8[0][0], 2, &kv8[0][0], 1);
    json_t *layout = load_layout(fx->dst);
    expect_json(
        json_object_get(layout_entry(layout, ATTN "o_proj.weight", 7), "gqa"),
        "{'num_attention_heads': 14, 'num_key_value_heads': 2, 'kv_size_multiplier': 4, "
        "'head_dim': 2, 'padded_num_attention_heads': 16, 'q_heads': [13, -1], 'kv_heads': [1], "
        "'fused': true}",
        "gqa of rank 7's o_proj");
    json_decref(layout);
    expect_round_trip(fx, fx->dst);

    /* tp 4: m = 2, G = 7 padded to 8, kpr = 1, gpr = 4. */
    static const int q4[4][4] = {{0, 1, 2, 3}, {7, 8, 9, 10}, {4, 5, 6, -1}, {11, 12, 13, -1}};
    static const int kv4[4][1] = {{0}, {1}, {0}, {1}};
    convert_ok(fx->src, fx->dst2, preset("neuron", 4));
    expect_gqa_ranks(&m, fx->dst2, 4, &q4[0][0], 4, &kv4[0][0], 1);
    expect_round_trip(fx, fx->dst2);
}

/* ---- tp_split, fuse (docs/transforms.md §3, §5) ---- */

static void test_tp_split_padding(void **state)
{
    fixture *fx = *state;
    const src_tensor t[] = {
        {"embed.weight", CKPT_DT_I32, 2, {10, 3}, 1, 0},
        {"row.weight", CKPT_DT_I32, 2, {3, 10}, 2, 0},
        {"norm.weight", CKPT_DT_I32, 1, {3}, 3, 0},
    };
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t), NULL);
    convert_with_rules(
        fx, fx->dst,
        "{'tp': 4, 'rules': [{'op': 'tp_split', 'pattern': '^embed[.]weight$', 'axis': 0},"
        "{'op': 'tp_split', 'pattern': '^row[.]weight$', 'axis': 1}]}");
    for (int r = 0; r < 4; r++) {
        view e = load(fx->dst, r, "embed.weight"), w = load(fx->dst, r, "row.weight"),
             n = load(fx->dst, r, "norm.weight");
        expect_shape(&e, CKPT_DT_I32, 2, SHAPE(3, 3));
        expect_split(&e, 0, 0, &t[0], 4, 1, 4, (uint64_t)r);
        expect_shape(&w, CKPT_DT_I32, 2, SHAPE(3, 3));
        expect_split(&w, 1, 0, &t[1], 4, 1, 4, (uint64_t)r);
        expect_whole(&n, &t[2]);
        if (r == 3) { /* vocabulary 10 padded to 12: row 9, then two zero rows */
            expect_rows(&e, 0, 1, &t[0], 9);
            expect_rows(&e, 1, 2, NULL, 0);
            expect_cols(&w, 0, 1, &t[1], 9);
            expect_cols(&w, 1, 2, NULL, 0);
        }
        view_free(&e);
        view_free(&w);
        view_free(&n);
    }
    json_t *layout = load_layout(fx->dst);
    expect_parameter(layout, "embed.weight", 0, 1, 4);
    expect_parameter(layout, "row.weight", 1, 1, 4);
    assert_null(json_object_get(json_object_get(layout, "parameters"), "norm.weight"));
    expect_json(json_object_get(layout_entry(layout, "embed.weight", 3), "padding"),
                "{'axis': 0, 'original': 10, 'padded': 12}", "padding of embed.weight");
    expect_json(json_object_get(layout_entry(layout, "row.weight", 0), "padding"),
                "{'axis': 1, 'original': 10, 'padded': 12}", "padding of row.weight");
    json_decref(layout);
    expect_round_trip(fx, fx->dst);
}

/* The ranks of one tensor run together (the executor's sibling groups, at
 * most 16 at a time: here 16 + 4 of tp 20), each piece of their source read
 * once for all: column slices (every rank's walk spans the source's rows),
 * row slices (contiguous: copied whole, alone), column slices of bf16 with
 * a transpose, a tensor whose last rank is padded (not a sibling of the
 * others), a replicated one (copied whole, alone); boxes far smaller than
 * the tensors (a slab of 800 bytes shared 16 ways). Every element checked. */
static void test_tp_groups(void **state)
{
    fixture *fx = *state;
    const src_tensor t[] = {
        {"col.weight", CKPT_DT_I16, 2, {50, 60}, 1, 0},
        {"row.weight", CKPT_DT_I32, 2, {60, 7}, 2, 0},
        {"colt.weight", CKPT_DT_I16, 2, {40, 200}, 3, 0},
        {"pad.weight", CKPT_DT_I32, 2, {5, 58}, 4, 0},
        {"norm.weight", CKPT_DT_I16, 1, {9}, 5, 0},
    };
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t), NULL);
    convert_with_rules(fx, fx->dst,
                       "{'tp': 20, 'rules': [{'op': 'tp_split', 'pattern': '^(col|pad)[.]weight$', 'axis': 1},"
                       "{'op': 'tp_split', 'pattern': '^row[.]weight$', 'axis': 0},"
                       "{'op': 'transpose', 'pattern': '^colt[.]weight$'},"
                       "{'op': 'tp_split', 'pattern': '^colt[.]weight$', 'axis': 0}]}");
    for (int r = 0; r < 20; r++) {
        view c = load(fx->dst, r, "col.weight"), w = load(fx->dst, r, "row.weight"),
             ct = load(fx->dst, r, "colt.weight"), pd = load(fx->dst, r, "pad.weight"),
             n = load(fx->dst, r, "norm.weight");
        expect_shape(&c, CKPT_DT_I16, 2, SHAPE(50, 3));
        expect_split(&c, 1, 0, &t[0], 20, 1, 20, (uint64_t)r);
        expect_shape(&w, CKPT_DT_I32, 2, SHAPE(3, 7));
        expect_split(&w, 0, 0, &t[1], 20, 1, 20, (uint64_t)r);
        expect_shape(&ct, CKPT_DT_I16, 2, SHAPE(10, 40)); /* rows 10r.. of the transpose: columns of the source */
        expect_block(&ct, 0, 0, 10, 40, &t[2], 0, 10 * (uint64_t)r, true);
        expect_shape(&pd, CKPT_DT_I32, 2, SHAPE(5, 3));
        expect_split(&pd, 1, 0, &t[3], 20, 1, 20, (uint64_t)r);
        expect_whole(&n, &t[4]);
        view_free(&c);
        view_free(&w);
        view_free(&ct);
        view_free(&pd);
        view_free(&n);
    }
    expect_round_trip(fx, fx->dst);
}

/* Sibling groups where the slab is large enough to tile: a bf16 source
 * transposed and split 16 ways (each rank's 24 rows: AVX2's 16 x 16 tiles
 * and then 8 x 8 ones, read once for the group), and an f32 column slice
 * widened to f64 (a cast on the shared read). Every element checked. */
static void test_tp_groups_tiles(void **state)
{
    fixture *fx = *state;
    const src_tensor t[] = {
        {"colt.weight", CKPT_DT_I16, 2, {4096, 384}, 1, 384},
        {"wide.weight", CKPT_DT_F32, 2, {64, 1024}, 2, 0},
    };
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t), NULL);
    for (int sse2 = 0; sse2 < 2; sse2++) {
        if (sse2) setenv("CKPT_EXEC_NO_AVX2", "1", 1);
        fx_clear_outputs(fx);
        convert_with_rules(fx, fx->dst,
                           "{'tp': 16, 'rules': [{'op': 'transpose', 'pattern': '^colt[.]weight$'},"
                           "{'op': 'tp_split', 'pattern': '^colt[.]weight$', 'axis': 0},"
                           "{'op': 'tp_split', 'pattern': '^wide[.]weight$', 'axis': 1},"
                           "{'op': 'cast', 'pattern': '^wide[.]weight$', 'dtype': 'f64'}]}");
        for (int r = 0; r < 16; r++) {
            view ct = load(fx->dst, r, "colt.weight"), w = load(fx->dst, r, "wide.weight");
            expect_shape(&ct, CKPT_DT_I16, 2, SHAPE(24, 4096));
            expect_block(&ct, 0, 0, 24, 4096, &t[0], 0, 24 * (uint64_t)r, true);
            expect_shape(&w, CKPT_DT_F64, 2, SHAPE(64, 64));
            expect_split(&w, 1, 0, &t[1], 16, 1, 16, (uint64_t)r);
            view_free(&ct);
            view_free(&w);
        }
    }
    unsetenv("CKPT_EXEC_NO_AVX2");
}

/* Siblings whose outputs are too small to share a slab (every output of the
 * plan 8 bytes, a slab of 8 bytes: less than an element for each of 16) run
 * one at a time, with the same bytes. */
static void test_tp_groups_tiny(void **state)
{
    fixture *fx = *state;
    const src_tensor t[] = {{"a.weight", CKPT_DT_I32, 2, {2, 16}, 1, 0}};
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t), NULL);
    convert_with_rules(fx, fx->dst, "{'tp': 16, 'rules': [{'op': 'tp_split', 'pattern': '^a[.]weight$', 'axis': 1}]}");
    for (int r = 0; r < 16; r++) {
        view a = load(fx->dst, r, "a.weight");
        expect_shape(&a, CKPT_DT_I32, 2, SHAPE(2, 1));
        expect_split(&a, 1, 0, &t[0], 16, 1, 16, (uint64_t)r);
        view_free(&a);
    }
}

/* stride s: tp*s equal pieces, rank r takes r, r+tp, ... (Megatron order). */
static void test_tp_split_stride(void **state)
{
    fixture *fx = *state;
    const src_tensor t[] = {
        {"even.weight", CKPT_DT_I32, 2, {16, 2}, 1, 0},
        {"odd.weight", CKPT_DT_I32, 2, {13, 2}, 2, 0},
    };
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t), NULL);
    convert_with_rules(fx, fx->dst,
                       "{'tp': 4, 'rules': [{'op': 'tp_split', 'pattern': '^even', 'stride': 2},"
                       "{'op': 'tp_split', 'pattern': '^odd', 'stride': 2, 'pad_multiple': 8}]}");
    for (int r = 0; r < 4; r++) {
        view e = load(fx->dst, r, "even.weight"), o = load(fx->dst, r, "odd.weight");
        expect_shape(&e, CKPT_DT_I32, 2, SHAPE(4, 2));
        expect_split(&e, 0, 0, &t[0], 4, 2, 4, (uint64_t)r);
        expect_shape(&o, CKPT_DT_I32, 2, SHAPE(4, 2));
        expect_split(&o, 0, 0, &t[1], 4, 2, 8, (uint64_t)r);
        if (r == 0) { /* pieces 0 and 4: rows 0, 1, 8, 9 */
            expect_rows(&e, 0, 2, &t[0], 0);
            expect_rows(&e, 2, 2, &t[0], 8);
        }
        if (r == 2) { /* pieces 2 and 6 of 13 rows padded to 16: rows 4, 5, 12, zero */
            expect_rows(&o, 0, 2, &t[1], 4);
            expect_rows(&o, 2, 1, &t[1], 12);
            expect_rows(&o, 3, 1, NULL, 0);
        }
        view_free(&e);
        view_free(&o);
    }
    json_t *layout = load_layout(fx->dst);
    expect_parameter(layout, "even.weight", 0, 2, 4);
    expect_json(json_object_get(layout_entry(layout, "odd.weight", 1), "padding"),
                "{'axis': 0, 'original': 13, 'padded': 16}", "padding of odd.weight");
    json_decref(layout);
    expect_round_trip(fx, fx->dst);
}

/* fuse with tp: fused_r = [W1 block r; W2 block r], blocks of d/tp rows,
 * each member padded on its own; without tp, [W1; W2]. */
static void test_fuse(void **state)
{
    fixture *fx = *state;
    const src_tensor t[] = {
        {"a.gate_proj.weight", CKPT_DT_I32, 2, {4, 3}, 1, 0},
        {"a.up_proj.weight", CKPT_DT_I32, 2, {8, 3}, 2, 0},
        {"b.gate_proj.weight", CKPT_DT_I32, 2, {5, 3}, 3, 0},
        {"b.up_proj.weight", CKPT_DT_I32, 2, {5, 3}, 4, 0},
    };
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t), NULL);
    convert_with_rules(
        fx, fx->dst,
        "{'tp': 2, 'rules': [{'op': 'fuse', 'pattern': '^(.*)[.](gate_proj|up_proj)[.]weight$', "
        "'members': ['gate_proj', 'up_proj'], 'output': '$1.gate_up_proj.weight', 'tp': 2}]}");
    for (int r = 0; r < 2; r++) {
        view a = load(fx->dst, r, "a.gate_up_proj.weight"),
             b = load(fx->dst, r, "b.gate_up_proj.weight");
        expect_shape(&a, CKPT_DT_I32, 2, SHAPE(6, 3));
        expect_rows(&a, 0, 2, &t[0], 2 * (uint64_t)r);
        expect_rows(&a, 2, 4, &t[1], 4 * (uint64_t)r);
        expect_shape(&b, CKPT_DT_I32, 2, SHAPE(6, 3));
        uint64_t at = expect_split(&b, 0, 0, &t[2], 2, 1, 2, (uint64_t)r);
        expect_split(&b, 0, at, &t[3], 2, 1, 2, (uint64_t)r);
        view_free(&a);
        view_free(&b);
        for (size_t i = 0; i < CKPT_ARRAY_LEN(t); i++)
            expect_absent(fx->dst, r, t[i].name);
    }
    json_t *layout = load_layout(fx->dst);
    expect_json(json_object_get(layout_entry(layout, "a.gate_up_proj.weight", 1), "fused"),
                "{'members': ['a.gate_proj.weight', 'a.up_proj.weight'], 'original_dims': [4, 8], "
                "'padded_dims': [4, 8], 'axis': 0}",
                "fused of a.gate_up_proj.weight");
    expect_json(
        json_object_get(json_object_get(layout_entry(layout, "b.gate_up_proj.weight", 0), "fused"),
                        "padded_dims"),
        "[6, 6]", "padded_dims of b.gate_up_proj.weight");
    expect_parameter(layout, "a.gate_up_proj.weight", 0, 1, 2);
    bool spec_found = false;
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(layout, "model_weight_transformation_specs"), i, s)
    {
        if (strcmp(json_string_value(json_object_get(s, "fused_linear_name")),
                   "a.gate_up_proj.weight"))
            continue;
        expect_json(s,
                    "{'type': 'FusedLinearsSpec', 'fused_linear_name': 'a.gate_up_proj.weight', "
                    "'linear_names': ['a.gate_proj.weight', 'a.up_proj.weight'], "
                    "'original_dims': [4, 8], 'fuse_axis': 0}",
                    "FusedLinearsSpec");
        spec_found = true;
    }
    assert_true(spec_found);
    json_decref(layout);
    expect_round_trip(fx, fx->dst);

    convert_with_rules(
        fx, fx->dst2,
        "{'rules': [{'op': 'fuse', 'pattern': '^(.*)[.](gate_proj|up_proj)[.]weight$', "
        "'members': ['gate_proj', 'up_proj'], 'output': '$1.gate_up_proj.weight'}]}");
    view a = load(fx->dst2, -1, "a.gate_up_proj.weight");
    expect_shape(&a, CKPT_DT_I32, 2, SHAPE(12, 3));
    expect_rows(&a, 0, 4, &t[0], 0);
    expect_rows(&a, 4, 8, &t[1], 0);
    view_free(&a);
    expect_round_trip(fx, fx->dst2);
}

/* ---- experts (docs/transforms.md §2) ---- */

#define NEXPERTS 11
static const char *const expert_names[NEXPERTS] = {
    "moe.experts.0.w.weight", "moe.experts.1.w.weight", "moe.experts.2.w.weight",
    "moe.experts.3.w.weight", "moe.experts.4.w.weight", "moe.experts.5.w.weight",
    "moe.experts.6.w.weight", "moe.experts.7.w.weight", "moe.experts.8.w.weight",
    "moe.experts.9.w.weight", "moe.experts.10.w.weight"};

/* Experts 0..10 of [2, 3], ids 10 + e (so "experts.10" sorts before "experts.2" by name). */
static void make_experts(const char *dir, src_tensor *t)
{
    for (int e = 0; e < NEXPERTS; e++)
        t[e] = (src_tensor){expert_names[e], CKPT_DT_I32, 2, {2, 3}, 10 + e, 0};
    make_checkpoint(dir, t, NEXPERTS, NULL);
}

#define STACK_RULE(extra)                                                                          \
    "{'op': 'stack_experts', 'pattern': '^(.*)[.]experts[.]([0-9]+)[.](w)[.]weight$', "            \
    "'expert_group': 2, 'output': '$1.experts.$3.weight'" extra "}"

#define TRANSPOSE_LAST2 ", 'transpose_last2': true"

#define UNSTACK_RULE(extra)                                                                        \
    "{'op': 'unstack_experts', 'pattern': '^(.*)[.]experts[.]w[.]weight$', "                       \
    "'output': '$1.experts.{e}.w.weight'" extra "}"

static void test_stack_experts_order(void **state)
{
    fixture *fx = *state;
    src_tensor t[NEXPERTS];
    make_experts(fx->src, t);
    convert_with_rules(fx, fx->dst, "{'rules': [" STACK_RULE("") "]}");
    view v = load(fx->dst, -1, "moe.experts.w.weight");
    expect_shape(&v, CKPT_DT_I32, 3, SHAPE(NEXPERTS, 2, 3));
    for (uint64_t e = 0; e < NEXPERTS; e++)
        expect_rows(&v, 2 * e, 2, &t[e], 0);
    view_free(&v);
    json_t *layout = load_layout(fx->dst);
    json_t *members = json_object_get(
        json_object_get(layout_entry(layout, "moe.experts.w.weight", -1), "experts"), "members");
    assert_int_equal(json_array_size(members), NEXPERTS);
    for (size_t e = 0; e < NEXPERTS; e++)
        assert_string_equal(json_string_value(json_array_get(members, e)), expert_names[e]);
    /* The stack's parts are one run: expert e's box at lo[0] = e. */
    json_t *parts = json_object_get(layout_entry(layout, "moe.experts.w.weight", -1), "parts");
    assert_int_equal(json_array_size(parts), 1);
    json_t *run = json_array_get(parts, 0);
    expect_json(json_object_get(run, "srcs"), "['moe.experts.0.w.weight', 'moe.experts.1.w.weight', "
                "'moe.experts.2.w.weight', 'moe.experts.3.w.weight', 'moe.experts.4.w.weight', "
                "'moe.experts.5.w.weight', 'moe.experts.6.w.weight', 'moe.experts.7.w.weight', "
                "'moe.experts.8.w.weight', 'moe.experts.9.w.weight', 'moe.experts.10.w.weight']", "the run's srcs");
    expect_json(json_object_get(run, "lo_step"), "[1, 0, 0]", "the run's lo_step");
    expect_json(json_object_get(run, "lo"), "[0, 0, 0]", "the run's lo");
    expect_json(json_object_get(run, "ext"), "[1, 2, 3]", "the run's ext");
    assert_null(json_object_get(run, "src"));
    json_decref(layout);
    expect_round_trip(fx, fx->dst);
    /* A damaged run is an error naming the tensor and part, never a read
     * outside the tensor or a part dropped silently. */
    static const struct {
        const char *key, *value, *message;
    } damaged[] = {
        {"srcs", "5", "'srcs' must be a non-empty array"},
        {"srcs", "[]", "'srcs' must be a non-empty array"},
        {"src", "'moe.experts.0.w.weight'", "a run has 'srcs' and also 'src'"},
        {"lo_step", "[1, 0]", "'lo_step' must be an array of 3"},
        {"lo_step", "[2, 0, 0]", "part 0.6 lies outside the tensor"},
        {"srcs", "['moe.experts.0.w.weight', 'moe.experts.1.w.weight']", "the shards hold 0 of the 6 elements"},
    };
    assert_int_equal(ckpt_rm_rf(fx->back), 0);
    json_t *good = load_layout(fx->dst);
    for (size_t d = 0; d < CKPT_ARRAY_LEN(damaged); d++) {
        layout = json_deep_copy(good);
        run = json_array_get(json_object_get(layout_entry(layout, "moe.experts.w.weight", -1), "parts"), 0);
        json_object_set_new(run, damaged[d].key, parse_json_text(damaged[d].value));
        char *path = ckpt_path_join(fx->dst, CONVERT_LAYOUT_FILE);
        assert_int_equal(cj_write_file(path, layout), 0);
        free(path);
        json_decref(layout);
        consolidate_opts co = {.quiet = true};
        assert_int_not_equal(consolidate_run(fx->dst, fx->back, &co), 0);
        assert_contains(ckpt_error_last(), damaged[d].message);
        expect_no_dst(fx->back);
    }
    /* A step that wraps around is refused where the part is read. */
    json_t *wrap = json_deep_copy(json_array_get(json_object_get(layout_entry(good, "moe.experts.w.weight", -1), "parts"), 0));
    json_object_set_new(wrap, "lo_step", parse_json_text("[9223372036854775807, 0, 0]"));
    plan_part p;
    assert_int_equal(plan_part_from_json_at(&p, wrap, 1, 3, 2, "wrap"), 0);
    assert_int_equal(p.lo[0], 9223372036854775807ull);
    assert_int_not_equal(plan_part_from_json_at(&p, wrap, 3, 3, 2, "wrap"), 0);
    assert_contains(ckpt_error_last(), "wrap: run part 3 overflows on axis 0");
    assert_int_not_equal(plan_part_from_json_at(&p, wrap, 11, 3, 2, "wrap"), 0);
    assert_contains(ckpt_error_last(), "no part 11");
    json_decref(wrap);
    json_decref(good);

    /* transpose_last2: [E, in, out], expert e's [out, in] transposed. */
    convert_with_rules(fx, fx->dst2, "{'rules': [" STACK_RULE(TRANSPOSE_LAST2) "]}");
    v = load(fx->dst2, -1, "moe.experts.w.weight");
    expect_shape(&v, CKPT_DT_I32, 3, SHAPE(NEXPERTS, 3, 2));
    for (uint64_t e = 0; e < NEXPERTS; e++)
        expect_block(&v, 3 * e, 0, 3, 2, &t[e], 0, 0, true);
    view_free(&v);
    expect_round_trip(fx, fx->dst2);
}

static void test_unstack_experts(void **state)
{
    fixture *fx = *state;
    /* A stacked [E, out, in] source becomes per-expert tensors. */
    const src_tensor stacked = {"s.experts.w.weight", CKPT_DT_I32, 3, {3, 2, 4}, 1, 0};
    make_checkpoint(fx->src, &stacked, 1, NULL);
    convert_with_rules(fx, fx->dst, "{'rules': [" UNSTACK_RULE("") "]}");
    convert_with_rules(fx, fx->dst2, "{'rules': [" UNSTACK_RULE(TRANSPOSE_LAST2) "]}");
    for (uint64_t e = 0; e < 3; e++) {
        char name[64];
        snprintf(name, sizeof name, "s.experts.%llu.w.weight", (unsigned long long)e);
        view v = load(fx->dst, -1, name), vt = load(fx->dst2, -1, name);
        expect_shape(&v, CKPT_DT_I32, 2, SHAPE(2, 4));
        expect_rows(&v, 0, 2, &stacked, 2 * e);
        expect_shape(&vt, CKPT_DT_I32, 2, SHAPE(4, 2));
        expect_block(&vt, 0, 0, 4, 2, &stacked, 2 * e, 0, true);
        view_free(&v);
        view_free(&vt);
    }
    expect_absent(fx->dst, -1, stacked.name);
    expect_round_trip(fx, fx->dst);
    expect_round_trip(fx, fx->dst2);

    /* Stacking then unstacking, with and without transposes, gives back the source file. */
    fx_clear_outputs(fx);
    assert_int_equal(ckpt_rm_rf(fx->src), 0);
    src_tensor t[NEXPERTS];
    make_experts(fx->src, t);
    const char *docs[] = {
        "{'rules': [" STACK_RULE("") ", " UNSTACK_RULE("") "]}",
        "{'rules': [" STACK_RULE(TRANSPOSE_LAST2) ", " UNSTACK_RULE(TRANSPOSE_LAST2) "]}",
    };
    char *src_file = ckpt_path_join(fx->src, "model.safetensors"),
         *dst_file = ckpt_path_join(fx->dst, "model.safetensors");
    assert_true(src_file && dst_file);
    for (size_t d = 0; d < CKPT_ARRAY_LEN(docs); d++) {
        assert_int_equal(ckpt_rm_rf(fx->dst), 0);
        convert_with_rules(fx, fx->dst, docs[d]);
        expect_files_equal(src_file, dst_file);
    }
    free(src_file);
    free(dst_file);
}

/* ---- rename, drop, transpose, cast (docs/transforms.md §1, §6) ---- */

static void test_rename_drop_transpose(void **state)
{
    fixture *fx = *state;
    const src_tensor t[] = {
        {"model.layers.0.attn.w.weight", CKPT_DT_I32, 2, {2, 3}, 1, 0},
        {"model.layers.12.attn.w.weight", CKPT_DT_I32, 2, {2, 3}, 2, 0},
        {"model.rotary.inv_freq", CKPT_DT_I32, 1, {4}, 3, 0},
        {"head.weight", CKPT_DT_I32, 2, {3, 5}, 4, 0},
    };
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t), NULL);
    convert_with_rules(
        fx, fx->dst,
        "{'rules': [{'op': 'rename', 'pattern': '^model[.]layers[.]([0-9]+)[.]attn[.](.*)$', "
        "'replacement': 'blocks.$1.$2'}, {'op': 'drop', 'pattern': '^model[.]rotary[.]'}, "
        "{'op': 'transpose', 'pattern': '^head[.]weight$', 'replacement': 'head.kernel'}]}");
    view b0 = load(fx->dst, -1, "blocks.0.w.weight"), b12 = load(fx->dst, -1, "blocks.12.w.weight");
    expect_shape(&b0, CKPT_DT_I32, 2, t[0].shape);
    expect_rows(&b0, 0, 2, &t[0], 0);
    expect_shape(&b12, CKPT_DT_I32, 2, t[1].shape);
    expect_rows(&b12, 0, 2, &t[1], 0);
    view k = load(fx->dst, -1, "head.kernel");
    expect_shape(&k, CKPT_DT_I32, 2, SHAPE(5, 3));
    expect_block(&k, 0, 0, 5, 3, &t[3], 0, 0, true);
    view_free(&b0);
    view_free(&b12);
    view_free(&k);
    for (size_t i = 0; i < CKPT_ARRAY_LEN(t); i++)
        expect_absent(fx->dst, -1, t[i].name);
    json_t *layout = load_layout(fx->dst);
    expect_json(
        json_object_get(
            json_array_get(
                json_object_get(layout_entry(layout, "blocks.12.w.weight", -1), "transforms"), 0),
            "from"),
        "'model.layers.12.attn.w.weight'", "the rename's 'from'");
    json_decref(layout);
    /* A dropped tensor cannot come back: consolidation says which. */
    consolidate_opts co = {.quiet = true};
    assert_int_not_equal(consolidate_run(fx->dst, fx->back, &co), 0);
    assert_contains(ckpt_error_last(), "model.rotary.inv_freq");
    expect_no_dst(fx->back);

    convert_with_rules(
        fx, fx->dst2,
        "{'rules': [{'op': 'rename', 'pattern': '^model[.]layers[.]([0-9]+)[.]attn[.](.*)$', "
        "'replacement': 'blocks.$1.$2'}, {'op': 'transpose', 'pattern': '^head[.]weight$'}]}");
    expect_round_trip(fx, fx->dst2);
}

/* Transposes larger than the executor's tile budget (8 MiB: 2M i32 elements),
 * with edges that are no multiple of its 32-element blocks: a tall source
 * (output rows of 3001, tiles of 698 whole rows) and a wide one (output rows
 * of 9000 elements, tiles 256 x 8192), every element checked. */
static void test_transpose_tiles(void **state)
{
    fixture *fx = *state;
    const src_tensor t[] = {
        {"tall.weight", CKPT_DT_I32, 2, {3001, 1003}, 1, 1003},
        {"wide.weight", CKPT_DT_I32, 2, {9000, 300}, 2, 300},
    };
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t), NULL);
    convert_with_rules(fx, fx->dst, "{'rules': [{'op': 'transpose', 'pattern': '[.]weight$'}]}");
    view a = load(fx->dst, -1, "tall.weight"), b = load(fx->dst, -1, "wide.weight");
    expect_shape(&a, CKPT_DT_I32, 2, SHAPE(1003, 3001));
    expect_block(&a, 0, 0, 1003, 3001, &t[0], 0, 0, true);
    expect_shape(&b, CKPT_DT_I32, 2, SHAPE(300, 9000));
    expect_block(&b, 0, 0, 300, 9000, &t[1], 0, 0, true);
    view_free(&a);
    view_free(&b);
    expect_round_trip(fx, fx->dst);
}

/* The same with two-byte elements (bf16, f16: most models), which the
 * executor moves in 8 x 8 register tiles: edges that are no multiple of 8
 * on either axis, a tensor smaller than one tile, a wide one split into
 * bands, extents that are 16 x k + 8 (AVX2's 16 x 16 tiles, then 8 x 8
 * ones: a MoE expert's rank slice of 24); every element checked. */
static void test_transpose_tiles_2byte(void **state)
{
    fixture *fx = *state;
    const src_tensor t[] = {
        {"tall.weight", CKPT_DT_I16, 2, {3001, 1003}, 1, 1003},
        {"wide.weight", CKPT_DT_I16, 2, {9000, 301}, 2, 301},
        {"tiny.weight", CKPT_DT_I16, 2, {5, 3}, 3, 3},
        {"eight.weight", CKPT_DT_I16, 2, {16, 8}, 4, 8},
        {"sixteen.weight", CKPT_DT_I16, 2, {48, 272}, 5, 272},
        {"expert.weight", CKPT_DT_I16, 2, {520, 24}, 6, 24}, /* 16 + 8 on one axis, 512 + 8 on the other */
        {"expert_t.weight", CKPT_DT_I16, 2, {40, 152}, 7, 152},
    };
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t), NULL);
    /* 16 x 16 tiles where the CPU has AVX2, then 8 x 8 (SSE2) tiles */
    for (int sse2 = 0; sse2 < 2; sse2++) {
        if (sse2) setenv("CKPT_EXEC_NO_AVX2", "1", 1);
        ckpt_rm_rf(fx->dst);
        convert_with_rules(fx, fx->dst, "{'rules': [{'op': 'transpose', 'pattern': '[.]weight$'}]}");
        for (size_t i = 0; i < CKPT_ARRAY_LEN(t); i++) {
            view v = load(fx->dst, -1, t[i].name);
            expect_shape(&v, CKPT_DT_I16, 2, SHAPE(t[i].shape[1], t[i].shape[0]));
            expect_block(&v, 0, 0, t[i].shape[1], t[i].shape[0], &t[i], 0, 0, true);
            view_free(&v);
        }
        expect_round_trip(fx, fx->dst);
    }
    unsetenv("CKPT_EXEC_NO_AVX2");
}

/* exec_opts.direct (convert_opts.direct): the whole blocks of long runs
 * through O_DIRECT, the partial blocks at their ends through the page cache,
 * give the bytes the page cache alone gives. The tensors lie at offsets in no
 * block boundary (a small one first, odd sizes); transposed tiles of two-
 * and four-byte elements (a slab placed at its offset's place in a block)
 * and a tensor copied whole (copy_file_range, never direct) are written side
 * by side by two workers. */
static void test_direct_writes(void **state)
{
    fixture *fx = *state;
    const src_tensor t[] = {
        {"a.weight", CKPT_DT_I16, 2, {3, 5}, 1, 5},
        {"big.weight", CKPT_DT_I16, 2, {701, 403}, 2, 403},
        {"mid.weight", CKPT_DT_I16, 2, {409, 397}, 3, 397},
        {"f.weight", CKPT_DT_F32, 2, {300, 251}, 4, 251},
        {"plain.bias", CKPT_DT_I16, 1, {150001}, 5, 0},
        {"two_slabs.weight", CKPT_DT_I16, 2, {1501, 3001}, 6, 3001}, /* 9 MB: slabs queued for the writers */
    };
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t), NULL);
    write_json_text(fx->rules, "{'rules': [{'op': 'transpose', 'pattern': '[.]weight$'}]}");
    convert_ok(fx->src, fx->dst, (convert_opts){.rules_file = fx->rules, .direct = true});
    convert_ok(fx->src, fx->dst2, (convert_opts){.rules_file = fx->rules});
    expect_trees_equal(fx->dst, fx->dst2);
    view v = load(fx->dst, -1, "big.weight");
    expect_shape(&v, CKPT_DT_I16, 2, SHAPE(403, 701));
    expect_block(&v, 0, 0, 403, 701, &t[1], 0, 0, true);
    view_free(&v);
    v = load(fx->dst, -1, "two_slabs.weight");
    expect_shape(&v, CKPT_DT_I16, 2, SHAPE(3001, 1501));
    expect_block(&v, 0, 0, 3001, 1501, &t[5], 0, 0, true);
    view_free(&v);
}

/* The CRC-32 of every tensor given by the file's bytes (read back here). */
static void expect_crcs(const exec_plan *p, const char *dir, uint32_t **crc)
{
    for (size_t f = 0; f < p->nfiles; f++) {
        char path[1300];
        snprintf(path, sizeof path, "%s/%s", dir, p->files[f].rel);
        int fd = open(path, O_RDONLY);
        assert_true(fd >= 0);
        for (size_t i = 0; i < p->files[f].layout.ntensors; i++) {
            const st_out_tensor *ot = &p->files[f].layout.tensors[i];
            uint8_t *b = malloc(ot->nbytes + 1);
            assert_non_null(b);
            assert_int_equal(ckpt_pread_full(fd, b, ot->nbytes, ot->offset, path), 0);
            uint32_t want = (uint32_t)crc32(crc32(0L, Z_NULL, 0), b, (uInt)ot->nbytes);
            if (crc[f][i] != want) fail_msg("%s: tensor %zu: CRC %08x, its bytes give %08x", path, i, crc[f][i], want);
            free(b);
        }
        close(fd);
    }
}

/* exec_opts.out_crc32: each tensor's CRC-32 taken from the pieces as they are
 * written equals the CRC of its bytes in the file, for every way the executor
 * writes: a copy with zero padding left as a hole (a vocabulary split with
 * padding), slabs with zeros (a column split), transposed tiles written row
 * by row (the second tile's rows close the gaps the first left), a tensor
 * copied whole, a scalar; through the page cache and with O_DIRECT, by two
 * workers, in file order and largest first. */
static void test_executor_crc(void **state)
{
    fixture *fx = *state;
    const src_tensor t[] = {
        {"embed.weight", CKPT_DT_I32, 2, {9, 3}, 1, 0}, /* 9 rows on 2 ranks: one zero row on rank 1 */
        {"row.weight", CKPT_DT_I32, 2, {3, 9}, 2, 0},
        {"wide.weight", CKPT_DT_I32, 2, {9000, 40}, 3, 40}, /* output rows of 9000: tiles of 40 x 8192 rows, then 40 x 808 */
        {"plain.bias", CKPT_DT_I16, 1, {150001}, 4, 0},
        {"scalar", CKPT_DT_I32, 0, {0}, 5, 0},
    };
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t), NULL);
    write_json_text(fx->rules, "{'tp': 2, 'rules': [{'op': 'tp_split', 'pattern': '^embed[.]weight$', 'axis': 0},"
                               "{'op': 'tp_split', 'pattern': '^row[.]weight$', 'axis': 1},"
                               "{'op': 'transpose', 'pattern': '^wide[.]weight$'}]}");
    convert_opts co = {.rules_file = fx->rules, .quiet = true};
    convert_plan cp;
    assert_int_equal(convert_plan_build(&cp, fx->src, &co), 0);
    uint32_t **crc = calloc(cp.exec.nfiles, sizeof *crc);
    assert_non_null(crc);
    for (size_t f = 0; f < cp.exec.nfiles; f++) assert_non_null(crc[f] = calloc(cp.exec.files[f].layout.ntensors + 1, sizeof **crc));
    for (int direct = 0; direct < 2; direct++) {
        ckpt_rm_rf(fx->dst);
        assert_int_equal(ckpt_mkdir_p(fx->dst, 0755), 0);
        exec_opts eo = {.threads = 2, .quiet = true, .no_fsync = true, .direct = direct, .out_crc32 = crc,
                        .largest_first = direct}; /* (the two ranks' files' tensors then interleaved) */
        assert_int_equal(exec_run(&cp.exec, fx->dst, &eo), 0);
        expect_crcs(&cp.exec, fx->dst, crc);
    }
    for (size_t f = 0; f < cp.exec.nfiles; f++) free(crc[f]);
    free(crc);
    convert_plan_free(&cp);
}

/* The source runs read ahead for each output tensor (exec_prefetch_runs):
 * a row slice is its rows' bytes exactly; a column slice of narrow rows
 * spans the whole source (every page holds elements it needs); a quarter
 * of each of rows four pages long is left to the gather (no run); the
 * tensors of a fused q/k/v, adjacent in their file, make one run. */
typedef struct {
    size_t n;
    size_t file[4];
    uint64_t lo[4], hi[4];
} runs_seen;

static void note_run(void *ctx, size_t file, uint64_t lo, uint64_t hi)
{
    runs_seen *r = ctx;
    assert_true(r->n < 4);
    r->file[r->n] = file, r->lo[r->n] = lo, r->hi[r->n] = hi;
    r->n++;
}

static const plan_source *source_named(const exec_plan *p, const char *name)
{
    for (size_t i = 0; i < p->nsources; i++)
        if (!strcmp(p->sources[i].name, name)) return &p->sources[i];
    fail_msg("no source '%s'", name);
    return NULL;
}

static runs_seen prefetch_of(const exec_plan *p, int rank, const char *name)
{
    runs_seen r = {0};
    for (size_t f = 0; f < p->nfiles; f++)
        for (size_t i = 0; i < p->files[f].layout.ntensors; i++) {
            const plan_tensor *t = p->files[f].tensors[p->files[f].layout.tensors[i].user];
            if (t->rank != rank || strcmp(t->name, name)) continue;
            uint64_t total = exec_prefetch_runs(p, t, note_run, &r);
            uint64_t sum = 0;
            for (size_t k = 0; k < r.n; k++) sum += r.hi[k] - r.lo[k];
            assert_true(total == sum);
            return r;
        }
    fail_msg("no tensor '%s' of rank %d", name, rank);
    return r;
}

static void test_executor_prefetch_runs(void **state)
{
    fixture *fx = *state;
    const src_tensor t[] = {
        {"a.k", CKPT_DT_I32, 2, {16, 64}, 1, 0},
        {"a.q", CKPT_DT_I32, 2, {32, 64}, 2, 0},
        {"a.v", CKPT_DT_I32, 2, {16, 64}, 3, 0},
        {"narrow.weight", CKPT_DT_I32, 2, {64, 64}, 4, 0}, /* rows of 256 bytes */
        {"rows.weight", CKPT_DT_I32, 2, {64, 64}, 5, 0},
        {"wide.weight", CKPT_DT_I32, 2, {16, 4096}, 6, 0}, /* rows of 16 KiB */
    };
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t), NULL);
    write_json_text(fx->rules, "{'tp': 4, 'rules': [{'op': 'fuse', 'pattern': '^(a)[.](q|k|v)$', "
                               "'members': ['q', 'k', 'v'], 'output': '$1.qkv'},"
                               "{'op': 'tp_split', 'pattern': '^(narrow|wide)[.]weight$', 'axis': 1},"
                               "{'op': 'tp_split', 'pattern': '^rows[.]weight$', 'axis': 0}]}");
    convert_opts co = {.rules_file = fx->rules, .quiet = true};
    convert_plan cp;
    assert_int_equal(convert_plan_build(&cp, fx->src, &co), 0);
    const exec_plan *p = &cp.exec;
    const plan_source *rows = source_named(p, "rows.weight"), *narrow = source_named(p, "narrow.weight");
    runs_seen r = prefetch_of(p, 1, "rows.weight");
    assert_int_equal(r.n, 1);
    assert_true(r.file[0] == rows->file && r.lo[0] == rows->offset + 16 * 256 && r.hi[0] == rows->offset + 32 * 256);
    r = prefetch_of(p, 0, "narrow.weight"); /* its first 16 columns: up to a quarter of the last row */
    assert_int_equal(r.n, 1);
    assert_true(r.lo[0] == narrow->offset && r.hi[0] == narrow->offset + 63 * 256 + 64);
    r = prefetch_of(p, 1, "wide.weight");
    assert_int_equal(r.n, 0);
    r = prefetch_of(p, -1, "a.qkv"); /* replicated: one tensor, whatever the rank */
    const plan_source *k = source_named(p, "a.k"), *v = source_named(p, "a.v");
    assert_int_equal(r.n, 1);
    assert_true(r.lo[0] == k->offset && r.hi[0] == v->offset + v->nbytes);
    /* and the output is the same with and without reading ahead */
    for (int no = 0; no < 2; no++) {
        ckpt_rm_rf(fx->dst);
        assert_int_equal(ckpt_mkdir_p(fx->dst, 0755), 0);
        exec_opts eo = {.threads = 2, .quiet = true, .no_fsync = true, .no_prefetch = no};
        assert_int_equal(exec_run(p, fx->dst, &eo), 0);
        view w = load(fx->dst, 1, "wide.weight");
        expect_shape(&w, CKPT_DT_I32, 2, SHAPE(16, 1024));
        view n = load(fx->dst, 0, "narrow.weight");
        expect_shape(&n, CKPT_DT_I32, 2, SHAPE(64, 16));
        for (uint64_t row = 0; row < 64; row++)
            for (uint64_t col = 0; col < 16; col++) {
                int32_t got;
                memcpy(&got, n.raw + (row * 16 + col) * 4, 4);
                assert_true(got == (int32_t)src_value(&t[3], row, col));
            }
        view_free(&w);
        view_free(&n);
    }
    convert_plan_free(&cp);
}

/* Whole tensors copied from a source file no byte of which is read twice
 * go through O_DIRECT (the source's pages are not in the page cache
 * afterwards, where the file system takes O_DIRECT); with buffered_reads, or
 * from a file read by two ranks, through the page cache. The output is the
 * same every way. */
static bool source_cached(const char *path, uint64_t off, uint64_t len)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    long page = sysconf(_SC_PAGESIZE);
    uint64_t lo = off / (uint64_t)page * (uint64_t)page, n = off + len - lo;
    void *m = mmap(NULL, (size_t)n, PROT_READ, MAP_SHARED, fd, (off_t)lo);
    assert_true(m != MAP_FAILED);
    size_t np = (size_t)((n + (uint64_t)page - 1) / (uint64_t)page);
    unsigned char *vec = malloc(np);
    assert_non_null(vec);
    assert_int_equal(mincore(m, (size_t)n, vec), 0);
    size_t resident = 0;
    for (size_t i = 0; i < np; i++) resident += vec[i] & 1;
    free(vec);
    munmap(m, (size_t)n);
    close(fd);
    return resident > np / 2;
}

static void evict(const char *path)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
}

static void test_executor_direct_reads(void **state)
{
    fixture *fx = *state;
    const src_tensor t[] = {
        {"big.weight", CKPT_DT_I32, 2, {64, 1024}, 1, 0}, /* 256 KiB */
        {"small.bias", CKPT_DT_I32, 1, {100}, 2, 0},
    };
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t), NULL);
    char *src_file = ckpt_path_join(fx->src, "model.safetensors");
    assert_non_null(src_file);
    int sfd = open(src_file, O_RDONLY), dfd = sfd >= 0 ? ckpt_open_direct(src_file, sfd) : -1;
    bool direct_here = dfd >= 0;
    if (dfd >= 0) close(dfd);
    if (sfd >= 0) close(sfd);
    for (int tp = 1; tp <= 2; tp++) {
        write_json_text(fx->rules, tp == 1 ? "{'rules': []}" : "{'tp': 2, 'rules': []}"); /* tp 2: replicated, read twice */
        convert_opts co = {.rules_file = fx->rules, .quiet = true};
        convert_plan cp;
        assert_int_equal(convert_plan_build(&cp, fx->src, &co), 0);
        const plan_source *big = source_named(&cp.exec, "big.weight");
        for (int buffered = 0; buffered < 2; buffered++) {
            evict(src_file);
            ckpt_rm_rf(fx->dst);
            assert_int_equal(ckpt_mkdir_p(fx->dst, 0755), 0);
            exec_opts eo = {.threads = 2, .quiet = true, .no_fsync = true, .buffered_reads = buffered};
            assert_int_equal(exec_run(&cp.exec, fx->dst, &eo), 0);
            bool cached = source_cached(src_file, big->offset, big->nbytes);
            if (direct_here && tp == 1 && !buffered) assert_false(cached);
            else assert_true(cached);
            for (int r = tp == 1 ? -1 : 0; r < (tp == 1 ? 0 : tp); r++) {
                view b = load(fx->dst, r, "big.weight"), sb = load(fx->dst, r, "small.bias");
                expect_whole(&b, &t[0]);
                expect_whole(&sb, &t[1]);
                view_free(&b);
                view_free(&sb);
            }
        }
        convert_plan_free(&cp);
    }
    if (!direct_here) print_message("(no O_DIRECT in %s: the page cache path only)\n", fx->src);
    free(src_file);
}

/* cast f32 -> bf16 rounds to nearest even (ckpt_f32_to_bf16), leaves integer
 * tensors alone, and marks the layout lossy. */
static void test_cast_bf16(void **state)
{
    fixture *fx = *state;
    const src_tensor t[] = {
        {"w", CKPT_DT_F32, 2, {2, 300}, 0, 0}, /* 0..299, 1000..1299: most need rounding */
        {"steps", CKPT_DT_I32, 1, {2}, 1, 0},
    };
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t), NULL);
    convert_with_rules(fx, fx->dst, "{'rules': [{'op': 'cast', 'dtype': 'bf16'}]}");
    view w = load(fx->dst, -1, "w");
    expect_shape(&w, CKPT_DT_BF16, 2, SHAPE(2, 300));
    for (uint64_t r = 0; r < 2; r++) {
        for (uint64_t c = 0; c < 300; c++) {
            uint16_t got, want = ckpt_f32_to_bf16((float)src_value(&t[0], r, c));
            memcpy(&got, w.raw + (r * 300 + c) * 2, 2);
            if (got != want)
                fail_msg("w[%llu][%llu] is bf16 0x%04x, expected 0x%04x", (unsigned long long)r,
                         (unsigned long long)c, got, want);
        }
    }
    /* ties go to even: 257 -> 256, 259 -> 260 */
    assert_true(load_value(CKPT_DT_BF16, w.raw + 257 * 2) == 256.0);
    assert_true(load_value(CKPT_DT_BF16, w.raw + 259 * 2) == 260.0);
    view s = load(fx->dst, -1, "steps");
    expect_whole(&s, &t[1]);
    json_t *layout = load_layout(fx->dst);
    assert_true(json_is_true(json_object_get(layout, "lossy")));
    json_decref(layout);
    /* Consolidation restores F32 from the rounded values and says it is lossy. */
    assert_true(consolidate_ok(fx->dst, fx->back));
    view back = load(fx->back, -1, "w");
    expect_shape(&back, CKPT_DT_F32, 2, SHAPE(2, 300));
    for (size_t i = 0; i < 600; i++)
        assert_true(load_value(CKPT_DT_F32, back.raw + i * 4) ==
                    load_value(CKPT_DT_BF16, w.raw + i * 2));
    view_free(&w);
    view_free(&s);
    view_free(&back);
}

/* ---- the neuron preset ---- */

enum { MGATE = 4, MUP, MDOWN, MEMBED, MHEAD, MNORM1, MNORM2, MNORM, MINI_N };

/* A one-layer Llama: H 4, KV 2, head_dim 2, hidden 8, intermediate 6, vocab
 * 10 (ids: attention 1-4 as attn_model, then 5..12), F32. */
static void make_mini_llama(const char *dir, attn_model *m, src_tensor *t)
{
    attn_model_init(m, 4, 2, 2, 8, false);
    memcpy(t, m->t, 4 * sizeof *t);
    t[MGATE] = (src_tensor){"model.layers.0.mlp.gate_proj.weight", CKPT_DT_F32, 2, {6, 8}, 5, 0};
    t[MUP] = (src_tensor){"model.layers.0.mlp.up_proj.weight", CKPT_DT_F32, 2, {6, 8}, 6, 0};
    t[MDOWN] = (src_tensor){"model.layers.0.mlp.down_proj.weight", CKPT_DT_F32, 2, {8, 6}, 7, 0};
    t[MEMBED] = (src_tensor){"model.embed_tokens.weight", CKPT_DT_F32, 2, {10, 8}, 8, 0};
    t[MHEAD] = (src_tensor){"lm_head.weight", CKPT_DT_F32, 2, {10, 8}, 9, 0};
    t[MNORM1] = (src_tensor){"model.layers.0.input_layernorm.weight", CKPT_DT_F32, 1, {8}, 10, 0};
    t[MNORM2] =
        (src_tensor){"model.layers.0.post_attention_layernorm.weight", CKPT_DT_F32, 1, {8}, 11, 0};
    t[MNORM] = (src_tensor){"model.norm.weight", CKPT_DT_F32, 1, {8}, 12, 0};
    make_checkpoint(dir, t, MINI_N,
                    "{'model_type': 'llama', 'num_attention_heads': 4, 'num_key_value_heads': 2, "
                    "'head_dim': 2, 'hidden_size': 8, 'intermediate_size': 6, 'vocab_size': 10, "
                    "'num_hidden_layers': 1}");
}

static void test_neuron_dense(void **state)
{
    fixture *fx = *state;
    attn_model m;
    src_tensor t[MINI_N];
    make_mini_llama(fx->src, &m, t);
    convert_ok(fx->src, fx->dst, preset("neuron", 4));
    /* m = 2, G = 2, kpr = 1, gpr = 1 */
    static const int q[4][1] = {{0}, {2}, {1}, {3}}, kv[4][1] = {{0}, {1}, {0}, {1}};
    expect_gqa_ranks(&m, fx->dst, 4, &q[0][0], 1, &kv[0][0], 1);
    for (uint64_t r = 0; r < 4; r++) {
        int rank = (int)r;
        /* intermediate 6 padded to 8: blocks of 2, rank 3's zero */
        view gu = load(fx->dst, rank, "model.layers.0.mlp.gate_up_proj.weight");
        expect_shape(&gu, CKPT_DT_F32, 2, SHAPE(4, 8));
        uint64_t at = expect_split(&gu, 0, 0, &t[MGATE], 4, 1, 4, r);
        expect_split(&gu, 0, at, &t[MUP], 4, 1, 4, r);
        view down = load(fx->dst, rank, t[MDOWN].name);
        expect_shape(&down, CKPT_DT_F32, 2, SHAPE(8, 2));
        expect_split(&down, 1, 0, &t[MDOWN], 4, 1, 4, r);
        view_free(&gu);
        view_free(&down);
        for (int i = MEMBED; i <= MHEAD; i++) { /* vocabulary 10 padded to 12 */
            view v = load(fx->dst, rank, t[i].name);
            expect_shape(&v, CKPT_DT_F32, 2, SHAPE(3, 8));
            expect_split(&v, 0, 0, &t[i], 4, 1, 4, r);
            view_free(&v);
        }
        for (int i = MNORM1; i <= MNORM; i++) { /* replicated */
            view v = load(fx->dst, rank, t[i].name);
            expect_whole(&v, &t[i]);
            view_free(&v);
        }
        expect_absent(fx->dst, rank, t[MGATE].name);
        expect_absent(fx->dst, rank, t[MUP].name);
    }
    expect_round_trip(fx, fx->dst);

    /* tp 1: one qkv of every head, gate_up = [gate; up], the rest unchanged. */
    convert_ok(fx->src, fx->dst2, preset("neuron", 1));
    static const int q1[] = {0, 1, 2, 3}, kv1[] = {0, 1};
    expect_gqa_ranks(&m, fx->dst2, 1, q1, 4, kv1, 2);
    view gu = load(fx->dst2, -1, "model.layers.0.mlp.gate_up_proj.weight");
    expect_shape(&gu, CKPT_DT_F32, 2, SHAPE(12, 8));
    expect_rows(&gu, 0, 6, &t[MGATE], 0);
    expect_rows(&gu, 6, 6, &t[MUP], 0);
    view_free(&gu);
    for (int i = MDOWN; i < MINI_N; i++) {
        view v = load(fx->dst2, -1, t[i].name);
        expect_whole(&v, &t[i]);
        view_free(&v);
    }
    expect_round_trip(fx, fx->dst2);
}

/* Mixtral experts under neuron tp 2: gate_up [E, hidden, 2*I/tp] with
 * [e, :, :I/tp] = (w1_e block r)^T and [e, :, I/tp:] = (w3_e block r)^T;
 * down [E, I/tp, hidden] = (w2_e column block r)^T; I = 3 pads to 4. */
static void test_neuron_experts(void **state)
{
    fixture *fx = *state;
    enum { E = 3, I = 3, HIDDEN = 4, TP = 2, B = 2 /* padded I / TP */ };
    static const char *const names[3][E] = {
        {"model.layers.0.block_sparse_moe.experts.0.w1.weight",
         "model.layers.0.block_sparse_moe.experts.1.w1.weight",
         "model.layers.0.block_sparse_moe.experts.2.w1.weight"},
        {"model.layers.0.block_sparse_moe.experts.0.w3.weight",
         "model.layers.0.block_sparse_moe.experts.1.w3.weight",
         "model.layers.0.block_sparse_moe.experts.2.w3.weight"},
        {"model.layers.0.block_sparse_moe.experts.0.w2.weight",
         "model.layers.0.block_sparse_moe.experts.1.w2.weight",
         "model.layers.0.block_sparse_moe.experts.2.w2.weight"},
    };
    src_tensor t[3 * E + 1];
    for (int e = 0; e < E; e++) {
        t[e] = (src_tensor){names[0][e], CKPT_DT_I32, 2, {I, HIDDEN}, 1 + e, 0};     /* gate (w1) */
        t[E + e] = (src_tensor){names[1][e], CKPT_DT_I32, 2, {I, HIDDEN}, 4 + e, 0}; /* up (w3) */
        t[2 * E + e] =
            (src_tensor){names[2][e], CKPT_DT_I32, 2, {HIDDEN, I}, 7 + e, 0}; /* down (w2) */
    }
    const src_tensor *router = &t[3 * E];
    t[3 * E] = (src_tensor){
        "model.layers.0.block_sparse_moe.gate.weight", CKPT_DT_I32, 2, {E, HIDDEN}, 10, 0};
    make_checkpoint(
        fx->src, t, CKPT_ARRAY_LEN(t),
        "{'model_type': 'mixtral', 'num_attention_heads': 2, 'num_key_value_heads': 2, "
        "'head_dim': 2, 'hidden_size': 4, 'intermediate_size': 3, 'num_local_experts': 3, "
        "'vocab_size': 8}");
    convert_ok(fx->src, fx->dst, preset("neuron", TP));
    for (uint64_t r = 0; r < TP; r++) {
        int rank = (int)r;
        view gu =
            load(fx->dst, rank, "model.layers.0.block_sparse_moe.experts.gate_up_proj.weight");
        view dn = load(fx->dst, rank, "model.layers.0.block_sparse_moe.experts.down_proj.weight");
        expect_shape(&gu, CKPT_DT_I32, 3, SHAPE(E, HIDDEN, 2 * B));
        expect_shape(&dn, CKPT_DT_I32, 3, SHAPE(E, B, HIDDEN));
        for (uint64_t e = 0; e < E; e++) {
            for (uint64_t j = 0; j < B; j++) {
                uint64_t row = r * B + j; /* of the expert's I axis */
                bool real = row < I;
                expect_block(&gu, e * HIDDEN, j, HIDDEN, 1, real ? &t[e] : NULL, row, 0, true);
                expect_block(&gu, e * HIDDEN, B + j, HIDDEN, 1, real ? &t[E + e] : NULL, row, 0,
                             true);
                expect_block(&dn, e * B + j, 0, 1, HIDDEN, real ? &t[2 * E + e] : NULL, 0, row,
                             true);
            }
        }
        view_free(&gu);
        view_free(&dn);
        view rt = load(fx->dst, rank, router->name);
        expect_whole(&rt, router);
        view_free(&rt);
        for (int i = 0; i < 3 * E; i++)
            expect_absent(fx->dst, rank, t[i].name);
    }
    expect_round_trip(fx, fx->dst);
}


/* ---- the vllm preset ---- */

/* vLLM rank r (QKVParallelLinear, RowParallelLinear o_proj): qkv_proj.weight
 * = [q heads r*H/tp ..; KV heads; the same V heads], o_proj the q heads'
 * columns, the biases like the weight; the inputs are gone. */
static void expect_vllm_attn(const attn_model *m, const char *dst, int tp, int rank, const int *kv, size_t nkv)
{
    uint64_t hd = (uint64_t)m->hd, h = (uint64_t)m->hidden;
    size_t nq = (size_t)(m->heads / tp);
    int q[64];
    assert_true(nq <= 64);
    for (size_t i = 0; i < nq; i++) q[i] = rank * (int)nq + (int)i;
    int vr = VLLM_RANK(rank);
    view qkv = load(dst, vr, ATTN "qkv_proj.weight");
    expect_shape(&qkv, CKPT_DT_F32, 2, SHAPE((nq + 2 * nkv) * hd, h));
    expect_heads(&qkv, 0, 0, q, nq, hd, &m->t[Q]);
    expect_heads(&qkv, 0, nq * hd, kv, nkv, hd, &m->t[K]);
    expect_heads(&qkv, 0, (nq + nkv) * hd, kv, nkv, hd, &m->t[V]);
    view_free(&qkv);
    view o = load(dst, vr, ATTN "o_proj.weight");
    expect_shape(&o, CKPT_DT_F32, 2, SHAPE(h, nq * hd));
    expect_heads(&o, 1, 0, q, nq, hd, &m->t[O]);
    view_free(&o);
    if (m->bias) {
        view b = load(dst, vr, ATTN "qkv_proj.bias");
        expect_shape(&b, CKPT_DT_F32, 1, SHAPE((nq + 2 * nkv) * hd));
        expect_heads(&b, 1, 0, q, nq, hd, &m->t[QB]);
        expect_heads(&b, 1, nq * hd, kv, nkv, hd, &m->t[KB]);
        expect_heads(&b, 1, (nq + nkv) * hd, kv, nkv, hd, &m->t[VB]);
        view_free(&b);
    } else {
        expect_absent(dst, vr, ATTN "qkv_proj.bias");
    }
    for (size_t i = 0; i < m->n; i++)
        if (i != O) expect_absent(dst, vr, m->t[i].name);
}

/* Converts to vllm at tp and checks every rank's KV heads: with tp >= KV rank
 * r holds KV head r / (tp / KV) (num_kv_head_replicas adjacent ranks share
 * it), else KV heads r*KV/tp ... */
static void expect_vllm_gqa(fixture *fx, const attn_model *m, int tp)
{
    fx_clear_outputs(fx);
    convert_ok(fx->src, fx->dst, preset("vllm", tp));
    for (int r = 0; r < tp; r++) {
        int kv[64];
        size_t nkv = tp >= m->kv ? 1 : (size_t)(m->kv / tp);
        for (size_t j = 0; j < nkv; j++) kv[j] = tp >= m->kv ? r / (tp / m->kv) : r * (int)nkv + (int)j;
        expect_vllm_attn(m, fx->dst, tp, r, kv, nkv);
    }
    char *extra = ckpt_sprintf("%s/model-rank-%d-part-0.safetensors", fx->dst, tp);
    assert_false(ckpt_exists(extra));
    free(extra);
    expect_round_trip(fx, fx->dst);
}

/* Llama GQA: 32 heads / 8 KV at tp 8 (one KV head each), 4 (two), 32 (each
 * KV head on 4 adjacent ranks); 8 heads / 2 KV at tp 4 (KV 0 on ranks 0 and 1,
 * KV 1 on 2 and 3 — neuron's interleaving would give 0, 1, 0, 1). */
static void test_vllm_gqa_llama(void **state)
{
    fixture *fx = *state;
    attn_model m;
    attn_model_init(&m, 32, 8, 2, 8, false);
    attn_model_write(&m, fx->src, -1);
    expect_vllm_gqa(fx, &m, 8);
    expect_vllm_gqa(fx, &m, 4);
    expect_vllm_gqa(fx, &m, 32);
    expect_vllm_gqa(fx, &m, 1);
    /* rank 5 of tp 32: q head 5, KV head 1 — spelled out */
    fx_clear_outputs(fx);
    convert_ok(fx->src, fx->dst, preset("vllm", 32));
    view v = load(fx->dst, VLLM_RANK(5), ATTN "qkv_proj.weight");
    expect_shape(&v, CKPT_DT_F32, 2, SHAPE(6, 8));
    expect_rows(&v, 0, 2, &m.t[Q], 10);
    expect_rows(&v, 2, 2, &m.t[K], 2);
    expect_rows(&v, 4, 2, &m.t[V], 2);
    view_free(&v);
    json_t *layout = load_layout(fx->dst);
    expect_json(json_object_get(json_object_get(layout_entry(layout, ATTN "qkv_proj.weight", 5), "gqa"), "kv_heads"),
                "[1]", "kv_heads");
    json_decref(layout);

    ckpt_rm_rf(fx->src);
    attn_model_init(&m, 8, 2, 2, 8, false);
    attn_model_write(&m, fx->src, -1);
    expect_vllm_gqa(fx, &m, 4);
    expect_vllm_gqa(fx, &m, 2);
    expect_vllm_gqa(fx, &m, 8);
    /* vLLM's divide(): neither 2 | 3 nor 3 | 2, and 8 heads on 3 ranks */
    fx_clear_outputs(fx);
    expect_convert_error(fx->src, fx->dst, preset("vllm", 3), true, NEEDLES("num_attention_heads 8", "--tp 3"));
    expect_convert_error(fx->src, fx->dst, preset("vllm", 16), true, NEEDLES("num_attention_heads 8", "--tp 16"));
}

/* Qwen2: 14 heads, 2 KV, biases. tp 2: 7 q heads and one KV head per rank;
 * tp 14: one q head each, KV 0 on ranks 0..6, KV 1 on 7..13; tp 4 is refused
 * (14 heads do not divide) and so is tp 7 (7 ranks cannot share 2 KV heads
 * evenly), as vLLM's divide() refuses them. */
static void test_vllm_gqa_qwen2(void **state)
{
    fixture *fx = *state;
    attn_model m;
    attn_model_init(&m, 14, 2, 2, 8, true);
    attn_model_write(&m, fx->src, -1);
    expect_vllm_gqa(fx, &m, 2);
    expect_vllm_gqa(fx, &m, 14);
    fx_clear_outputs(fx);
    expect_convert_error(fx->src, fx->dst, preset("vllm", 7), true, NEEDLES("num_key_value_heads 2", "--tp 7"));
    expect_convert_error(fx->src, fx->dst, preset("vllm", 4), true, NEEDLES("num_attention_heads 14", "--tp 4"));
    expect_convert_error(fx->src, fx->dst, preset("vllm", 8), true, NEEDLES("num_attention_heads 14"));
}

/* The mini Llama (intermediate 6, vocabulary 10) at tp 2: gate_up_proj
 * [gate rows 3r..; up rows 3r..], down_proj columns 3r.., the vocabulary
 * padded to 64 rows (zeros) and cut in 32-row blocks, norms replicated. Tied
 * embeddings become lm_head.weight. Parts split at --max-shard-size. */
static void test_vllm_dense(void **state)
{
    fixture *fx = *state;
    attn_model m;
    src_tensor t[MINI_N];
    make_mini_llama(fx->src, &m, t);
    convert_ok(fx->src, fx->dst, preset("vllm", 2));
    for (int r = 0; r < 2; r++) {
        int vr = VLLM_RANK(r);
        int kv[1] = {r};
        expect_vllm_attn(&m, fx->dst, 2, r, kv, 1);
        view gu = load(fx->dst, vr, "model.layers.0.mlp.gate_up_proj.weight");
        expect_shape(&gu, CKPT_DT_F32, 2, SHAPE(6, 8));
        expect_rows(&gu, 0, 3, &t[MGATE], 3 * (uint64_t)r);
        expect_rows(&gu, 3, 3, &t[MUP], 3 * (uint64_t)r);
        view_free(&gu);
        view down = load(fx->dst, vr, t[MDOWN].name);
        expect_shape(&down, CKPT_DT_F32, 2, SHAPE(8, 3));
        expect_cols(&down, 0, 3, &t[MDOWN], 3 * (uint64_t)r);
        view_free(&down);
        for (int i = MEMBED; i <= MHEAD; i++) {
            view v = load(fx->dst, vr, t[i].name);
            expect_shape(&v, CKPT_DT_F32, 2, SHAPE(32, 8));
            expect_split(&v, 0, 0, &t[i], 2, 1, 64, (uint64_t)r);
            if (r == 0) expect_rows(&v, 10, 22, NULL, 0);
            view_free(&v);
        }
        for (int i = MNORM1; i <= MNORM; i++) {
            view v = load(fx->dst, vr, t[i].name);
            expect_whole(&v, &t[i]);
            view_free(&v);
        }
        expect_absent(fx->dst, vr, t[MGATE].name);
    }
    json_t *layout = load_layout(fx->dst);
    expect_json(json_object_get(layout, "folders"),
                "[{'rank': 0, 'dir': '', 'files': ['model-rank-0-part-0.safetensors']},"
                " {'rank': 1, 'dir': '', 'files': ['model-rank-1-part-0.safetensors']}]",
                "folders");
    expect_json(json_object_get(json_object_get(layout, "rules"), "rank_files"),
                "'model-rank-{rank}-part-{part}.safetensors'", "rank_files");
    json_decref(layout);
    expect_round_trip(fx, fx->dst);

    /* Parts: a new part when the next tensor (natural name order) would pass 1000 bytes. Rank 0:
     * lm_head 1024 alone, embed 1024 alone, norm 32 + down 96 + gate_up 192 + norm 32 + o 64 + qkv 128
     * = 544, model.norm 32 joins them: 3 parts. */
    convert_opts o = preset("vllm", 2);
    o.max_shard_size = 1000;
    convert_ok(fx->src, fx->dst2, o);
    for (int r = 0; r < 2; r++)
        for (int p = 0; p < 4; p++) {
            char *f = ckpt_sprintf("%s/model-rank-%d-part-%d.safetensors", fx->dst2, r, p);
            if (ckpt_exists(f) != (p < 3)) fail_msg("%s: %s", f, p < 3 ? "missing" : "unexpected");
            free(f);
        }
    char *idx = ckpt_path_join(fx->dst2, "model.safetensors.index.json");
    assert_false(ckpt_exists(idx));
    free(idx);
    view lm = load(fx->dst2, VLLM_RANK(1), "lm_head.weight");
    expect_split(&lm, 0, 0, &t[MHEAD], 2, 1, 64, 1);
    view_free(&lm);
    expect_round_trip(fx, fx->dst2);

    /* tie_word_embeddings: embed_tokens is stored as lm_head.weight (vLLM keeps that key of the two) */
    fx_clear_outputs(fx);
    ckpt_rm_rf(fx->src);
    src_tensor tied[MINI_N - 1];
    memcpy(tied, t, MHEAD * sizeof *t);
    memcpy(tied + MHEAD, t + MHEAD + 1, (MINI_N - MHEAD - 1) * sizeof *t);
    make_checkpoint(fx->src, tied, MINI_N - 1,
                    "{'model_type': 'qwen2', 'num_attention_heads': 4, 'num_key_value_heads': 2, "
                    "'head_dim': 2, 'hidden_size': 8, 'intermediate_size': 6, 'vocab_size': 10, "
                    "'tie_word_embeddings': true}");
    convert_ok(fx->src, fx->dst, preset("vllm", 2));
    for (int r = 0; r < 2; r++) {
        view v = load(fx->dst, VLLM_RANK(r), "lm_head.weight");
        expect_split(&v, 0, 0, &t[MEMBED], 2, 1, 64, (uint64_t)r);
        view_free(&v);
        expect_absent(fx->dst, VLLM_RANK(r), "model.embed_tokens.weight");
    }
    expect_round_trip(fx, fx->dst);
}

/* Mixtral experts at tp 2 (FusedMoE): w13_weight [E, 2*I/tp, hidden] = expert e's
 * [w1 rows 2r..2r+1; w3 rows 2r..2r+1], w2_weight [E, hidden, I/tp] = w2 columns
 * 2r..2r+1; the router replicated. */
static void test_vllm_experts(void **state)
{
    fixture *fx = *state;
    enum { E = 3, I = 4, HIDDEN = 4, TP = 2, B = I / TP };
    const char *proj[3] = {"w1", "w3", "w2"};
    char names[3][E][96];
    src_tensor t[3 * E + 1];
    for (int p = 0; p < 3; p++)
        for (int e = 0; e < E; e++) {
            snprintf(names[p][e], sizeof names[p][e], "model.layers.0.block_sparse_moe.experts.%d.%s.weight", e,
                     proj[p]);
            t[p * E + e] = (src_tensor){names[p][e], CKPT_DT_I32, 2, {p < 2 ? I : HIDDEN, p < 2 ? HIDDEN : I},
                                        1 + p * E + e, 0};
        }
    t[3 * E] = (src_tensor){"model.layers.0.block_sparse_moe.gate.weight", CKPT_DT_I32, 2, {E, HIDDEN}, 10, 0};
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t),
                    "{'model_type': 'mixtral', 'num_attention_heads': 2, 'num_key_value_heads': 2, "
                    "'head_dim': 2, 'hidden_size': 4, 'intermediate_size': 4, 'num_local_experts': 3, "
                    "'vocab_size': 8}");
    convert_ok(fx->src, fx->dst, preset("vllm", TP));
    for (uint64_t r = 0; r < TP; r++) {
        int vr = VLLM_RANK((int)r);
        view w13 = load(fx->dst, vr, "model.layers.0.block_sparse_moe.experts.w13_weight");
        view w2 = load(fx->dst, vr, "model.layers.0.block_sparse_moe.experts.w2_weight");
        expect_shape(&w13, CKPT_DT_I32, 3, SHAPE(E, 2 * B, HIDDEN));
        expect_shape(&w2, CKPT_DT_I32, 3, SHAPE(E, HIDDEN, B));
        for (uint64_t e = 0; e < E; e++) {
            expect_block(&w13, e * 2 * B, 0, B, HIDDEN, &t[e], r * B, 0, false);
            expect_block(&w13, e * 2 * B + B, 0, B, HIDDEN, &t[E + e], r * B, 0, false);
            expect_block(&w2, e * HIDDEN, 0, HIDDEN, B, &t[2 * E + e], 0, r * B, false);
        }
        view_free(&w13);
        view_free(&w2);
        view rt = load(fx->dst, vr, t[3 * E].name);
        expect_whole(&rt, &t[3 * E]);
        view_free(&rt);
        for (int i = 0; i < 3 * E; i++) expect_absent(fx->dst, vr, t[i].name);
    }
    expect_round_trip(fx, fx->dst);
    /* I = 4 on 3 ranks: FusedMoE would lose columns; refused (with heads that would divide) */
    fx_clear_outputs(fx);
    ckpt_rm_rf(fx->src);
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t),
                    "{'model_type': 'mixtral', 'num_attention_heads': 6, 'num_key_value_heads': 3, "
                    "'head_dim': 2, 'hidden_size': 4, 'intermediate_size': 4, 'num_local_experts': 3}");
    expect_convert_error(fx->src, fx->dst2, preset("vllm", 3), true, NEEDLES("intermediate size (4)", "--tp 3"));
}

/* ckpt-layout.json of the mini Llama on neuron tp 4 (docs/transforms.md §7). */
static void test_layout_metadata(void **state)
{
    fixture *fx = *state;
    attn_model m;
    src_tensor t[MINI_N];
    make_mini_llama(fx->src, &m, t);
    convert_ok(fx->src, fx->dst, preset("neuron", 4));
    expect_hashes_without_writing(fx->src, fx->dst, preset("neuron", 4)); /* padding: zero parts */
    json_t *layout = load_layout(fx->dst);
    expect_json(json_object_get(layout, "format"), "'ckpt-layout'", "format");
    expect_json(json_object_get(layout, "layout"), "'neuron-tp4'", "layout");
    expect_json(json_object_get(layout, "tp"), "4", "tp");
    expect_json(json_object_get(layout, "lossy"), "false", "lossy");

    /* source identity */
    char *model = ckpt_path_join(fx->src, "model.safetensors");
    char hex[65];
    assert_int_equal(ckpt_sha256_file_hex(model, hex), 0);
    struct stat st;
    assert_int_equal(stat(model, &st), 0);
    json_t *file0 = json_array_get(json_object_get(json_object_get(layout, "source"), "files"), 0);
    expect_json(json_object_get(file0, "name"), "'model.safetensors'", "source file name");
    assert_string_equal(json_string_value(json_object_get(file0, "sha256")), hex);
    assert_int_equal(json_integer_value(json_object_get(file0, "size")), st.st_size);
    assert_int_equal(json_array_size(json_object_get(file0, "tensors")), MINI_N);
    free(model);

    /* optimum-neuron's parameters: split tensors only */
    expect_parameter(layout, ATTN "qkv_proj.weight_qkv", 0, 1, 4);
    expect_parameter(layout, ATTN "o_proj.weight", 1, 1, 4);
    expect_parameter(layout, "model.layers.0.mlp.gate_up_proj.weight", 0, 1, 4);
    expect_parameter(layout, t[MDOWN].name, 1, 1, 4);
    expect_parameter(layout, t[MEMBED].name, 0, 1, 4);
    expect_parameter(layout, t[MHEAD].name, 0, 1, 4);
    assert_null(json_object_get(json_object_get(layout, "parameters"), t[MNORM].name));

    /* per tensor: GQA heads, fused members, padding */
    expect_json(json_object_get(layout_entry(layout, ATTN "qkv_proj.weight_qkv", 1), "gqa"),
                "{'num_attention_heads': 4, 'num_key_value_heads': 2, 'kv_size_multiplier': 2, "
                "'head_dim': 2, 'padded_num_attention_heads': 4, "
                "'q_heads': [2], 'kv_heads': [1], 'fused': true}",
                "gqa of rank 1's qkv");
    expect_json(json_object_get(layout_entry(layout, ATTN "o_proj.weight", 2), "gqa"),
                "{'num_attention_heads': 4, 'num_key_value_heads': 2, 'kv_size_multiplier': 2, "
                "'head_dim': 2, 'padded_num_attention_heads': 4, "
                "'q_heads': [1], 'kv_heads': [0], 'fused': true}",
                "gqa of rank 2's o_proj");
    expect_json(
        json_object_get(layout_entry(layout, "model.layers.0.mlp.gate_up_proj.weight", 0), "fused"),
        "{'members': ['model.layers.0.mlp.gate_proj.weight', 'model.layers.0.mlp.up_proj.weight'], "
        "'original_dims': [6, 6], 'padded_dims': [8, 8], 'axis': 0}",
        "fused of gate_up_proj");
    expect_json(json_object_get(layout_entry(layout, t[MEMBED].name, 3), "padding"),
                "{'axis': 0, 'original': 10, 'padded': 12}", "padding of embed_tokens");
    expect_json(json_object_get(layout_entry(layout, t[MDOWN].name, 0), "padding"),
                "{'axis': 1, 'original': 6, 'padded': 8}", "padding of down_proj");
    json_t *norm = layout_entry(layout, t[MNORM].name, -1);
    assert_null(json_object_get(norm, "tensor_model_parallel"));
    assert_true(json_array_size(json_object_get(norm, "parts")) == 1);

    /* model_weight_transformation_specs */
    bool fused_spec = false, gqa_spec = false;
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(layout, "model_weight_transformation_specs"), i, s)
    {
        const char *type = json_string_value(json_object_get(s, "type"));
        const char *name = json_string_value(json_object_get(s, "fused_linear_name"));
        if (!strcmp(type, "FusedLinearsSpec") &&
            !strcmp(name, "model.layers.0.mlp.gate_up_proj.weight")) {
            expect_json(json_object_get(s, "original_dims"), "[6, 6]",
                        "FusedLinearsSpec original_dims");
            fused_spec = true;
        }
        if (!strcmp(type, "GQAQKVColumnParallelLinearSpec") &&
            !strcmp(name, ATTN "qkv_proj.weight_qkv")) {
            expect_json(json_object_get(json_object_get(s, "gqa"), "kv_size_multiplier"), "2",
                        "GQA spec multiplier");
            gqa_spec = true;
        }
    }
    assert_true(fused_spec && gqa_spec);

    /* folders and the rules document that produced them */
    expect_json(json_array_get(json_object_get(layout, "folders"), 3),
                "{'rank': 3, 'dir': 'tp_rank_03', 'files': ['tp_rank_03/model.safetensors']}",
                "folder 3");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(layout, "rules"), "layout")),
        "neuron-tp4");
    json_decref(layout);
}

/* `ckpt plan --print-rules` printed, fed back with --rules: the same files. */
static void test_print_rules_round_trip(void **state)
{
    fixture *fx = *state;
    attn_model m;
    src_tensor t[MINI_N];
    make_mini_llama(fx->src, &m, t);
    char *cfg_path = ckpt_path_join(fx->src, "config.json");
    json_t *config;
    assert_int_equal(cj_load_file(&config, cfg_path, CONVERT_CONFIG_MAX_BYTES), 0);
    static const char *const presets[] = {"neuron", "fused", "easydel", "hf"};
    static const int tps[] = {1, 4};
    for (size_t p = 0; p < CKPT_ARRAY_LEN(presets); p++) {
        for (size_t k = 0; k < CKPT_ARRAY_LEN(tps); k++) {
            fx_clear_outputs(fx);
            convert_ok(fx->src, fx->dst, preset(presets[p], tps[k]));
            preset_opts po = {.preset = presets[p], .tp = tps[k]};
            json_t *doc;
            if (preset_rules(&doc, config, &po, "config.json")) fail_msg("%s", ckpt_error_last());
            char *text = cj_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
            assert_non_null(text);
            assert_int_equal(ckpt_write_file_atomic(fx->rules, text, strlen(text)), 0);
            convert_ok(fx->src, fx->dst2, (convert_opts){.rules_file = fx->rules});
            expect_trees_equal(fx->dst, fx->dst2);
            free(text);
            json_decref(doc);
        }
    }
    json_decref(config);
    free(cfg_path);
}

/* Flips the bits of byte `at` of tensor `name` in rank `rank`'s file. */
static void corrupt_tensor(const char *dst, int rank, const char *name, uint64_t at)
{
    char *dir = rank_dir(dst, rank), *path = ckpt_path_join(dir, "model.safetensors");
    st_file f;
    if (st_open(&f, path)) fail_msg("%s", ckpt_error_last());
    const st_tensor *t = st_find(&f, name);
    assert_non_null(t);
    assert_true(at < t->nbytes);
    uint64_t off = t->offset + at;
    st_close(&f);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(ckpt_pread_full(fd, &b, 1, off, path), 0);
    b = (uint8_t)~b;
    assert_int_equal(ckpt_pwrite_full(fd, &b, 1, off, path), 0);
    close(fd);
    free(path);
    free(dir);
}

/* Consolidation checks every copy of a replicated box: a norm on every rank,
 * a KV head replicated m times; a difference names the tensor and the rank. */
static void test_consolidate_checks_replicas(void **state)
{
    fixture *fx = *state;
    attn_model m;
    src_tensor t[MINI_N];
    make_mini_llama(fx->src, &m, t);
    const char *dsts[] = {fx->dst, fx->dst2};
    const struct {
        const char *stored, *original;
        uint64_t at; /* byte offset in the stored tensor */
    } damage[] = {
        {"model.norm.weight", "model.norm.weight", 0},
        /* rank 2's qkv: q head 1 (2 rows of 8), then KV head 0 (a replica of rank 0's) */
        {ATTN "qkv_proj.weight_qkv", ATTN "k_proj.weight", 2 * 8 * 4},
    };
    for (size_t i = 0; i < CKPT_ARRAY_LEN(damage); i++) {
        convert_ok(fx->src, dsts[i], preset("neuron", 4));
        corrupt_tensor(dsts[i], 2, damage[i].stored, damage[i].at);
        consolidate_opts co = {.quiet = true};
        assert_int_not_equal(consolidate_run(dsts[i], fx->back, &co), 0);
        assert_contains(ckpt_error_last(), damage[i].original);
        assert_contains(ckpt_error_last(), "rank 2");
        expect_no_dst(fx->back);
    }
}

/* Writes layout back as DST's ckpt-layout.json. */
static void save_layout(const char *dst, json_t *layout)
{
    char *path = ckpt_path_join(dst, CONVERT_LAYOUT_FILE), *text = json_dumps(layout, JSON_INDENT(1));
    assert_non_null(text);
    assert_int_equal(ckpt_write_file_atomic(path, text, strlen(text)), 0);
    free(text);
    free(path);
}

/* Issue 14 #9: ckpt-layout.json is checked like any input. Parts of one
 * original tensor that overlap (their element counts still summing to the
 * tensor's) are an error, not zeros where no part lands; a source dtype the
 * stored tensor cannot be converted from (an integer) is an error, not an
 * assert. Both name the tensor; no DST. */
static void test_consolidate_refuses_bad_layout(void **state)
{
    fixture *fx = *state;
    attn_model m;
    src_tensor t[MINI_N];
    make_mini_llama(fx->src, &m, t);
    convert_ok(fx->src, fx->dst, preset("neuron", 2));
    /* rank 1's row-parallel down_proj starts one column early. */
    json_t *layout = load_layout(fx->dst);
    json_t *parts = json_object_get(layout_entry(layout, "model.layers.0.mlp.down_proj.weight", 1), "parts");
    assert_true(json_array_size(parts) >= 1);
    json_t *src_lo = json_object_get(json_array_get(parts, 0), "src_lo");
    bool moved = false;
    for (size_t k = 0; k < json_array_size(src_lo); k++) {
        json_int_t v = json_integer_value(json_array_get(src_lo, k));
        if (v > 0) {
            json_array_set_new(src_lo, k, json_integer(v - 1));
            moved = true;
        }
    }
    assert_true(moved);
    save_layout(fx->dst, layout);
    json_decref(layout);
    consolidate_opts co = {.quiet = true};
    assert_int_equal(consolidate_run(fx->dst, fx->back, &co), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "model.layers.0.mlp.down_proj.weight");
    assert_contains(ckpt_error_last(), "overlap");
    expect_no_dst(fx->back);

    /* An integer source dtype of the same size. */
    fx_clear_outputs(fx);
    convert_ok(fx->src, fx->dst, preset("neuron", 2));
    layout = load_layout(fx->dst);
    json_t *files = json_object_get(json_object_get(layout, "source"), "files"), *f, *jt;
    size_t fi, ti;
    bool changed = false;
    json_array_foreach(files, fi, f) json_array_foreach(json_object_get(f, "tensors"), ti, jt)
    {
        if (!strcmp(json_string_value(json_object_get(jt, "name")), "model.norm.weight")) {
            json_object_set_new(jt, "dtype", json_string("I32"));
            changed = true;
        }
    }
    assert_true(changed);
    save_layout(fx->dst, layout);
    json_decref(layout);
    assert_int_equal(consolidate_run(fx->dst, fx->back, &co), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "model.norm.weight");
    assert_contains(ckpt_error_last(), "I32");
    expect_no_dst(fx->back);
}

/* ---- errors: at plan time, naming rule and tensor, no DST ---- */

static void test_error_missing_k_proj(void **state)
{
    fixture *fx = *state;
    attn_model m;
    attn_model_init(&m, 8, 2, 4, 16, false);
    attn_model_write(&m, fx->src, K);
    expect_convert_error(fx->src, fx->dst, preset("neuron", 4), true,
                         NEEDLES("rule 1 (fuse_qkv_gqa)", "'" ATTN "k_proj.weight'"));
}

static void test_error_shape_against_config(void **state)
{
    fixture *fx = *state;
    attn_model m;
    attn_model_init(&m, 8, 2, 4, 16, false);
    attn_model_write(&m, fx->src, -1);
    /* config.json says head_dim 2, the tensors have 4 */
    char *cfg = ckpt_path_join(fx->src, "config.json");
    write_json_text(
        cfg,
        "{'num_attention_heads': 8, 'num_key_value_heads': 2, 'head_dim': 2, 'hidden_size': 16}");
    free(cfg);
    expect_convert_error(fx->src, fx->dst, preset("neuron", 4), true,
                         NEEDLES("rule 1 (fuse_qkv_gqa)", "'" ATTN "q_proj.weight'", "[32, 16]"));
}

static void test_error_kv_multiplier(void **state)
{
    fixture *fx = *state;
    attn_model m;
    attn_model_init(&m, 8, 2, 4, 16, false);
    attn_model_write(&m, fx->src, -1);
    convert_opts o = preset("neuron", 8);
    o.kv_size_multiplier = 3;
    expect_convert_error(fx->src, fx->dst, o, true,
                         NEEDLES("rule 1 (fuse_qkv_gqa)", "kv_size_multiplier 3", "tp 8"));
}

/* Qwen3-MoE-like experts 0..7 with expert 3 missing, then with expert 5 of another shape. */
static void test_error_experts(void **state)
{
    fixture *fx = *state;
    static const char *const proj[] = {"gate_proj", "up_proj", "down_proj"};
    char names[24][64];
    src_tensor t[24];
    const char *config =
        "{'model_type': 'qwen3_moe', 'num_attention_heads': 2, 'num_key_value_heads': 2, "
        "'head_dim': 2, 'hidden_size': 4, 'num_experts': 8, 'moe_intermediate_size': 2}";
    for (int bad = 0; bad < 2; bad++) {
        size_t n = 0;
        for (int e = 0; e < 8; e++) {
            if (bad == 0 && e == 3) continue;
            for (int p = 0; p < 3; p++) {
                snprintf(names[n], sizeof names[n], "model.layers.0.mlp.experts.%d.%s.weight", e,
                         proj[p]);
                uint64_t rows = p == 2 ? 4 : 2, cols = p == 2 ? 2 : 4;
                if (bad == 1 && e == 5 && p == 0) rows = 3;
                t[n] = (src_tensor){names[n], CKPT_DT_I32, 2, {rows, cols}, 1, 0};
                n++;
            }
        }
        assert_int_equal(ckpt_rm_rf(fx->src), 0);
        make_checkpoint(fx->src, t, n, config);
        if (bad == 0)
            expect_convert_error(
                fx->src, fx->dst, preset("neuron", 1), true,
                NEEDLES("(stack_experts)", "model.layers.0.mlp.experts.3.", "expert 3 of 8"));
        else
            expect_convert_error(
                fx->src, fx->dst, preset("fused", 1), true,
                NEEDLES("(stack_experts)", "model.layers.0.mlp.experts.5.gate_proj.weight"));
    }
}

/* plan_name_index gives what plan_set_find gives for every name of its rank
 * (the first of equal names), -1 for names of other ranks and names not
 * there, and ignores tensors pushed after it was built. */
static void test_plan_name_index(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        int rank;
    } in[] = {{"b.weight", PLAN_ALL_RANKS},
              {"a.weight", PLAN_ALL_RANKS},
              {"c.weight", 0},
              {"a.weight", 1},
              {"b.weight", PLAN_ALL_RANKS},
              {"ab", PLAN_ALL_RANKS},
              {"a", PLAN_ALL_RANKS},
              {"d.weight", 3},
              {"a.weightx", PLAN_ALL_RANKS}};
    plan_set s = {0};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(in); i++) {
        plan_tensor t = {.name = ckpt_strdup(in[i].name), .rank = in[i].rank};
        assert_int_equal(plan_set_push(&s, &t), 0);
    }
    plan_name_index x;
    assert_int_equal(plan_name_index_build(&x, &s, PLAN_ALL_RANKS), 0);
    assert_int_equal(x.n, 6);
    assert_int_equal(plan_name_index_find(&x, "b.weight"), 0); /* the first of two */
    static const char *names[] = {"a.weight",  "b.weight", "c.weight", "d.weight", "ab", "a",
                                  "a.weightx", "",         "a.",       "zzz",      "0"};
    for (size_t k = 0; k < CKPT_ARRAY_LEN(names); k++)
        assert_int_equal(plan_name_index_find(&x, names[k]),
                         plan_set_find(&s, names[k], PLAN_ALL_RANKS));
    plan_tensor late = {.name = ckpt_strdup("e.weight"), .rank = PLAN_ALL_RANKS};
    assert_int_equal(plan_set_push(&s, &late), 0);
    assert_int_equal(plan_name_index_find(&x, "e.weight"), -1);
    plan_name_index_free(&x);
    assert_int_equal(plan_name_index_build(&x, &s, 1), 0);
    assert_int_equal(x.n, 1);
    assert_int_equal(plan_name_index_find(&x, "a.weight"), 3);
    assert_int_equal(plan_name_index_find(&x, "b.weight"), -1);
    plan_name_index_free(&x);
    plan_set_free(&s);
}

/* A pattern that backtracks without end on a name is stopped by the match
 * limit, with or without JIT-compiled patterns, and named in the error. */
static void test_error_rule_backtracking(void **state)
{
    fixture *fx = *state;
    const src_tensor t[] = {
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.weight", CKPT_DT_I32, 2, {3, 2}, 1, 0},
    };
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t), NULL);
    write_json_text(fx->rules, "{'rules': [{'op': 'drop', 'pattern': '^(a+)+$'}]}");
    expect_convert_error(fx->src, fx->dst, (convert_opts){.rules_file = fx->rules}, true,
                         NEEDLES("rule 1 (drop)", "too much backtracking", t[0].name));
}

/* Rules documents that are wrong, and rules that cannot apply to the source. */
static void test_error_rules(void **state)
{
    fixture *fx = *state;
    const src_tensor t[] = {
        {"a.weight", CKPT_DT_I32, 2, {3, 2}, 1, 0},
        {"b.weight", CKPT_DT_I32, 2, {3, 2}, 2, 0},
    };
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t), NULL);
    const struct {
        const char *doc;
        const char *const *needles;
    } cases[] = {
        {"{'rules': [{'op': 'rename', 'pattern': '^(unclosed', 'replacement': 'x'}]}",
         NEEDLES(fx->rules, "rule 1 (rename)", "bad regex", "'^(unclosed'")},
        {"{'rules': [{'op': 'drop', 'pattern': 'zzz'}, {'op': 'frobnicate', 'pattern': 'x'}]}",
         NEEDLES(fx->rules, "rule 2", "unknown op 'frobnicate'")},
        {"{'rules': [{'op': 'rename', 'pattern': 'x', 'replacement': 'y', 'replacment': 'z'}]}",
         NEEDLES(fx->rules, "rule 1 (rename)", "unknown field 'replacment'")},
        {"{'tp': 2, 'rules': [{'op': 'tp_split', 'pattern': 'x', 'tp': 4}]}",
         NEEDLES(fx->rules, "rule 1 (tp_split)", "tp 4")},
        {"{'rules': [{'op': 'rename', 'pattern': '^(a|b)[.]weight$', 'replacement': 'c.weight'}]}",
         NEEDLES("rule 1 (rename)", "'c.weight'")},
        {"{'tp': 2, 'rules': [{'op': 'tp_split', 'pattern': '^a[.]', 'pad_multiple': 1}]}",
         NEEDLES("rule 1 (tp_split)", "'a.weight'")},
        {"{'rules': [{'op': 'fuse', 'pattern': '^(a)[.](weight|gain)$', "
         "'members': ['weight', 'gain'], 'output': '$1.fused'}]}",
         NEEDLES("rule 1 (fuse)", "'a.gain'")},
        {"{'rank_files': 'r{rank}.safetensors', 'rules': []}", NEEDLES(fx->rules, "rank_files 'r{rank}.safetensors'")},
        {"{'rank_files': 'x/{rank}-{part}.safetensors', 'rules': []}", NEEDLES(fx->rules, "no '/'")},
        {"{'rank_files': '{rank}-{part}-{rank}.safetensors', 'rules': []}", NEEDLES(fx->rules, "once each")},
        {"{'rules': [{'op': 'fuse_qkv_gqa', 'pattern': 'q', 'num_attention_heads': 2, "
         "'num_key_value_heads': 1, 'head_dim': 1, 'kv_order': 'tiled'}]}",
         NEEDLES(fx->rules, "rule 1 (fuse_qkv_gqa)", "kv_order", "'tiled'")},
    };
    for (size_t i = 0; i < CKPT_ARRAY_LEN(cases); i++) {
        write_json_text(fx->rules, cases[i].doc);
        expect_convert_error(fx->src, fx->dst, (convert_opts){.rules_file = fx->rules}, true,
                             cases[i].needles);
    }
}

static void test_error_truncated_shard(void **state)
{
    fixture *fx = *state;
    const src_tensor t[] = {{"a.weight", CKPT_DT_I32, 2, {4, 4}, 1, 0}};
    make_checkpoint(fx->src, t, 1, NULL);
    char *model = ckpt_path_join(fx->src, "model.safetensors");
    struct stat st;
    assert_int_equal(stat(model, &st), 0);
    assert_int_equal(truncate(model, st.st_size - 4), 0);
    expect_convert_error(fx->src, fx->dst, preset("hf", 1), true, NEEDLES(model));
    free(model);
}

/* DST on a 256 KiB tmpfs, the source 1 MiB: the copy fails with ENOSPC,
 * through copy_file_range (hf) and through the slab path (a row split). */
#define FULL_DISK_DIR "full"

static void test_full_disk(void **state)
{
    fixture *fx = *state;
    char mnt[700], dst[720];
    snprintf(mnt, sizeof mnt, "%s/" FULL_DISK_DIR, fx->root);
    snprintf(dst, sizeof dst, "%s/dst", mnt);
    assert_int_equal(ckpt_mkdir_p(mnt, 0755), 0);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=256k") != 0) {
        print_message("skipping the full-disk test: cannot mount a tmpfs (%s)\n", strerror(errno));
        skip();
    }
    const src_tensor t[] = {{"big.weight", CKPT_DT_I32, 2, {512, 512}, 0, 512}};
    make_checkpoint(fx->src, t, 1, NULL);
    expect_convert_error(fx->src, dst, preset("hf", 1), false, NEEDLES("No space left"));
    write_json_text(fx->rules,
                    "{'tp': 2, 'rules': [{'op': 'tp_split', 'pattern': '^big', 'axis': 1}]}");
    expect_convert_error(fx->src, dst, (convert_opts){.rules_file = fx->rules}, false,
                         NEEDLES("No space left"));
    /* with O_DIRECT (tmpfs takes it since Linux 6.6): the writer threads fail */
    expect_convert_error(fx->src, dst, (convert_opts){.rules_file = fx->rules, .direct = true}, false,
                         NEEDLES("No space left"));
    DIR *d = opendir(mnt);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            fail_msg("%s/%s was left behind", mnt, e->d_name);
    closedir(d);
}

static int fx_teardown_unmount(void **state)
{
    fixture *fx = *state;
    char mnt[700];
    snprintf(mnt, sizeof mnt, "%s/" FULL_DISK_DIR, fx->root);
    umount2(mnt, MNT_DETACH); /* not mounted when the test was skipped */
    return fx_teardown(state);
}

/* ---- executor edge cases ---- */

static void test_executor_scalar_and_empty(void **state)
{
    fixture *fx = *state;
    const src_tensor t[] = {
        {"scalar", CKPT_DT_F32, 0, {0}, 3, 0},        {"empty_rows", CKPT_DT_F32, 2, {0, 4}, 1, 0},
        {"empty_cols", CKPT_DT_F32, 2, {4, 0}, 2, 0}, {"empty", CKPT_DT_F32, 1, {0}, 4, 0},
        {"empty_t", CKPT_DT_F32, 2, {0, 3}, 5, 0},    {"w", CKPT_DT_F32, 2, {3, 4}, 6, 0},
    };
    make_checkpoint(fx->src, t, CKPT_ARRAY_LEN(t), NULL);

    /* no rules: every tensor copied as it is (the copy_file_range path) */
    convert_with_rules(fx, fx->dst, "{'rules': []}");
    char *a = ckpt_path_join(fx->src, "model.safetensors"),
         *b = ckpt_path_join(fx->dst, "model.safetensors");
    expect_files_equal(a, b);
    free(a);
    free(b);
    expect_round_trip(fx, fx->dst);

    /* a widening cast: every tensor through the slab path */
    convert_with_rules(fx, fx->dst2, "{'rules': [{'op': 'cast', 'dtype': 'f64'}]}");
    for (size_t i = 0; i < CKPT_ARRAY_LEN(t); i++) {
        view v = load(fx->dst2, -1, t[i].name);
        expect_shape(&v, CKPT_DT_F64, t[i].ndim, t[i].shape);
        if (v.nbytes) expect_rows(&v, 0, v.rows, &t[i], 0);
        view_free(&v);
    }
    expect_round_trip(fx, fx->dst2);

    /* tp 2: empty tensors split and transposed, the scalar replicated */
    fx_clear_outputs(fx);
    convert_with_rules(
        fx, fx->dst,
        "{'tp': 2, 'rules': [{'op': 'tp_split', 'pattern': '^empty_rows$', 'axis': 1}, "
        "{'op': 'tp_split', 'pattern': '^empty_cols$', 'axis': 0}, "
        "{'op': 'transpose', 'pattern': '^empty_t$'}, "
        "{'op': 'tp_split', 'pattern': '^w$', 'axis': 1}]}");
    for (int r = 0; r < 2; r++) {
        view s = load(fx->dst, r, "scalar"), er = load(fx->dst, r, "empty_rows"),
             ec = load(fx->dst, r, "empty_cols");
        view et = load(fx->dst, r, "empty_t"), w = load(fx->dst, r, "w");
        expect_whole(&s, &t[0]);
        expect_shape(&er, CKPT_DT_F32, 2, SHAPE(0, 2));
        expect_shape(&ec, CKPT_DT_F32, 2, SHAPE(2, 0));
        expect_shape(&et, CKPT_DT_F32, 2, SHAPE(3, 0));
        expect_shape(&w, CKPT_DT_F32, 2, SHAPE(3, 2));
        expect_split(&w, 1, 0, &t[5], 2, 1, 2, (uint64_t)r);
        view *all[] = {&s, &er, &ec, &et, &w};
        for (size_t i = 0; i < CKPT_ARRAY_LEN(all); i++)
            view_free(all[i]);
    }
    expect_round_trip(fx, fx->dst);
}

/* v's bytes equal ref's (n bytes), or the first differing element is named. */
static void expect_bytes(const view *v, const int32_t *ref, size_t n)
{
    assert_int_equal(v->nbytes, n * sizeof *ref);
    if (!memcmp(v->raw, ref, v->nbytes)) return;
    for (size_t i = 0; i < n; i++) {
        int32_t got;
        memcpy(&got, v->raw + i * 4, 4);
        if (got != ref[i]) fail_msg("%s: element %zu is %d, expected %d", v->name, i, got, ref[i]);
    }
}

/* The same column split read back the way the daemon serves stored layouts
 * (exec_tensor_read, bytes on demand, with the slab cache that spares
 * re-assembling a slab for every block of a sequential read): blocks of 1 MiB
 * + 3 bytes in order, then scattered reads of odd sizes, each against the
 * reference; the plan is built from fx->rules as the last convert used it. */
static void expect_random_access(fixture *fx, const int32_t *s, size_t rows, size_t cols, int tp)
{
    convert_plan cp;
    convert_opts o = {.rules_file = fx->rules};
    if (convert_plan_build(&cp, fx->src, &o) < 0) fail_msg("plan: %s", ckpt_error_last());
    int *fds = calloc(cp.exec.nsrc_paths, sizeof *fds);
    uint8_t *slab = malloc(EXEC_READ_SLAB_BYTES), *band = malloc(EXEC_BAND_BYTES);
    size_t w = cols / (size_t)tp, nbytes = rows * w * sizeof(int32_t);
    int32_t *ref = malloc(nbytes);
    uint8_t *got = malloc(nbytes);
    assert_true(fds && slab && band && ref && got);
    for (size_t i = 0; i < cp.exec.nsrc_paths; i++) {
        fds[i] = open(cp.exec.src_paths[i], O_RDONLY | O_CLOEXEC);
        assert_true(fds[i] >= 0);
    }
    assert_int_equal(cp.exec.nfiles, (size_t)tp);
    uint32_t rnd = 12345;
    for (size_t f = 0; f < cp.exec.nfiles; f++) {
        const exec_file *ef = &cp.exec.files[f];
        int r = -1;
        assert_int_equal(sscanf(ef->rel, "tp_rank_%d/", &r), 1);
        assert_int_equal(ef->ntensors, 1);
        const plan_tensor *t = ef->tensors[0];
        for (size_t i = 0; i < rows; i++)
            for (size_t j = 0; j < w; j++)
                ref[i * w + j] = s[i * cols + (size_t)r * w + j];
        exec_slab_cache cache = {0};
        memset(got, 0xa5, nbytes);
        for (size_t off = 0; off < nbytes; off += (1u << 20) + 3) {
            size_t n = nbytes - off < (1u << 20) + 3 ? nbytes - off : (1u << 20) + 3;
            if (exec_tensor_read(&cp.exec, fds, t, off, got + off, n, slab, band, &cache) < 0)
                fail_msg("rank %d at %zu: %s", r, off, ckpt_error_last());
        }
        if (memcmp(got, ref, nbytes)) fail_msg("rank %d: sequential reads differ from the reference", r);
        for (int k = 0; k < 40; k++) {
            rnd = rnd * 1103515245u + 12345u;
            size_t off = (size_t)(rnd >> 4) % nbytes;
            rnd = rnd * 1103515245u + 12345u;
            size_t n = 1 + (size_t)(rnd >> 8) % (3u << 20);
            if (n > nbytes - off) n = nbytes - off;
            memset(got, 0xa5, n);
            if (exec_tensor_read(&cp.exec, fds, t, off, got, n, slab, band, &cache) < 0)
                fail_msg("rank %d at %zu: %s", r, off, ckpt_error_last());
            if (memcmp(got, (uint8_t *)ref + off, n)) fail_msg("rank %d: %zu bytes at %zu differ", r, n, off);
        }
    }
    for (size_t i = 0; i < cp.exec.nsrc_paths; i++)
        close(fds[i]);
    free(fds);
    free(slab);
    free(band);
    free(ref);
    free(got);
    convert_plan_free(&cp);
}

/* An I32 [1500, 6000] matrix (36 MB: more than the 8 MiB slab and the 16 MiB
 * band), transposed (tiles whose source rows span more than a band) and
 * split by columns over 4 ranks (9 MB slabs spanning 33 MB of source),
 * against references computed here from the source bytes. */
static void test_executor_big(void **state)
{
    fixture *fx = *state;
    enum { ROWS = 1500, COLS = 6000, TP = 4 };
    const src_tensor big = {"big", CKPT_DT_I32, 2, {ROWS, COLS}, 0, COLS};
    make_checkpoint(fx->src, &big, 1, NULL);
    view src = load(fx->src, -1, "big");
    const int32_t *s = (const int32_t *)src.raw;
    int32_t *ref = malloc((size_t)ROWS * COLS * sizeof *ref);
    assert_non_null(ref);

    convert_with_rules(
        fx, fx->dst,
        "{'rules': [{'op': 'transpose', 'pattern': '^big$', 'replacement': 'big_t'}]}");
    for (size_t i = 0; i < COLS; i++)
        for (size_t j = 0; j < ROWS; j++)
            ref[i * ROWS + j] = s[j * COLS + i];
    view tr = load(fx->dst, -1, "big_t");
    expect_shape(&tr, CKPT_DT_I32, 2, SHAPE(COLS, ROWS));
    expect_bytes(&tr, ref, (size_t)ROWS * COLS);
    view_free(&tr);
    expect_round_trip(fx, fx->dst);

    convert_with_rules(fx, fx->dst2,
                       "{'tp': 4, 'rules': [{'op': 'tp_split', 'pattern': '^big$', 'axis': 1}]}");
    const size_t w = COLS / TP;
    for (int r = 0; r < TP; r++) {
        for (size_t i = 0; i < ROWS; i++)
            for (size_t j = 0; j < w; j++)
                ref[i * w + j] = s[i * COLS + (size_t)r * w + j];
        view part = load(fx->dst2, r, "big");
        expect_shape(&part, CKPT_DT_I32, 2, SHAPE(ROWS, w));
        expect_bytes(&part, ref, (size_t)ROWS * w);
        view_free(&part);
    }
    expect_round_trip(fx, fx->dst2);
    expect_random_access(fx, s, ROWS, COLS, TP);
    convert_opts split = {.rules_file = fx->rules};
    expect_hashes_without_writing(fx->src, fx->dst2, split);
    free(ref);
    view_free(&src);
}

int main(void)
{
    ckpt_log_set_level(CKPT_LOG_QUIET);
    const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, fx_setup, fx_teardown)
        T(test_gqa_worked_example_tp4),
        T(test_gqa_second_example_tp8),
        T(test_gqa_contiguous_and_unfused),
        T(test_gqa_head_padding),
        T(test_tp_split_padding),
        T(test_tp_split_stride),
        T(test_tp_groups),
        T(test_tp_groups_tiles),
        T(test_tp_groups_tiny),
        T(test_fuse),
        T(test_stack_experts_order),
        T(test_unstack_experts),
        T(test_rename_drop_transpose),
        T(test_transpose_tiles),
        T(test_transpose_tiles_2byte),
        T(test_direct_writes),
        T(test_executor_crc),
        T(test_executor_prefetch_runs),
        T(test_executor_direct_reads),
        T(test_cast_bf16),
        T(test_neuron_dense),
        T(test_neuron_experts),
        T(test_vllm_gqa_llama),
        T(test_vllm_gqa_qwen2),
        T(test_vllm_dense),
        T(test_vllm_experts),
        T(test_layout_metadata),
        T(test_print_rules_round_trip),
        T(test_consolidate_checks_replicas),
        T(test_consolidate_refuses_bad_layout),
        T(test_error_missing_k_proj),
        T(test_error_shape_against_config),
        T(test_error_kv_multiplier),
        T(test_error_experts),
        T(test_error_rules),
        T(test_error_rule_backtracking),
        cmocka_unit_test(test_plan_name_index),
        T(test_error_truncated_shard),
        cmocka_unit_test_setup_teardown(test_full_disk, fx_setup, fx_teardown_unmount),
        T(test_executor_scalar_and_empty),
        T(test_executor_big),
#undef T
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_lora.c — LoRA adapters (lora/lora.c, lora_merge.c, lora_layout.c)
 * on tiny checkpoints written here, with values chosen so the expected
 * results are exact:
 *
 *   - merge arithmetic: W + s * B @ A rounded to nearest-even in BF16,
 *     including ties (1 + 2^-8 stays 1, 1 + 2^-7 + 2^-8 goes up), F16 and
 *     F32 bases, fan_in_fan_out, --scale and unmerge, a weight of many
 *     blocks of rows (every row checked against a double computation);
 *   - a hand-built fused adapter (A = [A_q; A_v], B block-diagonal, k
 *     without an adapter, a zero row in B_v): its merge makes exactly the
 *     GEMM calls of the members' merges (cblas_sgemm is wrapped at link
 *     time and every call's shape, alignment and operands recorded), so it
 *     gives their bytes on any kernel, and rows whose update is zero keep
 *     their bytes, -0 included;
 *   - the adapter reader: rank_pattern / alpha_pattern with PEFT's key
 *     matching, rsLoRA scales, target_modules as a list (suffix at a dot), a
 *     regex and all-linear, and the errors for bad configs and tensors;
 *   - the neuron layout of docs/transforms.md §4's worked example (H=8, KV=2, hd=4, tp=4):
 *     rank 1's fused adapter is A = [A_q; A_k; A_v] and B block-diagonal with
 *     q rows 16..23, k and v rows 4..7; o_proj's A holds columns 16..23;
 *     consolidation gives the adapter back byte for byte;
 *   - the lora_merge rule: parsing errors that name the rule (missing or
 *     broken adapter, bad scale, unknown fields), a merge inside a
 *     conversion equal byte for byte to merge-lora (chained with a second
 *     rule that unmerges again), ckpt-layout.json recording the adapter, and
 *     the apply errors (a weight reshaped or cast before the rule).
 *
 * Each test works in a fresh directory under $TMPDIR (or /tmp).
 */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/util.h"
#include "format/checkpoint.h"
#include "format/dtype.h"
#include "lora/lora.h"
#include "transform/lora_plan.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* ---- fixture ---- */

typedef struct {
    char root[512];
    char base[600], ad[600], dst[600], back[600];
} fixture;

static int fx_setup(void **state)
{
    fixture *fx = calloc(1, sizeof *fx);
    const char *tmp = getenv("TMPDIR");
    if (!fx) return -1;
    snprintf(fx->root, sizeof fx->root, "%s/ckpt-test-lora-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(fx->root)) {
        free(fx);
        return -1;
    }
    snprintf(fx->base, sizeof fx->base, "%s/base", fx->root);
    snprintf(fx->ad, sizeof fx->ad, "%s/adapter", fx->root);
    snprintf(fx->dst, sizeof fx->dst, "%s/dst", fx->root);
    snprintf(fx->back, sizeof fx->back, "%s/back", fx->root);
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

/* ---- writing tensors ---- */

typedef double (*value_fn)(int tag, uint64_t row, uint64_t col);

typedef struct {
    const char *name;
    ckpt_dtype dtype;
    uint64_t rows, cols; /* cols 0: a 1-D tensor of rows elements */
    int tag;
    value_fn fn;
} spec;

static void store(ckpt_dtype dt, uint8_t *p, double v)
{
    switch (dt) {
    case CKPT_DT_F32: {
        float f = (float)v;
        memcpy(p, &f, 4);
        break;
    }
    case CKPT_DT_BF16: {
        uint16_t h = ckpt_f64_to_bf16(v);
        memcpy(p, &h, 2);
        break;
    }
    case CKPT_DT_F16: {
        uint16_t h = ckpt_f64_to_f16(v);
        memcpy(p, &h, 2);
        break;
    }
    case CKPT_DT_F64:
        memcpy(p, &v, 8);
        break;
    default: { /* I32 */
        int32_t i = (int32_t)v;
        memcpy(p, &i, 4);
    }
    }
}

static double load(ckpt_dtype dt, const uint8_t *p)
{
    uint16_t h;
    float f;
    switch (dt) {
    case CKPT_DT_F32:
        memcpy(&f, p, 4);
        return f;
    case CKPT_DT_BF16:
        memcpy(&h, p, 2);
        return ckpt_bf16_to_f32(h);
    case CKPT_DT_F16:
        memcpy(&h, p, 2);
        return ckpt_f16_to_f32(h);
    default: {
        double d;
        memcpy(&d, p, 8);
        return d;
    }
    }
}

typedef struct {
    const spec *specs;
    size_t n;
} write_ctx;

static int fill(void *ctx, const st_out_tensor *t, int fd, const char *path)
{
    const spec *s = &((const write_ctx *)ctx)->specs[t->user];
    size_t es = ckpt_dtype_size(s->dtype);
    uint64_t cols = s->cols ? s->cols : 1;
    uint8_t *buf = malloc(t->nbytes + 1);
    assert_non_null(buf);
    for (uint64_t r = 0; r < s->rows; r++)
        for (uint64_t c = 0; c < cols; c++)
            store(s->dtype, buf + (r * cols + c) * es, s->fn(s->tag, r, c));
    int rc = ckpt_pwrite_full(fd, buf, t->nbytes, t->offset, path);
    free(buf);
    return rc;
}

static void write_file(const char *dir, const char *file, const spec *specs, size_t n)
{
    assert_int_equal(ckpt_mkdir_p(dir, 0755), 0);
    st_layout l;
    st_layout_init(&l);
    for (size_t i = 0; i < n; i++) {
        uint64_t shape[2] = {specs[i].rows, specs[i].cols};
        assert_int_equal(
            st_layout_add(&l, specs[i].name, specs[i].dtype, specs[i].cols ? 2 : 1, shape, i), 0);
    }
    assert_int_equal(st_layout_set_meta(&l, "format", "pt"), 0);
    assert_int_equal(st_layout_finish(&l), 0);
    char *path = ckpt_path_join(dir, file);
    write_ctx ctx = {specs, n};
    assert_int_equal(st_write_file(path, &l, fill, &ctx), 0);
    free(path);
    st_layout_free(&l);
}

static void write_text(const char *dir, const char *file, const char *text)
{
    char *s = ckpt_strdup(text), *path = ckpt_path_join(dir, file);
    for (char *p = s; *p; p++)
        if (*p == '\'') *p = '"';
    assert_int_equal(ckpt_mkdir_p(dir, 0755), 0);
    assert_int_equal(ckpt_write_file_atomic(path, s, strlen(s)), 0);
    free(s);
    free(path);
}

static void write_adapter(const char *dir, const char *config, const spec *specs, size_t n)
{
    write_file(dir, "adapter_model.safetensors", specs, n);
    write_text(dir, "adapter_config.json", config);
}

/* Reads a whole tensor as doubles (malloc'd). */
static double *read_tensor(const char *dir, const char *prefix, const char *name, uint64_t *rows,
                           uint64_t *cols)
{
    ckpt_checkpoint c;
    assert_int_equal(ckpt_checkpoint_open_prefix(&c, dir, prefix), 0);
    const ckpt_tensor_ref *ref = ckpt_checkpoint_find(&c, name);
    if (!ref) fail_msg("%s: no tensor '%s'", dir, name);
    const st_tensor *t = ref->t;
    *rows = t->shape[0];
    *cols = t->ndim > 1 ? t->shape[1] : 1;
    uint8_t *raw = malloc(t->nbytes + 1);
    double *out = calloc(*rows * *cols + 1, sizeof *out);
    assert_int_equal(st_read_tensor(&c.files[ref->file], t, raw), 0);
    for (uint64_t i = 0; i < *rows * *cols; i++)
        out[i] = load(t->dtype, raw + i * ckpt_dtype_size(t->dtype));
    free(raw);
    ckpt_checkpoint_close(&c);
    return out;
}

static void assert_contains(const char *haystack, const char *needle)
{
    if (!strstr(haystack, needle)) fail_msg("message \"%s\" lacks \"%s\"", haystack, needle);
}

static void expect_files_equal(const char *a, const char *b)
{
    char *x, *y;
    size_t lx, ly;
    assert_int_equal(ckpt_read_file(a, 1u << 28, &x, &lx), 0);
    assert_int_equal(ckpt_read_file(b, 1u << 28, &y, &ly), 0);
    if (lx != ly || memcmp(x, y, lx)) fail_msg("%s and %s differ", a, b);
    free(x);
    free(y);
}

static lora_merge_opts quiet_merge(void)
{
    return (lora_merge_opts){.quiet = true};
}

/* ---- merge arithmetic ---- */

/* W: 1 + 2^-7 * (col % 2); A = [2^-4 at (0, col)], B = [2^-4 on row 0, 0 elsewhere], so
 * s * B @ A = s * 2^-8 in row 0, 0 below. */
static double tie_w(int tag, uint64_t r, uint64_t c)
{
    (void)tag, (void)r;
    return 1.0 + ldexp(1.0, -7) * (double)(c % 2);
}
static double sixteenth(int tag, uint64_t r, uint64_t c)
{
    (void)tag, (void)c;
    return tag == 'B' && r > 0 ? 0.0 : 0.0625;
}
static double half(int tag, uint64_t r, uint64_t c)
{
    (void)tag, (void)r, (void)c;
    return 0.5;
}

static const char plain_config[] =
    "{'r': 1, 'lora_alpha': 1, 'target_modules': ['proj'], 'peft_type': 'LORA', "
    "'bias': 'none', 'use_dora': false, 'lora_dropout': 0.1, 'task_type': 'CAUSAL_LM'}";

static void test_merge_bf16_ties_to_even(void **state)
{
    fixture *fx = *state;
    const spec base[] = {{"m.proj.weight", CKPT_DT_BF16, 2, 4, 0, tie_w},
                         {"m.norm.weight", CKPT_DT_BF16, 4, 0, 0, half}};
    write_file(fx->base, "model.safetensors", base, 2);
    write_text(fx->base, "config.json", "{}");
    const spec ad[] = {
        {"base_model.model.m.proj.lora_A.weight", CKPT_DT_F32, 1, 4, 'A', sixteenth},
        {"base_model.model.m.proj.lora_B.weight", CKPT_DT_F32, 2, 1, 'B', sixteenth}};
    write_adapter(fx->ad, plain_config, ad, 2);
    lora_merge_opts o = quiet_merge();
    lora_merge_stats st;
    assert_int_equal(lora_merge_run(fx->base, fx->ad, fx->dst, &o, &st), 0);
    assert_int_equal(st.modules, 1);
    assert_int_equal(st.copied, 1);
    uint64_t rows, cols;
    double *w = read_tensor(fx->dst, "model", "m.proj.weight", &rows, &cols);
    /* Row 0: 1 + 2^-8 is a tie -> 1 (even); 1 + 2^-7 + 2^-8 is a tie -> 1 + 2^-6 (even). */
    for (uint64_t c = 0; c < 4; c++)
        assert_true(w[c] == (c % 2 ? 1.0 + ldexp(1, -6) : 1.0));
    for (uint64_t c = 0; c < 4; c++)
        assert_true(w[4 + c] == tie_w(0, 1, c));
    free(w);
    char p1[700], p2[700];
    snprintf(p1, sizeof p1, "%s/config.json", fx->dst);
    snprintf(p2, sizeof p2, "%s/config.json", fx->base);
    expect_files_equal(p1, p2);

    /* --scale 3 adds 1.5 ulp (ulp = 2^-7 at 1): 1 + 1.5 ulp and 1 + 2.5 ulp are ties, both -> 1 + 2
     * ulp. */
    o.scale = 3;
    o.force = true;
    assert_int_equal(lora_merge_run(fx->base, fx->ad, fx->dst, &o, &st), 0);
    w = read_tensor(fx->dst, "model", "m.proj.weight", &rows, &cols);
    assert_true(w[0] == 1.0 + ldexp(1, -6));
    assert_true(w[1] == 1.0 + ldexp(1, -6));
    free(w);
}

static void test_merge_unmerge_f16_f32(void **state)
{
    fixture *fx = *state;
    const spec base[] = {{"m.proj.weight", CKPT_DT_F16, 2, 4, 0, tie_w},
                         {"m.other.weight", CKPT_DT_F32, 2, 4, 0, tie_w}};
    write_file(fx->base, "model.safetensors", base, 2);
    const spec ad[] = {
        {"base_model.model.m.proj.lora_A.weight", CKPT_DT_BF16, 1, 4, 'A', sixteenth},
        {"base_model.model.m.proj.lora_B.weight", CKPT_DT_F64, 2, 1, 'B', sixteenth},
        {"base_model.model.m.other.lora_A.weight", CKPT_DT_F32, 1, 4, 'A', sixteenth},
        {"base_model.model.m.other.lora_B.weight", CKPT_DT_F32, 2, 1, 'B', sixteenth}};
    write_adapter(fx->ad,
                  "{'r': 1, 'lora_alpha': 2, 'target_modules': ['proj', 'other'], 'alpha_pattern': "
                  "{'other': 4}}",
                  ad, 4);
    lora_merge_opts o = quiet_merge();
    lora_merge_stats st;
    assert_int_equal(lora_merge_run(fx->base, fx->ad, fx->dst, &o, &st), 0);
    uint64_t rows, cols;
    double *w = read_tensor(fx->dst, "model", "m.proj.weight", &rows, &cols);
    for (uint64_t c = 0; c < 4; c++)
        assert_true(w[c] == tie_w(0, 0, c) + ldexp(2, -8)); /* exact in F16 */
    free(w);
    w = read_tensor(fx->dst, "model", "m.other.weight", &rows, &cols);
    for (uint64_t c = 0; c < 4; c++)
        assert_true(w[c] == tie_w(0, 0, c) + ldexp(4, -8));
    free(w);
    o.unmerge = true;
    assert_int_equal(lora_merge_run(fx->dst, fx->ad, fx->back, &o, &st), 0);
    char p1[700], p2[700];
    snprintf(p1, sizeof p1, "%s/model.safetensors", fx->back);
    snprintf(p2, sizeof p2, "%s/model.safetensors", fx->base);
    expect_files_equal(p1, p2);
}

/* Values that make every product exact in F32: small dyadic numbers. */
static double dyadic(int tag, uint64_t r, uint64_t c)
{
    return ldexp((double)((int64_t)((r * 7 + c * 3 + (uint64_t)tag) % 17) - 8), -6);
}

/* A weight of many blocks of rows, and fan_in_fan_out: every element checked. */
static void check_many_blocks(fixture *fx, bool fan_in_fan_out)
{
    const uint64_t R = 3, OUT = 1300, IN = 1030; /* 1300 x 1030 F32 > 1 block of 4 MiB */
    uint64_t wr = fan_in_fan_out ? IN : OUT, wc = fan_in_fan_out ? OUT : IN;
    const spec base[] = {{"x.big.weight", CKPT_DT_F32, wr, wc, 1, dyadic}};
    write_file(fx->base, "model.safetensors", base, 1);
    const spec ad[] = {{"base_model.model.x.big.lora_A.weight", CKPT_DT_F32, R, IN, 2, dyadic},
                       {"base_model.model.x.big.lora_B.weight", CKPT_DT_F32, OUT, R, 3, dyadic}};
    char cfg[256];
    snprintf(cfg, sizeof cfg,
             "{'r': 3, 'lora_alpha': 6, 'target_modules': 'x\\\\.big', 'fan_in_fan_out': %s}",
             fan_in_fan_out ? "true" : "false");
    write_adapter(fx->ad, cfg, ad, 2);
    lora_merge_opts o = quiet_merge();
    o.force = true;
    o.threads = 3;
    lora_merge_stats st;
    assert_int_equal(lora_merge_run(fx->base, fx->ad, fx->dst, &o, &st), 0);
    assert_true(fabs(st.gflop - 2.0 * OUT * IN * R / 1e9) < 1e-12);
    uint64_t rows, cols;
    double *w = read_tensor(fx->dst, "model", "x.big.weight", &rows, &cols);
    assert_true(rows == wr && cols == wc);
    for (uint64_t o_ = 0; o_ < OUT; o_++) {
        for (uint64_t i = 0; i < IN; i++) {
            double d = 0;
            for (uint64_t k = 0; k < R; k++)
                d += dyadic(3, o_, k) * dyadic(2, k, i);
            uint64_t r = fan_in_fan_out ? i : o_, c = fan_in_fan_out ? o_ : i;
            double want = dyadic(1, r, c) + 2.0 * d; /* exact: few dyadic terms */
            if (w[r * wc + c] != want)
                fail_msg("element (%llu, %llu) is %.17g, expected %.17g", (unsigned long long)r,
                         (unsigned long long)c, w[r * wc + c], want);
        }
    }
    free(w);
}

static void test_merge_many_blocks(void **state)
{
    check_many_blocks(*state, false);
}

static void test_merge_fan_in_fan_out(void **state)
{
    check_many_blocks(*state, true);
}

/* ---- a fused adapter merges as its members do ---- */

/* Every cblas_sgemm call of the merge engine (the Makefile links this test
 * with -Wl,--wrap=cblas_sgemm): its shape, scalars, operand alignment and a
 * hash of each operand's values as the call sees them. */
typedef struct {
    int order, ta, tb, m, n, k, lda, ldb, ldc;
    uint32_t alpha, beta;
    unsigned align_a, align_b, align_c; /* address % 64 */
    uint64_t hash_a, hash_b, hash_c;    /* C before the call */
} gemm_call;

#define MAX_CALLS 64
static pthread_mutex_t calls_mu = PTHREAD_MUTEX_INITIALIZER;
static gemm_call calls[MAX_CALLS];
static size_t ncalls, lost_calls;

void __real_cblas_sgemm(CBLAS_LAYOUT layout, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb,
                        const blasint m, const blasint n, const blasint k, const float alpha,
                        const float *a, const blasint lda, const float *b, const blasint ldb,
                        const float beta, float *c, const blasint ldc);
void __wrap_cblas_sgemm(CBLAS_LAYOUT layout, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb,
                        const blasint m, const blasint n, const blasint k, const float alpha,
                        const float *a, const blasint lda, const float *b, const blasint ldb,
                        const float beta, float *c, const blasint ldc);

/* FNV-1a of a row-major rows x cols matrix with leading dimension ld. */
static uint64_t hash_matrix(const float *p, int rows, int cols, int ld)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < rows; i++) {
        const unsigned char *q = (const unsigned char *)(p + (size_t)i * (size_t)ld);
        for (size_t j = 0; j < (size_t)cols * sizeof *p; j++)
            h = (h ^ q[j]) * 1099511628211ull;
    }
    return h;
}

void __wrap_cblas_sgemm(CBLAS_LAYOUT layout, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb,
                        const blasint m, const blasint n, const blasint k, const float alpha,
                        const float *a, const blasint lda, const float *b, const blasint ldb,
                        const float beta, float *c, const blasint ldc)
{
    gemm_call g;
    memset(&g, 0, sizeof g); /* the padding too: records are compared with memcmp */
    g.order = layout, g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k, g.lda = lda, g.ldb = ldb,
    g.ldc = ldc;
    memcpy(&g.alpha, &alpha, 4);
    memcpy(&g.beta, &beta, 4);
    g.align_a = (unsigned)((uintptr_t)a % 64), g.align_b = (unsigned)((uintptr_t)b % 64);
    g.align_c = (unsigned)((uintptr_t)c % 64);
    bool row_major = layout == CblasRowMajor;
    if (row_major) {
        g.hash_a = ta == CblasNoTrans ? hash_matrix(a, m, k, lda) : hash_matrix(a, k, m, lda);
        g.hash_b = tb == CblasNoTrans ? hash_matrix(b, k, n, ldb) : hash_matrix(b, n, k, ldb);
        g.hash_c = hash_matrix(c, m, n, ldc);
    }
    pthread_mutex_lock(&calls_mu);
    if (ncalls < MAX_CALLS)
        calls[ncalls++] = g;
    else
        lost_calls++;
    pthread_mutex_unlock(&calls_mu);
    __real_cblas_sgemm(layout, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static int compare_calls(const void *x, const void *y)
{
    return memcmp(x, y, sizeof(gemm_call));
}

static void reset_calls(void)
{
    pthread_mutex_lock(&calls_mu);
    ncalls = lost_calls = 0;
    pthread_mutex_unlock(&calls_mu);
}

/* The calls recorded since the last reset, sorted (threads run them in any
 * order), and a reset. */
static size_t take_calls(gemm_call *out)
{
    pthread_mutex_lock(&calls_mu);
    assert_int_equal(lost_calls, 0);
    size_t n = ncalls;
    memcpy(out, calls, n * sizeof *out);
    ncalls = 0;
    pthread_mutex_unlock(&calls_mu);
    qsort(out, n, sizeof *out, compare_calls);
    return n;
}

/* q 1300 rows (two blocks of 1018 rows at 1030 columns), k 300, v 700. */
enum { FQ = 1300, FK = 300, FV = 700, FIN = 1030, FRQ = 3, FRV = 2, V_ZERO_ROW = 100 };
enum { T_WQ = 1, T_WK, T_WV, T_WQKV, T_AQ, T_BQ, T_AV, T_BV, T_AQKV, T_BQKV };

/* Values whose sums depend on their order: 24 random bits in [-1, 1). */
static double noise(int tag, uint64_t r, uint64_t c)
{
    uint64_t x = ((uint64_t)tag << 48) ^ (r << 24) ^ c;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    return ldexp((double)(x >> 40), -23) - 1.0;
}

/* The members' weights and adapter, and the fused ones: W_qkv = [W_q; W_k; W_v],
 * A_qkv = [A_q; A_v], B_qkv = diag(B_q, B_v) with zero k rows. Row V_ZERO_ROW of
 * B_v is zero; W_k(5, 7) and W_v(V_ZERO_ROW, 3) are -0. */
static double fused_value(int tag, uint64_t r, uint64_t c)
{
    switch (tag) {
    case T_WQKV:
        if (r < FQ) return fused_value(T_WQ, r, c);
        return r < FQ + FK ? fused_value(T_WK, r - FQ, c) : fused_value(T_WV, r - FQ - FK, c);
    case T_AQKV:
        return r < FRQ ? fused_value(T_AQ, r, c) : fused_value(T_AV, r - FRQ, c);
    case T_BQKV:
        if (r < FQ) return c < FRQ ? fused_value(T_BQ, r, c) : 0.0;
        return r < FQ + FK || c < FRQ ? 0.0 : fused_value(T_BV, r - FQ - FK, c - FRQ);
    case T_WK:
        return r == 5 && c == 7 ? -0.0 : noise(tag, r, c);
    case T_WV:
        return r == V_ZERO_ROW && c == 3 ? -0.0 : noise(tag, r, c);
    case T_BV:
        return r == V_ZERO_ROW ? 0.0 : noise(tag, r, c) / 8;
    default:
        return tag == T_BQ || tag == T_AQ || tag == T_AV ? noise(tag, r, c) / 8 : noise(tag, r, c);
    }
}

/* Reads a whole F32 tensor's floats (malloc'd). */
static float *read_floats(const char *dir, const char *name, uint64_t *n)
{
    uint64_t rows, cols;
    double *d = read_tensor(dir, "model", name, &rows, &cols);
    float *f = malloc(rows * cols * sizeof *f + 1);
    assert_non_null(f);
    for (uint64_t i = 0; i < rows * cols; i++)
        f[i] = (float)d[i]; /* exact: the values were F32 */
    free(d);
    *n = rows * cols;
    return f;
}

static void test_merge_fused_equals_members(void **state)
{
    fixture *fx = *state;
    char fbase[700], fad[700], fdst[700];
    snprintf(fbase, sizeof fbase, "%s/fused-base", fx->root);
    snprintf(fad, sizeof fad, "%s/fused-adapter", fx->root);
    snprintf(fdst, sizeof fdst, "%s/fused-merged", fx->root);
    const spec base[] = {{"m.q.weight", CKPT_DT_F32, FQ, FIN, T_WQ, fused_value},
                         {"m.k.weight", CKPT_DT_F32, FK, FIN, T_WK, fused_value},
                         {"m.v.weight", CKPT_DT_F32, FV, FIN, T_WV, fused_value}};
    write_file(fx->base, "model.safetensors", base, 3);
    const spec ad[] = {
        {"base_model.model.m.q.lora_A.weight", CKPT_DT_F32, FRQ, FIN, T_AQ, fused_value},
        {"base_model.model.m.q.lora_B.weight", CKPT_DT_F32, FQ, FRQ, T_BQ, fused_value},
        {"base_model.model.m.v.lora_A.weight", CKPT_DT_F32, FRV, FIN, T_AV, fused_value},
        {"base_model.model.m.v.lora_B.weight", CKPT_DT_F32, FV, FRV, T_BV, fused_value}};
    write_adapter(
        fx->ad,
        "{'r': 2, 'lora_alpha': 4, 'target_modules': ['q', 'v'], 'rank_pattern': {'q': 3}, "
        "'alpha_pattern': {'q': 6}}",
        ad, 4);
    const spec fb[] = {{"m.qkv.weight", CKPT_DT_F32, FQ + FK + FV, FIN, T_WQKV, fused_value}};
    write_file(fbase, "model.safetensors", fb, 1);
    const spec fa[] = {
        {"base_model.model.m.qkv.lora_A.weight", CKPT_DT_F32, FRQ + FRV, FIN, T_AQKV, fused_value},
        {"base_model.model.m.qkv.lora_B.weight", CKPT_DT_F32, FQ + FK + FV, FRQ + FRV, T_BQKV,
         fused_value}};
    write_adapter(fad, "{'r': 5, 'lora_alpha': 10, 'target_modules': ['qkv']}", fa, 2);

    gemm_call members[MAX_CALLS], fused[MAX_CALLS];
    lora_merge_opts o = quiet_merge();
    lora_merge_stats st, fst;
    reset_calls();
    assert_int_equal(lora_merge_run(fx->base, fx->ad, fx->dst, &o, &st), 0);
    size_t nm = take_calls(members);
    o.threads = 3;
    assert_int_equal(lora_merge_run(fbase, fad, fdst, &o, &fst), 0);
    size_t nf = take_calls(fused);

    /* The same calls: q's two blocks with K = 3, v's rows before and after its
     * zero row with K = 2; the k rows and v's zero row are not computed. */
    assert_int_equal(nm, 4);
    assert_int_equal(nf, nm);
    for (size_t i = 0; i < nm; i++) {
        if (memcmp(&members[i], &fused[i], sizeof members[i]))
            fail_msg("GEMM call %zu differs: members M %d N %d K %d ld %d/%d/%d, fused M %d N %d K "
                     "%d ld "
                     "%d/%d/%d",
                     i, members[i].m, members[i].n, members[i].k, members[i].lda, members[i].ldb,
                     members[i].ldc, fused[i].m, fused[i].n, fused[i].k, fused[i].lda, fused[i].ldb,
                     fused[i].ldc);
        assert_true(members[i].align_a == 0 && members[i].align_b == 0 && members[i].align_c == 0);
    }
    double want = 2.0 * FIN * (FQ * FRQ + (FV - 1) * FRV) / 1e9;
    assert_true(fabs(st.gflop - want) < 1e-12 && fabs(fst.gflop - want) < 1e-12);

    /* So the same bytes: merged qkv = [merged q; k; merged v]. */
    uint64_t n, nq, nk, nv, nk0, nv0;
    float *w = read_floats(fdst, "m.qkv.weight", &n);
    float *q = read_floats(fx->dst, "m.q.weight", &nq),
          *k = read_floats(fx->dst, "m.k.weight", &nk);
    float *v = read_floats(fx->dst, "m.v.weight", &nv),
          *k0 = read_floats(fx->base, "m.k.weight", &nk0);
    float *v0 = read_floats(fx->base, "m.v.weight", &nv0);
    assert_true(n == nq + nk + nv);
    if (memcmp(w, q, nq * 4) || memcmp(w + nq, k, nk * 4) || memcmp(w + nq + nk, v, nv * 4))
        fail_msg("merging the fused adapter does not give the bytes of merging its members");
    /* Rows without an update keep their bytes, -0 included: k (no adapter), v's zero row of B. */
    assert_memory_equal(w + nq, k0, nk * 4);
    assert_true(signbit(w[nq + 5 * FIN + 7]) && w[nq + 5 * FIN + 7] == 0);
    assert_memory_equal(v + V_ZERO_ROW * FIN, v0 + V_ZERO_ROW * FIN, FIN * 4);
    assert_true(signbit(v[V_ZERO_ROW * FIN + 3]));
    assert_true(memcmp(v, v0, V_ZERO_ROW * FIN * 4) != 0); /* the rows around it did change */
    free(w), free(q), free(k), free(v), free(k0), free(v0);
}

/* ---- the adapter reader ---- */

static double zero(int tag, uint64_t r, uint64_t c)
{
    (void)tag, (void)r, (void)c;
    return 0;
}

static void write_attn_adapter(fixture *fx, const char *config, uint64_t rq, uint64_t rv)
{
    const spec ad[] = {
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", CKPT_DT_F32, rq, 16, 0,
         zero},
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", CKPT_DT_F32, 32, rq, 0,
         zero},
        {"base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight", CKPT_DT_F32, rv, 16, 0,
         zero},
        {"base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight", CKPT_DT_F32, 8, rv, 0,
         zero},
    };
    write_adapter(fx->ad, config, ad, 4);
}

static void test_reader_patterns_and_scales(void **state)
{
    fixture *fx = *state;
    write_attn_adapter(
        fx,
        "{'r': 4, 'lora_alpha': 8, 'target_modules': ['q_proj', 'v_proj'], "
        "'rank_pattern': {'v_proj': 2}, 'alpha_pattern': {'layers.0.self_attn.v_proj': 3, "
        "'v_proj': 100, 'model.layers.0.self_attn.q_proj': 16}}",
        4, 2);
    lora_adapter a;
    assert_int_equal(lora_adapter_open(&a, fx->ad), 0);
    assert_int_equal(a.nmods, 2);
    const lora_module *q = lora_adapter_find(&a, "model.layers.0.self_attn.q_proj");
    const lora_module *v = lora_adapter_find(&a, "model.layers.0.self_attn.v_proj");
    assert_non_null(q);
    assert_non_null(v);
    assert_true(q->rank == 4 && q->alpha == 16 && q->scale == 4.0); /* exact key */
    assert_true(v->rank == 2 && v->alpha == 3 && v->scale == 1.5);  /* first matching key */
    assert_true(lora_adapter_targets(&a, "model.layers.3.self_attn.q_proj"));
    assert_false(
        lora_adapter_targets(&a, "model.layers.3.self_attn.xq_proj")); /* suffix at a dot only */
    lora_adapter_free(&a);

    write_attn_adapter(
        fx, "{'r': 4, 'lora_alpha': 8, 'use_rslora': true, 'target_modules': '.*\\\\.(q|v)_proj'}",
        4, 4);
    assert_int_equal(lora_adapter_open(&a, fx->ad), 0);
    assert_true(a.mods[0].scale == 4.0); /* 8 / sqrt(4) */
    assert_true(lora_adapter_targets(&a, "model.layers.0.self_attn.q_proj"));
    assert_false(lora_adapter_targets(&a, "model.layers.0.self_attn.q_proj.x")); /* a full match */
    lora_adapter_free(&a);

    write_attn_adapter(fx, "{'r': 4, 'lora_alpha': 8, 'target_modules': 'all-linear'}", 4, 4);
    assert_int_equal(lora_adapter_open(&a, fx->ad), 0);
    assert_true(lora_adapter_targets(&a, "model.layers.0.mlp.down_proj"));
    assert_false(lora_adapter_targets(&a, "lm_head"));
    assert_false(lora_adapter_targets(&a, "model.embed_tokens"));
    lora_adapter_free(&a);
}

static void expect_open_error(fixture *fx, const char *config, uint64_t rq, const char *needle)
{
    write_attn_adapter(fx, config, rq, 4);
    lora_adapter a;
    assert_true(lora_adapter_open(&a, fx->ad) < 0);
    assert_contains(ckpt_error_last(), needle);
}

static void test_reader_errors(void **state)
{
    fixture *fx = *state;
    expect_open_error(fx, "{'lora_alpha': 8, 'target_modules': ['q_proj']}", 4,
                      "missing field 'r'");
    expect_open_error(fx, "{'r': 4, 'target_modules': ['q_proj']}", 4,
                      "missing field 'lora_alpha'");
    expect_open_error(fx, "{'r': 4, 'lora_alpha': 8}", 4, "missing field 'target_modules'");
    expect_open_error(fx, "{'r': 0, 'lora_alpha': 8, 'target_modules': ['q_proj']}", 4,
                      "'r' must be an integer");
    expect_open_error(fx, "{'r': 4, 'lora_alpha': 'x', 'target_modules': ['q_proj']}", 4,
                      "'lora_alpha' must be");
    expect_open_error(fx, "{'r': 4, 'lora_alpha': 8, 'target_modules': []}", 4,
                      "'target_modules' must be");
    expect_open_error(fx, "{'r': 4, 'lora_alpha': 8, 'target_modules': ['q'], 'colour': 1}", 4,
                      "unknown field 'colour'");
    expect_open_error(
        fx, "{'r': 4, 'lora_alpha': 8, 'target_modules': ['q'], 'modules_to_save': ['lm_head']}", 4,
        "'modules_to_save' is [\"lm_head\"]");
    expect_open_error(fx, "{'r': 4, 'lora_alpha': 8, 'target_modules': ['q'], 'peft_type': 'LOHA'}",
                      4, "peft_type is 'LOHA'");
    expect_open_error(
        fx, "{'r': 4, 'lora_alpha': 8, 'target_modules': ['q'], 'rank_pattern': {'v': 0}}", 4,
        "rank_pattern['v'] must be");
    expect_open_error(
        fx, "{'r': 4, 'lora_alpha': 8, 'target_modules': ['q'], 'alpha_pattern': {'(': 1}}", 4,
        "bad regex");
    expect_open_error(fx, "{'r': 4, 'lora_alpha': 8, 'target_modules': '(x'}", 4, "bad regex '(x'");
    expect_open_error(
        fx, "{'r': 4, 'lora_alpha': 8, 'target_modules': ['q_proj', 'v_proj']}", 3,
        "module 'model.layers.0.self_attn.q_proj' has rank 3 but adapter_config.json says r = 4");
    expect_open_error(fx, "[1]", 4, "must be a JSON object");
    /* Tensors the reader cannot place. */
    const spec odd[] = {{"base_model.model.x.lora_embedding_A", CKPT_DT_F32, 2, 2, 0, zero}};
    write_adapter(fx->ad, "{'r': 2, 'lora_alpha': 2, 'target_modules': ['x']}", odd, 1);
    lora_adapter a;
    assert_true(lora_adapter_open(&a, fx->ad) < 0);
    assert_contains(ckpt_error_last(), "tensor 'base_model.model.x.lora_embedding_A' is not");
    const spec ints[] = {{"base_model.model.x.lora_A.weight", CKPT_DT_I32, 2, 2, 0, zero},
                         {"base_model.model.x.lora_B.weight", CKPT_DT_F32, 2, 2, 0, zero}};
    write_adapter(fx->ad, "{'r': 2, 'lora_alpha': 2, 'target_modules': ['x']}", ints, 2);
    assert_true(lora_adapter_open(&a, fx->ad) < 0);
    assert_contains(ckpt_error_last(), "has dtype I32; LoRA weights must be");
}

static void test_merge_base_errors(void **state)
{
    fixture *fx = *state;
    const spec base[] = {{"m.proj.weight", CKPT_DT_F64, 2, 4, 0, tie_w},
                         {"m.ints.weight", CKPT_DT_I32, 2, 4, 0, zero}};
    write_file(fx->base, "model.safetensors", base, 2);
    const spec ad[] = {
        {"base_model.model.m.proj.lora_A.weight", CKPT_DT_F32, 1, 4, 'A', sixteenth},
        {"base_model.model.m.proj.lora_B.weight", CKPT_DT_F32, 2, 1, 'B', sixteenth}};
    write_adapter(fx->ad, plain_config, ad, 2);
    lora_merge_opts o = quiet_merge();
    lora_merge_stats st;
    assert_true(lora_merge_run(fx->base, fx->ad, fx->dst, &o, &st) < 0);
    assert_contains(ckpt_error_last(), "base tensor 'm.proj.weight' has dtype F64");
    assert_false(ckpt_exists(fx->dst));
    const spec ad2[] = {
        {"base_model.model.m.gone.lora_A.weight", CKPT_DT_F32, 1, 4, 'A', sixteenth},
        {"base_model.model.m.gone.lora_B.weight", CKPT_DT_F32, 2, 1, 'B', sixteenth}};
    write_adapter(fx->ad, "{'r': 1, 'lora_alpha': 1, 'target_modules': ['gone']}", ad2, 2);
    assert_true(lora_merge_run(fx->base, fx->ad, fx->dst, &o, &st) < 0);
    assert_contains(ckpt_error_last(), "adapter module 'm.gone': the base");
    assert_contains(ckpt_error_last(), "has no tensor 'm.gone.weight'");
    assert_false(ckpt_exists(fx->dst));
}

/* ---- the neuron layout of docs/transforms.md §4's worked example ---- */

/* Element (row, col) of tensor `tag` is tag * 10000 + row * 100 + col: says where it comes from. */
static double where(int tag, uint64_t r, uint64_t c)
{
    return tag * 10000.0 + (double)r * 100.0 + (double)c;
}

enum { TAG_AQ = 1, TAG_BQ, TAG_AK, TAG_BK, TAG_AV, TAG_BV, TAG_AO, TAG_BO };

static void test_neuron_worked_example(void **state)
{
    fixture *fx = *state;
    /* H=8, KV=2, hd=4, hidden=16, tp=4: rank 1 has q heads [4, 5], kv head 1. */
    const spec base[] = {{"model.layers.0.self_attn.q_proj.weight", CKPT_DT_F32, 32, 16, 11, where},
                         {"model.layers.0.self_attn.k_proj.weight", CKPT_DT_F32, 8, 16, 12, where},
                         {"model.layers.0.self_attn.v_proj.weight", CKPT_DT_F32, 8, 16, 13, where},
                         {"model.layers.0.self_attn.o_proj.weight", CKPT_DT_F32, 16, 32, 14, where},
                         {"model.norm.weight", CKPT_DT_F32, 16, 0, 15, where}};
    write_file(fx->base, "model.safetensors", base, 5);
    write_text(fx->base, "config.json",
               "{'model_type': 'llama', 'num_attention_heads': 8, 'num_key_value_heads': 2, "
               "'hidden_size': 16, "
               "'head_dim': 4}");
    const uint64_t r = 2;
    const spec ad[] = {
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", CKPT_DT_F32, r, 16,
         TAG_AQ, where},
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", CKPT_DT_F32, 32, r,
         TAG_BQ, where},
        {"base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight", CKPT_DT_F32, r, 16,
         TAG_AK, where},
        {"base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight", CKPT_DT_F32, 8, r,
         TAG_BK, where},
        {"base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight", CKPT_DT_F32, r, 16,
         TAG_AV, where},
        {"base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight", CKPT_DT_F32, 8, r,
         TAG_BV, where},
        {"base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight", CKPT_DT_F32, r, 32,
         TAG_AO, where},
        {"base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight", CKPT_DT_F32, 16, r,
         TAG_BO, where},
    };
    write_adapter(
        fx->ad,
        "{'r': 2, 'lora_alpha': 4, 'target_modules': ['q_proj', 'k_proj', 'v_proj', 'o_proj']}", ad,
        8);
    convert_opts o = {.layout = "neuron", .tp = 4, .quiet = true};
    assert_int_equal(lora_convert_run(fx->ad, fx->base, fx->dst, &o), 0);

    char rank1[700];
    snprintf(rank1, sizeof rank1, "%s/tp_rank_01", fx->dst);
    uint64_t rows, cols;
    double *a = read_tensor(rank1, "adapter_model",
                            "base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight",
                            &rows, &cols);
    assert_true(rows == 3 * r && cols == 16);
    const int atags[3] = {TAG_AQ, TAG_AK, TAG_AV};
    for (uint64_t i = 0; i < rows; i++)
        for (uint64_t j = 0; j < cols; j++)
            assert_true(a[i * cols + j] == where(atags[i / r], i % r, j));
    free(a);
    double *b = read_tensor(rank1, "adapter_model",
                            "base_model.model.model.layers.0.self_attn.qkv_proj.lora_B.weight",
                            &rows, &cols);
    assert_true(rows == 16 && cols == 3 * r);
    for (uint64_t i = 0; i < rows; i++) {
        /* rows 0..7: q rows 16..23 (heads 4, 5); 8..11: k rows 4..7; 12..15: v rows 4..7 */
        int block = i < 8 ? 0 : i < 12 ? 1 : 2;
        uint64_t src_row = block == 0 ? 16 + i : 4 + (i - (block == 1 ? 8 : 12));
        int tag = block == 0 ? TAG_BQ : block == 1 ? TAG_BK : TAG_BV;
        for (uint64_t j = 0; j < cols; j++) {
            double want = j / r == (uint64_t)block ? where(tag, src_row, j % r) : 0.0;
            if (b[i * cols + j] != want)
                fail_msg("B_qkv rank 1 (%llu, %llu) = %g, want %g", (unsigned long long)i,
                         (unsigned long long)j, b[i * cols + j], want);
        }
    }
    free(b);
    a = read_tensor(rank1, "adapter_model",
                    "base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight", &rows, &cols);
    assert_true(rows == r && cols == 8);
    for (uint64_t i = 0; i < rows; i++)
        for (uint64_t j = 0; j < cols; j++)
            assert_true(a[i * cols + j] == where(TAG_AO, i, 16 + j));
    free(a);
    b = read_tensor(rank1, "adapter_model",
                    "base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight", &rows, &cols);
    assert_true(rows == 16 && cols == r);
    for (uint64_t i = 0; i < rows * cols; i++)
        assert_true(b[i] == where(TAG_BO, i / r, i % r));
    free(b);

    /* ckpt-layout.json: A_qkv and B_o are stored once for all ranks; B_qkv and A_o split. */
    json_t *layout;
    char path[700];
    snprintf(path, sizeof path, "%s/ckpt-layout.json", fx->dst);
    assert_int_equal(cj_load_file(&layout, path, 1u << 26), 0);
    json_t *params = json_object_get(layout, "parameters");
    assert_int_equal(
        json_integer_value(json_object_get(
            json_object_get(params,
                            "base_model.model.model.layers.0.self_attn.qkv_proj.lora_B.weight"),
            "partition_dim")),
        0);
    assert_int_equal(
        json_integer_value(json_object_get(
            json_object_get(params,
                            "base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight"),
            "partition_dim")),
        1);
    assert_null(json_object_get(
        params, "base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight"));
    json_decref(layout);

    /* The converted config keeps the scale: qkv has rank 6 and alpha 12. */
    json_t *cfg;
    snprintf(path, sizeof path, "%s/adapter_config.json", fx->dst);
    assert_int_equal(cj_load_file(&cfg, path, 1u << 20), 0);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(cfg, "rank_pattern"), "qkv_proj")), 6);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(cfg, "alpha_pattern"), "qkv_proj")), 12);
    json_decref(cfg);

    consolidate_opts co = {.quiet = true};
    assert_int_equal(consolidate_run(fx->dst, fx->back, &co), 0);
    char p1[700], p2[700];
    snprintf(p1, sizeof p1, "%s/adapter_model.safetensors", fx->back);
    snprintf(p2, sizeof p2, "%s/adapter_model.safetensors", fx->ad);
    expect_files_equal(p1, p2);
    snprintf(p1, sizeof p1, "%s/adapter_config.json", fx->back);
    snprintf(p2, sizeof p2, "%s/adapter_config.json", fx->ad);
    expect_files_equal(p1, p2);

    /* Layout errors: --dtype, a layout that drops an adapted weight, one that transposes. */
    char none[700];
    snprintf(none, sizeof none, "%s/none", fx->root);
    o.dtype = "bf16";
    assert_true(lora_convert_run(fx->ad, fx->base, none, &o) < 0);
    assert_contains(ckpt_error_last(), "--dtype does not apply");
    char rules[700];
    snprintf(rules, sizeof rules, "%s/rules.json", fx->root);
    write_text(fx->root, "rules.json", "{'rules': [{'op': 'drop', 'pattern': 'q_proj'}]}");
    o = (convert_opts){.rules_file = rules, .quiet = true};
    assert_true(lora_convert_run(fx->ad, fx->base, none, &o) < 0);
    assert_contains(ckpt_error_last(), "drops 'model.layers.0.self_attn.q_proj.weight'");
    o.rules_file = NULL;
    o.layout = "easydel";
    assert_true(lora_convert_run(fx->ad, fx->base, none, &o) < 0);
    assert_contains(ckpt_error_last(), "transposed or stacked");
    assert_false(ckpt_exists(none));
}

/* ---- the lora_merge rule ---- */

/* rules_parse of {"rules": [<rule_json>]} (single quotes for double) fails with needle. */
static void expect_rule_error(const char *rule_json, const char *needle)
{
    char *text = ckpt_sprintf("{'rules': [{'op': 'drop', 'pattern': 'x'}, %s]}", rule_json);
    for (char *p = text; *p; p++)
        if (*p == '\'') *p = '"';
    json_error_t jerr;
    json_t *doc = json_loads(text, 0, &jerr);
    if (!doc) fail_msg("bad test JSON %s: %s", text, jerr.text);
    rules_doc d;
    assert_true(rules_parse(&d, doc, "rules.json") < 0);
    assert_contains(ckpt_error_last(), "rules.json: rule 2 (lora_merge): ");
    assert_contains(ckpt_error_last(), needle);
    json_decref(doc);
    free(text);
}

static void test_rule_parse_errors(void **state)
{
    fixture *fx = *state;
    const spec ad[] = {
        {"base_model.model.m.proj.lora_A.weight", CKPT_DT_F32, 1, 4, 'A', sixteenth},
        {"base_model.model.m.proj.lora_B.weight", CKPT_DT_F32, 2, 1, 'B', sixteenth}};
    write_adapter(fx->ad, plain_config, ad, 2);
    char text[1024];
    expect_rule_error("{'op': 'lora_merge'}", "missing 'adapter'");
    expect_rule_error("{'op': 'lora_merge', 'adapter': ''}", "'adapter' must be the path");
    expect_rule_error("{'op': 'lora_merge', 'adapter': 3}", "'adapter' must be the path");
    snprintf(text, sizeof text, "{'op': 'lora_merge', 'adapter': '%s/missing'}", fx->root);
    expect_rule_error(text, "not a directory (expected a PEFT adapter)");
    snprintf(text, sizeof text, "{'op': 'lora_merge', 'adapter': '%s'}", fx->root);
    expect_rule_error(text, "no adapter_config.json here");
    snprintf(text, sizeof text, "{'op': 'lora_merge', 'adapter': '%s', 'scale': 0}", fx->ad);
    expect_rule_error(text, "'scale' must be a finite, non-zero number");
    snprintf(text, sizeof text, "{'op': 'lora_merge', 'adapter': '%s', 'scale': '2'}", fx->ad);
    expect_rule_error(text, "'scale' must be a finite, non-zero number");
    snprintf(text, sizeof text, "{'op': 'lora_merge', 'adapter': '%s', 'scale': null}", fx->ad);
    expect_rule_error(text, "'scale' must be a finite, non-zero number");
    snprintf(text, sizeof text, "{'op': 'lora_merge', 'adapter': '%s', 'unmerge': 'yes'}", fx->ad);
    expect_rule_error(text, "'unmerge' must be true or false");
    snprintf(text, sizeof text, "{'op': 'lora_merge', 'adapter': '%s', 'alpha': 2}", fx->ad);
    expect_rule_error(text, "unknown field 'alpha'");
    snprintf(text, sizeof text, "{'op': 'lora_merge', 'adapter': '%s', 'pattern': '('}", fx->ad);
    expect_rule_error(text, "bad regex '('");
}

/* Converts base with the rules text into out (NULL: only plans, expecting an error with needle). */
static int convert_with_rules(fixture *fx, const char *rules_text, const char *out)
{
    char path[700];
    snprintf(path, sizeof path, "%s/rules.json", fx->root);
    write_text(fx->root, "rules.json", rules_text);
    convert_opts o = {.rules_file = path, .quiet = true};
    convert_plan cp;
    int rc = convert_plan_build(&cp, fx->base, &o);
    if (rc) return rc;
    rc = out ? convert_write(&cp, out, &o) : 0;
    convert_plan_free(&cp);
    return rc;
}

static void test_rule_merge_in_conversion(void **state)
{
    fixture *fx = *state;
    const spec base[] = {{"m.proj.weight", CKPT_DT_BF16, 2, 4, 0, tie_w},
                         {"m.other.weight", CKPT_DT_F32, 2, 4, 0, tie_w},
                         {"m.norm.weight", CKPT_DT_BF16, 4, 0, 0, half}};
    write_file(fx->base, "model.safetensors", base, 3);
    write_text(fx->base, "config.json", "{}");
    const spec ad[] = {
        {"base_model.model.m.proj.lora_A.weight", CKPT_DT_F32, 1, 4, 'A', sixteenth},
        {"base_model.model.m.proj.lora_B.weight", CKPT_DT_F32, 2, 1, 'B', sixteenth}};
    write_adapter(fx->ad, plain_config, ad, 2);

    /* merge-lora --scale 3, then an hf layout that splits proj's rows in two ranks. */
    lora_merge_opts mo = quiet_merge();
    mo.scale = 3;
    lora_merge_stats st;
    assert_int_equal(lora_merge_run(fx->base, fx->ad, fx->back, &mo, &st), 0);
    char rules[2048], conv[700], merged_conv[700];
    snprintf(conv, sizeof conv, "%s/conv", fx->root);
    snprintf(merged_conv, sizeof merged_conv, "%s/merged-conv", fx->root);
    const char *split = "{'op': 'tp_split', 'pattern': 'proj', 'axis': 0}";
    snprintf(rules, sizeof rules, "{'tp': 2, 'rules': [%s]}", split);
    char path[700];
    snprintf(path, sizeof path, "%s/split.json", fx->root);
    write_text(fx->root, "split.json", rules);
    convert_opts o = {.rules_file = path, .quiet = true};
    convert_plan cp;
    assert_int_equal(convert_plan_build(&cp, fx->back, &o), 0);
    assert_int_equal(convert_write(&cp, merged_conv, &o), 0);
    convert_plan_free(&cp);
    snprintf(rules, sizeof rules, "{'tp': 2, 'rules': [{'op': 'lora_merge', 'adapter': '%s', 'scale': 3}, %s]}",
             fx->ad, split);
    assert_int_equal(convert_with_rules(fx, rules, conv), 0);
    char p1[800], p2[800];
    for (int r = 0; r < 2; r++) {
        snprintf(p1, sizeof p1, "%s/tp_rank_%02d/model.safetensors", conv, r);
        snprintf(p2, sizeof p2, "%s/tp_rank_%02d/model.safetensors", merged_conv, r);
        expect_files_equal(p1, p2);
    }
    /* Rank 0 holds row 0, the merged row: ties to even as in test_merge_bf16_ties_to_even. */
    snprintf(p1, sizeof p1, "%s/tp_rank_00", conv);
    uint64_t rows, cols;
    double *w = read_tensor(p1, "model", "m.proj.weight", &rows, &cols);
    assert_true(rows == 1 && cols == 4);
    assert_true(w[0] == 1.0 + ldexp(1, -6) && w[1] == 1.0 + ldexp(1, -6));
    free(w);
    /* No staging file is left; ckpt-layout.json records the adapter and its files' sha256. */
    snprintf(p1, sizeof p1, "%s/.lora-merged", conv);
    assert_false(ckpt_exists(p1));
    snprintf(p1, sizeof p1, "%s/ckpt-layout.json", conv);
    json_t *layout;
    assert_int_equal(cj_load_file(&layout, p1, 1u << 24), 0);
    json_t *lm = json_array_get(json_object_get(layout, "lora_merge"), 0);
    assert_non_null(lm);
    assert_string_equal(json_string_value(json_object_get(lm, "adapter")), fx->ad);
    assert_true(json_real_value(json_object_get(lm, "scale")) == 3.0);
    json_t *files = json_object_get(lm, "files");
    assert_int_equal(json_array_size(files), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(files, 1), "name")),
                        "adapter_model.safetensors");
    assert_int_equal(strlen(json_string_value(json_object_get(json_array_get(files, 1), "sha256"))), 64);
    json_t *ts = json_object_get(lm, "tensors");
    assert_int_equal(json_array_size(ts), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(ts, 0), "name")), "m.proj.weight");
    json_decref(layout);
    /* Consolidation gives the merged checkpoint in the original layout. */
    char back2[700];
    snprintf(back2, sizeof back2, "%s/back2", fx->root);
    consolidate_opts co = {.quiet = true};
    assert_int_equal(consolidate_run(conv, back2, &co), 0);
    snprintf(p1, sizeof p1, "%s/model.safetensors", back2);
    snprintf(p2, sizeof p2, "%s/model.safetensors", fx->back);
    expect_files_equal(p1, p2);

    /* A second rule unmerging the same adapter reads the first's result: the same bytes as
     * merge-lora then unmerge-lora. */
    char twice[700], tw_conv[700];
    snprintf(twice, sizeof twice, "%s/twice", fx->root);
    snprintf(tw_conv, sizeof tw_conv, "%s/tw-conv", fx->root);
    mo.unmerge = true;
    assert_int_equal(lora_merge_run(fx->back, fx->ad, twice, &mo, &st), 0);
    snprintf(rules, sizeof rules,
             "{'rules': [{'op': 'lora_merge', 'adapter': '%s', 'scale': 3}, "
             "{'op': 'lora_merge', 'adapter': '%s', 'scale': 3, 'unmerge': true, 'pattern': 'proj'}]}",
             fx->ad, fx->ad);
    assert_int_equal(convert_with_rules(fx, rules, tw_conv), 0);
    snprintf(p1, sizeof p1, "%s/model.safetensors", tw_conv);
    snprintf(p2, sizeof p2, "%s/model.safetensors", twice);
    expect_files_equal(p1, p2);

    /* Apply errors name the rule and the tensor. */
    snprintf(rules, sizeof rules, "{'rules': [{'op': 'transpose', 'pattern': 'proj'}, {'op': 'lora_merge', "
                                  "'adapter': '%s'}]}", fx->ad);
    assert_true(convert_with_rules(fx, rules, NULL) < 0);
    assert_contains(ckpt_error_last(), "rule 2 (lora_merge): tensor 'm.proj.weight' was reshaped by an earlier rule");
    snprintf(rules, sizeof rules, "{'rules': [{'op': 'cast', 'dtype': 'f32'}, {'op': 'lora_merge', "
                                  "'adapter': '%s'}]}", fx->ad);
    assert_true(convert_with_rules(fx, rules, NULL) < 0);
    assert_contains(ckpt_error_last(), "rule 2 (lora_merge): tensor 'm.proj.weight' is F32 but its source");
    snprintf(rules, sizeof rules, "{'rules': [{'op': 'rename', 'pattern': 'proj', 'replacement': 'p'}, "
                                  "{'op': 'lora_merge', 'adapter': '%s'}]}", fx->ad);
    assert_true(convert_with_rules(fx, rules, NULL) < 0);
    assert_contains(ckpt_error_last(), "rule 2 (lora_merge): adapter module 'm.proj' has no tensor 'm.proj.weight'");
    snprintf(rules, sizeof rules, "{'rules': [{'op': 'lora_merge', 'adapter': '%s', 'pattern': 'other'}]}", fx->ad);
    assert_true(convert_with_rules(fx, rules, NULL) < 0);
    assert_contains(ckpt_error_last(), "rule 1 (lora_merge): pattern 'other' matches none");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_merge_bf16_ties_to_even, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_merge_unmerge_f16_f32, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_merge_many_blocks, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_merge_fan_in_fan_out, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_merge_fused_equals_members, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_reader_patterns_and_scales, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_reader_errors, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_merge_base_errors, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_neuron_worked_example, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_rule_parse_errors, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_rule_merge_in_conversion, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

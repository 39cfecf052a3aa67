/*
 * test_state.c — training states (state/state.c, state/state_load.c,
 * transform/state_convert.c).
 *
 * 1. Save and load: an exact round trip for every dtype (one file and
 *    sharded), zero-copy mapped tensors, casts on save and on load against
 *    bit patterns worked out by hand from docs/transforms.md §6's rounding, a process
 *    killed (SIGKILL) at every named step of a save leaving the previous state
 *    whole (or the new one once committed),
 *    and bad input — an optimizer tensor naming a missing parameter, a future
 *    version, a truncated shard, ... — refused with a clear error and nothing
 *    loaded.
 * 2. Loading one tensor-parallel rank of a layout: the tensors equal what
 *    `ckpt convert` writes for that rank (optimizer included), and the bytes
 *    read (/proc/self/io rchar) stay within 1.2x those tensors plus headers.
 * 3. States through convert and consolidate: per-rank states saved by a
 *    tensor-parallel job consolidate into one state, optimizer included.
 *
 * Each test works in a fresh directory under $TMPDIR (or /tmp).
 */
#include "common/error.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/util.h"
#include "state/state.h"
#include "transform/convert.h"
#include "fixtures/genmodel.h"

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/support/scratch.h"

/* ---- fixture and helpers ---- */

#define OK(call)                                                                                   \
    do {                                                                                           \
        if ((call) < 0) fail_msg("%s: %s", #call, ckpt_error_last());                              \
    } while (0)

static char *join(const char *a, const char *b)
{
    char *p = ckpt_path_join(a, b);
    assert_non_null(p);
    return p;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void fill_random(void *p, size_t n, uint64_t seed)
{
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)splitmix(&seed);
}

static void write_text(const char *dir, const char *name, const char *text)
{
    char *p = join(dir, name);
    OK(ckpt_write_file_atomic(p, text, strlen(text)));
    free(p);
}

static char *read_text(const char *dir, const char *name)
{
    char *p = join(dir, name), *text;
    OK(ckpt_read_file(p, 1u << 30, &text, NULL));
    free(p);
    return text;
}

static bool has_file(const char *dir, const char *name)
{
    char *p = join(dir, name);
    bool yes = ckpt_exists(p);
    free(p);
    return yes;
}

static void assert_same_tensor(const ckpt_tensor *a, const ckpt_tensor *b)
{
    assert_non_null(a);
    assert_non_null(b);
    assert_string_equal(a->name, b->name);
    if (a->dtype != b->dtype)
        fail_msg("%s: dtype %s vs %s", a->name, ckpt_dtype_name(a->dtype),
                 ckpt_dtype_name(b->dtype));
    assert_int_equal(a->ndim, b->ndim);
    for (int k = 0; k < a->ndim; k++)
        assert_int_equal(a->shape[k], b->shape[k]);
    assert_int_equal(a->nbytes, b->nbytes);
    if (a->nbytes && memcmp(a->data, b->data, (size_t)a->nbytes))
        fail_msg("%s: bytes differ", a->name);
}

/* Every parameter and slot of a equals the one of the same name in b, and the counts match. */
static void assert_same_tensors(const ckpt_state *a, const ckpt_state *b)
{
    assert_int_equal(ckpt_state_param_count(a), ckpt_state_param_count(b));
    assert_int_equal(ckpt_state_slot_count(a), ckpt_state_slot_count(b));
    for (size_t i = 0; i < ckpt_state_param_count(a); i++) {
        const ckpt_tensor *t = ckpt_state_param_at(a, i);
        const ckpt_tensor *u = ckpt_state_param(b, t->name);
        if (!u) fail_msg("parameter %s missing", t->name);
        assert_same_tensor(t, u);
    }
    for (size_t i = 0; i < ckpt_state_slot_count(a); i++) {
        const ckpt_tensor *t = ckpt_state_slot_at(a, i);
        const ckpt_tensor *u = ckpt_state_slot(b, t->param, t->slot);
        if (!u) fail_msg("slot %s missing", t->name);
        assert_same_tensor(t, u);
    }
}

/* Adds slots adam_m and adam_v (F32, random) to every parameter, and an optimizer. */
static void add_adam(ckpt_state *st, uint64_t seed)
{
    size_t n = ckpt_state_param_count(st);
    for (size_t i = 0; i < n; i++) {
        const ckpt_tensor *p = ckpt_state_param_at(st, i);
        for (int s = 0; s < 2; s++) {
            ckpt_tensor *t;
            OK(ckpt_state_add_slot(&t, st, p->name, s ? "adam_v" : "adam_m", CKPT_DT_F32, NULL));
            float *v = t->data;
            uint64_t r = seed ^ (i * 2 + (uint64_t)s) * 0x9E3779B97F4A7C15ULL;
            for (uint64_t k = 0; k < t->numel; k++)
                v[k] = (float)((double)(splitmix(&r) >> 40) / (double)(1 << 24)) - 0.5f;
        }
    }
    OK(ckpt_state_set_optimizer(st, "adamw"));
    OK(ckpt_state_set_hyperparameter(st, "lr", 3e-4));
    OK(ckpt_state_set_hyperparameter(st, "b1", 0.9));
    OK(ckpt_state_set_scalar(st, "count", 1200));
}

/* A state of a generated model plus Adam moments, saved to `dir`. */
static void make_model_state(const char *scratch, const char *dir, const char *arch, uint64_t scale,
                             ckpt_dtype dt, uint64_t max_shard)
{
    char *model = join(scratch, "gen-model");
    ckpt_rm_rf(model);
    genmodel_opts go;
    genmodel_opts_init(&go, arch);
    go.scale = scale;
    go.layers = 2;
    go.dtype = dt;
    go.max_shard_size = 0;
    OK(genmodel_write(&go, model));
    ckpt_state *st;
    OK(state_from_checkpoint(model, &st));
    add_adam(st, 7);
    ckpt_state_set_step(st, 1200);
    ckpt_state_save_options so = CKPT_STATE_SAVE_OPTIONS_INIT;
    so.max_shard_size = max_shard;
    OK(ckpt_state_save(dir, st, &so));
    ckpt_state_free(st);
    ckpt_rm_rf(model);
    free(model);
}

/* ---- 1. save and load ---- */

/* One parameter of every dtype (and a scalar, and a zero-size one), each with an F32 slot. */
static ckpt_state *every_dtype_state(void)
{
    ckpt_state *st;
    OK(ckpt_state_new(&st));
    for (int d = 0; d < CKPT_DT_COUNT; d++) {
        char name[64];
        snprintf(name, sizeof name, "layers.%d.%s.weight", d, ckpt_dtype_name((ckpt_dtype)d));
        uint64_t shape[2] = {4, 6}, nbytes;
        OK(ckpt_dtype_nbytes((ckpt_dtype)d, 2, shape, &nbytes));
        uint8_t *buf = malloc((size_t)nbytes);
        fill_random(buf, (size_t)nbytes, (uint64_t)d + 1);
        ckpt_tensor *t;
        OK(ckpt_state_add_param(&t, st, name, (ckpt_dtype)d, 2, shape, buf));
        assert_memory_equal(t->data, buf, nbytes);
        free(buf);
        ckpt_tensor *m;
        OK(ckpt_state_add_slot(&m, st, name, "adam_m", CKPT_DT_F32, NULL));
        fill_random(m->data, (size_t)m->nbytes, 100 + (uint64_t)d);
    }
    double pi = 3.14159;
    OK(ckpt_state_add_param(NULL, st, "scalar", CKPT_DT_F64, 0, NULL, &pi));
    uint64_t zero_shape[2] = {0, 5};
    OK(ckpt_state_add_param(NULL, st, "empty", CKPT_DT_BF16, 2, zero_shape, NULL));
    OK(ckpt_state_add_slot(NULL, st, "scalar", "adam_v", CKPT_DT_BF16, NULL));
    OK(ckpt_state_set_optimizer(st, "adamw"));
    OK(ckpt_state_set_hyperparameter(st, "lr", 3e-4));
    OK(ckpt_state_set_hyperparameter(st, "weight_decay", 0.01));
    OK(ckpt_state_set_scalar(st, "count", 1200));
    OK(ckpt_state_set_config(st, "{\"model_type\": \"llama\", \"hidden_size\": 8}\n"));
    ckpt_state_set_step(st, 1200);
    return st;
}

static void test_round_trip_every_dtype(void **state)
{
    const char *scratch = *state;
    ckpt_state *st = every_dtype_state();
    for (int sharded = 0; sharded < 2; sharded++) {
        char *dir = join(scratch, sharded ? "sharded" : "single");
        ckpt_state_save_options so = CKPT_STATE_SAVE_OPTIONS_INIT;
        so.max_shard_size = sharded ? 64 : 0;
        OK(ckpt_state_save(dir, st, &so));
        assert_true(has_file(dir, sharded ? "model.safetensors.index.json" : "model.safetensors"));
        assert_true(
            has_file(dir, sharded ? "optimizer.safetensors.index.json" : "optimizer.safetensors"));
        assert_true(has_file(dir, "optimizer.json") && has_file(dir, "config.json"));
        ckpt_state *back;
        OK(ckpt_state_load(dir, NULL, &back));
        assert_same_tensors(st, back);
        assert_int_equal(ckpt_state_step(back), 1200);
        assert_string_equal(ckpt_state_optimizer(back), "adamw");
        assert_int_equal(ckpt_state_slot_name_count(back), 2);
        double v;
        OK(ckpt_state_hyperparameter(&v, back, "lr"));
        assert_true(v == 3e-4);
        OK(ckpt_state_scalar(&v, back, "count"));
        assert_true(v == 1200);
        assert_int_equal(ckpt_state_scalar(&v, back, "nope"), CKPT_ENOTFOUND);
        assert_string_equal(ckpt_state_config(back), ckpt_state_config(st));
        const char *ts = ckpt_state_timestamp(back);
        assert_true(ts && strlen(ts) == 20 && ts[10] == 'T' && ts[19] == 'Z');
        /* Saving what was loaded gives the same files (same timestamp kept). */
        char *again = join(scratch, "again");
        so.keep_timestamp = true;
        OK(ckpt_state_save(again, back, &so));
        char *m1 = read_text(dir, "metadata.json"), *m2 = read_text(again, "metadata.json");
        assert_string_equal(m1, m2);
        assert_contains(m1, "\"format\": \"ckpt-state\"");
        assert_contains(m1, "\"has_optimizer_state\": true");
        assert_contains(m1, "\"step\": 1200");
        char *o1 = read_text(dir, "optimizer.json");
        assert_contains(o1, "\"count\": 1200");
        assert_contains(o1, "\"slots\": [\n    \"adam_m\",\n    \"adam_v\"\n  ]");
        free(m1);
        free(m2);
        free(o1);
        ckpt_state_free(back);
        ckpt_rm_rf(again);
        free(again);
        /* Without the optimizer. */
        ckpt_state_load_options lo = CKPT_STATE_LOAD_OPTIONS_INIT;
        lo.load_optimizer = false;
        OK(ckpt_state_load(dir, &lo, &back));
        assert_int_equal(ckpt_state_slot_count(back), 0);
        assert_null(ckpt_state_optimizer(back));
        assert_int_equal(ckpt_state_param_count(back), ckpt_state_param_count(st));
        ckpt_state_free(back);
        free(dir);
    }
    /* Keys other tools add to metadata.json and optimizer.json are kept. */
    char *extra = join(scratch, "extra");
    OK(ckpt_state_save(extra, st, NULL));
    write_text(extra, "metadata.json",
               "{\"format\": \"ckpt-state\", \"version\": 1, \"step\": 7, \"epoch\": 3, "
               "\"has_optimizer_state\": true}");
    write_text(
        extra, "optimizer.json",
        "{\"name\": \"adamw\", \"slots\": [\"adam_m\", \"adam_v\"], \"schedule\": \"cosine\"}");
    ckpt_state *ex;
    OK(ckpt_state_load(extra, NULL, &ex));
    assert_null(ckpt_state_timestamp(ex));
    OK(ckpt_state_save(extra, ex, NULL));
    ckpt_state_free(ex);
    char *em = read_text(extra, "metadata.json"), *eo = read_text(extra, "optimizer.json");
    assert_contains(em, "\"epoch\": 3");
    assert_contains(em, "\"step\": 7");
    assert_contains(eo, "\"schedule\": \"cosine\"");
    free(em);
    free(eo);
    free(extra);
    /* save_optimizer false: no optimizer files, has_optimizer_state false. */
    char *dir = join(scratch, "noopt");
    ckpt_state_save_options so = CKPT_STATE_SAVE_OPTIONS_INIT;
    so.save_optimizer = false;
    OK(ckpt_state_save(dir, st, &so));
    assert_false(has_file(dir, "optimizer.safetensors") || has_file(dir, "optimizer.json"));
    char *meta = read_text(dir, "metadata.json");
    assert_contains(meta, "\"has_optimizer_state\": false");
    free(meta);
    ckpt_state *back;
    OK(ckpt_state_load(dir, NULL, &back));
    assert_int_equal(ckpt_state_slot_count(back), 0);
    ckpt_state_free(back);
    free(dir);
    ckpt_state_free(st);
}

/* The mapping of /proc/self/maps that holds p, or "" (its path). */
static void mapping_of(const void *p, char *path, size_t len)
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[4096];
    path[0] = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        int off = 0;
        if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &off) < 2) continue;
        if ((uintptr_t)p >= lo && (uintptr_t)p < hi) {
            snprintf(path, len, "%s", line + off);
            path[strcspn(path, "\n")] = 0;
            break;
        }
    }
    fclose(f);
}

static void test_load_is_zero_copy(void **state)
{
    const char *scratch = *state;
    ckpt_state *st = every_dtype_state();
    char *dir = join(scratch, "s");
    OK(ckpt_state_save(dir, st, NULL));
    ckpt_state *back;
    OK(ckpt_state_load(dir, NULL, &back));
    ckpt_tensor *t = ckpt_state_param(back, "layers.17.F32.weight");
    char where[4096];
    mapping_of(t->data, where, sizeof where);
    if (!strstr(where, "/s/model.safetensors"))
        fail_msg("tensor bytes are not mapped from the file: '%s'", where);
    mapping_of(ckpt_state_slot(back, t->name, "adam_m")->data, where, sizeof where);
    assert_contains(where, "/s/optimizer.safetensors");
    /* Writable in place, and the file does not change (copy-on-write). */
    ((uint8_t *)t->data)[0] ^= 0xFF;
    ckpt_state *again;
    OK(ckpt_state_load(dir, NULL, &again));
    assert_same_tensor(ckpt_state_param(again, t->name), ckpt_state_param(st, t->name));
    ckpt_state_free(again);
    /* A cast reads into memory. */
    ckpt_state_load_options lo = CKPT_STATE_LOAD_OPTIONS_INIT;
    lo.dtype = "f32";
    OK(ckpt_state_load(dir, &lo, &again));
    mapping_of(ckpt_state_param(again, "layers.17.F32.weight")->data, where, sizeof where);
    assert_null(strstr(where, "safetensors"));
    ckpt_state_free(again);
    ckpt_state_free(back);
    ckpt_state_free(st);
    free(dir);
}

/* f32 bit patterns and what round-to-nearest-even makes of them in bf16 and f16. */
static const struct {
    uint32_t f32;
    uint16_t bf16, f16;
} cast_cases[] = {
    {0x3F800000, 0x3F80, 0x3C00}, /* 1.0 */
    {0x3F808000, 0x3F80, 0x3C04}, /* 1 + 2^-8: a bf16 tie, to even (down) */
    {0x3F818000, 0x3F82, 0x3C0C}, /* 1 + 3*2^-8: a bf16 tie, to even (up) */
    {0x3F808001, 0x3F81, 0x3C04}, /* just above the tie: up in bf16 */
    {0x477FE000, 0x4780, 0x7BFF}, /* 65504, the largest f16 */
    {0x477FF000, 0x4780,
     0x7C00}, /* 65520: an f16 tie between 65504 and infinity, to even (infinity) */
    {0x4788B800, 0x4789, 0x7C00}, /* 70000: overflows f16 */
    {0x33800000, 0x3380, 0x0001}, /* 2^-24, the smallest f16 subnormal */
    {0x33000000, 0x3300, 0x0000}, /* 2^-25: an f16 tie between 0 and 2^-24, to even (0) */
    {0x33400000, 0x3340, 0x0001}, /* 1.5 * 2^-25: rounds up to 2^-24 */
    {0xFF800000, 0xFF80, 0xFC00}, /* -infinity */
    {0x80000000, 0x8000, 0x8000}, /* -0 */
    {0x7F7FFFFF, 0x7F80, 0x7C00}, /* the largest f32 overflows both */
    {0x7FC00000, 0x7FC0, 0x7E00}, /* NaN stays NaN */
};

static bool bf16_is_nan(uint16_t h)
{
    return (h & 0x7F80) == 0x7F80 && (h & 0x7F);
}

static bool f16_is_nan(uint16_t h)
{
    return (h & 0x7C00) == 0x7C00 && (h & 0x3FF);
}

static void check_cast(const ckpt_tensor *t, ckpt_dtype want)
{
    assert_int_equal(t->dtype, want);
    const uint16_t *h = t->data;
    for (size_t i = 0; i < CKPT_ARRAY_LEN(cast_cases); i++) {
        uint16_t expect = want == CKPT_DT_BF16 ? cast_cases[i].bf16 : cast_cases[i].f16;
        bool nan = want == CKPT_DT_BF16 ? bf16_is_nan(expect) : f16_is_nan(expect);
        if (nan ? !(want == CKPT_DT_BF16 ? bf16_is_nan(h[i]) : f16_is_nan(h[i])) : h[i] != expect)
            fail_msg("%s of f32 0x%08x: got 0x%04x, expected 0x%04x", ckpt_dtype_name(want),
                     cast_cases[i].f32, h[i], expect);
    }
}

static void test_casts_round_as_the_spec_says(void **state)
{
    const char *scratch = *state;
    ckpt_state *st;
    OK(ckpt_state_new(&st));
    uint32_t bits[CKPT_ARRAY_LEN(cast_cases)];
    for (size_t i = 0; i < CKPT_ARRAY_LEN(cast_cases); i++)
        bits[i] = cast_cases[i].f32;
    uint64_t n = CKPT_ARRAY_LEN(cast_cases);
    OK(ckpt_state_add_param(NULL, st, "w", CKPT_DT_F32, 1, &n, bits));
    /* F64 to BF16 rounds once: 1 + 2^-8 + 2^-30 is just above a tie (through f32 it would land on
     * it). */
    double d = 1.0 + ldexp(1, -8) + ldexp(1, -30);
    uint64_t one = 1;
    OK(ckpt_state_add_param(NULL, st, "d", CKPT_DT_F64, 1, &one, &d));
    int32_t ints[3] = {-1, 7, 1 << 30};
    uint64_t three = 3;
    OK(ckpt_state_add_param(NULL, st, "ids", CKPT_DT_I32, 1, &three, ints));
    OK(ckpt_state_set_optimizer(st, "sgd"));
    OK(ckpt_state_add_slot(NULL, st, "w", "momentum", CKPT_DT_F32, bits));

    /* On save. */
    char *dir = join(scratch, "bf16");
    ckpt_state_save_options so = CKPT_STATE_SAVE_OPTIONS_INIT;
    so.float_dtype = "bf16";
    OK(ckpt_state_save(dir, st, &so));
    ckpt_state *back;
    OK(ckpt_state_load(dir, NULL, &back));
    check_cast(ckpt_state_param(back, "w"), CKPT_DT_BF16);
    check_cast(ckpt_state_slot(back, "w", "momentum"), CKPT_DT_BF16);
    assert_int_equal(*(uint16_t *)ckpt_state_param(back, "d")->data, 0x3F81);
    assert_same_tensor(ckpt_state_param(back, "ids"), ckpt_state_param(st, "ids"));
    char *meta = read_text(dir, "metadata.json");
    assert_contains(meta, "\"float_dtype\": \"BF16\"");
    free(meta);
    /* Widening on load is exact: bf16 -> f32 is the bits shifted. */
    ckpt_state_load_options lo = CKPT_STATE_LOAD_OPTIONS_INIT;
    lo.dtype = "f32";
    ckpt_state *wide;
    OK(ckpt_state_load(dir, &lo, &wide));
    const ckpt_tensor *w16 = ckpt_state_param(back, "w"), *w32 = ckpt_state_param(wide, "w");
    assert_int_equal(w32->dtype, CKPT_DT_F32);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(((uint32_t *)w32->data)[i], (uint32_t)((uint16_t *)w16->data)[i] << 16);
    ckpt_state_free(wide);
    ckpt_state_free(back);
    free(dir);

    /* On load. */
    dir = join(scratch, "f32");
    OK(ckpt_state_save(dir, st, NULL));
    lo.dtype = "f16";
    OK(ckpt_state_load(dir, &lo, &back));
    check_cast(ckpt_state_param(back, "w"), CKPT_DT_F16);
    check_cast(ckpt_state_slot(back, "w", "momentum"), CKPT_DT_F16);
    assert_int_equal(ckpt_state_param(back, "ids")->dtype, CKPT_DT_I32);
    ckpt_state_free(back);
    lo.dtype = "bf16";
    OK(ckpt_state_load(dir, &lo, &back));
    check_cast(ckpt_state_param(back, "w"), CKPT_DT_BF16);
    ckpt_state_free(back);
    lo.dtype = "i8";
    assert_int_equal(ckpt_state_load(dir, &lo, &back), CKPT_EINVAL);
    assert_null(back);
    free(dir);
    ckpt_state_free(st);
}

/* ---- kill -9 during save ---- */

#define KILL_ELEMS (1u << 20) /* 4 MiB per tensor */
#define KILL_TENSORS 4

static uint8_t step_byte(uint64_t step)
{
    return (uint8_t)(step % 251 + 1);
}

static ckpt_state *kill_state(uint64_t step)
{
    ckpt_state *st;
    OK(ckpt_state_new(&st));
    OK(ckpt_state_set_optimizer(st, "adamw"));
    for (int i = 0; i < KILL_TENSORS; i++) {
        char name[32];
        snprintf(name, sizeof name, "layers.%d.weight", i);
        uint64_t n = KILL_ELEMS;
        ckpt_tensor *t;
        OK(ckpt_state_add_param(&t, st, name, CKPT_DT_F32, 1, &n, NULL));
        if (i == 0) OK(ckpt_state_add_slot(NULL, st, name, "adam_m", CKPT_DT_F32, NULL));
    }
    ckpt_state_set_step(st, step);
    return st;
}

static void set_step_bytes(ckpt_state *st, uint64_t step)
{
    for (size_t i = 0; i < ckpt_state_param_count(st); i++)
        memset(ckpt_state_param_at(st, i)->data, step_byte(step),
               ckpt_state_param_at(st, i)->nbytes);
    for (size_t i = 0; i < ckpt_state_slot_count(st); i++)
        memset(ckpt_state_slot_at(st, i)->data, step_byte(step), ckpt_state_slot_at(st, i)->nbytes);
    ckpt_state_set_step(st, step);
}

/* Removes "<dir>.tmp-*" leftovers beside dir; returns how many. */
static int remove_leftovers(const char *scratch, const char *base)
{
    DIR *d = opendir(scratch);
    assert_non_null(d);
    struct dirent *e;
    int n = 0;
    size_t bl = strlen(base);
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, base, bl) || strncmp(e->d_name + bl, ".tmp-", 5)) continue;
        char *p = join(scratch, e->d_name);
        OK(ckpt_rm_rf(p));
        free(p);
        n++;
    }
    closedir(d);
    return n;
}

/* Saves st at step in a child that CKPT_FAULT-style spec (NULL: none) stops;
 * returns the child's wait status. trace (or NULL) lists the points passed. */
static int save_in_child(const char *dir, ckpt_state *st, uint64_t step, const ckpt_state_save_options *so,
                         const char *spec, const char *trace)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (trace) setenv("CKPT_FAULT_TRACE", trace, 1);
        else unsetenv("CKPT_FAULT_TRACE");
        ckpt_fault_arm(spec);
        set_step_bytes(st, step);
        _exit(ckpt_state_save(dir, st, so) < 0 ? 3 : 0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

/* Counts the lines of file equal to name. */
static int count_lines(const char *file, const char *name)
{
    FILE *f = fopen(file, "r");
    assert_non_null(f);
    char line[128];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        n += !strcmp(line, name);
    }
    fclose(f);
    return n;
}

/* The state in dir is whole and holds step (or is missing when step is 0). */
static void expect_state_at(const char *dir, uint64_t step, const char *after)
{
    ckpt_state *back;
    if (step == 0) {
        if (ckpt_state_load(dir, NULL, &back) == 0) fail_msg("after %s: a state appeared", after);
        return;
    }
    if (ckpt_state_load(dir, NULL, &back) < 0) fail_msg("after %s: %s", after, ckpt_error_last());
    if (ckpt_state_step(back) != step)
        fail_msg("after %s: step %llu, expected %llu", after, (unsigned long long)ckpt_state_step(back),
                 (unsigned long long)step);
    uint8_t *expect = malloc(KILL_ELEMS * 4);
    assert_non_null(expect);
    memset(expect, step_byte(step), KILL_ELEMS * 4);
    assert_int_equal(ckpt_state_param_count(back), KILL_TENSORS);
    assert_int_equal(ckpt_state_slot_count(back), 1);
    for (size_t i = 0; i < KILL_TENSORS; i++)
        if (memcmp(ckpt_state_param_at(back, i)->data, expect, KILL_ELEMS * 4))
            fail_msg("after %s: step %llu but tensor %zu holds other bytes", after, (unsigned long long)step, i);
    if (memcmp(ckpt_state_slot_at(back, 0)->data, expect, KILL_ELEMS * 4))
        fail_msg("after %s: the optimizer slot holds other bytes", after);
    free(expect);
    ckpt_state_free(back);
}

/* A save stopped (SIGKILL, through a named crash point of common/fault.h) at
 * every step of its protocol leaves the previous state whole — or the new one
 * once the commit has happened — and at most a "<dir>.tmp-*" folder. The
 * points are found by tracing a full save, so every one is tested. */
static void test_kill_during_save_keeps_previous_state(void **state)
{
    const char *scratch = *state;
    char *dir = join(scratch, "state"), *trace = join(scratch, "trace");
    ckpt_state *st = kill_state(0);
    ckpt_state_save_options so = CKPT_STATE_SAVE_OPTIONS_INIT;
    so.max_shard_size = 6u << 20; /* several shards */

    /* A first save, into nothing: before its rename there is no state, after it the new one. */
    const char *first[] = {"tmpdir.created", "state.file_synced", "state.before_commit", "dir.before_rename",
                           "dir.renamed"};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(first); i++) {
        int status = save_in_child(dir, st, 7, &so, first[i], NULL);
        if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL))
            fail_msg("the first save was not stopped at %s (status %d)", first[i], status);
        bool done = !strcmp(first[i], "dir.renamed");
        expect_state_at(dir, done ? 7 : 0, first[i]);
        assert_int_equal(remove_leftovers(scratch, "state"), done ? 0 : 1);
        if (!done) assert_false(ckpt_exists(dir));
        OK(ckpt_rm_rf(dir));
    }

    /* Saves over a state: trace one to list its points, then stop one at each. */
    assert_int_equal(save_in_child(dir, st, 1, &so, NULL, NULL), 0);
    assert_int_equal(save_in_child(dir, st, 2, &so, NULL, trace), 0);
    int files = count_lines(trace, "state.file_synced");
    assert_true(files >= 4); /* the shards, their index, the metadata */
    assert_int_equal(count_lines(trace, "state.committed"), 1);
    expect_state_at(dir, 2, "a whole save");
    char spec[64];
    uint64_t step = 2;
    for (int k = 0; k <= files + 2; k++) {
        /* k = 0: the temporary folder exists; 1..files: that many files written; then before and
         * after the commit. */
        if (k == 0) snprintf(spec, sizeof spec, "tmpdir.created");
        else if (k <= files) snprintf(spec, sizeof spec, "state.file_synced:%d", k);
        else snprintf(spec, sizeof spec, k == files + 1 ? "state.before_commit" : "state.committed");
        int status = save_in_child(dir, st, step + 1, &so, spec, NULL);
        if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL))
            fail_msg("the save was not stopped at %s (status %d)", spec, status);
        if (k == files + 2) step++; /* the commit happened: the new state is the one */
        expect_state_at(dir, step, spec);
        /* The temporary folder is left (the partial new state, or the old one after the swap). */
        assert_int_equal(remove_leftovers(scratch, "state"), 1);
    }
    ckpt_state_free(st);
    free(trace);
    free(dir);
}

/* Loads while another process saves over the same directory see one whole step each. */
static void test_load_while_saving(void **state)
{
    const char *scratch = *state;
    char *dir = join(scratch, "busy/");
    ckpt_state *st;
    OK(ckpt_state_new(&st));
    OK(ckpt_state_set_optimizer(st, "adamw"));
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "layers.%d.weight", i);
        uint64_t n = 1u << 16;
        OK(ckpt_state_add_param(NULL, st, name, CKPT_DT_F32, 1, &n, NULL));
        OK(ckpt_state_add_slot(NULL, st, name, "adam_m", CKPT_DT_F32, NULL));
    }
    ckpt_state_save_options so = CKPT_STATE_SAVE_OPTIONS_INIT;
    so.max_shard_size =
        1u << 18; /* one tensor per file: a mixed load would go unnoticed by the index */
    set_step_bytes(st, 1);
    OK(ckpt_state_save(dir, st, &so));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        for (uint64_t step = 2; step < 100000; step++) {
            set_step_bytes(st, step);
            if (ckpt_state_save(dir, st, &so) < 0) _exit(3);
        }
        _exit(0);
    }
    int loads = 0, busy = 0;
    char mixed[512] = "";
    uint8_t *expect = malloc((1u << 16) * 4);
    /* Not a timing assertion: loads go on (up to a bound no machine needs) until 10 have
     * completed while the child saves. */
    for (int i = 0; i < 5000 && loads < 10 && !mixed[0]; i++) {
        ckpt_state *back;
        int rc = ckpt_state_load(dir, NULL, &back);
        if (rc == CKPT_EBUSY) {
            busy++;
            continue;
        }
        if (rc < 0)
            continue; /* a file of the old state removed under the loader: an error, not a mix */
        memset(expect, step_byte(ckpt_state_step(back)), (1u << 16) * 4);
        for (size_t k = 0; k < 8 && !mixed[0]; k++) {
            const ckpt_tensor *t =
                k < 4 ? ckpt_state_param_at(back, k) : ckpt_state_slot_at(back, k - 4);
            if (memcmp(t->data, expect, (size_t)t->nbytes))
                snprintf(mixed, sizeof mixed, "%s does not hold step %llu", t->name,
                         (unsigned long long)ckpt_state_step(back));
        }
        ckpt_state_free(back);
        loads++;
    }
    kill(pid, SIGKILL); /* before any failure is reported: the child must not outlive the test */
    waitpid(pid, NULL, 0);
    if (mixed[0]) fail_msg("a load mixed steps: %s", mixed);
    print_message("%d whole loads, %d gave up as busy, while saving\n", loads, busy);
    assert_true(loads > 0);
    remove_leftovers(scratch, "busy");
    free(expect);
    ckpt_state_free(st);
    free(dir);
}

/* ---- bad input ---- */

static ckpt_state *small_state(void)
{
    ckpt_state *st;
    OK(ckpt_state_new(&st));
    uint64_t shape[2] = {2, 2};
    float v[4] = {1, 2, 3, 4};
    OK(ckpt_state_add_param(NULL, st, "a.weight", CKPT_DT_F32, 2, shape, v));
    OK(ckpt_state_add_param(NULL, st, "b.weight", CKPT_DT_F32, 2, shape, v));
    OK(ckpt_state_add_param(NULL, st, "c.weight", CKPT_DT_F32, 2, shape, v));
    OK(ckpt_state_set_optimizer(st, "adamw"));
    OK(ckpt_state_add_slot(NULL, st, "a.weight", "adam_m", CKPT_DT_F32, v));
    OK(ckpt_state_add_slot(NULL, st, "b.weight", "adam_m", CKPT_DT_F32, v));
    ckpt_state_set_step(st, 5);
    return st;
}

/* Writes dir/file holding one F32 tensor `name` of `shape`. */
static void write_tensor_file(const char *dir, const char *file, const char *name, int ndim,
                              const uint64_t *shape)
{
    st_layout l;
    st_layout_init(&l);
    OK(st_layout_add(&l, name, CKPT_DT_F32, ndim, shape, 0));
    OK(st_layout_finish(&l));
    char *path = join(dir, file);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    OK(ckpt_pwrite_full(fd, l.header, l.header_len, 0, path));
    assert_int_equal(ftruncate(fd, (off_t)l.file_size), 0);
    close(fd);
    free(path);
    st_layout_free(&l);
}

static void expect_load_error(const char *dir, int code, const char *needle)
{
    ckpt_state *back = (ckpt_state *)1;
    int rc = ckpt_state_load(dir, NULL, &back);
    if (rc != code)
        fail_msg("%s: load gave %d (%s), expected %d", dir, rc, ckpt_error_last(), code);
    assert_null(back);
    assert_contains(ckpt_error_last(), needle);
}

static char *fresh_state(const char *scratch, const char *name, uint64_t max_shard)
{
    char *dir = join(scratch, name);
    ckpt_state *st = small_state();
    ckpt_state_save_options so = CKPT_STATE_SAVE_OPTIONS_INIT;
    so.max_shard_size = max_shard;
    OK(ckpt_state_save(dir, st, &so));
    ckpt_state_free(st);
    return dir;
}

static void test_bad_input_loads_nothing(void **state)
{
    const char *scratch = *state;
    uint64_t shape[2] = {2, 2}, bad_shape[1] = {3};

    char *dir = fresh_state(scratch, "ghost", 0);
    write_tensor_file(dir, "optimizer.safetensors", "ghost.weight/adam_m", 2, shape);
    expect_load_error(dir, CKPT_EINVAL,
                      "names parameter 'ghost.weight', which the model does not have");
    assert_contains(ckpt_error_last(), "optimizer.safetensors");
    free(dir);

    dir = fresh_state(scratch, "future", 0);
    write_text(
        dir, "metadata.json",
        "{\"format\": \"ckpt-state\", \"version\": 2, \"step\": 5, \"has_optimizer_state\": true}");
    expect_load_error(dir, CKPT_EINVAL, "version 2 is newer than this ckpt reads (1)");
    free(dir);

    dir = fresh_state(scratch, "truncated", 16);
    char *shard = join(dir, "model-00002-of-00003.safetensors");
    struct stat sb;
    assert_int_equal(stat(shard, &sb), 0);
    assert_int_equal(truncate(shard, sb.st_size - 4), 0);
    expect_load_error(dir, CKPT_EINVAL, "model-00002-of-00003.safetensors");
    free(shard);
    free(dir);

    dir = fresh_state(scratch, "shape", 0);
    write_tensor_file(dir, "optimizer.safetensors", "a.weight/adam_m", 1, bad_shape);
    expect_load_error(dir, CKPT_EINVAL, "is not shaped like parameter 'a.weight'");
    free(dir);

    dir = fresh_state(scratch, "unlisted", 0);
    write_text(dir, "optimizer.json", "{\"name\": \"adamw\", \"slots\": [\"adam_v\"]}");
    expect_load_error(dir, CKPT_EINVAL, "has slot 'adam_m', which optimizer.json does not list");
    free(dir);

    dir = fresh_state(scratch, "format", 0);
    write_text(dir, "metadata.json",
               "{\"format\": \"something-else\", \"version\": 1, \"step\": 5}");
    expect_load_error(dir, CKPT_EINVAL, "format is 'something-else'");
    free(dir);

    dir = fresh_state(scratch, "nostep", 0);
    write_text(dir, "metadata.json", "{\"format\": \"ckpt-state\", \"version\": 1}");
    expect_load_error(dir, CKPT_ENOTFOUND, "missing field 'step'");
    free(dir);

    dir = fresh_state(scratch, "noopt", 0);
    char *p = join(dir, "optimizer.safetensors");
    unlink(p);
    free(p);
    expect_load_error(dir, CKPT_ENOTFOUND, "has_optimizer_state is true");
    free(dir);

    dir = join(scratch, "not-a-state");
    OK(ckpt_mkdir_p(dir, 0755));
    expect_load_error(dir, CKPT_ENOTFOUND, "not a training state (no metadata.json)");
    /* ... and saving over something that is not a state is refused, leaving it alone. */
    write_text(dir, "precious.txt", "keep me");
    ckpt_state *st = small_state();
    assert_int_equal(ckpt_state_save(dir, st, NULL), CKPT_EEXIST);
    assert_contains(ckpt_error_last(), "refusing to replace");
    assert_true(has_file(dir, "precious.txt"));
    assert_int_equal(remove_leftovers(scratch, "not-a-state"), 0);
    ckpt_state_free(st);
    free(dir);

    /* A rank load fails as a whole, too. */
    dir = fresh_state(scratch, "ghost-rank", 0);
    write_tensor_file(dir, "optimizer.safetensors", "ghost.weight/adam_m", 2, shape);
    ckpt_state_load_options lo = CKPT_STATE_LOAD_OPTIONS_INIT;
    lo.layout = "hf-tp2";
    ckpt_state *back = (ckpt_state *)1;
    assert_int_equal(ckpt_state_load(dir, &lo, &back),
                     CKPT_ENOTFOUND); /* no config.json: checked first */
    assert_null(back);
    write_text(dir, "config.json", "{\"num_attention_heads\": 2, \"hidden_size\": 2}");
    assert_int_equal(ckpt_state_load(dir, &lo, &back), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "ghost.weight");
    assert_null(back);
    free(dir);
}

static void test_api_errors(void **state)
{
    (void)state;
    ckpt_state *st;
    OK(ckpt_state_new(&st));
    uint64_t shape[1] = {2};
    OK(ckpt_state_add_param(NULL, st, "w", CKPT_DT_F32, 1, shape, NULL));
    assert_int_equal(ckpt_state_add_param(NULL, st, "w", CKPT_DT_F32, 1, shape, NULL), CKPT_EEXIST);
    assert_int_equal(ckpt_state_add_param(NULL, st, "a/b", CKPT_DT_F32, 1, shape, NULL),
                     CKPT_EINVAL);
    assert_int_equal(ckpt_state_add_param(NULL, st, "", CKPT_DT_F32, 1, shape, NULL), CKPT_EINVAL);
    assert_int_equal(ckpt_state_add_param(NULL, st, "x", (ckpt_dtype)99, 1, shape, NULL),
                     CKPT_EINVAL);
    uint64_t f4_odd[1] = {3};
    assert_int_equal(ckpt_state_add_param(NULL, st, "x", CKPT_DT_F4, 1, f4_odd, NULL), CKPT_EINVAL);
    assert_int_equal(ckpt_state_add_slot(NULL, st, "missing", "adam_m", CKPT_DT_F32, NULL),
                     CKPT_ENOTFOUND);
    assert_int_equal(ckpt_state_add_slot(NULL, st, "w", "a/b", CKPT_DT_F32, NULL), CKPT_EINVAL);
    OK(ckpt_state_add_slot(NULL, st, "w", "adam_m", CKPT_DT_BF16, NULL));
    assert_int_equal(ckpt_state_add_slot(NULL, st, "w", "adam_m", CKPT_DT_F32, NULL), CKPT_EEXIST);
    assert_null(ckpt_state_param(st, "w/adam_m"));
    assert_non_null(ckpt_state_slot(st, "w", "adam_m"));
    assert_int_equal(ckpt_state_set_hyperparameter(st, "lr", NAN), CKPT_EINVAL);
    assert_int_equal(ckpt_state_set_config(st, "[1, 2]"), CKPT_EINVAL);
    assert_int_equal(ckpt_state_set_config(st, "{"), CKPT_EINVAL);
    ckpt_state_save_options so = CKPT_STATE_SAVE_OPTIONS_INIT;
    so.version = 99;
    assert_int_equal(ckpt_state_save("/tmp/unused", st, &so), CKPT_EINVAL);
    so.version = CKPT_STATE_SAVE_OPTIONS_VERSION;
    so.float_dtype = "i32";
    assert_int_equal(ckpt_state_save("/tmp/unused", st, &so), CKPT_EINVAL);
    ckpt_state_load_options lo = CKPT_STATE_LOAD_OPTIONS_INIT;
    lo.version = 0;
    ckpt_state *back;
    assert_int_equal(ckpt_state_load("/tmp", &lo, &back), CKPT_EINVAL);
    char *json = ckpt_state_optimizer_json(st);
    assert_contains(json, "\"slots\": [\n    \"adam_m\"\n  ]");
    free(json);
    ckpt_state_free(st);
}

static void test_save_without_optimizer_name_fails(void **state)
{
    const char *scratch = *state;
    ckpt_state *st;
    OK(ckpt_state_new(&st));
    uint64_t shape[1] = {2};
    OK(ckpt_state_add_param(NULL, st, "w", CKPT_DT_F32, 1, shape, NULL));
    OK(ckpt_state_add_slot(NULL, st, "w", "m", CKPT_DT_F32, NULL));
    char *dir = join(scratch, "s");
    assert_int_equal(ckpt_state_save(dir, st, NULL), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "no optimizer name");
    assert_false(ckpt_exists(dir));
    assert_int_equal(remove_leftovers(scratch, "s"), 0);
    free(dir);
    ckpt_state_free(st);
}

/* ---- 2. one rank of a layout ---- */

static uint64_t proc_rchar(void)
{
    FILE *f = fopen("/proc/self/io", "r");
    assert_non_null(f);
    char line[256];
    unsigned long long v = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "rchar: %llu", &v) == 1) break;
    fclose(f);
    return v;
}

/* Bytes of the state's headers and small files: what a reader must read besides tensors. */
static uint64_t header_bytes(const char *dir)
{
    uint64_t total = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *p = join(dir, e->d_name);
        size_t n = strlen(e->d_name);
        if (n > 12 && !strcmp(e->d_name + n - 12, ".safetensors")) {
            st_file f;
            OK(st_open(&f, p));
            total += f.data_start;
            st_close(&f);
        } else {
            struct stat sb;
            assert_int_equal(stat(p, &sb), 0);
            total += (uint64_t)sb.st_size;
        }
        free(p);
    }
    closedir(d);
    return total;
}

static uint64_t tensor_bytes(const ckpt_state *st)
{
    uint64_t n = 0;
    for (size_t i = 0; i < ckpt_state_param_count(st); i++)
        n += ckpt_state_param_at(st, i)->nbytes;
    for (size_t i = 0; i < ckpt_state_slot_count(st); i++)
        n += ckpt_state_slot_at(st, i)->nbytes;
    return n;
}

static void convert_dir(const char *src, const char *dst, const char *layout, int tp)
{
    convert_opts co = {
        .layout = layout, .tp = tp, .quiet = true, .no_hash = true, .max_shard_size = 3u << 20};
    convert_plan cp;
    OK(convert_plan_build(&cp, src, &co));
    OK(convert_write(&cp, dst, &co));
    convert_plan_free(&cp);
}

/* Loads ranks of layout/tp from src and compares them with convert's output,
 * and the bytes read with 1.2 x the rank's tensors plus headers. */
static void check_rank_loads(const char *scratch, const char *src, const char *layout, int tp,
                             const int *ranks, size_t nranks)
{
    char *conv = join(scratch, layout);
    convert_dir(src, conv, layout, tp);
    for (size_t i = 0; i < nranks; i++) {
        int r = ranks[i];
        ckpt_state_load_options lo = CKPT_STATE_LOAD_OPTIONS_INIT;
        lo.layout = layout;
        lo.tp = tp;
        lo.rank = r;
        ckpt_state *got;
        uint64_t before = proc_rchar();
        OK(ckpt_state_load(src, &lo, &got));
        uint64_t read = proc_rchar() - before;
        char sub[32];
        snprintf(sub, sizeof sub, "tp_rank_%02d", r);
        char *rank_dir = join(conv, sub);
        ckpt_state *want;
        OK(ckpt_state_load(rank_dir, NULL,
                           &want)); /* a rank folder of a converted state is a state */
        assert_true(ckpt_state_slot_count(want) == 2 * ckpt_state_param_count(want));
        assert_same_tensors(want, got);
        assert_int_equal(ckpt_state_step(got), 1200);
        assert_string_equal(ckpt_state_optimizer(got), "adamw");
        uint64_t tensors = tensor_bytes(got), headers = header_bytes(src);
        print_message("%s-tp%d rank %d: read %llu bytes for %llu bytes of tensors + %llu of "
                      "headers (%.3fx)\n",
                      layout, tp, r, (unsigned long long)read, (unsigned long long)tensors,
                      (unsigned long long)headers, (double)read / (double)(tensors + headers));
        if ((double)read > 1.2 * (double)tensors + (double)headers)
            fail_msg("rank %d read %llu bytes, more than 1.2 x %llu + %llu", r,
                     (unsigned long long)read, (unsigned long long)tensors,
                     (unsigned long long)headers);
        ckpt_state_free(want);
        ckpt_state_free(got);
        free(rank_dir);
    }
    free(conv);
}

static void test_rank_load_matches_convert(void **state)
{
    const char *scratch = *state;
    char *src = join(scratch, "state");
    /* qwen2: 14 query heads over 2 KV heads on tp 8: padded heads, replicated KV, q/k/v biases. */
    make_model_state(scratch, src, "qwen2", 8, CKPT_DT_BF16, 2u << 20);
    const int neuron_ranks[] = {0, 3, 7}, easydel_ranks[] = {1};
    check_rank_loads(scratch, src, "neuron", 8, neuron_ranks, CKPT_ARRAY_LEN(neuron_ranks));
    /* easydel transposes every kernel: row-parallel slices become strided reads. */
    check_rank_loads(scratch, src, "easydel", 2, easydel_ranks, CKPT_ARRAY_LEN(easydel_ranks));
    /* "neuron-tp8" says the same; without the optimizer only parameters; a cast widens them. */
    ckpt_state_load_options lo = CKPT_STATE_LOAD_OPTIONS_INIT;
    lo.layout = "neuron-tp8";
    lo.rank = 5;
    lo.load_optimizer = false;
    lo.dtype = "f32";
    ckpt_state *got;
    OK(ckpt_state_load(src, &lo, &got));
    assert_int_equal(ckpt_state_slot_count(got), 0);
    assert_int_equal(ckpt_state_param_at(got, 0)->dtype, CKPT_DT_F32);
    ckpt_state_free(got);
    lo.rank = 8;
    assert_int_equal(ckpt_state_load(src, &lo, &got), CKPT_EINVAL);
    lo.rank = 0;
    lo.tp = 4;
    assert_int_equal(ckpt_state_load(src, &lo, &got), CKPT_EINVAL); /* neuron-tp8 with tp 4 */
    assert_contains(ckpt_error_last(), "says tp 8");
    free(src);
}

/* ---- 3. convert and consolidate ---- */

static void assert_same_file(const char *a, const char *b)
{
    char *x, *y;
    size_t nx, ny;
    OK(ckpt_read_file(a, 1u << 30, &x, &nx));
    OK(ckpt_read_file(b, 1u << 30, &y, &ny));
    if (nx != ny || memcmp(x, y, nx)) fail_msg("%s and %s differ", a, b);
    free(x);
    free(y);
}

/* Every file of a is in b with the same bytes, and b has no others. */
static void assert_same_dir(const char *a, const char *b)
{
    int na = 0, nb = 0;
    DIR *d = opendir(a);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *pa = join(a, e->d_name), *pb = join(b, e->d_name);
        assert_same_file(pa, pb);
        free(pa);
        free(pb);
        na++;
    }
    closedir(d);
    d = opendir(b);
    while ((e = readdir(d)))
        nb += e->d_name[0] != '.';
    closedir(d);
    assert_int_equal(na, nb);
}

static void scale_floats(ckpt_state *st, float by)
{
    for (size_t i = 0; i < ckpt_state_param_count(st) + ckpt_state_slot_count(st); i++) {
        ckpt_tensor *t = i < ckpt_state_param_count(st)
                             ? ckpt_state_param_at(st, i)
                             : ckpt_state_slot_at(st, i - ckpt_state_param_count(st));
        assert_int_equal(t->dtype, CKPT_DT_F32);
        float *v = t->data;
        for (uint64_t k = 0; k < t->numel; k++)
            v[k] *= by;
    }
}

static void test_tp_job_states_consolidate(void **state)
{
    const char *scratch = *state;
    char *src = join(scratch, "state"), *conv = join(scratch, "tp4"), *back = join(scratch, "back");
    char *job = join(scratch, "job"), *job_back = join(scratch, "job-back");
    make_model_state(scratch, src, "llama", 16, CKPT_DT_F32, 1u << 20);
    convert_dir(src, conv, "neuron", 4);
    /* Converted and consolidated back: the same files, optimizer included. */
    consolidate_opts co = {.quiet = true};
    OK(consolidate_run(conv, back, &co));
    assert_same_dir(src, back);

    /* A job trains each rank (here: doubles every value) and saves one state per rank. */
    for (int r = 0; r < 4; r++) {
        char sub[32];
        snprintf(sub, sizeof sub, "tp_rank_%02d", r);
        char *in = join(conv, sub), *out = join(job, sub);
        ckpt_state *st;
        OK(ckpt_state_load(in, NULL, &st));
        scale_floats(st, 2.0f);
        ckpt_state_set_step(st, 1300);
        OK(ckpt_state_set_scalar(st, "count", 1300));
        OK(ckpt_state_save(out, st, NULL));
        ckpt_state_free(st);
        free(in);
        free(out);
    }
    char *layout = read_text(conv, "ckpt-layout.json");
    write_text(job, "ckpt-layout.json", layout);
    free(layout);
    OK(consolidate_run(job, job_back, &co));
    ckpt_state *want, *got;
    OK(ckpt_state_load(src, NULL, &want));
    scale_floats(want, 2.0f);
    OK(ckpt_state_load(job_back, NULL, &got));
    assert_same_tensors(want, got);
    assert_int_equal(ckpt_state_step(got), 1300);
    double count;
    OK(ckpt_state_scalar(&count, got, "count"));
    assert_true(count == 1300);
    ckpt_state_free(want);
    ckpt_state_free(got);

    /* Ranks at different steps do not consolidate. */
    char *r2 = join(job, "tp_rank_02");
    ckpt_state *st;
    OK(ckpt_state_load(r2, NULL, &st));
    ckpt_state_set_step(st, 1299);
    OK(ckpt_state_save(r2, st, NULL));
    ckpt_state_free(st);
    OK(ckpt_rm_rf(job_back));
    assert_int_equal(consolidate_run(job, job_back, &co), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "tp_rank_02 is at step 1299 but tp_rank_00 at step 1300");
    assert_false(ckpt_exists(job_back));
    free(r2);
    free(src);
    free(conv);
    free(back);
    free(job);
    free(job_back);
}

/* An optimizer without slots (plain SGD) still travels through convert and consolidate. */
static void test_convert_state_without_slots(void **state)
{
    const char *scratch = *state;
    char *model = join(scratch, "m"), *src = join(scratch, "s"), *conv = join(scratch, "c");
    char *back = join(scratch, "b");
    genmodel_opts go;
    genmodel_opts_init(&go, "llama");
    go.scale = 64;
    go.layers = 1;
    OK(genmodel_write(&go, model));
    ckpt_state *st;
    OK(state_from_checkpoint(model, &st));
    OK(ckpt_state_set_optimizer(st, "sgd"));
    OK(ckpt_state_set_hyperparameter(st, "lr", 0.1));
    OK(ckpt_state_save(src, st, NULL));
    ckpt_state_free(st);
    convert_dir(src, conv, "hf", 2);
    char *rank1 = join(conv, "tp_rank_01");
    OK(ckpt_state_load(rank1, NULL, &st));
    assert_string_equal(ckpt_state_optimizer(st), "sgd");
    assert_int_equal(ckpt_state_slot_count(st), 0);
    ckpt_state_free(st);
    consolidate_opts co = {.quiet = true};
    OK(consolidate_run(conv, back, &co));
    assert_same_dir(src, back);
    free(rank1);
    free(model);
    free(src);
    free(conv);
    free(back);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, scratch_setup, scratch_teardown)
        T(test_round_trip_every_dtype),
        T(test_load_is_zero_copy),
        T(test_casts_round_as_the_spec_says),
        T(test_kill_during_save_keeps_previous_state),
        T(test_load_while_saving),
        T(test_bad_input_loads_nothing),
        T(test_api_errors),
        T(test_save_without_optimizer_name_fails),
        T(test_rank_load_matches_convert),
        T(test_tp_job_states_consolidate),
        T(test_convert_state_without_slots),
#undef T
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_zarr.c — zarr v2 arrays and EasyDeL TensorStore checkpoints
 * (format/zarr.c, format/easydel.c).
 *
 * .zarray validation (every field, each refusal naming the array); reading
 * arrays whose chunks are written here with libzstd's own compressor (edge
 * chunks padded as zarr and TensorStore write them, "." and "/" keys, a
 * missing chunk read as the fill value, uncompressed chunks, a scalar);
 * hostile chunks (more bytes than a chunk — with and without the frame's
 * content size —, fewer, not zstd, a symbolic link); and the index of an
 * EasyDeL checkpoint (paths leaving the folder, dtype and shape disagreeing
 * with .zarray, the step).
 */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"
#include "format/easydel.h"
#include "format/zarr.h"

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <cmocka.h>

#include "tests/support/scratch.h"

static char *join(const char *a, const char *b)
{
    char *p = ckpt_path_join(a, b);
    assert_non_null(p);
    return p;
}

static void put(const char *dir, const char *rel, const void *buf, size_t len)
{
    char *p = join(dir, rel);
    char *slash = strrchr(p, '/');
    *slash = 0;
    assert_int_equal(ckpt_mkdir_p(p, 0755), 0);
    *slash = '/';
    assert_int_equal(ckpt_write_file_atomic(p, buf, len), 0);
    free(p);
}

static void put_str(const char *dir, const char *rel, const char *s) { put(dir, rel, s, strlen(s)); }

static void put_zstd(const char *dir, const char *rel, const void *buf, size_t len)
{
    size_t cap = ZSTD_compressBound(len);
    void *z = malloc(cap);
    size_t n = ZSTD_compress(z, cap, buf, len, 1);
    assert_false(ZSTD_isError(n));
    put(dir, rel, z, n);
    free(z);
}

/* A zstd frame that does not record its content size (streaming). */
static void put_zstd_stream(const char *dir, const char *rel, const void *buf, size_t len)
{
    ZSTD_CCtx *c = ZSTD_createCCtx();
    size_t cap = ZSTD_compressBound(len) + 64;
    uint8_t *z = malloc(cap);
    ZSTD_outBuffer ob = {z, cap, 0};
    ZSTD_inBuffer ib = {buf, len, 0};
    ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 0);
    assert_false(ZSTD_isError(ZSTD_compressStream2(c, &ob, &ib, ZSTD_e_continue)));
    assert_int_equal(ZSTD_compressStream2(c, &ob, &ib, ZSTD_e_end), 0);
    put(dir, rel, z, ob.pos);
    free(z);
    ZSTD_freeCCtx(c);
}

static int parse(zarr_array *a, const char *json) { return zarr_parse_meta(a, "arr", json, strlen(json)); }

#define META(extra)                                                                                                  \
    "{\"zarr_format\":2,\"shape\":[5,7],\"chunks\":[2,3],\"dtype\":\"<i4\",\"compressor\":{\"id\":\"zstd\","      \
    "\"level\":1},\"fill_value\":7,\"order\":\"C\",\"filters\":null" extra "}"

static void test_meta_ok(void **state)
{
    zarr_array a;
    assert_int_equal(parse(&a, META(",\"dimension_separator\":\".\"")), 0);
    assert_int_equal(a.ndim, 2);
    assert_int_equal(a.dtype, CKPT_DT_I32);
    assert_int_equal(a.grid[0], 3);
    assert_int_equal(a.grid[1], 3);
    assert_int_equal(a.nchunks, 9);
    assert_int_equal(a.chunk_nbytes, 24);
    assert_int_equal(a.nbytes, 140);
    assert_true(a.zstd);
    assert_int_equal(a.sep, '.');
    assert_int_equal(a.fill[0], 7);
    uint64_t idx[2] = {2, 1};
    char key[32];
    assert_true(zarr_chunk_key(&a, idx, key, sizeof key));
    assert_string_equal(key, "2.1");
    zarr_close(&a);
    /* TensorStore's bfloat16, null fill, "/" keys, no compressor */
    assert_int_equal(parse(&a, "{\"zarr_format\":2,\"shape\":[4],\"chunks\":[4],\"dtype\":\"bfloat16\",\"compressor\":"
                               "null,\"fill_value\":null,\"order\":\"C\",\"filters\":null,\"dimension_separator\":\"/\"}"),
                     0);
    assert_int_equal(a.dtype, CKPT_DT_BF16);
    assert_false(a.zstd);
    zarr_close(&a);
    /* a scalar */
    assert_int_equal(parse(&a, "{\"zarr_format\":2,\"shape\":[],\"chunks\":[],\"dtype\":\"<f4\",\"compressor\":null,"
                               "\"fill_value\":\"NaN\",\"order\":\"C\",\"filters\":null}"),
                     0);
    assert_int_equal(a.nbytes, 4);
    assert_int_equal(a.nchunks, 1);
    zarr_close(&a);
}

static void refused(const char *json, const char *msg)
{
    zarr_array a;
    assert_true(parse(&a, json) < 0);
    assert_contains(ckpt_error_last(), "arr: ");
    assert_contains(ckpt_error_last(), msg);
}

static void test_meta_refused(void **state)
{
    refused(META(",\"dimension_separator\":\"-\""), "dimension_separator");
    refused("{\"zarr_format\":3}", "'zarr_format' is not 2");
    refused(META(",\"extra\":1"), "unknown field 'extra'");
    refused("{\"zarr_format\":2,\"shape\":[5,7],\"chunks\":[2],\"dtype\":\"<i4\",\"compressor\":null,\"fill_value\":0,"
            "\"order\":\"C\",\"filters\":null}",
            "'chunks' has 1 dimensions");
    refused("{\"zarr_format\":2,\"shape\":[5],\"chunks\":[0],\"dtype\":\"<i4\",\"compressor\":null,\"fill_value\":0,"
            "\"order\":\"C\",\"filters\":null}",
            "'chunks'[0] is not a positive integer");
    refused("{\"zarr_format\":2,\"shape\":[-1],\"chunks\":[1],\"dtype\":\"<i4\",\"compressor\":null,\"fill_value\":0,"
            "\"order\":\"C\",\"filters\":null}",
            "'shape'[0] is not a non-negative integer");
    refused("{\"zarr_format\":2,\"shape\":[5],\"chunks\":[1],\"dtype\":\">f4\",\"compressor\":null,\"fill_value\":0,"
            "\"order\":\"C\",\"filters\":null}",
            "big-endian");
    refused("{\"zarr_format\":2,\"shape\":[5],\"chunks\":[1],\"dtype\":\"<M8\",\"compressor\":null,\"fill_value\":0,"
            "\"order\":\"C\",\"filters\":null}",
            "dtype '<M8' is not read");
    refused("{\"zarr_format\":2,\"shape\":[5],\"chunks\":[1],\"dtype\":\"<f4\",\"compressor\":{\"id\":\"blosc\"},"
            "\"fill_value\":0,\"order\":\"C\",\"filters\":null}",
            "compressor 'blosc' is not read");
    refused("{\"zarr_format\":2,\"shape\":[5],\"chunks\":[1],\"dtype\":\"<f4\",\"compressor\":null,\"fill_value\":0,"
            "\"order\":\"F\",\"filters\":null}",
            "only \"C\" is read");
    refused("{\"zarr_format\":2,\"shape\":[5],\"chunks\":[1],\"dtype\":\"<f4\",\"compressor\":null,\"fill_value\":0,"
            "\"order\":\"C\",\"filters\":[{\"id\":\"delta\"}]}",
            "'filters' must be null");
    refused("{\"zarr_format\":2,\"shape\":[5],\"chunks\":[1],\"dtype\":\"<f4\",\"compressor\":null,"
            "\"order\":\"C\",\"filters\":null}",
            "'fill_value' is missing");
    refused("{\"zarr_format\":2,\"shape\":[5],\"chunks\":[1],\"dtype\":\"|u1\",\"compressor\":null,\"fill_value\":256,"
            "\"order\":\"C\",\"filters\":null}",
            "does not fit");
    refused("{\"zarr_format\":2,\"shape\":[1099511627776,1099511627776],\"chunks\":[1099511627776,1099511627776],"
            "\"dtype\":\"<f4\",\"compressor\":null,\"fill_value\":0,\"order\":\"C\",\"filters\":null}",
            "a chunk is above");
    refused("{\"zarr_format\":2,\"shape\":[1099511627776],\"chunks\":[1],"
            "\"dtype\":\"<f4\",\"compressor\":null,\"fill_value\":0,\"order\":\"C\",\"filters\":null}",
            "chunks or overflow");
    refused("[1,2]", "not a JSON object");
    refused("{", "not JSON");
}

/* ---- reading ---- */

typedef struct {
    uint8_t *buf;
    uint64_t len;
    uint64_t *seen; /* times each byte was written */
} mem_sink;

static int to_mem(void *ctx, uint64_t off, const void *buf, size_t len)
{
    mem_sink *m = ctx;
    assert_true(off + len <= m->len);
    memcpy(m->buf + off, buf, len);
    for (size_t i = 0; i < len; i++) m->seen[off + i]++;
    return 0;
}

/* The 5x7 int32 array v[i][j] = 100 i + j in chunks of 2x3, each chunk padded
 * to 2x3 with -1 as zarr writes edge chunks. */
static void chunk_bytes(int ci, int cj, int32_t out[6])
{
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++) {
            int i = ci * 2 + a, j = cj * 3 + b;
            out[a * 3 + b] = (i < 5 && j < 7) ? 100 * i + j : -1;
        }
}

static void write_array(const char *dir, const char *rel, char sep, bool skip_11)
{
    char meta[512], key[64];
    snprintf(meta, sizeof meta,
             "{\"zarr_format\":2,\"shape\":[5,7],\"chunks\":[2,3],\"dtype\":\"<i4\",\"compressor\":{\"id\":\"zstd\","
             "\"level\":1},\"fill_value\":7,\"order\":\"C\",\"filters\":null,\"dimension_separator\":\"%c\"}",
             sep);
    snprintf(key, sizeof key, "%s/.zarray", rel);
    put_str(dir, key, meta);
    for (int ci = 0; ci < 3; ci++)
        for (int cj = 0; cj < 3; cj++) {
            if (skip_11 && ci == 1 && cj == 1) continue;
            int32_t c[6];
            chunk_bytes(ci, cj, c);
            snprintf(key, sizeof key, "%s/%d%c%d", rel, ci, sep, cj);
            put_zstd(dir, key, c, sizeof c);
        }
}

/* Opens array rel under dir (labelled "arr" in messages). */
static int open_arr(const char *dir, const char *rel, zarr_array *a)
{
    int root = open(dir, O_RDONLY | O_DIRECTORY);
    assert_true(root >= 0);
    int rc = zarr_open(a, root, rel, "arr");
    close(root);
    return rc;
}

static int read_all(const char *dir, const char *rel, int32_t v[35])
{
    zarr_array a;
    int rc = open_arr(dir, rel, &a);
    if (rc) return rc;
    uint64_t seen[140] = {0};
    mem_sink m = {(uint8_t *)v, 140, seen};
    zarr_stats st;
    rc = zarr_read(&a, to_mem, &m, &st);
    zarr_close(&a);
    if (!rc)
        for (int i = 0; i < 140; i++) assert_int_equal(seen[i], 1);
    return rc;
}

/* Reading array rel is refused with a message holding needle. */
static void expect_refused(const char *dir, const char *rel, const char *needle)
{
    int32_t v[35];
    assert_true(read_all(dir, rel, v) < 0);
    assert_contains(ckpt_error_last(), needle);
}

static void test_read(void **state)
{
    const char *dir = *state;
    write_array(dir, "dot", '.', false);
    write_array(dir, "a/slash", '/', true);
    int32_t v[35];
    assert_int_equal(read_all(dir, "dot", v), 0);
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 7; j++) assert_int_equal(v[i * 7 + j], 100 * i + j);
    assert_int_equal(read_all(dir, "a/slash", v), 0);
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 7; j++) {
            bool missing = i >= 2 && i < 4 && j >= 3 && j < 6;
            assert_int_equal(v[i * 7 + j], missing ? 7 : 100 * i + j);
        }
    /* stats: 8 of 9 chunks present */
    int root = open(dir, O_RDONLY | O_DIRECTORY);
    zarr_array a;
    assert_int_equal(zarr_open(&a, root, "a/slash", "arr"), 0);
    zarr_stats st;
    assert_int_equal(zarr_stat(&a, &st), 0);
    assert_int_equal(st.chunks_present, 8);
    zarr_close(&a);
    /* a scalar, uncompressed */
    put_str(dir, "s/.zarray",
            "{\"zarr_format\":2,\"shape\":[],\"chunks\":[],\"dtype\":\"<i4\",\"compressor\":null,\"fill_value\":0,"
            "\"order\":\"C\",\"filters\":null}");
    int32_t x = 42, got = 0;
    put(dir, "s/0", &x, 4);
    assert_int_equal(zarr_open(&a, root, "s", "arr"), 0);
    uint64_t seen[4] = {0};
    mem_sink m = {(uint8_t *)&got, 4, seen};
    assert_int_equal(zarr_read(&a, to_mem, &m, NULL), 0);
    assert_int_equal(got, 42);
    zarr_close(&a);
    close(root);
}

static void test_hostile_chunks(void **state)
{
    const char *dir = *state;
    int32_t v[35], c[6], big[64] = {0};
    chunk_bytes(0, 0, c);
    /* more bytes than a chunk, recorded in the frame */
    write_array(dir, "bomb", '.', false);
    put_zstd(dir, "bomb/0.0", big, sizeof big);
    expect_refused(dir, "bomb", "arr: chunk '0.0' decompresses to 256 bytes, a chunk is 24");
    /* a zstd bomb without a content size: stops one byte past the chunk */
    size_t huge = 64u << 20;
    uint8_t *zeros = calloc(1, huge);
    put_zstd_stream(dir, "bomb/0.0", zeros, huge);
    free(zeros);
    expect_refused(dir, "bomb", "arr: chunk '0.0' decompresses to more than 24 bytes");
    /* fewer bytes */
    put_zstd_stream(dir, "bomb/0.0", c, 20);
    expect_refused(dir, "bomb", "decompresses to 20 bytes, a chunk is 24");
    /* not zstd */
    put_str(dir, "bomb/0.0", "hello, not a frame");
    expect_refused(dir, "bomb", "arr: chunk '0.0' is not a zstd frame");
    /* a truncated frame */
    size_t cap = ZSTD_compressBound(sizeof c);
    uint8_t *z = malloc(cap + 64);
    size_t n = ZSTD_compress(z, cap, c, sizeof c, 1);
    put(dir, "bomb/0.0", z, n - 3);
    expect_refused(dir, "bomb", "arr: chunk '0.0'");
    /* a whole frame, then bytes that are no frame; then a second frame */
    memcpy(z + n, "junk", 4);
    put(dir, "bomb/0.0", z, n + 4);
    expect_refused(dir, "bomb", "arr: chunk '0.0'");
    memcpy(z + n, z, n);
    put(dir, "bomb/0.0", z, 2 * n);
    expect_refused(dir, "bomb", "arr: chunk '0.0' decompresses to more than 24 bytes");
    free(z);
    /* a chunk that is a symbolic link */
    char *outside = join(dir, "outside");
    put_zstd(dir, "outside", c, sizeof c);
    char *link = join(dir, "bomb/0.0");
    unlink(link);
    assert_int_equal(symlink(outside, link), 0);
    assert_true(read_all(dir, "bomb", v) < 0);
    assert_contains(ckpt_error_last(), "symbolic links are not followed");
    free(link);
    free(outside);
    /* the array's folder through a link, and paths leaving the folder */
    char *target = join(dir, "dot2");
    write_array(dir, "dot2", '.', false);
    char *l2 = join(dir, "linked");
    assert_int_equal(symlink(target, l2), 0);
    assert_true(read_all(dir, "linked", v) < 0);
    assert_contains(ckpt_error_last(), "symbolic links are not followed");
    assert_true(read_all(dir, "../x", v) < 0);
    assert_contains(ckpt_error_last(), "leaves the checkpoint folder");
    assert_true(read_all(dir, "/etc", v) < 0);
    assert_false(zarr_rel_path_safe("a//b"));
    assert_false(zarr_rel_path_safe("a/./b"));
    assert_false(zarr_rel_path_safe("a/"));
    assert_false(zarr_rel_path_safe("a\\b"));
    assert_true(zarr_rel_path_safe("model/model/layers/0/kernel"));
    free(target);
    free(l2);
    /* uncompressed chunk of the wrong size */
    put_str(dir, "raw/.zarray",
            "{\"zarr_format\":2,\"shape\":[5,7],\"chunks\":[2,3],\"dtype\":\"<i4\",\"compressor\":null,"
            "\"fill_value\":0,\"order\":\"C\",\"filters\":null}");
    put(dir, "raw/0.0", c, 20);
    assert_true(read_all(dir, "raw", v) < 0);
    assert_contains(ckpt_error_last(), "arr: chunk '0.0' is 20 bytes, an uncompressed chunk is 24");
}

/* ---- the EasyDeL index ---- */

static void test_easydel_index(void **state)
{
    const char *dir = *state;
    write_array(dir, "model/model/w", '.', false);
    put_str(dir, "metadata.json", "{\"step\": 77, \"is_temporary\": false}");
    put_str(dir, "tensorstore_index.json",
            "{\"format\":\"tensorstore\",\"version\":\"0.0.80\",\"prefixes\":{\"model\":"
            "[{\"path\":\"model/model/w\",\"shape\":[5,7],\"dtype\":\"int32\"}]}}");
    assert_true(easydel_is_checkpoint(dir));
    easydel_ckpt c;
    assert_int_equal(easydel_open(&c, dir), 0);
    assert_int_equal(c.narrays, 1);
    assert_true(c.has_step);
    assert_int_equal(c.step, 77);
    assert_string_equal(c.arrays[0].key, "model.w");
    assert_non_null(easydel_find(&c, "model", "model.w"));
    easydel_close(&c);

    static const struct {
        const char *entry, *msg;
    } bad[] = {
        {"{\"path\":\"model/../../etc\",\"shape\":[5,7],\"dtype\":\"int32\"}", "leaves the checkpoint folder"},
        {"{\"path\":\"/etc/passwd\",\"shape\":[5,7],\"dtype\":\"int32\"}", "leaves the checkpoint folder"},
        {"{\"path\":\"tx/w\",\"shape\":[5,7],\"dtype\":\"int32\"}", "not in its folder"},
        {"{\"path\":\"model/model/w\",\"shape\":[5,7],\"dtype\":\"float32\"}", "the index says dtype 'float32'"},
        {"{\"path\":\"model/model/w\",\"shape\":[7,5],\"dtype\":\"int32\"}", "shape differs"},
        {"{\"path\":\"model/model/none\",\"shape\":[1],\"dtype\":\"int32\"}", "array 'model/model/none'"},
    };
    for (size_t i = 0; i < CKPT_ARRAY_LEN(bad); i++) {
        char ix[512];
        snprintf(ix, sizeof ix, "{\"format\":\"tensorstore\",\"prefixes\":{\"model\":[%s]}}", bad[i].entry);
        put_str(dir, "tensorstore_index.json", ix);
        assert_true(easydel_open(&c, dir) < 0);
        assert_contains(ckpt_error_last(), bad[i].msg);
    }
    put_str(dir, "tensorstore_index.json",
            "{\"format\":\"tensorstore\",\"prefixes\":{\"model\":[{\"path\":\"model/model/w\",\"shape\":[5,7],"
            "\"dtype\":\"int32\"},{\"path\":\"model/model/w\",\"shape\":[5,7],\"dtype\":\"int32\"}]}}");
    assert_true(easydel_open(&c, dir) < 0);
    assert_contains(ckpt_error_last(), "listed twice");
    put_str(dir, "tensorstore_index.json", "{\"format\":\"orbax\",\"prefixes\":{}}");
    assert_true(easydel_open(&c, dir) < 0);
    assert_contains(ckpt_error_last(), "format 'orbax'");
    put_str(dir, "tensorstore_index.json",
            "{\"format\":\"tensorstore\",\"prefixes\":{\"model\":[{\"path\":\"model/model/w\",\"shape\":[5,7],"
            "\"dtype\":\"int32\"}]}}");
    put_str(dir, "metadata.json", "{\"step\": \"seven\"}");
    assert_true(easydel_open(&c, dir) < 0);
    assert_contains(ckpt_error_last(), "'step' is not a non-negative integer");
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, scratch_setup, scratch_teardown)
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_meta_ok), cmocka_unit_test(test_meta_refused), T(test_read), T(test_hostile_chunks),
        T(test_easydel_index),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

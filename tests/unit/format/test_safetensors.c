/*
 * test_safetensors.c — the safetensors reader and writer (format/safetensors.c).
 *
 * Reader: one crafted bad file per row of docs/safetensors.md's table, each
 * checked through st_open (from disk) and st_parse (from memory) for the
 * error code, the "<path>: <ReferenceName>: " prefix and the tensor name;
 * then the valid edge cases (scalar, zero-size, "{}", unknown keys,
 * metadata) and a deterministic mutation loop for memory safety.
 * Writer: header bytes compared with hand-computed literals, escaping, the
 * layout's own checks, a write/read round trip and aborted writes.
 *
 * Files live in a fresh directory under $TMPDIR (or /tmp) per test.
 */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"
#include "format/safetensors.h"

#include <dirent.h>
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

#include <cmocka.h>

#include "tests/support/scratch.h"

/* ---- fixture and helpers ---- */

/* A file image: 8-byte little-endian n_field, then json_len bytes of json,
 * then data_len bytes counting up from 0. */
static uint8_t *make_image(const char *json, size_t json_len, uint64_t n_field, size_t data_len,
                           size_t *len)
{
    *len = 8 + json_len + data_len;
    uint8_t *b = malloc(*len);
    assert_non_null(b);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(n_field >> (8 * i));
    memcpy(b + 8, json, json_len);
    for (size_t i = 0; i < data_len; i++)
        b[8 + json_len + i] = (uint8_t)i;
    return b;
}

static char *write_bytes(const char *dir, const char *name, const void *bytes, size_t len)
{
    char *path = ckpt_path_join(dir, name);
    assert_non_null(path);
    assert_int_equal(ckpt_write_file_atomic(path, bytes, len), 0);
    return path;
}

/* A well-formed file: N = strlen(json), data_len bytes of data. */
static char *write_st(const char *dir, const char *name, const char *json, size_t data_len)
{
    size_t len;
    uint8_t *img = make_image(json, strlen(json), strlen(json), data_len, &len);
    char *path = write_bytes(dir, name, img, len);
    free(img);
    return path;
}

/* Checks one failure: code, "<path>: <ref>: " prefix, and the tensor name in quotes. */
static void check_failure(int rc, const st_file *f, const char *path, int code, const char *ref,
                          const char *tensor)
{
    const char *msg = ckpt_error_last();
    if (rc != code) fail_msg("expected %d, got %d: %s", code, rc, msg);
    char *prefix = ckpt_sprintf("%s: %s: ", path, ref);
    assert_non_null(prefix);
    if (strncmp(msg, prefix, strlen(prefix)) != 0)
        fail_msg("message \"%s\" does not start with \"%s\"", msg, prefix);
    free(prefix);
    if (tensor) {
        char *quoted = ckpt_sprintf("'%s'", tensor);
        assert_contains(msg, quoted);
        free(quoted);
    }
    assert_int_equal(f->fd, -1);
    assert_null(f->tensors);
    assert_null(f->path);
}

/* An image that must fail the same way from disk and from memory. */
static void expect_bad_image(const char *dir, const uint8_t *img, size_t len, int code,
                             const char *ref, const char *tensor)
{
    st_file f;
    char *path = write_bytes(dir, "bad.safetensors", img, len);
    check_failure(st_open(&f, path), &f, path, code, ref, tensor);
    check_failure(st_parse(&f, "mem", img, len, len), &f, "mem", code, ref, tensor);
    free(path);
}

/* A header (N = its length) plus data_len bytes that must fail. */
static void expect_bad(const char *dir, const char *json, size_t data_len, int code,
                       const char *ref, const char *tensor)
{
    size_t len;
    uint8_t *img = make_image(json, strlen(json), strlen(json), data_len, &len);
    expect_bad_image(dir, img, len, code, ref, tensor);
    free(img);
}

static void open_ok(st_file *f, const char *path)
{
    if (st_open(f, path) != 0) fail_msg("st_open(%s): %s", path, ckpt_error_last());
}

/* ---- reader: one test per row of the table ---- */

static void test_header_too_small(void **state)
{
    const uint8_t bytes[7] = {1, 0, 0, 0, 0, 0, 0};
    for (size_t len = 0; len < 8; len++)
        expect_bad_image(*state, bytes, len, CKPT_EINVAL, "HeaderTooSmall", NULL);
}

static void test_header_too_large(void **state)
{
    size_t len;
    uint8_t *img = make_image("{}", 2, 100000001ULL, 0, &len);
    expect_bad_image(*state, img, len, CKPT_ELIMIT, "HeaderTooLarge", NULL);
    free(img);
    img = make_image("{}", 2, UINT64_MAX, 0, &len);
    expect_bad_image(*state, img, len, CKPT_ELIMIT, "HeaderTooLarge", NULL);
    free(img);
}

static void test_invalid_header_length(void **state)
{
    size_t len;
    /* N = 100 but only 42 bytes follow. */
    const char *json = "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offse";
    uint8_t *img = make_image(json, strlen(json), 100, 0, &len);
    expect_bad_image(*state, img, len, CKPT_EINVAL, "InvalidHeaderLength", NULL);
    free(img);
    /* The largest allowed N, in a small file. */
    img = make_image("{}", 2, 100000000ULL, 0, &len);
    expect_bad_image(*state, img, len, CKPT_EINVAL, "InvalidHeaderLength", NULL);
    free(img);
    /* N one past the end. */
    img = make_image("{}", 2, 3, 0, &len);
    expect_bad_image(*state, img, len, CKPT_EINVAL, "InvalidHeaderLength", NULL);
    free(img);
}

static void test_invalid_header_utf8(void **state)
{
    static const char *const headers[] = {
        "{\"a\xff\":{}}",            /* invalid byte */
        "{\"\xc0\xaf\":{}}",         /* overlong '/' */
        "{\"\xed\xa0\x80\":{}}",     /* UTF-16 surrogate */
        "{\"\xf4\x90\x80\x80\":{}}", /* above U+10FFFF */
        "{\"x\":{}}  \xe2\x82",      /* truncated sequence at the end */
        "{\"\x80\":{}}",             /* lone continuation byte */
    };
    for (size_t i = 0; i < CKPT_ARRAY_LEN(headers); i++)
        expect_bad(*state, headers[i], 0, CKPT_EINVAL, "InvalidHeader", NULL);
}

static void test_invalid_header_deserialization(void **state)
{
    static const struct {
        const char *json;
        const char *tensor; /* named in the message, or NULL */
        const char *detail;
    } cases[] = {
        {"{\"a\":", NULL, "invalid JSON"},
        {"[]", NULL, "not a JSON object"},
        {"{\"a\":{}} x", NULL, "invalid JSON"},
        {"{\"a\":1}", "a", "not an object"},
        {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", "a", "'dtype'"},
        {"{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", "a", "'shape'"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", "a", "'data_offsets'"},
        {"{\"a\":{\"dtype\":8,\"shape\":[1],\"data_offsets\":[0,1]}}", "a", "'dtype'"},
        {"{\"a\":{\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[0,1]}}", "a", "F128"},
        {"{\"a\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", "a", "f32"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", "a", "shape[0]"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", "a", "shape[0]"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":\"1\",\"data_offsets\":[0,1]}}", "a", "'shape'"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", "a", "data_offsets"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", "a", "data_offsets"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", "a",
         "data_offsets[0]"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,\"1\"]}}", "a",
         "data_offsets[1]"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[99999999999999999999],\"data_offsets\":[0,1]}}", NULL,
         "invalid JSON"},
        {"{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", "a",
         "duplicate key 'dtype'"},
        {"{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", NULL,
         "invalid JSON"},
        {"{\"__metadata__\":{\"k\":1}}", NULL, "__metadata__"},
        {"{\"__metadata__\":[\"k\"]}", NULL, "__metadata__"},
        {"{\"__metadata__\":\"k\"}", NULL, "__metadata__"},
        {"{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", NULL, "duplicate key 'k'"},
        {"{\"__metadata__\":{},\"__metadata__\":{}}", NULL, "'__metadata__'"},
    };
    for (size_t i = 0; i < CKPT_ARRAY_LEN(cases); i++) {
        expect_bad(*state, cases[i].json, 1, CKPT_EINVAL, "InvalidHeaderDeserialization",
                   cases[i].tensor);
        assert_contains(ckpt_error_last(), cases[i].detail);
    }
}

static void test_invalid_offset(void **state)
{
    /* The first tensor does not begin at 0. */
    expect_bad(*state, "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}", 8,
               CKPT_EINVAL, "InvalidOffset", "w");
    assert_contains(ckpt_error_last(), "begins at 4, expected 0");
    /* A gap between two tensors. */
    expect_bad(*state,
               "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
               "\"b.weight\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}",
               5, CKPT_EINVAL, "InvalidOffset", "b.weight");
    assert_contains(ckpt_error_last(), "begins at 3, expected 2");
    /* Overlap (listed out of order: the reader sorts by offsets first). */
    expect_bad(*state,
               "{\"late\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]},"
               "\"early\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
               6, CKPT_EINVAL, "InvalidOffset", "late");
    assert_contains(ckpt_error_last(), "begins at 2, expected 4");
    /* end < begin. */
    expect_bad(*state,
               "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
               "\"back\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,1]}}",
               2, CKPT_EINVAL, "InvalidOffset", "back");
    assert_contains(ckpt_error_last(), "before it begins");
}

static void test_validation_overflow(void **state)
{
    expect_bad(*state,
               "{\"huge\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],"
               "\"data_offsets\":[0,0]}}",
               0, CKPT_ELIMIT, "ValidationOverflow", "huge");
    /* Elements fit, bits do not. */
    expect_bad(*state,
               "{\"bits\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],"
               "\"data_offsets\":[0,0]}}",
               0, CKPT_ELIMIT, "ValidationOverflow", "bits");
}

static void test_misaligned_slice(void **state)
{
    expect_bad(*state, "{\"f4\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2,
               CKPT_EINVAL, "MisalignedSlice", "f4");
    expect_bad(*state, "{\"f6\":{\"dtype\":\"F6_E2M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2,
               CKPT_EINVAL, "MisalignedSlice", "f6");
}

static void test_tensor_invalid_info(void **state)
{
    expect_bad(*state,
               "{\"model.embed\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20,
               CKPT_EINVAL, "TensorInvalidInfo", "model.embed");
    assert_contains(ckpt_error_last(), "24 bytes");
}

static void test_metadata_incomplete_buffer(void **state)
{
    const char *json = "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    expect_bad(*state, json, 9, CKPT_EINVAL, "MetadataIncompleteBuffer", "t"); /* trailing byte */
    expect_bad(*state, json, 7, CKPT_EINVAL, "MetadataIncompleteBuffer", "t"); /* one short */
    expect_bad(*state, "{}", 1, CKPT_EINVAL, "MetadataIncompleteBuffer", NULL);
}

static void test_duplicate_tensor(void **state)
{
    expect_bad(*state,
               "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
               "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
               2, CKPT_EINVAL, "DuplicateTensor", "w");
    /* Escapes inside the repeated name are decoded in the message. */
    expect_bad(*state,
               "{\"x\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]},"
               "\"q\\\"\\u00e9\" : {\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[1,2]},"
               "\"q\\\"\xc3\xa9\"   :{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[2,3]}}",
               3, CKPT_EINVAL, "DuplicateTensor", "q\"\xc3\xa9");
}

static void test_limits(void **state)
{
    expect_bad(*state,
               "{\"deep\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"
               "\"data_offsets\":[0,1]}}",
               1, CKPT_ELIMIT, "LimitExceeded", "deep");

    char *long_name = malloc(ST_MAX_NAME + 2);
    assert_non_null(long_name);
    memset(long_name, 'n', ST_MAX_NAME + 1);
    long_name[ST_MAX_NAME + 1] = '\0';
    char *json =
        ckpt_sprintf("{\"%s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", long_name);
    expect_bad(*state, json, 1, CKPT_ELIMIT, "LimitExceeded", NULL);
    free(json);
    /* ST_MAX_NAME itself is fine. */
    long_name[ST_MAX_NAME] = '\0';
    json =
        ckpt_sprintf("{\"%s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", long_name);
    size_t len;
    uint8_t *img = make_image(json, strlen(json), strlen(json), 1, &len);
    st_file f;
    assert_int_equal(st_parse(&f, "mem", img, len, len), 0);
    assert_int_equal(strlen(f.tensors[0].name), ST_MAX_NAME);
    st_close(&f);
    free(img);
    free(json);
    free(long_name);

    /* One metadata entry too many. */
    char *meta = NULL;
    size_t meta_len = 0;
    FILE *out = open_memstream(&meta, &meta_len);
    assert_non_null(out);
    fputs("{\"__metadata__\":{", out);
    for (int i = 0; i <= ST_MAX_META; i++)
        fprintf(out, "%s\"k%d\":\"v\"", i ? "," : "", i);
    fputs("}}", out);
    fclose(out);
    expect_bad(*state, meta, 0, CKPT_ELIMIT, "LimitExceeded", NULL);
    free(meta);
}

static void test_open_not_a_file(void **state)
{
    st_file f;
    char *missing = ckpt_path_join(*state, "missing.safetensors");
    assert_int_equal(st_open(&f, missing), CKPT_ENOTFOUND);
    assert_contains(ckpt_error_last(), missing);
    assert_int_equal(st_open(&f, *state), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "not a regular file");
    free(missing);
}

/* ---- reader: valid files ---- */

static void test_valid_scalar_and_zero_size(void **state)
{
    /* Two zero-size tensors share offset 8 with the scalar before them. */
    char *path = write_st(*state, "ok.safetensors",
                          "{\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[8,8]},"
                          "\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
                          "\"e\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[8,8]}}",
                          8);
    st_file f;
    open_ok(&f, path);
    assert_int_equal(f.ntensors, 3);
    assert_string_equal(f.tensors[0].name, "s");
    assert_string_equal(f.tensors[1].name, "e");
    assert_string_equal(f.tensors[2].name, "z");
    const st_tensor *s = st_find(&f, "s");
    assert_non_null(s);
    assert_int_equal(s->ndim, 0);
    assert_int_equal(s->dtype, CKPT_DT_F64);
    assert_int_equal(s->nbytes, 8);
    assert_int_equal(s->offset, f.data_start);
    const st_tensor *z = st_find(&f, "z");
    assert_non_null(z);
    assert_int_equal(z->ndim, 2);
    assert_int_equal(z->shape[0], 0);
    assert_int_equal(z->shape[1], 3);
    assert_int_equal(z->nbytes, 0);
    assert_int_equal(z->begin, 8);
    assert_null(st_find(&f, "missing"));
    uint8_t buf[8];
    assert_int_equal(st_read_tensor(&f, s, buf), 0);
    for (int i = 0; i < 8; i++)
        assert_int_equal(buf[i], i);
    assert_int_equal(st_read_tensor(&f, z, buf), 0);
    st_close(&f);
    assert_int_equal(f.fd, -1);
    free(path);
}

static void test_valid_empty_header(void **state)
{
    static const char *const headers[] = {"{}", "{}      ", "{\"__metadata__\":{}}"};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(headers); i++) {
        char *path = write_st(*state, "empty.safetensors", headers[i], 0);
        st_file f;
        open_ok(&f, path);
        assert_int_equal(f.ntensors, 0);
        assert_int_equal(f.header_len, strlen(headers[i]));
        assert_int_equal(f.data_start, 8 + strlen(headers[i]));
        assert_int_equal(f.file_size, f.data_start);
        assert_null(st_find(&f, "x"));
        st_close(&f);
        free(path);
    }
}

static void test_valid_unknown_keys_and_metadata(void **state)
{
    char *path = write_st(*state, "meta.safetensors",
                          "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"a\\nb \\u00e9\"},"
                          "\"w\":{\"extra\":{\"x\":[1,-2.5,null]},\"dtype\":\"I16\","
                          "\"shape\":[3],\"data_offsets\":[0,6],\"more\":\"y\"}}   ",
                          6);
    st_file f;
    open_ok(&f, path);
    assert_int_equal(f.nmeta, 2);
    assert_string_equal(st_meta_get(&f, "format"), "pt");
    assert_string_equal(st_meta_get(&f, "note"), "a\nb \xc3\xa9");
    assert_null(st_meta_get(&f, "absent"));
    assert_string_equal(f.meta_keys[0], "format"); /* file order */
    const st_tensor *w = st_find(&f, "w");
    assert_non_null(w);
    assert_int_equal(w->dtype, CKPT_DT_I16);
    assert_int_equal(w->nbytes, 6);
    st_close(&f);
    free(path);

    /* "__metadata__": null reads as no metadata; non-ASCII names are fine. */
    path = write_st(*state, "null.safetensors",
                    "{\"__metadata__\":null,\"\xc3\xa9\xf0\x9f\x98\x80\":{\"dtype\":\"BOOL\","
                    "\"shape\":[1],\"data_offsets\":[0,1]}}",
                    1);
    open_ok(&f, path);
    assert_int_equal(f.nmeta, 0);
    assert_non_null(st_find(&f, "\xc3\xa9\xf0\x9f\x98\x80"));
    st_close(&f);
    free(path);
}

static void test_every_dtype(void **state)
{
    /* Every spec dtype parses, with the byte size dtype x [8] implies. */
    for (int dt = 0; dt < CKPT_DT_COUNT; dt++) {
        uint64_t shape[1] = {8}, nbytes;
        assert_int_equal(ckpt_dtype_nbytes((ckpt_dtype)dt, 1, shape, &nbytes), 0);
        char *json =
            ckpt_sprintf("{\"t\":{\"dtype\":\"%s\",\"shape\":[8],\"data_offsets\":[0,%llu]}}",
                         ckpt_dtype_name((ckpt_dtype)dt), (unsigned long long)nbytes);
        size_t len;
        uint8_t *img = make_image(json, strlen(json), strlen(json), (size_t)nbytes, &len);
        st_file f;
        if (st_parse(&f, "mem", img, len, len) != 0) fail_msg("%s", ckpt_error_last());
        assert_int_equal(f.tensors[0].dtype, dt);
        st_close(&f);
        free(img);
        free(json);
    }
}

static void test_parse_from_memory(void **state)
{
    const char *json = "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
                       "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}";
    size_t len;
    uint8_t *img = make_image(json, strlen(json), strlen(json), 4, &len);
    st_file f;
    /* Only the header needs to be in memory; file_size covers the data. */
    assert_int_equal(st_parse(&f, "head", img, 8 + strlen(json), len), 0);
    assert_int_equal(f.fd, -1);
    assert_string_equal(f.tensors[0].name, "a");
    assert_int_equal(f.tensors[1].offset, 8 + strlen(json) + 2);
    assert_int_equal(st_read_tensor(&f, &f.tensors[0], img), CKPT_EINVAL);
    st_close(&f);
    /* A buffer shorter than 8 + N is the caller's mistake, not the file's. */
    assert_int_equal(st_parse(&f, "head", img, 20, len), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "needs the first");
    assert_int_equal(st_parse(&f, "head", img, 4, len), CKPT_EINVAL);
    free(img);
}

/* A deterministic mutation loop over a valid image: st_parse must fail or
 * succeed cleanly (ASan/UBSan/LSan watch the rest). */
static void test_parse_mutations(void **state)
{
    const char *json = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[2,1],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[8,9]}}";
    size_t len;
    uint8_t *img = make_image(json, strlen(json), strlen(json), 9, &len);
    uint8_t *mut = malloc(len);
    assert_non_null(mut);
    uint64_t rng = 0x9E3779B97F4A7C15ULL;
    int ok = 0;
    for (int iter = 0; iter < 4000; iter++) {
        memcpy(mut, img, len);
        int edits = 1 + iter % 4;
        for (int e = 0; e < edits; e++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            size_t at = (size_t)(rng % len);
            static const uint8_t interesting[] = {'"', '{', '}', '[', ']',  ',', ':',
                                                  '-', '0', '9', 0,   0xff, 0xc3};
            mut[at] = (rng >> 32) & 1 ? interesting[(rng >> 40) % sizeof interesting]
                                      : (uint8_t)(rng >> 48);
        }
        size_t cut = iter % 7 == 0 ? (size_t)(rng % (len + 1)) : len;
        st_file f;
        if (st_parse(&f, "fuzz", mut, cut, cut) == 0) {
            ok++;
            for (size_t i = 0; i < f.ntensors; i++)
                assert_ptr_equal(st_find(&f, f.tensors[i].name), &f.tensors[i]);
            st_close(&f);
        } else {
            assert_null(f.tensors);
        }
    }
    assert_true(ok > 0);
    free(mut);
    free(img);
}

/* ---- writer ---- */

static void assert_header(const st_layout *l, const char *json_padded)
{
    size_t n = strlen(json_padded);
    assert_int_equal(n % 8, 0);
    assert_int_equal(l->header_len, 8 + n);
    for (int i = 0; i < 8; i++)
        assert_int_equal(l->header[i], (uint8_t)(n >> (8 * i)));
    if (memcmp(l->header + 8, json_padded, n) != 0)
        fail_msg("header\n%.*s\nexpected\n%s", (int)n, (const char *)l->header + 8, json_padded);
}

static void test_writer_bytes(void **state)
{
    st_layout l;
    st_layout_init(&l);
    const uint64_t s23[] = {2, 3}, s2[] = {2}, s3[] = {3};
    assert_int_equal(st_layout_add(&l, "z", CKPT_DT_U8, 1, s3, 0), 0);
    assert_int_equal(st_layout_add(&l, "a", CKPT_DT_F16, 1, s2, 1), 0);
    assert_int_equal(st_layout_add(&l, "c", CKPT_DT_F32, 0, NULL, 2), 0);
    assert_int_equal(st_layout_add(&l, "b", CKPT_DT_F32, 2, s23, 3), 0);
    assert_int_equal(st_layout_set_meta(&l, "format", "pt"), 0);
    assert_int_equal(st_layout_set_meta(&l, "alpha", "0"), 0);
    assert_int_equal(st_layout_set_meta(&l, "alpha", "1"), 0); /* replaces */
    assert_int_equal(st_layout_finish(&l), 0);
    assert_header(&l, "{\"__metadata__\":{\"alpha\":\"1\",\"format\":\"pt\"},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                      "\"c\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[24,28]},"
                      "\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[28,32]},"
                      "\"z\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[32,35]}} ");
    static const struct {
        const char *name;
        size_t user;
        uint64_t offset, nbytes;
    } want[] = {{"b", 3, 272, 24}, {"c", 2, 296, 4}, {"a", 1, 300, 4}, {"z", 0, 304, 3}};
    assert_int_equal(l.ntensors, 4);
    for (size_t i = 0; i < 4; i++) {
        assert_string_equal(l.tensors[i].name, want[i].name);
        assert_int_equal(l.tensors[i].user, want[i].user);
        assert_int_equal(l.tensors[i].offset, want[i].offset);
        assert_int_equal(l.tensors[i].nbytes, want[i].nbytes);
    }
    assert_int_equal(l.file_size, 307);
    assert_int_equal(st_layout_finish(&l), 0); /* a second finish changes nothing */
    assert_int_equal(l.header_len, 272);
    assert_int_equal(st_layout_add(&l, "late", CKPT_DT_U8, 1, s3, 4), CKPT_EINVAL);
    assert_int_equal(st_layout_set_meta(&l, "late", "x"), CKPT_EINVAL);
    st_layout_free(&l);

    /* No metadata: no "__metadata__" key; already a multiple of 8 after one pad. */
    st_layout_init(&l);
    const uint64_t s1[] = {1};
    assert_int_equal(st_layout_add(&l, "x", CKPT_DT_BF16, 1, s1, 0), 0);
    assert_int_equal(st_layout_finish(&l), 0);
    assert_header(&l, "{\"x\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]}} ");
    assert_int_equal(l.tensors[0].offset, 64);
    st_layout_free(&l);

    /* Empty. */
    st_layout_init(&l);
    assert_int_equal(st_layout_finish(&l), 0);
    assert_header(&l, "{}      ");
    assert_int_equal(l.file_size, 16);
    st_layout_free(&l);
}

static void test_writer_escaping(void **state)
{
    const char *s = "q\"\\\n\x01/\xc3\xa9\x7f\t\b\f\r\xf0\x9f\x98\x80";
    static const struct {
        bool ascii;
        const char *want;
    } cases[] = {
        {false, "\"q\\\"\\\\\\n\\u0001/\xc3\xa9\x7f\\t\\b\\f\\r\xf0\x9f\x98\x80\""},
        {true, "\"q\\\"\\\\\\n\\u0001/\\u00e9\\u007f\\t\\b\\f\\r\\ud83d\\ude00\""},
    };
    for (size_t i = 0; i < CKPT_ARRAY_LEN(cases); i++) {
        char *buf = NULL;
        size_t len = 0;
        FILE *out = open_memstream(&buf, &len);
        assert_non_null(out);
        assert_int_equal(st_json_put_string(out, s, cases[i].ascii), 0);
        fclose(out);
        assert_string_equal(buf, cases[i].want);
        free(buf);
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    assert_int_equal(st_json_put_string(out, "bad\xff", false), CKPT_EINVAL);
    fclose(out);
    free(buf);

    /* The same escaping inside a header, and the result reads back. */
    st_layout l;
    st_layout_init(&l);
    assert_int_equal(st_layout_add(&l, "a\"b\\c\x1f/", CKPT_DT_I8, 0, NULL, 0), 0);
    assert_int_equal(st_layout_finish(&l), 0);
    assert_header(
        &l,
        "{\"a\\\"b\\\\c\\u001f/\":{\"dtype\":\"I8\",\"shape\":[],\"data_offsets\":[0,1]}}       ");
    st_file f;
    assert_int_equal(st_parse(&f, "mem", l.header, l.header_len, l.file_size), 0);
    assert_string_equal(f.tensors[0].name, "a\"b\\c\x1f/");
    st_close(&f);
    st_layout_free(&l);
}

static void test_writer_rejects(void **state)
{
    st_layout l;
    st_layout_init(&l);
    const uint64_t s3[] = {3}, deep[CKPT_MAX_RANK + 1] = {0};
    assert_int_equal(st_layout_add(&l, "f4", CKPT_DT_F4, 1, s3, 0), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "MisalignedSlice");
    assert_contains(ckpt_error_last(), "'f4'");
    assert_int_equal(st_layout_add(&l, "bad\xc3", CKPT_DT_U8, 1, s3, 0), CKPT_EINVAL);
    assert_int_equal(st_layout_add(&l, "__metadata__", CKPT_DT_U8, 1, s3, 0), CKPT_EINVAL);
    assert_int_equal(st_layout_add(&l, "deep", CKPT_DT_U8, CKPT_MAX_RANK + 1, deep, 0),
                     CKPT_ELIMIT);
    assert_int_equal(st_layout_add(&l, "neg", CKPT_DT_U8, -1, deep, 0), CKPT_ELIMIT);
    assert_int_equal(st_layout_add(&l, "dt", CKPT_DT_COUNT, 1, s3, 0), CKPT_EINVAL);
    assert_int_equal(st_layout_set_meta(&l, "k", "bad\xff"), CKPT_EINVAL);
    assert_int_equal(l.ntensors, 0);
    assert_int_equal(l.nmeta, 0);
    /* Same name with different dtypes is still a duplicate. */
    assert_int_equal(st_layout_add(&l, "dup", CKPT_DT_U8, 1, s3, 0), 0);
    assert_int_equal(st_layout_add(&l, "other", CKPT_DT_U8, 1, s3, 1), 0);
    assert_int_equal(st_layout_add(&l, "dup", CKPT_DT_F32, 1, s3, 2), 0);
    assert_int_equal(st_layout_finish(&l), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "DuplicateTensor");
    assert_contains(ckpt_error_last(), "'dup'");
    assert_false(l.finished);
    assert_int_equal(st_write_file("/nonexistent/x.safetensors", &l, NULL, NULL), CKPT_EINVAL);
    st_layout_free(&l);
}

/* Fills each tensor with bytes derived from its user index and position. */
static uint8_t pattern_byte(size_t user, uint64_t k)
{
    return (uint8_t)(user * 37 + k * 11 + 5);
}

static int fill_pattern(void *ctx, const st_out_tensor *t, int fd, const char *path)
{
    int *calls = ctx;
    (*calls)++;
    uint8_t *buf = malloc(t->nbytes ? t->nbytes : 1);
    if (!buf) return CKPT_ENOMEM;
    for (uint64_t k = 0; k < t->nbytes; k++)
        buf[k] = pattern_byte(t->user, k);
    int rc = ckpt_pwrite_full(fd, buf, t->nbytes, t->offset, path);
    free(buf);
    return rc;
}

static void test_round_trip(void **state)
{
    static const struct {
        const char *name;
        ckpt_dtype dt;
        int ndim;
        uint64_t shape[3];
    } in[] = {
        {"model.layers.0.mlp.up_proj.weight", CKPT_DT_BF16, 2, {4, 3}},
        {"model.layers.0.input_layernorm.weight", CKPT_DT_F32, 1, {3}},
        {"scalar", CKPT_DT_F64, 0, {0}},
        {"empty", CKPT_DT_I64, 2, {0, 5}},
        {"mask", CKPT_DT_BOOL, 1, {5}},
        {"packed", CKPT_DT_F4, 1, {6}},
        {"lm_head.weight", CKPT_DT_BF16, 3, {2, 1, 3}},
    };
    st_layout l;
    st_layout_init(&l);
    for (size_t i = 0; i < CKPT_ARRAY_LEN(in); i++)
        assert_int_equal(st_layout_add(&l, in[i].name, in[i].dt, in[i].ndim, in[i].shape, i), 0);
    assert_int_equal(st_layout_set_meta(&l, "format", "pt"), 0);
    assert_int_equal(st_layout_finish(&l), 0);
    char *path = ckpt_path_join(*state, "rt.safetensors");
    int calls = 0;
    assert_int_equal(st_write_file(path, &l, fill_pattern, &calls), 0);
    assert_int_equal(calls, CKPT_ARRAY_LEN(in));

    st_file f;
    open_ok(&f, path);
    assert_int_equal(f.file_size, l.file_size);
    assert_int_equal(f.data_start, l.header_len);
    assert_int_equal(f.ntensors, CKPT_ARRAY_LEN(in));
    assert_string_equal(st_meta_get(&f, "format"), "pt");
    for (size_t i = 0; i < CKPT_ARRAY_LEN(in); i++) {
        const st_tensor *t = st_find(&f, in[i].name);
        assert_non_null(t);
        assert_int_equal(t->dtype, in[i].dt);
        assert_int_equal(t->ndim, in[i].ndim);
        for (int d = 0; d < in[i].ndim; d++)
            assert_int_equal(t->shape[d], in[i].shape[d]);
        const st_out_tensor *o = NULL;
        for (size_t k = 0; k < l.ntensors; k++)
            if (l.tensors[k].user == i) o = &l.tensors[k];
        assert_non_null(o);
        assert_int_equal(t->offset, o->offset);
        assert_int_equal(t->nbytes, o->nbytes);
        uint8_t *buf = malloc(t->nbytes + 1);
        assert_int_equal(st_read_tensor(&f, t, buf), 0);
        for (uint64_t k = 0; k < t->nbytes; k++)
            assert_int_equal(buf[k], pattern_byte(i, k));
        free(buf);
    }
    /* File order is the writer's order. */
    for (size_t i = 0; i < f.ntensors; i++)
        assert_string_equal(f.tensors[i].name, l.tensors[i].name);
    st_close(&f);
    st_layout_free(&l);
    free(path);
}

static int fill_fail_second(void *ctx, const st_out_tensor *t, int fd, const char *path)
{
    int *calls = ctx;
    if (++*calls == 2) return ckpt_error_set(CKPT_EIO, "%s: simulated failure", path);
    return ckpt_pwrite_full(fd, "xxxxxxxx", t->nbytes, t->offset, path);
}

static int fill_nothing(void *ctx, const st_out_tensor *t, int fd, const char *path)
{
    return 0;
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void test_write_aborts(void **state)
{
    st_layout l;
    st_layout_init(&l);
    const uint64_t s2[] = {2};
    assert_int_equal(st_layout_add(&l, "a", CKPT_DT_F32, 1, s2, 0), 0);
    assert_int_equal(st_layout_add(&l, "b", CKPT_DT_F32, 1, s2, 1), 0);
    char *path = ckpt_path_join(*state, "out.safetensors");
    /* Not finished. */
    assert_int_equal(st_write_file(path, &l, fill_nothing, NULL), CKPT_EINVAL);
    assert_int_equal(st_layout_finish(&l), 0);
    int calls = 0;
    assert_int_equal(st_write_file(path, &l, fill_fail_second, &calls), CKPT_EIO);
    assert_contains(ckpt_error_last(), "simulated failure");
    assert_false(ckpt_exists(path));
    assert_int_equal(count_entries(*state), 0);
    /* A fill that writes nothing leaves a short file: refused, nothing left. */
    assert_int_equal(st_write_file(path, &l, fill_nothing, NULL), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "the layout needs");
    assert_int_equal(count_entries(*state), 0);
    st_layout_free(&l);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, scratch_setup, scratch_teardown)
        T(test_header_too_small),
        T(test_header_too_large),
        T(test_invalid_header_length),
        T(test_invalid_header_utf8),
        T(test_invalid_header_deserialization),
        T(test_invalid_offset),
        T(test_validation_overflow),
        T(test_misaligned_slice),
        T(test_tensor_invalid_info),
        T(test_metadata_incomplete_buffer),
        T(test_duplicate_tensor),
        T(test_limits),
        T(test_open_not_a_file),
        T(test_valid_scalar_and_zero_size),
        T(test_valid_empty_header),
        T(test_valid_unknown_keys_and_metadata),
        T(test_every_dtype),
        T(test_parse_from_memory),
        T(test_parse_mutations),
        T(test_writer_bytes),
        T(test_writer_escaping),
        T(test_writer_rejects),
        T(test_round_trip),
        T(test_write_aborts),
#undef T
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_checkpoint.c — checkpoints and sharded indexes (format/checkpoint.c).
 *
 * Opening a single file, a directory, an index and a prefix; every index
 * check (a mapped tensor missing from its file, an unlisted tensor, a tensor
 * in two files, a wrong total_size, unsafe shard names, an oversized index,
 * too many shards); Hugging Face's shard split, shard names and index bytes.
 *
 * Shards are written with the real writer (st_layout + st_write_file) into a
 * fresh directory under $TMPDIR (or /tmp) per test.
 */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"
#include "format/checkpoint.h"

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/support/scratch.h"

/* ---- fixture and helpers ---- */

static char *join(const char *a, const char *b)
{
    char *p = ckpt_path_join(a, b);
    assert_non_null(p);
    return p;
}

static int fill_zero(void *ctx, const st_out_tensor *t, int fd, const char *path)
{
    static const uint8_t zeros[64];
    assert_true(t->nbytes <= sizeof zeros);
    return ckpt_pwrite_full(fd, zeros, t->nbytes, t->offset, path);
}

/* A shard holding the NULL-terminated names, each F32 [2] (8 bytes). */
static void write_shard(const char *dir, const char *file, const char *const *names)
{
    st_layout l;
    st_layout_init(&l);
    const uint64_t shape[] = {2};
    for (size_t i = 0; names[i]; i++)
        assert_int_equal(st_layout_add(&l, names[i], CKPT_DT_F32, 1, shape, i), 0);
    assert_int_equal(st_layout_finish(&l), 0);
    char *path = join(dir, file);
    assert_int_equal(st_write_file(path, &l, fill_zero, NULL), 0);
    free(path);
    st_layout_free(&l);
}

static char *write_text(const char *dir, const char *file, const char *text)
{
    char *path = join(dir, file);
    assert_int_equal(ckpt_write_file_atomic(path, text, strlen(text)), 0);
    return path;
}

static const char *const shard1_names[] = {"a", "b", NULL};
static const char *const shard2_names[] = {"c", NULL};
#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"

/* The usual two-shard checkpoint: a, b in shard 1, c in shard 2, 24 bytes. */
static void write_two_shards(const char *dir)
{
    write_shard(dir, SHARD1, shard1_names);
    write_shard(dir, SHARD2, shard2_names);
}

/* Opens the index text in dir and expects a failure naming the index and each needle. */
static void expect_index_error(const char *dir, const char *index_json, int code,
                               const char *const *needles)
{
    char *index = write_text(dir, "model.safetensors.index.json", index_json);
    ckpt_checkpoint c;
    int rc = ckpt_checkpoint_open(&c, dir);
    if (rc != code) fail_msg("expected %d, got %d: %s", code, rc, ckpt_error_last());
    assert_contains(ckpt_error_last(), index);
    for (size_t i = 0; needles[i]; i++)
        assert_contains(ckpt_error_last(), needles[i]);
    assert_null(c.files);
    assert_null(c.tensors);
    assert_int_equal(c.nfiles, 0);
    free(index);
}

/* ---- opening ---- */

static void test_open_single(void **state)
{
    const char *const names[] = {"x", "w", NULL};
    write_shard(*state, "model.safetensors", names);
    char *file = join(*state, "model.safetensors");
    const char *paths[] = {*state, file};
    for (size_t i = 0; i < 2; i++) {
        ckpt_checkpoint c;
        if (ckpt_checkpoint_open(&c, paths[i]) != 0) fail_msg("%s", ckpt_error_last());
        assert_string_equal(c.path, paths[i]);
        assert_string_equal(c.dir, *state);
        assert_null(c.index_path);
        assert_int_equal(c.nfiles, 1);
        assert_int_equal(c.ntensors, 2);
        assert_string_equal(c.tensors[0].t->name, "w");
        assert_int_equal(c.total_size, 16);
        const ckpt_tensor_ref *r = ckpt_checkpoint_find(&c, "x");
        assert_non_null(r);
        assert_int_equal(r->file, 0);
        assert_null(ckpt_checkpoint_find(&c, "y"));
        ckpt_checkpoint_close(&c);
        assert_null(c.files);
    }
    free(file);
}

static void test_open_sharded(void **state)
{
    write_two_shards(*state);
    char *names[] = {"c", "a", "b"};
    char *files[] = {SHARD2, SHARD1, SHARD1};
    char *text = ckpt_index_render(24, 3, names, files);
    assert_non_null(text);
    char *index = write_text(*state, "model.safetensors.index.json", text);
    free(text);
    const char *paths[] = {*state, index};
    for (size_t i = 0; i < 2; i++) {
        ckpt_checkpoint c;
        if (ckpt_checkpoint_open(&c, paths[i]) != 0) fail_msg("%s", ckpt_error_last());
        assert_string_equal(c.index_path, index);
        assert_string_equal(c.dir, *state);
        assert_int_equal(c.nfiles, 2);
        assert_int_equal(c.ntensors, 3);
        assert_int_equal(c.total_size, 24);
        /* Files in the order the (sorted) index first names them. */
        assert_string_equal(ckpt_basename(c.files[0].path), SHARD1);
        for (size_t k = 0; k < 3; k++) {
            const ckpt_tensor_ref *r = ckpt_checkpoint_find(&c, names[k]);
            assert_non_null(r);
            assert_string_equal(r->t->name, names[k]);
            assert_string_equal(ckpt_basename(c.files[r->file].path), files[k]);
        }
        ckpt_checkpoint_close(&c);
    }
    free(index);
}

static void test_open_prefix(void **state)
{
    const char *const model[] = {"w", NULL};
    const char *const slots[] = {"w/adam_m", "w/adam_v", NULL};
    write_shard(*state, "model.safetensors", model);
    write_shard(*state, "optimizer-00001-of-00001.safetensors", slots);
    free(write_text(*state, "optimizer.safetensors.index.json",
                    "{\"metadata\":{\"total_size\":16},\"weight_map\":{"
                    "\"w/adam_m\":\"optimizer-00001-of-00001.safetensors\","
                    "\"w/adam_v\":\"optimizer-00001-of-00001.safetensors\"}}"));
    ckpt_checkpoint c;
    if (ckpt_checkpoint_open_prefix(&c, *state, "optimizer") != 0)
        fail_msg("%s", ckpt_error_last());
    assert_int_equal(c.ntensors, 2);
    assert_non_null(ckpt_checkpoint_find(&c, "w/adam_v"));
    assert_null(ckpt_checkpoint_find(&c, "w"));
    ckpt_checkpoint_close(&c);
    /* "model" still opens the single file beside it. */
    assert_int_equal(ckpt_checkpoint_open_prefix(&c, *state, "model"), 0);
    assert_int_equal(c.ntensors, 1);
    ckpt_checkpoint_close(&c);

    assert_int_equal(ckpt_checkpoint_open_prefix(&c, *state, "scheduler"), CKPT_ENOTFOUND);
    assert_contains(ckpt_error_last(), "scheduler.safetensors");
    assert_int_equal(ckpt_checkpoint_open_prefix(&c, *state, "../model"), CKPT_EINVAL);
    assert_null(c.path);
}

static void test_open_missing(void **state)
{
    ckpt_checkpoint c;
    assert_int_equal(ckpt_checkpoint_open(&c, *state), CKPT_ENOTFOUND);
    assert_contains(ckpt_error_last(), "model.safetensors");
    char *file = join(*state, "nothing.safetensors");
    assert_int_equal(ckpt_checkpoint_open(&c, file), CKPT_ENOTFOUND);
    free(file);
    assert_null(c.path);
}

static void test_bad_shard_propagates(void **state)
{
    write_shard(*state, SHARD1, shard1_names);
    /* Shard 2 is truncated inside its header. */
    static const char truncated[] = "\x40\0\0\0\0\0\0\0{\"c\":";
    char *shard2 = join(*state, SHARD2);
    assert_int_equal(ckpt_write_file_atomic(shard2, truncated, sizeof truncated - 1), 0);
    free(shard2);
    ckpt_checkpoint c;
    free(write_text(*state, "model.safetensors.index.json",
                    "{\"weight_map\":{\"a\":\"" SHARD1 "\",\"b\":\"" SHARD1 "\",\"c\":\"" SHARD2
                    "\"}}"));
    assert_int_equal(ckpt_checkpoint_open(&c, *state), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), SHARD2 ": InvalidHeaderLength");
    /* A shard that does not exist at all. */
    free(write_text(*state, "model.safetensors.index.json",
                    "{\"weight_map\":{\"a\":\"" SHARD1 "\",\"c\":\"gone.safetensors\"}}"));
    assert_int_equal(ckpt_checkpoint_open(&c, *state), CKPT_ENOTFOUND);
    assert_contains(ckpt_error_last(), "gone.safetensors");
}

/* ---- index checks ---- */

static void test_index_missing_tensor(void **state)
{
    write_two_shards(*state);
    const char *const needles[] = {"'d'", SHARD2, "does not hold it", NULL};
    expect_index_error(*state,
                       "{\"weight_map\":{\"a\":\"" SHARD1 "\",\"b\":\"" SHARD1 "\",\"c\":\"" SHARD2
                       "\",\"d\":\"" SHARD2 "\"}}",
                       CKPT_EINVAL, needles);
    /* Mapped to the wrong shard. */
    const char *const wrong[] = {"'b'", "mapped to '" SHARD2 "' but is in '" SHARD1 "'", NULL};
    expect_index_error(
        *state, "{\"weight_map\":{\"a\":\"" SHARD1 "\",\"b\":\"" SHARD2 "\",\"c\":\"" SHARD2 "\"}}",
        CKPT_EINVAL, wrong);
}

static void test_index_unlisted_tensor(void **state)
{
    write_two_shards(*state);
    const char *const needles[] = {"'b'", SHARD1, "does not list", NULL};
    expect_index_error(*state, "{\"weight_map\":{\"a\":\"" SHARD1 "\",\"c\":\"" SHARD2 "\"}}",
                       CKPT_EINVAL, needles);
}

static void test_index_tensor_in_two_files(void **state)
{
    const char *const again[] = {"b", "c", NULL};
    write_shard(*state, SHARD1, shard1_names);
    write_shard(*state, SHARD2, again);
    const char *const needles[] = {"'b'", SHARD1, SHARD2, "in both", NULL};
    expect_index_error(
        *state, "{\"weight_map\":{\"a\":\"" SHARD1 "\",\"b\":\"" SHARD1 "\",\"c\":\"" SHARD2 "\"}}",
        CKPT_EINVAL, needles);
}

static void test_index_total_size(void **state)
{
    write_two_shards(*state);
    const char *const needles[] = {"total_size is 25", "24 bytes", NULL};
    expect_index_error(*state,
                       "{\"metadata\":{\"total_size\":25},\"weight_map\":{\"a\":\"" SHARD1
                       "\",\"b\":\"" SHARD1 "\",\"c\":\"" SHARD2 "\"}}",
                       CKPT_EINVAL, needles);
    const char *const negative[] = {"total_size", NULL};
    expect_index_error(*state,
                       "{\"metadata\":{\"total_size\":-24},\"weight_map\":{\"a\":\"" SHARD1 "\"}}",
                       CKPT_EINVAL, negative);
    expect_index_error(
        *state, "{\"metadata\":{\"total_size\":1e300},\"weight_map\":{\"a\":\"" SHARD1 "\"}}",
        CKPT_EINVAL, negative);

    /* Absent total_size is accepted, so is an integral float, and extra metadata. */
    static const char *const fine[] = {
        "{\"weight_map\":{\"a\":\"" SHARD1 "\",\"b\":\"" SHARD1 "\",\"c\":\"" SHARD2 "\"}}",
        "{\"metadata\":{\"total_parameters\":6},\"weight_map\":{\"a\":\"" SHARD1
        "\",\"b\":\"" SHARD1 "\",\"c\":\"" SHARD2 "\"}}",
        "{\"metadata\":{\"total_size\":24.0},\"weight_map\":{\"a\":\"" SHARD1 "\",\"b\":\"" SHARD1
        "\",\"c\":\"" SHARD2 "\"}}",
    };
    for (size_t i = 0; i < CKPT_ARRAY_LEN(fine); i++) {
        free(write_text(*state, "model.safetensors.index.json", fine[i]));
        ckpt_checkpoint c;
        if (ckpt_checkpoint_open(&c, *state) != 0) fail_msg("%s", ckpt_error_last());
        assert_int_equal(c.total_size, 24);
        ckpt_checkpoint_close(&c);
    }
}

static void test_shard_name_safe(void **state)
{
    static const char *const unsafe[] = {
        "",         "../x.safetensors", "a/../../x",        "..",   "/abs.safetensors",
        "http://x", "s3://bucket/x",    "a\\b.safetensors", "a\nb", "a\x01",
        "a\x7f",
    };
    for (size_t i = 0; i < CKPT_ARRAY_LEN(unsafe); i++)
        if (ckpt_shard_name_safe(unsafe[i])) fail_msg("'%s' passed as safe", unsafe[i]);
    assert_false(ckpt_shard_name_safe(NULL));
    static const char *const safe[] = {SHARD1, "model.safetensors", "sub/part-1.safetensors",
                                       "\xc3\xa9.safetensors"};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(safe); i++)
        assert_true(ckpt_shard_name_safe(safe[i]));
}

static void test_index_unsafe_names(void **state)
{
    /* "sub/../x" names a real shard holding 'a': only the name check stops it. */
    const char *const a[] = {"a", NULL};
    char *sub = join(*state, "sub");
    assert_int_equal(ckpt_mkdir_p(sub, 0755), 0);
    write_shard(*state, "x", a);
    static const struct {
        const char *json_name; /* as written inside the JSON string */
        const char *shown;
    } cases[] = {
        {"sub/../x", "sub/../x"}, {"../x", "../x"},    {"/etc/passwd", "/etc/passwd"},
        {"http://x", "http://x"}, {"a\\\\b", "a\\b"},  {"", "''"},
        {"a\\u0001", "'a"},       {"x\\u0000y", "'x"},
    };
    for (size_t i = 0; i < CKPT_ARRAY_LEN(cases); i++) {
        char *json = ckpt_sprintf("{\"weight_map\":{\"a\":\"%s\"}}", cases[i].json_name);
        const char *const needles[] = {"unsafe", "'a'", cases[i].shown, NULL};
        expect_index_error(*state, json, CKPT_EINVAL, needles);
        ckpt_index ix;
        assert_int_equal(ckpt_index_parse(&ix, "idx", json, strlen(json)), CKPT_EINVAL);
        assert_null(ix.names);
        free(json);
    }
    free(sub);
}

static void test_index_too_big(void **state)
{
    char *index = join(*state, "model.safetensors.index.json");
    int fd = open(index, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)CKPT_INDEX_MAX_BYTES + 1), 0); /* sparse */
    close(fd);
    ckpt_checkpoint c;
    assert_int_equal(ckpt_checkpoint_open(&c, *state), CKPT_ELIMIT);
    assert_contains(ckpt_error_last(), index);
    assert_int_equal(ckpt_checkpoint_open(&c, index), CKPT_ELIMIT);
    free(index);
}

static void test_index_too_many_shards(void **state)
{
    char *json = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&json, &len);
    assert_non_null(out);
    fputs("{\"weight_map\":{", out);
    for (int i = 0; i <= CKPT_MAX_SHARDS; i++)
        fprintf(out, "%s\"t%d\":\"s%d.safetensors\"", i ? "," : "", i, i);
    fputs("}}", out);
    fclose(out);
    ckpt_index ix;
    assert_int_equal(ckpt_index_parse(&ix, "big.json", json, len), CKPT_ELIMIT);
    assert_contains(ckpt_error_last(), "big.json");
    free(json);
}

static void test_index_parse(void **state)
{
    const char *json = "{\"metadata\":{\"total_size\":40},\"weight_map\":{"
                       "\"z\":\"two.safetensors\",\"y\":\"one.safetensors\","
                       "\"x\":\"two.safetensors\",\"w\":\"three.safetensors\"}}";
    ckpt_index ix;
    assert_int_equal(ckpt_index_parse(&ix, "idx", json, strlen(json)), 0);
    assert_true(ix.has_total_size);
    assert_int_equal(ix.total_size, 40);
    assert_int_equal(ix.nentries, 4);
    assert_string_equal(ix.names[0], "z");
    assert_string_equal(ix.files[1], "one.safetensors");
    assert_int_equal(ix.nshards, 3);
    assert_string_equal(ix.shards[0], "two.safetensors");
    assert_string_equal(ix.shards[1], "one.safetensors");
    assert_string_equal(ix.shards[2], "three.safetensors");
    ckpt_index_free(&ix);
    assert_int_equal(ix.nentries, 0);

    static const char *const bad[] = {
        "[]",
        "{}",
        "{\"weight_map\":[]}",
        "{\"weight_map\":{\"a\":1}}",
        "{\"metadata\":[],\"weight_map\":{}}",
        "{\"metadata\":{\"total_size\":\"24\"},\"weight_map\":{}}",
        "{\"weight_map\":{\"a\":\"x\",\"a\":\"y\"}}",
        "{\"weight_map\":{\"a\":\"x\"}",
    };
    for (size_t i = 0; i < CKPT_ARRAY_LEN(bad); i++) {
        if (ckpt_index_parse(&ix, "idx", bad[i], strlen(bad[i])) != CKPT_EINVAL)
            fail_msg("accepted %s", bad[i]);
        assert_contains(ckpt_error_last(), "idx: ");
    }
}

/* ---- sharded writing ---- */

static void check_assign(const uint64_t *sizes, size_t n, uint64_t max, const size_t *want,
                         size_t want_n)
{
    size_t got[16], nshards = 0;
    assert_true(n <= 16);
    assert_int_equal(ckpt_shard_assign(sizes, n, max, got, &nshards), 0);
    assert_int_equal(nshards, want_n);
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) fail_msg("tensor %zu: shard %zu, expected %zu", i, got[i], want[i]);
}

static void test_shard_assign(void **state)
{
    const uint64_t even[] = {4, 4, 4, 4, 4};
    check_assign(even, 5, 8, (const size_t[]){0, 0, 1, 1, 2}, 3);
    check_assign(even, 5, 0, (const size_t[]){0, 0, 0, 0, 0}, 1); /* no limit */
    check_assign(even, 5, 100, (const size_t[]){0, 0, 0, 0, 0}, 1);
    check_assign(even, 5, 7, (const size_t[]){0, 1, 2, 3, 4}, 5);
    /* A tensor larger than the limit gets a shard of its own at once and the
     * open shard goes on filling (huggingface_hub's split_torch_state_dict_into_shards). */
    const uint64_t big[] = {1, 100, 1, 1};
    check_assign(big, 4, 10, (const size_t[]){1, 0, 1, 1}, 2);
    const uint64_t first_big[] = {100, 1};
    check_assign(first_big, 2, 10, (const size_t[]){0, 1}, 2);
    /* Exactly the limit fits; zero-size tensors join the current shard. */
    const uint64_t exact[] = {5, 5, 0, 1};
    check_assign(exact, 4, 10, (const size_t[]){0, 0, 0, 1}, 2);
    /* Sums that overflow 64 bits start a new shard instead of wrapping. */
    const uint64_t huge[] = {UINT64_MAX, UINT64_MAX};
    check_assign(huge, 2, UINT64_MAX, (const size_t[]){0, 1}, 2);
    /* No tensors: one (empty) shard, as save_pretrained writes one file. */
    size_t nshards = 0;
    assert_int_equal(ckpt_shard_assign(NULL, 0, 8, NULL, &nshards), 0);
    assert_int_equal(nshards, 1);
}

static void test_shard_name(void **state)
{
    static const struct {
        const char *prefix;
        size_t i, n;
        const char *want;
    } cases[] = {
        {"model", 0, 5, "model-00001-of-00005.safetensors"},
        {"model", 4, 5, "model-00005-of-00005.safetensors"},
        {"model", 0, 1, "model.safetensors"},
        {"optimizer", 1, 2, "optimizer-00002-of-00002.safetensors"},
        {"model", 99999, 100000, "model-100000-of-100000.safetensors"},
    };
    for (size_t k = 0; k < CKPT_ARRAY_LEN(cases); k++) {
        char *name = ckpt_shard_name(cases[k].prefix, cases[k].i, cases[k].n);
        assert_non_null(name);
        assert_string_equal(name, cases[k].want);
        free(name);
    }
    assert_null(ckpt_shard_name("model", 5, 5));
    assert_null(ckpt_shard_name("model", 0, 0));
}

static void test_index_render(void **state)
{
    char *names[] = {"model.norm.weight", "lm_head.weight", "model.embed_tokens.weight"};
    char *files[] = {SHARD2, SHARD2, SHARD1};
    char *text = ckpt_index_render(1234567890123ULL, 3, names, files);
    assert_non_null(text);
    assert_string_equal(text, "{\n"
                              "  \"metadata\": {\n"
                              "    \"total_size\": 1234567890123\n"
                              "  },\n"
                              "  \"weight_map\": {\n"
                              "    \"lm_head.weight\": \"" SHARD2 "\",\n"
                              "    \"model.embed_tokens.weight\": \"" SHARD1 "\",\n"
                              "    \"model.norm.weight\": \"" SHARD2 "\"\n"
                              "  }\n"
                              "}\n");
    free(text);

    text = ckpt_index_render(0, 0, NULL, NULL);
    assert_non_null(text);
    assert_string_equal(text, "{\n  \"metadata\": {\n    \"total_size\": 0\n  },\n"
                              "  \"weight_map\": {}\n}\n");
    free(text);

    /* ensure_ascii escaping, code-point order of keys (UTF-8 byte order). */
    char *odd[] = {"\xc3\xa9t\xc3\xa9", "q\"/\\", "z\x7f"};
    char *where[] = {SHARD1, SHARD1, SHARD1};
    text = ckpt_index_render(8, 3, odd, where);
    assert_non_null(text);
    assert_string_equal(text, "{\n  \"metadata\": {\n    \"total_size\": 8\n  },\n"
                              "  \"weight_map\": {\n"
                              "    \"q\\\"/\\\\\": \"" SHARD1 "\",\n"
                              "    \"z\\u007f\": \"" SHARD1 "\",\n"
                              "    \"\\u00e9t\\u00e9\": \"" SHARD1 "\"\n"
                              "  }\n}\n");
    free(text);

    char *dup[] = {"a", "a"};
    assert_null(ckpt_index_render(0, 2, dup, where));
    assert_contains(ckpt_error_last(), "'a'");
    char *bad[] = {"a\xff"};
    assert_null(ckpt_index_render(0, 1, bad, where));
}

/* What the writer produces, the reader accepts: assign, name, write, index, open. */
static void test_sharded_round_trip(void **state)
{
    char *names[] = {"w0", "w1", "w2", "w3", "w4"};
    uint64_t sizes[5];
    for (size_t i = 0; i < 5; i++)
        sizes[i] = 8;
    size_t shard_of[5], nshards;
    assert_int_equal(ckpt_shard_assign(sizes, 5, 16, shard_of, &nshards), 0);
    assert_int_equal(nshards, 3);
    char *files[5];
    for (size_t s = 0; s < nshards; s++) {
        const char *in_shard[6];
        size_t k = 0;
        for (size_t i = 0; i < 5; i++)
            if (shard_of[i] == s) in_shard[k++] = names[i];
        in_shard[k] = NULL;
        char *file = ckpt_shard_name("model", s, nshards);
        write_shard(*state, file, in_shard);
        for (size_t i = 0; i < 5; i++)
            if (shard_of[i] == s) files[i] = file;
        if (s == 0) assert_string_equal(file, "model-00001-of-00003.safetensors");
    }
    char *text = ckpt_index_render(40, 5, names, files);
    free(write_text(*state, "model.safetensors.index.json", text));
    free(text);
    ckpt_checkpoint c;
    if (ckpt_checkpoint_open(&c, *state) != 0) fail_msg("%s", ckpt_error_last());
    assert_int_equal(c.nfiles, 3);
    assert_int_equal(c.ntensors, 5);
    assert_int_equal(ckpt_checkpoint_find(&c, "w4")->file, 2);
    ckpt_checkpoint_close(&c);
    free(files[0]);
    free(files[2]);
    free(files[4]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, scratch_setup, scratch_teardown)
        T(test_open_single),           T(test_open_sharded),
        T(test_open_prefix),           T(test_open_missing),
        T(test_bad_shard_propagates),  T(test_index_missing_tensor),
        T(test_index_unlisted_tensor), T(test_index_tensor_in_two_files),
        T(test_index_total_size),      T(test_shard_name_safe),
        T(test_index_unsafe_names),    T(test_index_too_big),
        T(test_index_too_many_shards), T(test_index_parse),
        T(test_shard_assign),          T(test_shard_name),
        T(test_index_render),          T(test_sharded_round_trip),
#undef T
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

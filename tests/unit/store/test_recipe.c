/*
 * test_recipe.c — a damaged recipe row in a store's catalog is an error, not
 * a read outside a blob or a buffer (store/rebuild.c checks every part with
 * plan_part_check before the executor sees it; plan/executor.c asserts the
 * same ranges).
 *
 * A small llama is imported into a scratch store and converted inside it
 * (neuron, tp 2), so its layout's tensors are recipes over the original's
 * blobs. Then one recipe row is changed with SQL, the way a damaged or
 * hand-edited catalog would be: a part reading past its blob, a part outside
 * its tensor, a missing part, a doubled part, a part that is not a part; and
 * a blob cut short; and in a Qwen3-MoE's expert stack, whose recipe holds
 * the experts as one run entry ("srcs" and "lo_step"), a run with a bad blob
 * name, with a "blob" too, one source short, and a step that leaves the
 * tensor. Each time pulling the layout (store_materialize) and
 * reading the file in place (store_file_open, as HTTP serving does) fail with
 * CKPT_ECORRUPT and a message naming the file, the tensor and the part, and
 * nothing is written. The original row put back, both work again.
 */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"
#include "fixtures/genmodel.h"
#include "store/materialize.h"
#include "store/store.h"
#include "store/store_convert.h"
#include "tests/support/scratch.h"

#include <jansson.h>
#include <setjmp.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

typedef struct {
    const char *root;
    ckpt_store s;
    store_ckpt orig, conv;
    char *path, *name, *recipe; /* the row being damaged, and its recipe as stored */
    int pulls;
} fixture;

/* The recipe row of tensor `like` (an SQL LIKE pattern) of arch's layout. */
static void setup_store(fixture *f, const char *arch, const char *like)
{
    char *src = ckpt_path_join(f->root, "src"), *home = ckpt_path_join(f->root, "home");
    genmodel_opts o;
    genmodel_opts_init(&o, arch);
    o.scale = 32;
    o.layers = 1;
    if (genmodel_write(&o, src) < 0) fail_msg("gen-model: %s", ckpt_error_last());
    assert_int_equal(store_open(&f->s, home), 0);
    bool existed = true;
    store_import_opts io = {.repo = "t/recipe", .quiet = true};
    if (store_import_dir(&f->s, src, &io, &f->orig, &existed) < 0)
        fail_msg("import: %s", ckpt_error_last());
    convert_opts co = {.layout = "neuron", .tp = 2, .quiet = true};
    if (store_convert(&f->s, "t/recipe", &co, &f->conv, &existed) < 0)
        fail_msg("convert: %s", ckpt_error_last());
    sqlite3_stmt *st;
    assert_int_equal(
        sqlite3_prepare_v2(
            f->s.cat.db,
            "SELECT path, name, recipe FROM tensors WHERE checkpoint_id = ? AND "
            "recipe IS NOT NULL AND name LIKE ? ORDER BY path LIMIT 1",
            -1, &st, NULL),
        SQLITE_OK);
    sqlite3_bind_int64(st, 1, f->conv.id);
    sqlite3_bind_text(st, 2, like, -1, SQLITE_STATIC);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    f->path = ckpt_strdup((const char *)sqlite3_column_text(st, 0));
    f->name = ckpt_strdup((const char *)sqlite3_column_text(st, 1));
    f->recipe = ckpt_strdup((const char *)sqlite3_column_text(st, 2));
    sqlite3_finalize(st);
    free(src);
    free(home);
}

static int setup_arch(void **state, const char *arch, const char *like)
{
    if (scratch_setup(state)) return -1;
    fixture *f = calloc(1, sizeof *f);
    if (!f) return -1;
    f->root = *state;
    setup_store(f, arch, like);
    *state = f;
    return 0;
}

/* A tensor split across ranks with more than one element. */
static int setup(void **state)
{
    return setup_arch(state, "llama", "%down_proj.weight");
}

/* The stacked experts of the first layer. */
static int setup_moe(void **state)
{
    return setup_arch(state, "qwen3-moe", "%experts.down_proj.weight");
}

static int teardown(void **state)
{
    fixture *f = *state;
    store_ckpt_free(&f->orig);
    store_ckpt_free(&f->conv);
    store_close(&f->s);
    free(f->path);
    free(f->name);
    free(f->recipe);
    void *root = (void *)f->root;
    free(f);
    return scratch_teardown(&root);
}

static void set_recipe(fixture *f, const char *recipe)
{
    sqlite3_stmt *st;
    assert_int_equal(
        sqlite3_prepare_v2(
            f->s.cat.db,
            "UPDATE tensors SET recipe = ? WHERE checkpoint_id = ? AND path = ? AND name = ?", -1,
            &st, NULL),
        SQLITE_OK);
    sqlite3_bind_text(st, 1, recipe, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 2, f->conv.id);
    sqlite3_bind_text(st, 3, f->path, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 4, f->name, -1, SQLITE_TRANSIENT);
    assert_int_equal(sqlite3_step(st), SQLITE_DONE);
    assert_int_equal(sqlite3_changes(f->s.cat.db), 1);
    sqlite3_finalize(st);
}

/* The stored recipe, changed by edit (NULL: as stored), written back. */
static void damage(fixture *f, void (*edit)(json_t *parts))
{
    json_error_t err;
    json_t *parts = json_loads(f->recipe, 0, &err);
    assert_non_null(parts);
    assert_true(json_array_size(parts) >= 1);
    if (edit) edit(parts);
    char *text = json_dumps(parts, JSON_COMPACT | JSON_PRESERVE_ORDER);
    set_recipe(f, text);
    free(text);
    json_decref(parts);
}

/* Pulling the layout and reading the file in place both fail, naming the
 * file, the tensor and `detail`; the pull leaves no destination. */
static void expect_corrupt(fixture *f, const char *detail)
{
    char *dst = ckpt_sprintf("%s/pull-%d", f->root, f->pulls++);
    materialize_opts mo = {.rank = -1, .quiet = true};
    assert_int_equal(store_materialize(&f->s, &f->conv, dst, &mo), CKPT_ECORRUPT);
    assert_contains(ckpt_error_last(), f->path);
    assert_contains(ckpt_error_last(), f->name);
    assert_contains(ckpt_error_last(), detail);
    assert_int_equal(access(dst, F_OK), -1);
    free(dst);
    store_file_reader *r = NULL;
    assert_int_equal(store_file_open(&r, &f->s, &f->conv, f->path), CKPT_ECORRUPT);
    assert_null(r);
    assert_contains(ckpt_error_last(), f->path);
    assert_contains(ckpt_error_last(), detail);
}

/* The row as stored: the pull works, and so does reading the file in place. */
static void expect_fine(fixture *f)
{
    damage(f, NULL);
    char *dst = ckpt_sprintf("%s/pull-%d", f->root, f->pulls++);
    materialize_opts mo = {.rank = -1, .quiet = true};
    if (store_materialize(&f->s, &f->conv, dst, &mo) < 0) fail_msg("pull: %s", ckpt_error_last());
    free(dst);
    store_file_reader *r = NULL;
    if (store_file_open(&r, &f->s, &f->conv, f->path) < 0) fail_msg("open: %s", ckpt_error_last());
    uint64_t n = store_file_size(r);
    uint8_t *buf = malloc(n);
    assert_non_null(buf);
    assert_int_equal(store_file_read(r, 0, buf, n), 0);
    free(buf);
    store_file_close(r);
}

/* The first entry of the recipe with field `key`. */
static json_t *entry_with(json_t *parts, const char *key)
{
    size_t i;
    json_t *p;
    json_array_foreach(parts, i, p) if (json_object_get(p, key)) return p;
    fail_msg("no entry with '%s' in the recipe", key);
    return NULL;
}

/* The first part that reads a blob. */
static json_t *first_blob_part(json_t *parts)
{
    return entry_with(parts, "blob");
}

static void edit_past_blob(json_t *parts)
{
    /* Start the read on the last row of the blob: its extent runs past it. */
    json_t *p = first_blob_part(parts);
    json_t *shape = json_object_get(p, "shape"), *src_lo = json_object_get(p, "src_lo");
    json_int_t rows = json_integer_value(json_array_get(shape, 0));
    json_array_set_new(src_lo, 0, json_integer(rows - 1));
}

static void edit_outside_tensor(json_t *parts)
{
    json_array_set_new(json_object_get(first_blob_part(parts), "lo"), 0,
                       json_integer((json_int_t)1 << 40));
}

static void edit_drop_part(json_t *parts)
{
    /* One part fewer, or a single part one column short. */
    if (json_array_size(parts) > 1) {
        json_array_remove(parts, json_array_size(parts) - 1);
        return;
    }
    json_t *ext = json_object_get(json_array_get(parts, 0), "ext");
    size_t last = json_array_size(ext) - 1;
    json_array_set_new(ext, last, json_integer(json_integer_value(json_array_get(ext, last)) - 1));
}

static void edit_double_part(json_t *parts)
{
    json_array_append_new(parts, json_deep_copy(json_array_get(parts, 0)));
}

static void edit_bad_axis(json_t *parts)
{
    json_array_set_new(json_object_get(first_blob_part(parts), "axis_map"), 0, json_integer(7));
}

static void test_recipe_past_blob(void **state)
{
    fixture *f = *state;
    expect_fine(f);
    damage(f, edit_past_blob);
    expect_corrupt(f, "recipe part");
    assert_contains(ckpt_error_last(), "of source");
    expect_fine(f);
}

static void test_recipe_outside_tensor(void **state)
{
    fixture *f = *state;
    damage(f, edit_outside_tensor);
    expect_corrupt(f, "lies outside the tensor");
    expect_fine(f);
}

static void test_recipe_parts_missing_or_doubled(void **state)
{
    fixture *f = *state;
    damage(f, edit_drop_part);
    expect_corrupt(f, "the recipe's parts hold");
    damage(f, edit_double_part);
    expect_corrupt(f, "overlap");
    damage(f, edit_bad_axis);
    expect_corrupt(f, "recipe part");
    set_recipe(f, "{\"not\": \"an array\"}");
    expect_corrupt(f, "not an array");
    expect_fine(f);
}

/* A blob shorter than the tensors its recipes read: an error naming the
 * blob's file and the tensor, before any byte is read (a read through mmap
 * past the end of a file is a bus error). */
static void test_blob_cut_short(void **state)
{
    fixture *f = *state;
    json_error_t err;
    json_t *parts = json_loads(f->recipe, 0, &err);
    assert_non_null(parts);
    const char *blob = json_string_value(json_object_get(first_blob_part(parts), "blob"));
    char *bp = store_blob_path(&f->s, blob);
    assert_non_null(bp);
    json_decref(parts);
    char *keep = ckpt_sprintf("%s.keep", bp);
    assert_int_equal(link(bp, keep), 0);
    /* A copy, cut: the blob file is read-only and shared with the original. */
    assert_int_equal(unlink(bp), 0);
    FILE *in = fopen(keep, "rb"), *out = fopen(bp, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[64];
    assert_int_equal(fread(buf, 1, sizeof buf, in), sizeof buf);
    assert_int_equal(fwrite(buf, 1, sizeof buf, out), sizeof buf);
    fclose(in);
    fclose(out);
    store_file_reader *r = NULL;
    assert_int_equal(store_file_open(&r, &f->s, &f->conv, f->path), CKPT_ECORRUPT);
    assert_contains(ckpt_error_last(), "needs bytes");
    assert_contains(ckpt_error_last(), ckpt_basename(bp));
    assert_int_equal(rename(keep, bp), 0);
    expect_fine(f);
    free(keep);
    free(bp);
}

/* The run entry of the recipe. */
static json_t *run_entry(json_t *parts)
{
    return entry_with(parts, "srcs");
}

static void edit_run_bad_blob(json_t *parts)
{
    json_array_set_new(json_object_get(run_entry(parts), "srcs"), 1, json_string("not-a-blob"));
}

static void edit_run_and_blob(json_t *parts)
{
    json_t *r = run_entry(parts);
    json_object_set(r, "blob", json_array_get(json_object_get(r, "srcs"), 0));
}

static void edit_run_short(json_t *parts)
{
    json_t *srcs = json_object_get(run_entry(parts), "srcs");
    json_array_remove(srcs, json_array_size(srcs) - 1);
}

static void edit_run_step_out(json_t *parts)
{
    json_array_set_new(json_object_get(run_entry(parts), "lo_step"), 0, json_integer(1000));
}

static void test_recipe_run(void **state)
{
    fixture *f = *state;
    json_error_t err;
    json_t *parts = json_loads(f->recipe, 0, &err);
    assert_non_null(parts);
    /* Every expert of the layer in one entry, one expert further along axis 0 each. */
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(f->s.cat.db,
                                        "SELECT count(*) FROM tensors WHERE checkpoint_id = ? AND name LIKE "
                                        "'model.layers.0.mlp.experts.%.down_proj.weight'",
                                        -1, &st, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(st, 1, f->orig.id);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int experts = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    assert_true(experts >= 2);
    json_t *r = run_entry(parts);
    assert_int_equal(json_array_size(json_object_get(r, "srcs")), experts);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(r, "lo_step"), 0)), 1);
    assert_null(json_object_get(r, "blob"));
    json_decref(parts);
    expect_fine(f);
    damage(f, edit_run_bad_blob);
    expect_corrupt(f, "bad recipe part");
    damage(f, edit_run_and_blob);
    expect_corrupt(f, "bad recipe part");
    damage(f, edit_run_short);
    expect_corrupt(f, "the recipe's parts hold");
    damage(f, edit_run_step_out);
    expect_corrupt(f, "lies outside the tensor");
    expect_fine(f);
}

/* The values of column 0 of sql (bound to id), each a key of set; with
 * recipes, the blobs each recipe names ("blob" of a part, "srcs" of a run). */
static void collect_blobs(sqlite3 *db, const char *sql, int64_t id, bool recipes, json_t *set)
{
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    sqlite3_bind_int64(st, 1, id);
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *v = (const char *)sqlite3_column_text(st, 0);
        if (!v) continue;
        if (!recipes) {
            json_object_set_new(set, v, json_true());
            continue;
        }
        json_error_t err;
        json_t *parts = json_loads(v, 0, &err), *p;
        assert_non_null(parts);
        size_t i;
        json_array_foreach(parts, i, p)
        {
            json_t *run = json_object_get(p, "srcs"), *b;
            size_t k;
            if (json_object_get(p, "blob"))
                json_object_set_new(set, json_string_value(json_object_get(p, "blob")),
                                    json_true());
            json_array_foreach(run, k, b)
                json_object_set_new(set, json_string_value(b), json_true());
        }
        json_decref(parts);
    }
    sqlite3_finalize(st);
}

/* The layout's blob references (what gc keeps for it) are exactly the blobs
 * its files and tensors name, those in its recipes included: store_convert
 * hands the commit the blobs of its recipes rather than have them parsed
 * back, and they must be the same. */
static void test_layout_blob_refs(void **state)
{
    fixture *f = *state;
    sqlite3 *db = f->s.cat.db;
    json_t *want = json_object(), *have = json_object();
    collect_blobs(db, "SELECT blob FROM files WHERE checkpoint_id = ?", f->conv.id, false, want);
    collect_blobs(db, "SELECT blob FROM tensors WHERE checkpoint_id = ?", f->conv.id, false, want);
    size_t plain = json_object_size(want);
    collect_blobs(db, "SELECT recipe FROM tensors WHERE checkpoint_id = ?", f->conv.id, true, want);
    assert_true(json_object_size(want) > plain); /* the recipes name blobs of their own */
    collect_blobs(db, "SELECT blob FROM checkpoint_blobs WHERE checkpoint_id = ?", f->conv.id,
                  false, have);
    assert_true(json_equal(want, have));
    json_decref(want);
    json_decref(have);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_recipe_past_blob, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recipe_outside_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recipe_parts_missing_or_doubled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_blob_cut_short, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recipe_run, setup_moe, teardown),
        cmocka_unit_test_setup_teardown(test_layout_blob_refs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_layout_blob_refs, setup_moe, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

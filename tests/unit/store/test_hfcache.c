/* test_hfcache.c — the Hub's names for stored files (store_hub.h) and the
 * Hugging Face cache a pull writes (store_hfcache.h): a second write adds
 * nothing, a damaged cache (a short blob, a link to the wrong blob, a stray
 * file where a link belongs) is repaired, copies without symlinks, and names
 * that cannot be a cache folder are refused. */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/util.h"
#include "fixtures/genmodel.h"
#include "store/store.h"
#include "store/store_hfcache.h"
#include "store/store_hub.h"
#include "tests/support/scratch.h"

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

/* A small qwen2 with an empty file, imported as t/cache@main. */
static void import_model(const char *root, ckpt_store *s, store_ckpt *ck)
{
    char *src = ckpt_path_join(root, "src"), *home = ckpt_path_join(root, "home");
    genmodel_opts o;
    genmodel_opts_init(&o, "qwen2");
    o.scale = 32;
    o.layers = 1;
    if (genmodel_write(&o, src) < 0) fail_msg("gen-model: %s", ckpt_error_last());
    char *empty = ckpt_path_join(src, "empty.txt");
    assert_int_equal(ckpt_write_file_atomic(empty, "", 0), 0);
    assert_int_equal(store_open(s, home), 0);
    bool existed = true;
    store_import_opts io = {.repo = "t/cache", .revision = "main", .quiet = true};
    if (store_import_dir(s, src, &io, ck, &existed) < 0) fail_msg("import: %s", ckpt_error_last());
    free(empty);
    free(src);
    free(home);
}

static void test_hub_names(void **state)
{
    const char *root = *state;
    ckpt_store s;
    store_ckpt ck;
    import_model(root, &s, &ck);
    char commit[41];
    store_hub_commit(&ck, commit);
    assert_string_equal(commit, ck.commit);
    store_file_row *rows;
    size_t n;
    assert_int_equal(store_files_load(&s, ck.id, &rows, &n), 0);
    int seen = 0;
    for (size_t i = 0; i < n; i++) {
        char oid[41], etag[65];
        assert_int_equal(store_hub_file_oid(&s, &rows[i], oid), 0);
        assert_int_equal(store_hub_etag(&s, &rows[i], etag), 0);
        if (!strcmp(rows[i].path, "empty.txt")) { /* git's id of the empty blob */
            assert_string_equal(oid, "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
            assert_string_equal(etag, oid);
            assert_false(store_hub_is_lfs(&rows[i]));
            seen++;
        }
        if (!strcmp(rows[i].path, "model.safetensors")) {
            assert_true(store_hub_is_lfs(&rows[i]));
            assert_string_equal(etag, rows[i].sha256);
            char ptr[256];
            size_t len = store_hub_lfs_pointer(&rows[i], ptr, sizeof ptr);
            assert_int_equal(len, strlen(ptr));
            assert_non_null(strstr(ptr, rows[i].sha256));
            seen++;
        }
    }
    store_files_free(rows, n);
    assert_int_equal(seen, 2);
    /* a layout's commit is another one, and stable */
    store_ckpt lay = ck;
    lay.layout = "neuron-tp2";
    char a[41], b[41];
    store_hub_commit(&lay, a);
    store_hub_commit(&lay, b);
    assert_string_equal(a, b);
    assert_string_not_equal(a, ck.commit);
    store_ckpt_free(&ck);
    store_close(&s);
}

static bool is_link(const char *p)
{
    struct stat st;
    return !lstat(p, &st) && S_ISLNK(st.st_mode);
}

static void test_cache_write_and_repair(void **state)
{
    const char *root = *state;
    ckpt_store s;
    store_ckpt ck;
    import_model(root, &s, &ck);
    char *cache = ckpt_path_join(root, "hfcache");
    store_hfcache_opts o = {0};
    store_hfcache_stats st;
    assert_int_equal(store_hfcache_write(&s, &ck, cache, &o, &st), 0);
    assert_int_equal(st.files, 3);
    assert_true(st.written > 0);
    assert_true(st.linked >= 1); /* config.json and empty.txt are whole blobs on this filesystem */
    assert_int_equal(store_hfcache_write(&s, &ck, cache, &o, &st), 0);
    assert_int_equal(st.written, 0);

    char *repo = ckpt_sprintf("%s/models--t--cache", cache);
    char *snap = ckpt_sprintf("%s/snapshots/%s/config.json", repo, ck.commit);
    char *ref = ckpt_sprintf("%s/refs/main", repo);
    char *tree = ckpt_sprintf("%s/trees/%s.json", repo, ck.commit);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(ckpt_read_file(ref, 100, &text, &len), 0);
    assert_string_equal(text, ck.commit);
    free(text);
    assert_true(ckpt_exists(tree));
    assert_true(is_link(snap));
    char target[512];
    ssize_t tn = readlink(snap, target, sizeof target - 1);
    assert_true(tn > 0);
    target[tn] = 0;
    assert_int_equal(strncmp(target, "../../blobs/", 12), 0);

    /* damage: the safetensors blob cut short, config.json linked to the wrong
     * blob, empty.txt a stray regular file; the next write repairs all three */
    store_file_row *rows;
    size_t n;
    assert_int_equal(store_files_load(&s, ck.id, &rows, &n), 0);
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(rows[i].path, "model.safetensors")) {
            char *blob = ckpt_sprintf("%s/blobs/%s", repo, rows[i].sha256);
            assert_int_equal(truncate(blob, 10), 0);
            free(blob);
        }
    }
    store_files_free(rows, n);
    assert_int_equal(unlink(snap), 0);
    assert_int_equal(symlink("../../blobs/0000", snap), 0);
    char *empty = ckpt_sprintf("%s/snapshots/%s/empty.txt", repo, ck.commit);
    assert_int_equal(unlink(empty), 0);
    assert_int_equal(ckpt_write_file_atomic(empty, "x", 1), 0);
    assert_int_equal(store_hfcache_write(&s, &ck, cache, &o, &st), 0);
    assert_int_equal(st.written, 3);
    assert_true(is_link(empty));
    tn = readlink(snap, target, sizeof target - 1);
    assert_true(tn > 0);
    target[tn] = 0;
    assert_string_not_equal(target, "../../blobs/0000");
    struct stat sb;
    assert_int_equal(stat(snap, &sb), 0);
    assert_int_equal(store_hfcache_write(&s, &ck, cache, &o, &st), 0);
    assert_int_equal(st.written, 0);

    /* without symlinks: the files themselves, no blobs/ */
    char *copies = ckpt_path_join(root, "copies");
    store_hfcache_opts oc = {.no_symlinks = true};
    assert_int_equal(store_hfcache_write(&s, &ck, copies, &oc, &st), 0);
    char *csnap = ckpt_sprintf("%s/models--t--cache/snapshots/%s/model.safetensors", copies, ck.commit);
    char *cblobs = ckpt_sprintf("%s/models--t--cache/blobs", copies);
    assert_false(is_link(csnap));
    assert_true(ckpt_exists(csnap));
    assert_false(ckpt_exists(cblobs));
    assert_int_equal(store_hfcache_write(&s, &ck, copies, &oc, &st), 0);
    assert_int_equal(st.written, 0);

    /* a repository name that is no ORG/NAME is refused before anything is written */
    store_ckpt bad = ck;
    bad.repo = "../evil";
    assert_int_not_equal(store_hfcache_write(&s, &bad, cache, &o, &st), 0);

    free(csnap);
    free(cblobs);
    free(copies);
    free(empty);
    free(repo);
    free(snap);
    free(ref);
    free(tree);
    free(cache);
    store_ckpt_free(&ck);
    store_close(&s);
}

static void test_default_dir(void **state)
{
    (void)state;
    setenv("HF_HUB_CACHE", "/x/hub", 1);
    char *d = store_hfcache_default_dir();
    assert_string_equal(d, "/x/hub");
    free(d);
    unsetenv("HF_HUB_CACHE");
    setenv("HF_HOME", "/y", 1);
    d = store_hfcache_default_dir();
    assert_string_equal(d, "/y/hub");
    free(d);
    unsetenv("HF_HOME");
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/u", 1);
    d = store_hfcache_default_dir();
    assert_string_equal(d, "/home/u/.cache/huggingface/hub");
    free(d);
    setenv("HF_HUB_DISABLE_SYMLINKS", "yes", 1);
    assert_true(store_hfcache_symlinks_disabled());
    setenv("HF_HUB_DISABLE_SYMLINKS", "0", 1);
    assert_false(store_hfcache_symlinks_disabled());
    unsetenv("HF_HUB_DISABLE_SYMLINKS");
}

int main(void)
{
    ckpt_log_set_level(CKPT_LOG_QUIET);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_hub_names, scratch_setup, scratch_teardown),
        cmocka_unit_test_setup_teardown(test_cache_write_and_repair, scratch_setup, scratch_teardown),
        cmocka_unit_test(test_default_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

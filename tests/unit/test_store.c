/* test_store.c — blob leases against gc, claims of stored blobs, and the
 * streamed archive of a checkpoint (store_archive.h), on a generated
 * checkpoint imported into a scratch store. */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/util.h"
#include "storage/store.h"
#include "tests/support/scratch.h"
#include "storage/archive.h"
#include "workers/genmodel.h"
#include "workers/store_archive.h"

#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

typedef struct {
    char **v;
    size_t n, cap;
} names;

/* Every blob name (sha256) under home/blobs, from the file names. */
static names list_blobs(const char *home)
{
    names out = {0};
    char *root = ckpt_path_join(home, "blobs");
    DIR *d = opendir(root);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strlen(e->d_name) != 2) continue;
        char *sub = ckpt_path_join(root, e->d_name);
        DIR *sd = opendir(sub);
        assert_non_null(sd);
        struct dirent *f;
        while ((f = readdir(sd))) {
            if (strlen(f->d_name) != 62) continue;
            assert_int_equal(ckpt_grow(&out.v, &out.cap, out.n + 1, sizeof *out.v), 0);
            out.v[out.n++] = ckpt_sprintf("%s%s", e->d_name, f->d_name);
        }
        closedir(sd);
        free(sub);
    }
    closedir(d);
    free(root);
    return out;
}

static void names_free(names *n)
{
    for (size_t i = 0; i < n->n; i++) free(n->v[i]);
    free(n->v);
}

static size_t blobs_present(ckpt_store *s, const names *n)
{
    size_t k = 0;
    for (size_t i = 0; i < n->n; i++) {
        char *p = store_blob_path(s, n->v[i]);
        k += access(p, F_OK) == 0;
        free(p);
    }
    return k;
}

/* A small qwen2 imported into a store in the scratch folder. */
static void import_model(const char *root, ckpt_store *s, store_ckpt *ck)
{
    char *src = ckpt_path_join(root, "src"), *home = ckpt_path_join(root, "home");
    genmodel_opts o;
    genmodel_opts_init(&o, "qwen2");
    o.scale = 32;
    o.layers = 1;
    if (genmodel_write(&o, src) < 0) fail_msg("gen-model: %s", ckpt_error_last());
    assert_int_equal(store_open(s, home), 0);
    bool existed = true;
    store_import_opts io = {.repo = "t/lease", .quiet = true};
    if (store_import_dir(s, src, &io, ck, &existed) < 0) fail_msg("import: %s", ckpt_error_last());
    assert_false(existed);
    free(src);
    free(home);
}

/* Leased blobs survive the removal of their only checkpoint and a gc; once
 * the leases are dropped the next gc removes them. */
static void test_lease_keeps_blobs_from_gc(void **state)
{
    ckpt_store s;
    store_ckpt ck;
    import_model(*state, &s, &ck);
    names b = list_blobs(s.home);
    assert_true(b.n > 5);
    assert_int_equal(store_blobs_lease(&s, b.v, b.n), 0);
    assert_int_equal(store_rm(&s, &ck), 0);
    store_gc_result g;
    memset(&g, 0, sizeof g);
    assert_int_equal(store_gc(&s, false, &g), 0);
    assert_int_equal(g.blobs_removed, 0);
    assert_int_equal(blobs_present(&s, &b), b.n);
    assert_int_equal(store_leases_release(&s), 0);
    memset(&g, 0, sizeof g);
    assert_int_equal(store_gc(&s, false, &g), 0);
    assert_int_equal(g.blobs_removed, b.n);
    assert_int_equal(blobs_present(&s, &b), 0);
    /* Leasing a blob that is gone is an error naming it. */
    assert_int_equal(store_blobs_lease(&s, b.v, 1), CKPT_ENOTFOUND);
    assert_contains(ckpt_error_last(), b.v[0]);
    store_leases_release(&s);
    names_free(&b);
    store_ckpt_free(&ck);
    store_close(&s);
}

/* A claim says whether the blob is stored with that size, and leases it. */
static void test_claim(void **state)
{
    ckpt_store s;
    store_ckpt ck;
    import_model(*state, &s, &ck);
    names b = list_blobs(s.home);
    char *p = store_blob_path(&s, b.v[0]);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    uint64_t size = (uint64_t)st.st_size;
    bool have = false;
    assert_int_equal(store_blob_claim(&s, b.v[0], size, &have), 0);
    assert_true(have);
    assert_int_equal(store_blob_claim(&s, b.v[0], size + 1, &have), 0);
    assert_false(have); /* another size: not the same bytes */
    const char *none = "0000000000000000000000000000000000000000000000000000000000000000";
    assert_int_equal(store_blob_claim(&s, none, 0, &have), 0);
    assert_false(have);
    /* The claim leased it: the checkpoint removed, gc keeps the blob. */
    assert_int_equal(store_rm(&s, &ck), 0);
    store_gc_result g;
    memset(&g, 0, sizeof g);
    assert_int_equal(store_gc(&s, false, &g), 0);
    assert_int_equal(access(p, F_OK), 0);
    assert_int_equal(g.blobs_removed, b.n - 1);
    store_leases_release(&s);
    free(p);
    names_free(&b);
    store_ckpt_free(&ck);
    store_close(&s);
}

/* Writes the archive of ck to root/NAME; returns store_archive_write's code. */
static int archive_to(ckpt_store *s, store_archive *ar, const char *root, const char *name)
{
    char *path = ckpt_path_join(root, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    int rc = store_archive_write(ar, s, fd, false);
    close(fd);
    free(path);
    return rc;
}

/* The archive holds every file with its stored bytes, and nothing is staged
 * under CKPT_HOME/tmp; a rank on a checkpoint without ranks is refused when
 * planned; a missing blob fails the plan (before any byte), a damaged one
 * fails the write. */
static void test_archive_stream(void **state)
{
    const char *root = *state;
    ckpt_store s;
    store_ckpt ck;
    import_model(root, &s, &ck);
    store_archive *ar = NULL;
    assert_int_equal(store_archive_plan(&s, &ck, 0, &ar), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "is not tensor-parallel");
    assert_null(ar);
    assert_int_equal(store_archive_plan(&s, &ck, -1, &ar), 0);
    assert_int_equal(archive_to(&s, ar, root, "a.tar"), 0);
    char *tmp = ckpt_path_join(s.home, "tmp");
    DIR *d = opendir(tmp);
    struct dirent *e;
    while (d && (e = readdir(d))) assert_true(!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."));
    if (d) closedir(d);
    char *tarp = ckpt_path_join(root, "a.tar"), *base = ckpt_path_join(root, "x"), *out = NULL;
    assert_int_equal(ckpt_archive_extract(tarp, base, &out), 0);
    const char *files[] = {"config.json", "model.safetensors"};
    for (size_t i = 0; i < 2; i++) {
        char *a = ckpt_path_join(out, files[i]), *b = ckpt_sprintf("%s/src/%s", root, files[i]);
        char *ta, *tb;
        size_t la, lb;
        assert_int_equal(ckpt_read_file(a, 1u << 30, &ta, &la), 0);
        assert_int_equal(ckpt_read_file(b, 1u << 30, &tb, &lb), 0);
        assert_int_equal(la, lb);
        assert_memory_equal(ta, tb, la);
        free(ta);
        free(tb);
        free(a);
        free(b);
    }
    /* config.json's blob, damaged in place (same size): the write fails. */
    store_file_row *rows;
    size_t n;
    assert_int_equal(store_files_load(&s, ck.id, &rows, &n), 0);
    char *blob = NULL;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(rows[i].path, "config.json")) blob = store_blob_path(&s, rows[i].blob);
    store_files_free(rows, n);
    assert_non_null(blob);
    chmod(blob, 0600);
    FILE *f = fopen(blob, "r+b");
    assert_non_null(f);
    int c0 = fgetc(f);
    fseek(f, 0, SEEK_SET);
    fputc(c0 ^ 1, f);
    fclose(f);
    assert_int_equal(archive_to(&s, ar, root, "b.tar"), CKPT_ECORRUPT);
    assert_contains(ckpt_error_last(), "config.json");
    store_archive_free(ar);
    /* Gone: the plan fails. */
    assert_int_equal(unlink(blob), 0);
    assert_int_equal(store_archive_plan(&s, &ck, -1, &ar), CKPT_ECORRUPT);
    assert_null(ar);
    free(blob);
    free(out);
    free(base);
    free(tarp);
    free(tmp);
    store_ckpt_free(&ck);
    store_close(&s);
}

/* A live process has a start time; one that exited and is not reaped yet
 * (a zombie: a killed worker before its daemon waits for it) has none, so gc
 * does not keep its leases and temp files as a live writer's. */
static void test_zombie_is_not_alive(void **state)
{
    (void)state;
    assert_true(store_proc_start_time((int)getpid()) > 0);
    pid_t live = fork();
    assert_true(live >= 0);
    if (live == 0) {
        alarm(20); /* never outlives a failed test */
        pause();
        _exit(0);
    }
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    int64_t t_live = store_proc_start_time(live), t_dead = 0;
    /* Wait until it has exited, without reaping it: a zombie from here on. */
    siginfo_t si;
    if (dead > 0 && waitid(P_PID, (id_t)dead, &si, WEXITED | WNOWAIT) == 0) t_dead = store_proc_start_time(dead);
    kill(live, SIGKILL);
    waitpid(live, NULL, 0);
    if (dead > 0) waitpid(dead, NULL, 0);
    assert_true(dead > 0);
    assert_true(t_live > 0);
    assert_int_equal(t_dead, -1); /* a zombie until waited for */
    assert_int_equal(store_proc_start_time(dead), -1);
}

int main(void)
{
    ckpt_log_set_level(CKPT_LOG_QUIET);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lease_keeps_blobs_from_gc, scratch_setup, scratch_teardown),
        cmocka_unit_test_setup_teardown(test_claim, scratch_setup, scratch_teardown),
        cmocka_unit_test_setup_teardown(test_archive_stream, scratch_setup, scratch_teardown),
        cmocka_unit_test(test_zombie_is_not_alive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

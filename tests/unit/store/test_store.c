/* test_store.c — blob leases against gc, claims of stored blobs, the
 * streamed archive of a checkpoint (store_archive.h), and what import refuses
 * or bounds (issue 14: ranks, links, names, descriptors, a full disk), on
 * generated checkpoints imported into a scratch store. */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/util.h"
#include "format/archive.h"
#include "store/catalog.h"
#include "store/store.h"
#include "tests/support/scratch.h"
#include "format/archive.h"
#include "fixtures/genmodel.h"
#include "format/safetensors.h"
#include "store/store_archive.h"
#include "store/store_info.h"
#include "store/store_verify.h"
#include "store/rebuild.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <errno.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/support/sqlite_rows.h"

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

/* import_model, and the blobs it stored (more than a few). */
static names import_blobs(const char *root, ckpt_store *s, store_ckpt *ck)
{
    import_model(root, s, ck);
    names b = list_blobs(s->home);
    assert_true(b.n > 5);
    return b;
}

/* Leased blobs survive the removal of their only checkpoint and a gc; once
 * the leases are dropped the next gc removes them. */
static void test_lease_keeps_blobs_from_gc(void **state)
{
    ckpt_store s;
    store_ckpt ck;
    names b = import_blobs(*state, &s, &ck);
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

/* store_blobs_lease in two steps: the leases are taken by _begin, and _end
 * reports the first blob of the list that is not stored, by name, however
 * the check is spread over threads; with every blob there it returns 0. */
static void test_lease_in_two_steps(void **state)
{
    ckpt_store s;
    store_ckpt ck;
    names b = import_blobs(*state, &s, &ck);
    store_blobs_check *c = NULL;
    assert_int_equal(store_blobs_lease_begin(&s, b.v, b.n, &c), 0);
    assert_int_equal(sqlite_int(s.cat.db, "SELECT count(*) FROM blob_leases"), (int64_t)b.n);
    assert_int_equal(store_blobs_lease_end(c), 0);
    char *gone = store_blob_path(&s, b.v[b.n - 2]);
    assert_int_equal(unlink(gone), 0);
    assert_int_equal(store_blobs_lease_begin(&s, b.v, b.n, &c), 0);
    assert_int_equal(store_blobs_lease_end(c), CKPT_ENOTFOUND);
    assert_contains(ckpt_error_last(), b.v[b.n - 2]);
    assert_int_equal(store_blobs_lease_begin(&s, b.v, 0, &c), 0); /* nothing to lease or check */
    assert_int_equal(store_blobs_lease_end(c), 0);
    /* A list long enough to be checked by several threads (each blob many
     * times over): the first missing of the list is named, wherever the
     * threads' ranges fall. */
    char *gone2 = store_blob_path(&s, b.v[b.n - 1]);
    assert_int_equal(unlink(gone2), 0);
    free(gone2);
    size_t n = 4000;
    char **many = calloc(n, sizeof *many);
    assert_non_null(many);
    for (size_t i = 0; i < n; i++)
        many[i] = b.v[i % (b.n - 2)]; /* all present */
    many[n - 1] = b.v[b.n - 1];
    for (size_t at = 1; at < n - 1; at += 1333) {
        char *present = many[at];
        many[at] = b.v[b.n - 2];
        assert_int_equal(store_blobs_lease_begin(&s, many, n, &c), 0);
        assert_int_equal(store_blobs_lease_end(c), CKPT_ENOTFOUND);
        assert_contains(ckpt_error_last(), b.v[b.n - 2]);
        many[at] = present;
    }
    assert_int_equal(store_blobs_lease(&s, many, n), CKPT_ENOTFOUND);
    assert_contains(ckpt_error_last(), b.v[b.n - 1]);
    many[n - 1] = b.v[0];
    assert_int_equal(store_blobs_lease(&s, many, n), 0);
    free(many);
    free(gone);
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
    {
        /* No tar end after the failure: a reader sees a truncated archive. */
        char *bp = ckpt_path_join(root, "b.tar"), *bt;
        size_t bl;
        static const char zeros[1024];
        assert_int_equal(ckpt_read_file(bp, 1u << 30, &bt, &bl), 0);
        assert_true(bl < sizeof zeros || memcmp(bt + bl - sizeof zeros, zeros, sizeof zeros) != 0);
        free(bt);
        free(bp);
    }
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


/* root/name holding bytes (folders made as needed). */
static void put_file(const char *root, const char *name, const void *bytes, size_t len)
{
    char *path = ckpt_path_join(root, name);
    char *slash = strrchr(path, '/');
    *slash = 0;
    assert_int_equal(ckpt_mkdir_p(path, 0755), 0);
    *slash = '/';
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    free(path);
}

/* A safetensors file root/name with header json and data_len zero bytes. */
static void put_safetensors(const char *root, const char *name, const char *json, size_t data_len)
{
    size_t n = strlen(json), len = 8 + n + data_len;
    uint8_t *b = calloc(1, len);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(b + 8, json, n);
    put_file(root, name, b, len);
    free(b);
}

/* store_import_dir of root/sub into a store at root/home: its status; *s stays open. */
static int import_sub(const char *root, const char *sub, ckpt_store *s)
{
    char *src = ckpt_path_join(root, sub), *home = ckpt_path_join(root, "home");
    assert_int_equal(store_open(s, home), 0);
    store_ckpt ck;
    bool existed;
    store_import_opts io = {.repo = "t/hostile", .quiet = true};
    int rc = store_import_dir(s, src, &io, &ck, &existed);
    if (!rc) store_ckpt_free(&ck);
    free(src);
    free(home);
    return rc;
}

/* Nothing of a refused import stays: no checkpoint, no temp file. */
static void assert_store_empty(ckpt_store *s)
{
    store_du_result du;
    assert_int_equal(store_du(s, &du), 0);
    assert_int_equal(du.checkpoints, 0);
    DIR *d = opendir(s->tmp_dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) assert_true(e->d_name[0] == '.');
    closedir(d);
}

#define DEEP_HEADER "{\"deep\":{\"dtype\":\"U8\",\"shape\":[0,1,2,3,4,5,6,7,8],\"data_offsets\":[0,0]}}"

/* Issue 14 #1: a tensor of rank 9 (0 bytes: its other dims are free) is
 * refused where it enters the store, naming file and tensor; the store's file
 * rebuild refuses such a stored header too (a catalog written before). */
static void test_rank_limit(void **state)
{
    ckpt_store s;
    put_safetensors(*state, "deep/model.safetensors", DEEP_HEADER, 0);
    put_file(*state, "deep/config.json", "{}", 2);
    assert_int_equal(import_sub(*state, "deep", &s), CKPT_ELIMIT);
    assert_contains(ckpt_error_last(), "model.safetensors");
    assert_contains(ckpt_error_last(), "'deep'");
    assert_contains(ckpt_error_last(), "rank 9");
    assert_store_empty(&s);
    store_close(&s);

    const char *json = DEEP_HEADER;
    size_t n = strlen(json);
    uint8_t *hdr = calloc(1, 8 + n);
    for (int i = 0; i < 8; i++) hdr[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(hdr + 8, json, n);
    exec_plan ep;
    memset(&ep, 0, sizeof ep);
    plan_tensor pts[2];
    size_t npt = 0;
    exec_file ef;
    memset(&ef, 0, sizeof ef);
    rebuild_ctx rb = {.exec = &ep, .tensors = pts, .ntensors = &npt};
    assert_int_not_equal(rebuild_plan_file(&rb, "model.safetensors", "model.safetensors", hdr, 8 + n, 8 + n, &ef), 0);
    assert_contains(ckpt_error_last(), "rank 9");
    assert_int_equal(npt, 0);
    exec_plan_free(&ep);
    free(hdr);
}

/* Issue 14 #2: import follows no symbolic link (one leaving the folder, one
 * staying in it) and reads regular files only; the error names the file and
 * nothing is stored. */
static void test_import_refuses_links(void **state)
{
    const char *root = *state;
    ckpt_store s;
    char *secret = ckpt_path_join(root, "secret"), *dir = ckpt_path_join(root, "links");
    put_file(root, "secret", "id_rsa", 6);
    put_file(root, "links/config.json", "{}", 2);
    char *out = ckpt_path_join(dir, "tokenizer.json");
    assert_int_equal(symlink(secret, out), 0);
    assert_int_equal(import_sub(root, "links", &s), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "tokenizer.json");
    assert_contains(ckpt_error_last(), "symbolic link");
    assert_store_empty(&s);
    store_close(&s);
    /* A link inside the folder: refused as well. */
    assert_int_equal(unlink(out), 0);
    assert_int_equal(symlink("config.json", out), 0);
    assert_int_equal(import_sub(root, "links", &s), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "tokenizer.json");
    store_close(&s);
    /* A FIFO (never opened: it would block). */
    assert_int_equal(unlink(out), 0);
    assert_int_equal(mkfifo(out, 0600), 0);
    assert_int_equal(import_sub(root, "links", &s), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "tokenizer.json");
    assert_contains(ckpt_error_last(), "not a regular file");
    store_close(&s);
    /* A linked folder. */
    assert_int_equal(unlink(out), 0);
    char *sub = ckpt_path_join(dir, "sub");
    assert_int_equal(symlink(root, sub), 0);
    assert_int_equal(import_sub(root, "links", &s), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "sub");
    store_close(&s);
    assert_int_equal(unlink(sub), 0);
    assert_int_equal(import_sub(root, "links", &s), 0);
    store_close(&s);
    free(sub);
    free(out);
    free(secret);
    free(dir);
}

/* Issue 14 #8: names the store could not give back are refused by import
 * (naming the file) and by any catalog commit, with nothing stored. */
static void test_import_refuses_bad_names(void **state)
{
    const char *root = *state;
    static const char *const bad[] = {"notes..txt", "a\\b.txt", "tab\there.txt"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char sub[32];
        snprintf(sub, sizeof sub, "names%zu", i);
        char *dir = ckpt_path_join(root, sub);
        put_file(dir, "config.json", "{}", 2);
        put_file(dir, bad[i], "x", 1);
        ckpt_store s;
        assert_int_equal(import_sub(root, sub, &s), CKPT_EINVAL);
        assert_contains(ckpt_error_last(), "the store cannot hold it");
        if (i < 2) assert_contains(ckpt_error_last(), bad[i]);
        assert_store_empty(&s);
        store_close(&s);
        free(dir);
    }
    static const char *const good[] = {"a.b.c", "sub/x y.txt", ".hidden/ok"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) assert_int_equal(store_path_check(good[i]), 0);
    static const char *const more_bad[] = {"", "/abs", "a//b", "./x", "a/./b", "..", "x://y"};
    for (size_t i = 0; i < sizeof more_bad / sizeof more_bad[0]; i++)
        if (store_path_check(more_bad[i]) == 0) fail_msg("'%s' was accepted", more_bad[i]);
    /* A commit of such a path (any writer: fetch, convert, merge) is refused. */
    ckpt_store s;
    char *home = ckpt_path_join(root, "home");
    assert_int_equal(store_open(&s, home), 0);
    store_file_rec fr = {.path = "notes..txt", .size = 0};
    store_ckpt_rec rec = {.repo = "t/x", .revision = "main", .commit = "0123456789012345678901234567890123456789",
                          .layout = "", .nfiles = 1, .files = &fr};
    int64_t id = 0;
    assert_int_equal(store_commit_checkpoint(&s, &rec, &id, NULL), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "notes..txt");
    assert_store_empty(&s);
    store_close(&s);
    free(home);
}

/* Issue 14 #6: import holds a bounded number of descriptors whatever the
 * number of tensors: a qwen3-moe of 789 tensors imports with 128 allowed
 * (one descriptor per new tensor until publish needed more than 789). */
static void test_import_bounded_fds(void **state)
{
    const char *root = *state;
    char *src = ckpt_path_join(root, "moe");
    genmodel_opts o;
    genmodel_opts_init(&o, "qwen3-moe");
    o.scale = 32;
    o.layers = 2;
    if (genmodel_write(&o, src) < 0) fail_msg("gen-model: %s", ckpt_error_last());
    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    low = old;
    low.rlim_cur = 128;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    ckpt_store s;
    int rc = import_sub(root, "moe", &s);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", rc ? ckpt_error_last() : "");
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    if (rc) fail_msg("import with 128 descriptors: %s", msg);
    store_du_result du;
    assert_int_equal(store_du(&s, &du), 0);
    assert_int_equal(du.checkpoints, 1);
    assert_true(du.blobs > 700);
    store_close(&s);
    free(src);
}

/* Issue 14 #10: a new CKPT_HOME is the user's alone (the catalog holds job
 * arguments and logs), whatever the umask. */
/* Migration 004 (files as a rowid table) on a catalog of version 3 holding
 * rows: every row and header byte kept, foreign keys on and holding after,
 * and a checkpoint's removal still cascading to its files and tensors. */
extern const char *const ckpt_schema_sql[];

static void test_migrate_files_rowid(void **state)
{
    char *path = ckpt_path_join(*state, "v3.db");
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "PRAGMA foreign_keys=ON", NULL, NULL, NULL), SQLITE_OK);
    for (int i = 0; i < 3; i++) assert_int_equal(sqlite3_exec(db, ckpt_schema_sql[i], NULL, NULL, NULL), SQLITE_OK);
    const char *rows =
        "PRAGMA user_version = 3;"
        "INSERT INTO checkpoints(id, repo, revision, commit_sha, total_size, created_at) VALUES (7, 'o/m', 'main', 'c', 9, 1);"
        "INSERT INTO files VALUES (7, 'model.safetensors', 5, 'aa', NULL, randomblob(100000));"
        "INSERT INTO files VALUES (7, 'config.json', 4, 'bb', 'bb', NULL);"
        "INSERT INTO tensors VALUES (7, 'model.safetensors', 'w', 'cc', NULL);"
        "INSERT INTO tensors VALUES (7, 'model.safetensors', 'v', NULL, '{\"parts\": []}');"
        "INSERT INTO checkpoint_blobs VALUES (7, 'bb'), (7, 'cc');";
    assert_int_equal(sqlite3_exec(db, rows, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT hex(header) FROM files WHERE header IS NOT NULL", -1, &st, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    char *header_hex = ckpt_strdup((const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    sqlite3_close(db);

    catalog c;
    assert_int_equal(catalog_open(&c, path), 0);
    assert_int_equal(c.version, catalog_schema_version());
    assert_true(c.version >= 4);
    assert_int_equal(sqlite_int(c.db, "SELECT count(*) FROM files"), 2);
    assert_int_equal(sqlite_int(c.db, "SELECT count(*) FROM tensors"), 2);
    assert_int_equal(sqlite_int(c.db, "SELECT count(*) FROM checkpoint_blobs"), 2);
    assert_int_equal(sqlite_int(c.db, "SELECT count(*) FROM sqlite_master WHERE name = 'files' "
                                      "AND sql NOT LIKE '%WITHOUT ROWID%'"),
                     1);
    assert_int_equal(sqlite_int(c.db, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
    assert_int_equal(sqlite_int(c.db, "PRAGMA foreign_keys"), 1);
    assert_int_equal(sqlite3_prepare_v2(c.db, "SELECT hex(header) FROM files WHERE header IS NOT NULL", -1, &st, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(st, 0), header_hex);
    sqlite3_finalize(st);
    /* a tensor must still need its file, and removing the checkpoint cascades */
    assert_int_not_equal(sqlite3_exec(c.db, "INSERT INTO tensors VALUES (7, 'nope', 'x', 'dd', NULL)", NULL, NULL, NULL),
                         SQLITE_OK);
    assert_int_equal(sqlite3_exec(c.db, "DELETE FROM checkpoints WHERE id = 7", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite_int(c.db, "SELECT count(*) FROM files"), 0);
    assert_int_equal(sqlite_int(c.db, "SELECT count(*) FROM tensors"), 0);
    catalog_close(&c);
    free(header_hex);
    free(path);
}

static void test_home_is_private(void **state)
{
    char *home = ckpt_path_join(*state, "newhome");
    ckpt_store s;
    assert_int_equal(store_open(&s, home), 0);
    struct stat st;
    assert_int_equal(stat(home, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    store_close(&s);
    free(home);
}

/* What the pipeline of ckpt_archive_write_entries calls rd with, and how it
 * answers: entry i's byte at off is pat(i, off); fail_at (entry, offset)
 * fails there naming the entry. */
typedef struct {
    const ckpt_archive_entry *e;
    pthread_t caller;
    size_t calls, next_i;
    uint64_t next_off;
    bool other_thread, in_order;
    long fail_i;
    uint64_t fail_off;
} pipe_rd;

static unsigned char pat(size_t i, uint64_t off)
{
    return (unsigned char)(off * 7 + off / 4099 + i * 31);
}

static int pipe_read(void *ctx, size_t i, uint64_t off, void *buf, size_t len)
{
    pipe_rd *p = ctx;
    p->calls++;
    if (!pthread_equal(pthread_self(), p->caller)) p->other_thread = true;
    /* each entry's blocks in order, from offset 0, entries with bytes in order */
    while (p->next_i < i && p->next_off == p->e[p->next_i].size) p->next_i++, p->next_off = 0;
    if (i != p->next_i || off != p->next_off) p->in_order = false;
    p->next_off = off + len;
    if ((long)i == p->fail_i && off == p->fail_off)
        return ckpt_error_set(CKPT_EIO, "'%s': read failed at byte %llu", p->e[i].name, (unsigned long long)off);
    for (size_t k = 0; k < len; k++) ((unsigned char *)buf)[k] = pat(i, off + k);
    return 0;
}

/* Writes the entries to root/name (zstd or not) through pipe_read. */
static int pipe_write(const char *root, const char *name, const ckpt_archive_entry *e, size_t n, bool zstd, pipe_rd *p)
{
    *p = (pipe_rd){.e = e, .caller = pthread_self(), .in_order = true, .fail_i = p->fail_i, .fail_off = p->fail_off};
    char *path = ckpt_path_join(root, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    int rc = ckpt_archive_write_entries(fd, zstd, e, n, 1700000000, pipe_read, p);
    close(fd);
    free(path);
    return rc;
}

/* The streamed archive's pipeline (issue 20): rd runs in a reader thread,
 * block after block in order, and the tar (and tar.zst) unpacks to the bytes
 * it gave; an rd error mid-file fails the write with rd's message, no rd
 * call follows, no tar end is written; an output that stops taking bytes
 * (a pipe whose reader left: EPIPE in the writer thread) fails the write
 * and stops the reader long before the end. Under ASan the threads' buffers
 * are all freed. */
static void test_archive_pipeline(void **state)
{
    const char *root = *state;
    const ckpt_archive_entry e[] = {{"a.bin", (3u << 20) + 5}, {"empty", 0}, {"b/c.bin", 1u << 20}, {"d", 100}};
    const size_t n = sizeof e / sizeof *e;
    pipe_rd p = {.fail_i = -1};
    for (int z = 0; z < 2; z++) {
        const char *name = z ? "p.tar.zst" : "p.tar";
        p.fail_i = -1;
        assert_int_equal(pipe_write(root, name, e, n, z, &p), 0);
        assert_true(p.other_thread);
        assert_true(p.in_order);
        assert_int_equal(p.calls, 4 + 1 + 1); /* 1 MiB blocks */
        char *tarp = ckpt_path_join(root, name), *base = ckpt_path_join(root, "x"), *out = NULL;
        assert_int_equal(ckpt_archive_extract(tarp, base, &out), 0);
        for (size_t i = 0; i < n; i++) {
            char *f = ckpt_path_join(out, e[i].name), *t;
            size_t l;
            assert_int_equal(ckpt_read_file(f, 1u << 30, &t, &l), 0);
            assert_int_equal(l, e[i].size);
            for (size_t k = 0; k < l; k++)
                if ((unsigned char)t[k] != pat(i, k)) fail_msg("%s: byte %zu differs", e[i].name, k);
            free(t);
            free(f);
        }
        assert_int_equal(ckpt_rm_rf(out), 0);
        free(out);
        free(base);
        free(tarp);
    }
    /* Mid-file: a.bin's third block fails. */
    p.fail_i = 0;
    p.fail_off = 2u << 20;
    assert_int_equal(pipe_write(root, "f.tar", e, n, false, &p), CKPT_EIO);
    assert_contains(ckpt_error_last(), "'a.bin': read failed at byte 2097152");
    assert_int_equal(p.calls, 3);
    {
        char *fp = ckpt_path_join(root, "f.tar"), *ft;
        size_t fl;
        static const char zeros[1024];
        assert_int_equal(ckpt_read_file(fp, 1u << 30, &ft, &fl), 0);
        assert_true(fl < (2u << 20) + 1024);
        /* ...and everything handed over before the failure did go out, the
         * writer thread's queue drained: a.bin's header and its first two
         * blocks, but for what libarchive still held in its own 10 KiB block. */
        assert_true(fl > 512 + (2u << 20) - 10240);
        assert_memory_equal(ft + 257, "ustar", 5);
        for (size_t k = 0; k < fl - 512; k++)
            if ((unsigned char)ft[512 + k] != pat(0, k)) fail_msg("f.tar: a.bin's byte %zu differs", k);
        assert_true(fl < sizeof zeros || memcmp(ft + fl - sizeof zeros, zeros, sizeof zeros) != 0);
        free(ft);
        free(fp);
    }
    /* The output goes away: 64 MiB to a pipe nobody reads any more. */
    const ckpt_archive_entry big[] = {{"big.bin", 64ull << 20}};
    int pp[2];
    assert_int_equal(pipe(pp), 0);
    close(pp[0]);
    void (*old)(int) = signal(SIGPIPE, SIG_IGN);
    p = (pipe_rd){.e = big, .caller = pthread_self(), .in_order = true, .fail_i = -1};
    assert_int_equal(ckpt_archive_write_entries(pp[1], false, big, 1, 0, pipe_read, &p), CKPT_EIO);
    assert_contains(ckpt_error_last(), "writing the archive");
    assert_contains(ckpt_error_last(), strerror(EPIPE));
    assert_true(p.calls < 40); /* the reader stopped with the writer, well before block 64 */
    signal(SIGPIPE, old);
    close(pp[1]);
}

/* Issue 14 #10 and "also": an archive path that does not exist is named as
 * such; a small compressed archive that unpacks to far more than its size
 * (1000 times, 64 MiB for small ones) or than the free space is refused
 * with nothing left behind. */
static void test_archive_limits(void **state)
{
    const char *root = *state;
    char *missing = ckpt_path_join(root, "nonexistent"), *base = ckpt_path_join(root, "x"), *out = NULL;
    assert_int_equal(ckpt_archive_extract(missing, base, &out), CKPT_ENOTFOUND);
    assert_contains(ckpt_error_last(), "nonexistent: no such file or folder");
    assert_null(out);
    /* 200 MiB of zeros (a sparse file) packed into a few hundred KB. */
    char *dir = ckpt_path_join(root, "bomb"), *zeros = ckpt_path_join(dir, "zeros.bin"),
         *tarzst = ckpt_path_join(root, "bomb.tar.zst");
    put_file(dir, "config.json", "{}", 2);
    int fd = open(zeros, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 200 << 20), 0);
    close(fd);
    assert_int_equal(ckpt_archive_write_tree(dir, tarzst, true), 0);
    struct stat st;
    assert_int_equal(stat(tarzst, &st), 0);
    assert_true(st.st_size < (1 << 20));
    assert_int_equal(ckpt_archive_extract(tarzst, base, &out), CKPT_ELIMIT);
    assert_contains(ckpt_error_last(), "bomb.tar.zst");
    assert_contains(ckpt_error_last(), "zeros.bin");
    assert_null(out);
    DIR *d = opendir(root);
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "x.tmp-", 6)) fail_msg("%s was left behind", e->d_name);
    closedir(d);
    free(tarzst);
    free(zeros);
    free(dir);
    free(base);
    free(missing);
}

#define FULL_DISK_DIR "full"

/* Issue 14 #10: a full disk is reported where it struck (which file, "No
 * space left on device"), not as the lease release that failed after it;
 * nothing is left in tmp/. CKPT_HOME on a 1 MiB tmpfs, a 5 MiB import. */
static void test_import_full_disk(void **state)
{
    const char *root = *state;
    char *mnt = ckpt_path_join(root, FULL_DISK_DIR), *src = ckpt_path_join(root, "q2");
    assert_int_equal(ckpt_mkdir_p(mnt, 0755), 0);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=1m") != 0) {
        print_message("skipping the full-disk test: cannot mount a tmpfs (%s)\n", strerror(errno));
        free(mnt);
        free(src);
        skip();
    }
    genmodel_opts o;
    genmodel_opts_init(&o, "qwen2");
    o.scale = 8;
    o.layers = 2;
    if (genmodel_write(&o, src) < 0) fail_msg("gen-model: %s", ckpt_error_last());
    ckpt_store s;
    char *home = ckpt_path_join(mnt, "home");
    assert_int_equal(store_open(&s, home), 0);
    store_ckpt ck;
    bool existed;
    store_import_opts io = {.repo = "t/full", .quiet = true};
    assert_int_not_equal(store_import_dir(&s, src, &io, &ck, &existed), 0);
    assert_contains(ckpt_error_last(), "No space left on device");
    assert_contains(ckpt_error_last(), "/" FULL_DISK_DIR "/home/");
    if (strstr(ckpt_error_last(), "release leases")) fail_msg("reported as: %s", ckpt_error_last());
    assert_store_empty(&s);
    store_close(&s);
    free(home);
    free(src);
    free(mnt);
}

static int teardown_unmount(void **state)
{
    char *mnt = ckpt_path_join(*state, FULL_DISK_DIR);
    umount2(mnt, MNT_DETACH); /* not mounted when the test was skipped */
    free(mnt);
    return scratch_teardown(state);
}


static void count_line(void *ctx, const char *line)
{
    (void)line;
    (*(int *)ctx)++;
}

/* The listing and checkpoint JSON of store_info.h, and store_verify: clean,
 * then a damaged blob counted (not an error), a bad ref an error. */
static void test_info_and_verify(void **state)
{
    const char *root = *state;
    ckpt_store s;
    store_ckpt ck;
    import_model(root, &s, &ck);
    bool exists = false;
    assert_int_equal(store_repo_exists(&s, "t/lease", &exists), 0);
    assert_true(exists);
    assert_int_equal(store_repo_exists(&s, "t/none", &exists), 0);
    assert_false(exists);
    json_t *list;
    assert_int_equal(store_list_json(&s, NULL, &list), 0);
    json_t *items = json_object_get(list, "checkpoints");
    assert_int_equal(json_array_size(items), 1);
    json_t *c0 = json_array_get(items, 0);
    assert_string_equal(json_string_value(json_object_get(c0, "repo")), "t/lease");
    assert_true(json_is_null(json_object_get(c0, "source")));
    assert_null(json_object_get(c0, "files"));
    json_decref(list);
    assert_int_equal(store_list_json(&s, "t/none", &list), 0);
    assert_int_equal(json_array_size(json_object_get(list, "checkpoints")), 0);
    json_decref(list);
    json_t *j;
    assert_int_equal(store_ckpt_json(&s, &ck, true, &j), 0);
    json_t *files = json_object_get(j, "files");
    assert_int_equal(json_array_size(files), 2);
    json_t *st = json_array_get(files, 1);
    assert_string_equal(json_string_value(json_object_get(st, "path")), "model.safetensors");
    assert_true(json_is_true(json_object_get(st, "safetensors")));
    assert_true(json_integer_value(json_object_get(st, "tensors")) > 0);
    json_decref(j);

    store_verify_result r;
    int lines = 0;
    assert_int_equal(store_verify(&s, NULL, count_line, &lines, &r), 0);
    assert_true(store_verify_clean(&r));
    assert_int_equal(r.checkpoints_checked, 1);
    assert_int_equal(lines, 0);
    assert_int_equal(store_verify(&s, "t/none@main", count_line, &lines, &r), CKPT_ENOTFOUND);
    /* A damaged tensor blob: counted and reported, not an error. */
    store_file_row *rows;
    size_t n;
    assert_int_equal(store_files_load(&s, ck.id, &rows, &n), 0);
    char *blob = NULL;
    for (size_t i = 0; i < n; i++)
        if (rows[i].blob) blob = store_blob_path(&s, rows[i].blob);
    store_files_free(rows, n);
    assert_non_null(blob);
    chmod(blob, 0600);
    FILE *f = fopen(blob, "r+b");
    assert_non_null(f);
    int c = fgetc(f);
    fseek(f, 0, SEEK_SET);
    fputc(c ^ 1, f);
    fclose(f);
    assert_int_equal(store_verify(&s, "t/lease", count_line, &lines, &r), 0);
    assert_false(store_verify_clean(&r));
    assert_int_equal(r.damaged_blobs, 1);
    assert_true(lines >= 2); /* the blob, and the file it breaks */
    json_t *rj = store_verify_json(&r);
    assert_false(json_is_true(json_object_get(rj, "clean")));
    assert_int_equal(json_integer_value(json_object_get(rj, "damaged_blobs")), 1);
    json_decref(rj);
    free(blob);
    store_ckpt_free(&ck);
    store_close(&s);
}

/* store_tensor_blobs: every tensor of the imported model, each found with
 * the blob the catalog gives one query at a time; names that are not there
 * (another file, another tensor, a prefix) are not found, and _get names
 * them in its error. */
/* The tensors of a file are cut by two threads, each its share; a copy of
 * the model with one byte changed in each of its first six tensors: each
 * thread finds stored tensors, hashes its changed ones first and reads them
 * again into their blobs. Every tensor's blob holds its bytes, and only the
 * changed ones are new. */
static void test_import_changed_tensors(void **state)
{
    const char *root = *state;
    ckpt_store s;
    store_ckpt ck, ck2;
    import_model(root, &s, &ck);
    names before = list_blobs(s.home);
    char *src = ckpt_path_join(root, "src2");
    genmodel_opts o;
    genmodel_opts_init(&o, "qwen2");
    o.scale = 32;
    o.layers = 1;
    o.max_shard_size = 0; /* one file: its tensors shared out between the threads */
    if (genmodel_write(&o, src) < 0) fail_msg("gen-model: %s", ckpt_error_last());
    char *file = ckpt_path_join(src, "model.safetensors");
    st_file f;
    assert_int_equal(st_open(&f, file), 0);
    assert_true(f.ntensors > 8);
    int fd = open(file, O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    size_t changed = 0;
    for (size_t i = 0; i < f.ntensors && changed < 6; i++) {
        const st_tensor *t = &f.tensors[i];
        if (t->nbytes == 0) continue;
        uint8_t b;
        assert_int_equal(pread(fd, &b, 1, (off_t)(t->offset + t->nbytes / 2)), 1);
        b ^= 0x5a;
        assert_int_equal(pwrite(fd, &b, 1, (off_t)(t->offset + t->nbytes / 2)), 1);
        changed++;
    }
    close(fd);
    st_close(&f);
    bool existed = true;
    store_import_opts io = {.repo = "t/changed", .quiet = true};
    if (store_import_dir(&s, src, &io, &ck2, &existed) < 0) fail_msg("import: %s", ckpt_error_last());
    assert_false(existed);
    names after = list_blobs(s.home);
    assert_int_equal(after.n, before.n + changed);
    /* every tensor's blob: its bytes, under their sha256 */
    assert_int_equal(st_open(&f, file), 0);
    sqlite3_stmt *q;
    assert_int_equal(sqlite3_prepare_v2(s.cat.db,
                                        "SELECT blob FROM tensors WHERE checkpoint_id = ? AND path = "
                                        "'model.safetensors' AND name = ?",
                                        -1, &q, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(q, 1, ck2.id);
    for (size_t i = 0; i < f.ntensors; i++) {
        const st_tensor *t = &f.tensors[i];
        uint8_t *want = malloc(t->nbytes + 1);
        assert_non_null(want);
        assert_int_equal(ckpt_pread_full(f.fd, want, t->nbytes, t->offset, file), 0);
        ckpt_sha256 h;
        char hex[65];
        assert_int_equal(ckpt_sha256_init(&h), 0);
        assert_int_equal(ckpt_sha256_update(&h, want, t->nbytes), 0);
        assert_int_equal(ckpt_sha256_final_hex(&h, hex), 0);
        sqlite3_bind_text(q, 2, t->name, -1, SQLITE_STATIC);
        assert_int_equal(sqlite3_step(q), SQLITE_ROW);
        assert_string_equal((const char *)sqlite3_column_text(q, 0), hex);
        sqlite3_reset(q);
        char *bp = store_blob_path(&s, hex), *got = NULL;
        size_t n = 0;
        assert_int_equal(ckpt_read_file(bp, t->nbytes + 1, &got, &n), 0);
        assert_int_equal(n, t->nbytes);
        assert_memory_equal(got, want, t->nbytes);
        free(got);
        free(bp);
        free(want);
    }
    sqlite3_finalize(q);
    st_close(&f);
    names_free(&before);
    names_free(&after);
    free(file);
    free(src);
    store_ckpt_free(&ck);
    store_ckpt_free(&ck2);
    store_close(&s);
}

static void test_tensor_blobs(void **state)
{
    const char *root = *state;
    ckpt_store s;
    store_ckpt ck;
    import_model(root, &s, &ck);
    store_tensor_blobs t;
    assert_int_equal(store_tensor_blobs_load(&s, ck.id, &t), 0);
    int64_t rows = sqlite_int(s.cat.db, "SELECT count(*) FROM tensors WHERE blob IS NOT NULL");
    assert_true(rows > 4);
    assert_int_equal(t.n, (size_t)rows);
    sqlite3_stmt *one; /* the catalog's answer, a query per tensor */
    assert_int_equal(
        sqlite3_prepare_v2(
            s.cat.db, "SELECT blob FROM tensors WHERE checkpoint_id = ? AND path = ? AND name = ?",
            -1, &one, NULL),
        SQLITE_OK);
    sqlite3_bind_int64(one, 1, ck.id);
    for (size_t i = 0; i < t.n; i++) {
        if (i) /* sorted by (path, name), each once */
            assert_true(strcmp(t.v[i - 1].path, t.v[i].path) < 0 ||
                        (!strcmp(t.v[i - 1].path, t.v[i].path) &&
                         strcmp(t.v[i - 1].name, t.v[i].name) < 0));
        sqlite3_bind_text(one, 2, t.v[i].path, -1, SQLITE_STATIC);
        sqlite3_bind_text(one, 3, t.v[i].name, -1, SQLITE_STATIC);
        assert_int_equal(sqlite3_step(one), SQLITE_ROW);
        const char *found = store_tensor_blobs_find(&t, t.v[i].path, t.v[i].name);
        assert_non_null(found);
        assert_string_equal(found, (const char *)sqlite3_column_text(one, 0));
        assert_int_equal(strlen(found), 64);
        sqlite3_reset(one);
        char *copy = NULL;
        assert_int_equal(store_tensor_blobs_get(&t, t.v[i].path, t.v[i].name, &copy), 0);
        assert_string_equal(copy, found);
        free(copy);
    }
    sqlite3_finalize(one);
    char *path = ckpt_strdup(t.v[t.n / 2].path), *name = ckpt_strdup(t.v[t.n / 2].name);
    char *copy = NULL;
    assert_int_equal(store_tensor_blobs_get(&t, path, "no.such.tensor", &copy), CKPT_ECORRUPT);
    assert_null(copy);
    assert_contains(ckpt_error_last(), path);
    assert_contains(ckpt_error_last(), "'no.such.tensor' has no blob");
    assert_null(store_tensor_blobs_find(&t, "other.safetensors", name));
    assert_null(store_tensor_blobs_find(&t, path, "no.such.tensor"));
    char *prefix = ckpt_strndup(name, strlen(name) - 1);
    assert_null(store_tensor_blobs_find(&t, path, prefix));
    free(prefix);
    store_tensor_blobs_free(&t);
    assert_int_equal(t.n, 0);
    /* A checkpoint with no tensor rows: empty, nothing found. */
    assert_int_equal(store_tensor_blobs_load(&s, ck.id + 1000, &t), 0);
    assert_int_equal(t.n, 0);
    assert_null(store_tensor_blobs_find(&t, path, name));
    store_tensor_blobs_free(&t);
    free(path);
    free(name);
    store_ckpt_free(&ck);
    store_close(&s);
}

int main(void)
{
    ckpt_log_set_level(CKPT_LOG_QUIET);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lease_keeps_blobs_from_gc, scratch_setup,
                                        scratch_teardown),
        cmocka_unit_test_setup_teardown(test_claim, scratch_setup, scratch_teardown),
        cmocka_unit_test_setup_teardown(test_lease_in_two_steps, scratch_setup, scratch_teardown),
        cmocka_unit_test_setup_teardown(test_archive_stream, scratch_setup, scratch_teardown),
        cmocka_unit_test(test_zombie_is_not_alive),
        cmocka_unit_test_setup_teardown(test_rank_limit, scratch_setup, scratch_teardown),
        cmocka_unit_test_setup_teardown(test_import_refuses_links, scratch_setup, scratch_teardown),
        cmocka_unit_test_setup_teardown(test_import_refuses_bad_names, scratch_setup,
                                        scratch_teardown),
        cmocka_unit_test_setup_teardown(test_import_bounded_fds, scratch_setup, scratch_teardown),
        cmocka_unit_test_setup_teardown(test_import_full_disk, scratch_setup, teardown_unmount),
        cmocka_unit_test_setup_teardown(test_home_is_private, scratch_setup, scratch_teardown),
        cmocka_unit_test_setup_teardown(test_migrate_files_rowid, scratch_setup, scratch_teardown),
        cmocka_unit_test_setup_teardown(test_archive_limits, scratch_setup, scratch_teardown),
        cmocka_unit_test_setup_teardown(test_archive_pipeline, scratch_setup, scratch_teardown),
        cmocka_unit_test_setup_teardown(test_info_and_verify, scratch_setup, scratch_teardown),
        cmocka_unit_test_setup_teardown(test_tensor_blobs, scratch_setup, scratch_teardown),
        cmocka_unit_test_setup_teardown(test_import_changed_tensors, scratch_setup, scratch_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

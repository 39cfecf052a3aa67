/*
 * test_common.c — the pieces of common/ everyone relies on: size and integer
 * parsing, atomic files and directories (and their modes under the umask),
 * recursive removal, sha256 and the error-message convention.
 *
 * File tests run in a fresh directory under $TMPDIR (or /tmp) that the
 * fixture removes, and check that no ".tmp-" leftovers remain.
 */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/support/scratch.h"

/* ---- fixture: a scratch directory per test ---- */

/* Number of entries in dir (excluding . and ..); counts names containing
 * ".tmp-" into *tmp_count when it is not NULL. */
static int count_entries(const char *dir, int *tmp_count)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0, tmp = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        n++;
        if (strstr(e->d_name, ".tmp-")) tmp++;
    }
    closedir(d);
    if (tmp_count) *tmp_count = tmp;
    return n;
}

static char *join(const char *a, const char *b)
{
    char *p = ckpt_path_join(a, b);
    assert_non_null(p);
    return p;
}

static void write_plain(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

static void assert_file_is(const char *path, const char *text)
{
    char *buf = NULL;
    size_t len = 0;
    assert_int_equal(ckpt_read_file(path, 1 << 20, &buf, &len), 0);
    assert_int_equal(len, strlen(text));
    assert_string_equal(buf, text);
    free(buf);
}

/* ---- parsing ---- */

/* The checked parsers for outside numbers: junk, overflow, signs where none
 * belong and values out of range are CKPT_EINVAL naming the field. */
static void test_parse_fields(void **state)
{
    (void)state;
    uint64_t u;
    int64_t i;
    double d;
    assert_int_equal(ckpt_parse_u64_field("limit", "50", 1, 100, &u), 0);
    assert_true(u == 50);
    static const char *bad_u[] = {"", "0", "101", "-1", "+5", " 5", "5 ", "5x", "0x10", "99999999999999999999"};
    for (size_t k = 0; k < sizeof bad_u / sizeof *bad_u; k++) {
        assert_int_equal(ckpt_parse_u64_field("limit", bad_u[k], 1, 100, &u), CKPT_EINVAL);
        assert_non_null(strstr(ckpt_error_last(), "limit: "));
    }
    assert_int_equal(ckpt_parse_i64_field("--priority", "-7", -10, 10, &i), 0);
    assert_true(i == -7);
    assert_int_equal(ckpt_parse_i64_field("--priority", "-9223372036854775808", INT64_MIN, 0, &i), 0);
    assert_true(i == INT64_MIN);
    static const char *bad_i[] = {"", "-", "--1", "11", "-11", "1e3", "9223372036854775808", "-9223372036854775809"};
    for (size_t k = 0; k < sizeof bad_i / sizeof *bad_i; k++) {
        assert_int_equal(ckpt_parse_i64_field("--priority", bad_i[k], -10, 10, &i), CKPT_EINVAL);
        assert_non_null(strstr(ckpt_error_last(), "--priority: "));
    }
    assert_int_equal(ckpt_parse_double("--grace", "2.5", 0, 60, &d), 0);
    assert_true(d == 2.5);
    static const char *bad_d[] = {"", "x", "1.5s", " 1", "nan", "inf", "-1", "61", "1e999"};
    for (size_t k = 0; k < sizeof bad_d / sizeof *bad_d; k++) {
        assert_int_equal(ckpt_parse_double("--grace", bad_d[k], 0, 60, &d), CKPT_EINVAL);
        assert_non_null(strstr(ckpt_error_last(), "--grace: "));
    }
    assert_int_equal(ckpt_parse_u64_field("limit", NULL, 1, 100, &u), CKPT_EINVAL);
}

static void test_parse_size(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        uint64_t want;
    } ok[] = {
        {"5GB", 5000000000ull},
        {"500MB", 500000000ull},
        {"2GiB", 2147483648ull},
        {"4096", 4096},
        {"0", 0},
        {"10KB", 10000},
        {"1KiB", 1024},
        {"3MiB", 3145728},
        {"1TB", 1000000000000ull},
        {"1TiB", 1ull << 40},
        {"1.5GiB", 1610612736ull},
        {"5gb", 5000000000ull},
        {"2gib", 2147483648ull},
        {"7B", 7},
        {"2G", 2000000000ull},
        {"0.5KB", 500},
    };
    for (size_t i = 0; i < CKPT_ARRAY_LEN(ok); i++) {
        uint64_t v = 0;
        if (ckpt_parse_size(ok[i].s, &v) != 0)
            fail_msg("'%s' rejected: %s", ok[i].s, ckpt_error_last());
        if (v != ok[i].want)
            fail_msg("'%s' -> %llu, want %llu", ok[i].s, (unsigned long long)v,
                     (unsigned long long)ok[i].want);
    }
    static const char *bad_unit[] = {"5XB", "5 GB", "5GBs", "5PB", "12 ", "5GB5", "5gigabytes"};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(bad_unit); i++) {
        uint64_t v = 12345;
        if (ckpt_parse_size(bad_unit[i], &v) != CKPT_EINVAL)
            fail_msg("'%s' accepted as %llu", bad_unit[i], (unsigned long long)v);
        assert_int_equal(v, 12345);
    }
    static const char *junk[] = {"", "GB", "abc", "-5GB", " 5GB", "+5GB", "x5"};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(junk); i++) {
        uint64_t v = 12345;
        if (ckpt_parse_size(junk[i], &v) != CKPT_EINVAL)
            fail_msg("'%s' accepted as %llu", junk[i], (unsigned long long)v);
        assert_int_equal(v, 12345);
    }
    uint64_t v;
    assert_int_equal(ckpt_parse_size(NULL, &v), CKPT_EINVAL);
    assert_int_equal(ckpt_parse_size("99999999TB", &v), CKPT_ELIMIT);
}

static void test_parse_u64(void **state)
{
    (void)state;
    uint64_t v = 1;
    assert_int_equal(ckpt_parse_u64("0", &v), 0);
    assert_int_equal(v, 0);
    assert_int_equal(ckpt_parse_u64("42", &v), 0);
    assert_int_equal(v, 42);
    assert_int_equal(ckpt_parse_u64("007", &v), 0);
    assert_int_equal(v, 7);
    assert_int_equal(ckpt_parse_u64("18446744073709551615", &v), 0);
    assert_true(v == UINT64_MAX);
    static const char *bad[] = {"",
                                "-1",
                                "+1",
                                " 1",
                                "1 ",
                                "1x",
                                "0x10",
                                "1.5",
                                "1e3",
                                "18446744073709551616",
                                "99999999999999999999999"};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(bad); i++) {
        v = 77;
        if (ckpt_parse_u64(bad[i], &v) != CKPT_EINVAL)
            fail_msg("'%s' accepted as %llu", bad[i], (unsigned long long)v);
        assert_int_equal(v, 77);
    }
    assert_int_equal(ckpt_parse_u64(NULL, &v), CKPT_EINVAL);
}

/* ---- atomic files ---- */

static void test_atomic_commit(void **state)
{
    const char *dir = *state;
    char *path = join(dir, "model.safetensors");
    ckpt_atomic_file af;
    assert_int_equal(ckpt_atomic_open(&af, path), 0);
    assert_true(af.fd >= 0);
    /* The temp file sits beside the target, recognisable by name. */
    assert_non_null(strstr(af.tmp_path, ".tmp-"));
    assert_non_null(strstr(af.tmp_path, "model.safetensors"));
    assert_true(ckpt_exists(af.tmp_path));
    assert_int_equal(ckpt_write_full(af.fd, "hello ", 6, path), 0);
    assert_int_equal(ckpt_pwrite_full(af.fd, "world", 5, 6, path), 0);
    assert_false(ckpt_exists(path)); /* invisible until committed */
    char *tmp_copy = ckpt_strdup(af.tmp_path);
    assert_int_equal(ckpt_atomic_commit(&af), 0);
    assert_true(ckpt_exists(path));
    assert_false(ckpt_exists(tmp_copy));
    assert_file_is(path, "hello world");
    int tmp = -1;
    assert_int_equal(count_entries(dir, &tmp), 1);
    assert_int_equal(tmp, 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);

    /* Committing again replaces the old content in one step. */
    assert_int_equal(ckpt_write_file_atomic(path, "second", 6), 0);
    assert_file_is(path, "second");
    assert_int_equal(count_entries(dir, &tmp), 1);
    assert_int_equal(tmp, 0);
    free(tmp_copy);
    free(path);
}

static void test_atomic_abort(void **state)
{
    const char *dir = *state;
    char *path = join(dir, "out.bin");
    ckpt_atomic_file af;
    assert_int_equal(ckpt_atomic_open(&af, path), 0);
    assert_int_equal(ckpt_write_full(af.fd, "partial", 7, path), 0);
    assert_int_equal(count_entries(dir, NULL), 1); /* the temp file */
    ckpt_atomic_abort(&af);
    assert_int_equal(af.fd, -1);
    assert_null(af.tmp_path);
    assert_false(ckpt_exists(path));
    assert_int_equal(count_entries(dir, NULL), 0);

    /* Aborting over an existing file leaves that file alone. */
    assert_int_equal(ckpt_write_file_atomic(path, "keep", 4), 0);
    assert_int_equal(ckpt_atomic_open(&af, path), 0);
    assert_int_equal(ckpt_write_full(af.fd, "discard", 7, path), 0);
    ckpt_atomic_abort(&af);
    assert_file_is(path, "keep");
    int tmp = -1;
    assert_int_equal(count_entries(dir, &tmp), 1);
    assert_int_equal(tmp, 0);
    free(path);
}

static void test_atomic_open_missing_dir(void **state)
{
    const char *dir = *state;
    char *path = join(dir, "no/such/dir/file");
    ckpt_atomic_file af;
    assert_true(ckpt_atomic_open(&af, path) < 0);
    assert_int_equal(af.fd, -1);
    assert_null(af.path);
    assert_null(af.tmp_path);
    assert_non_null(strstr(ckpt_error_last(), path));
    free(path);
}

static void test_read_file_limits(void **state)
{
    const char *dir = *state;
    char *path = join(dir, "f.txt");
    write_plain(path, "0123456789");
    char *buf = NULL;
    size_t len = 0;
    assert_int_equal(ckpt_read_file(path, 10, &buf, &len), 0);
    assert_int_equal(len, 10);
    free(buf);
    assert_int_equal(ckpt_read_file(path, 9, &buf, &len), CKPT_ELIMIT);
    assert_null(buf);
    char *missing = join(dir, "missing");
    assert_int_equal(ckpt_read_file(missing, 10, &buf, &len), CKPT_ENOTFOUND);
    assert_int_equal(ckpt_read_file(dir, 10, &buf, &len), CKPT_EINVAL); /* a directory */
    free(missing);
    free(path);
}

/* ---- directories ---- */

static void test_tmpdir_commit(void **state)
{
    const char *dir = *state;
    char *target = join(dir, "out");
    char *tmp = NULL;
    assert_int_equal(ckpt_tmpdir_create(target, &tmp), 0);
    assert_non_null(tmp);
    assert_true(strncmp(tmp, target, strlen(target)) == 0);
    assert_non_null(strstr(tmp + strlen(target), ".tmp-"));
    assert_true(ckpt_is_dir(tmp));
    assert_false(ckpt_exists(target));
    char *inner = join(tmp, "config.json");
    assert_int_equal(ckpt_write_file_atomic(inner, "{}", 2), 0);
    assert_int_equal(ckpt_dir_commit(tmp, target), 0);
    assert_false(ckpt_exists(tmp));
    assert_true(ckpt_is_dir(target));
    char *moved = join(target, "config.json");
    assert_file_is(moved, "{}");
    int tmpn = -1;
    assert_int_equal(count_entries(dir, &tmpn), 1);
    assert_int_equal(tmpn, 0);
    free(moved);
    free(inner);
    free(tmp);

    /* A trailing slash on the target does not put the temp inside it. */
    char *target2 = join(dir, "out2/");
    assert_int_equal(ckpt_tmpdir_create(target2, &tmp), 0);
    assert_true(strncmp(tmp, target2, strlen(target2) - 1) == 0);
    assert_non_null(strstr(tmp, "out2.tmp-"));
    /* Committing onto an existing empty directory replaces it. */
    char *target2_clean = join(dir, "out2");
    assert_int_equal(mkdir(target2_clean, 0755), 0);
    assert_int_equal(ckpt_dir_commit(tmp, target2_clean), 0);
    assert_true(ckpt_is_dir(target2_clean));
    assert_false(ckpt_exists(tmp));
    free(tmp);

    /* Committing onto a non-empty directory fails and leaves both alone. */
    assert_int_equal(ckpt_tmpdir_create(target, &tmp), 0);
    assert_true(ckpt_dir_commit(tmp, target) < 0);
    assert_non_null(strstr(ckpt_error_last(), target));
    assert_true(ckpt_is_dir(tmp));
    char *still = join(target, "config.json");
    assert_file_is(still, "{}");
    assert_int_equal(ckpt_rm_rf(tmp), 0);
    assert_int_equal(count_entries(dir, &tmpn), 2);
    assert_int_equal(tmpn, 0);
    free(still);
    free(tmp);
    free(target2_clean);
    free(target2);
    free(target);
}

/* A temp folder names its writer; a dead writer's is removed by the next
 * ckpt_tmpdir_create for the same target, a live one's is kept. */
static void test_tmpdir_stale(void **state)
{
    const char *dir = *state;
    char *target = join(dir, "out");
    char *tmp = NULL;
    assert_int_equal(ckpt_tmpdir_create(target, &tmp), 0);
    int pid;
    int64_t start;
    assert_true(ckpt_tmp_name_writer(tmp + strlen(target) + 5, &pid, &start));
    assert_int_equal(pid, (int)getpid());
    assert_true(start == ckpt_proc_start_time((int)getpid()) && start > 0);
    assert_false(ckpt_tmp_name_writer("XXXXXX", &pid, &start)); /* an old-style name: not parsed */
    /* A dead writer: a start time this pid never had. */
    char *dead = ckpt_sprintf("%s.tmp-%d-%lld-abcdef", target, (int)getpid(), (long long)start + 12345);
    assert_int_equal(mkdir(dead, 0755), 0);
    char *inner = join(dead, "model.safetensors");
    assert_int_equal(ckpt_write_file_atomic(inner, "x", 1), 0);
    char *old_style = ckpt_sprintf("%s.tmp-Qx12ab", target);
    assert_int_equal(mkdir(old_style, 0755), 0);
    char *tmp2 = NULL;
    assert_int_equal(ckpt_tmpdir_create(target, &tmp2), 0);
    assert_false(ckpt_exists(dead));     /* its writer is gone */
    assert_true(ckpt_is_dir(tmp));       /* this process: alive */
    assert_true(ckpt_is_dir(old_style)); /* no writer in the name: left alone */
    assert_int_equal(ckpt_rm_rf(tmp), 0);
    assert_int_equal(ckpt_rm_rf(tmp2), 0);
    assert_int_equal(ckpt_rm_rf(old_style), 0);
    free(tmp);
    free(tmp2);
    free(inner);
    free(dead);
    free(old_style);
    free(target);
}

static void test_rm_rf(void **state)
{
    const char *dir = *state;
    char *top = join(dir, "tree");
    char *deep = join(top, "a/b/c");
    assert_int_equal(ckpt_mkdir_p(deep, 0755), 0);
    assert_int_equal(ckpt_mkdir_p(deep, 0755), 0); /* existing is fine */
    char *f1 = join(deep, "x"), *f2 = join(top, "y"), *link = join(top, "a/ln");
    write_plain(f1, "1");
    write_plain(f2, "2");
    /* A symlink to outside the tree is removed, not followed. */
    char *outside = join(dir, "outside");
    write_plain(outside, "keep");
    assert_int_equal(symlink(outside, link), 0);
    assert_int_equal(ckpt_rm_rf(top), 0);
    assert_false(ckpt_exists(top));
    assert_file_is(outside, "keep");
    /* Missing is fine; a plain file is removed. */
    assert_int_equal(ckpt_rm_rf(top), 0);
    assert_int_equal(ckpt_rm_rf(outside), 0);
    assert_false(ckpt_exists(outside));
    assert_int_equal(count_entries(dir, NULL), 0);
    assert_true(ckpt_dir_is_empty_or_missing(dir));
    assert_true(ckpt_dir_is_empty_or_missing(top));
    free(outside);
    free(link);
    free(f2);
    free(f1);
    free(deep);
    free(top);
}

/* ---- sha256 ---- */

#define SHA_EMPTY "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define SHA_ABC "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
/* FIPS 180-2 two-block vector. */
#define SHA_448 "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
#define MSG_448 "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"

static void test_sha256_vectors(void **state)
{
    (void)state;
    char hex[65];
    assert_int_equal(ckpt_sha256_buf_hex("", 0, hex), 0);
    assert_string_equal(hex, SHA_EMPTY);
    assert_int_equal(ckpt_sha256_buf_hex("abc", 3, hex), 0);
    assert_string_equal(hex, SHA_ABC);
    assert_int_equal(ckpt_sha256_buf_hex(MSG_448, strlen(MSG_448), hex), 0);
    assert_string_equal(hex, SHA_448);

    /* Streaming in uneven pieces gives the same digest. */
    ckpt_sha256 h;
    assert_int_equal(ckpt_sha256_init(&h), 0);
    const char *m = MSG_448;
    size_t len = strlen(m), cuts[] = {0, 1, 7, 30, len};
    for (size_t i = 0; i + 1 < CKPT_ARRAY_LEN(cuts); i++)
        assert_int_equal(ckpt_sha256_update(&h, m + cuts[i], cuts[i + 1] - cuts[i]), 0);
    assert_int_equal(ckpt_sha256_final_hex(&h, hex), 0);
    assert_string_equal(hex, SHA_448);
    assert_null(h.ctx);
}

static void test_sha256_files(void **state)
{
    const char *dir = *state;
    char *path = join(dir, "data");
    assert_int_equal(ckpt_write_file_atomic(path, "xxabcyy", 7), 0);
    char hex[65];
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(ckpt_sha256_fd_range_hex(fd, 2, 3, hex, path), 0);
    assert_string_equal(hex, SHA_ABC);
    assert_int_equal(ckpt_sha256_fd_range_hex(fd, 7, 0, hex, path), 0);
    assert_string_equal(hex, SHA_EMPTY);
    /* A range past the end is an error, not a short hash. */
    assert_true(ckpt_sha256_fd_range_hex(fd, 5, 10, hex, path) < 0);
    close(fd);
    assert_int_equal(ckpt_write_file_atomic(path, "abc", 3), 0);
    assert_int_equal(ckpt_sha256_file_hex(path, hex), 0);
    assert_string_equal(hex, SHA_ABC);
    char *missing = join(dir, "missing");
    assert_true(ckpt_sha256_file_hex(missing, hex) < 0);
    free(missing);
    free(path);
}

/* ---- errors ---- */

static void test_error_convention(void **state)
{
    (void)state;
    ckpt_error_clear();
    assert_string_equal(ckpt_error_last(), "");
    assert_int_equal(ckpt_error_set(CKPT_EINVAL, "tensor '%s' begins at %d", "x", 1024),
                     CKPT_EINVAL);
    assert_string_equal(ckpt_error_last(), "tensor 'x' begins at 1024");
    /* Prefixes stack outermost first and pass the code through. */
    assert_int_equal(ckpt_error_prefix(CKPT_EINVAL, "InvalidOffset"), CKPT_EINVAL);
    assert_int_equal(ckpt_error_prefix(CKPT_ELIMIT, "%s", "model-00002-of-00004.safetensors"),
                     CKPT_ELIMIT);
    assert_string_equal(
        ckpt_error_last(),
        "model-00002-of-00004.safetensors: InvalidOffset: tensor 'x' begins at 1024");
    /* A prefix longer than the buffer is cut, not overflowed. */
    char longp[5000];
    memset(longp, 'p', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    assert_int_equal(ckpt_error_prefix(CKPT_EIO, "%s", longp), CKPT_EIO);
    assert_true(strlen(ckpt_error_last()) < sizeof longp);
    assert_true(ckpt_error_last()[0] == 'p');

    errno = ENOENT;
    assert_int_equal(ckpt_error_sys("open %s", "/nope"), CKPT_EIO);
    assert_non_null(strstr(ckpt_error_last(), "open /nope: "));
    assert_non_null(strstr(ckpt_error_last(), strerror(ENOENT)));
    assert_int_equal(errno, ENOENT); /* preserved for the caller */
    errno = ENOMEM;
    assert_int_equal(ckpt_error_sys("alloc"), CKPT_ENOMEM);

    assert_string_equal(ckpt_code_name(CKPT_OK), "ok");
    assert_string_equal(ckpt_code_name(CKPT_EINVAL), "invalid input");
    assert_string_equal(ckpt_code_name(CKPT_ELIMIT), "limit exceeded");
    assert_string_equal(ckpt_code_name(-1000), "error");
    ckpt_error_clear();
    assert_string_equal(ckpt_error_last(), "");
}

static void test_checked_arithmetic(void **state)
{
    (void)state;
    uint64_t r;
    assert_true(ckpt_mul(1ull << 32, 1ull << 31, &r));
    assert_int_equal(r, 1ull << 63);
    assert_false(ckpt_mul(1ull << 32, 1ull << 32, &r));
    assert_true(ckpt_add(UINT64_MAX - 1, 1, &r));
    assert_false(ckpt_add(UINT64_MAX, 1, &r));
    char buf[32];
    assert_string_equal(ckpt_format_size(512, buf, sizeof buf), "512 B");
    assert_string_equal(ckpt_format_size(3ull << 30, buf, sizeof buf), "3.00 GiB");
    char *p = join("a/", "b");
    assert_string_equal(p, "a/b");
    free(p);
    p = join("a", "b");
    assert_string_equal(p, "a/b");
    free(p);
    assert_string_equal(ckpt_basename("/x/y/z.json"), "z.json");
    assert_string_equal(ckpt_basename("z.json"), "z.json");
}

/* Issue 14 #10: atomic files and temp directories get the modes open(2) and
 * mkdir(2) would under the umask (0644/0755 forced before, whatever it was). */
/* ckpt_big_alloc: page-aligned (2 MiB from 2 MiB on, outside sanitizer
 * builds), every byte usable, freed by size; an impossible size is an error. */
static void test_big_alloc(void **state)
{
    (void)state;
    const size_t sizes[] = {0, 1, 4095, (2u << 20) - 1, 2u << 20, (5u << 20) + 123};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(sizes); i++) {
        size_t n = sizes[i];
        uint8_t *p = ckpt_big_alloc(n);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 4096, 0);
#if !defined(__SANITIZE_ADDRESS__)
        if (n >= (2u << 20)) assert_int_equal((uintptr_t)p % (2u << 20), 0);
#endif
        memset(p, 0xa5, n);
        for (size_t k = 0; k < n; k += 4093) assert_int_equal(p[k], 0xa5);
        if (n) assert_int_equal(p[n - 1], 0xa5);
        ckpt_big_free(p, n);
    }
    assert_null(ckpt_big_alloc(SIZE_MAX));
    assert_non_null(strstr(ckpt_error_last(), "out of memory"));
    ckpt_big_free(NULL, 2u << 20);
    ckpt_big_free(NULL, 0);
}

#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
/* Whether a [heap] mapping of this process is marked for huge pages ("hg"
 * in its VmFlags). */
static bool heap_has_hugepage_flag(void)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return false;
    char line[512];
    bool in_heap = false, found = false;
    while (!found && fgets(line, sizeof line, f)) {
        if (strchr(line, '-') && strchr(line, ' ') && strchr(line, '-') < strchr(line, ' ')) in_heap = strstr(line, "[heap]") != NULL;
        else if (in_heap && !strncmp(line, "VmFlags:", 8)) found = strstr(line, " hg") != NULL;
    }
    fclose(f);
    return found;
}
#endif

/* ckpt_heap_reserve_huge: with glibc (outside sanitizer builds) the heap
 * grown ahead is marked for huge pages, and malloc and free work on as
 * before; sizes out of its range change nothing. */
static void test_heap_reserve_huge(void **state)
{
    (void)state;
    ckpt_heap_reserve_huge(0);
    ckpt_heap_reserve_huge(SIZE_MAX);
    ckpt_heap_reserve_huge(64u << 20);
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
    assert_true(heap_has_hugepage_flag());
#endif
    enum { N = 20000 };
    char **v = calloc(N, sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < N; i++) {
        v[i] = malloc(100 + i % 300);
        assert_non_null(v[i]);
        memset(v[i], (int)(i & 0xff), 100);
    }
    for (size_t i = 0; i < N; i++) {
        assert_int_equal((unsigned char)v[i][99], i & 0xff);
        free(v[i]);
    }
    free(v);
}

static void test_modes_follow_umask(void **state)
{
    const char *dir = *state;
    mode_t old = umask(027);
    char *path = join(dir, "ckpt.db.json"), *target = join(dir, "out");
    assert_int_equal(ckpt_umask(), 027);
    int rc = ckpt_write_file_atomic(path, "{}", 2);
    char *tmp = NULL;
    int trc = ckpt_tmpdir_create(target, &tmp);
    umask(old);
    assert_int_equal(rc, 0);
    assert_int_equal(trc, 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0640);
    assert_int_equal(stat(tmp, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0750);
    assert_int_equal(ckpt_umask(), (unsigned)old);
    free(tmp);
    free(target);
    free(path);
}

/* ckpt_progress_rate with fixed figures: the rate and time left a worker
 * reports (and so GET /v1/jobs and the dashboard show) and the TTY line draws. */
static void test_progress_rate(void **state)
{
    (void)state;
    const uint64_t MiB = 1u << 20;
    ckpt_progress p = {.total = 10 * MiB, .done = 3 * MiB, .base = 1 * MiB, .started = 100.0};
    double rate, eta;
    ckpt_progress_rate(&p, 102.0, &rate, &eta); /* 2 MiB moved in 2 s (the resumed 1 MiB left out) */
    assert_true(rate == (double)MiB);
    assert_true(eta == 7.0); /* 7 MiB left at 1 MiB/s */
    ckpt_progress_rate(&p, 108.0, &rate, &eta); /* a stall lowers the rate, raises the time left */
    assert_true(rate == (double)MiB / 4);
    assert_true(eta == 28.0);
    ckpt_progress_rate(&p, 100.0, &rate, &eta); /* no time passed: unknown */
    assert_true(rate == 0 && eta == -1);
    p.done = p.base; /* nothing moved in this run yet */
    ckpt_progress_rate(&p, 105.0, &rate, &eta);
    assert_true(rate == 0 && eta == -1);
    p.done = p.total; /* all done: nothing left */
    ckpt_progress_rate(&p, 109.0, &rate, &eta);
    assert_true(rate == (double)MiB && eta == 0);
    p.total = 0; /* a phase without a total: a rate, no time left */
    p.done = 5 * MiB;
    ckpt_progress_rate(&p, 104.0, &rate, &eta);
    assert_true(rate == (double)MiB && eta == -1);
}

/* A worker's sink gets the progress with its rate (ckpt_progress_rate) at
 * once on the first update, then at finish all bytes and tensors done. */
static int sink_calls;
static ckpt_progress sink_last;
static double sink_rate, sink_eta;
static void sink(const ckpt_progress *p, double rate, double eta)
{
    sink_calls++;
    sink_last = *p;
    sink_rate = rate;
    sink_eta = eta;
}

static void test_progress_sink(void **state)
{
    (void)state;
    ckpt_progress_set_sink(sink);
    ckpt_progress p;
    ckpt_progress_start(&p, "hashing", 1000);
    p.started -= 2.0; /* as if started 2 s ago: a rate of about 100 B/s after 200 bytes */
    ckpt_progress_tensors(&p, 1, 4);
    ckpt_progress_update(&p, 200);
    assert_int_equal(sink_calls, 1);
    assert_string_equal(sink_last.label, "hashing");
    assert_int_equal(sink_last.done, 200);
    assert_int_equal(sink_last.tensors, 1);
    assert_true(sink_rate > 0 && sink_rate <= 100.0);
    assert_true(sink_eta >= 8.0 && fabs(sink_eta - 800 / sink_rate) < 1e-9);
    ckpt_progress_update(&p, 300); /* within 0.25 s of the last report: not sent */
    assert_int_equal(sink_calls, 1);
    ckpt_progress_finish(&p);
    assert_int_equal(sink_calls, 2);
    assert_int_equal(sink_last.done, 1000);
    assert_int_equal(sink_last.tensors, 4);
    assert_true(sink_eta == 0);
    ckpt_progress_set_sink(NULL);
}

/* ckpt_pread_direct reads exactly [off, off+len) wherever off and len lie in
 * a block, through O_DIRECT when the folder's file system takes it (then the
 * page cache holds none of the file's pages afterwards), through the page
 * cache for a misaligned buffer or no O_DIRECT descriptor; it writes nothing
 * outside the block-rounded range around buf; past the end is an error. */
static void test_pread_direct(void **state)
{
    const char *dir = *state;
    char *path = join(dir, "data");
    const size_t A = CKPT_DIRECT_ALIGN, size = 3 * A + 123;
    uint8_t *want = malloc(size);
    assert_non_null(want);
    for (size_t i = 0; i < size; i++) want[i] = (uint8_t)(i * 7 + i / 251);
    assert_int_equal(ckpt_write_file_atomic(path, want, size), 0);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    int dfd = ckpt_open_direct(path, fd);
    const size_t room = 8 * A;
    uint8_t *mem = ckpt_big_alloc(room);
    assert_non_null(mem);
    const struct { uint64_t off; size_t len; } cases[] = {
        {0, size}, {0, A}, {1, 10}, {A - 1, 2}, {A + 100, 2 * A}, {5, size - 5}, {size - 1, 1}, {2 * A, 123 + A},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (int misaligned = 0; misaligned < 2; misaligned++) {
            memset(mem, 0xEE, room);
            uint8_t *buf = mem + A + cases[c].off % A + (size_t)misaligned;
            assert_int_equal(ckpt_pread_direct(dfd, fd, buf, cases[c].len, cases[c].off, path), 0);
            assert_memory_equal(buf, want + cases[c].off, cases[c].len);
            /* the blocks around the range only: the guard block before and everything after stay */
            uint8_t *end = mem + A + (cases[c].off % A + cases[c].len + A - 1) / A * A + (size_t)misaligned;
            for (uint8_t *p = mem; p < mem + A; p++) assert_int_equal(*p, 0xEE);
            for (uint8_t *p = end + A; p < mem + room; p++) assert_int_equal(*p, 0xEE);
        }
    }
    if (dfd >= 0) { /* (the misaligned reads went through the page cache: emptied again) */
        assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
        uint8_t *buf = mem + A + 100;
        assert_int_equal(ckpt_pread_direct(dfd, fd, buf, 2 * A, 100, path), 0);
        assert_memory_equal(buf, want + 100, 2 * A);
        unsigned char vec[4];
        void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
        assert_true(m != MAP_FAILED);
        assert_int_equal(mincore(m, size, vec), 0);
        for (int i = 0; i < 4; i++) assert_int_equal(vec[i] & 1, 0);
        munmap(m, size);
    } else {
        print_message("(no O_DIRECT in %s: the page cache path only)\n", dir);
    }
    /* past the end: an error naming the file, by either path */
    assert_int_equal(ckpt_pread_direct(dfd, fd, mem + A + (size - 10) % A, 200, size - 10, path), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "unexpected end of file");
    assert_int_equal(ckpt_pread_direct(-1, fd, mem + A, 2, size - 1, path), CKPT_EINVAL);
    ckpt_big_free(mem, room);
    if (dfd >= 0) close(dfd);
    close(fd);
    free(want);
    free(path);
}

#define SCRATCH_TEST(fn) cmocka_unit_test_setup_teardown(fn, scratch_setup, scratch_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_size),          cmocka_unit_test(test_parse_u64), cmocka_unit_test(test_parse_fields),
        SCRATCH_TEST(test_atomic_commit),           SCRATCH_TEST(test_atomic_abort),
        SCRATCH_TEST(test_atomic_open_missing_dir), SCRATCH_TEST(test_read_file_limits),
        SCRATCH_TEST(test_tmpdir_commit),           SCRATCH_TEST(test_tmpdir_stale),
        SCRATCH_TEST(test_rm_rf),                   SCRATCH_TEST(test_pread_direct),
        cmocka_unit_test(test_sha256_vectors),      SCRATCH_TEST(test_sha256_files),
        cmocka_unit_test(test_error_convention),    cmocka_unit_test(test_checked_arithmetic),
        cmocka_unit_test(test_big_alloc),
        cmocka_unit_test(test_heap_reserve_huge),
        SCRATCH_TEST(test_modes_follow_umask),
        cmocka_unit_test(test_progress_rate),       cmocka_unit_test(test_progress_sink),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

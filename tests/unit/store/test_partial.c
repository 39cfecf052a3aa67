/* test_partial.c — the kept pieces of interrupted fetches (store_partial.h):
 * one fetch per commit folder, meta that must match, a journal whose torn or
 * out-of-bounds lines end the list, the bytes held, and gc's rule (a live
 * fetch's folder stays; an idle one goes once the keep period passed). */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/util.h"
#include "store/store.h"
#include "store/store_partial.h"
#include "tests/support/scratch.h"

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

#define COMMIT "0123456789abcdef0123456789abcdef01234567"
#define SHA "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

static void append(const char *dir, const char *name, const char *text)
{
    char *path = ckpt_path_join(dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    free(path);
}

static void test_partial(void **state)
{
    const char *home = *state;
    ckpt_store s;
    assert_int_equal(store_open(&s, home), 0);
    store_partial p, q;
    assert_int_equal(store_partial_open(&s, COMMIT, &p), 0);
    assert_non_null(p.dir);
    /* a second fetch of the commit keeps nothing */
    assert_int_equal(store_partial_open(&s, COMMIT, &q), 0);
    assert_null(q.dir);
    store_partial_close(&q, false);

    char *dir;
    bool kept;
    assert_int_equal(store_partial_file(&p, "a/model.safetensors", 1000, SHA, "", false, &dir, &kept), 0);
    assert_false(kept);
    int jfd;
    assert_int_equal(store_partial_journal_open(dir, &jfd), 0);
    assert_int_equal(store_partial_journal_add(jfd, dir, 0, 100), 0);
    assert_int_equal(store_partial_journal_add(jfd, dir, 200, 300), 0);
    close(jfd);
    append(dir, "journal", "300 2000\n300 40"); /* past the size, then torn: the list ends before */
    uint64_t(*r)[2];
    size_t n;
    assert_int_equal(store_partial_journal_read(dir, 1000, &r, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(r[1][0], 200);
    assert_int_equal(r[1][1], 300);
    free(r);
    append(dir, "r0", "0123456789");
    assert_true(store_partial_bytes(&p) > 0);
    free(dir);

    /* the same file: kept; other bytes under the path: wiped */
    assert_int_equal(store_partial_file(&p, "a/model.safetensors", 1000, SHA, "", false, &dir, &kept), 0);
    assert_true(kept);
    free(dir);
    assert_int_equal(store_partial_file(&p, "a/model.safetensors", 1001, SHA, "", false, &dir, &kept), 0);
    assert_false(kept);
    assert_int_equal(store_partial_journal_read(dir, 1001, &r, &n), 0);
    assert_int_equal(n, 0);
    free(r);
    free(dir);

    /* gc: a held folder stays, even past the keep period */
    uint64_t removed = 0;
    assert_int_equal(store_partial_gc(&s, 0, false, &removed), 0);
    assert_int_equal(removed, 0);
    store_partial_close(&p, false);
    /* idle and recent: kept; idle past the keep period: removed */
    assert_int_equal(store_partial_gc(&s, 3600, false, &removed), 0);
    assert_int_equal(removed, 0);
    assert_int_equal(store_partial_gc(&s, 0, true, &removed), 0); /* a dry run counts, removes nothing */
    assert_int_equal(removed, 1);
    char *folder = ckpt_sprintf("%s/partial/%s", home, COMMIT);
    assert_true(ckpt_is_dir(folder));
    removed = 0;
    assert_int_equal(store_partial_gc(&s, 0, false, &removed), 0);
    assert_int_equal(removed, 1);
    assert_false(ckpt_exists(folder));
    free(folder);
    store_close(&s);
}

int main(void)
{
    ckpt_log_set_level(CKPT_LOG_QUIET);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_partial, scratch_setup, scratch_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

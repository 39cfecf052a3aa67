/*
 * test_db.c — common/db.h on its SQLite driver (an in-memory database), and
 * what needs no server of the PostgreSQL one: URLs without their password,
 * and a connection refused with a message that names the database and leaves
 * the password out; bytes and batches of writes, on SQLite and (with CKPT_DB
 * set, as tests/e2e/test_pg.sh runs it) on a real PostgreSQL server.
 */
#include "common/db.h"
#include "common/error.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static void test_redact(void **state)
{
    (void)state;
    const char *cases[][2] = {
        {"postgresql://ckpt:s3cret@db.example:5432/ckpt", "postgresql://ckpt@db.example:5432/ckpt"},
        {"postgres://u:p@h/d?sslmode=require", "postgres://u@h/d?sslmode=require"},
        {"postgresql://u@h/d", "postgresql://u@h/d"},
        {"postgresql://h/d?password=x:y@z", "postgresql://h/d?password=***"},
        {"postgresql://u:p@h/d?sslmode=require&password=x&application_name=a",
         "postgresql://u@h/d?sslmode=require&password=***&application_name=a"},
        {"postgresql:///d", "postgresql:///d"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *r = db_redact_url(cases[i][0]);
        assert_non_null(r);
        assert_string_equal(r, cases[i][1]);
        free(r);
    }
    assert_true(db_is_pg_url("postgresql://h/d"));
    assert_true(db_is_pg_url("postgres://h/d"));
    assert_false(db_is_pg_url("/var/lib/ckpt/ckpt.db"));
    assert_false(db_is_pg_url(NULL));
}

static void test_refused_without_password(void **state)
{
    (void)state;
    ckpt_db *d = NULL;
    /* port 1 on loopback: nothing listens, the connection is refused at once */
    int rc = db_open_pg("postgresql://ckpt:s3cret@127.0.0.1:1/ckpt?connect_timeout=5", &d);
    assert_true(rc < 0);
    assert_null(d);
    const char *msg = ckpt_error_last();
    assert_non_null(strstr(msg, "postgresql://ckpt@127.0.0.1:1/ckpt"));
    assert_non_null(strstr(msg, "connect"));
    assert_null(strstr(msg, "s3cret"));
}

static void test_sqlite_driver(void **state)
{
    (void)state;
    sqlite3 *h;
    assert_int_equal(sqlite3_open(":memory:", &h), SQLITE_OK);
    ckpt_db *d;
    assert_int_equal(db_wrap_sqlite(h, "mem.db", &d), 0);
    assert_int_equal(db_kind(d), DB_SQLITE);
    assert_int_equal(db_exec(d, "CREATE TABLE t (id INTEGER PRIMARY KEY, k TEXT UNIQUE, x REAL, n INTEGER)", "create"), 0);
    /* ?N and ? parameters, RETURNING, NULLs */
    assert_int_equal(db_begin(d), 0);
    ckpt_stmt *st;
    assert_int_equal(db_prepare(d, &st, "INSERT INTO t(k, x, n) VALUES (?1, ?2, ?3) RETURNING id", "insert"), 0);
    db_bind_text(st, 1, "a");
    db_bind_double(st, 2, 0.1);
    db_bind_int64(st, 3, INT64_MAX);
    assert_int_equal(db_step(st), DB_ROW);
    int64_t id = db_col_int64(st, 0);
    assert_int_equal(db_step(st), DB_DONE);
    assert_int_equal(db_changes(st), 1);
    db_finalize(st);
    assert_int_equal(db_commit(d), 0);
    assert_int_equal(db_prepare(d, &st, "SELECT k, x, n, NULL FROM t WHERE id = ?", "read"), 0);
    db_bind_int64(st, 1, id);
    assert_int_equal(db_step(st), DB_ROW);
    assert_string_equal(db_col_text(st, 0), "a");
    assert_true(db_col_double(st, 1) == 0.1);
    assert_true(db_col_int64(st, 2) == INT64_MAX);
    assert_true(db_col_null(st, 3));
    assert_null(db_col_text(st, 3));
    db_finalize(st);
    /* a unique violation: an error naming the database and the statement's purpose, flagged */
    assert_int_equal(db_prepare(d, &st, "INSERT INTO t(k) VALUES (?)", "insert again"), 0);
    db_bind_text(st, 1, "a");
    assert_true(db_run(st) < 0);
    assert_true(db_last_unique(d));
    assert_non_null(strstr(ckpt_error_last(), "mem.db: insert again: "));
    /* reset, bind again, run */
    db_reset(st);
    db_bind_text(st, 1, "b");
    assert_int_equal(db_run(st), 0);
    assert_false(db_last_unique(d));
    db_finalize(st);
    /* a rolled back transaction leaves nothing */
    assert_int_equal(db_begin(d), 0);
    assert_int_equal(db_exec(d, "DELETE FROM t", "delete"), 0);
    db_rollback(d);
    assert_int_equal(db_prepare(d, &st, "SELECT count(*) FROM t", "count"), 0);
    assert_int_equal(db_step(st), DB_ROW);
    assert_int_equal(db_col_int64(st, 0), 2);
    db_finalize(st);
    /* wake-ups are PostgreSQL's: nothing to listen to on SQLite */
    assert_int_equal(db_wake_fd(d), -1);
    assert_int_equal(db_listen(d, "ckpt_jobs"), 0);
    assert_int_equal(db_notify(d, "ckpt_jobs"), 0);
    db_close(d);
    sqlite3_close(h);
}

/* Bytes round-trip: every byte value, NUL included, and NULL. */
static void check_bytes(ckpt_db *d)
{
    assert_int_equal(db_exec(d, db_kind(d) == DB_PG ? "CREATE TEMP TABLE b (id bigint, v bytea)"
                                                    : "CREATE TEMP TABLE b (id INTEGER, v BLOB)",
                             "create"),
                     0);
    unsigned char all[512];
    for (size_t i = 0; i < sizeof all; i++) all[i] = (unsigned char)(255 - i % 256);
    ckpt_stmt *st;
    assert_int_equal(db_prepare(d, &st, "INSERT INTO b(id, v) VALUES (?, ?)", "insert bytes"), 0);
    db_bind_int64(st, 1, 1);
    db_bind_blob(st, 2, all, sizeof all);
    assert_int_equal(db_run(st), 0);
    db_reset(st);
    db_bind_int64(st, 1, 2);
    db_bind_blob(st, 2, NULL, 0);
    assert_int_equal(db_run(st), 0);
    db_finalize(st);
    assert_int_equal(db_prepare(d, &st, "SELECT v FROM b ORDER BY id", "read bytes"), 0);
    size_t n = 0;
    assert_int_equal(db_step(st), DB_ROW);
    const unsigned char *got = db_col_blob(st, 0, &n);
    assert_int_equal(n, sizeof all);
    assert_memory_equal(got, all, sizeof all);
    assert_int_equal(db_step(st), DB_ROW);
    assert_null(db_col_blob(st, 0, &n));
    assert_int_equal(n, 0);
    assert_int_equal(db_step(st), DB_DONE);
    db_finalize(st);
}

/* A batch of writes: more rows than DB_BATCH_MAX (answers read at each sync
 * and at the end) all land; a unique violation in a batch is reported (naming
 * the statement), and a rollback leaves none of the batch's rows. */
static void check_batch(ckpt_db *d)
{
    assert_int_equal(db_exec(d, "CREATE TEMP TABLE bt (k text PRIMARY KEY, n bigint)", "create"), 0);
    const int rows = 2 * DB_BATCH_MAX + 7;
    char key[32];
    ckpt_stmt *st;
    assert_int_equal(db_begin(d), 0);
    assert_int_equal(db_batch_begin(d), 0);
    assert_int_equal(db_prepare(d, &st, "INSERT INTO bt(k, n) VALUES (?, ?)", "insert batch row"), 0);
    for (int i = 0; i < rows; i++) {
        snprintf(key, sizeof key, "k%d", i);
        db_bind_text(st, 1, key);
        db_bind_int64(st, 2, i);
        assert_int_equal(db_run(st), 0);
        db_reset(st);
    }
    assert_int_equal(db_batch_end(d), 0);
    assert_int_equal(db_commit(d), 0);
    /* a duplicate in the middle of a batch */
    assert_int_equal(db_begin(d), 0);
    assert_int_equal(db_batch_begin(d), 0);
    int rc = 0;
    const char *keys[] = {"new1", "k5", "new2"};
    for (size_t i = 0; i < 3 && !rc; i++) {
        db_bind_text(st, 1, keys[i]);
        db_bind_int64(st, 2, -1);
        rc = db_run(st);
        db_reset(st);
    }
    if (!rc) rc = db_batch_end(d);
    assert_true(rc < 0);
    assert_non_null(strstr(ckpt_error_last(), "insert batch row"));
    db_rollback(d);
    db_finalize(st);
    assert_int_equal(db_prepare(d, &st, "SELECT count(*), sum(n) FROM bt", "count"), 0);
    assert_int_equal(db_step(st), DB_ROW);
    assert_int_equal(db_col_int64(st, 0), rows);
    assert_int_equal(db_col_int64(st, 1), (int64_t)rows * (rows - 1) / 2);
    db_finalize(st);
    /* the connection works after the failed batch */
    assert_int_equal(db_exec(d, "DROP TABLE bt", "drop"), 0);
}

static void test_bytes(void **state)
{
    (void)state;
    sqlite3 *h;
    assert_int_equal(sqlite3_open(":memory:", &h), SQLITE_OK);
    ckpt_db *d;
    assert_int_equal(db_wrap_sqlite(h, "mem.db", &d), 0);
    check_bytes(d);
    check_batch(d);
    db_close(d);
    sqlite3_close(h);
    /* with CKPT_DB=postgresql://... (tests/e2e/test_pg.sh runs this program so): bytea too */
    const char *url = getenv("CKPT_DB");
    if (!db_is_pg_url(url)) return;
    assert_int_equal(db_open_pg(url, &d), 0);
    check_bytes(d);
    check_batch(d);
    db_close(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_redact),
        cmocka_unit_test(test_refused_without_password),
        cmocka_unit_test(test_sqlite_driver),
        cmocka_unit_test(test_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

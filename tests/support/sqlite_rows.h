/*
 * sqlite_rows.h — reading and changing a SQLite database directly in unit
 * tests that check a catalog below the store's functions (migrations:
 * tests/unit/store/test_store.c, tests/unit/service/test_queue.c). Include
 * it after <cmocka.h> and <sqlite3.h>.
 */
#ifndef CKPT_TESTS_SUPPORT_SQLITE_ROWS_H
#define CKPT_TESTS_SUPPORT_SQLITE_ROWS_H

#include <stdint.h>

/* The first column of the first row of sql; the test fails without one. */
static inline int64_t sqlite_int(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(db));
    if (sqlite3_step(st) != SQLITE_ROW) fail_msg("%s: no row (%s)", sql, sqlite3_errmsg(db));
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

/* Runs sql (one statement or several); the test fails when it fails. */
static inline void sqlite_ok(sqlite3 *db, const char *sql)
{
    if (sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(db));
}

#endif

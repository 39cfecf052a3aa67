/* catalog.c — opening ckpt.db, migrations, transactions (see catalog.h). */
#include "store/catalog.h"

#include "common/error.h"
#include "common/fault.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern const char *const ckpt_schema_names[];
extern const char *const ckpt_schema_sql[];
extern const size_t ckpt_schema_count;

int catalog_schema_version(void)
{
    return (int)ckpt_schema_count;
}

int catalog_error(catalog *c, const char *what)
{
    int code = c->db ? sqlite3_errcode(c->db) : SQLITE_ERROR;
    int rc = (code == SQLITE_BUSY || code == SQLITE_LOCKED) ? CKPT_EBUSY : CKPT_EIO;
    if (code == SQLITE_FULL) /* sqlite says "database or disk is full": say which and why */
        return ckpt_error_set(rc, "%s: %s: no space left on device (the catalog cannot grow)",
                              c->path ? c->path : "catalog", what);
    return ckpt_error_set(rc, "%s: %s: %s", c->path ? c->path : "catalog", what,
                          c->db ? sqlite3_errmsg(c->db) : "no database");
}

int catalog_exec(catalog *c, const char *sql)
{
    char *msg = NULL;
    if (sqlite3_exec(c->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        int rc = ckpt_error_set(CKPT_EIO, "%s: %s", c->path, msg ? msg : "SQL error");
        sqlite3_free(msg);
        return rc;
    }
    return 0;
}

int catalog_prepare(catalog *c, sqlite3_stmt **st, const char *sql)
{
    if (sqlite3_prepare_v2(c->db, sql, -1, st, NULL) != SQLITE_OK) return catalog_error(c, "prepare");
    return 0;
}

int catalog_begin(catalog *c)
{
    /* busy_timeout covers BEGIN IMMEDIATE; retry a few times beyond it so no
     * SQLITE_BUSY reaches a user under ordinary contention. */
    for (int attempt = 0; attempt < 10; attempt++) {
        int rc = sqlite3_exec(c->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
        if (rc == SQLITE_OK) return 0;
        if (rc != SQLITE_BUSY) return catalog_error(c, "begin");
        usleep(10000u * (unsigned)(attempt + 1));
    }
    return catalog_error(c, "begin (database stayed locked)");
}

int catalog_commit(catalog *c)
{
    ckpt_fault("catalog.before_commit");
    if (sqlite3_exec(c->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        int rc = catalog_error(c, "commit");
        catalog_rollback(c);
        return rc;
    }
    ckpt_fault("catalog.committed");
    return 0;
}

void catalog_rollback(catalog *c)
{
    if (c->db && !sqlite3_get_autocommit(c->db)) sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
}

static int user_version(catalog *c, int *v)
{
    sqlite3_stmt *st;
    int rc = catalog_prepare(c, &st, "PRAGMA user_version");
    if (rc) return rc;
    if (sqlite3_step(st) == SQLITE_ROW) *v = sqlite3_column_int(st, 0);
    else rc = catalog_error(c, "read schema version");
    sqlite3_finalize(st);
    return rc;
}

/* PRAGMA foreign_key_check: no row may point at a missing parent. */
static int foreign_keys_hold(catalog *c)
{
    sqlite3_stmt *st;
    int rc = catalog_prepare(c, &st, "PRAGMA foreign_key_check");
    if (rc) return rc;
    int e = sqlite3_step(st);
    if (e == SQLITE_ROW)
        rc = ckpt_error_set(CKPT_ECORRUPT, "%s: table %s has a row whose foreign key points at no row of %s",
                            c->path, (const char *)sqlite3_column_text(st, 0),
                            (const char *)sqlite3_column_text(st, 2));
    else if (e != SQLITE_DONE) rc = catalog_error(c, "check foreign keys");
    sqlite3_finalize(st);
    return rc;
}

static int migrate(catalog *c)
{
    int v = 0;
    /* The common case, a current schema, is one read and no write lock: every
     * `ckpt worker` opens the catalog while the daemon writes to it. */
    int rc = user_version(c, &v);
    if (!rc && v == catalog_schema_version()) {
        c->version = v;
        return 0;
    }
    /* A migration may rebuild a table others reference (SQLite's "other kinds
     * of table schema changes"): foreign keys off while it runs, so dropping the
     * old table cascades nowhere, and checked before the commit. The pragma is
     * a no-op inside a transaction, so it goes first. */
    if (!rc) rc = catalog_exec(c, "PRAGMA foreign_keys=OFF");
    if (!rc) rc = catalog_begin(c);
    if (!rc) rc = user_version(c, &v);
    if (!rc && v > catalog_schema_version())
        rc = ckpt_error_set(CKPT_EINVAL,
                            "%s: database schema version %d is newer than this ckpt knows (%d); "
                            "use a newer ckpt",
                            c->path, v, catalog_schema_version());
    for (int i = v; !rc && i < catalog_schema_version(); i++) {
        rc = catalog_exec(c, ckpt_schema_sql[i]);
        if (rc) ckpt_error_prefix(rc, "migration %s", ckpt_schema_names[i]);
        char sql[64];
        snprintf(sql, sizeof sql, "PRAGMA user_version = %d", i + 1);
        if (!rc) rc = catalog_exec(c, sql);
    }
    if (!rc) rc = foreign_keys_hold(c);
    if (rc) catalog_rollback(c);
    else rc = catalog_commit(c);
    int on = catalog_exec(c, "PRAGMA foreign_keys=ON");
    if (!rc) rc = on;
    if (!rc) c->version = catalog_schema_version();
    return rc;
}

int catalog_open(catalog *c, const char *path)
{
    memset(c, 0, sizeof *c);
    c->path = ckpt_strdup(path);
    if (!c->path) return CKPT_ENOMEM;
    int rc = 0;
    if (sqlite3_open_v2(path, &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, NULL) !=
        SQLITE_OK)
        rc = catalog_error(c, "open");
    if (!rc) sqlite3_busy_timeout(c->db, CATALOG_BUSY_TIMEOUT_MS);
    /* Switching a new database to WAL takes a lock the busy handler does not
     * cover: when two processes create CKPT_HOME at once, retry (bounded). */
    for (int attempt = 0; !rc; attempt++) {
        int e = sqlite3_exec(c->db, "PRAGMA journal_mode=WAL; PRAGMA foreign_keys=ON; PRAGMA synchronous=NORMAL;",
                             NULL, NULL, NULL);
        if (e == SQLITE_OK) break;
        if ((e != SQLITE_BUSY && e != SQLITE_LOCKED) || attempt >= 200) rc = catalog_error(c, "open");
        else usleep(25000);
    }
    if (!rc) rc = migrate(c);
    if (rc) catalog_close(c);
    return rc;
}

void catalog_close(catalog *c)
{
    if (c->db) sqlite3_close(c->db);
    free(c->path);
    memset(c, 0, sizeof *c);
}

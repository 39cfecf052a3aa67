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
extern const char *const ckpt_pg_schema_names[];
extern const char *const ckpt_pg_schema_sql[];
extern const size_t ckpt_pg_schema_count;

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
    return db_begin(c->lite);
}

int catalog_commit(catalog *c)
{
    return db_commit(c->lite);
}

void catalog_rollback(catalog *c)
{
    if (c->lite) db_rollback(c->lite);
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
    if (!rc) rc = db_wrap_sqlite(c->db, path, &c->lite);
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
    db_close(c->pg);
    db_close(c->lite);
    if (c->db) sqlite3_close(c->db);
    free(c->path);
    memset(c, 0, sizeof *c);
}

/* ---- the queue's database ---- */

int catalog_db_url(const char **url)
{
    const char *v = getenv("CKPT_DB");
    *url = NULL;
    if (!v || !*v || !strcmp(v, "sqlite")) return 0;
    if (db_is_pg_url(v)) {
        *url = v;
        return 0;
    }
    char *shown = db_redact_url(v);
    int rc = ckpt_error_set(CKPT_EINVAL,
                            "CKPT_DB (--db) '%s': expected a postgresql:// URL, or sqlite (the default: the "
                            "catalog's file in CKPT_HOME)",
                            shown ? shown : "?");
    free(shown);
    return rc;
}

static bool pg_known(const char *name)
{
    for (size_t i = 0; i < ckpt_pg_schema_count; i++)
        if (!strcmp(name, ckpt_pg_schema_names[i])) return true;
    return false;
}

/* How many of this binary's migrations d has not applied (all when it has
 * none); a migration d has that this binary does not know is an error: the
 * database was made by a newer ckpt. */
static int pg_missing(ckpt_db *d, size_t *missing)
{
    *missing = ckpt_pg_schema_count;
    ckpt_stmt *st;
    int rc = db_prepare(d, &st, "SELECT to_regclass('ckpt_migrations') IS NOT NULL", "read migrations");
    if (rc) return rc;
    int e = db_step(st);
    bool exists = e == DB_ROW && db_col_int64(st, 0);
    db_finalize(st);
    if (e < 0 || !exists) return e < 0 ? e : 0;
    if ((rc = db_prepare(d, &st, "SELECT name FROM ckpt_migrations", "read migrations"))) return rc;
    while (!rc && (e = db_step(st)) == DB_ROW) {
        const char *name = db_col_text(st, 0);
        if (!pg_known(name))
            rc = ckpt_error_set(CKPT_EINVAL, "%s: the database has migration %s, which this ckpt does not know; use a "
                                             "newer ckpt", db_name(d), name);
        else (*missing)--;
    }
    if (!rc && e < 0) rc = e;
    db_finalize(st);
    return rc;
}

/* Key of the advisory lock migrations take ("ckpt" in ASCII, 0x636b7074). */
#define PG_MIGRATE_LOCK "1667985524"

/* Applies the schema/pg/ files this database has not seen, by name, under a
 * transaction-scoped advisory lock: daemons starting together wait for the
 * first one and then find nothing left to do. The common case, a current
 * database, is one read and no lock (every `ckpt worker` connects). */
static int pg_migrate(ckpt_db *d)
{
    size_t missing;
    int rc = pg_missing(d, &missing);
    if (rc || !missing) return rc;
    rc = db_begin(d);
    if (!rc) rc = db_exec(d, "SELECT pg_advisory_xact_lock(" PG_MIGRATE_LOCK ")", "lock for migrations");
    if (!rc)
        rc = db_exec(d,
                     "CREATE TABLE IF NOT EXISTS ckpt_migrations (name text PRIMARY KEY, applied_at double precision NOT "
                     "NULL); CREATE TABLE IF NOT EXISTS ckpt_meta (key text PRIMARY KEY, value text NOT NULL)",
                     "create the migrations table");
    if (!rc) rc = pg_missing(d, &missing); /* again, under the lock: refuses a newer database */
    for (size_t i = 0; !rc && i < ckpt_pg_schema_count; i++) {
        ckpt_stmt *st;
        if ((rc = db_prepare(d, &st, "SELECT 1 FROM ckpt_migrations WHERE name = ?", "read migrations"))) break;
        db_bind_text(st, 1, ckpt_pg_schema_names[i]);
        int e = db_step(st);
        db_finalize(st);
        if (e < 0) rc = e;
        if (e != DB_DONE) continue;
        rc = db_exec(d, ckpt_pg_schema_sql[i], ckpt_pg_schema_names[i]);
        if (rc) ckpt_error_prefix(rc, "migration schema/pg/%s", ckpt_pg_schema_names[i]);
        if (!rc && !(rc = db_prepare(d, &st,
                                     "INSERT INTO ckpt_migrations(name, applied_at) VALUES (?, "
                                     "extract(epoch FROM clock_timestamp()))",
                                     "record a migration"))) {
            db_bind_text(st, 1, ckpt_pg_schema_names[i]);
            rc = db_run(st);
            db_finalize(st);
        }
    }
    if (rc) {
        db_rollback(d);
        return rc;
    }
    return db_commit(d);
}

/* The first store to use a queue database owns it; another is refused. */
static int pg_claim_store(catalog *c, ckpt_db *d)
{
    char host[256] = "localhost", real[4096];
    gethostname(host, sizeof host - 1);
    if (!realpath(c->path, real)) snprintf(real, sizeof real, "%s", c->path);
    char *mine = ckpt_sprintf("%s:%s", host, real);
    if (!mine) return CKPT_ENOMEM;
    ckpt_stmt *st;
    int rc = db_prepare(d, &st,
                        "INSERT INTO ckpt_meta(key, value) VALUES ('store', ?) ON CONFLICT (key) DO UPDATE SET "
                        "value = ckpt_meta.value RETURNING value",
                        "record the queue's store");
    if (!rc) {
        db_bind_text(st, 1, mine);
        int e = db_step(st);
        if (e < 0) rc = e;
        else if (e == DB_ROW && strcmp(db_col_text(st, 0), mine))
            rc = ckpt_error_set(CKPT_EINVAL,
                                "%s: this queue database serves the store at %s; this process's catalog is %s. The "
                                "checkpoints' catalog is not on PostgreSQL yet, so every daemon and client sharing a "
                                "queue database uses the same CKPT_HOME (or give each store its own database)",
                                db_name(d), db_col_text(st, 0), mine);
        db_finalize(st);
    }
    free(mine);
    return rc;
}

int catalog_jobs(catalog *c, ckpt_db **d)
{
    *d = c->pg ? c->pg : c->lite;
    const char *url;
    int rc = catalog_db_url(&url);
    if (rc || !url || c->pg) return rc;
    ckpt_db *pg;
    if ((rc = db_open_pg(url, &pg))) return rc;
    rc = pg_migrate(pg);
    if (!rc) rc = pg_claim_store(c, pg);
    if (rc) {
        db_close(pg);
        return rc;
    }
    c->pg = pg;
    *d = pg;
    return 0;
}

int catalog_jobs_prepare(catalog *c, ckpt_stmt **st, const char *sql, const char *what)
{
    ckpt_db *d;
    int rc = catalog_jobs(c, &d);
    return rc ? rc : db_prepare(d, st, sql, what);
}

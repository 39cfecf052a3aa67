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
    if (c->sql) return db_error(c->sql, what);
    return ckpt_error_set(CKPT_EIO, "%s: %s: no database", c->path ? c->path : "catalog", what);
}

int catalog_exec(catalog *c, const char *sql)
{
    return db_exec(c->sql, sql, "catalog");
}

int catalog_prepare(catalog *c, ckpt_stmt **st, const char *sql)
{
    return db_prepare(c->sql, st, sql, "catalog");
}

int catalog_step_done(catalog *c, ckpt_stmt *st, const char *what)
{
    int e = db_step(st);
    int rc = e == DB_DONE ? 0 : e < 0 ? e : catalog_error(c, what);
    db_reset(st);
    return rc;
}

bool catalog_on_pg(const catalog *c)
{
    return c->sql && db_kind(c->sql) == DB_PG;
}

int catalog_begin(catalog *c)
{
    return db_begin(c->sql);
}

int catalog_commit(catalog *c)
{
    return db_commit(c->sql);
}

void catalog_rollback(catalog *c)
{
    if (c->sql) db_rollback(c->sql);
}

static int user_version(catalog *c, int *v)
{
    ckpt_stmt *st;
    int rc = catalog_prepare(c, &st, "PRAGMA user_version");
    if (rc) return rc;
    if (db_step(st) == DB_ROW) *v = (int)db_col_int64(st, 0);
    else rc = catalog_error(c, "read schema version");
    db_finalize(st);
    return rc;
}

/* PRAGMA foreign_key_check: no row may point at a missing parent. */
static int foreign_keys_hold(catalog *c)
{
    ckpt_stmt *st;
    int rc = catalog_prepare(c, &st, "PRAGMA foreign_key_check");
    if (rc) return rc;
    int e = db_step(st);
    if (e == DB_ROW)
        rc = ckpt_error_set(CKPT_ECORRUPT, "%s: table %s has a row whose foreign key points at no row of %s",
                            c->path, db_col_text(st, 0), db_col_text(st, 2));
    else if (e != DB_DONE) rc = catalog_error(c, "check foreign keys");
    db_finalize(st);
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

static int pg_migrate(ckpt_db *d);

/* The catalog on PostgreSQL: one connection for the store's tables and the
 * queue's, migrated on open. */
static int open_pg(catalog *c, const char *url)
{
    int rc = db_open_pg(url, &c->pg);
    if (!rc) rc = pg_migrate(c->pg);
    if (!rc && !(c->path = ckpt_strdup(db_name(c->pg)))) rc = CKPT_ENOMEM;
    if (rc) {
        catalog_close(c);
        return rc;
    }
    c->sql = c->pg;
    c->version = catalog_schema_version();
    return 0;
}

int catalog_open(catalog *c, const char *path)
{
    memset(c, 0, sizeof *c);
    const char *url;
    int rc = catalog_db_url(&url);
    if (rc) return rc;
    if (url) return open_pg(c, url);
    c->path = ckpt_strdup(path);
    if (!c->path) return CKPT_ENOMEM;
    if (sqlite3_open_v2(path, &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, NULL) !=
        SQLITE_OK)
        rc = ckpt_error_set(CKPT_EIO, "%s: open: %s", path, c->db ? sqlite3_errmsg(c->db) : "out of memory");
    if (!rc) sqlite3_busy_timeout(c->db, CATALOG_BUSY_TIMEOUT_MS);
    if (!rc) rc = db_wrap_sqlite(c->db, path, &c->lite);
    c->sql = c->lite;
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

/* ---- PostgreSQL ---- */

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

int catalog_claim_blobs(catalog *c, const char *blobs)
{
    if (!catalog_on_pg(c)) return 0;
    ckpt_stmt *st;
    int rc = db_prepare(c->pg, &st,
                        "INSERT INTO ckpt_meta(key, value) VALUES ('blobs', ?) ON CONFLICT (key) DO UPDATE SET "
                        "value = ckpt_meta.value RETURNING value",
                        "record where the blobs are");
    if (!rc) {
        db_bind_text(st, 1, blobs);
        int e = db_step(st);
        if (e < 0) rc = e;
        else if (e == DB_ROW && strcmp(db_col_text(st, 0), blobs))
            rc = ckpt_error_set(CKPT_EINVAL,
                                "%s: the checkpoints of this database have their blobs in %s; this process's blobs "
                                "are %s. Every daemon and client sharing a database uses the same blobs: one bucket "
                                "(--blobs s3://BUCKET/PREFIX, the same on every host), or one CKPT_HOME on one host",
                                db_name(c->pg), db_col_text(st, 0), blobs);
        db_finalize(st);
    }
    return rc;
}

int catalog_jobs(catalog *c, ckpt_db **d)
{
    *d = c->sql;
    return c->sql ? 0 : ckpt_error_set(CKPT_EINVAL, "the catalog is not open");
}

int catalog_jobs_prepare(catalog *c, ckpt_stmt **st, const char *sql, const char *what)
{
    ckpt_db *d;
    int rc = catalog_jobs(c, &d);
    return rc ? rc : db_prepare(d, st, sql, what);
}

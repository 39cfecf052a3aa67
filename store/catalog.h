/*
 * catalog.h — the SQLite database of CKPT_HOME (ckpt.db).
 *
 * catalog_open() opens (creating) the database in WAL mode with foreign keys
 * on and a busy timeout, then applies the numbered migrations of schema/
 * (compiled into the binary) that it has not applied yet, in one transaction
 * with foreign keys off (a migration may rebuild a table others reference)
 * and checked by PRAGMA foreign_key_check before the commit, recording the
 * version in PRAGMA user_version. A database whose
 * version is newer than this binary knows is refused with a clear message.
 *
 * Writes go through catalog_begin() (BEGIN IMMEDIATE, retried while another
 * process holds the write lock) and catalog_commit()/catalog_rollback().
 *
 * The job queue and schedules (service/jobs/) reach their tables through
 * catalog_jobs(): the same SQLite database by default, or PostgreSQL when
 * CKPT_DB (ckpt --db, the config key `db`) is a postgresql:// URL. That
 * connection opens on first use and applies the PostgreSQL migrations
 * (schema/pg/) under an advisory lock, so daemons starting together migrate
 * once. The checkpoints' catalog itself stays in CKPT_HOME's SQLite file: a
 * queue database serves one store, recorded in it on first use (host and
 * catalog file), and a process with another store is refused (catalog_jobs
 * says why) instead of running jobs against the wrong catalog.
 */
#ifndef CKPT_STORE_CATALOG_H
#define CKPT_STORE_CATALOG_H

#include "common/db.h"

#include <sqlite3.h>
#include <stdbool.h>
#include <stdint.h>

#define CATALOG_BUSY_TIMEOUT_MS 30000

typedef struct {
    sqlite3 *db;
    char *path;
    int version;
    ckpt_db *lite; /* db over the sqlite3 handle above */
    ckpt_db *pg;   /* the queue's PostgreSQL connection, once opened */
} catalog;

int catalog_open(catalog *c, const char *path);
void catalog_close(catalog *c);
int catalog_begin(catalog *c);
int catalog_commit(catalog *c);
void catalog_rollback(catalog *c);
/* Prepares sql; errors name the statement. */
int catalog_prepare(catalog *c, sqlite3_stmt **st, const char *sql);
/* Reports the last SQLite error of c with context; returns CKPT_EIO (CKPT_EBUSY when busy). */
int catalog_error(catalog *c, const char *what);
/* Executes SQL without results. */
int catalog_exec(catalog *c, const char *sql);
/* The database of the job queue and schedules (see above); *d stays owned by c. */
int catalog_jobs(catalog *c, ckpt_db **d);
/* catalog_jobs, then db_prepare on that database. */
int catalog_jobs_prepare(catalog *c, ckpt_stmt **st, const char *sql, const char *what);
/* The value of CKPT_DB when it names PostgreSQL, else NULL (SQLite in
 * CKPT_HOME); anything else in CKPT_DB is refused with a message. */
int catalog_db_url(const char **url);
/* The schema version this binary knows. */
int catalog_schema_version(void);

#endif

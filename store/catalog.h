/*
 * catalog.h — the store's database: checkpoints, files, tensors, blob
 * references and leases, refs, verify records, and the job queue and
 * schedules (service/jobs/). SQLite by default (CKPT_HOME/ckpt.db), or
 * PostgreSQL when CKPT_DB (ckpt --db, the config key `db`) is a
 * postgresql:// URL; every statement goes through common/db.h.
 *
 * SQLite: catalog_open() opens (creating) the file in WAL mode with foreign
 * keys on and a busy timeout, then applies the numbered migrations of schema/
 * (compiled into the binary) that it has not applied yet, in one transaction
 * with foreign keys off (a migration may rebuild a table others reference)
 * and checked by PRAGMA foreign_key_check before the commit, recording the
 * version in PRAGMA user_version. A database whose version is newer than
 * this binary knows is refused with a clear message.
 *
 * PostgreSQL: catalog_open() connects and applies the schema/pg/ files it
 * has not seen, by name (the same numbers as schema/), under an advisory
 * lock, so daemons starting together migrate once. Daemons and clients on
 * several hosts share the database; they must share the blobs too, which
 * catalog_claim_blobs() checks (store_open calls it).
 *
 * Writes go through catalog_begin() (BEGIN IMMEDIATE on SQLite, retried while
 * another process holds the write lock; READ COMMITTED on PostgreSQL) and
 * catalog_commit()/catalog_rollback().
 */
#ifndef CKPT_STORE_CATALOG_H
#define CKPT_STORE_CATALOG_H

#include "common/db.h"

#include <sqlite3.h>
#include <stdbool.h>
#include <stdint.h>

#define CATALOG_BUSY_TIMEOUT_MS 30000

typedef struct {
    sqlite3 *db;   /* SQLite's handle; NULL on PostgreSQL */
    char *path;    /* the SQLite file, or the PostgreSQL URL without its password */
    int version;
    ckpt_db *sql;  /* the catalog's database: lite or pg */
    ckpt_db *lite; /* db.h over the sqlite3 handle above */
    ckpt_db *pg;   /* the PostgreSQL connection */
} catalog;

int catalog_open(catalog *c, const char *path);
void catalog_close(catalog *c);
int catalog_begin(catalog *c);
int catalog_commit(catalog *c);
void catalog_rollback(catalog *c);
/* True when the catalog is on PostgreSQL. */
bool catalog_on_pg(const catalog *c);
/* Prepares sql on the catalog's database. */
int catalog_prepare(catalog *c, ckpt_stmt **st, const char *sql);
/* Steps st to its end and resets it (bindings cleared); 0, or the error
 * (named with what). */
int catalog_step_done(catalog *c, ckpt_stmt *st, const char *what);
/* Reports the last error of the catalog's database with context; returns
 * CKPT_EIO (CKPT_EBUSY when busy). */
int catalog_error(catalog *c, const char *what);
/* Executes SQL without results. */
int catalog_exec(catalog *c, const char *sql);
/* PostgreSQL: records blobs (where this process keeps blob bytes: a bucket
 * URL, or host:folder) as the database's on first use, and refuses a process
 * whose blobs are elsewhere (its checkpoints would name bytes other hosts
 * cannot read). Nothing on SQLite. */
int catalog_claim_blobs(catalog *c, const char *blobs);
/* The database of the job queue and schedules: the catalog's; *d stays owned by c. */
int catalog_jobs(catalog *c, ckpt_db **d);
/* catalog_jobs, then db_prepare on that database. */
int catalog_jobs_prepare(catalog *c, ckpt_stmt **st, const char *sql, const char *what);
/* The value of CKPT_DB when it names PostgreSQL, else NULL (SQLite in
 * CKPT_HOME); anything else in CKPT_DB is refused with a message. */
int catalog_db_url(const char **url);
/* The schema version this binary knows. */
int catalog_schema_version(void);

#endif

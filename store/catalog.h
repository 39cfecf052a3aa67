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
 */
#ifndef CKPT_STORE_CATALOG_H
#define CKPT_STORE_CATALOG_H

#include <sqlite3.h>
#include <stdbool.h>
#include <stdint.h>

#define CATALOG_BUSY_TIMEOUT_MS 30000

typedef struct {
    sqlite3 *db;
    char *path;
    int version;
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
/* The schema version this binary knows. */
int catalog_schema_version(void);

#endif

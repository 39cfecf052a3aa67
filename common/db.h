/*
 * db.h — one small interface over the two SQL engines ckpt speaks: SQLite
 * (the embedded default, a file in CKPT_HOME) and PostgreSQL (through libpq,
 * loaded on first use like the other big libraries, lazylib.h).
 *
 * Statements are written once, in the SQL both engines accept, with `?` or
 * `?N` parameters; the PostgreSQL driver rewrites them to `$N` (outside string
 * literals) and sends every value as text with its type (int8, float8, text;
 * a NULL lets the server infer it). Inserted ids come from `RETURNING id`,
 * which both engines have. What differs is said by the caller with
 * db_kind(): `FOR UPDATE SKIP LOCKED` and LISTEN/NOTIFY exist only on
 * PostgreSQL.
 *
 * Transactions: db_begin() is `BEGIN IMMEDIATE` on SQLite (the write lock at
 * once, retried while another process holds it, so a transaction never fails
 * half-way on SQLITE_BUSY) and `BEGIN ISOLATION LEVEL READ COMMITTED` on
 * PostgreSQL, where whoever changes shared rows locks them (`FOR UPDATE`) or
 * changes them only while they still hold what was read (a compare-and-set
 * `WHERE`). db_commit() passes the crash points catalog.before_commit and
 * catalog.committed (common/fault.h) on both engines.
 *
 * Errors name the database (a PostgreSQL URL without its password), what the
 * statement was for, and the engine's message.
 */
#ifndef CKPT_COMMON_DB_H
#define CKPT_COMMON_DB_H

#include <sqlite3.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { DB_SQLITE = 1, DB_PG = 2 } db_kind_t;
typedef struct ckpt_db ckpt_db;
typedef struct ckpt_stmt ckpt_stmt;

#define DB_ROW 1
#define DB_DONE 0

/* True for postgresql:// and postgres:// URLs. */
bool db_is_pg_url(const char *url);
/* A copy of url without the password ("postgresql://u@host/db"); malloc'd. */
char *db_redact_url(const char *url);
/* Connects to PostgreSQL at url (libpq's URL form). */
int db_open_pg(const char *url, ckpt_db **out);
/* Wraps an open SQLite handle (not owned: db_close leaves it open). name is
 * what errors call it (the file's path). */
int db_wrap_sqlite(sqlite3 *h, const char *name, ckpt_db **out);
void db_close(ckpt_db *d);
/* False while a PostgreSQL connection is lost (the server went away; the
 * next statement outside a transaction connects again, at most once a
 * second); always true on SQLite. */
bool db_connected(const ckpt_db *d);
db_kind_t db_kind(const ckpt_db *d);
const char *db_name(const ckpt_db *d);

/* what: the statement's purpose, for errors ("claim jobs"). */
int db_prepare(ckpt_db *d, ckpt_stmt **st, const char *sql, const char *what);
void db_bind_int64(ckpt_stmt *st, int i, int64_t v);
void db_bind_double(ckpt_stmt *st, int i, double v);
void db_bind_text(ckpt_stmt *st, int i, const char *v); /* copied; NULL binds NULL */
/* Bytes (a BLOB on SQLite, bytea on PostgreSQL); copied; NULL binds NULL. */
void db_bind_blob(ckpt_stmt *st, int i, const void *v, size_t n);
/* DB_ROW, DB_DONE, or a negative ckpt code with the error set. */
int db_step(ckpt_stmt *st);
/* Steps to the end; 0 or a negative code. */
int db_run(ckpt_stmt *st);
/* Ready to run again with new bindings. */
void db_reset(ckpt_stmt *st);
void db_finalize(ckpt_stmt *st);
bool db_col_null(ckpt_stmt *st, int i);
int64_t db_col_int64(ckpt_stmt *st, int i);
double db_col_double(ckpt_stmt *st, int i);
const char *db_col_text(ckpt_stmt *st, int i); /* NULL for NULL; valid until the next step */
/* A bytes column: *n bytes (NULL for NULL or empty), valid until the next step. */
const void *db_col_blob(ckpt_stmt *st, int i, size_t *n);
/* The database st was prepared on. */
ckpt_db *db_stmt_db(ckpt_stmt *st);
/* Rows the last finished INSERT/UPDATE/DELETE of st changed. */
int64_t db_changes(ckpt_stmt *st);
/* True when the last error of d was a unique constraint. */
bool db_last_unique(const ckpt_db *d);

/* A batch of writes inside a transaction: on PostgreSQL (libpq's pipeline
 * mode) the statements run between db_batch_begin and db_batch_end are sent
 * without waiting for their answers, which are read DB_BATCH_MAX at a time and
 * at the end; there db_step gives DB_DONE at once (db_changes 0) and an error
 * of a statement comes out of the next db_step past a sync or of
 * db_batch_end, naming that statement. Only statements that return no rows
 * (INSERT, UPDATE without RETURNING) belong in a batch. On SQLite nothing
 * changes (every statement is a function call there, not a round trip). */
#define DB_BATCH_MAX 256
int db_batch_begin(ckpt_db *d);
/* Waits for the answers still due and leaves the batch: 0 or the first error. */
int db_batch_end(ckpt_db *d);

int db_exec(ckpt_db *d, const char *sql, const char *what);
/* SQLite: BEGIN IMMEDIATE is tried this many times, each waiting up to the
 * connection's busy timeout for the write lock, with a short pause between. */
#define DB_BEGIN_ATTEMPTS 10
int db_begin(ckpt_db *d);
int db_commit(ckpt_db *d);
void db_rollback(ckpt_db *d);
/* Sets and returns a ckpt error naming d and what, with the engine's message. */
int db_error(ckpt_db *d, const char *what);

/* PostgreSQL wake-ups: db_listen(d, channel) subscribes; db_wake_fd() is the
 * connection's socket for poll() (-1 on SQLite); db_wake_drain() reads what
 * arrived and returns how many notifications. db_notify() sends one, delivered
 * when the current transaction commits (nothing on SQLite). */
int db_listen(ckpt_db *d, const char *channel);
int db_wake_fd(ckpt_db *d);
int db_wake_drain(ckpt_db *d);
int db_notify(ckpt_db *d, const char *channel);

#endif

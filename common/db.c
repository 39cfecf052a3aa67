/* db.c — the SQLite and PostgreSQL drivers behind db.h. */
#include "common/db.h"

#include "common/error.h"
#include "common/fault.h"
#include "common/util.h"

#include <ctype.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* PostgreSQL type oids of the values we send (pg_type.h). */
#define OID_BYTEA 17
#define OID_INT8 20
#define OID_TEXT 25
#define OID_FLOAT8 701

#define DB_MAX_PARAMS 32

struct ckpt_db {
    db_kind_t kind;
    char *name; /* a path, or the URL without its password */
    sqlite3 *lite;
    PGconn *pg;
    bool in_tx, last_unique;
    char listen[64]; /* the channel LISTENed on, again after a reconnect */
    double last_reset; /* when a reconnect was last tried (monotonic seconds) */
    /* a batch (pipeline mode): the purposes of the statements whose answers are due */
    bool batch;
    int batch_rc; /* the first error a sync read, returned by the next step or the end */
    const char *batch_what[DB_BATCH_MAX];
    int nbatch;
};

struct ckpt_stmt {
    ckpt_db *db;
    const char *what;
    sqlite3_stmt *lite;
    /* PostgreSQL: the rewritten SQL, text values and their types, the result. */
    char *sql;
    int nparams;
    char *vals[DB_MAX_PARAMS];
    unsigned types[DB_MAX_PARAMS];
    PGresult *res;
    unsigned char *bytes; /* the last bytea column decoded (db_col_blob) */
    int row, nrows;
    bool ran;
    int64_t changes;
};

bool db_is_pg_url(const char *url)
{
    return url && (!strncmp(url, "postgresql://", 13) || !strncmp(url, "postgres://", 11));
}

/* url with the value of every password=... query parameter replaced by "***". */
static char *redact_query(char *url)
{
    char *q = url ? strchr(url, '?') : NULL;
    if (!q) return url;
    for (char *p = q + 1; p && *p;) {
        if (!strncmp(p, "password=", 9)) {
            char *end = p + 9 + strcspn(p + 9, "&");
            char *r = ckpt_sprintf("%.*s***%s", (int)(p + 9 - url), url, end);
            free(url);
            return r;
        }
        p = strchr(p, '&');
        if (p) p++;
    }
    return url;
}

char *db_redact_url(const char *url)
{
    const char *auth = strstr(url, "://");
    if (!auth) return ckpt_strdup(url);
    auth += 3;
    size_t hostpart = strcspn(auth, "/?");
    const char *at = memchr(auth, '@', hostpart);
    const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
    /* scheme://user + @rest: the password between ':' and '@' is dropped */
    return redact_query(colon ? ckpt_sprintf("%.*s%s", (int)(colon - url), url, at) : ckpt_strdup(url));
}

db_kind_t db_kind(const ckpt_db *d)
{
    return d->kind;
}

const char *db_name(const ckpt_db *d)
{
    return d->name;
}

bool db_last_unique(const ckpt_db *d)
{
    return d->last_unique;
}

/* ---- errors ---- */

static int pg_code(const char *state)
{
    if (!state) return CKPT_EIO;
    if (!strcmp(state, "40001") || !strcmp(state, "40P01") || !strcmp(state, "55P03")) return CKPT_EBUSY;
    if (!strcmp(state, "23505")) return CKPT_EEXIST;
    return CKPT_EIO;
}

static int pg_result_error(ckpt_db *d, PGresult *res, const char *what)
{
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *msg = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    if (!msg || !*msg) msg = PQerrorMessage(d->pg);
    d->last_unique = state && !strcmp(state, "23505");
    char clean[512];
    snprintf(clean, sizeof clean, "%s", msg && *msg ? msg : "no answer from the server");
    clean[strcspn(clean, "\n")] = 0; /* libpq's hints on further lines are for a terminal */
    size_t n = strlen(clean);
    while (n && (clean[n - 1] == '\n' || clean[n - 1] == ' ')) clean[--n] = 0;
    return ckpt_error_set(pg_code(state), "%s: %s: %s", d->name, what, clean);
}

int db_error(ckpt_db *d, const char *what)
{
    if (d->kind == DB_PG) return pg_result_error(d, NULL, what);
    int code = sqlite3_errcode(d->lite);
    d->last_unique = sqlite3_extended_errcode(d->lite) == SQLITE_CONSTRAINT_UNIQUE;
    int rc = (code == SQLITE_BUSY || code == SQLITE_LOCKED) ? CKPT_EBUSY : CKPT_EIO;
    if (code == SQLITE_FULL) /* sqlite says "database or disk is full": say which and why */
        return ckpt_error_set(rc, "%s: %s: no space left on device (the catalog cannot grow)", d->name, what);
    return ckpt_error_set(rc, "%s: %s: %s", d->name, what, sqlite3_errmsg(d->lite));
}

/* ---- opening ---- */

static void pg_quiet(void *arg, const char *msg)
{
    (void)arg;
    (void)msg; /* NOTICEs ("relation exists, skipping") are not the user's business */
}

/* What every session of ours sets, on connecting and again after a reconnect.
 * idle_in_transaction_session_timeout: a process of ours stopped, frozen or
 * cut off inside a transaction holds its row locks until the server ends its
 * session, and every other daemon's reap of that job waits on them; the
 * server ends such a session after CKPT_PG_IDLE_TX_TIMEOUT_S (default 60 s,
 * far beyond the time between two statements of any transaction of ours).
 * gc's transaction turns it off for itself (store_maint.c: its lock must
 * last until its deletes are done). */
static int pg_session(ckpt_db *d, const char *what)
{
    int ms;
    int rc = ckpt_env_ms("CKPT_PG_IDLE_TX_TIMEOUT_S", 60, 0.1, 86400, &ms);
    if (rc) return rc;
    PQsetNoticeProcessor(d->pg, pg_quiet, NULL);
    char sql[128];
    snprintf(sql, sizeof sql, "SET client_min_messages = warning; SET idle_in_transaction_session_timeout = %d", ms);
    return db_exec(d, sql, what);
}

int db_open_pg(const char *url, ckpt_db **out)
{
    *out = NULL;
    ckpt_db *d = ckpt_calloc(1, sizeof *d);
    if (!d || !(d->name = db_redact_url(url))) {
        free(d);
        return CKPT_ENOMEM;
    }
    d->kind = DB_PG;
    d->pg = PQconnectdb(url);
    if (!d->pg || PQstatus(d->pg) != CONNECTION_OK) {
        int rc = pg_result_error(d, NULL, "connect");
        db_close(d);
        return rc;
    }
    int rc = pg_session(d, "connect");
    if (rc) {
        db_close(d);
        return rc;
    }
    *out = d;
    return 0;
}

int db_wrap_sqlite(sqlite3 *h, const char *name, ckpt_db **out)
{
    ckpt_db *d = ckpt_calloc(1, sizeof *d);
    if (!d || !(d->name = ckpt_strdup(name))) {
        free(d);
        return CKPT_ENOMEM;
    }
    d->kind = DB_SQLITE;
    d->lite = h;
    *out = d;
    return 0;
}

void db_close(ckpt_db *d)
{
    if (!d) return;
    if (d->pg) PQfinish(d->pg);
    free(d->name);
    free(d);
}

bool db_connected(const ckpt_db *d)
{
    return d->kind != DB_PG || PQstatus(d->pg) == CONNECTION_OK;
}

/* A connection the server dropped (a restart, a failover) is made again
 * between transactions; inside one the transaction is lost and fails. */
static int pg_ready(ckpt_db *d, const char *what)
{
    if (PQstatus(d->pg) == CONNECTION_OK) return 0;
    if (d->in_tx) return pg_result_error(d, NULL, what);
    /* at most one attempt a second: a daemon asks every tick while the server is down */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double now = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
    if (d->last_reset && now - d->last_reset < 1.0)
        return ckpt_error_set(CKPT_EIO, "%s: %s: the server is unreachable (retrying)", d->name, what);
    d->last_reset = now;
    PQreset(d->pg);
    if (PQstatus(d->pg) != CONNECTION_OK) return pg_result_error(d, NULL, what);
    int rc = pg_session(d, what);
    if (rc) return rc;
    if (d->listen[0]) {
        char sql[96];
        snprintf(sql, sizeof sql, "LISTEN %s", d->listen);
        PQclear(PQexec(d->pg, sql));
    }
    return 0;
}

/* ---- statements ---- */

/* ?N -> $N and ? -> $k outside string literals; *nparams gets the highest. */
static char *pg_sql(const char *sql, int *nparams)
{
    size_t n = strlen(sql);
    char *out = malloc(n * 3 + 1);
    if (!out) return NULL;
    char *o = out;
    int next = 0, max = 0;
    bool quoted = false;
    for (const char *p = sql; *p; p++) {
        if (*p == '\'') quoted = !quoted;
        if (quoted || *p != '?') {
            *o++ = *p;
            continue;
        }
        int k;
        if (isdigit((unsigned char)p[1])) {
            char *end;
            k = (int)strtol(p + 1, &end, 10);
            p = end - 1;
        } else {
            k = ++next;
        }
        if (k > max) max = k;
        o += sprintf(o, "$%d", k);
    }
    *o = 0;
    *nparams = max;
    return out;
}

int db_prepare(ckpt_db *d, ckpt_stmt **out, const char *sql, const char *what)
{
    *out = NULL;
    ckpt_stmt *st = ckpt_calloc(1, sizeof *st);
    if (!st) return CKPT_ENOMEM;
    st->db = d;
    st->what = what;
    if (d->kind == DB_SQLITE) {
        if (sqlite3_prepare_v2(d->lite, sql, -1, &st->lite, NULL) != SQLITE_OK) {
            int rc = db_error(d, what);
            free(st);
            return rc;
        }
    } else if (!(st->sql = pg_sql(sql, &st->nparams)) || st->nparams > DB_MAX_PARAMS) {
        int rc = st->sql ? ckpt_error_set(CKPT_EINVAL, "%s: %s: too many parameters", d->name, what) : CKPT_ENOMEM;
        db_finalize(st);
        return rc;
    }
    *out = st;
    return 0;
}

static void pg_set(ckpt_stmt *st, int i, char *v, unsigned type)
{
    if (i < 1 || i > DB_MAX_PARAMS) {
        free(v);
        return;
    }
    free(st->vals[i - 1]);
    st->vals[i - 1] = v;
    st->types[i - 1] = v ? type : 0;
}

void db_bind_int64(ckpt_stmt *st, int i, int64_t v)
{
    if (st->lite) sqlite3_bind_int64(st->lite, i, v);
    else pg_set(st, i, ckpt_sprintf("%lld", (long long)v), OID_INT8);
}

void db_bind_double(ckpt_stmt *st, int i, double v)
{
    if (st->lite) sqlite3_bind_double(st->lite, i, v);
    else pg_set(st, i, ckpt_sprintf("%.17g", v), OID_FLOAT8); /* exact: a compare-and-set reads it back */
}

void db_bind_text(ckpt_stmt *st, int i, const char *v)
{
    if (st->lite) {
        if (v) sqlite3_bind_text(st->lite, i, v, -1, SQLITE_TRANSIENT);
        else sqlite3_bind_null(st->lite, i);
    } else {
        pg_set(st, i, v ? ckpt_strdup(v) : NULL, OID_TEXT);
    }
}

void db_bind_blob(ckpt_stmt *st, int i, const void *v, size_t n)
{
    if (st->lite) {
        if (v) sqlite3_bind_blob64(st->lite, i, v, n, SQLITE_TRANSIENT);
        else sqlite3_bind_null(st->lite, i);
        return;
    }
    if (!v) {
        pg_set(st, i, NULL, OID_BYTEA);
        return;
    }
    /* bytea's hex input form: \x then two digits a byte */
    char *hex = n <= (SIZE_MAX - 3) / 2 ? malloc(2 * n + 3) : NULL;
    if (hex) {
        static const char digits[] = "0123456789abcdef";
        const unsigned char *b = v;
        hex[0] = '\\';
        hex[1] = 'x';
        for (size_t k = 0; k < n; k++) {
            hex[2 + 2 * k] = digits[b[k] >> 4];
            hex[3 + 2 * k] = digits[b[k] & 15];
        }
        hex[2 * n + 2] = 0;
    }
    pg_set(st, i, hex, OID_BYTEA); /* out of memory binds NULL: the NOT NULL or the reader says */
}

static void stmt_drop_bytes(ckpt_stmt *st)
{
    if (st->bytes) PQfreemem(st->bytes);
    st->bytes = NULL;
}

/* The first error of a batch (naming the statement) is kept in batch_rc;
 * quiet: a rollback's, where the caller's error is already set. */
static void batch_fail(ckpt_db *d, bool quiet, PGresult *r, const char *what)
{
    if (d->batch_rc) return;
    d->batch_rc = quiet ? CKPT_EIO : pg_result_error(d, r, what);
}

/* Reads the answers of the batch's statements sent so far, up to their sync point. */
static int batch_sync(ckpt_db *d, bool quiet)
{
    if (!d->nbatch) return d->batch_rc;
    int i = 0, nulls = 0;
    if (!PQpipelineSync(d->pg)) {
        d->nbatch = 0;
        batch_fail(d, quiet, NULL, "send a batch");
        return d->batch_rc;
    }
    for (;;) {
        PGresult *r = PQgetResult(d->pg);
        if (!r) { /* between two statements' answers; a lost connection gives only these */
            if (++nulls > 2) {
                batch_fail(d, quiet, NULL, i < d->nbatch ? d->batch_what[i] : "batch");
                break;
            }
            continue;
        }
        nulls = 0;
        ExecStatusType s = PQresultStatus(r);
        if (s == PGRES_PIPELINE_SYNC) {
            PQclear(r);
            break;
        }
        if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK && s != PGRES_PIPELINE_ABORTED)
            batch_fail(d, quiet, r, i < d->nbatch ? d->batch_what[i] : "batch");
        PQclear(r);
        i++;
    }
    d->nbatch = 0;
    return d->batch_rc;
}

int db_batch_begin(ckpt_db *d)
{
    if (d->kind != DB_PG) return 0;
    if (!d->in_tx || d->batch) return ckpt_error_set(CKPT_EINVAL, "%s: a batch outside a transaction", d->name);
    if (!PQenterPipelineMode(d->pg)) return pg_result_error(d, NULL, "start a batch");
    d->batch = true;
    d->batch_rc = 0;
    d->nbatch = 0;
    return 0;
}

static int batch_end(ckpt_db *d, bool quiet)
{
    if (d->kind != DB_PG || !d->batch) return 0;
    int rc = batch_sync(d, quiet);
    if (!PQexitPipelineMode(d->pg) && !rc) rc = quiet ? CKPT_EIO : pg_result_error(d, NULL, "end a batch");
    d->batch = false;
    return rc;
}

int db_batch_end(ckpt_db *d)
{
    return batch_end(d, false);
}

/* A statement of a batch: sent, its answer read at the next sync. */
static int pg_send(ckpt_stmt *st, const Oid *types)
{
    ckpt_db *d = st->db;
    if (d->nbatch == DB_BATCH_MAX && batch_sync(d, false)) return d->batch_rc;
    if (d->batch_rc) return d->batch_rc;
    if (!PQsendQueryParams(d->pg, st->sql, st->nparams, types, (const char *const *)st->vals, NULL, NULL, 0)) {
        batch_fail(d, false, NULL, st->what);
        return d->batch_rc;
    }
    d->batch_what[d->nbatch++] = st->what;
    st->ran = true;
    st->row = -1;
    st->nrows = 0;
    st->changes = 0;
    return 0;
}

static int pg_run(ckpt_stmt *st)
{
    ckpt_db *d = st->db;
    int rc = pg_ready(d, st->what);
    if (rc) return rc;
    Oid types[DB_MAX_PARAMS];
    for (int i = 0; i < st->nparams; i++) types[i] = st->types[i];
    if (d->batch) return pg_send(st, types);
    st->res = PQexecParams(d->pg, st->sql, st->nparams, types, (const char *const *)st->vals, NULL, NULL, 0);
    ExecStatusType s = st->res ? PQresultStatus(st->res) : PGRES_FATAL_ERROR;
    if (s != PGRES_TUPLES_OK && s != PGRES_COMMAND_OK) return pg_result_error(d, st->res, st->what);
    d->last_unique = false;
    st->ran = true;
    st->row = -1;
    st->nrows = PQntuples(st->res);
    const char *t = PQcmdTuples(st->res);
    st->changes = t && *t ? strtoll(t, NULL, 10) : 0;
    return 0;
}

int db_step(ckpt_stmt *st)
{
    if (st->lite) {
        int e = sqlite3_step(st->lite);
        if (e == SQLITE_ROW) return DB_ROW;
        if (e == SQLITE_DONE) {
            st->changes = sqlite3_changes(st->db->lite);
            st->db->last_unique = false;
            return DB_DONE;
        }
        int rc = db_error(st->db, st->what);
        sqlite3_reset(st->lite); /* a failed statement may be reset and run again */
        return rc;
    }
    if (!st->ran) {
        int rc = pg_run(st);
        if (rc) return rc;
    }
    stmt_drop_bytes(st);
    return ++st->row < st->nrows ? DB_ROW : DB_DONE;
}

int db_run(ckpt_stmt *st)
{
    int e;
    while ((e = db_step(st)) == DB_ROW) {}
    return e;
}

void db_reset(ckpt_stmt *st)
{
    if (st->lite) {
        sqlite3_reset(st->lite);
        sqlite3_clear_bindings(st->lite);
        return;
    }
    stmt_drop_bytes(st);
    if (st->res) PQclear(st->res);
    st->res = NULL;
    st->ran = false;
    for (int i = 0; i < DB_MAX_PARAMS; i++) pg_set(st, i + 1, NULL, 0);
}

void db_finalize(ckpt_stmt *st)
{
    if (!st) return;
    if (st->lite) sqlite3_finalize(st->lite);
    else db_reset(st);
    free(st->sql);
    free(st);
}

bool db_col_null(ckpt_stmt *st, int i)
{
    if (st->lite) return sqlite3_column_type(st->lite, i) == SQLITE_NULL;
    return st->row < 0 || st->row >= st->nrows || PQgetisnull(st->res, st->row, i);
}

int64_t db_col_int64(ckpt_stmt *st, int i)
{
    if (st->lite) return sqlite3_column_int64(st->lite, i);
    if (db_col_null(st, i)) return 0;
    const char *v = PQgetvalue(st->res, st->row, i);
    if (!strcmp(v, "t")) return 1; /* a boolean column */
    return strtoll(v, NULL, 10);
}

double db_col_double(ckpt_stmt *st, int i)
{
    if (st->lite) return sqlite3_column_double(st->lite, i);
    return db_col_null(st, i) ? 0 : strtod(PQgetvalue(st->res, st->row, i), NULL);
}

const char *db_col_text(ckpt_stmt *st, int i)
{
    if (st->lite) return (const char *)sqlite3_column_text(st->lite, i);
    return db_col_null(st, i) ? NULL : PQgetvalue(st->res, st->row, i);
}

const void *db_col_blob(ckpt_stmt *st, int i, size_t *n)
{
    *n = 0;
    if (st->lite) {
        int len = sqlite3_column_bytes(st->lite, i);
        const void *p = sqlite3_column_blob(st->lite, i);
        if (!p || len <= 0) return NULL;
        *n = (size_t)len;
        return p;
    }
    if (db_col_null(st, i)) return NULL;
    stmt_drop_bytes(st);
    size_t len = 0;
    st->bytes = PQunescapeBytea((const unsigned char *)PQgetvalue(st->res, st->row, i), &len);
    if (!st->bytes || !len) return NULL;
    *n = len;
    return st->bytes;
}

ckpt_db *db_stmt_db(ckpt_stmt *st)
{
    return st->db;
}

int64_t db_changes(ckpt_stmt *st)
{
    return st->changes;
}

/* ---- whole statements and transactions ---- */

int db_exec(ckpt_db *d, const char *sql, const char *what)
{
    if (d->kind == DB_SQLITE) {
        char *msg = NULL;
        if (sqlite3_exec(d->lite, sql, NULL, NULL, &msg) != SQLITE_OK) {
            int rc = ckpt_error_set(CKPT_EIO, "%s: %s: %s", d->name, what, msg ? msg : "SQL error");
            sqlite3_free(msg);
            return rc;
        }
        return 0;
    }
    if (d->batch) return ckpt_error_set(CKPT_EINVAL, "%s: %s: inside a batch", d->name, what);
    int rc = pg_ready(d, what);
    if (rc) return rc;
    PGresult *res = PQexec(d->pg, sql);
    ExecStatusType s = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) rc = pg_result_error(d, res, what);
    PQclear(res);
    return rc;
}

int db_begin(ckpt_db *d)
{
    if (d->kind == DB_PG) {
        int rc = db_exec(d, "BEGIN ISOLATION LEVEL READ COMMITTED", "begin");
        d->in_tx = !rc;
        return rc;
    }
    /* The busy timeout covers BEGIN IMMEDIATE; retry a few times beyond it so
     * no SQLITE_BUSY reaches a user under ordinary contention. */
    for (int attempt = 0; attempt < DB_BEGIN_ATTEMPTS; attempt++) {
        int rc = sqlite3_exec(d->lite, "BEGIN IMMEDIATE", NULL, NULL, NULL);
        if (rc == SQLITE_OK) return 0;
        if (rc != SQLITE_BUSY) return db_error(d, "begin");
        usleep(10000u * (unsigned)(attempt + 1));
    }
    return db_error(d, "begin (database stayed locked)");
}

int db_commit(ckpt_db *d)
{
    ckpt_fault("catalog.before_commit");
    int rc = db_exec(d, "COMMIT", "commit");
    if (rc) {
        db_rollback(d);
        return rc;
    }
    d->in_tx = false;
    ckpt_fault("catalog.committed");
    return 0;
}

void db_rollback(ckpt_db *d)
{
    if (d->kind == DB_SQLITE) {
        if (d->lite && !sqlite3_get_autocommit(d->lite)) sqlite3_exec(d->lite, "ROLLBACK", NULL, NULL, NULL);
        return;
    }
    batch_end(d, true); /* the caller's error is already set */
    if (d->in_tx && PQstatus(d->pg) == CONNECTION_OK) PQclear(PQexec(d->pg, "ROLLBACK"));
    d->in_tx = false;
}

/* ---- wake-ups ---- */

static bool channel_ok(const char *ch)
{
    size_t n = strlen(ch);
    return n && n < 64 && strspn(ch, "abcdefghijklmnopqrstuvwxyz_") == n;
}

int db_listen(ckpt_db *d, const char *channel)
{
    if (d->kind != DB_PG) return 0;
    if (!channel_ok(channel)) return ckpt_error_set(CKPT_EINVAL, "bad channel name '%s'", channel);
    if (!strcmp(d->listen, channel)) return 0;
    char sql[96];
    snprintf(sql, sizeof sql, "LISTEN %s", channel);
    int rc = db_exec(d, sql, "listen for wake-ups");
    if (!rc) snprintf(d->listen, sizeof d->listen, "%s", channel);
    return rc;
}

int db_notify(ckpt_db *d, const char *channel)
{
    if (d->kind != DB_PG) return 0;
    if (!channel_ok(channel)) return ckpt_error_set(CKPT_EINVAL, "bad channel name '%s'", channel);
    char sql[96];
    snprintf(sql, sizeof sql, "NOTIFY %s", channel);
    return db_exec(d, sql, "send a wake-up");
}

int db_wake_fd(ckpt_db *d)
{
    if (!d || d->kind != DB_PG) return -1;
    if (pg_ready(d, "listen for wake-ups")) return -1; /* down: the caller polls on its timer meanwhile */
    return PQsocket(d->pg);
}

int db_wake_drain(ckpt_db *d)
{
    if (!d || d->kind != DB_PG) return 0;
    int n = 0;
    if (!PQconsumeInput(d->pg)) return 0; /* a lost connection: the next statement reconnects */
    PGnotify *nt;
    while ((nt = PQnotifies(d->pg))) {
        n++;
        PQfreemem(nt);
    }
    return n;
}

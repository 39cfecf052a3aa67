/* queue.c — the SQLite job queue (see queue.h). */
#include "service/jobs/queue.h"
#include "service/jobs/queue_rows.h"

#include "common/error.h"
#include "common/json.h"
#include "common/sha256.h"
#include "common/util.h"
#include "store/store.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

bool queue_kind_valid(const char *kind)
{
    size_t n = strlen(kind);
    return n >= 1 && n <= QUEUE_KIND_MAX && strspn(kind, "abcdefghijklmnopqrstuvwxyz-") == n;
}

double queue_now(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

static double backoff(int attempt)
{
    double b = QUEUE_BACKOFF_BASE * pow(2.0, attempt > 1 ? attempt - 1 : 0);
    if (b > QUEUE_BACKOFF_CAP) b = QUEUE_BACKOFF_CAP;
    return b * (0.5 + 0.5 * ((double)rand() / RAND_MAX)); /* jitter: spread retries of many jobs */
}

char *queue_owner_self(void)
{
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    return ckpt_sprintf("%s:%d:%lld", host, (int)getpid(), (long long)store_proc_start_time((int)getpid()));
}

bool queue_owner_alive(const char *owner)
{
    char host[256];
    int pid;
    long long start;
    const char *c1 = owner ? strchr(owner, ':') : NULL;
    if (!c1 || sscanf(c1 + 1, "%d:%lld", &pid, &start) != 2) return false;
    gethostname(host, sizeof host - 1);
    if ((size_t)(c1 - owner) != strlen(host) || strncmp(owner, host, strlen(host))) return true; /* another host: trust its lease */
    return store_proc_start_time(pid) == start;
}

static int step_done(catalog *c, sqlite3_stmt *st, const char *what)
{
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : catalog_error(c, what);
    sqlite3_finalize(st);
    return rc;
}

int queue_in_tx(catalog *c, int (*fn)(catalog *, void *), void *ctx)
{
    int rc = catalog_begin(c);
    if (rc) return rc;
    rc = fn(c, ctx);
    if (rc) {
        catalog_rollback(c);
        return rc;
    }
    return catalog_commit(c);
}

/* ---- submit ---- */

typedef struct {
    const char *kind;
    const char *args;
    const char *key;
    const queue_submit_opts *o;
    int64_t *id;
    bool *existed;
} submit_ctx;

static int submit_tx(catalog *c, void *vctx)
{
    submit_ctx *s = vctx;
    sqlite3_stmt *st;
    int rc = catalog_prepare(c, &st, "SELECT id FROM jobs WHERE unique_key = ? AND state IN ('queued', 'running')");
    if (rc) return rc;
    sqlite3_bind_text(st, 1, s->key, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) {
        *s->id = sqlite3_column_int64(st, 0);
        *s->existed = true;
        sqlite3_finalize(st);
        return 0;
    }
    sqlite3_finalize(st);
    if (s->o->depends_on) {
        rc = catalog_prepare(c, &st, "SELECT 1 FROM jobs WHERE id = ?");
        if (rc) return rc;
        sqlite3_bind_int64(st, 1, s->o->depends_on);
        bool found = sqlite3_step(st) == SQLITE_ROW;
        sqlite3_finalize(st);
        if (!found) return ckpt_error_set(CKPT_ENOTFOUND, "dependency job %lld does not exist", (long long)s->o->depends_on);
    }
    rc = catalog_prepare(c, &st,
                         "INSERT INTO jobs(kind, args, priority, max_attempts, run_after, created_at, depends_on, unique_key) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
    if (rc) return rc;
    double now = queue_now();
    sqlite3_bind_text(st, 1, s->kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, s->args, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, s->o->priority);
    sqlite3_bind_int(st, 4, s->o->max_attempts > 0 ? s->o->max_attempts : 3);
    sqlite3_bind_double(st, 5, now);
    sqlite3_bind_double(st, 6, now);
    if (s->o->depends_on) sqlite3_bind_int64(st, 7, s->o->depends_on);
    sqlite3_bind_text(st, 8, s->key, -1, SQLITE_STATIC);
    rc = step_done(c, st, "insert job");
    if (!rc) *s->id = sqlite3_last_insert_rowid(c->db);
    return rc;
}

int queue_submit(catalog *c, const char *kind, const json_t *args, const queue_submit_opts *o, int64_t *id,
                 bool *existed)
{
    *existed = false;
    if (!queue_kind_valid(kind)) return ckpt_error_set(CKPT_EINVAL, "'%s' is not a job kind's name", kind);
    if (!json_is_object(args)) return ckpt_error_set(CKPT_EINVAL, "job arguments must be a JSON object");
    char *canon = cj_dumps(args, JSON_COMPACT | JSON_SORT_KEYS);
    if (!canon) return CKPT_ENOMEM;
    if (strlen(canon) > QUEUE_MAX_ARGS_BYTES) {
        free(canon);
        return ckpt_error_set(CKPT_ELIMIT, "job arguments are larger than %u bytes", QUEUE_MAX_ARGS_BYTES);
    }
    char hex[65], key[128];
    int rc = ckpt_sha256_buf_hex(canon, strlen(canon), hex);
    snprintf(key, sizeof key, "%s:%s", kind, hex);
    queue_submit_opts dflt = {0};
    submit_ctx s = {kind, canon, key, o ? o : &dflt, id, existed};
    if (!rc) rc = queue_in_tx(c, submit_tx, &s);
    free(canon);
    return rc;
}

/* ---- reading jobs ---- */

#define JOB_COLUMNS QUEUE_JOB_COLUMNS

static char *text_or_null(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? ckpt_strdup((const char *)t) : NULL;
}

int queue_read_row(sqlite3_stmt *st, queue_job *j)
{
    memset(j, 0, sizeof *j);
    j->id = sqlite3_column_int64(st, 0);
    j->kind = text_or_null(st, 1);
    const char *args = (const char *)sqlite3_column_text(st, 2);
    json_error_t err;
    j->args = args ? json_loads(args, 0, &err) : NULL;
    snprintf(j->state, sizeof j->state, "%s", (const char *)sqlite3_column_text(st, 3));
    j->priority = sqlite3_column_int(st, 4);
    j->attempt = sqlite3_column_int(st, 5);
    j->max_attempts = sqlite3_column_int(st, 6);
    j->run_after = sqlite3_column_double(st, 7);
    j->created_at = sqlite3_column_double(st, 8);
    j->started_at = sqlite3_column_double(st, 9);
    j->finished_at = sqlite3_column_double(st, 10);
    j->lease_expires = sqlite3_column_double(st, 11);
    j->depends_on = sqlite3_column_int64(st, 12);
    j->worker_pid = sqlite3_column_int(st, 13);
    j->progress_done = sqlite3_column_int64(st, 14);
    j->progress_total = sqlite3_column_int64(st, 15);
    j->phase = text_or_null(st, 16);
    j->error = text_or_null(st, 17);
    j->result = text_or_null(st, 18);
    j->lease_owner = text_or_null(st, 19);
    j->cancel_requested = sqlite3_column_int(st, 20) != 0;
    if (!j->kind || !j->args) {
        queue_job_free(j);
        return ckpt_error_set(CKPT_ENOMEM, "out of memory reading a job");
    }
    return 0;
}

void queue_job_free(queue_job *j)
{
    free(j->kind);
    json_decref(j->args);
    free(j->phase);
    free(j->error);
    free(j->result);
    free(j->lease_owner);
    memset(j, 0, sizeof *j);
}

void queue_jobs_free(queue_job *jobs, size_t n)
{
    for (size_t i = 0; i < n; i++) queue_job_free(&jobs[i]);
    free(jobs);
}

int queue_get(catalog *c, int64_t id, queue_job *out)
{
    sqlite3_stmt *st;
    int rc = catalog_prepare(c, &st, "SELECT " JOB_COLUMNS " FROM jobs WHERE id = ?");
    if (rc) return rc;
    sqlite3_bind_int64(st, 1, id);
    int step = sqlite3_step(st);
    if (step == SQLITE_ROW) rc = queue_read_row(st, out);
    else if (step == SQLITE_DONE) rc = ckpt_error_set(CKPT_ENOTFOUND, "no job %lld", (long long)id);
    else rc = catalog_error(c, "read job");
    sqlite3_finalize(st);
    return rc;
}

json_t *queue_job_json(const queue_job *j)
{
    json_t *o = json_pack("{s:I,s:s,s:O,s:s,s:i,s:i,s:i,s:f}", "id", (json_int_t)j->id, "kind", j->kind, "args",
                          j->args, "state", j->state, "priority", j->priority, "attempt", j->attempt, "max_attempts",
                          j->max_attempts, "created_at", j->created_at);
    if (!o) return NULL;
    if (j->started_at) json_object_set_new(o, "started_at", json_real(j->started_at));
    if (j->finished_at) json_object_set_new(o, "finished_at", json_real(j->finished_at));
    if (j->depends_on) json_object_set_new(o, "depends_on", json_integer(j->depends_on));
    if (j->worker_pid) json_object_set_new(o, "worker_pid", json_integer(j->worker_pid));
    json_object_set_new(o, "progress", json_pack("{s:I,s:I,s:s?}", "done", (json_int_t)j->progress_done, "total",
                                                 (json_int_t)j->progress_total, "phase", j->phase));
    if (j->error) json_object_set_new(o, "error", json_string(j->error));
    if (j->result) {
        json_error_t err;
        json_t *r = json_loads(j->result, 0, &err);
        json_object_set_new(o, "result", r ? r : json_string(j->result));
    }
    if (!strcmp(j->state, "queued") && j->run_after > queue_now())
        json_object_set_new(o, "run_after", json_real(j->run_after));
    if (j->cancel_requested) json_object_set_new(o, "cancel_requested", json_true());
    return o;
}

/* ---- claiming and leases ---- */

typedef struct {
    const char *owner;
    int n;
    const queue_kind_room *rooms;
    size_t nrooms;
    queue_job *jobs;
    size_t njobs, cap;
} claim_ctx;

static int claim_tx(catalog *c, void *vctx)
{
    claim_ctx *cc = vctx;
    int room[64];
    size_t nr = cc->nrooms < 64 ? cc->nrooms : 64;
    for (size_t i = 0; i < nr; i++) room[i] = cc->rooms[i].room;
    int rc = 0;
    while (!rc && (int)cc->njobs < cc->n) {
        /* Kinds at their limit are skipped by name. */
        char excluded[1024] = "''";
        size_t o = 2;
        for (size_t i = 0; i < nr; i++)
            if (room[i] <= 0) o += (size_t)snprintf(excluded + o, sizeof excluded - o, ",'%s'", cc->rooms[i].kind);
        char sql[2048];
        snprintf(sql, sizeof sql,
                 "UPDATE jobs SET state = 'running', attempt = attempt + 1, lease_owner = ?1, lease_expires = ?2, "
                 "started_at = ?3, error = NULL WHERE id IN (SELECT id FROM jobs j WHERE state = 'queued' AND "
                 "run_after <= ?3 AND kind NOT IN (%s) AND (depends_on IS NULL OR EXISTS (SELECT 1 FROM jobs d WHERE "
                 "d.id = j.depends_on AND d.state = 'succeeded')) ORDER BY priority, run_after, id LIMIT 1) "
                 "RETURNING " JOB_COLUMNS,
                 excluded);
        sqlite3_stmt *st;
        if ((rc = catalog_prepare(c, &st, sql))) break;
        double now = queue_now();
        sqlite3_bind_text(st, 1, cc->owner, -1, SQLITE_STATIC);
        sqlite3_bind_double(st, 2, now + QUEUE_LEASE_SECONDS);
        sqlite3_bind_double(st, 3, now);
        int step = sqlite3_step(st);
        if (step == SQLITE_ROW) {
            if (!(rc = ckpt_grow(&cc->jobs, &cc->cap, cc->njobs + 1, sizeof *cc->jobs)) &&
                !(rc = queue_read_row(st, &cc->jobs[cc->njobs]))) {
                for (size_t i = 0; i < nr; i++)
                    if (!strcmp(cc->rooms[i].kind, cc->jobs[cc->njobs].kind)) room[i]--;
                cc->njobs++;
            }
            while (sqlite3_step(st) == SQLITE_ROW) {}
        } else if (step != SQLITE_DONE) {
            rc = catalog_error(c, "claim jobs");
        }
        sqlite3_finalize(st);
        if (step == SQLITE_DONE) break;
    }
    return rc;
}

int queue_claim(catalog *c, const char *owner, int n, const queue_kind_room *rooms, size_t nrooms, queue_job **jobs,
                size_t *njobs)
{
    claim_ctx cc = {.owner = owner, .n = n, .rooms = rooms, .nrooms = nrooms};
    int rc = n > 0 ? queue_in_tx(c, claim_tx, &cc) : 0;
    if (rc) {
        queue_jobs_free(cc.jobs, cc.njobs);
        cc.jobs = NULL;
        cc.njobs = 0;
    }
    *jobs = cc.jobs;
    *njobs = cc.njobs;
    return rc;
}

/* One UPDATE on one job in its own transaction. */
static int update_job(catalog *c, const char *sql, int64_t id, const char *what, void (*bind)(sqlite3_stmt *, void *),
                      void *ctx)
{
    int rc = catalog_begin(c);
    sqlite3_stmt *st;
    if (!rc) rc = catalog_prepare(c, &st, sql);
    if (!rc) {
        sqlite3_bind_int64(st, 1, id);
        if (bind) bind(st, ctx);
        rc = step_done(c, st, what);
    }
    if (rc) {
        catalog_rollback(c);
        return rc;
    }
    return catalog_commit(c);
}

static void bind_pid(sqlite3_stmt *st, void *ctx)
{
    sqlite3_bind_int(st, 2, *(int *)ctx);
}

int queue_set_pid(catalog *c, int64_t id, int pid)
{
    return update_job(c, "UPDATE jobs SET worker_pid = ?2 WHERE id = ?1", id, "record worker", bind_pid, &pid);
}

typedef struct {
    const char *owner;
    double expires;
} renew_ctx;

static void bind_renew(sqlite3_stmt *st, void *ctx)
{
    renew_ctx *r = ctx;
    sqlite3_bind_text(st, 2, r->owner, -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 3, r->expires);
}

int queue_renew(catalog *c, const char *owner, int64_t id)
{
    renew_ctx r = {owner, queue_now() + QUEUE_LEASE_SECONDS};
    return update_job(c, "UPDATE jobs SET lease_expires = ?3 WHERE id = ?1 AND lease_owner = ?2 AND state = 'running'",
                      id, "renew lease", bind_renew, &r);
}

typedef struct {
    const char *self;
    int requeued;
} reap_ctx;

static int reap_tx(catalog *c, void *vctx)
{
    reap_ctx *r = vctx;
    sqlite3_stmt *st, *up;
    int rc = catalog_prepare(c, &st,
                             "SELECT id, lease_owner, lease_expires, attempt, max_attempts, cancel_requested FROM jobs "
                             "WHERE state = 'running'");
    if (rc) return rc;
    rc = catalog_prepare(c, &up,
                         "UPDATE jobs SET state = ?2, run_after = ?3, lease_owner = NULL, lease_expires = NULL, "
                         "worker_pid = NULL, error = ?4, finished_at = CASE WHEN ?2 = 'queued' THEN NULL ELSE ?5 END "
                         "WHERE id = ?1");
    if (rc) {
        sqlite3_finalize(st);
        return rc;
    }
    double now = queue_now();
    while (!rc && sqlite3_step(st) == SQLITE_ROW) {
        const char *owner = (const char *)sqlite3_column_text(st, 1);
        double expires = sqlite3_column_double(st, 2);
        int attempt = sqlite3_column_int(st, 3), max = sqlite3_column_int(st, 4);
        bool cancel = sqlite3_column_int(st, 5) != 0;
        bool mine = owner && r->self && !strcmp(owner, r->self);
        bool lost = expires < now || (!mine && !queue_owner_alive(owner));
        if (!lost) continue;
        const char *state = cancel ? "cancelled" : attempt < max ? "queued" : "failed";
        char err[256];
        snprintf(err, sizeof err, cancel ? "cancelled (its worker was lost)"
                                         : attempt < max ? "its daemon or worker died; retrying (attempt %d of %d)"
                                                         : "its daemon or worker died on the last attempt (%d of %d)",
                 attempt, max);
        sqlite3_bind_int64(up, 1, sqlite3_column_int64(st, 0));
        sqlite3_bind_text(up, 2, state, -1, SQLITE_STATIC);
        sqlite3_bind_double(up, 3, now + backoff(attempt));
        sqlite3_bind_text(up, 4, err, -1, SQLITE_TRANSIENT);
        sqlite3_bind_double(up, 5, now);
        if (sqlite3_step(up) != SQLITE_DONE) rc = catalog_error(c, "requeue job");
        sqlite3_reset(up);
        if (!strcmp(state, "queued")) r->requeued++;
    }
    sqlite3_finalize(st);
    sqlite3_finalize(up);
    if (rc) return rc;
    /* Dependents of failed or cancelled jobs fail, saying so. */
    return catalog_exec(c, "UPDATE jobs SET state = 'failed', finished_at = strftime('%s','now'), error = "
                           "'dependency job ' || depends_on || ' ' || (SELECT d.state FROM jobs d WHERE d.id = jobs.depends_on) "
                           "|| coalesce(': ' || (SELECT d.error FROM jobs d WHERE d.id = jobs.depends_on), '') "
                           "WHERE state = 'queued' AND depends_on IN (SELECT id FROM jobs WHERE state IN ('failed', 'cancelled'))");
}

int queue_reap(catalog *c, const char *self_owner, int *requeued)
{
    reap_ctx r = {self_owner, 0};
    int rc = queue_in_tx(c, reap_tx, &r);
    if (requeued) *requeued = r.requeued;
    return rc;
}

typedef struct {
    int64_t done, total;
    const char *phase;
} progress_ctx;

static void bind_progress(sqlite3_stmt *st, void *ctx)
{
    progress_ctx *p = ctx;
    sqlite3_bind_int64(st, 2, p->done);
    sqlite3_bind_int64(st, 3, p->total);
    if (p->phase) sqlite3_bind_text(st, 4, p->phase, -1, SQLITE_STATIC);
}

int queue_progress(catalog *c, int64_t id, int64_t done, int64_t total, const char *phase)
{
    progress_ctx p = {done, total, phase};
    return update_job(c, "UPDATE jobs SET progress_done = ?2, progress_total = ?3, phase = coalesce(?4, phase) WHERE id = ?1",
                      id, "record progress", bind_progress, &p);
}

static void bind_log(sqlite3_stmt *st, void *ctx)
{
    const char *line = ctx;
    sqlite3_bind_double(st, 2, queue_now());
    sqlite3_bind_text(st, 3, line, (int)strnlen(line, QUEUE_MAX_LOG_LINE), SQLITE_STATIC);
}

int queue_log(catalog *c, int64_t id, const char *line)
{
    return update_job(c, "INSERT INTO job_logs(job_id, seq, at, line) VALUES (?1, (SELECT coalesce(max(seq), 0) + 1 FROM "
                         "job_logs WHERE job_id = ?1), ?2, ?3)",
                      id, "append log", bind_log, (void *)line);
}

typedef struct {
    bool ok, transient;
    const char *error, *result;
} finish_ctx;

static void bind_finish(sqlite3_stmt *st, void *ctx)
{
    finish_ctx *f = ctx;
    double now = queue_now();
    sqlite3_bind_int(st, 2, f->ok);
    sqlite3_bind_int(st, 3, f->transient);
    if (f->error) sqlite3_bind_text(st, 4, f->error, -1, SQLITE_STATIC);
    if (f->result) sqlite3_bind_text(st, 5, f->result, -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 6, now);
    sqlite3_bind_double(st, 7, backoff(1)); /* scaled by attempt below in SQL */
}

int queue_finish(catalog *c, int64_t id, bool ok, bool transient, const char *error, const char *result)
{
    finish_ctx f = {ok, transient, error, result};
    /* A transient failure with attempts left goes back to the queue, later. */
    return update_job(
        c,
        "UPDATE jobs SET state = CASE WHEN ?2 THEN 'succeeded' WHEN ?3 AND attempt < max_attempts THEN 'queued' "
        "ELSE 'failed' END, error = ?4, result = ?5, lease_owner = NULL, lease_expires = NULL, worker_pid = NULL, "
        "finished_at = CASE WHEN NOT ?2 AND ?3 AND attempt < max_attempts THEN NULL ELSE ?6 END, "
        "run_after = CASE WHEN NOT ?2 AND ?3 AND attempt < max_attempts THEN ?6 + min(?7 * (1 << (attempt - 1)), 300) "
        "ELSE run_after END WHERE id = ?1 AND state = 'running'",
        id, "finish job", bind_finish, &f);
}

int queue_release(catalog *c, int64_t id)
{
    return update_job(c, "UPDATE jobs SET state = 'queued', attempt = max(attempt - 1, 0), lease_owner = NULL, "
                         "lease_expires = NULL, worker_pid = NULL, error = 'interrupted by daemon shutdown' "
                         "WHERE id = ?1 AND state = 'running'",
                      id, "release job", NULL, NULL);
}

static void bind_now(sqlite3_stmt *st, void *ctx)
{
    (void)ctx;
    sqlite3_bind_double(st, 2, queue_now());
}

int queue_mark_cancelled(catalog *c, int64_t id)
{
    /* finished_at in the same clock and precision as started_at (strftime('%s') truncated
     * to whole seconds, so a job could end before it started). */
    return update_job(c, "UPDATE jobs SET state = 'cancelled', finished_at = ?2, lease_owner = NULL, "
                         "lease_expires = NULL, worker_pid = NULL, error = coalesce(error, 'cancelled') WHERE id = ?1",
                      id, "cancel job", bind_now, NULL);
}

typedef struct {
    int64_t id;
    bool *running;
} cancel_ctx;

static int cancel_tx(catalog *c, void *vctx)
{
    cancel_ctx *cc = vctx;
    queue_job j;
    int rc = queue_get(c, cc->id, &j);
    if (rc) return rc;
    *cc->running = !strcmp(j.state, "running");
    const char *sql = NULL;
    if (!strcmp(j.state, "queued"))
        sql = "UPDATE jobs SET state = 'cancelled', finished_at = strftime('%s','now'), error = 'cancelled' WHERE id = ?";
    else if (*cc->running)
        sql = "UPDATE jobs SET cancel_requested = 1 WHERE id = ?";
    else rc = ckpt_error_set(CKPT_EINVAL, "job %lld is %s already", (long long)cc->id, j.state);
    queue_job_free(&j);
    if (rc || !sql) return rc;
    sqlite3_stmt *st;
    if ((rc = catalog_prepare(c, &st, sql))) return rc;
    sqlite3_bind_int64(st, 1, cc->id);
    return step_done(c, st, "cancel job");
}

int queue_cancel(catalog *c, int64_t id, bool *running)
{
    cancel_ctx cc = {id, running};
    return queue_in_tx(c, cancel_tx, &cc);
}

static int retry_tx(catalog *c, void *vctx)
{
    int64_t id = *(int64_t *)vctx;
    queue_job j;
    int rc = queue_get(c, id, &j);
    if (rc) return rc;
    bool ok = !strcmp(j.state, "failed") || !strcmp(j.state, "cancelled");
    if (!ok) rc = ckpt_error_set(CKPT_EINVAL, "job %lld is %s; only failed or cancelled jobs can be retried", (long long)id, j.state);
    queue_job_free(&j);
    if (rc) return rc;
    sqlite3_stmt *st;
    if ((rc = catalog_prepare(c, &st, "UPDATE jobs SET state = 'queued', attempt = 0, run_after = ?2, error = NULL, "
                                      "finished_at = NULL, cancel_requested = 0, progress_done = 0 WHERE id = ?1")))
        return rc;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_double(st, 2, queue_now());
    if (sqlite3_step(st) != SQLITE_DONE) {
        rc = sqlite3_extended_errcode(c->db) == SQLITE_CONSTRAINT_UNIQUE
                 ? ckpt_error_set(CKPT_EEXIST, "an identical job is queued or running already")
                 : catalog_error(c, "retry job");
    }
    sqlite3_finalize(st);
    return rc;
}

int queue_retry(catalog *c, int64_t id)
{
    return queue_in_tx(c, retry_tx, &id);
}

int queue_logs(catalog *c, int64_t id, int64_t after, json_t **lines, int64_t *last)
{
    sqlite3_stmt *st;
    *lines = json_array();
    *last = after;
    int rc = catalog_prepare(c, &st, "SELECT seq, at, line FROM job_logs WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT 10000");
    if (rc) return rc;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, after);
    while (sqlite3_step(st) == SQLITE_ROW) {
        *last = sqlite3_column_int64(st, 0);
        json_array_append_new(*lines, json_pack("{s:I,s:f,s:s}", "seq", (json_int_t)*last, "at",
                                                sqlite3_column_double(st, 1), "line", sqlite3_column_text(st, 2)));
    }
    sqlite3_finalize(st);
    return 0;
}

static void bind_before(sqlite3_stmt *st, void *ctx)
{
    sqlite3_bind_double(st, 2, *(double *)ctx);
}

int queue_prune(catalog *c, double before, int *removed)
{
    /* ?1 is update_job's id, unused here. A job a queued or running one waits
     * for is kept: its outcome decides the other's. job_logs go with their job
     * (ON DELETE CASCADE). */
    int rc = update_job(c,
                        "DELETE FROM jobs WHERE ?1 = ?1 AND state IN ('succeeded', 'failed', 'cancelled') AND "
                        "coalesce(finished_at, created_at) < ?2 AND id NOT IN (SELECT depends_on FROM jobs WHERE "
                        "depends_on IS NOT NULL AND state IN ('queued', 'running'))",
                        0, "prune finished jobs", bind_before, &before);
    if (removed) *removed = rc ? 0 : sqlite3_changes(c->db);
    return rc;
}

int queue_counts(catalog *c, json_t **out)
{
    sqlite3_stmt *st;
    *out = json_array();
    int rc = catalog_prepare(c, &st,
                             "SELECT state, kind, count(*), coalesce(sum(CASE WHEN finished_at IS NOT NULL AND started_at "
                             "IS NOT NULL THEN finished_at - started_at END), 0), coalesce(sum(progress_done), 0) FROM jobs "
                             "GROUP BY state, kind");
    if (rc) return rc;
    while (sqlite3_step(st) == SQLITE_ROW)
        json_array_append_new(*out, json_pack("{s:s,s:s,s:I,s:f,s:I}", "state", sqlite3_column_text(st, 0), "kind",
                                              sqlite3_column_text(st, 1), "count", (json_int_t)sqlite3_column_int64(st, 2),
                                              "seconds", sqlite3_column_double(st, 3), "bytes",
                                              (json_int_t)sqlite3_column_int64(st, 4)));
    sqlite3_finalize(st);
    return 0;
}

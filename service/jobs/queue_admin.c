/* queue_admin.c — filters, counts, attempts, deletion (see queue_admin.h). */
#include "service/jobs/queue_admin.h"

#include "common/error.h"
#include "common/util.h"
#include "service/jobs/queue_rows.h"

#include <stdlib.h>
#include <string.h>

static const char *const STATES[] = {"queued", "running", "retrying", "succeeded", "failed", "cancelled"};
#define NSTATES (sizeof STATES / sizeof *STATES)

/* ?1 the state, ?2 the search text; both NULL for any (cast: PostgreSQL
 * cannot infer the type of a NULL parameter compared with IS NULL). %s: the
 * engine's substring position function, instr (SQLite) or strpos
 * (PostgreSQL). */
#define FILTER_WHERE                                                                                                   \
    " WHERE (CAST(?1 AS text) IS NULL OR CASE WHEN ?1 = 'retrying' THEN state = 'queued' AND attempt > 0 "             \
    "ELSE state = ?1 END) AND (CAST(?2 AS text) IS NULL OR %s(lower(kind || ' ' || args), lower(?2)) > 0) "

/* Prepares sql (with FILTER_WHERE's %s) on the queue's database, f bound. */
static int prepare_filtered(catalog *c, ckpt_stmt **st, const char *sql, const queue_filter *f, const char *what)
{
    ckpt_db *d;
    int rc = catalog_jobs(c, &d);
    if (rc) return rc;
    char *text = ckpt_sprintf(sql, db_kind(d) == DB_PG ? "strpos" : "instr");
    if (!text) return CKPT_ENOMEM;
    rc = db_prepare(d, st, text, what);
    free(text);
    if (rc) return rc;
    if (f->state) db_bind_text(*st, 1, f->state);
    if (f->q && *f->q) db_bind_text(*st, 2, f->q);
    return 0;
}

int queue_filter_check(const queue_filter *f)
{
    if (f->q && strlen(f->q) > QUEUE_MAX_QUERY)
        return ckpt_error_set(CKPT_EINVAL, "q: longer than %d bytes", QUEUE_MAX_QUERY);
    if (!f->state) return 0;
    for (size_t i = 0; i < NSTATES; i++)
        if (!strcmp(f->state, STATES[i])) return 0;
    return ckpt_error_set(CKPT_EINVAL, "state: '%.32s' is not one of queued, running, retrying, succeeded, failed, cancelled",
                          f->state);
}

int queue_find(catalog *c, const queue_filter *f, int limit, int offset, queue_job **jobs, size_t *n, int64_t *total)
{
    *jobs = NULL;
    *n = 0;
    *total = 0;
    int rc = queue_filter_check(f);
    ckpt_stmt *st;
    if (rc || (rc = prepare_filtered(c, &st, "SELECT count(*) FROM jobs" FILTER_WHERE, f, "count jobs"))) return rc;
    int e = db_step(st);
    if (e == DB_ROW) *total = db_col_int64(st, 0);
    else rc = e < 0 ? e : ckpt_error_set(CKPT_EIO, "count jobs: no row");
    db_finalize(st);
    if (rc || (rc = prepare_filtered(c, &st, "SELECT " QUEUE_JOB_COLUMNS " FROM jobs" FILTER_WHERE
                                             "ORDER BY id DESC LIMIT ?3 OFFSET ?4", f, "find jobs")))
        return rc;
    db_bind_int64(st, 3, limit > 0 ? limit : 100);
    db_bind_int64(st, 4, offset > 0 ? offset : 0);
    size_t cap = 0;
    while (!rc && (e = db_step(st)) == DB_ROW) {
        if ((rc = ckpt_grow(jobs, &cap, *n + 1, sizeof **jobs))) break;
        if (!(rc = queue_read_row(st, &(*jobs)[*n]))) (*n)++;
    }
    if (!rc && e < 0) rc = e;
    db_finalize(st);
    if (rc) {
        queue_jobs_free(*jobs, *n);
        *jobs = NULL;
        *n = 0;
    }
    return rc;
}

int queue_list(catalog *c, const char *state, int limit, queue_job **jobs, size_t *n)
{
    int64_t total;
    return queue_find(c, &(queue_filter){state, NULL}, limit > 0 ? limit : 1000, 0, jobs, n, &total);
}

int queue_state_counts(catalog *c, const queue_filter *f, json_t **out)
{
    *out = NULL;
    queue_filter any = {NULL, f->q};
    int rc = queue_filter_check(&any);
    ckpt_stmt *st;
    if (rc || (rc = prepare_filtered(c, &st,
                                     "SELECT state, CASE WHEN attempt > 0 AND state = 'queued' THEN 1 ELSE 0 END, "
                                     "count(*) FROM jobs" FILTER_WHERE "GROUP BY 1, 2",
                                     &any, "count jobs by state")))
        return rc;
    json_int_t counts[NSTATES] = {0}, all = 0;
    int e;
    while ((e = db_step(st)) == DB_ROW) {
        const char *state = db_col_text(st, 0);
        json_int_t k = db_col_int64(st, 2);
        all += k;
        for (size_t i = 0; state && i < NSTATES; i++)
            if (!strcmp(state, STATES[i])) counts[i] += k;
        if (db_col_int64(st, 1)) counts[2] += k; /* retrying: queued ones that ran before */
    }
    db_finalize(st);
    if (e < 0) return e;
    json_t *o = json_pack("{s:I}", "all", all);
    for (size_t i = 0; o && i < NSTATES; i++) json_object_set_new(o, STATES[i], json_integer(counts[i]));
    if (!o) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    *out = o;
    return 0;
}

/* The rows of sql (?1 a job id, ?2 a limit) as a JSON array, one object a
 * row made by row(). */
static int job_rows(catalog *c, const char *sql, const char *what, int64_t id, int64_t limit,
                    json_t *(*row)(ckpt_stmt *), json_t **out)
{
    *out = json_array();
    ckpt_stmt *st;
    int rc = *out ? catalog_jobs_prepare(c, &st, sql, what) : ckpt_error_set(CKPT_ENOMEM, "out of memory");
    if (rc) {
        json_decref(*out);
        *out = NULL;
        return rc;
    }
    db_bind_int64(st, 1, id);
    db_bind_int64(st, 2, limit);
    int e;
    while ((e = db_step(st)) == DB_ROW) json_array_append_new(*out, row(st));
    db_finalize(st);
    if (e < 0) {
        json_decref(*out);
        *out = NULL;
        return e;
    }
    return 0;
}

static json_t *attempt_row(ckpt_stmt *st)
{
    json_t *a = json_pack("{s:i,s:f,s:s?,s:s*}", "attempt", (int)db_col_int64(st, 0), "finished_at",
                          db_col_double(st, 2), "outcome", db_col_text(st, 3), "error", db_col_text(st, 4));
    if (a && !db_col_null(st, 1)) json_object_set_new(a, "started_at", json_real(db_col_double(st, 1)));
    return a;
}

int queue_attempts(catalog *c, int64_t id, json_t **out)
{
    /* The trigger keeps 20 a job; the limit is only a bound. */
    return job_rows(c,
                    "SELECT attempt, started_at, finished_at, outcome, error FROM job_attempts WHERE job_id = ?1 "
                    "ORDER BY seq LIMIT ?2",
                    "read job attempts", id, 1000, attempt_row, out);
}

static json_t *dependent_row(ckpt_stmt *st)
{
    return json_pack("{s:I,s:s?,s:s?,s:i}", "id", (json_int_t)db_col_int64(st, 0), "kind", db_col_text(st, 1),
                     "state", db_col_text(st, 2), "attempt", (int)db_col_int64(st, 3));
}

int queue_dependents(catalog *c, int64_t id, json_t **out)
{
    return job_rows(c, "SELECT id, kind, state, attempt FROM jobs WHERE depends_on = ?1 ORDER BY id LIMIT ?2",
                    "find the jobs waiting for a job", id, QUEUE_MAX_DEPENDENTS, dependent_row, out);
}

int queue_job_detail(catalog *c, int64_t id, json_t **out)
{
    *out = NULL;
    queue_job j;
    int rc = queue_get(c, id, &j);
    if (rc) return rc;
    json_t *o = queue_job_json(&j), *attempts = NULL, *dependents = NULL;
    queue_job_free(&j);
    if (!o) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    if ((rc = queue_attempts(c, id, &attempts)) || (rc = queue_dependents(c, id, &dependents))) {
        json_decref(attempts);
        json_decref(o);
        return rc;
    }
    json_object_set_new(o, "attempts", attempts);
    json_object_set_new(o, "dependents", dependents);
    *out = o;
    return 0;
}

static int delete_tx(ckpt_db *d, void *vctx)
{
    int64_t id = *(int64_t *)vctx;
    queue_job j;
    int rc = queue_get_in(d, id, &j);
    if (rc) return rc;
    bool active = !strcmp(j.state, "queued") || !strcmp(j.state, "running");
    if (active) rc = ckpt_error_set(CKPT_EINVAL, "job %lld is %s: cancel it before deleting it", (long long)id, j.state);
    queue_job_free(&j);
    ckpt_stmt *st;
    if (rc || (rc = db_prepare(d, &st,
                               "SELECT id FROM jobs WHERE depends_on = ? AND state IN ('queued', 'running') LIMIT 1",
                               "find jobs waiting for a job")))
        return rc;
    db_bind_int64(st, 1, id);
    int e = db_step(st);
    if (e == DB_ROW)
        rc = ckpt_error_set(CKPT_EINVAL, "job %lld waits for job %lld: it cannot be deleted yet",
                            (long long)db_col_int64(st, 0), (long long)id);
    else if (e < 0) rc = e;
    db_finalize(st);
    /* Only while it is still finished: on PostgreSQL another daemon's retry
     * may have queued it since the read. */
    if (rc || (rc = db_prepare(d, &st, "DELETE FROM jobs WHERE id = ? AND state IN ('succeeded', 'failed', 'cancelled')",
                               "delete job")))
        return rc;
    db_bind_int64(st, 1, id);
    rc = db_run(st);
    if (!rc && !db_changes(st)) rc = ckpt_error_set(CKPT_EBUSY, "job %lld changed state meanwhile; try again", (long long)id);
    db_finalize(st);
    return rc;
}

int queue_delete(catalog *c, int64_t id)
{
    return queue_in_tx(c, delete_tx, &id);
}

int queue_bulk(catalog *c, const queue_filter *f, const char *action, int *matched, int *done)
{
    *matched = *done = 0;
    bool cancel = !strcmp(action, "cancel"), retry = !strcmp(action, "retry"), del = !strcmp(action, "delete");
    if (!cancel && !retry && !del)
        return ckpt_error_set(CKPT_EINVAL, "action: '%.32s' is not one of cancel, retry, delete", action);
    queue_job *jobs;
    size_t n;
    int64_t total;
    int rc = queue_find(c, f, QUEUE_BULK_MAX, 0, &jobs, &n, &total);
    if (rc) return rc;
    *matched = (int)n;
    for (size_t i = 0; i < n && !rc; i++) {
        const char *st = jobs[i].state;
        bool active = !strcmp(st, "queued") || !strcmp(st, "running");
        bool applies = cancel ? active : retry ? !strcmp(st, "failed") || !strcmp(st, "cancelled") : !active;
        if (!applies) continue;
        bool running;
        int r = cancel ? queue_cancel(c, jobs[i].id, &running) : retry ? queue_retry(c, jobs[i].id)
                                                                       : queue_delete(c, jobs[i].id);
        /* A job that changed meanwhile, or one another waits for, is skipped; a catalog failure stops. */
        if (r == CKPT_EINVAL || r == CKPT_EEXIST || r == CKPT_ENOTFOUND || r == CKPT_EBUSY) ckpt_error_clear();
        else if (r) rc = r;
        else (*done)++;
    }
    queue_jobs_free(jobs, n);
    return rc;
}

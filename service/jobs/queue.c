/* queue.c — the job queue on SQLite or PostgreSQL (see queue.h). */
#include "service/jobs/queue.h"
#include "service/jobs/queue_rows.h"

#include "common/error.h"
#include "common/fault.h"
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

/* Wakes the daemons listening on PostgreSQL (delivered at commit; nothing on SQLite). */
#define QUEUE_CHANNEL "ckpt_jobs"

/* Runs fn inside one transaction of the queue's database (db.h says which kind). */
int queue_in_tx(catalog *c, int (*fn)(ckpt_db *, void *), void *ctx)
{
    ckpt_db *d;
    int rc = catalog_jobs(c, &d);
    if (!rc) rc = db_begin(d);
    if (rc) return rc;
    rc = fn(d, ctx);
    if (rc) {
        db_rollback(d);
        return rc;
    }
    return db_commit(d);
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

static int submit_tx(ckpt_db *d, void *vctx)
{
    submit_ctx *s = vctx;
    ckpt_stmt *st;
    int rc = db_prepare(d, &st, "SELECT id FROM jobs WHERE unique_key = ? AND state IN ('queued', 'running')",
                        "look for the same job");
    if (rc) return rc;
    db_bind_text(st, 1, s->key);
    int e = db_step(st);
    if (e == DB_ROW) {
        *s->id = db_col_int64(st, 0);
        *s->existed = true;
    }
    db_finalize(st);
    if (e != DB_DONE) return e < 0 ? e : 0;
    if (s->o->depends_on) {
        if ((rc = db_prepare(d, &st, "SELECT 1 FROM jobs WHERE id = ?", "look for the dependency"))) return rc;
        db_bind_int64(st, 1, s->o->depends_on);
        e = db_step(st);
        db_finalize(st);
        if (e < 0) return e;
        if (e != DB_ROW) return ckpt_error_set(CKPT_ENOTFOUND, "dependency job %lld does not exist", (long long)s->o->depends_on);
    }
    rc = db_prepare(d, &st,
                    "INSERT INTO jobs(kind, args, priority, max_attempts, run_after, created_at, depends_on, unique_key) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                    "insert job");
    if (rc) return rc;
    double now = queue_now();
    db_bind_text(st, 1, s->kind);
    db_bind_text(st, 2, s->args);
    db_bind_int64(st, 3, s->o->priority);
    db_bind_int64(st, 4, s->o->max_attempts > 0 ? s->o->max_attempts : 3);
    db_bind_double(st, 5, now);
    db_bind_double(st, 6, now);
    if (s->o->depends_on) db_bind_int64(st, 7, s->o->depends_on);
    db_bind_text(st, 8, s->key);
    e = db_step(st);
    if (e == DB_ROW) *s->id = db_col_int64(st, 0);
    rc = e < 0 ? e : db_run(st);
    db_finalize(st);
    return rc ? rc : db_notify(d, QUEUE_CHANNEL);
}


/* The canonical arguments and unique key of a submission, checked. */
static int submit_prepare(const char *kind, const json_t *args, char **canon, char key[128])
{
    if (!queue_kind_valid(kind)) return ckpt_error_set(CKPT_EINVAL, "'%s' is not a job kind's name", kind);
    if (!json_is_object(args)) return ckpt_error_set(CKPT_EINVAL, "job arguments must be a JSON object");
    *canon = cj_dumps(args, JSON_COMPACT | JSON_SORT_KEYS);
    if (!*canon) return CKPT_ENOMEM;
    if (strlen(*canon) > QUEUE_MAX_ARGS_BYTES) {
        free(*canon);
        *canon = NULL;
        return ckpt_error_set(CKPT_ELIMIT, "job arguments are larger than %u bytes", QUEUE_MAX_ARGS_BYTES);
    }
    char hex[65];
    int rc = ckpt_sha256_buf_hex(*canon, strlen(*canon), hex);
    snprintf(key, 128, "%s:%s", kind, hex);
    return rc;
}

int queue_submit_in(ckpt_db *d, const char *kind, const json_t *args, const queue_submit_opts *o, int64_t *id,
                    bool *existed)
{
    *existed = false;
    char *canon = NULL, key[128];
    int rc = submit_prepare(kind, args, &canon, key);
    queue_submit_opts dflt = {0};
    submit_ctx s = {kind, canon, key, o ? o : &dflt, id, existed};
    if (!rc) rc = submit_tx(d, &s);
    free(canon);
    return rc;
}

typedef struct {
    const char *kind;
    const json_t *args;
    const queue_submit_opts *o;
    int64_t *id;
    bool *existed;
} submit_req;

static int submit_req_tx(ckpt_db *d, void *v)
{
    submit_req *r = v;
    return queue_submit_in(d, r->kind, r->args, r->o, r->id, r->existed);
}

int queue_submit(catalog *c, const char *kind, const json_t *args, const queue_submit_opts *o, int64_t *id,
                 bool *existed)
{
    submit_req r = {kind, args, o, id, existed};
    int rc = queue_in_tx(c, submit_req_tx, &r);
    /* On PostgreSQL two submitters can both find no such job and both insert:
     * the unique index refuses the second, whose retry finds the first's. */
    ckpt_db *d;
    for (int again = 0; rc == CKPT_EEXIST && again < 3 && !catalog_jobs(c, &d) && db_last_unique(d); again++)
        rc = queue_in_tx(c, submit_req_tx, &r);
    return rc;
}

/* ---- reading jobs ---- */

#define JOB_COLUMNS QUEUE_JOB_COLUMNS

static char *text_or_null(ckpt_stmt *st, int i)
{
    const char *t = db_col_text(st, i);
    return t ? ckpt_strdup(t) : NULL;
}

int queue_read_row(ckpt_stmt *st, queue_job *j)
{
    memset(j, 0, sizeof *j);
    j->id = db_col_int64(st, 0);
    j->kind = text_or_null(st, 1);
    const char *args = db_col_text(st, 2);
    json_error_t err;
    j->args = args ? json_loads(args, 0, &err) : NULL;
    snprintf(j->state, sizeof j->state, "%s", db_col_text(st, 3) ? db_col_text(st, 3) : "");
    j->priority = (int)db_col_int64(st, 4);
    j->attempt = (int)db_col_int64(st, 5);
    j->max_attempts = (int)db_col_int64(st, 6);
    j->run_after = db_col_double(st, 7);
    j->created_at = db_col_double(st, 8);
    j->started_at = db_col_double(st, 9);
    j->finished_at = db_col_double(st, 10);
    j->lease_expires = db_col_double(st, 11);
    j->depends_on = db_col_int64(st, 12);
    j->worker_pid = (int)db_col_int64(st, 13);
    j->progress_done = db_col_int64(st, 14);
    j->progress_total = db_col_int64(st, 15);
    j->phase = text_or_null(st, 16);
    j->error = text_or_null(st, 17);
    j->result = text_or_null(st, 18);
    j->lease_owner = text_or_null(st, 19);
    j->cancel_requested = db_col_int64(st, 20) != 0;
    j->tensors_done = db_col_int64(st, 21);
    j->tensors_total = db_col_int64(st, 22);
    j->progress_rate = db_col_double(st, 23);
    j->progress_eta = db_col_double(st, 24);
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

int queue_get_in(ckpt_db *d, int64_t id, queue_job *out)
{
    ckpt_stmt *st;
    int rc = db_prepare(d, &st, "SELECT " JOB_COLUMNS " FROM jobs WHERE id = ?", "read job");
    if (rc) return rc;
    db_bind_int64(st, 1, id);
    int e = db_step(st);
    if (e == DB_ROW) rc = queue_read_row(st, out);
    else if (e == DB_DONE) rc = ckpt_error_set(CKPT_ENOTFOUND, "no job %lld", (long long)id);
    else rc = e;
    db_finalize(st);
    return rc;
}

int queue_get(catalog *c, int64_t id, queue_job *out)
{
    ckpt_db *d;
    int rc = catalog_jobs(c, &d);
    return rc ? rc : queue_get_in(d, id, out);
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
    json_object_set_new(o, "progress", json_pack("{s:I,s:I,s:I,s:I,s:s?}", "done", (json_int_t)j->progress_done, "total",
                                                 (json_int_t)j->progress_total, "tensors_done",
                                                 (json_int_t)j->tensors_done, "tensors_total",
                                                 (json_int_t)j->tensors_total, "phase", j->phase));
    /* A running job's rate and time left, as its worker last measured them. */
    json_t *pr = json_object_get(o, "progress");
    if (pr && !strcmp(j->state, "running") && j->progress_rate > 0) {
        json_object_set_new(pr, "rate", json_real(j->progress_rate));
        if (j->progress_eta >= 0) json_object_set_new(pr, "eta_seconds", json_real(j->progress_eta));
    }
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

static int claim_tx(ckpt_db *d, void *vctx)
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
        /* On PostgreSQL, several daemons claim at once: each locks the row it
         * takes and passes over rows another holds (SKIP LOCKED), so no job is
         * claimed twice and no claimer waits for another. SQLite's BEGIN
         * IMMEDIATE lets one writer in at a time. */
        char sql[2048];
        snprintf(sql, sizeof sql,
                 "UPDATE jobs SET state = 'running', attempt = attempt + 1, lease_owner = ?1, lease_expires = ?2, "
                 "started_at = ?3, error = NULL, progress_rate = 0, progress_eta = -1 WHERE id IN (SELECT id FROM jobs j WHERE state = 'queued' AND "
                 "run_after <= ?3 AND kind NOT IN (%s) AND (depends_on IS NULL OR EXISTS (SELECT 1 FROM jobs d WHERE "
                 "d.id = j.depends_on AND d.state = 'succeeded')) ORDER BY priority, run_after, id LIMIT 1%s) "
                 "RETURNING " JOB_COLUMNS,
                 excluded, db_kind(d) == DB_PG ? " FOR UPDATE SKIP LOCKED" : "");
        ckpt_stmt *st;
        if ((rc = db_prepare(d, &st, sql, "claim jobs"))) break;
        double now = queue_now();
        db_bind_text(st, 1, cc->owner);
        db_bind_double(st, 2, now + QUEUE_LEASE_SECONDS);
        db_bind_double(st, 3, now);
        int e = db_step(st);
        if (e == DB_ROW) {
            if (!(rc = ckpt_grow(&cc->jobs, &cc->cap, cc->njobs + 1, sizeof *cc->jobs)) &&
                !(rc = queue_read_row(st, &cc->jobs[cc->njobs]))) {
                for (size_t i = 0; i < nr; i++)
                    if (!strcmp(cc->rooms[i].kind, cc->jobs[cc->njobs].kind)) room[i]--;
                cc->njobs++;
            }
            if (!rc) rc = db_run(st);
        } else if (e < 0) {
            rc = e;
        }
        db_finalize(st);
        if (e == DB_DONE) break;
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

/* One statement on one job (?1) in its own transaction; *changes (may be NULL) gets its rows. */
/* fault: a crash point between the update and its commit (the row locked), or NULL */
static int update_job_n(catalog *c, const char *sql, int64_t id, const char *what, void (*bind)(ckpt_stmt *, void *),
                        void *ctx, int64_t *changes, const char *fault)
{
    ckpt_db *d;
    ckpt_stmt *st;
    int rc = catalog_jobs(c, &d);
    if (!rc) rc = db_begin(d);
    if (rc) return rc;
    rc = db_prepare(d, &st, sql, what);
    if (!rc) {
        db_bind_int64(st, 1, id);
        if (bind) bind(st, ctx);
        rc = db_run(st);
        if (!rc && changes) *changes = db_changes(st);
        db_finalize(st);
    }
    if (rc) {
        db_rollback(d);
        return rc;
    }
    if (fault) ckpt_fault(fault);
    return db_commit(d);
}

static int update_job(catalog *c, const char *sql, int64_t id, const char *what, void (*bind)(ckpt_stmt *, void *),
                      void *ctx)
{
    return update_job_n(c, sql, id, what, bind, ctx, NULL, NULL);
}

static void bind_pid(ckpt_stmt *st, void *ctx)
{
    db_bind_int64(st, 2, *(int *)ctx);
}

int queue_set_pid(catalog *c, int64_t id, int pid)
{
    return update_job(c, "UPDATE jobs SET worker_pid = ?2 WHERE id = ?1", id, "record worker", bind_pid, &pid);
}

typedef struct {
    const char *owner;
    double expires;
} renew_ctx;

static void bind_renew(ckpt_stmt *st, void *ctx)
{
    renew_ctx *r = ctx;
    db_bind_text(st, 2, r->owner);
    db_bind_double(st, 3, r->expires);
}

int queue_renew(catalog *c, const char *owner, int64_t id)
{
    renew_ctx r = {owner, queue_now() + QUEUE_LEASE_SECONDS};
    return update_job_n(c, "UPDATE jobs SET lease_expires = ?3 WHERE id = ?1 AND lease_owner = ?2 AND state = 'running'",
                        id, "renew lease", bind_renew, &r, NULL, "queue.renew.before_commit");
}

typedef struct {
    const char *self;
    bool expire;
    int requeued;
} reap_ctx;

static int reap_tx(ckpt_db *d, void *vctx)
{
    reap_ctx *r = vctx;
    ckpt_stmt *st, *up;
    int rc = db_prepare(d, &st,
                        "SELECT id, lease_owner, lease_expires, attempt, max_attempts, cancel_requested FROM jobs "
                        "WHERE state = 'running'",
                        "read running jobs");
    if (rc) return rc;
    /* Only while the job is still the lost lease's: on PostgreSQL another
     * daemon may have reaped and even claimed it again since the read. */
    rc = db_prepare(d, &up,
                    "UPDATE jobs SET state = ?2, run_after = ?3, lease_owner = NULL, lease_expires = NULL, "
                    "worker_pid = NULL, error = ?4, finished_at = CASE WHEN ?2 = 'queued' THEN NULL ELSE ?5 END "
                    "WHERE id = ?1 AND state = 'running' AND lease_owner = ?6",
                    "requeue job");
    if (rc) {
        db_finalize(st);
        return rc;
    }
    double now = queue_now();
    int e;
    while (!rc && (e = db_step(st)) == DB_ROW) {
        const char *owner = db_col_text(st, 1);
        double expires = db_col_double(st, 2);
        int attempt = (int)db_col_int64(st, 3), max = (int)db_col_int64(st, 4);
        bool cancel = db_col_int64(st, 5) != 0;
        bool mine = owner && r->self && !strcmp(owner, r->self);
        bool lost = (r->expire && expires < now) || (!mine && !queue_owner_alive(owner));
        if (!lost || !owner) continue;
        const char *state = cancel ? "cancelled" : attempt < max ? "queued" : "failed";
        char err[256];
        snprintf(err, sizeof err, cancel ? "cancelled (its worker was lost)"
                                         : attempt < max ? "its daemon or worker died; retrying (attempt %d of %d)"
                                                         : "its daemon or worker died on the last attempt (%d of %d)",
                 attempt, max);
        db_bind_int64(up, 1, db_col_int64(st, 0));
        db_bind_text(up, 2, state);
        db_bind_double(up, 3, now + backoff(attempt));
        db_bind_text(up, 4, err);
        db_bind_double(up, 5, now);
        db_bind_text(up, 6, owner);
        rc = db_run(up);
        if (!rc && db_changes(up) && !strcmp(state, "queued")) r->requeued++;
        db_reset(up);
    }
    if (!rc && e < 0) rc = e;
    db_finalize(st);
    db_finalize(up);
    if (rc) return rc;
    /* Dependents of failed or cancelled jobs fail, saying so. */
    if ((rc = db_prepare(d, &st,
                         "UPDATE jobs SET state = 'failed', finished_at = ?1, error = "
                         "'dependency job ' || depends_on || ' ' || (SELECT d.state FROM jobs d WHERE d.id = jobs.depends_on) "
                         "|| coalesce(': ' || (SELECT d.error FROM jobs d WHERE d.id = jobs.depends_on), '') "
                         "WHERE state = 'queued' AND depends_on IN (SELECT id FROM jobs WHERE state IN ('failed', 'cancelled'))",
                         "fail dependents")))
        return rc;
    db_bind_double(st, 1, now);
    rc = db_run(st);
    db_finalize(st);
    if (!rc && r->requeued) rc = db_notify(d, QUEUE_CHANNEL);
    return rc;
}

int queue_reap(catalog *c, const char *self_owner, bool expire, int *requeued)
{
    reap_ctx r = {self_owner, expire, 0};
    int rc = queue_in_tx(c, reap_tx, &r);
    if (requeued) *requeued = rc ? 0 : r.requeued;
    return rc;
}

static void bind_progress(ckpt_stmt *st, void *ctx)
{
    const queue_progress_info *p = ctx;
    db_bind_int64(st, 2, p->done);
    db_bind_int64(st, 3, p->total);
    db_bind_text(st, 4, p->phase);
    db_bind_int64(st, 5, p->tensors_done);
    db_bind_int64(st, 6, p->tensors_total);
    db_bind_double(st, 7, p->rate);
    db_bind_double(st, 8, p->eta);
}

int queue_progress(catalog *c, int64_t id, const queue_progress_info *p)
{
    return update_job(c,
                      "UPDATE jobs SET progress_done = ?2, progress_total = ?3, phase = coalesce(?4, phase), "
                      "tensors_done = ?5, tensors_total = ?6, progress_rate = ?7, progress_eta = ?8 WHERE id = ?1",
                      id, "record progress", bind_progress, (void *)p);
}

static void bind_log(ckpt_stmt *st, void *ctx)
{
    const char *line = ctx;
    db_bind_double(st, 2, queue_now());
    char *cut = ckpt_strndup(line, strnlen(line, QUEUE_MAX_LOG_LINE));
    db_bind_text(st, 3, cut ? cut : "");
    free(cut);
}

int queue_log(catalog *c, int64_t id, const char *line)
{
    return update_job(c, "INSERT INTO job_logs(job_id, seq, at, line) VALUES (?1, (SELECT coalesce(max(seq), 0) + 1 FROM "
                         "job_logs WHERE job_id = ?1), ?2, ?3)",
                      id, "append log", bind_log, (void *)line);
}

typedef struct {
    bool ok, transient;
    const char *error, *result, *owner;
} finish_ctx;

static void bind_finish(ckpt_stmt *st, void *ctx)
{
    finish_ctx *f = ctx;
    double now = queue_now();
    db_bind_int64(st, 2, f->ok);
    db_bind_int64(st, 3, f->transient);
    db_bind_text(st, 4, f->error);
    db_bind_text(st, 5, f->result);
    db_bind_double(st, 6, now);
    db_bind_double(st, 7, backoff(1)); /* scaled by attempt below in SQL */
    db_bind_text(st, 8, f->owner);
}

/* update_job for the statements QUEUE_OWNED guards: QUEUE_NOT_OURS when no row changed. */
static int update_owned_job(catalog *c, const char *sql, int64_t id, const char *what,
                            void (*bind)(ckpt_stmt *, void *), void *ctx)
{
    int64_t changes = 0;
    int rc = update_job_n(c, sql, id, what, bind, ctx, &changes, NULL);
    return rc ? rc : changes ? 0 : QUEUE_NOT_OURS;
}

/* "The job still runs under owner ?N" (any owner when ?N is NULL): an end
 * recorded late (the database was unreachable meanwhile) never ends another
 * daemon's run of a job that was reaped and claimed again. */
#define QUEUE_OWNED(n) " AND (CAST(?" #n " AS text) IS NULL OR lease_owner = ?" #n ")"

int queue_finish(catalog *c, int64_t id, const char *owner, bool ok, bool transient, const char *error,
                 const char *result)
{
    finish_ctx f = {ok, transient, error, result, owner};
    /* A transient failure with attempts left goes back to the queue, later
     * (the backoff doubles per attempt up to QUEUE_BACKOFF_CAP). */
    return update_owned_job(
        c,
        "UPDATE jobs SET state = CASE WHEN ?2 = 1 THEN 'succeeded' WHEN ?3 = 1 AND attempt < max_attempts THEN 'queued' "
        "ELSE 'failed' END, error = ?4, result = ?5, lease_owner = NULL, lease_expires = NULL, worker_pid = NULL, "
        "finished_at = CASE WHEN ?2 = 0 AND ?3 = 1 AND attempt < max_attempts THEN NULL ELSE ?6 END, "
        "run_after = CASE WHEN ?2 = 0 AND ?3 = 1 AND attempt < max_attempts THEN ?6 + CASE WHEN ?7 * (1 << (attempt - 1)) "
        "< 300 THEN ?7 * (1 << (attempt - 1)) ELSE 300 END ELSE run_after END WHERE id = ?1 AND state = 'running'"
        QUEUE_OWNED(8),
        id, "finish job", bind_finish, &f);
}

static void bind_owner(ckpt_stmt *st, void *ctx)
{
    db_bind_text(st, 2, ctx);
}

int queue_release(catalog *c, int64_t id, const char *owner)
{
    return update_owned_job(c, "UPDATE jobs SET state = 'queued', attempt = CASE WHEN attempt > 0 THEN attempt - 1 ELSE 0 END, "
                         "lease_owner = NULL, lease_expires = NULL, worker_pid = NULL, error = 'interrupted by daemon "
                         "shutdown' WHERE id = ?1 AND state = 'running'" QUEUE_OWNED(2),
                      id, "release job", bind_owner, (void *)owner);
}

static void bind_now(ckpt_stmt *st, void *ctx)
{
    (void)ctx;
    db_bind_double(st, 2, queue_now());
}

int queue_mark_cancelled(catalog *c, int64_t id)
{
    /* finished_at in the same clock and precision as started_at. */
    return update_job(c, "UPDATE jobs SET state = 'cancelled', finished_at = ?2, lease_owner = NULL, "
                         "lease_expires = NULL, worker_pid = NULL, error = coalesce(error, 'cancelled') WHERE id = ?1",
                      id, "cancel job", bind_now, NULL);
}

typedef struct {
    int64_t id;
    bool *running;
} cancel_ctx;

static int cancel_tx(ckpt_db *d, void *vctx)
{
    cancel_ctx *cc = vctx;
    queue_job j;
    int rc = queue_get_in(d, cc->id, &j);
    if (rc) return rc;
    *cc->running = !strcmp(j.state, "running");
    const char *sql = NULL;
    if (!strcmp(j.state, "queued"))
        sql = "UPDATE jobs SET state = 'cancelled', finished_at = ?2, error = 'cancelled' WHERE id = ?1 AND state = 'queued'";
    else if (*cc->running)
        sql = "UPDATE jobs SET cancel_requested = 1 WHERE id = ?1 AND ?2 = ?2";
    else rc = ckpt_error_set(CKPT_EINVAL, "job %lld is %s already", (long long)cc->id, j.state);
    queue_job_free(&j);
    if (rc || !sql) return rc;
    ckpt_stmt *st;
    if ((rc = db_prepare(d, &st, sql, "cancel job"))) return rc;
    db_bind_int64(st, 1, cc->id);
    db_bind_double(st, 2, queue_now());
    rc = db_run(st);
    /* On PostgreSQL a daemon may have claimed it since the read: say so, and let the user cancel again. */
    if (!rc && !db_changes(st)) rc = ckpt_error_set(CKPT_EBUSY, "job %lld changed state meanwhile; try again", (long long)cc->id);
    db_finalize(st);
    return rc;
}

int queue_cancel(catalog *c, int64_t id, bool *running)
{
    cancel_ctx cc = {id, running};
    return queue_in_tx(c, cancel_tx, &cc);
}

static int retry_tx(ckpt_db *d, void *vctx)
{
    int64_t id = *(int64_t *)vctx;
    queue_job j;
    int rc = queue_get_in(d, id, &j);
    if (rc) return rc;
    bool ok = !strcmp(j.state, "failed") || !strcmp(j.state, "cancelled");
    if (!ok) rc = ckpt_error_set(CKPT_EINVAL, "job %lld is %s; only failed or cancelled jobs can be retried", (long long)id, j.state);
    queue_job_free(&j);
    if (rc) return rc;
    ckpt_stmt *st;
    if ((rc = db_prepare(d, &st, "UPDATE jobs SET state = 'queued', attempt = 0, run_after = ?2, error = NULL, "
                                 "finished_at = NULL, cancel_requested = 0, progress_done = 0, tensors_done = 0, "
                                 "progress_rate = 0, progress_eta = -1 "
                                 "WHERE id = ?1",
                         "retry job")))
        return rc;
    db_bind_int64(st, 1, id);
    db_bind_double(st, 2, queue_now());
    rc = db_run(st);
    if (rc && db_last_unique(d)) rc = ckpt_error_set(CKPT_EEXIST, "an identical job is queued or running already");
    db_finalize(st);
    return rc ? rc : db_notify(d, QUEUE_CHANNEL);
}

int queue_retry(catalog *c, int64_t id)
{
    return queue_in_tx(c, retry_tx, &id);
}

int queue_logs(catalog *c, int64_t id, int64_t after, json_t **lines, int64_t *last)
{
    ckpt_stmt *st;
    *lines = json_array();
    *last = after;
    int rc = catalog_jobs_prepare(
        c, &st, "SELECT seq, at, line FROM job_logs WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT 10000", "read job logs");
    if (rc) return rc;
    db_bind_int64(st, 1, id);
    db_bind_int64(st, 2, after);
    int e;
    while ((e = db_step(st)) == DB_ROW) {
        *last = db_col_int64(st, 0);
        json_array_append_new(*lines, json_pack("{s:I,s:f,s:s}", "seq", (json_int_t)*last, "at", db_col_double(st, 1),
                                                "line", db_col_text(st, 2)));
    }
    db_finalize(st);
    return e < 0 ? e : 0;
}

static void bind_before(ckpt_stmt *st, void *ctx)
{
    db_bind_double(st, 2, *(double *)ctx);
}

int queue_prune(catalog *c, double before, int *removed)
{
    /* ?1 is update_job's id, unused here. A job a queued or running one waits
     * for is kept: its outcome decides the other's. job_logs go with their job
     * (ON DELETE CASCADE). */
    int64_t n = 0;
    int rc = update_job_n(c,
                          "DELETE FROM jobs WHERE ?1 = ?1 AND state IN ('succeeded', 'failed', 'cancelled') AND "
                          "coalesce(finished_at, created_at) < ?2 AND id NOT IN (SELECT depends_on FROM jobs WHERE "
                          "depends_on IS NOT NULL AND state IN ('queued', 'running'))",
                          0, "prune finished jobs", bind_before, &before, &n, NULL);
    if (removed) *removed = rc ? 0 : (int)n;
    return rc;
}

int queue_counts(catalog *c, json_t **out)
{
    ckpt_stmt *st;
    *out = json_array();
    int rc = catalog_jobs_prepare(c, &st,
                                  "SELECT state, kind, count(*), coalesce(sum(CASE WHEN finished_at IS NOT NULL AND "
                                  "started_at IS NOT NULL THEN finished_at - started_at END), 0), "
                                  "coalesce(sum(progress_done), 0) FROM jobs GROUP BY state, kind",
                                  "count jobs");
    if (rc) return rc;
    int e;
    while ((e = db_step(st)) == DB_ROW)
        json_array_append_new(*out, json_pack("{s:s,s:s,s:I,s:f,s:I}", "state", db_col_text(st, 0), "kind",
                                              db_col_text(st, 1), "count", (json_int_t)db_col_int64(st, 2), "seconds",
                                              db_col_double(st, 3), "bytes", (json_int_t)db_col_int64(st, 4)));
    db_finalize(st);
    return e < 0 ? e : 0;
}

int queue_wake_fd(catalog *c)
{
    ckpt_db *d;
    if (catalog_jobs(c, &d) || db_kind(d) != DB_PG || db_listen(d, QUEUE_CHANNEL)) return -1;
    return db_wake_fd(d);
}

bool queue_wake_drain(catalog *c)
{
    ckpt_db *d;
    return !catalog_jobs(c, &d) && db_wake_drain(d) > 0;
}

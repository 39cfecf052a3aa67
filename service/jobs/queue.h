/*
 * queue.h — the job queue (schema/002_jobs.sql), in the catalog's SQLite
 * database or in PostgreSQL (catalog_jobs(), store/catalog.h).
 *
 * A job is a kind ("import", "convert", ...) and a JSON object of arguments.
 * Life: queued -> running (claimed under a lease) -> succeeded | failed |
 * cancelled. A lease is renewed while the job's worker lives; a lease that
 * expires (daemon or worker killed) puts the job back in the queue with
 * backoff, or fails it after max_attempts. Transient failures retry with
 * exponential backoff and jitter (capped); permanent ones fail at once.
 *
 * Every write is one transaction (db_begin: BEGIN IMMEDIATE on SQLite, so
 * concurrent submitters and daemons never see SQLITE_BUSY; READ COMMITTED on
 * PostgreSQL, where several daemons claim with FOR UPDATE SKIP LOCKED and
 * change a leased job only while it is still the lease's). Submitting the
 * same kind and arguments while such a job is queued or running returns that
 * job (a partial unique index on the canonical arguments' hash). On
 * PostgreSQL a submission, a retry and a requeue NOTIFY the channel
 * ckpt_jobs, which idle daemons LISTEN on (queue_listen) instead of polling.
 */
#ifndef CKPT_SERVICE_JOBS_QUEUE_H
#define CKPT_SERVICE_JOBS_QUEUE_H

#include "store/catalog.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define QUEUE_LEASE_SECONDS 10.0
#define QUEUE_BACKOFF_BASE 1.0
#define QUEUE_BACKOFF_CAP 300.0
#define QUEUE_MAX_ARGS_BYTES (64u << 10)
#define QUEUE_MAX_LOG_LINE 4096

typedef struct {
    int64_t id;
    char *kind;
    json_t *args;
    char state[16];
    int priority, attempt, max_attempts;
    double run_after, created_at, started_at, finished_at, lease_expires;
    int64_t depends_on;
    int worker_pid;
    int64_t progress_done, progress_total; /* bytes of the running phase */
    int64_t tensors_done, tensors_total;   /* its tensors (0 of 0: the phase does not count them) */
    double progress_rate, progress_eta;    /* bytes/s since the phase began; seconds left (-1: unknown) */
    char *phase, *error, *result, *lease_owner;
    bool cancel_requested;
} queue_job;

typedef struct {
    int priority;     /* default 0; lower first */
    int max_attempts; /* 0: 3 */
    int64_t depends_on;
} queue_submit_opts;

/* A kind's name has the form of one (lowercase letters and '-', at most
 * QUEUE_KIND_MAX): submit refuses others. Which kinds exist is the job-kind
 * table's business (service/jobs/jobs_run.h): callers check the arguments
 * with jobs_args_check, which refuses an unknown kind, before they submit. */
#define QUEUE_KIND_MAX 32
bool queue_kind_valid(const char *kind);
double queue_now(void);

int queue_submit(catalog *c, const char *kind, const json_t *args, const queue_submit_opts *o, int64_t *id,
                 bool *existed);
/* The same inside the caller's transaction on d (catalog_jobs). */
int queue_submit_in(ckpt_db *d, const char *kind, const json_t *args, const queue_submit_opts *o, int64_t *id,
                    bool *existed);
/* Claims up to n runnable jobs for owner: queued, due, dependency succeeded,
 * in (priority, run_after, id) order, skipping kinds at their limit (kinds
 * lists kind names with how many more each may start; NULL: no limits). */
typedef struct {
    const char *kind;
    int room;
} queue_kind_room;
int queue_claim(catalog *c, const char *owner, int n, const queue_kind_room *rooms, size_t nrooms, queue_job **jobs,
                size_t *njobs);
int queue_set_pid(catalog *c, int64_t id, int pid);
int queue_renew(catalog *c, const char *owner, int64_t id);
/* Requeues (with backoff) or fails the running jobs whose lease expired (when
 * expire: a daemon back from losing the database first gives every owner a
 * lease's time to renew), or whose owner is a dead process of this host;
 * fails queued jobs whose dependency failed. */
int queue_reap(catalog *c, const char *self_owner, bool expire, int *requeued);
/* A running job's progress: bytes done of total, tensors done of total (0 of
 * 0 when the phase does not count tensors), the phase (NULL: unchanged), and
 * the rate and seconds left the worker measured (ckpt_progress_rate: bytes a
 * second since the phase began, 0 unknown; seconds, -1 unknown). */
typedef struct {
    int64_t done, total, tensors_done, tensors_total;
    const char *phase;
    double rate, eta;
} queue_progress_info;
int queue_progress(catalog *c, int64_t id, const queue_progress_info *p);
int queue_log(catalog *c, int64_t id, const char *line);
/* What queue_finish and queue_release return when the job is no longer
 * owner's (reaped and claimed again, or ended, meanwhile): nothing changed. */
#define QUEUE_NOT_OURS 1
/* Ends a running job: ok, or failed (transient failures retry while attempts
 * remain). owner (NULL: any) is whose lease it must still be: a job reaped
 * and claimed again meanwhile is left alone (QUEUE_NOT_OURS). */
int queue_finish(catalog *c, int64_t id, const char *owner, bool ok, bool transient, const char *error,
                 const char *result);
/* Puts a running job of owner (NULL: any) back in the queue without counting
 * the attempt (daemon shutdown); QUEUE_NOT_OURS as queue_finish. */
int queue_release(catalog *c, int64_t id, const char *owner);
/* Cancels a queued job at once; marks a running one for the daemon to stop.
 * *running tells which. */
int queue_cancel(catalog *c, int64_t id, bool *running);
int queue_mark_cancelled(catalog *c, int64_t id);
int queue_retry(catalog *c, int64_t id);
int queue_get(catalog *c, int64_t id, queue_job *out);
/* Jobs, newest first; state NULL for all (limit 0: 1000). queue_find
 * (queue_admin.h) with a state filter; defined in queue_admin.c. */
int queue_list(catalog *c, const char *state, int limit, queue_job **jobs, size_t *n);
void queue_job_free(queue_job *j);
void queue_jobs_free(queue_job *jobs, size_t n);
json_t *queue_job_json(const queue_job *j);
/* Log lines after seq `after` (0: from the start); *last gets the last seq. */
int queue_logs(catalog *c, int64_t id, int64_t after, json_t **lines, int64_t *last);
/* Counts by state and kind, for /metrics. */
int queue_counts(catalog *c, json_t **out);
/* Forgets finished jobs (succeeded, failed, cancelled) that ended before
 * `before`, with their logs, but none a queued or running job depends on;
 * *removed (may be NULL) counts them. */
int queue_prune(catalog *c, double before, int *removed);
/* Wake-ups: on PostgreSQL, LISTENs on ckpt_jobs and returns the connection's
 * socket to poll (-1 on SQLite, or while the server is unreachable: poll on a
 * timer); queue_wake_drain() after it was readable says whether a job may be
 * waiting. */
int queue_wake_fd(catalog *c);
bool queue_wake_drain(catalog *c);
/* A lease owner name for this process: "host:pid:start". malloc'd. */
char *queue_owner_self(void);
/* True when the process named by an owner string still runs. */
bool queue_owner_alive(const char *owner);

#endif

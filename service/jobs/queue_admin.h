/*
 * queue_admin.h — the queue as the dashboard and an operator see it: jobs
 * found by a filter, a page at a time, with their counts per state; the
 * attempts of a job; deleting finished jobs; one action on every job a
 * filter matches. (The life of a job is queue.h's.)
 *
 * A filter is a state and a search text, both optional:
 *   state  queued | running | retrying | succeeded | failed | cancelled;
 *          "retrying" is a queued job that ran before (attempt > 0), so the
 *          queued ones include it
 *   q      a case-insensitive substring of the kind or the JSON arguments
 */
#ifndef CKPT_SERVICE_JOBS_QUEUE_ADMIN_H
#define CKPT_SERVICE_JOBS_QUEUE_ADMIN_H

#include "service/jobs/queue.h"

/* Bulk actions go through at most this many jobs at a time. */
#define QUEUE_BULK_MAX 10000
#define QUEUE_MAX_QUERY 256

typedef struct {
    const char *state; /* NULL: any */
    const char *q;     /* NULL or "": any */
} queue_filter;

/* CKPT_EINVAL naming the field when the state is not one above or q is too long. */
int queue_filter_check(const queue_filter *f);
/* The jobs a filter matches, newest first, limit of them after skipping
 * offset; *total counts all it matches. */
int queue_find(catalog *c, const queue_filter *f, int limit, int offset, queue_job **jobs, size_t *n, int64_t *total);
/* {"all": N, "queued": N, "running": N, "retrying": N, "succeeded": N,
 * "failed": N, "cancelled": N} over the jobs q matches (f->state ignored). */
int queue_state_counts(catalog *c, const queue_filter *f, json_t **out);
/* The ended attempts of a job, oldest first (the last 20):
 * [{"attempt", "started_at"?, "finished_at", "outcome", "error"?}]. */
int queue_attempts(catalog *c, int64_t id, json_t **out);
/* The jobs that wait for job id (submitted with it as their dependency),
 * oldest first, at most QUEUE_MAX_DEPENDENTS: [{"id", "kind", "state",
 * "attempt"}] (a queued job with attempt > 0 is retrying). */
#define QUEUE_MAX_DEPENDENTS 100
int queue_dependents(catalog *c, int64_t id, json_t **out);
/* A job's JSON (queue_job_json) with its "attempts" and "dependents": what
 * `ckpt show ID` and GET /v1/jobs/{id} print. */
int queue_job_detail(catalog *c, int64_t id, json_t **out);
/* Forgets a finished job with its log and attempts. A queued or running job
 * is refused (cancel it first), as is one a queued or running job waits for. */
int queue_delete(catalog *c, int64_t id);
/* "cancel", "retry" or "delete" on every job f matches (up to
 * QUEUE_BULK_MAX, newest first). A job the action does not apply to (retry of
 * a succeeded job, ...) is skipped: *matched counts the jobs found, *done
 * those acted on. */
int queue_bulk(catalog *c, const queue_filter *f, const char *action, int *matched, int *done);

#endif

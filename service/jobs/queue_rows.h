/*
 * queue_rows.h — what queue.c shares with the other files of the queue
 * (queue_admin.c): the columns a job is read from and how, and the
 * transaction wrapper over the queue's database (common/db.h). Not for
 * callers outside service/jobs/.
 */
#ifndef CKPT_SERVICE_JOBS_QUEUE_ROWS_H
#define CKPT_SERVICE_JOBS_QUEUE_ROWS_H

#include "common/db.h"
#include "service/jobs/queue.h"

#define QUEUE_JOB_COLUMNS                                                                                              \
    "id, kind, args, state, priority, attempt, max_attempts, run_after, created_at, started_at, finished_at, "         \
    "lease_expires, depends_on, worker_pid, progress_done, progress_total, phase, error, result, lease_owner, "         \
    "cancel_requested, tensors_done, tensors_total, progress_rate, progress_eta"

/* A row of SELECT QUEUE_JOB_COLUMNS into *j (queue_job_free it). */
int queue_read_row(ckpt_stmt *st, queue_job *j);
/* Job id read on d (inside a transaction of queue_in_tx); CKPT_ENOTFOUND when none. */
int queue_get_in(ckpt_db *d, int64_t id, queue_job *out);
/* Runs fn inside one transaction of the queue's database (db_begin ..
 * db_commit, db_rollback when it fails), SQLite or PostgreSQL. */
int queue_in_tx(catalog *c, int (*fn)(ckpt_db *, void *), void *ctx);

#endif

/*
 * queue_rows.h — what queue.c shares with the other files of the queue
 * (queue_admin.c): the columns a job is read from and how, and the
 * transaction wrapper. Not for callers outside service/jobs/.
 */
#ifndef CKPT_SERVICE_JOBS_QUEUE_ROWS_H
#define CKPT_SERVICE_JOBS_QUEUE_ROWS_H

#include "service/jobs/queue.h"

#define QUEUE_JOB_COLUMNS                                                                                              \
    "id, kind, args, state, priority, attempt, max_attempts, run_after, created_at, started_at, finished_at, "         \
    "lease_expires, depends_on, worker_pid, progress_done, progress_total, phase, error, result, lease_owner, "         \
    "cancel_requested"

/* A row of SELECT QUEUE_JOB_COLUMNS into *j (queue_job_free it). */
int queue_read_row(sqlite3_stmt *st, queue_job *j);
/* Runs fn inside BEGIN IMMEDIATE .. COMMIT (ROLLBACK when it fails). */
int queue_in_tx(catalog *c, int (*fn)(catalog *, void *), void *ctx);

#endif

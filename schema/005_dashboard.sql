-- 005_dashboard.sql — what the dashboard shows that the queue and store did
-- not keep: each attempt of a job, figures per minute over the last day,
-- paused schedules and the outcome of the last verify.

-- One row per attempt that ended: when a job leaves 'running' (finished,
-- failed, put back for a retry, lost with its worker, cancelled, released at
-- shutdown), the trigger below copies what that attempt was. At most the last
-- 20 attempts of a job are kept (a job retried by hand starts again at 1).
CREATE TABLE job_attempts (
    job_id      INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,             -- 1, 2, ... per job, never reused
    attempt     INTEGER NOT NULL,             -- the job's attempt number then
    started_at  REAL,
    finished_at REAL NOT NULL,
    outcome     TEXT NOT NULL,                -- succeeded, failed, retrying, cancelled, released
    error       TEXT,
    PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;

CREATE TRIGGER job_attempt_ended AFTER UPDATE OF state ON jobs
WHEN OLD.state = 'running' AND NEW.state <> 'running'
BEGIN
    INSERT INTO job_attempts(job_id, seq, attempt, started_at, finished_at, outcome, error)
    VALUES (NEW.id, (SELECT coalesce(max(seq), 0) + 1 FROM job_attempts WHERE job_id = NEW.id), OLD.attempt,
            OLD.started_at, coalesce(NEW.finished_at, (julianday('now') - 2440587.5) * 86400.0),
            CASE WHEN NEW.state <> 'queued' THEN NEW.state
                 WHEN NEW.attempt < OLD.attempt THEN 'released' ELSE 'retrying' END,
            NEW.error);
    DELETE FROM job_attempts WHERE job_id = NEW.id
        AND seq <= (SELECT max(seq) FROM job_attempts WHERE job_id = NEW.id) - 20;
END;

-- Figures per minute (bucket: unix seconds, a multiple of 60) for the
-- dashboard's charts; the daemon deletes rows older than a day
-- (service/jobs/stats.h). Names:
--   jobs.succeeded, jobs.failed   jobs that ended so, per kind (a trigger)
--   bytes.<kind>                  the last progress of jobs of that kind that succeeded (a trigger)
--   bytes.served                  HTTP body bytes sent (the daemon, each sample)
--   queue.depth, workers.busy     the highest sample of the minute (the daemon)
CREATE TABLE stats (
    bucket INTEGER NOT NULL,
    name   TEXT NOT NULL,
    kind   TEXT NOT NULL DEFAULT '',
    value  INTEGER NOT NULL,
    PRIMARY KEY (bucket, name, kind)
) WITHOUT ROWID;

CREATE TRIGGER job_ended_stats AFTER UPDATE OF state ON jobs
WHEN NEW.state IN ('succeeded', 'failed') AND OLD.state <> NEW.state
BEGIN
    INSERT INTO stats(bucket, name, kind, value)
    VALUES (CAST(strftime('%s', 'now') AS INTEGER) / 60 * 60, 'jobs.' || NEW.state, NEW.kind, 1)
    ON CONFLICT DO UPDATE SET value = value + 1;
    INSERT INTO stats(bucket, name, kind, value)
    SELECT CAST(strftime('%s', 'now') AS INTEGER) / 60 * 60, 'bytes.' || NEW.kind, '', NEW.progress_done
    WHERE NEW.state = 'succeeded' AND NEW.progress_done > 0
    ON CONFLICT DO UPDATE SET value = value + excluded.value;
END;

-- A paused schedule is not queued when due; resuming it lets it run at its
-- next_run_at (at once when that has passed).
ALTER TABLE schedules ADD COLUMN paused INTEGER NOT NULL DEFAULT 0;

-- The last verify of each checkpoint (store/store_verify.c writes it), and
-- the last 100 verify runs (of one checkpoint or the whole store).
CREATE TABLE verify_checkpoints (
    checkpoint_id INTEGER PRIMARY KEY REFERENCES checkpoints(id) ON DELETE CASCADE,
    at            REAL NOT NULL,
    ok            INTEGER NOT NULL,
    error         TEXT
);
CREATE TABLE verify_runs (
    id                  INTEGER PRIMARY KEY,
    at                  REAL NOT NULL,
    ref                 TEXT,                 -- NULL: the whole store
    clean               INTEGER NOT NULL,
    damaged_blobs       INTEGER NOT NULL,
    checkpoints_checked INTEGER NOT NULL,
    broken_checkpoints  INTEGER NOT NULL
);

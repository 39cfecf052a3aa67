-- 002_jobs.sql — the job queue: what the daemon runs, in worker processes.

CREATE TABLE jobs (
    id             INTEGER PRIMARY KEY,
    kind           TEXT NOT NULL,
    args           TEXT NOT NULL,                 -- JSON object
    state          TEXT NOT NULL DEFAULT 'queued'
                   CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    priority       INTEGER NOT NULL DEFAULT 0,    -- lower runs first
    attempt        INTEGER NOT NULL DEFAULT 0,
    max_attempts   INTEGER NOT NULL DEFAULT 3,
    run_after      REAL NOT NULL,                 -- unix seconds
    lease_owner    TEXT,
    lease_expires  REAL,
    worker_pid     INTEGER,
    progress_done  INTEGER NOT NULL DEFAULT 0,
    progress_total INTEGER NOT NULL DEFAULT 0,
    phase          TEXT,
    error          TEXT,
    result         TEXT,
    created_at     REAL NOT NULL,
    started_at     REAL,
    finished_at    REAL,
    depends_on     INTEGER REFERENCES jobs(id) ON DELETE SET NULL,
    unique_key     TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0
);
-- Submitting the same kind and arguments while one is queued or running returns that job.
CREATE UNIQUE INDEX jobs_unique_active ON jobs(unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('queued', 'running');
CREATE INDEX jobs_claim ON jobs(state, priority, run_after, id);

CREATE TABLE job_logs (
    job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    seq    INTEGER NOT NULL,
    at     REAL NOT NULL,
    line   TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;

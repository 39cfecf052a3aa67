-- 006_job_ids.sql — job ids are never used twice, and a job's progress counts
-- tensors as well as bytes.
--
-- `jobs.id INTEGER PRIMARY KEY` gave a new job the largest id in the table
-- plus one: after the newest job was deleted or pruned, the next job took its
-- id, and a client still waiting on that id (`ckpt wait N`, a dashboard tab,
-- a schedule's last_job_id) read another job. AUTOINCREMENT keeps the largest
-- id ever handed out in sqlite_sequence, so ids only grow. SQLite cannot add
-- it to an existing table: the table is made again under a new name, the rows
-- copied with their ids, the old one dropped (catalog.c runs migrations with
-- foreign keys off, so job_logs and job_attempts keep their rows, and checks
-- them before committing) and the new one renamed to `jobs`. Dropping `jobs`
-- dropped its indexes and the two triggers of 005, made again below as they
-- were. The sequence starts past every id still known anywhere: the jobs
-- kept, and the last job each schedule queued (possibly pruned already).
--
-- tensors_done / tensors_total: the tensors the running phase has finished,
-- of how many (0 and 0 when the phase does not count tensors, as a download).

CREATE TABLE jobs_new (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
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
    depends_on     INTEGER REFERENCES jobs_new(id) ON DELETE SET NULL,
    unique_key     TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    tensors_done   INTEGER NOT NULL DEFAULT 0,
    tensors_total  INTEGER NOT NULL DEFAULT 0
);
INSERT INTO jobs_new(id, kind, args, state, priority, attempt, max_attempts, run_after, lease_owner, lease_expires,
                     worker_pid, progress_done, progress_total, phase, error, result, created_at, started_at,
                     finished_at, depends_on, unique_key, cancel_requested)
    SELECT id, kind, args, state, priority, attempt, max_attempts, run_after, lease_owner, lease_expires,
           worker_pid, progress_done, progress_total, phase, error, result, created_at, started_at,
           finished_at, depends_on, unique_key, cancel_requested FROM jobs ORDER BY id;
DROP TABLE jobs;
ALTER TABLE jobs_new RENAME TO jobs;
-- The copy set the sequence to the largest id kept; a schedule may remember a later one.
INSERT INTO sqlite_sequence(name, seq) SELECT 'jobs', 0 WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'jobs');
UPDATE sqlite_sequence SET seq = max(seq, coalesce((SELECT max(last_job_id) FROM schedules), 0)) WHERE name = 'jobs';

CREATE UNIQUE INDEX jobs_unique_active ON jobs(unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('queued', 'running');
CREATE INDEX jobs_claim ON jobs(state, priority, run_after, id);
-- The jobs waiting for one (a job's page, deleting and pruning).
CREATE INDEX jobs_depends_on ON jobs(depends_on) WHERE depends_on IS NOT NULL;

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

-- 005_dashboard.sql (PostgreSQL) — the queue's part of ../005_dashboard.sql:
-- each attempt of a job, figures per minute, paused schedules. The same
-- tables in PostgreSQL's types, and the same two triggers as plpgsql
-- functions, so the C code is one on both engines. (verify_checkpoints and
-- verify_runs belong to the store's catalog, which stays in SQLite.)
--
-- Two daemons never end the same attempt at once: the UPDATE that moves a job
-- out of 'running' holds that job's row lock until its transaction commits,
-- so the trigger's max(seq) + 1 of one job is read by one writer at a time.
-- The stats upserts are INSERT .. ON CONFLICT, which PostgreSQL makes safe
-- between concurrent writers.

CREATE TABLE job_attempts (
    job_id      bigint NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    seq         integer NOT NULL,             -- 1, 2, ... per job, never reused
    attempt     integer NOT NULL,             -- the job's attempt number then
    started_at  double precision,
    finished_at double precision NOT NULL,
    outcome     text NOT NULL,                -- succeeded, failed, retrying, cancelled, released
    error       text,
    PRIMARY KEY (job_id, seq)
);

CREATE FUNCTION ckpt_job_attempt_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    next_seq integer;
BEGIN
    SELECT coalesce(max(seq), 0) + 1 INTO next_seq FROM job_attempts WHERE job_id = NEW.id;
    INSERT INTO job_attempts(job_id, seq, attempt, started_at, finished_at, outcome, error)
    VALUES (NEW.id, next_seq, OLD.attempt, OLD.started_at,
            coalesce(NEW.finished_at, extract(epoch FROM clock_timestamp())),
            CASE WHEN NEW.state <> 'queued' THEN NEW.state
                 WHEN NEW.attempt < OLD.attempt THEN 'released' ELSE 'retrying' END,
            NEW.error);
    DELETE FROM job_attempts WHERE job_id = NEW.id AND seq <= next_seq - 20;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_attempt_ended AFTER UPDATE OF state ON jobs
FOR EACH ROW WHEN (OLD.state = 'running' AND NEW.state <> 'running')
EXECUTE FUNCTION ckpt_job_attempt_ended();

-- Names and writers as in ../005_dashboard.sql (bucket: unix seconds, a
-- multiple of 60; the daemon deletes rows older than a day).
CREATE TABLE stats (
    bucket bigint NOT NULL,
    name   text NOT NULL,
    kind   text NOT NULL DEFAULT '',
    value  bigint NOT NULL,
    PRIMARY KEY (bucket, name, kind)
);

CREATE FUNCTION ckpt_job_ended_stats() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    minute bigint := floor(extract(epoch FROM clock_timestamp()) / 60)::bigint * 60;
BEGIN
    INSERT INTO stats(bucket, name, kind, value) VALUES (minute, 'jobs.' || NEW.state, NEW.kind, 1)
    ON CONFLICT (bucket, name, kind) DO UPDATE SET value = stats.value + 1;
    IF NEW.state = 'succeeded' AND NEW.progress_done > 0 THEN
        INSERT INTO stats(bucket, name, kind, value) VALUES (minute, 'bytes.' || NEW.kind, '', NEW.progress_done)
        ON CONFLICT (bucket, name, kind) DO UPDATE SET value = stats.value + excluded.value;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_ended_stats AFTER UPDATE OF state ON jobs
FOR EACH ROW WHEN (NEW.state IN ('succeeded', 'failed') AND OLD.state <> NEW.state)
EXECUTE FUNCTION ckpt_job_ended_stats();

-- A paused schedule is not queued when due (0 or 1, as in SQLite).
ALTER TABLE schedules ADD COLUMN paused integer NOT NULL DEFAULT 0;

-- 008_attempt_clock.sql — an attempt never ends before it started.
--
-- A job's started_at is the claiming process's clock (gettimeofday, in
-- microseconds). When an attempt ends with the job going back to the queue
-- (a retry, a release) its end is the database's own clock, which SQLite
-- reads in whole milliseconds: an attempt claimed and ended within one
-- millisecond was recorded as ending before it started, and a wall clock
-- stepped back (NTP on a machine just booted) does the same with any gap.
-- The recorded end is now at least the start.

DROP TRIGGER job_attempt_ended;

CREATE TRIGGER job_attempt_ended AFTER UPDATE OF state ON jobs
WHEN OLD.state = 'running' AND NEW.state <> 'running'
BEGIN
    INSERT INTO job_attempts(job_id, seq, attempt, started_at, finished_at, outcome, error)
    VALUES (NEW.id, (SELECT coalesce(max(seq), 0) + 1 FROM job_attempts WHERE job_id = NEW.id), OLD.attempt,
            OLD.started_at,
            max(coalesce(OLD.started_at, 0), coalesce(NEW.finished_at, (julianday('now') - 2440587.5) * 86400.0)),
            CASE WHEN NEW.state <> 'queued' THEN NEW.state
                 WHEN NEW.attempt < OLD.attempt THEN 'released' ELSE 'retrying' END,
            NEW.error);
    DELETE FROM job_attempts WHERE job_id = NEW.id
        AND seq <= (SELECT max(seq) FROM job_attempts WHERE job_id = NEW.id) - 20;
END;

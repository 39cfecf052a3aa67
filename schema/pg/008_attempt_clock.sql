-- As ../008_attempt_clock.sql: an attempt's recorded end is at least its
-- start (the claiming host's clock may be ahead of the server's, or step).

CREATE OR REPLACE FUNCTION ckpt_job_attempt_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    next_seq integer;
BEGIN
    SELECT coalesce(max(seq), 0) + 1 INTO next_seq FROM job_attempts WHERE job_id = NEW.id;
    INSERT INTO job_attempts(job_id, seq, attempt, started_at, finished_at, outcome, error)
    VALUES (NEW.id, next_seq, OLD.attempt, OLD.started_at,
            greatest(coalesce(OLD.started_at, 0),
                     coalesce(NEW.finished_at, extract(epoch FROM clock_timestamp()))),
            CASE WHEN NEW.state <> 'queued' THEN NEW.state
                 WHEN NEW.attempt < OLD.attempt THEN 'released' ELSE 'retrying' END,
            NEW.error);
    DELETE FROM job_attempts WHERE job_id = NEW.id AND seq <= next_seq - 20;
    RETURN NULL;
END
$$;

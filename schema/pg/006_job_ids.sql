-- 006_job_ids.sql (PostgreSQL) — the twin of ../006_job_ids.sql.
--
-- Job ids: nothing to change. jobs.id is an identity column, whose sequence
-- only moves forward (a deleted or pruned job's id, even one a rolled-back
-- insert took, is never handed out again), and queue.c never inserts an id
-- of its own. SQLite's 006 rebuilds its table to get the same behaviour; the
-- jobs_depends_on index it adds is in ./002_jobs.sql already.
--
-- tensors_done / tensors_total: the tensors the running phase has finished,
-- of how many (0 and 0 when the phase does not count tensors).

ALTER TABLE jobs ADD COLUMN tensors_done bigint NOT NULL DEFAULT 0,
                 ADD COLUMN tensors_total bigint NOT NULL DEFAULT 0;

-- 007_progress_rate.sql — a running job's rate and time left, as its worker
-- measured them.
--
-- progress_rate: bytes a second the running phase has moved since it began
-- (ckpt_progress_rate in common/log.c: the bytes done, less those a resumed
-- download had already, over the seconds since the phase started), at the
-- worker's last progress report; 0 while unknown.
-- progress_eta: the seconds the phase still needs at that rate (0 once all
-- its bytes are done; -1 while unknown: nothing moved yet, or a phase without
-- a total). Both are reset when a job starts an attempt or is retried.

ALTER TABLE jobs ADD COLUMN progress_rate REAL NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN progress_eta REAL NOT NULL DEFAULT -1;

-- 007_progress_rate.sql (PostgreSQL) — the twin of ../007_progress_rate.sql:
-- a running job's rate (bytes a second since its phase began) and the
-- seconds its phase still needs, at the worker's last progress report.

ALTER TABLE jobs ADD COLUMN progress_rate double precision NOT NULL DEFAULT 0,
                 ADD COLUMN progress_eta double precision NOT NULL DEFAULT -1;

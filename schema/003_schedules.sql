-- 003_schedules.sql — scheduled Hub syncs (`ckpt sync add/ls/rm/run`).
-- The daemon queues one `sync` job {"schedule": id} when next_run_at has
-- passed (the job queue's unique key keeps it to one at a time) and moves
-- next_run_at past now, so after downtime a missed schedule runs once. The
-- sync job resolves the revision and, when the commit changed, queues a
-- fetch and one convert per layout.

CREATE TABLE schedules (
    id            INTEGER PRIMARY KEY,
    repo          TEXT NOT NULL,                -- ORG/NAME
    revision      TEXT NOT NULL DEFAULT 'main',
    every_seconds INTEGER,                      -- --every, or NULL
    cron          TEXT,                         -- --cron "M H DOM MON DOW" (UTC), or NULL
    layouts       TEXT NOT NULL DEFAULT '[]',   -- JSON [{"layout": L, "tp": N}, ...]
    fetch_args    TEXT NOT NULL DEFAULT '{}',   -- JSON {"include": [...], "exclude": [...]}
    next_run_at   REAL NOT NULL,                -- unix seconds
    last_run_at   REAL,                         -- when its sync job last looked at the Hub
    last_commit   TEXT,                         -- the commit it saw
    last_outcome  TEXT,                         -- what it did, or why it failed
    last_job_id   INTEGER,                      -- the last sync job queued
    created_at    REAL NOT NULL,
    CHECK ((every_seconds IS NULL) != (cron IS NULL)),
    CHECK (every_seconds IS NULL OR every_seconds > 0)
);
CREATE INDEX schedules_due ON schedules(next_run_at);

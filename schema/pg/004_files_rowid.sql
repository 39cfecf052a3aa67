-- 004_files_rowid.sql (PostgreSQL) — nothing to change: ../004 makes SQLite's
-- `files` a rowid table so its key lookups skip the headers; PostgreSQL's
-- primary key is an index beside the rows already (001_store.sql). The number
-- is kept so both dialects count the same migrations.
COMMENT ON TABLE files IS 'one row per file of a checkpoint; header: the exact first 8 + N bytes of a safetensors file';

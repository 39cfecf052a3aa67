-- 004_files_rowid.sql — `files` becomes a rowid table.
-- As a WITHOUT ROWID table, a row of `files` was a key of its B-tree, with the
-- safetensors header (tens of KiB for a file of many tensors) inside it; every
-- lookup by (checkpoint_id, path) — the foreign-key check of each `tensors`
-- row inserted — read whole headers off overflow pages to compare keys: a
-- layout of 1,578 tensors took 2.4 s to commit. Now the primary key is an index
-- of the two key columns only. Rows are copied as they are; catalog.c turns
-- foreign keys off around migrations (dropping the old table must not cascade
-- to `tensors`) and checks them before committing.

CREATE TABLE files_new (
    checkpoint_id INTEGER NOT NULL REFERENCES checkpoints(id) ON DELETE CASCADE,
    path          TEXT NOT NULL,
    size          INTEGER NOT NULL,
    sha256        TEXT NOT NULL,
    blob          TEXT,   -- whole-file blob, for files that are not safetensors
    header        BLOB,   -- the exact first 8 + N bytes of a safetensors file
    PRIMARY KEY (checkpoint_id, path)
);
INSERT INTO files_new(checkpoint_id, path, size, sha256, blob, header)
    SELECT checkpoint_id, path, size, sha256, blob, header FROM files;
DROP TABLE files;
ALTER TABLE files_new RENAME TO files;

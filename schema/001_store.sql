-- 001_store.sql — the catalog of stored checkpoints.
-- A checkpoint is a set of files; a safetensors file is its exact header plus,
-- per tensor, a blob (the tensor's bytes, named by their sha256) or a recipe
-- (parts over blobs, as the planner made them). Other files are whole blobs.

CREATE TABLE checkpoints (
    id          INTEGER PRIMARY KEY,
    repo        TEXT NOT NULL,
    revision    TEXT NOT NULL,            -- as given: branch, tag or commit
    commit_sha  TEXT NOT NULL,            -- the commit (or a content id for local imports)
    layout      TEXT NOT NULL DEFAULT '', -- '' for an original, else e.g. 'neuron-tp8'
    source_id   INTEGER REFERENCES checkpoints(id) ON DELETE SET NULL,
    lossy       INTEGER NOT NULL DEFAULT 0,
    total_size  INTEGER NOT NULL,         -- logical bytes of all files
    created_at  INTEGER NOT NULL,
    UNIQUE (repo, commit_sha, layout)
);
CREATE INDEX checkpoints_by_revision ON checkpoints(repo, revision, layout);

CREATE TABLE files (
    checkpoint_id INTEGER NOT NULL REFERENCES checkpoints(id) ON DELETE CASCADE,
    path          TEXT NOT NULL,
    size          INTEGER NOT NULL,
    sha256        TEXT NOT NULL,
    blob          TEXT,   -- whole-file blob, for files that are not safetensors
    header        BLOB,   -- the exact first 8 + N bytes of a safetensors file
    PRIMARY KEY (checkpoint_id, path)
) WITHOUT ROWID;

CREATE TABLE tensors (
    checkpoint_id INTEGER NOT NULL,
    path          TEXT NOT NULL,
    name          TEXT NOT NULL,
    blob          TEXT,   -- the tensor's bytes, stored whole
    recipe        TEXT,   -- JSON parts over blobs, when not stored whole
    PRIMARY KEY (checkpoint_id, path, name),
    FOREIGN KEY (checkpoint_id, path) REFERENCES files(checkpoint_id, path) ON DELETE CASCADE,
    CHECK ((blob IS NULL) != (recipe IS NULL))
) WITHOUT ROWID;

-- Every blob a checkpoint needs (tensor blobs, recipe inputs, whole files):
-- what gc keeps and what verify reports a damaged blob against.
CREATE TABLE checkpoint_blobs (
    checkpoint_id INTEGER NOT NULL REFERENCES checkpoints(id) ON DELETE CASCADE,
    blob          TEXT NOT NULL,
    PRIMARY KEY (checkpoint_id, blob)
) WITHOUT ROWID;
CREATE INDEX checkpoint_blobs_by_blob ON checkpoint_blobs(blob);

-- Blobs being written by a live process that has not committed its
-- checkpoint yet; gc keeps them. Rows of dead processes are stale.
CREATE TABLE blob_leases (
    blob       TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    start_time INTEGER NOT NULL,  -- the process start time, against pid reuse
    PRIMARY KEY (blob, pid, start_time)
) WITHOUT ROWID;

-- Names that point at checkpoints: revisions (branches, tags) of a repo. The
-- newest import under a name wins.
CREATE TABLE refs (
    repo          TEXT NOT NULL,
    name          TEXT NOT NULL,
    checkpoint_id INTEGER NOT NULL REFERENCES checkpoints(id) ON DELETE CASCADE,
    updated_at    INTEGER NOT NULL,
    PRIMARY KEY (repo, name)
) WITHOUT ROWID;

/*
 * store.h — the content-addressed store under CKPT_HOME.
 *
 *   CKPT_HOME/ckpt.db          the catalog (catalog.h, schema/)
 *   CKPT_HOME/blobs/ab/cdef..  blobs: tensor bytes or whole files, named by sha256
 *   CKPT_HOME/tmp/             staging: blobs being written, pulls being assembled
 *
 * Durability: a blob is written to tmp/, its sha256 leased in the catalog
 * (blob_leases, so a concurrent gc keeps it), made durable (syncfs), renamed
 * into blobs/ and the directory synced; only then does one catalog
 * transaction make the checkpoint visible and drop the leases. A process
 * killed at any point leaves either nothing visible or a complete
 * checkpoint; what it leaves in tmp/ and blobs/ is found by gc (leases and
 * temp names carry the writer's pid and start time).
 *
 * Refs: "REPO@REV" names an original (REV a branch/tag name given at import,
 * or a commit, or a unique commit prefix); "REPO@REV:LAYOUT" a converted one.
 * Without @REV the newest checkpoint of the repo is meant.
 */
#ifndef CKPT_STORE_STORE_H
#define CKPT_STORE_STORE_H

#include "store/catalog.h"

#include <jansson.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STORE_MAX_FILES 100000
#define STORE_MAX_PATH 1024

struct s3_client;
typedef struct store_uploads store_uploads;

typedef struct {
    char *home;
    char *blob_dir;
    char *tmp_dir;
    catalog cat;
    /* blobs in a bucket (CKPT_BLOBS=s3://BUCKET/PREFIX, store_blobs.c); all
     * NULL for the local blobs/ folder */
    char *s3_bucket, *s3_prefix, *cache_dir;
    struct s3_client *s3; /* opened on first use */
    store_uploads *uploads; /* blobs being uploaded (store_blob_submit) */
    uint64_t cache_limit; /* bytes blob-cache/ may hold (CKPT_BLOB_CACHE_MB) */
    /* requests, retries and bytes received of the readers of ranges
     * (blob_ranges.h), added atomically as their clients close */
    uint64_t s3_requests, s3_retries, s3_bytes;
} ckpt_store;

typedef struct {
    int64_t id;
    char *repo, *revision, *commit, *layout;
    int64_t source_id; /* 0 when none */
    bool lossy;
    int64_t total_size, created_at;
} store_ckpt;

/* home NULL: $CKPT_HOME, else $XDG_DATA_HOME/ckpt, else ~/.local/share/ckpt. */
int store_open(ckpt_store *s, const char *home);
void store_close(ckpt_store *s);
/* "<tmp>/<kind>-<pid>-<start time>": a base for temp names that gc can tell
 * apart from a live process's work. malloc'd. */
char *store_tmp_base(const ckpt_store *s, const char *kind);
/* blobs/ab/cdef...; malloc'd. */
char *store_blob_path(const ckpt_store *s, const char *sha256);
/* The start time of this process (store_proc_start_time, cached), against
 * pid reuse in leases and temp names. */
int64_t store_self_start_time(void);

/* ---- where blobs live (store_blobs.c) ---- */

/* Reads CKPT_BLOBS (the CLI's --blobs and the config's blobs set it): unset
 * or empty is the local blobs/ folder; s3://BUCKET/PREFIX a bucket, with
 * endpoint, region and credentials from the AWS_* variables (store/s3.h).
 * store_open calls it. */
int store_blobs_config(ckpt_store *s);
void store_blobs_close(ckpt_store *s);
bool store_blobs_remote(const ckpt_store *s);
/* PREFIX/ab/cdef...: the object of blob sha in the bucket; malloc'd. */
char *store_blob_key(const ckpt_store *s, const char *sha);
/* Whether blob sha is stored (a stat, or a HEAD), and its size. */
int store_blob_stat(ckpt_store *s, const char *sha, bool *exists, uint64_t *size);
/* A file holding blob sha's bytes, for the few readers that need a whole
 * file (config.json, an index, ckpt-layout.json, a torch.save file, a LoRA
 * merge's base weight): the blob itself in the local folder, else a copy in
 * CKPT_HOME/blob-cache fetched with ranged GETs and checked against sha
 * first. The cache holds at most CKPT_BLOB_CACHE_MB (default 1024) MB: each
 * download first evicts the least recently used copies; only the one blob
 * being read may exceed it. Tensor bytes of pulls, ranks and served files
 * never come through here (blob_ranges.h). NULL on failure, with the error
 * set (CKPT_ECORRUPT when the blob is missing or damaged). malloc'd. */
char *store_blob_read_path(ckpt_store *s, const char *sha);
/* The name of blob sha as a plan's source file: store_blob_path for the
 * local folder, "s3://BUCKET/KEY" for a bucket (read in ranges through
 * blob_ranges.h, never downloaded whole). malloc'd. */
char *store_blob_source_path(const ckpt_store *s, const char *sha);
/* Bytes [0, size) of blob sha from the bucket into fd (ranged GETs). */
int store_blob_copy_to_fd(ckpt_store *s, const char *sha, uint64_t size, int fd);
/* Re-hashes blob sha where it lives: *exists, and its bytes' sha256 in hex. */
int store_blob_hash(ckpt_store *s, const char *sha, bool *exists, char hex[65]);
/* Every blob in the bucket (LIST): its sha256, size and last-modified time. */
typedef int (*store_blob_list_cb)(void *ud, const char *sha, uint64_t size, int64_t mtime);
int store_blob_list(ckpt_store *s, store_blob_list_cb cb, void *ud);
/* Deletes blob sha from the bucket (and its cached copy). */
int store_blob_delete(ckpt_store *s, const char *sha);

/* ---- writing blobs ---- */

/* A blob being written: bytes go to fd (a temp file in tmp/), hash alongside. */
typedef struct {
    int fd;
    char *tmp_path;
    void *hash; /* ckpt_sha256 */
    uint64_t size;
    char sha256[65];
    bool submitted; /* handed to the uploads (store_blob_submit) */
} store_blob_writer;

int store_blob_begin(ckpt_store *s, store_blob_writer *w);
int store_blob_write(store_blob_writer *w, const void *buf, size_t len);
/* Finishes the hash; the temp file stays until store_blobs_publish. */
int store_blob_end(store_blob_writer *w);
void store_blob_abort(store_blob_writer *w);
/* For a writer that fills w->fd itself, at any offsets and from several
 * places at once (a parallel download), and hashes the bytes as it verifies
 * them: records size and sha256 (64 hex digits) in place of
 * store_blob_write/store_blob_end. The caller vouches for the hash. */
int store_blob_end_external(store_blob_writer *w, uint64_t size, const char *sha256);

/* Uploads finished blobs' temp files to the bucket (a bucket only): each
 * once (If-None-Match), CKPT_S3_UPLOADS (default 4) at a time, each thread
 * with its own connection; a temp is removed once its upload is
 * acknowledged (crash point blob.published). The blobs submitted already
 * (store_blob_submit) are waited for, the others queued. The first failure
 * stops the rest and is returned. */
int store_blobs_upload(ckpt_store *s, store_blob_writer *ws, size_t n);
/* A bucket only (else nothing): leases w's name and queues its finished
 * temp for upload at once, so the uploads run while the caller stages the
 * next blobs (import). Waits while 512 MiB submitted are not yet
 * acknowledged; returns an earlier upload's failure. The upload is waited
 * for by store_blobs_publish (store_blobs_upload). */
int store_blob_submit(ckpt_store *s, store_blob_writer *w);
/* Whether the last upload acknowledged found its blob in the bucket already
 * (a 412, or a HEAD of the same size before a multipart upload): import's
 * hint that the tensors which follow may be stored too. */
bool store_blobs_upload_found_stored(ckpt_store *s);
/* Waits for the submitted uploads and stops their threads (cancel: takes no
 * more from the queue, and returns no error); the first failure otherwise. */
int store_blobs_uploads_end(ckpt_store *s, bool cancel);
/* Passes the crash point blob.published once for each upload acknowledged
 * since the last call (from the thread that leases, between transactions). */
void store_blobs_published_points(ckpt_store *s);
/* Queues w's finished temp for upload (store_blob_submit without the lease,
 * which the caller holds). */
int store_blobs_enqueue(ckpt_store *s, store_blob_writer *w);

/* Publishes finished blobs: leases their names, syncs the temp files, renames
 * them into blobs/ (dropping a temp whose blob already exists) or uploads
 * them (a bucket), syncs. The writers are closed and freed. */
int store_blobs_publish(ckpt_store *s, store_blob_writer *ws, size_t n);
/* Leases blob sha256 for this process (so no gc removes it before the
 * checkpoint using it commits) and says whether it is stored already with
 * that size: then a writer can skip writing those bytes. */
int store_blob_claim(ckpt_store *s, const char *sha256, uint64_t size, bool *have);
/* Leases the n blobs a new checkpoint will reference without writing them
 * (a layout's recipes over its source's blobs), then checks they exist: a
 * concurrent rm + gc can no longer take them away before the commit. */
int store_blobs_lease(ckpt_store *s, char *const *shas, size_t n);
/* The same in two steps, for a caller with other work meanwhile: _begin
 * leases and starts the check on threads of its own (in a local store a stat
 * each, tens of thousands of cold inodes for a many-tensor checkpoint, up to
 * 8 at once; in a bucket the check runs before _begin returns); _end waits
 * for it and names the first blob of the list that is missing. shas stays
 * valid until _end; nothing may rely on the blobs before _end returned 0.
 * After _begin returned 0, _end must be called. */
typedef struct store_blobs_check store_blobs_check;
int store_blobs_lease_begin(ckpt_store *s, char *const *shas, size_t n, store_blobs_check **out);
int store_blobs_lease_end(store_blobs_check *c);
/* How long a lease holds on PostgreSQL unless renewed (each lease a writer
 * takes renews all of its own). gc on another host keeps a blob until its
 * lease expires; on this host, until its writer is gone. */
#define STORE_LEASE_SECONDS 3600
/* This host's name (gethostname), as leases record it. */
const char *store_host_name(void);
/* Drops this process's leases (after the checkpoint committed or on failure). */
int store_leases_release(ckpt_store *s);
/* The same on a failure path: the failure's message stays the message (a
 * full disk is reported where it struck, not as the release that failed
 * after it); leases left behind are stale once this process exits. */
void store_leases_release_after_error(ckpt_store *s);

/* ---- checkpoints ---- */

/* A checkpoint as the catalog records it, ready to commit. */
typedef struct {
    char *name;
    char *blob;   /* sha256 of the bytes, or NULL */
    char *recipe; /* JSON parts over blobs, or NULL */
} store_tensor_rec;

typedef struct {
    char *path;
    uint64_t size;
    char sha256[65];
    char *blob;      /* whole-file blob (not safetensors) */
    uint8_t *header; /* safetensors: exact header bytes */
    size_t header_len;
    size_t ntensors, cap;
    store_tensor_rec *tensors;
} store_file_rec;

typedef struct {
    const char *repo, *revision, *commit, *layout;
    int64_t source_id;
    bool lossy;
    size_t nfiles, cap;
    store_file_rec *files;
    /* Every blob the recipes name (repeats allowed), from a writer that made
     * the recipes and knows them (store_convert): the commit records these
     * rather than parse each recipe back. NULL: it reads them from the
     * recipes. */
    char *const *recipe_blobs;
    size_t nrecipe_blobs;
} store_ckpt_rec;

void store_ckpt_rec_free(store_ckpt_rec *r);
/* Inserts the checkpoint, its files, tensors and blob references, points the
 * ref (repo, revision) at it and drops this process's leases, in one
 * transaction. The blobs must be published already. When the same (repo,
 * commit, layout) was committed meanwhile, that one stands: *id is its id and
 * *existed (may be NULL) is set. */
int store_commit_checkpoint(ckpt_store *s, const store_ckpt_rec *r, int64_t *id, bool *existed);
/* Adds the files of r (none of whose paths checkpoint id has) to checkpoint
 * id, points the ref (r->repo, r->revision) at it and drops this process's
 * leases, in one transaction (a fetch topping up a commit fetched with
 * narrower --include patterns). The blobs must be published already. A
 * checkpoint removed meanwhile is CKPT_ENOTFOUND, saying so. */
int store_add_files(ckpt_store *s, int64_t id, const store_ckpt_rec *r);
/* The id of (repo, commit, layout), or 0. */
int store_find(ckpt_store *s, const char *repo, const char *commit, const char *layout, int64_t *id);
/* Points ref (repo, name) at id. */
int store_set_ref(ckpt_store *s, const char *repo, const char *name, int64_t id);

typedef struct {
    const char *repo;     /* ORG/NAME */
    const char *revision; /* NULL: "main" */
    bool quiet;
} store_import_opts;

/* The content id of a checkpoint made here rather than fetched (an import
 * without a commit, a merge): sha256 over "path\0sha256\n" of its files in
 * the order given (path order), 40 hex digits. */
int store_content_id(const store_ckpt_rec *r, char out[41]);

/* Imports a Hugging Face directory; *existed when the same content was there. */
int store_import_dir(ckpt_store *s, const char *dir, const store_import_opts *o, store_ckpt *out, bool *existed);

/* Splits "REPO[@REV][:LAYOUT]"; pieces malloc'd (rev/layout NULL when absent). */
int store_ref_parse(const char *ref, char **repo, char **rev, char **layout);
int store_resolve(ckpt_store *s, const char *ref, store_ckpt *out);
int store_get(ckpt_store *s, int64_t id, store_ckpt *out);
/* "repo@revision" or "repo@revision:layout"; malloc'd. */
char *store_ckpt_ref(const store_ckpt *c);
void store_ckpt_free(store_ckpt *c);
/* The one rule for the path of a stored file (import, fetch, every catalog
 * commit): relative, '/'-separated, at most STORE_MAX_PATH bytes, no empty or
 * '.' segment, no '..', '\\', '://' or control character anywhere, segments
 * of at most 255 bytes: the names every reader (pull, verify, serve, the
 * index parser) gives back. An error names the path. */
int store_path_check(const char *path);
/* Checks "ORG/NAME": safe characters, one slash. */
int store_repo_name_check(const char *repo);

/* A stored file as the catalog records it. */
typedef struct {
    char *path;
    uint64_t size;
    char sha256[65];
    char *blob;      /* whole-file blob, or NULL for a safetensors file */
    uint8_t *header; /* safetensors: the exact header bytes */
    size_t header_len;
} store_file_row;

/* The files of checkpoint id, in path order. A layout's safetensors file
 * converted inside the store has sha256 "" until it is first needed: a
 * convert commits without reading the source bytes, and store_hash_pending
 * (materialize.h) fills it in. */
int store_files_load(ckpt_store *s, int64_t id, store_file_row **rows, size_t *n);
void store_files_free(store_file_row *rows, size_t n);
/* Whether checkpoint id has such a file (path, or any when path is NULL). */
int store_files_pending(ckpt_store *s, int64_t id, const char *path, bool *any);
/* Records the sha256 of a pending file (no change when it is known). */
int store_file_set_sha256(ckpt_store *s, int64_t id, const char *path, const char *sha256);

/* The tensors of a checkpoint stored whole (tensors.blob), looked up by file
 * path and tensor name: read in one query, where a lookup each would prepare
 * and run one statement per tensor (a many-tensor checkpoint has tens of
 * thousands). v is sorted by (path, name). */
typedef struct {
    const char *path, *name, *blob; /* one allocation each row, freed by path */
} store_tensor_blob;
typedef struct {
    store_tensor_blob *v;
    size_t n;
} store_tensor_blobs;
int store_tensor_blobs_load(ckpt_store *s, int64_t id, store_tensor_blobs *out);
/* The blob of tensor name of file path, or NULL when it has none. */
const char *store_tensor_blobs_find(const store_tensor_blobs *t, const char *path,
                                    const char *name);
/* The same, copied (malloc'd); CKPT_ECORRUPT naming the file and the tensor
 * when it has none. */
int store_tensor_blobs_get(const store_tensor_blobs *t, const char *path, const char *name,
                           char **out);
void store_tensor_blobs_free(store_tensor_blobs *t);

/* ---- maintenance (store_maint.c) ---- */

/* Start time (clock ticks after boot) of process pid, or -1 when it is gone
 * or has exited (a zombie its parent has not reaped is no longer a writer). */
int64_t store_proc_start_time(int pid);

typedef struct {
    uint64_t blobs_removed, bytes_freed, temps_removed, leases_dropped;
} store_gc_result;

/* Deletes blobs no checkpoint references and nobody leases, leftovers of
 * killed writers in tmp/, and stale leases; dry_run only counts. */
int store_gc(ckpt_store *s, bool dry_run, store_gc_result *res);

typedef struct {
    uint64_t logical;  /* bytes of every file of every checkpoint */
    uint64_t physical; /* bytes of the blob files on disk */
    uint64_t blobs, checkpoints, db_bytes;
} store_du_result;

int store_du(ckpt_store *s, store_du_result *res);
/* The JSON of `ckpt du --json` and GET /v1/store: {"checkpoints", "logical_bytes",
 * "physical_bytes", "blobs", "catalog_bytes", "dedup_ratio"}. */
json_t *store_du_json(const store_du_result *r);
/* Removes a checkpoint from the catalog (its blobs go at the next gc). */
int store_rm(ckpt_store *s, const store_ckpt *c);

/* Called by store_verify for each problem found (a line for people). */
typedef void (*store_verify_report)(void *ctx, const char *line);
/* Re-hashes the blobs of one checkpoint (id != 0) or of all, and reports each
 * damaged or missing blob with the checkpoints and files it breaks. *damaged
 * counts them. The full check (this, then every file rebuilt) is
 * store_verify (store_verify.h), which `ckpt verify` and the verify job use. */
int store_verify_blobs(ckpt_store *s, int64_t id, store_verify_report report, void *ctx, uint64_t *damaged);

#endif

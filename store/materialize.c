/* materialize.c — stored checkpoint -> directory (see materialize.h). */
#include "store/materialize.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/util.h"
#include "transform/convert.h"
#include "plan/executor.h"
#include "store/blob_ranges.h"
#include "store/rebuild.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Executor threads of a pull from a bucket (each holds one connection). */
#define MATERIALIZE_REMOTE_THREADS 4

typedef struct {
    char *path, *out_rel, *blob, sha256[65];
    uint64_t size;
    uint8_t *header;
    size_t header_len;
} stored_file;

typedef struct {
    ckpt_store *s;
    int64_t id;
    stored_file *files;
    size_t nfiles, cap;
    exec_plan exec;
    plan_tensor *tensors; /* owned, one per output tensor */
    size_t ntensors, tcap;
    json_t *path_index; /* blob path -> index in exec.src_paths (rebuild_ctx) */
    bool pending_only;  /* only safetensors files whose sha256 is not known yet ... */
    const char *only;   /* ... and of those only this path (NULL: all) */
} pull_state;

static bool file_pending(const char *sha256, const uint8_t *header)
{
    return header && !*sha256;
}

/* The rank of a vLLM sharded-state file, "model-rank-<R>-part-<P>.safetensors"
 * in the checkpoint's top folder (the vllm layout's rank_files), or -1. */
static int vllm_file_rank(const char *path)
{
    static const char pre[] = "model-rank-";
    if (strchr(path, '/') || strncmp(path, pre, sizeof pre - 1)) return -1;
    char *end;
    long r = strtol(path + sizeof pre - 1, &end, 10);
    if (end == path + sizeof pre - 1 || strncmp(end, "-part-", 6) || r < 0 || r >= 100000) return -1;
    char *end2;
    (void)strtol(end + 6, &end2, 10);
    if (end2 == end + 6 || strcmp(end2, ".safetensors")) return -1;
    return (int)r;
}

const char *materialize_rank_path(const char *path, int rank)
{
    if (rank < 0) return path;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "tp_rank_%02d/", rank);
    if (!strncmp(path, prefix, strlen(prefix))) return path + strlen(prefix);
    if (strchr(path, '/')) return NULL;
    int vr = vllm_file_rank(path);
    if (vr >= 0 && vr != rank) return NULL;
    return path;
}

/* The number of tp_rank_NN/ folders of a file list, or of vLLM's
 * model-rank-N-part-P files (0: not tensor-parallel): ranks are numbered
 * 0 .. n-1. */
static int count_ranks(const store_file_row *rows, size_t n)
{
    int max = -1;
    for (size_t i = 0; i < n; i++) {
        const char *p = rows[i].path;
        int vr = vllm_file_rank(p);
        if (vr > max) max = vr;
        if (strncmp(p, "tp_rank_", 8)) continue;
        char *end;
        long r = strtol(p + 8, &end, 10);
        if (end != p + 8 && *end == '/' && r >= 0 && r < 100000 && r > max) max = (int)r;
    }
    return max + 1;
}

int materialize_rank_check_files(const store_file_row *rows, size_t n, int64_t id, int rank)
{
    if (rank < 0) return 0;
    int ranks = count_ranks(rows, n);
    if (ranks == 0)
        return ckpt_error_set(CKPT_EINVAL,
                              "rank %d: checkpoint %lld is not tensor-parallel (no tp_rank_NN/ "
                              "folders); pull it without a rank",
                              rank, (long long)id);
    if (rank >= ranks)
        return ckpt_error_set(CKPT_EINVAL, "rank %d is out of range: checkpoint %lld has ranks 0-%d",
                              rank, (long long)id, ranks - 1);
    return 0;
}

int materialize_rank_check(ckpt_store *s, const store_ckpt *c, int rank)
{
    store_file_row *rows;
    size_t n;
    int rc = store_files_load(s, c->id, &rows, &n);
    if (rc) return rc;
    rc = materialize_rank_check_files(rows, n, c->id, rank);
    store_files_free(rows, n);
    return rc;
}

static int load_files(pull_state *ps, int rank)
{
    store_file_row *rows;
    size_t n;
    int rc = store_files_load(ps->s, ps->id, &rows, &n);
    if (rc) return rc;
    if ((rc = materialize_rank_check_files(rows, n, ps->id, rank))) {
        store_files_free(rows, n);
        return rc;
    }
    for (size_t i = 0; !rc && i < n; i++) {
        const char *keep = materialize_rank_path(rows[i].path, rank);
        if (!keep) continue;
        bool wanted = file_pending(rows[i].sha256, rows[i].header) && (!ps->only || !strcmp(ps->only, rows[i].path));
        if (ps->pending_only && !wanted) continue;
        char *rel = ckpt_strdup(keep);
        if (!rel) {
            rc = CKPT_ENOMEM;
            break;
        }
        if ((rc = ckpt_grow(&ps->files, &ps->cap, ps->nfiles + 1, sizeof *ps->files))) {
            free(rel);
            break;
        }
        stored_file *f = &ps->files[ps->nfiles++];
        /* Take the row's strings over. */
        *f = (stored_file){.path = rows[i].path, .out_rel = rel, .blob = rows[i].blob, .size = rows[i].size,
                           .header = rows[i].header, .header_len = rows[i].header_len};
        memcpy(f->sha256, rows[i].sha256, sizeof f->sha256);
        rows[i].path = rows[i].blob = NULL;
        rows[i].header = NULL;
    }
    store_files_free(rows, n);
    if (!rc && ps->nfiles == 0 && !ps->pending_only)
        rc = ckpt_error_set(CKPT_ENOTFOUND, "nothing to pull (no files for rank %d)", rank);
    return rc;
}

typedef struct {
    pull_state *ps;
    ckpt_stmt *st;
} lookup_ctx;

static char *blob_path_cb(void *ctx, const char *sha256)
{
    return store_blob_source_path(((lookup_ctx *)ctx)->ps->s, sha256);
}

static int lookup_cb(void *ctx, const char *path, const char *name, const char **blob, const char **recipe)
{
    lookup_ctx *lc = ctx;
    db_reset(lc->st);
    db_bind_int64(lc->st, 1, lc->ps->id);
    db_bind_text(lc->st, 2, path);
    db_bind_text(lc->st, 3, name);
    if (db_step(lc->st) != DB_ROW)
        return ckpt_error_set(CKPT_ECORRUPT, "catalog: %s: tensor '%s' has no record", path, name);
    *blob = db_col_text(lc->st, 0);
    *recipe = db_col_text(lc->st, 1);
    return 0;
}

/* The executor's plan of one stored safetensors file (rebuild.c). */
static int plan_file(pull_state *ps, stored_file *f, exec_file *ef)
{
    lookup_ctx lc = {.ps = ps};
    int rc = catalog_prepare(&ps->s->cat, &lc.st,
                             "SELECT blob, recipe FROM tensors WHERE checkpoint_id = ? AND path = ? AND name = ?");
    if (rc) return rc;
    rebuild_ctx rb = {.exec = &ps->exec,
                      .tensors = ps->tensors,
                      .ntensors = &ps->ntensors,
                      .blob_path = blob_path_cb,
                      .lookup = lookup_cb,
                      .ctx = &lc,
                      .path_index = ps->path_index};
    rc = rebuild_plan_file(&rb, f->path, f->out_rel, f->header, f->header_len, f->size, ef);
    db_finalize(lc.st);
    return rc;
}

static int check_blobs_exist(pull_state *ps)
{
    if (store_blobs_remote(ps->s)) return 0; /* a missing object fails its first GET, named */
    for (size_t i = 0; i < ps->exec.nsrc_paths; i++)
        if (access(ps->exec.src_paths[i], R_OK) < 0)
            return ckpt_error_set(CKPT_ECORRUPT, "blob %s is missing from the store (run ckpt verify)",
                                  ckpt_basename(ps->exec.src_paths[i]));
    return 0;
}

static int copy_plain(pull_state *ps, stored_file *f, const char *tmp)
{
    bool remote = store_blobs_remote(ps->s); /* ranged GETs straight into the file */
    char *src = remote ? NULL : store_blob_read_path(ps->s, f->blob), *dst = ckpt_path_join(tmp, f->out_rel);
    int rc = (src || remote) && dst ? 0 : CKPT_ENOMEM;
    char *slash = dst ? strrchr(dst, '/') : NULL;
    if (!rc && slash) {
        *slash = 0;
        rc = ckpt_mkdir_p(dst, 0755);
        *slash = '/';
    }
    int in = rc || remote ? -1 : open(src, O_RDONLY | O_CLOEXEC);
    if (!rc && !remote && in < 0)
        rc = ckpt_error_set(CKPT_ECORRUPT, "blob %s (file %s) is missing from the store", f->blob, f->path);
    int out = rc ? -1 : open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (!rc && out < 0) rc = ckpt_error_sys("%s: create", dst);
    if (!rc && remote) rc = store_blob_copy_to_fd(ps->s, f->blob, f->size, out);
    else if (!rc) rc = ckpt_copy_range(in, 0, out, 0, f->size, src);
    if (!rc && fsync(out) < 0) rc = ckpt_error_sys("%s: fsync", dst);
    if (in >= 0) close(in);
    if (out >= 0) close(out);
    free(src);
    free(dst);
    return rc;
}

/* Hashing is most of a pull's CPU, so it runs alongside the copying. An
 * original's blobs are hashed as the executor reads them (each once) and
 * checked against their names; a layout's safetensors files (recipes over
 * blobs, or one rank reading a fraction of each blob) are hashed as their
 * tensors land (exec_opts.out_sha256) and checked against the catalog. Plain
 * files (config.json, ...) are hashed after copying, by VERIFY_THREADS threads
 * taking them in turn. Either way a damaged blob fails the pull before DST
 * exists. */
#define VERIFY_THREADS 2
/* Threads hashing pending layout files (store_hash_pending). */
#define STORE_HASH_THREADS 2

typedef struct {
    pull_state *ps;
    const char *tmp;
    pthread_mutex_t mu;
    size_t next;
    int rc;
    char msg[1024];
} verify_ctx;

static void *verify_main(void *arg)
{
    verify_ctx *v = arg;
    for (;;) {
        pthread_mutex_lock(&v->mu);
        size_t i = v->next++;
        bool stop = v->rc || i >= v->ps->nfiles;
        pthread_mutex_unlock(&v->mu);
        if (stop) return NULL;
        stored_file *f = &v->ps->files[i];
        if (f->header) continue; /* verified while written (exec_run) */
        char *path = ckpt_path_join(v->tmp, f->out_rel);
        char hex[65];
        int rc = path ? ckpt_sha256_file_hex(path, hex) : CKPT_ENOMEM;
        free(path);
        if (!rc && strcmp(hex, f->sha256))
            rc = ckpt_error_set(CKPT_ECORRUPT,
                                "%s: the rebuilt file has sha256 %s, the catalog says %s: a blob is damaged "
                                "(run ckpt verify); nothing was written",
                                f->path, hex, f->sha256);
        if (rc) {
            pthread_mutex_lock(&v->mu);
            if (!v->rc) {
                v->rc = rc;
                snprintf(v->msg, sizeof v->msg, "%s", ckpt_error_last());
            }
            pthread_mutex_unlock(&v->mu);
        }
    }
}

static int verify_written(pull_state *ps, const char *tmp)
{
    verify_ctx v = {.ps = ps, .tmp = tmp};
    pthread_mutex_init(&v.mu, NULL);
    pthread_t th[VERIFY_THREADS];
    int started = 0;
    for (int i = 0; i < VERIFY_THREADS && (size_t)i < ps->nfiles; i++)
        if (pthread_create(&th[i], NULL, verify_main, &v) == 0) started++;
    if (started == 0) verify_main(&v);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&v.mu);
    return v.rc ? ckpt_error_set(v.rc, "%s", v.msg) : 0;
}

/* Every blob hashed to its name (sources[].name is the blob's sha256). */
static int check_blob_hashes(const pull_state *ps, char (*got)[65])
{
    for (size_t i = 0; i < ps->exec.nsources; i++) {
        const plan_source *src = &ps->exec.sources[i];
        if (strcmp(got[src->file], src->name))
            return ckpt_error_set(CKPT_ECORRUPT,
                                  "blob %s is damaged (its bytes hash to %s): the checkpoint cannot be rebuilt "
                                  "(run ckpt verify); nothing was written",
                                  src->name, got[src->file]);
    }
    return 0;
}

/* Every safetensors file written hashed to the catalog's sha256 (exec files
 * are the stored files with a header, in order). */
static int check_file_hashes(const pull_state *ps, char (*got)[65])
{
    size_t k = 0;
    for (size_t i = 0; i < ps->nfiles; i++) {
        const stored_file *f = &ps->files[i];
        if (!f->header) continue;
        if (*f->sha256 && strcmp(got[k], f->sha256))
            return ckpt_error_set(CKPT_ECORRUPT,
                                  "%s: the rebuilt file has sha256 %s, the catalog says %s: a blob is damaged "
                                  "(run ckpt verify); nothing was written",
                                  f->path, got[k], f->sha256);
        k++;
    }
    return 0;
}

static void pull_free(pull_state *ps)
{
    for (size_t i = 0; i < ps->nfiles; i++) {
        free(ps->files[i].path);
        free(ps->files[i].out_rel);
        free(ps->files[i].blob);
        free(ps->files[i].header);
    }
    free(ps->files);
    for (size_t i = 0; i < ps->ntensors; i++) plan_tensor_free(&ps->tensors[i]);
    free(ps->tensors);
    exec_plan_free(&ps->exec);
    json_decref(ps->path_index);
}

/* The executor's plan of every stored file of c (of one rank, or all: -1)
 * into ps, its blobs checked present; with pending, only the files whose
 * sha256 is not known yet (only that one when only is not NULL). */
static int plan_pull_sel(pull_state *ps, ckpt_store *s, const store_ckpt *c, int rank, bool pending, const char *only)
{
    memset(ps, 0, sizeof *ps);
    ps->s = s;
    ps->id = c->id;
    ps->pending_only = pending;
    ps->only = only;
    /* Every catalog read of the plan in one read transaction (a WAL snapshot:
     * writers are not blocked): a concurrent rm either happened before it (a
     * clear error) or not at all as far as this pull is concerned. The bytes
     * come from blobs, which only gc removes. */
    bool pg = catalog_on_pg(&s->cat); /* a snapshot there is a REPEATABLE READ transaction */
    int rc = catalog_exec(&s->cat, pg ? "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY" : "SAVEPOINT materialize_read");
    bool in_read = rc == 0;
    if (!rc) {
        ckpt_stmt *st;
        rc = catalog_prepare(&s->cat, &st, "SELECT 1 FROM checkpoints WHERE id = ?");
        if (!rc) {
            db_bind_int64(st, 1, c->id);
            if (db_step(st) != DB_ROW)
                rc = ckpt_error_set(CKPT_ENOTFOUND, "checkpoint %lld (%s@%.12s%s%s) was removed before it could be read",
                                    (long long)c->id, c->repo, c->commit, *c->layout ? ":" : "", c->layout);
            db_finalize(st);
        }
    }
    if (!rc) rc = load_files(ps, rank);
    size_t total_tensors = 0;
    for (size_t i = 0; !rc && i < ps->nfiles; i++) {
        if (!ps->files[i].header) continue;
        st_file sf;
        if (st_parse(&sf, ps->files[i].path, ps->files[i].header, ps->files[i].header_len, ps->files[i].size) < 0) {
            rc = ckpt_error_prefix(CKPT_ECORRUPT, "stored header");
            break;
        }
        total_tensors += sf.ntensors;
        st_close(&sf);
    }
    if (!rc) {
        ps->tensors = ckpt_calloc(total_tensors + 1, sizeof *ps->tensors);
        ps->exec.files = ckpt_calloc(ps->nfiles + 1, sizeof *ps->exec.files);
        ps->path_index = json_object();
        if (!ps->tensors || !ps->exec.files || !ps->path_index) rc = CKPT_ENOMEM;
    }
    for (size_t i = 0; !rc && i < ps->nfiles; i++) {
        if (!ps->files[i].header) continue;
        rc = plan_file(ps, &ps->files[i], &ps->exec.files[ps->exec.nfiles++]);
    }
    if (in_read) catalog_exec(&s->cat, pg ? "COMMIT" : "RELEASE materialize_read");
    if (!rc) rc = check_blobs_exist(ps);
    return rc;
}

static int plan_pull(pull_state *ps, ckpt_store *s, const store_ckpt *c, int rank)
{
    return plan_pull_sel(ps, s, c, rank, false, NULL);
}

/* The hashes of the pending files of ps (exec files are ps's files with a
 * header, in order) into the catalog. */
static int record_file_hashes(const pull_state *ps, char (*got)[65])
{
    int rc = 0;
    size_t k = 0;
    for (size_t i = 0; !rc && i < ps->nfiles; i++) {
        const stored_file *f = &ps->files[i];
        if (!f->header) continue;
        if (!*f->sha256) rc = store_file_set_sha256(ps->s, ps->id, f->path, got[k]);
        k++;
    }
    return rc;
}

int store_hash_pending(ckpt_store *s, const store_ckpt *c, int rank, const char *path, bool quiet)
{
    bool any;
    int rc = store_files_pending(s, c->id, path, &any);
    if (rc || !any) return rc;
    pull_state ps;
    store_blob_ranges ranges; /* blobs in a bucket: ranged GETs, no local copies */
    rc = plan_pull_sel(&ps, s, c, rank, true, path);
    if (!rc) rc = store_blob_ranges_attach(s, &ps.exec, &ranges);
    char(*sha)[65] = NULL;
    if (!rc && ps.exec.nfiles) {
        sha = ckpt_calloc(ps.exec.nfiles, sizeof *sha);
        rc = sha ? exec_hash_outputs(&ps.exec, STORE_HASH_THREADS, "hashing", quiet, sha) : CKPT_ENOMEM;
        if (!rc) rc = record_file_hashes(&ps, sha);
    }
    free(sha);
    ps.exec.vsource = NULL;
    pull_free(&ps);
    return rc ? ckpt_error_prefix(rc, "%s@%.12s:%s: compute the sha256 of its files", c->repo, c->commit, c->layout) : 0;
}

int store_materialize(ckpt_store *s, const store_ckpt *c, const char *dst, const materialize_opts *o)
{
    pull_state ps;
    store_blob_ranges ranges;
    int rc = plan_pull(&ps, s, c, o->rank);
    char *tmp = NULL;
    if (!rc) rc = store_blob_ranges_attach(s, &ps.exec, &ranges);
    if (!rc) rc = outdir_prepare(dst, o->force, &tmp);
    if (!rc) {
        /* An original's files are its blobs end to end, each read whole:
         * checking the blobs is checking the files. A layout's files are
         * checked themselves, which also vouches for the recipes and the
         * executor. Blobs in a bucket are read in ranges, never as files:
         * the files written are checked instead. */
        bool verify_blobs = ps.exec.nsrc_paths && (!c->layout || !*c->layout) && !ps.exec.vsource;
        char(*blob_sha)[65] = verify_blobs ? ckpt_calloc(ps.exec.nsrc_paths, sizeof *blob_sha) : NULL;
        char(*out_sha)[65] = !verify_blobs && ps.exec.nfiles ? ckpt_calloc(ps.exec.nfiles, sizeof *out_sha) : NULL;
        if (verify_blobs ? !blob_sha : ps.exec.nfiles && !out_sha) rc = CKPT_ENOMEM;
        /* ranged GETs wait on the network more than on a core: more at once */
        int threads = o->threads > 0 ? o->threads : ps.exec.vsource ? MATERIALIZE_REMOTE_THREADS : 0;
        exec_opts eo = {.threads = threads,
                        .quiet = o->quiet,
                        .label = "pull",
                        .hash_sources = verify_blobs,
                        .hash_fresh = true,
                        .source_sha256 = blob_sha,
                        .out_sha256 = out_sha};
        if (!rc) rc = exec_run(&ps.exec, tmp, &eo);
        if (!rc && verify_blobs) rc = check_blob_hashes(&ps, blob_sha);
        if (!rc && out_sha) rc = check_file_hashes(&ps, out_sha);
        free(blob_sha);
        for (size_t i = 0; !rc && i < ps.nfiles; i++)
            if (!ps.files[i].header) rc = copy_plain(&ps, &ps.files[i], tmp);
        if (!rc) rc = verify_written(&ps, tmp);
        if (!rc) rc = outdir_commit(tmp, dst, o->force);
        if (rc) ckpt_rm_rf(tmp);
        /* First use of a layout converted in the store: what was written is
         * what its files are, and the catalog keeps that for later readers
         * (a failure here costs a later reader the hashing, not this pull). */
        if (!rc && out_sha && record_file_hashes(&ps, out_sha))
            ckpt_warn("%s: the files' sha256 were not recorded: %s", dst, ckpt_error_last());
        free(out_sha);
        free(tmp);
    }
    pull_free(&ps);
    return rc;
}

int store_files_load_hashed(ckpt_store *s, const store_ckpt *c, int rank, store_file_row **rows, size_t *n)
{
    int rc = store_hash_pending(s, c, rank, NULL, true);
    return rc ? rc : store_files_load(s, c->id, rows, n);
}

/* ---- random access to one stored file (HTTP serving) ---- */

struct store_file_reader {
    pull_state ps;
    stored_file *file; /* in ps.files */
    exec_file *ef;     /* NULL for a whole-blob file */
    int *fds;          /* open ps.exec.src_paths (-1: blobs in a bucket) */
    int blob_fd;       /* whole-blob file */
    uint8_t *slab, *band;
    exec_slab_cache cache;   /* what the slab holds; .vts: the S3 reader */
    store_blob_ranges ranges; /* blobs in a bucket */
};

void store_file_close(store_file_reader *r)
{
    if (!r) return;
    if (r->cache.vts) store_blob_ranges_close(&r->ranges, r->cache.vts);
    for (size_t i = 0; r->fds && i < r->ps.exec.nsrc_paths; i++)
        if (r->fds[i] >= 0) close(r->fds[i]);
    free(r->fds);
    if (r->blob_fd >= 0) close(r->blob_fd);
    free(r->slab);
    free(r->band);
    pull_free(&r->ps);
    free(r);
}

int store_file_open(store_file_reader **out, ckpt_store *s, const store_ckpt *c, const char *path)
{
    *out = NULL;
    /* A layout file's sha256 (its ETag, the Hub's lfs oid) once, before the first read. */
    int prc = store_hash_pending(s, c, -1, path, true);
    return prc ? prc : store_file_open_unhashed(out, s, c, path);
}

int store_file_open_unhashed(store_file_reader **out, ckpt_store *s, const store_ckpt *c, const char *path)
{
    *out = NULL;
    store_file_reader *r = ckpt_calloc(1, sizeof *r);
    if (!r) return CKPT_ENOMEM;
    r->blob_fd = -1;
    r->ps.s = s;
    r->ps.id = c->id;
    int rc = load_files(&r->ps, -1);
    for (size_t i = 0; !rc && i < r->ps.nfiles; i++)
        if (!strcmp(r->ps.files[i].path, path)) r->file = &r->ps.files[i];
    if (!rc && !r->file) rc = ckpt_error_set(CKPT_ENOTFOUND, "no file '%s' in this checkpoint", path);
    bool remote = store_blobs_remote(s);
    if (!rc) rc = store_blob_ranges_attach(s, &r->ps.exec, &r->ranges);
    if (!rc && remote && !(r->cache.vts = store_blob_ranges_open(&r->ranges))) rc = CKPT_EIO; /* error set */
    if (!rc && remote && !r->file->header) {
        /* read in ranges (store_file_read) */
    } else if (!rc && !r->file->header) {
        char *bp = store_blob_read_path(s, r->file->blob);
        r->blob_fd = bp ? open(bp, O_RDONLY | O_CLOEXEC) : -1;
        if (r->blob_fd < 0) rc = ckpt_error_set(CKPT_ECORRUPT, "blob of '%s' is missing from the store", path);
        free(bp);
    } else if (!rc) {
        st_file sf;
        rc = st_parse(&sf, path, r->file->header, r->file->header_len, r->file->size);
        if (!rc) {
            r->ps.tensors = ckpt_calloc(sf.ntensors + 1, sizeof *r->ps.tensors);
            r->ps.exec.files = ckpt_calloc(2, sizeof *r->ps.exec.files);
            st_close(&sf);
            if (!r->ps.tensors || !r->ps.exec.files) rc = CKPT_ENOMEM;
        }
        if (!rc) {
            r->ef = &r->ps.exec.files[r->ps.exec.nfiles++];
            rc = plan_file(&r->ps, r->file, r->ef);
        }
        if (!rc) rc = check_blobs_exist(&r->ps);
        r->fds = rc ? NULL : ckpt_calloc(r->ps.exec.nsrc_paths + 1, sizeof *r->fds);
        if (!rc && !r->fds) rc = CKPT_ENOMEM;
        for (size_t i = 0; r->fds && i < r->ps.exec.nsrc_paths; i++) r->fds[i] = -1;
        for (size_t i = 0; !rc && !remote && i < r->ps.exec.nsrc_paths; i++) {
            r->fds[i] = open(r->ps.exec.src_paths[i], O_RDONLY | O_CLOEXEC);
            if (r->fds[i] < 0) rc = ckpt_error_sys("%s: open", r->ps.exec.src_paths[i]);
        }
        if (!rc) rc = exec_check_sources(&r->ps.exec, r->fds); /* blobs as long as the recipes read */
    }
    if (rc) {
        store_file_close(r);
        return rc;
    }
    *out = r;
    return 0;
}

uint64_t store_file_size(const store_file_reader *r)
{
    return r->file->size;
}

const char *store_file_sha256(const store_file_reader *r)
{
    return r->file->sha256;
}

int store_file_read(store_file_reader *r, uint64_t off, void *buf, size_t len)
{
    if (off > r->file->size || len > r->file->size - off) return ckpt_error_set(CKPT_EINVAL, "read past the end of '%s'", r->file->path);
    if (!r->ef && r->blob_fd < 0) return store_blob_ranges_read(r->cache.vts, r->file->blob, off, len, buf);
    if (!r->ef) return ckpt_pread_full(r->blob_fd, buf, len, off, r->file->path);
    uint8_t *out = buf;
    /* The header, then tensors in offset order. */
    if (off < r->file->header_len) {
        size_t n = r->file->header_len - off < len ? (size_t)(r->file->header_len - off) : len;
        memcpy(out, r->file->header + off, n);
        out += n;
        off += n;
        len -= n;
    }
    const st_layout *l = &r->ef->layout;
    size_t lo = 0, hi = l->ntensors;
    while (lo < hi) { /* first tensor ending after off */
        size_t mid = (lo + hi) / 2;
        if (l->tensors[mid].offset + l->tensors[mid].nbytes <= off) lo = mid + 1;
        else hi = mid;
    }
    for (size_t i = lo; len && i < l->ntensors; i++) {
        const st_out_tensor *ot = &l->tensors[i];
        uint64_t in_t = off - ot->offset;
        size_t n = ot->nbytes - in_t < len ? (size_t)(ot->nbytes - in_t) : len;
        if (n && (!r->slab || !r->band)) {
            if (!r->slab) r->slab = malloc(EXEC_READ_SLAB_BYTES);
            if (!r->band) r->band = malloc(EXEC_BAND_BYTES);
            if (!r->slab || !r->band) return ckpt_error_set(CKPT_ENOMEM, "out of memory for read buffers");
        }
        int rc = n ? exec_tensor_read(&r->ps.exec, r->fds, r->ef->tensors[ot->user], in_t, out, n, r->slab, r->band, &r->cache) : 0;
        if (rc) return rc;
        out += n;
        off += n;
        len -= n;
    }
    return len ? ckpt_error_set(CKPT_ECORRUPT, "'%s': bytes past the last tensor", r->file->path) : 0;
}

/* ---- pull --consolidated from stored parts ---- */

struct store_stored_plan {
    pull_state ps;
};

/* A stored safetensors file as its header alone, the rest of its size a hole. */
static int write_header_only(const stored_file *f, const char *dir)
{
    char *dst = ckpt_path_join(dir, f->out_rel);
    int rc = dst ? 0 : CKPT_ENOMEM;
    char *slash = dst ? strrchr(dst, '/') : NULL;
    if (!rc && slash) {
        *slash = 0;
        rc = ckpt_mkdir_p(dst, 0755);
        *slash = '/';
    }
    int fd = rc ? -1 : open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (!rc && fd < 0) rc = ckpt_error_sys("%s: create", dst);
    if (!rc) rc = ckpt_write_full(fd, f->header, f->header_len, dst);
    if (!rc && ftruncate(fd, (off_t)f->size) < 0) rc = ckpt_error_sys("%s: truncate", dst);
    if (fd >= 0) close(fd);
    free(dst);
    return rc;
}

int store_materialize_headers(ckpt_store *s, const store_ckpt *c, const char *dir, store_stored_plan **out)
{
    store_stored_plan *p = ckpt_calloc(1, sizeof *p);
    if (!p) return CKPT_ENOMEM;
    int rc = plan_pull(&p->ps, s, c, -1);
    for (size_t i = 0; !rc && i < p->ps.nfiles; i++)
        rc = p->ps.files[i].header ? write_header_only(&p->ps.files[i], dir) : copy_plain(&p->ps, &p->ps.files[i], dir);
    if (!rc) rc = verify_written(&p->ps, dir); /* the plain files; the others are checked once consolidated */
    if (rc) {
        store_stored_plan_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

const exec_plan *store_stored_plan_exec(const store_stored_plan *p)
{
    return &p->ps.exec;
}

void store_stored_plan_free(store_stored_plan *p)
{
    if (!p) return;
    pull_free(&p->ps);
    free(p);
}

/* store.c — CKPT_HOME, blobs with leases, checkpoint records and refs (see store.h). */
#include "store/store.h"

#include "format/checkpoint.h"

#include "common/error.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/sha256.h"
#include "common/util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int64_t store_proc_start_time(int pid)
{
    return ckpt_proc_start_time(pid);
}

/* A catalog on PostgreSQL names blobs every process sharing it must reach:
 * the bucket, or this host's blobs/ folder. */
static int claim_blobs(ckpt_store *s)
{
    if (!catalog_on_pg(&s->cat)) return 0;
    char real[4096];
    if (!store_blobs_remote(s) && !realpath(s->blob_dir, real)) snprintf(real, sizeof real, "%s", s->blob_dir);
    char *where = store_blobs_remote(s) ? ckpt_sprintf("s3://%s/%s", s->s3_bucket, s->s3_prefix ? s->s3_prefix : "")
                                        : ckpt_sprintf("%s:%s", store_host_name(), real);
    int rc = where ? catalog_claim_blobs(&s->cat, where) : CKPT_ENOMEM;
    free(where);
    return rc;
}

int store_open(ckpt_store *s, const char *home)
{
    memset(s, 0, sizeof *s);
    const char *env = getenv("CKPT_HOME"), *xdg = getenv("XDG_DATA_HOME"), *h = getenv("HOME");
    if (home && *home) s->home = ckpt_strdup(home);
    else if (env && *env) s->home = ckpt_strdup(env);
    else if (xdg && *xdg) s->home = ckpt_sprintf("%s/ckpt", xdg);
    else if (h && *h) s->home = ckpt_sprintf("%s/.local/share/ckpt", h);
    else return ckpt_error_set(CKPT_EINVAL, "no CKPT_HOME, XDG_DATA_HOME or HOME: pass --home DIR");
    if (!s->home) return CKPT_ENOMEM;
    s->blob_dir = ckpt_path_join(s->home, "blobs");
    s->tmp_dir = ckpt_path_join(s->home, "tmp");
    char *db = ckpt_path_join(s->home, "ckpt.db");
    int rc = s->blob_dir && s->tmp_dir && db ? 0 : CKPT_ENOMEM;
    /* CKPT_HOME is the user's alone: the catalog holds job arguments and logs
     * (a folder that exists already keeps its mode: the owner chose it). */
    if (!rc) rc = ckpt_mkdir_p(s->home, 0700);
    if (!rc) rc = ckpt_mkdir_p(s->blob_dir, 0755);
    if (!rc) rc = ckpt_mkdir_p(s->tmp_dir, 0755);
    if (!rc) rc = store_blobs_config(s);
    if (!rc) rc = catalog_open(&s->cat, db);
    free(db);
    if (!rc) rc = claim_blobs(s);
    if (rc) store_close(s);
    return rc;
}

void store_close(ckpt_store *s)
{
    catalog_close(&s->cat);
    store_blobs_close(s);
    free(s->home);
    free(s->blob_dir);
    free(s->tmp_dir);
    memset(s, 0, sizeof *s);
}


/* ---- blobs ---- */

int store_blob_begin(ckpt_store *s, store_blob_writer *w)
{
    memset(w, 0, sizeof *w);
    w->fd = -1;
    char *base = store_tmp_base(s, "blob");
    w->tmp_path = base ? ckpt_sprintf("%s-XXXXXX", base) : NULL;
    free(base);
    if (!w->tmp_path) return CKPT_ENOMEM;
    w->fd = mkostemp(w->tmp_path, O_CLOEXEC);
    if (w->fd < 0) {
        int rc = ckpt_error_sys("%s: create", w->tmp_path);
        free(w->tmp_path);
        w->tmp_path = NULL;
        return rc;
    }
    ckpt_sha256 *h = ckpt_malloc(sizeof *h);
    int rc = h ? ckpt_sha256_init(h) : CKPT_ENOMEM;
    w->hash = h;
    if (rc) store_blob_abort(w);
    return rc;
}

int store_blob_write(store_blob_writer *w, const void *buf, size_t len)
{
    int rc = ckpt_sha256_update(w->hash, buf, len);
    if (!rc) rc = ckpt_pwrite_full(w->fd, buf, len, w->size, w->tmp_path);
    w->size += len;
    return rc;
}

int store_blob_end(store_blob_writer *w)
{
    int rc = ckpt_sha256_final_hex(w->hash, w->sha256);
    free(w->hash);
    w->hash = NULL;
    /* The temp file is complete: its descriptor goes now, not at publish, so
     * an import of thousands of tensors holds a few descriptors, not one per
     * tensor (publish syncs the filesystem, closed files included). */
    if (!rc && w->fd >= 0 && close(w->fd) < 0) rc = ckpt_error_sys("%s: close", w->tmp_path);
    w->fd = -1;
    if (!rc) ckpt_fault("blob.written");
    return rc;
}

int store_blob_end_external(store_blob_writer *w, uint64_t size, const char *sha256)
{
    size_t n = strspn(sha256, "0123456789abcdef");
    if (n != 64 || sha256[64]) return ckpt_error_set(CKPT_EINVAL, "%s: '%.70s' is not a sha256", w->tmp_path, sha256);
    if (w->hash) {
        ckpt_sha256_free(w->hash);
        free(w->hash);
        w->hash = NULL;
    }
    w->size = size;
    memcpy(w->sha256, sha256, 65);
    return 0;
}

void store_blob_abort(store_blob_writer *w)
{
    if (w->hash) {
        ckpt_sha256_free(w->hash);
        free(w->hash);
    }
    if (w->fd >= 0) close(w->fd);
    if (w->tmp_path) unlink(w->tmp_path);
    free(w->tmp_path);
    memset(w, 0, sizeof *w);
    w->fd = -1;
}

const char *store_host_name(void)
{
    static char host[256];
    if (!host[0] && (gethostname(host, sizeof host - 1) < 0 || !host[0])) snprintf(host, sizeof host, "localhost");
    return host;
}

/* Binds this process as a lease holder: (host,) pid, start time from index i. */
static int bind_writer(ckpt_store *s, ckpt_stmt *st, int i)
{
    if (catalog_on_pg(&s->cat)) db_bind_text(st, i++, store_host_name());
    db_bind_int64(st, i++, getpid());
    db_bind_int64(st, i++, store_self_start_time());
    return i;
}

/* Leases n blob names (sha(i) gives the i-th) for this process, in one
 * transaction. On PostgreSQL a lease also carries an expiry, and every lease
 * of this process is renewed with it (a writer leases as it goes, so an
 * import that works holds all of its leases fresh). */
static int lease_names(ckpt_store *s, const char *(*sha)(const void *, size_t), const void *arg, size_t n)
{
    ckpt_stmt *st = NULL;
    bool pg = catalog_on_pg(&s->cat);
    double expires = (double)time(NULL) + STORE_LEASE_SECONDS;
    int rc = catalog_begin(&s->cat);
    if (rc) return rc;
    /* PostgreSQL: while a gc runs (it locks blob_leases against writers) a new lease waits for its end */
    rc = catalog_prepare(&s->cat, &st,
                         pg ? "INSERT INTO blob_leases(blob, host, pid, start_time, expires_at) VALUES (?, ?, ?, ?, ?) "
                              "ON CONFLICT (blob, host, pid, start_time) DO UPDATE SET expires_at = excluded.expires_at"
                            : "INSERT INTO blob_leases(blob, pid, start_time) VALUES (?, ?, ?) ON CONFLICT DO NOTHING");
    ckpt_db *d = NULL;
    if (!rc) rc = catalog_jobs(&s->cat, &d);
    if (!rc) rc = db_batch_begin(d); /* PostgreSQL: DB_BATCH_MAX leases to a round trip */
    for (size_t i = 0; !rc && i < n; i++) {
        db_bind_text(st, 1, sha(arg, i));
        int k = bind_writer(s, st, 2);
        if (pg) db_bind_double(st, k, expires);
        rc = catalog_step_done(&s->cat, st, "lease blob");
    }
    if (!rc) rc = db_batch_end(d);
    db_finalize(st);
    st = NULL;
    if (!rc && pg)
        rc = catalog_prepare(&s->cat, &st,
                             "UPDATE blob_leases SET expires_at = ?4 WHERE host = ?1 AND pid = ?2 AND start_time = ?3");
    if (!rc && pg) {
        db_bind_double(st, bind_writer(s, st, 1), expires);
        rc = catalog_step_done(&s->cat, st, "renew leases");
    }
    db_finalize(st);
    if (rc) {
        catalog_rollback(&s->cat);
        return rc;
    }
    return catalog_commit(&s->cat);
}

static const char *writer_sha(const void *ws, size_t i)
{
    return ((const store_blob_writer *)ws)[i].sha256;
}

static const char *one_sha(const void *sha, size_t i)
{
    (void)i;
    return sha;
}

static int lease_one(ckpt_store *s, const char *sha256) { return lease_names(s, one_sha, sha256, 1); }

int store_blob_submit(ckpt_store *s, store_blob_writer *w)
{
    if (!store_blobs_remote(s)) return 0;
    store_blobs_published_points(s);
    int rc = lease_one(s, w->sha256);
    return rc ? rc : store_blobs_enqueue(s, w);
}

static int lease(ckpt_store *s, store_blob_writer *ws, size_t n)
{
    return lease_names(s, writer_sha, ws, n);
}

static const char *array_sha(const void *v, size_t i)
{
    return ((char *const *)v)[i];
}

/* The check of a lease on threads: a stat waits on the disk for a cold inode
 * (18,869 of them took 1-3 s one after the other here, 0.4 s eight at a
 * time), so several run at once, each on a range of the list. */
#define CHECK_THREADS 8
#define CHECK_MIN_PER_THREAD 256

typedef struct {
    ckpt_store *s;
    char *const *shas;
    size_t from, to, missing; /* missing: the first of [from, to) not stored, else to */
    int rc;
    char msg[512]; /* rc's message, set on the thread that failed */
} check_range;

struct store_blobs_check {
    size_t nparts;
    check_range part[CHECK_THREADS];
    pthread_t th[CHECK_THREADS];
    bool threaded[CHECK_THREADS];
};

static void check_range_run(check_range *p)
{
    p->missing = p->to;
    for (size_t i = p->from; !p->rc && i < p->to; i++) {
        bool exists = false;
        p->rc = store_blob_stat(p->s, p->shas[i], &exists, NULL);
        if (p->rc) snprintf(p->msg, sizeof p->msg, "%s", ckpt_error_last());
        if (!p->rc && !exists) {
            p->missing = i;
            break;
        }
    }
}

static void *check_range_main(void *arg)
{
    check_range_run(arg);
    return NULL;
}

int store_blobs_lease_begin(ckpt_store *s, char *const *shas, size_t n, store_blobs_check **out)
{
    *out = NULL;
    store_blobs_check *c = ckpt_calloc(1, sizeof *c);
    if (!c) return CKPT_ENOMEM;
    int rc = n ? lease_names(s, array_sha, shas, n) : 0;
    if (rc) {
        free(c);
        return rc;
    }
    /* The check after the lease: a blob there now stays until the commit.
     * A bucket's client is not shared across threads: there it runs here. */
    bool remote = store_blobs_remote(s);
    size_t parts = remote ? 1 : n / CHECK_MIN_PER_THREAD;
    c->nparts = parts < 1 ? 1 : parts > CHECK_THREADS ? CHECK_THREADS : parts;
    for (size_t k = 0; k < c->nparts; k++) {
        check_range *p = &c->part[k];
        *p = (check_range){
            .s = s, .shas = shas, .from = n * k / c->nparts, .to = n * (k + 1) / c->nparts};
        c->threaded[k] = !remote && pthread_create(&c->th[k], NULL, check_range_main, p) == 0;
        if (!c->threaded[k]) check_range_run(p);
    }
    *out = c;
    return 0;
}

int store_blobs_lease_end(store_blobs_check *c)
{
    int rc = 0;
    for (size_t k = 0; k < c->nparts; k++) {
        const check_range *p = &c->part[k];
        if (c->threaded[k]) pthread_join(c->th[k], NULL);
        if (!rc && p->rc) rc = ckpt_error_set(p->rc, "%s", p->msg);
        if (!rc && p->missing < p->to) /* the first missing of the list */
            rc = ckpt_error_set(CKPT_ENOTFOUND,
                                "blob %s is not in the store (removed meanwhile? run ckpt verify)",
                                p->shas[p->missing]);
    }
    free(c);
    return rc;
}

int store_blobs_lease(ckpt_store *s, char *const *shas, size_t n)
{
    store_blobs_check *c;
    int rc = store_blobs_lease_begin(s, shas, n, &c);
    return rc ? rc : store_blobs_lease_end(c);
}

int store_blob_claim(ckpt_store *s, const char *sha256, uint64_t size, bool *have)
{
    *have = false;
    int rc = lease_one(s, sha256);
    bool exists = false;
    uint64_t got = 0;
    if (!rc) rc = store_blob_stat(s, sha256, &exists, &got);
    if (!rc && exists && got == size) *have = true;
    return rc;
}

/* A lowercase hex digit's value (anything else: some value below 16). */
static unsigned hex_nibble(char c)
{
    return (c >= '0' && c <= '9' ? (unsigned)(c - '0') : (unsigned)(c - 'a' + 10)) & 15;
}

int store_blobs_publish(ckpt_store *s, store_blob_writer *ws, size_t n)
{
    if (n == 0) return 0;
    /* One filesystem sync makes every temp durable before any is renamed
     * (writers closed their temps at store_blob_end: tmp/ stands for them).
     * Not for a bucket: there a blob is durable once its upload is
     * acknowledged, and a temp is only the copy it is sent from (a crash
     * leaves the temps as garbage either way). */
    int rc = 0;
    bool remote = store_blobs_remote(s);
    int sync_fd = remote ? -1 : open(s->tmp_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (!remote && sync_fd < 0) rc = ckpt_error_sys("%s: open", s->tmp_dir);
    if (!rc && !remote && syncfs(sync_fd) < 0) rc = ckpt_error_sys("%s: sync", s->tmp_dir);
    if (!rc) ckpt_fault("blobs.synced");
    if (!rc) rc = lease(s, ws, n);
    /* In a bucket: each temp is uploaded (a PUT acknowledged is durable
     * there) and dropped; the catalog commits after all of them. */
    if (!rc && remote) rc = store_blobs_upload(s, ws, n);
    if (rc) store_blobs_uploads_end(s, true); /* what was submitted before a failure here */
    bool made[256] = {false}; /* blobs/ab/ folders made (or found) by this publish */
    for (size_t i = 0; !rc && !store_blobs_remote(s) && i < n; i++) {
        char *dst = store_blob_path(s, ws[i].sha256);
        char *dir = ckpt_sprintf("%s/%.2s", s->blob_dir, ws[i].sha256);
        unsigned ab = (hex_nibble(ws[i].sha256[0]) << 4 | hex_nibble(ws[i].sha256[1])) & 255;
        if (!dst || !dir) rc = CKPT_ENOMEM;
        if (!rc && !made[ab]) rc = ckpt_mkdir_p(dir, 0755);
        if (!rc) made[ab] = true;
        struct stat st;
        if (!rc && stat(dst, &st) == 0 && (uint64_t)st.st_size == ws[i].size) {
            unlink(ws[i].tmp_path); /* the same bytes are stored already */
        } else if (!rc && rename(ws[i].tmp_path, dst) < 0) {
            rc = ckpt_error_sys("%s: publish blob", dst);
        }
        if (!rc) ckpt_fault("blob.published");
        free(dst);
        free(dir);
    }
    if (!rc && !store_blobs_remote(s) && syncfs(sync_fd) < 0) rc = ckpt_error_sys("%s: sync", s->blob_dir);
    if (sync_fd >= 0) close(sync_fd);
    for (size_t i = 0; i < n; i++) {
        if (ws[i].fd >= 0) close(ws[i].fd);
        if (rc && ws[i].tmp_path) unlink(ws[i].tmp_path);
        free(ws[i].tmp_path);
        ws[i].tmp_path = NULL;
        ws[i].fd = -1;
    }
    return rc;
}

int store_leases_release(ckpt_store *s)
{
    ckpt_stmt *st;
    int rc = catalog_prepare(&s->cat, &st,
                             catalog_on_pg(&s->cat)
                                 ? "DELETE FROM blob_leases WHERE host = ? AND pid = ? AND start_time = ?"
                                 : "DELETE FROM blob_leases WHERE pid = ? AND start_time = ?");
    if (rc) return rc;
    bind_writer(s, st, 1);
    rc = catalog_step_done(&s->cat, st, "release leases");
    db_finalize(st);
    return rc;
}

void store_leases_release_after_error(ckpt_store *s)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ckpt_error_last());
    if (store_leases_release(s)) ckpt_error_set(CKPT_EIO, "%s", msg);
}

/* ---- checkpoint records ---- */

void store_ckpt_rec_free(store_ckpt_rec *r)
{
    for (size_t f = 0; f < r->nfiles; f++) {
        store_file_rec *fr = &r->files[f];
        free(fr->path);
        free(fr->blob);
        free(fr->header);
        for (size_t i = 0; i < fr->ntensors; i++) {
            free(fr->tensors[i].name);
            free(fr->tensors[i].blob);
            free(fr->tensors[i].recipe);
        }
        free(fr->tensors);
    }
    free(r->files);
    r->files = NULL;
    r->nfiles = r->cap = 0;
}

static int add_blob_ref(catalog *c, ckpt_stmt *st, int64_t id, const char *blob)
{
    db_bind_int64(st, 1, id);
    db_bind_text(st, 2, blob);
    return catalog_step_done(c, st, "record blob reference");
}

static int str_order(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* blobs, each once, in sorted order: a layout's thousands of references then
 * go into the b-trees of checkpoint_blobs and its index by blob page after
 * page, where their hash order would touch a random page each. */
static int add_blob_refs_sorted(catalog *c, ckpt_stmt *st, int64_t id, char *const *blobs, size_t n)
{
    const char **v = ckpt_calloc(n + 1, sizeof *v);
    if (!v) return CKPT_ENOMEM;
    memcpy(v, blobs, n * sizeof *v);
    qsort(v, n, sizeof *v, str_order);
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i++)
        if (!i || strcmp(v[i - 1], v[i])) rc = add_blob_ref(c, st, id, v[i]);
    free(v);
    return rc;
}

/* Every blob a recipe names ("blob" of a part, "srcs" of a run), each once
 * per commit (seen: the names already recorded). */
static int add_recipe_refs(catalog *c, ckpt_stmt *st, int64_t id, const char *recipe, json_t *seen)
{
    json_error_t err;
    json_t *j = json_loads(recipe, 0, &err);
    if (!json_is_array(j)) {
        json_decref(j);
        return ckpt_error_set(CKPT_EINVAL, "bad recipe JSON: %s", err.text);
    }
    size_t i;
    json_t *p;
    int rc = 0;
    json_array_foreach(j, i, p)
    {
        json_t *run = json_object_get(p, "srcs");
        size_t n = run ? json_array_size(run) : 1;
        for (size_t k = 0; !rc && k < n; k++) {
            const char *b = json_string_value(run ? json_array_get(run, k) : json_object_get(p, "blob"));
            if (!b || json_object_get(seen, b)) continue;
            rc = add_blob_ref(c, st, id, b);
            if (!rc && json_object_set_new(seen, b, json_true())) rc = CKPT_ENOMEM;
        }
    }
    json_decref(j);
    return rc;
}

/* True when checkpoint id is in the catalog (inside the caller's transaction). */
static bool ckpt_row_exists(catalog *c, int64_t id)
{
    ckpt_stmt *st;
    if (catalog_prepare(c, &st, "SELECT 1 FROM checkpoints WHERE id = ?") < 0) return true; /* the insert says */
    db_bind_int64(st, 1, id);
    bool found = db_step(st) == DB_ROW;
    db_finalize(st);
    return found;
}

int store_set_ref(ckpt_store *s, const char *repo, const char *name, int64_t id)
{
    ckpt_stmt *st;
    int rc = catalog_prepare(&s->cat, &st,
                             "INSERT INTO refs(repo, name, checkpoint_id, updated_at) VALUES (?, ?, ?, ?) "
                             "ON CONFLICT(repo, name) DO UPDATE SET checkpoint_id = excluded.checkpoint_id, "
                             "updated_at = excluded.updated_at");
    if (rc) return rc;
    db_bind_text(st, 1, repo);
    db_bind_text(st, 2, name);
    db_bind_int64(st, 3, id);
    db_bind_int64(st, 4, (int64_t)time(NULL));
    rc = catalog_step_done(&s->cat, st, "set ref");
    db_finalize(st);
    if (rc && !ckpt_row_exists(&s->cat, id)) /* a concurrent rm, not a broken catalog */
        rc = ckpt_error_set(CKPT_ENOTFOUND, "checkpoint %lld was removed while %s@%s was being pointed at it",
                            (long long)id, repo, name);
    return rc;
}

/* The id of (repo, commit, layout) inside the caller's transaction, or 0. */
static int64_t existing_id(catalog *c, const store_ckpt_rec *r)
{
    ckpt_stmt *st;
    int64_t id = 0;
    if (catalog_prepare(c, &st, "SELECT id FROM checkpoints WHERE repo = ? AND commit_sha = ? AND layout = ?") < 0) return 0;
    db_bind_text(st, 1, r->repo);
    db_bind_text(st, 2, r->commit);
    db_bind_text(st, 3, r->layout ? r->layout : "");
    if (db_step(st) == DB_ROW) id = db_col_int64(st, 0);
    db_finalize(st);
    return id;
}

/* Inserts the files of r (their tensors and blob references) into checkpoint id. */
static int insert_files(catalog *c, int64_t id, const store_ckpt_rec *r)
{
    /* Every writer checks names where they come in; this keeps any path the
     * store could not give back out of the catalog whatever the writer. */
    for (size_t f = 0; f < r->nfiles; f++) {
        int prc = store_path_check(r->files[f].path);
        if (prc) return prc;
    }
    ckpt_stmt *ins_file = NULL, *ins_tensor = NULL, *ins_ref = NULL;
    int rc = catalog_prepare(c, &ins_file,
                             "INSERT INTO files(checkpoint_id, path, size, sha256, blob, header) VALUES (?, ?, ?, ?, ?, ?)");
    if (!rc) rc = catalog_prepare(c, &ins_tensor,
                                  "INSERT INTO tensors(checkpoint_id, path, name, blob, recipe) VALUES (?, ?, ?, ?, ?)");
    if (!rc) rc = catalog_prepare(c, &ins_ref, "INSERT INTO checkpoint_blobs(checkpoint_id, blob) VALUES (?, ?) ON CONFLICT DO NOTHING");
    json_t *seen = json_object();
    if (!rc && !seen) rc = CKPT_ENOMEM;
    ckpt_db *d = NULL;
    if (!rc) rc = catalog_jobs(c, &d);
    /* PostgreSQL: rows go DB_BATCH_MAX to a round trip, not one each (a
     * many-tensor checkpoint has thousands) */
    if (!rc) rc = db_batch_begin(d);
    for (size_t f = 0; !rc && f < r->nfiles; f++) {
        const store_file_rec *fr = &r->files[f];
        db_bind_int64(ins_file, 1, id);
        db_bind_text(ins_file, 2, fr->path);
        db_bind_int64(ins_file, 3, (int64_t)fr->size);
        db_bind_text(ins_file, 4, fr->sha256);
        if (fr->blob) db_bind_text(ins_file, 5, fr->blob);
        else db_bind_text(ins_file, 5, NULL);
        db_bind_blob(ins_file, 6, fr->header, fr->header_len);
        rc = catalog_step_done(c, ins_file, "insert file");
        if (!rc && fr->blob) rc = add_blob_ref(c, ins_ref, id, fr->blob);
        for (size_t i = 0; !rc && i < fr->ntensors; i++) {
            const store_tensor_rec *t = &fr->tensors[i];
            db_bind_int64(ins_tensor, 1, id);
            db_bind_text(ins_tensor, 2, fr->path);
            db_bind_text(ins_tensor, 3, t->name);
            if (t->blob) db_bind_text(ins_tensor, 4, t->blob);
            else db_bind_text(ins_tensor, 4, NULL);
            if (t->recipe) db_bind_text(ins_tensor, 5, t->recipe);
            else db_bind_text(ins_tensor, 5, NULL);
            rc = catalog_step_done(c, ins_tensor, "insert tensor");
            if (!rc && t->blob) rc = add_blob_ref(c, ins_ref, id, t->blob);
            if (!rc && t->recipe && !r->recipe_blobs)
                rc = add_recipe_refs(c, ins_ref, id, t->recipe, seen);
        }
    }
    if (!rc && r->recipe_blobs)
        rc = add_blob_refs_sorted(c, ins_ref, id, r->recipe_blobs, r->nrecipe_blobs);
    if (!rc) rc = db_batch_end(d);
    db_finalize(ins_file);
    db_finalize(ins_tensor);
    db_finalize(ins_ref);
    json_decref(seen);
    return rc;
}

int store_add_files(ckpt_store *s, int64_t id, const store_ckpt_rec *r)
{
    catalog *c = &s->cat;
    int rc = catalog_begin(c);
    if (rc) return rc;
    if (!ckpt_row_exists(c, id))
        rc = ckpt_error_set(CKPT_ENOTFOUND, "checkpoint %lld (%s@%.12s) was removed while its files were fetched; "
                            "nothing was stored",
                            (long long)id, r->repo, r->commit);
    ckpt_stmt *st = NULL;
    uint64_t total = 0;
    for (size_t f = 0; f < r->nfiles; f++) total += r->files[f].size;
    if (!rc) rc = insert_files(c, id, r);
    if (!rc) rc = catalog_prepare(c, &st, "UPDATE checkpoints SET total_size = total_size + ? WHERE id = ?");
    if (!rc) {
        db_bind_int64(st, 1, (int64_t)total);
        db_bind_int64(st, 2, id);
        rc = catalog_step_done(c, st, "update checkpoint size");
    }
    db_finalize(st);
    if (!rc) rc = store_set_ref(s, r->repo, r->revision, id);
    if (!rc) rc = store_leases_release(s);
    if (rc) {
        catalog_rollback(c);
        return rc;
    }
    return catalog_commit(c);
}

/* PostgreSQL: two hosts committing the same (repo, commit, layout) at once
 * take turns (SQLite's write lock does this), so the second finds the first's
 * row instead of failing on the unique key. */
static int lock_checkpoint_name(catalog *c, const store_ckpt_rec *r)
{
    if (!catalog_on_pg(c)) return 0;
    ckpt_stmt *st;
    int rc = catalog_prepare(c, &st, "SELECT pg_advisory_xact_lock(hashtext(?1 || chr(10) || ?2 || chr(10) || ?3))");
    if (rc) return rc;
    db_bind_text(st, 1, r->repo);
    db_bind_text(st, 2, r->commit);
    db_bind_text(st, 3, r->layout ? r->layout : "");
    int e = db_run(st);
    db_finalize(st);
    return e;
}

int store_commit_checkpoint(ckpt_store *s, const store_ckpt_rec *r, int64_t *id, bool *existed)
{
    catalog *c = &s->cat;
    ckpt_stmt *ins_ck = NULL;
    int rc = catalog_begin(c);
    if (!rc) rc = lock_checkpoint_name(c, r);
    if (rc) {
        catalog_rollback(c);
        return rc;
    }
    if (existed) *existed = false;
    if (r->source_id && !ckpt_row_exists(c, r->source_id)) {
        rc = ckpt_error_set(CKPT_ENOTFOUND,
                            "checkpoint %lld (%s@%.12s, the source) was removed while this ran; nothing was stored",
                            (long long)r->source_id, r->repo, r->commit);
        catalog_rollback(c);
        return rc;
    }
    /* The same checkpoint committed meanwhile by another process (two runs of
     * one job): the first one stands; this one only points the ref at it. */
    int64_t prior = existing_id(c, r);
    if (prior) {
        *id = prior;
        if (existed) *existed = true;
        if (!(r->layout && *r->layout)) rc = store_set_ref(s, r->repo, r->revision, prior);
        if (!rc) rc = store_leases_release(s);
        if (rc) {
            catalog_rollback(c);
            return rc;
        }
        return catalog_commit(c);
    }
    uint64_t total = 0;
    for (size_t f = 0; f < r->nfiles; f++) total += r->files[f].size;
    if (!rc) rc = catalog_prepare(c, &ins_ck,
                                  "INSERT INTO checkpoints(repo, revision, commit_sha, layout, source_id, lossy, "
                                  "total_size, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id");
    if (!rc) {
        db_bind_text(ins_ck, 1, r->repo);
        db_bind_text(ins_ck, 2, r->revision);
        db_bind_text(ins_ck, 3, r->commit);
        db_bind_text(ins_ck, 4, r->layout ? r->layout : "");
        if (r->source_id) db_bind_int64(ins_ck, 5, r->source_id);
        else db_bind_text(ins_ck, 5, NULL);
        db_bind_int64(ins_ck, 6, r->lossy);
        db_bind_int64(ins_ck, 7, (int64_t)total);
        db_bind_int64(ins_ck, 8, (int64_t)time(NULL));
        int e = db_step(ins_ck);
        if (e == DB_ROW) *id = db_col_int64(ins_ck, 0);
        else rc = e < 0 ? e : catalog_error(c, "insert checkpoint");
        db_reset(ins_ck);
    }
    db_finalize(ins_ck);
    if (!rc) rc = insert_files(c, *id, r);
    if (!rc && !(r->layout && *r->layout)) rc = store_set_ref(s, r->repo, r->revision, *id);
    if (!rc) rc = store_leases_release(s);
    if (rc) {
        catalog_rollback(c);
        return rc;
    }
    return catalog_commit(c);
}

int store_find(ckpt_store *s, const char *repo, const char *commit, const char *layout, int64_t *id)
{
    ckpt_stmt *st;
    *id = 0;
    int rc = catalog_prepare(&s->cat, &st, "SELECT id FROM checkpoints WHERE repo = ? AND commit_sha = ? AND layout = ?");
    if (rc) return rc;
    db_bind_text(st, 1, repo);
    db_bind_text(st, 2, commit);
    db_bind_text(st, 3, layout ? layout : "");
    int step = db_step(st);
    if (step == DB_ROW) *id = db_col_int64(st, 0);
    else if (step != DB_DONE) rc = catalog_error(&s->cat, "find checkpoint");
    db_finalize(st);
    return rc;
}

/* ---- file names ---- */

int store_path_check(const char *path)
{
    size_t len = strlen(path);
    char shown[160];
    size_t k = 0;
    for (size_t i = 0; i < len && k + 5 < sizeof shown; i++) { /* control bytes shown as \xNN */
        unsigned char ch = (unsigned char)path[i];
        if (ch < 0x20 || ch == 0x7f) k += (size_t)snprintf(shown + k, sizeof shown - k, "\\x%02x", ch);
        else shown[k++] = (char)ch;
    }
    shown[k] = 0;
    const char *why = NULL;
    if (len == 0) why = "is empty";
    else if (len > STORE_MAX_PATH) why = "is longer than 1024 bytes";
    else if (path[0] == '/') why = "is absolute";
    else if (strstr(path, "..")) why = "holds '..'";
    else if (strchr(path, '\\')) why = "holds a backslash";
    else if (strstr(path, "://")) why = "holds '://'";
    for (size_t i = 0; !why && i < len; i++)
        if ((unsigned char)path[i] < 0x20 || path[i] == 0x7f) why = "holds a control character";
    for (const char *seg = path; !why && seg;) {
        const char *slash = strchr(seg, '/');
        size_t sl = slash ? (size_t)(slash - seg) : strlen(seg);
        if (sl == 0) why = "has an empty segment";
        else if (sl == 1 && seg[0] == '.') why = "has a '.' segment";
        else if (sl > 255) why = "has a segment longer than 255 bytes";
        seg = slash ? slash + 1 : NULL;
    }
    if (why)
        return ckpt_error_set(len > STORE_MAX_PATH ? CKPT_ELIMIT : CKPT_EINVAL,
                              "file name '%s%s' %s: the store cannot hold it (rename the file)", shown,
                              k < len ? "..." : "", why);
    return 0;
}

/* ---- refs ---- */

int store_repo_name_check(const char *repo)
{
    size_t n = strlen(repo), slashes = 0;
    bool ok = n > 2 && n <= 200 && repo[0] != '/' && repo[n - 1] != '/' && !strstr(repo, "..");
    for (size_t i = 0; ok && i < n; i++) {
        unsigned char ch = (unsigned char)repo[i];
        if (ch == '/') slashes++;
        else ok = isalnum(ch) || ch == '-' || ch == '_' || ch == '.';
    }
    if (!ok || slashes != 1)
        return ckpt_error_set(CKPT_EINVAL, "'%s' is not a repo name of the form ORG/NAME (letters, digits, - _ .)", repo);
    return 0;
}

int store_ref_parse(const char *ref, char **repo, char **rev, char **layout)
{
    *repo = *rev = *layout = NULL;
    const char *at = strchr(ref, '@');
    const char *colon = strchr(at ? at : ref, ':');
    size_t rl = at ? (size_t)(at - ref) : colon ? (size_t)(colon - ref) : strlen(ref);
    *repo = ckpt_strndup(ref, rl);
    if (at) *rev = colon ? ckpt_strndup(at + 1, (size_t)(colon - at - 1)) : ckpt_strdup(at + 1);
    if (colon) *layout = ckpt_strdup(colon + 1);
    int rc = *repo && (!at || *rev) && (!colon || *layout) ? 0 : CKPT_ENOMEM;
    if (!rc) rc = store_repo_name_check(*repo);
    if (!rc && ((*rev && !**rev) || (*layout && !**layout)))
        rc = ckpt_error_set(CKPT_EINVAL, "'%s': empty revision or layout in the ref (REPO@REV:LAYOUT)", ref);
    if (rc) {
        free(*repo);
        free(*rev);
        free(*layout);
        *repo = *rev = *layout = NULL;
    }
    return rc;
}

static char *col_dup(ckpt_stmt *st, int i)
{
    const char *t = db_col_text(st, i);
    return ckpt_strdup(t ? t : "");
}

#define CKPT_COLUMNS "c.id, c.repo, c.revision, c.commit_sha, c.layout, c.source_id, c.lossy, c.total_size, c.created_at"

static int read_ckpt(ckpt_stmt *st, store_ckpt *out)
{
    memset(out, 0, sizeof *out);
    out->id = db_col_int64(st, 0);
    out->repo = col_dup(st, 1);
    out->revision = col_dup(st, 2);
    out->commit = col_dup(st, 3);
    out->layout = col_dup(st, 4);
    out->source_id = db_col_int64(st, 5);
    out->lossy = (int)db_col_int64(st, 6) != 0;
    out->total_size = db_col_int64(st, 7);
    out->created_at = db_col_int64(st, 8);
    if (!out->repo || !out->revision || !out->commit || !out->layout) {
        store_ckpt_free(out);
        return CKPT_ENOMEM;
    }
    return 0;
}

/* Runs a query returning checkpoint rows; takes the first. 1 found, 0 none. */
static int query_one(ckpt_store *s, const char *sql, const char *a, const char *b, const char *c3, store_ckpt *out)
{
    ckpt_stmt *st;
    int rc = catalog_prepare(&s->cat, &st, sql);
    if (rc) return rc;
    const char *args[] = {a, b, c3};
    for (int i = 0; i < 3; i++)
        if (args[i]) db_bind_text(st, i + 1, args[i]);
    int step = db_step(st);
    if (step == DB_ROW) rc = read_ckpt(st, out) ? CKPT_ENOMEM : 1;
    else if (step != DB_DONE) rc = catalog_error(&s->cat, "resolve ref");
    db_finalize(st);
    return rc;
}

int store_resolve(ckpt_store *s, const char *ref, store_ckpt *out)
{
    if (ckpt_fault_error("store.lookup"))
        return ckpt_error_set(CKPT_EIO, "'%s': the catalog could not be read (fault point store.lookup)", ref);
    char *repo, *rev, *layout;
    int rc = store_ref_parse(ref, &repo, &rev, &layout);
    if (rc) return rc;
    const char *lay = layout ? layout : "";
    store_ckpt orig;
    memset(&orig, 0, sizeof orig);
    /* The original: by ref name, then by commit (or unique prefix), else the newest. */
    if (rev) {
        rc = query_one(s, "SELECT " CKPT_COLUMNS " FROM refs r JOIN checkpoints c ON c.id = r.checkpoint_id "
                          "WHERE r.repo = ?1 AND r.name = ?2",
                       repo, rev, NULL, &orig);
        if (rc == 0)
            rc = query_one(s, "SELECT " CKPT_COLUMNS " FROM checkpoints c WHERE c.repo = ?1 AND c.layout = '' AND "
                              "(c.commit_sha = ?2 OR (length(?2) >= 7 AND substr(c.commit_sha, 1, length(?2)) = ?2)) "
                              "ORDER BY c.id DESC",
                           repo, rev, NULL, &orig);
    } else {
        rc = query_one(s, "SELECT " CKPT_COLUMNS " FROM checkpoints c WHERE c.repo = ?1 AND c.layout = '' ORDER BY c.id DESC",
                       repo, NULL, NULL, &orig);
    }
    if (rc == 0 && *lay) {
        /* The original may be gone (ckpt rm) while its layout stays. */
        rc = query_one(s, "SELECT " CKPT_COLUMNS " FROM checkpoints c WHERE c.repo = ?1 AND c.layout = ?3 AND "
                          "(CAST(?2 AS TEXT) IS NULL OR c.revision = ?2 OR c.commit_sha = ?2 OR "
                          "(length(?2) >= 7 AND substr(c.commit_sha, 1, length(?2)) = ?2)) ORDER BY c.id DESC",
                       repo, rev, lay, out);
        if (rc == 1) {
            free(repo);
            free(rev);
            free(layout);
            return 0;
        }
    }
    if (rc == 0) rc = ckpt_error_set(CKPT_ENOTFOUND, "'%s': no such checkpoint in the store (see ckpt ls)", ref);
    if (rc == 1 && !*lay) {
        *out = orig;
        memset(&orig, 0, sizeof orig);
        rc = 0;
    } else if (rc == 1) {
        rc = query_one(s, "SELECT " CKPT_COLUMNS " FROM checkpoints c WHERE c.repo = ?1 AND c.commit_sha = ?2 AND c.layout = ?3",
                       repo, orig.commit, lay, out);
        if (rc == 0)
            rc = ckpt_error_set(CKPT_ENOTFOUND, "'%s': %s@%s has no layout '%s' (convert it with ckpt convert %s@%s --layout ...)",
                                ref, repo, orig.revision, lay, repo, orig.revision);
        if (rc == 1) rc = 0;
    }
    store_ckpt_free(&orig);
    free(repo);
    free(rev);
    free(layout);
    return rc;
}

int store_get(ckpt_store *s, int64_t id, store_ckpt *out)
{
    char idtext[32];
    snprintf(idtext, sizeof idtext, "%lld", (long long)id);
    int rc = query_one(s, "SELECT " CKPT_COLUMNS " FROM checkpoints c WHERE c.id = CAST(?1 AS INTEGER)", idtext, NULL,
                       NULL, out);
    if (rc == 0) return ckpt_error_set(CKPT_ENOTFOUND, "checkpoint %lld is gone", (long long)id);
    return rc == 1 ? 0 : rc;
}

char *store_ckpt_ref(const store_ckpt *c)
{
    if (c->layout && *c->layout) return ckpt_sprintf("%s@%s:%s", c->repo, c->revision, c->layout);
    return ckpt_sprintf("%s@%s", c->repo, c->revision);
}

void store_ckpt_free(store_ckpt *c)
{
    free(c->repo);
    free(c->revision);
    free(c->commit);
    free(c->layout);
    memset(c, 0, sizeof *c);
}

/* ---- files ---- */

void store_files_free(store_file_row *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(rows[i].path);
        free(rows[i].blob);
        free(rows[i].header);
    }
    free(rows);
}

int store_files_load(ckpt_store *s, int64_t id, store_file_row **rows, size_t *n)
{
    *rows = NULL;
    *n = 0;
    ckpt_stmt *st;
    int rc = catalog_prepare(&s->cat, &st, "SELECT path, size, sha256, blob, header FROM files WHERE checkpoint_id = ? ORDER BY path");
    if (rc) return rc;
    db_bind_int64(st, 1, id);
    size_t cap = 0;
    int step;
    while (!rc && (step = db_step(st)) == DB_ROW) {
        const char *path = db_col_text(st, 0), *sha = db_col_text(st, 2);
        const char *blob = db_col_text(st, 3);
        /* "" is a layout file whose sha256 is not computed yet (store_hash_pending). */
        size_t hl = 0;
        const void *hdr = db_col_blob(st, 4, &hl);
        bool pending = sha && !*sha && hdr && hl > 0;
        if (!path || !sha || (strlen(sha) != 64 && !pending) || !ckpt_shard_name_safe(path)) {
            rc = ckpt_error_set(CKPT_ECORRUPT, "catalog: checkpoint %lld has a damaged file row", (long long)id);
            break;
        }
        if ((rc = ckpt_grow(rows, &cap, *n + 1, sizeof **rows))) break;
        store_file_row *f = &(*rows)[(*n)++];
        memset(f, 0, sizeof *f);
        f->path = ckpt_strdup(path);
        f->size = (uint64_t)db_col_int64(st, 1);
        memcpy(f->sha256, sha, 65);
        f->blob = blob ? ckpt_strdup(blob) : NULL;
        if (hl > 0 && (f->header = ckpt_malloc(hl))) {
            memcpy(f->header, hdr, hl);
            f->header_len = hl;
        }
        if (!f->path || (blob && !f->blob) || (hl > 0 && !f->header)) rc = CKPT_ENOMEM;
    }
    if (!rc && step != DB_DONE) rc = catalog_error(&s->cat, "read files");
    db_finalize(st);
    if (rc) {
        store_files_free(*rows, *n);
        *rows = NULL;
        *n = 0;
    }
    return rc;
}

static int tensor_blob_order(const void *a, const void *b)
{
    const store_tensor_blob *x = a, *y = b;
    int c = strcmp(x->path, y->path);
    return c ? c : strcmp(x->name, y->name);
}

void store_tensor_blobs_free(store_tensor_blobs *t)
{
    for (size_t i = 0; i < t->n; i++)
        free((char *)t->v[i].path);
    free(t->v);
    t->v = NULL;
    t->n = 0;
}

int store_tensor_blobs_load(ckpt_store *s, int64_t id, store_tensor_blobs *out)
{
    out->v = NULL;
    out->n = 0;
    ckpt_stmt *st;
    int rc = catalog_prepare(
        &s->cat, &st,
        "SELECT path, name, blob FROM tensors WHERE checkpoint_id = ? AND blob IS NOT NULL");
    if (rc) return rc;
    db_bind_int64(st, 1, id);
    size_t cap = 0;
    int step;
    while (!rc && (step = db_step(st)) == DB_ROW) {
        const char *path = db_col_text(st, 0), *name = db_col_text(st, 1),
                   *blob = db_col_text(st, 2);
        if (!path || !name || !blob) {
            rc = ckpt_error_set(CKPT_ECORRUPT, "catalog: checkpoint %lld has a damaged tensor row",
                                (long long)id);
            break;
        }
        if ((rc = ckpt_grow(&out->v, &cap, out->n + 1, sizeof *out->v))) break;
        size_t lp = strlen(path) + 1, ln = strlen(name) + 1, lb = strlen(blob) + 1;
        char *row = ckpt_malloc(lp + ln + lb); /* path, name and blob side by side */
        if (!row) {
            rc = CKPT_ENOMEM;
            break;
        }
        memcpy(row, path, lp);
        memcpy(row + lp, name, ln);
        memcpy(row + lp + ln, blob, lb);
        out->v[out->n++] = (store_tensor_blob){row, row + lp, row + lp + ln};
    }
    if (!rc && step != DB_DONE) rc = catalog_error(&s->cat, "read tensors");
    db_finalize(st);
    /* Sorted here rather than by ORDER BY: PostgreSQL would order by its
     * collation, and the lookup compares bytes. */
    if (!rc && out->n) qsort(out->v, out->n, sizeof *out->v, tensor_blob_order);
    if (rc) store_tensor_blobs_free(out);
    return rc;
}

const char *store_tensor_blobs_find(const store_tensor_blobs *t, const char *path, const char *name)
{
    const store_tensor_blob key = {path, name, NULL},
                            *hit = t->n ? bsearch(&key, t->v, t->n, sizeof *t->v, tensor_blob_order) : NULL;
    return hit ? hit->blob : NULL;
}

int store_tensor_blobs_get(const store_tensor_blobs *t, const char *path, const char *name,
                           char **out)
{
    const char *b = store_tensor_blobs_find(t, path, name);
    *out = b ? ckpt_strdup(b) : NULL;
    if (!b)
        return ckpt_error_set(CKPT_ECORRUPT, "catalog: %s: tensor '%s' has no blob", path, name);
    return *out ? 0 : CKPT_ENOMEM;
}

int store_files_pending(ckpt_store *s, int64_t id, const char *path, bool *any)
{
    *any = false;
    ckpt_stmt *st;
    int rc = catalog_prepare(&s->cat, &st,
                             "SELECT 1 FROM files WHERE checkpoint_id = ? AND sha256 = '' AND "
                             "(CAST(? AS TEXT) IS NULL OR path = ?) LIMIT 1");
    if (rc) return rc;
    db_bind_int64(st, 1, id);
    db_bind_text(st, 2, path);
    db_bind_text(st, 3, path);
    int step = db_step(st);
    if (step == DB_ROW) *any = true;
    else if (step != DB_DONE) rc = catalog_error(&s->cat, "read files");
    db_finalize(st);
    return rc;
}

int store_file_set_sha256(ckpt_store *s, int64_t id, const char *path, const char *sha256)
{
    ckpt_stmt *st;
    int rc = catalog_prepare(&s->cat, &st, "UPDATE files SET sha256 = ? WHERE checkpoint_id = ? AND path = ? AND sha256 = ''");
    if (rc) return rc;
    db_bind_text(st, 1, sha256);
    db_bind_int64(st, 2, id);
    db_bind_text(st, 3, path);
    rc = catalog_step_done(&s->cat, st, "record a file's sha256");
    db_finalize(st);
    return rc;
}

/*
 * store_maint.c — gc, du, rm and blob verification for the store.
 *
 * gc holds the catalog's write lock (BEGIN IMMEDIATE; on PostgreSQL a lock
 * on blob_leases that writers' leases wait for) while it decides and deletes,
 * waiting for it at most CKPT_GC_LOCK_TIMEOUT_S (gc_begin), so no import can
 * lease a blob in between: a blob survives when a
 * checkpoint references it or a live process leases it. Temp files and
 * folders in tmp/ carry their writer's pid and start time; those of dead
 * writers are removed, and so are the stale kept pieces of interrupted
 * fetches in partial/ (store_partial_gc; counted as temps).
 */
#include "store/store.h"
#include "store/store_partial.h"

#include "common/error.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/sha256.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static bool writer_alive(int pid, int64_t start)
{
    return pid > 0 && store_proc_start_time(pid) == start;
}

/* "<kind>-<pid>-<start>..." from a tmp/ entry name (kind may hold dashes
 * itself: "state-export-<pid>-<start>.tmp-..."); false when not ours. */
static bool parse_temp_name(const char *name, int *pid, long long *start)
{
    for (const char *dash = strchr(name, '-'); dash; dash = strchr(dash + 1, '-')) {
        int used = 0;
        if (sscanf(dash + 1, "%d-%lld%n", pid, start, &used) == 2 && *pid > 0 &&
            (dash[1 + used] == '\0' || dash[1 + used] == '.' || dash[1 + used] == '-'))
            return true;
    }
    return false;
}

/* Drops the leases of writers that are gone: on SQLite, dead processes; on
 * PostgreSQL, dead processes of this host and expired leases of any host
 * (another host's processes cannot be asked). */
static int drop_stale_leases(ckpt_store *s, uint64_t *dropped)
{
    bool pg = catalog_on_pg(&s->cat);
    ckpt_stmt *st, *del;
    int rc = 0;
    if (pg) {
        if ((rc = catalog_prepare(&s->cat, &del, "DELETE FROM blob_leases WHERE expires_at < ?"))) return rc;
        db_bind_double(del, 1, (double)time(NULL));
        rc = catalog_step_done(&s->cat, del, "drop expired leases");
        *dropped += (uint64_t)db_changes(del);
        db_finalize(del);
        if (rc) return rc;
    }
    rc = catalog_prepare(&s->cat, &st,
                         pg ? "SELECT DISTINCT pid, start_time FROM blob_leases WHERE host = ?"
                            : "SELECT DISTINCT pid, start_time FROM blob_leases");
    if (!rc) rc = catalog_prepare(&s->cat, &del,
                                  pg ? "DELETE FROM blob_leases WHERE pid = ? AND start_time = ? AND host = ?"
                                     : "DELETE FROM blob_leases WHERE pid = ? AND start_time = ?");
    else return rc;
    if (pg) db_bind_text(st, 1, store_host_name());
    while (!rc && db_step(st) == DB_ROW) {
        int pid = (int)db_col_int64(st, 0);
        int64_t start = db_col_int64(st, 1);
        if (writer_alive(pid, start)) continue;
        db_bind_int64(del, 1, pid);
        db_bind_int64(del, 2, start);
        if (pg) db_bind_text(del, 3, store_host_name());
        rc = catalog_step_done(&s->cat, del, "drop stale lease");
        *dropped += (uint64_t)db_changes(del);
    }
    db_finalize(st);
    db_finalize(del);
    return rc;
}

static int blob_wanted(ckpt_store *s, ckpt_stmt *q, const char *sha, bool *wanted)
{
    db_bind_text(q, 1, sha);
    int step = db_step(q);
    *wanted = step == DB_ROW;
    db_reset(q);
    return step == DB_ROW || step == DB_DONE ? 0 : catalog_error(&s->cat, "look up blob");
}

/* Calls fn for each blob file: its sha256 (from the path) and full path. */
typedef int (*blob_fn)(void *ctx, const char *sha, const char *path, uint64_t size);

static int for_each_blob(const char *blob_dir, blob_fn fn, void *ctx)
{
    DIR *top = opendir(blob_dir);
    if (!top) return ckpt_error_sys("%s: open", blob_dir);
    int rc = 0;
    struct dirent *d;
    while (!rc && (d = readdir(top))) {
        if (strlen(d->d_name) != 2) continue;
        char *sub = ckpt_path_join(blob_dir, d->d_name);
        DIR *dd = sub ? opendir(sub) : NULL;
        struct dirent *e;
        while (dd && !rc && (e = readdir(dd))) {
            if (strlen(e->d_name) != 62) continue;
            char sha[65], *path = ckpt_path_join(sub, e->d_name);
            snprintf(sha, sizeof sha, "%.2s%.62s", d->d_name, e->d_name);
            struct stat st;
            if (path && stat(path, &st) == 0) rc = fn(ctx, sha, path, (uint64_t)st.st_size);
            free(path);
        }
        if (dd) closedir(dd);
        free(sub);
    }
    closedir(top);
    return rc;
}

typedef struct {
    ckpt_store *s;
    ckpt_stmt *q;
    bool dry_run;
    store_gc_result *res;
    int64_t started; /* Unix seconds */
} gc_ctx;

/* In a bucket, a blob whose object is newer than the gc's start less this
 * margin (clocks of other hosts; CKPT_GC_MARGIN_S, default 300) is kept
 * whatever the catalog says: it may be a writer's whose lease this catalog
 * cannot see. */
static int64_t gc_remote_margin(void)
{
    const char *v = getenv("CKPT_GC_MARGIN_S");
    int64_t m;
    return v && *v && ckpt_parse_i64_field("CKPT_GC_MARGIN_S", v, -86400, 86400, &m) == 0 ? m : 300;
}

static int gc_remote_blob(void *vctx, const char *sha, uint64_t size, int64_t mtime)
{
    gc_ctx *g = vctx;
    bool wanted;
    int rc = blob_wanted(g->s, g->q, sha, &wanted);
    if (rc || wanted) return rc;
    if (mtime < 0 || mtime >= g->started - gc_remote_margin()) return 0;
    if (!g->dry_run && (rc = store_blob_delete(g->s, sha)) < 0) return rc;
    if (!g->dry_run) ckpt_fault("gc.blob_removed");
    g->res->blobs_removed++;
    g->res->bytes_freed += size;
    return 0;
}

/* A cached copy of a blob of a bucket (blob-cache/) that nothing wants. */
static int gc_cached_blob(void *vctx, const char *sha, const char *path, uint64_t size)
{
    gc_ctx *g = vctx;
    bool wanted;
    int rc = blob_wanted(g->s, g->q, sha, &wanted);
    (void)size;
    if (!rc && !wanted && !g->dry_run && unlink(path) < 0 && errno != ENOENT) rc = ckpt_error_sys("%s: remove", path);
    return rc;
}

static int gc_blob(void *vctx, const char *sha, const char *path, uint64_t size)
{
    gc_ctx *g = vctx;
    bool wanted;
    int rc = blob_wanted(g->s, g->q, sha, &wanted);
    if (rc || wanted) return rc;
    if (!g->dry_run && unlink(path) < 0) return ckpt_error_sys("%s: remove", path);
    if (!g->dry_run) ckpt_fault("gc.blob_removed");
    g->res->blobs_removed++;
    g->res->bytes_freed += size;
    return 0;
}

static int gc_temps(ckpt_store *s, bool dry_run, store_gc_result *res)
{
    DIR *d = opendir(s->tmp_dir);
    if (!d) return ckpt_error_sys("%s: open", s->tmp_dir);
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        int pid;
        long long start;
        if (e->d_name[0] == '.' || !parse_temp_name(e->d_name, &pid, &start)) continue;
        if (writer_alive(pid, start)) continue;
        char *path = ckpt_path_join(s->tmp_dir, e->d_name);
        if (!path) rc = CKPT_ENOMEM;
        else if (!dry_run) rc = ckpt_rm_rf(path);
        res->temps_removed++;
        free(path);
    }
    closedir(d);
    return rc;
}

/* Begins gc's transaction holding what keeps writers out, waiting at most
 * the lock timeout for it. SQLite: the write lock (BEGIN IMMEDIATE), its
 * attempts' busy timeouts adding up to the timeout. PostgreSQL: SQLite's write
 * lock in effect, blob_leases locked against writers' leases (taken before a
 * blob is written or reused), which wait until this gc commits, and against
 * another gc; the wait is bounded by lock_timeout, so a writer stopped
 * inside a lease's transaction (SIGSTOP, a debugger) fails the gc instead of
 * blocking it for ever. */
static int gc_begin(ckpt_store *s)
{
    int ms;
    int rc = ckpt_env_ms("CKPT_GC_LOCK_TIMEOUT_S", 30, 0.001, 86400, &ms);
    if (rc) return rc;
    bool pg = catalog_on_pg(&s->cat);
    if (!pg) sqlite3_busy_timeout(s->cat.db, ms / DB_BEGIN_ATTEMPTS + 1);
    rc = catalog_begin(&s->cat);
    if (!pg) sqlite3_busy_timeout(s->cat.db, CATALOG_BUSY_TIMEOUT_MS);
    if (!rc && pg) {
        char sql[64];
        snprintf(sql, sizeof sql, "SET LOCAL lock_timeout = %d", ms);
        rc = catalog_exec(&s->cat, sql);
        /* Not ended by the server while it idles (CKPT_PG_IDLE_TX_TIMEOUT_S):
         * between deciding a blob is unreferenced and deleting it, the lock
         * is what keeps a writer from leasing and reusing it; a gc frozen
         * there holds the writers' new leases, not their data. */
        if (!rc) rc = catalog_exec(&s->cat, "SET LOCAL idle_in_transaction_session_timeout = 0");
        if (!rc) rc = catalog_exec(&s->cat, "LOCK TABLE blob_leases IN SHARE ROW EXCLUSIVE MODE");
        if (rc) catalog_rollback(&s->cat);
    }
    if (rc == CKPT_EBUSY)
        return ckpt_error_set(rc, "%s %s; try again (the wait for it: CKPT_GC_LOCK_TIMEOUT_S, %g s)",
                              pg ? "another process holds blob leases on" : "another process holds the write lock of",
                              s->cat.path, ms / 1000.0);
    return rc;
}

int store_gc(ckpt_store *s, bool dry_run, store_gc_result *res)
{
    memset(res, 0, sizeof *res);
    int rc = gc_begin(s);
    if (rc) return rc;
    gc_ctx g = {.s = s, .dry_run = dry_run, .res = res, .started = (int64_t)time(NULL)};
    rc = drop_stale_leases(s, &res->leases_dropped);
    if (!rc)
        rc = catalog_prepare(&s->cat, &g.q,
                             "SELECT 1 FROM checkpoint_blobs WHERE blob = ?1 UNION ALL SELECT 1 FROM blob_leases WHERE blob = ?1 LIMIT 1");
    if (!rc && !store_blobs_remote(s)) rc = for_each_blob(s->blob_dir, gc_blob, &g);
    if (!rc && store_blobs_remote(s)) rc = store_blob_list(s, gc_remote_blob, &g);
    if (!rc && store_blobs_remote(s)) rc = for_each_blob(s->cache_dir, gc_cached_blob, &g);
    db_finalize(g.q);
    if (!rc) rc = gc_temps(s, dry_run, res);
    /* Kept pieces of interrupted fetches: stale once no fetch holds them and
     * nothing changed in them for the keep period (store_partial.h). */
    if (!rc) rc = store_partial_gc(s, store_partial_keep(), dry_run, &res->temps_removed);
    if (rc || dry_run) {
        catalog_rollback(&s->cat);
        return rc;
    }
    return catalog_commit(&s->cat);
}

static int du_blob(void *vctx, const char *sha, const char *path, uint64_t size)
{
    store_du_result *r = vctx;
    (void)sha;
    (void)path;
    r->blobs++;
    r->physical += size;
    return 0;
}

static int du_remote_blob(void *vctx, const char *sha, uint64_t size, int64_t mtime)
{
    (void)mtime;
    return du_blob(vctx, sha, NULL, size);
}

json_t *store_du_json(const store_du_result *r)
{
    double ratio = r->physical ? (double)r->logical / (double)r->physical : 0.0;
    return json_pack("{s:I,s:I,s:I,s:I,s:I,s:f}", "checkpoints", (json_int_t)r->checkpoints, "logical_bytes",
                     (json_int_t)r->logical, "physical_bytes", (json_int_t)r->physical, "blobs", (json_int_t)r->blobs,
                     "catalog_bytes", (json_int_t)r->db_bytes, "dedup_ratio", ratio);
}

int store_du(ckpt_store *s, store_du_result *res)
{
    memset(res, 0, sizeof *res);
    ckpt_stmt *st;
    int rc = catalog_prepare(&s->cat, &st, "SELECT count(*), coalesce(sum(total_size), 0) FROM checkpoints");
    if (rc) return rc;
    if (db_step(st) == DB_ROW) {
        res->checkpoints = (uint64_t)db_col_int64(st, 0);
        res->logical = (uint64_t)db_col_int64(st, 1);
    }
    db_finalize(st);
    struct stat sb;
    if (catalog_on_pg(&s->cat) && !catalog_prepare(&s->cat, &st, "SELECT pg_database_size(current_database())")) {
        if (db_step(st) == DB_ROW) res->db_bytes = (uint64_t)db_col_int64(st, 0);
        db_finalize(st);
    } else if (stat(s->cat.path, &sb) == 0) {
        res->db_bytes = (uint64_t)sb.st_size;
    }
    if (store_blobs_remote(s)) return store_blob_list(s, du_remote_blob, res);
    return for_each_blob(s->blob_dir, du_blob, res);
}

int store_rm(ckpt_store *s, const store_ckpt *c)
{
    ckpt_stmt *st;
    int rc = catalog_begin(&s->cat);
    if (!rc) rc = catalog_prepare(&s->cat, &st, "DELETE FROM checkpoints WHERE id = ?");
    if (!rc) {
        db_bind_int64(st, 1, c->id);
        if (db_step(st) != DB_DONE) rc = catalog_error(&s->cat, "remove checkpoint");
        db_finalize(st);
    }
    if (rc) {
        catalog_rollback(&s->cat);
        return rc;
    }
    return catalog_commit(&s->cat);
}

/* Reports which checkpoints and files a damaged blob breaks. */
static void report_users(ckpt_store *s, const char *sha, const char *problem, store_verify_report report, void *ctx)
{
    ckpt_stmt *st;
    if (catalog_prepare(&s->cat, &st,
                        "SELECT c.id, f.path, NULL FROM files f JOIN checkpoints c ON c.id = f.checkpoint_id WHERE f.blob = ?1 "
                        "UNION ALL SELECT c.id, t.path, t.name FROM tensors t JOIN checkpoints c ON c.id = t.checkpoint_id "
                        "WHERE t.blob = ?1 OR (t.recipe IS NOT NULL AND t.recipe LIKE '%' || ?1 || '%') ORDER BY 1, 2, 3") < 0)
        return;
    db_bind_text(st, 1, sha);
    char line[2048];
    snprintf(line, sizeof line, "damaged blob %s: %s", sha, problem);
    report(ctx, line);
    while (db_step(st) == DB_ROW) {
        store_ckpt c;
        if (store_get(s, db_col_int64(st, 0), &c) < 0) continue;
        char *ref = store_ckpt_ref(&c);
        const char *tensor = db_col_text(st, 2);
        snprintf(line, sizeof line, "  breaks %s file %s%s%s%s", ref ? ref : "?", db_col_text(st, 1),
                 tensor ? " (tensor '" : "", tensor ? tensor : "", tensor ? "')" : "");
        report(ctx, line);
        free(ref);
        store_ckpt_free(&c);
    }
    db_finalize(st);
}

int store_verify_blobs(ckpt_store *s, int64_t id, store_verify_report report, void *ctx, uint64_t *damaged)
{
    *damaged = 0;
    ckpt_stmt *st;
    int rc = catalog_prepare(&s->cat, &st,
                             "SELECT DISTINCT blob FROM checkpoint_blobs WHERE ?1 = 0 OR checkpoint_id = ?1 ORDER BY blob");
    if (rc) return rc;
    db_bind_int64(st, 1, id);
    char **list = NULL;
    size_t n = 0, cap = 0;
    int step;
    while (!rc && (step = db_step(st)) == DB_ROW) {
        if ((rc = ckpt_grow(&list, &cap, n + 1, sizeof *list))) break;
        if (!(list[n] = ckpt_strdup(db_col_text(st, 0)))) rc = CKPT_ENOMEM;
        else n++;
    }
    if (!rc && step != DB_DONE) rc = catalog_error(&s->cat, "verify: list blobs");
    db_finalize(st);
    for (size_t i = 0; !rc && i < n; i++) {
        char hex[65];
        bool exists = false;
        const char *problem = NULL;
        char detail[128];
        if (store_blob_hash(s, list[i], &exists, hex) < 0) {
            if (store_blobs_remote(s) && exists) { /* the bucket failed, not the blob: stop with its error */
                rc = CKPT_EIO;
                break;
            }
            problem = exists ? "unreadable" : "missing";
        } else if (!exists) {
            problem = "missing";
        } else if (strcmp(hex, list[i])) {
            snprintf(detail, sizeof detail, "its bytes hash to %.16s...", hex);
            problem = detail;
        }
        if (problem) {
            (*damaged)++;
            report_users(s, list[i], problem, report, ctx);
        }
    }
    for (size_t i = 0; i < n; i++) free(list[i]);
    free(list);
    return rc;
}

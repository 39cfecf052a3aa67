/* store_verify.c — re-hash blobs, rebuild files (see store_verify.h). */
#include "store/store_verify.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/util.h"
#include "store/materialize.h"
#include "store/store_info.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void record_checkpoint(ckpt_store *s, int64_t id, bool ok, const char *error);
static void record_run(ckpt_store *s, const char *ref, const store_verify_result *r);

static void quiet_report(void *ctx, const char *line)
{
    (void)ctx;
    (void)line;
}

/* Rebuilds every file of c into a temp folder; 1 when it does not rebuild
 * (reported), 0 when it does, < 0 when the check itself could not run. */
static int rebuild_one(ckpt_store *s, const store_ckpt *c, store_verify_report report, void *ctx)
{
    char *base = store_tmp_base(s, "verify"), *tmp = NULL;
    int rc = base ? ckpt_tmpdir_create(base, &tmp) : CKPT_ENOMEM;
    free(base);
    if (rc) return ckpt_error_prefix(rc, "verify: temp folder");
    materialize_opts mo = {.rank = -1, .force = true, .quiet = true};
    int m = store_materialize(s, c, tmp, &mo);
    ckpt_rm_rf(tmp);
    free(tmp);
    if (m == 0) return 0;
    if (m == CKPT_ENOMEM || m == CKPT_ECANCELLED) return m;
    char *ref = store_ckpt_ref(c);
    char *line = ckpt_sprintf("%s: %s", ref ? ref : "?", ckpt_error_last());
    report(ctx, line ? line : ckpt_error_last());
    free(line);
    free(ref);
    return 1;
}

int store_verify(ckpt_store *s, const char *ref, store_verify_report report, void *ctx, store_verify_result *res)
{
    memset(res, 0, sizeof *res);
    if (!report) report = quiet_report;
    store_ckpt *v = NULL;
    size_t n = 0;
    int rc;
    if (ref) {
        v = ckpt_calloc(1, sizeof *v);
        rc = v ? store_resolve(s, ref, &v[0]) : CKPT_ENOMEM;
        if (!rc) n = 1;
    } else {
        rc = store_list(s, NULL, &v, &n);
    }
    if (rc) {
        free(v);
        return rc;
    }
    rc = store_verify_blobs(s, ref ? v[0].id : 0, report, ctx, &res->damaged_blobs);
    /* Damaged blobs are named already; rebuilding would only repeat them. */
    for (size_t i = 0; !rc && !res->damaged_blobs && i < n; i++) {
        int r = rebuild_one(s, &v[i], report, ctx);
        if (r < 0) rc = r;
        else res->broken_checkpoints += (uint64_t)r;
        res->checkpoints_checked++;
        if (r >= 0) record_checkpoint(s, v[i].id, r == 0, r ? ckpt_error_last() : NULL);
    }
    store_list_free(v, n);
    if (!rc) record_run(s, ref, res);
    return rc;
}

/* ---- the last outcomes, kept for the dashboard (schema/005_dashboard.sql) ---- */

/* Wall-clock seconds (ckpt_now is monotonic: it times, it does not date). */
static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A verify that ran is not undone by failing to note it: a failure to record
 * is a warning. */
static void record_failed(ckpt_store *s, const char *what)
{
    catalog_error(&s->cat, what);
    ckpt_warn("verify: %s", ckpt_error_last());
}

static void record_checkpoint(ckpt_store *s, int64_t id, bool ok, const char *error)
{
    ckpt_stmt *st;
    if (catalog_prepare(&s->cat, &st, "INSERT INTO verify_checkpoints(checkpoint_id, at, ok, error) VALUES (?, ?, ?, ?) "
                                      "ON CONFLICT (checkpoint_id) DO UPDATE SET at = excluded.at, ok = excluded.ok, "
                                      "error = excluded.error"))
        return;
    db_bind_int64(st, 1, id);
    db_bind_double(st, 2, wall_now());
    db_bind_int64(st, 3, ok);
    if (error) db_bind_text(st, 4, error);
    if (db_step(st) != DB_DONE) record_failed(s, "record the verify of a checkpoint");
    db_finalize(st);
}

static void record_run(ckpt_store *s, const char *ref, const store_verify_result *r)
{
    ckpt_stmt *st;
    if (catalog_prepare(&s->cat, &st, "INSERT INTO verify_runs(at, ref, clean, damaged_blobs, checkpoints_checked, "
                                      "broken_checkpoints) VALUES (?, ?, ?, ?, ?, ?)"))
        return;
    db_bind_double(st, 1, wall_now());
    if (ref) db_bind_text(st, 2, ref);
    db_bind_int64(st, 3, store_verify_clean(r));
    db_bind_int64(st, 4, (int64_t)r->damaged_blobs);
    db_bind_int64(st, 5, (int64_t)r->checkpoints_checked);
    db_bind_int64(st, 6, (int64_t)r->broken_checkpoints);
    if (db_step(st) != DB_DONE) record_failed(s, "record a verify run");
    db_finalize(st);
    if (catalog_exec(&s->cat, "DELETE FROM verify_runs WHERE id <= (SELECT max(id) FROM verify_runs) - 100"))
        ckpt_warn("verify: %s", ckpt_error_last());
}

int store_verify_last_run(ckpt_store *s, json_t **out)
{
    *out = NULL;
    ckpt_stmt *st;
    int rc = catalog_prepare(&s->cat, &st, "SELECT at, ref, clean, damaged_blobs, checkpoints_checked, broken_checkpoints "
                                           "FROM verify_runs ORDER BY id DESC LIMIT 1");
    if (rc) return rc;
    if (db_step(st) == DB_ROW)
        *out = json_pack("{s:f,s:s?,s:b,s:I,s:I,s:I}", "at", db_col_double(st, 0), "ref",
                         db_col_text(st, 1), "clean", (int)db_col_int64(st, 2),
                         "damaged_blobs", (json_int_t)db_col_int64(st, 3), "checkpoints_checked",
                         (json_int_t)db_col_int64(st, 4), "broken_checkpoints",
                         (json_int_t)db_col_int64(st, 5));
    db_finalize(st);
    return 0;
}

bool store_verify_clean(const store_verify_result *r)
{
    return !r->damaged_blobs && !r->broken_checkpoints;
}

json_t *store_verify_json(const store_verify_result *r)
{
    return json_pack("{s:b,s:I,s:I,s:I}", "clean", store_verify_clean(r), "damaged_blobs", (json_int_t)r->damaged_blobs,
                     "checkpoints_checked", (json_int_t)r->checkpoints_checked, "broken_checkpoints",
                     (json_int_t)r->broken_checkpoints);
}

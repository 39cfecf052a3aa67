/* stats.c — per-minute figures for the dashboard (see stats.h). */
#include "service/jobs/stats.h"

#include "common/db.h"
#include "common/error.h"
#include "service/jobs/queue_rows.h"

#include <math.h>

/* ?1 the minute, ?2 the name, ?3 the value. The larger of two values is
 * max(a, b) in SQLite and greatest(a, b) in PostgreSQL (where max is only an
 * aggregate). */
#define UPSERT_MAX_LITE                                                                                                \
    "INSERT INTO stats(bucket, name, kind, value) VALUES (?1, ?2, '', ?3) "                                            \
    "ON CONFLICT (bucket, name, kind) DO UPDATE SET value = max(stats.value, excluded.value)"
#define UPSERT_MAX_PG                                                                                                  \
    "INSERT INTO stats(bucket, name, kind, value) VALUES (?1, ?2, '', ?3) "                                            \
    "ON CONFLICT (bucket, name, kind) DO UPDATE SET value = greatest(stats.value, excluded.value)"
#define UPSERT_ADD                                                                                                     \
    "INSERT INTO stats(bucket, name, kind, value) VALUES (?1, ?2, '', ?3) "                                            \
    "ON CONFLICT (bucket, name, kind) DO UPDATE SET value = stats.value + excluded.value"

static int put(ckpt_db *d, const char *sql, int64_t bucket, const char *name, int64_t value)
{
    ckpt_stmt *st;
    int rc = db_prepare(d, &st, sql, "record a figure");
    if (rc) return rc;
    db_bind_int64(st, 1, bucket);
    db_bind_text(st, 2, name);
    db_bind_int64(st, 3, value);
    rc = db_run(st);
    db_finalize(st);
    return rc;
}

typedef struct {
    double now;
    int workers_busy;
    uint64_t served_bytes;
} sample_ctx;

static int sample_tx(ckpt_db *d, void *vctx)
{
    const sample_ctx *s = vctx;
    int64_t bucket = (int64_t)floor(s->now / STATS_BUCKET_SECONDS) * STATS_BUCKET_SECONDS;
    ckpt_stmt *st;
    int64_t depth = 0;
    int rc = db_prepare(d, &st, "SELECT count(*) FROM jobs WHERE state = 'queued'", "count queued jobs");
    if (rc) return rc;
    int e = db_step(st);
    if (e == DB_ROW) depth = db_col_int64(st, 0);
    else rc = e < 0 ? e : ckpt_error_set(CKPT_EIO, "count queued jobs: no row");
    db_finalize(st);
    const char *upsert_max = db_kind(d) == DB_PG ? UPSERT_MAX_PG : UPSERT_MAX_LITE;
    if (!rc) rc = put(d, upsert_max, bucket, "queue.depth", depth);
    if (!rc) rc = put(d, upsert_max, bucket, "workers.busy", s->workers_busy);
    if (!rc && s->served_bytes) rc = put(d, UPSERT_ADD, bucket, "bytes.served", (int64_t)s->served_bytes);
    if (!rc && !(rc = db_prepare(d, &st, "DELETE FROM stats WHERE bucket < ?", "prune figures"))) {
        db_bind_int64(st, 1, bucket - STATS_KEEP_SECONDS);
        rc = db_run(st);
        db_finalize(st);
    }
    return rc;
}

int stats_sample(catalog *c, double now, int workers_busy, uint64_t served_bytes)
{
    sample_ctx s = {now, workers_busy, served_bytes};
    return queue_in_tx(c, sample_tx, &s);
}

int stats_series(catalog *c, double since, double now, json_t **out)
{
    *out = NULL;
    if (since < now - STATS_KEEP_SECONDS) since = now - STATS_KEEP_SECONDS;
    ckpt_stmt *st;
    int rc = catalog_jobs_prepare(c, &st, "SELECT bucket, name, kind, value FROM stats WHERE bucket >= ? ORDER BY bucket, name, kind",
                                  "read figures");
    if (rc) return rc;
    db_bind_int64(st, 1, (int64_t)floor(since / STATS_BUCKET_SECONDS) * STATS_BUCKET_SECONDS);
    json_t *rows = json_array();
    int e = 0;
    while (rows && (e = db_step(st)) == DB_ROW)
        json_array_append_new(rows, json_pack("{s:I,s:s?,s:s?,s:I}", "t", (json_int_t)db_col_int64(st, 0), "name",
                                              db_col_text(st, 1), "kind", db_col_text(st, 2), "value",
                                              (json_int_t)db_col_int64(st, 3)));
    db_finalize(st);
    if (e < 0) {
        json_decref(rows);
        return e;
    }
    *out = rows ? json_pack("{s:i,s:f,s:f,s:o}", "bucket_seconds", STATS_BUCKET_SECONDS, "since", since, "now", now,
                            "rows", rows)
                : NULL;
    return *out ? 0 : ckpt_error_set(CKPT_ENOMEM, "out of memory");
}

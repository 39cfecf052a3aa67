/* stats.c — per-minute figures for the dashboard (see stats.h). */
#include "service/jobs/stats.h"

#include "common/error.h"

#include <math.h>

/* ?1 the minute, ?2 the name, ?3 the value. */
#define UPSERT_MAX "INSERT INTO stats(bucket, name, kind, value) VALUES (?1, ?2, '', ?3) " \
                   "ON CONFLICT DO UPDATE SET value = max(value, excluded.value)"
#define UPSERT_ADD "INSERT INTO stats(bucket, name, kind, value) VALUES (?1, ?2, '', ?3) " \
                   "ON CONFLICT DO UPDATE SET value = value + excluded.value"

static int put(catalog *c, const char *sql, int64_t bucket, const char *name, int64_t value)
{
    sqlite3_stmt *st;
    int rc = catalog_prepare(c, &st, sql);
    if (rc) return rc;
    sqlite3_bind_int64(st, 1, bucket);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, value);
    rc = sqlite3_step(st) == SQLITE_DONE ? 0 : catalog_error(c, "record a figure");
    sqlite3_finalize(st);
    return rc;
}

int stats_sample(catalog *c, double now, int workers_busy, uint64_t served_bytes)
{
    int64_t bucket = (int64_t)floor(now / STATS_BUCKET_SECONDS) * STATS_BUCKET_SECONDS;
    int rc = catalog_begin(c);
    if (rc) return rc;
    sqlite3_stmt *st;
    int64_t depth = 0;
    if (!(rc = catalog_prepare(c, &st, "SELECT count(*) FROM jobs WHERE state = 'queued'"))) {
        if (sqlite3_step(st) == SQLITE_ROW) depth = sqlite3_column_int64(st, 0);
        else rc = catalog_error(c, "count queued jobs");
        sqlite3_finalize(st);
    }
    if (!rc) rc = put(c, UPSERT_MAX, bucket, "queue.depth", depth);
    if (!rc) rc = put(c, UPSERT_MAX, bucket, "workers.busy", workers_busy);
    if (!rc && served_bytes) rc = put(c, UPSERT_ADD, bucket, "bytes.served", (int64_t)served_bytes);
    if (!rc && !(rc = catalog_prepare(c, &st, "DELETE FROM stats WHERE bucket < ?"))) {
        sqlite3_bind_int64(st, 1, bucket - STATS_KEEP_SECONDS);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : catalog_error(c, "prune figures");
        sqlite3_finalize(st);
    }
    if (rc) {
        catalog_rollback(c);
        return rc;
    }
    return catalog_commit(c);
}

int stats_series(catalog *c, double since, double now, json_t **out)
{
    *out = NULL;
    if (since < now - STATS_KEEP_SECONDS) since = now - STATS_KEEP_SECONDS;
    sqlite3_stmt *st;
    int rc = catalog_prepare(c, &st, "SELECT bucket, name, kind, value FROM stats WHERE bucket >= ? ORDER BY bucket, name, kind");
    if (rc) return rc;
    sqlite3_bind_int64(st, 1, (int64_t)floor(since / STATS_BUCKET_SECONDS) * STATS_BUCKET_SECONDS);
    json_t *rows = json_array();
    while (rows && sqlite3_step(st) == SQLITE_ROW)
        json_array_append_new(rows, json_pack("{s:I,s:s,s:s,s:I}", "t", (json_int_t)sqlite3_column_int64(st, 0), "name",
                                              (const char *)sqlite3_column_text(st, 1), "kind",
                                              (const char *)sqlite3_column_text(st, 2), "value",
                                              (json_int_t)sqlite3_column_int64(st, 3)));
    sqlite3_finalize(st);
    *out = rows ? json_pack("{s:i,s:f,s:f,s:o}", "bucket_seconds", STATS_BUCKET_SECONDS, "since", since, "now", now,
                            "rows", rows)
                : NULL;
    return *out ? 0 : ckpt_error_set(CKPT_ENOMEM, "out of memory");
}

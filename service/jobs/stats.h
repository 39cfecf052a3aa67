/*
 * stats.h — the figures behind the dashboard's charts, per minute over the
 * last day, in the queue's database (table `stats`, schema/005_dashboard.sql and
 * schema/pg/005_dashboard.sql: SQLite or PostgreSQL, catalog_jobs).
 *
 * Jobs that succeed or fail are counted by a trigger on the jobs table (one
 * row update per job that ends, per kind), with the bytes of those that
 * succeeded (their last progress). The daemon adds, about every
 * STATS_SAMPLE_SECONDS, the queue depth and busy workers (the highest sample
 * of each minute) and the HTTP body bytes sent since its last sample, and
 * deletes the minutes older than STATS_KEEP_SECONDS.
 */
#ifndef CKPT_SERVICE_JOBS_STATS_H
#define CKPT_SERVICE_JOBS_STATS_H

#include "store/catalog.h"

#include <jansson.h>
#include <stdint.h>

#define STATS_BUCKET_SECONDS 60
#define STATS_KEEP_SECONDS (24 * 3600)
#define STATS_SAMPLE_SECONDS 10.0

/* One sample at now: queue depth (queued jobs, read here), busy workers,
 * served_bytes sent since the last one; prunes old minutes. One transaction. */
int stats_sample(catalog *c, double now, int workers_busy, uint64_t served_bytes);
/* The minutes since `since` (clamped to the kept day), oldest first:
 * {"bucket_seconds": 60, "since": T, "now": T,
 *  "rows": [{"t": minute, "name": "jobs.failed", "kind": "fetch", "value": 2}, ...]}
 * ("kind" is "" for figures that have none). */
int stats_series(catalog *c, double since, double now, json_t **out);

#endif

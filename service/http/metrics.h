/*
 * metrics.h — the daemon's figures for GET /metrics, in the Prometheus text
 * exposition format (version 0.0.4).
 *
 * What the daemon observes as it goes is kept here, in memory, since its
 * start (Prometheus takes a restart for a counter reset):
 *
 *   ckpt_job_duration_seconds{kind,outcome}     histogram: a worker's run
 *   ckpt_job_queue_wait_seconds{kind}           histogram: created -> started
 *   ckpt_http_request_duration_seconds{route,code}  histogram; route is the
 *                                               pattern (/v1/jobs/{id}), not the path
 *   ckpt_fetched_bytes_total, ckpt_converted_bytes_total, ckpt_served_bytes_total
 *
 * What is a state of the store or the queue is read when scraped (the caller
 * passes it to metrics_render): store logical and physical bytes, blobs,
 * checkpoints, jobs by state, workers busy.
 */
#ifndef CKPT_SERVICE_HTTP_METRICS_H
#define CKPT_SERVICE_HTTP_METRICS_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

typedef struct metrics metrics;

metrics *metrics_new(void);
void metrics_free(metrics *m);

/* Every function below accepts m == NULL and then does nothing. */
void metrics_observe_http(metrics *m, const char *route, unsigned code, double seconds, uint64_t bytes);
/* A job that ended: outcome "succeeded", "failed", "retried" or "cancelled";
 * bytes (its last progress) count as fetched for `fetch` jobs and as converted
 * for the kinds that write layouts (convert, merge-lora, unmerge-lora). */
void metrics_observe_job(metrics *m, const char *kind, const char *outcome, double run_seconds, uint64_t bytes);
void metrics_observe_wait(metrics *m, const char *kind, double wait_seconds);
/* HTTP body bytes sent since start (the daemon samples it for stats.h). */
uint64_t metrics_served_bytes(metrics *m);

/* The figures read at scrape time. */
typedef struct {
    const json_t *queue;  /* queue_counts(): [{"state", "kind", "count"}] */
    const json_t *store;  /* store_du_json(), or NULL when it could not be read */
    int workers_busy, workers_max;
} metrics_now;

/* Writes the whole exposition to f. */
void metrics_render(metrics *m, const metrics_now *now, FILE *f);

/* The route pattern of a request path, for labels: "/v1/jobs/{id}/logs",
 * "/{repo}/resolve/{revision}/{path}", ...; "other" for what no route serves. */
const char *metrics_route(const char *path);

#endif

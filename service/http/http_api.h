/*
 * http_api.h — the daemon's HTTP API (libmicrohttpd), JSON over HTTP:
 *
 *   POST   /v1/jobs                {"kind", "args", "priority"?, "depends_on"?, "max_attempts"?}
 *   GET    /v1/jobs[?state=S&limit=N]
 *   GET    /v1/jobs/{id}
 *   DELETE /v1/jobs/{id}           cancel
 *   POST   /v1/jobs/{id}/retry
 *   GET    /v1/jobs/{id}/logs[?after=SEQ]
 *   GET    /v1/schedules           {"schedules": [...]} (ckpt sync ls --json)
 *   POST   /v1/schedules           {"repo", "revision"?, "every_seconds"|"cron", "layouts"?, "fetch"?}
 *   GET    /v1/schedules/{id}
 *   DELETE /v1/schedules/{id}
 *   POST   /v1/schedules/{id}/run  queue its sync job now
 *   GET    /v1/store               ckpt du --json
 *   GET    /v1/runs[?run=R]        {"steps": [...]} (ckpt state ls --json)
 *   GET    /healthz                (no token needed)
 *   GET    /metrics                Prometheus text
 *   GET    /, /assets/...          the web dashboard (dashboard.h; no token needed)
 *   and the store's routes: /v1/checkpoints... (store_api.h), the Hub read API (hub_api.h)
 *
 * Tokens (--token-file: one "TOKEN [read|admin]" per line, admin when the role
 * is left out): with any configured, every request but /healthz and the
 * dashboard's files (dashboard.h) needs "Authorization: Bearer TOKEN" (401),
 * compared in constant time; a read token reads; every other method on /v1/
 * (submit, cancel, retry, rm, schedules) needs an admin token (403). Without tokens the API
 * listens on loopback only. Jobs that name host paths (import, consolidate,
 * merge-lora with a folder) are refused (403) unless every path resolves
 * beneath an allowed root (--allow-path); submitted jobs carry
 * "origin": "http" so the worker checks them again. Bodies over HTTP_MAX_BODY get 413; malformed JSON,
 * unknown kinds and bad arguments 400.
 */
#ifndef CKPT_SERVICE_HTTP_HTTP_API_H
#define CKPT_SERVICE_HTTP_HTTP_API_H

#include <stdatomic.h>
#include <stdint.h>

#define HTTP_MAX_BODY (1u << 20)
#define HTTP_MAX_TOKENS 1024
#define HTTP_STORE_POOL 8           /* catalog connections requests share */
#define HTTP_MAX_CONNECTIONS 256     /* all clients together */
#define HTTP_PER_IP_DEFAULT 32       /* connections one client address may hold */
#define HTTP_IDLE_TIMEOUT_DEFAULT 15 /* seconds a connection may send nothing (headers included) */

typedef struct http_api http_api;

typedef struct {
    const char *listen;     /* "HOST:PORT"; port 0 picks a free one */
    const char *token_file; /* NULL: no tokens, loopback only */
    const char *home; /* CKPT_HOME: the queue and the store it serves */
    atomic_int *running_workers; /* for /metrics and /healthz */
    int workers;                 /* --workers, for /metrics */
    int per_ip, idle_timeout; /* 0: HTTP_PER_IP_DEFAULT, HTTP_IDLE_TIMEOUT_DEFAULT */
    char *const *allow_roots; /* host folders jobs may name (jobs_paths_check); NULL: none */
} http_api_opts;

int http_api_start(http_api **out, const http_api_opts *o);
/* The figures /metrics shows (metrics.h), which the daemon adds its jobs' to; NULL for h NULL. */
struct metrics;
struct metrics *http_api_metrics(http_api *h);
/* The bound address, "http://HOST:PORT". */
const char *http_api_url(const http_api *h);
void http_api_stop(http_api *h);

#endif

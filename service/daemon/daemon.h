/* daemon.h — `ckpt serve`: see daemon.c for what the loop does. */
#ifndef CKPT_SERVICE_DAEMON_DAEMON_H
#define CKPT_SERVICE_DAEMON_DAEMON_H

#include <stdbool.h>

typedef struct {
    const char *home;
    const char *listen;     /* "127.0.0.1:8470" */
    const char *token_file;
    int workers;            /* at most this many worker processes */
    double grace_seconds;   /* on SIGTERM: how long running jobs may finish */
    double timeout_seconds; /* 0: per-kind defaults */
    bool no_http;
    int per_ip, idle_timeout; /* HTTP limits; 0: defaults (http_api.h) */
    double keep_jobs;       /* seconds finished jobs and their logs are kept (0: pruned at once) */
    char *const *allow_roots; /* --allow-path, canonical, NULL-terminated: host folders HTTP jobs may name */
} daemon_opts;

#define DAEMON_KEEP_JOBS_DEFAULT (30 * 86400.0) /* --keep-jobs 30d */
#define DAEMON_PRUNE_SECONDS 1.0                 /* how often finished jobs past keep_jobs are pruned */

int daemon_run(const daemon_opts *o);

#endif

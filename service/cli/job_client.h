/*
 * job_client.h — what the job commands need, from the local queue (SQLite in
 * CKPT_HOME) or from a daemon's HTTP API (--server URL / CKPT_SERVER, token in
 * CKPT_TOKEN). Both give the same JSON: the job objects of queue_job_json().
 */
#ifndef CKPT_SERVICE_CLI_JOB_CLIENT_H
#define CKPT_SERVICE_CLI_JOB_CLIENT_H

#include "service/jobs/queue.h"
#include "store/catalog.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct {
    char *server; /* NULL: local */
    char *token;
    catalog cat;
    bool open;
} job_client;

/* server: --server value or NULL (then $CKPT_SERVER, else local in home). */
int job_client_open(job_client *c, const char *home, const char *server);
void job_client_close(job_client *c);
int job_client_submit(job_client *c, const char *kind, json_t *args, const queue_submit_opts *o, json_t **job,
                      bool *existed);
int job_client_get(job_client *c, int64_t id, json_t **job);
int job_client_list(job_client *c, const char *state, json_t **jobs);
int job_client_cancel(job_client *c, int64_t id, json_t **job);
int job_client_retry(job_client *c, int64_t id, json_t **job);
int job_client_logs(job_client *c, int64_t id, int64_t after, json_t **lines, int64_t *last);

#endif

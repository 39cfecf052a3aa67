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

/* server: --server value or NULL (then local when home is given, else
 * $CKPT_SERVER, else local: cli_server()). */
int job_client_open(job_client *c, const char *home, const char *server);
void job_client_close(job_client *c);
/* One request to the daemon (c->server set): METHOD PATH with the JSON body
 * (or none); *out the JSON answer. An answer of 400 or above is an error
 * naming the server, the status and the daemon's message (404:
 * CKPT_ENOTFOUND). status may be NULL. */
int job_client_call(job_client *c, const char *method, const char *path, const json_t *body, json_t **out,
                    long *status);
/* A path segment with everything but unreserved characters percent-encoded
 * (a ref's '/' becomes %2F); malloc'd. */
char *job_client_escape(const char *s);
/* Submits KIND ARGS as a job and follows it to its end (quietly); *result is
 * the job's result on success. A failed or cancelled job is an error with
 * its message. */
int job_client_run(job_client *c, const char *kind, json_t *args, json_t **result);
int job_client_submit(job_client *c, const char *kind, json_t *args, const queue_submit_opts *o, json_t **job,
                      bool *existed);
int job_client_get(job_client *c, int64_t id, json_t **job);
int job_client_list(job_client *c, const char *state, int limit, json_t **jobs);
int job_client_cancel(job_client *c, int64_t id, json_t **job);
int job_client_retry(job_client *c, int64_t id, json_t **job);
int job_client_logs(job_client *c, int64_t id, int64_t after, json_t **lines, int64_t *last);

#endif

/*
 * schedule.h — scheduled Hub syncs (schema/003_schedules.sql).
 *
 * A schedule follows ORG/NAME@REV every N seconds (--every 6h) or on a cron
 * expression in UTC (--cron "M H DOM MON DOW"), with the layouts to convert
 * each new commit into. Its next_run_at lives in the database, so a daemon
 * restart neither loses nor doubles a run:
 *
 *   schedule_queue_due() (the daemon, about once a second) queues one `sync`
 *   job {"schedule": ID} per due schedule — the queue's unique key returns
 *   the job already queued or running, so never two at once — and moves
 *   next_run_at past now, in the same transaction: for --every to the next
 *   period (or now + period when periods were missed), for cron to the next
 *   match. A crash leaves both steps or neither. After downtime a missed
 *   schedule therefore runs once, not once per period. With the queue on
 *   PostgreSQL (store/catalog.h) every daemon looks; the due rows are locked
 *   (FOR UPDATE SKIP LOCKED) while they fire, so each fires once.
 *
 *   sync_run() (the `sync` job, in a worker) resolves the revision on the
 *   Hub. When the commit is the last one seen and is stored, it queues
 *   nothing. Else it queues a `fetch` pinned to that commit (unless it is
 *   stored already) and one `convert` per layout depending on the fetch, and
 *   records the commit and what it did in the schedule (last_commit,
 *   last_outcome).
 */
#ifndef CKPT_SERVICE_JOBS_SCHEDULE_H
#define CKPT_SERVICE_JOBS_SCHEDULE_H

#include "store/store.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define SCHEDULE_MIN_EVERY 1 /* seconds */
#define SCHEDULE_MAX_EVERY (366LL * 86400)
#define SCHEDULE_MAX_LAYOUTS 32
#define SCHEDULE_MAX_DUE_PER_TICK 100

typedef struct {
    int64_t id;
    char *repo, *revision;
    int64_t every_seconds; /* 0 when cron */
    char *cron;            /* NULL when every */
    json_t *layouts;       /* [{"layout": L, "tp": N}] */
    json_t *fetch_args;    /* {"include": [...], "exclude": [...]} */
    double next_run_at, last_run_at, created_at;
    char *last_commit, *last_outcome;
    int64_t last_job_id;
    bool paused; /* not queued when due (schedule_set_paused) */
} schedule;

/* "90", "90s", "30m", "6h", "1d", "2w" -> seconds (SCHEDULE_MIN..MAX_EVERY). */
int schedule_parse_every(const char *text, int64_t *seconds);
/* When a schedule runs next after running (or being due) at now. */
int schedule_next_after(const schedule *sc, double now, double *next);

/* Adds sc (repo, revision, every_seconds or cron, layouts, fetch_args);
 * sets sc->id and sc->next_run_at (now for --every: the first run is at
 * once; the next match for cron). */
int schedule_add(catalog *c, schedule *sc);
/* A schedule from its JSON (POST /v1/schedules): {"repo", "revision"?,
 * "every_seconds" | "cron", "layouts"?: [{"layout", "tp"?}], "fetch"?:
 * {"include"?, "exclude"?}}; every field checked, unknown ones refused.
 * schedule_add checks the rest (repo name, layouts). */
int schedule_from_json(const json_t *j, schedule *sc);
int schedule_get(catalog *c, int64_t id, schedule *out);
int schedule_list(catalog *c, schedule **out, size_t *n);
int schedule_remove(catalog *c, int64_t id);
/* A paused schedule is skipped by schedule_queue_due (run now still queues
 * it); resumed, it runs at its next_run_at, at once when that has passed. */
int schedule_set_paused(catalog *c, int64_t id, bool paused);
void schedule_free(schedule *sc);
void schedules_free(schedule *v, size_t n);
json_t *schedule_json(const schedule *sc);

/* What a sync job saw (commit may be NULL: keep the last) and did. */
int schedule_record(catalog *c, int64_t id, const char *commit, const char *outcome);

/* Run now (`ckpt sync run ID`, POST /v1/schedules/{id}/run): queues the
 * schedule's sync job whether it is due or paused (the one queued or running
 * already, *existed) and records it as the schedule's last job, in one
 * transaction; CKPT_ENOTFOUND when there is no such schedule. */
int schedule_run_now(catalog *c, int64_t id, int64_t *job, bool *existed);
/* The daemon's tick: queues the due schedules' sync jobs; *queued counts new jobs. */
int schedule_queue_due(catalog *c, double now, int *queued);
/* The `sync` job: see above. */
int sync_run(ckpt_store *s, int64_t schedule_id, json_t **result);

#endif

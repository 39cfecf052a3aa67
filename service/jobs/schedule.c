/* schedule.c — the schedules table and the daemon's due check (see schedule.h). */
#include "service/jobs/schedule.h"

#include "common/error.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "service/jobs/cron.h"
#include "service/jobs/queue.h"
#include "service/jobs/queue_rows.h"
#include "transform/presets.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int schedule_parse_every(const char *text, int64_t *seconds)
{
    char *end;
    const char *p = text ? text : "";
    if (!isdigit((unsigned char)*p)) goto bad;
    unsigned long long n = strtoull(p, &end, 10);
    int64_t unit = 1;
    if (!strcmp(end, "") || !strcmp(end, "s"))
        unit = 1;
    else if (!strcmp(end, "m"))
        unit = 60;
    else if (!strcmp(end, "h"))
        unit = 3600;
    else if (!strcmp(end, "d"))
        unit = 86400;
    else if (!strcmp(end, "w"))
        unit = 7 * 86400;
    else
        goto bad;
    if (n < SCHEDULE_MIN_EVERY || n > (unsigned long long)(SCHEDULE_MAX_EVERY / unit) ||
        n * (unsigned long long)unit < SCHEDULE_MIN_EVERY)
        return ckpt_error_set(CKPT_EINVAL, "--every '%s': must be from 1s to 366d", text);
    *seconds = (int64_t)n * unit;
    return 0;
bad:
    return ckpt_error_set(CKPT_EINVAL,
                          "--every '%s': expected a number with s, m, h, d or w (e.g. 30m, 6h, 1d)",
                          text ? text : "");
}

int schedule_next_after(const schedule *sc, double now, double *next)
{
    if (sc->cron) {
        cron_spec c;
        int64_t t;
        int rc = cron_parse(sc->cron, &c);
        if (!rc) rc = cron_next(&c, (int64_t)now, &t);
        if (!rc) *next = (double)t;
        return rc;
    }
    /* Keep the phase; after missed periods, one run now and the next a whole period later. */
    double n = sc->next_run_at + (double)sc->every_seconds;
    *next = n > now ? n : now + (double)sc->every_seconds;
    return 0;
}

static char *col_text(ckpt_stmt *st, int i)
{
    const char *t = db_col_text(st, i);
    return t ? ckpt_strdup(t) : NULL;
}

static json_t *col_json(ckpt_stmt *st, int i, bool array)
{
    const char *t = db_col_text(st, i);
    json_error_t err;
    json_t *j = t ? json_loads(t, 0, &err) : NULL;
    if (!j) j = array ? json_array() : json_object();
    return j;
}

#define SCHEDULE_COLUMNS                                                                           \
    "id, repo, revision, every_seconds, cron, layouts, fetch_args, next_run_at, last_run_at, "     \
    "created_at, "                                                                                 \
    "last_commit, last_outcome, last_job_id, paused"

static int read_schedule(ckpt_stmt *st, schedule *sc)
{
    memset(sc, 0, sizeof *sc);
    sc->id = db_col_int64(st, 0);
    sc->repo = col_text(st, 1);
    sc->revision = col_text(st, 2);
    sc->every_seconds = db_col_int64(st, 3);
    sc->cron = col_text(st, 4);
    sc->layouts = col_json(st, 5, true);
    sc->fetch_args = col_json(st, 6, false);
    sc->next_run_at = db_col_double(st, 7);
    sc->last_run_at = db_col_double(st, 8);
    sc->created_at = db_col_double(st, 9);
    sc->last_commit = col_text(st, 10);
    sc->last_outcome = col_text(st, 11);
    sc->last_job_id = db_col_int64(st, 12);
    sc->paused = db_col_int64(st, 13) != 0;
    if (!sc->repo || !sc->revision || !sc->layouts || !sc->fetch_args) {
        schedule_free(sc);
        return ckpt_error_set(CKPT_ENOMEM, "out of memory reading a schedule");
    }
    return 0;
}

/* A list of at most 64 glob strings of up to 1024 bytes, or absent. */
static int check_globs(const json_t *fetch, const char *key)
{
    const json_t *l = json_object_get(fetch, key);
    if (!l) return 0;
    if (!json_is_array(l) || json_array_size(l) > 64)
        return ckpt_error_set(CKPT_EINVAL, "schedule 'fetch.%s': expected a list of at most 64 patterns", key);
    size_t i;
    const json_t *g;
    json_array_foreach(l, i, g) if (!json_is_string(g) || json_string_length(g) > 1024 || !json_string_length(g))
        return ckpt_error_set(CKPT_EINVAL, "schedule 'fetch.%s'[%zu]: expected a pattern of 1-1024 bytes", key, i);
    return 0;
}

int schedule_from_json(const json_t *j, schedule *sc)
{
    memset(sc, 0, sizeof *sc);
    if (!json_is_object(j)) return ckpt_error_set(CKPT_EINVAL, "a schedule is a JSON object");
    const char *keys[] = {"repo", "revision", "every_seconds", "cron", "layouts", "fetch"};
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)j, k, v)
    {
        size_t i = 0;
        while (i < CKPT_ARRAY_LEN(keys) && strcmp(k, keys[i])) i++;
        if (i == CKPT_ARRAY_LEN(keys))
            return ckpt_error_set(CKPT_EINVAL, "schedule: unknown field '%s' (repo, revision, every_seconds, cron, "
                                               "layouts, fetch)", k);
    }
    const char *repo = json_string_value(json_object_get(j, "repo")),
               *rev = json_string_value(json_object_get(j, "revision")),
               *cron = json_string_value(json_object_get(j, "cron"));
    json_t *every = json_object_get(j, "every_seconds"), *layouts = json_object_get(j, "layouts"),
           *fetch = json_object_get(j, "fetch");
    if (!repo) return ckpt_error_set(CKPT_EINVAL, "schedule: 'repo' (ORG/NAME) is required");
    if (json_object_get(j, "revision") && !rev) return ckpt_error_set(CKPT_EINVAL, "schedule 'revision': expected a string");
    if (!cron == !every) return ckpt_error_set(CKPT_EINVAL, "schedule: give 'every_seconds' or 'cron' (one of them)");
    if (every && (!json_is_integer(every) || json_integer_value(every) < SCHEDULE_MIN_EVERY ||
                  json_integer_value(every) > SCHEDULE_MAX_EVERY))
        return ckpt_error_set(CKPT_EINVAL, "schedule 'every_seconds': expected a whole number from %d to %lld",
                              SCHEDULE_MIN_EVERY, SCHEDULE_MAX_EVERY);
    cron_spec cs;
    if (cron && cron_parse(cron, &cs) < 0) return ckpt_error_set(CKPT_EINVAL, "schedule 'cron': %s", ckpt_error_last());
    if (layouts && !json_is_array(layouts)) return ckpt_error_set(CKPT_EINVAL, "schedule 'layouts': expected a list");
    size_t i;
    json_t *l;
    json_array_foreach(layouts, i, l)
    {
        json_t *tp = json_object_get(l, "tp");
        if (!json_is_object(l) || !json_is_string(json_object_get(l, "layout")) || json_object_size(l) > 1u + !!tp ||
            (tp && (!json_is_integer(tp) || json_integer_value(tp) < 1 || json_integer_value(tp) > 1024)))
            return ckpt_error_set(CKPT_EINVAL, "schedule 'layouts'[%zu]: expected {\"layout\": L, \"tp\": 1-1024}", i);
    }
    if (fetch && (!json_is_object(fetch) || json_object_size(fetch) > (size_t)!!json_object_get(fetch, "include") +
                                                                         !!json_object_get(fetch, "exclude")))
        return ckpt_error_set(CKPT_EINVAL, "schedule 'fetch': expected {\"include\": [...], \"exclude\": [...]}");
    int rc = check_globs(fetch, "include");
    if (!rc) rc = check_globs(fetch, "exclude");
    if (rc) return rc;
    sc->repo = ckpt_strdup(repo);
    sc->revision = ckpt_strdup(rev && *rev ? rev : "main");
    sc->cron = cron ? ckpt_strdup(cron) : NULL;
    sc->every_seconds = every ? json_integer_value(every) : 0;
    sc->layouts = layouts ? json_deep_copy(layouts) : json_array();
    sc->fetch_args = fetch ? json_deep_copy(fetch) : json_object();
    if (!sc->repo || !sc->revision || (cron && !sc->cron) || !sc->layouts || !sc->fetch_args) {
        schedule_free(sc);
        return ckpt_error_set(CKPT_ENOMEM, "out of memory reading a schedule");
    }
    return 0;
}

void schedule_free(schedule *sc)
{
    free(sc->repo);
    free(sc->revision);
    free(sc->cron);
    json_decref(sc->layouts);
    json_decref(sc->fetch_args);
    free(sc->last_commit);
    free(sc->last_outcome);
    memset(sc, 0, sizeof *sc);
}

void schedules_free(schedule *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        schedule_free(&v[i]);
    free(v);
}

int schedule_add(catalog *c, schedule *sc)
{
    int rc = store_repo_name_check(sc->repo);
    if (rc) return rc;
    if (!sc->revision || !*sc->revision || strlen(sc->revision) > 255)
        return ckpt_error_set(CKPT_EINVAL, "a revision must be 1-255 characters");
    if (!sc->cron == !sc->every_seconds)
        return ckpt_error_set(CKPT_EINVAL, "a schedule needs --every or --cron (one of them)");
    if (json_array_size(sc->layouts) > SCHEDULE_MAX_LAYOUTS)
        return ckpt_error_set(CKPT_ELIMIT, "more than %d layouts", SCHEDULE_MAX_LAYOUTS);
    size_t li;
    json_t *l;
    json_array_foreach(sc->layouts, li, l)
    {
        /* A bad layout is refused now, not when the first sync converts hours later. */
        json_t *tp = json_object_get(l, "tp");
        json_int_t n = tp ? json_integer_value(tp) : 1;
        preset_opts po = {.preset = json_string_value(json_object_get(l, "layout")),
                          .tp = n < 0 || n > 1024 ? 0 : (int)n};
        if ((rc = preset_check(&po))) return rc;
    }
    double now = queue_now();
    sc->next_run_at = now;
    if (sc->cron && (rc = schedule_next_after(sc, now, &sc->next_run_at))) return rc;
    char *layouts = cj_dumps(sc->layouts, JSON_COMPACT),
         *fetch = cj_dumps(sc->fetch_args, JSON_COMPACT | JSON_SORT_KEYS);
    ckpt_db *d = NULL;
    ckpt_stmt *st = NULL;
    rc = layouts && fetch ? catalog_jobs(c, &d) : CKPT_ENOMEM;
    if (!rc)
        rc = db_prepare(d, &st,
                        "INSERT INTO schedules(repo, revision, every_seconds, cron, layouts, fetch_args, "
                        "next_run_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                        "add schedule");
    if (!rc) {
        db_bind_text(st, 1, sc->repo);
        db_bind_text(st, 2, sc->revision);
        if (sc->every_seconds) db_bind_int64(st, 3, sc->every_seconds);
        db_bind_text(st, 4, sc->cron);
        db_bind_text(st, 5, layouts);
        db_bind_text(st, 6, fetch);
        db_bind_double(st, 7, sc->next_run_at);
        db_bind_double(st, 8, now);
        int e = db_step(st); /* one statement: its own transaction on either engine */
        if (e == DB_ROW) sc->id = db_col_int64(st, 0);
        rc = e < 0 ? e : db_run(st);
        sc->created_at = now;
    }
    db_finalize(st);
    free(layouts);
    free(fetch);
    return rc;
}

/* One statement of schedules in its own transaction; *changes gets its rows. */
static int one_statement(ckpt_stmt *st, int64_t *changes)
{
    ckpt_db *d = db_stmt_db(st);
    int rc = db_begin(d);
    if (!rc) rc = db_run(st);
    if (!rc && changes) *changes = db_changes(st);
    if (rc) {
        db_rollback(d);
        return rc;
    }
    return db_commit(d);
}

int schedule_get(catalog *c, int64_t id, schedule *out)
{
    ckpt_stmt *st;
    int rc = catalog_jobs_prepare(c, &st, "SELECT " SCHEDULE_COLUMNS " FROM schedules WHERE id = ?", "read schedule");
    if (rc) return rc;
    db_bind_int64(st, 1, id);
    int e = db_step(st);
    if (e == DB_ROW)
        rc = read_schedule(st, out);
    else if (e == DB_DONE)
        rc = ckpt_error_set(CKPT_ENOTFOUND, "no schedule %lld (see ckpt sync ls)", (long long)id);
    else
        rc = e;
    db_finalize(st);
    return rc;
}

int schedule_list(catalog *c, schedule **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    ckpt_stmt *st;
    int rc = catalog_jobs_prepare(c, &st, "SELECT " SCHEDULE_COLUMNS " FROM schedules ORDER BY id", "list schedules");
    if (rc) return rc;
    size_t cap = 0;
    int e = 0;
    while (!rc && (e = db_step(st)) == DB_ROW) {
        if ((rc = ckpt_grow(out, &cap, *n + 1, sizeof **out))) break;
        if (!(rc = read_schedule(st, &(*out)[*n]))) (*n)++;
    }
    if (!rc && e < 0) rc = e;
    db_finalize(st);
    if (rc) {
        schedules_free(*out, *n);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

/* Runs sql (a change of schedule id, its ? parameters: paused then id, or
 * id alone when paused < 0); no such schedule is CKPT_ENOTFOUND. */
static int change_schedule(catalog *c, int64_t id, int paused, const char *sql, const char *what)
{
    ckpt_stmt *st;
    int64_t changed = 0;
    int rc = catalog_jobs_prepare(c, &st, sql, what);
    if (rc) return rc;
    int i = 1;
    if (paused >= 0) db_bind_int64(st, i++, paused);
    db_bind_int64(st, i, id);
    rc = one_statement(st, &changed);
    db_finalize(st);
    if (!rc && !changed) rc = ckpt_error_set(CKPT_ENOTFOUND, "no schedule %lld (see ckpt sync ls)", (long long)id);
    return rc;
}

int schedule_remove(catalog *c, int64_t id)
{
    return change_schedule(c, id, -1, "DELETE FROM schedules WHERE id = ?", "remove schedule");
}

int schedule_set_paused(catalog *c, int64_t id, bool paused)
{
    return change_schedule(c, id, paused ? 1 : 0, "UPDATE schedules SET paused = ? WHERE id = ?",
                           paused ? "pause schedule" : "resume schedule");
}

json_t *schedule_json(const schedule *sc)
{
    json_t *j =
        json_pack("{s:I,s:s,s:s,s:O,s:O,s:f,s:f}", "id", (json_int_t)sc->id, "repo", sc->repo,
                  "revision", sc->revision, "layouts", sc->layouts, "fetch", sc->fetch_args,
                  "next_run_at", sc->next_run_at, "created_at", sc->created_at);
    if (!j) return NULL;
    if (sc->cron)
        json_object_set_new(j, "cron", json_string(sc->cron));
    else
        json_object_set_new(j, "every_seconds", json_integer(sc->every_seconds));
    if (sc->last_run_at) json_object_set_new(j, "last_run_at", json_real(sc->last_run_at));
    if (sc->last_commit) json_object_set_new(j, "last_commit", json_string(sc->last_commit));
    if (sc->last_outcome) json_object_set_new(j, "last_outcome", json_string(sc->last_outcome));
    if (sc->last_job_id) json_object_set_new(j, "last_job_id", json_integer(sc->last_job_id));
    json_object_set_new(j, "paused", json_boolean(sc->paused));
    return j;
}

int schedule_record(catalog *c, int64_t id, const char *commit, const char *outcome)
{
    ckpt_stmt *st;
    int rc = catalog_jobs_prepare(c, &st,
                                  "UPDATE schedules SET last_run_at = ?, last_commit = coalesce(?, last_commit), "
                                  "last_outcome = ? WHERE id = ?",
                                  "record sync outcome");
    if (rc) return rc;
    db_bind_double(st, 1, queue_now());
    db_bind_text(st, 2, commit);
    db_bind_text(st, 3, outcome);
    db_bind_int64(st, 4, id);
    rc = one_statement(st, NULL);
    db_finalize(st);
    return rc;
}

/* ---- the daemon's tick ---- */

/* Queues schedule id's sync job inside the caller's transaction on d (the
 * job queued or running already, when there is one). */
static int queue_sync(ckpt_db *d, int64_t id, int64_t *job, bool *existed)
{
    json_t *args = json_pack("{s:I}", "schedule", (json_int_t)id);
    queue_submit_opts qo = {.max_attempts = 2};
    int rc = args ? queue_submit_in(d, "sync", args, &qo, job, existed) : CKPT_ENOMEM;
    json_decref(args);
    return rc;
}

typedef struct {
    int64_t id, *job;
    bool *existed;
} run_now_ctx;

static int run_now_tx(ckpt_db *d, void *v)
{
    run_now_ctx *r = v;
    ckpt_stmt *st;
    int rc = queue_sync(d, r->id, r->job, r->existed);
    if (!rc) rc = db_prepare(d, &st, "UPDATE schedules SET last_job_id = ? WHERE id = ?", "record the schedule's job");
    if (rc) return rc;
    db_bind_int64(st, 1, *r->job);
    db_bind_int64(st, 2, r->id);
    rc = db_run(st);
    if (!rc && !db_changes(st)) rc = ckpt_error_set(CKPT_ENOTFOUND, "no schedule %lld", (long long)r->id);
    db_finalize(st);
    return rc;
}

int schedule_run_now(catalog *c, int64_t id, int64_t *job, bool *existed)
{
    *job = 0;
    *existed = false;
    return queue_in_tx(c, run_now_tx, &(run_now_ctx){id, job, existed});
}

/* Queues one due schedule's sync job and moves its next_run_at, inside the
 * caller's transaction, which holds the schedule's row. */
static int fire(ckpt_db *d, const schedule *sc, double now, int64_t *job, bool *existed, double *next)
{
    int rc = queue_sync(d, sc->id, job, existed);
    if (!rc) rc = schedule_next_after(sc, now, next);
    if (rc == CKPT_ENOTFOUND) { /* an impossible date ("0 0 31 2 *"): park it */
        *next = now + CRON_HORIZON_SECONDS;
        rc = 0;
    }
    ckpt_stmt *st;
    if (!rc)
        rc = db_prepare(d, &st,
                        "UPDATE schedules SET next_run_at = ?, last_job_id = coalesce(?, last_job_id) WHERE id = ?",
                        "advance schedule");
    if (rc) return rc;
    db_bind_double(st, 1, *next);
    if (*job) db_bind_int64(st, 2, *job);
    db_bind_int64(st, 3, sc->id);
    rc = db_run(st);
    db_finalize(st);
    return rc;
}

int schedule_queue_due(catalog *c, double now, int *queued)
{
    if (queued) *queued = 0;
    ckpt_db *d;
    ckpt_stmt *st;
    int rc = catalog_jobs(c, &d);
    if (!rc) rc = db_begin(d);
    if (rc) return rc;
    /* Reading, queueing and moving next_run_at are one transaction: on SQLite
     * the write lock, on PostgreSQL the due rows locked (SKIP LOCKED: a row
     * another daemon is firing is its business), so every daemon sharing the
     * database may look and a schedule still fires once per due time. */
    rc = db_prepare(d, &st,
                    db_kind(d) == DB_PG ? "SELECT " SCHEDULE_COLUMNS " FROM schedules WHERE next_run_at <= ? AND paused = 0 ORDER BY "
                                          "next_run_at LIMIT ? FOR UPDATE SKIP LOCKED"
                                        : "SELECT " SCHEDULE_COLUMNS " FROM schedules WHERE next_run_at <= ? AND paused = 0 ORDER BY "
                                          "next_run_at LIMIT ?",
                    "find due schedules");
    if (rc) {
        db_rollback(d);
        return rc;
    }
    db_bind_double(st, 1, now);
    db_bind_int64(st, 2, SCHEDULE_MAX_DUE_PER_TICK);
    schedule due[SCHEDULE_MAX_DUE_PER_TICK];
    int64_t jobs[SCHEDULE_MAX_DUE_PER_TICK];
    bool existed[SCHEDULE_MAX_DUE_PER_TICK];
    double next[SCHEDULE_MAX_DUE_PER_TICK];
    size_t n = 0;
    int e = 0;
    while (!rc && n < SCHEDULE_MAX_DUE_PER_TICK && (e = db_step(st)) == DB_ROW)
        if (!(rc = read_schedule(st, &due[n]))) n++;
    if (!rc && e < 0) rc = e;
    db_finalize(st);
    if (!rc && n == 0) { /* the common case: nothing due, nothing to commit */
        db_rollback(d);
        return 0;
    }
    for (size_t i = 0; !rc && i < n; i++) {
        jobs[i] = 0;
        existed[i] = false;
        rc = fire(d, &due[i], now, &jobs[i], &existed[i], &next[i]);
    }
    if (rc) db_rollback(d);
    else rc = db_commit(d);
    for (size_t i = 0; !rc && i < n; i++) {
        schedule *sc = &due[i];
        if (!existed[i] && queued) (*queued)++;
        ckpt_event(CKPT_EV_INFO, "schedule.fired",
                   json_pack("{s:I,s:s,s:s,s:I,s:b,s:f}", "schedule", (json_int_t)sc->id, "repo", sc->repo, "revision",
                             sc->revision, "job", (json_int_t)jobs[i], "existed", existed[i], "next_in_seconds",
                             next[i] - now));
    }
    for (size_t i = 0; i < n; i++)
        schedule_free(&due[i]);
    return rc;
}

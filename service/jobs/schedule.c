/* schedule.c — the schedules table and the daemon's due check (see schedule.h). */
#include "service/jobs/schedule.h"

#include "common/error.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "service/jobs/cron.h"
#include "service/jobs/queue.h"
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

static char *col_text(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? ckpt_strdup((const char *)t) : NULL;
}

static json_t *col_json(sqlite3_stmt *st, int i, bool array)
{
    const char *t = (const char *)sqlite3_column_text(st, i);
    json_error_t err;
    json_t *j = t ? json_loads(t, 0, &err) : NULL;
    if (!j) j = array ? json_array() : json_object();
    return j;
}

#define SCHEDULE_COLUMNS                                                                           \
    "id, repo, revision, every_seconds, cron, layouts, fetch_args, next_run_at, last_run_at, "     \
    "created_at, "                                                                                 \
    "last_commit, last_outcome, last_job_id, paused"

static int read_schedule(sqlite3_stmt *st, schedule *sc)
{
    memset(sc, 0, sizeof *sc);
    sc->id = sqlite3_column_int64(st, 0);
    sc->repo = col_text(st, 1);
    sc->revision = col_text(st, 2);
    sc->every_seconds = sqlite3_column_int64(st, 3);
    sc->cron = col_text(st, 4);
    sc->layouts = col_json(st, 5, true);
    sc->fetch_args = col_json(st, 6, false);
    sc->next_run_at = sqlite3_column_double(st, 7);
    sc->last_run_at = sqlite3_column_double(st, 8);
    sc->created_at = sqlite3_column_double(st, 9);
    sc->last_commit = col_text(st, 10);
    sc->last_outcome = col_text(st, 11);
    sc->last_job_id = sqlite3_column_int64(st, 12);
    sc->paused = sqlite3_column_int(st, 13) != 0;
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
    sqlite3_stmt *st = NULL;
    rc = layouts && fetch ? catalog_begin(c) : CKPT_ENOMEM;
    if (!rc)
        rc = catalog_prepare(
            c, &st,
            "INSERT INTO schedules(repo, revision, every_seconds, cron, layouts, fetch_args, "
            "next_run_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
    if (!rc) {
        sqlite3_bind_text(st, 1, sc->repo, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, sc->revision, -1, SQLITE_STATIC);
        if (sc->every_seconds) sqlite3_bind_int64(st, 3, sc->every_seconds);
        if (sc->cron) sqlite3_bind_text(st, 4, sc->cron, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 5, layouts, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 6, fetch, -1, SQLITE_STATIC);
        sqlite3_bind_double(st, 7, sc->next_run_at);
        sqlite3_bind_double(st, 8, now);
        if (sqlite3_step(st) != SQLITE_DONE)
            rc = catalog_error(c, "add schedule");
        else
            sc->id = sqlite3_last_insert_rowid(c->db);
        sc->created_at = now;
    }
    sqlite3_finalize(st);
    if (!rc)
        rc = catalog_commit(c);
    else if (layouts && fetch)
        catalog_rollback(c);
    free(layouts);
    free(fetch);
    return rc;
}

int schedule_get(catalog *c, int64_t id, schedule *out)
{
    sqlite3_stmt *st;
    int rc = catalog_prepare(c, &st, "SELECT " SCHEDULE_COLUMNS " FROM schedules WHERE id = ?");
    if (rc) return rc;
    sqlite3_bind_int64(st, 1, id);
    int step = sqlite3_step(st);
    if (step == SQLITE_ROW)
        rc = read_schedule(st, out);
    else if (step == SQLITE_DONE)
        rc = ckpt_error_set(CKPT_ENOTFOUND, "no schedule %lld (see ckpt sync ls)", (long long)id);
    else
        rc = catalog_error(c, "read schedule");
    sqlite3_finalize(st);
    return rc;
}

int schedule_list(catalog *c, schedule **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st;
    int rc = catalog_prepare(c, &st, "SELECT " SCHEDULE_COLUMNS " FROM schedules ORDER BY id");
    if (rc) return rc;
    size_t cap = 0;
    while (!rc && sqlite3_step(st) == SQLITE_ROW) {
        if ((rc = ckpt_grow(out, &cap, *n + 1, sizeof **out))) break;
        if (!(rc = read_schedule(st, &(*out)[*n]))) (*n)++;
    }
    sqlite3_finalize(st);
    if (rc) {
        schedules_free(*out, *n);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

int schedule_remove(catalog *c, int64_t id)
{
    int rc = catalog_begin(c);
    sqlite3_stmt *st = NULL;
    if (!rc) rc = catalog_prepare(c, &st, "DELETE FROM schedules WHERE id = ?");
    if (!rc) {
        sqlite3_bind_int64(st, 1, id);
        if (sqlite3_step(st) != SQLITE_DONE)
            rc = catalog_error(c, "remove schedule");
        else if (sqlite3_changes(c->db) == 0)
            rc = ckpt_error_set(CKPT_ENOTFOUND, "no schedule %lld (see ckpt sync ls)",
                                (long long)id);
    }
    sqlite3_finalize(st);
    if (!rc) return catalog_commit(c);
    catalog_rollback(c);
    return rc;
}

int schedule_set_paused(catalog *c, int64_t id, bool paused)
{
    int rc = catalog_begin(c);
    sqlite3_stmt *st = NULL;
    if (!rc) rc = catalog_prepare(c, &st, "UPDATE schedules SET paused = ? WHERE id = ?");
    if (!rc) {
        sqlite3_bind_int(st, 1, paused);
        sqlite3_bind_int64(st, 2, id);
        if (sqlite3_step(st) != SQLITE_DONE)
            rc = catalog_error(c, paused ? "pause schedule" : "resume schedule");
        else if (sqlite3_changes(c->db) == 0)
            rc = ckpt_error_set(CKPT_ENOTFOUND, "no schedule %lld (see ckpt sync ls)", (long long)id);
    }
    sqlite3_finalize(st);
    if (!rc) return catalog_commit(c);
    catalog_rollback(c);
    return rc;
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
    int rc = catalog_begin(c);
    sqlite3_stmt *st = NULL;
    if (!rc)
        rc = catalog_prepare(
            c, &st,
            "UPDATE schedules SET last_run_at = ?, last_commit = coalesce(?, last_commit), "
            "last_outcome = ? WHERE id = ?");
    if (!rc) {
        sqlite3_bind_double(st, 1, queue_now());
        if (commit) sqlite3_bind_text(st, 2, commit, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, outcome, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 4, id);
        if (sqlite3_step(st) != SQLITE_DONE) rc = catalog_error(c, "record sync outcome");
    }
    sqlite3_finalize(st);
    if (!rc) return catalog_commit(c);
    catalog_rollback(c);
    return rc;
}

/* ---- the daemon's tick ---- */

/* Moves next_run_at of a schedule that ran (if nobody moved it meanwhile). */
static int advance(catalog *c, const schedule *sc, double next, int64_t job)
{
    int rc = catalog_begin(c);
    sqlite3_stmt *st = NULL;
    if (!rc)
        rc = catalog_prepare(
            c, &st,
            "UPDATE schedules SET next_run_at = ?, last_job_id = coalesce(?, last_job_id) "
            "WHERE id = ? AND next_run_at = ?");
    if (!rc) {
        sqlite3_bind_double(st, 1, next);
        if (job) sqlite3_bind_int64(st, 2, job);
        sqlite3_bind_int64(st, 3, sc->id);
        sqlite3_bind_double(st, 4, sc->next_run_at);
        if (sqlite3_step(st) != SQLITE_DONE) rc = catalog_error(c, "advance schedule");
    }
    sqlite3_finalize(st);
    if (!rc) return catalog_commit(c);
    catalog_rollback(c);
    return rc;
}

int schedule_queue_due(catalog *c, double now, int *queued)
{
    if (queued) *queued = 0;
    sqlite3_stmt *st;
    int rc = catalog_prepare(c, &st,
                             "SELECT " SCHEDULE_COLUMNS
                             " FROM schedules WHERE next_run_at <= ? AND NOT paused ORDER BY next_run_at LIMIT ?");
    if (rc) return rc;
    sqlite3_bind_double(st, 1, now);
    sqlite3_bind_int(st, 2, SCHEDULE_MAX_DUE_PER_TICK);
    schedule due[SCHEDULE_MAX_DUE_PER_TICK];
    size_t n = 0;
    while (!rc && n < SCHEDULE_MAX_DUE_PER_TICK && sqlite3_step(st) == SQLITE_ROW)
        if (!(rc = read_schedule(st, &due[n]))) n++;
    sqlite3_finalize(st);
    for (size_t i = 0; !rc && i < n; i++) {
        schedule *sc = &due[i];
        json_t *args = json_pack("{s:I}", "schedule", (json_int_t)sc->id);
        queue_submit_opts qo = {.max_attempts = 2};
        int64_t job = 0;
        bool existed = false;
        rc = args ? queue_submit(c, "sync", args, &qo, &job, &existed) : CKPT_ENOMEM;
        json_decref(args);
        double next = 0;
        if (!rc) rc = schedule_next_after(sc, now, &next);
        if (rc == CKPT_ENOTFOUND) { /* an impossible date ("0 0 31 2 *"): park it */
            next = now + CRON_HORIZON_SECONDS;
            rc = 0;
        }
        if (!rc) rc = advance(c, sc, next, job);
        if (!rc && !existed && queued) (*queued)++;
        if (!rc)
            ckpt_event(CKPT_EV_INFO, "schedule.fired",
                       json_pack("{s:I,s:s,s:s,s:I,s:b,s:f}", "schedule", (json_int_t)sc->id, "repo", sc->repo,
                                 "revision", sc->revision, "job", (json_int_t)job, "existed", existed, "next_in_seconds",
                                 next - now));
    }
    for (size_t i = 0; i < n; i++)
        schedule_free(&due[i]);
    return rc;
}

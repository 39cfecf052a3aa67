/*
 * test_queue.c — the SQLite job queue (service/jobs/queue.c), without a daemon.
 *
 * Unique jobs (canonical arguments, only while queued or running), claim
 * order (priority, run_after, id), per-kind rooms, dependencies (waiting,
 * failing with "dependency job N"), leases (a dead owner or an expired lease
 * requeues with backoff or fails at max_attempts; a live owner on another
 * host is trusted), transient and permanent failures, release on shutdown,
 * cancel, retry, logs and counts; the dashboard's side (queue_admin.h,
 * stats.h): attempts kept per job (bounded), filters, counts, delete, bulk
 * actions, per-minute figures; job ids never used twice (a deleted or
 * pruned newest job, a catalog upgraded from version 5); progress in bytes
 * and tensors; the jobs waiting for a job.
 *
 * Linked against libckpt-svc.a (the service objects), like every unit test.
 * Each test gets a fresh database under $TMPDIR (or /tmp).
 */
#include "service/jobs/queue.h"
#include "service/jobs/queue_admin.h"
#include "service/jobs/stats.h"
#include "service/jobs/schedule.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"
#include "store/store.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "tests/support/sqlite_rows.h"

typedef struct {
    char *dir;
    catalog cat;
    char *self; /* this process as a lease owner */
    char *dead; /* this host, this pid, another start time: a dead daemon */
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (!f) return -1;
    const char *base = getenv("TMPDIR");
    f->dir = ckpt_sprintf("%s/ckpt-test-queue-XXXXXX", base && *base ? base : "/tmp");
    if (!f->dir || !mkdtemp(f->dir)) return -1;
    char *db = ckpt_path_join(f->dir, "ckpt.db");
    int rc = db ? catalog_open(&f->cat, db) : -1;
    free(db);
    if (rc) return -1;
    /* With CKPT_DB=postgresql://... (tests/e2e/test_pg.sh runs this program
     * so), every test starts from empty tables (ids from 1) and a database
     * that serves no store yet (each test's catalog is a new folder); the
     * first test's first queue call migrates it. */
    const char *url = NULL;
    if (catalog_db_url(&url) == 0 && url) {
        ckpt_db *pg;
        if (db_open_pg(url, &pg)) {
            fprintf(stderr, "%s\n", ckpt_error_last());
            return -1;
        }
        rc = db_exec(pg,
                     "DO $$ BEGIN IF to_regclass('jobs') IS NOT NULL THEN "
                     "TRUNCATE job_logs, job_attempts, stats, jobs, schedules, ckpt_meta RESTART IDENTITY; END IF; END $$",
                     "reset");
        db_close(pg);
        if (rc) return -1;
    }
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    f->self = queue_owner_self();
    f->dead = ckpt_sprintf("%s:%d:%lld", host, (int)getpid(), (long long)store_proc_start_time((int)getpid()) + 12345);
    *state = f;
    return f->self && f->dead ? 0 : -1;
}

static int teardown(void **state)
{
    fixture *f = *state;
    catalog_close(&f->cat);
    int rc = ckpt_rm_rf(f->dir);
    free(f->dir);
    free(f->self);
    free(f->dead);
    free(f);
    return rc;
}

static void assert_contains(const char *haystack, const char *needle)
{
    if (!haystack || !strstr(haystack, needle)) fail_msg("\"%s\" lacks \"%s\"", haystack ? haystack : "(null)", needle);
}

/* submit KIND JSON: the new (or existing) id. */
static int64_t submit_o(fixture *f, const char *kind, const char *json, const queue_submit_opts *o, bool *existed)
{
    json_error_t err;
    json_t *args = json_loads(json, 0, &err);
    assert_non_null(args);
    int64_t id = 0;
    bool ex = false;
    int rc = queue_submit(&f->cat, kind, args, o, &id, &ex);
    json_decref(args);
    if (rc) fail_msg("submit %s %s: %s", kind, json, ckpt_error_last());
    if (existed) *existed = ex;
    return id;
}

static int64_t submit(fixture *f, const char *json)
{
    return submit_o(f, "noop", json, NULL, NULL);
}

/* Claims up to n jobs as owner; returns how many; ids in out. */
static size_t claim(fixture *f, const char *owner, int n, const queue_kind_room *rooms, size_t nrooms, int64_t *out)
{
    queue_job *jobs;
    size_t k;
    assert_int_equal(queue_claim(&f->cat, owner, n, rooms, nrooms, &jobs, &k), 0);
    for (size_t i = 0; i < k; i++) {
        assert_string_equal(jobs[i].state, "running");
        if (out) out[i] = jobs[i].id;
    }
    queue_jobs_free(jobs, k);
    return k;
}

static int64_t claim_one(fixture *f)
{
    int64_t id = 0;
    assert_int_equal(claim(f, f->self, 1, NULL, 0, &id), 1);
    return id;
}

static void assert_nothing_to_claim(fixture *f)
{
    assert_int_equal(claim(f, f->self, 5, NULL, 0, NULL), 0);
}

static queue_job get(fixture *f, int64_t id)
{
    queue_job j;
    if (queue_get(&f->cat, id, &j)) fail_msg("get %lld: %s", (long long)id, ckpt_error_last());
    return j;
}

static void assert_state(fixture *f, int64_t id, const char *state)
{
    queue_job j = get(f, id);
    if (strcmp(j.state, state)) fail_msg("job %lld is %s, expected %s (error: %s)", (long long)id, j.state, state, j.error ? j.error : "");
    queue_job_free(&j);
}

/* SQL on the queue's database (SQLite, or PostgreSQL when CKPT_DB says so). */
static void sql(fixture *f, const char *text)
{
    ckpt_db *d;
    assert_int_equal(catalog_jobs(&f->cat, &d), 0);
    if (db_exec(d, text, "test")) fail_msg("%s", ckpt_error_last());
}

/* The first column of the first row of a query on the queue's database. */
static int64_t sql_int(fixture *f, const char *text)
{
    ckpt_stmt *st;
    if (catalog_jobs_prepare(&f->cat, &st, text, "test")) fail_msg("%s", ckpt_error_last());
    int e = db_step(st);
    int64_t v = db_col_int64(st, 0);
    db_finalize(st);
    if (e != DB_ROW) fail_msg("%s: no row (%s)", text, e < 0 ? ckpt_error_last() : "");
    return v;
}

/* ---- unique jobs ---- */

static void test_unique(void **state)
{
    fixture *f = *state;
    bool existed;
    int64_t a = submit_o(f, "noop", "{\"x\": 1, \"y\": \"z\"}", NULL, &existed);
    assert_false(existed);
    int64_t b = submit_o(f, "noop", "{\"y\": \"z\", \"x\": 1}", NULL, &existed); /* key order does not matter */
    assert_true(existed);
    assert_int_equal(a, b);
    assert_int_not_equal(submit(f, "{\"x\": 2, \"y\": \"z\"}"), a);
    /* The same arguments under another kind are another job. */
    assert_int_not_equal(submit_o(f, "gc", "{\"x\": 1, \"y\": \"z\"}", NULL, NULL), a);
    /* Priority is not part of the identity. */
    queue_submit_opts o = {.priority = -3};
    assert_int_equal(submit_o(f, "noop", "{\"x\": 1, \"y\": \"z\"}", &o, &existed), a);
    assert_true(existed);
    /* While running it is still the same job; once it ended, a new one. */
    assert_int_equal(claim_one(f), a);
    assert_int_equal(submit(f, "{\"x\": 1, \"y\": \"z\"}"), a);
    assert_int_equal(queue_finish(&f->cat, a, NULL, true, false, NULL, "{}"), 0);
    int64_t c = submit_o(f, "noop", "{\"x\": 1, \"y\": \"z\"}", NULL, &existed);
    assert_false(existed);
    assert_int_not_equal(c, a);
}

static void test_submit_refuses(void **state)
{
    fixture *f = *state;
    int64_t id;
    bool existed;
    json_t *obj = json_object(), *arr = json_array();
    assert_int_equal(queue_submit(&f->cat, "Frob nicate", obj, NULL, &id, &existed), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "Frob nicate");
    assert_int_equal(queue_submit(&f->cat, "noop", arr, NULL, &id, &existed), CKPT_EINVAL);
    queue_submit_opts o = {.depends_on = 4242};
    assert_int_equal(queue_submit(&f->cat, "noop", obj, &o, &id, &existed), CKPT_ENOTFOUND);
    assert_contains(ckpt_error_last(), "4242");
    char *big = malloc(QUEUE_MAX_ARGS_BYTES + 1);
    assert_non_null(big);
    memset(big, 'a', QUEUE_MAX_ARGS_BYTES);
    big[QUEUE_MAX_ARGS_BYTES] = 0;
    json_object_set_new(obj, "pad", json_string(big));
    free(big);
    assert_int_equal(queue_submit(&f->cat, "noop", obj, NULL, &id, &existed), CKPT_ELIMIT);
    json_decref(obj);
    json_decref(arr);
}

/* ---- claiming ---- */

static void test_claim_order(void **state)
{
    fixture *f = *state;
    queue_submit_opts low = {.priority = 5}, high = {.priority = -1};
    int64_t a = submit_o(f, "noop", "{\"n\": 1}", &low, NULL);
    int64_t b = submit(f, "{\"n\": 2}");
    int64_t c = submit(f, "{\"n\": 3}");
    int64_t d = submit_o(f, "noop", "{\"n\": 4}", &high, NULL);
    int64_t got[4];
    assert_int_equal(claim(f, f->self, 4, NULL, 0, got), 4);
    assert_int_equal(got[0], d);
    assert_int_equal(got[1], b);
    assert_int_equal(got[2], c);
    assert_int_equal(got[3], a);
    queue_job j = get(f, b);
    assert_int_equal(j.attempt, 1);
    assert_string_equal(j.lease_owner, f->self);
    assert_true(j.lease_expires > queue_now() + QUEUE_LEASE_SECONDS - 5);
    assert_true(j.started_at > 0);
    queue_job_free(&j);
    assert_nothing_to_claim(f);
    /* n = 0 claims nothing. */
    submit(f, "{\"n\": 5}");
    assert_int_equal(claim(f, f->self, 0, NULL, 0, NULL), 0);
}

static void test_kind_rooms(void **state)
{
    fixture *f = *state;
    submit_o(f, "verify", "{\"ref\": \"a\"}", NULL, NULL);
    submit_o(f, "verify", "{\"ref\": \"b\"}", NULL, NULL);
    submit_o(f, "gc", "{}", NULL, NULL);
    submit(f, "{\"n\": 1}");
    submit(f, "{\"n\": 2}");
    queue_kind_room rooms[] = {{"verify", 1}, {"gc", 0}, {"noop", 5}};
    queue_job *jobs;
    size_t n;
    assert_int_equal(queue_claim(&f->cat, f->self, 10, rooms, 3, &jobs, &n), 0);
    assert_int_equal(n, 3);
    int verify = 0, noop = 0;
    for (size_t i = 0; i < n; i++) {
        verify += !strcmp(jobs[i].kind, "verify");
        noop += !strcmp(jobs[i].kind, "noop");
        assert_string_not_equal(jobs[i].kind, "gc");
    }
    queue_jobs_free(jobs, n);
    assert_int_equal(verify, 1);
    assert_int_equal(noop, 2);
    /* Without limits the rest comes. */
    assert_int_equal(claim(f, f->self, 10, NULL, 0, NULL), 2);
}

/* ---- dependencies ---- */

static void test_dependency_waits(void **state)
{
    fixture *f = *state;
    int64_t a = submit(f, "{\"n\": 1}");
    queue_submit_opts o = {.depends_on = a};
    int64_t d = submit_o(f, "noop", "{\"n\": 2}", &o, NULL);
    assert_int_equal(claim_one(f), a);
    assert_nothing_to_claim(f); /* d waits for a */
    assert_int_equal(queue_finish(&f->cat, a, NULL, true, false, NULL, NULL), 0);
    assert_int_equal(claim_one(f), d);
    queue_job j = get(f, d);
    assert_int_equal(j.depends_on, a);
    queue_job_free(&j);
    /* a's detail lists the jobs waiting for it, with their state; d's none */
    int64_t e = submit_o(f, "gc", "{}", &o, NULL);
    json_t *detail;
    assert_int_equal(queue_job_detail(&f->cat, a, &detail), 0);
    json_t *deps = json_object_get(detail, "dependents");
    assert_int_equal(json_array_size(deps), 2);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(deps, 0), "id")), d);
    assert_string_equal(json_string_value(json_object_get(json_array_get(deps, 0), "state")), "running");
    assert_int_equal(json_integer_value(json_object_get(json_array_get(deps, 1), "id")), e);
    assert_string_equal(json_string_value(json_object_get(json_array_get(deps, 1), "kind")), "gc");
    assert_string_equal(json_string_value(json_object_get(json_array_get(deps, 1), "state")), "queued");
    json_decref(detail);
    assert_int_equal(queue_job_detail(&f->cat, d, &detail), 0);
    assert_int_equal(json_array_size(json_object_get(detail, "dependents")), 0);
    json_decref(detail);
}

static void test_dependency_fails(void **state)
{
    fixture *f = *state;
    int64_t a = submit(f, "{\"n\": 1}");
    queue_submit_opts o = {.depends_on = a};
    int64_t d = submit_o(f, "noop", "{\"n\": 2}", &o, NULL);
    o.depends_on = d;
    int64_t e = submit_o(f, "noop", "{\"n\": 3}", &o, NULL);
    assert_int_equal(claim_one(f), a);
    assert_int_equal(queue_finish(&f->cat, a, NULL, false, false, "no such checkpoint", NULL), 0);
    assert_state(f, a, "failed");
    assert_nothing_to_claim(f);
    assert_int_equal(queue_reap(&f->cat, f->self, true, NULL), 0);
    queue_job j = get(f, d);
    assert_string_equal(j.state, "failed");
    char want[64];
    snprintf(want, sizeof want, "dependency job %lld failed", (long long)a);
    assert_contains(j.error, want);
    assert_contains(j.error, "no such checkpoint");
    assert_true(j.finished_at > 0);
    assert_true(j.started_at == 0);
    queue_job_free(&j);
    /* The chain fails on (at the latest on the next reap). */
    assert_int_equal(queue_reap(&f->cat, f->self, true, NULL), 0);
    j = get(f, e);
    assert_string_equal(j.state, "failed");
    snprintf(want, sizeof want, "dependency job %lld failed", (long long)d);
    assert_contains(j.error, want);
    queue_job_free(&j);
    /* A cancelled dependency fails its dependent too. */
    int64_t c = submit(f, "{\"n\": 4}");
    o.depends_on = c;
    int64_t g = submit_o(f, "noop", "{\"n\": 5}", &o, NULL);
    bool running;
    assert_int_equal(queue_cancel(&f->cat, c, &running), 0);
    assert_false(running);
    assert_int_equal(queue_reap(&f->cat, f->self, true, NULL), 0);
    j = get(f, g);
    assert_string_equal(j.state, "failed");
    assert_contains(j.error, "cancelled");
    queue_job_free(&j);
}

/* ---- failures and leases ---- */

static void test_transient_backoff(void **state)
{
    fixture *f = *state;
    int64_t a = submit(f, "{\"n\": 1}");
    for (int attempt = 1; attempt <= 3; attempt++) {
        sql(f, "UPDATE jobs SET run_after = 0"); /* skip the wait */
        assert_int_equal(claim_one(f), a);
        double before = queue_now();
        assert_int_equal(queue_finish(&f->cat, a, NULL, false, true, "network down", NULL), 0);
        queue_job j = get(f, a);
        assert_int_equal(j.attempt, attempt);
        assert_string_equal(j.error, "network down");
        if (attempt < 3) {
            assert_string_equal(j.state, "queued");
            /* exponential with jitter: base * 2^(attempt-1) * [0.5, 1] */
            double lo = QUEUE_BACKOFF_BASE * 0.5 * (1 << (attempt - 1)), hi = QUEUE_BACKOFF_BASE * (1 << (attempt - 1));
            if (j.run_after < before + lo - 0.01 || j.run_after > before + hi + 1)
                fail_msg("attempt %d: retry after %.3f s, expected %.1f..%.1f", attempt, j.run_after - before, lo, hi);
            assert_true(j.finished_at == 0);
            queue_job_free(&j);
            assert_nothing_to_claim(f); /* not before run_after */
        } else {
            assert_string_equal(j.state, "failed");
            queue_job_free(&j);
        }
    }
    /* Permanent failures do not retry. */
    int64_t b = submit(f, "{\"n\": 2}");
    assert_int_equal(claim_one(f), b);
    assert_int_equal(queue_finish(&f->cat, b, NULL, false, false, "bad input", NULL), 0);
    assert_state(f, b, "failed");
    /* finish only ends running jobs: an ended one is left as it is. */
    assert_int_equal(queue_finish(&f->cat, b, NULL, true, false, NULL, NULL), QUEUE_NOT_OURS);
    assert_state(f, b, "failed");
}

static void test_reap_dead_owner(void **state)
{
    fixture *f = *state;
    queue_submit_opts two = {.max_attempts = 2};
    int64_t a = submit_o(f, "noop", "{\"n\": 1}", &two, NULL);
    int64_t got = 0;
    assert_int_equal(claim(f, f->dead, 1, NULL, 0, &got), 1);
    assert_int_equal(got, a);
    assert_false(queue_owner_alive(f->dead));
    assert_true(queue_owner_alive(f->self));
    int requeued = 0;
    double before = queue_now();
    assert_int_equal(queue_reap(&f->cat, f->self, true, &requeued), 0);
    assert_int_equal(requeued, 1);
    queue_job j = get(f, a);
    assert_string_equal(j.state, "queued");
    assert_null(j.lease_owner);
    assert_int_equal(j.worker_pid, 0);
    assert_contains(j.error, "attempt 1 of 2");
    assert_true(j.run_after >= before + QUEUE_BACKOFF_BASE * 0.5 - 0.01);
    queue_job_free(&j);
    /* The last attempt lost too: failed, saying so. */
    sql(f, "UPDATE jobs SET run_after = 0");
    assert_int_equal(claim(f, f->dead, 1, NULL, 0, NULL), 1);
    assert_int_equal(queue_reap(&f->cat, f->self, true, &requeued), 0);
    assert_int_equal(requeued, 0);
    j = get(f, a);
    assert_string_equal(j.state, "failed");
    assert_contains(j.error, "last attempt");
    queue_job_free(&j);
}

static void test_reap_leases(void **state)
{
    fixture *f = *state;
    int64_t mine = submit(f, "{\"n\": 1}");
    int64_t other = submit(f, "{\"n\": 2}");
    int64_t expired = submit(f, "{\"n\": 3}");
    assert_int_equal(claim_one(f), mine);
    assert_int_equal(claim(f, "elsewhere.example:1:1", 1, NULL, 0, NULL), 1);
    assert_int_equal(claim(f, "elsewhere.example:1:1", 1, NULL, 0, NULL), 1);
    /* A live lease stays, whoever holds it; another host is trusted while its lease lasts. */
    int requeued = -1;
    assert_int_equal(queue_reap(&f->cat, f->self, true, &requeued), 0);
    assert_int_equal(requeued, 0);
    assert_state(f, mine, "running");
    assert_state(f, other, "running");
    assert_state(f, expired, "running");
    /* An expired lease is lost, even on another host; but not by a daemon
     * just back from losing the database (expire false: nobody could renew). */
    char q[128];
    snprintf(q, sizeof q, "UPDATE jobs SET lease_expires = 1 WHERE id = %lld", (long long)expired);
    sql(f, q);
    assert_int_equal(queue_reap(&f->cat, f->self, false, &requeued), 0);
    assert_int_equal(requeued, 0);
    assert_state(f, expired, "running");
    assert_int_equal(queue_reap(&f->cat, f->self, true, &requeued), 0);
    assert_int_equal(requeued, 1);
    assert_state(f, expired, "queued");
    /* An end recorded late by the lease's old owner leaves the job alone once
     * another owner runs it (reaped and claimed again meanwhile). */
    sql(f, "UPDATE jobs SET run_after = 0");
    assert_int_equal(claim(f, "elsewhere.example:2:2", 1, NULL, 0, NULL), 1);
    assert_int_equal(queue_finish(&f->cat, expired, "elsewhere.example:1:1", true, false, NULL, NULL), QUEUE_NOT_OURS);
    assert_int_equal(queue_release(&f->cat, expired, "elsewhere.example:1:1"), QUEUE_NOT_OURS);
    assert_state(f, expired, "running");
    assert_int_equal(queue_finish(&f->cat, expired, "elsewhere.example:2:2", true, false, NULL, NULL), 0);
    assert_state(f, expired, "succeeded");
    /* Renewing pushes the lease; only its owner may. */
    snprintf(q, sizeof q, "UPDATE jobs SET lease_expires = %f WHERE id = %lld", queue_now() + 1, (long long)mine);
    sql(f, q);
    assert_int_equal(queue_renew(&f->cat, "someone:1:1", mine), 0);
    queue_job j = get(f, mine);
    assert_true(j.lease_expires < queue_now() + 2);
    queue_job_free(&j);
    assert_int_equal(queue_renew(&f->cat, f->self, mine), 0);
    j = get(f, mine);
    assert_true(j.lease_expires > queue_now() + QUEUE_LEASE_SECONDS - 2);
    queue_job_free(&j);
    assert_int_equal(queue_set_pid(&f->cat, mine, 4321), 0);
    j = get(f, mine);
    assert_int_equal(j.worker_pid, 4321);
    queue_job_free(&j);
}

static void test_release(void **state)
{
    fixture *f = *state;
    int64_t a = submit(f, "{\"n\": 1}");
    assert_int_equal(claim_one(f), a);
    assert_int_equal(queue_release(&f->cat, a, NULL), 0);
    queue_job j = get(f, a);
    assert_string_equal(j.state, "queued");
    assert_int_equal(j.attempt, 0); /* a shutdown is not the job's fault */
    assert_contains(j.error, "shutdown");
    queue_job_free(&j);
    assert_int_equal(claim_one(f), a); /* at once: no backoff */
}

/* ---- cancel, retry ---- */

static void test_cancel(void **state)
{
    fixture *f = *state;
    int64_t queued = submit(f, "{\"n\": 1}");
    int64_t run = submit(f, "{\"n\": 2}");
    bool running;
    assert_int_equal(queue_cancel(&f->cat, queued, &running), 0);
    assert_false(running);
    assert_state(f, queued, "cancelled");
    assert_int_equal(claim_one(f), run);
    assert_int_equal(queue_cancel(&f->cat, run, &running), 0);
    assert_true(running);
    queue_job j = get(f, run);
    assert_string_equal(j.state, "running"); /* the daemon stops it */
    assert_true(j.cancel_requested);
    queue_job_free(&j);
    assert_int_equal(queue_mark_cancelled(&f->cat, run), 0);
    j = get(f, run);
    assert_string_equal(j.state, "cancelled");
    if (j.finished_at < j.started_at)
        fail_msg("cancelled job: finished_at %.3f before started_at %.3f", j.finished_at, j.started_at);
    queue_job_free(&j);
    assert_int_equal(queue_cancel(&f->cat, run, &running), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "cancelled already");
    assert_int_equal(queue_cancel(&f->cat, 999, &running), CKPT_ENOTFOUND);
    /* A cancel requested while its daemon died: the reaper cancels the job. */
    int64_t lost = submit(f, "{\"n\": 3}");
    assert_int_equal(claim(f, f->dead, 1, NULL, 0, NULL), 1);
    assert_int_equal(queue_cancel(&f->cat, lost, &running), 0);
    assert_int_equal(queue_reap(&f->cat, f->self, true, NULL), 0);
    assert_state(f, lost, "cancelled");
}

static void test_retry(void **state)
{
    fixture *f = *state;
    int64_t a = submit(f, "{\"n\": 1}");
    assert_int_equal(claim_one(f), a);
    assert_int_equal(queue_progress(&f->cat, a, &(queue_progress_info){7, 10, 2, 4, "copy", 3.5, 0.9}), 0);
    assert_int_equal(queue_finish(&f->cat, a, NULL, false, false, "bad", NULL), 0);
    assert_int_equal(queue_retry(&f->cat, a), 0);
    queue_job j = get(f, a);
    assert_string_equal(j.state, "queued");
    assert_int_equal(j.attempt, 0);
    assert_null(j.error);
    assert_int_equal(j.progress_done, 0); /* a retry starts its progress again */
    assert_int_equal(j.tensors_done, 0);
    assert_true(j.progress_rate == 0 && j.progress_eta == -1); /* and its rate */
    queue_job_free(&j);
    assert_int_equal(queue_retry(&f->cat, a), CKPT_EINVAL); /* queued */
    assert_int_equal(claim_one(f), a);
    assert_int_equal(queue_finish(&f->cat, a, NULL, true, false, NULL, NULL), 0);
    assert_int_equal(queue_retry(&f->cat, a), CKPT_EINVAL); /* succeeded */
    assert_contains(ckpt_error_last(), "only failed or cancelled");
    /* Retrying beside an identical active job is refused. */
    int64_t b = submit(f, "{\"n\": 2}");
    bool running;
    assert_int_equal(queue_cancel(&f->cat, b, &running), 0);
    int64_t c = submit(f, "{\"n\": 2}");
    assert_int_not_equal(b, c);
    assert_int_equal(queue_retry(&f->cat, b), CKPT_EEXIST);
    assert_state(f, b, "cancelled");
}

/* ---- logs, progress, counts, JSON ---- */

static void test_logs_progress_counts(void **state)
{
    fixture *f = *state;
    int64_t a = submit(f, "{\"n\": 1}");
    assert_int_equal(claim_one(f), a);
    assert_int_equal(queue_log(&f->cat, a, "first"), 0);
    assert_int_equal(queue_log(&f->cat, a, "second"), 0);
    /* 5 of 10 bytes at 2.5 B/s (as the worker measured it): 2 s left */
    assert_int_equal(queue_progress(&f->cat, a, &(queue_progress_info){5, 10, 1, 3, "copy", 2.5, 2.0}), 0);
    queue_job j = get(f, a);
    assert_int_equal(j.tensors_done, 1);
    assert_int_equal(j.tensors_total, 3);
    json_t *running = queue_job_json(&j);
    queue_job_free(&j);
    json_t *rp = json_object_get(running, "progress");
    assert_true(json_real_value(json_object_get(rp, "rate")) == 2.5);
    assert_true(json_real_value(json_object_get(rp, "eta_seconds")) == 2.0);
    json_decref(running);
    assert_int_equal(queue_progress(&f->cat, a, &(queue_progress_info){10, 10, 3, 3, NULL, 0, -1}), 0); /* keeps the phase */
    json_t *lines;
    int64_t last;
    assert_int_equal(queue_logs(&f->cat, a, 0, &lines, &last), 0);
    assert_int_equal(json_array_size(lines), 2);
    assert_int_equal(last, 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(lines, 1), "line")), "second");
    json_decref(lines);
    assert_int_equal(queue_logs(&f->cat, a, 1, &lines, &last), 0);
    assert_int_equal(json_array_size(lines), 1);
    json_decref(lines);
    assert_int_equal(queue_finish(&f->cat, a, NULL, true, false, NULL, "{\"ref\": \"x\"}"), 0);
    j = get(f, a);
    assert_string_equal(j.phase, "copy");
    assert_int_equal(j.progress_done, 10);
    json_t *o = queue_job_json(&j);
    queue_job_free(&j);
    assert_non_null(o);
    /* the progress as GET /v1/jobs gives it: bytes and tensors */
    json_t *p = json_object_get(o, "progress");
    assert_int_equal(json_integer_value(json_object_get(p, "done")), 10);
    assert_int_equal(json_integer_value(json_object_get(p, "total")), 10);
    assert_int_equal(json_integer_value(json_object_get(p, "tensors_done")), 3);
    assert_int_equal(json_integer_value(json_object_get(p, "tensors_total")), 3);
    assert_string_equal(json_string_value(json_object_get(p, "phase")), "copy");
    assert_null(json_object_get(p, "rate")); /* a finished job has no rate or time left */
    assert_null(json_object_get(p, "eta_seconds"));
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "result"), "ref")), "x");
    assert_string_equal(json_string_value(json_object_get(o, "state")), "succeeded");
    assert_non_null(json_object_get(o, "finished_at"));
    json_decref(o);
    submit(f, "{\"n\": 2}");
    json_t *counts;
    assert_int_equal(queue_counts(&f->cat, &counts), 0);
    size_t i;
    json_t *row;
    int seen = 0;
    json_array_foreach(counts, i, row)
    {
        const char *st = json_string_value(json_object_get(row, "state"));
        assert_int_equal(json_integer_value(json_object_get(row, "count")), 1);
        seen += !strcmp(st, "succeeded") || !strcmp(st, "queued");
    }
    assert_int_equal(seen, 2);
    json_decref(counts);
    /* Lists: newest first, by state. */
    queue_job *list;
    size_t n;
    assert_int_equal(queue_list(&f->cat, NULL, 0, &list, &n), 0);
    assert_int_equal(n, 2);
    assert_true(list[0].id > list[1].id);
    queue_jobs_free(list, n);
    assert_int_equal(queue_list(&f->cat, "succeeded", 0, &list, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(list[0].id, a);
    queue_jobs_free(list, n);
}

/* ---- retention ---- */

static void test_prune(void **state)
{
    fixture *f = *state;
    int64_t done = submit(f, "{\"n\": 1}");
    assert_int_equal(claim_one(f), done);
    assert_int_equal(queue_log(&f->cat, done, "a line"), 0);
    assert_int_equal(queue_finish(&f->cat, done, NULL, true, false, NULL, NULL), 0);
    /* a failed job that a queued one waits for stays: its outcome decides the other's */
    int64_t base = submit(f, "{\"n\": 2}");
    assert_int_equal(claim_one(f), base);
    assert_int_equal(queue_finish(&f->cat, base, NULL, false, false, "bad", NULL), 0);
    int64_t after = submit_o(f, "noop", "{\"n\": 3}", &(queue_submit_opts){.depends_on = base}, NULL);
    int64_t queued = submit(f, "{\"n\": 4}");
    int removed = -1;
    /* nothing ended before an hour ago */
    assert_int_equal(queue_prune(&f->cat, queue_now() - 3600, &removed), 0);
    assert_int_equal(removed, 0);
    assert_int_equal(queue_prune(&f->cat, queue_now() + 1, &removed), 0);
    assert_int_equal(removed, 1);
    queue_job j;
    assert_int_equal(queue_get(&f->cat, done, &j), CKPT_ENOTFOUND);
    json_t *lines;
    int64_t last;
    assert_int_equal(queue_logs(&f->cat, done, 0, &lines, &last), 0);
    assert_int_equal(json_array_size(lines), 0); /* its log went with it */
    json_decref(lines);
    assert_state(f, base, "failed");
    assert_state(f, after, "queued");
    assert_state(f, queued, "queued");
}

/* ---- job ids are never used twice (schema/006_job_ids.sql) ---- */

/* A job deleted or pruned while it was the newest does not give its id to the
 * next one: a client still waiting on that id must not read another job. */
static void test_ids_never_reused(void **state)
{
    fixture *f = *state;
    submit(f, "{\"n\": 1}");
    int64_t newest = submit(f, "{\"n\": 2}");
    sql(f, "UPDATE jobs SET state = 'succeeded', finished_at = 1");
    assert_int_equal(queue_delete(&f->cat, newest), 0);
    int64_t next = submit(f, "{\"n\": 3}");
    assert_true(next > newest);
    /* pruned alike */
    sql(f, "UPDATE jobs SET state = 'cancelled', finished_at = 1");
    int removed = 0;
    assert_int_equal(queue_prune(&f->cat, queue_now(), &removed), 0);
    assert_int_equal(removed, 2);
    int64_t after = submit(f, "{\"n\": 4}");
    assert_true(after > next);
}

/* A catalog of version 5 (before 006) holding jobs, a dependency, logs,
 * attempts and a schedule that queued a job since pruned: opening it keeps
 * every job with its id and its rows elsewhere, the foreign keys, indexes and
 * triggers still work, and the next id is past both the largest kept and the
 * schedule's. SQLite only (the catalog's own file, whatever CKPT_DB says). */
extern const char *const ckpt_schema_sql[];

static void test_upgrade_keeps_jobs(void **state)
{
    fixture *f = *state;
    char *path = ckpt_path_join(f->dir, "v5.db");
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    sqlite_ok(db, "PRAGMA foreign_keys=ON");
    for (int i = 0; i < 5; i++) sqlite_ok(db, ckpt_schema_sql[i]);
    sqlite_ok(db,
              "PRAGMA user_version = 5;"
              "INSERT INTO jobs(id, kind, args, state, attempt, run_after, created_at, finished_at, unique_key) "
              "VALUES (3, 'fetch', '{\"repo\":\"o/m\"}', 'succeeded', 1, 0, 10, 20, 'k3');"
              "INSERT INTO jobs(id, kind, args, state, run_after, created_at, depends_on, unique_key) "
              "VALUES (7, 'convert', '{\"ref\":\"o/m@main\"}', 'queued', 0, 11, 3, 'k7');"
              "INSERT INTO job_logs VALUES (3, 1, 15, 'fetched'), (3, 2, 16, 'done');"
              "INSERT INTO job_attempts VALUES (3, 1, 1, 12, 20, 'succeeded', NULL);"
              "INSERT INTO schedules(id, repo, every_seconds, next_run_at, created_at, last_job_id) "
              "VALUES (1, 'o/m', 60, 0, 0, 9);");
    sqlite3_close(db);

    /* The catalog of that file, even when CKPT_DB names a PostgreSQL server
     * (test_pg.sh runs this program against one): the upgrade is SQLite's. */
    char *pg = getenv("CKPT_DB") ? ckpt_strdup(getenv("CKPT_DB")) : NULL;
    unsetenv("CKPT_DB");
    catalog c;
    assert_int_equal(catalog_open(&c, path), 0);
    if (pg) setenv("CKPT_DB", pg, 1);
    free(pg);
    assert_int_equal(c.version, catalog_schema_version());
    assert_int_equal(sqlite_int(c.db, "SELECT count(*) FROM jobs"), 2);
    assert_int_equal(sqlite_int(c.db, "SELECT depends_on FROM jobs WHERE id = 7"), 3);
    assert_int_equal(sqlite_int(c.db, "SELECT count(*) FROM jobs WHERE id = 3 AND kind = 'fetch' AND state = 'succeeded' "
                                    "AND finished_at = 20 AND unique_key = 'k3' AND tensors_total = 0"),
                     1);
    assert_int_equal(sqlite_int(c.db, "SELECT count(*) FROM job_logs WHERE job_id = 3"), 2);
    assert_int_equal(sqlite_int(c.db, "SELECT count(*) FROM job_attempts WHERE job_id = 3"), 1);
    assert_int_equal(sqlite_int(c.db, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
    assert_int_equal(sqlite_int(c.db, "SELECT count(*) FROM sqlite_master WHERE tbl_name = 'jobs' AND name IN "
                                    "('jobs_unique_active', 'jobs_claim', 'jobs_depends_on', 'job_attempt_ended', "
                                    "'job_ended_stats')"),
                     5);
    /* the next id is past the schedule's last job (9), and stays so after the newest is deleted */
    sqlite_ok(c.db, "INSERT INTO jobs(kind, args, run_after, created_at) VALUES ('gc', '{}', 0, 30)");
    assert_int_equal(sqlite_int(c.db, "SELECT max(id) FROM jobs"), 10);
    sqlite_ok(c.db, "DELETE FROM jobs WHERE id = 10");
    sqlite_ok(c.db, "INSERT INTO jobs(kind, args, run_after, created_at) VALUES ('gc', '{}', 0, 31)");
    assert_int_equal(sqlite_int(c.db, "SELECT max(id) FROM jobs"), 11);
    /* the triggers of 005 still record an attempt; a dependency still clears; logs still cascade */
    sqlite_ok(c.db, "UPDATE jobs SET state = 'running', attempt = 1, started_at = 40 WHERE id = 7");
    sqlite_ok(c.db, "UPDATE jobs SET state = 'failed', finished_at = 41, error = 'x' WHERE id = 7");
    assert_int_equal(sqlite_int(c.db, "SELECT count(*) FROM job_attempts WHERE job_id = 7 AND outcome = 'failed'"), 1);
    sqlite_ok(c.db, "DELETE FROM jobs WHERE id = 3");
    assert_int_equal(sqlite_int(c.db, "SELECT count(*) FROM job_logs"), 0);
    assert_int_equal(sqlite_int(c.db, "SELECT count(*) FROM jobs WHERE id = 7 AND depends_on IS NULL"), 1);
    catalog_close(&c);
    free(path);
}

/* ---- schedules from JSON (POST /v1/schedules) ---- */


/* ---- the dashboard's side: attempts, filters, counts, delete, bulk, stats ---- */

static void test_attempts(void **state)
{
    fixture *f = *state;
    int64_t a = submit(f, "{\"n\": 1}");
    /* two transient failures, then success: three attempts, each with its outcome */
    for (int i = 0; i < 3; i++) {
        sql(f, "UPDATE jobs SET run_after = 0");
        assert_int_equal(claim_one(f), a);
        assert_int_equal(queue_finish(&f->cat, a, NULL, i == 2, true, i == 2 ? NULL : "network down", NULL), 0);
    }
    json_t *at;
    assert_int_equal(queue_attempts(&f->cat, a, &at), 0);
    assert_int_equal(json_array_size(at), 3);
    const char *want[] = {"retrying", "retrying", "succeeded"};
    for (int i = 0; i < 3; i++) {
        json_t *x = json_array_get(at, (size_t)i);
        assert_int_equal(json_integer_value(json_object_get(x, "attempt")), i + 1);
        assert_string_equal(json_string_value(json_object_get(x, "outcome")), want[i]);
        assert_true(json_real_value(json_object_get(x, "finished_at")) >= json_real_value(json_object_get(x, "started_at")));
    }
    assert_string_equal(json_string_value(json_object_get(json_array_get(at, 0), "error")), "network down");
    assert_null(json_object_get(json_array_get(at, 2), "error"));
    json_decref(at);

    /* a released attempt (daemon shutdown) says so; at most 20 are kept, the newest */
    int64_t b = submit(f, "{\"n\": 2}");
    assert_int_equal(claim_one(f), b);
    assert_int_equal(queue_release(&f->cat, b, NULL), 0);
    for (int i = 0; i < 25; i++) {
        sql(f, "UPDATE jobs SET run_after = 0, attempt = 0");
        assert_int_equal(claim_one(f), b);
        assert_int_equal(queue_finish(&f->cat, b, NULL, false, true, "again", NULL), 0);
    }
    assert_int_equal(queue_attempts(&f->cat, b, &at), 0);
    assert_int_equal(json_array_size(at), 20);
    assert_string_equal(json_string_value(json_object_get(json_array_get(at, 19), "outcome")), "retrying");
    json_decref(at);
    /* they go with their job */
    sql(f, "UPDATE jobs SET state = 'failed' WHERE id = 2");
    assert_int_equal(queue_delete(&f->cat, b), 0);
    assert_int_equal(queue_attempts(&f->cat, b, &at), 0);
    assert_int_equal(json_array_size(at), 0);
    json_decref(at);
    /* An attempt whose claimer's clock was ahead of the one that ended it
     * (a clock stepped back; or claimed and retried within one millisecond,
     * the database's clock's precision) still ends no earlier than it began. */
    int64_t ahead = submit(f, "{\"n\": 2}");
    sql(f, "UPDATE jobs SET run_after = 0");
    assert_int_equal(claim_one(f), ahead);
    sql(f, "UPDATE jobs SET started_at = started_at + 3600 WHERE state = 'running'");
    assert_int_equal(queue_finish(&f->cat, ahead, NULL, false, true, "network down", NULL), 0);
    assert_int_equal(queue_attempts(&f->cat, ahead, &at), 0);
    assert_int_equal(json_array_size(at), 1);
    json_t *first = json_array_get(at, 0);
    assert_string_equal(json_string_value(json_object_get(first, "outcome")), "retrying");
    assert_true(json_real_value(json_object_get(first, "finished_at")) >= json_real_value(json_object_get(first, "started_at")));
    json_decref(at);
}

static int64_t count_of(json_t *counts, const char *state)
{
    return json_integer_value(json_object_get(counts, state));
}

static void test_find_counts_delete_bulk(void **state)
{
    fixture *f = *state;
    int64_t a = submit_o(f, "fetch", "{\"repo\": \"org/Alpha\"}", NULL, NULL);
    int64_t b = submit_o(f, "convert", "{\"ref\": \"org/alpha@main\"}", &(queue_submit_opts){.depends_on = a}, NULL);
    int64_t c = submit(f, "{\"n\": 3}");
    /* a runs and fails for a retry; c is claimed: b waits for a */
    assert_int_equal(claim(f, f->self, 1, NULL, 0, NULL), 1);
    assert_int_equal(queue_finish(&f->cat, a, NULL, false, true, "network down", NULL), 0);
    sql(f, "UPDATE jobs SET run_after = 1e12 WHERE id = 1");
    assert_int_equal(claim_one(f), c);
    json_t *counts;
    assert_int_equal(queue_state_counts(&f->cat, &(queue_filter){0}, &counts), 0);
    assert_int_equal(count_of(counts, "all"), 3);
    assert_int_equal(count_of(counts, "queued"), 2);
    assert_int_equal(count_of(counts, "retrying"), 1);
    assert_int_equal(count_of(counts, "running"), 1);
    json_decref(counts);
    assert_int_equal(queue_state_counts(&f->cat, &(queue_filter){.q = "ALPHA"}, &counts), 0);
    assert_int_equal(count_of(counts, "all"), 2);
    json_decref(counts);
    queue_job *jobs;
    size_t n;
    int64_t total;
    assert_int_equal(queue_find(&f->cat, &(queue_filter){.state = "retrying"}, 10, 0, &jobs, &n, &total), 0);
    assert_true(n == 1 && total == 1 && jobs[0].id == a);
    queue_jobs_free(jobs, n);
    assert_int_equal(queue_find(&f->cat, &(queue_filter){.q = "alpha"}, 1, 1, &jobs, &n, &total), 0);
    assert_true(n == 1 && total == 2 && jobs[0].id == a); /* newest first: b, then a */
    queue_jobs_free(jobs, n);
    assert_int_equal(queue_find(&f->cat, &(queue_filter){.state = "done"}, 10, 0, &jobs, &n, &total), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "state: 'done'");
    /* delete: not a running or queued job, nor one a queued job waits for */
    assert_int_equal(queue_delete(&f->cat, c), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "cancel it before deleting it");
    assert_int_equal(queue_finish(&f->cat, c, NULL, false, false, "bad", NULL), 0);
    sql(f, "UPDATE jobs SET state = 'failed' WHERE id = 1");
    assert_int_equal(queue_delete(&f->cat, a), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "waits for job 1");
    assert_int_equal(queue_delete(&f->cat, c), 0);
    assert_int_equal(queue_get(&f->cat, c, &(queue_job){0}), CKPT_ENOTFOUND);
    /* bulk: cancel the queued one (b), then retry failed and cancelled, then delete all that match */
    int matched, done;
    assert_int_equal(queue_bulk(&f->cat, &(queue_filter){.q = "alpha"}, "cancel", &matched, &done), 0);
    assert_true(matched == 2 && done == 1);
    assert_state(f, b, "cancelled");
    assert_int_equal(queue_bulk(&f->cat, &(queue_filter){.q = "alpha"}, "retry", &matched, &done), 0);
    assert_true(matched == 2 && done == 2);
    assert_state(f, a, "queued");
    assert_int_equal(queue_bulk(&f->cat, &(queue_filter){.q = "alpha"}, "delete", &matched, &done), 0);
    assert_true(matched == 2 && done == 0); /* both queued: nothing deleted */
    assert_int_equal(queue_bulk(&f->cat, &(queue_filter){.state = "queued"}, "nuke", &matched, &done), CKPT_EINVAL);
    sql(f, "UPDATE jobs SET state = 'succeeded'");
    assert_int_equal(queue_bulk(&f->cat, &(queue_filter){.state = "succeeded"}, "delete", &matched, &done), 0);
    assert_true(matched == 2 && done == 2);
    assert_int_equal(queue_state_counts(&f->cat, &(queue_filter){0}, &counts), 0);
    assert_int_equal(count_of(counts, "all"), 0);
    json_decref(counts);
}

static int64_t stat_total(json_t *series, const char *name, const char *kind)
{
    int64_t t = 0;
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(series, "rows"), i, r)
    {
        if (!strcmp(json_string_value(json_object_get(r, "name")), name) &&
            !strcmp(json_string_value(json_object_get(r, "kind")), kind))
            t += json_integer_value(json_object_get(r, "value"));
    }
    return t;
}

static void test_stats(void **state)
{
    fixture *f = *state;
    int64_t a = submit_o(f, "fetch", "{\"repo\": \"org/a\"}", NULL, NULL);
    int64_t b = submit_o(f, "fetch", "{\"repo\": \"org/b\"}", NULL, NULL);
    submit(f, "{\"n\": 1}");
    assert_int_equal(claim(f, f->self, 2, NULL, 0, NULL), 2);
    assert_int_equal(queue_progress(&f->cat, a, &(queue_progress_info){1000, 1000, 0, 0, "done", 0, -1}), 0);
    assert_int_equal(queue_finish(&f->cat, a, NULL, true, false, NULL, NULL), 0);
    assert_int_equal(queue_progress(&f->cat, b, &(queue_progress_info){500, 1000, 0, 0, "half", 0, -1}), 0);
    assert_int_equal(queue_finish(&f->cat, b, NULL, false, false, "bad", NULL), 0);
    double now = queue_now();
    /* a sample now and one two days ago: the old minute is pruned by the next sample */
    sql(f, "INSERT INTO stats(bucket, name, kind, value) VALUES (60, 'queue.depth', '', 9)");
    assert_int_equal(stats_sample(&f->cat, now, 2, 300), 0);
    assert_int_equal(stats_sample(&f->cat, now, 1, 200), 0);
    json_t *series;
    assert_int_equal(stats_series(&f->cat, 0, now, &series), 0);
    assert_int_equal(stat_total(series, "jobs.succeeded", "fetch"), 1);
    assert_int_equal(stat_total(series, "jobs.failed", "fetch"), 1);
    assert_int_equal(stat_total(series, "bytes.fetch", ""), 1000); /* only jobs that succeeded */
    assert_int_equal(stat_total(series, "bytes.served", ""), 500);
    assert_int_equal(stat_total(series, "workers.busy", ""), 2); /* the minute's peak */
    assert_int_equal(stat_total(series, "queue.depth", ""), 1);  /* the noop is queued */
    json_decref(series);
    assert_int_equal(sql_int(f, "SELECT count(*) FROM stats WHERE bucket = 60"), 0);
}

static void test_schedule_paused(void **state)
{
    fixture *f = *state;
    schedule sc = {.repo = "org/m", .revision = "main", .every_seconds = 3600, .layouts = json_array(),
                   .fetch_args = json_object()};
    if (schedule_add(&f->cat, &sc)) fail_msg("schedule_add: %s", ckpt_error_last());
    int64_t id = sc.id;
    json_decref(sc.layouts);
    json_decref(sc.fetch_args);
    double now = queue_now();
    int queued = -1;
    /* due now, but paused: nothing queued, next_run_at kept */
    assert_int_equal(schedule_set_paused(&f->cat, id, true), 0);
    schedule got;
    assert_int_equal(schedule_get(&f->cat, id, &got), 0);
    assert_true(got.paused);
    schedule_free(&got);
    assert_int_equal(schedule_queue_due(&f->cat, now + 1, &queued), 0);
    assert_int_equal(queued, 0);
    assert_int_equal(sql_int(f, "SELECT count(*) FROM jobs WHERE kind = 'sync'"), 0);
    /* resumed: it runs at once, its next run an hour on */
    assert_int_equal(schedule_set_paused(&f->cat, id, false), 0);
    assert_int_equal(schedule_queue_due(&f->cat, now + 1, &queued), 0);
    assert_int_equal(queued, 1);
    assert_int_equal(sql_int(f, "SELECT count(*) FROM jobs WHERE kind = 'sync'"), 1);
    assert_int_equal(schedule_get(&f->cat, id, &got), 0);
    assert_false(got.paused);
    assert_true(got.next_run_at > now + 3000);
    schedule_free(&got);
    assert_int_equal(schedule_set_paused(&f->cat, id + 1, true), CKPT_ENOTFOUND);
    assert_contains(ckpt_error_last(), "no schedule");
    /* run now, paused or not: the sync job queued (or the one queued already)
     * becomes the schedule's last job; no schedule, no job */
    int64_t first = sql_int(f, "SELECT id FROM jobs WHERE kind = 'sync'"), job = 0;
    bool existed = false;
    assert_int_equal(schedule_set_paused(&f->cat, id, true), 0);
    assert_int_equal(schedule_run_now(&f->cat, id, &job, &existed), 0);
    assert_int_equal(job, first);
    assert_true(existed);
    sql(f, "UPDATE jobs SET state = 'succeeded' WHERE kind = 'sync'");
    assert_int_equal(schedule_run_now(&f->cat, id, &job, &existed), 0);
    assert_false(existed);
    assert_true(job > first);
    assert_int_equal(schedule_get(&f->cat, id, &got), 0);
    assert_int_equal(got.last_job_id, job);
    schedule_free(&got);
    assert_int_equal(schedule_run_now(&f->cat, id + 1, &job, &existed), CKPT_ENOTFOUND);
    assert_int_equal(sql_int(f, "SELECT count(*) FROM jobs WHERE kind = 'sync'"), 2);
}

static void test_schedule_from_json(void **state)
{
    (void)state;
    static const struct {
        const char *json, *error; /* error NULL: accepted */
    } cases[] = {
        {"{\"repo\": \"org/m\", \"every_seconds\": 3600, \"layouts\": [{\"layout\": \"neuron\", \"tp\": 8}]}", NULL},
        {"{\"repo\": \"org/m\", \"revision\": \"v1\", \"cron\": \"0 3 * * *\", \"fetch\": {\"include\": [\"*.json\"]}}", NULL},
        {"{\"every_seconds\": 60}", "'repo'"},
        {"{\"repo\": \"org/m\"}", "'every_seconds' or 'cron'"},
        {"{\"repo\": \"org/m\", \"every_seconds\": 60, \"cron\": \"* * * * *\"}", "one of them"},
        {"{\"repo\": \"org/m\", \"every_seconds\": 0}", "every_seconds"},
        {"{\"repo\": \"org/m\", \"every_seconds\": \"6h\"}", "every_seconds"},
        {"{\"repo\": \"org/m\", \"cron\": \"61 * * * *\"}", "cron"},
        {"{\"repo\": \"org/m\", \"every_seconds\": 60, \"layouts\": [{\"layout\": \"fused\", \"tp\": 0}]}", "layouts'[0]"},
        {"{\"repo\": \"org/m\", \"every_seconds\": 60, \"layouts\": [{\"layout\": \"fused\", \"x\": 1}]}", "layouts'[0]"},
        {"{\"repo\": \"org/m\", \"every_seconds\": 60, \"fetch\": {\"include\": [1]}}", "fetch.include"},
        {"{\"repo\": \"org/m\", \"every_seconds\": 60, \"fetch\": {\"other\": []}}", "'fetch'"},
        {"{\"repo\": \"org/m\", \"every_seconds\": 60, \"next_run_at\": 0}", "unknown field 'next_run_at'"},
        {"[1]", "JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_error_t err;
        json_t *j = json_loads(cases[i].json, 0, &err);
        assert_non_null(j);
        schedule sc;
        int rc = schedule_from_json(j, &sc);
        json_decref(j);
        if (!cases[i].error) {
            if (rc) fail_msg("%s: %s", cases[i].json, ckpt_error_last());
            assert_string_equal(sc.repo, "org/m");
            assert_non_null(sc.revision);
            schedule_free(&sc);
        } else {
            if (rc != CKPT_EINVAL) fail_msg("%s: accepted (%d)", cases[i].json, rc);
            assert_contains(ckpt_error_last(), cases[i].error);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unique, setup, teardown),
        cmocka_unit_test_setup_teardown(test_submit_refuses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kind_rooms, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dependency_waits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dependency_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(test_transient_backoff, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reap_dead_owner, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reap_leases, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_logs_progress_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prune, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ids_never_reused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_upgrade_keeps_jobs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attempts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_find_counts_delete_bulk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats, setup, teardown),
        cmocka_unit_test_setup_teardown(test_schedule_paused, setup, teardown),
        cmocka_unit_test(test_schedule_from_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

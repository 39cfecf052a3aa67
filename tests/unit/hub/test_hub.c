/*
 * test_hub.c — the pieces of Hub download and scheduled sync that need no
 * server: names from the server (hub_path_check), the include/exclude
 * filter, the token rule (hub_same_origin), Link headers, backoff with
 * Retry-After; cron expressions in UTC (service/jobs/cron.c), --every durations
 * and the schedules table with the daemon's due check (service/jobs/schedule.c:
 * one sync job per schedule at a time, one catch-up run after downtime).
 *
 * Linked against libckpt-svc.a (the service objects), like every unit test;
 * sync_job.c's Hub side is covered by tests/e2e/test_sync.sh.
 */
#include "service/jobs/cron.h"
#include "service/jobs/queue.h"
#include "service/jobs/schedule.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "tests/support/scratch.h"
#include "hub/hub_internal.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

static int64_t utc(int y, int mo, int d, int h, int mi)
{
    struct tm tm = {
        .tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h, .tm_min = mi};
    return (int64_t)timegm(&tm);
}

static int64_t next_of(const char *expr, int64_t after)
{
    cron_spec c;
    assert_int_equal(cron_parse(expr, &c), 0);
    int64_t t = 0;
    assert_int_equal(cron_next(&c, after, &t), 0);
    return t;
}

static void test_cron_next(void **state)
{
    (void)state;
    int64_t jan1 = utc(2024, 1, 1, 0, 0); /* a Monday */
    assert_int_equal(next_of("0 3 * * *", jan1), utc(2024, 1, 1, 3, 0));
    assert_int_equal(next_of("0 0 * * *", jan1), utc(2024, 1, 2, 0, 0)); /* strictly after */
    assert_int_equal(next_of("*/15 * * * *", utc(2024, 1, 1, 12, 7) + 30), utc(2024, 1, 1, 12, 15));
    /* Friday 2024-01-05 03:00 -> Monday 02:30 */
    assert_int_equal(next_of("30 2 * * mon-fri", utc(2024, 1, 5, 3, 0)), utc(2024, 1, 8, 2, 30));
    assert_int_equal(next_of("0 0 29 2 *", utc(2025, 1, 1, 0, 0)), utc(2028, 2, 29, 0, 0));
    /* Day of month OR day of week when both are restricted: the 13th or a Friday. */
    assert_int_equal(next_of("0 0 13 * fri", utc(2024, 1, 1, 0, 0)), utc(2024, 1, 5, 0, 0));
    assert_int_equal(next_of("0 0 13 * fri", utc(2024, 1, 12, 0, 0)), utc(2024, 1, 13, 0, 0));
    assert_int_equal(next_of("0 0 * * 7", jan1), utc(2024, 1, 7, 0, 0)); /* 7 is Sunday */
    assert_int_equal(next_of("@daily", jan1 + 1), utc(2024, 1, 2, 0, 0));
    assert_int_equal(next_of("@hourly", jan1), utc(2024, 1, 1, 1, 0));
    assert_int_equal(next_of("0 12 1 jan,jul *", utc(2024, 2, 1, 0, 0)), utc(2024, 7, 1, 12, 0));
    assert_int_equal(next_of("5/20 * * * *", jan1), utc(2024, 1, 1, 0, 5));
    assert_int_equal(next_of("0 0 1 1 *", utc(2024, 12, 31, 23, 59)), utc(2025, 1, 1, 0, 0));
    cron_spec c;
    int64_t t;
    assert_int_equal(cron_parse("0 0 31 2 *", &c), 0);
    assert_int_equal(cron_next(&c, jan1, &t), CKPT_ENOTFOUND); /* never: 31 February */
}

static void test_cron_bad(void **state)
{
    (void)state;
    static const char *const bad[] = {"61 * * * *",  "* * * *",     "* * * * * *",  "a b c d e",
                                      "*/0 * * * *", "5-1 * * * *", "* 24 * * *",   "* * 0 * *",
                                      "* * * 13 *",  "* * * * 8",   "1,,2 * * * *", "",
                                      "@often"};
    cron_spec c;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (cron_parse(bad[i], &c) != CKPT_EINVAL) fail_msg("'%s' was accepted", bad[i]);
    }
    assert_int_equal(cron_parse("61 * * * *", &c), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "minute");
}

static void test_every(void **state)
{
    (void)state;
    int64_t s;
    assert_int_equal(schedule_parse_every("90", &s), 0);
    assert_int_equal(s, 90);
    assert_int_equal(schedule_parse_every("30m", &s), 0);
    assert_int_equal(s, 1800);
    assert_int_equal(schedule_parse_every("6h", &s), 0);
    assert_int_equal(s, 21600);
    assert_int_equal(schedule_parse_every("2w", &s), 0);
    assert_int_equal(s, 14 * 86400);
    static const char *const bad[] = {"0",   "5x",   "",     "h",
                                      "-1h", "367d", "1.5h", "99999999999999999999s"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (schedule_parse_every(bad[i], &s) == 0) fail_msg("'%s' was accepted", bad[i]);
    schedule sc = {.every_seconds = 100, .next_run_at = 1000};
    double next;
    assert_int_equal(schedule_next_after(&sc, 1010, &next), 0);
    assert_true(next == 1100); /* on time: the phase is kept */
    assert_int_equal(schedule_next_after(&sc, 1350, &next), 0);
    assert_true(next == 1450); /* periods missed: one run now, the next a period later */
}

/* ---- the schedules table ---- */

static int count_jobs(catalog *c, const char *kind)
{
    ckpt_stmt *st;
    assert_int_equal(catalog_prepare(c, &st, "SELECT count(*) FROM jobs WHERE kind = ?"), 0);
    db_bind_text(st, 1, kind);
    assert_int_equal(db_step(st), DB_ROW);
    int n = (int)db_col_int64(st, 0);
    db_finalize(st);
    return n;
}

static void set_next(catalog *c, int64_t id, double t)
{
    char sql[128];
    snprintf(sql, sizeof sql, "UPDATE schedules SET next_run_at = %.3f WHERE id = %lld", t,
             (long long)id);
    assert_int_equal(catalog_exec(c, sql), 0);
}

static void test_schedules(void **state)
{
    ckpt_store store;
    assert_int_equal(store_open(&store, *state), 0);
    catalog *c = &store.cat;
    schedule sc = {.repo = "org/tiny",
                   .revision = "main",
                   .every_seconds = 60,
                   .layouts = json_pack("[{s:s,s:i}]", "layout", "neuron", "tp", 8),
                   .fetch_args = json_object()};
    double before = queue_now();
    assert_int_equal(schedule_add(c, &sc), 0);
    assert_true(sc.id > 0);
    assert_true(sc.next_run_at >= before &&
                sc.next_run_at <= queue_now()); /* --every: the first run at once */
    schedule bad = {.repo = "not a repo", .revision = "main", .every_seconds = 60};
    assert_int_not_equal(schedule_add(c, &bad), 0);
    schedule both = {.repo = "org/x", .revision = "main", .every_seconds = 60, .cron = "* * * * *"};
    assert_int_not_equal(schedule_add(c, &both), 0);

    /* Due: one sync job, next_run_at a period later. */
    double now = queue_now();
    int queued = 0;
    assert_int_equal(schedule_queue_due(c, now, &queued), 0);
    assert_int_equal(queued, 1);
    assert_int_equal(count_jobs(c, "sync"), 1);
    schedule got;
    assert_int_equal(schedule_get(c, sc.id, &got), 0);
    assert_true(got.next_run_at >= now + 59 && got.next_run_at <= now + 61);
    assert_true(got.last_job_id > 0);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(got.layouts, 0), "layout")), "neuron");
    schedule_free(&got);

    /* Not due: nothing. Due again while its job is still queued: never a second one. */
    assert_int_equal(schedule_queue_due(c, now + 1, &queued), 0);
    assert_int_equal(queued, 0);
    set_next(c, sc.id, now - 1);
    assert_int_equal(schedule_queue_due(c, now, &queued), 0);
    assert_int_equal(queued, 0);
    assert_int_equal(count_jobs(c, "sync"), 1);

    /* The job ran; then the daemon was down for ten periods: one run, not ten. */
    assert_int_equal(catalog_exec(c, "UPDATE jobs SET state = 'succeeded'"), 0);
    set_next(c, sc.id, now - 600);
    assert_int_equal(schedule_queue_due(c, now, &queued), 0);
    assert_int_equal(queued, 1);
    assert_int_equal(count_jobs(c, "sync"), 2);
    assert_int_equal(schedule_get(c, sc.id, &got), 0);
    assert_true(got.next_run_at >= now + 59); /* a whole period after the catch-up run */
    schedule_free(&got);

    /* A cron schedule runs next at its next match, in UTC. */
    schedule cr = {.repo = "org/other",
                   .revision = "v1",
                   .cron = "0 3 * * *",
                   .layouts = json_array(),
                   .fetch_args = json_object()};
    assert_int_equal(schedule_add(c, &cr), 0);
    time_t t = (time_t)cr.next_run_at;
    struct tm tm;
    gmtime_r(&t, &tm);
    assert_int_equal(tm.tm_hour, 3);
    assert_int_equal(tm.tm_min, 0);
    assert_true(cr.next_run_at > queue_now() && cr.next_run_at <= queue_now() + 86400);

    schedule *list;
    size_t n;
    assert_int_equal(schedule_list(c, &list, &n), 0);
    assert_int_equal(n, 2);
    schedules_free(list, n);
    assert_int_equal(
        schedule_record(c, sc.id, "0123456789012345678901234567890123456789", "unchanged"), 0);
    assert_int_equal(schedule_get(c, sc.id, &got), 0);
    assert_string_equal(got.last_outcome, "unchanged");
    assert_string_equal(got.last_commit, "0123456789012345678901234567890123456789");
    schedule_free(&got);
    assert_int_equal(schedule_remove(c, sc.id), 0);
    assert_int_equal(schedule_remove(c, sc.id), CKPT_ENOTFOUND);
    assert_int_equal(schedule_get(c, sc.id, &got), CKPT_ENOTFOUND);
    json_decref(sc.layouts);
    json_decref(sc.fetch_args);
    json_decref(cr.layouts);
    json_decref(cr.fetch_args);
    store_close(&store);
}

/* ---- Hub client pieces ---- */

static void test_path_check(void **state)
{
    (void)state;
    static const char *const good[] = {"config.json", "sub/dir/model.safetensors", "a.b.c",
                                       ".gitattributes", "x y.txt"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        if (hub_path_check(good[i], strlen(good[i])) != 0)
            fail_msg("'%s' was refused: %s", good[i], ckpt_error_last());
    static const char *const bad[] = {"../../evil", "..",          "a/../b",  "./x",
                                      "a/./b",      "/etc/passwd", "a//b",    "a/",
                                      "",           "tab\there",   "del\x7f", "nl\nx",
                                      /* issue 14 #8: names the store could not give back */
                                      "notes..txt", "a\\b.txt", "x://y"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (hub_path_check(bad[i], strlen(bad[i])) == 0) fail_msg("'%s' was accepted", bad[i]);
    /* A NUL inside the JSON string: */
    assert_int_equal(hub_path_check("evil\0.json", 10), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "NUL");
    char longname[2000];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    assert_int_equal(hub_path_check(longname, strlen(longname)), CKPT_ELIMIT);
    char seg[300];
    memset(seg, 'y', sizeof seg - 1);
    seg[sizeof seg - 1] = 0;
    assert_int_equal(hub_path_check(seg, strlen(seg)),
                     CKPT_EINVAL); /* one segment over 255 bytes */
}

static void test_filter(void **state)
{
    (void)state;
    hub_filter dflt = {0};
    static const char *const take[] = {"model.safetensors", "sub/model-00001-of-00002.safetensors",
                                       "config.json",       "tokenizer.json",
                                       "tokenizer.model",   "vocab.txt",
                                       "README.md",         "merges.txt",
                                       "tokenizer",         "spiece.model"};
    for (size_t i = 0; i < sizeof take / sizeof take[0]; i++)
        if (!hub_filter_match(&dflt, take[i])) fail_msg("the defaults leave out '%s'", take[i]);
    static const char *const leave[] = {
        "pytorch_model.bin",  "model.pt",    "model.pth",    "x.ckpt",
        "flax_model.msgpack", "tf_model.h5", "model.onnx",   "model.gguf",
        ".gitattributes",     "image.png",   "tokenizer.bin"};
    for (size_t i = 0; i < sizeof leave / sizeof leave[0]; i++)
        if (hub_filter_match(&dflt, leave[i])) fail_msg("the defaults take '%s'", leave[i]);
    const char *inc[] = {"*.bin", "config.json"}, *exc[] = {"*optimizer*"};
    hub_filter f = {.include = inc, .ninclude = 2, .exclude = exc, .nexclude = 1};
    assert_true(hub_filter_match(&f, "pytorch_model.bin")); /* included explicitly */
    assert_true(hub_filter_match(&f, "sub/config.json")); /* a pattern without '/' matches names */
    assert_false(hub_filter_match(&f, "model.safetensors")); /* --include replaces the defaults */
    assert_false(hub_filter_match(&f, "optimizer.bin"));     /* --exclude wins */
    hub_filter only_exc = {.exclude = exc, .nexclude = 1};
    assert_false(hub_filter_match(&only_exc, "optimizer.safetensors"));
    assert_true(hub_filter_match(&only_exc, "model.safetensors"));
}

static void test_origin_and_headers(void **state)
{
    (void)state;
    hub_client h = {.endpoint = "http://127.0.0.1:8080", .token = "hf_secret"};
    assert_true(hub_same_origin(&h, "http://127.0.0.1:8080/org/x/resolve/abc/f"));
    assert_true(hub_same_origin(&h, "HTTP://127.0.0.1:8080/x"));
    assert_false(hub_same_origin(&h, "http://127.0.0.1:8081/x"));  /* another port */
    assert_false(hub_same_origin(&h, "https://127.0.0.1:8080/x")); /* another scheme */
    assert_false(hub_same_origin(&h, "http://localhost:8080/x"));  /* another host name */
    assert_false(hub_same_origin(&h, "not a url"));
    hub_client hf = {.endpoint = "https://huggingface.co", .token = "hf_secret"};
    assert_true(hub_same_origin(&hf, "https://huggingface.co:443/api/x"));
    assert_false(hub_same_origin(&hf, "https://cdn-lfs.huggingface.co/repos/x"));
    struct curl_slist *l = hub_request_headers(&h, "http://127.0.0.1:8081/x", 10, 20), *p;
    bool auth = false, range = false;
    for (p = l; p; p = p->next) {
        auth |= strstr(p->data, "Authorization") != NULL;
        range |= !strcmp(p->data, "Range: bytes=10-19");
    }
    curl_slist_free_all(l);
    assert_false(auth);
    assert_true(range);
    l = hub_request_headers(&h, "http://127.0.0.1:8080/x", 0, 0);
    auth = false;
    for (p = l; p; p = p->next)
        auth |= !strcmp(p->data, "Authorization: Bearer hf_secret");
    curl_slist_free_all(l);
    assert_true(auth);
}

static void test_answers(void **state)
{
    (void)state;
    hub_answer a = {0};
    const char *lines[] = {
        "HTTP/1.1 200 OK\r\n",
        "Link: <http://h/a?cursor=1>; rel=\"prev\", <http://h/b?cursor=9>; rel=\"next\"\r\n",
        "x-error-code: GatedRepo\r\n", "X-Error-Message: bad\x01thing\r\n",
        "Content-Range: bytes 0-9/100\r\n"};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        hub_answer_header(&a, lines[i], strlen(lines[i]));
    assert_string_equal(a.link_next, "http://h/b?cursor=9");
    assert_string_equal(a.error_code, "GatedRepo");
    assert_string_equal(a.error_message, "bad\\x01thing");
    assert_string_equal(a.content_range, "bytes 0-9/100");
    /* X-Linked-Etag: quoted, weak or bare, the same value (huggingface_hub _normalize_etag) */
    const char *etags[] = {"X-Linked-Etag: \"abc123\"\r\n", "x-linked-etag: W/\"abc123\"\r\n",
                           "X-Linked-Etag: abc123\r\n"};
    for (size_t i = 0; i < 3; i++) {
        hub_answer_header(&a, etags[i], strlen(etags[i]));
        assert_string_equal(a.linked_etag, "abc123");
    }
    hub_answer_header(&a, "HTTP/1.1 302 Found\r\n", 20); /* a new answer starts clean */
    assert_string_equal(a.linked_etag, "");
    assert_null(a.link_next);
    assert_string_equal(a.error_code, "");
    hub_answer_reset(&a);

    hub_client h = {.endpoint = "http://e", .backoff_s = 0.5};
    for (int i = 1; i < 20; i++) {
        double b = hub_backoff(&h, i, 0);
        assert_true(b > 0 && b <= HUB_BACKOFF_CAP_S * 1.25);
    }
    assert_true(hub_backoff(&h, 1, 7) >= 7);                           /* Retry-After is honoured */
    assert_true(hub_backoff(&h, 1, 1e6) <= HUB_RETRY_AFTER_CAP_S + 1); /* and capped */
    char *e = hub_pct_encode("refs/pr/1", false);
    assert_string_equal(e, "refs%2Fpr%2F1");
    free(e);
    e = hub_pct_encode("sub dir/a+b.json", true);
    assert_string_equal(e, "sub%20dir/a%2Bb.json");
    free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cron_next),
        cmocka_unit_test(test_cron_bad),
        cmocka_unit_test(test_every),
        cmocka_unit_test_setup_teardown(test_schedules, scratch_setup, scratch_teardown),
        cmocka_unit_test(test_path_check),
        cmocka_unit_test(test_filter),
        cmocka_unit_test(test_origin_and_headers),
        cmocka_unit_test(test_answers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

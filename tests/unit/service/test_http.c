/*
 * test_http.c — pieces of the daemon's HTTP layer that need no server
 * (service/http/http_util.c): API token digests and their compare.
 *
 * Tokens are compared as sha256 digests of a fixed size with CRYPTO_memcmp,
 * so a compare never depends on the given token's length or on how long a
 * prefix matches; these tests pin the outcomes (equal, prefix, longer,
 * shorter, empty, one byte off at either end).
 *
 * Also the request pieces every route shares: Range headers and paths split
 * into %-decoded segments.
 *
 * Linked against libckpt-svc.a (the service objects), like every unit test.
 */
#include "service/http/http_util.h"
#include "service/http/metrics.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static bool same(const char *a, const char *b)
{
    unsigned char da[HTTP_TOKEN_DIGEST], db[HTTP_TOKEN_DIGEST];
    http_token_digest(a, strlen(a), da);
    http_token_digest(b, strlen(b), db);
    return http_token_equal(da, db);
}

static void test_token_equal(void **state)
{
    (void)state;
    const char *t = "admintoken-0123456789abcdef";
    assert_true(same(t, t));
    assert_false(same(t, "admintoken-0123456789abcde"));   /* a prefix */
    assert_false(same(t, "admintoken-0123456789abcdefX")); /* longer */
    assert_false(same(t, ""));
    assert_false(same(t, "bdmintoken-0123456789abcdef")); /* first byte */
    assert_false(same(t, "admintoken-0123456789abcdeg")); /* last byte */
}

static void test_token_digest_fixed(void **state)
{
    (void)state;
    /* The digest is sha256: known answer for "abc". */
    unsigned char d[HTTP_TOKEN_DIGEST];
    http_token_digest("abc", 3, d);
    static const unsigned char want[HTTP_TOKEN_DIGEST] = {
        0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22, 0x23,
        0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
    assert_memory_equal(d, want, sizeof want);
}

/* Range headers are parsed whole and checked: junk, signs and numbers past
 * 2^64 are no range (the whole file), never a wrapped value. */
static void test_parse_range(void **state)
{
    (void)state;
    uint64_t a = 0, b = 0;
    assert_int_equal(http_parse_range("bytes=0-0", 10, &a, &b), 1);
    assert_true(a == 0 && b == 0);
    assert_int_equal(http_parse_range("bytes=5-", 10, &a, &b), 1);
    assert_true(a == 5 && b == 9);
    assert_int_equal(http_parse_range("bytes=-3", 10, &a, &b), 1);
    assert_true(a == 7 && b == 9);
    assert_int_equal(http_parse_range("bytes=2-100", 10, &a, &b), 1);
    assert_true(a == 2 && b == 9);
    assert_int_equal(http_parse_range("bytes=10-", 10, &a, &b), -1);
    assert_int_equal(http_parse_range("bytes=-0", 10, &a, &b), -1);
    static const char *none[] = {NULL, "", "bytes=", "bytes=x-1", "bytes=1-x", "bytes=+1-2", "bytes=1--2",
                                 "bytes=3-2", "bytes=0-1,3-4", "items=0-1", "bytes=-",
                                 "bytes=99999999999999999999-", "bytes=0-99999999999999999999",
                                 "bytes=-99999999999999999999"};
    for (size_t i = 0; i < sizeof none / sizeof *none; i++) assert_int_equal(http_parse_range(none[i], 10, &a, &b), 0);
}

/* Paths split on '/' before decoding: "%2F" stays inside a segment; a bad
 * escape or "%00" is refused. */
static void test_split_path(void **state)
{
    (void)state;
    http_segments sg;
    assert_true(http_split_path("/v1/checkpoints/acme%2Fllama@main/files/a%20b.json?x=1", &sg));
    assert_int_equal(sg.n, 5);
    assert_string_equal(sg.seg[2], "acme/llama@main");
    assert_string_equal(sg.seg[4], "a b.json");
    char *j = http_join_from(&sg, 3);
    assert_string_equal(j, "files/a b.json");
    free(j);
    free(sg.buf);
    assert_false(http_split_path("/a/%2", &sg));
    free(sg.buf);
    assert_false(http_split_path("/a/%00b", &sg));
    free(sg.buf);
    assert_false(http_split_path("/a/%zz", &sg));
    free(sg.buf);
}

/* Labels are route patterns, never raw paths (a path per ref or job would
 * make a series per request). */
static void test_metrics_route(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {"/v1/jobs", "/v1/jobs"},
        {"/v1/jobs/42", "/v1/jobs/{id}"},
        {"/v1/jobs/42/logs", "/v1/jobs/{id}/logs"},
        {"/v1/jobs/42/retry", "/v1/jobs/{id}/retry"},
        {"/v1/checkpoints/org%2Fm@main", "/v1/checkpoints/{ref}"},
        {"/v1/checkpoints/org%2Fm@main/files/a/b.json", "/v1/checkpoints/{ref}/files/{path}"},
        {"/v1/checkpoints/org%2Fm@main/archive.tar.zst", "/v1/checkpoints/{ref}/archive"},
        {"/v1/schedules/3/run", "/v1/schedules/{id}/run"},
        {"/api/models/org/m", "/api/models/{repo}"},
        {"/api/models/org/m/revision/main", "/api/models/{repo}/revision/{revision}"},
        {"/api/models/org/m/tree/main/sub", "/api/models/{repo}/tree/{revision}"},
        {"/org/m/resolve/main/config.json", "/{repo}/resolve/{revision}/{path}"},
        {"/org/m/raw/main/x", "/{repo}/raw/{revision}/{path}"},
        {"/", "other"},
        {"/favicon.ico", "other"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) assert_string_equal(metrics_route(cases[i][0]), cases[i][1]);
}

/* A histogram: cumulative buckets ending in +Inf = _count, and escaped labels. */
static void test_metrics_render(void **state)
{
    (void)state;
    metrics *m = metrics_new();
    assert_non_null(m);
    metrics_observe_http(m, "/v1/jobs", 200, 0.003, 10);
    metrics_observe_http(m, "/v1/jobs", 200, 2.0, 5);
    metrics_observe_job(m, "we\"ird", "succeeded", 1.0, 7);
    metrics_observe_job(m, "fetch", "succeeded", 1.0, 100);
    metrics_observe_job(m, "fetch", "failed", 1.0, 50);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    json_t *queue = json_array();
    metrics_now now = {.queue = queue, .workers_busy = 1, .workers_max = 2};
    metrics_render(m, &now, f);
    fclose(f);
    json_decref(queue);
    static const char *const want[] = {
        "ckpt_http_request_duration_seconds_bucket{route=\"/v1/jobs\",code=\"200\",le=\"0.005\"} 1\n",
        "ckpt_http_request_duration_seconds_bucket{route=\"/v1/jobs\",code=\"200\",le=\"1\"} 1\n",
        "ckpt_http_request_duration_seconds_bucket{route=\"/v1/jobs\",code=\"200\",le=\"2.5\"} 2\n",
        "ckpt_http_request_duration_seconds_bucket{route=\"/v1/jobs\",code=\"200\",le=\"+Inf\"} 2\n",
        "ckpt_http_request_duration_seconds_count{route=\"/v1/jobs\",code=\"200\"} 2\n",
        "kind=\"we\\\"ird\",outcome=\"succeeded\"",
        "ckpt_served_bytes_total 15\n",
        "ckpt_fetched_bytes_total 100\n", /* the failed fetch's bytes are not counted */
        "ckpt_queue_jobs{state=\"queued\"} 0\n",
        "ckpt_workers_busy 1\n",
        "# TYPE ckpt_job_queue_wait_seconds histogram\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(text, want[i])) fail_msg("/metrics lacks %s", want[i]);
    free(text);
    metrics_free(m);
    metrics_observe_http(NULL, "/", 200, 0, 0); /* no figures without an API: a no-op */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_equal),
        cmocka_unit_test(test_token_digest_fixed),
        cmocka_unit_test(test_parse_range),
        cmocka_unit_test(test_split_path),
        cmocka_unit_test(test_metrics_route),
        cmocka_unit_test(test_metrics_render),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

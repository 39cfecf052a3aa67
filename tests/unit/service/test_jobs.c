/*
 * test_jobs.c — the job-kind table (service/jobs/jobs_run.h): every row is
 * whole, `ckpt submit`'s words become each kind's arguments, wrong words
 * give the kind's usage, an unknown kind names the known ones, arguments
 * from the HTTP API are checked by shape and value, and host paths are held
 * to the --allow-path roots, and a worker's progress line reads back as it
 * was written. No store and no daemon: nothing here runs a job.
 *
 * Linked against libckpt-svc.a (the service objects), like every unit test.
 */
#include "service/jobs/jobs_run.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

static void assert_contains(const char *haystack, const char *needle)
{
    if (!haystack || !strstr(haystack, needle)) fail_msg("\"%s\" lacks \"%s\"", haystack ? haystack : "(null)", needle);
}

/* jobs_args_from_argv over a NULL-terminated word list (argv[0] = the kind). */
static int words(json_t **args, const char *kind, ...)
{
    char *argv[16] = {(char *)kind};
    int argc = 1;
    va_list ap;
    va_start(ap, kind);
    for (char *w; (w = va_arg(ap, char *)) && argc < 15;) argv[argc++] = w;
    va_end(ap);
    return jobs_args_from_argv(kind, argc, argv, args);
}

static void test_table_rows(void **state)
{
    (void)state;
    assert_true(jobs_nkinds >= 10);
    for (size_t i = 0; i < jobs_nkinds; i++) {
        const job_kind *k = &jobs_kinds[i];
        assert_non_null(k->name);
        assert_non_null(k->usage);
        assert_non_null(k->words);
        assert_non_null(k->shape);
        assert_non_null(k->run);
        assert_true(k->timeout > 0);
        assert_true(k->limit >= 0);
        assert_ptr_equal(jobs_kind_find(k->name), k);
        for (size_t j = 0; j < i; j++) assert_string_not_equal(jobs_kinds[j].name, k->name);
    }
    assert_null(jobs_kind_find("frobnicate"));
    assert_null(jobs_kind_find(NULL));
    /* The limits the daemon takes from the table: one verify and one gc at a time. */
    assert_int_equal(jobs_kind_find("verify")->limit, 1);
    assert_int_equal(jobs_kind_find("gc")->limit, 1);
    assert_true(jobs_kind_find("fetch")->timeout > jobs_kind_find("convert")->timeout);
}

static void test_words(void **state)
{
    (void)state;
    json_t *a = NULL;
    assert_int_equal(words(&a, "convert", "t/m@main", "--layout", "neuron", "--tp", "8", NULL), 0);
    assert_string_equal(json_string_value(json_object_get(a, "ref")), "t/m@main");
    assert_string_equal(json_string_value(json_object_get(a, "layout")), "neuron");
    assert_int_equal(json_integer_value(json_object_get(a, "tp")), 8);
    json_decref(a);

    assert_int_equal(words(&a, "fetch", "org/x@v2", "--include", "*.json", "--include", "*.safetensors", NULL), 0);
    assert_string_equal(json_string_value(json_object_get(a, "repo")), "org/x");
    assert_string_equal(json_string_value(json_object_get(a, "revision")), "v2");
    assert_int_equal(json_array_size(json_object_get(a, "include")), 2);
    json_decref(a);

    assert_int_equal(words(&a, "consolidate", "/a/src", "/a/dst", NULL), 0);
    assert_string_equal(json_string_value(json_object_get(a, "dst")), "/a/dst");
    json_decref(a);

    assert_int_equal(words(&a, "verify", NULL), 0);
    assert_null(json_object_get(a, "ref"));
    json_decref(a);

    assert_int_equal(words(&a, "sync", "7", NULL), 0);
    assert_int_equal(json_integer_value(json_object_get(a, "schedule")), 7);
    json_decref(a);
}

static void test_wrong_words(void **state)
{
    (void)state;
    json_t *a = NULL;
    /* Each kind's own usage, from its row. */
    assert_int_equal(words(&a, "convert", "t/m", NULL), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "submit convert: expected REF --layout L");
    json_decref(a);
    assert_int_equal(words(&a, "gc", "extra", NULL), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "submit gc: takes no arguments");
    json_decref(a);
    assert_int_equal(words(&a, "sync", "0", NULL), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "expected a schedule ID");
    json_decref(a);
    assert_int_equal(words(&a, "convert", "t/m", "--layout", "nonesuch", NULL), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "unknown layout 'nonesuch'");
    json_decref(a);
    assert_int_equal(words(&a, "noop", "--bogus", "1", NULL), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "unknown option '--bogus'");
    json_decref(a);
    /* An unknown kind lists the table. */
    assert_int_equal(words(&a, "frobnicate", NULL), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "unknown job kind 'frobnicate'");
    for (size_t i = 0; i < jobs_nkinds; i++) assert_contains(ckpt_error_last(), jobs_kinds[i].name);
    json_decref(a);
}

static void test_args_check(void **state)
{
    (void)state;
    static const struct {
        const char *kind, *json;
        int want;
        const char *needle;
    } cases[] = {
        {"import", "{\"dir\": \"/x\", \"repo\": \"org/m\"}", 0, NULL},
        {"import", "{\"dir\": \"x\", \"repo\": \"org/m\"}", CKPT_EINVAL, "'dir' must be an absolute path"},
        {"import", "{\"repo\": \"org/m\"}", CKPT_EINVAL, "missing or mistyped"},
        {"convert", "{\"ref\": \"org/m\", \"layout\": \"fused\", \"tp\": 2}", 0, NULL},
        {"convert", "{\"ref\": \"org/m\", \"layout\": \"fused\", \"tp\": -2}", CKPT_EINVAL, "must not be negative"},
        {"convert", "{\"ref\": \"org/m\", \"layout\": 3}", CKPT_EINVAL, "missing or mistyped"},
        {"merge-lora", "{\"ref\": \"org/m\", \"adapter\": \"/ad\", \"scale\": 0.5}", 0, NULL},
        {"merge-lora", "{\"ref\": \"org/m\", \"adapter\": \"/ad\", \"scale\": 0}", CKPT_EINVAL, "missing or mistyped"},
        {"consolidate", "{\"src\": \"/a\", \"dst\": \"b\"}", CKPT_EINVAL, "must be absolute paths"},
        {"fetch", "{\"repo\": \"org/m@main\"}", CKPT_EINVAL, "give the revision in 'revision'"},
        {"sync", "{\"schedule\": 0}", CKPT_EINVAL, "missing or mistyped"},
        {"gc", "{}", 0, NULL},
        {"nonesuch", "{}", CKPT_EINVAL, "unknown job kind"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *a = json_loads(cases[i].json, 0, NULL);
        assert_non_null(a);
        int rc = jobs_args_check(cases[i].kind, a);
        if (rc != cases[i].want)
            fail_msg("%s %s: %d, expected %d (%s)", cases[i].kind, cases[i].json, rc, cases[i].want, ckpt_error_last());
        if (cases[i].needle) assert_contains(ckpt_error_last(), cases[i].needle);
        json_decref(a);
    }
}

static void test_paths(void **state)
{
    (void)state;
    const char *base = getenv("TMPDIR");
    char *dir = ckpt_sprintf("%s/ckpt-test-jobs-XXXXXX", base && *base ? base : "/tmp");
    assert_non_null(dir);
    assert_non_null(mkdtemp(dir));
    char *inside = ckpt_path_join(dir, "in"), *outside = ckpt_path_join(dir, "out");
    assert_int_equal(mkdir(inside, 0700), 0);
    assert_int_equal(mkdir(outside, 0700), 0);
    char **roots = NULL;
    assert_int_equal(jobs_allow_roots(&inside, 1, &roots), 0);

    json_t *a = json_pack("{s:s,s:s}", "dir", outside, "repo", "org/m");
    assert_int_equal(jobs_paths_check("import", a, roots), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "not under an --allow-path folder");
    assert_int_equal(jobs_paths_check("import", a, NULL), CKPT_EINVAL);
    assert_contains(ckpt_error_last(), "may not name host paths");
    json_object_set_new(a, "dir", json_string(inside));
    assert_int_equal(jobs_paths_check("import", a, roots), 0);
    json_decref(a);
    /* The output of a consolidate may not exist yet, but must be strictly inside. */
    char *dst = ckpt_path_join(inside, "new");
    a = json_pack("{s:s,s:s}", "src", inside, "dst", dst);
    assert_int_equal(jobs_paths_check("consolidate", a, roots), 0);
    json_object_set_new(a, "dst", json_string(inside));
    assert_int_equal(jobs_paths_check("consolidate", a, roots), CKPT_EINVAL);
    json_decref(a);
    /* A kind without host paths has nothing to check. */
    a = json_pack("{s:s,s:s}", "ref", "org/m", "layout", "hf");
    assert_int_equal(jobs_paths_check("convert", a, NULL), 0);
    json_decref(a);

    jobs_allow_roots_free(roots);
    ckpt_rm_rf(dir);
    free(dst);
    free(inside);
    free(outside);
    free(dir);
}

/* A worker's progress line, as its daemon reads it: every field back, and
 * a fast job's ETA of a few hundredths of a second still above 0 (printed
 * with one decimal it read "0.0": done, with bytes left). Lines that are
 * not one are refused. */
static void test_progress_line(void **state)
{
    (void)state;
    const queue_progress_info in = {531776, 1297920, 1, 32, "hashing", 42469400.0, 0.0180432};
    char line[512];
    jobs_progress_format(line, sizeof line, &in);
    assert_int_equal(strncmp(line, JOBS_PROGRESS_PREFIX, strlen(JOBS_PROGRESS_PREFIX)), 0);
    queue_progress_info out;
    assert_true(jobs_progress_parse(line + strlen(JOBS_PROGRESS_PREFIX), &out));
    assert_int_equal(out.done, in.done);
    assert_int_equal(out.total, in.total);
    assert_int_equal(out.tensors_done, in.tensors_done);
    assert_int_equal(out.tensors_total, in.tensors_total);
    assert_string_equal(out.phase, "hashing");
    assert_true(out.rate == in.rate);
    assert_true(out.eta > 0.018 && out.eta < 0.0181);
    /* unknown ETA and no phase */
    jobs_progress_format(line, sizeof line, &(queue_progress_info){5, 0, 0, 0, NULL, 0, -1});
    assert_true(jobs_progress_parse(line + strlen(JOBS_PROGRESS_PREFIX), &out));
    assert_true(out.eta == -1 && out.total == 0);
    assert_string_equal(out.phase, "");
    const char *bad[] = {"", "1 2 3 4 5", "1 -2 3 4 5 6 x", "1 2 3 4 -5 6 x", "1 2 3 4 5 -2 x", "1 2 3 4 nan 6 x",
                         "1 2 3 4 5 inf x", "a 2 3 4 5 6 x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (jobs_progress_parse(bad[i], &out)) fail_msg("'%s' read as a progress line", bad[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_rows), cmocka_unit_test(test_words), cmocka_unit_test(test_wrong_words),
        cmocka_unit_test(test_args_check), cmocka_unit_test(test_paths), cmocka_unit_test(test_progress_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

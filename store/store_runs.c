/* store_runs.c — the steps of training runs as stored checkpoints (see store_runs.h). */
#include "store/store_runs.h"

#include "common/error.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STORE_RUNS_MAX_NAME 100

int store_run_repo(const char *run, char **repo)
{
    *repo = NULL;
    size_t n = run ? strlen(run) : 0;
    if (!n || n > STORE_RUNS_MAX_NAME || strchr(run, '/') || strchr(run, '@') || strchr(run, ':'))
        return ckpt_error_set(CKPT_EINVAL,
                              "'%s' is not a run name (letters, digits, - _ ., at most %d)",
                              run ? run : "", STORE_RUNS_MAX_NAME);
    char *r = ckpt_sprintf(STORE_RUNS_REPO_PREFIX "%s", run);
    if (!r) return CKPT_ENOMEM;
    int rc = store_repo_name_check(r);
    if (rc) {
        free(r);
        return ckpt_error_set(rc, "'%s' is not a run name (letters, digits, - _ .)", run);
    }
    *repo = r;
    return 0;
}

int store_run_import(ckpt_store *s, const char *dir, const char *run, uint64_t step, bool quiet,
                     store_ckpt *out, bool *existed)
{
    char *repo, rev[48];
    int rc = store_run_repo(run, &repo);
    if (rc) return rc;
    snprintf(rev, sizeof rev, STORE_RUNS_STEP_PREFIX "%llu", (unsigned long long)step);
    store_import_opts io = {.repo = repo, .revision = rev, .quiet = quiet};
    rc = store_import_dir(s, dir, &io, out, existed);
    free(repo);
    return rc;
}

/* "step-<N>" -> N; false for other names. */
static bool parse_step(const char *name, uint64_t *step)
{
    size_t pl = strlen(STORE_RUNS_STEP_PREFIX);
    return name && !strncmp(name, STORE_RUNS_STEP_PREFIX, pl) &&
           ckpt_parse_u64(name + pl, step) == 0;
}

static int cmp_step(const void *a, const void *b)
{
    const store_run_step *x = a, *y = b;
    int c = strcmp(x->run, y->run);
    return c ? c : (x->step > y->step) - (x->step < y->step);
}

void store_run_steps_free(store_run_step *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i].run);
    free(v);
}

int store_run_steps(ckpt_store *s, const char *run, store_run_step **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    char *repo = NULL;
    int rc = run ? store_run_repo(run, &repo) : 0;
    ckpt_stmt *st = NULL;
    if (!rc)
        rc = catalog_prepare(
            &s->cat, &st,
            "SELECT r.repo, r.name, c.id, c.total_size, c.created_at FROM refs r JOIN checkpoints "
            "c "
            "ON c.id = r.checkpoint_id WHERE substr(r.repo, 1, 5) = '" STORE_RUNS_REPO_PREFIX
            "' AND "
            "(CAST(?1 AS TEXT) IS NULL OR r.repo = ?1)");
    if (!rc && repo) db_bind_text(st, 1, repo);
    size_t cap = 0;
    int step_rc;
    while (!rc && (step_rc = db_step(st)) == DB_ROW) {
        uint64_t step;
        const char *r = db_col_text(st, 0);
        if (!r || !parse_step(db_col_text(st, 1), &step)) continue;
        if ((rc = ckpt_grow(out, &cap, *n + 1, sizeof **out))) break;
        store_run_step *e = &(*out)[*n];
        e->run = ckpt_strdup(r + strlen(STORE_RUNS_REPO_PREFIX));
        if (!e->run) {
            rc = CKPT_ENOMEM;
            break;
        }
        e->step = step;
        e->checkpoint_id = db_col_int64(st, 2);
        e->total_size = db_col_int64(st, 3);
        e->created_at = db_col_int64(st, 4);
        (*n)++;
    }
    if (!rc && step_rc != DB_DONE) rc = catalog_error(&s->cat, "list run steps");
    db_finalize(st);
    free(repo);
    if (rc) {
        store_run_steps_free(*out, *n);
        *out = NULL;
        *n = 0;
        return rc;
    }
    if (*n) qsort(*out, *n, sizeof **out, cmp_step);
    return 0;
}

int store_run_resolve(ckpt_store *s, const char *ref, store_ckpt *out, uint64_t *step)
{
    memset(out, 0, sizeof *out);
    const char *at = strchr(ref, '@');
    char *run = at ? ckpt_strndup(ref, (size_t)(at - ref)) : ckpt_strdup(ref);
    if (!run) return CKPT_ENOMEM;
    int rc = 0;
    if (at && (ckpt_parse_u64(at + 1, step) < 0))
        rc = ckpt_error_set(CKPT_EINVAL, "'%s': the step after '@' must be a number (RUN@STEP)",
                            ref);
    if (!rc && !at) {
        /* The newest step. */
        store_run_step *steps;
        size_t n;
        rc = store_run_steps(s, run, &steps, &n);
        if (!rc && !n)
            rc = ckpt_error_set(CKPT_ENOTFOUND, "run '%s' has no stored steps (see ckpt state ls)",
                                run);
        if (!rc) *step = steps[n - 1].step;
        store_run_steps_free(steps, n);
    }
    char *repo = NULL;
    if (!rc) rc = store_run_repo(run, &repo);
    char *full =
        rc ? NULL
           : ckpt_sprintf("%s@" STORE_RUNS_STEP_PREFIX "%llu", repo, (unsigned long long)*step);
    if (!rc && !full) rc = CKPT_ENOMEM;
    if (!rc) {
        rc = store_resolve(s, full, out);
        if (rc == CKPT_ENOTFOUND)
            rc = ckpt_error_set(CKPT_ENOTFOUND, "run '%s' has no step %llu (see ckpt state ls %s)",
                                run, (unsigned long long)*step, run);
    }
    free(full);
    free(repo);
    free(run);
    return rc;
}

/* Runs sql with ?1 = a (and ?2 = b); *changed (when not NULL) gets the rows it changed. */
static int exec_bound(catalog *c, const char *sql, const char *a, const char *b, const char *what, uint64_t *changed)
{
    ckpt_stmt *st;
    int rc = catalog_prepare(c, &st, sql);
    if (rc) return rc;
    db_bind_text(st, 1, a);
    if (b) db_bind_text(st, 2, b);
    int e = db_step(st);
    if (e != DB_DONE) rc = e < 0 ? e : catalog_error(c, what);
    if (!rc && changed) *changed = (uint64_t)db_changes(st);
    db_finalize(st);
    return rc;
}

int store_run_forget(ckpt_store *s, const char *run, const uint64_t *steps, size_t n,
                     uint64_t *checkpoints_removed)
{
    *checkpoints_removed = 0;
    char *repo;
    int rc = store_run_repo(run, &repo);
    if (rc) return rc;
    if ((rc = catalog_begin(&s->cat))) {
        free(repo);
        return rc;
    }
    for (size_t i = 0; !rc && i < n; i++) {
        char name[48];
        snprintf(name, sizeof name, STORE_RUNS_STEP_PREFIX "%llu", (unsigned long long)steps[i]);
        rc = exec_bound(&s->cat, "DELETE FROM refs WHERE repo = ?1 AND name = ?2", repo, name,
                        "forget step", NULL);
    }
    /* Checkpoints of the run (originals, not layouts made from them) that no ref names. */
    if (!rc)
        rc = exec_bound(&s->cat,
                        "DELETE FROM checkpoints WHERE repo = ?1 AND layout = '' AND id NOT IN "
                        "(SELECT checkpoint_id FROM refs WHERE repo = ?1)",
                        repo, NULL, "drop forgotten steps", checkpoints_removed);
    if (rc)
        catalog_rollback(&s->cat);
    else
        rc = catalog_commit(&s->cat);
    free(repo);
    return rc;
}

int store_run_steps_json(ckpt_store *s, const char *run, json_t **out)
{
    store_run_step *steps;
    size_t n;
    int rc = store_run_steps(s, run, &steps, &n);
    if (rc) return rc;
    json_t *list = json_array();
    for (size_t i = 0; list && i < n; i++)
        if (json_array_append_new(list, json_pack("{s:s,s:I,s:I,s:I}", "run", steps[i].run, "step",
                                                  (json_int_t)steps[i].step, "total_size",
                                                  (json_int_t)steps[i].total_size, "created_at",
                                                  (json_int_t)steps[i].created_at))) {
            json_decref(list);
            list = NULL;
        }
    store_run_steps_free(steps, n);
    *out = list;
    return list ? 0 : ckpt_error_set(CKPT_ENOMEM, "out of memory listing runs");
}

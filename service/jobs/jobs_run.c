/* jobs_run.c — job arguments and job bodies (see jobs_run.h). */
#include "service/jobs/jobs_run.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "service/jobs/queue.h"
#include "service/jobs/schedule.h"
#include "format/archive.h"
#include "transform/convert.h"
#include "hub/hub.h"
#include "store/materialize.h"
#include "transform/presets.h"
#include "store/store_convert.h"
#include "store/store_lora.h"
#include "store/store_verify.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char *absolute(const char *path)
{
    char buf[PATH_MAX];
    if (realpath(path, buf)) return ckpt_strdup(buf);
    if (path[0] == '/') return ckpt_strdup(path);
    if (!getcwd(buf, sizeof buf)) return NULL;
    return ckpt_sprintf("%s/%s", buf, path);
}

static int usage(const char *kind, const char *msg)
{
    return ckpt_error_set(CKPT_EINVAL, "submit %s: %s", kind, msg);
}

static int unknown_kind(const char *kind)
{
    char known[256] = "";
    for (size_t i = 0; i < jobs_nkinds; i++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", jobs_kinds[i].name);
    return ckpt_error_set(CKPT_EINVAL, "unknown job kind '%s' (%s)", kind, known);
}

/* noop: sleeps sleep_ms, then (with until_file, a path inside the store's
 * home) waits until that file exists: tests hold a job running for exactly as
 * long as they need, whatever the machine's speed. The daemon's timeout and
 * cancel end it like any job. */
static int run_noop(ckpt_store *s, const json_t *args)
{
    json_int_t ms = json_integer_value(json_object_get(args, "sleep_ms"));
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    const char *until = json_string_value(json_object_get(args, "until_file"));
    if (!until) return 0;
    size_t hl = strlen(s->home);
    if (strncmp(until, s->home, hl) || until[hl] != '/' || strstr(until, "/../"))
        return ckpt_error_set(CKPT_EINVAL, "noop: until_file '%s' is not inside the store's home %s", until, s->home);
    ckpt_progress pr; /* a phase a watcher can see while it waits (0 of 1) */
    ckpt_progress_start(&pr, "noop: waiting for until_file", 1);
    ckpt_progress_update(&pr, 0);
    struct timespec tick = {0, 10 * 1000000L};
    while (!ckpt_exists(until)) nanosleep(&tick, NULL);
    return 0;
}

/* Reads "--name value" pairs after `first` positional words. */
int jobs_args_from_argv(const char *kind, int argc, char **argv, json_t **args)
{
    json_t *a = json_object();
    *args = a;
    if (!a) return CKPT_ENOMEM;
    const char *pos[2] = {NULL, NULL};
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        const char *w = argv[i];
        if (strncmp(w, "--", 2)) {
            if (npos == 2) return usage(kind, "too many arguments");
            pos[npos++] = w;
            continue;
        }
        if (i + 1 >= argc) return usage(kind, "an option is missing its value");
        const char *v = argv[++i];
        const char *name = w + 2;
        uint64_t n;
        if (!strcmp(name, "repo") || !strcmp(name, "layout") || !strcmp(name, "dtype")) {
            json_object_set_new(a, name, json_string(v));
        } else if (!strcmp(name, "until-file") && !strcmp(kind, JOBS_NOOP)) {
            char *abs = absolute(v);
            json_object_set_new(a, "until_file", json_string(abs ? abs : v));
            free(abs);
        } else if (!strcmp(name, "include") || !strcmp(name, "exclude")) {
            json_t *list = json_object_get(a, name);
            if (!list) json_object_set_new(a, name, list = json_array());
            json_array_append_new(list, json_string(v));
        } else if (!strcmp(name, "connections")) {
            if (ckpt_parse_u64(v, &n) < 0 || n < 1 || n > HUB_MAX_CONNECTIONS) return usage(kind, "--connections must be 1..64");
            json_object_set_new(a, "connections", json_integer((json_int_t)n));
        } else if (!strcmp(name, "chunk-size")) {
            if (ckpt_parse_size(v, &n) < 0 || n < HUB_MIN_CHUNK) return usage(kind, "bad --chunk-size (at least 64KiB)");
            json_object_set_new(a, "chunk_size", json_integer((json_int_t)n));
        } else if (!strcmp(name, "tp") || !strcmp(name, "kv-size-multiplier") || !strcmp(name, "sleep-ms")) {
            if (ckpt_parse_u64(v, &n) < 0 || n > 1000000) return usage(kind, "expected a number");
            json_object_set_new(a, !strcmp(name, "tp") ? "tp" : !strcmp(name, "sleep-ms") ? "sleep_ms" : "kv_size_multiplier",
                                json_integer((json_int_t)n));
        } else if (!strcmp(name, "max-shard-size")) {
            if (ckpt_parse_size(v, &n) < 0) return usage(kind, "bad --max-shard-size");
            json_object_set_new(a, "max_shard_size", json_integer((json_int_t)n));
        } else if (!strcmp(name, "scale")) {
            double d;
            if (ckpt_parse_double("--scale", v, -1e30, 1e30, &d) < 0 || d == 0)
                return usage(kind, "--scale takes a finite, non-zero number");
            json_object_set_new(a, "scale", json_real(d));
        } else {
            char msg[128];
            snprintf(msg, sizeof msg, "unknown option '%s'", w);
            return usage(kind, msg);
        }
    }
    const job_kind *k = jobs_kind_find(kind);
    if (!k) return unknown_kind(kind);
    int rc = k->words(a, pos, npos);
    if (rc) return rc == CKPT_EINVAL ? usage(kind, k->usage) : rc; /* -1 from a words function: wrong words */
    return jobs_args_check(kind, a);
}

int jobs_args_hub_pair(int argc, char **argv, json_t **fetch, json_t **convert)
{
    *fetch = *convert = NULL;
    char **fw = calloc((size_t)argc + 2, sizeof *fw), **cw = calloc((size_t)argc + 2, sizeof *cw);
    const char *at = strchr(argv[0], '@');
    char *ref = at ? ckpt_strdup(argv[0]) : ckpt_sprintf("%s@main", argv[0]);
    int rc = fw && cw && ref ? 0 : CKPT_ENOMEM;
    int nf = 2, nc = 2;
    if (!rc) {
        fw[0] = "fetch";
        fw[1] = argv[0];
        cw[0] = "convert";
        cw[1] = ref;
    }
    for (int i = 1; !rc && i < argc; i++) {
        bool to_fetch = !strcmp(argv[i], "--include") || !strcmp(argv[i], "--exclude") ||
                        !strcmp(argv[i], "--connections") || !strcmp(argv[i], "--chunk-size");
        char **w = to_fetch ? fw : cw;
        int *n = to_fetch ? &nf : &nc;
        w[(*n)++] = argv[i];
        if (!strncmp(argv[i], "--", 2) && i + 1 < argc) w[(*n)++] = argv[++i];
    }
    if (!rc) rc = jobs_args_from_argv("fetch", nf, fw, fetch);
    if (!rc) rc = jobs_args_from_argv("convert", nc, cw, convert);
    free(fw);
    free(cw);
    free(ref);
    return rc;
}

static bool has_str(const json_t *a, const char *k)
{
    return json_is_string(json_object_get(a, k));
}

/* A ref must parse (REPO[@REV][:LAYOUT]); the message names the job and the argument. */
static int check_ref(const char *kind, const char *key, const char *ref)
{
    char *repo, *rev, *layout;
    int rc = store_ref_parse(ref, &repo, &rev, &layout);
    free(repo);
    free(rev);
    free(layout);
    return rc ? ckpt_error_prefix(rc, "job '%s': %s", kind, key) : 0;
}

/* "ref", wherever a kind has one, must parse. */
static int check_ref_arg(const char *kind, const json_t *a)
{
    const char *ref = json_string_value(json_object_get(a, "ref"));
    return ref ? check_ref(kind, "ref", ref) : 0;
}

int jobs_args_check(const char *kind, const json_t *a)
{
    if (!json_is_object(a)) return ckpt_error_set(CKPT_EINVAL, "job arguments must be a JSON object");
    const job_kind *k = jobs_kind_find(kind);
    if (!k) return unknown_kind(kind);
    bool ok = k->shape(a);
    if (!ok) return ckpt_error_set(CKPT_EINVAL, "job '%s': missing or mistyped arguments", kind);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)a, key, v)
    {
        if (json_is_integer(v) && json_integer_value(v) < 0)
            return ckpt_error_set(CKPT_EINVAL, "job '%s': '%s' must not be negative", kind, key);
        bool strings = json_is_array(v);
        size_t i;
        json_t *item;
        json_array_foreach(v, i, item) strings = strings && json_is_string(item);
        if (!json_is_string(v) && !json_is_integer(v) && !strings && !(json_is_real(v) && !strcmp(key, "scale")))
            return ckpt_error_set(CKPT_EINVAL, "job '%s': '%s' must be a string, a number or a list of strings", kind, key);
    }
    int rc = check_ref_arg(kind, a);
    return !rc && k->values ? k->values(kind, a) : rc;
}

/* ---- host paths and the roots they must stay under ---- */

/* canon is root or inside it; strictly inside when the job writes there
 * (it writes DST.tmp-* beside DST, which must stay inside too). */
static bool beneath(const char *canon, const char *root, bool strictly)
{
    size_t n = strlen(root);
    if (n == 1 && root[0] == '/') return canon[1] != '\0' || !strictly;
    return !strncmp(canon, root, n) && ((canon[n] == '\0' && !strictly) || canon[n] == '/');
}

/* The canonical form of path (every symlink resolved); a path that does not
 * exist yet (may_be_new) is its canonical parent plus its last name. */
static char *canonical(const char *path, bool may_be_new)
{
    char buf[PATH_MAX];
    if (realpath(path, buf)) return ckpt_strdup(buf);
    if (!may_be_new || errno != ENOENT) return NULL;
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    if (!slash || !*name || !strcmp(name, ".") || !strcmp(name, "..")) return NULL;
    char *parent = slash == path ? ckpt_strdup("/") : ckpt_strndup(path, (size_t)(slash - path));
    char *pc = parent && realpath(parent, buf) ? ckpt_strdup(buf) : NULL;
    char *out = pc ? ckpt_path_join(pc, name) : NULL;
    free(parent);
    free(pc);
    return out;
}

int jobs_allow_roots(char **paths, size_t n, char ***roots)
{
    *roots = ckpt_calloc(n + 1, sizeof **roots);
    if (!*roots) return CKPT_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        char buf[PATH_MAX];
        bool found = realpath(paths[i], buf) != NULL;
        if (!found || !ckpt_is_dir(buf)) {
            int rc = found ? ckpt_error_set(CKPT_EINVAL, "--allow-path %s: not a folder", paths[i])
                           : ckpt_error_sys("--allow-path %s", paths[i]);
            jobs_allow_roots_free(*roots);
            *roots = NULL;
            return rc;
        }
        if (!((*roots)[i] = ckpt_strdup(buf))) {
            jobs_allow_roots_free(*roots);
            *roots = NULL;
            return CKPT_ENOMEM;
        }
    }
    return 0;
}

void jobs_allow_roots_free(char **roots)
{
    for (size_t i = 0; roots && roots[i]; i++) free(roots[i]);
    free(roots);
}

bool jobs_from_remote(const json_t *args)
{
    return json_object_get(args, JOBS_ORIGIN_KEY) != NULL; /* whatever its value: never trusted */
}

int jobs_paths_check(const char *kind, json_t *args, char *const *roots)
{
    const job_kind *k = jobs_kind_find(kind);
    if (!k) return unknown_kind(kind);
    for (size_t i = 0; i < CKPT_ARRAY_LEN(k->paths) && k->paths[i].key; i++) {
        const char *key = k->paths[i].key, *p = json_string_value(json_object_get(args, key));
        if (!p || p[0] != '/') continue; /* an adapter given as a stored ref */
        if (!roots || !roots[0])
            return ckpt_error_set(CKPT_EINVAL,
                                  "job '%s': '%s' is a host path, and jobs from the HTTP API may not name host paths "
                                  "unless the daemon runs with --allow-path DIR",
                                  kind, key);
        char *canon = canonical(p, k->paths[i].may_be_new);
        bool ok = false;
        for (size_t r = 0; canon && roots[r] && !ok; r++) ok = beneath(canon, roots[r], k->paths[i].may_be_new);
        if (!ok) {
            int rc = ckpt_error_set(CKPT_EINVAL, "job '%s': %s '%s' is not under an --allow-path folder of the daemon",
                                    kind, key, p);
            free(canon);
            return rc;
        }
        /* From here on the job uses the resolved path: no symlink of the
         * given path is followed again. */
        json_object_set_new(args, key, json_string(canon));
        free(canon);
    }
    return 0;
}

static bool is_transient(int code)
{
    return code == CKPT_EIO || code == CKPT_EBUSY || code == CKPT_ENOMEM;
}

static int run_import(ckpt_store *s, const json_t *a, json_t **result)
{
    char *repo = ckpt_strdup(json_string_value(json_object_get(a, "repo")));
    if (!repo) return CKPT_ENOMEM;
    char *at = strchr(repo, '@');
    if (at) *at++ = '\0';
    const char *dir = json_string_value(json_object_get(a, "dir"));
    char *staged = NULL;
    int rc = 0;
    if (!ckpt_is_dir(dir)) {
        char *base = store_tmp_base(s, "import");
        rc = base ? ckpt_archive_extract(dir, base, &staged) : CKPT_ENOMEM;
        free(base);
        dir = staged;
    }
    store_ckpt c;
    bool existed;
    store_import_opts io = {.repo = repo, .revision = at};
    if (!rc) rc = store_import_dir(s, dir, &io, &c, &existed);
    if (staged) {
        ckpt_rm_rf(staged);
        free(staged);
    }
    if (!rc) {
        char *ref = store_ckpt_ref(&c);
        *result = json_pack("{s:s,s:s,s:b}", "ref", ref ? ref : "", "commit", c.commit, "existed", existed);
        free(ref);
        store_ckpt_free(&c);
    }
    free(repo);
    return rc;
}

static int run_convert(ckpt_store *s, const json_t *a, json_t **result)
{
    json_int_t tp = json_integer_value(json_object_get(a, "tp"));
    convert_opts co = {.layout = json_string_value(json_object_get(a, "layout")),
                       .tp = tp > 0 ? (int)tp : 1,
                       .kv_size_multiplier = json_integer_value(json_object_get(a, "kv_size_multiplier")),
                       .dtype = json_string_value(json_object_get(a, "dtype")),
                       .max_shard_size = (uint64_t)json_integer_value(json_object_get(a, "max_shard_size"))};
    store_ckpt out;
    bool existed;
    int rc = store_convert(s, json_string_value(json_object_get(a, "ref")), &co, &out, &existed);
    /* The layout is committed; its files' sha256 now, so that the Hub API and
     * downloads do not wait for them later (with progress: the layout's bytes
     * and tensors, as the job's figures). A failure leaves them to the first
     * reader, as a convert outside the daemon does. */
    if (!rc && store_hash_pending(s, &out, -1, NULL, false))
        ckpt_warn("%s: the files' sha256 are left to the first reader: %s", out.repo, ckpt_error_last());
    if (!rc) {
        char *ref = store_ckpt_ref(&out);
        *result = json_pack("{s:s,s:b}", "ref", ref ? ref : "", "existed", existed);
        free(ref);
        store_ckpt_free(&out);
    }
    return rc;
}

static int run_merge_lora(ckpt_store *s, const json_t *a, bool unmerge, json_t **result)
{
    store_lora_opts o = {.scale = json_number_value(json_object_get(a, "scale")), .unmerge = unmerge};
    store_lora_result r;
    int rc = store_lora_merge(s, json_string_value(json_object_get(a, "ref")),
                              json_string_value(json_object_get(a, "adapter")), &o, &r);
    if (!rc) {
        char *ref = store_ckpt_ref(&r.ckpt);
        *result = json_pack("{s:s,s:s,s:b,s:I,s:I,s:s}", "ref", ref ? ref : "", "commit", r.ckpt.commit, "existed",
                            r.existed, "modules", (json_int_t)r.modules, "new_bytes", (json_int_t)r.new_bytes,
                            "adapter_id", r.adapter_id);
        free(ref);
        store_lora_result_free(&r);
    }
    return rc;
}

/* The globs of a fetch job: pointers into the job's arguments. */
static const char **globs(const json_t *list, size_t *n)
{
    *n = json_array_size(list);
    const char **v = ckpt_calloc(*n + 1, sizeof *v);
    for (size_t i = 0; v && i < *n; i++) v[i] = json_string_value(json_array_get(list, i));
    return v;
}

static int run_fetch(ckpt_store *s, const json_t *a, json_t **result)
{
    hub_fetch_opts o = {.repo = json_string_value(json_object_get(a, "repo")),
                        .revision = json_string_value(json_object_get(a, "revision")),
                        .commit = json_string_value(json_object_get(a, "commit")),
                        .connections = (int)json_integer_value(json_object_get(a, "connections")),
                        .chunk_size = (uint64_t)json_integer_value(json_object_get(a, "chunk_size"))};
    const char **inc = globs(json_object_get(a, "include"), &o.filter.ninclude);
    const char **exc = globs(json_object_get(a, "exclude"), &o.filter.nexclude);
    o.filter.include = inc;
    o.filter.exclude = exc;
    hub_fetch_result r;
    int rc = inc && exc ? hub_fetch(s, &o, &r) : CKPT_ENOMEM;
    if (!rc) {
        char *ref = store_ckpt_ref(&r.ckpt);
        *result = json_pack("{s:s,s:s,s:b,s:I,s:I}", "ref", ref ? ref : "", "commit", r.ckpt.commit, "existed", r.existed,
                            "files", (json_int_t)r.files, "bytes", (json_int_t)r.bytes);
        free(ref);
        hub_fetch_result_free(&r);
    }
    free(inc);
    free(exc);
    return rc;
}

static void log_line(void *ctx, const char *line)
{
    (void)ctx;
    fprintf(stderr, "%s\n", line); /* the worker's stderr is its job log */
}

/* The full check of store_verify.h, as `ckpt verify` runs it: damage is
 * logged line by line and fails the job (not transient); the result is the
 * report's JSON either way. */
static int run_verify(ckpt_store *s, const json_t *a, json_t **result)
{
    store_verify_result r;
    int rc = store_verify(s, json_string_value(json_object_get(a, "ref")), log_line, NULL, &r);
    if (rc) return rc;
    *result = store_verify_json(&r);
    if (!store_verify_clean(&r))
        return ckpt_error_set(CKPT_ECORRUPT, "%llu damaged blobs, %llu checkpoints that do not rebuild (see the job log)",
                              (unsigned long long)r.damaged_blobs, (unsigned long long)r.broken_checkpoints);
    return 0;
}

static int run_merge(ckpt_store *s, const json_t *a, json_t **result)
{
    return run_merge_lora(s, a, false, result);
}

static int run_unmerge(ckpt_store *s, const json_t *a, json_t **result)
{
    return run_merge_lora(s, a, true, result);
}

static int run_consolidate(ckpt_store *s, const json_t *a, json_t **result)
{
    consolidate_opts co = {0};
    int rc = consolidate_run(json_string_value(json_object_get(a, "src")), json_string_value(json_object_get(a, "dst")), &co);
    if (!rc) *result = json_pack("{s:b}", "lossy", co.lossy);
    return rc;
}

static int run_sync(ckpt_store *s, const json_t *a, json_t **result)
{
    return sync_run(s, json_integer_value(json_object_get(a, "schedule")), result);
}

static int run_gc(ckpt_store *s, const json_t *a, json_t **result)
{
    store_gc_result g;
    int rc = store_gc(s, false, &g);
    if (!rc) *result = json_pack("{s:I,s:I}", "blobs_removed", (json_int_t)g.blobs_removed, "bytes_freed", (json_int_t)g.bytes_freed);
    return rc;
}

static int run_noop_job(ckpt_store *s, const json_t *a, json_t **result)
{
    return run_noop(s, a);
}

/* ---- each kind's positional words (the options are common to all) ---- */

static int abs_arg(json_t *a, const char *key, const char *path)
{
    char *abs = absolute(path);
    int rc = json_object_set_new(a, key, json_string(abs ? abs : path)) ? CKPT_ENOMEM : 0;
    free(abs);
    return rc;
}

static int words_import(json_t *a, const char **pos, int npos)
{
    if (npos != 1 || !json_object_get(a, "repo")) return -1;
    return abs_arg(a, "dir", pos[0]);
}

static int words_convert(json_t *a, const char **pos, int npos)
{
    if (npos != 1 || !json_object_get(a, "layout")) return -1;
    return json_object_set_new(a, "ref", json_string(pos[0])) ? CKPT_ENOMEM : 0;
}

static int words_merge(json_t *a, const char **pos, int npos)
{
    if (npos != 2) return -1;
    json_object_set_new(a, "ref", json_string(pos[0]));
    if (ckpt_is_dir(pos[1])) return abs_arg(a, "adapter", pos[1]); /* a folder; anything else is a ref */
    return json_object_set_new(a, "adapter", json_string(pos[1])) ? CKPT_ENOMEM : 0;
}

static int words_consolidate(json_t *a, const char **pos, int npos)
{
    if (npos != 2) return -1;
    int rc = abs_arg(a, "src", pos[0]);
    return rc ? rc : abs_arg(a, "dst", pos[1]);
}

static int words_verify(json_t *a, const char **pos, int npos)
{
    if (npos > 1) return -1;
    return npos && json_object_set_new(a, "ref", json_string(pos[0])) ? CKPT_ENOMEM : 0;
}

static int words_none(json_t *a, const char **pos, int npos)
{
    return npos ? -1 : 0;
}

static int words_fetch(json_t *a, const char **pos, int npos)
{
    if (npos != 1 || json_object_get(a, "repo")) return -1;
    const char *at = strchr(pos[0], '@');
    json_object_set_new(a, "repo", at ? json_stringn(pos[0], (size_t)(at - pos[0])) : json_string(pos[0]));
    json_object_set_new(a, "revision", json_string(at && at[1] ? at + 1 : "main"));
    return 0;
}

static int words_sync(json_t *a, const char **pos, int npos)
{
    uint64_t id;
    if (npos != 1 || ckpt_parse_u64(pos[0], &id) < 0 || id == 0 || id > INT64_MAX) return -1;
    return json_object_set_new(a, "schedule", json_integer((json_int_t)id)) ? CKPT_ENOMEM : 0;
}

/* ---- each kind's fields: present, of the right type ---- */

static bool shape_import(const json_t *a)
{
    return has_str(a, "dir") && has_str(a, "repo");
}

static bool shape_convert(const json_t *a)
{
    return has_str(a, "ref") && has_str(a, "layout");
}

static bool shape_merge(const json_t *a)
{
    json_t *sc = json_object_get(a, "scale");
    return has_str(a, "ref") && has_str(a, "adapter") &&
           (!sc || (json_is_number(sc) && isfinite(json_number_value(sc)) && json_number_value(sc) != 0));
}

static bool shape_consolidate(const json_t *a)
{
    return has_str(a, "src") && has_str(a, "dst");
}

static bool shape_verify(const json_t *a)
{
    return !json_object_get(a, "ref") || has_str(a, "ref");
}

static bool shape_any(const json_t *a)
{
    return true;
}

static bool shape_fetch(const json_t *a)
{
    return has_str(a, "repo") && (!json_object_get(a, "revision") || has_str(a, "revision")) &&
           (!json_object_get(a, "commit") || has_str(a, "commit"));
}

static bool shape_sync(const json_t *a)
{
    return json_integer_value(json_object_get(a, "schedule")) > 0;
}

/* ---- what each kind's values must be, told without the store (submit time and again in the worker) ---- */

static int values_convert(const char *kind, const json_t *a)
{
    json_int_t tp = json_integer_value(json_object_get(a, "tp"));
    preset_opts po = {.preset = json_string_value(json_object_get(a, "layout")),
                      .tp = tp == 0 ? 1 : tp > 1024 ? 1025 : (int)tp, /* 0 or absent: no TP */
                      .kv_size_multiplier = json_integer_value(json_object_get(a, "kv_size_multiplier")),
                      .dtype = json_string_value(json_object_get(a, "dtype"))};
    int rc = preset_check(&po);
    return rc ? ckpt_error_prefix(rc, "job 'convert'") : 0;
}

static int values_merge(const char *kind, const json_t *a)
{
    const char *ad = json_string_value(json_object_get(a, "adapter"));
    return ad[0] != '/' ? check_ref(kind, "adapter (a stored ref, or an absolute folder path)", ad) : 0;
}

static int values_repo(const char *kind, const json_t *a)
{
    const char *repo = json_string_value(json_object_get(a, "repo"));
    const char *at = strchr(repo, '@');
    char *name = at ? ckpt_strndup(repo, (size_t)(at - repo)) : ckpt_strdup(repo);
    int rc = !name ? CKPT_ENOMEM : store_repo_name_check(name);
    if (!rc && at && (!strcmp(kind, "fetch") || !at[1]))
        rc = ckpt_error_set(CKPT_EINVAL, "'%s': %s", repo,
                            at[1] ? "give the revision in 'revision', not in 'repo'" : "empty revision after '@'");
    if (rc && name) rc = ckpt_error_prefix(rc, "job '%s': repo", kind);
    free(name);
    return rc;
}

static int values_import(const char *kind, const json_t *a)
{
    int rc = values_repo(kind, a);
    if (!rc && json_string_value(json_object_get(a, "dir"))[0] != '/')
        rc = ckpt_error_set(CKPT_EINVAL, "job 'import': 'dir' must be an absolute path");
    return rc;
}

static int values_consolidate(const char *kind, const json_t *a)
{
    if (json_string_value(json_object_get(a, "src"))[0] != '/' || json_string_value(json_object_get(a, "dst"))[0] != '/')
        return ckpt_error_set(CKPT_EINVAL, "job 'consolidate': 'src' and 'dst' must be absolute paths");
    return 0;
}

/* The job kinds. A new kind is a row here and its functions above; the
 * daemon takes its limit and timeout from the row, `ckpt submit` and the
 * HTTP API its arguments. */
const job_kind jobs_kinds[] = {
    {"import", "expected DIR --repo ORG/NAME[@REV]", words_import, shape_import, values_import,
     {{"dir", false}}, run_import, 0, 6 * 3600},
    {"convert", "expected REF --layout L [--tp N]", words_convert, shape_convert, values_convert, {{0}}, run_convert,
     0, 6 * 3600},
    {"merge-lora", "expected REF ADAPTER [--scale S] (ADAPTER: a folder or a stored ref)", words_merge, shape_merge,
     values_merge, {{"adapter", false}}, run_merge, 0, 6 * 3600},
    {"unmerge-lora", "expected REF ADAPTER [--scale S] (ADAPTER: a folder or a stored ref)", words_merge, shape_merge,
     values_merge, {{"adapter", false}}, run_unmerge, 0, 6 * 3600},
    {"consolidate", "expected SRC DST", words_consolidate, shape_consolidate, values_consolidate,
     {{"src", false}, {"dst", true}}, run_consolidate, 0, 6 * 3600},
    {"verify", "expected at most one REF", words_verify, shape_verify, NULL, {{0}}, run_verify, 1, 6 * 3600},
    {"gc", "takes no arguments", words_none, shape_any, NULL, {{0}}, run_gc, 1, 3600},
    {"fetch", "expected ORG/NAME[@REV] [--include GLOB]... [--exclude GLOB]...", words_fetch, shape_fetch, values_repo,
     {{0}}, run_fetch, 0, 12 * 3600},
    {"sync", "expected a schedule ID", words_sync, shape_sync, NULL, {{0}}, run_sync, 2, 600},
    {JOBS_NOOP, "takes no arguments", words_none, shape_any, NULL, {{0}}, run_noop_job, 0, 600},
};
const size_t jobs_nkinds = CKPT_ARRAY_LEN(jobs_kinds);

const job_kind *jobs_kind_find(const char *name)
{
    for (size_t i = 0; name && i < jobs_nkinds; i++)
        if (!strcmp(jobs_kinds[i].name, name)) return &jobs_kinds[i];
    return NULL;
}

int jobs_run(ckpt_store *s, const char *kind, const json_t *args, bool *transient, json_t **result)
{
    *transient = false;
    *result = NULL;
    int rc = jobs_args_check(kind, args);
    if (!rc) rc = jobs_kind_find(kind)->run(s, args, result);
    if (rc) *transient = is_transient(rc);
    return rc;
}

void jobs_progress_format(char *buf, size_t n, const queue_progress_info *p)
{
    snprintf(buf, n, JOBS_PROGRESS_PREFIX "%lld %lld %lld %lld %.0f %.6g %s", (long long)p->done, (long long)p->total,
             (long long)p->tensors_done, (long long)p->tensors_total, p->rate, p->eta, p->phase ? p->phase : "");
}

bool jobs_progress_parse(const char *s, queue_progress_info *p)
{
    long long v[4] = {0};
    double rate = 0, eta = -1;
    int used = 0;
    if (sscanf(s, "%lld %lld %lld %lld %lf %lf %n", &v[0], &v[1], &v[2], &v[3], &rate, &eta, &used) < 6 || !used ||
        v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] < 0 || !isfinite(rate) || rate < 0 || !isfinite(eta) || eta < -1)
        return false;
    *p = (queue_progress_info){v[0], v[1], v[2], v[3], s + used, rate, eta};
    return true;
}

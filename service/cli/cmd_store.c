/*
 * cmd_store.c — the store commands: `ckpt import`, `ckpt ls`, `ckpt show`,
 * `ckpt pull`. Each takes --home DIR (default $CKPT_HOME, then
 * $XDG_DATA_HOME/ckpt, then ~/.local/share/ckpt).
 */
#include "service/cli/cli.h"
#include "service/cli/cli_opts.h"
#include "service/cli/job_client.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "format/archive.h"
#include "store/store.h"
#include "transform/convert.h"
#include "hub/hub.h"
#include "store/materialize.h"
#include "store/store_hfcache.h"
#include "store/store_info.h"
#include "store/store_pull.h"
#include "store/store_verify.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { OPT_REPO = CLI_OPT_OWN, OPT_FORMAT, OPT_CONSOLIDATED, OPT_HF_CACHE };

/* Every option of the store commands; each takes the ones its allowed[] lists. */
static const int store_shared[] = {CLI_OPT_HOME,    CLI_OPT_JSON,   CLI_OPT_OUTPUT,
                                   CLI_OPT_RANK,    CLI_OPT_FORCE,  CLI_OPT_QUIET,
                                   CLI_OPT_DRY_RUN, CLI_OPT_SERVER, CLI_OPT_END};
static const struct option store_own[] = {
    {"repo", required_argument, 0, OPT_REPO},
    {"format", required_argument, 0, OPT_FORMAT},
    {"consolidated", no_argument, 0, OPT_CONSOLIDATED},
    {"hf-cache", optional_argument, 0, OPT_HF_CACHE},
    {0, 0, 0, 0},
};

typedef struct {
    cli_common common; /* --home, --json, -o, --force, --quiet, --dry-run, --server */
    const char *repo, *format;
    int rank;
    bool consolidated, hf_cache;
    const char *hf_cache_dir; /* --hf-cache=DIR */
    int npos;
    char **pos;
} store_args;

static int parse(const char *cmd, int argc, char **argv, const int *allowed, store_args *a)
{
    memset(a, 0, sizeof *a);
    a->rank = -1;
    cli_parser p = {.cmd = cmd,
                    .shared = store_shared,
                    .own = store_own,
                    .dash_o = true,
                    .allowed = allowed,
                    .max_args = 2,
                    .common = &a->common};
    int c;
    while ((c = cli_getopt(&p, argc, argv)) > 0) {
        uint64_t v;
        switch (c) {
        case OPT_REPO:
            a->repo = optarg;
            break;
        case CLI_OPT_RANK:
            if (cli_parse_number(cmd, "--rank", optarg, 0, 1023, &v)) return CLI_USAGE;
            a->rank = (int)v;
            break;
        case OPT_FORMAT:
            a->format = optarg;
            break;
        case OPT_CONSOLIDATED:
            a->consolidated = true;
            break;
        case OPT_HF_CACHE:
            a->hf_cache = true;
            a->hf_cache_dir = optarg;
            break;
        }
    }
    if (c < 0) return CLI_USAGE;
    a->pos = p.args;
    a->npos = p.nargs;
    return CLI_OK;
}

/* The daemon the command works on (--server, CKPT_SERVER, the config), opened
 * in *jc: 1 remote, 0 local, or CLI_FAIL's negation after printing. */
static int remote_open(const store_args *a, job_client *jc)
{
    if (!cli_server(a->common.server, a->common.home)) return 0;
    return job_client_open(jc, a->common.home, a->common.server) < 0 ? -cli_fail() : 1;
}

/* GET/DELETE PATH_PREFIX{escaped ref}: the answer, or NULL after printing the error. */
static json_t *remote_ref_call(job_client *jc, const char *method, const char *prefix, const char *ref)
{
    char *esc = job_client_escape(ref), *path = esc ? ckpt_sprintf("%s%s", prefix, esc) : NULL;
    json_t *out = NULL;
    if (!path || job_client_call(jc, method, path, NULL, &out, NULL) < 0) cli_fail();
    free(esc);
    free(path);
    return out;
}

int cmd_import(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf("usage: ckpt import DIR|ARCHIVE --repo ORG/NAME[@REV] [--home DIR] [--json]\n\n"
               "Stores a local Hugging Face checkpoint folder (or a .tar, .tar.gz or .tar.zst of\n"
               "one). Every tensor is stored once, named by its sha256; other files are stored\n"
               "whole. REV (default main) names this import; the newest import wins for a name.\n"
               "Importing the same content again stores nothing new. Prints the ref.\n\n"
               "example:\n  ckpt import ./Qwen2-0.5B --repo Qwen/Qwen2-0.5B@main\n");
        return CLI_OK;
    }
    static const int allowed[] = {CLI_OPT_HOME, OPT_REPO, CLI_OPT_JSON, CLI_OPT_QUIET, CLI_OPT_SERVER, CLI_OPT_END};
    store_args a;
    int u = parse("import", argc, argv, allowed, &a);
    if (!u)
        u = cli_local_only("import", a.common.server, a.common.home,
                           "queue it on the daemon with `ckpt submit import DIR --repo ORG/NAME` (--allow-path)");
    if (u) return u;
    if (a.npos != 1) return cli_usage_error("import", "expected one folder or archive to import");
    if (!a.repo) return cli_usage_error("import", "--repo ORG/NAME[@REV] is required");
    char *repo = ckpt_strdup(a.repo), *at = repo ? strchr(repo, '@') : NULL;
    if (!repo) return cli_fail();
    if (at) *at++ = '\0';
    ckpt_store s;
    if (store_open(&s, a.common.home) < 0) {
        free(repo);
        return cli_fail();
    }
    char *staged = NULL;
    const char *dir = a.pos[0];
    int rc = 0;
    if (!ckpt_is_dir(dir)) {
        char *base = store_tmp_base(&s, "import");
        rc = base ? ckpt_archive_extract(dir, base, &staged) : CKPT_ENOMEM;
        free(base);
        dir = staged;
    }
    store_ckpt c;
    bool existed = false;
    store_import_opts io = {.repo = repo, .revision = at, .quiet = a.common.quiet};
    if (!rc) rc = store_import_dir(&s, dir, &io, &c, &existed);
    if (staged) {
        ckpt_rm_rf(staged);
        free(staged);
    }
    int ret = CLI_OK;
    if (rc) {
        ret = cli_fail();
    } else {
        char *ref = store_ckpt_ref(&c), size[32];
        json_t *j;
        if (a.common.json) {
            if (store_ckpt_json(&s, &c, false, &j) < 0) ret = cli_fail();
            else cli_print_json(j);
        } else
            printf("%s\n", ref);
        ckpt_info("%s %s (commit %.12s, %s)", existed ? "already stored:" : "imported", ref,
                  c.commit, ckpt_format_size((uint64_t)c.total_size, size, sizeof size));
        free(ref);
        store_ckpt_free(&c);
    }
    store_close(&s);
    free(repo);
    return ret;
}

/* `ckpt ls` as text, from the JSON of GET /v1/checkpoints (store_list_json). */
static void print_ls(const json_t *list)
{
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(list, "checkpoints"), i, c)
    {
        char size[32], when[32];
        time_t t = (time_t)json_integer_value(json_object_get(c, "created_at"));
        strftime(when, sizeof when, "%Y-%m-%d %H:%M", gmtime(&t));
        const char *ref = json_string_value(json_object_get(c, "ref")), *commit = json_string_value(json_object_get(c, "commit"));
        printf("%-60s %.12s %12s  %s\n", ref ? ref : "?", commit ? commit : "",
               ckpt_format_size((uint64_t)json_integer_value(json_object_get(c, "total_size")), size, sizeof size), when);
    }
}

int cmd_ls(int argc, char **argv)
{
    static const char help[] =
        "usage: ckpt ls [REPO] [--json] [--home DIR | --server URL]\n\n"
        "Lists the stored checkpoints (originals and converted layouts): ref, commit,\n"
        "size, creation time. With --server (or CKPT_SERVER), a daemon's store\n"
        "(GET /v1/checkpoints).\n\n"
        "examples:\n"
        "  ckpt ls\n"
        "  ckpt ls Qwen/Qwen2-0.5B --json\n"
        "  ckpt --server http://storage:8470 ls\n";
    if (cli_wants_help(argc, argv)) return fputs(help, stdout), CLI_OK;
    static const int allowed[] = {CLI_OPT_HOME, CLI_OPT_JSON, CLI_OPT_SERVER, CLI_OPT_END};
    store_args a;
    int u = parse("ls", argc, argv, allowed, &a);
    if (u) return u;
    if (a.npos > 1) return cli_usage_error("ls", "expected at most one REPO");
    const char *repo = a.npos ? a.pos[0] : NULL;
    job_client jc;
    int remote = remote_open(&a, &jc);
    if (remote < 0) return -remote;
    json_t *list = NULL;
    if (remote) {
        char *esc = repo ? job_client_escape(repo) : NULL,
             *path = ckpt_sprintf("/v1/checkpoints%s%s", esc ? "?repo=" : "", esc ? esc : "");
        if (!path || job_client_call(&jc, "GET", path, NULL, &list, NULL) < 0) list = NULL;
        free(esc);
        free(path);
        job_client_close(&jc);
    } else {
        ckpt_store s;
        if (store_open(&s, a.common.home) < 0) return cli_fail();
        if (store_list_json(&s, repo, &list) < 0) list = NULL;
        store_close(&s);
    }
    if (!list) return cli_fail();
    if (a.common.json) return cli_print_json(list);
    print_ls(list);
    json_decref(list);
    return CLI_OK;
}

int cmd_show(int argc, char **argv)
{
    /* `ckpt show ID` (a number) shows a job; anything else is a stored checkpoint. */
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-') {
            if (!strcmp(argv[i], "--home") || !strcmp(argv[i], "--server")) i++;
            continue;
        }
        if (strspn(argv[i], "0123456789") == strlen(argv[i])) return cmd_job_show(argc, argv);
        break;
    }
    if (cli_wants_help(argc, argv)) {
        printf("usage: ckpt show REF [--json] [--home DIR | --server URL]\n"
               "       ckpt show JOB_ID [--server URL] [--home DIR]\n\n"
               "Shows a stored checkpoint: its files (size, sha256), tensors per file, and for a\n"
               "converted layout the source it came from. REF is ORG/NAME[@REV][:LAYOUT].\n"
               "A number shows that job instead (as JSON).\n\n"
               "examples:\n"
               "  ckpt show Qwen/Qwen2-0.5B@main:neuron-tp2\n"
               "  ckpt show 42\n");
        return CLI_OK;
    }
    static const int allowed[] = {CLI_OPT_HOME, CLI_OPT_JSON, CLI_OPT_SERVER, CLI_OPT_END};
    store_args a;
    int u = parse("show", argc, argv, allowed, &a);
    if (u) return u;
    if (a.npos != 1) return cli_usage_error("show", "expected one REF");
    job_client jc;
    int remote = remote_open(&a, &jc);
    if (remote < 0) return -remote;
    json_t *j = NULL;
    if (remote) {
        j = remote_ref_call(&jc, "GET", "/v1/checkpoints/", a.pos[0]);
        job_client_close(&jc);
        if (!j) return CLI_FAIL;
    } else {
        ckpt_store s;
        if (store_open(&s, a.common.home) < 0) return cli_fail();
        store_ckpt c;
        int rc = store_resolve(&s, a.pos[0], &c);
        if (!rc) {
            rc = store_ckpt_json(&s, &c, true, &j);
            store_ckpt_free(&c);
        }
        store_close(&s);
        if (rc) return cli_fail();
    }
    if (a.common.json) return cli_print_json(j);
    char size[32];
    const char *layout = json_string_value(json_object_get(j, "layout"));
    printf("%s\n  commit %s\n  layout %s\n  size   %s%s\n", json_string_value(json_object_get(j, "ref")),
           json_string_value(json_object_get(j, "commit")), layout && *layout ? layout : "(original)",
           ckpt_format_size((uint64_t)json_integer_value(json_object_get(j, "total_size")), size, sizeof size),
           json_is_true(json_object_get(j, "lossy")) ? " (lossy cast)" : "");
    if (json_is_string(json_object_get(j, "source")))
        printf("  source %s\n", json_string_value(json_object_get(j, "source")));
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(j, "files"), i, f)
    {
        const char *sha = json_string_value(json_object_get(f, "sha256"));
        printf("  %-50s %12s  %-16.16s  %lld tensors%s\n", json_string_value(json_object_get(f, "path")),
               ckpt_format_size((uint64_t)json_integer_value(json_object_get(f, "size")), size, sizeof size),
               sha ? sha : "(sha256 pending)",
               (long long)json_integer_value(json_object_get(f, "tensors")),
               json_integer_value(json_object_get(f, "recipes")) ? " (recipes)" : "");
    }
    json_decref(j);
    return CLI_OK;
}

/* `pull --server`: the daemon's Hub API serves REF as a revision (a layout as
 * "<commit>.<layout>"); hub_fetch brings it into the local store, verified,
 * with parallel ranges and resume. */
/* Exclude patterns that leave, of the tp_rank_* folders, only rank's
 * (tp_rank_%02d): every name of another length, and at each digit any other
 * digit. At most 2 * 5 + 2 patterns, in pat[] (each up to 48 bytes). */
static size_t rank_excludes(int rank, char pat[][48])
{
    char r[8];
    int len = snprintf(r, sizeof r, "%02d", rank);
    size_t n = 0;
    for (int k = 1; k < len; k++) n += (size_t)!!snprintf(pat[n], 48, "tp_rank_%.*s/*", k, "????????");
    snprintf(pat[n++], 48, "tp_rank_%.*s*/*", len + 1, "?????????");
    for (int i = 0; i < len; i++)
        snprintf(pat[n++], 48, "tp_rank_%.*s[!%c]%.*s/*", i, r, r[i], len - i - 1, "????????");
    return n;
}

static int fetch_remote(ckpt_store *s, const char *server, const char *ref, bool quiet, int rank, store_ckpt *out,
                        bool *layout)
{
    char *repo, *rev, *lay;
    int rc = store_ref_parse(ref, &repo, &rev, &lay);
    if (rc) return rc;
    *layout = lay != NULL;
    /* The Hub client reads its endpoint and token from the environment. */
    setenv("HF_ENDPOINT", server, 1);
    const char *tok = getenv("CKPT_TOKEN");
    if (tok && *tok) setenv("HF_TOKEN", tok, 1);
    else unsetenv("HF_TOKEN");
    hub_client h;
    char commit[41];
    rc = hub_client_init(&h);
    if (!rc) {
        rc = hub_resolve_revision(&h, repo, rev ? rev : "main", commit);
        hub_client_free(&h);
    }
    char *hubrev = rc ? NULL : lay ? ckpt_sprintf("%s.%s", commit, lay) : ckpt_strdup(commit);
    if (!rc && !hubrev) rc = CKPT_ENOMEM;
    hub_fetch_result res;
    memset(&res, 0, sizeof res);
    hub_fetch_opts fo = {.repo = repo, .revision = hubrev, .quiet = quiet};
    /* one rank of a layout: only that rank's folder (and the files beside the ranks) come over */
    char pat[16][48];
    const char *excl[16];
    if (rank >= 0 && lay) {
        fo.filter.nexclude = rank_excludes(rank, pat);
        for (size_t i = 0; i < fo.filter.nexclude; i++) excl[i] = pat[i];
        fo.filter.exclude = excl;
    }
    if (!rc) rc = hub_fetch(s, &fo, &res);
    if (!rc) {
        *out = res.ckpt;
        memset(&res.ckpt, 0, sizeof res.ckpt);
    }
    hub_fetch_result_free(&res);
    free(hubrev);
    free(repo);
    free(rev);
    free(lay);
    return rc;
}

/* ckpt pull REF --hf-cache [DIR] (store_hfcache.h). */
static int pull_hf_cache(const store_args *a)
{
    if (a->npos < 1 || a->npos > 2 || (a->npos == 2 && a->hf_cache_dir))
        return cli_usage_error("pull", "expected REF --hf-cache [DIR]");
    if (a->common.out || a->format || a->consolidated || a->rank >= 0)
        return cli_usage_error("pull", "--hf-cache writes whole revisions: no -o, --format, --rank or --consolidated");
    char *dir = a->hf_cache_dir ? ckpt_strdup(a->hf_cache_dir)
                : a->npos == 2 ? ckpt_strdup(a->pos[1])
                               : store_hfcache_default_dir();
    if (!dir) return cli_fail();
    ckpt_store s;
    if (store_open(&s, a->common.home) < 0) {
        free(dir);
        return cli_fail();
    }
    store_ckpt c;
    bool layout = false;
    int rc = a->common.server ? fetch_remote(&s, a->common.server, a->pos[0], a->common.quiet, -1, &c, &layout)
                              : store_resolve(&s, a->pos[0], &c);
    store_hfcache_stats st;
    store_hfcache_opts o = {.no_symlinks = store_hfcache_symlinks_disabled()};
    if (!rc) {
        rc = store_hfcache_write(&s, &c, dir, &o, &st);
        char *ref = store_ckpt_ref(&c);
        if (!rc)
            ckpt_info("pulled %s into the Hugging Face cache %s: %zu files, %zu entries written (%zu hardlinked, %zu "
                      "copied)%s",
                      ref ? ref : "", dir, st.files, st.written, st.linked, st.copied,
                      st.written ? "" : ", all there already");
        free(ref);
        store_ckpt_free(&c);
    }
    store_close(&s);
    free(dir);
    return rc ? cli_fail() : CLI_OK;
}

int cmd_pull(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf(
            "usage: ckpt pull REF -o DIR|- [--rank R] [--consolidated] [--format dir|tar|tar.zst]\n"
            "                [--force] [--home DIR]\n"
            "       ckpt pull REF --hf-cache [DIR]\n\n"
            "Writes a stored checkpoint out. Every file is rebuilt from its blobs (or from the\n"
            "recipe a converted layout keeps) and its sha256 checked against the catalog\n"
            "before DIR appears; a damaged store fails instead of writing bad bytes.\n\n"
            "  -o DIR          destination folder (must be empty unless --force); '-' streams a\n"
            "                  tar to standard output\n"
            "  --rank R        of a tensor-parallel layout, only rank R's folder (at DIR's root)\n"
            "                  plus config.json and ckpt-layout.json\n"
            "  --consolidated  of a converted layout: the original layout rebuilt from it\n"
            "  --format F      dir (default), tar or tar.zst (to -o FILE or -o -)\n"
            "  --server URL    pull from a remote ckpt daemon (token in CKPT_TOKEN): its files\n"
            "                  come over its Hub API with parallel ranges, resume and sha256\n"
            "                  checks, and are kept in the local store as REPO@<its commit>\n"
            "  --hf-cache [DIR] write into a Hugging Face cache instead (DIR, else HF_HUB_CACHE,\n"
            "                  HF_HOME/hub, ~/.cache/huggingface/hub): models--ORG--NAME with\n"
            "                  blobs/ (hardlinked from the store when it can), snapshots/COMMIT/\n"
            "                  symlinks (copies with HF_HUB_DISABLE_SYMLINKS=1), refs/ and trees/,\n"
            "                  named as the daemon's Hub API names them (docs/hub.md), so\n"
            "                  transformers and huggingface_hub load it offline; what is there\n"
            "                  already is kept\n\n"
            "examples:\n  ckpt pull Qwen/Qwen2-0.5B@main:neuron-tp8 --rank 3 -o ./rank3\n"
            "  HF_HUB_OFFLINE=1 python -c '...from_pretrained(\"Qwen/Qwen2-0.5B\", revision=\"neuron-tp8\")'\n"
            "    after: ckpt pull Qwen/Qwen2-0.5B@main:neuron-tp8 --hf-cache\n"
            "  ckpt pull Qwen/Qwen2-0.5B@main -o - --format tar.zst > qwen.tar.zst\n");
        return CLI_OK;
    }
    static const int allowed[] = {CLI_OPT_HOME,  CLI_OPT_OUTPUT, CLI_OPT_RANK,
                                  OPT_FORMAT,    CLI_OPT_FORCE,  OPT_CONSOLIDATED,
                                  CLI_OPT_QUIET, CLI_OPT_SERVER, OPT_HF_CACHE, CLI_OPT_END};
    store_args a;
    int u = parse("pull", argc, argv, allowed, &a);
    if (u) return u;
    a.common.server = cli_server(a.common.server, a.common.home); /* CKPT_SERVER and the config too */
    if (a.hf_cache) return pull_hf_cache(&a);
    if (a.npos != 1) return cli_usage_error("pull", "expected one REF");
    if (!a.common.out)
        return cli_usage_error("pull", "-o DIR (or -o - for a tar stream) is required");
    const char *fmt = a.format ? a.format : (!strcmp(a.common.out, "-") ? "tar" : "dir");
    if (strcmp(fmt, "dir") && strcmp(fmt, "tar") && strcmp(fmt, "tar.zst"))
        return cli_usage_error("pull", "--format must be dir, tar or tar.zst");
    if (!strcmp(fmt, "dir") && !strcmp(a.common.out, "-"))
        return cli_usage_error("pull", "-o - needs --format tar or tar.zst");
    if (a.consolidated && a.rank >= 0)
        return cli_usage_error("pull", "--consolidated and --rank exclude each other");
    ckpt_store s;
    if (store_open(&s, a.common.home) < 0) return cli_fail();
    store_ckpt c;
    bool layout = false;
    int rc = a.common.server
                 ? fetch_remote(&s, a.common.server, a.pos[0], a.common.quiet, a.rank, &c, &layout)
                 : store_resolve(&s, a.pos[0], &c);
    if (rc) {
        store_close(&s);
        return cli_fail();
    }
    if (!a.common.server) layout = *c.layout != '\0';
    if (a.consolidated && !layout) {
        store_ckpt_free(&c);
        store_close(&s);
        return cli_usage_error("pull", "--consolidated applies to a converted layout (REF:LAYOUT)");
    }
    store_pull_opts po = {.rank = a.rank, .consolidated = a.consolidated, .force = a.common.force,
                          .quiet = a.common.quiet};
    rc = store_pull_format_parse(fmt, &po.format);
    if (!rc) rc = store_pull(&s, &c, a.common.out, &po);
    int ret = rc ? cli_fail() : CLI_OK;
    if (!rc && strcmp(a.common.out, "-")) {
        char *ref = store_ckpt_ref(&c);
        ckpt_info("pulled %s%s%s -> %s", ref ? ref : "", a.consolidated ? " (consolidated)" : "",
                  a.rank >= 0 ? " (one rank)" : "", a.common.out);
        free(ref);
    }
    store_ckpt_free(&c);
    store_close(&s);
    return ret;
}

int cmd_rm(int argc, char **argv)
{
    static const char help[] =
        "usage: ckpt rm REF [--home DIR | --server URL]\n\n"
        "Removes a checkpoint from the catalog. Layouts converted from it keep working\n"
        "(they reference the blobs directly). Its bytes are freed by the next ckpt gc.\n"
        "With --server, on a daemon (DELETE /v1/checkpoints/{ref}, an admin token).\n\n"
        "example:\n"
        "  ckpt rm Qwen/Qwen2-0.5B@main:fused && ckpt gc\n";
    if (cli_wants_help(argc, argv)) return fputs(help, stdout), CLI_OK;
    static const int allowed[] = {CLI_OPT_HOME, CLI_OPT_SERVER, CLI_OPT_END};
    store_args a;
    int u = parse("rm", argc, argv, allowed, &a);
    if (u) return u;
    if (a.npos != 1) return cli_usage_error("rm", "expected one REF");
    job_client jc;
    int remote = remote_open(&a, &jc);
    if (remote < 0) return -remote;
    if (remote) {
        json_t *j = remote_ref_call(&jc, "DELETE", "/v1/checkpoints/", a.pos[0]);
        job_client_close(&jc);
        if (!j) return CLI_FAIL;
        ckpt_info("removed %s; ckpt gc on the server frees its space", json_string_value(json_object_get(j, "removed")));
        json_decref(j);
        return CLI_OK;
    }
    ckpt_store s;
    if (store_open(&s, a.common.home) < 0) return cli_fail();
    store_ckpt c;
    int rc = store_resolve(&s, a.pos[0], &c);
    if (!rc) {
        rc = store_rm(&s, &c);
        char *ref = store_ckpt_ref(&c);
        if (!rc) ckpt_info("removed %s; run ckpt gc to free its space", ref ? ref : "");
        free(ref);
        store_ckpt_free(&c);
    }
    store_close(&s);
    return rc ? cli_fail() : CLI_OK;
}

/* Runs KIND as a job on the daemon and returns its result (NULL after printing the error). */
static json_t *remote_job(job_client *jc, const char *kind, json_t *args)
{
    json_t *result = NULL;
    if (!args || job_client_run(jc, kind, args, &result) < 0) cli_fail();
    json_decref(args);
    job_client_close(jc);
    return result;
}

int cmd_gc(int argc, char **argv)
{
    static const char help[] =
        "usage: ckpt gc [--dry-run] [--json] [--home DIR | --server URL]\n\n"
        "Deletes blobs that no checkpoint references and the leftovers of interrupted\n"
        "writes (temp files of processes that are gone). Blobs that a running import\n"
        "has leased are kept. --dry-run only counts (locally). With --server, runs as a\n"
        "gc job on the daemon and waits for it.\n\n"
        "gc holds the lock that keeps writers out while it decides and deletes (SQLite's\n"
        "write lock; on PostgreSQL, blob_leases locked against new leases) and waits\n"
        "for it at most CKPT_GC_LOCK_TIMEOUT_S seconds (default 30): a writer stopped in\n"
        "the middle of a transaction makes gc exit 1 with \"another process holds blob\n"
        "leases on DATABASE; try again\" (SQLite: \"... the write lock of ...\"),\n"
        "having deleted nothing.\n\n"
        "examples:\n"
        "  ckpt gc --dry-run\n"
        "  ckpt gc --json\n";
    if (cli_wants_help(argc, argv)) return fputs(help, stdout), CLI_OK;
    static const int allowed[] = {CLI_OPT_HOME, CLI_OPT_DRY_RUN, CLI_OPT_JSON, CLI_OPT_SERVER, CLI_OPT_END};
    store_args a;
    int u = parse("gc", argc, argv, allowed, &a);
    if (u) return u;
    if (a.npos) return cli_usage_error("gc", "takes no arguments");
    if (a.common.dry_run && (u = cli_local_only("gc --dry-run", a.common.server, a.common.home, NULL))) return u;
    job_client jc;
    int remote = remote_open(&a, &jc);
    if (remote < 0) return -remote;
    store_gc_result r = {0};
    if (remote) {
        json_t *res = remote_job(&jc, "gc", json_object());
        if (!res) return CLI_FAIL;
        r.blobs_removed = (uint64_t)json_integer_value(json_object_get(res, "blobs_removed"));
        r.bytes_freed = (uint64_t)json_integer_value(json_object_get(res, "bytes_freed"));
        r.temps_removed = (uint64_t)json_integer_value(json_object_get(res, "temps_removed"));
        r.leases_dropped = (uint64_t)json_integer_value(json_object_get(res, "leases_dropped"));
        json_decref(res);
    } else {
        ckpt_store s;
        if (store_open(&s, a.common.home) < 0) return cli_fail();
        int rc = store_gc(&s, a.common.dry_run, &r);
        store_close(&s);
        if (rc) return cli_fail();
    }
    char b[32];
    if (a.common.json)
        return cli_print_json(json_pack(
            "{s:b,s:I,s:I,s:I,s:I}", "dry_run", a.common.dry_run, "blobs_removed",
            (json_int_t)r.blobs_removed, "bytes_freed", (json_int_t)r.bytes_freed, "temps_removed",
            (json_int_t)r.temps_removed, "leases_dropped", (json_int_t)r.leases_dropped));
    printf("%s %llu blobs (%s), %llu leftovers of interrupted writes, %llu stale leases\n",
           a.common.dry_run ? "would remove" : "removed", (unsigned long long)r.blobs_removed,
           ckpt_format_size(r.bytes_freed, b, sizeof b), (unsigned long long)r.temps_removed,
           (unsigned long long)r.leases_dropped);
    return CLI_OK;
}

int cmd_du(int argc, char **argv)
{
    static const char help[] =
        "usage: ckpt du [--json] [--home DIR | --server URL]\n\n"
        "Logical bytes of all stored checkpoints (what pulling all of them would write)\n"
        "against physical bytes of the blobs on disk, and the deduplication ratio.\n"
        "With --server, a daemon's store (GET /v1/store).\n\n"
        "example:\n"
        "  ckpt du --json\n";
    if (cli_wants_help(argc, argv)) return fputs(help, stdout), CLI_OK;
    static const int allowed[] = {CLI_OPT_HOME, CLI_OPT_JSON, CLI_OPT_SERVER, CLI_OPT_END};
    store_args a;
    int u = parse("du", argc, argv, allowed, &a);
    if (u) return u;
    if (a.npos) return cli_usage_error("du", "takes no arguments");
    job_client jc;
    int remote = remote_open(&a, &jc);
    if (remote < 0) return -remote;
    json_t *j = NULL;
    if (remote) {
        if (job_client_call(&jc, "GET", "/v1/store", NULL, &j, NULL) < 0) j = NULL;
        job_client_close(&jc);
    } else {
        ckpt_store s;
        store_du_result r;
        if (store_open(&s, a.common.home) < 0) return cli_fail();
        if (!store_du(&s, &r)) j = store_du_json(&r);
        store_close(&s);
    }
    if (!j) return cli_fail();
    if (a.common.json) return cli_print_json(j);
    char l[32], p[32], d[32];
#define DU_U(k) ((uint64_t)json_integer_value(json_object_get(j, k)))
    printf("%llu checkpoints, logical %s, physical %s in %llu blobs (+ catalog %s), dedup ratio %.2f\n",
           (unsigned long long)DU_U("checkpoints"), ckpt_format_size(DU_U("logical_bytes"), l, sizeof l),
           ckpt_format_size(DU_U("physical_bytes"), p, sizeof p), (unsigned long long)DU_U("blobs"),
           ckpt_format_size(DU_U("catalog_bytes"), d, sizeof d), json_real_value(json_object_get(j, "dedup_ratio")));
#undef DU_U
    json_decref(j);
    return CLI_OK;
}

static void print_line(void *ctx, const char *line)
{
    (void)ctx;
    printf("%s\n", line);
}

int cmd_verify(int argc, char **argv)
{
    static const char help[] =
        "usage: ckpt verify [REF] [--json] [--home DIR | --server URL]\n\n"
        "Re-hashes every blob (of REF, or of the whole store), then rebuilds every file\n"
        "and checks its sha256 against the catalog. Names each damaged blob with the\n"
        "checkpoints and files it breaks. Exit 1 if anything is damaged. With --server,\n"
        "runs as a verify job on the daemon and waits for it (its log names the damage).\n\n"
        "examples:\n"
        "  ckpt verify\n"
        "  ckpt verify Qwen/Qwen2-0.5B@main --json\n";
    static const int allowed[] = {CLI_OPT_HOME, CLI_OPT_QUIET, CLI_OPT_JSON, CLI_OPT_SERVER, CLI_OPT_END};
    store_args a;
    if (cli_wants_help(argc, argv)) return fputs(help, stdout), CLI_OK;
    int u = parse("verify", argc, argv, allowed, &a);
    if (u) return u;
    if (a.npos > 1) return cli_usage_error("verify", "expected at most one REF");
    job_client jc;
    int remote = remote_open(&a, &jc);
    if (remote < 0) return -remote;
    if (remote) {
        json_t *args = a.npos ? json_pack("{s:s}", "ref", a.pos[0]) : json_object();
        json_t *res = remote_job(&jc, "verify", args);
        if (!res) return CLI_FAIL;
        if (a.common.json) return cli_print_json(res);
        ckpt_info("verify: clean (%lld checkpoints rebuilt and checked)",
                  (long long)json_integer_value(json_object_get(res, "checkpoints_checked")));
        json_decref(res);
        return CLI_OK;
    }
    ckpt_store s;
    if (store_open(&s, a.common.home) < 0) return cli_fail();
    store_verify_result r;
    int rc = store_verify(&s, a.npos ? a.pos[0] : NULL, print_line, NULL, &r);
    store_close(&s);
    if (rc) return cli_fail();
    if (a.common.json) cli_print_json(store_verify_json(&r));
    if (!store_verify_clean(&r)) {
        fprintf(stderr, "ckpt: verify: %llu damaged blobs, %llu checkpoints that do not rebuild\n",
                (unsigned long long)r.damaged_blobs, (unsigned long long)r.broken_checkpoints);
        return CLI_FAIL;
    }
    ckpt_info("verify: clean (%llu checkpoints rebuilt and checked)", (unsigned long long)r.checkpoints_checked);
    return CLI_OK;
}

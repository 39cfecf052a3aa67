/*
 * cmd_fetch.c — `ckpt fetch ORG/NAME[@REV]`: download a checkpoint from a
 * Hugging Face Hub into the store, in this process (the `fetch` job kind
 * does the same in the daemon). The work is hub/hub_fetch.c.
 */
#include "service/cli/cli.h"
#include "service/cli/cli_opts.h"

#include "common/error.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "hub/hub.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OPT_INCLUDE = CLI_OPT_OWN, OPT_EXCLUDE, OPT_CONNECTIONS, OPT_CHUNK };

static void help(void)
{
    printf("usage: ckpt fetch ORG/NAME[@REV] [--include GLOB]... [--exclude GLOB]...\n"
           "                  [--connections N] [--chunk-size SIZE] [--home DIR] [--json] "
           "[--quiet]\n\n"
           "Downloads a checkpoint from a Hugging Face Hub into the store and prints its ref.\n"
           "REV (default main) is resolved to a commit first and every request names that\n"
           "commit. Files are listed with the tree API, downloaded in parallel Range requests\n"
           "(resumed after a dropped connection, retried with backoff on 408/429/5xx), and\n"
           "verified: every file's size, and the sha256 of every LFS file against the Hub's\n"
           "lfs.oid (a mismatch is downloaded once more, then fails naming the file). Nothing\n"
           "unverified enters the store. A commit already in the store downloads nothing.\n"
           "An interrupted fetch (Ctrl-C, kill, a lost connection) keeps its finished pieces\n"
           "in CKPT_HOME/partial/: run the same fetch again and only the rest is downloaded\n"
           "(gc removes what was kept once untouched for CKPT_HUB_PARTIAL_KEEP seconds,\n"
           "default 7 days).\n"
           "On a terminal one line shows files verified, bytes, rate and ETA.\n\n"
           "  --include GLOB     take the files matching GLOB instead of the defaults\n"
           "                     (repeatable; a GLOB without '/' also matches file names)\n"
           "  --exclude GLOB     leave out files matching GLOB (repeatable; wins over --include)\n"
           "  --connections N    parallel requests (default %d, at most %d)\n"
           "  --chunk-size SIZE  bytes per Range request (default 32MiB)\n\n"
           "Default files:",
           HUB_DEFAULT_CONNECTIONS, HUB_MAX_CONNECTIONS);
    for (size_t i = 0; hub_default_include[i]; i++)
        printf("%s %s", i ? "," : "", hub_default_include[i]);
    printf("\nnever, unless an --include matches them:");
    for (size_t i = 0; hub_default_exclude[i]; i++)
        printf("%s %s", i ? "," : "", hub_default_exclude[i]);
    printf("\n\nenvironment:\n"
           "  HF_ENDPOINT   the Hub (default %s)\n"
           "  HF_TOKEN      a token (else HUGGING_FACE_HUB_TOKEN, else $HF_HOME/token); it is\n"
           "                sent only to HF_ENDPOINT's host, never logged or stored\n\n"
           "example:\n  ckpt fetch Qwen/Qwen2-0.5B@main\n"
           "  ckpt fetch Qwen/Qwen2-0.5B@main   # again after Ctrl-C: resumes where it stopped\n",
           HUB_DEFAULT_ENDPOINT);
}

int cmd_fetch(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        help();
        return CLI_OK;
    }
    static const int shared[] = {CLI_OPT_HOME, CLI_OPT_JSON, CLI_OPT_QUIET, CLI_OPT_SERVER, CLI_OPT_END};
    static const struct option own[] = {
        {"include", required_argument, 0, OPT_INCLUDE},
        {"exclude", required_argument, 0, OPT_EXCLUDE},
        {"connections", required_argument, 0, OPT_CONNECTIONS},
        {"chunk-size", required_argument, 0, OPT_CHUNK},
        {0, 0, 0, 0},
    };
    const char **inc = calloc((size_t)argc + 1, sizeof *inc),
               **exc = calloc((size_t)argc + 1, sizeof *exc);
    if (!inc || !exc) {
        free(inc);
        free(exc);
        return cli_fail();
    }
    hub_fetch_opts o = {.filter = {.include = inc, .exclude = exc}};
    cli_common common = {0};
    cli_parser p = {.cmd = "fetch", .shared = shared, .own = own, .common = &common};
    int ret = CLI_OK, c = 0;
    uint64_t v;
    while (!ret && (c = cli_getopt(&p, argc, argv)) > 0) {
        switch (c) {
        case OPT_INCLUDE:
            inc[o.filter.ninclude++] = optarg;
            break;
        case OPT_EXCLUDE:
            exc[o.filter.nexclude++] = optarg;
            break;
        case OPT_CONNECTIONS:
            if (ckpt_parse_u64(optarg, &v) < 0 || v < 1 || v > HUB_MAX_CONNECTIONS)
                ret = cli_usage_error("fetch", "--connections must be 1..%d", HUB_MAX_CONNECTIONS);
            else
                o.connections = (int)v;
            break;
        case OPT_CHUNK:
            if (ckpt_parse_size(optarg, &v) < 0 || v < HUB_MIN_CHUNK)
                ret = cli_usage_error("fetch", "--chunk-size must be a size of at least 64KiB");
            else
                o.chunk_size = v;
            break;
        }
    }
    if (c < 0) ret = CLI_USAGE;
    if (!ret)
        ret = cli_local_only("fetch", common.server, common.home,
                             "queue it on the daemon with `ckpt submit fetch ORG/NAME[@REV]`");
    if (!ret && p.nargs != 1) ret = cli_usage_error("fetch", "expected one ORG/NAME[@REV]");
    char *repo = NULL;
    if (!ret && !(repo = ckpt_strdup(p.args[0]))) ret = cli_fail();
    if (!ret) {
        char *at = strchr(repo, '@');
        if (at) *at++ = '\0';
        o.repo = repo;
        o.revision = at;
        if (store_repo_name_check(repo) < 0)
            ret = cli_usage_error("fetch", "%s", ckpt_error_last());
        else if (at && !*at)
            ret = cli_usage_error("fetch", "an empty revision after '@'");
    }
    o.quiet = common.quiet;
    ckpt_store s;
    if (!ret && store_open(&s, common.home) < 0)
        ret = cli_fail();
    else if (!ret) {
        hub_fetch_result r;
        if (hub_fetch(&s, &o, &r) < 0)
            ret = cli_fail();
        else {
            char *ref = store_ckpt_ref(&r.ckpt), a[32];
            if (common.json) {
                json_t *j = json_pack("{s:s,s:s,s:s,s:b,s:I,s:I,s:f}", "ref", ref ? ref : "",
                                      "repo", r.ckpt.repo, "commit", r.ckpt.commit, "existed",
                                      r.existed, "files", (json_int_t)r.files, "bytes",
                                      (json_int_t)r.bytes, "seconds", r.seconds);
                char *text = j ? cj_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
                if (text) puts(text);
                free(text);
                json_decref(j);
            } else {
                printf("%s\n", ref ? ref : "");
                if (!o.quiet && !r.existed)
                    ckpt_info("fetched %zu files, %s in %.1f s, commit %s", r.files,
                              ckpt_format_size(r.bytes, a, sizeof a), r.seconds, r.ckpt.commit);
            }
            free(ref);
            hub_fetch_result_free(&r);
        }
        store_close(&s);
    }
    free(repo);
    free(inc);
    free(exc);
    return ret;
}

/*
 * cmd_sync.c — `ckpt sync add|ls|rm|run`: schedules that follow a Hub repo
 * (service/jobs/schedule.h), in CKPT_HOME's database or on a daemon
 * (--server, CKPT_SERVER: /v1/schedules). The daemon (`ckpt serve`) runs them;
 * run queues a sync job now.
 */
#include "service/cli/cli.h"
#include "service/cli/cli_opts.h"

#include "common/error.h"
#include "common/json.h"
#include "common/util.h"
#include "service/jobs/cron.h"
#include "service/cli/job_client.h"
#include "service/jobs/schedule.h"
#include "transform/presets.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char sync_help[] =
    "usage: ckpt sync add ORG/NAME[@REV] (--every DURATION | --cron \"M H DOM MON DOW\")\n"
    "                     [--layout L [--tp N]]... [--include GLOB]... [--exclude GLOB]...\n"
    "       ckpt sync ls [--json]\n"
    "       ckpt sync rm ID\n"
    "       ckpt sync run ID\n"
    "       (each takes --home DIR, or --server URL / CKPT_SERVER for a daemon's schedules:\n"
    "        /v1/schedules, an admin token to add, remove or run)\n\n"
    "Follows a repo on a Hugging Face Hub (HF_ENDPOINT): the daemon (`ckpt serve`)\n"
    "runs a sync job when a schedule is due; it resolves REV (default main) and, when\n"
    "the commit changed since the last run, queues a fetch of that commit and one\n"
    "convert per --layout (each --tp applies to the --layout before it). An unchanged\n"
    "commit queues nothing. A schedule never has two sync jobs at once, and after the\n"
    "daemon was down it runs once, not once per missed period.\n\n"
    "  --every DURATION   90s, 30m, 6h, 1d, 2w; the first run is at once\n"
    "  --cron EXPR        five fields in UTC, e.g. \"0 3 * * *\" (03:00 UTC daily),\n"
    "                     \"*/15 * * * mon-fri\"; or @hourly, @daily, @weekly, @monthly\n"
    "  --include/--exclude  the fetch's file patterns (see ckpt fetch --help)\n\n"
    "add prints the schedule's id; ls shows each schedule's next run, the last commit\n"
    "it saw and what it did; rm removes one (queued jobs stay); run queues its sync\n"
    "job now and prints the job id.\n\n"
    "example:\n  ckpt sync add Qwen/Qwen2-0.5B --every 6h --layout neuron --tp 8 --layout fused\n";

static int open_store(const char *home, ckpt_store *s)
{
    return store_open(s, home) < 0 ? cli_fail() : CLI_OK;
}

enum { O_EVERY = CLI_OPT_OWN, O_CRON, O_INCLUDE, O_EXCLUDE };
static const int sync_shared[] = {CLI_OPT_HOME, CLI_OPT_JSON, CLI_OPT_SERVER, CLI_OPT_LAYOUT, CLI_OPT_TP, CLI_OPT_END};
static const struct option sync_own[] = {{"every", required_argument, NULL, O_EVERY},
                                         {"cron", required_argument, NULL, O_CRON},
                                         {"include", required_argument, NULL, O_INCLUDE},
                                         {"exclude", required_argument, NULL, O_EXCLUDE},
                                         {0}};

/* One option of `sync add` into sc, in the order given (--tp applies to the --layout before it). */
static int sync_add_option(schedule *sc, int c, const char *v)
{
    switch (c) {
    case O_EVERY:
        if (sc->every_seconds || sc->cron) return cli_usage_error("sync add", "give one --every or one --cron");
        if (schedule_parse_every(v, &sc->every_seconds) < 0)
            return cli_usage_error("sync add", "%s", ckpt_error_last());
        return CLI_OK;
    case O_CRON: {
        cron_spec cs;
        if (sc->every_seconds || sc->cron) return cli_usage_error("sync add", "give one --every or one --cron");
        if (cron_parse(v, &cs) < 0) return cli_usage_error("sync add", "%s", ckpt_error_last());
        return (sc->cron = ckpt_strdup(v)) ? CLI_OK : cli_fail();
    }
    case CLI_OPT_LAYOUT: {
        preset_opts po = {.preset = v, .tp = 1};
        if (preset_check(&po) < 0) return cli_usage_error("sync add", "%s", ckpt_error_last());
        return json_array_append_new(sc->layouts, json_pack("{s:s}", "layout", v)) ? cli_fail() : CLI_OK;
    }
    case CLI_OPT_TP: {
        uint64_t tp;
        json_t *last = json_array_get(sc->layouts, json_array_size(sc->layouts) - 1);
        if (!last) return cli_usage_error("sync add", "--tp applies to the --layout before it; give --layout first");
        if (cli_parse_number("sync add", "--tp", v, 1, 1024, &tp)) return CLI_USAGE;
        return json_object_set_new(last, "tp", json_integer((json_int_t)tp)) ? cli_fail() : CLI_OK;
    }
    default: { /* O_INCLUDE, O_EXCLUDE */
        const char *key = c == O_INCLUDE ? "include" : "exclude";
        json_t *list = json_object_get(sc->fetch_args, key);
        if (!list) json_object_set_new(sc->fetch_args, key, list = json_array());
        return list && !json_array_append_new(list, json_string(v)) ? CLI_OK : cli_fail();
    }
    }
}

/* Prints the added schedule: its id, or its JSON. */
static int print_added(json_t *j, int64_t id, bool json)
{
    if (json) return cli_print_json(j);
    json_decref(j);
    printf("%lld\n", (long long)id);
    return CLI_OK;
}

static int sync_add(schedule *sc, const char *target, const char *home, const char *server, bool json)
{
    int ret = CLI_OK;
    if (!target) ret = cli_usage_error("sync add", "expected ORG/NAME[@REV]");
    if (!ret && !sc->every_seconds && !sc->cron)
        ret = cli_usage_error("sync add", "give --every DURATION or --cron EXPR");
    if (!ret) {
        const char *at = strchr(target, '@');
        sc->repo = at ? ckpt_strndup(target, (size_t)(at - target)) : ckpt_strdup(target);
        sc->revision = ckpt_strdup(at && at[1] ? at + 1 : "main");
        if (!sc->repo || !sc->revision)
            ret = cli_fail();
        else if (store_repo_name_check(sc->repo) < 0)
            ret = cli_usage_error("sync add", "%s", ckpt_error_last());
    }
    ckpt_store s;
    job_client jc;
    if (!ret && cli_server(server, home)) {
        /* POST /v1/schedules: the fields schedule_from_json reads */
        json_t *body = json_pack("{s:s,s:s,s:O,s:O}", "repo", sc->repo, "revision", sc->revision, "layouts",
                                 sc->layouts, "fetch", sc->fetch_args), *got = NULL;
        if (body)
            json_object_set_new(body, sc->cron ? "cron" : "every_seconds",
                                sc->cron ? json_string(sc->cron) : json_integer(sc->every_seconds));
        if (!body || job_client_open(&jc, home, server) < 0) ret = cli_fail();
        else {
            ret = job_client_call(&jc, "POST", "/v1/schedules", body, &got, NULL) < 0
                      ? cli_fail()
                      : print_added(got, json_integer_value(json_object_get(got, "id")), json);
            job_client_close(&jc);
        }
        json_decref(body);
    } else if (!ret && !(ret = open_store(home, &s))) {
        ret = schedule_add(&s.cat, sc) < 0 ? cli_fail() : print_added(schedule_json(sc), sc->id, json);
        store_close(&s);
    }
    schedule_free(sc);
    return ret;
}

static void utc(double t, char *buf, size_t len)
{
    if (t <= 0) {
        snprintf(buf, len, "-");
        return;
    }
    time_t tt = (time_t)t;
    struct tm tm;
    gmtime_r(&tt, &tm);
    strftime(buf, len, "%Y-%m-%d %H:%M:%SZ", &tm);
}

static int sync_ls(const char *home, const char *server, bool json)
{
    json_t *list = NULL;
    if (cli_server(server, home)) {
        job_client jc;
        json_t *got = NULL;
        if (job_client_open(&jc, home, server) < 0) return cli_fail();
        if (job_client_call(&jc, "GET", "/v1/schedules", NULL, &got, NULL) == 0)
            list = json_incref(json_object_get(got, "schedules"));
        json_decref(got);
        job_client_close(&jc);
        if (!json_is_array(list)) return json_decref(list), cli_fail();
    } else {
        ckpt_store s;
        int ret = open_store(home, &s);
        if (ret) return ret;
        schedule *v;
        size_t n;
        if (schedule_list(&s.cat, &v, &n) < 0) {
            store_close(&s);
            return cli_fail();
        }
        list = json_array();
        for (size_t i = 0; i < n; i++) json_array_append_new(list, schedule_json(&v[i]));
        schedules_free(v, n);
        store_close(&s);
    }
    if (json) return cli_print_json(list);
    if (json_array_size(list))
        printf("%-4s %-40s %-16s %-21s %-12s %s\n", "ID", "REPO@REV", "SCHEDULE", "NEXT RUN (UTC)", "LAST COMMIT",
               "LAST OUTCOME");
    size_t i;
    json_t *sc;
    json_array_foreach(list, i, sc)
    {
        char target[300], when[64], next[32], layouts[256] = "";
        const char *cron = json_string_value(json_object_get(sc, "cron")),
                   *commit = json_string_value(json_object_get(sc, "last_commit")),
                   *outcome = json_string_value(json_object_get(sc, "last_outcome"));
        snprintf(target, sizeof target, "%s@%s", json_string_value(json_object_get(sc, "repo")),
                 json_string_value(json_object_get(sc, "revision")));
        if (cron)
            snprintf(when, sizeof when, "cron %s", cron);
        else {
            static const struct {
                int64_t secs;
                char unit;
            } units[] = {{604800, 'w'}, {86400, 'd'}, {3600, 'h'}, {60, 'm'}};
            int64_t e = json_integer_value(json_object_get(sc, "every_seconds"));
            char unit = 's';
            for (size_t u = 0; u < sizeof units / sizeof units[0] && unit == 's' && e; u++)
                if (e % units[u].secs == 0) {
                    e /= units[u].secs;
                    unit = units[u].unit;
                }
            snprintf(when, sizeof when, "every %lld%c", (long long)e, unit);
        }
        utc(json_number_value(json_object_get(sc, "next_run_at")), next, sizeof next);
        if (json_is_true(json_object_get(sc, "paused"))) snprintf(next, sizeof next, "paused"); /* the dashboard's Pause */
        size_t k;
        json_t *l;
        json_array_foreach(json_object_get(sc, "layouts"), k, l)
        {
            size_t o = strlen(layouts);
            json_int_t tp = json_integer_value(json_object_get(l, "tp"));
            snprintf(layouts + o, sizeof layouts - o, tp > 1 ? " %s tp%lld" : " %s",
                     json_string_value(json_object_get(l, "layout")), (long long)tp);
        }
        printf("%-4lld %-40s %-16s %-21s %-12.12s %s\n", (long long)json_integer_value(json_object_get(sc, "id")),
               target, when, next, commit ? commit : "-", outcome ? outcome : "-");
        if (*layouts) printf("     layouts:%s\n", layouts);
    }
    json_decref(list);
    return CLI_OK;
}

static int parse_id(const char *cmd, int n, char **rest, int64_t *id)
{
    uint64_t v;
    if (n != 1 || ckpt_parse_u64(rest[0], &v) < 0 || v == 0 || v > INT64_MAX)
        return cli_usage_error(cmd, "expected a schedule ID");
    *id = (int64_t)v;
    return CLI_OK;
}

int cmd_sync(int argc, char **argv)
{
    if (argc < 2 || cli_wants_help(argc, argv)) {
        fputs(sync_help, argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_USAGE : CLI_OK;
    }
    const char *sub = argv[1];
    bool add = !strcmp(sub, "add");
    char what[32];
    snprintf(what, sizeof what, "sync %.16s", sub);
    /* --home, --server and --json for every subcommand; add takes the schedule's own options. */
    static const int others[] = {CLI_OPT_HOME, CLI_OPT_JSON, CLI_OPT_SERVER, CLI_OPT_END};
    cli_common common = {0};
    cli_parser p = {.cmd = what, .shared = sync_shared, .own = sync_own, .allowed = add ? NULL : others,
                    .say_needs_value = true, .common = &common};
    schedule sc;
    memset(&sc, 0, sizeof sc);
    sc.layouts = json_array();
    sc.fetch_args = json_object();
    int c, ret = sc.layouts && sc.fetch_args ? CLI_OK : cli_fail();
    while (!ret && (c = cli_getopt(&p, argc - 1, argv + 1)) > 0) ret = sync_add_option(&sc, c, optarg);
    if (!ret && c < 0) ret = CLI_USAGE;
    const char *home = common.home, *server = common.server;
    bool json = common.json;
    int n = p.nargs;
    char **rest = p.args;
    if (ret) {
        schedule_free(&sc);
        return ret;
    }
    int64_t id = 0;
    if (add) {
        ret = n > 1 ? cli_usage_error("sync add", "expected one ORG/NAME[@REV]") : sync_add(&sc, n ? rest[0] : NULL, home, server, json);
    } else if (!strcmp(sub, "ls")) {
        ret = n ? cli_usage_error("sync ls", "takes no arguments") : sync_ls(home, server, json);
    } else if (!strcmp(sub, "rm")) {
        ckpt_store s;
        job_client jc;
        if ((ret = parse_id("sync rm", n, rest, &id))) {
        } else if (cli_server(server, home)) {
            char path[64];
            json_t *got = NULL;
            snprintf(path, sizeof path, "/v1/schedules/%lld", (long long)id);
            if (job_client_open(&jc, home, server) < 0) ret = cli_fail();
            else {
                if (job_client_call(&jc, "DELETE", path, NULL, &got, NULL) < 0) ret = cli_fail();
                json_decref(got);
                job_client_close(&jc);
            }
        } else if (!(ret = open_store(home, &s))) {
            if (schedule_remove(&s.cat, id) < 0) ret = cli_fail();
            store_close(&s);
        }
    } else if (!strcmp(sub, "run")) {
        /* The same on both sides: the sync job queued and recorded as the
         * schedule's last job (schedule_run_now); a missing schedule is an
         * error now rather than a job that finds nothing. */
        job_client jc;
        ckpt_store s;
        bool remote = cli_server(server, home) != NULL;
        int64_t job_id = 0;
        bool existed = false;
        if (!(ret = parse_id("sync run", n, rest, &id)) && !remote && !(ret = open_store(home, &s))) {
            if (schedule_run_now(&s.cat, id, &job_id, &existed) < 0) ret = cli_fail();
            store_close(&s);
        } else if (!ret) {
            json_t *job = NULL;
            char path[64];
            snprintf(path, sizeof path, "/v1/schedules/%lld/run", (long long)id);
            if (job_client_open(&jc, home, server) < 0) ret = cli_fail();
            else {
                if (job_client_call(&jc, "POST", path, NULL, &job, NULL) < 0) ret = cli_fail();
                job_id = json_integer_value(json_object_get(job, "id"));
                json_decref(job);
                job_client_close(&jc);
            }
        }
        if (!ret) printf("%lld\n", (long long)job_id);
    } else {
        ret = cli_usage_error("sync", "'%s' is not add, ls, rm or run", sub);
    }
    schedule_free(&sc);
    return ret;
}

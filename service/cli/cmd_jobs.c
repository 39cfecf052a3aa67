/*
 * cmd_jobs.c — the queue commands: `ckpt serve`, `ckpt worker` (internal),
 * `ckpt submit`, `ckpt jobs`, `ckpt show ID`, `ckpt logs`, `ckpt cancel`,
 * `ckpt retry`, `ckpt wait`. They work on CKPT_HOME directly, or on a daemon
 * with --server URL (or CKPT_SERVER; token in CKPT_TOKEN).
 */
#include "service/cli/cli.h"
#include "service/cli/cli_opts.h"

#include "common/error.h"
#include "common/fault.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "service/daemon/daemon.h"
#include "service/http/http_api.h"
#include "service/cli/job_client.h"
#include "service/jobs/jobs_run.h"
#include "service/jobs/queue.h"
#include "service/jobs/schedule.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/prctl.h>
#include <unistd.h>

#define EXIT_TRANSIENT 75 /* EX_TEMPFAIL: the worker's "try again" */

/* Options every job command shares; the rest stay in rest[]. */
typedef struct {
    const char *home, *server, *state, *listen, *token_file, *log_format, *log_level;
    int limit;             /* jobs: how many to list */
    double keep_jobs;      /* serve: seconds finished jobs are kept; < 0: the default */
    bool json, wait, follow;
    int priority, workers, max_attempts;
    int64_t after;
    double grace, timeout;
    int nrest;
    char **rest;
    char *allow[64]; /* --allow-path, as given (argv pointers) */
    size_t nallow;
    int per_ip, idle_timeout; /* serve: connections per client address, seconds a connection may idle */
} job_args;

enum {
    O_STATE = CLI_OPT_OWN, O_LISTEN, O_TOKEN_FILE, O_ALLOW_PATH, O_CONNS_PER_IP, O_IDLE_TIMEOUT, O_PRIORITY,
    O_AFTER, O_MAX_ATTEMPTS, O_WORKERS, O_GRACE, O_TIMEOUT, O_WAIT, O_FOLLOW, O_LIMIT, O_KEEP_JOBS, O_LOG_FORMAT,
    O_LOG_LEVEL,
    /* a job's own options, which `submit` hands to the job (jobs_args_from_argv) */
    O_REPO, O_INCLUDE, O_EXCLUDE, O_CONNECTIONS, O_CHUNK_SIZE, O_SLEEP_MS, O_UNTIL_FILE, O_SCALE
};
static const int jobs_shared[] = {CLI_OPT_HOME,   CLI_OPT_JSON,          CLI_OPT_SERVER, CLI_OPT_LAYOUT, CLI_OPT_TP,
                                  CLI_OPT_DTYPE, CLI_OPT_KV_MULTIPLIER, CLI_OPT_MAX_SHARD_SIZE, CLI_OPT_END};
static const struct option jobs_own[] = {
    {"state", required_argument, NULL, O_STATE},
    {"listen", required_argument, NULL, O_LISTEN},
    {"token-file", required_argument, NULL, O_TOKEN_FILE},
    {"allow-path", required_argument, NULL, O_ALLOW_PATH},
    {"conns-per-ip", required_argument, NULL, O_CONNS_PER_IP},
    {"idle-timeout", required_argument, NULL, O_IDLE_TIMEOUT},
    {"priority", required_argument, NULL, O_PRIORITY},
    {"after", required_argument, NULL, O_AFTER},
    {"max-attempts", required_argument, NULL, O_MAX_ATTEMPTS},
    {"workers", required_argument, NULL, O_WORKERS},
    {"grace", required_argument, NULL, O_GRACE},
    {"timeout", required_argument, NULL, O_TIMEOUT},
    {"wait", no_argument, NULL, O_WAIT},
    {"follow", no_argument, NULL, O_FOLLOW},
    {"limit", required_argument, NULL, O_LIMIT},
    {"keep-jobs", required_argument, NULL, O_KEEP_JOBS},
    {"log-format", required_argument, NULL, O_LOG_FORMAT},
    {"log-level", required_argument, NULL, O_LOG_LEVEL},
    {"repo", required_argument, NULL, O_REPO},
    {"include", required_argument, NULL, O_INCLUDE},
    {"exclude", required_argument, NULL, O_EXCLUDE},
    {"connections", required_argument, NULL, O_CONNECTIONS},
    {"chunk-size", required_argument, NULL, O_CHUNK_SIZE},
    {"sleep-ms", required_argument, NULL, O_SLEEP_MS},
    {"until-file", required_argument, NULL, O_UNTIL_FILE},
    {"scale", required_argument, NULL, O_SCALE},
    {0}};

/* A job's option as jobs_args_from_argv reads it ("--layout"), or NULL for
 * the options of the commands themselves. */
static const char *job_word(int c)
{
    switch (c) {
    case CLI_OPT_LAYOUT: return "--layout";
    case CLI_OPT_TP: return "--tp";
    case CLI_OPT_DTYPE: return "--dtype";
    case CLI_OPT_KV_MULTIPLIER: return "--kv-size-multiplier";
    case CLI_OPT_MAX_SHARD_SIZE: return "--max-shard-size";
    case O_REPO: return "--repo";
    case O_INCLUDE: return "--include";
    case O_EXCLUDE: return "--exclude";
    case O_CONNECTIONS: return "--connections";
    case O_CHUNK_SIZE: return "--chunk-size";
    case O_SLEEP_MS: return "--sleep-ms";
    case O_UNTIL_FILE: return "--until-file";
    case O_SCALE: return "--scale";
    }
    return NULL;
}

/* One option of the job commands into *a; CLI_OK or CLI_USAGE (printed). */
static int take_option(const char *cmd, job_args *a, int c, const char *v)
{
    uint64_t n;
    int64_t i;
    switch (c) {
    case O_STATE: a->state = v; break;
    case O_LISTEN: a->listen = v; break;
    case O_TOKEN_FILE: a->token_file = v; break;
    case O_WAIT: a->wait = true; break;
    case O_FOLLOW: a->follow = true; break;
    case O_ALLOW_PATH:
        if (a->nallow == CKPT_ARRAY_LEN(a->allow)) return cli_usage_error(cmd, "more than 64 --allow-path folders");
        a->allow[a->nallow++] = (char *)v;
        break;
    case O_LIMIT:
        if (cli_parse_number(cmd, "--limit", v, 1, 100000, &n)) return CLI_USAGE;
        a->limit = (int)n;
        break;
    case O_KEEP_JOBS: {
        int64_t secs;
        /* 0s keeps nothing once finished; else a duration as sync --every takes it */
        if (!strcmp(v, "0") || !strcmp(v, "0s")) secs = 0;
        else if (schedule_parse_every(v, &secs) < 0)
            return cli_usage_error(cmd, "--keep-jobs takes a duration up to 366d: 0s, 90s, 30m, 12h, 30d, 2w; not '%s'",
                                   v);
        a->keep_jobs = (double)secs;
        break;
    }
    case O_LOG_FORMAT:
        if (strcmp(v, "text") && strcmp(v, "json")) return cli_usage_error(cmd, "--log-format is text or json");
        a->log_format = v;
        break;
    case O_LOG_LEVEL:
        if (ckpt_event_level_parse(v) < 0) return cli_usage_error(cmd, "--log-level is error, warn, info or debug");
        a->log_level = v;
        break;
    case O_CONNS_PER_IP:
        if (cli_parse_number(cmd, "--conns-per-ip", v, 1, 1024, &n)) return CLI_USAGE;
        a->per_ip = (int)n;
        break;
    case O_IDLE_TIMEOUT:
        if (cli_parse_number(cmd, "--idle-timeout", v, 1, 3600, &n)) return CLI_USAGE;
        a->idle_timeout = (int)n;
        break;
    case O_PRIORITY:
        if (ckpt_parse_i64_field("--priority", v, -1000000, 1000000, &i) < 0)
            return cli_usage_error(cmd, "%s", ckpt_error_last());
        a->priority = (int)i;
        break;
    case O_AFTER:
        if (ckpt_parse_u64(v, &n) < 0 || n == 0 || n > INT64_MAX) return cli_usage_error(cmd, "--after takes a job ID");
        a->after = (int64_t)n;
        break;
    case O_MAX_ATTEMPTS:
        if (cli_parse_number(cmd, "--max-attempts", v, 1, 1000, &n)) return CLI_USAGE;
        a->max_attempts = (int)n;
        break;
    case O_WORKERS:
        if (cli_parse_number(cmd, "--workers", v, 1, 256, &n)) return CLI_USAGE;
        a->workers = (int)n;
        break;
    case O_GRACE:
        if (ckpt_parse_double("--grace", v, 0, 86400, &a->grace) < 0) return cli_usage_error(cmd, "%s", ckpt_error_last());
        break;
    case O_TIMEOUT:
        if (ckpt_parse_double("--timeout", v, 0, 31536000, &a->timeout) < 0)
            return cli_usage_error(cmd, "%s", ckpt_error_last());
        break;
    }
    return CLI_OK;
}

/* The options of the job commands (cli_getopt); the positional words, and
 * for `submit` (job_opts) the job's own options as "--name value" after
 * them, are left in a->rest for the command. */
static int take_options(const char *cmd, int argc, char **argv, job_args *a, bool job_opts)
{
    memset(a, 0, sizeof *a);
    a->workers = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (a->workers < 1) a->workers = 1;
    a->grace = 30;
    a->keep_jobs = -1;
    a->limit = 0; /* jobs: 50 as text, 1000 as JSON */
    a->rest = calloc((size_t)argc * 2 + 1, sizeof *a->rest);
    if (!a->rest) return cli_fail();
    char **opts = calloc((size_t)argc * 2 + 1, sizeof *opts);
    if (!opts) {
        free(a->rest);
        a->rest = NULL;
        return cli_fail();
    }
    size_t nopts = 0;
    cli_common common = {0};
    cli_parser p = {.cmd = cmd, .shared = jobs_shared, .own = jobs_own, .dash_f = O_FOLLOW, .say_needs_value = true,
                    .common = &common};
    int c, ret = CLI_OK;
    while (!ret && (c = cli_getopt(&p, argc, argv)) > 0) {
        const char *word = job_word(c);
        if (!word) ret = take_option(cmd, a, c, optarg);
        else if (!job_opts) ret = cli_usage_error(cmd, "unknown option '%s'", word);
        else {
            opts[nopts++] = (char *)word;
            opts[nopts++] = optarg;
        }
    }
    if (!ret && c < 0) ret = CLI_USAGE;
    a->home = common.home;
    a->server = common.server;
    a->json = common.json;
    for (int k = 0; !ret && k < p.nargs; k++) a->rest[a->nrest++] = p.args[k];
    for (size_t k = 0; !ret && k < nopts; k++) a->rest[a->nrest++] = opts[k];
    free(opts);
    if (ret) {
        free(a->rest);
        a->rest = NULL;
    }
    return ret;
}

static int open_client(job_client *c, const job_args *a)
{
    return job_client_open(c, a->home, a->server) < 0 ? cli_fail() : CLI_OK;
}

static int parse_id(const char *cmd, const job_args *a, int64_t *id)
{
    uint64_t v;
    if (a->nrest != 1 || ckpt_parse_u64(a->rest[0], &v) < 0 || v == 0) return cli_usage_error(cmd, "expected a job ID");
    *id = (int64_t)v;
    return CLI_OK;
}

/* What show, cancel, retry, wait and logs begin with: the options, one job ID,
 * then the client. a->rest is freed; the other options stay readable. */
static int begin_job_command(const char *cmd, int argc, char **argv, job_args *a, int64_t *id,
                             job_client *c)
{
    int u = take_options(cmd, argc, argv, a, false);
    if (!u) u = parse_id(cmd, a, id);
    if (!u) u = open_client(c, a);
    free(a->rest);
    a->rest = NULL;
    return u;
}

static const char *jstr(const json_t *j, const char *k)
{
    const char *s = json_string_value(json_object_get(j, k));
    return s ? s : "";
}

/* "2026-11-24 13:53:07" (UTC), or "-" for 0. */
static const char *when_text(double t, char *buf, size_t len)
{
    if (t <= 0) return "-";
    time_t tt = (time_t)t;
    struct tm tm;
    gmtime_r(&tt, &tm);
    strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm);
    return buf;
}

/* "850ms", "12.3s", "4m05s", "2h10m"; "-" when a < 0. */
static const char *duration_text(double secs, char *buf, size_t len)
{
    if (secs < 0) return "-";
    if (secs < 1) snprintf(buf, len, "%.0fms", secs * 1000);
    else if (secs < 60) snprintf(buf, len, "%.1fs", secs);
    else if (secs < 3600) snprintf(buf, len, "%dm%02ds", (int)secs / 60, (int)secs % 60);
    else snprintf(buf, len, "%dh%02dm", (int)(secs / 3600), (int)secs % 3600 / 60);
    return buf;
}

static double jnum(const json_t *j, const char *k)
{
    return json_number_value(json_object_get(j, k));
}

static void print_jobs_header(void)
{
    printf("%6s  %-9s %-12s %4s  %11s  %-19s  %-19s  %-19s  %8s  %8s  %s\n", "ID", "STATE", "KIND", "DONE", "TENSORS",
           "CREATED (UTC)", "STARTED (UTC)", "FINISHED (UTC)", "WAITED", "RAN", "ARGS / ERROR");
}

/* "12/340" from a job's progress: its tensors done of total; "" when its
 * phase does not count tensors. */
static const char *tensors_text(const json_t *progress, char *buf, size_t len)
{
    long long n = json_integer_value(json_object_get(progress, "tensors_done")),
              of = json_integer_value(json_object_get(progress, "tensors_total"));
    if (of > 0) snprintf(buf, len, "%lld/%lld", n, of);
    else if (len) *buf = 0;
    return buf;
}

/* One row of `ckpt jobs`: times in UTC; WAITED from created to started (or
 * now, while queued), RAN from started to finished (or now, while running). */
static void print_job_line(const json_t *j, double now)
{
    json_t *p = json_object_get(j, "progress");
    long long done = json_integer_value(json_object_get(p, "done")), total = json_integer_value(json_object_get(p, "total"));
    char pct[16] = "", tensors[48], created[32], started[32], finished[32], waited[32], ran[32];
    if (total > 0) snprintf(pct, sizeof pct, "%3lld%%", done * 100 / total);
    double c = jnum(j, "created_at"), st = jnum(j, "started_at"), f = jnum(j, "finished_at");
    const char *state = jstr(j, "state");
    double w = st > 0 ? st - c : !strcmp(state, "queued") ? now - c : -1;
    double r = st > 0 ? (f > 0 ? f - st : !strcmp(state, "running") ? now - st : -1) : -1;
    char *args = json_dumps(json_object_get(j, "args"), JSON_COMPACT | JSON_SORT_KEYS);
    const char *err = jstr(j, "error");
    printf("%6lld  %-9s %-12s %4s  %11s  %-19s  %-19s  %-19s  %8s  %8s  %.60s%s%s\n",
           (long long)json_integer_value(json_object_get(j, "id")), state, jstr(j, "kind"), pct,
           tensors_text(p, tensors, sizeof tensors), when_text(c, created, sizeof created),
           when_text(st, started, sizeof started), when_text(f, finished, sizeof finished),
           duration_text(w, waited, sizeof waited), duration_text(r, ran, sizeof ran), args ? args : "",
           *err ? "  error: " : "", err);
    free(args);
}

/* ---- serve, worker ---- */

int cmd_serve(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf("usage: ckpt serve [--listen 127.0.0.1:8470] [--workers N] [--token-file F] [--grace S]\n"
               "                  [--allow-path DIR]... [--conns-per-ip N] [--idle-timeout S] [--keep-jobs D]\n"
               "                  [--log-format text|json] [--log-level error|warn|info|debug] [--home DIR]\n\n"
               "Runs the daemon: claims queued jobs (in priority order, up to N worker processes,\n"
               "default the number of cores), runs each in `ckpt worker`, renews leases, retries\n"
               "transient failures with backoff, and serves the HTTP API (jobs, /healthz,\n"
               "/metrics). Without --token-file it listens on loopback only. SIGTERM/SIGINT stop\n"
               "claiming, let running jobs finish for --grace seconds (default 30), then put\n"
               "the rest back in the queue. A daemon killed outright loses nothing: its jobs'\n"
               "leases expire and the next daemon runs them again. With CKPT_DB=postgresql://...\n"
               "several daemons, on one host or many, share one queue; one frozen inside a\n"
               "transaction is cut off by the server after CKPT_PG_IDLE_TX_TIMEOUT_S seconds\n"
               "(default 60).\n\n"
               "  --allow-path DIR    jobs submitted over HTTP may name host paths (import DIR,\n"
               "                      consolidate SRC DST, a merge-lora adapter folder) only\n"
               "                      beneath DIR (repeatable; symlinks resolved, checked again\n"
               "                      when the job runs). Without it such jobs get 403; jobs\n"
               "                      queued with `ckpt submit` on this CKPT_HOME are not limited.\n"
               "  --conns-per-ip N    connections one client address may hold (default %d)\n"
               "  --idle-timeout S    a connection silent for S seconds is closed, headers\n"
               "                      included (default %d)\n"
               "  --keep-jobs D       finished jobs and their logs are forgotten D after they\n"
               "                      ended: 90s, 12h, 30d (default 30d; 0s: at once)\n"
               "  --log-format F      text (default) or json: one line per job start, finish,\n"
               "                      failure and retry, schedule firing and HTTP request, on\n"
               "                      stderr (tokens never appear)\n"
               "  --log-level L       error, warn, info (default) or debug\n\n"
               "example:\n"
               "  ckpt serve --listen 0.0.0.0:8470 --token-file ~/.ckpt-tokens --allow-path /data/models\n",
               HTTP_PER_IP_DEFAULT, HTTP_IDLE_TIMEOUT_DEFAULT);
        return CLI_OK;
    }
    job_args a;
    int u = take_options("serve", argc, argv, &a, false);
    if (u) return u;
    char **roots = NULL;
    if (jobs_allow_roots(a.allow, a.nallow, &roots) < 0) {
        free(a.rest);
        return cli_usage_error("serve", "%s", ckpt_error_last());
    }
    daemon_opts o = {.home = a.home, .listen = a.listen ? a.listen : "127.0.0.1:8470", .token_file = a.token_file,
                     .workers = a.workers, .grace_seconds = a.grace, .timeout_seconds = a.timeout,
                     .allow_roots = roots, .per_ip = a.per_ip, .idle_timeout = a.idle_timeout,
                     .keep_jobs = a.keep_jobs >= 0 ? a.keep_jobs : DAEMON_KEEP_JOBS_DEFAULT};
    ckpt_event_setup(a.log_format && !strcmp(a.log_format, "json"),
                     a.log_level ? (ckpt_event_level)ckpt_event_level_parse(a.log_level) : CKPT_EV_INFO);
    free(a.rest);
    int rc = daemon_run(&o);
    jobs_allow_roots_free(roots);
    return rc < 0 ? cli_fail() : CLI_OK;
}

/* The progress line the daemon reads (jobs_progress_format, jobs_run.h). */
static void worker_progress(const ckpt_progress *p, double rate, double eta)
{
    char line[512];
    jobs_progress_format(line, sizeof line,
                         &(queue_progress_info){(int64_t)p->done, (int64_t)p->total, (int64_t)p->tensors,
                                                (int64_t)p->tensors_total, p->label, rate, eta});
    printf("%s\n", line);
    fflush(stdout);
}

int cmd_worker(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf("usage: ckpt worker --job ID [--home DIR] [--allow-path DIR]... [--daemon-pid PID]\n\n"
               "Internal: runs one claimed job; started by `ckpt serve`. Progress and the\n"
               "outcome go to standard output as '@ckpt' lines; anything else is the job's log.\n"
               "With --daemon-pid the worker dies with that process, its parent (and exits\n"
               "at once with status 70 if its parent is already another).\n\n"
               "example (what the daemon runs for a claimed job 42):\n"
               "  ckpt worker --job 42 --home /var/lib/ckpt --daemon-pid 1234\n");
        return CLI_OK;
    }
    enum { O_JOB_ID = CLI_OPT_OWN, O_ALLOW, O_DAEMON_PID };
    static const int shared[] = {CLI_OPT_HOME, CLI_OPT_END};
    static const struct option own[] = {{"job", required_argument, NULL, O_JOB_ID},
                                        {"allow-path", required_argument, NULL, O_ALLOW},
                                        {"daemon-pid", required_argument, NULL, O_DAEMON_PID},
                                        {0}};
    cli_common common = {0};
    cli_parser p = {.cmd = "worker", .shared = shared, .own = own, .say_needs_value = true, .common = &common};
    int64_t id = 0;
    uint64_t daemon_pid = 0;
    char **allow = calloc((size_t)argc + 1, sizeof *allow);
    size_t nallow = 0;
    if (!allow) return cli_fail();
    int c;
    uint64_t v;
    while ((c = cli_getopt(&p, argc, argv)) > 0) {
        if (c == O_ALLOW) allow[nallow++] = optarg;
        else if (c == O_DAEMON_PID) {
            if (cli_parse_number("worker", "--daemon-pid", optarg, 1, INT32_MAX, &daemon_pid)) c = -1;
        } else if (cli_parse_number("worker", "--job", optarg, 1, INT64_MAX, &v)) c = -1;
        else id = (int64_t)v;
        if (c < 0) break;
    }
    const char *home = common.home;
    if (!c && p.nargs) c = cli_usage_error("worker", "takes no arguments");
    if (c < 0 || c == CLI_USAGE) {
        free(allow);
        return CLI_USAGE;
    }
    if (id <= 0) {
        free(allow);
        return cli_usage_error("worker", "--job ID is required");
    }
    /* Started by a daemon: die with it. It spawns us without running any
     * code of its own in the child, so this is ours to set; a daemon gone
     * before the prctl took effect has left us to init, whose pid is not
     * --daemon-pid. */
    if (daemon_pid) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != (pid_t)daemon_pid) {
            free(allow);
            return 70;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    ckpt_fault_arm(getenv("CKPT_FAULT_WORKER")); /* the daemon's CKPT_FAULT is not ours */
    ckpt_progress_set_sink(worker_progress);
    ckpt_store s;
    int rc = store_open(&s, home);
    queue_job j;
    if (!rc) rc = queue_get(&s.cat, id, &j);
    bool transient = false;
    json_t *result = NULL;
    if (!rc) {
        char **roots = NULL;
        if (strcmp(j.state, "running")) rc = ckpt_error_set(CKPT_EINVAL, "job %lld is %s, not running", (long long)id, j.state);
        /* A job from the HTTP API: its host paths are checked again now, so a
         * symlink swapped in since it was submitted cannot lead outside. */
        else if (jobs_from_remote(j.args) &&
                 ((rc = jobs_allow_roots(allow, nallow, &roots)) || (rc = jobs_paths_check(j.kind, j.args, roots))))
            ;
        else rc = jobs_run(&s, j.kind, j.args, &transient, &result);
        jobs_allow_roots_free(roots);
        queue_job_free(&j);
    }
    if (s.home) store_close(&s);
    free(allow);
    if (rc) {
        printf(JOBS_ERROR_PREFIX "%s %s\n", transient ? "transient" : "permanent", ckpt_error_last());
        return transient ? EXIT_TRANSIENT : CLI_FAIL;
    }
    char *r = result ? json_dumps(result, JSON_COMPACT) : NULL;
    fprintf(stderr, "done: %s\n", r ? r : "{}");
    printf(JOBS_RESULT_PREFIX "%s\n", r ? r : "{}");
    free(r);
    json_decref(result);
    return CLI_OK;
}

/* ---- waiting ---- */

static bool job_done(const json_t *j)
{
    const char *s = jstr(j, "state");
    return !strcmp(s, "succeeded") || !strcmp(s, "failed") || !strcmp(s, "cancelled");
}

/* Follows a job until it ends, with a progress bar on a TTY; exit status follows the job. */
static int wait_job(job_client *c, int64_t id, bool json)
{
    bool tty = isatty(STDERR_FILENO);
    double last_line = 0;
    for (;;) {
        json_t *j;
        if (job_client_get(c, id, &j) < 0) return cli_fail();
        json_t *p = json_object_get(j, "progress");
        long long done = json_integer_value(json_object_get(p, "done")), total = json_integer_value(json_object_get(p, "total"));
        const char *phase = json_string_value(json_object_get(p, "phase"));
        double now = ckpt_now();
        if (!json && (tty || now - last_line >= 5.0)) {
            last_line = now;
            char d[32], t[32], n[48];
            if (total > 0)
                fprintf(stderr, tty ? "\rjob %lld %-9s %-10s %5.1f%% %s/%s%s%s   " : "job %lld %s %s %.1f%% %s/%s%s%s\n",
                        (long long)id, jstr(j, "state"), phase ? phase : "", 100.0 * (double)done / (double)total,
                        ckpt_format_size((uint64_t)done, d, sizeof d), ckpt_format_size((uint64_t)total, t, sizeof t),
                        *tensors_text(p, n, sizeof n) ? " tensors " : "", n);
            else fprintf(stderr, tty ? "\rjob %lld %-9s   " : "job %lld %s\n", (long long)id, jstr(j, "state"));
        }
        if (job_done(j)) {
            if (!json && tty) fputc('\n', stderr);
            bool ok = !strcmp(jstr(j, "state"), "succeeded");
            if (json) cli_print_json(json_incref(j));
            else if (!ok) fprintf(stderr, "ckpt: job %lld %s: %s\n", (long long)id, jstr(j, "state"), jstr(j, "error"));
            json_decref(j);
            return ok ? CLI_OK : CLI_FAIL;
        }
        json_decref(j);
        struct timespec ts = {0, 200 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* ---- submit and the queue ---- */

/* `ckpt submit ORG/NAME[@REV] --layout L ...`: a fetch, then a convert after
 * it; prints the convert's id (the one to wait for). */
static int submit_hub(job_args *a)
{
    json_t *fetch, *convert, *fjob = NULL, *cjob = NULL;
    if (jobs_args_hub_pair(a->nrest, a->rest, &fetch, &convert) < 0) {
        json_decref(fetch);
        json_decref(convert);
        fprintf(stderr, "ckpt: %s\nsee 'ckpt submit --help'\n", ckpt_error_last());
        return CLI_USAGE;
    }
    job_client c;
    bool existed = false;
    int rc = open_client(&c, a);
    queue_submit_opts fo = {.priority = a->priority, .depends_on = a->after, .max_attempts = a->max_attempts};
    if (!rc && job_client_submit(&c, "fetch", fetch, &fo, &fjob, &existed) < 0) rc = cli_fail();
    int64_t fid = json_integer_value(json_object_get(fjob, "id")), cid = 0;
    queue_submit_opts co = {.priority = a->priority, .depends_on = fid, .max_attempts = a->max_attempts};
    if (!rc && job_client_submit(&c, "convert", convert, &co, &cjob, &existed) < 0) rc = cli_fail();
    if (!rc) {
        cid = json_integer_value(json_object_get(cjob, "id"));
        if (a->json && !a->wait) cli_print_json(json_pack("{s:O,s:O}", "fetch", fjob, "convert", cjob));
        else if (!a->wait || !a->json) printf("%lld\n", (long long)cid);
        fflush(stdout);
        ckpt_info("fetch job %lld, then convert job %lld", (long long)fid, (long long)cid);
        if (a->wait) rc = wait_job(&c, cid, a->json);
    }
    json_decref(fetch);
    json_decref(convert);
    json_decref(fjob);
    json_decref(cjob);
    if (c.open || c.server) job_client_close(&c);
    return rc;
}

int cmd_submit(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf("usage: ckpt submit KIND ARGS... [--priority P] [--after ID] [--max-attempts N] [--wait] [--json]\n"
               "                   [--server URL] [--home DIR]\n\n"
               "       ckpt submit ORG/NAME[@REV] --layout L [--tp N] [convert and fetch options]\n\n"
               "Queues a job and prints its id alone on stdout (--json: the job). The same\n"
               "arguments as the direct command:\n"
               "  ckpt submit import DIR --repo ORG/NAME[@REV]\n"
               "  ckpt submit convert REF --layout L [--tp N] [--dtype D] [--kv-size-multiplier M]\n"
               "  ckpt submit merge-lora REF ADAPTER [--scale S]   (and unmerge-lora; ADAPTER: a folder\n"
               "                  or a stored ref; makes ORG/NAME-lora-<id>@REV, see docs/lora.md)\n"
               "  ckpt submit consolidate SRC DST\n"
               "  ckpt submit verify [REF]\n"
               "  ckpt submit gc\n"
               "  ckpt submit fetch ORG/NAME[@REV] [--include GLOB]... [--exclude GLOB]...\n"
               "  ckpt submit sync SCHEDULE_ID\n"
               "  ckpt submit noop [--sleep-ms N] [--until-file PATH]   (a job that does nothing: for\n"
               "                  testing a daemon; PATH, inside the store's home, ends it when it exists)\n"
               "The short form ORG/NAME[@REV] --layout L queues a fetch from the Hub (HF_ENDPOINT)\n"
               "and a convert of ORG/NAME@REV that runs after it, and prints the convert's id.\n"
               "Submitting the same job while it is queued or running returns the existing id.\n"
               "Lower --priority runs first (default 0). --after ID waits for job ID to succeed\n"
               "(and fails, saying so, if it fails). --max-attempts N: how many times a job that\n"
               "fails for a passing reason (or whose worker or daemon died) runs before it fails for\n"
               "good (default 3). --wait follows the job to its end\n"
               "with progress, and exits as the job ended. Layout names, --tp, --dtype and refs\n"
               "are checked now (exit 2), not when the job runs. With --server, jobs naming host\n"
               "paths need the daemon's --allow-path (see ckpt serve --help).\n\n"
               "examples:\n"
               "  ckpt submit Qwen/Qwen2-0.5B --layout neuron --tp 8 --wait\n"
               "  ckpt submit convert Qwen/Qwen2-0.5B@main --layout fused --priority -1\n");
        return CLI_OK;
    }
    job_args a;
    int u = take_options("submit", argc, argv, &a, true);
    if (u) return u;
    if (a.nrest < 1) {
        free(a.rest);
        return cli_usage_error("submit", "expected a job kind (import, convert, merge-lora, unmerge-lora, consolidate, "
                                         "verify, gc)");
    }
    const char *kind = a.rest[0];
    if (strchr(kind, '/')) { /* ORG/NAME[@REV] --layout L */
        int r = submit_hub(&a);
        free(a.rest);
        return r;
    }
    json_t *args = NULL;
    if (jobs_args_from_argv(kind, a.nrest, a.rest, &args) < 0) {
        json_decref(args);
        free(a.rest);
        fprintf(stderr, "ckpt: %s\nsee 'ckpt submit --help'\n", ckpt_error_last());
        return CLI_USAGE;
    }
    job_client c;
    int rc = open_client(&c, &a);
    json_t *job = NULL;
    bool existed = false;
    queue_submit_opts o = {.priority = a.priority, .depends_on = a.after, .max_attempts = a.max_attempts};
    if (!rc && job_client_submit(&c, kind, args, &o, &job, &existed) < 0) rc = cli_fail();
    json_decref(args);
    if (!rc) {
        int64_t id = json_integer_value(json_object_get(job, "id"));
        if (a.json && !a.wait) cli_print_json(json_incref(job));
        else if (!a.wait || !a.json) printf("%lld\n", (long long)id);
        fflush(stdout);
        if (existed) ckpt_info("an identical job is queued or running already: %lld", (long long)id);
        if (a.wait) rc = wait_job(&c, id, a.json);
    }
    json_decref(job);
    if (c.open || c.server) job_client_close(&c);
    free(a.rest);
    return rc;
}

int cmd_jobs(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf("usage: ckpt jobs [--state queued|running|succeeded|failed|cancelled] [--limit N] [--json]\n"
               "                 [--server URL] [--home DIR]\n\n"
               "Lists jobs, newest first, under a header: id, state, kind, progress (percent of\n"
               "the bytes, and tensors done/total when the phase counts them), when it was\n"
               "created, started and finished (UTC), how long it waited in the queue and ran,\n"
               "its arguments and error. --limit N shows the newest N (default 50; with --json\n"
               "1000). --json prints the jobs as GET /v1/jobs gives them (created_at,\n"
               "started_at, finished_at in Unix seconds). The daemon forgets finished jobs\n"
               "after its --keep-jobs period (ckpt serve --help).\n\n"
               "examples:\n"
               "  ckpt jobs --state failed --limit 10\n"
               "  ckpt jobs --server http://127.0.0.1:8470 --json\n");
        return CLI_OK;
    }
    job_args a;
    int u = take_options("jobs", argc, argv, &a, false);
    if (u) return u;
    job_client c;
    static const char *const states[] = {"queued", "running", "succeeded", "failed", "cancelled"};
    bool known = !a.state;
    for (size_t k = 0; !known && k < CKPT_ARRAY_LEN(states); k++) known = !strcmp(a.state, states[k]);
    int rc = a.nrest ? cli_usage_error("jobs", "takes no arguments")
             : !known ? cli_usage_error("jobs", "--state is queued, running, succeeded, failed or cancelled")
                      : open_client(&c, &a);
    bool opened = !rc;
    json_t *jobs = NULL;
    if (!rc && job_client_list(&c, a.state, a.limit ? a.limit : a.json ? 1000 : 50, &jobs) < 0) rc = cli_fail();
    if (!rc && a.json) rc = cli_print_json(json_incref(jobs));
    else if (!rc) {
        size_t i;
        json_t *j;
        double now = queue_now(); /* the wall clock the queue's times are in */
        print_jobs_header();
        json_array_foreach(jobs, i, j) print_job_line(j, now);
    }
    json_decref(jobs);
    if (opened) job_client_close(&c);
    free(a.rest);
    return rc;
}

/* `ckpt show ID`: called by `ckpt show` when its argument is a number. */
int cmd_job_show(int argc, char **argv)
{
    job_args a;
    int64_t id = 0;
    job_client c;
    int u = begin_job_command("show", argc, argv, &a, &id, &c);
    if (u) return u;
    json_t *j;
    int rc = job_client_get(&c, id, &j) < 0 ? cli_fail() : cli_print_json(j);
    job_client_close(&c);
    return rc;
}

typedef int (*job_op)(job_client *, int64_t, json_t **);

static int simple_op(const char *cmd, int argc, char **argv, job_op op, const char *help)
{
    if (cli_wants_help(argc, argv)) {
        fputs(help, stdout);
        return CLI_OK;
    }
    job_args a;
    int64_t id = 0;
    job_client c;
    int u = begin_job_command(cmd, argc, argv, &a, &id, &c);
    if (u) return u;
    json_t *j;
    int rc = op(&c, id, &j) < 0 ? cli_fail() : CLI_OK;
    if (!rc && a.json) rc = cli_print_json(j);
    else if (!rc) {
        printf("%lld %s\n", (long long)id, jstr(j, "state"));
        json_decref(j);
    }
    job_client_close(&c);
    return rc;
}

int cmd_cancel(int argc, char **argv)
{
    return simple_op("cancel", argc, argv, job_client_cancel,
                     "usage: ckpt cancel ID [--server URL] [--home DIR]\n\n"
                     "Cancels a job: a queued one at once; a running one's worker gets SIGTERM (SIGKILL\n"
                     "after a grace period) and its partial output is removed.\n\n"
                     "example:\n"
                     "  ckpt cancel 42\n");
}

int cmd_retry(int argc, char **argv)
{
    return simple_op("retry", argc, argv, job_client_retry,
                     "usage: ckpt retry ID [--server URL] [--home DIR]\n\n"
                     "Queues a failed or cancelled job again, with a fresh attempt budget.\n\n"
                     "example:\n"
                     "  ckpt retry 42 && ckpt wait 42\n");
}

int cmd_wait(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf("usage: ckpt wait ID [--json] [--server URL] [--home DIR]\n\n"
               "Follows a job until it ends (a progress bar on a terminal, a line every 5 s\n"
               "otherwise). Exit 0 when it succeeded, 1 when it failed or was cancelled.\n\n"
               "example:\n"
               "  id=$(ckpt submit convert Qwen/Qwen2-0.5B@main --layout fused) && ckpt wait \"$id\"\n");
        return CLI_OK;
    }
    job_args a;
    int64_t id = 0;
    job_client c;
    int u = begin_job_command("wait", argc, argv, &a, &id, &c);
    if (u) return u;
    int rc = wait_job(&c, id, a.json);
    job_client_close(&c);
    return rc;
}

int cmd_logs(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf("usage: ckpt logs ID [-f] [--server URL] [--home DIR]\n\n"
               "Prints a job's log lines; -f keeps following until the job ends.\n\n"
               "example:\n"
               "  ckpt logs 42 -f\n");
        return CLI_OK;
    }
    job_args a;
    int64_t id = 0;
    job_client c;
    int u = begin_job_command("logs", argc, argv, &a, &id, &c);
    if (u) return u;
    int64_t after = 0;
    int rc = CLI_OK;
    for (;;) {
        json_t *lines;
        if (job_client_logs(&c, id, after, &lines, &after) < 0) {
            rc = cli_fail();
            break;
        }
        size_t i;
        json_t *l;
        json_array_foreach(lines, i, l) printf("%s\n", jstr(l, "line"));
        fflush(stdout);
        json_decref(lines);
        if (!a.follow) break;
        json_t *j;
        if (job_client_get(&c, id, &j) < 0) {
            rc = cli_fail();
            break;
        }
        bool done = job_done(j);
        json_decref(j);
        if (done) {
            json_t *rest;
            if (job_client_logs(&c, id, after, &rest, &after) == 0) {
                json_array_foreach(rest, i, l) printf("%s\n", jstr(l, "line"));
                json_decref(rest);
            }
            break;
        }
        struct timespec ts = {0, 300 * 1000000L};
        nanosleep(&ts, NULL);
    }
    job_client_close(&c);
    return rc;
}

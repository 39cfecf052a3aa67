/*
 * daemon.c — `ckpt serve`: the scheduler loop, worker processes, the HTTP API.
 *
 * One loop: reap lost leases, queue the sync jobs of due schedules
 * (schedule.h), claim runnable jobs up to the worker limit (and
 * per-kind limits), start one `ckpt worker --job ID` per job (the same binary,
 * its own process group, PR_SET_PDEATHSIG so it dies with the daemon), read
 * each worker's pipe (lines "@ckpt progress|result|error ..." and free log
 * lines), renew leases of live workers, stop workers of cancelled or timed
 * out jobs (SIGTERM to the group, SIGKILL after a grace period, then remove
 * their partial output), and record how each ended. SIGTERM/SIGINT: stop
 * claiming, let running jobs finish up to --grace seconds, then stop them and
 * put their jobs back in the queue.
 */
#include "service/daemon/daemon.h"

#include "common/error.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/util.h"
#include "service/http/http_api.h"
#include "service/http/metrics.h"
#include "service/jobs/jobs_run.h"
#include "service/jobs/queue.h"
#include "service/jobs/stats.h"
#include "service/jobs/schedule.h"
#include "store/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#define DAEMON_TICK_MS 50
#define DAEMON_RENEW_SECONDS 2.0
#define DAEMON_KILL_GRACE 3.0
#define DAEMON_LINE_MAX 8192
#define DAEMON_SCHEDULE_SECONDS 0.5 /* how often due sync schedules are looked for */

typedef struct {
    int64_t id;
    char *kind;
    json_t *args;
    pid_t pid;
    int fd;
    char buf[DAEMON_LINE_MAX];
    size_t blen;
    double started, deadline, term_sent, last_renew;
    bool cancelling, releasing, eof; /* eof: its pipe is closed; waiting for its exit */
    bool exited;      /* reaped (status, ended): its end is being recorded */
    bool cleaned;     /* what it left is removed (cleanup_after ran) */
    bool end_pending; /* recording its end failed (the database is unreachable): retried every tick */
    double ended;
    int status;
    char *error, *result;
    bool transient;
    double created;     /* the job's submission, for its queue wait */
    int attempt;
    uint64_t done;      /* its last progress (bytes) */
} worker_slot;

typedef struct {
    const daemon_opts *o;
    ckpt_store store;
    char *owner;
    char exe[PATH_MAX];
    worker_slot *slots;
    size_t nslots;
    atomic_int running;
    metrics *m; /* the HTTP API's figures (NULL without it) */
    bool db_down;     /* the database's connection is lost (PostgreSQL) */
    double db_lost_at, db_back; /* when it was lost, and when it answered again (0: never lost) */
} daemon_state;

/* What names a job's subject in the log: its ref, repo, or source folder. */
static const char *job_subject(const json_t *args)
{
    static const char *const keys[] = {"ref", "repo", "src", "dir", "schedule"};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(keys); i++) {
        const char *v = json_string_value(json_object_get(args, keys[i]));
        if (v) return v;
    }
    return NULL;
}

/* One log event about worker w's job, with the fields every job event has. */
static void job_event(ckpt_event_level level, const char *event, const worker_slot *w, json_t *more)
{
    json_t *f = json_pack("{s:I,s:s,s:s?,s:i}", "id", (json_int_t)w->id, "kind", w->kind, "ref", job_subject(w->args),
                          "attempt", w->attempt);
    if (f && more) json_object_update(f, more);
    json_decref(more);
    ckpt_event(level, event, f);
}

static volatile sig_atomic_t stop_requested;

static void on_stop(int sig)
{
    (void)sig;
    stop_requested = 1;
}

/* A worker's exit wakes the main loop at once (a byte down this pipe), so its
 * slot is refilled without waiting for the tick and without polling a pipe
 * that has already hung up. */
static int child_pipe[2] = {-1, -1};

static void on_child(int sig)
{
    (void)sig;
    int saved = errno;
    ssize_t n = write(child_pipe[1], "c", 1);
    (void)n; /* full: a wake-up is already pending */
    errno = saved;
}

/* What a queue call returned. A lost PostgreSQL connection is said once
 * (db.lost, naming the database and what failed; db.h's names and messages
 * never hold the password) and so is its return (db.back); the calls of every
 * tick meanwhile fail quietly. Other failures are warned about as what.
 * Returns rc. */
static int db_note(daemon_state *d, int rc, const char *what)
{
    ckpt_db *db = NULL;
    bool up = catalog_jobs(&d->store.cat, &db) < 0 || !db || db_connected(db);
    if (rc < 0 && !up) {
        if (!d->db_down) {
            d->db_down = true;
            d->db_lost_at = queue_now();
            ckpt_event(CKPT_EV_ERROR, "db.lost",
                       json_pack("{s:s,s:s,s:s}", "db", db_name(db), "during", what, "error", ckpt_error_last()));
        }
        return rc;
    }
    if (rc < 0) {
        ckpt_warn("%s: %s", what, ckpt_error_last());
    } else if (d->db_down) {
        d->db_down = false;
        d->db_back = queue_now();
        ckpt_event(CKPT_EV_INFO, "db.back",
                   json_pack("{s:s,s:f}", "db", db_name(db), "seconds_lost", d->db_back - d->db_lost_at));
    }
    return rc;
}

static double kind_timeout(const daemon_opts *o, const char *kind)
{
    if (o->timeout_seconds > 0) return o->timeout_seconds;
    const job_kind *k = jobs_kind_find(kind);
    return k ? k->timeout : 3600;
}

static int spawn_worker(daemon_state *d, worker_slot *w)
{
    /* The command line is built before fork: the daemon has threads (the
     * HTTP server), so the child may not allocate. The allowed roots go on
     * it: the worker checks the paths of an HTTP job again, when it runs. */
    char id[32];
    snprintf(id, sizeof id, "%lld", (long long)w->id);
    size_t nroots = 0;
    while (d->o->allow_roots && d->o->allow_roots[nroots]) nroots++;
    char **av = ckpt_calloc(2 * nroots + 10, sizeof *av);
    if (!av) return CKPT_ENOMEM;
    size_t k = 0;
    av[k++] = d->exe;
    av[k++] = "worker";
    av[k++] = "--job";
    av[k++] = id;
    av[k++] = "--home";
    av[k++] = (char *)d->store.home;
    for (size_t r = 0; r < nroots; r++) {
        av[k++] = "--allow-path";
        av[k++] = d->o->allow_roots[r];
    }
    char parent[32];
    snprintf(parent, sizeof parent, "%ld", (long)getpid());
    av[k++] = "--daemon-pid";
    av[k++] = parent;
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) {
        free(av);
        return ckpt_error_sys("pipe");
    }
    /* posix_spawn, not fork: glibc starts the child with vfork semantics
     * (the daemon's memory shared until the exec), so a job costs the daemon
     * no page-table copy and no copy-on-write faults; on a virtual machine
     * those made up most of the daemon's CPU per job. What the child did
     * between fork and exec is done by the spawn attributes (its own process
     * group, SIGTERM/SIGINT back to default, the pipe as stdout and stderr)
     * and by the worker itself (PR_SET_PDEATHSIG, then --daemon-pid checked
     * against its parent, in cmd_worker). */
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    sigset_t def;
    sigemptyset(&def);
    sigaddset(&def, SIGTERM);
    sigaddset(&def, SIGINT);
    pid_t pid = -1;
    int err = posix_spawn_file_actions_init(&fa);
    if (!err) {
        if (!(err = posix_spawnattr_init(&at))) {
            if (!(err = posix_spawn_file_actions_adddup2(&fa, p[1], 1)) &&
                !(err = posix_spawn_file_actions_adddup2(&fa, p[1], 2)) &&
                !(err = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF)) &&
                !(err = posix_spawnattr_setpgroup(&at, 0)) && !(err = posix_spawnattr_setsigdefault(&at, &def)))
                err = posix_spawn(&pid, d->exe, &fa, &at, av, environ);
            posix_spawnattr_destroy(&at);
        }
        posix_spawn_file_actions_destroy(&fa);
    }
    if (err) {
        free(av);
        close(p[0]);
        close(p[1]);
        errno = err;
        return ckpt_error_sys("spawn %s worker", d->exe);
    }
    free(av);
    setpgid(pid, pid);
    close(p[1]);
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    w->pid = pid;
    w->fd = p[0];
    w->started = w->last_renew = queue_now();
    w->deadline = w->started + kind_timeout(d->o, w->kind);
    atomic_fetch_add(&d->running, 1);
    int rc = queue_set_pid(&d->store.cat, w->id, pid);
    metrics_observe_wait(d->m, w->kind, w->started - w->created);
    job_event(CKPT_EV_INFO, "job.started", w,
              json_pack("{s:i,s:f}", "pid", (int)pid, "waited_seconds", w->started - w->created));
    ckpt_fault("daemon.spawned");
    return rc;
}

static void handle_line(daemon_state *d, worker_slot *w, char *line)
{
    if (!strncmp(line, JOBS_PROGRESS_PREFIX, strlen(JOBS_PROGRESS_PREFIX))) {
        queue_progress_info pr;
        if (jobs_progress_parse(line + strlen(JOBS_PROGRESS_PREFIX), &pr)) {
            w->done = (uint64_t)pr.done;
            queue_progress(&d->store.cat, w->id, &pr);
        }
    } else if (!strncmp(line, JOBS_RESULT_PREFIX, strlen(JOBS_RESULT_PREFIX))) {
        free(w->result);
        w->result = ckpt_strdup(line + strlen(JOBS_RESULT_PREFIX));
    } else if (!strncmp(line, JOBS_ERROR_PREFIX, strlen(JOBS_ERROR_PREFIX))) {
        const char *msg = line + strlen(JOBS_ERROR_PREFIX);
        w->transient = !strncmp(msg, "transient ", 10);
        msg = strchr(msg, ' ') ? strchr(msg, ' ') + 1 : msg;
        free(w->error);
        w->error = ckpt_strdup(msg);
        queue_log(&d->store.cat, w->id, msg);
    } else {
        queue_log(&d->store.cat, w->id, line);
    }
}

/* Reads what the worker wrote; splits lines. Returns false at end of file. */
static bool drain(daemon_state *d, worker_slot *w)
{
    for (;;) {
        ssize_t n = read(w->fd, w->buf + w->blen, sizeof w->buf - 1 - w->blen);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
        if (n <= 0) {
            if (w->blen) {
                w->buf[w->blen] = 0;
                handle_line(d, w, w->buf);
                w->blen = 0;
            }
            return false;
        }
        w->blen += (size_t)n;
        w->buf[w->blen] = 0;
        char *start = w->buf, *nl;
        while ((nl = strchr(start, '\n'))) {
            *nl = 0;
            if (*start) handle_line(d, w, start);
            start = nl + 1;
        }
        w->blen -= (size_t)(start - w->buf);
        memmove(w->buf, start, w->blen);
        if (w->blen == sizeof w->buf - 1) { /* an over-long line: log what we have */
            w->buf[w->blen] = 0;
            handle_line(d, w, w->buf);
            w->blen = 0;
        }
    }
}

/* Removes what a stopped worker left: its temp entries in the store (named
 * with its pid), and DST.tmp-* of a consolidate job. */
static void cleanup_after(daemon_state *d, worker_slot *w)
{
    char pidtag[32];
    snprintf(pidtag, sizeof pidtag, "-%d-", (int)w->pid);
    DIR *dir = opendir(d->store.tmp_dir);
    struct dirent *e;
    while (dir && (e = readdir(dir))) {
        if (!strstr(e->d_name, pidtag)) continue;
        char *p = ckpt_path_join(d->store.tmp_dir, e->d_name);
        if (p) ckpt_rm_rf(p);
        free(p);
    }
    if (dir) closedir(dir);
    const char *dst = json_string_value(json_object_get(w->args, "dst"));
    if (dst && !strcmp(w->kind, "consolidate")) {
        char *parent = ckpt_strdup(dst), *slash = parent ? strrchr(parent, '/') : NULL;
        if (slash) {
            *slash = 0;
            const char *base = slash + 1;
            DIR *pd = opendir(*parent ? parent : "/");
            while (pd && (e = readdir(pd))) {
                int wpid;
                int64_t wstart;
                /* only this worker's (the name holds its pid): never another writer's */
                if (strncmp(e->d_name, base, strlen(base)) || strncmp(e->d_name + strlen(base), ".tmp-", 5) ||
                    !ckpt_tmp_name_writer(e->d_name + strlen(base) + 5, &wpid, &wstart) || wpid != (int)w->pid)
                    continue;
                char *p = ckpt_path_join(*parent ? parent : "/", e->d_name);
                if (p) ckpt_rm_rf(p);
                free(p);
            }
            if (pd) closedir(pd);
        }
        free(parent);
    }
}

/* The job's state after its end was recorded: "queued" again means a retry. */
static bool job_requeued(daemon_state *d, int64_t id)
{
    queue_job j;
    if (queue_get(&d->store.cat, id, &j) < 0) return false;
    bool again = !strcmp(j.state, "queued");
    queue_job_free(&j);
    return again;
}

/* Frees w's slot (the last one moves into it). */
static void drop_slot(daemon_state *d, worker_slot *w)
{
    atomic_fetch_sub(&d->running, 1);
    close(w->fd);
    free(w->kind);
    json_decref(w->args);
    free(w->error);
    free(w->result);
    *w = d->slots[--d->nslots];
}

/* Removes what w left, once. */
static void clean_once(daemon_state *d, worker_slot *w)
{
    if (!w->cleaned) cleanup_after(d, w);
    w->cleaned = true;
}

/* Records how w's job ended and frees its slot. False when the database did
 * not take it (it is unreachable): the slot stays, its lease renewed, and the
 * next tick tries again, so a job's end is never lost with the connection. */
static bool finish_slot(daemon_state *d, worker_slot *w)
{
    catalog *c = &d->store.cat;
    int st = w->status;
    double ran = w->ended - w->started;
    const char *outcome;
    const char *err = NULL;
    char msg[512];
    int rc;
    if (w->releasing) {
        clean_once(d, w);
        rc = queue_release(c, w->id, d->owner);
        outcome = "released";
    } else if (w->cancelling) {
        if (WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) != 0)) clean_once(d, w);
        rc = queue_mark_cancelled(c, w->id);
        outcome = "cancelled";
    } else if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        rc = queue_finish(c, w->id, d->owner, true, false, NULL, w->result);
        outcome = "succeeded";
    } else {
        if (WIFSIGNALED(st)) {
            snprintf(msg, sizeof msg, "worker killed by signal %d%s", WTERMSIG(st),
                     w->ended > w->deadline ? " (job timed out)" : "");
            clean_once(d, w);
        }
        bool timed_out = w->ended > w->deadline;
        err = w->error ? w->error : WIFSIGNALED(st) ? msg : "worker failed without a message";
        bool transient = w->error ? w->transient : !timed_out;
        rc = queue_finish(c, w->id, d->owner, false, transient && !timed_out, err, NULL);
        outcome = transient && !timed_out && !rc && job_requeued(d, w->id) ? "retried" : "failed";
    }
    /* said once per job: the retries of every tick are quiet */
    if (rc < 0 && (w->end_pending || db_note(d, rc, "record a job's end") < 0)) {
        if (!w->end_pending) /* a failure's retry or not is the database's to decide, later */
            job_event(CKPT_EV_WARN, "job.end_pending", w,
                      json_pack("{s:s,s:s}", "outcome", err ? "attempt failed" : outcome, "error", ckpt_error_last()));
        w->end_pending = true;
        return false;
    }
    if (rc == QUEUE_NOT_OURS) {
        /* Its lease expired meanwhile (this daemon could not renew it) and
         * another daemon runs or ran the job: that run's end is the one that
         * counts, so this one is neither recorded nor logged as the job's end. */
        job_event(CKPT_EV_WARN, "job.not_ours", w,
                  json_pack("{s:s,s:f}", "outcome", outcome, "seconds", ran));
        drop_slot(d, w);
        return true;
    }
    if (strcmp(outcome, "released")) metrics_observe_job(d->m, w->kind, outcome, ran, w->done);
    static const struct {
        const char *outcome, *event;
        ckpt_event_level level;
    } events[] = {{"succeeded", "job.finished", CKPT_EV_INFO}, {"failed", "job.failed", CKPT_EV_ERROR},
                  {"retried", "job.retry", CKPT_EV_WARN},      {"cancelled", "job.cancelled", CKPT_EV_INFO},
                  {"released", "job.released", CKPT_EV_INFO}};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(events); i++)
        if (!strcmp(events[i].outcome, outcome))
            job_event(events[i].level, events[i].event, w,
                      json_pack("{s:f,s:I,s:s?}", "seconds", ran, "bytes", (json_int_t)w->done, "error", err));
    ckpt_fault("daemon.finished");
    drop_slot(d, w);
    return true;
}

static void signal_group(worker_slot *w, int sig)
{
    if (w->pid > 0) kill(-w->pid, sig);
}

/* Cancels, timeouts, lease renewal. */
static void supervise(daemon_state *d, bool stopping, double grace_end)
{
    double now = queue_now();
    for (size_t i = 0; i < d->nslots; i++) {
        worker_slot *w = &d->slots[i];
        if (now - w->last_renew >= DAEMON_RENEW_SECONDS) {
            w->last_renew = now;
            db_note(d, queue_renew(&d->store.cat, d->owner, w->id), "renew a lease");
            queue_job j;
            if (!w->cancelling && !w->exited && queue_get(&d->store.cat, w->id, &j) == 0) {
                if (j.cancel_requested) {
                    w->cancelling = true;
                    queue_log(&d->store.cat, w->id, "cancel requested: stopping the worker");
                }
                queue_job_free(&j);
            }
        }
        if (w->exited) continue; /* its pid is reaped: never signalled again */
        bool want_stop = w->cancelling || now > w->deadline || (stopping && now > grace_end);
        if (stopping && now > grace_end && !w->cancelling) w->releasing = true;
        if (want_stop && !w->term_sent) {
            signal_group(w, SIGTERM);
            w->term_sent = now;
        } else if (want_stop && now - w->term_sent > DAEMON_KILL_GRACE) {
            signal_group(w, SIGKILL);
        }
    }
}

/* Reaps ended workers and records their ends (again, for those whose record
 * failed). A daemon stopping past its grace gives up an end it cannot record:
 * the lease expires and another daemon runs the job again. */
static void collect_exits(daemon_state *d, bool give_up)
{
    for (size_t i = 0; i < d->nslots;) {
        worker_slot *w = &d->slots[i];
        if (!w->exited) {
            int st;
            if (waitpid(w->pid, &st, WNOHANG) != w->pid) {
                i++;
                continue;
            }
            drain(d, w); /* what it wrote before exiting (drain reads until the pipe is empty) */
            w->status = st;
            w->ended = queue_now();
            w->exited = true;
            signal_group(w, SIGKILL); /* anything it left in its group */
        }
        if (finish_slot(d, w)) continue;
        if (give_up) {
            job_event(CKPT_EV_ERROR, "job.end_lost", w,
                      json_pack("{s:s}", "error", "stopping with the database unreachable: its lease will expire "
                                                  "and the job will run again"));
            drop_slot(d, w);
            continue;
        }
        i++;
    }
}

static void claim_more(daemon_state *d)
{
    int free_slots = d->o->workers - (int)d->nslots;
    if (free_slots <= 0) return;
    queue_kind_room rooms[jobs_nkinds];
    for (size_t k = 0; k < jobs_nkinds; k++) {
        int limit = jobs_kinds[k].limit ? jobs_kinds[k].limit : d->o->workers;
        int used = 0;
        for (size_t i = 0; i < d->nslots; i++) used += !strcmp(d->slots[i].kind, jobs_kinds[k].name);
        rooms[k] = (queue_kind_room){jobs_kinds[k].name, limit - used};
    }
    queue_job *jobs;
    size_t n;
    if (db_note(d, queue_claim(&d->store.cat, d->owner, free_slots, rooms, jobs_nkinds, &jobs, &n), "claim") < 0)
        return;
    for (size_t i = 0; i < n; i++) {
        worker_slot *w = &d->slots[d->nslots];
        memset(w, 0, sizeof *w);
        w->id = jobs[i].id;
        w->created = jobs[i].created_at;
        w->attempt = jobs[i].attempt;
        w->kind = jobs[i].kind;
        w->args = jobs[i].args;
        jobs[i].kind = NULL;
        jobs[i].args = NULL;
        if (spawn_worker(d, w) < 0) {
            queue_finish(&d->store.cat, w->id, d->owner, false, true, ckpt_error_last(), NULL);
            free(w->kind);
            json_decref(w->args);
            continue;
        }
        d->nslots++;
    }
    queue_jobs_free(jobs, n);
}

int daemon_run(const daemon_opts *o)
{
    daemon_state d;
    memset(&d, 0, sizeof d);
    d.o = o;
    int rc = store_open(&d.store, o->home);
    if (rc) return rc;
    ssize_t n = readlink("/proc/self/exe", d.exe, sizeof d.exe - 1);
    if (n <= 0) {
        store_close(&d.store);
        return ckpt_error_sys("/proc/self/exe");
    }
    d.exe[n] = 0;
    d.owner = queue_owner_self();
    d.slots = ckpt_calloc((size_t)o->workers + 1, sizeof *d.slots);
    http_api *api = NULL;
    if (!d.owner || !d.slots) rc = CKPT_ENOMEM;
    http_api_opts ho = {.listen = o->listen, .token_file = o->token_file, .home = d.store.home,
                        .running_workers = &d.running, .workers = o->workers, .allow_roots = o->allow_roots,
                        .per_ip = o->per_ip, .idle_timeout = o->idle_timeout};
    if (!rc && child_pipe[0] < 0 && pipe2(child_pipe, O_CLOEXEC | O_NONBLOCK) < 0) rc = ckpt_error_sys("pipe");
    if (!rc && !o->no_http) rc = http_api_start(&api, &ho);
    d.m = http_api_metrics(api);
    if (rc) {
        free(d.owner);
        free(d.slots);
        store_close(&d.store);
        return rc;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    sa.sa_handler = on_child;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    int requeued = 0;
    queue_reap(&d.store.cat, d.owner, true, &requeued);
    /* A daemon killed while writing serve.url leaves its temp file: drop those. */
    DIR *hd = opendir(d.store.home);
    struct dirent *he;
    while (hd && (he = readdir(hd))) {
        if (strncmp(he->d_name, ".serve.url.tmp-", 15)) continue;
        char *p = ckpt_path_join(d.store.home, he->d_name);
        if (p) unlink(p);
        free(p);
    }
    if (hd) closedir(hd);
    char *url_file = ckpt_path_join(d.store.home, "serve.url");
    if (api) {
        ckpt_info("ckpt serve: %s, %d workers, home %s%s", http_api_url(api), o->workers, d.store.home,
                  requeued ? "" : "");
        if (url_file) ckpt_write_file_atomic(url_file, http_api_url(api), strlen(http_api_url(api)));
    }
    if (requeued) ckpt_info("put %d jobs of a previous daemon back in the queue", requeued);
    double last_reap = 0, last_schedules = 0, last_prune = 0, last_sample = 0, last_claim = 0, grace_end = 0;
    uint64_t served_seen = 0;
    size_t last_nslots = 0;
    const char *db_url = NULL;
    /* (while PostgreSQL is unreachable, wake_fd is -1 and claims stay once a second) */
    bool stopping = false, woken = false, on_pg = catalog_db_url(&db_url) == 0 && db_url;
    for (;;) {
        double now = queue_now();
        if (stop_requested && !stopping) {
            stopping = true;
            grace_end = now + o->grace_seconds;
            ckpt_info("stopping: no new jobs; waiting up to %.0f s for %zu running", o->grace_seconds, d.nslots);
        }
        if (stopping && d.nslots == 0) break;
        if (!stopping && now - last_reap >= 1.0) {
            last_reap = now;
            /* Back from losing the database, every owner gets a lease's time
             * to renew before an expired lease counts as lost: the leases ran
             * out because nobody could renew them, not because their daemons
             * died (a dead daemon of this host is still found by its pid). */
            bool expire = !d.db_down && (!d.db_back || now - d.db_back >= QUEUE_LEASE_SECONDS);
            db_note(&d, queue_reap(&d.store.cat, d.owner, expire, NULL), "reap leases");
        }
        if (!stopping && now - last_schedules >= DAEMON_SCHEDULE_SECONDS) {
            last_schedules = now;
            db_note(&d, schedule_queue_due(&d.store.cat, now, NULL), "schedules");
        }
        if (!stopping && now - last_prune >= DAEMON_PRUNE_SECONDS) {
            last_prune = now;
            int pruned = 0;
            if (db_note(&d, queue_prune(&d.store.cat, now - o->keep_jobs, &pruned), "prune") == 0 && pruned)
                ckpt_event(CKPT_EV_INFO, "jobs.pruned",
                           json_pack("{s:i,s:f}", "jobs", pruned, "keep_seconds", o->keep_jobs));
        }
        if (!stopping && now - last_sample >= STATS_SAMPLE_SECONDS) {
            last_sample = now;
            uint64_t served = metrics_served_bytes(d.m);
            if (db_note(&d, stats_sample(&d.store.cat, now, atomic_load(&d.running), served - served_seen), "stats") == 0)
                served_seen = served;
        }
        /* On PostgreSQL a claim is a round trip other daemons share: claim when
         * a submission NOTIFYs, when a slot frees, or once a second (a job
         * whose backoff ended, a missed wake-up); on SQLite at every tick. */
        int wake_fd = stopping || !on_pg ? -1 : queue_wake_fd(&d.store.cat);
        if (!stopping && (!on_pg || woken || d.nslots != last_nslots || now - last_claim >= 1.0)) {
            claim_more(&d);
            last_claim = now;
            last_nslots = d.nslots;
            woken = false;
        }
        struct pollfd pfd[258];
        size_t slot_of[258], np = 0;
        pfd[np++] = (struct pollfd){.fd = child_pipe[0], .events = POLLIN};
        if (wake_fd >= 0) pfd[np++] = (struct pollfd){.fd = wake_fd, .events = POLLIN};
        for (size_t i = 0; i < d.nslots && np < CKPT_ARRAY_LEN(pfd); i++) {
            if (d.slots[i].eof) continue;
            slot_of[np] = i;
            pfd[np++] = (struct pollfd){.fd = d.slots[i].fd, .events = POLLIN};
        }
        poll(pfd, np, DAEMON_TICK_MS);
        if (pfd[0].revents) {
            char sink[64];
            while (read(child_pipe[0], sink, sizeof sink) > 0) {}
        }
        size_t first_slot = 1;
        if (wake_fd >= 0) {
            if (pfd[1].revents) woken = queue_wake_drain(&d.store.cat);
            first_slot = 2;
        }
        for (size_t i = first_slot; i < np; i++)
            if (pfd[i].revents && !drain(&d, &d.slots[slot_of[i]])) d.slots[slot_of[i]].eof = true;
        collect_exits(&d, stopping && now > grace_end + DAEMON_KILL_GRACE);
        supervise(&d, stopping, grace_end);
    }
    http_api_stop(api);
    if (url_file) unlink(url_file);
    free(url_file);
    free(d.slots);
    free(d.owner);
    store_close(&d.store);
    ckpt_info("ckpt serve: stopped");
    return 0;
}

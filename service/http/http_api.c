/* http_api.c — the job API over libmicrohttpd (see http_api.h). */
#include "service/http/http_api.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "service/http/dashboard.h"
#include "service/http/http_util.h"
#include "service/http/metrics.h"
#include "service/jobs/jobs_run.h"
#include "service/jobs/queue.h"
#include "service/jobs/queue_admin.h"
#include "service/jobs/stats.h"
#include "service/jobs/schedule.h"
#include "service/http/hub_api.h"
#include "service/http/store_api.h"
#include "store/store.h"
#include "store/catalog.h"
#include "store/store_runs.h"
#include "store/store_verify.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    unsigned char digest[HTTP_TOKEN_DIGEST]; /* sha256 of the token: compared, never the token itself */
    bool admin;
} api_token;

struct http_api {
    struct MHD_Daemon *mhd;
    /* Catalog connections, one per request at a time: a request that hashes
     * or waits on a slow disk holds up only its own connection. mu guards
     * busy[] alone, never a request. */
    ckpt_store pool[HTTP_STORE_POOL];
    bool busy[HTTP_STORE_POOL];
    char *home;
    pthread_mutex_t mu;
    pthread_cond_t freed;
    api_token *tokens;
    size_t ntokens;
    char url[128];
    atomic_int *running;
    char *const *roots; /* --allow-path folders, canonical, NULL-terminated (the daemon's) */
    int workers_max;
    metrics *m;
};

typedef struct {
    char *body;
    size_t len;
    bool too_big;
    double t0;          /* when its headers were in */
    char *method, *path; /* for the access log: the path without the query */
} request;

static int load_tokens(http_api *h, const char *path)
{
    char *text;
    size_t len;
    int rc = ckpt_read_file(path, 1u << 20, &text, &len);
    if (rc) return rc;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line && !rc; line = strtok_r(NULL, "\n", &save)) {
        while (isspace((unsigned char)*line)) line++;
        if (!*line || *line == '#') continue;
        char *tok = line, *role = line;
        while (*role && !isspace((unsigned char)*role)) role++;
        if (*role) *role++ = '\0';
        while (isspace((unsigned char)*role)) role++;
        char *end = role + strlen(role);
        while (end > role && isspace((unsigned char)end[-1])) *--end = '\0';
        if (*role && strcmp(role, "read") && strcmp(role, "admin")) {
            rc = ckpt_error_set(CKPT_EINVAL, "%s: role '%s' is neither read nor admin", path, role);
            break;
        }
        if (strlen(tok) < 16) {
            rc = ckpt_error_set(CKPT_EINVAL, "%s: a token is shorter than 16 characters", path);
            break;
        }
        if (h->ntokens >= HTTP_MAX_TOKENS) {
            rc = ckpt_error_set(CKPT_ELIMIT, "%s: more than %d tokens", path, HTTP_MAX_TOKENS);
            break;
        }
        size_t cap = h->ntokens;
        if ((rc = ckpt_grow(&h->tokens, &cap, h->ntokens + 1, sizeof *h->tokens))) break;
        http_token_digest(tok, strlen(tok), h->tokens[h->ntokens].digest);
        h->tokens[h->ntokens].admin = !*role || !strcmp(role, "admin");
        h->ntokens++;
    }
    if (!rc && h->ntokens == 0) rc = ckpt_error_set(CKPT_EINVAL, "%s: no tokens", path);
    free(text);
    return rc;
}

/* 0 no token matched, 1 read, 2 admin. The given token is hashed and every
 * configured digest compared in constant time, so neither the time taken nor
 * an early exit tells how long a token is or how much of it matched. */
static int token_role(const http_api *h, const char *auth)
{
    if (!auth || strncmp(auth, "Bearer ", 7)) return 0;
    unsigned char given[HTTP_TOKEN_DIGEST];
    http_token_digest(auth + 7, strlen(auth + 7), given);
    int role = 0;
    for (size_t i = 0; i < h->ntokens; i++) {
        int same = http_token_equal(given, h->tokens[i].digest);
        int r = h->tokens[i].admin ? 2 : 1;
        role = same && r > role ? r : role;
    }
    return role;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned code, json_t *j)
{
    return http_send_json(c, code, j);
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned code, const char *msg)
{
    return http_send_error(c, code, msg, NULL, NULL);
}

static unsigned code_for(int rc)
{
    switch (rc) {
    case CKPT_ENOTFOUND: return 404;
    case CKPT_EINVAL:
    case CKPT_ELIMIT: return 400;
    case CKPT_EEXIST: return 409;
    default: return 500;
    }
}

static enum MHD_Result job_reply(http_api *h, ckpt_store *s, struct MHD_Connection *c, unsigned code, int64_t id)
{
    json_t *o;
    int rc = queue_job_detail(&s->cat, id, &o);
    return rc ? send_error(c, code_for(rc), ckpt_error_last()) : send_json(c, code, o);
}

static enum MHD_Result post_job(http_api *h, ckpt_store *s, struct MHD_Connection *c, const request *req)
{
    json_error_t err;
    json_t *body = json_loadb(req->body ? req->body : "", req->len, JSON_REJECT_DUPLICATES, &err);
    if (!json_is_object(body)) {
        json_decref(body);
        char msg[256];
        snprintf(msg, sizeof msg, "body is not a JSON object: %s", err.text);
        return send_error(c, 400, msg);
    }
    const char *kind = json_string_value(json_object_get(body, "kind"));
    json_t *args = json_object_get(body, "args");
    if (!args) args = json_object();
    else json_incref(args);
    queue_submit_opts o = {.priority = (int)json_integer_value(json_object_get(body, "priority")),
                           .max_attempts = (int)json_integer_value(json_object_get(body, "max_attempts")),
                           .depends_on = json_integer_value(json_object_get(body, "depends_on"))};
    int rc = !kind ? ckpt_error_set(CKPT_EINVAL, "missing 'kind'")
             : !jobs_kind_find(kind) ? ckpt_error_set(CKPT_EINVAL, "unknown job kind '%s'", kind)
                                       : jobs_args_check(kind, args);
    if (!rc && json_object_get(args, JOBS_ORIGIN_KEY))
        rc = ckpt_error_set(CKPT_EINVAL, "'%s' is set by the server, not by clients", JOBS_ORIGIN_KEY);
    if (!rc) json_object_set_new(args, JOBS_ORIGIN_KEY, json_string("http"));
    if (!rc && jobs_paths_check(kind, args, h->roots) < 0) {
        json_decref(args);
        json_decref(body);
        return send_error(c, 403, ckpt_error_last());
    }
    int64_t id = 0;
    bool existed = false;
    if (!rc) rc = queue_submit(&s->cat, kind, args, &o, &id, &existed);
    json_decref(args);
    json_decref(body);
    if (rc) return send_error(c, code_for(rc), ckpt_error_last());
    return job_reply(h, s, c, existed ? 200 : 201, id);
}

/* The ?state= and ?q= of a request (queue_admin.h). */
static queue_filter request_filter(struct MHD_Connection *c)
{
    const char *q = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "q");
    return (queue_filter){MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "state"), q && *q ? q : NULL};
}

/* GET /v1/jobs[?state=S][&q=TEXT][&limit=N][&offset=N]: newest first, with the total matched. */
static enum MHD_Result list_jobs(http_api *h, ckpt_store *s, struct MHD_Connection *c)
{
    (void)h;
    const char *limit = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
    const char *offset = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "offset");
    uint64_t lim = 100, off = 0;
    if (limit && ckpt_parse_u64_field("limit", limit, 1, 100000, &lim) < 0) return send_error(c, 400, ckpt_error_last());
    if (offset && ckpt_parse_u64_field("offset", offset, 0, INT32_MAX, &off) < 0)
        return send_error(c, 400, ckpt_error_last());
    queue_filter f = request_filter(c);
    queue_job *jobs;
    size_t n;
    int64_t total;
    int rc = queue_find(&s->cat, &f, (int)lim, (int)off, &jobs, &n, &total);
    if (rc) return send_error(c, code_for(rc), ckpt_error_last());
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, queue_job_json(&jobs[i]));
    queue_jobs_free(jobs, n);
    return send_json(c, 200, json_pack("{s:o,s:I}", "jobs", a, "total", (json_int_t)total));
}

/* GET /v1/jobs/counts[?q=TEXT]: jobs per state (the dashboard's tabs). */
static enum MHD_Result job_counts(ckpt_store *s, struct MHD_Connection *c)
{
    queue_filter f = request_filter(c);
    json_t *counts;
    int rc = queue_state_counts(&s->cat, &f, &counts);
    return rc ? send_error(c, code_for(rc), ckpt_error_last()) : send_json(c, 200, counts);
}

static json_t *body_object(struct MHD_Connection *c, const request *req, enum MHD_Result *sent);

/* POST /v1/jobs/bulk {"action": "cancel"|"retry"|"delete", "state"?, "q"?}:
 * the action on every job the filter matches. At least one of state and q
 * is required, so an empty filter never clears the whole queue by accident. */
static enum MHD_Result job_bulk(ckpt_store *s, struct MHD_Connection *c, const request *req)
{
    enum MHD_Result sent = MHD_NO;
    json_t *body = body_object(c, req, &sent);
    if (!body) return sent;
    const char *action = json_string_value(json_object_get(body, "action"));
    const char *q = json_string_value(json_object_get(body, "q"));
    queue_filter f = {json_string_value(json_object_get(body, "state")), q && *q ? q : NULL};
    int matched = 0, done = 0;
    int rc = !action            ? ckpt_error_set(CKPT_EINVAL, "missing 'action' (cancel, retry or delete)")
             : !f.state && !f.q ? ckpt_error_set(CKPT_EINVAL, "a bulk action needs a filter: 'state' or 'q'")
                                : queue_bulk(&s->cat, &f, action, &matched, &done);
    enum MHD_Result r = rc ? send_error(c, code_for(rc), ckpt_error_last())
                           : send_json(c, 200, json_pack("{s:s,s:i,s:i}", "action", action, "matched", matched,
                                                         "done", done));
    json_decref(body);
    return r;
}

/* GET /v1/stats[?hours=N]: the per-minute figures of the last N hours (default 6, at most 24). */
static enum MHD_Result stats_answer(ckpt_store *s, struct MHD_Connection *c)
{
    const char *hours = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "hours");
    uint64_t hrs = 6;
    if (hours && ckpt_parse_u64_field("hours", hours, 1, STATS_KEEP_SECONDS / 3600, &hrs) < 0)
        return send_error(c, 400, ckpt_error_last());
    double now = queue_now();
    json_t *out;
    int rc = stats_series(&s->cat, now - (double)hrs * 3600, now, &out);
    return rc ? send_error(c, 500, ckpt_error_last()) : send_json(c, 200, out);
}

static enum MHD_Result metrics_answer(http_api *h, ckpt_store *s, struct MHD_Connection *c)
{
    json_t *counts = NULL, *store = NULL;
    if (queue_counts(&s->cat, &counts) < 0) return send_error(c, 500, ckpt_error_last());
    store_du_result du;
    if (store_du(s, &du) == 0) store = store_du_json(&du);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f) {
        metrics_now now = {.queue = counts, .store = store, .workers_busy = h->running ? atomic_load(h->running) : 0,
                           .workers_max = h->workers_max};
        metrics_render(h->m, &now, f);
        fclose(f);
    }
    json_decref(counts);
    json_decref(store);
    if (!text) return send_error(c, 500, "out of memory");
    return http_send_text(c, 200, "text/plain; version=0.0.4", text);
}

/* /v1/jobs/{id}[/logs|/retry] */
static enum MHD_Result job_route(http_api *h, ckpt_store *s, struct MHD_Connection *c, const char *method,
                                 const char *rest, int role)
{
    size_t digits = strspn(rest, "0123456789");
    char idtext[24];
    uint64_t uid = 0;
    snprintf(idtext, sizeof idtext, "%.*s", (int)(digits < sizeof idtext ? digits : sizeof idtext - 1), rest);
    if (!digits || digits >= sizeof idtext || ckpt_parse_u64_field("job id", idtext, 1, INT64_MAX, &uid) < 0)
        return send_error(c, 404, "no such job");
    long long id = (long long)uid;
    const char *end = rest + digits;
    if (!*end && !strcmp(method, "GET")) return job_reply(h, s, c, 200, id);
    if (!*end && !strcmp(method, "DELETE")) {
        if (role < 2) return send_error(c, 403, "cancelling needs an admin token");
        bool running;
        int rc = queue_cancel(&s->cat, id, &running);
        if (rc) return send_error(c, code_for(rc), ckpt_error_last());
        return job_reply(h, s, c, 202, id);
    }
    if (!strcmp(end, "/retry") && !strcmp(method, "POST")) {
        if (role < 2) return send_error(c, 403, "retrying needs an admin token");
        int rc = queue_retry(&s->cat, id);
        if (rc) return send_error(c, code_for(rc), ckpt_error_last());
        return job_reply(h, s, c, 200, id);
    }
    if (!strcmp(end, "/delete") && !strcmp(method, "POST")) {
        if (role < 2) return send_error(c, 403, "deleting needs an admin token");
        int rc = queue_delete(&s->cat, id);
        if (rc) return send_error(c, code_for(rc), ckpt_error_last());
        return send_json(c, 200, json_pack("{s:I}", "deleted", (json_int_t)id));
    }
    if (!strcmp(end, "/logs") && !strcmp(method, "GET")) {
        const char *after = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after");
        int64_t after_line = 0;
        if (after && ckpt_parse_i64_field("?after=", after, 0, INT64_MAX, &after_line) < 0)
            return send_error(c, 400, ckpt_error_last());
        queue_job j;
        int rc = queue_get(&s->cat, id, &j);
        if (rc) return send_error(c, code_for(rc), ckpt_error_last());
        queue_job_free(&j);
        json_t *lines;
        int64_t last;
        queue_logs(&s->cat, id, after_line, &lines, &last);
        return send_json(c, 200, json_pack("{s:o,s:I}", "lines", lines, "last", (json_int_t)last));
    }
    return send_error(c, 405, "method not allowed here");
}

/* The request body as a JSON object, or a 400 already sent (*sent). */
static json_t *body_object(struct MHD_Connection *c, const request *req, enum MHD_Result *sent)
{
    json_error_t err;
    json_t *body = json_loadb(req->body ? req->body : "", req->len, JSON_REJECT_DUPLICATES, &err);
    if (json_is_object(body)) return body;
    json_decref(body);
    char msg[256];
    snprintf(msg, sizeof msg, "body is not a JSON object: %s", err.text);
    *sent = send_error(c, 400, msg);
    return NULL;
}

/* A positive id from a path segment of digits; 0 if it is not one. */
static int64_t path_id(const char *text, const char **end)
{
    size_t digits = strspn(text, "0123456789");
    char idtext[24];
    uint64_t id = 0;
    *end = text + digits;
    if (!digits || digits >= sizeof idtext) return 0;
    snprintf(idtext, sizeof idtext, "%.*s", (int)digits, text);
    return ckpt_parse_u64_field("id", idtext, 1, INT64_MAX, &id) < 0 ? 0 : (int64_t)id;
}

/* /v1/schedules[/{id}[/run]] */
static enum MHD_Result schedules_route(http_api *h, ckpt_store *s, struct MHD_Connection *c, const char *method,
                                       const char *rest, const request *req)
{
    int rc;
    if (!*rest && !strcmp(method, "GET")) {
        schedule *v;
        size_t n;
        if ((rc = schedule_list(&s->cat, &v, &n))) return send_error(c, 500, ckpt_error_last());
        json_t *a = json_array();
        for (size_t i = 0; i < n; i++) json_array_append_new(a, schedule_json(&v[i]));
        schedules_free(v, n);
        return send_json(c, 200, json_pack("{s:o}", "schedules", a));
    }
    if (!*rest && !strcmp(method, "POST")) {
        enum MHD_Result sent = MHD_NO;
        json_t *body = body_object(c, req, &sent);
        if (!body) return sent;
        schedule sc;
        rc = schedule_from_json(body, &sc);
        json_decref(body);
        if (!rc) rc = schedule_add(&s->cat, &sc);
        enum MHD_Result r = rc ? send_error(c, code_for(rc), ckpt_error_last()) : send_json(c, 201, schedule_json(&sc));
        schedule_free(&sc);
        return r;
    }
    if (*rest != '/') return send_error(c, *rest ? 404 : 405, *rest ? "no such endpoint" : "method not allowed here");
    const char *end;
    int64_t id = path_id(rest + 1, &end);
    if (!id) return send_error(c, 404, "no such schedule");
    schedule sc;
    if ((rc = schedule_get(&s->cat, id, &sc))) return send_error(c, code_for(rc), ckpt_error_last());
    enum MHD_Result r;
    if (!*end && !strcmp(method, "GET")) {
        r = send_json(c, 200, schedule_json(&sc));
    } else if (!*end && !strcmp(method, "DELETE")) {
        rc = schedule_remove(&s->cat, id);
        r = rc ? send_error(c, code_for(rc), ckpt_error_last())
               : send_json(c, 200, json_pack("{s:I}", "removed", (json_int_t)id));
    } else if ((!strcmp(end, "/pause") || !strcmp(end, "/resume")) && !strcmp(method, "POST")) {
        rc = schedule_set_paused(&s->cat, id, !strcmp(end, "/pause"));
        schedule_free(&sc);
        if (!rc) rc = schedule_get(&s->cat, id, &sc);
        r = rc ? send_error(c, code_for(rc), ckpt_error_last()) : send_json(c, 200, schedule_json(&sc));
        if (rc) return r;
    } else if (!strcmp(end, "/run") && !strcmp(method, "POST")) {
        int64_t job = 0;
        bool existed = false;
        rc = schedule_run_now(&s->cat, id, &job, &existed);
        r = rc ? send_error(c, code_for(rc), ckpt_error_last()) : job_reply(h, s, c, existed ? 200 : 201, job);
    } else {
        r = send_error(c, 405, "method not allowed here");
    }
    schedule_free(&sc);
    return r;
}

/* GET /v1/store (ckpt du --json) and GET /v1/runs[?run=] (ckpt state ls --json). */
static enum MHD_Result store_summary(ckpt_store *s, struct MHD_Connection *c, const char *url, const char *method)
{
    if (strcmp(method, "GET")) return send_error(c, 405, "method not allowed here");
    if (!strcmp(url, "/v1/store")) {
        store_du_result r;
        int rc = store_du(s, &r);
        json_t *j = rc ? NULL : store_du_json(&r), *verify = NULL;
        if (!rc && (rc = store_verify_last_run(s, &verify))) json_decref(j);
        if (!rc && verify) json_object_set_new(j, "last_verify", verify);
        return rc ? http_send_store_error(c, rc, "measure the store") : send_json(c, 200, j);
    }
    json_t *steps;
    int rc = store_run_steps_json(s, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "run"), &steps);
    return rc ? http_send_store_error(c, rc, "list runs") : send_json(c, 200, json_pack("{s:o}", "steps", steps));
}

/* 401 as the Hub words it (docs/hub.md, "Tokens"): on a Hub route without a
 * token, X-Error-Code RepoNotFound and "Invalid username or password.", which
 * huggingface_hub turns into RepositoryNotFoundError (so repo_exists,
 * revision_exists and file_exists answer False); with a token that is not
 * ours, "Invalid credentials in Authorization header" and no code, which it
 * reports as a refused token. The job and store API get the message only. */
static enum MHD_Result unauthorized(struct MHD_Connection *c, const char *url, bool had_token)
{
    bool hub = strncmp(url, "/v1/", 4) && strcmp(url, "/metrics");
    if (had_token) return http_send_error_msg(c, 401, "Invalid credentials in Authorization header", NULL);
    if (hub) return http_send_error_msg(c, 401, "Invalid username or password.", "RepoNotFound");
    return http_send_error_msg(c, 401, "a valid 'Authorization: Bearer TOKEN' header is required", NULL);
}

static enum MHD_Result route(http_api *h, ckpt_store *s, struct MHD_Connection *c, const char *url, const char *method,
                             const request *req)
{
    int role = 2;
    if (h->ntokens) {
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        role = token_role(h, auth);
        if (!role) return unauthorized(c, url, auth != NULL);
    }
    if (req->too_big) return send_error(c, 413, "request body too large");
    /* Read tokens read; every action of the /v1 API needs an admin token. */
    if (role < 2 && !strncmp(url, "/v1/", 4) && strcmp(method, "GET") && strcmp(method, "HEAD"))
        return send_error(c, 403, !strcmp(url, "/v1/jobs")           ? "submitting needs an admin token"
                                  : strstr(url, "/retry")             ? "retrying needs an admin token"
                                  : strstr(url, "/delete")            ? "deleting needs an admin token"
                                  : !strcmp(url, "/v1/jobs/bulk")     ? "a bulk action needs an admin token"
                                  : !strncmp(url, "/v1/jobs/", 9)     ? "cancelling needs an admin token"
                                                                      : "this action needs an admin token");
    bool handled;
    enum MHD_Result sr = store_api_route(s, c, url, method, &handled);
    if (handled) return sr;
    sr = hub_api_route(s, c, url, method, req->body, req->len, &handled);
    if (handled) return sr;
    if (!strcmp(url, "/metrics")) return metrics_answer(h, s, c);
    if (!strcmp(url, "/v1/jobs")) {
        if (!strcmp(method, "GET")) return list_jobs(h, s, c);
        if (!strcmp(method, "POST")) {
            if (role < 2) return send_error(c, 403, "submitting needs an admin token");
            return post_job(h, s, c, req);
        }
        return send_error(c, 405, "method not allowed here");
    }
    if (!strcmp(url, "/v1/jobs/counts"))
        return strcmp(method, "GET") ? send_error(c, 405, "method not allowed here") : job_counts(s, c);
    if (!strcmp(url, "/v1/jobs/bulk"))
        return strcmp(method, "POST") ? send_error(c, 405, "method not allowed here") : job_bulk(s, c, req);
    if (!strcmp(url, "/v1/stats"))
        return strcmp(method, "GET") ? send_error(c, 405, "method not allowed here") : stats_answer(s, c);
    if (!strncmp(url, "/v1/jobs/", 9)) return job_route(h, s, c, method, url + 9, role);
    if (!strncmp(url, "/v1/schedules", 13) && (!url[13] || url[13] == '/'))
        return schedules_route(h, s, c, method, url + 13, req);
    if (!strcmp(url, "/v1/store") || !strcmp(url, "/v1/runs")) return store_summary(s, c, url, method);
    return send_error(c, 404, "no such endpoint");
}

/* Takes a free catalog connection (opened on first use), waiting while all
 * are in use; -1 when one cannot be opened. */
static int pool_take(http_api *h)
{
    pthread_mutex_lock(&h->mu);
    int slot = -1;
    for (;;) {
        for (int i = 0; i < HTTP_STORE_POOL && slot < 0; i++)
            if (!h->busy[i]) slot = i;
        if (slot >= 0) break;
        pthread_cond_wait(&h->freed, &h->mu);
    }
    h->busy[slot] = true;
    pthread_mutex_unlock(&h->mu);
    if (!h->pool[slot].home && store_open(&h->pool[slot], h->home) < 0) {
        memset(&h->pool[slot], 0, sizeof h->pool[slot]);
        pthread_mutex_lock(&h->mu);
        h->busy[slot] = false;
        pthread_cond_signal(&h->freed);
        pthread_mutex_unlock(&h->mu);
        return -1;
    }
    return slot;
}

static void pool_give(http_api *h, int slot)
{
    pthread_mutex_lock(&h->mu);
    h->busy[slot] = false;
    pthread_cond_signal(&h->freed);
    pthread_mutex_unlock(&h->mu);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    http_api *h = cls;
    (void)version;
    request *req = *con_cls;
    if (!req) {
        req = calloc(1, sizeof *req);
        if (!req) return MHD_NO;
        *con_cls = req;
        http_answer_reset();
        req->t0 = ckpt_now();
        req->method = ckpt_strndup(method, 16);
        req->path = ckpt_strndup(url, 1024);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        uint64_t len;
        /* A length that is not a number is too big to trust; libmicrohttpd rejects it too. */
        if (cl && (ckpt_parse_u64_field("Content-Length", cl, 0, UINT64_MAX, &len) < 0 || len > HTTP_MAX_BODY))
            req->too_big = true;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!req->too_big && req->len + *upload_size <= HTTP_MAX_BODY) {
            char *b = realloc(req->body, req->len + *upload_size + 1);
            if (!b) return MHD_NO;
            memcpy(b + req->len, upload, *upload_size);
            req->body = b;
            req->len += *upload_size;
            req->body[req->len] = 0;
        } else {
            req->too_big = true; /* keep reading and dropping, then answer 413 */
        }
        *upload_size = 0;
        return MHD_YES;
    }
    /* /healthz needs no store and waits for nothing. */
    if (!strcmp(url, "/healthz"))
        return send_json(c, 200,
                         json_pack("{s:s,s:i}", "status", "ok", "workers", h->running ? atomic_load(h->running) : 0));
    /* The dashboard's page holds no data: it loads without a token, then
     * calls the API below with the one typed into it. */
    bool handled;
    enum MHD_Result dr = dashboard_route(c, url, method, &handled);
    if (handled) return dr;
    int slot = pool_take(h);
    if (slot < 0) return send_error(c, 500, ckpt_error_last());
    enum MHD_Result r = route(h, &h->pool[slot], c, url, method, req);
    pool_give(h, slot);
    return r;
}

/* The end of a request: its access log line and its figures. The query is
 * left out of the path (it is not logged at all), and tokens travel only in
 * the Authorization header, which is never logged. */
static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    http_api *h = cls;
    (void)c;
    request *req = *con_cls;
    if (req) {
        http_answer a = http_answer_get();
        if (req->method && !strcmp(req->method, "HEAD")) a.bytes = 0; /* headers only: no body went out */
        double secs = ckpt_now() - req->t0;
        const char *path = req->path ? req->path : "";
        const char *route = metrics_route(path);
        metrics_observe_http(h->m, route, a.status, secs, a.bytes);
        ckpt_event(toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? CKPT_EV_INFO : CKPT_EV_WARN, "http.request",
                   json_pack("{s:s,s:s,s:s,s:i,s:I,s:f,s:s?}", "method", req->method ? req->method : "", "path", path,
                             "route", route, "status", (int)a.status, "bytes", (json_int_t)a.bytes, "seconds", secs,
                             "aborted", toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? NULL : "connection cut"));
        free(req->method);
        free(req->path);
        free(req->body);
        free(req);
    }
    *con_cls = NULL;
}

int http_api_start(http_api **out, const http_api_opts *o)
{
    http_api *h = calloc(1, sizeof *h);
    if (!h) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->freed, NULL);
    h->running = o->running_workers;
    h->workers_max = o->workers;
    h->m = metrics_new();
    h->roots = o->allow_roots;
    int rc = o->token_file ? load_tokens(h, o->token_file) : 0;
    char host[64] = "127.0.0.1";
    unsigned port = 8470;
    if (!rc && o->listen) {
        const char *colon = strrchr(o->listen, ':');
        if (!colon || (size_t)(colon - o->listen) >= sizeof host || sscanf(colon + 1, "%u", &port) != 1 || port > 65535)
            rc = ckpt_error_set(CKPT_EINVAL, "--listen '%s' is not HOST:PORT", o->listen);
        else snprintf(host, sizeof host, "%.*s", (int)(colon - o->listen), o->listen);
    }
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (!rc && inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        rc = ckpt_error_set(CKPT_EINVAL, "--listen host '%s' is not an IPv4 address", host);
    if (!rc && !h->ntokens && ntohl(sa.sin_addr.s_addr) >> 24 != 127) {
        ckpt_warn("no --token-file: listening on loopback only (127.0.0.1), not %s", host);
        inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
        snprintf(host, sizeof host, "127.0.0.1");
    }
    if (!rc) rc = store_open(&h->pool[0], o->home); /* the first connection: CKPT_HOME must open */
    if (!rc && !(h->home = ckpt_strdup(h->pool[0].home))) rc = CKPT_ENOMEM;
    if (!rc) {
        /* A thread per connection: a slow client or a long recipe assembly holds up no one else. */
        h->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL |
                                      MHD_USE_ERROR_LOG,
                                  0, NULL, NULL, handler, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                                  MHD_OPTION_NOTIFY_COMPLETED, completed, h, MHD_OPTION_CONNECTION_TIMEOUT,
                                  (unsigned)(o->idle_timeout > 0 ? o->idle_timeout : HTTP_IDLE_TIMEOUT_DEFAULT),
                                  MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_MAX_CONNECTIONS,
                                  MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                  (unsigned)(o->per_ip > 0 ? o->per_ip : HTTP_PER_IP_DEFAULT),
                                  MHD_OPTION_UNESCAPE_CALLBACK, http_keep_raw, NULL, MHD_OPTION_END);
        if (!h->mhd) rc = ckpt_error_set(CKPT_EIO, "cannot listen on %s:%u (in use?)", host, port);
    }
    if (!rc) {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_BIND_PORT);
        snprintf(h->url, sizeof h->url, "http://%s:%u", host, di ? di->port : port);
        if (!h->ntokens) ckpt_info("no --token-file: the API is open to this machine only (loopback)");
        *out = h;
        return 0;
    }
    http_api_stop(h);
    return rc;
}

metrics *http_api_metrics(http_api *h)
{
    return h ? h->m : NULL;
}

const char *http_api_url(const http_api *h)
{
    return h->url;
}

void http_api_stop(http_api *h)
{
    if (!h) return;
    if (h->mhd) MHD_stop_daemon(h->mhd);
    for (int i = 0; i < HTTP_STORE_POOL; i++)
        if (h->pool[i].home) store_close(&h->pool[i]);
    free(h->home);
    pthread_cond_destroy(&h->freed);
    free(h->tokens);
    metrics_free(h->m);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

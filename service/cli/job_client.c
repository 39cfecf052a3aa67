/* job_client.c — job operations, locally through SQLite or remotely over HTTP (see job_client.h). */
#include "service/cli/job_client.h"

#include "service/cli/cli.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/util.h"
#include "service/jobs/queue.h"
#include "service/jobs/queue_admin.h"
#include "store/store.h"

#include <ctype.h>
#include <curl/curl.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#define CLIENT_MAX_REPLY (64u << 20)

int job_client_open(job_client *c, const char *home, const char *server)
{
    memset(c, 0, sizeof *c);
    const char *tok = getenv("CKPT_TOKEN");
    server = cli_server(server, home);
    if (server) {
        c->server = ckpt_strdup(server);
        size_t n = c->server ? strlen(c->server) : 0;
        while (n > 0 && c->server[n - 1] == '/') c->server[--n] = 0;
        if (tok && *tok) c->token = ckpt_strdup(tok);
        return c->server ? 0 : CKPT_ENOMEM;
    }
    ckpt_store s;
    int rc = store_open(&s, home);
    if (rc) return rc;
    /* Keep the catalog, drop the rest of the store handle. */
    c->cat = s.cat;
    memset(&s.cat, 0, sizeof s.cat);
    store_close(&s);
    c->open = true;
    return 0;
}

void job_client_close(job_client *c)
{
    if (c->open) catalog_close(&c->cat);
    free(c->server);
    free(c->token);
    memset(c, 0, sizeof *c);
}

/* ---- remote ---- */

typedef struct {
    char *buf;
    size_t len;
    bool too_big;
} reply;

static size_t on_data(char *p, size_t size, size_t n, void *ctx)
{
    reply *r = ctx;
    size_t add = size * n;
    if (r->len + add > CLIENT_MAX_REPLY) {
        r->too_big = true;
        return 0;
    }
    char *b = realloc(r->buf, r->len + add + 1);
    if (!b) return 0;
    memcpy(b + r->len, p, add);
    r->buf = b;
    r->len += add;
    r->buf[r->len] = 0;
    return add;
}

int job_client_call(job_client *c, const char *method, const char *path, const json_t *body, json_t **out, long *status)
{
    long ignored;
    if (!status) status = &ignored;
    CURL *h = curl_easy_init();
    if (!h) return ckpt_error_set(CKPT_ENOMEM, "cannot start libcurl");
    char *url = ckpt_sprintf("%s%s", c->server, path);
    char *payload = body ? json_dumps(body, JSON_COMPACT) : NULL;
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    char *auth = c->token ? ckpt_sprintf("Authorization: Bearer %s", c->token) : NULL;
    if (auth) hdr = curl_slist_append(hdr, auth);
    reply r = {0};
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (payload) curl_easy_setopt(h, CURLOPT_POSTFIELDS, payload);
    CURLcode cc = curl_easy_perform(h);
    int rc = 0;
    *status = 0;
    if (cc != CURLE_OK) rc = ckpt_error_set(CKPT_EIO, "%s: %s", c->server, curl_easy_strerror(cc));
    else curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    *out = NULL;
    if (!rc) {
        json_error_t err;
        *out = json_loadb(r.buf ? r.buf : "", r.len, 0, &err);
        if (*status >= 400) {
            const char *msg = json_string_value(json_object_get(*out, "error"));
            rc = ckpt_error_set(*status == 404 ? CKPT_ENOTFOUND : *status == 401 || *status == 403 ? CKPT_EINVAL : CKPT_EIO,
                                "%s: HTTP %ld: %s", c->server, *status, msg ? msg : "error");
            json_decref(*out);
            *out = NULL;
        } else if (!*out) {
            rc = ckpt_error_set(CKPT_EIO, "%s: the answer is not JSON", c->server);
        }
    }
    free(r.buf);
    free(url);
    free(payload);
    free(auth);
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    return rc;
}

/* ---- both ---- */

static int local_job(job_client *c, int64_t id, json_t **job)
{
    return queue_job_detail(&c->cat, id, job);
}

int job_client_submit(job_client *c, const char *kind, json_t *args, const queue_submit_opts *o, json_t **job,
                      bool *existed)
{
    *existed = false;
    if (c->server) {
        json_t *body = json_pack("{s:s,s:O,s:i}", "kind", kind, "args", args, "priority", o->priority);
        if (o->depends_on) json_object_set_new(body, "depends_on", json_integer(o->depends_on));
        if (o->max_attempts) json_object_set_new(body, "max_attempts", json_integer(o->max_attempts));
        long status;
        int rc = job_client_call(c, "POST", "/v1/jobs", body, job, &status);
        json_decref(body);
        *existed = status == 200;
        return rc;
    }
    int64_t id;
    int rc = queue_submit(&c->cat, kind, args, o, &id, existed);
    return rc ? rc : local_job(c, id, job);
}

int job_client_get(job_client *c, int64_t id, json_t **job)
{
    if (!c->server) return local_job(c, id, job);
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)id);
    long st;
    return job_client_call(c, "GET", path, NULL, job, &st);
}

int job_client_list(job_client *c, const char *state, int limit, json_t **jobs)
{
    if (c->server) {
        char path[128];
        snprintf(path, sizeof path, "/v1/jobs?limit=%d%s%s", limit, state ? "&state=" : "", state ? state : "");
        json_t *r;
        int rc = job_client_call(c, "GET", path, NULL, &r, NULL);
        if (rc) return rc;
        *jobs = json_incref(json_object_get(r, "jobs"));
        json_decref(r);
        return json_is_array(*jobs) ? 0 : ckpt_error_set(CKPT_EIO, "%s: no 'jobs' in the answer", c->server);
    }
    queue_job *list;
    size_t n;
    int rc = queue_list(&c->cat, state, limit, &list, &n);
    if (rc) return rc;
    *jobs = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(*jobs, queue_job_json(&list[i]));
    queue_jobs_free(list, n);
    return 0;
}

int job_client_cancel(job_client *c, int64_t id, json_t **job)
{
    if (c->server) {
        char path[64];
        snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)id);
        long st;
        return job_client_call(c, "DELETE", path, NULL, job, &st);
    }
    bool running;
    int rc = queue_cancel(&c->cat, id, &running);
    return rc ? rc : local_job(c, id, job);
}

int job_client_retry(job_client *c, int64_t id, json_t **job)
{
    if (c->server) {
        char path[64];
        snprintf(path, sizeof path, "/v1/jobs/%lld/retry", (long long)id);
        long st;
        return job_client_call(c, "POST", path, NULL, job, &st);
    }
    int rc = queue_retry(&c->cat, id);
    return rc ? rc : local_job(c, id, job);
}

int job_client_logs(job_client *c, int64_t id, int64_t after, json_t **lines, int64_t *last)
{
    if (c->server) {
        char path[96];
        snprintf(path, sizeof path, "/v1/jobs/%lld/logs?after=%lld", (long long)id, (long long)after);
        json_t *r;
        long st;
        int rc = job_client_call(c, "GET", path, NULL, &r, &st);
        if (rc) return rc;
        *lines = json_incref(json_object_get(r, "lines"));
        *last = json_integer_value(json_object_get(r, "last"));
        json_decref(r);
        return 0;
    }
    json_t *j;
    int rc = local_job(c, id, &j);
    if (rc) return rc;
    json_decref(j);
    return queue_logs(&c->cat, id, after, lines, last);
}

char *job_client_escape(const char *s)
{
    size_t n = strlen(s);
    char *out = ckpt_malloc(3 * n + 1), *o = out;
    if (!out) return NULL;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (isalnum(*p) || strchr("-._~@:", *p)) *o++ = (char)*p;
        else o += sprintf(o, "%%%02X", *p);
    }
    *o = 0;
    return out;
}

int job_client_run(job_client *c, const char *kind, json_t *args, json_t **result)
{
    *result = NULL;
    json_t *job = NULL;
    bool existed;
    int rc = job_client_submit(c, kind, args, &(queue_submit_opts){0}, &job, &existed);
    int64_t id = json_integer_value(json_object_get(job, "id"));
    for (int polls = 0; !rc; polls++) {
        const char *st = json_string_value(json_object_get(job, "state"));
        if (st && !strcmp(st, "succeeded")) {
            *result = json_incref(json_object_get(job, "result"));
            break;
        }
        if (st && (!strcmp(st, "failed") || !strcmp(st, "cancelled"))) {
            const char *err = json_string_value(json_object_get(job, "error"));
            rc = ckpt_error_set(CKPT_EIO, "%s job %lld %s: %s", kind, (long long)id, st, err ? err : "no message");
            break;
        }
        /* a poll of the job's state: 25 ms at first, then 200 ms */
        struct timespec ts = {0, (polls < 8 ? 25 : 200) * 1000000L};
        nanosleep(&ts, NULL);
        json_decref(job);
        job = NULL;
        rc = job_client_get(c, id, &job);
    }
    json_decref(job);
    return rc;
}

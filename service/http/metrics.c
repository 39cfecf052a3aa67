/* metrics.c — the daemon's /metrics figures (see metrics.h). */
#include "service/http/metrics.h"

#include "common/util.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Seconds: from a quick API answer to a long conversion. */
static const double bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 7200};
#define NBOUNDS (sizeof bounds / sizeof bounds[0])
/* Series per family: labels come from fixed sets (routes, codes, kinds), so
 * this bounds memory without ever being reached in practice. */
#define MAX_SERIES 256
#define LABELS_MAX 160

typedef struct {
    char labels[LABELS_MAX]; /* route="/v1/jobs",code="200" */
    uint64_t bucket[NBOUNDS]; /* counts per bound, not cumulative (summed when rendered) */
    uint64_t count;
    double sum;
} series;

typedef struct {
    series v[MAX_SERIES];
    size_t n;
} family;

struct metrics {
    pthread_mutex_t mu;
    family http, job, wait;
    uint64_t fetched, converted, served;
};

metrics *metrics_new(void)
{
    metrics *m = ckpt_calloc(1, sizeof *m);
    if (m) pthread_mutex_init(&m->mu, NULL);
    return m;
}

void metrics_free(metrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

/* A label value as the exposition format quotes it: \\, \" and \n escaped. */
static void label_value(char *out, size_t cap, const char *v)
{
    size_t n = 0;
    for (; *v && n + 3 < cap; v++) {
        if (*v == '\\' || *v == '"') out[n++] = '\\';
        if (*v == '\n') {
            out[n++] = '\\';
            out[n++] = 'n';
            continue;
        }
        out[n++] = *v;
    }
    out[n] = 0;
}

static void observe(family *f, const char *labels, double value)
{
    series *s = NULL;
    for (size_t i = 0; i < f->n && !s; i++)
        if (!strcmp(f->v[i].labels, labels)) s = &f->v[i];
    if (!s) {
        if (f->n == MAX_SERIES) return;
        s = &f->v[f->n++];
        snprintf(s->labels, sizeof s->labels, "%s", labels);
    }
    size_t b = 0;
    while (b < NBOUNDS && value > bounds[b]) b++;
    if (b < NBOUNDS) s->bucket[b]++;
    s->count++;
    s->sum += value;
}

/* k1="v1"[,k2="v2"] into out, the values escaped (k2 NULL: one label). */
static void make_labels(char out[LABELS_MAX], const char *k1, const char *v1, const char *k2, const char *v2)
{
    char e1[96], e2[48];
    label_value(e1, sizeof e1, v1);
    if (k2) label_value(e2, sizeof e2, v2);
    int n = snprintf(out, LABELS_MAX, k2 ? "%s=\"%s\",%s=\"%s\"" : "%s=\"%s\"", k1, e1, k2 ? k2 : "", k2 ? e2 : "");
    if (n < 0) out[0] = 0; /* a longer value is cut, as label_value cuts it */
}

void metrics_observe_http(metrics *m, const char *route, unsigned code, double seconds, uint64_t bytes)
{
    if (!m) return;
    char labels[LABELS_MAX], c[16];
    snprintf(c, sizeof c, "%u", code);
    make_labels(labels, "route", route, "code", c);
    pthread_mutex_lock(&m->mu);
    observe(&m->http, labels, seconds);
    m->served += bytes;
    pthread_mutex_unlock(&m->mu);
}

void metrics_observe_job(metrics *m, const char *kind, const char *outcome, double run_seconds, uint64_t bytes)
{
    if (!m) return;
    char labels[LABELS_MAX];
    make_labels(labels, "kind", kind, "outcome", outcome);
    bool ok = !strcmp(outcome, "succeeded");
    pthread_mutex_lock(&m->mu);
    observe(&m->job, labels, run_seconds);
    if (ok && !strcmp(kind, "fetch")) m->fetched += bytes;
    else if (ok && (!strcmp(kind, "convert") || !strcmp(kind, "merge-lora") || !strcmp(kind, "unmerge-lora")))
        m->converted += bytes;
    pthread_mutex_unlock(&m->mu);
}

uint64_t metrics_served_bytes(metrics *m)
{
    if (!m) return 0;
    pthread_mutex_lock(&m->mu);
    uint64_t n = m->served;
    pthread_mutex_unlock(&m->mu);
    return n;
}

void metrics_observe_wait(metrics *m, const char *kind, double wait_seconds)
{
    if (!m) return;
    char labels[LABELS_MAX];
    make_labels(labels, "kind", kind, NULL, NULL);
    pthread_mutex_lock(&m->mu);
    observe(&m->wait, labels, wait_seconds < 0 ? 0 : wait_seconds);
    pthread_mutex_unlock(&m->mu);
}

static void render_histogram(FILE *f, const char *name, const char *help, const family *fam)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (size_t i = 0; i < fam->n; i++) {
        const series *s = &fam->v[i];
        uint64_t cum = 0;
        for (size_t b = 0; b < NBOUNDS; b++) {
            cum += s->bucket[b];
            fprintf(f, "%s_bucket{%s,le=\"%g\"} %llu\n", name, s->labels, bounds[b], (unsigned long long)cum);
        }
        fprintf(f, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, s->labels, (unsigned long long)s->count);
        fprintf(f, "%s_sum{%s} %.6f\n", name, s->labels, s->sum);
        fprintf(f, "%s_count{%s} %llu\n", name, s->labels, (unsigned long long)s->count);
    }
}

static void render_counter(FILE *f, const char *name, const char *help, uint64_t v)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, (unsigned long long)v);
}

static void render_gauge(FILE *f, const char *name, const char *help, double v)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n%s %.17g\n", name, help, name, name, v);
}

void metrics_render(metrics *m, const metrics_now *now, FILE *f)
{
    static const char *const states[] = {"queued", "running", "succeeded", "failed", "cancelled"};
    fprintf(f, "# HELP ckpt_queue_jobs Jobs in the queue by state (finished ones until --keep-jobs prunes them).\n"
               "# TYPE ckpt_queue_jobs gauge\n");
    for (size_t i = 0; i < CKPT_ARRAY_LEN(states); i++) {
        long long n = 0;
        size_t k;
        json_t *row;
        json_array_foreach(now->queue, k, row) if (!strcmp(json_string_value(json_object_get(row, "state")), states[i]))
            n += json_integer_value(json_object_get(row, "count"));
        fprintf(f, "ckpt_queue_jobs{state=\"%s\"} %lld\n", states[i], n);
    }
    render_gauge(f, "ckpt_workers_busy", "Worker processes running a job.", now->workers_busy);
    render_gauge(f, "ckpt_workers_max", "Worker processes the daemon may run (--workers).", now->workers_max);
    if (now->store) {
        static const struct {
            const char *key, *name, *help;
        } g[] = {
            {"logical_bytes", "ckpt_store_logical_bytes", "Bytes of every file of every stored checkpoint."},
            {"physical_bytes", "ckpt_store_physical_bytes", "Bytes of the blob files on disk."},
            {"blobs", "ckpt_store_blobs", "Blobs in the store."},
            {"checkpoints", "ckpt_store_checkpoints", "Stored checkpoints (originals and layouts)."},
        };
        for (size_t i = 0; i < CKPT_ARRAY_LEN(g); i++)
            render_gauge(f, g[i].name, g[i].help, (double)json_integer_value(json_object_get(now->store, g[i].key)));
    }
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    render_histogram(f, "ckpt_job_duration_seconds", "How long jobs ran, by kind and outcome.", &m->job);
    render_histogram(f, "ckpt_job_queue_wait_seconds", "How long jobs waited from submission to start, by kind.",
                     &m->wait);
    render_histogram(f, "ckpt_http_request_duration_seconds",
                     "HTTP requests by route pattern and status code, until the answer was sent.", &m->http);
    render_counter(f, "ckpt_fetched_bytes_total", "Bytes fetched from a Hub by fetch jobs that succeeded.", m->fetched);
    render_counter(f, "ckpt_converted_bytes_total", "Bytes of layouts written by convert and LoRA jobs that succeeded.",
                   m->converted);
    render_counter(f, "ckpt_served_bytes_total", "Body bytes of HTTP answers sent.", m->served);
    pthread_mutex_unlock(&m->mu);
}

const char *metrics_route(const char *path)
{
    static const char *const exact[] = {"/healthz",  "/metrics",   "/v1/jobs",  "/v1/jobs/counts", "/v1/jobs/bulk",
                                        "/v1/stats", "/v1/store",  "/v1/runs",  "/v1/checkpoints", "/v1/schedules"};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(exact); i++)
        if (!strcmp(path, exact[i])) return exact[i];
    if (!strncmp(path, "/v1/jobs/", 9)) {
        const char *e = path + 9 + strspn(path + 9, "0123456789");
        return !strcmp(e, "/logs")     ? "/v1/jobs/{id}/logs"
               : !strcmp(e, "/retry")  ? "/v1/jobs/{id}/retry"
               : !strcmp(e, "/delete") ? "/v1/jobs/{id}/delete"
                                       : "/v1/jobs/{id}";
    }
    if (!strncmp(path, "/v1/schedules/", 14)) {
        const char *e = path + 14 + strspn(path + 14, "0123456789");
        return !strcmp(e, "/run")      ? "/v1/schedules/{id}/run"
               : !strcmp(e, "/pause")  ? "/v1/schedules/{id}/pause"
               : !strcmp(e, "/resume") ? "/v1/schedules/{id}/resume"
                                       : "/v1/schedules/{id}";
    }
    if (!strncmp(path, "/v1/checkpoints/", 16)) {
        const char *e = strchr(path + 16, '/');
        if (!e) return "/v1/checkpoints/{ref}";
        if (!strncmp(e, "/files/", 7)) return "/v1/checkpoints/{ref}/files/{path}";
        if (!strncmp(e, "/archive.tar", 12)) return "/v1/checkpoints/{ref}/archive";
        return "other";
    }
    if (!strncmp(path, "/api/models/", 12)) {
        /* /api/models/ORG/NAME[/what/...] */
        const char *p = strchr(path + 12, '/');
        p = p ? strchr(p + 1, '/') : NULL;
        if (!p) return "/api/models/{repo}";
        static const char *const what[][2] = {{"/revision/", "/api/models/{repo}/revision/{revision}"},
                                              {"/tree/", "/api/models/{repo}/tree/{revision}"},
                                              {"/paths-info/", "/api/models/{repo}/paths-info/{revision}"},
                                              {"/commits/", "/api/models/{repo}/commits/{revision}"},
                                              {"/refs", "/api/models/{repo}/refs"}};
        for (size_t i = 0; i < CKPT_ARRAY_LEN(what); i++)
            if (!strncmp(p, what[i][0], strlen(what[i][0]))) return what[i][1];
        return "other";
    }
    /* /ORG/NAME/resolve|raw/REV/PATH */
    const char *p = path[0] == '/' ? strchr(path + 1, '/') : NULL;
    p = p ? strchr(p + 1, '/') : NULL;
    if (p && !strncmp(p, "/resolve/", 9)) return "/{repo}/resolve/{revision}/{path}";
    if (p && !strncmp(p, "/raw/", 5)) return "/{repo}/raw/{revision}/{path}";
    return "other";
}

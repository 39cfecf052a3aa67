/* log.c — stderr messages and progress lines. */
#include "common/log.h"

#include "common/util.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>

static ckpt_log_level log_level = CKPT_LOG_INFO;
static ckpt_progress_sink_fn progress_sink;

void ckpt_progress_set_sink(ckpt_progress_sink_fn fn)
{
    progress_sink = fn;
}

void ckpt_log_set_level(ckpt_log_level level)
{
    log_level = level;
}

ckpt_log_level ckpt_log_get_level(void)
{
    return log_level;
}

static int events_on; /* ckpt_event_setup was called: messages are events too */

static void vlog(const char *prefix, const char *fmt, va_list ap)
{
    char buf[4096];
    vsnprintf(buf, sizeof buf, fmt, ap);
    if (events_on) /* the daemon: one format for every line of its log */
        ckpt_event(*prefix == 'c' ? CKPT_EV_WARN : *prefix == 'd' ? CKPT_EV_DEBUG : CKPT_EV_INFO,
                   *prefix == 'c' ? "warning" : "message", json_pack("{s:s}", "message", buf));
    else fprintf(stderr, "%s%s\n", prefix, buf);
}

void ckpt_info(const char *fmt, ...)
{
    if (log_level < CKPT_LOG_INFO) return;
    va_list ap;
    va_start(ap, fmt);
    vlog("", fmt, ap);
    va_end(ap);
}

void ckpt_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog("ckpt: warning: ", fmt, ap);
    va_end(ap);
}

void ckpt_debug(const char *fmt, ...)
{
    if (log_level < CKPT_LOG_DEBUG) return;
    va_list ap;
    va_start(ap, fmt);
    vlog("debug: ", fmt, ap);
    va_end(ap);
}

void ckpt_progress_start(ckpt_progress *p, const char *label, uint64_t total)
{
    p->label = label;
    p->total = total;
    p->done = p->base = 0;
    p->tensors = p->tensors_total = 0;
    p->no_plain = 0;
    p->started = p->last_draw = ckpt_now();
    p->last_pct = -1;
    p->tty = isatty(STDERR_FILENO);
}

void ckpt_progress_rate(const ckpt_progress *p, double now, double *rate, double *eta)
{
    double el = now - p->started;
    uint64_t moved = p->done > p->base ? p->done - p->base : 0;
    *rate = el > 0 ? (double)moved / el : 0;
    if (p->total && p->done >= p->total) *eta = 0;
    else if (p->total && *rate > 0) *eta = (double)(p->total - p->done) / *rate;
    else *eta = -1;
}

static void draw(ckpt_progress *p, int final)
{
    double pct = p->total ? 100.0 * (double)p->done / (double)p->total : 100.0;
    char d[32], t[32];
    ckpt_format_size(p->done, d, sizeof d);
    ckpt_format_size(p->total, t, sizeof t);
    double bps, left;
    ckpt_progress_rate(p, ckpt_now(), &bps, &left);
    double rate = bps / 1048576.0;
    if (p->tty) {
        int width = 30, fill = (int)(pct * width / 100.0);
        char bar[64], eta[32] = "--:--";
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = 0;
        if (final || p->done >= p->total)
            snprintf(eta, sizeof eta, "0:00");
        else if (left >= 0 && left < 100 * 3600.0)
            snprintf(eta, sizeof eta, "%d:%02d", (int)left / 60, (int)left % 60);
        char tensors[64] = "";
        if (p->tensors_total)
            snprintf(tensors, sizeof tensors, " %llu/%llu tensors", (unsigned long long)(final ? p->tensors_total : p->tensors),
                     (unsigned long long)p->tensors_total);
        /* \033[K clears what a longer earlier line left on the right */
        fprintf(stderr, "\r%s [%s] %5.1f%% %s/%s%s %.1f MiB/s ETA %s\033[K%s", p->label, bar, pct, d, t, tensors, rate,
                eta, final ? "\n" : "");
    } else if (!p->no_plain) {
        fprintf(stderr, "%s: %.0f%% %s/%s %.0f MiB/s\n", p->label, pct, d, t, rate);
    }
}

static void sink_report(const ckpt_progress *p, double now)
{
    double rate, eta;
    ckpt_progress_rate(p, now, &rate, &eta);
    progress_sink(p, rate, eta);
}

void ckpt_progress_update(ckpt_progress *p, uint64_t done)
{
    p->done = done;
    if (progress_sink) {
        double t = ckpt_now();
        /* The first update goes out at once: the phase shows as soon as it starts. */
        if (p->last_pct < 0 || t - p->last_draw >= 0.25 || done == p->total) {
            p->last_draw = t;
            p->last_pct = 0;
            sink_report(p, t);
        }
        return;
    }
    if (log_level < CKPT_LOG_INFO) return;
    double now = ckpt_now();
    int pct = p->total ? (int)(100.0 * (double)done / (double)p->total) : 100;
    /* Plain lines (logs, CI) only for work that lasts: first after 2 s, then every 5 s. */
    bool due = p->tty ? now - p->last_draw >= 0.1
                      : now - p->started >= 2.0 && (now - p->last_draw >= 5.0 || p->last_pct < 0);
    if (due) {
        p->last_draw = now;
        p->last_pct = pct;
        draw(p, 0);
    }
}

void ckpt_progress_tensors(ckpt_progress *p, uint64_t tensors, uint64_t tensors_total)
{
    p->tensors = tensors;
    p->tensors_total = tensors_total;
}

void ckpt_progress_finish(ckpt_progress *p)
{
    if (progress_sink) {
        p->done = p->total;
        p->tensors = p->tensors_total;
        sink_report(p, ckpt_now());
        return;
    }
    if (log_level < CKPT_LOG_INFO) return;
    p->done = p->total;
    if (p->tty) draw(p, 1);
}

static int event_json;
static ckpt_event_level event_level = CKPT_EV_INFO;

static const char *const event_names[] = {"error", "warn", "info", "debug"};

int ckpt_event_level_parse(const char *text)
{
    for (int i = 0; i < 4; i++)
        if (text && !strcmp(text, event_names[i])) return i;
    return -1;
}

void ckpt_event_setup(int json, ckpt_event_level level)
{
    events_on = 1;
    event_json = json;
    event_level = level;
}

int ckpt_event_enabled(ckpt_event_level level)
{
    return level <= event_level;
}

/* s into out as text, quoted when needed, control characters as \xNN. */
static void text_value(const char *s, char *out, size_t cap)
{
    bool quote = !*s || strpbrk(s, " \"=") != NULL;
    size_t n = 0;
    if (quote && n + 1 < cap) out[n++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p && n + 5 < cap; p++) {
        if (*p < 0x20 || *p == 0x7f) n += (size_t)snprintf(out + n, cap - n, "\\x%02x", *p);
        else if (*p == '"' || *p == '\\') {
            out[n++] = '\\';
            out[n++] = (char)*p;
        } else out[n++] = (char)*p;
    }
    if (quote && n + 1 < cap) out[n++] = '"';
    out[n] = 0;
}

void ckpt_event(ckpt_event_level level, const char *event, json_t *fields)
{
    if (!ckpt_event_enabled(level)) {
        json_decref(fields);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40], tail[24];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(tail, sizeof tail, ".%03dZ", (int)(ts.tv_nsec / 1000000));
    strncat(when, tail, sizeof when - strlen(when) - 1);
    char line[8192];
    size_t n = 0;
    if (event_json) {
        json_t *o = json_pack("{s:s,s:s,s:s}", "time", when, "level", event_names[level], "event", event);
        const char *k;
        json_t *v;
        json_object_foreach(fields, k, v) if (o && !json_is_null(v)) json_object_set(o, k, v); /* absent, not null */
        char *text = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        n = (size_t)snprintf(line, sizeof line, "%s", text ? text : "{}");
        free(text);
        json_decref(o);
    } else {
        n = (size_t)snprintf(line, sizeof line, "%s %s %s", when, event_names[level], event);
        const char *k;
        json_t *v;
        json_object_foreach(fields, k, v)
        {
            char val[2048];
            if (n >= sizeof line - 1) break;
            if (json_is_string(v)) text_value(json_string_value(v), val, sizeof val);
            else if (json_is_integer(v)) snprintf(val, sizeof val, "%lld", (long long)json_integer_value(v));
            else if (json_is_real(v)) snprintf(val, sizeof val, "%.3f", json_real_value(v));
            else if (json_is_null(v)) continue;
            else {
                char *d = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
                text_value(d ? d : "", val, sizeof val);
                free(d);
            }
            n += (size_t)snprintf(line + n, sizeof line - n, " %s=%s", k, val);
        }
    }
    if (n > sizeof line - 2) n = sizeof line - 2;
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, n);
    (void)w;
    json_decref(fields);
}

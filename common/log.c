/* log.c — stderr messages and progress lines. */
#include "common/log.h"

#include "common/util.h"

#include <stdarg.h>
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

static void vlog(const char *prefix, const char *fmt, va_list ap)
{
    char buf[4096];
    vsnprintf(buf, sizeof buf, fmt, ap);
    fprintf(stderr, "%s%s\n", prefix, buf);
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
    p->no_plain = 0;
    p->started = p->last_draw = ckpt_now();
    p->last_pct = -1;
    p->tty = isatty(STDERR_FILENO);
}

static void draw(ckpt_progress *p, int final)
{
    double el = ckpt_now() - p->started;
    double pct = p->total ? 100.0 * (double)p->done / (double)p->total : 100.0;
    char d[32], t[32];
    ckpt_format_size(p->done, d, sizeof d);
    ckpt_format_size(p->total, t, sizeof t);
    uint64_t moved = p->done > p->base ? p->done - p->base : 0;
    double bps = el > 0 ? (double)moved / el : 0, rate = bps / 1048576.0;
    if (p->tty) {
        int width = 30, fill = (int)(pct * width / 100.0);
        char bar[64], eta[32] = "--:--";
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = 0;
        if (final || p->done >= p->total)
            snprintf(eta, sizeof eta, "0:00");
        else if (bps > 0) {
            double left = (double)(p->total - p->done) / bps;
            if (left < 100 * 3600.0)
                snprintf(eta, sizeof eta, "%d:%02d", (int)left / 60, (int)left % 60);
        }
        /* \033[K clears what a longer earlier line left on the right */
        fprintf(stderr, "\r%s [%s] %5.1f%% %s/%s %.1f MiB/s ETA %s\033[K%s", p->label, bar, pct, d, t, rate, eta,
                final ? "\n" : "");
    } else if (!p->no_plain) {
        fprintf(stderr, "%s: %.0f%% %s/%s %.0f MiB/s\n", p->label, pct, d, t, rate);
    }
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
            progress_sink(p->label, done, p->total);
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

void ckpt_progress_finish(ckpt_progress *p)
{
    if (progress_sink) {
        progress_sink(p->label, p->total, p->total);
        return;
    }
    if (log_level < CKPT_LOG_INFO) return;
    p->done = p->total;
    if (p->tty) draw(p, 1);
}

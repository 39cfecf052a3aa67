/*
 * log.h — messages for people. ckpt_info/ckpt_warn go to stderr (stdout is
 * for data: ids, JSON, tar streams). Progress is drawn as a bar when stderr is
 * a terminal and as occasional plain lines otherwise.
 */
#ifndef CKPT_COMMON_LOG_H
#define CKPT_COMMON_LOG_H

#include <stdint.h>

typedef enum { CKPT_LOG_QUIET = 0, CKPT_LOG_INFO = 1, CKPT_LOG_DEBUG = 2 } ckpt_log_level;

void ckpt_log_set_level(ckpt_log_level level);
ckpt_log_level ckpt_log_get_level(void);
void ckpt_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ckpt_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ckpt_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Events of a long-running service (the daemon's log): one line each, to
 * stderr, written with one write(2) so lines of threads never mix.
 *   text: 2026-11-24T13:53:07.123Z info job.finished id=5 kind=convert seconds=1.234
 *   json: {"time": "...", "level": "info", "event": "job.finished", "id": 5, ...}
 * fields is a JSON object (taken; may be NULL): its string values are quoted
 * in text when they hold a space, '"' or '='; control characters are escaped.
 * Events below the level set are dropped. Once ckpt_event_setup has been
 * called (the daemon does), ckpt_info, ckpt_warn and ckpt_debug write events
 * too ("message", "warning"; the text in "message"), so the log has one format. */
typedef enum { CKPT_EV_ERROR = 0, CKPT_EV_WARN, CKPT_EV_INFO, CKPT_EV_DEBUG } ckpt_event_level;
/* "error", "warn", "info", "debug" -> the level; -1 for anything else. */
int ckpt_event_level_parse(const char *text);
void ckpt_event_setup(int json, ckpt_event_level level);
int ckpt_event_enabled(ckpt_event_level level);
struct json_t;
void ckpt_event(ckpt_event_level level, const char *event, struct json_t *fields);

/* Progress of one long task: call update as often as you like; it redraws at
 * most every 100 ms on a TTY (one line, rewritten: label, bar, percent,
 * done/total, rate, ETA) and every 5 s otherwise. */
typedef struct {
    const char *label;
    uint64_t total;
    uint64_t done;
    uint64_t base; /* done before this run (a resume): left out of the rate and ETA */
    uint64_t tensors, tensors_total; /* tensors finished, of how many (ckpt_progress_tensors; 0 of 0: not counted) */
    double started, last_draw;
    int last_pct;
    int tty;
    int no_plain; /* not on a TTY: draw nothing (the caller prints its own lines) */
} ckpt_progress;

/* When a sink is set (worker processes), progress goes to it, at most a few
 * times a second (the first update at once), instead of being drawn: p as
 * it stands (done, and tensors; at finish, done = total and tensors =
 * tensors_total), with its rate and time left now (ckpt_progress_rate). */
typedef void (*ckpt_progress_sink_fn)(const ckpt_progress *p, double rate, double eta);
void ckpt_progress_set_sink(ckpt_progress_sink_fn fn);

/* The rate of p at time `now`: the bytes this run moved (done - base: a
 * resumed download's earlier bytes left out) over the seconds since
 * ckpt_progress_start, in *rate (0 while nothing moved or no time passed),
 * and the seconds the rest needs at that rate in *eta (0 once done >= total;
 * -1 while unknown: no rate yet, or no total). The TTY line, the worker's
 * progress reports and so the dashboard's live progress all use it. */
void ckpt_progress_rate(const ckpt_progress *p, double now, double *rate, double *eta);

void ckpt_progress_start(ckpt_progress *p, const char *label, uint64_t total);
void ckpt_progress_update(ckpt_progress *p, uint64_t done);
/* Work counted in tensors as well as bytes: the next update (and finish)
 * carries "tensors of tensors_total" to the sink and the TTY line. */
void ckpt_progress_tensors(ckpt_progress *p, uint64_t tensors, uint64_t tensors_total);
void ckpt_progress_finish(ckpt_progress *p);

#endif

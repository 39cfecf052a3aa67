/* cron.c — cron expressions in UTC (see cron.h). */
#include "service/jobs/cron.h"

#include "common/error.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

typedef struct {
    const char *name;
    int lo, hi;
    const char *const *names; /* names of lo.., or NULL */
} field_def;

static const char *const month_names[] = {"jan", "feb", "mar", "apr", "may", "jun", "jul",
                                          "aug", "sep", "oct", "nov", "dec", NULL};
static const char *const dow_names[] = {"sun", "mon", "tue", "wed", "thu", "fri", "sat", NULL};

static const field_def fields[5] = {
    {"minute", 0, 59, NULL},          {"hour", 0, 23, NULL},
    {"day of month", 1, 31, NULL},    {"month", 1, 12, month_names},
    {"day of week", 0, 7, dow_names},
};

/* A number or a name at *p; advances *p. */
static bool read_value(const field_def *f, const char **p, int *v)
{
    const char *s = *p;
    if (isdigit((unsigned char)*s)) {
        long n = 0;
        while (isdigit((unsigned char)*s) && n < 1000)
            n = n * 10 + (*s++ - '0');
        if (isdigit((unsigned char)*s)) return false;
        *v = (int)n;
        *p = s;
        return true;
    }
    for (int i = 0; f->names && f->names[i]; i++) {
        if (!strncasecmp(s, f->names[i], 3) && !isalpha((unsigned char)s[3])) {
            *v = f->lo + i;
            *p = s + 3;
            return true;
        }
    }
    return false;
}

/* One field: a comma list of '*', N, N-M, each with an optional /STEP. */
static int parse_field(const field_def *f, const char *text, uint64_t *bits)
{
    *bits = 0;
    const char *p = text;
    for (;;) {
        int lo, hi, step = 1;
        bool single = false;
        if (*p == '*') {
            lo = f->lo;
            hi = f->hi;
            p++;
        } else {
            if (!read_value(f, &p, &lo)) goto bad;
            hi = lo;
            single = *p != '-';
            if (!single) {
                p++;
                if (!read_value(f, &p, &hi)) goto bad;
            }
        }
        if (*p == '/') {
            p++;
            if (!read_value(&fields[0], &p, &step) || step < 1) goto bad;
            if (single) hi = f->hi; /* "5/15": from 5 to the end */
        }
        if (lo < f->lo || hi > f->hi || lo > hi)
            return ckpt_error_set(CKPT_EINVAL, "cron %s '%s': values must be %d-%d", f->name, text,
                                  f->lo, f->hi);
        for (int v = lo; v <= hi; v += step)
            *bits |= 1ull << v;
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p) goto bad;
        return 0;
    }
bad:
    return ckpt_error_set(
        CKPT_EINVAL,
        "cron %s '%s': expected *, N, N-M, a list of those, each with an optional /STEP", f->name,
        text);
}

int cron_parse(const char *expr, cron_spec *out)
{
    memset(out, 0, sizeof *out);
    static const struct {
        const char *macro, *expr;
    } macros[] = {{"@hourly", "0 * * * *"},  {"@daily", "0 0 * * *"},   {"@midnight", "0 0 * * *"},
                  {"@weekly", "0 0 * * 0"},  {"@monthly", "0 0 1 * *"}, {"@yearly", "0 0 1 1 *"},
                  {"@annually", "0 0 1 1 *"}};
    if (!expr || strlen(expr) > CRON_MAX_EXPR)
        return ckpt_error_set(CKPT_EINVAL, "a cron expression must be 1-%d characters",
                              CRON_MAX_EXPR);
    for (size_t i = 0; i < sizeof macros / sizeof macros[0]; i++)
        if (!strcasecmp(expr, macros[i].macro)) expr = macros[i].expr;
    char buf[CRON_MAX_EXPR + 1], *f[6] = {0}, *save = NULL;
    snprintf(buf, sizeof buf, "%s", expr);
    int n = 0;
    for (char *t = strtok_r(buf, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
        if (n == 5)
            return ckpt_error_set(CKPT_EINVAL, "cron '%s': more than 5 fields (M H DOM MON DOW)",
                                  expr);
        f[n++] = t;
    }
    if (n != 5)
        return ckpt_error_set(
            CKPT_EINVAL, "cron '%s': expected 5 fields: minute hour day-of-month month day-of-week",
            expr);
    uint64_t b[5];
    for (int i = 0; i < 5; i++) {
        int rc = parse_field(&fields[i], f[i], &b[i]);
        if (rc) return rc;
    }
    out->minute = b[0];
    out->hour = (uint32_t)b[1];
    out->dom = (uint32_t)b[2];
    out->month = (uint32_t)b[3];
    out->dow = (uint32_t)((b[4] | (b[4] >> 7)) & 0x7f); /* 7 is Sunday too */
    out->dom_star = f[2][0] == '*';
    out->dow_star = f[4][0] == '*';
    return 0;
}

static bool day_matches(const cron_spec *c, const struct tm *tm)
{
    bool dom = c->dom >> tm->tm_mday & 1, dow = c->dow >> tm->tm_wday & 1;
    if (c->dom_star && c->dow_star) return true;
    if (c->dom_star) return dow;
    if (c->dow_star) return dom;
    return dom || dow;
}

int cron_next(const cron_spec *c, int64_t after, int64_t *next)
{
    time_t t = (time_t)(after - (after % 60 + 60) % 60 + 60); /* the next whole minute */
    time_t limit = (time_t)(after + CRON_HORIZON_SECONDS);
    struct tm tm;
    while (t <= limit) {
        gmtime_r(&t, &tm);
        if (!(c->month >> (tm.tm_mon + 1) & 1)) { /* first minute of the next month */
            tm.tm_mon++;
            tm.tm_mday = 1;
            tm.tm_hour = tm.tm_min = tm.tm_sec = 0;
            t = timegm(&tm);
        } else if (!day_matches(c, &tm)) {
            tm.tm_mday++;
            tm.tm_hour = tm.tm_min = tm.tm_sec = 0;
            t = timegm(&tm);
        } else if (!(c->hour >> tm.tm_hour & 1)) {
            tm.tm_hour++;
            tm.tm_min = tm.tm_sec = 0;
            t = timegm(&tm);
        } else if (!(c->minute >> tm.tm_min & 1)) {
            t += 60;
        } else {
            *next = (int64_t)t;
            return 0;
        }
    }
    return ckpt_error_set(CKPT_ENOTFOUND,
                          "the cron expression matches no time in the next 5 years");
}

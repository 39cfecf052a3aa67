/*
 * cron.h — five-field cron expressions, evaluated in UTC, for `ckpt sync add
 * --cron`.
 *
 *   "M H DOM MON DOW": minute 0-59, hour 0-23, day of month 1-31, month 1-12
 *   (or jan..dec), day of week 0-7 (0 and 7 are Sunday; or sun..sat). Each
 *   field is '*' or a list of N, N-M, with an optional /STEP ("*\/15",
 *   "1-5", "0,30", "mon-fri"). As in Vixie cron, when both DOM and DOW are
 *   restricted (neither starts with '*') a day matching either one counts.
 *   The macros @hourly, @daily (@midnight), @weekly, @monthly and @yearly
 *   (@annually) are accepted.
 *
 *   cron_spec c;
 *   if (cron_parse("30 2 * * mon", &c) < 0) ... // message names the field
 *   int64_t t; cron_next(&c, now, &t);           // first match after now
 */
#ifndef CKPT_SERVICE_JOBS_CRON_H
#define CKPT_SERVICE_JOBS_CRON_H

#include <stdbool.h>
#include <stdint.h>

#define CRON_MAX_EXPR 256
#define CRON_HORIZON_SECONDS (5LL * 366 * 86400) /* no match within 5 years: an impossible date */

typedef struct {
    uint64_t minute; /* bit m: minute m */
    uint32_t hour;   /* bit h */
    uint32_t dom;    /* bit d, 1..31 */
    uint32_t month;  /* bit m, 1..12 */
    uint32_t dow;    /* bit d, 0..6 */
    bool dom_star, dow_star;
} cron_spec;

int cron_parse(const char *expr, cron_spec *out);
/* The first whole minute strictly after `after` (unix seconds, UTC) that
 * matches; CKPT_ENOTFOUND when none does within CRON_HORIZON_SECONDS. */
int cron_next(const cron_spec *c, int64_t after, int64_t *next);

#endif

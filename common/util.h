/*
 * util.h — checked arithmetic, allocation that reports, and size parsing.
 *
 * Every size computed from outside input goes through ckpt_mul/ckpt_add so an
 * overflow becomes an error instead of a short allocation.
 */
#ifndef CKPT_COMMON_UTIL_H
#define CKPT_COMMON_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CKPT_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* *out = a * b; returns false on overflow. */
static inline bool ckpt_mul(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool ckpt_add(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

/* malloc/calloc/realloc/strdup that set the error message on failure. */
void *ckpt_malloc(size_t n);
void *ckpt_calloc(size_t count, size_t size);
void *ckpt_realloc(void *p, size_t n);
char *ckpt_strdup(const char *s);
char *ckpt_strndup(const char *s, size_t n);
/* asprintf into a fresh string; NULL (error set) on failure. */
char *ckpt_sprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Buffers of megabytes that are filled whole (decoded arrays, I/O slabs):
 * mapped on their own, aligned to 2 MiB (so to any smaller alignment,
 * O_DIRECT's too) and marked MADV_HUGEPAGE, so that a kernel whose
 * transparent huge pages are "madvise" (Debian's default) backs them with
 * 2 MiB pages: one page fault where 4 KiB pages take 512. On the virtual
 * machines measured, a first touch of a 4 KiB page cost 25-30 us (7-11 ms
 * per MiB: a second of CPU for 128 MiB), of a huge page about 0.1 ms per
 * MiB. Under 2 MiB, or under AddressSanitizer (its checks stay),
 * aligned_alloc to 4 KiB. ckpt_big_free takes the size given to ckpt_big_alloc. NULL
 * (error set) when out of memory. */
void *ckpt_big_alloc(size_t n);
void ckpt_big_free(void *p, size_t n);

/* For a command about to build a plan of many small objects (hundreds of
 * MiB of them, every page touched once): glibc's heap grown ahead by about
 * `bytes`, kept (not trimmed back), and marked MADV_HUGEPAGE, so that its
 * first touches cost ckpt_big_alloc's huge-page faults instead of 4 KiB
 * ones (a second of CPU per 128 MiB). Only address space is taken: pages
 * count once touched. A no-op elsewhere (other C libraries, under
 * AddressSanitizer), and a hint: when it cannot, nothing changes. */
void ckpt_heap_reserve_huge(size_t bytes);

/* Grows *arr (element size elem) so it holds at least need elements. */
int ckpt_grow(void *arr_ptr, size_t *cap, size_t need, size_t elem);

/* Parses "5GB", "500MB", "1.5GiB", "4096" (bytes). Decimal units are powers of
 * 1000 as in Hugging Face's max_shard_size; *iB are powers of 1024. */
int ckpt_parse_size(const char *s, uint64_t *out);
/* Formats bytes as "1.50 GiB" into buf. */
const char *ckpt_format_size(uint64_t bytes, char *buf, size_t len);
/* Parses a non-negative decimal integer that fits in uint64 (whole string). */
int ckpt_parse_u64(const char *s, uint64_t *out);
/* The checked parsers for numbers from outside (options, environment
 * variables, query parameters, headers): the whole string must be the number,
 * within [min, max]; junk, overflow and (for u64) a sign are CKPT_EINVAL with
 * a message naming field, e.g. "--priority: 'x' is not a whole number from
 * -1000 to 1000". Never atoi/atof/strtol on outside input. */
int ckpt_parse_u64_field(const char *field, const char *s, uint64_t min, uint64_t max, uint64_t *out);
int ckpt_parse_i64_field(const char *field, const char *s, int64_t min, int64_t max, int64_t *out);
/* A finite decimal number (strtod syntax, no leading space) in [min, max]. */
int ckpt_parse_double(const char *field, const char *s, double min, double max, double *out);
/* Environment variable name as a number of seconds in [min, max], in whole
 * milliseconds into *ms; def when it is unset or empty. */
int ckpt_env_ms(const char *name, double def, double min, double max, int *ms);

/* Monotonic seconds. */
double ckpt_now(void);

#endif

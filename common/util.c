/* util.c — allocation wrappers and number parsing used everywhere. */
#include "common/util.h"

#include "common/error.h"

#include <ctype.h>
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <time.h>

void *ckpt_malloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) ckpt_error_set(CKPT_ENOMEM, "out of memory allocating %zu bytes", n);
    return p;
}

#define BIG_ALIGN ((size_t)2 << 20)

/* ckpt_big_alloc's small case (or any, under AddressSanitizer): 4 KiB-aligned. */
static void *page_alloc(size_t n)
{
    void *p = n <= SIZE_MAX - 8192 ? aligned_alloc(4096, (n + 4095) / 4096 * 4096 + (n ? 0 : 4096)) : NULL;
    if (!p) ckpt_error_set(CKPT_ENOMEM, "out of memory allocating %zu bytes", n);
    return p;
}

#if defined(__SANITIZE_ADDRESS__)
void *ckpt_big_alloc(size_t n) { return page_alloc(n); }
void ckpt_big_free(void *p, size_t n) { free(p); }
#else

/* n rounded up to whole 4 KiB pages (a tail shorter than a huge page gets
 * small pages: only what is touched counts); 0 when that overflows. */
static size_t big_len(size_t n)
{
    return n > SIZE_MAX - 2 * BIG_ALIGN ? 0 : (n + 4095) / 4096 * 4096;
}

void *ckpt_big_alloc(size_t n)
{
    if (n < BIG_ALIGN) return page_alloc(n); /* a huge page would be mostly untouched */
    size_t len = big_len(n);
    uint8_t *m = len ? mmap(NULL, len + BIG_ALIGN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                     : MAP_FAILED;
    if (m == MAP_FAILED) {
        ckpt_error_set(CKPT_ENOMEM, "out of memory allocating %zu bytes", n);
        return NULL;
    }
    /* the aligned part kept, the rest of the mapping given back */
    uint8_t *a = m + (BIG_ALIGN - (uintptr_t)m % BIG_ALIGN) % BIG_ALIGN;
    if (a > m) munmap(m, (size_t)(a - m));
    if (m + len + BIG_ALIGN > a + len) munmap(a + len, (size_t)(m + len + BIG_ALIGN - (a + len)));
#ifdef MADV_HUGEPAGE
    madvise(a, len, MADV_HUGEPAGE); /* a hint: without it, 4 KiB pages */
#endif
    return a;
}

void ckpt_big_free(void *p, size_t n)
{
    if (n < BIG_ALIGN) free(p);
    else if (p) munmap(p, big_len(n));
}
#endif

#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__) && defined(MADV_HUGEPAGE)
void ckpt_heap_reserve_huge(size_t bytes)
{
    /* malloc's heap made to grow once by `bytes` (its top pad) and never to
     * shrink (the trim threshold), with allocations of up to 32 MiB taken
     * from it; the grown part is marked for huge pages. */
    if (bytes < 2 * BIG_ALIGN || bytes > (size_t)1 << 30) return;
    if (!mallopt(M_MMAP_THRESHOLD, 32 << 20) || !mallopt(M_TRIM_THRESHOLD, (int)(2 * bytes)) ||
        !mallopt(M_TOP_PAD, (int)bytes))
        return;
    void *grow = malloc(BIG_ALIGN); /* the top pad taken now, if the heap's top was short of it */
    uint8_t *end = sbrk(0);
    if (grow && end != (void *)-1 && (uintptr_t)end > bytes) {
        uintptr_t lo = ((uintptr_t)end - bytes + BIG_ALIGN - 1) / BIG_ALIGN * BIG_ALIGN;
        uintptr_t hi = (uintptr_t)end / BIG_ALIGN * BIG_ALIGN;
        if (hi > lo) madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* a hint: an error leaves 4 KiB pages */
    }
    free(grow);
    mallopt(M_TOP_PAD, 128 << 10); /* later growth as before (glibc's default pad) */
}
#else
void ckpt_heap_reserve_huge(size_t bytes) { (void)bytes; }
#endif

void *ckpt_calloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) ckpt_error_set(CKPT_ENOMEM, "out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *ckpt_realloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) ckpt_error_set(CKPT_ENOMEM, "out of memory allocating %zu bytes", n);
    return q;
}

char *ckpt_strdup(const char *s)
{
    return ckpt_strndup(s, strlen(s));
}

char *ckpt_strndup(const char *s, size_t n)
{
    char *p = ckpt_malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *ckpt_sprintf(const char *fmt, ...)
{
    va_list ap;
    char *out = NULL;
    va_start(ap, fmt);
    int n = vasprintf(&out, fmt, ap);
    va_end(ap);
    if (n < 0) {
        ckpt_error_set(CKPT_ENOMEM, "out of memory formatting a string");
        return NULL;
    }
    return out;
}

int ckpt_grow(void *arr_ptr, size_t *cap, size_t need, size_t elem)
{
    void **arr = arr_ptr;
    if (need <= *cap) return 0;
    size_t ncap = *cap ? *cap : 8;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2) return ckpt_error_set(CKPT_ENOMEM, "array too large");
        ncap *= 2;
    }
    uint64_t bytes;
    if (!ckpt_mul(ncap, elem, &bytes) || bytes > SIZE_MAX)
        return ckpt_error_set(CKPT_ENOMEM, "array too large");
    void *p = ckpt_realloc(*arr, (size_t)bytes);
    if (!p) return CKPT_ENOMEM;
    *arr = p;
    *cap = ncap;
    return 0;
}

int ckpt_parse_u64(const char *s, uint64_t *out)
{
    if (!s || !*s || !isdigit((unsigned char)*s))
        return ckpt_error_set(CKPT_EINVAL, "'%s' is not a non-negative integer", s ? s : "");
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return ckpt_error_set(CKPT_EINVAL, "'%s' is not a non-negative integer", s);
    *out = v;
    return 0;
}

int ckpt_parse_size(const char *s, uint64_t *out)
{
    static const struct {
        const char *suffix;
        double mult;
    } units[] = {
        {"", 1},          {"B", 1},          {"KB", 1e3},          {"MB", 1e6},
        {"GB", 1e9},      {"TB", 1e12},      {"KIB", 1024.0},      {"MIB", 1048576.0},
        {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9},
    };
    if (!s || !*s || !(isdigit((unsigned char)*s) || *s == '.'))
        return ckpt_error_set(CKPT_EINVAL, "'%s' is not a size (examples: 5GB, 500MB, 2GiB)", s ? s : "");
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || v < 0) return ckpt_error_set(CKPT_EINVAL, "'%s' is not a size", s);
    char suf[8];
    size_t n = strlen(end);
    if (n >= sizeof suf) return ckpt_error_set(CKPT_EINVAL, "'%s': unknown size unit", s);
    for (size_t i = 0; i <= n; i++) suf[i] = (char)toupper((unsigned char)end[i]);
    for (size_t i = 0; i < CKPT_ARRAY_LEN(units); i++) {
        if (strcmp(suf, units[i].suffix) == 0) {
            double b = v * units[i].mult;
            if (b >= 18446744073709551615.0) return ckpt_error_set(CKPT_ELIMIT, "'%s': size too large", s);
            *out = (uint64_t)(b + 0.5); /* round: 1.001KB is 1001 bytes, not 1000.9999 */
            return 0;
        }
    }
    return ckpt_error_set(CKPT_EINVAL, "'%s': unknown size unit (use B, KB, MB, GB, KiB, MiB, GiB)", s);
}

const char *ckpt_format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char *names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    size_t u = 0;
    while (v >= 1024.0 && u + 1 < CKPT_ARRAY_LEN(names)) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    else snprintf(buf, len, "%.2f %s", v, names[u]);
    return buf;
}

double ckpt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int ckpt_parse_u64_field(const char *field, const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    uint64_t v;
    if (!s || ckpt_parse_u64(s, &v) < 0 || v < min || v > max)
        return ckpt_error_set(CKPT_EINVAL, "%s: '%.64s' is not a whole number from %llu to %llu", field, s ? s : "",
                              (unsigned long long)min, (unsigned long long)max);
    *out = v;
    return 0;
}

int ckpt_parse_i64_field(const char *field, const char *s, int64_t min, int64_t max, int64_t *out)
{
    const char *d = s && *s == '-' ? s + 1 : s;
    uint64_t v;
    bool ok = d && ckpt_parse_u64(d, &v) == 0;
    int64_t r = 0;
    if (ok && d != s) {
        ok = v <= (uint64_t)INT64_MAX + 1;
        if (ok) r = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    } else if (ok) {
        ok = v <= (uint64_t)INT64_MAX;
        if (ok) r = (int64_t)v;
    }
    if (!ok || r < min || r > max)
        return ckpt_error_set(CKPT_EINVAL, "%s: '%.64s' is not a whole number from %lld to %lld", field, s ? s : "",
                              (long long)min, (long long)max);
    *out = r;
    return 0;
}

int ckpt_env_ms(const char *name, double def, double min, double max, int *ms)
{
    const char *v = getenv(name);
    double sec = def;
    int rc = v && *v ? ckpt_parse_double(name, v, min, max, &sec) : 0;
    *ms = (int)(sec * 1000 + 0.5);
    return rc;
}

int ckpt_parse_double(const char *field, const char *s, double min, double max, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = s && *s && !isspace((unsigned char)*s) ? strtod(s, &end) : NAN;
    if (!s || end == s || !end || *end || errno || !isfinite(v) || v < min || v > max)
        return ckpt_error_set(CKPT_EINVAL, "%s: '%.64s' is not a number from %g to %g", field, s ? s : "", min, max);
    *out = v;
    return 0;
}

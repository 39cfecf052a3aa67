/* zarr.c — zarr v2 arrays as TensorStore writes them (zarr.h, docs/easydel.md). */
#include "format/zarr.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_d_stableOutBuffer (libzstd >= 1.4.4) */
#include <zstd.h>
#include <zstd_errors.h>

/* ---- .zarray ---- */

typedef struct {
    const char *name;
    ckpt_dtype dt;
} dtype_map;

/* numpy type strings ('<' little-endian, '|' no byte order) and the names
 * TensorStore gives the ml_dtypes extension types. */
static const dtype_map dtypes[] = {
    {"|b1", CKPT_DT_BOOL},     {"|u1", CKPT_DT_U8},      {"<u1", CKPT_DT_U8},      {"|i1", CKPT_DT_I8},
    {"<i1", CKPT_DT_I8},       {"<i2", CKPT_DT_I16},     {"<u2", CKPT_DT_U16},     {"<f2", CKPT_DT_F16},
    {"<i4", CKPT_DT_I32},      {"<u4", CKPT_DT_U32},     {"<f4", CKPT_DT_F32},     {"<c8", CKPT_DT_C64},
    {"<f8", CKPT_DT_F64},      {"<i8", CKPT_DT_I64},     {"<u8", CKPT_DT_U64},     {"bfloat16", CKPT_DT_BF16},
    {"float8_e4m3fn", CKPT_DT_F8_E4M3}, {"float8_e5m2", CKPT_DT_F8_E5M2},
    {"float8_e4m3fnuz", CKPT_DT_F8_E4M3FNUZ}, {"float8_e5m2fnuz", CKPT_DT_F8_E5M2FNUZ},
};

static int zerr(const zarr_array *a, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int zerr(const zarr_array *a, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ckpt_error_set(code, "%s: %s", a->label ? a->label : "zarr array", msg);
}

static int parse_dims(zarr_array *a, const json_t *v, const char *key, uint64_t *out, bool positive)
{
    if (!json_is_array(v)) return zerr(a, CKPT_EINVAL, ".zarray: '%s' is not a list", key);
    size_t n = json_array_size(v);
    if (n > CKPT_MAX_RANK)
        return zerr(a, CKPT_ELIMIT, ".zarray: '%s' has %zu dimensions, at most %d are read", key, n, CKPT_MAX_RANK);
    if (a->ndim >= 0 && (int)n != a->ndim)
        return zerr(a, CKPT_EINVAL, ".zarray: 'chunks' has %zu dimensions, 'shape' %d", n, a->ndim);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < (positive ? 1 : 0))
            return zerr(a, CKPT_EINVAL, ".zarray: '%s'[%zu] is not a %s integer", key, i,
                        positive ? "positive" : "non-negative");
        if ((uint64_t)json_integer_value(e) > ZARR_MAX_DIM)
            return zerr(a, CKPT_ELIMIT, ".zarray: '%s'[%zu] = %lld is above the limit %llu", key, i,
                        (long long)json_integer_value(e), (unsigned long long)ZARR_MAX_DIM);
        out[i] = (uint64_t)json_integer_value(e);
    }
    a->ndim = (int)n;
    return 0;
}

static int put_fill(zarr_array *a, const json_t *v)
{
    memset(a->fill, 0, sizeof a->fill);
    if (json_is_null(v)) return 0; /* TensorStore: null reads as zeros */
    ckpt_dtype dt = a->dtype;
    if (dt == CKPT_DT_BOOL) {
        if (json_is_boolean(v)) {
            a->fill[0] = json_is_true(v);
            return 0;
        }
        if (json_is_integer(v) && (json_integer_value(v) == 0 || json_integer_value(v) == 1)) {
            a->fill[0] = (uint8_t)json_integer_value(v);
            return 0;
        }
        return zerr(a, CKPT_EINVAL, ".zarray: 'fill_value' is not a boolean");
    }
    bool is_float = dt == CKPT_DT_F16 || dt == CKPT_DT_BF16 || dt == CKPT_DT_F32 || dt == CKPT_DT_F64;
    if (is_float) {
        double d;
        if (json_is_number(v))
            d = json_number_value(v);
        else if (json_is_string(v) && !strcmp(json_string_value(v), "NaN"))
            d = NAN;
        else if (json_is_string(v) && !strcmp(json_string_value(v), "Infinity"))
            d = INFINITY;
        else if (json_is_string(v) && !strcmp(json_string_value(v), "-Infinity"))
            d = -INFINITY;
        else
            return zerr(a, CKPT_EINVAL, ".zarray: 'fill_value' is not a number for dtype %s", a->dtype_str);
        if (dt == CKPT_DT_F64) {
            memcpy(a->fill, &d, 8);
        } else if (dt == CKPT_DT_F32) {
            float f = (float)d;
            memcpy(a->fill, &f, 4);
        } else {
            uint16_t h = dt == CKPT_DT_F16 ? ckpt_f64_to_f16(d) : ckpt_f64_to_bf16(d);
            memcpy(a->fill, &h, 2);
        }
        return 0;
    }
    bool is_int = dt == CKPT_DT_U8 || dt == CKPT_DT_I8 || dt == CKPT_DT_I16 || dt == CKPT_DT_U16 ||
                  dt == CKPT_DT_I32 || dt == CKPT_DT_U32 || dt == CKPT_DT_I64 || dt == CKPT_DT_U64;
    if (is_int) {
        if (!json_is_integer(v)) return zerr(a, CKPT_EINVAL, ".zarray: 'fill_value' is not an integer");
        int64_t x = json_integer_value(v);
        bool sgn = dt == CKPT_DT_I8 || dt == CKPT_DT_I16 || dt == CKPT_DT_I32 || dt == CKPT_DT_I64;
        unsigned bits = a->esize * 8;
        bool ok = sgn ? (bits == 64 || (x >= -(INT64_C(1) << (bits - 1)) && x < (INT64_C(1) << (bits - 1))))
                      : (x >= 0 && (bits == 64 || x < (INT64_C(1) << bits)));
        if (!ok) return zerr(a, CKPT_EINVAL, ".zarray: 'fill_value' %lld does not fit %s", (long long)x, a->dtype_str);
        uint64_t u = (uint64_t)x;
        for (unsigned i = 0; i < a->esize; i++) a->fill[i] = (uint8_t)(u >> (8 * i));
        return 0;
    }
    /* float8, complex: only the default fill. */
    if (json_is_integer(v) && json_integer_value(v) == 0) return 0;
    return zerr(a, CKPT_EINVAL, ".zarray: 'fill_value' must be null or 0 for dtype %s", a->dtype_str);
}

static int parse_compressor(zarr_array *a, const json_t *c)
{
    a->zstd = false;
    if (!c || json_is_null(c)) return 0;
    if (!json_is_object(c)) return zerr(a, CKPT_EINVAL, ".zarray: 'compressor' is not an object or null");
    const json_t *id = json_object_get(c, "id");
    if (!json_is_string(id)) return zerr(a, CKPT_EINVAL, ".zarray: 'compressor' has no string 'id'");
    if (strcmp(json_string_value(id), "zstd"))
        return zerr(a, CKPT_EINVAL, ".zarray: compressor '%.64s' is not read (only zstd or none)",
                    json_string_value(id));
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)c, k, v)
    {
        if (!strcmp(k, "id")) continue;
        if (!strcmp(k, "level") && json_is_integer(v)) {
            a->zstd_level = (int)json_integer_value(v);
            continue;
        }
        if (!strcmp(k, "checksum") && json_is_boolean(v)) continue;
        return zerr(a, CKPT_EINVAL, ".zarray: zstd compressor field '%.64s' is not understood", k);
    }
    a->zstd = true;
    return 0;
}

int zarr_parse_meta(zarr_array *a, const char *label, const char *text, size_t len)
{
    memset(a, 0, sizeof *a);
    a->dirfd = -1;
    a->ndim = -1;
    a->label = ckpt_strdup(label ? label : "zarr array");
    if (!a->label) return CKPT_ENOMEM;
    int rc = 0;
    json_t *j = NULL;
    if (len > ZARR_MAX_ZARRAY) {
        rc = zerr(a, CKPT_ELIMIT, ".zarray is %zu bytes, above the limit %u", len, ZARR_MAX_ZARRAY);
        goto out;
    }
    json_error_t je;
    j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        rc = zerr(a, CKPT_EINVAL, ".zarray is not JSON: %s (line %d)", je.text, je.line);
        goto out;
    }
    if (!json_is_object(j)) {
        rc = zerr(a, CKPT_EINVAL, ".zarray is not a JSON object");
        goto out;
    }
    static const char *const known[] = {"zarr_format", "shape",   "chunks",  "dtype",
                                        "compressor",  "fill_value", "order", "filters", "dimension_separator"};
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v)
    {
        bool ok = false;
        for (size_t i = 0; i < CKPT_ARRAY_LEN(known); i++) ok = ok || !strcmp(k, known[i]);
        if (!ok) {
            rc = zerr(a, CKPT_EINVAL, ".zarray: unknown field '%.64s'", k);
            goto out;
        }
    }
    const json_t *fmt = json_object_get(j, "zarr_format");
    if (!json_is_integer(fmt) || json_integer_value(fmt) != 2) {
        rc = zerr(a, CKPT_EINVAL, ".zarray: 'zarr_format' is not 2");
        goto out;
    }
    const json_t *shape = json_object_get(j, "shape"), *chunks = json_object_get(j, "chunks");
    if (!shape || !chunks) {
        rc = zerr(a, CKPT_EINVAL, ".zarray: '%s' is missing", shape ? "chunks" : "shape");
        goto out;
    }
    if ((rc = parse_dims(a, shape, "shape", a->shape, false)) || (rc = parse_dims(a, chunks, "chunks", a->chunks, true)))
        goto out;
    const json_t *dt = json_object_get(j, "dtype");
    if (!json_is_string(dt)) {
        rc = zerr(a, CKPT_EINVAL, ".zarray: 'dtype' is %s", dt ? "not a string (structured dtypes are not read)"
                                                               : "missing");
        goto out;
    }
    bool found = false;
    for (size_t i = 0; i < CKPT_ARRAY_LEN(dtypes) && !found; i++)
        if (!strcmp(json_string_value(dt), dtypes[i].name)) {
            a->dtype = dtypes[i].dt;
            snprintf(a->dtype_str, sizeof a->dtype_str, "%s", dtypes[i].name);
            found = true;
        }
    if (!found) {
        const char *s = json_string_value(dt);
        rc = zerr(a, CKPT_EINVAL, ".zarray: dtype '%.32s' is not read%s", s,
                  s[0] == '>' ? " (big-endian)" : " (bool, ints, floats, complex64, bfloat16, float8 little-endian)");
        goto out;
    }
    a->esize = ckpt_dtype_size(a->dtype);
    const json_t *order = json_object_get(j, "order");
    if (!json_is_string(order) || strcmp(json_string_value(order), "C")) {
        rc = zerr(a, CKPT_EINVAL, ".zarray: 'order' is %s%.8s%s, only \"C\" is read", json_is_string(order) ? "\"" : "",
                  json_is_string(order) ? json_string_value(order) : "not a string", json_is_string(order) ? "\"" : "");
        goto out;
    }
    const json_t *filters = json_object_get(j, "filters");
    if (filters && !json_is_null(filters)) {
        rc = zerr(a, CKPT_EINVAL, ".zarray: 'filters' must be null (filters are not read)");
        goto out;
    }
    const json_t *sep = json_object_get(j, "dimension_separator");
    a->sep = '.';
    if (sep) {
        if (!json_is_string(sep) || (strcmp(json_string_value(sep), ".") && strcmp(json_string_value(sep), "/"))) {
            rc = zerr(a, CKPT_EINVAL, ".zarray: 'dimension_separator' must be \".\" or \"/\"");
            goto out;
        }
        a->sep = json_string_value(sep)[0];
    }
    if ((rc = parse_compressor(a, json_object_get(j, "compressor")))) goto out;
    if (!json_object_get(j, "fill_value")) {
        rc = zerr(a, CKPT_EINVAL, ".zarray: 'fill_value' is missing");
        goto out;
    }
    if ((rc = put_fill(a, json_object_get(j, "fill_value")))) goto out;
    /* Sizes: every product checked. */
    uint64_t cn = a->esize, nb = a->esize, nch = 1;
    for (int d = 0; d < a->ndim; d++) {
        a->grid[d] = a->shape[d] ? (a->shape[d] + a->chunks[d] - 1) / a->chunks[d] : 0;
        if (!ckpt_mul(cn, a->chunks[d], &cn) || cn > ZARR_MAX_CHUNK_BYTES) {
            rc = zerr(a, CKPT_ELIMIT, ".zarray: a chunk is above %llu bytes", (unsigned long long)ZARR_MAX_CHUNK_BYTES);
            goto out;
        }
        if (!ckpt_mul(nb, a->shape[d], &nb) || !ckpt_mul(nch, a->grid[d], &nch) || nch > ZARR_MAX_CHUNKS) {
            rc = zerr(a, CKPT_ELIMIT, ".zarray: shape and chunks give more than %llu chunks or overflow",
                      (unsigned long long)ZARR_MAX_CHUNKS);
            goto out;
        }
    }
    if (nb > ZARR_MAX_ARRAY_BYTES) {
        rc = zerr(a, CKPT_ELIMIT, ".zarray: the array is %llu bytes, above the limit %llu", (unsigned long long)nb,
                  (unsigned long long)ZARR_MAX_ARRAY_BYTES);
        goto out;
    }
    a->chunk_nbytes = cn;
    a->nbytes = nb;
    a->nchunks = nch;
out:
    json_decref(j);
    if (rc) {
        /* keep the label for the caller's message, drop the rest */
        char *l = a->label;
        memset(a, 0, sizeof *a);
        a->dirfd = -1;
        free(l);
    }
    return rc;
}

void zarr_close(zarr_array *a)
{
    if (!a) return;
    if (a->dirfd >= 0) close(a->dirfd);
    free(a->label);
    memset(a, 0, sizeof *a);
    a->dirfd = -1;
}

/* ---- paths ---- */

bool zarr_rel_path_safe(const char *rel)
{
    if (!rel || !*rel || rel[0] == '/' || strlen(rel) > 4096) return false;
    const char *p = rel;
    while (*p) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) return false;
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)p[i] < 0x20 || p[i] == '\\' || p[i] == 0x7f) return false;
        p += n;
        if (*p == '/') p++;
        if (e && !*p) return false; /* trailing slash */
    }
    return true;
}

int zarr_open_beneath(int root_fd, const char *rel, bool want_dir, const char *label)
{
    if (!zarr_rel_path_safe(rel))
        return ckpt_error_set(CKPT_EINVAL, "%s: path '%.200s' leaves the checkpoint folder or is not a plain relative path",
                              label, rel ? rel : "");
    char *copy = ckpt_strdup(rel);
    if (!copy) return CKPT_ENOMEM;
    int fd = dup(root_fd);
    if (fd < 0) {
        free(copy);
        return ckpt_error_sys("%s: dup", label);
    }
    char *save = NULL;
    for (char *part = strtok_r(copy, "/", &save); part; part = strtok_r(NULL, "/", &save)) {
        bool last = !save || !*save;
        int flags = O_RDONLY | O_NOFOLLOW | O_CLOEXEC | ((!last || want_dir) ? O_DIRECTORY : 0);
        int nfd = openat(fd, part, flags);
        int err = errno;
        struct stat lst;
        if (nfd < 0 && err == ENOTDIR && fstatat(fd, part, &lst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lst.st_mode))
            err = ELOOP; /* O_NOFOLLOW | O_DIRECTORY on a link says ENOTDIR */
        close(fd);
        if (nfd < 0) {
            int code = err == ENOENT ? CKPT_ENOTFOUND : err == ELOOP || err == ENOTDIR ? CKPT_EINVAL : CKPT_EIO;
            int r = ckpt_error_set(code, "%s: %s '%.200s': %s%s", label, last ? "cannot open" : "cannot enter", rel,
                                   strerror(err), err == ELOOP ? " (symbolic links are not followed)" : "");
            free(copy);
            return r;
        }
        fd = nfd;
    }
    free(copy);
    struct stat st;
    if (fstat(fd, &st) < 0 || (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))) {
        close(fd);
        return ckpt_error_set(CKPT_EINVAL, "%s: '%.200s' is not a %s", label, rel, want_dir ? "folder" : "regular file");
    }
    return fd;
}

int zarr_open(zarr_array *a, int root_fd, const char *rel, const char *label)
{
    memset(a, 0, sizeof *a);
    a->dirfd = -1;
    int dfd = zarr_open_beneath(root_fd, rel, true, label);
    if (dfd < 0) return dfd;
    char *text = NULL;
    size_t len = 0;
    int rc = 0;
    int mfd = openat(dfd, ".zarray", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (mfd < 0) {
        rc = ckpt_error_set(errno == ENOENT ? CKPT_ENOTFOUND : CKPT_EINVAL, "%s: %s/.zarray: %s (not a zarr array)",
                            label, rel, strerror(errno));
    } else if (fstat(mfd, &st) < 0 || !S_ISREG(st.st_mode)) {
        rc = ckpt_error_set(CKPT_EINVAL, "%s: %s/.zarray is not a regular file", label, rel);
    } else if ((uint64_t)st.st_size > ZARR_MAX_ZARRAY) {
        rc = ckpt_error_set(CKPT_ELIMIT, "%s: .zarray is %lld bytes, above the limit %u", label, (long long)st.st_size,
                            ZARR_MAX_ZARRAY);
    } else {
        len = (size_t)st.st_size;
        text = ckpt_malloc(len + 1);
        if (!text) rc = CKPT_ENOMEM;
        else rc = ckpt_pread_full(mfd, text, len, 0, label);
    }
    if (mfd >= 0) close(mfd);
    if (!rc) rc = zarr_parse_meta(a, label, text, len);
    free(text);
    if (rc) {
        close(dfd);
        return rc;
    }
    a->dirfd = dfd;
    return 0;
}

bool zarr_chunk_key(const zarr_array *a, const uint64_t *idx, char *buf, size_t len)
{
    size_t n = 0;
    if (a->ndim == 0) return snprintf(buf, len, "0") < (int)len;
    for (int d = 0; d < a->ndim; d++) {
        int w = snprintf(buf + n, len - n, "%s%llu", d ? (a->sep == '/' ? "/" : ".") : "", (unsigned long long)idx[d]);
        if (w < 0 || (size_t)w >= len - n) return false;
        n += (size_t)w;
    }
    return true;
}

/* Opens a chunk file: fd >= 0, CKPT_ENOTFOUND (set quietly: a missing chunk), or an error. */
static int open_chunk(const zarr_array *a, const uint64_t *idx, char *key, size_t keylen)
{
    if (!zarr_chunk_key(a, idx, key, keylen)) return zerr(a, CKPT_ELIMIT, "chunk key too long");
    int fd;
    if (a->sep == '/' && a->ndim > 1) {
        /* walk the key's components beneath the array folder, following no link */
        fd = -1;
        int cur = dup(a->dirfd);
        if (cur < 0) return zerr(a, CKPT_EIO, "dup: %s", strerror(errno));
        char part[32];
        const char *p = key;
        while (cur >= 0) {
            const char *e = strchr(p, '/');
            size_t n = e ? (size_t)(e - p) : strlen(p);
            memcpy(part, p, n);
            part[n] = 0;
            int nfd = openat(cur, part, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | (e ? O_DIRECTORY : 0));
            int err = errno;
            struct stat lst;
            if (nfd < 0 && err == ENOTDIR && fstatat(cur, part, &lst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lst.st_mode))
                err = ELOOP;
            close(cur);
            if (nfd < 0) {
                if (err == ENOENT) return CKPT_ENOTFOUND;
                return zerr(a, err == ELOOP ? CKPT_EINVAL : CKPT_EIO, "chunk '%s': %s%s", key, strerror(err),
                            err == ELOOP ? " (symbolic links are not followed)" : "");
            }
            if (!e) {
                fd = nfd;
                break;
            }
            cur = nfd;
            p = e + 1;
        }
    } else {
        fd = openat(a->dirfd, key, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
            int err = errno;
            if (err == ENOENT) return CKPT_ENOTFOUND;
            return zerr(a, err == ELOOP ? CKPT_EINVAL : CKPT_EIO, "chunk '%s': %s%s", key, strerror(err),
                        err == ELOOP ? " (symbolic links are not followed)" : "");
        }
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return zerr(a, CKPT_EINVAL, "chunk '%s' is not a regular file", key);
    }
    return fd;
}

static bool next_index(const zarr_array *a, uint64_t *idx)
{
    for (int d = a->ndim - 1; d >= 0; d--) {
        if (++idx[d] < a->grid[d]) return true;
        idx[d] = 0;
    }
    return false;
}

int zarr_stat(const zarr_array *a, zarr_stats *st)
{
    memset(st, 0, sizeof *st);
    if (a->nbytes == 0) return 0;
    uint64_t idx[CKPT_MAX_RANK] = {0};
    char key[256];
    do {
        int fd = open_chunk(a, idx, key, sizeof key);
        if (fd == CKPT_ENOTFOUND) continue;
        if (fd < 0) return fd;
        struct stat s;
        int r = fstat(fd, &s);
        close(fd);
        if (r < 0) return zerr(a, CKPT_EIO, "chunk '%s': %s", key, strerror(errno));
        st->chunks_present++;
        st->stored_bytes += (uint64_t)s.st_size;
    } while (next_index(a, idx));
    return 0;
}

/* ---- scattering a chunk's bytes into the array ---- */

typedef struct {
    const zarr_array *a;
    zarr_sink sink;
    void *ctx;
    uint64_t origin[CKPT_MAX_RANK]; /* first element of the chunk */
    uint64_t valid[CKPT_MAX_RANK];  /* elements of the chunk inside the shape */
    uint64_t row_bytes;             /* chunk bytes along the last dimension */
    uint64_t pos;                   /* bytes of the chunk consumed so far */
    /* one pending write, grown while the destination stays contiguous */
    uint8_t *pend;
    size_t pend_len;
    uint64_t pend_off;
} scatter;

static int flush(scatter *s)
{
    if (!s->pend_len) return 0;
    int rc = s->sink(s->ctx, s->pend_off, s->pend, s->pend_len);
    s->pend_len = 0;
    return rc;
}

static int emit(scatter *s, uint64_t off, const uint8_t *p, size_t n)
{
    while (n) {
        if (s->pend_len && (s->pend_off + s->pend_len != off || s->pend_len == ZARR_IO_BYTES)) {
            int rc = flush(s);
            if (rc) return rc;
        }
        if (!s->pend_len) s->pend_off = off;
        size_t take = ZARR_IO_BYTES - s->pend_len;
        if (take > n) take = n;
        memcpy(s->pend + s->pend_len, p, take);
        s->pend_len += take;
        off += take;
        p += take;
        n -= take;
    }
    return 0;
}

/* Hands chunk bytes [s->pos, s->pos + n) to the sink, skipping padding. */
static int scatter_bytes(scatter *s, const uint8_t *p, size_t n)
{
    const zarr_array *a = s->a;
    while (n) {
        uint64_t row = s->pos / s->row_bytes, col = s->pos % s->row_bytes;
        size_t piece = (size_t)(s->row_bytes - col < n ? s->row_bytes - col : n);
        /* the row's coordinates in the chunk (dimensions before the last) */
        bool inside = true;
        uint64_t elem = 0, r = row, coord[CKPT_MAX_RANK] = {0};
        for (int d = a->ndim - 2; d >= 0; d--) {
            coord[d] = r % a->chunks[d];
            r /= a->chunks[d];
            if (coord[d] >= s->valid[d]) inside = false;
        }
        uint64_t valid_bytes = a->ndim ? s->valid[a->ndim - 1] * a->esize : a->esize;
        if (inside && col < valid_bytes) {
            for (int d = 0; d < a->ndim - 1; d++) elem = elem * a->shape[d] + s->origin[d] + coord[d];
            if (a->ndim) elem = elem * a->shape[a->ndim - 1] + s->origin[a->ndim - 1];
            size_t take = (size_t)(valid_bytes - col < piece ? valid_bytes - col : piece);
            int rc = emit(s, elem * a->esize + col, p, take);
            if (rc) return rc;
        }
        s->pos += piece;
        p += piece;
        n -= piece;
    }
    return 0;
}

/* ---- decoding one chunk in order ---- */

struct zarr_decoder {
    const zarr_array *a;
    ZSTD_DCtx *dctx;
    uint8_t *in; /* ZARR_IO_BYTES of compressed input */
    int fd;      /* the open chunk file, -1 when missing (the fill value) or none */
    bool active;
    char key[256];
    uint64_t size;     /* bytes of the chunk file */
    uint64_t in_off;   /* file bytes read so far */
    ZSTD_inBuffer ib;  /* the piece being decoded */
    uint64_t produced; /* raw bytes handed out */
    size_t last;       /* ZSTD_decompressStream's hint: 0 once a frame ended */
    bool stable;       /* the chunk is decoded in one read straight into its buffer (zarr_decoder_read) */
    ZSTD_outBuffer sob; /* ... that buffer, as libzstd last saw it */
};

zarr_decoder *zarr_decoder_new(void)
{
    zarr_decoder *d = ckpt_calloc(1, sizeof *d);
    if (!d) return NULL;
    d->fd = -1;
    d->in = ckpt_malloc(ZARR_IO_BYTES);
    d->dctx = ZSTD_createDCtx();
    if (!d->in || !d->dctx) {
        zarr_decoder_free(d);
        ckpt_error_set(CKPT_ENOMEM, "out of memory for a zstd decoder");
        return NULL;
    }
    return d;
}

static void decoder_close(zarr_decoder *d)
{
    if (d->fd >= 0) close(d->fd);
    d->fd = -1;
    d->active = false;
}

void zarr_decoder_free(zarr_decoder *d)
{
    if (!d) return;
    decoder_close(d);
    ZSTD_freeDCtx(d->dctx);
    free(d->in);
    free(d);
}

/* A new frame: libzstd's session reset, decoding into its own window
 * (stable false) or straight into one output buffer that stays put until
 * the frame ends (ZSTD_d_stableOutBuffer; a libzstd without it decodes
 * through its window). */
static void decoder_reset(zarr_decoder *d, bool stable)
{
    ZSTD_DCtx_reset(d->dctx, ZSTD_reset_session_only);
    if (stable != d->stable && !ZSTD_isError(ZSTD_DCtx_setParameter(d->dctx, ZSTD_d_stableOutBuffer, stable)))
        d->stable = stable;
}

int zarr_decoder_start(zarr_decoder *d, const zarr_array *a, const uint64_t *idx, zarr_stats *st)
{
    decoder_close(d);
    d->a = a;
    d->produced = 0;
    d->in_off = 0;
    d->ib = (ZSTD_inBuffer){d->in, 0, 0};
    d->last = 1;
    d->size = 0;
    if (a->dirfd < 0) return zerr(a, CKPT_EINVAL, "array has no folder");
    int fd = open_chunk(a, idx, d->key, sizeof d->key);
    if (fd == CKPT_ENOTFOUND) {
        d->active = true; /* the fill value */
        return 0;
    }
    if (fd < 0) return fd;
    d->fd = fd;
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        int rc = zerr(a, CKPT_EIO, "chunk '%s': %s", d->key, strerror(errno));
        decoder_close(d);
        return rc;
    }
    d->size = (uint64_t)sb.st_size;
    if (st) {
        st->chunks_present++;
        st->stored_bytes += d->size;
    }
    int rc = 0;
    if (!a->zstd && d->size != a->chunk_nbytes)
        rc = zerr(a, CKPT_EINVAL, "chunk '%s' is %llu bytes, an uncompressed chunk is %llu", d->key,
                  (unsigned long long)d->size, (unsigned long long)a->chunk_nbytes);
    else if (a->zstd && d->size > ZSTD_compressBound((size_t)a->chunk_nbytes) + 4096)
        rc = zerr(a, CKPT_EINVAL, "chunk '%s' is %llu bytes, more than zstd needs for a %llu-byte chunk", d->key,
                  (unsigned long long)d->size, (unsigned long long)a->chunk_nbytes);
    if (!rc && a->zstd) decoder_reset(d, false);
    if (rc) decoder_close(d);
    else d->active = true;
    return rc;
}

/* The next piece of the compressed file into d->ib; false at its end. The
 * first piece's frame header is checked: a zstd frame, and the content size,
 * when recorded, the chunk's. */
static int refill(zarr_decoder *d, bool *more)
{
    const zarr_array *a = d->a;
    *more = d->in_off < d->size;
    if (!*more) return 0;
    size_t n = (size_t)(d->size - d->in_off < ZARR_IO_BYTES ? d->size - d->in_off : ZARR_IO_BYTES);
    int rc = ckpt_pread_full(d->fd, d->in, n, d->in_off, a->label);
    if (rc) return rc;
    if (d->in_off == 0) {
        unsigned long long fcs = ZSTD_getFrameContentSize(d->in, n);
        if (fcs == ZSTD_CONTENTSIZE_ERROR) return zerr(a, CKPT_EINVAL, "chunk '%s' is not a zstd frame", d->key);
        if (fcs != ZSTD_CONTENTSIZE_UNKNOWN && fcs != a->chunk_nbytes)
            return zerr(a, CKPT_EINVAL, "chunk '%s' decompresses to %llu bytes, a chunk is %llu", d->key, fcs,
                        (unsigned long long)a->chunk_nbytes);
    }
    d->in_off += n;
    d->ib = (ZSTD_inBuffer){d->in, n, 0};
    return 0;
}

static int more_than_chunk(const zarr_decoder *d)
{
    return zerr(d->a, CKPT_EINVAL, "chunk '%s' decompresses to more than %llu bytes (the chunk size)", d->key,
                (unsigned long long)d->a->chunk_nbytes);
}

/* Decodes into ob until it is full or the input ends. */
static int decode_into(zarr_decoder *d, ZSTD_outBuffer *ob)
{
    const zarr_array *a = d->a;
    while (ob->pos < ob->size) {
        bool more = true;
        if (d->ib.pos == d->ib.size) {
            int rc = refill(d, &more);
            if (rc) return rc;
        }
        if (!more && d->last == 0) break; /* the frame ended and nothing follows */
        size_t before = ob->pos;
        ZSTD_inBuffer empty = {d->in, 0, 0};
        d->last = ZSTD_decompressStream(d->dctx, ob, more ? &d->ib : &empty);
        if (d->stable && ZSTD_getErrorCode(d->last) == ZSTD_error_dstSize_tooSmall) return more_than_chunk(d);
        if (ZSTD_isError(d->last)) return zerr(a, CKPT_EINVAL, "chunk '%s': zstd: %s", d->key, ZSTD_getErrorName(d->last));
        if (!more && ob->pos == before) break; /* the decoder holds nothing more */
    }
    return 0;
}

int zarr_decoder_read(zarr_decoder *d, void *buf, size_t len)
{
    const zarr_array *a = d->a;
    if (!d->active || len > a->chunk_nbytes - d->produced)
        return zerr(a, CKPT_EINVAL, "reading past the end of a chunk");
    if (d->fd < 0) {
        /* a missing chunk: the fill value, element by element from where we are */
        uint8_t *p = buf;
        for (size_t i = 0; i < len; i++) p[i] = a->fill[(d->produced + i) % a->esize];
        d->produced += len;
        return 0;
    }
    if (!a->zstd) {
        int rc = ckpt_pread_full(d->fd, buf, len, d->produced, a->label);
        if (!rc) d->produced += len;
        return rc;
    }
    ZSTD_outBuffer ob = {buf, len, 0};
    int rc = 0;
    if (d->produced == 0 && len == a->chunk_nbytes && d->in_off == 0) {
        /* The whole chunk in one buffer: libzstd decodes into it directly
         * (its window is the buffer) instead of into its own window and
         * copying out. The buffer must stay put until the frame ends
         * (zarr_decoder_end finishes it there). */
        bool more;
        rc = refill(d, &more); /* (the frame's header checked first) */
        if (!rc) decoder_reset(d, true);
        d->sob = ob;
    }
    if (!rc) rc = decode_into(d, &ob);
    if (d->stable) d->sob = ob;
    d->produced += ob.pos;
    if (rc) return rc;
    if (ob.pos < len) {
        if (d->last != 0)
            return zerr(a, CKPT_EINVAL, "chunk '%s' is a truncated zstd frame (%llu of %llu bytes)", d->key,
                        (unsigned long long)d->produced, (unsigned long long)a->chunk_nbytes);
        return zerr(a, CKPT_EINVAL, "chunk '%s' decompresses to %llu bytes, a chunk is %llu", d->key,
                    (unsigned long long)d->produced, (unsigned long long)a->chunk_nbytes);
    }
    return 0;
}

int zarr_decoder_end(zarr_decoder *d)
{
    const zarr_array *a = d->a;
    int rc = 0;
    if (d->active && d->produced != a->chunk_nbytes)
        rc = zerr(a, CKPT_EINVAL, "chunk ended early: %llu of %llu bytes read", (unsigned long long)d->produced,
                  (unsigned long long)a->chunk_nbytes);
    if (!rc && d->active && d->fd >= 0 && a->zstd && d->stable) {
        /* Decoded straight into the reader's buffer: the frame ends in it
         * (its last block, its checksum), a block with more bytes is
         * refused by libzstd (no room). Then the rest of the file as below,
         * decoding into libzstd's window again. */
        bool more = true;
        while (!rc && d->last != 0) {
            if (d->ib.pos == d->ib.size && !(rc = refill(d, &more)) && !more) break;
            if (!rc) d->last = ZSTD_decompressStream(d->dctx, &d->sob, &d->ib);
            if (!rc && ZSTD_getErrorCode(d->last) == ZSTD_error_dstSize_tooSmall) rc = more_than_chunk(d);
            else if (!rc && ZSTD_isError(d->last))
                rc = zerr(a, CKPT_EINVAL, "chunk '%s': zstd: %s", d->key, ZSTD_getErrorName(d->last));
        }
        if (!rc && d->last == 0) decoder_reset(d, false);
    }
    if (!rc && d->active && d->fd >= 0 && a->zstd && !d->stable) {
        /* Every byte of the chunk is out: the rest of the file must make none
         * (one byte of room is enough to see a bomb) and end the frame. */
        uint8_t extra;
        ZSTD_outBuffer ob = {&extra, 1, 0};
        rc = decode_into(d, &ob);
        if (!rc && ob.pos) rc = more_than_chunk(d);
    }
    if (!rc && d->active && d->fd >= 0 && a->zstd && d->last != 0)
        rc = zerr(a, CKPT_EINVAL, "chunk '%s' is a truncated zstd frame (%llu of %llu bytes)", d->key,
                  (unsigned long long)d->produced, (unsigned long long)a->chunk_nbytes);
    decoder_close(d);
    return rc;
}

int zarr_read(const zarr_array *a, zarr_sink sink, void *ctx, zarr_stats *st)
{
    if (st) memset(st, 0, sizeof *st);
    if (a->nbytes == 0) return 0;
    if (a->dirfd < 0) return zerr(a, CKPT_EINVAL, "array has no folder");
    uint8_t *out = ckpt_malloc(ZARR_IO_BYTES), *pend = ckpt_malloc(ZARR_IO_BYTES);
    zarr_decoder *d = zarr_decoder_new();
    int rc = (out && pend && d) ? 0 : ckpt_error_set(CKPT_ENOMEM, "out of memory");
    uint64_t idx[CKPT_MAX_RANK] = {0};
    scatter s = {.a = a, .sink = sink, .ctx = ctx, .pend = pend};
    s.row_bytes = a->ndim ? a->chunks[a->ndim - 1] * a->esize : a->esize;
    if (!rc) do {
            for (int k = 0; k < a->ndim; k++) {
                s.origin[k] = idx[k] * a->chunks[k];
                s.valid[k] = a->shape[k] - s.origin[k] < a->chunks[k] ? a->shape[k] - s.origin[k] : a->chunks[k];
            }
            s.pos = 0;
            rc = zarr_decoder_start(d, a, idx, st);
            for (uint64_t left = a->chunk_nbytes; !rc && left;) {
                size_t n = (size_t)(left < ZARR_IO_BYTES ? left : ZARR_IO_BYTES);
                rc = zarr_decoder_read(d, out, n);
                if (!rc) rc = scatter_bytes(&s, out, n);
                left -= n;
            }
            if (!rc) rc = zarr_decoder_end(d);
            if (!rc) rc = flush(&s);
        } while (!rc && next_index(a, idx));
    zarr_decoder_free(d);
    free(out);
    free(pend);
    return rc;
}

/* json.c — jansson wrappers that report through error.h. */
#include "common/json.h"

#include "common/error.h"
#include "common/fsutil.h"

#include <stdlib.h>
#include <string.h>

int cj_load_buf(json_t **out, const char *buf, size_t len, const char *what)
{
    json_error_t err;
    *out = json_loadb(buf, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
    if (!*out)
        return ckpt_error_set(CKPT_EINVAL, "%s: invalid JSON at line %d column %d: %s", what,
                              err.line, err.column, err.text);
    return 0;
}

int cj_load_file(json_t **out, const char *path, size_t max_bytes)
{
    char *buf;
    size_t len;
    *out = NULL;
    int rc = ckpt_read_file(path, max_bytes, &buf, &len);
    if (rc) return rc;
    rc = cj_load_buf(out, buf, len, path);
    free(buf);
    return rc;
}

static int field(const json_t *obj, const char *key, const char *what, json_t **v, bool required)
{
    *v = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    if (!*v || json_is_null(*v)) {
        *v = NULL;
        if (required) return ckpt_error_set(CKPT_ENOTFOUND, "%s: missing field '%s'", what, key);
    }
    return 0;
}

static int get_int(const json_t *obj, const char *key, int64_t *out, const char *what, bool req)
{
    json_t *v;
    int rc = field(obj, key, what, &v, req);
    if (rc || !v) return rc;
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 0;
    }
    double d = json_is_real(v) ? json_real_value(v) : 0.5;
    /* Range first: converting an out-of-range double to int64 is undefined. */
    if (json_is_real(v) && d >= -9.2e18 && d <= 9.2e18 && d == (double)(int64_t)d) {
        *out = (int64_t)json_real_value(v);
        return 0;
    }
    return ckpt_error_set(CKPT_EINVAL, "%s: field '%s' must be an integer", what, key);
}

int cj_int(const json_t *obj, const char *key, int64_t *out, const char *what)
{
    return get_int(obj, key, out, what, true);
}

int cj_int_opt(const json_t *obj, const char *key, int64_t *out, const char *what)
{
    return get_int(obj, key, out, what, false);
}

static int get_str(const json_t *obj, const char *key, const char **out, const char *what, bool req)
{
    json_t *v;
    int rc = field(obj, key, what, &v, req);
    if (rc || !v) return rc;
    if (!json_is_string(v)) return ckpt_error_set(CKPT_EINVAL, "%s: field '%s' must be a string", what, key);
    *out = json_string_value(v);
    return 0;
}

int cj_str(const json_t *obj, const char *key, const char **out, const char *what)
{
    return get_str(obj, key, out, what, true);
}

int cj_str_opt(const json_t *obj, const char *key, const char **out, const char *what)
{
    return get_str(obj, key, out, what, false);
}

int cj_bool_opt(const json_t *obj, const char *key, bool *out, const char *what)
{
    json_t *v;
    int rc = field(obj, key, what, &v, false);
    if (rc || !v) return rc;
    if (!json_is_boolean(v)) return ckpt_error_set(CKPT_EINVAL, "%s: field '%s' must be true or false", what, key);
    *out = json_is_true(v);
    return 0;
}

int cj_num_opt(const json_t *obj, const char *key, double *out, const char *what)
{
    json_t *v;
    int rc = field(obj, key, what, &v, false);
    if (rc || !v) return rc;
    if (!json_is_number(v)) return ckpt_error_set(CKPT_EINVAL, "%s: field '%s' must be a number", what, key);
    *out = json_number_value(v);
    return 0;
}

char *cj_dumps(const json_t *v, size_t flags)
{
    char *s = json_dumps(v, flags);
    if (!s) ckpt_error_set(CKPT_ENOMEM, "cannot render JSON");
    return s;
}

char *cj_render(const json_t *v)
{
    char *s = cj_dumps(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!s) return NULL;
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (!t) {
        free(s);
        ckpt_error_set(CKPT_ENOMEM, "out of memory");
        return NULL;
    }
    t[n] = '\n';
    t[n + 1] = 0;
    return t;
}

/* cj_write_file's sink: jansson's pieces gathered into 1 MiB writes. */
typedef struct {
    int fd;
    const char *path;
    char *buf;
    size_t len, cap;
    int rc;
} dump_sink;

static int sink_flush(dump_sink *d)
{
    if (!d->rc && d->len) d->rc = ckpt_write_full(d->fd, d->buf, d->len, d->path);
    d->len = 0;
    return d->rc;
}

static int sink_put(const char *piece, size_t n, void *ctx)
{
    dump_sink *d = ctx;
    while (n && !d->rc) {
        size_t room = d->cap - d->len, k = n < room ? n : room;
        memcpy(d->buf + d->len, piece, k);
        d->len += k;
        piece += k;
        n -= k;
        if (d->len == d->cap) sink_flush(d);
    }
    return d->rc ? -1 : 0;
}

int cj_write_file(const char *path, const json_t *v)
{
    /* Streamed, not rendered into one string first: a ckpt-layout.json of a
     * model with 20,000 tensors is tens of MB. Same bytes as cj_render. */
    ckpt_atomic_file af;
    dump_sink d = {.path = path, .cap = 1u << 20};
    if (!(d.buf = malloc(d.cap))) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    int rc = ckpt_atomic_open(&af, path);
    if (!rc) {
        d.fd = af.fd;
        if (json_dump_callback(v, sink_put, &d, JSON_INDENT(2) | JSON_PRESERVE_ORDER) < 0 && !d.rc)
            d.rc = ckpt_error_set(CKPT_ENOMEM, "%s: cannot render JSON", path);
        if (!d.rc) sink_put("\n", 1, &d);
        rc = sink_flush(&d);
        if (rc) ckpt_atomic_abort(&af);
        else rc = ckpt_atomic_commit(&af);
    }
    free(d.buf);
    return rc;
}

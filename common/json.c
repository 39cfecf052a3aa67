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

/* ---- rendering ----
 * jansson's json_dump_callback calls its callback for every token and
 * formats every integer with snprintf, and json_dumps grows one string by
 * realloc: on the ckpt-layout.json of a many-tensor model (tens of MB, a
 * million numbers) that was the largest part of a convert in the store. This
 * writes the same bytes (jansson's layout for JSON_INDENT(n) and
 * JSON_COMPACT, keys in insertion order) into a 1 MiB buffer handed out
 * whole; it asks jansson for what it does not write itself (reals, strings
 * with anything but printable ASCII, other flags). */
#define RENDER_FLAGS (JSON_MAX_INDENT | JSON_COMPACT | JSON_PRESERVE_ORDER)
#define RENDER_BUF (1u << 20)

typedef struct {
    json_dump_callback_t put;
    void *ctx;
    char *buf;
    size_t len;
    size_t flags;
    bool failed;
} render_out;

static void out_flush(render_out *o)
{
    if (!o->failed && o->len && o->put(o->buf, o->len, o->ctx)) o->failed = true;
    o->len = 0;
}

static void out_bytes(render_out *o, const char *p, size_t n)
{
    if (n > RENDER_BUF - o->len) out_flush(o);
    if (n >= RENDER_BUF) {
        if (!o->failed && o->put(p, n, o->ctx)) o->failed = true;
        return;
    }
    memcpy(o->buf + o->len, p, n);
    o->len += n;
}

static int out_piece(const char *p, size_t n, void *o)
{
    out_bytes(o, p, n);
    return ((render_out *)o)->failed ? -1 : 0;
}

/* jansson's dump_indent: with an indent, a newline and depth * indent spaces;
 * without, one space where space is set (not compact). */
static void out_indent(render_out *o, size_t depth, bool space)
{
    static const char spaces[] = "                                ";
    size_t n = depth * (size_t)(o->flags & JSON_MAX_INDENT);
    if (o->flags & JSON_MAX_INDENT) {
        out_bytes(o, "\n", 1);
        while (n) {
            size_t k = n < sizeof spaces - 1 ? n : sizeof spaces - 1;
            out_bytes(o, spaces, k);
            n -= k;
        }
    } else if (space && !(o->flags & JSON_COMPACT)) {
        out_bytes(o, " ", 1);
    }
}

/* A value jansson writes (reals, strings it escapes), into the same buffer. */
static void out_by_jansson(render_out *o, const json_t *v)
{
    if (json_dump_callback(v, out_piece, o, (o->flags & RENDER_FLAGS) | JSON_ENCODE_ANY))
        o->failed = true;
}

static void out_string(render_out *o, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch > 0x7e || ch == '"' ||
            ch == '\\') { /* escapes, or UTF-8 jansson checks */
            json_t *t = json_stringn_nocheck(s, n);
            if (!t)
                o->failed = true;
            else
                out_by_jansson(o, t);
            json_decref(t);
            return;
        }
    }
    out_bytes(o, "\"", 1);
    out_bytes(o, s, n);
    out_bytes(o, "\"", 1);
}

static void out_integer(render_out *o, json_int_t v)
{
    char digits[24], *p = digits + sizeof digits;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do
        *--p = (char)('0' + u % 10);
    while (u /= 10);
    if (v < 0) *--p = '-';
    out_bytes(o, p, (size_t)(digits + sizeof digits - p));
}

/* jansson's do_dump, for trees without cycles (those built here). */
static void out_value(render_out *o, const json_t *v, size_t depth)
{
    switch (json_typeof(v)) {
    case JSON_NULL:
        out_bytes(o, "null", 4);
        break;
    case JSON_TRUE:
        out_bytes(o, "true", 4);
        break;
    case JSON_FALSE:
        out_bytes(o, "false", 5);
        break;
    case JSON_INTEGER:
        out_integer(o, json_integer_value(v));
        break;
    case JSON_STRING:
        out_string(o, json_string_value(v), json_string_length(v));
        break;
    case JSON_ARRAY: {
        size_t n = json_array_size(v);
        out_bytes(o, "[", 1);
        if (n) out_indent(o, depth + 1, false);
        for (size_t i = 0; i < n && !o->failed; i++) {
            out_value(o, json_array_get(v, i), depth + 1);
            if (i + 1 < n) out_bytes(o, ",", 1);
            out_indent(o, i + 1 < n ? depth + 1 : depth, i + 1 < n);
        }
        out_bytes(o, "]", 1);
        break;
    }
    case JSON_OBJECT: {
        void *it = json_object_iter((json_t *)v);
        out_bytes(o, "{", 1);
        if (it) out_indent(o, depth + 1, false);
        while (it && !o->failed) {
            void *next = json_object_iter_next((json_t *)v, it);
            const char *key = json_object_iter_key(it);
            out_string(o, key, strlen(key));
            out_bytes(o, o->flags & JSON_COMPACT ? ":" : ": ", o->flags & JSON_COMPACT ? 1 : 2);
            out_value(o, json_object_iter_value(it), depth + 1);
            if (next) out_bytes(o, ",", 1);
            out_indent(o, next ? depth + 1 : depth, next != NULL);
            it = next;
        }
        out_bytes(o, "}", 1);
        break;
    }
    default:
        out_by_jansson(o, v); /* JSON_REAL */
    }
}

int cj_dump_to(const json_t *v, size_t flags, json_dump_callback_t put, void *ctx)
{
    /* Other flags (sorted keys, escapes), or a root json_dumps refuses: jansson's own. */
    if ((flags & ~(size_t)RENDER_FLAGS) || !(json_is_object(v) || json_is_array(v)))
        return json_dump_callback(v, put, ctx, flags);
    render_out o = {.put = put, .ctx = ctx, .flags = flags, .buf = malloc(RENDER_BUF)};
    if (!o.buf) return -1;
    out_value(&o, v, 0);
    out_flush(&o);
    free(o.buf);
    return o.failed ? -1 : 0;
}

int cj_render_to(const json_t *v, json_dump_callback_t put, void *ctx)
{
    if (cj_dump_to(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER, put, ctx)) return -1;
    return put("\n", 1, ctx);
}

/* A string growing by doubling, for cj_dumps. */
typedef struct {
    char *s;
    size_t len, cap;
} grow_buf;

static int grow_put(const char *piece, size_t n, void *ctx)
{
    grow_buf *g = ctx;
    if (n >= g->cap - g->len) {
        size_t cap = g->cap ? g->cap : 256;
        while (n >= cap - g->len)
            cap *= 2;
        char *s = realloc(g->s, cap);
        if (!s) return -1;
        g->s = s;
        g->cap = cap;
    }
    memcpy(g->s + g->len, piece, n);
    g->len += n;
    g->s[g->len] = 0;
    return 0;
}

static char *grow_done(grow_buf *g, int rc)
{
    if (rc || !g->s) {
        free(g->s);
        ckpt_error_set(CKPT_ENOMEM, "cannot render JSON");
        return NULL;
    }
    return g->s;
}

char *cj_dumps(const json_t *v, size_t flags)
{
    grow_buf g = {0};
    return grow_done(&g, cj_dump_to(v, flags, grow_put, &g));
}

char *cj_render(const json_t *v)
{
    grow_buf g = {0};
    return grow_done(&g, cj_render_to(v, grow_put, &g));
}

/* cj_write_file's sink: the renderer's pieces written to the file. */
typedef struct {
    int fd;
    const char *path;
    int rc;
} file_sink;

static int file_put(const char *piece, size_t n, void *ctx)
{
    file_sink *d = ctx;
    if (!d->rc) d->rc = ckpt_write_full(d->fd, piece, n, d->path);
    return d->rc ? -1 : 0;
}

int cj_write_file(const char *path, const json_t *v)
{
    /* Streamed, not rendered into one string first: a ckpt-layout.json of a
     * model with 20,000 tensors is tens of MB. Same bytes as cj_render. */
    ckpt_atomic_file af;
    file_sink d = {.path = path};
    int rc = ckpt_atomic_open(&af, path);
    if (rc) return rc;
    d.fd = af.fd;
    if (cj_render_to(v, file_put, &d) && !d.rc)
        d.rc = ckpt_error_set(CKPT_ENOMEM, "%s: cannot render JSON", path);
    if (d.rc) ckpt_atomic_abort(&af);
    return d.rc ? d.rc : ckpt_atomic_commit(&af);
}

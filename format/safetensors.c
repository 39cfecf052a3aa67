/*
 * safetensors.c — read, validate and write safetensors files (docs/safetensors.md).
 *
 * The reader checks the rows of docs/safetensors.md's table in the order the reference
 * implementation does (length prefix, UTF-8, JSON shape, then offsets and
 * sizes in data_offsets order, then the file length), and every failure
 * names the file, the reference error and the tensor. Nothing about a tensor
 * is handed out before the whole header has passed.
 *
 * The writer renders the header itself instead of through jansson: the
 * reference writer's bytes (serde_json: compact, fields in declaration order,
 * control characters as lowercase \u00xx) are what our files must match, and
 * jansson escapes with uppercase hex.
 */
#include "format/safetensors.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_PREFIX_LEN 8 /* the little-endian u64 N in front of the header */
#define ST_MSG_MAX 1024 /* detail part of an error message */
#define ST_SHAPE_STR 160

static const char ST_META_KEY[] = "__metadata__";

/* ---- errors ---- */

/* Sets "<path>: <ref_name>: <detail>" and returns code. */
__attribute__((format(printf, 4, 5))) static int st_fail(int code, const char *path,
                                                         const char *ref_name, const char *fmt, ...)
{
    char detail[ST_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return ckpt_error_set(code, "%s: %s: %s", path, ref_name, detail);
}

#define ST_BAD_JSON(path, ...)                                                                     \
    st_fail(CKPT_EINVAL, path, "InvalidHeaderDeserialization", __VA_ARGS__)
#define ST_LIMIT(path, ...) st_fail(CKPT_ELIMIT, path, "LimitExceeded", __VA_ARGS__)

/* "[2, 3]" for messages; truncated with "..." when it does not fit. */
static const char *st_format_shape(char *buf, size_t len, int ndim, const uint64_t *shape)
{
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%" PRIu64, i ? ", " : "", shape[i]);
    if (used < len) used += (size_t)snprintf(buf + used, len - used, "]");
    if (used >= len && len >= 4) memcpy(buf + len - 4, "...", 4);
    return buf;
}

/* ---- UTF-8 ---- */

/* Length of the longest valid UTF-8 prefix of s (Rust's str::from_utf8 rules:
 * no overlong forms, no surrogates, nothing above U+10FFFF). */
static size_t st_utf8_valid_prefix(const uint8_t *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return i;
        }
        if (len - i - 1 < need || s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += need + 1;
    }
    return len;
}

static bool st_utf8_valid(const char *s)
{
    size_t len = strlen(s);
    return st_utf8_valid_prefix((const uint8_t *)s, len) == len;
}

/* Decodes one code point of valid UTF-8; returns its length in bytes. */
static size_t st_utf8_decode(const uint8_t *s, uint32_t *cp)
{
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    size_t n = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : 2;
    uint32_t v = s[0] & (0x7Fu >> n);
    for (size_t k = 1; k < n; k++)
        v = (v << 6) | (s[k] & 0x3Fu);
    *cp = v;
    return n;
}

/* ---- JSON strings ---- */

static void st_put_u_escape(FILE *out, uint32_t unit)
{
    fprintf(out, "\\u%04" PRIx32, unit);
}

/* The two-character escape both serde_json and Python use for c, or NULL. */
static const char *st_short_escape(uint8_t c)
{
    switch (c) {
    case '"':
        return "\\\"";
    case '\\':
        return "\\\\";
    case '\b':
        return "\\b";
    case '\f':
        return "\\f";
    case '\n':
        return "\\n";
    case '\r':
        return "\\r";
    case '\t':
        return "\\t";
    default:
        return NULL;
    }
}

int st_json_put_string(FILE *out, const char *s, bool ascii_only)
{
    if (!st_utf8_valid(s))
        return ckpt_error_set(CKPT_EINVAL, "string '%.64s' is not valid UTF-8", s);
    const uint8_t *p = (const uint8_t *)s;
    fputc('"', out);
    while (*p) {
        uint8_t c = *p;
        const char *esc = st_short_escape(c);
        if (esc) {
            fputs(esc, out);
            p++;
        } else if (c < 0x20 || (ascii_only && c == 0x7F)) {
            st_put_u_escape(out, c);
            p++;
        } else if (c < 0x80 || !ascii_only) {
            fputc(c, out);
            p++;
        } else {
            uint32_t cp;
            p += st_utf8_decode(p, &cp);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                st_put_u_escape(out, 0xD800 | (cp >> 10));
                st_put_u_escape(out, 0xDC00 | (cp & 0x3FF));
            } else {
                st_put_u_escape(out, cp);
            }
        }
    }
    fputc('"', out);
    return 0;
}

/* ---- reading: the length prefix ---- */

static uint64_t st_load_le64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = ST_PREFIX_LEN - 1; i >= 0; i--)
        v = (v << 8) | b[i];
    return v;
}

/* What a file that is not safetensors is, from its first 8 bytes, or NULL.
 * Asked only when the header length is impossible: a known magic number
 * makes a far larger N than ST_MAX_HEADER or the file. */
static const char *st_foreign_format(const uint8_t *b)
{
    if (b[0] == 'P' && b[1] == 'K' && b[2] == 3 && b[3] == 4)
        return "a PyTorch (torch.save) file or another zip archive";
    if (b[0] == 0x80 && b[1] >= 2 && b[1] <= 5) return "a PyTorch (torch.save, pickle) file";
    if (!memcmp(b, "GGUF", 4)) return "a GGUF file";
    if (!memcmp(b, "\x93NUMPY", 6)) return "a NumPy .npy file";
    if (b[0] == 0x89 && !memcmp(b + 1, "HDF", 3)) return "an HDF5 (Keras .h5) file";
    return NULL;
}

/* The rows that need only the file size and its first 8 bytes (prefix is not
 * read when file_size < 8). Sets *n to the header length N. */
static int st_check_prefix(const char *path, const uint8_t *prefix, uint64_t file_size, uint64_t *n)
{
    if (file_size < ST_PREFIX_LEN)
        return st_fail(CKPT_EINVAL, path, "HeaderTooSmall",
                       "file is %" PRIu64 " bytes, shorter than the 8-byte header length",
                       file_size);
    *n = st_load_le64(prefix);
    const char *foreign = st_foreign_format(prefix);
    uint64_t end;
    if (foreign && (*n > ST_MAX_HEADER || !ckpt_add(*n, ST_PREFIX_LEN, &end) || end > file_size))
        return ckpt_error_set(CKPT_EINVAL, "%s: this is %s, not safetensors; ckpt does not read it yet "
                              "(save it with safetensors first)", path, foreign);
    if (*n > ST_MAX_HEADER)
        return st_fail(CKPT_ELIMIT, path, "HeaderTooLarge",
                       "header length %" PRIu64 " exceeds %llu bytes", *n, ST_MAX_HEADER);
    uint64_t stop;
    if (!ckpt_add(*n, ST_PREFIX_LEN, &stop) || stop > file_size)
        return st_fail(CKPT_EINVAL, path, "InvalidHeaderLength",
                       "header of %" PRIu64 " bytes runs past the end of the %" PRIu64 "-byte file",
                       *n, file_size);
    return 0;
}

/* ---- reading: the JSON header ---- */

/* jansson stops at a repeated key; its position is just past the key. Scans
 * the (valid) text before it to find that key and how deep it sits, so a
 * repeated tensor can be told from a repeated field inside an entry. */
static int st_report_duplicate(const char *path, const char *json, size_t n, size_t pos)
{
    size_t key_at = 0, key_len = 0, top_at = 0, top_len = 0, str_at = 0;
    int depth = 0, str_depth = 0, key_depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < pos && i < n; i++) {
        char c = json[i];
        if (in_str) {
            if (c == '\\') {
                i++;
            } else if (c == '"') {
                in_str = false;
                key_at = str_at;
                key_len = i + 1 - str_at;
                key_depth = str_depth;
                if (str_depth == 1) {
                    top_at = key_at;
                    top_len = key_len;
                }
            }
            continue;
        }
        if (c == '"') {
            in_str = true;
            str_at = i;
            str_depth = depth;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    json_t *key = key_len ? json_loadb(json + key_at, key_len, JSON_DECODE_ANY, NULL) : NULL;
    json_t *top = top_len ? json_loadb(json + top_at, top_len, JSON_DECODE_ANY, NULL) : NULL;
    const char *k = json_is_string(key) ? json_string_value(key) : "?";
    const char *t = json_is_string(top) ? json_string_value(top) : "?";
    int rc;
    if (key_depth == 1 && strcmp(k, ST_META_KEY) != 0)
        rc = st_fail(CKPT_EINVAL, path, "DuplicateTensor", "tensor '%s' appears more than once", k);
    else if (key_depth == 1)
        rc = ST_BAD_JSON(path, "'%s' appears more than once", k);
    else
        rc = ST_BAD_JSON(path, "duplicate key '%s' inside '%s'", k, t);
    json_decref(key);
    json_decref(top);
    return rc;
}

/* A JSON integer >= 0. */
static bool st_json_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* The dtype spelled exactly as docs/safetensors.md lists it (no lowercase aliases). */
static bool st_dtype_exact(const char *s, ckpt_dtype *out)
{
    for (int dt = 0; dt < CKPT_DT_COUNT; dt++) {
        if (strcmp(s, ckpt_dtype_name((ckpt_dtype)dt)) == 0) {
            *out = (ckpt_dtype)dt;
            return true;
        }
    }
    return false;
}

/* entry[field], which must be there and of the given jansson type. */
static int st_entry_field(const char *path, const char *name, const json_t *entry,
                          const char *field, json_type type, const char *type_name, json_t **out)
{
    *out = json_object_get(entry, field);
    if (!*out) return ST_BAD_JSON(path, "tensor '%s': missing field '%s'", name, field);
    if (json_typeof(*out) != type)
        return ST_BAD_JSON(path, "tensor '%s': field '%s' must be %s", name, field, type_name);
    return 0;
}

/* Copies a JSON array of non-negative integers (size already checked) to out. */
static int st_read_u64s(const char *path, const char *name, const char *field, const json_t *arr,
                        uint64_t *out)
{
    for (size_t i = 0; i < json_array_size(arr); i++) {
        if (!st_json_u64(json_array_get(arr, i), &out[i]))
            return ST_BAD_JSON(path, "tensor '%s': %s[%zu] is not a non-negative integer", name,
                               field, i);
    }
    return 0;
}

static int st_load_tensor(const char *path, const char *name, const json_t *entry, st_tensor *t)
{
    if (!json_is_object(entry))
        return ST_BAD_JSON(path, "tensor '%s': entry is not an object", name);
    json_t *dtype, *shape, *offsets;
    int rc = st_entry_field(path, name, entry, "dtype", JSON_STRING, "a string", &dtype);
    if (!rc) rc = st_entry_field(path, name, entry, "shape", JSON_ARRAY, "an array", &shape);
    if (!rc)
        rc = st_entry_field(path, name, entry, "data_offsets", JSON_ARRAY, "an array", &offsets);
    if (rc) return rc;

    if (!st_dtype_exact(json_string_value(dtype), &t->dtype))
        return ST_BAD_JSON(path, "tensor '%s': unknown dtype '%.64s'", name,
                           json_string_value(dtype));
    size_t rank = json_array_size(shape);
    if (rank > CKPT_MAX_RANK)
        return ST_LIMIT(path, "tensor '%s' has rank %zu, at most %d is supported", name, rank,
                        CKPT_MAX_RANK);
    t->ndim = (int)rank;
    rc = st_read_u64s(path, name, "shape", shape, t->shape);
    if (rc) return rc;
    if (json_array_size(offsets) != 2)
        return ST_BAD_JSON(path, "tensor '%s': data_offsets must hold 2 integers, not %zu", name,
                           json_array_size(offsets));
    uint64_t be[2];
    rc = st_read_u64s(path, name, "data_offsets", offsets, be);
    t->begin = be[0];
    t->end = be[1];
    return rc;
}

static int st_load_meta(st_file *f, const json_t *meta)
{
    if (json_is_null(meta)) return 0; /* the reference reads null as "no metadata" */
    if (!json_is_object(meta))
        return ST_BAD_JSON(f->path, "__metadata__ must be an object of strings");
    size_t n = json_object_size(meta);
    if (n > ST_MAX_META)
        return ST_LIMIT(f->path, "__metadata__ has %zu entries, at most %d are supported", n,
                        ST_MAX_META);
    f->meta_keys = ckpt_calloc(n, sizeof *f->meta_keys);
    f->meta_vals = ckpt_calloc(n, sizeof *f->meta_vals);
    if (!f->meta_keys || !f->meta_vals) return CKPT_ENOMEM;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)meta, key, val)
    {
        if (!json_is_string(val))
            return ST_BAD_JSON(f->path, "__metadata__ value of '%.64s' is not a string", key);
        f->meta_keys[f->nmeta] = ckpt_strdup(key);
        f->meta_vals[f->nmeta] = ckpt_strdup(json_string_value(val));
        f->nmeta++;
        if (!f->meta_keys[f->nmeta - 1] || !f->meta_vals[f->nmeta - 1]) return CKPT_ENOMEM;
    }
    return 0;
}

/* Fills f->tensors (file order) and the metadata from the parsed header. */
static int st_load_entries(st_file *f, const json_t *root)
{
    if (!json_is_object(root)) return ST_BAD_JSON(f->path, "header is not a JSON object");
    const json_t *meta = json_object_get(root, ST_META_KEY);
    size_t count = json_object_size(root) - (meta ? 1 : 0);
    if (count > ST_MAX_TENSORS)
        return ST_LIMIT(f->path, "header lists %zu tensors, at most %d are supported", count,
                        ST_MAX_TENSORS);
    int rc = meta ? st_load_meta(f, meta) : 0;
    if (rc) return rc;
    f->tensors = ckpt_calloc(count, sizeof *f->tensors);
    if (!f->tensors) return CKPT_ENOMEM;
    const char *name;
    json_t *entry;
    json_object_foreach((json_t *)root, name, entry)
    {
        if (strcmp(name, ST_META_KEY) == 0) continue;
        size_t len = strlen(name);
        if (len > ST_MAX_NAME)
            return ST_LIMIT(f->path, "tensor name of %zu bytes ('%.64s...'), at most %d", len, name,
                            ST_MAX_NAME);
        st_tensor *t = &f->tensors[f->ntensors];
        t->name = ckpt_strdup(name);
        if (!t->name) return CKPT_ENOMEM;
        f->ntensors++;
        rc = st_load_tensor(f->path, name, entry, t);
        if (rc) return rc;
    }
    return 0;
}

/* Rows InvalidHeader and InvalidHeaderDeserialization (and DuplicateTensor). */
static int st_parse_header(st_file *f, const char *json, size_t n)
{
    size_t valid = st_utf8_valid_prefix((const uint8_t *)json, n);
    if (valid != n)
        return st_fail(CKPT_EINVAL, f->path, "InvalidHeader",
                       "header is not valid UTF-8 (bad byte 0x%02x at header offset %zu)",
                       (unsigned)(uint8_t)json[valid], valid);
    json_error_t err;
    json_t *root = json_loadb(json, n, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        if (json_error_code(&err) == json_error_duplicate_key && err.position >= 0)
            return st_report_duplicate(f->path, json, n, (size_t)err.position);
        return ST_BAD_JSON(f->path, "invalid JSON at header offset %d: %s", err.position, err.text);
    }
    int rc = st_load_entries(f, root);
    json_decref(root);
    return rc;
}

/* ---- reading: offsets and sizes ---- */

static int st_cmp_offsets(const void *a, const void *b)
{
    const st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Rows InvalidOffset, ValidationOverflow, MisalignedSlice, TensorInvalidInfo:
 * tensors in data_offsets order tile the data section exactly. Sets *data_end
 * to the end of the last tensor. */
static int st_validate_offsets(st_file *f, uint64_t *data_end)
{
    qsort(f->tensors, f->ntensors, sizeof *f->tensors, st_cmp_offsets);
    uint64_t expect = 0;
    char shp[ST_SHAPE_STR];
    for (size_t i = 0; i < f->ntensors; i++) {
        st_tensor *t = &f->tensors[i];
        if (t->begin != expect)
            return st_fail(CKPT_EINVAL, f->path, "InvalidOffset",
                           "tensor '%s' begins at %" PRIu64 ", expected %" PRIu64, t->name,
                           t->begin, expect);
        if (t->end < t->begin)
            return st_fail(CKPT_EINVAL, f->path, "InvalidOffset",
                           "tensor '%s' ends at %" PRIu64 ", before it begins at %" PRIu64, t->name,
                           t->end, t->begin);
        expect = t->end;
        const char *dt = ckpt_dtype_name(t->dtype);
        st_format_shape(shp, sizeof shp, t->ndim, t->shape);
        uint64_t nbytes;
        int rc = ckpt_dtype_nbytes(t->dtype, t->ndim, t->shape, &nbytes);
        if (rc == CKPT_ELIMIT)
            return st_fail(CKPT_ELIMIT, f->path, "ValidationOverflow",
                           "tensor '%s': %s x %s overflows 64 bits", t->name, dt, shp);
        if (rc)
            return st_fail(CKPT_EINVAL, f->path, "MisalignedSlice",
                           "tensor '%s': %s x %s is not a whole number of bytes", t->name, dt, shp);
        if (t->end - t->begin != nbytes)
            return st_fail(CKPT_EINVAL, f->path, "TensorInvalidInfo",
                           "tensor '%s' has data_offsets [%" PRIu64 ", %" PRIu64 "] (%" PRIu64
                           " bytes) but %s x %s is %" PRIu64 " bytes",
                           t->name, t->begin, t->end, t->end - t->begin, dt, shp, nbytes);
        t->nbytes = nbytes;
    }
    *data_end = expect;
    return 0;
}

static int st_cmp_by_name(const void *a, const void *b, void *ctx)
{
    const st_tensor *tensors = ctx;
    return strcmp(tensors[*(const size_t *)a].name, tensors[*(const size_t *)b].name);
}

/* Absolute offsets and the by-name index, once everything has passed. */
static int st_index_tensors(st_file *f)
{
    f->by_name = ckpt_calloc(f->ntensors, sizeof *f->by_name);
    if (!f->by_name) return CKPT_ENOMEM;
    for (size_t i = 0; i < f->ntensors; i++) {
        f->tensors[i].offset = f->data_start + f->tensors[i].begin;
        f->by_name[i] = i;
    }
    qsort_r(f->by_name, f->ntensors, sizeof *f->by_name, st_cmp_by_name, f->tensors);
    return 0;
}

static void st_init(st_file *f)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

int st_parse(st_file *f, const char *name, const uint8_t *buf, size_t len, uint64_t file_size)
{
    st_init(f);
    f->path = ckpt_strdup(name);
    if (!f->path) return CKPT_ENOMEM;
    uint64_t n = 0, data_end = 0;
    int rc = 0;
    if (file_size >= ST_PREFIX_LEN && len < ST_PREFIX_LEN)
        rc =
            ckpt_error_set(CKPT_EINVAL, "%s: st_parse needs the first 8 bytes, got %zu", name, len);
    if (!rc) rc = st_check_prefix(name, buf, file_size, &n);
    if (!rc && len - ST_PREFIX_LEN < n)
        rc = ckpt_error_set(CKPT_EINVAL,
                            "%s: st_parse needs the first %" PRIu64 " bytes of the file, got %zu",
                            name, n + ST_PREFIX_LEN, len);
    if (!rc) {
        f->file_size = file_size;
        f->header_len = n;
        f->data_start = n + ST_PREFIX_LEN;
        rc = st_parse_header(f, (const char *)buf + ST_PREFIX_LEN, (size_t)n);
    }
    if (!rc) rc = st_validate_offsets(f, &data_end);
    if (!rc) {
        uint64_t total;
        if (!ckpt_add(data_end, f->data_start, &total) || total != file_size) {
            const char *last = f->ntensors ? f->tensors[f->ntensors - 1].name : NULL;
            rc = st_fail(CKPT_EINVAL, name, "MetadataIncompleteBuffer",
                         "8 + header %" PRIu64 " + data %" PRIu64 " (through %s%s%s) is %" PRIu64
                         " bytes, but the file is %" PRIu64 " bytes",
                         n, data_end, last ? "tensor '" : "no tensor", last ? last : "",
                         last ? "'" : "", f->data_start + data_end, file_size);
        }
    }
    if (!rc) rc = st_index_tensors(f);
    if (rc) st_close(f);
    return rc;
}

int st_open(st_file *f, const char *path)
{
    st_init(f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return ckpt_error_set(CKPT_ENOTFOUND, "%s: no such file", path);
        return ckpt_error_sys("%s: open", path);
    }
    struct stat st;
    int rc = 0;
    uint8_t prefix[ST_PREFIX_LEN];
    uint64_t n = 0;
    uint8_t *buf = NULL;
    if (fstat(fd, &st) < 0)
        rc = ckpt_error_sys("%s: stat", path);
    else if (!S_ISREG(st.st_mode))
        rc = ckpt_error_set(CKPT_EINVAL, "%s: not a regular file", path);
    uint64_t size = rc ? 0 : (uint64_t)st.st_size;
    if (!rc && size >= ST_PREFIX_LEN) rc = ckpt_pread_full(fd, prefix, sizeof prefix, 0, path);
    if (!rc) rc = st_check_prefix(path, prefix, size, &n);
    if (!rc) {
        buf = ckpt_malloc((size_t)n + ST_PREFIX_LEN);
        rc = buf ? ckpt_pread_full(fd, buf, (size_t)n + ST_PREFIX_LEN, 0, path) : CKPT_ENOMEM;
    }
    if (!rc) rc = st_parse(f, path, buf, (size_t)n + ST_PREFIX_LEN, size);
    free(buf);
    if (rc) {
        close(fd);
        return rc;
    }
    f->fd = fd;
    return 0;
}

void st_close(st_file *f)
{
    if (f->fd >= 0) close(f->fd);
    for (size_t i = 0; i < f->ntensors; i++)
        free(f->tensors[i].name);
    for (size_t i = 0; i < f->nmeta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_vals[i]);
    }
    free(f->tensors);
    free(f->by_name);
    free(f->meta_keys);
    free(f->meta_vals);
    free(f->path);
    st_init(f);
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    size_t lo = 0, hi = f->ntensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const st_tensor *t = &f->tensors[f->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

const char *st_meta_get(const st_file *f, const char *key)
{
    for (size_t i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_vals[i];
    return NULL;
}

int st_read_tensor(const st_file *f, const st_tensor *t, void *buf)
{
    if (f->fd < 0)
        return ckpt_error_set(CKPT_EINVAL, "%s: parsed from memory, tensor '%s' has no bytes",
                              f->path, t->name);
    if (t->nbytes > SIZE_MAX)
        return ckpt_error_set(CKPT_ELIMIT, "%s: tensor '%s' is too large to read at once", f->path,
                              t->name);
    return ckpt_pread_full(f->fd, buf, (size_t)t->nbytes, t->offset, f->path);
}

/* ---- writing ---- */

void st_layout_init(st_layout *l)
{
    memset(l, 0, sizeof *l);
}

static int st_layout_check_open(const st_layout *l)
{
    if (l->finished)
        return ckpt_error_set(CKPT_EINVAL, "safetensors layout changed after st_layout_finish");
    return 0;
}

/* A name or metadata string we are about to write. */
static int st_check_out_string(const char *what, const char *s)
{
    if (!s) return ckpt_error_set(CKPT_EINVAL, "%s is missing", what);
    size_t len = strlen(s);
    if (len > ST_MAX_NAME)
        return ckpt_error_set(CKPT_ELIMIT, "LimitExceeded: %s '%.64s...' is %zu bytes, at most %d",
                              what, s, len, ST_MAX_NAME);
    if (!st_utf8_valid(s))
        return ckpt_error_set(CKPT_EINVAL, "%s '%.64s' is not valid UTF-8", what, s);
    return 0;
}

int st_layout_add(st_layout *l, const char *name, ckpt_dtype dt, int ndim, const uint64_t *shape,
                  size_t user)
{
    int rc = st_layout_check_open(l);
    if (!rc) rc = st_check_out_string("tensor name", name);
    if (rc) return rc;
    if (strcmp(name, ST_META_KEY) == 0)
        return ckpt_error_set(CKPT_EINVAL, "'%s' cannot be a tensor name", ST_META_KEY);
    if ((unsigned)dt >= CKPT_DT_COUNT)
        return ckpt_error_set(CKPT_EINVAL, "tensor '%s': invalid dtype %d", name, (int)dt);
    if (ndim < 0 || ndim > CKPT_MAX_RANK)
        return ckpt_error_set(CKPT_ELIMIT, "LimitExceeded: tensor '%s' has rank %d, at most %d",
                              name, ndim, CKPT_MAX_RANK);
    if (l->ntensors >= ST_MAX_TENSORS)
        return ckpt_error_set(CKPT_ELIMIT, "LimitExceeded: more than %d tensors in one file",
                              ST_MAX_TENSORS);
    rc = ckpt_grow(&l->tensors, &l->cap, l->ntensors + 1, sizeof *l->tensors);
    if (rc) return rc;
    st_out_tensor *t = &l->tensors[l->ntensors];
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = ndim;
    if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->user = user;
    rc = ckpt_dtype_nbytes(dt, ndim, t->shape, &t->nbytes);
    if (rc) return ckpt_error_prefix(rc, "tensor '%s'", name);
    t->name = ckpt_strdup(name);
    if (!t->name) return CKPT_ENOMEM;
    l->ntensors++;
    return 0;
}

/* Index of key in the sorted metadata, or where it would go (*found false). */
static size_t st_meta_search(const st_layout *l, const char *key, bool *found)
{
    size_t lo = 0, hi = l->nmeta;
    *found = false;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(key, l->meta_keys[mid]);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

int st_layout_set_meta(st_layout *l, const char *key, const char *val)
{
    int rc = st_layout_check_open(l);
    if (!rc) rc = st_check_out_string("metadata key", key);
    if (!rc) rc = st_check_out_string("metadata value", val);
    if (rc) return rc;
    bool found;
    size_t at = st_meta_search(l, key, &found);
    char *v = ckpt_strdup(val);
    if (!v) return CKPT_ENOMEM;
    if (found) {
        free(l->meta_vals[at]);
        l->meta_vals[at] = v;
        return 0;
    }
    char *k = ckpt_strdup(key);
    size_t kcap = l->meta_cap, vcap = l->meta_cap;
    if (!k)
        rc = CKPT_ENOMEM;
    else if (l->nmeta >= ST_MAX_META)
        rc = ckpt_error_set(CKPT_ELIMIT, "LimitExceeded: more than %d metadata entries",
                            ST_MAX_META);
    if (!rc) rc = ckpt_grow(&l->meta_keys, &kcap, l->nmeta + 1, sizeof *l->meta_keys);
    if (!rc) rc = ckpt_grow(&l->meta_vals, &vcap, l->nmeta + 1, sizeof *l->meta_vals);
    if (rc) {
        free(k);
        free(v);
        return rc;
    }
    l->meta_cap = kcap < vcap ? kcap : vcap;
    size_t tail = (l->nmeta - at) * sizeof(char *);
    memmove(&l->meta_keys[at + 1], &l->meta_keys[at], tail);
    memmove(&l->meta_vals[at + 1], &l->meta_vals[at], tail);
    l->meta_keys[at] = k;
    l->meta_vals[at] = v;
    l->nmeta++;
    return 0;
}

static int st_cmp_out_name(const void *a, const void *b)
{
    return strcmp((*(const st_out_tensor *const *)a)->name,
                  (*(const st_out_tensor *const *)b)->name);
}

static int st_layout_check_unique(const st_layout *l)
{
    const st_out_tensor **sorted = ckpt_calloc(l->ntensors, sizeof *sorted);
    if (!sorted) return CKPT_ENOMEM;
    for (size_t i = 0; i < l->ntensors; i++)
        sorted[i] = &l->tensors[i];
    qsort(sorted, l->ntensors, sizeof *sorted, st_cmp_out_name);
    int rc = 0;
    for (size_t i = 1; i < l->ntensors && !rc; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0)
            rc = ckpt_error_set(CKPT_EINVAL, "DuplicateTensor: tensor '%s' added twice",
                                sorted[i]->name);
    free(sorted);
    return rc;
}

/* The reference writer's order: dtype descending, then name ascending. */
static int st_cmp_out_order(const void *a, const void *b)
{
    const st_out_tensor *x = a, *y = b;
    if (x->dtype != y->dtype) return x->dtype > y->dtype ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Writes the header JSON; t->offset receives the relative begin of each
 * tensor and *data_len the size of the data section. */
static int st_render_json(FILE *out, st_layout *l, uint64_t *data_len)
{
    int rc = 0;
    fputc('{', out);
    if (l->nmeta) {
        fprintf(out, "\"%s\":{", ST_META_KEY);
        for (size_t i = 0; i < l->nmeta && !rc; i++) {
            if (i) fputc(',', out);
            rc = st_json_put_string(out, l->meta_keys[i], false);
            fputc(':', out);
            if (!rc) rc = st_json_put_string(out, l->meta_vals[i], false);
        }
        fputc('}', out);
    }
    uint64_t pos = 0;
    for (size_t i = 0; i < l->ntensors && !rc; i++) {
        st_out_tensor *t = &l->tensors[i];
        uint64_t end;
        if (!ckpt_add(pos, t->nbytes, &end))
            return ckpt_error_set(CKPT_ELIMIT, "safetensors data section overflows 64 bits");
        if (i || l->nmeta) fputc(',', out);
        rc = st_json_put_string(out, t->name, false);
        fprintf(out, ":{\"dtype\":\"%s\",\"shape\":[", ckpt_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++)
            fprintf(out, "%s%" PRIu64, d ? "," : "", t->shape[d]);
        fprintf(out, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", pos, end);
        t->offset = pos;
        pos = end;
    }
    fputc('}', out);
    *data_len = pos;
    return rc;
}

/* Renders 8-byte N + JSON + space padding into l->header. */
static int st_render_header(st_layout *l)
{
    char *buf = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&buf, &size);
    if (!out) return ckpt_error_sys("safetensors header: open_memstream");
    static const uint8_t zero_prefix[ST_PREFIX_LEN];
    fwrite(zero_prefix, 1, sizeof zero_prefix, out);
    uint64_t data_len = 0;
    int rc = st_render_json(out, l, &data_len);
    long json_end = ftell(out);
    for (long i = json_end; !rc && i >= 0 && (i - ST_PREFIX_LEN) % 8 != 0; i++)
        fputc(' ', out);
    bool failed = ferror(out) || json_end < 0;
    if (fclose(out) != 0 || failed)
        rc = rc ? rc : ckpt_error_set(CKPT_ENOMEM, "safetensors header: cannot render");
    if (rc) {
        free(buf);
        return rc;
    }
    uint64_t n = size - ST_PREFIX_LEN;
    if (n > ST_MAX_HEADER) {
        free(buf);
        return ckpt_error_set(CKPT_ELIMIT,
                              "HeaderTooLarge: header would be %" PRIu64
                              " bytes, readers accept at most %llu",
                              n, ST_MAX_HEADER);
    }
    for (int i = 0; i < ST_PREFIX_LEN; i++)
        buf[i] = (char)(uint8_t)(n >> (8 * i));
    l->header = (uint8_t *)buf;
    l->header_len = size;
    for (size_t i = 0; i < l->ntensors; i++)
        l->tensors[i].offset += size;
    l->file_size = size + data_len;
    return 0;
}

int st_layout_finish(st_layout *l)
{
    if (l->finished) return 0;
    int rc = st_layout_check_unique(l);
    if (rc) return rc;
    if (l->ntensors) qsort(l->tensors, l->ntensors, sizeof *l->tensors, st_cmp_out_order);
    rc = st_render_header(l);
    if (rc) return rc;
    l->finished = true;
    return 0;
}

void st_layout_free(st_layout *l)
{
    for (size_t i = 0; i < l->ntensors; i++)
        free(l->tensors[i].name);
    for (size_t i = 0; i < l->nmeta; i++) {
        free(l->meta_keys[i]);
        free(l->meta_vals[i]);
    }
    free(l->tensors);
    free(l->meta_keys);
    free(l->meta_vals);
    free(l->header);
    st_layout_init(l);
}

/* The file must come out exactly as long as the layout says: a fill that
 * wrote short (or long) would otherwise leave a file readers reject. */
static int st_check_written_size(int fd, const char *path, uint64_t want)
{
    struct stat st;
    if (fstat(fd, &st) < 0) return ckpt_error_sys("%s: stat", path);
    if ((uint64_t)st.st_size != want)
        return ckpt_error_set(CKPT_EINVAL, "%s: wrote %lld bytes, the layout needs %" PRIu64, path,
                              (long long)st.st_size, want);
    return 0;
}

int st_write_file(const char *path, const st_layout *l, st_fill_fn fill, void *ctx)
{
    if (!l->finished)
        return ckpt_error_set(CKPT_EINVAL, "%s: st_layout_finish was not called", path);
    if (!fill && l->ntensors)
        return ckpt_error_set(CKPT_EINVAL, "%s: no fill function for the tensor bytes", path);
    ckpt_atomic_file af;
    int rc = ckpt_atomic_open(&af, path);
    if (rc) return rc;
    rc = ckpt_pwrite_full(af.fd, l->header, l->header_len, 0, path);
    for (size_t i = 0; i < l->ntensors && !rc; i++)
        rc = fill(ctx, &l->tensors[i], af.fd, path);
    if (!rc) rc = st_check_written_size(af.fd, path, l->file_size);
    if (rc) {
        ckpt_atomic_abort(&af);
        return rc;
    }
    return ckpt_atomic_commit(&af);
}

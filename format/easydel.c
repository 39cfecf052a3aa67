/* easydel.c — EasyDeL / eformer TensorStore checkpoints (easydel.h, docs/easydel.md). */
#include "format/easydel.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool easydel_is_checkpoint(const char *dir)
{
    if (!ckpt_is_dir(dir)) return false;
    char *p = ckpt_path_join(dir, EASYDEL_INDEX_FILE);
    bool yes = p && ckpt_exists(p);
    free(p);
    return yes;
}

char *easydel_legacy_weights(const char *dir)
{
    if (!ckpt_is_dir(dir)) return NULL;
    static const char *const names[] = {EASYDEL_LEGACY_INDEX, EASYDEL_LEGACY_MODEL};
    for (size_t i = 0; i < 2; i++) {
        char *p = ckpt_path_join(dir, names[i]);
        if (p && ckpt_exists(p)) return p;
        free(p);
    }
    return NULL;
}

bool easydel_is_legacy(const char *dir)
{
    char *p = easydel_legacy_weights(dir);
    bool yes = p != NULL;
    free(p);
    return yes;
}

size_t easydel_param_suffix(const char *key, bool (*is_param)(void *ctx, const char *name), void *ctx)
{
    for (const char *p = key; (p = strchr(p, '.')); p++)
        if (is_param(ctx, p + 1)) return (size_t)(p + 1 - key);
    return (size_t)-1;
}

bool easydel_slot_before(const char *key, size_t at, char *slot, size_t slot_len)
{
    if (at < 2 || key[at - 1] != '.') return false;
    size_t start = at - 1;
    while (start > 0 && key[start - 1] != '.') start--;
    size_t n = at - 1 - start;
    if (!n || n >= slot_len) return false;
    memcpy(slot, key + start, n);
    slot[n] = '\0';
    return true;
}

const char *easydel_jax_dtype_name(ckpt_dtype dt)
{
    switch (dt) {
    case CKPT_DT_BOOL: return "bool";
    case CKPT_DT_U8: return "uint8";
    case CKPT_DT_I8: return "int8";
    case CKPT_DT_I16: return "int16";
    case CKPT_DT_U16: return "uint16";
    case CKPT_DT_F16: return "float16";
    case CKPT_DT_BF16: return "bfloat16";
    case CKPT_DT_I32: return "int32";
    case CKPT_DT_U32: return "uint32";
    case CKPT_DT_F32: return "float32";
    case CKPT_DT_C64: return "complex64";
    case CKPT_DT_F64: return "float64";
    case CKPT_DT_I64: return "int64";
    case CKPT_DT_U64: return "uint64";
    case CKPT_DT_F8_E4M3: return "float8_e4m3fn";
    case CKPT_DT_F8_E5M2: return "float8_e5m2";
    case CKPT_DT_F8_E4M3FNUZ: return "float8_e4m3fnuz";
    case CKPT_DT_F8_E5M2FNUZ: return "float8_e5m2fnuz";
    default: return "?";
    }
}

void easydel_close(easydel_ckpt *c)
{
    if (!c) return;
    for (size_t i = 0; i < c->narrays; i++) {
        free(c->arrays[i].prefix);
        free(c->arrays[i].path);
        free(c->arrays[i].key);
        zarr_close(&c->arrays[i].z);
    }
    free(c->arrays);
    free(c->version);
    free(c->dir);
    if (c->dirfd >= 0) close(c->dirfd);
    memset(c, 0, sizeof *c);
    c->dirfd = -1;
}

const easydel_array *easydel_find(const easydel_ckpt *c, const char *prefix, const char *key)
{
    for (size_t i = 0; i < c->narrays; i++)
        if (!strcmp(c->arrays[i].prefix, prefix) && !strcmp(c->arrays[i].key, key)) return &c->arrays[i];
    return NULL;
}

/* One index entry: {"path", "shape", "dtype"}; the array opened and checked against it. */
static int add_entry(easydel_ckpt *c, size_t *cap, const char *prefix, const json_t *e, size_t i)
{
    char what[160];
    snprintf(what, sizeof what, "%s: %s entry %zu", EASYDEL_INDEX_FILE, *prefix ? prefix : "arrays", i);
    if (!json_is_object(e)) return ckpt_error_set(CKPT_EINVAL, "%s is not an object", what);
    const char *path = NULL;
    int rc = cj_str(e, "path", &path, what);
    if (rc) return rc;
    /* the label of every later message: the array's path in the checkpoint */
    char label[512];
    snprintf(label, sizeof label, "%s: array '%.300s'", c->dir, path);
    if (!zarr_rel_path_safe(path))
        return ckpt_error_set(CKPT_EINVAL, "%s: the path leaves the checkpoint folder or is not a plain relative path",
                              label);
    size_t plen = strlen(prefix);
    if (plen && (strncmp(path, prefix, plen) || path[plen] != '/'))
        return ckpt_error_set(CKPT_EINVAL, "%s: listed under prefix '%s' but not in its folder", label, prefix);
    const json_t *shape = json_object_get(e, "shape");
    const char *dtype = NULL;
    if ((rc = cj_str(e, "dtype", &dtype, label))) return rc;
    if (!json_is_array(shape)) return ckpt_error_set(CKPT_EINVAL, "%s: the index's 'shape' is not a list", label);
    if (c->narrays >= EASYDEL_MAX_ARRAYS)
        return ckpt_error_set(CKPT_ELIMIT, "%s: more than %d arrays", EASYDEL_INDEX_FILE, EASYDEL_MAX_ARRAYS);
    if (ckpt_grow(&c->arrays, cap, c->narrays + 1, sizeof *c->arrays)) return CKPT_ENOMEM;
    easydel_array *a = &c->arrays[c->narrays];
    memset(a, 0, sizeof *a);
    a->z.dirfd = -1;
    a->prefix = ckpt_strdup(prefix);
    a->path = ckpt_strdup(path);
    a->key = ckpt_strdup(path + (plen ? plen + 1 : 0));
    if (!a->prefix || !a->path || !a->key) {
        free(a->prefix);
        free(a->path);
        free(a->key);
        return CKPT_ENOMEM;
    }
    for (char *p = a->key; *p; p++)
        if (*p == '/') *p = '.';
    c->narrays++;
    for (size_t j = 0; j + 1 < c->narrays; j++)
        if (!strcmp(c->arrays[j].path, path))
            return ckpt_error_set(CKPT_EINVAL, "%s: listed twice in %s", label, EASYDEL_INDEX_FILE);
    if ((rc = zarr_open(&a->z, c->dirfd, path, label))) return rc;
    const char *want = easydel_jax_dtype_name(a->z.dtype);
    if (strcmp(dtype, want))
        return ckpt_error_set(CKPT_EINVAL, "%s: the index says dtype '%.32s', .zarray holds %s (%s)", label, dtype,
                              a->z.dtype_str, want);
    bool same = json_array_size(shape) == (size_t)a->z.ndim;
    for (int d = 0; same && d < a->z.ndim; d++) {
        const json_t *x = json_array_get(shape, (size_t)d);
        same = json_is_integer(x) && json_integer_value(x) >= 0 && (uint64_t)json_integer_value(x) == a->z.shape[d];
    }
    if (!same) return ckpt_error_set(CKPT_EINVAL, "%s: the index's shape differs from .zarray's", label);
    if (!ckpt_add(c->total_nbytes, a->z.nbytes, &c->total_nbytes) || c->total_nbytes > EASYDEL_MAX_TOTAL_BYTES)
        return ckpt_error_set(CKPT_ELIMIT, "%s: the arrays hold more than %llu bytes", EASYDEL_INDEX_FILE,
                              (unsigned long long)EASYDEL_MAX_TOTAL_BYTES);
    return 0;
}

static int read_step(easydel_ckpt *c)
{
    char *p = ckpt_path_join(c->dir, "metadata.json");
    if (!p) return CKPT_ENOMEM;
    int rc = 0;
    if (ckpt_exists(p)) {
        json_t *m = NULL;
        rc = cj_load_file(&m, p, EASYDEL_META_MAX_BYTES);
        if (!rc && !json_is_object(m)) rc = ckpt_error_set(CKPT_EINVAL, "%s: not a JSON object", p);
        const json_t *s = rc ? NULL : json_object_get(m, "step");
        if (s && !json_is_null(s)) {
            if (!json_is_integer(s) || json_integer_value(s) < 0)
                rc = ckpt_error_set(CKPT_EINVAL, "%s: 'step' is not a non-negative integer", p);
            else {
                c->step = json_integer_value(s);
                c->has_step = true;
            }
        }
        json_decref(m);
    }
    free(p);
    return rc;
}

int easydel_open(easydel_ckpt *c, const char *dir)
{
    memset(c, 0, sizeof *c);
    c->dirfd = -1;
    c->dir = ckpt_strdup(dir);
    if (!c->dir) return CKPT_ENOMEM;
    size_t n = strlen(c->dir);
    while (n > 1 && c->dir[n - 1] == '/') c->dir[--n] = 0;
    c->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (c->dirfd < 0) {
        int rc = ckpt_error_sys("%s", dir);
        easydel_close(c);
        return rc;
    }
    json_t *ix = NULL;
    char *ipath = ckpt_path_join(c->dir, EASYDEL_INDEX_FILE);
    int rc = ipath ? 0 : CKPT_ENOMEM;
    /* the index itself is opened beneath the folder: no link out */
    int ifd = rc ? rc : zarr_open_beneath(c->dirfd, EASYDEL_INDEX_FILE, false, c->dir);
    if (ifd < 0) rc = ifd;
    else close(ifd);
    if (!rc) rc = cj_load_file(&ix, ipath, EASYDEL_INDEX_MAX_BYTES);
    if (!rc && !json_is_object(ix)) rc = ckpt_error_set(CKPT_EINVAL, "%s: not a JSON object", ipath);
    const char *fmt = NULL;
    if (!rc) rc = cj_str(ix, "format", &fmt, ipath);
    if (!rc && strcmp(fmt, "tensorstore"))
        rc = ckpt_error_set(CKPT_EINVAL, "%s: format '%.64s' is not \"tensorstore\"", ipath, fmt);
    const json_t *ver = rc ? NULL : json_object_get(ix, "version");
    if (json_is_string(ver) && !(c->version = ckpt_strdup(json_string_value(ver)))) rc = CKPT_ENOMEM;
    size_t cap = 0;
    if (!rc) {
        const json_t *prefixes = json_object_get(ix, "prefixes"), *arrays = json_object_get(ix, "arrays");
        if (prefixes && !json_is_object(prefixes))
            rc = ckpt_error_set(CKPT_EINVAL, "%s: 'prefixes' is not an object", ipath);
        if (!rc && arrays && !json_is_array(arrays))
            rc = ckpt_error_set(CKPT_EINVAL, "%s: 'arrays' is not a list", ipath);
        if (!rc && !prefixes && !arrays) rc = ckpt_error_set(CKPT_EINVAL, "%s: neither 'prefixes' nor 'arrays'", ipath);
        const char *pk;
        const json_t *list;
        if (!rc && prefixes) json_object_foreach((json_t *)prefixes, pk, list)
            {
                if (rc) break;
                if (!zarr_rel_path_safe(pk) || strchr(pk, '/')) {
                    rc = ckpt_error_set(CKPT_EINVAL, "%s: prefix '%.64s' is not a plain folder name", ipath, pk);
                    break;
                }
                if (!json_is_array(list)) {
                    rc = ckpt_error_set(CKPT_EINVAL, "%s: prefix '%s' is not a list", ipath, pk);
                    break;
                }
                for (size_t i = 0; !rc && i < json_array_size(list); i++)
                    rc = add_entry(c, &cap, pk, json_array_get(list, i), i);
            }
        for (size_t i = 0; !rc && arrays && i < json_array_size(arrays); i++)
            rc = add_entry(c, &cap, "", json_array_get(arrays, i), i);
    }
    if (!rc) rc = read_step(c);
    json_decref(ix);
    free(ipath);
    if (rc) easydel_close(c);
    return rc;
}

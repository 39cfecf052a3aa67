/*
 * state.c — training states: the ckpt_state object, saving a state
 * directory, and loading one in the layout it was saved in (ckpt.h has the
 * format; state.h the inside).
 *
 * Saving writes everything into "<dir>.tmp-XXXXXX" (each file fsynced; no
 * per-file rename, the directory is what appears), fsyncs that directory,
 * and only then makes it visible: renamed into place when dir is missing or
 * empty, or swapped with the old state by renameat2(RENAME_EXCHANGE) so that
 * dir names a complete state at every instant; the old one is then removed.
 * On a filesystem without RENAME_EXCHANGE the old state is renamed aside
 * first, which leaves a moment without dir (the old state is then in
 * "<dir>.tmp-XXXXXX"); the code says so where it happens.
 *
 * Loading validates all metadata and every header before a tensor is
 * created, so a failure leaves nothing behind.
 */
#include "state/state.h"

#include "common/fault.h"
#include "common/fsutil.h"
#include "common/interrupt.h"
#include "common/json.h"
#include "common/util.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define STATE_MAX_SLOT_NAME 256
#define STATE_CAST_CHUNK (1u << 20) /* elements converted at a time */

/* ---- the object ---- */

int ckpt_state_new(ckpt_state **out)
{
    *out = NULL;
    ckpt_state *st = ckpt_calloc(1, sizeof *st);
    if (!st) return CKPT_ENOMEM;
    st->hyper = json_object();
    st->scalars = json_object();
    st->opt_extra = json_object();
    st->meta_extra = json_object();
    if (!st->hyper || !st->scalars || !st->opt_extra || !st->meta_extra) {
        ckpt_state_free(st);
        return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    }
    *out = st;
    return 0;
}

static void tensor_free(state_tensor *t)
{
    if (!t) return;
    if (!t->mapped) free(t->pub.data);
    free((char *)t->pub.name);
    free(t);
}

void ckpt_state_free(ckpt_state *st)
{
    if (!st) return;
    for (size_t i = 0; i < st->nparams; i++)
        tensor_free(st->params[i]);
    for (size_t i = 0; i < st->nslots; i++)
        tensor_free(st->slots[i]);
    free(st->params);
    free(st->slots);
    free(st->table);
    for (size_t i = 0; i < st->nmaps; i++)
        munmap(st->maps[i].addr, st->maps[i].len);
    free(st->maps);
    for (size_t i = 0; i < st->nslot_names; i++)
        free(st->slot_names[i]);
    free(st->slot_names);
    free(st->optimizer);
    free(st->timestamp);
    free(st->config);
    json_decref(st->hyper);
    json_decref(st->scalars);
    json_decref(st->opt_extra);
    json_decref(st->meta_extra);
    free(st);
}

uint64_t ckpt_state_step(const ckpt_state *st)
{
    return st->step;
}

void ckpt_state_set_step(ckpt_state *st, uint64_t step)
{
    st->step = step;
}

const char *ckpt_state_timestamp(const ckpt_state *st)
{
    return st->timestamp;
}

/* Names: one hash table over parameters and slots (FNV-1a, linear probing). */
static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

static state_tensor **table_slot(state_tensor **table, size_t cap, const char *name)
{
    size_t mask = cap - 1;
    for (size_t i = (size_t)name_hash(name) & mask;; i = (i + 1) & mask)
        if (!table[i] || !strcmp(table[i]->pub.name, name)) return &table[i];
}

static state_tensor *table_find(const ckpt_state *st, const char *name)
{
    return st->table_cap ? *table_slot(st->table, st->table_cap, name) : NULL;
}

static int table_insert(ckpt_state *st, state_tensor *t)
{
    size_t n = st->nparams + st->nslots + 1;
    if (n * 10 > st->table_cap * 7) {
        size_t cap = st->table_cap ? st->table_cap * 2 : 64;
        state_tensor **table = ckpt_calloc(cap, sizeof *table);
        if (!table) return CKPT_ENOMEM;
        for (size_t i = 0; i < st->table_cap; i++)
            if (st->table[i]) *table_slot(table, cap, st->table[i]->pub.name) = st->table[i];
        free(st->table);
        st->table = table;
        st->table_cap = cap;
    }
    *table_slot(st->table, st->table_cap, t->pub.name) = t;
    return 0;
}

static int check_param_name(const char *name)
{
    if (!name || !*name || strlen(name) > ST_MAX_NAME)
        return ckpt_error_set(CKPT_EINVAL, "parameter name '%s' is empty or longer than %d bytes",
                              name ? name : "", ST_MAX_NAME);
    if (strchr(name, '/'))
        return ckpt_error_set(CKPT_EINVAL,
                              "parameter '%s': a parameter name may not contain '/' (it separates "
                              "optimizer slots)",
                              name);
    return 0;
}

static int check_slot_name(const char *slot)
{
    if (!slot || !*slot || strlen(slot) > STATE_MAX_SLOT_NAME || strchr(slot, '/'))
        return ckpt_error_set(
            CKPT_EINVAL, "optimizer slot name '%s' is empty, longer than %d bytes or contains '/'",
            slot ? slot : "", STATE_MAX_SLOT_NAME);
    return 0;
}

static int add_slot_name(ckpt_state *st, const char *slot)
{
    for (size_t i = 0; i < st->nslot_names; i++)
        if (!strcmp(st->slot_names[i], slot)) return 0;
    if (st->nslot_names >= STATE_MAX_SLOTS)
        return ckpt_error_set(CKPT_ELIMIT, "more than %d optimizer slot names", STATE_MAX_SLOTS);
    int rc = ckpt_grow(&st->slot_names, &st->slot_names_cap, st->nslot_names + 1,
                       sizeof *st->slot_names);
    if (rc) return rc;
    if (!(st->slot_names[st->nslot_names] = ckpt_strdup(slot))) return CKPT_ENOMEM;
    st->nslot_names++;
    return 0;
}

static bool same_shape(int na, const uint64_t *a, int nb, const uint64_t *b)
{
    if (na != nb) return false;
    for (int k = 0; k < na; k++)
        if (a[k] != b[k]) return false;
    return true;
}

int state_adopt(ckpt_tensor **out, ckpt_state *st, const char *param, const char *slot,
                ckpt_dtype dtype, int ndim, const uint64_t *shape, void *data, bool mapped)
{
    if (out) *out = NULL;
    state_tensor *t = NULL, *owner = NULL;
    uint64_t nbytes = 0, numel = 0;
    int rc = check_param_name(param);
    if (!rc && slot) rc = check_slot_name(slot);
    if (!rc &&
        ((unsigned)dtype >= CKPT_DT_COUNT || ndim < 0 || ndim > CKPT_MAX_RANK || (ndim && !shape)))
        rc = ckpt_error_set(CKPT_EINVAL, "tensor '%s': bad dtype or rank", param);
    if (!rc && (rc = ckpt_dtype_nbytes(dtype, ndim, shape, &nbytes)))
        ckpt_error_prefix(rc, "tensor '%s'", param);
    if (!rc && !ckpt_shape_numel(ndim, shape, &numel))
        rc = ckpt_error_set(CKPT_ELIMIT, "tensor '%s': too large", param);
    if (!rc && slot) {
        owner = table_find(st, param);
        if (!owner || owner->pub.slot)
            rc = ckpt_error_set(
                CKPT_ENOTFOUND,
                "optimizer slot '%s' of parameter '%s': the state has no such parameter", slot,
                param);
        else if (!same_shape(ndim, shape, owner->pub.ndim, owner->pub.shape))
            rc = ckpt_error_set(CKPT_EINVAL,
                                "optimizer slot '%s/%s' is not shaped like its parameter", param,
                                slot);
    }
    char *name = rc ? NULL : slot ? ckpt_sprintf("%s/%s", param, slot) : ckpt_strdup(param);
    if (!rc && !name) rc = CKPT_ENOMEM;
    if (!rc && table_find(st, name))
        rc = ckpt_error_set(CKPT_EEXIST, "tensor '%s' is in the state twice", name);
    if (!rc)
        rc = slot ? ckpt_grow(&st->slots, &st->slots_cap, st->nslots + 1, sizeof *st->slots)
                  : ckpt_grow(&st->params, &st->params_cap, st->nparams + 1, sizeof *st->params);
    if (!rc && slot) rc = add_slot_name(st, slot);
    if (!rc && !(t = ckpt_calloc(1, sizeof *t))) rc = CKPT_ENOMEM;
    if (rc) {
        free(name);
        if (!mapped) free(data);
        return rc;
    }
    t->pub.name = name;
    t->pub.param = slot ? owner->pub.name : name;
    t->pub.slot = slot ? name + strlen(param) + 1 : NULL;
    t->pub.dtype = dtype;
    t->pub.ndim = ndim;
    if (ndim) memcpy(t->pub.shape, shape, (size_t)ndim * sizeof *shape);
    t->pub.numel = numel;
    t->pub.nbytes = nbytes;
    t->pub.data = nbytes ? data : NULL;
    t->mapped = mapped;
    if (!nbytes && !mapped) free(data);
    if ((rc = table_insert(st, t))) {
        tensor_free(t);
        return rc;
    }
    if (slot)
        st->slots[st->nslots++] = t;
    else
        st->params[st->nparams++] = t;
    if (out) *out = &t->pub;
    return 0;
}

/* A copy of data (or zeros) for a tensor of dtype x shape. */
static int new_bytes(void **out, ckpt_dtype dtype, int ndim, const uint64_t *shape,
                     const void *data)
{
    *out = NULL;
    uint64_t nbytes;
    if ((unsigned)dtype >= CKPT_DT_COUNT || ndim < 0 || ndim > CKPT_MAX_RANK || (ndim && !shape))
        return ckpt_error_set(CKPT_EINVAL, "bad dtype or rank");
    int rc = ckpt_dtype_nbytes(dtype, ndim, shape, &nbytes);
    if (rc) return rc;
    if (nbytes > SIZE_MAX / 2)
        return ckpt_error_set(CKPT_ELIMIT, "tensor of %llu bytes", (unsigned long long)nbytes);
    if (!nbytes) return 0;
    void *p = data ? ckpt_malloc((size_t)nbytes) : ckpt_calloc(1, (size_t)nbytes);
    if (!p) return CKPT_ENOMEM;
    if (data) memcpy(p, data, (size_t)nbytes);
    *out = p;
    return 0;
}

int ckpt_state_add_param(ckpt_tensor **out, ckpt_state *st, const char *name, ckpt_dtype dtype,
                         int ndim, const uint64_t *shape, const void *data)
{
    if (out) *out = NULL;
    void *bytes;
    int rc = check_param_name(name);
    if (!rc && (rc = new_bytes(&bytes, dtype, ndim, shape, data)))
        ckpt_error_prefix(rc, "parameter '%s'", name);
    return rc ? rc : state_adopt(out, st, name, NULL, dtype, ndim, shape, bytes, false);
}

int ckpt_state_add_slot(ckpt_tensor **out, ckpt_state *st, const char *param, const char *slot,
                        ckpt_dtype dtype, const void *data)
{
    if (out) *out = NULL;
    state_tensor *p = param ? table_find(st, param) : NULL;
    if (!p || p->pub.slot)
        return ckpt_error_set(
            CKPT_ENOTFOUND,
            "optimizer slot '%s' of parameter '%s': the state has no such parameter",
            slot ? slot : "", param ? param : "");
    void *bytes;
    int rc = check_slot_name(slot);
    if (!rc && (rc = new_bytes(&bytes, dtype, p->pub.ndim, p->pub.shape, data)))
        ckpt_error_prefix(rc, "slot '%s/%s'", param, slot);
    return rc ? rc
              : state_adopt(out, st, param, slot, dtype, p->pub.ndim, p->pub.shape, bytes, false);
}

size_t ckpt_state_param_count(const ckpt_state *st)
{
    return st->nparams;
}

ckpt_tensor *ckpt_state_param_at(const ckpt_state *st, size_t i)
{
    return i < st->nparams ? &st->params[i]->pub : NULL;
}

ckpt_tensor *ckpt_state_param(const ckpt_state *st, const char *name)
{
    state_tensor *t = name ? table_find(st, name) : NULL;
    return t && !t->pub.slot ? &t->pub : NULL;
}

size_t ckpt_state_slot_count(const ckpt_state *st)
{
    return st->nslots;
}

ckpt_tensor *ckpt_state_slot_at(const ckpt_state *st, size_t i)
{
    return i < st->nslots ? &st->slots[i]->pub : NULL;
}

ckpt_tensor *ckpt_state_slot(const ckpt_state *st, const char *param, const char *slot)
{
    if (!param || !slot) return NULL;
    char *name = ckpt_sprintf("%s/%s", param, slot);
    state_tensor *t = name ? table_find(st, name) : NULL;
    free(name);
    return t ? &t->pub : NULL;
}

/* ---- optimizer, scalars, config ---- */

int ckpt_state_set_optimizer(ckpt_state *st, const char *name)
{
    char *copy = NULL;
    if (name && (!*name || strlen(name) > STATE_MAX_SLOT_NAME))
        return ckpt_error_set(CKPT_EINVAL, "optimizer name '%s' is empty or too long", name);
    if (name && !(copy = ckpt_strdup(name))) return CKPT_ENOMEM;
    free(st->optimizer);
    st->optimizer = copy;
    return 0;
}

const char *ckpt_state_optimizer(const ckpt_state *st)
{
    return st->optimizer;
}

size_t ckpt_state_slot_name_count(const ckpt_state *st)
{
    return st->nslot_names;
}

const char *ckpt_state_slot_name(const ckpt_state *st, size_t i)
{
    return i < st->nslot_names ? st->slot_names[i] : NULL;
}

/* Whole numbers become JSON integers ("count": 1200, not 1200.0). */
static int set_number(json_t *obj, const char *key, double v, const char *what)
{
    if (!key || !*key) return ckpt_error_set(CKPT_EINVAL, "%s: empty key", what);
    if (!isfinite(v))
        return ckpt_error_set(CKPT_EINVAL, "%s '%s': %g is not a finite number", what, key, v);
    json_t *j = (v == floor(v) && fabs(v) < 9007199254740992.0) ? json_integer((json_int_t)v)
                                                                : json_real(v);
    if (!j || json_object_set_new(obj, key, j)) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    return 0;
}

static int get_number(double *out, const json_t *obj, const char *key, const char *what)
{
    json_t *v = key ? json_object_get(obj, key) : NULL;
    if (!v) return ckpt_error_set(CKPT_ENOTFOUND, "%s '%s' is not set", what, key ? key : "");
    if (!json_is_number(v))
        return ckpt_error_set(CKPT_EINVAL, "%s '%s' is not a number", what, key);
    *out = json_number_value(v);
    return 0;
}

int ckpt_state_set_hyperparameter(ckpt_state *st, const char *key, double value)
{
    return set_number(st->hyper, key, value, "hyperparameter");
}

int ckpt_state_hyperparameter(double *out, const ckpt_state *st, const char *key)
{
    return get_number(out, st->hyper, key, "hyperparameter");
}

int ckpt_state_set_scalar(ckpt_state *st, const char *key, double value)
{
    return set_number(st->scalars, key, value, "scalar");
}

int ckpt_state_scalar(double *out, const ckpt_state *st, const char *key)
{
    return get_number(out, st->scalars, key, "scalar");
}

/* The fewest digits (15..17) at which every real in v reads back exactly. */
static int real_precision(const json_t *v, int p)
{
    if (json_is_real(v)) {
        char buf[40];
        for (; p < 17; p++) {
            snprintf(buf, sizeof buf, "%.*g", p, json_real_value(v));
            if (strtod(buf, NULL) == json_real_value(v)) break;
        }
        return p;
    }
    const char *key;
    size_t i;
    json_t *x;
    if (json_is_object(v)) json_object_foreach((json_t *)v, key, x) p = real_precision(x, p);
    if (json_is_array(v)) json_array_foreach(v, i, x) p = real_precision(x, p);
    return p;
}

/* As cj_render (indent 2, keys in order, trailing newline), with reals as
 * short as reads back exactly: "lr": 0.9, not 0.90000000000000002. */
static char *render_json(const json_t *doc)
{
    size_t flags =
        JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(real_precision(doc, 15));
    char *s = json_dumps(doc, flags), *t = s ? ckpt_sprintf("%s\n", s) : NULL;
    free(s);
    if (!t) ckpt_error_set(CKPT_ENOMEM, "out of memory rendering JSON");
    return t;
}

static json_t *optimizer_doc(const ckpt_state *st)
{
    json_t *slots = json_array();
    for (size_t i = 0; slots && i < st->nslot_names; i++)
        json_array_append_new(slots, json_string(st->slot_names[i]));
    json_t *doc = json_pack("{s:s?,s:O,s:o,s:O}", "name", st->optimizer, "hyperparameters",
                            st->hyper, "slots", slots, "scalars", st->scalars);
    if (doc) json_object_update_missing(doc, st->opt_extra);
    return doc;
}

char *ckpt_state_optimizer_json(const ckpt_state *st)
{
    json_t *doc = optimizer_doc(st);
    char *s = doc ? render_json(doc) : NULL;
    json_decref(doc);
    if (!doc) ckpt_error_set(CKPT_ENOMEM, "out of memory");
    return s;
}

int ckpt_state_set_config(ckpt_state *st, const char *json_text)
{
    char *copy = NULL;
    if (json_text) {
        json_t *j;
        int rc = cj_load_buf(&j, json_text, strlen(json_text), "config.json");
        if (rc) return rc;
        bool obj = json_is_object(j);
        json_decref(j);
        if (!obj) return ckpt_error_set(CKPT_EINVAL, "config.json: not a JSON object");
        if (!(copy = ckpt_strdup(json_text))) return CKPT_ENOMEM;
    }
    free(st->config);
    st->config = copy;
    return 0;
}

const char *ckpt_state_config(const ckpt_state *st)
{
    return st->config;
}

/* ---- casts ---- */

int state_parse_float_dtype(const char *name, ckpt_dtype *out, const char *what)
{
    if (ckpt_dtype_from_name(name, out) < 0 || !ckpt_dtype_is_castable_float(*out))
        return ckpt_error_set(CKPT_EINVAL, "%s '%s' is not one of bf16, f16, f32, f64", what, name);
    return 0;
}

static bool needs_cast(ckpt_dtype from, ckpt_dtype to)
{
    return from != to && ckpt_dtype_is_castable_float(from);
}

int state_cast_all(ckpt_state *st, ckpt_dtype dt)
{
    for (size_t i = 0; i < st->nparams + st->nslots; i++) {
        state_tensor *t = i < st->nparams ? st->params[i] : st->slots[i - st->nparams];
        if (!needs_cast(t->pub.dtype, dt)) continue;
        uint64_t nbytes = t->pub.numel * ckpt_dtype_size(dt);
        void *p = nbytes ? ckpt_malloc((size_t)nbytes) : NULL;
        if (nbytes && !p) return CKPT_ENOMEM;
        if (nbytes) ckpt_convert(t->pub.dtype, t->pub.data, dt, p, (size_t)t->pub.numel);
        if (!t->mapped) free(t->pub.data);
        t->mapped = false;
        t->pub.data = p;
        t->pub.dtype = dt;
        t->pub.nbytes = nbytes;
    }
    return 0;
}

/* ---- save ---- */

typedef struct {
    const ckpt_tensor *t;
    ckpt_dtype dtype; /* as written */
    uint64_t nbytes;
} save_item;

static int fill_item(void *ctx, const st_out_tensor *ot, int fd, const char *path)
{
    const save_item *it = &((const save_item *)ctx)[ot->user];
    const ckpt_tensor *t = it->t;
    if (it->dtype == t->dtype)
        return ckpt_pwrite_full(fd, t->data, (size_t)t->nbytes, ot->offset, path);
    size_t ses = ckpt_dtype_size(t->dtype), des = ckpt_dtype_size(it->dtype);
    uint8_t *buf = ckpt_malloc((size_t)STATE_CAST_CHUNK * des);
    if (!buf) return CKPT_ENOMEM;
    int rc = 0;
    for (uint64_t i = 0; !rc && i < t->numel; i += STATE_CAST_CHUNK) {
        size_t n = t->numel - i < STATE_CAST_CHUNK ? (size_t)(t->numel - i) : STATE_CAST_CHUNK;
        ckpt_convert(t->dtype, (const uint8_t *)t->data + i * ses, it->dtype, buf, n);
        rc = ckpt_pwrite_full(fd, buf, n * des, ot->offset + i * des, path);
    }
    free(buf);
    return rc;
}

/* Files inside the temporary directory need no rename of their own: the
 * directory becomes visible whole, after each file and then the directory
 * are fsynced. (st_write_file's temp-and-rename per file would cost a
 * directory fsync per file for nothing.) */
static int write_new_file(const char *dir, const char *name, const st_layout *l, const void *text,
                          size_t len, save_item *items)
{
    char *path = ckpt_path_join(dir, name);
    if (!path) return CKPT_ENOMEM;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644), rc = 0;
    if (fd < 0) rc = ckpt_error_sys("%s: create", path);
    if (!rc && l) {
        rc = ckpt_pwrite_full(fd, l->header, l->header_len, 0, path);
        for (size_t i = 0; !rc && i < l->ntensors; i++)
            rc = fill_item(items, &l->tensors[i], fd, path);
        if (!rc && ftruncate(fd, (off_t)l->file_size) < 0)
            rc = ckpt_error_sys("%s: truncate", path);
    } else if (!rc) {
        rc = ckpt_write_full(fd, text, len, path);
    }
    if (!rc && fsync(fd) < 0) rc = ckpt_error_sys("%s: fsync", path);
    if (fd >= 0 && close(fd) < 0 && !rc) rc = ckpt_error_sys("%s: close", path);
    if (!rc) ckpt_fault("state.file_synced");
    free(path);
    return rc;
}

/* Writes items as "<prefix>.safetensors" or shards + index into dir. */
static int write_group(const char *dir, const char *prefix, save_item *items, size_t n,
                       uint64_t max_shard)
{
    uint64_t *sizes = ckpt_calloc(n + 1, sizeof *sizes), total = 0;
    size_t *shard_of = ckpt_calloc(n + 1, sizeof *shard_of), nshards = 0;
    char **names = ckpt_calloc(n + 1, sizeof *names), **files = ckpt_calloc(n + 1, sizeof *files);
    int rc = sizes && shard_of && names && files ? 0 : CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        sizes[i] = items[i].nbytes;
        total += sizes[i];
        names[i] = (char *)items[i].t->name;
    }
    if (!rc) rc = ckpt_shard_assign(sizes, n, max_shard, shard_of, &nshards);
    if (!rc && n == 0) nshards = 1;
    for (size_t s = 0; !rc && s < nshards; s++) {
        st_layout l;
        st_layout_init(&l);
        char *base = ckpt_shard_name(prefix, s, nshards);
        if (!base) rc = CKPT_ENOMEM;
        for (size_t i = 0; !rc && i < n; i++) {
            if (shard_of[i] != s) continue;
            const ckpt_tensor *t = items[i].t;
            rc = st_layout_add(&l, t->name, items[i].dtype, t->ndim, t->shape, i);
        }
        if (!rc) rc = st_layout_set_meta(&l, "format", "pt");
        if (!rc) rc = st_layout_finish(&l);
        if (!rc) rc = write_new_file(dir, base, &l, NULL, 0, items);
        for (size_t i = 0; !rc && i < n; i++)
            if (shard_of[i] == s && !(files[i] = ckpt_strdup(base))) rc = CKPT_ENOMEM;
        st_layout_free(&l);
        free(base);
    }
    if (!rc && nshards > 1) {
        char *index = ckpt_index_render(total, n, names, files);
        char *iname = ckpt_sprintf("%s.safetensors.index.json", prefix);
        rc = index && iname ? write_new_file(dir, iname, NULL, index, strlen(index), NULL)
                            : CKPT_ENOMEM;
        free(index);
        free(iname);
    }
    for (size_t i = 0; files && i < n; i++)
        free(files[i]);
    free(sizes);
    free(shard_of);
    free(names);
    free(files);
    return rc;
}

/* Sorted distinct dtype names of items, as a JSON array. */
static json_t *dtype_list(const save_item *items, size_t n)
{
    bool seen[CKPT_DT_COUNT] = {false};
    for (size_t i = 0; i < n; i++)
        seen[items[i].dtype] = true;
    json_t *a = json_array();
    for (int d = 0; a && d < CKPT_DT_COUNT; d++)
        if (seen[d]) json_array_append_new(a, json_string(ckpt_dtype_name((ckpt_dtype)d)));
    return a;
}

static void item_init(save_item *it, const ckpt_tensor *t, bool cast, ckpt_dtype dt)
{
    it->t = t;
    it->dtype = cast && needs_cast(t->dtype, dt) ? dt : t->dtype;
    it->nbytes = it->dtype == t->dtype ? t->nbytes : t->numel * ckpt_dtype_size(dt);
}

static int write_json(const char *dir, const char *name, const json_t *doc)
{
    char *text = render_json(doc);
    int rc = text ? write_new_file(dir, name, NULL, text, strlen(text), NULL) : CKPT_ENOMEM;
    free(text);
    return rc;
}

static int write_text(const char *dir, const char *name, const char *text)
{
    return write_new_file(dir, name, NULL, text, strlen(text), NULL);
}

static int now_timestamp(char *buf, size_t len)
{
    time_t t = time(NULL);
    struct tm tm;
    if (!gmtime_r(&t, &tm) || !strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm))
        return ckpt_error_set(CKPT_EIO, "cannot format the current time");
    return 0;
}

/* Every file of the state, in tmp. */
static int write_state_files(const char *tmp, const ckpt_state *st,
                             const ckpt_state_save_options *o, bool cast, ckpt_dtype dt)
{
    bool has_opt = o->save_optimizer && (st->optimizer || st->nslots);
    if (has_opt && !st->optimizer)
        return ckpt_error_set(
            CKPT_EINVAL,
            "the state has optimizer slots but no optimizer name (ckpt_state_set_optimizer)");
    if (st->step > INT64_MAX)
        return ckpt_error_set(CKPT_ELIMIT, "step %llu is too large", (unsigned long long)st->step);
    uint64_t max_shard = o->max_shard_size ? o->max_shard_size : STATE_DEFAULT_SHARD_SIZE;
    save_item *params = ckpt_calloc(st->nparams + 1, sizeof *params);
    save_item *slots = ckpt_calloc(st->nslots + 1, sizeof *slots);
    int rc = params && slots ? 0 : CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < st->nparams; i++)
        item_init(&params[i], &st->params[i]->pub, cast, dt);
    /* Slots parameter by parameter, in slot-name order within one. */
    size_t ns = 0;
    for (size_t i = 0; !rc && i < st->nparams; i++)
        for (size_t k = 0; k < st->nslot_names; k++) {
            char *name = ckpt_sprintf("%s/%s", st->params[i]->pub.name, st->slot_names[k]);
            if (!name) {
                rc = CKPT_ENOMEM;
                break;
            }
            state_tensor *t = table_find(st, name);
            free(name);
            if (t) item_init(&slots[ns++], &t->pub, cast, dt);
        }
    assert(rc || ns == st->nslots);
    if (!rc) rc = write_group(tmp, "model", params, st->nparams, max_shard);
    if (!rc && has_opt) rc = write_group(tmp, "optimizer", slots, ns, max_shard);
    if (!rc && has_opt) {
        json_t *doc = optimizer_doc(st);
        rc = doc ? write_json(tmp, STATE_OPTIMIZER_FILE, doc)
                 : ckpt_error_set(CKPT_ENOMEM, "out of memory");
        json_decref(doc);
    }
    if (!rc && st->config) rc = write_text(tmp, STATE_CONFIG_FILE, st->config);
    char ts[32];
    if (!rc && o->keep_timestamp && st->timestamp)
        snprintf(ts, sizeof ts, "%s", st->timestamp);
    else if (!rc)
        rc = now_timestamp(ts, sizeof ts);
    if (!rc) {
        json_t *dtypes = json_pack("{s:o}", "model", dtype_list(params, st->nparams));
        if (dtypes && has_opt) json_object_set_new(dtypes, "optimizer", dtype_list(slots, ns));
        json_t *meta = json_pack("{s:s,s:i,s:I,s:s,s:b,s:o}", "format", CKPT_STATE_FORMAT,
                                 "version", CKPT_STATE_VERSION, "step", (json_int_t)st->step,
                                 "timestamp", ts, "has_optimizer_state", has_opt, "dtypes", dtypes);
        if (meta && cast)
            json_object_set_new(meta, "float_dtype", json_string(ckpt_dtype_name(dt)));
        if (meta) json_object_update_missing(meta, st->meta_extra);
        /* metadata.json last: a directory that has it has everything else. */
        rc = meta ? write_json(tmp, STATE_METADATA_FILE, meta)
                  : ckpt_error_set(CKPT_ENOMEM, "out of memory");
        json_decref(meta);
    }
    free(params);
    free(slots);
    return rc;
}

/* dir may be replaced when it is missing, an empty directory, or a state. */
static int check_target(const char *dir, bool *replace)
{
    struct stat sb;
    *replace = false;
    if (lstat(dir, &sb) < 0) return errno == ENOENT ? 0 : ckpt_error_sys("%s: stat", dir);
    if (!S_ISDIR(sb.st_mode))
        return ckpt_error_set(CKPT_EEXIST, "%s exists and is not a directory", dir);
    if (ckpt_dir_is_empty_or_missing(dir)) return 0;
    char *meta = ckpt_path_join(dir, STATE_METADATA_FILE);
    if (!meta) return CKPT_ENOMEM;
    bool is_state = ckpt_exists(meta);
    free(meta);
    if (!is_state)
        return ckpt_error_set(CKPT_EEXIST,
                              "%s is not empty and holds no %s: refusing to replace what is not a "
                              "training state",
                              dir, STATE_METADATA_FILE);
    *replace = true;
    return 0;
}

/* Makes tmp visible as dir; the old state (when replace) ends up in tmp. */
static int commit_state(const char *tmp, const char *dir, bool replace)
{
    if (!replace) return ckpt_dir_commit(tmp, dir);
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0)
        return ckpt_fsync_parent(dir); /* tmp holds the old state now: removing it is right */
    if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
        return ckpt_error_sys("%s: exchange with the new state", dir);
    /* No RENAME_EXCHANGE here: between the two renames dir is missing and the
     * old state sits in "<dir>.tmp-XXXXXX" (old), which is moved back on failure. */
    char *old = NULL;
    int rc = ckpt_tmpdir_create(dir, &old);
    if (rc) return rc;
    ckpt_interrupt_hold(); /* an interrupt waits until dir holds a whole state again */
    rmdir(old);
    if (rename(dir, old) < 0) rc = ckpt_error_sys("%s: move the old state aside", dir);
    if (!rc && rename(tmp, dir) < 0) {
        rc = ckpt_error_sys("%s: rename the new state into place", dir);
        rename(old, dir);
    }
    ckpt_interrupt_release();
    if (!rc) rc = ckpt_fsync_parent(dir);
    if (!rc && rename(old, tmp) < 0) ckpt_rm_rf(old);
    free(old);
    return rc;
}

static int save_options_get(ckpt_state_save_options *o, const ckpt_state_save_options *given)
{
    ckpt_state_save_options def = CKPT_STATE_SAVE_OPTIONS_INIT;
    if (!given) given = &def;
    if (given->version != CKPT_STATE_SAVE_OPTIONS_VERSION)
        return ckpt_error_set(CKPT_EINVAL, "ckpt_state_save_options version %u is not %d",
                              given->version, CKPT_STATE_SAVE_OPTIONS_VERSION);
    *o = *given;
    return 0;
}

static int save_to(const char *dir, const ckpt_state *st, const ckpt_state_save_options *opts);

int ckpt_state_save(const char *dir, const ckpt_state *st, const ckpt_state_save_options *opts)
{
    if (!dir || !*dir || !st)
        return ckpt_error_set(CKPT_EINVAL, "ckpt_state_save: no directory or state");
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--; /* "run/latest/" is "run/latest" */
    char *d = ckpt_strndup(dir, n);
    if (!d) return CKPT_ENOMEM;
    int rc = save_to(d, st, opts);
    free(d);
    return rc;
}

static int save_to(const char *dir, const ckpt_state *st, const ckpt_state_save_options *opts)
{
    ckpt_state_save_options o = CKPT_STATE_SAVE_OPTIONS_INIT;
    ckpt_dtype dt = CKPT_DT_F32;
    bool replace = false;
    int rc = save_options_get(&o, opts);
    if (!rc && o.float_dtype) rc = state_parse_float_dtype(o.float_dtype, &dt, "float_dtype");
    char *parent = NULL, *slash = rc ? NULL : strrchr(dir, '/');
    if (slash && slash != dir) {
        parent = ckpt_strndup(dir, (size_t)(slash - dir));
        rc = parent ? ckpt_mkdir_p(parent, 0755) : CKPT_ENOMEM;
        free(parent);
    }
    if (!rc) rc = check_target(dir, &replace);
    char *tmp = NULL;
    if (!rc) rc = ckpt_tmpdir_create(dir, &tmp);
    if (!rc) rc = write_state_files(tmp, st, &o, o.float_dtype != NULL, dt);
    if (!rc) rc = ckpt_fsync_dir(tmp);
    if (!rc) ckpt_fault("state.before_commit");
    if (!rc) rc = commit_state(tmp, dir, replace);
    if (!rc) ckpt_fault("state.committed");
    if (rc && tmp) ckpt_error_prefix(rc, "save state %s", dir);
    if (tmp) {
        int e = CKPT_OK;
        /* After a commit tmp holds the old state (or nothing); after a failure, the partial new
         * one. */
        if (ckpt_exists(tmp)) e = ckpt_rm_rf(tmp);
        (void)e;
        free(tmp);
    }
    return rc;
}

/* ---- load ---- */

static char *dir_file(const char *dir, const char *name)
{
    return ckpt_path_join(dir, name);
}

static int read_metadata(ckpt_state *st, const char *dir, state_info *info)
{
    char *path = dir_file(dir, STATE_METADATA_FILE);
    if (!path) return CKPT_ENOMEM;
    json_t *meta = NULL;
    int rc = ckpt_exists(path) ? cj_load_file(&meta, path, STATE_JSON_MAX_BYTES)
                               : ckpt_error_set(CKPT_ENOTFOUND, "%s: not a training state (no %s)",
                                                dir, STATE_METADATA_FILE);
    const char *format = NULL, *ts = NULL;
    int64_t version = 0, step = 0;
    if (!rc && !json_is_object(meta))
        rc = ckpt_error_set(CKPT_EINVAL, "%s: not a JSON object", path);
    if (!rc) rc = cj_str(meta, "format", &format, path);
    if (!rc && strcmp(format, CKPT_STATE_FORMAT))
        rc = ckpt_error_set(CKPT_EINVAL, "%s: format is '%s', expected '%s'", path, format,
                            CKPT_STATE_FORMAT);
    if (!rc) rc = cj_int(meta, "version", &version, path);
    if (!rc && version > CKPT_STATE_VERSION)
        rc = ckpt_error_set(CKPT_EINVAL,
                            "%s: version %lld is newer than this ckpt reads (%d); upgrade ckpt",
                            path, (long long)version, CKPT_STATE_VERSION);
    if (!rc && version < 1)
        rc = ckpt_error_set(CKPT_EINVAL, "%s: bad version %lld", path, (long long)version);
    if (!rc) rc = cj_int(meta, "step", &step, path);
    if (!rc && step < 0)
        rc = ckpt_error_set(CKPT_EINVAL, "%s: step %lld is negative", path, (long long)step);
    if (!rc) rc = cj_str_opt(meta, "timestamp", &ts, path);
    info->has_optimizer = false;
    if (!rc) rc = cj_bool_opt(meta, "has_optimizer_state", &info->has_optimizer, path);
    if (!rc) {
        st->step = (uint64_t)step;
        if (ts && !(st->timestamp = ckpt_strdup(ts))) rc = CKPT_ENOMEM;
    }
    if (!rc) {
        static const char *const known[] = {
            "format", "version",    "step", "timestamp", "has_optimizer_state",
            "dtypes", "float_dtype"};
        json_object_update(st->meta_extra, meta);
        for (size_t i = 0; i < CKPT_ARRAY_LEN(known); i++)
            json_object_del(st->meta_extra, known[i]);
    }
    json_decref(meta);
    free(path);
    return rc;
}

static int read_optimizer(ckpt_state *st, const char *dir)
{
    char *path = dir_file(dir, STATE_OPTIMIZER_FILE);
    if (!path) return CKPT_ENOMEM;
    json_t *doc = NULL;
    int rc =
        ckpt_exists(path)
            ? cj_load_file(&doc, path, STATE_JSON_MAX_BYTES)
            : ckpt_error_set(CKPT_ENOTFOUND, "%s: has_optimizer_state is true but there is no %s",
                             dir, STATE_OPTIMIZER_FILE);
    const char *name = NULL;
    if (!rc && !json_is_object(doc))
        rc = ckpt_error_set(CKPT_EINVAL, "%s: not a JSON object", path);
    if (!rc) rc = cj_str(doc, "name", &name, path);
    if (!rc) rc = ckpt_state_set_optimizer(st, name);
    json_t *hyper = rc ? NULL : json_object_get(doc, "hyperparameters");
    json_t *scalars = rc ? NULL : json_object_get(doc, "scalars");
    json_t *slots = rc ? NULL : json_object_get(doc, "slots");
    if (!rc && ((hyper && !json_is_object(hyper)) || (scalars && !json_is_object(scalars))))
        rc = ckpt_error_set(CKPT_EINVAL, "%s: 'hyperparameters' and 'scalars' must be objects",
                            path);
    if (!rc && !json_is_array(slots))
        rc = ckpt_error_set(CKPT_EINVAL, "%s: 'slots' must be a list of names", path);
    size_t i;
    json_t *s;
    if (!rc) json_array_foreach(slots, i, s)
        {
            const char *sn = json_string_value(s);
            if (!rc && !sn)
                rc = ckpt_error_set(CKPT_EINVAL, "%s: slot %zu is not a string", path, i);
            if (!rc && (rc = check_slot_name(sn))) ckpt_error_prefix(rc, "%s", path);
            for (size_t k = 0; !rc && k < st->nslot_names; k++)
                if (!strcmp(st->slot_names[k], sn))
                    rc = ckpt_error_set(CKPT_EINVAL, "%s: slot '%s' listed twice", path, sn);
            if (!rc) rc = add_slot_name(st, sn);
        }
    if (!rc) {
        if (hyper) json_object_update(st->hyper, hyper);
        if (scalars) json_object_update(st->scalars, scalars);
        json_object_update(st->opt_extra, doc);
        static const char *const known[] = {"name", "hyperparameters", "slots", "scalars"};
        for (size_t k = 0; k < CKPT_ARRAY_LEN(known); k++)
            json_object_del(st->opt_extra, known[k]);
    }
    json_decref(doc);
    free(path);
    return rc;
}

static int read_config(ckpt_state *st, const char *dir)
{
    char *path = dir_file(dir, STATE_CONFIG_FILE), *text = NULL;
    if (!path) return CKPT_ENOMEM;
    int rc = 0;
    if (ckpt_exists(path)) {
        rc = ckpt_read_file(path, STATE_JSON_MAX_BYTES, &text, NULL);
        if (!rc && (rc = ckpt_state_set_config(st, text))) ckpt_error_prefix(rc, "%s", path);
    }
    free(text);
    free(path);
    return rc;
}

int state_read_side_files(ckpt_state *st, const char *dir, bool want_optimizer, state_info *info)
{
    int rc = read_metadata(st, dir, info);
    if (!rc) rc = read_config(st, dir);
    if (!rc && info->has_optimizer && want_optimizer) rc = read_optimizer(st, dir);
    return rc;
}

int state_check_optimizer(const ckpt_state *st, const ckpt_checkpoint *model,
                          const ckpt_checkpoint *opt)
{
    char param[ST_MAX_NAME + 1];
    for (size_t i = 0; i < opt->ntensors; i++) {
        const st_tensor *t = opt->tensors[i].t;
        const char *file = opt->files[opt->tensors[i].file].path;
        if (!state_is_optimizer_file(ckpt_basename(file)))
            continue; /* model and optimizer opened as one */
        size_t plen;
        if (!state_split_slot_name(t->name, &plen) || plen > ST_MAX_NAME)
            return ckpt_error_set(CKPT_EINVAL,
                                  "%s: optimizer tensor '%s' is not named '<parameter>/<slot>'",
                                  file, t->name);
        memcpy(param, t->name, plen);
        param[plen] = 0;
        const char *slot = t->name + plen + 1;
        const ckpt_tensor_ref *p = ckpt_checkpoint_find(model, param);
        if (p && state_is_optimizer_file(ckpt_basename(model->files[p->file].path))) p = NULL;
        if (!p)
            return ckpt_error_set(
                CKPT_EINVAL,
                "%s: optimizer tensor '%s' names parameter '%s', which the model does "
                "not have",
                file, t->name, param);
        bool listed = false;
        for (size_t k = 0; k < st->nslot_names; k++)
            listed |= !strcmp(st->slot_names[k], slot);
        if (!listed)
            return ckpt_error_set(CKPT_EINVAL,
                                  "%s: optimizer tensor '%s' has slot '%s', which %s does not list",
                                  file, t->name, slot, STATE_OPTIMIZER_FILE);
        if (!same_shape(t->ndim, t->shape, p->t->ndim, p->t->shape))
            return ckpt_error_set(CKPT_EINVAL,
                                  "%s: optimizer tensor '%s' is not shaped like parameter '%s'",
                                  file, t->name, param);
    }
    return 0;
}

int state_map_file(ckpt_state *st, const st_file *f, uint8_t **base)
{
    int rc = ckpt_grow(&st->maps, &st->maps_cap, st->nmaps + 1, sizeof *st->maps);
    if (rc) return rc;
    if (f->file_size > SIZE_MAX)
        return ckpt_error_set(CKPT_ELIMIT, "%s: too large to map", f->path);
    void *p = mmap(NULL, (size_t)f->file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, f->fd, 0);
    if (p == MAP_FAILED) return ckpt_error_sys("%s: mmap", f->path);
    st->maps[st->nmaps++] = (state_mapping){p, (size_t)f->file_size};
    *base = p;
    return 0;
}

/* Bytes of t read from f, converted to dt when it is a castable float. malloc'd. */
static int read_tensor(const st_file *f, const st_tensor *t, bool cast, ckpt_dtype dt, void **out,
                       ckpt_dtype *out_dt)
{
    *out = NULL;
    *out_dt = cast && needs_cast(t->dtype, dt) ? dt : t->dtype;
    uint64_t numel;
    if (!ckpt_shape_numel(t->ndim, t->shape, &numel))
        return ckpt_error_set(CKPT_ELIMIT, "tensor '%s' too large", t->name);
    uint64_t nbytes = *out_dt == t->dtype ? t->nbytes : numel * ckpt_dtype_size(dt);
    if (!nbytes) return 0;
    if (nbytes > SIZE_MAX / 2) return ckpt_error_set(CKPT_ELIMIT, "tensor '%s' too large", t->name);
    uint8_t *buf = ckpt_malloc((size_t)nbytes);
    if (!buf) return CKPT_ENOMEM;
    int rc = 0;
    if (*out_dt == t->dtype) {
        rc = ckpt_pread_full(f->fd, buf, (size_t)nbytes, t->offset, f->path);
    } else {
        size_t ses = ckpt_dtype_size(t->dtype), des = ckpt_dtype_size(dt);
        uint8_t *chunk = ckpt_malloc((size_t)STATE_CAST_CHUNK * ses);
        if (!chunk) rc = CKPT_ENOMEM;
        for (uint64_t i = 0; !rc && i < numel; i += STATE_CAST_CHUNK) {
            size_t n = numel - i < STATE_CAST_CHUNK ? (size_t)(numel - i) : STATE_CAST_CHUNK;
            rc = ckpt_pread_full(f->fd, chunk, n * ses, t->offset + i * ses, f->path);
            if (!rc) ckpt_convert(t->dtype, chunk, dt, buf + i * des, n);
        }
        free(chunk);
    }
    if (rc) {
        free(buf);
        return ckpt_error_prefix(rc, "tensor '%s'", t->name);
    }
    *out = buf;
    return 0;
}

/* Adds every tensor of c to st: parameters, or slots when `slots`. */
static int load_tensors(ckpt_state *st, const ckpt_checkpoint *c, bool slots, bool cast,
                        ckpt_dtype dt)
{
    uint8_t **bases = ckpt_calloc(c->nfiles + 1, sizeof *bases);
    if (!bases) return CKPT_ENOMEM;
    int rc = 0;
    char param[ST_MAX_NAME + 1];
    for (size_t i = 0; !rc && i < c->ntensors; i++) {
        const st_tensor *t = c->tensors[i].t;
        const st_file *f = &c->files[c->tensors[i].file];
        void *data = NULL;
        ckpt_dtype dtype = t->dtype;
        bool mapped = !cast;
        if (mapped && t->nbytes) {
            if (!bases[c->tensors[i].file]) rc = state_map_file(st, f, &bases[c->tensors[i].file]);
            if (!rc) data = bases[c->tensors[i].file] + t->offset;
        } else if (!mapped) {
            rc = read_tensor(f, t, cast, dt, &data, &dtype);
        }
        const char *pname = t->name, *slot = NULL;
        size_t plen = 0;
        if (!rc && slots) {
            if (!state_split_slot_name(t->name, &plen) || plen > ST_MAX_NAME) {
                rc = ckpt_error_set(CKPT_EINVAL, "%s: bad optimizer tensor name '%s'", f->path,
                                    t->name);
            } else {
                memcpy(param, t->name, plen);
                param[plen] = 0;
                pname = param;
                slot = t->name + plen + 1;
            }
        }
        if (rc) {
            if (!mapped) free(data);
            break;
        }
        if ((rc = state_adopt(NULL, st, pname, slot, dtype, t->ndim, t->shape, data, mapped)))
            ckpt_error_prefix(rc, "%s", f->path);
    }
    free(bases);
    return rc;
}

int state_load_options_get(ckpt_state_load_options *o, const ckpt_state_load_options *given)
{
    ckpt_state_load_options def = CKPT_STATE_LOAD_OPTIONS_INIT;
    if (!given) given = &def;
    if (given->version != CKPT_STATE_LOAD_OPTIONS_VERSION)
        return ckpt_error_set(CKPT_EINVAL, "ckpt_state_load_options version %u is not %d",
                              given->version, CKPT_STATE_LOAD_OPTIONS_VERSION);
    *o = *given;
    ckpt_dtype dt;
    if (o->dtype) return state_parse_float_dtype(o->dtype, &dt, "dtype");
    return 0;
}

int state_load_dir(const char *dir, const ckpt_state_load_options *o, ckpt_state **out)
{
    *out = NULL;
    ckpt_state *st;
    int rc = ckpt_state_new(&st);
    if (rc) return rc;
    state_info info;
    ckpt_checkpoint model, opt;
    memset(&model, 0, sizeof model);
    memset(&opt, 0, sizeof opt);
    ckpt_dtype dt = CKPT_DT_F32;
    if (o->dtype) rc = state_parse_float_dtype(o->dtype, &dt, "dtype");
    if (!rc) rc = state_read_side_files(st, dir, o->load_optimizer, &info);
    if (!rc) rc = ckpt_checkpoint_open_prefix(&model, dir, "model");
    bool with_opt = !rc && info.has_optimizer && o->load_optimizer;
    if (with_opt) {
        rc = ckpt_checkpoint_open_prefix(&opt, dir, "optimizer");
        if (rc == CKPT_ENOTFOUND) ckpt_error_prefix(rc, "has_optimizer_state is true but");
        if (!rc) rc = state_check_optimizer(st, &model, &opt);
    }
    if (!rc) rc = load_tensors(st, &model, false, o->dtype != NULL, dt);
    if (!rc && with_opt) rc = load_tensors(st, &opt, true, o->dtype != NULL, dt);
    ckpt_checkpoint_close(&model);
    ckpt_checkpoint_close(&opt);
    if (rc) {
        ckpt_state_free(st);
        return ckpt_error_prefix(rc, "load state %s", dir);
    }
    *out = st;
    return 0;
}

int state_from_checkpoint(const char *dir, ckpt_state **out)
{
    *out = NULL;
    ckpt_state *st;
    int rc = ckpt_state_new(&st);
    if (rc) return rc;
    ckpt_checkpoint c;
    memset(&c, 0, sizeof c);
    rc = read_config(st, dir);
    if (!rc) rc = ckpt_checkpoint_open_prefix(&c, dir, "model");
    if (!rc) rc = load_tensors(st, &c, false, false, CKPT_DT_F32);
    ckpt_checkpoint_close(&c);
    if (rc) {
        ckpt_state_free(st);
        return rc;
    }
    *out = st;
    return 0;
}

/*
 * dcp.c — PyTorch Distributed Checkpoint folders (see dcp.h). The .metadata
 * pickle becomes a tree on the restricted machine (pickle.c); this file knows
 * what torch's dataclasses mean: Metadata's state names the entries and the
 * storage map, TensorStorageMetadata the global shape, dtype and chunks,
 * MetadataIndex -> _StorageInfo where each chunk's torch.save lies. Follows
 * torch/distributed/checkpoint/metadata.py, filesystem.py (_write_item,
 * FileSystemReader.read_data) and default_planner.py
 * (create_default_global_save_plan, _validate_global_plan).
 */
#include "format/dcp.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"
#include "format/pickle.h"
#include "format/safetensors.h"
#include "format/torch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
    D_METADATA = 1,
    D_TSM,
    D_CHUNK,
    D_BYTES,
    D_PROPS,
    D_INDEX,
    D_SINFO,
    D_OTHER,
    D_DTYPE0 = 100, /* + index of torch_dtype_at */
};

#define META "torch.distributed.checkpoint.metadata"

static const pk_global_def FIXED[] = {
    {META, "Metadata", PKG_RECORD, D_METADATA},
    {META, "TensorStorageMetadata", PKG_RECORD, D_TSM},
    {META, "ChunkStorageMetadata", PKG_RECORD, D_CHUNK},
    {META, "BytesStorageMetadata", PKG_RECORD, D_BYTES},
    {META, "TensorProperties", PKG_RECORD, D_PROPS},
    {"torch.distributed._shard.sharded_tensor.metadata", "TensorProperties", PKG_RECORD, D_PROPS},
    {META, "MetadataIndex", PKG_RECORD, D_INDEX},
    {META, "StorageMeta", PKG_RECORD, D_OTHER},
    {"torch.distributed.checkpoint.filesystem", "_StorageInfo", PKG_RECORD, D_SINFO},
    /* TensorProperties' __getstate__ tuple: layout and memory-format enum.
     * Python >= 3.11 pickles an enum member as getattr(cls, name), older
     * ones as cls(value); both are only recorded (PK_CALL), never called. */
    {META, "_MEM_FORMAT_ENCODING", PKG_CALL, D_OTHER},
    {"torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING", PKG_CALL, D_OTHER},
    {"builtins", "getattr", PKG_CALL, D_OTHER},
    {"torch.serialization", "_get_layout", PKG_CALL, D_OTHER},
    {"torch", "strided", PKG_VALUE, D_OTHER},
    {"torch", "Size", PKG_TUPLE, D_OTHER},
    /* StorageMeta.checkpoint_id: the save's folder as a Path */
    {"pathlib", "PosixPath", PKG_CALL, D_OTHER},
    {"pathlib", "PurePosixPath", PKG_CALL, D_OTHER},
    {"pathlib", "Path", PKG_CALL, D_OTHER},
    {"pathlib._local", "PosixPath", PKG_CALL, D_OTHER}, /* Python 3.13's module of the class */
    {"pathlib", "WindowsPath", PKG_CALL, D_OTHER},
    {"pathlib._local", "WindowsPath", PKG_CALL, D_OTHER},
    {"collections", "OrderedDict", PKG_DICT, D_OTHER},
    {"builtins", "dict", PKG_DICT, D_OTHER},
    {"builtins", "set", PKG_SET, D_OTHER},
    {"builtins", "frozenset", PKG_SET, D_OTHER},
    {"_codecs", "encode", PKG_ENCODE, D_OTHER},
};

#define MAX_DTYPES 64
static pk_global_def ALLOW[CKPT_ARRAY_LEN(FIXED) + MAX_DTYPES];
static size_t nallow;
static int dtype_of[MAX_DTYPES];
static int allow_ready;

static void allow_init(void)
{
    if (__atomic_load_n(&allow_ready, __ATOMIC_ACQUIRE)) return;
    pk_global_def tmp[CKPT_ARRAY_LEN(ALLOW)];
    int dts[MAX_DTYPES];
    size_t n = 0;
    for (size_t i = 0; i < CKPT_ARRAY_LEN(FIXED); i++) tmp[n++] = FIXED[i];
    const char *name;
    int dt = 0;
    for (size_t i = 0; i < MAX_DTYPES && (name = torch_dtype_at(i, &dt)); i++) {
        tmp[n++] = (pk_global_def){"torch", name, PKG_VALUE, D_DTYPE0 + (int)i};
        dts[i] = dt;
    }
    memcpy(ALLOW, tmp, sizeof tmp); /* same bytes from every thread */
    memcpy(dtype_of, dts, sizeof dts);
    nallow = n;
    __atomic_store_n(&allow_ready, 1, __ATOMIC_RELEASE);
}

typedef struct {
    const char *label;
    pk_doc doc;
} mctx;

static int merr(const mctx *m, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int merr(const mctx *m, int code, const char *fmt, ...)
{
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ckpt_error_set(code, "%s: %s", m->label, what);
}

static const pk_node *N(const mctx *m, uint32_t id) { return pk_at(&m->doc, id); }
static const pk_node *item(const mctx *m, const pk_node *n, size_t k) { return pk_item(&m->doc, n, k); }

/* The state of a record of class `tag` (PK_OBJ built once), or NULL. */
static const pk_node *state_of(const mctx *m, const pk_node *n, int tag)
{
    if (n->kind != PK_OBJ || n->n != 3) return NULL;
    const pk_node *cls = item(m, n, 0);
    if (cls->kind != PK_GLOBAL || cls->tag != tag) return NULL;
    return item(m, n, 2);
}

static bool is_record(const mctx *m, const pk_node *n, int tag)
{
    return state_of(m, n, tag) != NULL;
}

/* A str-keyed entry of a dict, or NULL. */
static const pk_node *get(const mctx *m, const pk_node *d, const char *key)
{
    if (!d || d->kind != PK_DICT) return NULL;
    for (size_t k = 0; k + 1 < d->n; k += 2) {
        const pk_node *kn = item(m, d, k);
        if (kn->kind == PK_STR && !strcmp(kn->s, key)) return item(m, d, k + 1);
    }
    return NULL;
}

static bool as_u64(const pk_node *n, uint64_t *v)
{
    if (!n || n->kind != PK_INT || n->s || n->i < 0) return false;
    *v = (uint64_t)n->i;
    return true;
}

/* A torch.Size (pickled as the tuple) of at most CKPT_MAX_RANK non-negative ints. */
static bool as_dims(const mctx *m, const pk_node *n, int *ndim, uint64_t *d)
{
    if (!n || (n->kind != PK_TUPLE && n->kind != PK_LIST) || n->n > CKPT_MAX_RANK) return false;
    for (size_t k = 0; k < n->n; k++)
        if (!as_u64(item(m, n, k), &d[k])) return false;
    *ndim = (int)n->n;
    return true;
}

static bool plain_str(const pk_node *n, size_t max)
{
    return n && n->kind == PK_STR && n->slen > 0 && n->slen <= max && strlen(n->s) == n->slen;
}

static const char *dims_str(int n, const uint64_t *d, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < n && o < len; i++) o += (size_t)snprintf(buf + o, len - o, "%s%" PRIu64, i ? ", " : "", d[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
    return buf;
}

/* ---- the storage map: MetadataIndex(fqn, offset) -> _StorageInfo ---- */

typedef struct {
    const char *fqn;
    int ndim; /* -1: offset None (a bytes item) */
    uint64_t off[CKPT_MAX_RANK];
    const char *rel;
    uint64_t offset, length;
} skey;

static int cmp_skey(const void *a, const void *b)
{
    const skey *x = a, *y = b;
    int c = strcmp(x->fqn, y->fqn);
    if (c) return c;
    if (x->ndim != y->ndim) return x->ndim < y->ndim ? -1 : 1;
    for (int k = 0; k < x->ndim; k++)
        if (x->off[k] != y->off[k]) return x->off[k] < y->off[k] ? -1 : 1;
    return 0;
}

/* relative_path: a file name in the folder, as FileSystemWriter makes them. */
static bool safe_rel(const char *s)
{
    return *s && *s != '.' && !strchr(s, '/') && !strchr(s, '\\') && strcmp(s, "..") && !strstr(s, "..");
}

static int read_storage(mctx *m, const pk_node *sd, skey **out, size_t *nout)
{
    if (!sd || sd->kind != PK_DICT) return merr(m, CKPT_EINVAL, "Metadata.storage_data is not a dict (not written by FileSystemWriter)");
    size_t n = sd->n / 2;
    if (n > DCP_MAX_CHUNKS + DCP_MAX_ENTRIES) return merr(m, CKPT_ELIMIT, "%zu storage entries, at most %u", n, DCP_MAX_CHUNKS + DCP_MAX_ENTRIES);
    skey *keys = ckpt_calloc(n + 1, sizeof *keys);
    if (!keys) return CKPT_ENOMEM;
    char dims[CKPT_MAX_RANK * 24 + 4];
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        const pk_node *ks = state_of(m, item(m, sd, 2 * i), D_INDEX), *vs = state_of(m, item(m, sd, 2 * i + 1), D_SINFO);
        if (!ks || !vs) {
            rc = merr(m, CKPT_EINVAL, "storage_data entry %zu is not MetadataIndex -> _StorageInfo", i);
            break;
        }
        skey *k = &keys[i];
        const pk_node *fqn = get(m, ks, "fqn"), *off = get(m, ks, "offset");
        if (!plain_str(fqn, ST_MAX_NAME)) {
            rc = merr(m, CKPT_EINVAL, "storage_data entry %zu: MetadataIndex.fqn is not a name", i);
            break;
        }
        k->fqn = fqn->s;
        k->ndim = -1;
        if (off && off->kind != PK_NONE && !as_dims(m, off, &k->ndim, k->off)) {
            rc = merr(m, CKPT_EINVAL, "storage_data '%s': MetadataIndex.offset is not a torch.Size", k->fqn);
            break;
        }
        const pk_node *rel = get(m, vs, "relative_path"), *o = get(m, vs, "offset"), *l = get(m, vs, "length");
        const pk_node *td = get(m, vs, "transform_descriptors");
        if (!plain_str(rel, 255) || !as_u64(o, &k->offset) || !as_u64(l, &k->length)) {
            rc = merr(m, CKPT_EINVAL, "storage_data '%s': _StorageInfo needs relative_path, offset and length", k->fqn);
            break;
        }
        if (!safe_rel(rel->s)) {
            rc = merr(m, CKPT_EINVAL, "storage_data '%s': relative_path '%s' is not a file of the checkpoint folder", k->fqn, rel->s);
            break;
        }
        if (td && td->kind != PK_NONE && !((td->kind == PK_LIST || td->kind == PK_TUPLE) && td->n == 0)) {
            const pk_node *d0 = (td->kind == PK_LIST || td->kind == PK_TUPLE) && td->n ? item(m, td, 0) : NULL;
            rc = merr(m, CKPT_EINVAL, "storage_data '%s': transform_descriptors %s%s%s (a transformed item, e.g. compressed) is not read",
                      k->fqn, d0 && d0->kind == PK_STR ? "'" : "", d0 && d0->kind == PK_STR ? d0->s : "present",
                      d0 && d0->kind == PK_STR ? "'" : "");
            break;
        }
        k->rel = rel->s;
    }
    if (!rc) {
        qsort(keys, n, sizeof *keys, cmp_skey);
        for (size_t i = 1; !rc && i < n; i++)
            if (!cmp_skey(&keys[i - 1], &keys[i]))
                rc = merr(m, CKPT_EINVAL, "storage_data lists '%s' at %s twice", keys[i].fqn,
                          keys[i].ndim < 0 ? "None" : dims_str(keys[i].ndim, keys[i].off, dims, sizeof dims));
    }
    if (rc) {
        free(keys);
        return rc;
    }
    *out = keys;
    *nout = n;
    return 0;
}

/* ---- files ---- */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int build_files(dcp_ckpt *c, const skey *keys, size_t n)
{
    const char **names = ckpt_calloc(n + 1, sizeof *names);
    if (!names) return CKPT_ENOMEM;
    for (size_t i = 0; i < n; i++) names[i] = keys[i].rel;
    qsort(names, n, sizeof *names, cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (!u || strcmp(names[u - 1], names[i])) names[u++] = names[i];
    int rc = 0;
    if (u > DCP_MAX_FILES) rc = ckpt_error_set(CKPT_ELIMIT, "%s: %zu files, at most %u", c->dir ? c->dir : "?", u, DCP_MAX_FILES);
    if (!rc && !(c->files = ckpt_calloc(u + 1, sizeof *c->files))) rc = CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < u; i++) {
        c->files[i].name = ckpt_strdup(names[i]);
        c->files[i].path = c->dir ? ckpt_path_join(c->dir, names[i]) : ckpt_strdup(names[i]);
        c->nfiles = i + 1;
        if (!c->files[i].name || !c->files[i].path) rc = CKPT_ENOMEM;
    }
    free(names);
    return rc;
}

static size_t file_index(const dcp_ckpt *c, const char *rel)
{
    size_t lo = 0, hi = c->nfiles;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int r = strcmp(c->files[mid].name, rel);
        if (!r) return mid;
        if (r < 0) lo = mid + 1;
        else hi = mid;
    }
    return 0; /* every rel is in the table (build_files) */
}

/* ---- entries ---- */

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const dcp_entry *)a)->fqn, ((const dcp_entry *)b)->fqn);
}

static const skey *find_key(const skey *keys, size_t n, const char *fqn, int ndim, const uint64_t *off)
{
    skey k = {.fqn = fqn, .ndim = ndim};
    if (ndim > 0) memcpy(k.off, off, (size_t)ndim * sizeof *off);
    return bsearch(&k, keys, n, sizeof *keys, cmp_skey);
}

typedef struct {
    const dcp_chunk *ch;
    int axis;
} sweep;

static int cmp_chunk_start(const void *a, const void *b, void *ctx)
{
    const sweep *sw = ctx;
    uint64_t x = sw->ch[*(const size_t *)a].offsets[sw->axis], y = sw->ch[*(const size_t *)b].offsets[sw->axis];
    return x < y ? -1 : x > y;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The axis along which the chunks' offsets take the most distinct values:
 * sorted along it, a chunk is compared only with those that start before it
 * ends there (one row of a grid), not with every other chunk. */
static int sweep_axis(const dcp_entry *e, const size_t *order, size_t n, uint64_t *scratch)
{
    int best = 0;
    size_t best_distinct = 0;
    for (int k = 0; k < e->ndim; k++) {
        for (size_t i = 0; i < n; i++) scratch[i] = e->chunks[order[i]].offsets[k];
        qsort(scratch, n, sizeof *scratch, cmp_u64);
        size_t distinct = 0;
        for (size_t i = 0; i < n; i++) distinct += !i || scratch[i] != scratch[i - 1];
        if (distinct > best_distinct) best = k, best_distinct = distinct;
    }
    return best;
}

static bool boxes_overlap(int ndim, const dcp_chunk *a, const dcp_chunk *b)
{
    for (int k = 0; k < ndim; k++)
        if (a->offsets[k] >= b->offsets[k] + b->sizes[k] || b->offsets[k] >= a->offsets[k] + a->sizes[k]) return false;
    return true;
}

/* Bounds, no overlap, exact cover: default_planner.py _validate_global_plan. */
static int check_cover(mctx *m, const dcp_entry *e)
{
    char d1[CKPT_MAX_RANK * 24 + 4], d2[CKPT_MAX_RANK * 24 + 4], d3[CKPT_MAX_RANK * 24 + 4];
    uint64_t numel = 1, volume = 0;
    for (int k = 0; k < e->ndim; k++)
        if (!ckpt_mul(numel, e->shape[k], &numel)) return merr(m, CKPT_ELIMIT, "tensor '%s': element count overflows", e->fqn);
    size_t *order = ckpt_calloc(e->nchunks + 1, sizeof *order);
    uint64_t *scratch = ckpt_calloc(e->nchunks + 1, sizeof *scratch);
    if (!order || !scratch) {
        free(order);
        free(scratch);
        return CKPT_ENOMEM;
    }
    size_t no = 0;
    int rc = 0;
    for (size_t i = 0; !rc && i < e->nchunks; i++) {
        const dcp_chunk *ch = &e->chunks[i];
        uint64_t v = 1;
        for (int k = 0; k < e->ndim; k++) {
            uint64_t end;
            if (!ckpt_add(ch->offsets[k], ch->sizes[k], &end) || end > e->shape[k]) {
                rc = merr(m, CKPT_EINVAL, "tensor '%s' %s: chunk %zu (offsets %s, sizes %s) lies outside it", e->fqn,
                          dims_str(e->ndim, e->shape, d1, sizeof d1), i, dims_str(e->ndim, ch->offsets, d2, sizeof d2),
                          dims_str(e->ndim, ch->sizes, d3, sizeof d3));
                break;
            }
            v *= ch->sizes[k]; /* <= numel: no overflow */
        }
        if (!rc && v) order[no++] = i;
        if (!rc && !ckpt_add(volume, v, &volume)) rc = merr(m, CKPT_ELIMIT, "tensor '%s': chunk volumes overflow", e->fqn);
    }
    sweep sw = {e->chunks, 0};
    if (!rc && e->ndim > 0) {
        sw.axis = sweep_axis(e, order, no, scratch);
        qsort_r(order, no, sizeof *order, cmp_chunk_start, &sw);
    }
    for (size_t a = 0; !rc && a < no; a++)
        for (size_t b = a + 1; !rc && b < no; b++) {
            const dcp_chunk *x = &e->chunks[order[a]], *y = &e->chunks[order[b]];
            if (e->ndim > 0 && y->offsets[sw.axis] >= x->offsets[sw.axis] + x->sizes[sw.axis]) break;
            if (boxes_overlap(e->ndim, x, y))
                rc = merr(m, CKPT_EINVAL, "tensor '%s': chunks %zu (offsets %s) and %zu (offsets %s) overlap", e->fqn, order[a],
                          dims_str(e->ndim, x->offsets, d1, sizeof d1), order[b], dims_str(e->ndim, y->offsets, d2, sizeof d2));
        }
    if (!rc && volume != numel)
        rc = merr(m, CKPT_EINVAL, "tensor '%s' %s: its chunks cover %" PRIu64 " of its %" PRIu64 " elements (a hole: a chunk or rank is missing)",
                  e->fqn, dims_str(e->ndim, e->shape, d1, sizeof d1), volume, numel);
    free(order);
    free(scratch);
    return rc;
}

static int read_tensor(mctx *m, dcp_ckpt *c, dcp_entry *e, const pk_node *st, const skey *keys, size_t nkeys, size_t *total)
{
    char d1[CKPT_MAX_RANK * 24 + 4];
    const pk_node *props = get(m, st, "properties"), *size = get(m, st, "size"), *chunks = get(m, st, "chunks");
    const pk_node *ps = props ? state_of(m, props, D_PROPS) : NULL;
    const pk_node *dt = ps && ps->kind == PK_TUPLE && ps->n >= 1 ? item(m, ps, 0) : ps && ps->kind == PK_DICT ? get(m, ps, "dtype") : NULL;
    if (!dt || dt->kind != PK_GLOBAL || dt->tag < D_DTYPE0)
        return merr(m, CKPT_EINVAL, "tensor '%s': TensorStorageMetadata.properties has no torch dtype", e->fqn);
    int cdt = dtype_of[dt->tag - D_DTYPE0];
    if (cdt < 0) return merr(m, CKPT_EINVAL, "tensor '%s': dtype %s has no safetensors dtype", e->fqn, dt->s);
    e->dtype = (ckpt_dtype)cdt;
    if (!as_dims(m, size, &e->ndim, e->shape))
        return merr(m, CKPT_EINVAL, "tensor '%s': TensorStorageMetadata.size is not a torch.Size of at most %d dimensions", e->fqn,
                    CKPT_MAX_RANK);
    int rc = ckpt_dtype_nbytes(e->dtype, e->ndim, e->shape, &e->nbytes);
    if (rc) return ckpt_error_prefix(rc, "%s: tensor '%s'", m->label, e->fqn);
    if (!chunks || chunks->kind != PK_LIST) return merr(m, CKPT_EINVAL, "tensor '%s': TensorStorageMetadata.chunks is not a list", e->fqn);
    if (chunks->n > DCP_MAX_CHUNKS_PER_TENSOR || *total + chunks->n > DCP_MAX_CHUNKS)
        return merr(m, CKPT_ELIMIT, "tensor '%s': %zu chunks, more than the limit (%u per tensor, %u in all)", e->fqn, chunks->n,
                    DCP_MAX_CHUNKS_PER_TENSOR, DCP_MAX_CHUNKS);
    *total += chunks->n;
    if (!(e->chunks = ckpt_calloc(chunks->n + 1, sizeof *e->chunks))) return CKPT_ENOMEM;
    e->nchunks = chunks->n;
    for (size_t i = 0; i < chunks->n; i++) {
        dcp_chunk *ch = &e->chunks[i];
        const pk_node *cs = state_of(m, item(m, chunks, i), D_CHUNK);
        int no = -1, ns = -1;
        if (!cs || !as_dims(m, get(m, cs, "offsets"), &no, ch->offsets) || !as_dims(m, get(m, cs, "sizes"), &ns, ch->sizes) ||
            no != e->ndim || ns != e->ndim)
            return merr(m, CKPT_EINVAL, "tensor '%s': chunk %zu is not a ChunkStorageMetadata of offsets and sizes of %d dimensions",
                        e->fqn, i, e->ndim);
        const skey *k = find_key(keys, nkeys, e->fqn, e->ndim, ch->offsets);
        if (!k)
            return merr(m, CKPT_EINVAL, "tensor '%s': chunk %zu (offsets %s) has no storage_data entry", e->fqn, i,
                        dims_str(e->ndim, ch->offsets, d1, sizeof d1));
        ch->file = file_index(c, k->rel);
        ch->item_off = k->offset;
        ch->item_len = k->length;
    }
    return check_cover(m, e);
}

int dcp_parse_metadata(dcp_ckpt *c, const char *label, const uint8_t *buf, size_t len)
{
    allow_init();
    mctx m = {.label = label};
    pk_opts o = {.allow = ALLOW, .nallow = nallow};
    int rc = pk_parse(&m.doc, label, buf, len, &o);
    if (rc) return rc;
    skey *keys = NULL;
    size_t nkeys = 0, total = 0;
    const pk_node *root = N(&m, m.doc.root), *st = state_of(&m, root, D_METADATA);
    if (!st || st->kind != PK_DICT)
        rc = merr(&m, CKPT_EINVAL, "the pickle holds a %s, not torch.distributed.checkpoint's Metadata",
                  root->kind == PK_OBJ ? item(&m, root, 0)->s : pk_kind_name(root->kind));
    const pk_node *sdm = rc ? NULL : get(&m, st, "state_dict_metadata");
    if (!rc && (!sdm || sdm->kind != PK_DICT)) rc = merr(&m, CKPT_EINVAL, "Metadata.state_dict_metadata is not a dict");
    if (!rc) rc = read_storage(&m, get(&m, st, "storage_data"), &keys, &nkeys);
    if (!rc) rc = build_files(c, keys, nkeys);
    size_t n = rc ? 0 : sdm->n / 2;
    if (!rc && n > DCP_MAX_ENTRIES) rc = merr(&m, CKPT_ELIMIT, "%zu entries, at most %u", n, DCP_MAX_ENTRIES);
    if (!rc && !(c->entries = ckpt_calloc(n + 1, sizeof *c->entries))) rc = CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        const pk_node *key = item(&m, sdm, 2 * i), *val = item(&m, sdm, 2 * i + 1);
        if (!plain_str(key, ST_MAX_NAME)) {
            rc = merr(&m, CKPT_EINVAL, "state_dict_metadata key %zu is not a name (%s)", i, pk_kind_name(key->kind));
            break;
        }
        dcp_entry *e = &c->entries[c->nentries++];
        if (!(e->fqn = ckpt_strdup(key->s))) {
            rc = CKPT_ENOMEM;
            break;
        }
        if (is_record(&m, val, D_BYTES)) {
            e->is_bytes = true;
            const skey *k = find_key(keys, nkeys, e->fqn, -1, NULL);
            if (!k) rc = merr(&m, CKPT_EINVAL, "bytes entry '%s' has no storage_data entry", e->fqn);
            else {
                e->file = file_index(c, k->rel);
                e->item_off = k->offset;
                e->item_len = k->length;
            }
        } else if (is_record(&m, val, D_TSM)) {
            rc = read_tensor(&m, c, e, state_of(&m, val, D_TSM), keys, nkeys, &total);
            if (!rc) c->total_bytes += e->nbytes;
        } else {
            rc = merr(&m, CKPT_EINVAL, "entry '%s' is a %s, not TensorStorageMetadata or BytesStorageMetadata", e->fqn,
                      val->kind == PK_OBJ ? item(&m, val, 0)->s : pk_kind_name(val->kind));
        }
    }
    if (!rc) {
        qsort(c->entries, c->nentries, sizeof *c->entries, cmp_entry);
        for (size_t i = 1; !rc && i < c->nentries; i++)
            if (!strcmp(c->entries[i - 1].fqn, c->entries[i].fqn)) rc = merr(&m, CKPT_EINVAL, "entry '%s' appears twice", c->entries[i].fqn);
        c->nchunks = total;
    }
    free(keys);
    pk_free(&m.doc);
    return rc;
}

/* ---- the .distcp files ---- */

typedef struct {
    int fd;
    const char *path;
    uint64_t base, len;
} slice_src;

static int slice_read(void *ctx, void *buf, size_t len, uint64_t off)
{
    const slice_src *s = ctx;
    if (off > s->len || len > s->len - off) return ckpt_error_set(CKPT_EINVAL, "%s: read past the item", s->path);
    return ckpt_pread_full(s->fd, buf, len, s->base + off, s->path);
}

static int open_file(dcp_ckpt *c, size_t f, const char *user, int *fd)
{
    dcp_file *df = &c->files[f];
    *fd = open(df->path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0) {
        if (errno == ENOENT)
            return ckpt_error_set(CKPT_ENOTFOUND, "%s: no such file (named by %s for '%s')", df->path, DCP_METADATA_FILE, user);
        return ckpt_error_sys("%s: open", df->path);
    }
    struct stat sb;
    if (fstat(*fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
        int rc = ckpt_error_set(CKPT_EINVAL, "%s: not a regular file", df->path);
        close(*fd);
        *fd = -1;
        return rc;
    }
    df->size = (uint64_t)sb.st_size;
    return 0;
}

static int check_range(const dcp_ckpt *c, size_t f, const char *what, uint64_t off, uint64_t len)
{
    uint64_t end;
    if (!ckpt_add(off, len, &end) || end > c->files[f].size)
        return ckpt_error_set(CKPT_ECORRUPT, "%s: %s: bytes [%" PRIu64 ", +%" PRIu64 ") lie outside the file of %" PRIu64 " bytes (per %s)",
                              c->files[f].path, what, off, len, c->files[f].size, DCP_METADATA_FILE);
    return 0;
}

static int read_chunk(dcp_ckpt *c, const dcp_entry *e, size_t i, int fd)
{
    dcp_chunk *ch = &e->chunks[i];
    const char *path = c->files[ch->file].path;
    char what[ST_MAX_NAME + 64], label[ST_MAX_NAME + PATH_MAX + 160], d1[CKPT_MAX_RANK * 24 + 4], d2[CKPT_MAX_RANK * 24 + 4];
    snprintf(what, sizeof what, "tensor '%s' chunk %zu", e->fqn, i);
    int rc = check_range(c, ch->file, what, ch->item_off, ch->item_len);
    if (rc) return rc;
    uint8_t head[4] = {0};
    if (ch->item_len >= 4 && (rc = ckpt_pread_full(fd, head, 4, ch->item_off, path))) return rc;
    if (ch->item_len < 4 || memcmp(head, "PK\3\4", 4))
        return ckpt_error_set(CKPT_EINVAL, "%s: %s at byte %" PRIu64 " is not a torch.save (a .distcp written with "
                              "serialization_format=SAFETENSORS is not read)", path, what, ch->item_off);
    snprintf(label, sizeof label, "%s: %s (bytes %" PRIu64 "+%" PRIu64 ")", path, what, ch->item_off, ch->item_len);
    slice_src src = {fd, path, ch->item_off, ch->item_len};
    st_file f;
    rc = torch_parse_tensor(&f, label, slice_read, &src, ch->item_len);
    if (rc) return rc;
    const st_tensor *t = f.ntensors == 1 ? &f.tensors[0] : NULL;
    if (!t) rc = ckpt_error_set(CKPT_EINVAL, "%s: holds no tensor", label);
    else if (t->dtype != e->dtype)
        rc = ckpt_error_set(CKPT_EINVAL, "%s: dtype %s, the metadata says %s", label, ckpt_dtype_name(t->dtype), ckpt_dtype_name(e->dtype));
    else if (t->ndim != e->ndim || memcmp(t->shape, ch->sizes, (size_t)e->ndim * sizeof *ch->sizes))
        rc = ckpt_error_set(CKPT_EINVAL, "%s: shape %s, the metadata's chunk sizes are %s", label, dims_str(t->ndim, t->shape, d1, sizeof d1),
                            dims_str(e->ndim, ch->sizes, d2, sizeof d2));
    if (!rc) {
        ch->data_off = ch->item_off + t->offset;
        ch->nbytes = t->nbytes;
        ch->view = t->view;
        if (t->view) {
            memcpy(ch->axes, t->view_axes, sizeof ch->axes);
            memcpy(ch->stored, t->stored_shape, sizeof ch->stored);
        }
    }
    st_close(&f);
    return rc;
}

static int read_files(dcp_ckpt *c)
{
    /* which entry first names each file, for messages */
    const char **user = ckpt_calloc(c->nfiles + 1, sizeof *user);
    if (!user) return CKPT_ENOMEM;
    for (size_t i = 0; i < c->nentries; i++) {
        const dcp_entry *e = &c->entries[i];
        if (e->is_bytes && !user[e->file]) user[e->file] = e->fqn;
        for (size_t k = 0; k < e->nchunks; k++)
            if (!user[e->chunks[k].file]) user[e->chunks[k].file] = e->fqn;
    }
    int rc = 0;
    for (size_t f = 0; !rc && f < c->nfiles; f++) {
        int fd = -1;
        rc = open_file(c, f, user[f] ? user[f] : "?", &fd);
        for (size_t i = 0; !rc && i < c->nentries; i++) {
            const dcp_entry *e = &c->entries[i];
            if (e->is_bytes && e->file == f) {
                char what[ST_MAX_NAME + 32];
                snprintf(what, sizeof what, "bytes entry '%s'", e->fqn);
                rc = check_range(c, f, what, e->item_off, e->item_len);
            }
            for (size_t k = 0; !rc && k < e->nchunks; k++)
                if (e->chunks[k].file == f) rc = read_chunk(c, e, k, fd);
        }
        if (fd >= 0) close(fd);
    }
    free(user);
    return rc;
}

bool dcp_is_checkpoint(const char *path)
{
    if (!ckpt_is_dir(path)) return false;
    char *meta = ckpt_path_join(path, DCP_METADATA_FILE);
    bool yes = meta && ckpt_exists(meta);
    free(meta);
    if (yes) return true;
    DIR *d = opendir(path);
    struct dirent *de;
    while (d && !yes && (de = readdir(d))) {
        size_t n = strlen(de->d_name);
        yes = n > 7 && !strcmp(de->d_name + n - 7, ".distcp");
    }
    if (d) closedir(d);
    return yes;
}

int dcp_open(dcp_ckpt *c, const char *dir)
{
    memset(c, 0, sizeof *c);
    if (!(c->dir = ckpt_strdup(dir))) return CKPT_ENOMEM;
    char *mpath = ckpt_path_join(dir, DCP_METADATA_FILE), *buf = NULL;
    size_t len = 0;
    int rc = mpath ? 0 : CKPT_ENOMEM;
    if (!rc) rc = ckpt_read_file(mpath, DCP_MAX_METADATA_BYTES, &buf, &len);
    if (rc == CKPT_ENOTFOUND)
        rc = ckpt_error_set(CKPT_ENOTFOUND, "%s: no such file (a PyTorch DCP checkpoint needs its %s)", mpath, DCP_METADATA_FILE);
    if (!rc) rc = dcp_parse_metadata(c, mpath, (const uint8_t *)buf, len);
    free(buf);
    free(mpath);
    if (!rc) rc = read_files(c);
    if (rc) dcp_close(c);
    return rc;
}

void dcp_close(dcp_ckpt *c)
{
    for (size_t i = 0; i < c->nentries; i++) {
        free(c->entries[i].fqn);
        free(c->entries[i].chunks);
    }
    free(c->entries);
    for (size_t i = 0; i < c->nfiles; i++) {
        free(c->files[i].name);
        free(c->files[i].path);
    }
    free(c->files);
    free(c->dir);
    memset(c, 0, sizeof *c);
}

const dcp_entry *dcp_find(const dcp_ckpt *c, const char *fqn)
{
    dcp_entry key = {.fqn = (char *)fqn};
    return bsearch(&key, c->entries, c->nentries, sizeof *c->entries, cmp_entry);
}

const char *dcp_non_model_kind(const char *fqn)
{
    static const struct {
        const char *prefix, *kind;
    } keys[] = {{"optim.", "optimizer state"},       {"optimizer.", "optimizer state"},
                {"lr_scheduler.", "training state"}, {"train_state.", "training state"},
                {"dataloader.", "training state"}};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(keys); i++)
        if (!strncmp(fqn, keys[i].prefix, strlen(keys[i].prefix))) return keys[i].kind;
    return NULL;
}

/* torch_write.c — a state dict as a torch.save zip file (torch_write.h). */
#include "format/torch_write.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"
#include "format/torch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_EOCD 0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_LOC64 0x07064b50u
#define LOCAL_LEN 30
#define CENTRAL_LEN 46
#define EOCD_LEN 22
#define EOCD64_LEN 56
#define LOC64_LEN 20
#define U32_MAX 0xFFFFFFFFu
#define DOS_DATE 0x0021 /* 1980-01-01, 00:00: the same bytes for the same tensors */
#define PICKLE_BATCH 1000 /* Python's pickler: SETITEMS every 1000 pairs */
#define CRC_CHUNK (4u << 20)

static const uint8_t BYTEORDER[] = "little";
static const uint8_t VERSION[] = "3\n";

/* ---- a growing byte buffer ---- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    int rc;
} buf;

static void put(buf *b, const void *src, size_t len)
{
    if (b->rc) return;
    if (ckpt_grow(&b->p, &b->cap, b->n + len, 1)) {
        b->rc = CKPT_ENOMEM;
        return;
    }
    memcpy(b->p + b->n, src, len);
    b->n += len;
}
static void put8(buf *b, uint8_t v) { put(b, &v, 1); }
static void put16(buf *b, uint16_t v)
{
    uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    put(b, x, 2);
}
static void put32(buf *b, uint32_t v)
{
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, x, 4);
}
static void put64(buf *b, uint64_t v)
{
    put32(b, (uint32_t)v);
    put32(b, (uint32_t)(v >> 32));
}

/* ---- the pickle (protocol 2, as Python's pickler writes torch's state dicts) ---- */

static void pk_global(buf *b, const char *module, const char *name)
{
    put8(b, 'c');
    put(b, module, strlen(module));
    put8(b, '\n');
    put(b, name, strlen(name));
    put8(b, '\n');
}

static void pk_str(buf *b, const char *s)
{
    size_t n = strlen(s);
    put8(b, 'X');
    put32(b, (uint32_t)n);
    put(b, s, n);
}

/* BININT1 / BININT2 / BININT, else LONG1 with the fewest bytes (save_long). */
static void pk_int(buf *b, uint64_t v)
{
    if (v < 256) {
        put8(b, 'K');
        put8(b, (uint8_t)v);
    } else if (v < 65536) {
        put8(b, 'M');
        put16(b, (uint16_t)v);
    } else if (v < 0x80000000u) {
        put8(b, 'J');
        put32(b, (uint32_t)v);
    } else {
        uint8_t x[9];
        size_t n = 0;
        for (uint64_t t = v; t; t >>= 8) x[n++] = (uint8_t)t;
        if (x[n - 1] & 0x80) x[n++] = 0; /* two's complement: keep it positive */
        put8(b, 0x8a);
        put8(b, (uint8_t)n);
        put(b, x, n);
    }
}

/* A tuple of ints: EMPTY_TUPLE, TUPLE1..3, else MARK ... TUPLE. */
static void pk_tuple(buf *b, const uint64_t *v, int n)
{
    static const uint8_t small[] = {')', 0x85, 0x86, 0x87};
    if (n > 3) put8(b, '(');
    for (int i = 0; i < n; i++) pk_int(b, v[i]);
    put8(b, n <= 3 ? small[n] : 't');
}

/* torch._utils._rebuild_tensor_v2 of storage `key` (a contiguous tensor at offset 0). */
static int pk_tensor(buf *b, const torch_out_tensor *t, size_t key)
{
    const char *storage = torch_storage_type(t->dtype);
    if (!storage)
        return ckpt_error_set(CKPT_EINVAL, "tensor '%s': torch has no storage type for %s", t->name, ckpt_dtype_name(t->dtype));
    uint64_t numel = 1, stride[CKPT_MAX_RANK];
    for (int k = t->ndim - 1; k >= 0; k--) {
        stride[k] = numel;
        numel *= t->shape[k];
    }
    char ks[32];
    snprintf(ks, sizeof ks, "%zu", key);
    pk_global(b, "torch._utils", "_rebuild_tensor_v2");
    put8(b, '(');
    put8(b, '('); /* the persistent id */
    pk_str(b, "storage");
    pk_global(b, "torch", storage);
    pk_str(b, ks);
    pk_str(b, "cpu");
    pk_int(b, numel);
    put8(b, 't');
    put8(b, 'Q'); /* BINPERSID */
    pk_int(b, 0); /* storage offset */
    pk_tuple(b, t->shape, t->ndim);
    pk_tuple(b, stride, t->ndim);
    put8(b, 0x89); /* requires_grad False */
    pk_global(b, "collections", "OrderedDict"); /* backward hooks */
    put8(b, ')');
    put8(b, 'R');
    put8(b, 't');
    put8(b, 'R');
    return 0;
}

static int pk_done(buf *b, uint8_t **out, size_t *len)
{
    put8(b, '.');
    if (b->rc) {
        free(b->p);
        return b->rc;
    }
    *out = b->p;
    *len = b->n;
    return 0;
}

/* PROTO 2, then an empty collections.OrderedDict (its items follow, SETITEMS). */
static void pk_odict(buf *b)
{
    put8(b, 0x80);
    put8(b, 2);
    pk_global(b, "collections", "OrderedDict");
    put8(b, ')');
    put8(b, 'R');
}

int torch_out_pickle(const torch_out_tensor *t, size_t n, uint8_t **out, size_t *len)
{
    buf b = {0};
    pk_odict(&b);
    for (size_t i = 0; i < n; i++) {
        if (i % PICKLE_BATCH == 0) put8(&b, '(');
        pk_str(&b, t[i].name);
        int rc = pk_tensor(&b, &t[i], i);
        if (rc) {
            free(b.p);
            return rc;
        }
        if (i % PICKLE_BATCH == PICKLE_BATCH - 1 || i == n - 1) put8(&b, 'u'); /* SETITEMS */
    }
    return pk_done(&b, out, len);
}

int torch_out_pickle_tensor(const torch_out_tensor *t, uint8_t **out, size_t *len)
{
    buf b = {0};
    put8(&b, 0x80);
    put8(&b, 2);
    int rc = pk_tensor(&b, t, 0);
    if (rc) {
        free(b.p);
        return rc;
    }
    return pk_done(&b, out, len);
}

int torch_out_pickle_records(const torch_out_tensor *t, size_t n, const char *module, const char *cls, const char *field,
                             uint8_t **out, size_t *len)
{
    buf b = {0};
    pk_odict(&b);
    for (size_t i = 0; i < n; i++) {
        if (i % PICKLE_BATCH == 0) put8(&b, '(');
        pk_str(&b, t[i].name);
        pk_global(&b, module, cls); /* copyreg.__newobj__(cls), then its __dict__ */
        put8(&b, ')');
        put8(&b, 0x81); /* NEWOBJ */
        put8(&b, '}');
        pk_str(&b, field);
        pk_int(&b, i);
        put8(&b, 's');
        put8(&b, 'b'); /* BUILD */
        if (i % PICKLE_BATCH == PICKLE_BATCH - 1 || i == n - 1) put8(&b, 'u');
    }
    return pk_done(&b, out, len);
}

int torch_out_pickle_xser_info(const torch_out_tensor *t, size_t n, uint8_t **out, size_t *len)
{
    buf b = {0};
    put8(&b, 0x80);
    put8(&b, 2);
    put8(&b, '}');
    for (size_t i = 0; i < n; i++) {
        const char *dt = torch_dtype_attr(t[i].dtype);
        if (!dt) {
            free(b.p);
            return ckpt_error_set(CKPT_EINVAL, "tensor '%s': torch has no dtype for %s", t[i].name, ckpt_dtype_name(t[i].dtype));
        }
        if (i % PICKLE_BATCH == 0) put8(&b, '(');
        pk_int(&b, i);
        put8(&b, '}');
        put8(&b, '(');
        pk_str(&b, "dtype");
        pk_global(&b, "torch", dt);
        pk_str(&b, "shape");
        pk_global(&b, "torch", "Size");
        pk_tuple(&b, t[i].shape, t[i].ndim);
        put8(&b, 0x85); /* TUPLE1: Size's one argument */
        put8(&b, 'R');
        pk_str(&b, "expert_model_parallel");
        put8(&b, 0x89);
        put8(&b, 'u');
        if (i % PICKLE_BATCH == PICKLE_BATCH - 1 || i == n - 1) put8(&b, 'u');
    }
    return pk_done(&b, out, len);
}

/* ---- the zip ---- */

static bool zip64_local(const struct torch_out_entry *e) { return e->size >= U32_MAX; }

/* The local header's extra field: zip64 sizes when they need it, then "FB"
 * padding so the data starts on a TORCH_OUT_ALIGN boundary. */
static uint16_t local_extra_len(uint64_t header, size_t name_len, uint64_t size)
{
    uint64_t start = header + LOCAL_LEN + name_len + (size >= U32_MAX ? 20 : 0) + 4;
    return (uint16_t)((size >= U32_MAX ? 20 : 0) + 4 + (TORCH_OUT_ALIGN - start % TORCH_OUT_ALIGN) % TORCH_OUT_ALIGN);
}

static int add_entry(torch_out *o, uint64_t *cursor, const char *rel, const uint8_t *bytes, uint64_t size,
                     size_t tensor)
{
    struct torch_out_entry *e = &o->e[o->ne];
    memset(e, 0, sizeof *e);
    if (!(e->name = ckpt_sprintf("%s/%s", o->archive, rel))) return CKPT_ENOMEM;
    o->ne++;
    size_t nl = strlen(e->name);
    e->header = *cursor;
    e->extra_len = local_extra_len(*cursor, nl, size);
    e->data = *cursor + LOCAL_LEN + nl + e->extra_len;
    e->size = size;
    e->bytes = bytes;
    e->tensor = tensor;
    if (!ckpt_add(e->data, size, cursor)) return ckpt_error_set(CKPT_ELIMIT, "torch.save file: size overflows");
    return 0;
}

static int cmp_key(const void *a, const void *b)
{
    char x[32], y[32];
    snprintf(x, sizeof x, "%zu", *(const size_t *)a);
    snprintf(y, sizeof y, "%zu", *(const size_t *)b);
    return strcmp(x, y);
}

void torch_out_free(torch_out *o)
{
    for (size_t i = 0; i < o->n; i++) free(o->t[i].name);
    for (size_t i = 0; i < o->ne; i++) free(o->e[i].name);
    free(o->t);
    free(o->e);
    free(o->pickle);
    free(o->archive);
    memset(o, 0, sizeof *o);
}

int torch_out_plan(torch_out *o, const char *archive, const torch_out_tensor *tensors, size_t n)
{
    return torch_out_plan_pickle(o, archive, tensors, n, NULL, 0);
}

int torch_out_plan_pickle(torch_out *o, const char *archive, const torch_out_tensor *tensors, size_t n,
                          const uint8_t *pickle, size_t pickle_len)
{
    memset(o, 0, sizeof *o);
    o->archive = ckpt_strdup(archive ? archive : "archive");
    o->t = ckpt_calloc(n + 1, sizeof *o->t);
    o->e = ckpt_calloc(n + 4, sizeof *o->e);
    size_t *order = ckpt_calloc(n + 1, sizeof *order);
    int rc = o->archive && o->t && o->e && order ? 0 : CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        o->t[i] = tensors[i];
        o->t[i].offset = 0;
        if (!(o->t[i].name = ckpt_strdup(tensors[i].name))) rc = CKPT_ENOMEM;
        else o->n++;
        uint64_t nb;
        if (!rc && (rc = ckpt_dtype_nbytes(tensors[i].dtype, tensors[i].ndim, tensors[i].shape, &nb)))
            rc = ckpt_error_prefix(rc, "tensor '%s'", tensors[i].name);
        else if (!rc && nb != tensors[i].nbytes)
            rc = ckpt_error_set(CKPT_EINVAL, "tensor '%s': %llu bytes given, its shape holds %llu", tensors[i].name,
                                (unsigned long long)tensors[i].nbytes, (unsigned long long)nb);
        order[i] = i;
    }
    if (!rc && pickle) {
        if (!(o->pickle = ckpt_malloc(pickle_len + 1))) rc = CKPT_ENOMEM;
        else memcpy(o->pickle, pickle, pickle_len), o->pickle_len = pickle_len;
    } else if (!rc) {
        rc = torch_out_pickle(o->t, o->n, &o->pickle, &o->pickle_len);
    }
    uint64_t cursor = 0;
    if (!rc) rc = add_entry(o, &cursor, "data.pkl", o->pickle, o->pickle_len, 0);
    if (!rc) rc = add_entry(o, &cursor, "byteorder", BYTEORDER, sizeof BYTEORDER - 1, 0);
    /* torch writes storages in the sorted order of their (string) keys */
    if (!rc) qsort(order, n, sizeof *order, cmp_key);
    for (size_t k = 0; !rc && k < n; k++) {
        char rel[40];
        snprintf(rel, sizeof rel, "data/%zu", order[k]);
        rc = add_entry(o, &cursor, rel, NULL, o->t[order[k]].nbytes, order[k]);
        if (!rc) o->t[order[k]].offset = o->e[o->ne - 1].data;
    }
    if (!rc) rc = add_entry(o, &cursor, "version", VERSION, sizeof VERSION - 1, 0);
    if (!rc) {
        o->cd_offset = cursor;
        uint64_t cd = 0;
        for (size_t i = 0; i < o->ne; i++) {
            const struct torch_out_entry *e = &o->e[i];
            bool z64 = e->size >= U32_MAX || e->header >= U32_MAX;
            cd += CENTRAL_LEN + strlen(e->name) + (z64 ? 4 : 0) + (e->size >= U32_MAX ? 16 : 0) +
                  (e->header >= U32_MAX ? 8 : 0);
        }
        o->cd_size = cd;
        bool z64 = o->cd_offset >= U32_MAX || o->ne >= 0xFFFF;
        o->file_size = o->cd_offset + cd + (z64 ? EOCD64_LEN + LOC64_LEN : 0) + EOCD_LEN;
    }
    free(order);
    if (rc) torch_out_free(o);
    return rc;
}

static int crc_of(int fd, uint64_t off, uint64_t len, const char *path, uint8_t *chunk, uint32_t *out)
{
    uLong crc = crc32(0L, Z_NULL, 0);
    while (len) {
        size_t n = len < CRC_CHUNK ? (size_t)len : CRC_CHUNK;
        int rc = ckpt_pread_full(fd, chunk, n, off, path);
        if (rc) return rc;
        crc = crc32(crc, chunk, (uInt)n);
        off += n;
        len -= n;
    }
    *out = (uint32_t)crc;
    return 0;
}

int torch_out_finish(const torch_out *o, int fd, const char *path)
{
    return torch_out_finish_crc(o, fd, path, NULL);
}

int torch_out_finish_crc(const torch_out *o, int fd, const char *path, const uint32_t *tensor_crc)
{
    uint32_t *crc = ckpt_calloc(o->ne + 1, sizeof *crc);
    uint8_t *chunk = tensor_crc ? NULL : ckpt_malloc(CRC_CHUNK);
    int rc = crc && (chunk || tensor_crc) ? 0 : CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < o->ne; i++) {
        const struct torch_out_entry *e = &o->e[i];
        if (e->bytes) crc[i] = (uint32_t)crc32(crc32(0L, Z_NULL, 0), e->bytes, (uInt)e->size);
        else if (tensor_crc) crc[i] = tensor_crc[e->tensor];
        else rc = crc_of(fd, e->data, e->size, path, chunk, &crc[i]);
        if (rc) rc = ckpt_error_prefix(rc, "%s: entry '%s'", path, e->name);
    }
    free(chunk);
    /* local headers (and the small records' contents) */
    for (size_t i = 0; !rc && i < o->ne; i++) {
        const struct torch_out_entry *e = &o->e[i];
        size_t nl = strlen(e->name);
        bool z64 = zip64_local(e);
        buf b = {0};
        put32(&b, SIG_LOCAL);
        put16(&b, z64 ? 45 : 20);
        put16(&b, 0);
        put16(&b, 0); /* stored */
        put16(&b, 0);
        put16(&b, DOS_DATE);
        put32(&b, crc[i]);
        put32(&b, z64 ? U32_MAX : (uint32_t)e->size);
        put32(&b, z64 ? U32_MAX : (uint32_t)e->size);
        put16(&b, (uint16_t)nl);
        put16(&b, e->extra_len);
        put(&b, e->name, nl);
        if (z64) {
            put16(&b, 0x0001);
            put16(&b, 16);
            put64(&b, e->size);
            put64(&b, e->size);
        }
        uint16_t pad = (uint16_t)(e->extra_len - (z64 ? 20 : 0) - 4);
        put8(&b, 'F');
        put8(&b, 'B');
        put16(&b, pad);
        for (uint16_t k = 0; k < pad; k++) put8(&b, 'Z');
        if (e->bytes) put(&b, e->bytes, e->size);
        rc = b.rc ? b.rc : ckpt_pwrite_full(fd, b.p, b.n, e->header, path);
        free(b.p);
    }
    /* the central directory and its end records */
    buf b = {0};
    for (size_t i = 0; !rc && i < o->ne; i++) {
        const struct torch_out_entry *e = &o->e[i];
        size_t nl = strlen(e->name);
        bool big = e->size >= U32_MAX, far = e->header >= U32_MAX;
        put32(&b, SIG_CENTRAL);
        put16(&b, big || far ? 45 : 20); /* made by */
        put16(&b, big || far ? 45 : 20); /* needed */
        put16(&b, 0);
        put16(&b, 0);
        put16(&b, 0);
        put16(&b, DOS_DATE);
        put32(&b, crc[i]);
        put32(&b, big ? U32_MAX : (uint32_t)e->size);
        put32(&b, big ? U32_MAX : (uint32_t)e->size);
        put16(&b, (uint16_t)nl);
        put16(&b, (uint16_t)(big || far ? 4 + (big ? 16 : 0) + (far ? 8 : 0) : 0));
        put16(&b, 0); /* comment */
        put16(&b, 0); /* disk */
        put16(&b, 0);
        put32(&b, 0);
        put32(&b, far ? U32_MAX : (uint32_t)e->header);
        put(&b, e->name, nl);
        if (big || far) {
            put16(&b, 0x0001);
            put16(&b, (uint16_t)((big ? 16 : 0) + (far ? 8 : 0)));
            if (big) {
                put64(&b, e->size);
                put64(&b, e->size);
            }
            if (far) put64(&b, e->header);
        }
    }
    bool z64 = o->cd_offset >= U32_MAX || o->ne >= 0xFFFF;
    if (!rc && z64) {
        uint64_t at = o->cd_offset + o->cd_size;
        put32(&b, SIG_EOCD64);
        put64(&b, EOCD64_LEN - 12);
        put16(&b, 45);
        put16(&b, 45);
        put32(&b, 0);
        put32(&b, 0);
        put64(&b, o->ne);
        put64(&b, o->ne);
        put64(&b, o->cd_size);
        put64(&b, o->cd_offset);
        put32(&b, SIG_LOC64);
        put32(&b, 0);
        put64(&b, at);
        put32(&b, 1);
    }
    if (!rc) {
        put32(&b, SIG_EOCD);
        put16(&b, 0);
        put16(&b, 0);
        put16(&b, z64 ? 0xFFFF : (uint16_t)o->ne);
        put16(&b, z64 ? 0xFFFF : (uint16_t)o->ne);
        put32(&b, z64 ? U32_MAX : (uint32_t)o->cd_size);
        put32(&b, z64 ? U32_MAX : (uint32_t)o->cd_offset);
        put16(&b, 0);
        rc = b.rc;
    }
    if (!rc && o->cd_offset + b.n != o->file_size)
        rc = ckpt_error_set(CKPT_EINTERNAL, "%s: the zip's end is at %llu, planned %llu", path,
                            (unsigned long long)(o->cd_offset + b.n), (unsigned long long)o->file_size);
    if (!rc) rc = ckpt_pwrite_full(fd, b.p, b.n, o->cd_offset, path);
    free(b.p);
    free(crc);
    return rc;
}

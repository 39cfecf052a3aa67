/*
 * zipdir.c — reads and validates a zip directory for in-place reads (see
 * zipdir.h): EOCD (and zip64 EOCD via its locator), central entries with
 * their zip64 extra fields, each local header cross-checked, then the whole
 * layout checked for overlaps.
 */
#include "format/zipdir.h"

#include "common/error.h"
#include "common/util.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_EOCD 0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_LOC64 0x07064b50u
#define EOCD_LEN 22
#define LOC64_LEN 20
#define EOCD64_LEN 56
#define CENTRAL_LEN 46
#define LOCAL_LEN 30

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

bool zipdir_sniff(const uint8_t *head, size_t len)
{
    return len >= 4 && le32(head) == SIG_LOCAL;
}

uint32_t zipdir_crc32(uint32_t crc, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) { /* zlib takes uInt lengths */
        uInt n = len > (1u << 30) ? (1u << 30) : (uInt)len;
        crc = (uint32_t)crc32(crc, p, n);
        p += n;
        len -= n;
    }
    return crc;
}

/* The EOCD: the last record whose comment runs exactly to the end of the file. */
static int find_eocd(const char *label, zip_read_fn rd, void *ctx, uint64_t file_size, uint64_t *pos, uint8_t rec[EOCD_LEN])
{
    if (file_size < EOCD_LEN) return ckpt_error_set(CKPT_EINVAL, "%s: zip: %" PRIu64 " bytes is too short for an archive", label, file_size);
    uint64_t tail = file_size < EOCD_LEN + 65535 ? file_size : EOCD_LEN + 65535;
    uint8_t *buf = ckpt_malloc((size_t)tail);
    if (!buf) return CKPT_ENOMEM;
    int rc = rd(ctx, buf, (size_t)tail, file_size - tail);
    for (uint64_t i = tail - EOCD_LEN + 1; !rc && i-- > 0;) {
        if (le32(buf + i) != SIG_EOCD || le16(buf + i + 20) != tail - i - EOCD_LEN) continue;
        *pos = file_size - tail + i;
        memcpy(rec, buf + i, EOCD_LEN);
        free(buf);
        return 0;
    }
    free(buf);
    return rc ? rc : ckpt_error_set(CKPT_EINVAL, "%s: zip: no end-of-central-directory record at the end of the file", label);
}

/* Fills count, cd_size, cd_offset from the EOCD, or the zip64 EOCD when
 * present; *cd_limit is where the central directory must end. */
static int read_eocd(zip_dir *z, const char *label, zip_read_fn rd, void *ctx, uint64_t file_size, uint64_t *count,
                     uint64_t *cd_limit)
{
    uint64_t pos = 0;
    uint8_t e[EOCD_LEN] = {0};
    int rc = find_eocd(label, rd, ctx, file_size, &pos, e);
    if (rc) return rc;
    if (le16(e + 4) != 0 || le16(e + 6) != 0 || le16(e + 8) != le16(e + 10))
        return ckpt_error_set(CKPT_EINVAL, "%s: zip: multi-disk archives are not supported", label);
    *count = le16(e + 10);
    z->cd_size = le32(e + 12);
    z->cd_offset = le32(e + 16);
    *cd_limit = pos;
    uint8_t l[LOC64_LEN];
    if (pos >= LOC64_LEN && (rc = rd(ctx, l, LOC64_LEN, pos - LOC64_LEN)) == 0 && le32(l) == SIG_LOC64) {
        uint64_t off64 = le64(l + 8);
        uint8_t r[EOCD64_LEN];
        if (le32(l + 4) != 0 || le32(l + 16) > 1)
            return ckpt_error_set(CKPT_EINVAL, "%s: zip: multi-disk archives are not supported", label);
        if (off64 > pos - LOC64_LEN || pos - LOC64_LEN - off64 < EOCD64_LEN)
            return ckpt_error_set(CKPT_EINVAL, "%s: zip: the zip64 end record at %" PRIu64 " is outside the archive", label, off64);
        if ((rc = rd(ctx, r, EOCD64_LEN, off64))) return rc;
        if (le32(r) != SIG_EOCD64)
            return ckpt_error_set(CKPT_EINVAL, "%s: zip: no zip64 end record at %" PRIu64, label, off64);
        if (le32(r + 16) != 0 || le32(r + 20) != 0 || le64(r + 24) != le64(r + 32))
            return ckpt_error_set(CKPT_EINVAL, "%s: zip: multi-disk archives are not supported", label);
        *count = le64(r + 32);
        z->cd_size = le64(r + 40);
        z->cd_offset = le64(r + 48);
        *cd_limit = off64;
    } else if (rc) {
        return rc;
    }
    uint64_t cd_end;
    if (*count > ZIP_MAX_ENTRIES)
        return ckpt_error_set(CKPT_ELIMIT, "%s: zip: %" PRIu64 " entries, at most %d", label, *count, ZIP_MAX_ENTRIES);
    if (z->cd_size > ZIP_MAX_CD_BYTES)
        return ckpt_error_set(CKPT_ELIMIT, "%s: zip: a central directory of %" PRIu64 " bytes, at most %u", label,
                              z->cd_size, ZIP_MAX_CD_BYTES);
    if (!ckpt_add(z->cd_offset, z->cd_size, &cd_end) || cd_end > *cd_limit)
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: zip: the central directory [%" PRIu64 ", +%" PRIu64 ") runs past its end record at %" PRIu64,
                              label, z->cd_offset, z->cd_size, *cd_limit);
    return 0;
}

/* The zip64 extra field (id 1) of a central entry: 64-bit values for the
 * fields stored as 0xFFFFFFFF, in the order size, comp_size, offset. */
static int apply_zip64(const char *label, const char *name, const uint8_t *x, size_t xlen, zip_entry *e, bool need_size,
                       bool need_comp, bool need_off)
{
    while (xlen >= 4) {
        uint16_t id = le16(x), n = le16(x + 2);
        if ((size_t)n > xlen - 4) break;
        if (id == 1) {
            const uint8_t *p = x + 4;
            size_t left = n;
            uint64_t *dst[3] = {need_size ? &e->size : NULL, need_comp ? &e->comp_size : NULL,
                                need_off ? &e->header_offset : NULL};
            for (int k = 0; k < 3; k++) {
                if (!dst[k]) continue;
                if (left < 8) return ckpt_error_set(CKPT_EINVAL, "%s: zip: entry '%s': zip64 extra field too short", label, name);
                *dst[k] = le64(p);
                p += 8;
                left -= 8;
            }
            return 0;
        }
        x += 4 + n;
        xlen -= 4 + (size_t)n;
    }
    if (need_size || need_comp || need_off)
        return ckpt_error_set(CKPT_EINVAL, "%s: zip: entry '%s' has 32-bit fields of 0xFFFFFFFF but no zip64 extra field",
                              label, name);
    return 0;
}

static int parse_central(zip_dir *z, const char *label, const uint8_t *cd, uint64_t count)
{
    size_t pos = 0;
    z->e = ckpt_calloc((size_t)count + 1, sizeof *z->e);
    if (!z->e) return CKPT_ENOMEM;
    for (uint64_t i = 0; i < count; i++) {
        if (z->cd_size - pos < CENTRAL_LEN || le32(cd + pos) != SIG_CENTRAL)
            return ckpt_error_set(CKPT_EINVAL, "%s: zip: central entry %" PRIu64 " of %" PRIu64 " is missing or damaged", label, i,
                                  count);
        const uint8_t *h = cd + pos;
        size_t nlen = le16(h + 28), xlen = le16(h + 30), clen = le16(h + 32);
        if (z->cd_size - pos - CENTRAL_LEN < nlen + xlen + clen)
            return ckpt_error_set(CKPT_EINVAL, "%s: zip: central entry %" PRIu64 " runs past the directory", label, i);
        zip_entry *e = &z->e[z->n];
        if (memchr(h + CENTRAL_LEN, 0, nlen) || nlen == 0 || nlen > ZIP_MAX_NAME)
            return ckpt_error_set(CKPT_EINVAL, "%s: zip: central entry %" PRIu64 " has an empty, too long or NUL name", label, i);
        if (!(e->name = ckpt_strndup((const char *)h + CENTRAL_LEN, nlen))) return CKPT_ENOMEM;
        z->n++;
        e->flags = le16(h + 8);
        e->method = le16(h + 10);
        e->crc32 = le32(h + 16);
        e->comp_size = le32(h + 20);
        e->size = le32(h + 24);
        e->header_offset = le32(h + 42);
        if (le16(h + 34) != 0 && le16(h + 34) != 0xFFFF)
            return ckpt_error_set(CKPT_EINVAL, "%s: zip: entry '%s' is on another disk", label, e->name);
        if (e->flags & 1) return ckpt_error_set(CKPT_EINVAL, "%s: zip: entry '%s' is encrypted", label, e->name);
        int rc = apply_zip64(label, e->name, h + CENTRAL_LEN + nlen, xlen, e, e->size == 0xFFFFFFFFu,
                             e->comp_size == 0xFFFFFFFFu, e->header_offset == 0xFFFFFFFFu);
        if (rc) return rc;
        pos += CENTRAL_LEN + nlen + xlen + clen;
    }
    return 0;
}

/* The local header of e: same name and method, sizes agreeing, data inside
 * the part of the file before the central directory. */
static int check_local(zip_dir *z, const char *label, zip_read_fn rd, void *ctx, zip_entry *e)
{
    uint8_t h[LOCAL_LEN];
    uint64_t end;
    if (!ckpt_add(e->header_offset, LOCAL_LEN, &end) || end > z->cd_offset)
        return ckpt_error_set(CKPT_EINVAL, "%s: zip: entry '%s': local header at %" PRIu64 " is outside the archive", label,
                              e->name, e->header_offset);
    int rc = rd(ctx, h, LOCAL_LEN, e->header_offset);
    if (rc) return rc;
    if (le32(h) != SIG_LOCAL)
        return ckpt_error_set(CKPT_EINVAL, "%s: zip: entry '%s': no local header at %" PRIu64, label, e->name, e->header_offset);
    size_t nlen = le16(h + 26), xlen = le16(h + 28);
    if (le16(h + 8) != e->method)
        return ckpt_error_set(CKPT_EINVAL, "%s: zip: entry '%s': local header says method %u, central directory %u", label,
                              e->name, le16(h + 8), e->method);
    size_t elen = strlen(e->name);
    char *name = nlen == elen ? ckpt_malloc(nlen + 1) : NULL;
    if (nlen == elen && !name) return CKPT_ENOMEM;
    rc = name ? rd(ctx, name, nlen, end) : 0;
    bool same = name && !rc && memcmp(name, e->name, nlen) == 0;
    free(name);
    if (rc) return rc;
    if (!same) return ckpt_error_set(CKPT_EINVAL, "%s: zip: entry '%s': local header names another file", label, e->name);
    if (!(le16(h + 6) & 8)) { /* sizes here, not in a data descriptor */
        uint32_t lc = le32(h + 18), lu = le32(h + 22);
        bool z64 = lc == 0xFFFFFFFFu || lu == 0xFFFFFFFFu;
        if (!z64 && (lc != e->comp_size || lu != e->size))
            return ckpt_error_set(CKPT_EINVAL,
                                  "%s: zip: entry '%s': local header says %" PRIu32 " bytes (%" PRIu32
                                  " stored), central directory %" PRIu64 " (%" PRIu64 ")",
                                  label, e->name, lu, lc, e->size, e->comp_size);
        if (!z64 && le32(h + 14) != e->crc32)
            return ckpt_error_set(CKPT_EINVAL, "%s: zip: entry '%s': local and central CRC-32 differ", label, e->name);
    }
    if (!ckpt_add(end, nlen + xlen, &e->data_offset) || !ckpt_add(e->data_offset, e->comp_size, &end) || end > z->cd_offset)
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: zip: entry '%s': %" PRIu64 " bytes at %" PRIu64 " run past the data part of the archive (%" PRIu64
                              " bytes)",
                              label, e->name, e->comp_size, e->data_offset, z->cd_offset);
    return 0;
}

static int cmp_offset(const void *a, const void *b, void *ctx)
{
    const zip_entry *e = ctx;
    uint64_t x = e[*(const size_t *)a].header_offset, y = e[*(const size_t *)b].header_offset;
    return x < y ? -1 : x > y;
}

static int cmp_name(const void *a, const void *b, void *ctx)
{
    const zip_entry *e = ctx;
    return strcmp(e[*(const size_t *)a].name, e[*(const size_t *)b].name);
}

/* No two entries share bytes (header through data), no name twice. */
static int check_layout(zip_dir *z, const char *label)
{
    size_t *order = ckpt_calloc(z->n + 1, sizeof *order);
    if (!order) return CKPT_ENOMEM;
    for (size_t i = 0; i < z->n; i++) order[i] = i;
    qsort_r(order, z->n, sizeof *order, cmp_offset, z->e);
    int rc = 0;
    for (size_t k = 1; k < z->n && !rc; k++) {
        const zip_entry *a = &z->e[order[k - 1]], *b = &z->e[order[k]];
        if (a->data_offset + a->comp_size > b->header_offset)
            rc = ckpt_error_set(CKPT_EINVAL, "%s: zip: entry '%s' overlaps entry '%s'", label, a->name, b->name);
    }
    for (size_t i = 0; i < z->n; i++) order[i] = i;
    qsort_r(order, z->n, sizeof *order, cmp_name, z->e);
    for (size_t k = 1; k < z->n && !rc; k++)
        if (strcmp(z->e[order[k - 1]].name, z->e[order[k]].name) == 0)
            rc = ckpt_error_set(CKPT_EINVAL, "%s: zip: entry '%s' appears twice", label, z->e[order[k]].name);
    if (rc)
        free(order);
    else
        z->by_name = order;
    return rc;
}

int zipdir_read(zip_dir *z, const char *label, zip_read_fn rd, void *ctx, uint64_t file_size)
{
    memset(z, 0, sizeof *z);
    uint64_t count = 0, cd_limit = 0;
    int rc = read_eocd(z, label, rd, ctx, file_size, &count, &cd_limit);
    uint8_t *cd = NULL;
    if (!rc && !(cd = ckpt_malloc((size_t)z->cd_size + 1))) rc = CKPT_ENOMEM;
    if (!rc) rc = rd(ctx, cd, (size_t)z->cd_size, z->cd_offset);
    if (!rc) rc = parse_central(z, label, cd, count);
    free(cd);
    for (size_t i = 0; !rc && i < z->n; i++) rc = check_local(z, label, rd, ctx, &z->e[i]);
    if (!rc) rc = check_layout(z, label);
    if (rc) zipdir_free(z);
    return rc;
}

void zipdir_free(zip_dir *z)
{
    for (size_t i = 0; i < z->n; i++) free(z->e[i].name);
    free(z->e);
    free(z->by_name);
    memset(z, 0, sizeof *z);
}

const zip_entry *zipdir_find(const zip_dir *z, const char *name)
{
    size_t lo = 0, hi = z->by_name ? z->n : 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const zip_entry *e = &z->e[z->by_name[mid]];
        int c = strcmp(name, e->name);
        if (!c) return e;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

int zipdir_find_stored(const zip_dir *z, const char *label, const char *name, const zip_entry **out)
{
    const zip_entry *e = zipdir_find(z, name);
    *out = e;
    if (!e) return ckpt_error_set(CKPT_ENOTFOUND, "%s: zip: no entry '%s'", label, name);
    if (e->method != 0)
        return ckpt_error_set(CKPT_EINVAL, "%s: zip: entry '%s' is compressed (method %u); torch stores data uncompressed", label,
                              name, e->method);
    if (e->comp_size != e->size)
        return ckpt_error_set(CKPT_EINVAL, "%s: zip: stored entry '%s' says %" PRIu64 " bytes but holds %" PRIu64, label, name,
                              e->size, e->comp_size);
    return 0;
}

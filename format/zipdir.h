/*
 * zipdir.h — the directory of a zip archive whose entries are read in place:
 * the container torch.save has written since torch 1.6.
 *
 * Only what an in-place reader needs, and every rule checked before a caller
 * sees an entry:
 *   - the end-of-central-directory record is the last thing in the file (its
 *     comment runs exactly to the end); zip64 records are followed when the
 *     classic fields overflow (files over 4 GB, over 65535 entries);
 *   - every central entry has a local header at its offset, inside the file,
 *     with the same name and method; sizes in the local header (when not
 *     deferred to a data descriptor) equal the central ones;
 *   - entries do not overlap each other nor the central directory;
 *   - no encryption, no multi-disk archives, names without NUL.
 * Entries may be compressed (zip_entry.method) — zipdir_find_stored() is how
 * a caller insists on stored (method 0) data it will read in place.
 *
 * Why not libzip: reading tensor bytes in place needs each entry's data
 * offset, which libzip 1.7 does not expose (torch's own reader computes it
 * from the local header, as this does), and the fuzz build links format/ and
 * common/ only.
 *
 * Errors are CKPT_EINVAL (CKPT_ELIMIT past the limits below) naming `label`:
 *   "model.bin: zip: entry 'archive/data/0' overlaps entry 'archive/data/1'".
 */
#ifndef CKPT_FORMAT_ZIPDIR_H
#define CKPT_FORMAT_ZIPDIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ZIP_MAX_ENTRIES 1000000
#define ZIP_MAX_CD_BYTES (256u << 20) /* central directory */
#define ZIP_MAX_NAME 4096

typedef struct {
    char *name;
    uint16_t method; /* 0 stored, 8 deflate, ... */
    uint16_t flags;
    uint32_t crc32;
    uint64_t comp_size, size;
    uint64_t header_offset; /* local header */
    uint64_t data_offset;   /* first byte of the (stored or compressed) data */
} zip_entry;

typedef struct {
    size_t n;
    zip_entry *e;  /* in central-directory order */
    size_t *by_name; /* indexes into e, sorted by name */
    uint64_t cd_offset, cd_size;
} zip_dir;

/* A source of bytes: pread-like, returns 0 or a negative ckpt_code (with the
 * error set) when fewer than len bytes are at off. */
typedef int (*zip_read_fn)(void *ctx, void *buf, size_t len, uint64_t off);

/* Reads and validates the directory of an archive of file_size bytes. */
int zipdir_read(zip_dir *z, const char *label, zip_read_fn rd, void *ctx, uint64_t file_size);
void zipdir_free(zip_dir *z);
/* True when the file starts like a zip (a local header). */
bool zipdir_sniff(const uint8_t *head, size_t len);
const zip_entry *zipdir_find(const zip_dir *z, const char *name);
/* The entry, required to exist and to be stored (method 0, sizes equal):
 * CKPT_ENOTFOUND / CKPT_EINVAL with a message naming it otherwise. */
int zipdir_find_stored(const zip_dir *z, const char *label, const char *name, const zip_entry **out);
/* CRC-32 (zip's polynomial, zlib's crc32) of buf, continuing from crc (0 to start). */
uint32_t zipdir_crc32(uint32_t crc, const void *buf, size_t len);

#endif

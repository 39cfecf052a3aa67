/*
 * archive.h — tar streams through libarchive: checkpoints in (.tar, .tar.gz,
 * .tar.zst) and out (tar, tar.zst to a file or standard output).
 *
 * Extraction refuses entries that would land outside the staging folder
 * (absolute paths, "..", links), keeps only regular files and folders, and
 * limits the entry count and total size.
 */
#ifndef CKPT_FORMAT_ARCHIVE_H
#define CKPT_FORMAT_ARCHIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ARCHIVE_MAX_ENTRIES 100000
#define ARCHIVE_MAX_BYTES (4ULL << 40)
#define ARCHIVE_MAX_RATIO 1000 /* unpacked bytes per byte of a compressed archive */

/* Extracts archive_path into a new folder "<tmp_base>.tmp-XXXXXX"; *out is
 * malloc'd. An archive whose entries all sit in one top-level folder (as
 * `tar cf model.tar llama/` makes) gives that folder's contents. */
int ckpt_archive_extract(const char *archive_path, const char *tmp_base, char **out);
/* Writes the files under dir as a tar (zstd-compressed when zstd) to out
 * ("-" for standard output); names are relative to dir, sorted. */
int ckpt_archive_write_tree(const char *dir, const char *out, bool zstd);

/* Streams a tar (zstd-compressed when zstd) of n regular files to fd, their
 * bytes read through rd(ctx, i, off, buf, len) (0 or an error code): nothing
 * is staged on disk. Names must be relative and free of "..". On an error
 * the stream stops at that entry and the error is returned: the caller must
 * make the failure visible (no tar end is written after a failure, but what
 * came before it was).
 *
 * Three threads overlap: rd is called by a reader thread of its own, block
 * after block in order (1 MiB, each entry's blocks from offset 0), up to 8
 * blocks ahead of the calling thread, which feeds them to libarchive (and
 * zstd, whose workers compress); a writer thread writes the result to fd.
 * rd's error and its message (the reader's) come back as this call's. Both
 * threads are joined before the call returns, on every path: rd is never
 * called after it. The bytes are those a single thread would write. */
typedef struct {
    const char *name;
    uint64_t size;
} ckpt_archive_entry;
typedef int (*ckpt_archive_read_fn)(void *ctx, size_t i, uint64_t off, void *buf, size_t len);
int ckpt_archive_write_entries(int fd, bool zstd, const ckpt_archive_entry *e, size_t n, int64_t mtime,
                               ckpt_archive_read_fn rd, void *ctx);

#endif

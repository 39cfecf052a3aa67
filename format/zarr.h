/*
 * zarr.h — read zarr v2 arrays as TensorStore's zarr driver writes them
 * (docs/easydel.md), and the EasyDeL / eformer TensorStore checkpoint built
 * from them.
 *
 * An array is a folder holding `.zarray` (JSON: zarr_format 2, shape, chunks,
 * dtype, compressor, fill_value, order, filters, dimension_separator) and one
 * file per chunk, named by the chunk's grid index joined with the separator
 * ("0.1" or "0/1"; "0" for a scalar). Every field is validated: dtype is a
 * little-endian numpy type string or TensorStore's "bfloat16"/"float8_*";
 * compressor null or zstd; order "C"; filters null; chunks positive and
 * bounded. A missing chunk file reads as the fill value (null: zeros).
 *
 *   zarr_array a;
 *   if (zarr_open(&a, root_fd, "model/model/embed_tokens/embedding", "label") < 0) ...
 *   zarr_read(&a, sink, ctx, &stats);   // every chunk, streamed, in any order
 *   zarr_close(&a);
 *
 * Reading never holds a whole chunk: each chunk file is streamed through
 * libzstd in ZARR_IO_BYTES pieces and its bytes are handed to the sink with
 * their offset in the array's C-order bytes; a chunk must decompress to
 * exactly its size (ZSTD_getFrameContentSize, when the frame records it, is
 * checked first; then output beyond the size stops decompression at once —
 * a zstd bomb costs nothing). Paths are opened component by component with
 * O_NOFOLLOW under the checkpoint's folder: no "..", no absolute paths, no
 * symbolic links, so nothing is read outside it.
 *
 * Errors name the array: "<label>: .zarray: 'order' is \"F\", only \"C\" is read".
 */
#ifndef CKPT_FORMAT_ZARR_H
#define CKPT_FORMAT_ZARR_H

#include "format/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ZARR_MAX_ZARRAY (1u << 20)            /* bytes of a .zarray */
#define ZARR_MAX_CHUNKS (1ull << 24)          /* chunks of one array */
#define ZARR_MAX_DIM (1ull << 40)             /* elements along one dimension */
#define ZARR_MAX_CHUNK_BYTES (1ull << 36)     /* raw bytes of one chunk */
#define ZARR_MAX_ARRAY_BYTES (1ull << 46)     /* raw bytes of one array (64 TiB) */
#define ZARR_IO_BYTES (1u << 20)              /* read and write piece */

typedef struct {
    char *label;   /* the array's name in messages */
    int dirfd;     /* the array's folder, or -1 (parsed from memory) */
    ckpt_dtype dtype;
    char dtype_str[24]; /* as .zarray writes it */
    unsigned esize;     /* bytes per element */
    int ndim;
    uint64_t shape[CKPT_MAX_RANK];
    uint64_t chunks[CKPT_MAX_RANK];
    uint64_t grid[CKPT_MAX_RANK]; /* chunks along each dimension */
    uint64_t nchunks;
    uint64_t chunk_nbytes; /* raw bytes of one (full, edge chunks too) chunk */
    uint64_t nbytes;       /* raw bytes of the array */
    bool zstd;             /* else no compressor */
    int zstd_level;        /* as recorded (informational) */
    char sep;              /* '.' or '/' */
    uint8_t fill[8];       /* one element of the fill value */
} zarr_array;

/* Parses and validates .zarray text; label names the array in errors. The
 * array has no folder (dirfd -1). The fuzzer's entry point. */
int zarr_parse_meta(zarr_array *a, const char *label, const char *json, size_t len);
/* Opens the array folder `rel` under root_fd (walked without following
 * links; rel must be a safe relative path) and parses its .zarray. */
int zarr_open(zarr_array *a, int root_fd, const char *rel, const char *label);
void zarr_close(zarr_array *a);

/* "1.0.3" or "1/0/3" for grid index idx. buf of len; false when too small. */
bool zarr_chunk_key(const zarr_array *a, const uint64_t *idx, char *buf, size_t len);

/* Receives raw array bytes: off is the offset in the array's C-order bytes. */
typedef int (*zarr_sink)(void *ctx, uint64_t off, const void *buf, size_t len);

typedef struct {
    uint64_t chunks_present; /* chunk files found */
    uint64_t stored_bytes;   /* their total size */
} zarr_stats;

/* Sizes of the chunk files present (no decompression). */
int zarr_stat(const zarr_array *a, zarr_stats *st);
/* Streams every byte of the array to sink (each byte exactly once; missing
 * chunks as the fill value), chunk by chunk, with bounded memory. st may be NULL. */
int zarr_read(const zarr_array *a, zarr_sink sink, void *ctx, zarr_stats *st);

/* One chunk decoded in order, into the caller's buffers: what zarr_read
 * does for every chunk, for callers that want a chunk's bytes where they
 * are needed (transform/easydel_import.c decodes arrays straight into the
 * converter's memory). The checks are zarr_read's: the file's size, the
 * frame's recorded content size before a byte is decoded, no output past
 * the chunk (zarr_decoder_end looks one byte further), no frame ending
 * short or truncated. A decoder holds a zstd context and a ZARR_IO_BYTES
 * input buffer (plus zstd's window), whatever the chunk's size. A read of
 * the whole chunk at once is decoded straight into buf, with no copy out
 * of zstd's window (30% less CPU time measured on bf16 weights); buf must
 * then stay as it is until zarr_decoder_end.
 *
 *   zarr_decoder *d = zarr_decoder_new();
 *   zarr_decoder_start(d, &a, idx, NULL);      // chunk idx (a missing one reads as the fill value)
 *   zarr_decoder_read(d, buf, n); ...          // its next n raw bytes (C order, padded to the chunk shape)
 *   zarr_decoder_end(d);                       // all chunk_nbytes read, and nothing follows
 *   zarr_decoder_free(d);
 */
typedef struct zarr_decoder zarr_decoder;
zarr_decoder *zarr_decoder_new(void); /* NULL: out of memory (error set) */
void zarr_decoder_free(zarr_decoder *d);
/* st (may be NULL) counts the chunk file when present. */
int zarr_decoder_start(zarr_decoder *d, const zarr_array *a, const uint64_t *idx, zarr_stats *st);
int zarr_decoder_read(zarr_decoder *d, void *buf, size_t len);
int zarr_decoder_end(zarr_decoder *d);

/* True when rel is a relative path of plain components (no "", ".", "..",
 * leading '/', '\\', NUL or control characters). */
bool zarr_rel_path_safe(const char *rel);
/* Opens rel under root_fd component by component with O_NOFOLLOW; a
 * directory when want_dir. Returns the fd or a negative code (error set). */
int zarr_open_beneath(int root_fd, const char *rel, bool want_dir, const char *label);

#endif

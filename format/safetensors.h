/*
 * safetensors.h — read, validate and write safetensors files (docs/safetensors.md).
 *
 * Reading: st_open() validates every check of docs/safetensors.md before returning, so a
 * caller never sees an unchecked byte. Errors are CKPT_EINVAL (or CKPT_ELIMIT
 * for ValidationOverflow / HeaderTooLarge) with a message of the form
 *   "<path>: <ReferenceName>: <detail naming the tensor>"
 * e.g. "model-00002-of-00004.safetensors: InvalidOffset: tensor 'x' begins at 1024, expected 512".
 * Reference names used: HeaderTooSmall, HeaderTooLarge, InvalidHeaderLength,
 * InvalidHeader, InvalidHeaderDeserialization, InvalidOffset,
 * ValidationOverflow, MisalignedSlice, TensorInvalidInfo,
 * MetadataIncompleteBuffer, DuplicateTensor, plus LimitExceeded for our own
 * limits (tensor count, name length, rank).
 *
 * The reader uses pread, not mmap: a header is at most 100 MB and read once,
 * and tensor bytes are read by callers at offsets they choose; pread turns a
 * file truncated under us into an error where mmap would raise SIGBUS.
 *
 * Writing: st_layout collects tensors (name, dtype, shape) and metadata, then
 * st_layout_finish() orders them as the reference writer does (dtype enum
 * descending, then name ascending), assigns data_offsets, and renders the
 * header: 8-byte little-endian N, compact JSON with "__metadata__" first,
 * padded with spaces so 8 + N is a multiple of 8. The caller then writes
 * each tensor's bytes at tensors[i].offset (absolute in the file), usually
 * through ckpt_atomic_file, or uses st_write_file() with a fill callback.
 */
#ifndef CKPT_FORMAT_SAFETENSORS_H
#define CKPT_FORMAT_SAFETENSORS_H

#include "format/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define ST_MAX_HEADER 100000000ULL /* docs/safetensors.md: N above this is HeaderTooLarge */
#define ST_MAX_TENSORS 1000000     /* tensors in one file */
#define ST_MAX_NAME 4096           /* bytes in a tensor name */
#define ST_MAX_META 4096           /* __metadata__ entries */

typedef struct {
    char *name;
    ckpt_dtype dtype;
    int ndim;
    uint64_t shape[CKPT_MAX_RANK];
    uint64_t begin, end; /* data_offsets, relative to the data section */
    uint64_t offset;     /* absolute byte offset in the file: 8 + N + begin */
    uint64_t nbytes;     /* end - begin */
    /* Set only by the torch reader (torch.h) for a permuted view (a transposed
     * lm_head): the bytes at offset hold, row-major, the tensor with its axes
     * in stored order: stored_shape[a] = shape[k] where view_axes[k] == a.
     * Only checkpoints opened with ckpt_checkpoint_open_views hold these. */
    bool view;
    int8_t view_axes[CKPT_MAX_RANK];
    uint64_t stored_shape[CKPT_MAX_RANK];
} st_tensor;

typedef struct {
    char *path;
    int fd; /* -1 when parsed from memory */
    uint64_t file_size;
    uint64_t header_len; /* N */
    uint64_t data_start; /* 8 + N */
    size_t ntensors;
    st_tensor *tensors; /* in data_offsets order */
    size_t *by_name;    /* indexes into tensors, sorted by name (for st_find) */
    size_t nmeta;
    char **meta_keys, **meta_vals; /* __metadata__, in file order */
    bool from_torch; /* a torch.save file read by format/torch.h: no header, tensors are byte ranges of it */
} st_file;

/* Opens and validates path. On failure *f is left closed. */
int st_open(st_file *f, const char *path);
/* Validates a header from memory: buf holds the first len bytes of a file of
 * file_size bytes (len >= 8 + N is required; the data section need not be
 * present). `name` is used in messages. Used by st_open and the fuzzer. */
int st_parse(st_file *f, const char *name, const uint8_t *buf, size_t len, uint64_t file_size);
void st_close(st_file *f);
const st_tensor *st_find(const st_file *f, const char *name);
/* Value of a __metadata__ key or NULL. */
const char *st_meta_get(const st_file *f, const char *key);
/* Reads a tensor's bytes (whole tensor) into buf of t->nbytes. */
int st_read_tensor(const st_file *f, const st_tensor *t, void *buf);

/* ---- writing ---- */

typedef struct {
    char *name;
    ckpt_dtype dtype;
    int ndim;
    uint64_t shape[CKPT_MAX_RANK];
    uint64_t nbytes;
    uint64_t offset; /* absolute offset in the file, set by st_layout_finish */
    size_t user;     /* caller's index, carried through the sort */
} st_out_tensor;

typedef struct {
    st_out_tensor *tensors;
    size_t ntensors, cap;
    size_t nmeta, meta_cap;
    char **meta_keys, **meta_vals; /* written sorted by key */
    uint8_t *header;   /* 8-byte N + JSON + padding, set by finish */
    size_t header_len; /* 8 + N */
    uint64_t file_size;
    bool finished;
} st_layout;

void st_layout_init(st_layout *l);
int st_layout_add(st_layout *l, const char *name, ckpt_dtype dt, int ndim, const uint64_t *shape,
                  size_t user);
/* Sets (or replaces) one __metadata__ entry. */
int st_layout_set_meta(st_layout *l, const char *key, const char *val);
/* Sorts, assigns offsets, renders the header. Rejects duplicate names. */
int st_layout_finish(st_layout *l);
void st_layout_free(st_layout *l);

/* Writes a whole file atomically: header, then for each tensor (in file
 * order) fill(ctx, tensor, fd) which must write tensor->nbytes bytes at
 * tensor->offset of fd. */
typedef int (*st_fill_fn)(void *ctx, const st_out_tensor *t, int fd, const char *path);
int st_write_file(const char *path, const st_layout *l, st_fill_fn fill, void *ctx);

/* Writes s to out as a JSON string literal. ascii_only false: serde_json's
 * escaping, as in safetensors headers (\" \\ \b \f \n \r \t, other control
 * characters as lowercase \u00xx, everything else raw UTF-8, '/' unescaped).
 * ascii_only true: Python json.dumps' default (ensure_ascii), as in index
 * files: additionally DEL and every non-ASCII character as lowercase \uxxxx,
 * surrogate pairs above U+FFFF. CKPT_EINVAL when s is not valid UTF-8.
 * (Added beside the header's original API for ckpt_index_render.) */
int st_json_put_string(FILE *out, const char *s, bool ascii_only);

#endif

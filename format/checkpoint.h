/*
 * checkpoint.h — a Hugging Face checkpoint: one safetensors file, or shards
 * with a "<prefix>.safetensors.index.json" (docs/safetensors.md, "Sharded checkpoints").
 *
 * ckpt_checkpoint_open(path) accepts:
 *   - a .safetensors file,
 *   - an index .json file,
 *   - a directory holding model.safetensors.index.json or model.safetensors
 *     (or, with ckpt_checkpoint_open_prefix, "<prefix>.safetensors[.index.json]",
 *     e.g. prefix "optimizer" in a training state),
 *   - torch.save files in their place (format/torch.h): a pytorch_model.bin,
 *     .pt or .pth, a pytorch_model.bin.index.json with its .bin shards, or a
 *     directory holding those when it has no model.safetensors[.index.json].
 *     Their st_files have from_torch set; a tied tensor's second name is in
 *     the file's metadata, which the index check accepts, and a torch
 *     index's total_size is not checked (transformers counted tied bytes
 *     differently over versions).
 * Every shard is validated; the index is checked against the files: every
 * mapped tensor exists in its file, no file holds an unlisted tensor, no
 * tensor is in two files, total_size equals the sum of tensor bytes, and
 * shard names are safe (no "..", no leading '/', no "://", no '\\' or NUL).
 *
 * Sharded writing: ckpt_shard_assign() splits tensors (in the order given)
 * into shards the way Hugging Face does (a new shard starts when the next
 * tensor would push the current one past max_shard_size; a tensor larger than
 * the limit sits alone), and ckpt_index_render() writes the index JSON.
 */
#ifndef CKPT_FORMAT_CHECKPOINT_H
#define CKPT_FORMAT_CHECKPOINT_H

#include "format/safetensors.h"

#define CKPT_INDEX_MAX_BYTES (256u << 20) /* largest index.json we read */
#define CKPT_MAX_SHARDS 100000

typedef struct {
    const st_tensor *t;
    size_t file; /* index into files */
} ckpt_tensor_ref;

typedef struct {
    char *path;       /* what was opened */
    char *dir;        /* folder holding the shard files */
    char *index_path; /* NULL when not sharded */
    size_t nfiles;
    st_file *files;
    size_t ntensors;
    ckpt_tensor_ref *tensors; /* sorted by name */
    uint64_t total_size;      /* sum of tensor bytes */
    bool views;               /* opened with ckpt_checkpoint_open_views */
} ckpt_checkpoint;

int ckpt_checkpoint_open(ckpt_checkpoint *c, const char *path);
/* The same, also accepting torch tensors that are permuted views of their
 * bytes (st_tensor.view: a transposed lm_head), for callers that plan their
 * copy (convert, through the plan's axis maps) or only list them (inspect).
 * ckpt_checkpoint_open refuses them, naming the tensor: readers of raw bytes
 * (LoRA merge, states) would misread them. */
int ckpt_checkpoint_open_views(ckpt_checkpoint *c, const char *path);
int ckpt_checkpoint_open_prefix(ckpt_checkpoint *c, const char *dir, const char *prefix);
void ckpt_checkpoint_close(ckpt_checkpoint *c);
/* A checkpoint made of files parsed already (st_parse of stored headers):
 * takes ownership of files[0..n) and indexes their tensors; `label` stands in
 * for the folder in messages. */
int ckpt_checkpoint_from_files(ckpt_checkpoint *c, const char *label, st_file *files, size_t nfiles);
/* The same accepting permuted torch views, as ckpt_checkpoint_open_views. */
int ckpt_checkpoint_from_files_views(ckpt_checkpoint *c, const char *label, st_file *files, size_t nfiles);
/* Finds a tensor by name (binary search) or NULL. */
const ckpt_tensor_ref *ckpt_checkpoint_find(const ckpt_checkpoint *c, const char *name);

/* A parsed index file (before it is checked against the shards). */
typedef struct {
    uint64_t total_size;
    bool has_total_size;
    size_t nentries;
    char **names; /* tensor names */
    char **files; /* shard file for each name */
    size_t nshards;
    char **shards; /* distinct shard names, in first-seen order */
} ckpt_index;

/* Parses index JSON text; `what` names it in errors. Validates shard names. */
int ckpt_index_parse(ckpt_index *ix, const char *what, const char *json, size_t len);
void ckpt_index_free(ckpt_index *ix);
/* True when a shard name from an index is safe to open under its folder. */
bool ckpt_shard_name_safe(const char *name);

/* Splits sizes[0..n) into shards: shard_of[i] gets the shard number (0-based),
 * *nshards the count. max_shard_size 0 means one shard; n == 0 gives one
 * (empty) shard, as save_pretrained writes one file. */
int ckpt_shard_assign(const uint64_t *sizes, size_t n, uint64_t max_shard_size, size_t *shard_of,
                      size_t *nshards);
/* "model-00001-of-00005.safetensors" (or "model.safetensors" when n == 1). malloc'd.
 * i is 0-based, as ckpt_shard_assign numbers shards; the name counts from 1.
 * NULL (error set) when i >= n. */
char *ckpt_shard_name(const char *prefix, size_t i, size_t n);
/* Renders {"metadata":{"total_size":N},"weight_map":{...sorted...}} as
 * Hugging Face writes it (indent 2, keys sorted, trailing newline). malloc'd. */
char *ckpt_index_render(uint64_t total_size, size_t n, char *const *names, char *const *files);

#endif

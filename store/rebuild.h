/*
 * rebuild.h — the plan of one stored safetensors file: its stored header,
 * parsed and checked, and for each tensor the parts that rebuild its bytes
 * (a whole blob, or a recipe's parts over blobs and zeros).
 *
 * Pull (materialize.c), HTTP serving, verify and state export all rebuild
 * files through this one function, and the fuzzer (tests/fuzz/fuzz_rebuild.c)
 * runs it over hostile headers, so it trusts nothing it reads: ranks above
 * PLAN_MAX_DIM, shapes that do not match a tensor's bytes and malformed
 * recipes are errors naming the file and tensor. It touches no catalog and
 * no file: the caller says where blobs live and what the catalog records.
 */
#ifndef CKPT_STORE_REBUILD_H
#define CKPT_STORE_REBUILD_H

#include "plan/executor.h"

#include <jansson.h>

typedef struct {
    exec_plan *exec;       /* sources and source paths are appended here */
    plan_tensor *tensors;  /* room for every tensor of the file, from *ntensors on */
    size_t *ntensors;
    /* The blob file of sha256 (malloc'd, NULL when out of memory). */
    char *(*blob_path)(void *ctx, const char *sha256);
    /* What the catalog records for tensor `name` of stored file `path`:
     * *blob (a sha256) or *recipe (JSON parts); strings valid until the next call. */
    int (*lookup)(void *ctx, const char *path, const char *name, const char **blob, const char **recipe);
    void *ctx;
    /* Optional (NULL: a linear search): a JSON object from each path in
     * exec->src_paths to its index, kept up to date here, so a file of many
     * tensors, each its own blob, is not planned in quadratic time. */
    json_t *path_index;
} rebuild_ctx;

/* Plans stored file `path` (header bytes, total size) as ef, written as out_rel. */
int rebuild_plan_file(const rebuild_ctx *rb, const char *path, const char *out_rel, const uint8_t *header,
                      size_t header_len, uint64_t size, exec_file *ef);

#endif

/*
 * store_info.h — what the store holds, as data and as JSON: the one
 * implementation behind `ckpt ls` / `ckpt show` (--json) and the daemon's
 * GET /v1/checkpoints[/{ref}], and the lookups the Hub read API needs.
 *
 * The JSON shapes (printed as they are by the CLI and the HTTP API):
 *
 *   a checkpoint (store_ckpt_json):
 *     {"id": 7, "ref": "org/name@main:neuron-tp2", "repo": "org/name",
 *      "revision": "main", "commit": "<40 hex>", "layout": "neuron-tp2" ("" for an original),
 *      "source": "org/name@main" (the original a layout was converted from; null when none or removed),
 *      "lossy": false, "total_size": 123456, "created_at": 1700000000 (Unix seconds),
 *      "last_verify": {"at": 1700000100.5, "ok": true, "error": "..." (when not ok)}
 *        (only once `ckpt verify` or a verify job rebuilt it; store_verify.h)}
 *   with files (ckpt show, GET /v1/checkpoints/{ref}) it adds
 *     "files": [{"path": "model.safetensors", "size": 1234, "sha256": "<64 hex>",
 *                "safetensors": true, "tensors": 12, "recipes": 0}, ...]   (path order)
 *   the list (ckpt ls, GET /v1/checkpoints[?repo=R]):
 *     {"checkpoints": [checkpoint, ...]}   ordered by repo, commit, layout
 *
 * Every function here returns an error (never an empty answer) when the
 * catalog cannot be read; "not found" is CKPT_ENOTFOUND.
 */
#ifndef CKPT_STORE_STORE_INFO_H
#define CKPT_STORE_STORE_INFO_H

#include "store/store.h"

#include <jansson.h>
#include <stdbool.h>

/* The checkpoints (of repo, or all when repo is NULL), ordered by repo, commit, layout. */
int store_list(ckpt_store *s, const char *repo, store_ckpt **out, size_t *n);
void store_list_free(store_ckpt *v, size_t n);
/* *exists: some checkpoint of repo is stored. */
int store_repo_exists(ckpt_store *s, const char *repo, bool *exists);
/* The names (branches, tags) of repo in name order: each the checkpoint it
 * points at, with revision set to the name (store_list_free them). */
int store_repo_refs(ckpt_store *s, const char *repo, store_ckpt **out, size_t *n);
/* The converted layouts of repo, newest first (store_list_free them). */
int store_repo_layouts(ckpt_store *s, const char *repo, store_ckpt **out, size_t *n);

/* A file of a checkpoint with its tensor counts. */
typedef struct {
    char *path;
    uint64_t size;
    char sha256[65];
    bool safetensors;
    uint64_t tensors, recipes;
} store_file_info;

int store_file_infos(ckpt_store *s, int64_t id, store_file_info **out, size_t *n);
void store_file_infos_free(store_file_info *v, size_t n);

/* The checkpoint's JSON (above); with_files adds "files". */
int store_ckpt_json(ckpt_store *s, const store_ckpt *c, bool with_files, json_t **out);
/* {"checkpoints": [...]} of repo (NULL: all). */
int store_list_json(ckpt_store *s, const char *repo, json_t **out);

#endif

/*
 * easydel.h — an EasyDeL checkpoint as eformer's Checkpointer writes it
 * (EasyDeLState.save_state; docs/easydel.md):
 *
 *   DIR/tensorstore_index.json   {"format": "tensorstore", "version": V,
 *                                 "prefixes": {"model": [{"path", "shape", "dtype"}, ...], "tx": [...]}}
 *                                (or version 1: {"format": "tensorstore", "arrays": [...]})
 *   DIR/model/<key path>/        one zarr v2 array per leaf (format/zarr.h), the
 *   DIR/tx/<key path>/           leaf's dotted key path as folders
 *   DIR/metadata.json            {"step", "timestamp", "is_temporary", ...}
 *   DIR/config.json, *_structure.json, checkpoint_metadata.json
 *
 * easydel_open() validates the index (format, prefixes, each entry's path
 * safe and beneath DIR, under its prefix's folder, no two entries alike,
 * shape and dtype equal to the array's .zarray) and opens every array.
 * A leaf's key is its path with '/' read as '.', the prefix dropped
 * ("model/model/layers/0/self_attn/q_proj/kernel" is
 * "model.layers.0.self_attn.q_proj.kernel" of prefix "model").
 */
#ifndef CKPT_FORMAT_EASYDEL_H
#define CKPT_FORMAT_EASYDEL_H

#include "format/zarr.h"

#include <stdbool.h>
#include <stdint.h>

#define EASYDEL_INDEX_FILE "tensorstore_index.json"
#define EASYDEL_INDEX_MAX_BYTES (64u << 20)
#define EASYDEL_META_MAX_BYTES (1u << 20)
#define EASYDEL_MAX_ARRAYS 1000000
#define EASYDEL_MAX_TOTAL_BYTES (1ull << 52) /* raw bytes of a whole save */

typedef struct {
    char *prefix; /* "model", "tx", or "" (a version 1 index) */
    char *path;   /* relative to the checkpoint folder */
    char *key;    /* dotted, prefix dropped */
    zarr_array z;
} easydel_array;

typedef struct {
    char *dir;
    int dirfd;
    char *version; /* the index's "version", or NULL */
    bool has_step;
    int64_t step;
    uint64_t total_nbytes; /* raw bytes of every array */
    size_t narrays;
    easydel_array *arrays; /* in index order, prefixes in the index's order */
} easydel_ckpt;

/* True when dir holds tensorstore_index.json (an EasyDeL / eformer TensorStore save). */
bool easydel_is_checkpoint(const char *dir);

/* The older save (EasyDeLState.save_state before the TensorStore
 * Checkpointer): the parameters as a safetensors file named
 * easydel-model.parameters, keys joined with ".", or shards listed by
 * easydel-model.parameters.safetensors.index.json; the optimizer leaves as
 * "param_{i}" in easydel-optstate.parameters with a pickled tree definition
 * in easydel-optstate.structure. */
#define EASYDEL_LEGACY_MODEL "easydel-model.parameters"
#define EASYDEL_LEGACY_INDEX "easydel-model.parameters.safetensors.index.json"
/* The index, else the single file, of such a save in dir (malloc'd), or NULL
 * when dir holds neither. */
char *easydel_legacy_weights(const char *dir);
bool easydel_is_legacy(const char *dir);
int easydel_open(easydel_ckpt *c, const char *dir);
void easydel_close(easydel_ckpt *c);
/* The array with this prefix and key, or NULL. */
const easydel_array *easydel_find(const easydel_ckpt *c, const char *prefix, const char *key);

/* An optimizer leaf's parameter and slot, by key path. easydel_param_suffix:
 * where the longest '.'-bounded proper suffix of key that is_param accepts
 * starts ("0.mu.model.layers.0.mlp.up_proj.kernel" -> the offset of
 * "model..."), or (size_t)-1. easydel_slot_before: the key component just
 * before offset at ("mu"); false when there is none or it does not fit. */
size_t easydel_param_suffix(const char *key, bool (*is_param)(void *ctx, const char *name), void *ctx);
bool easydel_slot_before(const char *key, size_t at, char *slot, size_t slot_len);

/* The dtype name of an index entry as JAX prints it ("bfloat16", "float32"). */
const char *easydel_jax_dtype_name(ckpt_dtype dt);

#endif

/*
 * store_lora.h — merge (or unmerge) a LoRA adapter into a stored checkpoint,
 * inside the store: the `merge-lora` and `unmerge-lora` jobs.
 *
 * The result is an original checkpoint of a repo of its own (a fine-tune is
 * another model, as on the Hub), with the base's revision name:
 *
 *   ORG/NAME-lora-<id>@REV      (unmerge: ORG/NAME-unlora-<id>@REV)
 *
 * where <id> is the first 12 hex digits of the adapter's identity: the
 * sha256 of its files' sha256, the scale and the direction. Its commit is a
 * content id (store_content_id), so importing into that repo the folder
 * `ckpt merge-lora` writes offline finds the same checkpoint; `ckpt show`
 * names the base as its source. Being an original, it converts like any
 * other (`ckpt convert ORG/NAME-lora-<id>@main --layout neuron --tp 8`), and
 * ORG/NAME itself still resolves to the base.
 *
 * Only the merged weights cost new bytes: each is computed straight into a
 * blob (lora_merge_targets, a few batches of weights at a time, so the
 * number of open files stays bounded) and every other tensor, the index and
 * the side files are the base's blobs. The safetensors headers are rendered
 * as merge-lora renders them, so `ckpt pull` gives the offline result byte
 * for byte. Running the job again finds the checkpoint (existed) without
 * computing anything.
 *
 * The adapter is a folder (absolute path) or a stored ref (e.g. an import of
 * the adapter folder), materialized into the store's tmp/ for the run.
 */
#ifndef CKPT_STORE_STORE_LORA_H
#define CKPT_STORE_STORE_LORA_H

#include "store/store.h"

#include <stdbool.h>
#include <stdint.h>

#define STORE_LORA_BATCH 32 /* merged weights (blob files) in flight at once */

typedef struct {
    double scale; /* 0: 1 */
    bool unmerge;
    int threads; /* 0: 2 */
    bool quiet;
} store_lora_opts;

typedef struct {
    store_ckpt ckpt; /* the merged checkpoint */
    bool existed;
    size_t modules;      /* weights merged (0 when it existed) */
    uint64_t new_bytes;  /* bytes of the merged weights' blobs */
    char adapter_id[65]; /* the adapter's identity (see above) */
} store_lora_result;

int store_lora_merge(ckpt_store *s, const char *base_ref, const char *adapter,
                     const store_lora_opts *o, store_lora_result *res);
void store_lora_result_free(store_lora_result *res);

#endif

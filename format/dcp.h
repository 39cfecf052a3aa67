/*
 * dcp.h — PyTorch Distributed Checkpoint (torch.distributed.checkpoint, "DCP")
 * folders read in place, without torch and without running their pickle
 * (docs/torch.md, "PyTorch Distributed Checkpoint").
 *
 * What torch's FileSystemWriter writes (torch/distributed/checkpoint/
 * filesystem.py, metadata.py, default_planner.py), and what is read here:
 *   - ".metadata": pickle.dump of a Metadata dataclass. Its state holds
 *     state_dict_metadata {fqn: TensorStorageMetadata(properties, size,
 *     chunks: [ChunkStorageMetadata(offsets, sizes)]) | BytesStorageMetadata()}
 *     and storage_data {MetadataIndex(fqn, offset, index): _StorageInfo(
 *     relative_path, offset, length[, transform_descriptors])}; planner_data,
 *     storage_meta and version are not needed. The pickle runs on the
 *     restricted machine (pickle.h) with an allow-list of exactly those
 *     classes (records: NEWOBJ then BUILD of their state, never
 *     constructed), TensorProperties under both module names torch has used,
 *     the dtypes, torch.Size, torch.serialization._get_layout and
 *     builtins.getattr / the memory-format enum (how TensorProperties'
 *     __getstate__ and Python 3.11+ pickle its fields; recorded, never
 *     called), pathlib paths (StorageMeta.checkpoint_id). Anything else is
 *     refused naming the global.
 *   - "__<rank>_<n>.distcp": for each item, at _StorageInfo.offset and
 *     .length: a tensor chunk is a whole torch.save(chunk) (a zip; its
 *     offsets count from the item's start), read by torch.h's
 *     torch_parse_tensor; a bytes item is raw bytes (a torch.save of a
 *     Python value), only listed.
 * Matches the format of torch 2.1 through the newest release: the same
 * files; over those releases Metadata gained storage_meta and version,
 * _StorageInfo transform_descriptors, and TensorProperties moved from
 * torch.distributed._shard.sharded_tensor.metadata into metadata.py — both
 * forms are read.
 *
 * Checked before anything is trusted: every tensor's chunks lie inside its
 * shape, do not overlap, and cover it exactly (as default_planner.py's
 * _validate_global_plan checks at save time); each chunk has its
 * _StorageInfo; relative_path is a plain file name (no '/', no "..", not
 * hidden); a range lies inside its file; the embedded tensor has the
 * metadata's dtype and the chunk's sizes (contiguous, or a permutation of a
 * contiguous block, which consolidation copies through its plan); transform
 * descriptors (compressed items) and the safetensors-serialised .distcp of
 * newer torch are refused. A missing .metadata or .distcp is an error naming
 * it. Every count is bounded (DCP_MAX_*).
 */
#ifndef CKPT_FORMAT_DCP_H
#define CKPT_FORMAT_DCP_H

#include "format/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DCP_METADATA_FILE ".metadata"
#define DCP_MAX_METADATA_BYTES (1u << 30)
#define DCP_MAX_ENTRIES (1u << 20)           /* state dict entries */
#define DCP_MAX_CHUNKS (1u << 22)            /* chunks of all tensors */
#define DCP_MAX_CHUNKS_PER_TENSOR (1u << 14) /* the overlap check is pairwise */
#define DCP_MAX_FILES (1u << 16)

typedef struct {
    uint64_t offsets[CKPT_MAX_RANK], sizes[CKPT_MAX_RANK];
    size_t file;               /* index into dcp_ckpt.files */
    uint64_t item_off, item_len; /* the _StorageInfo: the torch.save in the file */
    uint64_t data_off, nbytes; /* the chunk's bytes, absolute in the file (set by dcp_open) */
    /* A chunk saved as a permuted view of its bytes (a transposed shard: torch
     * saves a tensor whose storage is exactly its size without cloning it):
     * the bytes hold, row-major, the chunk with its axes in stored order,
     * stored[a] = sizes[k] where axes[k] == a (as st_tensor.view). */
    bool view;
    int8_t axes[CKPT_MAX_RANK];
    uint64_t stored[CKPT_MAX_RANK];
} dcp_chunk;

typedef struct {
    char *fqn;
    bool is_bytes;               /* a BytesStorageMetadata entry */
    ckpt_dtype dtype;
    int ndim;
    uint64_t shape[CKPT_MAX_RANK];
    uint64_t nbytes;
    size_t nchunks;
    dcp_chunk *chunks;           /* in the metadata's order */
    size_t file;                 /* bytes entry: where it is */
    uint64_t item_off, item_len;
} dcp_entry;

typedef struct {
    char *name; /* relative_path */
    char *path; /* dir/name */
    uint64_t size;
} dcp_file;

typedef struct {
    char *dir;
    size_t nentries;
    dcp_entry *entries; /* sorted by fqn */
    size_t nfiles;
    dcp_file *files;    /* sorted by name */
    size_t nchunks;
    uint64_t total_bytes; /* tensor bytes */
} dcp_ckpt;

/* True when path is a folder holding a .metadata or a *.distcp file. */
bool dcp_is_checkpoint(const char *path);
/* Opens and checks a DCP folder: .metadata, then every chunk in its file. */
int dcp_open(dcp_ckpt *c, const char *dir);
/* Only the .metadata bytes (no files are read; sizes stay 0, data_off unset):
 * `label` names it in errors. *c must be zeroed first (c->dir may be set) and
 * dcp_close()d after, on failure too. Used by dcp_open and the fuzzer. */
int dcp_parse_metadata(dcp_ckpt *c, const char *label, const uint8_t *buf, size_t len);
void dcp_close(dcp_ckpt *c);
const dcp_entry *dcp_find(const dcp_ckpt *c, const char *fqn);
/* What an entry is when it is not part of the model, by the top-level key
 * its name was flattened from: "optimizer state" under "optim." (Accelerate,
 * torch.distributed.checkpoint.state_dict users) or "optimizer." (torchtitan),
 * "training state" under "lr_scheduler.", "train_state." or "dataloader."
 * (torchtitan's other stateful objects); NULL for the rest. */
const char *dcp_non_model_kind(const char *fqn);

#endif

/*
 * torch.h — torch.save files read as tensor tables, in place, without torch.
 *
 * Two containers, both as torch/serialization.py (torch 1.6 – 2.x) writes them:
 *   - zip (torch >= 1.6): "<archive>/data.pkl" (the pickle), storages in
 *     "<archive>/data/<key>" stored uncompressed, "<archive>/version",
 *     optionally "<archive>/byteorder" ("little"; "big" is refused). Every
 *     entry lives under one top folder; the zip directory is checked by
 *     zipdir.h (no overlaps, sizes agree, zip64).
 *   - legacy (torch < 1.6, or _use_new_zipfile_serialization=False): pickled
 *     magic number 0x1950a86a20f9469cfc6c, protocol version 1001, sys_info,
 *     the object pickle, the list of storage keys; then each storage in that
 *     order as an 8-byte little-endian element count and its bytes.
 * The pickle runs on the restricted machine (pickle.h) with an allow-list of
 * what torch writes for tensors and state dicts: collections.OrderedDict,
 * torch._utils._rebuild_tensor_v2 / _v3 / _rebuild_parameter(_with_state),
 * torch._tensor._rebuild_from_type_v2, torch.nn.parameter.Parameter,
 * torch.*Storage, torch.UntypedStorage, the dtypes, torch.Size, torch.device,
 * _codecs.encode, builtins set/frozenset. Anything else — os.system,
 * builtins.eval, a pickled nn.Module — is refused naming the global and the file.
 *
 * What a file yields: the top-level dict (or its "state_dict" / "model" entry
 * when it wraps one) maps names to tensors; each tensor is a storage (dtype,
 * element count, byte range in the file) plus offset, size and stride in
 * elements. The result is an st_file (safetensors.h) so everything that reads
 * checkpoints reads it unchanged: one st_tensor per kept tensor, with `offset`
 * the absolute byte offset of its bytes in the .bin file, `begin` = offset,
 * data_start 0, header_len 0, from_torch true. Rules, as Hugging Face's
 * conversion (safetensors convert.py _remove_duplicate_names) has them:
 *   - a tensor must lie inside its storage and be a contiguous view
 *     (row-major strides; size-1 axes free), or a permutation of a
 *     contiguous block (a transposed lm_head): then st_tensor.view is set,
 *     its byte range is the block and view_axes/stored_shape say how to walk
 *     it (checkpoint.h: only ckpt_checkpoint_open_views accepts those; the
 *     converter's plan makes the .contiguous() copy). Strided slices are
 *     refused naming the tensor;
 *   - tensors whose bytes overlap in one storage are one shared tensor (tied
 *     embeddings): the name kept is the first in sorted order among those
 *     covering the whole overlap group; the others become metadata entries
 *     {removed name: kept name}, as convert.py writes them; overlapping views
 *     where none covers the group are refused.
 * Every dtype safetensors holds maps (bool, u8…u64, i8…i64, f16, bf16, f32,
 * f64, c64, float8 e4m3fn/e5m2/e4m3fnuz/e5m2fnuz/e8m0fnu); complex128,
 * quantized and sparse tensors are refused.
 */
#ifndef CKPT_FORMAT_TORCH_H
#define CKPT_FORMAT_TORCH_H

#include "format/pickle.h"
#include "format/safetensors.h"
#include "format/zipdir.h"

#define TORCH_MAX_PICKLE (1u << 30) /* data.pkl we read into memory */
#define TORCH_MAX_NESTING 64       /* depth of dicts walked for the state dict */

/* "zip", "legacy" or NULL: what the first bytes of a file look like. */
const char *torch_sniff(const uint8_t *head, size_t len);
/* Opens path as a torch.save file (f->fd stays open for tensor reads). */
int torch_open(st_file *f, const char *path);
/* The same over any byte source (the fuzzers, tests): `label` names it. */
int torch_parse(st_file *f, const char *label, zip_read_fn rd, void *ctx, uint64_t file_size);
/* "FloatStorage", "BFloat16Storage", ...: the typed storage torch pickles a
 * tensor of dt with (torch.<name>), or NULL when there is none. */
const char *torch_storage_type(ckpt_dtype dt);
/* "bfloat16", "float32", ...: the torch.<dtype> attribute of dt, or NULL. */
const char *torch_dtype_attr(ckpt_dtype dt);
/* A torch.save file holding one tensor (torch.save(t, path), as xser writes
 * each tensor_<tid>.pt): f gets that one tensor, named `name`. */
int torch_open_tensor(st_file *f, const char *path, const char *name);
/* A torch.save of nested dicts (a torch optimizer's state_dict: "state" ->
 * index -> slot -> tensor): every tensor in a dict at any depth (up to
 * TORCH_MAX_NESTING), named by its keys joined with '.' (an integer key in
 * decimal: "state.3.exp_avg"), in f; *doc gets the pickle tree, for the
 * values that are not tensors (pk_free it). Tensors in lists are not taken. */
int torch_open_tree(st_file *f, pk_doc *doc, const char *path);
/* The same over any byte source (the fuzzers). */
int torch_parse_tree(st_file *f, pk_doc *doc, const char *label, zip_read_fn rd, void *ctx, uint64_t file_size);
/* The pickle of a torch.save file that holds no tensor storages (xser's
 * reference file, its .info.pt), run on the same machine with torch's
 * allow-list plus `extra` (the caller's tags must not collide with torch.c's:
 * use 1000 and up); persistent ids are refused. *doc is the tree (pk_free it). */
int torch_load_pickle(pk_doc *doc, const char *path, const pk_global_def *extra, size_t nextra);
/* The same over any byte source (the fuzzers). */
int torch_parse_pickle(pk_doc *doc, const char *label, zip_read_fn rd, void *ctx, uint64_t file_size,
                       const pk_global_def *extra, size_t nextra);
/* The safetensors dtype (ckpt_dtype) a torch dtype global such as
 * torch.bfloat16 names in a tree torch_load_pickle made; -1 when it is not
 * one, or has no safetensors twin. */
int torch_global_dtype(const pk_node *g);
/* A torch.save of one tensor, not a dict — what PyTorch DCP writes for each
 * chunk (torch.save(tensor) into a .distcp file at an offset; format/dcp.h):
 * the same rules, over [0, size) of rd; *f holds one tensor named "tensor"
 * whose offset is relative to what rd reads. */
int torch_parse_tensor(st_file *f, const char *label, zip_read_fn rd, void *ctx, uint64_t size);
/* torch's dtype names ("float32", "bfloat16", ...): the i-th, or NULL past the
 * last; *dt gets its ckpt_dtype, or -1 when safetensors has none (complex128). */
const char *torch_dtype_at(size_t i, int *dt);
/* Opens a tensor file of either kind: torch.save by its first bytes, else safetensors. */
int tensor_file_open(st_file *f, const char *path);

#endif

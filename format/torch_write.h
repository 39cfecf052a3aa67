/*
 * torch_write.h — writing a state dict as a torch.save file (the zip format
 * torch has written since 1.6), without torch, tensor bytes streamed by the
 * caller.
 *
 * The file is what torch.save(OrderedDict) writes (torch/serialization.py
 * _save; caffe2/serialize/inline_container.cc PyTorchStreamWriter):
 *   <archive>/data.pkl     protocol-2 pickle: collections.OrderedDict of
 *                          name -> torch._utils._rebuild_tensor_v2(
 *                            persistent id ('storage', torch.<T>Storage, key,
 *                            'cpu', numel), 0, size, stride, False, OrderedDict())
 *   <archive>/byteorder    "little"
 *   <archive>/data/<key>   one storage per tensor, keys "0", "1", ... written
 *                          in sorted (string) order as torch does
 *   <archive>/version      "3\n"
 * Every entry is stored (no compression) with its CRC-32, and its data starts
 * on a 64-byte boundary (the local header's extra field "FB" pads it, as
 * PyTorchStreamWriter's getPadding does); zip64 fields where sizes or
 * offsets pass 4 GiB. The pickle names only what the restricted reader
 * (torch.h) allows, so ckpt reads back every file it writes.
 *
 * Two steps, so that the executor (plan/executor.h) can stream the tensor
 * bytes into place in between:
 *   torch_out_plan()   decides every offset: torch_out.t[i].offset is where
 *                      tensor i's bytes go, file_size the whole file;
 *   (the caller writes each tensor's bytes at its offset)
 *   torch_out_finish() writes everything else: headers, data.pkl, the
 *                      small records, the central directory; the storages'
 *                      CRC-32 come from the caller (torch_out_finish_crc: the
 *                      executor takes them as it writes, exec_opts.out_crc32)
 *                      or are read back from the file.
 * Between the two the file may hold anything outside the storages (the
 * executor extends it to file_size with zeros): finish writes all of it.
 */
#ifndef CKPT_FORMAT_TORCH_WRITE_H
#define CKPT_FORMAT_TORCH_WRITE_H

#include "format/safetensors.h"

#include <stddef.h>
#include <stdint.h>

#define TORCH_OUT_ALIGN 64 /* PyTorchStreamWriter's kFieldAlignment */

/* A tensor of the file: safetensors' output record (name, dtype, ndim,
 * shape, nbytes), its offset set by torch_out_plan to the first byte of its
 * storage in the file; `user` is the caller's. */
typedef st_out_tensor torch_out_tensor;

typedef struct {
    char *archive;      /* the top folder's name */
    torch_out_tensor *t; /* in state-dict order */
    size_t n;
    uint8_t *pickle;
    size_t pickle_len;
    uint64_t file_size;
    /* the zip entries, in file order */
    struct torch_out_entry {
        char *name;         /* full name, archive/... */
        uint64_t header;    /* local header offset */
        uint64_t data, size; /* data offset and length */
        const uint8_t *bytes; /* small records' contents (NULL: a storage) */
        size_t tensor;      /* a storage: index into t */
        uint16_t extra_len; /* local header extra field (zip64 + padding) */
    } *e;
    size_t ne;
    uint64_t cd_offset, cd_size;
} torch_out;

/* Plans a file holding tensors[0..n) under `archive` ("archive" when NULL).
 * Names and shapes are copied; dtypes without a torch storage type (sub-byte
 * ones, complex) are refused naming the tensor. */
int torch_out_plan(torch_out *o, const char *archive, const torch_out_tensor *tensors, size_t n);
/* The same with the caller's data.pkl (copied) instead of the state dict's:
 * tensors[i]'s storage is keyed "i", as the pickle's persistent ids must
 * name it. For torch.save of other objects (neuronx-distributed's xser files). */
int torch_out_plan_pickle(torch_out *o, const char *archive, const torch_out_tensor *tensors, size_t n,
                          const uint8_t *pickle, size_t pickle_len);
/* With every tensor's bytes at its offset in fd: writes the rest, reading
 * each storage back for its CRC-32. */
int torch_out_finish(const torch_out *o, int fd, const char *path);
/* The same with tensor_crc[i] the CRC-32 of tensor t[i]'s bytes (NULL:
 * read back): nothing of the storages is read. */
int torch_out_finish_crc(const torch_out *o, int fd, const char *path, const uint32_t *tensor_crc);
void torch_out_free(torch_out *o);

/* The pickle alone (data.pkl of the plan), for tests and the fuzz corpus. */
int torch_out_pickle(const torch_out_tensor *tensors, size_t n, uint8_t **out, size_t *len);
/* torch.save(tensor): the bare _rebuild_tensor_v2 of storage "0". */
int torch_out_pickle_tensor(const torch_out_tensor *t, uint8_t **out, size_t *len);
/* An OrderedDict of tensors[i].name -> module.cls instance whose __dict__ is
 * {field: i}, as protocol 2 pickles a plain object (NEWOBJ, BUILD): xser's
 * torch_xla.utils.serialization.TensorReference(tid). */
int torch_out_pickle_records(const torch_out_tensor *tensors, size_t n, const char *module, const char *cls,
                             const char *field, uint8_t **out, size_t *len);
/* neuronx-distributed's <file>.pt.info.pt (_extract_tensor_info_and_update_state_dict):
 * {i: {"dtype": torch.<dtype>, "shape": torch.Size(shape), "expert_model_parallel": False}}. */
int torch_out_pickle_xser_info(const torch_out_tensor *tensors, size_t n, uint8_t **out, size_t *len);

#endif

/*
 * store_convert.h — convert a stored checkpoint into a layout inside the
 * store, producing REF:LAYOUT.
 *
 * The plan is made from the stored headers and config.json exactly as the
 * offline `ckpt convert` makes it. The converted checkpoint stores no tensor
 * bytes of its own: each output tensor is recorded as a recipe (the plan's
 * parts over the source's blobs) or, when it is a source tensor unchanged, as
 * that blob. Only the small files (indexes, ckpt-layout.json) become new
 * blobs. The output files are assembled once, to record their sha256 and
 * size, and thrown away. Converting again finds the existing checkpoint.
 */
#ifndef CKPT_STORE_STORE_CONVERT_H
#define CKPT_STORE_STORE_CONVERT_H

#include "store/store.h"
#include "transform/convert.h"

int store_convert(ckpt_store *s, const char *ref, const convert_opts *o, store_ckpt *out, bool *existed);

/* Shared with the store's merge-lora (store_lora.c). */
/* The stored checkpoint src (its file rows) opened as the offline planner
 * opens a folder, from the stored headers: the shards of
 * model.safetensors.index.json, else model.safetensors; config.json (or
 * NULL), the index text and name (NULL without an index), and the files'
 * sha256 (malloc'd, one per shard). With torch_ok, a checkpoint stored as
 * torch.save weights (pytorch_model.bin[.index.json], whole-file blobs) opens
 * from its blobs, permuted views accepted (st_file.from_torch; a tensor's
 * bytes are the range [offset, offset + nbytes) of its file's blob); without
 * it, such a checkpoint is refused with a way out. */
int store_convert_open_source(ckpt_store *s, const store_ckpt *src, const store_file_row *rows,
                              size_t nrows, bool torch_ok, ckpt_checkpoint *c, json_t **config,
                              char **index_text, const char **index_name, char (**hashes)[65]);
/* A top-level file that is not weights, an index or ckpt-layout.json
 * (config.json, tokenizer files): what a layout copies as it is. */
bool store_convert_is_side_file(const char *name);
/* Appends an empty file record named path to r (NULL when out of memory). */
store_file_rec *store_convert_rec_add_file(store_ckpt_rec *r, const char *path);

#endif

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
#ifndef CKPT_WORKERS_STORE_CONVERT_H
#define CKPT_WORKERS_STORE_CONVERT_H

#include "storage/store.h"
#include "workers/convert.h"

int store_convert(ckpt_store *s, const char *ref, const convert_opts *o, store_ckpt *out, bool *existed);

#endif

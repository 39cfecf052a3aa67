/*
 * outdir.h — an output checkpoint folder, written as one step: everything
 * goes into a temp folder beside DST, which replaces DST only when complete
 * (common/fsutil.h has the durability protocol), so a failure or an
 * interrupt never leaves a half-written DST.
 *
 *   char *tmp;
 *   if (outdir_prepare(dst, force, &tmp) < 0) ...        // refuses a non-empty dst unless force
 *   ... write files into tmp ...
 *   outdir_copy_side_files(src_dir, tmp);                  // config.json, tokenizer, ...
 *   if (outdir_commit(tmp, dst, force) < 0) ...            // else ckpt_rm_rf(tmp)
 *
 * Used by convert, consolidate, the LoRA merge and the store's pull.
 */
#ifndef CKPT_FORMAT_OUTDIR_H
#define CKPT_FORMAT_OUTDIR_H

#include <stdbool.h>

/* The layout metadata a converted folder carries (docs/transforms.md). */
#define OUTDIR_LAYOUT_FILE "ckpt-layout.json"
/* The largest side file (config.json, tokenizer.json, ...) copied along. */
#define OUTDIR_SIDE_FILE_MAX_BYTES (1u << 30)

/* Refuses a non-empty dst unless force; returns the temp dir to write into. */
int outdir_prepare(const char *dst, bool force, char **tmpdir);
/* Commits tmpdir onto dst (replacing dst when force: the old one is moved
 * aside, the new one renamed in, the old one removed; an interrupt waits). */
int outdir_commit(const char *tmpdir, const char *dst, bool force);
/* Copies the small non-weight files (config.json, tokenizer, ...) of src_dir
 * into out_dir, skipping what outdir_is_weight_name names and any other .bin
 * that is a torch.save file. */
int outdir_copy_side_files(const char *src_dir, const char *out_dir);
/* True for a name that is weights or layout, not a side file: safetensors
 * files and indexes, ckpt-layout.json, torch weights (pytorch_model*.bin,
 * *.bin.index.json, .pt, .pth), hidden files and temp names. */
bool outdir_is_weight_name(const char *name);
/* Copies only a Hugging Face model's own small files that src_dir has:
 * config.json, generation_config.json and the tokenizer files (a training
 * save's folder holds others that do not belong to the model). scratch:
 * out_dir is a staging folder removed after the run (no fsync). */
int outdir_copy_model_files(const char *src_dir, const char *out_dir, bool scratch);

#endif

/*
 * dcp_consolidate.h — a PyTorch Distributed Checkpoint folder to a Hugging
 * Face checkpoint (docs/torch.md, "PyTorch Distributed Checkpoint").
 *
 * dcp_consolidate(SRC, DST): SRC is opened and checked whole by format/dcp.h;
 * every model tensor becomes an output tensor with one plan part per chunk
 * (the chunk's box at its offsets, read from its bytes inside its .distcp),
 * and the executor (plan/executor.h) streams them into model.safetensors or
 * shards of at most max_shard_size plus model.safetensors.index.json, with
 * {"format":"pt"}, in a temp folder that replaces DST only when complete.
 * Optimizer and training state (dcp_non_model_kind: optim.*, optimizer.*,
 * lr_scheduler.*, train_state.*, dataloader.*) and bytes entries (pickled
 * Python values) are left out, and said so on stderr.
 * strip_prefix removes a leading prefix from names that have it ("model."
 * of Accelerate's {"model": state_dict} saves); names must stay distinct.
 * With o->state DST is a ckpt training state: optimizer entries
 * "optim.state.<param>.<slot>" matching a model tensor of their shape become
 * the slots "<param>/<slot>" in optimizer.safetensors, and optimizer.json and
 * metadata.json (step: train_state.step, else the optimizer's common step)
 * are written as a state's; unmatched optimizer entries are listed on stderr.
 */
#ifndef CKPT_TRANSFORM_DCP_CONSOLIDATE_H
#define CKPT_TRANSFORM_DCP_CONSOLIDATE_H

#include "transform/convert.h"

int dcp_consolidate(const char *src, const char *dst, consolidate_opts *o);

#endif

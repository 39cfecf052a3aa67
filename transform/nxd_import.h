/*
 * nxd_import.h — an optimum-neuron / neuronx-distributed training save
 * (format/nxd.h) back to a Hugging Face checkpoint (docs/layouts.md, "NxD
 * checkpoints in").
 *
 * nxd_consolidate(SAVE, DST) does what optimum-neuron's
 * consolidate_model_parallel_checkpoints and to_original_weights
 * (optimum/neuron/models/training/checkpointing.py,
 * transformations_utils.py) do, as a plan streamed by the executor with
 * bounded memory instead of every rank loaded into RAM:
 *   - from each stage's mp_metadata_pp_rank_N.json it rebuilds the original
 *     tensors' names, dtypes and shapes and the rules that would shard them
 *     as the training model holds them: fuse_qkv_gqa for a
 *     GQAQKVColumnParallelLinearSpec (fused weight_qkv or weight_q/_k/_v,
 *     kv_size_multiplier), fuse for a FusedLinearsSpec, tp_split with
 *     partition_dim and partition_stride for every other tensor-parallel
 *     parameter, nothing for a replicated one;
 *   - every rank tensor those rules describe must be in its rank file with
 *     that dtype and shape (an error names the file and parameter), and its
 *     parts are inverted (consolidate.h): the KV replicas and the replicated
 *     parameters of ranks 1.. become checks against rank 0's bytes;
 *   - a PEFT adapter save (adapter_<name>/adapter_shards) keeps only that
 *     adapter's LoRA parameters, undoes the specs whose peft_type is "lora"
 *     as _lora_to_original_weights does (lora_A copies, lora_B through the same
 *     rules), and writes adapter_model.safetensors + adapter_config.json;
 *   - the pipeline stages are merged and DST is written as `ckpt convert`
 *     writes a folder (model.safetensors or shards of --max-shard-size with
 *     their index, {"format": "pt"}), with config.json and the tokenizer
 *     files of SAVE; no ckpt-layout.json;
 *   - with o->state, shards/optim (format/nxd_optim.h) too, as a ckpt
 *     training state: each state's index named by NeuronTrainer's
 *     param_groups (decay, then no decay, in named_parameters() order; by
 *     model_type, which norms are in ALL_LAYERNORM_LAYERS), every slot checked
 *     against its parameter's per-rank shape (ZeRO-1: one dp chunk of it),
 *     and planned as the parameter's original tensors are, each part read
 *     from the rank's slot instead (split at ZeRO-1 chunk boundaries), the
 *     replica checks included; optimizer.safetensors "<param>/<slot>",
 *     optimizer.json (what was left out listed) and metadata.json (the step).
 */
#ifndef CKPT_TRANSFORM_NXD_IMPORT_H
#define CKPT_TRANSFORM_NXD_IMPORT_H

#include "transform/convert.h"

int nxd_consolidate(const char *src, const char *dst, consolidate_opts *o);

#endif

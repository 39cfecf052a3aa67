/*
 * nxd_export.h — a Hugging Face checkpoint written as the training save of
 * optimum-neuron / neuronx-distributed (docs/layouts.md, "NxD checkpoints
 * out"), the inverse of nxd_import.h.
 *
 * nxd_export(SRC, DST) writes what NeuronModelMixin.save_pretrained
 * (optimum-neuron, optimum/neuron/models/training/modeling_utils.py) leaves
 * in DST after neuronx-distributed's trainer/checkpoint.py
 * save_checkpoint(DST, tag="shards", model=...) with no optimizer (pp stages
 * as create_partitions splits the layers, nxd_export_opts.pp):
 *
 *   DST/config.json (and the source's other small files: tokenizer, generation config)
 *   DST/trn_config.json                     asdict(TrainingNeuronConfig), json.dumps(indent=4)
 *   DST/shards/checkpoint                   "1" (CheckpointIOState.begin)
 *   DST/shards/model/dp_rank_00_tp_rank_TT_pp_rank_00.pt
 *                                           torch.save of the rank's state dict, in the training
 *                                           model's parameter order and names (qkv_proj.weight_qkv
 *                                           or weight_q/_k/_v, gate_up_proj.weight, ...)
 *   DST/shards/mp_metadata_pp_rank_0.json   create_parameter_metadata (transformations_utils.py)
 *   DST/shards/done                         "1" (CheckpointIOState.end)
 *
 * The training model is optimum-neuron's LlamaForCausalLM
 * (models/training/llama/modeling_llama.py; Qwen3ForCausalLM adds q_norm and
 * k_norm, GraniteForCausalLM keeps the embeddings and lm_head whole) for the
 * source's config.json and
 * the TrainingNeuronConfig given by the options (tp, kv_size_multiplier,
 * fuse_qkv): GQAQKVColumnParallelLinear when the KV heads are fewer than tp or
 * do not divide by it, a fused stride-3 qkv_proj when fuse_qkv and there is no
 * GQA, else separate q/k/v; gate_up_proj fused; the tensors are placed as the
 * specs' _adapt_state_dict and NxD's create_local_weight place them (the same
 * rules nxd_import.c inverts). Bytes are streamed by the executor straight
 * into the torch.save files (format/torch_write.h), which are finished after
 * it; DST appears whole or not at all (format/outdir.h).
 */
#ifndef CKPT_TRANSFORM_NXD_EXPORT_H
#define CKPT_TRANSFORM_NXD_EXPORT_H

#include "transform/convert.h"

#include <stdbool.h>

typedef struct {
    bool fuse_qkv; /* TrainingNeuronConfig.fuse_qkv */
    bool xser;     /* TrainingNeuronConfig.use_xser: torch_xla's serialization (TensorReference records) */
    int pp;        /* TrainingNeuronConfig.pipeline_parallel_size (0: 1): rank files and metadata per stage */
} nxd_export_opts;

/* o: tp, kv_size_multiplier, dtype, threads, force, quiet, no_hash (layout must be "neuron"). */
int nxd_export(const char *src, const char *dst, const convert_opts *o, const nxd_export_opts *x);

#endif

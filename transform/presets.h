/*
 * presets.h — rules documents generated from a model's config.json.
 *
 * Presets (issue "Transform engine"; semantics in docs/transforms.md):
 *   neuron   optimum-neuron tensor parallel: GQA QKV fused per rank
 *            (qkv_proj.weight_qkv / bias_qkv), o_proj and down_proj row-parallel,
 *            gate_up_proj fused per rank, experts stacked and transposed
 *            (experts.gate_up_proj.weight [E, hidden, 2I/tp],
 *            experts.down_proj.weight [E, I/tp, hidden]), vocab split; padding
 *            wherever a size does not divide.
 *   fused    vLLM-style names on one device: qkv_proj, gate_up_proj, experts
 *            stacked [E, 2I, hidden] / [E, hidden, I]; with tp, column/row
 *            parallel slices of those.
 *   easydel  JAX/Flax names and kernel orientation: .kernel [in, out],
 *            .embedding, .scale, experts stacked as [E, in, out].
 *   hf       names and shapes unchanged (recast, reshard, or plain TP slices).
 *   vllm     vLLM's sharded state (ShardedStateLoader): per rank qkv_proj as
 *            QKVParallelLinear shards it (fuse_qkv_gqa, kv_order adjacent),
 *            gate_up_proj, o/down row-parallel, experts.w13_weight /
 *            w2_weight, the vocabulary padded to 64 and split; the document's
 *            "rank_files" names the files model-rank-{rank}-part-{part}.
 * The generated document is what `ckpt plan --print-rules` prints; feeding it
 * back with --rules gives the same output.
 */
#ifndef CKPT_TRANSFORM_PRESETS_H
#define CKPT_TRANSFORM_PRESETS_H

#include <jansson.h>
#include <stdint.h>

typedef struct {
    const char *preset;         /* neuron, fused, easydel, hf, vllm */
    int tp;                     /* >= 1 */
    int64_t kv_size_multiplier; /* 0: the preset's default */
    const char *dtype;          /* NULL: keep dtypes */
} preset_opts;

/* Checks the options alone (known preset, tp 1..1024, dtype, kv multiplier
 * for neuron only), before any config is read: CKPT_EINVAL with a message. */
int preset_check(const preset_opts *o);
/* Builds the rules document; `what` names the config in errors. */
int preset_rules(json_t **out, const json_t *config, const preset_opts *o, const char *what);
/* The layout name for options, e.g. "neuron-tp8", "fused", "hf-f16". malloc'd. */
char *preset_layout_name(const preset_opts *o);

#endif

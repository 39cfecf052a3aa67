/*
 * layout_meta.h — ckpt-layout.json, the parameter metadata of docs/transforms.md §7.
 *
 *   {"format": "ckpt-layout", "version": 1, "layout": "neuron-tp8", "tp": 8, "lossy": false,
 *    "source": {"index_name": ..., "index": "<original index text>" | null,
 *               "files": [{"name", "size", "sha256", "metadata": {...},
 *                          "tensors": [{"name", "dtype", "shape"}]}]},
 *    "rules": {<the rules document>},
 *    "folders": [{"rank": 0, "dir": "tp_rank_00", "files": [...]}],
 *    "tensors": [{"name", "rank" (null: every rank holds it), "dtype", "shape",
 *                 "parts": [{"src", "src_lo", "axis_map", "lo", "ext"} | {"zero": true, "lo", "ext"}
 *                           | {"srcs": [...], "lo_step", "src_lo", "axis_map", "lo", "ext"} (a run)],
 *                 "transforms": [...], "tensor_model_parallel", "partition_dim",
 *                 "partition_stride", "num_partitions", "padding", "fused", "gqa", "experts"}],
 *    "parameters": {name: {tensor_model_parallel, partition_dim, partition_stride, num_partitions}},
 *    "model_weight_transformation_specs": [...]}
 *
 * "parameters" and "model_weight_transformation_specs" mirror optimum-neuron's
 * create_parameter_metadata; the parts are what consolidation inverts.
 */
#ifndef CKPT_TRANSFORM_LAYOUT_META_H
#define CKPT_TRANSFORM_LAYOUT_META_H

#include "transform/convert.h"

/* hashes: one sha256 per source file (cp->exec.src_paths order), or NULL. */
json_t *layout_meta_build(const convert_plan *cp, char (*hashes)[65], bool with_parts);

#endif

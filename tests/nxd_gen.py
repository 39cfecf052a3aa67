#!/usr/bin/python3
"""nxd_gen.py — writes an optimum-neuron / neuronx-distributed training save
the way NeuronModelMixin.save_pretrained writes one, from a Hugging Face Llama
generated here, for ckpt's NxD reader (docs/layouts.md, "NxD checkpoints in").

  nxd_gen.py ref REF                  a Llama (GQA: 8 query heads, 2 KV heads,
                                      head_dim 8, hidden 64, intermediate 128,
                                      vocabulary 256, 2 layers, bf16) as
                                      REF/model.safetensors + REF/config.json
  nxd_gen.py save REF SAVE --tp N [--pp P] [--xser] [--fuse-qkv]
                 [--kv-size-multiplier M]
                                      REF's weights sharded as the training model
                                      holds them, saved as SAVE/shards/...
  nxd_gen.py saves REF "SAVE --tp N ... [--rowids] [--damage D]" ...
                                      REF (written when missing) and several saves
                                      in one run (torch is slow to import); with
                                      --rowids the save is made from REF-rows, a
                                      model whose values are their row numbers
                                      (column numbers for o_proj and down_proj);
                                      --damage breaks the save for a hostile test;
                                      --mha makes it from REF-mha (8 KV heads: with
                                      --fuse-qkv, LlamaAttention's qkv_proj of stride
                                      3 and its FusedLinearsSpec); --qwen3 from
                                      REF-qwen3, a Qwen3 (modeling_qwen3.py: Llama's
                                      layers plus replicated q_norm and k_norm);
                                      --moe --ep E from REF-moe, a Mixtral whose MLPs
                                      are neuronx-distributed's MoE (modules/moe), its
                                      experts over E expert-parallel ranks; --adapter
                                      [--lora-targets a,b] saves REF-adapter (a PEFT
                                      LoRA of REF) as NeuronPeftModel.save_pretrained
                                      does, SAVE/adapter_default/adapter_shards

What is followed, and where (huggingface/optimum-neuron, aws-neuron/neuronx-distributed):
- optimum/neuron/models/training/llama/modeling_llama.py: LlamaAttention uses a
  GQAQKVColumnParallelLinear (qkv_proj, weight_qkv or weight_q/_k/_v) with a
  GQAQKVColumnParallelLinearSpec when num_key_value_heads < tp or does not
  divide by tp, with kv_size_multiplier = trn_config.auto_kv_size_multiplier
  (max(1, tp // KV), config.py) unless given; else separate
  ColumnParallelLinear q/k/v. LlamaMLP: gate_up_proj a ColumnParallelLinear
  with stride 2 and a FusedLinearsSpec; down_proj and o_proj RowParallelLinear;
  embed_tokens a ParallelEmbedding (vocab split, partition_dim 0); lm_head a
  ColumnParallelLinear.
- transformations_utils.py: the rank tensors are made by the specs'
  _adapt_state_dict (create_local_fused_weight, compute_query_indices_for_rank,
  create_kv_proj_local_weight_from_regular_weight,
  create_query_or_output_projection_local_weight_from_regular_weight) and, for
  the other parallel parameters, create_local_weight_with_padding (NxD
  parallel_layers/layers.py create_local_weight); create_parameter_metadata
  gives mp_metadata_pp_rank_N.json (ModelWeightTransformationSpecs.to_metadata).
- NxD qkv_linear.py: weight_qkv is rebuilt as a new Parameter (torch.cat), so it
  carries no tensor_model_parallel attribute; weight_q/_k/_v keep theirs.
- NxD trainer/checkpoint.py save_checkpoint/_save/_get_path: model files
  shards/model/dp_rank_00_tp_rank_XX_pp_rank_XX.pt; with xser
  (_xser_save_data, _extract_tensor_info_and_update_state_dict) the .pt holds
  torch_xla.utils.serialization.TensorReference(tid) records, each tensor is
  <file>.pt.tensors/tensor_<tid>.pt and <file>.pt.info.pt maps tid to
  {"dtype", "shape", "expert_model_parallel"}; CheckpointIOState.end writes
  shards/done ("1").
- modeling_utils.py save_pretrained: config.json and trn_config.json in SAVE.
- The optimizer (--optim plain|zero1): save_checkpoint(optimizer=...) writes
  optimizer.state_dict() of each rank to shards/optim/_get_path("optim") —
  dp_rank_00_tp_rank_TT_pp_rank_PP.pt, or with ZeRO-1 (dp=True) one file per
  dp rank — plain or xser like the model. A torch AdamW state_dict
  (torch/optim/optimizer.py state_dict): "state" {index: {"step", "exp_avg",
  "exp_avg_sq"}} and "param_groups", the indices numbering the parameters of
  the groups in order; the groups are NeuronTrainer.create_optimizer's
  (optimum/neuron/trainers/transformers.py): weight decay for the names
  get_parameter_names(model, ALL_LAYERNORM_LAYERS, ["bias", "layernorm",
  "rmsnorm"]) returns, then the others, each in named_parameters() order. With
  ZeRO-1, torch_xla's ZeroRedundancyOptimizer.state_dict (NeuronZero1Optimizer):
  "state" {} of the wrapper, "base_state" the wrapped AdamW's state of this dp
  rank's chunk (_shard_tensor: padded on axis 0 to a multiple of dp, chunk
  [dp rank]) and "shape_info" {index: torch.Size of the rank's parameter}.
  The slots' values are SAVE-state-ref/optimizer.safetensors ("<original name>/<slot>",
  F32) sharded exactly as the parameters (build()).
"""
import argparse
import collections
import json
import os
import re
import shlex
import struct
import sys
import types

import torch

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 8,
    "num_hidden_layers": 2, "vocab_size": 256, "rms_norm_eps": 1e-05, "hidden_act": "silu",
    "max_position_embeddings": 128, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
# NXD_GEN_CONFIG='{"hidden_size": 2048, ...}' overrides entries (a bigger model for timing by hand)
CONFIG.update(json.loads(os.environ.get("NXD_GEN_CONFIG", "{}")))


# ---- a reference safetensors writer (dtype order, then names; compact header padded to 8) ----
def write_safetensors(path, tensors):
    names = sorted(tensors)  # one dtype (bf16, or f32 for an optimizer's slots): name order
    header = {"__metadata__": {"format": "pt"}}
    off = 0
    blobs = []
    for n in names:
        t = tensors[n].contiguous()
        b = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[n] = {"dtype": "BF16" if t.dtype == torch.bfloat16 else "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        data = f.read()
    out = collections.OrderedDict()
    for k, v in h.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(data[b:e]), dtype=torch.int16).view(torch.bfloat16).reshape(v["shape"])
    return out


ROW_PARALLEL = ("o_proj.weight", "down_proj.weight")


def row_ids(name, shape):
    """Values that say where they come from: a column-parallel (or 1-D) tensor's
    element holds its row number, a row-parallel one's its column number
    (exact in bf16: every size here is at most 256)."""
    if len(shape) == 1:
        return torch.arange(shape[0], dtype=torch.float32).to(torch.bfloat16)
    if name.endswith(ROW_PARALLEL):
        return torch.arange(shape[1], dtype=torch.float32).repeat(shape[0], 1).to(torch.bfloat16)
    return torch.arange(shape[0], dtype=torch.float32).unsqueeze(1).repeat(1, shape[1]).to(torch.bfloat16)


MOE_EXPERTS = 4


def make_ref(out, rowids=False, mha=False, qwen3=False, moe=False):
    c = dict(CONFIG, num_key_value_heads=CONFIG["num_attention_heads"]) if mha else dict(CONFIG)
    if qwen3:  # Qwen3: Llama's layers plus per-head RMSNorms of q and k (head_dim wide)
        c.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", attention_bias=False)
    if moe:  # a Mixtral whose MLPs are neuronx-distributed's MoE (modules/moe), in that module's names and shapes
        c.update(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=MOE_EXPERTS,
                 num_experts_per_tok=2)
    g = torch.Generator().manual_seed(17)
    hd, H, KV, hid, inter, V = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"], \
        c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    shapes = {"model.embed_tokens.weight": [V, hid], "model.norm.weight": [hid], "lm_head.weight": [V, hid]}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": [H * hd, hid], p + "self_attn.k_proj.weight": [KV * hd, hid],
                       p + "self_attn.v_proj.weight": [KV * hd, hid], p + "self_attn.o_proj.weight": [hid, H * hd],
                       p + "mlp.gate_proj.weight": [inter, hid], p + "mlp.up_proj.weight": [inter, hid],
                       p + "mlp.down_proj.weight": [hid, inter], p + "input_layernorm.weight": [hid],
                       p + "post_attention_layernorm.weight": [hid]})
        if c["model_type"] == "qwen3":
            shapes.update({p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd]})
        if c["model_type"] == "mixtral":
            E = c["num_local_experts"]
            for n in ("gate_proj", "up_proj", "down_proj"):
                del shapes[p + "mlp." + n + ".weight"]
            x = p + "mlp.expert_mlps.mlp_op."
            shapes.update({p + "mlp.router.linear_router.weight": [E, hid], x + "gate_up_proj.weight": [E, hid, 2 * inter],
                           x + "down_proj.weight": [E, inter, hid]})
    tensors = {n: row_ids(n, s) if rowids else torch.randn(s, generator=g).to(torch.bfloat16)
               for n, s in sorted(shapes.items())}
    os.makedirs(out, exist_ok=True)
    write_safetensors(os.path.join(out, "model.safetensors"), tensors)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")


# ---- optimum-neuron's sharding (transformations_utils.py), one rank at a time ----
def create_local_weight(full, dim, per_partition, stride, rank, tp):
    """NxD parallel_layers/layers.py create_local_weight."""
    pieces = torch.split(full, per_partition // stride, dim=dim)
    return torch.cat(pieces[rank::tp], dim=dim).clone()


def create_local_weight_with_padding(full, dim, stride, rank, tp):
    split_len = (full.shape[dim] + tp - 1) // tp
    return create_local_weight(full, dim, split_len, stride, rank, tp)


def create_local_fused_weight(rank, tp, weights, partition_dim, fuse_axis):
    lists = [torch.split(w, w.size(partition_dim) // tp, dim=partition_dim)[rank::tp] for w in weights]
    return torch.cat([torch.cat(wl, dim=partition_dim) for wl in lists], dim=fuse_axis).clone()


def compute_query_indices_for_rank(tp, rank, H, KV, m):
    """GQAQKVColumnParallelLinearSpec.compute_query_indices_for_rank."""
    hpr = H // tp
    kvpr = (KV * m) // tp
    qgs = H // KV
    qgspr = hpr // kvpr
    queries = [torch.arange(qgspr) for _ in range(kvpr)]
    keys = torch.repeat_interleave(torch.arange(KV).repeat(m), hpr // kvpr)
    keys = torch.chunk(keys, tp)
    shift_per_key = torch.arange(0, H, qgs)
    within = torch.arange(0, qgs, qgspr)
    within = torch.repeat_interleave(within, (KV // kvpr) * hpr)
    within = torch.chunk(within, tp)
    out = []
    for idx, q in enumerate(queries):
        s = slice(idx * qgspr, (idx + 1) * qgspr)
        out.append(q + shift_per_key[keys[rank][s]] + within[rank][s])
    return torch.cat(out, dim=0)


def q_or_o_local(w, H, KV, m, kind, rank, tp):
    if kind == "query":
        hidden, hd = w.size(1), w.size(0) // H
    else:
        hidden, hd = w.size(0), w.size(1) // H
        w = w.transpose(0, 1)
    idx = compute_query_indices_for_rank(tp, rank, H, KV, m)
    s = w.reshape(H, hd, hidden)[idx].reshape(-1, hidden)
    return (s.transpose(0, 1) if kind == "output" else s).contiguous().clone()


def kv_local(w, m, out_per_partition, rank, tp):
    rep = w.repeat(m, 1)
    return torch.cat(torch.split(rep, out_per_partition, dim=0)[rank::tp], dim=0).clone()


def tp_attrs(dim, stride, tp):
    return {"tensor_model_parallel": True, "partition_dim": dim, "partition_stride": stride, "num_partitions": tp}


def build(ref, tp, fuse_qkv, kv_mult, c=None):
    """Per rank state dicts (parameter order of the training model) and the metadata; c: the config
    (default: CONFIG as it is when called; tests/e2e/test_nxd_out.sh sets it)."""
    c = CONFIG if c is None else c
    H, KV, hd, inter = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["intermediate_size"]
    qkv_linear = KV < tp or KV % tp != 0
    m = (kv_mult or max(1, tp // KV)) if qkv_linear else 1
    ranks = [collections.OrderedDict() for _ in range(tp)]
    params = collections.OrderedDict()
    specs = []

    def put(name, fn, attrs):
        for r in range(tp):
            ranks[r][name] = fn(r)
        params[name] = attrs

    put("model.embed_tokens.weight",
        lambda r: create_local_weight_with_padding(ref["model.embed_tokens.weight"], 0, 1, r, tp), tp_attrs(0, 1, tp))
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn"
        q, k, v, o = (ref[f"{a}.{x}_proj.weight"] for x in "qkvo")
        if qkv_linear:
            q_out, kv_out = H * hd // tp, KV * hd * m // tp
            if fuse_qkv:
                put(a + ".qkv_proj.weight_qkv", lambda r: torch.cat(
                    [q_or_o_local(q, H, KV, m, "query", r, tp), kv_local(k, m, kv_out, r, tp),
                     kv_local(v, m, kv_out, r, tp)], dim=0), {"tensor_model_parallel": False})
            else:
                put(a + ".qkv_proj.weight_q", lambda r: q_or_o_local(q, H, KV, m, "query", r, tp), tp_attrs(0, 1, tp))
                put(a + ".qkv_proj.weight_k", lambda r: kv_local(k, m, kv_out, r, tp), tp_attrs(0, 1, tp))
                put(a + ".qkv_proj.weight_v", lambda r: kv_local(v, m, kv_out, r, tp), tp_attrs(0, 1, tp))
            put(a + ".o_proj.weight", lambda r: q_or_o_local(o, H, KV, m, "output", r, tp), tp_attrs(1, 1, tp))
            spec = ["GQAQKVColumnParallelLinearSpec", {
                "gqa_qkv_projection_name": "qkv_proj", "query_projection_name": "q_proj",
                "key_projection_name": "k_proj", "value_projection_name": "v_proj",
                "output_projection_name": "o_proj", "num_attention_heads": H, "num_key_value_heads": KV,
                "kv_size_multiplier": m, "q_output_size_per_partition": q_out,
                "kv_output_size_per_partition": kv_out, "fuse_qkv": fuse_qkv, "bias": False, "tp_size": tp,
                "peft_type": None}]
            specs.append({"module_fully_qualified_name": a, "specs": [spec]})
        elif fuse_qkv and H == KV:  # a ColumnParallelLinear qkv_proj of stride 3 with a FusedLinearsSpec
            put(a + ".qkv_proj.weight", lambda r: create_local_fused_weight(r, tp, [q, k, v], 0, 0), tp_attrs(0, 3, tp))
            put(a + ".o_proj.weight", lambda r: create_local_weight_with_padding(o, 1, 1, r, tp), tp_attrs(1, 1, tp))
            specs.append({"module_fully_qualified_name": a, "specs": [["FusedLinearsSpec", {
                "fused_linear_name": "qkv_proj", "linear_names": ["q_proj", "k_proj", "v_proj"], "bias": False,
                "fuse_axis": 0, "original_dims": [H * hd] * 3, "tp_size": tp, "peft_type": None}]]})
        else:
            for x, w in (("q", q), ("k", k), ("v", v)):
                put(f"{a}.{x}_proj.weight", lambda r, w=w: create_local_weight_with_padding(w, 0, 1, r, tp),
                    tp_attrs(0, 1, tp))
            put(a + ".o_proj.weight", lambda r: create_local_weight_with_padding(o, 1, 1, r, tp), tp_attrs(1, 1, tp))
            specs.append({"module_fully_qualified_name": a, "specs": []})
        if c["model_type"] == "qwen3":  # modeling_qwen3.py Qwen3Attention: q_norm, k_norm after o_proj
            for n in ("q_norm", "k_norm"):
                put(f"{a}.{n}.weight", lambda r, n=n: ref[f"{a}.{n}.weight"].clone(), {"tensor_model_parallel": False})
        if c["model_type"] == "mixtral":
            # modules/moe: router.linear_router an nn.Linear (replicated); experts.py ExpertFusedColumnParallelLinear
            # gate_up_proj [experts, hidden, 2I/tp] (stride 2 on axis 2) and ExpertFusedRowParallelLinear down_proj
            # [experts, I/tp, hidden] (moe_parallel_layers.py); the experts split across ep ranks in save()
            x = p + "mlp.expert_mlps.mlp_op."
            put(p + "mlp.router.linear_router.weight", lambda r: ref[p + "mlp.router.linear_router.weight"].clone(),
                {"tensor_model_parallel": False})
            put(x + "gate_up_proj.weight", lambda r: create_local_weight(ref[x + "gate_up_proj.weight"], 2,
                                                                         2 * inter // tp, 2, r, tp), tp_attrs(2, 2, tp))
            put(x + "down_proj.weight", lambda r: create_local_weight(ref[x + "down_proj.weight"], 1, inter // tp, 1, r, tp),
                tp_attrs(1, 1, tp))
            specs.append({"module_fully_qualified_name": p + "mlp", "specs": []})
            for n in ("input_layernorm", "post_attention_layernorm"):
                put(f"{p}{n}.weight", lambda r, n=n: ref[f"{p}{n}.weight"].clone(), {"tensor_model_parallel": False})
            continue
        gate, up, down = (ref[f"{p}mlp.{x}_proj.weight"] for x in ("gate", "up", "down"))
        put(p + "mlp.gate_up_proj.weight", lambda r: create_local_fused_weight(r, tp, [gate, up], 0, 0),
            tp_attrs(0, 2, tp))
        put(p + "mlp.down_proj.weight", lambda r: create_local_weight_with_padding(down, 1, 1, r, tp),
            tp_attrs(1, 1, tp))
        specs.append({"module_fully_qualified_name": p + "mlp", "specs": [["FusedLinearsSpec", {
            "fused_linear_name": "gate_up_proj", "linear_names": ["gate_proj", "up_proj"], "bias": False,
            "fuse_axis": 0, "original_dims": [inter, inter], "tp_size": tp, "peft_type": None}]]})
        for n in ("input_layernorm", "post_attention_layernorm"):
            put(f"{p}{n}.weight", lambda r, n=n: ref[f"{p}{n}.weight"].clone(), {"tensor_model_parallel": False})
    put("model.norm.weight", lambda r: ref["model.norm.weight"].clone(), {"tensor_model_parallel": False})
    put("lm_head.weight", lambda r: create_local_weight_with_padding(ref["lm_head.weight"], 0, 1, r, tp),
        tp_attrs(0, 1, tp))
    return ranks, params, specs, m


def stage_of(name, pp, layers):
    """NxD pipeline/partition.py create_partitions: layers // pp decoder layers per stage, one more for each of
    the last layers % pp stages; the embedding in the first stage, the final norm and lm_head in the last."""
    if name.startswith("model.layers."):
        i, end = int(name.split(".")[2]), 0
        for s in range(pp):
            end += layers // pp + (s >= pp - layers % pp)
            if i < end:
                return s
    return 0 if name.startswith("model.embed_tokens") else pp - 1


# ---- the save (NxD trainer/checkpoint.py) ----
def xser_modules():
    """torch_xla.utils.serialization.TensorReference, for pickling only (what the .pt names)."""
    names = ["torch_xla", "torch_xla.utils", "torch_xla.utils.serialization"]
    for n in names:
        sys.modules.setdefault(n, types.ModuleType(n))

    class TensorReference(object):
        def __init__(self, tid):
            self.tid = tid
    TensorReference.__module__ = "torch_xla.utils.serialization"
    TensorReference.__qualname__ = "TensorReference"
    sys.modules["torch_xla.utils.serialization"].TensorReference = TensorReference
    return TensorReference


def write_shards(shards, ranks, params, specs, tp, pp, xser, layers, prefix="", ep=1):
    """save_checkpoint(tag=shards) of per rank state dicts, with create_parameter_metadata per stage;
    prefix: what the parameter names carry before the model's own ("base_model.model." for a PEFT model)."""
    os.makedirs(os.path.join(shards, "model"), exist_ok=True)
    TensorReference = xser_modules() if xser else None
    for s in range(pp):
        names = [n for n in params if stage_of(n[len(prefix):], pp, layers) == s]
        stage_specs = []
        for sp in specs:  # to_metadata keeps the specs relevant to the stage's parameters
            mod = sp["module_fully_qualified_name"]
            keep = [x for x in sp["specs"] if any(n.startswith(mod + ".") for n in names)]
            stage_specs.append({"module_fully_qualified_name": mod, "specs": keep})
        meta = {"parameters": {n: params[n] for n in names}, "model_weight_transformation_specs": stage_specs}
        with open(os.path.join(shards, f"mp_metadata_pp_rank_{s}.json"), "w") as f:
            f.write(json.dumps(meta, indent=4))
        saved = [remove_adapter_name(n) for n in names]
        for e, r in ((e, r) for e in range(ep) for r in range(tp)):
            # expert parallelism (ep > 1, _get_path(ep=True)): ep rank e holds experts e*E/ep.. of each
            # expert_mlps parameter (axis 0), as checkpoint_converter.py's convert_full_state_to_tp narrows them
            is_ep = lambda n: ep > 1 and "expert_mlps" in n
            local = lambda n, t: t.narrow(0, t.shape[0] // ep * e, t.shape[0] // ep).clone() if is_ep(n) else t
            sd = collections.OrderedDict((n, local(n, ranks[r][n])) for n in saved if n in ranks[r])
            name = "dp_rank_00" + ("_ep_rank_{:02d}".format(e) if ep > 1 else "") + "_tp_rank_{:02d}_pp_rank_{:02d}.pt"
            path = os.path.join(shards, "model", name.format(r, s))
            if not xser:
                torch.save(sd, path)
                continue
            folder = path + ".tensors"
            os.makedirs(folder, exist_ok=True)
            refs, info = collections.OrderedDict(), {}
            for tid, (n, t) in enumerate(sd.items()):
                if e == 0 or is_ep(n):  # _xser_save_data: ep ranks > 0 write only their expert-parallel tensors
                    torch.save(t, os.path.join(folder, "tensor_{}.pt".format(tid)))
                refs[n] = TensorReference(tid)
                info[tid] = {"dtype": t.dtype, "shape": t.shape, "expert_model_parallel": is_ep(n)}
            torch.save(refs, path)
            torch.save(info, path + ".info.pt")
    with open(os.path.join(shards, "done"), "w") as f:
        f.write("1")


def remove_adapter_name(name):
    """transformations_utils.py remove_adapter_name (LORA_PATTERN): the adapter name after lora_A / lora_B dropped,
    as get_peft_model_state_dict saves the parameters."""
    return re.sub(r"(?P<q>(\w+\.)+?lora_(embedding_)?(A|B))\.(?P<a>\w+)(?P<r>(\.{0,1}\w+\.?)+)?", r"\g<q>\g<r>", name)


def no_decay(name, model_type):
    """Not in NeuronTrainer.get_decay_parameter_names: get_parameter_names(model, ALL_LAYERNORM_LAYERS, ["bias",
    "layernorm", "rmsnorm"]) drops a name the patterns match (lowercased) and the parameters of modules whose class
    is in ALL_LAYERNORM_LAYERS (nn.LayerNorm, and LlamaRMSNorm: llama/modeling_llama.py appends it). LlamaRMSNorm
    modules: every decoder layer's input_layernorm / post_attention_layernorm and, in Llama, model.norm (Qwen3's
    model.norm, q_norm and k_norm are Qwen3RMSNorm, not in the list)."""
    module_is_llama_norm = (name.endswith("_layernorm.weight") or
                            (name == "model.norm.weight" and model_type in ("llama", "granite")))
    return any(p in name.lower() for p in ("bias", "layernorm", "rmsnorm")) or module_is_llama_norm


def xser_save(obj, path, TensorReference):
    """_xser_save_data + _extract_tensor_info_and_update_state_dict of a nested dict: each tensor its own
    <path>.tensors/tensor_<tid>.pt, the dict saved with TensorReference(tid) records and <path>.info.pt."""
    folder = path + ".tensors"
    os.makedirs(folder, exist_ok=True)
    info, count = {}, [0]

    def walk(d):
        out = type(d)()
        for k, v in d.items():
            if isinstance(v, dict):
                out[k] = walk(v)
            elif isinstance(v, torch.Tensor):
                tid = count[0]; count[0] += 1
                torch.save(v, os.path.join(folder, "tensor_{}.pt".format(tid)))
                info[tid] = {"dtype": v.dtype, "shape": v.shape, "expert_model_parallel": False}
                out[k] = TensorReference(tid)
            else:
                out[k] = v
        return out
    torch.save(walk(obj), path)
    torch.save(info, path + ".info.pt")


def write_optim(out, ref, cfg, tp, pp, xser, fuse_qkv, kv_mult, mode, dp, no_state=None, master_weights=False,
                param_names=False):
    """save_checkpoint's optimizer files (see the module's doc) of an AdamW at step 7 whose slots are random F32
    values, written in the original names to <out>-state-ref/optimizer.safetensors (beside a copy of the model: the
    training state ckpt should make of the save). no_state: a parameter in the groups without a state (no gradient
    yet); master_weights: ZeRO-1's save_master_weights (sharded_master_weights, each chunk of the weight in F32);
    param_names: an optimizer given named parameters, which torch >= 2.6 keeps as each group's "param_names" — here
    in groups the trainer would not make (no decay first), so only the names can place them."""
    g = torch.Generator().manual_seed(17)
    slots = ("exp_avg", "exp_avg_sq")
    slot_ref = {s: collections.OrderedDict((n, torch.randn(t.shape, generator=g, dtype=torch.float32)) for n, t in ref.items())
                for s in slots}
    os.makedirs(out + "-state-ref", exist_ok=True)
    write_safetensors(out + "-state-ref/optimizer.safetensors",
                      {f"{n}/{s}": slot_ref[s][n] for s in slots for n in ref if n != no_state})
    write_safetensors(out + "-state-ref/model.safetensors", ref)
    sharded = {s: build(slot_ref[s], tp, fuse_qkv, kv_mult, cfg)[0] for s in slots}
    params = build(ref, tp, fuse_qkv, kv_mult, cfg)[1]
    folder = os.path.join(out, "shards", "optim")
    os.makedirs(folder, exist_ok=True)
    TensorReference = xser_modules() if xser else None
    hyper = {"lr": 5e-05, "betas": (0.9, 0.999), "eps": 1e-08, "amsgrad": False, "foreach": None, "maximize": False,
             "capturable": False, "differentiable": False, "fused": None}
    for s in range(pp):
        names = [n for n in params if stage_of(n, pp, cfg["num_hidden_layers"]) == s]
        decay = [n for n in names if not no_decay(n, cfg["model_type"])]
        order = decay + [n for n in names if no_decay(n, cfg["model_type"])]
        groups = [dict(hyper, weight_decay=0.01, params=list(range(len(decay)))),
                  dict(hyper, weight_decay=0.0, params=list(range(len(decay), len(order))))]
        if param_names:
            nodecay = [n for n in names if no_decay(n, cfg["model_type"])]
            order = nodecay + decay
            groups = [dict(hyper, weight_decay=0.0, params=list(range(len(nodecay))), param_names=nodecay),
                      dict(hyper, weight_decay=0.01, params=list(range(len(nodecay), len(order))), param_names=decay)]
        for r in range(tp):
            for d in range(dp if mode == "zero1" else 1):
                def chunk(t):  # ZeroRedundancyOptimizer._shard_tensor
                    if mode != "zero1":
                        return t
                    if t.shape[0] % dp:
                        t = torch.nn.functional.pad(t, [0, 0] * (t.dim() - 1) + [0, dp - t.shape[0] % dp])
                    return t.chunk(dp)[d].clone()
                st = {i: {"step": torch.tensor(7.0), **{sl: chunk(sharded[sl][r][n]) for sl in slots}}
                      for i, n in enumerate(order) if n != no_state}
                if mode == "zero1":
                    sd = {"state": {}, "param_groups": groups, "base_state": st,
                          "shape_info": {i: sharded[slots[0]][r][n].shape for i, n in enumerate(order)}}
                    if master_weights:
                        w = build(ref, tp, fuse_qkv, kv_mult, cfg)[0][r]
                        sd["sharded_master_weights"] = {i: chunk(w[n].float()) for i, n in enumerate(order)}
                else:
                    sd = {"state": st, "param_groups": groups}
                path = os.path.join(folder, "dp_rank_{:02d}_tp_rank_{:02d}_pp_rank_{:02d}.pt".format(d, r, s))
                if xser:
                    xser_save(sd, path, TensorReference)
                else:
                    torch.save(sd, path)


def save(ref_dir, out, tp, pp, xser, fuse_qkv, kv_mult, ep=1, optim=None, dp=1, no_state=None, master_weights=False,
         param_names=False):
    ref = read_safetensors(os.path.join(ref_dir, "model.safetensors"))
    with open(os.path.join(ref_dir, "config.json")) as f:
        cfg = json.load(f)
    ranks, params, specs, m = build(ref, tp, fuse_qkv, kv_mult, cfg)
    write_shards(os.path.join(out, "shards"), ranks, params, specs, tp, pp, xser, cfg["num_hidden_layers"], ep=ep)
    if optim:
        write_optim(out, ref, cfg, tp, pp, xser, fuse_qkv, kv_mult, optim, dp, no_state, master_weights, param_names)
    with open(os.path.join(ref_dir, "config.json")) as f:
        cfg = f.read()
    with open(os.path.join(out, "config.json"), "w") as f:
        f.write(cfg)
    trn = {"tensor_parallel_size": tp, "sequence_parallel_enabled": False, "kv_size_multiplier": kv_mult,
           "pipeline_parallel_size": pp, "virtual_pipeline_parallel_size": 1, "pipeline_parallel_num_microbatches": 1,
           "pipeline_parallel_use_zero1_optimizer": False, "gradient_checkpointing": False, "checkpoint_dir": None,
           "num_local_ranks_per_step": 8, "use_xser": xser, "async_save": False, "fuse_qkv": fuse_qkv,
           "recompute_causal_mask": True, "transpose_nki_inputs": True}
    with open(os.path.join(out, "trn_config.json"), "w") as f:
        f.write(json.dumps(trn, indent=4))
    return m


# ---- a PEFT LoRA adapter and its save (optimum/neuron/peft) ----
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(ref_dir, out, r=4, targets=LORA_TARGETS):
    """A PEFT LoRA adapter of REF on every linear of the decoder layers (bf16, r 4, alpha 8), as optimum-neuron trains
    one: a fused linear has one lora_A (_lora_adapt_state_dict takes the members' mean), so q/k/v share theirs and
    gate/up theirs — what _lora_to_original_weights gives back for each member."""
    ref = read_safetensors(os.path.join(ref_dir, "model.safetensors"))
    g = torch.Generator().manual_seed(23)
    rnd = lambda *shape: torch.randn(shape, generator=g).to(torch.bfloat16)
    tensors = {}
    for name, w in ref.items():
        mod, leaf = name.rsplit(".", 1)
        short = mod.rsplit(".", 1)[-1]
        if leaf != "weight" or short not in targets:
            continue
        group = {"q_proj": "q_proj", "k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}.get(short, short)
        shared = "base_model.model." + mod.rsplit(".", 1)[0] + "." + group + ".lora_A.weight"
        if shared not in tensors:
            tensors[shared] = rnd(r, w.shape[1])
        tensors["base_model.model." + mod + ".lora_A.weight"] = tensors[shared].clone()
        tensors["base_model.model." + mod + ".lora_B.weight"] = rnd(w.shape[0], r)
    os.makedirs(out, exist_ok=True)
    write_safetensors(os.path.join(out, "adapter_model.safetensors"), tensors)
    config = {
        "alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": ref_dir, "bias": "none",
        "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True, "layers_pattern": None,
        "layers_to_transform": None, "loftq_config": {}, "lora_alpha": 8, "lora_dropout": 0.05,
        "megatron_config": None, "megatron_core": "megatron.core", "modules_to_save": None, "peft_type": "LORA",
        "r": r, "rank_pattern": {}, "revision": None, "target_modules": list(targets), "task_type": "CAUSAL_LM",
        "use_dora": False, "use_rslora": False}
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def save_adapter(ref_dir, ad_dir, out, tp, pp, xser, fuse_qkv, kv_mult):
    """NeuronPeftModel.save_pretrained (peft/peft_model.py) of the adapter in AD_DIR on REF's training model:
    OUT/adapter_default/adapter_shards/... and adapter_config.json. The metadata is create_parameter_metadata of
    the PEFT model (every parameter, "base_model.model." before it, a LoRA module's own weights under base_layer,
    its lora_A / lora_B after them, the specs' peft_type "lora"); each rank file holds only the LoRA weights
    (get_peft_model_state_dict), sharded as peft/tuners/lora/layer.py makes them and the specs'
    _lora_adapt_state_dict places them: lora_A replicated and lora_B column-parallel on a column-parallel base
    (lora_B fused and split like the base weight for gate_up_proj and qkv_proj, through the GQA placement for
    GQAQKVColumnParallelLinear), lora_A row-parallel and lora_B replicated on a row-parallel base (o_proj's lora_A
    permuted like o_proj under GQA)."""
    ref = read_safetensors(os.path.join(ref_dir, "model.safetensors"))
    ad = read_safetensors(os.path.join(ad_dir, "adapter_model.safetensors"))
    with open(os.path.join(ref_dir, "config.json")) as f:
        c = json.load(f)
    _, params, specs, m = build(ref, tp, fuse_qkv, kv_mult, c)
    H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    kv_out = KV * hd * m // tp
    A = lambda mod: ad[f"base_model.model.{mod}.lora_A.weight"]
    has = lambda mod: f"base_model.model.{mod}.lora_A.weight" in ad  # a module the adapter targets
    B = lambda mod: ad[f"base_model.model.{mod}.lora_B.weight"]
    P = "base_model.model."
    ranks = [collections.OrderedDict() for _ in range(tp)]
    meta = collections.OrderedDict()

    def put(name, fn, attrs):
        meta[P + name] = attrs
        for r in range(tp):
            ranks[r][remove_adapter_name(P + name)] = fn(r)

    modules = collections.OrderedDict()
    for n, attrs in params.items():
        mod, leaf = n.rsplit(".", 1)
        modules.setdefault(mod, []).append((leaf, attrs))
    for mod, leaves in modules.items():
        parent, short = mod.rsplit(".", 1) if "." in mod else ("", mod)
        first = {"qkv_proj": "q_proj", "gate_up_proj": "gate_proj"}.get(short, short)  # a fused linear: its first member
        if short not in ("qkv_proj", "q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj") or \
                not has(parent + "." + first):
            for leaf, attrs in leaves:
                meta[P + mod + "." + leaf] = attrs
            continue
        for leaf, attrs in leaves:
            meta[P + mod + ".base_layer." + leaf] = attrs
        la, lb = mod + ".lora_A.default.weight", mod + ".lora_B.default.weight"
        if short == "qkv_proj" and "weight" not in dict(leaves):  # GQAQKVColumnParallelLinear
            q, k, v = (parent + "." + x for x in ("q_proj", "k_proj", "v_proj"))
            put(la, lambda r: A(q).clone(), {"tensor_model_parallel": False})
            parts = lambda r: [q_or_o_local(B(q), H, KV, m, "query", r, tp), kv_local(B(k), m, kv_out, r, tp),
                               kv_local(B(v), m, kv_out, r, tp)]
            if fuse_qkv:
                put(lb + "_qkv", lambda r: torch.cat(parts(r), dim=0), {"tensor_model_parallel": False})
            else:
                for i, x in enumerate("qkv"):
                    put(lb + "_" + x, lambda r, i=i: parts(r)[i], tp_attrs(0, 1, tp))
        elif short in ("qkv_proj", "gate_up_proj"):  # a ColumnParallelLinear with a FusedLinearsSpec
            members = ("q_proj", "k_proj", "v_proj") if short == "qkv_proj" else ("gate_proj", "up_proj")
            ws = [B(parent + "." + x) for x in members]
            put(la, lambda r: A(parent + "." + members[0]).clone(), {"tensor_model_parallel": False})
            put(lb, lambda r: create_local_fused_weight(r, tp, ws, 0, 0), tp_attrs(0, 1, tp))
        elif short in ("q_proj", "k_proj", "v_proj"):
            put(la, lambda r: A(mod).clone(), {"tensor_model_parallel": False})
            put(lb, lambda r: create_local_weight_with_padding(B(mod), 0, 1, r, tp), tp_attrs(0, 1, tp))
        else:  # o_proj, down_proj: RowParallelLinear
            # o_proj's lora_A takes the GQA query-head order only through the spec's _lora_adapt_state_dict, that
            # is when the GQA linear carries a LoRA too; else create_local_weight_with_padding of adapt_state_dict
            gqa = short == "o_proj" and has(parent + ".q_proj") and any(
                s["module_fully_qualified_name"] == parent and s["specs"] and
                s["specs"][0][0] == "GQAQKVColumnParallelLinearSpec" for s in specs)
            put(la, lambda r: q_or_o_local(A(mod), H, KV, m, "output", r, tp) if gqa else
                create_local_weight_with_padding(A(mod), 1, 1, r, tp), tp_attrs(1, 1, tp))
            put(lb, lambda r: B(mod).clone(), {"tensor_model_parallel": False})
    pspecs = []
    for sp in specs:  # guess_peft_type: "lora" when the spec's fused linear carries a LoRA
        mod = sp["module_fully_qualified_name"]
        lora = lambda f: "lora" if has(mod + "." + f.get("query_projection_name", (f.get("linear_names") or [""])[0])) else None
        pspecs.append({"module_fully_qualified_name": P + mod,
                       "specs": [[cls, dict(f, peft_type=lora(f))] for cls, f in sp["specs"]]})
    folder = os.path.join(out, "adapter_default")
    write_shards(os.path.join(folder, "adapter_shards"), ranks, meta, pspecs, tp, pp, xser, c["num_hidden_layers"], P)
    with open(os.path.join(ad_dir, "adapter_config.json")) as f:
        text = f.read()
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        f.write(text)


def damage(out, what):
    """Breaks a save the way the hostile tests need (test_nxd.sh)."""
    model = os.path.join(out, "shards", "model")
    rank = lambda r: os.path.join(model, "dp_rank_00_tp_rank_{:02d}_pp_rank_00.pt".format(r))
    kind, _, arg = what.partition(":")
    if kind == "norm":  # a replicated parameter that differs on rank 2 (plain)
        sd = torch.load(rank(2)); sd["model.layers.1.input_layernorm.weight"][5] += 1; torch.save(sd, rank(2))
    elif kind == "shape":  # a rank tensor of another shape (plain)
        sd = torch.load(rank(1))
        sd["model.layers.1.mlp.down_proj.weight"] = sd["model.layers.1.mlp.down_proj.weight"][:, :16].clone()
        torch.save(sd, rank(1))
    elif kind == "kv":  # a KV replica that differs (xser; rows 16..23 of rank 2's weight_qkv: its K head)
        p = f"{rank(2)}.tensors/tensor_{torch.load(rank(2))['model.layers.0.self_attn.qkv_proj.weight_qkv'].tid}.pt"
        t = torch.load(p); t[16 + 3, 7] += 1; torch.save(t, p)
    elif kind == "info":  # an .info.pt entry that disagrees with its tensor file
        info = torch.load(rank(1) + ".info.pt"); info[2]["shape"] = torch.Size([64, 99]); torch.save(info, rank(1) + ".info.pt")
    elif kind == "lora_a":  # a replicated lora_A that differs on rank 2 (a plain adapter save)
        p = os.path.join(out, "adapter_default", "adapter_shards", "model", "dp_rank_00_tp_rank_02_pp_rank_00.pt")
        sd = torch.load(p); sd["base_model.model.model.layers.1.mlp.gate_up_proj.lora_A.weight"][1, 3] += 1
        torch.save(sd, p)
    elif kind.startswith("optim_"):  # the optimizer files (plain, or zero1 with dp 2)
        optim = lambda d, r: os.path.join(out, "shards", "optim", "dp_rank_{:02d}_tp_rank_{:02d}_pp_rank_00.pt".format(d, r))
        if kind == "optim_dp":  # dp rank 1's file of tp rank 1 is missing
            os.remove(optim(1, 1))
            return
        sd = torch.load(optim(0, 1))
        if kind == "optim_groups":  # the first no-decay parameter moved to the decay group (indices still in order)
            sd["param_groups"][0]["params"].append(sd["param_groups"][1]["params"].pop(0))
        elif kind == "optim_norm":  # model.norm.weight's exp_avg (replicated) differs on tp rank 1
            i = len(sd["param_groups"][0]["params"]) + len(sd["param_groups"][1]["params"]) - 1
            sd["state"][i]["exp_avg"][3] += 1
        elif kind == "optim_names":  # (with --param-names) two names swapped on tp rank 1
            g = sd["param_groups"][1]["param_names"]
            g[0], g[1] = g[1], g[0]
        elif kind == "optim_shape":  # index 1's exp_avg narrower
            sd["state"][1]["exp_avg"] = sd["state"][1]["exp_avg"][:, :8].clone()
        torch.save(sd, optim(0, 1))
    elif kind == "evil":  # a reference file whose pickle calls os.system
        class Evil:
            def __reduce__(self):
                return (os.system, ("touch " + arg,))
        torch.save({"model.embed_tokens.weight": Evil()}, rank(0))
    else:
        sys.exit(f"unknown damage {what}")


def run_save(ref, b):
    if not b.adapter:
        return save(ref, b.out, b.tp, b.pp, b.xser, b.fuse_qkv, b.kv_size_multiplier, b.ep, b.optim, b.dp, b.no_state,
                    b.master_weights, b.param_names)
    targets = b.lora_targets.split(",")
    ad = ref + "-adapter" + ("" if targets == LORA_TARGETS else "-" + "-".join(targets))
    if not os.path.exists(os.path.join(ad, "adapter_model.safetensors")):
        make_adapter(ref, ad, targets=targets)
    save_adapter(ref, ad, b.out, b.tp, b.pp, b.xser, b.fuse_qkv, b.kv_size_multiplier)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("ref")
    r.add_argument("out")
    s = sub.add_parser("save")
    s.add_argument("ref")
    s.add_argument("out")
    s.add_argument("--tp", type=int, required=True)
    s.add_argument("--pp", type=int, default=1)
    s.add_argument("--xser", action="store_true")
    s.add_argument("--fuse-qkv", action="store_true")
    s.add_argument("--kv-size-multiplier", type=int, default=None)
    s.add_argument("--rowids", action="store_true", help="(saves) from REF-rows, whose values are row numbers")
    s.add_argument("--mha", action="store_true", help="(saves) from REF-mha, whose KV heads are its 8 query heads")
    s.add_argument("--qwen3", action="store_true", help="(saves) from REF-qwen3, a Qwen3 (q_norm, k_norm)")
    s.add_argument("--ep", type=int, default=1, help="expert-parallel ranks (with --moe)")
    s.add_argument("--moe", action="store_true", help="(saves) from REF-moe, a Mixtral with neuronx-distributed's MoE")
    s.add_argument("--adapter", action="store_true",
                   help="save REF-adapter (a PEFT LoRA of REF, made when missing) as SAVE/adapter_default instead")
    s.add_argument("--lora-targets", default=",".join(LORA_TARGETS),
                   help="(with --adapter) the adapter's target_modules; REF-adapter-<targets> unless all")
    s.add_argument("--optim", choices=("plain", "zero1"), default=None, help="save an AdamW's state too")
    s.add_argument("--dp", type=int, default=1, help="(with --optim zero1) the data-parallel ranks sharing it")
    s.add_argument("--no-state", default=None, help="(with --optim) this parameter has no optimizer state")
    s.add_argument("--master-weights", action="store_true", help="(with --optim zero1) sharded_master_weights too")
    s.add_argument("--param-names", action="store_true", help="(with --optim) groups with param_names (torch >= 2.6)")
    s.add_argument("--damage", default=None, help="norm, shape, kv, info, lora_a, optim_groups, optim_names, optim_shape, optim_dp, "
                   "optim_norm or evil:MARKER (the hostile tests)")
    m = sub.add_parser("saves")
    m.add_argument("ref")
    m.add_argument("specs", nargs="+")
    a = ap.parse_args()
    if a.cmd == "ref":
        make_ref(a.out)
    elif a.cmd == "save":
        run_save(a.ref, a)
        if a.damage:
            xser_modules()
            damage(a.out, a.damage)
    else:
        if not os.path.exists(os.path.join(a.ref, "model.safetensors")):
            make_ref(a.ref)
        for spec in a.specs:
            b = ap.parse_args(["save", a.ref] + shlex.split(spec))
            ref = a.ref + ("-rows" if b.rowids else "") + ("-mha" if b.mha else "") + ("-qwen3" if b.qwen3 else "") + \
                ("-moe" if b.moe else "")
            if not os.path.exists(os.path.join(ref, "model.safetensors")):
                make_ref(ref, rowids=b.rowids, mha=b.mha, qwen3=b.qwen3, moe=b.moe)
            run_save(ref, b)
            if b.damage:
                xser_modules()
                damage(b.out, b.damage)


if __name__ == "__main__":
    main()

/*
 * nxd.h — an optimum-neuron / neuronx-distributed training save, read in
 * place (docs/layouts.md, "NxD checkpoints in").
 *
 * What NeuronModelMixin.save_pretrained (optimum-neuron,
 * optimum/neuron/models/training/modeling_utils.py) leaves in SAVE, through
 * neuronx-distributed's trainer/checkpoint.py save_checkpoint(SAVE, tag="shards"):
 *
 *   SAVE/config.json, SAVE/trn_config.json
 *   SAVE/shards/done                           "1", written last (CheckpointIOState.end)
 *   SAVE/shards/mp_metadata_pp_rank_N.json     per pipeline stage: create_parameter_metadata
 *                                              (transformations_utils.py): "parameters" (per name
 *                                              tensor_model_parallel, partition_dim, partition_stride,
 *                                              num_partitions) and "model_weight_transformation_specs"
 *   SAVE/shards/model/dp_rank_00[_ep_rank_EE]_tp_rank_TT_pp_rank_PP.pt   (_get_path("model", ep=...))
 *   SAVE/shards/optim/...                      the optimizer (nxd_optim.h)
 *
 * With expert parallelism (ep > 1) the files carry _ep_rank_EE_ and on ep
 * ranks > 0 an xser save holds only the expert-parallel tensors (nxd_expert_param).
 *
 * A rank file is either a torch.save of the rank's state dict, or with xser
 * (_xser_save_data, _extract_tensor_info_and_update_state_dict) a torch.save
 * of the same dict whose values are torch_xla.utils.serialization
 * TensorReference(tid) records, each tensor being its own torch.save in
 * "<file>.pt.tensors/tensor_<tid>.pt" and "<file>.pt.info.pt" mapping tid to
 * {"dtype", "shape", "expert_model_parallel"} (checked against the tensor
 * files when present: versions <= 0.6 wrote none).
 *
 * nxd_open takes SAVE or SAVE/shards. It checks the done marker, that every
 * (pp, ep, tp) rank file exists (degrees from the file names, cross-checked
 * with num_partitions/tp_size in the metadata and trn_config.json), that all
 * ranks use one serialisation, and reads every rank's tensor table (names,
 * dtypes, shapes, absolute byte offsets in the .pt or tensor_<tid>.pt files)
 * without reading a tensor byte. Errors name the file, the rank and the
 * parameter.
 */
#ifndef CKPT_FORMAT_NXD_H
#define CKPT_FORMAT_NXD_H

#include "format/checkpoint.h"
#include "format/pickle.h"

#include <jansson.h>
#include <stdbool.h>

#define NXD_MAX_DEGREE 1024
#define NXD_META_MAX_BYTES (256u << 20)
#define NXD_MAX_TID (1 << 24)

typedef struct {
    int tp, pp, ep;     /* this file's coordinates */
    char *path;         /* the .pt file */
    ckpt_checkpoint ck; /* its tensors: the .pt itself, or one tensor_<tid>.pt per tensor (xser; on ep rank > 0
                         * only the expert-parallel ones, the only ones _xser_save_data writes there) */
    json_t *ep_params;  /* xser: the parameters .info.pt flags expert_model_parallel (a set), else NULL */
} nxd_rank;

typedef struct {
    char *shards;      /* the shards/ folder */
    char *root;        /* the folder holding it (config.json, trn_config.json), or NULL */
    int tp, pp, ep;    /* degrees */
    bool has_ep;       /* the file names carry _ep_rank_ */
    bool xser;
    bool has_optim;    /* shards/optim exists */
    bool adapter;      /* a PEFT adapter save: SAVE/adapter_<name>/adapter_shards (optimum/neuron/peft/peft_model.py) */
    json_t **meta;     /* pp entries: mp_metadata_pp_rank_N.json */
    char **meta_paths; /* pp entries */
    nxd_rank *ranks;   /* pp * ep * tp entries, see nxd_rank_at */
} nxd_ckpt;

/* One entry of an xser reference file: a parameter and its tensor id. */
typedef struct {
    const char *name; /* points into the pickle tree */
    int64_t tid;
} nxd_ref;

/* The globals an xser reference file may name besides torch's (TensorReference). */
const pk_global_def *nxd_xser_allow(size_t *n);
/* The tensor id of a TensorReference(tid) record `val` (entry `name` of
 * file `label`), below NXD_MAX_TID. */
int nxd_xser_tid(const pk_doc *refs, const pk_node *val, const char *label, const char *name, int64_t *tid);
/* The parameters of an xser reference pickle (torch_load_pickle with
 * nxd_xser_allow): a dict of names to TensorReference(tid) records, tids
 * below NXD_MAX_TID and used once. *out is malloc'd. */
int nxd_xser_refs(const pk_doc *refs, const char *label, nxd_ref **out, size_t *n);

/* A metadata parameter's name in the rank files: without the adapter name
 * after lora_A / lora_B (remove_adapter_name of transformations_utils.py;
 * get_peft_model_state_dict saves without it). malloc'd. */
char *nxd_saved_name(const char *param);
/* DIR holds shards/model (or adapter_shards/model), or is a shards folder
 * (model/ and mp_metadata_pp_rank_0.json). */
bool nxd_is_checkpoint(const char *dir);
int nxd_open(nxd_ckpt *c, const char *dir);
void nxd_close(nxd_ckpt *c);
nxd_rank *nxd_rank_at(const nxd_ckpt *c, int pp, int ep, int tp);
/* Whether parameter `name` of stage pp is expert-parallel (each ep rank holds
 * its own experts along axis 0): as .info.pt flags it (_is_ep of
 * _xser_load_data), else (a plain save, or xser without flags) when its name
 * holds "expert_mlps" (scripts/checkpoint_converter.py), in a save with ep
 * ranks. */
bool nxd_expert_param(const nxd_ckpt *c, int pp, const char *name);
/* A plain torch.save rank file as a checkpoint of its one file (closed: read
 * by path); with tree, every tensor of its nested dicts (torch_open_tree) and
 * *tree its pickle (pk_free it, also after an error of ckpt_checkpoint_from_files). */
int nxd_open_plain(ckpt_checkpoint *ck, const char *path, pk_doc *tree);
/* "dp_rank_DD[_ep_rank_EE]_tp_rank_TT_pp_rank_PP.pt" (_get_path): its ranks. */
bool nxd_parse_rank_name(const char *name, int *dp, int *ep, int *tp, int *pp, bool *has_ep);
/* The rank file's name relative to shards/model ("dp_rank_00_tp_rank_01_pp_rank_00.pt"). */
const char *nxd_rank_name(const nxd_rank *r);

#endif

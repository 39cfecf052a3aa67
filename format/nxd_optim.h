/*
 * nxd_optim.h — the optimizer of a neuronx-distributed training save
 * (SAVE/shards/optim/), read in place (docs/layouts.md, "The optimizer").
 *
 * save_checkpoint (neuronx-distributed trainer/checkpoint.py) writes
 * optimizer.state_dict() of every rank to optim/<_get_path("optim", ...)>:
 * dp_rank_DD_tp_rank_TT_pp_rank_PP.pt with ZeRO-1 (dp=True: each
 * data-parallel rank its own file), else dp_rank_00_tp_rank_TT_pp_rank_PP.pt,
 * as a plain torch.save or with xser (TensorReference records and
 * <file>.pt.tensors/tensor_<tid>.pt, as for the model). The dict is
 *   - a torch optimizer's (torch/optim/optimizer.py Optimizer.state_dict):
 *     "state" {index: {slot: tensor or number}} and "param_groups"
 *     [{"params": [index, ...], hyperparameters...}], every parameter of the
 *     groups numbered in order from 0 (torch >= 2.6 also keeps a group's
 *     "param_names" when the optimizer was given named parameters);
 *   - a ZeRO-1 one (torch_xla ZeroRedundancyOptimizer.state_dict, under
 *     NeuronZero1Optimizer): the same plus "base_state" {index: {slot:
 *     tensor}} — the wrapped optimizer's state of this dp rank's chunk: the
 *     rank's parameter padded on axis 0 to a multiple of dp and cut in dp
 *     chunks (_pad_to_world_size, _shard_tensor) — and "shape_info" {index:
 *     torch.Size} (get_shape_info: the parameter's per-rank shape); optionally
 *     "sharded_master_weights".
 *
 * nxd_optim_open reads every (pp, tp, dp) file of a save nxd_open opened: the
 * tensors, named "state.<i>.<slot>" / "base_state.<i>.<slot>" (no tensor byte
 * read), the group sizes, and per parameter index its slots and shape. It
 * checks that every rank file is there, one kind (plain or ZeRO-1), and the
 * structure (indices of the groups 0.. in order, state keys among them).
 * Errors name the file and the index.
 */
#ifndef CKPT_FORMAT_NXD_OPTIM_H
#define CKPT_FORMAT_NXD_OPTIM_H

#include "format/nxd.h"

#define NXD_MAX_SLOT_NAME 256

typedef struct {
    char *name;                  /* "exp_avg", "step" */
    const ckpt_tensor_ref *t;    /* its tensor, or NULL for a Python number */
    double value;                /* the number (or nothing when t) */
} nxd_oslot;

typedef struct {
    int64_t idx;        /* the parameter's index over param_groups */
    size_t first, n;    /* its slots: nxd_optim_rank.slots[first .. first+n) */
    bool has_shape;     /* ZeRO-1: shape_info's per-rank shape of the parameter */
    int ndim;
    uint64_t shape[CKPT_MAX_RANK];
} nxd_pstate;

typedef struct {
    int dp, tp, pp;
    char *path;
    ckpt_checkpoint ck;
    size_t ngroups;
    int64_t *group_len; /* parameters of each param_group */
    int64_t nparams;    /* their sum */
    char **param_names; /* per index: the groups' "param_names" (torch >= 2.6, an optimizer given named
                         * parameters), or NULL when a group has none */
    nxd_pstate *ps;     /* sorted by idx */
    size_t nps;
    nxd_oslot *slots;
    size_t nslots, cap_slots;
    bool master_weights; /* ZeRO-1 sharded_master_weights present (not a slot) */
} nxd_optim_rank;

typedef struct {
    char *dir;    /* shards/optim */
    int dp;       /* data-parallel files per (pp, tp): ZeRO-1's shards, else 1 */
    bool zero1;   /* the dicts hold base_state (ZeroRedundancyOptimizer) */
    bool xser;
    nxd_optim_rank *ranks; /* pp * tp * dp, see nxd_optim_at */
    int tp, pp;
} nxd_optim;

int nxd_optim_open(nxd_optim *o, const nxd_ckpt *c);
void nxd_optim_close(nxd_optim *o);
nxd_optim_rank *nxd_optim_at(const nxd_optim *o, int pp, int tp, int dp);
/* The state of parameter index idx in r, or NULL (no state: no step yet). */
const nxd_pstate *nxd_optim_state(const nxd_optim_rank *r, int64_t idx);

#endif

#!/usr/bin/env bash
# test_nxd_state.sh — the optimizer of an optimum-neuron / neuronx-distributed
# training save as a ckpt training state: `ckpt consolidate SAVE DST --state`
# (docs/layouts.md, "The optimizer").
#
# 1. tests/nxd_gen.py saves a Llama (and a Qwen3) with an AdamW state the way
#    save_checkpoint writes optimizer.state_dict(): a torch optimizer's state
#    keyed by index over NeuronTrainer.create_optimizer's param_groups (decay,
#    then no decay), per tp and pp rank; or ZeRO-1's base_state chunks, one
#    file per dp rank, with shape_info. Plain torch.save and xser; tp 2, pp 1
#    and 2, fused GQA qkv (its slots undone like its weight), dp 2 and 3 (rows
#    padded to a multiple of dp), groups that keep their param_names (torch >=
#    2.6; in an order only the names explain), ZeRO-1's sharded_master_weights and a parameter
#    without state (both listed as left out). The state consolidate writes must hold every
#    model and slot tensor byte for byte as the writer's reference
#    ("<param>/<slot>", F32), step 7; `ckpt state load` accepts it, and a
#    neuron layout of it consolidates back to the same optimizer bytes.
# 2. Hostile saves exit 1 naming the file, index, parameter or rank, and DST
#    never appears: param_groups that are not the trainer's grouping, a slot
#    of another shape than its parameter, a missing dp rank file of a ZeRO-1
#    save, an optimizer slot that differs between tp ranks for a replicated
#    parameter, param_names (torch >= 2.6) that differ between ranks.
# Run through run.sh (needs CKPT_BIN, E2E_DIR, E2E_WORK; /usr/bin/python3 with
# Debian's python3-torch, `make deps`).
set -euo pipefail
. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
tests=$(cd "$E2E_DIR/.." && pwd)
gen="$tests/nxd_gen.py"
st="$tests/e2e/state_tensors.py"
tpy=$(torch_python) || fail "no python3 with torch (make deps installs python3-torch)"
cd "$work"

"$tpy" "$gen" saves ref "p1 --tp 2 --optim plain" "z1 --tp 2 --pp 2 --xser --fuse-qkv --optim zero1 --dp 2" \
    "q3 --tp 2 --qwen3 --optim zero1 --dp 3 --master-weights --no-state lm_head.weight" \
    "x1 --tp 2 --xser --kv-size-multiplier 2 --optim plain --param-names" \
    "b-groups --tp 2 --optim plain --damage optim_groups" "b-shape --tp 2 --optim plain --damage optim_shape" \
    "b-dp --tp 2 --optim zero1 --dp 2 --damage optim_dp" "b-rep --tp 2 --optim plain --damage optim_norm" \
    "b-names --tp 2 --optim plain --param-names --damage optim_names" ||
    fail "nxd_gen.py saves"

for s in p1 z1 q3 x1; do
    expect_status 0 "$ckpt" consolidate "$s" "$s-state" --state
    [ "$(ls "$s-state" | tr '\n' ' ')" = "config.json metadata.json model.safetensors optimizer.json optimizer.safetensors " ] ||
        fail "$s --state wrote $(ls "$s-state")"
    "$py" -S "$st" "$s-state" >"$s.got"
    "$py" -S "$st" "$s-state-ref" >"$s.want"
    diff "$s.got" "$s.want" >"$s.diff" || fail "$s --state: tensors differ from the writer's: $(head -5 "$s.diff")"
    grep -c "/exp_avg_sq " "$s.got" >/dev/null || fail "$s: no exp_avg_sq slots"
    expect_status 0 "$ckpt" state load "$s-state"
    grep -q "step 7" "$work/out" || fail "$s: state load: $(head -3 "$work/out")"
    grep -q "slots exp_avg exp_avg_sq" "$work/out" || fail "$s: state load: $(cat "$work/out")"
done
# what is not a slot is listed, on stderr and in optimizer.json
expect_status 0 "$ckpt" consolidate q3 q3-again --state
grep -q "left out sharded_master_weights" "$work/err" || fail "q3: sharded_master_weights not said: $(cat "$work/err")"
"$py" -S - q3-state/optimizer.json <<'PYEOF' || fail "q3: optimizer.json left_out"
import json, sys
left = {(e["name"], e["why"].split(" ")[0]) for e in json.load(open(sys.argv[1]))["left_out"]}
want = {("sharded_master_weights", "the"), ("lm_head.weight", "its")}
sys.exit(0 if left == want else f"left_out {left}")
PYEOF
# sharded: the optimizer in shards with its index, the same tensors
expect_status 0 "$ckpt" consolidate p1 p1-sharded --state --max-shard-size 200KB
[ -f p1-sharded/optimizer.safetensors.index.json ] || fail "--max-shard-size: no optimizer index"
"$py" -S "$st" p1-sharded | diff - p1.want >/dev/null || fail "--max-shard-size: the tensors differ"
expect_status 0 "$ckpt" state load p1-sharded
# the slots follow their parameters through a layout and back
expect_status 0 "$ckpt" convert z1-state z1-tp2 --layout neuron --tp 2
expect_status 0 "$ckpt" consolidate z1-tp2 z1-back
cmp -s z1-state/optimizer.safetensors z1-back/optimizer.safetensors || fail "the optimizer did not come back through neuron-tp2"

# refused SAVE PATTERN: exit 1, the message matching PATTERN, no DST
refused() {
    expect_status 1 "$ckpt" consolidate "$1" bad --state
    grep -Eq "$2" "$work/err" || fail "$1: expected /$2/, got: $(cat "$work/err")"
    [ ! -e bad ] || fail "$1: DST appeared"
}
refused b-groups "b-groups/shards/optim/dp_rank_00_tp_rank_01_pp_rank_00.pt: param_groups of 2 groups \(15 parameters in the first\) do not match NeuronTrainer.create_optimizer's grouping of the 19 parameters of pp rank 0 \(14 with weight decay, 5 without\)"
refused b-shape "b-shape/shards/optim/dp_rank_00_tp_rank_01_pp_rank_00.pt: state index 1 slot 'exp_avg' is \[32, 8\], but its parameter 'model.layers.0.self_attn.q_proj.weight' is \[32, 64\] on tp rank 1"
refused b-dp "b-dp/shards/optim/dp_rank_01_tp_rank_01_pp_rank_00.pt: missing optimizer file \(dp rank 1 of 2, tp rank 1, pp rank 0\)"
refused b-rep "tensor 'model.norm.weight/exp_avg': tp rank 1 holds different bytes"
refused b-names "b-names/shards/optim/dp_rank_00_tp_rank_01_pp_rank_00.pt: parameter 5 is 'model.embed_tokens.weight' in .*dp_rank_00_tp_rank_00_pp_rank_00.pt but 'model.layers.0.self_attn.q_proj.weight' here"

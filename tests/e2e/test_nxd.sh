#!/usr/bin/env bash
# test_nxd.sh — optimum-neuron / neuronx-distributed training saves in:
# `ckpt inspect` and `ckpt consolidate` (docs/layouts.md, "NxD checkpoints in").
#
# 1. tests/nxd_gen.py writes a Llama (8 query heads, 2 KV heads) as a Hugging
#    Face model.safetensors, then saves it the way optimum-neuron's
#    save_pretrained / NxD's save_checkpoint do, for tp 1, 2 and 4, pp 1 and
#    2, plain torch.save and xser, separate q/k/v (KV heads divide tp), GQA
#    with fused weight_qkv (auto kv_size_multiplier) and unfused
#    weight_q/_k/_v (kv_size_multiplier 4), gate_up fused, and a model with as
#    many KV heads as query heads whose fused qkv_proj is a FusedLinearsSpec,
#    and a Qwen3 (q_norm and k_norm replicated). `ckpt inspect
#    --json` must list every parameter with the metadata's partition keys and
#    the shape torch reads from rank 0; `ckpt consolidate` must give back
#    model.safetensors byte for byte, from SAVE or SAVE/shards, and the same
#    tensors in shards with --max-shard-size. PEFT adapter saves consolidate
#    byte for byte into the original adapter (LoRA on every linear or on some;
#    fused and unfused GQA, the stride-3 qkv_proj, two stages), which merges
#    and converts with --lora as the original does; expert-parallel saves of
#    a Mixtral with neuronx-distributed's MoE (plain, and xser over two
#    stages) consolidate byte for byte.
# 2. Broken and hostile saves exit 1 with one line naming the file, the rank
#    or the parameter, and DST never appears: no `done` marker, a missing
#    rank file (also the last one, which only the metadata reveals), a
#    replicated parameter or a KV replica that differs on one rank, metadata
#    whose partition_dim does not match the tensors, a missing xser tensor
#    file, .info.pt disagreeing with a tensor file, a pickle naming os.system;
#    a lora_A copy that differs on a rank, an adapter without
#    adapter_config.json or with --max-shard-size, a peft_type in a model
#    save, --state of a save without an optimizer, a missing ep rank or expert
#    tensor.
# Run through run.sh (needs CKPT_BIN, E2E_DIR, E2E_WORK; /usr/bin/python3 with
# Debian's python3-torch, `make deps`).
set -euo pipefail
. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
tests=$(cd "$E2E_DIR/.." && pwd)
gen="$tests/nxd_gen.py"
tpy=$(torch_python) || fail "no python3 with torch (make deps installs python3-torch)"
cd "$work"

specs=("--tp 2 --qwen3" "--tp 4 --fuse-qkv --mha" "--tp 4 --xser --fuse-qkv" "--tp 4 --kv-size-multiplier 4"
    "--tp 4 --pp 2 --xser --fuse-qkv" "--tp 2 --pp 2" "--tp 1 --xser"
    "--tp 4 --xser --fuse-qkv --rowids" "--tp 4 --kv-size-multiplier 4 --rowids")
args=()
for i in "${!specs[@]}"; do args+=("s$((i + 1)) ${specs[$i]}"); done
# and the saves the hostile cases break with torch (all in one run: torch is slow to import)
args+=("b-norm --tp 4 --kv-size-multiplier 4 --damage norm" "b-shape --tp 4 --kv-size-multiplier 4 --damage shape"
    "b-kv --tp 4 --xser --fuse-qkv --damage kv" "b-info --tp 4 --xser --fuse-qkv --damage info"
    "b-evil --tp 4 --xser --fuse-qkv --damage evil:$work/pwned")
# PEFT adapter saves (NeuronPeftModel.save_pretrained) of ref-adapter, a LoRA on every linear: fused GQA
# qkv (xser), unfused GQA, separate q/k/v over two stages, ref-mha's stride-3 qkv_proj; then adapters on
# some linears only: GQA q/k/v without o_proj (the GQA rule without its o), and o_proj/down_proj without
# q/k/v or gate/up (specs whose peft_type is null: nothing of theirs is saved)
adapters=("--tp 4 --xser --fuse-qkv" "--tp 4 --kv-size-multiplier 4" "--tp 2 --pp 2" "--tp 4 --fuse-qkv --mha"
    "--tp 4 --xser --fuse-qkv --lora-targets q_proj,k_proj,v_proj" "--tp 4 --lora-targets o_proj,down_proj")
for i in "${!adapters[@]}"; do args+=("a$((i + 1)) ${adapters[$i]} --adapter"); done
args+=("b-lora --tp 4 --adapter --damage lora_a")
# expert parallelism: a Mixtral with neuronx-distributed's MoE (modules/moe), its 4 experts over 2 ep ranks
args+=("e1 --tp 2 --ep 2 --moe" "e2 --tp 2 --ep 2 --pp 2 --xser --fuse-qkv --moe")

# One python for the saves and their check (torch is slow to import): it
# writes every save above (nxd_gen.py saves), then, for s1 .. s9, runs `ckpt
# inspect --json` and checks that every metadata parameter is listed with its
# partition keys and the dtype/shape torch finds in rank 0's file (xser:
# through the tensor id); the ranks and the serialisation as the files say.
INSPECT="s1 s2 s3 s4 s5 s6 s7 s8 s9" "$tpy" - "$gen" "$ckpt" "${args[@]}" <<'PYEOF' || fail "nxd_gen.py saves, or inspect disagrees with torch"
import importlib.util, json, os, re, subprocess, sys, torch
spec = importlib.util.spec_from_file_location("nxd_gen", sys.argv[1]); g = importlib.util.module_from_spec(spec); spec.loader.exec_module(g)
ckpt, specs = sys.argv[2], sys.argv[3:]
sys.argv = [sys.argv[1], "saves", "ref"] + specs
g.main()
saves = os.environ["INSPECT"].split()
for save in saves:
    with open(save + ".inspect.json", "w") as out:
        rc = subprocess.run([ckpt, "inspect", save, "--json"], stdout=out).returncode
    if rc != 0:
        sys.exit(f"inspect --json {save}: exit {rc}")
g.xser_modules()  # the TensorReference class, to unpickle xser reference files
DT = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}
for save in saves:
    got = json.load(open(save + ".inspect.json"))
    model = f"{save}/shards/model"
    names = [f for f in os.listdir(model) if re.fullmatch(r"dp_rank_00_tp_rank_\d\d_pp_rank_\d\d\.pt", f)]
    tp = len({f[19:21] for f in names}); pp = len({f[-5:-3] for f in names})
    xser = os.path.isdir(f"{model}/dp_rank_00_tp_rank_00_pp_rank_00.pt.tensors")
    if (got["tp"], got["pp"], got["ep"], got["serialization"]) != (tp, pp, 1, "xser" if xser else "torch.save"):
        sys.exit(f"{save}: ranks {got['tp']}, {got['pp']}, {got['serialization']}")
    want = []
    for s in range(pp):
        meta = json.load(open(f"{save}/shards/mp_metadata_pp_rank_{s}.json"))
        rank0 = f"{model}/dp_rank_00_tp_rank_00_pp_rank_{s:02d}.pt"
        sd = torch.load(rank0)
        for n, m in meta["parameters"].items():
            t = torch.load(f"{rank0}.tensors/tensor_{sd[n].tid}.pt") if xser else sd[n]
            want.append(dict(m, name=n, pp=s, dtype=DT[t.dtype], rank_shape=list(t.shape)))
    have = [{k: p[k] for k in w} for p, w in zip(got["parameters"], want)]
    if have != want or len(got["parameters"]) != len(want):
        for h, w in zip(have, want):
            if h != w: sys.exit(f"{save}: ckpt says {h}\n   torch has {w}")
        sys.exit(f"{save}: {len(got['parameters'])} parameters listed, {len(want)} in the metadata")

# Rank placement on s8 and s9, made from ref-rows (values = row numbers; column
# numbers for o_proj and down_proj): H 8, KV 2, head_dim 8, tp 4, per
# docs/transforms.md §4 — m 2 (s8): rank r holds KV head g = r mod 2, copy
# c = r div 2, query heads 4g + 2c, 4g + 2c + 1; m 4 (s9): rank r holds both KV
# heads and query heads r and 4 + r.
def rows(heads): return [float(h * 8 + i) for h in heads for i in range(8)]
def block(r, n): return [float(r * n + i) for i in range(n)]
placement = {"s8": ([[0, 1], [4, 5], [2, 3], [6, 7]], [[0], [1], [0], [1]], True),
             "s9": ([[0, 4], [1, 5], [2, 6], [3, 7]], [[0, 1]] * 4, False)}
for save, (qh, kvh, fused) in placement.items():
    if save not in saves: continue
    model = f"{save}/shards/model"
    for r in range(4):
        f = f"{model}/dp_rank_00_tp_rank_{r:02d}_pp_rank_00.pt"
        sd = torch.load(f)
        if fused: sd = {n: torch.load(f"{f}.tensors/tensor_{v.tid}.pt") for n, v in sd.items()}
        col = lambda n: sd[n][:, 0].float().tolist()
        a = "model.layers.1.self_attn."
        have = col(a + "qkv_proj.weight_qkv") if fused else \
            col(a + "qkv_proj.weight_q") + col(a + "qkv_proj.weight_k") + col(a + "qkv_proj.weight_v")
        checks = [("q/k/v", have, rows(qh[r]) + rows(kvh[r]) * 2),
                  ("o_proj", sd[a + "o_proj.weight"][0].float().tolist(), rows(qh[r])),
                  ("gate_up_proj", col("model.layers.1.mlp.gate_up_proj.weight"), block(r, 32) * 2),
                  ("down_proj", sd["model.layers.1.mlp.down_proj.weight"][0].float().tolist(), block(r, 32)),
                  ("embed_tokens", col("model.embed_tokens.weight"), block(r, 64)),
                  ("norm", sd["model.norm.weight"].float().tolist(), block(0, 64))]
        for what, h, w in checks:
            if h != w: sys.exit(f"{save} rank {r}: {what} holds rows {h}, expected {w}")
PYEOF

# ---- 1. round trips ----
for i in "${!specs[@]}"; do
    n=$((i + 1)) spec=${specs[$i]}
    note "save $n: $spec"
    expect_status 0 "$ckpt" consolidate "s$n" "back$n"
    orig=ref
    case $spec in *--rowids*) orig=ref-rows ;; *--mha*) orig=ref-mha ;; *--qwen3*) orig=ref-qwen3 ;; esac
    cmp -s $orig/model.safetensors "back$n/model.safetensors" || fail "$spec: model.safetensors differs from the original"
    cmp -s $orig/config.json "back$n/config.json" || fail "$spec: config.json differs"
    [ "$(ls "back$n")" = "$(printf 'config.json\nmodel.safetensors')" ] || fail "$spec: DST holds $(ls "back$n" | tr '\n' ' ')"
    ls -d back"$n".tmp-* 2>/dev/null && fail "$spec: temp folders left"
    rm -rf "back$n"
done
expect_status 0 "$ckpt" inspect s3
grep -q "^neuronx-distributed save s3/shards: tp 4, pp 1, ep 1, xser" "$work/out" || fail "inspect text: $(head -2 "$work/out")"
grep -q "GQAQKVColumnParallelLinearSpec qkv_proj (fused qkv), 8 query heads, 2 KV heads, kv_size_multiplier 2" "$work/out" ||
    fail "inspect does not show s3's GQA spec: $(head -5 "$work/out")"
grep -qE "^model.layers.0.mlp.gate_up_proj.weight +0  tp dim 0 stride 2 +BF16 +\[64, 64\]$" "$work/out" ||
    fail "inspect text lacks gate_up_proj's partition: $(cat "$work/out")"
# shards/ itself, and the output in shards
expect_status 0 "$ckpt" consolidate s3/shards back
cmp -s ref/model.safetensors back/model.safetensors || fail "consolidate of shards/ differs"
cmp -s ref/config.json back/config.json || fail "consolidate of shards/: config.json (from the save folder) differs"
# import stores what consolidate makes of the save, with ckpt-source.json
# naming every file of the save with its size and sha256
CKPT_HOME=$work/home expect_status 0 "$ckpt" import s3 --repo t/nxd
CKPT_HOME=$work/home expect_status 0 "$ckpt" pull t/nxd -o pulled
cmp -s ref/model.safetensors pulled/model.safetensors || fail "import of an NxD save: the stored model differs"
"$py" -S - s3 pulled/ckpt-source.json <<'PYEOF' || fail "import of an NxD save: ckpt-source.json"
import hashlib, json, os, sys
save, doc = sys.argv[1], json.load(open(sys.argv[2]))
want = []
for root, _, files in os.walk(save):
    for f in files:
        p = os.path.join(root, f)
        want.append({"path": os.path.relpath(p, save), "size": os.path.getsize(p),
                     "sha256": hashlib.sha256(open(p, "rb").read()).hexdigest()})
key = lambda f: f["path"]
if doc["kind"] != "neuronx-distributed save" or sorted(doc["files"], key=key) != sorted(want, key=key):
    sys.exit(f"{doc['kind']}: {len(doc['files'])} files recorded, {len(want)} in the save")
PYEOF
rm -rf pulled "$work/home"
expect_status 0 "$ckpt" consolidate s5 sharded --max-shard-size 40KB
[ -s sharded/model.safetensors.index.json ] && [ -s sharded/model-00001-of-00006.safetensors ] || fail "no shards: $(ls sharded)"
"$py" -S "$E2E_DIR/st_dump.py" sharded >/dev/null || fail "the shards disagree with their index"
same_tensors ref sharded || fail "sharded output differs from the original"
expect_status 1 "$ckpt" consolidate s5 sharded
grep -q "not empty" "$work/err" || fail "non-empty DST: $(cat "$work/err")"
# xser is a file per tensor per rank (2,000+ for an 8B model at tp 8): a low
# soft limit on open files is lifted towards the hard one
if [ "$(ulimit -H -n)" = unlimited ] || [ "$(ulimit -H -n)" -ge 400 ]; then
    (ulimit -S -n 60 && "$ckpt" consolidate s5 fewfds >/dev/null 2>"$work/err") || fail "with 60 open files: $(cat "$work/err")"
    cmp -s ref/model.safetensors fewfds/model.safetensors || fail "with 60 open files: model.safetensors differs"
    rm -rf fewfds
fi
rm -rf back sharded s1 s2 s6 s8 s9 ref-rows ref-qwen3

# PEFT adapter saves: consolidated into the adapter folder PEFT loads, byte for
# byte the original adapter (lora_A of q/k/v and of gate/up shared, as
# optimum-neuron trains them), from adapter_<name> or its adapter_shards
for i in "${!adapters[@]}"; do
    n=$((i + 1)) orig=ref-adapter
    case ${adapters[$i]} in *--mha*) orig=ref-mha-adapter ;; *--lora-targets*) orig=ref-adapter-$(tr , - <<<"${adapters[$i]##* }") ;; esac
    note "adapter save $n: ${adapters[$i]}"
    expect_status 0 "$ckpt" consolidate "a$n/adapter_default" "ad$n"
    [ "$(ls "ad$n")" = "$(printf 'adapter_config.json\nadapter_model.safetensors')" ] || fail "adapter $n: DST holds $(ls "ad$n" | tr '\n' ' ')"
    cmp -s $orig/adapter_model.safetensors "ad$n/adapter_model.safetensors" || fail "adapter $n: adapter_model.safetensors differs"
    cmp -s $orig/adapter_config.json "ad$n/adapter_config.json" || fail "adapter $n: adapter_config.json differs"
done
expect_status 0 "$ckpt" consolidate a3/adapter_default/adapter_shards ad-shards
cmp -s ref-adapter/adapter_model.safetensors ad-shards/adapter_model.safetensors || fail "adapter_shards given alone: differs"
# what consolidate gives loads in ckpt's LoRA code: inspect, and a merge into the
# base, alone or within a convert, gives what the original adapter gives
expect_status 0 "$ckpt" inspect ad1/adapter_model.safetensors
grep -q "model.layers.1.self_attn.v_proj.lora_B.weight" "$work/out" || fail "inspect of the adapter: $(head -3 "$work/out")"
expect_status 0 "$ckpt" merge-lora ref ad1 merged
expect_status 0 "$ckpt" merge-lora ref ref-adapter merged-orig
diff -r merged merged-orig >/dev/null || fail "merge-lora of the consolidated adapter differs from the original's"
expect_status 0 "$ckpt" convert ref conv --layout neuron --tp 2 --lora ad2
expect_status 0 "$ckpt" convert ref conv-orig --layout neuron --tp 2 --lora ref-adapter
cmp -s conv/tp_rank_01/model.safetensors conv-orig/tp_rank_01/model.safetensors || fail "convert --lora of the consolidated adapter differs"
# import stores the adapter folder consolidate makes, with ckpt-source.json
CKPT_HOME=$work/home expect_status 0 "$ckpt" import a1/adapter_default --repo t/adapter
CKPT_HOME=$work/home expect_status 0 "$ckpt" pull t/adapter -o pulled
cmp -s ref-adapter/adapter_model.safetensors pulled/adapter_model.safetensors && [ -s pulled/ckpt-source.json ] ||
    fail "import of an adapter save: $(ls pulled)"
rm -rf pulled "$work/home"
rm -rf a2 a4 a5 a6 ad* merged merged-orig conv conv-orig ref-mha ref-mha-adapter ref-adapter-*

# expert-parallel saves: each expert_mlps tensor from every ep rank, in ep rank
# order along the expert axis (checkpoint_converter.py); xser ep rank 1 holds
# only its expert tensors (_xser_save_data), the rest is ep rank 0's
for e in e1 e2; do
    expect_status 0 "$ckpt" consolidate $e back-$e
    cmp -s ref-moe/model.safetensors back-$e/model.safetensors || fail "$e: model.safetensors differs from the original"
done
expect_status 0 "$ckpt" inspect e2
grep -q "^neuronx-distributed save e2/shards: tp 2, pp 2, ep 2, xser" "$work/out" || fail "inspect of an ep save: $(head -1 "$work/out")"
rm -rf back-e1 back-e2

# ---- 2. broken and hostile saves ----
# refused SAVE PATTERN: exit 1, one line matching PATTERN, no DST.
refused() {
    expect_status 1 "$ckpt" consolidate "$1" bad
    [ "$(wc -l <"$work/err")" -eq 1 ] || fail "$1: not one line: $(cat "$work/err")"
    grep -qE -- "$2" "$work/err" || fail "$1: expected /$2/, got: $(cat "$work/err")"
    [ ! -e bad ] && ! ls -d bad.tmp-* >/dev/null 2>&1 || fail "$1: DST written"
}
M=shards/model
note "broken saves"
cp -a s4 b && rm b/shards/done
refused b "b/shards: no 'done' marker"
rm -rf b && cp -a s4 b && rm b/$M/dp_rank_00_tp_rank_01_pp_rank_00.pt
refused b "dp_rank_00_tp_rank_01_pp_rank_00.pt: missing rank file \(tp rank 1 of 4"
rm -rf b && cp -a s4 b && rm b/$M/dp_rank_00_tp_rank_03_pp_rank_00.pt
refused b "dp_rank_00_tp_rank_03_pp_rank_00.pt: missing rank file \(the metadata and trn_config.json say tp 4\)"
rm -rf b && cp -a s4 b && rm b/shards/mp_metadata_pp_rank_0.json
expect_status 1 "$ckpt" consolidate b bad # not recognised as a save any more
# metadata that does not match the tensors
rm -rf b && cp -a s4 b
"$py" -S - b/shards/mp_metadata_pp_rank_0.json <<'EOF'
import json, sys
m = json.load(open(sys.argv[1])); m["parameters"]["model.embed_tokens.weight"]["partition_stride"] = 3
open(sys.argv[1], "w").write(json.dumps(m, indent=4))
EOF
refused b "mp_metadata_pp_rank_0.json: parameter 'model.embed_tokens.weight': 64 rows on partition_dim 0 do not divide by partition_stride 3"
rm -rf b && cp -a s3 b
"$py" -S - b/shards/mp_metadata_pp_rank_0.json <<'EOF'
import json, sys
m = json.load(open(sys.argv[1])); m["model_weight_transformation_specs"][0]["specs"][0][1]["kv_size_multiplier"] = 4
open(sys.argv[1], "w").write(json.dumps(m, indent=4))
EOF
refused b "spec of 'model.layers.0.self_attn': kv_output_size_per_partition 8 is not 2 KV heads x multiplier 4"
rm -rf b && cp -a s4 b
"$py" -S - b/shards/mp_metadata_pp_rank_0.json <<'EOF'
import json, sys
m = json.load(open(sys.argv[1])); m["parameters"]["model.layers.0.mlp.extra.weight"] = {"tensor_model_parallel": False}
open(sys.argv[1], "w").write(json.dumps(m, indent=4))
EOF
refused b "parameter 'model.layers.0.mlp.extra.weight' \(of .*mp_metadata_pp_rank_0.json\) is not in this rank file"
# xser: a missing tensor file, an .info.pt that disagrees, a rank saved without xser
rm -rf b && cp -a s3 b && rm b/$M/dp_rank_00_tp_rank_01_pp_rank_00.pt.tensors/tensor_3.pt
refused b "dp_rank_00_tp_rank_01_pp_rank_00.pt: parameter 'model.layers.0.mlp.gate_up_proj.weight': its tensor file .*tensor_3.pt is missing"
rm -rf b && cp -a s3 b && rm -r b/$M/dp_rank_00_tp_rank_02_pp_rank_00.pt.tensors
refused b "dp_rank_00_tp_rank_02_pp_rank_00.pt: a plain torch.save while rank 0 is xser"
# the xser reference class is allowed for this reader only; code in a pickle never runs
expect_status 1 "$ckpt" inspect s3/$M/dp_rank_00_tp_rank_00_pp_rank_00.pt
grep -q "global 'torch_xla.utils.serialization.TensorReference' is not allowed" "$work/err" || fail "TensorReference outside the nxd reader: $(cat "$work/err")"
refused b-norm "tensor 'model.layers.1.input_layernorm.weight': tp rank 2 holds different bytes"
refused b-shape "dp_rank_00_tp_rank_01_pp_rank_00.pt: parameter 'model.layers.1.mlp.down_proj.weight' is BF16 \\[64, 16\\]; .*mp_metadata_pp_rank_0.json makes it BF16 \\[64, 32\\] on tp rank 1"
refused b-kv "tensor 'model.layers.0.self_attn.k_proj.weight': tp rank 2 holds different bytes"
refused b-info "tensor_2.pt: parameter 'model.layers.0.self_attn.o_proj.weight' \(tensor 2\) is BF16 \[64, 16\], .*info.pt says \[64, 99\]"
refused b-evil "global '(posix|os).system' is not allowed"
# --state of a save without an optimizer (test_nxd_state.sh has saves with one)
expect_status 1 "$ckpt" consolidate s4 bad --state
grep -q "s4/shards/optim: no optimizer here" "$work/err" || fail "--state: $(cat "$work/err")"
[ ! -e bad ] || fail "--state without an optimizer left bad/"
expect_status 1 "$ckpt" consolidate a1/adapter_default bad --state
grep -q "an adapter save holds no optimizer" "$work/err" || fail "--state of an adapter: $(cat "$work/err")"
# expert parallelism: a missing ep rank, a missing expert tensor of ep rank 1
rm -rf b && cp -a e1 b && rm b/$M/dp_rank_00_ep_rank_01_tp_rank_01_pp_rank_00.pt
refused b "dp_rank_00_ep_rank_01_tp_rank_01_pp_rank_00.pt: missing rank file \\(tp rank 1 of 2, pp rank 0 of 1, an expert-parallel rank\\)"
rm -rf b && cp -a e2 b && rm b/$M/dp_rank_00_ep_rank_01_tp_rank_00_pp_rank_00.pt.tensors/tensor_7.pt
refused b "dp_rank_00_ep_rank_01_tp_rank_00_pp_rank_00.pt: parameter 'model.layers.0.mlp.expert_mlps.mlp_op.down_proj.weight': its tensor file .*tensor_7.pt is missing"
# adapters: listed by inspect; a lora_A replica that differs, no adapter_config.json, --max-shard-size
expect_status 0 "$ckpt" inspect a1/adapter_default
grep -q "^neuronx-distributed PEFT adapter save a1/adapter_default/adapter_shards: tp 4" "$work/out" || fail "adapter inspect: $(head -2 "$work/out")"
refused b-lora/adapter_default "tensor 'base_model.model.model.layers.1.mlp.(gate|up)_proj.lora_A.weight': tp rank 2 holds different bytes"
rm -rf b && cp -a a3 b && rm b/adapter_default/adapter_config.json
refused b/adapter_default "b/adapter_default/adapter_shards: no adapter_config.json beside adapter_shards"
expect_status 1 "$ckpt" consolidate a3/adapter_default bad --max-shard-size 1MB
grep -q "one adapter_model.safetensors" "$work/err" || fail "adapter --max-shard-size: $(cat "$work/err")"
# a spec with peft_type in a save of the whole model
rm -rf b && cp -a s4 b
"$py" -S - b/shards/mp_metadata_pp_rank_0.json <<'EOF'
import json, sys
m = json.load(open(sys.argv[1])); m["model_weight_transformation_specs"][1]["specs"][0][1]["peft_type"] = "lora"
open(sys.argv[1], "w").write(json.dumps(m, indent=4))
EOF
refused b "spec of 'model.layers.0.mlp' has peft_type lora, but this is not an adapter save"
[ ! -e "$work/pwned" ] || fail "the pickle ran code"
rm -rf a1 a3 b-lora ref-adapter e1 e2 ref-moe b b-norm b-shape b-kv b-info b-evil s3 s4 s5 s7 ref s*.inspect.json

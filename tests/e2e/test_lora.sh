#!/usr/bin/env bash
# test_lora.sh — `ckpt merge-lora`, `unmerge-lora` and `convert-lora` end to end.
#
# Adapters are written by tests/lora_gen.py (stdlib) for generated models;
# results are checked by tests/lora_ref.py, an independent numpy reference,
# when /usr/bin/python3 has numpy (`make deps` installs python3-numpy).
#
# 1. Merge: plain (BF16 base, sharded, F32 adapter), rsLoRA (BF16 adapter,
#    --scale), fan_in_fan_out, F16 base: within one ulp of the float64
#    reference; untouched tensors, the index and config.json byte-identical.
# 2. Merge then unmerge: W back within two roundings (F32: 1e-6).
# 3. Bad adapters exit 1 with one line naming the problem, leaving no DST:
#    a target that matches nothing, a shape mismatch, missing and unknown
#    fields, lora_A without lora_B, a non-neutral use_dora.
# 4. Layouts: fused and neuron --tp 2/4/8 for Qwen2 (14/2 heads: query-head
#    padding and KV replicas), fused and neuron --tp 8 for Llama with a
#    q/v/o/down rsLoRA adapter (K rows of the fused adapter zero):
#    on every rank s * B_r @ A_r == convert(merged) - convert(base) within
#    F32 rounding, and consolidate gives back the adapter byte for byte.
#    Merging the fused adapter into the fused base equals fusing the merge,
#    byte for byte, with each of OpenBLAS's Haswell, Zen, SkylakeX,
#    Sandybridge and Prescott kernels (OPENBLAS_CORETYPE; one the library
#    or the CPU cannot run is skipped with a note).
# 5. Usage errors exit 2.
# 6. lora_merge as a rule: a sharded Qwen2 (14/2 heads) to neuron --tp 2
#    --kv-size-multiplier 2 (query heads padded to 16) with the rule in a
#    --rules file and with --lora/--lora-scale gives, rank by rank and byte
#    for byte, what merge-lora then convert gives; ckpt-layout.json records
#    the adapter's files with their sha256 and the scale; consolidate gives
#    the merged checkpoint; two chained rules (merge, unmerge) equal
#    merge-lora then unmerge-lora; misplaced rules and bad options fail
#    naming the rule.
# 7. The merge-lora job through a daemon: the pulled ORG/NAME-lora-<id>@main
#    equals offline merge-lora byte for byte, `ckpt du` grows by at most the
#    merged weights' bytes, a stored adapter (by ref) finds the same
#    checkpoint, unmerge-lora equals offline unmerge-lora, the merged
#    checkpoint converts in the store to the same files as section 6, and a
#    missing adapter fails the job with the reason.
# Run through run.sh (needs CKPT_BIN, E2E_DIR, E2E_WORK).
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
here=$E2E_DIR
gen="$py -S $here/../lora_gen.py"
ref="/usr/bin/python3 $here/../lora_ref.py"
dpid=
export CKPT_QUIET=1

have_numpy=0
has_modules /usr/bin/python3 numpy && have_numpy=1
[ $have_numpy = 1 ] || echo "note: no numpy at /usr/bin/python3; reference checks skipped (make deps installs it)"
# check ARGS...: queues a lora_ref.py check; run_checks runs the queue in one
# process (numpy loads once) when numpy is there.
check() { echo "$*" >>"$work/checks.txt"; }
run_checks() {
    [ -f "$work/checks.txt" ] || return 0
    if [ $have_numpy = 1 ]; then $ref batch "$work/checks.txt" || fail "lora_ref.py (see above)"; fi
    rm -f "$work/checks.txt"
}

# blas_core NAME: true when OPENBLAS_CORETYPE=NAME makes libopenblas.so.0 (the
# library ckpt loads on first use) run NAME's kernels: a DYNAMIC_ARCH build,
# as Debian's libopenblas0-pthread is, on a CPU with the kernel's
# instructions (a forced kernel is not checked against the CPU: a missing
# instruction would kill the merge).
blas_core() {
    local flags
    case $1 in
    Haswell | Zen) flags="avx2 fma" ;;
    SkylakeX) flags="avx512f avx512cd avx512bw avx512dq avx512vl" ;;
    Sandybridge) flags="avx" ;;
    Prescott) flags="pni" ;; # SSE3
    *) fail "blas_core: unknown kernel $1" ;;
    esac
    for f in $flags; do grep -qw "$f" /proc/cpuinfo || return 1; done
    [ "$(OPENBLAS_CORETYPE=$1 "$py" -S -c '
import ctypes
lib = ctypes.CDLL("libopenblas.so.0")
lib.openblas_get_corename.restype = ctypes.c_char_p
print(lib.openblas_get_corename().decode())' 2>/dev/null)" = "$1" ]
}

# expect_error NEEDLE CMD...: exit 1, one line on stderr containing NEEDLE, no DST (the last argument).
expect_error() {
    local needle=$1
    shift
    expect_status 1 "$@"
    grep -qF -- "$needle" "$work/err" || fail "'$*': stderr lacks '$needle': $(cat "$work/err")"
    [ "$(wc -l <"$work/err")" -eq 1 ] || fail "'$*': expected one line on stderr: $(cat "$work/err")"
    local dst=${*: -1}
    [ "$dst" != out ] || fail "expect_error needs a DST other than out"
    [ ! -e "$dst" ] || fail "'$*' left $dst behind"
    ! ls -d "$dst".tmp-* >/dev/null 2>&1 || fail "'$*' left a temp directory"
}

cd "$work"
ALL=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
$ckpt gen-model llama llama --scale 32 --layers 2 --shard-mb 1
$ckpt gen-model llama llama32 --scale 32 --layers 2 --dtype f32
$ckpt gen-model qwen2 qwen32 --scale 8 --layers 2 --dtype f32
$ckpt gen-model qwen2 qwen16 --scale 8 --layers 1 --dtype f16

# ---- 1. merge against the reference ----
$gen llama ad --targets $ALL --rank 4 --alpha 8
$ckpt merge-lora llama ad merged --json >"$work/stats.json"
"$py" -S -c "
import json, sys
s = json.load(open('$work/stats.json'))
assert s['modules'] == 14 and s['copied'] == 7 and s['gflop'] > 0, s
" || fail "merge-lora --json: $(cat "$work/stats.json")"
check merge llama ad merged
cmp llama/model.safetensors.index.json merged/model.safetensors.index.json || fail "index changed"
cmp llama/config.json merged/config.json || fail "config.json changed"
[ "$(ls merged | wc -l)" = "$(ls llama | wc -l)" ] || fail "merged has other files than the base"

$gen llama ad_rs --targets q_proj,v_proj,o_proj,up_proj --rank 16 --alpha 32 --rslora --dtype bf16 --seed 1
$ckpt merge-lora llama ad_rs merged_rs --scale 0.5 --threads 1
check merge llama ad_rs merged_rs --scale 0.5

$gen llama ad_fifo --targets q_proj,k_proj,gate_proj,down_proj --rank 3 --alpha 5 --fan-in-fan-out --seed 2
$ckpt merge-lora llama ad_fifo merged_fifo
check merge llama ad_fifo merged_fifo

$gen qwen16 ad16 --targets $ALL --rank 8 --alpha 16 --seed 3
$ckpt merge-lora qwen16 ad16 merged16 --scale -2
check merge qwen16 ad16 merged16 --scale -2

# The same merge with one thread and with three gives the same bytes.
$ckpt merge-lora llama ad merged_t3 --threads 3
for f in merged/*.safetensors; do cmp "$f" "merged_t3/$(basename "$f")" || fail "threads change the result"; done

# ---- 2. merge then unmerge ----
$ckpt unmerge-lora merged ad back
check roundtrip llama merged back
check merge merged ad back --unmerge
$gen llama32 ad32 --targets $ALL --rank 8 --alpha 16 --seed 4
$ckpt merge-lora llama32 ad32 merged32
$ckpt unmerge-lora merged32 ad32 back32
check roundtrip llama32 merged32 back32

run_checks

# ---- 3. bad adapters ----
bad() { rm -rf bad && $gen llama bad "$@"; }
bad --targets q_proj,foo_proj
expect_error "target_modules entry 'foo_proj' matches no weight" $ckpt merge-lora llama bad dst_bad
bad --targets q_proj,v_proj --bad-shape
expect_error "lora_A [4, 129] and lora_B [128, 4] make a [out, in] update of [128, 129]" $ckpt merge-lora llama bad dst_bad
bad --targets q_proj --unset r
expect_error "adapter_config.json: missing field 'r'" $ckpt merge-lora llama bad dst_bad
bad --targets q_proj --unset target_modules
expect_error "missing field 'target_modules'" $ckpt merge-lora llama bad dst_bad
bad --targets q_proj --set 'lora_magic=1'
expect_error "unknown field 'lora_magic'" $ckpt merge-lora llama bad dst_bad
bad --targets q_proj --set 'use_dora=true'
expect_error "'use_dora' is true" $ckpt merge-lora llama bad dst_bad
bad --targets q_proj --drop-b
expect_error "has lora_A.weight but no lora_B.weight" $ckpt merge-lora llama bad dst_bad
bad --targets q_proj --set 'r=5'
expect_error "has rank 4 but adapter_config.json says r = 5" $ckpt merge-lora llama bad dst_bad
bad --targets q_proj --set 'target_modules=["q_proj", "k_proj"]'
expect_error "target_modules names 'model.layers.0.self_attn.k_proj' of the base, but the adapter has no" $ckpt merge-lora llama bad dst_bad
expect_error "no adapter_config.json here" $ckpt merge-lora llama llama dst_bad
# a scale beyond float32 (every merged weight would be inf), and a merge whose
# results overflow the base's f16: errors naming the module, no DST
bad --targets q_proj --set 'lora_alpha=1e308'
expect_error "module 'model.layers.0.self_attn.q_proj': the scale lora_alpha / r = 1e+308 / 4 does not fit a float32" $ckpt merge-lora llama bad dst_bad
rm -rf bad && $gen qwen16 bad --targets q_proj --rank 4 --alpha 1e12
expect_error "module 'model.layers.0.self_attn.q_proj': the merge overflows" $ckpt merge-lora qwen16 bad dst_bad
rm -rf bad
expect_status 1 $ckpt merge-lora llama ad merged
grep -q "merged is not empty (use --force to replace it)" "$work/err" || fail "non-empty DST: $(cat "$work/err")"
check merge llama ad merged
expect_error "fan_in_fan_out adapters" $ckpt convert-lora ad_fifo dst_bad --base llama --layout fused

# ---- 4. adapters in layouts ----
$gen qwen32 adq --targets $ALL --rank 4 --alpha 8 --seed 5
$gen llama32 adl --targets q_proj,v_proj,o_proj,down_proj --rank 3 --alpha 6 --rslora --seed 6
$ckpt merge-lora qwen32 adq qwen32m
$ckpt merge-lora llama32 adl llama32m
sl=$("$py" -S -c 'import math; print(6 / math.sqrt(3))')
for model in qwen llama; do
    if [ $model = qwen ]; then
        b=qwen32 m=qwen32m a=adq s=2 layouts=("fused 1" "neuron 2" "neuron 4" "neuron 8")
    else
        b=llama32 m=llama32m a=adl s=$sl layouts=("fused 1" "neuron 8")
    fi
    for lay in "${layouts[@]}"; do
        set -- $lay
        d=$model-$1-$2
        $ckpt convert $b $d.base --layout "$1" --tp "$2"
        $ckpt convert $m $d.merged --layout "$1" --tp "$2"
        $ckpt convert-lora $a $d.lora --base $b --layout "$1" --tp "$2"
        check layout $d.base $d.merged $d.lora --scale "$s"
        $ckpt consolidate $d.lora $d.back
        cmp $a/adapter_model.safetensors $d.back/adapter_model.safetensors || fail "$d: consolidated adapter differs"
        cmp $a/adapter_config.json $d.back/adapter_config.json || fail "$d: consolidated adapter_config.json differs"
        [ "$(ls $d.back)" = "$(printf 'adapter_config.json\nadapter_model.safetensors')" ] || fail "$d.back: $(ls $d.back)"
    done
done
[ -f qwen-neuron-8.lora/tp_rank_07/adapter_model.safetensors ] || fail "no per-rank adapter files"
grep -q '"kind": "lora-adapter"' qwen-neuron-8.lora/ckpt-layout.json || fail "ckpt-layout.json lacks the adapter kind"
"$py" -S - qwen-fused-1.lora/adapter_config.json <<'EOF' || fail "converted adapter_config.json"
import json, sys
c = json.load(open(sys.argv[1]))
assert sorted(c["target_modules"]) == ["down_proj", "gate_up_proj", "o_proj", "qkv_proj"], c["target_modules"]
assert c["rank_pattern"] == {"qkv_proj": 12, "gate_up_proj": 8}, c["rank_pattern"]
assert c["alpha_pattern"] == {"qkv_proj": 24, "gate_up_proj": 16}, c["alpha_pattern"]
EOF

# Merging the fused adapter into the fused base is fusing the merged base.
$ckpt merge-lora qwen-fused-1.base qwen-fused-1.lora fused-merged
cmp fused-merged/model.safetensors qwen-fused-1.merged/model.safetensors || fail "merge(fused) != fused(merge)"
check merge qwen-fused-1.base qwen-fused-1.lora fused-merged
# ... byte for byte whatever kernel OpenBLAS uses: a kernel orders a GEMM's sum
# by its shape (Haswell's and Zen's sum the zero-padded K = 12 of a qkv_proj
# row otherwise than the K = 4 of q_proj's own merge), so the engine must make
# the same calls. Each kernel is forced in turn, for both merges (llama's q/v
# adapter also leaves qkv_proj's k rows without an update).
for core in Haswell Zen SkylakeX Sandybridge Prescott; do
    if ! blas_core "$core"; then
        echo "note: OPENBLAS_CORETYPE=$core is not available here; merge(fused) == fused(merge) not checked with it"
        continue
    fi
    for model in qwen llama; do
        if [ $model = qwen ]; then b=qwen32 a=adq; else b=llama32 a=adl; fi
        d=$model-fused-1 m=$model.merged.$core
        OPENBLAS_CORETYPE=$core $ckpt merge-lora $b $a $m
        $ckpt convert $m $m.fused --layout fused
        OPENBLAS_CORETYPE=$core $ckpt merge-lora $d.base $d.lora $d.fm.$core
        cmp $m.fused/model.safetensors $d.fm.$core/model.safetensors ||
            fail "$model, OPENBLAS_CORETYPE=$core: merge(fused) != fused(merge)"
    done
done

run_checks

# ---- 5. usage ----
expect_status 2 $ckpt merge-lora llama ad
expect_status 2 $ckpt merge-lora llama ad x --scale nope
expect_status 2 $ckpt merge-lora llama ad x --scale 0
expect_status 2 $ckpt convert-lora ad x --layout fused
expect_status 2 $ckpt convert-lora ad x --base llama
expect_status 0 $ckpt merge-lora --help
grep -q "W' = W + s \* B @ A" "$work/out" || fail "merge-lora --help"
expect_status 0 $ckpt convert-lora --help

# ---- 6. lora_merge as a rule ----
$ckpt gen-model qwen2 qs --scale 8 --layers 2 --shard-mb 1 --seed 7
$gen qs ads --targets $ALL --rank 4 --alpha 8 --seed 8
LAYOUT=(--layout neuron --tp 2 --kv-size-multiplier 2)
$ckpt merge-lora qs ads qs.merged --scale 0.5
$ckpt convert qs.merged qs.merged.conv "${LAYOUT[@]}"
$ckpt plan qs "${LAYOUT[@]}" --print-rules >preset.json
# rules.json: a lora_merge (relative adapter path) before the preset's rules;
# rules_late.json: the same rule after them, where it must fail.
"$py" -S -c '
import json, sys
d = json.load(open("preset.json"))
rule = {"op": "lora_merge", "adapter": "ads", "scale": 0.5, "comment": "merge first"}
json.dump(dict(d, rules=[rule] + d["rules"]), open("rules.json", "w"))
json.dump(dict(d, rules=d["rules"] + [rule]), open("rules_late.json", "w"))
rules = [{"op": "lora_merge", "adapter": "ads", "scale": 0.5},
         {"op": "lora_merge", "adapter": "ads", "scale": 0.5, "unmerge": True}]
json.dump({"layout": "twice", "rules": rules}, open("twice.json", "w"))
'
$ckpt convert qs qs.rule --rules rules.json
# --rules decides the layout, tp and dtype: the options next to it are refused, not dropped
for opt in "--layout neuron" "--tp 2" "--dtype bf16"; do
    # shellcheck disable=SC2086 # opt is an option and its value
    expect_status 2 $ckpt convert qs qs.both --rules rules.json $opt
    grep -qF -- "--rules FILE cannot be combined with ${opt% *}" "$work/err" || fail "--rules with $opt: $(cat "$work/err")"
    [ ! -e qs.both ] || fail "--rules with $opt wrote qs.both"
done
$ckpt convert qs qs.opt "${LAYOUT[@]}" --lora ads --lora-scale 0.5
grep -q '"zero": true' qs.rule/ckpt-layout.json || fail "the layout of section 6 has no padding"
for r in tp_rank_00 tp_rank_01; do
    [ "$(ls qs.rule/$r)" = "$(ls qs.merged.conv/$r)" ] || fail "$r: other files than convert(merged)"
    for f in qs.merged.conv/$r/*; do
        cmp "$f" "qs.rule/$r/${f##*/}" || fail "--rules lora_merge: $r/${f##*/} differs from convert(merge-lora)"
        cmp "$f" "qs.opt/$r/${f##*/}" || fail "--lora: $r/${f##*/} differs from convert(merge-lora)"
    done
done
! ls -a qs.rule qs.opt | grep -q lora-merged || fail "the staging file was left in the output"
"$py" -S -c '
import hashlib, json, os, sys
layout, ad = json.load(open(sys.argv[1])), sys.argv[2]
(m,) = layout["lora_merge"]
assert m["rule"] == 1 and m["scale"] == 0.5 and m["unmerge"] is False and m["r"] == 4, m
assert [f["name"] for f in m["files"]] == ["adapter_config.json", "adapter_model.safetensors"], m["files"]
for f in m["files"]:
    data = open(os.path.join(ad, f["name"]), "rb").read()
    assert f["sha256"] == hashlib.sha256(data).hexdigest() and f["size"] == len(data), f
assert len(m["tensors"]) == 14 and all(t["scaling"] == 1.0 for t in m["tensors"]), m["tensors"]
assert layout["rules"]["rules"][0]["op"] == "lora_merge"
' qs.rule/ckpt-layout.json ads || fail "ckpt-layout.json: the lora_merge record"
$ckpt consolidate qs.rule qs.rule.back
for f in qs.merged/*; do cmp "$f" "qs.rule.back/${f##*/}" || fail "consolidate(--rules lora_merge): ${f##*/} differs from merge-lora"; done
# Chained rules: merge, then unmerge the same adapter.
$ckpt unmerge-lora qs.merged ads qs.twice --scale 0.5
$ckpt convert qs qs.twice.conv --rules twice.json
$ckpt consolidate qs.twice.conv qs.twice.back
for f in qs.twice/*; do cmp "$f" "qs.twice.back/${f##*/}" || fail "two chained lora_merge rules: ${f##*/} differs"; done
expect_error "rule 6 (lora_merge): " $ckpt convert qs --rules rules_late.json dst_bad
expect_error "rule 1 (lora_merge): adapter 'nope'" $ckpt convert qs "${LAYOUT[@]}" --lora nope dst_bad
expect_error "rule 1 (lora_merge): adapter module 'model.layers.1.mlp.down_proj' has no tensor" \
    $ckpt convert qwen16 --layout fused --lora ads dst_bad
expect_status 2 $ckpt convert qs dst_bad "${LAYOUT[@]}" --lora-scale 2
expect_status 2 $ckpt convert qs dst_bad "${LAYOUT[@]}" --lora ads --lora-scale 0
expect_error "rule 1 (lora_merge): the layout merges an adapter" $ckpt convert-lora ads --base qs --rules rules.json dst_bad

# ---- 7. the merge-lora job ----
export CKPT_HOME=$work/home
$ckpt import qs --repo org/qs@main >/dev/null
phys() { $ckpt du --json | "$py" -S -c 'import json, sys; print(json.load(sys.stdin)["physical_bytes"])'; }
before=$(phys)
$ckpt serve --listen 127.0.0.1:0 >"$work/serve.log" 2>&1 &
dpid=$!
# (a poll for a file the server writes when ready: the 60 s ceiling catches a hang, not slowness)
for _ in $(seq 1200); do [ -s "$CKPT_HOME/serve.url" ] && break; sleep 0.05; done
[ -s "$CKPT_HOME/serve.url" ] || fail "ckpt serve did not start: $(tail -n 5 "$work/serve.log")"
# job KIND ARGS... FIELD: submits, waits, prints the result's FIELD.
job() {
    local field=${*: -1} id
    id=$($ckpt submit "${@:1:$#-1}") || fail "submit ${*:1:$#-1}"
    $ckpt wait "$id" >/dev/null 2>"$work/wait.err" || fail "job $id (${*:1:$#-1}): $(cat "$work/wait.err")"
    $ckpt show "$id" | "$py" -S -c 'import json, sys; print(json.load(sys.stdin)["result"][sys.argv[1]])' "$field"
}
merged=$(job merge-lora org/qs@main ads --scale 0.5 ref)
[[ "$merged" =~ ^org/qs-lora-[0-9a-f]{12}@main$ ]] || fail "merge-lora job made '$merged'"
$ckpt pull "$merged" -o qs.pulled
[ "$(ls qs.pulled)" = "$(ls qs.merged)" ] || fail "pulled $merged has other files than merge-lora: $(ls qs.pulled)"
for f in qs.merged/*; do cmp "$f" "qs.pulled/${f##*/}" || fail "pulled $merged: ${f##*/} differs from merge-lora"; done
# Only the merged weights are new bytes.
growth=$(($(phys) - before))
weights=$("$py" -S -c '
import json, os, struct, sys
base, ad = sys.argv[1:]
def header(path):
    with open(path, "rb") as f:
        return json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
suffix = ".lora_A.weight"
mods = {k[len("base_model.model."):-len(suffix)] for k in header(os.path.join(ad, "adapter_model.safetensors")) if k.endswith(suffix)}
total = 0
for name in os.listdir(base):
    if name.endswith(".safetensors"):
        for k, v in header(os.path.join(base, name)).items():
            if k.endswith(".weight") and k[:-len(".weight")] in mods:
                total += v["data_offsets"][1] - v["data_offsets"][0]
print(total)
' qs ads)
[ "$weights" -gt 0 ] && [ "$growth" -le "$weights" ] && [ "$growth" -ge $((weights / 2)) ] ||
    fail "du grew by $growth bytes for $weights bytes of merged weights"
$ckpt show "$merged" | grep -q "source org/qs@main" || fail "ckpt show $merged does not name its source"
# The adapter by ref: the same checkpoint, nothing computed.
$ckpt import ads --repo org/ads >/dev/null
[ "$(job merge-lora org/qs@main org/ads --scale 0.5 existed)" = True ] || fail "merge-lora by ref did not find $merged"
[ "$(job merge-lora org/qs@main org/ads --scale 0.5 ref)" = "$merged" ] || fail "merge-lora by ref made another checkpoint"
# unmerge-lora, and converting the merged checkpoint in the store.
unmerged=$(job unmerge-lora "$merged" ads --scale 0.5 ref)
[[ "$unmerged" =~ ^org/qs-lora-[0-9a-f]{12}-unlora-[0-9a-f]{12}@main$ ]] || fail "unmerge-lora job made '$unmerged'"
$ckpt pull "$unmerged" -o qs.unpulled
for f in qs.twice/*; do cmp "$f" "qs.unpulled/${f##*/}" || fail "pulled $unmerged: ${f##*/} differs from unmerge-lora"; done
conv=$(job convert "$merged" "${LAYOUT[@]}" ref)
$ckpt pull "$conv" -o qs.conv.pulled
for r in tp_rank_00 tp_rank_01; do
    for f in qs.rule/$r/*; do cmp "$f" "qs.conv.pulled/$r/${f##*/}" || fail "$conv: $r/${f##*/} differs from --rules lora_merge"; done
done
expect_status 1 $ckpt convert org/qs@main "${LAYOUT[@]}" --lora ads
grep -q "merging inside the store is its own job" "$work/err" || fail "store convert --lora: $(cat "$work/err")"
id=$($ckpt submit merge-lora org/qs@main "$work/no-adapter")
expect_status 1 $ckpt wait "$id"
grep -q "no-adapter: not a directory" "$work/err" || fail "a missing adapter: $(cat "$work/err")"
expect_status 2 $ckpt submit merge-lora org/qs@main ads --scale 0
expect_status 2 $ckpt submit merge-lora org/qs@main
stop_daemon "$dpid" "$work/serve.log"
dpid=
[ -z "$(ls -A "$CKPT_HOME/tmp")" ] || fail "the jobs left files in $CKPT_HOME/tmp: $(ls -A "$CKPT_HOME/tmp")"
echo "test_lora: ok"

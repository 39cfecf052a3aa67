#!/usr/bin/env bash
# test_state.sh — training states end to end: `ckpt state`, convert and
# consolidate of states, the store's runs, and the library's example program.
#
# 1. The example program (tests/state_example.c, built against ckpt.h alone)
#    trains, saves and loads every few steps, and resumes.
# 2. A state made from a generated model plus Adam moments: the files the
#    format promises, checked by an independent reader (state_tensors.py and
#    Python's json), not by ckpt.
# 3. convert --layout neuron --tp 4 then consolidate: byte-identical,
#    optimizer included; each rank folder is a state of its own.
# 4. Per-rank states saved by a TP job (plus ckpt-layout.json) consolidate.
# 5. Loading one rank of neuron --tp 8 gives what convert writes for it.
# 6. Bad input: one clear line, exit 1, nothing written.
# 7. The store: import steps of a run, ls, retention (keep + gc), export
#    (whole, one rank, without optimizer).
# 8. Usage errors exit 2.
# Run through run.sh (needs CKPT_BIN, E2E_DIR, E2E_WORK).
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
export CKPT_HOME="$work/home"

no_leftovers() {
    ! compgen -G "$work/*.tmp-*" >/dev/null || fail "temporary folders left: $(compgen -G "$work/*.tmp-*")"
}

# ---- 1. the library's example program ----
example="$(dirname "$ckpt")/tests/state_example"
[ -x "$example" ] || fail "$example is not built (make builds it for e2e)"
expect_status 0 "$example" "$work/example" 12
grep -q "every load matched" "$work/out" || fail "example: $(cat "$work/out")"
no_leftovers
rm -rf "$work/example"
echo "[${SECONDS}s] ok example: $(cat "$work/out")"

# ---- 2. a state from a generated model plus Adam moments ----
expect_status 0 "$ckpt" gen-model llama "$work/m" --scale 32 --layers 2
expect_status 0 "$ckpt" state save "$work/m" "$work/s" --optimizer adamw --fill random --seed 3 --step 1200 \
    --set lr=3e-4 --set b1=0.9 --max-shard-size 256KB
no_leftovers
cmp -s "$work/m/config.json" "$work/s/config.json" || fail "config.json did not travel into the state"
"$py" -S - "$work/s" <<'EOF'
import glob, json, os, re, struct, sys
d = sys.argv[1]
def fail(m): sys.exit("state format: " + m)
meta = json.load(open(f"{d}/metadata.json"))
if meta.get("format") != "ckpt-state" or meta.get("version") != 1 or meta.get("step") != 1200: fail(f"metadata {meta}")
if meta.get("has_optimizer_state") is not True: fail("has_optimizer_state")
if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta.get("timestamp", "")): fail("timestamp")
opt = json.load(open(f"{d}/optimizer.json"))
if opt["name"] != "adamw" or opt["slots"] != ["adam_m", "adam_v"]: fail(f"optimizer.json {opt}")
if opt["hyperparameters"] != {"lr": 0.0003, "b1": 0.9} or opt["scalars"] != {"count": 1200}: fail(f"optimizer.json {opt}")
def group(prefix):
    index = json.load(open(f"{d}/{prefix}.safetensors.index.json"))
    files = sorted(glob.glob(f"{d}/{prefix}-*-of-*.safetensors"))
    if len(files) < 2 or set(index["weight_map"].values()) != {os.path.basename(f) for f in files}: fail(f"{prefix} shards")
    out = {}
    for f in files:
        raw = open(f, "rb").read()
        (n,) = struct.unpack("<Q", raw[:8])
        for name, t in json.loads(raw[8:8 + n]).items():
            if name != "__metadata__": out[name] = (t["dtype"], t["shape"])
    if set(out) != set(index["weight_map"]): fail(f"{prefix} index and files disagree")
    return out
model, optim = group("model"), group("optimizer")
want = {f"{p}/{s}": ("F32", shape) for p, (_, shape) in model.items() for s in ("adam_m", "adam_v")}
if optim != want: fail("optimizer tensors are not <param>/<slot> shaped like their parameters")
EOF
expect_status 0 "$ckpt" state load "$work/s"
grep -q "step 1200" "$work/out" && grep -q "optimizer adamw: 42 slot tensors" "$work/out" &&
    grep -q "parameters: 21 tensors" "$work/out" || fail "state load: $(cat "$work/out")"
echo "[${SECONDS}s] ok state format"

# ---- 3. convert a state to neuron --tp 4 and back ----
expect_status 0 "$ckpt" convert "$work/s" "$work/tp4" --layout neuron --tp 4 --max-shard-size 1MB
for r in 0 1 2 3; do
    rd="$work/tp4/tp_rank_0$r"
    [ -f "$rd/metadata.json" ] && [ -f "$rd/optimizer.json" ] && compgen -G "$rd/optimizer*.safetensors" >/dev/null ||
        fail "rank folder $r is not a state"
    expect_status 0 "$ckpt" state load "$rd"
done
grep -q '"optimizer_index"' "$work/tp4/ckpt-layout.json" || fail "ckpt-layout.json does not keep the optimizer index"
expect_status 0 "$ckpt" consolidate "$work/tp4" "$work/back"
diff -r "$work/s" "$work/back" >"$work/diff" || fail "neuron --tp 4 and back is not byte-identical: $(head "$work/diff")"
echo "[${SECONDS}s] ok convert neuron --tp 4 + consolidate: byte-identical with the optimizer"

# ---- 4. per-rank states of a TP job ----
for r in 0 1 2 3; do
    expect_status 0 "$ckpt" state save "$work/tp4/tp_rank_0$r" "$work/job/tp_rank_0$r" --step 1300
done
cp "$work/tp4/ckpt-layout.json" "$work/job/"
expect_status 0 "$ckpt" consolidate "$work/job" "$work/job-back"
for f in "$work"/s/*.safetensors "$work"/s/*.index.json "$work/s/optimizer.json"; do
    cmp -s "$f" "$work/job-back/$(basename "$f")" || fail "per-rank states: $(basename "$f") differs"
done
grep -q '"step": 1300' "$work/job-back/metadata.json" || fail "the consolidated state lost the ranks' step"
expect_status 0 "$ckpt" state save "$work/job/tp_rank_02" "$work/job/tp_rank_02" --step 1299 --force
rm -rf "$work/job-back"
expect_status 1 "$ckpt" consolidate "$work/job" "$work/job-back"
grep -q "tp_rank_02 is at step 1299" "$work/err" || fail "ranks at different steps: $(cat "$work/err")"
[ ! -e "$work/job-back" ] || fail "a failed consolidation left its output"
rm -rf "$work/job" "$work/back" "$work/tp4"
echo "[${SECONDS}s] ok per-rank states consolidate"

# ---- 5. one rank of neuron --tp 8, from the original layout ----
expect_status 0 "$ckpt" convert "$work/s" "$work/tp8" --layout neuron --tp 8
for r in 0 5; do
    expect_status 0 "$ckpt" state load "$work/s" --layout neuron --tp 8 --rank $r -o "$work/r$r"
    same_tensors "$work/r$r" "$work/tp8/tp_rank_0$r" || fail "rank $r: the state folder differs from the converted rank"
    grep -q '"step": 1200' "$work/r$r/metadata.json" || fail "rank $r lost the step"
done
expect_status 0 "$ckpt" state load "$work/s" --layout neuron-tp8 --rank 5 --no-optimizer -o "$work/r5-noopt"
! compgen -G "$work/r5-noopt/optimizer*" >/dev/null || fail "--no-optimizer wrote optimizer files"
rm -rf "$work/tp8" "$work"/r[0-9]*
echo "[${SECONDS}s] ok rank load equals convert's rank"

# ---- 6. casts and bad input ----
expect_status 0 "$ckpt" state save "$work/s" "$work/s16" --dtype f16 --no-optimizer
tr -d ' \n' <"$work/s16/metadata.json" | grep -q '"has_optimizer_state":false,"dtypes":{"model":\["F16"\]}' ||
    fail "--dtype f16 --no-optimizer: $(cat "$work/s16/metadata.json")"
rm -rf "$work/s16"

bad() { # bad NAME: a copy of the state to break
    rm -rf "$work/bad"
    cp -r "$work/s" "$work/bad"
}
expect_one_line() { # expect_one_line WHAT NEEDLE
    expect_status 1 "$ckpt" state load "$work/bad"
    [ "$(wc -l <"$work/err")" -eq 1 ] || fail "$1: not one line: $(cat "$work/err")"
    grep -qF -- "$2" "$work/err" || fail "$1: expected '$2' in $(cat "$work/err")"
    [ ! -s "$work/out" ] || fail "$1: printed a summary"
    echo "ok bad input $1: $(cat "$work/err")"
}
bad
sed -i 's/"version": 1/"version": 2/' "$work/bad/metadata.json"
expect_one_line "future version" "version 2 is newer"
bad
"$py" -S - "$work/bad" <<'EOF'
import json, struct, sys
d = sys.argv[1]
body = json.dumps({"ghost.weight/adam_m": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
body += b" " * (-(8 + len(body)) % 8)
open(f"{d}/optimizer-00001-of-00003.safetensors", "wb").write(struct.pack("<Q", len(body)) + body + b"\0" * 8)
index = json.load(open(f"{d}/optimizer.safetensors.index.json"))
index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != "optimizer-00001-of-00003.safetensors"}
index["weight_map"]["ghost.weight/adam_m"] = "optimizer-00001-of-00003.safetensors"
index["metadata"]["total_size"] = None
json.dump(index, open(f"{d}/optimizer.safetensors.index.json", "w"))
EOF
compgen -G "$work/bad/optimizer-00001-of-00003.safetensors" >/dev/null || fail "the test expects 3 optimizer shards"
expect_one_line "optimizer names a missing parameter" "names parameter 'ghost.weight', which the model does not have"
bad
truncate -s -3 "$work/bad/model-00002-of-"*.safetensors
expect_one_line "truncated shard" "model-00002-of-"
rm -rf "$work/bad"
mkdir -p "$work/busy" && echo keep >"$work/busy/file"
expect_status 1 "$ckpt" state save "$work/s" "$work/busy"
grep -q "not empty" "$work/err" || fail "saving into a non-empty folder: $(cat "$work/err")"
expect_status 1 "$ckpt" state save "$work/s" "$work/busy" --force
grep -q "not a training state" "$work/err" || fail "--force over a non-state: $(cat "$work/err")"
[ "$(cat "$work/busy/file")" = keep ] || fail "a refused save touched the folder"
rm -rf "$work/busy"
no_leftovers

# ---- 7. the store ----
for step in 100 200 300; do
    expect_status 0 "$ckpt" state save "$work/m" "$work/s$step" --optimizer adamw --fill random --seed $step --step $step
    expect_status 0 "$ckpt" state import "$work/s$step" --run sft
    [ "$(cat "$work/out")" = "sft@$step" ] || fail "import printed $(cat "$work/out")"
done
expect_status 0 "$ckpt" state import "$work/s300" --run sft
grep -q "already stored" "$work/err" || fail "importing the same step again stored it again"
steps_of() { "$ckpt" state ls "$1" | awk '{printf "%s%s", sep, $2; sep=" "}'; }
[ "$(steps_of sft)" = "100 200 300" ] || fail "state ls: $(steps_of sft)"
# The steps share the model's tensors: three steps cost the parameters once.
expect_status 0 "$ckpt" du --json
"$py" -S - "$work/out" "$work/m" <<'EOF'
import json, os, sys
du = json.load(open(sys.argv[1]))
params = os.path.getsize(f"{sys.argv[2]}/model.safetensors")
if du["logical_bytes"] - du["physical_bytes"] < 1.9 * params:
    sys.exit(f"steps do not share their parameters: {du}, parameters {params} bytes")
EOF
expect_status 0 "$ckpt" state keep sft --last 1 --every 200 --dry-run
grep -qF "would keep steps [200,300], would remove steps [100]" "$work/out" || fail "keep --dry-run: $(cat "$work/out")"
[ "$(steps_of sft)" = "100 200 300" ] || fail "--dry-run removed steps"
physical() { "$ckpt" du --json | grep -o '"physical_bytes": [0-9]*' | grep -o '[0-9]*$'; }
before=$(physical)
expect_status 0 "$ckpt" state keep sft --last 1 --every 200
grep -qF "kept steps [200,300], removed steps [100]; gc freed" "$work/out" && grep -qE "in [1-9][0-9]* blobs" "$work/out" ||
    fail "keep: $(cat "$work/out")"
[ "$(steps_of sft)" = "200 300" ] || fail "after keep: $(steps_of sft)"
after=$(physical)
[ "$after" -lt "$before" ] || fail "gc freed nothing ($before -> $after)"
expect_status 0 "$ckpt" verify
expect_status 1 "$ckpt" state export sft@100 -o "$work/gone"
grep -q "no step 100" "$work/err" || fail "export of a removed step: $(cat "$work/err")"
expect_status 0 "$ckpt" state export sft@200 -o "$work/e200"
diff -r "$work/s200" "$work/e200" >/dev/null || fail "export is not byte-identical"
expect_status 0 "$ckpt" state export sft -o "$work/e-noopt" --no-optimizer
grep -q '"step": 300' "$work/e-noopt/metadata.json" || fail "RUN without @STEP is not the newest step"
! compgen -G "$work/e-noopt/optimizer*" >/dev/null || fail "export --no-optimizer wrote optimizer files"
expect_status 0 "$ckpt" state export sft@300 -o "$work/e300r1" --layout neuron --tp 4 --rank 1
expect_status 0 "$ckpt" convert "$work/s300" "$work/c300" --layout neuron --tp 4
same_tensors "$work/e300r1" "$work/c300/tp_rank_01" || fail "exported rank 1 differs from the converted rank 1"
expect_status 1 "$ckpt" state export sft@200 -o "$work/e200"
grep -q "not empty" "$work/err" || fail "export over a non-empty folder: $(cat "$work/err")"
# A layout made in the store would leave the optimizer files behind while
# metadata.json announces them: refused, naming them and what works instead.
expect_status 1 "$ckpt" convert runs/sft@step-300 --layout neuron --tp 4
grep -qF "optimizer files (optimizer.safetensors)" "$work/err" && grep -qF "ckpt state export" "$work/err" ||
    fail "in-store convert of a state: $(cat "$work/err")"
no_leftovers
echo "[${SECONDS}s] ok store: import, ls, keep + gc, export"

# ---- 8. usage ----
expect_status 2 "$ckpt" state
expect_status 2 "$ckpt" state bogus
expect_status 2 "$ckpt" state save "$work/s"
expect_status 2 "$ckpt" state save "$work/s" "$work/x" --bogus
expect_status 2 "$ckpt" state load "$work/s" --rank 1
expect_status 2 "$ckpt" state load "$work/s" --layout neuron --tp 8
expect_status 2 "$ckpt" state load "$work/s" --dtype i8
expect_status 2 "$ckpt" state import "$work/s"
expect_status 2 "$ckpt" state import "$work/s" --run "a/b"
expect_status 2 "$ckpt" state keep sft
expect_status 2 "$ckpt" state keep sft --last 1 --every 0
expect_status 2 "$ckpt" state export sft
for sub in "" save load import ls export keep; do
    expect_status 0 "$ckpt" state $sub --help
    [ -s "$work/out" ] || fail "state $sub --help printed nothing"
done
[ ! -e "$work/x" ] || fail "a usage error created the output folder"
echo "[${SECONDS}s] all state checks passed"

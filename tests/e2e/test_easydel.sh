#!/usr/bin/env bash
# test_easydel.sh — EasyDeL's TensorStore checkpoints in: `ckpt inspect` and
# `ckpt consolidate` (docs/easydel.md).
#
# 1. For Llama, Qwen2, Mixtral and Qwen3-MoE: a `ckpt gen-model` model,
#    converted with --layout easydel (EasyDeL's names and shapes), is saved
#    the way EasyDeL's save_state does by tests/easydel_gen.py — real zarr v2
#    arrays with the numcodecs Zstd compressor, one chunk per array or edge
#    chunks, "." or "/" keys, bfloat16 as TensorStore writes it, an
#    optimizer under tx/. `ckpt inspect --json` must list exactly what an
#    independent Python walk of the folder finds (paths, dtypes, shapes,
#    chunks, stored and raw bytes, the step); `ckpt consolidate` must give
#    back the gen-model checkpoint byte for byte.
#    With --state (the saves with an optimizer): a ckpt training state whose
#    slots are the tx/ arrays (Adam's mu and nu) carried through the same
#    inverse transforms as their parameters, checked value by value; the
#    step and optax's count come along.
#    The older save of Llama and Mixtral (easydel-model.parameters, one file
#    or shards with their index, and the optimizer's easydel-optstate files,
#    written by `easydel_gen.py --legacy`): inspect lists its parameters,
#    consolidate gives back the original byte for byte, and only the model
#    and config.json are written. With --state, the pickled PyTreeDef is read
#    as records and param_{i} mapped to slots: the training state is byte
#    for byte the one the TensorStore save of the same model and optimizer
#    gives (two eras: flax 0.10 / jaxlib._jax / a jax Array step, flax 0.11 /
#    jaxlib.xla_extension / an int step / param_idx_{i}); a save without a
#    step, a leaf that is no slot (listed on stderr and in optimizer.json);
#    hostile structures (a global outside the allow-list, REDUCE of a class,
#    a leaf count that differs, a parameter the model lacks, a nesting bomb,
#    wrong node counts) each refused in one line with no DST.
# 2. Hostile saves: each is refused (exit 1) with one message naming the
#    array, and DST never appears: shapes that disagree, chunks that
#    decompress to the wrong size, a zstd bomb, paths leaving the folder (in
#    the index, or through a link), unknown dtypes, compressors and filters.
# Run through run.sh (needs CKPT_BIN, E2E_DIR, E2E_WORK; /usr/bin/python3
# with Debian's python3-zarr and python3-numcodecs, `make deps`).
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
gen="$E2E_DIR/../easydel_gen.py"
zpy=/usr/bin/python3
has_modules $zpy zarr numcodecs || fail "$zpy lacks zarr/numcodecs: run make deps"
cd "$work"

# gen_many "SRC OUT [options]"...: easydel_gen.py once per save, all in one
# python (one start and one import of numpy, zarr and numcodecs: ~0.15
# CPU-s a save; the saves are byte for byte those of separate runs).
gen_many() {
    $zpy - "$gen" "$@" <<'EOF'
import importlib.util, shlex, sys
spec = importlib.util.spec_from_file_location("easydel_gen", sys.argv[1]); g = importlib.util.module_from_spec(spec); spec.loader.exec_module(g)
for job in sys.argv[2:]:
    sys.argv = ["easydel_gen.py"] + shlex.split(job)
    if g.main():
        sys.exit(f"easydel_gen.py {job}: failed")
EOF
}

# check_listing SAVE: ckpt inspect --json against a walk of the folder.
check_listing() {
    "$ckpt" inspect "$1" --json >"$1.inspect.json" || fail "inspect $1"
    "$py" -S - "$1" <<'EOF'
import json, os, sys
d = sys.argv[1]
got = json.load(open(d + ".inspect.json"))
ix = json.load(open(f"{d}/tensorstore_index.json"))
meta = json.load(open(f"{d}/metadata.json"))
def fail(m): sys.exit(f"{d}: {m}")
if got["step"] != meta["step"]: fail(f"step {got['step']} != {meta['step']}")
want = []
names = {"bfloat16": "BF16", "<f4": "F32", "<f2": "F16", "<i4": "I32"}
for prefix, entries in ix["prefixes"].items():
    for e in entries:
        z = json.load(open(f"{d}/{e['path']}/.zarray"))
        stored, present = 0, 0
        for root, _, files in os.walk(f"{d}/{e['path']}"):
            for f in files:
                if f != ".zarray":
                    stored += os.path.getsize(os.path.join(root, f)); present += 1
        n = 1
        for s in z["shape"]: n *= s
        size = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4}[names[z["dtype"]]]
        want.append({"path": e["path"], "prefix": prefix, "dtype": names[z["dtype"]], "shape": z["shape"],
                     "chunks": z["chunks"], "dimension_separator": z["dimension_separator"],
                     "chunks_present": present, "stored_bytes": stored, "nbytes": n * size})
have = [{k: a[k] for k in want[0]} for a in got["arrays"]]
if have != want:
    for h, w in zip(have, want):
        if h != w: fail(f"ckpt says {h}\n   folder has {w}")
    fail(f"{len(have)} arrays listed, {len(want)} in the folder")
if got["total_bytes"] != sum(w["nbytes"] for w in want): fail("total_bytes")
if got["stored_bytes"] != sum(w["stored_bytes"] for w in want): fail("stored_bytes")
EOF
}

# ---- 1. four families, round trip ----
i=0
for spec in "llama bf16 --chunk-rows=40" "qwen2 f32 --slash" "mixtral bf16 --chunk-rows=7 --slash" "qwen3-moe f16 --no-tx"; do
    set -- $spec
    arch=$1 dt=$2
    shift 2
    note "$arch ($dt) $*"
    "$ckpt" gen-model "$arch" "hf-$arch" --scale 32 --layers 2 --dtype "$dt" --seed $((i++)) >/dev/null
    "$ckpt" convert "hf-$arch" "ed-$arch" --layout easydel >/dev/null
    $zpy "$gen" "ed-$arch" "save-$arch" --step $((1000 + i)) "$@" || fail "easydel_gen $arch"
    check_listing "save-$arch"
    expect_status 0 "$ckpt" inspect "save-$arch"
    grep -q "step $((1000 + i))" "$work/out" || fail "inspect text lacks the step: $(head -2 "$work/out")"
    grep -q "^model/model/embed_tokens/embedding " "$work/out" || fail "inspect text lacks the embedding"
    expect_status 0 "$ckpt" consolidate "save-$arch" "back-$arch"
    same_tensors "hf-$arch" "back-$arch" || fail "$arch: consolidated tensors differ from the original"
    cmp -s "hf-$arch/model.safetensors" "back-$arch/model.safetensors" || fail "$arch: model.safetensors differs"
    cmp -s "hf-$arch/config.json" "back-$arch/config.json" || fail "$arch: config.json differs"
    [ ! -e "back-$arch/ckpt-layout.json" ] || fail "$arch: consolidate left ckpt-layout.json"
    ls -d back-"$arch".tmp-* 2>/dev/null && fail "$arch: temp folders left"
    if [[ "$*" != *--no-tx* ]]; then
        # --state: the optimizer (tx/) as a training state's slots, carried
        # through the same inverse transforms (mu = the parameter as f32,
        # nu = twice that, as easydel_gen.py writes them)
        expect_status 0 "$ckpt" consolidate "save-$arch" "state-$arch" --state
        cmp -s "hf-$arch/model.safetensors" "state-$arch/model.safetensors" || fail "$arch --state: model differs"
        expect_status 0 "$ckpt" state load "state-$arch"
        grep -q "step $((1000 + i))" "$work/out" || fail "$arch --state: step: $(cat "$work/out")"
        $zpy - "hf-$arch/model.safetensors" "state-$arch" $((1000 + i)) <<'EOF' || fail "$arch --state: slots"
import json, struct, sys
import numpy as np
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); raw = f.read()
    return {k: (v["dtype"], v["shape"], raw[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in h.items() if k != "__metadata__"}
def f32(dt, b):
    if dt == "BF16": return (np.frombuffer(b, "<u2").astype("<u4") << 16).view("<f4")
    if dt == "F16": return np.frombuffer(b, "<f2").astype("<f4")
    return np.frombuffer(b, "<f4")
model, opt = load(sys.argv[1]), load(sys.argv[2] + "/optimizer.safetensors")
want = {}
for k, (dt, shape, b) in model.items():
    want[k + "/mu"] = ("F32", shape, f32(dt, b).tobytes())
    want[k + "/nu"] = ("F32", shape, (f32(dt, b) * 2).tobytes())
if opt.keys() != want.keys(): sys.exit(f"slots {sorted(opt.keys() ^ want.keys())[:4]}")
bad = [k for k in want if opt[k] != want[k]]
if bad: sys.exit(f"slot values differ: {bad[:4]}")
o = json.load(open(sys.argv[2] + "/optimizer.json"))
if o["slots"] != ["mu", "nu"] or o["scalars"] != {"count": float(sys.argv[3])}: sys.exit(f"optimizer.json {o}")
EOF
    fi
    if [ "$arch" = llama ] || [ "$arch" = mixtral ]; then
        # the older save: easydel-model.parameters (sharded with its index for mixtral)
        shards=1
        [ "$arch" = mixtral ] && shards=3
        # its optimizer: optax adamw's leaves as param_{i} and the pickled jax
        # PyTreeDef with the step, in two eras of jaxlib / flax / EasyDeL
        lflags="--flax 0.10 --jaxlib _jax --step-form array"
        [ "$arch" = mixtral ] && lflags="--flax 0.11 --jaxlib xla_extension --step-form int --leaf-prefix idx"
        $zpy "$gen" "ed-$arch" "legacy-$arch" --legacy --shards "$shards" --step $((1000 + i)) $lflags ||
            fail "easydel_gen --legacy $arch"
        "$ckpt" inspect "legacy-$arch" --json >"legacy-$arch.json" || fail "inspect legacy-$arch"
        "$py" -S - "legacy-$arch.json" "ed-$arch/model.safetensors" $((1000 + i)) <<'EOF' || fail "legacy $arch: inspect listing"
import json, struct, sys
doc = json.load(open(sys.argv[1]))
if doc.get("step") != int(sys.argv[3]): sys.exit(f"step {doc.get('step')}, saved {sys.argv[3]}")
got = {t["name"]: (t["dtype"], t["shape"]) for t in doc["tensors"]}
with open(sys.argv[2], "rb") as f:
    h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
want = {k: (v["dtype"], v["shape"]) for k, v in h.items() if k != "__metadata__"}
if got != want: sys.exit(f"listed {sorted(got)[:3]}..., saved {sorted(want)[:3]}...")
EOF
        expect_status 0 "$ckpt" inspect "legacy-$arch"
        grep -qx "step $((1000 + i)) (easydel-optstate.structure)" "$work/out" || fail "legacy $arch: inspect: no step"
        expect_status 0 "$ckpt" consolidate "legacy-$arch" "lback-$arch"
        cmp -s "hf-$arch/model.safetensors" "lback-$arch/model.safetensors" || fail "legacy $arch: model.safetensors differs"
        cmp -s "hf-$arch/config.json" "lback-$arch/config.json" || fail "legacy $arch: config.json differs"
        [ "$(ls "lback-$arch" | tr '\n' ' ')" = "config.json model.safetensors " ] ||
            fail "legacy $arch: consolidate wrote $(ls "lback-$arch")"
        # --state: the structure read as records maps param_{i} to the same
        # slots, bytes, scalars and step as the TensorStore save of the same
        # model and optimizer gives
        expect_status 0 "$ckpt" consolidate "legacy-$arch" "lstate-$arch" --state
        grep -q "optimizer leaves became slots (0 left out), step $((1000 + i))" "$work/err" ||
            fail "legacy $arch --state: $(cat "$work/err")"
        for f in model.safetensors optimizer.safetensors optimizer.json metadata.json config.json; do
            cmp -s "state-$arch/$f" "lstate-$arch/$f" || fail "legacy $arch --state: $f differs from the TensorStore save's"
        done
        [ "$(ls "lstate-$arch" | tr '\n' ' ')" = "$(ls "state-$arch" | tr '\n' ' ')" ] ||
            fail "legacy $arch --state wrote $(ls "lstate-$arch")"
        expect_status 0 "$ckpt" state load "lstate-$arch"
        grep -q "step $((1000 + i))" "$work/out" || fail "legacy $arch --state: state load: $(cat "$work/out")"
        rm -rf "legacy-$arch" "lback-$arch" "legacy-$arch.json" "lstate-$arch"
    fi
done
rm -rf state-*
# an older save from before April 2025 (the bare PyTreeDef: no step) whose
# optimizer has a leaf that is no slot: listed on stderr and in optimizer.json
note "older save: no step, a leaf left out"
# these, the hostile structures below and the hostile cases' base (a smaller
# save: no optimizer, one chunk per array), written by one python
hostile_structures=(global reduce count missing deep numnodes)
saves=("ed-llama legacy-x --legacy --step-form none --extra" "ed-llama save-h --no-tx")
for name in "${hostile_structures[@]}"; do saves+=("ed-llama lh-$name --legacy --hostile $name"); done
gen_many "${saves[@]}" || fail "easydel_gen: the older saves and the hostile base"
expect_status 0 "$ckpt" consolidate legacy-x lstate-x --state
grep -q "holds no step (a save before April 2025): step 0" "$work/err" || fail "no step: $(cat "$work/err")"
grep -q "left out optimizer leaf 'param_43' (3.inner_state.trace.lm_head.kernel): not a slot of its parameter" "$work/err" ||
    fail "left out leaf not listed: $(cat "$work/err")"
"$py" -S - lstate-x <<'EOF' || fail "older save --state: optimizer.json / metadata.json"
import json, sys
o = json.load(open(sys.argv[1] + "/optimizer.json"))
m = json.load(open(sys.argv[1] + "/metadata.json"))
want = [{"name": "param_43", "key": "3.inner_state.trace.lm_head.kernel",
         "why": "not a slot of its parameter (another shape, or a second one)"}]
if o.get("left_out") != want: sys.exit(f"left_out {o.get('left_out')}")
if o["slots"] != ["mu", "nu"] or m["step"] != 0: sys.exit(f"{o} {m}")
EOF
rm -rf legacy-x lstate-x
# hostile structures: one line naming the file and what is wrong, no DST
note "older save: hostile structures"
for spec in "global|easydel-optstate.structure: pickle: global 'posix.system' is not allowed (nothing is imported or called)" \
    "reduce|easydel-optstate.structure: pickle: global 'optax._src.base.EmptyState' may not be called (REDUCE)" \
    "count|easydel-optstate.structure has 43 leaves, easydel-optstate.parameters 42 tensors" \
    "missing|easydel-optstate.structure: leaf 22 ('0.mu.nonexistent.kernel') is the parameter 'nonexistent.kernel', which" \
    "deep|of the tree definition: nested deeper than the limit (64 levels)" \
    "numnodes|of the tree definition: num_leaves 43 and num_nodes 150 where its children make 43 and 149"; do
    name=${spec%%|*} msg=${spec#*|}
    expect_status 1 "$ckpt" consolidate "lh-$name" "lhout-$name" --state
    [ "$(wc -l <"$work/err")" -eq 1 ] || fail "hostile $name: expected one line, got: $(cat "$work/err")"
    grep -qF "$msg" "$work/err" || fail "hostile $name: '$msg' not in: $(cat "$work/err")"
    [ ! -e "lhout-$name" ] || fail "hostile $name: DST appeared"
    ls -d lhout-"$name".tmp-* 2>/dev/null && fail "hostile $name: temp folder left"
    if [ "$name" = global ]; then # inspect lists the parameters and says why there is no step
        expect_status 0 "$ckpt" inspect "lh-$name"
        grep -qF "warning: no step: lh-global/$msg" "$work/err" || fail "inspect of a hostile structure: $(cat "$work/err")"
    fi
    rm -rf "lh-$name"
done
# a non-empty DST is refused without --force, replaced with it
expect_status 1 "$ckpt" consolidate save-llama back-llama
grep -q "not empty" "$work/err" || fail "non-empty DST: $(cat "$work/err")"
# (one worker, traced: it takes the tensors largest first, not in file order)
expect_status 0 env CKPT_EXEC_TRACE=1 "$ckpt" consolidate save-llama back-llama --force --threads 1
cmp -s hf-llama/model.safetensors back-llama/model.safetensors || fail "--force output differs"
sed -n 's/^ckpt-trace [0-9.]* worker0 tensor \([^ ]*\) bytes=\([0-9]*\) .*/\2 \1/p' "$work/err" >"$work/order"
sort -s -k1,1nr "$work/order" | cmp -s - "$work/order" || fail "tensors not taken largest first: $(cat "$work/order")"
"$py" -S - hf-llama/model.safetensors "$work/order" <<'PY' || fail "the trace's tensors are not the model's: $(cat "$work/order")"
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
want = {k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"}
got = {name: int(n) for n, name in (line.split() for line in open(sys.argv[2]))}
sys.exit(0 if got == want and len(set(want.values())) > 1 else 1)
PY
rm -rf hf-* ed-* back-* save-qwen2 save-mixtral save-qwen3-moe save-llama

# ---- killed mid-way: DST never half there, the next run cleans up ----
note "crash points"
CKPT_FAULT_TRACE="$work/trace" "$ckpt" consolidate save-h out-trace >/dev/null 2>&1 || fail "traced consolidate"
rm -rf out-trace
for point in file.synced exec.file_done dir.before_rename; do
    grep -qx "$point" "$work/trace" || fail "consolidate never passes $point"
    expect_status 137 env CKPT_FAULT="$point" "$ckpt" consolidate save-h out-crash
    [ ! -e out-crash ] || fail "killed at $point: DST appeared"
done
expect_status 0 "$ckpt" consolidate save-h out-crash
ls -d out-crash.tmp-* 2>/dev/null && fail "temp folders of killed runs left"
rm -rf out-crash "$work/trace"

# ---- 2. hostile saves ----
# hostile NAME PYTHON MESSAGE [inspect]: a copy of save-h changed by PYTHON
# (run in the copy's folder) must make consolidate (and inspect, with
# "inspect") exit 1 naming the array and MESSAGE, leaving no DST.
arr=model/model/layers/0/self_attn/q_proj/kernel
hostile() {
    local name=$1 code=$2 msg=$3 also=${4:-}
    rm -rf "h-$name"
    cp -a save-h "h-$name"
    # numcodecs (numpy under it: ~0.4 CPU-s an import) only where a case
    # writes zstd frames; the rest edit JSON and links with the standard
    # library
    local with=("$py" -S)
    [[ "$code" != *numcodecs* ]] || with=($zpy)
    (cd "h-$name" && "${with[@]}" -c "import json, os$([[ "$code" != *numcodecs* ]] || echo ", numcodecs")
A='$arr'
def zarray(f):
    z = json.load(open(A + '/.zarray')); f(z); json.dump(z, open(A + '/.zarray', 'w'))
def index(f):
    i = json.load(open('tensorstore_index.json')); f(i); json.dump(i, open('tensorstore_index.json', 'w'))
$code") || fail "$name: setting up"
    expect_status 1 "$ckpt" consolidate "h-$name" "out-$name"
    [ "$(wc -l <"$work/err")" -eq 1 ] || fail "$name: expected one line, got: $(cat "$work/err")"
    grep -qF "$msg" "$work/err" || fail "$name: '$msg' not in: $(cat "$work/err")"
    [ ! -e "out-$name" ] || fail "$name: DST appeared"
    ls -d out-"$name".tmp-* 2>/dev/null && fail "$name: temp folder left"
    if [ "$also" = inspect ]; then
        expect_status 1 "$ckpt" inspect "h-$name"
        grep -qF "$msg" "$work/err" || fail "$name (inspect): '$msg' not in: $(cat "$work/err")"
    fi
    rm -rf "h-$name"
}
note "hostile saves"
# chunks / shape that do not cover what the index says
hostile shape "zarray(lambda z: z.update(shape=[z['shape'][0] + 1, z['shape'][1]]))" \
    "array '$arr': the index's shape differs from .zarray's" inspect
hostile rank "zarray(lambda z: z.update(chunks=[40]))" "array '$arr': .zarray: 'chunks' has 1 dimensions, 'shape' 2" inspect
hostile zerochunk "zarray(lambda z: z.update(chunks=[0, 64]))" "array '$arr': .zarray: 'chunks'[0] is not a positive integer" inspect
# chunk files of the wrong size, and a bomb
hostile short "open(A + '/0.0', 'wb').write(numcodecs.Zstd(1).encode(bytes(100)))" \
    "array '$arr': chunk '0.0' decompresses to 100 bytes"
hostile bomb "open(A + '/0.0', 'wb').write(numcodecs.Zstd(1).encode(bytes(64 << 20)))" \
    "array '$arr': chunk '0.0' decompresses to 67108864 bytes"
hostile notzstd "open(A + '/0.0', 'wb').write(b'\\x00' * 64)" "array '$arr': chunk '0.0' is not a zstd frame"
# paths that leave the folder
hostile dotdot "index(lambda i: i['prefixes']['model'][0].update(path='model/../../etc'))" \
    "leaves the checkpoint folder" inspect
hostile absolute "index(lambda i: i['prefixes']['model'][0].update(path='/etc/passwd'))" "leaves the checkpoint folder" inspect
hostile linkout "import shutil; shutil.move(A, '../moved-away'); os.symlink(os.path.abspath('../moved-away'), A)" \
    "array '$arr': cannot open '$arr': Too many levels of symbolic links (symbolic links are not followed)" inspect
rm -rf moved-away
hostile chunklink "os.remove(A + '/0.0'); os.symlink('/etc/passwd', A + '/0.0')" \
    "array '$arr': chunk '0.0': Too many levels of symbolic links (symbolic links are not followed)"
# unknown dtypes, compressors, filters, order
hostile dtype "zarray(lambda z: z.update(dtype='<M8'))" "array '$arr': .zarray: dtype '<M8' is not read" inspect
hostile bigendian "zarray(lambda z: z.update(dtype='>f2'))" "array '$arr': .zarray: dtype '>f2' is not read (big-endian)" inspect
hostile blosc "zarray(lambda z: z.update(compressor={'id': 'blosc', 'cname': 'lz4'}))" \
    "array '$arr': .zarray: compressor 'blosc' is not read" inspect
hostile filters "zarray(lambda z: z.update(filters=[{'id': 'delta', 'dtype': '<u2'}]))" \
    "array '$arr': .zarray: 'filters' must be null" inspect
hostile order "zarray(lambda z: z.update(order='F'))" "array '$arr': .zarray: 'order' is \"F\"" inspect
hostile indexdtype "index(lambda i: [e.update(dtype='float32') for e in i['prefixes']['model'] if e['path'] == A])" \
    "array '$arr': the index says dtype 'float32'" inspect
hostile step "json.dump({'step': -3}, open('metadata.json', 'w'))" "'step' is not a non-negative integer" inspect
note "done"

#!/usr/bin/env bash
# test_dcp.sh — PyTorch Distributed Checkpoint (DCP) folders in (issue 16),
# end to end, on folders written as torch's FileSystemWriter writes them
# (tests/dcp_gen.py, real torch.save chunks; Debian's python3-torch).
#
# 1. `ckpt inspect --json` of the FSDP save (newest torch's format, 4 ranks,
#    uneven last chunk) and of the 2-D save (torch 2.1's format, TP x FSDP:
#    chunks along two axes, some saved as transposed views) lists every
#    tensor with the generator's global shape and dtype and every chunk with
#    its offsets, sizes and file, the bytes entries as such and the optim.*
#    (optimizer) and train_state.* (training state) entries marked; the text
#    listing says what consolidate leaves out.
# 2. `ckpt consolidate` writes model.safetensors (or, with --max-shard-size,
#    shards + model.safetensors.index.json) with {"format":"pt"} whose every
#    tensor equals the original byte for byte (sha256 of the generator's
#    tensors), names kept or, with --strip-prefix model., the Hugging Face
#    names; no optim.*, train_state.* or bytes entry in it. With --state it
#    writes a ckpt training state instead: optim.state.<param>.<slot> as
#    optimizer slots <param>/<slot> (byte for byte), the step from
#    train_state.step, which `ckpt state load` accepts and which converts to
#    the easydel layout and consolidates back with its optimizer unchanged.
# 3. Hostile folders (a missing .metadata, a missing .distcp, overlapping
#    chunks, a hole, a range past its file, relative paths escaping the
#    folder, os.system in .metadata, a chunk whose dtype or shape disagrees
#    with the metadata, a zstd-compressed item): consolidate (and inspect,
#    for two) each exit 1 with one line naming the file and the reason,
#    nothing is written at DST, and the pickle's command never runs.
# Run through run.sh (needs CKPT_BIN, E2E_DIR, E2E_WORK).
set -euo pipefail
. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
tests=$(cd "$E2E_DIR/.." && pwd)

torch_py=$(torch_python) || fail "no python3 with torch (make deps installs python3-torch)"

gen=$work/gen
"$torch_py" "$tests/dcp_gen.py" "$gen" >/dev/null 2>"$work/gen.err" || fail "dcp_gen.py: $(cat "$work/gen.err")"

# check_listing LISTING EXPECT: ckpt's --json listing against the generator's tensors.
check_listing() {
    "$py" -S - "$1" "$2" <<'EOF'
import json, sys
got = json.load(open(sys.argv[1]))
exp = json.load(open(sys.argv[2]))
assert got["format"] == "torch-dcp", got["format"]
tens = {t["name"]: t for t in got["tensors"]}
want = {"model." + n: (t["dtype"], t["shape"]) for n, t in exp["tensors"].items()}
have = {n: (t["dtype"], t["shape"]) for n, t in tens.items() if not t.get("left_out")}
if {n: t.get("left_out") for n, t in tens.items() if t.get("left_out")} != dict(
        [(n, "optimizer state") for n in exp["optim"]] + [("train_state.step", "training state")]):
    sys.exit(f"left out: {[(n, t.get('left_out')) for n, t in tens.items()]}")
if have != want:
    sys.exit(f"model tensors differ: extra {sorted(set(have) - set(want))}, missing {sorted(set(want) - set(have))}, "
             f"changed {[n for n in have if n in want and have[n] != want[n]]}")
if sorted(n for n, t in tens.items() if t["optimizer"]) != exp["optim"]:
    sys.exit(f"optimizer tensors: {sorted(n for n, t in tens.items() if t['optimizer'])}")
if sorted(b["name"] for b in got["bytes"]) != exp["bytes"]:
    sys.exit(f"bytes entries: {got['bytes']}")
files = {f["path"]: f["size"] for f in got["files"]}
if sorted(files) != [f"__{r}_0.distcp" for r in range(4)]:
    sys.exit(f"files: {sorted(files)}")
for n, t in tens.items():
    vol = 0
    for c in t["chunks"]:
        if c["file"] not in files or c["offset"] + c["nbytes"] > files[c["file"]]:
            sys.exit(f"{n}: chunk {c} outside its file")
        v = 1
        for o, s, d in zip(c["offsets"], c["sizes"], t["shape"]):
            assert o + s <= d, (n, c)
            v *= s
        vol += v
    numel = 1
    for d in t["shape"]:
        numel *= d
    if vol != numel:
        sys.exit(f"{n}: chunks cover {vol} of {numel}")
print(len(tens), sum(len(t["chunks"]) for t in tens.values()))
EOF
}

# check_consolidated DIR EXPECT PREFIX [SHARDED]: DIR's tensors are the
# generator's byte for byte, named PREFIX + the HF name.
check_consolidated() {
    "$py" -S - "$@" <<'EOF'
import hashlib, json, os, struct, sys
d, exp, prefix = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
sharded = len(sys.argv) > 4
files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
index = os.path.join(d, "model.safetensors.index.json")
if sharded:
    if len(files) < 2 or files[0] != f"model-00001-of-{len(files):05d}.safetensors":
        sys.exit(f"shards: {files}")
    ix = json.load(open(index))
    if sorted(set(ix["weight_map"].values())) != files:
        sys.exit(f"index files {sorted(set(ix['weight_map'].values()))} != {files}")
elif files != ["model.safetensors"] or os.path.exists(index):
    sys.exit(f"files: {files}")
if sorted(os.listdir(d)) != sorted(files + ([os.path.basename(index)] if sharded else [])):
    sys.exit(f"other files in the output: {sorted(os.listdir(d))}")
seen, mapped, total = {}, {}, 0
for f in files:
    raw = open(os.path.join(d, f), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    if hdr.pop("__metadata__", {}) != {"format": "pt"}:
        sys.exit(f"{f}: metadata is not {{'format': 'pt'}}")
    for name, t in hdr.items():
        a, b = t["data_offsets"]
        seen[name] = (t["dtype"], t["shape"], hashlib.sha256(raw[8 + n + a:8 + n + b]).hexdigest())
        mapped[name] = f
        total += b - a
want = {prefix + n: (t["dtype"], t["shape"], t["sha256"]) for n, t in exp["tensors"].items()}
if seen != want:
    bad = [k for k in set(seen) | set(want) if seen.get(k) != want.get(k)]
    sys.exit(f"tensors differ from the originals: {sorted(bad)[:5]}")
if sharded and (ix["weight_map"] != mapped or ix["metadata"]["total_size"] != total):
    sys.exit("the index does not match the shards")
EOF
}

# ---- 1. inspect ----
note "inspect"
for name in fsdp tp2d; do
    expect_status 0 "$ckpt" inspect --json "$gen/$name"
    cp "$work/out" "$work/$name.json"
    counts=$(check_listing "$work/$name.json" "$gen/$name.expect.json") || fail "$name listing: $counts"
    expect_status 0 "$ckpt" inspect "$gen/$name"
    grep -q "^PyTorch DCP checkpoint .*: 28 tensors in [0-9]* chunks, 3 bytes entries, 4 files" "$work/out" ||
        fail "$name: text header: $(head -1 "$work/out")"
    grep -q "^model.model.embed_tokens.weight  *BF16  *\[250, 64\]" "$work/out" || fail "$name: no embed_tokens line"
    grep -q "^9 optim.\* / optimizer.\* entries are optimizer state" "$work/out" || fail "$name: no optimizer note"
    grep -q "^1 lr_scheduler.\* / train_state.\* / dataloader.\* tensors are training state" "$work/out" || fail "$name: no training state note"
    grep -q "^optim.param_groups.0.lr  *bytes" "$work/out" || fail "$name: bytes entry not listed as bytes"
done
# the uneven last FSDP chunk and the two-axis grid, as the generator wrote them
grep -q '^    \[189, 0\] + \[61, 64\]  __3_0.distcp @ ' <("$ckpt" inspect "$gen/fsdp") || fail "fsdp: uneven last chunk not listed"
grep -q '^    \[125, 32\] + \[125, 32\]  __3_0.distcp @ [0-9]* (a permuted view' <("$ckpt" inspect "$gen/tp2d") ||
    fail "tp2d: 2-D chunk not listed, or not as the permuted view it is"

# ---- 2. consolidate ----
note "consolidate"
expect_status 0 "$ckpt" consolidate "$gen/fsdp" "$work/fsdp-hf"
grep -q "6 optimizer state tensors (optim.\*, optimizer.\*)" "$work/err" || fail "consolidate does not say optim.* was left out: $(cat "$work/err")"
grep -q "1 training state tensors" "$work/err" || fail "consolidate does not say train_state was left out: $(cat "$work/err")"
grep -q "3 bytes entries" "$work/err" || fail "consolidate does not say bytes entries were skipped: $(cat "$work/err")"
check_consolidated "$work/fsdp-hf" "$gen/fsdp.expect.json" "model." || fail "fsdp: consolidated tensors"
expect_status 0 "$ckpt" consolidate "$gen/fsdp" "$work/fsdp-hf2" --strip-prefix model. --max-shard-size 100KB
check_consolidated "$work/fsdp-hf2" "$gen/fsdp.expect.json" "" sharded || fail "fsdp: sharded, stripped"
expect_status 0 "$ckpt" consolidate "$gen/tp2d" "$work/tp2d-hf" --strip-prefix model. --max-shard-size 100KB --threads 1
check_consolidated "$work/tp2d-hf" "$gen/tp2d.expect.json" "" sharded || fail "tp2d: sharded, stripped"
expect_status 0 "$ckpt" consolidate "$gen/tp2d" "$work/tp2d-hf1" --strip-prefix model.
check_consolidated "$work/tp2d-hf1" "$gen/tp2d.expect.json" "" || fail "tp2d: one file"
# the result is a Hugging Face checkpoint ckpt itself reads
expect_status 0 "$ckpt" inspect "$work/tp2d-hf"
# an existing DST is kept unless --force
expect_status 1 "$ckpt" consolidate "$gen/fsdp" "$work/fsdp-hf"
expect_status 0 "$ckpt" consolidate "$gen/fsdp" "$work/fsdp-hf" --force --strip-prefix model.
check_consolidated "$work/fsdp-hf" "$gen/fsdp.expect.json" "" || fail "fsdp: --force"
# convert and plan point at consolidate
expect_status 1 "$ckpt" convert "$gen/fsdp" "$work/conv" --layout hf
grep -q "a PyTorch DCP checkpoint .*ckpt consolidate" "$work/err" || fail "convert of a DCP folder: $(cat "$work/err")"
[ ! -e "$work/conv" ] || fail "convert of a DCP folder wrote its DST"
# the DCP options are refused for other sources
expect_status 1 "$ckpt" consolidate "$work/fsdp-hf" "$work/nope" --strip-prefix model.
grep -q "for PyTorch DCP sources" "$work/err" || fail "strip-prefix on a non-DCP source: $(cat "$work/err")"
# --state: a ckpt training state whose optimizer slots are the optim.state
# tensors byte for byte, keyed <param>/<slot>; the step is train_state.step
for save in fsdp tp2d; do
    expect_status 0 "$ckpt" consolidate "$gen/$save" "$work/$save-state" --strip-prefix model. --state
    [ "$(ls "$work/$save-state" | tr '\n' ' ')" = "metadata.json model.safetensors optimizer.json optimizer.safetensors " ] ||
        fail "$save --state wrote $(ls "$work/$save-state")"
    mkdir "$work/$save-model" && cp "$work/$save-state/model.safetensors" "$work/$save-model/"
    check_consolidated "$work/$save-model" "$gen/$save.expect.json" "" || fail "$save --state: model tensors"
    expect_status 0 "$ckpt" state load "$work/$save-state"
    grep -q "step 1000" "$work/out" || fail "$save --state: step: $(cat "$work/out")"
    "$py" -S - "$work/$save-state" "$gen/$save.expect.json" <<'EOF' || fail "$save --state: optimizer slots"
import hashlib, json, struct, sys
d, exp = sys.argv[1], json.load(open(sys.argv[2]))
with open(f"{d}/optimizer.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); base = 8 + n
    got = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        f.seek(base + v["data_offsets"][0])
        got[k] = {"dtype": v["dtype"], "shape": v["shape"],
                  "sha256": hashlib.sha256(f.read(v["data_offsets"][1] - v["data_offsets"][0])).hexdigest()}
if got != exp["optim_tensors"]: sys.exit(f"slots {sorted(got)} != {sorted(exp['optim_tensors'])}")
opt = json.load(open(f"{d}/optimizer.json"))
if opt["slots"] != ["exp_avg", "exp_avg_sq"] or opt["scalars"] != {"step": 7.0}: sys.exit(f"optimizer.json {opt}")
EOF
done
# the slots follow their parameters through a layout (easydel: kernels transposed)
# (DCP saves no config.json: the user copies the model's in, as here)
cat >"$work/fsdp-state/config.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
 "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 176, "vocab_size": 250, "num_hidden_layers": 2,
 "tie_word_embeddings": false}
EOF
expect_status 0 "$ckpt" convert "$work/fsdp-state" "$work/fsdp-tp2" --layout easydel
expect_status 0 "$ckpt" consolidate "$work/fsdp-tp2" "$work/fsdp-back"
cmp -s "$work/fsdp-state/optimizer.safetensors" "$work/fsdp-back/optimizer.safetensors" ||
    fail "--state: the optimizer did not come back through the easydel layout"
expect_status 1 "$ckpt" consolidate "$work/fsdp-hf" "$work/nope" --state
grep -q "is for PyTorch DCP" "$work/err" || fail "--state on a non-DCP source: $(cat "$work/err")"

# ---- 3. hostile folders ----
note "hostile"
declare -A why=(
    [no_metadata]='/no_metadata/.metadata: no such file'
    [no_distcp]='/no_distcp/__2_0.distcp: no such file'
    [overlap]="/overlap/.metadata: tensor 'model.model.embed_tokens.weight': chunks .* overlap"
    [hole]="/hole/.metadata: tensor 'model.model.embed_tokens.weight' .*cover 11968 of its 16000 elements"
    [outside]="/outside/__3_0.distcp: tensor 'model.model.embed_tokens.weight' chunk 3: bytes .* lie outside the file"
    [escape]="/escape/.metadata: .*relative_path '../fsdp/__0_0.distcp' is not a file of the checkpoint folder"
    [slash]="/slash/.metadata: .*relative_path '/etc/passwd' is not a file of the checkpoint folder"
    [global]="/global/.metadata: pickle: global 'posix.system' is not allowed"
    [dtype]="/dtype/__0_0.distcp: tensor 'model.model.embed_tokens.weight' chunk 0 .*dtype BF16, the metadata says F32"
    [zstd]="/zstd/.metadata: storage_data 'model.model.embed_tokens.weight': transform_descriptors 'stream.zstd/1' .*is not read"
    [shape]="/shape/__0_0.distcp: tensor 'model.model.embed_tokens.weight' chunk 3 .*shape \[63, 64\], the metadata's chunk sizes are \[61, 64\]"
)
cd "$work"
for case in "${!why[@]}"; do
    src=$gen/hostile/$case
    cmds=consolidate # inspect opens a folder through the same dcp_open: two cases suffice
    case $case in no_metadata|global) cmds="inspect consolidate" ;; esac
    for cmd in $cmds; do
        if [ $cmd = inspect ]; then expect_status 1 "$ckpt" inspect "$src"
        else expect_status 1 "$ckpt" consolidate "$src" "$work/dst-$case"; fi
        [ "$(wc -l <"$work/err")" -eq 1 ] || fail "$case ($cmd): not one line: $(cat "$work/err")"
        grep -q "^ckpt: .*${why[$case]}" "$work/err" || fail "$case ($cmd): $(cat "$work/err")"
    done
    [ ! -e "$work/dst-$case" ] || fail "$case: DST written"
    ls "$work" | grep -q "dst-$case" && fail "$case: a temp folder left behind: $(ls "$work")"
done
[ ! -e "$work/dcp_pwned" ] && [ ! -e "$gen/dcp_pwned" ] || fail "the .metadata pickle ran a command"
note "done"

#!/usr/bin/env bash
# test_torch.sh — torch.save checkpoints in (issue 16), end to end, on files
# written by real torch (tests/torch_gen.py; Debian's python3-torch).
#
# 1. Every generated checkpoint (a mini Llama as pytorch_model.bin with tied
#    lm_head, the same sharded with pytorch_model.bin.index.json, the legacy
#    format, {"state_dict"} and {"model"} wrappers, views at offsets,
#    nn.Parameters, pickle protocol 4, every dtype, transposed and permuted
#    views, which convert copies through its plan): `ckpt inspect --json`
#    lists exactly the tensors torch holds (tied names once, the others in
#    the metadata as {removed: kept}), and `ckpt convert --layout hf` writes
#    model.safetensors (+ index when sharded) with {"format":"pt"} and the
#    tied names ({"lm_head.weight": "model.embed_tokens.weight"}, as
#    convert.py writes them) whose tensor bytes equal torch's byte for byte;
#    no .bin is copied along.
# 2. Views ckpt cannot read (a strided slice, a different view of the same
#    bytes) and hostile files (code execution through REDUCE,
#    STACK_GLOBAL, BUILD, NEWOBJ, INST; memo, stack and mark bombs; storages
#    and views out of range; compressed, overlapping, lying zips): each exits
#    1 with one line naming the file and the reason, writes nothing, and no
#    code runs (the marker file the pickles try to create never appears).
# Run through run.sh (needs CKPT_BIN, E2E_DIR, E2E_WORK).
set -euo pipefail
. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
tests=$(cd "$E2E_DIR/.." && pwd)

# torch is Debian's python3-torch (make deps): /usr/bin/python3 when the
# python3 on PATH is another one.
torch_py=$(torch_python) || fail "no python3 with torch (make deps installs python3-torch)"

gen=$work/gen
"$torch_py" "$tests/torch_gen.py" "$gen" >/dev/null 2>"$work/gen.err" || fail "torch_gen.py: $(cat "$work/gen.err")"

# check_listing LISTING EXPECT [noalias]: ckpt's --json listing against
# torch's tensors; the tied names in its metadata unless noalias.
check_listing() {
    "$py" -S - "$1" "$2" "${3:-}" <<'EOF'
import json, sys
got = json.load(open(sys.argv[1]))
exp = json.load(open(sys.argv[2]))
want = {n: (t["dtype"], t["shape"]) for n, t in exp["tensors"].items() if n not in exp["aliases"]}
have = {t["name"]: (t["dtype"], t["shape"]) for t in got["tensors"]}
if have != want:
    sys.exit(f"listing differs: extra {sorted(set(have) - set(want))}, missing {sorted(set(want) - set(have))}, "
             f"changed {[n for n in have if n in want and have[n] != want[n]]}")
if exp["aliases"] and sys.argv[3] != "noalias" and got["metadata"] != exp["aliases"]:
    sys.exit(f"aliases: {got['metadata']} != {exp['aliases']}")
EOF
}

# check_converted DIR EXPECT: DIR holds model.safetensors (or shards + index)
# whose tensors are torch's bytes, each file with {"format": "pt"}.
check_converted() {
    "$py" -S - "$1" "$2" <<'EOF'
import hashlib, json, os, struct, sys
d, exp = sys.argv[1], json.load(open(sys.argv[2]))
files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
index = os.path.join(d, "model.safetensors.index.json")
if len(files) > 1:
    ix = json.load(open(index))
    if set(ix) != {"metadata", "weight_map"} or set(ix["metadata"]) != {"total_size"}:
        sys.exit(f"index shape: {list(ix)}")
    if sorted(set(ix["weight_map"].values())) != files:
        sys.exit(f"index files {sorted(set(ix['weight_map'].values()))} != {files}")
    if files[0] != f"model-00001-of-{len(files):05d}.safetensors":
        sys.exit(f"shard names: {files}")
elif files != ["model.safetensors"] or os.path.exists(index):
    sys.exit(f"files: {files}")
for f in os.listdir(d):
    if f.endswith((".bin", ".pt", ".pth", ".bin.index.json")):
        sys.exit(f"torch file copied into the output: {f}")
seen, tied = {}, {}
for f in files:
    raw = open(os.path.join(d, f), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    meta = hdr.pop("__metadata__", {})
    if meta.pop("format", None) != "pt":
        sys.exit(f"{f}: no format pt metadata")
    for k, v in meta.items():  # convert.py's {removed: kept}, in the file holding kept
        if v not in hdr:
            sys.exit(f"{f}: tied name {k} -> {v}, which the file does not hold")
        tied[k] = v
    for name, t in hdr.items():
        a, b = t["data_offsets"]
        seen[name] = (t["dtype"], t["shape"], hashlib.sha256(raw[8 + n + a:8 + n + b]).hexdigest())
want = {n: (t["dtype"], t["shape"], t["sha256"]) for n, t in exp["tensors"].items() if n not in exp["aliases"]}
if seen != want:
    bad = [k for k in set(seen) | set(want) if seen.get(k) != want.get(k)]
    sys.exit(f"tensors differ from torch's: {sorted(bad)[:5]}")
if tied != exp["aliases"]:
    sys.exit(f"tied names in the metadata {tied} != {exp['aliases']}")
EOF
}

# ---- 1. real torch files: inspect and convert ----
mkdir -p "$work/src"
for case in llama legacy sharded wrapped.pt wrapped_legacy.pt model.pth proto4.pt dtypes.bin transposed.pt; do
    src=$gen/$case expect=$gen/$case.expect.json
    case $case in
    sharded) expect=$gen/sharded/expect.json ;;
    llama | legacy) expect=$gen/$case/pytorch_model.bin.expect.json ;;
    *)  # a single file: in a folder of its own, so convert copies no neighbours
        mkdir -p "$work/src/$case" && cp "$gen/$case" "$work/src/$case/" && src=$work/src/$case/$case ;;
    esac
    expect_status 0 "$ckpt" inspect --json "$src"
    check_listing "$work/out" "$expect" || fail "$case: inspect"
    expect_status 0 "$ckpt" convert "$src" "$work/conv-$case" --layout hf
    check_converted "$work/conv-$case" "$expect" || fail "$case: convert"
    echo "ok $case: inspect and convert match torch"
done

# a sharded .bin converts as Hugging Face's conversion (safetensors'
# convert.py, convert_multi) does: each .bin becomes the file its rename()
# names, holding the same tensors, and the index is the source's with the
# file names renamed (total_size and key order kept)
"$py" -S - "$gen/sharded" "$work/conv-sharded" <<'EOF' || fail "sharded: not the files Hugging Face's conversion writes"
import json, os, struct, sys
src, out = sys.argv[1], sys.argv[2]
rename = lambda f: os.path.splitext(f)[0].replace("pytorch_model", "model") + ".safetensors"
six = json.load(open(f"{src}/pytorch_model.bin.index.json"))
oix = json.load(open(f"{out}/model.safetensors.index.json"))
want = dict(six, weight_map={k: rename(v) for k, v in six["weight_map"].items()})
if oix != want or list(oix["weight_map"]) != list(want["weight_map"]):
    sys.exit(f"index: {oix} != {want}")
for f in sorted(set(six["weight_map"].values())):
    with open(f"{out}/{rename(f)}", "rb") as fh:
        h = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
    held = {k for k in h if k != "__metadata__"}
    if held != {k for k, v in six["weight_map"].items() if v == f}:
        sys.exit(f"{rename(f)} holds {sorted(held)}")
EOF
echo "ok sharded .bin -> the files and index Hugging Face's conversion writes"
# the sharded .bin opened through its index file, and a sharded output
expect_status 0 "$ckpt" inspect --json "$gen/sharded/pytorch_model.bin.index.json"
check_listing "$work/out" "$gen/sharded/expect.json" || fail "sharded via index: inspect"
expect_status 0 "$ckpt" convert "$gen/sharded" "$work/conv-sharded-small" --layout hf --max-shard-size 100KB
check_converted "$work/conv-sharded-small" "$gen/sharded/expect.json" || fail "sharded output"
cmp -s "$gen/sharded/config.json" "$work/conv-sharded-small/config.json" || fail "config.json not copied"
echo "ok sharded .bin -> $(ls "$work/conv-sharded-small" | grep -c 'safetensors$') safetensors shards + index"

# the converted checkpoint reads back as any other (and matches the source listing)
expect_status 0 "$ckpt" inspect --json "$work/conv-llama"
check_listing "$work/out" "$gen/llama/pytorch_model.bin.expect.json" noalias || fail "converted llama: inspect"
# ckpt-layout.json records the source file, its sha256 and the tied name
"$py" -S - "$work/conv-llama/ckpt-layout.json" "$gen/llama/pytorch_model.bin" <<'EOF' || fail "ckpt-layout.json source"
import hashlib, json, sys
src = json.load(open(sys.argv[1]))["source"]["files"]
assert [f["name"] for f in src] == ["pytorch_model.bin"], src
assert src[0]["sha256"] == hashlib.sha256(open(sys.argv[2], "rb").read()).hexdigest()
assert src[0]["metadata"] == {"lm_head.weight": "model.embed_tokens.weight"}, src[0]["metadata"]
t = [t for t in json.load(open(sys.argv[1]))["tensors"] if t["name"] == "model.embed_tokens.weight"]
assert t and t[0].get("tied_names") == ["lm_head.weight"], t
EOF
echo "ok ckpt-layout.json records the .bin, its sha256 and the tied lm_head"

# ---- 2. refused: views ckpt cannot read in place, hostile files ----
refuse() { # refuse FILE WANT
    local f=$1 want=$2 name
    name=$(basename "$f")
    expect_status 1 "$ckpt" inspect "$f"
    [ "$(wc -l <"$work/err")" -eq 1 ] || fail "$name: stderr is not one line: $(cat "$work/err")"
    [[ "$(cat "$work/err")" == *"$name"*"$want"* ]] || fail "$name: $(cat "$work/err")"
}
refuse "$gen/strided.pt" "tensor 'every_other' is a strided view"
refuse "$gen/overlap.pt" "tensors 'a' and 'b' are different views of overlapping bytes"
echo "ok strided and overlapping views refused"

hostile=$work/hostile marker=$work/hostile/MARKER
mkdir -p "$hostile"
"$py" -S "$E2E_DIR/torch_hostile.py" "$hostile" "$marker"
count=0
while IFS=$'\t' read -r name want; do
    refuse "$hostile/$name" "$want"
    count=$((count + 1))
done <"$hostile/cases.txt"
# convert too: nothing written, nothing run
mkdir -p "$work/hsrc" && cp "$hostile/reduce_os_system.pt" "$work/hsrc/pytorch_model.bin"
expect_status 1 "$ckpt" convert "$work/hsrc" "$work/hdst" --layout hf
[ ! -e "$work/hdst" ] || fail "a refused convert left $work/hdst"
[ -z "$(ls -A "$work" | grep -- '-tmp\|\.tmp-' || true)" ] || fail "a refused convert left temp files: $(ls -A "$work")"
[ ! -e "$marker" ] || fail "a hostile pickle ran code: $marker exists"
echo "ok $count hostile files refused, nothing run, nothing written"

# ---- 3. a repository with only torch.save weights, from a Hub ----
# (the test hub serves a store: the sharded .bin checkpoint is imported there)
export HF_HOME=$work/hf-home CKPT_HUB_BACKOFF_MS=10
unset HF_TOKEN HUGGING_FACE_HUB_TOKEN
CKPT_HOME=$work/hub "$ckpt" import "$gen/sharded" --repo org/binonly@main >/dev/null 2>&1 || fail "import of a .bin folder"
start_testhub hub
CKPT_HOME=$work/store HF_ENDPOINT=$hub_url expect_status 0 timeout 300 "$ckpt" fetch org/binonly
grep -q "no safetensors files; taking its 2 torch.save weight files" "$work/err" || fail "fetch did not say it took the .bin files: $(cat "$work/err")"
CKPT_HOME=$work/store expect_status 0 "$ckpt" pull org/binonly@main -o "$work/pulled"
for f in pytorch_model-00001-of-00002.bin pytorch_model-00002-of-00002.bin pytorch_model.bin.index.json config.json; do
    cmp -s "$gen/sharded/$f" "$work/pulled/$f" || fail "fetched $f differs from the repository's"
done
expect_status 0 "$ckpt" convert "$work/pulled" "$work/conv-fetched" --layout hf
check_converted "$work/conv-fetched" "$gen/sharded/expect.json" || fail "fetched .bin: convert"
echo "ok a .bin-only repository fetches (its pytorch_model*.bin taken), pulls back identical and converts"
# conversion inside the store: the layout's recipes are byte ranges of the
# stored .bin blobs (no tensor bytes copied); its files pull back as the
# offline convert writes them, verify rebuilds them, and gc keeps the .bin
# blobs the recipes read
CKPT_HOME=$work/store expect_status 0 "$ckpt" convert org/binonly@main --layout hf
CKPT_HOME=$work/store expect_status 0 "$ckpt" pull org/binonly@main:hf -o "$work/conv-stored"
check_converted "$work/conv-stored" "$gen/sharded/expect.json" || fail "store convert of .bin weights"
for f in "$work/conv-fetched"/*.safetensors "$work/conv-fetched"/*.json; do
    cmp -s "$f" "$work/conv-stored/$(basename "$f")" || fail "store convert: $(basename "$f") differs from the offline convert's"
done
CKPT_HOME=$work/store expect_status 0 "$ckpt" gc
CKPT_HOME=$work/store expect_status 0 "$ckpt" verify org/binonly@main:hf
echo "ok a stored .bin checkpoint converts in the store (recipes over its blobs), identical to the offline convert"

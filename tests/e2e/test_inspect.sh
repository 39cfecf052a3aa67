#!/usr/bin/env bash
# test_inspect.sh — `ckpt gen-model` and `ckpt inspect` end to end.
#
# 1. Generated checkpoints of every architecture, sharded and not, in bf16,
#    f16 and f32: `ckpt inspect --json` must list exactly what the independent
#    reader st_dump.py finds in the files, the index must list exactly the
#    tensors, and config.json must describe the tensors (names and shapes are
#    rebuilt from config.json here, in Python, independently of genmodel.c).
# 2. Generation is deterministic for a seed and different across seeds.
# 3. Hostile files: each exits 1 with one line on stderr naming the file, the
#    reference error and the tensor; never a crash. Files of other formats
#    (a pickle without torch's magic number, GGUF) are named for what they are.
# 4. Usage errors exit 2.
# Run through run.sh (needs CKPT_BIN, E2E_DIR, E2E_WORK).
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
dump="$py -S $E2E_DIR/st_dump.py"


# ---- 1. generated checkpoints against the independent reader ----

# check_config DIR SCALE ARCH: config.json has the keys of ARCH's Hugging Face
# config, widths divided by SCALE, and describes exactly the tensors listed in
# DIR/dump.json; every file carries {"format": "pt"}; values look initialised.
check_config() {
    "$py" -S - "$@" <<'EOF'
import json, struct, sys
d, scale, arch = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cfg = json.load(open(f"{d}/config.json"))
dump = json.load(open(f"{d}.dump.json"))
def fail(msg): sys.exit(f"{arch}: {msg}")
real = {  # head_dim, intermediate, vocab, hidden (None: heads * head_dim), heads, kv
    "llama": (128, 14336, 128256, None, 32, 8),
    "qwen2": (64, 4864, 151936, None, 14, 2),
    "mixtral": (128, 14336, 32000, None, 32, 8),
    "qwen3-moe": (128, 6144, 151936, 2048, 32, 4),
}[arch]
sc = lambda w: max(1, w // scale)
hd, inter, vocab = sc(real[0]), sc(real[1]), sc(real[2])
hidden = sc(real[3]) if real[3] else real[4] * hd
want = {"head_dim": hd, "intermediate_size": inter, "vocab_size": vocab, "hidden_size": hidden,
        "num_attention_heads": real[4], "num_key_value_heads": real[5]}
for k, v in want.items():
    if cfg.get(k) != v: fail(f"config {k} = {cfg.get(k)}, expected {v}")
for k in ("model_type", "architectures", "num_hidden_layers", "rms_norm_eps", "rope_theta",
          "max_position_embeddings", "tie_word_embeddings", "torch_dtype"):
    if k not in cfg: fail(f"config lacks {k}")
H, KV, L = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]
expect = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden]}
if not cfg["tie_word_embeddings"]: expect["lm_head.weight"] = [vocab, hidden]
mt = cfg["model_type"]
for i in range(L):
    p = f"model.layers.{i}"
    a = f"{p}.self_attn"
    expect.update({f"{p}.input_layernorm.weight": [hidden], f"{p}.post_attention_layernorm.weight": [hidden],
                   f"{a}.q_proj.weight": [H * hd, hidden], f"{a}.k_proj.weight": [KV * hd, hidden],
                   f"{a}.v_proj.weight": [KV * hd, hidden], f"{a}.o_proj.weight": [hidden, H * hd]})
    if mt == "qwen2":
        expect.update({f"{a}.q_proj.bias": [H * hd], f"{a}.k_proj.bias": [KV * hd], f"{a}.v_proj.bias": [KV * hd]})
    if mt in ("llama", "qwen2"):
        expect.update({f"{p}.mlp.gate_proj.weight": [inter, hidden], f"{p}.mlp.up_proj.weight": [inter, hidden],
                       f"{p}.mlp.down_proj.weight": [hidden, inter]})
    elif mt == "mixtral":
        E = cfg["num_local_experts"]
        expect[f"{p}.block_sparse_moe.gate.weight"] = [E, hidden]
        for e in range(E):
            x = f"{p}.block_sparse_moe.experts.{e}"
            expect.update({f"{x}.w1.weight": [inter, hidden], f"{x}.w2.weight": [hidden, inter],
                           f"{x}.w3.weight": [inter, hidden]})
    elif mt == "qwen3_moe":
        E, mi = cfg["num_experts"], cfg["moe_intermediate_size"]
        if mi != sc(768) or cfg["num_experts_per_tok"] != 8 or cfg["norm_topk_prob"] is not True:
            fail("qwen3_moe MoE keys are wrong")
        expect.update({f"{a}.q_norm.weight": [hd], f"{a}.k_norm.weight": [hd], f"{p}.mlp.gate.weight": [E, hidden]})
        for e in range(E):
            x = f"{p}.mlp.experts.{e}"
            expect.update({f"{x}.gate_proj.weight": [mi, hidden], f"{x}.up_proj.weight": [mi, hidden],
                           f"{x}.down_proj.weight": [hidden, mi]})
    else:
        fail(f"unexpected model_type {mt}")
got = {t["name"]: t["shape"] for t in dump["tensors"]}
if got != expect:
    fail(f"tensors differ from config: missing {sorted(set(expect) - set(got))[:3]}, "
         f"extra {sorted(set(got) - set(expect))[:3]}, "
         f"reshaped {[k for k in got if k in expect and got[k] != expect[k]][:3]}")
dt = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}[cfg["torch_dtype"]]
if {t["dtype"] for t in dump["tensors"]} != {dt}: fail(f"dtypes are not all {dt}")
for f in dump["files"]:
    if f["metadata"] != {"format": "pt"}: fail(f"{f['path']} metadata {f['metadata']}")
# Values: std about 0.02 around 0 (1 for norms); every tensor's bytes distinct.
def values(t, count):
    """The first `count` values of t as floats."""
    size = {"F32": 4, "F16": 2, "BF16": 2}[dt]
    with open(f"{d}/{t['file']}", "rb") as fh:
        fh.seek(t["offset"])
        raw = fh.read(min(t["nbytes"], count * size))
    if dt == "BF16":  # bf16 is the top half of an f32
        raw = b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2))
    return [v[0] for v in struct.iter_unpack("<e" if dt == "F16" else "<f", raw)]
seen = {}
for t in dump["tensors"]:
    v = values(t, 4096)
    if len(v) < 64:
        continue  # too few values for statistics, or to be told apart in bf16
    mean = sum(v) / len(v)
    std = (sum((x - mean) ** 2 for x in v) / len(v)) ** 0.5
    centre = 1.0 if "norm" in t["name"].rsplit(".", 2)[-2] else 0.0
    if not (abs(mean - centre) < 0.01 and 0.012 < std < 0.03):
        fail(f"{t['name']}: mean {mean:.4f} std {std:.4f}")
    key = struct.pack(f"<{len(v)}f", *v)
    if key in seen:
        fail(f"{t['name']} has the same values as {seen[key]}")
    seen[key] = t["name"]
EOF
}

# check_checkpoint NAME FILES SCALE ARCH [gen-model options]: generate into
# $work/NAME, expecting FILES safetensors files ("one" or "several"), then
# compare every view of it.
check_checkpoint() {
    local name=$1 want=$2 scale=$3 arch=$4
    shift 4
    local d="$work/$name"
    expect_status 0 "$ckpt" gen-model "$arch" "$d" --scale "$scale" --layers 2 "$@"
    grep -q "tensors" "$work/err" || fail "$name: no summary line on stderr"
    ! compgen -G "$work/*.tmp-*" >/dev/null || fail "$name: a temporary directory was left behind"
    $dump "$d" >"$d.dump.json"
    "$ckpt" inspect --json "$d" >"$d.inspect.json" || fail "$name: inspect --json failed"
    diff <($dump --canon "$d.dump.json") <($dump --canon "$d.inspect.json") >"$work/diff" ||
        fail "$name: inspect --json and st_dump.py disagree: $(head -n 20 "$work/diff")"
    check_config "$d" "$scale" "$arch" || fail "$name: config.json and tensors disagree"
    local files ntensors
    files=$("$py" -S -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["files"]))' "$d.dump.json")
    ntensors=$("$py" -S -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["tensors"]))' "$d.dump.json")
    if [ "$want" = one ]; then
        [ "$files" -eq 1 ] && [ -f "$d/model.safetensors" ] &&
            [ ! -e "$d/model.safetensors.index.json" ] ||
            fail "$name: expected model.safetensors alone, got $files file(s)"
    else
        [ "$files" -gt 2 ] && [ -f "$d/model.safetensors.index.json" ] &&
            [ ! -e "$d/model.safetensors" ] ||
            fail "$name: expected several shards and an index, got $files file(s)"
    fi
    # The text listing: a heading, one line per tensor, the totals.
    "$ckpt" inspect "$d" >"$work/text" || fail "$name: inspect failed"
    [ "$(wc -l <"$work/text")" -eq $((ntensors + 2)) ] || fail "$name: text listing has wrong line count"
    tail -n 1 "$work/text" | grep -q "^$ntensors tensors in $files file" || fail "$name: bad totals line"
    echo "ok $name: $ntensors tensors in $files file(s)"
}

check_checkpoint llama-sharded several 16 llama --shard-mb 1
check_checkpoint llama-f32 one 16 llama --dtype f32
check_checkpoint qwen2-single one 8 qwen2
check_checkpoint qwen2-sharded several 8 qwen2 --dtype f16 --shard-mb 0.5
check_checkpoint mixtral-sharded several 16 mixtral --shard-mb 2 --seed 3
check_checkpoint qwen3-moe-f32 several 16 qwen3-moe --dtype f32 --shard-mb 3
check_checkpoint qwen3-moe-single one 32 qwen3-moe

# One shard opened on its own, and the index file as PATH.
shards=("$work"/llama-sharded/model-00002-of-*.safetensors)
expect_status 0 "$ckpt" inspect --json "${shards[0]}"
$dump "${shards[0]}" >"$work/one.json"
cp "$work/out" "$work/one.inspect.json"
diff <($dump --canon "$work/one.json") <($dump --canon "$work/one.inspect.json") >/dev/null ||
    fail "single shard: inspect and st_dump.py disagree"
expect_status 0 "$ckpt" inspect "$work/llama-sharded/model.safetensors.index.json"

# ---- 2. determinism ----
expect_status 0 "$ckpt" gen-model mixtral "$work/again" --scale 16 --layers 2 --shard-mb 2 --seed 3
diff -r "$work/mixtral-sharded" "$work/again" >/dev/null || fail "same seed, different bytes"
rm -rf "$work/again"
expect_status 0 "$ckpt" gen-model mixtral "$work/again" --scale 16 --layers 2 --shard-mb 2 --seed 4
cmp -s "$work/mixtral-sharded/config.json" "$work/again/config.json" || fail "seed changed config.json"
cmp -s "$work/mixtral-sharded/model-00001-of-"*.safetensors "$work/again/model-00001-of-"*.safetensors &&
    fail "different seeds, same bytes"
expect_status 1 "$ckpt" gen-model qwen2 "$work/again" --scale 8 --layers 1
grep -q "not empty" "$work/err" || fail "non-empty OUT_DIR: unclear error $(cat "$work/err")"
rm -rf "${work:?}"/*

# ---- 3. hostile files ----
mkdir "$work/hostile"
# Each case: a file (or a directory) and a line "NAME ERROR [TENSOR]" in cases.txt.
"$py" -S - "$work/hostile" <<'EOF'
import json, os, struct, sys
d = sys.argv[1]
cases = open(f"{d}/cases.txt", "w")

def header(obj):
    return obj if isinstance(obj, bytes) else json.dumps(obj).encode()

def st(name, hdr, data=b"", expect="", tensor="", length=None):
    h = header(hdr)
    n = len(h) if length is None else length
    with open(f"{d}/{name}.safetensors", "wb") as f:
        f.write(struct.pack("<Q", n) + h + data)
    cases.write(f"{name}.safetensors {expect} {tensor}\n")

def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}

meta = {"__metadata__": {"format": "pt"}}
with open(f"{d}/truncated.safetensors", "wb") as f:
    f.write(b"\x10\x00\x00")
cases.write("truncated.safetensors HeaderTooSmall\n")
st("huge_header", {}, expect="HeaderTooLarge", length=1 << 40)
st("header_past_end", {}, expect="InvalidHeaderLength", length=4096)
st("not_utf8", b'{"bad\xff\xfe.weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
   b"\0" * 4, "InvalidHeader")
st("not_object", [1, 2], expect="InvalidHeaderDeserialization")
st("bad_metadata", {"__metadata__": {"format": 1}}, expect="InvalidHeaderDeserialization")
st("unknown_dtype", {**meta, "odd.dtype.weight": t("F33", [2], 0, 8)}, b"\0" * 8,
   "InvalidHeaderDeserialization", "odd.dtype.weight")
st("overlap", {**meta, "first.weight": t("F32", [2], 0, 8), "overlapping.weight": t("F32", [2], 4, 12)},
   b"\0" * 12, "InvalidOffset", "overlapping.weight")
st("gap", {**meta, "first.weight": t("F32", [2], 0, 8), "after.gap.weight": t("F32", [2], 16, 24)},
   b"\0" * 24, "InvalidOffset", "after.gap.weight")
st("trailing", {**meta, "only.weight": t("F32", [2], 0, 8)}, b"\0" * 12, "MetadataIncompleteBuffer")
st("duplicate", b'{"twice.weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
   b'"twice.weight": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', b"\0" * 8,
   "DuplicateTensor", "twice.weight")
st("size_mismatch", {**meta, "mis.sized.weight": t("F32", [3], 0, 8)}, b"\0" * 8,
   "TensorInvalidInfo", "mis.sized.weight")
st("overflow", {"huge.weight": t("F32", [1 << 62, 1 << 62], 0, 0)}, expect="ValidationOverflow",
   tensor="huge.weight")
st("misaligned", {"nibbles.weight": t("F4", [3], 0, 2)}, b"\0" * 2, "MisalignedSlice",
   "nibbles.weight")

def index_case(name, weight_map, total, expect):
    """A directory whose one shard holds a.weight and b.weight, and an index."""
    sub = f"{d}/{name}"
    os.makedirs(sub)
    body = json.dumps({**meta, "a.weight": t("F32", [2], 0, 8), "b.weight": t("F32", [2], 8, 16)})
    with open(f"{sub}/{good}", "wb") as f:
        f.write(struct.pack("<Q", len(body)) + body.encode() + b"\0" * 16)
    with open(f"{sub}/model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    cases.write(f"{name} {expect}\n")

good = "model-00001-of-00001.safetensors"
index_case("index_dotdot", {"a.weight": "../x.safetensors", "b.weight": good}, 16, "../x")
index_case("index_absolute", {"a.weight": "/etc/passwd", "b.weight": good}, 16, "/etc/passwd")
index_case("index_missing", {"a.weight": good, "b.weight": good, "ghost.weight": good}, 24,
           "ghost.weight")
index_case("index_unlisted", {"a.weight": good}, 8, "b.weight")
index_case("index_total", {"a.weight": good, "b.weight": good}, 17, "total_size")
# ../x exists, so only the name check can refuse it.
with open(f"{d}/x.safetensors", "wb") as f:
    f.write(struct.pack("<Q", 2) + b"{}")
EOF

while read -r name error tensor; do
    expect_status 1 "$ckpt" inspect --json "$work/hostile/$name"
    [ ! -s "$work/out" ] || fail "$name: printed a listing"
    [ "$(wc -l <"$work/err")" -eq 1 ] || fail "$name: stderr is not one line: $(cat "$work/err")"
    line=$(cat "$work/err")
    [[ "$line" == "ckpt: "* ]] || fail "$name: stderr does not start with 'ckpt: ': $line"
    [[ "$line" == *"$error"* ]] || fail "$name: expected '$error' in: $line"
    [[ "$line" == *"$name"* || "$name" == index_* ]] || fail "$name: file not named in: $line"
    [ -z "$tensor" ] || [[ "$line" == *"$tensor"* ]] || fail "$name: tensor not named in: $line"
    echo "ok hostile $name: $line"
done <"$work/hostile/cases.txt"

# Files of other formats are named for what they are (issue 14): a torch.save
# zip, a legacy pickle torch file, GGUF; not "HeaderTooLarge" of 1.8e19.
"$py" -S - "$work/hostile" <<'EOF'
import pickle, struct, sys, zipfile
d = sys.argv[1]
with zipfile.ZipFile(f"{d}/pytorch_model.bin", "w") as z:
    z.writestr("archive/data.pkl", pickle.dumps({"w": [1.0, 2.0]}, protocol=2))
open(f"{d}/legacy.pt", "wb").write(pickle.dumps({"w": [1.0]}, protocol=2) + b"\0" * 64)
open(f"{d}/model.gguf", "wb").write(b"GGUF" + struct.pack("<I", 3) + b"\0" * 64)
EOF
# A zip holding a pickle of lists is read by the torch reader (issue 16),
# which names the entry that is no tensor.
expect_status 1 "$ckpt" inspect "$work/hostile/pytorch_model.bin"
[[ "$(cat "$work/err")" == *"pytorch_model.bin: torch: entry 'w' is a list, not a tensor"* ]] ||
    fail "zip of a non-tensor pickle: $(cat "$work/err")"
for case in "legacy.pt:PyTorch (torch.save, pickle)" "model.gguf:a GGUF file"; do
    name=${case%%:*} want=${case#*:}
    expect_status 1 "$ckpt" inspect "$work/hostile/$name"
    line=$(cat "$work/err")
    [ "$(wc -l <"$work/err")" -eq 1 ] || fail "$name: stderr is not one line: $line"
    [[ "$line" == *"$name: this is "*"$want"*"not safetensors"* ]] || fail "$name: format not named: $line"
    [[ "$line" != *HeaderTooLarge* ]] || fail "$name: $line"
    echo "ok foreign $name: $line"
done

# Valid edge cases: an empty header, a scalar, a zero-size tensor.
"$py" -S - "$work/hostile" <<'EOF'
import json, struct, sys
def write(path, hdr, data=b""):
    h = json.dumps(hdr).encode()
    h += b" " * (-(8 + len(h)) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
d = sys.argv[1]
write(f"{d}/empty.safetensors", {})
write(f"{d}/edge.safetensors", {"scalar": {"dtype": "F64", "shape": [], "data_offsets": [0, 8]},
                                "zero": {"dtype": "BF16", "shape": [0, 5], "data_offsets": [8, 8]}},
      b"\0" * 8)
EOF
for f in empty edge; do
    expect_status 0 "$ckpt" inspect --json "$work/hostile/$f.safetensors"
    cp "$work/out" "$work/$f.inspect.json"
    $dump "$work/hostile/$f.safetensors" >"$work/$f.dump.json"
    diff <($dump --canon "$work/$f.dump.json") <($dump --canon "$work/$f.inspect.json") >/dev/null ||
        fail "$f: inspect and st_dump.py disagree"
done

# ---- 4. usage ----
expect_status 2 "$ckpt" inspect
expect_status 2 "$ckpt" inspect --bogus "$work"
expect_status 2 "$ckpt" inspect "$work/a" "$work/b"
expect_status 1 "$ckpt" inspect "$work/does-not-exist"
expect_status 0 "$ckpt" inspect --help
grep -q "example" "$work/out" || fail "inspect --help has no example"
expect_status 2 "$ckpt" gen-model
expect_status 2 "$ckpt" gen-model gpt2 "$work/m"
expect_status 2 "$ckpt" gen-model llama "$work/m" --scale 0
expect_status 2 "$ckpt" gen-model llama "$work/m" --dtype f8
expect_status 2 "$ckpt" gen-model llama "$work/m" --shard-mb lots
expect_status 2 "$ckpt" gen-model llama "$work/m" --layers
expect_status 0 "$ckpt" gen-model --help
grep -q "example" "$work/out" || fail "gen-model --help has no example"
[ ! -e "$work/m" ] || fail "a usage error created the output directory"
echo "all inspect checks passed"

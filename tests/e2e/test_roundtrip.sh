#!/usr/bin/env bash
# test_roundtrip.sh — `ckpt convert` then `ckpt consolidate` gives the source
# back byte for byte (issue 3, "Done when"), and the command-line contract
# around it.
#
# 1. For llama (sharded source), qwen2, mixtral and qwen3-moe, generated small
#    in bf16 (--tp 1 2 4 8) and f32 (--tp 1 8), with every preset (neuron fused
#    easydel hf): convert, consolidate, and every file of the source must come
#    back identical. The sizes keep the padding cases of the real models (Qwen2's
#    14/2 heads, vocabularies and expert widths that do not divide by 8).
#    LeakSanitizer checks the bf16 runs (every arch x preset x tp), not the
#    f32 repeats of them.
# 2. `ckpt plan --print-rules` fed back with --rules writes the same files as
#    the preset.
# 3. A non-empty DST is refused (exit 1, left as it was) unless --force.
# 4. Bad usage exits 2 and writes nothing; a plan error exits 1, writes nothing.
# 5. A narrowing cast (--dtype bf16 of an f32 model) consolidates to the
#    rounded values with a note that it is lossy; a widening one is exact.
#
#   CKPT_BIN=build/ckpt bash tests/e2e/test_roundtrip.sh   (or through run.sh)
set -euo pipefail

ckpt=${CKPT_BIN:?set CKPT_BIN to the ckpt binary}
# A sanitizer report must never pass for the exit status 1 a test expects.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}exitcode=86"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}exitcode=87:halt_on_error=1"
work=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-roundtrip.XXXXXX")
trap 'rm -rf "$work"' EXIT

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

# expect_status WANT CMD...: runs CMD (quietly), checks its exit status, keeps stderr in $work/err.
expect_status() {
    local want=$1 rc=0
    shift
    CKPT_QUIET=${CKPT_QUIET:-1} "$@" >"$work/out" 2>"$work/err" || rc=$?
    [ "$rc" -eq "$want" ] || fail "'$*' exited $rc, expected $want; stderr: $(head -c 2000 "$work/err")"
}

run() { expect_status 0 "$@"; }

# same_tree A B WHAT: the two directories hold the same files with the same bytes.
same_tree() {
    diff -rq "$1" "$2" >"$work/diff" 2>&1 || fail "$3: $(head -n 10 "$work/diff")"
}

# no_dst DST: neither DST nor a DST.tmp-* sibling exists.
no_dst() {
    [ ! -e "$1" ] || fail "$1 exists after a failed command"
    ! compgen -G "$1.tmp-*" >/dev/null || fail "$(compgen -G "$1.tmp-*") was left behind"
}

# gen ARCH DTYPE DIR [gen-model options]
gen() {
    local arch=$1 dtype=$2 dir=$3
    shift 3
    run "$ckpt" gen-model "$arch" "$dir" --dtype "$dtype" "$@"
}

declare -A size=(
    [llama]="--scale 64 --layers 2 --shard-mb 0.4"
    [qwen2]="--scale 32 --layers 2"
    [mixtral]="--scale 64 --layers 1"
    [qwen3-moe]="--scale 64 --layers 1"
)

# ---- 1. every architecture x dtype x preset x tp ----

n=0
for arch in llama qwen2 mixtral qwen3-moe; do
    for dtype in bf16 f32; do
        src="$work/$arch-$dtype"
        # shellcheck disable=SC2086
        gen "$arch" "$dtype" "$src" ${size[$arch]}
        # LeakSanitizer's check at exit costs about a third of each of these
        # short runs: the bf16 pass has it for every arch x preset x tp, the
        # f32 pass (the same code over wider elements) goes without it;
        # sections 2 and 5 below convert f32 models with it again.
        # The f32 pass runs tp 1 and 8 only (the identity and the widest
        # padding cases); tp 2 and 4 add no case four-byte elements reach
        # that bf16 does not.
        leaks=1 tps="1 2 4 8"
        [ "$dtype" = bf16 ] || { leaks=0; tps="1 8"; }
        for layout in neuron fused easydel hf; do
            for tp in $tps; do
                what="$arch $dtype --layout $layout --tp $tp"
                rm -rf "$work/conv" "$work/back"
                ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=$leaks" expect_status 0 "$ckpt" convert "$src" "$work/conv" --layout "$layout" --tp "$tp"
                [ -f "$work/conv/ckpt-layout.json" ] || fail "$what: no ckpt-layout.json"
                if [ "$tp" -gt 1 ]; then
                    [ -d "$work/conv/tp_rank_$(printf %02d $((tp - 1)))" ] || fail "$what: no folder for rank $((tp - 1))"
                fi
                ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=$leaks" expect_status 0 "$ckpt" consolidate "$work/conv" "$work/back"
                same_tree "$src" "$work/back" "$what"
                n=$((n + 1))
            done
        done
    done
done
echo "round trips: $n byte-identical"
shards=("$work"/llama-f32/model-*.safetensors)
[ "${#shards[@]}" -gt 1 ] || fail "the llama source should be sharded"

# ---- 2. --print-rules fed back with --rules ----

for spec in "qwen2-f32 neuron 8" "qwen2-bf16 fused 4" "mixtral-bf16 neuron 4" "qwen3-moe-f32 easydel 2" \
    "llama-bf16 hf 8" "llama-f32 neuron 8 --kv-size-multiplier 4"; do
    read -r model layout tp extra <<<"$spec"
    # shellcheck disable=SC2086
    run "$ckpt" plan "$work/$model" --layout "$layout" --tp "$tp" $extra --print-rules
    cp "$work/out" "$work/rules.json"
    rm -rf "$work/a" "$work/b"
    # shellcheck disable=SC2086
    run "$ckpt" convert "$work/$model" "$work/a" --layout "$layout" --tp "$tp" $extra
    run "$ckpt" convert "$work/$model" "$work/b" --rules "$work/rules.json"
    same_tree "$work/a" "$work/b" "$spec: --rules from --print-rules"
done

# ---- 3. a non-empty DST ----

src="$work/qwen2-bf16"
dst="$work/full"
mkdir "$dst"
echo keep >"$dst/keep.txt"
expect_status 1 "$ckpt" convert "$src" "$dst" --layout neuron --tp 2
grep -q "not empty" "$work/err" || fail "refusing a non-empty DST should say so: $(cat "$work/err")"
grep -q -- "--force" "$work/err" || fail "refusing a non-empty DST should mention --force: $(cat "$work/err")"
[ "$(ls -A "$dst")" = "keep.txt" ] || fail "a refused DST was changed: $(ls -A "$dst" | tr '\n' ' ')"
! compgen -G "$dst.tmp-*" >/dev/null || fail "a refused conversion left $(compgen -G "$dst.tmp-*")"
expect_status 1 "$ckpt" consolidate "$work/a" "$dst"
[ "$(ls -A "$dst")" = "keep.txt" ] || fail "consolidate changed a non-empty DST"
run "$ckpt" convert "$src" "$dst" --layout neuron --tp 2 --force
if [ -e "$dst/keep.txt" ] || [ ! -d "$dst/tp_rank_01" ]; then fail "--force did not replace DST"; fi
! compgen -G "$dst.tmp-*" >/dev/null || fail "--force left $(compgen -G "$dst.tmp-*")"
rm -rf "$work/back"
run "$ckpt" consolidate "$dst" "$work/back"
same_tree "$src" "$work/back" "after --force"
mkdir "$work/empty"
run "$ckpt" convert "$src" "$work/empty" --layout hf # an empty DST is fine

# ---- 4. bad usage exits 2, plan errors exit 1, and neither writes anything ----

out="$work/never"
for args in "convert" "convert $src" "convert $src $out" "convert $src $out --layout neuron --tp 0" \
    "convert $src $out --layout neuron --tp x" "convert $src $out --layout neuron --bogus" \
    "convert $src $out --layout neuron --max-shard-size 0" "convert $src $out extra --layout hf" \
    "convert $src $out --layout neuron --kv-size-multiplier 0" "plan" "plan $src" \
    "consolidate $dst" "consolidate $dst $out --layout neuron"; do
    # shellcheck disable=SC2086
    expect_status 2 "$ckpt" $args
    [ -s "$work/err" ] || fail "'ckpt $args' exited 2 without a message"
    no_dst "$out"
done
expect_status 1 "$ckpt" convert "$src" "$out" --layout neuron --tp 8 --kv-size-multiplier 3
grep -q "rule 1 (fuse_qkv_gqa)" "$work/err" || fail "a bad --kv-size-multiplier should name the rule: $(cat "$work/err")"
no_dst "$out"
expect_status 1 "$ckpt" convert "$src" "$out" --layout nonsense
no_dst "$out"
expect_status 1 "$ckpt" consolidate "$src" "$out" # not the output of convert
no_dst "$out"

# ---- 5. casts ----

# Narrowing: consolidation says so, and gives the bf16-rounded values back as f32.
src="$work/llama-f32"
rm -rf "$work/conv" "$work/back"
run "$ckpt" convert "$src" "$work/conv" --layout neuron --tp 2 --dtype bf16
grep -q '"lossy": true' "$work/conv/ckpt-layout.json" || fail "a narrowing cast should mark ckpt-layout.json lossy"
CKPT_QUIET=0 run "$ckpt" consolidate "$work/conv" "$work/back"
grep -qiE "lossy|narrowing cast" "$work/err" || fail "consolidating a lossy layout should say so: $(cat "$work/err")"
/usr/bin/python3 -S - "$src" "$work/back" <<'EOF' || fail "the consolidated values are not the bf16-rounded source"
# Every tensor comes back with its name, dtype and shape, and each value is the
# source value rounded to bf16 (nearest, ties to even), computed here on the bits.
import array, json, os, struct, sys

assert array.array("I").itemsize == 4

def tensors(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        with open(os.path.join(d, f), "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
            data = fh.read()
        for name, t in header.items():
            if name != "__metadata__":
                b, e = t["data_offsets"]
                out[name] = (t["dtype"], t["shape"], data[b:e])
    return out

src, back = tensors(sys.argv[1]), tensors(sys.argv[2])
if sorted(src) != sorted(back):
    sys.exit("tensor names differ")
for name, (dtype, shape, raw) in src.items():
    bdtype, bshape, braw = back[name]
    if (dtype, shape) != (bdtype, bshape) or dtype != "F32":
        sys.exit(f"{name}: {bdtype} {bshape}, expected {dtype} {shape}")
    src_bits, back_bits = array.array("I", raw), array.array("I", braw)  # little-endian hosts
    for i, (u, b) in enumerate(zip(src_bits, back_bits)):
        if ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16 != b:
            sys.exit(f"{name}[{i}]: 0x{b:08x}, expected 0x{u:08x} rounded to bf16")
EOF
# Widening is exact: bf16 -> f32 -> bf16 gives the same bytes, and no lossy note.
src="$work/llama-bf16"
rm -rf "$work/conv" "$work/back"
run "$ckpt" convert "$src" "$work/conv" --layout fused --tp 4 --dtype f32
grep -q '"lossy": false' "$work/conv/ckpt-layout.json" || fail "a widening cast is not lossy"
CKPT_QUIET=0 run "$ckpt" consolidate "$work/conv" "$work/back"
! grep -qiE "lossy|narrowing" "$work/err" || fail "a widening cast was called lossy: $(cat "$work/err")"
same_tree "$src" "$work/back" "bf16 -> f32 -> bf16"

echo "ok"

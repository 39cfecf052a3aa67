#!/usr/bin/env bash
# test_easydel_read.sh — the four ways `ckpt consolidate` reads an EasyDeL
# TensorStore save's arrays with no staging copy (docs/easydel.md, "Reading
# the arrays"): decoded whole into a worker's memory, streamed in order
# through a window (a large one-chunk array the plan only copies), decoded
# in passes over bands of its columns (a large one-chunk array the plan
# transposes, in at most 4 bands), or staged by the first worker that needs
# it into a scratch file (any other large array read out of order: more
# bands, stacked experts in chunks, an array of many chunks).
#
# The bench-sized arrays that take the last three paths are too big for a
# test; CKPT_EASYDEL_DECODE_MAX lowers the size up to which an array is
# decoded whole and CKPT_EASYDEL_BAND_MAX the band budget (the bytes of
# all workers' bands together; two workers banding kernels at once share
# it, one waiting when the other holds more than half), so small saves
# take every path:
# 1. Llama with one chunk per array and with 7-row chunks whose edges fall
#    inside the executor's tiles ("/" keys), Mixtral's stacked experts in
#    5-row chunks: consolidated at limits 0 (nothing whole) and 3000 bytes
#    (norms whole, the rest streamed or staged), each byte-identical to the
#    gen-model original (test_easydel.sh covers the default); at limit 0
#    with bands of 300000 bytes (the kernels in one band each; lm_head
#    [128, 4008] would take 4, but the executor's one tile of it is wider
#    than a band, so it is read in order instead) and 100000 (lm_head
#    staged: 11 bands). A tile narrower than a band of a larger array
#    (several passes) needs arrays of 8 MiB and more: bench/easydel.sh
#    checks that case byte for byte. --state at limit 0 gives the same
#    training state as at the default.
# 2. Hostile chunks met on the streamed, banded and staged paths are refused
#    as on the whole path, one line naming the array: a short chunk, a frame with
#    more after the chunk's bytes (a second frame: no recorded size stops it
#    up front), and DST never appears.
# Run through run.sh (needs CKPT_BIN, E2E_DIR, E2E_WORK; /usr/bin/python3
# with Debian's python3-zarr and python3-numcodecs, `make deps`).
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
gen="$E2E_DIR/../easydel_gen.py"
zpy=/usr/bin/python3
has_modules $zpy zarr numcodecs || fail "$zpy lacks zarr/numcodecs: run make deps"
cd "$work"

for arch in llama mixtral; do
    "$ckpt" gen-model "$arch" "hf-$arch" --scale 32 --layers 2 --dtype bf16 --seed 3 >/dev/null
    "$ckpt" convert "hf-$arch" "ed-$arch" --layout easydel >/dev/null
done
$zpy "$gen" ed-llama one --step 9 || fail "easydel_gen one"
$zpy "$gen" ed-llama rows --chunk-rows=7 --slash --no-tx || fail "easydel_gen rows"
$zpy "$gen" ed-mixtral moe --chunk-rows=5 --no-tx || fail "easydel_gen moe"

# ---- 1. every path, byte for byte ----
for limit in 0 3000; do
    note "CKPT_EASYDEL_DECODE_MAX=$limit"
    for save in one:llama rows:llama moe:mixtral; do
        s=${save%:*} arch=${save#*:}
        expect_status 0 env CKPT_EASYDEL_DECODE_MAX="$limit" "$ckpt" consolidate "$s" "back-$s"
        cmp -s "hf-$arch/model.safetensors" "back-$s/model.safetensors" ||
            fail "$s at limit $limit: model.safetensors differs from the original"
        ls -d back-"$s".tmp-* 2>/dev/null && fail "$s: temp folder left"
        rm -rf "back-$s"
    done
done
for band in 300000 100000; do
    note "CKPT_EASYDEL_DECODE_MAX=0 CKPT_EASYDEL_BAND_MAX=$band"
    expect_status 0 env CKPT_EASYDEL_DECODE_MAX=0 CKPT_EASYDEL_BAND_MAX=$band "$ckpt" consolidate one back-one
    cmp -s hf-llama/model.safetensors back-one/model.safetensors ||
        fail "bands of $band bytes: model.safetensors differs from the original"
    rm -rf back-one
done
note "--state"
expect_status 0 env CKPT_EASYDEL_DECODE_MAX=0 "$ckpt" consolidate one state0 --state
expect_status 0 "$ckpt" consolidate one state --state
for f in model.safetensors optimizer.safetensors optimizer.json metadata.json; do
    cmp -s "state/$f" "state0/$f" || fail "--state at limit 0: $f differs from the default's"
done
rm -rf state state0

# ---- 2. hostile chunks on the streamed, banded and staged paths ----
# Each case NAME|ARRAY|PYTHON|MESSAGE[|BAND_MAX]: a copy of `one` whose
# ARRAY's chunk PYTHON rewrites (C: the chunk's path, raw: its decoded bytes)
# must be refused at limit 0 (and bands of BAND_MAX bytes) with MESSAGE on
# one line, leaving no DST. The copies are made first and rewritten in one
# python (numcodecs, and numpy under it, cost ~0.4 CPU-s an import), then
# each is consolidated.
note "hostile chunks"
emb=model/model/embed_tokens/embedding  # copied whole: streamed
ker=model/model/layers/0/mlp/up_proj/kernel # transposed: in bands; staged with bands of 1 byte
short="open(C, 'wb').write(numcodecs.Zstd(1).encode(raw[:100]))"
more="open(C, 'wb').write(numcodecs.Zstd(1).encode(raw) + numcodecs.Zstd(1).encode(b'x' * 10))"
cases=("stream-short|$emb|$short|array '$emb': chunk '0.0' decompresses to 100 bytes"
    "stream-more|$emb|$more|array '$emb': chunk '0.0' decompresses to more than")
for band in "" 1; do
    way=${band:+staged}
    cases+=("${way:-band}-short|$ker|$short|array '$ker': chunk '0.0' decompresses to 100 bytes|$band"
        "${way:-band}-more|$ker|$more|array '$ker': chunk '0.0' decompresses to more than|$band")
done
args=()
for c in "${cases[@]}"; do
    IFS='|' read -r name a code _ <<<"$c"
    rm -rf "b-$name"
    cp -a one "b-$name"
    args+=("b-$name/$a/0.0" "$code")
done
$zpy - "${args[@]}" <<'EOF' || fail "setting up the hostile chunks"
import sys
import numcodecs
for C, code in zip(sys.argv[1::2], sys.argv[2::2]):
    raw = numcodecs.Zstd(1).decode(open(C, "rb").read())
    exec(code)
EOF
for c in "${cases[@]}"; do
    IFS='|' read -r name a code msg band <<<"$c"
    expect_status 1 env CKPT_EASYDEL_DECODE_MAX=0 ${band:+CKPT_EASYDEL_BAND_MAX=$band} "$ckpt" consolidate "b-$name" "out-$name"
    [ "$(wc -l <"$work/err")" -eq 1 ] || fail "$name: expected one line, got: $(cat "$work/err")"
    grep -qF "$msg" "$work/err" || fail "$name: '$msg' not in: $(cat "$work/err")"
    [ ! -e "out-$name" ] || fail "$name: DST appeared"
    ls -d out-"$name".tmp-* 2>/dev/null && fail "$name: temp folder left"
    rm -rf "b-$name"
done
note "done"

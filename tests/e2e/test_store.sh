#!/usr/bin/env bash
# test_store.sh — the content-addressed store end to end (issue 4, "Done when").
#
# 1. import then pull: every generated architecture, one file and sharded,
#    pulled as a folder, as tar / tar.zst files and streamed with `-o -`: the
#    files' sha256 equal the source's. Importing a .tar / .tar.gz / .tar.zst of
#    the folder gives the same checkpoint; importing again stores nothing new.
#    A file of two read chunks (a tensor across their edge), and a copy
#    of it with one tensor changed, come back byte for byte.
# 2. convert inside the store then pull equals the offline `ckpt convert`
#    byte for byte (diff -r) for every preset at tp 1 and tp > 1; converting
#    again prints the same ref (each layout at tp > 1, neuron at tp 1, a
#    cast); --rank R equals DST/tp_rank_RR; --consolidated equals the source.
# 3. du: a recipe layout (neuron tp8, fused, hf) adds under 1% physical bytes.
# 4. verify: a flipped byte in a tensor blob, in a whole-file blob and a
#    missing blob are named (blob, checkpoint ref, file); pull of a damaged
#    checkpoint exits 1 and leaves no destination.
# (5 and 6, the crash points and concurrent imports, are test_store_crash.sh.)
# 7. rm then gc frees the blobs; a converted layout survives its original.
#    gc beside another process's write transaction fails after
#    CKPT_GC_LOCK_TIMEOUT_S, saying so.
# Run through run.sh (needs CKPT_BIN, E2E_DIR, E2E_WORK). Uses python3, tar,
# zstd, sha256sum (no sqlite3: blobs are found by hashing the source bytes).
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
. "$E2E_DIR/store_lib.sh"
# =========================================================================
# 1. import then pull
# =========================================================================
note "1. import / pull round trips"
export CKPT_HOME=$work/h1
# pull_check REF SRC FORMAT: pulls REF as FORMAT (dir, tar, tar.zst: to a file;
# -tar, -tar.zst: streamed with -o -) and compares every file's sha256 with SRC's.
pull_check() {
    local ref=$1 src=$2 fmt=$3 p=$work/pull
    case "$fmt" in
    dir) expect_status 0 "$ckpt" pull "$ref" -o "$p" ;;
    tar | tar.zst)
        expect_status 0 "$ckpt" pull "$ref" -o "$work/p.$fmt" --format "$fmt"
        untar "$work/p.$fmt" "$p"
        ;;
    -tar | -tar.zst)
        local opt=() f=${fmt#-}
        [ "$f" = tar ] || opt=(--format "$f") # -o - defaults to tar
        "$ckpt" pull "$ref" -o - "${opt[@]}" >"$work/p.$f" 2>"$work/err" || fail "pull $ref -o - $f: $(cat "$work/err")"
        untar "$work/p.$f" "$p"
        ;;
    esac
    same_tree "$src" "$p" "pull $ref ($fmt)"
    rm -rf "$p" "$work"/p.tar*
}
# arch, seed, a shard size that splits it into several files, and the archive
# forms to pull the one-file and the sharded checkpoint through
for spec in "llama 1 0.6 -tar.zst tar" "qwen2 2 0.1 tar -tar" "mixtral 3 0.8 -tar tar.zst" "qwen3-moe 4 0.6 tar.zst -tar.zst"; do
    set -- $spec
    arch=$1 seed=$2 shard=$3 fmt_one=$4 fmt_sharded=$5
    gen "$arch" "$M/$arch-one" --scale 32 --layers 2 --seed "$seed" --shard-mb 0
    gen "$arch" "$M/$arch-sharded" --scale 32 --layers 2 --seed "$seed" --shard-mb "$shard"
    [ -e "$M/$arch-one/model.safetensors" ] || fail "$arch-one is not one file"
    n=$(find "$M/$arch-sharded" -name '*.safetensors' | wc -l)
    [ -e "$M/$arch-sharded/model.safetensors.index.json" ] && [ "$n" -ge 2 ] || fail "$arch-sharded is not sharded ($n files)"
    for kind in one sharded; do
        src=$M/$arch-$kind
        ref=$(run "$ckpt" import "$src" --repo "t/$arch-$kind")
        [ "$ref" = "t/$arch-$kind@main" ] || fail "import printed '$ref', expected t/$arch-$kind@main"
        pull_check "$ref" "$src" dir
        if [ $kind = one ]; then pull_check "$ref" "$src" "$fmt_one"; else pull_check "$ref" "$src" "$fmt_sharded"; fi
    done
    diff <(sums "$src") <(show_sums "$ref") >/dev/null || fail "$ref: the catalog's sha256 differ from the source's"
done
tmp_empty "pulls"
[ "$(refs | wc -l)" -eq 8 ] || fail "ls lists $(refs | wc -l) checkpoints, expected 8"

note "1b. archives and repeated imports store nothing new"
phys=$(du_field physical_bytes) blobs=$(du_field blobs)
src=$M/llama-sharded
commit=$(run "$ckpt" import "$src" --repo t/llama-sharded --json | jget commit)
grep -q "already stored" "$work/err" || fail "a second import does not say 'already stored': $(cat "$work/err")"
tar -C "$src" -cf "$work/a.tar" .
tar -C "$src" -czf "$work/a.tar.gz" .
tar -C "$src" -cf - . | zstd -q >"$work/a.tar.zst"
for ext in tar tar.gz tar.zst; do
    # under the same name: already stored, same commit
    out=$(run "$ckpt" import "$work/a.$ext" --repo t/llama-sharded --json)
    [ "$(jget ref <<<"$out")" = t/llama-sharded@main ] && [ "$(jget commit <<<"$out")" = "$commit" ] ||
        fail "import of the .$ext gives another checkpoint: $out"
    grep -q "already stored" "$work/err" || fail "import of the .$ext does not say 'already stored'"
done
# all under one top folder (tar cf a.tar llama/): the folder's contents, the same checkpoint
tar -C "$(dirname "$src")" -cf "$work/a-top.tar" "$(basename "$src")"
out=$(run "$ckpt" import "$work/a-top.tar" --repo t/llama-sharded --json)
[ "$(jget commit <<<"$out")" = "$commit" ] || fail "a tar with one top folder gives another checkpoint: $out"
# under another name: the same content id, the same blobs, the same bytes out
out=$(run "$ckpt" import "$work/a.tar.zst" --repo t/from-archive --json)
[ "$(jget commit <<<"$out")" = "$commit" ] || fail "the .tar.zst imported as t/from-archive has another commit: $out"
pull_check t/from-archive "$src" dir
rm -f "$work"/a.tar*
[ "$(du_field physical_bytes)" = "$phys" ] || fail "archives / re-imports grew the store: $phys -> $(du_field physical_bytes) bytes"
[ "$(du_field blobs)" = "$blobs" ] || fail "archives / re-imports added blobs: $blobs -> $(du_field blobs)"
tmp_empty "archive imports"
# a top folder holding a folder of its own name
mkdir -p "$work/top/m/m" && echo '{}' >"$work/top/m/m/extra.json" && cp "$src/config.json" "$work/top/m/"
tar -C "$work/top" -cf "$work/top.tar" m
expect_status 0 "$ckpt" import "$work/top.tar" --repo t/hoist
expect_status 0 "$ckpt" pull t/hoist -o "$work/pull"
diff -r "$work/top/m" "$work/pull" >/dev/null || fail "the top folder's contents did not come back from t/hoist"
rm -rf "$work/top" "$work/top.tar" "$work/pull"
expect_status 0 "$ckpt" rm t/hoist
# a checkpoint without safetensors files (config.json and a .bin) pulls back as it was
mkdir -p "$work/plain" && cp "$src/config.json" "$work/plain/" && head -c 100000 /dev/urandom >"$work/plain/pytorch_model.bin"
expect_status 0 "$ckpt" import "$work/plain" --repo t/plain
expect_status 0 "$ckpt" pull t/plain -o "$work/pull"
diff -r "$work/plain" "$work/pull" >/dev/null || fail "pull of a checkpoint without safetensors differs"
rm -rf "$work/plain" "$work/pull"
expect_status 0 "$ckpt" rm t/plain
expect_status 0 "$ckpt" gc
expect_status 2 "$ckpt" pull t/llama-one
expect_status 2 "$ckpt" import "$M/llama-one"
expect_status 1 "$ckpt" pull t/no-such -o "$work/pull"
[ ! -e "$work/pull" ] || fail "a failed pull left $work/pull"
# a file of two 8 MiB read chunks, a tensor (layer 0's down_proj) across
# their edge; a copy with its last byte changed (the first tensors found
# stored, the changed one hashed first, then read again into its blob)
note "1c. a file read in two chunks; a copy with one tensor changed"
src=$M/llama-big
gen llama "$src" --scale 16 --layers 2 --shard-mb 0
[ "$(stat -c %s "$src/model.safetensors")" -gt $((8 << 20)) ] || fail "llama-big is not over one 8 MiB chunk"
cp -r "$src" "$M/llama-big2"
"$py" -S -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(-1, 2); b = f.read(1); f.seek(-1, 2); f.write(bytes([b[0] ^ 1]))' \
    "$M/llama-big2/model.safetensors"
for v in llama-big llama-big2; do
    ref=$(run "$ckpt" import "$M/$v" --repo "t/$v")
    pull_check "$ref" "$M/$v" dir
    diff <(sums "$M/$v") <(show_sums "$ref") >/dev/null || fail "$ref: the catalog's sha256 differ from the source's"
    expect_status 0 "$ckpt" rm "t/$v"
done
rm -rf "$src" "$M/llama-big2"

# =========================================================================
# 2. convert in the store == offline convert
# =========================================================================
note "2. store convert vs offline convert"
# check_convert SRC_NAME LAYOUT TP [extra options]: store convert, then pull,
# --rank (the last rank, and rank 0 for neuron) and --consolidated.
check_convert() {
    local name=$1 layout=$2 tp=$3
    shift 3
    local src=$M/$name ref=t/$name off=$work/off p=$work/pull out again r rr f b
    out=$(run "$ckpt" convert "$ref" --layout "$layout" --tp "$tp" "$@")
    case "$out" in
    "$ref@main:$layout"*) ;;
    *) fail "convert $ref --layout $layout --tp $tp printed '$out'" ;;
    esac
    if [ "$tp" -gt 1 ]; then [[ "$out" == *"tp$tp"* ]] || fail "layout name '$out' does not say tp$tp"; fi
    expect_status 0 "$ckpt" convert "$src" "$off" --layout "$layout" --tp "$tp" "$@"
    # No tensor byte was read: the safetensors files' sha256 wait for the
    # first pull, which records what it wrote.
    [ "$(pending_sha "$out")" = "$(find "$off" -name '*.safetensors' | wc -l)" ] ||
        fail "convert $out left $(pending_sha "$out") files' sha256 pending, expected one per safetensors file"
    expect_status 0 "$ckpt" pull "$out" -o "$p"
    diff -r "$off" "$p" >"$work/diff" || fail "pull $out differs from the offline convert: $(head -c 1500 "$work/diff")"
    diff <(sums "$off") <(show_sums "$out") >"$work/diff" || fail "$out: the sha256 the pull recorded: $(head -c 1500 "$work/diff")"
    rm -rf "$p"
    # converting again: the same ref, nothing new (AGAIN=0 skips it where
    # the same lookup is checked by the cases named below)
    if [ "${AGAIN:-1}" = 1 ]; then
        again=$(run "$ckpt" convert "$ref" --layout "$layout" --tp "$tp" "$@")
        [ "$again" = "$out" ] || fail "converting again printed '$again', expected '$out'"
        grep -q "already stored" "$work/err" || fail "converting $out again does not say 'already stored'"
    fi
    if [ "$tp" -gt 1 ]; then
        for r in $([ "$layout" = neuron ] && echo 0) $((tp - 1)); do
            rr=$(printf '%02d' "$r")
            expect_status 0 "$ckpt" pull "$out" --rank "$r" -o "$p"
            [ -d "$off/tp_rank_$rr" ] || fail "offline convert has no tp_rank_$rr"
            for f in "$off/tp_rank_$rr"/*; do
                cmp -s "$f" "$p/$(basename "$f")" || fail "pull $out --rank $r: $(basename "$f") differs from tp_rank_$rr"
            done
            for f in "$p"/*; do
                b=$(basename "$f")
                [ -e "$off/tp_rank_$rr/$b" ] && continue
                case "$b" in
                config.json | ckpt-layout.json) cmp -s "$f" "$off/$b" || fail "pull $out --rank $r: $b differs" ;;
                *) fail "pull $out --rank $r wrote an extra file $b" ;;
                esac
            done
            rm -rf "$p"
        done
    fi
    expect_status 0 "$ckpt" pull "$out" --consolidated -o "$p"
    same_tree "$src" "$p" "pull $out --consolidated"
    rm -rf "$p" "$off"
}
# qwen2: 14 heads, 2 KV heads (padding at tp 4), q/k/v biases, tied
# embeddings. Converting again (a store lookup of the same layout: "already
# stored", the same ref) is checked for every layout at tp 4 and for neuron
# at tp 1, whose name has no tp; the other cases make the same lookup.
for layout in neuron fused easydel hf; do
    again=0
    [ "$layout" = neuron ] && again=1
    AGAIN=$again check_convert qwen2-sharded "$layout" 1
    check_convert qwen2-sharded "$layout" 4
done
# experts: stacked, fused, sliced
check_convert mixtral-sharded neuron 8
# A layout pull opens each blob once, not once per part (8 per expert tensor at
# tp 8): with the descriptors limited to the store's blob count + 48 it works.
nfd=$(($(du_field blobs) + 48))
(ulimit -n "$nfd" && exec "$ckpt" pull t/mixtral-sharded@main:neuron-tp8 -o "$work/pull" >/dev/null 2>"$work/err") ||
    fail "pull of neuron-tp8 with $nfd descriptors: $(cat "$work/err")"
rm -rf "$work/pull"
AGAIN=0 check_convert mixtral-sharded fused 1
AGAIN=0 check_convert qwen3-moe-one easydel 2
AGAIN=0 check_convert qwen3-moe-one hf 2
check_convert llama-one hf 1 --dtype f16 # a cast: computed tensors get blobs of their own
expect_status 0 "$ckpt" pull t/qwen2-sharded:fused-tp4 --consolidated -o "$work/c.tar" --format tar
untar "$work/c.tar" "$work/c"
same_tree "$M/qwen2-sharded" "$work/c" "pull --consolidated --format tar"
rm -rf "$work/c" "$work/c.tar"
expect_status 1 "$ckpt" convert t/qwen2-sharded:fused-tp4 --layout neuron --tp 2
expect_status 1 "$ckpt" pull t/qwen2-sharded:neuron-tp3 -o "$work/pull"
# --rank names one of the layout's ranks; an original has none
expect_status 1 "$ckpt" pull t/qwen2-sharded:neuron-tp4 --rank 4 -o "$work/pull"
grep -q "rank 4 is out of range: checkpoint [0-9]* has ranks 0-3" "$work/err" || fail "pull --rank 4 of tp4: $(cat "$work/err")"
[ ! -e "$work/pull" ] || fail "pull --rank 4 of tp4 made $work/pull"
expect_status 1 "$ckpt" pull t/qwen2-sharded@main --rank 0 -o "$work/pull"
grep -q "is not tensor-parallel" "$work/err" || fail "pull --rank 0 of an original: $(cat "$work/err")"
[ ! -e "$work/pull" ] || fail "pull --rank 0 of an original made $work/pull"
tmp_empty "converts"
expect_status 0 "$ckpt" verify t/qwen2-sharded:neuron-tp4
expect_status 0 "$ckpt" verify t/mixtral-sharded
rm -rf "$CKPT_HOME"

# =========================================================================
# 3. du: recipe layouts cost under 1%
# =========================================================================
note "3. du growth of recipe layouts"
export CKPT_HOME=$work/h3
# 46 MB: what a layout adds is a few recipes and headers per file, about
# 0.25% of this for neuron tp8 (0.06% at --scale 4), four times under the
# goal; a layout stored as copies would add a quarter or more.
gen llama "$M/big" --scale 8 --layers 2
expect_status 0 "$ckpt" import "$M/big" --repo t/big
for spec in "neuron --tp 8" "fused" "hf"; do
    before=$(du_field physical_bytes)
    expect_status 0 "$ckpt" convert t/big --layout $spec
    after=$(du_field physical_bytes)
    "$py" -S -c '
import sys
b, a, what = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
g = (a - b) / b
print(f"   {what}: physical {b} -> {a} bytes (+{100 * g:.4f}%)")
if g >= 0.01: sys.exit(f"FAIL: {what} grew the store by {100 * g:.3f}% (goal < 1%)")' "$before" "$after" "$spec"
done
expect_status 0 "$ckpt" convert "$M/big" "$work/off" --layout neuron --tp 8
expect_status 0 "$ckpt" pull t/big:neuron-tp8 --rank 3 -o "$work/pull"
for f in "$work/off/tp_rank_03"/*; do cmp -s "$f" "$work/pull/$(basename "$f")" || fail "big neuron-tp8 rank 3: $(basename "$f") differs"; done
rm -rf "$work/off" "$work/pull" "$CKPT_HOME"

# =========================================================================
# 4. verify and damaged blobs
# =========================================================================
note "4. verify names damaged blobs; pull refuses them"
export CKPT_HOME=$work/h4
src=$M/qwen2-sharded
expect_status 0 "$ckpt" import "$src" --repo t/v
expect_status 0 "$ckpt" convert t/v --layout neuron --tp 2
expect_status 0 "$ckpt" import "$M/mixtral-one" --repo t/other
expect_verify_clean "before damage"
# The blob of a tensor: the sha256 of its bytes in the source file.
tensor_blob() {
    $dump "$1" | "$py" -S -c '
import hashlib, json, sys
d, name = sys.argv[1], sys.argv[2]
t = next(t for t in json.load(sys.stdin)["tensors"] if t["name"] == name)
with open(f"{d}/{t['"'file'"']}", "rb") as f:
    f.seek(t["offset"])
    print(hashlib.sha256(f.read(t["nbytes"])).hexdigest(), t["file"])' "$1" "$2"
}
blob_path() { echo "$CKPT_HOME/blobs/${1:0:2}/${1:2}"; }
flip() { "$py" -S -c '
import sys
p = sys.argv[1]
with open(p, "r+b") as f:
    f.seek(0, 2); n = f.tell(); f.seek(n // 2); b = f.read(1); f.seek(n // 2); f.write(bytes([b[0] ^ 0x40]))' "$1"; }
# expect_damage WHAT FULL BLOB WORDS...: verify exits 1 and names BLOB and every
# word; pulls of t/v fail cleanly (FULL=1: in every form).
expect_damage() {
    local what=$1 full=$2 blob=$3 w
    shift 3
    expect_status 1 "$ckpt" verify
    for w in "$blob" "$@"; do
        grep -qF -- "$w" "$work/out" || fail "$what: verify does not name '$w': $(head -c 2000 "$work/out")"
    done
    expect_status 1 "$ckpt" verify t/v
    expect_status 0 "$ckpt" verify t/other
    for r in t/v t/v:neuron-tp2; do
        expect_status 1 "$ckpt" pull "$r" -o "$work/pull"
        [ ! -e "$work/pull" ] || fail "$what: a failed pull of $r left $work/pull"
        [ "$(wc -l <"$work/err")" -ge 1 ] || fail "$what: pull of $r failed silently"
    done
    # consolidated straight from the stored parts: the result is checked
    # against the source's sha256 in ckpt-layout.json
    expect_status 1 "$ckpt" pull t/v:neuron-tp2 --consolidated -o "$work/pull"
    [ ! -e "$work/pull" ] || fail "$what: a failed pull --consolidated left $work/pull"
    [ "$(wc -l <"$work/err")" -ge 1 ] || fail "$what: pull --consolidated failed silently"
    [ -z "${CONSOLIDATED_NAMES:-}" ] || grep -qF -- "$CONSOLIDATED_NAMES" "$work/err" ||
        fail "$what: pull --consolidated does not name $CONSOLIDATED_NAMES: $(cat "$work/err")"
    if [ "$full" = 0 ]; then
        tmp_empty "$what: failed pulls"
        return 0
    fi
    expect_status 1 "$ckpt" pull t/v -o "$work/p.tar" --format tar
    [ ! -e "$work/p.tar" ] || fail "$what: a failed pull left $work/p.tar"
    expect_status 1 "$ckpt" pull t/v -o -
    [ ! -s "$work/out" ] || fail "$what: a failed pull -o - wrote $(wc -c <"$work/out") bytes to stdout"
    expect_status 1 "$ckpt" pull t/v:neuron-tp2 --rank 1 -o "$work/pull"
    [ ! -e "$work/pull" ] || fail "$what: a failed pull --rank left $work/pull"
    tmp_empty "$what: failed pulls"
}
read -r blob file < <(tensor_blob "$src" model.layers.1.self_attn.q_proj.weight)
bp=$(blob_path "$blob")
[ -f "$bp" ] || fail "no blob file $bp for q_proj"
cp "$bp" "$work/saved-blob"
flip "$bp"
CONSOLIDATED_NAMES="$file: the rebuilt file has sha256" \
    expect_damage "flipped tensor blob" 1 "$blob" "t/v@main" "t/v@main:neuron-tp2" "$file" model.layers.1.self_attn.q_proj.weight
grep -qF "t/other" "$work/out" && fail "verify blames t/other, which does not use the blob"
cp "$work/saved-blob" "$bp"
expect_verify_clean "tensor blob restored"
# a whole-file blob (config.json)
cblob=$(sha256sum <"$src/config.json" | cut -c1-64)
cp "$(blob_path "$cblob")" "$work/saved-blob"
flip "$(blob_path "$cblob")"
expect_damage "flipped config.json blob" 0 "$cblob" "t/v@main" "config.json"
cp "$work/saved-blob" "$(blob_path "$cblob")"
# a missing blob
mv "$bp" "$work/saved-blob"
expect_damage "missing blob" 0 "$blob" "missing" "t/v@main" "$file"
mv "$work/saved-blob" "$bp"
expect_verify_clean "blobs restored"
expect_status 0 "$ckpt" pull t/v -o "$work/pull"
same_tree "$src" "$work/pull" "pull after restoring"
rm -rf "$work/pull" "$CKPT_HOME"

# =========================================================================
# 7. rm and gc
# =========================================================================
note "7. rm then gc; layouts outlive their original"
export CKPT_HOME=$work/h7
expect_status 0 "$ckpt" import "$M/mixtral-one" --repo t/keep
p0=$(du_field physical_bytes) b0=$(du_field blobs)
src=$M/qwen2-sharded
expect_status 0 "$ckpt" import "$src" --repo t/r
expect_status 0 "$ckpt" convert t/r --layout fused --tp 2
expect_status 0 "$ckpt" convert "$src" "$work/off" --layout fused --tp 2
p1=$(du_field physical_bytes)
[ "$p1" -gt "$p0" ] || fail "importing t/r did not grow the store"
expect_status 0 "$ckpt" rm t/r@main
refs | grep -xF t/r@main >/dev/null && fail "rm t/r@main: still listed"
expect_status 1 "$ckpt" pull t/r@main -o "$work/pull"
expect_status 0 "$ckpt" gc
expect_status 0 "$ckpt" pull t/r:fused-tp2 -o "$work/pull"
diff -r "$work/off" "$work/pull" >/dev/null || fail "the layout of a removed original no longer equals the offline convert"
rm -rf "$work/pull"
expect_status 0 "$ckpt" pull t/r:fused-tp2 --consolidated -o "$work/pull"
same_tree "$src" "$work/pull" "consolidated layout of a removed original"
rm -rf "$work/pull" "$work/off"
expect_verify_clean "layout without its original"
expect_status 0 "$ckpt" rm t/r:fused-tp2
expect_status 0 "$ckpt" gc
[ "$(du_field physical_bytes)" = "$p0" ] && [ "$(du_field blobs)" = "$b0" ] ||
    fail "rm + gc did not free t/r's blobs: physical $(du_field physical_bytes) (expected $p0), blobs $(du_field blobs) (expected $b0)"
gc_settled "rm + gc"
expect_status 1 "$ckpt" rm t/r@main
expect_status 0 "$ckpt" pull t/keep -o "$work/pull"
same_tree "$M/mixtral-one" "$work/pull" "t/keep after rm + gc"
rm -rf "$work/pull"
expect_status 0 "$ckpt" rm t/keep
# Another process in a write transaction (a writer stopped mid-way): gc waits
# CKPT_GC_LOCK_TIMEOUT_S for the write lock, not for ever, and fails saying so.
mkfifo "$work/lock.in"
"$py" -c '
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.read()
c.execute("COMMIT")' "$CKPT_HOME/ckpt.db" <"$work/lock.in" >"$work/lock.out" 2>&1 &
lock_pid=$!
exec 7>"$work/lock.in"
wait_until 60 "python to hold the catalog's write lock" grep -q held "$work/lock.out"
CKPT_GC_LOCK_TIMEOUT_S=0.3 expect_status 1 "$ckpt" gc
grep -q "another process holds the write lock of $CKPT_HOME/ckpt.db; try again" "$work/err" ||
    fail "gc beside a write transaction: $(cat "$work/err")"
exec 7>&-
wait "$lock_pid" || fail "the python holding the write lock failed: $(cat "$work/lock.out")"
expect_status 0 "$ckpt" gc
[ "$(du_field physical_bytes)" = 0 ] && [ "$(du_field blobs)" = 0 ] || fail "an empty store still holds blobs"

# =========================================================================
# 8. (known bug, off by default) the same import / convert twice at once
# =========================================================================
# Both runs pass store_find before either commits; the second then fails on
# the catalog's UNIQUE (repo, commit_sha, layout) instead of reporting the
# checkpoint the first one stored. Run with CKPT_TEST_KNOWN_BUGS=1 once fixed.
if [ "${CKPT_TEST_KNOWN_BUGS:-0}" = 1 ]; then
    note "8. the same import and convert twice at once"
    export CKPT_HOME=$work/h8
    for what in import convert; do
        pids=()
        for i in 1 2; do
            if [ $what = import ]; then
                "$ckpt" import "$M/mixtral-sharded" --repo t/dup >"$work/dup$i.out" 2>"$work/dup$i.err" &
            else
                "$ckpt" convert t/dup --layout neuron --tp 4 >"$work/dup$i.out" 2>"$work/dup$i.err" &
            fi
            pids+=($!)
        done
        for i in 1 2; do
            wait "${pids[$((i - 1))]}" || fail "concurrent $what $i of the same content failed: $(cat "$work/dup$i.err")"
        done
        cmp -s "$work/dup1.out" "$work/dup2.out" || fail "concurrent ${what}s print different refs"
        rm -f "$work"/dup*
    done
    expect_verify_clean "concurrent duplicates"
    rm -rf "$CKPT_HOME"
fi
echo "PASS"

#!/usr/bin/env bash
# test_store.sh — the content-addressed store end to end (issue 4, "Done when").
#
# 1. import then pull: every generated architecture, one file and sharded,
#    pulled as a folder, as tar / tar.zst files and streamed with `-o -`: the
#    files' sha256 equal the source's. Importing a .tar / .tar.gz / .tar.zst of
#    the folder gives the same checkpoint; importing again stores nothing new.
# 2. convert inside the store then pull equals the offline `ckpt convert`
#    byte for byte (diff -r) for every preset at tp 1 and tp > 1; converting
#    again prints the same ref; --rank R equals DST/tp_rank_RR; --consolidated
#    equals the source.
# 3. du: a recipe layout (neuron tp8, fused, hf) adds under 1% physical bytes.
# 4. verify: a flipped byte in a tensor blob, in a whole-file blob and a
#    missing blob are named (blob, checkpoint ref, file); pull of a damaged
#    checkpoint exits 1 and leaves no destination.
# 5. import, store convert and gc stopped (SIGKILL) at every named crash point
#    they pass (CKPT_FAULT, common/fault.h): nothing half-visible, verify
#    clean, gc removes the leftovers, a fresh run works.
# 6. concurrent imports sharing tensors while gc loops: every checkpoint
#    pulls with matching sha256, verify is clean.
# 7. rm then gc frees the blobs; a converted layout survives its original.
# Run through run.sh (needs CKPT_BIN, E2E_DIR, E2E_WORK). Uses python3, tar,
# zstd, sha256sum (no sqlite3: blobs are found by hashing the source bytes).
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
dump="python3 $E2E_DIR/st_dump.py"
# run CMD...: expect_status 0 and print CMD's stdout.
run() {
    expect_status 0 "$@"
    cat "$work/out"
}
gen() { expect_status 0 "$ckpt" gen-model "$@"; }
# untar ARCHIVE DIR: extracts a .tar or .tar.zst (checked strictly by zstd) into a new DIR.
untar() {
    mkdir "$2"
    if [[ "$1" == *.zst ]]; then
        zstd -q -dc "$1" >"$1.tar" 2>"$work/err" || fail "$1: zstd -d fails: $(cat "$work/err")"
        tar -xf "$1.tar" -C "$2" || fail "$1: not a tar"
        rm -f "$1.tar"
    else
        tar -xf "$1" -C "$2" || fail "$1: not a tar"
    fi
}

# sums DIR: "sha256  relative path" of every file under DIR, sorted.
sums() { (cd "$1" && find . -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 -r sha256sum); }
# same_tree WANT GOT WHAT: same files with the same sha256.
same_tree() {
    [ -d "$2" ] || fail "$3: $2 is not a folder"
    if ! diff <(sums "$1") <(sums "$2") >"$work/diff"; then
        fail "$3: files differ from $1: $(head -c 1500 "$work/diff")"
    fi
}
# jget FIELD: a top-level field of the JSON object on stdin.
jget() { python3 -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
du_field() { "$ckpt" du --json | jget "$1"; }
# refs: the sorted refs `ckpt ls --json` lists.
refs() { "$ckpt" ls --json | python3 -c 'import json, sys; print("\n".join(sorted(c["ref"] for c in json.load(sys.stdin)["checkpoints"])))'; }
# show_sums REF: "sha256  path" of REF's files as the catalog records them (same form as sums).
show_sums() {
    "$ckpt" show "$1" --json | python3 -c '
import json, sys
for f in sorted(json.load(sys.stdin)["files"], key=lambda f: f["path"].encode()):
    print(f["sha256"] + "  " + f["path"])'
}
tmp_empty() {
    [ -z "$(ls -A "$CKPT_HOME/tmp")" ] || fail "$1: $CKPT_HOME/tmp is not empty: $(ls -A "$CKPT_HOME/tmp" | head -5 | tr '\n' ' ')"
}
# gc_settled WHAT: a second gc (dry run) finds nothing, tmp/ is empty.
gc_settled() {
    local j
    j=$("$ckpt" gc --dry-run --json) || fail "$1: gc --dry-run failed"
    python3 -c '
import json, sys
j = json.loads(sys.argv[1])
bad = {k: j[k] for k in ("blobs_removed", "temps_removed", "leases_dropped") if j[k]}
if bad: sys.exit(f"{sys.argv[2]}: gc --dry-run after gc still finds {bad}")' "$j" "$1" || fail "$1: gc left work"
    tmp_empty "$1"
}
expect_verify_clean() {
    expect_status 0 "$ckpt" verify
    grep -q "damaged" "$work/out" && fail "$1: verify printed damage: $(head -c 1000 "$work/out")"
    return 0
}

# crash_points CMD...: runs CMD once with CKPT_FAULT_TRACE and prints the crash
# points (common/fault.h) to stop it at: the first and the last pass of each
# distinct point it went through, as NAME:N.
crash_points() {
    rm -f "$work/trace"
    CKPT_FAULT_TRACE=$work/trace "$@" >/dev/null 2>&1 || fail "'$*' failed when traced"
    [ -s "$work/trace" ] || fail "'$*' passed no crash point"
    sort "$work/trace" | uniq -c | while read -r n p; do
        printf '%s:1\n' "$p"
        [ "$n" -gt 1 ] && printf '%s:%d\n' "$p" "$n"
        true
    done
    rm -f "$work/trace"
}
# crash_at SPEC CMD...: runs CMD stopped (SIGKILL) at crash point SPEC; it must
# get there (exit status 137), not finish or fail on its own.
crash_at() {
    local spec=$1 rc=0
    shift
    CKPT_FAULT=$spec "$@" >/dev/null 2>"$work/crash.err" || rc=$?
    [ $rc -eq 137 ] || fail "'$*' was not stopped at $spec (exit $rc): $(head -c 500 "$work/crash.err")"
}

M=$work/models
mkdir -p "$M"

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
    expect_status 0 "$ckpt" pull "$out" -o "$p"
    diff -r "$off" "$p" >"$work/diff" || fail "pull $out differs from the offline convert: $(head -c 1500 "$work/diff")"
    rm -rf "$p"
    # converting again: the same ref, nothing new
    again=$(run "$ckpt" convert "$ref" --layout "$layout" --tp "$tp" "$@")
    [ "$again" = "$out" ] || fail "converting again printed '$again', expected '$out'"
    grep -q "already stored" "$work/err" || fail "converting $out again does not say 'already stored'"
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
# qwen2: 14 heads, 2 KV heads (padding at tp 4), q/k/v biases, tied embeddings
for layout in neuron fused easydel hf; do
    for tp in 1 4; do check_convert qwen2-sharded "$layout" "$tp"; done
done
# experts: stacked, fused, sliced
check_convert mixtral-sharded neuron 8
# A layout pull opens each blob once, not once per part (8 per expert tensor at
# tp 8): with the descriptors limited to the store's blob count + 48 it works.
nfd=$(($(find "$CKPT_HOME/blobs" -type f | wc -l) + 48))
(ulimit -n "$nfd" && exec "$ckpt" pull t/mixtral-sharded@main:neuron-tp8 -o "$work/pull" >/dev/null 2>"$work/err") ||
    fail "pull of neuron-tp8 with $nfd descriptors: $(cat "$work/err")"
rm -rf "$work/pull"
check_convert mixtral-sharded fused 1
check_convert qwen3-moe-one easydel 2
check_convert qwen3-moe-one hf 2
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
gen llama "$M/big" --scale 4 --layers 2
expect_status 0 "$ckpt" import "$M/big" --repo t/big
for spec in "neuron --tp 8" "fused" "hf"; do
    before=$(du_field physical_bytes)
    expect_status 0 "$ckpt" convert t/big --layout $spec
    after=$(du_field physical_bytes)
    python3 -c '
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
    $dump "$1" | python3 -c '
import hashlib, json, sys
d, name = sys.argv[1], sys.argv[2]
t = next(t for t in json.load(sys.stdin)["tensors"] if t["name"] == name)
with open(f"{d}/{t['"'file'"']}", "rb") as f:
    f.seek(t["offset"])
    print(hashlib.sha256(f.read(t["nbytes"])).hexdigest(), t["file"])' "$1" "$2"
}
blob_path() { echo "$CKPT_HOME/blobs/${1:0:2}/${1:2}"; }
flip() { python3 -c '
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
# 5. kill -9 during import, convert and gc
# =========================================================================
note "5. kill tests"
export CKPT_HOME=$work/h5
gen llama "$M/k" --scale 16 --layers 2 --shard-mb 4 --seed 5
gen qwen3-moe "$M/kq" --scale 32 --layers 1 --shard-mb 0.5 --seed 6
gen qwen3-moe "$M/kq4" --scale 32 --layers 3 --shard-mb 0.5 --seed 6
expect_status 0 "$ckpt" import "$M/qwen2-one" --repo t/base   # something that must survive everything
killed=0
# after_kill WHAT REF WANT_SUMS BEFORE_REFS: REF is absent or complete; verify clean; gc settles.
after_kill() {
    local what=$1 ref=$2 want=$3 before=$4 now
    now=$(refs)
    if [ "$now" != "$before" ]; then
        [ "$now" = "$(printf '%s\n%s\n' "$before" "$ref" | sed '/^$/d' | LC_ALL=C sort)" ] ||
            fail "$what: ls shows '$now', expected '$before' plus at most $ref"
        diff "$want" <(show_sums "$ref") >/dev/null || fail "$what: $ref is visible but its files are not the expected ones"
    fi
    expect_verify_clean "$what"
    expect_status 0 "$ckpt" gc
    gc_settled "$what"
}
# kill_series WHAT REF WANT_SUMS RESET -- CMD...: traces CMD's crash points,
# then for each runs CMD stopped there and checks the store (after_kill);
# RESET REF brings the store back to where the next run starts.
kill_series() {
    local what=$1 ref=$2 want=$3 reset=$4 before pt
    shift 5
    crash_points "$@" >"$work/points"
    "$reset" "$ref"
    while read -r pt; do
        before=$(refs)
        crash_at "$pt" "$@"
        killed=$((killed + 1))
        echo "   $what, stopped at $pt"
        after_kill "$what (stopped at $pt)" "$ref" "$want" "$before"
        "$reset" "$ref"
    done <"$work/points"
}
undo_rm() {
    if refs | grep -xF "$1" >/dev/null; then
        expect_status 0 "$ckpt" rm "$1"
        expect_status 0 "$ckpt" gc
    fi
}

# -- import: stopped at every crash point it passes
sums "$M/k" >"$work/want-k"
kill_series "import" t/k@main "$work/want-k" undo_rm -- "$ckpt" import "$M/k" --repo t/k --quiet
grep -qx 'catalog.committed:[0-9]*' "$work/points" || fail "import passed no catalog commit"
expect_status 0 "$ckpt" import "$M/k" --repo t/k
expect_status 0 "$ckpt" pull t/k -o "$work/pull"
same_tree "$M/k" "$work/pull" "fresh import after the kills"
rm -rf "$work/pull"

# -- store convert
expect_status 0 "$ckpt" convert "$M/k" "$work/off" --layout neuron --tp 8
sums "$work/off" >"$work/want-conv"
kill_series "convert" t/k@main:neuron-tp8 "$work/want-conv" undo_rm -- "$ckpt" convert t/k --layout neuron --tp 8 --quiet
grep -qx 'exec.file_done:8' "$work/points" || fail "store convert did not write its 8 files"
expect_status 0 "$ckpt" convert t/k --layout neuron --tp 8
expect_status 0 "$ckpt" pull t/k:neuron-tp8 -o "$work/pull"
diff -r "$work/off" "$work/pull" >/dev/null || fail "fresh convert after the kills differs from the offline convert"
rm -rf "$work/pull" "$work/off"
undo_rm t/k@main:neuron-tp8 # keep the store small: verify runs after every kill
undo_rm t/k@main

# -- import of many small tensors: stopped while its blobs are published
sums "$M/kq" >"$work/want-kq"
for pt in blob.written:150 blob.published:150; do
    before=$(refs)
    crash_at "$pt" "$ckpt" import "$M/kq" --repo t/kq --quiet
    killed=$((killed + 1))
    after_kill "import (many tensors) stopped at $pt" t/kq@main "$work/want-kq" "$before"
    undo_rm t/kq@main
done
expect_status 0 "$ckpt" import "$M/kq" --repo t/kq
expect_status 0 "$ckpt" pull t/kq -o "$work/pull"
same_tree "$M/kq" "$work/pull" "fresh import after the kills"
rm -rf "$work/pull"

# -- gc: a removed checkpoint whose blobs are partly shared with t/kq, which
# must survive. Each killed gc leaves part of the work to the next one; after
# each kill the store must be consistent; the last gc finishes the job.
expect_status 0 "$ckpt" import "$M/kq4" --repo t/kq4
expect_status 0 "$ckpt" rm t/kq4
nb=$(du_field blobs)
before=$(refs)
for pt in gc.blob_removed:1 gc.blob_removed:150 gc.blob_removed:400 catalog.before_commit:1; do
    crash_at "$pt" "$ckpt" gc
    killed=$((killed + 1))
    echo "   gc, stopped at $pt ($(du_field blobs) of $nb blobs left)"
    [ "$(refs)" = "$before" ] || fail "gc stopped at $pt: ls changed: $(refs)"
    expect_verify_clean "gc stopped at $pt"
done
[ "$(du_field blobs)" -lt "$nb" ] || fail "the stopped gc runs removed nothing"
expect_status 0 "$ckpt" gc
gc_settled "gc after the gc kills"
expect_status 0 "$ckpt" pull t/kq -o "$work/pull"
same_tree "$M/kq" "$work/pull" "t/kq after the gc kills"
rm -rf "$work/pull"
echo "   $killed runs stopped at crash points"
rm -rf "$CKPT_HOME"

# =========================================================================
# 6. concurrent imports and gc
# =========================================================================
note "6. concurrent imports while gc loops"
export CKPT_HOME=$work/h6
names=()
for l in 1 2 3 4; do
    gen llama "$M/c$l" --scale 16 --layers "$l" --seed 9
    names+=("c$l")
done
for l in 1 2; do
    gen mixtral "$M/x$l" --scale 32 --layers "$l" --seed 9 --shard-mb 1
    names+=("x$l")
done
expect_status 0 "$ckpt" import "$M/qwen2-one" --repo t/base   # the catalog exists before the race
# race NAME...: imports NAMEs at once while gc loops; all must succeed.
race() {
    local pids=() n gcs=0 alive i=0
    for n in "$@"; do
        "$ckpt" import "$M/$n" --repo "t/$n" --quiet >"$work/race-$n.out" 2>&1 &
        pids+=($!)
    done
    while :; do
        alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 1 ] || break
        "$ckpt" gc >"$work/gc.out" 2>&1 || fail "gc during the imports failed: $(cat "$work/gc.out")"
        gcs=$((gcs + 1))
    done
    for n in "$@"; do
        wait "${pids[$i]}" || fail "concurrent import of $n failed: $(cat "$work/race-$n.out")"
        i=$((i + 1))
        rm -f "$work/race-$n.out"
    done
    rm -f "$work/gc.out"
    echo "   imported $* with $gcs gc runs alongside"
}
check_all() {
    local n
    for n in "${names[@]}"; do
        expect_status 0 "$ckpt" pull "t/$n" -o "$work/pull"
        same_tree "$M/$n" "$work/pull" "$1: t/$n"
        rm -rf "$work/pull"
    done
    expect_verify_clean "$1"
    expect_status 0 "$ckpt" gc
    gc_settled "$1"
}
race "${names[@]}"
check_all "round 1"
# Removed, their blobs stay on disk unreferenced until gc: imports that reuse
# them race the gc that deletes them.
for n in "${names[@]}"; do expect_status 0 "$ckpt" rm "t/$n"; done
race c4 c2 x2 c1 c3 x1
check_all "round 2"
rm -rf "$CKPT_HOME"

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

#!/usr/bin/env bash
# test_vllm.sh — `ckpt convert --layout vllm` writes what vLLM's
# ShardedStateLoader loads, and `ckpt consolidate` gives the source back byte
# for byte (issue 17, "vLLM sharded state out").
#
# 1. llama, qwen2, mixtral and qwen3-moe generated small (bf16), --tp 1 2 4 8
#    (and 32 for llama, where each of the 8 KV heads sits on 4 adjacent
#    ranks): the files are exactly model-rank-R-part-0.safetensors for every
#    rank, in DST itself; `ckpt inspect --json` of each shows vLLM's names and
#    the per-rank shapes computed from config.json (qkv_proj, o_proj,
#    gate_up_proj, down_proj, experts.w13_weight/w2_weight, the vocabulary
#    padded to 64 and split, lm_head for tied embeddings, norms and routers
#    whole); consolidate gives every source file back (cmp).
# 2. Sizes vLLM cannot split (Qwen2's 14 heads on 4 or 8 ranks) are refused:
#    exit 1, nothing written.
# 3. --max-shard-size splits a rank into parts as vLLM's save_model does
#    (model-rank-R-part-P, P from 0), and consolidation still works.
# 4. `ckpt plan --print-rules` fed back with --rules writes the same files.
# 5. In the store: convert --layout vllm then pull equals the offline convert;
#    pull --rank R gives rank R's files only (each vLLM worker fetches its own
#    bytes), as a folder and as a tar stream; --consolidated gives the source.
#
# Run through run.sh (needs CKPT_BIN, E2E_DIR, E2E_WORK). Uses python3.
set -euo pipefail
. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"

run() { CKPT_QUIET=1 expect_status 0 "$@"; }

same_tree() {
    diff -rq "$1" "$2" >"$work/diff" 2>&1 || fail "$3: $(head -n 10 "$work/diff")"
}

# check_ranks SRC CONV TP: each rank's file holds exactly the tensors and shapes vLLM expects.
check_ranks() {
    for ((r = 0; r < $3; r++)); do
        "$ckpt" inspect --json "$2/model-rank-$r-part-0.safetensors" >"$work/inspect-$r.json" ||
            fail "inspect of rank $r failed"
    done
    "$py" -S - "$1/config.json" "$work" "$3" "$1" <<'EOF' || fail "$2: shapes differ (above)"
import json, sys, glob, os
cfg = json.load(open(sys.argv[1]))
tp, src = int(sys.argv[3]), sys.argv[4]
H, KV, hidden = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
hd = cfg.get("head_dim") or hidden // H
V, I = cfg["vocab_size"], cfg["intermediate_size"]
E = cfg.get("num_local_experts") or cfg.get("num_experts") or 0
mixtral = cfg["model_type"] == "mixtral"
MI = I if mixtral else cfg.get("moe_intermediate_size", I)
kv_r = 1 if tp >= KV else KV // tp
Vp = (V + 63) // 64 * 64
src_names = set()
for f in glob.glob(os.path.join(src, "*.safetensors")):
    with open(f, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little"); src_names |= set(json.loads(fh.read(n))) - {"__metadata__"}
want = {}
vocab_name = "lm_head.weight"
want[vocab_name] = [Vp // tp, hidden]
if "lm_head.weight" in src_names:
    want["model.embed_tokens.weight"] = [Vp // tp, hidden]
want["model.norm.weight"] = [hidden]
for n in range(cfg["num_hidden_layers"]):
    p = f"model.layers.{n}."
    want[p + "self_attn.qkv_proj.weight"] = [(H // tp + 2 * kv_r) * hd, hidden]
    if p + "self_attn.q_proj.bias" in src_names:
        want[p + "self_attn.qkv_proj.bias"] = [(H // tp + 2 * kv_r) * hd]
    want[p + "self_attn.o_proj.weight"] = [hidden, H // tp * hd]
    for norm in ("input_layernorm", "post_attention_layernorm"):
        want[p + norm + ".weight"] = [hidden]
    for qk in ("q_norm", "k_norm"):
        if p + f"self_attn.{qk}.weight" in src_names:
            want[p + f"self_attn.{qk}.weight"] = [hd]
    if E:
        block = p + ("block_sparse_moe." if mixtral else "mlp.")
        want[block + "gate.weight"] = [E, hidden]
        want[block + "experts.w13_weight"] = [E, 2 * MI // tp, hidden]
        want[block + "experts.w2_weight"] = [E, hidden, MI // tp]
    else:
        want[p + "mlp.gate_up_proj.weight"] = [2 * I // tp, hidden]
        want[p + "mlp.down_proj.weight"] = [hidden, I // tp]
bad = False
for rank in range(tp):
    got = {t["name"]: t["shape"] for t in json.load(open(f"{sys.argv[2]}/inspect-{rank}.json"))["tensors"]}
    for k in sorted(set(want) | set(got)):
        if want.get(k) != got.get(k):
            print(f"rank {rank}: {k}: got {got.get(k)}, expected {want.get(k)}", file=sys.stderr); bad = True
sys.exit(1 if bad else 0)
EOF
    rm -f "$work"/inspect-*.json
}

declare -A size=(
    [llama]="--scale 64 --layers 2 --shard-mb 0.4"
    [qwen2]="--scale 32 --layers 2"
    [mixtral]="--scale 64 --layers 1"
    [qwen3-moe]="--scale 32 --layers 1"
)
declare -A tps=([llama]="1 2 4 8 32" [qwen2]="1 2" [mixtral]="1 2 4 8" [qwen3-moe]="1 2 4 8")

# ---- 1. every architecture x tp ----

n=0
for arch in llama qwen2 mixtral qwen3-moe; do
    src="$work/$arch"
    # shellcheck disable=SC2086
    run "$ckpt" gen-model "$arch" "$src" --dtype bf16 ${size[$arch]}
    for tp in ${tps[$arch]}; do
        what="$arch --layout vllm --tp $tp"
        rm -rf "$work/conv" "$work/back"
        run "$ckpt" convert "$src" "$work/conv" --layout vllm --tp "$tp"
        (cd "$work/conv" && ls) >"$work/files"
        : >"$work/want"
        for f in ckpt-layout.json config.json; do echo "$f" >>"$work/want"; done
        for ((r = 0; r < tp; r++)); do echo "model-rank-$r-part-0.safetensors" >>"$work/want"; done
        (cd "$src" && ls | grep -v '\.safetensors' | grep -v '^config.json$') >>"$work/want" || true
        sort -o "$work/want" "$work/want"
        sort -o "$work/files" "$work/files"
        cmp -s "$work/want" "$work/files" || fail "$what: files $(tr '\n' ' ' <"$work/files"), expected $(tr '\n' ' ' <"$work/want")"
        grep -q "\"layout\": \"vllm-tp$tp\"" "$work/conv/ckpt-layout.json" || fail "$what: layout name"
        check_ranks "$src" "$work/conv" "$tp"
        run "$ckpt" consolidate "$work/conv" "$work/back"
        for f in "$src"/*; do cmp -s "$f" "$work/back/$(basename "$f")" || fail "$what: $(basename "$f") differs after consolidate"; done
        same_tree "$src" "$work/back" "$what"
        n=$((n + 1))
    done
done
echo "vllm round trips: $n byte-identical"

# ---- 2. sizes vLLM cannot split ----

for tp in 4 8; do
    expect_status 1 "$ckpt" convert "$work/qwen2" "$work/bad" --layout vllm --tp "$tp"
    grep -q "num_attention_heads 14 does not divide by --tp $tp" "$work/err" || fail "qwen2 tp $tp: $(cat "$work/err")"
    [ ! -e "$work/bad" ] || fail "qwen2 tp $tp: DST written"
done

# ---- 3. parts ----

rm -rf "$work/conv" "$work/back"
run "$ckpt" convert "$work/mixtral" "$work/conv" --layout vllm --tp 2 --max-shard-size 200KB
for r in 0 1; do
    parts=$(cd "$work/conv" && ls model-rank-$r-part-*.safetensors | wc -l)
    [ "$parts" -gt 2 ] || fail "mixtral tp 2 at 200KB: rank $r has $parts parts"
    for ((p = 0; p < parts; p++)); do
        [ -f "$work/conv/model-rank-$r-part-$p.safetensors" ] || fail "rank $r: part $p missing (parts count from 0)"
        sz=$(stat -c %s "$work/conv/model-rank-$r-part-$p.safetensors")
        nt=$("$ckpt" inspect --json "$work/conv/model-rank-$r-part-$p.safetensors" |
            "$py" -S -c 'import json,sys; print(len(json.load(sys.stdin)["tensors"]))')
        # vLLM's rule: a part only passes the limit when it holds one tensor
        [ "$sz" -le 210000 ] || [ "$nt" -eq 1 ] || fail "rank $r part $p: $sz bytes in $nt tensors"
    done
done
[ ! -e "$work/conv/model.safetensors.index.json" ] || fail "an index file was written"
run "$ckpt" consolidate "$work/conv" "$work/back"
same_tree "$work/mixtral" "$work/back" "mixtral tp 2 in parts"

# ---- 4. --print-rules fed back ----

run "$ckpt" plan "$work/llama" --layout vllm --tp 4 --print-rules
cp "$work/out" "$work/rules.json"
grep -q '"rank_files": "model-rank-{rank}-part-{part}.safetensors"' "$work/rules.json" || fail "no rank_files in the rules"
rm -rf "$work/conv" "$work/conv2"
run "$ckpt" convert "$work/llama" "$work/conv" --layout vllm --tp 4 --no-hash
run "$ckpt" convert "$work/llama" "$work/conv2" --rules "$work/rules.json" --no-hash
same_tree "$work/conv" "$work/conv2" "--rules of --print-rules"
echo "vllm files: ok"

# ---- 5. in the store: convert, pull, pull --rank R, --consolidated ----

export CKPT_HOME=$work/home
rm -rf "$work/conv" "$work/pull"
run "$ckpt" import "$work/mixtral" --repo t/mixtral
run "$ckpt" convert t/mixtral --layout vllm --tp 4
ref=$(cat "$work/out")
case "$ref" in *vllm-tp4*) ;; *) fail "store convert printed '$ref'" ;; esac
run "$ckpt" convert "$work/mixtral" "$work/conv" --layout vllm --tp 4
run "$ckpt" pull "$ref" -o "$work/pull"
diff -r "$work/conv" "$work/pull" >"$work/diff" || fail "pull $ref differs from the offline convert: $(head -c 1500 "$work/diff")"
rm -rf "$work/pull"
for r in 0 2; do
    run "$ckpt" pull "$ref" --rank "$r" -o "$work/pull"
    (cd "$work/pull" && ls) >"$work/files"
    printf '%s\n' ckpt-layout.json config.json "model-rank-$r-part-0.safetensors" | sort >"$work/want"
    (cd "$work/mixtral" && ls | grep -v '\.safetensors' | grep -v '^config.json$') >>"$work/want" || true
    sort -o "$work/want" "$work/want"
    cmp -s "$work/files" "$work/want" || fail "pull --rank $r wrote $(tr '\n' ' ' <"$work/files")"
    for f in "$work/pull"/*; do
        cmp -s "$f" "$work/conv/$(basename "$f")" || fail "pull --rank $r: $(basename "$f") differs from the offline convert"
    done
    rm -rf "$work/pull"
done
# the same rank as a tar stream (what GET ...?rank= and -o - serve)
"$ckpt" pull "$ref" --rank 3 -o - --format tar >"$work/r3.tar" 2>"$work/err" || fail "pull --rank 3 -o -: $(cat "$work/err")"
mkdir "$work/r3" && tar -xf "$work/r3.tar" -C "$work/r3"
(cd "$work/r3" && ls) >"$work/files"
printf '%s\n' ckpt-layout.json config.json model-rank-3-part-0.safetensors | sort >"$work/want"
(cd "$work/mixtral" && ls | grep -v '\.safetensors' | grep -v '^config.json$') >>"$work/want" || true
sort -o "$work/want" "$work/want"
cmp -s "$work/files" "$work/want" || fail "pull --rank 3 as tar holds $(tr '\n' ' ' <"$work/files")"
for f in "$work/r3"/*; do cmp -s "$f" "$work/conv/$(basename "$f")" || fail "tar rank 3: $(basename "$f") differs"; done
rm -rf "$work/r3" "$work/r3.tar"
expect_status 1 "$ckpt" pull "$ref" --rank 4 -o "$work/pull"
grep -q "out of range" "$work/err" || fail "pull --rank 4 of tp 4: $(cat "$work/err")"
run "$ckpt" pull "$ref" --consolidated -o "$work/pull"
same_tree "$work/mixtral" "$work/pull" "pull $ref --consolidated"
rm -rf "$work/pull" "$work/conv"
echo "vllm in the store: ok"

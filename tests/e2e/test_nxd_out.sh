#!/usr/bin/env bash
# test_nxd_out.sh — `ckpt convert SRC DST --layout neuron --tp N --format nxd`:
# a Hugging Face llama written as optimum-neuron's training save
# (docs/layouts.md, "NxD checkpoints out").
#
# 1. The Llama of tests/nxd_gen.py (8 query heads, 2 KV heads) and `ckpt
#    gen-model llama` (32 heads, 8 KV heads) at tp 1, 2, 4, 8 and 16 (more
#    ranks than KV heads: GQAQKVColumnParallelLinear with kv_size_multiplier
#    2 and 4), with and without --fuse-qkv, with --kv-size-multiplier 4, plain
#    torch.save and --xser: DST holds exactly the files of the real save;
#    every rank, its zip entries' CRC-32 checked (python's zipfile), read
#    by torch.load (Debian's python3-torch; xser: the
#    TensorReference records, each tensor_<tid>.pt, checked against .info.pt
#    as _xser_load_data reads them), holds the names in the model's order,
#    dtypes, shapes and values that nxd_gen.py's build (following
#    optimum-neuron's transformations_utils.py) gives the same model, tp and
#    options; mp_metadata_pp_rank_0.json and trn_config.json are byte for byte
#    what nxd_gen.py writes (json.dumps(indent=4)); `ckpt consolidate` of DST
#    gives back model.safetensors and config.json byte for byte. nxd_gen.py's
#    own saves (plain and xser) are checked equal tensor for tensor too.
#    optimum-neuron's qwen3 (q_norm/k_norm after o_proj, head_dim 16 with
#    hidden 64 / 8 heads) and granite (embeddings and lm_head replicated) at
#    tp 2 and 4, plain and xser, against the same build with those changes;
#    tied embeddings (no lm_head.weight in the source): lm_head.weight in
#    every rank's state dict with the embedding's rows, not in the metadata.
# 1b. --pp 2: each stage's rank files and metadata as nxd_gen.py's save (create_partitions).
# 2. A model with as many KV heads as query heads and --fuse-qkv: the
#    stride-3 qkv_proj ColumnParallelLinear with a FusedLinearsSpec, each rank
#    create_local_fused_weight of q, k, v; consolidated byte for byte.
# 3. Refused, exit 1, one line, DST absent: qwen2 (not an optimum-neuron
#    training model), a vocabulary that does not divide by tp, a
#    kv_size_multiplier that does not fit, a source tensor the model has no
#    place for, a parameter without its source tensor, tied embeddings with
#    an lm_head.weight of their own; a non-empty DST left as it was;
#    usage errors exit 2.
# 4. SIGTERM during the writing leaves nothing; after kill -9 the next run
#    removes the dead run's temp folder and writes the same bytes (the output
#    is deterministic: o4 and the new run are equal byte for byte).
# Run through run.sh (needs CKPT_BIN, E2E_DIR, E2E_WORK; /usr/bin/python3 with
# Debian's python3-torch, `make deps`).
set -euo pipefail
. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
tests=$(cd "$E2E_DIR/.." && pwd)
gen="$tests/nxd_gen.py"
tpy=$(torch_python) || fail "no python3 with torch (make deps installs python3-torch)"
cd "$work"

# cases: NAME REF TP FUSE(0/1) KV(0: auto) XSER(0/1)
cases=("o1 ref 1 0 0 0" "o2 ref 2 0 0 0" "o2f ref 2 1 0 0" "o4 ref 4 0 0 0" "o4f ref 4 1 0 0" "o4m ref 4 0 4 0"
    "o8f ref 8 1 0 0" "o4x ref 4 1 0 1" "g4 gl 4 1 0 0" "g16 gl 16 0 0 0" "q4 qwen3 4 0 0 0" "q2x qwen3 2 1 0 1"
    "gr4 granite 4 1 0 0" "t4 tied 4 0 0 0" "t2x tied 2 0 0 1"
    "g8x gl 8 0 0 1" "mha2 mha 2 1 0 0")
note "models"
# One python writes the models and, once they are converted, checks the
# rank files: one import of torch (~1 CPU-s here, ~3 on a slower machine)
# instead of two. It waits between the two on a fifo (py.go) and says on
# another (py.ready) that the models are written; if it fails first, the
# read below sees the end of py.ready.
mkfifo py.go py.ready
"$tpy" - "$gen" "${cases[@]}" 3<py.go 4>py.ready <<'PYEOF' &
import importlib.util, sys
spec = importlib.util.spec_from_file_location("nxd_gen", sys.argv[1]); g = importlib.util.module_from_spec(spec); spec.loader.exec_module(g)
BASE = dict(g.CONFIG)
g.make_ref("ref")
g.save("ref", "s4", 4, 1, False, False, None)
g.save("ref", "s8f", 8, 1, False, True, None)
g.save("ref", "s4x", 4, 1, True, True, None)
g.save("ref", "s2p", 2, 2, True, True, None)  # pipeline stages (section 1b)
# optimum-neuron's other two training models: qwen3 (q_norm/k_norm, an explicit head_dim), granite
g.CONFIG = dict(BASE, model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=16, use_sliding_window=False)
g.make_ref("qwen3")
t = g.read_safetensors("qwen3/model.safetensors")
gen = g.torch.Generator().manual_seed(3)
for i in range(BASE["num_hidden_layers"]):
    for n in ("q_norm", "k_norm"):
        t[f"model.layers.{i}.self_attn.{n}.weight"] = g.torch.randn(16, generator=gen).to(g.torch.bfloat16)
g.write_safetensors("qwen3/model.safetensors", t)
g.CONFIG = dict(BASE, model_type="granite", architectures=["GraniteForCausalLM"], embedding_multiplier=12.0,
                residual_multiplier=0.22, attention_multiplier=0.015625, logits_scaling=8.0)
g.make_ref("granite")
g.CONFIG = dict(BASE, tie_word_embeddings=True)  # tied: no lm_head.weight in the source
g.make_ref("tied")
t = g.read_safetensors("tied/model.safetensors")
del t["lm_head.weight"]
g.write_safetensors("tied/model.safetensors", t)
g.CONFIG = dict(BASE, num_key_value_heads=BASE["num_attention_heads"])  # section 2
g.make_ref("mha")
# section 3: a tensor the model has no place for, a tensor missing
import os, shutil
t = g.read_safetensors("ref/model.safetensors")
for out, change in (("extra", lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": t["model.norm.weight"]})),
                    ("short", lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))):
    os.makedirs(out)
    shutil.copy("ref/config.json", out)
    u = dict(t)
    change(u)
    g.write_safetensors(f"{out}/model.safetensors", u)
# the models are written: say so, then wait for the converts
os.write(4, b"generated\n")
os.close(4)
if os.read(3, 64) != b"check\n":
    sys.exit("the script stopped before the rank files were written")
os.close(3)
import collections, json, torch, zipfile
g.CONFIG = dict(BASE)  # part 1 changed it
TensorReference = g.xser_modules()

def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))

def load_xser(path):
    """_xser_load_data: the references, each tensor from <file>.tensors/tensor_<tid>.pt, checked against .info.pt"""
    refs, info = torch.load(path), torch.load(path + ".info.pt")
    if type(refs) is not collections.OrderedDict or type(info) is not dict or sorted(info) != list(range(len(refs))):
        sys.exit(f"{path}: references {type(refs)}, info {type(info)} {sorted(info)}")
    out = collections.OrderedDict()
    for tid, (k, ref) in enumerate(refs.items()):
        if type(ref) is not TensorReference or ref.tid != tid:
            sys.exit(f"{path}: '{k}' is {ref!r}, not TensorReference({tid})")
        t = torch.load(f"{path}.tensors/tensor_{tid}.pt")
        if info[tid] != {"dtype": t.dtype, "shape": t.shape, "expert_model_parallel": False} or type(info[tid]["shape"]) is not torch.Size:
            sys.exit(f"{path}.info.pt: {tid}: {info[tid]}")
        out[k] = t
    return out

def check_rank(path, want, xser=False):
    got = load_xser(path) if xser else torch.load(path)
    if type(got) is not collections.OrderedDict:
        sys.exit(f"{path}: a {type(got)}, not an OrderedDict")
    if list(got) != list(want):
        sys.exit(f"{path}: names {list(got)}\n  want {list(want)}")
    for k in want:
        if not same(got[k], want[k]):
            sys.exit(f"{path}: '{k}' is {got[k].dtype} {tuple(got[k].shape)}, want {want[k].dtype} {tuple(want[k].shape)} (or values differ)")

for c in sys.argv[2:]:
    name, ref, tp, fuse, kv, xser = c.split(); tp = int(tp); kv = int(kv) or None; fuse = fuse == "1"; xser = xser == "1"
    trn = json.load(open(f"{name}/trn_config.json"))
    if (trn["tensor_parallel_size"], trn["fuse_qkv"], trn["kv_size_multiplier"], trn["use_xser"]) != (tp, fuse, kv, xser):
        sys.exit(f"{name}: trn_config.json {trn}")
    for d, _, fs in os.walk(name):  # every zip entry's CRC-32 against its bytes (torch.load may not check them)
        for f in (f for f in fs if f.endswith(".pt")):
            with zipfile.ZipFile(os.path.join(d, f)) as z:
                bad = z.testzip()
            if bad:
                sys.exit(f"{d}/{f}: the CRC-32 of entry {bad} does not match its bytes")
    if name == "mha2":
        continue  # section 2 below: nxd_gen.py's build has no stride-3 qkv_proj
    cfg = json.load(open(f"{ref}/config.json"))
    g.CONFIG = dict(BASE, **cfg)
    g.CONFIG.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    reft = g.read_safetensors(f"{ref}/model.safetensors")
    if cfg.get("tie_word_embeddings"):  # lm_head.weight is embed_tokens.weight (tie_weights)
        reft["lm_head.weight"] = reft["model.embed_tokens.weight"]
    ranks, params, specs, m = g.build(reft, tp, fuse, kv)
    if cfg.get("tie_word_embeddings"):  # named_parameters() yields the shared parameter once; state_dict() both
        del params["lm_head.weight"]
    if cfg["model_type"] == "qwen3":  # Qwen3Attention registers q_norm, k_norm after LlamaAttention's o_proj
        def with_norms(d, value):
            out = collections.OrderedDict()
            for k, v in d.items():
                out[k] = v
                if k.endswith(".self_attn.o_proj.weight"):
                    for x in ("q_norm", "k_norm"):
                        out[k.replace("o_proj", x)] = value(k.replace("o_proj", x))
            return out
        params = with_norms(params, lambda k: {"tensor_model_parallel": False})
        ranks = [with_norms(rk, lambda k: reft[k]) for rk in ranks]
    if cfg["model_type"] == "granite":  # GraniteModel's nn.Embedding, GraniteForCausalLM's nn.Linear lm_head
        for k in ("model.embed_tokens.weight", "lm_head.weight"):
            params[k] = {"tensor_model_parallel": False}
            for rk in ranks:
                rk[k] = reft[k]
    meta = {"parameters": params, "model_weight_transformation_specs": specs}
    if open(f"{name}/shards/mp_metadata_pp_rank_0.json").read() != json.dumps(meta, indent=4):
        sys.exit(f"{name}: mp_metadata_pp_rank_0.json differs from create_parameter_metadata's")
    for r in range(tp):
        check_rank(f"{name}/shards/model/dp_rank_00_tp_rank_{r:02d}_pp_rank_00.pt", ranks[r], xser)
    if xser:  # exactly the real save's files
        want = {"config.json", "trn_config.json", "shards/checkpoint", "shards/done", "shards/mp_metadata_pp_rank_0.json"}
        for r in range(tp):
            f = f"shards/model/dp_rank_00_tp_rank_{r:02d}_pp_rank_00.pt"
            want |= {f, f + ".info.pt"} | {f"{f}.tensors/tensor_{i}.pt" for i in range(len(ranks[r]))}
        got = {os.path.relpath(os.path.join(d, f), name) for d, _, fs in os.walk(name) for f in fs}
        if got != want:
            sys.exit(f"{name}: files {sorted(got ^ want)} differ")
# nxd_gen.py's own saves: the same tensors, the same metadata and trn_config.json bytes
for save, out, tp, xser in (("s4", "o4", 4, False), ("s8f", "o8f", 8, False), ("s4x", "o4x", 4, True)):
    for f in ("shards/mp_metadata_pp_rank_0.json", "trn_config.json"):
        if open(f"{save}/{f}").read() != open(f"{out}/{f}").read():
            sys.exit(f"{out}/{f} differs from nxd_gen.py's {save}/{f}")
    for r in range(tp):
        p = f"shards/model/dp_rank_00_tp_rank_{r:02d}_pp_rank_00.pt"
        check_rank(f"{out}/{p}", load_xser(f"{save}/{p}") if xser else torch.load(f"{save}/{p}"), xser)
# section 2: as many KV heads as query heads and --fuse-qkv: LlamaAttention's stride-3 qkv_proj
ref = g.read_safetensors("mha/model.safetensors")
meta = json.load(open("mha2/shards/mp_metadata_pp_rank_0.json"))
a = "model.layers.1.self_attn"
if meta["parameters"][a + ".qkv_proj.weight"] != g.tp_attrs(0, 3, 2):
    sys.exit(f"qkv_proj attributes {meta['parameters'][a + '.qkv_proj.weight']}")
want_spec = [["FusedLinearsSpec", {"fused_linear_name": "qkv_proj", "linear_names": ["q_proj", "k_proj", "v_proj"],
              "bias": False, "fuse_axis": 0, "original_dims": [64, 64, 64], "tp_size": 2, "peft_type": None}]]
got = [s for s in meta["model_weight_transformation_specs"] if s["module_fully_qualified_name"] == a][0]["specs"]
if got != want_spec:
    sys.exit(f"mha2: spec {got}")
for r in range(2):
    sd = torch.load(f"mha2/shards/model/dp_rank_00_tp_rank_{r:02d}_pp_rank_00.pt")
    names = [n for n in sd if n.startswith(a)]
    if names != [a + ".qkv_proj.weight", a + ".o_proj.weight"]:
        sys.exit(f"mha2 rank {r}: {names}")
    want = g.create_local_fused_weight(r, 2, [ref[f"{a}.{x}_proj.weight"] for x in "qkv"], 0, 0)
    if not same(sd[a + ".qkv_proj.weight"], want):
        sys.exit(f"mha2 rank {r}: qkv_proj.weight is not create_local_fused_weight of q, k, v")
# --pp 2: each stage's rank files against nxd_gen.py's save
for s in range(2):
    for r in range(2):
        p = f"shards/model/dp_rank_00_tp_rank_{r:02d}_pp_rank_{s:02d}.pt"
        a, b = torch.load(f"p2/{p}"), torch.load(f"s2p/{p}")
        if list(a) != list(b):
            sys.exit(f"--pp 2: {p}: names {list(a)}, nxd_gen.py has {list(b)}")
        for k in a:
            ta, tb = (torch.load(f"{d}/{p}.tensors/tensor_{x[k].tid}.pt") for d, x in (("p2", a), ("s2p", b)))
            if ta.dtype != tb.dtype or not torch.equal(ta, tb):
                sys.exit(f"--pp 2: {p}: '{k}' differs")
PYEOF
py_pid=$!
exec 7>py.go 8<py.ready
read -r ready <&8 && [ "$ready" = generated ] || fail "nxd_gen.py saves"
exec 8<&-
"$ckpt" gen-model llama gl --scale 16 --layers 2 2>/dev/null || fail "gen-model llama"
"$ckpt" gen-model llama gl32 --scale 32 --layers 1 2>/dev/null || fail "gen-model llama"
"$ckpt" gen-model qwen2 gq --scale 32 --layers 1 2>/dev/null || fail "gen-model qwen2"

note "convert --format nxd"
for c in "${cases[@]}"; do
    read -r name ref tp fuse kv xser <<<"$c"
    opts=(--layout neuron --tp "$tp" --format nxd --quiet)
    [ "$fuse" = 1 ] && opts+=(--fuse-qkv)
    [ "$kv" != 0 ] && opts+=(--kv-size-multiplier "$kv")
    [ "$xser" = 1 ] && opts+=(--xser)
    "$ckpt" convert "$ref" "$name" "${opts[@]}" 2>/dev/null || fail "convert $c"
    [ "$(cat "$name/shards/done")" = 1 ] && [ "$(cat "$name/shards/checkpoint")" = 1 ] || fail "$c: done/checkpoint markers"
    [ "$xser" = 1 ] && continue # the file list: the python check below, which knows the tensor count
    want=$(printf '%s\n' config.json trn_config.json shards/checkpoint shards/done shards/mp_metadata_pp_rank_0.json
        for ((r = 0; r < tp; r++)); do printf 'shards/model/dp_rank_00_tp_rank_%02d_pp_rank_00.pt\n' "$r"; done)
    got=$(cd "$name" && find . -type f | sed 's|^\./||' | LC_ALL=C sort)
    [ "$got" = "$(LC_ALL=C sort <<<"$want")" ] || fail "$c: files differ:"$'\n'"$got"
done

note "pipeline stages (--pp)"
# --pp 2: the rank files and mp_metadata_pp_rank_N.json of each stage as
# nxd_gen.py's save writes them (create_partitions: one layer per stage here)
"$ckpt" convert ref p2 --layout neuron --tp 2 --format nxd --pp 2 --xser --fuse-qkv --quiet 2>/dev/null || fail "convert --pp 2"
for f in trn_config.json shards/mp_metadata_pp_rank_0.json shards/mp_metadata_pp_rank_1.json; do
    cmp -s "s2p/$f" "p2/$f" || fail "--pp 2: $f differs from nxd_gen.py's"
done
# (checked with the rank files by the python of the models)
note "rank files against nxd_gen.py (torch.load)"
echo check >&7
exec 7>&-
wait "$py_pid" || fail "rank files differ from nxd_gen.py's"
rm -f py.go py.ready
"$ckpt" consolidate p2 p2.back --quiet 2>/dev/null || fail "consolidate of --pp 2"
cmp p2.back/model.safetensors ref/model.safetensors || fail "--pp 2: consolidate is not the source"

note "consolidate"
for c in "${cases[@]}"; do
    read -r name ref _ <<<"$c"
    "$ckpt" consolidate "$name" "$name.back" --quiet 2>/dev/null || fail "consolidate $name"
    cmp "$name.back/model.safetensors" "$ref/model.safetensors" || fail "$name: consolidate is not the source"
    cmp "$name.back/config.json" "$ref/config.json" || fail "$name: config.json"
done

note "refused"
# refused DST PATTERN ARGS...: exit 1, one error line matching PATTERN, DST absent
refused() {
    local dst=$1 pat=$2
    shift 2
    expect_status 1 "$ckpt" convert "$@" "$dst" --layout neuron --format nxd
    [ "$(grep -c . "$work/err")" = 1 ] && grep -q -- "$pat" "$work/err" || fail "convert $*: wanted one line with '$pat': $(cat "$work/err")"
    [ ! -e "$dst" ] || fail "convert $*: $dst appeared"
}
refused bad1 "model_type 'qwen2'" gq --tp 2
refused bad2 "vocab_size 4008 does not divide by --tp 16" gl32 --tp 16
refused bad3 "kv_size_multiplier 3" ref --tp 4 --kv-size-multiplier 3
refused bad4 "tensor 'model.layers.0.self_attn.q_proj.bias' has no place in optimum-neuron's llama" extra --tp 2
refused bad5 "parameter 'model.layers.1.mlp.down_proj.weight' .*has no source tensor" short --tp 2
mkdir tiedboth && cp ref/model.safetensors tiedboth/ && sed 's/"tie_word_embeddings": false/"tie_word_embeddings": true/' ref/config.json >tiedboth/config.json
refused bad7 "tie_word_embeddings is true, but the source holds an lm_head.weight" tiedboth --tp 2
refused bad8 "2 layers cannot fill --pp 3 stages" ref --tp 2 --pp 3
refused bad9 "tie_word_embeddings with --pp 2" tied --tp 2 --pp 2
cp -a o1 o1.before
expect_status 1 "$ckpt" convert ref o1 --layout neuron --tp 2 --format nxd
grep -q "exists and is not empty" "$work/err" && diff -r o1 o1.before >/dev/null || fail "convert into a non-empty DST"
expect_status 2 "$ckpt" convert ref bad6 --layout hf --format nxd
expect_status 2 "$ckpt" convert ref bad6 --layout neuron --format nxd --max-shard-size 1MB
expect_status 2 "$ckpt" convert ref bad6 --layout neuron --fuse-qkv
expect_status 2 "$ckpt" convert ref bad6 --layout neuron --tp 2 --pp 2
[ ! -e bad6 ] || fail "bad6 appeared"

note "interrupted and killed"
# SIGTERM after the first rank file: DST absent, no temp folder; kill -9 there: the next run removes its temp
CKPT_FAULT=exec.file_done:1:TERM expect_status 143 "$ckpt" convert ref cut --layout neuron --tp 4 --format nxd --xser
[ ! -e cut ] && [ -z "$(compgen -G 'cut.tmp-*' || true)" ] || fail "SIGTERM left cut or its temp folder"
CKPT_FAULT=exec.file_done:1 expect_status 137 "$ckpt" convert ref cut --layout neuron --tp 4 --format nxd
[ ! -e cut ] && [ -n "$(compgen -G 'cut.tmp-*' || true)" ] || fail "kill -9: cut appeared, or no temp folder"
expect_status 0 "$ckpt" convert ref cut --layout neuron --tp 4 --format nxd
[ -z "$(compgen -G 'cut.tmp-*' || true)" ] && cmp cut/shards/mp_metadata_pp_rank_0.json o4/shards/mp_metadata_pp_rank_0.json ||
    fail "the run after a killed one"
for r in 0 1 2 3; do
    cmp "cut/shards/model/dp_rank_00_tp_rank_0${r}_pp_rank_00.pt" "o4/shards/model/dp_rank_00_tp_rank_0${r}_pp_rank_00.pt" ||
        fail "rank $r differs from the first convert"
done
note "ok"

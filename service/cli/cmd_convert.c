/*
 * cmd_convert.c — the offline transform commands: `ckpt plan`, `ckpt convert`
 * and `ckpt consolidate`. They share the layout options, parsed once here.
 */
#include "service/cli/cli.h"
#include "service/cli/cli_opts.h"
#include "service/cli/job_client.h"

#include "common/error.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "common/fsutil.h"
#include "store/store.h"
#include "transform/convert.h"
#include "transform/nxd_export.h"
#include "store/store_convert.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char layout_options_help[] =
    "layout options:\n"
    "  --layout L              neuron | fused | easydel | hf | vllm (see docs/layouts.md):\n"
    "                            neuron   optimum-neuron TP ranks, whole heads, KV heads replicated\n"
    "                            fused    one-device vLLM-style names (qkv_proj, gate_up_proj); its\n"
    "                                     --tp cuts fused q/k/v in even row blocks, NOT by heads\n"
    "                                     (a rank's K block is not whole heads when KV heads < tp):\n"
    "                                     for tensor-parallel serving use vllm or neuron\n"
    "                            easydel  JAX/Flax names and [in, out] kernels\n"
    "                            hf       names unchanged (recast, reshard, plain row/column splits)\n"
    "                            vllm     vLLM's sharded state (load_format=\"sharded_state\"):\n"
    "                                     DST/model-rank-R-part-P.safetensors, vLLM's names and\n"
    "                                     per-rank shapes; sizes must divide as vLLM requires\n"
    "  --tp N                  tensor-parallel size: N rank folders tp_rank_00.. (vllm: N ranks of\n"
    "                          files in DST); sizes that do not divide are padded with zeros\n"
    "                          (default 1)\n"
    "  --kv-size-multiplier M  neuron: replicate KV heads M times (default tp / gcd(kv_heads, tp))\n"
    "  --dtype D               cast floating tensors to bf16, f16 or f32 (lossy when narrowing)\n"
    "  --max-shard-size SIZE   largest output file, e.g. 5GB (default), 500MB, 2GiB; vllm: a rank's\n"
    "                          next part starts when a tensor would pass SIZE (default 5GiB)\n"
    "  --rules FILE            use a rules document instead of a preset (ckpt plan --print-rules\n"
    "                          prints the one a preset makes)\n"
    "  --lora ADAPTER          merge this PEFT LoRA adapter first: a lora_merge rule put before the\n"
    "                          layout's rules (docs/lora.md); ckpt-layout.json records it\n"
    "  --lora-scale S          multiply the adapter's scale by S (default 1)\n"
    "  --threads N             copy threads (default 2)\n";

static const char nxd_options_help[] =
    "training save (convert to folders only; docs/layouts.md, \"NxD checkpoints out\"):\n"
    "  --format nxd            with --layout neuron: write DST as optimum-neuron's save_pretrained\n"
    "                          writes a training checkpoint through neuronx-distributed's\n"
    "                          save_checkpoint: DST/shards/model/dp_rank_00_tp_rank_TT_pp_rank_00.pt\n"
    "                          (torch.save), shards/mp_metadata_pp_rank_0.json, shards/done,\n"
    "                          config.json, trn_config.json; a training run with the same\n"
    "                          TrainingNeuronConfig (tensor_parallel_size N, kv_size_multiplier,\n"
    "                          fuse_qkv) resumes from it; --format safetensors is the default\n"
    "  --fuse-qkv              TrainingNeuronConfig.fuse_qkv: q/k/v as one qkv_proj parameter\n"
    "  --xser                  TrainingNeuronConfig.use_xser (optimum-neuron's default): each rank\n"
    "                          .pt holds TensorReference records, every tensor its own\n"
    "                          .pt.tensors/tensor_<tid>.pt, with .pt.info.pt\n"
    "  --pp P                  TrainingNeuronConfig.pipeline_parallel_size: the decoder layers\n"
    "                          split over P stages as neuronx-distributed's create_partitions\n"
    "                          splits them, rank files _pp_rank_PP and mp_metadata_pp_rank_PP.json\n"
    "                          per stage (default 1)\n";

enum { OPT_PRINT_RULES = CLI_OPT_OWN, OPT_PARTS, OPT_LORA, OPT_LORA_SCALE, OPT_FORMAT, OPT_XSER, OPT_FUSE_QKV,
       OPT_STRIP_PREFIX, OPT_STATE, OPT_PP };

/* Every option of plan, convert and consolidate; each takes the ones its allowed[] lists. */
static const int convert_shared[] = {CLI_OPT_LAYOUT, CLI_OPT_TP, CLI_OPT_KV_MULTIPLIER, CLI_OPT_DTYPE,
                                     CLI_OPT_MAX_SHARD_SIZE, CLI_OPT_RULES, CLI_OPT_THREADS, CLI_OPT_FORCE,
                                     CLI_OPT_JSON, CLI_OPT_NO_HASH, CLI_OPT_QUIET, CLI_OPT_HOME, CLI_OPT_SERVER,
                                     CLI_OPT_END};
static const struct option convert_own[] = {
    {"print-rules", no_argument, 0, OPT_PRINT_RULES},
    {"parts", no_argument, 0, OPT_PARTS},
    {"lora", required_argument, 0, OPT_LORA},
    {"lora-scale", required_argument, 0, OPT_LORA_SCALE},
    {"strip-prefix", required_argument, 0, OPT_STRIP_PREFIX},
    {"state", no_argument, 0, OPT_STATE},
    {"format", required_argument, 0, OPT_FORMAT},
    {"xser", no_argument, 0, OPT_XSER},
    {"fuse-qkv", no_argument, 0, OPT_FUSE_QKV},
    {"pp", required_argument, 0, OPT_PP},
    {0, 0, 0, 0},
};

typedef struct {
    convert_opts co;
    cli_common common; /* --home, --json; --force and --quiet are copied into co */
    bool print_rules, parts;
    const char *strip_prefix;
    bool state;
    const char *format; /* convert: "nxd" or NULL (safetensors) */
    nxd_export_opts nxd;
    int npos;
    char **pos;
} cli_args;

/* Parses argv; `allowed` lists the option ids this command takes. Returns
 * CLI_OK or CLI_USAGE (message printed). */
static int parse_args(const char *cmd, int argc, char **argv, const int *allowed, cli_args *a)
{
    memset(a, 0, sizeof *a);
    cli_parser p = {.cmd = cmd, .shared = convert_shared, .own = convert_own, .allowed = allowed, .max_args = 2,
                    .common = &a->common};
    int c;
    while ((c = cli_getopt(&p, argc, argv)) > 0) {
        uint64_t v;
        switch (c) {
        case CLI_OPT_LAYOUT: a->co.layout = optarg; break;
        case CLI_OPT_TP:
            if (cli_parse_number(cmd, "--tp", optarg, 1, PLAN_MAX_TP, &v)) return CLI_USAGE;
            a->co.tp = (int)v;
            break;
        case CLI_OPT_KV_MULTIPLIER:
            if (cli_parse_number(cmd, "--kv-size-multiplier", optarg, 1, PLAN_MAX_TP, &v)) return CLI_USAGE;
            a->co.kv_size_multiplier = (int64_t)v;
            break;
        case CLI_OPT_DTYPE: a->co.dtype = optarg; break;
        case CLI_OPT_MAX_SHARD_SIZE:
            if (cli_parse_size(cmd, "--max-shard-size", optarg, &a->co.max_shard_size)) return CLI_USAGE;
            break;
        case CLI_OPT_RULES: a->co.rules_file = optarg; break;
        case CLI_OPT_THREADS:
            if (cli_parse_number(cmd, "--threads", optarg, 1, EXEC_MAX_THREADS, &v)) return CLI_USAGE;
            a->co.threads = (int)v;
            break;
        case OPT_PRINT_RULES: a->print_rules = true; break;
        case CLI_OPT_NO_HASH: a->co.no_hash = true; break;
        case OPT_PARTS: a->parts = true; break;
        case OPT_LORA: a->co.lora = optarg; break;
        case OPT_STRIP_PREFIX: a->strip_prefix = optarg; break;
        case OPT_STATE: a->state = true; break;
        case OPT_FORMAT: a->format = optarg; break;
        case OPT_XSER: a->nxd.xser = true; break;
        case OPT_FUSE_QKV: a->nxd.fuse_qkv = true; break;
        case OPT_PP:
            if (cli_parse_number(cmd, "--pp", optarg, 1, 1024, &v)) return CLI_USAGE;
            a->nxd.pp = (int)v;
            break;
        case OPT_LORA_SCALE:
            if (cli_parse_factor(cmd, "--lora-scale", optarg, &a->co.lora_scale)) return CLI_USAGE;
            break;
        }
    }
    if (c < 0) return CLI_USAGE;
    if (a->co.rules_file && (a->co.layout || a->co.tp || a->co.dtype || a->co.kv_size_multiplier))
        return cli_rules_conflict(cmd, a->co.layout, a->co.tp, a->co.dtype, a->co.kv_size_multiplier);
    a->pos = p.args;
    a->npos = p.nargs;
    a->co.force = a->common.force;
    a->co.quiet = a->common.quiet;
    if (a->co.lora_scale != 0 && !a->co.lora) return cli_usage_error(cmd, "--lora-scale needs --lora ADAPTER");
    if (a->format && strcmp(a->format, "nxd") && strcmp(a->format, "safetensors"))
        return cli_usage_error(cmd, "--format is safetensors (the default) or nxd");
    if (a->format && !strcmp(a->format, "safetensors")) a->format = NULL;
    if ((a->nxd.xser || a->nxd.fuse_qkv || a->nxd.pp) && !a->format)
        return cli_usage_error(cmd, "--xser, --fuse-qkv and --pp go with --format nxd");
    if (a->format && (a->co.rules_file || a->co.lora || a->co.max_shard_size))
        return cli_usage_error(cmd, "--format nxd writes optimum-neuron's own layout: no --rules, --lora or --max-shard-size");
    if (a->format && (!a->co.layout || strcmp(a->co.layout, "neuron")))
        return cli_usage_error(cmd, "--format nxd goes with --layout neuron");
    return CLI_OK;
}

static void print_plan_text(const convert_plan *cp)
{
    char b1[32];
    printf("layout %s, tp %d, %zu output tensors in %zu files, %s%s\n", cp->layout_name, cp->tp, cp->set.n,
           cp->exec.nfiles, ckpt_format_size(exec_plan_bytes(&cp->exec), b1, sizeof b1),
           cp->result.lossy ? " (lossy: narrowing cast)" : "");
    for (size_t f = 0; f < cp->exec.nfiles; f++) {
        const exec_file *ef = &cp->exec.files[f];
        printf("%s\n", ef->rel);
        for (size_t i = 0; i < ef->layout.ntensors; i++) {
            const st_out_tensor *ot = &ef->layout.tensors[i];
            const plan_tensor *t = ef->tensors[ot->user];
            char shape[128], size[32];
            size_t zero = 0;
            for (size_t p = 0; p < t->nparts; p++) zero += t->parts[p].src == PLAN_ZERO;
            printf("  %-60s %-5s %-22s %10s  %zu part%s%s\n", t->name, ckpt_dtype_name(t->dtype),
                   plan_shape_str(t->ndim, t->shape, shape, sizeof shape), ckpt_format_size(ot->nbytes, size, sizeof size),
                   t->nparts, t->nparts == 1 ? "" : "s", zero ? " (padded)" : "");
        }
    }
}

int cmd_plan(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf("usage: ckpt plan SRC --layout L [--tp N] [options] [--json [--parts]] [--print-rules]\n\n"
               "Shows what `ckpt convert` would write, reading only the safetensors headers and\n"
               "config.json of SRC: every output file and tensor with dtype, shape and size.\n"
               "Errors (a missing tensor, heads that cannot be split, a bad rule) appear here,\n"
               "before a byte is written.\n\n%s"
               "output:\n"
               "  --json          the plan as JSON (add --parts for every tensor's source pieces)\n"
               "  --print-rules   print the rules document the preset produced; feed it back\n"
               "                  with --rules FILE to get the same output\n\n"
               "example:\n  ckpt plan ./Llama-3-8B --layout neuron --tp 8\n",
               layout_options_help);
        return CLI_OK;
    }
    static const int allowed[] = {CLI_OPT_LAYOUT, CLI_OPT_TP, CLI_OPT_KV_MULTIPLIER, CLI_OPT_DTYPE, CLI_OPT_MAX_SHARD_SIZE,
                                  CLI_OPT_RULES, CLI_OPT_JSON, OPT_PRINT_RULES, OPT_PARTS, CLI_OPT_QUIET, OPT_LORA,
                                  OPT_LORA_SCALE, CLI_OPT_END};
    cli_args a;
    int u = parse_args("plan", argc, argv, allowed, &a);
    if (u) return u;
    if (a.npos != 1) return cli_usage_error("plan", "expected one source checkpoint");
    if (!a.co.layout && !a.co.rules_file) return cli_usage_error("plan", "--layout or --rules is required");
    convert_plan cp;
    if (convert_plan_build(&cp, a.pos[0], &a.co) < 0) return cli_fail();
    int rc = CLI_OK;
    if (a.print_rules) {
        rc = cli_print_json(json_incref(cp.rules.doc));
    } else if (a.common.json) {
        json_t *j = convert_plan_json(&cp, a.parts);
        rc = j ? cli_print_json(j) : cli_fail();
    } else {
        print_plan_text(&cp);
    }
    convert_plan_free(&cp);
    return rc;
}

/* `ckpt convert REF --layout L --server URL`: a convert job on the daemon,
 * followed to its end; prints the ref it made. */
static int convert_on_server(cli_args *a)
{
    if (a->co.rules_file || a->co.lora)
        return cli_usage_error("convert", "--rules and --lora name local files: they cannot go to a server "
                                          "(`ckpt submit merge-lora` merges an adapter on the daemon)");
    json_t *args = json_pack("{s:s,s:s}", "ref", a->pos[0], "layout", a->co.layout), *res = NULL;
    if (args && a->co.tp > 1) json_object_set_new(args, "tp", json_integer(a->co.tp));
    if (args && a->co.dtype) json_object_set_new(args, "dtype", json_string(a->co.dtype));
    if (args && a->co.kv_size_multiplier) json_object_set_new(args, "kv_size_multiplier", json_integer(a->co.kv_size_multiplier));
    if (args && a->co.max_shard_size)
        json_object_set_new(args, "max_shard_size", json_integer((json_int_t)a->co.max_shard_size));
    job_client jc;
    int rc = args ? job_client_open(&jc, a->common.home, a->common.server) : CKPT_ENOMEM;
    if (!rc) {
        rc = job_client_run(&jc, "convert", args, &res);
        job_client_close(&jc);
    }
    json_decref(args);
    if (rc) return cli_fail();
    const char *ref = json_string_value(json_object_get(res, "ref"));
    printf("%s\n", ref ? ref : "");
    ckpt_info("%s %s", json_is_true(json_object_get(res, "existed")) ? "already stored:" : "converted on the server:",
              ref ? ref : "");
    json_decref(res);
    return CLI_OK;
}

/* `ckpt convert REF --layout L`: a new layout inside the store, as recipes. */
static int convert_in_store(cli_args *a)
{
    ckpt_store s;
    if (store_open(&s, a->common.home) < 0) return cli_fail();
    store_ckpt out;
    bool existed = false;
    int rc = store_convert(&s, a->pos[0], &a->co, &out, &existed);
    if (rc) {
        store_close(&s);
        return cli_fail();
    }
    char *ref = store_ckpt_ref(&out);
    printf("%s\n", ref ? ref : "");
    ckpt_info("%s %s", existed ? "already stored:" : "converted in the store:", ref ? ref : "");
    free(ref);
    store_ckpt_free(&out);
    store_close(&s);
    return CLI_OK;
}

int cmd_convert(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf("usage: ckpt convert SRC DST --layout L [--tp N] [options] [--force]\n"
               "       ckpt convert SRC DST --layout neuron --tp N --format nxd [--fuse-qkv] [options]\n"
               "       ckpt convert REF --layout L [--tp N] [options] [--home DIR | --server URL]\n\n"
               "Converts the Hugging Face checkpoint SRC (a folder with config.json and\n"
               "model.safetensors or shards + index) into a layout, streaming tensor bytes with\n"
               "bounded memory. DST holds config.json, ckpt-layout.json (how every tensor was\n"
               "made, enough for `ckpt consolidate`) and the weights: in DST for --tp 1, in\n"
               "DST/tp_rank_00 .. for --tp N. DST appears only when complete.\n\n%s"
               "  --force                 replace a non-empty DST\n"
               "  --no-hash               do not record the sha256 of the source files\n\n"
               "With a stored REF (ORG/NAME[@REV], see ckpt ls) instead of folders, the layout\n"
               "is made inside the store as REF:LAYOUT (e.g. :neuron-tp8): recipes over the\n"
               "original's tensors, almost no new bytes. Converting again prints the existing ref.\n"
               "With --server (or CKPT_SERVER), on a daemon's store: a convert job, waited for.\n\n"
               "examples:\n"
               "  ckpt convert ./Qwen2-0.5B ./qwen2-neuron-tp8 --layout neuron --tp 8\n"
               "  ckpt convert ./Mixtral ./mixtral-fused --layout fused --dtype bf16\n"
               "  ckpt convert ./Llama-3-8B ./llama-merged-tp8 --layout neuron --tp 8 --lora ./my-adapter\n"
               "  ckpt convert ./Llama-3-8B ./llama-trn-tp8 --layout neuron --tp 8 --format nxd\n"
               "  ckpt convert ./Llama-3-8B ./llama-trn-tp8-pp4 --layout neuron --tp 8 --format nxd --pp 4 --xser\n\n%s",
               layout_options_help, nxd_options_help);
        return CLI_OK;
    }
    static const int allowed[] = {CLI_OPT_LAYOUT, CLI_OPT_TP, CLI_OPT_KV_MULTIPLIER, CLI_OPT_DTYPE, CLI_OPT_MAX_SHARD_SIZE,
                                  CLI_OPT_RULES, CLI_OPT_THREADS, CLI_OPT_FORCE, CLI_OPT_NO_HASH, CLI_OPT_QUIET,
                                  CLI_OPT_HOME, OPT_LORA, OPT_LORA_SCALE, OPT_FORMAT, OPT_XSER, OPT_FUSE_QKV, OPT_PP,
                                  CLI_OPT_SERVER, CLI_OPT_END};
    cli_args a;
    int u = parse_args("convert", argc, argv, allowed, &a);
    if (u) return u;
    if (a.common.server && (a.npos != 1 || a.format))
        return cli_usage_error("convert", "--server converts a stored REF on the daemon; folders convert here");
    if (a.format) {
        if (a.npos != 2 || !ckpt_is_dir(a.pos[0]))
            return cli_usage_error("convert", "--format nxd converts a folder SRC into a folder DST");
        double t0 = ckpt_now();
        if (nxd_export(a.pos[0], a.pos[1], &a.co, &a.nxd) < 0) return cli_fail();
        ckpt_info("converted %s -> %s: optimum-neuron training save, tp %d, in %.2f s", a.pos[0], a.pos[1],
                  a.co.tp > 0 ? a.co.tp : 1, ckpt_now() - t0);
        return CLI_OK;
    }
    if (a.npos == 1 && (!ckpt_is_dir(a.pos[0]) || a.common.server)) {
        if (!a.co.layout && !a.co.rules_file) return cli_usage_error("convert", "--layout or --rules is required");
        return cli_server(a.common.server, a.common.home) ? convert_on_server(&a) : convert_in_store(&a);
    }
    if (a.npos != 2) return cli_usage_error("convert", "expected SRC DST (folders), or REF (a stored checkpoint)");
    if (!a.co.layout && !a.co.rules_file) return cli_usage_error("convert", "--layout or --rules is required");
    convert_plan cp;
    double t0 = ckpt_now();
    if (convert_plan_build(&cp, a.pos[0], &a.co) < 0) return cli_fail();
    uint64_t bytes = exec_plan_bytes(&cp.exec);
    if (convert_write(&cp, a.pos[1], &a.co) < 0) {
        convert_plan_free(&cp);
        return cli_fail();
    }
    char b[32];
    ckpt_info("converted %s -> %s: layout %s, %zu tensors in %zu files, %s in %.2f s%s", a.pos[0], a.pos[1],
              cp.layout_name, cp.set.n, cp.exec.nfiles, ckpt_format_size(bytes, b, sizeof b), ckpt_now() - t0,
              cp.result.lossy ? " (lossy cast: consolidation will not be byte-exact)" : "");
    convert_plan_free(&cp);
    return CLI_OK;
}

int cmd_consolidate(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf("usage: ckpt consolidate SRC DST [--threads N] [--max-shard-size SIZE] [--force]\n"
               "       ckpt consolidate DCP_DIR DST [--max-shard-size SIZE] [--strip-prefix P]\n\n"
               "Rebuilds the original Hugging Face checkpoint from the output of `ckpt convert`\n"
               "using only its shard files and ckpt-layout.json: fused tensors split, GQA head\n"
               "permutations undone, KV replicas and padding dropped, shards concatenated,\n"
               "experts unstacked. Replicated tensors are checked equal on every rank. Without\n"
               "a narrowing cast the files are byte-identical to the source.\n\n"
               "SRC may also be an EasyDeL save (TensorStore, or the older\n"
               "easydel-model.parameters; docs/easydel.md), an optimum-neuron /\n"
               "neuronx-distributed training save (the folder holding shards/, or shards/\n"
               "itself; docs/layouts.md): its tensor-parallel ranks, pipeline stages and\n"
               "expert-parallel ranks are merged and the model_weight_transformation_specs\n"
               "undone as optimum-neuron's to_original_weights does; given a PEFT adapter\n"
               "save's adapter_<name> folder, DST is the adapter folder PEFT loads\n"
               "(adapter_model.safetensors, adapter_config.json); or a PyTorch Distributed\n"
               "Checkpoint folder (.metadata + __<rank>_<n>.distcp, as\n"
               "torch.distributed.checkpoint.save, torchtitan and Accelerate's\n"
               "SHARDED_STATE_DICT write it): every chunk is\n"
               "checked and each tensor assembled from its chunks, names kept; optimizer and\n"
               "training state (optim.*, train_state.*, ...) and bytes entries are left out\n"
               "(docs/torch.md). Both are streamed with bounded memory.\n"
               "  --max-shard-size SIZE  largest output file of an NxD or DCP source (default 5GB)\n"
               "  --strip-prefix P       DCP: remove P from the start of names that have it\n"
               "  --state                DCP, EasyDeL or NxD: write a ckpt training state: the optimizer's\n"
               "                         tensors (optim.state.<param>.<slot>, tx/<...>/<slot>/<param>,\n"
               "                         an older EasyDeL save's param_{i} placed by its pickled tree\n"
               "                         definition, read as data, never run; an NxD save's shards/optim,\n"
               "                         torch or ZeRO-1 states named through NeuronTrainer's param_groups\n"
               "                         and consolidated like their parameters) become slots\n"
               "                         <param>/<slot> of the parameters they match, the step comes\n"
               "                         along; leaves that match none are listed\n\n"
               "examples:\n  ckpt consolidate ./qwen2-neuron-tp8 ./qwen2-restored\n"
               "  ckpt consolidate ./llama-trn1-checkpoint-100 ./llama-hf --max-shard-size 2GB\n"
               "  ckpt consolidate ./llama-trn1-checkpoint-100/adapter_default ./my-lora\n"
               "  ckpt consolidate ./llama-trn1-checkpoint-100 ./state --state   # model + shards/optim\n"
               "  ckpt consolidate ./ckpt/step-1000 ./hf --strip-prefix model. --max-shard-size 2GB\n"
               "  ckpt consolidate ./ckpt/step-1000 ./state --strip-prefix model. --state\n"
               "  ckpt consolidate ./easydel-save ./state --state   # easydel-optstate.* or tx/\n");
        return CLI_OK;
    }
    static const int allowed[] = {CLI_OPT_THREADS, CLI_OPT_FORCE,    CLI_OPT_QUIET,
                                  CLI_OPT_MAX_SHARD_SIZE, OPT_STRIP_PREFIX, OPT_STATE, CLI_OPT_END};
    cli_args a;
    int u = parse_args("consolidate", argc, argv, allowed, &a);
    if (u) return u;
    if (a.npos != 2) return cli_usage_error("consolidate", "expected SRC and DST");
    if (a.strip_prefix && !*a.strip_prefix) return cli_usage_error("consolidate", "--strip-prefix needs a prefix");
    consolidate_opts o = {.threads = a.co.threads, .force = a.co.force, .quiet = a.co.quiet,
                          .max_shard_size = a.co.max_shard_size, .strip_prefix = a.strip_prefix, .state = a.state};
    double t0 = ckpt_now();
    if (consolidate_run(a.pos[0], a.pos[1], &o) < 0) return cli_fail();
    ckpt_info("consolidated %s -> %s in %.2f s%s", a.pos[0], a.pos[1], ckpt_now() - t0,
              o.lossy ? " (the layout used a narrowing cast: values are rounded, not byte-identical)" : "");
    return CLI_OK;
}

/*
 * cmd_lora.c — the LoRA commands: `ckpt merge-lora`, `ckpt unmerge-lora`
 * (lora/lora_merge.c) and `ckpt convert-lora` (transform/lora_layout.c).
 */
#include "service/cli/cli.h"
#include "service/cli/cli_opts.h"

#include "common/error.h"
#include "common/log.h"
#include "common/util.h"
#include "lora/lora.h"
#include "transform/lora_plan.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OPT_SCALE = CLI_OPT_OWN, OPT_BASE };

/* Every option of the LoRA commands; each takes the ones its allowed[] lists. */
static const int lora_shared[] = {
    CLI_OPT_THREADS, CLI_OPT_FORCE, CLI_OPT_QUIET,         CLI_OPT_JSON,    CLI_OPT_LAYOUT,
    CLI_OPT_TP,      CLI_OPT_RULES, CLI_OPT_KV_MULTIPLIER, CLI_OPT_NO_HASH, CLI_OPT_END};
static const struct option lora_own[] = {
    {"scale", required_argument, 0, OPT_SCALE},
    {"base", required_argument, 0, OPT_BASE},
    {0, 0, 0, 0},
};

typedef struct {
    lora_merge_opts mo;
    convert_opts co;
    cli_common common; /* --json; --force and --quiet are copied into mo and co */
    const char *base;
    int npos;
    char **pos;
} lora_args;

static int parse_args(const char *cmd, int argc, char **argv, const int *allowed, lora_args *a)
{
    memset(a, 0, sizeof *a);
    cli_parser p = {.cmd = cmd,
                    .shared = lora_shared,
                    .own = lora_own,
                    .allowed = allowed,
                    .max_args = 3,
                    .common = &a->common};
    int c;
    while ((c = cli_getopt(&p, argc, argv)) > 0) {
        uint64_t v;
        switch (c) {
        case OPT_SCALE:
            if (cli_parse_factor(cmd, "--scale", optarg, &a->mo.scale)) return CLI_USAGE;
            break;
        case CLI_OPT_THREADS:
            if (cli_parse_number(cmd, "--threads", optarg, 1, LORA_MAX_THREADS, &v))
                return CLI_USAGE;
            a->mo.threads = a->co.threads = (int)v;
            break;
        case OPT_BASE:
            a->base = optarg;
            break;
        case CLI_OPT_LAYOUT:
            a->co.layout = optarg;
            break;
        case CLI_OPT_TP:
            if (cli_parse_number(cmd, "--tp", optarg, 1, PLAN_MAX_TP, &v)) return CLI_USAGE;
            a->co.tp = (int)v;
            break;
        case CLI_OPT_KV_MULTIPLIER:
            if (cli_parse_number(cmd, "--kv-size-multiplier", optarg, 1, PLAN_MAX_TP, &v))
                return CLI_USAGE;
            a->co.kv_size_multiplier = (int64_t)v;
            break;
        case CLI_OPT_RULES:
            a->co.rules_file = optarg;
            break;
        case CLI_OPT_NO_HASH:
            a->co.no_hash = true;
            break;
        }
    }
    if (c < 0) return CLI_USAGE;
    if (a->co.rules_file && (a->co.layout || a->co.tp || a->co.kv_size_multiplier))
        return cli_rules_conflict(cmd, a->co.layout, a->co.tp, NULL, a->co.kv_size_multiplier);
    a->pos = p.args;
    a->npos = p.nargs;
    a->mo.force = a->co.force = a->common.force;
    a->mo.quiet = a->co.quiet = a->common.quiet;
    return CLI_OK;
}

static int merge_command(const char *cmd, int argc, char **argv, bool unmerge)
{
    if (cli_wants_help(argc, argv)) {
        printf("usage: ckpt %s BASE ADAPTER DST [--scale S] [--threads N] [--force] [--json]\n\n",
               cmd);
        if (!unmerge)
            printf("Merges the PEFT LoRA adapter ADAPTER (adapter_config.json + "
                   "adapter_model.safetensors)\n"
                   "into the Hugging Face checkpoint BASE: for every adapted module\n"
                   "  W' = W + s * B @ A,  s = lora_alpha / r  (lora_alpha / sqrt(r) with "
                   "use_rslora) x S\n"
                   "computed in F32 with OpenBLAS and stored in W's dtype, rounded to "
                   "nearest-even.\n");
        else
            printf(
                "Takes the PEFT LoRA adapter ADAPTER out of the merged checkpoint BASE again:\n"
                "  W = W' - s * B @ A,  s = lora_alpha / r  (lora_alpha / sqrt(r) with use_rslora) "
                "x S\n"
                "computed in F32 with OpenBLAS and stored in W's dtype, rounded to nearest-even\n"
                "(so a merge and unmerge give W back within two roundings).\n");
        printf(
            "Other tensors are copied unchanged; DST gets BASE's files, index and side files\n"
            "and appears only when complete. Memory stays at a few blocks of rows per thread.\n\n"
            "options:\n"
            "  --scale S     multiply every module's s by S (default 1)\n"
            "  --threads N   worker threads (default 2)\n"
            "  --force       replace a non-empty DST\n"
            "  --json        print what was done (modules, GFLOP, seconds) as JSON\n\n"
            "example:\n  ckpt %s ./Llama-3-8B ./my-adapter ./Llama-3-8B-%s\n",
            cmd, unmerge ? "unmerged" : "merged");
        return CLI_OK;
    }
    static const int allowed[] = {OPT_SCALE,     CLI_OPT_THREADS, CLI_OPT_FORCE,
                                  CLI_OPT_QUIET, CLI_OPT_JSON,    CLI_OPT_END};
    lora_args a;
    int u = parse_args(cmd, argc, argv, allowed, &a);
    if (u) return u;
    if (a.npos != 3) return cli_usage_error(cmd, "expected BASE ADAPTER DST");
    a.mo.unmerge = unmerge;
    lora_merge_stats st;
    if (lora_merge_run(a.pos[0], a.pos[1], a.pos[2], &a.mo, &st) < 0) return cli_fail();
    double gemm_rate = st.gemm_seconds > 0 ? st.gflop / st.gemm_seconds : 0;
    if (a.common.json)
        printf("{\"modules\": %zu, \"copied\": %zu, \"bytes\": %llu, \"gflop\": %.6f, "
               "\"gemm_seconds\": %.6f, "
               "\"gemm_gflops_per_thread\": %.3f, \"seconds\": %.6f, \"work_seconds\": %.6f, "
               "\"sync_seconds\": %.6f}\n",
               st.modules, st.copied, (unsigned long long)st.bytes, st.gflop, st.gemm_seconds,
               gemm_rate, st.seconds, st.work_seconds, st.sync_seconds);
    char b[32];
    ckpt_info("%s %s + %s -> %s: %zu modules, %zu tensors copied, %s in %.2f s (%.2f GFLOP, %.1f "
              "GFLOP/s per thread in "
              "GEMM)",
              unmerge ? "unmerged" : "merged", a.pos[0], a.pos[1], a.pos[2], st.modules, st.copied,
              ckpt_format_size(st.bytes, b, sizeof b), st.seconds, st.gflop, gemm_rate);
    return CLI_OK;
}

int cmd_merge_lora(int argc, char **argv)
{
    return merge_command("merge-lora", argc, argv, false);
}

int cmd_unmerge_lora(int argc, char **argv)
{
    return merge_command("unmerge-lora", argc, argv, true);
}

int cmd_convert_lora(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf(
            "usage: ckpt convert-lora ADAPTER DST --base BASE --layout L [--tp N]\n"
            "                        [--kv-size-multiplier M] [--rules FILE] [--force]\n\n"
            "Converts a PEFT LoRA adapter into the layout `ckpt convert BASE --layout L` gives "
            "its\n"
            "base, so it can be served or trained on the converted base without merging. The\n"
            "adapter follows the base's plan part by part:\n"
            "  fused Q/K/V or gate/up: A = [A_q; A_k; A_v] (rank 3r), B block-diagonal in the\n"
            "    fused row order (neuron: the per-rank head order, KV replicas and padding "
            "included);\n"
            "  column-parallel weights: B split like the weight's rows, A replicated;\n"
            "  row-parallel weights (o_proj, down_proj): A split like the weight's columns, B "
            "replicated.\n"
            "On every rank B_r @ A_r is exactly the converted layout of B @ A. "
            "adapter_config.json\n"
            "names the converted modules, with rank_pattern and alpha_pattern keeping each\n"
            "module's scale; ckpt-layout.json records every part, and `ckpt consolidate DST OUT`\n"
            "restores the original adapter byte for byte. BASE is read for its config.json and\n"
            "safetensors headers only.\n\n"
            "options:\n"
            "  --base BASE             the Hugging Face checkpoint the adapter was trained on\n"
            "  --layout L, --tp N, --kv-size-multiplier M, --rules FILE   as for ckpt convert\n"
            "  --force                 replace a non-empty DST\n"
            "  --no-hash               do not record the sha256 of the adapter file\n\n"
            "example:\n  ckpt convert-lora ./my-adapter ./my-adapter-neuron-tp8 --base "
            "./Llama-3-8B "
            "--layout neuron --tp 8\n");
        return CLI_OK;
    }
    static const int allowed[] = {
        OPT_BASE,        CLI_OPT_LAYOUT, CLI_OPT_TP,    CLI_OPT_KV_MULTIPLIER, CLI_OPT_RULES,
        CLI_OPT_THREADS, CLI_OPT_FORCE,  CLI_OPT_QUIET, CLI_OPT_NO_HASH,       CLI_OPT_END};
    lora_args a;
    int u = parse_args("convert-lora", argc, argv, allowed, &a);
    if (u) return u;
    if (a.npos != 2) return cli_usage_error("convert-lora", "expected ADAPTER DST");
    if (!a.base)
        return cli_usage_error("convert-lora",
                               "--base BASE is required (its config.json and headers)");
    if (!a.co.layout && !a.co.rules_file)
        return cli_usage_error("convert-lora", "--layout or --rules is required");
    double t0 = ckpt_now();
    if (lora_convert_run(a.pos[0], a.base, a.pos[1], &a.co) < 0) return cli_fail();
    ckpt_info("converted adapter %s -> %s in %.2f s", a.pos[0], a.pos[1], ckpt_now() - t0);
    return CLI_OK;
}

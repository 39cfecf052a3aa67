/*
 * cmd_lora.c — the LoRA commands: `ckpt merge-lora`, `ckpt unmerge-lora`
 * (workers/lora_merge.c) and `ckpt convert-lora` (workers/lora_layout.c).
 */
#include "service/cli.h"

#include "common/error.h"
#include "common/log.h"
#include "common/util.h"
#include "workers/lora.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    OPT_SCALE = 256,
    OPT_THREADS,
    OPT_FORCE,
    OPT_QUIET,
    OPT_JSON,
    OPT_BASE,
    OPT_LAYOUT,
    OPT_TP,
    OPT_KV,
    OPT_RULES,
    OPT_NO_HASH
};

static const struct option long_opts[] = {
    {"scale", required_argument, 0, OPT_SCALE},
    {"threads", required_argument, 0, OPT_THREADS},
    {"force", no_argument, 0, OPT_FORCE},
    {"quiet", no_argument, 0, OPT_QUIET},
    {"json", no_argument, 0, OPT_JSON},
    {"base", required_argument, 0, OPT_BASE},
    {"layout", required_argument, 0, OPT_LAYOUT},
    {"tp", required_argument, 0, OPT_TP},
    {"kv-size-multiplier", required_argument, 0, OPT_KV},
    {"rules", required_argument, 0, OPT_RULES},
    {"no-hash", no_argument, 0, OPT_NO_HASH},
    {0, 0, 0, 0},
};

typedef struct {
    lora_merge_opts mo;
    convert_opts co;
    const char *base;
    bool json;
    int npos;
    char *pos[3];
} lora_args;

static int parse_args(const char *cmd, int argc, char **argv, const int *allowed, lora_args *a)
{
    memset(a, 0, sizeof *a);
    optind = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "", long_opts, NULL)) != -1) {
        bool ok = false;
        for (const int *p = allowed; *p; p++)
            ok |= *p == c;
        if (c == '?' || !ok) return cli_usage_error(cmd, "unknown option '%s'", argv[optind - 1]);
        uint64_t v;
        char *end;
        switch (c) {
        case OPT_SCALE:
            a->mo.scale = strtod(optarg, &end);
            if (end == optarg || *end || !isfinite(a->mo.scale) || a->mo.scale == 0)
                return cli_usage_error(cmd, "--scale takes a finite, non-zero number");
            break;
        case OPT_THREADS:
            if (ckpt_parse_u64(optarg, &v) < 0 || v < 1 || v > LORA_MAX_THREADS)
                return cli_usage_error(cmd, "--threads must be a number from 1 to %d",
                                       LORA_MAX_THREADS);
            a->mo.threads = a->co.threads = (int)v;
            break;
        case OPT_FORCE:
            a->mo.force = a->co.force = true;
            break;
        case OPT_QUIET:
            a->mo.quiet = a->co.quiet = true;
            break;
        case OPT_JSON:
            a->json = true;
            break;
        case OPT_BASE:
            a->base = optarg;
            break;
        case OPT_LAYOUT:
            a->co.layout = optarg;
            break;
        case OPT_TP:
            if (ckpt_parse_u64(optarg, &v) < 0 || v < 1 || v > PLAN_MAX_TP)
                return cli_usage_error(cmd, "--tp must be a number from 1 to %d", PLAN_MAX_TP);
            a->co.tp = (int)v;
            break;
        case OPT_KV:
            if (ckpt_parse_u64(optarg, &v) < 0 || v < 1 || v > PLAN_MAX_TP)
                return cli_usage_error(cmd, "--kv-size-multiplier must be a number from 1 to %d",
                                       PLAN_MAX_TP);
            a->co.kv_size_multiplier = (int64_t)v;
            break;
        case OPT_RULES:
            a->co.rules_file = optarg;
            break;
        case OPT_NO_HASH:
            a->co.no_hash = true;
            break;
        }
    }
    for (int i = optind; i < argc; i++) {
        if (a->npos == 3) return cli_usage_error(cmd, "too many arguments");
        a->pos[a->npos++] = argv[i];
    }
    if (ckpt_log_get_level() == CKPT_LOG_QUIET) a->mo.quiet = a->co.quiet = true;
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
    static const int allowed[] = {OPT_SCALE, OPT_THREADS, OPT_FORCE, OPT_QUIET, OPT_JSON, 0};
    lora_args a;
    int u = parse_args(cmd, argc, argv, allowed, &a);
    if (u) return u;
    if (a.npos != 3) return cli_usage_error(cmd, "expected BASE ADAPTER DST");
    a.mo.unmerge = unmerge;
    lora_merge_stats st;
    if (lora_merge_run(a.pos[0], a.pos[1], a.pos[2], &a.mo, &st) < 0) return cli_fail();
    double gemm_rate = st.gemm_seconds > 0 ? st.gflop / st.gemm_seconds : 0;
    if (a.json)
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
    static const int allowed[] = {OPT_BASE,    OPT_LAYOUT, OPT_TP,    OPT_KV,      OPT_RULES,
                                  OPT_THREADS, OPT_FORCE,  OPT_QUIET, OPT_NO_HASH, 0};
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

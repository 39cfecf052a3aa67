/*
 * cmd_gen_model.c — `ckpt gen-model`: the command-line face of workers/genmodel,
 * which writes synthetic Hugging Face checkpoints for tests, benchmarks and the demo.
 */
#include "service/cli/cli.h"
#include "service/cli/cli_opts.h"

#include "common/error.h"
#include "common/util.h"
#include "fixtures/genmodel.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SHARD_MB 1e9 /* a petabyte: anything larger is a typo */

static void help(void)
{
    printf("usage: ckpt gen-model ARCH OUT_DIR [--scale S] [--layers N] [--dtype bf16|f16|f32]\n"
           "                      [--shard-mb M] [--seed K]\n"
           "\n"
           "Writes a synthetic Hugging Face checkpoint into OUT_DIR: config.json and the\n"
           "weights as model.safetensors, or as model-0000i-of-0000n.safetensors shards with\n"
           "model.safetensors.index.json when they exceed --shard-mb. Tensor names, shapes\n"
           "and head structure are those of the real model; the values are random (std 0.02,\n"
           "norm weights near 1.0), different in every tensor, and the same for the same\n"
           "seed. No network is needed. OUT_DIR must not exist or be empty; it appears only\n"
           "when complete.\n"
           "\n"
           "ARCH:\n"
           "  llama       Llama-3-8B: hidden 4096, 32 heads, 8 KV heads, 32 layers\n"
           "  qwen2       Qwen2-0.5B: hidden 896, 14 heads, 2 KV heads, q/k/v biases, tied\n"
           "              embeddings (no lm_head.weight), 24 layers\n"
           "  mixtral     Mixtral-8x7B: 8 experts (block_sparse_moe.experts.E.w1/w2/w3)\n"
           "  qwen3-moe   Qwen3-30B-A3B: 128 experts (mlp.experts.E.gate_proj/up_proj/\n"
           "              down_proj), q_norm/k_norm, 48 layers\n"
           "\n"
           "options:\n"
           "  --scale S     divide the widths (head_dim, intermediate sizes, vocab, hence\n"
           "                hidden) by S, rounding down, at least 1; head and expert counts\n"
           "                stay real, so GQA ratios and TP padding cases do too (default 1:\n"
           "                the real size, e.g. 16 GB for llama in bf16; tests use 8 to 32)\n"
           "  --layers N    number of decoder layers (default: the model's own)\n"
           "  --dtype D     bf16 (default), f16 or f32\n"
           "  --shard-mb M  largest shard, in MB of tensor bytes (1 MB = 1,000,000 bytes;\n"
           "                fractions allowed; default 5000 as Hugging Face's 5GB; 0 = one file)\n"
           "  --seed K      seed for the values (default 0)\n"
           "\n"
           "A summary line (tensors, files, bytes) goes to stderr.\n"
           "\n"
           "example:\n"
           "  ckpt gen-model qwen2 /tmp/qwen2-tiny --scale 8 --layers 2\n"
           "  ckpt inspect /tmp/qwen2-tiny\n");
}

/* --shard-mb: a decimal number of megabytes, into bytes. */
static int parse_shard_mb(const char *s, uint64_t *bytes)
{
    char *end;
    errno = 0;
    double mb = strtod(s, &end);
    if (!isdigit((unsigned char)s[0]) || *end || errno || !isfinite(mb) || mb > MAX_SHARD_MB)
        return -1;
    *bytes = (uint64_t)(mb * 1e6);
    return 0;
}

static int parse_dtype(const char *s, ckpt_dtype *dt)
{
    static const struct {
        const char *name;
        ckpt_dtype dt;
    } dtypes[] = {{"bf16", CKPT_DT_BF16}, {"f16", CKPT_DT_F16}, {"f32", CKPT_DT_F32}};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(dtypes); i++) {
        if (!strcmp(s, dtypes[i].name)) {
            *dt = dtypes[i].dt;
            return 0;
        }
    }
    return -1;
}

int cmd_gen_model(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        help();
        return CLI_OK;
    }
    enum { OPT_SCALE = CLI_OPT_OWN, OPT_LAYERS, OPT_SHARD_MB };
    static const int shared[] = {CLI_OPT_DTYPE, CLI_OPT_SEED, CLI_OPT_END};
    static const struct option own[] = {
        {"scale", required_argument, NULL, OPT_SCALE},
        {"layers", required_argument, NULL, OPT_LAYERS},
        {"shard-mb", required_argument, NULL, OPT_SHARD_MB},
        {NULL, 0, NULL, 0},
    };
    const char *cmd = argv[0];
    genmodel_opts o;
    genmodel_opts_init(&o, NULL);
    cli_parser p = {.cmd = cmd, .shared = shared, .own = own, .say_needs_value = true};
    int opt;
    while ((opt = cli_getopt(&p, argc, argv)) > 0) {
        switch (opt) {
        case OPT_SCALE:
            if (ckpt_parse_u64(optarg, &o.scale) < 0 || o.scale < 1 || o.scale > GENMODEL_MAX_SCALE)
                return cli_usage_error(cmd, "--scale wants an integer from 1 to %u, not '%s'",
                                       GENMODEL_MAX_SCALE, optarg);
            break;
        case OPT_LAYERS:
            if (ckpt_parse_u64(optarg, &o.layers) < 0 || o.layers < 1 ||
                o.layers > GENMODEL_MAX_LAYERS)
                return cli_usage_error(cmd, "--layers wants an integer from 1 to %d, not '%s'",
                                       GENMODEL_MAX_LAYERS, optarg);
            break;
        case CLI_OPT_DTYPE:
            if (parse_dtype(optarg, &o.dtype) < 0)
                return cli_usage_error(cmd, "--dtype wants bf16, f16 or f32, not '%s'", optarg);
            break;
        case OPT_SHARD_MB:
            if (parse_shard_mb(optarg, &o.max_shard_size) < 0)
                return cli_usage_error(cmd,
                                       "--shard-mb wants a number of MB (e.g. 500 or 0.5), "
                                       "not '%s'",
                                       optarg);
            break;
        case CLI_OPT_SEED:
            if (ckpt_parse_u64(optarg, &o.seed) < 0)
                return cli_usage_error(cmd, "--seed wants a non-negative integer, not '%s'",
                                       optarg);
            break;
        }
    }
    if (opt < 0) return CLI_USAGE;
    if (p.nargs != 2)
        return cli_usage_error(cmd, "expected ARCH and OUT_DIR, got %d argument%s", p.nargs,
                               p.nargs == 1 ? "" : "s");
    o.arch = p.args[0];
    genmodel_config cfg;
    if (genmodel_config_get(&cfg, &o) < 0) return cli_usage_error(cmd, "%s", ckpt_error_last());
    if (genmodel_write(&o, p.args[1]) < 0) return cli_fail();
    return CLI_OK;
}

/* main.c — `ckpt <command> [args]`: the command table and dispatch. */
#include "service/cli/cli.h"

#include "common/error.h"
#include "common/interrupt.h"
#include "common/json.h"
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const cli_command commands[] = {
    {"inspect", cmd_inspect, "list the tensors of a safetensors file or checkpoint directory"},
    {"gen-model", cmd_gen_model, "write a synthetic Hugging Face checkpoint (llama, qwen2, mixtral, qwen3-moe)"},
    {"plan", cmd_plan, "show what a conversion would write, from headers and config.json only"},
    {"convert", cmd_convert, "convert a checkpoint into a layout (neuron, fused, easydel, hf; --tp N)"},
    {"consolidate", cmd_consolidate, "rebuild the original checkpoint from a converted one"},
    {"merge-lora", cmd_merge_lora, "merge a PEFT LoRA adapter into a checkpoint (W + s * B @ A, OpenBLAS)"},
    {"unmerge-lora", cmd_unmerge_lora, "take a merged LoRA adapter out of a checkpoint again"},
    {"convert-lora", cmd_convert_lora, "convert a LoRA adapter into a base's layout (fused, neuron --tp N)"},
    {"fetch", cmd_fetch, "download a checkpoint from a Hugging Face Hub (HF_ENDPOINT) into the store"},
    {"sync", cmd_sync, "follow a Hub repo on a schedule: fetch and convert each new commit"},
    {"import", cmd_import, "store a local checkpoint folder or tar archive"},
    {"ls", cmd_ls, "list stored checkpoints"},
    {"show", cmd_show, "show a stored checkpoint's files"},
    {"rm", cmd_rm, "remove a stored checkpoint (gc frees its bytes)"},
    {"gc", cmd_gc, "delete unreferenced blobs and leftovers of interrupted writes"},
    {"du", cmd_du, "logical vs physical bytes of the store, dedup ratio"},
    {"verify", cmd_verify, "re-hash blobs and rebuild files; name what is damaged"},
    {"state", cmd_state, "training states: save, load (one TP rank), import/ls/export/keep in the store"},
    {"serve", cmd_serve, "run the daemon: job scheduler, worker processes, HTTP API"},
    {"submit", cmd_submit, "queue a job (import, convert, fetch, ...; ORG/NAME --layout L: fetch then convert); prints its id"},
    {"jobs", cmd_jobs, "list jobs"},
    {"logs", cmd_logs, "print a job's log (-f to follow)"},
    {"wait", cmd_wait, "follow a job to its end; exit status follows the job"},
    {"cancel", cmd_cancel, "cancel a job"},
    {"retry", cmd_retry, "queue a failed or cancelled job again"},
    {"worker", cmd_worker, "internal: run one job (started by serve)"},
    {"pull", cmd_pull, "write a stored checkpoint (or one rank, or its consolidated form) to a folder or tar"},
};

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ckpt %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nsee 'ckpt %s --help'\n", cmd);
    va_end(ap);
    return CLI_USAGE;
}

int cli_fail(void)
{
    /* One line whatever the message holds: names from hostile files may carry control characters. */
    fputs("ckpt: ", stderr);
    for (const unsigned char *p = (const unsigned char *)ckpt_error_last(); *p; p++) {
        if (*p < 0x20 || *p == 0x7f) fprintf(stderr, "\\x%02x", *p);
        else fputc(*p, stderr);
    }
    fputc('\n', stderr);
    return CLI_FAIL;
}

int cli_print_json(json_t *j)
{
    char *s = j ? cj_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (!s) return cli_fail();
    puts(s);
    free(s);
    return CLI_OK;
}

bool cli_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) break;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
    }
    return false;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: ckpt <command> [options]\n\n"
                 "ckpt converts Hugging Face checkpoints between layouts (experts stacked,\n"
                 "Q/K/V and gate/up fused, tensor-parallel shards with padding) and back.\n\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-14s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'ckpt <command> --help' explains a command.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
        usage(stdout);
        return CLI_OK;
    }
    if (!strcmp(name, "--version")) {
        printf("ckpt 0.1.0\n");
        return CLI_OK;
    }
    const char *quiet = getenv("CKPT_QUIET");
    if (quiet && *quiet && strcmp(quiet, "0")) ckpt_log_set_level(CKPT_LOG_QUIET);
    /* Commands that write an output folder: Ctrl-C / SIGTERM remove its temp
     * folder and exit 130 / 143 (the daemon and its workers handle signals
     * themselves). */
    static const char *const writers[] = {"convert",      "consolidate",  "pull",      "state",
                                          "merge-lora",   "unmerge-lora", "convert-lora",
                                          "gen-model",    "import",       "fetch",     "gc"};
    for (size_t i = 0; i < sizeof writers / sizeof writers[0]; i++)
        if (!strcmp(writers[i], name) && ckpt_interrupt_init() < 0)
            fprintf(stderr, "ckpt: cannot set up the handling of interrupts; continuing without it\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(commands[i].name, name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "ckpt: '%s' is not a command\n", name);
    usage(stderr);
    return CLI_USAGE;
}

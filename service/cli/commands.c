/*
 * commands.c — the command table: every `ckpt <command>`, in the order
 * `ckpt --help` lists them. A new command is one row here and its
 * `cmd_<name>` in the file of its family (cli.h).
 */
#include "service/cli/cli.h"

#include <stddef.h>
#include <string.h>

const cli_command cli_commands[] = {
    {"inspect", cmd_inspect, 0,
     "list the tensors of a safetensors file or checkpoint directory"},
    {"gen-model", cmd_gen_model, CLI_WRITES,
     "write a synthetic Hugging Face checkpoint (llama, qwen2, mixtral, qwen3-moe)"},
    {"plan", cmd_plan, 0,
     "show what a conversion would write, from headers and config.json only"},
    {"convert", cmd_convert, CLI_WRITES,
     "convert a checkpoint into a layout (neuron, fused, easydel, hf, vllm; --tp N)"},
    {"consolidate", cmd_consolidate, CLI_WRITES,
     "rebuild the original checkpoint from a converted one"},
    {"merge-lora", cmd_merge_lora, CLI_WRITES,
     "merge a PEFT LoRA adapter into a checkpoint (W + s * B @ A, OpenBLAS)"},
    {"unmerge-lora", cmd_unmerge_lora, CLI_WRITES,
     "take a merged LoRA adapter out of a checkpoint again"},
    {"convert-lora", cmd_convert_lora, CLI_WRITES,
     "convert a LoRA adapter into a base's layout (fused, neuron --tp N)"},
    {"fetch", cmd_fetch, CLI_WRITES,
     "download a checkpoint from a Hugging Face Hub (HF_ENDPOINT) into the store"},
    {"sync", cmd_sync, 0,
     "follow a Hub repo on a schedule: fetch and convert each new commit"},
    {"import", cmd_import, CLI_WRITES,
     "store a local checkpoint folder or tar archive"},
    {"ls", cmd_ls, 0,
     "list stored checkpoints"},
    {"show", cmd_show, 0,
     "show a stored checkpoint's files"},
    {"rm", cmd_rm, 0,
     "remove a stored checkpoint (gc frees its bytes)"},
    {"gc", cmd_gc, CLI_WRITES,
     "delete unreferenced blobs and leftovers of interrupted writes"},
    {"du", cmd_du, 0,
     "logical vs physical bytes of the store, dedup ratio"},
    {"verify", cmd_verify, 0,
     "re-hash blobs and rebuild files; name what is damaged"},
    {"state", cmd_state, CLI_WRITES,
     "training states: save, load (one TP rank), import/ls/export/keep in the store"},
    {"serve", cmd_serve, 0,
     "run the daemon: job scheduler, worker processes, HTTP API"},
    {"submit", cmd_submit, 0,
     "queue a job (import, convert, fetch, ...; ORG/NAME --layout L: fetch then convert); prints its id"},
    {"jobs", cmd_jobs, 0,
     "list jobs"},
    {"logs", cmd_logs, 0,
     "print a job's log (-f to follow)"},
    {"wait", cmd_wait, 0,
     "follow a job to its end; exit status follows the job"},
    {"cancel", cmd_cancel, 0,
     "cancel a job"},
    {"retry", cmd_retry, 0,
     "queue a failed or cancelled job again"},
    {"worker", cmd_worker, 0,
     "internal: run one job (started by serve)"},
    {"s3", cmd_s3, 0,
     "internal: the store's S3 client on its own (put, get, head, ls, rm of a bucket)"},
    {"pull", cmd_pull, CLI_WRITES,
     "write a stored checkpoint (or one rank, or its consolidated form) to a folder or tar"},
};
const size_t cli_ncommands = sizeof cli_commands / sizeof cli_commands[0];

const cli_command *cli_command_find(const char *name)
{
    for (size_t i = 0; i < cli_ncommands; i++)
        if (!strcmp(cli_commands[i].name, name)) return &cli_commands[i];
    return NULL;
}

/* main.c — `ckpt <command> [args]`: global options, interrupt handling, dispatch through the command table (commands.c). */
#include "service/cli/cli.h"

#include "common/fsutil.h"
#include "common/interrupt.h"
#include "common/log.h"
#include "common/sanexit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out, "usage: ckpt [--home DIR | --server URL] [--token-file FILE] <command> [options]\n\n"
                 "ckpt converts Hugging Face checkpoints between layouts (experts stacked,\n"
                 "Q/K/V and gate/up fused, tensor-parallel shards with padding) and back.\n\n"
                 "commands:\n");
    for (size_t i = 0; i < cli_ncommands; i++)
        fprintf(out, "  %-14s %s\n", cli_commands[i].name, cli_commands[i].summary);
    fprintf(out, "\nglobal options, before the command:\n"
                 "  --home DIR        the store (else $CKPT_HOME, the config's home, ~/.local/share/ckpt)\n"
                 "  --blobs URL       where the store's blobs live: s3://BUCKET/PREFIX (else $CKPT_BLOBS,\n"
                 "                    the config's blobs; default: the store's blobs/ folder)\n"
                 "  --server URL      work on a daemon (else $CKPT_SERVER, the config's server)\n"
                 "  --token-file FILE the daemon's token on its first line (else $CKPT_TOKEN, the config's token_file)\n"
                 "  --db URL          jobs and schedules in PostgreSQL (postgresql://...; else $CKPT_DB, the config's db;\n"
                 "                    default: SQLite in the store)\n"
                 "config: $XDG_CONFIG_HOME/ckpt/config, lines 'key = value' (home, server, token_file, blobs, db)\n\n"
                 "example:\n  ckpt --server http://storage:8470 ls\n\n"
                 "'ckpt <command> --help' explains a command.\n");
}

int main(int argc, char **argv)
{
    ckpt_san_exit_prefault(); /* the sanitizer build's exit check without its page faults */
    int first = 1;
    if (cli_config_load() || cli_global_options(argc, argv, &first)) return CLI_USAGE;
    argc -= first - 1;
    argv += first - 1;
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
    const char *debug = getenv("CKPT_DEBUG"); /* debug lines too (retries, a bucket's request counts) */
    if (debug && *debug && strcmp(debug, "0") && !(quiet && *quiet && strcmp(quiet, "0"))) ckpt_log_set_level(CKPT_LOG_DEBUG);
    const cli_command *cmd = cli_command_find(name);
    if (!cmd) {
        fprintf(stderr, "ckpt: '%s' is not a command\n", name);
        usage(stderr);
        return CLI_USAGE;
    }
    /* A command that writes an output folder: Ctrl-C / SIGTERM remove its temp
     * folder and exit 130 / 143 (the daemon and its workers handle signals
     * themselves). */
    if ((cmd->flags & CLI_WRITES) && ckpt_interrupt_init(ckpt_rm_rf) < 0)
        fprintf(stderr, "ckpt: cannot set up the handling of interrupts; continuing without it\n");
    return cmd->fn(argc - 1, argv + 1);
}

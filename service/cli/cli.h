/*
 * cli.h — the command table and what every command shares.
 *
 * Each command is `int cmd_<name>(int argc, char **argv)`; argv[0] is the
 * command name. Commands live in the file of their family, which shares
 * its options (cli_opts.h): cmd_convert.c (plan, convert, consolidate),
 * cmd_store.c (import, ls, show, pull, rm, gc, du, verify), cmd_jobs.c
 * (serve, worker, submit, jobs, logs, wait, cancel, retry), cmd_lora.c
 * (merge-lora, unmerge-lora, convert-lora), and one file each for inspect,
 * gen-model, fetch, sync and state. The table of every command is
 * commands.c: a new command is a row there, its cmd_<name> below, and its
 * function in its family's file. main.c dispatches; cli.c holds the shared
 * helpers below.
 * Exit status: 0 success, 1 a failure the command explains on stderr
 * (CLI_FAIL), 2 bad usage (CLI_USAGE). `--help` prints the command's help to
 * stdout and exits 0.
 */
#ifndef CKPT_SERVICE_CLI_CLI_H
#define CKPT_SERVICE_CLI_CLI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CLI_OK 0
#define CLI_FAIL 1
#define CLI_USAGE 2

/* cli_command.flags */
#define CLI_WRITES 1u /* writes an output folder: an interrupt removes its temp output (common/interrupt.h) */

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    unsigned flags;
    const char *summary; /* one line of `ckpt --help` */
} cli_command;

/* The table (commands.c), and a lookup by name (NULL if none). */
extern const cli_command cli_commands[];
extern const size_t cli_ncommands;
const cli_command *cli_command_find(const char *name);

/* Prints "ckpt <cmd>: <msg>" plus "see 'ckpt <cmd> --help'" to stderr; returns CLI_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints "ckpt: <ckpt_error_last()>" to stderr; returns CLI_FAIL. */
int cli_fail(void);
/* Prints j as indented JSON (keys in order) on stdout and drops the
 * reference; NULL or a failure to render is cli_fail(). */
int cli_print_json(json_t *j);
/* True when argv holds --help or -h (before a "--"). */
bool cli_wants_help(int argc, char **argv);

/* Where a command works (cli_config.c). Precedence: the command line, then
 * the environment (CKPT_HOME, CKPT_SERVER, CKPT_TOKEN), then the config file
 * $XDG_CONFIG_HOME/ckpt/config (else ~/.config/ckpt/config; lines "key =
 * value" for home, server, token_file; '#' comments).
 * cli_config_load: fills in the variables the environment leaves unset;
 * CLI_OK, or CLI_USAGE after printing the error (it names the line and key).
 * cli_global_options: --home DIR, --server URL, --token-file FILE before the
 * command (argv[1..]); *first is the command's index; CLI_OK or CLI_USAGE.
 * cli_server: the daemon a command talks to: --server, else none when --home
 * was given, else $CKPT_SERVER; NULL: the local store.
 * cli_local_only: CLI_OK when the command works locally; else prints that cmd
 * cannot work on a server (and what to do instead, if given) and returns
 * CLI_USAGE. */
int cli_config_load(void);
int cli_global_options(int argc, char **argv, int *first);
const char *cli_server(const char *server_flag, const char *home_flag);
int cli_local_only(const char *cmd, const char *server_flag, const char *home_flag, const char *instead);

/* Commands. */
int cmd_inspect(int argc, char **argv);
/* `ckpt inspect` of an EasyDeL TensorStore checkpoint folder (cmd_inspect_easydel.c). */
int cli_inspect_easydel(const char *path, bool as_json);
/* A shape as a JSON array of integers (new reference). */
json_t *cli_dims_json(int n, const uint64_t *d);
/* `ckpt inspect` of an optimum-neuron / neuronx-distributed save (cmd_inspect_nxd.c). */
int cli_inspect_nxd(const char *path, bool as_json);
/* `ckpt inspect` of a PyTorch DCP folder (cmd_inspect_dcp.c). */
int cli_inspect_dcp(const char *path, bool as_json);
/* s with control characters as \xNN, so a hostile tensor or shard name cannot drive the
 * terminal: s itself when it has none, else a copy in *owned (caller frees). */
const char *cli_printable(const char *s, char **owned);
int cmd_gen_model(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_consolidate(int argc, char **argv);
int cmd_merge_lora(int argc, char **argv);
int cmd_unmerge_lora(int argc, char **argv);
int cmd_convert_lora(int argc, char **argv);
int cmd_import(int argc, char **argv);
int cmd_ls(int argc, char **argv);
int cmd_show(int argc, char **argv);
int cmd_pull(int argc, char **argv);
int cmd_rm(int argc, char **argv);
int cmd_gc(int argc, char **argv);
int cmd_du(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_state(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_worker(int argc, char **argv);
int cmd_s3(int argc, char **argv);
int cmd_submit(int argc, char **argv);
int cmd_jobs(int argc, char **argv);
int cmd_job_show(int argc, char **argv);
int cmd_logs(int argc, char **argv);
int cmd_cancel(int argc, char **argv);
int cmd_retry(int argc, char **argv);
int cmd_wait(int argc, char **argv);
int cmd_fetch(int argc, char **argv);
int cmd_sync(int argc, char **argv);

#endif

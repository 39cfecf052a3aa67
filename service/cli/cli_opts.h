/*
 * cli_opts.h — the option parsing the commands share.
 *
 * The commands come in families (the store commands, the state subcommands,
 * plan/convert/consolidate, the LoRA commands, fetch, gen-model); a family
 * knows a set of long options and each of its commands takes some of them.
 * Options several families have are named here once (CLI_OPT_*); a family
 * lists the ones it knows and adds its own, numbered from CLI_OPT_OWN.
 *
 * cli_getopt() is getopt_long() underneath (optarg holds an option's value)
 * and does what every family did around it:
 *
 *   - an unknown option, or one of the family's that this command does not
 *     take, is "ckpt CMD: unknown option '...'" (as is a missing value,
 *     unless .say_needs_value: then "ckpt CMD: --x needs a value");
 *   - --home, --json, --quiet, --force, --output (-o with .dash_o),
 *     --dry-run and --server land in *common, which starts zeroed by the
 *     caller; CKPT_QUIET (the log level) sets common->quiet too;
 *   - at the end, the positional arguments are args[0 .. nargs), and more
 *     than .max_args of them is "ckpt CMD: too many arguments".
 *
 * Every other option comes back to the command to interpret:
 *
 *     cli_parser p = {.cmd = "pull", .shared = store_shared, .own = store_own, .dash_o = true,
 *                     .allowed = allowed, .max_args = 2, .common = &a->common};
 *     int c;
 *     while ((c = cli_getopt(&p, argc, argv)) > 0) {
 *         switch (c) {
 *         case CLI_OPT_RANK:
 *             if (cli_parse_number(p.cmd, "--rank", optarg, 0, 1023, &v)) return CLI_USAGE;
 *             ...
 *         }
 *     }
 *     if (c < 0) return CLI_USAGE;
 *
 * Messages go through cli_usage_error() (service/cli/cli.h), so they name the
 * command and point at its --help.
 */
#ifndef CKPT_SERVICE_CLI_CLI_OPTS_H
#define CKPT_SERVICE_CLI_CLI_OPTS_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>

/* The options several families share. The first seven are parsed into a
 * cli_common; the others come back to the command, whose limits they take. */
enum {
    CLI_OPT_END = 0,        /* ends a list of option ids */
    CLI_OPT_HOME = 256,     /* --home DIR */
    CLI_OPT_JSON,           /* --json */
    CLI_OPT_QUIET,          /* --quiet */
    CLI_OPT_FORCE,          /* --force */
    CLI_OPT_OUTPUT,         /* --output DIR, and -o DIR where .dash_o */
    CLI_OPT_DRY_RUN,        /* --dry-run */
    CLI_OPT_SERVER,         /* --server URL */
    CLI_OPT_RANK,           /* --rank R */
    CLI_OPT_LAYOUT,         /* --layout L */
    CLI_OPT_TP,             /* --tp N */
    CLI_OPT_KV_MULTIPLIER,  /* --kv-size-multiplier M */
    CLI_OPT_DTYPE,          /* --dtype D */
    CLI_OPT_MAX_SHARD_SIZE, /* --max-shard-size SIZE */
    CLI_OPT_RULES,          /* --rules FILE */
    CLI_OPT_THREADS,        /* --threads N */
    CLI_OPT_NO_HASH,        /* --no-hash */
    CLI_OPT_SEED,           /* --seed K */
    CLI_OPT_OWN = 512       /* a family's own options number from here */
};

/* Most options one family knows, shared and own together. */
#define CLI_MAX_OPTIONS 40

/* The values of the shared options every family reads alike. */
typedef struct {
    const char *home, *out, *server;
    bool json, quiet, force, dry_run;
} cli_common;

typedef struct {
    /* Set by the caller (a designated initializer; the rest starts zeroed). */
    const char *cmd;          /* names the command in messages: "pull", "state save" */
    const int *shared;        /* the CLI_OPT_* the family knows, up to CLI_OPT_END */
    const struct option *own; /* the family's own options, ending in {0}; NULL: none */
    const int *allowed;       /* the option ids this command takes, up to CLI_OPT_END; NULL: all */
    bool dash_o;              /* -o VALUE means --output VALUE */
    int dash_f;               /* nonzero: -f means this option (an id of .own, taking no value) */
    bool say_needs_value;     /* a missing value reads "--x needs a value" */
    int max_args;             /* > 0: at most this many positional arguments; 0: the
                                 command counts them itself */
    cli_common *common;       /* where the shared values land; NULL if the family has none */

    /* Set by cli_getopt() once it returned 0. */
    char **args; /* the positional arguments, in order */
    int nargs;

    /* cli_getopt()'s own. */
    bool started;
    char shortopts[8];
    struct option table[CLI_MAX_OPTIONS + 1];
} cli_parser;

/* The next option for the command to handle (optarg holds its value); 0 when
 * argv is done and p->args is set; -1 after printing a usage error. */
int cli_getopt(cli_parser *p, int argc, char **argv);

/* TEXT as a whole number from MIN to MAX into *out: CLI_OK, or CLI_USAGE after
 * printing "ckpt CMD: OPTION must be a number from MIN to MAX". */
int cli_parse_number(const char *cmd, const char *option, const char *text, uint64_t min,
                     uint64_t max, uint64_t *out);

/* TEXT as a size above zero (5GB, 500MB, 2GiB) into *out: CLI_OK, or CLI_USAGE
 * after printing "ckpt CMD: OPTION: <what is wrong>". */
int cli_parse_size(const char *cmd, const char *option, const char *text, uint64_t *out);

/* TEXT as a finite, non-zero number into *out: CLI_OK, or CLI_USAGE after
 * printing "ckpt CMD: OPTION takes a finite, non-zero number". */
int cli_parse_factor(const char *cmd, const char *option, const char *text, double *out);

/* --rules FILE with --layout, --tp, --dtype or --kv-size-multiplier: the
 * rules document decides those itself, so the combination is refused (a
 * usage error naming the options given) rather than silently dropping them. */
int cli_rules_conflict(const char *cmd, const char *layout, int tp, const char *dtype, int64_t kv);

#endif

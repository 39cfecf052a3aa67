/*
 * cli_opts.c — the option parsing the commands share (see cli_opts.h): one
 * getopt_long loop with the unknown-option, missing-value and positional
 * rules every family had its own copy of, and the number parsers behind the
 * usual messages.
 */
#include "service/cli/cli_opts.h"

#include "service/cli/cli.h"

#include "common/error.h"
#include "common/log.h"
#include "common/util.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct option shared_options[] = {
    {"home", required_argument, 0, CLI_OPT_HOME},
    {"json", no_argument, 0, CLI_OPT_JSON},
    {"quiet", no_argument, 0, CLI_OPT_QUIET},
    {"force", no_argument, 0, CLI_OPT_FORCE},
    {"output", required_argument, 0, CLI_OPT_OUTPUT},
    {"dry-run", no_argument, 0, CLI_OPT_DRY_RUN},
    {"server", required_argument, 0, CLI_OPT_SERVER},
    {"rank", required_argument, 0, CLI_OPT_RANK},
    {"layout", required_argument, 0, CLI_OPT_LAYOUT},
    {"tp", required_argument, 0, CLI_OPT_TP},
    {"kv-size-multiplier", required_argument, 0, CLI_OPT_KV_MULTIPLIER},
    {"dtype", required_argument, 0, CLI_OPT_DTYPE},
    {"max-shard-size", required_argument, 0, CLI_OPT_MAX_SHARD_SIZE},
    {"rules", required_argument, 0, CLI_OPT_RULES},
    {"threads", required_argument, 0, CLI_OPT_THREADS},
    {"no-hash", no_argument, 0, CLI_OPT_NO_HASH},
    {"seed", required_argument, 0, CLI_OPT_SEED},
};

/* The getopt table of the family: exactly the options it knows, so that
 * abbreviations (--cons, --f) resolve, or are ambiguous, as among those. */
static void build_table(cli_parser *p)
{
    size_t n = 0;
    for (const int *id = p->shared; id && *id; id++) {
        size_t i = 0;
        while (i < CKPT_ARRAY_LEN(shared_options) && shared_options[i].val != *id)
            i++;
        assert(i < CKPT_ARRAY_LEN(shared_options) && n < CLI_MAX_OPTIONS);
        p->table[n++] = shared_options[i];
    }
    for (const struct option *o = p->own; o && o->name; o++) {
        assert(n < CLI_MAX_OPTIONS);
        p->table[n++] = *o;
    }
    memset(&p->table[n], 0, sizeof p->table[n]);
    snprintf(p->shortopts, sizeof p->shortopts, "%s%s%s", p->say_needs_value ? ":" : "",
             p->dash_o ? "o:" : "", p->dash_f ? "f" : "");
}

static bool allowed(const cli_parser *p, int id)
{
    if (!p->allowed) return true;
    for (const int *a = p->allowed; *a; a++)
        if (*a == id) return true;
    return false;
}

/* Stores a shared value in *common; false when the option is the command's to handle. */
static bool take_common(cli_common *c, int id, const char *arg)
{
    switch (id) {
    case CLI_OPT_HOME:
        c->home = arg;
        return true;
    case CLI_OPT_JSON:
        c->json = true;
        return true;
    case CLI_OPT_QUIET:
        c->quiet = true;
        return true;
    case CLI_OPT_FORCE:
        c->force = true;
        return true;
    case CLI_OPT_OUTPUT:
        c->out = arg;
        return true;
    case CLI_OPT_DRY_RUN:
        c->dry_run = true;
        return true;
    case CLI_OPT_SERVER:
        c->server = arg;
        return true;
    }
    return false;
}

int cli_getopt(cli_parser *p, int argc, char **argv)
{
    if (!p->started) {
        build_table(p);
        /* 0, not 1: fully reinitialises GNU getopt, which permutes options and operands */
        optind = 0;
        opterr = 0;
        p->started = true;
    }
    int c;
    while ((c = getopt_long(argc, argv, p->shortopts, p->table, NULL)) != -1) {
        if (c == 'o' && p->dash_o) c = CLI_OPT_OUTPUT;
        if (c == 'f' && p->dash_f) c = p->dash_f;
        if (c == ':') {
            cli_usage_error(p->cmd, "%s needs a value", argv[optind - 1]);
            return -1;
        }
        if (c == '?' || !allowed(p, c)) {
            cli_usage_error(p->cmd, "unknown option '%s'", argv[optind - 1]);
            return -1;
        }
        if (!p->common || !take_common(p->common, c, optarg)) return c;
    }
    p->args = argv + optind;
    p->nargs = argc - optind;
    if (p->max_args > 0 && p->nargs > p->max_args) {
        cli_usage_error(p->cmd, "too many arguments");
        return -1;
    }
    if (p->common && ckpt_log_get_level() == CKPT_LOG_QUIET) p->common->quiet = true;
    return 0;
}

int cli_parse_number(const char *cmd, const char *option, const char *text, uint64_t min,
                     uint64_t max, uint64_t *out)
{
    if (ckpt_parse_u64(text, out) < 0 || *out < min || *out > max)
        return cli_usage_error(cmd, "%s must be a number from %llu to %llu", option,
                               (unsigned long long)min, (unsigned long long)max);
    return CLI_OK;
}

int cli_parse_size(const char *cmd, const char *option, const char *text, uint64_t *out)
{
    if (ckpt_parse_size(text, out) < 0 || *out == 0)
        return cli_usage_error(cmd, "%s: %s", option, ckpt_error_last());
    return CLI_OK;
}

int cli_parse_factor(const char *cmd, const char *option, const char *text, double *out)
{
    if (ckpt_parse_double(option, text, -1e30, 1e30, out) < 0 || *out == 0)
        return cli_usage_error(cmd, "%s takes a finite, non-zero number", option);
    return CLI_OK;
}

int cli_rules_conflict(const char *cmd, const char *layout, int tp, const char *dtype, int64_t kv)
{
    char which[96] = "";
    size_t n = 0;
    const char *names[] = {layout ? "--layout" : NULL, tp ? "--tp" : NULL, dtype ? "--dtype" : NULL,
                           kv ? "--kv-size-multiplier" : NULL};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (names[i])
            n += (size_t)snprintf(which + n, sizeof which - n, "%s%s", n ? ", " : "", names[i]);
    return cli_usage_error(cmd,
                           "--rules FILE cannot be combined with %s: the rules document sets the "
                           "layout, tp and dtype itself (write one with those options by `ckpt plan "
                           "SRC --layout L --tp N --dtype D --print-rules`)",
                           which);
}

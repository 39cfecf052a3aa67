/*
 * cmd_state.c — `ckpt state ...`: training states from the command line.
 *
 *   save SRC DST     re-save a state (cast, reshard, drop the optimizer, set the step),
 *                    or make one from a Hugging Face checkpoint (with fresh optimizer slots)
 *   load DIR         load and check a state (or one rank of a layout of it), print a
 *                    summary, optionally save what was loaded (-o)
 *   import DIR       store a state as step N of a run (store/store_runs.h)
 *   ls [RUN]         the stored steps
 *   export RUN@STEP  write a stored step out (whole, one rank of a layout, without optimizer)
 *   keep RUN         retention: keep the newest N steps and every K-th, forget the rest, gc
 *
 * The library does the work (include/ckpt.h, state/state.h); this file
 * parses options and prints.
 */
#include "service/cli/cli.h"
#include "service/cli/cli_opts.h"
#include "service/cli/job_client.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "state/state.h"
#include "store/store_runs.h"
#include "store/materialize.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STATE_MAX_SETS 64

enum {
    O_NO_OPT = CLI_OPT_OWN,
    O_STEP,
    O_OPTIMIZER,
    O_SLOTS,
    O_FILL,
    O_SET,
    O_RUN,
    O_LAST,
    O_EVERY
};

/* Every option of the state subcommands; each takes the ones its allowed[] lists. */
static const int state_shared[] = {
    CLI_OPT_HOME,           CLI_OPT_JSON,    CLI_OPT_QUIET, CLI_OPT_OUTPUT, CLI_OPT_FORCE,
    CLI_OPT_LAYOUT,         CLI_OPT_TP,      CLI_OPT_RANK,  CLI_OPT_DTYPE,  CLI_OPT_SEED,
    CLI_OPT_MAX_SHARD_SIZE, CLI_OPT_DRY_RUN, CLI_OPT_SERVER, CLI_OPT_END};
static const struct option state_own[] = {
    {"no-optimizer", no_argument, 0, O_NO_OPT},
    {"step", required_argument, 0, O_STEP},
    {"optimizer", required_argument, 0, O_OPTIMIZER},
    {"slots", required_argument, 0, O_SLOTS},
    {"fill", required_argument, 0, O_FILL},
    {"set", required_argument, 0, O_SET},
    {"run", required_argument, 0, O_RUN},
    {"last", required_argument, 0, O_LAST},
    {"every", required_argument, 0, O_EVERY},
    {0, 0, 0, 0},
};

typedef struct {
    cli_common common; /* --home, --json, --quiet, -o, --force, --dry-run */
    const char *layout, *dtype, *optimizer, *slots, *fill, *run;
    bool no_opt, has_step, has_last, has_rank;
    int tp, rank;
    uint64_t step, seed, max_shard, last, every;
    size_t nsets;
    const char *sets[STATE_MAX_SETS];
    int npos;
    char **pos;
} state_args;

static int parse(const char *cmd, int argc, char **argv, const int *allowed, state_args *a)
{
    memset(a, 0, sizeof *a);
    char what[64];
    snprintf(what, sizeof what, "state %s", cmd);
    cli_parser p = {.cmd = what,
                    .shared = state_shared,
                    .own = state_own,
                    .dash_o = true,
                    .allowed = allowed,
                    .max_args = 2,
                    .common = &a->common};
    int c;
    while ((c = cli_getopt(&p, argc, argv)) > 0) {
        uint64_t v = 0;
        bool number = c == CLI_OPT_TP || c == CLI_OPT_RANK || c == O_STEP || c == CLI_OPT_SEED ||
                      c == O_LAST || c == O_EVERY;
        if (number && ckpt_parse_u64(optarg, &v) < 0)
            return cli_usage_error(what, "%s needs a non-negative number, not '%s'",
                                   argv[optind - 1], optarg);
        switch (c) {
        case CLI_OPT_LAYOUT:
            a->layout = optarg;
            break;
        case CLI_OPT_TP:
            if (cli_parse_number(what, "--tp", optarg, 1, 1024, &v)) return CLI_USAGE;
            a->tp = (int)v;
            break;
        case CLI_OPT_RANK:
            if (cli_parse_number(what, "--rank", optarg, 0, 1023, &v)) return CLI_USAGE;
            a->rank = (int)v;
            a->has_rank = true;
            break;
        case CLI_OPT_DTYPE:
            a->dtype = optarg;
            break;
        case O_NO_OPT:
            a->no_opt = true;
            break;
        case O_STEP:
            if (v > INT64_MAX) return cli_usage_error(what, "--step is too large");
            a->step = v;
            a->has_step = true;
            break;
        case O_OPTIMIZER:
            a->optimizer = optarg;
            break;
        case O_SLOTS:
            a->slots = optarg;
            break;
        case O_FILL:
            if (strcmp(optarg, "zeros") && strcmp(optarg, "random"))
                return cli_usage_error(what, "--fill is zeros or random");
            a->fill = optarg;
            break;
        case CLI_OPT_SEED:
            a->seed = v;
            break;
        case O_SET:
            if (a->nsets == STATE_MAX_SETS) return cli_usage_error(what, "too many --set");
            if (!strchr(optarg, '='))
                return cli_usage_error(what, "--set takes KEY=NUMBER, not '%s'", optarg);
            a->sets[a->nsets++] = optarg;
            break;
        case CLI_OPT_MAX_SHARD_SIZE:
            if (cli_parse_size(what, "--max-shard-size", optarg, &a->max_shard)) return CLI_USAGE;
            break;
        case O_RUN:
            a->run = optarg;
            break;
        case O_LAST:
            a->last = v;
            a->has_last = true;
            break;
        case O_EVERY:
            if (v == 0) return cli_usage_error(what, "--every must be at least 1");
            a->every = v;
            break;
        }
    }
    if (c < 0) return CLI_USAGE;
    a->pos = p.args;
    a->npos = p.nargs;
    if (a->dtype) {
        ckpt_dtype dt;
        if (state_parse_float_dtype(a->dtype, &dt, "--dtype") < 0)
            return cli_usage_error(what, "%s", ckpt_error_last());
    }
    if ((a->tp || a->has_rank) && !a->layout)
        return cli_usage_error(what, "--tp and --rank go with --layout");
    return CLI_OK;
}

static bool is_state_dir(const char *dir)
{
    char *p = ckpt_path_join(dir, STATE_METADATA_FILE);
    bool yes = p && ckpt_exists(p);
    free(p);
    return yes;
}

/* DST must be missing or empty, or (with --force) hold a state. */
static int check_dst(const char *dst, bool force)
{
    if (ckpt_dir_is_empty_or_missing(dst)) return CLI_OK;
    if (!force) {
        ckpt_error_set(CKPT_EEXIST, "%s is not empty (use --force to replace the state there)",
                       dst);
        return cli_fail();
    }
    return CLI_OK;
}

/* ---- save ---- */

static uint64_t name_seed(const char *s, uint64_t seed)
{
    uint64_t h = 1469598103934665603ULL ^ seed;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* Slots for every parameter: zeros, or small random values (a function of seed, parameter and
 * slot). */
static int add_fresh_slots(ckpt_state *st, const state_args *a)
{
    const char *list = a->slots ? a->slots
                       : (!strcmp(a->optimizer, "adam") || !strcmp(a->optimizer, "adamw"))
                           ? "adam_m,adam_v"
                           : "momentum";
    char *copy = ckpt_strdup(list);
    if (!copy) return CKPT_ENOMEM;
    int rc = ckpt_state_set_optimizer(st, a->optimizer);
    size_t nparams = ckpt_state_param_count(st);
    char *save = NULL;
    for (char *slot = strtok_r(copy, ",", &save); !rc && slot; slot = strtok_r(NULL, ",", &save)) {
        for (size_t i = 0; !rc && i < nparams; i++) {
            const ckpt_tensor *p = ckpt_state_param_at(st, i);
            ckpt_tensor *t;
            rc = ckpt_state_add_slot(&t, st, p->name, slot, CKPT_DT_F32, NULL);
            if (rc || !a->fill || strcmp(a->fill, "random")) continue;
            uint64_t s = name_seed(t->name, a->seed);
            float *v = t->data;
            for (uint64_t k = 0; k < t->numel; k++) {
                s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                v[k] = (float)((double)(s >> 40) / (double)(1u << 24) - 0.5) * 0.02f;
            }
        }
    }
    free(copy);
    return rc;
}

static int apply_sets(ckpt_state *st, const state_args *a)
{
    for (size_t i = 0; i < a->nsets; i++) {
        char key[256];
        const char *eq = strchr(a->sets[i], '=');
        size_t kl = (size_t)(eq - a->sets[i]);
        char *end;
        double v = strtod(eq + 1, &end);
        if (kl == 0 || kl >= sizeof key || *end || end == eq + 1)
            return ckpt_error_set(CKPT_EINVAL, "--set '%s': expected KEY=NUMBER", a->sets[i]);
        memcpy(key, a->sets[i], kl);
        key[kl] = 0;
        int rc = ckpt_state_set_hyperparameter(st, key, v);
        if (rc) return rc;
    }
    return 0;
}

static void print_save_help(void)
{
    printf(
        "usage: ckpt state save SRC DST [--step N] [--dtype D] [--max-shard-size SIZE] "
        "[--no-optimizer]\n"
        "                      [--optimizer NAME [--slots A,B] [--fill zeros|random] [--seed S]]\n"
        "                      [--set KEY=NUMBER ...] [--force]\n\n"
        "Writes the training state DST (metadata.json, model and optimizer safetensors, "
        "optimizer.json,\n"
        "config.json). DST appears complete or not at all; an existing state there is replaced\n"
        "(--force) only once the new one is on disk.\n\n"
        "SRC is a training state, re-saved with the options (cast, reshard, drop the optimizer,\n"
        "set the step), or a Hugging Face checkpoint folder, which becomes a state at --step\n"
        "(default 0) holding its parameters and config.json.\n\n"
        "  --step N               the step to record\n"
        "  --dtype D              cast floating tensors to bf16, f16, f32 or f64\n"
        "  --max-shard-size SIZE  largest file (default 5GB); larger states get shards + an index\n"
        "  --no-optimizer         leave the optimizer out\n"
        "  --optimizer NAME       (checkpoint SRC) add optimizer slots for every parameter, F32:\n"
        "                         adam_m and adam_v for adam/adamw, else momentum (--slots A,B "
        "names\n"
        "                         them), zero or --fill random (seeded by --seed), count = step\n"
        "  --set KEY=NUMBER       set a hyperparameter, e.g. --set lr=0.0003 (repeatable)\n"
        "  --force                replace the state in DST\n\n"
        "examples:\n"
        "  ckpt state save ./Qwen2-0.5B ./state --optimizer adamw --set lr=3e-4 --step 0\n"
        "  ckpt state save ./state ./state-bf16 --dtype bf16 --no-optimizer\n");
}

static int state_save(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        print_save_help();
        return CLI_OK;
    }
    static const int allowed[] = {O_STEP,        CLI_OPT_DTYPE, CLI_OPT_MAX_SHARD_SIZE,
                                  O_NO_OPT,      O_OPTIMIZER,   O_SLOTS,
                                  O_FILL,        CLI_OPT_SEED,  O_SET,
                                  CLI_OPT_FORCE, CLI_OPT_QUIET, CLI_OPT_END};
    state_args a;
    int u = parse("save", argc, argv, allowed, &a);
    if (u) return u;
    if (a.npos != 2) return cli_usage_error("state save", "expected SRC and DST");
    bool from_state = is_state_dir(a.pos[0]);
    if (a.optimizer && from_state)
        return cli_usage_error("state save",
                               "--optimizer makes slots for a checkpoint; %s is a state already",
                               a.pos[0]);
    if ((a.slots || a.fill) && !a.optimizer)
        return cli_usage_error("state save", "--slots and --fill go with --optimizer");
    if (check_dst(a.pos[1], a.common.force)) return CLI_FAIL;
    ckpt_state *st = NULL;
    ckpt_state_load_options lo = CKPT_STATE_LOAD_OPTIONS_INIT;
    lo.load_optimizer = !a.no_opt;
    int rc =
        from_state ? ckpt_state_load(a.pos[0], &lo, &st) : state_from_checkpoint(a.pos[0], &st);
    if (!rc && a.optimizer) rc = add_fresh_slots(st, &a);
    if (!rc && a.has_step) {
        ckpt_state_set_step(st, a.step);
        if (a.optimizer) rc = ckpt_state_set_scalar(st, "count", (double)a.step);
    }
    if (!rc) rc = apply_sets(st, &a);
    ckpt_state_save_options so = CKPT_STATE_SAVE_OPTIONS_INIT;
    so.float_dtype = a.dtype;
    so.save_optimizer = !a.no_opt;
    so.max_shard_size = a.max_shard;
    double t0 = ckpt_now();
    if (!rc) rc = ckpt_state_save(a.pos[1], st, &so);
    if (!rc && !a.common.quiet)
        ckpt_info("saved state %s: step %llu, %zu parameters, %zu optimizer tensors in %.2f s",
                  a.pos[1], (unsigned long long)ckpt_state_step(st), ckpt_state_param_count(st),
                  a.no_opt ? (size_t)0 : ckpt_state_slot_count(st), ckpt_now() - t0);
    ckpt_state_free(st);
    return rc ? cli_fail() : CLI_OK;
}

/* ---- load ---- */

static json_t *tensor_list(const ckpt_state *st, bool slots)
{
    json_t *a = json_array();
    size_t n = slots ? ckpt_state_slot_count(st) : ckpt_state_param_count(st);
    for (size_t i = 0; a && i < n; i++) {
        const ckpt_tensor *t = slots ? ckpt_state_slot_at(st, i) : ckpt_state_param_at(st, i);
        json_t *shape = json_array();
        for (int k = 0; shape && k < t->ndim; k++)
            json_array_append_new(shape, json_integer((json_int_t)t->shape[k]));
        json_array_append_new(a, json_pack("{s:s,s:s,s:o,s:I}", "name", t->name, "dtype",
                                           ckpt_dtype_name(t->dtype), "shape", shape, "nbytes",
                                           (json_int_t)t->nbytes));
    }
    return a;
}

/* "BF16, F32" and the byte total of the parameters or the slots. */
static uint64_t group_summary(const ckpt_state *st, bool slots, char *dtypes, size_t len)
{
    bool seen[CKPT_DT_COUNT] = {false};
    uint64_t bytes = 0;
    size_t n = slots ? ckpt_state_slot_count(st) : ckpt_state_param_count(st);
    for (size_t i = 0; i < n; i++) {
        const ckpt_tensor *t = slots ? ckpt_state_slot_at(st, i) : ckpt_state_param_at(st, i);
        seen[t->dtype] = true;
        bytes += t->nbytes;
    }
    dtypes[0] = 0;
    for (int d = 0; d < CKPT_DT_COUNT; d++)
        if (seen[d])
            snprintf(dtypes + strlen(dtypes), len - strlen(dtypes), "%s%s", *dtypes ? ", " : "",
                     ckpt_dtype_name((ckpt_dtype)d));
    return bytes;
}

static json_t *optimizer_json(const ckpt_state *st)
{
    char *text = ckpt_state_optimizer_json(st);
    json_t *j = NULL;
    if (text) cj_load_buf(&j, text, strlen(text), "optimizer.json");
    free(text);
    return j;
}

static int print_state(const ckpt_state *st, const char *dir, const state_args *a)
{
    if (a->common.json) {
        json_t *j =
            json_pack("{s:s,s:I,s:s?,s:o,s:o}", "dir", dir, "step", (json_int_t)ckpt_state_step(st),
                      "timestamp", ckpt_state_timestamp(st), "parameters", tensor_list(st, false),
                      "optimizer_tensors", tensor_list(st, true));
        if (j && a->layout)
            json_object_set_new(j, "rank",
                                json_pack("{s:s,s:i}", "layout", a->layout, "rank", a->rank));
        if (j && ckpt_state_optimizer(st)) json_object_set_new(j, "optimizer", optimizer_json(st));
        return cli_print_json(j);
    }
    char dt[128], size[32];
    printf("state %s: step %llu%s%s\n", dir, (unsigned long long)ckpt_state_step(st),
           ckpt_state_timestamp(st) ? ", saved " : "",
           ckpt_state_timestamp(st) ? ckpt_state_timestamp(st) : "");
    if (a->layout && a->tp)
        printf("  rank %d of layout %s, tp %d\n", a->rank, a->layout, a->tp);
    else if (a->layout)
        printf("  rank %d of layout %s\n", a->rank, a->layout);
    uint64_t b = group_summary(st, false, dt, sizeof dt);
    printf("  parameters: %zu tensors, %s (%s)\n", ckpt_state_param_count(st),
           ckpt_format_size(b, size, sizeof size), *dt ? dt : "-");
    if (ckpt_state_optimizer(st)) {
        b = group_summary(st, true, dt, sizeof dt);
        printf("  optimizer %s: %zu slot tensors, %s (%s); slots", ckpt_state_optimizer(st),
               ckpt_state_slot_count(st), ckpt_format_size(b, size, sizeof size), *dt ? dt : "-");
        for (size_t i = 0; i < ckpt_state_slot_name_count(st); i++)
            printf(" %s", ckpt_state_slot_name(st, i));
        printf("\n");
        json_t *o = optimizer_json(st);
        /* 15 digits for people: 3e-4 reads 0.0003, not 0.00029999999999999997. */
        size_t flags = JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15);
        char *h = o ? cj_dumps(json_object_get(o, "hyperparameters"), flags) : NULL;
        char *s = o ? cj_dumps(json_object_get(o, "scalars"), flags) : NULL;
        printf("  hyperparameters %s\n  scalars %s\n", h ? h : "{}", s ? s : "{}");
        free(h);
        free(s);
        json_decref(o);
    } else {
        printf("  no optimizer state%s\n", a->no_opt ? " loaded" : "");
    }
    return CLI_OK;
}

static void load_options(ckpt_state_load_options *lo, const state_args *a)
{
    *lo = (ckpt_state_load_options)CKPT_STATE_LOAD_OPTIONS_INIT;
    lo->dtype = a->dtype;
    lo->load_optimizer = !a->no_opt;
    lo->layout = a->layout;
    lo->tp = a->tp;
    lo->rank = a->rank;
}

static int state_load(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf(
            "usage: ckpt state load DIR [--layout L [--tp N] --rank R] [--dtype D] "
            "[--no-optimizer]\n"
            "                      [--json] [-o OUT [--force] [--max-shard-size SIZE]]\n\n"
            "Loads the training state in DIR, checking everything (the safetensors rules, the\n"
            "indexes, that every optimizer tensor names a parameter and a listed slot with its\n"
            "shape, the format version), and prints what it holds.\n\n"
            "  --layout L --rank R  one tensor-parallel rank of a layout (neuron, fused, easydel, "
            "hf;\n"
            "                       --tp N or L as neuron-tp8) of a state saved in the original\n"
            "                       layout; only the byte ranges the rank needs are read, and\n"
            "                       optimizer slots are sliced like their parameters\n"
            "  --dtype D            cast floating tensors while loading\n"
            "  --no-optimizer       skip the optimizer files\n"
            "  --json               every tensor with dtype, shape and size\n"
            "  -o OUT               save what was loaded as the state OUT (e.g. a rank's state)\n\n"
            "example:\n  ckpt state load ./state --layout neuron --tp 8 --rank 3 -o "
            "./state-rank3\n");
        return CLI_OK;
    }
    static const int allowed[] = {CLI_OPT_LAYOUT, CLI_OPT_TP,    CLI_OPT_RANK,
                                  CLI_OPT_DTYPE,  O_NO_OPT,      CLI_OPT_JSON,
                                  CLI_OPT_OUTPUT, CLI_OPT_FORCE, CLI_OPT_MAX_SHARD_SIZE,
                                  CLI_OPT_QUIET,  CLI_OPT_END};
    state_args a;
    int u = parse("load", argc, argv, allowed, &a);
    if (u) return u;
    if (a.npos != 1) return cli_usage_error("state load", "expected one state folder");
    if (a.layout && !a.has_rank) return cli_usage_error("state load", "--layout needs --rank R");
    if (a.common.out && check_dst(a.common.out, a.common.force)) return CLI_FAIL;
    ckpt_state_load_options lo;
    load_options(&lo, &a);
    ckpt_state *st;
    if (ckpt_state_load(a.pos[0], &lo, &st) < 0) return cli_fail();
    int ret = CLI_OK;
    if (a.common.out) {
        ckpt_state_save_options so = CKPT_STATE_SAVE_OPTIONS_INIT;
        so.keep_timestamp = true;
        so.max_shard_size = a.max_shard;
        ret = ckpt_state_save(a.common.out, st, &so) < 0 ? cli_fail() : CLI_OK;
        if (!ret && !a.common.quiet) ckpt_info("saved what was loaded as %s", a.common.out);
    }
    if (!ret) ret = print_state(st, a.pos[0], &a);
    ckpt_state_free(st);
    return ret;
}

/* ---- the store ---- */

static int state_import(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf("usage: ckpt state import DIR --run NAME [--step N] [--home DIR] [--json]\n\n"
               "Stores the training state DIR (checked by loading it first) as step N of run NAME\n"
               "(default: the step its metadata.json records). It becomes the stored checkpoint\n"
               "runs/NAME@step-N; tensors that did not change since another stored step (frozen\n"
               "embeddings, say) are not stored again. Prints NAME@N.\n\n"
               "example:\n  ckpt state import ./ckpt/step-1200 --run llama-sft\n");
        return CLI_OK;
    }
    static const int allowed[] = {O_RUN,        O_STEP,        CLI_OPT_HOME,
                                  CLI_OPT_JSON, CLI_OPT_QUIET, CLI_OPT_SERVER, CLI_OPT_END};
    state_args a;
    int u = parse("import", argc, argv, allowed, &a);
    if (!u) u = cli_local_only("state import", a.common.server, a.common.home, NULL);
    if (u) return u;
    if (a.npos != 1) return cli_usage_error("state import", "expected one state folder");
    if (!a.run) return cli_usage_error("state import", "--run NAME is required");
    char *repo;
    if (store_run_repo(a.run, &repo) < 0)
        return cli_usage_error("state import", "%s", ckpt_error_last());
    free(repo);
    ckpt_state *st;
    if (ckpt_state_load(a.pos[0], NULL, &st) < 0) return cli_fail();
    uint64_t step = a.has_step ? a.step : ckpt_state_step(st);
    ckpt_state_free(st);
    ckpt_store s;
    if (store_open(&s, a.common.home) < 0) return cli_fail();
    store_ckpt c;
    bool existed = false;
    int rc = store_run_import(&s, a.pos[0], a.run, step, a.common.quiet, &c, &existed);
    if (!rc) {
        char size[32];
        if (a.common.json) {
            cli_print_json(json_pack("{s:s,s:I,s:s,s:I,s:b}", "run", a.run, "step", (json_int_t)step,
                                 "commit", c.commit, "total_size", (json_int_t)c.total_size,
                                 "existed", existed));
        } else {
            printf("%s@%llu\n", a.run, (unsigned long long)step);
        }
        ckpt_info("%s run %s step %llu (%s)", existed ? "already stored:" : "stored", a.run,
                  (unsigned long long)step,
                  ckpt_format_size((uint64_t)c.total_size, size, sizeof size));
        store_ckpt_free(&c);
    }
    store_close(&s);
    return rc ? cli_fail() : CLI_OK;
}

static int state_ls(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf("usage: ckpt state ls [RUN] [--json] [--home DIR | --server URL]\n\n"
               "Lists the stored steps of every run (or of RUN): run, step, size, when stored.\n"
               "With --server, a daemon's (GET /v1/runs).\n\n"
               "examples:\n"
               "  ckpt state ls\n"
               "  ckpt state ls llama-sft --json\n");
        return CLI_OK;
    }
    static const int allowed[] = {CLI_OPT_HOME, CLI_OPT_JSON, CLI_OPT_SERVER, CLI_OPT_END};
    state_args a;
    int u = parse("ls", argc, argv, allowed, &a);
    if (u) return u;
    if (a.npos > 1) return cli_usage_error("state ls", "expected at most one RUN");
    const char *run = a.npos ? a.pos[0] : NULL;
    json_t *list = NULL;
    if (cli_server(a.common.server, a.common.home)) { /* GET /v1/runs[?run=] */
        job_client jc;
        json_t *got = NULL;
        char *esc = run ? job_client_escape(run) : NULL, *path = ckpt_sprintf("/v1/runs%s%s", esc ? "?run=" : "", esc ? esc : "");
        if (path && job_client_open(&jc, a.common.home, a.common.server) == 0) {
            if (job_client_call(&jc, "GET", path, NULL, &got, NULL) == 0) list = json_incref(json_object_get(got, "steps"));
            job_client_close(&jc);
        }
        json_decref(got);
        free(esc);
        free(path);
    } else {
        ckpt_store s;
        if (store_open(&s, a.common.home) < 0) return cli_fail();
        if (store_run_steps_json(&s, run, &list) < 0) list = NULL;
        store_close(&s);
    }
    if (!json_is_array(list)) return json_decref(list), cli_fail();
    if (a.common.json) return cli_print_json(list);
    size_t i;
    json_t *st;
    json_array_foreach(list, i, st)
    {
        char size[32], when[32];
        time_t t = (time_t)json_integer_value(json_object_get(st, "created_at"));
        strftime(when, sizeof when, "%Y-%m-%d %H:%M", gmtime(&t));
        printf("%-30s %10lld %12s  %s\n", json_string_value(json_object_get(st, "run")),
               (long long)json_integer_value(json_object_get(st, "step")),
               ckpt_format_size((uint64_t)json_integer_value(json_object_get(st, "total_size")), size, sizeof size), when);
    }
    json_decref(list);
    return CLI_OK;
}

static int state_export(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf(
            "usage: ckpt state export RUN[@STEP] -o DIR [--layout L [--tp N] --rank R] "
            "[--no-optimizer]\n"
            "                        [--dtype D] [--force] [--home DIR]\n\n"
            "Writes a stored step (default: the run's newest) as a state folder. Without other\n"
            "options the files are rebuilt byte for byte and checked against their sha256;\n"
            "with --layout/--rank the folder holds that tensor-parallel rank's slice (optimizer\n"
            "slots sliced like their parameters), with --no-optimizer only the parameters.\n\n"
            "examples:\n  ckpt state export llama-sft@1200 -o ./resume\n"
            "  ckpt state export llama-sft@1200 -o ./rank3 --layout neuron --tp 8 --rank 3\n");
        return CLI_OK;
    }
    static const int allowed[] = {CLI_OPT_OUTPUT, CLI_OPT_LAYOUT, CLI_OPT_TP,    CLI_OPT_RANK,
                                  O_NO_OPT,       CLI_OPT_DTYPE,  CLI_OPT_FORCE, CLI_OPT_HOME,
                                  CLI_OPT_QUIET,  CLI_OPT_SERVER, CLI_OPT_END};
    state_args a;
    int u = parse("export", argc, argv, allowed, &a);
    if (!u && !a.layout && !a.no_opt && !a.dtype && cli_server(a.common.server, a.common.home)) {
        /* a whole step is a stored checkpoint: pull it from the daemon's Hub API */
        char ref[512];
        const char *at = strchr(a.npos == 1 ? a.pos[0] : "", '@');
        if (a.npos != 1 || !at || !a.common.out) return cli_usage_error("state export", "with --server: RUN@STEP -o DIR");
        snprintf(ref, sizeof ref, "%s%.*s@step-%s", STORE_RUNS_REPO_PREFIX, (int)(at - a.pos[0]), a.pos[0], at + 1);
        char *pv[8] = {"pull", ref, "-o", (char *)a.common.out};
        int pc = 4;
        if (a.common.force) pv[pc++] = "--force";
        if (a.common.server) {
            pv[pc++] = "--server";
            pv[pc++] = (char *)a.common.server;
        }
        return cmd_pull(pc, pv);
    }
    if (!u)
        u = cli_local_only("state export", a.common.server, a.common.home,
                           "--layout, --no-optimizer and --dtype need the step here; export it whole with --server first");
    if (u) return u;
    if (a.npos != 1) return cli_usage_error("state export", "expected one RUN@STEP");
    if (!a.common.out) return cli_usage_error("state export", "-o DIR is required");
    if (a.layout && !a.has_rank) return cli_usage_error("state export", "--layout needs --rank R");
    if (check_dst(a.common.out, a.common.force)) return CLI_FAIL;
    ckpt_store s;
    if (store_open(&s, a.common.home) < 0) return cli_fail();
    store_ckpt c;
    uint64_t step = 0;
    int rc = store_run_resolve(&s, a.pos[0], &c, &step);
    if (rc) {
        store_close(&s);
        return cli_fail();
    }
    bool whole = !a.layout && !a.no_opt && !a.dtype;
    materialize_opts mo = {.rank = -1, .force = true, .quiet = a.common.quiet};
    char *stage = NULL;
    if (whole) {
        mo.force = a.common.force;
        rc = store_materialize(&s, &c, a.common.out, &mo);
    } else {
        /* Rebuilt (and checked) in staging, then loaded as asked and saved. */
        char *base = store_tmp_base(&s, "state-export");
        rc = base ? ckpt_tmpdir_create(base, &stage) : CKPT_ENOMEM;
        free(base);
        if (!rc) rc = store_materialize(&s, &c, stage, &mo);
        ckpt_state_load_options lo;
        load_options(&lo, &a);
        ckpt_state *st = NULL;
        if (!rc) rc = ckpt_state_load(stage, &lo, &st);
        ckpt_state_save_options so = CKPT_STATE_SAVE_OPTIONS_INIT;
        so.keep_timestamp = true;
        so.save_optimizer = !a.no_opt;
        if (!rc) rc = ckpt_state_save(a.common.out, st, &so);
        ckpt_state_free(st);
    }
    if (stage) {
        ckpt_rm_rf(stage);
        free(stage);
    }
    if (!rc)
        ckpt_info("exported %s step %llu -> %s%s", c.repo + strlen(STORE_RUNS_REPO_PREFIX),
                  (unsigned long long)step, a.common.out, a.layout ? " (one rank)" : "");
    store_ckpt_free(&c);
    store_close(&s);
    return rc ? cli_fail() : CLI_OK;
}

static int state_keep(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf(
            "usage: ckpt state keep RUN --last N [--every K] [--dry-run] [--home DIR] [--json]\n\n"
            "Retention for a run: keeps its newest N stored steps and every step that is a\n"
            "multiple of K, forgets the others, then runs gc so the bytes only they used are\n"
            "freed (tensors shared with a kept step stay). --dry-run only says what it would "
            "do.\n\n"
            "example:\n  ckpt state keep llama-sft --last 3 --every 1000\n");
        return CLI_OK;
    }
    static const int allowed[] = {O_LAST,       O_EVERY,      CLI_OPT_DRY_RUN,
                                  CLI_OPT_HOME, CLI_OPT_JSON, CLI_OPT_SERVER, CLI_OPT_END};
    state_args a;
    int u = parse("keep", argc, argv, allowed, &a);
    if (!u) u = cli_local_only("state keep", a.common.server, a.common.home, NULL);
    if (u) return u;
    if (a.npos != 1) return cli_usage_error("state keep", "expected one RUN");
    if (!a.has_last) return cli_usage_error("state keep", "--last N is required");
    ckpt_store s;
    if (store_open(&s, a.common.home) < 0) return cli_fail();
    store_run_step *steps;
    size_t n;
    int rc = store_run_steps(&s, a.pos[0], &steps, &n);
    if (!rc && !n)
        rc = ckpt_error_set(CKPT_ENOTFOUND, "run '%s' has no stored steps (see ckpt state ls)",
                            a.pos[0]);
    uint64_t *drop = rc ? NULL : ckpt_calloc(n + 1, sizeof *drop);
    if (!rc && !drop) rc = CKPT_ENOMEM;
    size_t ndrop = 0;
    json_t *kept = json_array(), *dropped = json_array();
    for (size_t i = 0; !rc && i < n; i++) {
        bool keep = n - i <= a.last || (a.every && steps[i].step % a.every == 0);
        if (keep)
            json_array_append_new(kept, json_integer((json_int_t)steps[i].step));
        else {
            json_array_append_new(dropped, json_integer((json_int_t)steps[i].step));
            drop[ndrop++] = steps[i].step;
        }
    }
    uint64_t removed = 0;
    store_gc_result gc = {0};
    if (!rc && !a.common.dry_run && ndrop)
        rc = store_run_forget(&s, a.pos[0], drop, ndrop, &removed);
    if (!rc && !a.common.dry_run) rc = store_gc(&s, false, &gc);
    store_close(&s);
    if (!rc) {
        if (a.common.json) {
            cli_print_json(json_pack("{s:s,s:b,s:O,s:O,s:I,s:I,s:I}", "run", a.pos[0], "dry_run",
                                 a.common.dry_run, "kept", kept, "removed", dropped,
                                 "checkpoints_removed", (json_int_t)removed, "blobs_removed",
                                 (json_int_t)gc.blobs_removed, "bytes_freed",
                                 (json_int_t)gc.bytes_freed));
        } else {
            char *k = cj_dumps(kept, JSON_COMPACT), *d = cj_dumps(dropped, JSON_COMPACT), b[32];
            printf("%s: %s steps %s, %s steps %s", a.pos[0],
                   a.common.dry_run ? "would keep" : "kept", k ? k : "",
                   a.common.dry_run ? "would remove" : "removed", d ? d : "");
            if (!a.common.dry_run)
                printf("; gc freed %s in %llu blobs", ckpt_format_size(gc.bytes_freed, b, sizeof b),
                       (unsigned long long)gc.blobs_removed);
            printf("\n");
            free(k);
            free(d);
        }
    }
    json_decref(kept);
    json_decref(dropped);
    free(drop);
    store_run_steps_free(steps, n);
    return rc ? cli_fail() : CLI_OK;
}

/* ---- dispatch ---- */

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} subcommands[] = {
    {"save", state_save,
     "write a state: re-save one (cast, reshard, step) or make one from a checkpoint"},
    {"load", state_load,
     "load and check a state, or one tensor-parallel rank of it; print or save it"},
    {"import", state_import, "store a state as step N of a run"},
    {"ls", state_ls, "list the stored steps of runs"},
    {"export", state_export, "write a stored step out (whole, one rank, or without optimizer)"},
    {"keep", state_keep, "retention: keep the newest N steps and every K-th, gc the rest"},
};

static void state_usage(FILE *out)
{
    fprintf(out, "usage: ckpt state <subcommand> [options]\n\n"
                 "Training states: a step, the parameters, the optimizer's slots (<param>/<slot>)\n"
                 "and its scalars, in a folder other tools can read (metadata.json, model and\n"
                 "optimizer safetensors, optimizer.json, config.json).\n\n");
    for (size_t i = 0; i < CKPT_ARRAY_LEN(subcommands); i++)
        fprintf(out, "  %-8s %s\n", subcommands[i].name, subcommands[i].summary);
    fprintf(out, "\n'ckpt state <subcommand> --help' explains one.\n\n"
                 "examples:\n"
                 "  ckpt state save ./Qwen2-0.5B ./state --optimizer adamw --set lr=3e-4 --step 0\n"
                 "  ckpt state import ./state --run qwen-sft --step 0 && ckpt state ls qwen-sft\n");
}

int cmd_state(int argc, char **argv)
{
    if (argc < 2) {
        state_usage(stderr);
        return CLI_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        state_usage(stdout);
        return CLI_OK;
    }
    for (size_t i = 0; i < CKPT_ARRAY_LEN(subcommands); i++)
        if (!strcmp(argv[1], subcommands[i].name)) return subcommands[i].fn(argc - 1, argv + 1);
    return cli_usage_error(
        "state", "'%s' is not a state subcommand (save, load, import, ls, export, keep)", argv[1]);
}

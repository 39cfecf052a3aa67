/*
 * jobs_run.h — what each job kind does, and how a job's arguments are made
 * from command-line words (shared by `ckpt submit`, the HTTP API and the
 * worker, so the three agree).
 *
 *   import      {"dir": ABS, "repo": "ORG/NAME[@REV]"}
 *   convert     {"ref": REF, "layout": L, "tp": N, "dtype": D, "kv_size_multiplier": M, "max_shard_size": BYTES}
 *   merge-lora, unmerge-lora
 *               {"ref": REF, "adapter": ABS_DIR or REF, "scale"?: S}   (store/store_lora.h)
 *   consolidate {"src": ABS, "dst": ABS}
 *   verify      {"ref": REF}            (ref optional: the whole store)
 *   gc          {}
 *   fetch       {"repo": "ORG/NAME", "revision": REV, "commit"?: SHA, "include"?: [GLOB], "exclude"?: [GLOB],
 *                "connections"?: N, "chunk_size"?: BYTES}   (hub/hub.h; the token comes from the environment)
 *   sync        {"schedule": ID}         (service/jobs/schedule.h)
 *   noop        {"sleep_ms": N}          (benchmarks and tests of the queue itself)
 */
#ifndef CKPT_SERVICE_JOBS_JOBS_RUN_H
#define CKPT_SERVICE_JOBS_JOBS_RUN_H

#include "service/jobs/queue.h"
#include "store/store.h"

#include <jansson.h>
#include <stdbool.h>

/* A job kind: one row of jobs_kinds (jobs_run.c). */
typedef struct {
    const char *name;
    const char *usage;                                   /* the words it takes, for messages */
    int (*words)(json_t *args, const char **pos, int npos); /* positional words into args; CKPT_EINVAL: wrong words */
    bool (*shape)(const json_t *args);                   /* its fields are there, of the right types */
    int (*values)(const char *kind, const json_t *args); /* what can be checked without the store; NULL: nothing */
    struct {
        const char *key; /* a host path argument, checked against --allow-path (jobs_paths_check) */
        bool may_be_new; /* it is an output: it may not exist yet */
    } paths[2];
    int (*run)(ckpt_store *s, const json_t *args, json_t **result);
    int limit;      /* jobs of this kind running at once; 0: as many as workers */
    double timeout; /* seconds, unless the daemon's --timeout says otherwise */
} job_kind;

#define JOBS_NOOP "noop"
extern const job_kind jobs_kinds[];
extern const size_t jobs_nkinds;
/* The kind named name, or NULL. */
const job_kind *jobs_kind_find(const char *name);

/* Builds a job's arguments from words after the kind (argv[0] is the kind).
 * Unknown options are usage errors: CKPT_EINVAL with a message. */
int jobs_args_from_argv(const char *kind, int argc, char **argv, json_t **args);
/* `ckpt submit ORG/NAME[@REV] --layout L [--tp N] ...` (argv[0] is the ref):
 * the arguments of a fetch job and of the convert job that runs after it.
 * --include, --exclude, --connections and --chunk-size go to the fetch, the
 * rest to the convert (whose ref is ORG/NAME@REV, REV default main). */
int jobs_args_hub_pair(int argc, char **argv, json_t **fetch, json_t **convert);
/* Checks a job's arguments (from the HTTP API): right fields, right types. */
int jobs_args_check(const char *kind, const json_t *args);
/* Where a job came from: the HTTP API sets args["origin"] = "http" (and
 * refuses clients that set it); jobs queued with `ckpt submit` on the local
 * database have none and are the operator's own. */
#define JOBS_ORIGIN_KEY "origin"
bool jobs_from_remote(const json_t *args);

/* What a worker (`ckpt run-job`) tells its daemon on standard output, one
 * line each; any other line is the job's log:
 *   @ckpt result JSON                       the job's result, once at the end
 *   @ckpt error transient|permanent MESSAGE  its failure, once at the end
 *   @ckpt progress ...                      see below */
#define JOBS_RESULT_PREFIX "@ckpt result "
#define JOBS_ERROR_PREFIX "@ckpt error "
/* A worker's progress:
 *   @ckpt progress BYTES TOTAL TENSORS TENSORS_TOTAL RATE ETA PHASE
 * RATE in bytes a second, ETA in seconds (-1 unknown) with six significant
 * digits: a fast job's last hundredths of a second are not rounded to 0,
 * which reads as "done". */
#define JOBS_PROGRESS_PREFIX "@ckpt progress "
/* The line for p (phase NULL: none), prefix included, no newline, into buf
 * (n bytes, cut to fit). */
void jobs_progress_format(char *buf, size_t n, const queue_progress_info *p);
/* Reads what follows JOBS_PROGRESS_PREFIX into p (p->phase points into s:
 * the rest of the line, possibly empty). false when it is not such a line:
 * fields missing, a count negative, the rate or the ETA not finite, the
 * rate negative or the ETA below -1. */
bool jobs_progress_parse(const char *s, queue_progress_info *p);
/* The host paths of a job (import dir, consolidate src and dst, a merge-lora
 * adapter folder) must each resolve (symlinks followed, realpath) beneath one
 * of roots (canonical folders, NULL-terminated; NULL or empty: none allowed).
 * Each path in args is replaced by its canonical form. CKPT_EINVAL otherwise. */
int jobs_paths_check(const char *kind, json_t *args, char *const *roots);
/* Canonicalises --allow-path folders (each must exist): a NULL-terminated array. */
int jobs_allow_roots(char **paths, size_t n, char ***roots);
void jobs_allow_roots_free(char **roots);
/* Runs a job in this process. *transient tells a retry may succeed. *result
 * may receive a JSON summary (caller frees). */
int jobs_run(ckpt_store *s, const char *kind, const json_t *args, bool *transient, json_t **result);

#endif

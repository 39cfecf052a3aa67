/*
 * store_runs.h — training states in the store, as the steps of named runs.
 *
 * A run is no second store: each saved step is an ordinary stored checkpoint
 * of repo "runs/<RUN>", named by the ref "step-<N>" (so `ckpt show
 * runs/RUN@step-N` and `ckpt pull` work on it too). Its tensors are blobs
 * like every other checkpoint's, so the steps of a run share the bytes of
 * tensors that did not change (frozen embeddings, an optimizer slot nobody
 * touched) and a step costs only what changed.
 *
 * Retention drops the refs of the steps not kept and, in the same
 * transaction, the checkpoints of the run that no ref names any more; gc then
 * frees the blobs nothing references.
 */
#ifndef CKPT_STORE_STORE_RUNS_H
#define CKPT_STORE_STORE_RUNS_H

#include "store/store.h"

#define STORE_RUNS_REPO_PREFIX "runs/"
#define STORE_RUNS_STEP_PREFIX "step-"

typedef struct {
    char *run; /* RUN, without the "runs/" prefix */
    uint64_t step;
    int64_t checkpoint_id;
    int64_t total_size, created_at;
} store_run_step;

/* "runs/<run>" after checking run is a name (letters, digits, - _ .); malloc'd in *repo. */
int store_run_repo(const char *run, char **repo);
/* Imports the state directory dir as step `step` of run; *existed when the
 * same bytes were stored already. */
int store_run_import(ckpt_store *s, const char *dir, const char *run, uint64_t step, bool quiet,
                     store_ckpt *out, bool *existed);
/* The steps of run (NULL: of every run), by run then step. */
int store_run_steps(ckpt_store *s, const char *run, store_run_step **out, size_t *n);
void store_run_steps_free(store_run_step *v, size_t n);
/* The steps of run (NULL: every run) as `ckpt state ls --json` and GET
 * /v1/runs print them: [{"run", "step", "total_size", "created_at"}]. */
int store_run_steps_json(ckpt_store *s, const char *run, json_t **out);
/* Resolves "RUN@STEP" (or "RUN": its newest step) to a stored checkpoint. */
int store_run_resolve(ckpt_store *s, const char *ref, store_ckpt *out, uint64_t *step);
/* Forgets steps[0..n) of run: their refs, and the run's checkpoints no ref names any more. */
int store_run_forget(ckpt_store *s, const char *run, const uint64_t *steps, size_t n,
                     uint64_t *checkpoints_removed);

#endif

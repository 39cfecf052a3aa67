/*
 * store_verify.h — the one check of stored checkpoints, behind `ckpt verify`
 * and the `verify` job kind alike.
 *
 * First every blob in scope is re-hashed (store_verify_blobs): each missing
 * or damaged one is reported with the checkpoints and files it breaks. When
 * no blob is damaged, every file of every checkpoint in scope is then rebuilt
 * (materialize.h, into a temp folder under CKPT_HOME/tmp, removed after) and
 * its sha256 compared with the catalog's: each checkpoint that does not
 * rebuild is reported. Damage is counted in the result, not an error; an
 * error means the check could not run (a ref that names nothing, a catalog
 * that cannot be read, no room for the temp folder).
 *
 * The report as JSON (store_verify_json; the job's result, `ckpt verify --json`):
 *   {"clean": true, "damaged_blobs": 0, "checkpoints_checked": 3, "broken_checkpoints": 0}
 */
#ifndef CKPT_STORE_STORE_VERIFY_H
#define CKPT_STORE_STORE_VERIFY_H

#include "store/store.h"

#include <jansson.h>
#include <stdbool.h>

typedef struct {
    uint64_t damaged_blobs;       /* missing, unreadable or not hashing to their name */
    uint64_t checkpoints_checked; /* rebuilt (0 when damaged blobs stopped the check first) */
    uint64_t broken_checkpoints;  /* with a file that does not rebuild to its sha256 */
} store_verify_result;

/* ref NULL: the whole store. report (may be NULL) gets one line per problem. */
int store_verify(ckpt_store *s, const char *ref, store_verify_report report, void *ctx, store_verify_result *res);
/* True when nothing was found damaged. */
bool store_verify_clean(const store_verify_result *r);
json_t *store_verify_json(const store_verify_result *r);

/* Each store_verify that ran records its report (verify_runs, the last 100)
 * and, per checkpoint it rebuilt, when and whether it rebuilt
 * (verify_checkpoints). The last run, for the dashboard ({"at", "ref"?,
 * "clean", "damaged_blobs", "checkpoints_checked", "broken_checkpoints"}; *out
 * stays NULL when there was none); a checkpoint's own is its JSON's
 * "last_verify" (store_info.h). */
int store_verify_last_run(ckpt_store *s, json_t **out);

#endif

/* store_verify.c — re-hash blobs, rebuild files (see store_verify.h). */
#include "store/store_verify.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"
#include "store/materialize.h"
#include "store/store_info.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet_report(void *ctx, const char *line)
{
    (void)ctx;
    (void)line;
}

/* Rebuilds every file of c into a temp folder; 1 when it does not rebuild
 * (reported), 0 when it does, < 0 when the check itself could not run. */
static int rebuild_one(ckpt_store *s, const store_ckpt *c, store_verify_report report, void *ctx)
{
    char *base = store_tmp_base(s, "verify"), *tmp = NULL;
    int rc = base ? ckpt_tmpdir_create(base, &tmp) : CKPT_ENOMEM;
    free(base);
    if (rc) return ckpt_error_prefix(rc, "verify: temp folder");
    materialize_opts mo = {.rank = -1, .force = true, .quiet = true};
    int m = store_materialize(s, c, tmp, &mo);
    ckpt_rm_rf(tmp);
    free(tmp);
    if (m == 0) return 0;
    if (m == CKPT_ENOMEM || m == CKPT_ECANCELLED) return m;
    char *ref = store_ckpt_ref(c);
    char *line = ckpt_sprintf("%s: %s", ref ? ref : "?", ckpt_error_last());
    report(ctx, line ? line : ckpt_error_last());
    free(line);
    free(ref);
    return 1;
}

int store_verify(ckpt_store *s, const char *ref, store_verify_report report, void *ctx, store_verify_result *res)
{
    memset(res, 0, sizeof *res);
    if (!report) report = quiet_report;
    store_ckpt *v = NULL;
    size_t n = 0;
    int rc;
    if (ref) {
        v = ckpt_calloc(1, sizeof *v);
        rc = v ? store_resolve(s, ref, &v[0]) : CKPT_ENOMEM;
        if (!rc) n = 1;
    } else {
        rc = store_list(s, NULL, &v, &n);
    }
    if (rc) {
        free(v);
        return rc;
    }
    rc = store_verify_blobs(s, ref ? v[0].id : 0, report, ctx, &res->damaged_blobs);
    /* Damaged blobs are named already; rebuilding would only repeat them. */
    for (size_t i = 0; !rc && !res->damaged_blobs && i < n; i++) {
        int r = rebuild_one(s, &v[i], report, ctx);
        if (r < 0) rc = r;
        else res->broken_checkpoints += (uint64_t)r;
        res->checkpoints_checked++;
    }
    store_list_free(v, n);
    return rc;
}

bool store_verify_clean(const store_verify_result *r)
{
    return !r->damaged_blobs && !r->broken_checkpoints;
}

json_t *store_verify_json(const store_verify_result *r)
{
    return json_pack("{s:b,s:I,s:I,s:I}", "clean", store_verify_clean(r), "damaged_blobs", (json_int_t)r->damaged_blobs,
                     "checkpoints_checked", (json_int_t)r->checkpoints_checked, "broken_checkpoints",
                     (json_int_t)r->broken_checkpoints);
}

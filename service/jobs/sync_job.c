/*
 * sync_job.c — the `sync` job: look at a schedule's repo on the Hub and queue
 * a fetch and the converts when its revision moved (see schedule.h).
 */
#include "service/jobs/schedule.h"

#include "common/error.h"
#include "common/log.h"
#include "common/util.h"
#include "service/jobs/queue.h"
#include "hub/hub.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SYNC_OUTCOME_MAX 2048

/* Appends to the outcome sentence. */
static void say(char *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(char *out, const char *fmt, ...)
{
    size_t len = strlen(out);
    if (len + 1 >= SYNC_OUTCOME_MAX) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + len, SYNC_OUTCOME_MAX - len, fmt, ap);
    va_end(ap);
}

static int queue_fetch(ckpt_store *s, const schedule *sc, const char *commit, int64_t *id)
{
    json_t *a =
        json_pack("{s:s,s:s,s:s}", "repo", sc->repo, "revision", sc->revision, "commit", commit);
    if (!a) return CKPT_ENOMEM;
    const char *key;
    json_t *v;
    json_object_foreach(sc->fetch_args, key,
                        v) if (!strcmp(key, "include") || !strcmp(key, "exclude"))
        json_object_set(a, key, v);
    bool existed;
    int rc = queue_submit(&s->cat, "fetch", a, NULL, id, &existed);
    json_decref(a);
    return rc;
}

static int queue_converts(ckpt_store *s, const schedule *sc, const char *commit, int64_t after,
                          json_t *queued, char *out)
{
    char *ref = ckpt_sprintf("%s@%s", sc->repo, commit);
    if (!ref) return CKPT_ENOMEM;
    int rc = 0;
    size_t i;
    json_t *l;
    json_array_foreach(sc->layouts, i, l)
    {
        const char *layout = json_string_value(json_object_get(l, "layout"));
        json_int_t tp = json_integer_value(json_object_get(l, "tp"));
        if (!layout) continue;
        json_t *a = json_pack("{s:s,s:s}", "ref", ref, "layout", layout);
        if (a && tp > 0) json_object_set_new(a, "tp", json_integer(tp));
        queue_submit_opts qo = {.depends_on = after};
        int64_t id = 0;
        bool existed;
        rc = a ? queue_submit(&s->cat, "convert", a, &qo, &id, &existed) : CKPT_ENOMEM;
        json_decref(a);
        if (rc) break;
        json_array_append_new(queued, json_integer(id));
        if (tp > 1)
            say(out, ", convert %lld (%s tp%lld)", (long long)id, layout, (long long)tp);
        else
            say(out, ", convert %lld (%s)", (long long)id, layout);
    }
    free(ref);
    return rc;
}

int sync_run(ckpt_store *s, int64_t schedule_id, json_t **result)
{
    schedule sc;
    int rc = schedule_get(&s->cat, schedule_id, &sc);
    if (rc == CKPT_ENOTFOUND) { /* removed after the job was queued */
        *result = json_pack("{s:b}", "removed", 1);
        return 0;
    }
    if (rc) return rc;
    hub_client h;
    char commit[41] = "";
    rc = hub_client_init(&h);
    if (!rc) {
        rc = hub_resolve_revision(&h, sc.repo, sc.revision, commit);
        hub_client_free(&h);
    }
    if (rc) {
        char msg[SYNC_OUTCOME_MAX];
        snprintf(msg, sizeof msg, "failed: %s", ckpt_error_last());
        int keep = rc;
        schedule_record(&s->cat, sc.id, NULL, msg);
        schedule_free(&sc);
        return ckpt_error_set(keep, "%s", msg + 8);
    }
    int64_t stored = 0;
    rc = store_find(s, sc.repo, commit, "", &stored);
    bool changed = !sc.last_commit || strcmp(sc.last_commit, commit);
    char out[SYNC_OUTCOME_MAX] = "";
    json_t *queued = json_array();
    if (!queued) rc = CKPT_ENOMEM;
    if (!rc && !changed && stored) {
        say(out, "unchanged: commit %.12s", commit);
    } else if (!rc) {
        int64_t fetch = 0;
        say(out, "commit %.12s%s: queued", commit, changed ? "" : " (not stored yet)");
        if (stored) {
            rc = store_set_ref(s, sc.repo, sc.revision, stored);
            say(out, " no fetch (stored already)");
        } else if (!(rc = queue_fetch(s, &sc, commit, &fetch))) {
            json_array_append_new(queued, json_integer(fetch));
            say(out, " fetch %lld", (long long)fetch);
        }
        if (!rc) rc = queue_converts(s, &sc, commit, fetch, queued, out);
    }
    if (!rc) rc = schedule_record(&s->cat, sc.id, commit, out);
    if (!rc) {
        ckpt_info("schedule %lld, %s@%s: %s", (long long)sc.id, sc.repo, sc.revision, out);
        *result =
            json_pack("{s:I,s:s,s:b,s:O,s:s}", "schedule", (json_int_t)sc.id, "commit", commit,
                      "changed", changed || !stored, "queued", queued, "outcome", out);
    }
    json_decref(queued);
    schedule_free(&sc);
    return rc;
}

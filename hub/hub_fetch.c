/*
 * hub_fetch.c — one fetch from a Hub into the store (the steps are in hub.h):
 * resolve, list and pick, skip what is stored, download and verify into blob
 * writers, publish them and commit the checkpoint (or add the missing files
 * to the stored commit: a top-up).
 */
#include "hub/hub_internal.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

void hub_fetch_result_free(hub_fetch_result *r)
{
    store_ckpt_free(&r->ckpt);
    memset(r, 0, sizeof *r);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* With the default patterns, a repository without any safetensors file (an
 * older or fine-tuned one) gives its torch.save weights instead:
 * pytorch_model.bin or its shards (the index is a .json, taken anyway). They
 * are read by format/torch.h, never unpickled by Python. */
static bool torch_weights_instead(const hub_tree *t, const hub_filter *f, const hub_entry *e)
{
    if (f->ninclude || strncmp(e->path, "pytorch_model", 13) || !ends_with(e->path, ".bin")) return false;
    for (size_t i = 0; i < t->n; i++)
        if (ends_with(t->v[i].path, ".safetensors")) return false;
    hub_filter only_excludes = {.include = (const char *const[]){"*"}, .ninclude = 1, .exclude = f->exclude,
                                .nexclude = f->nexclude};
    return hub_filter_match(&only_excludes, e->path);
}

/* The files of the tree the filter takes, sorted by path (the tree is). */
static int pick(const hub_tree *t, const hub_filter *f, const char *repo, hub_entry **out,
                size_t *n, uint64_t *bytes)
{
    *out = ckpt_calloc(t->n + 1, sizeof **out);
    *n = 0;
    *bytes = 0;
    if (!*out) return CKPT_ENOMEM;
    size_t skipped = 0, torch = 0;
    for (size_t i = 0; i < t->n; i++) {
        const hub_entry *e = &t->v[i];
        bool instead = !hub_filter_match(f, e->path) && torch_weights_instead(t, f, e);
        torch += instead;
        if (!instead && !hub_filter_match(f, e->path))
            skipped++;
        else {
            (*out)[(*n)++] = *e; /* shares the path with the tree */
            *bytes += e->size;
        }
    }
    if (torch)
        ckpt_info("%s: no safetensors files; taking its %zu torch.save weight file%s (pytorch_model*.bin)", repo, torch,
                  torch == 1 ? "" : "s");
    if (skipped)
        ckpt_info(
            "%s: %zu of %zu files picked (the others left out by the include/exclude patterns)",
            repo, *n, t->n);
    if (*n == 0)
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: no file of the repository matches the include/exclude patterns",
                              repo);
    return 0;
}

/* Drops from files[0..*n) those checkpoint id has already (by path): what
 * is left is the top-up to download. */
static int drop_stored(ckpt_store *s, int64_t id, hub_entry *files, size_t *n)
{
    store_file_row *rows;
    size_t nrows, k = 0;
    int rc = store_files_load(s, id, &rows, &nrows);
    if (rc) return rc;
    for (size_t i = 0; i < *n; i++) {
        bool have = false;
        for (size_t j = 0; !have && j < nrows; j++)
            have = !strcmp(rows[j].path, files[i].path);
        if (!have) files[k++] = files[i];
    }
    *n = k;
    store_files_free(rows, nrows);
    return 0;
}

/* Points revision at a stored commit (the fetch that found it stored). */
static int found_stored(ckpt_store *s, const char *repo, const char *rev, int64_t id,
                        hub_fetch_result *out)
{
    int rc = store_set_ref(s, repo, rev, id);
    if (!rc) rc = store_get(s, id, &out->ckpt);
    out->existed = true;
    return rc;
}

int hub_fetch(ckpt_store *s, const hub_fetch_opts *o, hub_fetch_result *out)
{
    memset(out, 0, sizeof *out);
    double t0 = ckpt_now();
    const char *rev = o->revision && *o->revision ? o->revision : "main";
    int rc = store_repo_name_check(o->repo);
    if (rc) return rc;
    if (o->filter.ninclude > HUB_MAX_GLOBS || o->filter.nexclude > HUB_MAX_GLOBS)
        return ckpt_error_set(CKPT_ELIMIT, "more than %d --include or --exclude patterns",
                              HUB_MAX_GLOBS);
    hub_client h;
    if ((rc = hub_client_init(&h))) return rc;
    if (o->connections > 0) h.connections = o->connections;
    if (o->chunk_size > 0) h.chunk_size = o->chunk_size;
    char commit[41];
    if (o->commit) {
        snprintf(commit, sizeof commit, "%s", o->commit);
        bool ok = strlen(o->commit) == 40;
        for (const char *c = o->commit; ok && *c; c++)
            ok = (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f');
        if (!ok)
            rc = ckpt_error_set(CKPT_EINVAL, "commit '%.60s' is not 40 lowercase hex digits",
                                o->commit);
    } else {
        rc = hub_resolve_revision(&h, o->repo, rev, commit);
    }
    /* A stored commit may hold fewer files than this fetch picks (an earlier
     * fetch with narrower --include patterns): the tree says, and the missing
     * files are added to it (a top-up); when none is missing, nothing is
     * downloaded. */
    int64_t id = 0, stored = 0;
    if (!rc) rc = store_find(s, o->repo, commit, "", &stored);
    hub_tree tree = {0};
    hub_entry *files = NULL;
    size_t n = 0, picked = 0;
    uint64_t bytes = 0;
    store_ckpt_rec rec = {.repo = o->repo, .revision = rev, .commit = commit, .layout = ""};
    hub_blobs blobs = {0};
    if (!rc) rc = hub_list_tree(&h, o->repo, commit, &tree);
    if (!rc) rc = pick(&tree, &o->filter, o->repo, &files, &n, &bytes);
    picked = n;
    if (!rc && stored) rc = drop_stored(s, stored, files, &n);
    if (!rc && stored && n == 0) {
        if (!o->quiet)
            ckpt_info("%s@%s: commit %.12s is in the store already (all %zu files picked); nothing to "
                      "download",
                      o->repo, rev, commit, picked);
        rc = found_stored(s, o->repo, rev, stored, out);
        free(files);
        hub_tree_free(&tree);
        hub_client_free(&h);
        return rc ? ckpt_error_prefix(rc, "fetch %s@%s", o->repo, rev) : 0;
    }
    if (!rc && stored) {
        bytes = 0;
        for (size_t i = 0; i < n; i++)
            bytes += files[i].size;
        if (!o->quiet)
            ckpt_info("%s@%s: commit %.12s is in the store with %zu of the %zu files picked; fetching "
                      "the other %zu",
                      o->repo, rev, commit, picked - n, picked, n);
    }
    if (!rc && !o->quiet) {
        char size[32];
        ckpt_info("%s@%s: commit %s, %zu files, %s from %s", o->repo, rev, commit, n,
                  ckpt_format_size(bytes, size, sizeof size), h.endpoint);
    }
    double t_dl = ckpt_now();
    /* What an interrupted fetch of this commit kept is taken over, and what
     * this one downloads is kept until it is stored (store_partial.h). */
    store_partial part = {.lock_fd = -1};
    if (!rc) rc = store_partial_open(s, commit, &part);
    if (!rc && !part.dir && !o->quiet)
        ckpt_info("%s: another fetch of commit %.12s is running; this one keeps nothing for a resume", o->repo,
                  commit);
    if (!rc)
        rc = hub_download(&h, s, o->repo, commit, files, n, o->quiet, &part, &rec, &blobs, &out->bytes);
    if (!rc && !o->quiet) {
        char size[32];
        double dt = ckpt_now() - t_dl;
        ckpt_info("downloaded and verified %s in %.1f s (%.0f MiB/s); storing",
                  ckpt_format_size(out->bytes, size, sizeof size), dt,
                  dt > 0 ? (double)out->bytes / dt / 1048576.0 : 0);
    }
    /* Someone may have stored the commit meanwhile; else publish the verified blobs and commit. */
    if (!rc && stored) {
        /* A top-up: the new files join the stored commit. */
        rc = store_blobs_publish(s, blobs.w, blobs.n);
        free(blobs.w);
        blobs.w = NULL;
        blobs.n = 0;
        if (!rc) rc = store_add_files(s, stored, &rec);
        if (rc) store_leases_release_after_error(s);
        if (!rc) rc = store_get(s, stored, &out->ckpt);
        out->files = n;
    } else if (!rc) {
        rc = store_find(s, o->repo, commit, "", &id);
        if (!rc && id) {
            hub_blobs_abort(&blobs);
            rc = found_stored(s, o->repo, rev, id, out);
        } else if (!rc) {
            rc = store_blobs_publish(s, blobs.w, blobs.n);
            free(blobs.w); /* the writers are closed and freed by publishing */
            blobs.w = NULL;
            blobs.n = 0;
            if (!rc) rc = store_commit_checkpoint(s, &rec, &id, &out->existed);
            if (rc) store_leases_release(s);
            if (!rc) rc = store_get(s, id, &out->ckpt);
            out->files = n;
        }
    }
    hub_blobs_abort(&blobs);
    /* Stored (or stored by another fetch): what was kept for these files is done with. */
    for (size_t i = 0; !rc && part.dir && i < n; i++)
        rc = store_partial_file_remove(&part, files[i].path);
    store_partial_close(&part, true); /* the commit's folder goes when no file kept anything */
    store_ckpt_rec_free(&rec);
    free(files);
    hub_tree_free(&tree);
    hub_client_free(&h);
    out->seconds = ckpt_now() - t0;
    if (rc) {
        store_ckpt_free(&out->ckpt);
        return ckpt_error_prefix(rc, "fetch %s@%s", o->repo, rev);
    }
    return 0;
}

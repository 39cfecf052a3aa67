/* store_info.c — listing and describing stored checkpoints (see store_info.h). */
#include "store/store_info.h"

#include "common/error.h"
#include "common/fault.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

void store_list_free(store_ckpt *v, size_t n)
{
    for (size_t i = 0; i < n; i++) store_ckpt_free(&v[i]);
    free(v);
}

/* The checkpoints whose ids sql (one text parameter, may be NULL) returns, in
 * its order; one removed between the query and its read is left out. */
static int load_ids(ckpt_store *s, const char *what, const char *sql, const char *arg, store_ckpt **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (ckpt_fault_error("store.lookup"))
        return ckpt_error_set(CKPT_EIO, "%s: the catalog could not be read (fault point store.lookup)", what);
    ckpt_stmt *st;
    int rc = catalog_prepare(&s->cat, &st, sql);
    if (rc) return ckpt_error_prefix(rc, "%s", what);
    if (arg) db_bind_text(st, 1, arg);
    int64_t *ids = NULL;
    size_t nids = 0, cap = 0;
    int step;
    while ((step = db_step(st)) == DB_ROW) {
        if ((rc = ckpt_grow(&ids, &cap, nids + 1, sizeof *ids))) break;
        ids[nids++] = db_col_int64(st, 0);
    }
    if (!rc && step != DB_DONE) rc = catalog_error(&s->cat, what);
    db_finalize(st);
    store_ckpt *v = !rc && nids ? ckpt_calloc(nids, sizeof *v) : NULL;
    if (!rc && nids && !v) rc = CKPT_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; !rc && i < nids; i++) {
        int g = store_get(s, ids[i], &v[k]);
        if (g == 0) k++;
        else if (g != CKPT_ENOTFOUND) rc = ckpt_error_prefix(g, "%s", what);
    }
    free(ids);
    if (rc) {
        store_list_free(v, k);
        return rc;
    }
    ckpt_error_clear();
    *out = v;
    *n = k;
    return 0;
}

int store_list(ckpt_store *s, const char *repo, store_ckpt **out, size_t *n)
{
    return load_ids(s, "list checkpoints",
                    "SELECT id FROM checkpoints WHERE CAST(?1 AS TEXT) IS NULL OR repo = ?1 ORDER BY repo, commit_sha, layout", repo,
                    out, n);
}

int store_repo_layouts(ckpt_store *s, const char *repo, store_ckpt **out, size_t *n)
{
    return load_ids(s, "list layouts", "SELECT id FROM checkpoints WHERE repo = ?1 AND layout != '' ORDER BY id DESC",
                    repo, out, n);
}

int store_repo_refs(ckpt_store *s, const char *repo, store_ckpt **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    const char *what = "list the names of the repository";
    if (ckpt_fault_error("store.lookup"))
        return ckpt_error_set(CKPT_EIO, "%s: the catalog could not be read (fault point store.lookup)", what);
    ckpt_stmt *st;
    int rc = catalog_prepare(&s->cat, &st, "SELECT name, checkpoint_id FROM refs WHERE repo = ?1 ORDER BY name");
    if (rc) return ckpt_error_prefix(rc, "%s", what);
    db_bind_text(st, 1, repo);
    store_ckpt *v = NULL;
    size_t k = 0, cap = 0;
    int step = DB_DONE;
    while (!rc && (step = db_step(st)) == DB_ROW) {
        const char *name = db_col_text(st, 0);
        if (!name) continue;
        char *copy = ckpt_strdup(name);
        if (!copy || (rc = ckpt_grow(&v, &cap, k + 1, sizeof *v))) {
            free(copy);
            rc = CKPT_ENOMEM;
            break;
        }
        int g = store_get(s, db_col_int64(st, 1), &v[k]);
        if (g == 0) {
            free(v[k].revision);
            v[k++].revision = copy;
        } else {
            free(copy);
            if (g != CKPT_ENOTFOUND) rc = ckpt_error_prefix(g, "%s", what);
        }
    }
    if (!rc && step != DB_DONE) rc = catalog_error(&s->cat, what);
    db_finalize(st);
    if (rc) {
        store_list_free(v, k);
        return rc;
    }
    ckpt_error_clear();
    *out = v;
    *n = k;
    return 0;
}

int store_repo_exists(ckpt_store *s, const char *repo, bool *exists)
{
    *exists = false;
    if (ckpt_fault_error("store.lookup"))
        return ckpt_error_set(CKPT_EIO, "look up repo %s: the catalog could not be read (fault point store.lookup)",
                              repo);
    ckpt_stmt *st;
    int rc = catalog_prepare(&s->cat, &st, "SELECT 1 FROM checkpoints WHERE repo = ? LIMIT 1");
    if (rc) return ckpt_error_prefix(rc, "look up repo %s", repo);
    db_bind_text(st, 1, repo);
    int step = db_step(st);
    if (step == DB_ROW) *exists = true;
    else if (step != DB_DONE) rc = catalog_error(&s->cat, "look up repo");
    db_finalize(st);
    return rc;
}

void store_file_infos_free(store_file_info *v, size_t n)
{
    for (size_t i = 0; i < n; i++) free(v[i].path);
    free(v);
}

int store_file_infos(ckpt_store *s, int64_t id, store_file_info **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (ckpt_fault_error("store.lookup"))
        return ckpt_error_set(CKPT_EIO, "read the files of checkpoint %lld: the catalog could not be read (fault "
                              "point store.lookup)", (long long)id);
    ckpt_stmt *st;
    int rc = catalog_prepare(
        &s->cat, &st,
        "SELECT f.path, f.size, f.sha256, f.blob IS NULL, (SELECT count(*) FROM tensors t WHERE "
        "t.checkpoint_id = f.checkpoint_id AND t.path = f.path), (SELECT count(*) FROM tensors t "
        "WHERE t.checkpoint_id = f.checkpoint_id AND t.path = f.path AND t.recipe IS NOT NULL) "
        "FROM files f WHERE f.checkpoint_id = ? ORDER BY f.path");
    if (rc) return rc;
    db_bind_int64(st, 1, id);
    store_file_info *v = NULL;
    size_t k = 0, cap = 0;
    int step;
    while ((step = db_step(st)) == DB_ROW) {
        const char *path = db_col_text(st, 0), *sha = db_col_text(st, 2);
        bool pending = sha && !*sha && db_col_int64(st, 3) != 0; /* store_hash_pending */
        if (!path || !sha || (strlen(sha) != 64 && !pending)) {
            rc = ckpt_error_set(CKPT_ECORRUPT, "catalog: checkpoint %lld has a damaged file row", (long long)id);
            break;
        }
        if ((rc = ckpt_grow(&v, &cap, k + 1, sizeof *v))) break;
        store_file_info *f = &v[k++];
        memset(f, 0, sizeof *f);
        if (!(f->path = ckpt_strdup(path))) {
            rc = CKPT_ENOMEM;
            break;
        }
        f->size = (uint64_t)db_col_int64(st, 1);
        memcpy(f->sha256, sha, 65);
        f->safetensors = (int)db_col_int64(st, 3) != 0;
        f->tensors = (uint64_t)db_col_int64(st, 4);
        f->recipes = (uint64_t)db_col_int64(st, 5);
    }
    if (!rc && step != DB_DONE) rc = catalog_error(&s->cat, "read files");
    db_finalize(st);
    if (rc) {
        store_file_infos_free(v, k);
        return rc;
    }
    *out = v;
    *n = k;
    return 0;
}

static int last_verify(ckpt_store *s, int64_t id, json_t **out)
{
    *out = NULL;
    ckpt_stmt *st;
    int rc = catalog_prepare(&s->cat, &st, "SELECT at, ok, error FROM verify_checkpoints WHERE checkpoint_id = ?");
    if (rc) return rc;
    db_bind_int64(st, 1, id);
    if (db_step(st) == DB_ROW)
        *out = json_pack("{s:f,s:b,s:s?}", "at", db_col_double(st, 0), "ok", (int)db_col_int64(st, 1), "error",
                         db_col_text(st, 2));
    db_finalize(st);
    return 0;
}

int store_ckpt_json(ckpt_store *s, const store_ckpt *c, bool with_files, json_t **out)
{
    *out = NULL;
    char *ref = store_ckpt_ref(c), *src = NULL;
    if (!ref) return CKPT_ENOMEM;
    int rc = 0;
    if (c->source_id) {
        store_ckpt sc;
        rc = store_get(s, c->source_id, &sc);
        if (rc == CKPT_ENOTFOUND) {
            rc = 0; /* removed (ckpt rm): the layout stays usable */
            ckpt_error_clear();
        } else if (!rc) {
            src = store_ckpt_ref(&sc);
            store_ckpt_free(&sc);
            if (!src) rc = CKPT_ENOMEM;
        }
    }
    json_t *j = rc ? NULL
                   : json_pack("{s:I,s:s,s:s,s:s,s:s,s:s,s:o,s:b,s:I,s:I}", "id", (json_int_t)c->id, "ref", ref, "repo",
                               c->repo, "revision", c->revision, "commit", c->commit, "layout", c->layout, "source",
                               src ? json_string(src) : json_null(), "lossy", c->lossy, "total_size",
                               (json_int_t)c->total_size, "created_at", (json_int_t)c->created_at);
    free(ref);
    free(src);
    if (!rc && !j) rc = ckpt_error_set(CKPT_ENOMEM, "out of memory");
    json_t *verified = NULL;
    if (!rc && !(rc = last_verify(s, c->id, &verified)) && verified) json_object_set_new(j, "last_verify", verified);
    if (!rc && with_files) {
        store_file_info *fs;
        size_t n;
        rc = store_file_infos(s, c->id, &fs, &n);
        json_t *files = rc ? NULL : json_array();
        for (size_t i = 0; files && i < n; i++)
            json_array_append_new(files, json_pack("{s:s,s:I,s:o,s:b,s:I,s:I}", "path", fs[i].path, "size",
                                                   (json_int_t)fs[i].size, "sha256",
                                                   *fs[i].sha256 ? json_string(fs[i].sha256) : json_null(), "safetensors",
                                                   fs[i].safetensors, "tensors", (json_int_t)fs[i].tensors,
                                                   "recipes", (json_int_t)fs[i].recipes));
        if (!rc) store_file_infos_free(fs, n);
        if (!rc && !files) rc = ckpt_error_set(CKPT_ENOMEM, "out of memory");
        if (!rc) json_object_set_new(j, "files", files);
    }
    if (rc) {
        json_decref(j);
        return rc;
    }
    *out = j;
    return 0;
}

int store_list_json(ckpt_store *s, const char *repo, json_t **out)
{
    *out = NULL;
    store_ckpt *v;
    size_t n;
    int rc = store_list(s, repo, &v, &n);
    if (rc) return rc;
    json_t *list = json_array();
    if (!list) rc = ckpt_error_set(CKPT_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < n; i++) {
        json_t *j;
        if (!(rc = store_ckpt_json(s, &v[i], false, &j))) json_array_append_new(list, j);
    }
    store_list_free(v, n);
    if (rc) {
        json_decref(list);
        return rc;
    }
    *out = json_pack("{s:o}", "checkpoints", list);
    return *out ? 0 : ckpt_error_set(CKPT_ENOMEM, "out of memory");
}

/*
 * checkpoint.c — a Hugging Face checkpoint as one set of tensors: a single
 * safetensors file, or shards listed by "<prefix>.safetensors.index.json".
 *
 * Opening validates every shard (st_open) and then holds the index to the
 * files: names in the index must be safe before any file is opened, every
 * mapped tensor must be in its file, every tensor of a file must be mapped
 * there, no tensor may live in two files, and total_size must be the sum of
 * the tensor bytes. The writing half reproduces Hugging Face's shard split,
 * shard names and index bytes so our sharded output matches theirs.
 */
#include "format/checkpoint.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/util.h"
#include "format/dcp.h"
#include "format/torch.h"

#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CKPT_INDEX_SUFFIX ".safetensors.index.json"
#define CKPT_FILE_SUFFIX ".safetensors"

/* ---- the index file ---- */

bool ckpt_shard_name_safe(const char *name)
{
    if (!name || !*name || strlen(name) > ST_MAX_NAME) return false;
    if (name[0] == '/' || strstr(name, "..") || strstr(name, "://") || strchr(name, '\\'))
        return false;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if (*p < 0x20 || *p == 0x7F) return false;
    return true;
}

/* metadata.total_size, when present: an integer >= 0 (an integral float is
 * accepted too; some writers emit 1.2e10). */
static int index_load_total_size(ckpt_index *ix, const char *what, const json_t *root)
{
    const json_t *meta = json_object_get(root, "metadata");
    if (!meta || json_is_null(meta)) return 0;
    if (!json_is_object(meta))
        return ckpt_error_set(CKPT_EINVAL, "%s: 'metadata' must be an object", what);
    const json_t *ts = json_object_get(meta, "total_size");
    if (!ts || json_is_null(ts)) return 0;
    if (json_is_integer(ts) && json_integer_value(ts) >= 0) {
        ix->total_size = (uint64_t)json_integer_value(ts);
        ix->has_total_size = true;
        return 0;
    }
    double d = json_is_real(ts) ? json_real_value(ts) : -1;
    if (d >= 0 && d < 18446744073709551616.0 && d == (double)(uint64_t)d) {
        ix->total_size = (uint64_t)d;
        ix->has_total_size = true;
        return 0;
    }
    return ckpt_error_set(CKPT_EINVAL, "%s: metadata.total_size must be a non-negative integer",
                          what);
}

static int index_load_entries(ckpt_index *ix, const char *what, json_t *weight_map)
{
    size_t n = json_object_size(weight_map);
    ix->names = ckpt_calloc(n, sizeof *ix->names);
    ix->files = ckpt_calloc(n, sizeof *ix->files);
    if (!ix->names || !ix->files) return CKPT_ENOMEM;
    const char *name;
    size_t name_len;
    json_t *file;
    json_object_keylen_foreach(weight_map, name, name_len, file)
    {
        if (name_len != strlen(name))
            return ckpt_error_set(CKPT_EINVAL, "%s: a tensor name in weight_map contains NUL",
                                  what);
        if (!json_is_string(file))
            return ckpt_error_set(
                CKPT_EINVAL, "%s: weight_map entry of tensor '%s' is not a string", what, name);
        const char *shard = json_string_value(file);
        if (json_string_length(file) != strlen(shard) || !ckpt_shard_name_safe(shard))
            return ckpt_error_set(CKPT_EINVAL,
                                  "%s: tensor '%s' is mapped to unsafe shard name '%s'", what, name,
                                  shard);
        ix->names[ix->nentries] = ckpt_strdup(name);
        ix->files[ix->nentries] = ckpt_strdup(shard);
        ix->nentries++;
        if (!ix->names[ix->nentries - 1] || !ix->files[ix->nentries - 1]) return CKPT_ENOMEM;
    }
    return 0;
}

typedef struct {
    const char *name;
    size_t first; /* first entry that names this shard */
} index_seen;

static int index_cmp_seen_name(const void *a, const void *b)
{
    const index_seen *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c) return c;
    return x->first < y->first ? -1 : x->first > y->first;
}

static int index_cmp_seen_first(const void *a, const void *b)
{
    const index_seen *x = a, *y = b;
    return x->first < y->first ? -1 : x->first > y->first;
}

/* ix->shards: the distinct file names, in the order the index first uses them. */
static int index_collect_shards(ckpt_index *ix, const char *what)
{
    index_seen *seen = ckpt_calloc(ix->nentries, sizeof *seen);
    if (!seen) return CKPT_ENOMEM;
    for (size_t i = 0; i < ix->nentries; i++)
        seen[i] = (index_seen){ix->files[i], i};
    qsort(seen, ix->nentries, sizeof *seen, index_cmp_seen_name);
    size_t distinct = 0;
    for (size_t i = 0; i < ix->nentries; i++)
        if (!distinct || strcmp(seen[i].name, seen[distinct - 1].name) != 0)
            seen[distinct++] = seen[i];
    int rc = 0;
    if (distinct > CKPT_MAX_SHARDS)
        rc = ckpt_error_set(CKPT_ELIMIT, "%s: the index names %zu shard files, at most %d", what,
                            distinct, CKPT_MAX_SHARDS);
    if (!rc) {
        qsort(seen, distinct, sizeof *seen, index_cmp_seen_first);
        ix->shards = ckpt_calloc(distinct, sizeof *ix->shards);
        if (!ix->shards) rc = CKPT_ENOMEM;
    }
    for (size_t i = 0; !rc && i < distinct; i++) {
        ix->shards[i] = ckpt_strdup(seen[i].name);
        if (!ix->shards[i])
            rc = CKPT_ENOMEM;
        else
            ix->nshards++;
    }
    free(seen);
    return rc;
}

int ckpt_index_parse(ckpt_index *ix, const char *what, const char *json, size_t len)
{
    memset(ix, 0, sizeof *ix);
    json_t *root;
    int rc = cj_load_buf(&root, json, len, what);
    if (rc) return rc;
    json_t *weight_map = json_object_get(root, "weight_map");
    if (!json_is_object(root))
        rc = ckpt_error_set(CKPT_EINVAL, "%s: the index is not a JSON object", what);
    else if (!json_is_object(weight_map))
        rc = ckpt_error_set(CKPT_EINVAL, "%s: 'weight_map' is missing or not an object", what);
    if (!rc) rc = index_load_total_size(ix, what, root);
    if (!rc) rc = index_load_entries(ix, what, weight_map);
    if (!rc) rc = index_collect_shards(ix, what);
    json_decref(root);
    if (rc) ckpt_index_free(ix);
    return rc;
}

void ckpt_index_free(ckpt_index *ix)
{
    for (size_t i = 0; i < ix->nentries; i++) {
        free(ix->names[i]);
        free(ix->files[i]);
    }
    for (size_t i = 0; i < ix->nshards; i++)
        free(ix->shards[i]);
    free(ix->names);
    free(ix->files);
    free(ix->shards);
    memset(ix, 0, sizeof *ix);
}

/* ---- opening ---- */

static char *checkpoint_dirname(const char *path)
{
    char *copy = ckpt_strdup(path);
    if (!copy) return NULL;
    char *dir = ckpt_strdup(dirname(copy));
    free(copy);
    return dir;
}

static bool checkpoint_has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Opens and validates one more file into c->files (allocated by the caller). */
static int checkpoint_add_file(ckpt_checkpoint *c, const char *path)
{
    int rc = tensor_file_open(&c->files[c->nfiles], path); /* safetensors, or torch.save (torch.h) */
    if (!rc) c->nfiles++;
    return rc;
}

static int checkpoint_cmp_ref(const void *a, const void *b)
{
    return strcmp(((const ckpt_tensor_ref *)a)->t->name, ((const ckpt_tensor_ref *)b)->t->name);
}

/* c->tensors: every tensor of every file, sorted by name; also total_size.
 * `what` (the index, or the file) names the checkpoint in errors. */
static int checkpoint_collect(ckpt_checkpoint *c, const char *what)
{
    size_t total = 0;
    for (size_t f = 0; f < c->nfiles; f++)
        total += c->files[f].ntensors;
    c->tensors = ckpt_calloc(total, sizeof *c->tensors);
    if (!c->tensors) return CKPT_ENOMEM;
    for (size_t f = 0; f < c->nfiles; f++) {
        for (size_t i = 0; i < c->files[f].ntensors; i++) {
            const st_tensor *t = &c->files[f].tensors[i];
            if (t->view && !c->views)
                return ckpt_error_set(CKPT_EINVAL,
                                      "%s: tensor '%s' is a transposed (permuted) view; only convert and inspect "
                                      "read such tensors (convert it first)",
                                      c->files[f].path, t->name);
            c->tensors[c->ntensors++] = (ckpt_tensor_ref){t, f};
            if (!ckpt_add(c->total_size, t->nbytes, &c->total_size))
                return ckpt_error_set(CKPT_ELIMIT, "%s: tensor bytes overflow 64 bits", what);
        }
    }
    qsort(c->tensors, c->ntensors, sizeof *c->tensors, checkpoint_cmp_ref);
    for (size_t i = 1; i < c->ntensors; i++) {
        const ckpt_tensor_ref *a = &c->tensors[i - 1], *b = &c->tensors[i];
        if (strcmp(a->t->name, b->t->name) == 0)
            return ckpt_error_set(CKPT_EINVAL, "%s: tensor '%s' is in both '%s' and '%s'", what,
                                  b->t->name, c->files[a->file].path, c->files[b->file].path);
    }
    return 0;
}

/* A name the index maps to a shard that holds it as a second name of a
 * shared tensor (tied weights): a torch.save shard (torch.h records it in the
 * file's metadata), or a safetensors shard converted from one, whose
 * __metadata__ says {removed: kept} with kept in that file (Hugging Face's
 * conversion keeps such names in the index). */
static bool checkpoint_torch_alias(const ckpt_checkpoint *c, const ckpt_index *ix, size_t i)
{
    for (size_t f = 0; f < c->nfiles; f++) {
        if (strcmp(ix->shards[f], ix->files[i])) continue;
        const char *kept = st_meta_get(&c->files[f], ix->names[i]);
        if (kept && (c->files[f].from_torch || st_find(&c->files[f], kept))) return true;
    }
    return false;
}

/* The index against the files (c->files[k] is ix->shards[k]). */
static int checkpoint_check_index(ckpt_checkpoint *c, const ckpt_index *ix)
{
    const char *what = c->index_path;
    bool *listed = ckpt_calloc(c->ntensors, sizeof *listed);
    if (!listed) return CKPT_ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < ix->nentries && !rc; i++) {
        const ckpt_tensor_ref *ref = ckpt_checkpoint_find(c, ix->names[i]);
        if (!ref && checkpoint_torch_alias(c, ix, i)) continue;
        if (!ref)
            rc = ckpt_error_set(CKPT_EINVAL,
                                "%s: tensor '%s' is mapped to '%s', which does not hold it", what,
                                ix->names[i], ix->files[i]);
        else if (strcmp(ix->shards[ref->file], ix->files[i]) != 0)
            rc = ckpt_error_set(CKPT_EINVAL, "%s: tensor '%s' is mapped to '%s' but is in '%s'",
                                what, ix->names[i], ix->files[i], ix->shards[ref->file]);
        else
            listed[ref - c->tensors] = true;
    }
    for (size_t i = 0; i < c->ntensors && !rc; i++) {
        if (!listed[i])
            rc = ckpt_error_set(CKPT_EINVAL,
                                "%s: '%s' holds tensor '%s', which the index does not list", what,
                                ix->shards[c->tensors[i].file], c->tensors[i].t->name);
    }
    free(listed);
    /* total_size of a torch index counts tied tensors once or twice, as the
     * transformers version that wrote it did: not checked there */
    bool torch = c->nfiles && c->files[0].from_torch;
    if (!rc && ix->has_total_size && !torch && ix->total_size != c->total_size)
        rc = ckpt_error_set(CKPT_EINVAL,
                            "%s: metadata.total_size is %" PRIu64 " but the tensors hold %" PRIu64
                            " bytes",
                            what, ix->total_size, c->total_size);
    return rc;
}

static int checkpoint_open_index(ckpt_checkpoint *c, const char *index_path)
{
    c->index_path = ckpt_strdup(index_path);
    c->dir = checkpoint_dirname(index_path);
    if (!c->index_path || !c->dir) return CKPT_ENOMEM;
    char *json;
    size_t len;
    int rc = ckpt_read_file(index_path, CKPT_INDEX_MAX_BYTES, &json, &len);
    if (rc) return rc;
    ckpt_index ix;
    rc = ckpt_index_parse(&ix, index_path, json, len);
    free(json);
    if (rc) return rc;
    c->files = ckpt_calloc(ix.nshards, sizeof *c->files);
    if (!c->files) rc = CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < ix.nshards; i++) {
        char *path = ckpt_path_join(c->dir, ix.shards[i]);
        rc = path ? checkpoint_add_file(c, path) : CKPT_ENOMEM;
        free(path);
    }
    if (!rc) rc = checkpoint_collect(c, index_path);
    if (!rc) rc = checkpoint_check_index(c, &ix);
    ckpt_index_free(&ix);
    return rc;
}

static int checkpoint_open_single(ckpt_checkpoint *c, const char *path)
{
    c->dir = checkpoint_dirname(path);
    c->files = ckpt_calloc(1, sizeof *c->files);
    if (!c->dir || !c->files) return CKPT_ENOMEM;
    int rc = checkpoint_add_file(c, path);
    if (!rc) rc = checkpoint_collect(c, path);
    return rc;
}

/* Finishes an open: on failure nothing stays open and the error stands. */
static int checkpoint_opened(ckpt_checkpoint *c, int rc)
{
    if (rc) ckpt_checkpoint_close(c);
    return rc;
}

static bool ckpt_exists_in(const char *dir, const char *name)
{
    char *p = ckpt_path_join(dir, name);
    bool yes = p && ckpt_exists(p);
    free(p);
    return yes;
}

/* A folder of torch.save files (Hugging Face's older layout, torch.h). */
static int checkpoint_open_torch(ckpt_checkpoint *c, const char *dir, const char *name, bool index)
{
    char *p = ckpt_path_join(dir, name);
    int rc = !p ? CKPT_ENOMEM : index ? checkpoint_open_index(c, p) : checkpoint_open_single(c, p);
    free(p);
    return rc;
}

static int checkpoint_open_in_dir(ckpt_checkpoint *c, const char *dir, const char *prefix)
{
    if (!prefix || !ckpt_shard_name_safe(prefix) || strchr(prefix, '/'))
        return ckpt_error_set(CKPT_EINVAL, "bad checkpoint prefix '%s'", prefix ? prefix : "");
    char *index_name = ckpt_sprintf("%s" CKPT_INDEX_SUFFIX, prefix);
    char *file_name = ckpt_sprintf("%s" CKPT_FILE_SUFFIX, prefix);
    char *index_path = index_name ? ckpt_path_join(dir, index_name) : NULL;
    char *file_path = file_name ? ckpt_path_join(dir, file_name) : NULL;
    int rc;
    if (!index_path || !file_path)
        rc = CKPT_ENOMEM;
    else if (ckpt_exists(index_path))
        rc = checkpoint_open_index(c, index_path);
    else if (ckpt_exists(file_path))
        rc = checkpoint_open_single(c, file_path);
    else if (!strcmp(prefix, "model") && ckpt_exists_in(dir, "pytorch_model.bin.index.json"))
        rc = checkpoint_open_torch(c, dir, "pytorch_model.bin.index.json", true);
    else if (!strcmp(prefix, "model") && ckpt_exists_in(dir, "pytorch_model.bin"))
        rc = checkpoint_open_torch(c, dir, "pytorch_model.bin", false);
    else if (!strcmp(prefix, "model") && dcp_is_checkpoint(dir))
        rc = ckpt_error_set(CKPT_EINVAL, "%s: a PyTorch DCP checkpoint (.metadata + .distcp): `ckpt consolidate %s OUT` "
                            "writes it as a Hugging Face checkpoint first", dir, dir);
    else
        rc = ckpt_error_set(CKPT_ENOTFOUND, "%s: holds neither %s nor %s", dir, index_name,
                            file_name);
    free(index_name);
    free(file_name);
    free(index_path);
    free(file_path);
    return rc;
}

int ckpt_checkpoint_open_prefix(ckpt_checkpoint *c, const char *dir, const char *prefix)
{
    memset(c, 0, sizeof *c);
    c->path = ckpt_strdup(dir);
    if (!c->path) return CKPT_ENOMEM;
    return checkpoint_opened(c, checkpoint_open_in_dir(c, dir, prefix));
}

static int checkpoint_open_path(ckpt_checkpoint *c, const char *path, bool views)
{
    memset(c, 0, sizeof *c);
    c->views = views;
    c->path = ckpt_strdup(path);
    if (!c->path) return CKPT_ENOMEM;
    int rc;
    if (ckpt_is_dir(path))
        rc = checkpoint_open_in_dir(c, path, "model");
    else if (checkpoint_has_suffix(path, ".json"))
        rc = checkpoint_open_index(c, path);
    else
        rc = checkpoint_open_single(c, path);
    return checkpoint_opened(c, rc);
}

int ckpt_checkpoint_open(ckpt_checkpoint *c, const char *path)
{
    return checkpoint_open_path(c, path, false);
}

int ckpt_checkpoint_open_views(ckpt_checkpoint *c, const char *path)
{
    return checkpoint_open_path(c, path, true);
}

void ckpt_checkpoint_close(ckpt_checkpoint *c)
{
    for (size_t i = 0; i < c->nfiles; i++)
        st_close(&c->files[i]);
    free(c->files);
    free(c->tensors);
    free(c->path);
    free(c->dir);
    free(c->index_path);
    memset(c, 0, sizeof *c);
}

const ckpt_tensor_ref *ckpt_checkpoint_find(const ckpt_checkpoint *c, const char *name)
{
    size_t lo = 0, hi = c->ntensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int cmp = strcmp(name, c->tensors[mid].t->name);
        if (cmp == 0) return &c->tensors[mid];
        if (cmp < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

/* ---- sharded writing ---- */

/* transformers' shard_checkpoint: walk in order; start a new shard when the
 * current one is not empty and the tensor would take it past the limit. No
 * tensors still make one (empty) shard, as save_pretrained writes one file. */
/* huggingface_hub's split_torch_state_dict_into_shards: a tensor larger than
 * the limit gets a shard of its own at once, while the shard being filled
 * stays open; the open shard closes when the next tensor would pass the limit. */
int ckpt_shard_assign(const uint64_t *sizes, size_t n, uint64_t max_shard_size, size_t *shard_of,
                      size_t *nshards)
{
    size_t *pending = ckpt_calloc(n + 1, sizeof *pending);
    if (!pending) return CKPT_ENOMEM;
    size_t count = 0, npending = 0;
    uint64_t current = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        uint64_t next;
        bool fits = ckpt_add(current, sizes[i], &next) && next <= max_shard_size;
        if (max_shard_size && sizes[i] > max_shard_size) {
            shard_of[i] = count++;
        } else {
            if (max_shard_size && !fits && npending) {
                for (size_t k = 0; k < npending; k++) shard_of[pending[k]] = count;
                count++;
                npending = 0;
                next = sizes[i];
            }
            pending[npending++] = i;
            current = next;
        }
        if (count >= CKPT_MAX_SHARDS)
            rc = ckpt_error_set(CKPT_ELIMIT, "more than %d shards; raise the shard size", CKPT_MAX_SHARDS);
    }
    if (!rc && (npending || count == 0)) {
        for (size_t k = 0; k < npending; k++) shard_of[pending[k]] = count;
        count++;
    }
    free(pending);
    *nshards = count;
    return rc;
}

char *ckpt_shard_name(const char *prefix, size_t i, size_t n)
{
    if (!prefix || i >= n) {
        ckpt_error_set(CKPT_EINVAL, "shard %zu of %zu does not exist", i, n);
        return NULL;
    }
    if (n == 1) return ckpt_sprintf("%s" CKPT_FILE_SUFFIX, prefix);
    return ckpt_sprintf("%s-%05zu-of-%05zu" CKPT_FILE_SUFFIX, prefix, i + 1, n);
}

static int index_cmp_name_at(const void *a, const void *b, void *ctx)
{
    char *const *names = ctx;
    return strcmp(names[*(const size_t *)a], names[*(const size_t *)b]);
}

/* Python's json.dumps(index, indent=2, sort_keys=True) + "\n". */
static int index_render_to(FILE *out, uint64_t total_size, size_t n, char *const *names,
                           char *const *files, const size_t *order)
{
    fprintf(out, "{\n  \"metadata\": {\n    \"total_size\": %" PRIu64 "\n  },\n  \"weight_map\": ",
            total_size);
    fputs(n ? "{\n" : "{}", out);
    int rc = 0;
    for (size_t k = 0; k < n && !rc; k++) {
        fputs("    ", out);
        rc = st_json_put_string(out, names[order[k]], true);
        fputs(": ", out);
        if (!rc) rc = st_json_put_string(out, files[order[k]], true);
        fputs(k + 1 < n ? ",\n" : "\n  }", out);
    }
    fputs("\n}\n", out);
    return rc;
}

char *ckpt_index_render(uint64_t total_size, size_t n, char *const *names, char *const *files)
{
    size_t *order = ckpt_calloc(n, sizeof *order);
    if (!order) return NULL;
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    qsort_r(order, n, sizeof *order, index_cmp_name_at, (void *)names);
    int rc = 0;
    for (size_t k = 1; k < n && !rc; k++)
        if (strcmp(names[order[k - 1]], names[order[k]]) == 0)
            rc = ckpt_error_set(CKPT_EINVAL, "index: tensor '%s' listed twice", names[order[k]]);
    char *buf = NULL;
    size_t size = 0;
    FILE *out = rc ? NULL : open_memstream(&buf, &size);
    if (!rc && !out) rc = ckpt_error_sys("index: open_memstream");
    if (out) {
        rc = index_render_to(out, total_size, n, names, files, order);
        bool failed = ferror(out);
        if ((fclose(out) != 0 || failed) && !rc)
            rc = ckpt_error_set(CKPT_ENOMEM, "index: cannot render");
    }
    free(order);
    if (rc) {
        free(buf);
        return NULL;
    }
    return buf;
}

static int checkpoint_from_files(ckpt_checkpoint *c, const char *label, st_file *files, size_t nfiles, bool views)
{
    memset(c, 0, sizeof *c);
    c->views = views;
    c->path = ckpt_strdup(label);
    c->dir = ckpt_strdup(label);
    c->files = ckpt_calloc(nfiles + 1, sizeof *c->files);
    if (!c->path || !c->dir || !c->files) {
        for (size_t i = 0; i < nfiles; i++) st_close(&files[i]);
        ckpt_checkpoint_close(c);
        return CKPT_ENOMEM;
    }
    for (size_t i = 0; i < nfiles; i++) {
        c->files[c->nfiles++] = files[i];
        memset(&files[i], 0, sizeof files[i]);
        files[i].fd = -1;
    }
    int rc = checkpoint_collect(c, label);
    if (rc) ckpt_checkpoint_close(c);
    return rc;
}

int ckpt_checkpoint_from_files(ckpt_checkpoint *c, const char *label, st_file *files, size_t nfiles)
{
    return checkpoint_from_files(c, label, files, nfiles, false);
}

int ckpt_checkpoint_from_files_views(ckpt_checkpoint *c, const char *label, st_file *files, size_t nfiles)
{
    return checkpoint_from_files(c, label, files, nfiles, true);
}

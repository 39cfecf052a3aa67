/*
 * nxd.c — optimum-neuron / neuronx-distributed training saves (nxd.h).
 * Follows neuronx-distributed's trainer/checkpoint.py (_get_path, _save,
 * _xser_save_data, _extract_tensor_info_and_update_state_dict,
 * CheckpointIOState.end) and torch_xla/utils/serialization.py
 * (TensorReference, _get_tensors_folder, _get_tensor_file).
 */
#include "format/nxd.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/util.h"
#include "format/pickle.h"
#include "format/torch.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TAG_TENSOR_REF 1000

/* torch_xla.utils.serialization.TensorReference(tid): a plain record for this reader only. */
static const pk_global_def XSER_ALLOW[] = {
    {"torch_xla.utils.serialization", "TensorReference", PKG_RECORD, TAG_TENSOR_REF},
};

static bool is_shards_dir(const char *dir)
{
    char *m = ckpt_path_join(dir, "model"), *j = ckpt_path_join(dir, "mp_metadata_pp_rank_0.json");
    bool yes = m && j && ckpt_is_dir(m) && ckpt_exists(j);
    free(m);
    free(j);
    return yes;
}

bool nxd_is_checkpoint(const char *dir)
{
    char *m = ckpt_path_join(dir, "shards/model"), *a = ckpt_path_join(dir, "adapter_shards/model");
    bool yes = (m && ckpt_is_dir(m)) || (a && ckpt_is_dir(a));
    free(m);
    free(a);
    return yes || is_shards_dir(dir);
}

static bool is_lora_component(const char *p, size_t len)
{
    static const char *const names[] = {"lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B"};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(names); i++)
        if (len == strlen(names[i]) && !strncmp(p, names[i], len)) return true;
    return false;
}

char *nxd_saved_name(const char *param)
{
    /* transformations_utils.py remove_adapter_name: LORA_PATTERN drops the
     * component after the first lora_A / lora_B / lora_embedding_A / _B that
     * has a component before it and one after it (the adapter name) */
    char *out = ckpt_strdup(param);
    if (!out) return NULL;
    const char *p = param;
    bool first = true;
    for (const char *dot; (dot = strchr(p, '.')); p = dot + 1, first = false) {
        if (first || !is_lora_component(p, (size_t)(dot - p))) continue;
        const char *adapter = dot + 1, *end = strchr(adapter, '.');
        size_t keep = (size_t)(dot - param), skip = end ? (size_t)(end - dot) : strlen(dot);
        memmove(out + keep, out + keep + skip, strlen(out + keep + skip) + 1);
        break;
    }
    return out;
}

/* "<digits>" of 2 to 4 digits at *p (the {:02d} of _get_path), advancing p. */
static bool take_num(const char **p, int *out)
{
    const char *s = *p;
    int n = 0, v = 0;
    while (s[n] >= '0' && s[n] <= '9' && n < 5) v = v * 10 + (s[n] - '0'), n++;
    if (n < 2 || n > 4 || v >= NXD_MAX_DEGREE) return false;
    *out = v;
    *p = s + n;
    return true;
}

static bool take(const char **p, const char *lit)
{
    size_t n = strlen(lit);
    if (strncmp(*p, lit, n)) return false;
    *p += n;
    return true;
}

/* dp_rank_DD[_ep_rank_EE]_tp_rank_TT_pp_rank_PP.pt */
bool nxd_parse_rank_name(const char *name, int *dp, int *ep, int *tp, int *pp, bool *has_ep)
{
    const char *p = name;
    *ep = 0;
    if (!take(&p, "dp_rank_") || !take_num(&p, dp)) return false;
    *has_ep = take(&p, "_ep_rank_");
    if (*has_ep && !take_num(&p, ep)) return false;
    return take(&p, "_tp_rank_") && take_num(&p, tp) && take(&p, "_pp_rank_") && take_num(&p, pp) && !strcmp(p, ".pt");
}

nxd_rank *nxd_rank_at(const nxd_ckpt *c, int pp, int ep, int tp)
{
    return &c->ranks[((size_t)pp * (size_t)c->ep + (size_t)ep) * (size_t)c->tp + (size_t)tp];
}

const char *nxd_rank_name(const nxd_rank *r) { return ckpt_basename(r->path); }

static char *rank_file_name(int ep, bool has_ep, int tp, int pp)
{
    return has_ep ? ckpt_sprintf("dp_rank_00_ep_rank_%02d_tp_rank_%02d_pp_rank_%02d.pt", ep, tp, pp)
                  : ckpt_sprintf("dp_rank_00_tp_rank_%02d_pp_rank_%02d.pt", tp, pp);
}

/* The degrees from the names in shards/model. */
static int scan_model_dir(nxd_ckpt *c, const char *model)
{
    DIR *d = opendir(model);
    if (!d) return ckpt_error_sys("%s: open", model);
    int rc = 0, files = 0, ep_names = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        int dp, ep, tp, pp;
        bool has_ep;
        if (!nxd_parse_rank_name(e->d_name, &dp, &ep, &tp, &pp, &has_ep)) continue;
        if (dp != 0)
            rc = ckpt_error_set(CKPT_EINVAL,
                                "%s/%s: a model file of data-parallel rank %d (neuronx-distributed saves the model "
                                "from dp rank 0 only)",
                                model, e->d_name, dp);
        if (tp + 1 > c->tp) c->tp = tp + 1;
        if (pp + 1 > c->pp) c->pp = pp + 1;
        if (ep + 1 > c->ep) c->ep = ep + 1;
        ep_names += has_ep;
        files++;
    }
    closedir(d);
    if (rc) return rc;
    if (!files) return ckpt_error_set(CKPT_ENOTFOUND, "%s: no dp_rank_00_tp_rank_XX_pp_rank_XX.pt rank files", model);
    if (ep_names && ep_names != files)
        return ckpt_error_set(CKPT_EINVAL, "%s: some rank files carry _ep_rank_ and some do not", model);
    c->has_ep = ep_names > 0;
    return 0;
}

/* Degrees the metadata and trn_config.json state: a missing last rank is not guessed away. */
static int expected_degrees(nxd_ckpt *c, int *tp, int *pp)
{
    *tp = 0;
    *pp = 0;
    for (int s = 0; s < c->pp; s++) {
        const char *key;
        json_t *v;
        json_object_foreach(json_object_get(c->meta[s], "parameters"), key, v)
        {
            json_t *np = json_object_get(v, "num_partitions");
            if (json_is_true(json_object_get(v, "tensor_model_parallel")) && json_is_integer(np) &&
                json_integer_value(np) > *tp && json_integer_value(np) <= NXD_MAX_DEGREE)
                *tp = (int)json_integer_value(np);
        }
    }
    if (!c->root) return 0;
    char *tc = ckpt_path_join(c->root, "trn_config.json");
    if (!tc) return CKPT_ENOMEM;
    int rc = 0;
    if (ckpt_exists(tc)) {
        json_t *j = NULL;
        rc = cj_load_file(&j, tc, 1u << 20);
        int64_t v = 0;
        if (!rc && !(rc = cj_int_opt(j, "tensor_parallel_size", &v, tc)) && v > *tp && v <= NXD_MAX_DEGREE) *tp = (int)v;
        v = 0;
        if (!rc && !(rc = cj_int_opt(j, "pipeline_parallel_size", &v, tc)) && v > 0 && v <= NXD_MAX_DEGREE) *pp = (int)v;
        json_decref(j);
    }
    free(tc);
    return rc;
}

static int load_meta(nxd_ckpt *c)
{
    c->meta = ckpt_calloc((size_t)c->pp, sizeof *c->meta);
    c->meta_paths = ckpt_calloc((size_t)c->pp, sizeof *c->meta_paths);
    if (!c->meta || !c->meta_paths) return CKPT_ENOMEM;
    for (int s = 0; s < c->pp; s++) {
        char name[64];
        snprintf(name, sizeof name, "mp_metadata_pp_rank_%d.json", s);
        if (!(c->meta_paths[s] = ckpt_path_join(c->shards, name))) return CKPT_ENOMEM;
        if (!ckpt_exists(c->meta_paths[s])) {
            snprintf(name, sizeof name, "mp_metadata_pp_rank_%d.pt", s);
            char *pt = ckpt_path_join(c->shards, name);
            bool old = pt && ckpt_exists(pt);
            free(pt);
            return old ? ckpt_error_set(CKPT_EINVAL, "%s/%s: metadata as a pickle (older optimum-neuron) is not read; only .json",
                                        c->shards, name)
                       : ckpt_error_set(CKPT_ENOTFOUND,
                                        "%s: missing (optimum-neuron writes the parameter metadata of pipeline stage %d there)",
                                        c->meta_paths[s], s);
        }
        int rc = cj_load_file(&c->meta[s], c->meta_paths[s], NXD_META_MAX_BYTES);
        if (rc) return rc;
        if (!json_is_object(json_object_get(c->meta[s], "parameters")) ||
            !json_is_array(json_object_get(c->meta[s], "model_weight_transformation_specs")))
            return ckpt_error_set(CKPT_EINVAL, "%s: no \"parameters\" object and \"model_weight_transformation_specs\" list",
                                  c->meta_paths[s]);
    }
    return 0;
}

/* The .info.pt entries by tensor id (sorted pairs: a save can hold tens of
 * thousands of tensors per rank). */
typedef struct {
    int64_t tid;
    const pk_node *val;
} info_entry;

static int cmp_info(const void *a, const void *b)
{
    int64_t x = ((const info_entry *)a)->tid, y = ((const info_entry *)b)->tid;
    return x < y ? -1 : x > y;
}

static int info_index(const pk_doc *info, info_entry **out, size_t *n)
{
    const pk_node *root = pk_at(info, info->root);
    info_entry *e = ckpt_calloc(root->n / 2 + 1, sizeof *e);
    if (!e) return CKPT_ENOMEM;
    size_t m = 0;
    for (size_t k = 0; k + 1 < root->n; k += 2) {
        const pk_node *kn = pk_item(info, root, k);
        if (kn->kind != PK_INT || kn->s) continue;
        e[m].tid = kn->i;
        e[m++].val = pk_item(info, root, k + 1);
    }
    qsort(e, m, sizeof *e, cmp_info);
    *out = e;
    *n = m;
    return 0;
}

/* The .info.pt entry of tid: its dtype and shape, or *found false. */
static int info_of(const pk_doc *info, const info_entry *idx, size_t nidx, int64_t tid, int *dt, int *ndim, uint64_t *shape,
                   bool *found, bool *ep, const char *path)
{
    *found = false;
    *ep = false;
    info_entry key = {.tid = tid};
    const info_entry *hit = bsearch(&key, idx, nidx, sizeof *idx, cmp_info);
    if (!hit) return 0;
    const pk_node *v = hit->val;
    const pk_node *dtn = pk_dict_get(info, v, "dtype"), *sh = pk_dict_get(info, v, "shape"), *epn = pk_dict_get(info, v, "expert_model_parallel");
    *ep = epn && epn->kind == PK_BOOL && epn->i; /* _is_ep of _xser_load_data */
    if (!dtn || !sh || sh->kind != PK_TUPLE || sh->n > CKPT_MAX_RANK)
        return ckpt_error_set(CKPT_EINVAL, "%s: entry %lld has no dtype and shape", path, (long long)tid);
    *dt = torch_global_dtype(dtn);
    *ndim = (int)sh->n;
    for (size_t a = 0; a < sh->n; a++) {
        const pk_node *x = pk_item(info, sh, a);
        if (x->kind != PK_INT || x->s || x->i < 0)
            return ckpt_error_set(CKPT_EINVAL, "%s: entry %lld: shape is not a tuple of sizes", path, (long long)tid);
        shape[a] = (uint64_t)x->i;
    }
    *found = true;
    return 0;
}

const pk_global_def *nxd_xser_allow(size_t *n)
{
    *n = CKPT_ARRAY_LEN(XSER_ALLOW);
    return XSER_ALLOW;
}

int nxd_xser_tid(const pk_doc *refs, const pk_node *val, const char *label, const char *name, int64_t *out)
{
    const pk_node *cls = val->kind == PK_OBJ ? pk_item(refs, val, 0) : NULL;
    const pk_node *state = val->kind == PK_OBJ ? pk_item(refs, val, 2) : NULL;
    const pk_node *tid = state ? pk_dict_get(refs, state, "tid") : NULL;
    if (!cls || cls->tag != TAG_TENSOR_REF || pk_item(refs, val, 1)->n != 0 || !tid || tid->kind != PK_INT || tid->s || tid->i < 0 ||
        tid->i >= NXD_MAX_TID)
        return ckpt_error_set(CKPT_EINVAL, "%s: '%s' is not a TensorReference(tid) with a tensor id below %d", label, name, NXD_MAX_TID);
    *out = tid->i;
    return 0;
}

int nxd_xser_refs(const pk_doc *refs, const char *label, nxd_ref **out, size_t *nout)
{
    *out = NULL;
    *nout = 0;
    const pk_node *root = pk_at(refs, refs->root);
    if (root->kind != PK_DICT)
        return ckpt_error_set(CKPT_EINVAL, "%s: holds a %s, not a state dict of TensorReference records", label,
                              pk_kind_name(root->kind));
    size_t n = root->n / 2;
    if (n > ST_MAX_TENSORS) return ckpt_error_set(CKPT_ELIMIT, "%s: %zu tensors, at most %d", label, n, ST_MAX_TENSORS);
    nxd_ref *r = ckpt_calloc(n + 1, sizeof *r);
    uint8_t *seen = ckpt_calloc(NXD_MAX_TID / 8, 1);
    int rc = r && seen ? 0 : CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        const pk_node *key = pk_item(refs, root, 2 * i), *val = pk_item(refs, root, 2 * i + 1);
        if (key->kind != PK_STR || strlen(key->s) != key->slen || !key->slen || key->slen > ST_MAX_NAME) {
            rc = ckpt_error_set(CKPT_EINVAL, "%s: a key that is not a parameter name", label);
            break;
        }
        int64_t tid;
        if ((rc = nxd_xser_tid(refs, val, label, key->s, &tid))) break;
        if (seen[tid / 8] & (1u << (tid % 8))) {
            rc = ckpt_error_set(CKPT_EINVAL, "%s: parameter '%s': tensor id %lld is used twice", label, key->s, (long long)tid);
            break;
        }
        seen[tid / 8] |= (uint8_t)(1u << (tid % 8));
        r[i].name = key->s;
        r[i].tid = tid;
    }
    free(seen);
    if (rc) {
        free(r);
        return rc;
    }
    *out = r;
    *nout = n;
    return 0;
}

/* An xser rank: the reference dict, then every tensor_<tid>.pt (nxd.h). */
static int open_xser_rank(nxd_rank *r)
{
    pk_doc refs, info;
    memset(&info, 0, sizeof info);
    bool has_info = false;
    int rc = torch_load_pickle(&refs, r->path, XSER_ALLOW, CKPT_ARRAY_LEN(XSER_ALLOW));
    if (rc) return rc;
    char *ipath = ckpt_sprintf("%s.info.pt", r->path), *tdir = ckpt_sprintf("%s.tensors", r->path);
    if (!ipath || !tdir) rc = CKPT_ENOMEM;
    if (!rc && ckpt_exists(ipath)) {
        rc = torch_load_pickle(&info, ipath, NULL, 0);
        has_info = !rc;
        if (!rc && pk_at(&info, info.root)->kind != PK_DICT)
            rc = ckpt_error_set(CKPT_EINVAL, "%s: not a dict of tensor ids", ipath);
    }
    nxd_ref *refv = NULL;
    info_entry *idx = NULL;
    size_t n = 0, nidx = 0;
    if (!rc && has_info) rc = info_index(&info, &idx, &nidx);
    if (!rc) rc = nxd_xser_refs(&refs, r->path, &refv, &n);
    st_file *files = rc ? NULL : ckpt_calloc(n + 1, sizeof *files);
    if (!rc && !files) rc = CKPT_ENOMEM;
    if (!rc && !(r->ep_params = json_object())) rc = CKPT_ENOMEM;
    size_t opened = 0;
    for (size_t k = 0; !rc && k < n; k++) {
        const char *name = refv[k].name;
        long long tid = (long long)refv[k].tid;
        int dt = -1, ndim = 0;
        uint64_t shape[CKPT_MAX_RANK];
        bool found = false, ep = false;
        if (has_info && (rc = info_of(&info, idx, nidx, refv[k].tid, &dt, &ndim, shape, &found, &ep, ipath))) break;
        if (ep && json_object_set_new(r->ep_params, name, json_true())) {
            rc = CKPT_ENOMEM;
            break;
        }
        /* _xser_save_data: on expert-parallel rank > 0 only the expert-parallel
         * tensors are written (the others are ep rank 0's, which every rank loads) */
        if (r->ep > 0 && has_info && !ep) continue;
        size_t i = opened;
        char *tpath = ckpt_sprintf("%s/tensor_%lld.pt", tdir, tid);
        if (!tpath) {
            rc = CKPT_ENOMEM;
            break;
        }
        rc = ckpt_exists(tpath) ? torch_open_tensor(&files[i], tpath, name)
                                : ckpt_error_set(CKPT_ENOTFOUND, "%s: parameter '%s': its tensor file %s is missing", r->path,
                                                 name, tpath);
        free(tpath);
        if (rc) break;
        opened++;
        close(files[i].fd); /* read by path later: a save has many tensor files */
        files[i].fd = -1;
        if (has_info) {
            const st_tensor *t = &files[i].tensors[0];
            bool same = found && dt == (int)t->dtype && ndim == t->ndim;
            for (int a = 0; same && a < ndim; a++) same = shape[a] == t->shape[a];
            char got[96], want[96];
            if (!rc && !same)
                rc = ckpt_error_set(CKPT_EINVAL, "%s: parameter '%s' (tensor %lld) is %s %s, %s says %s", files[i].path, name, tid,
                                    ckpt_dtype_name(t->dtype), ckpt_shape_str(t->ndim, t->shape, got, sizeof got), ipath,
                                    found ? ckpt_shape_str(ndim, shape, want, sizeof want) : "nothing of it");
        }
    }
    if (!rc) rc = ckpt_checkpoint_from_files(&r->ck, r->path, files, opened);
    else
        for (size_t k = 0; k < opened; k++) st_close(&files[k]);
    free(files);
    free(refv);
    free(idx);
    free(ipath);
    free(tdir);
    pk_free(&refs);
    if (has_info) pk_free(&info);
    return rc;
}

int nxd_open_plain(ckpt_checkpoint *ck, const char *path, pk_doc *tree)
{
    st_file *f = ckpt_calloc(1, sizeof *f);
    if (!f) return CKPT_ENOMEM;
    int rc = tree ? torch_open_tree(f, tree, path) : torch_open(f, path);
    if (!rc) {
        close(f->fd); /* read by path later: a save has many rank files */
        f->fd = -1;
        rc = ckpt_checkpoint_from_files(ck, path, f, 1);
    }
    free(f);
    return rc;
}

bool nxd_expert_param(const nxd_ckpt *c, int pp, const char *name)
{
    const nxd_rank *r = nxd_rank_at(c, pp, 0, 0);
    if (r->ep_params && json_object_size(r->ep_params)) return json_object_get(r->ep_params, name) != NULL;
    return c->has_ep && strstr(name, "expert_mlps") != NULL;
}

static int open_ranks(nxd_ckpt *c, const char *model)
{
    size_t n = (size_t)c->tp * (size_t)c->pp * (size_t)c->ep;
    c->ranks = ckpt_calloc(n, sizeof *c->ranks);
    if (!c->ranks) return CKPT_ENOMEM;
    int rc = 0;
    for (int s = 0; !rc && s < c->pp; s++)
        for (int e = 0; !rc && e < c->ep; e++)
            for (int t = 0; !rc && t < c->tp; t++) {
                nxd_rank *r = nxd_rank_at(c, s, e, t);
                r->tp = t, r->pp = s, r->ep = e;
                char *name = rank_file_name(e, c->has_ep, t, s);
                r->path = name ? ckpt_path_join(model, name) : NULL;
                free(name);
                if (!r->path) return CKPT_ENOMEM;
                if (!ckpt_exists(r->path))
                    return ckpt_error_set(CKPT_ENOTFOUND, "%s: missing rank file (tp rank %d of %d, pp rank %d of %d%s)",
                                          r->path, t, c->tp, s, c->pp, c->has_ep ? ", an expert-parallel rank" : "");
                char *tdir = ckpt_sprintf("%s.tensors", r->path);
                if (!tdir) return CKPT_ENOMEM;
                bool xser = ckpt_is_dir(tdir);
                free(tdir);
                if (s == 0 && e == 0 && t == 0) c->xser = xser;
                else if (xser != c->xser)
                    return ckpt_error_set(CKPT_EINVAL, "%s: %s while rank 0 is %s", r->path,
                                          xser ? "saved with xser" : "a plain torch.save", c->xser ? "xser" : "a plain torch.save");
                rc = xser ? open_xser_rank(r) : nxd_open_plain(&r->ck, r->path, NULL);
            }
    return rc;
}

int nxd_open(nxd_ckpt *c, const char *dir)
{
    memset(c, 0, sizeof *c);
    char *s = ckpt_path_join(dir, "shards"), *as = ckpt_path_join(dir, "adapter_shards");
    if (!s || !as) {
        free(s);
        free(as);
        return CKPT_ENOMEM;
    }
    c->adapter = !ckpt_is_dir(s) && ckpt_is_dir(as);
    if (c->adapter) {
        /* an optimum-neuron PEFT save: SAVE/adapter_<name>/adapter_shards (peft_model.py) */
        free(s);
        s = as, as = NULL;
    }
    free(as);
    if (ckpt_is_dir(s)) {
        c->shards = s;
        c->root = ckpt_strdup(dir);
    } else {
        free(s);
        c->shards = ckpt_strdup(dir);
        /* shards/ given alone: its parent holds config.json when it is a save folder */
        char *parent = ckpt_path_join(dir, "..");
        char *cfg = parent ? ckpt_path_join(parent, "config.json") : NULL;
        c->adapter = !strcmp(ckpt_basename(dir), "adapter_shards");
        char *acfg = c->adapter && parent ? ckpt_path_join(parent, "adapter_config.json") : NULL;
        if (cfg && ckpt_exists(cfg) && !strcmp(ckpt_basename(dir), "shards")) c->root = parent, parent = NULL;
        else if (acfg && ckpt_exists(acfg)) c->root = parent, parent = NULL; /* adapter_<name>, beside adapter_config.json */
        free(acfg);
        free(parent);
        free(cfg);
    }
    char *done = c->shards ? ckpt_path_join(c->shards, "done") : NULL;
    char *model = c->shards ? ckpt_path_join(c->shards, "model") : NULL;
    char *optim = c->shards ? ckpt_path_join(c->shards, "optim") : NULL;
    int rc = done && model && optim ? 0 : CKPT_ENOMEM;
    if (!rc && !ckpt_exists(done))
        rc = ckpt_error_set(CKPT_EINVAL,
                            "%s: no 'done' marker: neuronx-distributed writes it after every rank finished saving "
                            "(CheckpointIOState.end), so this save is incomplete",
                            c->shards);
    if (!rc && !ckpt_is_dir(model)) rc = ckpt_error_set(CKPT_ENOTFOUND, "%s: no model/ folder of rank files", c->shards);
    if (!rc) c->has_optim = ckpt_is_dir(optim);
    if (!rc) rc = scan_model_dir(c, model);
    int want_tp = 0, want_pp = 0;
    if (!rc) rc = load_meta(c);
    if (!rc) rc = expected_degrees(c, &want_tp, &want_pp);
    if (!rc && want_pp > c->pp) {
        char *name = rank_file_name(0, c->has_ep, 0, c->pp);
        rc = ckpt_error_set(CKPT_ENOTFOUND, "%s/%s: missing rank file (trn_config.json says pipeline_parallel_size %d)", model,
                            name ? name : "?", want_pp);
        free(name);
    }
    if (!rc && want_tp > c->tp) {
        char *name = rank_file_name(0, c->has_ep, c->tp, 0);
        rc = ckpt_error_set(CKPT_ENOTFOUND, "%s/%s: missing rank file (the metadata and trn_config.json say tp %d)", model,
                            name ? name : "?", want_tp);
        free(name);
    }
    if (!rc) rc = open_ranks(c, model);
    free(done);
    free(model);
    free(optim);
    if (rc) nxd_close(c);
    return rc;
}

void nxd_close(nxd_ckpt *c)
{
    size_t n = (size_t)c->tp * (size_t)c->pp * (size_t)c->ep;
    for (size_t i = 0; c->ranks && i < n; i++) {
        ckpt_checkpoint_close(&c->ranks[i].ck);
        free(c->ranks[i].path);
        json_decref(c->ranks[i].ep_params);
    }
    free(c->ranks);
    for (int s = 0; c->meta && s < c->pp; s++) json_decref(c->meta[s]);
    for (int s = 0; c->meta_paths && s < c->pp; s++) free(c->meta_paths[s]);
    free(c->meta);
    free(c->meta_paths);
    free(c->shards);
    free(c->root);
    memset(c, 0, sizeof *c);
}

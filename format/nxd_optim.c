/*
 * nxd_optim.c — the optimizer files of a neuronx-distributed save
 * (nxd_optim.h). Follows neuronx-distributed's trainer/checkpoint.py
 * (save_checkpoint, _get_path, _save, _xser_save_data), torch's
 * Optimizer.state_dict and torch_xla's ZeroRedundancyOptimizer.state_dict.
 */
#include "format/nxd_optim.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"
#include "format/torch.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

nxd_optim_rank *nxd_optim_at(const nxd_optim *o, int pp, int tp, int dp)
{
    return &o->ranks[((size_t)pp * (size_t)o->tp + (size_t)tp) * (size_t)o->dp + (size_t)dp];
}

static int cmp_ps(const void *a, const void *b)
{
    int64_t x = ((const nxd_pstate *)a)->idx, y = ((const nxd_pstate *)b)->idx;
    return x < y ? -1 : x > y;
}

const nxd_pstate *nxd_optim_state(const nxd_optim_rank *r, int64_t idx)
{
    nxd_pstate key = {.idx = idx};
    return bsearch(&key, r->ps, r->nps, sizeof *r->ps, cmp_ps);
}

/* The degrees of the files in optim/: dp from the names (ZeRO-1 writes one per dp rank). */
static int scan_optim(nxd_optim *o, const nxd_ckpt *c)
{
    DIR *d = opendir(o->dir);
    if (!d) return ckpt_error_sys("%s: open", o->dir);
    int rc = 0, files = 0;
    struct dirent *e;
    o->dp = 1;
    while (!rc && (e = readdir(d))) {
        int dp, ep, tp, pp;
        bool has_ep;
        if (!nxd_parse_rank_name(e->d_name, &dp, &ep, &tp, &pp, &has_ep)) continue;
        if (has_ep)
            rc = ckpt_error_set(CKPT_EINVAL, "%s/%s: the optimizer of an expert-parallel save (_get_path(ep=True)) is not read",
                                o->dir, e->d_name);
        else if (tp >= c->tp || pp >= c->pp)
            rc = ckpt_error_set(CKPT_EINVAL, "%s/%s: tp rank %d, pp rank %d, but the model has %d tp and %d pp ranks", o->dir,
                                e->d_name, tp, pp, c->tp, c->pp);
        if (dp + 1 > o->dp) o->dp = dp + 1;
        files++;
    }
    closedir(d);
    if (!rc && !files) rc = ckpt_error_set(CKPT_ENOTFOUND, "%s: no dp_rank_XX_tp_rank_XX_pp_rank_XX.pt optimizer files", o->dir);
    return rc;
}

/* The key of a state entry: a parameter index below nparams. */
static int state_index(const pk_node *k, int64_t nparams, const char *path, const char *what, int64_t *out)
{
    if (k->kind != PK_INT || k->s || k->i < 0 || k->i >= nparams)
        return ckpt_error_set(CKPT_EINVAL, "%s: a key of \"%s\" that is not a parameter index below %lld (the size of param_groups)",
                              path, what, (long long)nparams);
    *out = k->i;
    return 0;
}

/* param_groups: their sizes, each group's "params" the next indices in order
 * (Optimizer.state_dict numbers the parameters of the groups from 0). */
static int read_groups(nxd_optim_rank *r, const pk_doc *d, const pk_node *root)
{
    const pk_node *g = pk_dict_get(d, root, "param_groups");
    if (!g || g->kind != PK_LIST || !g->n)
        return ckpt_error_set(CKPT_EINVAL, "%s: no \"param_groups\" list (not a torch optimizer's state_dict)", r->path);
    if (!(r->group_len = ckpt_calloc(g->n, sizeof *r->group_len))) return CKPT_ENOMEM;
    r->ngroups = g->n;
    for (size_t k = 0; k < g->n; k++) {
        const pk_node *params = pk_dict_get(d, pk_item(d, g, k), "params");
        if (!params || params->kind != PK_LIST)
            return ckpt_error_set(CKPT_EINVAL, "%s: param_groups[%zu] has no \"params\" list", r->path, k);
        for (size_t i = 0; i < params->n; i++) {
            const pk_node *x = pk_item(d, params, i);
            if (x->kind != PK_INT || x->s || x->i != r->nparams)
                return ckpt_error_set(CKPT_EINVAL, "%s: param_groups[%zu][\"params\"][%zu] is not %lld (Optimizer.state_dict numbers "
                                      "the parameters of the groups in order)", r->path, k, i, (long long)r->nparams);
            r->nparams++;
        }
        r->group_len[k] = (int64_t)params->n;
    }
    /* "param_names" in every group, one name a parameter: kept */
    for (size_t k = 0; k < g->n; k++) {
        const pk_node *names = pk_dict_get(d, pk_item(d, g, k), "param_names");
        if (!names) return 0;
        if (names->kind != PK_LIST || (int64_t)names->n != r->group_len[k])
            return ckpt_error_set(CKPT_EINVAL, "%s: param_groups[%zu][\"param_names\"] is not a list of its %lld parameters' names", r->path,
                                  k, (long long)r->group_len[k]);
    }
    if (!(r->param_names = ckpt_calloc((size_t)r->nparams + 1, sizeof *r->param_names))) return CKPT_ENOMEM;
    for (size_t k = 0, i = 0; k < g->n; k++) {
        const pk_node *names = pk_dict_get(d, pk_item(d, g, k), "param_names");
        for (size_t q = 0; q < names->n; q++, i++) {
            const pk_node *x = pk_item(d, names, q);
            if (x->kind != PK_STR || !x->slen || x->slen > ST_MAX_NAME || strlen(x->s) != x->slen)
                return ckpt_error_set(CKPT_EINVAL, "%s: param_groups[%zu][\"param_names\"][%zu] is not a parameter name", r->path, k, q);
            if (!(r->param_names[i] = ckpt_strdup(x->s))) return CKPT_ENOMEM;
        }
    }
    return 0;
}

/* A ZeRO-1 shape_info entry: torch.Size (a tuple of sizes). */
static int read_shape(nxd_pstate *ps, const pk_doc *d, const pk_node *sh, const char *path)
{
    if (!sh || sh->kind != PK_TUPLE || sh->n > CKPT_MAX_RANK)
        return ckpt_error_set(CKPT_EINVAL, "%s: shape_info[%lld] is not a torch.Size", path, (long long)ps->idx);
    for (size_t a = 0; a < sh->n; a++) {
        const pk_node *x = pk_item(d, sh, a);
        if (x->kind != PK_INT || x->s || x->i < 0 || x->i > (int64_t)1 << 40)
            return ckpt_error_set(CKPT_EINVAL, "%s: shape_info[%lld] is not a tuple of sizes", path, (long long)ps->idx);
        ps->shape[a] = (uint64_t)x->i;
    }
    ps->ndim = (int)sh->n;
    ps->has_shape = true;
    return 0;
}

/* The parameters' slots: "state" (or, ZeRO-1, "base_state") {index: {slot: tensor or number}}. */
static int read_states(nxd_optim_rank *r, const pk_doc *d, const pk_node *root, bool zero1)
{
    const char *key = zero1 ? "base_state" : "state";
    const pk_node *st = pk_dict_get(d, root, key), *shapes = zero1 ? pk_dict_get(d, root, "shape_info") : NULL;
    if (!st || st->kind != PK_DICT) return ckpt_error_set(CKPT_EINVAL, "%s: no \"%s\" dict", r->path, key);
    if (zero1 && (!shapes || shapes->kind != PK_DICT))
        return ckpt_error_set(CKPT_EINVAL, "%s: a ZeRO-1 state (base_state) without its \"shape_info\" dict", r->path);
    if (!(r->ps = ckpt_calloc(st->n / 2 + 1, sizeof *r->ps))) return CKPT_ENOMEM;
    int rc = 0;
    for (size_t k = 0; !rc && k + 1 < st->n; k += 2) {
        nxd_pstate *ps = &r->ps[r->nps];
        const pk_node *slots = pk_item(d, st, k + 1);
        if ((rc = state_index(pk_item(d, st, k), r->nparams, r->path, key, &ps->idx))) break;
        if (slots->kind != PK_DICT) {
            rc = ckpt_error_set(CKPT_EINVAL, "%s: %s[%lld] is not a dict of slots", r->path, key, (long long)ps->idx);
            break;
        }
        ps->first = r->nslots;
        for (size_t s = 0; !rc && s + 1 < slots->n; s += 2) {
            const pk_node *sk = pk_item(d, slots, s), *sv = pk_item(d, slots, s + 1);
            if (sk->kind != PK_STR || !sk->slen || sk->slen > NXD_MAX_SLOT_NAME || strlen(sk->s) != sk->slen || strchr(sk->s, '/') ||
                strchr(sk->s, '.')) {
                rc = ckpt_error_set(CKPT_EINVAL, "%s: %s[%lld]: a slot name that is not a short name without '/' or '.'", r->path,
                                    key, (long long)ps->idx);
                break;
            }
            if (ckpt_grow(&r->slots, &r->cap_slots, r->nslots + 1, sizeof *r->slots)) {
                rc = CKPT_ENOMEM;
                break;
            }
            nxd_oslot *o = &r->slots[r->nslots];
            memset(o, 0, sizeof *o);
            if (!(o->name = ckpt_strdup(sk->s))) {
                rc = CKPT_ENOMEM;
                break;
            }
            r->nslots++;
            char tname[64 + NXD_MAX_SLOT_NAME];
            snprintf(tname, sizeof tname, "%s.%lld.%s", key, (long long)ps->idx, sk->s);
            o->t = ckpt_checkpoint_find(&r->ck, tname);
            if (o->t) continue;
            if (sv->kind == PK_INT && !sv->s) o->value = (double)sv->i;
            else if (sv->kind == PK_FLOAT) o->value = sv->f;
            else
                rc = ckpt_error_set(CKPT_EINVAL, "%s: %s[%lld]['%s'] is a %s, neither a tensor nor a number", r->path, key,
                                    (long long)ps->idx, sk->s, pk_kind_name(sv->kind));
        }
        ps->n = r->nslots - ps->first;
        if (!rc && zero1) {
            const pk_node *sh = NULL;
            for (size_t q = 0; q + 1 < shapes->n; q += 2)
                if (pk_item(d, shapes, q)->kind == PK_INT && pk_item(d, shapes, q)->i == ps->idx) sh = pk_item(d, shapes, q + 1);
            rc = read_shape(ps, d, sh, r->path);
        }
        if (!rc) r->nps++;
    }
    if (rc) return rc;
    qsort(r->ps, r->nps, sizeof *r->ps, cmp_ps);
    for (size_t i = 1; i < r->nps; i++)
        if (r->ps[i].idx == r->ps[i - 1].idx)
            return ckpt_error_set(CKPT_EINVAL, "%s: %s holds index %lld twice", r->path, key, (long long)r->ps[i].idx);
    return 0;
}

/* The TensorReference records of an xser file: every one in a dict at any
 * depth, its tensor file opened under the joined key path. */
typedef struct {
    const char *path, *tdir;
    const pk_doc *d;
    st_file *files;
    size_t n, cap;
} xwalk;

static int xser_walk(xwalk *w, const pk_node *dict, const char *prefix, int depth)
{
    if (depth > 4) return ckpt_error_set(CKPT_EINVAL, "%s: dicts nested deeper than an optimizer's state_dict", w->path);
    for (size_t k = 0; k + 1 < dict->n; k += 2) {
        const pk_node *key = pk_item(w->d, dict, k), *val = pk_item(w->d, dict, k + 1);
        if (val->kind != PK_DICT && val->kind != PK_OBJ) continue;
        char name[ST_MAX_NAME + 1];
        if (key->kind == PK_STR && key->slen && key->slen <= NXD_MAX_SLOT_NAME && strlen(key->s) == key->slen)
            snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", key->s);
        else if (key->kind == PK_INT && !key->s && key->i >= 0)
            snprintf(name, sizeof name, "%s%s%lld", prefix, *prefix ? "." : "", (long long)key->i);
        else
            return ckpt_error_set(CKPT_EINVAL, "%s: a key under '%s' that is neither a name nor an index", w->path, prefix);
        if (val->kind == PK_DICT) {
            int rc = xser_walk(w, val, name, depth + 1);
            if (rc) return rc;
            continue;
        }
        /* a TensorReference(tid): torch.save of the tensor in <file>.pt.tensors/tensor_<tid>.pt */
        int64_t tid;
        int rc = nxd_xser_tid(w->d, val, w->path, name, &tid);
        if (rc) return rc;
        if (ckpt_grow(&w->files, &w->cap, w->n + 1, sizeof *w->files)) return CKPT_ENOMEM;
        char *tpath = ckpt_sprintf("%s/tensor_%lld.pt", w->tdir, (long long)tid);
        if (!tpath) return CKPT_ENOMEM;
        rc = ckpt_exists(tpath) ? torch_open_tensor(&w->files[w->n], tpath, name)
                                : ckpt_error_set(CKPT_ENOTFOUND, "%s: '%s': its tensor file %s is missing", w->path, name, tpath);
        free(tpath);
        if (rc) return rc;
        close(w->files[w->n].fd); /* read by path later */
        w->files[w->n++].fd = -1;
    }
    return 0;
}

static int open_rank(nxd_optim_rank *r, bool xser, pk_doc *d)
{
    if (!xser) return nxd_open_plain(&r->ck, r->path, d);
    size_t nallow;
    const pk_global_def *allow = nxd_xser_allow(&nallow);
    int rc = torch_load_pickle(d, r->path, allow, nallow);
    if (rc) return rc;
    char *tdir = ckpt_sprintf("%s.tensors", r->path);
    if (!tdir) return CKPT_ENOMEM;
    xwalk w = {.path = r->path, .tdir = tdir, .d = d};
    const pk_node *root = pk_at(d, d->root);
    rc = root->kind == PK_DICT ? xser_walk(&w, root, "", 0)
                               : ckpt_error_set(CKPT_EINVAL, "%s: holds a %s, not an optimizer's state_dict", r->path,
                                                pk_kind_name(root->kind));
    if (!rc) rc = ckpt_checkpoint_from_files(&r->ck, r->path, w.files, w.n);
    else
        for (size_t k = 0; k < w.n; k++) st_close(&w.files[k]);
    free(w.files);
    free(tdir);
    return rc;
}

static int read_rank(nxd_optim *o, nxd_optim_rank *r, bool first)
{
    char *tdir = ckpt_sprintf("%s.tensors", r->path);
    if (!tdir) return CKPT_ENOMEM;
    bool xser = ckpt_is_dir(tdir);
    free(tdir);
    if (first) o->xser = xser;
    else if (xser != o->xser)
        return ckpt_error_set(CKPT_EINVAL, "%s: %s while the first optimizer file is %s", r->path, xser ? "xser" : "a plain torch.save",
                              o->xser ? "xser" : "a plain torch.save");
    pk_doc d;
    memset(&d, 0, sizeof d);
    int rc = open_rank(r, xser, &d);
    const pk_node *root = rc ? NULL : pk_at(&d, d.root);
    if (!rc && root->kind != PK_DICT) rc = ckpt_error_set(CKPT_EINVAL, "%s: not an optimizer's state_dict", r->path);
    bool zero1 = !rc && pk_dict_get(&d, root, "base_state") != NULL;
    if (!rc && first) o->zero1 = zero1;
    else if (!rc && zero1 != o->zero1)
        rc = ckpt_error_set(CKPT_EINVAL, "%s: %s while the first optimizer file is %s", r->path,
                            zero1 ? "a ZeRO-1 state (base_state)" : "a plain optimizer state", o->zero1 ? "ZeRO-1" : "plain");
    if (!rc) rc = read_groups(r, &d, root);
    if (!rc) rc = read_states(r, &d, root, zero1);
    if (!rc) r->master_weights = pk_dict_get(&d, root, "sharded_master_weights") != NULL;
    pk_free(&d);
    return rc;
}

int nxd_optim_open(nxd_optim *o, const nxd_ckpt *c)
{
    memset(o, 0, sizeof *o);
    o->tp = c->tp;
    o->pp = c->pp;
    if (!(o->dir = ckpt_path_join(c->shards, "optim"))) return CKPT_ENOMEM;
    if (!ckpt_is_dir(o->dir))
        return ckpt_error_set(CKPT_ENOTFOUND, "%s: no optimizer here (the save was made without one, or with save_only_model)", o->dir);
    int rc = scan_optim(o, c);
    if (rc) return rc;
    size_t n = (size_t)o->pp * (size_t)o->tp * (size_t)o->dp;
    if (!(o->ranks = ckpt_calloc(n, sizeof *o->ranks))) return CKPT_ENOMEM;
    for (int s = 0; !rc && s < o->pp; s++)
        for (int t = 0; !rc && t < o->tp; t++)
            for (int p = 0; !rc && p < o->dp; p++) {
                nxd_optim_rank *r = nxd_optim_at(o, s, t, p);
                r->dp = p, r->tp = t, r->pp = s;
                char name[96];
                snprintf(name, sizeof name, "dp_rank_%02d_tp_rank_%02d_pp_rank_%02d.pt", p, t, s);
                if (!(r->path = ckpt_path_join(o->dir, name))) return CKPT_ENOMEM;
                if (!ckpt_exists(r->path))
                    return ckpt_error_set(CKPT_ENOTFOUND, "%s: missing optimizer file (dp rank %d of %d, tp rank %d, pp rank %d)",
                                          r->path, p, o->dp, t, s);
                rc = read_rank(o, r, s == 0 && t == 0 && p == 0);
            }
    if (!rc && o->dp > 1 && !o->zero1)
        rc = ckpt_error_set(CKPT_EINVAL, "%s: files of %d data-parallel ranks, but no ZeRO-1 state (base_state) in them", o->dir, o->dp);
    return rc;
}

void nxd_optim_close(nxd_optim *o)
{
    size_t n = o->ranks ? (size_t)o->pp * (size_t)o->tp * (size_t)o->dp : 0;
    for (size_t i = 0; i < n; i++) {
        nxd_optim_rank *r = &o->ranks[i];
        free(r->path);
        ckpt_checkpoint_close(&r->ck);
        for (int64_t k = 0; r->param_names && k < r->nparams; k++) free(r->param_names[k]);
        free(r->param_names);
        free(r->group_len);
        free(r->ps);
        for (size_t k = 0; k < r->nslots; k++) free(r->slots[k].name);
        free(r->slots);
    }
    free(o->ranks);
    free(o->dir);
    memset(o, 0, sizeof *o);
}

/* nxd_import.c — a neuronx-distributed training save to Hugging Face (nxd_import.h). */
#include "transform/nxd_import.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "format/nxd.h"
#include "format/nxd_optim.h"
#include "lora/lora.h"
#include "transform/consolidate.h"
#include "transform/rules.h"
#include "transform/state_convert.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

typedef struct {
    nxd_ckpt c;
    exec_plan exec;
    size_t *first;     /* per (pp, ep, tp) rank file: the index of its first plan source (first_source) */
    plan_tensor *orig; /* the original tensors of every stage */
    size_t norig, cap;
    json_t *names;     /* their names (a set), to catch one in two stages */
    char *adapter;     /* a PEFT adapter save: the adapter's name ("default"), else NULL */
} nxd_job;

/* One pipeline stage being planned. */
typedef struct {
    int pp;
    const char *what;  /* its metadata file */
    plan_source *v;    /* its original tensors, as the sources of the forward rules */
    size_t nv, capv;
    json_t *rules;     /* the forward rules: how the training model shards them */
    json_t *consumed;  /* rank parameters a spec accounts for (object used as a set) */
    json_t *copies;    /* original name -> the replicated rank tensor it is a copy of (a fused LoRA's lora_A) */
    json_t *experts;   /* expert-parallel parameter -> its experts per ep rank (axis 0 of the rank tensor) */
} stage;

static char *re_escape(const char *s)
{
    size_t n = strlen(s);
    char *o = ckpt_malloc(2 * n + 1), *p = o;
    if (!o) return NULL;
    for (; *s; s++) {
        if (strchr("\\^$.|?*+()[]{}", *s)) *p++ = '\\';
        *p++ = *s;
    }
    *p = 0;
    return o;
}

/* True when metadata name `param`, saved as `saved` (nxd_saved_name), is a
 * LoRA parameter of `adapter`: the component remove_adapter_name dropped is
 * the adapter's name (get_adapter_name of transformations_utils.py). */
static size_t dropped_component(const char *param, const char *saved, size_t *len)
{
    size_t i = 0, dropped = strlen(param) - strlen(saved);
    *len = dropped ? dropped - 1 : 0; /* "<adapter>." went */
    if (!dropped) return 0;
    while (param[i] && param[i] == saved[i]) i++;
    while (i && param[i - 1] != '.') i--; /* the first difference can lie inside it ("w." before "weight") */
    return i;
}

static bool of_adapter(const char *param, const char *saved, const char *adapter)
{
    size_t len, at = dropped_component(param, saved, &len);
    return len && len == strlen(adapter) && !strncmp(param + at, adapter, len);
}

static size_t *first_source(const nxd_job *j, int pp, int ep, int tp)
{
    return &j->first[((size_t)pp * (size_t)j->c.ep + (size_t)ep) * (size_t)j->c.tp + (size_t)tp];
}

static const st_tensor *rank_tensor(const nxd_job *j, int pp, int tp, const char *name)
{
    const ckpt_tensor_ref *r = ckpt_checkpoint_find(&nxd_rank_at(&j->c, pp, 0, tp)->ck, name);
    return r ? r->t : NULL;
}

/* Rank 0's tensor of a parameter the metadata names; an error when it is missing. */
static int need_tensor(const nxd_job *j, const stage *st, const char *name, const st_tensor **out)
{
    *out = rank_tensor(j, st->pp, 0, name);
    if (*out) return 0;
    return ckpt_error_set(CKPT_ENOTFOUND, "%s: parameter '%s' (of %s) is not in this rank file",
                          nxd_rank_at(&j->c, st->pp, 0, 0)->path, name, st->what);
}

static int add_orig(stage *st, const char *name, ckpt_dtype dt, int ndim, const uint64_t *shape)
{
    if (ckpt_grow(&st->v, &st->capv, st->nv + 1, sizeof *st->v)) return CKPT_ENOMEM;
    plan_source *s = &st->v[st->nv];
    memset(s, 0, sizeof *s);
    if (!(s->name = ckpt_strdup(name))) return CKPT_ENOMEM;
    s->dtype = dt;
    s->ndim = ndim;
    memcpy(s->shape, shape, (size_t)ndim * sizeof *shape);
    st->nv++;
    return 0;
}

static int add_rule(stage *st, json_t *r)
{
    if (!r || json_array_append_new(st->rules, r)) return ckpt_error_set(CKPT_ENOMEM, "out of memory building rules");
    return 0;
}

static int consume(stage *st, const char *name) { return json_object_set_new(st->consumed, name, json_true()) ? CKPT_ENOMEM : 0; }

static int spec_int(const json_t *f, const char *key, int64_t *v, const stage *st, const char *mod)
{
    json_t *x = json_object_get(f, key);
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > (1 << 30))
        return ckpt_error_set(CKPT_EINVAL, "%s: spec of '%s': '%s' is not a size", st->what, mod, key);
    *v = json_integer_value(x);
    return 0;
}

static int spec_str(const json_t *f, const char *key, const char **v, const stage *st, const char *mod)
{
    *v = json_string_value(json_object_get(f, key));
    if (!*v || !**v || strchr(*v, '.') || strlen(*v) > 256)
        return ckpt_error_set(CKPT_EINVAL, "%s: spec of '%s': '%s' is not a module name", st->what, mod, key);
    return 0;
}

/* The metadata name of the adapter's LoRA parameter "<mod>.<proj>.lora_<AB>.<adapter>.<leaf>". */
static bool has_lora_param(const nxd_job *j, const stage *st, const char *mod, const char *proj, char ab, const char *leaf)
{
    char *n = ckpt_sprintf("%s.%s.lora_%c.%s.%s", mod, proj, ab, j->adapter, leaf);
    bool got = n && json_object_get(json_object_get(j->c.meta[st->pp], "parameters"), n);
    free(n);
    return got;
}

/* A fused LoRA's lora_A (replicated, `<mod>.<fused>.lora_A.weight` in the
 * rank files) stands for the lora_A of every linear it fuses: the
 * _lora_to_original_weights of both specs give each member a copy of rank 0's
 * (ckpt also checks every rank's copy equal). */
static int lora_a_copies(const nxd_job *j, stage *st, const char *mod, const char *fused, const char *const *members, size_t n)
{
    char name[ST_MAX_NAME + 64], orig[ST_MAX_NAME + 64];
    const st_tensor *a;
    if (!has_lora_param(j, st, mod, fused, 'A', "weight"))
        return ckpt_error_set(CKPT_EINVAL, "%s: '%s.%s' is a LoRA module (peft_type lora) without a lora_A.%s.weight parameter",
                              st->what, mod, fused, j->adapter);
    snprintf(name, sizeof name, "%s.%s.lora_A.weight", mod, fused);
    int rc = need_tensor(j, st, name, &a);
    for (size_t i = 0; !rc && i < n; i++) {
        snprintf(orig, sizeof orig, "%s.%s.lora_A.weight", mod, members[i]);
        if (json_object_set_new(st->copies, orig, json_string(name))) rc = CKPT_ENOMEM;
    }
    return rc ? rc : consume(st, name);
}

/* GQAQKVColumnParallelLinearSpec (transformations_utils.py): q/k/v/o of one
 * attention module, the query heads placed by compute_query_indices_for_rank
 * and the KV heads tiled kv_size_multiplier times — fuse_qkv_gqa's placement
 * (docs/transforms.md §4) with no query-head padding. */
static int spec_gqa(const nxd_job *j, stage *st, const char *mod, const json_t *f, bool lora)
{
    const char *P, *qn, *kn, *vn, *on;
    int64_t H, KV, m, qout, kvout, tps, tp = j->c.tp;
    int rc = 0;
    if ((rc = spec_str(f, "gqa_qkv_projection_name", &P, st, mod)) || (rc = spec_str(f, "query_projection_name", &qn, st, mod)) ||
        (rc = spec_str(f, "key_projection_name", &kn, st, mod)) || (rc = spec_str(f, "value_projection_name", &vn, st, mod)) ||
        (rc = spec_str(f, "output_projection_name", &on, st, mod)) || (rc = spec_int(f, "num_attention_heads", &H, st, mod)) ||
        (rc = spec_int(f, "num_key_value_heads", &KV, st, mod)) || (rc = spec_int(f, "kv_size_multiplier", &m, st, mod)) ||
        (rc = spec_int(f, "q_output_size_per_partition", &qout, st, mod)) ||
        (rc = spec_int(f, "kv_output_size_per_partition", &kvout, st, mod)) || (rc = spec_int(f, "tp_size", &tps, st, mod)))
        return rc;
    bool fused = json_is_true(json_object_get(f, "fuse_qkv")), bias = json_is_true(json_object_get(f, "bias"));
    /* _to_original_weights reshapes every q/k/v/o parameter as [heads, head_dim, hidden]: a 1-D bias fails there, so
     * optimum-neuron cannot consolidate one either, and its layout is not settled */
    if (bias)
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: spec of '%s': a GQAQKVColumnParallelLinearSpec with biases (optimum-neuron's "
                              "to_original_weights cannot undo it either) is not supported",
                              st->what, mod);
    if (tps != tp)
        return ckpt_error_set(CKPT_EINVAL, "%s: spec of '%s': tp_size %lld, but the save has %lld tensor-parallel ranks", st->what,
                              mod, (long long)tps, (long long)tp);
    if (!H || !KV || KV > H || H % KV || !m || m > tp || tp % m)
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: spec of '%s': %lld query heads, %lld KV heads and kv_size_multiplier %lld do not fit tp %lld "
                              "(neuronx-distributed's GQAQKVColumnParallelLinear asserts tp %% kv_size_multiplier == 0)",
                              st->what, mod, (long long)H, (long long)KV, (long long)m, (long long)tp);
    if ((qout * tp) % H || !qout)
        return ckpt_error_set(CKPT_EINVAL, "%s: spec of '%s': q_output_size_per_partition %lld x tp %lld is not a multiple of %lld heads",
                              st->what, mod, (long long)qout, (long long)tp, (long long)H);
    int64_t hd = qout * tp / H;
    /* A LoRA of the GQA linear (_lora_to_original_weights): its lora_B is
     * sharded as the base weight is (qkv_proj.lora_B.weight_qkv, or
     * .weight_q/_k/_v), the o_proj's lora_A, when o_proj has an adapter, as
     * o_proj's columns; so the same rule places them, under those names. */
    char lP[300], lq[300], lk[300], lv[300], lo[300];
    if (lora) {
        const char *members[3] = {qn, kn, vn};
        if ((rc = lora_a_copies(j, st, mod, P, members, 3))) return rc;
        snprintf(lP, sizeof lP, "%s.lora_B", P);
        snprintf(lq, sizeof lq, "%s.lora_B", qn);
        snprintf(lk, sizeof lk, "%s.lora_B", kn);
        snprintf(lv, sizeof lv, "%s.lora_B", vn);
        if (has_lora_param(j, st, mod, on, 'A', "weight")) snprintf(lo, sizeof lo, "%s.lora_A", on);
        else lo[0] = 0;
        P = lP, qn = lq, kn = lk, vn = lv, on = lo;
    }
    if (kvout * tp != KV * m * hd)
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: spec of '%s': kv_output_size_per_partition %lld is not %lld KV heads x multiplier %lld x "
                              "head_dim %lld / tp %lld",
                              st->what, mod, (long long)kvout, (long long)KV, (long long)m, (long long)hd, (long long)tp);
    char name[ST_MAX_NAME + 64];
    const st_tensor *w, *o = NULL;
    snprintf(name, sizeof name, "%s.%s.%s", mod, P, fused ? "weight_qkv" : "weight_q");
    if ((rc = need_tensor(j, st, name, &w))) return rc;
    snprintf(name, sizeof name, "%s.%s.weight", mod, on);
    if (*on && (rc = need_tensor(j, st, name, &o))) return rc;
    if (w->ndim != 2 || (o && o->ndim != 2))
        return ckpt_error_set(CKPT_EINVAL, "%s: '%s': the q/k/v and output projections are not 2-D", st->what, mod);
    uint64_t hid = w->shape[1], qd = (uint64_t)(H * hd), kvd = (uint64_t)(KV * hd);
    const char *proj[3] = {qn, kn, vn};
    for (int i = 0; i < 3 && !rc; i++) {
        uint64_t sh[2] = {i ? kvd : qd, hid};
        snprintf(name, sizeof name, "%s.%s.weight", mod, proj[i]);
        rc = add_orig(st, name, w->dtype, 2, sh);
    }
    if (o) {
        uint64_t osh[2] = {o->shape[0], qd};
        snprintf(name, sizeof name, "%s.%s.weight", mod, on);
        if (!rc) rc = add_orig(st, name, o->dtype, 2, osh);
        if (!rc) rc = consume(st, name);
    }
    char *emod = re_escape(mod), *eq = re_escape(qn);
    json_t *r = NULL;
    char *pat = emod && eq ? ckpt_sprintf("^(%s)\\.%s\\.weight$", emod, eq) : NULL;
    if (pat) {
        r = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:b, s:b, s:I, s:I, s:I, s:I, s:I}", "op", "fuse_qkv_gqa",
                      "pattern", pat, "q", qn, "k", kn, "v", vn, "o", on, "output", P, "weight_name", "weight_qkv", "bias_name",
                      "bias_qkv", "fused", fused, "pad_heads", 0, "tp", (json_int_t)tp, "num_attention_heads", (json_int_t)H,
                      "num_key_value_heads", (json_int_t)KV, "head_dim", (json_int_t)hd, "kv_size_multiplier", (json_int_t)m);
    }
    free(pat);
    if (!rc) rc = add_rule(st, r);
    else json_decref(r);
    /* unfused: GQAQKVColumnParallelLinear's own names, weight_q/_k/_v */
    static const char *const sfx[3] = {"q", "k", "v"};
    for (int i = 0; i < 3 && !rc; i++) {
        if (fused) break;
        char *ep = re_escape(proj[i]);
        char *rpat = ep && emod ? ckpt_sprintf("^(%s)\\.%s\\.weight$", emod, ep) : NULL;
        char *rep = ckpt_sprintf("$1.%s.weight_%s", P, sfx[i]);
        rc = rpat && rep ? add_rule(st, json_pack("{s:s, s:s, s:s}", "op", "rename", "pattern", rpat, "replacement", rep))
                         : CKPT_ENOMEM;
        free(ep);
        free(rpat);
        free(rep);
    }
    free(emod);
    free(eq);
    for (int i = fused ? 3 : 0; i < 4 && !rc; i++) {
        if (i == 3) snprintf(name, sizeof name, "%s.%s.weight_qkv", mod, P);
        else snprintf(name, sizeof name, "%s.%s.weight_%s", mod, P, sfx[i]);
        rc = consume(st, name);
    }
    return rc;
}

/* FusedLinearsSpec (transformations_utils.py): linears fused along fuse_axis
 * after each was split for tensor parallelism (create_local_fused_weight) —
 * the fuse op with tp (docs/transforms.md §3). */
static int spec_fused(const nxd_job *j, stage *st, const char *mod, const json_t *f, bool lora)
{
    const char *F;
    int64_t tps, axis = -1, tp = j->c.tp;
    int rc = spec_str(f, "fused_linear_name", &F, st, mod);
    if (!rc) rc = spec_int(f, "tp_size", &tps, st, mod);
    if (rc) return rc;
    json_t *fa = json_object_get(f, "fuse_axis"), *names = json_object_get(f, "linear_names"),
           *dims = json_object_get(f, "original_dims");
    const char *fas = json_string_value(fa);
    axis = json_is_integer(fa) ? json_integer_value(fa) : fas && !strcmp(fas, "column") ? 0 : fas && !strcmp(fas, "row") ? 1 : -1;
    size_t n = json_array_size(names);
    if (axis < 0 || axis > 1 || n < 1 || n > 16 || json_array_size(dims) != n)
        return ckpt_error_set(CKPT_EINVAL, "%s: spec of '%s': a FusedLinearsSpec needs fuse_axis 0 or 1 and one original dim per linear",
                              st->what, mod);
    if (tps != tp)
        return ckpt_error_set(CKPT_EINVAL, "%s: spec of '%s': tp_size %lld, but the save has %lld tensor-parallel ranks", st->what,
                              mod, (long long)tps, (long long)tp);
    bool bias = json_is_true(json_object_get(f, "bias"));
    /* A LoRA of the fused linear (_lora_to_original_weights): lora_A
     * replicated, one copy per member; lora_B fused and split as the base
     * weight is (create_local_fused_weight), so the same rule under
     * lora_B.weight. Upstream's row-parallel branch (fuse_axis 1) cannot run
     * (it never sets the name it unfuses), and a LoRA of fused biases has no
     * layout to follow. */
    if (lora && (axis != 0 || bias))
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: spec of '%s': a LoRA of a FusedLinearsSpec with %s is not supported (optimum-neuron's "
                              "_lora_to_original_weights cannot undo it either)",
                              st->what, mod, bias ? "biases" : "fuse_axis 1");
    if (lora) {
        const char *members[16];
        for (size_t i = 0; i < n; i++)
            if (!(members[i] = json_string_value(json_array_get(names, i))) || !*members[i] || strchr(members[i], '.'))
                return ckpt_error_set(CKPT_EINVAL, "%s: spec of '%s': linear %zu has no name", st->what, mod, i);
        if (!has_lora_param(j, st, mod, F, 'B', "weight"))
            return ckpt_error_set(CKPT_EINVAL, "%s: '%s.%s' is a LoRA module (peft_type lora) without a lora_B.%s.weight parameter",
                                  st->what, mod, F, j->adapter);
        int rc2 = lora_a_copies(j, st, mod, F, members, n);
        if (rc2) return rc2;
    }
    char name[ST_MAX_NAME + 64];
    char *emod = re_escape(mod);
    size_t alt_len = 1;
    for (size_t i = 0; i < n; i++) alt_len += 2 * strlen(json_string_value(json_array_get(names, i)) ?: "") + 1;
    char *alt = ckpt_calloc(alt_len + 1, 1);
    if (!emod || !alt) rc = CKPT_ENOMEM;
    for (int k = 0; k < 2 && !rc; k++) {
        if (k == 1 && !bias) break;
        const char *kind = k ? "bias" : lora ? "lora_B.weight" : "weight";
        const st_tensor *w;
        snprintf(name, sizeof name, "%s.%s.%s", mod, F, kind);
        if ((rc = need_tensor(j, st, name, &w))) break;
        int ax = k ? 0 : (int)axis;
        char *mname = lora ? ckpt_sprintf("%s.%s.lora_B.%s.weight", mod, F, j->adapter) : ckpt_strdup(name);
        if (!mname) {
            rc = CKPT_ENOMEM;
            break;
        }
        json_t *pm = json_object_get(json_object_get(json_object_get(j->c.meta[st->pp], "parameters"), mname), "partition_dim");
        free(mname);
        if (tp > 1 && (ax >= w->ndim || (json_is_integer(pm) && json_integer_value(pm) != ax))) {
            rc = ckpt_error_set(CKPT_EINVAL, "%s: '%s': fused along axis %d but split along partition_dim %lld (not supported)",
                                st->what, name, ax, (long long)json_integer_value(pm));
            break;
        }
        uint64_t sum = 0;
        alt[0] = 0;
        for (size_t i = 0; i < n && !rc; i++) {
            const char *ln = json_string_value(json_array_get(names, i));
            json_t *d = json_array_get(dims, i);
            if (!ln || !*ln || strchr(ln, '.') || !json_is_integer(d) || json_integer_value(d) <= 0 ||
                json_integer_value(d) > (1LL << 40) || json_integer_value(d) % tp) {
                rc = ckpt_error_set(CKPT_EINVAL, "%s: spec of '%s': linear %zu has no name or a dim that does not divide by tp %lld",
                                    st->what, mod, i, (long long)tp);
                break;
            }
            uint64_t sh[CKPT_MAX_RANK];
            memcpy(sh, w->shape, sizeof sh);
            sh[ax] = (uint64_t)json_integer_value(d);
            sum += sh[ax];
            snprintf(name, sizeof name, "%s.%s.%s", mod, ln, kind);
            rc = add_orig(st, name, w->dtype, w->ndim, sh);
            char *el = rc ? NULL : re_escape(ln);
            if (!rc && !el) rc = CKPT_ENOMEM;
            if (!rc) {
                if (i) strcat(alt, "|");
                strcat(alt, el);
            }
            free(el);
        }
        if (!rc && sum != w->shape[ax] * (uint64_t)tp)
            rc = ckpt_error_set(CKPT_EINVAL, "%s: '%s.%s.%s' has %llu rows on axis %d; the spec's original_dims make %llu / tp %lld",
                                st->what, mod, F, kind, (unsigned long long)w->shape[ax], ax, (unsigned long long)sum,
                                (long long)tp);
        if (rc) break;
        char *ekind = re_escape(kind);
        char *pat = ekind ? ckpt_sprintf("^(%s)\\.(%s)\\.%s$", emod, alt, ekind) : NULL, *out = ckpt_sprintf("$1.%s.%s", F, kind);
        free(ekind);
        rc = pat && out ? add_rule(st, json_pack("{s:s, s:s, s:O, s:s, s:i, s:I}", "op", "fuse", "pattern", pat, "members", names,
                                                 "output", out, "axis", ax, "tp", (json_int_t)tp))
                        : CKPT_ENOMEM;
        free(pat);
        free(out);
        snprintf(name, sizeof name, "%s.%s.%s", mod, F, kind);
        if (!rc) rc = consume(st, name);
    }
    free(emod);
    free(alt);
    return rc;
}

/* The other tensor-parallel parameters' tp_split rules, one per (axis, stride)
 * and at most SPLIT_NAMES names or SPLIT_PATTERN_MAX bytes (an alternation of
 * exact names; a rule's strings are at most 4096 bytes, rules_internal.h
 * RULE_NAME_MAX): a rule per parameter would match every rule against every
 * tensor. */
#define SPLIT_NAMES 256
#define SPLIT_PATTERN_MAX 4000
typedef struct {
    int axis;
    int64_t stride;
    char *alt; /* "a|b|c", escaped */
    size_t len, n;
} split_bucket;

static int flush_split(stage *st, split_bucket *b, int64_t tp)
{
    if (!b->n) return 0;
    char *pat = ckpt_sprintf("^(?:%s)$", b->alt);
    int rc = pat ? add_rule(st, json_pack("{s:s, s:s, s:i, s:I, s:I}", "op", "tp_split", "pattern", pat, "axis", b->axis, "tp",
                                          (json_int_t)tp, "stride", (json_int_t)b->stride))
                 : CKPT_ENOMEM;
    free(pat);
    free(b->alt);
    b->alt = NULL;
    b->len = b->n = 0;
    return rc;
}

static int add_split(stage *st, split_bucket *bs, size_t *nb, const char *name, int axis, int64_t stride, int64_t tp)
{
    split_bucket *b = NULL;
    for (size_t i = 0; i < *nb && !b; i++)
        if (bs[i].axis == axis && bs[i].stride == stride) b = &bs[i];
    if (!b) {
        if (*nb == CKPT_MAX_RANK * 4) { /* many strides: make room */
            int rc = flush_split(st, &bs[0], tp);
            if (rc) return rc;
            bs[0] = bs[--*nb];
        }
        b = &bs[(*nb)++];
        memset(b, 0, sizeof *b);
        b->axis = axis;
        b->stride = stride;
    }
    char *e = re_escape(name);
    size_t el = e ? strlen(e) : 0;
    int rc = e && b->n && b->len + el + 8 > SPLIT_PATTERN_MAX ? flush_split(st, b, tp) : 0;
    if (rc) {
        free(e);
        return rc;
    }
    char *alt = e ? ckpt_realloc(b->alt, b->len + el + 2) : NULL;
    if (!alt) {
        free(e);
        return CKPT_ENOMEM;
    }
    b->alt = alt;
    if (b->n) b->alt[b->len++] = '|';
    memcpy(b->alt + b->len, e, el + 1);
    b->len += el;
    free(e);
    return ++b->n == SPLIT_NAMES ? flush_split(st, b, tp) : 0;
}

/* The stage's specs, then its other parameters: the original tensors and the forward rules. */
static int plan_stage(const nxd_job *j, stage *st)
{
    const json_t *meta = j->c.meta[st->pp];
    size_t i, k;
    json_t *mod, *sp;
    int rc = 0;
    json_array_foreach(json_object_get(meta, "model_weight_transformation_specs"), i, mod)
    {
        const char *mname = json_string_value(json_object_get(mod, "module_fully_qualified_name"));
        if (!mname || strlen(mname) > ST_MAX_NAME - 512) /* room for ".<projection>.weight_qkv" */
            return ckpt_error_set(CKPT_EINVAL, "%s: a transformation spec without a module_fully_qualified_name (of at most %d bytes)",
                                  st->what, ST_MAX_NAME - 512);
        json_array_foreach(json_object_get(mod, "specs"), k, sp)
        {
            const char *cls = json_string_value(json_array_get(sp, 0));
            const json_t *f = json_array_get(sp, 1);
            if (!cls || !json_is_object(f))
                return ckpt_error_set(CKPT_EINVAL, "%s: spec %zu of '%s' is not [class name, fields]", st->what, k, mname);
            /* peft_type: "lora" when the spec's fused linear carries a LoRA
             * (guess_peft_type), null otherwise */
            json_t *peft = json_object_get(f, "peft_type");
            bool lora = json_is_string(peft) && !strcmp(json_string_value(peft), "lora");
            if (peft && !json_is_null(peft) && (!lora || !j->adapter))
                return ckpt_error_set(CKPT_EINVAL, "%s: spec of '%s' has peft_type %s%s", st->what, mname,
                                      json_string_value(peft) ?: "?",
                                      j->adapter ? ": only LoRA adapters are consolidated"
                                                 : ", but this is not an adapter save (adapter_<name>/adapter_shards)");
            /* an adapter save holds no base weight: a spec of a linear without
             * LoRA has nothing saved to undo */
            if (j->adapter && !lora) continue;
            if (!strcmp(cls, "GQAQKVColumnParallelLinearSpec")) rc = spec_gqa(j, st, mname, f, lora);
            else if (!strcmp(cls, "FusedLinearsSpec")) rc = spec_fused(j, st, mname, f, lora);
            else rc = ckpt_error_set(CKPT_EINVAL, "%s: spec of '%s': unknown class '%s'", st->what, mname, cls);
            if (rc) return rc;
        }
    }
    const char *name;
    json_t *m;
    int64_t tp = j->c.tp;
    split_bucket bs[CKPT_MAX_RANK * 4];
    size_t nb = 0;
    json_object_foreach(json_object_get(meta, "parameters"), name, m)
    {
        /* the rank files hold a LoRA parameter without its adapter name
         * (remove_adapter_name); an adapter save holds only the adapter's
         * own parameters (to_original_weights keeps those of adapter_name) */
        char *saved = nxd_saved_name(name);
        if (!saved) {
            rc = CKPT_ENOMEM;
            break;
        }
        if (json_object_get(st->consumed, saved) || (j->adapter && !of_adapter(name, saved, j->adapter))) {
            free(saved);
            continue;
        }
        const st_tensor *t;
        if ((rc = need_tensor(j, st, saved, &t))) {
            free(saved);
            break;
        }
        uint64_t sh[CKPT_MAX_RANK];
        memcpy(sh, t->shape, sizeof sh);
        if (j->c.ep > 1 && nxd_expert_param(&j->c, st->pp, saved)) {
            /* ExpertFusedColumn/RowParallelLinear (modules/moe/moe_parallel_layers.py): axis 0 holds the rank's
             * num_experts / ep experts; the tensor-parallel split is within them, on another axis */
            json_t *pd = json_object_get(m, "partition_dim");
            if (t->ndim < 2 || !t->shape[0] || (json_is_true(json_object_get(m, "tensor_model_parallel")) && json_integer_value(pd) == 0))
                rc = ckpt_error_set(CKPT_EINVAL, "%s: parameter '%s' is expert-parallel but not [experts, ...] split on another axis",
                                    st->what, name);
            else if (json_object_set_new(st->experts, saved, json_integer((json_int_t)t->shape[0])))
                rc = CKPT_ENOMEM;
        }
        if (rc) {
            free(saved);
            break;
        }
        if (json_is_true(json_object_get(m, "tensor_model_parallel"))) {
            json_t *pd = json_object_get(m, "partition_dim"), *ps = json_object_get(m, "partition_stride"),
                   *np = json_object_get(m, "num_partitions");
            int64_t stride = ps ? json_integer_value(ps) : 1;
            if (!json_is_integer(pd) || json_integer_value(pd) < 0 || json_integer_value(pd) >= t->ndim || stride < 1 ||
                (ps && !json_is_integer(ps)) || (np && (!json_is_integer(np) || json_integer_value(np) != tp)))
            {
                rc = ckpt_error_set(CKPT_EINVAL,
                                    "%s: parameter '%s': partition_dim, partition_stride or num_partitions do not fit a %d-D "
                                    "tensor on %lld ranks",
                                    st->what, name, t->ndim, (long long)tp);
            } else {
                int axis = (int)json_integer_value(pd);
                if (t->shape[axis] % (uint64_t)stride)
                    rc = ckpt_error_set(CKPT_EINVAL,
                                        "%s: parameter '%s': %llu rows on partition_dim %d do not divide by partition_stride %lld",
                                        st->what, name, (unsigned long long)t->shape[axis], axis, (long long)stride);
                sh[axis] *= (uint64_t)tp;
                if (!rc && tp > 1) rc = add_split(st, bs, &nb, saved, axis, stride, tp);
            }
        }
        if (!rc) rc = add_orig(st, saved, t->dtype, t->ndim, sh);
        free(saved);
        if (rc) break;
    }
    for (size_t b = 0; b < nb; b++) {
        int r2 = flush_split(st, &bs[b], tp);
        if (!rc) rc = r2;
    }
    return rc;
}

/* The forward rules over the stage's originals, each rank tensor they describe
 * matched with the rank files, and its parts inverted into j->orig. */
/* Appends an original tensor to j->orig (a name seen before is an error). */
static int new_orig(nxd_job *j, const stage *st, const char *name, ckpt_dtype dt, int ndim, const uint64_t *shape)
{
    if (json_object_get(j->names, name))
        return ckpt_error_set(CKPT_EINVAL, "%s: tensor '%s' comes from two pipeline stages (or two specs)", st->what, name);
    if (json_object_set_new(j->names, name, json_true())) return CKPT_ENOMEM;
    if (ckpt_grow(&j->orig, &j->cap, j->norig + 1, sizeof *j->orig)) return CKPT_ENOMEM;
    plan_tensor *o = &j->orig[j->norig];
    memset(o, 0, sizeof *o);
    o->rank = PLAN_ALL_RANKS;
    o->dtype = dt;
    o->ndim = ndim;
    memcpy(o->shape, shape, (size_t)ndim * sizeof *shape);
    if (!(o->name = ckpt_strdup(name))) return CKPT_ENOMEM;
    j->norig++;
    return 0;
}

/* The part of a stored tensor that is the whole of `shape`, from the start. */
static void part_whole(plan_part *p, int ndim, const uint64_t *shape)
{
    memset(p, 0, sizeof *p);
    for (int a = 0; a < ndim; a++) {
        p->ext[a] = shape[a];
        p->axis_map[a] = (int8_t)a;
    }
}

/* Matches rank r's tensor `name` of the stage against t (dtype and shape):
 * its plan source index in *src, or an error naming the file and parameter. */
static int rank_source(const nxd_job *j, const stage *st, int e, int r, const char *name, ckpt_dtype dt, int ndim,
                       const uint64_t *shape, int32_t *src)
{
    const nxd_rank *nr = nxd_rank_at(&j->c, st->pp, e, r);
    const ckpt_tensor_ref *ref = ckpt_checkpoint_find(&nr->ck, name);
    if (!ref)
        return ckpt_error_set(CKPT_ENOTFOUND, "%s: parameter '%s' is missing (%s rank %d; %s lists it)", nr->path, name,
                              j->c.has_ep ? "expert-parallel, tp" : "tp", r, st->what);
    bool same = ref->t->dtype == dt && ref->t->ndim == ndim;
    for (int a = 0; same && a < ndim; a++) same = ref->t->shape[a] == shape[a];
    if (!same) {
        char got[96], want[96];
        return ckpt_error_set(CKPT_EINVAL, "%s: parameter '%s' is %s %s; %s makes it %s %s on tp rank %d", nr->path, name,
                              ckpt_dtype_name(ref->t->dtype), plan_shape_str(ref->t->ndim, ref->t->shape, got, sizeof got),
                              st->what, ckpt_dtype_name(dt), plan_shape_str(ndim, shape, want, sizeof want), r);
    }
    *src = (int32_t)(*first_source(j, st->pp, e, r) + (size_t)(ref - nr->ck.tensors));
    return 0;
}

/* The originals that are copies of a replicated rank tensor (st->copies):
 * rank 0's bytes, every other rank's checked equal. */
static int invert_copies(nxd_job *j, const stage *st)
{
    const char *oname;
    json_t *v;
    json_object_foreach(st->copies, oname, v)
    {
        const char *rname = json_string_value(v);
        const st_tensor *t = rank_tensor(j, st->pp, 0, rname);
        if (!t) return ckpt_error_set(CKPT_ENOTFOUND, "%s: parameter '%s' is missing (tp rank 0)", st->what, rname);
        int rc = new_orig(j, st, oname, t->dtype, t->ndim, t->shape);
        plan_part p;
        part_whole(&p, t->ndim, t->shape);
        for (int r = 0; !rc && r < j->c.tp; r++) {
            int32_t src;
            char holder[32];
            snprintf(holder, sizeof holder, "tp rank %d", r);
            rc = rank_source(j, st, 0, r, rname, t->dtype, t->ndim, t->shape, &src);
            if (!rc) rc = consolidate_add_inverse(&j->orig[j->norig - 1], &p, t->ndim, src, holder, nxd_rank_at(&j->c, st->pp, 0, r)->path);
        }
        if (rc) return rc;
    }
    return 0;
}

static int invert_stage(nxd_job *j, stage *st)
{
    size_t base = j->norig;
    for (size_t i = 0; i < st->nv; i++) {
        /* an expert-parallel parameter: the ep ranks' experts one after the other */
        uint64_t sh[CKPT_MAX_RANK];
        memcpy(sh, st->v[i].shape, sizeof sh);
        if (json_object_get(st->experts, st->v[i].name)) sh[0] *= (uint64_t)j->c.ep;
        int rc = new_orig(j, st, st->v[i].name, st->v[i].dtype, st->v[i].ndim, sh);
        if (rc) return rc;
    }
    json_t *doc = json_pack("{s:s, s:i, s:s, s:I, s:O}", "format", "ckpt-rules", "version", 1, "layout", "nxd", "tp",
                            (json_int_t)j->c.tp, "rules", st->rules);
    rules_doc rd;
    memset(&rd, 0, sizeof rd);
    plan_set set = {0};
    rules_result res = {0};
    int rc = doc ? rules_parse(&rd, doc, st->what) : CKPT_ENOMEM;
    json_decref(doc);
    for (size_t i = 0; !rc && i < st->nv; i++) {
        plan_tensor t;
        rc = plan_tensor_from_source(&t, &st->v[i], (int32_t)i);
        if (!rc) rc = plan_set_push(&set, &t);
    }
    if (!rc) rc = rules_apply(&rd, &set, &res);
    if (rc) rc = ckpt_error_prefix(rc, "%s: sharding the original tensors as the metadata says", st->what);
    for (size_t i = 0; !rc && i < set.n; i++) {
        const plan_tensor *t = &set.t[i];
        int r0 = t->rank == PLAN_ALL_RANKS ? 0 : t->rank, r1 = t->rank == PLAN_ALL_RANKS ? j->c.tp : t->rank + 1;
        /* as checkpoint_converter.py merges them: an expert-parallel tensor
         * from every ep rank, its experts after the previous rank's along
         * axis 0; any other from ep rank 0 (_xser_save_data writes it there only) */
        json_t *ex = json_object_get(st->experts, t->name);
        int eps = ex ? j->c.ep : 1;
        for (int e = 0; !rc && e < eps; e++)
            for (int r = r0; !rc && r < r1; r++) {
                const nxd_rank *nr = nxd_rank_at(&j->c, st->pp, e, r);
                int32_t src;
                if ((rc = rank_source(j, st, e, r, t->name, t->dtype, t->ndim, t->shape, &src))) break;
                char holder[48];
                if (ex) snprintf(holder, sizeof holder, "ep rank %d tp rank %d", e, r);
                else snprintf(holder, sizeof holder, "tp rank %d", r);
                for (size_t p = 0; !rc && p < t->nparts; p++) {
                    plan_part pt = t->parts[p];
                    if (pt.src == PLAN_ZERO) continue;
                    pt.src_lo[0] += (uint64_t)e * (uint64_t)json_integer_value(ex);
                    rc = consolidate_add_inverse(&j->orig[base + (size_t)pt.src], &pt, t->ndim, src, holder, nr->path);
                }
            }
    }
    if (!rc) rc = invert_copies(j, st);
    plan_set_free(&set);
    rules_result_free(&res);
    rules_free(&rd);
    return rc;
}

static void stage_free(stage *st)
{
    for (size_t i = 0; i < st->nv; i++) free(st->v[i].name);
    free(st->v);
    json_decref(st->rules);
    json_decref(st->consumed);
    json_decref(st->copies);
    json_decref(st->experts);
}

static void job_free(nxd_job *j)
{
    for (size_t i = 0; i < j->norig; i++) plan_tensor_free(&j->orig[i]);
    free(j->orig);
    free(j->first);
    json_decref(j->names);
    free(j->adapter);
    exec_plan_free(&j->exec);
    nxd_close(&j->c);
}

/* The adapter a save of adapter_<name>/adapter_shards holds: <name>, as
 * consolidate_model_parallel_checkpoints_to_unified_checkpoint takes it from
 * the folder's name; else the one adapter name the metadata's LoRA
 * parameters carry. */
static int adapter_name(nxd_job *j)
{
    char *real = j->c.root ? realpath(j->c.root, NULL) : NULL;
    const char *b = real ? ckpt_basename(real) : "";
    if (!strncmp(b, "adapter_", 8) && b[8]) j->adapter = ckpt_strdup(b + 8);
    free(real);
    if (j->adapter) return 0;
    const char *name;
    json_t *m;
    json_object_foreach(json_object_get(j->c.meta[0], "parameters"), name, m)
    {
        char *saved = nxd_saved_name(name);
        if (!saved) return CKPT_ENOMEM;
        size_t len, at = dropped_component(name, saved, &len);
        free(saved);
        if (!len) continue;
        if (!j->adapter) {
            if (!(j->adapter = ckpt_strndup(name + at, len))) return CKPT_ENOMEM;
        } else if (strlen(j->adapter) != len || strncmp(j->adapter, name + at, len))
            return ckpt_error_set(CKPT_EINVAL, "%s: the metadata holds adapters '%s' and '%.*s': give the adapter_<name> folder", j->c.shards,
                                  j->adapter, (int)len, name + at);
    }
    if (!j->adapter) return ckpt_error_set(CKPT_EINVAL, "%s: an adapter save whose metadata names no LoRA parameter", j->c.meta_paths[0]);
    return 0;
}

/* ---- --state: the optimizer under shards/optim as a training state ---- */

/* get_parameter_names(model, ALL_LAYERNORM_LAYERS, ["bias", "layernorm",
 * "rmsnorm"]) as NeuronTrainer.get_decay_parameter_names calls it
 * (optimum/neuron/trainers/transformers.py): a parameter gets no weight decay
 * when its lowercased name holds one of the patterns, or when it lies in a
 * module of a class in ALL_LAYERNORM_LAYERS — nn.LayerNorm, and LlamaRMSNorm,
 * which optimum/neuron/models/training/llama/modeling_llama.py appends. Of
 * the training models' norms (RMSNorm, never LayerNorm), LlamaRMSNorm is
 * Llama's and Granite's final model.norm (their layers' norms match
 * "layernorm" by name); Qwen3's model.norm, q_norm and k_norm are
 * Qwen3RMSNorm, not in the list, so they decay. */
static int decay_rule(const char *model_type, bool *llama_norm)
{
    static const char *const llama_like[] = {"llama", "granite"};
    *llama_norm = false;
    for (size_t i = 0; model_type && i < CKPT_ARRAY_LEN(llama_like); i++)
        if (!strcmp(model_type, llama_like[i])) *llama_norm = true;
    if (*llama_norm || (model_type && !strcmp(model_type, "qwen3"))) return 0;
    return ckpt_error_set(CKPT_EINVAL,
                          "--state: model_type '%s': which of its modules are in ALL_LAYERNORM_LAYERS (and so how "
                          "NeuronTrainer.create_optimizer grouped its parameters) is known for llama, granite and qwen3 only",
                          model_type ? model_type : "(none in config.json)");
}

static bool no_decay(const char *name, bool llama_norm)
{
    static const char *const pats[] = {"bias", "layernorm", "rmsnorm"};
    char low[ST_MAX_NAME + 1];
    size_t n = strlen(name);
    if (n > ST_MAX_NAME) n = ST_MAX_NAME;
    for (size_t i = 0; i < n; i++) low[i] = (char)(name[i] >= 'A' && name[i] <= 'Z' ? name[i] - 'A' + 'a' : name[i]);
    low[n] = 0;
    for (size_t i = 0; i < CKPT_ARRAY_LEN(pats); i++)
        if (strstr(low, pats[i])) return true;
    return llama_norm && !strcmp(name, "model.norm.weight");
}

/* Where a part of a rank tensor reads from the rank's slot: each piece of it
 * within one ZeRO-1 chunk (rows [d*C, (d+1)*C) of axis 0 are dp rank d's
 * tensor; C = rows without ZeRO-1, one piece), as (dp rank, part reading
 * that chunk's rows). */
typedef struct {
    int dp;
    plan_part p;
} piece;

typedef struct {
    nxd_optim o;
    size_t *first;       /* per (pp, tp, dp) optimizer file: the index of its first plan source */
    const char ***names; /* per stage: parameter index -> name (pointers into the metadata) */
    int64_t *nnames;
    json_t **index;      /* per stage: name -> parameter index */
    piece *pcs;          /* scratch: dp + 1 pieces (a box of rows crosses at most dp chunks) */
    plan_tensor *slots;  /* "<param>/<slot>" */
    size_t nslots, cap;
    char **slot_names;   /* distinct, sorted */
    size_t nslot_names;
    json_t *left_out;
    bool has_step;
    double step;
    char *index_text;    /* optimizer.safetensors.index.json, or NULL */
} nxd_state;

static void nxd_state_free(nxd_state *s, int pp)
{
    for (size_t i = 0; i < s->nslots; i++) plan_tensor_free(&s->slots[i]);
    free(s->slots);
    for (int p = 0; s->names && p < pp; p++) free(s->names[p]);
    for (int p = 0; s->index && p < pp; p++) json_decref(s->index[p]);
    free(s->names);
    free(s->index);
    free(s->pcs);
    free(s->nnames);
    free(s->first);
    for (size_t i = 0; i < s->nslot_names; i++) free(s->slot_names[i]);
    free(s->slot_names);
    json_decref(s->left_out);
    free(s->index_text);
    nxd_optim_close(&s->o);
}

/* Stage pp's parameter index -> name. When the files keep "param_names"
 * (torch >= 2.6, an optimizer given named parameters), those, each a
 * parameter of the stage. Else as create_optimizer numbers them: the decay
 * group, then the no-decay group, each in named_parameters() order — the
 * order of the stage's metadata (create_parameter_metadata walks
 * named_parameters()); or one group of every parameter in that order (an
 * optimizer over model.parameters()). Checked against every file. */
static int stage_names(const nxd_job *j, nxd_state *s, int pp, const char *model_type)
{
    json_t *params = json_object_get(j->c.meta[pp], "parameters");
    size_t n = json_object_size(params), nd = 0, k = 0;
    const char **v = ckpt_calloc(n + 1, sizeof *v), *name;
    if (!v) return CKPT_ENOMEM;
    s->names[pp] = v;
    s->nnames[pp] = (int64_t)n;
    const nxd_optim_rank *r0 = nxd_optim_at(&s->o, pp, 0, 0);
    json_t *m;
    int rc = (s->index[pp] = json_object()) ? 0 : CKPT_ENOMEM;
    bool llama_norm = false, named = r0->param_names != NULL;
    if (!rc && named && r0->nparams != (int64_t)n)
        rc = ckpt_error_set(CKPT_EINVAL, "%s: param_groups name %lld parameters; pp rank %d has %zu", r0->path, (long long)r0->nparams, pp, n);
    for (size_t i = 0; !rc && named && i < n; i++) {
        v[i] = r0->param_names[i];
        if (!json_object_get(params, v[i]))
            rc = ckpt_error_set(CKPT_EINVAL, "%s: param_names[%zu] '%s' is not a parameter of pp rank %d (%s)", r0->path, i, v[i], pp,
                                j->c.meta_paths[pp]);
    }
    if (!rc && !named) rc = decay_rule(model_type, &llama_norm);
    if (!rc && !named) {
        json_object_foreach(params, name, m) if (!no_decay(name, llama_norm)) v[k++] = name, nd++;
        json_object_foreach(params, name, m) if (no_decay(name, llama_norm)) v[k++] = name;
    }
    for (int t = 0; !rc && t < j->c.tp; t++)
        for (int d = 0; !rc && d < s->o.dp; d++) {
            const nxd_optim_rank *r = nxd_optim_at(&s->o, pp, t, d);
            if (named) {
                for (size_t i = 0; !rc && i < n; i++)
                    if (!r->param_names || r->nparams != (int64_t)n || strcmp(r->param_names[i], v[i]))
                        rc = ckpt_error_set(CKPT_EINVAL, "%s: parameter %zu is '%s' in %s but '%s' here", r->path, i, v[i], r0->path,
                                            r->param_names && (int64_t)i < r->nparams ? r->param_names[i] : "(no param_names)");
                continue;
            }
            bool two = r->ngroups == 2 && r->group_len[0] == (int64_t)nd && r->group_len[1] == (int64_t)(n - nd);
            bool one = r->ngroups == 1 && r->group_len[0] == (int64_t)n;
            if (one && nd != n) {
                k = 0;
                json_object_foreach(params, name, m) v[k++] = name;
                nd = n;
            }
            if (!two && !one)
                rc = ckpt_error_set(CKPT_EINVAL,
                                    "%s: param_groups of %zu groups (%lld parameters in the first) do not match "
                                    "NeuronTrainer.create_optimizer's grouping of the %zu parameters of pp rank %d (%zu with "
                                    "weight decay, %zu without)",
                                    r->path, r->ngroups, (long long)r->group_len[0], n, pp, nd, n - nd);
        }
    for (size_t i = 0; !rc && i < n; i++) {
        if (json_object_get(s->index[pp], v[i]))
            rc = ckpt_error_set(CKPT_EINVAL, "%s: parameter '%s' is named twice in param_groups", r0->path, v[i]);
        else if (json_object_set_new(s->index[pp], v[i], json_integer((json_int_t)i)))
            rc = CKPT_ENOMEM;
    }
    return rc;
}

static const char *opt_label(const nxd_optim_rank *r) { return r->path; }

/* The slot tensor of rank file r for parameter index idx, slot `slot`. */
static const ckpt_tensor_ref *slot_tensor(const nxd_optim_rank *r, int64_t idx, const char *slot)
{
    const nxd_pstate *ps = nxd_optim_state(r, idx);
    for (size_t k = 0; ps && k < ps->n; k++)
        if (!strcmp(r->slots[ps->first + k].name, slot)) return r->slots[ps->first + k].t;
    return NULL;
}

/* The value of a 0-d tensor or number slot. */
static int slot_scalar(const nxd_optim_rank *r, const nxd_oslot *o, double *v)
{
    if (!o->t) {
        *v = o->value;
        return 0;
    }
    uint8_t b[8] = {0};
    if (o->t->t->nbytes > sizeof b) return ckpt_error_set(CKPT_EINVAL, "%s: slot '%s' is not a scalar", r->path, o->name);
    const char *path = r->ck.files[o->t->file].path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ckpt_error_sys("%s: open", path);
    int rc = ckpt_pread_full(fd, b, (size_t)o->t->t->nbytes, o->t->t->offset, path);
    close(fd);
    if (!rc && ckpt_scalar_value(o->t->t->dtype, b, v) < 0)
        rc = ckpt_error_set(CKPT_EINVAL, "%s: slot '%s' is a %s scalar, not a number", r->path, o->name, ckpt_dtype_name(o->t->t->dtype));
    return rc;
}

static int add_left_out(nxd_state *s, const char *file, const char *what, const char *why, bool quiet)
{
    if (!quiet) ckpt_info("%s: left out %s: %s", file, what, why);
    return json_array_append_new(s->left_out, json_pack("{s:s,s:s,s:s}", "file", file, "name", what, "why", why)) ? CKPT_ENOMEM : 0;
}

/* Every file's states checked against the parameters they name: each tensor
 * slot has its parameter's per-rank shape (ZeRO-1: shape_info is that shape
 * and the slot this dp rank's chunk of it), the step is one value; the
 * distinct slot names collected. */
static int check_states(const nxd_job *j, nxd_state *s, bool quiet)
{
    int rc = 0;
    for (int pp = 0; !rc && pp < j->c.pp; pp++)
        for (int t = 0; !rc && t < j->c.tp; t++)
            for (int d = 0; !rc && d < s->o.dp; d++) {
                const nxd_optim_rank *r = nxd_optim_at(&s->o, pp, t, d);
                for (size_t i = 0; !rc && i < r->nps; i++) {
                    const nxd_pstate *ps = &r->ps[i];
                    const char *name = s->names[pp][ps->idx];
                    const st_tensor *pt = rank_tensor(j, pp, t, name);
                    char got[96], want[96];
                    if (!pt) {
                        rc = ckpt_error_set(CKPT_ENOTFOUND, "%s: state index %lld is '%s', not in tp rank %d's model file", opt_label(r),
                                            (long long)ps->idx, name, t);
                        break;
                    }
                    if (ps->has_shape && (ps->ndim != pt->ndim || memcmp(ps->shape, pt->shape, (size_t)pt->ndim * sizeof *pt->shape))) {
                        rc = ckpt_error_set(CKPT_EINVAL, "%s: shape_info[%lld] is %s but parameter '%s' is %s on tp rank %d", opt_label(r),
                                            (long long)ps->idx, plan_shape_str(ps->ndim, ps->shape, got, sizeof got), name,
                                            plan_shape_str(pt->ndim, pt->shape, want, sizeof want), t);
                        break;
                    }
                    uint64_t want_shape[CKPT_MAX_RANK];
                    memcpy(want_shape, pt->shape, sizeof want_shape);
                    if (s->o.zero1 && pt->ndim) /* _shard_tensor: padded to a multiple of dp on axis 0, one chunk */
                        want_shape[0] = (pt->shape[0] + (uint64_t)s->o.dp - 1) / (uint64_t)s->o.dp;
                    for (size_t k = 0; !rc && k < ps->n; k++) {
                        const nxd_oslot *o = &r->slots[ps->first + k];
                        if (!strcmp(o->name, "step") && (!o->t || !o->t->t->ndim)) {
                            double v;
                            rc = slot_scalar(r, o, &v);
                            if (!rc && s->has_step && v != s->step)
                                rc = ckpt_error_set(CKPT_EINVAL, "%s: state index %lld ('%s') is at step %.0f, others at %.0f", opt_label(r),
                                                    (long long)ps->idx, name, v, s->step);
                            s->step = v;
                            s->has_step = true;
                            continue;
                        }
                        if (!o->t || !o->t->t->ndim) {
                            char what[ST_MAX_NAME + 64];
                            snprintf(what, sizeof what, "%s[%lld]['%s'] of '%s'", s->o.zero1 ? "base_state" : "state", (long long)ps->idx,
                                     o->name, name);
                            if (!t && !d && !pp) rc = add_left_out(s, r->path, what, "a scalar other than step", quiet);
                            continue;
                        }
                        const st_tensor *x = o->t->t;
                        if (x->ndim != pt->ndim || memcmp(x->shape, want_shape, (size_t)x->ndim * sizeof *x->shape)) {
                            rc = ckpt_error_set(CKPT_EINVAL, "%s: state index %lld slot '%s' is %s, but its parameter '%s' is %s on tp rank %d%s",
                                                opt_label(r), (long long)ps->idx, o->name, plan_shape_str(x->ndim, x->shape, got, sizeof got),
                                                name, plan_shape_str(pt->ndim, want_shape, want, sizeof want), t,
                                                s->o.zero1 ? " (its ZeRO-1 chunk)" : "");
                            break;
                        }
                        bool seen = false;
                        for (size_t q = 0; q < s->nslot_names && !seen; q++) seen = !strcmp(s->slot_names[q], o->name);
                        if (seen) continue;
                        char **nv = ckpt_realloc(s->slot_names, (s->nslot_names + 1) * sizeof *nv);
                        if (!nv || !(nv[s->nslot_names] = ckpt_strdup(o->name))) rc = CKPT_ENOMEM;
                        if (nv) s->slot_names = nv;
                        if (!rc) s->nslot_names++;
                    }
                }
                if (!rc && r->master_weights && !t && !d && !pp)
                    rc = add_left_out(s, r->path, "sharded_master_weights", "the optimizer's copy of the weights, not a slot", quiet);
            }
    return rc;
}

/* The model tensor (pp, tp) and name of plan source src, or false. */
static bool model_source(const nxd_job *j, int32_t src, int *pp, int *tp)
{
    for (int p = 0; p < j->c.pp; p++)
        for (int t = 0; t < j->c.tp; t++) {
            size_t f = *first_source(j, p, 0, t);
            if ((size_t)src >= f && (size_t)src < f + nxd_rank_at(&j->c, p, 0, t)->ck.ntensors) {
                *pp = p;
                *tp = t;
                return true;
            }
        }
    return false;
}

/* Part p restricted to the box [lo, lo+ext) of the tensor (inside p's). */
static plan_part part_restrict(const plan_part *p, int ndim, const uint64_t *lo, const uint64_t *ext)
{
    plan_part q = *p;
    for (int k = 0; k < ndim; k++) {
        if (p->axis_map[k] >= 0) q.src_lo[p->axis_map[k]] += lo[k] - p->lo[k];
        q.lo[k] = lo[k];
        q.ext[k] = ext[k];
    }
    return q;
}


static int split_rows(const plan_part *p, int ndim, uint64_t C, piece *out, size_t max, size_t *n)
{
    *n = 0;
    int k = -1;
    for (int a = 0; a < ndim; a++)
        if (p->axis_map[a] == 0) k = a;
    uint64_t r0 = p->src_lo[0], len = k >= 0 ? p->ext[k] : 1;
    for (uint64_t r = r0; r < r0 + len;) {
        uint64_t d = r / C, end = (d + 1) * C < r0 + len ? (d + 1) * C : r0 + len;
        if (*n == max) return ckpt_error_set(CKPT_ELIMIT, "a part spans more than %zu ZeRO-1 chunks", max);
        uint64_t lo[PLAN_MAX_DIM], ext[PLAN_MAX_DIM];
        memcpy(lo, p->lo, sizeof lo);
        memcpy(ext, p->ext, sizeof ext);
        if (k >= 0) {
            lo[k] = p->lo[k] + (r - r0);
            ext[k] = end - r;
        }
        out[*n].dp = (int)d;
        out[*n].p = part_restrict(p, ndim, lo, ext);
        out[*n].p.src_lo[0] -= d * C;
        (*n)++;
        r = end;
    }
    return 0;
}

/* The slot `slot` of rank tensor src (a model source): the plan source of
 * its dp rank d piece. */
static int slot_source(const nxd_job *j, const nxd_state *s, int32_t src, int d, const char *slot, int32_t *out, int *pp_out,
                       int64_t *idx_out)
{
    int pp, tp;
    if (!model_source(j, src, &pp, &tp)) return ckpt_error_set(CKPT_EINVAL, "--state: a part of no rank file");
    const char *name = j->exec.sources[src].name;
    const nxd_optim_rank *r = nxd_optim_at(&s->o, pp, tp, d);
    json_t *ix = json_object_get(s->index[pp], name);
    int64_t idx = ix ? (int64_t)json_integer_value(ix) : -1;
    const ckpt_tensor_ref *t = idx >= 0 ? slot_tensor(r, idx, slot) : NULL;
    *pp_out = pp;
    *idx_out = idx;
    if (!t) return CKPT_ENOTFOUND; /* said by the caller */
    *out = (int32_t)(s->first[((size_t)pp * (size_t)j->c.tp + (size_t)tp) * (size_t)s->o.dp + (size_t)d] + (size_t)(t - r->ck.tensors));
    return 0;
}

/* Parts of orig o read from the rank tensors, as parts of its slot read from
 * the optimizer files (split at ZeRO-1 chunks). */
static int map_part(const nxd_job *j, const nxd_state *s, const plan_part *p, int ndim, const char *slot, plan_part *out, size_t max,
                    size_t *n, bool *missing, const char **pname)
{
    piece *pcs = s->pcs;
    size_t np = 0;
    const plan_source *ms = &j->exec.sources[p->src];
    uint64_t C = ms->ndim ? (s->o.zero1 ? (ms->shape[0] + (uint64_t)s->o.dp - 1) / (uint64_t)s->o.dp : ms->shape[0]) : 1;
    int rc = split_rows(p, ndim, C ? C : 1, pcs, (size_t)s->o.dp + 1, &np);
    *n = 0;
    for (size_t i = 0; !rc && i < np; i++) {
        int pp;
        int64_t idx;
        int32_t src;
        rc = slot_source(j, s, p->src, pcs[i].dp, slot, &src, &pp, &idx);
        if (rc == CKPT_ENOTFOUND) {
            *missing = true;
            *pname = ms->name;
            return 0;
        }
        if (rc) return rc;
        if (*n == max) return ckpt_error_set(CKPT_ELIMIT, "too many pieces");
        out[*n] = pcs[i].p;
        out[(*n)++].src = src;
    }
    return rc;
}

/* The slot `slot` of original tensor o: o's parts and checks, read from the
 * optimizer files instead of the model's. *missing when some rank has no such
 * slot for o's parameter. */
static int plan_slot(const nxd_job *j, nxd_state *s, const plan_tensor *o, const char *slot, ckpt_dtype dt, bool *missing,
                     const char **pname)
{
    plan_tensor t;
    memset(&t, 0, sizeof t);
    t.rank = PLAN_ALL_RANKS;
    t.dtype = dt;
    t.ndim = o->ndim;
    memcpy(t.shape, o->shape, sizeof t.shape);
    int rc = (t.name = ckpt_sprintf("%s/%s", o->name, slot)) ? 0 : CKPT_ENOMEM;
    size_t max = (size_t)s->o.dp + 1, n, dn;
    plan_part *out = ckpt_calloc(2 * max, sizeof *out), *dout = out ? out + max : NULL;
    if (!out) rc = CKPT_ENOMEM;
    *missing = false;
    for (size_t i = 0; !rc && !*missing && i < o->nparts; i++) {
        if (o->parts[i].src == PLAN_ZERO) {
            rc = plan_tensor_add_part(&t, &o->parts[i]);
            continue;
        }
        rc = map_part(j, s, &o->parts[i], o->ndim, slot, out, max, &n, missing, pname);
        for (size_t k = 0; !rc && !*missing && k < n; k++) rc = plan_tensor_add_part(&t, &out[k]);
    }
    /* the checks (replicated parameters, KV replicas): the same boxes of the slots must be equal */
    for (size_t i = 0; !rc && !*missing && i < o->nchecks; i++) {
        const struct plan_check *c = &o->checks[i];
        rc = map_part(j, s, &c->primary, o->ndim, slot, out, max, &n, missing, pname);
        for (size_t k = 0; !rc && !*missing && k < n; k++) {
            plan_part dup = part_restrict(&c->dup, o->ndim, out[k].lo, out[k].ext);
            rc = map_part(j, s, &dup, o->ndim, slot, dout, max, &dn, missing, pname);
            for (size_t q = 0; !rc && !*missing && q < dn; q++) {
                if (ckpt_grow(&t.checks, &t.checks_cap, t.nchecks + 1, sizeof *t.checks)) {
                    rc = CKPT_ENOMEM;
                    break;
                }
                struct plan_check *nc = &t.checks[t.nchecks];
                nc->primary = part_restrict(&out[k], o->ndim, dout[q].lo, dout[q].ext);
                nc->dup = dout[q];
                if (!(nc->what = ckpt_strdup(c->what))) rc = CKPT_ENOMEM;
                else t.nchecks++;
            }
        }
    }
    free(out);
    if (!rc && !*missing && ckpt_grow(&s->slots, &s->cap, s->nslots + 1, sizeof *s->slots)) rc = CKPT_ENOMEM;
    if (!rc && !*missing) {
        s->slots[s->nslots++] = t;
        return 0;
    }
    plan_tensor_free(&t);
    return rc;
}

/* The dtype of slot `slot` for orig o: the same on every rank tensor it reads. */
static int slot_dtype(const nxd_job *j, const nxd_state *s, const plan_tensor *o, const char *slot, ckpt_dtype *dt, bool *found)
{
    *found = false;
    for (size_t i = 0; i < o->nparts; i++) {
        if (o->parts[i].src == PLAN_ZERO) continue;
        int pp;
        int64_t idx;
        int32_t src;
        for (int d = 0; d < s->o.dp; d++) {
            int rc = slot_source(j, s, o->parts[i].src, d, slot, &src, &pp, &idx);
            if (rc == CKPT_ENOTFOUND) continue;
            if (rc) return rc;
            ckpt_dtype x = j->exec.sources[src].dtype;
            if (*found && x != *dt)
                return ckpt_error_set(CKPT_EINVAL, "--state: slot '%s' of '%s' is %s on one rank and %s on another", slot, o->name,
                                      ckpt_dtype_name(*dt), ckpt_dtype_name(x));
            *dt = x;
            *found = true;
        }
    }
    return 0;
}

static int cmp_cstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* With --state: reads shards/optim, maps every state to its parameter, and
 * plans each slot of each original tensor as that tensor is planned. */
static int plan_state(nxd_job *j, nxd_state *s, const consolidate_opts *o)
{
    if (j->c.adapter)
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: --state: an adapter save holds no optimizer (NeuronPeftModel.save_pretrained passes none to "
                              "save_checkpoint)",
                              j->c.shards);
    if (j->c.ep > 1) return ckpt_error_set(CKPT_EINVAL, "%s: --state of an expert-parallel save is not supported", j->c.shards);
    json_t *cfg = NULL;
    char *cp = j->c.root ? ckpt_path_join(j->c.root, "config.json") : NULL;
    int rc = cp && ckpt_exists(cp) ? cj_load_file(&cfg, cp, STATE_JSON_MAX_BYTES) : 0;
    free(cp);
    if (!rc) rc = nxd_optim_open(&s->o, &j->c);
    if (!rc && !(s->left_out = json_array())) rc = CKPT_ENOMEM;
    s->names = rc ? NULL : ckpt_calloc((size_t)j->c.pp, sizeof *s->names);
    s->index = rc ? NULL : ckpt_calloc((size_t)j->c.pp, sizeof *s->index);
    s->pcs = rc ? NULL : ckpt_calloc((size_t)s->o.dp + 1, sizeof *s->pcs);
    s->nnames = rc ? NULL : ckpt_calloc((size_t)j->c.pp, sizeof *s->nnames);
    size_t nfiles = (size_t)j->c.pp * (size_t)j->c.tp * (size_t)s->o.dp;
    s->first = rc ? NULL : ckpt_calloc(nfiles, sizeof *s->first);
    if (!rc && (!s->names || !s->index || !s->pcs || !s->nnames || !s->first)) rc = CKPT_ENOMEM;
    for (int p = 0; !rc && p < j->c.pp; p++) rc = stage_names(j, s, p, json_string_value(json_object_get(cfg, "model_type")));
    json_decref(cfg);
    if (!rc) rc = check_states(j, s, o->quiet);
    for (size_t f = 0; !rc && f < nfiles; f++) rc = convert_add_sources(&j->exec, &s->o.ranks[f].ck, &s->first[f]);
    if (!rc) qsort(s->slot_names, s->nslot_names, sizeof *s->slot_names, cmp_cstr);
    for (size_t i = 0; !rc && i < j->norig; i++) {
        bool any = false;
        for (size_t k = 0; !rc && k < s->nslot_names; k++) {
            ckpt_dtype dt = CKPT_DT_F32;
            bool found, missing;
            const char *pname = NULL;
            rc = slot_dtype(j, s, &j->orig[i], s->slot_names[k], &dt, &found);
            if (!rc && !found && k + 1 == s->nslot_names && !any)
                rc = add_left_out(s, s->o.dir, j->orig[i].name, "its parameter has no optimizer state (no step or no gradient yet)", o->quiet);
            if (rc || !found) continue;
            any = true;
            rc = plan_slot(j, s, &j->orig[i], s->slot_names[k], dt, &missing, &pname);
            if (!rc && missing)
                rc = ckpt_error_set(CKPT_EINVAL, "%s: slot '%s' of parameter '%s' is on some ranks only (tensor '%s' needs it)", s->o.dir,
                                    s->slot_names[k], pname ? pname : "?", j->orig[i].name);
        }
    }
    for (size_t i = 0; !rc && i < s->nslots; i++) rc = consolidate_check_tensor(&s->slots[i], s->o.dir);
    if (!rc && !s->nslots) rc = ckpt_error_set(CKPT_EINVAL, "%s: --state: no optimizer state to keep (no step taken yet?)", s->o.dir);
    plan_tensor **ptrs = rc ? NULL : ckpt_calloc(s->nslots + 1, sizeof *ptrs);
    if (!rc && !ptrs) rc = CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < s->nslots; i++) ptrs[i] = &s->slots[i];
    uint64_t max = o->max_shard_size ? o->max_shard_size : CONVERT_DEFAULT_SHARD_SIZE;
    if (!rc) rc = convert_layout_folder_prefix(&j->exec, "", "optimizer", ptrs, s->nslots, max, &s->index_text);
    free(ptrs);
    if (!rc && !o->quiet)
        ckpt_info("%s: %zu optimizer slots (%s, %d dp rank file%s per tp rank) of %zu tensors, step %.0f, %zu left out", s->o.dir, s->nslots,
                  s->o.zero1 ? "ZeRO-1" : "plain", s->o.dp, s->o.dp == 1 ? "" : "s", j->norig, s->has_step ? s->step : 0.0,
                  json_array_size(s->left_out));
    return rc;
}

int nxd_consolidate(const char *src, const char *dst, consolidate_opts *o)
{
    if (!o->force && !ckpt_dir_is_empty_or_missing(dst))
        return ckpt_error_set(CKPT_EEXIST, "%s exists and is not empty (--force replaces it)", dst);
    nxd_job j;
    memset(&j, 0, sizeof j);
    int rc = nxd_open(&j.c, src);
    if (rc) return rc;
    if (!(j.names = json_object())) rc = CKPT_ENOMEM;
    if (!rc && j.c.adapter) rc = adapter_name(&j);
    /* PEFT loads one adapter_model.safetensors (upstream's split into shards
     * would give every shard that one name) */
    if (!rc && j.c.adapter && o->max_shard_size)
        rc = ckpt_error_set(CKPT_EINVAL, "%s: a PEFT adapter is written as one adapter_model.safetensors: --max-shard-size does not apply",
                            j.c.shards);
    char *cfg = NULL;
    if (!rc && j.c.adapter) {
        cfg = j.c.root ? ckpt_path_join(j.c.root, LORA_CONFIG_FILE) : NULL;
        if (!cfg || !ckpt_exists(cfg))
            rc = ckpt_error_set(CKPT_ENOTFOUND,
                                "%s: no %s beside adapter_shards (NeuronPeftModel.save_pretrained writes it there): PEFT "
                                "cannot load the adapter without it",
                                j.c.shards, LORA_CONFIG_FILE);
    }
    j.first = rc ? NULL : ckpt_calloc((size_t)j.c.pp * (size_t)j.c.ep * (size_t)j.c.tp, sizeof *j.first);
    if (!rc && !j.first) rc = CKPT_ENOMEM;
    for (int s = 0; !rc && s < j.c.pp; s++)
        for (int e = 0; !rc && e < j.c.ep; e++)
            for (int t = 0; !rc && t < j.c.tp; t++)
                rc = convert_add_sources(&j.exec, &nxd_rank_at(&j.c, s, e, t)->ck, first_source(&j, s, e, t));
    for (int s = 0; !rc && s < j.c.pp; s++) {
        stage st = {.pp = s, .what = j.c.meta_paths[s], .rules = json_array(), .consumed = json_object(), .copies = json_object(),
                    .experts = json_object()};
        rc = st.rules && st.consumed && st.copies && st.experts ? plan_stage(&j, &st) : CKPT_ENOMEM;
        if (!rc) rc = invert_stage(&j, &st);
        stage_free(&st);
    }
    for (size_t i = 0; !rc && i < j.norig; i++) rc = consolidate_check_tensor(&j.orig[i], j.c.shards);
    nxd_state ns;
    memset(&ns, 0, sizeof ns);
    if (!rc && o->state) rc = plan_state(&j, &ns, o);
    plan_tensor **ptrs = rc ? NULL : ckpt_calloc(j.norig + 1, sizeof *ptrs);
    if (!rc && !ptrs) rc = CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < j.norig; i++) ptrs[i] = &j.orig[i];
    char *index_text = NULL, *tmp = NULL;
    if (!rc && j.adapter) rc = convert_layout_folder_prefix(&j.exec, "", LORA_WEIGHTS_PREFIX, ptrs, j.norig, UINT64_MAX, &index_text);
    else if (!rc)
        rc = convert_layout_folder(&j.exec, "", ptrs, j.norig, o->max_shard_size ? o->max_shard_size : CONVERT_DEFAULT_SHARD_SIZE,
                                   &index_text);
    if (!rc) rc = outdir_prepare(dst, o->force, &tmp);
    if (!rc) {
        exec_opts eo = {.threads = o->threads, .quiet = o->quiet, .label = "consolidate"};
        rc = exec_run(&j.exec, tmp, &eo);
        if (!rc && index_text) {
            char *ip = ckpt_path_join(tmp, "model.safetensors.index.json");
            rc = ip ? ckpt_write_file_atomic(ip, index_text, strlen(index_text)) : CKPT_ENOMEM;
            free(ip);
        }
        if (!rc && o->state) {
            char *ip = ns.index_text ? ckpt_path_join(tmp, "optimizer.safetensors.index.json") : NULL;
            if (ns.index_text) rc = ip ? ckpt_write_file_atomic(ip, ns.index_text, strlen(ns.index_text)) : CKPT_ENOMEM;
            free(ip);
            json_t *scalars = json_object();
            if (scalars && ns.has_step) json_object_set_new(scalars, "step", json_real(ns.step));
            plan_tensor **sp = ckpt_calloc(ns.nslots + 1, sizeof *sp);
            for (size_t i = 0; sp && i < ns.nslots; i++) sp[i] = &ns.slots[i];
            if (!rc)
                rc = scalars && sp ? state_write_side_files(tmp, ns.slot_names, ns.nslot_names, scalars, ns.left_out,
                                                            ns.has_step ? (int64_t)ns.step : 0, ptrs, j.norig, sp, ns.nslots)
                                   : CKPT_ENOMEM;
            free(sp);
            json_decref(scalars);
        }
        if (!rc && j.adapter) {
            /* adapter_config.json as save_pretrained wrote it, already in the
             * original model's terms (to_original_peft_config_for_model) */
            char *to = ckpt_path_join(tmp, LORA_CONFIG_FILE), *buf = NULL;
            size_t len = 0;
            rc = to ? ckpt_read_file(cfg, LORA_CONFIG_MAX_BYTES, &buf, &len) : CKPT_ENOMEM;
            if (!rc) rc = ckpt_write_file_atomic(to, buf, len);
            free(buf);
            free(to);
        } else if (!rc && j.c.root)
            rc = outdir_copy_model_files(j.c.root, tmp, false);
        if (!rc) rc = ckpt_fsync_dir(tmp);
        if (!rc) rc = outdir_commit(tmp, dst, o->force);
        if (rc) ckpt_rm_rf(tmp);
        free(tmp);
    }
    free(index_text);
    free(ptrs);
    free(cfg);
    nxd_state_free(&ns, j.c.pp);
    job_free(&j);
    return rc;
}

/* nxd_import.c — a neuronx-distributed training save to Hugging Face (nxd_import.h). */
#include "transform/nxd_import.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/util.h"
#include "format/nxd.h"
#include "lora/lora.h"
#include "transform/consolidate.h"
#include "transform/rules.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
            rc = outdir_copy_model_files(j.c.root, tmp);
        if (!rc) rc = ckpt_fsync_dir(tmp);
        if (!rc) rc = outdir_commit(tmp, dst, o->force);
        if (rc) ckpt_rm_rf(tmp);
        free(tmp);
    }
    free(index_text);
    free(ptrs);
    free(cfg);
    job_free(&j);
    return rc;
}

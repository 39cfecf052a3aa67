/*
 * rule_gqa.c — fuse_qkv_gqa: Q/K/V fusion for grouped-query attention under
 * tensor parallelism, the Neuron layout of docs/transforms.md §4, with its
 * query-head padding.
 *
 * For each attention module (the rule's pattern matches its q weight and
 * captures the module prefix as $1), rank r gets
 *   Q_r: the query heads of its KV slots, in slot order (zero heads where the
 *        padded numbering points past a group's real heads),
 *   K_r, V_r: its kpr = KV*m/tp slots of the KV heads tiled m times (slot p
 *        holds KV head p mod KV), or with kv_order "adjacent" repeated m
 *        times each (slot p holds KV head p div m: adjacent ranks share a KV
 *        head and rank r has query heads r*H/tp.., as vLLM's
 *        QKVParallelLinear places them),
 *   O_r: the o_proj columns of Q_r's heads, same order (none when `o` is
 *        "": a LoRA lora_B of q/k/v whose o_proj has no adapter),
 * fused as [Q_r; K_r; V_r] (weight and bias) or kept as three tensors.
 */
#include "transform/rules_internal.h"

#include "common/error.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GQA_MAX_HEADS 4096 /* query heads per rank, and the padded group size */

/* Concatenates, along axis, the hd-long blocks `heads` of t (a head < 0 is a
 * block of zeros). */
static int gather_heads(plan_tensor *out, const plan_tensor *t, int axis, const int64_t *heads, size_t n,
                        uint64_t hd)
{
    plan_tensor *blocks = ckpt_calloc(n, sizeof *blocks);
    plan_tensor **ptrs = ckpt_calloc(n, sizeof *ptrs);
    int rc = blocks && ptrs ? 0 : CKPT_ENOMEM;
    size_t made = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        uint64_t start = heads[i] < 0 ? 0 : (uint64_t)heads[i] * hd;
        rc = plan_tensor_slice(&blocks[i], t, axis, start, hd);
        if (rc) break;
        made++;
        if (heads[i] < 0) {
            blocks[i].nparts = 0;
            uint64_t lo[PLAN_MAX_DIM] = {0};
            rc = plan_tensor_add_zero(&blocks[i], lo, blocks[i].shape);
        }
        ptrs[i] = &blocks[i];
    }
    if (!rc) rc = plan_tensor_concat(out, ptrs, n, axis);
    for (size_t i = 0; i < made; i++) plan_tensor_free(&blocks[i]);
    free(blocks);
    free(ptrs);
    return rc;
}

typedef struct {
    long q, k, v, o, qb, kb, vb; /* indexes into the set, -1 when absent */
} attn_members;

static long find_member(const plan_name_index *s, const char *prefix, const char *proj,
                        const char *kind)
{
    char name[RULE_NAME_MAX + 64];
    snprintf(name, sizeof name, "%s.%s.%s", prefix, proj, kind);
    return plan_name_index_find(s, name);
}

/* s: the unsplit tensors of the set before this rule added any. */
static int find_members(const rule *r, const plan_name_index *s, const char *prefix,
                        attn_members *a)
{
    a->q = find_member(s, prefix, r->q, "weight");
    a->k = find_member(s, prefix, r->k, "weight");
    a->v = find_member(s, prefix, r->v, "weight");
    a->o = *r->o ? find_member(s, prefix, r->o, "weight") : -2; /* -2: no output projection */
    a->qb = find_member(s, prefix, r->q, "bias");
    a->kb = find_member(s, prefix, r->k, "bias");
    a->vb = find_member(s, prefix, r->v, "bias");
    const char *need[] = {r->q, r->k, r->v, r->o};
    long got[] = {a->q, a->k, a->v, a->o};
    for (int i = 0; i < 4; i++)
        if (got[i] == -1) return rule_err(r, CKPT_EINVAL, "missing tensor '%s.%s.weight' (is it split already, or named differently?)", prefix, need[i]);
    bool any_bias = a->qb >= 0 || a->kb >= 0 || a->vb >= 0;
    if (any_bias && (a->qb < 0 || a->kb < 0 || a->vb < 0))
        return rule_err(r, CKPT_EINVAL, "'%s': q/k/v biases must all be present or all absent", prefix);
    return 0;
}

static int check_shape(const rule *r, const plan_tensor *t, int ndim, uint64_t d0, uint64_t d1, const char *why)
{
    bool ok = t->ndim == ndim && t->shape[0] == d0 && (ndim < 2 || t->shape[1] == d1);
    if (ok) return require_byte_dtype(r, t);
    char got[96], want[96];
    uint64_t w[2] = {d0, d1};
    return rule_err(r, CKPT_EINVAL, "tensor '%s' has shape %s, expected %s (%s)", t->name,
                    plan_shape_str(t->ndim, t->shape, got, sizeof got), plan_shape_str(ndim, w, want, sizeof want), why);
}

typedef struct {
    int64_t H, KV, hd, tp, m, G, Gp, kpr, gpr;
    bool adjacent;
} gqa_geom;

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static int gqa_geometry(const rule *r, gqa_geom *g)
{
    g->H = r->heads;
    g->KV = r->kv_heads;
    g->hd = r->head_dim;
    g->tp = r->tp;
    g->adjacent = r->kv_adjacent;
    if (g->H % g->KV)
        return rule_err(r, CKPT_EINVAL, "num_attention_heads %lld is not a multiple of num_key_value_heads %lld",
                        (long long)g->H, (long long)g->KV);
    g->m = r->kv_mult ? r->kv_mult : g->tp / gcd64(g->KV, g->tp);
    if (g->tp % g->m || (g->KV * g->m) % g->tp)
        return rule_err(r, CKPT_EINVAL,
                        "kv_size_multiplier %lld does not fit tp %lld with %lld KV heads: tp must be a multiple "
                        "of it and KV heads x multiplier a multiple of tp",
                        (long long)g->m, (long long)g->tp, (long long)g->KV);
    g->G = g->H / g->KV;
    g->Gp = g->G;
    while (g->Gp % g->m || (g->KV * g->Gp) % g->tp) {
        g->Gp++;
        if (g->Gp > GQA_MAX_HEADS) return rule_err(r, CKPT_EINVAL, "cannot pad query heads to a usable count");
    }
    if (g->Gp != g->G && !r->pad_heads)
        return rule_err(r, CKPT_EINVAL,
                        "%lld query heads per KV group cannot be split for tp %lld with kv_size_multiplier %lld; "
                        "allow pad_heads",
                        (long long)g->G, (long long)g->tp, (long long)g->m);
    g->kpr = g->KV * g->m / g->tp;
    g->gpr = g->Gp / g->m;
    return 0;
}

/* Query heads (original numbering, -1 for padding) and KV heads of rank r. */
static void rank_heads(const gqa_geom *g, int64_t rank, int64_t *q, int64_t *kv)
{
    size_t nq = 0;
    for (int64_t j = 0; j < g->kpr; j++) {
        int64_t p = rank * g->kpr + j;
        int64_t grp = g->adjacent ? p / g->m : p % g->KV, c = g->adjacent ? p % g->m : p / g->KV;
        kv[j] = grp;
        for (int64_t i = 0; i < g->gpr; i++) {
            int64_t within = c * g->gpr + i;
            q[nq++] = within < g->G ? grp * g->G + within : -1;
        }
    }
}

static json_t *int_list(const int64_t *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

static int note_gqa(plan_tensor *t, const rule *r, const gqa_geom *g, const int64_t *q, const int64_t *kv, int axis)
{
    size_t nq = (size_t)(g->kpr * g->gpr);
    json_t *j = json_pack("{s:I,s:I,s:I,s:I,s:I,s:o,s:o,s:b}", "num_attention_heads", (json_int_t)g->H,
                          "num_key_value_heads", (json_int_t)g->KV, "kv_size_multiplier", (json_int_t)g->m,
                          "head_dim", (json_int_t)g->hd, "padded_num_attention_heads", (json_int_t)(g->KV * g->Gp),
                          "q_heads", int_list(q, nq), "kv_heads", int_list(kv, (size_t)g->kpr), "fused", r->fused);
    if (j && g->adjacent) json_object_set_new(j, "kv_order", json_string("adjacent"));
    int rc = set_meta(t, "gqa", j);
    if (!rc && g->tp > 1) rc = note_partition(t, axis, 1, g->tp, 0, 0);
    if (!rc) rc = plan_tensor_note(t, rule_desc(r));
    return rc;
}

/* Builds and pushes one rank's tensors for one attention module. */
static int build_rank(const rule *r, plan_set *s, const char *prefix, const attn_members *a, const gqa_geom *g,
                      int64_t rank)
{
    size_t nq = (size_t)(g->kpr * g->gpr), nkv = (size_t)g->kpr;
    int64_t q[GQA_MAX_HEADS], kv[GQA_MAX_HEADS];
    rank_heads(g, rank, q, kv);
    int rk = g->tp > 1 ? (int)rank : PLAN_ALL_RANKS;
    uint64_t hd = (uint64_t)g->hd;
    int rc = 0;
    /* weights (kind 0), then biases (kind 1) */
    for (int kind = 0; kind < 2 && !rc; kind++) {
        long iq = kind ? a->qb : a->q, ik = kind ? a->kb : a->k, iv = kind ? a->vb : a->v;
        if (iq < 0) continue;
        plan_tensor parts[3];
        int made = 0;
        rc = gather_heads(&parts[0], &s->t[iq], 0, q, nq, hd);
        if (!rc) made++, rc = gather_heads(&parts[1], &s->t[ik], 0, kv, nkv, hd);
        if (!rc) made++, rc = gather_heads(&parts[2], &s->t[iv], 0, kv, nkv, hd);
        if (!rc) made++;
        if (!rc && r->fused) {
            plan_tensor *ptrs[3] = {&parts[0], &parts[1], &parts[2]}, out;
            rc = plan_tensor_concat(&out, ptrs, 3, 0);
            if (!rc) {
                free(out.name);
                out.name = ckpt_sprintf("%s.%s.%s", prefix, r->replacement, kind ? r->bias_name : r->weight_name);
                out.rank = rk;
                rc = out.name ? note_gqa(&out, r, g, q, kv, 0) : CKPT_ENOMEM;
                if (!rc) rc = plan_set_push(s, &out);
                else plan_tensor_free(&out);
            }
        } else if (!rc) {
            for (int i = 0; i < 3 && !rc; i++) {
                plan_tensor out;
                if ((rc = plan_tensor_copy(&out, &parts[i]))) break;
                out.rank = rk;
                rc = note_gqa(&out, r, g, q, kv, 0);
                if (!rc) rc = plan_set_push(s, &out);
                else plan_tensor_free(&out);
            }
        }
        for (int i = 0; i < made; i++) plan_tensor_free(&parts[i]);
    }
    if (rc || a->o == -2) return rc;
    plan_tensor o;
    rc = gather_heads(&o, &s->t[a->o], 1, q, nq, hd);
    if (rc) return rc;
    o.rank = rk;
    rc = note_gqa(&o, r, g, q, kv, 1);
    if (!rc) rc = plan_set_push(s, &o);
    else plan_tensor_free(&o);
    return rc;
}

int parse_fuse_qkv_gqa(rule *r, int doc_tp)
{
    int rc = 0;
    if ((rc = rule_parse_str(r, "q", &r->q, "q_proj", false)) || (rc = rule_parse_str(r, "k", &r->k, "k_proj", false)) ||
        (rc = rule_parse_str(r, "v", &r->v, "v_proj", false)) || (rc = rule_parse_str(r, "o", &r->o, "o_proj", false)) ||
        (rc = rule_parse_str(r, "output", &r->replacement, "qkv_proj", false)) ||
        (rc = rule_parse_str(r, "weight_name", &r->weight_name, "weight_qkv", false)) ||
        (rc = rule_parse_str(r, "bias_name", &r->bias_name, "bias_qkv", false)) ||
        (rc = rule_parse_bool(r, "fused", &r->fused, true)) ||
        (rc = rule_parse_bool(r, "pad_heads", &r->pad_heads, true)) ||
        (rc = rule_parse_int(r, "tp", &r->tp, doc_tp, 1, PLAN_MAX_TP)) ||
        (rc = rule_parse_int(r, "num_attention_heads", &r->heads, 0, 1, 1 << 20)) ||
        (rc = rule_parse_int(r, "num_key_value_heads", &r->kv_heads, 0, 1, 1 << 20)) ||
        (rc = rule_parse_int(r, "head_dim", &r->head_dim, 0, 1, 1 << 20)) ||
        (rc = rule_parse_int(r, "kv_size_multiplier", &r->kv_mult, 0, 0, PLAN_MAX_TP)))
        return rc;
    const char *order = NULL;
    if ((rc = rule_parse_str(r, "kv_order", &order, "interleaved", false))) return rc;
    if (strcmp(order, "interleaved") && strcmp(order, "adjacent"))
        return rule_err(r, CKPT_EINVAL, "kv_order must be 'interleaved' or 'adjacent', not '%s'", order);
    r->kv_adjacent = !strcmp(order, "adjacent");
    if (!r->heads || !r->kv_heads || !r->head_dim)
        return rule_err(r, CKPT_EINVAL, "needs num_attention_heads, num_key_value_heads and head_dim");
    return rule_check_tp(r, doc_tp);
}

int rule_apply_fuse_qkv_gqa(const rule *r, plan_set *s, rules_result *res)
{
    gqa_geom g = {0};
    int rc = gqa_geometry(r, &g);
    if (rc) return rc;
    if (g.kpr * g.gpr > GQA_MAX_HEADS || g.kpr > GQA_MAX_HEADS)
        return rule_err(r, CKPT_ELIMIT, "too many heads per rank");
    matcher m;
    rc = matcher_init(&m, r);
    size_t n0 = s->n;
    bool *gone = ckpt_calloc(n0 + 1, sizeof *gone);
    if (!gone) rc = CKPT_ENOMEM;
    plan_name_index unsplit = {0}; /* the members looked up; build_rank only appends ranks */
    if (!rc) rc = plan_name_index_build(&unsplit, s, PLAN_ALL_RANKS);
    for (size_t i = 0; !rc && i < n0; i++) {
        if (gone[i] || s->t[i].rank != PLAN_ALL_RANKS) continue;
        int hit = rule_match(r, &m, s->t[i].name);
        if (hit <= 0) {
            rc = hit;
            continue;
        }
        char *prefix = rule_group(r, &m, s->t[i].name, 1);
        if (!prefix) {
            rc = CKPT_EINVAL;
            break;
        }
        attn_members a;
        rc = find_members(r, &unsplit, prefix, &a);
        uint64_t hd = (uint64_t)g.hd, H = (uint64_t)g.H, KV = (uint64_t)g.KV;
        uint64_t hidden = rc ? 0 : s->t[a.q].ndim == 2 ? s->t[a.q].shape[1] : 0;
        if (!rc) rc = check_shape(r, &s->t[a.q], 2, H * hd, hidden, "num_attention_heads x head_dim, hidden");
        if (!rc) rc = check_shape(r, &s->t[a.k], 2, KV * hd, hidden, "num_key_value_heads x head_dim, hidden");
        if (!rc) rc = check_shape(r, &s->t[a.v], 2, KV * hd, hidden, "num_key_value_heads x head_dim, hidden");
        if (!rc && a.o >= 0) rc = check_shape(r, &s->t[a.o], 2, s->t[a.o].shape[0], H * hd, "hidden, num_attention_heads x head_dim");
        if (!rc && a.qb >= 0) rc = check_shape(r, &s->t[a.qb], 1, H * hd, 0, "num_attention_heads x head_dim");
        if (!rc && a.kb >= 0) rc = check_shape(r, &s->t[a.kb], 1, KV * hd, 0, "num_key_value_heads x head_dim");
        if (!rc && a.vb >= 0) rc = check_shape(r, &s->t[a.vb], 1, KV * hd, 0, "num_key_value_heads x head_dim");
        for (int64_t rank = 0; !rc && rank < g.tp; rank++) rc = build_rank(r, s, prefix, &a, &g, rank);
        free(prefix);
        if (rc) break;
        long used[] = {a.q, a.k, a.v, a.o, a.qb, a.kb, a.vb};
        for (size_t u = 0; u < CKPT_ARRAY_LEN(used); u++)
            if (used[u] >= 0) gone[used[u]] = true;
    }
    plan_name_index_free(&unsplit);
    if (!rc) rc = rules_remove_consumed(s, gone, n0);
    free(gone);
    matcher_free(&m);
    return rc ? rc : rules_check_unique(r, s);
}

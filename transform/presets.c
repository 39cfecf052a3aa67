/* presets.c — rules generated from config.json for the neuron, fused, easydel, hf and vllm layouts. */
#include "transform/presets.h"

#include "common/error.h"
#include "common/json.h"
#include "common/util.h"
#include "format/dtype.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Names of the expert projections: Mixtral's w1/w3/w2 or gate/up/down_proj. */
typedef struct {
    const char *gate, *up, *down;
} expert_names;

typedef struct {
    int64_t heads, kv_heads, head_dim, hidden, experts;
    expert_names en;
} model_geom;

static int read_geometry(const json_t *cfg, model_geom *g, const char *what)
{
    int rc = cj_int(cfg, "num_attention_heads", &g->heads, what);
    if (!rc) rc = cj_int(cfg, "hidden_size", &g->hidden, what);
    if (rc) return rc;
    g->kv_heads = g->heads;
    g->head_dim = g->heads ? g->hidden / g->heads : 0;
    g->experts = 0;
    if ((rc = cj_int_opt(cfg, "num_key_value_heads", &g->kv_heads, what)) ||
        (rc = cj_int_opt(cfg, "head_dim", &g->head_dim, what)) ||
        (rc = cj_int_opt(cfg, "num_local_experts", &g->experts, what)) ||
        (rc = cj_int_opt(cfg, "num_experts", &g->experts, what)))
        return rc;
    if (g->heads <= 0 || g->kv_heads <= 0 || g->head_dim <= 0 || g->hidden <= 0)
        return ckpt_error_set(CKPT_EINVAL, "%s: head counts, head_dim and hidden_size must be positive", what);
    if (g->heads % g->kv_heads)
        return ckpt_error_set(CKPT_EINVAL, "%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld",
                              what, (long long)g->heads, (long long)g->kv_heads);
    const char *mt = "";
    cj_str_opt(cfg, "model_type", &mt, what);
    bool mixtral = !strcmp(mt, "mixtral");
    g->en = mixtral ? (expert_names){"w1", "w3", "w2"} : (expert_names){"gate_proj", "up_proj", "down_proj"};
    return 0;
}

/* vLLM: vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE, and
 * ShardedStateLoader.DEFAULT_PATTERN (model_loader/sharded_state_loader.py). */
#define VLLM_VOCAB_PADDING 64
#define VLLM_RANK_FILES "model-rank-{rank}-part-{part}.safetensors"

static int add(json_t *rules, json_t *rule)
{
    if (!rule || json_array_append_new(rules, rule)) return ckpt_error_set(CKPT_ENOMEM, "out of memory building rules");
    return 0;
}

static json_t *tp_split(const char *pattern, int axis, int tp)
{
    return json_pack("{s:s,s:s,s:i,s:i}", "op", "tp_split", "pattern", pattern, "axis", axis, "tp", tp);
}

static json_t *rename_rule(const char *pattern, const char *replacement)
{
    return json_pack("{s:s,s:s,s:s}", "op", "rename", "pattern", pattern, "replacement", replacement);
}

static json_t *fuse_rule(const char *pattern, const char *m1, const char *m2, const char *m3, const char *output,
                         int axis, int tp)
{
    json_t *members = m3 ? json_pack("[s,s,s]", m1, m2, m3) : json_pack("[s,s]", m1, m2);
    return json_pack("{s:s,s:s,s:o,s:s,s:i,s:i}", "op", "fuse", "pattern", pattern, "members", members, "output",
                     output, "axis", axis, "tp", tp);
}

static json_t *stack_rule(const model_geom *g, const char *output, bool transpose)
{
    char pat[256];
    snprintf(pat, sizeof pat, "^(.*)\\.experts\\.(\\d+)\\.(%s|%s|%s)\\.weight$", g->en.gate, g->en.up, g->en.down);
    return json_pack("{s:s,s:s,s:i,s:s,s:I,s:b}", "op", "stack_experts", "pattern", pat, "expert_group", 2, "output",
                     output, "num_experts", (json_int_t)g->experts, "transpose_last2", transpose);
}

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...)
{
    static _Thread_local char buf[4][512];
    static _Thread_local int slot;
    char *b = buf[slot++ & 3];
    va_list ap;
    va_start(ap, f);
    vsnprintf(b, 512, f, ap);
    va_end(ap);
    return b;
}

/* Column-parallel (axis 0) and row-parallel (axis 1) slices in Hugging Face
 * orientation, for the per-expert and dense projections. */
static int hf_tp_rules(json_t *rules, const model_geom *g, int tp)
{
    int rc = add(rules, tp_split("^(.*)\\.(q_proj|k_proj|v_proj)\\.(weight|bias)$", 0, tp));
    if (!rc) rc = add(rules, tp_split("^(.*)\\.o_proj\\.weight$", 1, tp));
    if (!rc) rc = add(rules, tp_split("^(.*)\\.mlp\\.(gate_proj|up_proj)\\.weight$", 0, tp));
    if (!rc) rc = add(rules, tp_split("^(.*)\\.mlp\\.down_proj\\.weight$", 1, tp));
    if (!rc && g->experts) {
        rc = add(rules, tp_split(fmt("^(.*)\\.experts\\.\\d+\\.(%s|%s)\\.weight$", g->en.gate, g->en.up), 0, tp));
        if (!rc) rc = add(rules, tp_split(fmt("^(.*)\\.experts\\.\\d+\\.%s\\.weight$", g->en.down), 1, tp));
    }
    if (!rc) rc = add(rules, tp_split("^(.*)embed_tokens\\.weight$", 0, tp));
    if (!rc) rc = add(rules, tp_split("^lm_head\\.weight$", 0, tp));
    return rc;
}

static int neuron_rules(json_t *rules, const model_geom *g, const preset_opts *o)
{
    json_t *gqa = json_pack("{s:s,s:s,s:I,s:I,s:I,s:i,s:b}", "op", "fuse_qkv_gqa", "pattern",
                            "^(.*\\.self_attn)\\.q_proj\\.weight$", "num_attention_heads", (json_int_t)g->heads,
                            "num_key_value_heads", (json_int_t)g->kv_heads, "head_dim", (json_int_t)g->head_dim, "tp",
                            o->tp, "fused", 1);
    if (gqa && o->kv_size_multiplier)
        json_object_set_new(gqa, "kv_size_multiplier", json_integer(o->kv_size_multiplier));
    int rc = add(rules, gqa);
    if (!rc)
        rc = add(rules, fuse_rule("^(.*\\.mlp)\\.(gate_proj|up_proj)\\.weight$", "gate_proj", "up_proj", NULL,
                                  "$1.gate_up_proj.weight", 0, o->tp));
    if (!rc && o->tp > 1) rc = add(rules, tp_split("^(.*)\\.mlp\\.down_proj\\.weight$", 1, o->tp));
    if (!rc && g->experts) {
        rc = add(rules, stack_rule(g, "$1.experts.$3.weight", true));
        if (!rc)
            rc = add(rules, fuse_rule(fmt("^(.*\\.experts)\\.(%s|%s)\\.weight$", g->en.gate, g->en.up), g->en.gate,
                                      g->en.up, NULL, "$1.gate_up_proj.weight", 2, o->tp));
        if (!rc && strcmp(g->en.down, "down_proj"))
            rc = add(rules, rename_rule(fmt("^(.*\\.experts)\\.%s\\.weight$", g->en.down), "$1.down_proj.weight"));
        if (!rc && o->tp > 1) rc = add(rules, tp_split("^(.*)\\.experts\\.down_proj\\.weight$", 1, o->tp));
    }
    if (!rc && o->tp > 1) rc = add(rules, tp_split("^(.*)embed_tokens\\.weight$", 0, o->tp));
    if (!rc && o->tp > 1) rc = add(rules, tp_split("^lm_head\\.weight$", 0, o->tp));
    return rc;
}

static int fused_rules(json_t *rules, const model_geom *g, const preset_opts *o)
{
    int tp = o->tp;
    int rc = add(rules, fuse_rule("^(.*\\.self_attn)\\.(q_proj|k_proj|v_proj)\\.(weight|bias)$", "q_proj", "k_proj",
                                  "v_proj", "$1.qkv_proj.$3", 0, tp));
    if (!rc) rc = add(rules, fuse_rule("^(.*\\.mlp)\\.(gate_proj|up_proj)\\.weight$", "gate_proj", "up_proj", NULL,
                                       "$1.gate_up_proj.weight", 0, tp));
    if (!rc && tp > 1) rc = add(rules, tp_split("^(.*)\\.o_proj\\.weight$", 1, tp));
    if (!rc && tp > 1) rc = add(rules, tp_split("^(.*)\\.mlp\\.down_proj\\.weight$", 1, tp));
    if (!rc && g->experts) {
        rc = add(rules, stack_rule(g, "$1.experts.$3.weight", false));
        if (!rc)
            rc = add(rules, fuse_rule(fmt("^(.*\\.experts)\\.(%s|%s)\\.weight$", g->en.gate, g->en.up), g->en.gate,
                                      g->en.up, NULL, "$1.gate_up_proj.weight", 1, tp));
        if (!rc && strcmp(g->en.down, "down_proj"))
            rc = add(rules, rename_rule(fmt("^(.*\\.experts)\\.%s\\.weight$", g->en.down), "$1.down_proj.weight"));
        if (!rc && tp > 1) rc = add(rules, tp_split("^(.*)\\.experts\\.down_proj\\.weight$", 2, tp));
    }
    if (!rc && tp > 1) rc = add(rules, tp_split("^(.*)embed_tokens\\.weight$", 0, tp));
    if (!rc && tp > 1) rc = add(rules, tp_split("^lm_head\\.weight$", 0, tp));
    return rc;
}

static int easydel_rules(json_t *rules, const model_geom *g, const preset_opts *o)
{
    int tp = o->tp, rc = 0;
    if (g->experts) rc = add(rules, stack_rule(g, "$1.experts.$3.kernel", true));
    if (!rc && tp > 1) {
        /* Split in Hugging Face orientation, before the kernels are transposed. */
        if (g->experts) {
            rc = add(rules, tp_split(fmt("^(.*)\\.experts\\.(%s|%s)\\.kernel$", g->en.gate, g->en.up), 2, tp));
            if (!rc) rc = add(rules, tp_split(fmt("^(.*)\\.experts\\.%s\\.kernel$", g->en.down), 1, tp));
        }
        json_t *dense = json_array();
        rc = rc ? rc : hf_tp_rules(dense, &(model_geom){.experts = 0}, tp);
        size_t i;
        json_t *r;
        json_array_foreach(dense, i, r) if (!rc) rc = add(rules, json_incref(r));
        json_decref(dense);
    }
    if (!rc) rc = add(rules, rename_rule("^(.*embed_tokens)\\.weight$", "$1.embedding"));
    if (!rc) rc = add(rules, rename_rule("^(.*norm)\\.weight$", "$1.scale"));
    if (!rc)
        rc = add(rules, json_pack("{s:s,s:s,s:s}", "op", "transpose", "pattern", "^(.*)\\.weight$", "replacement",
                                  "$1.kernel"));
    return rc;
}

/* vLLM's ShardedStateLoader state dict (docs/layouts.md, "vllm"): the shapes
 * vLLM's parallel layers give each rank, which need the sizes to divide as
 * vLLM's divide() asserts. */
static int vllm_check(const model_geom *g, const json_t *cfg, int tp)
{
    const char *w = "layout vllm";
    if (g->heads % tp)
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: num_attention_heads %lld does not divide by --tp %d (vLLM's QKVParallelLinear "
                              "gives every rank the same number of query heads)",
                              w, (long long)g->heads, tp);
    if (tp >= g->kv_heads ? tp % g->kv_heads : g->kv_heads % tp)
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: num_key_value_heads %lld and --tp %d: one must divide the other (vLLM's "
                              "QKVParallelLinear splits or replicates whole KV heads)",
                              w, (long long)g->kv_heads, tp);
    int64_t inter = 0, moe_inter = 0, vocab = 0;
    int rc = cj_int_opt(cfg, "intermediate_size", &inter, w);
    if (!rc) rc = cj_int_opt(cfg, "moe_intermediate_size", &moe_inter, w);
    if (!rc) rc = cj_int_opt(cfg, "vocab_size", &vocab, w);
    if (rc) return rc;
    if (inter % tp || moe_inter % tp)
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: the intermediate size (%lld%s) does not divide by --tp %d (vLLM's "
                              "MergedColumnParallelLinear and FusedMoE split it evenly)",
                              w, (long long)(inter % tp ? inter : moe_inter),
                              inter % tp ? "" : ", moe_intermediate_size", tp);
    int64_t padded = (vocab + VLLM_VOCAB_PADDING - 1) / VLLM_VOCAB_PADDING * VLLM_VOCAB_PADDING;
    if (padded % tp)
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: vocab_size %lld padded to %lld (a multiple of %d) does not divide by --tp %d "
                              "(vLLM's VocabParallelEmbedding)",
                              w, (long long)vocab, (long long)padded, VLLM_VOCAB_PADDING, tp);
    return 0;
}

static int vllm_rules(json_t *rules, const model_geom *g, const preset_opts *o, const json_t *cfg)
{
    int tp = o->tp;
    int rc = vllm_check(g, cfg, tp);
    if (rc) return rc;
    /* QKVParallelLinear: rank r = [q heads r*H/tp..; its KV heads; the same V heads], KV head r div
     * (tp/KV) when tp >= KV; o_proj (RowParallelLinear) the columns of those query heads. */
    rc = add(rules, json_pack("{s:s,s:s,s:I,s:I,s:I,s:i,s:b,s:b,s:s,s:s,s:s}", "op", "fuse_qkv_gqa", "pattern",
                              "^(.*\\.self_attn)\\.q_proj\\.weight$", "num_attention_heads", (json_int_t)g->heads,
                              "num_key_value_heads", (json_int_t)g->kv_heads, "head_dim", (json_int_t)g->head_dim,
                              "tp", tp, "fused", 1, "pad_heads", 0, "kv_order", "adjacent", "weight_name",
                              "weight", "bias_name", "bias"));
    /* MergedColumnParallelLinear [gate_r; up_r]; RowParallelLinear down_proj */
    if (!rc)
        rc = add(rules, fuse_rule("^(.*\\.mlp)\\.(gate_proj|up_proj)\\.weight$", "gate_proj", "up_proj", NULL,
                                  "$1.gate_up_proj.weight", 0, tp));
    if (!rc && tp > 1) rc = add(rules, tp_split("^(.*)\\.mlp\\.down_proj\\.weight$", 1, tp));
    if (!rc && g->experts) {
        /* FusedMoE: w13_weight [E, 2I/tp, hidden] = [w1_e rows r; w3_e rows r], w2_weight [E, hidden, I/tp] */
        rc = add(rules, stack_rule(g, "$1.experts.$3.weight", false));
        if (!rc)
            rc = add(rules, fuse_rule(fmt("^(.*\\.experts)\\.(%s|%s)\\.weight$", g->en.gate, g->en.up), g->en.gate,
                                      g->en.up, NULL, "$1.w13_weight", 1, tp));
        if (!rc && tp > 1) rc = add(rules, tp_split(fmt("^(.*\\.experts)\\.%s\\.weight$", g->en.down), 2, tp));
        if (!rc) rc = add(rules, rename_rule(fmt("^(.*\\.experts)\\.%s\\.weight$", g->en.down), "$1.w2_weight"));
    }
    /* VocabParallelEmbedding / ParallelLMHead: the vocabulary padded with zero rows to a multiple of 64
     * (at every tp, 1 included), then cut in tp row blocks. */
    const char *vocab[] = {"^model\\.embed_tokens\\.weight$", "^lm_head\\.weight$"};
    for (int i = 0; i < 2 && !rc; i++) {
        json_t *r = tp_split(vocab[i], 0, tp);
        if (r) json_object_set_new(r, "pad_multiple", json_integer(VLLM_VOCAB_PADDING));
        rc = add(rules, r);
    }
    /* Tied embeddings: lm_head shares embed_tokens' parameter, and _filter_subtensors keeps the smaller
     * key of the two, "lm_head.weight". */
    if (!rc && json_is_true(json_object_get(cfg, "tie_word_embeddings")))
        rc = add(rules, rename_rule("^model\\.embed_tokens\\.weight$", "lm_head.weight"));
    return rc;
}

static int hf_rules(json_t *rules, const model_geom *g, const preset_opts *o)
{
    return o->tp > 1 ? hf_tp_rules(rules, g, o->tp) : 0;
}

/* The presets: a new layout is a row here and its rules function above
 * (docs/layouts.md describes each). */
typedef struct {
    const char *name;
    int (*rules)(json_t *rules, const model_geom *g, const preset_opts *o);
    bool tp_in_name;      /* the layout name carries -tpN even at tp 1 */
    bool kv_multiplier;   /* takes --kv-size-multiplier */
    bool config_optional; /* needs no config.json at tp 1 */
    /* rules that read more of config.json than model_geom (instead of `rules`) */
    int (*rules_cfg)(json_t *rules, const model_geom *g, const preset_opts *o, const json_t *cfg);
    const char *rank_files; /* every rank's files in DST, named so (the document's "rank_files"), or NULL */
} preset_def;

static const preset_def presets[] = {
    {"neuron", neuron_rules, true, true, false, NULL, NULL},
    {"fused", fused_rules, false, false, false, NULL, NULL},
    {"easydel", easydel_rules, false, false, false, NULL, NULL},
    {"hf", hf_rules, false, false, true, NULL, NULL},
    {"vllm", NULL, true, false, false, vllm_rules, VLLM_RANK_FILES},
};

static const preset_def *preset_find(const char *name)
{
    for (size_t i = 0; name && i < CKPT_ARRAY_LEN(presets); i++)
        if (!strcmp(presets[i].name, name)) return &presets[i];
    return NULL;
}

char *preset_layout_name(const preset_opts *o)
{
    char tp[32] = "", kv[32] = "", dt[16] = "";
    const preset_def *d = preset_find(o->preset);
    if ((d && d->tp_in_name) || o->tp > 1) snprintf(tp, sizeof tp, "-tp%d", o->tp);
    if (o->kv_size_multiplier) snprintf(kv, sizeof kv, "-kv%lld", (long long)o->kv_size_multiplier);
    if (o->dtype) {
        snprintf(dt, sizeof dt, "-%s", o->dtype);
        for (char *p = dt; *p; p++) *p = (char)tolower((unsigned char)*p);
    }
    return ckpt_sprintf("%s%s%s%s", o->preset, tp, kv, dt);
}

int preset_check(const preset_opts *o)
{
    const preset_def *d = preset_find(o->preset);
    if (!d) {
        char known[128] = "";
        for (size_t i = 0; i < CKPT_ARRAY_LEN(presets); i++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", presets[i].name);
        return ckpt_error_set(CKPT_EINVAL, "unknown layout '%s' (known: %s)", o->preset ? o->preset : "", known);
    }
    if (o->tp < 1 || o->tp > 1024) return ckpt_error_set(CKPT_EINVAL, "--tp must be between 1 and 1024");
    ckpt_dtype dt;
    if (o->dtype && (ckpt_dtype_from_name(o->dtype, &dt) < 0 || !ckpt_dtype_is_castable_float(dt)))
        return ckpt_error_set(CKPT_EINVAL, "--dtype '%s' is not one of bf16, f16, f32", o->dtype);
    if (o->kv_size_multiplier && !d->kv_multiplier)
        return ckpt_error_set(CKPT_EINVAL, "--kv-size-multiplier applies to the neuron layout only");
    return 0;
}

int preset_rules(json_t **out, const json_t *config, const preset_opts *o, const char *what)
{
    *out = NULL;
    int rc = preset_check(o);
    if (rc) return rc;
    model_geom g = {0};
    const preset_def *d = preset_find(o->preset);
    bool needs_config = !d->config_optional || o->tp > 1;
    if (needs_config) {
        if (!config) return ckpt_error_set(CKPT_ENOTFOUND, "%s: layout '%s' needs config.json", what, o->preset);
        if ((rc = read_geometry(config, &g, what))) return rc;
    }
    json_t *rules = json_array();
    if (!rules) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    rc = d->rules_cfg ? d->rules_cfg(rules, &g, o, config) : d->rules(rules, &g, o);
    if (!rc && o->dtype) rc = add(rules, json_pack("{s:s,s:s}", "op", "cast", "dtype", o->dtype));
    char *name = rc ? NULL : preset_layout_name(o);
    if (!rc && !name) rc = CKPT_ENOMEM;
    if (rc) {
        json_decref(rules);
        return rc;
    }
    *out = json_pack("{s:s,s:i,s:s,s:s,s:i,s:o}", "format", "ckpt-rules", "version", 1, "layout", name, "preset",
                     o->preset, "tp", o->tp, "rules", rules);
    if (*out && d->rank_files) json_object_set_new(*out, "rank_files", json_string(d->rank_files));
    free(name);
    return *out ? 0 : ckpt_error_set(CKPT_ENOMEM, "out of memory");
}

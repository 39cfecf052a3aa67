/* nxd_export.c — a Hugging Face checkpoint to an optimum-neuron / neuronx-distributed training save (nxd_export.h). */
#include "transform/nxd_export.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/util.h"
#include "format/torch_write.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The training model's geometry and choices (modeling_llama.py LlamaAttention, LlamaMLP; the qwen3 and
 * granite models are that model with the differences below). */
typedef struct {
    const char *type;    /* llama, qwen3, granite */
    bool qk_norm;        /* qwen3: Qwen3Attention's q_norm, k_norm after o_proj */
    bool vocab_parallel; /* ParallelEmbedding and a ColumnParallelLinear lm_head (granite: nn.Embedding, nn.Linear) */
    bool tied;           /* tie_word_embeddings: lm_head.weight is embed_tokens.weight (tie_weights) */
    int64_t H, KV, hd, hidden, inter, vocab, layers;
    int64_t tp, m;   /* kv_size_multiplier as the model uses it (1 without GQAQKVColumnParallelLinear) */
    int64_t pp;      /* pipeline stages (TrainingNeuronConfig.pipeline_parallel_size) */
    bool qkv_linear; /* GQAQKVColumnParallelLinear */
    bool fuse_qkv;   /* trn_config.fuse_qkv */
    bool qkv_fused;  /* the stride-3 ColumnParallelLinear qkv_proj (fuse_qkv, as many KV heads as query heads) */
} nxd_model;

typedef struct {
    nxd_model g;
    json_t *params; /* create_parameter_metadata's "parameters": name -> attributes, in model order */
    json_t *specs;  /* its "model_weight_transformation_specs" */
    json_t *rules;  /* the forward rules over the Hugging Face tensors */
} nxd_out;

static int read_model(nxd_model *g, const json_t *cfg, const convert_opts *o, const nxd_export_opts *x)
{
    const char *w = "config.json", *mt = NULL;
    int rc = cj_str(cfg, "model_type", &mt, w);
    if (rc) return rc;
    static const char *const types[] = {"llama", "qwen3", "granite"};
    g->type = NULL;
    for (size_t i = 0; i < CKPT_ARRAY_LEN(types); i++)
        if (!strcmp(mt, types[i])) g->type = types[i];
    if (!g->type)
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: model_type '%s' is not one optimum-neuron trains (models/training: llama, qwen3, "
                              "granite)",
                              w, mt);
    g->qk_norm = !strcmp(g->type, "qwen3");
    g->vocab_parallel = strcmp(g->type, "granite") != 0;
    bool tied = false, abias = false, mbias = false, sliding = false;
    if ((rc = cj_bool_opt(cfg, "tie_word_embeddings", &tied, w)) || (rc = cj_bool_opt(cfg, "attention_bias", &abias, w)) ||
        (rc = cj_bool_opt(cfg, "mlp_bias", &mbias, w)) || (rc = cj_bool_opt(cfg, "use_sliding_window", &sliding, w)))
        return rc;
    g->tied = tied;
    if (abias || mbias)
        return ckpt_error_set(CKPT_EINVAL, "%s: %s is true, but optimum-neuron's %s builds its linears with bias=False", w,
                              abias ? "attention_bias" : "mlp_bias", g->type);
    if (sliding)
        return ckpt_error_set(CKPT_EINVAL, "%s: use_sliding_window is true: optimum-neuron's Qwen3Model refuses sliding window", w);
    if ((rc = cj_int(cfg, "num_attention_heads", &g->H, w)) || (rc = cj_int(cfg, "hidden_size", &g->hidden, w)) ||
        (rc = cj_int(cfg, "intermediate_size", &g->inter, w)) || (rc = cj_int(cfg, "vocab_size", &g->vocab, w)) ||
        (rc = cj_int(cfg, "num_hidden_layers", &g->layers, w)))
        return rc;
    g->KV = g->H;
    g->hd = g->H > 0 ? g->hidden / g->H : 0;
    if ((rc = cj_int_opt(cfg, "num_key_value_heads", &g->KV, w)) || (rc = cj_int_opt(cfg, "head_dim", &g->hd, w))) return rc;
    const int64_t big = (int64_t)1 << 40;
    if (g->H <= 0 || g->KV <= 0 || g->hd <= 0 || g->hidden <= 0 || g->inter <= 0 || g->vocab <= 0 || g->layers < 0 ||
        g->H > (1 << 20) || g->hd > (1 << 20) || g->hidden > big || g->inter > big || g->vocab > big || g->layers > (1 << 20))
        return ckpt_error_set(CKPT_EINVAL, "%s: head counts, head_dim and the sizes must be positive (and not absurd)", w);
    if (g->H % g->KV)
        return ckpt_error_set(CKPT_EINVAL, "%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld", w,
                              (long long)g->H, (long long)g->KV);
    int64_t tp = g->tp = o->tp > 0 ? o->tp : 1;
    g->fuse_qkv = x->fuse_qkv;
    /* LlamaAttention: qkv_linear = KV < tp or KV % tp != 0; kv_size_multiplier from trn_config or
     * auto_kv_size_multiplier (max(1, tp // KV), config.py) */
    g->qkv_linear = g->KV < tp || g->KV % tp;
    g->m = !g->qkv_linear ? 1 : o->kv_size_multiplier ? o->kv_size_multiplier : (tp / g->KV > 1 ? tp / g->KV : 1);
    g->qkv_fused = !g->qkv_linear && x->fuse_qkv && g->H == g->KV;
    if (g->inter % tp)
        return ckpt_error_set(CKPT_EINVAL, "%s: intermediate_size %lld does not divide by --tp %lld (LlamaMLP raises)", w,
                              (long long)g->inter, (long long)tp);
    if (g->vocab_parallel && g->vocab % tp)
        return ckpt_error_set(CKPT_EINVAL, "%s: vocab_size %lld does not divide by --tp %lld (ParallelEmbedding splits it evenly)",
                              w, (long long)g->vocab, (long long)tp);
    if (g->H % tp)
        return ckpt_error_set(CKPT_EINVAL, "%s: num_attention_heads %lld does not divide by --tp %lld", w, (long long)g->H,
                              (long long)tp);
    g->pp = x->pp > 0 ? x->pp : 1;
    if (g->pp > 1 && g->pp > g->layers)
        return ckpt_error_set(CKPT_EINVAL, "%s: %lld layers cannot fill --pp %lld stages (neuronx-distributed's create_partitions "
                              "asserts at least one layer per stage)", w, (long long)g->layers, (long long)g->pp);
    if (g->pp > 1 && g->tied)
        return ckpt_error_set(CKPT_EINVAL, "%s: tie_word_embeddings with --pp %lld: the embedding and lm_head would share a "
                              "parameter across the first and last stage (not supported)", w, (long long)g->pp);
    if (g->qkv_linear && (g->m > tp || tp % g->m || (g->KV * g->m) % tp))
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: %lld KV heads x kv_size_multiplier %lld do not divide by --tp %lld "
                              "(neuronx-distributed's GQAQKVColumnParallelLinear)",
                              w, (long long)g->KV, (long long)g->m, (long long)tp);
    return 0;
}

static int put(json_t *obj, const char *key, json_t *v)
{
    return v && !json_object_set_new(obj, key, v) ? 0 : ckpt_error_set(CKPT_ENOMEM, "out of memory building the metadata");
}

static int push(json_t *arr, json_t *v)
{
    return v && !json_array_append_new(arr, v) ? 0 : ckpt_error_set(CKPT_ENOMEM, "out of memory building the metadata");
}

/* get_tensor_model_parallel_attributes, or {"tensor_model_parallel": false} (create_parameter_metadata). */
static int param(nxd_out *n, const char *name, int partition_dim, int stride)
{
    json_t *a = partition_dim < 0
                    ? json_pack("{s:b}", "tensor_model_parallel", 0)
                    : json_pack("{s:b,s:i,s:i,s:I}", "tensor_model_parallel", 1, "partition_dim", partition_dim,
                                "partition_stride", stride, "num_partitions", (json_int_t)n->g.tp);
    return put(n->params, name, a);
}

/* ModelWeightTransformationSpecs.to_metadata: [class name, asdict(spec) + peft_type]. */
static json_t *fused_spec(const char *fused, const char *const *names, int n, int64_t dim, int64_t tp)
{
    json_t *ln = json_array(), *dims = json_array();
    for (int i = 0; ln && dims && i < n; i++) {
        json_array_append_new(ln, json_string(names[i]));
        json_array_append_new(dims, json_integer(dim));
    }
    return json_pack("[s,{s:s,s:o,s:b,s:i,s:o,s:I,s:n}]", "FusedLinearsSpec", "fused_linear_name", fused, "linear_names", ln,
                     "bias", 0, "fuse_axis", 0, "original_dims", dims, "tp_size", (json_int_t)tp, "peft_type");
}

static int add_rule(nxd_out *n, json_t *r) { return push(n->rules, r); }

static json_t *tp_split(const char *pattern, int axis, int64_t tp)
{
    return json_pack("{s:s,s:s,s:i,s:I}", "op", "tp_split", "pattern", pattern, "axis", axis, "tp", (json_int_t)tp);
}

static json_t *fuse(const char *pattern, json_t *members, const char *output, int64_t tp)
{
    return json_pack("{s:s,s:s,s:o,s:s,s:i,s:I}", "op", "fuse", "pattern", pattern, "members", members, "output", output,
                     "axis", 0, "tp", (json_int_t)tp);
}

/* The forward rules: how the training model holds the Hugging Face tensors (the rules nxd_import.c
 * rebuilds from the metadata to invert them). */
static int build_rules(nxd_out *n, const char *dtype)
{
    const nxd_model *g = &n->g;
    int64_t tp = g->tp;
    int rc = 0;
    if (g->qkv_linear) {
        /* GQAQKVColumnParallelLinearSpec._adapt_state_dict: query heads by compute_query_indices_for_rank,
         * KV heads tiled kv_size_multiplier times, o_proj's columns as the query heads */
        rc = add_rule(n, json_pack("{s:s,s:s,s:s,s:s,s:b,s:b,s:I,s:I,s:I,s:I,s:I}", "op", "fuse_qkv_gqa", "pattern",
                               "^(.*\\.self_attn)\\.q_proj\\.weight$", "output", "qkv_proj", "weight_name", "weight_qkv",
                               "fused", g->fuse_qkv, "pad_heads", 0, "tp", (json_int_t)tp, "num_attention_heads",
                               (json_int_t)g->H, "num_key_value_heads", (json_int_t)g->KV, "head_dim", (json_int_t)g->hd,
                               "kv_size_multiplier", (json_int_t)g->m));
        static const char *const x[3] = {"q", "k", "v"};
        for (int i = 0; i < 3 && !rc && !g->fuse_qkv; i++) {
            char pat[64], rep[64];
            snprintf(pat, sizeof pat, "^(.*\\.self_attn)\\.%s_proj\\.weight$", x[i]);
            snprintf(rep, sizeof rep, "$1.qkv_proj.weight_%s", x[i]);
            rc = add_rule(n, json_pack("{s:s,s:s,s:s}", "op", "rename", "pattern", pat, "replacement", rep));
        }
    } else {
        if (g->qkv_fused)
            rc = add_rule(n, fuse("^(.*\\.self_attn)\\.(q_proj|k_proj|v_proj)\\.weight$",
                              json_pack("[s,s,s]", "q_proj", "k_proj", "v_proj"), "$1.qkv_proj.weight", tp));
        else if (tp > 1)
            rc = add_rule(n, tp_split("^(.*)\\.self_attn\\.(q_proj|k_proj|v_proj)\\.weight$", 0, tp));
        if (!rc && tp > 1) rc = add_rule(n, tp_split("^(.*)\\.self_attn\\.o_proj\\.weight$", 1, tp));
    }
    /* FusedLinearsSpec gate_up_proj: create_local_fused_weight; RowParallelLinear down_proj */
    if (!rc)
        rc = add_rule(n, fuse("^(.*\\.mlp)\\.(gate_proj|up_proj)\\.weight$", json_pack("[s,s]", "gate_proj", "up_proj"),
                          "$1.gate_up_proj.weight", tp));
    if (!rc && tp > 1) rc = add_rule(n, tp_split("^(.*)\\.mlp\\.down_proj\\.weight$", 1, tp));
    /* ParallelEmbedding and the ColumnParallelLinear lm_head: vocabulary rows (granite: replicated) */
    if (!rc && tp > 1 && g->vocab_parallel) rc = add_rule(n, tp_split("^model\\.embed_tokens\\.weight$", 0, tp));
    if (!rc && tp > 1 && g->vocab_parallel) rc = add_rule(n, tp_split("^lm_head\\.weight$", 0, tp));
    if (!rc && dtype) rc = add_rule(n, json_pack("{s:s,s:s}", "op", "cast", "dtype", dtype));
    return rc;
}

/* create_parameter_metadata: the training model's parameters in named_parameters order (LlamaForCausalLM:
 * model.embed_tokens, each layer's self_attn, mlp and norms, model.norm, lm_head), then one spec entry per
 * CustomModule (each layer's LlamaAttention and LlamaMLP) in named_modules order. */
static int build_metadata(nxd_out *n)
{
    const nxd_model *g = &n->g;
    int64_t tp = g->tp;
    int rc = param(n, "model.embed_tokens.weight", g->vocab_parallel ? 0 : -1, 1);
    char name[160], mod[128];
    static const char *const qkv[3] = {"q_proj", "k_proj", "v_proj"}, *const gu[2] = {"gate_proj", "up_proj"};
    for (int64_t i = 0; i < g->layers && !rc; i++) {
        snprintf(mod, sizeof mod, "model.layers.%lld.self_attn", (long long)i);
        json_t *attn = json_array();
        if (g->qkv_linear) {
            /* NxD qkv_linear.py: weight_qkv is a new Parameter without tensor-parallel attributes;
             * weight_q/_k/_v keep theirs (partition_dim 0) */
            static const char *const sfx[3] = {"q", "k", "v"};
            for (int k = 0; k < (g->fuse_qkv ? 1 : 3) && !rc; k++) {
                snprintf(name, sizeof name, "%s.qkv_proj.weight_%s", mod, g->fuse_qkv ? "qkv" : sfx[k]);
                rc = param(n, name, g->fuse_qkv ? -1 : 0, 1);
            }
            json_t *f = json_pack("{s:s,s:s,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:b,s:b,s:I,s:n}", "gqa_qkv_projection_name",
                                  "qkv_proj", "query_projection_name", "q_proj", "key_projection_name", "k_proj",
                                  "value_projection_name", "v_proj", "output_projection_name", "o_proj",
                                  "num_attention_heads", (json_int_t)g->H, "num_key_value_heads", (json_int_t)g->KV,
                                  "kv_size_multiplier", (json_int_t)g->m, "q_output_size_per_partition",
                                  (json_int_t)(g->H * g->hd / tp), "kv_output_size_per_partition",
                                  (json_int_t)(g->KV * g->hd * g->m / tp), "fuse_qkv", g->fuse_qkv, "bias", 0, "tp_size",
                                  (json_int_t)tp, "peft_type");
            if (!rc) rc = push(attn, f ? json_pack("[s,o]", "GQAQKVColumnParallelLinearSpec", f) : NULL);
        } else if (g->qkv_fused) {
            snprintf(name, sizeof name, "%s.qkv_proj.weight", mod);
            rc = param(n, name, 0, 3);
            if (!rc) rc = push(attn, fused_spec("qkv_proj", qkv, 3, g->H * g->hd, tp));
        } else {
            for (int k = 0; k < 3 && !rc; k++) {
                snprintf(name, sizeof name, "%s.%s.weight", mod, qkv[k]);
                rc = param(n, name, 0, 1);
            }
        }
        snprintf(name, sizeof name, "%s.o_proj.weight", mod);
        if (!rc) rc = param(n, name, 1, 1);
        for (int k = 0; k < 2 && !rc && g->qk_norm; k++) {
            snprintf(name, sizeof name, "%s.%s.weight", mod, k ? "k_norm" : "q_norm");
            rc = param(n, name, -1, 1);
        }
        if (!rc) rc = push(n->specs, json_pack("{s:s,s:o}", "module_fully_qualified_name", mod, "specs", attn));
        else json_decref(attn);
        snprintf(mod, sizeof mod, "model.layers.%lld.mlp", (long long)i);
        snprintf(name, sizeof name, "%s.gate_up_proj.weight", mod);
        if (!rc) rc = param(n, name, 0, 2);
        snprintf(name, sizeof name, "%s.down_proj.weight", mod);
        if (!rc) rc = param(n, name, 1, 1);
        if (!rc)
            rc = push(n->specs, json_pack("{s:s,s:[o]}", "module_fully_qualified_name", mod, "specs",
                                          fused_spec("gate_up_proj", gu, 2, g->inter, tp)));
        snprintf(name, sizeof name, "model.layers.%lld.input_layernorm.weight", (long long)i);
        if (!rc) rc = param(n, name, -1, 1);
        snprintf(name, sizeof name, "model.layers.%lld.post_attention_layernorm.weight", (long long)i);
        if (!rc) rc = param(n, name, -1, 1);
    }
    if (!rc) rc = param(n, "model.norm.weight", -1, 1);
    /* tied: named_parameters() yields the shared parameter once, as model.embed_tokens.weight */
    if (!rc && !g->tied) rc = param(n, "lm_head.weight", g->vocab_parallel ? 0 : -1, 1);
    return rc;
}

/* trn_config.json: asdict(TrainingNeuronConfig) (models/training/config.py), the defaults but for what
 * the options set. */
/* The pipeline stage of a parameter or module: neuronx-distributed's create_partitions
 * (pipeline/partition.py, NxDPPModel with auto_partition as optimum-neuron's create_nxdpp_model builds
 * it) gives each stage layers / pp decoder layers, one more to each of the last layers % pp stages; the
 * embedding is in the first stage, the final norm and lm_head in the last. */
static int64_t stage_of(const nxd_model *g, const char *name)
{
    long long layer;
    if (sscanf(name, "model.layers.%lld.", &layer) == 1) {
        int64_t per = g->layers / g->pp, rem = g->layers % g->pp, first_big = g->pp - rem, at = 0;
        for (int64_t s = 0; s < g->pp; s++) {
            at += per + (s >= first_big);
            if (layer < at) return s;
        }
        return g->pp - 1;
    }
    return strncmp(name, "model.embed_tokens.", 19) ? g->pp - 1 : 0;
}

static json_t *trn_config(const nxd_model *g, const convert_opts *o, const nxd_export_opts *x)
{
    json_t *kv = o->kv_size_multiplier ? json_integer(o->kv_size_multiplier) : json_null();
    return json_pack("{s:I,s:b,s:o,s:I,s:i,s:i,s:b,s:b,s:n,s:i,s:b,s:b,s:b,s:b,s:b}", "tensor_parallel_size",
                     (json_int_t)g->tp, "sequence_parallel_enabled", 0, "kv_size_multiplier", kv, "pipeline_parallel_size", (json_int_t)g->pp,
                     "virtual_pipeline_parallel_size", 1, "pipeline_parallel_num_microbatches", 1,
                     "pipeline_parallel_use_zero1_optimizer", 0, "gradient_checkpointing", 0, "checkpoint_dir",
                     "num_local_ranks_per_step", 8, "use_xser", x->xser, "async_save", 0, "fuse_qkv", x->fuse_qkv,
                     "recompute_causal_mask", 1, "transpose_nki_inputs", 1);
}

/* Python's json.dumps(v, indent=4): jansson's indent 4 with insertion order and ASCII escapes, no newline. */
static int write_json_py(const char *path, const json_t *v)
{
    char *s = json_dumps(v, JSON_INDENT(4) | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
    if (!s) return ckpt_error_set(CKPT_ENOMEM, "out of memory rendering %s", path);
    int rc = ckpt_write_file_atomic(path, s, strlen(s));
    free(s);
    return rc;
}

static int write_text(const char *dir, const char *name, const char *text)
{
    char *p = ckpt_path_join(dir, name);
    int rc = p ? ckpt_write_file_atomic(p, text, strlen(text)) : CKPT_ENOMEM;
    free(p);
    return rc;
}

/* The torch.save files of the save: each planned by torch_write, written by the executor (storages) and
 * finished after it, or (no storages: xser's reference and .info.pt files) written whole after it. */
typedef struct {
    char *rel;
    torch_out to;
    size_t exec; /* its exec file (the storages'), or SIZE_MAX */
} nxd_file;

typedef struct {
    nxd_file *f;
    size_t n, cap;
} nxd_files;

static void files_free(nxd_files *fs)
{
    for (size_t i = 0; i < fs->n; i++) {
        free(fs->f[i].rel);
        torch_out_free(&fs->f[i].to);
    }
    free(fs->f);
}

/* A torch.save file REL holding tensors tt[0..k) (plan tensors pt) under data.pkl `pickle` (NULL: the
 * state dict), named after the file as PyTorchStreamWriter names its archive (the base name without
 * its last extension); with storages, an exec file for them: a layout without a header, the tensors
 * at torch_out's offsets, the file torch_out's size. */
static int add_file(exec_plan *p, nxd_files *fs, char *rel, const torch_out_tensor *tt, plan_tensor *const *pt, size_t k,
                    const uint8_t *pickle, size_t pickle_len)
{
    if (!rel) return CKPT_ENOMEM;
    if (ckpt_grow(&fs->f, &fs->cap, fs->n + 1, sizeof *fs->f)) {
        free(rel);
        return CKPT_ENOMEM;
    }
    nxd_file *nf = &fs->f[fs->n++];
    memset(nf, 0, sizeof *nf);
    nf->rel = rel;
    nf->exec = SIZE_MAX;
    const char *base = ckpt_basename(rel), *dot = strrchr(base, '.');
    char *archive = dot ? ckpt_sprintf("%.*s", (int)(dot - base), base) : ckpt_strdup(base);
    int rc = archive ? torch_out_plan_pickle(&nf->to, archive, tt, k, pickle, pickle_len) : CKPT_ENOMEM;
    free(archive);
    if (rc || !k) return rc;
    exec_file *f = ckpt_realloc(p->files, (p->nfiles + 2) * sizeof *p->files);
    if (!f) return CKPT_ENOMEM;
    p->files = f;
    f = &p->files[p->nfiles];
    memset(f, 0, sizeof *f);
    nf->exec = p->nfiles++; /* its slots are tt's order: out_crc32[exec][i] is t[i]'s */
    st_layout_init(&f->layout);
    f->rel = ckpt_strdup(rel);
    f->tensors = ckpt_calloc(k + 1, sizeof *f->tensors);
    if (!f->rel || !f->tensors) return CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < k; i++) {
        f->tensors[i] = pt[i];
        f->ntensors++;
        rc = st_layout_add(&f->layout, tt[i].name, tt[i].dtype, tt[i].ndim, tt[i].shape, i);
        if (!rc) f->layout.tensors[i].offset = nf->to.t[i].offset;
    }
    f->layout.file_size = nf->to.file_size;
    f->layout.finished = true;
    return rc;
}

/* One rank: the plan's tensors of `rank` in the metadata's parameter order. Plain: one torch.save of
 * the state dict. xser (_xser_save_data, _extract_tensor_info_and_update_state_dict): the .pt holds
 * TensorReference(tid) records, tid the tensor's index in the state dict, each tensor is
 * <file>.pt.tensors/tensor_<tid>.pt (torch.save of the tensor alone), and <file>.pt.info.pt
 * holds every tid's dtype and shape. */
static int layout_rank(exec_plan *p, nxd_files *fs, const convert_plan *cp, const nxd_model *g, const json_t *params,
                       const json_t *where, int rank, int64_t stage, bool xser, bool *used)
{
    int64_t tp = g->tp;
    bool tied = g->tied;
    size_t n = json_object_size(params) + 1;
    torch_out_tensor *tt = ckpt_calloc(n + 1, sizeof *tt);
    plan_tensor **pt = ckpt_calloc(n + 1, sizeof *pt);
    int rc = tt && pt ? 0 : CKPT_ENOMEM;
    const char *name;
    json_t *v;
    size_t k = 0;
    json_object_foreach((json_t *)params, name, v)
    {
        if (rc) break;
        if (stage_of(g, name) != stage) continue;
        json_t *idx = json_object_get(where, name);
        size_t i, at = (size_t)-1;
        json_t *e;
        json_array_foreach(idx, i, e)
        {
            size_t s = (size_t)json_integer_value(e);
            if (cp->set.t[s].rank == PLAN_ALL_RANKS || cp->set.t[s].rank == rank) at = s;
        }
        if (at == (size_t)-1) {
            rc = ckpt_error_set(CKPT_ENOTFOUND,
                                "parameter '%s' of optimum-neuron's training model (tp rank %d of %lld) has no source "
                                "tensor: is the checkpoint complete?",
                                name, rank, (long long)tp);
            break;
        }
        used[at] = true;
        plan_tensor *t = &cp->set.t[at];
        pt[k] = t;
        tt[k] = (torch_out_tensor){.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
        memcpy(tt[k].shape, t->shape, sizeof tt[k].shape);
        rc = ckpt_dtype_nbytes(t->dtype, t->ndim, t->shape, &tt[k].nbytes);
        k++;
    }
    /* tied: model.state_dict() still holds lm_head.weight, last, with the embedding's values (the
     * parameter it shares; a tensor of its own in the file, as each is moved to the CPU on its own) */
    for (size_t i = 0; !rc && tied && i < k; i++)
        if (!strcmp(tt[i].name, "model.embed_tokens.weight")) {
            pt[k] = pt[i];
            tt[k] = tt[i];
            tt[k].name = "lm_head.weight";
            k++;
            break;
        }
    char *rel = rc ? NULL : ckpt_sprintf("shards/model/dp_rank_00_tp_rank_%02d_pp_rank_%02lld.pt", rank, (long long)stage);
    if (!rc && !rel) rc = CKPT_ENOMEM;
    if (!rc && !xser) {
        rc = add_file(p, fs, rel, tt, pt, k, NULL, 0);
        rel = NULL;
    }
    uint8_t *pk = NULL;
    size_t pklen = 0;
    for (size_t i = 0; !rc && xser && i < k; i++) {
        rc = torch_out_pickle_tensor(&tt[i], &pk, &pklen);
        if (!rc) rc = add_file(p, fs, ckpt_sprintf("%s.tensors/tensor_%zu.pt", rel, i), &tt[i], &pt[i], 1, pk, pklen);
        free(pk);
        pk = NULL;
    }
    if (!rc && xser) rc = torch_out_pickle_records(tt, k, "torch_xla.utils.serialization", "TensorReference", "tid", &pk, &pklen);
    if (!rc && xser) rc = add_file(p, fs, ckpt_strdup(rel), NULL, NULL, 0, pk, pklen);
    free(pk);
    pk = NULL;
    if (!rc && xser) rc = torch_out_pickle_xser_info(tt, k, &pk, &pklen);
    if (!rc && xser) rc = add_file(p, fs, ckpt_sprintf("%s.info.pt", rel), NULL, NULL, 0, pk, pklen);
    free(pk);
    free(rel);
    free(pt);
    free(tt);
    return rc;
}

/* After the executor: every torch.save file gets the rest of its zip (torch_out_finish_crc, with the
 * storages' CRC-32 the executor took as it wrote them; the files without storages are created here).
 * Durability comes after, for all of them at once (write_save). */
static int finish_files(const nxd_files *fs, const char *tmp, uint32_t *const *crc)
{
    int rc = 0;
    for (size_t f = 0; !rc && f < fs->n; f++) {
        char *path = ckpt_path_join(tmp, fs->f[f].rel);
        char *slash = path ? strrchr(path, '/') : NULL;
        if (!path) rc = CKPT_ENOMEM;
        if (!rc && fs->f[f].to.n == 0 && slash) {
            *slash = '\0';
            rc = ckpt_mkdir_p(path, 0755);
            *slash = '/';
        }
        int fd = rc ? -1 : open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (!rc && fd < 0) rc = ckpt_error_sys("%s: open", path);
        if (!rc) rc = torch_out_finish_crc(&fs->f[f].to, fd, path, fs->f[f].exec == SIZE_MAX ? NULL : crc[fs->f[f].exec]);
        if (fd >= 0 && close(fd) < 0 && !rc) rc = ckpt_error_sys("%s: close", path);
        free(path);
    }
    return rc;
}

/* mp_metadata_pp_rank_<s>.json: create_parameter_metadata on stage s — its parameters, and every
 * CustomModule's entry with the specs ModelWeightTransformationSpecs.to_metadata keeps for the stage (those
 * whose parameters the stage holds: a layer's, in the layer's stage; the others' lists empty). */
static int write_stage_metadata(const nxd_out *n, const char *shards, int64_t s)
{
    json_t *params = json_object(), *specs = json_array(), *e;
    int rc = params && specs ? 0 : CKPT_ENOMEM;
    const char *name;
    json_t *v;
    json_object_foreach(n->params, name, v)
    {
        if (!rc && stage_of(&n->g, name) == s) rc = put(params, name, json_incref(v));
    }
    size_t i;
    json_array_foreach(n->specs, i, e)
    {
        if (rc) break;
        const char *mod = json_string_value(json_object_get(e, "module_fully_qualified_name"));
        char *dotted = mod ? ckpt_sprintf("%s.", mod) : NULL;
        if (!dotted) {
            rc = CKPT_ENOMEM;
            break;
        }
        json_t *kept = stage_of(&n->g, dotted) == s ? json_incref(json_object_get(e, "specs")) : json_array();
        free(dotted);
        rc = push(specs, kept ? json_pack("{s:s,s:o}", "module_fully_qualified_name", mod, "specs", kept) : NULL);
    }
    json_t *meta = rc ? NULL : json_pack("{s:O,s:O}", "parameters", params, "model_weight_transformation_specs", specs);
    if (!rc && !meta) rc = CKPT_ENOMEM;
    char *file = rc ? NULL : ckpt_sprintf("mp_metadata_pp_rank_%lld.json", (long long)s);
    char *mp = file ? ckpt_path_join(shards, file) : NULL;
    if (!rc && !mp) rc = CKPT_ENOMEM;
    if (!rc) rc = write_json_py(mp, meta);
    free(file);
    free(mp);
    json_decref(meta);
    json_decref(params);
    json_decref(specs);
    return rc;
}

static int write_save(convert_plan *cp, nxd_out *n, const nxd_files *fs, const char *dst, const convert_opts *o,
                      const nxd_export_opts *x)
{
    char *tmp = NULL;
    int rc = outdir_prepare(dst, o->force, &tmp);
    if (rc) return rc;
    /* no fsync per file: an xser save is thousands of files (one per tensor per rank), each finished after
     * the executor; one syncfs makes them all durable, as the store does with its blobs */
    exec_opts eo = {.threads = o->threads, .quiet = o->quiet, .label = "convert", .no_fsync = true};
    /* each storage's CRC-32 taken as it is written, for its zip entry: no file is read back */
    size_t nexec = cp->exec.nfiles;
    uint32_t **crc = ckpt_calloc(nexec + 1, sizeof *crc);
    if (!crc) rc = CKPT_ENOMEM;
    for (size_t f = 0; !rc && f < nexec; f++)
        if (!(crc[f] = ckpt_calloc(cp->exec.files[f].layout.ntensors + 1, sizeof *crc[f]))) rc = CKPT_ENOMEM;
    eo.out_crc32 = crc;
    char *shards = rc ? NULL : ckpt_path_join(tmp, "shards");
    if (!rc && !shards) rc = CKPT_ENOMEM;
    if (!rc) rc = ckpt_mkdir_p(shards, 0755);
    if (!rc) rc = write_text(shards, "checkpoint", "1"); /* CheckpointIOState.begin */
    if (!rc) rc = exec_run(&cp->exec, tmp, &eo);
    if (!rc) rc = finish_files(fs, tmp, crc);
    for (size_t f = 0; crc && f < nexec; f++) free(crc[f]);
    free(crc);
    int sync_fd = rc ? -1 : open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (!rc && sync_fd < 0) rc = ckpt_error_sys("%s: open", tmp);
    if (!rc && syncfs(sync_fd) < 0) rc = ckpt_error_sys("%s: sync", tmp); /* the files and their folders */
    if (sync_fd >= 0) close(sync_fd);
    for (int64_t s = 0; !rc && s < n->g.pp; s++) rc = write_stage_metadata(n, shards, s);
    if (!rc) rc = outdir_copy_side_files(cp->src_dir, tmp);
    json_t *trn = rc ? NULL : trn_config(&n->g, o, x);
    if (!rc && !trn) rc = CKPT_ENOMEM;
    char *tp = rc ? NULL : ckpt_path_join(tmp, "trn_config.json");
    if (!rc && !tp) rc = CKPT_ENOMEM;
    if (!rc) rc = write_json_py(tp, trn);
    free(tp);
    json_decref(trn);
    if (!rc) rc = write_text(shards, "done", "1"); /* CheckpointIOState.end, last */
    if (!rc) rc = ckpt_fsync_dir(shards);
    if (!rc) rc = ckpt_fsync_dir(tmp);
    if (!rc) rc = outdir_commit(tmp, dst, o->force);
    if (rc) ckpt_rm_rf(tmp);
    free(shards);
    free(tmp);
    return rc;
}

int nxd_export(const char *src, const char *dst, const convert_opts *o, const nxd_export_opts *x)
{
    if (!o->force && !ckpt_dir_is_empty_or_missing(dst))
        return ckpt_error_set(CKPT_EEXIST, "%s exists and is not empty (--force replaces it)", dst);
    nxd_out n = {0};
    json_t *cfg = NULL;
    char *cfg_path = ckpt_path_join(src, "config.json");
    int rc = cfg_path ? 0 : CKPT_ENOMEM;
    if (!rc && !ckpt_exists(cfg_path)) rc = ckpt_error_set(CKPT_ENOTFOUND, "%s: --format nxd needs the model's config.json", cfg_path);
    if (!rc) rc = cj_load_file(&cfg, cfg_path, CONVERT_CONFIG_MAX_BYTES);
    free(cfg_path);
    if (!rc) rc = read_model(&n.g, cfg, o, x);
    json_decref(cfg);
    n.params = json_object();
    n.specs = json_array();
    n.rules = json_array();
    if (!rc && (!n.params || !n.specs || !n.rules)) rc = CKPT_ENOMEM;
    if (!rc) rc = build_metadata(&n);
    if (!rc) rc = build_rules(&n, o->dtype);
    char *layout = rc ? NULL : ckpt_sprintf("neuron-nxd-tp%lld", (long long)n.g.tp);
    json_t *doc = layout ? json_pack("{s:s,s:i,s:s,s:I,s:O}", "format", "ckpt-rules", "version", 1, "layout", layout, "tp",
                                     (json_int_t)n.g.tp, "rules", n.rules)
                         : NULL;
    if (!rc && !doc) rc = CKPT_ENOMEM;
    free(layout);
    convert_plan cp;
    memset(&cp, 0, sizeof cp);
    convert_opts po = {.tp = (int)n.g.tp, .rules_doc = doc, .no_files = true};
    if (!rc) rc = convert_plan_build(&cp, src, &po);
    json_decref(doc);
    if (!rc && cp.state)
        rc = ckpt_error_set(CKPT_EINVAL, "%s: a training state with optimizer files: --format nxd writes the model only", src);
    /* where each output name is in the plan (a name set: rank-split tensors appear once per rank) */
    json_t *where = rc ? NULL : json_object();
    if (!rc && !where) rc = CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < cp.set.n; i++) {
        json_t *a = json_object_get(where, cp.set.t[i].name);
        if (!a && (!(a = json_array()) || json_object_set_new(where, cp.set.t[i].name, a))) rc = CKPT_ENOMEM;
        if (!rc && json_array_append_new(a, json_integer((json_int_t)i))) rc = CKPT_ENOMEM;
    }
    bool *used = rc ? NULL : ckpt_calloc(cp.set.n + 1, sizeof *used);
    nxd_files fs = {0};
    if (!rc && !used) rc = CKPT_ENOMEM;
    for (int64_t s = 0; !rc && s < n.g.pp; s++)
        for (int r = 0; !rc && r < n.g.tp; r++) rc = layout_rank(&cp.exec, &fs, &cp, &n.g, n.params, where, r, s, x->xser, used);
    if (!rc && n.g.tied && json_object_get(where, "lm_head.weight"))
        rc = ckpt_error_set(CKPT_EINVAL, "%s: tie_word_embeddings is true, but the source holds an lm_head.weight of its own", src);
    for (size_t i = 0; !rc && i < cp.set.n; i++)
        if (!used[i])
            rc = ckpt_error_set(CKPT_EINVAL, "%s: tensor '%s' has no place in optimum-neuron's %s training model", src,
                                cp.set.t[i].name, n.g.type);
    if (!rc) rc = write_save(&cp, &n, &fs, dst, o, x);
    files_free(&fs);
    free(used);
    json_decref(where);
    convert_plan_free(&cp);
    json_decref(n.params);
    json_decref(n.specs);
    json_decref(n.rules);
    return rc;
}

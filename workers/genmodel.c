/*
 * genmodel.c — synthetic Hugging Face checkpoints (see genmodel.h).
 *
 * Three steps: resolve the architecture table and the options into a
 * genmodel_config, list the tensors in state-dict order, then write them with
 * st_write_file(), whose fill callback generates each tensor's values one
 * chunk at a time. Values come from a counter-based generator (the splitmix64
 * mixer applied to key + counter), so any element can be computed on its own:
 * chunks need no shared state and genmodel_values() can recompute any stretch.
 */
#include "workers/genmodel.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "storage/checkpoint.h"
#include "storage/safetensors.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* genmodel_values() hands host floats to ckpt_convert, which reads little-endian bytes. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "genmodel assumes a little-endian host");

/* Elements generated per write: 4 MiB of floats, whatever the tensor size. */
#define CHUNK_ELEMS ((size_t)1 << 20)
#define INIT_STD 0.02

/* The unscaled Hugging Face models. hidden == 0 means heads * head_dim. */
typedef struct {
    const char *arch, *alias, *model_type, *architecture;
    uint64_t hidden, heads, kv_heads, head_dim, intermediate, moe_intermediate, vocab, layers;
    uint64_t max_position_embeddings;
    double rms_norm_eps, rope_theta;
    bool tied, qkv_bias, qk_norm;
    genmodel_moe_style moe;
    uint64_t experts, experts_per_tok;
    bool norm_topk_prob;
} arch_spec;

/* A table reads better than clang-format's one field per line. */
// clang-format off
static const arch_spec arch_specs[] = {
    {.arch = "llama", .model_type = "llama", .architecture = "LlamaForCausalLM",
     .heads = 32, .kv_heads = 8, .head_dim = 128, .intermediate = 14336, .vocab = 128256,
     .layers = 32, .max_position_embeddings = 8192, .rms_norm_eps = 1e-5, .rope_theta = 500000.0,
     .moe = GENMODEL_DENSE},
    {.arch = "qwen2", .model_type = "qwen2", .architecture = "Qwen2ForCausalLM",
     .heads = 14, .kv_heads = 2, .head_dim = 64, .intermediate = 4864, .vocab = 151936,
     .layers = 24, .max_position_embeddings = 131072, .rms_norm_eps = 1e-6,
     .rope_theta = 1000000.0, .tied = true, .qkv_bias = true, .moe = GENMODEL_DENSE},
    {.arch = "mixtral", .model_type = "mixtral", .architecture = "MixtralForCausalLM",
     .heads = 32, .kv_heads = 8, .head_dim = 128, .intermediate = 14336, .vocab = 32000,
     .layers = 32, .max_position_embeddings = 32768, .rms_norm_eps = 1e-5,
     .rope_theta = 1000000.0, .moe = GENMODEL_MOE_MIXTRAL, .experts = 8, .experts_per_tok = 2},
    {.arch = "qwen3-moe", .alias = "qwen3_moe", .model_type = "qwen3_moe",
     .architecture = "Qwen3MoeForCausalLM", .hidden = 2048, .heads = 32, .kv_heads = 4,
     .head_dim = 128, .intermediate = 6144, .moe_intermediate = 768, .vocab = 151936,
     .layers = 48, .max_position_embeddings = 40960, .rms_norm_eps = 1e-6,
     .rope_theta = 1000000.0, .qk_norm = true, .moe = GENMODEL_MOE_QWEN3, .experts = 128,
     .experts_per_tok = 8, .norm_topk_prob = true},
};
// clang-format on

static const arch_spec *arch_find(const char *name)
{
    for (size_t i = 0; name && i < CKPT_ARRAY_LEN(arch_specs); i++) {
        const arch_spec *a = &arch_specs[i];
        if (!strcmp(name, a->arch) || (a->alias && !strcmp(name, a->alias))) return a;
    }
    return NULL;
}

void genmodel_opts_init(genmodel_opts *o, const char *arch)
{
    memset(o, 0, sizeof *o);
    o->arch = arch;
    o->scale = 1;
    o->dtype = CKPT_DT_BF16;
    o->max_shard_size = GENMODEL_DEFAULT_SHARD_SIZE;
}

static uint64_t scaled(uint64_t width, uint64_t scale)
{
    return width / scale ? width / scale : 1;
}

int genmodel_config_get(genmodel_config *c, const genmodel_opts *o)
{
    const arch_spec *a = arch_find(o->arch);
    if (!a)
        return ckpt_error_set(CKPT_EINVAL,
                              "unknown architecture '%s' (use llama, qwen2, mixtral or qwen3-moe)",
                              o->arch ? o->arch : "");
    if (o->scale < 1 || o->scale > GENMODEL_MAX_SCALE)
        return ckpt_error_set(CKPT_EINVAL, "scale %llu is out of range (1..%u)",
                              (unsigned long long)o->scale, GENMODEL_MAX_SCALE);
    if (o->layers > GENMODEL_MAX_LAYERS)
        return ckpt_error_set(CKPT_EINVAL, "layers %llu is out of range (1..%d)",
                              (unsigned long long)o->layers, GENMODEL_MAX_LAYERS);
    if (o->dtype != CKPT_DT_BF16 && o->dtype != CKPT_DT_F16 && o->dtype != CKPT_DT_F32)
        return ckpt_error_set(CKPT_EINVAL, "dtype %s is not one of bf16, f16, f32",
                              ckpt_dtype_name(o->dtype));
    memset(c, 0, sizeof *c);
    c->arch = a->arch;
    c->model_type = a->model_type;
    c->architecture = a->architecture;
    c->num_attention_heads = a->heads;
    c->num_key_value_heads = a->kv_heads;
    c->head_dim = scaled(a->head_dim, o->scale);
    c->hidden_size = a->hidden ? scaled(a->hidden, o->scale) : a->heads * c->head_dim;
    c->intermediate_size = scaled(a->intermediate, o->scale);
    c->vocab_size = scaled(a->vocab, o->scale);
    c->num_hidden_layers = o->layers ? o->layers : a->layers;
    c->max_position_embeddings = a->max_position_embeddings;
    c->rms_norm_eps = a->rms_norm_eps;
    c->rope_theta = a->rope_theta;
    c->tie_word_embeddings = a->tied;
    c->qkv_bias = a->qkv_bias;
    c->qk_norm = a->qk_norm;
    c->moe = a->moe;
    c->num_experts = a->experts;
    c->num_experts_per_tok = a->experts_per_tok;
    if (a->moe != GENMODEL_DENSE) /* mixtral's experts are intermediate_size wide */
        c->moe_intermediate_size =
            a->moe_intermediate ? scaled(a->moe_intermediate, o->scale) : c->intermediate_size;
    c->norm_topk_prob = a->norm_topk_prob;
    c->dtype = o->dtype;
    return 0;
}

/* ---- the tensor list ---- */

typedef struct {
    genmodel_tensor *t;
    size_t n, cap;
} tensor_list;

static int list_add(tensor_list *l, genmodel_init init, uint64_t d0, uint64_t d1, const char *fmt,
                    ...) __attribute__((format(printf, 5, 6)));

/* Adds one tensor; d1 == 0 makes it 1-D [d0]. */
static int list_add(tensor_list *l, genmodel_init init, uint64_t d0, uint64_t d1, const char *fmt,
                    ...)
{
    int rc = ckpt_grow(&l->t, &l->cap, l->n + 1, sizeof *l->t);
    if (rc) return rc;
    char name[ST_MAX_NAME];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    assert(len > 0 && (size_t)len < sizeof name);
    genmodel_tensor *t = &l->t[l->n];
    memset(t, 0, sizeof *t);
    t->init = init;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    if (!ckpt_mul(d0, d1 ? d1 : 1, &t->numel))
        return ckpt_error_set(CKPT_ELIMIT, "tensor '%s' is too large", name);
    t->name = ckpt_strdup(name);
    if (!t->name) return CKPT_ENOMEM;
    l->n++;
    return 0;
}

/* One gated MLP: its three projections in module order, each [I, hidden]
 * (into the MLP) or [hidden, I] (out of it). */
typedef struct {
    const char *name;
    bool out;
} mlp_proj;

static const mlp_proj dense_projs[3] = {
    {"gate_proj", false}, {"up_proj", false}, {"down_proj", true}};
static const mlp_proj mixtral_projs[3] = {{"w1", false}, {"w2", true}, {"w3", false}};

static int add_mlp(tensor_list *l, const char *prefix, const mlp_proj *projs, uint64_t width,
                   uint64_t hidden)
{
    for (int p = 0; p < 3; p++) {
        uint64_t d0 = projs[p].out ? hidden : width, d1 = projs[p].out ? width : hidden;
        int rc = list_add(l, GENMODEL_INIT_NORMAL, d0, d1, "%s.%s.weight", prefix, projs[p].name);
        if (rc) return rc;
    }
    return 0;
}

static int add_attention(tensor_list *l, const genmodel_config *c, const char *layer)
{
    static const char *const qkv[3] = {"q_proj", "k_proj", "v_proj"};
    const uint64_t rows[3] = {c->num_attention_heads * c->head_dim,
                              c->num_key_value_heads * c->head_dim,
                              c->num_key_value_heads * c->head_dim};
    int rc = 0;
    for (int p = 0; p < 3 && !rc; p++) {
        rc = list_add(l, GENMODEL_INIT_NORMAL, rows[p], c->hidden_size, "%s.self_attn.%s.weight",
                      layer, qkv[p]);
        if (!rc && c->qkv_bias)
            rc = list_add(l, GENMODEL_INIT_NORMAL, rows[p], 0, "%s.self_attn.%s.bias", layer,
                          qkv[p]);
    }
    if (!rc)
        rc = list_add(l, GENMODEL_INIT_NORMAL, c->hidden_size, rows[0],
                      "%s.self_attn.o_proj.weight", layer);
    if (!rc && c->qk_norm)
        rc = list_add(l, GENMODEL_INIT_NORM, c->head_dim, 0, "%s.self_attn.q_norm.weight", layer);
    if (!rc && c->qk_norm)
        rc = list_add(l, GENMODEL_INIT_NORM, c->head_dim, 0, "%s.self_attn.k_norm.weight", layer);
    return rc;
}

/* The feed-forward block: a dense MLP, or a router plus experts. */
static int add_ffn(tensor_list *l, const genmodel_config *c, const char *layer)
{
    char prefix[128];
    if (c->moe == GENMODEL_DENSE) {
        snprintf(prefix, sizeof prefix, "%s.mlp", layer);
        return add_mlp(l, prefix, dense_projs, c->intermediate_size, c->hidden_size);
    }
    const bool mixtral = c->moe == GENMODEL_MOE_MIXTRAL;
    const char *block = mixtral ? "block_sparse_moe" : "mlp";
    int rc = list_add(l, GENMODEL_INIT_NORMAL, c->num_experts, c->hidden_size, "%s.%s.gate.weight",
                      layer, block);
    for (uint64_t e = 0; e < c->num_experts && !rc; e++) {
        snprintf(prefix, sizeof prefix, "%s.%s.experts.%llu", layer, block, (unsigned long long)e);
        rc = add_mlp(l, prefix, mixtral ? mixtral_projs : dense_projs, c->moe_intermediate_size,
                     c->hidden_size);
    }
    return rc;
}

static int build_tensors(tensor_list *l, const genmodel_config *c)
{
    int rc = list_add(l, GENMODEL_INIT_NORMAL, c->vocab_size, c->hidden_size,
                      "model.embed_tokens.weight");
    for (uint64_t i = 0; i < c->num_hidden_layers && !rc; i++) {
        char layer[64];
        snprintf(layer, sizeof layer, "model.layers.%llu", (unsigned long long)i);
        rc = add_attention(l, c, layer);
        if (!rc) rc = add_ffn(l, c, layer);
        if (!rc)
            rc = list_add(l, GENMODEL_INIT_NORM, c->hidden_size, 0, "%s.input_layernorm.weight",
                          layer);
        if (!rc)
            rc = list_add(l, GENMODEL_INIT_NORM, c->hidden_size, 0,
                          "%s.post_attention_layernorm.weight", layer);
    }
    if (!rc) rc = list_add(l, GENMODEL_INIT_NORM, c->hidden_size, 0, "model.norm.weight");
    if (!rc && !c->tie_word_embeddings)
        rc = list_add(l, GENMODEL_INIT_NORMAL, c->vocab_size, c->hidden_size, "lm_head.weight");
    return rc;
}

int genmodel_tensors(const genmodel_config *c, genmodel_tensor **out, size_t *n)
{
    tensor_list l = {0};
    int rc = build_tensors(&l, c);
    if (rc) {
        genmodel_tensors_free(l.t, l.n);
        return rc;
    }
    *out = l.t;
    *n = l.n;
    return 0;
}

void genmodel_tensors_free(genmodel_tensor *t, size_t n)
{
    for (size_t i = 0; t && i < n; i++)
        free(t[i].name);
    free(t);
}

/* ---- values ---- */

#define GOLDEN 0x9e3779b97f4a7c15ULL

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A tensor's stream key: the seed mixed with a FNV-1a hash of its name. */
static uint64_t tensor_key(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ULL;
    return mix64(seed ^ mix64(h));
}

/* Element i of a tensor is drawn from 32-bit half (i & 1) of the 64-bit word
 * mix64(key + (i / 2 + 1) * GOLDEN): the sum of its four bytes (Irwin-Hall,
 * n = 4) is close to normal with mean 510 and std 256 / sqrt(3), and two
 * elements per word halve the cost of the mixer. */
static inline float draw(uint64_t word, unsigned half, float mean, float unit)
{
    uint32_t w = (uint32_t)(word >> (32 * half));
    int32_t sum = (int32_t)((w & 0xff) + ((w >> 8) & 0xff) + ((w >> 16) & 0xff) + (w >> 24)) - 510;
    return mean + (float)sum * unit;
}

void genmodel_values(uint64_t seed, const genmodel_tensor *t, uint64_t first, size_t n, float *out)
{
    const float unit = (float)(INIT_STD * 1.7320508075688772 / 256.0);
    const float mean = t->init == GENMODEL_INIT_NORM ? 1.0f : 0.0f;
    const uint64_t key = tensor_key(seed, t->name);
    size_t j = 0;
    if ((first & 1) && n) { /* an odd start finishes the pair it begins in */
        out[j++] = draw(mix64(key + (first / 2 + 1) * GOLDEN), 1, mean, unit);
        first++;
    }
    /* Now out[j + 2p + h] is half h of pair p counted from `first`. */
    const uint64_t base = key + (first / 2 + 1) * GOLDEN;
    const size_t rest = n - j;
    for (size_t p = 0; p < rest / 2; p++) {
        uint64_t r = mix64(base + (uint64_t)p * GOLDEN);
        out[j + 2 * p] = draw(r, 0, mean, unit);
        out[j + 2 * p + 1] = draw(r, 1, mean, unit);
    }
    if (rest & 1) out[n - 1] = draw(mix64(base + (uint64_t)(rest / 2) * GOLDEN), 0, mean, unit);
}

/* ---- writing ---- */

typedef struct {
    uint64_t seed;
    const genmodel_tensor *tensors;
    ckpt_dtype dtype;
    unsigned elem_size;
    float *values; /* CHUNK_ELEMS floats */
    void *bytes;   /* CHUNK_ELEMS elements of dtype */
    uint64_t written;
    ckpt_progress progress;
} fill_ctx;

/* st_write_file callback: tensor t->user, generated and written chunk by chunk. */
static int fill_tensor(void *vctx, const st_out_tensor *t, int fd, const char *path)
{
    fill_ctx *fc = vctx;
    const genmodel_tensor *gt = &fc->tensors[t->user];
    assert(t->nbytes == gt->numel * fc->elem_size);
    for (uint64_t done = 0; done < gt->numel;) {
        size_t n = gt->numel - done < CHUNK_ELEMS ? (size_t)(gt->numel - done) : CHUNK_ELEMS;
        genmodel_values(fc->seed, gt, done, n, fc->values);
        ckpt_convert(CKPT_DT_F32, fc->values, fc->dtype, fc->bytes, n);
        int rc = ckpt_pwrite_full(fd, fc->bytes, n * fc->elem_size,
                                  t->offset + done * fc->elem_size, path);
        if (rc) return rc;
        done += n;
        fc->written += n * fc->elem_size;
        ckpt_progress_update(&fc->progress, fc->written);
    }
    return 0;
}

static const char *torch_dtype_name(ckpt_dtype dt)
{
    switch (dt) {
    case CKPT_DT_F32:
        return "float32";
    case CKPT_DT_F16:
        return "float16";
    default:
        return "bfloat16";
    }
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A copy of obj with its keys in sorted order, as transformers writes config.json. */
static json_t *json_sorted_copy(json_t *obj)
{
    size_t n = json_object_size(obj), i = 0;
    const char **keys = ckpt_calloc(n ? n : 1, sizeof *keys);
    json_t *out = keys ? json_object() : NULL;
    if (!out) {
        free(keys);
        return NULL;
    }
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) keys[i++] = k;
    qsort(keys, n, sizeof *keys, cmp_str);
    for (i = 0; i < n; i++)
        json_object_set(out, keys[i], json_object_get(obj, keys[i]));
    free(keys);
    return out;
}

/* config.json: the keys transformers reads for this architecture. */
static json_t *config_json(const genmodel_config *c)
{
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "architectures", json_pack("[s]", c->architecture));
    json_object_set_new(o, "model_type", json_string(c->model_type));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "hidden_size", json_integer((json_int_t)c->hidden_size));
    json_object_set_new(o, "intermediate_size", json_integer((json_int_t)c->intermediate_size));
    json_object_set_new(o, "num_attention_heads", json_integer((json_int_t)c->num_attention_heads));
    json_object_set_new(o, "num_key_value_heads", json_integer((json_int_t)c->num_key_value_heads));
    json_object_set_new(o, "head_dim", json_integer((json_int_t)c->head_dim));
    json_object_set_new(o, "num_hidden_layers", json_integer((json_int_t)c->num_hidden_layers));
    json_object_set_new(o, "vocab_size", json_integer((json_int_t)c->vocab_size));
    json_object_set_new(o, "max_position_embeddings",
                        json_integer((json_int_t)c->max_position_embeddings));
    json_object_set_new(o, "rms_norm_eps", json_real(c->rms_norm_eps));
    json_object_set_new(o, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    json_object_set_new(o, "torch_dtype", json_string(torch_dtype_name(c->dtype)));
    json_object_set_new(o, "initializer_range", json_real(INIT_STD));
    if (c->moe == GENMODEL_MOE_MIXTRAL) {
        json_object_set_new(o, "num_local_experts", json_integer((json_int_t)c->num_experts));
    } else if (c->moe == GENMODEL_MOE_QWEN3) {
        json_object_set_new(o, "num_experts", json_integer((json_int_t)c->num_experts));
        json_object_set_new(o, "moe_intermediate_size",
                            json_integer((json_int_t)c->moe_intermediate_size));
        json_object_set_new(o, "norm_topk_prob", json_boolean(c->norm_topk_prob));
        json_object_set_new(o, "decoder_sparse_step", json_integer(1));
        json_object_set_new(o, "mlp_only_layers", json_array());
    }
    if (c->moe != GENMODEL_DENSE)
        json_object_set_new(o, "num_experts_per_tok",
                            json_integer((json_int_t)c->num_experts_per_tok));
    json_t *sorted = json_sorted_copy(o);
    json_decref(o);
    return sorted;
}

static int write_config(const genmodel_config *c, const char *dir)
{
    json_t *cfg = config_json(c);
    char *path = ckpt_path_join(dir, "config.json");
    int rc = cfg && path ? cj_write_file(path, cfg)
                         : ckpt_error_set(CKPT_ENOMEM, "cannot build config.json");
    json_decref(cfg);
    free(path);
    return rc;
}

/* Everything one write needs, freed in one place. */
typedef struct {
    genmodel_config cfg;
    genmodel_tensor *tensors;
    size_t ntensors;
    uint64_t *sizes;  /* bytes of each tensor */
    size_t *shard_of; /* shard of each tensor */
    size_t *order;    /* tensor indexes grouped by shard, HF order within a shard */
    size_t nshards;
    char **shard_names;
    uint64_t total_bytes;
    fill_ctx fill;
} gen_job;

static void job_free(gen_job *j)
{
    genmodel_tensors_free(j->tensors, j->ntensors);
    free(j->sizes);
    free(j->shard_of);
    free(j->order);
    for (size_t s = 0; j->shard_names && s < j->nshards; s++)
        free(j->shard_names[s]);
    free(j->shard_names);
    free(j->fill.values);
    free(j->fill.bytes);
}

/* Lists the tensors, their sizes and their shards. */
static int job_plan(gen_job *j, const genmodel_opts *o)
{
    int rc = genmodel_config_get(&j->cfg, o);
    if (!rc) rc = genmodel_tensors(&j->cfg, &j->tensors, &j->ntensors);
    if (rc) return rc;
    const unsigned elem = ckpt_dtype_size(o->dtype);
    j->sizes = ckpt_calloc(j->ntensors, sizeof *j->sizes);
    j->shard_of = ckpt_calloc(j->ntensors, sizeof *j->shard_of);
    j->order = ckpt_calloc(j->ntensors, sizeof *j->order);
    if (!j->sizes || !j->shard_of || !j->order) return CKPT_ENOMEM;
    for (size_t i = 0; i < j->ntensors; i++) {
        if (!ckpt_mul(j->tensors[i].numel, elem, &j->sizes[i]) ||
            !ckpt_add(j->total_bytes, j->sizes[i], &j->total_bytes))
            return ckpt_error_set(CKPT_ELIMIT, "%s: checkpoint size overflows", j->tensors[i].name);
    }
    rc = ckpt_shard_assign(j->sizes, j->ntensors, o->max_shard_size, j->shard_of, &j->nshards);
    if (rc) return rc;
    assert(j->nshards >= 1);
    /* Counting sort by shard: order[] lists shard 0's tensors, then shard 1's, ... */
    size_t *start = ckpt_calloc(j->nshards + 1, sizeof *start);
    j->shard_names = ckpt_calloc(j->nshards, sizeof *j->shard_names);
    if (!start || !j->shard_names) {
        free(start);
        return CKPT_ENOMEM;
    }
    for (size_t i = 0; i < j->ntensors; i++)
        start[j->shard_of[i] + 1]++;
    for (size_t s = 0; s < j->nshards; s++)
        start[s + 1] += start[s];
    for (size_t i = 0; i < j->ntensors; i++)
        j->order[start[j->shard_of[i]]++] = i;
    free(start);
    for (size_t s = 0; s < j->nshards; s++)
        if (!(j->shard_names[s] = ckpt_shard_name("model", s, j->nshards))) return CKPT_ENOMEM;
    return 0;
}

/* Writes shard s: the tensors order[*pos..] that belong to it. */
static int write_shard(gen_job *j, size_t s, size_t *pos, const char *dir)
{
    st_layout l;
    st_layout_init(&l);
    int rc = st_layout_set_meta(&l, "format", "pt");
    for (; !rc && *pos < j->ntensors && j->shard_of[j->order[*pos]] == s; (*pos)++) {
        const genmodel_tensor *t = &j->tensors[j->order[*pos]];
        rc = st_layout_add(&l, t->name, j->cfg.dtype, t->ndim, t->shape, j->order[*pos]);
    }
    if (!rc) rc = st_layout_finish(&l);
    char *path = rc ? NULL : ckpt_path_join(dir, j->shard_names[s]);
    if (!rc && !path) rc = CKPT_ENOMEM;
    if (!rc) rc = st_write_file(path, &l, fill_tensor, &j->fill);
    free(path);
    st_layout_free(&l);
    return rc;
}

static int write_index(const gen_job *j, const char *dir)
{
    char **names = ckpt_calloc(j->ntensors, sizeof *names);
    char **files = ckpt_calloc(j->ntensors, sizeof *files);
    char *text = NULL, *path = NULL;
    int rc = CKPT_ENOMEM;
    if (names && files) {
        for (size_t i = 0; i < j->ntensors; i++) {
            names[i] = j->tensors[i].name;
            files[i] = j->shard_names[j->shard_of[i]];
        }
        text = ckpt_index_render(j->total_bytes, j->ntensors, names, files);
        path = ckpt_path_join(dir, "model.safetensors.index.json");
    }
    if (text && path) rc = ckpt_write_file_atomic(path, text, strlen(text));
    free(names);
    free(files);
    free(text);
    free(path);
    return rc;
}

static int job_write(gen_job *j, const genmodel_opts *o, const char *dir)
{
    j->fill = (fill_ctx){.seed = o->seed,
                         .tensors = j->tensors,
                         .dtype = o->dtype,
                         .elem_size = ckpt_dtype_size(o->dtype),
                         .values = ckpt_malloc(CHUNK_ELEMS * sizeof(float)),
                         .bytes = ckpt_malloc(CHUNK_ELEMS * ckpt_dtype_size(o->dtype))};
    if (!j->fill.values || !j->fill.bytes) return CKPT_ENOMEM;
    int rc = write_config(&j->cfg, dir);
    size_t pos = 0;
    ckpt_progress_start(&j->fill.progress, "gen-model", j->total_bytes);
    for (size_t s = 0; !rc && s < j->nshards; s++)
        rc = write_shard(j, s, &pos, dir);
    if (!rc) ckpt_progress_finish(&j->fill.progress);
    if (!rc && j->nshards > 1) rc = write_index(j, dir);
    return rc;
}

int genmodel_write(const genmodel_opts *o, const char *out_dir)
{
    if (ckpt_exists(out_dir) && !ckpt_is_dir(out_dir))
        return ckpt_error_set(CKPT_EEXIST, "%s: exists and is not a directory", out_dir);
    if (!ckpt_dir_is_empty_or_missing(out_dir))
        return ckpt_error_set(CKPT_EEXIST, "%s: directory is not empty", out_dir);
    gen_job j = {0};
    char *tmp = NULL;
    int rc = job_plan(&j, o);
    if (!rc) rc = ckpt_tmpdir_create(out_dir, &tmp);
    if (!rc) rc = job_write(&j, o, tmp);
    if (!rc) rc = ckpt_dir_commit(tmp, out_dir);
    if (rc) {
        if (tmp) ckpt_rm_rf(tmp);
        rc = ckpt_error_prefix(rc, "gen-model %s", out_dir);
    } else {
        char human[32];
        ckpt_info("gen-model: %s: %zu tensors, %zu file%s, %llu bytes (%s) of %s in %s", j.cfg.arch,
                  j.ntensors, j.nshards, j.nshards == 1 ? "" : "s",
                  (unsigned long long)j.total_bytes,
                  ckpt_format_size(j.total_bytes, human, sizeof human), ckpt_dtype_name(o->dtype),
                  out_dir);
    }
    free(tmp);
    job_free(&j);
    return rc;
}

/*
 * genmodel.h — synthetic Hugging Face checkpoints with real tensor names.
 *
 * Tests, benchmarks and the demo need checkpoints of real architectures
 * without a network or tens of gigabytes. genmodel_write() produces one:
 * config.json with the architecture's Hugging Face keys, and the weights as
 * model.safetensors, or as model-0000i-of-0000n.safetensors shards plus
 * model.safetensors.index.json when they exceed max_shard_size, every file
 * carrying {"format":"pt"} metadata like save_pretrained's.
 *
 *   genmodel_opts o;
 *   genmodel_opts_init(&o, "qwen2");
 *   o.scale = 8;           // widths / 8: head_dim 8, intermediate 608, vocab 18992
 *   o.layers = 2;
 *   if (genmodel_write(&o, "/tmp/qwen2-tiny") < 0) die(ckpt_error_last());
 *
 * Architectures (the Hugging Face model each is shaped after):
 *   llama      Llama-3-8B       dense, GQA 32/8, untied lm_head
 *   qwen2      Qwen2-0.5B       dense, GQA 14/2, q/k/v biases, tied embeddings
 *   mixtral    Mixtral-8x7B     8 experts, block_sparse_moe.experts.E.w1/w2/w3
 *   qwen3-moe  Qwen3-30B-A3B    128 experts, q_norm/k_norm, head_dim*heads != hidden
 *
 * `scale` divides the widths (head_dim, intermediate sizes, vocab, and with
 * them hidden) rounding down with a minimum of 1, and keeps every count
 * (heads, KV heads, experts), so GQA ratios and sizes that need padding under
 * tensor parallelism stay those of the real model. config.json always
 * describes the tensors actually written.
 *
 * Values are a pure function of (seed, tensor name, element index): normal-ish
 * with std 0.02 (norm weights around 1.0), different in every tensor so a
 * permutation shows up in a byte comparison, and generated a few MiB at a
 * time, so memory stays flat whatever the size. genmodel_values() recomputes
 * any stretch of them, which lets a test check converted bytes without
 * reading the source.
 *
 * The output directory appears complete or not at all (built in a sibling
 * temp directory, then renamed); a non-empty existing directory is refused.
 */
#ifndef CKPT_WORKERS_GENMODEL_H
#define CKPT_WORKERS_GENMODEL_H

#include "storage/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GENMODEL_DEFAULT_SHARD_SIZE 5000000000ULL /* Hugging Face's "5GB" */
#define GENMODEL_MAX_SCALE (1u << 20)
#define GENMODEL_MAX_LAYERS 1024

typedef struct {
    const char *arch;        /* "llama", "qwen2", "mixtral", "qwen3-moe" (or "qwen3_moe") */
    uint64_t scale;          /* width divisor, 1..GENMODEL_MAX_SCALE */
    uint64_t layers;         /* 0: the architecture's own layer count */
    ckpt_dtype dtype;        /* CKPT_DT_BF16, CKPT_DT_F16 or CKPT_DT_F32 */
    uint64_t max_shard_size; /* bytes per file (tensor bytes); 0: a single file */
    uint64_t seed;
} genmodel_opts;

/* How a sparse architecture names its experts. */
typedef enum {
    GENMODEL_DENSE,       /* mlp.gate_proj / up_proj / down_proj */
    GENMODEL_MOE_MIXTRAL, /* block_sparse_moe.gate, block_sparse_moe.experts.E.w1/w2/w3 */
    GENMODEL_MOE_QWEN3,   /* mlp.gate, mlp.experts.E.gate_proj/up_proj/down_proj */
} genmodel_moe_style;

/* An architecture's parameters after scale and layers are applied: what
 * config.json says and what the tensors are shaped by. */
typedef struct {
    const char *arch;         /* canonical name, e.g. "qwen3-moe" */
    const char *model_type;   /* config.json "model_type", e.g. "qwen3_moe" */
    const char *architecture; /* config.json "architectures"[0] */
    uint64_t hidden_size;
    uint64_t intermediate_size;
    uint64_t num_attention_heads;
    uint64_t num_key_value_heads;
    uint64_t head_dim;
    uint64_t num_hidden_layers;
    uint64_t vocab_size;
    uint64_t max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;
    bool tie_word_embeddings; /* no lm_head.weight when set */
    bool qkv_bias;            /* q/k/v projections have .bias tensors */
    bool qk_norm;             /* self_attn.q_norm / k_norm weights [head_dim] */
    genmodel_moe_style moe;
    uint64_t num_experts;           /* 0 when dense */
    uint64_t num_experts_per_tok;   /* 0 when dense */
    uint64_t moe_intermediate_size; /* expert width; intermediate_size when mixtral */
    bool norm_topk_prob;            /* qwen3-moe */
    ckpt_dtype dtype;               /* config.json "torch_dtype" */
} genmodel_config;

/* How a tensor's values are drawn. */
typedef enum {
    GENMODEL_INIT_NORMAL, /* mean 0, std 0.02 */
    GENMODEL_INIT_NORM,   /* mean 1, std 0.02: RMSNorm weights */
} genmodel_init;

typedef struct {
    char *name;
    int ndim;
    uint64_t shape[2];
    uint64_t numel;
    genmodel_init init;
} genmodel_tensor;

/* The defaults: scale 1, the architecture's layers, bf16, 5 GB shards, seed 0. */
void genmodel_opts_init(genmodel_opts *o, const char *arch);

/* Resolves o into *c; CKPT_EINVAL naming the option when o is out of range. */
int genmodel_config_get(genmodel_config *c, const genmodel_opts *o);
/* The tensors of c in Hugging Face state-dict order (embedding, layer by
 * layer, final norm, lm_head). Free with genmodel_tensors_free. */
int genmodel_tensors(const genmodel_config *c, genmodel_tensor **out, size_t *n);
void genmodel_tensors_free(genmodel_tensor *t, size_t n);
/* Elements [first, first + n) of tensor t's values for seed, as float. */
void genmodel_values(uint64_t seed, const genmodel_tensor *t, uint64_t first, size_t n, float *out);

/* Writes the checkpoint described by o into out_dir (created; must not exist
 * or be empty) and prints a one-line summary to the info log. */
int genmodel_write(const genmodel_opts *o, const char *out_dir);

#endif

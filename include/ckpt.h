/*
 * ckpt.h — the public header of libckpt: training states (save_state /
 * load_state) for programs that link the library.
 *
 * A training state is a step, the model's parameters (tensors named as in
 * Hugging Face), the optimizer's per-parameter slots (tensors named
 * "<param>/<slot>", e.g. "model.layers.0.self_attn.q_proj.weight/adam_m",
 * shaped like their parameter), the optimizer's name, hyperparameters and
 * scalar state (such as the update count), and optionally config.json.
 *
 * Saving is atomic: the directory is written beside its target and renamed
 * into place, so it appears complete or not at all, and a state saved over
 * an existing one replaces it (an atomic exchange of the two directories)
 * only once every new byte is on disk. A process killed during a save
 * leaves the previous state as it was, plus a "<dir>.tmp-XXXXXX" leftover.
 *
 * Loading checks everything before it hands a tensor out — the safetensors
 * rules, the indexes, that every optimizer tensor names an existing parameter
 * and a listed slot with the parameter's shape, the format version — and on
 * any error returns nothing (no half-loaded state). Without a cast, tensors
 * are mapped from the files (mmap, copy-on-write: writable, and the files
 * are never changed through them); with a cast they are read and converted.
 * A load that overlaps a save into the same directory is done again (a
 * load never mixes two steps); after three such overlaps it gives up with
 * CKPT_EBUSY. Saving over the state a loaded one was mapped from is fine:
 * the mapped files live on until ckpt_state_free.
 *
 * Errors: every call that can fail returns 0 or a negative CKPT_E* code; the
 * sentence explaining it (naming the file, tensor or field) is
 * ckpt_error_last(), kept per thread.
 *
 * Argument order follows libgit2 (out-parameters first), except
 * ckpt_state_save(dir, state, opts) and ckpt_state_load(dir, opts, &state),
 * which keep save_state/load_state's order.
 *
 * This header is the one definition of the error codes and dtypes: the
 * library's own headers (common/error.h, format/dtype.h) include it.
 */
/* clang-format off */
/*
 * Example: a training loop that saves every 100 steps, then one
 * tensor-parallel rank's slice of the saved state. The tests build and run
 * exactly this program, cut out of this comment (tests/header/example.sh):
 *
 *   #include <ckpt.h>
 *   #include <stdio.h>
 *   #include <stdlib.h>
 *
 *   static void die(const char *what)
 *   {
 *       fprintf(stderr, "%s: %s\n", what, ckpt_error_last());
 *       exit(1);
 *   }
 *
 *   int main(int argc, char **argv)
 *   {
 *       const char *dir = argc > 1 ? argv[1] : "run/latest";
 *       ckpt_state *st;
 *       if (ckpt_state_new(&st) < 0) die("new");
 *
 *       ckpt_tensor *w, *m;
 *       uint64_t shape[2] = {64, 256};
 *       if (ckpt_state_add_param(&w, st, "model.layers.0.mlp.down_proj.weight",
 *                                CKPT_DT_BF16, 2, shape, NULL) < 0 ||
 *           ckpt_state_add_slot(&m, st, w->name, "adam_m", CKPT_DT_F32, NULL) < 0 ||
 *           ckpt_state_set_optimizer(st, "adamw") < 0 ||
 *           ckpt_state_set_hyperparameter(st, "lr", 3e-4) < 0 ||
 *           ckpt_state_set_config(st, "{\"model_type\": \"llama\", \"hidden_size\": 64,"
 *                                     " \"num_attention_heads\": 8}") < 0)
 *           die("build");
 *
 *       for (uint64_t step = 1; step <= 300; step++) {
 *           uint16_t *wd = w->data; // BF16 values, updated in place
 *           float *md = m->data;
 *           for (uint64_t i = 0; i < w->numel; i++) {
 *               md[i] = 0.9f * md[i] + 0.1f * (float)(i % 7);
 *               wd[i] = ckpt_f32_to_bf16(ckpt_bf16_to_f32(wd[i]) - 3e-4f * md[i]);
 *           }
 *           ckpt_state_set_step(st, step);
 *           if (ckpt_state_set_scalar(st, "count", (double)step) < 0) die("count");
 *           if (step % 100 == 0 && ckpt_state_save(dir, st, NULL) < 0) die("save");
 *       }
 *       ckpt_state_free(st);
 *
 *       ckpt_state *back;
 *       ckpt_state_load_options lo = CKPT_STATE_LOAD_OPTIONS_INIT;
 *       lo.layout = "neuron"; // rank 3 of 8: only its columns are read
 *       lo.tp = 8;
 *       lo.rank = 3;
 *       if (ckpt_state_load(dir, &lo, &back) < 0) die("load");
 *       const ckpt_tensor *r = ckpt_state_param_at(back, 0);
 *       printf("step %llu: %s [%llu, %llu]\n", (unsigned long long)ckpt_state_step(back),
 *              r->name, (unsigned long long)r->shape[0], (unsigned long long)r->shape[1]);
 *       ckpt_state_free(back);
 *       return 0;
 *   }
 *
 * The directory it saves (a format other tools may write too):
 *
 *   metadata.json      {"format": "ckpt-state", "version": 1, "step": 300,
 *                       "timestamp": "2026-11-21T10:00:00Z", "has_optimizer_state": true,
 *                       "dtypes": {"model": ["BF16"], "optimizer": ["F32"]}}
 *                      (more keys allowed and kept)
 *   model.safetensors, or model-0000i-of-0000n.safetensors + model.safetensors.index.json
 *   optimizer.safetensors, or optimizer-0000i-of-0000n.safetensors
 *                      + optimizer.safetensors.index.json
 *   optimizer.json     {"name": "adamw", "hyperparameters": {"lr": 0.0003, ...},
 *                       "slots": ["adam_m"], "scalars": {"count": 300}}
 *   config.json        when the state has one
 */
/* clang-format on */
#ifndef CKPT_PUBLIC_CKPT_H
#define CKPT_PUBLIC_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors (common/error.h inside the library adds the setters) ---- */
typedef enum {
    CKPT_OK = 0,
    CKPT_EINVAL = -1,    /* bad input: a malformed file, a bad argument */
    CKPT_EIO = -2,       /* the OS refused: open, read, write, fsync, rename */
    CKPT_ENOMEM = -3,    /* allocation failed */
    CKPT_ENOTFOUND = -4, /* a named thing does not exist */
    CKPT_ELIMIT = -5,    /* a size, count or length exceeds a limit */
    CKPT_EEXIST = -6,    /* the target exists and may not be replaced */
    CKPT_ECORRUPT = -7,  /* stored bytes do not match their hash */
    CKPT_EBUSY = -8,     /* transient: retry may succeed */
    CKPT_ECANCELLED = -9,
    CKPT_EINTERNAL = -10, /* a library failed in a way a retry will not fix (a digest context) */
} ckpt_code;
/* The last error message of this thread ("" when none). */
const char *ckpt_error_last(void);
void ckpt_error_clear(void);
/* A short name for a code: "invalid input", "I/O error", ... */
const char *ckpt_code_name(int code);

/* ---- dtypes (the safetensors dtypes; format/dtype.h inside the library) ----
 * The order is the reference implementation's Dtype order: the library's
 * writer sorts tensors by it, so its files match the reference writer's. */
typedef enum {
    CKPT_DT_BOOL,
    CKPT_DT_F4,
    CKPT_DT_F6_E2M3,
    CKPT_DT_F6_E3M2,
    CKPT_DT_U8,
    CKPT_DT_I8,
    CKPT_DT_F8_E5M2,
    CKPT_DT_F8_E4M3,
    CKPT_DT_F8_E8M0,
    CKPT_DT_F8_E4M3FNUZ,
    CKPT_DT_F8_E5M2FNUZ,
    CKPT_DT_I16,
    CKPT_DT_U16,
    CKPT_DT_F16,
    CKPT_DT_BF16,
    CKPT_DT_I32,
    CKPT_DT_U32,
    CKPT_DT_F32,
    CKPT_DT_C64,
    CKPT_DT_F64,
    CKPT_DT_I64,
    CKPT_DT_U64,
    CKPT_DT_COUNT
} ckpt_dtype;
/* Largest tensor rank, one limit everywhere: the safetensors reader, the
 * store, states, and the plan/rebuild structures. */
#define CKPT_MAX_RANK 8
/* "F32", "BF16", ... */
const char *ckpt_dtype_name(ckpt_dtype dt);
/* Parses "F32", "BF16" (also "bf16", "f16", "f32", "f64"). */
int ckpt_dtype_from_name(const char *s, ckpt_dtype *out);
/* Bytes per element; 0 for the sub-byte dtypes (F4, F6_*). */
unsigned ckpt_dtype_size(ckpt_dtype dt);
/* Round to nearest, ties to even; NaN stays NaN; overflow gives infinity. */
uint16_t ckpt_f32_to_bf16(float f);
float ckpt_bf16_to_f32(uint16_t h);
uint16_t ckpt_f32_to_f16(float f);
float ckpt_f16_to_f32(uint16_t h);

/* ---- states ---- */

#define CKPT_STATE_FORMAT "ckpt-state"
/* metadata.json "version" written; a larger one is refused on load */
#define CKPT_STATE_VERSION 1

typedef struct ckpt_state ckpt_state;

/* A parameter or an optimizer slot. The state owns it and its bytes; the
 * pointer stays valid until ckpt_state_free. data holds nbytes of
 * little-endian values in row-major order and may be written in place (it is
 * NULL only when nbytes is 0). */
typedef struct {
    const char *name;  /* "<param>" or "<param>/<slot>" */
    const char *param; /* the parameter's name (== name for a parameter) */
    const char *slot;  /* the slot's name, NULL for a parameter */
    ckpt_dtype dtype;
    int ndim;           /* at most CKPT_MAX_RANK */
    uint64_t shape[16]; /* ndim entries used; 16 slots keep the layout of earlier releases */
    uint64_t numel;
    uint64_t nbytes;
    void *data;
} ckpt_tensor;

/* An empty state at step 0 without an optimizer. */
int ckpt_state_new(ckpt_state **out);
void ckpt_state_free(ckpt_state *st);

uint64_t ckpt_state_step(const ckpt_state *st);
void ckpt_state_set_step(ckpt_state *st, uint64_t step);
/* metadata.json's timestamp of a loaded state (NULL for a new one). */
const char *ckpt_state_timestamp(const ckpt_state *st);

/* Adds a parameter; copies data (nbytes of dtype x shape), or zero-fills it
 * when data is NULL. Names are unique, non-empty, at most 4096 bytes, and
 * contain no '/' (it separates slots). *out (may be NULL) gets the tensor. */
int ckpt_state_add_param(ckpt_tensor **out, ckpt_state *st, const char *name, ckpt_dtype dtype,
                         int ndim, const uint64_t *shape, const void *data);
/* Adds optimizer slot `slot` of parameter `param`, shaped like it, in dtype
 * (floats of another width than the parameter are fine). The slot name joins
 * the optimizer's slot list. */
int ckpt_state_add_slot(ckpt_tensor **out, ckpt_state *st, const char *param, const char *slot,
                        ckpt_dtype dtype, const void *data);
size_t ckpt_state_param_count(const ckpt_state *st);
/* In the order added (a loaded state: the order of the names). */
ckpt_tensor *ckpt_state_param_at(const ckpt_state *st, size_t i);
ckpt_tensor *ckpt_state_param(const ckpt_state *st, const char *name);
/* Every slot tensor of every parameter. */
size_t ckpt_state_slot_count(const ckpt_state *st);
ckpt_tensor *ckpt_state_slot_at(const ckpt_state *st, size_t i);
ckpt_tensor *ckpt_state_slot(const ckpt_state *st, const char *param, const char *slot);

/* The optimizer: its name (NULL: none), slot names, hyperparameters and
 * scalar state. Numbers that are whole are written as JSON integers. */
int ckpt_state_set_optimizer(ckpt_state *st, const char *name);
const char *ckpt_state_optimizer(const ckpt_state *st);
size_t ckpt_state_slot_name_count(const ckpt_state *st);
const char *ckpt_state_slot_name(const ckpt_state *st, size_t i);
int ckpt_state_set_hyperparameter(ckpt_state *st, const char *key, double value);
/* CKPT_ENOTFOUND when absent, CKPT_EINVAL when not a number. */
int ckpt_state_hyperparameter(double *out, const ckpt_state *st, const char *key);
int ckpt_state_set_scalar(ckpt_state *st, const char *key, double value);
int ckpt_state_scalar(double *out, const ckpt_state *st, const char *key);
/* optimizer.json as save writes it (any JSON values kept); malloc'd, NULL on failure. */
char *ckpt_state_optimizer_json(const ckpt_state *st);

/* config.json text (a JSON object), or NULL to drop it. */
int ckpt_state_set_config(ckpt_state *st, const char *json_text);
const char *ckpt_state_config(const ckpt_state *st);

/* ---- save and load ---- */

#define CKPT_STATE_SAVE_OPTIONS_VERSION 1
typedef struct {
    unsigned int version; /* CKPT_STATE_SAVE_OPTIONS_VERSION */
    /* NULL: keep; "bf16", "f16", "f32" or "f64": cast every floating tensor */
    const char *float_dtype;
    bool save_optimizer;     /* write optimizer.safetensors and optimizer.json (default true) */
    uint64_t max_shard_size; /* bytes of tensors per file; 0: 5 GB, Hugging Face's default */
    bool keep_timestamp;     /* write the loaded state's timestamp instead of now */
} ckpt_state_save_options;
#define CKPT_STATE_SAVE_OPTIONS_INIT                                                               \
    {                                                                                              \
        CKPT_STATE_SAVE_OPTIONS_VERSION, NULL, true, 0, false                                      \
    }

/* Writes st into dir (parents created). dir may be missing, empty, or a
 * state saved before (replaced atomically); anything else is CKPT_EEXIST.
 * opts NULL: the defaults. */
int ckpt_state_save(const char *dir, const ckpt_state *st, const ckpt_state_save_options *opts);

#define CKPT_STATE_LOAD_OPTIONS_VERSION 1
typedef struct {
    unsigned int version; /* CKPT_STATE_LOAD_OPTIONS_VERSION */
    const char *dtype; /* NULL: as saved (tensors mapped, zero-copy); else cast floating tensors */
    bool load_optimizer; /* default true; false skips the optimizer files entirely */
    /* One tensor-parallel rank of a layout, from a state saved in the original
     * layout: only the byte ranges that rank needs are read. layout is a preset
     * (neuron, fused, easydel, hf) or "<preset>-tp<N>"; optimizer slots follow
     * their parameters. NULL: the state as saved. */
    const char *layout;
    int tp;   /* 0: from the layout name, else 1 */
    int rank; /* 0 .. tp-1 */
} ckpt_state_load_options;
#define CKPT_STATE_LOAD_OPTIONS_INIT                                                               \
    {                                                                                              \
        CKPT_STATE_LOAD_OPTIONS_VERSION, NULL, true, NULL, 0, 0                                    \
    }

/* Loads the state in dir into a new *out (NULL on failure). opts NULL: the defaults. */
int ckpt_state_load(const char *dir, const ckpt_state_load_options *opts, ckpt_state **out);

#ifdef __cplusplus
}
#endif

#endif

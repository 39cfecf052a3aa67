/*
 * state.h — the inside of a training state (the public API is ckpt.h).
 *
 * state/state.c owns the ckpt_state object, saving, and loading a state in
 * the layout it was saved in. Loading one tensor-parallel rank of a layout
 * needs the planner and lives in state/state_load.c, which is also where
 * the public ckpt_state_load() dispatches; it builds states through the
 * functions below.
 *
 * Tensors are owned by the state: their bytes are either malloc'd or point
 * into a file mapping the state keeps (state_map_file). Lookups by name go
 * through one hash table holding parameters ("w") and slots ("w/adam_m").
 */
#ifndef CKPT_STATE_STATE_H
#define CKPT_STATE_STATE_H

#include "common/error.h"
#include "format/checkpoint.h"
#include "transform/state_convert.h"
#include "format/dtype.h"
#include "include/ckpt.h"

#include <jansson.h>
#include <stdbool.h>

#define STATE_MAX_SLOTS 64               /* slot names of one optimizer */
#define STATE_DEFAULT_SHARD_SIZE 5000000000ULL

typedef struct {
    ckpt_tensor pub; /* first: the public view */
    bool mapped;     /* pub.data points into a mapping, not malloc'd */
} state_tensor;

typedef struct {
    void *addr;
    size_t len;
} state_mapping;

struct ckpt_state {
    uint64_t step;
    char *timestamp;
    state_tensor **params;
    size_t nparams, params_cap;
    state_tensor **slots;
    size_t nslots, slots_cap;
    state_tensor **table; /* open addressing by full name; NULL = free */
    size_t table_cap;
    char *optimizer;
    char **slot_names;
    size_t nslot_names, slot_names_cap;
    json_t *hyper, *scalars;        /* objects */
    json_t *opt_extra, *meta_extra; /* other keys of optimizer.json / metadata.json, kept */
    char *config;                   /* config.json text, or NULL */
    state_mapping *maps;
    size_t nmaps, maps_cap;
};

/* Adds a tensor whose bytes are `data` (taken over: freed by the state unless
 * mapped). slot NULL: a parameter. On failure data is released too. */
int state_adopt(ckpt_tensor **out, ckpt_state *st, const char *param, const char *slot,
                ckpt_dtype dtype, int ndim, const uint64_t *shape, void *data, bool mapped);
/* Maps a whole file read-only, copy-on-write; the mapping lives as long as st. */
int state_map_file(ckpt_state *st, const st_file *f, uint8_t **base);
/* Casts every castable floating tensor of st to dt (in memory). */
int state_cast_all(ckpt_state *st, ckpt_dtype dt);
/* Parses a load/save dtype name: a castable float. */
int state_parse_float_dtype(const char *name, ckpt_dtype *out, const char *what);

/* What a state directory says about itself. */
typedef struct {
    bool has_optimizer; /* metadata.json has_optimizer_state */
} state_info;

/* Reads metadata.json (format, version, step, timestamp, other keys),
 * config.json when present, and optimizer.json when the state has an
 * optimizer and want_optimizer is set, into st. */
int state_read_side_files(ckpt_state *st, const char *dir, bool want_optimizer, state_info *info);
/* Checks that every tensor of opt's optimizer files is "<param>/<slot>" with
 * param in model's other files, slot in st's slot names, and the parameter's
 * shape. model and opt may be one checkpoint of both (state_checkpoint_open). */
int state_check_optimizer(const ckpt_state *st, const ckpt_checkpoint *model,
                          const ckpt_checkpoint *opt);
/* Loads a state saved in its own layout (ckpt_state_load without a layout). */
int state_load_dir(const char *dir, const ckpt_state_load_options *o, ckpt_state **out);
/* A state at step 0 holding the parameters (mapped) and config.json of a
 * Hugging Face checkpoint directory (model.safetensors or shards + index). */
int state_from_checkpoint(const char *dir, ckpt_state **out);
/* Normalised load options (defaults for NULL, version checked). */
int state_load_options_get(ckpt_state_load_options *o, const ckpt_state_load_options *given);

#endif

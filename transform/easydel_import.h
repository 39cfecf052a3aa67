/*
 * easydel_import.h — an EasyDeL TensorStore checkpoint back to Hugging Face
 * (docs/easydel.md).
 *
 * easydel_consolidate(SRC, DST): the arrays under model/ are laid out as one
 * safetensors file named by their EasyDeL keys in a temp folder beside DST,
 * but only its header is made: a conversion with the inverse of the
 * `easydel` preset (easydel_inverse_rules: stacked experts unstacked with
 * their last two axes swapped back, `.embedding` and norms' `.scale` renamed
 * to `.weight`, every `.kernel` transposed to `.weight`) is planned over it,
 * and the executor reads its bytes through an exec_vsource that decodes the
 * arrays (format/zarr.h) as they are asked for — whole into a worker's
 * memory, in order through a window, or staged into a scratch file
 * (docs/easydel.md, "Reading the arrays"). DST is written the way
 * `ckpt convert` writes a folder, without ckpt-layout.json. The temp folder
 * is removed in every case.
 * An older save (easydel_legacy_weights: easydel-model.parameters, a
 * safetensors file or shards with an index) needs no decoding: its
 * parameters are converted with the same rules where they are, the temp
 * folder holding only the side files and the rules.
 */
#ifndef CKPT_TRANSFORM_EASYDEL_IMPORT_H
#define CKPT_TRANSFORM_EASYDEL_IMPORT_H

#include "format/safetensors.h"
#include "transform/convert.h"

#include <jansson.h>

/* Arrays up to this many bytes are decoded whole into a worker's memory
 * (two workers: twice this at most); larger ones are decoded in order
 * through a window, or into a scratch file when the plan reads them out of
 * order (docs/easydel.md, "Speed and memory"). */
#define EASYDEL_DECODE_MAX_BYTES (48ull << 20)
/* A larger one-chunk array of two or more dimensions that the plan
 * transposes (a lm_head) is decoded in passes, each keeping a band of its
 * columns, when bands of this many bytes take at most EASYDEL_BAND_PASSES
 * passes; any other is staged. The bytes are a budget the workers' bands
 * share: one worker's band may take all of it (a 250 MiB lm_head in two
 * passes), a second waits for at least half. */
#define EASYDEL_BAND_BYTES (128ull << 20)
#define EASYDEL_BAND_PASSES 4

/* The rules document inverting the easydel preset (tp 1). New reference. */
json_t *easydel_inverse_rules(void);
int easydel_consolidate(const char *src, const char *dst, consolidate_opts *o);

/* --state of an older save (easydel_legacy.c): easydel-optstate.structure
 * read as records (format/easydel_tree.h), each "param_{i}" of
 * easydel-optstate.parameters mapped by leaf i's key path to a slot
 * "<param>/<slot>" of staging/optimizer.safetensors, a scalar of
 * optimizer.json, or a leaf left out (listed on stderr and in
 * optimizer.json's "left_out"); a leaf under a flax State whose parameter
 * the model lacks is an error. model (the opened easydel-model.parameters)
 * becomes one checkpoint with the staged optimizer file. */
int easydel_legacy_state(const char *src, ckpt_checkpoint *model, const char *staging, bool quiet);

/* Shared by the two --state paths. easydel_add_slot: "<param>/<slot>" into
 * l (a name already there is not added: *added false), the slot into
 * slotset. easydel_left_out: a leaf that is no slot, said on stderr unless
 * quiet and appended to list as {name, key (when not NULL), why}. easydel_write_state_files: optimizer.json
 * (optax, the sorted slot names, scalars, "left_out" when any) and
 * metadata.json (a ckpt training state at step) in staging. */
int easydel_add_slot(st_layout *l, const char *param, const char *slot, ckpt_dtype dt, int ndim, const uint64_t *shape,
                     size_t user, json_t *slotset, bool *added);
int easydel_left_out(json_t *list, const char *src, const char *what, const char *name, const char *key, const char *why,
                     bool quiet);
int easydel_write_state_files(const char *staging, json_t *slotset, json_t *scalars, json_t *left_out, int64_t step);

#endif

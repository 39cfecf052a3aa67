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

#include "transform/convert.h"

#include <jansson.h>

/* Arrays up to this many bytes are decoded whole into a worker's memory
 * (two workers: twice this at most); larger ones are decoded in order
 * through a window, or into a scratch file when the plan reads them out of
 * order (docs/easydel.md, "Speed and memory"). */
#define EASYDEL_DECODE_MAX_BYTES (48ull << 20)

/* The rules document inverting the easydel preset (tp 1). New reference. */
json_t *easydel_inverse_rules(void);
int easydel_consolidate(const char *src, const char *dst, consolidate_opts *o);

#endif

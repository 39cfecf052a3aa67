/*
 * consolidate.h — the inversion every consolidation shares (docs/transforms.md
 * §8): a stored tensor's part says which box of an original tensor it holds,
 * so the original gets a part reading that box back from the stored tensor.
 * consolidate.c drives it from ckpt-layout.json, nxd_import.c from a
 * neuronx-distributed save's metadata.
 */
#ifndef CKPT_TRANSFORM_CONSOLIDATE_H
#define CKPT_TRANSFORM_CONSOLIDATE_H

#include "plan/plan.h"

/* Adds to orig the inverse of part p of a stored tensor (plan source
 * src_index, stored_ndim axes). A box orig holds already becomes a check
 * (equal bytes, the copy named `holder`, e.g. "rank 3"); `what` names the
 * metadata in errors. */
int consolidate_add_inverse(plan_tensor *orig, const plan_part *p, int stored_ndim, int32_t src_index, const char *holder,
                            const char *what);
/* orig's parts do not overlap and cover it exactly; else an error naming the
 * tensor and how many of its elements the shards hold. */
int consolidate_check_tensor(const plan_tensor *orig, const char *what);

#endif

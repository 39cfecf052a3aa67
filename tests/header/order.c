/*
 * order.c — include/ckpt.h together with the library's own headers, in
 * either order: compiled once as is (internal headers first) and once with
 * -DCKPT_H_FIRST. ckpt.h is the one definition of ckpt_code and ckpt_dtype,
 * so neither order may redefine anything.
 */
#ifdef CKPT_H_FIRST
#include "include/ckpt.h"
#endif

#include "common/error.h"
#include "format/dtype.h"
#include "state/state.h"

#include "include/ckpt.h"

_Static_assert(sizeof(ckpt_dtype) == sizeof(int), "one ckpt_dtype");

int ckpt_header_order_check(void);
int ckpt_header_order_check(void)
{
    ckpt_code c = CKPT_EINVAL;
    ckpt_dtype d = CKPT_DT_BF16;
    return (int)c + (int)d + CKPT_MAX_RANK;
}

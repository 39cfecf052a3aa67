/*
 * standalone.c — include/ckpt.h on its own, in strict C11 (-std=c11
 * -pedantic, -Iinclude only, nothing before it), linked against libckpt.a:
 * the header needs no other header and its declarations match the library.
 */
#include <ckpt.h>

#include <stdio.h>
#include <string.h>

_Static_assert(CKPT_OK == 0 && CKPT_ECANCELLED == -9, "error codes");
_Static_assert(CKPT_DT_COUNT == 22 && CKPT_MAX_RANK == 8, "dtypes");

int main(void)
{
    ckpt_state_save_options so = CKPT_STATE_SAVE_OPTIONS_INIT;
    ckpt_state_load_options lo = CKPT_STATE_LOAD_OPTIONS_INIT;
    ckpt_dtype dt;
    if (strcmp(ckpt_dtype_name(CKPT_DT_BF16), "BF16") || ckpt_dtype_from_name("f32", &dt) < 0 ||
        dt != CKPT_DT_F32 || ckpt_dtype_size(dt) != 4 || !so.save_optimizer || !lo.load_optimizer ||
        strcmp(ckpt_code_name(CKPT_ENOTFOUND), ckpt_code_name(-4))) {
        fprintf(stderr, "standalone: ckpt.h disagrees with the library\n");
        return 1;
    }
    return 0;
}

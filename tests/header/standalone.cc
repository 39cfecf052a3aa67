// standalone.cc — include/ckpt.h from C++ (-std=c++11 -pedantic, -Iinclude
// only), linked against libckpt.a: its extern "C" block gives the library's
// symbols C linkage, and its macros and structs are valid C++.
#include <ckpt.h>

#include <cstdio>
#include <cstring>

static_assert(CKPT_OK == 0 && CKPT_DT_COUNT == 22, "ckpt.h enums");

int main()
{
    ckpt_state_load_options lo = CKPT_STATE_LOAD_OPTIONS_INIT;
    ckpt_state_save_options so = CKPT_STATE_SAVE_OPTIONS_INIT;
    ckpt_state *st = nullptr;
    if (ckpt_state_new(&st) < 0) {
        std::fprintf(stderr, "standalone.cc: %s\n", ckpt_error_last());
        return 1;
    }
    uint64_t shape[1] = {4};
    ckpt_tensor *t = nullptr;
    int rc = ckpt_state_add_param(&t, st, "w", CKPT_DT_F32, 1, shape, nullptr);
    bool ok = rc == 0 && t && t->nbytes == 16 && lo.version == CKPT_STATE_LOAD_OPTIONS_VERSION &&
              so.version == CKPT_STATE_SAVE_OPTIONS_VERSION &&
              std::strcmp(ckpt_dtype_name(t->dtype), "F32") == 0;
    ckpt_state_free(st);
    if (!ok) std::fprintf(stderr, "standalone.cc: ckpt.h disagrees with the library\n");
    return ok ? 0 : 1;
}

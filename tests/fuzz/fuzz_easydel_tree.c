/*
 * fuzz_easydel_tree.c — libFuzzer harness for the older EasyDeL save's
 * optimizer structure (format/easydel_tree.c over format/pickle.c).
 *
 * The input is an easydel-optstate.structure: a pickled jax PyTreeDef, bare
 * or with the step. edtree_parse must reject it or give leaves whose key
 * paths are safe to map: NUL-terminated, at most EDTREE_MAX_KEY bytes, no
 * empty component and no '/', and a parameter offset inside the key at a
 * component boundary; a step that is non-negative. Sanitizers catch the
 * rest. The seed corpus is structures tests/easydel_gen.py writes
 * (--legacy: flax 0.10 and 0.11, jaxlib._jax and xla_extension, no step,
 * an int or a jax Array step, an extra masked leaf) and two hostile ones.
 */
#include "tests/fuzz/fuzz_mem.h"
#include "format/easydel_tree.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    edtree t;
    if (edtree_parse(&t, "fuzz.structure", data, size) != 0) {
        REQUIRE(t.leaves == NULL && t.nleaves == 0);
        ckpt_error_clear();
        return 0;
    }
    REQUIRE(!t.has_step || t.step >= 0);
    for (size_t i = 0; i < t.nleaves; i++) {
        const char *k = t.leaves[i].key;
        REQUIRE(k != NULL);
        size_t n = strlen(k);
        REQUIRE(n <= EDTREE_MAX_KEY && !strchr(k, '/') && !strstr(k, ".."));
        REQUIRE(n == 0 || (k[0] != '.' && k[n - 1] != '.'));
        size_t at = t.leaves[i].param_at;
        REQUIRE(at == EDTREE_NO_PARAM || (at < n && (at == 0 || k[at - 1] == '.')));
    }
    edtree_free(&t);
    return 0;
}

/*
 * test_nxd.c — the parts of the neuronx-distributed save reader
 * (format/nxd.c) that do not need a save on disk: the names optimum-neuron
 * saves LoRA parameters under (remove_adapter_name of
 * transformations_utils.py, whose LORA_PATTERN regex gives exactly the
 * expected strings below) and the xser allow-list. Whole saves, written by
 * real torch, are tests/e2e/test_nxd.sh's.
 */
#include "format/nxd.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static void saved(const char *param, const char *want)
{
    char *got = nxd_saved_name(param);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

static void test_saved_name(void **state)
{
    (void)state;
    saved("model.layers.0.mlp.gate_up_proj.lora_A.default.weight", "model.layers.0.mlp.gate_up_proj.lora_A.weight");
    saved("model.layers.0.self_attn.qkv_proj.lora_B.my_adapter.weight_q", "model.layers.0.self_attn.qkv_proj.lora_B.weight_q");
    saved("base_model.model.model.embed_tokens.lora_embedding_A.default", "base_model.model.model.embed_tokens.lora_embedding_A");
    saved("a.lora_B.x", "a.lora_B");
    /* only the first LoRA component drops its successor */
    saved("a.lora_A.x.lora_B.y.w", "a.lora_A.lora_B.y.w");
    /* not adapter names: no module before, nothing after, or not exactly lora_A */
    saved("lora_A.default.weight", "lora_A.default.weight");
    saved("m.lora_A", "m.lora_A");
    saved("m.lora_Ab.default.w", "m.lora_Ab.default.w");
    saved("m.xlora_A.default.w", "m.xlora_A.default.w");
    saved("model.norm.weight", "model.norm.weight");
}

static void test_xser_allow(void **state)
{
    (void)state;
    size_t n = 0;
    const pk_global_def *g = nxd_xser_allow(&n);
    assert_int_equal(n, 1);
    assert_string_equal(g[0].module, "torch_xla.utils.serialization");
    assert_string_equal(g[0].name, "TensorReference");
    assert_int_equal(g[0].kind, PKG_RECORD);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_saved_name), cmocka_unit_test(test_xser_allow)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

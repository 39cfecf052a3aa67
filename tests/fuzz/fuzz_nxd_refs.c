/*
 * fuzz_nxd_refs.c — libFuzzer harness for the xser reference files of a
 * neuronx-distributed save (format/nxd.c over format/torch.c and
 * format/pickle.c).
 *
 * The input is a whole dp_rank_XX_tp_rank_XX_pp_rank_XX.pt of an xser save
 * (a torch.save whose values are torch_xla TensorReference(tid) records).
 * torch_parse_pickle with the reader's allow-list and nxd_xser_refs must
 * reject it or give parameters that the reader can turn into paths safely:
 * non-empty names without NUL, tensor ids in [0, NXD_MAX_TID) and each used
 * once. Sanitizers catch the rest. The seed corpus is rank files and an
 * .info.pt of saves written by tests/nxd_gen.py.
 */
#include "tests/fuzz/fuzz_mem.h"
#include "format/nxd.h"
#include "format/torch.h"

#include "common/error.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mem m = {data, size};
    size_t nallow;
    const pk_global_def *allow = nxd_xser_allow(&nallow);
    pk_doc doc;
    if (torch_parse_pickle(&doc, "fuzz.pt", mem_read, &m, size, allow, nallow) != 0) return 0;
    nxd_ref *refs = NULL;
    size_t n = 0;
    if (nxd_xser_refs(&doc, "fuzz.pt", &refs, &n) == 0) {
        uint8_t *seen = calloc(NXD_MAX_TID / 8, 1);
        REQUIRE(seen);
        for (size_t i = 0; i < n; i++) {
            REQUIRE(refs[i].name && refs[i].name[0]);
            REQUIRE(refs[i].tid >= 0 && refs[i].tid < NXD_MAX_TID);
            REQUIRE(!(seen[refs[i].tid / 8] & (1u << (refs[i].tid % 8))));
            seen[refs[i].tid / 8] |= (uint8_t)(1u << (refs[i].tid % 8));
        }
        free(seen);
        free(refs);
    }
    pk_free(&doc);
    return 0;
}

/*
 * fuzz_index.c — libFuzzer harness for the sharded-checkpoint index parser.
 *
 * The input is the text of a model.safetensors.index.json, passed with its
 * length and no terminating NUL, so a read past the end is an ASan error.
 * An accepted index must only name shard files that are safe to open under
 * the index's folder; the harness checks that and the parsed counts.
 */
#include "format/checkpoint.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) abort();                                                                      \
    } while (0)

/* The rule of docs/safetensors.md, checked independently of ckpt_shard_name_safe:
 * no leading '/', no "://", no '\\', no ".." path component. */
static void check_name_safe(const char *name)
{
    REQUIRE(name[0] != '/');
    REQUIRE(strstr(name, "://") == NULL);
    REQUIRE(strchr(name, '\\') == NULL);
    for (const char *p = name; p;) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        REQUIRE(!(len == 2 && p[0] == '.' && p[1] == '.'));
        p = slash ? slash + 1 : NULL;
    }
    REQUIRE(ckpt_shard_name_safe(name));
}

static void check_accepted(const ckpt_index *ix)
{
    REQUIRE(ix->nshards <= ix->nentries);
    REQUIRE(ix->nshards <= CKPT_MAX_SHARDS);
    for (size_t i = 0; i < ix->nentries; i++) {
        REQUIRE(ix->names[i] != NULL && ix->files[i] != NULL);
        check_name_safe(ix->files[i]);
    }
    for (size_t i = 0; i < ix->nshards; i++) {
        REQUIRE(ix->shards[i] != NULL);
        check_name_safe(ix->shards[i]);
        /* Distinct (quadratic, so only on small indexes). */
        for (size_t j = 0; j < i && ix->nshards <= 512; j++)
            REQUIRE(strcmp(ix->shards[i], ix->shards[j]) != 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A private copy of exactly size bytes: libFuzzer's buffer is already
     * exact, but this keeps the harness honest if it ever is not. */
    char *json = malloc(size ? size : 1);
    if (!json) return 0;
    if (size) memcpy(json, data, size);
    ckpt_index ix;
    if (ckpt_index_parse(&ix, "fuzz.index.json", json, size) == 0) {
        check_accepted(&ix);
        ckpt_index_free(&ix);
    }
    free(json);
    return 0;
}

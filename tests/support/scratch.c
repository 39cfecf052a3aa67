/* scratch.c — see scratch.h. */
#include "tests/support/scratch.h"

#include "common/fsutil.h"
#include "common/util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

int scratch_setup(void **state)
{
    const char *base = getenv("TMPDIR");
    char *tmpl = ckpt_sprintf("%s/ckpt-test-XXXXXX", base && *base ? base : "/tmp");
    if (!tmpl || !mkdtemp(tmpl)) {
        free(tmpl);
        return -1;
    }
    *state = tmpl;
    return 0;
}

int scratch_teardown(void **state)
{
    char *dir = *state;
    int rc = ckpt_rm_rf(dir);
    free(dir);
    return rc;
}

void assert_contains(const char *haystack, const char *needle)
{
    if (!strstr(haystack, needle)) fail_msg("message \"%s\" lacks \"%s\"", haystack, needle);
}

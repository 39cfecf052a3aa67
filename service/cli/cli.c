/* cli.c — what every command shares: the usage and failure messages, JSON output, --help (see cli.h). */
#include "service/cli/cli.h"

#include "common/error.h"
#include "common/json.h"
#include "common/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ckpt %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nsee 'ckpt %s --help'\n", cmd);
    va_end(ap);
    return CLI_USAGE;
}

int cli_fail(void)
{
    /* One line whatever the message holds: names from hostile files may carry control characters. */
    fputs("ckpt: ", stderr);
    for (const unsigned char *p = (const unsigned char *)ckpt_error_last(); *p; p++) {
        if (*p < 0x20 || *p == 0x7f) fprintf(stderr, "\\x%02x", *p);
        else fputc(*p, stderr);
    }
    fputc('\n', stderr);
    return CLI_FAIL;
}

int cli_print_json(json_t *j)
{
    char *s = j ? cj_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (!s) return cli_fail();
    puts(s);
    free(s);
    return CLI_OK;
}

bool cli_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) break;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
    }
    return false;
}

json_t *cli_dims_json(int n, const uint64_t *d)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_integer((json_int_t)d[i]));
    return a;
}

const char *cli_printable(const char *s, char **owned)
{
    *owned = NULL;
    const char *p = s;
    while (*p && (unsigned char)*p >= 0x20 && *p != 0x7f)
        p++;
    if (!*p) return s;
    size_t len = strlen(s);
    char *out = ckpt_malloc(4 * len + 1), *o = out;
    if (!out) return "(name not printable: out of memory)";
    for (p = s; *p; p++) {
        unsigned char ch = (unsigned char)*p;
        if (ch < 0x20 || ch == 0x7f)
            o += sprintf(o, "\\x%02x", ch);
        else
            *o++ = (char)ch;
    }
    *o = '\0';
    *owned = out;
    return out;
}

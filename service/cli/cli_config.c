/*
 * cli_config.c — where a command works: the config file, the global options
 * before the command, and the server a command talks to (see cli.h).
 *
 * Precedence, strongest first: an option on the command line, the
 * environment (CKPT_HOME, CKPT_SERVER, CKPT_TOKEN, CKPT_DB), the config file. The
 * config file only fills in variables the environment does not set, so every
 * later step reads the environment alone.
 */
#include "service/cli/cli.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"

#include <ctype.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONFIG_MAX_BYTES (64u << 10)

static bool server_flag_given; /* --server before the command */
#define TOKEN_MAX_BYTES 4096

/* The first line of a token file, trimmed: the client's token. */
static int read_token(const char *path, char **out)
{
    char *text;
    size_t len;
    int rc = ckpt_read_file(path, TOKEN_MAX_BYTES, &text, &len);
    if (rc) return rc;
    if (memchr(text, 0, len)) {
        free(text);
        return ckpt_error_set(CKPT_EINVAL, "%s: not a text file", path);
    }
    char *s = text;
    while (*s && isspace((unsigned char)*s)) s++;
    char *e = s;
    while (*e && *e != '\n' && *e != '\r') e++;
    while (e > s && isspace((unsigned char)e[-1])) e--;
    *e = 0;
    if (!*s) {
        free(text);
        return ckpt_error_set(CKPT_EINVAL, "%s: no token on its first line", path);
    }
    *out = ckpt_strdup(s);
    free(text);
    return *out ? 0 : CKPT_ENOMEM;
}

static int set_token_from(const char *path)
{
    char *tok;
    int rc = read_token(path, &tok);
    if (rc) return rc;
    setenv("CKPT_TOKEN", tok, 1);
    free(tok);
    return 0;
}

static char *config_path(void)
{
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) return ckpt_sprintf("%s/ckpt/config", xdg);
    if (home && *home) return ckpt_sprintf("%s/.config/ckpt/config", home);
    return NULL;
}

/* One "key = value" line of the config into vals[] (home, server, token_file, blobs, db). */
#define CONFIG_NKEYS 5
static int config_line(const char *path, int lineno, char *line, char *vals[CONFIG_NKEYS])
{
    static const char *const keys[CONFIG_NKEYS] = {"home", "server", "token_file", "blobs", "db"};
    char *eq = strchr(line, '=');
    if (!eq) return ckpt_error_set(CKPT_EINVAL, "%s:%d: expected 'key = value'", path, lineno);
    char *k = line, *ke = eq, *v = eq + 1, *ve = v + strlen(v);
    while (isspace((unsigned char)*k)) k++;
    while (ke > k && isspace((unsigned char)ke[-1])) ke--;
    while (isspace((unsigned char)*v)) v++;
    while (ve > v && isspace((unsigned char)ve[-1])) ve--;
    *ke = 0;
    *ve = 0;
    for (const char *p = v; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return ckpt_error_set(CKPT_EINVAL, "%s:%d: the value of '%s' holds a control character", path, lineno, k);
    for (int i = 0; i < CONFIG_NKEYS; i++) {
        if (strcmp(k, keys[i])) continue;
        if (vals[i]) return ckpt_error_set(CKPT_EINVAL, "%s:%d: '%s' is set twice", path, lineno, k);
        if (!*v) return ckpt_error_set(CKPT_EINVAL, "%s:%d: '%s' has no value", path, lineno, k);
        vals[i] = v;
        return 0;
    }
    return ckpt_error_set(CKPT_EINVAL, "%s:%d: unknown key '%s' (known: home, server, token_file, blobs, db)", path, lineno,
                          *k ? k : "");
}

int cli_config_load(void)
{
    char *path = config_path();
    if (!path) return CLI_OK;
    char *text = NULL;
    size_t len = 0;
    struct stat st;
    int rc = stat(path, &st) == 0 ? ckpt_read_file(path, CONFIG_MAX_BYTES, &text, &len) : 0;
    char *vals[CONFIG_NKEYS] = {0};
    if (!rc && text && memchr(text, 0, len)) rc = ckpt_error_set(CKPT_EINVAL, "%s: not a text file", path);
    int lineno = 0;
    for (char *line = text, *next; !rc && line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        lineno++;
        char *s = line;
        while (isspace((unsigned char)*s)) s++;
        if (!*s || *s == '#') continue;
        rc = config_line(path, lineno, s, vals);
    }
    if (!rc && vals[0] && !getenv("CKPT_HOME")) setenv("CKPT_HOME", vals[0], 1);
    if (!rc && vals[1] && !getenv("CKPT_SERVER")) setenv("CKPT_SERVER", vals[1], 1);
    if (!rc && vals[2] && !getenv("CKPT_TOKEN")) rc = set_token_from(vals[2]);
    if (!rc && vals[3] && !getenv("CKPT_BLOBS")) setenv("CKPT_BLOBS", vals[3], 1);
    if (!rc && vals[4] && !getenv("CKPT_DB")) setenv("CKPT_DB", vals[4], 1);
    free(text);
    free(path);
    if (rc) {
        fprintf(stderr, "ckpt: config: %s\n", ckpt_error_last());
        return CLI_USAGE;
    }
    return CLI_OK;
}

/* "--name VALUE" or "--name=VALUE" at argv[*i]: the value, advancing *i; NULL when argv[*i] is another option. */
static const char *global_value(const char *name, int argc, char **argv, int *i, bool *missing)
{
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n)) return NULL;
    if (a[n] == '=') return a + n + 1;
    if (a[n]) return NULL;
    if (*i + 1 >= argc) {
        *missing = true;
        return NULL;
    }
    return argv[++*i];
}

int cli_global_options(int argc, char **argv, int *first)
{
    int i = 1;
    for (; i < argc && !strncmp(argv[i], "--", 2) && argv[i][2]; i++) {
        bool missing = false;
        const char *v;
        if ((v = global_value("--home", argc, argv, &i, &missing))) {
            setenv("CKPT_HOME", v, 1);
            /* a home given on the command line means this machine's store */
            unsetenv("CKPT_SERVER");
        } else if ((v = global_value("--blobs", argc, argv, &i, &missing))) {
            setenv("CKPT_BLOBS", v, 1); /* where the store's blobs live: a folder's default or s3:// */
        } else if ((v = global_value("--server", argc, argv, &i, &missing))) {
            setenv("CKPT_SERVER", v, 1);
            server_flag_given = true;
        } else if ((v = global_value("--db", argc, argv, &i, &missing))) {
            /* the queue's database (store/catalog.h); workers inherit it */
            setenv("CKPT_DB", v, 1);
        } else if ((v = global_value("--token-file", argc, argv, &i, &missing))) {
            if (set_token_from(v) < 0) {
                fprintf(stderr, "ckpt: --token-file: %s\n", ckpt_error_last());
                return CLI_USAGE;
            }
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "--version")) {
            break;
        } else {
            fprintf(stderr, "ckpt: %s '%s' before the command (global options: --home DIR, --blobs URL, "
                            "--server URL, --token-file FILE, --db URL)\n",
                    missing ? "a value is missing after" : "unknown option", argv[i]);
            return CLI_USAGE;
        }
    }
    *first = i;
    return CLI_OK;
}

const char *cli_server(const char *server_flag, const char *home_flag)
{
    if (server_flag) return server_flag;
    if (home_flag) return NULL;
    const char *env = getenv("CKPT_SERVER");
    return env && *env ? env : NULL;
}

int cli_local_only(const char *cmd, const char *server_flag, const char *home_flag, const char *instead)
{
    const char *srv = cli_server(server_flag, home_flag);
    if (!srv) return CLI_OK;
    bool flag = server_flag || server_flag_given;
    fprintf(stderr, "ckpt %s: works on this machine's store only, not on a server (%s%s)%s%s\n", cmd,
            flag ? "--server " : "CKPT_SERVER=", srv, instead ? ": " : "", instead ? instead : "");
    if (!flag) fprintf(stderr, "pass --home DIR to use a local store\n");
    return CLI_USAGE;
}

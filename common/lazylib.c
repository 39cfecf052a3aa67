/* lazylib.c — dlopen() a library on first use; see lazylib.h. */
#include "common/lazylib.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_mutex_t lazylib_lock = PTHREAD_MUTEX_INITIALIZER;

static _Noreturn void lazylib_die(const lazylib *lib, const char *what)
{
    const char *why = dlerror();
    fprintf(stderr, "ckpt: %s %s: %s (install the Debian package %s)\n", what, lib->soname,
            why ? why : "unknown error", lib->package);
    exit(127);
}

void *lazylib_sym(lazylib *lib, const char *name)
{
    pthread_mutex_lock(&lazylib_lock);
    if (!lib->handle) {
        lib->handle = dlopen(lib->soname, RTLD_NOW | RTLD_LOCAL);
        if (!lib->handle) lazylib_die(lib, "cannot load");
    }
    pthread_mutex_unlock(&lazylib_lock);
    void *p = dlsym(lib->handle, name);
    if (!p) {
        fprintf(stderr, "ckpt: %s has no symbol %s: too old a version? (Debian package %s)\n", lib->soname,
                name, lib->package);
        exit(127);
    }
    return p;
}

/* lazylib.h — load a shared library on first use.
 *
 * Every `ckpt worker` is a fresh exec of the binary (one per job), and the
 * dynamic loader's work grows with every library linked: libcurl, libarchive,
 * libmicrohttpd and OpenBLAS bring some forty more (TLS, Kerberos, LDAP, ICU,
 * gfortran, OpenBLAS's thread pool) and cost ~8 ms per exec, most of a no-op
 * job. Those four are therefore not linked: common/lazylib_stubs.c defines
 * each function ckpt calls from them, and the first call dlopen()s the library
 * (by soname) and resolves the symbol. A job that never downloads, archives,
 * serves or multiplies never loads them.
 */
#ifndef CKPT_COMMON_LAZYLIB_H
#define CKPT_COMMON_LAZYLIB_H

typedef struct lazylib {
    const char *soname;  /* e.g. "libcurl.so.4" */
    const char *package; /* the Debian package that installs it */
    void *handle;        /* set once, under a lock */
} lazylib;

/* The address of symbol NAME in LIB, loading LIB on first use. A library or
 * symbol that cannot be found is an installation error with no way to carry
 * on: it prints what is missing and which package provides it, and exits 127. */
void *lazylib_sym(lazylib *lib, const char *name);

#endif

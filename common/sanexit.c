/* sanexit.c — see sanexit.h. */
#include "common/sanexit.h"

#if defined(__SANITIZE_ADDRESS__) /* GCC */
#define CKPT_SANEXIT_ASAN 1
#elif defined(__has_feature) /* clang */
#if __has_feature(address_sanitizer)
#define CKPT_SANEXIT_ASAN 1
#endif
#endif

#ifdef CKPT_SANEXIT_ASAN
#include <link.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14; older headers lack the name */
#endif

/* Each module's writable loaded segments (.data, .bss): what LeakSanitizer
 * scans as globals. */
static int populate_module(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    uintptr_t page = *(uintptr_t *)data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_W) || !ph->p_memsz) continue;
        uintptr_t b = info->dlpi_addr + ph->p_vaddr, e = b + ph->p_memsz;
        b &= ~(page - 1);
        e = (e + page - 1) & ~(page - 1);
        (void)madvise((void *)b, e - b, MADV_POPULATE_READ);
    }
    return 0;
}

static void populate_globals(void)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    dl_iterate_phdr(populate_module, &page);
}

/* The runtime registered its leak check with atexit() when it started, before
 * main: handlers run last registered first, so this one runs before it. */
void ckpt_san_exit_prefault(void)
{
    (void)atexit(populate_globals);
}
#else
void ckpt_san_exit_prefault(void) {}
#endif

/*
 * sanexit.h — a cheaper exit for the AddressSanitizer build (SAN=1).
 *
 * LeakSanitizer's check at exit reads every writable global of the process,
 * ~9 MB in the sanitizer build of ckpt, most of it the runtime's own tables
 * and never touched: each untouched 4 KiB page it reads is a page fault
 * (~1,300 per process, 25-30 us each on the virtual machines measured, about
 * a fifth of the CPU of a short `ckpt` call). ckpt_san_exit_prefault()
 * registers, before the program's work starts, an exit handler that asks the
 * kernel to map those pages in one call per segment
 * (madvise(MADV_POPULATE_READ), Linux 5.14+: the shared zero page for the
 * untouched ones) just before the leak check runs: the same scan over the
 * same memory, without the faults. A no-op in builds without ASan and on
 * kernels without MADV_POPULATE_READ (madvise fails, nothing changes).
 */
#ifndef CKPT_COMMON_SANEXIT_H
#define CKPT_COMMON_SANEXIT_H

void ckpt_san_exit_prefault(void);

#endif

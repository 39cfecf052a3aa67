/*
 * interrupt.h — Ctrl-C and SIGTERM during a command that writes a temp
 * output: the temp output is removed, then the process exits with the
 * conventional status (130 for SIGINT, 143 for SIGTERM).
 *
 *   ckpt_interrupt_init(ckpt_rm_rf);  // first thing, before any thread starts
 *   ckpt_tmpdir_create(dst, &tmp);    // tracks tmp (common/fsutil.c)
 *   ...
 *   ckpt_dir_commit(tmp, dst);        // renames, then stops tracking, as one step
 *
 * ckpt_interrupt_init blocks SIGINT and SIGTERM in the calling thread (and so
 * in every thread it starts later) and starts one thread that waits for them
 * with sigwait: the removal runs as ordinary code, not in a signal handler.
 * A step that must not be cut half-way (moving an old output aside and the
 * new one into place) runs between ckpt_interrupt_hold and
 * ckpt_interrupt_release: a signal that comes then is acted on when it ends,
 * so what is removed is always garbage, never the only copy of an output.
 * Without ckpt_interrupt_init the tracking costs nothing and signals keep
 * their default action.
 */
#ifndef CKPT_COMMON_INTERRUPT_H
#define CKPT_COMMON_INTERRUPT_H

#include <stdbool.h>

/* Installs the handling described above. Call once, before any thread.
 * remove_tree removes a tracked path, file or folder (ckpt_rm_rf: passed in
 * so that this file, which fsutil.c uses, does not use fsutil.c). */
int ckpt_interrupt_init(int (*remove_tree)(const char *path));
/* True once ckpt_interrupt_init has run. */
bool ckpt_interrupt_active(void);

/* path (a temp file or folder) is removed if the process is interrupted. */
void ckpt_interrupt_track(const char *path);
/* path is no longer removed on an interrupt (it was renamed or removed). */
void ckpt_interrupt_untrack(const char *path);

/* A critical section (nestable, per thread): an interrupt waits for its end,
 * and the thread that ends it stops there while the handler exits. */
void ckpt_interrupt_hold(void);
void ckpt_interrupt_release(void);

/* For a fault point that sends the process sig (common/fault.c): marks it
 * pending before the kill, so the step where the command stops does not
 * depend on when the handler's thread wakes up. */
void ckpt_interrupt_mark_pending(int sig);
/* When the handling is installed, a signal is pending and this thread holds
 * no critical section: waits here for the handler to clean up and exit.
 * Returns at once otherwise. */
void ckpt_interrupt_wait_for_exit(void);

#endif

/*
 * fault.h — named crash points, for tests that kill a process at an exact step.
 *
 * Code that makes something durable calls ckpt_fault("NAME") between its
 * steps (after the temp write, after the fsync, after the rename, before and
 * after the catalog commit, ...). Normally that is one branch on a cached
 * flag. When the environment holds
 *
 *     CKPT_FAULT=NAME[:N[:SIG]][,NAME[:N[:SIG]]...]
 *
 * the Nth pass (default the 1st) of the process through point NAME kills the
 * process with SIGKILL on the spot, as a power cut or `kill -9` would, so a
 * test can check what the store, the state or the output folder looks like
 * after exactly that step. SIG TERM or INT sends SIGTERM or SIGINT to the
 * process instead (as `kill` or Ctrl-C would; e.g. exec.file_done:2:TERM):
 * with the interrupt handling of common/interrupt.h installed, the thread at
 * the point then waits there while the handler removes the temp output and
 * exits 143 or 130 (unless the point is inside a critical section, which
 * finishes first); without it, the signal's default action ends the process.
 * SIG ERR applies to the points code checks with ckpt_fault_error() instead:
 * from the Nth pass on, each pass reports a failure there (a catalog read that
 * fails, a stream that breaks), so a test can see how the failure is handled.
 * SIG STOP stops the process there (SIGSTOP) until a test has done something
 * concurrently (a `ckpt rm`) and sends SIGCONT: a race made deterministic.
 * N counts passes of that point in this process (threads included).
 *
 * With CKPT_FAULT_ONCE=FILE the kill happens only if FILE can be created
 * (O_EXCL): once across every process that inherits the variables, so a
 * retried job is not killed again. The daemon's workers take their points
 * from CKPT_FAULT_WORKER instead of CKPT_FAULT, so the daemon and its workers
 * can be stopped separately. CKPT_FAULT_TRACE=FILE appends each point's name
 * to FILE as it is passed (one line each), so a test can list the points a
 * command goes through and then stop it at every one. The points are listed
 * with their meaning in docs/testing.md; tests rely on the names.
 */
#ifndef CKPT_COMMON_FAULT_H
#define CKPT_COMMON_FAULT_H

#include <stdbool.h>

/* Passes the named point: kills the process here when CKPT_FAULT asks for it. */
void ckpt_fault(const char *point);

/* Passes the named error point: true when CKPT_FAULT names it with ":ERR" and
 * this is its Nth pass or a later one; the caller then fails as it would on a
 * real error of that step (setting the error message, naming the point). */
bool ckpt_fault_error(const char *point);

/* Re-reads the spec (as CKPT_FAULT would give it; NULL disarms) and resets the
 * counters: for a forked child in a unit test, and for a daemon's worker. */
void ckpt_fault_arm(const char *spec);

#endif

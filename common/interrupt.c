/*
 * interrupt.c — temp outputs removed on SIGINT/SIGTERM (see interrupt.h).
 */
#include "common/interrupt.h"

#include <sys/stat.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define INTR_MAX_PATHS 32

static pthread_mutex_t mu = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static char *paths[INTR_MAX_PATHS];
static atomic_bool active;
static int (*remove_tree)(const char *path); /* set by ckpt_interrupt_init */
static atomic_int pending; /* a signal the waiter is acting on (or is about to) */
static _Thread_local int hold_depth;

void ckpt_interrupt_track(const char *path)
{
    pthread_mutex_lock(&mu);
    for (int i = 0; i < INTR_MAX_PATHS; i++)
        if (!paths[i]) {
            paths[i] = strdup(path); /* NULL on no memory: then it is gc's or the next run's */
            break;
        }
    pthread_mutex_unlock(&mu);
}

void ckpt_interrupt_untrack(const char *path)
{
    pthread_mutex_lock(&mu);
    for (int i = 0; i < INTR_MAX_PATHS; i++)
        if (paths[i] && !strcmp(paths[i], path)) {
            free(paths[i]);
            paths[i] = NULL;
        }
    pthread_mutex_unlock(&mu);
}

void ckpt_interrupt_hold(void)
{
    pthread_mutex_lock(&mu);
    hold_depth++;
}

void ckpt_interrupt_release(void)
{
    hold_depth--;
    pthread_mutex_unlock(&mu);
    if (hold_depth == 0) ckpt_interrupt_wait_for_exit(); /* a signal came meanwhile: stop here */
}

bool ckpt_interrupt_active(void)
{
    return atomic_load(&active);
}

static void *waiter(void *arg)
{
    sigset_t *set = arg;
    int sig = 0;
    while (sigwait(set, &sig) != 0) {
    }
    atomic_store(&pending, sig);
    pthread_mutex_lock(&mu); /* after any critical section; never released: the process ends here */
    int removed = 0;
    for (int i = 0; i < INTR_MAX_PATHS; i++) {
        char *p = paths[i];
        if (!p) continue;
        paths[i] = NULL;
        /* Other threads may still be writing into it: a few passes. */
        struct stat st;
        for (int pass = 0; pass < 5 && lstat(p, &st) == 0; pass++)
            remove_tree(p);
        removed += lstat(p, &st) != 0;
        free(p);
    }
    char msg[96];
    int n = snprintf(msg, sizeof msg, "ckpt: interrupted (%s)%s\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
                     removed ? "; the unfinished output was removed" : "");
    if (n > 0) (void)!write(STDERR_FILENO, msg, (size_t)n);
    _exit(128 + sig);
    return NULL;
}

int ckpt_interrupt_init(int (*remove_tree_fn)(const char *path))
{
    remove_tree = remove_tree_fn;
    static sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0) return -1;
    pthread_t th;
    if (pthread_create(&th, NULL, waiter, &set) != 0) {
        pthread_sigmask(SIG_UNBLOCK, &set, NULL);
        return -1;
    }
    pthread_detach(th);
    atomic_store(&active, true);
    return 0;
}

void ckpt_interrupt_mark_pending(int sig)
{
    if (atomic_load(&active)) atomic_store(&pending, sig);
}

void ckpt_interrupt_wait_for_exit(void)
{
    if (!atomic_load(&active) || !atomic_load(&pending) || hold_depth > 0) return;
    for (;;)
        pause(); /* the waiter thread ends the process */
}

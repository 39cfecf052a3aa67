/*
 * fault.c — named crash points (see fault.h).
 */
#include "common/fault.h"

#include "common/interrupt.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FAULT_MAX_POINTS 8
#define FAULT_NAME_MAX 64
#define FAULT_ERR (-1) /* not a signal: ckpt_fault_error() reports a failure */

typedef struct {
    char name[FAULT_NAME_MAX];
    long at;           /* the pass that kills */
    int sig;           /* SIGKILL, or SIGTERM / SIGINT / SIGSTOP (":TERM", ":INT", ":STOP"), or FAULT_ERR (":ERR") */
    atomic_long seen;  /* passes so far */
} fault_point;

static fault_point points[FAULT_MAX_POINTS];
static int npoints;
static int trace_fd = -1;
static atomic_int armed; /* 0: not read yet, 1: nothing to do, 2: points or a trace */
static pthread_mutex_t arm_mu = PTHREAD_MUTEX_INITIALIZER;

static void parse(const char *spec)
{
    npoints = 0;
    while (spec && *spec && npoints < FAULT_MAX_POINTS) {
        size_t len = strcspn(spec, ",");
        const char *colon = memchr(spec, ':', len);
        size_t nlen = colon ? (size_t)(colon - spec) : len;
        if (nlen > 0 && nlen < FAULT_NAME_MAX) {
            fault_point *p = &points[npoints++];
            memcpy(p->name, spec, nlen);
            p->name[nlen] = '\0';
            char *end = NULL;
            p->at = colon ? strtol(colon + 1, &end, 10) : 1;
            if (p->at < 1) p->at = 1;
            p->sig = SIGKILL;
            if (end && end < spec + len && *end == ':') {
                size_t slen = (size_t)(spec + len - end - 1);
                if (slen == 4 && !strncmp(end + 1, "TERM", 4)) p->sig = SIGTERM;
                if (slen == 3 && !strncmp(end + 1, "INT", 3)) p->sig = SIGINT;
                if (slen == 4 && !strncmp(end + 1, "STOP", 4)) p->sig = SIGSTOP;
                if (slen == 3 && !strncmp(end + 1, "ERR", 3)) p->sig = FAULT_ERR;
            }
            atomic_store(&p->seen, 0);
        }
        spec += len + (spec[len] == ',');
    }
}

static void arm_locked(const char *spec, const char *trace)
{
    parse(spec);
    if (trace_fd >= 0) close(trace_fd);
    trace_fd = trace && *trace ? open(trace, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644) : -1;
    atomic_store(&armed, npoints > 0 || trace_fd >= 0 ? 2 : 1);
}

void ckpt_fault_arm(const char *spec)
{
    pthread_mutex_lock(&arm_mu);
    arm_locked(spec, getenv("CKPT_FAULT_TRACE"));
    pthread_mutex_unlock(&arm_mu);
}

/* True when this is the kill CKPT_FAULT_ONCE allows (or there is no such file). */
static bool once(void)
{
    const char *path = getenv("CKPT_FAULT_ONCE");
    if (!path || !*path) return true;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    close(fd);
    return true;
}

/* Arms from the environment on first use; true when there is anything to do. */
static bool fault_armed(void)
{
    int a = atomic_load(&armed);
    if (a == 0) {
        pthread_mutex_lock(&arm_mu);
        if (atomic_load(&armed) == 0) arm_locked(getenv("CKPT_FAULT"), getenv("CKPT_FAULT_TRACE"));
        pthread_mutex_unlock(&arm_mu);
        a = atomic_load(&armed);
    }
    return a == 2;
}

static void trace(const char *point)
{
    if (trace_fd >= 0) {
        char line[FAULT_NAME_MAX + 1];
        size_t n = strnlen(point, FAULT_NAME_MAX - 1);
        memcpy(line, point, n);
        line[n] = '\n';
        (void)!write(trace_fd, line, n + 1); /* O_APPEND: one line per write */
    }
}

void ckpt_fault(const char *point)
{
    if (!fault_armed()) return;
    trace(point);
    for (int i = 0; i < npoints; i++)
        if (points[i].sig != FAULT_ERR && !strcmp(points[i].name, point) &&
            atomic_fetch_add(&points[i].seen, 1) + 1 == points[i].at && once()) {
            if (points[i].sig == SIGKILL || points[i].sig == SIGSTOP) {
                raise(points[i].sig); /* STOP: the process waits here for SIGCONT */
                continue;
            }
            /* To the process, not this thread: the interrupt handler's thread takes it
             * (common/interrupt.h); this thread stops here while it cleans up. */
            ckpt_interrupt_mark_pending(points[i].sig);
            kill(getpid(), points[i].sig);
            ckpt_interrupt_wait_for_exit();
        }
}

bool ckpt_fault_error(const char *point)
{
    if (!fault_armed()) return false; /* not traced: CKPT_FAULT_TRACE lists the kill points */
    bool fail = false;
    for (int i = 0; i < npoints; i++)
        if (points[i].sig == FAULT_ERR && !strcmp(points[i].name, point) &&
            atomic_fetch_add(&points[i].seen, 1) + 1 >= points[i].at)
            fail = true;
    return fail;
}

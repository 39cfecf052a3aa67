/* bqueue.c — a bounded queue of byte buffers between threads (see bqueue.h). */
#include "common/bqueue.h"

#include "common/error.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int bqueue_init(bqueue *q, size_t nslots, size_t slot_bytes, size_t nreaders)
{
    memset(q, 0, sizeof *q);
    if (!nslots || nslots > BQUEUE_MAX_SLOTS || !nreaders || nreaders > BQUEUE_MAX_READERS)
        return ckpt_error_set(CKPT_EINTERNAL, "bqueue: %zu slots for %zu readers", nslots, nreaders);
    q->nslots = nslots;
    q->nreaders = nreaders;
    q->slot_bytes = slot_bytes;
    for (size_t i = 0; i < nslots; i++)
        if (!(q->buf[i] = ckpt_big_alloc(slot_bytes))) {
            for (size_t j = 0; j < i; j++) ckpt_big_free(q->buf[j], slot_bytes);
            return ckpt_error_set(CKPT_ENOMEM, "out of memory for %zu buffers of %zu bytes", nslots, slot_bytes);
        }
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    return 0;
}

void bqueue_free(bqueue *q)
{
    for (size_t i = 0; i < q->nslots; i++) ckpt_big_free(q->buf[i], q->slot_bytes);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    memset(q, 0, sizeof *q);
}

void bqueue_skip(bqueue *q, size_t skip)
{
    q->skip = skip < q->slot_bytes ? skip : q->slot_bytes;
}

void bqueue_reset(bqueue *q)
{
    q->put = 0;
    memset(q->got, 0, sizeof q->got);
    memset(q->left, 0, sizeof q->left);
    q->closed = q->cancelled = false;
    q->err = 0;
    q->msg[0] = 0;
}

static void wait_locked(bqueue *q)
{
    q->waiting++;
    pthread_cond_wait(&q->cv, &q->mu);
    q->waiting--;
}

/* Every reader still reading is done with the slot the next put fills. */
static bool slot_free(const bqueue *q)
{
    for (size_t r = 0; r < q->nreaders; r++)
        if (!q->left[r] && q->put - q->got[r] >= q->nslots) return false;
    return true;
}

void *bqueue_slot(bqueue *q)
{
    pthread_mutex_lock(&q->mu);
    while (!q->cancelled && !slot_free(q)) wait_locked(q);
    void *b = q->cancelled ? NULL : (uint8_t *)q->buf[q->put % q->nslots] + q->skip;
    pthread_mutex_unlock(&q->mu);
    return b;
}

void bqueue_put(bqueue *q, size_t len)
{
    pthread_mutex_lock(&q->mu);
    q->len[q->put % q->nslots] = len;
    q->put++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void *bqueue_get(bqueue *q, size_t r, size_t *len)
{
    pthread_mutex_lock(&q->mu);
    while (!q->cancelled && !q->closed && q->got[r] == q->put) wait_locked(q);
    void *b = NULL;
    if (!q->cancelled && q->got[r] < q->put) {
        b = (uint8_t *)q->buf[q->got[r] % q->nslots] + q->skip;
        *len = q->len[q->got[r] % q->nslots];
    }
    pthread_mutex_unlock(&q->mu);
    return b;
}

/* Under the lock: counter up by one and/or flag set, then everyone woken. */
static void bump(bqueue *q, uint64_t *counter, bool *flag)
{
    pthread_mutex_lock(&q->mu);
    if (counter) (*counter)++;
    if (flag) *flag = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void bqueue_done(bqueue *q, size_t r) { bump(q, &q->got[r], NULL); }
void bqueue_leave(bqueue *q, size_t r) { bump(q, NULL, &q->left[r]); }
void bqueue_cancel(bqueue *q) { bump(q, NULL, &q->cancelled); }

/* Keeps rc (when it is a failure and none was kept) with this thread's
 * message, sets *flag and wakes everyone. */
static void end(bqueue *q, int rc, bool *flag)
{
    pthread_mutex_lock(&q->mu);
    if (rc && !q->err) {
        q->err = rc;
        snprintf(q->msg, sizeof q->msg, "%s", ckpt_error_last());
    }
    *flag = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void bqueue_close(bqueue *q, int rc) { end(q, rc, &q->closed); }
void bqueue_fail(bqueue *q, int rc) { end(q, rc, &q->cancelled); }

int bqueue_error(bqueue *q)
{
    pthread_mutex_lock(&q->mu);
    int rc = q->err ? ckpt_error_set(q->err, "%s", q->msg) : 0;
    pthread_mutex_unlock(&q->mu);
    return rc;
}

unsigned bqueue_waiting(bqueue *q)
{
    pthread_mutex_lock(&q->mu);
    unsigned n = q->waiting;
    pthread_mutex_unlock(&q->mu);
    return n;
}

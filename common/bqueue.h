/*
 * bqueue.h — a bounded queue of byte buffers between threads.
 *
 * A ring of a few buffers (slots) of one size, owned by the queue. One
 * producer fills them in order and one or more readers take every buffer, in
 * the order it was put: a slot is filled again only once every reader still
 * reading is done with it. So a producer that runs ahead waits (at most
 * nslots buffers in flight, whatever their size), and a reader waits for the
 * next buffer instead of polling.
 *
 *   producer                          each reader r
 *   void *b = bqueue_slot(q);         size_t len;
 *   ... fill up to slot_bytes ...     const char *b = bqueue_get(q, r, &len);
 *   bqueue_put(q, len);               ... use b[0..len) ...
 *   ...                               bqueue_done(q, r);
 *   bqueue_close(q, 0);               (NULL from bqueue_get: the end)
 *
 * The buffers are written without the queue's lock: a slot belongs to the
 * producer from bqueue_slot to bqueue_put, then to the readers until the last
 * one's bqueue_done (the lock taken by each call orders the bytes).
 *
 * Ending it:
 * - bqueue_close (the producer: nothing more). Readers get what is queued,
 *   then NULL. A producer that stops at a failure of its own closes with its
 *   code: the readers still use what came before it (a tar stream cut after
 *   its last whole block), and bqueue_error tells them why it ended.
 * - bqueue_cancel (anyone: stop now). Every wait ends at once: bqueue_slot
 *   and bqueue_get return NULL from then on, what is queued is dropped.
 * - bqueue_fail (anyone, after a failure): cancels, keeping the failure.
 *   The first failure kept (by bqueue_close or bqueue_fail) is kept with its
 *   code and the failing thread's error message; bqueue_error gives both back
 *   to whichever thread reports it.
 * - bqueue_leave (a reader that stops early without failing): the producer
 *   no longer waits for it; the other readers go on.
 *
 * A thread that writes a result of its own before bqueue_close, bqueue_cancel
 * or bqueue_fail may leave it for a thread that sees the end (NULL) to read:
 * the queue's lock orders the two.
 */
#ifndef CKPT_COMMON_BQUEUE_H
#define CKPT_COMMON_BQUEUE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BQUEUE_MAX_SLOTS 16
#define BQUEUE_MAX_READERS 4

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t nslots, nreaders, slot_bytes;
    size_t skip; /* bqueue_skip */
    void *buf[BQUEUE_MAX_SLOTS];
    size_t len[BQUEUE_MAX_SLOTS];
    uint64_t put;                     /* buffers published */
    uint64_t got[BQUEUE_MAX_READERS]; /* buffers each reader is done with */
    bool left[BQUEUE_MAX_READERS];
    bool closed, cancelled;
    unsigned waiting; /* threads blocked in a call now */
    int err;          /* the first failure (bqueue_fail) */
    char msg[1024];   /* its message */
} bqueue;

/* nslots buffers (1..BQUEUE_MAX_SLOTS) of slot_bytes each (aligned to 4 KiB), for nreaders
 * readers (1..BQUEUE_MAX_READERS, numbered from 0). CKPT_ENOMEM (message set)
 * when the buffers cannot be had. */
int bqueue_init(bqueue *q, size_t nslots, size_t slot_bytes, size_t nreaders);
void bqueue_free(bqueue *q);
/* Empty and open again, the buffers kept: for a next use when no thread uses it. */
void bqueue_reset(bqueue *q);
/* From now on (no thread using q) the buffers bqueue_slot and bqueue_get give
 * start skip bytes into each (slot_bytes - skip of them left): a reader
 * with O_DIRECT places the block around its offset before them. */
void bqueue_skip(bqueue *q, size_t skip);

/* The producer's next slot (slot_bytes bytes), waiting while every slot is
 * in use; NULL once cancelled. */
void *bqueue_slot(bqueue *q);
/* Publishes the slot bqueue_slot gave, len bytes of it. */
void bqueue_put(bqueue *q, size_t len);

/* Reader r's next buffer (its length in *len), waiting while none is
 * queued; the same buffer until bqueue_done. NULL at the end (closed and
 * all taken) or once cancelled. */
void *bqueue_get(bqueue *q, size_t r, size_t *len);
/* Reader r is done with the buffer bqueue_get gave. */
void bqueue_done(bqueue *q, size_t r);
/* Reader r takes no more: nobody waits for it. */
void bqueue_leave(bqueue *q, size_t r);

/* The producer is done: rc 0, or its failure (negative), kept with this
 * thread's message unless a failure was kept already. */
void bqueue_close(bqueue *q, int rc);
void bqueue_cancel(bqueue *q);
/* Cancels, keeping rc (negative) as bqueue_close does. */
void bqueue_fail(bqueue *q, int rc);
/* The kept failure, its message set as this thread's error; 0 when none. */
int bqueue_error(bqueue *q);
/* How many threads wait in bqueue_slot or bqueue_get now (for tests). */
unsigned bqueue_waiting(bqueue *q);

#endif

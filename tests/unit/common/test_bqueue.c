/*
 * test_bqueue.c — common/bqueue.h, the bounded queue of buffers between
 * threads (the tar pipeline's and the import's): buffers come out whole and
 * in order across threads, with one reader and with two; a slot is not
 * filled again while a reader still reads it; close wakes a reader waiting on
 * an empty queue and lets it drain what is queued first (then says why the
 * producer stopped, if it failed); cancel wakes a
 * producer waiting on a full queue; a reader that leaves is no longer waited
 * for; the first failure is kept with its message.
 *
 * A test waits for another thread to be blocked in the queue by polling
 * bqueue_waiting (a state, not a sleep).
 */
#include "common/bqueue.h"
#include "common/error.h"

#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define SLOT 64
#define ITEMS 2000

/* Buffer i: 1 + i % SLOT bytes, each (i * 7 + k) & 0xff. */
static size_t item_len(size_t i) { return 1 + i % SLOT; }
static uint8_t item_byte(size_t i, size_t k) { return (uint8_t)((i * 7 + k) & 0xff); }

static void wait_blocked(bqueue *q, unsigned n)
{
    while (bqueue_waiting(q) < n) sched_yield();
}

/* n buffers of one byte, 'a', 'b', ..., put by this thread (slots free). */
static void put_letters(bqueue *q, int n)
{
    for (int i = 0; i < n; i++) {
        char *b = bqueue_slot(q);
        assert_non_null(b);
        b[0] = (char)('a' + i);
        bqueue_put(q, 1);
    }
}

static void *producer(void *arg)
{
    bqueue *q = arg;
    for (size_t i = 0; i < ITEMS; i++) {
        uint8_t *b = bqueue_slot(q);
        if (!b) return NULL;
        for (size_t k = 0; k < item_len(i); k++) b[k] = item_byte(i, k);
        bqueue_put(q, item_len(i));
    }
    bqueue_close(q, 0);
    return NULL;
}

typedef struct {
    bqueue *q;
    size_t r;
    size_t seen; /* buffers that came out right, in order */
} reader_arg;

/* Reader a->r: every buffer in order, each checked; at the first wrong one
 * it cancels the queue (so that the test fails instead of hanging). */
static void *reader(void *arg)
{
    reader_arg *a = arg;
    const uint8_t *b;
    size_t len;
    while ((b = bqueue_get(a->q, a->r, &len))) {
        size_t i = a->seen;
        bool ok = i < ITEMS && len == item_len(i);
        for (size_t k = 0; ok && k < len; k++) ok = b[k] == item_byte(i, k);
        sched_yield(); /* hold the slot a little: the producer must wait for it */
        for (size_t k = 0; ok && k < len; k++) ok = b[k] == item_byte(i, k); /* not refilled meanwhile */
        if (!ok) {
            bqueue_cancel(a->q);
            break;
        }
        a->seen++;
        bqueue_done(a->q, a->r);
    }
    return NULL;
}

static void test_order_one_reader(void **state)
{
    (void)state;
    bqueue q;
    assert_int_equal(bqueue_init(&q, 3, SLOT, 1), 0);
    pthread_t p;
    assert_int_equal(pthread_create(&p, NULL, producer, &q), 0);
    reader_arg a = {.q = &q, .r = 0};
    reader(&a);
    pthread_join(p, NULL);
    assert_int_equal(a.seen, ITEMS);
    size_t len = 0;
    assert_null(bqueue_get(&q, 0, &len)); /* closed and drained */
    assert_int_equal(bqueue_error(&q), 0);
    bqueue_free(&q);
}

static void test_order_two_readers(void **state)
{
    (void)state;
    bqueue q;
    assert_int_equal(bqueue_init(&q, 2, SLOT, 2), 0);
    reader_arg a[2] = {{.q = &q, .r = 0}, {.q = &q, .r = 1}};
    pthread_t p, t[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&t[i], NULL, reader, &a[i]), 0);
    assert_int_equal(pthread_create(&p, NULL, producer, &q), 0);
    pthread_join(p, NULL);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    assert_int_equal(a[0].seen, ITEMS);
    assert_int_equal(a[1].seen, ITEMS);
    bqueue_free(&q);
}

typedef struct {
    bqueue *q;
    atomic_int taken;
    atomic_bool ended; /* bqueue_get returned NULL */
} getter_arg;

static void *getter(void *arg)
{
    getter_arg *g = arg;
    size_t len;
    while (bqueue_get(g->q, 0, &len)) {
        atomic_fetch_add(&g->taken, 1);
        bqueue_done(g->q, 0);
    }
    atomic_store(&g->ended, true);
    return NULL;
}

/* A reader waiting on an empty queue: a put wakes it, a close ends it. */
static void test_close_wakes_getter(void **state)
{
    (void)state;
    bqueue q;
    assert_int_equal(bqueue_init(&q, 2, SLOT, 1), 0);
    getter_arg g = {.q = &q};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, getter, &g), 0);
    wait_blocked(&q, 1);
    assert_false(atomic_load(&g.ended));
    memcpy(bqueue_slot(&q), "x", 1);
    bqueue_put(&q, 1);
    while (atomic_load(&g.taken) < 1) sched_yield();
    wait_blocked(&q, 1); /* waiting for the second buffer */
    assert_false(atomic_load(&g.ended));
    bqueue_close(&q, 0);
    pthread_join(t, NULL);
    assert_true(atomic_load(&g.ended));
    assert_int_equal(atomic_load(&g.taken), 1);
    bqueue_free(&q);
}

/* What is queued when the producer closes is still read, then the end; a
 * producer that closed at a failure says so after that. */
static void test_close_drains(void **state)
{
    (void)state;
    bqueue q;
    assert_int_equal(bqueue_init(&q, 4, SLOT, 1), 0);
    put_letters(&q, 3);
    bqueue_close(&q, ckpt_error_set(CKPT_EIO, "block 4 unreadable"));
    ckpt_error_clear();
    for (int i = 0; i < 3; i++) {
        size_t len = 0;
        const char *b = bqueue_get(&q, 0, &len);
        assert_non_null(b);
        assert_int_equal(len, 1);
        assert_int_equal(b[0], 'a' + i);
        bqueue_done(&q, 0);
    }
    size_t len;
    assert_null(bqueue_get(&q, 0, &len));
    assert_int_equal(bqueue_error(&q), CKPT_EIO);
    assert_string_equal(ckpt_error_last(), "block 4 unreadable");
    bqueue_free(&q);
}

typedef struct {
    bqueue *q;
    atomic_bool got_null;
} putter_arg;

static void *putter(void *arg)
{
    putter_arg *p = arg;
    atomic_store(&p->got_null, bqueue_slot(p->q) == NULL);
    return NULL;
}

/* A thread asking for a slot of q, which is full: returns once it waits. */
static pthread_t start_putter(putter_arg *pa)
{
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, putter, pa), 0);
    wait_blocked(pa->q, 1);
    return t;
}

/* A producer waiting on a full queue: cancel ends the wait; nothing queued
 * is handed out after it. */
static void test_cancel_wakes_putter(void **state)
{
    (void)state;
    bqueue q;
    assert_int_equal(bqueue_init(&q, 2, SLOT, 1), 0);
    put_letters(&q, 2);
    putter_arg pa = {.q = &q};
    pthread_t t = start_putter(&pa);
    bqueue_cancel(&q);
    pthread_join(t, NULL);
    assert_true(atomic_load(&pa.got_null));
    size_t len;
    assert_null(bqueue_get(&q, 0, &len));
    assert_null(bqueue_slot(&q));
    assert_int_equal(bqueue_error(&q), 0); /* a cancel is no failure */
    bqueue_free(&q);
}

/* A slot comes back only once every reader still reading is done with it;
 * one that leaves is not waited for. */
static void test_readers_and_leave(void **state)
{
    (void)state;
    bqueue q;
    assert_int_equal(bqueue_init(&q, 2, SLOT, 2), 0);
    put_letters(&q, 2);
    size_t len;
    for (int i = 0; i < 2; i++) {
        assert_non_null(bqueue_get(&q, 0, &len));
        bqueue_done(&q, 0);
    }
    /* reader 0 is done with both, reader 1 with none: the queue is full */
    putter_arg pa = {.q = &q};
    pthread_t t = start_putter(&pa);
    bqueue_leave(&q, 1);
    pthread_join(t, NULL);
    assert_false(atomic_load(&pa.got_null)); /* a slot, once reader 1 left */
    bqueue_put(&q, 1);
    assert_non_null(bqueue_get(&q, 0, &len));
    bqueue_free(&q);
}

typedef struct {
    bqueue *q;
    const char *what;
    int rc;
} failer_arg;

static void *failer(void *arg)
{
    failer_arg *f = arg;
    bqueue_fail(f->q, ckpt_error_set(f->rc, "%s failed", f->what));
    return NULL;
}

/* The first failure is kept with its message (set in the failing thread),
 * later ones are not; everyone stops; a reset queue starts clean. */
static void test_fail_keeps_first(void **state)
{
    (void)state;
    bqueue q;
    assert_int_equal(bqueue_init(&q, 2, SLOT, 1), 0);
    getter_arg g = {.q = &q};
    pthread_t t, f;
    assert_int_equal(pthread_create(&t, NULL, getter, &g), 0);
    wait_blocked(&q, 1);
    failer_arg first = {.q = &q, .what = "the reader", .rc = CKPT_EIO};
    assert_int_equal(pthread_create(&f, NULL, failer, &first), 0);
    pthread_join(f, NULL);
    pthread_join(t, NULL);
    assert_true(atomic_load(&g.ended));
    failer_arg second = {.q = &q, .what = "the writer", .rc = CKPT_ENOMEM};
    failer(&second);
    ckpt_error_clear();
    assert_int_equal(bqueue_error(&q), CKPT_EIO);
    assert_string_equal(ckpt_error_last(), "the reader failed");
    assert_null(bqueue_slot(&q));

    bqueue_reset(&q);
    assert_int_equal(bqueue_error(&q), 0);
    put_letters(&q, 1);
    size_t len;
    const char *r = bqueue_get(&q, 0, &len);
    assert_non_null(r);
    assert_int_equal(r[0], 'a');
    bqueue_free(&q);
}

static void test_limits(void **state)
{
    (void)state;
    bqueue q;
    assert_int_equal(bqueue_init(&q, 0, SLOT, 1), CKPT_EINTERNAL);
    assert_int_equal(bqueue_init(&q, BQUEUE_MAX_SLOTS + 1, SLOT, 1), CKPT_EINTERNAL);
    assert_int_equal(bqueue_init(&q, 2, SLOT, 0), CKPT_EINTERNAL);
    assert_int_equal(bqueue_init(&q, 2, SLOT, BQUEUE_MAX_READERS + 1), CKPT_EINTERNAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_one_reader),   cmocka_unit_test(test_order_two_readers),
        cmocka_unit_test(test_close_wakes_getter), cmocka_unit_test(test_close_drains),
        cmocka_unit_test(test_cancel_wakes_putter), cmocka_unit_test(test_readers_and_leave),
        cmocka_unit_test(test_fail_keeps_first),   cmocka_unit_test(test_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

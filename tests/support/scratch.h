/*
 * scratch.h — what the cmocka test programs share: a scratch folder per test
 * (under $TMPDIR, removed afterwards) and message assertions.
 *
 *   cmocka_unit_test_setup_teardown(test_x, scratch_setup, scratch_teardown)
 *   static void test_x(void **state) { const char *dir = *state; ... }
 */
#ifndef CKPT_TESTS_SCRATCH_H
#define CKPT_TESTS_SCRATCH_H

int scratch_setup(void **state);
int scratch_teardown(void **state);
/* Fails the test unless haystack contains needle. */
void assert_contains(const char *haystack, const char *needle);

#endif

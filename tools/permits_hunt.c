/*
 * permits_hunt.c -- the reproducer of max_concurrent's over-admission, fixed on
 * 2026-12-05 (not part of `make test`: it needs the machine to itself). Rounds of
 * NTHREADS threads, each making ITERS takes on one fresh anonymous breaker of
 * max_concurrent LIMIT, every thread the same number (as test/permits.c test 2), each
 * yielding now and then while it holds its permit, so that the others take spare
 * permits from its lane often; the test counts who is inside (after the take, before
 * the give, so it can only undercount) and prints the permit words the first time a
 * round passes the limit. The cause: the global membarrier did not reach this
 * process's own threads on a CPU the kernel had not marked (fz_permits.c, fence_all).
 * Before the fix, ASan build, alone on the machine: 133 of 250 rounds one past the
 * limit (6 inside a limit of 5); after, none of 100. Run: make permits-hunt
 * [HUNT_ROUNDS=N] [HUNT_ITERS=N]; exits 1 when a round passed the limit.
 */
#include "../csrc/fz.h"
#define FZ_BREAKER_WORDS
#include "../csrc/fz_internal.h"  /* permits_of: the words shown when the limit is passed */
#include "../csrc/fz_permits.h"
#include "permit_words.h"
#include "tap.h"
#include "harness.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NTHREADS = 8, LIMIT = 5 };

static fz_breaker *g_b;
static long g_iters;
static int g_in, g_over, g_max, g_shown;  /* atomics */

/* The permit words (test/permit_words.h), once a round. */
static void show(void) {
  if (__atomic_exchange_n(&g_shown, 1, __ATOMIC_SEQ_CST)) return;
  char line[2048];
  permit_words(g_b, line, sizeof line);
  fprintf(stderr, "%s\n", line);
}

static void *hammer(void *arg) {
  (void)arg;
  for (long i = 0; i < g_iters; i++) {
    if (!fz_permit_take(g_b, 1)) continue;
    int in = __atomic_add_fetch(&g_in, 1, __ATOMIC_SEQ_CST);
    if (in > LIMIT) {
      __atomic_add_fetch(&g_over, 1, __ATOMIC_SEQ_CST);
      show();
    }
    int m = __atomic_load_n(&g_max, __ATOMIC_RELAXED);
    while (in > m && !__atomic_compare_exchange_n(&g_max, &m, in, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    for (volatile int spin = 0; spin < (int)(i % 7) * 10; spin++) {}
    if (i % 64 == 0) sched_yield();  /* the others take this lane's spare meanwhile */
    __atomic_sub_fetch(&g_in, 1, __ATOMIC_SEQ_CST);
    fz_permit_give(g_b);
  }
  return NULL;
}

int main(void) {
  const char *r = getenv("HUNT_ROUNDS"), *it = getenv("HUNT_ITERS");
  long rounds = r ? atol(r) : 100, bad = 0;
  g_iters = it ? atol(it) : 100000;
  for (long k = 0; k < rounds; k++) {
    fz_config c = limit_config(LIMIT);
    g_b = fz_breaker_new(&c, NULL);
    if (!g_b) return 2;
    g_in = g_over = g_max = g_shown = 0;
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
      if (pthread_create(&th[i], NULL, hammer, NULL)) return 2;
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    if (g_over) {
      bad++;
      fprintf(stderr, "round %ld: %d entries past the limit, %d inside at most\n", k, g_over, g_max);
    }
    fz_breaker_free(g_b);
  }
  printf("%ld rounds, %ld past the limit of %d (%d threads, %ld takes each)\n", rounds, bad, LIMIT, NTHREADS, g_iters);
  return bad ? 1 : 0;
}

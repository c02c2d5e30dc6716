/*
 * bench/atomic.c -- what one locked read-modify-write costs on this machine: the floor of
 * what max_concurrent adds to a call (bench/limit.lua), whose take is one compare-and-swap
 * of the breaker's permit word (docs/isolation.md), and part of every closed call, which
 * counts its outcome with one add.
 *
 *   make build/bench_atomic && build/bench_atomic [iterations, 100000000]
 *
 * One thread, one word in its own cache line, nobody else touching it: ns per operation
 * (thread CPU time, the least of 5 rounds) of a relaxed store (no lock: the give), an
 * add (fz_atomic.h's at_add_rlx: lock xadd on x86) and a load then compare-and-swap (the
 * take's shape). Each operation depends on the one before, as the calls of one thread
 * do through the permit word, so the figure is the locked instruction's whole cost.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "fz_atomic.h"

static double cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static _Alignas(64) uint64_t word;

static void stores(long n) {
  for (long i = 0; i < n; i++) at_store_rlx(&word, (uint64_t)i);
}

static void adds(long n) {
  for (long i = 0; i < n; i++) at_add_rlx(&word, 1);
}

static void swaps(long n) {
  for (long i = 0; i < n; i++) {
    uint64_t v = at_load_acq(&word);
    while (!at_cas_acqrel(&word, &v, v + 1)) {}
  }
}

/* the least ns per operation over 5 rounds of n */
static double least(void (*loop)(long), long n) {
  double best = 0;
  for (int r = 0; r < 5; r++) {
    double t0 = cpu_ns();
    loop(n);
    double ns = (cpu_ns() - t0) / (double)n;
    if (r == 0 || ns < best) best = ns;
  }
  return best;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 100000000L;
  if (n < 1) {
    fprintf(stderr, "usage: bench_atomic [iterations]\n");
    return 2;
  }
  printf("one thread, one word, ns per operation (least of 5 rounds of %ld, thread CPU time)\n", n);
  printf("  relaxed store (a give)                 %6.2f\n", least(stores, n));
  printf("  atomic add (lock xadd)                 %6.2f\n", least(adds, n));
  printf("  load + compare-and-swap (a take)       %6.2f\n", least(swaps, n));
  printf("word %llu\n", (unsigned long long)word);  /* the work is used */
  return 0;
}

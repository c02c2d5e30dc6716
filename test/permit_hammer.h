/*
 * permit_hammer.h -- the loop of the threads that hammer one breaker's permits, for
 * test/permits.c and tools/permits_hunt.c: take a permit, count who is inside (after the
 * take, before the give), note each entry past the limit, spin a little, give it back.
 * The first entry past the limit hands the permit words (permit_words.h) to `show`,
 * once. Include after "../csrc/fz_internal.h" and "permit_words.h".
 */
#ifndef PERMIT_HAMMER_H
#define PERMIT_HAMMER_H

#include <sched.h>

/* Who is inside, the entries past the limit, the most inside at once, whether the words
 * were shown: atomics, in shared memory when processes hammer together. */
typedef struct { int in, over, max, shown; } hammer_counts;

typedef struct {
  fz_breaker *b;
  long iters;                       /* takes to try */
  int limit;                        /* more inside than this is past the limit */
  int yield_every;                  /* sched_yield() inside every so many takes; 0: never */
  hammer_counts *c;
  void (*show)(const char *words);  /* the permit words at the first entry past the limit */
} hammer_job;

/* One thread's takes; the number refused (full), and the number admitted in *taken. */
static inline long hammer_run(const hammer_job *j, long *taken)
{
  long full = 0, got = 0;
  for (long i = 0; i < j->iters; i++) {
    if (!fz_permit_take(j->b, 1)) {
      full++;
      continue;
    }
    got++;
    int in = __atomic_add_fetch(&j->c->in, 1, __ATOMIC_SEQ_CST);
    if (in > j->limit) {
      __atomic_add_fetch(&j->c->over, 1, __ATOMIC_SEQ_CST);
      if (!__atomic_exchange_n(&j->c->shown, 1, __ATOMIC_SEQ_CST)) {
        char line[2048];
        permit_words(j->b, line, sizeof line);
        j->show(line);
      }
    }
    int m = __atomic_load_n(&j->c->max, __ATOMIC_RELAXED);
    while (in > m && !__atomic_compare_exchange_n(&j->c->max, &m, in, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    for (volatile int spin = 0; spin < (int)(i % 7) * 10; spin++) {}
    if (j->yield_every && i % j->yield_every == 0) sched_yield();  /* others take this lane's spare meanwhile */
    __atomic_sub_fetch(&j->c->in, 1, __ATOMIC_SEQ_CST);
    fz_permit_give(j->b);
  }
  if (taken) *taken = got;
  return full;
}

#endif

/*
 * harness.h -- what the C tests of the core share, beside tap.h: the manual clock, a
 * breaker's state and a ticket's kind, a stats peek, a transition's code, and threads.
 * Include it after "../csrc/fz.h" and "tap.h".
 *
 *   at(1000); later(1.5);         the manual clock: set it, move it on (seconds)
 *   state(b), kind_of(ticket)     FZ_CLOSED...; 1 closed, 2 probe (a lifting one too), 3 disabled (0: rejection)
 *   peek(b).failures_total        fz_stats_peek, as a value
 *   code(FZ_CLOSED, FZ_OPEN)      a transition as fz_state and fz_done report it
 *   in_thread(fn, arg)            fn(arg) in a thread of its own, waited for
 *   threads_start(th, n, fn, 1)   n threads fn((void *)1) .. fn((void *)n); threads_join(th, n)
 *   limit_config(5)               a breaker's options with max_concurrent = 5, nothing tripping
 *                                 within a test (fails 5 of min_calls 10, periods of 10 s)
 *   now_s()                       CLOCK_MONOTONIC, seconds
 *   pin_cpu(1)                    this thread on CPU 1 only (1 when it runs there now)
 *   idle_cpu(1, 0)                CPU 1 left idle holding this process's memory: the thread
 *                                 runs there 30 ms, then moves to CPU 0 and sleeps 1 ms
 *
 * Everything is static inline: a test uses what it needs.
 */
#ifndef HARNESS_H
#define HARNESS_H

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The manual clock, seconds: what at() set it to last. */
static inline double *manual_now(void)
{
  static double t;
  return &t;
}
static inline void at(double s) { *manual_now() = s; fz_clock_manual(s); }
static inline void later(double s) { at(*manual_now() + s); }

static inline int state(fz_breaker *b) { return fz_state(b) & 255; }
/* (kind 0 with the flag set: a probe that lifted a timed forced_open, read as 2) */
static inline int kind_of(double t) {
  int k = t > 0 ? (int)((uint64_t)t >> 1 & 3) : 0;
  return t > 0 && k == 0 && ((uint64_t)t & 1) ? 2 : k;
}

static inline fz_stats peek(fz_breaker *b)
{
  fz_stats s;
  fz_stats_peek(b, &s);
  return s;
}

static inline int code(int from, int to) { return 64 + from * 8 + to; }

static inline fz_config limit_config(uint32_t limit)
{
  fz_config c;
  memset(&c, 0, sizeof c);
  c.window = 10, c.open_for = 10, c.max_open_for = 10, c.probe_timeout = 10;
  c.backoff = 1, c.fails = 5, c.min_calls = 10, c.probes = 1, c.max_concurrent = limit;
  return c;
}

static inline double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static inline int pin_cpu(int cpu)
{
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  return sched_setaffinity(0, sizeof s, &s) == 0 && (sched_yield(), sched_getcpu() == cpu);
}

/* The history after which a process that registers for membarrier is not marked on
 * CPU `idle` (test/fence_cpus.c): 1 when both moves held. */
static inline int idle_cpu(int idle, int to)
{
  int ok_idle = pin_cpu(idle);
  double until = now_s() + 0.03;
  while (now_s() < until) {}
  int ok_to = pin_cpu(to);
  struct timespec nap = { 0, 1000000 };
  nanosleep(&nap, NULL);
  return ok_idle && ok_to;
}

/* A named breaker of the registry, and its identity in *id (races.c, regcore.c). */
static inline fz_breaker *open_named(const char *name, const fz_config *c, uint32_t *id) {
  int st;
  return fz_registry_open_id(name, strlen(name), c, &st, id);
}
static inline int remove_named(const char *name) { return fz_registry_remove(name, strlen(name)); }

/* A thread that cannot start ends the test: nothing after it would mean anything. */
static inline void thread_start(pthread_t *th, void *(*fn)(void *), void *arg)
{
  int rc = pthread_create(th, NULL, fn, arg);
  if (rc != 0) {
    printf("Bail out! pthread_create: %s\n", strerror(rc));
    exit(1);
  }
}

static inline void in_thread(void *(*fn)(void *), void *arg)
{
  pthread_t th;
  thread_start(&th, fn, arg);
  pthread_join(th, NULL);
}

static inline void threads_start(pthread_t *th, int n, void *(*fn)(void *), intptr_t first)
{
  for (int i = 0; i < n; i++) thread_start(&th[i], fn, (void *)(first + i));
}

static inline void threads_join(pthread_t *th, int n)
{
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

#endif /* HARNESS_H */

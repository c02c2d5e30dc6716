/*
 * pause.h -- races forced deterministically: a thread parked at a named pause point of
 * the core (a FAULT() point of csrc/, built with -DFZ_FAULTS) while the test runs
 * another, then released. Include it after "harness.h"; install the hook first:
 *
 *   fz_fault_hook = pause_hook;
 *   parked k;
 *   ok(run_parked(&k, "stamping", do_enter, &job), "parked while stamping");
 *   ... what the other thread does meanwhile ...
 *   release(&k);                    the parked thread goes on; joined
 *
 * Only a thread started by run_parked parks (t_parkable), once per point it is armed
 * with (run_parked's, then each repark's); several such threads may be parked at once,
 * each with its own `parked`.
 */
#ifndef PAUSE_H
#define PAUSE_H

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

extern void (*fz_fault_hook)(const char *where);

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;

/* One thread run by run_parked; several may be parked at once, each at its own point. */
typedef struct parked {
  pthread_t th;
  void (*fn)(void *);
  void *arg;
  const char *point;                /* under g_mu: the armed point, NULL once released */
  int parked, finished;             /* under g_mu */
  int go;                           /* under g_mu: moved by release and repark */
} parked;

static _Thread_local parked *t_park;  /* the thread's own, for a thread run_parked started */
static _Thread_local int t_parkable;

static inline void pause_hook(const char *where) {
  parked *k = t_park;
  if (!t_parkable || !k) return;
  pthread_mutex_lock(&g_mu);
  if (k->point && strcmp(where, k->point) == 0 && !k->parked) {
    k->parked = 1;
    pthread_cond_broadcast(&g_cv);
    int go = k->go;
    while (k->go == go) pthread_cond_wait(&g_cv, &g_mu);
  }
  pthread_mutex_unlock(&g_mu);
}

static inline void *parked_main(void *p) {
  parked *k = p;
  t_park = k;
  t_parkable = 1;
  k->fn(k->arg);
  pthread_mutex_lock(&g_mu);
  k->finished = 1;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  return NULL;
}

/* Waits until k's thread parked or finished (or 5 s passed); 1 if it is parked. Under g_mu. */
static inline int wait_parked(parked *k) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 5;
  int rc = 0;
  while (!k->parked && !k->finished && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&g_cv, &g_mu, &until);
  return k->parked;
}

/* Runs fn(arg) in a thread that parks at `point`; returns 1 once it is parked there,
 * 0 if it finished (or 5 s passed) without reaching it. */
static inline int run_parked(parked *k, const char *point, void (*fn)(void *), void *arg) {
  pthread_mutex_lock(&g_mu);
  k->point = point, k->parked = k->finished = k->go = 0;
  pthread_mutex_unlock(&g_mu);
  k->fn = fn, k->arg = arg;
  thread_start(&k->th, parked_main, k);
  pthread_mutex_lock(&g_mu);
  int parked_now = wait_parked(k);
  pthread_mutex_unlock(&g_mu);
  return parked_now;
}

/* Lets the parked thread go on, and waits for it to finish. */
static inline void release(parked *k) {
  pthread_mutex_lock(&g_mu);
  k->go++;
  k->point = NULL;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  pthread_join(k->th, NULL);
}

/* Lets the parked thread go on to park again at `point`: 1 once it is parked there, 0
 * if it finished (or 5 s passed) without reaching it. */
static inline int repark(parked *k, const char *point) {
  pthread_mutex_lock(&g_mu);
  k->point = point, k->parked = 0;
  k->go++;
  pthread_cond_broadcast(&g_cv);
  int parked_now = wait_parked(k);
  pthread_mutex_unlock(&g_mu);
  return parked_now;
}

#endif /* PAUSE_H */

/*
 * pause.h -- pause points for the C tests that force races deterministically: one
 * thread parked at a named fault point of the core (built with -DFZ_FAULTS, whose
 * FAULT() points call fz_fault_hook) while another runs, then released.
 *
 *   fz_fault_hook = pause_hook;
 *   parked k;
 *   ok(run_parked(&k, "stamping", fn, arg), "parked");   fn(arg) runs in a thread that
 *   ... the other side of the race ...                   parks at "stamping"
 *   release(&k);                                          it goes on; joined
 *
 * Only the thread run_parked starts parks (t_parkable), and only once per run.
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
static const char *g_point;  /* under g_mu: the armed point */
static int g_parked, g_released, g_finished;
static _Thread_local int t_parkable;

static void pause_hook(const char *where) {
  if (!t_parkable) return;
  pthread_mutex_lock(&g_mu);
  if (g_point && strcmp(where, g_point) == 0 && !g_parked) {
    g_parked = 1;
    pthread_cond_broadcast(&g_cv);
    while (!g_released) pthread_cond_wait(&g_cv, &g_mu);
  }
  pthread_mutex_unlock(&g_mu);
}

typedef struct parked {
  pthread_t th;
  void (*fn)(void *);
  void *arg;
} parked;

static void *parked_main(void *p) {
  parked *k = p;
  t_parkable = 1;
  k->fn(k->arg);
  pthread_mutex_lock(&g_mu);
  g_finished = 1;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  return NULL;
}

/* Runs fn(arg) in a thread that parks at `point`; returns 1 once it is parked there,
 * 0 if it finished (or 5 s passed) without reaching it. */
static int run_parked(parked *k, const char *point, void (*fn)(void *), void *arg) {
  pthread_mutex_lock(&g_mu);
  g_point = point, g_parked = g_released = g_finished = 0;
  pthread_mutex_unlock(&g_mu);
  k->fn = fn, k->arg = arg;
  pthread_create(&k->th, NULL, parked_main, k);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 5;
  pthread_mutex_lock(&g_mu);
  int rc = 0;
  while (!g_parked && !g_finished && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&g_cv, &g_mu, &until);
  int parked_now = g_parked;
  pthread_mutex_unlock(&g_mu);
  return parked_now;
}

/* Lets the parked thread go on, and waits for it to finish. */
static void release(parked *k) {
  pthread_mutex_lock(&g_mu);
  g_released = 1;
  g_point = NULL;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  pthread_join(k->th, NULL);
}

#endif /* PAUSE_H */

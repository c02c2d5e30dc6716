/*
 * bench/procs.c -- calls per second of processes forked from the one that made the shared
 * registry (as nginx forks its workers), all on one breaker: 1 process, then 2, in each
 * of ROUNDS (8) rounds, each on a fresh breaker.
 *
 * Each process loops fz_enter + fz_done(FZ_SUCCESS) for the run's seconds, pinned to a
 * CPU of its own (process i on CPU i mod the CPUs online). A success is counted on the
 * process's counter stripe; two processes on one stripe move its cache line between
 * their CPUs at every call. Until 2026-12-05 a process's stripe came from its pid, which
 * put the two on one stripe in about 1 round of 4 (a round of about a tenth of the calls
 * per second); the shared registry now hands the stripes out in turn. The rounds are
 * printed one by one, so such a round shows.
 *
 * usage: procs [seconds per run (0.5)] [rounds (8)]; make bench runs it
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "fz.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct { volatile int go; int ready; double rate[2]; } board;
static board *g;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void worker(fz_breaker *b, int i, double secs) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(i % (int)sysconf(_SC_NPROCESSORS_ONLN), &set);
  sched_setaffinity(0, sizeof set, &set);
  __atomic_add_fetch(&g->ready, 1, __ATOMIC_SEQ_CST);
  while (!g->go) {}
  double t0 = now_s(), end = t0 + secs, t1;
  long n = 0;
  for (;;) {
    for (int k = 0; k < 1024; k++) fz_done(b, fz_enter(b), FZ_SUCCESS, -1.0);
    n += 1024;
    if ((t1 = now_s()) >= end) break;
  }
  g->rate[i] = (double)n / (t1 - t0);
  _exit(0);
}

/* n processes on breaker b for secs; their calls per second in all (0: a process failed) */
static double run(fz_breaker *b, int n, double secs) {
  pid_t pid[2];
  g->go = 0, g->ready = 0;
  for (int i = 0; i < n; i++) {
    if ((pid[i] = fork()) == 0) worker(b, i, secs);
    if (pid[i] < 0) {  /* the ones started run their seconds and are reaped, not left spinning */
      g->go = 1;
      for (int k = 0; k < i; k++) waitpid(pid[k], NULL, 0);
      return 0;
    }
  }
  while (__atomic_load_n(&g->ready, __ATOMIC_SEQ_CST) < n) usleep(1000);
  g->go = 1;
  double total = 0;
  int bad = 0;
  for (int i = 0; i < n; i++) {
    int st;
    if (waitpid(pid[i], &st, 0) != pid[i] || !WIFEXITED(st) || WEXITSTATUS(st) != 0) bad = 1;
    total += g->rate[i];
  }
  return bad ? 0 : total;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  double secs = argc > 1 ? atof(argv[1]) : 0.5;
  int rounds = argc > 2 ? atoi(argv[2]) : 8;
  if (secs <= 0 || rounds < 1 || rounds > 64) {
    fprintf(stderr, "usage: %s [seconds per run (0.5)] [rounds (8), 1..64]\n", argv[0]);
    return 2;
  }
  g = mmap(NULL, sizeof *g, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g == MAP_FAILED || fz_registry_init_shared(256) != FZ_OK) {
    fprintf(stderr, "procs: no shared registry\n");
    return 1;
  }
  fz_config c;
  memset(&c, 0, sizeof c);
  c.window = 10, c.open_for = 10, c.max_open_for = 10, c.probe_timeout = 10, c.backoff = 1;
  c.fails = 5, c.min_calls = 10, c.probes = 1;
  printf("fz_enter + fz_done(FZ_SUCCESS), processes forked after fz_registry_init_shared on one "
         "breaker (fails 5), %.2f s a run, %ld online CPUs\n", secs, sysconf(_SC_NPROCESSORS_ONLN));
  double one[64], two[64], ratio[64];
  for (int r = 0; r < rounds; r++) {
    char name[32];
    int st;
    snprintf(name, sizeof name, "procs-%d", r);
    fz_breaker *b = fz_registry_open(name, strlen(name), &c, &st);
    if (!b) {
      fprintf(stderr, "procs: fz_registry_open(%s): %d\n", name, st);
      return 1;
    }
    one[r] = run(b, 1, secs), two[r] = run(b, 2, secs);
    if (one[r] == 0 || two[r] == 0) {
      fprintf(stderr, "procs: a process failed\n");
      return 1;
    }
    ratio[r] = two[r] / one[r];
    printf("round %d: 1 process %7.1f M calls/s, 2 processes %7.1f (%.1f + %.1f): %.2fx\n", r + 1,
           one[r] / 1e6, two[r] / 1e6, g->rate[0] / 1e6, g->rate[1] / 1e6, ratio[r]);
  }
  qsort(one, (size_t)rounds, sizeof one[0], cmp);
  qsort(two, (size_t)rounds, sizeof two[0], cmp);
  qsort(ratio, (size_t)rounds, sizeof ratio[0], cmp);
  printf("median of %d rounds: 1 process %.1f M calls/s, 2 processes %.1f; 2 against 1 %.2fx "
         "(lowest round %.2fx)\n", rounds, one[rounds / 2] / 1e6, two[rounds / 2] / 1e6,
         ratio[rounds / 2], ratio[0]);
  return 0;
}

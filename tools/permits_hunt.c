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
 *
 * HUNT_PROCS=1: the same across processes (the case fixed in ae807b2). Each round, on a
 * shared registry, two processes of two threads each on one breaker of max_concurrent
 * 3, the count in shared memory. The first process goes through the history that left
 * a CPU unmarked for it when it registered at its first call (test/fence_cpus.c): it
 * runs on CPU 1, makes its first call on CPU 0 while CPU 1 idles, and its threads then
 * run on CPU 1; the second's threads run on CPU 0 and take the first's spare permits.
 * With the registration at the first call (before ae807b2), ASan build, alone: 1 of
 * 4,000 rounds past the limit, and that one 2,046 times (4 inside a limit of 3: the
 * race again and again while the CPU stayed unmarked, as a pass lasts only while the
 * call it took the permit from runs; docs/isolation.md, step 2); with the registration
 * inherited from the registry's maker, none of 4,000. (A first draft of this mode: 3 of
 * 4,300 before, none of 3,000 after.) The rate is too low for that alone to prove the
 * fix; test/fence_cpus.c shows the barrier reaching the CPU, or not, every time.
 */
#include "../csrc/fz.h"
#define FZ_BREAKER_WORDS
#include "../csrc/fz_internal.h"  /* permits_of: the words shown when the limit is passed */
#include "../csrc/fz_permits.h"
#include "permit_words.h"
#include "permit_hammer.h"
#include "tap.h"
#include "harness.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { NTHREADS = 8, LIMIT = 5, PROC_LIMIT = 3, PROC_THREADS = 2 };

static fz_breaker *g_b;
static long g_iters;
static int g_limit = LIMIT, g_cpu = -1;  /* g_cpu: the CPU the threads pin to, if any */
static hammer_counts g_local, *g_c = &g_local;  /* in shared memory with HUNT_PROCS=1 */

/* The permit words (test/permit_words.h), once a round. */
static void show_err(const char *words) { fprintf(stderr, "%s\n", words); }

static void *hammer(void *arg) {
  (void)arg;
  if (g_cpu >= 0) pin_cpu(g_cpu);
  hammer_job j = { g_b, g_iters, g_limit, 64, g_c, show_err };
  hammer_run(&j, NULL);
  return NULL;
}

/* n threads of hammer, waited for: 0, or 2 when one could not start. */
static int hammers(int n) {
  pthread_t th[NTHREADS];
  for (int i = 0; i < n; i++)
    if (pthread_create(&th[i], NULL, hammer, NULL)) return 2;
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  return 0;
}

/* HUNT_PROCS=1: a process of the round; the first (history) on CPU 1 after the history. */
static void proc(int history) {
  if (history) idle_cpu(1, 0);
  if (fz_permit_take(g_b, 1)) fz_permit_give(g_b);  /* the first call */
  g_cpu = history ? 1 : 0;
  _exit(hammers(PROC_THREADS));
}

static int procs_round(long k) {
  char name[32];
  snprintf(name, sizeof name, "hunt-%ld", k);
  fz_config c = limit_config(PROC_LIMIT);
  int st;
  g_b = fz_registry_open(name, strlen(name), &c, &st);
  if (!g_b) return 2;
  fflush(stdout), fflush(stderr);
  pid_t first = fork();
  if (first == 0) proc(1);
  pid_t second = fork();
  if (second == 0) proc(0);
  int s1 = 0, s2 = 0;
  waitpid(first, &s1, 0), waitpid(second, &s2, 0);
  fz_registry_remove(name, strlen(name));
  return WIFEXITED(s1) && WIFEXITED(s2) && !WEXITSTATUS(s1) && !WEXITSTATUS(s2) ? 0 : 2;
}

int main(void) {
  const char *r = getenv("HUNT_ROUNDS"), *it = getenv("HUNT_ITERS"), *pr = getenv("HUNT_PROCS");
  long rounds = r ? atol(r) : 100, bad = 0;
  int procs = pr && *pr == '1';
  g_iters = it ? atol(it) : procs ? 300000 : 100000;
  if (procs) {
    g_limit = PROC_LIMIT;
    g_c = mmap(NULL, sizeof *g_c, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_c == MAP_FAILED || !pin_cpu(0) || fz_registry_init_shared(64) != FZ_OK) return 2;
  }
  for (long k = 0; k < rounds; k++) {
    memset(g_c, 0, sizeof *g_c);
    if (procs) {
      if (procs_round(k)) return 2;
    } else {
      fz_config c = limit_config(LIMIT);
      g_b = fz_breaker_new(&c, NULL);
      if (!g_b || hammers(NTHREADS)) return 2;
      fz_breaker_free(g_b);
    }
    if (g_c->over) {
      bad++;
      fprintf(stderr, "round %ld: %d entries past the limit, %d inside at most\n", k, g_c->over, g_c->max);
    }
  }
  if (procs)
    printf("%ld rounds, %ld past the limit of %d (2 processes of %d threads, %ld takes each)\n", rounds, bad,
           PROC_LIMIT, PROC_THREADS, g_iters);
  else
    printf("%ld rounds, %ld past the limit of %d (%d threads, %ld takes each)\n", rounds, bad, LIMIT, NTHREADS, g_iters);
  return bad ? 1 : 0;
}

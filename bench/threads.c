/*
 * bench/threads.c -- how the C core's call path scales across threads.
 *
 * One breaker; T threads (1, then 2, ... up to max_threads) each loop
 *     ticket = fz_enter(b); fz_done(b, ticket, FZ_SUCCESS, -1.0);
 * for a fixed duration, then we report calls/s per thread and in total, and how the
 * total with T threads compares with the total with one thread (ideal: T).
 *
 * Variants, each on a fresh breaker:
 *   fails          the default rule: window 10 s, fails 5, probes 1, open_for 10
 *   failure_rate   failure_rate 0.5, min_calls 10 (a rate rule: successes are counted
 *                  in the time window and the window's bucket is found on the call path)
 *   count_window   count_window 100, fails 5: every call takes the next slot of one
 *                  ring, so all threads contend on one counter. This one is expected to
 *                  scale badly; it is measured so that the cost is known, not hidden.
 *   max_concurrent `fails` with max_concurrent 1000: each call takes a permit and
 *                  enters (fz_enter_limit: one compare-and-swap on the breaker's permit
 *                  word, which every thread shares: the cost of one limit for all) and
 *                  gives it back as it is done (fz_done_limit: a store to its own lane)
 *   open           the same breaker as `fails` driven open by 5 failures, open_for
 *                  86400: every call is rejected (reads the coarse clock, counts the
 *                  rejection), no fz_done.
 *
 * Two columns tell a busy machine from a slow breaker: on-CPU, the threads' CPU time over
 * their wall time (under 100% means the threads were descheduled: the scaling figure is
 * then not about fuse), and steal, the share of all CPUs' time the hypervisor gave to
 * other guests during the run (/proc/stat).
 *
 * After each run the breaker's totals must equal the calls the threads counted (checked;
 * the program fails otherwise), and the breaker must still be in the state under test.
 *
 * usage: threads [seconds per run (1.0)] [max threads (2)]
 * build and run: make bench (builds build/bench_threads, linked with build/libfzcore.a,
 * the core's objects, then runs it with the defaults)
 */
#define _POSIX_C_SOURCE 200809L

#include "fz.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 64
#define BATCH 256 /* calls between two looks at the stop flag */

typedef struct variant {
  const char *name;
  fz_config cfg;
  int open;     /* drive it open before the run: every call is then rejected */
} variant;

typedef struct worker {
  pthread_t tid;
  fz_breaker *b;
  int expect_admit;
  int permits;  /* take and give a permit around each call (max_concurrent) */
  uint64_t admitted, rejected, wrong;
  double secs, cpu;  /* wall time and this thread's CPU time over the run */
  char pad[64];
} worker;

static int g_stop;           /* set by main when the run is over; read relaxed */
static int g_ready;          /* workers that reached the start line */
static int g_go;             /* set by main once every worker is ready */

static double clock_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double now_s(void) { return clock_s(CLOCK_MONOTONIC); }

/* Steal and total jiffies of all CPUs from /proc/stat (time the hypervisor gave our
 * virtual CPUs to someone else); 0 and 0 where there is no such file. */
static void steal_read(double *steal, double *total) {
  unsigned long long v[8] = {0};
  *steal = *total = 0;
  FILE *f = fopen("/proc/stat", "r");
  if (!f) return;
  if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
             &v[4], &v[5], &v[6], &v[7]) == 8) {
    for (int i = 0; i < 8; i++) *total += (double)v[i];
    *steal = (double)v[7];
  }
  fclose(f);
}

static fz_config defaults(void) {
  fz_config c;
  memset(&c, 0, sizeof c);
  c.window = 10;
  c.open_for = 10;
  c.max_open_for = 320;
  c.probe_timeout = 10;
  c.backoff = 1;
  c.fails = 5;
  c.min_calls = 10;
  c.probes = 1;
  return c;
}

static void *work(void *arg) {
  worker *w = arg;
  fz_breaker *b = w->b;
  uint64_t admitted = 0, rejected = 0, wrong = 0;
  __atomic_add_fetch(&g_ready, 1, __ATOMIC_ACQ_REL);
  while (!__atomic_load_n(&g_go, __ATOMIC_ACQUIRE)) { /* spin: start together */ }
  double t0 = now_s(), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
  while (!__atomic_load_n(&g_stop, __ATOMIC_RELAXED)) {
    for (int k = 0; k < BATCH; k++) {
      if (w->permits) {
        double t = fz_enter_limit(b, fz_breaker_id(b), 1);
        if (t > 0) {
          if (fz_done_limit(b, t, FZ_SUCCESS, -1.0) < 0) wrong++;
          admitted++;
        } else {
          if (!wrong) fprintf(stderr, "threads: fz_enter_limit answered %g\n", t);
          wrong++;  /* never: 1000 permits for at most MAX_THREADS threads, a closed circuit */
        }
        continue;
      }
      double t = fz_enter(b);
      if (t > 0) {
        if (fz_done(b, t, FZ_SUCCESS, -1.0) < 0) wrong++;
        admitted++;
      } else {
        rejected++;
      }
    }
  }
  w->secs = now_s() - t0;
  w->cpu = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
  w->admitted = admitted;
  w->rejected = rejected;
  w->wrong = wrong;
  return NULL;
}

static void sleep_s(double s) {
  struct timespec ts;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
  while (nanosleep(&ts, &ts) != 0) { /* interrupted: sleep the rest */ }
}

static fz_breaker *make(const variant *v) {
  int err = 0;
  fz_breaker *b = fz_breaker_new(&v->cfg, &err);
  if (!b) {
    fprintf(stderr, "threads: fz_breaker_new(%s): %s\n", v->name, fz_strerror(err));
    exit(1);
  }
  if (v->open) {
    for (uint32_t i = 0; i < v->cfg.fails; i++) fz_done(b, fz_enter(b), FZ_FAILURE, -1.0);
    if ((fz_state(b) & 255) != FZ_OPEN) {
      fprintf(stderr, "threads: %s: could not drive the breaker open\n", v->name);
      exit(1);
    }
  }
  return b;
}

static double median3(const double *v) {
  double a = v[0], b = v[1], c = v[2];
  if (a > b) { double t = a; a = b; b = t; }
  if (b > c) b = c;
  return a > b ? a : b;
}

/* Runs one variant with n threads; returns total calls/s. */
static double run(const variant *v, int n, double secs, double base) {
  fz_breaker *b = make(v);
  fz_stats before, after;
  fz_stats_read(b, &before);
  worker *ws = calloc((size_t)n, sizeof *ws);
  if (!ws) { perror("calloc"); exit(1); }
  __atomic_store_n(&g_stop, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&g_ready, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&g_go, 0, __ATOMIC_RELEASE);
  for (int i = 0; i < n; i++) {
    ws[i].b = b;
    ws[i].permits = v->cfg.max_concurrent > 0;
    if (pthread_create(&ws[i].tid, NULL, work, &ws[i]) != 0) { perror("pthread_create"); exit(1); }
  }
  while (__atomic_load_n(&g_ready, __ATOMIC_ACQUIRE) < n) { /* wait for the start line */ }
  double st0, tot0, st1, tot1;
  steal_read(&st0, &tot0);
  __atomic_store_n(&g_go, 1, __ATOMIC_RELEASE);
  sleep_s(secs);
  __atomic_store_n(&g_stop, 1, __ATOMIC_RELAXED);
  uint64_t admitted = 0, rejected = 0, wrong = 0;
  double total = 0, cpu = 0, wall = 0;
  char each[256] = "";
  size_t len = 0;
  for (int i = 0; i < n; i++) {
    pthread_join(ws[i].tid, NULL);
    uint64_t calls = ws[i].admitted + ws[i].rejected;
    double rate = (double)calls / ws[i].secs;
    total += rate;
    cpu += ws[i].cpu;
    wall += ws[i].secs;
    admitted += ws[i].admitted;
    rejected += ws[i].rejected;
    wrong += ws[i].wrong;
    if (len < sizeof each - 16)
      len += (size_t)snprintf(each + len, sizeof each - len, "%s%.1f", i ? " " : "", rate / 1e6);
  }
  steal_read(&st1, &tot1);
  fz_stats_read(b, &after);
  uint64_t succ = after.successes_total - before.successes_total;
  uint64_t rej = after.rejections_total - before.rejections_total;
  int want = v->open ? FZ_OPEN : FZ_CLOSED;
  if (wrong || succ != admitted || rej != rejected || after.state != want ||
      (v->open ? admitted != 0 : rejected != 0)) {
    fprintf(stderr,
            "threads: %s, %d threads: breaker disagrees with the workers: successes_total +%llu "
            "vs %llu admitted, rejections_total +%llu vs %llu rejected, %llu fz_done errors, "
            "state %d (want %d)\n",
            v->name, n, (unsigned long long)succ, (unsigned long long)admitted,
            (unsigned long long)rej, (unsigned long long)rejected, (unsigned long long)wrong,
            after.state, want);
    exit(1);
  }
  double per = total / n;
  printf("%-13s %7d  %-17s %11.1f %10.1f %12.1f %9.2f %7.0f%% %6.1f%%\n", v->name, n, each,
         per / 1e6, total / 1e6, 1e9 / per, base > 0 ? total / base : 1.0, 100 * cpu / wall,
         tot1 > tot0 ? 100 * (st1 - st0) / (tot1 - tot0) : 0.0);
  fflush(stdout);
  fz_breaker_free(b);
  free(ws);
  return total;
}

int main(int argc, char **argv) {
  double secs = argc > 1 ? atof(argv[1]) : 1.0;
  int maxt = argc > 2 ? atoi(argv[2]) : 2;
  if (!(secs > 0) || maxt < 1 || maxt > MAX_THREADS) {
    fprintf(stderr, "usage: %s [seconds per run (1.0)] [max threads (2), 1..%d]\n", argv[0],
            MAX_THREADS);
    return 2;
  }
  if (fz_abi_version() != FZ_ABI_VERSION) {
    fprintf(stderr, "threads: library ABI %d, header ABI %d\n", fz_abi_version(), FZ_ABI_VERSION);
    return 1;
  }
  variant vs[5];
  vs[0] = (variant){"fails", defaults(), 0};
  vs[1] = (variant){"failure_rate", defaults(), 0};
  vs[1].cfg.fails = 0;
  vs[1].cfg.failure_rate = 0.5;
  vs[2] = (variant){"count_window", defaults(), 0};
  vs[2].cfg.count_window = 100;
  vs[3] = (variant){"open", defaults(), 1};
  vs[3].cfg.open_for = 86400;
  vs[3].cfg.max_open_for = 86400;
  vs[4] = (variant){"max_concurrent", defaults(), 0};
  vs[4].cfg.max_concurrent = 1000;

  long cpus = 0;
#ifdef _SC_NPROCESSORS_ONLN
  cpus = sysconf(_SC_NPROCESSORS_ONLN);
#endif
  printf("fz_enter + fz_done(FZ_SUCCESS) on one breaker, %.2f s per run, %ld online CPUs\n", secs,
         cpus);
  printf("%-13s %7s  %-17s %11s %10s %12s %9s %8s %7s\n", "variant", "threads",
         "M calls/s each", "M/s/thread", "M/s total", "ns/call/thr", "vs 1 thr", "on-CPU",
         "steal");
  /* Each variant runs REPS rounds, 1 thread then 2 (and so on) within a round, so that a
   * slow spell of this shared machine hits both sides alike; the summary compares the
   * medians of the rounds. */
  enum { REPS = 3, NV = sizeof vs / sizeof vs[0] };
  double totals[NV][MAX_THREADS + 1][REPS];
  for (size_t i = 0; i < NV; i++) {
    for (int r = 0; r < REPS; r++) {
      double base = 0;
      for (int n = 1; n <= maxt; n++) {
        totals[i][n][r] = run(&vs[i], n, secs, base);
        if (n == 1) base = totals[i][n][r];
      }
    }
  }
  printf("\nmedian of %d rounds (M calls/s in all, and 2 threads against 1):\n", REPS);
  for (size_t i = 0; i < NV; i++) {
    printf("%-13s", vs[i].name);
    double one = median3(totals[i][1]);
    for (int n = 1; n <= maxt; n++) {
      double m = median3(totals[i][n]);
      printf("  %d thr %7.1f", n, m / 1e6);
      if (n > 1) printf(" (%.2fx)", m / one);
    }
    printf("\n");
  }
  return 0;
}

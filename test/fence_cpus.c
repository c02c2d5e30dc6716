/*
 * fence_cpus.c -- max_concurrent across processes: the global barrier a taker of spare
 * permits sends reaches a worker on every CPU, however the worker moved between CPUs
 * before its first call.
 *
 * The kernel sends the global expedited membarrier only to CPUs whose runqueue is marked
 * as running a registered process. It marks a CPU when it switches to the process from
 * another process's memory, and at registration only the CPUs then running it (only the
 * caller's CPU when the process has one thread). A CPU that ran a worker, went idle still
 * holding the worker's memory, and runs the worker again after it registered, switches
 * from the worker's memory to the worker's memory: it stays unmarked, and another
 * worker's barrier skips it (the worker's call then does not pass the barrier the permit
 * protocol relies on: docs/isolation.md). A worker registered before it ever ran (forked
 * from the process that made the shared registry, registered there) cannot be caught so.
 *
 * The test forces that history: a worker forked after fz_registry_init_shared runs on
 * CPU b, moves to CPU a while b idles, makes its first call there, and moves back to b.
 * Then this process (as another worker, on a) sends global barriers in windows while the
 * worker spins on b, and counts the function-call interrupts CPU b received
 * (/proc/interrupts, CAL). A window counts when the worker stayed on b through it
 * without a context switch: then every barrier must have interrupted b. Without the
 * registration in fz_registry_init_shared, b received none (alone on the machine).
 * A busy machine refreshes the marks (other processes run on b), so it can hide a
 * regression but never fail a correct build; windows the worker did not hold b through
 * are left out, and the test skips when no window could be counted.
 */

#include "../csrc/fz.h"
#include "tap.h"

#include <errno.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { BARRIERS = 100, WINDOWS = 400, CLEAN_WANTED = 5 };

/* What the worker and this process say to each other (a shared page). */
typedef struct {
  int ready, inherited, cpu_ok;  /* the worker: on b, after its history */
  int cmd, ack;                   /* window w: cmd 2w+1 starts it, 2w+2 ends it; ack echoes */
  int clean;                      /* the last window: the worker held b through it */
  int quit;
} ctl_t;

static long membarrier(int cmd) { return syscall(SYS_membarrier, cmd, 0, 0); }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  return sched_setaffinity(0, sizeof s, &s) == 0 && (sched_yield(), sched_getcpu() == cpu);
}

static void spin_for(double s) {
  double until = now_s() + s;
  while (now_s() < until) {}
}

/* The column of CPU cpu in /proc/interrupts (its header names the online CPUs), or -1. */
static int cal_column(int cpu) {
  FILE *f = fopen("/proc/interrupts", "r");
  if (!f) return -1;
  char line[8192], want[32];
  int col = -1, i = 0;
  snprintf(want, sizeof want, "CPU%d", cpu);
  if (fgets(line, sizeof line, f))
    for (char *t = strtok(line, " \t\n"); t; t = strtok(NULL, " \t\n"), i++)
      if (!strcmp(t, want)) col = i;
  fclose(f);
  return col;
}

/* The function-call interrupts the CPU of that column received so far, or -1. */
static long cal_count(int col) {
  FILE *f = fopen("/proc/interrupts", "r");
  if (!f) return -1;
  char line[8192];
  long v = -1;
  while (fgets(line, sizeof line, f)) {
    char *p = line + strspn(line, " ");
    if (strncmp(p, "CAL:", 4)) continue;
    p += 4;
    for (int i = 0; i <= col; i++) {
      char *e;
      v = strtol(p, &e, 10);
      if (e == p) v = -1;
      p = e;
    }
    break;
  }
  fclose(f);
  return v;
}

static long switches(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_nvcsw + u.ru_nivcsw;
}

static int get(int *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static void put(int *p, int v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

/* Waits (bounded) until *p == v. */
static int await(int *p, int v, double timeout) {
  double until = now_s() + timeout;
  while (get(p) != v)
    if (now_s() > until) return 0;
  return 1;
}

static void worker(ctl_t *c, fz_breaker *b, int cpu_a, int cpu_b) {
  /* Registered already? A process that is not gets EPERM for the private barrier. */
  put(&c->inherited, membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0 ? 1 : -1);
  int ok_b = pin(cpu_b);
  spin_for(0.03);                       /* b runs the worker ... */
  int ok_a = pin(cpu_a);
  struct timespec nap = { 0, 1000000 };
  nanosleep(&nap, NULL);                /* ... and idles, still holding its memory */
  if (fz_permit_take(b, 1)) fz_permit_give(b);  /* the first call: registers, if not yet */
  ok_b = ok_b && ok_a && pin(cpu_b);    /* b runs it again, from its own memory */
  put(&c->cpu_ok, ok_b ? 1 : -1);
  put(&c->ready, 1);
  for (int w = 0; !get(&c->quit);) {
    int cmd = get(&c->cmd);
    if (cmd == 2 * w + 1) {
      long s0 = switches();
      int at0 = sched_getcpu();
      put(&c->ack, cmd);
      while (get(&c->cmd) == cmd && !get(&c->quit)) {}
      put(&c->clean, switches() == s0 && at0 == cpu_b && sched_getcpu() == cpu_b);
      put(&c->ack, 2 * w + 2);
      w++;
    }
  }
  _exit(0);
}

int main(void) {
  const char *no = getenv("FUSE_PERMITS_NOFENCE");
  if (no && *no && *no != '0') {
    ok(1, "# SKIP FUSE_PERMITS_NOFENCE is set: no barrier");
    return done_testing();
  }
  long q = membarrier(MEMBARRIER_CMD_QUERY);
  if (q <= 0 || !(q & MEMBARRIER_CMD_GLOBAL_EXPEDITED)) {
    ok(1, "# SKIP the kernel has no global expedited membarrier");
    return done_testing();
  }
  cpu_set_t mine;
  int cpus[2], n = 0;
  if (sched_getaffinity(0, sizeof mine, &mine) == 0)
    for (int i = 0; i < CPU_SETSIZE && n < 2; i++)
      if (CPU_ISSET(i, &mine)) cpus[n++] = i;
  if (n < 2) {
    ok(1, "# SKIP one CPU: nothing to reach");
    return done_testing();
  }
  int cpu_a = cpus[0], cpu_b = cpus[1], col = cal_column(cpu_b);
  if (col < 0 || cal_count(col) < 0) {
    ok(1, "# SKIP /proc/interrupts has no CAL count for CPU %d", cpu_b);
    return done_testing();
  }
  if (!pin(cpu_a)) {
    ok(1, "# SKIP cannot pin to CPU %d", cpu_a);
    return done_testing();
  }

  /* This process made the shared registry (nginx's master in init_by_lua) and took no
   * permit: whatever registered it, the registry's making did. */
  is_int(fz_registry_init_shared(64), FZ_OK, "a shared registry");
  fz_config cf;
  memset(&cf, 0, sizeof cf);
  cf.window = 10, cf.open_for = 10, cf.max_open_for = 10, cf.probe_timeout = 10;
  cf.backoff = 1, cf.fails = 5, cf.min_calls = 10, cf.probes = 1, cf.max_concurrent = 5;
  int st;
  fz_breaker *b = fz_registry_open("fence-cpus", strlen("fence-cpus"), &cf, &st);
  if (!ok(b != NULL, "a shared breaker with max_concurrent 5")) return done_testing();

  ctl_t *c = mmap(NULL, sizeof *c, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (c == MAP_FAILED) abort();
  memset(c, 0, sizeof *c);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) worker(c, b, cpu_a, cpu_b);
  ok(await(&c->ready, 1, 10), "the worker ran on CPU %d, idled it, called on CPU %d, came back", cpu_b, cpu_a);
  is_int(get(&c->inherited), 1, "the worker was registered for the barriers before its first call (from the registry's maker)");
  if (get(&c->cpu_ok) != 1) diag("the worker could not be pinned as planned: the history may not have been forced");

  int clean = 0, short_of = 0, w;
  long worst = -1;
  for (w = 0; w < WINDOWS && clean < CLEAN_WANTED; w++) {
    put(&c->cmd, 2 * w + 1);
    if (!await(&c->ack, 2 * w + 1, 10)) break;
    long c0 = cal_count(col);
    for (int i = 0; i < BARRIERS; i++) membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED);
    long c1 = cal_count(col);
    put(&c->cmd, 2 * w + 2);
    if (!await(&c->ack, 2 * w + 2, 10)) break;
    if (!get(&c->clean)) continue;
    clean++;
    if (worst < 0 || c1 - c0 < worst) worst = c1 - c0;
    if (c1 - c0 < BARRIERS * 9 / 10) short_of++;
  }
  put(&c->quit, 1);
  int status = 0;
  waitpid(pid, &status, 0);
  diag("%d windows, %d with the worker on CPU %d throughout; the fewest interrupts in one: %ld for %d barriers",
       w, clean, cpu_b, worst, BARRIERS);
  if (clean == 0)
    ok(1, "# SKIP the worker never held CPU %d through a window (a busy machine)", cpu_b);
  else
    is_int(short_of, 0, "every window the worker held CPU %d through, each of %d barriers interrupted it (%d windows)",
           cpu_b, BARRIERS, clean);
  ok(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the worker exited");
  return done_testing();
}

/*
 * permits.c -- max_concurrent: never more than K calls inside, counted by the test
 * itself, with threads hammering one breaker (also under TSan and ASan); permits given
 * back on other threads; an exited thread's lane; a process that dies holding permits
 * has them taken back by a survivor when the limit is reached (fork, shared registry);
 * more threads than lanes; a thread's first take on a breaker; the counts' wrap at 2^24.
 */
#include "../csrc/fz.h"
#define FZ_BREAKER_WORDS
#include "../csrc/fz_internal.h"  /* permits_of: the words shown when the limit is passed */
#include "../csrc/fz_permits.h"   /* fzp_took, fzp_move, fzp_self */
#include "tap.h"
#include "harness.h"
#include "permit_words.h"
#include "permit_hammer.h"

#include <pthread.h>
#include <stdio.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { K = 5, NTHREADS = 8 };

/* ---- threads hammer one breaker: the test counts who is inside */

static fz_breaker *g_b;
static hammer_counts g_counts;
static long g_iters;
static long g_taken[NTHREADS], g_full[NTHREADS];

/* The permit words as one diag line, the first time the test's own count passes the
 * limit: the evidence should a run ever fail. */
static void show_diag(const char *words) { diag("%s", words); }

static void *hammer(void *arg) {
  intptr_t me = (intptr_t)arg;
  hammer_job j = { g_b, g_iters, K, 0, &g_counts, show_diag };
  g_full[me] = hammer_run(&j, &g_taken[me]);
  return NULL;
}

static void threads_test(void) {
  fz_config c = limit_config(K);
  int err;
  g_b = fz_breaker_new(&c, &err);
  ok(g_b != NULL, "an anonymous breaker with max_concurrent %d", K);
  const char *env = getenv("STRESS_ITERS");
  g_iters = env ? atol(env) : 200000;
  pthread_t th[NTHREADS];
  threads_start(th, NTHREADS, hammer, 0);
  threads_join(th, NTHREADS);
  long taken = 0, full = 0;
  for (int i = 0; i < NTHREADS; i++) taken += g_taken[i], full += g_full[i];
  is_int(g_counts.over, 0, "%d threads, %ld tries each: never more than %d inside (the test's own count)",
         NTHREADS, g_iters, K);
  ok(g_counts.max <= K, "at most %d inside at once (seen %d)", K, g_counts.max);
  /* (how many overlapped depends on the scheduler: under a sanitizer on a busy machine
   * the threads may not overlap at all, so the number is shown, not required) */
  diag("%s", g_counts.max > 1 ? "the threads overlapped" : "no overlap seen");
  fz_stats s = peek(g_b);
  is_int((int)s.running, 0, "every permit given back: running 0");
  ok(s.full_total == (uint64_t)full, "full_total %llu = the rejections the threads saw (%ld)",
     (unsigned long long)s.full_total, full);
  ok(s.rejections_total == s.full_total, "rejections_total counts them");
  is_int(state(g_b), FZ_CLOSED, "full rejections do not move the circuit");
  diag("taken %ld, full %ld", taken, full);
  for (int i = 0; i < K; i++) fz_permit_take(g_b, 1);
  is_int(fz_permit_take(g_b, 1), 0, "the limit is whole: K taken, the next is refused");
  for (int i = 0; i < K; i++) fz_permit_give(g_b);
  is_int((int)peek(g_b).running, 0, "and back to 0");
  fz_breaker_free(g_b);
}

/* ---- a permit taken on one thread is given back on another */

static void *give_one(void *arg) {
  fz_permit_give(arg);
  return NULL;
}

static void *take_one(void *arg) {
  fz_permit_take(arg, 1);
  return NULL;
}

static void cross_thread_test(void) {
  fz_config c = limit_config(2);
  fz_breaker *b = fz_breaker_new(&c, NULL);
  ok(fz_permit_take(b, 1) && fz_permit_take(b, 1), "two taken on this thread");
  is_int(fz_permit_take(b, 1), 0, "a third is refused");
  in_thread(give_one, b);
  is_int((int)peek(b).running, 1, "one given back on another thread: running 1");
  ok(fz_permit_take(b, 1), "so one can be taken again");
  fz_permit_give(b), fz_permit_give(b);
  is_int((int)peek(b).running, 0, "running 0");
  /* threads that take and exit: their lanes, holding permits, stay counted (the
   * process lives: someone may give them back), and the lanes are reused */
  for (int i = 0; i < 60; i++) {
    in_thread(take_one, b);
    in_thread(give_one, b);
  }
  is_int((int)peek(b).running, 0, "60 threads took and 60 gave back, each then exiting: running 0");
  ok(fz_permit_take(b, 1) && fz_permit_take(b, 1) && !fz_permit_take(b, 1), "and the limit is whole");
  fz_permit_give(b), fz_permit_give(b);
  fz_breaker_free(b);
  fz_config none = limit_config(0);
  fz_breaker *u = fz_breaker_new(&none, NULL);
  ok(fz_permit_take(u, 1) == 1, "a breaker made without max_concurrent: take always succeeds");
  fz_permit_give(u);
  is_int((int)peek(u).running, 0, "and counts nothing");
  fz_breaker_free(u);
}

/* ---- processes: one dies holding permits, a survivor takes them back */

static fz_breaker *shared_breaker(const char *name, uint32_t limit) {
  fz_config c = limit_config(limit);
  int st;
  return fz_registry_open(name, strlen(name), &c, &st);
}

/* Takes as many permits as it can, within 2 s (the take-back of a dead process's
 * permits happens at most every 0.2 s); returns how many. */
static int take_all(fz_breaker *b, int want) {
  int n = 0;
  double until = now_s() + 2;
  while (n < want && now_s() < until) {
    if (fz_permit_take(b, 1)) n++;
    else {
      struct timespec ts = { 0, 10000000 };
      nanosleep(&ts, NULL);
    }
  }
  return n;
}

static void processes_test(void) {
  fz_breaker *b = shared_breaker("permits-procs", K);
  ok(b != NULL, "a shared breaker with max_concurrent %d", K);
  int pipefd[2];
  if (pipe(pipefd) != 0) abort();
  pid_t pid = fork();
  if (pid == 0) {
    for (int i = 0; i < 3; i++) fz_permit_take(b, 1);
    if (write(pipefd[1], "x", 1) != 1) _exit(1);
    pause();  /* killed holding 3 */
    _exit(0);
  }
  char x;
  ok(read(pipefd[0], &x, 1) == 1, "a child took 3 permits");
  is_int((int)peek(b).running, 3, "running 3 across processes");
  ok(fz_permit_take(b, 1) && fz_permit_take(b, 1), "the parent takes the other 2");
  is_int(fz_permit_take(b, 1), 0, "the limit is reached: refused");
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  is_int((int)peek(b).running, 2, "the child killed: running 2, the parent's (the child's 3 ended with it)");
  double t0 = now_s();
  int got = take_all(b, 3);
  is_int(got, 3, "the child killed with 3 permits: the parent takes 3 more");
  diag("taken back %.3f s after the kill", now_s() - t0);
  is_int(fz_permit_take(b, 1), 0, "and no more than K in all");
  for (int i = 0; i < K; i++) fz_permit_give(b);
  is_int((int)peek(b).running, 0, "running 0");
  close(pipefd[0]), close(pipefd[1]);
}

/* ---- lanes that keep spare permits and lanes that cannot (FZP_NS) share one limit */

/* This process's mode: a lane that keeps its permits between calls (membarrier
 * registered), unless FUSE_PERMITS_NOFENCE=1 (make check runs this file both ways). The
 * parent's lane keeps all K spare; a child that cannot be fenced (the variable set before
 * its first take) takes all K (from the parent's lane, through the barrier, which it may
 * issue unregistered), gives them back on its own lane, and exits; the parent takes all
 * K again. */
static void mixed_test(void) {
  const char *no = getenv("FUSE_PERMITS_NOFENCE");
  int want_nofence = no && *no && *no != '0';
  fz_breaker *b = shared_breaker("permits-mixed", K);
  ok(take_all(b, K) == K, "mixed: the parent takes all %d", K);
  for (int i = 0; i < K; i++) fz_permit_give(b);
  if (want_nofence) is_int((int)fzp_self.nofence, 1, "mixed: FUSE_PERMITS_NOFENCE=1: this process's lanes keep no spare");
  else diag("this process's lanes keep spare permits: %s", fzp_self.nofence ? "no (no membarrier)" : "yes");
  is_int((int)peek(b).running, 0, "mixed: running 0, the parent's lane keeping its permits");
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("FUSE_PERMITS_NOFENCE", "1", 1);
    int n = take_all(b, K), extra = fz_permit_take(b, 1);
    int nofence = (int)fzp_self.nofence;
    for (int i = 0; i < n + extra; i++) fz_permit_give(b);
    _exit(n == K && !extra && nofence ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ok(WIFEXITED(status) && WEXITSTATUS(status) == 0, "mixed: a child that cannot be fenced took all %d, not one more, and gave them back", K);
  ok(take_all(b, K) == K, "mixed: the parent takes all %d again", K);
  is_int(fz_permit_take(b, 1), 0, "mixed: and not one more");
  for (int i = 0; i < K; i++) fz_permit_give(b);
}

/* ---- a reload that changes the capacity copies the registry: the permits go along */

static void reload_test(void) {
  fz_breaker *b = shared_breaker("permits-reload", K);
  ok(fz_permit_take(b, 1) && fz_permit_take(b, 1), "two permits held before the copy");
  is_int(fz_registry_init(128, 1, 0), FZ_OK, "a reload with another capacity: a new registry, a copy of the breakers");
  fz_breaker *nb = fz_registry_find("permits-reload", strlen("permits-reload"));
  ok(nb != NULL && nb != b, "the breaker is in the new registry");
  is_int((int)peek(nb).running, 2, "its permit word, made again from the lanes: running 2");
  is_int(take_all(nb, K), K - 2, "so 3 more can be taken there, not 5");
  for (int i = 0; i < K; i++) fz_permit_give(nb);
  is_int((int)peek(nb).running, 0, "given back in the new registry (this thread's lane was copied): running 0");
  fz_permit_give(b), fz_permit_give(b);
  is_int((int)peek(b).running, 0, "and the old registry's breaker balances too");
}

/* ---- more threads than lanes */

static int g_parked_go;
static int g_got[64];

static void *take_and_park(void *arg) {
  intptr_t i = (intptr_t)arg;
  __atomic_store_n(&g_got[i], fz_permit_take(g_b, 1), __ATOMIC_SEQ_CST);
  while (!__atomic_load_n(&g_parked_go, __ATOMIC_ACQUIRE)) {
    struct timespec ts = { 0, 1000000 };
    nanosleep(&ts, NULL);
  }
  if (__atomic_load_n(&g_got[i], __ATOMIC_SEQ_CST)) fz_permit_give(g_b);
  return NULL;
}

static void lanes_test(void) {
  fz_config c = limit_config(1000);
  g_b = fz_breaker_new(&c, NULL);
  pthread_t th[50];
  for (intptr_t i = 0; i < 50; i++) thread_start(&th[i], take_and_park, (void *)i);
  int waited = 0;
  while (waited++ < 5000) {
    int n = 0;
    for (int i = 0; i < 50; i++) n += __atomic_load_n(&g_got[i], __ATOMIC_SEQ_CST);
    if ((int)peek(g_b).running == n && n >= 40) break;
    struct timespec ts = { 0, 1000000 };
    nanosleep(&ts, NULL);
  }
  int n = 0;
  for (int i = 0; i < 50; i++) n += __atomic_load_n(&g_got[i], __ATOMIC_SEQ_CST);
  is_int(n, 40, "50 threads holding permits at once: 40 (the lanes of a breaker) get one");
  __atomic_store_n(&g_parked_go, 1, __ATOMIC_RELEASE);
  threads_join(th, 50);
  is_int((int)peek(g_b).running, 0, "all given back");
  fz_breaker_free(g_b);
}

/* ---- a thread's first take on a breaker: on a lane it claimed */

static void *take_give(void *arg) {
  fz_breaker *b = arg;
  fz_permit_take(b, 1) ? fz_permit_give(b) : (void)0;
  return NULL;
}

/* A new thread knows neither its name nor its preferred lane (fzp_self's key is 1, which
 * no owner word matches): its first take claims a lane (whose gives a sum reads), and
 * never takes on a free lane it does not own. */
static void first_take_test(void) {
  fz_config c = limit_config(1);
  fz_breaker *b = fz_breaker_new(&c, NULL);
  in_thread(take_give, b);
  is_int((int)peek(b).running, 0, "a new thread's first take and give: running 0");
  ok(fz_permit_take(b, 1), "this thread takes the only permit (the new thread's give is summed)");
  is_int(fz_permit_take(b, 1), 0, "and not a second");
  fz_permit_give(b);
  fz_breaker_free(b);
  ok(fzp_self.key != 1 && fzp_self.key << 44 == 0, "this thread's key: its name shifted left 20 bits");
  ok(fzp_self.lane < FZP_LANES && fzp_self.bit == UINT64_C(1) << (24 + fzp_self.lane) &&
     fzp_self.off == offsetof(fzp, lane) + fzp_self.lane * sizeof(fzp_lane), "its preferred lane, bit and offset agree");
}

/* ---- the counts modulo 2^24: a take at the top of the count wraps it to 0 */

static void wrap_test(void) {
  uint64_t given = UINT64_C(0x123456) << FZP_GIVEN_SHIFT;
  uint64_t st = fzp_took(given | FZP_COUNT);
  ok(st == given, "a lane word's taken wraps from 2^24 - 1 to 0, bits 24-39 stay 0, given kept");
  is_int((int)(st & 1), 0, "and its parity flips (1 -> 0)");
  is_int((int)fzp_held(fzp_took(FZP_COUNT)), 0, "a lane that took 2^24 and gave 0 (mod 2^24) holds 0");
  uint64_t bits = fzp_bit(0) | fzp_bit(7) | fzp_bit(39);
  ok(fzp_move(bits | FZP_COUNT, fzp_bit(7)) == (fzp_bit(0) | fzp_bit(39)),
     "pw's count wraps from 2^24 - 1 to 0 without carrying into lane 0's bit; lane 7's bit flips");
  ok(fzp_move(bits | 5, fzp_bit(3)) == (bits | fzp_bit(3) | 6), "pw's count + 1, lane 3's bit set");
}

/* ---- a breaker that never took a permit: its permits are never read */

/* RssShmem of this process in kB (the shared registry's resident pages), or -1. */
static long rss_shmem_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "RssShmem: %ld", &kb) == 1) break;
  if (f) fclose(f);
  return kb;
}

/* Reading the stats of every breaker (a scrape) made each one's permits resident, a
 * page of the shared registry a breaker (400 MB at 100,000), though none was ever taken. */
static void cold_test(void) {
  enum { COLD = 2000 };
  if (!ok(fz_registry_init(4096, 1, 0) == FZ_OK, "a reload into a registry of 4096")) return;
  fz_config c = limit_config(0);
  static fz_breaker *bs[COLD];
  for (int i = 0; i < COLD; i++) {
    char name[32];
    int st;
    snprintf(name, sizeof name, "permits-cold-%d", i);
    bs[i] = fz_registry_open(name, strlen(name), &c, &st);
    if (!bs[i]) {
      ok(0, "breaker %s: %d", name, st);
      return;
    }
  }
  long before = rss_shmem_kb();
  uint32_t running = 0;
  for (int i = 0; i < COLD; i++) running += peek(bs[i]).running;
  long grown = rss_shmem_kb() - before;
  if (before < 0) {
    ok(1, "# SKIP no RssShmem in /proc/self/status");
  } else {
    ok(grown < COLD * 4 / 16, "the stats of %d breakers that never took a permit made %ld kB resident "
       "(their permits would be %d kB)", COLD, grown, COLD * 4);
  }
  is_int((int)running, 0, "and say none runs");
  fz_breaker *b = shared_breaker("permits-cold-limited", 3);
  ok(fz_permit_take(b, 1), "a breaker with max_concurrent takes a permit");
  is_int((int)peek(b).running, 1, "its stats read its permits: running 1");
  ok(fz_registry_remove("permits-cold-limited", strlen("permits-cold-limited")) == 1, "removed while the call runs");
  is_int((int)peek(b).running, 1, "its slot's permits still show the call (the slot keeps them)");
  fz_permit_give(b);
  is_int((int)peek(b).running, 0, "given back: running 0");
}

int main(void) {
  threads_test();
  cross_thread_test();
  first_take_test();
  wrap_test();
  if (!ok(fz_registry_init_shared(64) == FZ_OK, "a shared registry")) return done_testing();
  processes_test();
  mixed_test();
  reload_test();
  lanes_test();
  cold_test();
  return done_testing();
}

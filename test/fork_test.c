/*
 * fork_test.c -- the shared registry across processes, without nginx (prints TAP).
 *
 * fz_registry_init_shared() puts the registry in a MAP_SHARED anonymous mapping, so
 * children forked afterwards share every named breaker. This test checks what
 * DESIGN.md ("Sharing") promises for processes:
 *   1. counts from every process add up exactly (atomic adds in shared memory);
 *   2. exactly one process makes the closed -> open transition;
 *   3. at most `probes` probes are admitted at once across all processes;
 *   4. a process killed (SIGKILL) while it holds a probe does not wedge the circuit:
 *      after probe_timeout it re-opens, and later admits probes again.
 * The manual clock is per process, so part 4 uses short real timeouts.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fz.h"
#include "fz_internal.h"  /* fzi_thread_stripe */
#include "tap.h"
#include "harness.h"

enum { NCHILD = 4, K = 20000, K2 = 5000, NRACE = 8, RACE_TRIES = 2000 };

static void sleep_s(double s)
{
  struct timespec ts;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
    ;
}

/* Results the children hand back to the parent: a page of our own, shared too. */
struct board {
  volatile int go;          /* the parent sets it to start a race */
  int ready;                /* children waiting at the start line */
  int admitted;             /* probe tickets handed out across the children */
  int holders;              /* children that hold a probe and wait to be killed */
  int made_half_open;       /* calls that report making open -> half_open */
  int made_open;            /* fz_done results that made closed -> open */
  int entered;              /* admitted tickets */
  int rejected;             /* rejected tickets */
  int rejected_half_open;   /* rejections with state half_open */
  int bad;                  /* anything a child found wrong */
  int stripe[8];            /* part_stripes: each child's counter stripe */
};

static struct board *board;

static void add(int *p, int v) { __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static int get(int *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }

static fz_config base_config(void)
{
  fz_config c;
  memset(&c, 0, sizeof c);
  c.window = 60;
  c.open_for = 60;
  c.max_open_for = c.open_for * 32;
  c.probe_timeout = 60;
  c.backoff = 1;
  c.fails = 5;
  c.min_calls = 10;
  c.probes = 1;
  return c;
}

static fz_breaker *open_logged(const char *name, const fz_config *c)
{
  int status = 99;
  fz_breaker *b = fz_registry_open(name, strlen(name), c, &status);
  if (b == NULL || status != 1)
    diag("fz_registry_open(%s): %p status %d (%s)", name, (void *)b, status,
         fz_strerror(status));
  return b;
}

static int flag_of(double ticket) { return (long long)ticket % 2; }
static int rej_state(double ticket) { return (int)((-(long long)ticket - 1) / 4); }
static int rej_made(double ticket) { return (int)((-(long long)ticket - 1) % 4); }

/* Forks a child that runs fn(b) and never returns; it dies with the parent. */
static pid_t spawn(void (*fn)(fz_breaker *), fz_breaker *b)
{
  pid_t parent = getpid(), pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(1);
    fn(b);
    _exit(0);
  }
  if (pid < 0)
    diag("fork: %s", strerror(errno));
  return pid;
}

/* Waits for every pid; returns how many did not exit with status 0. */
static int reap(pid_t *pids, int n)
{
  int bad = 0;
  for (int i = 0; i < n; i++) {
    int st;
    if (waitpid(pids[i], &st, 0) != pids[i] || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
      bad++;
  }
  return bad;
}

static void start_line(void)
{
  add(&board->ready, 1);
  double deadline = now_s() + 10;
  while (!board->go && now_s() < deadline)
    ;
}

static void release_racers(int n)
{
  double deadline = now_s() + 10;
  while (get(&board->ready) < n && now_s() < deadline)
    sleep_s(0.001);
  board->go = 1;
}

/* Part 1: exact totals. */
static void count_child(fz_breaker *b)
{
  start_line();
  for (int i = 0; i < K + K2; i++) {
    double t = fz_enter(b);
    if (t <= 0 || kind_of(t) != 1) {
      add(&board->bad, 1);
      continue;
    }
    /* exactly K2 failures, spread evenly among the K successes */
    int outcome = (long)i * K2 / (K + K2) != (long)(i + 1) * K2 / (K + K2) ? FZ_FAILURE
                                                                          : FZ_SUCCESS;
    if (fz_done(b, t, outcome, -1) != 0)
      add(&board->bad, 1);
  }
  _exit(0);
}

static void part_counts(void)
{
  fz_config c = base_config();
  c.fails = FZ_MAX_FAILS;                     /* never trips: 4*K2 is far below */
  fz_breaker *b = open_logged("fork-count", &c);
  if (b == NULL) {
    ok(0, "counts: breaker created");
    return;
  }
  memset(board, 0, sizeof *board);
  pid_t pids[NCHILD];
  for (int i = 0; i < NCHILD; i++)
    pids[i] = spawn(count_child, b);
  release_racers(NCHILD);
  ok(reap(pids, NCHILD) == 0 && board->bad == 0, "counts: every child admitted and recorded");
  fz_stats s;
  fz_stats_read(b, &s);
  is_int(s.successes_total, NCHILD * K, "counts: successes_total == 4*K (%d)", NCHILD * K);
  is_int(s.failures_total, NCHILD * K2, "counts: failures_total == 4*K2 (%d)", NCHILD * K2);
  ok(s.calls == (uint32_t)NCHILD * (K + K2) && s.failures == (uint32_t)NCHILD * K2,
     "counts: window holds every call and failure (quiescent read)");
  ok(s.state == FZ_CLOSED && s.opens_total == 0 && s.rejections_total == 0,
     "counts: still closed, nothing rejected");
  diag("successes_total %llu failures_total %llu calls %u failures %u state %d bad %d",
       (unsigned long long)s.successes_total, (unsigned long long)s.failures_total,
       s.calls, s.failures, s.state, board->bad);

  /* The parent sees the same breaker through the registry. */
  ok(fz_registry_find("fork-count", 10) == b, "counts: registry_find in the parent");
}

/* Part 2: exactly one process trips the circuit. */
static void trip_child(fz_breaker *b)
{
  start_line();
  for (int i = 0; i < 1000; i++) {
    double t = fz_enter(b);
    if (t < 0) {
      add(&board->rejected, 1);
      continue;
    }
    add(&board->entered, 1);
    int r = fz_done(b, t, FZ_FAILURE, -1);
    if (r == 64 + FZ_CLOSED * 8 + FZ_OPEN)
      add(&board->made_open, 1);
    else if (r != 0)
      add(&board->bad, 1);
  }
  _exit(0);
}

static void part_trip(void)
{
  fz_config c = base_config();
  c.fails = 50;
  fz_breaker *b = open_logged("fork-trip", &c);
  if (b == NULL) {
    ok(0, "trip: breaker created");
    return;
  }
  memset(board, 0, sizeof *board);
  pid_t pids[NCHILD];
  for (int i = 0; i < NCHILD; i++)
    pids[i] = spawn(trip_child, b);
  release_racers(NCHILD);
  ok(reap(pids, NCHILD) == 0 && board->bad == 0, "trip: children ran, no odd fz_done result");
  fz_stats s;
  fz_stats_read(b, &s);
  is_int(board->made_open, 1, "trip: exactly one process made closed -> open");
  ok(s.state == FZ_OPEN && s.opens_total == 1, "trip: open, opens_total == 1");
  ok(s.failures_total >= c.fails && s.failures_total <= (uint64_t)board->entered,
     "trip: fails <= failures_total <= admitted calls (late outcomes ignored)");
  ok(s.rejections_total == (uint64_t)board->rejected,
     "trip: rejections_total == rejections seen by the children");
  diag("made_open %d opens_total %llu failures_total %llu rejections_total %llu "
       "entered %d rejected %d", board->made_open, (unsigned long long)s.opens_total,
       (unsigned long long)s.failures_total, (unsigned long long)s.rejections_total,
       board->entered, board->rejected);
}

/* Part 3 and 4: probe slots across processes; a dead probe holder. */
static void race_child(fz_breaker *b)
{
  int held = 0;
  start_line();
  for (int i = 0; i < RACE_TRIES && !held; i++) {  /* until this child holds a probe */
    double t = fz_enter(b);
    if (t > 0) {
      if (kind_of(t) != 2)
        add(&board->bad, 1);
      add(&board->admitted, 1);
      if (flag_of(t))
        add(&board->made_half_open, 1);
      held++;                        /* never reported: this child keeps the slot */
    } else {
      if (rej_made(t) == 1)
        add(&board->made_half_open, 1);
      if (rej_state(t) == FZ_HALF_OPEN)
        add(&board->rejected_half_open, 1);
      else if (rej_state(t) != FZ_OPEN)
        add(&board->bad, 1);
    }
  }
  if (held == 0)
    _exit(0);
  add(&board->holders, 1);
  sleep_s(10);                        /* the parent's SIGKILL comes long before */
  _exit(0);
}

static void probe_child(fz_breaker *b)
{
  double t = fz_enter(b);
  if (t <= 0 || kind_of(t) != 2)
    _exit(1);
  sleep_s(0.05);                      /* the parent takes the other slot meanwhile */
  fz_done(b, t, FZ_SUCCESS, -1);
  _exit(0);
}

static void part_probes(void)
{
  fz_config c = base_config();
  c.fails = 1;
  c.probes = 2;
  c.open_for = 0.5;
  c.max_open_for = c.open_for * 32;
  c.probe_timeout = 0.2;
  fz_breaker *b = open_logged("fork-probe", &c);
  if (b == NULL) {
    ok(0, "probes: breaker created");
    return;
  }
  double t = fz_enter(b);
  fz_done(b, t, FZ_FAILURE, -1);
  ok((fz_state(b) & 255) == FZ_OPEN, "probes: one failure opened the circuit");
  sleep_s(c.open_for + 0.05);         /* due for half-open: the first enter moves it */

  memset(board, 0, sizeof *board);
  pid_t pids[NRACE];
  for (int i = 0; i < NRACE; i++)
    pids[i] = spawn(race_child, b);
  double t_race = now_s();
  release_racers(NRACE);
  double deadline = now_s() + 5;      /* wait for non-holders to finish the race */
  int done_or_holding;
  do {
    sleep_s(0.005);
    done_or_holding = get(&board->holders);
    for (int i = 0; i < NRACE; i++)
      if (pids[i] > 0 && waitpid(pids[i], NULL, WNOHANG) == pids[i])
        pids[i] = -pids[i];
    for (int i = 0; i < NRACE; i++)
      if (pids[i] < 0)
        done_or_holding++;
  } while (done_or_holding < NRACE && now_s() < deadline);
  double race_time = now_s() - t_race;

  ok(board->admitted == (int)c.probes && board->holders == (int)c.probes,
     "probes: exactly `probes` (2) admitted across 8 processes, to 2 of them");
  is_int(board->made_half_open, 1, "probes: exactly one process made open -> half_open");
  ok(board->rejected_half_open > 0 && board->bad == 0,
     "probes: the others were rejected as half_open");
  diag("admitted %d holders %d made_half_open %d rejected_half_open %d bad %d race %.3fs",
       board->admitted, board->holders, board->made_half_open, board->rejected_half_open,
       board->bad, race_time);
  if (race_time > c.probe_timeout)
    diag("the race took longer than probe_timeout: results above may be off");

  /* Kill the holders while they hold their probes. */
  for (int i = 0; i < NRACE; i++)
    if (pids[i] > 0) {
      kill(pids[i], SIGKILL);
      waitpid(pids[i], NULL, 0);
    }
  int st = fz_state(b) & 255;
  if (now_s() - t_race < c.probe_timeout - 0.05) {
    double r = fz_enter(b);
    ok(st == FZ_HALF_OPEN && r < 0 && rej_state(r) == FZ_HALF_OPEN,
       "probes: dead holders still hold the slots before probe_timeout");
    diag("state %d, enter -> %.0f", st, r);
  } else {
    ok(1, "probes: # SKIP too slow to look before probe_timeout");
  }

  /* A racer that found a slot free stamped it before losing the claim (stamp_probe: a
   * later start wins), so a probe's start may be as late as the end of the race: the
   * timeout is looked for probe_timeout after that (a loaded machine stretches races). */
  sleep_s(race_time + c.probe_timeout + 0.05 - (now_s() - t_race));
  if (now_s() - t_race < c.probe_timeout + c.open_for - 0.1) {
    st = fz_state(b) & 255;
    ok(st == FZ_OPEN, "probes: after probe_timeout the circuit re-opened");
    diag("state %d at %.3fs after the race", st, now_s() - t_race);
  } else {
    ok(1, "probes: # SKIP too slow to look between probe_timeout and open_for");
  }

  fz_stats s;
  fz_stats_read(b, &s);
  is_int(s.opens_total, 2, "probes: opens_total == 2 (the trip and the probe timeout)");

  sleep_s(c.open_for + 0.05);
  pid_t kid = spawn(probe_child, b);
  sleep_s(0.01);
  double mine = fz_enter(b);
  int probe_ok = mine > 0 && kind_of(mine) == 2;
  int r = probe_ok ? fz_done(b, mine, FZ_SUCCESS, -1) : 0;
  int kid_bad = reap(&kid, 1);
  st = fz_state(b) & 255;
  ok(probe_ok && kid_bad == 0, "probes: after open_for, probes are admitted again (2 processes)");
  ok(st == FZ_CLOSED, "probes: two probe successes from two processes closed it");
  diag("parent ticket %.0f done %d, child status %d, state %d", mine, r, kid_bad, st);
}

/* 5. Processes forked from the registry's maker (nginx's workers) count on the stripes in
 * turn: 8 children, one after the other, each makes one call and says its stripe; each
 * is the one after the previous child's (mod 4), so 4 workers never share one. Before,
 * a stripe from the pid put two of 4 workers on one stripe in about 9 starts of 10, and
 * their every success moved one cache line between their CPUs (a tenth of the calls per
 * second, two processes on one breaker). */
static void part_stripes(void)
{
  fz_config c = base_config();
  fz_breaker *b = open_logged("fork-stripes", &c);
  if (b == NULL) {
    ok(0, "stripes: breaker created");
    return;
  }
  int failed = 0;
  for (int i = 0; i < 8; i++) {
    pid_t p = fork();
    if (p == 0) {
      double t = fz_enter(b);
      fz_done(b, t, FZ_SUCCESS, 0);
      board->stripe[i] = fzi_thread_stripe();
      _exit(0);
    }
    int st;
    if (p < 0 || waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st) != 0) failed = 1;
  }
  int turn = !failed;
  for (int i = 0; i < 8; i++) {
    if (board->stripe[i] < 0 || board->stripe[i] > 3) turn = 0;
    if (i > 0 && board->stripe[i] != (board->stripe[i - 1] + 1) % 4) turn = 0;
  }
  ok(turn, "stripes: 8 children forked after init_shared count on the stripes in turn "
     "(%d %d %d %d %d %d %d %d)", board->stripe[0], board->stripe[1], board->stripe[2],
     board->stripe[3], board->stripe[4], board->stripe[5], board->stripe[6], board->stripe[7]);
  fz_stats s;
  fz_stats_peek(b, &s);
  ok(s.successes_total == 8, "stripes: their 8 successes all counted (%llu)",
     (unsigned long long)s.successes_total);
}

int main(void)
{
  setvbuf(stdout, NULL, _IOLBF, 0);
  board = mmap(NULL, sizeof *board, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (board == MAP_FAILED) {
    printf("Bail out! mmap: %s\n", strerror(errno));
    return 1;
  }
  int rc = fz_registry_init_shared(16);
  ok(rc == FZ_OK && fz_registry_is_shared() && fz_registry_capacity() == 16,
     "fz_registry_init_shared(16)");
  if (rc != FZ_OK) {
    diag("fz_registry_init_shared: %d (%s)", rc, fz_strerror(rc));
    done_testing();
    return 1;
  }
  part_counts();
  ok(fz_registry_init_shared(16) == FZ_OK, "init_shared again, same capacity: FZ_OK");
  ok(fz_registry_init_shared(32) == FZ_EBUSY,
     "init_shared with another capacity once breakers exist: FZ_EBUSY");
  part_trip();
  part_probes();
  part_stripes();
  return done_testing();
}

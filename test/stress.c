/*
 * stress.c -- threads hammer one breaker; then the invariants are checked.
 *
 *  1. counting: no outcome or rejection is lost (totals and window counts are exact),
 *     and totals read concurrently never go down;
 *  2. transitions: every generation bump is reported to exactly one caller (the sum of
 *     transitions the callers were told about equals the final generation, and the
 *     opens among them equal opens_total), and no half-open generation ever runs
 *     more than `probes` probes at once.
 *
 * STRESS_ITERS (environment) sets the calls per thread; sanitizer runs use fewer.
 */
#include "../csrc/fz.h"
#include "tap.h"
#include "harness.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define THREADS 4
#define MAX_GENS (1u << 22)

static long iters = 1000000;
static fz_breaker *B;
static int stop_ticker, stop_reader;  /* set by main, read by the helper threads */
static uint32_t *inflight;   /* probes of each generation running now */
static int probes_over;      /* a generation ran more than probes probes at once */
static long gens_seen;       /* transitions the workers were told of, all threads */
/* Part 2 runs at least `iters` calls per thread and then on until MIN_GENS transitions
 * were seen (or STRESS_SECONDS passed): a loaded machine (CI, sanitizers) may run the
 * calls before the ticker has moved the clock through many open periods. */
#define MIN_GENS 41
#define STRESS_SECONDS 120

typedef struct result {
  long succ, fail, rej, transitions, opens;
} result;

static fz_config config(void) {
  fz_config c;
  memset(&c, 0, sizeof c);
  c.window = 86400, c.open_for = 0.001, c.max_open_for = 0.032, c.probe_timeout = 60;
  c.backoff = 1, c.fails = FZ_MAX_FAILS, c.min_calls = 10, c.probes = 2;
  return c;
}

static uint64_t rng(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}

static void note(result *r, int code) {
  if (code < 64) return;
  int to = (code - 64) % 8;
  __atomic_add_fetch(&gens_seen, 1, __ATOMIC_RELAXED);
  r->transitions++;
  r->opens += to == FZ_OPEN;
}

/* Part 1: a breaker that never trips; every thread mixes outcomes. */
static void *count_worker(void *arg) {
  result *r = arg;
  uint64_t s = (uint64_t)(uintptr_t)arg | 1;
  for (long i = 0; i < iters; i++) {
    double t = fz_enter(B);
    int fail = rng(&s) % 16 == 0;
    fz_done(B, t, fail ? FZ_FAILURE : FZ_SUCCESS, -1);
    if (fail) r->fail++; else r->succ++;
  }
  return NULL;
}

static void *reader(void *arg) {
  long *bad = arg;
  uint64_t last_s = 0, last_f = 0;
  while (!__atomic_load_n(&stop_reader, __ATOMIC_ACQUIRE)) {
    fz_stats st;
    fz_stats_read(B, &st);
    if (st.successes_total < last_s || st.failures_total < last_f) (*bad)++;
    last_s = st.successes_total, last_f = st.failures_total;
  }
  return NULL;
}

static void *reject_worker(void *arg) {
  result *r = arg;
  for (long i = 0; i < iters / 4; i++)
    if (fz_enter(B) < 0) r->rej++;
  return NULL;
}

/* Part 2: a breaker that trips at the 3rd failure and probes every millisecond. */
static void *ticker(void *arg) {
  (void)arg;
  double t = 1.0;
  struct timespec pause = { 0, 50000 };
  while (!__atomic_load_n(&stop_ticker, __ATOMIC_ACQUIRE)) {
    t += 0.0005;
    fz_clock_manual(t);
    nanosleep(&pause, NULL);
  }
  return NULL;
}

/* More calls wanted: fewer than `iters` made, or fewer than MIN_GENS transitions seen
 * (bounded by STRESS_SECONDS). */
static int more_calls(long i, double deadline) {
  if (i < iters) return 1;
  if (__atomic_load_n(&gens_seen, __ATOMIC_RELAXED) >= MIN_GENS) return 0;
  return (i & 1023) || now_s() < deadline;
}

static void *trip_worker(void *arg) {
  result *r = arg;
  uint64_t s = (uint64_t)(uintptr_t)arg | 1;
  double deadline = now_s() + STRESS_SECONDS;
  for (long i = 0; more_calls(i, deadline); i++) {
    double t = fz_enter(B);
    if (t < 0) {
      int made = (int)(-t - 1) % 4;
      if (made == 1) note(r, 64 + FZ_OPEN * 8 + FZ_HALF_OPEN);
      if (made == 2) note(r, 64 + FZ_HALF_OPEN * 8 + FZ_OPEN);
      continue;
    }
    uint64_t tk = (uint64_t)t, gen = tk >> 8 & 0xffffffff;
    int probe = (tk >> 1 & 3) == 2 && gen < MAX_GENS;
    if (probe && __atomic_add_fetch(&inflight[gen], 1, __ATOMIC_SEQ_CST) > 2)
      __atomic_store_n(&probes_over, 1, __ATOMIC_RELAXED);
    if (tk & 1) note(r, 64 + FZ_OPEN * 8 + FZ_HALF_OPEN);
    /* the slot is given back inside fz_done, so leave it before */
    int outcome = rng(&s) % 4 == 0 ? FZ_FAILURE : FZ_SUCCESS;
    if (probe) __atomic_sub_fetch(&inflight[gen], 1, __ATOMIC_SEQ_CST);
    note(r, fz_done(B, t, outcome, -1));
  }
  return NULL;
}

static void run_threads(void *(*fn)(void *), result *res) {
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, fn, &res[i]);
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
}

static void part_counting(void) {
  fz_config c = config();
  B = fz_breaker_new(&c, NULL);
  result res[THREADS];
  memset(res, 0, sizeof res);
  long bad_reads = 0;
  pthread_t rd;
  pthread_create(&rd, NULL, reader, &bad_reads);
  run_threads(count_worker, res);
  __atomic_store_n(&stop_reader, 1, __ATOMIC_RELEASE);
  pthread_join(rd, NULL);
  long succ = 0, fail = 0;
  for (int i = 0; i < THREADS; i++) succ += res[i].succ, fail += res[i].fail;
  fz_stats st;
  fz_stats_read(B, &st);
  is_int((long long)st.successes_total, succ, "no success lost: successes_total");
  is_int((long long)st.failures_total, fail, "no failure lost: failures_total");
  is_int(st.calls, succ + fail, "window calls exact");
  is_int(st.failures, fail, "window failures exact");
  is_int(bad_reads, 0, "totals read during the run never went down");
  is_int(st.state, FZ_CLOSED, "never tripped");

  fz_force_open(B);
  memset(res, 0, sizeof res);
  run_threads(reject_worker, res);
  long rej = 0;
  for (int i = 0; i < THREADS; i++) rej += res[i].rej;
  fz_stats_read(B, &st);
  is_int(rej, THREADS * (iters / 4), "forced_open rejected every call");
  is_int((long long)st.rejections_total, rej, "no rejection lost");
  fz_breaker_free(B);
}

static void part_transitions(void) {
  fz_config c = config();
  c.fails = 3, c.window = 1;
  inflight = calloc(MAX_GENS, sizeof *inflight);
  fz_clock_manual(1.0);
  B = fz_breaker_new(&c, NULL);
  pthread_t tk;
  pthread_create(&tk, NULL, ticker, NULL);
  result res[THREADS];
  memset(res, 0, sizeof res);
  run_threads(trip_worker, res);
  __atomic_store_n(&stop_ticker, 1, __ATOMIC_RELEASE);
  pthread_join(tk, NULL);
  long transitions = 0, opens = 0;
  for (int i = 0; i < THREADS; i++) transitions += res[i].transitions, opens += res[i].opens;
  fz_stats st;
  int made = fz_stats_read(B, &st);
  transitions += made >= 64;
  opens += made >= 64 && (made - 64) % 8 == FZ_OPEN;
  diag("%llu generations, %llu opens", (unsigned long long)st.generation, (unsigned long long)st.opens_total);
  ok(st.generation >= MIN_GENS, "the breaker cycled through many generations (%llu)", (unsigned long long)st.generation);
  is_int(transitions, (long long)st.generation, "each transition was made by exactly one caller");
  is_int(opens, (long long)st.opens_total, "each open was reported once");
  ok(st.generation < MAX_GENS, "generations fit the probe table");
  is_int(probes_over, 0, "no half-open generation ran more than probes probes at once");
  fz_breaker_free(B);
  free(inflight);
  fz_clock_auto();
}

/*
 * Part 3: the count window under two threads. With count_window = 2 and fails = 2 the
 * circuit may open only when two failures are adjacent in call order. The main thread
 * reports a failure, then waits until the other thread has recorded 3 successes after
 * it: no two failures are ever adjacent, so any open is wrong (it caught counts that
 * went below zero when an outcome was removed from the aggregate before it was added).
 */
static int stop_succ;
static uint64_t succ_done;

static void *cw_success_worker(void *arg) {
  (void)arg;
  while (!__atomic_load_n(&stop_succ, __ATOMIC_ACQUIRE)) {
    double t = fz_enter(B);
    if (t < 0) continue;
    fz_done(B, t, FZ_SUCCESS, -1);
    __atomic_add_fetch(&succ_done, 1, __ATOMIC_SEQ_CST);
  }
  return NULL;
}

static void part_count_window(void) {
  fz_config c = config();
  c.fails = 2, c.count_window = 2, c.min_calls = 2, c.open_for = 1000, c.max_open_for = 1000;
  B = fz_breaker_new(&c, NULL);
  pthread_t th;
  pthread_create(&th, NULL, cw_success_worker, NULL);
  long failures = 0, wrong = 0, rounds = iters / 10;
  for (long k = 0; k < rounds; k++) {
    double t = fz_enter(B);
    if (t < 0) continue;
    int code = fz_done(B, t, FZ_FAILURE, -1);
    failures++;
    uint64_t base = __atomic_load_n(&succ_done, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&succ_done, __ATOMIC_SEQ_CST) < base + 3 && (fz_state(B) & 255) == FZ_CLOSED) {}
    fz_stats st;
    fz_stats_read(B, &st);
    if (code || st.state != FZ_CLOSED || st.calls > 2 || st.failures > 1) {
      if (wrong++ < 3) diag("open after failure %ld: code %d, calls %u, failures %u", failures, code, st.calls, st.failures);
      fz_reset(B);
    }
  }
  __atomic_store_n(&stop_succ, 1, __ATOMIC_RELEASE);
  pthread_join(th, NULL);
  ok(failures > rounds / 2, "count window: %ld failures reported between successes", failures);
  is_int(wrong, 0, "count window: never opened, never more than N calls or 1 failure in it");
  fz_breaker_free(B);
}

int main(void) {
  const char *env = getenv("STRESS_ITERS");
  if (env && atol(env) > 0) iters = atol(env);
  diag("%d threads x %ld calls", THREADS, iters);
  part_counting();
  part_transitions();
  part_count_window();
  return done_testing();
}

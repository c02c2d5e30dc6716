/* test_core.c -- unit tests of the C core, driven by the manual clock. */
#include "../csrc/fz.h"
#include "tap.h"
#include "harness.h"   /* at, later, state */

#include <math.h>
#include <string.h>

static fz_config defaults(void) {
  fz_config c;
  memset(&c, 0, sizeof c);
  c.window = 10, c.open_for = 10, c.max_open_for = 320, c.probe_timeout = 10;
  c.backoff = 1, c.fails = 5, c.min_calls = 10, c.probes = 1;
  return c;
}

static int run(fz_breaker *b, int outcome) {
  double t = fz_enter(b);
  if (t < 0) return -1;
  return fz_done(b, t, outcome, -1);
}

static fz_stats stats(fz_breaker *b) {
  fz_stats s;
  fz_stats_read(b, &s);
  return s;
}

static void test_fails_rule(void) {
  at(1000);
  fz_config c = defaults();
  c.fails = 3;
  fz_breaker *b = fz_breaker_new(&c, NULL);
  run(b, FZ_FAILURE);
  run(b, FZ_SUCCESS);
  is_int(run(b, FZ_FAILURE), 0, "second failure makes no transition");
  is_int(state(b), FZ_CLOSED, "closed at fails - 1");
  is_int(run(b, FZ_FAILURE), 64 + FZ_CLOSED * 8 + FZ_OPEN, "the fails-th failure returns closed->open");
  is_int(state(b), FZ_OPEN, "open at fails");
  double t = fz_enter(b);
  is_int((int)(-t - 1), FZ_OPEN * 4, "open rejects, no transition made");
  fz_stats s = stats(b);
  is_int((int)s.calls, 4, "calls in window");
  is_int((int)s.failures, 3, "failures in window");
  is_int((int)s.rejections, 1, "rejections in window");
  is_int((int)s.opens_total, 1, "opens_total");
  is_dbl(s.retry_after, 10, 1e-6, "retry_after is open_for");
  later(4);
  is_dbl(fz_retry_after(b), 6, 1e-6, "retry_after counts down");
  fz_breaker_free(b);
}

static void test_window_edges(void) {
  fz_config c = defaults();
  c.fails = 2;
  /* A failure counts for at least window seconds ... */
  at(2000.0);
  fz_breaker *b = fz_breaker_new(&c, NULL);
  run(b, FZ_FAILURE);
  later(9.999);
  run(b, FZ_FAILURE);
  is_int(state(b), FZ_OPEN, "a failure 9.999 s old still counts");
  fz_breaker_free(b);
  /* ... and at most window * 1.1. */
  at(3000.0);
  b = fz_breaker_new(&c, NULL);
  run(b, FZ_FAILURE);
  later(11.0);
  run(b, FZ_FAILURE);
  is_int(state(b), FZ_CLOSED, "a failure 11 s old no longer counts");
  is_int((int)stats(b).failures, 1, "only the new failure is in the window");
  is_int((int)stats(b).failures_total, 2, "both are in the total");
  fz_breaker_free(b);
}

/* Every window size at every clock origin: the window counts from the first call. */
static void test_windows_and_origins(void) {
  const double windows[] = { 0.01, 0.1, 1, 7, 10, 60, 86400 };
  const double origins[] = { 0, 1e3, 1e6, -5e3, 3.9e9 };
  int bad = 0;
  for (unsigned w = 0; w < sizeof windows / sizeof *windows; w++) {
    for (unsigned o = 0; o < sizeof origins / sizeof *origins; o++) {
      at(origins[o]);
      fz_config c = defaults();
      c.fails = 2, c.window = windows[w];
      fz_breaker *b = fz_breaker_new(&c, NULL);
      run(b, FZ_FAILURE);
      later(windows[w] * 0.5);
      if ((int)stats(b).failures != 1 || run(b, FZ_FAILURE) != 64 + FZ_OPEN) {
        bad++;
        diag("window %g at origin %g did not trip", windows[w], origins[o]);
      }
      fz_breaker_free(b);
    }
  }
  is_int(bad, 0, "the fails rule holds for every window and clock origin");
}

static void test_half_open(void) {
  at(5000);
  fz_config c = defaults();
  c.fails = 1, c.probes = 2, c.open_for = 5, c.probe_timeout = 3;
  fz_breaker *b = fz_breaker_new(&c, NULL);
  run(b, FZ_FAILURE);
  later(4.9);
  ok(fz_enter(b) < 0, "still open before open_for");
  later(0.1);
  double p1 = fz_enter(b);
  ok(p1 > 0 && fmod(p1, 2) == 1, "first call after open_for is a probe that made open->half_open");
  double p2 = fz_enter(b);
  ok(p2 > 0 && fmod(p2, 2) == 0, "second probe admitted, no transition");
  double p3 = fz_enter(b);
  is_int((int)(-p3 - 1), FZ_HALF_OPEN * 4, "third rejected as half_open");
  is_int(fz_done(b, p1, FZ_SUCCESS, -1), 0, "one probe success: still half_open");
  double p4 = fz_enter(b);
  ok(p4 > 0, "a finished probe gives its slot to the next call");
  is_int((int)(-fz_enter(b) - 1), FZ_HALF_OPEN * 4, "while `probes` run at once, others are rejected");
  is_int(fz_done(b, p2, FZ_SUCCESS, -1), 64 + FZ_HALF_OPEN * 8 + FZ_CLOSED, "probes successes close");
  is_int(fz_done(b, p4, FZ_FAILURE, -1), 0, "a probe still running at the close is stale");
  is_int(state(b), FZ_CLOSED, "closed");

  /* A failed probe re-opens; a timed-out one too; a late report is stale. */
  run(b, FZ_FAILURE);
  later(5);
  p1 = fz_enter(b);
  is_int(fz_done(b, p1, FZ_FAILURE, -1), 64 + FZ_HALF_OPEN * 8 + FZ_OPEN, "a failed probe re-opens");
  later(5);
  p1 = fz_enter(b);
  ok(p1 > 0, "probe admitted again");
  later(3);
  is_int(fz_state(b), FZ_OPEN + 256 * (64 + FZ_HALF_OPEN * 8 + FZ_OPEN), "a probe past probe_timeout re-opens");
  is_int(fz_done(b, p1, FZ_SUCCESS, -1), 0, "the late probe's outcome is stale");
  is_int(state(b), FZ_OPEN, "and changes nothing");
  fz_breaker_free(b);
}

static void test_rejection_flood(void) {
  at(5500);
  fz_config c = defaults();
  c.fails = 1, c.open_for = 5;
  fz_breaker *b = fz_breaker_new(&c, NULL);
  run(b, FZ_FAILURE);
  for (int i = 0; i < 3000; i++) fz_enter(b);
  is_int((int)stats(b).rejections_total, 3000, "a flood of rejections is counted exactly");
  later(5);
  ok(fz_enter(b) > 0, "after a flood of rejections the first call after open_for is the probe");
  fz_breaker_free(b);

  at(5600);
  b = fz_breaker_new(&c, NULL);
  run(b, FZ_FAILURE);
  for (int i = 0; i < 100; i++) fz_enter(b);
  later(5);
  ok(fz_enter(b) > 0, "a quiet breaker admits the probe on the first call after open_for");
  fz_breaker_free(b);
}

static void test_ignored_probe(void) {
  at(6000);
  fz_config c = defaults();
  c.fails = 1, c.open_for = 1;
  fz_breaker *b = fz_breaker_new(&c, NULL);
  run(b, FZ_FAILURE);
  later(1);
  double p = fz_enter(b);
  ok(fz_enter(b) < 0, "the one slot is busy");
  fz_done(b, p, FZ_IGNORE, -1);
  p = fz_enter(b);
  ok(p > 0, "an ignored probe gives its slot back");
  fz_done(b, p, FZ_SUCCESS, -1);
  is_int(state(b), FZ_CLOSED, "then a success closes");
  fz_breaker_free(b);
}

static void test_stale_and_fresh_window(void) {
  at(7000);
  fz_config c = defaults();
  c.fails = 2, c.open_for = 1, c.window = 60;
  fz_breaker *b = fz_breaker_new(&c, NULL);
  double early = fz_enter(b);
  run(b, FZ_FAILURE);
  run(b, FZ_FAILURE);
  is_int(fz_done(b, early, FZ_FAILURE, -1), 0, "outcome of a call begun while closed is stale once open");
  is_int((int)stats(b).failures_total, 2, "and is not counted");
  later(1);
  run(b, FZ_SUCCESS);
  is_int(state(b), FZ_CLOSED, "recovered");
  run(b, FZ_FAILURE);
  is_int(state(b), FZ_CLOSED, "failures before the close are out of the fresh window");
  is_int((int)stats(b).failures, 1, "window holds the one new failure");
  fz_breaker_free(b);
}

static void test_failure_rate(void) {
  at(8000);
  fz_config c = defaults();
  c.fails = 0, c.failure_rate = 0.5, c.min_calls = 4;
  fz_breaker *b = fz_breaker_new(&c, NULL);
  run(b, FZ_FAILURE);
  run(b, FZ_FAILURE);
  run(b, FZ_FAILURE);
  is_int(state(b), FZ_CLOSED, "100%% failures under min_calls do not trip");
  is_int(run(b, FZ_SUCCESS), 64 + FZ_OPEN, "the success that reaches min_calls trips at 75%%");
  fz_breaker_free(b);

  b = fz_breaker_new(&c, NULL);
  run(b, FZ_SUCCESS);
  run(b, FZ_SUCCESS);
  run(b, FZ_SUCCESS);
  run(b, FZ_FAILURE);
  is_int(state(b), FZ_CLOSED, "25%% < 50%%");
  run(b, FZ_FAILURE);
  is_int(state(b), FZ_CLOSED, "40%% < 50%%");
  run(b, FZ_FAILURE);
  is_int(state(b), FZ_OPEN, "exactly 50%% trips");
  fz_breaker_free(b);

  c.failure_rate = 0.3, c.min_calls = 10;
  b = fz_breaker_new(&c, NULL);
  for (int i = 0; i < 7; i++) run(b, FZ_SUCCESS);
  for (int i = 0; i < 3; i++) run(b, FZ_FAILURE);
  is_int(state(b), FZ_OPEN, "3 of 10 at rate 0.3 trips (no rounding miss)");
  fz_breaker_free(b);
}

static void test_slow(void) {
  at(9000);
  fz_config c = defaults();
  c.fails = 0, c.slow = 0.5, c.slow_rate = 0.5, c.min_calls = 2;
  fz_breaker *b = fz_breaker_new(&c, NULL);
  is_int(fz_done(b, fz_enter(b), FZ_SUCCESS, 0.499), 0, "fast call");
  is_int(fz_done(b, fz_enter(b), FZ_SUCCESS, 0.5), 64 + FZ_OPEN, "exactly slow is slow: 1 of 2 trips");
  fz_stats s = stats(b);
  is_int((int)s.slow, 1, "slow in window");
  fz_breaker *only = fz_breaker_new(&c, NULL);
  for (int i = 0; i < 3; i++) run(only, FZ_FAILURE);
  is_int(fz_done(only, fz_enter(only), FZ_SUCCESS, 0.6), 0, "slow_rate counts failures among the calls: 1 slow of 4 < 50%%");
  fz_breaker_free(only);
  is_int((int)s.slow_total, 1, "slow_total");
  is_int((int)s.successes_total, 2, "slow calls are still successes");
  fz_breaker_free(b);
}

static void test_count_window(void) {
  at(10000);
  fz_config c = defaults();
  c.count_window = 4, c.fails = 2, c.min_calls = 4;
  fz_breaker *b = fz_breaker_new(&c, NULL);
  run(b, FZ_FAILURE);
  for (int i = 0; i < 4; i++) run(b, FZ_SUCCESS);
  is_int((int)stats(b).failures, 0, "the failure slid out after 4 calls");
  is_int((int)stats(b).calls, 4, "window holds N calls");
  later(1e6);
  is_int((int)stats(b).calls, 4, "time does not expire a count window");
  run(b, FZ_FAILURE);
  is_int(run(b, FZ_FAILURE), 64 + FZ_OPEN, "two failures in the last 4 trip");
  fz_breaker_free(b);
}

static void test_backoff(void) {
  at(11000);
  fz_config c = defaults();
  c.fails = 1, c.open_for = 1, c.backoff = 2, c.max_open_for = 3;
  fz_breaker *b = fz_breaker_new(&c, NULL);
  run(b, FZ_FAILURE);
  is_dbl(fz_retry_after(b), 1, 1e-6, "first open period");
  later(1);
  run(b, FZ_FAILURE);
  is_dbl(fz_retry_after(b), 2, 1e-6, "doubled after a failed probe");
  later(2);
  run(b, FZ_FAILURE);
  is_dbl(fz_retry_after(b), 3, 1e-6, "capped at max_open_for");
  later(3);
  run(b, FZ_SUCCESS);
  run(b, FZ_FAILURE);
  is_dbl(fz_retry_after(b), 1, 1e-6, "a close resets the backoff");
  fz_breaker_free(b);

  c.jitter = 0.5, c.backoff = 1;
  double lo = 1e9, hi = 0;
  for (int i = 0; i < 200; i++) {
    b = fz_breaker_new(&c, NULL);
    run(b, FZ_FAILURE);
    double r = fz_retry_after(b);
    lo = r < lo ? r : lo, hi = r > hi ? r : hi;
    fz_breaker_free(b);
  }
  ok(lo >= 0.5 - 1e-6 && hi <= 1 + 1e-6 && hi - lo > 0.1, "jitter shortens within [open_for*(1-j), open_for]: %.3f..%.3f", lo, hi);
}

static void test_manual_states(void) {
  at(12000);
  fz_config c = defaults();
  fz_breaker *b = fz_breaker_new(&c, NULL);
  is_int(fz_force_open(b), 64 + FZ_FORCED_OPEN, "closed -> forced_open");
  is_int((int)(-fz_enter(b) - 1), FZ_FORCED_OPEN * 4, "forced_open rejects");
  later(1e5);
  is_int(state(b), FZ_FORCED_OPEN, "and stays");
  is_int(fz_disable(b), 64 + FZ_FORCED_OPEN * 8 + FZ_DISABLED, "forced_open -> disabled");
  for (int i = 0; i < 20; i++) run(b, FZ_FAILURE);
  is_int(state(b), FZ_DISABLED, "disabled never trips");
  is_int((int)stats(b).failures_total, 0, "and counts nothing");
  is_int(fz_reset(b), 64 + FZ_DISABLED * 8 + FZ_CLOSED, "disabled -> closed");
  is_int(fz_reset(b), 64 + FZ_CLOSED * 8 + FZ_CLOSED, "a reset of a closed breaker is a transition");
  is_int((int)stats(b).generation, 4, "each transition bumps the generation");
  fz_breaker_free(b);
}

static void test_tickets_and_config(void) {
  fz_config c = defaults();
  fz_breaker *b = fz_breaker_new(&c, NULL);
  is_int(fz_done(b, 0, FZ_SUCCESS, -1), FZ_ETICKET, "0 is no ticket");
  is_int(fz_done(b, 1.5, FZ_SUCCESS, -1), FZ_ETICKET, "a fraction is no ticket");
  is_int(fz_done(b, NAN, FZ_SUCCESS, -1), FZ_ETICKET, "NaN is no ticket");
  is_int(fz_done(b, 1e300, FZ_SUCCESS, -1), FZ_ETICKET, "a huge number is no ticket");
  is_int(fz_done(b, fz_enter(b), 7, -1), FZ_ETICKET, "a bad outcome is refused");
  fz_breaker_free(b);

  fz_config bad = defaults();
  bad.window = NAN;
  is_int(fz_config_check(&bad), FZ_EINVAL, "NaN window refused");
  bad = defaults(), bad.probes = 17;
  is_int(fz_config_check(&bad), FZ_EINVAL, "probes above 16 refused");
  bad = defaults(), bad.count_window = 5000;
  is_int(fz_config_check(&bad), FZ_EINVAL, "count_window above 1024 refused");
  bad = defaults(), bad.fails = 0;
  is_int(fz_config_check(&bad), FZ_EINVAL, "no rule at all refused");
  int err = 0;
  ok(fz_breaker_new(&bad, &err) == NULL && err == FZ_EINVAL, "fz_breaker_new refuses bad options");
  bad = defaults(), bad.jitter = 0.9999999999, bad.failure_rate = 1e-10, bad.slow = 1e-10;
  bad.slow_rate = 1e-12;
  is_int(fz_config_check(&bad), FZ_OK, "values inside the facade's bounds accepted (one table)");
  ok(fz_config_bound(-1) == NULL && fz_config_bound(14) == NULL &&
     strcmp(fz_config_bound(0)->name, "window") == 0 &&
     strcmp(fz_config_bound(12)->name, "probes") == 0 &&
     strcmp(fz_config_bound(13)->name, "max_concurrent") == 0, "14 bounds, in fz_config order");
  bad = defaults(), bad.max_concurrent = FZ_MAX_CONCURRENT + 1;
  is_int(fz_config_check(&bad), FZ_EINVAL, "max_concurrent above 1,000,000 refused");
  fz_config other = defaults();
  other.fails = 9, other.window = 3;
  is_int((int)fz_config_diff(&c, &other), FZ_CFG_FAILS | FZ_CFG_WINDOW, "diff names fails and window");
  ok(strcmp(fz_strerror(FZ_EFULL), "breaker registry is full") == 0, "messages from the one table");
  ok(strcmp(fz_strerror(12345), "unknown error") == 0, "unknown code");
}

static void test_registry(void) {
  fz_config c = defaults();
  int st = 9;
  fz_breaker *a = fz_registry_open("db", 2, &c, &st);
  is_int(st, 1, "created");
  fz_breaker *a2 = fz_registry_open("db", 2, &c, &st);
  ok(a == a2 && st == 0, "same name and options: the same breaker");
  c.fails = 7;
  a2 = fz_registry_open("db", 2, &c, &st);
  ok(a == a2 && st == FZ_EMISMATCH, "other options: mismatch, existing returned");
  ok(fz_registry_open("", 0, &c, &st) == NULL && st == FZ_ENAME, "empty name refused");
  ok(fz_registry_open("a\0b", 3, &c, &st) == NULL && st == FZ_ENAME, "NUL in name refused");
  ok(fz_registry_find("db", 2) == a, "find");
  ok(fz_registry_find("nope", 4) == NULL, "find a missing one");
  is_int(fz_registry_count(), 1, "count");
  ok(strcmp(fz_breaker_name(fz_registry_at(0)), "db") == 0, "at(0) is db");
  fz_breaker_free(a);  /* a registry breaker is left alone */
  is_int(state(a), FZ_CLOSED, "registry breakers outlive free");
  is_int(fz_registry_init_shared(8), FZ_EBUSY, "cannot share once named breakers exist");
  ok(!fz_registry_is_shared(), "still private");

  /* Fill the registry: the first name past capacity is refused, nothing else breaks. */
  uint32_t cap = fz_registry_capacity();
  char name[32];
  int created = 0;
  for (uint32_t i = (uint32_t)fz_registry_count(); i < cap; i++) {
    int n = snprintf(name, sizeof name, "fill-%u", i);
    created += fz_registry_open(name, (size_t)n, &c, &st) != NULL && st == 1;
  }
  is_int(fz_registry_count(), (long long)cap, "the registry holds capacity (%u) breakers", cap);
  ok(created > 0, "created %d to fill it", created);
  ok(fz_registry_open("one-more", 8, &c, &st) == NULL && st == FZ_EFULL, "one more is refused: full");
  ok(fz_registry_open("db", 2, &c, &st) != NULL, "an existing name is still found when full");
}

int main(void) {
  test_fails_rule();
  test_window_edges();
  test_windows_and_origins();
  test_half_open();
  test_rejection_flood();
  test_ignored_probe();
  test_stale_and_fresh_window();
  test_failure_rate();
  test_slow();
  test_count_window();
  test_backoff();
  test_manual_states();
  test_tickets_and_config();
  test_registry();
  fz_clock_auto();
  return done_testing();
}

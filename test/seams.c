/*
 * seams.c -- a reload's reconfigure (fz_breaker_reconfigure) against the core's state
 * under way (prints TAP): a half-open whose `probes` a reload lowered still closes, and
 * a window whose width a reload changed counts every call of the new width.
 */
#include "../csrc/fz.h"
#include "../csrc/fz_internal.h"
#include "tap.h"
#include "harness.h"   /* state */

#include <string.h>

static fz_config config(void) {
  fz_config c;
  memset(&c, 0, sizeof c);
  c.window = 10, c.open_for = 5, c.max_open_for = 5, c.probe_timeout = 100, c.backoff = 1;
  c.fails = 3, c.min_calls = 1, c.probes = 3;
  return c;
}

/* probes 3 -> 1 while two probes succeeded and one (slot 2) is running */
static void fewer_probes(void) {
  fz_config c = config();
  int st;
  fz_breaker *b = fz_registry_open("probes", 6, &c, &st);
  for (int i = 0; i < 3; i++) fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  is_int(state(b), FZ_OPEN, "probes: tripped");
  fz_clock_manual(1006);
  double p1 = fz_enter(b), p2 = fz_enter(b), p3 = fz_enter(b);
  ok(p1 > 0 && p2 > 0 && p3 > 0 && state(b) == FZ_HALF_OPEN, "probes: three probes admitted");
  fz_done(b, p1, FZ_SUCCESS, -1);
  fz_done(b, p2, FZ_SUCCESS, -1);
  c.probes = 1;
  is_int(fz_breaker_reconfigure(b, &c), FZ_OK, "probes: a reload lowers probes to 1");
  is_int(fz_done(b, p3, FZ_SUCCESS, -1), 64 + FZ_HALF_OPEN * 8 + FZ_CLOSED,
         "probes: the running probe (slot 2) is accepted, and its success closes");
  is_int(state(b), FZ_CLOSED, "probes: closed");
  ok(fz_enter(b) > 0, "probes: calls are admitted");
  fz_registry_remove("probes", 6);
}

/* probes 3 -> 1 while a probe in slot 2 runs; another probe fails and re-opens: the
 * slot-2 probe's report is stale (counts nothing), not refused */
static void fewer_probes_stale(void) {
  fz_config c = config();
  int st;
  fz_clock_manual(1500);
  fz_breaker *b = fz_registry_open("stale-probe", 11, &c, &st);
  for (int i = 0; i < 3; i++) fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  fz_clock_manual(1506);
  double p1 = fz_enter(b), p2 = fz_enter(b), p3 = fz_enter(b);
  ok(p1 > 0 && p2 > 0 && p3 > 0, "stale probe: three probes admitted");
  c.probes = 1;
  fz_breaker_reconfigure(b, &c);
  is_int(fz_done(b, p1, FZ_FAILURE, -1), 64 + FZ_HALF_OPEN * 8 + FZ_OPEN, "stale probe: a failed probe re-opens");
  is_int(fz_done(b, p3, FZ_SUCCESS, -1), 0, "stale probe: slot 2's report is stale, not refused");
  is_int(fz_done(b, p2, FZ_IGNORE, -1), 0, "stale probe: slot 1's ignored report too");
  is_int(state(b), FZ_OPEN, "stale probe: still open");
  fz_registry_remove("stale-probe", 11);
}

/* probes 3 -> 2 once two probes succeeded: the next success closes */
static void fewer_probes_counted(void) {
  fz_config c = config();
  int st;
  fz_clock_manual(2000);
  fz_breaker *b = fz_registry_open("counted", 7, &c, &st);
  for (int i = 0; i < 3; i++) fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  fz_clock_manual(2006);
  fz_done(b, fz_enter(b), FZ_SUCCESS, -1);
  fz_done(b, fz_enter(b), FZ_SUCCESS, -1);
  c.probes = 2;
  fz_breaker_reconfigure(b, &c);
  is_int(state(b), FZ_HALF_OPEN, "counted: still half_open after the reload");
  fz_done(b, fz_enter(b), FZ_SUCCESS, -1);
  is_int(state(b), FZ_CLOSED, "counted: the next probe's success closes (no half_open for ever)");
  fz_registry_remove("counted", 7);
}

/* window 10 s -> 20 s (wider buckets: smaller epochs) and back */
static void window_width(double from, double to) {
  fz_config c = config();
  int st;
  fz_stats s;
  c.window = from, c.fails = 1000;
  fz_clock_manual(3000);
  fz_breaker *b = fz_registry_open("window", 6, &c, &st);
  for (int i = 0; i < 100; i++) fz_done(b, fz_enter(b), FZ_SUCCESS, -1);  /* busy stripe: done_fast */
  fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  c.window = to;
  fz_breaker_reconfigure(b, &c);
  fz_stats_read(b, &s);
  ok(s.calls == 0 && s.failures == 0, "window %g -> %g: a fresh window (%u calls)", from, to, s.calls);
  for (int i = 0; i < 100; i++) fz_done(b, fz_enter(b), FZ_SUCCESS, -1);
  fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  fz_stats_read(b, &s);
  is_int(s.calls, 101, "window %g -> %g: every call after the reload is in the window", from, to);
  fz_force_open(b);
  for (int i = 0; i < 5; i++) fz_enter(b);
  fz_stats_read(b, &s);
  is_int(s.rejections, 5, "window %g -> %g: forced_open rejections are in the window", from, to);
  is_int((long long)s.successes_total, 200, "window %g -> %g: totals kept", from, to);
  fz_registry_remove("window", 6);
}

/* A removal retired the breaker (FZ_REMOVED) and has not moved its identity yet (or
 * died there): a manual state through a handle of it must not bring it back, or the
 * registry's repair would keep it (it frees only retired slots). */
static void manual_on_retired(void) {
  fz_config c = config();
  int st;
  fz_breaker *b = fz_registry_open("retired", 7, &c, &st);
  is_int(fzi_retire(b, 0), 1, "retired: the breaker is retired");
  is_int(fz_reset(b), 0, "retired: reset makes no transition");
  is_int(fz_force_open(b), 0, "retired: force_open makes none");
  is_int(fz_disable(b), 0, "retired: disable makes none");
  is_int(fz_force_open_for(b, 10), 0, "retired: a timed force_open makes none");
  is_int(state(b), FZ_REMOVED, "retired: it stays retired");
  is_int(fz_registry_remove("retired", 7), 0, "retired: removing it again says no (a removal is under way)");
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  fz_clock_manual(1000);
  is_int(fz_registry_init(8, 0, 0), FZ_OK, "a private registry");
  fewer_probes();
  fewer_probes_stale();
  fewer_probes_counted();
  window_width(10, 20);
  window_width(20, 10);
  manual_on_retired();
  return done_testing();
}

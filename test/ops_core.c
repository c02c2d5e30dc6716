/* ops_core.c -- the C side of "Operating it": fz_force_open_for (manual clock) and the
 * transition events ring (threads recording at once, a reader checking every entry it
 * copies is whole). Built against build/libfzcore.a like test_core; run by make check. */
#include "../csrc/fz.h"
#include "tap.h"
#include "harness.h"   /* at, later, code, threads_start/join */

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static fz_config defaults(void) {
  fz_config c;
  memset(&c, 0, sizeof c);
  c.window = 10, c.open_for = 10, c.max_open_for = 320, c.probe_timeout = 10;
  c.backoff = 2, c.fails = 5, c.min_calls = 10, c.probes = 1;
  return c;
}

static void test_timed_force_open(void) {
  int err;
  fz_breaker *b = fz_breaker_new(&(fz_config){ 0 }, &err);
  ok(!b && err == FZ_EINVAL, "a bad config is refused (sanity)");
  fz_config c = defaults();
  b = fz_breaker_new(&c, &err);
  at(100);
  is_int(fz_force_open_for(b, 0), FZ_EINVAL, "seconds 0: FZ_EINVAL");
  is_int(fz_force_open_for(b, -1), FZ_EINVAL, "seconds -1: FZ_EINVAL");
  is_int(fz_force_open_for(b, FZ_MAX_FORCE_OPEN + 1.0), FZ_EINVAL, "seconds over the bound: FZ_EINVAL");
  is_int(fz_state(b), FZ_CLOSED, "nothing changed");
  is_int(fz_force_open_for(b, 5), code(FZ_CLOSED, FZ_FORCED_OPEN), "closed -> forced_open");
  is_dbl(fz_retry_after(b), 5, 1e-9, "retry_after: the time left");
  double r = fz_enter(b);
  is_int((int)(-r - 1), FZ_FORCED_OPEN * 4, "a call is rejected as forced_open, no transition");
  later(4.999);
  is_int(fz_state(b), FZ_FORCED_OPEN, "still forced_open just before the end");
  later(0.001);
  fz_stats s;
  fz_stats_peek(b, &s);
  is_int(s.state, FZ_HALF_OPEN, "peek at the end: shown as half_open, nothing made");
  is_int(fz_state(b), FZ_HALF_OPEN + 256 * (code(FZ_FORCED_OPEN, FZ_OPEN) + 128 * code(FZ_OPEN, FZ_HALF_OPEN)),
         "fz_state at the end: forced_open -> open -> half_open, both codes returned in order");
  double t = fz_enter(b);
  ok(t > 0 && ((long long)t >> 1 & 3) == 2, "the next call is a probe");
  is_int(fz_done(b, t, FZ_FAILURE, -1), code(FZ_HALF_OPEN, FZ_OPEN), "a failed probe re-opens");
  is_dbl(fz_retry_after(b), 20, 1e-9, "for open_for * backoff: a new run of open periods began at the lift");
  is_int((int)fz_stats_read(b, &s), 0, "stats: nothing due");
  is_int((int)s.opens_total, 1, "the lift is not counted as an open; the re-open is");

  /* the lift by fz_enter: that call is the probe, as the one that ends an open period
   * (until this fix it was rejected with made = 3, and the next call probed) */
  fz_force_open_for(b, 1);
  later(1);
  fz_stats_peek(b, &s);  /* (a pure read: fz_stats_read would make the lift) */
  uint64_t rejections = s.rejections_total;
  t = fz_enter(b);
  ok(t > 0, "fz_enter at the end: admitted");
  is_int((int)((long long)t & 7), 1, "a probe of kind 0, flag set: it made forced_open -> open -> half_open");
  is_int(kind_of(t), 2, "kind_of reads it as a probe");
  r = fz_enter(b);
  is_int((int)(-r - 1), FZ_HALF_OPEN * 4, "the next call finds the one probe slot taken: rejected, nothing made");
  is_int(fz_done(b, t, FZ_SUCCESS, -1), code(FZ_HALF_OPEN, FZ_CLOSED), "its success closed the circuit");
  fz_stats_read(b, &s);
  is_int((int)(s.rejections_total - rejections), 1, "only the second call was counted as rejected");
  is_int(fz_done(b, t, FZ_SUCCESS, -1), 0, "the probe reported again: stale, nothing");

  /* a lifted probe that fails re-opens for open_for (the lift began a new run) */
  fz_force_open_for(b, 1);
  later(1);
  t = fz_enter(b);
  is_int((int)((long long)t & 7), 1, "lifted again: the probe");
  is_int(fz_done(b, t, FZ_FAILURE, -1), code(FZ_HALF_OPEN, FZ_OPEN), "its failure re-opens");
  is_dbl(fz_retry_after(b), 20, 1e-9, "for open_for * backoff");
  later(20);

  /* fz_allow's ticket keeps the flag and kind: the tracked ticket stands for it */
  fz_reset(b);
  fz_force_open_for(b, 1);
  later(1);
  t = fz_allow(b);
  ok(t > 0 && ((long long)t & 0x80), "fz_allow at the end: a tracked ticket");
  is_int((int)((long long)t & 7), 1, "with kind 0 and the flag: it lifted");
  is_int(fz_done(b, t, FZ_SUCCESS, -1), code(FZ_HALF_OPEN, FZ_CLOSED), "its success closed the circuit");
  is_int(fz_done(b, t, FZ_SUCCESS, -1), FZ_EREPORTED, "reported twice: refused");

  /* a made-up kind 0 ticket without the flag is refused */
  t = fz_enter(b);
  is_int(fz_done(b, (double)((long long)t & ~7LL), FZ_SUCCESS, -1), FZ_ETICKET, "kind 0 without the flag: FZ_ETICKET");
  fz_done(b, t, FZ_SUCCESS, -1);

  /* an untimed force-open after a timed one is never lifted */
  fz_force_open_for(b, 1);
  fz_reset(b);
  is_int(fz_force_open(b), code(FZ_CLOSED, FZ_FORCED_OPEN), "untimed force-open");
  later(1e6);
  is_int(fz_state(b), FZ_FORCED_OPEN, "still forced_open a million seconds later");
  is_dbl(fz_retry_after(b), 0, 0, "retry_after 0 (unknown)");
  fz_breaker_free(b);
}

/* ---------------------------------------------------------------- events */

enum { NTHREADS = 4, PER_THREAD = 20000 };
static int g_finished;  /* writers done */

static void *writer(void *arg) {
  int id = (int)(long)arg;
  char name[64];
  for (int i = 0; i < PER_THREAD; i++) {
    /* the name encodes from and to, so a reader can tell a torn copy */
    int from = i % 5, to = (i + id) % 5;
    int len = snprintf(name, sizeof name, "writer-%d-%d-%d-%s", id, from, to, i % 2 ? "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" : "y");
    fz_events_add(name, (size_t)len, from, to);
  }
  __atomic_add_fetch(&g_finished, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

static void test_events(void) {
  is_dbl(fz_events_add("", 0, 0, 1), 0, 0, "an empty name is refused");
  double first = fz_events_last() + 1;
  double seq = fz_events_add("one", 3, FZ_CLOSED, FZ_OPEN);
  is_dbl(seq, first, 0, "seq: the next number");
  fz_event e;
  is_int(fz_events_read(seq, &e), 1, "read back");
  ok(strcmp(e.name, "one") == 0 && e.from == FZ_CLOSED && e.to == FZ_OPEN && e.pid == getpid() && e.seq == seq,
     "name, from, to, pid, seq");
  is_int(fz_events_read(seq + 1, &e), 0, "a seq not recorded yet: 0");

  pthread_t th[NTHREADS];
  threads_start(th, NTHREADS, writer, 0);
  long good = 0, torn = 0, lost = 0;
  double next = fz_events_last() + 1;
  while (next <= first + NTHREADS * PER_THREAD) {
    int rc = fz_events_read(next, &e);
    if (rc == 0) {
      if (fz_events_last() >= next + FZ_EVENTS_CAPACITY) next++;  /* overtaken: move on */
      else if (__atomic_load_n(&g_finished, __ATOMIC_SEQ_CST) == NTHREADS && fz_events_last() < next) break;
      continue;
    }
    if (rc < 0) lost++;
    else {
      int id, from, to;
      if (sscanf(e.name, "writer-%d-%d-%d-", &id, &from, &to) != 3 || from != e.from || to != e.to) torn++;
      else good++;
    }
    next++;
  }
  threads_join(th, NTHREADS);
  diag("events read whole: %ld, lost to the ring: %ld", good, lost);
  is_int((int)torn, 0, "no copy is torn while %d threads record at once", NTHREADS);
  ok(good > 0, "the reader copied events while they were written");
  is_dbl(fz_events_last(), first + NTHREADS * PER_THREAD, 0, "every event took one seq");
  double last = fz_events_last();
  is_int(fz_events_read(last - FZ_EVENTS_CAPACITY, &e), -1, "one capacity back: overwritten (-1)");
  is_int(fz_events_read(last - FZ_EVENTS_CAPACITY + 1, &e), 1, "the oldest kept is readable");
}

int main(void) {
  test_timed_force_open();
  test_events();
  return done_testing();
}

/*
 * hardening.c -- regression tests for issue 7's core items that need no second thread
 * parked (those are in interleave.c): probe stamps over many generations (item 1) and
 * tickets (items 3 and 9). Time is the manual clock.
 */
#include "../csrc/fz.h"
#include "tap.h"
#include "harness.h"   /* at, later, state, kind_of, peek, in_thread */

#include <pthread.h>
#include <string.h>

static fz_config defaults(void) {
  fz_config c;
  memset(&c, 0, sizeof c);
  c.window = 10, c.open_for = 1, c.max_open_for = 32, c.probe_timeout = 10;
  c.backoff = 1, c.fails = 1, c.min_calls = 10, c.probes = 1;
  return c;
}

static uint64_t gen_of(fz_breaker *b) { return peek(b).generation; }

/* One natural cycle with two probes: trip, wait open_for, admit both probes, which must
 * still be running (half_open), then close with their successes. Returns 1 when every
 * step went as it should. */
static int cycle_with_two_probes(fz_breaker *b) {
  fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  if (state(b) != FZ_OPEN) return 0;
  later(1);
  double p1 = fz_enter(b), p2 = fz_enter(b);
  if (kind_of(p1) != 2 || kind_of(p2) != 2) return 0;
  if (state(b) != FZ_HALF_OPEN) return 0;  /* the wedge: timed out the moment it started */
  fz_done(b, p1, FZ_SUCCESS, -1);
  fz_done(b, p2, FZ_SUCCESS, -1);
  return state(b) == FZ_CLOSED;
}

/* Item 1: a probe times out only after probe_timeout, at any generation. */
static void probe_stamps_any_generation(void) {
  at(1000);
  fz_config c = defaults();
  c.probes = 2;
  /* slot 1's stamp never written (0) until the generation is past 32768 */
  fz_breaker *b = fz_breaker_new(&c, NULL);
  while (gen_of(b) < 40000) fz_reset(b);
  ok(cycle_with_two_probes(b), "probe stamps: at generation 40000, a never-written stamp does not time the probe out");
  fz_breaker_free(b);

  /* every stretch of generations up to past 2^16, resets and natural cycles mixed */
  b = fz_breaker_new(&c, NULL);
  int bad = 0, cycles = 0;
  while (gen_of(b) < 140000) {
    for (int i = 0; i < 997; i++) fz_reset(b);
    cycles++;
    if (!cycle_with_two_probes(b)) {
      if (!bad) diag("first wedge at generation %llu", (unsigned long long)gen_of(b));
      bad++;
    }
  }
  is_int(bad, 0, "probe stamps: %d cycles with probes = 2 over 140000 generations: none timed out at start", cycles);
  fz_breaker_free(b);

  /* natural cycles only, probes = 2, slot 1 used once early on */
  b = fz_breaker_new(&c, NULL);
  ok(cycle_with_two_probes(b), "probe stamps: first cycle uses both slots");
  bad = 0;
  for (int i = 0; i < 12000 && !bad; i++) {
    fz_done(b, fz_enter(b), FZ_FAILURE, -1);
    later(1);
    double p = fz_enter(b);
    if (state(b) != FZ_HALF_OPEN) bad = 1;
    fz_done(b, p, FZ_FAILURE, -1);  /* re-opens */
    later(1);
    p = fz_enter(b);
    fz_done(b, p, FZ_SUCCESS, -1);
    double q = fz_enter(b);
    fz_done(b, q, FZ_SUCCESS, -1);
    if (state(b) != FZ_CLOSED) bad = 1;
  }
  ok(!bad && cycle_with_two_probes(b), "probe stamps: 12000 natural cycles (generation %llu), probes never time out at start",
     (unsigned long long)gen_of(b));
  /* and a probe that never reports still times out: after probe_timeout, not before */
  fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  later(1);
  double p = fz_enter(b);
  is_int(kind_of(p), 2, "probe stamps: a probe that will never report");
  later(9.999);
  is_int(state(b), FZ_HALF_OPEN, "probe stamps: still running just before probe_timeout");
  later(0.002);
  is_int(state(b), FZ_OPEN, "probe stamps: timed out just after");
  fz_breaker_free(b);
}

/* A ticket of kind `kind` in breaker b's current generation, with b's key. */
static double forged(fz_breaker *b, double real, int kind) {
  uint64_t key = (uint64_t)real & (UINT64_C(0x1fff) << 40);
  return (double)(key | (gen_of(b) & 0xffffffff) << 8 | (uint64_t)kind << 1);
}

/* Item 3: a ticket drives no transition its kind cannot make, and counts nothing. */
static void tickets_checked_by_state(void) {
  at(2000);
  fz_config c = defaults();
  c.fails = 1000;
  fz_breaker *b = fz_breaker_new(&c, NULL);
  double real = fz_enter(b);
  fz_done(b, real, FZ_SUCCESS, -1);

  is_int(fz_done(b, forged(b, real, 2), FZ_FAILURE, -1), FZ_ETICKET,
         "tickets: a made-up probe ticket in closed is refused");
  is_int(state(b), FZ_CLOSED, "tickets: closed stays closed (fails = 1000, one failure)");

  fz_force_open(b);
  is_int(fz_done(b, forged(b, real, 1), FZ_FAILURE, -1), FZ_ETICKET,
         "tickets: a kind-1 ticket of the forced_open generation is refused");
  is_int(fz_done(b, forged(b, real, 2), FZ_FAILURE, -1), FZ_ETICKET,
         "tickets: a probe ticket of the forced_open generation is refused");
  is_int(state(b), FZ_FORCED_OPEN, "tickets: forced_open is never moved to open by a report");

  fz_disable(b);
  is_int(fz_done(b, forged(b, real, 1), FZ_FAILURE, -1), FZ_ETICKET,
         "tickets: a kind-1 ticket of the disabled generation is refused");
  is_int(fz_done(b, forged(b, real, 2), FZ_FAILURE, -1), FZ_ETICKET,
         "tickets: a probe ticket of the disabled generation is refused");
  is_int(state(b), FZ_DISABLED, "tickets: disabled is never moved to open by a report");
  is_int(fz_done(b, forged(b, real, 3), FZ_SUCCESS, -1), 0, "tickets: a pass ticket in disabled is taken");

  fz_reset(b);
  is_int(fz_done(b, forged(b, real, 3), FZ_FAILURE, -1), FZ_ETICKET, "tickets: a pass ticket in closed is refused");
  uint64_t t = (uint64_t)fz_enter(b);
  is_int(fz_done(b, (double)(t ^ UINT64_C(1) << 45), FZ_FAILURE, -1), FZ_ETICKET,
         "tickets: a ticket with another key (made up, or another breaker's) is refused");
  fz_done(b, (double)t, FZ_SUCCESS, -1);
  fz_stats s = peek(b);
  is_int((int)s.failures_total, 0, "tickets: refused tickets counted nothing (failures)");
  is_int((int)s.successes_total, 2, "tickets: the two real calls counted");

  /* another breaker's tickets: a key differs (drawn at random; redraw on a tie) */
  fz_breaker *o = fz_breaker_new(&c, NULL);
  for (int i = 0; i < 100 && ((uint64_t)fz_enter(o) >> 40) == ((uint64_t)fz_enter(b) >> 40); i++) {
    fz_breaker_free(o);
    o = fz_breaker_new(&c, NULL);
  }
  is_int(fz_done(b, fz_enter(o), FZ_FAILURE, -1), FZ_ETICKET, "tickets: fz_enter's ticket of another breaker is refused");
  is_int((int)peek(b).failures_total, 0, "tickets: and counted nothing");
  fz_breaker_free(o);
  fz_breaker_free(b);
}

/* A tracked ticket reported from another thread. */
typedef struct cross {
  fz_breaker *b;
  double t;
  int rc;
} cross;

static void *allow_here(void *p) {
  cross *x = p;
  x->t = fz_allow(x->b);
  return NULL;
}

static void *report_here(void *p) {
  cross *x = p;
  x->rc = fz_done(x->b, x->t, FZ_FAILURE, -1);
  return NULL;
}

/* Item 9: fz_allow's tickets are refused when reported twice or to another breaker. */
static void allow_tickets(void) {
  at(3000);
  fz_config c = defaults();
  c.fails = 2;
  fz_breaker *b = fz_breaker_new(&c, NULL);
  fz_breaker *o = fz_breaker_new(&c, NULL);

  double t = fz_allow(b);
  ok(t > 0 && ((uint64_t)t & 0x80), "allow: a tracked ticket (bit 7)");
  is_int(kind_of(t), 1, "allow: kind 1 in closed, as fz_enter's");
  is_int(fz_done(b, t, FZ_FAILURE, -1), 0, "allow: reported once: counted");
  is_int(fz_done(b, t, FZ_FAILURE, -1), FZ_EREPORTED, "allow: reported twice: FZ_EREPORTED");
  is_int(fz_done(b, t, FZ_IGNORE, -1), FZ_EREPORTED, "allow: any outcome the second time");
  is_int(state(b), FZ_CLOSED, "allow: one failure of fails = 2 does not open, however often reported");
  is_int((int)peek(b).failures_total, 1, "allow: counted once");

  double u = fz_allow(b);
  is_int(fz_done(o, u, FZ_FAILURE, -1), FZ_ETICKET, "allow: given to another breaker: FZ_ETICKET");
  is_int((int)peek(o).failures_total, 0, "allow: the other breaker counted nothing");
  is_int(fz_done(b, u, FZ_SUCCESS, -1), 0, "allow: and its own breaker still takes it");
  is_int(fz_done(b, u + (1 << 18), FZ_SUCCESS, -1), FZ_ETICKET, "allow: a ticket never issued (the next entry): FZ_ETICKET");
  double v = fz_allow(b);
  is_int(fz_done(b, u, FZ_SUCCESS, -1), FZ_EREPORTED, "allow: reported again after another allow: FZ_EREPORTED");
  is_int(fz_done(b, v, FZ_SUCCESS, -1), 0, "allow: the other ticket is taken");
  is_int(fz_done(b, u, FZ_SUCCESS, -1), FZ_EREPORTED, "allow: and the first again: FZ_EREPORTED");
  is_int((int)peek(b).successes_total, 2, "allow: two successes");
  is_int(fz_done(b, (double)(((uint64_t)u & 0xff) | (uint64_t)1 << 52), FZ_SUCCESS, -1), FZ_ETICKET,
         "allow: a made-up tracked number: FZ_ETICKET");

  /* reported from another thread, then again here */
  cross x = { b, 0, 0 };
  in_thread(allow_here, &x);
  in_thread(report_here, &x);
  is_int(x.rc, 64 + FZ_CLOSED * 8 + FZ_OPEN, "allow: allowed in one thread, reported in another: counted (trips)");
  is_int(fz_done(b, x.t, FZ_FAILURE, -1), FZ_EREPORTED, "allow: reported again from a third thread: refused");
  is_int((int)peek(b).failures_total, 2, "allow: two failures in all");

  /* a probe ticket */
  later(1);
  double p = fz_allow(b);
  is_int(kind_of(p), 2, "allow: a probe ticket");
  ok(((uint64_t)p & 1) == 1, "allow: odd: this call made open -> half_open");
  is_int(fz_done(b, p, FZ_SUCCESS, -1), 64 + FZ_HALF_OPEN * 8 + FZ_CLOSED, "allow: the probe closes");
  is_int(fz_done(b, p, FZ_FAILURE, -1), FZ_EREPORTED, "allow: the probe reported twice: refused, no re-open");
  is_int(state(b), FZ_CLOSED, "allow: closed");

  /* correct use stays exact, also with more tickets outstanding than a ledger holds */
  enum { N = 5000 };
  static double ts[N];
  fz_breaker *e = fz_breaker_new(&(fz_config){ .window = 10, .open_for = 1, .max_open_for = 1,
                                               .probe_timeout = 1, .backoff = 1, .fails = 1000000,
                                               .min_calls = 10, .probes = 1 }, NULL);
  int tracked = 0;
  for (int i = 0; i < N; i++) tracked += ((uint64_t)(ts[i] = fz_allow(e)) & 0x80) != 0;
  int rc = 0;
  for (int i = 0; i < N; i++) rc |= fz_done(e, ts[i], i % 5 ? FZ_SUCCESS : FZ_FAILURE, -1);
  is_int(rc, 0, "allow: %d outstanding tickets (%d tracked), each reported once: all taken", N, tracked);
  ok(tracked >= 4096 && tracked < N, "allow: beyond the ledger, tickets are left untracked");
  fz_stats s = peek(e);
  is_int((int)s.successes_total, N * 4 / 5, "allow: exact successes");
  is_int((int)s.failures_total, N / 5, "allow: exact failures");
  fz_breaker_free(e);
  fz_breaker_free(o);
  fz_breaker_free(b);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  probe_stamps_any_generation();
  tickets_checked_by_state();
  allow_tickets();
  fz_clock_auto();
  return done_testing();
}

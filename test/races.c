/*
 * races.c -- the correctness suspicions of the issues 7-11 review, each forced: a
 * thread parked at a named pause point of the core (test/pause.h) while another runs,
 * or, where no interleaving is needed, the state it would leave built directly. Time is
 * the manual clock.
 *
 *   manual states on a stale handle  fz_*_id never act on a breaker that took the slot
 *                                    over, even when the slot passes between the
 *                                    identity check and the act (pause "manual-checked")
 *   a timed force-open racing a trip the trip's end never lends itself to the
 *                                    force-open (pause "trip-stamped")
 *   the lift of a timed force-open   the call that makes it is the probe; against a
 *                                    state read, another call, a reset (pauses
 *                                    "lifting", "lifted")
 *   a failed probe                   the half-open it ends admits no other call
 *                                    between the take-back and the re-open (pause
 *                                    "probe-failed"), and no success closes it
 *   a completed half-open            a success past `probes` closes it when the one
 *                                    that completed them has not yet (pause
 *                                    "probe-succeeded"), and a late close starts no
 *                                    fresh window over the closed period, nor does
 *                                    one past its check (pause "close-checked"),
 *                                    time or count window, nor one racing a reset
 *                                    (pause "reset-laid")
 *   idle eviction of a running call  its outcome is not lost: fz_done answers FZ_ESTALE
 *                                    and fz_late_id counts it into the name's breaker
 *   reconfigure while calls run      options are atomic (this part is for TSan)
 */
#include "../csrc/fz.h"
#include "tap.h"
#include "harness.h"
#include "pause.h"

#include <stdatomic.h>
#include <string.h>

static fz_config defaults(void) {
  fz_config c;
  memset(&c, 0, sizeof c);
  c.window = 10, c.open_for = 10, c.max_open_for = 1000, c.probe_timeout = 5;
  c.backoff = 1, c.fails = 3, c.min_calls = 10, c.probes = 1;
  return c;
}

/* ---------------------------------------------------------------- manual states */

enum { RESET, FORCE_OPEN, DISABLE, FORCE_OPEN_FOR };
static const char *const WHAT[] = { "reset", "force_open", "disable", "force_open(30)" };

static int act(int what, fz_breaker *b, uint32_t id) {
  switch (what) {
  case RESET: return fz_reset_id(b, id);
  case FORCE_OPEN: return fz_force_open_id(b, id);
  case DISABLE: return fz_disable_id(b, id);
  default: return fz_force_open_for_id(b, id, 30);
  }
}

/* The handle is stale before the call: its slot holds another name now. Nothing of the
 * other breaker changes: not its state, not its window (reset's fresh window). */
static void manual_stale(int what) {
  fz_config c = defaults();
  uint32_t id_a, id_z;
  fz_breaker *a = open_named("a", &c, &id_a);
  remove_named("a");
  fz_breaker *z = open_named("z", &c, &id_z);
  ok(a == z && id_a != id_z, "%s on a stale handle: the slot went to another name", WHAT[what]);
  fz_done(z, fz_enter(z), FZ_FAILURE, -1);
  is_int(act(what, a, id_a), FZ_ESTALE, "%s on a stale handle: FZ_ESTALE", WHAT[what]);
  is_int(state(z), FZ_CLOSED, "%s on a stale handle: the other breaker's state is its own", WHAT[what]);
  is_int(peek(z).failures, 1, "%s on a stale handle: and its window too", WHAT[what]);
  ok(act(what, z, id_z) > 0, "%s through the live handle acts", WHAT[what]);
  remove_named("z");
}

typedef struct manual_job {
  fz_breaker *b;
  uint32_t id;
  int what, rc;
  atomic_int done;
} manual_job;

static void do_act(void *p) {
  manual_job *j = p;
  j->rc = act(j->what, j->b, j->id);
}

static void *do_reuse(void *p) {
  manual_job *j = p;
  fz_config c = defaults();
  remove_named("a");
  fz_breaker *w = open_named("w", &c, NULL);  /* takes a's slot */
  fz_done(w, fz_enter(w), FZ_FAILURE, -1);     /* one failure in its window */
  atomic_store(&j->done, 1);
  return NULL;
}

/* The handle is live when checked; while the act waits right after the check, another
 * thread removes the name and opens another into the slot. It cannot: the check and the
 * act hold the registry's lock, so the removal waits until the act is done, and the act
 * lands on its own breaker. (With the check made apart from the act, as the facade did,
 * the removal and the reuse run at once and the act lands on "w".) */
static void manual_interleaved(int what) {
  fz_config c = defaults();
  uint32_t id;
  fz_breaker *a = open_named("a", &c, &id);
  manual_job j = { a, id, what, 0, 0 };
  parked k;
  pthread_t other;
  ok(run_parked(&k, "manual-checked", do_act, &j), "%s mid-way: parked after the identity check", WHAT[what]);
  pthread_create(&other, NULL, do_reuse, &j);
  struct timespec ms = { 0, 1000000 };
  for (int i = 0; i < 200 && !atomic_load(&j.done); i++) nanosleep(&ms, NULL);  /* bounded */
  ok(!atomic_load(&j.done), "%s mid-way: the removal and the reuse wait for the act", WHAT[what]);
  release(&k);
  pthread_join(other, NULL);
  ok(j.rc > 0, "%s mid-way: the act was made, on its own breaker (code %d)", WHAT[what], j.rc);
  uint32_t wid;
  fz_breaker *w = fz_registry_find_id("w", 1, &wid);
  ok(w == a, "%s mid-way: the other name took the slot afterwards", WHAT[what]);
  is_int(state(w), FZ_CLOSED, "%s mid-way: the other breaker is untouched", WHAT[what]);
  is_int(peek(w).failures, 1, "%s mid-way: its window too", WHAT[what]);
  is_int(act(what, a, id), FZ_ESTALE, "%s mid-way: the old handle is stale now", WHAT[what]);
  remove_named("w");
}

/* An anonymous breaker has identity 0 and nothing to go stale. */
static void manual_anonymous(void) {
  fz_config c = defaults();
  fz_breaker *b = fz_breaker_new(&c, NULL);
  ok(fz_force_open_id(b, 0) > 0 && state(b) == FZ_FORCED_OPEN, "anonymous: force_open_id acts");
  ok(fz_reset_id(b, 0) > 0 && state(b) == FZ_CLOSED, "anonymous: reset_id acts");
  is_int(fz_force_open_for_id(b, 0, -1), FZ_EINVAL, "anonymous: a bad duration is FZ_EINVAL");
  is_int(fz_reset_id(b, 3), FZ_ESTALE, "anonymous: another identity is stale");
  fz_breaker_free(b);
}

/* ---------------------------------------------------------------- force-open vs trip */

typedef struct done_job {
  fz_breaker *b;
  double ticket;
  int rc;
} done_job;

static void do_fail(void *p) {
  done_job *j = p;
  j->rc = fz_done(j->b, j->ticket, FZ_FAILURE, -1);
}

/* A trip stamps the end of its open period (10 s), then a timed force-open (100 s) wins
 * the swap it was about to make. The force-open's end is its own: the trip's stamp was
 * for the same generation, so with one stamp for both the force-open would find that
 * generation stamped already and end after 10 s. */
static void forced_vs_trip(void) {
  at(5000);
  fz_config c = defaults();
  c.fails = 1;
  fz_breaker *b = fz_breaker_new(&c, NULL);
  done_job j = { b, fz_enter(b), 0 };
  parked k;
  ok(run_parked(&k, "trip-stamped", do_fail, &j), "force vs trip: the trip parked after stamping its end");
  is_int(fz_force_open_for(b, 100), 64 + FZ_CLOSED * 8 + FZ_FORCED_OPEN, "force vs trip: the force-open wins");
  release(&k);
  is_int(j.rc, 0, "force vs trip: the trip lost its swap");
  later(20);
  is_int(state(b), FZ_FORCED_OPEN, "force vs trip: still forced open after the trip's 10 s");
  is_dbl(fz_retry_after(b), 80, 1e-6, "force vs trip: its own end, 80 s away");
  later(80);
  is_int(state(b), FZ_HALF_OPEN, "force vs trip: lifted at its own end (probes decide)");
  fz_breaker_free(b);
}

/* ---------------------------------------------------------------- a failed probe */

/* A failed probe's report takes its slot back, then re-opens the circuit. Parked
 * between the two (the pause "probe-failed"), the half-open it ends admits no other
 * call: the freed slot must not let a second probe run into a peer just seen failing
 * (it would run while the circuit is open again, its outcome stale). A caller that
 * finds the half-open so makes the re-open itself (a reporter killed there would leave
 * it for ever), and is told; the report's own swap then loses. With probes = 2 the
 * other probe's success does not close a half-open that a probe failed. Same for a
 * probe taken back at its timeout (settle, whose take-back parks at the same point). */
static void failed_probe(int probes) {
  at(6000);
  fz_config c = defaults();
  c.fails = 1, c.probes = (uint32_t)probes;
  fz_breaker *b = fz_breaker_new(&c, NULL);
  fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  later(10);
  done_job j = { b, fz_enter(b), 0 };
  double other = probes > 1 ? fz_enter(b) : 0;
  ok(kind_of(j.ticket) == 2 && (probes == 1 || kind_of(other) == 2), "failed probe (probes %d): admitted", probes);
  parked k;
  ok(run_parked(&k, "probe-failed", do_fail, &j), "failed probe (probes %d): its report parked after the take-back",
     probes);
  is_int((int)peek(b).state, FZ_HALF_OPEN, "failed probe (probes %d): still half_open meanwhile (a peek)", probes);
  if (probes > 1)
    is_int(fz_done(b, other, FZ_SUCCESS, -1), 0, "failed probe (probes 2): the other probe's success closes nothing");
  double t = fz_enter(b);
  is_dbl(t, -(1 + FZ_OPEN * 4 + 2), 0,
         "failed probe (probes %d): the next call is rejected, and it made the re-open (MADE_REOPEN)", probes);
  release(&k);
  is_int(j.rc, 0, "failed probe (probes %d): the parked report's swap lost: the re-open was told once", probes);
  is_int(state(b), FZ_OPEN, "failed probe (probes %d): open", probes);
  ok(fz_enter(b) < 0, "failed probe (probes %d): and stays open for open_for", probes);
  later(10);
  ok(kind_of(fz_enter(b)) == 2, "failed probe (probes %d): then admits a probe again", probes);
  fz_breaker_free(b);
}

/* The same window in the take-back of a probe past probe_timeout (settle). */
static void enter_job(void *p) {
  done_job *j = p;
  j->ticket = fz_enter(j->b);
}

static void timed_out_probe(void) {
  at(7000);
  fz_config c = defaults();
  c.fails = 1;
  fz_breaker *b = fz_breaker_new(&c, NULL);
  fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  later(10);
  double probe = fz_enter(b);
  ok(kind_of(probe) == 2, "timed-out probe: admitted");
  later(5);  /* probe_timeout */
  done_job j = { b, 0, 0 };
  parked k;
  ok(run_parked(&k, "probe-failed", enter_job, &j), "timed-out probe: a caller parked after taking it back");
  double t = fz_enter(b);
  is_dbl(t, -(1 + FZ_OPEN * 4 + 2), 0, "timed-out probe: another caller is rejected, and made the re-open");
  release(&k);
  is_dbl(j.ticket, -(1 + FZ_OPEN * 4), 0, "timed-out probe: the parked caller is rejected, its swap lost");
  is_int(fz_done(b, probe, FZ_SUCCESS, -1), 0, "timed-out probe: its late success counts nothing");
  is_int(state(b), FZ_OPEN, "timed-out probe: open");
  fz_breaker_free(b);
}

/* The success that completes `probes` takes its slot back, then closes. Parked between
 * the two (the pause "probe-succeeded", where a process may be killed: test/faults.c,
 * "closing"), the half-open admits another probe, and that probe's success must close
 * it (before, it counted a success past `probes` and closed nothing: half_open for good,
 * one call at a time). A closed call then fails; the parked report, released, finds the
 * circuit closed and must not start a fresh window over that failure: two more trip it
 * (fails = 3). */
static void do_succeed(void *p) {
  done_job *j = p;
  j->rc = fz_done(j->b, j->ticket, FZ_SUCCESS, -1);
}

static void completed_probe(void) {
  at(8000);
  fz_config c = defaults();
  fz_breaker *b = fz_breaker_new(&c, NULL);
  for (int i = 0; i < 3; i++) fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  is_int(state(b), FZ_OPEN, "completed probe: 3 failures trip it");
  later(10);
  done_job j = { b, fz_enter(b), -1 };
  ok(kind_of(j.ticket) == 2, "completed probe: a probe admitted");
  parked k;
  ok(run_parked(&k, "probe-succeeded", do_succeed, &j), "completed probe: its success parked after the take-back");
  double t = fz_enter(b);
  ok(kind_of(t) == 2, "completed probe: meanwhile another probe is admitted");
  is_int(fz_done(b, t, FZ_SUCCESS, -1), 64 + FZ_HALF_OPEN * 8 + FZ_CLOSED,
         "completed probe: its success closes the circuit (and says so)");
  is_int(state(b), FZ_CLOSED, "completed probe: closed");
  fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  release(&k);
  is_int(j.rc, 0, "completed probe: the parked report, released, made no transition");
  is_int((int)peek(b).failures, 1, "completed probe: the closed call's failure is still in the window");
  fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  is_int(state(b), FZ_OPEN, "completed probe: two more failures trip it (fails = 3)");
  fz_breaker_free(b);
}

static void do_reset(void *p) { fz_reset(p); }

/* Two closers of one half-open (the one that completed `probes`, parked, and a later
 * probe's success, see completed_probe): the completing one parks right after it found
 * the circuit still half-open (the pause "close-checked"), before its fresh window; the
 * later one closes; a closed call fails; the parked one, released, must not lay its
 * fresh window over that failure (it would wipe it from the window: two more failures
 * would then not trip it). by_reset: the other closer is a manual reset, parked after
 * its fresh window and before its swap ("reset-laid") while the probe's success makes
 * its check. Before, a reset bumped the window itself, and the closer laid its own from
 * the shift it read after that bump: the failure was wiped. */
static void late_closer(uint32_t count_window, int by_reset) {
  const char *what = by_reset ? "reset vs closer" : "late closer";
  at(9000 + by_reset * 500 + count_window);
  fz_config c = defaults();
  c.count_window = count_window;
  fz_breaker *b = fz_breaker_new(&c, NULL);
  for (int i = 0; i < 3; i++) fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  later(10);
  done_job j = { b, fz_enter(b), -1 };
  ok(kind_of(j.ticket) == 2, "%s: a probe admitted", what);
  parked k, r;
  if (by_reset) ok(run_parked(&r, "reset-laid", do_reset, b), "%s: a reset parked after its fresh window, before its swap", what);
  ok(run_parked(&k, "close-checked", do_succeed, &j), "%s: its success parked after the half-open check", what);
  if (by_reset) {
    release(&r);
    is_int(state(b), FZ_CLOSED, "%s: the reset, released, closed the circuit", what);
  } else {
    double t = fz_enter(b);
    ok(kind_of(t) == 2, "%s: another probe admitted", what);
    is_int(fz_done(b, t, FZ_SUCCESS, -1), 64 + FZ_HALF_OPEN * 8 + FZ_CLOSED, "%s: the other probe's success closes", what);
  }
  fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  release(&k);
  is_int(j.rc, 0, "%s (count window %u): the parked report, released, made no transition", what, count_window);
  is_int((int)peek(b).failures, 1, "%s (count window %u): the closed call's failure is still in the window", what,
         count_window);
  fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  is_int(state(b), FZ_OPEN, "%s (count window %u): two more failures trip it (fails = 3)", what, count_window);
  fz_breaker_free(b);
}

/* ---------------------------------------------------------------- the lift */

/* The lift of a timed forced_open (forced_open -> open -> half_open, one swap) by the
 * first call after its end: that call is the probe, as the one that ends an open period.
 * Each race below parks a call at "lifting" (before its swap) or "lifted" (after it,
 * before its probe claim) while another caller acts; every transition is reported to
 * exactly one caller, and a call that made the lift always says so. */
typedef struct lift_job {
  fz_breaker *b;
  double t;
} lift_job;

static void do_lift_enter(void *p) {
  lift_job *j = p;
  j->t = fz_enter(j->b);
}

static fz_breaker *timed_forced(double at_s, uint32_t probes) {
  at(at_s);
  fz_config c = defaults();
  c.probes = probes;
  fz_breaker *b = fz_breaker_new(&c, NULL);
  fz_force_open_for(b, 5);
  later(5);
  return b;
}

enum { LIFTS = 64 + FZ_FORCED_OPEN * 8 + FZ_OPEN + 128 * (64 + FZ_OPEN * 8 + FZ_HALF_OPEN) };
#define PLAIN_PROBE 4.0          /* low 3 bits: kind 2, flag 0 */
#define LIFTED_PROBE 1.0         /* low 3 bits: kind 0, flag 1 */
static double low3(double t) { return t > 0 ? (double)((uint64_t)t & 7) : t; }

static void lift_races(void) {
  lift_job j;
  parked k;

  /* a state read lifts while the call is parked before its swap */
  j = (lift_job){ timed_forced(7000, 1), 0 };
  ok(run_parked(&k, "lifting", do_lift_enter, &j), "lift vs state(): the call parked before its swap");
  is_int(fz_state(j.b), FZ_HALF_OPEN + 256 * LIFTS, "lift vs state(): the read made both transitions");
  release(&k);
  is_dbl(low3(j.t), PLAIN_PROBE, 0, "lift vs state(): the call lost the swap, made nothing, and is the probe");
  is_int(fz_done(j.b, j.t, FZ_SUCCESS, -1), code(FZ_HALF_OPEN, FZ_CLOSED), "lift vs state(): its success closes");
  fz_breaker_free(j.b);

  /* two calls at the end: the one that swaps is the probe and says it lifted */
  j = (lift_job){ timed_forced(7100, 1), 0 };
  ok(run_parked(&k, "lifting", do_lift_enter, &j), "lift vs lift: the first call parked before its swap");
  double t = fz_enter(j.b);
  is_dbl(low3(t), LIFTED_PROBE, 0, "lift vs lift: the other call lifted and is the probe");
  release(&k);
  is_dbl(j.t, -(1 + FZ_HALF_OPEN * 4), 0, "lift vs lift: the parked one lost, made nothing, is rejected (1 probe)");
  fz_done(j.b, t, FZ_SUCCESS, -1);
  fz_breaker_free(j.b);

  /* with probes = 2 the loser is the second probe */
  j = (lift_job){ timed_forced(7200, 2), 0 };
  ok(run_parked(&k, "lifting", do_lift_enter, &j), "lift vs lift, 2 probes: parked before its swap");
  t = fz_enter(j.b);
  release(&k);
  is_dbl(low3(t), LIFTED_PROBE, 0, "lift vs lift, 2 probes: the lifter is a probe");
  is_dbl((double)((uint64_t)j.t & 0x7f), PLAIN_PROBE + 8, 0, "lift vs lift, 2 probes: the other is the probe of slot 1");
  fz_done(j.b, t, FZ_SUCCESS, -1);
  is_int(fz_done(j.b, j.t, FZ_SUCCESS, -1), code(FZ_HALF_OPEN, FZ_CLOSED), "lift vs lift, 2 probes: two successes close");
  fz_breaker_free(j.b);

  /* the lifter swapped, then another call took the one probe slot before its claim */
  j = (lift_job){ timed_forced(7300, 1), 0 };
  ok(run_parked(&k, "lifted", do_lift_enter, &j), "slot taken: the lifter parked after its swap");
  t = fz_enter(j.b);
  is_dbl(low3(t), PLAIN_PROBE, 0, "slot taken: the other call claimed the slot (it made nothing)");
  release(&k);
  is_dbl(j.t, -(1 + FZ_HALF_OPEN * 4 + 3), 0, "slot taken: the lifter is rejected as half_open, made = 3 (both)");
  fz_done(j.b, t, FZ_SUCCESS, -1);
  fz_breaker_free(j.b);

  /* the lifter swapped, then a reset ended the half-open before its claim */
  j = (lift_job){ timed_forced(7400, 1), 0 };
  ok(run_parked(&k, "lifted", do_lift_enter, &j), "reset: the lifter parked after its swap");
  is_int(fz_reset(j.b), code(FZ_HALF_OPEN, FZ_CLOSED), "reset: half_open -> closed");
  uint64_t rej = peek(j.b).rejections_total;
  release(&k);
  is_dbl(j.t, -(1 + FZ_HALF_OPEN * 4 + 3), 0, "reset: the lifter is rejected as half_open, made = 3 (both)");
  is_int((int)(peek(j.b).rejections_total - rej), 1, "reset: and counted as a rejection");
  is_int(state(j.b), FZ_CLOSED, "reset: the circuit stays closed");
  t = fz_enter(j.b);
  is_dbl(low3(t), 2, 0, "reset: the next call is a closed call");
  fz_done(j.b, t, FZ_SUCCESS, -1);
  /* the slot the lifter claimed and gave back: the next half-open has its probe */
  fz_force_open_for(j.b, 1);
  later(1);
  is_dbl(low3(fz_enter(j.b)), LIFTED_PROBE, 0, "reset: the next lift's call is the probe again");
  fz_breaker_free(j.b);
}

/* ---------------------------------------------------------------- idle eviction */

/* A call enters a closed breaker, which is evicted as idle while the call runs (its slot
 * reused by another name); the call reports. Its outcome is its name's: fz_done counts
 * nothing in the slot and says FZ_ESTALE, and fz_late_id counts it into the breaker the
 * name has again. */
static void evicted_mid_call(void) {
  at(6000);
  fz_config c = defaults();
  c.fails = 1;
  double evictions = fz_registry_evictions_total();
  uint32_t id_e, id_f, id_g;
  fz_breaker *e = open_named("e", &c, &id_e);
  double t = fz_enter_id(e, id_e);
  ok(t > 0, "evicted mid-call: the call entered");
  later(5);  /* more than idle (1 s): e is evictable, a call in flight or not */
  fz_breaker *f = open_named("f", &c, &id_f);
  fz_breaker *g = open_named("g", &c, &id_g);  /* full: evicts e (f is fresh) */
  is_dbl(fz_registry_evictions_total() - evictions, 1, 0, "evicted mid-call: e was evicted");
  ok(g == e && f != e, "evicted mid-call: g took e's slot");
  is_int(fz_done(e, t, FZ_FAILURE, -1), FZ_ESTALE, "evicted mid-call: fz_done says the outcome is the name's");
  is_int(peek(g).failures, 0, "evicted mid-call: nothing counted into g");
  is_int(state(g), FZ_CLOSED, "evicted mid-call: g stays closed");
  remove_named("f");
  uint32_t id_e2;
  fz_breaker *e2 = open_named("e", &c, &id_e2);
  is_int(fz_late_id(e2, id_e2, FZ_FAILURE, -1), 64 + FZ_CLOSED * 8 + FZ_OPEN,
         "evicted mid-call: fz_late_id counts it into e again: the failure trips it");
  is_int(fz_late_id(e2, id_e2, FZ_FAILURE, -1), 0, "evicted mid-call: an open breaker counts no late outcome");
  is_int(peek(e2).failures, 1, "evicted mid-call: one failure");
  is_int(fz_late_id(e, id_e, FZ_FAILURE, -1), FZ_ESTALE, "evicted mid-call: fz_late_id on a stale handle: FZ_ESTALE");
  remove_named("e");
  remove_named("g");
}

/* A removal is deliberate: a call's outcome after it counts nothing, as before. */
static void removed_mid_call(void) {
  fz_config c = defaults();
  uint32_t id;
  fz_breaker *r = open_named("r", &c, &id);
  double t = fz_enter_id(r, id);
  remove_named("r");
  is_int(fz_done(r, t, FZ_FAILURE, -1), 0, "removed mid-call: the outcome is stale (0)");
}

typedef struct open_job {
  const char *name;
  fz_breaker *got;
} open_job;

static void do_open(void *p) {
  open_job *j = p;
  fz_config c = defaults();
  j->got = open_named(j->name, &c, NULL);
}

/* An eviction names the generation it retires from before its swap; when a trip wins
 * that swap, the name is taken back: a call from before the trip is stale as usual (0),
 * not an evicted call's outcome (which would count into the next closed window). */
static void eviction_loses_to_trip(void) {
  at(7000);
  fz_config c = defaults();
  c.fails = 1;
  fz_breaker *v = open_named("v", &c, NULL);
  double t1 = fz_enter(v), t2 = fz_enter(v);
  later(5);
  open_named("u", &c, NULL);  /* fresh: v is the one idle breaker, the registry full */
  open_job j = { "x", NULL };
  parked k;
  ok(run_parked(&k, "retiring", do_open, &j), "eviction vs trip: the eviction of v parked before its swap");
  is_int(fz_done(v, t1, FZ_FAILURE, -1), 64 + FZ_CLOSED * 8 + FZ_OPEN, "eviction vs trip: a failure trips v");
  release(&k);
  ok(j.got == NULL, "eviction vs trip: nothing else to evict, x is not made");
  is_int(state(v), FZ_OPEN, "eviction vs trip: v stays, open");
  is_int(fz_done(v, t2, FZ_FAILURE, -1), 0, "eviction vs trip: a call from before the trip is stale (0)");
  remove_named("v");
  remove_named("u");
}

/* ---------------------------------------------------------------- reconfigure */

typedef struct caller {
  pthread_t th;
  fz_breaker *b;
  atomic_int *stop;
  unsigned seed;
} caller;

static void *calls(void *p) {
  caller *k = p;
  while (!atomic_load(k->stop)) {
    for (int i = 0; i < 64; i++) {
      double t = fz_enter(k->b);
      k->seed = k->seed * 1103515245u + 12345u;
      if (t > 0) fz_done(k->b, t, (k->seed >> 16) % 5 == 0 ? FZ_FAILURE : FZ_SUCCESS, (k->seed >> 20) % 3 * 0.1);
    }
    fz_stats s;
    fz_stats_read(k->b, &s);
  }
  return NULL;
}

/* A reload reconfigures a breaker while calls run (in nginx: the old workers, while the
 * master re-runs init_by_lua). Every option moves; TSan checks no access races. */
static void reconfigure_under_calls(void) {
  fz_clock_auto();
  fz_config c1 = defaults(), c2 = defaults();
  c1.fails = 50, c1.failure_rate = 0.9, c1.min_calls = 20, c1.slow = 0.15, c1.slow_rate = 0.95;
  c1.open_for = 0.01, c1.max_open_for = 1, c1.backoff = 2, c1.jitter = 0.5, c1.probes = 4;
  c2.fails = 80, c2.window = 2, c2.count_window = 100, c2.min_calls = 50, c2.probe_timeout = 0.01;
  c2.open_for = 0.02, c2.max_open_for = 0.02, c2.probes = 1;
  uint32_t id;
  fz_breaker *b = open_named("reconfigured", &c1, &id);
  atomic_int stop = 0;
  caller k[2] = { { 0, b, &stop, 1 }, { 0, b, &stop, 2 } };
  for (int i = 0; i < 2; i++) pthread_create(&k[i].th, NULL, calls, &k[i]);
  int bad = 0;
  for (int i = 0; i < 2000; i++) bad += fz_breaker_reconfigure(b, i % 2 ? &c1 : &c2) != FZ_OK;
  atomic_store(&stop, 1);
  for (int i = 0; i < 2; i++) pthread_join(k[i].th, NULL);
  is_int(bad, 0, "reconfigure under calls: 2000 reloads while 2 threads call");
  fz_config have;
  fz_breaker_config(b, &have);
  ok(have.count_window == c1.count_window && have.fails == c1.fails, "reconfigure under calls: the last options hold");
  remove_named("reconfigured");
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  fz_fault_hook = pause_hook;
  at(1000);
  is_int(fz_registry_init(2, 0, 1), FZ_OK, "a private registry of 2 slots, idle 1 s");
  fz_config c = defaults();
  open_named("pad", &c, NULL);  /* takes a never-used slot: the names below reuse the other */
  for (int what = RESET; what <= FORCE_OPEN_FOR; what++) manual_stale(what);
  for (int what = RESET; what <= FORCE_OPEN_FOR; what++) manual_interleaved(what);
  manual_anonymous();
  remove_named("pad");
  failed_probe(1);
  failed_probe(2);
  timed_out_probe();
  completed_probe();
  for (int by_reset = 0; by_reset < 2; by_reset++) {
    late_closer(0, by_reset);
    late_closer(10, by_reset);
  }
  forced_vs_trip();
  lift_races();
  evicted_mid_call();
  removed_mid_call();
  eviction_loses_to_trip();
  reconfigure_under_calls();
  return done_testing();
}

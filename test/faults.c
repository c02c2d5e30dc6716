/*
 * faults.c -- a process killed at the worst instruction never wedges a shared breaker.
 *
 * Built with the core compiled with -DFZ_FAULTS, whose fault points call fz_fault_hook.
 * For each point, a forked child (sharing the registry, as nginx workers do) sets the
 * hook to die there with _exit, drives the breaker to the point, and dies; the parent
 * then checks that the circuit recovers with real time (open_for and probe_timeout of
 * 0.1 s): a probe is admitted, or the dead probe times out and re-opens.
 *
 * Then the registry: a process killed while it holds the registry's lock, in the middle
 * of an insert, a removal or an eviction, leaves the index consistent: the next writer
 * repairs it, no name is lost or doubled, no slot leaks.
 */
#include "../csrc/fz.h"
#include "tap.h"
#include "harness.h"   /* state, kind_of */

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern void (*fz_fault_hook)(const char *where);

static const char *g_target;

static void die_at_target(const char *where) {
  if (strcmp(where, g_target) == 0) _exit(42);
}

static void sleep_s(double s) {
  struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
  nanosleep(&ts, NULL);
}

static fz_breaker *breaker(const char *name) {
  fz_config c;
  memset(&c, 0, sizeof c);
  c.window = 60, c.open_for = 0.1, c.max_open_for = 0.1, c.probe_timeout = 0.1;
  c.backoff = 1, c.fails = 1, c.min_calls = 10, c.probes = 1;
  int st;
  return fz_registry_open(name, strlen(name), &c, &st);
}

/* Runs `action` in a child that dies at `where`; returns 1 when it died there. */
static int die_in_child(const char *where, void (*action)(fz_breaker *), fz_breaker *b) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    g_target = where;
    fz_fault_hook = die_at_target;
    action(b);
    _exit(0);  /* did not reach the point */
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 42;
}

static void fail_once(fz_breaker *b) { fz_done(b, fz_enter(b), FZ_FAILURE, -1); }
static void take_probe(fz_breaker *b) { fz_enter(b); }
static void succeed_once(fz_breaker *b) { fz_done(b, fz_enter(b), FZ_SUCCESS, -1); }
static void reset_once(fz_breaker *b) { fz_reset(b); }
static void ignore_probe(fz_breaker *b) {
  double t = fz_enter(b);
  fz_done(b, t, FZ_IGNORE, -1);
}

/* After open_for, the next call is a probe and its success closes the circuit. */
static int recovers(fz_breaker *b, double wait) {
  sleep_s(wait);
  double t = fz_enter(b);
  if (kind_of(t) != 2) return 0;
  fz_done(b, t, FZ_SUCCESS, -1);
  return state(b) == FZ_CLOSED;
}

/* ---------------------------------------------------------------- the registry */

static const char *g_name;

static void open_name(fz_breaker *unused) {
  (void)unused;
  breaker(g_name);
}

static void remove_name(fz_breaker *unused) {
  (void)unused;
  fz_registry_remove(g_name, strlen(g_name));
}

/* The names registered, each found at its own slot; -1 when one is not, or is twice. */
static int consistent_names(void) {
  int n = 0;
  for (int i = 0; i < fz_registry_count(); i++) {
    fz_breaker *b = fz_registry_at(i);
    if (!b) continue;
    const char *name = fz_breaker_name(b);
    if (fz_registry_find(name, strlen(name)) != b) return -1;
    n++;
  }
  return n == fz_registry_live() ? n : -1;
}

/* How many slots fz_registry_at lists under `name` (what fuse.list and fuse.metrics walk). */
static int listed(const char *name) {
  int n = 0;
  for (int i = 0; i < fz_registry_count(); i++) {
    fz_breaker *b = fz_registry_at(i);
    if (b && strcmp(fz_breaker_name(b), name) == 0) n++;
  }
  return n;
}

static int die_opening(const char *where, const char *name) {
  g_name = name;
  return die_in_child(where, open_name, NULL);
}

/* ---- max_concurrent: a process killed at every point of taking, giving and taking back
 * a permit leaves the limit whole once a survivor took back what it held (at most every
 * 0.2 s, when the limit is reached), and never more than K permits out */

enum { PK = 3 };

static fz_breaker *g_pb;

static fz_breaker *limited(const char *name) {
  fz_config c;
  memset(&c, 0, sizeof c);
  c.window = 60, c.open_for = 10, c.max_open_for = 10, c.probe_timeout = 10;
  c.backoff = 1, c.fails = 5, c.min_calls = 10, c.probes = 1, c.max_concurrent = PK;
  int st;
  return fz_registry_open(name, strlen(name), &c, &st);
}

/* Permits the caller can take within 2 s (dead owners' come back at most every 0.2 s). */
static int take_up_to(fz_breaker *b, int want) {
  int n = 0;
  for (int i = 0; i < 200 && n < want; i++) {
    if (fz_permit_take(b, 1)) n++;
    else sleep_s(0.01);
  }
  return n;
}

static void take_then_die(fz_breaker *b) {
  void (*hook)(const char *) = fz_fault_hook;
  fz_fault_hook = NULL;
  fz_permit_take(b, 1);  /* one held, then dies taking the second */
  fz_fault_hook = hook;
  fz_permit_take(b, 1);
}

static void give_then_die(fz_breaker *b) {
  void (*hook)(const char *) = fz_fault_hook;
  fz_fault_hook = NULL;
  fz_permit_take(b, 1), fz_permit_take(b, 1);  /* two held, then dies giving one back */
  fz_fault_hook = hook;
  fz_permit_give(b);
}

/* A child that holds 2 permits and exits; then, the rest taken by the parent, another
 * child that reaches the limit takes the first one's back and dies at the point. */
static void hold_two(fz_breaker *b) {
  void (*hook)(const char *) = fz_fault_hook;
  fz_fault_hook = NULL;
  fz_permit_take(b, 1), fz_permit_take(b, 1);
  fz_fault_hook = hook;
}
static void take_when_full(fz_breaker *b) { fz_permit_take(b, 1); }

/* A child whose main thread takes 2 and whose second thread gives 1 of them back (on its
 * own lane: -1), then exits holding 1; a lane less than nothing is taken back with
 * takes, each at "reclaim-taken". */
static void *give_one(void *b) {
  fz_permit_give(b);
  return NULL;
}
static void hold_across(fz_breaker *b) {
  void (*hook)(const char *) = fz_fault_hook;
  fz_fault_hook = NULL;
  fz_permit_take(b, 1), fz_permit_take(b, 1);
  pthread_t th;
  pthread_create(&th, NULL, give_one, b);
  pthread_join(th, NULL);
  fz_fault_hook = hook;
}

/* A child that took a permit and gave it back (its lane keeps it, spare), then dies in
 * a call on it (permit-running: run stored, the lane word not yet read). */
static void spare_then_die(fz_breaker *b) {
  void (*hook)(const char *) = fz_fault_hook;
  fz_fault_hook = NULL;
  if (fz_permit_take(b, 1)) fz_permit_give(b);
  fz_fault_hook = hook;
  fz_permit_take(b, 1);
}

/* After a death: the parent can take exactly what it does not hold, then no more. */
static void limit_whole(fz_breaker *b, int held, const char *where) {
  int got = take_up_to(b, PK - held);
  is_int(got, PK - held, "%s: the limit is whole again (the parent took the %d it did not hold)", where,
         PK - held);
  is_int(fz_permit_take(b, 1), 0, "%s: and not one more than %d", where, PK);
  for (int i = 0; i < PK; i++) fz_permit_give(b);
  fz_stats s;
  fz_stats_peek(b, &s);
  is_int((int)s.running, 0, "%s: all given back, running 0", where);
}

static void permit_faults(void) {
  static const char *const takes[] = { "permit-taking", "permit-taken" };
  static const char *const gives[] = { "permit-giving", "permit-given" };
  /* permit-refreshed: after a sum of the gives that moved `seen`, before the take */
  static const char *const backs[] = { "reclaim-claimed", "reclaim-given", "permit-refreshed" };
  for (int i = 0; i < 2; i++) {
    g_pb = limited(takes[i]);
    ok(die_in_child(takes[i], take_then_die, g_pb), "permits: a process holding 1 died at %s of another", takes[i]);
    limit_whole(g_pb, 0, takes[i]);
  }
  for (int i = 0; i < 2; i++) {
    g_pb = limited(gives[i]);
    ok(die_in_child(gives[i], give_then_die, g_pb), "permits: a process holding 2 died at %s of one", gives[i]);
    limit_whole(g_pb, 0, gives[i]);
  }
  for (int i = 0; i < 3; i++) {
    g_pb = limited(backs[i]);
    ok(!die_in_child("nowhere", hold_two, g_pb), "permits: a process exited holding 2");
    ok(fz_permit_take(g_pb, 1), "the parent takes the third");
    sleep_s(0.25);  /* the next full take looks for dead owners */
    ok(die_in_child(backs[i], take_when_full, g_pb), "permits: a process died at %s, taking back the first one's",
       backs[i]);
    limit_whole(g_pb, 1, backs[i]);
  }
  g_pb = limited("permit-running");
  ok(die_in_child("permit-running", spare_then_die, g_pb), "permits: a process holding 1 spare died in a call on it");
  limit_whole(g_pb, 0, "permit-running");
  /* the parent's lane holds all K spare; a child taking marks it and dies at each point
   * of taking spare permits: the parent's next calls settle the mark (or find the permits
   * given back) */
  static const char *const steals[] = { "steal-peeking", "steal-peeked", "steal-marked", "steal-fenced",
                                        "steal-read", "steal-given" };
  for (int i = 0; i < 6; i++) {
    g_pb = limited(steals[i]);
    ok(take_up_to(g_pb, PK) == PK, "permits: the parent takes all %d", PK);
    for (int j = 0; j < PK; j++) fz_permit_give(g_pb);
    ok(die_in_child(steals[i], take_when_full, g_pb), "permits: a process died at %s, taking the parent's spare", steals[i]);
    limit_whole(g_pb, 0, steals[i]);
  }
  /* the parent runs all K calls; a child taking reads the lanes to decide its refusal
   * (exactly_full) and dies there: it held nothing, the limit is the parent's K */
  static const char *const views[] = { "permit-collecting", "permit-viewing" };
  for (int i = 0; i < 2; i++) {
    g_pb = limited(views[i]);
    ok(take_up_to(g_pb, PK) == PK, "permits: the parent runs all %d", PK);
    ok(die_in_child(views[i], take_when_full, g_pb), "permits: a process died at %s, deciding its refusal", views[i]);
    limit_whole(g_pb, PK, views[i]);
  }
  /* a lane at -1 beside one at +2, of a dead process: taken back at "reclaim-taken" by
   * a second one that dies there; the parent, holding 2, can take exactly 1 */
  g_pb = limited("reclaim-taken");
  ok(!die_in_child("nowhere", hold_across, g_pb), "permits: a process exited holding 1 (2 taken, 1 given on another thread)");
  ok(fz_permit_take(g_pb, 1) && fz_permit_take(g_pb, 1), "the parent takes the second and third");
  sleep_s(0.25);  /* the next full take looks for dead owners */
  ok(die_in_child("reclaim-taken", take_when_full, g_pb), "permits: a process died at reclaim-taken, taking back the -1 lane");
  limit_whole(g_pb, 2, "reclaim-taken");
}

static void registry_faults(void) {
  int before = consistent_names(), st;
  ok(before > 0, "registry: consistent before");

  ok(die_opening("reg-claimed", "ins-claimed"), "registry: a process died holding the lock, a slot claimed");
  fz_breaker *b = breaker("ins-claimed");
  ok(b && fz_registry_find("ins-claimed", 11) == b, "the next creation repairs and creates the name");
  is_int(consistent_names(), before + 1, "one more name, every name found (the claimed slot is free again)");

  ok(die_opening("reg-published", "ins-published"), "registry: a process died after publishing a breaker, before indexing it");
  fz_config c;
  memset(&c, 0, sizeof c);
  c.window = 60, c.open_for = 0.1, c.max_open_for = 0.1, c.probe_timeout = 0.1;
  c.backoff = 1, c.fails = 1, c.min_calls = 10, c.probes = 1;
  b = fz_registry_open("ins-published", 13, &c, &st);
  ok(b && st == 0, "the next writer indexes it: the name exists once (status 0, not created again)");
  is_int(consistent_names(), before + 2, "every name found once");

  g_name = "ins-published";
  ok(die_in_child("reg-retired", remove_name, NULL), "registry: a process died removing a name, after retiring it");
  ok(fz_registry_find("ins-published", 13) == NULL, "a retired breaker is not found meanwhile");
  ok(listed("ins-published") == 0, "nor listed (fz_registry_at: fuse.list, fuse.metrics)");
  is_int(fz_registry_remove("ins-published", 13), 0, "removing it again: repaired, it is gone");
  is_int(consistent_names(), before + 1, "every name found once, the count right");

  g_name = "ins-claimed";
  ok(die_in_child("reg-unindexed", remove_name, NULL), "registry: a process died after taking a name out of the index");
  b = breaker("ins-claimed");
  ok(b && fz_registry_find("ins-claimed", 11) == b, "the name can be created again");
  is_int(consistent_names(), before + 1, "every name found once, the count right");

  /* Fill the registry, let every breaker go idle (manual clock), and kill an eviction. */
  char name[32];
  for (int i = 0; fz_registry_live() < (int)fz_registry_capacity(); i++) {
    snprintf(name, sizeof name, "filler-%d", i);
    breaker(name);
  }
  fz_clock_manual(1e6);
  int full = consistent_names();
  ok(die_opening("reg-evicting", "evicts"), "registry: a process died evicting an idle breaker to make room");
  int shown = 0;
  for (int i = 0; i < fz_registry_count(); i++) shown += fz_registry_at(i) != NULL;
  is_int(shown, full - 1, "its victim, retired, is no longer listed meanwhile (fz_registry_at)");
  b = breaker("evicts");
  ok(b && fz_registry_find("evicts", 6) == b, "the next creation repairs, evicts and creates");
  is_int(consistent_names(), full, "still full, every name found once");

  /* Another process removes a name and creates another in its slot while this one
   * holds a handle of the first and a ticket taken from it. */
  uint32_t id;
  b = fz_registry_open_id("evicts", 6, &c, &st, &id);
  double t = fz_enter_id(b, id);
  g_name = "evicts";
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    fz_registry_remove("evicts", 6);
    breaker("other-process");
    _exit(0);
  }
  waitpid(pid, NULL, 0);
  fz_breaker *other = fz_registry_find("other-process", 13);
  ok(other == b, "registry: another process made a new name in the slot of the one removed");
  ok(fz_enter_id(b, id) == -(1 + FZ_STALE * 4), "this process's handle of the old name is stale");
  fz_done(b, t, FZ_FAILURE, -1);
  fz_stats s;
  fz_stats_read(other, &s);
  ok(s.failures_total == 0 && fz_state(other) == FZ_CLOSED, "and its ticket counted nothing in the new breaker");
  fz_clock_auto();
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (fz_registry_init(64, 1, 1.0) != FZ_OK) {
    printf("Bail out! no shared registry\n");
    return 1;
  }

  fz_breaker *b = breaker("tripped");
  ok(die_in_child("tripped", fail_once, b), "a process died right after the swap that opened the circuit");
  is_int(state(b), FZ_OPEN, "the circuit is open");
  ok(recovers(b, 0.15), "after open_for a probe is admitted and closes it (the open period was stamped first)");

  b = breaker("stamping");
  ok(die_in_child("stamping", fail_once, b), "a process died while stamping the open period, before the swap");
  is_int(state(b), FZ_CLOSED, "the circuit is still closed");
  fail_once(b);
  double t = fz_enter(b);
  ok(t < 0, "the next trip finishes the half-written stamp: the circuit stays open for open_for");
  ok(recovers(b, 0.15), "and then recovers");

  b = breaker("probe-stamped");
  fail_once(b);
  sleep_s(0.15);
  ok(die_in_child("probe-stamped", take_probe, b), "a process died after stamping a probe, before claiming its slot");
  ok(recovers(b, 0), "the slot was never taken: the next call is the probe");

  b = breaker("probe-claimed");
  fail_once(b);
  sleep_s(0.15);
  ok(die_in_child("probe-claimed", take_probe, b), "a process died holding the only probe slot");
  t = fz_enter(b);
  ok(t < 0 && (int)(-t - 1) / 4 == FZ_HALF_OPEN, "before probe_timeout the slot is still taken");
  sleep_s(0.15);
  is_int(state(b), FZ_OPEN, "after probe_timeout the dead probe counts as failed: open again");
  ok(recovers(b, 0.15), "and after open_for a new probe closes it");

  b = breaker("probe-failed");
  fail_once(b);
  sleep_s(0.15);
  ok(die_in_child("probe-failed", fail_once, b), "a process died between taking its failed probe back and re-opening");
  t = fz_enter(b);
  is_dbl(t, -(1 + FZ_OPEN * 4 + 2), 0, "the next call makes the re-open it left (and is rejected, told so)");
  ok(recovers(b, 0.15), "and after open_for a new probe closes it");

  b = breaker("probe-releasing");
  fail_once(b);
  sleep_s(0.15);
  ok(die_in_child("probe-releasing", ignore_probe, b), "a process died while giving its probe slot back");
  sleep_s(0.15);
  is_int(state(b), FZ_OPEN, "after probe_timeout the slot is free again: open");
  ok(recovers(b, 0.15), "and after open_for a new probe closes it");
  /* the success that completes `probes` dies before its close: after its swap of ho,
   * after its check of the state word, halfway through stamping the fresh window's
   * shift or era (the next closer finishes the stamp), and after the fresh window */
  static const char *const closes[] = { "probe-succeeded", "close-checked", "fresh-stamping", "era-stamping", "closing" };
  for (int i = 0; i < 5; i++) {
    b = breaker(closes[i]);
    fail_once(b);
    sleep_s(0.15);
    ok(die_in_child(closes[i], succeed_once, b), "a process died at %s, between taking its successful probe back and closing",
       closes[i]);
    ok(recovers(b, 0), "the next call is a probe whose success closes the circuit (before: half_open for good)");
  }
  /* a reset that dies after its check of the state word, or after its fresh window,
   * before its swap: the circuit is as it was, and the probe's success closes it (the
   * closer finishes the window the reset stamped); a reset then still closes a tripped
   * circuit */
  static const char *const resets[] = { "reset-checked", "reset-laid" };
  for (int i = 0; i < 2; i++) {
    b = breaker(resets[i]);
    fail_once(b);
    sleep_s(0.15);
    ok(die_in_child(resets[i], reset_once, b), "a process died at %s, between its check and its swap", resets[i]);
    is_int(state(b), FZ_HALF_OPEN, "it left the circuit as it was: half_open once open_for is over");
    ok(recovers(b, 0), "the next call is a probe whose success closes the circuit");
    fail_once(b);
    is_int(fz_reset(b), 64 + FZ_OPEN * 8 + FZ_CLOSED, "a reset of the tripped circuit closes it");
    fail_once(b);
    is_int(state(b), FZ_OPEN, "and one failure trips it again (fails = 1): its window counts");
  }
  /* the lift of a timed forced_open: one swap to half_open, then the lifter's claim */
  b = breaker("lifted");
  fz_force_open_for(b, 0.05);
  sleep_s(0.1);
  ok(die_in_child("lifted", take_probe, b), "a process died right after lifting a timed forced_open");
  is_int(state(b), FZ_HALF_OPEN, "it left the circuit half_open, no slot taken");
  ok(recovers(b, 0), "the next call is the probe, and its success closes");

  permit_faults();
  registry_faults();
  return done_testing();
}

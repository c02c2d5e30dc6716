/*
 * regcore.c -- the registry's life cycle, correct by construction (issue 15, "What
 * broke"): one test per finding, named "finding N: ...", each forcing its interleaving
 * with a pause point of the core (test/pause.h), or a process killed at a named fault
 * point (the -DFZ_FAULTS build), or the state it needs built directly.
 *
 * Each finding runs in a process of its own (forked before any registry is made), so
 * that each can make the registry it needs (fz_registry_init works only before a named
 * breaker exists); its checks are numbered on from the ones before it.
 */
#include "../csrc/fz.h"
#include "tap.h"
#include "harness.h"
#include "pause.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define STALE (-(1 + FZ_STALE * 4))

static fz_config defaults(void) {
  fz_config c;
  memset(&c, 0, sizeof c);
  c.window = 10, c.open_for = 10, c.max_open_for = 1000, c.probe_timeout = 5;
  c.backoff = 1, c.fails = 3, c.min_calls = 10, c.probes = 1;
  return c;
}

/* ---------------------------------------------------------------- processes */

/* Runs fn in a forked process; its checks are numbered on from ours and added to ours. */
static void in_process(const char *what, void (*fn)(void)) {
  int fd[2];
  if (pipe(fd) != 0) {
    printf("Bail out! pipe\n");
    exit(1);
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    fz_fault_hook = pause_hook;
    diag("%s", what);
    fn();
    int counts[2] = { tap_state()->run, tap_state()->failed };
    if (write(fd[1], counts, sizeof counts) != (ssize_t)sizeof counts) _exit(3);
    _exit(0);
  }
  close(fd[1]);
  int counts[2] = { -1, -1 }, status = 0;
  ssize_t n = read(fd[0], counts, sizeof counts);
  close(fd[0]);
  waitpid(pid, &status, 0);
  if (n != (ssize_t)sizeof counts || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    ok(0, "%s: the test process ended early (status %d)", what, status);
    return;
  }
  tap_state()->failed = counts[1];
  tap_state()->run = counts[0];
}

static const char *g_target;
static void die_at_target(const char *where) {
  if (strcmp(where, g_target) == 0) _exit(42);
}

/* Runs fn(arg) in a child that dies at fault point `where`; 1 when it died there. */
static int die_in_child(const char *where, void (*fn)(void *), void *arg) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    g_target = where;
    fz_fault_hook = die_at_target;
    fn(arg);
    _exit(0);  /* did not reach the point */
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 42;
}

static void do_open(void *name) {
  fz_config c = defaults();
  open_named(name, &c, NULL);
}

typedef struct done_job {
  fz_breaker *b;
  uint32_t id;
  int warm;      /* successes to report first, so that the stripe's word is busy */
  int outcome;
  int rc;
} done_job;

static void do_done(void *p) {
  done_job *j = p;
  for (int i = 0; i < j->warm; i++) fz_done(j->b, fz_enter_id(j->b, j->id), FZ_SUCCESS, -1);
  j->rc = fz_done(j->b, fz_enter_id(j->b, j->id), j->outcome, -1);
}


/* ---------------------------------------------------------------- finding 4 */

/* A child that pauses at one fault point (until the parent writes a byte) and dies at
 * another: a process killed right after its late stores. */
static int g_to_parent[2], g_to_child[2];
static const char *g_pause_at, *g_die_at;

static void pause_then_die(const char *where) {
  char x = 1;
  if (g_pause_at && strcmp(where, g_pause_at) == 0) {
    g_pause_at = NULL;
    if (write(g_to_parent[1], &x, 1) != 1 || read(g_to_child[0], &x, 1) != 1) _exit(3);
  } else if (strcmp(where, g_die_at) == 0) {
    _exit(42);
  }
}

/* Forks a child that runs fn(arg), pausing at `pause_at` (it writes a byte to the
 * parent, then waits for one) and dying at `die_at`. The child's pid. */
static pid_t fork_pause_then_die(const char *pause_at, const char *die_at, void (*fn)(void *), void *arg) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    g_pause_at = pause_at, g_die_at = die_at;
    fz_fault_hook = pause_then_die;
    fn(arg);
    _exit(0);
  }
  return pid;
}

static void do_force_for_10(void *b) { fz_force_open_for(b, 10); }

/* A timed force-open whose stamper is late: it claimed the stamp of its generation, then
 * stalled while another force-open finished that stamp and entered forced_open, a reset
 * closed the breaker and a third force-open stamped and entered a newer forced_open.
 * The late stamper then writes, and is killed before it does anything else. (At
 * 4a88316 its plain stores set the stamp's generation back: the newer forced_open had
 * no end any more, forced for ever with retry_after 0.) */
static void finding4(void) {
  if (fz_registry_init(4, 1, 0) != FZ_OK || pipe(g_to_parent) || pipe(g_to_child)) {
    ok(0, "finding 4: a shared registry");
    return;
  }
  fz_config c = defaults();
  at(1000);
  fz_breaker *b = open_named("forced", &c, NULL);
  pid_t pid = fork_pause_then_die("forced-stamping", "forced-stamped", do_force_for_10, b);
  char x = 0;
  ok(read(g_to_parent[0], &x, 1) == 1, "finding 4: the late stamper stalled while stamping its end");
  ok(fz_force_open_for(b, 5) > 0, "finding 4: another force-open finishes that stamp and wins");
  ok(fz_reset(b) > 0, "finding 4: a reset");
  ok(fz_force_open_for(b, 5) > 0, "finding 4: a newer timed force-open, 5 s");
  x = 1;
  ok(write(g_to_child[1], &x, 1) == 1, "finding 4: the late stamper goes on");
  int status = 0;
  waitpid(pid, &status, 0);
  ok(WIFEXITED(status) && WEXITSTATUS(status) == 42, "finding 4: and is killed right after its stamp");
  is_int(state(b), FZ_FORCED_OPEN, "finding 4: forced open");
  is_dbl(fz_retry_after(b), 5, 1e-6, "finding 4: a late stamp never unstamps a newer forced_open (5 s left)");
  later(6);
  is_int(state(b), FZ_HALF_OPEN, "finding 4: lifted after its 5 s: the breaker is not wedged");
}

/* ---------------------------------------------------------------- findings 14, 15 */

static long g_probes;
static void count_probes(const char *where) {
  if (strcmp(where, "reg-probe") == 0) g_probes++;
}

/* The inverse of an odd number mod 2^64 (Newton). */
static uint64_t inverse(uint64_t a) {
  uint64_t x = a;
  for (int i = 0; i < 6; i++) x *= 2 - a * x;
  return x;
}

/* The hash of 4a88316 (no key) of an 8-byte name w, and its index tag. */
static uint32_t old_tag(uint64_t w) {
  uint64_t h = (UINT64_C(0x9e3779b97f4a7c15) ^ 8 ^ w) * UINT64_C(0xff51afd7ed558ccd);
  h ^= h >> 32;
  h *= UINT64_C(0xc4ceb9fe1a85ec53);
  h ^= h >> 29;
  return (uint32_t)(h >> 32) | 1u;
}

/* An 8-byte name whose old hash has the tag `tag` in its low 16 bits (so the same home in
 * an index of up to 65536 words) and `salt` in bits 48-63: made by running the old hash
 * backwards, as an attacker would offline. 0 when the bytes hold a NUL (try another). */
static uint64_t colliding_name(uint32_t tag16, uint64_t salt) {
  uint64_t h = (uint64_t)tag16 << 32 | salt << 48 | (salt * UINT64_C(0x2545f4914f6cdd1d) & 0xffffffffu);
  h ^= h >> 29 ^ h >> 58;                     /* undo h ^= h >> 29 */
  h *= inverse(UINT64_C(0xc4ceb9fe1a85ec53));
  h ^= h >> 32;                               /* undo h ^= h >> 32 */
  uint64_t w = h * inverse(UINT64_C(0xff51afd7ed558ccd)) ^ UINT64_C(0x9e3779b97f4a7c15) ^ 8;
  for (int i = 0; i < 8; i++)
    if (!(w >> (8 * i) & 0xff)) return 0;
  return w;
}

/* Probes per lookup of every name in names[n], found or (missing) not. */
static double probes_per_lookup(const char (*names)[9], int n) {
  fz_fault_hook = count_probes;
  g_probes = 0;
  for (int i = 0; i < n; i++) fz_registry_find(names[i], strlen(names[i]));
  fz_fault_hook = pause_hook;
  return (double)g_probes / n;
}

enum { NCOLLIDE = 20000 };
static char g_names[65536][9];

static void finding14(void) {
  if (fz_registry_init(NCOLLIDE, 0, 0) != FZ_OK) {
    ok(0, "finding 14: a registry of 20,000 slots");
    return;
  }
  int n = 0;
  for (uint64_t salt = 1; n < NCOLLIDE; salt++) {
    uint64_t w = colliding_name(0x1235, salt);
    if (!w) continue;
    memcpy(g_names[n], &w, 8);
    n += old_tag(w) == (old_tag(w) & 0xffff0000u) + 0x1235u;
  }
  ok(1, "finding 14: 20,000 names that share one home under the unkeyed hash of 4a88316");
  fz_config c = defaults();
  int made = 0;
  for (int i = 0; i < NCOLLIDE; i++) made += open_named(g_names[i], &c, NULL) != NULL;
  is_int(made, NCOLLIDE, "finding 14: all registered");
  double p = probes_per_lookup((const char (*)[9])g_names, NCOLLIDE);
  ok(p < 4, "finding 14: keyed hash: names chosen offline do not collide (%.1f index words a lookup)", p);
}

/* Random names at the maximal load (capacity names, 2 * capacity index words): with
 * every word a possible home, a lookup reads about 1.5 words (linear probing at load
 * 1/2); with only odd homes (4a88316) the homes are twice as loaded. */
static void finding15(void) {
  enum { N = 65536 };
  if (fz_registry_init(N, 0, 0) != FZ_OK) {
    ok(0, "finding 15: a registry of 65536 slots");
    return;
  }
  fz_config c = defaults();
  for (int i = 0; i < N; i++) {
    snprintf(g_names[i], sizeof g_names[i], "n%07d", i);
    open_named(g_names[i], &c, NULL);
  }
  double hit = probes_per_lookup((const char (*)[9])g_names, N);
  for (int i = 0; i < N; i++) snprintf(g_names[i], sizeof g_names[i], "m%07d", i);
  double miss = probes_per_lookup((const char (*)[9])g_names, N);
  ok(hit < 1.58 && miss < 2.62, "finding 15: hash homes use the whole index (%.2f words a hit, %.2f a miss)", hit, miss);
}

/* ---------------------------------------------------------------- findings 5, 6 */

static fz_config cw_config(uint32_t n, uint32_t fails) {
  fz_config c = defaults();
  c.count_window = n, c.fails = fails;
  return c;
}

static void do_reload(void *capacity) { fz_registry_init((uint32_t)(uintptr_t)capacity, 1, 0); }

/* A reload (new capacity: the breakers are copied into a new mapping) while an old worker
 * records a failure between the copy of the breaker and the copy of its ring. The copy's
 * count window must agree with itself: at 4a88316 its aggregate lacked the failure its
 * ring held, the failure field went below 0 (2047) when that slot was displaced, and a
 * success opened the breaker. */
static void finding5(void) {
  if (fz_registry_init(4, 1, 0) != FZ_OK) {
    ok(0, "finding 5: a shared registry");
    return;
  }
  fz_config c = cw_config(3, 3);
  at(1000);
  fz_breaker *old = open_named("cw", &c, NULL);
  for (int i = 0; i < 3; i++) fz_done(old, fz_enter(old), FZ_SUCCESS, -1);
  parked k;
  ok(run_parked(&k, "migrating", do_reload, (void *)(uintptr_t)8), "finding 5: a reload parked between a breaker's words and its ring");
  fz_done(old, fz_enter(old), FZ_FAILURE, -1);  /* an old worker, meanwhile */
  release(&k);
  uint32_t id;
  fz_breaker *nb = fz_registry_find_id("cw", 2, &id);
  ok(nb && nb != old, "finding 5: the new mapping holds a copy");
  fz_stats st = peek(nb);
  ok(st.failures <= 1 && st.calls <= 3, "finding 5: the copy's window agrees with itself (%u calls, %u failures)", st.calls,
     st.failures);
  int opened = 0;
  for (int i = 0; i < 3; i++) opened |= fz_done(nb, fz_enter_id(nb, id), FZ_SUCCESS, -1) != 0;
  ok(!opened && state(nb) == FZ_CLOSED, "finding 5: reload migration under calls: successes never open it");
  is_int(peek(nb).failures, 0, "finding 5: three successes displaced the window");
}

/* The name is kept once, in the slot's meta (the breaker holds the offset to it): a
 * breaker answers its slot's name, the longest name whole; a slot reused by another name
 * answers that name through any handle of it (as the breaker's own copy did); a reload's
 * copy answers its name from the new mapping, and the old mapping's breaker still its
 * own; an anonymous breaker answers "". */
static void names_once(void) {
  if (fz_registry_init(2, 1, 0) != FZ_OK) {
    ok(0, "names: a shared registry");
    return;
  }
  fz_config c = defaults();
  char longest[FZ_NAME_MAX + 1];
  memset(longest, 'n', FZ_NAME_MAX);
  longest[FZ_NAME_MAX] = 0;
  fz_breaker *a = open_named(longest, &c, NULL), *b = open_named("b", &c, NULL);
  ok(a && strcmp(fz_breaker_name(a), longest) == 0, "names: the longest name (%d bytes) comes back whole", FZ_NAME_MAX);
  ok(b && strcmp(fz_breaker_name(b), "b") == 0, "names: a one-byte name");
  ok(remove_named("b") == 1, "names: b removed");
  fz_breaker *c2 = open_named("c", &c, NULL);
  ok(c2 == b && strcmp(fz_breaker_name(b), "c") == 0, "names: b's slot reused by c answers c");
  is_int(fz_registry_init(64, 1, 0), FZ_OK, "names: a reload with another capacity (another layout) copies the breakers");
  fz_breaker *na = fz_registry_find(longest, FZ_NAME_MAX), *nc = fz_registry_find("c", 1);
  ok(na && na != a && strcmp(fz_breaker_name(na), longest) == 0, "names: the copy of the longest answers it");
  ok(nc && nc != c2 && strcmp(fz_breaker_name(nc), "c") == 0, "names: the copy of c answers c");
  ok(strcmp(fz_breaker_name(a), longest) == 0, "names: the old mapping's breaker still answers its own");
  fz_breaker *anon = fz_breaker_new(&c, NULL);
  ok(anon && strcmp(fz_breaker_name(anon), "") == 0, "names: an anonymous breaker answers \"\"");
  fz_breaker_free(anon);
}

typedef struct cw_job {
  fz_breaker *b;
  int rc;
} cw_job;

static void do_fail_cw(void *p) {
  cw_job *j = p;
  j->rc = fz_done(j->b, fz_enter(j->b), FZ_FAILURE, -1);
}

/* A reload shrinks a count window (10 -> 5) while a call records into it, between its
 * read of the ring's size and its write. Nothing of that call may stay in a ring position
 * the new window never overwrites (at 4a88316 the breaker then opened on 4 of 5 failures
 * for ever after). */
static void finding6(void) {
  if (fz_registry_init(4, 0, 0) != FZ_OK) {
    ok(0, "finding 6: a registry");
    return;
  }
  fz_config c10 = cw_config(10, 10), c5 = cw_config(5, 5);
  at(1000);
  fz_breaker *b = open_named("shrinks", &c10, NULL);
  for (int i = 0; i < 7; i++) fz_done(b, fz_enter(b), FZ_SUCCESS, -1);  /* the next position is 7 */
  cw_job j = { b, -1 };
  parked k;
  ok(run_parked(&k, "cw-sized", do_fail_cw, &j), "finding 6: a failure parked after reading the ring's size");
  is_int(fz_breaker_reconfigure(b, &c5), FZ_OK, "finding 6: a reload makes the window 5 calls");
  release(&k);
  for (int i = 0; i < 5; i++) fz_done(b, fz_enter(b), FZ_SUCCESS, -1);
  is_int(peek(b).failures, 0, "finding 6: five successes later, no failure is left in the window");
  int rc = 0;
  for (int i = 0; i < 4; i++) rc |= fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  is_int(rc, 0, "finding 6: a count window shrunk during a call: 4 of 5 failures do not open it");
  is_int(fz_done(b, fz_enter(b), FZ_FAILURE, -1), code(FZ_CLOSED, FZ_OPEN), "finding 6: the 5th does");
}

/* ---------------------------------------------------------------- findings 7, 8, 9 */

static fz_config idle_config(void) {
  fz_config c = defaults();
  c.fails = 1;
  return c;
}

/* An eviction lands while fz_done records a failure: the outcome is the name's
 * (FZ_ESTALE, for fz_late_id), not lost with a 0. */
static void finding7(void) {
  fz_config c = idle_config();
  uint32_t id, id_e2;
  at(1000);
  fz_breaker *e = open_named("e", &c, &id);
  later(5);  /* e is idle, and the call below leaves it closed with nothing counted yet */
  done_job j = { e, id, 0, FZ_FAILURE, -1 };
  parked k;
  ok(run_parked(&k, "recording", do_done, &j), "finding 7: a failure's report parked while it records");
  fz_breaker *f = open_named("f", &c, NULL);  /* full: evicts e (idle) */
  ok(f == e, "finding 7: an eviction retired e meanwhile (f took the slot)");
  release(&k);
  is_int(j.rc, FZ_ESTALE, "finding 7: an eviction during fz_done gives FZ_ESTALE, the outcome is not lost");
  is_int(peek(f).failures_total, 0, "finding 7: nothing counted into f");
  remove_named("f");
  fz_breaker *e2 = open_named("e", &c, &id_e2);
  is_int(fz_late_id(e2, id_e2, FZ_FAILURE, -1), code(FZ_CLOSED, FZ_OPEN), "finding 7: fz_late_id counts it into e again");
  remove_named("e");
}

/* A call outlives two evictions of its slot: its outcome is still the name's. */
static void finding8(void) {
  fz_config c = idle_config();
  uint32_t id;
  at(2000);
  fz_breaker *e = open_named("e", &c, &id);
  double t = fz_enter_id(e, id);
  later(5);
  open_named("f", &c, NULL);  /* evicts e */
  later(5);
  fz_breaker *g = open_named("g", &c, NULL);  /* evicts f */
  ok(g == e && !fz_registry_find("f", 1), "finding 8: the slot was evicted twice while the call ran");
  is_int(fz_done(e, t, FZ_FAILURE, -1), FZ_ESTALE, "finding 8: a call that outlives two evictions still gets FZ_ESTALE");
  is_int(peek(g).failures_total, 0, "finding 8: nothing counted into g");
  remove_named("g");
}

static void finding78(void) {
  if (fz_registry_init(1, 0, 1) != FZ_OK) {
    ok(0, "findings 7, 8: a registry of one slot, idle 1 s");
    return;
  }
  finding7();
  finding8();
}

/* An eviction killed before its swap: the breaker lives on, and nothing of the eviction
 * may act on it (at 4a88316 its mark stayed, and after a reset an old call answered
 * FZ_ESTALE, to be counted into the fresh window). */
static void finding9(void) {
  if (fz_registry_init(1, 1, 1) != FZ_OK) {
    ok(0, "finding 9: a shared registry of one slot, idle 1 s");
    return;
  }
  fz_config c = idle_config();
  uint32_t id;
  at(1000);
  fz_breaker *v = open_named("v", &c, &id);
  double t = fz_enter_id(v, id);
  later(5);
  ok(die_in_child("retiring", do_open, (void *)(uintptr_t)"x"), "finding 9: an eviction of v was killed before its swap");
  is_int(state(v), FZ_CLOSED, "finding 9: v lives on");
  ok(fz_reset_id(v, id) > 0, "finding 9: a reset (it repairs the registry first)");
  is_int(fz_done(v, t, FZ_FAILURE, -1), 0, "finding 9: a killed eviction's mark never makes an old call FZ_ESTALE");
  ok(fz_reset(v) > 0, "finding 9: a plain reset, no repair");
  t = fz_enter_id(v, id);
  later(5);
  ok(die_in_child("retiring", do_open, (void *)(uintptr_t)"y"), "finding 9: another eviction killed before its swap");
  ok(fz_reset(v) > 0, "finding 9: a reset (no lock, no repair)");
  is_int(fz_done(v, t, FZ_FAILURE, -1), 0, "finding 9: a tentative mark is not an eviction either");
  is_int(peek(v).failures, 0, "finding 9: nothing counted in v's fresh window");
}

/* ---------------------------------------------------------------- finding 10 */

static void do_event(void *unused) {
  (void)unused;
  fz_events_add("dying", 5, FZ_CLOSED, FZ_OPEN);
}

/* A process killed right after claiming its journal entry: in-order readers must not
 * wait on that entry for ever. (At 4a88316 it stayed "being written": fz_events_read
 * answered 0, not complete yet, until 1,024 more events were written.) */
static void finding10(void) {
  if (fz_events_init_shared() != FZ_OK) {
    ok(0, "finding 10: a shared events ring");
    return;
  }
  double before = fz_events_add("before", 6, FZ_CLOSED, FZ_OPEN);
  ok(die_in_child("event-claimed", do_event, NULL), "finding 10: a writer died right after claiming its entry");
  double dead = fz_events_last();
  is_dbl(dead, before + 1, 0, "finding 10: its seq was taken");
  double after = fz_events_add("after", 5, FZ_OPEN, FZ_HALF_OPEN);
  fz_event ev;
  is_int(fz_events_read(dead, &ev), -1, "finding 10: a dead writer's claim is taken back: the entry reads as lost");
  is_int(fz_events_read(after, &ev), 1, "finding 10: and the next event is delivered");
  ok(strcmp(ev.name, "after") == 0, "finding 10: it is the event written after");
}

/* A process killed after its event's seq was counted in the ring's head and before its
 * entry was claimed: in-order readers must not wait on that entry for ever either. (At
 * 82f25ab the entry kept an older seq, unclaimed, and no owner: fz_events_read answered 0,
 * not complete yet, until 1,024 more events were written, and fuse.watch stalled in
 * every worker until then.) */
static void finding17(void) {
  if (fz_events_init_shared() != FZ_OK) {
    ok(0, "finding 17: a shared events ring");
    return;
  }
  double before = fz_events_add("before", 6, FZ_CLOSED, FZ_OPEN);
  ok(die_in_child("event-seq-taken", do_event, NULL), "finding 17: a writer died between taking its seq and claiming");
  double after = fz_events_add("after", 5, FZ_OPEN, FZ_HALF_OPEN);
  is_dbl(fz_events_last(), after, 0, "finding 17: the newest seq is the event written after");
  fz_event ev;
  int rc;
  for (double seq = before + 1; seq < after; seq++) {
    rc = fz_events_read(seq, &ev);
    is_int(rc, -1, "finding 17: seq %.0f, the dead writer's, reads as lost (not 'being written')", seq);
  }
  is_int(fz_events_read(after, &ev), 1, "finding 17: and the next event is delivered");
  ok(strcmp(ev.name, "after") == 0, "finding 17: it is the event written after");
}

static void do_event_named(void *name) {
  fz_events_add(name, strlen(name), FZ_OPEN, FZ_HALF_OPEN);
}

/* Two writers race for one entry and the winner is killed right after its claim. Both
 * had said who they were before their claim's swap, and the loser said it last: readers
 * must still see the claim as the dead winner's and take it back at once. (At 1fb4fcc
 * the entry's owner was the loser, alive: fz_events_read answered 0, "being written",
 * until the 10 s stall limit, and fuse.watch waited that long in every worker.) */
static void event_race(void) {
  if (fz_events_init_shared() != FZ_OK || pipe(g_to_parent) || pipe(g_to_child)) {
    ok(0, "event race: a shared events ring");
    return;
  }
  double before = fz_events_add("before", 6, FZ_CLOSED, FZ_OPEN);
  pid_t pid = fork_pause_then_die("event-claiming", "event-claimed", do_event, NULL);
  char x = 0;
  ok(read(g_to_parent[0], &x, 1) == 1, "event race: a writer (another process) stopped before its claim's swap");
  fz_fault_hook = pause_hook;
  parked k;
  static char second[] = "second";
  ok(run_parked(&k, "event-claiming", do_event_named, second),
     "event race: a second writer stopped there too, for the same entry");
  x = 1;
  ok(write(g_to_child[1], &x, 1) == 1, "event race: the first writer goes on");
  int status = 0;
  waitpid(pid, &status, 0);
  ok(WIFEXITED(status) && WEXITSTATUS(status) == 42, "event race: its swap won the entry, and it was killed right after");
  release(&k);
  fz_fault_hook = NULL;
  fz_event ev;
  is_dbl(fz_events_last(), before + 2, 0, "event race: the second writer took the next entry");
  is_int(fz_events_read(before + 1, &ev), -1,
         "event race: the dead winner's entry reads as lost at once (not 'being written' until the stall limit)");
  is_int(fz_events_read(before + 2, &ev), 1, "event race: and the second writer's event is delivered");
  ok(strcmp(ev.name, "second") == 0, "event race: it is the second writer's (%s)", ev.name);
}

/* ---------------------------------------------------------------- finding 11 */

/* A breaker with a 0.01 s window (1 ms buckets) idle for 26 days is evictable. (At
 * 4a88316 the last use was a 32-bit bucket difference, negative past 24.8 days: never
 * evictable again, and the registry stayed full.) */
static void finding11(void) {
  if (fz_registry_init(1, 0, 1) != FZ_OK) {
    ok(0, "finding 11: a registry of one slot, idle 1 s");
    return;
  }
  fz_config c = defaults();
  c.window = 0.01;
  at(1000);
  fz_breaker *old = open_named("old", &c, NULL);
  fz_done(old, fz_enter(old), FZ_SUCCESS, -1);
  later(26 * 86400.0);
  double ev = fz_registry_evictions_total();
  ok(open_named("new", &c, NULL) != NULL, "finding 11: a breaker idle 26 days (1 ms buckets) is evicted for a new one");
  is_dbl(fz_registry_evictions_total() - ev, 1, 0, "finding 11: one eviction");
  ok(fz_registry_find("old", 3) == NULL, "finding 11: the idle one is gone");
}

/* ---------------------------------------------------------------- finding 12 */

/* A reload that changes capacity (nginx's master: a new mapping, live breakers copied)
 * keeps fuse_registry_full_total and the evictions total. (At 4a88316 both went back
 * to 0.) */
static void finding12(void) {
  if (fz_registry_init(1, 1, 1) != FZ_OK) {
    ok(0, "finding 12: a shared registry of one slot, idle 1 s");
    return;
  }
  fz_config c = defaults();
  at(1000);
  open_named("first", &c, NULL);
  later(5);
  open_named("second", &c, NULL);  /* evicts first */
  for (int i = 0; i < 3; i++) fz_registry_full_add();
  is_dbl(fz_registry_evictions_total(), 1, 0, "finding 12: one eviction before the reload");
  is_int(fz_registry_init(8, 1, 2), FZ_OK, "finding 12: a reload with another capacity and idle");
  is_dbl(fz_registry_full_total(), 3, 0, "finding 12: totals carried across migration (full)");
  is_dbl(fz_registry_evictions_total(), 1, 0, "finding 12: totals carried across migration (evictions)");
  ok(fz_registry_find("second", 6) != NULL, "finding 12: and the breaker");
}

/* ---------------------------------------------------------------- finding 13 */

static long g_scanned;
static void count_scans(const char *where) {
  if (strcmp(where, "reg-scan") == 0) g_scanned++;
}

/* A full registry of breakers with a failure in their window (never evictable), idle
 * long past: a creation must look at a bounded number of slots under the lock, whatever
 * the capacity (4a88316 scanned all of them). */
static void finding13(void) {
  enum { N = 4096 };
  if (fz_registry_init(N, 0, 1) != FZ_OK) {
    ok(0, "finding 13: a registry of 4096 slots, idle 1 s");
    return;
  }
  at(1000);
  fz_config c = defaults();
  char name[32];
  for (int i = 0; i < N; i++) {
    snprintf(name, sizeof name, "busy-%d", i);
    fz_breaker *b = open_named(name, &c, NULL);
    fz_done(b, fz_enter(b), FZ_FAILURE, -1);
  }
  later(5);
  fz_fault_hook = count_scans;
  g_scanned = 0;
  ok(open_named("one-more", &c, NULL) == NULL, "finding 13: full, nothing evictable: not created");
  fz_fault_hook = pause_hook;
  ok(g_scanned > 0 && g_scanned <= 256, "finding 13: creation looks at a bounded number of slots (%ld of %d)",
     g_scanned, N);
}

/* ---------------------------------------------------------------- finding 16 */

static long g_waits;
static void count_waits(const char *where) {
  if (strcmp(where, "counter-waiting") == 0) g_waits++;
}

static void do_counter(void *name) { fz_counter_open(name, strlen(name)); }

/* A process killed between its claim of a shared counter's slot and publishing the name:
 * later opens of that name take the claim over at once (who claimed it is dead), with no
 * wait (at 4a88316 every later open of the name spun about 40 ms first, and the slot was
 * lost). */
static void finding16_counter(void) {
  const char *name = "finding16:dead-claim";
  ok(die_in_child("counter-claimed", do_counter, (void *)(uintptr_t)name), "finding 16: a process died claiming a counter");
  fz_fault_hook = count_waits;
  g_waits = 0;
  int i = fz_counter_open(name, strlen(name));
  int again = fz_counter_open(name, strlen(name));
  fz_fault_hook = pause_hook;
  ok(i >= 0 && again == i, "finding 16: the name opens, to one slot");
  is_int(g_waits, 0, "finding 16: a dead claimer's counter slot is taken over without waiting");
  ok(fz_counter_name(i) && strcmp(fz_counter_name(i), name) == 0, "finding 16: and it holds the name");
}

/* Creations into slots never used, while another thread reads every slot the way
 * fz_registry_at's callers do (TSan: at 4a88316 a never-used slot was built in place
 * with plain stores while readers loaded its identity and state word atomically). */
static atomic_int g_stop;
static void *read_slots(void *unused) {
  (void)unused;
  while (!atomic_load(&g_stop))
    for (int i = 0; i < fz_registry_count(); i++) {
      fz_breaker *b = fz_registry_at(i);
      if (b) (void)fz_breaker_id(b), (void)fz_state(b);
    }
  return NULL;
}

static void finding16_init(void) {
  if (fz_registry_init(512, 0, 0) != FZ_OK) {
    ok(0, "finding 16: a registry");
    return;
  }
  pthread_t th;
  thread_start(&th, read_slots, NULL);
  fz_config c = defaults();
  char name[32];
  int made = 0;
  for (int i = 0; i < 512; i++) {
    snprintf(name, sizeof name, "fresh-%d", i);
    made += open_named(name, &c, NULL) != NULL;
  }
  atomic_store(&g_stop, 1);
  pthread_join(th, NULL);
  is_int(made, 512, "finding 16: never-used slots are built with atomic stores while read (TSan)");
}

static void finding16(void) {
  finding16_counter();
  finding16_init();
}

/* ---------------------------------------------------------------- finding 3 */

/* A reuse of a slot killed after the new breaker's words are stored, before its identity
 * is published. The identity must not restart: the next breaker of the slot gets a new
 * one, and a handle of the slot's first breaker stays stale. (At 4a88316 the reuse
 * stored identity 0; repair freed the slot with 0, and the next creation published 1:
 * the first breaker's handle was live again, on another name.) */
static void finding3(void) {
  if (fz_registry_init(1, 1, 0) != FZ_OK) {
    ok(0, "finding 3: a shared registry of one slot");
    return;
  }
  fz_config c = defaults();
  uint32_t id1, id3;
  fz_breaker *first = open_named("first", &c, &id1);
  remove_named("first");
  ok(die_in_child("reg-initialised", do_open, (void *)(uintptr_t)"second"),
     "finding 3: a process died reusing the slot, before publishing the identity");
  fz_breaker *third = open_named("third", &c, &id3);
  ok(third == first, "finding 3: the next creation repaired the registry and took the slot");
  ok(id3 != id1 && id3 > id1, "finding 3: identity never repeats after a kill during reuse (%u, then %u)",
     id1, id3);
  is_int(fz_enter_id(first, id1), STALE, "finding 3: the first breaker's handle stays stale");
  is_int(peek(third).calls + peek(third).rejections, 0, "finding 3: nothing of it reached the new breaker");
}

/* ---------------------------------------------------------------- finding 1 */

/* A call's report parked after its ticket was checked (current), while its breaker is
 * removed and the slot goes to another name: nothing of it may count there. */
static void finding1_at(const char *point, int warm, int outcome) {
  fz_config c = defaults();
  c.fails = 1;
  uint32_t id, zid;
  fz_breaker *a = open_named("a", &c, &id);
  done_job j = { a, id, warm, outcome, -1 };
  parked k;
  ok(run_parked(&k, point, do_done, &j), "finding 1 (%s): the report parked after its ticket was checked", point);
  remove_named("a");
  fz_breaker *z = open_named("z", &c, &zid);
  ok(z == a, "finding 1 (%s): z took a's slot", point);
  release(&k);
  fz_stats st = peek(z);
  is_int(st.successes_total + st.failures_total, 0, "finding 1 (%s): a late fz_done never counts into another name", point);
  is_int(st.calls, 0, "finding 1 (%s): z's window is empty", point);
  is_int(state(z), FZ_CLOSED, "finding 1 (%s): z is still closed", point);
  remove_named("z");
}

static void finding1(void) {
  if (fz_registry_init(1, 0, 0) != FZ_OK) {
    ok(0, "finding 1: a registry of one slot");
    return;
  }
  at(1000);
  finding1_at("recording", 0, FZ_FAILURE);  /* done_slow, then closed_record */
  finding1_at("done-fast", 100, FZ_SUCCESS);  /* the hot path's one add */
}

/* ---------------------------------------------------------------- finding 2 */

typedef struct enter_job {
  fz_breaker *b;
  uint32_t id;
  double ticket;
} enter_job;

static void do_enter_id(void *p) {
  enter_job *j = p;
  j->ticket = fz_enter_id(j->b, j->id);
}

/* The name's slot passes to another name (closed) while the call is parked. */
static fz_breaker *take_over(const char *old, const char *other, uint32_t *id) {
  fz_config c = defaults();
  remove_named(old);
  return open_named(other, &c, id);
}

/* After the call that was parked at `point` returns: it is the stale code, and the
 * ticket (had it been one) counts nothing into the breaker that took the slot. */
static void no_cross_admission(const char *how, enter_job *j, fz_breaker *z) {
  is_int(j->ticket, STALE, "finding 2 (%s): the call re-checks the identity and answers stale", how);
  if (j->ticket > 0) fz_done(z, j->ticket, FZ_FAILURE, -1);
  is_int(peek(z).failures_total, 0, "finding 2 (%s): no ticket of the other name was issued", how);
  is_int(state(z), FZ_CLOSED, "finding 2 (%s): the other name is untouched", how);
}

/* claim_probe re-reads the state word after claiming a probe slot: a slot taken over
 * meanwhile must not make it hand out the new breaker's closed ticket. */
static void finding2_probe(void) {
  fz_config c = defaults();
  c.fails = 1;
  uint32_t id, zid;
  at(1000);
  fz_breaker *a = open_named("a", &c, &id);
  fz_done(a, fz_enter(a), FZ_FAILURE, -1);
  later(11);
  is_int(state(a), FZ_HALF_OPEN, "finding 2 (probe): a is half_open");
  enter_job j = { a, id, 0 };
  parked k;
  ok(run_parked(&k, "probe-claimed", do_enter_id, &j), "finding 2 (probe): parked after claiming a probe slot");
  fz_breaker *z = take_over("a", "z", &zid);
  ok(z == a, "finding 2 (probe): z took a's slot");
  release(&k);
  no_cross_admission("probe", &j, z);
  remove_named("z");
}

/* settle re-reads the state word after making open -> half_open; enter_slow's switch
 * then issued a ticket of whatever state it read. */
static void finding2_settle(void) {
  fz_config c = defaults();
  c.fails = 1;
  uint32_t id, zid;
  at(2000);
  fz_breaker *a = open_named("a", &c, &id);
  fz_done(a, fz_enter(a), FZ_FAILURE, -1);
  later(11);
  enter_job j = { a, id, 0 };
  parked k;
  ok(run_parked(&k, "settling", do_enter_id, &j), "finding 2 (settle): parked after open -> half_open");
  fz_breaker *z = take_over("a", "z", &zid);
  ok(z == a, "finding 2 (settle): z took a's slot");
  release(&k);
  no_cross_admission("settle", &j, z);
  remove_named("z");
}

/* lift_forced re-reads the state word when its swap fails (here: the slot was taken
 * over); the state read is the other name's closed one. */
static void finding2_lift(void) {
  fz_config c = defaults();
  uint32_t id, zid;
  at(3000);
  fz_breaker *a = open_named("a", &c, &id);
  ok(fz_force_open_for_id(a, id, 5) > 0, "finding 2 (lift): a is forced open for 5 s");
  later(6);
  enter_job j = { a, id, 0 };
  parked k;
  ok(run_parked(&k, "lifting", do_enter_id, &j), "finding 2 (lift): parked before lifting the forced_open");
  fz_breaker *z = take_over("a", "z", &zid);
  ok(z == a, "finding 2 (lift): z took a's slot");
  release(&k);
  no_cross_admission("lift", &j, z);
  remove_named("z");
}

static void finding2(void) {
  if (fz_registry_init(1, 0, 0) != FZ_OK) {
    ok(0, "finding 2: a registry of one slot");
    return;
  }
  finding2_probe();
  finding2_settle();
  finding2_lift();
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  in_process("finding 1: a late fz_done never counts into another name", finding1);
  in_process("finding 2: no ticket of another name from a re-read state word", finding2);
  in_process("finding 4: a timed force-open never wedges after a late stamper is killed", finding4);
  in_process("finding 5: a reload's copy of a count window agrees with itself", finding5);
  in_process("finding 6: a count window shrunk during a call", finding6);
  in_process("findings 7, 8: late outcomes of evicted calls are the name's", finding78);
  in_process("finding 9: a killed eviction leaves no mark on a breaker that lives on", finding9);
  in_process("finding 10: a journal entry of a dead writer is taken back", finding10);
  in_process("finding 17: a dead writer's unclaimed journal entry is taken back", finding17);
  in_process("event race: the winner of a raced entry is killed after its claim", event_race);
  in_process("finding 11: a long idle time is never too long to evict", finding11);
  in_process("finding 12: totals carried across migration", finding12);
  in_process("finding 13: a creation's eviction scan is bounded", finding13);
  in_process("finding 14: names chosen offline cannot be made to collide", finding14);
  in_process("finding 15: hash homes use the whole index", finding15);
  in_process("finding 16: no wait on a dead counter claim; no plain stores into a slot being read", finding16);
  in_process("finding 3: identity never repeats after a kill during reuse", finding3);
  in_process("names: kept once, in the slot's meta", names_once);
  return done_testing();
}

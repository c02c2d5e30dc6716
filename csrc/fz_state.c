/*
 * fz_state.c -- the fuse circuit-breaker core: the state machine (transitions,
 * admission, outcomes, manual states) and what the registry needs of a breaker. The
 * windows are in fz_window.h, tickets and ledgers in fz_ticket.h (both included here
 * only, so the hot path stays one translation unit), the clock in fz_clock.c, errors
 * and options in fz_config.c, the permits hooks in fz_permits.c.
 *
 * Design note
 * -----------
 *
 *              failures reach a trip rule
 *   CLOSED ──────────────────────────────▶ OPEN
 *     ▲                                     │ open_for elapsed (seen lazily by a call,
 *     │  `probes` probe successes           ▼  state() or stats())
 *     └──────────────────────────────── HALF_OPEN ──▶ OPEN  (a probe fails or times out)
 *
 *   plus FORCED_OPEN and DISABLED, entered and left only by fz_force_open, fz_disable
 *   and fz_reset.
 *
 * One 64-bit state word `sw` holds generation << 3 | state. Every transition is one
 * compare-and-swap of that word from (g, from) to (g + 1, to), so exactly one caller
 * makes each transition and learns it from the return value. (The lift of a timed
 * forced_open is two, forced_open -> open -> half_open, made by one swap from g to
 * g + 2: the open state between them, due at once, is never seen; see lift_forced.)
 * A ticket carries the generation it was issued in; an outcome whose generation is not
 * the current one is stale and ignored.
 *
 * Memory ordering. The state word is read with acquire and swapped with acq_rel. What
 * an open state needs (the end of its period, `until`, stamped with its generation in
 * `until_gen`) and what a probe needs (its start) is published BEFORE the swap or claim
 * that makes it visible, so a reader that acquires the new state also sees it, and a
 * process killed at any instruction leaves nothing that wedges the circuit (a stamp left
 * half-written reads as "due"). Window counters are tagged words
 * (bucket epoch << 32 | count) bumped with relaxed fetch-and-add: they need atomicity,
 * not ordering, except where a failure decides a trip: failures are added and summed
 * with seq_cst, so of two concurrent failures at least the later one sees both. When a
 * bucket is recycled for a newer epoch, its old count is moved (by the compare-and-swap
 * that recycles it) into a folded total; a reader of totals adds folded and live counts
 * (a count in flight between the two is missed, never seen twice) and raises each total
 * to the highest one read before, so totals never go down and need no retry. Half-open admission
 * is one compare-and-swap on a word holding the generation, the probe successes and a
 * bitmask of busy probe slots; a probe is taken back (its busy bit cleared) by exactly
 * one caller, its report or a caller that finds it past probe_timeout, and only that
 * one counts it; a failed one marks the half-open failed in that same swap, so that it
 * admits nothing more before the re-open (HO_FAILED). The success that completes
 * `probes` closes; so does any later success of that half-open, should its caller have
 * died between the two swaps. Two closers of one half-open lay one fresh window: its
 * shift and era are targets stamped with the generation (lay_fresh), so one that found
 * the circuit half-open and lays after the other closed it moves nothing (the closed
 * period's counts stay). A manual reset to closed lays the fresh window of the
 * generation it moves from the same way (move_to), so a closer of that half-open that
 * lays after the reset's swap moves nothing either. Nothing here is a pointer, so a
 * breaker can live in memory shared by processes; nothing takes a lock except registry
 * creation.
 *
 * Tickets. An admitted call's ticket (an exact double below 2^53) is
 *   key13 << 40 | generation32 << 8 | 0 << 7 | slot4 << 3 | kind2 << 1 | made1
 * where key is a random number (1..8191) drawn per breaker at creation: fz_done refuses
 * a ticket whose key is not the breaker's (another breaker's, or made up), and one whose
 * generation is current but whose kind that generation's state never issues (kind 1
 * needs closed, a probe half_open, a pass disabled), so no report can move forced_open
 * or disabled, or make a transition the state machine does not have. made is 1 when the
 * call made open -> half_open; kind 0 with made 1 is a probe whose call made
 * forced_open -> open -> half_open (the lift of a timed forced_open, one swap: see
 * lift_forced), so that both transitions travel back with the probe. A rejection is
 * -(1 + state*4 + made), made 0 to 3 (MADE_*). fz_allow (the two-step API, whose
 * tickets go through user code) records each admitted ticket in a ledger and hands out
 * instead
 *   use23 << 30 | entry12 << 18 | lane10 << 8 | 1 << 7 | the low 7 bits above,
 * naming the entry that holds the real ticket (use: a count of the thread's tickets);
 * fz_done marks the entry reported, so a ticket reported twice (FZ_EREPORTED) or to
 * another breaker (FZ_ETICKET) counts nothing. Ledgers are per thread and per process, never in shared memory: the hot
 * path stays one atomic read-modify-write per call (see "ledgers", fz_ticket.h).
 */
#define FZ_BREAKER_WORDS
#include "fz.h"
#include "fz_atomic.h"
#include "fz_errors.h"
#include "fz_internal.h"
#include "fz_permits.h"
#include "fz_window.h"
#include "fz_ticket.h"

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* The fault hook of test/faults.c (FAULT, fz_internal.h). */
#ifdef FZ_FAULTS
void (*fz_fault_hook)(const char *where);

/* Tests only (a -DFZ_FAULTS build of core.so, build/faults-so/): the calling process
 * kills itself (SIGKILL) when it next reaches fault point `where`, once; NULL disarms.
 * test/kill.t.sh arms an nginx worker through the FFI. Not thread-aware: one arm per
 * process. */
static char g_kill_at[64];
static void kill_hook(const char *where) {
  if (g_kill_at[0] && strcmp(where, g_kill_at) == 0) {
    g_kill_at[0] = 0;
    kill(getpid(), SIGKILL);
  }
}
__attribute__((visibility("default"))) void fz_test_kill_at(const char *where);
void fz_test_kill_at(const char *where) {
  g_kill_at[0] = 0;
  if (where && strlen(where) < sizeof g_kill_at) {
    memcpy(g_kill_at, where, strlen(where) + 1);
    fz_fault_hook = kill_hook;
  }
}
#endif

/* ---------------------------------------------------------------- breakers */

/* What retire_all does to a breaker no one else sees yet (every count 0): each tagged
 * word set just behind the window, with plain stores (creation makes no atomic op). */
static void retire_fresh(fz_breaker *b, uint64_t e) {
  uint64_t behind = (uint64_t)(uint32_t)(e - SPAN - 2) << 32;
  for (int i = 0; i < NBUCKETS; i++) {
    b->fails[i] = b->slow[i] = behind;
    for (int s = 0; s < NSTRIPES; s++) b->stripes[s].succ[i] = b->stripes[s].rej[i] = behind;
  }
}

static void breaker_init(fz_breaker *b, const fz_config *c) {
  memset(b, 0, sizeof *b);
  b->cfg = *c;
  b->bucket_ns = (uint64_t)(c->window * 1e9 / SPAN);
  b->bucket_inv = UINT64_MAX / b->bucket_ns;
  b->open_for_ns = (uint64_t)(c->open_for * 1e9);
  b->max_open_ns = (uint64_t)(c->max_open_for * 1e9);
  b->probe_timeout_ms = (uint64_t)ceil(c->probe_timeout * 1e3);
  b->flags = (c->failure_rate > 0 || c->slow_rate > 0 ? F_RATE : 0) | (c->count_window ? F_CW : 0) |
             (c->slow > 0 ? F_SLOW : 0);
  b->cur_open_ns = b->open_for_ns;
  b->cw_n = c->count_window;
  b->key = (uint64_t)(1 + (uint32_t)(rand01() * 8191)) << 40;  /* 1..8191: never 0 */
  b->sw = sw_make(0, FZ_CLOSED);
  b->cur_epoch = (uint64_t)(((u128)now_ns() * b->bucket_inv) >> 64);
  retire_fresh(b, b->cur_epoch);
}

fz_breaker *fz_breaker_new(const fz_config *c, int *err) {
  int rc = fz_config_check(c);
  fz_breaker *b = NULL;
  size_t ring = rc == FZ_OK ? ((size_t)c->count_window * sizeof(uint32_t) + LINE - 1) / LINE * LINE : 0;
  size_t permits = rc == FZ_OK && c->max_concurrent ? sizeof(fzp) : 0;
  if (rc == FZ_OK && !(b = aligned_alloc(LINE, (sizeof *b + ring + permits + LINE - 1) / LINE * LINE))) rc = FZ_ENOMEM;
  if (err) *err = rc;
  if (rc != FZ_OK) return NULL;
  breaker_init(b, c);
  b->cw_ring_off = (int64_t)sizeof *b;  /* the ring follows the breaker, then the permits */
  b->permits_off = permits ? (int64_t)(sizeof *b + ring) : 0;
  memset(b + 1, 0, ring + permits);
  return b;
}

void fz_breaker_free(fz_breaker *b) {
  if (b && !b->in_registry) free(b);
}

void fz_breaker_config(const fz_breaker *b, fz_config *out) { fzi_config_load((fz_breaker *)(uintptr_t)b, out); }

/* The name: a registry breaker's is its slot's, in the registry's meta (fzi_slot_init):
 * the one copy of it, which a reuse of the slot rewrites, as it did the breaker's own. */
const char *fz_breaker_name(const fz_breaker *b) {
  int64_t off = (int64_t)at_load_rlx((const uint64_t *)(const void *)&b->name_off);
  return off ? (const char *)b + off : "";
}

void fzi_set_name(fz_breaker *b, const char *name_at) {
  b->name_off = name_at ? (int64_t)(name_at - (char *)b) : 0;
}

/* ---------------------------------------------------------------- transitions */

/* `period` shortened by jitter: the length of one open period. */
static uint64_t jittered(fz_breaker *b, uint64_t period) {
  double p = (double)period;
  double jitter = OPT(b, cfg.jitter);
  if (jitter > 0) p *= 1.0 - jitter * rand01();
  return (uint64_t)p;
}

/* A probe stamp: the low 22 bits of the generation, the start in ms (mod 2^42). Only
 * compared for equality of generation, never for order, so no generation count makes
 * an old stamp look new. */
static uint64_t probe_stamp(uint32_t g32, uint64_t t) {
  return (uint64_t)(g32 & 0x3fffff) << 42 | (t / 1000000 & MS42);
}
static int stamp_of(uint64_t st, uint32_t g32) { return st >> 42 == (g32 & 0x3fffff); }
/* ms from the start in stamp st to t_ms; a start in the future (a clock set back) is
 * "no time at all" */
static uint64_t ms_since(uint64_t st, uint64_t t_ms) {
  uint64_t d = (t_ms - st) & MS42;
  return d >= UINT64_C(1) << 41 ? 0 : d;
}

#define STAMPING (UINT64_C(1) << 63)  /* in until_gen: `until` is being written */

/*
 * Publishes the end of the open period of generation gen BEFORE the swap that opens the
 * circuit, so that a process killed right after the swap cannot leave it open for ever.
 * A small seqlock: until_gen goes from an older generation to gen | STAMPING, then
 * `until` is written, then until_gen goes from gen | STAMPING to gen (release). The
 * first caller to stamp a generation wins; a caller that finds the same generation
 * half-stamped (its stamper may have died) finishes the stamp itself. A caller whose
 * view is late never writes over a newer stamp: it writes `until` with a
 * compare-and-swap from the value it read BEFORE it saw gen | STAMPING still there
 * (seq_cst, in that order), so once a newer generation has claimed until_gen and
 * written its end, that swap fails and the late caller finds the newer claim and stops.
 * Should the swap succeed because the newer end equals the value read, the caller sees
 * the newer claim right after and swaps that value back. It ends the stamp with a
 * compare-and-swap, never over a newer claim. If the circuit is
 * open with a stamp left half-written, open_due reads it as "due": a probe is admitted
 * early rather than the circuit staying open for ever. Every timed stamp uses this one
 * protocol: the end of an open period (until/until_gen) and of a timed forced_open
 * (forced_until/forced_gen).
 */
static void stamp(uint64_t *gen_w, uint64_t *end_w, uint64_t gen, uint64_t end_ns, const char *where) {
  (void)where;  /* the fault point's name: only the -DFZ_FAULTS build uses it */
  uint64_t cur = at_load_acq(gen_w);
  for (;;) {
    if ((cur & ~STAMPING) > gen || cur == gen) return;  /* newer, or this gen is stamped */
    if (cur == (gen | STAMPING)) break;  /* another stamper of gen, alive or dead: finish */
    if (at_cas_acqrel(gen_w, &cur, gen | STAMPING)) break;
  }
  uint64_t u = at_load_sc(end_w);
  for (;;) {
    /* after the load of u: a newer claim seen here was made after u was read */
    if (at_load_sc(gen_w) != (gen | STAMPING)) return;  /* done, or a newer claim */
    FAULT(where);
    if (at_cas_sc(end_w, &u, end_ns)) break;  /* fails if the end moved since u */
  }
  cur = at_load_sc(gen_w);
  if ((cur & ~STAMPING) > gen) {  /* a newer claim whose end was u: give it back */
    uint64_t mine = end_ns;
    at_cas_sc(end_w, &mine, u);
    return;
  }
  cur = gen | STAMPING;
  at_cas_acqrel(gen_w, &cur, gen);  /* release: pairs with the acquire in open_due / forced_end */
}

/* The end of the open period of generation gen. */
static void stamp_open(fz_breaker *b, uint64_t gen, uint64_t end_ns) {
  stamp(&b->until_gen, &b->until, gen, end_ns, "stamping");
}

/* closed -> open. Returns the transition code, or 0 when another caller moved first. */
static int trip(fz_breaker *b, uint64_t sw, uint64_t t, uint32_t id) {
  stamp_open(b, sw_gen(sw) + 1, t + jittered(b, OPT(b, open_for_ns)));
  FAULT("trip-stamped");
  /* acq_rel: the stamp above happens-before any reader that sees this open state */
  if (!at_cas_acqrel(&b->sw, &sw, sw_make(sw_gen(sw) + 1, FZ_OPEN))) return 0;
  FAULT("tripped");
  set_if(b, id, &b->cur_open_ns, OPT(b, open_for_ns));  /* a new run of open periods */
  add_if(b, id, &b->opens_total, 1);
  return trans_code(FZ_CLOSED, FZ_OPEN);
}

/* half_open -> open after a failed or timed-out probe: the open period backs off. */
static int reopen(fz_breaker *b, uint64_t sw, uint64_t t, uint32_t id) {
  double next = (double)at_load_rlx(&b->cur_open_ns) * OPT(b, cfg.backoff);
  uint64_t max_open = OPT(b, max_open_ns);
  uint64_t period = next > (double)max_open ? max_open : (uint64_t)next;
  stamp_open(b, sw_gen(sw) + 1, t + jittered(b, period));
  if (!at_cas_acqrel(&b->sw, &sw, sw_make(sw_gen(sw) + 1, FZ_OPEN))) return 0;
  set_if(b, id, &b->cur_open_ns, period);
  add_if(b, id, &b->opens_total, 1);
  return trans_code(FZ_HALF_OPEN, FZ_OPEN);
}

/* Raises *w to v, while the breaker is still the one of identity id. */
static void raise_to(fz_breaker *b, uint32_t id, uint64_t *w, uint64_t v) {
  uint64_t cur = at_load_acq(w);
  while (cur < v && alive(b, id) && !at_cas_acqrel(w, &cur, v)) {}
}

/*
 * The fresh window of the move from generation g to closed (g + 1), laid before its
 * swap: a half-open's close (close_circuit) or a manual reset (move_to). Several callers
 * may close one half-open (probe_record), a reset may race them, and one may be
 * descheduled anywhere: one that found the circuit half-open, then lays its window
 * after another closed it, would wipe what the closed calls counted. So the window is
 * not a bump but a target, stamped with g + 1 (stamp, as `until`; never 0, which an
 * unstamped breaker holds): the shift and the era read BEFORE the check of the state
 * word, plus one window; the first stamp of g + 1 is every closer's, and each raises
 * the shift and the era to it, which after the first raise moves nothing. A target read
 * after a raise of g + 1 cannot be stamped: that raise came after its stamp was
 * complete. The caller's state word sw is generation g's; `checked` names the fault
 * point after the check. Returns 0 when the state is no longer sw, or a newer generation
 * stamped (this caller is stale): either way the state has moved on.
 */
static int lay_fresh(fz_breaker *b, uint64_t sw, uint32_t id, const char *checked) {
  (void)checked;  /* the fault point's name: only the -DFZ_FAULTS build uses it */
  /* the targets before the check (acquire: a raise of this generation's seen here came
   * after its stamp was complete, see above) */
  uint64_t shift = at_load_acq(&b->shift), era = at_load_acq(&b->cw_agg) >> 33;
  /* moved already (closed by a later probe's success, see probe_record, or by a reset):
   * calls count in the new state */
  if (at_load_acq(&b->sw) != sw) return 0;
  FAULT(checked);
  uint64_t c = sw_gen(sw) + 1;
  stamp(&b->fresh_gen, &b->fresh_shift, c, shift + NBUCKETS + 1, "fresh-stamping");
  stamp(&b->era_gen, &b->fresh_era, c, era + 1, "era-stamping");
  /* acquire: pairs with the release that completes each stamp */
  if (at_load_acq(&b->fresh_gen) != c || at_load_acq(&b->era_gen) != c) return 0;
  raise_to(b, id, &b->shift, at_load_rlx(&b->fresh_shift));
  epoch_at(b, now_ns(), id);
  uint64_t to = at_load_rlx(&b->fresh_era), agg = at_load_acq(&b->cw_agg);
  while (agg >> 33 < to && alive(b, id) && !at_cas_acqrel(&b->cw_agg, &agg, to << 33)) {}
  return 1;
}

/* half_open -> closed. The fresh window is laid before the swap: while half-open no
 * rule reads the window, so a swap that loses leaves nothing wrong behind, and a late
 * closer lays nothing over the closed period (lay_fresh). The backoff is left alone:
 * the next trip starts a new run of open periods. */
static int close_circuit(fz_breaker *b, uint64_t sw, uint32_t id) {
  if (!lay_fresh(b, sw, id, "close-checked")) return 0;
  FAULT("closing");
  if (!at_cas_acqrel(&b->sw, &sw, sw_make(sw_gen(sw) + 1, FZ_CLOSED))) return 0;
  return trans_code(FZ_HALF_OPEN, FZ_CLOSED);
}

/* Whether the open period of open generation sw is over at t. The stamp of sw's
 * generation is always there (stamp_open runs before the swap that the acquire load of
 * sw saw); anything else means its writer died: then rather admit a probe than stay
 * open for ever. */
static int open_due(fz_breaker *b, uint64_t sw, uint64_t t) {
  /* acquire: pairs with the release at the end of stamp_open */
  return at_load_acq(&b->until_gen) != sw_gen(sw) || t >= at_load_rlx(&b->until);
}

/* The half-open word `ho`: gen32 << 32 | HO_FAILED | successes << 16 | busy slots. A
 * probe that failed (its report, or a caller that took it back at its timeout) sets
 * HO_FAILED in the swap that takes its slot back, before the swap that re-opens: the
 * half-open it ends admits no other call meanwhile (the freed slot would send a second
 * probe into what just failed, to run while the circuit is open again), no success
 * closes it, and any caller that finds it makes the re-open itself (settle), so that a
 * process killed between the two swaps leaves nothing half-done. */
#define HO_FAILED (UINT64_C(1) << 31)
static uint32_t ho_succ(uint64_t ho) { return (uint32_t)(ho >> 16) & 0x7fff; }

/* Whether a probe of half-open generation sw failed and its re-open is still to make. */
static int ho_failed(fz_breaker *b, uint64_t sw) {
  uint64_t ho = at_load_acq(&b->ho);
  return (uint32_t)(ho >> 32) == (uint32_t)sw_gen(sw) && (ho & HO_FAILED);
}

/*
 * A probe of generation sw that has outlived probe_timeout re-opens the circuit.
 * Returns 1 + the slot of the first such probe, or 0. A busy slot whose stamp is of
 * another generation (a late caller of an earlier half-open stamped over it, see
 * stamp_probe) gets a stamp of now from the first caller that sees it: that probe times
 * out probe_timeout later, never earlier, and never not at all.
 */
static unsigned probe_timed_out(fz_breaker *b, uint64_t sw, uint64_t t) {
  uint64_t ho = at_load_acq(&b->ho);
  uint32_t g32 = (uint32_t)sw_gen(sw), busy = (uint32_t)ho & 0xffff;
  if ((uint32_t)(ho >> 32) != g32) return 0;
  uint64_t t_ms = t / 1000000 & MS42;
  for (unsigned i = 0; busy; i++, busy >>= 1) {
    if (!(busy & 1)) continue;
    /* the stamp was published by the claim's acq_rel CAS on ho, read above (acquire) */
    uint64_t st = at_load_acq(&b->probe_start[i]);
    if (!stamp_of(st, g32)) {
      at_cas_acqrel(&b->probe_start[i], &st, probe_stamp(g32, t));  /* lost: the next one wins */
      continue;
    }
    if (ms_since(st, t_ms) >= OPT(b, probe_timeout_ms)) return i + 1;
  }
  return 0;
}

/*
 * Takes the busy probe `slot` of half-open g32 back: with `succ`, counting one probe
 * success; else marking the half-open failed (HO_FAILED, see ho_succ), for the caller to
 * re-open. Exactly one caller takes a probe back: the probe's own report, or a caller
 * that found it timed out; only that one counts the probe's outcome. Stores the new
 * half-open word in *out. Returns 0 when the slot was not busy in g32.
 */
static int probe_take(fz_breaker *b, uint32_t g32, unsigned slot, int succ, uint64_t *out) {
  uint64_t ho = at_load_acq(&b->ho);
  for (;;) {
    if ((uint32_t)(ho >> 32) != g32 || !(ho & 1u << slot)) return 0;
    uint64_t want = ho & ~(UINT64_C(1) << slot);
    if (succ) want += UINT64_C(1) << 16;  /* (at most FZ_MAX_PROBES: never into HO_FAILED) */
    else want |= HO_FAILED;
    if (at_cas_acqrel(&b->ho, &ho, want)) {
      *out = want;
      FAULT(succ ? "probe-succeeded" : "probe-failed");
      return 1;
    }
  }
}

/* Makes a transition due by time alone, if one is: returns its code (0 when none was
 * made by this caller) and leaves the current state word in *sw. At most one, so that
 * the caller can report exactly what it did. */
static int settle(fz_breaker *b, uint64_t *sw, uint64_t t, uint32_t id) {
  int made = 0, st = sw_state(*sw);
  unsigned slot;
  if (st == FZ_OPEN && open_due(b, *sw, t)) {
    uint64_t want = *sw;
    if (at_cas_acqrel(&b->sw, &want, sw_make(sw_gen(*sw) + 1, FZ_HALF_OPEN)))
      made = trans_code(FZ_OPEN, FZ_HALF_OPEN);
  } else if (st == FZ_HALF_OPEN && ho_failed(b, *sw)) {
    /* a probe failed and its re-open is not made yet (its maker is between its two
     * swaps, or was killed there): made here, once, by whichever swap wins */
    made = reopen(b, *sw, t, id);
  } else if (st == FZ_HALF_OPEN && (slot = probe_timed_out(b, *sw, t))) {
    uint64_t ho;
    /* the caller that takes the timed-out probe back counts it as failed, once */
    if (probe_take(b, (uint32_t)sw_gen(*sw), slot - 1, 0, &ho)) {
      add_if(b, id, &b->folded_fail, 1);
      made = reopen(b, *sw, t, id);
    }
  } else {
    return 0;
  }
  FAULT("settling");
  *sw = at_load_acq(&b->sw);
  return made;
}

/* The timed forced_open (defined with the manual states). */
static uint64_t forced_end(fz_breaker *b, uint64_t sw);
static int lift_forced(fz_breaker *b, uint64_t *sw, uint64_t t, uint32_t id);

/* ---------------------------------------------------------------- admission */

/*
 * Whether the state word sw, just re-read after an attempt at a transition, is still
 * that of the breaker of identity `id` (the one the call came in for): not removed,
 * and the slot not passed to another breaker. Every path that re-reads the state word
 * and then issues a ticket or counts from it asks this first (the identity is read
 * after the state word: a reuse stores the new breaker's state word with release after
 * the removal made the identity even, see fzi_slot_init). Only slow paths re-read.
 */
static int still(fz_breaker *b, uint32_t id, uint64_t sw) {
  return sw_state(sw) != FZ_REMOVED && (uint32_t)at_load_acq(&b->id) == id;
}

static void count_rejection(fz_breaker *b, uint64_t e, uint32_t id) {
  bump(b, my_stripe(b)->rej, &b->folded_rej, e, id);
}

/* Claims a probe slot in half-open generation sw; returns the ticket or a rejection. */
static void probe_release(fz_breaker *b, uint64_t gen, unsigned slot);

/*
 * Stamps the start of a probe in `slot` (see probe_stamp) BEFORE the claim that sets
 * the slot's busy bit, so that a busy slot carries a start of its own generation even
 * if its process is killed right after the claim: probe_timeout then frees it. Within
 * one generation a later start wins (two callers racing for one free slot both stamp);
 * a stamp of any other generation is replaced. That may be a newer one, when this
 * caller's view of the state is late: its claim then fails, and probe_timed_out
 * restamps the newer probe when it sees the foreign stamp (a late timeout, never an
 * early one).
 */
static void stamp_probe(fz_breaker *b, unsigned slot, uint32_t g32, uint64_t t) {
  uint64_t want = probe_stamp(g32, t);
  uint64_t *p = &b->probe_start[slot];
  uint64_t cur = at_load_acq(p);
  for (;;) {
    if (stamp_of(cur, g32) && ms_since(cur, want & MS42) == 0) return;  /* as late or later */
    if (at_cas_acqrel(p, &cur, want)) return;
  }
}

/* made: 0, MADE_HALF (this call made open -> half_open) or MADE_LIFT (it made
 * forced_open -> open -> half_open, lift_forced): it travels back in the ticket or the
 * rejection. A call that made the lift has no ticket of kind 1 or 3 that could say so:
 * when the half-open it made is over before its claim (a reset, a disable), it is
 * rejected as that half-open's, with its transitions. */
static double claim_probe(fz_breaker *b, uint64_t sw, uint64_t t, int made, uint32_t id) {
  uint32_t g32 = (uint32_t)sw_gen(sw);
  uint64_t ho = at_load_acq(&b->ho);
  unsigned slot;
  for (;;) {
    uint32_t succ = ho_succ(ho), busy = (uint32_t)ho & 0xffff;
    int32_t ahead = (int32_t)((uint32_t)(ho >> 32) - g32);
    if (ahead < 0) succ = busy = 0;  /* the first probe of this generation */
    if (ahead > 0 || (ahead == 0 && (ho & HO_FAILED)) ||
        (uint32_t)__builtin_popcount(busy) >= OPT(b, cfg.probes)) {
      /* `probes` run already, a probe failed (the re-open is under way), or a later
       * half-open began: this call's view is stale */
      count_rejection(b, epoch_at(b, t, id), id);
      return rejection(FZ_HALF_OPEN, made);
    }
    slot = (unsigned)__builtin_ctz(~busy);
    stamp_probe(b, slot, g32, t);
    FAULT("probe-stamped");
    uint64_t want = (uint64_t)g32 << 32 | (uint64_t)succ << 16 | busy | 1u << slot;
    if (at_cas_acqrel(&b->ho, &ho, want)) break;  /* acq_rel: publishes the stamp too */
  }
  FAULT("probe-claimed");
  /* A probe failed (or the circuit closed) between our read of the state and the claim:
   * give the slot back, so that no call of an older half-open runs once it is over. */
  uint64_t now_sw = at_load_acq(&b->sw);
  if (now_sw != sw) {
    probe_release(b, sw_gen(sw), slot);
    if (!still(b, id, now_sw)) return rejection(FZ_STALE, 0);  /* another breaker's state */
    int st = sw_state(now_sw);
    if (st == FZ_CLOSED && made != MADE_LIFT) return ticket(b, sw_gen(now_sw), 0, KIND_NORMAL, made);
    if (st == FZ_DISABLED && made != MADE_LIFT) return ticket(b, sw_gen(now_sw), 0, KIND_PASS, made);
    count_rejection(b, epoch_at(b, t, id), id);
    return rejection(st == FZ_CLOSED || st == FZ_DISABLED ? FZ_HALF_OPEN : st, made);
  }
  return ticket(b, sw_gen(sw), slot, made == MADE_LIFT ? KIND_LIFT : KIND_PROBE, made ? 1 : 0);
}

/* fz_enter when the circuit is not closed. A state machine: one case a state. */
static __attribute__((noinline)) double enter_slow(fz_breaker *b, uint64_t sw, uint32_t id) {
  /* the manual states need no clock: forced_open counts in the bucket of the last read */
  if (sw_state(sw) == FZ_DISABLED) return ticket(b, sw_gen(sw), 0, KIND_PASS, 0);
  if (sw_state(sw) == FZ_FORCED_OPEN && !forced_end(b, sw)) {
    count_rejection(b, at_load_acq(&b->cur_epoch), id);
    return rejection(FZ_FORCED_OPEN, 0);
  }
  /* retired (fz_enter, which checks no identity): nothing to count into */
  if (sw_state(sw) == FZ_REMOVED) return rejection(FZ_REMOVED, 0);
  uint64_t t = now_ns();
  if (sw_state(sw) == FZ_FORCED_OPEN) {  /* timed: lifted when its time is up */
    /* the call that lifts it is the first probe, as the one that ends an open period */
    if (lift_forced(b, &sw, t, id)) return claim_probe(b, sw, t, MADE_LIFT, id);
    if (!still(b, id, sw)) return rejection(FZ_STALE, 0);
    if (sw_state(sw) == FZ_FORCED_OPEN) {
      count_rejection(b, epoch_at(b, t, id), id);
      return rejection(FZ_FORCED_OPEN, 0);
    }
  }
  int made = settle(b, &sw, t, id);
  if (!still(b, id, sw)) return rejection(FZ_STALE, 0);  /* re-read: the slot moved on */
  if (made == trans_code(FZ_HALF_OPEN, FZ_OPEN)) {
    /* this call re-opened the circuit: it is rejected, and the rejection says so,
     * whatever another caller made of the state since */
    count_rejection(b, epoch_at(b, t, id), id);
    return rejection(FZ_OPEN, MADE_REOPEN);
  }
  /* the transition this call made travels back in the ticket, whatever happened next */
  int to_half = made == trans_code(FZ_OPEN, FZ_HALF_OPEN);
  switch (sw_state(sw)) {
  case FZ_CLOSED:
    return ticket(b, sw_gen(sw), 0, KIND_NORMAL, to_half);
  case FZ_DISABLED:
    return ticket(b, sw_gen(sw), 0, KIND_PASS, to_half);
  case FZ_HALF_OPEN:
    return claim_probe(b, sw, t, to_half, id);
  default: /* FZ_OPEN, FZ_FORCED_OPEN */
    count_rejection(b, epoch_at(b, t, id), id);
    return rejection(sw_state(sw), to_half);
  }
}

/* An open circuit whose period is not over: count the rejection (the common case of
 * a rejection, kept small: one clock read, one add on the thread's own stripe). */
static inline int reject_open(fz_breaker *b, uint64_t sw) {
  uint64_t t = now_ns();
  if (open_due(b, sw, t)) return 0;
  uint64_t e = epoch_raw(b, t);
  uint32_t si = t_stripe;
  if (si == UINT32_MAX || e > at_load_acq(&b->cur_epoch)) return 0;  /* enter_slow counts it */
  uint64_t *w = &b->stripes[si].rej[e % NBUCKETS];
  uint64_t v = at_load_acq(w);
  /* v - (e << 32): the count when the word is tagged e, else 2^32 or more (one compare
   * for the tag and the count); then the state word again, after every word the add is
   * computed from: unchanged, they are this breaker's (see "Incarnations"); then the add
   * is a swap from what was read */
  if (v - ((uint64_t)(uint32_t)e << 32) >= UINT64_C(0x80000000) || at_load_acq(&b->sw) != sw) return 0;
  return at_cas_acqrel(w, &v, v + 1);
}

/* A forced_open without an end (b:force_open()): the rejection counts in the bucket of
 * the last clock read, as in enter_slow, with no clock read, by reject_open's protocol.
 * A timed one (enter_slow lifts it when its time is up), or a word not ready for the
 * add, goes to enter_slow, which counts it. */
static inline int reject_forced(fz_breaker *b, uint64_t sw) {
  if (forced_end(b, sw)) return 0;
  uint64_t e = at_load_acq(&b->cur_epoch);
  uint32_t si = t_stripe;
  if (si == UINT32_MAX) return 0;
  uint64_t *w = &b->stripes[si].rej[e % NBUCKETS];
  uint64_t v = at_load_acq(w);
  /* the tag and count in one compare, then the state word again, as in reject_open */
  if (v - ((uint64_t)(uint32_t)e << 32) >= UINT64_C(0x80000000) || at_load_acq(&b->sw) != sw) return 0;
  return at_cas_acqrel(w, &v, v + 1);
}

/* fz_enter when the circuit is forced_open, and when it is in any state but closed and
 * forced_open: the common rejections first, the rest in enter_slow. Out of line, so
 * that the closed path needs no stack frame (and apart, so that each has a small one). */
static __attribute__((noinline)) double enter_forced(fz_breaker *b, uint64_t sw, uint32_t id) {
  if (reject_forced(b, sw)) return rejection(FZ_FORCED_OPEN, 0);
  return enter_slow(b, sw, id);
}

static __attribute__((noinline)) double enter_other(fz_breaker *b, uint64_t sw, uint32_t id) {
  if (sw_state(sw) == FZ_OPEN && reject_open(b, sw)) return rejection(FZ_OPEN, 0);
  return enter_slow(b, sw, id);
}

/* enter_other of a state word known to be open (fz_enter_id tests for it second, right
 * after closed: the common rejection pays no other test). */
static __attribute__((noinline)) double enter_open(fz_breaker *b, uint64_t sw, uint32_t id) {
  if (reject_open(b, sw)) return rejection(FZ_OPEN, 0);
  return enter_slow(b, sw, id);
}

/* fz_enter's body but the closed case, inlined into fz_allow_id and fz_enter_id (an
 * exported function may be interposed, so the compiler calls it through the PLT). */
static inline double enter_not_closed(fz_breaker *b, uint64_t sw, uint32_t id) {
  if (sw_state(sw) == FZ_FORCED_OPEN) return enter_forced(b, sw, id);
  return enter_other(b, sw, id);
}

static inline double enter_sw(fz_breaker *b, uint64_t sw, uint32_t id) {
  if (__builtin_expect(sw_state(sw) == FZ_CLOSED, 1)) return ticket(b, sw_gen(sw), 0, KIND_NORMAL, 0);
  return enter_not_closed(b, sw, id);
}

/* fz_enter's slow path has no identity from a handle: it takes the one the breaker has
 * now (read after the state word), so that a slot that passes to another breaker while
 * the call runs is noticed there too. */
static __attribute__((noinline)) double enter_slow_any(fz_breaker *b, uint64_t sw) {
  return enter_slow(b, sw, (uint32_t)at_load_acq(&b->id));
}

static inline double enter(fz_breaker *b) {
  uint64_t sw = at_load_acq(&b->sw);  /* acquire: pairs with the acq_rel swap of a transition */
  if (__builtin_expect(sw_state(sw) == FZ_CLOSED, 1)) return ticket(b, sw_gen(sw), 0, KIND_NORMAL, 0);
  if (sw_state(sw) == FZ_OPEN && reject_open(b, sw)) return rejection(FZ_OPEN, 0);
  return enter_slow_any(b, sw);
}

double fz_enter(fz_breaker *b) { return enter(b); }

/* fz_allow of state word sw when the circuit is not closed (id: the handle's identity,
 * or for fz_allow the one the breaker has, read after sw, as in enter_slow_any). */
static __attribute__((noinline)) double allow_slow(fz_breaker *b, uint64_t sw, uint32_t id) {
  double u = enter_sw(b, sw, id);
  return u > 0 ? track(b, (uint64_t)(int64_t)u, (uint64_t)(int64_t)u & 0x7f) : u;
}

/* fz_allow through a handle that remembers the breaker's identity (as fz_enter_id).
 * Closed: the ticket's bits go to the ledger as they are (no double in between). */
double fz_allow_id(fz_breaker *b, uint32_t id) {
  uint64_t sw = at_load_acq(&b->sw);  /* acquire: as in fz_enter_id */
  if (__builtin_expect((uint32_t)at_load_acq(&b->id) != id, 0)) return rejection(FZ_STALE, 0);
  if (__builtin_expect(sw_state(sw) == FZ_CLOSED, 1))
    return track(b, ticket_bits(b, sw_gen(sw), 0, KIND_NORMAL, 0), KIND_NORMAL << 1);
  if (sw_state(sw) == FZ_REMOVED) return rejection(FZ_STALE, 0);
  return allow_slow(b, sw, id);
}

double fz_allow(fz_breaker *b) {
  uint64_t sw = at_load_acq(&b->sw);  /* acquire: as in enter */
  if (__builtin_expect(sw_state(sw) == FZ_CLOSED, 1))
    return track(b, ticket_bits(b, sw_gen(sw), 0, KIND_NORMAL, 0), KIND_NORMAL << 1);
  return allow_slow(b, sw, (uint32_t)at_load_acq(&b->id));
}

/* fz_enter through a handle that remembers the breaker's identity. The identity is read
 * after the state word (acquire): a removal moves the identity before it frees the slot
 * (fz_registry.c), and a new breaker in the slot continues the generation, so a handle
 * that still sees its identity holds a ticket no later breaker of the slot accepts. */
static inline double enter_id(fz_breaker *b, uint32_t id) {
  uint64_t sw = at_load_acq(&b->sw);  /* acquire: pairs with the acq_rel swap of a transition */
  if (__builtin_expect((uint32_t)at_load_acq(&b->id) != id, 0)) return rejection(FZ_STALE, 0);
  if (__builtin_expect(sw_state(sw) == FZ_CLOSED, 1)) return ticket(b, sw_gen(sw), 0, KIND_NORMAL, 0);
  if (sw_state(sw) == FZ_OPEN) return enter_open(b, sw, id);
  if (sw_state(sw) == FZ_REMOVED) return rejection(FZ_STALE, 0);  /* its identity goes next */
  return enter_not_closed(b, sw, id);
}

double fz_enter_id(fz_breaker *b, uint32_t id) { return enter_id(b, id); }

/* The limit was reached: counted (count_full), and the full rejection. */
static double enter_full(fzp *p, int count_full) {
  if (count_full) at_add_rlx(&p->full_total, 1);
  return rejection(FZ_FULL, 0);
}

/* fz_enter_limit whatever its fast path could not do: no permits, a call the circuit
 * did not admit at once, or a permit not taken at the first try. */
static __attribute__((noinline)) double enter_limit_any(fz_breaker *b, uint32_t id, int count_full) {
  fzp *p = permits_of(b);
  if (!p) return enter_id(b, id);
  permits_mark(b);
  if (!fzp_take_any(p, permit_limit(b))) return enter_full(p, count_full);
  double t = enter_id(b, id);
  if (t < 0) fzp_give(p);  /* a rejection holds no permit */
  return t;
}

/* fz_enter_id after a permit of max_concurrent (fz_permit_take's, in the same call, so
 * that a limited call pays one call into the core to enter and one to be done): a
 * rejection by the circuit gives the permit back before it returns. The fast path (a
 * closed circuit, the thread's preferred lane, one swap) calls nothing. It reads the
 * state word and the identity before it takes the permit: in the closed state that
 * asks the circuit nothing (no ticket is counted, no probe slot taken), so a call past
 * the limit still touches no circuit; the call is admitted as of that read, as a call
 * whose take came first would be as of a read just after it. */
double fz_enter_limit(fz_breaker *b, uint32_t id, int count_full) {
  fzp *p = permits_of(b);
  uint64_t sw = at_load_acq(&b->sw);  /* acquire: as in enter_id */
  /* (a limit of 0, none: the take fails, and enter_limit_any takes with permit_limit's) */
  if (__builtin_expect(p && (uint32_t)at_load_acq(&b->id) == id && sw_state(sw) == FZ_CLOSED &&
                       fzp_take_fast(p, OPT(b, cfg.max_concurrent)), 1))
    return ticket(b, sw_gen(sw), 0, KIND_NORMAL, 0);
  return enter_limit_any(b, id, count_full);
}

/* ---------------------------------------------------------------- outcomes */

/* Adds (sign 1) or removes (sign -1) one outcome to the aggregate of era `era`.
 * Returns the new aggregate, or 0 when a fresh window has begun meanwhile. */
static uint64_t cw_apply(fz_breaker *b, uint64_t era, int sign, uint32_t bits, uint32_t id) {
  uint64_t agg = at_load_acq(&b->cw_agg);
  for (;;) {
    if (agg >> 33 != era || !alive(b, id)) return 0;
    uint64_t calls = (agg >> 22 & 0x7ff) + (uint64_t)(int64_t)sign;
    uint64_t f = (agg >> 11 & 0x7ff) + (bits & CW_FAIL ? (uint64_t)(int64_t)sign : 0);
    uint64_t s = (agg & 0x7ff) + (bits & CW_SLOW ? (uint64_t)(int64_t)sign : 0);
    uint64_t want = era << 33 | (calls & 0x7ff) << 22 | (f & 0x7ff) << 11 | (s & 0x7ff);
    if (at_cas_acqrel(&b->cw_agg, &agg, want)) return want;
  }
}

/*
 * The count window: the outcome takes the oldest slot of the ring. It is added to the
 * aggregate before it is written to its slot, and the outcome it displaces is removed
 * after: every outcome is removed only after it was added, so no count goes below zero
 * (with callers in flight the window may briefly hold N + their number; readers clamp
 * calls to N). A writer whose era has passed (a fresh window began) leaves the ring
 * alone when the slot already holds a newer era's outcome.
 */
static uint64_t cw_record(fz_breaker *b, int fail, int slow, uint32_t id) {
  if (!OPT(b, cfg.count_window)) return 0;  /* a reload made it a time window while this call ran */
  uint64_t era = at_load_acq(&b->cw_agg) >> 33;
  /* the ring's size is the era's (cw_n, written by a reload before the era it starts):
   * a call never indexes the ring of one era with the size of another */
  uint64_t cw_n = at_load_acq(&b->cw_n);
  uint32_t n = (uint32_t)cw_n;
  FAULT("cw-sized");
  if (cw_n >> 32 > era || !n) return 0;  /* a reload is starting another era: none of it */
  uint32_t era28 = (uint32_t)era & 0x0fffffff;
  uint32_t nv = era28 << 4 | CW_VALID | (fail ? CW_FAIL : 0) | (slow ? CW_SLOW : 0);
  uint64_t agg = cw_apply(b, era, 1, nv, id);
  if (!agg) return 0;  /* a fresh window began: this outcome belongs to none */
  uint32_t *ring = (uint32_t *)(void *)((char *)b + at_load_acq((const uint64_t *)&b->cw_ring_off));
  uint64_t seq = at_load_acq(&b->cw_seq);
  while (alive(b, id) && !at_cas_acqrel(&b->cw_seq, &seq, seq + 1)) {}
  uint32_t *slot = &ring[seq % n];
  uint32_t old = at_load32_acq(slot);
  do {
    if ((old & CW_VALID) && (int32_t)(((old >> 4) - era28) << 4) > 0) return 0;  /* newer era */
    if (!alive(b, id)) return 0;
  } while (!at_cas32_acqrel(slot, &old, nv));
  if ((old & CW_VALID) && old >> 4 == era28) {
    uint64_t after = cw_apply(b, era, -1, old, id);
    if (after) agg = after;
  }
  return agg;
}

/* Calls in a count window's aggregate, clamped to N (see cw_record). */
static uint32_t cw_calls(fz_breaker *b, uint64_t agg) {
  uint32_t calls = (uint32_t)(agg >> 22 & 0x7ff), n = OPT(b, cfg.count_window);
  return calls > n ? n : calls;
}

/* The options of the trip rules, each read once (a reload may rewrite them). */
typedef struct rules {
  uint32_t fails, min_calls;
  double failure_rate, slow_rate;
} rules;

static rules rules_of(fz_breaker *b) {
  rules r = { OPT(b, cfg.fails), OPT(b, cfg.min_calls), OPT(b, cfg.failure_rate), OPT(b, cfg.slow_rate) };
  return r;
}

/* Whether the counts of a window meet a trip rule. */
static int rules_trip(const rules *c, uint64_t calls, uint64_t f, uint64_t s) {
  if (c->fails && f >= c->fails) return 1;
  if (calls == 0 || calls < c->min_calls) return 0;
  if (c->failure_rate > 0 && (double)f / (double)calls >= c->failure_rate) return 1;
  return c->slow_rate > 0 && (double)s / (double)calls >= c->slow_rate;
}

static uint32_t sum_succ(fz_breaker *b, uint32_t e) {
  uint64_t sum = 0;
  for (int i = 0; i < NSTRIPES; i++) sum += tw_sum(b->stripes[i].succ, e);
  return sum > UINT32_MAX ? UINT32_MAX : (uint32_t)sum;
}

/* An outcome of a call admitted while closed (generation sw), through the rules. */
static int closed_record(fz_breaker *b, uint64_t sw, int fail, int slow, uint32_t id) {
  uint64_t t = now_ns(), e = epoch_at(b, t, id);
  if (fail) bump(b, b->fails, &b->folded_fail, e, id);
  else bump(b, my_stripe(b)->succ, &b->folded_succ, e, id);
  if (slow) bump(b, b->slow, &b->folded_slow, e, id);
  const rules r = rules_of(b), *c = &r;
  uint32_t flags = OPT(b, flags);
  uint64_t calls, f, s;
  if (flags & F_CW) {
    uint64_t agg = cw_record(b, fail, slow, id);
    if (!agg) return 0;
    calls = cw_calls(b, agg), f = agg >> 11 & 0x7ff, s = agg & 0x7ff;
  } else {
    if (!fail && !slow && !(flags & F_RATE)) return 0;
    /* Only the sums a rule needs. A success can only complete a rate rule, which needs
     * rate * min_calls bad calls: skip the striped sum of calls when there are fewer. */
    int need_f = c->fails || c->failure_rate > 0;
    f = need_f ? tw_sum(b->fails, (uint32_t)e) : 0;
    s = c->slow_rate > 0 ? tw_sum(b->slow, (uint32_t)e) : 0;
    double least = c->min_calls * (1 - 1e-9);
    int maybe = (c->failure_rate > 0 && f >= c->failure_rate * least) ||
                (c->slow_rate > 0 && s >= c->slow_rate * least);
    if (!fail && !slow && !maybe) return 0;
    if (!need_f) f = tw_sum(b->fails, (uint32_t)e);  /* calls are successes + failures */
    calls = f + sum_succ(b, (uint32_t)e);
  }
  return rules_trip(c, calls, f, s) ? trip(b, sw, t, id) : 0;
}

/* The outcome of the probe in `slot` of half-open generation sw. A slow probe counts
 * as failed when a slow-call rate rule is set. */
static int probe_record(fz_breaker *b, uint64_t sw, unsigned slot, int fail, int slow, uint32_t id) {
  int bad = fail || (slow && OPT(b, cfg.slow_rate) > 0);
  uint64_t ho;
  FAULT("probe-recording");
  /* a probe taken back already (timed out) was counted as failed by whoever took it */
  if (!probe_take(b, (uint32_t)sw_gen(sw), slot, !bad, &ho)) return 0;
  uint64_t t = now_ns(), e = epoch_at(b, t, id);
  if (slow) bump(b, b->slow, &b->folded_slow, e, id);
  if (fail) bump(b, b->fails, &b->folded_fail, e, id);
  else bump(b, my_stripe(b)->succ, &b->folded_succ, e, id);
  if (bad) return reopen(b, sw, t, id);
  /* the success that completes `probes` closes; so does any later one of this
   * generation that finds it still half-open: the completing success's caller was
   * killed between its swap of ho and the close (before, the circuit stayed half-open,
   * each success past `probes` closing nothing). Once closed, later ones are stale. */
  return !(ho & HO_FAILED) && ho_succ(ho) >= OPT(b, cfg.probes) ? close_circuit(b, sw, id) : 0;
}

/* An ignored probe gives its slot back. */
static void probe_release(fz_breaker *b, uint64_t gen, unsigned slot) {
  uint64_t ho = at_load_acq(&b->ho);
  uint32_t g32 = (uint32_t)gen;
  FAULT("probe-releasing");
  while ((uint32_t)(ho >> 32) == g32 && (ho & 1u << slot))
    if (at_cas_acqrel(&b->ho, &ho, ho & ~(UINT64_C(1) << slot))) return;
}

/*
 * The hot path of fz_done: a success of a call admitted while closed, under the plain
 * fails rule (no rate rule, no count window, no slow measure), whose stripe is busy in
 * the current bucket. It reads no clock: the success counts in the bucket of the last
 * clock read. The clock is read (by done_slow) for the first 64 calls a stripe makes in
 * a bucket, so a quiet breaker counts exactly, for a bucket that is not the current one,
 * and for every 64th call, so a busy one stays current. Returns 1 when it counted.
 */
static inline int done_fast(fz_breaker *b, uint64_t t) {
  uint32_t si = t_stripe;
  if ((t & 0x7f) != KIND_NORMAL << 1 || OPT(b, flags) || si == UINT32_MAX) return 0;
  /* the words the add is computed from first (acquire), the state word after them: a
   * ticket current in it means they are this breaker's (see "Incarnations") */
  uint64_t e = at_load_acq(&b->cur_epoch);
  uint64_t *w = &b->stripes[si].succ[e % NBUCKETS];
  uint64_t v = at_load_acq(w);
  uint64_t sw = at_load_acq(&b->sw);  /* acquire: pairs with the swap of a transition */
  /* one compare: key, generation, and state closed (sw << 5 puts the generation at bit 8
   * and the state at bits 5-7, which are 0 in a kind-1 ticket) */
  if ((t & ~UINT64_C(0x1f)) != (at_load_rlx(&b->key) | ((sw << 5) & (GEN_MASK << 8 | 0xe0)))) return 0;
  /* v - (e << 32): the count when the word is tagged e, otherwise 2^32 or more (so one
   * compare checks the tag and 64 <= count < 2^31 at once) */
  uint64_t n = v - ((uint64_t)(uint32_t)e << 32);
  if (n - 64 >= UINT64_C(0x80000000) - 64 || (n & 63) == 63) return 0;
  FAULT("done-fast");  /* tests only (-DFZ_FAULTS): nothing in other builds */
  return at_cas_acqrel(w, &v, v + 1);  /* from what was read: else done_slow counts it */
}

static __attribute__((noinline)) int done_slow(fz_breaker *b, uint64_t t, int outcome, double elapsed);

static inline __attribute__((always_inline)) int done(fz_breaker *b, double tk, int outcome, double elapsed) {
  if (!(tk >= 1.0 && tk < TICKET_LIMIT) || outcome < FZ_SUCCESS || outcome > FZ_IGNORE)
    return FZ_ETICKET;
  uint64_t t = (uint64_t)(int64_t)tk;  /* below 2^53: signed conversions, one instruction */
  if ((double)(int64_t)t != tk) return FZ_ETICKET;
  if (t & TK_TRACKED) {
    int rc = untrack(b, t, &t);
    if (rc) return rc;
  }
  if (outcome == FZ_SUCCESS && done_fast(b, t)) return 0;
  return done_slow(b, t, outcome, elapsed);
}

int fz_done(fz_breaker *b, double tk, int outcome, double elapsed) { return done(b, tk, outcome, elapsed); }

/* fz_done of a call that holds a permit of max_concurrent (fz_enter_limit's): the
 * permit is given back first (fz_permit_give's), then the outcome recorded. */
static __attribute__((noinline)) int done_limit_any(fz_breaker *b, double tk, int outcome, double elapsed) {
  fzp *p = permits_of(b);
  if (p) fzp_give_any(p);
  return done(b, tk, outcome, elapsed);
}

int fz_done_limit(fz_breaker *b, double tk, int outcome, double elapsed) {
  fzp *p = permits_of(b);
  if (__builtin_expect(!p || !fzp_give_fast(p), 0)) return done_limit_any(b, tk, outcome, elapsed);
  return done(b, tk, outcome, elapsed);
}

/* The state a ticket of this kind is issued in. */
static int kind_state(int kind) {
  return kind == KIND_NORMAL ? FZ_CLOSED : kind == KIND_PROBE ? FZ_HALF_OPEN : FZ_DISABLED;
}

/* Whether probe `slot` of half-open generation gen is taken. */
static int probe_busy(fz_breaker *b, uint64_t gen, unsigned slot) {
  uint64_t ho = at_load_acq(&b->ho);
  return (uint32_t)(ho >> 32) == (uint32_t)gen && (ho & 1u << slot);
}

/* The outcome of a ticket of an earlier generation counts nothing here: 0, or FZ_ESTALE
 * when it is a closed call's that was current when an idle eviction retired the breaker
 * (the outcome is its name's: the caller counts it with fz_late_id). */
static int stale(fz_breaker *b, uint64_t gen, int kind) {
  if (kind != KIND_NORMAL) return 0;
  for (int i = 0; i < EVICTIONS; i++) {
    uint64_t ev = at_load_acq(&b->evicted[i]);  /* acquire: pairs with the release in fzi_retire */
    uint64_t g = ev & ~TENTATIVE;
    if (!g || gen != ((g - 1) & GEN_MASK)) continue;
    if (!(ev & TENTATIVE) || at_load_acq(&b->sw) == sw_make(g, FZ_REMOVED)) return FZ_ESTALE;
  }
  return 0;
}

static int done_slow(fz_breaker *b, uint64_t t, int outcome, double elapsed) {
  /* the identity before the state word: a state word current for the ticket then means
   * that identity is the ticket's breaker's (every write below checks it, "Incarnations") */
  uint32_t id = (uint32_t)at_load_acq(&b->id);
  int kind = (int)(t >> 1 & 3);
  if (kind == KIND_LIFT && (t & 1)) kind = KIND_PROBE;  /* a probe that lifted (flag set) */
  unsigned slot = (unsigned)(t >> 3 & 15);
  if (kind == 0 || (kind != KIND_PROBE && (t & 0x78)) || (t & TK_TRACKED) ||
      (t & KEY_MASK) != at_load_rlx(&b->key))  /* a ticket of another breaker, or made up */
    return FZ_ETICKET;
  uint64_t gen = t >> 8 & GEN_MASK;
  uint64_t sw = at_load_acq(&b->sw);  /* acquire: pairs with the swap of a transition */
  int current = (sw_gen(sw) & GEN_MASK) == gen;
  /* a generation is one state: a ticket of this generation issued in another cannot be */
  if (current && sw_state(sw) != kind_state(kind)) return FZ_ETICKET;
  /* a probe slot past `probes` now: made up, unless a reload lowered `probes` while it
   * ran (then it is still taken, or its generation is over: stale) */
  if (current && slot >= OPT(b, cfg.probes) && !probe_busy(b, gen, slot)) return FZ_ETICKET;
  if (outcome == FZ_IGNORE || kind == KIND_PASS) {
    if (outcome == FZ_IGNORE && kind == KIND_PROBE) probe_release(b, gen, slot);
    return 0;
  }
  if (!current) return stale(b, gen, kind);  /* an earlier generation */
  int fail = outcome == FZ_FAILURE;
  double slow_s = OPT(b, cfg.slow);
  int slow = slow_s > 0 && elapsed >= slow_s;
  if (kind == KIND_PROBE) return probe_record(b, sw, slot, fail, slow, id);
  if (!fail && !slow && !OPT(b, flags)) {
    /* what done_fast declined: count in the bucket of a fresh clock read */
    bump(b, my_stripe(b)->succ, &b->folded_succ, epoch_at(b, now_ns(), id), id);
    return 0;
  }
  FAULT("recording");
  int rc = closed_record(b, sw, fail, slow, id);
  /* retired while it recorded (its writes then stopped): the outcome is the name's when
   * an eviction did it, as for a ticket found stale above */
  return alive(b, id) ? rc : stale(b, gen, kind);
}

/* ---------------------------------------------------------------- reading */

int fz_state(fz_breaker *b) {
  uint32_t id = (uint32_t)at_load_acq(&b->id);  /* before the state word, as in done_slow */
  uint64_t sw = at_load_acq(&b->sw);
  int made = sw_state(sw) == FZ_FORCED_OPEN ? lift_forced(b, &sw, now_ns(), id) : 0;
  if (!made && (sw_state(sw) == FZ_OPEN || sw_state(sw) == FZ_HALF_OPEN)) made = settle(b, &sw, now_ns(), id);
  return sw_state(sw) + 256 * made;
}

double fz_retry_after(fz_breaker *b) {
  uint64_t sw = at_load_acq(&b->sw), t = now_ns();
  /* acquire: pairs with the release at the end of stamp_open */
  uint64_t forced = forced_end(b, sw);
  if (forced) return forced > t ? (double)(forced - t) / 1e9 : 0;
  if (sw_state(sw) != FZ_OPEN || at_load_acq(&b->until_gen) != sw_gen(sw)) return 0;
  uint64_t until = at_load_rlx(&b->until);
  return until > t ? (double)(until - t) / 1e9 : 0;
}

/* The larger of v and the highest value of this total read so far, which it becomes. */
static uint64_t seen_max(uint64_t *seen, uint64_t v) {
  uint64_t cur = at_load_rlx(seen);
  while (cur < v && !at_cas_acqrel(seen, &cur, v)) {}
  return cur > v ? cur : v;
}

/*
 * Totals: folded counts plus every live word. The folded count is read first: a word's
 * count moves into it (after the compare-and-swap that recycles the word), so a count
 * is never seen twice, but one caught between the two is missed: a read can be short,
 * never over. Each total is then raised to the highest value any reader saw before (a
 * word per total, moved up with a compare-and-swap): every total ever returned was at
 * most the true count when read, and no total ever goes down. No retry.
 */
static void read_totals(fz_breaker *b, fz_stats *out) {
  uint64_t succ = at_load_sc(&b->folded_succ), rej = at_load_sc(&b->folded_rej);
  uint64_t fail = at_load_sc(&b->folded_fail), slow = at_load_sc(&b->folded_slow);
  for (int i = 0; i < NSTRIPES; i++) {
    succ += tw_all(b->stripes[i].succ);
    rej += tw_all(b->stripes[i].rej);
  }
  fail += tw_all(b->fails);
  slow += tw_all(b->slow);
  /* base: read after the words (acquire), it is at least as new as they are */
  out->successes_total = seen_max(&b->totals_seen[0], succ) - at_load_acq(&b->base[0]);
  out->rejections_total = seen_max(&b->totals_seen[1], rej) - at_load_acq(&b->base[1]);
  out->failures_total = seen_max(&b->totals_seen[2], fail) - at_load_acq(&b->base[2]);
  out->slow_total = seen_max(&b->totals_seen[3], slow) - at_load_acq(&b->base[3]);
}

/* The snapshot of fz_stats_read and fz_stats_peek. With `settle`, due transitions are
 * made (and the code of one returned); without, the state they would give is reported. */
static int stats_fill(fz_breaker *b, fz_stats *out, int settle_due) {
  uint64_t t = now_ns();
  uint32_t id = (uint32_t)at_load_acq(&b->id);  /* before the state word, as in done_slow */
  uint64_t sw = at_load_acq(&b->sw);
  int made = settle_due ? lift_forced(b, &sw, t, id) : 0;
  if (settle_due && !made) made = settle(b, &sw, t, id);
  uint32_t e = (uint32_t)epoch_at(b, t, id);
  memset(out, 0, sizeof *out);
  out->state = sw_state(sw);
  out->generation = sw_gen(sw);
  uint64_t forced = forced_end(b, sw);
  if (!settle_due && forced && t >= forced) out->state = FZ_HALF_OPEN;  /* as open and due */
  if (!settle_due && out->state == FZ_OPEN && open_due(b, sw, t)) out->state = FZ_HALF_OPEN;
  else if (!settle_due && out->state == FZ_HALF_OPEN && probe_timed_out(b, sw, t)) out->state = FZ_OPEN;
  if (OPT(b, flags) & F_CW) {
    uint64_t agg = at_load_acq(&b->cw_agg);
    out->calls = cw_calls(b, agg);
    out->failures = (uint32_t)(agg >> 11 & 0x7ff);
    out->slow = (uint32_t)(agg & 0x7ff);
  } else {
    out->failures = tw_sum(b->fails, e);
    out->slow = tw_sum(b->slow, e);
    out->calls = out->failures + sum_succ(b, e);
  }
  for (int i = 0; i < NSTRIPES; i++) out->rejections += tw_sum(b->stripes[i].rej, e);
  if (out->calls) {
    out->failure_rate = (double)out->failures / out->calls;
    out->slow_rate = (double)out->slow / out->calls;
  }
  out->retry_after = fz_retry_after(b);
  read_totals(b, out);
  out->opens_total = at_load_acq(&b->opens_total) - at_load_acq(&b->base[4]);
  fzp *p = permits_read(b);
  if (p) {
    out->running = fzp_running(p);
    out->full_total = at_load_rlx(&p->full_total);
    out->rejections_total += out->full_total;  /* both monotonic: so is the sum */
  }
  return made;
}

int fz_stats_read(fz_breaker *b, fz_stats *out) { return stats_fill(b, out, 1); }

void fz_stats_peek(fz_breaker *b, fz_stats *out) { stats_fill(b, out, 0); }

/* ---------------------------------------------------------------- manual states */

/* A breaker retired by a removal or an eviction (FZ_REMOVED) is left alone: a manual
 * state through a handle that went stale meanwhile must not bring it back (0). */
static int move_to(fz_breaker *b, int to) {
  uint32_t id = (uint32_t)at_load_acq(&b->id);
  uint64_t sw = at_load_acq(&b->sw);
  for (;;) {
    if (sw_state(sw) == FZ_REMOVED) return 0;
    /* a reset lays the fresh window of the generation it moves from as a probe's closer
     * does (lay_fresh), so that a closer of the same half-open that lays after the reset
     * moves nothing. lay_fresh fails only when the state has moved on (stamp finishes a
     * dead stamper's claim): this loop never spins on an unchanged sw */
    if (to == FZ_CLOSED) {
      if (!lay_fresh(b, sw, id, "reset-checked")) {
        sw = at_load_acq(&b->sw);
        continue;
      }
      FAULT("reset-laid");
    }
    if (at_cas_acqrel(&b->sw, &sw, sw_make(sw_gen(sw) + 1, to))) break;
  }
  return trans_code(sw_state(sw), to);
}

/* ---------------------------------------------------------------- timed forced_open */

/* Publishes the end of the timed forced_open of generation gen BEFORE the swap that
 * enters it: stamp_open's protocol (one for every timed stamp), on forced_until/forced_gen
 * (own fields, so that a trip racing with the force-open never lends it its end). A
 * stamper whose view is late never writes over a newer stamp, so none can leave the
 * forced_open of a later generation without its end (forced for ever). */
static void stamp_forced(fz_breaker *b, uint64_t gen, uint64_t end_ns) {
  stamp(&b->forced_gen, &b->forced_until, gen, end_ns, "forced-stamping");
}

/* The end (ns) of the forced_open of state word sw when it is timed; 0 when sw is not
 * a forced_open or one until reset (no complete stamp of its generation). */
static uint64_t forced_end(fz_breaker *b, uint64_t sw) {
  /* acquire: pairs with the release at the end of stamp_forced */
  if (sw_state(sw) != FZ_FORCED_OPEN || at_load_acq(&b->forced_gen) != sw_gen(sw)) return 0;
  return at_load_rlx(&b->forced_until);
}

/*
 * A timed forced_open whose time is up at t becomes an open circuit whose period is
 * over, so that probes decide: forced_open -> open -> half_open, made in one swap from
 * generation gen to gen + 2 (two transitions, two generations; no one ever sees the open
 * state of gen + 1, which would be due at once, so no stamp of it is needed). One swap,
 * so that the caller that lifts it is the one that makes the half-open: fz_enter's
 * probe then carries both transitions (KIND_LIFT), as a call that ends an open period
 * carries open -> half_open. Returns the two transition codes, in order (first + 128 *
 * second), when this caller made it, else 0; leaves in *sw the state word it swapped
 * in, or the current one.
 */
static int lift_forced(fz_breaker *b, uint64_t *sw, uint64_t t, uint32_t id) {
  uint64_t end = forced_end(b, *sw), want = *sw;
  if (!end || t < end) return 0;
  FAULT("lifting");
  uint64_t half = sw_make(sw_gen(want) + 2, FZ_HALF_OPEN);
  if (!at_cas_acqrel(&b->sw, &want, half)) {
    *sw = at_load_acq(&b->sw);
    return 0;
  }
  FAULT("lifted");
  set_if(b, id, &b->cur_open_ns, OPT(b, open_for_ns));  /* a new run of open periods */
  *sw = half;
  return trans_code(FZ_FORCED_OPEN, FZ_OPEN) + 128 * trans_code(FZ_OPEN, FZ_HALF_OPEN);
}

int fz_force_open_for(fz_breaker *b, double seconds) {
  if (!(seconds > 0 && seconds <= FZ_MAX_FORCE_OPEN)) return FZ_EINVAL;
  uint64_t end = now_ns() + (uint64_t)llround(seconds * 1e9);
  uint64_t sw = at_load_acq(&b->sw);
  for (;;) {
    if (sw_state(sw) == FZ_REMOVED) return 0;  /* as move_to */
    stamp_forced(b, sw_gen(sw) + 1, end);
    FAULT("forced-stamped");
    if (at_cas_acqrel(&b->sw, &sw, sw_make(sw_gen(sw) + 1, FZ_FORCED_OPEN))) break;
  }
  return trans_code(sw_state(sw), FZ_FORCED_OPEN);
}

int fz_reset(fz_breaker *b) { return move_to(b, FZ_CLOSED); }
int fz_force_open(fz_breaker *b) { return move_to(b, FZ_FORCED_OPEN); }
int fz_disable(fz_breaker *b) { return move_to(b, FZ_DISABLED); }

/* ---------------------------------------------------------------- late outcomes */

/* The outcome of a call whose breaker was evicted while it ran, counted into b (the
 * breaker of its name now) as a call of b's current generation when b is closed. */
int fz_late_id(fz_breaker *b, uint32_t id, int outcome, double elapsed) {
  uint64_t sw = at_load_acq(&b->sw);  /* acquire: as in fz_enter_id */
  if ((uint32_t)at_load_acq(&b->id) != id || sw_state(sw) == FZ_REMOVED) return FZ_ESTALE;
  if (sw_state(sw) != FZ_CLOSED || outcome < FZ_SUCCESS || outcome > FZ_IGNORE) return 0;
  return fz_done(b, ticket(b, sw_gen(sw), 0, KIND_NORMAL, 0), outcome, elapsed);
}

int fzi_thread_stripe(void) { return t_stripe == UINT32_MAX ? -1 : (int)t_stripe; }

/* ---------------------------------------------------------------- the library */

/*
 * The registry is process-wide, so this library must stay loaded while the process
 * lives: when the last Lua state that FFI-loaded it closes, LuaJIT dlcloses it, and a
 * state opened later would find an empty registry. Loading ourselves once more with
 * RTLD_NODELETE pins the mapping (no link flag needed, so luarocks builds get it too).
 */
/* A forked child (an nginx worker) must not keep its parent's stripe and random state:
 * every worker would count on one stripe and draw the same jitter. */
static void forget_thread_state(void) {
  t_stripe = UINT32_MAX;
  t_rng = 0;
}

__attribute__((constructor)) static void pin_library(void) {
  Dl_info info;
  if (dladdr((void *)(uintptr_t)pin_library, &info) && info.dli_fname)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  pthread_atfork(NULL, NULL, forget_thread_state);
  fzi_find_vdso_clock();
}


/* ---------------------------------------------------------------- for the registry */

/* What csrc/fz_registry.c needs of a breaker (fz_internal.h): the registry owns slots,
 * names and the index; the breaker's words stay private to the core's files
 * (fz_internal.h, FZ_BREAKER_WORDS). */

size_t fzi_breaker_size(void) { return (sizeof(fz_breaker) + LINE - 1) / LINE * LINE; }

uint32_t fz_breaker_id(const fz_breaker *b) { return (uint32_t)at_load_acq(&b->id); }

void fzi_set_id(fz_breaker *b, uint64_t id) {
  at_store_rel(&b->id, id);  /* release: pairs with the acquire in fz_enter_id and lookups */
}

/* The words of slot b's previous breaker that a call of it may still swap (see
 * "Incarnations"), given values in tmp (the next breaker, built aside) that those words
 * never held: epochs start EPOCH_GAP past the old ones (and the shift never goes back),
 * the count window's era and sequence go on, and every total starts past everything
 * counted so far (its base). */
#define EPOCH_GAP (UINT64_C(1) << 20)
static void carry_on(fz_breaker *b, fz_breaker *tmp) {
  uint64_t cur = at_load_acq(&b->cur_epoch), shift = at_load_acq(&b->shift) + 1;
  uint64_t raw = (uint64_t)(((u128)now_ns() * tmp->bucket_inv) >> 64);
  if (raw + shift < cur + EPOCH_GAP) shift = cur + EPOCH_GAP - raw;
  tmp->shift = shift;
  tmp->cur_epoch = raw + shift;
  retire_fresh(tmp, tmp->cur_epoch);
  tmp->cw_agg = ((at_load_acq(&b->cw_agg) >> 33) + 1) << 33;
  tmp->cw_n = (tmp->cw_agg >> 33) << 32 | tmp->cfg.count_window;
  tmp->cw_seq = at_load_acq(&b->cw_seq) + 1;
  uint64_t live[4] = { 0, 0, tw_all(b->fails), tw_all(b->slow) };
  for (int i = 0; i < NSTRIPES; i++) live[0] += tw_all(b->stripes[i].succ), live[1] += tw_all(b->stripes[i].rej);
  uint64_t *folded[4] = { &b->folded_succ, &b->folded_rej, &b->folded_fail, &b->folded_slow };
  uint64_t *to[4] = { &tmp->folded_succ, &tmp->folded_rej, &tmp->folded_fail, &tmp->folded_slow };
  for (int i = 0; i < 4; i++) {
    uint64_t past = at_load_acq(folded[i]) + live[i] + 1, seen = at_load_acq(&b->totals_seen[i]);
    if (past <= seen) past = seen + 1;
    *to[i] = tmp->base[i] = tmp->totals_seen[i] = past;
  }
  tmp->opens_total = tmp->base[4] = at_load_acq(&b->opens_total) + 1;
  uint64_t open_ns = at_load_acq(&b->cur_open_ns);
  if (tmp->cur_open_ns == open_ns) tmp->cur_open_ns ^= 1;  /* 1 ns off: a value it never held */
}

/* A breaker in a registry slot, with the slot's ring (room for FZ_MAX_COUNT_WINDOW).
 * Built aside, then stored word by word with release stores, whether the slot was used
 * before or not: a stale handle may be reading any word of the slot meanwhile, and a
 * reader that acquires one of the new words then sees the retirement that came before
 * this reuse (fzi_retire, and the even identity the registry stored after it).
 *
 * Nothing that numbers the slot's life restarts (docs/registry.md, "Incarnations"):
 *   - the identity is not written at all: it stays the even value the removal left (or
 *     0 for a slot never used) until the registry publishes the next odd one, so a
 *     process killed anywhere in here leaves an identity that the next reuse continues;
 *   - the generation goes on from the state word's, and the words stamped with a
 *     generation (the open and forced ends, the half-open word, probe starts, the last
 *     eviction, a close's fresh window) are kept: their generations are all older than
 *     the new breaker's;
 *   - the key goes on (a ticket of an earlier breaker here is stale by generation).
 * The state word is stored last. */
void fzi_slot_init(fz_breaker *b, const fz_config *c, const char *name_at, uint32_t *ring) {
  typedef uint64_t __attribute__((may_alias)) word;
  fz_breaker tmp;
  uint64_t gen = sw_gen(at_load_acq(&b->sw)), key = at_load_rlx(&b->key);
  breaker_init(&tmp, c);
  tmp.name_off = (int64_t)(name_at - (char *)b);
  if (key) tmp.key = key;  /* 0: a slot never used takes the one breaker_init drew */
  for (int i = 0; i < EVICTIONS; i++) tmp.evicted[i] = at_load_rlx(&b->evicted[i]);  /* late outcomes */
  tmp.ev_next = at_load_rlx(&b->ev_next);
  tmp.until = at_load_rlx(&b->until), tmp.until_gen = at_load_rlx(&b->until_gen) & ~STAMPING;
  tmp.forced_until = at_load_rlx(&b->forced_until);
  tmp.forced_gen = at_load_rlx(&b->forced_gen) & ~STAMPING;
  tmp.ho = at_load_rlx(&b->ho);
  tmp.fresh_gen = at_load_rlx(&b->fresh_gen) & ~STAMPING, tmp.fresh_shift = at_load_rlx(&b->fresh_shift);
  tmp.era_gen = at_load_rlx(&b->era_gen) & ~STAMPING, tmp.fresh_era = at_load_rlx(&b->fresh_era);
  for (int i = 0; i < FZ_MAX_PROBES; i++) tmp.probe_start[i] = at_load_rlx(&b->probe_start[i]);
  carry_on(b, &tmp);
  tmp.in_registry = 1;
  tmp.sw = sw_make(gen + 1, FZ_CLOSED);
  tmp.last_use = (uint64_t)(((u128)now_ns() * tmp.bucket_inv) >> 64);
  if (tmp.last_use == at_load_acq(&b->last_use)) tmp.last_use++;  /* a value it never held */
  tmp.cw_ring_off = (int64_t)((char *)ring - (char *)b);
  tmp.permits_off = tmp.cw_ring_off + (int64_t)FZ_RING_BYTES;
  tmp.permits_taken = at_load_acq(&b->permits_taken);  /* the slot's permits: kept */
  word *to = (word *)(void *)b;
  const word *from = (const word *)(const void *)&tmp;
  _Static_assert(offsetof(fz_breaker, sw) == 0, "the state word comes first");
  _Static_assert(offsetof(fz_breaker, id) == sizeof(word), "the identity comes second");
  for (size_t i = 2; i < sizeof tmp / sizeof(word); i++) at_store_rel((uint64_t *)&to[i], from[i]);
  for (uint32_t i = 0; i < c->count_window; i++) at_store32_rel(&ring[i], 0);
  /* the state word last (release: pairs with the acquire of a stale handle's read of the
   * state word, so that one that reads the new breaker's state then reads an identity
   * at least as new as the removal's, which came before this reuse: see fz_enter_id) */
  at_store_rel(&b->sw, tmp.sw);
}

/* The options, read word by word with atomic loads: the registry compares them outside
 * its lock, while a reuse of the slot may be storing new ones (fzi_slot_init). */
void fzi_config_load(fz_breaker *b, fz_config *out) {
  typedef uint64_t __attribute__((may_alias)) word;
  _Static_assert(sizeof(fz_config) % sizeof(word) == 0, "fz_config is whole words");
  word *from = (word *)(void *)&b->cfg, *to = (word *)(void *)out;
  for (size_t i = 0; i < sizeof *out / sizeof(word); i++) to[i] = at_load_rlx((uint64_t *)&from[i]);
}

/*
 * A copy of live breaker b into to (a reload's new mapping, seen by no one yet), with
 * its ring into ring. Calls of old workers may run on b meanwhile: every word is read
 * with an atomic load, and what must agree is made to agree. The count window's
 * aggregate is rebuilt from the copied ring (the ring is the truth: an outcome added to
 * the aggregate between the copies of the two would otherwise be counted without its
 * slot, or a slot without its count, and the failure field could go below 0 when that
 * slot is displaced).
 */
void fzi_copy(fz_breaker *to, fz_breaker *b, uint32_t *ring) {
  typedef uint64_t __attribute__((may_alias)) word;
  word *dst = (word *)(void *)to;
  const word *src = (const word *)(const void *)b;
  for (size_t i = 0; i < sizeof *b / sizeof(word); i++) dst[i] = at_load_acq((const uint64_t *)&src[i]);
  uint32_t n = (uint32_t)to->cw_n, *from_ring = (uint32_t *)(void *)((char *)b + to->cw_ring_off);
  to->cw_ring_off = (int64_t)((char *)ring - (char *)to);
  FAULT("migrating");  /* between the breaker's words and its ring */
  if (!to->cw_ring_off || !(to->flags & F_CW)) return;
  uint64_t era = to->cw_agg >> 33, calls = 0, f = 0, sl = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t v = ring[i] = at_load32_acq(&from_ring[i]);
    if (!(v & CW_VALID) || v >> 4 != ((uint32_t)era & 0x0fffffff)) continue;
    calls++, f += !!(v & CW_FAIL), sl += !!(v & CW_SLOW);
  }
  to->cw_agg = era << 33 | calls << 22 | f << 11 | sl;
}

void fzi_set_ring(fz_breaker *b, uint32_t *ring) {
  b->cw_ring_off = ring ? (int64_t)((char *)ring - (char *)b) : 0;
  b->permits_off = ring ? b->cw_ring_off + (int64_t)FZ_RING_BYTES : 0;
}

/* How long the breaker has seen no call, in ns, when it is evictable: closed, no failure
 * in its window, no call running on its max_concurrent permits. -1 otherwise. The last
 * call is known to within a bucket (a tenth of the window): it counts as made at the
 * end of its bucket, so this never says more. */
int64_t fzi_unused_ns(fz_breaker *b) {
  uint64_t sw = at_load_acq(&b->sw), t = now_ns();
  if (sw_state(sw) != FZ_CLOSED) return -1;
  uint64_t e = epoch_at(b, t, fz_breaker_id(b));
  uint32_t f = OPT(b, flags) & F_CW ? (uint32_t)(at_load_acq(&b->cw_agg) >> 11 & 0x7ff) : tw_sum(b->fails, (uint32_t)e);
  if (f) return -1;
  /* 64-bit buckets: no idle time is too long to be told (a 32-bit difference of 1 ms
   * buckets wrapped after 24.8 days, and the breaker was never evicted again) */
  uint64_t now_b = (uint64_t)(((u128)t * OPT(b, bucket_inv)) >> 64), last = at_load_acq(&b->last_use);
  if (now_b <= last) return 0;
  fzp *p = permits_read(b);
  if (p && fzp_in_use(p)) return -1;  /* permits held: its calls run (only an idle one is asked) */
  u128 ns = (u128)(now_b - last - 1) * OPT(b, bucket_ns);
  return ns > INT64_MAX ? INT64_MAX : (int64_t)ns;
}

/* Takes the breaker out of service: its state becomes FZ_REMOVED (generation bumped, so
 * every ticket out is stale). With only_closed, only from closed (an eviction must not
 * race a trip), and the eviction is remembered (`evicted`). Returns 1 when done. */
int fzi_retire(fz_breaker *b, int only_closed) {
  uint64_t sw = at_load_acq(&b->sw), k = at_load_rlx(&b->ev_next) % EVICTIONS;
  uint64_t was = at_load_rlx(&b->evicted[k]);
  for (;;) {
    if (sw_state(sw) == FZ_REMOVED || (only_closed && sw_state(sw) != FZ_CLOSED)) return 0;
    /* an eviction is named (tentatively) before the swap that makes it (release: pairs
     * with the acquire in `stale`), confirmed after it, and unnamed when the swap fails
     * (evictions hold the registry's lock: no other writer of `evicted`) */
    if (only_closed) at_store_rel(&b->evicted[k], (sw_gen(sw) + 1) | TENTATIVE);
    FAULT("retiring");
    if (at_cas_acqrel(&b->sw, &sw, sw_make(sw_gen(sw) + 1, FZ_REMOVED))) {
      if (only_closed) at_store_rel(&b->evicted[k], sw_gen(sw) + 1), at_store_rlx(&b->ev_next, k + 1);
      return 1;
    }
    if (only_closed) at_store_rel(&b->evicted[k], was);
  }
}

/* After a writer died holding the registry's lock (repair): a tentative eviction mark is
 * confirmed when its swap was made, else dropped (the breaker lives on). */
void fzi_finish_marks(fz_breaker *b) {
  for (uint64_t k = 0; k < EVICTIONS; k++) {
    uint64_t ev = at_load_rlx(&b->evicted[k]);
    if (!(ev & TENTATIVE)) continue;
    int made = at_load_acq(&b->sw) == sw_make(ev & ~TENTATIVE, FZ_REMOVED);
    at_store_rel(&b->evicted[k], made ? ev & ~TENTATIVE : 0);
    if (made) at_store_rlx(&b->ev_next, k + 1);
  }
}

int fzi_is_removed(const fz_breaker *b) { return sw_state(at_load_acq(&b->sw)) == FZ_REMOVED; }

/* After the bucket width changed: epochs of the new width start past every epoch of the
 * old one (shift), so the windows' words all fall out (a fresh window, and the epoch
 * remembered for calls that read no clock is one of the new width), and the last use is
 * one of the new width too (idle eviction). */
static void reepoch(fz_breaker *b) {
  uint64_t t = now_ns();
  uint64_t raw = (uint64_t)(((u128)t * OPT(b, bucket_inv)) >> 64);
  uint64_t cur = at_load_rlx(&b->cur_epoch), shift = at_load_rlx(&b->shift);
  if (raw + shift < cur + NBUCKETS + 1) at_store_rlx(&b->shift, cur + NBUCKETS + 1 - raw);
  at_store_rlx(&b->last_use, raw);
  epoch_at(b, t, fz_breaker_id(b));
}

/* Fewer probes than a half-open under way counted: the successes it counted stop one
 * short of the new number, so that the next success closes (as it would without this:
 * probe_record closes on `>=`; this keeps the count within the new number). */
static void fewer_probes(fz_breaker *b, uint32_t probes) {
  uint64_t sw = at_load_acq(&b->sw), ho = at_load_acq(&b->ho);
  if (sw_state(sw) != FZ_HALF_OPEN) return;
  while ((uint32_t)(ho >> 32) == (uint32_t)sw_gen(sw) && ho_succ(ho) >= probes) {
    uint64_t want = (ho & ~(UINT64_C(0x7fff) << 16)) | (uint64_t)(probes - 1) << 16;  /* HO_FAILED kept */
    if (at_cas_acqrel(&b->ho, &ho, want)) break;
  }
}

/* New numeric options for a live breaker (a reload): state and counts are kept. The
 * count window keeps its ring only when its size is unchanged. Calls may run meanwhile
 * (in nginx, the old workers, while the master reloads): every option is stored with a
 * relaxed atomic store, and calls read them with relaxed loads (OPT); a call that
 * straddles the reload may mix old and new options for that one call. */
void fzi_reconfigure(fz_breaker *b, const fz_config *c) {
  typedef uint64_t __attribute__((may_alias)) word;
  uint32_t old_cw = OPT(b, cfg.count_window), old_probes = OPT(b, cfg.probes);
  uint64_t old_bucket = OPT(b, bucket_ns);
  fz_breaker tmp;
  breaker_init(&tmp, c);
  word *to = (word *)(void *)&b->cfg;
  const word *from = (const word *)(const void *)&tmp.cfg;
  for (size_t i = 0; i < sizeof tmp.cfg / sizeof(word); i++) at_store_rlx((uint64_t *)&to[i], from[i]);
  at_store_rlx(&b->bucket_ns, tmp.bucket_ns), at_store_rlx(&b->bucket_inv, tmp.bucket_inv);
  if (tmp.bucket_ns != old_bucket) reepoch(b);
  at_store_rlx(&b->open_for_ns, tmp.open_for_ns), at_store_rlx(&b->max_open_ns, tmp.max_open_ns);
  at_store_rlx(&b->probe_timeout_ms, tmp.probe_timeout_ms);
  at_store_rlx(&b->cur_open_ns, tmp.open_for_ns);
  if (b->cw_ring_off && tmp.cfg.count_window != old_cw) {
    uint32_t *ring = (uint32_t *)(void *)((char *)b + b->cw_ring_off);
    uint64_t agg = at_load_acq(&b->cw_agg);  /* a fresh count window, of the new size: */
    /* the size first, for the era about to start (release: a call that reads the era
     * still current sees it is ending and counts nothing, see cw_record) */
    at_store_rel(&b->cw_n, ((agg >> 33) + 1) << 32 | tmp.cfg.count_window);
    for (uint32_t i = 0; i < tmp.cfg.count_window; i++) at_store32_rlx(&ring[i], 0);
    while (!at_cas_acqrel(&b->cw_agg, &agg, ((agg >> 33) + 1) << 33)) {}
  }
  at_store32_rlx(&b->flags, tmp.flags);
  if (tmp.cfg.probes < old_probes) fewer_probes(b, tmp.cfg.probes);
}

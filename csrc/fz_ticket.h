/*
 * fz_ticket.h -- tickets (see the design note in fz_state.c) and the ledgers of fz_allow.
 * Included by fz_state.c only: the hot path (fz_enter_id, fz_allow_id, fz_done) is one
 * translation unit, so what it calls here is inlined as it was when this was all fz.c.
 */
#ifndef FZ_TICKET_H
#define FZ_TICKET_H

#include "fz_internal.h"

#include <pthread.h>
#include <stdlib.h>

/* ---------------------------------------------------------------- tickets */

static uint64_t sw_gen(uint64_t sw) { return sw >> 3; }
static int sw_state(uint64_t sw) { return (int)(sw & 7); }
static uint64_t sw_make(uint64_t gen, int state) { return gen << 3 | (uint64_t)state; }
static int trans_code(int from, int to) { return 64 + from * 8 + to; }

static uint64_t ticket_bits(const fz_breaker *b, uint64_t gen, unsigned slot, int kind, int made) {
  /* relaxed: a handle gone stale may read the key while a reuse of its registry slot
   * stores it again (fzi_slot_init; the same key, which the slot keeps) */
  return at_load_rlx(&b->key) | (gen & GEN_MASK) << 8 | (uint64_t)slot << 3 | (uint64_t)kind << 1 |
         (uint64_t)made;
}

/* Tickets are below 2^53: converted as signed, one instruction. */
static double ticket(const fz_breaker *b, uint64_t gen, unsigned slot, int kind, int made) {
  return (double)(int64_t)ticket_bits(b, gen, slot, kind, made);
}

static double rejection(int state, int made) { return -(double)(1 + state * 4 + made); }


/* ---------------------------------------------------------------- ledgers */

/*
 * Tickets of fz_allow (the two-step API) are recorded, so that fz_done refuses one
 * reported twice or given to another breaker. Each thread that allows owns a ledger
 * (one of LANES per process, claimed at its first fz_allow and given back when it
 * exits): LEDGER entries { tk, who, inner }, where tk is the tracked ticket (REPORTED
 * set once reported), who the breaker, inner the ticket fz_enter gave. The tracked
 * ticket names its entry (lane, index) and carries a use count (the lane's tickets so
 * far, mod 2^23), its low 7 bits those of inner (so made, kind and slot read the same).
 * Only the owner writes an entry anew, and only one whose ticket was reported: the entry
 * it issued last when that one is back (allow then report reuses one entry, hot in
 * cache), else the next free one a cursor finds among 8 (with none free, the ticket is
 * left untracked: checked by key, generation and state only). A ticket whose entry holds
 * a later use of it was reported (FZ_EREPORTED). The owner's report is a plain load and
 * store; a report from another thread swaps tk with a compare-and-swap. So every report
 * is checked exactly, except one ticket reported twice at the same instant from two
 * threads. Ledgers are process memory, never in a shared registry: a ticket of another
 * process names no entry. The lane, the entry issued last, the search cursor and the
 * use count are the owner's, in TLS (the use count is saved in the ledger when the
 * thread exits, for the lane's next owner).
 */
typedef struct entry {
  uint64_t tk, who, inner;  /* concurrent: see above */
  uint64_t pad;             /* 32 bytes: an index is a shift */
} entry;

typedef struct ledger {
  uint32_t lane;
  uint32_t uses;            /* tickets issued, kept while no thread owns the lane */
  entry e[LEDGER];
} ledger;

static ledger *g_ledgers[LANES];     /* concurrent: each set once */
static uint32_t g_lane_owned[LANES]; /* concurrent: 1 while a thread owns the lane */
/* The thread's side of its lane, in one TLS block: the hot path finds all of it from
 * one thread-pointer offset. en and bits say where the entry issued last is, as the
 * hot path wants it (see lane_point). */
typedef struct lane_tls {
  entry *en;                /* the entry issued last, or NULL while the thread has no lane */
  uint64_t bits;            /* its tickets' entry, lane and tracked bits (TK_WHERE), or 0 */
  ledger *l;                /* the thread's ledger, or NULL */
  uint32_t lane;            /* its lane, or LANES for none */
  uint32_t last, cursor;    /* the entry issued last; where the search goes on */
  uint32_t uses;            /* tickets this lane issued */
} lane_tls;
static TLS lane_tls t_ln = { NULL, 0, NULL, LANES, 0, 0, 0 };

#define TK_WHERE UINT64_C(0x3fffff80)  /* a tracked ticket's entry, lane and tracked bits */

/* en and bits from l, lane and last (whenever one of them changes). */
static void lane_point(lane_tls *me) {
  me->en = me->l ? &me->l->e[me->last] : NULL;
  me->bits = me->l ? (uint64_t)me->last << 18 | (uint64_t)me->lane << 8 | TK_TRACKED : 0;
}
static pthread_key_t g_lane_key;
static pthread_once_t g_lane_once = PTHREAD_ONCE_INIT;

static void lane_release(void *p) {
  ledger *l = p;
  l->uses = t_ln.uses;
  t_ln.l = NULL, t_ln.lane = LANES;
  lane_point(&t_ln);
  /* release: the next owner sees this one's cursor and entries */
  __atomic_store_n(&g_lane_owned[l->lane], 0, __ATOMIC_RELEASE);
}

static void lane_key_init(void) { pthread_key_create(&g_lane_key, lane_release); }

static __attribute__((noinline)) ledger *lane_claim(void) {
  pthread_once(&g_lane_once, lane_key_init);
  for (uint32_t i = 0; i < LANES; i++) {
    uint32_t free_ = 0;
    if (at_load32_rlx(&g_lane_owned[i]) || !at_cas32_acqrel(&g_lane_owned[i], &free_, 1)) continue;
    ledger *l = __atomic_load_n(&g_ledgers[i], __ATOMIC_ACQUIRE);  /* pairs with the release below */
    if (!l) {
      if (!(l = calloc(1, sizeof *l))) {
        __atomic_store_n(&g_lane_owned[i], 0, __ATOMIC_RELEASE);
        return NULL;
      }
      l->lane = i;
      __atomic_store_n(&g_ledgers[i], l, __ATOMIC_RELEASE);
    }
    pthread_setspecific(g_lane_key, l);
    t_ln.lane = i, t_ln.uses = l->uses, t_ln.l = l;
    lane_point(&t_ln);
    return l;
  }
  return NULL;  /* LANES threads hold a lane: tickets go untracked */
}

/* Whether ledger entry word cur is free: never used, or its ticket reported. */
static int entry_free(uint64_t cur) { return !cur || (cur & REPORTED); }

/* The entry of ledger l after the cursor that is free, or NULL among 8 outstanding in a
 * row; it becomes the entry issued last. */
static __attribute__((noinline)) entry *entry_search(ledger *l, uint64_t *cur) {
  for (int k = 0; k < 8; k++) {
    uint32_t i = t_ln.cursor = (t_ln.cursor + 1) & (LEDGER - 1);
    *cur = at_load_acq(&l->e[i].tk);  /* acquire: as in track */
    if (entry_free(*cur)) {
      t_ln.last = i;
      lane_point(&t_ln);
      return &l->e[i];
    }
  }
  return NULL;
}

/* Writes the tracked ticket that stands for u (whose low 7 bits are low) into the
 * thread's entry issued last, en, which is free. */
static inline __attribute__((always_inline)) double track_at(fz_breaker *b, uint64_t u, uint64_t low,
                                                             lane_tls *me, entry *en) {
  /* the use count from a counter of the thread, not from the entry: a ticket does not
   * wait for the report of the one before it to be stored and read back */
  uint64_t use = ++me->uses & USE_MASK;
  uint64_t tk = use << 30 | me->bits | low;
  at_store_rlx(&en->who, (uint64_t)(uintptr_t)b);
  at_store_rlx(&en->inner, u);
  at_store_rel(&en->tk, tk);  /* release: a reporter that acquires tk sees who and inner */
  return (double)(int64_t)tk;
}

/* track when the thread has no ledger yet, or the entry it issued last is still out. */
static __attribute__((noinline)) double track_slow(fz_breaker *b, uint64_t u) {
  lane_tls *me = &t_ln;
  if (!me->l && !lane_claim()) return (double)(int64_t)u;
  entry *en = me->en;
  uint64_t cur = at_load_acq(&en->tk);  /* acquire: as in track */
  if (!entry_free(cur) && !(en = entry_search(me->l, &cur))) return (double)(int64_t)u;
  return track_at(b, u, u & 0x7f, me, en);
}

/* Records the admitted ticket u of fz_enter, whose low 7 bits are low; returns the
 * tracked ticket that stands for it (u itself when the thread has no lane, or 8 of its
 * tickets in a row are out). The common case, allow then report, finds the entry it
 * issued last back. Calls that overlap in one thread (the requests of an nginx worker)
 * find it still out: then the entry after the search cursor, which is free unless
 * LEDGER tickets ago is still out (entry_search's first look, without its call). The
 * rest is in track_slow, so this stays a leaf. */
static inline __attribute__((always_inline)) double track(fz_breaker *b, uint64_t u, uint64_t low) {
  lane_tls *me = &t_ln;
  entry *en = me->en;
  if (__builtin_expect(!en, 0)) return track_slow(b, u);
  /* acquire: pairs with the swap of another thread's report, which read who and inner */
  uint64_t cur = at_load_acq(&en->tk);
  if (__builtin_expect(!entry_free(cur), 0)) {
    uint32_t i = (me->cursor + 1) & (LEDGER - 1);
    en = &me->l->e[i];  /* (me->en set: the thread has a ledger) */
    cur = at_load_acq(&en->tk);  /* acquire: as above */
    if (__builtin_expect(!entry_free(cur), 0)) return track_slow(b, u);
    me->cursor = me->last = i;
    lane_point(me);
  }
  return track_at(b, u, low, me, en);
}

/* Why untrack refused tracked ticket t whose entry holds cur (see untrack). */
static __attribute__((noinline)) int refusal(fz_breaker *b, uint64_t t, const entry *en, uint64_t cur) {
  uint64_t diff = (cur & ~REPORTED) ^ t;
  if (diff & ~(USE_MASK << 30) || at_load_rlx(&en->who) != (uint64_t)(uintptr_t)b) return FZ_ETICKET;
  /* an earlier use of the entry: reported before the entry was used again */
  if (diff && ((cur >> 30) - (t >> 30)) % (USE_MASK + 1) > (USE_MASK >> 1)) return FZ_ETICKET;
  return FZ_EREPORTED;
}

/* The ticket of fz_enter that tracked ticket t stands for, in *u, marking t reported.
 * Returns 0, FZ_ETICKET (not issued by b's fz_allow) or FZ_EREPORTED. */
static inline __attribute__((always_inline)) int untrack(fz_breaker *b, uint64_t t, uint64_t *u) {
  lane_tls *me = &t_ln;
  entry *en = me->en;
  int own = 1;
  if (__builtin_expect((t & TK_WHERE) != me->bits, 0)) {  /* not the entry this thread issued last */
    uint32_t lane = (uint32_t)(t >> 8 & (LANES - 1));
    ledger *l = me->l;
    own = lane == me->lane;
    if (!own && !(l = __atomic_load_n(&g_ledgers[lane], __ATOMIC_ACQUIRE))) return FZ_ETICKET;
    en = &l->e[(t >> 18) & (LEDGER - 1)];
  }
  uint64_t cur = at_load_acq(&en->tk);  /* acquire: pairs with the release in track */
  if (cur != t || at_load_rlx(&en->who) != (uint64_t)(uintptr_t)b) {
    int rc = refusal(b, t, en, cur);
    if (!rc) __builtin_unreachable();  /* never 0: fz_done returns it, a tail call */
    return rc;
  }
  *u = at_load_rlx(&en->inner);
  if (own) at_store_rlx(&en->tk, t | REPORTED);  /* the owner: no other writer of a live entry */
  else if (!at_cas_acqrel(&en->tk, &cur, t | REPORTED)) return FZ_EREPORTED;
  return 0;
}

#endif /* FZ_TICKET_H */

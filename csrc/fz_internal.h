/*
 * fz_internal.h -- what the registry (fz_registry.c) needs of a breaker (fz_state.c), and
 * below it, for the core's own files only, the breaker's words.
 * Not exported: every symbol here is hidden (-fvisibility=hidden).
 */
#ifndef FZ_INTERNAL_H
#define FZ_INTERNAL_H

#include "fz.h"

#include <stddef.h>
#include <stdint.h>

size_t fzi_breaker_size(void);  /* bytes of a breaker, a multiple of a cache line */
/* name_at: the slot's name, stored by the registry (NUL-terminated, in the same mapping) */
void fzi_slot_init(fz_breaker *b, const fz_config *c, const char *name_at, uint32_t *ring);
void fzi_set_name(fz_breaker *b, const char *name_at);
void fzi_config_load(fz_breaker *b, fz_config *out);
void fzi_set_ring(fz_breaker *b, uint32_t *ring);
void fzi_copy(fz_breaker *to, fz_breaker *b, uint32_t *ring);
void fzi_set_id(fz_breaker *b, uint64_t id);
int64_t fzi_unused_ns(fz_breaker *b);
int fzi_retire(fz_breaker *b, int only_closed);
void fzi_finish_marks(fz_breaker *b);
int fzi_is_removed(const fz_breaker *b);
void fzi_reconfigure(fz_breaker *b, const fz_config *c);
void fzi_permits_copy(fz_breaker *to, fz_breaker *from);  /* a copy made by a reload */
/* Registers this process for the permits' barriers (once; 1 if it could), for the
 * processes it forks: a shared registry's maker calls it, before nginx forks the workers. */
int fzp_register(void);
/* The shared registry's count of the counter stripes handed out, before this one (the
 * stripe is it modulo NSTRIPES), for a thread that takes its stripe (fz_window.h,
 * my_stripe); UINT32_MAX when there is no shared registry. */
uint32_t fzi_stripe_next(void);
/* This thread's counter stripe, -1 before its first count (for tests). */
int fzi_thread_stripe(void);

/* A registry slot's ring area: the count-window ring (room for FZ_MAX_COUNT_WINDOW),
 * then the breaker's permits (max_concurrent, csrc/fz_permits.h: 2,624 bytes, touched only
 * by a breaker with the option). */
#define FZ_RING_BYTES ((size_t)FZ_MAX_COUNT_WINDOW * sizeof(uint32_t))
#define FZ_PERMITS_BYTES ((size_t)2624)

/* ---- the breaker's words: for the files of the core (fz_state.c, fz_clock.c,
 * fz_config.c, fz_permits.c), which define FZ_BREAKER_WORDS before including this. */
#ifdef FZ_BREAKER_WORDS

#include "fz_atomic.h"
#include "fz_fault.h"
#include "fz_permits.h"

#include <time.h>

#define LINE 64
#define MS42 ((UINT64_C(1) << 42) - 1)  /* probe starts: ms mod 2^42 (139 years) */
#define SPAN 10                 /* buckets a time window spans */
#define NBUCKETS (SPAN + 1)     /* plus the one being filled */
#define NSTRIPES 4              /* per-thread counter stripes */
#define TICKET_LIMIT 9007199254740992.0 /* 2^53: tickets are exact doubles */
#define GEN_MASK UINT64_C(0xffffffff)      /* generation bits in a ticket */
#define KEY_MASK (UINT64_C(0x1fff) << 40)  /* the breaker's key in a ticket */
#define TK_TRACKED 0x80u                   /* a ticket of fz_allow, recorded in a ledger */
#define LANES 1024                         /* ledgers of a process: threads that allow at once */
#define LEDGER 4096                        /* entries of one ledger (a power of 2) */
#define USE_MASK ((UINT64_C(1) << 23) - 1)  /* uses of a ledger entry, in its tickets */
#define REPORTED (UINT64_C(1) << 63)       /* in a ledger entry's tk */
#define MANUAL_ORIGIN (UINT64_C(1) << 62) /* the manual clock's 0 s, so negatives work */
#define MANUAL_RANGE 4.5e9                /* seconds either side of it */
#define EVICTIONS 4                       /* evictions of a slot remembered (late outcomes) */
#define TENTATIVE (UINT64_C(1) << 63)     /* an eviction mark before its swap */

__extension__ typedef unsigned __int128 u128;

/* KIND_LIFT: a probe whose call also lifted a timed forced_open (flag set; see the
 * design note in fz_state.c) */
enum { KIND_LIFT = 0, KIND_NORMAL = 1, KIND_PROBE = 2, KIND_PASS = 3 };
/* What a call made, in a rejection's `made` (and a ticket's flag, MADE_LIFT as KIND_LIFT) */
enum { MADE_HALF = 1, MADE_REOPEN = 2, MADE_LIFT = 3 };
enum { F_RATE = 1, F_CW = 2, F_SLOW = 4 };  /* flags: rules that need the slow path on success */

/* The outcome bits of a count-window slot (low 4 bits; the era is above them). */
enum { CW_VALID = 1, CW_FAIL = 2, CW_SLOW = 4 };

/* Counters a thread bumps on the hot path: one stripe a thread, on lines of its own. */
typedef struct stripe {
  _Alignas(LINE) uint64_t succ[NBUCKETS];  /* tagged: epoch << 32 | successes */
  uint64_t rej[NBUCKETS];                  /* tagged: epoch << 32 | rejections */
} stripe;

struct fz_breaker {
  /* Read on every call, written by transitions only. */
  _Alignas(LINE) uint64_t sw;   /* concurrent: generation << 3 | state */
  uint64_t id;                  /* concurrent: identity (registry: odd while live; 0 anonymous) */
  uint64_t until;               /* concurrent: end of the open period, ns */
  uint64_t until_gen;           /* concurrent: generation `until` belongs to (| STAMPING) */
  uint64_t cur_epoch;           /* concurrent: bucket epoch of the last clock read */
  uint64_t shift;               /* concurrent: added to epochs; bumped to start a fresh window */
  /* concurrent (rewritten by a reload, fzi_reconfigure; read with relaxed loads): */
  uint64_t bucket_ns, bucket_inv, open_for_ns, max_open_ns, probe_timeout_ms;
  uint32_t flags, in_registry;  /* flags: concurrent, as the line above */
  uint64_t key;                 /* concurrent (rewritten, unchanged, by a reuse of its registry slot): random, bits 40-52 of its tickets */
  fz_config cfg;                /* concurrent: rewritten only by a reload (fzi_reconfigure); OPT() */
  /* Bytes from the breaker to its name, in its registry slot's meta (fz_registry.c), the
   * one copy of it; 0: anonymous (fz_breaker_name answers ""). */
  int64_t name_off;

  /* The generations of the FZ_REMOVED states the last EVICTIONS idle evictions of this
   * slot's breakers made (0: none), kept when the slot is reused: a ticket of the
   * generation before one of them was current when its breaker was evicted, and its
   * outcome is the name's (fz_done answers FZ_ESTALE, see fz_late_id). A mark is written
   * TENTATIVE before the eviction's swap and confirmed after it; a tentative mark counts
   * only while the state word is that very FZ_REMOVED state (so an eviction killed
   * before its swap marks nothing: the breaker lives on, fzi_finish_marks drops it).
   * (Cold, beside the options: in the spare words of their last line.) */
  uint64_t evicted[EVICTIONS];  /* concurrent; written under the registry's lock */
  uint64_t ev_next;             /* under the registry's lock: the next mark to write */

  /* Half-open admission. */
  _Alignas(LINE) uint64_t ho;   /* concurrent: gen32 << 32 | HO_FAILED | successes << 16 | busy slots */
  uint64_t probe_start[FZ_MAX_PROBES]; /* concurrent: gen22 << 42 | start in ms (mod 2^42) */
  /* The fresh window a move from generation g to closed lays (a half-open's close or a
   * manual reset: lay_fresh): the shift and count-window era it raises to, each stamped
   * with g + 1 as `until` is (stamp), so that every closer of g lays the same one and a
   * late one lays nothing new. (In the spare words of this line: no offset moves.) */
  uint64_t fresh_gen, fresh_shift;  /* concurrent: g + 1 (| STAMPING), the shift to raise to */
  uint64_t era_gen, fresh_era;      /* concurrent: g + 1 (| STAMPING), the era to raise to */

  /* Failures and slow calls: not striped, they decide trips and are rare. */
  _Alignas(LINE) uint64_t fails[NBUCKETS]; /* concurrent, tagged */
  uint64_t slow[NBUCKETS];                 /* concurrent, tagged */

  /* Cold: totals folded out of recycled buckets, backoff state. */
  _Alignas(LINE) uint64_t folded_succ;  /* (_Alignas on its own: it applies to each declarator) */
  uint64_t folded_rej, folded_fail, folded_slow;
  uint64_t totals_seen[4];        /* concurrent: the highest totals read (succ, rej, fail, slow) */
  uint64_t opens_total;           /* concurrent */
  /* What the totals above (folded + live words, and opens_total) stood at when this
   * breaker took its registry slot, plus one: its own totals are the difference. Totals
   * only move forward over the slot's life, so a late write of an earlier breaker here,
   * prepared from a value read before the reuse, can never find that value again. */
  uint64_t base[5];               /* succ, rej, fail, slow, opens; 0 outside a registry */
  uint64_t cur_open_ns;           /* concurrent: the open period before jitter */
  uint64_t last_use;              /* concurrent: bucket (no shift, all 64 bits) a call last recycled a word in */

  /* The count window: a ring of the last N outcomes and one aggregate word (beside the
   * cold words, which are written once a bucket at most: a breaker is 1,600 bytes). */
  uint64_t cw_seq;                 /* concurrent: calls recorded so far */
  uint64_t cw_agg;                 /* concurrent: era << 33 | calls << 22 | fails << 11 | slow */
  uint64_t cw_n;                   /* concurrent: era << 32 | ring size, for eras >= that era */
  int64_t cw_ring_off;             /* bytes from the breaker to its ring (count window only) */

  /* A timed forced_open: its end, stamped with its generation like `until`. */
  uint64_t forced_until;        /* concurrent: end of the forced_open, ns */
  uint64_t forced_gen;          /* concurrent: generation forced_until belongs to (| STAMPING) */

  /* Bytes from the breaker to its permits (max_concurrent, csrc/fz_permits.h), outside
   * the breaker so that a breaker without the option pays no memory for them: in a
   * registry after the slot's ring (a reuse of the slot keeps them: calls of the breaker
   * that was there give their permits back into them), for an anonymous breaker after
   * its ring when made with max_concurrent; 0: none. */
  int64_t permits_off;
  /* 1 once a take reached the permits (kept by a reuse of the slot, which keeps the
   * permits, and copied by a reload); 0: never touched, all zero, and the readers that
   * walk every breaker (stats, evictions) leave them alone: a first read of a slot's
   * permits would make their page resident, 4 KB a breaker (fz_stats_peek of every
   * breaker at a scrape did). */
  uint64_t permits_taken;    /* concurrent: set by permits_mark, never cleared */

  stripe stripes[NSTRIPES];  /* (each on lines of its own: the breaker ends with them) */
};

_Static_assert(sizeof(fzp) == FZ_PERMITS_BYTES, "a slot's ring area has room for the permits");

/* The breaker's permits, or NULL (an anonymous breaker made without max_concurrent). */
static inline fzp *permits_of(fz_breaker *b) {
  /* relaxed: written before the breaker is published, and rewritten (the same value) by a
   * reuse of its registry slot, which a stale handle may be reading (fzi_slot_init) */
  int64_t off = (int64_t)at_load_rlx((uint64_t *)(void *)&b->permits_off);
  return off ? (fzp *)(void *)((char *)b + off) : NULL;
}

/* The breaker's permits for a reader (stats, eviction), or NULL when none was ever taken:
 * all zero then (a take racing with this read is as one just after it). */
static inline fzp *permits_read(fz_breaker *b) {
  /* acquire: pairs with the release in permits_mark, before the take it precedes */
  return at_load_acq(&b->permits_taken) ? permits_of(b) : NULL;
}

/* Before a take that may be the first on b's permits (fzp_take_any: a thread's first take
 * on a breaker's permits claims a lane there; the fast path needs a lane it claimed). */
static inline void permits_mark(fz_breaker *b) {
  if (!at_load_rlx(&b->permits_taken)) at_store_rel(&b->permits_taken, 1);
}

/* An option a reload may rewrite while calls read it (fzi_reconfigure): a relaxed load.
 * Each option is read once per use; a call that straddles a reload may mix old and new
 * options, which is harmless (the next call sees the new ones). */
#define OPT(b, f) _Generic((b)->f, double: at_loadd_rlx, uint32_t: at_load32_rlx, \
                           uint64_t: at_load_rlx)(&(b)->f)

/* The limit of b's permits for a take, read once (a reload that dropped it while calls
 * held permits: a take that never fails, so that gives balance). */
static inline uint32_t permit_limit(fz_breaker *b) {
  uint32_t limit = OPT(b, cfg.max_concurrent);
  return limit ? limit : FZ_MAX_CONCURRENT * 4u;
}

/* initial-exec: a plain %fs-relative load, not a __tls_get_addr call per use; the 32
 * bytes (t_stripe, t_rng and the ledger's four below) fit the static TLS that glibc
 * keeps for libraries loaded by dlopen. */
#define TLS _Thread_local __attribute__((tls_model("initial-exec")))

/* The clock (fz_clock.c): read inline on the hot path. Hidden, so that a
 * read is PC-relative, as of a static, not through the GOT. */
#define FZ_HIDDEN __attribute__((visibility("hidden")))
extern FZ_HIDDEN uint64_t g_manual_on;  /* concurrent: 1 while the manual clock is installed */
extern FZ_HIDDEN uint64_t g_manual_ns;  /* concurrent: MANUAL_ORIGIN + manual seconds in ns */
typedef int (*clock_fn)(clockid_t, struct timespec *);
extern FZ_HIDDEN clock_fn g_clock;     /* the vDSO's clock_gettime, or glibc's */
void fzi_find_vdso_clock(void);  /* once, when the library loads (pin_library) */

static inline uint64_t ts_ns(clockid_t id) {
  struct timespec ts;
  g_clock(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The breaker's clock: coarse (a vDSO read, no syscall), or the manual one. */
static inline uint64_t now_ns(void) {
  if (at_load_rlx(&g_manual_on)) return at_load_rlx(&g_manual_ns);
  return ts_ns(CLOCK_MONOTONIC_COARSE);
}


#endif /* FZ_BREAKER_WORDS */

#endif /* FZ_INTERNAL_H */

/*
 * fz_permits.h -- the concurrency limit of a breaker (max_concurrent): its words, which
 * live in the breaker (so in a shared registry in memory every nginx worker maps), and
 * the fast path of taking and giving back a permit, inlined into fz_permits.c's exported
 * fz_permit_take / fz_permit_give. The slow paths (claiming a lane, the limit reached,
 * taking back a dead owner's permits) are in fz_permits.c; the design and its
 * memory-ordering argument in docs/isolation.md. Not exported.
 *
 * In one paragraph: the permit word `pw` holds the count of permits ever taken (low 24
 * bits, modulo 2^24) and one parity bit per lane (bits 24..63). Every thread that takes
 * or gives permits of a breaker owns one of its FZP_LANES lanes (claimed with a
 * compare-and-swap of the lane's owner word: generation, pid, tid). Its lane word counts
 * the permits taken onto the lane and the permits given back from it (each modulo 2^24)
 * and the parity its bit in pw has; the permits it holds are its own to run calls on.
 * The lane's `run` counts the calls running on it, written by the owner only. A call is
 * admitted on a permit the lane already holds (run + 1 <= held) with no read-modify-write
 * at all: a store of run, then a load of the lane word; the lane keeps the permit when
 * the call ends (run - 1). Only a lane short of permits takes one: one compare-and-swap of
 * pw that moves the count AND flips the lane's bit, then the lane word (a
 * compare-and-swap: others may mark it). The permits held are pw's count minus the sum
 * of the lanes' given counts; a take compares against `seen`, a sum of them read earlier
 * (never more than the true sum), and reads the lanes again only when that says the
 * limit is reached. Then the permits other lanes hold and run nothing on (spare) are
 * taken from them: the taker marks their lane words (FZP_RV), makes every thread of
 * every process that owns lanes pass a full barrier (membarrier(2), global expedited),
 * reads their run, and gives back what is spare, unless the owner (who sees the mark at
 * its next call and gives its spare back itself) did first. The barrier is what makes a
 * plain store of run safe: a call whose load of the lane word missed the mark had its
 * store of run seen by the taker. A process that cannot register for that barrier
 * marks its lanes FZP_NS: each of its calls takes a permit and gives it back, as a lane
 * without spare, and nobody takes from it. A process killed at any instruction leaves a
 * lane whose last take is resolved exactly: the bit in pw differs from the lane's parity
 * if and only if the swap happened and the lane word was not written after it. So a
 * survivor that finds the owner dead (kill(pid, 0) fails with ESRCH; only looked for
 * when the limit is reached) knows exactly how many permits the lane holds, and gives
 * them back with one compare-and-swap of the lane word.
 */
#ifndef FZ_PERMITS_H
#define FZ_PERMITS_H

#include "fz_atomic.h"
#include "fz_fault.h"

#include <stdint.h>

#define FZP_LANES 40                               /* lanes of a breaker: 64 - 24 bits */
#define FZP_COUNT ((UINT64_C(1) << 24) - 1)        /* a count: modulo 2^24 */
#define FZP_CACHE 8                                /* a thread's remembered lanes */
#define FZP_GIVEN_SHIFT 40
#define FZP_RV (UINT64_C(1) << 32)                 /* st: marked: a taker wants its spare permits */
#define FZP_NS (UINT64_C(1) << 33)                 /* st: its owner cannot be fenced: no spare kept, none taken */
#define FZP_TAG_SHIFT 34                           /* st: with FZP_RV, the marking taker's lane + 1 (bits 34-39) */
#define FZP_MARK (FZP_RV | UINT64_C(0x3f) << FZP_TAG_SHIFT)  /* st: a mark and its taker */
#define FZP_START ((UINT64_C(1) << 32) + 1)       /* run: a call started: its count and the starts + 1 */

/* The lane word: taken (bits 0-23) | FZP_RV (32) | FZP_NS (33) | the marking taker's
 * lane + 1 (34-39, while FZP_RV is set) | given (bits 40-63),
 * taken and given each modulo 2^24 (given at the top, so that a give is one add whose
 * carry falls off the word). The lane holds taken - given (less than 0 when permits taken
 * on other threads of its process were given back on it, see run). The parity of the
 * lane is the low bit of taken: each take flips it and the lane's bit in pw alike.
 * run: the calls running on the lane, as a signed number in its low 32 bits (a call
 * admitted on one thread and ended on another makes one lane +1 and the other -1: the
 * process's lanes add up), and above them the calls the lane ever started (mod 2^32):
 * a call's start adds FZP_START, its end (or a start not admitted) takes 1 away, so the
 * word never comes back to a value it had (a call ended and the next begun on the same
 * permit show as another word: a taker's view read twice, see exactly_full, cannot pair
 * two instants). fzp_calls reads the count. A lane alone on its cache line: run is
 * written at every call. */
typedef struct fzp_lane {
  _Alignas(64) uint64_t owner;  /* concurrent: gen20 << 44 | pid22 << 22 | tid22; pid 0: free */
  uint64_t st;     /* concurrent: compare-and-swap by the owner, a taker of spare permits, a survivor */
  uint64_t run;    /* concurrent: starts << 32 + calls; stored by the owner only (or reset by a survivor), read by takers */
  uint64_t pad[5];
} fzp_lane;

typedef struct fzp {
  _Alignas(64) uint64_t pw;  /* concurrent: taken count | lane parity bits << 24 */
  uint64_t full_total;       /* concurrent: calls rejected for the limit */
  uint64_t scan_at;          /* concurrent: coarse ns of the last look for dead owners */
  uint64_t seen;             /* concurrent: a sum of the lanes' given counts, mod 2^24, moves forward only */
  uint64_t used;             /* concurrent: bit i: lane i was ever claimed (others are 0); only set */
  uint64_t spare[3];
  fzp_lane lane[FZP_LANES];
} fzp;

/* What a thread remembers of the lanes it owns that are not its preferred lane (below): the
 * permits' address, the lane, and the owner word it claimed the lane with (the lane is
 * still its own while that word is). */
typedef struct fzp_mine {
  const fzp *p;
  uint64_t owner;
  uint32_t lane;
} fzp_mine;

/* The calling thread, for the fast path. key: its name in a lane's owner word (pid22 <<
 * 22 | tid22) shifted left 20 bits, so that `owner << 20 == key` compares the name and
 * drops the generation; 1 while not known yet (no owner word shifted gives an odd
 * number). lane: its preferred lane, the same index in every breaker (claimed first when
 * it is free there), drawn from its tid; off: where that lane sits in a breaker's
 * permits (bytes); bit: its bit in pw. */
typedef struct fzp_self_t {
  uint64_t key;
  uint64_t bit;
  uint64_t off;
  uint32_t lane;
  uint32_t nofence;  /* its process could not register for membarrier: FZP_NS lanes */
} fzp_self_t;

extern _Thread_local __attribute__((tls_model("initial-exec"))) fzp_mine fzp_cache[FZP_CACHE];
extern _Thread_local __attribute__((tls_model("initial-exec"))) fzp_self_t fzp_self;

int fzp_lane_slow(fzp *p);
#ifdef FZ_FAULTS
extern int fzp_fence_fails;  /* tests: the global barrier fails while set */
#endif
int fzp_full(fzp *p, uint32_t limit);
void fzp_give_laneless(fzp *p);
void fzp_rebuild(fzp *p);
uint32_t fzp_running(const fzp *p);
int fzp_in_use(const fzp *p);

/* The cache slot of p (breakers sit a slot size apart: a multiplicative hash). */
static inline uint32_t fzp_slot(const fzp *p) {
  return (uint32_t)(((uint64_t)(uintptr_t)p * UINT64_C(0x9E3779B97F4A7C15)) >> 61);
}

static inline uint64_t fzp_bit(int lane) { return UINT64_C(1) << (24 + lane); }

/* Whether the thread owns its preferred lane of p, l. Owning is the name (pid and tid),
 * not the generation: while a thread lives, a lane that bears its name is its own and
 * nobody else writes it (free lanes, a dead process's and an exited thread's are the
 * only ones that change hands; a lane left by an exited thread whose tid this thread
 * reuses is adopted, as fzp_lane_slow does). */
static inline int fzp_preferred(const fzp_lane *l) {
  /* relaxed: the owner word of our own lane is written only by us (or by a survivor
   * once we are dead) */
  return at_load_rlx(&l->owner) << 20 == fzp_self.key;
}

/* The lane this thread remembers for p in its cache (one it owns that is not its
 * preferred lane: another thread had that one), with its bit in pw, or NULL. */
static inline fzp_lane *fzp_cached(fzp *p, uint64_t *bit) {
  const fzp_mine *m = &fzp_cache[fzp_slot(p)];
  if (m->p != p) return NULL;
  fzp_lane *l = &p->lane[m->lane];
  /* relaxed: as in fzp_preferred; the whole owner word: still the claim remembered */
  if (at_load_rlx(&l->owner) != m->owner) return NULL;
  *bit = fzp_bit((int)m->lane);
  return l;
}

/* The lane this thread owns in p and its bit in pw, when it knows it: its preferred
 * lane, or one in its cache; NULL otherwise (fzp_lane_slow). Calls nothing: the fast
 * paths stay leaf code. */
static inline fzp_lane *fzp_mine_of(fzp *p, uint64_t *bit) {
  fzp_lane *l = (fzp_lane *)(void *)((char *)p + fzp_self.off);
  if (__builtin_expect(fzp_preferred(l), 1)) {
    *bit = fzp_self.bit;
    return l;
  }
  return fzp_cached(p, bit);
}

/* The lane this thread owns in p, or -1 when none could be had: the preferred lane, a
 * remembered one, or fzp_lane_slow's. */
static inline int fzp_lane_of(fzp *p) {
  uint64_t bit;
  if (fzp_preferred(&p->lane[fzp_self.lane])) return (int)fzp_self.lane;
  fzp_lane *l = fzp_cached(p, &bit);
  return l ? (int)(l - p->lane) : fzp_lane_slow(p);
}

/* The calls a lane's run word counts as running (its low 32 bits, signed). */
static inline int64_t fzp_calls(uint64_t run) {
  /* (GCC and Clang convert to a signed type modulo 2^32: one sign extension, no branch
   * on the fast path) */
  return (int64_t)(int32_t)(uint32_t)run;
}

/* A lane word's given count (mod 2^24). */
static inline uint64_t fzp_given(uint64_t st) { return st >> FZP_GIVEN_SHIFT; }

/* The permits a lane word holds: taken - given, as a signed 24-bit number. */
static inline int32_t fzp_held(uint64_t st) {
  uint32_t d = (uint32_t)((st - fzp_given(st)) & FZP_COUNT);
  return d >= UINT32_C(1) << 23 ? (int32_t)d - (1 << 24) : (int32_t)d;
}

/* The lane word after a take: taken + 1 (mod 2^24), which flips its low bit, the lane's
 * parity. Bits 24-31 of a lane word are always 0 (every write of one is made by this or
 * fzp_gave, whose carry falls off the top), so the carry out of taken is bit 24 alone;
 * FZP_RV, FZP_NS and the mark's tag are kept. */
static inline uint64_t fzp_took(uint64_t st) {
  return (st + 1) & ~(UINT64_C(1) << 24);
}

/* The lane word after n permits were given back on it: given + n (mod 2^24). */
static inline uint64_t fzp_gave(uint64_t st, uint32_t n) {
  return st + ((uint64_t)n << FZP_GIVEN_SHIFT);
}

/* pw after a take on the lane whose bit is `bit`: its count + 1 (mod 2^24, never
 * carrying into the bits) and the lane's bit flipped. */
static inline uint64_t fzp_move(uint64_t pw, uint64_t bit) {
  return pw ^ ((((pw + 1) ^ pw) & FZP_COUNT) | bit);  /* (the bits that change) */
}

/* One permit taken onto lane l (the caller's, whose bit in pw is `bit`) when pw's count
 * less `seen` is below limit: 1, or 0 without a swap (the limit looks reached: the caller
 * reads the lanes again). The lane then holds one more; a call runs on it by fzp_run_on. */
static inline int fzp_take_on(fzp *p, fzp_lane *l, uint64_t bit, uint32_t limit) {
  /* acquire: pairs with the release of the swap that moved seen (after the lanes it
   * summed were read with acquire): a give counted there happened before this take */
  uint64_t seen = at_load_acq(&p->seen);
  uint64_t pw = at_load_rlx(&p->pw);
  FAULT("permit-taking");
  for (;;) {
    if (((pw - seen) & FZP_COUNT) >= limit) return 0;
    /* acq_rel: as every swap of pw; the lane word's swap below comes after it */
    if (at_cas_acqrel(&p->pw, &pw, fzp_move(pw, bit))) break;
  }
  FAULT("permit-taken");
  /* acq_rel (its release: after the swap, see resolve()); a compare-and-swap, not a store:
   * a taker of spare permits may mark the word or give from it meanwhile */
  uint64_t st = at_load_rlx(&l->st);
  while (!at_cas_acqrel(&l->st, &st, fzp_took(st))) {}
  return 1;
}

/* One call admitted on a permit lane l (the caller's) holds: 1; 0 with nothing changed
 * but run's count of starts when the lane holds none spare, is marked, cannot be fenced,
 * or the limit fell below what is out (a reload lowered it). No read-modify-write: run is stored, then the lane
 * word loaded, in this order (the compiler's; the processor's is a taker's membarrier,
 * see docs/isolation.md): a taker that marked the lane either is seen here, or sees this
 * run. */
static inline int fzp_run_on(fzp *p, fzp_lane *l, uint32_t limit) {
  uint64_t w = at_load_rlx(&l->run) + FZP_START;
  /* relaxed: only this thread writes it; what orders it is the barrier */
  at_store_rlx(&l->run, w);
  FAULT("permit-running");
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  /* relaxed: the permits this lane holds were taken by this thread (or given to it by its
   * process's adoption), and a taker's marks only make it fail */
  uint64_t st = at_load_rlx(&l->st);
  /* pw with acquire, then seen: a seen at least as new as the one pw's last take compared
   * with (a seen older than that would make the limit look exceeded) */
  uint64_t out = (at_load_acq(&p->pw) - at_load_rlx(&p->seen)) & FZP_COUNT;
  if (__builtin_expect(!(st & (FZP_RV | FZP_NS)) && fzp_calls(w) <= fzp_held(st) && out <= limit, 1)) return 1;
  at_store_rlx(&l->run, w - 1);  /* the count back, the start kept: the word stays new */
  return 0;
}

/* A take's fast path: on the preferred or a remembered lane, a permit it holds. 1 taken;
 * 0 when nothing was done and fzp_take_any decides. */
static inline int fzp_take_fast(fzp *p, uint32_t limit) {
  uint64_t bit;
  fzp_lane *l = fzp_mine_of(p, &bit);
  return l && fzp_run_on(p, l, limit);
}

/* One call ended on lane l (the caller's): one store of its run. The lane keeps the
 * permit. */
static inline void fzp_give_on(fzp_lane *l) {
  uint64_t w = at_load_rlx(&l->run);
  FAULT("permit-giving");
  /* release: the call's own work happens before its permit shows as spare (pairs with
   * the acquire load of run by a taker of spare permits) */
  at_store_rel(&l->run, w - 1);
  FAULT("permit-given");
}

/* A give's fast path, on the preferred or a remembered lane of a thread that can be
 * fenced: 1 given; 0 when nothing was done and fzp_give_any gives it. */
static inline int fzp_give_fast(fzp *p) {
  uint64_t bit;
  fzp_lane *l = fzp_mine_of(p, &bit);
  if (!l || fzp_self.nofence) return 0;
  fzp_give_on(l);
  return 1;
}

int fzp_take_any(fzp *p, uint32_t limit);
void fzp_give_any(fzp *p);

/* Takes a permit when fewer than `limit` are held: 1, or 0 (the limit is reached). */
static inline int fzp_take(fzp *p, uint32_t limit) {
  return fzp_take_fast(p, limit) || fzp_take_any(p, limit);
}

/* Gives one permit back (on the calling thread's lane). */
static inline void fzp_give(fzp *p) {
  if (!fzp_give_fast(p)) fzp_give_any(p);
}

#endif /* FZ_PERMITS_H */

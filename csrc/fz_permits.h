/*
 * fz_permits.h -- the concurrency limit of a breaker (max_concurrent): its words, which
 * live in the breaker (so in a shared registry in memory every nginx worker maps), and
 * the fast path of taking and giving back a permit, inlined into fz_permits.c's exported
 * fz_permit_take / fz_permit_give. The slow paths (claiming a lane, the limit reached,
 * taking back a dead owner's permits) are in fz_permits.c; the design and its
 * memory-ordering argument in docs/isolation.md. Not exported.
 *
 * In one paragraph: the permit word `pw` holds the count of permits held (low 24 bits)
 * and one parity bit per lane (bits 24..63). Every thread that takes or gives permits of
 * a breaker owns one of its FZP_LANES lanes (claimed with a compare-and-swap of the
 * lane's owner word: generation, pid, tid) and is the lane's only writer. Its lane word
 * says how many permits the lane holds, the parity its bit in pw has, and the operation
 * it is about to make. An operation is: store the intent in the lane word; one
 * compare-and-swap of pw that moves the count AND flips the lane's bit; store the
 * result in the lane word. A process killed at any instruction leaves a lane whose
 * intent is resolved exactly: the bit in pw differs from the lane's parity if and only
 * if the swap happened. So a survivor that finds the owner dead (kill(pid, 0) fails with
 * ESRCH; only looked for when the limit is reached) knows exactly how many permits the
 * lane holds, and takes them back with one more swap of the same kind.
 */
#ifndef FZ_PERMITS_H
#define FZ_PERMITS_H

#include "fz_atomic.h"

#include <stdint.h>

#define FZP_LANES 40                               /* lanes of a breaker: 64 - 24 bits */
#define FZP_COUNT ((UINT64_C(1) << 24) - 1)        /* the count in pw */
#define FZP_CACHE 8                                /* a thread's remembered lanes */

/* The lane word: held (int32, low bits) | parity << 32 | intent << 33. */
enum { FZP_NONE = 0, FZP_ACQ = 1, FZP_REL = 2, FZP_RECLAIM = 3 };

typedef struct fzp_lane {
  uint64_t owner;  /* concurrent: gen20 << 44 | pid22 << 22 | tid22; pid 0: free */
  uint64_t st;     /* concurrent: written by the owner only (or by who took it from a dead one) */
} fzp_lane;

typedef struct fzp {
  _Alignas(64) uint64_t pw;  /* concurrent: count | lane parity bits << 24 */
  uint64_t full_total;       /* concurrent: calls rejected for the limit */
  uint64_t scan_at;          /* concurrent: coarse ns of the last look for dead owners */
  uint64_t spare[5];
  fzp_lane lane[FZP_LANES];
} fzp;

/* What a thread remembers of the lanes it owns: the permits' address, the lane, and the
 * owner word it claimed the lane with (the lane is still its own while that word is). */
typedef struct fzp_mine {
  const fzp *p;
  uint64_t owner;
  uint32_t lane;
} fzp_mine;

extern _Thread_local __attribute__((tls_model("initial-exec"))) fzp_mine fzp_cache[FZP_CACHE];

int fzp_lane_slow(fzp *p);
int fzp_full(fzp *p, uint32_t limit);
void fzp_give_laneless(fzp *p);
void fzp_rebuild(fzp *p);
uint32_t fzp_running(const fzp *p);

/* Fault points for test/faults.c (-DFZ_FAULTS; the hook is fz_state.c's), nothing otherwise. */
#ifdef FZ_FAULTS
extern void (*fz_fault_hook)(const char *where);
#define FZP_FAULT(where) do { if (fz_fault_hook) fz_fault_hook(where); } while (0)
#else
#define FZP_FAULT(where) ((void)0)
#endif

/* The cache slot of p (breakers sit a slot size apart: a multiplicative hash). */
static inline uint32_t fzp_slot(const fzp *p) {
  return (uint32_t)(((uint64_t)(uintptr_t)p * UINT64_C(0x9E3779B97F4A7C15)) >> 61);
}

/* The lane this thread owns in p, or -1 when none could be had. */
static inline int fzp_lane_of(fzp *p) {
  const fzp_mine *m = &fzp_cache[fzp_slot(p)];
  /* relaxed: the owner word of our own lane is written only by us (or by a survivor
   * once we are dead) */
  if (__builtin_expect(m->p == p && at_load_rlx(&p->lane[m->lane].owner) == m->owner, 1)) return (int)m->lane;
  return fzp_lane_slow(p);
}

static inline uint64_t fzp_bit(int lane) { return UINT64_C(1) << (24 + lane); }

/* The lane word after an operation of delta d: held + d, parity flipped, no intent. */
static inline uint64_t fzp_after(uint64_t st, int32_t d) {
  uint32_t held = (uint32_t)st + (uint32_t)d;
  return ((st >> 32 & 1) ^ 1) << 32 | held;
}

/* pw with its count moved by d (mod 2^24, so a count never borrows into the bits) and
 * the lane's bit flipped. */
static inline uint64_t fzp_move(uint64_t pw, int32_t d, int lane) {
  return ((pw & ~FZP_COUNT) | ((pw + (uint64_t)(int64_t)d) & FZP_COUNT)) ^ fzp_bit(lane);
}

/* Takes a permit when fewer than `limit` are held: 1, or 0 (the limit is reached). */
static inline int fzp_take(fzp *p, uint32_t limit) {
  int lane = fzp_lane_of(p);
  if (__builtin_expect(lane < 0, 0)) return fzp_full(p, limit);
  fzp_lane *l = &p->lane[lane];
  uint64_t st = at_load_rlx(&l->st);
  at_store_rlx(&l->st, st | (uint64_t)FZP_ACQ << 33);  /* the intent; ordered by the release below */
  FZP_FAULT("permit-intent");
  uint64_t pw = at_load_rlx(&p->pw);
  for (;;) {
    if ((pw & FZP_COUNT) >= limit) {
      at_store_rlx(&l->st, st);  /* no swap was made: the intent is void */
      return fzp_full(p, limit);
    }
    /* acq_rel: the release makes the intent visible before the swap (a survivor that
     * sees the bit flipped sees the intent); pairs with the acquire in resolve() */
    if (at_cas_acqrel(&p->pw, &pw, fzp_move(pw, 1, lane))) break;
  }
  FZP_FAULT("permit-taken");
  at_store_rel(&l->st, fzp_after(st, 1));  /* release: after the swap, see resolve() */
  return 1;
}

/* Gives one permit back (on the calling thread's lane). */
static inline void fzp_give(fzp *p) {
  int lane = fzp_lane_of(p);
  if (__builtin_expect(lane < 0, 0)) {
    fzp_give_laneless(p);
    return;
  }
  fzp_lane *l = &p->lane[lane];
  uint64_t st = at_load_rlx(&l->st);
  at_store_rlx(&l->st, st | (uint64_t)FZP_REL << 33);
  FZP_FAULT("permit-giving");
  uint64_t pw = at_load_rlx(&p->pw);
  while (!at_cas_acqrel(&p->pw, &pw, fzp_move(pw, -1, lane))) {}  /* acq_rel: as in fzp_take */
  FZP_FAULT("permit-given");
  at_store_rel(&l->st, fzp_after(st, -1));
}

#endif /* FZ_PERMITS_H */

/*
 * fz_permits.c -- the slow paths of a breaker's concurrency limit (max_concurrent):
 * claiming a lane, the limit reached, taking back the permits of a dead owner, and
 * rebuilding the permit word in a registry copied by a reload. The words and the fast
 * path are in fz_permits.h; the design and its memory-ordering argument in
 * docs/isolation.md. At the end, the breaker's hooks (fz_permit_take, fz_permit_give,
 * fzi_permits_copy), which find a breaker's permits beside it.
 *
 * Who owns a lane: a thread, named by pid and tid in the lane's owner word with a
 * generation that moves forward each time the lane changes hands (so a compare-and-swap
 * of a stale view never succeeds). A lane changes hands only
 *   - free -> a thread (any caller);
 *   - an exited thread's -> a live thread of the same process (adopted with its count:
 *     a permit taken on one thread may be given back on another, so the process's
 *     lanes add up, not each lane alone);
 *   - a dead process's -> a survivor, who takes the lane's permits back and frees it;
 *   - an exited thread's lane that holds nothing -> free (so thread churn does not use
 *     the lanes up).
 * A survivor looks for dead owners only when the limit is reached or no lane is free,
 * at most once per SCAN_NS per breaker (kill(pid, 0) per owned lane).
 */
#define FZ_BREAKER_WORDS
#include "fz_internal.h"
#include "fz_permits.h"

#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <string.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SCAN_NS UINT64_C(200000000)  /* a look for dead owners at most every 0.2 s */
#define ID22 ((UINT64_C(1) << 22) - 1)

_Thread_local __attribute__((tls_model("initial-exec"))) fzp_mine fzp_cache[FZP_CACHE];
_Thread_local __attribute__((tls_model("initial-exec"))) fzp_self_t fzp_self =
  { 1, UINT64_C(1) << 24, offsetof(fzp, lane), 0 };  /* not known yet: lane 0's, matching no owner */

/* The k-th free lane to try: one lane of each cache line first (4 lanes of 16 bytes to a
 * line), so that the first 10 owners each write a line of their own at every give. */
static int spread(int k) { return k % 10 * 4 + k / 10; }
_Static_assert(FZP_LANES == 40 && sizeof(fzp_lane) == 16, "spread() knows 40 lanes of 16 bytes");

/* pid22 << 22 | tid22. The thread's preferred lane is drawn from its tid through spread():
 * threads and processes of consecutive ids (nginx's workers, one thread each) prefer
 * different lanes on different cache lines, the same in every breaker. */
static uint64_t me(void) {
  if (fzp_self.key & 1) {
    uint64_t tid = (uint64_t)syscall(SYS_gettid);
    int lane = spread((int)(tid % FZP_LANES));
    fzp_self.lane = (uint32_t)lane, fzp_self.bit = fzp_bit(lane);
    fzp_self.off = offsetof(fzp, lane) + (uint64_t)lane * sizeof(fzp_lane);
    fzp_self.key = (((uint64_t)getpid() & ID22) << 22 | (tid & ID22)) << 20;
  }
  return fzp_self.key >> 20;
}

/* A forked child is another process: it owns none of its parent's lanes. */
static void forget_lanes(void) {
  fzp_self.key = 1;
  for (int i = 0; i < FZP_CACHE; i++) fzp_cache[i].p = NULL;
}

__attribute__((constructor)) static void permits_init(void) { pthread_atfork(NULL, NULL, forget_lanes); }

static uint64_t gen_of(uint64_t o) { return o >> 44; }
static uint32_t pid_of(uint64_t o) { return (uint32_t)(o >> 22 & ID22); }
static uint32_t tid_of(uint64_t o) { return (uint32_t)(o & ID22); }
static uint64_t owner(uint64_t gen, uint64_t who) { return (gen & 0xfffff) << 44 | who; }

static int pid_dead(uint32_t pid) { return kill((pid_t)pid, 0) != 0 && errno == ESRCH; }
static int thread_dead(uint32_t pid, uint32_t tid) {
  return syscall(SYS_tgkill, (pid_t)pid, (pid_t)tid, 0) != 0 && errno == ESRCH;
}

static uint64_t coarse_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int remember(fzp *p, int lane, uint64_t o) {
  fzp_mine *m = &fzp_cache[fzp_slot(p)];
  m->p = p, m->lane = (uint32_t)lane, m->owner = o;
  return lane;
}

/*
 * The lane word of `lane` with its last take settled, for a lane whose writer is gone (or
 * is the caller): a take whose swap happened but whose lane word was not written shows
 * as the lane's bit in pw differing from the lane's parity (only this lane's writer flips
 * that bit, one take at a time, and writes the lane word after). Reads the lane word
 * first (acquire: pairs with the release of the writer's store after its swap, so pw as
 * that swap left it is seen below), then pw.
 */
static uint64_t resolve(fzp *p, int lane, uint64_t pw_seen, int use_seen) {
  uint64_t st = at_load_acq(&p->lane[lane].st);
  uint64_t pw = use_seen ? pw_seen : at_load_acq(&p->pw);
  unsigned bit = (unsigned)(pw >> (24 + lane) & 1), parity = (unsigned)(st & 1);
  return bit == parity ? st : fzp_took(st);
}

/* The sum of the lanes' given counts (mod 2^24), each read with acquire (pairs with the
 * release store of a give: a give summed here happened), and `seen` moved forward to it
 * when it is ahead (a sum read earlier by another caller may be behind or ahead; seen
 * never moves back, so it never says more was given than was). Returns seen after. */
static uint64_t refresh(fzp *p) {
  uint64_t g = 0, used = at_load_acq(&p->used);  /* acquire: pairs with the release in claim */
  FZP_FAULT("permit-summing");
  /* a lane not in `used` that a claim takes meanwhile is missed: its gives come after the
   * claim, so the sum only stays lower than the truth (a sum read later counts them) */
  for (uint64_t m = used & ((UINT64_C(1) << FZP_LANES) - 1); m; m &= m - 1)
    g += fzp_given(at_load_acq(&p->lane[__builtin_ctzll(m)].st));
  g &= FZP_COUNT;
  uint64_t seen = at_load_acq(&p->seen);
  /* ahead: 0 < g - seen < 2^23 (mod 2^24); release: pairs with the acquire in fzp_take_on */
  while (((g - seen) & FZP_COUNT) - 1 < (UINT64_C(1) << 23) - 1)
    if (at_cas_acqrel(&p->seen, &seen, g)) return g;
  return seen;
}

/* The permits of lane `lane`, whose owner word is o and whose owner is dead, are taken
 * back; the lane is freed. Returns the permits taken back (0 when another survivor got
 * there first; less than 0 for a lane that held less than nothing, see scan). */
static int64_t take_back(fzp *p, int lane, uint64_t o) {
  fzp_lane *l = &p->lane[lane];
  /* the survivor's name in the owner word, generation kept: a survivor that dies here
   * is dead in turn, and the next one finishes (resolve settles its takes too) */
  if (!at_cas_acqrel(&l->owner, &o, owner(gen_of(o), me()))) return 0;
  FZP_FAULT("reclaim-claimed");
  uint64_t st = resolve(p, lane, 0, 0);
  int32_t held = fzp_held(st);
  if (held > 0) {
    /* one store gives them all back: a survivor killed before it leaves the lane as it
     * was, after it a lane holding nothing (release: as a give) */
    at_store_rel(&l->st, fzp_gave(st, (uint32_t)held));
    FZP_FAULT("reclaim-given");
  } else {
    /* less than nothing: permits its process took on other lanes were given back on
     * this one; as many takes on it (no limit: the count is only made right), each
     * the protocol of a take, so a survivor killed between two leaves an exact lane */
    for (int32_t i = held; i < 0; i++) {
      uint64_t pw = at_load_rlx(&p->pw);
      while (!at_cas_acqrel(&p->pw, &pw, fzp_move(pw, fzp_bit(lane)))) {}
      FZP_FAULT("reclaim-taken");
      st = fzp_took(st);
      at_store_rel(&l->st, st);
    }
    if (held == 0) at_store_rel(&l->st, st);  /* a take its owner's death left unwritten */
  }
  /* release: the next owner sees the settled lane word (parity of the lane's bit) */
  at_store_rel(&l->owner, owner(gen_of(o) + 1, 0));
  return held;
}

/* Looks for lanes of dead owners: a dead process's are taken back, an exited thread's
 * that hold nothing are freed. Lanes holding fewer permits than zero go first (a process
 * whose threads gave back permits taken on other threads): the count never drops below
 * what the live processes hold. Returns the permits taken back. */
static int64_t scan(fzp *p) {
  uint32_t mypid = pid_of(me());
  int64_t back = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < FZP_LANES; i++) {
      uint64_t o = at_load_acq(&p->lane[i].owner);
      uint32_t pid = pid_of(o), tid = tid_of(o);
      if (!pid || (o & ((UINT64_C(1) << 44) - 1)) == me()) continue;
      int32_t held = fzp_held(resolve(p, i, 0, 0));  /* a peek: its owner may live */
      if ((pass == 0) != (held <= 0)) continue;
      if (pid == mypid) {
        uint64_t want = o;
        if (held == 0 && thread_dead(pid, tid) && at_cas_acqrel(&p->lane[i].owner, &want, owner(gen_of(o), me())))
          back += take_back(p, i, owner(gen_of(o), me()));
        continue;
      }
      if (pid_dead(pid)) back += take_back(p, i, o);
    }
  }
  return back;
}

/* Claims lane i from owner word o for this thread (adopting what it holds). */
static int claim(fzp *p, int i, uint64_t o) {
  uint64_t mine = owner(gen_of(o) + 1, me());
  if (!at_cas_acqrel(&p->lane[i].owner, &o, mine)) return -1;
  /* the lanes a sum reads (refresh) reach this one before it takes or gives anything
   * (acq_rel: ordered after the claim, before this thread's first take) */
  uint64_t used = at_load_acq(&p->used), bit = UINT64_C(1) << i;
  while (!(used & bit) && !at_cas_acqrel(&p->used, &used, used | bit)) {}
  /* an adopted lane of an exited thread: its last take settled (a free lane has none
   * pending) */
  at_store_rel(&p->lane[i].st, resolve(p, i, 0, 0));
  return remember(p, i, mine);
}

/* The lane this thread owns in p, claimed when it has none: its own (not remembered),
 * a free one (its preferred lane first), an exited thread's of this process; after a
 * look for dead owners, a freed one. -1 when every lane is held by a live thread. */
int fzp_lane_slow(fzp *p) {
  uint64_t who = me();
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < FZP_LANES; i++) {
      uint64_t o = at_load_acq(&p->lane[i].owner);
      if ((o & ((UINT64_C(1) << 44) - 1)) == who) return remember(p, i, o);
    }
    for (int k = -1; k < FZP_LANES; k++) {
      int i = k < 0 ? (int)fzp_self.lane : spread(k);
      uint64_t o = at_load_acq(&p->lane[i].owner);
      int got = pid_of(o) ? -1 : claim(p, i, o);
      if (got >= 0) return got;
    }
    for (int i = 0; i < FZP_LANES; i++) {
      uint64_t o = at_load_acq(&p->lane[i].owner);
      if (pid_of(o) != pid_of(who) || !thread_dead(pid_of(o), tid_of(o))) continue;
      int got = claim(p, i, o);
      if (got >= 0) return got;
    }
    if (round == 0) scan(p);
  }
  return -1;
}

/* A take, whatever the fast path could not do: find or claim the lane, try again, read
 * the lanes again when the limit looks reached, then fzp_full. 1 taken, 0 not. */
int fzp_take_any(fzp *p, uint32_t limit) {
  int lane = fzp_lane_of(p);
  if (lane < 0) return fzp_full(p, limit);
  if (fzp_take_on(p, &p->lane[lane], fzp_bit(lane), limit)) return 1;
  /* The limit looked reached from `seen`: the lanes read again, and again while that
   * moves `seen` forward. One sum is not enough: other threads' takes between the sum
   * and this take count in pw at once, their gives only in a later sum, so a take after
   * one sum can find the limit "reached" while far fewer permits are held (seen under
   * load: 2 threads, 1,000 permits, a full rejection). A sum that moves nothing means
   * no give happened since the last: the limit is reached. Bounded, for callers that
   * keep taking and giving faster than the sums. */
  uint64_t seen = at_load_acq(&p->seen);
  for (int i = 0; i < 64; i++) {
    uint64_t now = refresh(p);
    FZP_FAULT("permit-refreshed");
    if (fzp_take_on(p, &p->lane[lane], fzp_bit(lane), limit)) return 1;
    if (now == seen) break;
    seen = now;
  }
  return fzp_full(p, limit);
}

/* A give whose lane was not remembered: found or claimed, or laneless. */
void fzp_give_any(fzp *p) {
  int lane = fzp_lane_of(p);
  if (lane < 0) {
    fzp_give_laneless(p);
    return;
  }
  fzp_give_on(&p->lane[lane]);
}

/* One more take, after permits were taken back (no recursion into fzp_full). */
static int take_again(fzp *p, uint32_t limit) {
  int lane = fzp_lane_of(p);
  if (lane < 0) return 0;
  refresh(p);
  return fzp_take_on(p, &p->lane[lane], fzp_bit(lane), limit);
}

/* The limit was reached (or no lane could be had): look for dead owners' permits, at
 * most once per SCAN_NS, and take one if that freed some. 1 taken, 0 not. */
int fzp_full(fzp *p, uint32_t limit) {
  uint64_t t = coarse_ns(), last = at_load_rlx(&p->scan_at);
  return t - last >= SCAN_NS && at_cas_acqrel(&p->scan_at, &last, t) && scan(p) > 0 && take_again(p, limit);
}

/* A permit given back by a thread that can have no lane: the count of takes moved back
 * alone (no lane's bit). Exact while the process lives; should it die, the lane the
 * permit was taken on counts it as held, and its take-back gives it back once more (see
 * docs/isolation.md). */
void fzp_give_laneless(fzp *p) {
  uint64_t pw = at_load_rlx(&p->pw);
  while (!at_cas_acqrel(&p->pw, &pw, (pw & ~FZP_COUNT) | ((pw - 1) & FZP_COUNT))) {}
}

/* The permit word made again from the lanes: a registry copied by a reload (the copy
 * was read while workers ran, so pw and the lanes may be of different instants). The
 * count is the lanes' takes, seen their gives: what they hold is the difference. Single
 * threaded: no process uses the copy yet. */
void fzp_rebuild(fzp *p) {
  uint64_t pw = at_load_rlx(&p->pw), bits = 0, taken = 0, given = 0, used = 0;
  for (int i = 0; i < FZP_LANES; i++) {
    uint64_t st = resolve(p, i, pw, 1);
    at_store_rlx(&p->lane[i].st, st);
    if (st || at_load_rlx(&p->lane[i].owner)) used |= UINT64_C(1) << i;  /* (the copied `used` may be behind) */
    taken += st & FZP_COUNT;
    given += fzp_given(st);
    bits |= (st & 1) << (24 + i);
  }
  at_store_rlx(&p->pw, bits | (taken & FZP_COUNT));
  at_store_rlx(&p->seen, given & FZP_COUNT);
  at_store_rlx(&p->used, used);
}

/* Permits held now: the takes less the lanes' gives; a count caught below zero (see
 * scan) reads 0. */
uint32_t fzp_running(const fzp *p) {
  /* the gives first, then pw: a give read here had its take before it, so in pw */
  uint64_t g = 0;
  for (int i = 0; i < FZP_LANES; i++) g += fzp_given(at_load_acq(&p->lane[i].st));
  uint64_t pw = at_load_acq(&p->pw);
  uint64_t c = (pw - g) & FZP_COUNT;
  return c >= UINT64_C(1) << 23 ? 0 : (uint32_t)c;
}

/* ---------------------------------------------------------------- permits */

/* max_concurrent (csrc/fz_permits.h, csrc/fz_permits.c): with no limit set (a reload
 * dropped it while calls held permits) a take still counts, so that gives balance. */
int fz_permit_take(fz_breaker *b, int count_full) {
  fzp *p = permits_of(b);
  if (!p || fzp_take(p, permit_limit(b))) return 1;
  if (count_full) at_add_rlx(&p->full_total, 1);
  return 0;
}

void fz_permit_give(fz_breaker *b) {
  fzp *p = permits_of(b);
  if (p) fzp_give(p);
}

/* A reload's copy (fz_registry.c, migrate): the permits copied beside the breaker, and
 * their word made again (the copy was read while workers ran). */
void fzi_permits_copy(fz_breaker *to, fz_breaker *from) {
  fzp *p = permits_of(to), *q = permits_of(from);
  if (!p || !q) return;
  memcpy(p, q, sizeof *p);
  fzp_rebuild(p);
}

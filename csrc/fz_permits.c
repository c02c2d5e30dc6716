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
#include <pthread.h>
#include <string.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SCAN_NS UINT64_C(200000000)  /* a look for dead owners at most every 0.2 s */
#define ID22 ((UINT64_C(1) << 22) - 1)

_Thread_local __attribute__((tls_model("initial-exec"))) fzp_mine fzp_cache[FZP_CACHE];

static _Thread_local __attribute__((tls_model("initial-exec"))) uint64_t t_me;  /* pid22 << 22 | tid22, 0 unknown */

static uint64_t me(void) {
  if (!t_me) t_me = ((uint64_t)getpid() & ID22) << 22 | ((uint64_t)syscall(SYS_gettid) & ID22);
  return t_me;
}

/* A forked child is another process: it owns none of its parent's lanes. */
static void forget_lanes(void) {
  t_me = 0;
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
 * The lane word of `lane` with its intent settled, for a lane whose writer is gone (or
 * is the caller): an intent whose swap happened shows as the lane's bit in pw differing
 * from the lane's parity (only this lane's writer flips that bit, one operation at a
 * time). Reads the lane word first (acquire: pairs with the release of the writer's
 * swap, so an intent stored before it is seen), then pw.
 */
static uint64_t resolve(fzp *p, int lane, uint64_t pw_seen, int use_seen) {
  uint64_t st = at_load_acq(&p->lane[lane].st);
  uint64_t pw = use_seen ? pw_seen : at_load_acq(&p->pw);
  unsigned intent = (unsigned)(st >> 33 & 3), parity = (unsigned)(st >> 32 & 1);
  unsigned bit = (unsigned)(pw >> (24 + lane) & 1);
  uint64_t clean = st & ((UINT64_C(1) << 33) - 1);
  if (intent == FZP_NONE || bit == parity) return clean;  /* no swap: the intent is void */
  if (intent == FZP_ACQ) return fzp_after(clean, 1);
  if (intent == FZP_REL) return fzp_after(clean, -1);
  return fzp_after(clean, -(int32_t)(uint32_t)clean);  /* a take-back: nothing left */
}

/* The permits of lane `lane`, whose owner word is o and whose owner is dead, are taken
 * back; the lane is freed. Returns the permits taken back (0 when another survivor got
 * there first). */
static int64_t take_back(fzp *p, int lane, uint64_t o) {
  fzp_lane *l = &p->lane[lane];
  /* the survivor's name in the owner word, generation kept: a survivor that dies here
   * is dead in turn, and the next one finishes (resolve settles its intent too) */
  if (!at_cas_acqrel(&l->owner, &o, owner(gen_of(o), me()))) return 0;
  FZP_FAULT("reclaim-claimed");
  uint64_t st = resolve(p, lane, 0, 0);
  int32_t held = (int32_t)(uint32_t)st;
  if (held != 0) {
    at_store_rel(&l->st, st | (uint64_t)FZP_RECLAIM << 33);  /* the amount, then the intent */
    FZP_FAULT("reclaim-intent");
    uint64_t pw = at_load_rlx(&p->pw);
    /* acq_rel: as in fzp_take (the intent before the swap) */
    while (!at_cas_acqrel(&p->pw, &pw, fzp_move(pw, -held, lane))) {}
    FZP_FAULT("reclaim-swapped");
    st = fzp_after(st, -held);
  }
  at_store_rel(&l->st, st);
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
      int32_t held = (int32_t)(uint32_t)resolve(p, i, 0, 0);  /* a peek: its owner may live */
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
  /* an adopted lane of an exited thread: its last intent settled (a free lane has none) */
  at_store_rel(&p->lane[i].st, resolve(p, i, 0, 0));
  return remember(p, i, mine);
}

/* The lane this thread owns in p, claimed when it has none: its own (not remembered),
 * a free one, an exited thread's of this process; after a look for dead owners, a
 * freed one. -1 when every lane is held by a live thread. */
int fzp_lane_slow(fzp *p) {
  uint64_t who = me();
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < FZP_LANES; i++) {
      uint64_t o = at_load_acq(&p->lane[i].owner);
      if ((o & ((UINT64_C(1) << 44) - 1)) == who) return remember(p, i, o);
    }
    for (int i = 0; i < FZP_LANES; i++) {
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

/* One more take, after permits were taken back (no recursion into fzp_full). */
static int take_again(fzp *p, uint32_t limit) {
  int lane = fzp_lane_of(p);
  if (lane < 0) return 0;
  fzp_lane *l = &p->lane[lane];
  uint64_t st = at_load_rlx(&l->st);
  at_store_rlx(&l->st, st | (uint64_t)FZP_ACQ << 33);
  uint64_t pw = at_load_rlx(&p->pw);
  for (;;) {
    if ((pw & FZP_COUNT) >= limit) {
      at_store_rlx(&l->st, st);
      return 0;
    }
    if (at_cas_acqrel(&p->pw, &pw, fzp_move(pw, 1, lane))) break;  /* acq_rel: as in fzp_take */
  }
  at_store_rel(&l->st, fzp_after(st, 1));
  return 1;
}

/* The limit was reached (or no lane could be had): look for dead owners' permits, at
 * most once per SCAN_NS, and take one if that freed some. 1 taken, 0 not. */
int fzp_full(fzp *p, uint32_t limit) {
  uint64_t t = coarse_ns(), last = at_load_rlx(&p->scan_at);
  return t - last >= SCAN_NS && at_cas_acqrel(&p->scan_at, &last, t) && scan(p) > 0 && take_again(p, limit);
}

/* A permit given back by a thread that can have no lane: the count alone. Exact while
 * the process lives; should it die, the lane the permit was taken on counts it as held,
 * and its take-back gives it back once more (see docs/isolation.md). */
void fzp_give_laneless(fzp *p) {
  uint64_t pw = at_load_rlx(&p->pw);
  while (!at_cas_acqrel(&p->pw, &pw, fzp_move(pw, -1, 0) ^ fzp_bit(0))) {}
}

/* The permit word made again from the lanes: a registry copied by a reload (the copy
 * was read while workers ran, so pw and the lanes may be of different instants). Single
 * threaded: no process uses the copy yet. */
void fzp_rebuild(fzp *p) {
  uint64_t pw = at_load_rlx(&p->pw), bits = 0;
  int64_t count = 0;
  for (int i = 0; i < FZP_LANES; i++) {
    uint64_t st = resolve(p, i, pw, 1);
    at_store_rlx(&p->lane[i].st, st);
    count += (int32_t)(uint32_t)st;
    bits |= (st >> 32 & 1) << (24 + i);
  }
  if (count < 0) count = 0;
  if (count > (int64_t)FZP_COUNT / 2) count = FZP_COUNT / 2;
  at_store_rlx(&p->pw, bits | (uint64_t)count);
}

/* Permits held now; a count caught below zero (see scan) reads 0. */
uint32_t fzp_running(const fzp *p) {
  uint64_t c = at_load_rlx(&p->pw) & FZP_COUNT;
  return c > FZP_COUNT / 2 ? 0 : (uint32_t)c;
}

/* ---------------------------------------------------------------- permits */

/* max_concurrent (csrc/fz_permits.h, csrc/fz_permits.c): with no limit set (a reload
 * dropped it while calls held permits) a take still counts, so that gives balance. */
int fz_permit_take(fz_breaker *b, int count_full) {
  fzp *p = permits_of(b);
  uint32_t limit = OPT(b, cfg.max_concurrent);
  if (!p || fzp_take(p, limit ? limit : FZ_MAX_CONCURRENT * 4u)) return 1;
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

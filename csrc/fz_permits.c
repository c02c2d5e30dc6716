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
#include <linux/membarrier.h>
#include <stddef.h>
#include <stdlib.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SCAN_NS UINT64_C(200000000)  /* a look for dead owners at most every 0.2 s */
#define STEAL_ROUNDS 16               /* a taker's rounds while the permits move (take_onto) */
#define MARK_WAIT_NS UINT64_C(5000000)  /* a taker's wait for another taker's give-back: 5 ms */
#define ID22 ((UINT64_C(1) << 22) - 1)

_Thread_local __attribute__((tls_model("initial-exec"))) fzp_mine fzp_cache[FZP_CACHE];
_Thread_local __attribute__((tls_model("initial-exec"))) fzp_self_t fzp_self =
  { 1, UINT64_C(1) << 24, offsetof(fzp, lane), 0, 0 };  /* not known yet: lane 0's, matching no owner */
_Static_assert(sizeof(fzp_lane) == 64, "a lane is alone on its cache line");

/* Whether this process is registered for membarrier's global expedited barrier (so that
 * its lanes may keep spare permits, which takers take with that barrier): 1 yes, -1 no,
 * 0 not asked yet (in the process whose pid is g_fence_pid). FUSE_PERMITS_NOFENCE=1 in
 * the environment says no (the fallback of a kernel without it, for tests). */
static int g_fence, g_fence_pid;

static long membarrier(int cmd) { return syscall(SYS_membarrier, cmd, 0, 0); }

static int fence_ok(void) {
  int pid = (int)getpid();
  if (__atomic_load_n(&g_fence_pid, __ATOMIC_ACQUIRE) == pid) return __atomic_load_n(&g_fence, __ATOMIC_RELAXED) > 0;
  const char *no = getenv("FUSE_PERMITS_NOFENCE");
  long q = membarrier(MEMBARRIER_CMD_QUERY);
  int ok = !(no && *no && *no != '0') && q > 0 && (q & MEMBARRIER_CMD_GLOBAL_EXPEDITED) &&
           (q & MEMBARRIER_CMD_PRIVATE_EXPEDITED) && membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0 &&
           membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
  __atomic_store_n(&g_fence, ok ? 1 : -1, __ATOMIC_RELAXED);
  __atomic_store_n(&g_fence_pid, pid, __ATOMIC_RELEASE);
  return ok;
}

/* A process forked after this inherits the registration, so the kernel marks every CPU
 * as it switches to the child's (new) memory. A process that registers itself after it
 * ran is not marked on a CPU that went idle holding its memory and runs it again from
 * there (a switch from its memory to its memory): another process's global barrier
 * skips that CPU. Seen with test/fence_cpus.c: a worker that registered at its first
 * call, after such a history, received none of 100 barriers on that CPU; forked after
 * the shared registry's maker registered, every one. */
int fzp_register(void) { return fence_ok(); }

/* Every thread of every registered process passes a full barrier: 1, or 0 (the call
 * failed: nothing may be taken from a lane then). fzp_fence_fails (tests only) makes it
 * fail, as a seccomp filter that allows the registration but not the barrier would.
 * The global barrier alone is not enough for this process's own threads: the kernel
 * sends it to the CPUs its runqueues mark as running a registered process, and a CPU
 * that was idle on this process's memory when it registered stays unmarked while it
 * runs only this process's threads (seen: tools/permits_hunt.c with a yield inside the
 * limit, ASan, alone on the machine: 133 of 250 rounds one past the limit; with the
 * private barrier too, none of 240, as with a full fence in every call, none of 250).
 * The private barrier goes to every CPU running one of this process's threads, read
 * from the CPU's current task. */
#ifdef FZ_FAULTS
int fzp_fence_fails;
#endif
static int fence_all(void) {
#ifdef FZ_FAULTS
  if (__atomic_load_n(&fzp_fence_fails, __ATOMIC_RELAXED)) return 0;
#endif
  return membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0 && membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0;
}

/* pid22 << 22 | tid22. The thread's preferred lane is its tid modulo 40: threads and
 * processes of consecutive ids (nginx's workers, one thread each) prefer different
 * lanes (each on a cache line of its own), the same in every breaker. */
static uint64_t me(void) {
  if (fzp_self.key & 1) {
    uint64_t tid = (uint64_t)syscall(SYS_gettid);
    int lane = (int)(tid % FZP_LANES);
    fzp_self.nofence = !fence_ok();
    fzp_self.lane = (uint32_t)lane, fzp_self.bit = fzp_bit(lane);
    fzp_self.off = offsetof(fzp, lane) + (uint64_t)lane * sizeof(fzp_lane);
    fzp_self.key = (((uint64_t)getpid() & ID22) << 22 | (tid & ID22)) << 20;
  }
  return fzp_self.key >> 20;
}

/* A forked child is another process: it owns none of its parent's lanes, and registers
 * for the barrier itself. */
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
 * Lane word st of `lane` with its last take settled against pw, for a lane whose writer
 * is gone (or is the caller): a take whose swap happened but whose lane word was not
 * written shows as the lane's bit in pw differing from the lane's parity (only this
 * lane's writer flips that bit, one take at a time, and writes the lane word after).
 * Callers read the lane word first (acquire: pairs with the release of the writer's swap
 * after its swap of pw, so pw as that swap left it is seen), then pw.
 */
static uint64_t settled(int lane, uint64_t st, uint64_t pw) {
  unsigned bit = (unsigned)(pw >> (24 + lane) & 1), parity = (unsigned)(st & 1);
  return bit == parity ? st : fzp_took(st);
}

/* The lane word of `lane`, read now, settled against pw (read after it, or pw_seen). */
static uint64_t resolve(fzp *p, int lane, uint64_t pw_seen, int use_seen) {
  uint64_t st = at_load_acq(&p->lane[lane].st);
  return settled(lane, st, use_seen ? pw_seen : at_load_acq(&p->pw));
}

/* The sum of the lanes' given counts (mod 2^24), each read with acquire (pairs with the
 * release store of a give: a give summed here happened), and `seen` moved forward to it
 * when it is ahead (a sum read earlier by another caller may be behind or ahead; seen
 * never moves back, so it never says more was given than was). Returns seen after. */
static uint64_t refresh(fzp *p) {
  uint64_t g = 0, used = at_load_acq(&p->used);  /* acquire: pairs with the release in claim */
  FAULT("permit-summing");
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
  FAULT("reclaim-claimed");
  /* its calls died with it (relaxed: the owner word's release below publishes it; a
   * survivor killed after this leaves it for the next, who stores it again) */
  at_store_rlx(&l->run, 0);
  /* Nobody else writes the lane now but a taker of spare permits, whose swaps of the lane
   * word are whole moves (a mark, or a give of permits it holds): each write here is a
   * swap from the word it settled, done again on the word that taker left. */
  int64_t back = 0;
  for (;;) {
    uint64_t raw = at_load_acq(&l->st), st = settled(lane, raw, at_load_acq(&p->pw));
    int32_t held = fzp_held(st);
    if (held > 0) {
      /* one swap gives them all back, the mark cleared: a survivor killed before it
       * leaves the lane as it was, after it a lane holding nothing (release: as a give) */
      if (!at_cas_acqrel(&l->st, &raw, fzp_gave(st & ~FZP_MARK, (uint32_t)held))) continue;
      back += held;
      FAULT("reclaim-given");
      break;
    }
    if (held == 0) {
      /* a take its owner's death left unwritten, and the mark, settled */
      if (st != raw || (st & FZP_RV)) {
        if (!at_cas_acqrel(&l->st, &raw, st & ~FZP_MARK)) continue;
      }
      break;
    }
    /* less than nothing: permits its process took on other lanes were given back on this
     * one; one take on it (no limit: the count is only made right), the protocol of a
     * take, so a survivor killed between two leaves an exact lane; again until none */
    if (st != raw && !at_cas_acqrel(&l->st, &raw, st)) continue;  /* its owner's take, written */
    uint64_t pw = at_load_rlx(&p->pw);
    while (!at_cas_acqrel(&p->pw, &pw, fzp_move(pw, fzp_bit(lane)))) {}
    FAULT("reclaim-taken");
    back--;
    raw = st;
    while (!at_cas_acqrel(&l->st, &raw, fzp_took(raw))) {}
  }
  /* release: the next owner sees the settled lane word (parity of the lane's bit) */
  at_store_rel(&l->owner, owner(gen_of(o) + 1, 0));
  return back;
}

/* Looks for lanes of dead owners: a dead process's are taken back, an exited thread's
 * that run nothing (and hold nothing below zero) are taken back and freed. Lanes holding fewer permits than zero go first (a process
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
        if (held >= 0 && fzp_calls(at_load_acq(&p->lane[i].run)) == 0 && thread_dead(pid, tid) &&
            at_cas_acqrel(&p->lane[i].owner, &want, owner(gen_of(o), me())))
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
   * pending), a mark cleared (the taker's swap then fails), FZP_NS as this process can
   * be fenced or not (a process's threads all alike) */
  uint64_t raw = at_load_acq(&p->lane[i].st), ns = fzp_self.nofence ? FZP_NS : 0;
  while (!at_cas_acqrel(&p->lane[i].st, &raw, (settled(i, raw, at_load_acq(&p->pw)) & ~(FZP_MARK | FZP_NS)) | ns)) {}
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
      int i = k < 0 ? (int)fzp_self.lane : k;
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

/* The owner of lane l, finding it marked by a taker of spare permits: gives back what
 * the lane holds beyond its calls and the one it is admitting, and clears the mark (the
 * taker's own swap then fails). 1 if the lane was marked. */
static int settle(fzp_lane *l) {
  uint64_t st = at_load_acq(&l->st);
  if (!(st & FZP_RV)) return 0;
  int64_t keep = fzp_calls(at_load_rlx(&l->run)) + 1;
  while (st & FZP_RV) {
    int64_t spare = (int64_t)fzp_held(st) - keep;
    /* acq_rel: as a give (the calls that ended on those permits happened before) */
    if (at_cas_acqrel(&l->st, &st, fzp_gave(st & ~FZP_MARK, spare > 0 ? (uint32_t)spare : 0))) break;
  }
  return 1;
}

/* The owner of lane l gives back every permit it holds beyond its calls (the limit fell
 * below what is out: a reload lowered it). */
static void trim(fzp_lane *l) {
  uint64_t st = at_load_acq(&l->st);
  for (;;) {
    int64_t spare = (int64_t)fzp_held(st) - fzp_calls(at_load_rlx(&l->run));
    if (spare <= 0 || at_cas_acqrel(&l->st, &st, fzp_gave(st, (uint32_t)spare))) return;
  }
}

/*
 * The limit was reached: the permits other lanes hold and run nothing on are taken from
 * them. Each lane that looks spare (a peek: held - run > 0) is marked (FZP_RV and this
 * taker's tag, a swap of its lane word; one marked by another taker is marked again with
 * this one's tag); then one global membarrier: every
 * thread of every registered process passes a full barrier, so an owner's call either
 * loaded its lane word after the mark (and fails, see fzp_run_on) or stored its run
 * before the barrier, where it is read now (acquire: pairs with the release of a give).
 * The spare, held - run, is given back with one swap from the marked word, which fails
 * when the owner settled it first (settle) or anything else moved it. Returns the lanes
 * marked: each was settled by this or by its owner, who gives back its spare too, so a
 * take after any is worth trying. Lanes marked FZP_NS are not taken from. When the
 * barrier fails, the marks are left for their owners to settle, and 0 is returned.
 */
static int steal(fzp *p, int mine, uint64_t *busy) {
  uint64_t used = at_load_acq(&p->used) & ((UINT64_C(1) << FZP_LANES) - 1), marked = 0, was[FZP_LANES];
  for (uint64_t m = used; m; m &= m - 1) {
    int i = __builtin_ctzll(m);
    fzp_lane *l = &p->lane[i];
    if (i == mine) continue;
    FAULT("steal-peeking");
    uint64_t st = at_load_acq(&l->st);
    if ((st & FZP_NS) || (int64_t)fzp_held(st) - fzp_calls(at_load_rlx(&l->run)) <= 0) continue;
    FAULT("steal-peeked");
    /* this taker's own mark, over another's (a taker still at it, or killed at it): the
     * other's give-back, a swap from the word it marked, then fails. A mark is never
     * made again with the same tag while its taker waits to swap (the tag is the
     * taker's lane), so that swap cannot succeed on a word that only looks the same:
     * an owner that settles with nothing spare leaves the word as it was before the
     * mark, and a plain mark bit would make it what the first taker marked again. */
    uint64_t mark = (st & ~FZP_MARK) | FZP_RV | (uint64_t)(mine + 1) << FZP_TAG_SHIFT;
    if (!at_cas_acqrel(&l->st, &st, mark)) continue;
    was[i] = mark, marked |= UINT64_C(1) << i;
  }
  if (!marked) return 0;
  FAULT("steal-marked");
  int fenced = fence_all();
  FAULT("steal-fenced");
  /* no barrier: nothing can be given back from here, and the marks stay, so that each
   * owner gives back its spare itself at its next call (settle) */
  if (!fenced) return 0;
  for (uint64_t m = marked; m; m &= m - 1) {
    int i = __builtin_ctzll(m);
    fzp_lane *l = &p->lane[i];
    uint64_t st = was[i];
    int64_t spare = (int64_t)fzp_held(st) - fzp_calls(at_load_acq(&l->run));
    FAULT("steal-read");
    /* acq_rel: as a give; the mark cleared whether anything is given or not */
    if (at_cas_acqrel(&l->st, &st, fzp_gave(st & ~FZP_MARK, spare > 0 ? (uint32_t)spare : 0))) continue;
    /* the word moved: its owner settled (its spare is given back), or another taker
     * marked it again and gives the spare back after its own barrier: busy */
    if ((st & FZP_RV) && (st >> FZP_TAG_SHIFT & 0x3f) != (uint64_t)(mine + 1)) *busy |= UINT64_C(1) << i;
  }
  FAULT("steal-given");
  return __builtin_popcountll(marked);
}

/* Waits, up to MARK_WAIT_NS, until no lane of `busy` is marked: the takers that marked
 * them again after this one (see steal) have given back their spare, which this one
 * may take then. 1 once none is, 0 after the wait (a taker killed at its mark, or not
 * run for that long: its mark stays for the owner to settle). */
static int marks_cleared(fzp *p, uint64_t busy) {
  uint64_t until = coarse_ns() + MARK_WAIT_NS;
  for (;;) {
    FAULT("steal-waiting");
    for (uint64_t m = busy; m; m &= m - 1) {
      int i = __builtin_ctzll(m);
      if (!(at_load_acq(&p->lane[i].st) & FZP_RV)) busy &= ~(UINT64_C(1) << i);
    }
    if (!busy) return 1;
    if (coarse_ns() > until) return 0;
    sched_yield();
  }
}

/* One more take, after permits were given back (no recursion into fzp_full). */
static int take_again(fzp *p, uint32_t limit) {
  int lane = fzp_lane_of(p);
  if (lane < 0) return 0;
  refresh(p);
  return fzp_take_on(p, &p->lane[lane], fzp_bit(lane), limit);
}

/* The words a refusal is decided on: `used`, pw, and each used lane's word and run, into
 * v; returns how many. (`mine`: the caller's lane, only for the pause point.) */
static int collect(fzp *p, int mine, uint64_t *v) {
  int n = 0;
  uint64_t used = at_load_acq(&p->used) & ((UINT64_C(1) << FZP_LANES) - 1);
  v[n++] = used;
  v[n++] = at_load_acq(&p->pw);
  for (uint64_t m = used; m; m &= m - 1) {
    int i = __builtin_ctzll(m);
    if (i != mine) FAULT("permit-collecting");
    v[n++] = at_load_acq(&p->lane[i].st);
    v[n++] = at_load_acq(&p->lane[i].run);
  }
  return n;
}

/* Whether the limit is reached with nothing to take, exactly: the words collected twice
 * alike (a view true at one instant between the two reads: see run), the permits held in
 * that view (pw's count less the lanes' gives) at least `limit`, and no lane but `mine`
 * (whose spare its owner uses) holding more than it runs (a take in flight, its pw swap
 * made and its lane word not yet, counted as the lane's: settled). An unfenced lane
 * (FZP_NS) holds more than it runs only while a call starts (its permit taken, its run
 * not stored yet) or ends (its run stored, its permit not given back yet): the permits
 * are moving, read again. Then the calls running at that instant are the permits held:
 * a refusal is right. 0 when the view moved while it was read, or shows a permit free,
 * spare or moving. */
static int exactly_full(fzp *p, int mine, uint32_t limit) {
  uint64_t a[2 + 2 * FZP_LANES], b[2 + 2 * FZP_LANES];
  int n = collect(p, mine, a);
  FAULT("permit-viewing");
  if (collect(p, mine, b) != n || memcmp(a, b, (size_t)n * sizeof a[0])) return 0;
  uint64_t pw = a[1], given = 0;
  int k = 2;
  for (uint64_t m = a[0]; m; m &= m - 1, k += 2) {
    int i = __builtin_ctzll(m);
    uint64_t st = settled(i, a[k], pw);
    given += fzp_given(st);
    if (i != mine && (int64_t)fzp_held(st) - fzp_calls(a[k + 1]) > 0) return 0;
  }
  return ((pw - given) & FZP_COUNT) >= limit;
}

/* One permit onto lane `lane` (the caller's), whatever it takes: the swap; when the limit
 * looks reached, the lanes read again, and again while that moves `seen` forward. One
 * sum is not enough: other threads' takes between the sum and this take count in pw at
 * once, their gives only in a later sum, so a take after one sum can find the limit
 * "reached" while far fewer permits are held (seen under load: 2 threads, 1,000
 * permits, a full rejection). A sum that moves nothing means no give happened since the
 * last. Then the spare permits of other lanes (steal). Permits move while a taker is at
 * it (another taker took the spare this one marked, or marked it again and gives it back
 * after its own barrier, see marks_cleared; a call ended after the peek), so a taker that
 * got nothing is refused only when a view of the permits true at one instant says the
 * limit is reached with nothing spare (exactly_full); otherwise it goes round again, up
 * to STEAL_ROUNDS times. Before, a take was refused with permits free (random pauses, 8
 * threads that never hold the limit of 3 between them: 1 refusal in about 15,000 takes;
 * CI: 5 requests at once against a limit of 5, one answered 503). Then dead owners'
 * permits (fzp_full). 1 taken, 0 the limit is reached. */
static int take_onto(fzp *p, int lane, uint32_t limit) {
  fzp_lane *l = &p->lane[lane];
  if (fzp_take_on(p, l, fzp_bit(lane), limit)) return 1;
  for (int round = 0; round < STEAL_ROUNDS; round++) {
    uint64_t seen = at_load_acq(&p->seen);
    for (int i = 0; i < 64; i++) {
      uint64_t now = refresh(p);
      FAULT("permit-refreshed");
      if (fzp_take_on(p, l, fzp_bit(lane), limit)) return 1;
      if (now == seen) break;
      seen = now;
    }
    uint64_t busy = 0;
    if (steal(p, lane, &busy) > 0 && take_again(p, limit)) return 1;
    if (busy && marks_cleared(p, busy) && take_again(p, limit)) return 1;
    if (exactly_full(p, lane, limit)) break;
    FAULT("steal-again");
  }
  return fzp_full(p, limit);
}

/* A take, whatever the fast path could not do: find or claim the lane; a mark settled;
 * a permit taken onto the lane when it holds none spare; the call admitted on it. A lane
 * of a process that cannot be fenced takes a permit for each call. 1 taken, 0 not. */
int fzp_take_any(fzp *p, uint32_t limit) {
  int lane = fzp_lane_of(p);
  if (lane < 0) return fzp_full(p, limit);
  fzp_lane *l = &p->lane[lane];
  if (fzp_self.nofence) {
    if (!take_onto(p, lane, limit)) return 0;
    at_store_rlx(&l->run, at_load_rlx(&l->run) + FZP_START);
    return 1;
  }
  /* bounded: each round that does not admit took a permit that a taker of spare ones
   * took in turn (it was admitted: the limit is in use) */
  for (int round = 0; round < 8; round++) {
    if (fzp_run_on(p, l, limit)) return 1;
    if (settle(l)) continue;
    uint64_t st = at_load_acq(&l->st);
    if ((int64_t)fzp_held(st) > fzp_calls(at_load_rlx(&l->run))) trim(l);  /* spare, yet over the limit */
    if (!take_onto(p, lane, limit)) return 0;
  }
  return 0;
}

/* A give whose lane was not remembered: found or claimed, or laneless; a process that
 * cannot be fenced gives the permit back too. */
void fzp_give_any(fzp *p) {
  int lane = fzp_lane_of(p);
  if (lane < 0) {
    fzp_give_laneless(p);
    return;
  }
  fzp_lane *l = &p->lane[lane];
  fzp_give_on(l);
  if (fzp_self.nofence) {
    uint64_t st = at_load_rlx(&l->st);
    /* acq_rel: as a give (release) */
    while (!at_cas_acqrel(&l->st, &st, fzp_gave(st, 1))) {}
  }
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
    uint64_t st = resolve(p, i, pw, 1) & ~FZP_MARK;  /* (a mark of the old registry's taker) */
    at_store_rlx(&p->lane[i].st, st);
    /* (the copied `used` may be behind; fzp_running reads the runs of used lanes only) */
    if (st || at_load_rlx(&p->lane[i].owner) || at_load_rlx(&p->lane[i].run)) used |= UINT64_C(1) << i;
    taken += st & FZP_COUNT;
    given += fzp_given(st);
    bits |= (st & 1) << (24 + i);
  }
  at_store_rlx(&p->pw, bits | (taken & FZP_COUNT));
  at_store_rlx(&p->seen, given & FZP_COUNT);
  at_store_rlx(&p->used, used);
}

/* Calls running now: the lanes' runs added up, but a dead process's (its calls ended
 * with it; its permits are taken back when a caller needs them, and till then its lanes
 * still count its last runs); a sum caught below zero (a call ended on another thread
 * read before its start) reads 0. A lane of another process that runs calls costs a
 * kill(pid, 0). Only the lanes of `used` are read: a lane never claimed ran no call (its
 * run is written by its owners and their survivors only), so a breaker that never took
 * a permit costs one line here, not 40 (fz_stats_peek of every breaker at each scrape). */
uint32_t fzp_running(const fzp *p) {
  uint32_t mypid = 0;
  int64_t n = 0;
  /* acquire: pairs with the release in claim (a lane claimed after this read runs calls
   * that began after it: as if read a moment earlier) */
  uint64_t used = at_load_acq(&p->used) & ((UINT64_C(1) << FZP_LANES) - 1);
  for (uint64_t m = used; m; m &= m - 1) {
    int i = __builtin_ctzll(m);
    int64_t r = fzp_calls(at_load_acq(&p->lane[i].run));
    if (!r) continue;
    /* relaxed: a lane's owner changes only when it is claimed or taken back, and either
     * way the run read is the last owner's or 0 */
    uint32_t pid = pid_of(at_load_rlx(&p->lane[i].owner));
    if (!mypid) mypid = (uint32_t)getpid() & ID22;
    if (pid && pid != mypid && pid_dead(pid)) continue;
    n += r;
  }
  return n <= 0 ? 0 : (uint32_t)n;
}

/* Whether a live process runs calls on p (fzp_running leaves out the lanes of dead
 * owners: their calls died with them; their permits are taken back when a caller needs
 * them). A breaker in use is never idle, whatever its last use:
 * an eviction would make its name again with no permit held, and its limit would admit
 * as many calls again beside those still running (fz_state.c, fzi_unused_ns). */
int fzp_in_use(const fzp *p) {
  return fzp_running(p) > 0;
}

/* ---------------------------------------------------------------- permits */

/* max_concurrent (csrc/fz_permits.h, csrc/fz_permits.c): with no limit set (a reload
 * dropped it while calls held permits) a take still counts, so that gives balance. */
int fz_permit_take(fz_breaker *b, int count_full) {
  fzp *p = permits_of(b);
  if (!p || fzp_take_fast(p, permit_limit(b))) return 1;
  permits_mark(b);
  if (fzp_take_any(p, permit_limit(b))) return 1;
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
  /* none taken: the copy's are zero already (a fresh mapping), and stay untouched */
  fzp *p = permits_of(to), *q = permits_read(from);
  if (!p || !q) return;
  memcpy(p, q, sizeof *p);
  fzp_rebuild(p);
}

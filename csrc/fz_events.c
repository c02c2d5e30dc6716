/*
 * fz_events.c -- the ring of recent transitions of named breakers (fuse.events,
 * fuse.watch).
 *
 * A fixed ring of FZ_EVENTS_CAPACITY entries in one mapping: private to the process,
 * or (fz_events_init_shared, before nginx forks its workers) MAP_SHARED, so that every
 * worker records into and reads the same ring. No pointers live in it.
 *
 * Memory ordering. A writer takes seq = head + 1; its entry is slot seq % capacity.
 * The entry's own word `seq` is a seqlock over the entry's lap (seq / capacity + 1: the
 * slot is the seq's low bits; 0 is a fresh entry's): the writer claims it with a compare-and-swap to
 * lap | BUSY | its pid (only from an older lap), and only then moves `head` on to seq (a
 * compare-and-swap; a writer that finds seq claimed by another moves head on for it, in
 * case that one was killed before it could, and tries the next seq). So every entry up
 * to head is claimed, and its claim says who made it: a writer killed between taking a
 * seq and claiming its entry holds nothing that readers would wait on. The writer then
 * writes the fields with release stores, then publishes with a compare-and-swap back to
 * seq (release). A reader loads the entry's seq (acquire), copies the fields
 * with acquire loads and loads seq again: the copy is good when both loads of seq read
 * exactly the seq it wanted (a field written by a later writer carries that writer's
 * claim with it, so the second load sees the seq changed). One interleaving gets past
 * that: a writer stalled between its claim and its last store while `capacity` newer
 * events are recorded lands its late stores in a newer, published entry. So each entry
 * also holds a hash of its seq and fields, written last: a copy that fails it was mixed
 * and reads as lost (-1), never as an event. Nothing takes a lock.
 *
 * A claim says who made it: the claimant's pid is in the claimed word itself, so it is
 * the winner's whatever other writers racing for the entry did (a pid in a word of its
 * own, stored before the swap, was the last racer's: when the winner died, readers
 * waited on a live loser's claim until the stall limit). And when: `since`, monotonic
 * seconds, moved forward (never back) before the claim's swap. A writer killed after
 * its claim would leave its entry "being written" for ever, and in-order readers
 * (fuse.events, fuse.watch) would wait on it until the ring came round; so a reader that
 * finds an entry claimed by a dead process, or claimed STALL_S seconds ago, takes it
 * back (lap | LOST, one compare-and-swap from that very claim, which the writer's
 * publishing swap then loses) and reads it as lost (-1).
 *
 * The word: BUSY (bit 63), LOST (62), the claimant's pid (bits 40-61: Linux pids are
 * below 2^22) and the lap (bits 0-39). So seqs stay below SEQ_LIMIT, about 2^50 (35
 * years at a million events a second); past it nothing more is recorded.
 */
#include "fz.h"
#include "fz_atomic.h"
#include "fz_fault.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define LINE 64

#define BUSY (UINT64_C(1) << 63)
#define LOST (UINT64_C(1) << 62)  /* taken back from a writer that died holding it */
#define LAP_BITS 40
#define LAP_MASK ((UINT64_C(1) << LAP_BITS) - 1)
#define PID_MASK ((UINT64_C(1) << 22) - 1)  /* above LAP_BITS, below LOST */
#define LAP_SHIFT 10                         /* FZ_EVENTS_CAPACITY = 2^LAP_SHIFT */
#define SEQ_LIMIT (LAP_MASK << LAP_SHIFT)      /* the last lap, LAP_MASK, ends below it */
_Static_assert(FZ_EVENTS_CAPACITY == 1 << LAP_SHIFT, "a seq is its lap and its slot");

static uint64_t lap_of(uint64_t seq) { return (seq >> LAP_SHIFT) + 1; }
#define STALL_S 10                /* a claim this old is taken back, owner alive or not */
#define NAME_WORDS ((FZ_NAME_MAX + 1) / 8)

typedef struct entry {
  uint64_t seq;                /* concurrent: the lap held, | BUSY | pid while written, | LOST taken back */
  uint64_t since;              /* concurrent: monotonic seconds of the newest claim, never moved back */
  uint64_t time_ns;            /* concurrent: CLOCK_REALTIME when recorded */
  uint64_t meta;               /* concurrent: pid << 32 | from << 24 | to << 16 | name length */
  uint64_t name[NAME_WORDS];   /* concurrent: the name, NUL-padded */
  uint64_t check;              /* concurrent: check_of(seq, the fields above) */
} entry;

typedef struct ring {
  _Alignas(LINE) uint64_t shared;
  _Alignas(LINE) uint64_t head;  /* concurrent: the seq of the newest event claimed */
  _Alignas(LINE) entry e[FZ_EVENTS_CAPACITY];
} ring;

static ring *g_ring;  /* concurrent: set once, or replaced by fz_events_init_shared */
static pthread_mutex_t g_ring_init = PTHREAD_MUTEX_INITIALIZER;

static ring *ring_map(int shared) {
  int flags = MAP_ANONYMOUS | (shared ? MAP_SHARED : MAP_PRIVATE);
  void *p = mmap(NULL, sizeof(ring), PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) return NULL;
  ((ring *)p)->shared = (uint64_t)shared;
  return p;
}

static ring *ring_get(void) {
  ring *r = __atomic_load_n(&g_ring, __ATOMIC_ACQUIRE);  /* pairs with the releases below */
  if (r) return r;
  pthread_mutex_lock(&g_ring_init);
  if (!(r = g_ring)) {
    r = ring_map(0);
    __atomic_store_n(&g_ring, r, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&g_ring_init);
  return r;
}

int fz_events_init_shared(void) {
  int rc = FZ_OK;
  pthread_mutex_lock(&g_ring_init);
  if (!g_ring || !g_ring->shared) {
    ring *n = ring_map(1);
    if (!n) rc = FZ_ESHARED;
    else __atomic_store_n(&g_ring, n, __ATOMIC_RELEASE);  /* a private one is left mapped */
  }
  pthread_mutex_unlock(&g_ring_init);
  return rc;
}

/* A hash of an entry's seq and fields: a copy whose fields came from two writers (see
 * the design note) or from another seq fails it. */
static uint64_t check_of(uint64_t seq, uint64_t t, uint64_t meta, const uint64_t *name) {
  uint64_t h = seq * UINT64_C(0x9e3779b97f4a7c15) ^ t;
  h = (h ^ h >> 31) * UINT64_C(0xbf58476d1ce4e5b9) ^ meta;
  for (int i = 0; i < NAME_WORDS; i++) h = (h ^ h >> 29) * UINT64_C(0x94d049bb133111eb) ^ name[i];
  return h ^ h >> 32;
}

static uint64_t wall_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec;
}

/* Claims entry e for lap: its claimed word, or 0 when a newer event holds it already.
 * The word says who (the pid); `since` says when (moved forward before the swap: a
 * reader that sees the claim sees a time at least as new). */
static uint64_t claim(entry *e, uint64_t lap) {
  /* acquire: pairs with another writer's claiming swap, which fz_events_add may then move
   * head past (readers that see head see that claim) */
  uint64_t cur = at_load_acq(&e->seq);
  if ((cur & LAP_MASK) >= lap) return 0;
  /* moved forward before the claim's swap, whose release carries it (a reader that sees
   * the claim with its acquire load sees this time or a newer one) */
  uint64_t now = mono_s(), was = at_load_rlx(&e->since);
  while (was < now && !at_cas_acqrel(&e->since, &was, now)) {}
  uint64_t pid = (uint64_t)getpid();
  uint64_t mine = BUSY | (pid <= PID_MASK ? pid : 0) << LAP_BITS | lap;
  FAULT("event-claiming");
  do {
    if ((cur & LAP_MASK) >= lap) return 0;
  } while (!at_cas_acqrel(&e->seq, &cur, mine));
  return mine;
}

/* An entry whose word is `claimed` (not published): taken back (LOST, so readers go past
 * it) when its claimant is dead or it was claimed STALL_S seconds ago. 1 when it is lost
 * now. */
static int take_back(entry *e, uint64_t claimed) {
  pid_t pid = (pid_t)(claimed >> LAP_BITS & PID_MASK);
  int dead = pid > 0 && kill(pid, 0) == -1 && errno == ESRCH;
  uint64_t since = at_load_acq(&e->since);  /* acquire: see claim */
  int stalled = mono_s() >= since + STALL_S;
  if (!dead && !stalled) return 0;
  uint64_t lost = LOST | (claimed & LAP_MASK), cur = claimed;
  return at_cas_acqrel(&e->seq, &cur, lost) || cur == lost;
}

double fz_events_add(const char *name, size_t len, int from, int to) {
  ring *r = ring_get();
  if (!r || !name || len < 1 || len > FZ_NAME_MAX || memchr(name, 0, len)) return 0;
  uint64_t words[NAME_WORDS] = { 0 };
  memcpy(words, name, len);
  uint64_t seq, mine;
  entry *e;
  for (;;) {  /* the entry after head, claimed before head moves on to it */
    uint64_t h = at_load_acq(&r->head);  /* acquire: pairs with the swap below */
    seq = h + 1;
    if (seq >= SEQ_LIMIT) return 0;
    e = &r->e[seq % FZ_EVENTS_CAPACITY];
    mine = claim(e, lap_of(seq));
    FAULT("event-seq-taken");
    /* head to seq, ours or the claim of a writer that stopped before moving it (killed
     * there: its claim says who, and readers take it back). seq_cst: pairs with the
     * load of head in fz_events_last, as the fetch-and-add it replaces did */
    at_cas_sc(&r->head, &h, seq);
    if (mine) break;
  }
  FAULT("event-claimed");
  /* release: each field store carries the claim before it (pairs with the reader's
   * acquire loads of the fields: a reader that saw a field of ours sees the claim when
   * it loads seq again, so it drops its copy) */
  uint64_t t = wall_ns();
  uint64_t meta = (uint64_t)(uint32_t)getpid() << 32 | (uint64_t)(from & 0xff) << 24 |
                  (uint64_t)(to & 0xff) << 16 | (uint64_t)len;
  at_store_rel(&e->time_ns, t);
  at_store_rel(&e->meta, meta);
  for (int i = 0; i < NAME_WORDS; i++) at_store_rel(&e->name[i], words[i]);
  at_store_rel(&e->check, check_of(seq, t, meta, words));
  /* release: publishes the fields (pairs with the reader's first, acquire, load) */
  __atomic_compare_exchange_n(&e->seq, &mine, lap_of(seq), 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
  return (double)seq;
}

double fz_events_last(void) {
  ring *r = ring_get();
  return r ? (double)at_load_sc(&r->head) : 0;
}

int fz_events_read(double want, fz_event *out) {
  ring *r = ring_get();
  if (!r || !(want >= 1 && want < (double)SEQ_LIMIT)) return 0;
  uint64_t seq = (uint64_t)want, lap = lap_of(seq);
  entry *e = &r->e[seq % FZ_EVENTS_CAPACITY];
  uint64_t v1 = at_load_acq(&e->seq);  /* acquire: pairs with the writer's publishing CAS */
  if ((v1 & LAP_MASK) > lap || v1 == (LOST | lap)) return -1;
  if ((v1 & BUSY) && (v1 & LAP_MASK) == lap) return take_back(e, v1) ? -1 : 0;
  if (v1 != lap) return 0;
  uint64_t words[NAME_WORDS];
  /* acquire: pairs with the writer's release stores of the fields (see fz_events_add) */
  uint64_t t = at_load_acq(&e->time_ns), meta = at_load_acq(&e->meta);
  for (int i = 0; i < NAME_WORDS; i++) words[i] = at_load_acq(&e->name[i]);
  uint64_t check = at_load_acq(&e->check);
  uint64_t v2 = at_load_rlx(&e->seq);
  if (v2 != lap) return (v2 & LAP_MASK) > lap || v2 == (LOST | lap) ? -1 : 0;
  /* published, yet written over by a stalled older writer: this event is lost */
  if (check != check_of(seq, t, meta, words)) return -1;
  size_t len = meta & 0xffff;
  if (len > FZ_NAME_MAX) return -1;
  out->seq = (double)seq;
  out->time = (double)t / 1e9;
  out->pid = (int32_t)(meta >> 32);
  out->from = (int32_t)(meta >> 24 & 0xff);
  out->to = (int32_t)(meta >> 16 & 0xff);
  memcpy(out->name, words, len);
  out->name[len] = 0;
  return 1;
}

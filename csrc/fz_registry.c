/*
 * fz_registry.c -- the registry of named breakers: slots, a lock-free hash index,
 * removal and idle eviction.
 *
 * Design note
 * -----------
 *
 * One mapping (private, or MAP_SHARED for nginx workers), MAP_NORESERVE, laid out as
 *
 *   header | meta[capacity] | index[2^k >= 2 * capacity] | free[capacity]
 *          | breakers[capacity] | rings[capacity]
 *
 * Nothing in it is a pointer (slots are indices, a breaker's ring an offset), so it works
 * at any address. Only pages that slots in use touch become resident: a breaker with a
 * time window costs its breaker and meta lines; the 4 KB count-window ring of a slot is
 * touched only by a count-window breaker.
 *
 * Slots. Each breaker has an identity word (fz_breaker_id): 0 while its slot was never
 * used, odd while a breaker lives there, even once it is removed. A handle remembers
 * (slot, identity); fz_enter_id answers FZ_STALE for a handle whose identity is gone,
 * and a new breaker in a slot continues the slot's generation, so a ticket taken from an
 * earlier breaker there is stale (fz_done ignores it). Freed slots go to a FIFO and the
 * never-used slots are taken first, so a slot is reused as late as possible.
 *
 * The index: open addressing with linear probing over 64-bit words hash32 << 32 | slot+1
 * (0 = empty). A lookup reads words with acquire loads, never takes a lock, and checks a
 * candidate slot like a seqlock: its identity (acquire, odd), then the name and hash in
 * its meta (acquire word loads), the identity again; equal means the
 * name belonged to that live breaker. Removal is a backward shift (no tombstones, so a
 * miss ends at the first empty word however many names came and went); a shift can move
 * a word behind a reader, so the `moves` counter is odd while one runs, and a reader
 * that missed retries when `moves` changed during its scan.
 *
 * Writers (create, remove, evict) hold the registry's mutex: process-shared and robust.
 * A writer killed while holding it leaves at most one slot half-done; the next writer
 * gets EOWNERDEAD and rebuilds the index, the free list and the live count from the
 * slots (repair), under an odd `moves`, so readers retry rather than miss.
 *
 * Eviction (with `idle`): when creation finds every slot taken, it scans from a rotating
 * hand (SCAN slots at most, whatever the capacity: the next creation goes on where it
 * stopped) for the evictable breaker (closed, no failure in its window, no
 * call for `idle` seconds) that has been unused longest, and retires it with a
 * compare-and-swap of its state word from closed, so a breaker that trips meanwhile is
 * never evicted. "Last call" is the coarse stamp a call writes when it is the first to
 * count in a bucket (fz_window.h, tw_add): no write on the hot path.
 */
#include "fz.h"
#include "fz_atomic.h"
#include "fz_fault.h"
#include "fz_internal.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define LINE 64
#define REG_MAGIC 0x667a7232u  /* "fzr2" */
#define PRIVATE_CAPACITY 4096
#define MAX_CAPACITY 1000000
#define RING_BYTES (FZ_RING_BYTES + FZ_PERMITS_BYTES)  /* a slot's ring, then its permits */
#define NAME_WORDS ((FZ_NAME_MAX + 1) / 8)
#define SCAN 256  /* slots an eviction looks at, at most */

typedef struct meta {
  uint64_t hash;              /* concurrent: the name's hash */
  uint64_t len;               /* concurrent: the name's length */
  uint64_t name[NAME_WORDS];  /* concurrent: the name, zero-padded, as words */
} meta;

typedef struct registry {
  _Alignas(LINE) uint32_t magic, shared, capacity, tmask;  /* tmask: index words - 1 */
  uint64_t idle_ns;           /* 0: no eviction */
  uint64_t hkey[2];           /* the name hash's key: random, made with the mapping */
  uint64_t size, slot_size;
  uint64_t off_meta, off_index, off_free, off_slots, off_rings;
  pthread_mutex_t lock;       /* process-shared and robust: writers only */

  _Alignas(LINE) uint32_t top;  /* concurrent: slots ever handed out */
  uint32_t live;                /* concurrent: breakers registered now */
  uint64_t moves;               /* concurrent: odd while the index is being shifted or rebuilt */
  uint64_t free_head, free_tail;/* under the lock: the FIFO of freed slots */
  uint64_t hand;                /* under the lock: where the eviction scan goes on */
  uint64_t dry;                 /* under the lock: slots scanned in a row with none evictable */
  double barren_until;          /* under the lock: a scan found nothing evictable; none before */
  uint64_t full_total;          /* concurrent: calls run unguarded, registry full */
  uint64_t evictions_total;     /* concurrent */
  uint32_t stripes;             /* concurrent: counter stripes handed out (fzi_stripe_next) */
} registry;

#define HEADER ((sizeof(registry) + LINE - 1) / LINE * LINE)

static registry *g_reg;  /* concurrent: set once, replaced only by fz_registry_init */
static pthread_mutex_t g_reg_init = PTHREAD_MUTEX_INITIALIZER;
/* Under g_reg_init: the Lua states that loaded the core in this process so far
 * (fz_registry_epoch); the mapping the last reload replaced, the state (epoch) and the
 * process that replaced it, for fz_registry_undo. */
static uint64_t g_epoch;
static pid_t g_epoch_pid;
static registry *g_prev;
static uint64_t g_prev_epoch;
static pid_t g_prev_pid;

/* ---------------------------------------------------------------- layout */

static meta *meta_of(registry *r, uint32_t s) { return (meta *)(void *)((char *)r + r->off_meta) + s; }
static uint64_t *index_of(registry *r) { return (uint64_t *)(void *)((char *)r + r->off_index); }
static uint32_t *free_of(registry *r) { return (uint32_t *)(void *)((char *)r + r->off_free); }

static fz_breaker *slot_of(registry *r, uint32_t s) {
  return (fz_breaker *)(void *)((char *)r + r->off_slots + (size_t)s * r->slot_size);
}

static uint32_t *ring_of(registry *r, uint32_t s) {
  return (uint32_t *)(void *)((char *)r + r->off_rings + (size_t)s * RING_BYTES);
}

static size_t up(size_t n) { return (n + 4095) / 4096 * 4096; }

/* A random key for the name hash: the kernel's, or (without it) the clocks, the pid and
 * an address, mixed. Made with each mapping, so every forked worker has its registry's. */
static void make_key(uint64_t key[2]) {
  if (getrandom(key, 2 * sizeof key[0], GRND_NONBLOCK) == (ssize_t)(2 * sizeof key[0])) return;
  struct timespec a, b;
  clock_gettime(CLOCK_REALTIME, &a), clock_gettime(CLOCK_MONOTONIC, &b);
  uint64_t x = (uint64_t)a.tv_nsec ^ (uint64_t)a.tv_sec << 32 ^ (uint64_t)(uintptr_t)key;
  uint64_t y = (uint64_t)b.tv_nsec ^ (uint64_t)b.tv_sec << 20 ^ (uint64_t)getpid() << 40;
  for (int i = 0; i < 2; i++) {
    x = (x ^ x >> 31) * 0x9e3779b97f4a7c15u ^ y;
    y = (y ^ y >> 29) * 0xbf58476d1ce4e5b9u ^ x;
  }
  key[0] = x, key[1] = y | 1;
}

static registry *reg_map(uint32_t capacity, int shared, uint64_t idle_ns) {
  uint32_t words = 16;
  while (words < 2 * capacity) words *= 2;
  size_t off_meta = up(HEADER), off_index = off_meta + up((size_t)capacity * sizeof(meta));
  size_t off_free = off_index + up((size_t)words * 8);
  size_t off_slots = off_free + up((size_t)capacity * 4);
  size_t off_rings = off_slots + up((size_t)capacity * fzi_breaker_size());
  size_t size = off_rings + (size_t)capacity * RING_BYTES;
  int flags = MAP_ANONYMOUS | MAP_NORESERVE | (shared ? MAP_SHARED : MAP_PRIVATE);
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) return NULL;
  registry *r = p;
  if (shared) fzp_register();  /* before the fork: the workers inherit it (fz_permits.c) */
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, shared ? PTHREAD_PROCESS_SHARED : PTHREAD_PROCESS_PRIVATE);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&r->lock, &a);
  pthread_mutexattr_destroy(&a);
  r->magic = REG_MAGIC, r->shared = (uint32_t)shared, r->capacity = capacity, r->tmask = words - 1;
  r->idle_ns = idle_ns, r->size = size, r->slot_size = fzi_breaker_size();
  r->off_meta = off_meta, r->off_index = off_index, r->off_free = off_free;
  r->off_slots = off_slots, r->off_rings = off_rings;
  make_key(r->hkey);
  return r;
}

static registry *reg_get(void) {
  registry *r = __atomic_load_n(&g_reg, __ATOMIC_ACQUIRE);  /* pairs with the release below */
  if (r) return r;
  pthread_mutex_lock(&g_reg_init);
  if (!(r = g_reg)) {
    r = reg_map(PRIVATE_CAPACITY, 0, 0);
    __atomic_store_n(&g_reg, r, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&g_reg_init);
  return r;
}

/* ---------------------------------------------------------------- names */

static int name_ok(const char *name, size_t len) {
  return name && len >= 1 && len <= FZ_NAME_MAX && !memchr(name, 0, len);
}

/* 64 x 64 -> 128-bit multiply, folded: the high half xor the low half. */
static uint64_t mix(uint64_t a, uint64_t b) {
  __extension__ unsigned __int128 p = (unsigned __int128)a * b;
  return (uint64_t)p ^ (uint64_t)(p >> 64);
}

/* The name as zero-padded words, and its hash under the registry's key: every word is
 * mixed with both halves of the key (a keyed multiply-fold of our own, not a
 * cryptographic MAC): names chosen without the key, which never leaves the mapping,
 * cannot be made to share a home (DESIGN.md, "Gateway scale"). */
static uint64_t pack(const registry *r, const char *name, size_t len, uint64_t key[NAME_WORDS]) {
  uint64_t k0 = r->hkey[0], k1 = r->hkey[1];
  uint64_t h = mix(k0 ^ len, k1 ^ 0x9e3779b97f4a7c15u);
  size_t n = (len + 7) / 8;
  key[n - 1] = 0;
  memcpy(key, name, len);
  for (size_t i = 0; i < n; i++) h = mix(h ^ key[i] ^ k1, k0 ^ 0xff51afd7ed558ccdu);
  return mix(h ^ k0, k1 ^ 0xc4ceb9fe1a85ec53u);
}

/* The word's tag and home: the hash's high 32 bits, all of them (0 too: a word is never
 * 0 anyway, its slot + 1 is not), so every index word can be a home. */
static uint32_t tag_of(uint64_t h) { return (uint32_t)(h >> 32); }

/* Whether live slot s holds this name; its identity in *id. A seqlock read (see the note). */
static int slot_is(registry *r, uint32_t s, const uint64_t *key, size_t len, uint64_t h, uint32_t *id) {
  fz_breaker *b = slot_of(r, s);
  uint32_t id1 = fz_breaker_id(b);  /* acquire: pairs with the release that publishes a breaker */
  if (!(id1 & 1) || fzi_is_removed(b)) return 0;  /* removed: its identity goes next */
  meta *m = meta_of(r, s);
  /* acquire: pairs with the release stores of write_meta, so the identity read below is
   * at least as new as the removal that came before a name we read */
  if (at_load_acq(&m->hash) != h || at_load_acq(&m->len) != len) return 0;
  for (size_t i = 0; i < (len + 7) / 8; i++)
    if (at_load_acq(&m->name[i]) != key[i]) return 0;
  if (fz_breaker_id(b) != id1) return 0;
  if (id) *id = id1;
  return 1;
}

static void write_meta(registry *r, uint32_t s, const uint64_t *key, size_t len, uint64_t h) {
  meta *m = meta_of(r, s);
  /* release: the slot's identity was made even before these (see slot_is) */
  at_store_rel(&m->hash, h);
  at_store_rel(&m->len, len);
  for (size_t i = 0; i < NAME_WORDS; i++) at_store_rel(&m->name[i], i < (len + 7) / 8 ? key[i] : UINT64_C(0));
}

/* ---------------------------------------------------------------- the index */

/* The slot of the live breaker named key, -1 when there is none, or -2 when shifts
 * kept moving words under the scan (or a writer died in one: `moves` stays odd until the
 * next writer repairs it); then the caller asks again under the lock. Lock-free. */
static int64_t idx_find(registry *r, const uint64_t *key, size_t len, uint64_t h, uint32_t *id) {
  uint64_t *t = index_of(r), mask = r->tmask;
  uint32_t tag = tag_of(h);
  for (int tries = 0; tries < 1000; tries++) {
    uint64_t m1 = at_load_acq(&r->moves);
    uint64_t i = tag & mask;
    for (uint64_t n = 0; n <= mask; n++, i = (i + 1) & mask) {
      uint64_t w = at_load_acq(&t[i]);  /* acquire: pairs with the release of idx_put */
      FAULT("reg-probe");  /* tests count the words a lookup reads */
      if (!w) break;
      uint32_t s = (uint32_t)w - 1;
      if ((uint32_t)(w >> 32) == tag && s < r->capacity && slot_is(r, s, key, len, h, id)) return s;
    }
    /* a miss is real only when no shift or rebuild ran meanwhile */
    if (!(m1 & 1) && at_load_acq(&r->moves) == m1) return -1;
  }
  return -2;
}

static void idx_put(registry *r, uint32_t s, uint64_t h) {
  uint64_t *t = index_of(r), mask = r->tmask;
  uint32_t tag = tag_of(h);
  uint64_t i = tag & mask;
  while (at_load_rlx(&t[i])) i = (i + 1) & mask;
  at_store_rel(&t[i], (uint64_t)tag << 32 | (s + 1));  /* release: the slot before its word */
}

/* Odd before any word moves: the words are stored with release, so a reader that sees a
 * moved word also sees the odd count when it reads `moves` again. */
static void moves_begin(registry *r) { at_add_sc(&r->moves, 1); }

static void moves_end(registry *r) { at_add_sc(&r->moves, 1); }

/* Removes the word of slot s (hash h), shifting the words after it back (no tombstones). */
static void idx_del(registry *r, uint32_t s, uint64_t h) {
  uint64_t *t = index_of(r), mask = r->tmask;
  uint64_t want = (uint64_t)tag_of(h) << 32 | (s + 1);
  uint64_t i = tag_of(h) & mask;
  for (uint64_t n = 0; at_load_rlx(&t[i]) != want; n++, i = (i + 1) & mask)
    if (n > mask || !at_load_rlx(&t[i])) return;
  moves_begin(r);
  for (uint64_t j = i;;) {
    j = (j + 1) & mask;
    uint64_t w = at_load_rlx(&t[j]);
    if (!w) break;
    uint64_t home = (w >> 32) & mask;
    /* w may move to i when its home is not in (i, j] (cyclically) */
    int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays) continue;
    at_store_rel(&t[i], w);
    FAULT("reg-shifting");
    i = j;
  }
  at_store_rel(&t[i], 0);
  moves_end(r);
}

/* ---------------------------------------------------------------- writers */

static void free_push(registry *r, uint32_t s) {
  free_of(r)[r->free_head++ % r->capacity] = s;
}

/* After a writer died holding the lock: the index, the free list and the count, rebuilt
 * from the slots. A slot whose breaker is retired but still odd is finished (freed). */
static void repair(registry *r) {
  if (!(at_load_rlx(&r->moves) & 1)) moves_begin(r);  /* odd already if it died shifting */
  uint64_t *t = index_of(r);
  for (uint64_t i = 0; i <= r->tmask; i++) at_store_rlx(&t[i], 0);
  r->free_head = r->free_tail = 0;
  uint32_t live = 0, top = at_load32_rlx(&r->top);
  for (uint32_t s = 0; s < top; s++) {
    fz_breaker *b = slot_of(r, s);
    uint32_t id = fz_breaker_id(b);
    fzi_finish_marks(b);  /* an eviction killed mid-way names no breaker that lives on */
    if ((id & 1) && fzi_is_removed(b)) fzi_set_id(b, (uint64_t)id + 1), id++;
    if (id & 1) {
      idx_put(r, s, at_load_rlx(&meta_of(r, s)->hash));
      live++;
    } else {
      free_push(r, s);
    }
  }
  at_store32_rel(&r->live, live);
  moves_end(r);
}

static void reg_lock(registry *r) {
  if (pthread_mutex_lock(&r->lock) == EOWNERDEAD) {
    repair(r);
    pthread_mutex_consistent(&r->lock);
  }
}

/* Frees live slot s (under the lock): retired, identity even, out of the index. */
static void drop(registry *r, uint32_t s) {
  fz_breaker *b = slot_of(r, s);
  FAULT("reg-retired");
  fzi_set_id(b, (uint64_t)fz_breaker_id(b) + 1);  /* even: handles are stale from here */
  idx_del(r, s, at_load_rlx(&meta_of(r, s)->hash));
  FAULT("reg-unindexed");
  free_push(r, s);
  at_store32_rel(&r->live, r->live - 1);
}

/* The evictable breaker unused longest among the SCAN slots after the hand (which moves
 * on past them, so successive creations look at the whole registry in turn); -1 when
 * none of them is evictable. Bounded whatever the capacity: the lock is held for SCAN
 * slots at most (DESIGN.md: never the whole registry under the lock). */
static int64_t victim(registry *r) {
  uint32_t top = at_load32_rlx(&r->top), best = 0;
  int64_t best_unused = -1;
  for (uint32_t n = 0; n < top && n < SCAN; n++) {
    uint32_t s = (uint32_t)(r->hand++ % top);
    fz_breaker *b = slot_of(r, s);
    FAULT("reg-scan");  /* tests count the slots a scan looks at */
    if (!(fz_breaker_id(b) & 1)) continue;
    int64_t unused = fzi_unused_ns(b);
    if (unused >= (int64_t)r->idle_ns && unused > best_unused) best = s, best_unused = unused;
  }
  return best_unused < 0 ? -1 : (int64_t)best;
}

/* A slot for a new breaker (under the lock): never used, freed, or evicted; -1 if none. */
static int64_t claim(registry *r) {
  uint32_t top = at_load32_rlx(&r->top);
  if (top < r->capacity) {
    at_store32_rel(&r->top, top + 1);
    return top;
  }
  if (r->free_tail != r->free_head) return free_of(r)[r->free_tail++ % r->capacity];
  /* Scans that found nothing evictable in a whole turn of the hand are not repeated for
   * a tenth of `idle` (at most 0.1 s): a flood of new names into a registry of busy
   * breakers costs no scan each. */
  double now = r->idle_ns ? fz_clock_now() : 0;
  if (now < r->barren_until && now > r->barren_until - 1) return -1;
  for (int tries = 0; r->idle_ns && tries < 4; tries++) {
    int64_t s = victim(r);
    if (s < 0) {
      /* a whole turn of the hand found nothing: not again for a while */
      if ((r->dry += SCAN) >= at_load32_rlx(&r->top)) r->barren_until = now + fmin((double)r->idle_ns / 1e10, 0.1), r->dry = 0;
      return -1;
    }
    r->dry = 0;
    if (!fzi_retire(slot_of(r, (uint32_t)s), 1)) continue;  /* it moved meanwhile */
    FAULT("reg-evicting");
    drop(r, (uint32_t)s);
    at_add_rlx(&r->evictions_total, 1);
    return free_of(r)[r->free_tail++ % r->capacity];
  }
  return -1;
}

/* Creates the breaker (under the lock); *status 1, or FZ_EFULL. */
static fz_breaker *create(registry *r, const uint64_t *key, size_t len,
                          uint64_t h, const fz_config *c, int *status, uint32_t *id) {
  int64_t s = claim(r);
  if (s < 0) {
    *status = FZ_EFULL;
    return NULL;
  }
  FAULT("reg-claimed");
  fz_breaker *b = slot_of(r, (uint32_t)s);
  uint32_t old = fz_breaker_id(b);  /* even: never used (0), or freed; never reset */
  write_meta(r, (uint32_t)s, key, len, h);
  fzi_slot_init(b, c, (const char *)(const void *)meta_of(r, (uint32_t)s)->name, ring_of(r, (uint32_t)s));
  FAULT("reg-initialised");  /* the identity is still `old`: a repair frees the slot */
  fzi_set_id(b, (uint64_t)old + 1);  /* release: publishes the breaker and its meta */
  FAULT("reg-published");
  idx_put(r, (uint32_t)s, h);
  at_store32_rel(&r->live, r->live + 1);
  *status = 1;
  if (id) *id = old + 1;
  return b;
}

/* ---------------------------------------------------------------- the API */

fz_breaker *fz_registry_open_id(const char *name, size_t len, const fz_config *c, int *status,
                                uint32_t *id) {
  registry *r = reg_get();
  uint64_t key[NAME_WORDS], h = 0;
  uint32_t mine = 0;
  int st = 0;
  fz_breaker *b = NULL;
  if (!name_ok(name, len)) st = FZ_ENAME;
  else if (fz_config_check(c) != FZ_OK) st = FZ_EINVAL;
  else if (!r) st = FZ_ENOMEM;
  else h = pack(r, name, len, key);
  for (int tries = 0; st == 0 && !b; tries++) {
    int64_t s = tries ? -2 : idx_find(r, key, len, h, &mine);
    if (s < 0) {
      reg_lock(r);
      if ((s = idx_find(r, key, len, h, &mine)) < 0) b = create(r, key, len, h, c, &st, &mine);
      pthread_mutex_unlock(&r->lock);
    }
    if (s < 0) break;
    b = slot_of(r, (uint32_t)s);
    fz_config have;
    fzi_config_load(b, &have);
    if (fz_breaker_id(b) != mine) b = NULL;  /* removed meanwhile: its options were another's */
    else if (fz_config_diff(&have, c)) st = FZ_EMISMATCH;
  }
  if (id) *id = mine;
  if (status) *status = st;
  return b;
}

fz_breaker *fz_registry_open(const char *name, size_t len, const fz_config *c, int *status) {
  return fz_registry_open_id(name, len, c, status, NULL);
}

fz_breaker *fz_registry_find_id(const char *name, size_t len, uint32_t *id) {
  registry *r = reg_get();
  uint64_t key[NAME_WORDS];
  if (!r || !name_ok(name, len)) return NULL;
  uint64_t h = pack(r, name, len, key);
  int64_t s = idx_find(r, key, len, h, id);
  if (s == -2) {
    reg_lock(r);
    s = idx_find(r, key, len, h, id);
    pthread_mutex_unlock(&r->lock);
  }
  return s < 0 ? NULL : slot_of(r, (uint32_t)s);
}

fz_breaker *fz_registry_find(const char *name, size_t len) {
  return fz_registry_find_id(name, len, NULL);
}

int fz_registry_remove(const char *name, size_t len) {
  registry *r = reg_get();
  uint64_t key[NAME_WORDS], h;
  if (!name_ok(name, len)) return FZ_ENAME;
  if (!r) return 0;
  h = pack(r, name, len, key);
  reg_lock(r);
  int64_t s = idx_find(r, key, len, h, NULL);
  int done = s >= 0 && fzi_retire(slot_of(r, (uint32_t)s), 0);
  if (done) drop(r, (uint32_t)s);
  pthread_mutex_unlock(&r->lock);
  return done;
}

int fz_registry_count(void) {
  registry *r = reg_get();
  return r ? (int)at_load32_acq(&r->top) : 0;
}

int fz_registry_live(void) {
  registry *r = reg_get();
  return r ? (int)at_load32_acq(&r->live) : 0;
}

fz_breaker *fz_registry_at(int i) {
  registry *r = reg_get();
  if (!r || i < 0 || (uint32_t)i >= at_load32_acq(&r->top)) return NULL;
  fz_breaker *b = slot_of(r, (uint32_t)i);
  /* retired (removed or evicted) but not yet freed: a writer killed between the two
   * (reg-retired, reg-evicting) leaves it so until the next writer repairs; it is gone
   * for fuse.list and fuse.metrics as for fz_registry_find */
  return (fz_breaker_id(b) & 1) && !fzi_is_removed(b) ? b : NULL;
}

/* Copies the live breakers of `from` into the empty `to` (a reload): states, counts and
 * identities as they are now. FZ_EFULL when they do not fit. */
static int migrate(registry *from, registry *to) {
  uint32_t top = at_load32_acq(&from->top), n = 0;
  for (uint32_t s = 0; s < top; s++) {
    fz_breaker *b = slot_of(from, s);
    if (!(fz_breaker_id(b) & 1)) continue;
    if (n == to->capacity) return FZ_EFULL;
    fz_breaker *nb = slot_of(to, n);
    fzi_copy(nb, b, ring_of(to, n));  /* word by word, the count window made consistent */
    memcpy(meta_of(to, n), meta_of(from, s), sizeof(meta));
    meta *m = meta_of(to, n);  /* the new mapping has a key of its own: hash again */
    uint64_t words[NAME_WORDS];
    m->hash = pack(to, fz_breaker_name(b), (size_t)m->len, words);
    fzi_set_ring(nb, ring_of(to, n));  /* its permits after the new ring (fzi_copy set the ring) */
    fzi_set_name(nb, (const char *)(const void *)m->name);  /* its name is the new mapping's */
    fzi_permits_copy(nb, b);  /* the permits after the ring, their word made again */
    idx_put(to, n, meta_of(to, n)->hash);
    n++;
  }
  to->top = to->live = n;
  /* totals never go down: the new mapping goes on from the old one's */
  at_store_rel(&to->full_total, at_load_acq(&from->full_total));
  at_store_rel(&to->evictions_total, at_load_acq(&from->evictions_total));
  return FZ_OK;
}

int fz_registry_init(uint32_t capacity, int shared, double idle) {
  if (capacity < 1 || capacity > MAX_CAPACITY || !(idle >= 0 && idle <= 1e9)) return FZ_EINVAL;
  uint64_t idle_ns = (uint64_t)llround(idle * 1e9);
  int rc = FZ_OK;
  pthread_mutex_lock(&g_reg_init);
  registry *r = g_reg;
  int used = r && at_load32_acq(&r->top) > 0;
  if (r && r->shared == (uint32_t)!!shared && r->capacity == capacity && r->idle_ns == idle_ns) {
    rc = FZ_OK;  /* as it is */
  } else if (used && !(r->shared && shared)) {
    rc = FZ_EBUSY;
  } else {
    registry *n = reg_map(capacity, shared, idle_ns);
    if (!n) rc = shared ? FZ_ESHARED : FZ_ENOMEM;
    else if (used) {
      /* a reload: this process (nginx's master) keeps the old mapping for the workers
       * that still run on it; workers forked from now on get the new one */
      reg_lock(r);
      rc = migrate(r, n);
      pthread_mutex_unlock(&r->lock);
    }
    if (n && rc == FZ_OK) {
      if (used) g_prev = r, g_prev_epoch = g_epoch, g_prev_pid = getpid();
      __atomic_store_n(&g_reg, n, __ATOMIC_RELEASE);
    } else if (n) munmap(n, n->size);
    /* an unused old mapping stays mapped: a handle may still point into it */
  }
  pthread_mutex_unlock(&g_reg_init);
  return rc;
}

uint64_t fz_registry_epoch(void) {
  pthread_mutex_lock(&g_reg_init);
  uint64_t e = ++g_epoch;
  g_epoch_pid = getpid();
  pthread_mutex_unlock(&g_reg_init);
  return e;
}

int fz_registry_undo(uint64_t epoch) {
  int done = 0;
  pthread_mutex_lock(&g_reg_init);
  if (epoch == g_epoch && g_epoch_pid == getpid()) {
    done = 1;
    if (g_prev && epoch == g_prev_epoch && g_prev_pid == getpid()) {
      /* the replacing mapping stays mapped: a handle may still point into it */
      __atomic_store_n(&g_reg, g_prev, __ATOMIC_RELEASE);
      g_prev = NULL;
    }
  }
  pthread_mutex_unlock(&g_reg_init);
  return done;
}

int fz_registry_init_shared(uint32_t capacity) {
  if (capacity < 1 || capacity > MAX_CAPACITY) return FZ_EINVAL;
  registry *r = __atomic_load_n(&g_reg, __ATOMIC_ACQUIRE);
  double idle = r && r->shared ? (double)r->idle_ns / 1e9 : 0;
  if (r && r->shared && r->capacity != capacity) return FZ_EBUSY;
  return fz_registry_init(capacity, 1, idle);
}

/* The processes that map one shared registry (nginx's workers, forked from its maker)
 * take the breakers' counter stripes in turn from it, so that the first NSTRIPES count on
 * stripes of their own: a pid-derived stripe put two of 2 workers on one stripe in 1
 * start of 4, and two of 4 in about 9 of 10, and their every success then moved one
 * cache line between their CPUs. Not reg_get: a process with no registry makes none. */
uint32_t fzi_stripe_next(void) {
  registry *r = __atomic_load_n(&g_reg, __ATOMIC_ACQUIRE);  /* pairs with the release in init */
  return r && r->shared ? at_add32_rlx(&r->stripes, 1) : UINT32_MAX;
}

int fz_registry_is_shared(void) {
  registry *r = reg_get();
  return r ? (int)r->shared : 0;
}

uint32_t fz_registry_capacity(void) {
  registry *r = reg_get();
  return r ? r->capacity : 0;
}

double fz_registry_idle(void) {
  registry *r = reg_get();
  return r ? (double)r->idle_ns / 1e9 : 0;
}

void fz_registry_full_add(void) {
  registry *r = reg_get();
  if (r) at_add_rlx(&r->full_total, 1);
}

double fz_registry_full_total(void) {
  registry *r = reg_get();
  return r ? (double)at_load_rlx(&r->full_total) : 0;
}

double fz_registry_evictions_total(void) {
  registry *r = reg_get();
  return r ? (double)at_load_rlx(&r->evictions_total) : 0;
}

int fz_breaker_reconfigure(fz_breaker *b, const fz_config *c) {
  fz_config have;
  if (fz_config_check(c) != FZ_OK) return FZ_EINVAL;
  fz_breaker_config(b, &have);
  /* an anonymous breaker's ring has the size it was made with */
  if (!fz_breaker_id(b) && have.count_window != c->count_window) return FZ_EMISMATCH;
  fzi_reconfigure(b, c);
  return FZ_OK;
}

/* ---------------------------------------------------------------- manual states by identity */

/* The registry mapping whose slots hold b, or NULL: an anonymous breaker, or a slot of a
 * mapping that a reload replaced (nginx's master keeps it for the workers still on it). */
static registry *home_of(const fz_breaker *b) {
  registry *r = __atomic_load_n(&g_reg, __ATOMIC_ACQUIRE);  /* pairs with the release in init */
  if (!r) return NULL;
  uintptr_t lo = (uintptr_t)r + r->off_slots, p = (uintptr_t)b;
  return p >= lo && p - lo < (uintptr_t)r->capacity * r->slot_size ? r : NULL;
}

enum { M_RESET, M_FORCE_OPEN, M_DISABLE, M_FORCE_OPEN_FOR };

/*
 * A manual state through a handle of identity id. Every removal, eviction and reuse of
 * a slot holds the registry's lock, so holding it from the identity check to the end of
 * the act leaves no moment at which the slot can pass to another breaker: the window
 * reset of fz_reset and the stamp of fz_force_open_for land on this breaker or nowhere
 * (a compare-and-swap of the state word alone could not promise that of them). Manual
 * states are rare (an operator, fuse.admin), so the lock costs nothing that matters.
 */
static int manual(fz_breaker *b, uint32_t id, int what, double seconds) {
  if (what == M_FORCE_OPEN_FOR && !(seconds > 0 && seconds <= FZ_MAX_FORCE_OPEN)) return FZ_EINVAL;
  registry *r = id ? home_of(b) : NULL;
  int rc = FZ_ESTALE;
  if (r) reg_lock(r);
  if (fz_breaker_id(b) == id && !fzi_is_removed(b)) {
    FAULT("manual-checked");
    switch (what) {
    case M_RESET: rc = fz_reset(b); break;
    case M_FORCE_OPEN: rc = fz_force_open(b); break;
    case M_DISABLE: rc = fz_disable(b); break;
    default: rc = fz_force_open_for(b, seconds); break;
    }
  }
  if (r) pthread_mutex_unlock(&r->lock);
  return rc;
}

int fz_reset_id(fz_breaker *b, uint32_t id) { return manual(b, id, M_RESET, 0); }
int fz_force_open_id(fz_breaker *b, uint32_t id) { return manual(b, id, M_FORCE_OPEN, 0); }
int fz_disable_id(fz_breaker *b, uint32_t id) { return manual(b, id, M_DISABLE, 0); }

int fz_force_open_for_id(fz_breaker *b, uint32_t id, double seconds) {
  return manual(b, id, M_FORCE_OPEN_FOR, seconds);
}

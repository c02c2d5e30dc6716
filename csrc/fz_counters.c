/*
 * fz_counters.c -- named counters shared by every thread of a process and by every
 * process forked after the library loaded (nginx workers). fuse.upstream counts its
 * panic picks here (fuse_upstream_panic_total{pool="..."}), one counter per pool for
 * all workers, with no lua_shared_dict to declare.
 *
 * A fixed table of FZ_COUNTERS_MAX slots in one MAP_SHARED anonymous mapping, made by a
 * constructor when the library loads: nginx's master loads it in init_by_lua, so every
 * worker inherits the same table (fz_state.c pins the library with RTLD_NODELETE, so a reload
 * keeps it). The table holds no pointers.
 *
 * Slots are found by open addressing on a 64-bit hash of the name. A slot's `state` is
 * 0 (free), READY (its name published) or a claim: who made it and when, pid << 32 |
 * monotonic seconds << 1 (never 0 or READY). One compare-and-swap of state from 0 claims a
 * free slot; the claimer writes the tag (the hash), the name and its length, then
 * publishes them with a release store of READY. An opener that finds a slot claimed
 * waits (bounded) for READY, unless its claimer is dead (kill(pid, 0): ESRCH) or has
 * held it CLAIM_S seconds: then the opener takes the claim over with a compare-and-swap
 * from that very claim, and writes its own name there. So a process killed between its
 * claim and READY leaves nothing that later openers wait on; nothing wedges, no slot
 * is lost. Adds are relaxed atomic adds: a count needs atomicity, not ordering.
 */
#include "fz.h"
#include "fz_atomic.h"
#include "fz_fault.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define LINE 64
#define SPIN_LIMIT 100000
#define READY UINT64_C(1)
#define CLAIM_S 10   /* a claim this old is taken over, its claimer alive or not */

typedef struct {
  uint64_t state;          /* concurrent: 0 free, READY, or a claim (pid << 32 | seconds) */
  uint64_t tag;            /* concurrent: the name's hash, written by the claimer */
  uint64_t value;          /* concurrent: relaxed adds */
  uint64_t len;            /* concurrent: written by the claimer, read after READY */
  char name[FZ_NAME_MAX + 1];
} slot;

_Static_assert(sizeof(slot) % 8 == 0, "slots keep 64-bit alignment");

static slot fallback_table[FZ_COUNTERS_MAX];  /* when mmap fails: this process only */
static slot *table = fallback_table;

/* When the library loads: before nginx's master forks its workers. */
__attribute__((constructor)) static void map_table(void) {
  void *p = mmap(NULL, sizeof(slot) * FZ_COUNTERS_MAX, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p != MAP_FAILED) table = p;
}

static uint64_t hash_name(const char *s, size_t len) {
  uint64_t h = 1469598103934665603ull;  /* FNV-1a */
  for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h ? h : 1;
}

static uint64_t my_claim(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  /* the low bit 0 (never READY), the pid above: never 0 */
  return (uint64_t)(uint32_t)getpid() << 32 | ((uint64_t)ts.tv_sec & 0x7fffffffu) << 1;
}

/* Whether claim c (of another process or thread) can be taken over: its claimer is
 * dead, or has held it CLAIM_S seconds. */
static int abandoned(uint64_t c) {
  pid_t pid = (pid_t)(c >> 32);
  if (pid > 0 && kill(pid, 0) == -1 && errno == ESRCH) return 1;
  return ((uint32_t)my_claim() - (uint32_t)c) >> 1 >= CLAIM_S;
}

/* Waits (bounded) while slot s is claimed; its state then (READY, 0, or still a claim). */
static uint64_t wait_ready(slot *s) {
  uint64_t st = at_load_acq(&s->state);  /* acquire: pairs with the release in publish */
  for (int i = 0; i < SPIN_LIMIT && st != READY && st != 0 && !abandoned(st); i++) {
    FAULT("counter-waiting");
    if (i > 64) sched_yield();
    st = at_load_acq(&s->state);
  }
  return st;
}

static int same_name(slot *s, uint64_t h, const char *name, size_t len) {
  return at_load_rlx(&s->tag) == h && at_load_rlx(&s->len) == len && memcmp(s->name, name, len) == 0;
}

/* Writes the name into slot s, which this caller claims (state c), and publishes it. */
static void publish(slot *s, uint64_t h, const char *name, size_t len) {
  at_store_rlx(&s->tag, h);
  memcpy(s->name, name, len);
  s->name[len] = '\0';
  at_store_rlx(&s->len, len);
  at_store_rel(&s->state, READY);  /* release: publishes tag, name and len; pairs with wait_ready */
}

int fz_counter_open(const char *name, size_t len) {
  if (!name || len == 0 || len > FZ_NAME_MAX || memchr(name, '\0', len)) return FZ_EINVAL;
  uint64_t h = hash_name(name, len);
  for (uint32_t k = 0; k < FZ_COUNTERS_MAX; k++) {
    uint32_t i = (uint32_t)((h + k) % FZ_COUNTERS_MAX);
    slot *s = &table[i];
    for (;;) {
      uint64_t st = wait_ready(s), mine = my_claim();
      if (st == READY) {
        if (same_name(s, h, name, len)) return (int)i;
        break;  /* another name: probe on */
      }
      /* free, or a claim given up: take it (exactly one opener's swap wins) */
      if (st != 0 && !abandoned(st)) break;  /* still being written after the wait: probe on */
      if (at_cas_acqrel(&s->state, &st, mine)) {
        FAULT("counter-claimed");
        publish(s, h, name, len);
        return (int)i;
      }
    }
  }
  return FZ_EFULL;
}

void fz_counter_add(int i, double n) {
  if (i < 0 || i >= FZ_COUNTERS_MAX || !(n >= 1)) return;
  at_add_rlx(&table[i].value, (uint64_t)n);
}

double fz_counter_value(int i) {
  if (i < 0 || i >= FZ_COUNTERS_MAX) return 0;
  return (double)at_load_rlx(&table[i].value);
}

const uint64_t *fz_counter_word(int i) {
  if (i < 0 || i >= FZ_COUNTERS_MAX) return NULL;
  return &table[i].value;
}

const char *fz_counter_name(int i) {
  if (i < 0 || i >= FZ_COUNTERS_MAX) return NULL;
  if (at_load_acq(&table[i].state) != READY) return NULL;  /* acquire: pairs with publish's release */
  return table[i].name;
}

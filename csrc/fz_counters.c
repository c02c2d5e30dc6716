/*
 * fz_counters.c -- named counters shared by every thread of a process and by every
 * process forked after the library loaded (nginx workers). fuse.upstream counts its
 * panic picks here (fuse_upstream_panic_total{pool="..."}), one counter per pool for
 * all workers, with no lua_shared_dict to declare.
 *
 * A fixed table of FZ_COUNTERS_MAX slots in one MAP_SHARED anonymous mapping, made by a
 * constructor when the library loads: nginx's master loads it in init_by_lua, so every
 * worker inherits the same table (fz.c pins the library with RTLD_NODELETE, so a reload
 * keeps it). The table holds no pointers.
 *
 * Slots are found by open addressing on a 64-bit hash of the name. A slot is claimed
 * by one compare-and-swap of its tag (0 -> hash); the claimer then writes the name and
 * publishes it with a release store of `ready`. An opener that finds its hash in a slot
 * waits (bounded) for `ready` and compares names. Adds are relaxed atomic adds: a count
 * needs atomicity, not ordering. A process killed between the claim and `ready` leaves
 * a slot that never becomes ready: after the bounded wait, an opener of that name takes
 * the next free slot (the counter starts again at 0; nothing wedges).
 */
#include "fz.h"
#include "fz_atomic.h"

#include <sched.h>
#include <string.h>
#include <sys/mman.h>

#define LINE 64
#define SPIN_LIMIT 100000

typedef struct {
  uint64_t tag;            /* concurrent: 0 free, else the name's hash (never 0) */
  uint32_t ready;          /* concurrent: 1 once name/len are written (release) */
  uint32_t len;
  uint64_t value;          /* concurrent: relaxed adds */
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

/* Waits (bounded) until a claimed slot's name is published; 1 when it is. */
static int wait_ready(slot *s) {
  for (int i = 0; i < SPIN_LIMIT; i++) {
    if (at_load32_acq(&s->ready)) return 1;  /* acquire: pairs with the release in claim */
    if (i > 64) sched_yield();
  }
  return 0;
}

static int same_name(const slot *s, const char *name, size_t len) {
  return s->len == len && memcmp(s->name, name, len) == 0;
}

static void claim(slot *s, const char *name, size_t len) {
  memcpy(s->name, name, len);
  s->name[len] = '\0';
  s->len = (uint32_t)len;
  at_store32_rel(&s->ready, 1);  /* release: publishes name and len; pairs with wait_ready */
}

int fz_counter_open(const char *name, size_t len) {
  if (!name || len == 0 || len > FZ_NAME_MAX || memchr(name, '\0', len)) return FZ_EINVAL;
  uint64_t h = hash_name(name, len);
  for (uint32_t k = 0; k < FZ_COUNTERS_MAX; k++) {
    uint32_t i = (uint32_t)((h + k) % FZ_COUNTERS_MAX);
    slot *s = &table[i];
    uint64_t tag = at_load_acq(&s->tag);  /* acquire: pairs with the claim's CAS */
    if (tag == 0) {
      uint64_t expected = 0;
      if (at_cas_acqrel(&s->tag, &expected, h)) {  /* exactly one opener claims the slot */
        claim(s, name, len);
        return (int)i;
      }
      tag = expected;
    }
    if (tag == h && wait_ready(s) && same_name(s, name, len)) return (int)i;
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

const char *fz_counter_name(int i) {
  if (i < 0 || i >= FZ_COUNTERS_MAX || !at_load_rlx(&table[i].tag)) return NULL;
  if (!at_load32_acq(&table[i].ready)) return NULL;  /* acquire: pairs with claim's release */
  return table[i].name;
}

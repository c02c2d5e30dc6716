/*
 * registry.c -- the registry's index under threads, and stale handles (prints TAP).
 *
 * Part 1 forces the stale-handle case step by step: a handle whose breaker was removed
 * and whose slot now holds another name neither enters nor counts into it.
 * Part 2: THREADS threads create, find, remove and (with `idle` and a moving manual
 * clock) evict NAMES overlapping names in a registry smaller than the names, for
 * STRESS_ITERS operations each; every admitted call must have entered its own name's
 * breaker. Then, quiet: every live slot's name is found at that slot, no name twice,
 * and once all are removed every slot can be created again (none leaked).
 */
#include "../csrc/fz.h"
#include "tap.h"
#include "harness.h"   /* threads_start/join */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAPACITY 48
#define NAMES 96
#define THREADS 4

static fz_config config_for(int k) {
  fz_config c;
  memset(&c, 0, sizeof c);
  c.window = 1, c.open_for = 1, c.max_open_for = 1, c.probe_timeout = 1, c.backoff = 1;
  c.fails = 100000 + (uint32_t)k;  /* never trips; tells the names' breakers apart */
  c.min_calls = 1, c.probes = 1;
  return c;
}

static void name_of(int k, char *buf) { snprintf(buf, 32, "name-%d", k); }

static long g_iters = 20000;
static uint64_t g_bad, g_admitted, g_stale, g_full, g_removed;  /* atomics */
static uint64_t g_clock_ms;

static void bump(uint64_t *p) { __atomic_fetch_add(p, 1, __ATOMIC_RELAXED); }

typedef struct handle { fz_breaker *b; uint32_t id; int k; } handle;

static void *worker(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 1;
  handle held[8] = { { NULL, 0, 0 } };
  char name[32];
  for (long i = 0; i < g_iters; i++) {
    int k = (int)(rand_r(&seed) % NAMES), op = (int)(rand_r(&seed) % 100);
    handle *h = &held[rand_r(&seed) % 8];
    name_of(k, name);
    if (op < 30) {  /* open: create or find */
      fz_config c = config_for(k);
      int st;
      uint32_t id;
      fz_breaker *b = fz_registry_open_id(name, strlen(name), &c, &st, &id);
      if (!b) { bump(&g_full); continue; }
      if (st < 0 || !(id & 1)) {
        bump(&g_bad);
        diag("open %s: status %d id %u", name, st, id);
      }
      *h = (handle){ b, id, k };
    } else if (op < 35) {
      if (fz_registry_remove(name, strlen(name)) == 1) bump(&g_removed);
    } else if (op < 40) {
      if ((uint64_t)i % 8 == 0) fz_clock_manual((double)__atomic_add_fetch(&g_clock_ms, 100, __ATOMIC_RELAXED) / 1000);
    } else if (h->b) {  /* a call through a held handle, maybe stale */
      double t = fz_enter_id(h->b, h->id);
      if (t == -(1 + FZ_STALE * 4)) { bump(&g_stale); h->b = NULL; continue; }
      if (t > 0) bump(&g_admitted);
      /* it entered its own name's breaker: while the identity holds, the name leads to
       * this very slot and identity (all read atomically; fz_done is left to part 1, as
       * it reads the options of a breaker that a concurrent reuse is rewriting) */
      uint32_t id2 = 0;
      char own[32];
      name_of(h->k, own);
      fz_breaker *b2 = fz_registry_find_id(own, strlen(own), &id2);
      /* (a removal under way has retired the breaker before its identity changes: the
       * name is no longer found then, rightly) */
      int removing = (fz_state(h->b) & 255) == FZ_REMOVED;
      if (fz_breaker_id(h->b) == h->id && !removing && (b2 != h->b || id2 != h->id)) {
        bump(&g_bad);
        diag("handle of %s: the name leads to %p/%u, not %p/%u", own, (void *)b2, id2, (void *)h->b, h->id);
      }
    }
  }
  return NULL;
}

static void stale_handle(void) {
  fz_config cx = config_for(1), cy = config_for(2);
  int st;
  uint32_t idx, idy;
  fz_breaker *x = fz_registry_open_id("stale-x", 7, &cx, &st, &idx);
  ok(x && st == 1 && (idx & 1), "stale: x created with an odd identity");
  double tx = fz_enter_id(x, idx);
  ok(tx > 0, "stale: a call through x's handle is admitted");
  double ax = fz_allow_id(x, idx);
  ok(ax > 0, "stale: an allow through x's handle is admitted");
  is_int(fz_registry_remove("stale-x", 7), 1, "stale: x removed");
  is_int(fz_registry_remove("stale-x", 7), 0, "stale: removing it again says no");
  ok(fz_registry_find("stale-x", 7) == NULL, "stale: x is not found any more");
  /* fill the registry so that y must take x's freed slot */
  char name[32];
  for (int i = fz_registry_live(); i < CAPACITY - 1; i++) {
    snprintf(name, sizeof name, "filler-%d", i);
    fz_breaker *f = fz_registry_open(name, strlen(name), &cx, &st);
    if (!f) break;
  }
  fz_breaker *y = fz_registry_open_id("stale-y", 7, &cy, &st, &idy);
  ok(y == x && st == 1, "stale: y was created in x's slot");
  ok(idy != idx && (idy & 1), "stale: with another identity");
  ok(fz_enter_id(x, idx) == -(1 + FZ_STALE * 4), "stale: x's handle gets FZ_STALE, not a ticket of y");
  /* the slot's later breaker takes its key over: x's tickets are stale there by their
   * generation (0, counted nowhere), not refused as another breaker's */
  is_int(fz_done(x, tx, FZ_FAILURE, -1), 0, "stale: x's ticket reported after y took the slot is stale, not refused");
  is_int(fz_done(x, ax, FZ_FAILURE, -1), 0, "stale: so is x's allow ticket");
  is_int(fz_done(x, ax, FZ_FAILURE, -1), FZ_EREPORTED, "stale: and reported twice it is refused");
  fz_stats s;
  fz_stats_read(y, &s);
  ok(s.failures_total == 0 && s.calls == 0, "stale: x's ticket taken before removal counts nothing in y");
  ok(fz_enter_id(y, idy) > 0, "stale: y's own handle works");
  for (int i = 0; i < CAPACITY; i++) {  /* empty it again for part 2 */
    snprintf(name, sizeof name, "filler-%d", i);
    fz_registry_remove(name, strlen(name));
  }
  fz_registry_remove("stale-y", 7);
  is_int(fz_registry_live(), 0, "stale: all removed");
}

static void quiet_checks(void) {
  int live = 0, dup = 0, lost = 0;
  char seen[NAMES] = { 0 };
  for (int i = 0; i < fz_registry_count(); i++) {
    fz_breaker *b = fz_registry_at(i);
    if (!b) continue;
    live++;
    const char *n = fz_breaker_name(b);
    int k = atoi(n + 5);
    if (k < 0 || k >= NAMES || seen[k]++) dup++;
    if (fz_registry_find(n, strlen(n)) != b) lost++;
  }
  is_int(live, fz_registry_live(), "quiet: the live count is the live slots");
  is_int(dup, 0, "quiet: no name twice");
  is_int(lost, 0, "quiet: every live slot's name is found at that slot");
  for (int k = 0; k < NAMES; k++) {
    char name[32];
    name_of(k, name);
    fz_breaker *b = fz_registry_find(name, strlen(name));
    if (b && strcmp(fz_breaker_name(b), name) != 0) lost++;
    fz_registry_remove(name, strlen(name));
  }
  is_int(lost, 0, "quiet: every name found is its own breaker");
  is_int(fz_registry_live(), 0, "quiet: all removed");
  int made = 0;
  for (int k = 0; k < CAPACITY; k++) {
    char name[32];
    fz_config c = config_for(k);
    int st;
    name_of(k, name);
    made += fz_registry_open(name, strlen(name), &c, &st) != NULL && st == 1;
  }
  is_int(made, CAPACITY, "quiet: every slot can be created again (no slot leaked)");
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *iters = getenv("STRESS_ITERS");
  if (iters) g_iters = atol(iters) / 4 > 1000 ? atol(iters) / 4 : 1000;
  fz_clock_manual(0);
  is_int(fz_registry_init(CAPACITY, 0, 0.5), FZ_OK, "a private registry of 48 slots, idle 0.5 s");
  stale_handle();
  pthread_t th[THREADS];
  threads_start(th, THREADS, worker, 1);
  threads_join(th, THREADS);
  is_int((long long)g_bad, 0, "stress: no admitted call entered another name's breaker, no bad status");
  ok(g_admitted > 0 && g_stale > 0 && g_removed > 0, "stress: calls admitted, handles went stale, names removed");
  ok(fz_registry_evictions_total() > 0, "stress: idle breakers were evicted");
  diag("admitted %llu stale %llu removed %llu full %llu evicted %.0f", (unsigned long long)g_admitted,
       (unsigned long long)g_stale, (unsigned long long)g_removed, (unsigned long long)g_full,
       fz_registry_evictions_total());
  quiet_checks();
  return done_testing();
}

/*
 * fz_window.h -- the breaker's windows: per-thread stripes and the tagged window
 * counters (time windows: buckets and epochs).
 * Included by fz_state.c only: the hot path (fz_enter_id, fz_allow_id, fz_done) is one
 * translation unit, so what it calls here is inlined as it was when this was all fz.c.
 */
#ifndef FZ_WINDOW_H
#define FZ_WINDOW_H

#include "fz_internal.h"

#include <stdlib.h>
#include <unistd.h>

/* ---------------------------------------------------------------- per thread */

static uint32_t g_next_stripe;  /* concurrent */
static TLS uint32_t t_stripe = UINT32_MAX;
static TLS uint64_t t_rng;

static stripe *my_stripe(fz_breaker *b) {
  uint32_t s = t_stripe;
  if (s == UINT32_MAX) {
    /* In turn across the processes of a shared registry (fzi_stripe_next), else across
     * this process's threads (nothing else can reach its breakers' memory). */
    s = fzi_stripe_next();
    if (s == UINT32_MAX) s = at_add32_rlx(&g_next_stripe, 1);
    t_stripe = s = s % NSTRIPES;
  }
  return &b->stripes[s];
}

/* A uniform double in [0, 1) from a per-thread xorshift64*. */
static double rand01(void) {
  if (t_rng == 0) t_rng = ts_ns(CLOCK_MONOTONIC) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&t_rng;
  t_rng ^= t_rng >> 12;
  t_rng ^= t_rng << 25;
  t_rng ^= t_rng >> 27;
  return (double)((t_rng * UINT64_C(2685821657736338717)) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---------------------------------------------------------------- tagged counters */

static uint32_t tag_of(uint64_t w) { return (uint32_t)(w >> 32); }
static uint32_t cnt_of(uint64_t w) { return (uint32_t)w; }

static uint64_t epoch_now(fz_breaker *b);

/*
 * Incarnations. A registry slot passes from breaker to breaker; a call of an earlier
 * breaker there may still be running, and may write at any moment (docs/registry.md,
 * "Incarnations"). Every write a call makes to a breaker's words follows one protocol:
 * read the words the write is computed from (acquire), then check that the identity is
 * still the one the call started with (alive), then write with a compare-and-swap from
 * the value read. A reuse stores every word with release after the identity went even
 * (fzi_slot_init), so a call that read a word of the next breaker fails the check; and
 * a reuse gives every word a value that word never held before (epochs jump ahead,
 * totals jump ahead, generations go on), so a swap prepared before the reuse fails
 * after it. Nothing else writes: no fetch-and-add on a breaker's words.
 */
static inline int alive(const fz_breaker *b, uint32_t id) { return (uint32_t)at_load_acq(&b->id) == id; }

/* Adds n to *w, while the breaker is still the one of identity id. */
static void add_if(fz_breaker *b, uint32_t id, uint64_t *w, uint64_t n) {
  uint64_t v = at_load_acq(w);
  while (alive(b, id) && !at_cas_sc(w, &v, v + n)) {}  /* seq_cst: as the failures' adds */
}

/* Sets *w to v, while the breaker is still the one of identity id. */
static void set_if(fz_breaker *b, uint32_t id, uint64_t *w, uint64_t v) {
  uint64_t cur = at_load_acq(w);
  while (cur != v && alive(b, id) && !at_cas_acqrel(w, &cur, v)) {}
}

/* Whether the clock, read now, is still more than a window behind epoch tag. */
static int clock_went_back(fz_breaker *b, uint32_t tag) {
  return (int32_t)(tag - (uint32_t)epoch_now(b)) > SPAN + 1;
}

/*
 * Adds one to the counter word for bucket epoch e. A word tagged with e or a slightly
 * newer epoch takes the add (a racing thread that read the clock later recycled it: the
 * call lands a bucket late, never lost). A word tagged more than a window AHEAD of e
 * belongs to a newer window than this caller's (it was descheduled between its clock
 * read and this add): the call is older than that window, so it goes to the totals
 * only and the newer counts are left alone (unless the clock now reads behind that word
 * too: a manual clock set back, whose words are recycled as old). Any other word (older,
 * never used, or left from before a jump of the clock) is recycled: the
 * compare-and-swap that retags it captures its count exactly, which moves into *folded.
 * Every write is a compare-and-swap after the identity check (see "Incarnations").
 * Returns the count before the add (0 when it went to the totals only, or nowhere).
 */
static uint32_t tw_add(fz_breaker *b, uint64_t *w, uint64_t *folded, uint64_t e64, uint32_t id) {
  uint32_t e = (uint32_t)e64;
  FAULT("counting");
  uint64_t v = at_load_acq(w);
  for (;;) {
    int32_t ahead = (int32_t)(tag_of(v) - e);
    int back = ahead > SPAN + 1 && clock_went_back(b, tag_of(v));
    if (!alive(b, id)) return 0;  /* after every word the write is computed from */
    if (ahead > SPAN + 1 && !back) {
      add_if(b, id, folded, 1);
      return 0;
    }
    if (back) ahead = -1;  /* a word from before the clock was set back: recycle */
    if (ahead >= 0 && cnt_of(v) >= UINT32_C(0x80000000)) {  /* saturated: totals still exact */
      add_if(b, id, folded, 1);
      return cnt_of(v);
    }
    /* seq_cst: pairs with the seq_cst loads in tw_sum of a concurrent failure, so one
     * of two racing failures sees both (see the design note) */
    if (ahead >= 0) {
      if (at_cas_sc(w, &v, v + 1)) return cnt_of(v);
      continue;
    }
    if (at_cas_sc(w, &v, (uint64_t)e << 32 | 1)) {
      FAULT("folding");
      add_if(b, id, folded, cnt_of(v));
      /* at most once a bucket a word: the coarse stamp of the last call (idle eviction) */
      set_if(b, id, &b->last_use, e64 - at_load_acq(&b->shift));
      return 0;
    }
  }
}

/* Sum of the words whose bucket lies in the window that ends at epoch e. */
static uint32_t tw_sum(const uint64_t *w, uint32_t e) {
  uint64_t sum = 0;
  for (int i = 0; i < NBUCKETS; i++) {
    uint64_t v = at_load_sc(&w[i]);
    int32_t age = (int32_t)(e - tag_of(v));
    if (age >= -2 && age <= SPAN) sum += cnt_of(v);
  }
  return sum > UINT32_MAX ? UINT32_MAX : (uint32_t)sum;
}

static uint64_t tw_all(const uint64_t *w) {
  uint64_t sum = 0;
  for (int i = 0; i < NBUCKETS; i++) sum += cnt_of(at_load_sc(&w[i]));
  return sum;
}

/*
 * Retires every word of `w`: its count moves to *folded and it is retagged just behind
 * the window that ends at epoch e. Called when the epoch has just jumped past a whole
 * window, so every word is stale, even one whose 32-bit tag happens to equal a current
 * epoch (tags keep only 32 bits of the epoch; this pass is what keeps them from
 * aliasing). A call racing with the pass may see its count moved to the totals only.
 */
static void retire(fz_breaker *b, uint32_t id, uint64_t *w, uint64_t *folded, uint64_t e) {
  uint64_t behind = (uint64_t)(uint32_t)(e - SPAN - 2) << 32;
  for (int i = 0; i < NBUCKETS; i++) {
    uint64_t v = at_load_acq(&w[i]);
    while (v != behind && alive(b, id)) {
      if (at_cas_sc(&w[i], &v, behind)) {
        add_if(b, id, folded, cnt_of(v));
        break;
      }
    }
  }
}

/* After the clock jumped past a whole window: one pass over every bucket. */
static void retire_all(fz_breaker *b, uint64_t e, uint32_t id) {
  retire(b, id, b->fails, &b->folded_fail, e);
  retire(b, id, b->slow, &b->folded_slow, e);
  for (int i = 0; i < NSTRIPES; i++) {
    retire(b, id, b->stripes[i].succ, &b->folded_succ, e);
    retire(b, id, b->stripes[i].rej, &b->folded_rej, e);
  }
}

/* Moves the remembered epoch forward to e (the CAS winner retires every bucket when
 * the clock jumped past a whole window). */
static __attribute__((noinline)) void advance_epoch(fz_breaker *b, uint64_t e, uint64_t cur, uint32_t id) {
  while (e > cur && alive(b, id)) {
    if (at_cas_acqrel(&b->cur_epoch, &cur, e)) {
      if (e - cur > SPAN + 1) retire_all(b, e, id);
      break;
    }
  }
}

/* The bucket epoch of time t; remembers the newest one for calls that read no clock.
 * Division by the bucket width is a multiplication by its reciprocal (precomputed):
 * exact to within one bucket at the edges, and the same t always gives the same e. */
static uint64_t epoch_now(fz_breaker *b) {
  return (uint64_t)(((u128)now_ns() * OPT(b, bucket_inv)) >> 64) + at_load_acq(&b->shift);
}

static inline uint64_t epoch_raw(fz_breaker *b, uint64_t t) {
  return (uint64_t)(((u128)t * at_load_acq(&b->bucket_inv)) >> 64) + at_load_acq(&b->shift);
}

static inline uint64_t epoch_at(fz_breaker *b, uint64_t t, uint32_t id) {
  uint64_t e = epoch_raw(b, t);
  uint64_t cur = at_load_acq(&b->cur_epoch);
  if (e > cur) advance_epoch(b, e, cur, id);  /* once a bucket */
  return e;
}

/* Bumps the counter of bucket epoch e in the array w (striped or not). */
static uint32_t bump(fz_breaker *b, uint64_t *w, uint64_t *folded, uint64_t e, uint32_t id) {
  return tw_add(b, &w[e % NBUCKETS], folded, e, id);
}

#endif /* FZ_WINDOW_H */

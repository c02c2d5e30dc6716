/*
 * fz_atomic.h -- named wrappers over the GCC/Clang __atomic builtins.
 *
 * Every wrapper says its memory order in its name; callers say in a comment what an
 * acquire or release pairs with. Everything here is on 64- or 32-bit naturally aligned
 * words, checked lock-free at compile time, so it also works between processes that
 * map the same memory.
 */
#ifndef FZ_ATOMIC_H
#define FZ_ATOMIC_H

#include <stdint.h>

#if !defined(__GCC_ATOMIC_LLONG_LOCK_FREE) || __GCC_ATOMIC_LLONG_LOCK_FREE != 2
#error "fuse needs lock-free 64-bit atomics"
#endif
#if !defined(__GCC_ATOMIC_INT_LOCK_FREE) || __GCC_ATOMIC_INT_LOCK_FREE != 2
#error "fuse needs lock-free 32-bit atomics"
#endif
_Static_assert(sizeof(long long) == sizeof(uint64_t), "long long is the 64-bit word");

static inline uint64_t at_load_rlx(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline uint64_t at_load_acq(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline uint64_t at_load_sc(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static inline void at_store_rlx(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
static inline void at_store_rel(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

/* fetch-and-add, returning the old value */
static inline uint64_t at_add_rlx(uint64_t *p, uint64_t v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline uint64_t at_add_sc(uint64_t *p, uint64_t v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }

/* compare-and-swap; on failure *expected receives the current value */
static inline int at_cas_acqrel(uint64_t *p, uint64_t *expected, uint64_t desired) {
  return __atomic_compare_exchange_n(p, expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
static inline int at_cas_sc(uint64_t *p, uint64_t *expected, uint64_t desired) {
  return __atomic_compare_exchange_n(p, expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

static inline uint32_t at_load32_rlx(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline uint32_t at_load32_acq(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void at_store32_rel(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline uint32_t at_xchg32_acqrel(uint32_t *p, uint32_t v) { return __atomic_exchange_n(p, v, __ATOMIC_ACQ_REL); }
static inline int at_cas32_acqrel(uint32_t *p, uint32_t *expected, uint32_t desired) {
  return __atomic_compare_exchange_n(p, expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
static inline uint32_t at_add32_rlx(uint32_t *p, uint32_t v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline void at_store32_rlx(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }

/* doubles, as whole 64-bit words (the generic builtins) */
_Static_assert(sizeof(double) == sizeof(uint64_t), "a double is one 64-bit word");
static inline double at_loadd_rlx(const double *p) {
  double v;
  __atomic_load(p, &v, __ATOMIC_RELAXED);
  return v;
}

#endif /* FZ_ATOMIC_H */

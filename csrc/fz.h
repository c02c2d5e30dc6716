/*
 * fz.h -- public interface of the fuse circuit-breaker core.
 *
 * The core knows nothing of Lua. Lua reaches it through LuaJIT's FFI (the region
 * between FZ_CDEF_BEGIN and FZ_CDEF_END is turned into lua/fuse/cdef.lua by
 * `make cdef`; keep it plain C declarations: no macros, no attributes) or through
 * the classic module in csrc/fz_lua.c.
 *
 * Every exported symbol starts with fz_. Times cross this interface as seconds in a
 * double; inside a breaker they are nanoseconds of CLOCK_MONOTONIC_COARSE (or of the
 * manual clock that tests install with fz_clock_manual).
 *
 * Thread safety: every function that takes an fz_breaker * may be called from any
 * thread, and from any process that maps a shared registry, at the same time as any
 * other, except fz_breaker_free (the caller must own the last reference).
 */
#ifndef FZ_H
#define FZ_H

#include <stddef.h>
#include <stdint.h>

#define FZ_ABI_VERSION 1

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

/* FZ_CDEF_BEGIN */
enum {
  FZ_CLOSED = 0, FZ_OPEN = 1, FZ_HALF_OPEN = 2, FZ_FORCED_OPEN = 3, FZ_DISABLED = 4,
  FZ_REMOVED = 5, FZ_STALE = 7
};

enum { FZ_SUCCESS = 0, FZ_FAILURE = 1, FZ_IGNORE = 2 };

enum {
  FZ_MAX_PROBES = 16, FZ_MAX_COUNT_WINDOW = 1024, FZ_MAX_FAILS = 1000000,
  FZ_MAX_MIN_CALLS = 1000000, FZ_NAME_MAX = 127
};

enum {
  FZ_OK = 0, FZ_EINVAL = -1, FZ_ENOMEM = -2, FZ_EFULL = -3, FZ_EMISMATCH = -4,
  FZ_ENAME = -5, FZ_EBUSY = -6, FZ_ETICKET = -7, FZ_ESHARED = -8
};

/* Bits of fz_config_diff's result, one per option. */
enum {
  FZ_CFG_WINDOW = 1, FZ_CFG_OPEN_FOR = 2, FZ_CFG_MAX_OPEN_FOR = 4, FZ_CFG_SLOW = 8,
  FZ_CFG_PROBE_TIMEOUT = 16, FZ_CFG_FAILURE_RATE = 32, FZ_CFG_SLOW_RATE = 64,
  FZ_CFG_BACKOFF = 128, FZ_CFG_JITTER = 256, FZ_CFG_FAILS = 512,
  FZ_CFG_COUNT_WINDOW = 1024, FZ_CFG_MIN_CALLS = 2048, FZ_CFG_PROBES = 4096
};

/* The numeric options of a breaker, already validated by the Lua facade.
 * A zero means "rule off" for fails, count_window, slow, failure_rate, slow_rate. */
typedef struct fz_config {
  double window;          /* seconds the time window spans (ignored with count_window) */
  double open_for;        /* seconds the circuit stays open before it admits probes */
  double max_open_for;    /* cap of open_for * backoff^n */
  double slow;            /* seconds: a call that takes at least this long is slow */
  double probe_timeout;   /* seconds after which an unfinished probe counts as failed */
  double failure_rate;    /* 0 < r <= 1, or 0 */
  double slow_rate;       /* 0 < r <= 1, or 0 */
  double backoff;         /* >= 1 */
  double jitter;          /* 0 <= j < 1 */
  uint32_t fails;         /* failures in the window that open the circuit, or 0 */
  uint32_t count_window;  /* the window is the last N calls, or 0 for a time window */
  uint32_t min_calls;     /* calls the window must hold before a rate rule trips */
  uint32_t probes;        /* 1..FZ_MAX_PROBES */
} fz_config;

/* A snapshot of one breaker. Window counts cover the current window only. */
typedef struct fz_stats {
  int32_t state;
  uint32_t calls, failures, slow, rejections;   /* in the window */
  double failure_rate, slow_rate;               /* over the window, 0 when empty */
  double retry_after;                           /* seconds until probes, 0 if not open */
  uint64_t successes_total, failures_total, slow_total, rejections_total, opens_total;
  uint64_t generation;
} fz_stats;

typedef struct fz_breaker fz_breaker;

int fz_abi_version(void);
const char *fz_strerror(int code);

int fz_config_check(const fz_config *c);
uint32_t fz_config_diff(const fz_config *a, const fz_config *b);

fz_breaker *fz_breaker_new(const fz_config *c, int *err);
void fz_breaker_free(fz_breaker *b);
void fz_breaker_config(const fz_breaker *b, fz_config *out);
const char *fz_breaker_name(const fz_breaker *b);

double fz_enter(fz_breaker *b);
double fz_enter_id(fz_breaker *b, uint32_t id);
uint32_t fz_breaker_id(const fz_breaker *b);
int fz_breaker_reconfigure(fz_breaker *b, const fz_config *c);
int fz_done(fz_breaker *b, double ticket, int outcome, double elapsed);

int fz_state(fz_breaker *b);
double fz_retry_after(fz_breaker *b);
int fz_stats_read(fz_breaker *b, fz_stats *out);
void fz_stats_peek(fz_breaker *b, fz_stats *out);
int fz_reset(fz_breaker *b);
int fz_force_open(fz_breaker *b);
int fz_disable(fz_breaker *b);

fz_breaker *fz_registry_open(const char *name, size_t len, const fz_config *c, int *status);
fz_breaker *fz_registry_find(const char *name, size_t len);
fz_breaker *fz_registry_open_id(const char *name, size_t len, const fz_config *c, int *status, uint32_t *id);
fz_breaker *fz_registry_find_id(const char *name, size_t len, uint32_t *id);
int fz_registry_remove(const char *name, size_t len);
int fz_registry_count(void);
int fz_registry_live(void);
fz_breaker *fz_registry_at(int i);
int fz_registry_init(uint32_t capacity, int shared, double idle);
int fz_registry_init_shared(uint32_t capacity);
int fz_registry_is_shared(void);
uint32_t fz_registry_capacity(void);
double fz_registry_idle(void);
void fz_registry_full_add(void);
double fz_registry_full_total(void);
double fz_registry_evictions_total(void);

void fz_clock_manual(double seconds);
void fz_clock_auto(void);
double fz_clock_now(void);

enum { FZ_COUNTERS_MAX = 256 };
int fz_counter_open(const char *name, size_t len);
void fz_counter_add(int i, double n);
double fz_counter_value(int i);
const char *fz_counter_name(int i);
/* FZ_CDEF_END */

#pragma GCC visibility pop

/*
 * Contracts.
 *
 * fz_abi_version: FZ_ABI_VERSION of the built library; the FFI backend refuses a
 *   library whose number differs from the one it was generated for.
 *
 * fz_strerror(code): a static, lowercase message for any FZ_E* code; "unknown error"
 *   for anything else. Never NULL.
 *
 * fz_config_check(c): FZ_OK when every field is inside its documented bound (README,
 *   "Options"), FZ_EINVAL otherwise. NaN and infinities are FZ_EINVAL.
 *
 * fz_config_diff(a, b): the FZ_CFG_* bits of the options whose values differ.
 *
 * fz_breaker_new(c, err): an anonymous breaker (private to this process), closed, with
 *   generation 0. On failure returns NULL and stores FZ_EINVAL or FZ_ENOMEM in *err
 *   (err may be NULL). Free it with fz_breaker_free.
 *
 * fz_breaker_free(b): frees an anonymous breaker; a registry breaker (one returned by
 *   fz_registry_*) is left alone, since the registry lives as long as the process.
 *   NULL is allowed.
 *
 * fz_breaker_config(b, out): copies the breaker's options. fz_breaker_name(b): its
 *   NUL-terminated name, or "" for an anonymous breaker.
 *
 * fz_enter(b): asks to make one call. Lock-free; reads the clock only when the state
 *   is not closed (or a rate rule needs it). Returns a ticket, an exact integer:
 *     > 0  admitted. ticket = generation*128 + slot*8 + kind*2 + flag, where kind is
 *          1 (a call counted in the closed window), 2 (a half-open probe in slot
 *          `slot`) or 3 (disabled: nothing will be counted), and flag is 1 when this
 *          very call made the transition open -> half_open (whatever the state became
 *          afterwards: the ticket of any kind carries it).
 *     < 0  rejected. -ticket - 1 = state*4 + made, where state is the state that
 *          rejected the call (FZ_OPEN, FZ_HALF_OPEN with no free probe slot, or
 *          FZ_FORCED_OPEN) and made is 0, 1 when this call made open -> half_open,
 *          or 2 when it made half_open -> open (a probe past probe_timeout).
 *   The rejection is counted. The ticket must be given to fz_done exactly once.
 *
 * fz_done(b, ticket, outcome, elapsed): records the outcome (FZ_SUCCESS, FZ_FAILURE,
 *   FZ_IGNORE) of an admitted call. elapsed is the call's duration in seconds, or a
 *   negative number when it was not measured (then the call is never slow). An
 *   outcome whose ticket belongs to an earlier generation is ignored. Returns 0, or
 *   the transition this call made as 64 + from*8 + to, or FZ_ETICKET for a ticket
 *   fz_enter cannot have returned.
 *
 * fz_state(b): the state as of now, making any transition that is due by time alone
 *   (open -> half_open, a probe past its timeout -> open). Returns
 *   state + 256 * transition, transition as in fz_done (0 when none was made).
 *
 * fz_retry_after(b): seconds until an open circuit admits probes, 0 in any other state
 *   (or when it is due now). A pure read: makes no transition.
 *
 * fz_stats_read(b, out): fills *out as of now (making due transitions as fz_state
 *   does) and returns the transition code. Window counts are read without a lock:
 *   under concurrent calls they are a recent value, not an atomic snapshot; totals
 *   never go down.
 *
 * fz_stats_peek(b, out): the same snapshot, but a pure read: a transition due by time
 *   alone is reported in out->state as the state it would give (half_open, or open
 *   after a probe timeout) without being made. For observers that own no listener
 *   (metrics), so that every transition is still made, and reported, by a call.
 *
 * fz_reset(b), fz_force_open(b), fz_disable(b): move to closed (fresh window, backoff
 *   reset), forced_open or disabled from any state; each bumps the generation, so
 *   calls in flight are ignored when they finish. Return the transition code (a
 *   reset of a closed breaker is still a transition closed -> closed).
 *
 * fz_registry_open(name, len, c, status): the breaker registered under name (1 to
 *   FZ_NAME_MAX bytes, no NUL), created with options c when missing. *status is 1 when
 *   created, 0 when it existed with equal options, FZ_EMISMATCH when it existed with
 *   other options (the existing breaker is returned; compare with fz_breaker_config),
 *   FZ_EFULL when the registry is full, FZ_ENAME for a bad name, FZ_EINVAL for bad
 *   options, FZ_ENOMEM when the registry could not be mapped; NULL is returned then.
 *   Safe from any thread and process; creation takes the registry's mutex (never the
 *   call path).
 *
 * fz_registry_find(name, len): the registered breaker, or NULL. Lock-free.
 * fz_registry_count(), fz_registry_at(i): the breakers registered so far, in order of
 *   creation, for 0 <= i < count; NULL outside.
 *
 * fz_registry_init_shared(capacity): moves the registry into a MAP_SHARED anonymous
 *   mapping with room for capacity breakers (1..1000000), so that processes forked
 *   afterwards share every named breaker. Call it before fork and before any named
 *   breaker exists: FZ_EBUSY otherwise (or FZ_OK when it is already shared with the
 *   same capacity), FZ_EINVAL for a bad capacity, FZ_ESHARED when mmap fails.
 * fz_registry_is_shared(), fz_registry_capacity(): what it is now.
 *
 * fz_clock_manual(s): from now on every clock read in this process returns s seconds
 *   (tests). fz_clock_auto(): back to the real clock. fz_clock_now(): seconds of
 *   CLOCK_MONOTONIC (precise), or the manual value; for measuring slow calls.
 *
 * Shared counters (csrc/fz_counters.c): FZ_COUNTERS_MAX named counters in one
 * MAP_SHARED mapping made when the library loads, so every process forked afterwards
 * (nginx workers) adds into the same counters. Thread- and process-safe; lock-free.
 * fz_counter_open(name, len): the index (>= 0) of the counter `name` (1 to FZ_NAME_MAX
 *   bytes, no NUL), created at 0 when missing; FZ_EINVAL for a bad name, FZ_EFULL when
 *   every slot is taken. Counters are never removed.
 * fz_counter_add(i, n): adds n (a whole number >= 1) to counter i; a bad i is ignored.
 * fz_counter_value(i): its value (0 for a bad i).
 * fz_counter_name(i): its name, or NULL when slot i holds no counter (0 <= i < MAX).
 */

#ifdef __cplusplus
}
#endif

#endif /* FZ_H */

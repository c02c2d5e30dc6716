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

#define FZ_ABI_VERSION 7  /* 7: fz_registry_epoch, fz_registry_undo (a failed reload) */

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

/* FZ_CDEF_BEGIN */
enum {
  FZ_CLOSED = 0, FZ_OPEN = 1, FZ_HALF_OPEN = 2, FZ_FORCED_OPEN = 3, FZ_DISABLED = 4,
  FZ_REMOVED = 5, FZ_FULL = 6, FZ_STALE = 7
};

enum { FZ_SUCCESS = 0, FZ_FAILURE = 1, FZ_IGNORE = 2 };

enum {
  FZ_MAX_PROBES = 16, FZ_MAX_COUNT_WINDOW = 1024, FZ_MAX_FAILS = 1000000,
  FZ_MAX_MIN_CALLS = 1000000, FZ_NAME_MAX = 127, FZ_MAX_CONCURRENT = 1000000
};

enum {
  FZ_OK = 0, FZ_EINVAL = -1, FZ_ENOMEM = -2, FZ_EFULL = -3, FZ_EMISMATCH = -4,
  FZ_ENAME = -5, FZ_EBUSY = -6, FZ_ETICKET = -7, FZ_ESHARED = -8,
  FZ_EREPORTED = -9, FZ_ESTALE = -10
};

/* Bits of fz_config_diff's result, one per option. */
enum {
  FZ_CFG_WINDOW = 1, FZ_CFG_OPEN_FOR = 2, FZ_CFG_MAX_OPEN_FOR = 4, FZ_CFG_SLOW = 8,
  FZ_CFG_PROBE_TIMEOUT = 16, FZ_CFG_FAILURE_RATE = 32, FZ_CFG_SLOW_RATE = 64,
  FZ_CFG_BACKOFF = 128, FZ_CFG_JITTER = 256, FZ_CFG_FAILS = 512,
  FZ_CFG_COUNT_WINDOW = 1024, FZ_CFG_MIN_CALLS = 2048, FZ_CFG_PROBES = 4096,
  FZ_CFG_MAX_CONCURRENT = 8192
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
  uint32_t max_concurrent; /* permits: calls at once (fz_permit_take), or 0 for no limit */
  uint32_t spare;         /* 0 (fz_config stays whole 64-bit words) */
} fz_config;

/* A snapshot of one breaker. Window counts cover the current window only. */
typedef struct fz_stats {
  int32_t state;
  uint32_t calls, failures, slow, rejections;   /* in the window */
  double failure_rate, slow_rate;               /* over the window, 0 when empty */
  double retry_after;                           /* seconds until probes, 0 if not open */
  uint64_t successes_total, failures_total, slow_total, rejections_total, opens_total;
  uint64_t generation;
  uint64_t full_total;    /* calls rejected for max_concurrent (counted in rejections_total too) */
  uint32_t running;       /* calls holding a permit now */
  uint32_t spare;
} fz_stats;

/* The bounds of one numeric option of fz_config (see fz_config_bound). */
typedef struct fz_bound {
  const char *name;   /* the option's name, as the Lua facade spells it */
  double lo, hi;      /* lo <= v <= hi */
  int32_t lo_open;    /* 1: lo itself is excluded (lo < v) */
  int32_t hi_open;    /* 1: hi itself is excluded (v < hi) */
  int32_t integer;    /* 1: only integral values */
  int32_t zero_off;   /* 1: 0 is valid too, and turns the rule off */
} fz_bound;

typedef struct fz_breaker fz_breaker;

/* Operating it: the bound of a timed forced_open, and the transition events ring. */
enum { FZ_MAX_FORCE_OPEN = 2764800, FZ_EVENTS_CAPACITY = 1024 };

/* One transition of a named breaker, as fz_events_read copies it out. */
typedef struct fz_event {
  double seq;             /* 1, 2, ...: its place in the sequence of every event recorded */
  double time;            /* seconds since the epoch (CLOCK_REALTIME) when recorded */
  int32_t pid;            /* the process that recorded it */
  int32_t from, to;       /* FZ_CLOSED .. FZ_DISABLED */
  char name[FZ_NAME_MAX + 1];
} fz_event;

int fz_abi_version(void);
const char *fz_strerror(int code);

int fz_config_check(const fz_config *c);
const fz_bound *fz_config_bound(int i);
uint32_t fz_config_diff(const fz_config *a, const fz_config *b);

fz_breaker *fz_breaker_new(const fz_config *c, int *err);
void fz_breaker_free(fz_breaker *b);
void fz_breaker_config(const fz_breaker *b, fz_config *out);
const char *fz_breaker_name(const fz_breaker *b);

double fz_enter(fz_breaker *b);
double fz_allow(fz_breaker *b);
double fz_allow_id(fz_breaker *b, uint32_t id);
double fz_enter_id(fz_breaker *b, uint32_t id);
double fz_enter_limit(fz_breaker *b, uint32_t id, int count_full);
uint32_t fz_breaker_id(const fz_breaker *b);
int fz_breaker_reconfigure(fz_breaker *b, const fz_config *c);
int fz_done(fz_breaker *b, double ticket, int outcome, double elapsed);
int fz_done_limit(fz_breaker *b, double ticket, int outcome, double elapsed);

int fz_state(fz_breaker *b);
double fz_retry_after(fz_breaker *b);
int fz_stats_read(fz_breaker *b, fz_stats *out);
void fz_stats_peek(fz_breaker *b, fz_stats *out);
int fz_reset(fz_breaker *b);
int fz_force_open(fz_breaker *b);
int fz_disable(fz_breaker *b);
int fz_force_open_for(fz_breaker *b, double seconds);
int fz_reset_id(fz_breaker *b, uint32_t id);
int fz_force_open_id(fz_breaker *b, uint32_t id);
int fz_disable_id(fz_breaker *b, uint32_t id);
int fz_force_open_for_id(fz_breaker *b, uint32_t id, double seconds);
int fz_late_id(fz_breaker *b, uint32_t id, int outcome, double elapsed);
int fz_permit_take(fz_breaker *b, int count_full);
void fz_permit_give(fz_breaker *b);

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
uint64_t fz_registry_epoch(void);
int fz_registry_undo(uint64_t epoch);
int fz_registry_is_shared(void);
uint32_t fz_registry_capacity(void);
double fz_registry_idle(void);
void fz_registry_full_add(void);
double fz_registry_full_total(void);
double fz_registry_evictions_total(void);

int fz_events_init_shared(void);
double fz_events_add(const char *name, size_t len, int from, int to);
double fz_events_last(void);
int fz_events_read(double seq, fz_event *out);

void fz_clock_manual(double seconds);
void fz_clock_auto(void);
double fz_clock_now(void);

enum { FZ_COUNTERS_MAX = 256 };
int fz_counter_open(const char *name, size_t len);
void fz_counter_add(int i, double n);
double fz_counter_value(int i);
const uint64_t *fz_counter_word(int i);
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
 * fz_config_check(c): FZ_OK when every field is inside its bound (fz_config_bound;
 *   README, "Options") and the rules between fields hold, FZ_EINVAL otherwise. NaN and
 *   infinities are FZ_EINVAL.
 *
 * fz_config_bound(i): the bounds of the i-th field of fz_config (0 <= i < 14, in
 *   declaration order; `spare` has none), or NULL for any other i. One static table, read-only, safe from
 *   any thread: fz_config_check checks against it, and the Lua facade reads it for its
 *   own checks and messages, so that the two never disagree. Beside these bounds,
 *   fz_config_check requires max_open_for >= open_for, at least one trip rule (fails,
 *   failure_rate or slow_rate), and with count_window, fails <= count_window and (with a
 *   rate rule) min_calls <= count_window.
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
 *   is not closed (or a rate rule needs it). Returns a ticket, an exact integer below
 *   2^53:
 *     > 0  admitted. Bits: 0 flag, 1-2 kind, 3-6 slot, 7 zero (set in fz_allow's
 *          tickets), 8-39 the generation (its low 32 bits), 40-52 the breaker's key (a
 *          random number 1..8191 drawn when the breaker is made). kind is 1 (a call
 *          counted in the closed window), 2 (a half-open probe in slot `slot`) or 3
 *          (disabled: nothing will be counted), and flag is 1 when this very call made
 *          the transition open -> half_open (whatever the state became afterwards: the
 *          ticket of any kind carries it). So: odd = made open -> half_open. kind 0
 *          (with the flag) is a probe in slot `slot` whose call lifted a timed
 *          forced_open whose time was up: it made forced_open -> open -> half_open.
 *     < 0  rejected. -ticket - 1 = state*4 + made, where state is the state that
 *          rejected the call (FZ_OPEN, FZ_HALF_OPEN with no free probe slot, or
 *          FZ_FORCED_OPEN) and made is 0, 1 when this call made open -> half_open,
 *          or 2 when it made half_open -> open (a probe past probe_timeout), or 3
 *          when it made forced_open -> open -> half_open (the lift) but found no
 *          probe slot, or the half-open over, before its claim (state FZ_HALF_OPEN).
 *   The rejection is counted. The ticket must be given to fz_done exactly once (for
 *   callers that cannot be sure of that, fz_allow).
 *
 * fz_allow(b): fz_enter, and an admitted ticket is recorded in the calling thread's
 *   ledger (see fz_ticket.h, "ledgers"), so that fz_done refuses it when it is reported a
 *   second time (FZ_EREPORTED) or to another breaker (FZ_ETICKET). Rejections are as
 *   fz_enter's. An admitted ticket has bit 7 set, bits 0-6 as fz_enter's (flag, kind,
 *   slot), bits 8-17 the ledger, 18-29 its entry and 30-52 the entry's use count. A
 *   thread with no free entry among the next 8 of its 4096 (tickets outstanding), or
 *   beyond 1024 threads with tickets at once, gets fz_enter's ticket.

 *   fz_enter makes no identity check: on a breaker removed from the registry
 *   (state FZ_REMOVED) it rejects with state FZ_REMOVED. Handles that may outlive their
 *   breaker use fz_enter_id.
 *
 * fz_enter_id(b, id): fz_enter through a handle that remembers the identity `id` its
 *   breaker had (fz_breaker_id; 0 for an anonymous breaker). When the breaker was
 *   removed or evicted since (the identity differs, or the state is FZ_REMOVED) it
 *   counts nothing and returns the stale code -(1 + FZ_STALE * 4) = -29: the caller looks
 *   its name up again (or re-creates it) and calls again. Otherwise as fz_enter. A
 *   breaker that takes over the slot continues the slot's generation, so a ticket taken
 *   before the removal is stale for fz_done (counts nothing) whatever came next.
 *
 * fz_allow_id(b, id): fz_allow through such a handle: the stale code as fz_enter_id's,
 *   otherwise as fz_allow.
 *
 * fz_breaker_id(b): the breaker's identity: 0 for an anonymous breaker; for a registry
 *   slot odd while a breaker lives there, even once it was removed. Lock-free.
 *
 * fz_breaker_reconfigure(b, c): new numeric options for a live breaker (a reload):
 *   state, counts and totals are kept, the new thresholds apply from the next call; a
 *   changed window starts a fresh window, a changed count_window a fresh count window.
 *   FZ_EINVAL for bad options, FZ_EMISMATCH for an anonymous breaker whose count_window
 *   would change (its ring has the size it was made with). Safe while calls run (in
 *   nginx, the old workers while the master reloads): each option is stored atomically,
 *   and a call in flight may mix old and new options for that one call. Not several
 *   reconfigures at once (the facade calls it in init_by_lua only).
 *
 * fz_done(b, ticket, outcome, elapsed): records the outcome (FZ_SUCCESS, FZ_FAILURE,
 *   FZ_IGNORE) of an admitted call. elapsed is the call's duration in seconds, or a
 *   negative number when it was not measured (then the call is never slow). An
 *   outcome whose ticket belongs to an earlier generation is ignored (a probe taken
 *   back at its timeout, already counted as failed, too). Returns 0, or the transition
 *   this call made as 64 + from*8 + to, or, counting nothing:
 *     FZ_ETICKET    not a ticket b issued: a bad shape or outcome, another breaker's
 *                   key, a generation b is in whose state issues no ticket of that
 *                   kind (kind 1 needs closed, 2 half_open, 3 disabled), or a tracked
 *                   ticket that b's fz_allow did not record;
 *     FZ_EREPORTED  a ticket of fz_allow given to fz_done before;
 *     FZ_ESTALE     a ticket of a closed breaker that an idle eviction retired while the
 *                   call ran (the ticket was current then, or the eviction landed while
 *                   fz_done recorded it): the outcome belongs to the name, not to this
 *                   slot; count it with fz_late_id into the breaker the name has now
 *                   (re-found or re-created). The slot remembers its last 4 evictions: a
 *                   call that outlives more is dropped (0). An eviction killed before its
 *                   swap evicted nothing and marks nothing. After fz_registry_remove such
 *                   a ticket is stale as any other (0): a removal starts afresh.
 *   fz_enter's tickets are checked by key, generation and state only: give each to
 *   fz_done once.
 *
 * fz_state(b): the state as of now, making any transition that is due by time alone
 *   (open -> half_open, a probe past its timeout -> open). Returns
 *   state + 256 * transition, transition as in fz_done (0 when none was made). A timed
 *   forced_open whose time is up may make two: forced_open -> open, then open ->
 *   half_open; transition is then first + 128 * second (a code >= 128 holds two).
 *
 * fz_retry_after(b): seconds until an open circuit admits probes, or until a timed
 *   forced_open ends; 0 in any other state (or when it is due now). A pure read.
 *
 * fz_stats_read(b, out): fills *out as of now (making due transitions as fz_state
 *   does) and returns the transition code (or two, packed as fz_state packs them). Window counts are read without a lock:
 *   under concurrent calls they are a recent value, not an atomic snapshot; totals
 *   never go down. running and full_total are as fz_permit_take
 *   counts them; rejections_total includes full_total.
 *
 * fz_stats_peek(b, out): the same snapshot, but a pure read: a transition due by time
 *   alone is reported in out->state as the state it would give (half_open, or open
 *   after a probe timeout) without being made. For observers that own no listener
 *   (metrics), so that every transition is still made, and reported, by a call.
 *
 * fz_reset(b), fz_force_open(b), fz_disable(b): move to closed (fresh window, backoff
 *   reset), forced_open or disabled from any state; each bumps the generation, so
 *   calls in flight are ignored when they finish. Return the transition code (a
 *   reset of a closed breaker is still a transition closed -> closed). A registry
 *   breaker that a removal or an eviction retired (FZ_REMOVED) is left as it is: 0
 *   (so does fz_force_open_for).
 *
 * fz_reset_id(b, id), fz_force_open_id(b, id), fz_disable_id(b, id),
 * fz_force_open_for_id(b, id, seconds): the same through a handle that remembers the
 *   identity `id` its breaker had (fz_breaker_id; 0 for an anonymous breaker). For a
 *   registry breaker the identity is checked under the registry's lock, which every
 *   removal, eviction and reuse of a slot takes, and the state is changed before the
 *   lock is let go: so the act never lands on a breaker that took the slot over between
 *   the check and the act. When the handle's breaker is gone (identity moved, or
 *   FZ_REMOVED) nothing changes and FZ_ESTALE is returned: the caller looks its name up
 *   again (or re-creates it) and asks again. Otherwise as fz_reset and the others (a
 *   handle into a mapping that a reload replaced, in nginx's master, is checked without
 *   the lock). Not for the call path: they may wait for the registry's lock.
 *
 * fz_late_id(b, id, outcome, elapsed): counts the outcome of a call whose breaker was
 *   evicted while it ran (fz_done answered FZ_ESTALE) into b, the breaker its name has
 *   now, through a handle of identity id: as a call admitted in b's current generation
 *   when b is closed; nothing (0) in any other state, as for a call that began before a
 *   transition. Returns as fz_done, or FZ_ESTALE when this handle went stale too.
 *
 * fz_permit_take(b, count_full): takes one of the breaker's max_concurrent permits (its
 *   options; a reload may change the number): 1 when fewer than that many were held,
 *   else 0: the call is rejected, and with count_full counted in full_total and
 *   rejections_total (a caller that will wait and try again passes 0 until its last
 *   try); the circuit does not move. Give every permit taken back exactly once with fz_permit_give. Lock-free: a
 *   store and a load of the calling thread's lane (claimed at its first take, see
 *   csrc/fz_permits.h) while it keeps a permit from an earlier call; else one
 *   compare-and-swap on the breaker's permit word; at the limit, the spare permits of
 *   other lanes taken with one membarrier(2) system call. Safe from any
 *   thread and process sharing the breaker; a process killed at any instruction leaves
 *   nothing that shrinks the limit for good: when the limit is reached (at most every
 *   0.2 s a breaker) the lanes of dead processes are found (kill(pid, 0) answers ESRCH)
 *   and their permits taken back. With max_concurrent 0 (no limit) it takes a permit
 *   that never fails, so that a reload that drops the limit still balances. A thread
 *   beyond the 40 that may hold lanes of one breaker at once is rejected (0).
 * fz_enter_limit(b, id, count_full): fz_permit_take(b, count_full), then fz_enter_id(b,
 *   id), in one call: a breaker with max_concurrent pays one call into the core to enter
 *   and one (fz_done_limit) to be done. No permit: the full rejection -(1 + FZ_FULL * 4)
 *   = -25 (counted as fz_permit_take counts it; the circuit does not move). A rejection
 *   by the circuit (or the stale code) gives the permit back before it returns, so only
 *   an admitted ticket holds one. A breaker without permits: as fz_enter_id.
 * fz_done_limit(b, ticket, outcome, elapsed): fz_permit_give(b), then fz_done(b, ticket,
 *   outcome, elapsed), in one call; returns as fz_done. For a ticket of fz_enter_limit
 *   on the same handle (a call whose permit is another breaker's gives it back with
 *   fz_permit_give on that one, and reports with fz_done).
 * fz_permit_give(b): gives back a permit fz_permit_take gave, from any thread (a thread
 *   of another process than the taker's: no). Never fails. Lock-free: one store of the
 *   thread's lane (its lane keeps the permit for its next call). Permits survive the
 *   removal, eviction or reuse of a registry slot: a call of the breaker that was there
 *   gives its permit back into the same count, which the slot's next breaker inherits.
 *
 * fz_force_open_for(b, seconds): forced_open for `seconds` (0 < seconds <=
 *   FZ_MAX_FORCE_OPEN, else FZ_EINVAL and nothing changes), then an open circuit whose
 *   period is over, so that probes decide. The end is stamped with the generation of
 *   the forced_open (published before the swap, as an open period's end is), so every
 *   thread and process sharing the breaker sees the same end; the lift is made lazily
 *   by the first caller that reads the state after it (fz_enter, fz_state,
 *   fz_stats_read) as the transitions forced_open -> open -> half_open, in one swap
 *   (the generation moves by 2). An fz_enter that makes them is the first probe, as
 *   the call that ends an open period is: its ticket is kind 0 with the flag (see
 *   fz_enter). Of two timed force-opens racing, one's duration applies. Returns the
 *   transition code, like fz_force_open.
 *
 * fz_events_init_shared(): moves the transition events ring into a MAP_SHARED
 *   anonymous mapping, so that processes forked afterwards (nginx workers) record into
 *   and read one ring. FZ_OK (also when already shared), FZ_ESHARED when mmap fails.
 *   Without it the ring is private to the process (mapped on first use).
 * fz_events_add(name, len, from, to): records a transition; lock-free, safe from any
 *   thread and process. Returns its seq, or 0 when name is bad or no ring could be
 *   mapped. The ring keeps the last FZ_EVENTS_CAPACITY events; older ones are
 *   overwritten.
 * fz_events_last(): the seq of the newest event recorded (0 when none).
 * fz_events_read(seq, out): copies event seq into *out. Returns 1 when copied, 0 when
 *   it is not complete yet (being written, or not recorded yet), -1 when it was
 *   overwritten (lost to the ring), written over by a stalled older writer, or taken
 *   back from a writer that died holding it (or held it 10 s). A copy is validated by
 *   the entry's seq (a seqlock; see csrc/fz_events.c).
 *
 * fz_registry_open(name, len, c, status): the breaker registered under name (1 to
 *   FZ_NAME_MAX bytes, no NUL), created with options c when missing. *status is 1 when
 *   created, 0 when it existed with equal options, FZ_EMISMATCH when it existed with
 *   other options (the existing breaker is returned; compare with fz_breaker_config),
 *   FZ_EFULL when the registry is full, FZ_ENAME for a bad name, FZ_EINVAL for bad
 *   options, FZ_ENOMEM when the registry could not be mapped; NULL is returned then.
 *   Safe from any thread and process. A lookup is lock-free (a hash index); creation
 *   takes the registry's robust mutex to claim a slot (never the call path). When the
 *   registry is full and it has an `idle` (fz_registry_init), creation first evicts a
 *   breaker that is closed, has no failure in its window and saw no call for `idle`
 *   seconds: the one unused longest among the 256 slots after a rotating hand (a bounded
 *   scan, not the whole registry: the least recently used of those, not of all; the
 *   next creation looks at the next 256). None evictable there: FZ_EFULL.
 * fz_registry_open_id(name, len, c, status, id): the same, and the breaker's identity in
 *   *id (id may be NULL): the value to give fz_enter_id.
 *
 * fz_registry_find(name, len): the registered breaker, or NULL. Lock-free.
 * fz_registry_find_id(name, len, id): the same, with its identity in *id.
 * fz_registry_remove(name, len): 1 when a breaker of that name existed and is now gone
 *   (its slot free; handles of it go stale), 0 when there was none, FZ_ENAME for a bad
 *   name. Takes the registry's mutex.
 * fz_registry_count(): the slots handed out so far (live or freed); fz_registry_at(i):
 *   the live breaker in slot i for 0 <= i < count, NULL for a free slot, a removed
 *   breaker whose slot is not freed yet (its remover killed), or outside. A
 *   breaker read through it may be removed meanwhile: compare fz_breaker_id before and
 *   after. fz_registry_live(): the breakers registered now.
 *
 * fz_registry_init_shared(capacity): moves the registry into a MAP_SHARED anonymous
 *   mapping with room for capacity breakers (1..1000000), so that processes forked
 *   afterwards share every named breaker. Call it before fork and before any named
 *   breaker exists: FZ_EBUSY otherwise (or FZ_OK when it is already shared with the
 *   same capacity), FZ_EINVAL for a bad capacity, FZ_ESHARED when mmap fails.
 * fz_registry_is_shared(), fz_registry_capacity(): what it is now.
 *
 * fz_registry_init(capacity, shared, idle): a registry of `capacity` slots (1..1000000),
 *   MAP_SHARED when shared (before fork), evicting breakers unused for `idle` seconds
 *   when full (0: never). Before any named breaker exists it replaces the registry
 *   (FZ_OK). When it already has these settings: FZ_OK. When the registry is shared,
 *   holds breakers and `shared` is asked (a reload in nginx's master): a new mapping with
 *   the new settings receives a copy of every live breaker (state, counts, identities),
 *   and processes forked afterwards use it; FZ_EFULL when they do not fit. Otherwise, with
 *   breakers: FZ_EBUSY. FZ_EINVAL for a bad capacity or idle; FZ_ESHARED / FZ_ENOMEM when
 *   mmap fails. fz_registry_idle(): the idle in seconds (0: none).
 * fz_registry_epoch(): a number for a Lua state that loads the core, larger than any
 *   before it in this process. fz_registry_undo(epoch): for the Lua state `epoch` that
 *   nginx closes, 1 when it is the newest state that loaded the core in this process (and
 *   this is the process that loaded it, not a child forked since): then the reload it ran
 *   failed (a reload that succeeds loads a newer state first), and when its fz_registry_init
 *   replaced a mapping, the replaced mapping (the one the old workers still use) is the
 *   registry again, so that the next reload copies from it (the one it made stays
 *   mapped). Else 0, and nothing changes. Takes the init mutex.
 *
 * fz_registry_full_add(), fz_registry_full_total(): the count of calls that ran
 *   unguarded because their breaker was gone and the registry full (the facade adds, and
 *   fuse.metrics shows, fuse_registry_full_total). fz_registry_evictions_total(): idle
 *   breakers evicted so far. Both in the registry (shared by the workers).
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
 * fz_counter_word(i): the word that holds it (NULL for a bad i), for a reader that loads
 *   it itself (LuaJIT: one load in a trace, no call); aligned, so a plain load is whole.
 * fz_counter_name(i): its name, or NULL when slot i holds no counter (0 <= i < MAX).
 */

#ifdef __cplusplus
}
#endif

#endif /* FZ_H */

-- generated from csrc/fz.h by make cdef: do not edit
-- (edit the FZ_CDEF region of csrc/fz.h, then run `make cdef`)
return {
  abi = 7,
  cdef = [=[
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
]=],
}

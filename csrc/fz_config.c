/*
 * fz_config.c -- errors and options: the error strings, the ABI version and the one
 * table of option bounds with the checks and diffs made against it.
 */
#define FZ_BREAKER_WORDS
#include "fz.h"
#include "fz_errors.h"
#include "fz_internal.h"

#include <math.h>

/* ---------------------------------------------------------------- errors */

const char *fz_strerror(int code) {
#define FZ_ERRCASE(c, msg) case c: return msg;
  switch (code) { FZ_ERRDEF(FZ_ERRCASE) default: return "unknown error"; }
#undef FZ_ERRCASE
}

int fz_abi_version(void) { return FZ_ABI_VERSION; }

/* ---------------------------------------------------------------- config */

/*
 * The one table of option bounds, in fz_config order. fz_config_check checks against
 * it, and the Lua facade reads it (fz_config_bound) for its checks and messages, so a
 * value the facade accepts is never refused here. Fields: name, lo, hi, lo_open,
 * hi_open, integer, zero_off (0 is valid too: the rule is off).
 */
static const fz_bound BOUNDS[] = {
  { "window", 0.01, 86400, 0, 0, 0, 0 },
  { "open_for", 0.001, 86400, 0, 0, 0, 0 },
  { "max_open_for", 0.001, 86400.0 * 32, 0, 0, 0, 0 },
  { "slow", 0, 86400, 1, 0, 0, 1 },
  { "probe_timeout", 0.001, 86400, 0, 0, 0, 0 },
  { "failure_rate", 0, 1, 1, 0, 0, 1 },
  { "slow_rate", 0, 1, 1, 0, 0, 1 },
  { "backoff", 1, 100, 0, 0, 0, 0 },
  { "jitter", 0, 1, 0, 1, 0, 0 },
  { "fails", 1, FZ_MAX_FAILS, 0, 0, 1, 1 },
  { "count_window", 1, FZ_MAX_COUNT_WINDOW, 0, 0, 1, 1 },
  { "min_calls", 1, FZ_MAX_MIN_CALLS, 0, 0, 1, 0 },
  { "probes", 1, FZ_MAX_PROBES, 0, 0, 1, 0 },
  { "max_concurrent", 1, FZ_MAX_CONCURRENT, 0, 0, 1, 1 },
};
enum { NBOUNDS = sizeof BOUNDS / sizeof BOUNDS[0] };

const fz_bound *fz_config_bound(int i) { return i >= 0 && i < NBOUNDS ? &BOUNDS[i] : NULL; }

static int in_bound(const fz_bound *b, double v) {
  if (v == 0 && b->zero_off) return 1;
  if (!isfinite(v) || (b->integer && v != floor(v))) return 0;
  return (b->lo_open ? v > b->lo : v >= b->lo) && (b->hi_open ? v < b->hi : v <= b->hi);
}

int fz_config_check(const fz_config *c) {
  if (!c) return FZ_EINVAL;
  const double v[] = { c->window, c->open_for, c->max_open_for, c->slow, c->probe_timeout,
                       c->failure_rate, c->slow_rate, c->backoff, c->jitter, c->fails,
                       c->count_window, c->min_calls, c->probes, c->max_concurrent };
  _Static_assert(sizeof v / sizeof v[0] == NBOUNDS, "one bound per fz_config field");
  for (int i = 0; i < NBOUNDS; i++)
    if (!in_bound(&BOUNDS[i], v[i])) return FZ_EINVAL;
  /* Rules that tie two options together (the facade checks them first, by name). */
  int ok = c->max_open_for >= c->open_for &&
           (c->fails || c->failure_rate > 0 || c->slow_rate > 0) &&
           (c->count_window == 0 || (c->fails <= c->count_window &&
                                     (c->min_calls <= c->count_window ||
                                      (c->failure_rate == 0 && c->slow_rate == 0))));
  return ok ? FZ_OK : FZ_EINVAL;
}

/* The same tolerance as the facade's options.diff, so that a mismatch always names an
 * option: values that round-trip through a double may differ in their last bits. */
static int differs(double a, double b) { return fabs(a - b) > 1e-9 * fmax(fabs(a), fabs(b)); }

uint32_t fz_config_diff(const fz_config *a, const fz_config *b) {
  uint32_t m = 0;
  m |= differs(a->window, b->window) ? FZ_CFG_WINDOW : 0;
  m |= differs(a->open_for, b->open_for) ? FZ_CFG_OPEN_FOR : 0;
  m |= differs(a->max_open_for, b->max_open_for) ? FZ_CFG_MAX_OPEN_FOR : 0;
  m |= differs(a->slow, b->slow) ? FZ_CFG_SLOW : 0;
  m |= differs(a->probe_timeout, b->probe_timeout) ? FZ_CFG_PROBE_TIMEOUT : 0;
  m |= differs(a->failure_rate, b->failure_rate) ? FZ_CFG_FAILURE_RATE : 0;
  m |= differs(a->slow_rate, b->slow_rate) ? FZ_CFG_SLOW_RATE : 0;
  m |= differs(a->backoff, b->backoff) ? FZ_CFG_BACKOFF : 0;
  m |= differs(a->jitter, b->jitter) ? FZ_CFG_JITTER : 0;
  m |= a->fails != b->fails ? FZ_CFG_FAILS : 0;
  m |= a->count_window != b->count_window ? FZ_CFG_COUNT_WINDOW : 0;
  m |= a->min_calls != b->min_calls ? FZ_CFG_MIN_CALLS : 0;
  m |= a->probes != b->probes ? FZ_CFG_PROBES : 0;
  m |= a->max_concurrent != b->max_concurrent ? FZ_CFG_MAX_CONCURRENT : 0;
  return m;
}

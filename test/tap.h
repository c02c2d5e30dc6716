/*
 * tap.h -- a tiny header-only TAP producer for the C tests.
 *
 *   #include "tap.h"
 *   int main(void) {
 *     plan(3);                              (or no plan: done_testing() prints it)
 *     ok(x > 0, "x is positive");
 *     is_int(fz_state(b), FZ_OPEN, "open after %d failures", n);
 *     is_dbl(rate, 0.5, 1e-9, "failure rate");
 *     diag("seed %u", seed);
 *     return done_testing();
 *   }
 *
 * Every line goes to stdout and is flushed at once, so a test that crashes still
 * leaves every result it reached in the log. A failure prints "not ok N - desc"
 * followed by "#" lines naming file:line and, for is_int/is_dbl, both values.
 * ok, is_int and is_dbl return 1 when the check passed, 0 when it failed.
 * done_testing() returns the exit status: 0 when every check passed and the plan
 * (if any) matched the number of checks, 1 otherwise.
 *
 * The descriptions are printf formats. Not thread-safe: report from one thread.
 */
#ifndef TAP_H
#define TAP_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

struct tap_state {
  int run;       /* checks reported so far */
  int failed;    /* of which failed */
  int planned;   /* the plan, or -1 before plan() */
};

static inline struct tap_state *tap_state(void)
{
  static struct tap_state s = { 0, 0, -1 };
  return &s;
}

static inline void tap_vline(const char *prefix, const char *fmt, va_list ap)
{
  fputs(prefix, stdout);
  vprintf(fmt, ap);
  fputc('\n', stdout);
  fflush(stdout);
}

#if defined(__GNUC__)
#define TAP_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define TAP_PRINTF(f, a)
#endif

/* diag(fmt, ...): a "# " comment line. */
static inline void diag(const char *fmt, ...) TAP_PRINTF(1, 2);
static inline void diag(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  tap_vline("# ", fmt, ap);
  va_end(ap);
}

/* plan(n): announces n checks; call it once, before the first check. */
static inline void plan(int n)
{
  tap_state()->planned = n;
  printf("1..%d\n", n);
  fflush(stdout);
}

/* The result line, and where a failure happened. Returns pass. */
static inline int tap_result(int pass, const char *file, int line,
                             const char *fmt, va_list ap)
{
  struct tap_state *s = tap_state();
  char prefix[48];

  s->run++;
  if (!pass)
    s->failed++;
  snprintf(prefix, sizeof prefix, "%s %d - ", pass ? "ok" : "not ok", s->run);
  tap_vline(prefix, fmt, ap);
  if (!pass)
    diag("  Failed test at %s:%d", file, line);
  return pass;
}

static inline int tap_ok_at(int pass, const char *file, int line,
                            const char *fmt, ...) TAP_PRINTF(4, 5);
static inline int tap_ok_at(int pass, const char *file, int line,
                            const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  pass = tap_result(pass, file, line, fmt, ap);
  va_end(ap);
  return pass;
}

static inline int tap_is_int_at(long long got, long long want, const char *expr,
                                const char *file, int line,
                                const char *fmt, ...) TAP_PRINTF(6, 7);
static inline int tap_is_int_at(long long got, long long want, const char *expr,
                                const char *file, int line,
                                const char *fmt, ...)
{
  va_list ap;
  int pass;

  va_start(ap, fmt);
  pass = tap_result(got == want, file, line, fmt, ap);
  va_end(ap);
  if (!pass) {
    diag("  %s", expr);
    diag("         got: %lld", got);
    diag("    expected: %lld", want);
  }
  return pass;
}

static inline int tap_is_dbl_at(double got, double want, double tol, const char *expr,
                                const char *file, int line,
                                const char *fmt, ...) TAP_PRINTF(7, 8);
static inline int tap_is_dbl_at(double got, double want, double tol, const char *expr,
                                const char *file, int line,
                                const char *fmt, ...)
{
  va_list ap;
  int pass;

  /* NaN equals only NaN; otherwise |got - want| <= tol (so +-inf equal themselves). */
  if (isnan(got) || isnan(want))
    pass = isnan(got) && isnan(want);
  else
    pass = got == want || fabs(got - want) <= tol;
  va_start(ap, fmt);
  pass = tap_result(pass, file, line, fmt, ap);
  va_end(ap);
  if (!pass) {
    diag("  %s", expr);
    diag("         got: %.17g", got);
    diag("    expected: %.17g (tolerance %g)", want, tol);
  }
  return pass;
}

/* done_testing(): prints the plan if plan() was not called; returns the exit status. */
static inline int done_testing(void)
{
  struct tap_state *s = tap_state();

  if (s->planned < 0) {
    plan(s->run);
  } else if (s->planned != s->run) {
    diag("planned %d tests but ran %d", s->planned, s->run);
    return 1;
  }
  if (s->failed)
    diag("failed %d of %d tests", s->failed, s->run);
  return s->failed != 0;
}

/* ok(cond, fmt, ...), is_int(got, want, fmt, ...), is_dbl(got, want, tol, fmt, ...) */
#define ok(cond, ...) tap_ok_at(!!(cond), __FILE__, __LINE__, __VA_ARGS__)
#define is_int(got, want, ...) \
  tap_is_int_at((long long)(got), (long long)(want), #got " == " #want, \
                __FILE__, __LINE__, __VA_ARGS__)
#define is_dbl(got, want, tol, ...) \
  tap_is_dbl_at((double)(got), (double)(want), (double)(tol), #got " ~= " #want, \
                __FILE__, __LINE__, __VA_ARGS__)

#endif /* TAP_H */

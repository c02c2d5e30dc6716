/*
 * fz_clock.c -- the breakers' clock: coarse monotonic time through the vDSO, or the
 * manual clock of tests. The read itself (now_ns) is inline, in fz_internal.h.
 */
#define FZ_BREAKER_WORDS
#include "fz.h"
#include "fz_atomic.h"
#include "fz_internal.h"

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <time.h>

/* ---------------------------------------------------------------- clock */

uint64_t g_manual_on;  /* concurrent: 1 while the manual clock is installed */
uint64_t g_manual_ns;  /* concurrent: MANUAL_ORIGIN + manual seconds in ns */

/* The kernel's vDSO clock_gettime, called directly: about 2 ns less than through glibc's
 * wrapper on every read. Looked up once when the library loads (see pin_library in
 * fz_state.c); glibc's clock_gettime when the vDSO or the symbol is not there. */
clock_fn g_clock = clock_gettime;

void fzi_find_vdso_clock(void) {
  static const char *const names[] = { "__vdso_clock_gettime", "__kernel_clock_gettime" };
  void *vdso = dlopen("linux-vdso.so.1", RTLD_NOW | RTLD_NOLOAD);
  for (unsigned i = 0; vdso && i < sizeof names / sizeof names[0]; i++) {
    void *f = dlsym(vdso, names[i]);
    struct timespec ts;
    if (f && ((clock_fn)(uintptr_t)f)(CLOCK_MONOTONIC_COARSE, &ts) == 0) {
      g_clock = (clock_fn)(uintptr_t)f;
      return;
    }
  }
}

void fz_clock_manual(double seconds) {
  if (!isfinite(seconds) || fabs(seconds) > MANUAL_RANGE) return;  /* the facade checks too */
  at_store_rlx(&g_manual_ns, MANUAL_ORIGIN + (uint64_t)(int64_t)llround(seconds * 1e9));
  at_store_rlx(&g_manual_on, 1);
}

void fz_clock_auto(void) { at_store_rlx(&g_manual_on, 0); }

double fz_clock_now(void) {
  if (at_load_rlx(&g_manual_on))
    return (double)(int64_t)(at_load_rlx(&g_manual_ns) - MANUAL_ORIGIN) / 1e9;
  return (double)ts_ns(CLOCK_MONOTONIC) / 1e9;  /* / 1e9, not * 1e-9: exact when it can be */
}

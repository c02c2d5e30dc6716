/*
 * bench/registry_c.c -- the registry's C core at gateway scale (issue 15).
 *
 *   full        creation at capacity N (default 1,000,000) with nothing evictable: every
 *               breaker holds a failure in its window, idle has passed. Each creation
 *               takes the registry's lock, finds no free slot and scans for a victim (a
 *               bounded scan from a rotating hand), then fails with FZ_EFULL. The time of
 *               one such creation is an upper bound of the time it holds the lock.
 *               Reported: median, 99th percentile and maximum microseconds over 2,000
 *               creations (fewer than one turn of the hand, so every one of them scans;
 *               on a loaded machine the maximum is a preemption, not the scan).
 *   colliding   lookups (fz_registry_find) and creations of 20,000 names made offline to
 *               share one home under the unkeyed hash fuse had at 4a88316 (the hash run
 *               backwards), against 20,000 ordinary names: ns per lookup, us per creation.
 *
 * Time is CLOCK_MONOTONIC. Each figure is the median of 5 rounds (lookups) or of the
 * creations (full). usage: registry_c [capacity for `full` (1000000)]
 * build and run: make bench (build/bench_registry_c, linked with build/libfzcore.a)
 */
#define _POSIX_C_SOURCE 200809L

#include "fz.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static fz_config config(void) {
  fz_config c;
  memset(&c, 0, sizeof c);
  c.window = 10, c.open_for = 10, c.max_open_for = 1000, c.probe_timeout = 5;
  c.backoff = 1, c.fails = 3, c.min_calls = 10, c.probes = 1;
  return c;
}

static void die(const char *what) {
  fprintf(stderr, "registry_c: %s\n", what);
  exit(1);
}

/* ---------------------------------------------------------------- full */

enum { ATTEMPTS = 2000 };

static void full(uint32_t capacity) {
  if (fz_registry_init(capacity, 0, 1) != FZ_OK) die("fz_registry_init failed");
  fz_config c = config();
  char name[32];
  fz_clock_manual(1000);
  double t0 = now_s();
  for (uint32_t i = 0; i < capacity; i++) {
    int st;
    snprintf(name, sizeof name, "busy-%u", i);
    fz_breaker *b = fz_registry_open(name, strlen(name), &c, &st);
    if (!b) die("could not fill the registry");
    fz_done(b, fz_enter(b), FZ_FAILURE, -1);  /* a failure in its window: never evictable */
  }
  double filled = now_s() - t0;
  fz_clock_manual(1005);  /* past idle (1 s), still inside the window (10 s) */
  /* fewer than one turn of the hand (capacity / 256 scans): every one of them scans */
  int attempts = capacity / 256 - 1 < ATTEMPTS ? (int)(capacity / 256) - 1 : ATTEMPTS;
  if (attempts < 1) die("capacity too small for `full` (at least 512)");
  static double us[ATTEMPTS];
  for (int i = 0; i < attempts; i++) {
    int st;
    snprintf(name, sizeof name, "new-%d", i);
    double a = now_s();
    fz_breaker *b = fz_registry_open(name, strlen(name), &c, &st);
    us[i] = (now_s() - a) * 1e6;
    if (b || st != FZ_EFULL) die("a creation in a full registry did not fail with FZ_EFULL");
  }
  qsort(us, (size_t)attempts, sizeof us[0], cmp_dbl);
  printf("full        capacity %u (filled in %.1f s): a creation with nothing evictable %.1f us median, "
         "%.1f us p99, %.1f us max over %d (each holds the lock at most that long)\n",
         capacity, filled, us[attempts / 2], us[attempts * 99 / 100], us[attempts - 1], attempts);
  fz_clock_auto();
}

/* ---------------------------------------------------------------- colliding */

enum { NAMES = 20000, ROUNDS = 5 };
static char g_names[NAMES][9];

static uint64_t inverse(uint64_t a) {
  uint64_t x = a;
  for (int i = 0; i < 6; i++) x *= 2 - a * x;
  return x;
}

/* An 8-byte name whose hash under 4a88316's unkeyed function has home 0x1235 in any index
 * of up to 65536 words (see test/regcore.c, finding 14); 0 when its bytes hold a NUL. */
static uint64_t colliding_name(uint64_t salt) {
  uint64_t h = (uint64_t)0x1235 << 32 | salt << 48 | (salt * UINT64_C(0x2545f4914f6cdd1d) & 0xffffffffu);
  h ^= h >> 29 ^ h >> 58;
  h *= inverse(UINT64_C(0xc4ceb9fe1a85ec53));
  h ^= h >> 32;
  uint64_t w = h * inverse(UINT64_C(0xff51afd7ed558ccd)) ^ UINT64_C(0x9e3779b97f4a7c15) ^ 8;
  for (int i = 0; i < 8; i++)
    if (!(w >> (8 * i) & 0xff)) return 0;
  return w;
}

/* us per creation and ns per lookup of g_names, in a fresh registry of NAMES slots. */
static void measure(const char *label) {
  if (fz_registry_init(NAMES, 0, 0) != FZ_OK) die("fz_registry_init (colliding) failed");
  fz_config c = config();
  double t0 = now_s();
  for (int i = 0; i < NAMES; i++) {
    int st;
    if (!fz_registry_open(g_names[i], 8, &c, &st)) die("could not create a name");
  }
  double create_us = (now_s() - t0) * 1e6 / NAMES;
  double ns[ROUNDS];
  for (int r = 0; r < ROUNDS; r++) {
    double a = now_s();
    uintptr_t sink = 0;
    for (int i = 0; i < NAMES; i++) sink += (uintptr_t)fz_registry_find(g_names[i], 8);
    ns[r] = (now_s() - a) * 1e9 / NAMES;
    if (!sink) die("lookups found nothing");
  }
  qsort(ns, ROUNDS, sizeof ns[0], cmp_dbl);
  printf("colliding   %-44s lookup %7.1f ns, creation %6.2f us\n", label, ns[ROUNDS / 2], create_us);
}

/* Each measure in a process of its own: a registry can be made afresh only before any
 * named breaker exists. */
static void in_child(void (*fn)(const char *), const char *label) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    fn(label);
    fflush(stdout);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status)) die("a measure failed");
}

static void colliding(void) {
  int n = 0;
  for (uint64_t salt = 1; n < NAMES; salt++) {
    uint64_t w = colliding_name(salt);
    if (w) memcpy(g_names[n++], &w, 8);
  }
  in_child(measure, "20,000 names colliding under 4a88316's hash");
  for (int i = 0; i < NAMES; i++) snprintf(g_names[i], sizeof g_names[i], "n%07d", i);
  in_child(measure, "20,000 ordinary names");
}

static void run_full(const char *arg) { full((uint32_t)strtoul(arg, NULL, 10)); }

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  colliding();
  in_child(run_full, argc > 1 ? argv[1] : "1000000");
  return 0;
}

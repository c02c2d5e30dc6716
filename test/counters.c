/*
 * counters.c -- the shared counters of csrc/fz_counters.c (fuse_upstream_panic_total):
 * processes forked after the library loaded add into one counter, exactly; threads
 * that open one name at once all get the same slot; bad names and a full table are
 * refused. Prints TAP.
 */
#include "fz.h"
#include "tap.h"
#include "harness.h"   /* threads_start/join */

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROCS 4
#define ADDS 20000
#define THREADS 4

static int opened[THREADS];

static void *open_same(void *arg) {
  int k = (int)(intptr_t)arg;
  opened[k] = fz_counter_open("threads:same", 12);
  for (int i = 0; i < ADDS; i++) fz_counter_add(opened[k], 1);
  return NULL;
}

int main(void) {
  int c = fz_counter_open("upstream_panic:forked", 21);
  ok(c >= 0, "a counter opens (index %d)", c);
  is_int(fz_counter_open("upstream_panic:forked", 21), c, "the same name gives the same index");
  ok(fz_counter_name(c) && strcmp(fz_counter_name(c), "upstream_panic:forked") == 0,
     "fz_counter_name gives the name back");

  pid_t pids[PROCS];
  for (int p = 0; p < PROCS; p++) {
    if ((pids[p] = fork()) == 0) {
      /* a child opens the name again, as a worker would, and adds */
      int i = fz_counter_open("upstream_panic:forked", 21);
      for (int n = 0; n < ADDS; n++) fz_counter_add(i, 1);
      _exit(i == c ? 0 : 1);
    }
  }
  int good = 1;
  for (int p = 0; p < PROCS; p++) {
    int st = 0;
    waitpid(pids[p], &st, 0);
    good = good && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  ok(good, "%d forked processes found the parent's counter", PROCS);
  is_dbl(fz_counter_value(c), (double)PROCS * ADDS, 0, "their adds all reached the parent (exact)");

  pthread_t t[THREADS];
  threads_start(t, THREADS, open_same, 0);
  threads_join(t, THREADS);
  int same = opened[0] >= 0;
  for (int k = 1; k < THREADS; k++) same = same && opened[k] == opened[0];
  ok(same, "%d threads opening one new name at once got one slot", THREADS);
  is_dbl(fz_counter_value(opened[0]), (double)THREADS * ADDS, 0, "and their adds are exact");

  is_int(fz_counter_open("", 0), FZ_EINVAL, "an empty name is refused");
  is_int(fz_counter_open("a\0b", 3), FZ_EINVAL, "a name with a NUL is refused");
  char big[FZ_NAME_MAX + 2];
  memset(big, 'x', sizeof big);
  is_int(fz_counter_open(big, FZ_NAME_MAX + 1), FZ_EINVAL, "a name over FZ_NAME_MAX is refused");
  int last = 0, n = 2;  /* two taken so far */
  char name[32];
  for (; n < FZ_COUNTERS_MAX; n++) {
    snprintf(name, sizeof name, "fill:%d", n);
    last = fz_counter_open(name, strlen(name));
    if (last < 0) break;
  }
  ok(last >= 0 && n == FZ_COUNTERS_MAX, "the table holds %d counters", FZ_COUNTERS_MAX);
  is_int(fz_counter_open("one:too:many", 12), FZ_EFULL, "one more is FZ_EFULL");
  is_int(fz_counter_open("upstream_panic:forked", 21), c, "a full table still finds its names");
  fz_counter_add(-1, 1);
  fz_counter_add(FZ_COUNTERS_MAX, 1);
  is_dbl(fz_counter_value(-1), 0, 0, "a bad index reads 0 and adds nowhere");
  const uint64_t *w = fz_counter_word(c);
  ok(w != NULL && (double)*w == fz_counter_value(c), "fz_counter_word is the word fz_counter_value reads");
  fz_counter_add(c, 3);
  is_dbl((double)*w, (double)PROCS * ADDS + 3, 0, "and it shows the next add");
  ok(fz_counter_word(-1) == NULL && fz_counter_word(FZ_COUNTERS_MAX) == NULL, "a bad index has no word");
  return done_testing();
}

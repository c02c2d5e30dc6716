/* events_stall.c -- the events ring against a writer stalled between its claim and its
 * last store while the ring wrapped (csrc/fz_events.c, design note): its late stores
 * land in a newer, published entry, which must then read as lost, never as an event
 * with a mixed name. The interleaving is forced: this file includes fz_events.c, so it
 * can make the stalled writer's late store itself. And the ring at its last seqs
 * (SEQ_LIMIT), where a claimed word's lap and pid fill every bit. */
#include "../csrc/fz_events.c"
#include "tap.h"

int main(void) {
  double victim = fz_events_add("stalled", 7, FZ_CLOSED, FZ_OPEN);
  is_dbl(victim, 1, 0, "a fresh ring's first event is seq 1");
  double newer = 0;
  for (int i = 0; i < FZ_EVENTS_CAPACITY; i++) newer = fz_events_add("newer-event", 11, FZ_OPEN, FZ_HALF_OPEN);
  is_dbl(newer, victim + FZ_EVENTS_CAPACITY, 0, "the ring wrapped: the newest event took the stalled one's slot");
  fz_event e;
  is_int(fz_events_read(newer, &e), 1, "before the late store: the newer event reads whole");
  ok(strcmp(e.name, "newer-event") == 0, "its name: %s", e.name);

  /* the stalled writer of `victim` wakes up and stores its first name word */
  entry *slot = &g_ring->e[(uint64_t)newer % FZ_EVENTS_CAPACITY];
  uint64_t word = 0;
  memcpy(&word, "stalled", 7);
  at_store_rel(&slot->name[0], word);

  int rc = fz_events_read(newer, &e);
  is_int(rc, -1, "after the late store: the entry reads as lost (-1), not as an event");
  if (rc == 1) diag("read a mixed name: %s", e.name);
  is_int(fz_events_read(victim, &e), -1, "the stalled writer's own event is lost too");

  /* the last seqs: head moved on to just before SEQ_LIMIT, as 2^50 events would */
  at_store_rel(&g_ring->head, SEQ_LIMIT - 3);
  double last = 0;
  for (int i = 0; i < 2; i++) last = fz_events_add("at-the-end", 10, FZ_CLOSED, FZ_OPEN);
  is_dbl(last, (double)(SEQ_LIMIT - 1), 0, "seq %.0f, the last, is recorded", (double)(SEQ_LIMIT - 1));
  is_int(fz_events_read(last, &e), 1, "and reads whole (its lap uses every bit below the pid)");
  ok(strcmp(e.name, "at-the-end") == 0 && e.pid == getpid(), "its name and pid: %s, %d", e.name, e.pid);
  is_int(fz_events_read(last - 1, &e), 1, "the one before it too");
  is_dbl(fz_events_add("past-it", 7, FZ_CLOSED, FZ_OPEN), 0, 0, "past it nothing is recorded (0)");
  is_dbl(fz_events_last(), last, 0, "and the newest seq stays the last");
  is_int(fz_events_read((double)SEQ_LIMIT, &e), 0, "a seq past it is never recorded (0)");
  return done_testing();
}

/* events_stall.c -- the events ring against a writer stalled between its claim and its
 * last store while the ring wrapped (csrc/fz_events.c, design note): its late stores
 * land in a newer, published entry, which must then read as lost, never as an event
 * with a mixed name. The interleaving is forced: this file includes fz_events.c, so it
 * can make the stalled writer's late store itself. */
#include "../csrc/fz_events.c"
#include "tap.h"

int main(void) {
  double victim = fz_events_add("stalled", 7, FZ_CLOSED, FZ_OPEN);
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
  return done_testing();
}

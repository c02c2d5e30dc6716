/*
 * fz_internal.h -- what the registry (fz_registry.c) needs of a breaker (fz.c).
 * Not exported: every symbol here is hidden (-fvisibility=hidden).
 */
#ifndef FZ_INTERNAL_H
#define FZ_INTERNAL_H

#include "fz.h"

#include <stddef.h>
#include <stdint.h>

size_t fzi_breaker_size(void);  /* bytes of a breaker, a multiple of a cache line */
void fzi_slot_init(fz_breaker *b, const fz_config *c, const char *name, size_t len, uint32_t *ring);
void fzi_config_load(fz_breaker *b, fz_config *out);
void fzi_set_ring(fz_breaker *b, uint32_t *ring);
void fzi_copy(fz_breaker *to, fz_breaker *b, uint32_t *ring);
void fzi_set_id(fz_breaker *b, uint64_t id);
int64_t fzi_unused_ns(fz_breaker *b);
int fzi_retire(fz_breaker *b, int only_closed);
void fzi_finish_marks(fz_breaker *b);
int fzi_is_removed(const fz_breaker *b);
void fzi_reconfigure(fz_breaker *b, const fz_config *c);
void fzi_permits_copy(fz_breaker *to, fz_breaker *from);  /* a copy made by a reload */

/* A registry slot's ring area: the count-window ring (room for FZ_MAX_COUNT_WINDOW),
 * then the breaker's permits (max_concurrent, csrc/fz_permits.h: 704 bytes, touched only
 * by a breaker with the option). */
#define FZ_RING_BYTES ((size_t)FZ_MAX_COUNT_WINDOW * sizeof(uint32_t))
#define FZ_PERMITS_BYTES ((size_t)704)

#endif /* FZ_INTERNAL_H */

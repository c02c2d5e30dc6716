/*
 * permit_words.h -- the permit words of a breaker as one line of text, for a test that
 * saw more calls inside than its limit (test/permits.c, tools/permits_hunt.c): the
 * count taken, the gives seen, and each used lane's owner tid, what it holds (h), the
 * calls it runs (c), M when marked, N when unfenced, P when a take is pending (its pw
 * swap made, its lane word not yet). Read while the threads run: a view of that moment,
 * not an instant. Include after "../csrc/fz_internal.h" (with FZ_BREAKER_WORDS).
 */
#ifndef PERMIT_WORDS_H
#define PERMIT_WORDS_H

#include <stdio.h>

static inline void permit_words(fz_breaker *b, char *line, size_t size) {
  fzp *p = permits_of(b);
  uint64_t pw = at_load_acq(&p->pw), seen = at_load_acq(&p->seen), used = at_load_acq(&p->used);
  int n = snprintf(line, size, "past the limit: taken %llu, seen given %llu, out %llu; lanes:",
                   (unsigned long long)(pw & FZP_COUNT), (unsigned long long)seen,
                   (unsigned long long)((pw - seen) & FZP_COUNT));
  for (int i = 0; i < FZP_LANES && n > 0 && (size_t)n < size; i++) {
    if (!(used >> i & 1)) continue;
    uint64_t st = at_load_acq(&p->lane[i].st), run = at_load_acq(&p->lane[i].run);
    n += snprintf(line + n, size - (size_t)n, " %d[tid %llu] h%d c%lld%s%s%s", i,
                  (unsigned long long)(at_load_acq(&p->lane[i].owner) & ((UINT64_C(1) << 22) - 1)), fzp_held(st),
                  (long long)fzp_calls(run), (st & FZP_RV) ? " M" : "", (st & FZP_NS) ? " N" : "",
                  (pw >> (24 + i) & 1) != (st & 1) ? " P" : "");
  }
}

#endif /* PERMIT_WORDS_H */

/*
 * fz_errors.h -- the one table of error codes and their messages (X-macro).
 * The codes themselves are the FZ_E* enum of fz.h; keep the two in step.
 */
#ifndef FZ_ERRORS_H
#define FZ_ERRORS_H

#define FZ_ERRDEF(_) \
  _(FZ_OK,        "ok") \
  _(FZ_EINVAL,    "invalid option value") \
  _(FZ_ENOMEM,    "out of memory") \
  _(FZ_EFULL,     "breaker registry is full") \
  _(FZ_EMISMATCH, "a breaker with this name exists with other options") \
  _(FZ_ENAME,     "breaker name must be 1 to 127 bytes without NUL") \
  _(FZ_EBUSY,     "the registry can only be made shared before any named breaker exists") \
  _(FZ_ETICKET,   "not a ticket issued by this breaker") \
  _(FZ_ESHARED,   "could not map shared memory for the registry") \
  _(FZ_EREPORTED, "ticket already reported") \
  _(FZ_ESTALE,    "the breaker was removed or evicted: look its name up again")

#endif /* FZ_ERRORS_H */

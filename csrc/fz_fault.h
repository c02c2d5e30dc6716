/*
 * fz_fault.h -- the core's fault points: FAULT("name") marks a step of a protocol. In a
 * build with -DFZ_FAULTS (test/faults.c, test/interleave.c, test/races.c, test/regcore.c)
 * each calls fz_fault_hook, which kills a forked process there (to show that no
 * instruction is a bad place to die) or parks the thread (to force an interleaving).
 * In every other build they are nothing.
 */
#ifndef FZ_FAULT_H
#define FZ_FAULT_H

#ifdef FZ_FAULTS
extern void (*fz_fault_hook)(const char *where);  /* defined in fz_state.c */
#define FAULT(where) do { if (fz_fault_hook) fz_fault_hook(where); } while (0)
#else
#define FAULT(where) ((void)0)
#endif

#endif /* FZ_FAULT_H */

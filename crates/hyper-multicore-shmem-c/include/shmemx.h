/*
 * shmemx.h -- what libhmshmem (hyper_multicore) adds to the OpenSHMEM 1.5 interface.
 * Written for this project; see docs/c-api.md.
 */
#ifndef HMSHMEM_SHMEMX_H
#define HMSHMEM_SHMEMX_H

#include <shmem.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The last failure this PE recorded by a call that reports failure through its result (a null
 * shmem_malloc or shmem_ptr, a 0 from shmem_addr_accessible): one line naming the PE, the call
 * and the cause, or NULL if none. Valid until the next such failure. (Every other failure ends
 * the PE with a message on stderr.) */
const char *shmemx_last_error(void);

/* The runtime's state -- lifecycle, heap usage, live allocations, transport routes -- as one
 * JSON object. Safe to call at any time, also before shmem_init. Valid until the next call. */
const char *shmemx_debug_state(void);

#ifdef __cplusplus
}
#endif

#endif /* HMSHMEM_SHMEMX_H */

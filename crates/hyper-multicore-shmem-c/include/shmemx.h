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

/* One block of shmemx_restart_heap: `current` (a live block as shmem_malloc or a sibling returned
 * it) is replaced by a block of `new_bytes` bytes (positive; the old block's alignment is kept)
 * that holds the first min(old, new) bytes of `current` if `preserve` is non-zero, else zeros.
 * On success `replaced` is the new block's address. */
typedef struct {
    void *current;
    size_t new_bytes;
    int preserve;
    void *replaced;
} shmemx_heap_replacement_t;

/* Collective: restarts the runtime (the lifecycle's restart) with a symmetric heap of `new_size`
 * bytes for shmem_malloc (as SHMEM_SYMMETRIC_SIZE), replacing the `count` blocks of
 * `replacements`. They must name every live block exactly once, in the same order on every PE;
 * afterwards the old addresses are invalid and `replaced` holds the new ones. Global and static
 * variables keep their values and stay symmetric. Completes with every PE's new blocks ready
 * (as after a barrier).
 * Returns 0; or -1 when the runtime refused the restart before changing anything -- a live
 * block left out or named twice, a heap too small for the new blocks, requests that differ
 * across PEs: the same verdict on every PE, the reason in shmemx_last_error(), the old blocks
 * still valid. Any other failure (an address that is not a live block, new_bytes 0, a failure
 * during the restart itself) ends the PE with a message, as every other call does. */
int shmemx_restart_heap(size_t new_size, shmemx_heap_replacement_t *replacements, size_t count);

#ifdef __cplusplus
}
#endif

#endif /* HMSHMEM_SHMEMX_H */

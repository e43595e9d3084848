/* Shared by the C API's test programs: CHECK fails the PE with the condition and line, PASS
 * reports success (the Rust harness counts one PASS line per PE). */
#ifndef HMSHMEM_TEST_CHECK_H
#define HMSHMEM_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "PE %d: %s:%d: check failed: %s\n", shmem_my_pe(), __FILE__,     \
                    __LINE__, #cond);                                                          \
            exit(2);                                                                           \
        }                                                                                      \
    } while (0)

#define PASS(name)                                                                             \
    do {                                                                                       \
        printf("PE %d PASS %s\n", shmem_my_pe(), name);                                        \
        fflush(stdout);                                                                        \
    } while (0)

/* This PE, the number of PEs, and this PE's neighbours in the ring of PEs: set by start(). */
__attribute__((unused)) static int me, n, next, prev;

/* shmem_init, then the ring variables. */
__attribute__((unused)) static void start(void) {
    shmem_init();
    me = shmem_my_pe();
    n = shmem_n_pes();
    next = (me + 1) % n;
    prev = (me + n - 1) % n;
}

#endif

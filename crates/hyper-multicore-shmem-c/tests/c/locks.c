/* Locks under contention: every PE updates a counter on PE 0 non-atomically (get, add, put)
 * inside the lock, many times; the total proves mutual exclusion. test_lock is used as a
 * try-lock in a second phase. */
#include <shmem.h>

#include "check.h"

#define ROUNDS 200

int main(void) {
    start();
    long *lock = shmem_calloc(1, sizeof(long));
    long *counter = shmem_calloc(1, sizeof(long));
    for (int round = 0; round < ROUNDS; round++) {
        shmem_set_lock(lock);
        long value = shmem_long_g(counter, 0);
        shmem_long_p(counter, value + 1, 0);
        shmem_clear_lock(lock);
    }
    shmem_barrier_all();
    CHECK(shmem_long_g(counter, 0) == (long)ROUNDS * n);
    shmem_barrier_all();
    int taken = 0;
    for (int tries = 0; taken < ROUNDS / 4; tries++) {
        if (shmem_test_lock(lock) == 0) {
            long value = shmem_long_g(counter, 0);
            shmem_long_p(counter, value + 1, 0);
            shmem_clear_lock(lock);
            taken++;
        }
    }
    shmem_barrier_all();
    CHECK(shmem_long_g(counter, 0) == (long)(ROUNDS + ROUNDS / 4) * n);
    shmem_barrier_all();
    shmem_free(counter);
    shmem_free(lock);
    PASS("locks");
    shmem_finalize();
    return 0;
}

/* Run under valgrind's memcheck (the harness starts each PE as `valgrind ... under_valgrind`):
 * the heap's RMA, atomics, put-with-signal and its wait, collectives, a lock and a heap restart
 * work without a memory error. valgrind cannot duplicate a shared mapping with mremap, so the
 * executable's data and bss stay private in this job, on every PE alike, and the library says
 * so when a global variable is used as a symmetric address. */
#include <shmem.h>
#include <shmemx.h>
#include <string.h>

#include "check.h"

static long not_symmetric;

int main(void) {
    start();
    CHECK(shmem_addr_accessible(&not_symmetric, me) == 0);
    CHECK(shmemx_last_error() && strstr(shmemx_last_error(), "could not map its data and bss"));

    long *words = shmem_calloc(4, sizeof(long));
    uint64_t *signal = shmem_calloc(1, sizeof(uint64_t));
    long *sum = shmem_malloc(sizeof(long));
    long *lock_word = shmem_calloc(1, sizeof(long));
    int *all = shmem_malloc((size_t)n * sizeof(int));
    int *mine = shmem_malloc((size_t)n * sizeof(int));
    CHECK(words && signal && sum && lock_word && all && mine);
    shmem_barrier_all();

    shmem_long_p(&words[1], me + 10, next);
    shmem_long_atomic_add(&words[0], me + 1, 0);
    long value = 100 + me;
    shmem_long_put_signal(&words[2], &value, 1, signal, 1, SHMEM_SIGNAL_ADD, next);
    shmem_signal_wait_until(signal, SHMEM_CMP_EQ, 1);
    CHECK(words[2] == 100 + prev);
    shmem_barrier_all();
    CHECK(words[1] == prev + 10 && shmem_long_g(&words[1], next) == me + 10);
    if (me == 0) CHECK(words[0] == (long)n * (n + 1) / 2);
    CHECK(shmem_long_atomic_fetch(&words[0], 0) == (long)n * (n + 1) / 2);

    words[3] = me;
    shmem_long_sum_reduce(SHMEM_TEAM_WORLD, sum, &words[3], 1);
    CHECK(*sum == (long)n * (n - 1) / 2);
    for (int pe = 0; pe < n; pe++) mine[pe] = me * 100 + pe;
    shmem_int_alltoall(SHMEM_TEAM_WORLD, all, mine, 1);
    for (int pe = 0; pe < n; pe++) CHECK(all[pe] == pe * 100 + me);

    shmem_set_lock(lock_word);
    shmem_long_atomic_inc(&words[3], 0);
    shmem_clear_lock(lock_word);
    shmem_barrier_all();

    shmem_free(mine);
    shmem_free(all);
    shmem_free(lock_word);
    shmem_free(sum);
    shmem_free(signal);
    shmemx_heap_replacement_t keep = {words, 8 * sizeof(long), 1, NULL};
    CHECK(shmemx_restart_heap(64 << 20, &keep, 1) == 0);
    words = keep.replaced;
    CHECK(words[1] == prev + 10 && words[4] == 0);
    shmem_barrier_all(); /* every PE has looked at its zeros before a peer writes them */
    shmem_long_p(&words[4], me, next);
    shmem_barrier_all();
    CHECK(words[4] == prev);
    shmem_free(words);
    PASS("under_valgrind");
    shmem_finalize();
    return 0;
}

/* Failures end the job fast and name their cause. argv[1] picks one:
 *   global_exit    the last PE calls shmem_global_exit(7) while the others wait in a barrier;
 *   kill           the last PE is killed (SIGKILL) while PE 0 waits in shmem_int_wait_until;
 *   not_symmetric  PE 0 puts to a stack address;
 *   malloc_sizes   every PE asks shmem_malloc for a different size;
 *   active_set     every PE calls shmem_barrier on an active set reaching past the last PE;
 *   restart_block  every PE asks shmemx_restart_heap to replace an address inside a block;
 *   freed          every PE adds to a block atomically, frees it, and adds to it again;
 *   past_end       every PE puts 8 bytes to an 8-byte block, then 16;
 *   bad_pe         every PE puts a long to its own copy, then to PE n;
 *   free_inside    every PE frees an address inside a block instead of its start;
 *   free_private   every PE frees a stack address;
 *   misaligned     every PE adds to an aligned long, then to one 4 bytes into it;
 *   misaligned_wait every PE waits on a long 4 bytes into a block (its bytes already match).
 * Every PE first prints its process id, so the harness can check none is left behind. */
#include <shmem.h>
#include <shmemx.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

int main(int argc, char **argv) {
    CHECK(argc == 2);
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes();
    printf("PID %d\n", (int)getpid());
    fflush(stdout);
    int *flag = shmem_calloc(1, sizeof(int));
    shmem_barrier_all();
    if (strcmp(argv[1], "global_exit") == 0) {
        if (me == n - 1) shmem_global_exit(7);
        shmem_barrier_all();
    } else if (strcmp(argv[1], "kill") == 0) {
        if (me == n - 1 && n > 1) raise(SIGKILL);
        if (me == 0) shmem_int_wait_until(flag, SHMEM_CMP_EQ, 1);
        shmem_barrier_all();
    } else if (strcmp(argv[1], "not_symmetric") == 0) {
        int local[4] = {0};
        if (me == 0) shmem_int_put(local, local, 4, n - 1);
        shmem_barrier_all();
    } else if (strcmp(argv[1], "malloc_sizes") == 0) {
        shmem_malloc((size_t)(me + 1) * 64);
    } else if (strcmp(argv[1], "active_set") == 0) {
        static long pSync[SHMEM_BARRIER_SYNC_SIZE];
        shmem_barrier(0, 1, n, pSync);
    } else if (strcmp(argv[1], "restart_block") == 0) {
        shmemx_heap_replacement_t inside = {(char *)flag + 2, 64, 1, NULL};
        shmemx_restart_heap(1 << 20, &inside, 1);
    } else if (strcmp(argv[1], "freed") == 0) {
        long *block = shmem_calloc(1, sizeof(long));
        shmem_long_atomic_fetch_add(block, 1, me);
        shmem_free(block);
        shmem_long_atomic_fetch_add(block, 1, me);
    } else if (strcmp(argv[1], "past_end") == 0) {
        long *block = shmem_calloc(1, sizeof(long));
        long values[2] = {1, 2};
        shmem_putmem(block, values, sizeof(long), me);
        shmem_putmem(block, values, sizeof values, me);
    } else if (strcmp(argv[1], "bad_pe") == 0) {
        long *block = shmem_calloc(1, sizeof(long));
        shmem_long_p(block, 1, me);
        shmem_long_p(block, 1, n);
    } else if (strcmp(argv[1], "free_inside") == 0) {
        long *block = shmem_calloc(2, sizeof(long));
        shmem_free(block + 1);
    } else if (strcmp(argv[1], "misaligned") == 0) {
        char *block = shmem_calloc(2, sizeof(long));
        shmem_long_atomic_fetch_add((long *)block, 1, me);
        shmem_long_atomic_fetch_add((long *)(block + 4), 1, me);
    } else if (strcmp(argv[1], "misaligned_wait") == 0) {
        char *block = shmem_calloc(2, sizeof(long));
        shmem_long_wait_until((long *)(block + 4), SHMEM_CMP_EQ, 0);
    } else if (strcmp(argv[1], "free_private") == 0) {
        long local[2] = {0};
        shmem_free(local);
    }
    printf("PE %d reached the end, which it must not\n", me);
    return 0;
}

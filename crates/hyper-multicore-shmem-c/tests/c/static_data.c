/* Global and static variables are symmetric: initialised data keeps its values, and bss and
 * data variables are targets (and sources) of put, get, p, g, iput, put_signal, every kind of
 * atomic, wait_until and the locks; shmem_ptr and shmem_addr_accessible see them. */
#include <shmem.h>
#include <string.h>

#include "check.h"

#define LEN 64

static long pSync[SHMEM_BCAST_SYNC_SIZE];   /* bss */
int global_array[LEN];                       /* bss, external */
static double initialised[4] = {1.5, 2.5, 3.5, 4.5}; /* data */
static long counter;
static long lock;
static int flag;
static uint64_t sig;
static unsigned int bits;

int main(void) {
    start();
    CHECK(initialised[0] == 1.5 && initialised[3] == 4.5);
    CHECK(pSync[0] == 0 && global_array[LEN - 1] == 0);
    CHECK(shmem_addr_accessible(global_array, next) && shmem_addr_accessible(&counter, 0));
    /* Null only when the peer's heap is not mapped here (HYPER_MULTICORE_SHMEM_TRANSPORT=ucx). */
    int *peer_array = shmem_ptr(global_array, next);
    shmem_barrier_all(); /* every PE checked its initial values before anyone writes */

    int source[LEN];
    for (int i = 0; i < LEN; i++) source[i] = me * 1000 + i;
    shmem_int_put(global_array, source, LEN, next);
    shmem_barrier_all();
    for (int i = 0; i < LEN; i++) CHECK(global_array[i] == prev * 1000 + i);
    CHECK(peer_array == NULL || peer_array[0] == me * 1000);
    int got[LEN];
    shmem_int_get(got, global_array, LEN, next); /* next holds my values */
    for (int i = 0; i < LEN; i++) CHECK(got[i] == me * 1000 + i);
    shmem_barrier_all();

    /* A static source into a static target; a static into the heap and back. */
    for (int i = 0; i < SHMEM_BCAST_SYNC_SIZE; i++) pSync[i] = SHMEM_SYNC_VALUE;
    shmem_barrier_all();
    shmem_long_put(pSync, pSync, 4, next);
    shmem_double_p(&initialised[1], 10.0 * me, next);
    shmem_barrier_all();
    CHECK(pSync[3] == SHMEM_SYNC_VALUE && initialised[1] == 10.0 * prev);
    CHECK(shmem_double_g(&initialised[2], prev) == 3.5);
    double *heap = shmem_malloc(4 * sizeof(double));
    shmem_double_put(heap, initialised, 4, next);
    shmem_barrier_all();
    CHECK(heap[1] == 10.0 * ((prev + n - 1) % n));
    shmem_int_iput(global_array, source, 2, 1, 8, next);
    shmem_barrier_all();
    CHECK(global_array[14] == prev * 1000 + 7);

    /* Atomics, waits and signals on static words. */
    shmem_long_atomic_add(&counter, 3, 0);
    shmem_long_atomic_fetch_inc(&counter, 0);
    shmem_uint_atomic_or(&bits, 1u << me, 0);
    shmem_barrier_all();
    if (me == 0) CHECK(counter == 4L * n && bits == (1u << n) - 1);
    shmem_int_atomic_set(&flag, me + 1, next);
    shmem_int_wait_until(&flag, SHMEM_CMP_EQ, prev + 1);
    shmem_putmem_signal(global_array, source, sizeof(int), &sig, 1, SHMEM_SIGNAL_ADD, next);
    CHECK(shmem_signal_wait_until(&sig, SHMEM_CMP_GE, 1) == 1);
    CHECK(global_array[0] == prev * 1000);
    shmem_barrier_all();

    /* A static lock guarding a static counter on PE 0. */
    for (int round = 0; round < 50; round++) {
        shmem_set_lock(&lock);
        shmem_long_p(&counter, shmem_long_g(&counter, 0) + 1, 0);
        shmem_clear_lock(&lock);
    }
    shmem_barrier_all();
    CHECK(shmem_long_g(&counter, 0) == 54L * n);
    shmem_barrier_all();
    shmem_free(heap);
    PASS("static_data");
    shmem_finalize();
    /* Still this process's own memory after finalize. */
    global_array[0] = 7;
    CHECK(global_array[0] == 7);
    return 0;
}

/* Legacy collectives over active sets of some PEs: the even PEs and the odd PEs
 * (logPE_stride 1) at the same time, then PEs 1..n-1 (logPE_stride 0) while PE 0 stays out —
 * barrier, broadcast32/64 (PE_root counts in the set; the root's dest is not written),
 * fcollect, collect, alltoall and alltoalls, on static data, one pSync reused by every call.
 * (Reductions over active sets: reductions.c.) */
#include <shmem.h>

#include "check.h"

#define MAX_PES 8

static long pSync[SHMEM_BCAST_SYNC_SIZE];
static long source[2 * MAX_PES], dest[2 * MAX_PES];
static int source32[2 * MAX_PES], dest32[4 * MAX_PES];

/* Every legacy collective over the active set (start, log_stride, size), in which this PE is
 * the t-th. */
static void collectives_on(int start, int log_stride, int size, int t) {
#define SET start, log_stride, size, pSync
    /* broadcast64 from the set's last PE; broadcast32 from its first. */
    for (int i = 0; i < 2; i++) {
        source[i] = 100 * t + i;
        dest[i] = -1;
    }
    shmem_barrier(SET);
    shmem_broadcast64(dest, source, 2, size - 1, SET);
    if (t == size - 1) {
        CHECK(dest[0] == -1 && dest[1] == -1);
    } else {
        CHECK(dest[0] == 100 * (size - 1) && dest[1] == 100 * (size - 1) + 1);
    }
    source32[0] = 7 + t;
    dest32[0] = -1;
    shmem_barrier(SET);
    shmem_broadcast32(dest32, source32, 1, 0, SET);
    CHECK(dest32[0] == (t == 0 ? -1 : 7));
    shmem_barrier(SET);

    /* fcollect: two longs from each PE of the set, in set order. */
    shmem_fcollect64(dest, source, 2, SET);
    for (int k = 0; k < size; k++) CHECK(dest[2 * k] == 100 * k && dest[2 * k + 1] == 100 * k + 1);
    shmem_barrier(SET);

    /* collect: the set's k-th PE contributes k + 1 ints. */
    for (int i = 0; i <= t; i++) source32[i] = 10 * t + i;
    shmem_barrier(SET);
    shmem_collect32(dest32, source32, (size_t)t + 1, SET);
    for (int k = 0, at = 0; k < size; k++)
        for (int i = 0; i <= k; i++, at++) CHECK(dest32[at] == 10 * k + i);
    shmem_barrier(SET);

    /* alltoall: element k to the set's k-th PE. */
    for (int k = 0; k < size; k++) source[k] = 1000 * t + k;
    shmem_barrier(SET);
    shmem_alltoall64(dest, source, 1, SET);
    for (int k = 0; k < size; k++) CHECK(dest[k] == 1000 * k + t);
    shmem_barrier(SET);

    /* alltoalls: one int per PE, 1 apart in the source, 2 apart in the destination. */
    for (int k = 0; k < size; k++) {
        source32[k] = 100 * t + k;
        dest32[2 * k] = dest32[2 * k + 1] = -1;
    }
    shmem_barrier(SET);
    shmem_alltoalls32(dest32, source32, 2, 1, 1, SET);
    for (int k = 0; k < size; k++) CHECK(dest32[2 * k] == 100 * k + t && dest32[2 * k + 1] == -1);
    shmem_barrier(SET);
#undef SET
}

int main(void) {
    start();
    CHECK(n <= MAX_PES);
    for (int i = 0; i < SHMEM_BCAST_SYNC_SIZE; i++) pSync[i] = SHMEM_SYNC_VALUE;
    shmem_barrier_all();

    /* The even PEs and the odd PEs. */
    collectives_on(me % 2, 1, me % 2 == 0 ? (n + 1) / 2 : n / 2, me / 2);
    shmem_barrier_all();

    /* PEs 1..n-1; PE 0 is not in the set and does not call. */
    if (me > 0) collectives_on(1, 0, n - 1, me - 1);
    shmem_barrier_all();

    /* Every PE (the world's own collectives). */
    collectives_on(0, 0, n, me);
    shmem_barrier_all();
    PASS("active_sets");
    shmem_finalize();
    return 0;
}

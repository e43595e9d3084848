/* Collectives over every PE: team queries and sync, broadcast, fcollect, alltoall (mem and
 * typed forms, on heap and on static data), and the legacy active-set forms over every PE
 * with one pSync reused by every call (reductions: reductions.c; active sets of some PEs:
 * active_sets.c). */
#include <shmem.h>
#include <string.h>

#include "check.h"

#define LEN 8
#define MAX_PES 8

static long pSync[SHMEM_REDUCE_SYNC_SIZE];
static int static_source[LEN];
static int static_dest[LEN * MAX_PES];

int main(void) {
    start();
    CHECK(n <= MAX_PES);
    CHECK(shmem_team_my_pe(SHMEM_TEAM_WORLD) == me && shmem_team_n_pes(SHMEM_TEAM_WORLD) == n);
    CHECK(shmem_team_sync(SHMEM_TEAM_WORLD) == 0);
    shmem_sync_all();
    for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; i++) pSync[i] = SHMEM_SYNC_VALUE;
    shmem_barrier_all();

    /* Broadcast: root n-1's values everywhere (the team form writes the root too). */
    long *values = shmem_malloc(LEN * sizeof(long));
    long *copy = shmem_calloc(LEN, sizeof(long));
    for (int i = 0; i < LEN; i++) values[i] = 100 * me + i;
    shmem_barrier_all();
    CHECK(shmem_long_broadcast(SHMEM_TEAM_WORLD, copy, values, LEN, n - 1) == 0);
    for (int i = 0; i < LEN; i++) CHECK(copy[i] == 100 * (n - 1) + i);
    memset(copy, 0, LEN * sizeof(long));
    shmem_barrier_all();
    CHECK(shmem_broadcastmem(SHMEM_TEAM_WORLD, copy, values, 3 * sizeof(long), 0) == 0);
    CHECK(copy[2] == 2 && copy[3] == 0);

    /* fcollect and alltoall, typed and mem, heap and static. */
    long *gathered = shmem_malloc((size_t)n * LEN * sizeof(long));
    CHECK(shmem_long_fcollect(SHMEM_TEAM_WORLD, gathered, values, LEN) == 0);
    for (int pe = 0; pe < n; pe++)
        for (int i = 0; i < LEN; i++) CHECK(gathered[pe * LEN + i] == 100 * pe + i);
    for (int i = 0; i < LEN; i++) static_source[i] = me * 10 + i;
    shmem_barrier_all();
    CHECK(shmem_fcollectmem(SHMEM_TEAM_WORLD, static_dest, static_source, LEN * sizeof(int)) == 0);
    for (int pe = 0; pe < n; pe++) CHECK(static_dest[pe * LEN + 3] == pe * 10 + 3);
    long *sendbuf = shmem_malloc((size_t)n * 2 * sizeof(long));
    long *recvbuf = shmem_malloc((size_t)n * 2 * sizeof(long));
    for (int pe = 0; pe < n; pe++) {
        sendbuf[2 * pe] = me * 1000 + pe;
        sendbuf[2 * pe + 1] = -(me * 1000 + pe);
    }
    shmem_barrier_all();
    CHECK(shmem_long_alltoall(SHMEM_TEAM_WORLD, recvbuf, sendbuf, 2) == 0);
    for (int pe = 0; pe < n; pe++)
        CHECK(recvbuf[2 * pe] == pe * 1000 + me && recvbuf[2 * pe + 1] == -(pe * 1000 + me));
    CHECK(shmem_alltoallmem(SHMEM_TEAM_WORLD, recvbuf, sendbuf, 2 * sizeof(long)) == 0);
    CHECK(recvbuf[0] == me);

    /* collect: PE p contributes p + 1 elements. */
    long *varying = shmem_malloc((size_t)n * sizeof(long)); /* the same size on every PE */
    long *all = shmem_calloc((size_t)(n * (n + 1) / 2), sizeof(long));
    for (int i = 0; i <= me; i++) varying[i] = 100 * me + i;
    shmem_barrier_all();
    CHECK(shmem_long_collect(SHMEM_TEAM_WORLD, all, varying, (size_t)me + 1) == 0);
    for (int pe = 0, at = 0; pe < n; pe++)
        for (int i = 0; i <= pe; i++, at++) CHECK(all[at] == 100 * pe + i);
    CHECK(shmem_collectmem(SHMEM_TEAM_WORLD, all, varying, (size_t)(me + 1) * sizeof(long)) == 0);
    CHECK(all[n * (n + 1) / 2 - 1] == 100 * (n - 1) + n - 1);
    shmem_collect64(all, varying, (size_t)me + 1, 0, 0, n, pSync);
    CHECK(all[0] == 0);

    /* alltoalls: 2 elements per PE, 3 apart in the source, 2 apart in the destination. */
    int *strided_source = shmem_calloc((size_t)n * 2 * 3, sizeof(int));
    int *strided_dest = shmem_calloc((size_t)n * 2 * 2, sizeof(int));
    for (int pe = 0; pe < n; pe++)
        for (int k = 0; k < 2; k++) strided_source[(pe * 2 + k) * 3] = me * 100 + pe * 10 + k + 1;
    shmem_barrier_all();
    CHECK(shmem_int_alltoalls(SHMEM_TEAM_WORLD, strided_dest, strided_source, 2, 3, 2) == 0);
    for (int pe = 0; pe < n; pe++)
        for (int k = 0; k < 2; k++) {
            CHECK(strided_dest[(pe * 2 + k) * 2] == pe * 100 + me * 10 + k + 1);
            CHECK(strided_dest[(pe * 2 + k) * 2 + 1] == 0);
        }
    shmem_barrier_all();
    CHECK(shmem_alltoallsmem(SHMEM_TEAM_WORLD, strided_dest, strided_source, 2, 3, 1) == 0);
    shmem_alltoalls32(strided_dest, strided_source, 2, 3, 2, 0, 0, n, pSync);
    CHECK(strided_dest[2] == me * 10 + 2 || n == 1);

    /* The type-generic forms pick the typed call from the destination's type. */
    for (int i = 0; i < LEN * MAX_PES; i++) static_dest[i] = -1;
    shmem_barrier_all();
    CHECK(shmem_broadcast(SHMEM_TEAM_WORLD, static_dest, static_source, LEN, n - 1) == 0);
    for (int i = 0; i < LEN; i++) CHECK(static_dest[i] == (n - 1) * 10 + i);
    shmem_barrier_all(); /* every PE has read static_dest before the next call writes it */
    CHECK(shmem_fcollect(SHMEM_TEAM_WORLD, static_dest, static_source, 2) == 0);
    for (int pe = 0; pe < n; pe++) CHECK(static_dest[pe * 2 + 1] == pe * 10 + 1);
    CHECK(shmem_collect(SHMEM_TEAM_WORLD, gathered, varying, (size_t)me + 1) == 0);
    CHECK(gathered[n * (n + 1) / 2 - 1] == 100 * (n - 1) + n - 1);
    CHECK(shmem_alltoall(SHMEM_TEAM_WORLD, recvbuf, sendbuf, 2) == 0);
    for (int pe = 0; pe < n; pe++) CHECK(recvbuf[2 * pe + 1] == -(pe * 1000 + me));
    memset(strided_dest, 0, (size_t)n * 2 * 2 * sizeof(int));
    shmem_barrier_all();
    CHECK(shmem_alltoalls(SHMEM_TEAM_WORLD, strided_dest, strided_source, 2, 3, 2) == 0);
    for (int pe = 0; pe < n; pe++) CHECK(strided_dest[(pe * 2 + 1) * 2] == pe * 100 + me * 10 + 2);
    shmem_barrier_all();

    /* Legacy forms, one pSync reused by every call. */
    shmem_barrier(0, 0, n, pSync);
    for (int i = 0; i < LEN; i++) copy[i] = -1;
    shmem_barrier_all();
    shmem_broadcast64(copy, values, LEN, 0, 0, 0, n, pSync);
    for (int i = 0; i < LEN; i++) CHECK(copy[i] == (me == 0 ? -1 : i)); /* root not written */
    shmem_barrier(0, 0, n, pSync);
    shmem_broadcast32(static_dest, static_source, LEN, n - 1, 0, 0, n, pSync);
    if (me != n - 1) CHECK(static_dest[1] == (n - 1) * 10 + 1);
    shmem_barrier(0, 0, n, pSync);
    shmem_fcollect64(gathered, values, LEN, 0, 0, n, pSync);
    CHECK(gathered[(n - 1) * LEN + 1] == 100 * (n - 1) + 1);
    shmem_fcollect32(static_dest, static_source, LEN, 0, 0, n, pSync);
    CHECK(static_dest[(n - 1) * LEN] == (n - 1) * 10);
    shmem_alltoall64(recvbuf, sendbuf, 2, 0, 0, n, pSync);
    CHECK(recvbuf[2 * (n - 1)] == (n - 1) * 1000 + me);
    shmem_alltoall32(static_dest, static_source, 1, 0, 0, n, pSync);
    shmem_barrier_all();
    PASS("collectives");
    shmem_finalize();
    return 0;
}

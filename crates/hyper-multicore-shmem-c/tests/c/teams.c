/* Teams split from the world: split_strided (the even PEs), split_2d (rows of 2), their
 * queries, translate_pe, get_config, team_sync, and broadcast, fcollect, collect, alltoall(s) on
 * a split team (on static data too); contexts on a team; destroy. */
#include <shmem.h>

#include "check.h"

#define MAX_PES 8

static long block[MAX_PES * 2];
static long gathered[MAX_PES * 2];

int main(void) {
    start();
    CHECK(n <= MAX_PES);
    CHECK(shmem_team_translate_pe(SHMEM_TEAM_WORLD, me, SHMEM_TEAM_WORLD) == me);

    /* The even PEs. */
    int evens = (n + 1) / 2;
    shmem_team_t even = SHMEM_TEAM_INVALID;
    CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 2, evens, NULL, 0, &even) == 0);
    if (me % 2 == 1) {
        CHECK(even == SHMEM_TEAM_INVALID);
    } else {
        CHECK(even != SHMEM_TEAM_INVALID);
        CHECK(shmem_team_my_pe(even) == me / 2 && shmem_team_n_pes(even) == evens);
        CHECK(shmem_team_translate_pe(even, evens - 1, SHMEM_TEAM_WORLD) == 2 * (evens - 1));
        CHECK(shmem_team_translate_pe(SHMEM_TEAM_WORLD, 1, even) == -1 || n == 1);
        shmem_team_config_t config = {7};
        CHECK(shmem_team_get_config(even, SHMEM_TEAM_NUM_CONTEXTS, &config) == 0);
        CHECK(shmem_team_sync(even) == 0);
    }
    shmem_barrier_all();

    /* Collectives on the even team (static data: no collective allocation needed); the team
     * syncs before `gathered` is reused, as the standard requires. */
    if (even != SHMEM_TEAM_INVALID) {
        int t = shmem_team_my_pe(even);
        block[0] = 100 * t;
        block[1] = 100 * t + 1;
        CHECK(shmem_team_sync(even) == 0);
        CHECK(shmem_long_broadcast(even, gathered, block, 2, evens - 1) == 0);
        CHECK(gathered[0] == 100 * (evens - 1) && gathered[1] == 100 * (evens - 1) + 1);
        CHECK(shmem_team_sync(even) == 0);
        CHECK(shmem_long_fcollect(even, gathered, block, 2) == 0);
        for (int i = 0; i < evens; i++) CHECK(gathered[2 * i + 1] == 100 * i + 1);
        CHECK(shmem_team_sync(even) == 0);
        CHECK(shmem_long_collect(even, gathered, block, (size_t)(t % 2) + 1) == 0);
        CHECK(gathered[0] == 0 && (evens < 2 || (gathered[1] == 100 && gathered[2] == 101)));
        CHECK(shmem_team_sync(even) == 0);
        for (int i = 0; i < evens; i++) block[i] = 1000 * t + i;
        CHECK(shmem_team_sync(even) == 0);
        CHECK(shmem_long_alltoall(even, gathered, block, 1) == 0);
        for (int i = 0; i < evens; i++) CHECK(gathered[i] == 1000 * i + t);
        CHECK(shmem_team_sync(even) == 0);
        CHECK(shmem_long_alltoalls(even, gathered, block, 1, 1, 1) == 0);
        CHECK(gathered[0] == t);
        shmem_ctx_t ctx;
        CHECK(shmem_team_create_ctx(even, 0, &ctx) == 0);
        shmem_ctx_long_p(ctx, &block[0], -1, me);
        shmem_ctx_destroy(ctx);
        CHECK(block[0] == -1);
        shmem_team_destroy(even);
    }
    shmem_barrier_all();

    /* A grid of rows of 2: the x-team is this PE's row, the y-team its column. */
    shmem_team_t row, column;
    CHECK(shmem_team_split_2d(SHMEM_TEAM_WORLD, 2, NULL, 0, &row, NULL, 0, &column) == 0);
    CHECK(shmem_team_my_pe(row) == me % 2 && shmem_team_my_pe(column) == me / 2);
    CHECK(shmem_team_n_pes(row) == (me / 2 * 2 + 1 < n ? 2 : 1));
    CHECK(shmem_team_n_pes(column) == (n - me % 2 + 1) / 2);
    block[0] = me;
    CHECK(shmem_team_sync(column) == 0);
    CHECK(shmem_long_fcollect(column, gathered, block, 1) == 0);
    for (int i = 0; i < shmem_team_n_pes(column); i++) CHECK(gathered[i] == 2 * i + me % 2);
    shmem_team_destroy(row);
    shmem_team_destroy(column);
    shmem_barrier_all();
    PASS("teams");
    shmem_finalize();
    return 0;
}

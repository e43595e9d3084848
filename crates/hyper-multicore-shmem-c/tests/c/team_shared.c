/* SHMEM_TEAM_SHARED: the PEs whose memory this PE can address directly (shmem_ptr). Run with
 * "all" (every PE on one host, sharing one segment) or "alone" (every pair through UCX, as
 * between hosts: each PE is a team of one). Checks the team's size and numbering, that
 * shmem_ptr reaches exactly its members, and a sync and a sum reduction on it. */
#include <shmem.h>
#include <string.h>

#include "check.h"

static long word;
static long source;
static long total;

int main(int argc, char **argv) {
    start();
    CHECK(argc == 2 && (strcmp(argv[1], "all") == 0 || strcmp(argv[1], "alone") == 0));
    int alone = strcmp(argv[1], "alone") == 0;
    int size = shmem_team_n_pes(SHMEM_TEAM_SHARED);
    int mine = shmem_team_my_pe(SHMEM_TEAM_SHARED);
    CHECK(size == (alone ? 1 : n));
    CHECK(mine == (alone ? 0 : me));
    CHECK(shmem_team_translate_pe(SHMEM_TEAM_SHARED, mine, SHMEM_TEAM_WORLD) == me);

    /* shmem_ptr reaches every member and nobody else. */
    long expected = 0;
    for (int pe = 0; pe < n; pe++) {
        int member = shmem_team_translate_pe(SHMEM_TEAM_WORLD, pe, SHMEM_TEAM_SHARED);
        CHECK((shmem_ptr(&word, pe) != NULL) == (member >= 0));
        if (member >= 0) expected += pe + 1;
    }

    source = me + 1;
    CHECK(shmem_team_sync(SHMEM_TEAM_SHARED) == 0);
    CHECK(shmem_long_sum_reduce(SHMEM_TEAM_SHARED, &total, &source, 1) == 0);
    CHECK(total == expected);
    shmem_barrier_all();
    PASS("team_shared");
    shmem_finalize();
    return 0;
}

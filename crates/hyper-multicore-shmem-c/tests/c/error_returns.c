/* The standard's error returns (OpenSHMEM 1.5 §9, 1.6 for re-initialization): an invalid team
 * or context handle, an invalid split, a zero-length call and an alignment the heap cannot give
 * get the value the standard defines, never an abort. Needs a heap of at least 16 MiB
 * (SHMEM_SYMMETRIC_SIZE, set by the harness). */
#include <shmem.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

static long word;

static void invalid_team_handles(void) {
    shmem_team_t none = SHMEM_TEAM_INVALID;
    CHECK(shmem_team_my_pe(none) == -1);
    CHECK(shmem_team_n_pes(none) == -1);
    CHECK(shmem_team_translate_pe(none, 0, SHMEM_TEAM_WORLD) == -1);
    CHECK(shmem_team_translate_pe(SHMEM_TEAM_WORLD, 0, none) == -1);
    shmem_team_config_t config = {.num_contexts = 7};
    CHECK(shmem_team_get_config(none, SHMEM_TEAM_NUM_CONTEXTS, &config) != 0);
    CHECK(config.num_contexts == 7);
    CHECK(shmem_team_get_config(SHMEM_TEAM_WORLD, SHMEM_TEAM_NUM_CONTEXTS, &config) == 0);
    CHECK(shmem_team_sync(none) != 0);
    shmem_team_destroy(none); /* no operation */
    CHECK(shmem_team_ptr(none, &word, me) == NULL);

    /* Team collectives on no team return nonzero and do nothing (the standard leaves them
     * undefined; every PE passes the same handle, so nobody waits). */
    long *dest = shmem_malloc(8 * sizeof(long));
    long source[8] = {0};
    CHECK(dest != NULL);
    CHECK(shmem_long_broadcast(none, dest, source, 1, 0) != 0);
    CHECK(shmem_long_fcollect(none, dest, source, 1) != 0);
    CHECK(shmem_long_sum_reduce(none, dest, source, 1) != 0);
    CHECK(shmem_long_alltoall(none, dest, source, 1) != 0);

    /* A split with an invalid parent or triplet: SHMEM_TEAM_INVALID and nonzero everywhere. */
    shmem_team_t team = SHMEM_TEAM_WORLD;
    CHECK(shmem_team_split_strided(none, 0, 1, 1, NULL, 0, &team) != 0);
    CHECK(team == SHMEM_TEAM_INVALID);
    team = SHMEM_TEAM_WORLD;
    CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, n + 1, NULL, 0, &team) != 0);
    CHECK(team == SHMEM_TEAM_INVALID);
    team = SHMEM_TEAM_WORLD;
    CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, 0, NULL, 0, &team) != 0);
    CHECK(team == SHMEM_TEAM_INVALID);
    shmem_team_t x = SHMEM_TEAM_WORLD, y = SHMEM_TEAM_WORLD;
    CHECK(shmem_team_split_2d(none, 1, NULL, 0, &x, NULL, 0, &y) != 0);
    CHECK(x == SHMEM_TEAM_INVALID && y == SHMEM_TEAM_INVALID);
    x = y = SHMEM_TEAM_WORLD;
    CHECK(shmem_team_split_2d(SHMEM_TEAM_WORLD, 0, NULL, 0, &x, NULL, 0, &y) != 0);
    CHECK(x == SHMEM_TEAM_INVALID && y == SHMEM_TEAM_INVALID);

    /* A PE left out of a split gets SHMEM_TEAM_INVALID and 0, and can ask about it. */
    team = SHMEM_TEAM_WORLD;
    CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, 1, NULL, 0, &team) == 0);
    if (me == 0) {
        CHECK(team != SHMEM_TEAM_INVALID);
        CHECK(shmem_team_my_pe(team) == 0 && shmem_team_n_pes(team) == 1);
        shmem_team_destroy(team);
        /* A destroyed team names no team any more. */
        CHECK(shmem_team_my_pe(team) == -1 && shmem_team_n_pes(team) == -1);
    } else {
        CHECK(team == SHMEM_TEAM_INVALID);
        CHECK(shmem_team_my_pe(team) == -1 && shmem_team_n_pes(team) == -1);
        CHECK(shmem_team_translate_pe(SHMEM_TEAM_WORLD, me, team) == -1);
    }

    /* A negative stride numbers the new team in reverse. */
    team = SHMEM_TEAM_INVALID;
    CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, n - 1, -1, n, NULL, 0, &team) == 0);
    CHECK(shmem_team_my_pe(team) == n - 1 - me);
    CHECK(shmem_team_translate_pe(team, 0, SHMEM_TEAM_WORLD) == n - 1);
    shmem_team_destroy(team);
    shmem_free(dest);
}

static void invalid_contexts(void) {
    shmem_team_t team = SHMEM_TEAM_WORLD;
    CHECK(shmem_ctx_get_team(SHMEM_CTX_INVALID, &team) != 0);
    CHECK(team == SHMEM_TEAM_INVALID);
    CHECK(shmem_ctx_get_team(SHMEM_CTX_DEFAULT, &team) == 0);
    CHECK(team == SHMEM_TEAM_WORLD);
    shmem_ctx_fence(SHMEM_CTX_INVALID);   /* no operation */
    shmem_ctx_quiet(SHMEM_CTX_INVALID);   /* no operation */
    shmem_ctx_destroy(SHMEM_CTX_INVALID); /* no operation */
    shmem_ctx_t ctx = SHMEM_CTX_DEFAULT;
    CHECK(shmem_team_create_ctx(SHMEM_TEAM_INVALID, 0, &ctx) != 0);
    CHECK(ctx == SHMEM_CTX_INVALID);

    /* A context of a split team belongs to that team. */
    shmem_team_t all = SHMEM_TEAM_INVALID;
    CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, n, NULL, 0, &all) == 0);
    CHECK(shmem_team_create_ctx(all, 0, &ctx) == 0);
    CHECK(shmem_ctx_get_team(ctx, &team) == 0);
    CHECK(team == all);
    shmem_ctx_destroy(ctx);
    shmem_team_destroy(all);
}

static void zero_length_calls(void) {
    shmem_putmem(NULL, NULL, 0, next);
    shmem_getmem(NULL, NULL, 0, next);
    shmem_putmem_nbi(NULL, NULL, 0, next);
    shmem_getmem_nbi(NULL, NULL, 0, next);
    shmem_int_iput(NULL, NULL, 1, 1, 0, next);
    shmem_int_iget(NULL, NULL, 1, 1, 0, next);
    shmem_long_put(NULL, NULL, 0, next);
    shmem_ctx_double_get(SHMEM_CTX_DEFAULT, NULL, NULL, 0, next);
    CHECK(shmem_broadcastmem(SHMEM_TEAM_WORLD, NULL, NULL, 0, 0) == 0);
    CHECK(shmem_fcollectmem(SHMEM_TEAM_WORLD, NULL, NULL, 0) == 0);
    CHECK(shmem_collectmem(SHMEM_TEAM_WORLD, NULL, NULL, 0) == 0);
    CHECK(shmem_alltoallmem(SHMEM_TEAM_WORLD, NULL, NULL, 0) == 0);
    CHECK(shmem_int_sum_reduce(SHMEM_TEAM_WORLD, NULL, NULL, 0) == 0);
    static long psync[SHMEM_BCAST_SYNC_SIZE];
    shmem_broadcast64(NULL, NULL, 0, 0, 0, 0, n, psync);

    /* A zero-length put with signal still delivers the signal. */
    uint64_t *signal = shmem_calloc(1, sizeof(uint64_t));
    CHECK(signal != NULL);
    shmem_putmem_signal(NULL, NULL, 0, signal, 5, SHMEM_SIGNAL_SET, next);
    shmem_wait_until(signal, SHMEM_CMP_EQ, 5);
    shmem_barrier_all();
    shmem_free(signal);
}

static void alignments(void) {
    for (size_t alignment = 4 << 20; alignment <= 8 << 20; alignment *= 2) {
        char *block = shmem_align(alignment, 100);
        CHECK(block != NULL);
        CHECK((uintptr_t)block % alignment == 0);
        /* Symmetric: a peer's put lands in it. */
        shmem_putmem(block, &me, sizeof me, next);
        shmem_barrier_all();
        int got;
        memcpy(&got, block, sizeof got);
        CHECK(got == prev);
        shmem_free(block);
    }
    /* Not a power of two: null on every PE, as the standard's "otherwise, NULL". */
    CHECK(shmem_align(3000, 100) == NULL);
    CHECK(shmemalign(48, 100) == NULL);
}

static void profiling_control(void) {
    shmem_pcontrol(0);
    shmem_pcontrol(2, "extra", 3); /* the level and any library-defined arguments */
}

int main(void) {
    int flag = -1;
    shmem_query_initialized(&flag);
    CHECK(flag == 0);
    start();
    shmem_query_initialized(&flag);
    CHECK(flag != 0);
    invalid_team_handles();
    invalid_contexts();
    zero_length_calls();
    alignments();
    profiling_control();

    /* OpenSHMEM 1.6: initializations pair with finalizations; a team of a finalized runtime
     * names no team; a new shmem_init starts a fresh runtime. */
    shmem_init();
    shmem_finalize(); /* not the last: a barrier */
    shmem_query_initialized(&flag);
    CHECK(flag != 0);
    shmem_team_t team = SHMEM_TEAM_INVALID;
    CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, n, NULL, 0, &team) == 0);
    shmem_finalize();
    shmem_query_initialized(&flag);
    CHECK(flag == 0);
    shmem_query_finalized(&flag);
    CHECK(flag != 0);
    CHECK(shmem_team_my_pe(team) == -1 && shmem_team_n_pes(team) == -1);
    CHECK(shmem_team_my_pe(SHMEM_TEAM_WORLD) == -1);

    shmem_init();
    shmem_query_finalized(&flag);
    CHECK(flag == 0);
    CHECK(shmem_my_pe() == me && shmem_n_pes() == n);
    word = 0;
    shmem_barrier_all();
    shmem_long_p(&word, me + 1, next);
    shmem_barrier_all();
    CHECK(word == prev + 1);
    long *block = shmem_malloc(sizeof(long));
    CHECK(block != NULL);
    shmem_free(block);
    PASS("error_returns");
    shmem_finalize();
    return 0;
}
